// vlsparse/policies/avl_params.hpp -- A-VL's parameters, enums, result types and checks, shared by
// the reference, the SIMD path and CUDA. The backend-independent selection steps (image spans, budgets,
// kept/core selection, the prefill filter, H2O for text, PPCI) are policies/avl_select.hpp; the decode
// schedule (DecodeSchedule) is policies/avl_schedule.hpp.
//
// A-VL ("Adaptive attention for large vision-language models", arXiv:2409.14846; docs/avl.md):
//   s_j = (1/H) sum_h softmax_j(scale q_{n-1,h} . k_{j,g(h)})          score of key j (last prompt token)
//   per image span of original length len:
//     kept = top floor((1-rate) len) of s in the span   (the rest, "minor", are evicted after prefill)
//     core = top floor((1-compute_rate) len)            (computed at every decode step)
//   decode step t: t % K == 0 -> read every kept row, re-rank core among the kept image tokens;
//                  otherwise  -> read core image rows + every non-image row (an index list).
//   PPCI_p(s1, s2) = |Top_k(s1) ∩ Top_k(s2)| / k,  k = ceil(p N)
// Include: <vlsparse/policies/avl.hpp> (SIMD path) or <vlsparse/reference/avl.hpp> (reference).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "vlsparse/attention/common.hpp"
#include "vlsparse/core/enum_names.hpp"
#include "vlsparse/core/error.hpp"
#include "vlsparse/core/layout.hpp"
#include "vlsparse/core/selection.hpp"
#include "vlsparse/core/topk.hpp"

namespace vlsparse {

// How image tokens are grouped into spans (each span gets its own budgets).
enum class AvlSpans : std::uint8_t {
    per_image,    // each image (or video) segment of the layout is a span (default)
    single_span,  // one span from the first to the last visual token, text in between included
                  // (the released code's behaviour; compatibility option)
};

// How H2O accumulates attention for the text budget (T%).
enum class AvlTextGroups : std::uint8_t {
    per_kv_head,     // scores summed over the query heads of each KV group: one text set per KV head (GQA-correct)
    per_query_head,  // the released code: one text set per query head; a KV head keeps the union of its heads' sets
};

inline constexpr EnumName<AvlSpans> kAvlSpansNames[] = {{AvlSpans::per_image, "per_image"},
                                                        {AvlSpans::single_span, "single_span"}};
inline constexpr EnumName<AvlTextGroups> kAvlTextGroupsNames[] = {{AvlTextGroups::per_kv_head, "per_kv_head"},
                                                                  {AvlTextGroups::per_query_head, "per_query_head"}};
constexpr std::span<const EnumName<AvlSpans>> enum_names(AvlSpans) { return kAvlSpansNames; }
constexpr std::span<const EnumName<AvlTextGroups>> enum_names(AvlTextGroups) { return kAvlTextGroupsNames; }
constexpr std::string_view to_string(AvlSpans s) { return enum_name(s); }
constexpr std::string_view to_string(AvlTextGroups g) { return enum_name(g); }

struct AvlParams {
    double rate = 0.5;               // fraction of each image span evicted after prefill, 0 <= rate < 1
    double compute_rate = 0.7;       // fraction of each span left out of non-refresh steps, rate <= compute_rate < 1
    std::int64_t refresh_every = 3;  // K: steps with step % K == 0 read every kept row and re-rank the core
                                     // set; K <= 0: no core/secondary split (every step reads every kept row)
    AvlSpans spans = AvlSpans::per_image;
    bool async_refresh = false;      // the core set ranked at step t is used from step t + 2 instead of t + 1

    double prefill_filter = 0.0;     // P: fraction of each span dropped from the sequence at filter_layer (0 = off)
    std::int64_t filter_layer = 3;   // the layer whose scores decide the prefill filter

    double text_rate = 0.0;          // T: fraction of text tokens evicted by H2O after prefill (0 = off)
    std::int64_t text_min_budget = 20;       // the text budget is at least this many tokens
    double text_heavy_fraction = 0.7;        // share of the text budget given to heavy hitters (the rest: recent)
    AvlTextGroups text_groups = AvlTextGroups::per_kv_head;

    void validate(const char* fn) const {
        auto rate_ok = [](double r) { return std::isfinite(r) && r >= 0.0 && r < 1.0; };
        detail::require(rate_ok(rate), fn, "rate = ", rate, ", expected 0 <= rate < 1");
        detail::require(rate_ok(compute_rate), fn, "compute_rate = ", compute_rate, ", expected 0 <= compute_rate < 1");
        detail::require(compute_rate >= rate, fn, "compute_rate = ", compute_rate, " is below rate = ", rate,
                        "; expected rate <= compute_rate (the core set is part of the kept set)");
        detail::require(rate_ok(prefill_filter), fn, "prefill_filter = ", prefill_filter,
                        ", expected 0 <= prefill_filter < 1");
        detail::require(filter_layer >= 0, fn, "filter_layer = ", filter_layer, ", expected >= 0");
        detail::require(rate_ok(text_rate), fn, "text_rate = ", text_rate, ", expected 0 <= text_rate < 1");
        detail::require(text_min_budget >= 0, fn, "text_min_budget = ", text_min_budget, ", expected >= 0");
        detail::require(std::isfinite(text_heavy_fraction) && text_heavy_fraction >= 0.0 && text_heavy_fraction <= 1.0,
                        fn, "text_heavy_fraction = ", text_heavy_fraction, ", expected 0 <= fraction <= 1");
    }
};

// One image span [start, start + length) of the original prompt.
struct AvlSpan {
    std::int64_t start = 0, length = 0;
    std::int64_t end() const { return start + length; }
};

// What A-VL keeps of one layer after prefill.
struct AvlSelection {
    std::int64_t n = 0;                // prompt length (positions [0, n))
    std::vector<AvlSpan> spans;        // image spans (original layout)
    std::vector<std::int64_t> core_budget;  // per span: floor((1 - compute_rate) * len), at most its kept count
    std::vector<std::vector<std::int64_t>> kept_image;  // per span: kept image positions (ascending)
    std::vector<std::int64_t> core;    // core image positions, all spans (ascending)
    TokenSelection kept;               // everything kept (shared, or per KV head when the text budget is on)
    std::vector<double> scores;        // the score of every present position (length n; 0 where absent)
};

// What one A-VL decode step did.
struct AvlStep {
    std::int64_t step = 0;
    bool refresh = false;          // read every kept row and re-ranked the core set
    TokenSelection read;           // the positions read (one list per group of the kept selection)
};

namespace detail {
template <class TQ, class TK>
void check_avl_qk(const View3<const TQ>& q, const View3<const TK>& k, const char* fn) {
    check_qkv(q, k, k, fn);
    require(q.shape[0] <= k.shape[0], fn, "q has ", q.shape[0], " tokens and k has ", k.shape[0],
            ", expected n_q <= n_k");
}
}  // namespace detail

}  // namespace vlsparse
