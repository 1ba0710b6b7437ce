// vlsparse/policies/purekv.hpp -- PureKV on the CPU fast path (namespace vlsparse::simd).
//
// Same Params, same results as <vlsparse/reference/purekv.hpp> (equations in purekv_params.hpp):
//   window scores (Eq. 2)   the probe-attention kernel on the last w rows (fp32 probabilities, per-group
//                           sums in double), a few KV groups at a time so the scratch stays small
//   selection (Eq. 3/4)     ||V|| per row in fp32, I = s ||V|| in double, the library's top-k
//   ST-SpAttn prefill       simd::masked_attention over the ST block mask (masks/block_mask.hpp)
// The cross-layer estimator is simd::PureKVEstimator (BasicPureKVEstimator on this backend):
//   vlsparse::simd::PureKVEstimator est(params, layout, shape);
//   for each layer l:  est.prefill_layer(l, q_l, k_l, v_l, out_l, cache_l);
// or step by step: est.observe(l, q, k) (layers <= l0), est.attention(l, ...), est.select(l, v).
// Include: <vlsparse/vlsparse.hpp> or this header.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "vlsparse/attention/dense.hpp"
#include "vlsparse/attention/masked.hpp"
#include "vlsparse/attention/probe.hpp"
#include "vlsparse/core/topk.hpp"
#include "vlsparse/policies/purekv_estimator.hpp"
#include "vlsparse/policies/purekv_select.hpp"

namespace vlsparse::simd {

// Eq. 2 for one layer: the last P.window rows of q attend (causal softmax) to every key; s_j sums
// their probabilities over the window rows and the group's query heads, for j < n - w.
// q [n, H, d], k [n, H_kv, d]; only q's last w rows are read (and checked for NaN/Inf); `layer` is
// recorded in the result.
template <ElementType TQ, ElementType TK>
PureKVScores purekv_window_scores(View3<const TQ> q, View3<const TK> k, std::int64_t layer, const PureKVParams& P) {
    constexpr const char* fn = "simd::purekv_window_scores";
    ::vlsparse::detail::check_purekv_params(P, fn);
    ::vlsparse::detail::check_qkv(q, k, k, fn);
    const std::int64_t n = q.shape[0], H = q.shape[1], d = q.shape[2], Hkv = k.shape[1], qpk = H / Hkv;
    ::vlsparse::detail::require(k.shape[0] == n, fn, "q has ", n, " tokens and k has ", k.shape[0], ", expected equal (prefill)");
    ::vlsparse::detail::check_purekv_window(n, P, fn);
    const std::int64_t w = P.window, m = n - w;
    // Only the window's query rows are read: they are q's rows [m, n), at positions m.. (n_q = w < n_k).
    const View3<const TQ> qw(q.row(m, 0), {w, H, d}, q.stride);
    if (P.check_finite) {
        detail::check_finite_vectorized(qw, fn, "q (window rows)");
        detail::check_finite_vectorized(k, fn, "k");
    }
    const std::int64_t G = P.grouping == PureKVGrouping::kv_head ? Hkv : 1;
    PureKVScores r;
    r.layer = layer;
    r.n = n;
    r.window = w;
    r.heads_per_group = H / G;
    r.s.assign(static_cast<std::size_t>(G), std::vector<double>(static_cast<std::size_t>(n), 0.0));
    if (m == 0) return r;
    std::vector<std::int64_t> rows(static_cast<std::size_t>(w));
    for (std::int64_t i = 0; i < w; ++i) rows[static_cast<std::size_t>(i)] = i;
    // KV groups per probe call: probabilities [heads, w, n] in fp32 of at most ~64 MiB.
    const std::int64_t per_group = qpk * w * n * static_cast<std::int64_t>(sizeof(float));
    const std::int64_t chunk = std::clamp<std::int64_t>((std::int64_t{64} << 20) / std::max<std::int64_t>(per_group, 1), 1, Hkv);
    std::vector<float> probs(static_cast<std::size_t>(chunk * qpk * w * n));
    AttentionOptions opt = P.attention();
    opt.check_finite = false;  // checked above when asked
    std::vector<double> acc(static_cast<std::size_t>(m));
    for (std::int64_t g0 = 0; g0 < Hkv; g0 += chunk) {
        const std::int64_t gc = std::min(chunk, Hkv - g0), hc = gc * qpk;
        const View3<const TQ> qs(qw.row(0, g0 * qpk), {w, hc, d}, q.stride);
        const View3<const TK> ks(k.row(0, g0), {n, gc, d}, k.stride);
        probe_attention(qs, ks, std::span<const std::int64_t>(rows), View3<float>(probs.data(), {hc, w, n}), opt);
        for (std::int64_t hh = 0; hh < hc; ++hh) {
            const std::int64_t h = g0 * qpk + hh;
            std::fill(acc.begin(), acc.end(), 0.0);
            for (std::int64_t i = 0; i < w; ++i) {
                const float* row = probs.data() + (hh * w + i) * n;
                for (std::int64_t j = 0; j < m; ++j) acc[static_cast<std::size_t>(j)] += static_cast<double>(row[j]);
            }
            auto& s = r.s[static_cast<std::size_t>(h / r.heads_per_group)];
            for (std::int64_t j = 0; j < m; ++j) s[static_cast<std::size_t>(j)] += acc[static_cast<std::size_t>(j)];
        }
    }
    return r;
}

// ||V_{j,g}||_2 per KV head ([H_kv][n], fp32 sums of squares) or their mean over KV heads ([1][n]).
template <ElementType TV>
std::vector<std::vector<double>> purekv_v_norms(View3<const TV> v, PureKVGrouping grouping) {
    const std::int64_t n = v.shape[0], Hkv = v.shape[1], d = v.shape[2];
    std::vector<std::vector<double>> r(static_cast<std::size_t>(grouping == PureKVGrouping::kv_head ? Hkv : 1),
                                       std::vector<double>(static_cast<std::size_t>(n), 0.0));
    std::vector<float> row(static_cast<std::size_t>(d));
    for (std::int64_t j = 0; j < n; ++j)
        for (std::int64_t g = 0; g < Hkv; ++g) {
            const TV* src = v.row(j, g);
            float ss = 0.0f;
            for (std::int64_t c = 0; c < d; ++c) {
                const float x = to_float(src[c * v.stride[2]]);
                ss += x * x;
            }
            const double norm = static_cast<double>(std::sqrt(ss));
            if (grouping == PureKVGrouping::kv_head) r[static_cast<std::size_t>(g)][static_cast<std::size_t>(j)] = norm;
            else r[0][static_cast<std::size_t>(j)] += norm / static_cast<double>(Hkv);
        }
    return r;
}

// Eq. 3 / Eq. 4 and the kept set: I_j = s_j ||V_{j,g}|| (v [n, H_kv, d] of layer `layer`, whose own
// scores or l0's are `scores`), kept = window + top-h of I over [0, n - w).
template <ElementType TV>
PureKVSelection purekv_select(const PureKVScores& scores, View3<const TV> v, std::int64_t layer, const PureKVParams& P) {
    constexpr const char* fn = "simd::purekv_select";
    ::vlsparse::detail::check_purekv_select(scores, v, P, fn);
    if (P.check_finite) detail::check_finite_vectorized(v, fn, "v");
    return ::vlsparse::detail::purekv_finish(scores, purekv_v_norms(v, P.grouping), layer, P,
                                             [](std::span<const double> imp, std::int64_t h) { return topk_indices(imp, h); });
}

// ST-SpAttn prefill over a block mask already built: purekv_block_mask(layout, H, P), or the one the
// estimator keeps for all its masked layers. q [n, H, d], k, v [n, H_kv, d], out [n, H, d].
template <ElementType TQ, ElementType TK, OutputElement TO>
void purekv_st_attention(View3<const TQ> q, View3<const TK> k, View3<const TK> v, const BlockMask& mask, View3<TO> out,
                         const PureKVParams& P) {
    masked_attention(q, k, v, mask, out, P.attention());
}

// ST-SpAttn prefill: masked attention over purekv_block_mask(layout, H, P). q [n, H, d], k, v
// [n, H_kv, d], out [n, H, d]. (An estimator keeps the block mask; this builds it on each call.)
template <ElementType TQ, ElementType TK, OutputElement TO>
void purekv_st_attention(View3<const TQ> q, View3<const TK> k, View3<const TK> v, const Layout& layout, View3<TO> out,
                         const PureKVParams& P) {
    layout.require_tokens(q.shape[0], "simd::purekv_st_attention");
    purekv_st_attention(q, k, v, purekv_block_mask(layout, q.shape[1], P), out, P);
}

// The prefill attention of the layers PureKV leaves unmasked: dense causal with P's options.
template <ElementType TQ, ElementType TK, OutputElement TO>
void purekv_dense_attention(View3<const TQ> q, View3<const TK> k, View3<const TK> v, View3<TO> out,
                            const PureKVParams& P) {
    dense_attention(q, k, v, out, P.attention());
}

// PureKV's operations on the SIMD backend: the concept of BasicPureKVEstimator's Backend
// (purekv_estimator.hpp: window_scores, select, masked, dense, uses_block_mask); reference::PureKVOps is the twin.
// masked(q, k, v, ctx, mask, out, P) reads the block mask the estimator builds for this backend.
struct PureKVOps {
    static constexpr bool uses_block_mask = true;
    template <class... A> static auto window_scores(A&&... a) { return simd::purekv_window_scores(std::forward<A>(a)...); }
    template <class... A> static auto select(A&&... a) { return simd::purekv_select(std::forward<A>(a)...); }
    template <class Q, class K, class O>
    static void masked(Q q, K k, K v, const MaskContext&, const BlockMask* mask, O out, const PureKVParams& P) {
        simd::purekv_st_attention(q, k, v, *mask, out, P);
    }
    template <class... A> static auto dense(A&&... a) { return simd::purekv_dense_attention(std::forward<A>(a)...); }
};

// The paper's validation (Eq. 5-7) for layer `layer`: l0's scores against the layer's own (from its
// q, k), both weighted by its ||V||, Spearman per group over [0, n - w) (purekv_validate_over).
template <ElementType TQ, ElementType TK>
PureKVLayerValidation purekv_validate(const PureKVScores& l0_scores, View3<const TQ> q, View3<const TK> k,
                                      View3<const TK> v, std::int64_t layer, const PureKVParams& P) {
    return purekv_validate_over<PureKVOps>(purekv_select(l0_scores, v, layer, P), q, k, v, layer, P);
}

// The cross-layer estimator on the SIMD path (see purekv_estimator.hpp).
using PureKVEstimator = BasicPureKVEstimator<PureKVOps>;

}  // namespace vlsparse::simd
