// vlsparse/reference/baselines.hpp -- exact reference of the baselines' arithmetic (H2O, SnapKV, FastV).
//
//   A[h,i,j] = softmax_{j <= i}(scale q_{i,h} . k_{j,g(h)})
//   H2O     a_j = sum_{i >= j} sum_{h in group} A[h,i,j]
//   SnapKV  s_j = sum_{i = n-w}^{n-1} sum_{h in group} A[h,i,j]   (j < n - w),
//           avg pool: s'_j = (1/k) sum_{|t-j| <= k/2, 0 <= t < n-w} s_t;   max pool: max of the same t
//   FastV   s_j = (1/H) sum_h A[h,n-1,j]
// The selection from these scores is the shared code of vlsparse/policies/baselines_select.hpp, and so
// is the sequencing of h2o_select / snapkv_select / fastv_select (written once over BaselineOps);
// StreamingLLM, random and fixed-ratio are there too: they have no arithmetic.
// Plain loops, double accumulation. Include: <vlsparse/reference/baselines.hpp>
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <span>
#include <utility>
#include <vector>

#include "vlsparse/policies/baselines_select.hpp"
#include "vlsparse/reference/attention.hpp"
#include "vlsparse/reference/indexed_decode.hpp"

namespace vlsparse::reference {

namespace detail {

// Attention probabilities of query rows `rows` of head h: probs[r][j] (j < n), double.
template <ElementType TQ, ElementType TK>
std::vector<double> head_probs(View3<const TQ> q, View3<const TK> k, std::int64_t h, std::span<const std::int64_t> rows,
                               const AttentionOptions& opt) {
    const std::int64_t n = q.shape[0], d = q.shape[2], qpk = q.shape[1] / k.shape[1];
    const View3<const TQ> qh(q.row(0, h), {n, 1, d}, q.stride);
    const View3<const TK> kh(k.row(0, h / qpk), {n, 1, d}, k.stride);
    std::vector<double> probs(rows.size() * static_cast<std::size_t>(n));
    probe_attention(qh, kh, rows, View3<double>(probs.data(), {1, static_cast<std::int64_t>(rows.size()), n}), opt);
    return probs;
}
}  // namespace detail

// H2O's accumulated attention over the causal prefill: [G][n], G = H_kv (kv_head) or 1 (layer).
template <ElementType TQ, ElementType TK>
std::vector<std::vector<double>> h2o_scores(View3<const TQ> q, View3<const TK> k, BaselineGroups groups,
                                            const AttentionOptions& opt = {}) {
    ::vlsparse::detail::check_prefill_qk(q, k, "reference::h2o_scores");
    const std::int64_t n = q.shape[0], H = q.shape[1], qpk = H / k.shape[1];
    const std::int64_t G = groups == BaselineGroups::kv_head ? k.shape[1] : 1;
    std::vector<std::vector<double>> acc(static_cast<std::size_t>(G), std::vector<double>(static_cast<std::size_t>(n), 0.0));
    const auto rows = detail::iota_n(n);
    for (std::int64_t h = 0; h < H; ++h) {
        const auto probs = detail::head_probs(q, k, h, rows, opt);
        auto& a = acc[static_cast<std::size_t>(G == 1 ? 0 : h / qpk)];
        for (std::int64_t i = 0; i < n; ++i)
            for (std::int64_t j = 0; j <= i; ++j) a[static_cast<std::size_t>(j)] += probs[static_cast<std::size_t>(i * n + j)];
    }
    return acc;
}

// SnapKV's raw window scores [G][n - window].
template <ElementType TQ, ElementType TK>
std::vector<std::vector<double>> snapkv_window_scores(View3<const TQ> q, View3<const TK> k, std::int64_t window,
                                                      BaselineGroups groups, const AttentionOptions& opt = {}) {
    constexpr const char* fn = "reference::snapkv_window_scores";
    ::vlsparse::detail::check_prefill_qk(q, k, fn);
    const std::int64_t n = q.shape[0], H = q.shape[1], qpk = H / k.shape[1];
    ::vlsparse::detail::require(window >= 1 && window <= n, fn, "window = ", window, ", expected 1 <= window <= n = ", n);
    const std::int64_t L = n - window, G = groups == BaselineGroups::kv_head ? k.shape[1] : 1;
    std::vector<std::int64_t> rows(static_cast<std::size_t>(window));
    for (std::int64_t r = 0; r < window; ++r) rows[static_cast<std::size_t>(r)] = L + r;
    std::vector<std::vector<double>> acc(static_cast<std::size_t>(G), std::vector<double>(static_cast<std::size_t>(L), 0.0));
    for (std::int64_t h = 0; h < H; ++h) {
        const auto probs = detail::head_probs(q, k, h, rows, opt);
        auto& a = acc[static_cast<std::size_t>(G == 1 ? 0 : h / qpk)];
        for (std::int64_t j = 0; j < L; ++j)
            for (std::int64_t r = 0; r < window; ++r) a[static_cast<std::size_t>(j)] += probs[static_cast<std::size_t>(r * n + j)];
    }
    return acc;
}

// 1-D pooling, stride 1, padding kernel / 2 (see the header comment). Kernel odd.
inline std::vector<double> snapkv_pool(std::span<const double> s, std::int64_t kernel, SnapKVPooling pooling) {
    constexpr const char* fn = "reference::snapkv_pool";
    ::vlsparse::detail::require(kernel >= 1 && kernel % 2 == 1, fn, "kernel = ", kernel, ", expected odd >= 1");
    const auto L = static_cast<std::int64_t>(s.size());
    std::vector<double> out(static_cast<std::size_t>(L));
    for (std::int64_t j = 0; j < L; ++j) {
        if (pooling == SnapKVPooling::none) {
            out[static_cast<std::size_t>(j)] = s[static_cast<std::size_t>(j)];
            continue;
        }
        double sum = 0.0, mx = -std::numeric_limits<double>::infinity();
        for (std::int64_t t = j - kernel / 2; t <= j + kernel / 2; ++t) {
            if (t < 0 || t >= L) continue;  // padding: contributes 0 to the sum, nothing to the max
            sum += s[static_cast<std::size_t>(t)];
            mx = std::max(mx, s[static_cast<std::size_t>(t)]);
        }
        out[static_cast<std::size_t>(j)] = pooling == SnapKVPooling::avg ? sum / static_cast<double>(kernel) : mx;
    }
    return out;
}

// FastV's score: the last row's attention averaged over every query head.
template <ElementType TQ, ElementType TK>
std::vector<double> fastv_scores(View3<const TQ> q, View3<const TK> k, const AttentionOptions& opt = {}) {
    ::vlsparse::detail::check_prefill_qk(q, k, "reference::fastv_scores");
    const std::int64_t n = q.shape[0], H = q.shape[1];
    const std::int64_t last[1] = {n - 1};
    std::vector<double> s(static_cast<std::size_t>(n), 0.0);
    for (std::int64_t h = 0; h < H; ++h) {
        const auto probs = detail::head_probs(q, k, h, std::span<const std::int64_t>(last), opt);
        for (std::int64_t j = 0; j < n; ++j) s[static_cast<std::size_t>(j)] += probs[static_cast<std::size_t>(j)];
    }
    for (auto& x : s) x /= static_cast<double>(H);
    return s;
}

// The baselines' operations on the reference backend: the concept of golden::run_baselines_case, for
// code written once over a backend (simd::BaselineOps is the SIMD twin):
//   h2o_scores(q [n, H, d], k [n, H_kv, d], BaselineGroups[, opt]) -> [G][n]
//   snapkv_window_scores(q, k, window, BaselineGroups[, opt]) -> [G][n - window]
//   snapkv_pool(scores, kernel, SnapKVPooling) -> pooled scores;  fastv_scores(q, k[, opt]) -> [n]
//   decode(q [H, d], KvCache, CacheRows, out [H, d], width) -> the probabilities [H, width] of indexed
//     decode attention over the rows (row h: its KV head's list, in order, zero past its end)
struct BaselineOps {
    template <ElementType T>
    static std::vector<double> decode(View2<const T> q, const KvCache<T>& cache, const CacheRows& rows, View2<float> out,
                                      std::int64_t width) {
        std::vector<double> probs(static_cast<std::size_t>(q.shape[0] * width));
        reference::indexed_decode_attention(q, cache, rows, out, View2<double>(probs.data(), {q.shape[0], width}));
        return probs;
    }
    template <class... A> static auto h2o_scores(A&&... a) { return reference::h2o_scores(std::forward<A>(a)...); }
    template <class... A> static auto snapkv_window_scores(A&&... a) {
        return reference::snapkv_window_scores(std::forward<A>(a)...);
    }
    template <class... A> static auto snapkv_pool(A&&... a) { return reference::snapkv_pool(std::forward<A>(a)...); }
    template <class... A> static auto fastv_scores(A&&... a) { return reference::fastv_scores(std::forward<A>(a)...); }
};

// The prefill selections, by the sequencing of baselines_select.hpp over reference::BaselineOps.
template <ElementType TQ, ElementType TK>
TokenSelection h2o_select(View3<const TQ> q, View3<const TK> k, const H2OParams& P) {
    return h2o_select_over<BaselineOps>(q, k, P, "reference::h2o_select");
}
template <ElementType TQ, ElementType TK>
TokenSelection snapkv_select(View3<const TQ> q, View3<const TK> k, const SnapKVParams& P) {
    return snapkv_select_over<BaselineOps>(q, k, P, "reference::snapkv_select");
}
template <ElementType TQ, ElementType TK>
TokenSelection fastv_select(View3<const TQ> q, View3<const TK> k, const Layout& layout, const FastVParams& P) {
    return fastv_select_over<BaselineOps>(q, k, layout, P, "reference::fastv_select");
}

}  // namespace vlsparse::reference
