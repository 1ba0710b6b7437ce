// vlsparse/reference/purekv.hpp -- the exact scalar reference of PureKV (arXiv:2510.25600, Sections 3.1-3.3).
//
//   A^l[h,i,j] = softmax_{j <= i}(scale q_{i,h} . k_{j,g(h)}),  i in the window [n-w, n)        (Eq. 1)
//   s_j        = sum_{i in window} sum_{h in group} A^l[h,i,j],  j < n - w                      (Eq. 2)
//   I_j        = s_j * ||V^l_{j,g}||_2  (mean over KV heads for the layer grouping)          (Eq. 3/4)
//   kept       = window + top-h of I over [0, n - w)  (larger first, ties: lower position)
//   ST-SpAttn  = reference::masked_attention with the video mask context (Dense template per head)
//
// Plain loops, double accumulation, full sorts instead of selection algorithms: an implementation
// independent of the SIMD path's, readable beside the paper. The cross-layer estimator on this
// backend is reference::PureKVEstimator. Include: <vlsparse/reference/purekv.hpp>
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <span>
#include <utility>
#include <vector>

#include "vlsparse/masks/templates.hpp"
#include "vlsparse/policies/purekv_estimator.hpp"
#include "vlsparse/policies/purekv_select.hpp"
#include "vlsparse/reference/attention.hpp"
#include "vlsparse/reference/blindsight.hpp"

namespace vlsparse::reference {

// Eq. 2 for one layer (see the header comment). q [n, H, d], k [n, H_kv, d]; only q's last w rows are
// read (and checked for NaN/Inf).
template <ElementType TQ, ElementType TK>
PureKVScores purekv_window_scores(View3<const TQ> q, View3<const TK> k, std::int64_t layer, const PureKVParams& P) {
    constexpr const char* fn = "reference::purekv_window_scores";
    detail::check_purekv_params(P, fn);
    detail::check_qkv(q, k, k, fn);
    const std::int64_t n = q.shape[0], H = q.shape[1], Hkv = k.shape[1];
    detail::require(k.shape[0] == n, fn, "q has ", n, " tokens and k has ", k.shape[0], ", expected equal (prefill)");
    detail::check_purekv_window(n, P, fn);
    const std::int64_t w = P.window, m = n - w;
    // Only the window's query rows are read: q's rows [m, n) (the probe view puts them at positions m..).
    const View3<const TQ> qw(q.row(m, 0), {w, H, q.shape[2]}, q.stride);
    detail::check_finite(qw, fn, "q (window rows)");
    detail::check_finite(k, fn, "k");
    const std::int64_t G = P.grouping == PureKVGrouping::kv_head ? Hkv : 1;
    PureKVScores r;
    r.layer = layer;
    r.n = n;
    r.window = w;
    r.heads_per_group = H / G;
    r.s.assign(static_cast<std::size_t>(G), std::vector<double>(static_cast<std::size_t>(n), 0.0));
    if (m == 0) return r;
    std::vector<std::int64_t> rows(static_cast<std::size_t>(w));
    std::iota(rows.begin(), rows.end(), std::int64_t{0});
    std::vector<double> probs(static_cast<std::size_t>(H * w * n));
    probe_attention(qw, k, std::span<const std::int64_t>(rows), View3<double>(probs.data(), {H, w, n}), P.attention());
    for (std::int64_t h = 0; h < H; ++h) {
        auto& s = r.s[static_cast<std::size_t>(h / r.heads_per_group)];
        for (std::int64_t i = 0; i < w; ++i)
            for (std::int64_t j = 0; j < m; ++j) s[static_cast<std::size_t>(j)] += probs[static_cast<std::size_t>((h * w + i) * n + j)];
    }
    return r;
}

// Eq. 3 / Eq. 4 and the kept set. v [n, H_kv, d] of layer `layer`; `scores` its own or l0's.
template <ElementType TV>
PureKVSelection purekv_select(const PureKVScores& scores, View3<const TV> v, std::int64_t layer, const PureKVParams& P) {
    constexpr const char* fn = "reference::purekv_select";
    detail::check_purekv_select(scores, v, P, fn);
    const std::int64_t n = v.shape[0], Hkv = v.shape[1], d = v.shape[2];
    const std::int64_t G = P.grouping == PureKVGrouping::kv_head ? Hkv : 1;
    detail::check_finite(v, fn, "v");
    // ||V_{j,g}||_2 in double.
    std::vector<std::vector<double>> norms(static_cast<std::size_t>(G), std::vector<double>(static_cast<std::size_t>(n), 0.0));
    for (std::int64_t j = 0; j < n; ++j)
        for (std::int64_t g = 0; g < Hkv; ++g) {
            double ss = 0.0;
            for (std::int64_t c = 0; c < d; ++c) {
                const double x = static_cast<double>(to_float(v(j, g, c)));
                ss += x * x;
            }
            if (P.grouping == PureKVGrouping::kv_head) norms[static_cast<std::size_t>(g)][static_cast<std::size_t>(j)] = std::sqrt(ss);
            else norms[0][static_cast<std::size_t>(j)] += std::sqrt(ss) / static_cast<double>(Hkv);
        }
    // Top-h by a full stable sort: score descending, equal scores by lower position.
    auto top = [](std::span<const double> imp, std::int64_t h) {
        std::vector<std::int64_t> idx(imp.size());
        std::iota(idx.begin(), idx.end(), std::int64_t{0});
        std::stable_sort(idx.begin(), idx.end(), [&](std::int64_t a, std::int64_t b) {
            return imp[static_cast<std::size_t>(a)] > imp[static_cast<std::size_t>(b)];
        });
        idx.resize(static_cast<std::size_t>(h));
        std::sort(idx.begin(), idx.end());
        return idx;
    };
    return detail::purekv_finish(scores, std::move(norms), layer, P, top);
}

// ST-SpAttn prefill over a video mask context already built: purekv_mask_context(layout, P), or the
// one the estimator keeps; pair by pair over all keys, the Dense template on every head.
template <ElementType TQ, ElementType TK, OutputElement TO>
void purekv_st_attention(View3<const TQ> q, View3<const TK> k, View3<const TK> v, const MaskContext& ctx,
                         View3<TO> out, const PureKVParams& P) {
    masked_attention(q, k, v, ctx, std::vector<MaskTemplate>(static_cast<std::size_t>(q.shape[1]), MaskTemplate::dense),
                     out, P.attention());
}

// ST-SpAttn prefill: masked attention over the video mask context of the layout.
template <ElementType TQ, ElementType TK, OutputElement TO>
void purekv_st_attention(View3<const TQ> q, View3<const TK> k, View3<const TK> v, const Layout& layout, View3<TO> out,
                         const PureKVParams& P) {
    layout.require_tokens(q.shape[0], "reference::purekv_st_attention");
    purekv_st_attention(q, k, v, purekv_mask_context(layout, P), out, P);
}

// The prefill attention of the layers PureKV leaves unmasked: dense causal with P's options.
template <ElementType TQ, ElementType TK, OutputElement TO>
void purekv_dense_attention(View3<const TQ> q, View3<const TK> k, View3<const TK> v, View3<TO> out,
                            const PureKVParams& P) {
    dense_attention(q, k, v, out, P.attention());
}

// PureKV's operations on the reference backend: the concept of BasicPureKVEstimator's Backend
// (purekv_estimator.hpp: window_scores, select, masked, dense, uses_block_mask); simd::PureKVOps is the twin.
// masked(q, k, v, ctx, mask, out, P) reads only the mask context (mask is null on this backend).
struct PureKVOps {
    static constexpr bool uses_block_mask = false;
    template <class... A> static auto window_scores(A&&... a) { return reference::purekv_window_scores(std::forward<A>(a)...); }
    template <class... A> static auto select(A&&... a) { return reference::purekv_select(std::forward<A>(a)...); }
    template <class Q, class K, class O>
    static void masked(Q q, K k, K v, const MaskContext& ctx, const BlockMask*, O out, const PureKVParams& P) {
        reference::purekv_st_attention(q, k, v, ctx, out, P);
    }
    template <class... A> static auto dense(A&&... a) { return reference::purekv_dense_attention(std::forward<A>(a)...); }
};

// The paper's validation (Eq. 5-7) for layer `layer`; see simd::purekv_validate.
template <ElementType TQ, ElementType TK>
PureKVLayerValidation purekv_validate(const PureKVScores& l0_scores, View3<const TQ> q, View3<const TK> k,
                                      View3<const TK> v, std::int64_t layer, const PureKVParams& P) {
    return purekv_validate_over<PureKVOps>(purekv_select(l0_scores, v, layer, P), q, k, v, layer, P);
}

// The cross-layer estimator on the reference path (see purekv_estimator.hpp).
using PureKVEstimator = BasicPureKVEstimator<PureKVOps>;

}  // namespace vlsparse::reference
