// vlsparse/policies/zipvl_params.hpp -- ZipVL's parameters, enums, result type and argument checks,
// shared by the reference, SIMD and CUDA paths. The probe choice, the kept count and eviction:
// policies/zipvl_select.hpp.
//
// ZipVL (He et al., arXiv:2410.08584, Sections 4.1-4.2 and Supplementary A; docs/zipvl.md):
//   probes P (recent + random), A'[h,p,j] = softmax_{j <= p}(scale q_p . k_j)
//   a_j  = sum_{h in group} sum_{p in P} A'[h,p,j]                         accumulated score
//   p    = min { p : sum of the p largest a_j >= tau * M },  M = |group| * |P|   (Eq. 7)
//   a~_j = a_j / nnz_j                                                    normalized score (Eq. 8)
//   T    = topk(a~, p)  (+ optional forced keeps)                         important set (Eq. 9)
// Include: <vlsparse/policies/zipvl.hpp> (SIMD path) or <vlsparse/reference/zipvl.hpp> (reference).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "vlsparse/attention/common.hpp"
#include "vlsparse/core/enum_names.hpp"
#include "vlsparse/core/error.hpp"
#include "vlsparse/core/layout.hpp"
#include "vlsparse/core/rng.hpp"
#include "vlsparse/core/selection.hpp"
#include "vlsparse/kv/kv_cache.hpp"

namespace vlsparse {

// How query heads are grouped into one score vector, one ratio p and one kept set.
enum class ZipVLGrouping : std::uint8_t {
    layer,    // one set per layer, scores summed over all query heads (paper default)
    kv_head,  // one set per KV head, scores summed over the query heads of its GQA group
};

// Denominator of the normalized score a~_j = a_j / nnz_j.
enum class ZipVLNnz : std::uint8_t {
    causal_column,  // nnz_j = n - j: the column's non-zeros in the full causal matrix (Eq. 8, authors' code)
    probe_rows,     // nnz_j = |group| * #{p in P : p >= j}: the non-zeros the probes actually contribute
};

// How the probe counts are given.
enum class ZipVLProbes : std::uint8_t {
    counts,  // probe_recent and probe_random tokens (paper: 64 + 64)
    ratios,  // ceil(probe_recent_ratio * n) + ceil(probe_random_ratio * n) (ZipCache-style 5% + 5%)
};

// Ablations and matched-cost modes. The defaults are the paper's method.
// Prefill of a selective layer: token-sparse over the kept set (the paper), or dense, with the
// selection used for KV eviction only (same prefill cost as the eviction-only baselines).
enum class ZipVLPrefill : std::uint8_t {
    sparse,  // token-sparse prefill over T (Algorithm 1)
    dense,   // eviction-only: dense causal prefill, T decides only what the KV cache keeps
};

// How many tokens each group keeps: the adaptive p of Eq. 7, or a fixed share of the layer's tokens
// (the paper's Table 3 "fixed ratio" ablation: the same scores, the same share in every layer).
enum class ZipVLRatio : std::uint8_t {
    adaptive,  // p from tau (Eq. 7)
    fixed,     // p = zipvl_fixed_count(n, fixed_ratio), the same share in every selective layer
};

// Which score is ranked for the top-p (Eq. 9): the normalized a~_j (paper) or the accumulated a_j
// (the paper's "accumulated attention scores" ablation, H2O-style).
enum class ZipVLRanking : std::uint8_t {
    normalized,   // topk(a~, p)
    accumulated,  // topk(a, p)
};

// The names of every enum above (JSON, scenarios, messages): one table each.
inline constexpr EnumName<ZipVLPrefill> kZipVLPrefillNames[] = {{ZipVLPrefill::sparse, "sparse"},
                                                                {ZipVLPrefill::dense, "dense"}};
inline constexpr EnumName<ZipVLRatio> kZipVLRatioNames[] = {{ZipVLRatio::adaptive, "adaptive"}, {ZipVLRatio::fixed, "fixed"}};
inline constexpr EnumName<ZipVLRanking> kZipVLRankingNames[] = {{ZipVLRanking::normalized, "normalized"},
                                                                {ZipVLRanking::accumulated, "accumulated"}};
inline constexpr EnumName<ZipVLGrouping> kZipVLGroupingNames[] = {{ZipVLGrouping::layer, "layer"},
                                                                  {ZipVLGrouping::kv_head, "kv_head"}};
inline constexpr EnumName<ZipVLNnz> kZipVLNnzNames[] = {{ZipVLNnz::causal_column, "causal_column"},
                                                        {ZipVLNnz::probe_rows, "probe_rows"}};
inline constexpr EnumName<ZipVLProbes> kZipVLProbesNames[] = {{ZipVLProbes::counts, "counts"}, {ZipVLProbes::ratios, "ratios"}};

constexpr std::span<const EnumName<ZipVLPrefill>> enum_names(ZipVLPrefill) { return kZipVLPrefillNames; }
constexpr std::span<const EnumName<ZipVLRatio>> enum_names(ZipVLRatio) { return kZipVLRatioNames; }
constexpr std::span<const EnumName<ZipVLRanking>> enum_names(ZipVLRanking) { return kZipVLRankingNames; }
constexpr std::span<const EnumName<ZipVLGrouping>> enum_names(ZipVLGrouping) { return kZipVLGroupingNames; }
constexpr std::span<const EnumName<ZipVLNnz>> enum_names(ZipVLNnz) { return kZipVLNnzNames; }
constexpr std::span<const EnumName<ZipVLProbes>> enum_names(ZipVLProbes) { return kZipVLProbesNames; }

constexpr std::string_view to_string(ZipVLPrefill m) { return enum_name(m); }
constexpr std::string_view to_string(ZipVLRatio m) { return enum_name(m); }
constexpr std::string_view to_string(ZipVLRanking m) { return enum_name(m); }
constexpr std::string_view to_string(ZipVLGrouping g) { return enum_name(g); }
constexpr std::string_view to_string(ZipVLNnz m) { return enum_name(m); }
constexpr std::string_view to_string(ZipVLProbes m) { return enum_name(m); }

struct ZipVLParams {
    double tau = 0.975;  // attention mass to retain, 0 < tau <= 1

    ZipVLProbes probe_mode = ZipVLProbes::counts;
    std::int64_t probe_recent = 64;   // the last positions (always including n-1)
    std::int64_t probe_random = 64;   // drawn without replacement from [0, n - recent)
    double probe_recent_ratio = 0.05; // used when probe_mode == ratios
    double probe_random_ratio = 0.05;
    std::uint64_t seed = 0;           // probes of layer l use SplitMix64(seed + l)

    ZipVLGrouping grouping = ZipVLGrouping::layer;
    ZipVLNnz nnz = ZipVLNnz::causal_column;

    // Options, all off by default as in the paper.
    std::int64_t keep_last = 0;   // always keep the last r tokens
    bool keep_text = false;       // never evict text tokens (needs the prompt layout)
    std::int64_t dense_layers = 0;  // layers 0 .. dense_layers-1 stay dense (no selection, no eviction)
    UnselectedRows unselected = UnselectedRows::zero;  // prefill output of rows outside T

    float scale = 0.0f;        // softmax scale; 0 = 1/sqrt(d)
    bool check_finite = true;  // fast paths: reject NaN/Inf inputs (the reference always does)

    // Ablations / matched-cost modes (defaults: the paper's method; see the enums above).
    ZipVLPrefill prefill = ZipVLPrefill::sparse;
    ZipVLRatio ratio = ZipVLRatio::adaptive;
    double fixed_ratio = 0.5;  // share of the layer's tokens each group keeps when ratio == fixed, in (0, 1]
    ZipVLRanking ranking = ZipVLRanking::normalized;

    AttentionOptions attention() const { return {scale, check_finite}; }
};

// Everything ZipVL decides for one layer. G = 1 (layer-wise) or H_kv (per KV head) groups.
struct ZipVLSelection {
    std::int64_t n = 0;
    bool dense = false;                             // layer < dense_layers: everything kept, nothing computed
    std::vector<std::int64_t> probes;               // probe positions, ascending
    std::int64_t heads_per_group = 0;               // query heads summed into each group's scores
    std::vector<std::vector<double>> accumulated;   // [G][n] a_j
    std::vector<std::vector<double>> normalized;    // [G][n] a~_j
    std::vector<std::int64_t> p;                    // [G] adaptive count from tau
    TokenSelection selection;                       // [G] kept lists: topk(a~, p) plus forced keeps

    std::int64_t groups() const { return static_cast<std::int64_t>(p.size()); }
    double kept_ratio() const { return selection.kept_ratio(); }
};

namespace detail {

inline void check_zipvl_params(const ZipVLParams& P, const char* fn) {
    require(P.tau > 0.0 && P.tau <= 1.0, fn, "tau = ", P.tau, ", expected 0 < tau <= 1");
    if (P.probe_mode == ZipVLProbes::counts) {
        require(P.probe_recent >= 0 && P.probe_random >= 0, fn, "probe counts (recent ", P.probe_recent, ", random ",
                P.probe_random, ") must be >= 0");
        require(P.probe_recent + P.probe_random > 0, fn, "probe_recent + probe_random = 0, expected at least one probe");
    } else {
        require(P.probe_recent_ratio >= 0.0 && P.probe_recent_ratio <= 1.0 && P.probe_random_ratio >= 0.0 &&
                    P.probe_random_ratio <= 1.0,
                fn, "probe ratios (recent ", P.probe_recent_ratio, ", random ", P.probe_random_ratio,
                ") must be in [0, 1]");
        require(P.probe_recent_ratio + P.probe_random_ratio > 0.0, fn,
                "probe_recent_ratio + probe_random_ratio = 0, expected at least one probe");
    }
    require(P.keep_last >= 0, fn, "keep_last = ", P.keep_last, ", expected >= 0");
    require(P.dense_layers >= 0, fn, "dense_layers = ", P.dense_layers, ", expected >= 0");
}

// The ablation fields (checked by zipvl_select, the JSON reader and ZipVLPolicy::begin).
inline void check_zipvl_modes(const ZipVLParams& P, const char* fn) {
    require(P.prefill == ZipVLPrefill::sparse || P.prefill == ZipVLPrefill::dense, fn, "prefill: unknown mode");
    require(P.ratio == ZipVLRatio::adaptive || P.ratio == ZipVLRatio::fixed, fn, "ratio: unknown mode");
    require(P.ranking == ZipVLRanking::normalized || P.ranking == ZipVLRanking::accumulated, fn,
            "ranking: unknown mode");
    require(P.fixed_ratio > 0.0 && P.fixed_ratio <= 1.0, fn, "fixed_ratio = ", P.fixed_ratio,
            ", expected 0 < fixed_ratio <= 1");
}

}  // namespace detail

}  // namespace vlsparse
