// vlsparse/core/rank_correlation.hpp -- Spearman's rank correlation (average ranks for ties) and its
// two-sided p-value.
//
//   r_i   = average_ranks(x)_i: the 1-based rank of x_i in ascending order; a group of equal values
//           shares the mean of the ranks it spans (ties: 10, 20, 20, 30 -> 1, 2.5, 2.5, 4)
//   rho   = Pearson correlation of the two rank vectors; without ties this equals PureKV Eq. 7,
//           1 - 6 sum_i d_i^2 / (n (n^2 - 1)) with d_i = r(x)_i - r(y)_i (Spearman 1904; Sedgwick 2014)
//   p     = two-sided p-value of H0 "no monotonic association" by the Student-t approximation:
//           t = rho sqrt((n - 2) / (1 - rho^2)) with n - 2 degrees of freedom, and
//           p = P(|T| >= |t|) = I_{(n-2) / (n-2 + t^2)}((n-2)/2, 1/2) = I_{1 - rho^2}((n-2)/2, 1/2),
//           I the regularized incomplete beta function (continued fraction, modified Lentz).
//           The same approximation as scipy.stats.spearmanr; it is not the exact permutation p-value
//           (which differs noticeably below n ~ 10).
// Used by PureKV's validation (Eq. 5-7) but general. Include: <vlsparse/core/rank_correlation.hpp>
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <span>
#include <vector>

#include "vlsparse/core/error.hpp"

namespace vlsparse {

// Average 1-based ranks of x in ascending order (ties share the mean of their ranks). Values must be
// finite.
template <class S>
std::vector<double> average_ranks(std::span<const S> x) {
    constexpr const char* fn = "average_ranks";
    for (std::size_t i = 0; i < x.size(); ++i)
        detail::require(std::isfinite(static_cast<double>(x[i])), fn, "x[", i, "] = ", static_cast<double>(x[i]),
                        ", expected finite values (NaN and Inf have no rank)");
    std::vector<std::size_t> idx(x.size());
    std::iota(idx.begin(), idx.end(), std::size_t{0});
    std::stable_sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) { return x[a] < x[b]; });
    std::vector<double> r(x.size());
    for (std::size_t a = 0; a < idx.size();) {
        std::size_t b = a + 1;
        while (b < idx.size() && x[idx[b]] == x[idx[a]]) ++b;
        const double mean = 0.5 * static_cast<double>(a + 1 + b);  // mean of ranks a+1 .. b
        for (std::size_t t = a; t < b; ++t) r[idx[t]] = mean;
        a = b;
    }
    return r;
}

template <class S>
std::vector<double> average_ranks(const std::vector<S>& x) {
    return average_ranks(std::span<const S>(x));
}

// The regularized incomplete beta function I_x(a, b) for a, b > 0 and 0 <= x <= 1, by the continued
// fraction of I_x(a, b) evaluated with the modified Lentz method, on the side (x or 1 - x) where it
// converges fast. Relative accuracy about 1e-14 for moderate a, b; a, b up to ~1e7.
inline double regularized_incomplete_beta(double a, double b, double x) {
    constexpr const char* fn = "regularized_incomplete_beta";
    detail::require(std::isfinite(a) && std::isfinite(b) && a > 0.0 && b > 0.0, fn, "a = ", a, ", b = ", b,
                    ", expected finite a > 0 and b > 0");
    detail::require(x >= 0.0 && x <= 1.0, fn, "x = ", x, ", expected 0 <= x <= 1");
    if (x == 0.0) return 0.0;
    if (x == 1.0) return 1.0;
    // Continued fraction for I_x(a, b): prefactor x^a (1-x)^b / (a B(a, b)) times 1 / (1 + d1 / (1 + d2 / ...)),
    //   d_{2m+1} = -(a + m)(a + b + m) x / ((a + 2m)(a + 2m + 1)),  d_{2m} = m (b - m) x / ((a + 2m - 1)(a + 2m)).
    auto fraction = [&](double a_, double b_, double x_) {
        constexpr double tiny = 1e-300, eps = 1e-16;
        // Lentz: f = b0 + a1 / (b1 + a2 / (b2 + ...)) with b0 = 0, every b_j = 1, a1 = 1, a_{j+1} = d_j.
        double f = tiny, c = tiny, d = 0.0;
        for (int j = 1; j < 200000; ++j) {
            const int k = j - 1;  // a_j = d_k (d_0 = 1 stands for a1)
            const int m = k / 2;
            double num;
            if (k == 0) num = 1.0;
            else if (k % 2 == 1) num = -(a_ + m) * (a_ + b_ + m) * x_ / ((a_ + 2.0 * m) * (a_ + 2.0 * m + 1.0));
            else num = m * (b_ - m) * x_ / ((a_ + 2.0 * m - 1.0) * (a_ + 2.0 * m));
            d = 1.0 + num * d;
            if (std::abs(d) < tiny) d = tiny;
            d = 1.0 / d;
            c = 1.0 + num / c;
            if (std::abs(c) < tiny) c = tiny;
            const double delta = c * d;
            f *= delta;
            if (j > 1 && std::abs(delta - 1.0) < eps) {
                const double log_pre = a_ * std::log(x_) + b_ * std::log1p(-x_) -
                                       (std::lgamma(a_) + std::lgamma(b_) - std::lgamma(a_ + b_)) - std::log(a_);
                return std::exp(log_pre) * f;
            }
        }
        throw error(fn, detail::concat("continued fraction did not converge for a = ", a_, ", b = ", b_, ", x = ", x_));
    };
    if (x < (a + 1.0) / (a + b + 2.0)) return fraction(a, b, x);
    return 1.0 - fraction(b, a, 1.0 - x);
}

// Two-sided p-value P(|T| >= |t|) of Student's t with `dof` > 0 degrees of freedom.
inline double student_t_two_sided_p(double t, double dof) {
    constexpr const char* fn = "student_t_two_sided_p";
    detail::require(std::isfinite(dof) && dof > 0.0, fn, "dof = ", dof, ", expected a finite dof > 0");
    detail::require(!std::isnan(t), fn, "t is NaN, expected a number");
    if (std::isinf(t)) return 0.0;
    return regularized_incomplete_beta(0.5 * dof, 0.5, dof / (dof + t * t));
}

struct SpearmanResult {
    double rho = 0.0;      // Spearman's rank correlation in [-1, 1]
    double p_value = 1.0;  // two-sided, t approximation with n - 2 degrees of freedom
    std::int64_t n = 0;    // number of pairs
};

// Spearman's rho and its two-sided p-value for paired samples x, y (same length n >= 3, finite
// values, neither constant: a constant sample has no rank order and rho is undefined).
template <class S>
SpearmanResult spearman(std::span<const S> x, std::span<const S> y) {
    constexpr const char* fn = "spearman";
    detail::require(x.size() == y.size(), fn, "x has ", x.size(), " values and y has ", y.size(), ", expected equal lengths");
    detail::require(x.size() >= 3, fn, "n = ", x.size(), ", expected n >= 3 (the p-value has n - 2 degrees of freedom)");
    const auto rx = average_ranks(x), ry = average_ranks(y);
    const double n = static_cast<double>(x.size());
    const double mean = 0.5 * (n + 1.0);  // the mean of average ranks is always (n + 1) / 2
    double sxy = 0.0, sxx = 0.0, syy = 0.0;
    for (std::size_t i = 0; i < rx.size(); ++i) {
        const double a = rx[i] - mean, b = ry[i] - mean;
        sxy += a * b;
        sxx += a * a;
        syy += b * b;
    }
    detail::require(sxx > 0.0, fn, "x is constant (all ", x.size(), " values equal), so rho is undefined");
    detail::require(syy > 0.0, fn, "y is constant (all ", y.size(), " values equal), so rho is undefined");
    SpearmanResult r;
    r.n = static_cast<std::int64_t>(x.size());
    r.rho = std::clamp(sxy / std::sqrt(sxx * syy), -1.0, 1.0);
    // 1 - rho^2 as (1 - |rho|)(1 + |rho|): accurate when |rho| is close to 1.
    const double one_minus_r2 = (1.0 - std::abs(r.rho)) * (1.0 + std::abs(r.rho));
    r.p_value = one_minus_r2 <= 0.0 ? 0.0 : regularized_incomplete_beta(0.5 * (n - 2.0), 0.5, one_minus_r2);
    return r;
}

template <class S>
SpearmanResult spearman(const std::vector<S>& x, const std::vector<S>& y) {
    return spearman(std::span<const S>(x), std::span<const S>(y));
}

}  // namespace vlsparse
