// vlsparse/policies/avl_params.hpp -- A-VL parameters and the backend-independent steps (image spans,
// budgets, kept/core selection, the prefill filter, H2O for text, PPCI), shared by the reference and
// the SIMD path; the decode schedule (DecodeSchedule) is policies/avl_schedule.hpp. Only the scores (attention probabilities) are backend arithmetic.
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

// floor((1 - rate) * len), computed in double exactly as written (so (1 - 0.9) * 10 gives 0, as in the
// released Python code).
inline std::int64_t avl_budget(std::int64_t len, double rate) {
    return static_cast<std::int64_t>(std::floor((1.0 - rate) * static_cast<double>(len)));
}

// The image spans of a layout: every image/video segment, or one span first..last visual token.
inline std::vector<AvlSpan> avl_spans(const Layout& layout, AvlSpans mode) {
    std::vector<AvlSpan> out;
    for (const auto& s : layout.segments())
        if (s.is_visual()) out.push_back({s.start, s.length});
    if (mode == AvlSpans::single_span && out.size() > 1) out = {{out.front().start, out.back().end() - out.front().start}};
    return out;
}

// PPCI_p(s1, s2) = |Top_k(s1) ∩ Top_k(s2)| / k with k = ceil(p * N) (ties: lower position first).
template <class S>
double ppci(std::span<const S> s1, std::span<const S> s2, double p) {
    constexpr const char* fn = "ppci";
    detail::require(s1.size() == s2.size(), fn, "score vectors have lengths ", s1.size(), " and ", s2.size(),
                    ", expected equal");
    detail::require(!s1.empty(), fn, "score vectors are empty, expected N >= 1");
    detail::require(std::isfinite(p) && p > 0.0 && p <= 1.0, fn, "p = ", p, ", expected 0 < p <= 1");
    const auto k = static_cast<std::int64_t>(std::ceil(p * static_cast<double>(s1.size())));
    const auto a = topk_indices(s1, k), b = topk_indices(s2, k);
    std::vector<std::int64_t> both;
    std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(both));
    return static_cast<double>(both.size()) / static_cast<double>(k);
}
template <class S>
double ppci(const std::vector<S>& s1, const std::vector<S>& s2, double p) {
    return ppci(std::span<const S>(s1), std::span<const S>(s2), p);
}

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

namespace detail {

// Top `k` of the present positions inside [a, b), by score (ties: lower position first), ascending.
inline std::vector<std::int64_t> avl_top_in(std::span<const double> score, std::span<const std::int64_t> present,
                                            std::int64_t a, std::int64_t b, std::int64_t k) {
    const auto lo = std::lower_bound(present.begin(), present.end(), a);
    const auto hi = std::lower_bound(present.begin(), present.end(), b);
    std::vector<std::int64_t> cand(lo, hi);
    k = std::min<std::int64_t>(k, static_cast<std::int64_t>(cand.size()));
    std::vector<double> s(cand.size());
    for (std::size_t i = 0; i < cand.size(); ++i) s[i] = score[static_cast<std::size_t>(cand[i])];
    std::vector<std::int64_t> out;
    for (auto i : topk_indices(std::span<const double>(s), k)) out.push_back(cand[static_cast<std::size_t>(i)]);
    return out;
}

inline bool in_spans(const std::vector<AvlSpan>& spans, std::int64_t p) {
    for (const auto& s : spans)
        if (p >= s.start && p < s.end()) return true;
    return false;
}

inline std::vector<std::int64_t> check_present(std::span<const std::int64_t> present, std::int64_t n, const char* fn) {
    std::vector<std::int64_t> pr(present.begin(), present.end());
    if (pr.empty()) {
        pr.resize(static_cast<std::size_t>(n));
        std::iota(pr.begin(), pr.end(), std::int64_t{0});
    }
    for (std::size_t i = 0; i < pr.size(); ++i) {
        require(pr[i] >= 0 && pr[i] < n, fn, "present position ", pr[i], ", expected a position in [0, ", n, ")");
        require(i == 0 || pr[i] > pr[i - 1], fn, "present positions are not sorted ascending without duplicates at entry ", i);
    }
    return pr;
}

}  // namespace detail

// Kept and core sets of one layer from its scores (length = layout.n(), the score of every position;
// entries of absent positions are ignored). `present` lists the positions still in the sequence
// (after a prefill filter at an earlier layer); empty means every position. `text` optionally gives
// the text tokens each KV head keeps (from avl_text_h2o); empty keeps every non-image token.
inline AvlSelection avl_select(std::span<const double> scores, const Layout& layout, const AvlParams& P,
                               std::span<const std::int64_t> present = {},
                               const std::vector<std::vector<std::int64_t>>& text = {}) {
    constexpr const char* fn = "avl_select";
    P.validate(fn);
    const std::int64_t n = layout.n();
    detail::require(n > 0, fn, "the layout is empty, expected n > 0");
    detail::require(static_cast<std::int64_t>(scores.size()) == n, fn, "scores has length ", scores.size(),
                    ", expected the layout's n = ", n);
    const auto pr = detail::check_present(present, n, fn);
    for (auto p : pr)
        detail::require(std::isfinite(scores[static_cast<std::size_t>(p)]), fn, "score[", p, "] = ",
                        scores[static_cast<std::size_t>(p)], ", expected finite scores");
    AvlSelection r;
    r.n = n;
    r.spans = avl_spans(layout, P.spans);
    r.scores.assign(static_cast<std::size_t>(n), 0.0);
    for (auto p : pr) r.scores[static_cast<std::size_t>(p)] = scores[static_cast<std::size_t>(p)];
    std::vector<std::int64_t> image_kept;
    for (const auto& s : r.spans) {
        const std::int64_t kb = avl_budget(s.length, P.rate);
        auto kept = detail::avl_top_in(r.scores, pr, s.start, s.end(), kb);
        const auto cb = std::min<std::int64_t>(avl_budget(s.length, P.compute_rate), static_cast<std::int64_t>(kept.size()));
        auto core = detail::avl_top_in(r.scores, kept, s.start, s.end(), cb);
        r.core.insert(r.core.end(), core.begin(), core.end());
        r.core_budget.push_back(cb);
        image_kept.insert(image_kept.end(), kept.begin(), kept.end());
        r.kept_image.push_back(std::move(kept));
    }
    // Non-image tokens: every present one, or the given text sets (one list per KV head, or shared).
    std::vector<std::int64_t> non_image;
    for (auto p : pr)
        if (!detail::in_spans(r.spans, p)) non_image.push_back(p);
    r.kept.n = n;
    const std::size_t groups = text.empty() ? 1 : text.size();
    for (std::size_t g = 0; g < groups; ++g) {
        std::vector<std::int64_t> l = image_kept;
        if (text.empty()) {
            l.insert(l.end(), non_image.begin(), non_image.end());
        } else {
            for (auto p : text[g]) {
                detail::require(std::binary_search(non_image.begin(), non_image.end(), p), fn, "text list ", g,
                                " holds position ", p, ", which is not a present non-image token");
                l.push_back(p);
            }
        }
        std::sort(l.begin(), l.end());
        detail::require(std::adjacent_find(l.begin(), l.end()) == l.end(), fn, "text list ", g, " has duplicates");
        r.kept.indices.push_back(std::move(l));
    }
    return r;
}
inline AvlSelection avl_select(const std::vector<double>& scores, const Layout& layout, const AvlParams& P,
                               std::span<const std::int64_t> present = {},
                               const std::vector<std::vector<std::int64_t>>& text = {}) {
    return avl_select(std::span<const double>(scores), layout, P, present, text);
}

// The prefill filter (P%) at layer filter_layer: the positions that stay in the sequence for the later
// layers. Each span keeps its top floor((1 - prefill_filter) * len) present image tokens by score;
// non-image tokens always stay. Positions are kept (never renumbered).
inline std::vector<std::int64_t> avl_prefill_filter(std::span<const double> scores, const Layout& layout,
                                                    const AvlParams& P, std::span<const std::int64_t> present = {}) {
    constexpr const char* fn = "avl_prefill_filter";
    P.validate(fn);
    const std::int64_t n = layout.n();
    detail::require(static_cast<std::int64_t>(scores.size()) == n, fn, "scores has length ", scores.size(),
                    ", expected the layout's n = ", n);
    const auto pr = detail::check_present(present, n, fn);
    for (auto p : pr)
        detail::require(std::isfinite(scores[static_cast<std::size_t>(p)]), fn, "score[", p, "] = ",
                        scores[static_cast<std::size_t>(p)], ", expected finite scores");
    const auto spans = avl_spans(layout, P.spans);
    std::vector<std::int64_t> out;
    for (auto p : pr)
        if (!detail::in_spans(spans, p)) out.push_back(p);
    for (const auto& s : spans) {
        auto k = detail::avl_top_in(scores, pr, s.start, s.end(), avl_budget(s.length, P.prefill_filter));
        out.insert(out.end(), k.begin(), k.end());
    }
    std::sort(out.begin(), out.end());
    return out;
}

// H2O for the text tokens (T%): given accumulated attention per group (acc[g][j], j in [0, n); one
// group per KV head, or per query head for AvlTextGroups::per_query_head), each group keeps
// B = max(round((1 - text_rate) * text_seen), text_min_budget) (at most text_seen) text tokens: the
// floor(text_heavy_fraction * B) largest accumulated scores among the non-recent ones plus the most
// recent B - heavy. Returns one list per KV head (per-query-head sets are merged by union over the
// heads of each KV group; `group` = H / H_kv query heads per KV head).
inline std::vector<std::vector<std::int64_t>> avl_text_h2o(const std::vector<std::vector<double>>& acc,
                                                           const Layout& layout, const AvlParams& P,
                                                           std::int64_t group = 1,
                                                           std::span<const std::int64_t> present = {}) {
    constexpr const char* fn = "avl_text_h2o";
    P.validate(fn);
    const std::int64_t n = layout.n();
    detail::require(!acc.empty(), fn, "no score groups given, expected at least one");
    detail::require(group >= 1 && static_cast<std::int64_t>(acc.size()) % group == 0, fn, "group = ", group,
                    " does not divide the ", acc.size(), " score groups");
    const auto pr = detail::check_present(present, n, fn);
    const auto spans = avl_spans(layout, P.spans);
    std::vector<std::int64_t> text;
    for (auto p : pr)
        if (!detail::in_spans(spans, p)) text.push_back(p);
    const auto seen = static_cast<std::int64_t>(text.size());
    const std::int64_t B = std::min(seen, std::max<std::int64_t>(static_cast<std::int64_t>(std::llround((1.0 - P.text_rate) * static_cast<double>(seen))), P.text_min_budget));
    const auto heavy = static_cast<std::int64_t>(std::floor(P.text_heavy_fraction * static_cast<double>(B)));
    const std::int64_t recent = B - heavy;
    const std::vector<std::int64_t> older(text.begin(), text.end() - recent), tail(text.end() - recent, text.end());
    std::vector<std::vector<std::int64_t>> out(acc.size() / static_cast<std::size_t>(group));
    for (std::size_t a = 0; a < acc.size(); ++a) {
        detail::require(static_cast<std::int64_t>(acc[a].size()) == n, fn, "score group ", a, " has length ",
                        acc[a].size(), ", expected n = ", n);
        std::vector<double> s(older.size());
        for (std::size_t i = 0; i < older.size(); ++i) s[i] = acc[a][static_cast<std::size_t>(older[i])];
        auto& dst = out[a / static_cast<std::size_t>(group)];
        for (auto i : topk_indices(std::span<const double>(s), heavy)) dst.push_back(older[static_cast<std::size_t>(i)]);
        dst.insert(dst.end(), tail.begin(), tail.end());
    }
    for (auto& l : out) {
        std::sort(l.begin(), l.end());
        l.erase(std::unique(l.begin(), l.end()), l.end());
    }
    return out;
}

// Scores of the present rows (score_rows[i] for position present[i]) spread over [0, n), 0 elsewhere:
// what avl_select and avl_prefill_filter take after a prefill filter removed rows.
inline std::vector<double> avl_scatter_scores(std::span<const double> score_rows, std::span<const std::int64_t> present,
                                              std::int64_t n) {
    constexpr const char* fn = "avl_scatter_scores";
    detail::require(score_rows.size() == present.size(), fn, "score_rows has ", score_rows.size(),
                    " entries and present has ", present.size(), ", expected equal");
    std::vector<double> out(static_cast<std::size_t>(std::max<std::int64_t>(n, 0)), 0.0);
    for (std::size_t i = 0; i < present.size(); ++i) {
        detail::require(present[i] >= 0 && present[i] < n && (i == 0 || present[i] > present[i - 1]), fn,
                        "present position ", present[i], " at entry ", i, ", expected ascending positions in [0, ", n, ")");
        out[static_cast<std::size_t>(present[i])] = score_rows[i];
    }
    return out;
}

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
