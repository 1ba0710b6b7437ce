// vlsparse/policies/purekv_select.hpp -- PureKV's backend-independent steps: the budget h, the
// ST-SpAttn mask and block mask of a prompt, which layers are masked, the ranking-independent part of
// the selection (I_j = s_j ||V_j||, window + top-h), eviction and the Spearman validation; shared by
// the reference, the SIMD path and CUDA (no Eigen, no xsimd, no OpenMP; nvcc compiles it). The Params,
// enums, result types and checks are in policies/purekv_params.hpp (included here).
//   kept = W + the top-h positions of I over [0, n - w)  (larger first, ties: lower position)
// PureKV: arXiv:2510.25600, Sections 3.1-3.3; docs/purekv.md.
// Include: <vlsparse/policies/purekv.hpp> (SIMD path) or <vlsparse/reference/purekv.hpp> (reference).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "vlsparse/core/error.hpp"
#include "vlsparse/core/layout.hpp"
#include "vlsparse/core/rank_correlation.hpp"
#include "vlsparse/core/selection.hpp"
#include "vlsparse/core/tensor.hpp"
#include "vlsparse/detail/check.hpp"
#include "vlsparse/kv/kv_cache.hpp"
#include "vlsparse/masks/block_mask.hpp"
#include "vlsparse/masks/templates.hpp"
#include "vlsparse/policies/purekv_params.hpp"

namespace vlsparse {

// h, the number of kept positions outside the window, for a sequence of n tokens (checks the params).
inline std::int64_t purekv_top_h(std::int64_t n, const PureKVParams& P) {
    constexpr const char* fn = "purekv_top_h";
    detail::check_purekv_params(P, fn);
    detail::check_purekv_window(n, P, fn);
    const std::int64_t rest = n - P.window;
    if (P.budget == PureKVBudget::count) {
        detail::require(P.top_h <= rest, fn, "top_h = ", P.top_h, " is outside the budget range, expected 0 <= top_h <= n - window = ",
                        rest, " (n = ", n, ", window = ", P.window, ")");
        return P.top_h;
    }
    // floor(f * n), computed so that exact products (0.25 * 8 = 2) are not pushed down by rounding.
    const double x = P.budget_fraction * static_cast<double>(n);
    const auto total = static_cast<std::int64_t>(std::floor(x + 1e-9 * std::max(1.0, x)));
    return std::clamp<std::int64_t>(total - P.window, 0, rest);
}

// The ST-SpAttn mask description of a prompt (P.st on the video segments, Dense template elsewhere).
inline MaskContext purekv_mask_context(const Layout& layout, const PureKVParams& P) {
    detail::check_purekv_params(P, "purekv_mask_context");
    return make_video_mask_context(layout, P.st);
}

// The ST-SpAttn block mask for H query heads (every head: Dense template + the video mask), the form
// simd::masked_attention consumes.
inline BlockMask purekv_block_mask(const Layout& layout, std::int64_t heads, const PureKVParams& P) {
    constexpr const char* fn = "purekv_block_mask";
    detail::require(heads > 0, fn, "heads = ", heads, ", expected > 0");
    const MaskContext ctx = purekv_mask_context(layout, P);
    return make_block_mask(ctx, std::vector<MaskTemplate>(static_cast<std::size_t>(heads), MaskTemplate::dense),
                           P.q_block, P.k_block);
}

// True when layer `layer`'s prefill attention uses the ST mask: st.kind != none, layer >=
// st_start_layer, and the layout has a video segment (the mask is the causal mask otherwise).
inline bool purekv_masked_layer(const Layout& layout, std::int64_t layer, const PureKVParams& P) {
    if (P.st.kind == VideoMask::none || layer < P.st_start_layer) return false;
    for (const auto& s : layout.segments())
        if (s.kind == SegmentKind::video) return true;
    return false;
}

// Eviction: the layer's cache keeps the selected positions (nothing is evicted in a dense layer).
template <ElementType TC>
void purekv_evict(KvCache<TC>& cache, const PureKVSelection& s) {
    if (!s.dense) cache.keep(s.selection);
}

// Spearman validation of one layer from two selections over the same V (the estimate, whose scores
// came from l0, and the layer's own): rho / p per group over the non-window positions.
inline PureKVLayerValidation purekv_validation(const PureKVSelection& estimated, const PureKVSelection& own) {
    constexpr const char* fn = "purekv_validation";
    detail::require(!estimated.dense && !own.dense, fn, "a dense selection has no importance scores to compare");
    detail::require(estimated.n == own.n && estimated.window == own.window && estimated.groups() == own.groups(), fn,
                    "selections differ in n (", estimated.n, " vs ", own.n, "), window (", estimated.window, " vs ",
                    own.window, ") or groups (", estimated.groups(), " vs ", own.groups(), "), expected equal");
    const std::int64_t m = estimated.n - estimated.window;
    detail::require(m >= 3, fn, "only ", m, " positions outside the window (n = ", estimated.n, ", window = ",
                    estimated.window, "), expected at least 3 for a p-value");
    PureKVLayerValidation r;
    r.layer = own.layer;
    r.source_layer = estimated.source_layer;
    for (std::int64_t g = 0; g < estimated.groups(); ++g) {
        const auto& a = estimated.importance[static_cast<std::size_t>(g)];
        const auto& b = own.importance[static_cast<std::size_t>(g)];
        r.groups.push_back(spearman(std::span<const double>(a.data(), static_cast<std::size_t>(m)),
                                    std::span<const double>(b.data(), static_cast<std::size_t>(m))));
    }
    return r;
}

namespace detail {

// The checks of purekv_select on every backend: the params, v [n, H_kv, d] non-empty with valid
// strides, `scores` over the same n and window with one group per KV head (kv_head grouping) or one.
template <class TV>
void check_purekv_select(const PureKVScores& scores, const View3<const TV>& v, const PureKVParams& P, const char* fn) {
    check_purekv_params(P, fn);
    check_strides(v, fn, "v", false);
    const std::int64_t n = v.shape[0], Hkv = v.shape[1];
    require(n > 0 && Hkv > 0 && v.shape[2] > 0, fn, "v has shape [", n, ", ", Hkv, ", ", v.shape[2],
            "], expected a non-empty [n, H_kv, d]");
    require(scores.n == n && scores.window == P.window, fn, "scores cover n = ", scores.n, " with window ",
            scores.window, ", v has n = ", n, " and the params window ", P.window, "; expected equal");
    const std::int64_t G = P.grouping == PureKVGrouping::kv_head ? Hkv : 1;
    require(scores.groups() == G, fn, "scores have ", scores.groups(), " groups, expected ", G, " (",
            to_string(P.grouping), " grouping, H_kv = ", Hkv, ")");
}

// The ranking-independent steps of Eq. 3/4 + selection, given the group's V norms: importance, then
// window + top-h by `top` (a backend's top-k: the h largest of the first n - w entries, ascending).
template <class TopFn>
PureKVSelection purekv_finish(const PureKVScores& s, std::vector<std::vector<double>> v_norm, std::int64_t layer,
                              const PureKVParams& P, TopFn&& top) {
    const std::int64_t n = s.n, G = s.groups(), w = s.window, h = purekv_top_h(n, P);
    PureKVSelection r;
    r.n = n;
    r.layer = layer;
    r.source_layer = s.layer;
    r.window = w;
    r.top_h = h;
    r.v_norm = std::move(v_norm);
    r.importance.assign(static_cast<std::size_t>(G), std::vector<double>(static_cast<std::size_t>(n), 0.0));
    r.selection.n = n;
    r.selection.indices.resize(static_cast<std::size_t>(G));
    for (std::int64_t g = 0; g < G; ++g) {
        auto& imp = r.importance[static_cast<std::size_t>(g)];
        const auto& sg = s.s[static_cast<std::size_t>(g)];
        const auto& vg = r.v_norm[static_cast<std::size_t>(g)];
        for (std::int64_t j = 0; j < n - w; ++j) {
            imp[static_cast<std::size_t>(j)] = sg[static_cast<std::size_t>(j)] * vg[static_cast<std::size_t>(j)];
            require(std::isfinite(imp[static_cast<std::size_t>(j)]), "purekv_select", "importance of position ", j,
                    " is not finite (score ", sg[static_cast<std::size_t>(j)], ", |V| ", vg[static_cast<std::size_t>(j)], ")");
        }
        std::vector<std::int64_t> list = top(std::span<const double>(imp.data(), static_cast<std::size_t>(n - w)), h);
        for (std::int64_t j = n - w; j < n; ++j) list.push_back(j);
        r.selection.indices[static_cast<std::size_t>(g)] = std::move(list);
    }
    r.selection.scores = r.importance;
    return r;
}

// Selection of a dense (lower) layer: every position, no scores.
inline PureKVSelection purekv_dense_selection(std::int64_t n, std::int64_t layer) {
    PureKVSelection r;
    r.n = n;
    r.layer = layer;
    r.dense = true;
    r.selection = TokenSelection::all(n);
    return r;
}

}  // namespace detail

}  // namespace vlsparse
