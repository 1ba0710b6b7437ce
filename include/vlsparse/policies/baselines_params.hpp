// vlsparse/policies/baselines_params.hpp -- the baselines' parameters, budgets, enums and checks,
// shared by the reference, the SIMD path and CUDA. Their backend-independent selection steps (selection
// from scores, pooling-free choices) are policies/baselines_select.hpp.
//
//   H2O          a_j = sum_{i >= j} sum_{h in group} A[h,i,j]         keep last r + top-h of a among the rest
//                during decode: a_j += step attention; when the cache exceeds h + r, evict the same way
//   SnapKV       s_j = sum_{i in last w} sum_{h in group} A[h,i,j],  j < n - w;  s' = pool_k(s)
//                keep the window (last w) + top-(C - w) of s'             (C = capacity, n <= C keeps all)
//   StreamingLLM keep the first `sinks` + the last `recent` positions (also during decode)
//   FastV        s_j = (1/H) sum_h A[h, n-1, j] at layer K-1; keep top floor((1-R) m) of the m image
//                tokens; the rest leave the sequence for layers K, K+1, ...
//   random       keep k of the m scope tokens drawn by SplitMix64(seed + layer) without replacement
//   fixed ratio  keep k of the m scope tokens at offsets floor(i m / k), i = 0..k-1 (uniform stride)
// A[h,i,j] = softmax_{j <= i}(scale q_{i,h} . k_{j,g(h)}). Ties: lower position first (core/topk.hpp).
// H2O: Zhang et al. 2023 (NeurIPS); SnapKV: Li et al. 2024; StreamingLLM: Xiao et al. 2024 (ICLR);
// FastV: Chen et al. 2024 (ECCV). Conventions: docs/baselines.md.
// Include: <vlsparse/policies/baselines.hpp> (SIMD path) or <vlsparse/reference/baselines.hpp> (reference).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <span>
#include <string_view>
#include <vector>

#include "vlsparse/attention/common.hpp"
#include "vlsparse/core/enum_names.hpp"
#include "vlsparse/core/error.hpp"
#include "vlsparse/core/layout.hpp"
#include "vlsparse/core/rng.hpp"
#include "vlsparse/core/selection.hpp"
#include "vlsparse/core/topk.hpp"

namespace vlsparse {

// ---------------------------------------------------------------------------------------------------
// Budgets: a count of tokens, or a fraction of a length (floor(fraction * len), computed in double as
// written, like A-VL's budgets). A budget at or above the length keeps everything.
enum class BudgetKind : std::uint8_t { count, fraction };
inline constexpr EnumName<BudgetKind> kBudgetKindNames[] = {{BudgetKind::count, "count"}, {BudgetKind::fraction, "fraction"}};
constexpr std::span<const EnumName<BudgetKind>> enum_names(BudgetKind) { return kBudgetKindNames; }
constexpr std::string_view to_string(BudgetKind k) { return enum_name(k); }

struct TokenBudget {
    BudgetKind kind = BudgetKind::count;
    std::int64_t count = 0;   // tokens (kind == count), >= 0
    double fraction = 0.0;    // share of the length (kind == fraction), 0 <= fraction <= 1

    static constexpr TokenBudget tokens(std::int64_t c) { return {BudgetKind::count, c, 0.0}; }
    static constexpr TokenBudget ratio(double f) { return {BudgetKind::fraction, 0, f}; }

    void validate(const char* fn, const char* name) const {
        if (kind == BudgetKind::count)
            detail::require(count >= 0, fn, name, " = ", count, " tokens, expected a count >= 0");
        else
            detail::require(std::isfinite(fraction) && fraction >= 0.0 && fraction <= 1.0, fn, name, " = ", fraction,
                            " (fraction), expected 0 <= fraction <= 1");
    }
    // The number of tokens for a length `len` (not clamped to len).
    std::int64_t resolve(std::int64_t len) const {
        if (kind == BudgetKind::count) return count;
        return static_cast<std::int64_t>(std::floor(fraction * static_cast<double>(len)));
    }
    friend bool operator==(const TokenBudget&, const TokenBudget&) = default;
};

// Which query heads share one score vector and one kept set.
enum class BaselineGroups : std::uint8_t {
    kv_head,  // one set per KV head, scores summed over its query heads (GQA-correct; default)
    layer,    // one set per layer, scores summed over every query head
};
inline constexpr EnumName<BaselineGroups> kBaselineGroupsNames[] = {{BaselineGroups::kv_head, "kv_head"},
                                                                    {BaselineGroups::layer, "layer"}};
constexpr std::span<const EnumName<BaselineGroups>> enum_names(BaselineGroups) { return kBaselineGroupsNames; }
constexpr std::string_view to_string(BaselineGroups g) { return enum_name(g); }

// Which tokens random / fixed-ratio selection may drop.
enum class BaselineScope : std::uint8_t {
    visual,  // image and video tokens only; text always stays (default)
    all,     // every token
};
inline constexpr EnumName<BaselineScope> kBaselineScopeNames[] = {{BaselineScope::visual, "visual"}, {BaselineScope::all, "all"}};
constexpr std::span<const EnumName<BaselineScope>> enum_names(BaselineScope) { return kBaselineScopeNames; }
constexpr std::string_view to_string(BaselineScope s) { return enum_name(s); }

// ---------------------------------------------------------------------------------------------------
// H2O (heavy hitters + recent window).
struct H2OParams {
    TokenBudget heavy = TokenBudget::ratio(0.1);   // heavy hitters (paper: 10% + 10% = 20% cache)
    TokenBudget recent = TokenBudget::ratio(0.1);  // most recent positions
    BaselineGroups groups = BaselineGroups::kv_head;
    bool evict_during_decode = true;  // keep the cache within heavy + recent at every decode step
    float scale = 0.0f;               // softmax scale; 0 = 1/sqrt(d)
    bool check_finite = true;         // fast path: reject NaN/Inf inputs (the reference always does)

    AttentionOptions attention() const { return {scale, check_finite}; }
    void validate(const char* fn) const {
        heavy.validate(fn, "heavy");
        recent.validate(fn, "recent");
    }
};

// SnapKV (observation window + pooled window attention).
enum class SnapKVPooling : std::uint8_t {
    avg,   // 1-D average pooling, zero padding counted (F.avg_pool1d, the released default)
    max,   // 1-D max pooling (F.max_pool1d)
    none,  // no pooling (kernel ignored)
};
inline constexpr EnumName<SnapKVPooling> kSnapKVPoolingNames[] = {
    {SnapKVPooling::avg, "avg"}, {SnapKVPooling::max, "max"}, {SnapKVPooling::none, "none"}};
constexpr std::span<const EnumName<SnapKVPooling>> enum_names(SnapKVPooling) { return kSnapKVPoolingNames; }
constexpr std::string_view to_string(SnapKVPooling p) { return enum_name(p); }

struct SnapKVParams {
    std::int64_t window = 32;  // observation window: the last `window` queries, always kept; 1 <= window <= n
    std::int64_t kernel = 5;   // pooling kernel (odd), stride 1, padding kernel / 2
    SnapKVPooling pooling = SnapKVPooling::avg;
    TokenBudget capacity = TokenBudget::tokens(2048);  // tokens kept in all, window included (released:
                                                        // max_capacity_prompt); >= window; >= n keeps all
    BaselineGroups groups = BaselineGroups::kv_head;
    float scale = 0.0f;
    bool check_finite = true;

    AttentionOptions attention() const { return {scale, check_finite}; }
    void validate(const char* fn) const {
        detail::require(window >= 1, fn, "window = ", window, ", expected >= 1");
        detail::require(kernel >= 1 && kernel % 2 == 1, fn, "kernel = ", kernel, ", expected an odd kernel >= 1");
        capacity.validate(fn, "capacity");
    }
};

// StreamingLLM (attention sinks + recent window).
struct StreamingLLMParams {
    std::int64_t sinks = 4;                           // first positions always kept
    TokenBudget recent = TokenBudget::tokens(2000);   // last positions kept (released default 2000)
    bool evict_during_decode = true;                  // roll the window during decode

    void validate(const char* fn) const {
        detail::require(sinks >= 0, fn, "sinks = ", sinks, ", expected >= 0");
        recent.validate(fn, "recent");
    }
};

// FastV (prune image tokens after layer K by the last token's attention).
enum class FastVSpans : std::uint8_t {
    joint,      // one ranking over every visual token (the released code's single image range)
    per_image,  // each image / video segment keeps floor((1 - rate) * len) of its own tokens
};
inline constexpr EnumName<FastVSpans> kFastVSpansNames[] = {{FastVSpans::joint, "joint"}, {FastVSpans::per_image, "per_image"}};
constexpr std::span<const EnumName<FastVSpans>> enum_names(FastVSpans) { return kFastVSpansNames; }
constexpr std::string_view to_string(FastVSpans s) { return enum_name(s); }

struct FastVParams {
    std::int64_t k_layer = 2;  // K: layers 0..K-1 see every token; layer K-1's attention ranks; 1 <= K < layers
    double rate = 0.5;         // R: fraction of visual tokens dropped, 0 <= R < 1
    FastVSpans spans = FastVSpans::joint;
    float scale = 0.0f;
    bool check_finite = true;

    AttentionOptions attention() const { return {scale, check_finite}; }
    void validate(const char* fn) const {
        detail::require(k_layer >= 1, fn, "k_layer = ", k_layer, ", expected K >= 1 (layer K-1's attention ranks)");
        detail::require(std::isfinite(rate) && rate >= 0.0 && rate < 1.0, fn, "rate = ", rate, ", expected 0 <= rate < 1");
    }
    // Throws unless K < layers (some layer runs on the pruned sequence).
    void validate(const char* fn, std::int64_t layers) const {
        validate(fn);
        detail::require(k_layer < layers, fn, "k_layer = ", k_layer, " with ", layers,
                        " layers, expected K < layers (layers K.. run on the pruned sequence)");
    }
};

// Random selection.
struct RandomParams {
    TokenBudget keep = TokenBudget::ratio(0.5);  // of the scope tokens (fraction of their count)
    BaselineScope scope = BaselineScope::visual;
    std::uint64_t seed = 0;                      // layer l draws with SplitMix64(seed + l)

    void validate(const char* fn) const { keep.validate(fn, "keep"); }
};

// Fixed-ratio selection.
enum class FixedRatioMode : std::uint8_t {
    uniform_stride,  // offsets floor(i * m / k), i = 0..k-1: evenly spread, the first token included
    first,           // the first k scope tokens
    last,            // the last k scope tokens
};
inline constexpr EnumName<FixedRatioMode> kFixedRatioModeNames[] = {
    {FixedRatioMode::uniform_stride, "uniform_stride"}, {FixedRatioMode::first, "first"}, {FixedRatioMode::last, "last"}};
constexpr std::span<const EnumName<FixedRatioMode>> enum_names(FixedRatioMode) { return kFixedRatioModeNames; }
constexpr std::string_view to_string(FixedRatioMode m) { return enum_name(m); }

struct FixedRatioParams {
    TokenBudget keep = TokenBudget::ratio(0.5);
    BaselineScope scope = BaselineScope::visual;
    FixedRatioMode mode = FixedRatioMode::uniform_stride;

    void validate(const char* fn) const { keep.validate(fn, "keep"); }
};

}  // namespace vlsparse
