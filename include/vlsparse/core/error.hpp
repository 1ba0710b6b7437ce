// vlsparse/core/error.hpp -- the one exception type thrown by host code.
// Every message names the function, the offending value and what was expected, e.g.
//   "zipvl_select: tau = 1.5, expected 0 < tau <= 1".
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

namespace detail {

template <class... Args>
std::string concat(const Args&... args) {
    std::ostringstream os;
    (os << ... << args);
    return os.str();
}

// Throws vlsparse::error(fn, message) when `ok` is false. The message is only built on failure.
template <class... Args>
inline void require(bool ok, const char* fn, const Args&... args) {
    if (!ok) throw ::vlsparse::error(fn, concat(args...));
}

}  // namespace detail
}  // namespace vlsparse
