// Shared helpers of the benchmarks in bench/ (not part of the library).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

namespace vlsparse::bench {

// Median wall time in seconds of `reps` runs of f, after one warm-up run.
template <class F>
double median_seconds(int reps, F&& f) {
    f();
    std::vector<double> t;
    for (int r = 0; r < reps; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        f();
        t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

// The row list of an A-VL decode step over n cached tokens, `frac` of the rows in all: the last
// 10% contiguous ("text" + decode tokens), the rest scattered at random over the others (rng: a
// SplitMix64, advanced as needed). Sorted.
template <class Rng>
std::vector<std::int64_t> avl_shaped_rows(std::int64_t n, double frac, Rng& rng) {
    const auto m = static_cast<std::int64_t>(frac * static_cast<double>(n));
    const std::int64_t tail = n / 10;
    std::vector<std::uint8_t> in(static_cast<std::size_t>(n), 0);
    for (std::int64_t i = n - tail; i < n; ++i) in[static_cast<std::size_t>(i)] = 1;
    std::int64_t have = tail;
    while (have < m) {
        const auto i = static_cast<std::int64_t>(rng.uniform() * static_cast<double>(n - tail));
        if (!in[static_cast<std::size_t>(i)]) {
            in[static_cast<std::size_t>(i)] = 1;
            ++have;
        }
    }
    std::vector<std::int64_t> rows;
    for (std::int64_t i = 0; i < n; ++i)
        if (in[static_cast<std::size_t>(i)]) rows.push_back(i);
    return rows;
}

}  // namespace vlsparse::bench
