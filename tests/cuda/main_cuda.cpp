// Catch2 (v2) entry point of the CUDA tests (suite cuda). Compiled by g++, like tests/main.cpp (Catch2's
// implementation takes nvcc much longer); the device query is in device_check.cu. On a machine without
// a usable CUDA device (no GPU, no driver) it prints why and exits with 77, which Meson reports as
// SKIP, instead of failing every test; listing tests or printing help needs no device.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <string>

// device_check.cu: empty when a CUDA device can be used, else why not.
std::string vlsparse_cuda_device_unavailable();

int main(int argc, char** argv) {
    Catch::Session session;
    if (const int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
    const auto& c = session.configData();
    const bool runs_tests = !(c.showHelp || c.listTests || c.listTestNamesOnly || c.listTags || c.listReporters || c.libIdentify);
    if (runs_tests) {
        const std::string why = vlsparse_cuda_device_unavailable();
        if (!why.empty()) {
            std::printf("SKIP: the CUDA tests need a GPU: %s\n", why.c_str());
            std::fflush(stdout);
            return 77;  // Meson: SKIP
        }
    }
    return session.run();
}
