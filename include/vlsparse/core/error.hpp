// vlsparse/core/error.hpp -- the one exception type thrown by host code, and the two helpers that
// build every message (public, so that an engine's adapters and the simulator raise the same errors).
// Every message names the function, the offending value and what was expected, e.g.
//   "zipvl_select: tau = 1.5, expected 0 < tau <= 1".
//   require(ok, fn, parts...)   throws error(fn, concat(parts...)) when ok is false
//   concat(parts...)            the parts written one after the other (operator<<)
// Include: <vlsparse/vlsparse.hpp>
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace vlsparse {

class error : public std::runtime_error {
public:
    error(std::string function, const std::string& what)
        : std::runtime_error(function + ": " + what), function_(std::move(function)) {}
    // The public function that rejected its input.
    const std::string& function() const noexcept { return function_; }

private:
    std::string function_;
};

template <class... Args>
std::string concat(const Args&... args) {
    std::ostringstream os;
    (os << ... << args);
    return os.str();
}

// Throws vlsparse::error(fn, message) when `ok` is false. The message is only built on failure, but
// its arguments, like any call's, are evaluated every time: each must be valid when the check passes.
// No element that `ok` guards (x[i - 1] at i == 0), no arithmetic that can overflow (a product of
// extents): put such a check under an `if`, e.g. `if (i > 0) require(x[i] > x[i - 1], fn, ..., x[i - 1])`.
// The sanitizer build (-D_GLIBCXX_ASSERTIONS, UBSan) catches what slips through.
template <class... Args>
inline void require(bool ok, const char* fn, const Args&... args) {
    if (!ok) throw ::vlsparse::error(fn, concat(args...));
}

namespace detail {  // the library's own code spells them detail::require / detail::concat
using ::vlsparse::concat;
using ::vlsparse::require;
}  // namespace detail
}  // namespace vlsparse
