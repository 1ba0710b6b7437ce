// vlsparse/policies/baselines.hpp -- the baselines on the CPU fast path (namespace vlsparse::simd):
// H2O, SnapKV and FastV scores by the SIMD attention kernels (simd::probe_attention, fp32
// accumulation, per-head sums widened to double), then the shared selection of baselines_select.hpp
// (h2o_select and the others: the sequencing written there once over simd::BaselineOps).
// StreamingLLM, random and fixed-ratio selection have no arithmetic: streamingllm_select,
// random_select and fixed_ratio_select in baselines_select.hpp serve both paths.
//
//   H2O     a_j = sum_{i >= j} sum_{h in group} A[h,i,j]                 -> h2o_select
//   SnapKV  s_j = sum_{i >= n-w} sum_{h in group} A[h,i,j], j < n-w;  pool_k(s) -> snapkv_select
//   FastV   s_j = (1/H) sum_h A[h,n-1,j]                                  -> fastv_select
// Same signatures and results as <vlsparse/reference/baselines.hpp> (up to fp32 rounding of the
// scores). The Policy adapters (H2OPolicy, ...) are in <vlsparse/policies/baselines_policy.hpp>.
// Include: <vlsparse/vlsparse.hpp> or this header.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <span>
#include <utility>
#include <vector>

#include "vlsparse/attention/probe.hpp"
#include "vlsparse/policies/avl.hpp"
#include "vlsparse/policies/baselines_select.hpp"

namespace vlsparse::simd {

// H2O's accumulated attention over the causal prefill: [G][n], G = H_kv (kv_head) or 1 (layer).
template <ElementType TQ, ElementType TK>
std::vector<std::vector<double>> h2o_scores(View3<const TQ> q, View3<const TK> k, BaselineGroups groups,
                                            const AttentionOptions& opt = {}) {
    ::vlsparse::detail::check_prefill_qk(q, k, "simd::h2o_scores");
    auto acc = avl_h2o_scores(q, k, AvlTextGroups::per_kv_head, opt);
    if (groups == BaselineGroups::layer) {
        for (std::size_t g = 1; g < acc.size(); ++g)
            for (std::size_t j = 0; j < acc[0].size(); ++j) acc[0][j] += acc[g][j];
        acc.resize(1);
    }
    return acc;
}

// SnapKV's raw window scores: for j < n - window, the attention of the last `window` queries summed
// over them and over the query heads of each group: [G][n - window].
template <ElementType TQ, ElementType TK>
std::vector<std::vector<double>> snapkv_window_scores(View3<const TQ> q, View3<const TK> k, std::int64_t window,
                                                      BaselineGroups groups, const AttentionOptions& opt = {}) {
    constexpr const char* fn = "simd::snapkv_window_scores";
    ::vlsparse::detail::check_prefill_qk(q, k, fn);
    const std::int64_t n = q.shape[0], H = q.shape[1], d = q.shape[2], Hkv = k.shape[1], qpk = H / Hkv;
    ::vlsparse::detail::require(window >= 1 && window <= n, fn, "window = ", window, ", expected 1 <= window <= n = ", n);
    if (opt.check_finite) {
        detail::check_finite_vectorized(q, fn, "q");
        detail::check_finite_vectorized(k, fn, "k");
    }
    const std::int64_t L = n - window, G = groups == BaselineGroups::kv_head ? Hkv : 1;
    std::vector<std::int64_t> rows(static_cast<std::size_t>(window));
    std::iota(rows.begin(), rows.end(), L);
    std::vector<std::vector<double>> acc(static_cast<std::size_t>(G), std::vector<double>(static_cast<std::size_t>(L), 0.0));
    std::vector<float> probs(static_cast<std::size_t>(window * n)), head_sum(static_cast<std::size_t>(L));
    AttentionOptions o = opt;
    o.check_finite = false;  // checked above
    for (std::int64_t h = 0; h < H; ++h) {
        const View3<const TQ> qh(q.row(0, h), {n, 1, d}, q.stride);
        const View3<const TK> kh(k.row(0, h / qpk), {n, 1, d}, k.stride);
        probe_attention(qh, kh, std::span<const std::int64_t>(rows), View3<float>(probs.data(), {1, window, n}), o);
        std::fill(head_sum.begin(), head_sum.end(), 0.0f);
        for (std::int64_t r = 0; r < window; ++r) {
            const float* p = probs.data() + r * n;
            for (std::int64_t j = 0; j < L; ++j) head_sum[static_cast<std::size_t>(j)] += p[j];
        }
        auto& a = acc[static_cast<std::size_t>(G == 1 ? 0 : h / qpk)];
        for (std::int64_t j = 0; j < L; ++j) a[static_cast<std::size_t>(j)] += head_sum[static_cast<std::size_t>(j)];
    }
    return acc;
}

// 1-D pooling with stride 1 and padding kernel / 2 (output length = input length): avg divides by
// the kernel (zero padding counted, as F.avg_pool1d), max ignores the padding. Kernel odd.
inline std::vector<double> snapkv_pool(std::span<const double> s, std::int64_t kernel, SnapKVPooling pooling) {
    constexpr const char* fn = "simd::snapkv_pool";
    ::vlsparse::detail::require(kernel >= 1 && kernel % 2 == 1, fn, "kernel = ", kernel, ", expected odd >= 1");
    const auto L = static_cast<std::int64_t>(s.size());
    std::vector<double> out(s.begin(), s.end());
    if (pooling == SnapKVPooling::none) return out;
    const std::int64_t r = kernel / 2;
    for (std::int64_t j = 0; j < L; ++j) {
        const std::int64_t a = std::max<std::int64_t>(0, j - r), b = std::min(L - 1, j + r);
        double acc = pooling == SnapKVPooling::avg ? 0.0 : s[static_cast<std::size_t>(a)];
        for (std::int64_t t = a; t <= b; ++t) {
            const double x = s[static_cast<std::size_t>(t)];
            acc = pooling == SnapKVPooling::avg ? acc + x : std::max(acc, x);
        }
        out[static_cast<std::size_t>(j)] = pooling == SnapKVPooling::avg ? acc / static_cast<double>(kernel) : acc;
    }
    return out;
}

// FastV's score: the last row's attention averaged over every query head (n values).
template <ElementType TQ, ElementType TK>
std::vector<double> fastv_scores(View3<const TQ> q, View3<const TK> k, const AttentionOptions& opt = {}) {
    ::vlsparse::detail::check_prefill_qk(q, k, "simd::fastv_scores");
    return avl_scores(q, k, opt);
}

// The baselines' operations on the SIMD backend: the concept of golden::run_baselines_case (the
// signatures are listed at reference::BaselineOps), for code written once over a backend. decode's
// probabilities come from the fp32 kernel, widened to double.
struct BaselineOps {
    template <ElementType T>
    static std::vector<double> decode(View2<const T> q, const KvCache<T>& cache, const CacheRows& rows, View2<float> out,
                                      std::int64_t width) {
        const std::int64_t H = q.shape[0];
        std::vector<float> probs(static_cast<std::size_t>(H * width));
        simd::indexed_decode_attention(q, cache, rows, out, View2<float>(probs.data(), {H, width}));
        return {probs.begin(), probs.end()};
    }
    template <class... A> static auto h2o_scores(A&&... a) { return simd::h2o_scores(std::forward<A>(a)...); }
    template <class... A> static auto snapkv_window_scores(A&&... a) {
        return simd::snapkv_window_scores(std::forward<A>(a)...);
    }
    template <class... A> static auto snapkv_pool(A&&... a) { return simd::snapkv_pool(std::forward<A>(a)...); }
    template <class... A> static auto fastv_scores(A&&... a) { return simd::fastv_scores(std::forward<A>(a)...); }
};

// The prefill selections (baselines_select.hpp: the sequencing written once over BaselineOps).
// H2O: q [n, H, d], k [n, H_kv, d].
template <ElementType TQ, ElementType TK>
TokenSelection h2o_select(View3<const TQ> q, View3<const TK> k, const H2OParams& P) {
    return h2o_select_over<BaselineOps>(q, k, P, "simd::h2o_select");
}
// SnapKV: window + top (capacity - window) by pooled window scores.
template <ElementType TQ, ElementType TK>
TokenSelection snapkv_select(View3<const TQ> q, View3<const TK> k, const SnapKVParams& P) {
    return snapkv_select_over<BaselineOps>(q, k, P, "simd::snapkv_select");
}
// FastV's pruning decision at layer K-1 (q, k of that layer, prefill over the layout's n tokens):
// the positions that stay in the sequence for layers K, K+1, ... (shared list, with the scores).
template <ElementType TQ, ElementType TK>
TokenSelection fastv_select(View3<const TQ> q, View3<const TK> k, const Layout& layout, const FastVParams& P) {
    return fastv_select_over<BaselineOps>(q, k, layout, P, "simd::fastv_select");
}

}  // namespace vlsparse::simd
