// Shared helpers of the benchmarks in bench/ (not part of the library).
#pragma once

#include <algorithm>
#include <chrono>
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

}  // namespace vlsparse::bench
