// Shared CPU test helpers: seeded random tensors and inputs over the library (the seed, the metrics and
// the tolerance table are test_core.hpp's, which nvcc includes too).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include <vlsparse/vlsparse.hpp>

#include "test_core.hpp"

namespace vt {

// Seed for random inputs: VLSPARSE_TEST_SEED overrides the default. Each test prints the seed it used
// (Catch2 INFO), so a failure can be replayed.
inline std::uint64_t base_seed() { return seed_or(20261121ull); }

// True when VLSPARSE_TEST_SMALL is set (sanitizer builds): the largest shapes of a sweep are skipped.
inline bool small_run() { return std::getenv("VLSPARSE_TEST_SMALL") != nullptr; }

// A buffer of element type T with N(0, sigma^2)-like values (sum of uniforms), deterministic from seed.
template <class T>
std::vector<T> random_buffer(std::size_t count, std::uint64_t seed, float sigma = 1.0f) {
    vlsparse::SplitMix64 rng(seed);
    std::vector<T> out(count);
    for (auto& x : out) {
        double s = 0.0;
        for (int i = 0; i < 4; ++i) s += rng.uniform() - 0.5;
        x = vlsparse::from_float<T>(static_cast<float>(s * sigma * 1.7320508075688772));
    }
    return out;
}

// A sorted random subset of [0, n) of size m (m <= n), drawn with the library's rng.
inline std::vector<std::int64_t> random_subset(std::int64_t n, std::int64_t m, std::uint64_t seed) {
    vlsparse::SplitMix64 rng(seed);
    std::vector<std::int64_t> all(static_cast<std::size_t>(n));
    std::iota(all.begin(), all.end(), std::int64_t{0});
    for (std::int64_t i = 0; i < m; ++i) {
        const auto j = i + static_cast<std::int64_t>(rng.uniform() * static_cast<double>(n - i));
        std::swap(all[static_cast<std::size_t>(i)], all[static_cast<std::size_t>(std::min(j, n - 1))]);
    }
    all.resize(static_cast<std::size_t>(m));
    std::sort(all.begin(), all.end());
    return all;
}

}  // namespace vt

namespace vt {

// Q [n, H, d], K and V [n, H_kv, d] of one prefill, token-major, owned.
template <class T>
struct Qkv {
    std::int64_t n, H, Hkv, d;
    std::vector<T> q, k, v;
    vlsparse::View3<const T> qv() const { return {q.data(), {n, H, d}}; }
    vlsparse::View3<const T> kv() const { return {k.data(), {n, Hkv, d}}; }
    vlsparse::View3<const T> vv() const { return {v.data(), {n, Hkv, d}}; }
};

}  // namespace vt
