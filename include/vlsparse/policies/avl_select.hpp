// vlsparse/policies/avl_select.hpp -- A-VL's backend-independent selection steps on given scores:
// image spans and budgets, the kept / core selection, the prefill filter, H2O for the text tokens and
// PPCI; shared by the reference, the SIMD path and CUDA (no Eigen, no xsimd, no OpenMP; nvcc compiles
// it). The Params, enums, result types and checks are in policies/avl_params.hpp (included here).
//   kept = top floor((1-rate) len) of s in each image span, core = top floor((1-compute_rate) len) of kept
//   PPCI_p(s1, s2) = |Top_k(s1) ∩ Top_k(s2)| / k,  k = ceil(p N)
// A-VL: arXiv:2409.14846; docs/avl.md.
// Include: <vlsparse/policies/avl.hpp> (SIMD path) or <vlsparse/reference/avl.hpp> (reference).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <numeric>
#include <span>
#include <utility>
#include <vector>

#include "vlsparse/core/error.hpp"
#include "vlsparse/core/layout.hpp"
#include "vlsparse/core/selection.hpp"
#include "vlsparse/core/topk.hpp"
#include "vlsparse/policies/avl_params.hpp"

namespace vlsparse {

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

// The scores of a layer (length n) and its present positions: returns the present positions (every
// position when `present` is empty) after checking them and that their scores are finite.
inline std::vector<std::int64_t> check_present_scores(std::span<const double> scores, std::int64_t n,
                                                      std::span<const std::int64_t> present, const char* fn) {
    require(static_cast<std::int64_t>(scores.size()) == n, fn, "scores has length ", scores.size(),
            ", expected the layout's n = ", n);
    auto pr = check_present(present, n, fn);
    for (auto p : pr)
        require(std::isfinite(scores[static_cast<std::size_t>(p)]), fn, "score[", p, "] = ",
                scores[static_cast<std::size_t>(p)], ", expected finite scores");
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
    const auto pr = detail::check_present_scores(scores, n, present, fn);
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
    const auto pr = detail::check_present_scores(scores, n, present, fn);
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

// The text budget over `seen` text tokens (T%, used by avl_text_h2o): B = max(round((1 - text_rate)
// seen), text_min_budget), at most seen, of which `heavy` = floor(text_heavy_fraction B) are ranked by
// score among the older ones and the last `recent` = B - heavy are always kept.
struct AvlTextBudget {
    std::int64_t budget = 0, heavy = 0, recent = 0;
};
inline AvlTextBudget avl_text_budget(std::int64_t seen, const AvlParams& P) {
    AvlTextBudget b;
    b.budget = std::min(seen, std::max<std::int64_t>(static_cast<std::int64_t>(std::llround((1.0 - P.text_rate) * static_cast<double>(seen))),
                                                     P.text_min_budget));
    b.heavy = static_cast<std::int64_t>(std::floor(P.text_heavy_fraction * static_cast<double>(b.budget)));
    b.recent = b.budget - b.heavy;
    return b;
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
    const AvlTextBudget tb = avl_text_budget(seen, P);
    const std::int64_t heavy = tb.heavy, recent = tb.recent;
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

}  // namespace vlsparse
