// vlsparse/policies/purekv_params.hpp -- PureKV's parameters, enums, result types and argument checks,
// shared by the reference, SIMD and CUDA paths. The backend-independent steps (budgets, the ST-SpAttn
// mask, the selection's ranking-independent part, the Spearman validation): policies/purekv_select.hpp.
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

}  // namespace vlsparse
