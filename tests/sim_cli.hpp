// Test helper shared by the simulator's test files: `vlsparse-sim ARGS` run in this process (the
// program's main is vlsparse::sim::sim_main, so no executable path is needed), its exit status and what
// it printed. One definition for every test file, so that they compile together as one translation unit
// (the unity builds of tests/meson.build).
#pragma once

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include <catch2/catch.hpp>

#include <vlsparse/sim/commands.hpp>

namespace vt {

// What `vlsparse-sim ARGS` returned and printed.
struct SimCliOutput {
    int rc = 0;
    std::string out, err;
};

// The exit status of `vlsparse-sim ARGS`; what it prints goes to the test's own output.
inline int sim_cli_status(std::vector<std::string> args) {
    std::string prog = "vlsparse-sim";
    std::vector<char*> argv = {prog.data()};
    for (auto& a : args) argv.push_back(a.data());
    return vlsparse::sim::sim_main(static_cast<int>(argv.size()), argv.data());
}

// `vlsparse-sim ARGS` with stdout and stderr captured (file descriptors 1 and 2 point to temporary files
// while it runs, so that everything it writes is caught, through stdio or not).
inline SimCliOutput sim_cli(std::vector<std::string> args) {
    std::fflush(stdout);
    std::fflush(stderr);
    std::FILE* fo = std::tmpfile();
    std::FILE* fe = std::tmpfile();
    REQUIRE(fo != nullptr);
    REQUIRE(fe != nullptr);
    const int saved_out = ::dup(1), saved_err = ::dup(2);
    ::dup2(::fileno(fo), 1);
    ::dup2(::fileno(fe), 2);
    SimCliOutput r;
    r.rc = sim_cli_status(std::move(args));
    std::fflush(stdout);
    std::fflush(stderr);
    ::dup2(saved_out, 1);
    ::dup2(saved_err, 2);
    ::close(saved_out);
    ::close(saved_err);
    for (auto [f, dst] : {std::pair{fo, &r.out}, std::pair{fe, &r.err}}) {
        std::rewind(f);
        char buf[4096];
        for (std::size_t got; (got = std::fread(buf, 1, sizeof buf, f)) > 0;) dst->append(buf, got);
        std::fclose(f);
    }
    return r;
}

}  // namespace vt
