// vlsparse/policies/purekv_params.hpp -- PureKV parameters, result types and the backend-independent
// parts (argument checks, budgets, the ST-SpAttn mask, the Spearman validation), shared by the
// reference, SIMD and CUDA paths.
//
// PureKV (arXiv:2510.25600, Sections 3.1-3.3; its equations are restated in docs/purekv.md):
//   A^l[h,i,j] = softmax_{j <= i}(scale q^l_{i,h} . k^l_{j,g(h)}),  i in the window W = [n-w, n)   (Eq. 1)
//   s^l_j      = sum_{i in W} sum_{h in group} A^l[h,i,j]  for j < n - w  (0 inside the window)   (Eq. 2)
//   I^l_j      = s^{src}_j * ||V^l_{j,g}||_2,  src = l for l <= l0 (Eq. 3), src = l0 above (Eq. 4)
//   kept       = W + the top-h positions of I over [0, n - w)  (larger first, ties: lower position)
//   validation = Spearman rho / p between s^{l0} ||V^l|| and s^l ||V^l|| over [0, n - w)   (Eq. 5-7)
//   ST-SpAttn  = the spatial_temporal video mask (masks/templates.hpp) from layer st_start_layer on.
// Groups: per KV head by default (group g sums the query heads of its GQA group and uses ||V_{j,g}||);
// option `layer`: one group summing every query head, with the mean over KV heads of ||V_{j,g}||.
//
// The cross-layer estimator that carries l0's scores through a prefill: policies/purekv_estimator.hpp.
// Include: <vlsparse/policies/purekv.hpp> (SIMD path) or <vlsparse/reference/purekv.hpp> (reference).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "vlsparse/attention/common.hpp"
#include "vlsparse/core/enum_names.hpp"
#include "vlsparse/core/error.hpp"
#include "vlsparse/core/layout.hpp"
#include "vlsparse/core/model_shape.hpp"
#include "vlsparse/core/rank_correlation.hpp"
#include "vlsparse/core/selection.hpp"
#include "vlsparse/kv/kv_cache.hpp"
#include "vlsparse/masks/block_mask.hpp"
#include "vlsparse/masks/templates.hpp"

namespace vlsparse {

// How query heads are grouped into one score vector and one kept set.
enum class PureKVGrouping : std::uint8_t {
    kv_head,  // one set per KV head: s summed over its query heads, its own ||V_{j,g}|| (default)
    layer,    // one set per layer: s summed over all query heads, mean over KV heads of ||V_{j,g}||
};

// How the number of kept non-window tokens h is given.
enum class PureKVBudget : std::uint8_t {
    count,     // h = top_h
    fraction,  // h = max(0, floor(budget_fraction * n) - w): the cache keeps floor(f n) tokens, window included
};

// What layers below l0 keep.
enum class PureKVLowerLayers : std::uint8_t {
    own_scores,  // window + top-h by their own window attention (Eq. 2-3 with s^l; Section 3.1, "lower layers")
    dense,       // everything (no scores computed, nothing evicted)
};

inline constexpr EnumName<PureKVGrouping> kPureKVGroupingNames[] = {{PureKVGrouping::kv_head, "kv_head"},
                                                                    {PureKVGrouping::layer, "layer"}};
inline constexpr EnumName<PureKVBudget> kPureKVBudgetNames[] = {{PureKVBudget::count, "count"}, {PureKVBudget::fraction, "fraction"}};
inline constexpr EnumName<PureKVLowerLayers> kPureKVLowerLayersNames[] = {{PureKVLowerLayers::own_scores, "own_scores"},
                                                                          {PureKVLowerLayers::dense, "dense"}};
constexpr std::span<const EnumName<PureKVGrouping>> enum_names(PureKVGrouping) { return kPureKVGroupingNames; }
constexpr std::span<const EnumName<PureKVBudget>> enum_names(PureKVBudget) { return kPureKVBudgetNames; }
constexpr std::span<const EnumName<PureKVLowerLayers>> enum_names(PureKVLowerLayers) { return kPureKVLowerLayersNames; }
constexpr std::string_view to_string(PureKVGrouping g) { return enum_name(g); }
constexpr std::string_view to_string(PureKVBudget b) { return enum_name(b); }
constexpr std::string_view to_string(PureKVLowerLayers m) { return enum_name(m); }

struct PureKVParams {
    std::int64_t l0 = 2;      // the layer whose window attention scores every higher layer reuses
    std::int64_t window = 32; // w: the last w queries score the keys, the last w keys are always kept

    PureKVBudget budget = PureKVBudget::fraction;
    std::int64_t top_h = 256;       // budget == count: kept tokens outside the window, 0 <= h <= n - w
    double budget_fraction = 0.2;   // budget == fraction: share of n kept in all (the paper's 20% budget)

    PureKVGrouping grouping = PureKVGrouping::kv_head;
    PureKVLowerLayers lower_layers = PureKVLowerLayers::own_scores;

    // ST-SpAttn: the video mask of the prefill attention from layer st_start_layer on (kind none: off).
    VideoMaskOptions st;               // spatial_temporal by default; the ablations are the other kinds
    std::int64_t st_start_layer = 0;
    // Block sizes of the ST block mask (SIMD path; results do not depend on them). 64-row query blocks
    // halve the previous-frame diagonal's waste against 128 (docs/performance.md, PureKV sweep).
    std::int64_t q_block = 64, k_block = 128;

    float scale = 0.0f;        // softmax scale; 0 = 1/sqrt(d)
    bool check_finite = true;  // fast paths: reject NaN/Inf inputs (the reference always does)

    AttentionOptions attention() const { return {scale, check_finite}; }
};

// Eq. 2 for one layer: the window's attention mass on every earlier key, per group.
struct PureKVScores {
    std::int64_t layer = -1;            // the layer whose attention produced the scores
    std::int64_t n = 0, window = 0;     // tokens, window w
    std::int64_t heads_per_group = 0;   // query heads summed into each group
    std::vector<std::vector<double>> s; // [G][n] s_j for j < n - w; 0 for the window's positions

    std::int64_t groups() const { return static_cast<std::int64_t>(s.size()); }
};

// What PureKV keeps in one layer.
struct PureKVSelection {
    std::int64_t n = 0;
    std::int64_t layer = 0;
    std::int64_t source_layer = -1;  // layer whose scores were used (the layer itself up to l0, l0 above); -1: dense
    bool dense = false;              // a lower layer with lower_layers == dense: everything kept
    std::int64_t window = 0, top_h = 0;
    std::vector<std::vector<double>> v_norm;      // [G][n] ||V_{j,g}|| (kv_head) or mean_g ||V_{j,g}|| (layer)
    std::vector<std::vector<double>> importance;  // [G][n] I_j = s_j * v_norm_j (0 in the window)
    TokenSelection selection;                     // [G] window + top-h; scores = importance

    std::int64_t groups() const { return static_cast<std::int64_t>(selection.indices.size()); }
    double kept_ratio() const { return selection.kept_ratio(); }
};

// The paper's validation (Eq. 5-7) for one layer: Spearman between the cross-layer estimate
// s^{l0} ||V^l|| and the layer's own s^l ||V^l|| over the non-window positions [0, n - w).
struct PureKVLayerValidation {
    std::int64_t layer = 0, source_layer = 0;
    std::vector<SpearmanResult> groups;  // [G]

    double mean_rho() const {
        double s = 0.0;
        for (const auto& g : groups) s += g.rho;
        return groups.empty() ? 0.0 : s / static_cast<double>(groups.size());
    }
};

namespace detail {

inline void check_purekv_params(const PureKVParams& P, const char* fn) {
    require(P.l0 >= 0, fn, "l0 = ", P.l0, ", expected >= 0");
    require(P.window >= 1, fn, "window = ", P.window, ", expected >= 1 (the window's queries produce the scores)");
    if (P.budget == PureKVBudget::count) {
        require(P.top_h >= 0, fn, "top_h = ", P.top_h, ", expected >= 0");
    } else {
        require(std::isfinite(P.budget_fraction) && P.budget_fraction > 0.0 && P.budget_fraction <= 1.0, fn,
                "budget_fraction = ", P.budget_fraction, ", expected 0 < budget_fraction <= 1");
    }
    require(static_cast<std::uint8_t>(P.grouping) <= 1, fn, "grouping has value ", static_cast<int>(P.grouping),
            ", expected kv_head or layer");
    require(static_cast<std::uint8_t>(P.lower_layers) <= 1, fn, "lower_layers has value ",
            static_cast<int>(P.lower_layers), ", expected own_scores or dense");
    check_video_mask_options(P.st, fn);
    require(P.st_start_layer >= 0, fn, "st_start_layer = ", P.st_start_layer, ", expected >= 0");
    require(P.q_block >= 1 && P.k_block >= 1, fn, "block sizes q_block = ", P.q_block, ", k_block = ", P.k_block,
            ", expected >= 1");
    require(std::isfinite(P.scale) && P.scale >= 0.0f, fn, "scale = ", P.scale,
            ", expected a finite scale >= 0 (0 = 1/sqrt(d))");
}

// Throws unless the window fits in n tokens.
inline void check_purekv_window(std::int64_t n, const PureKVParams& P, const char* fn) {
    require(n > 0, fn, "n = ", n, ", expected n > 0 (empty input)");
    require(P.window <= n, fn, "window = ", P.window, " is larger than the sequence (n = ", n,
            "), expected 1 <= window <= n");
}

}  // namespace detail

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
