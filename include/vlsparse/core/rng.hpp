// vlsparse/core/rng.hpp -- the one random generator (SplitMix64) and sampling without replacement.
//
// Every random choice in vlsparse (ZipVL's random probes, random baselines, synthetic inputs) comes
// from these few lines, so a port in any language reproduces it bit for bit:
//
//   next():          state = (state + 0x9E3779B97F4A7C15) mod 2^64
//                    z = state
//                    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) mod 2^64
//                    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) mod 2^64
//                    return z ^ (z >> 31)
//   below(m):        (next() * m) >> 64             (128-bit product; uniform in [0, m))
//   sample(N, k):    a = [0, 1, ..., N-1]
//                    for i in 0 .. k-1:  j = i + below(N - i);  swap(a[i], a[j])
//                    return sorted(a[0:k])
//
// Python: see docs/api.md ("Randomness") for the same in eight lines of numpy-free Python.
// Include: <vlsparse/vlsparse.hpp>
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "vlsparse/core/error.hpp"

namespace vlsparse {

namespace detail {
// The 128-bit product of below(); __extension__ keeps -Wpedantic quiet about the GCC / Clang type.
__extension__ typedef unsigned __int128 uint128;
}  // namespace detail

class SplitMix64 {
public:
    explicit SplitMix64(std::uint64_t seed) : state_(seed) {}

    std::uint64_t next() {
        state_ += 0x9E3779B97F4A7C15ull;
        std::uint64_t z = state_;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }

    // Uniform integer in [0, m); m >= 1.
    std::uint64_t below(std::uint64_t m) {
        detail::require(m >= 1, "SplitMix64::below", "m = ", m, ", expected m >= 1");
        return static_cast<std::uint64_t>((static_cast<detail::uint128>(next()) * m) >> 64);
    }

    // Uniform double in [0, 1) with 53 random bits: (next() >> 11) * 2^-53.
    double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

    std::uint64_t state() const { return state_; }

private:
    std::uint64_t state_;
};

// k distinct integers drawn uniformly from [0, n) by a partial Fisher-Yates shuffle, sorted ascending.
inline std::vector<std::int64_t> sample_without_replacement(std::int64_t n, std::int64_t k, SplitMix64& rng) {
    detail::require(n >= 0 && k >= 0 && k <= n, "sample_without_replacement", "k = ", k, ", n = ", n,
                    ", expected 0 <= k <= n");
    std::vector<std::int64_t> a(static_cast<std::size_t>(n));
    std::iota(a.begin(), a.end(), std::int64_t{0});
    for (std::int64_t i = 0; i < k; ++i) {
        const auto j = i + static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(n - i)));
        std::swap(a[static_cast<std::size_t>(i)], a[static_cast<std::size_t>(j)]);
    }
    a.resize(static_cast<std::size_t>(k));
    if (k < n / 32) {
        std::sort(a.begin(), a.end());
        return a;
    }
    // Many of N: the k values marked in a byte map and read back in order (O(N), where sorting the
    // random order costs O(k log k) mispredicted branches: 1 ms for k = 26000 on a desktop core).
    std::vector<std::uint8_t> mark(static_cast<std::size_t>(n), 0);
    for (const std::int64_t v : a) mark[static_cast<std::size_t>(v)] = 1;
    std::size_t w = 0;
    for (std::int64_t v = 0; v < n; ++v)
        if (mark[static_cast<std::size_t>(v)]) a[w++] = v;
    return a;
}

inline std::vector<std::int64_t> sample_without_replacement(std::int64_t n, std::int64_t k, std::uint64_t seed) {
    SplitMix64 rng(seed);
    return sample_without_replacement(n, k, rng);
}

}  // namespace vlsparse
