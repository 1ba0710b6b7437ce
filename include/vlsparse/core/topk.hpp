// vlsparse/core/topk.hpp -- deterministic top-k and the threshold count of ZipVL Eq. 7.
//
// topk_indices(s, k): the k positions with the largest scores; equal scores are broken by the lower
// position first; the result is returned in ascending position order. NaN scores are an error.
// count_for_mass(s, tau, total): p = min { p : sum of the p largest s_j >= tau * total }.
// Include: <vlsparse/vlsparse.hpp>
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

#include "vlsparse/core/error.hpp"

namespace vlsparse {

namespace detail {
template <class S>
void check_scores_finite(std::span<const S> s, const char* fn) {
    for (std::size_t i = 0; i < s.size(); ++i)
        require(std::isfinite(static_cast<double>(s[i])), fn, "score[", i, "] = ", static_cast<double>(s[i]),
                ", expected finite scores (NaN and Inf have no rank)");
}

// Positions ordered by (score descending, position ascending): the library's one ranking order.
template <class S>
std::vector<std::int64_t> rank_order(std::span<const S> s) {
    std::vector<std::int64_t> idx(s.size());
    std::iota(idx.begin(), idx.end(), std::int64_t{0});
    std::stable_sort(idx.begin(), idx.end(), [&](std::int64_t a, std::int64_t b) { return s[a] > s[b]; });
    return idx;
}
}  // namespace detail

template <class S>
std::vector<std::int64_t> topk_indices(std::span<const S> s, std::int64_t k) {
    constexpr const char* fn = "topk_indices";
    detail::require(k >= 0 && k <= static_cast<std::int64_t>(s.size()), fn, "k = ", k, ", expected 0 <= k <= ",
                    s.size());
    detail::check_scores_finite(s, fn);
    std::vector<std::int64_t> idx(s.size());
    std::iota(idx.begin(), idx.end(), std::int64_t{0});
    auto before = [&](std::int64_t a, std::int64_t b) { return s[a] > s[b] || (s[a] == s[b] && a < b); };
    std::nth_element(idx.begin(), idx.begin() + k, idx.end(), before);
    idx.resize(static_cast<std::size_t>(k));
    std::sort(idx.begin(), idx.end());
    return idx;
}

template <class S>
std::vector<std::int64_t> topk_indices(const std::vector<S>& s, std::int64_t k) {
    return topk_indices(std::span<const S>(s), k);
}

// ZipVL Eq. 7 generalised: the smallest count p whose p largest scores reach tau * total.
// Scores must be finite and >= 0; 0 < tau <= 1; total > 0. Sums in double. If rounding leaves the
// full sum a hair below tau * total, p = s.size() (all tokens), never more.
template <class S>
std::int64_t count_for_mass(std::span<const S> s, double tau, double total) {
    constexpr const char* fn = "count_for_mass";
    detail::require(tau > 0.0 && tau <= 1.0, fn, "tau = ", tau, ", expected 0 < tau <= 1");
    detail::require(std::isfinite(total) && total > 0.0, fn, "total = ", total, ", expected a finite total > 0");
    detail::check_scores_finite(s, fn);
    for (std::size_t i = 0; i < s.size(); ++i)
        detail::require(s[i] >= 0, fn, "score[", i, "] = ", static_cast<double>(s[i]), ", expected scores >= 0");
    std::vector<double> v(s.begin(), s.end());
    std::sort(v.begin(), v.end(), std::greater<double>());
    const double target = tau * total;
    double acc = 0.0;
    for (std::size_t i = 0; i < v.size(); ++i) {
        acc += v[i];
        if (acc >= target) return static_cast<std::int64_t>(i + 1);
    }
    return static_cast<std::int64_t>(v.size());
}

}  // namespace vlsparse
