// tests/fuzz/fuzz_util.hpp -- what every fuzz target shares: a check that aborts (libFuzzer reports it
// as a crash and saves the input), a scratch folder for the readers that take a path, and the rule
// every target enforces: bad input is rejected with vlsparse::error, nothing else (an uncaught
// exception of any other type escapes LLVMFuzzerTestOneInput and aborts too).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>

#include "vlsparse/core/error.hpp"

namespace fuzz {

[[noreturn]] inline void fail(const char* file, int line, const char* cond, const std::string& msg) {
    std::fprintf(stderr, "\n%s:%d: fuzz check failed: %s\n  %s\n", file, line, cond, msg.c_str());
    std::fflush(stderr);
    std::abort();
}

template <class... Args>
std::string str(const Args&... args) {
    std::ostringstream os;
    (os << ... << args);
    return os.str();
}

// FUZZ_CHECK(cond, parts...): the parts are streamed into the message only on failure.
#define FUZZ_CHECK(cond, ...)                                                        \
    do {                                                                             \
        if (!(cond)) ::fuzz::fail(__FILE__, __LINE__, #cond, ::fuzz::str(__VA_ARGS__)); \
    } while (0)

// A private folder for this process (removed at exit), for the readers that take a path.
inline const std::filesystem::path& scratch() {
    static const std::filesystem::path dir = [] {
        std::error_code ec;
        std::filesystem::path base = std::filesystem::exists("/dev/shm", ec) ? "/dev/shm" : std::filesystem::temp_directory_path();
        std::string tmpl = (base / "vlsparse-fuzz-XXXXXX").string();
        if (!mkdtemp(tmpl.data())) {
            std::perror("mkdtemp");
            std::abort();
        }
        std::atexit([] {
            std::error_code e;
            std::filesystem::remove_all(scratch(), e);
        });
        return std::filesystem::path(tmpl);
    }();
    return dir;
}

inline void write_file(const std::filesystem::path& p, const void* data, std::size_t size) {
    std::ofstream f(p, std::ios::binary | std::ios::trunc);
    if (size) f.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
    f.close();
    if (!f) fail(__FILE__, __LINE__, "write_file", "cannot write " + p.string());
}
inline void write_file(const std::filesystem::path& p, std::string_view s) { write_file(p, s.data(), s.size()); }

inline std::string read_file(const std::filesystem::path& p) {
    std::ifstream f(p, std::ios::binary);
    if (!f) fail(__FILE__, __LINE__, "read_file", "cannot read " + p.string());
    return std::string(std::istreambuf_iterator<char>(f), {});
}

// Every message the library throws names the function that rejected the input: "fn: what".
inline void check_message(const vlsparse::error& e) {
    const std::string_view w = e.what();
    FUZZ_CHECK(!e.function().empty() && w.size() > e.function().size() + 2 && w.substr(0, e.function().size()) == e.function(),
               "malformed error message: '", w, "'");
}

// A small reader over the fuzzer's bytes, for the targets that build structures (row lists, block
// tables) rather than parse text: every read past the end returns 0.
class Bytes {
public:
    Bytes(const std::uint8_t* d, std::size_t n) : d_(d), n_(n) {}
    std::uint8_t u8() { return i_ < n_ ? d_[i_++] : 0; }
    std::uint16_t u16() { return static_cast<std::uint16_t>(u8() | (u8() << 8)); }
    std::uint32_t u32() { return static_cast<std::uint32_t>(u16()) | (static_cast<std::uint32_t>(u16()) << 16); }
    std::uint64_t u64() { return static_cast<std::uint64_t>(u32()) | (static_cast<std::uint64_t>(u32()) << 32); }
    // A value that is usually small (most bytes pick 0..63 or a neighbour of a limit) and sometimes
    // anything: hostile sizes and ordinary ones both.
    std::int64_t num() {
        const std::uint8_t tag = u8();
        switch (tag >> 5) {
            case 0: case 1: case 2: case 3: return tag & 63;               // 0..63
            case 4: return -static_cast<std::int64_t>(tag & 31) - 1;       // -1..-32
            case 5: return static_cast<std::int64_t>(u16());
            case 6: return static_cast<std::int64_t>(static_cast<std::int32_t>(u32()));
            default: return static_cast<std::int64_t>(u64());
        }
    }
    std::int32_t num32() { return static_cast<std::int32_t>(num()); }
    bool empty() const { return i_ >= n_; }
    std::size_t left() const { return i_ < n_ ? n_ - i_ : 0; }

private:
    const std::uint8_t* d_;
    std::size_t n_, i_ = 0;
};

}  // namespace fuzz
