// Test helper shared by the CPU and CUDA test files (no SIMD header: nvcc includes it too): the seed
// of a test's random inputs, VLSPARSE_TEST_SEED when set, else the test file's own default. Each test
// prints the seed it used (Catch2 INFO), so that a failure can be replayed.
#pragma once

#include <cstdint>
#include <cstdlib>

namespace vt {

inline std::uint64_t seed_or(std::uint64_t fallback) {
    if (const char* s = std::getenv("VLSPARSE_TEST_SEED")) return std::strtoull(s, nullptr, 0);
    return fallback;
}

}  // namespace vt
