// vlsparse/policies/baselines_select.hpp -- the baselines' backend-independent selection steps on
// given scores: H2O's heavy + recent choice, SnapKV's window + pooled top-k, StreamingLLM's sinks +
// recent window, FastV's visual top-k, random and fixed-ratio selection; shared by the reference, the
// SIMD path and CUDA (no Eigen, no xsimd, no OpenMP; nvcc compiles it). H2O's, SnapKV's and FastV's
// prefill selections are written once over a backend's BaselineOps (h2o_select_over, ...). The Params, budgets and enums
// are in policies/baselines_params.hpp (included here); the formulas are restated there.
// Ties: lower position first (core/topk.hpp). Conventions: docs/baselines.md.
// Include: <vlsparse/policies/baselines.hpp> (SIMD path) or <vlsparse/reference/baselines.hpp> (reference).
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <numeric>
#include <span>
#include <utility>
#include <vector>

#include "vlsparse/attention/common.hpp"
#include "vlsparse/core/error.hpp"
#include "vlsparse/core/layout.hpp"
#include "vlsparse/core/rng.hpp"
#include "vlsparse/core/selection.hpp"
#include "vlsparse/core/topk.hpp"
#include "vlsparse/policies/baselines_params.hpp"

namespace vlsparse {

// ---------------------------------------------------------------------------------------------------
// Selection steps shared by both backends.
namespace detail {

// positions in `cand` (ascending) ranked by score_of: the top k (ties: lower position first), ascending.
template <class F>
std::vector<std::int64_t> top_of(std::span<const std::int64_t> cand, std::int64_t k, F&& score_of) {
    k = std::clamp<std::int64_t>(k, 0, static_cast<std::int64_t>(cand.size()));
    std::vector<double> s(cand.size());
    for (std::size_t i = 0; i < cand.size(); ++i) s[i] = static_cast<double>(score_of(cand[i]));
    std::vector<std::int64_t> out;
    out.reserve(static_cast<std::size_t>(k));
    for (auto i : topk_indices(std::span<const double>(s), k)) out.push_back(cand[static_cast<std::size_t>(i)]);
    return out;
}

inline std::vector<std::int64_t> merge_sorted(std::span<const std::int64_t> a, std::span<const std::int64_t> b) {
    std::vector<std::int64_t> r;
    r.reserve(a.size() + b.size());
    std::set_union(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(r));
    return r;
}

// The scope tokens of a layout (ascending).
inline std::vector<std::int64_t> scope_tokens(const Layout& layout, BaselineScope scope) {
    std::vector<std::int64_t> r;
    std::size_t count = 0;
    for (const auto& s : layout.segments())
        if (scope == BaselineScope::all || s.is_visual()) count += static_cast<std::size_t>(s.length);
    r.reserve(count);
    for (const auto& s : layout.segments())
        if (scope == BaselineScope::all || s.is_visual())
            for (std::int64_t p = s.start; p < s.end(); ++p) r.push_back(p);
    return r;
}

// Keeps `chosen` of the scope tokens plus every token outside the scope: one shared list.
inline TokenSelection keep_outside_scope(const Layout& layout, BaselineScope scope, std::vector<std::int64_t> chosen) {
    TokenSelection r;
    r.n = layout.n();
    std::vector<std::int64_t> other;
    if (scope == BaselineScope::visual)
        for (const auto& s : layout.segments())
            if (!s.is_visual())
                for (std::int64_t p = s.start; p < s.end(); ++p) other.push_back(p);
    r.indices.push_back(merge_sorted(chosen, other));
    return r;
}

}  // namespace detail

// H2O's kept set among `cached` (ascending positions): the last `recent` of them plus the `heavy`
// others with the largest score_of(position) (ties: lower position first). Everything when
// |cached| <= heavy + recent. Ascending.
template <class F>
std::vector<std::int64_t> h2o_keep(std::span<const std::int64_t> cached, std::int64_t heavy, std::int64_t recent,
                                   F&& score_of) {
    const auto m = static_cast<std::int64_t>(cached.size());
    if (heavy + recent >= m) return {cached.begin(), cached.end()};
    const auto older = cached.first(static_cast<std::size_t>(m - recent));
    auto keep = detail::top_of(older, heavy, score_of);
    keep.insert(keep.end(), cached.end() - recent, cached.end());
    return keep;
}

// H2O's prefill selection from accumulated scores acc[g][j] (one vector of n per group).
inline TokenSelection h2o_select_from_scores(std::vector<std::vector<double>> acc, const H2OParams& P) {
    constexpr const char* fn = "h2o_select_from_scores";
    P.validate(fn);
    detail::require(!acc.empty(), fn, "no score groups, expected at least one");
    const auto n = static_cast<std::int64_t>(acc[0].size());
    detail::require(n > 0, fn, "scores are empty, expected n > 0");
    std::vector<std::int64_t> all(static_cast<std::size_t>(n));
    std::iota(all.begin(), all.end(), std::int64_t{0});
    const std::int64_t heavy = P.heavy.resolve(n), recent = std::min(P.recent.resolve(n), n);
    TokenSelection r;
    r.n = n;
    for (std::size_t g = 0; g < acc.size(); ++g) {
        detail::require(static_cast<std::int64_t>(acc[g].size()) == n, fn, "score group ", g, " has ", acc[g].size(),
                        " entries, expected ", n);
        detail::check_scores_finite(std::span<const double>(acc[g]), fn);
        const auto& a = acc[g];
        r.indices.push_back(h2o_keep(all, heavy, recent, [&](std::int64_t p) { return a[static_cast<std::size_t>(p)]; }));
    }
    r.scores = std::move(acc);
    return r;
}

// SnapKV's selection from pooled prefix scores pooled[g][j], j < n - window (one vector per group):
// the window plus the top capacity - window prefix positions; everything when n <= capacity.
// `scores` of the result: the pooled scores, 0 on the window.
inline TokenSelection snapkv_select_from_pooled(std::vector<std::vector<double>> pooled, std::int64_t n,
                                                const SnapKVParams& P) {
    constexpr const char* fn = "snapkv_select_from_pooled";
    P.validate(fn);
    detail::require(P.window <= n, fn, "window = ", P.window, " is larger than the prompt (n = ", n,
                    "), expected 1 <= window <= n");
    const std::int64_t C = P.capacity.resolve(n), L = n - P.window;
    detail::require(C >= P.window, fn, "capacity = ", C, " tokens is below window = ", P.window,
                    ", expected capacity >= window (the window is always kept)");
    std::vector<std::int64_t> prefix(static_cast<std::size_t>(L));
    std::iota(prefix.begin(), prefix.end(), std::int64_t{0});
    TokenSelection r;
    r.n = n;
    for (std::size_t g = 0; g < pooled.size(); ++g) {
        auto& s = pooled[g];
        detail::require(static_cast<std::int64_t>(s.size()) == L, fn, "pooled group ", g, " has ", s.size(),
                        " entries, expected n - window = ", L);
        detail::check_scores_finite(std::span<const double>(s), fn);
        std::vector<std::int64_t> keep;
        if (C >= n) {
            keep = prefix;
        } else {
            keep = detail::top_of(prefix, C - P.window, [&](std::int64_t p) { return s[static_cast<std::size_t>(p)]; });
        }
        for (std::int64_t p = L; p < n; ++p) keep.push_back(p);
        r.indices.push_back(std::move(keep));
        s.resize(static_cast<std::size_t>(n), 0.0);
    }
    r.scores = std::move(pooled);
    return r;
}

// StreamingLLM among `cached` (ascending positions): the first `sinks` and the last `recent`.
inline std::vector<std::int64_t> streamingllm_keep(std::span<const std::int64_t> cached, std::int64_t sinks,
                                                   std::int64_t recent) {
    const auto m = static_cast<std::int64_t>(cached.size());
    if (sinks + recent >= m) return {cached.begin(), cached.end()};
    std::vector<std::int64_t> keep(cached.begin(), cached.begin() + sinks);
    keep.insert(keep.end(), cached.end() - recent, cached.end());
    return keep;
}

// StreamingLLM's prefill selection for n tokens (shared list).
inline TokenSelection streamingllm_select(std::int64_t n, const StreamingLLMParams& P) {
    constexpr const char* fn = "streamingllm_select";
    P.validate(fn);
    detail::require(n > 0, fn, "n = ", n, ", expected n > 0");
    std::vector<std::int64_t> all(static_cast<std::size_t>(n));
    std::iota(all.begin(), all.end(), std::int64_t{0});
    TokenSelection r;
    r.n = n;
    r.indices.push_back(streamingllm_keep(all, P.sinks, std::min(P.recent.resolve(n), n)));
    return r;
}

// FastV's kept sequence from the scores of every token (length layout.n()): every non-visual token
// plus the top floor((1 - rate) * m) visual tokens (jointly, or per image). Shared list; scores kept.
inline TokenSelection fastv_select_from_scores(std::vector<double> scores, const Layout& layout, const FastVParams& P) {
    constexpr const char* fn = "fastv_select_from_scores";
    P.validate(fn);
    const std::int64_t n = layout.n();
    detail::require(static_cast<std::int64_t>(scores.size()) == n, fn, "scores has ", scores.size(),
                    " entries, expected the layout's n = ", n);
    detail::check_scores_finite(std::span<const double>(scores), fn);
    auto score_of = [&](std::int64_t p) { return scores[static_cast<std::size_t>(p)]; };
    std::vector<std::int64_t> chosen;
    if (P.spans == FastVSpans::joint) {
        const auto vis = detail::scope_tokens(layout, BaselineScope::visual);
        const auto m = static_cast<std::int64_t>(vis.size());
        chosen = detail::top_of(vis, TokenBudget::ratio(1.0 - P.rate).resolve(m), score_of);
    } else {
        for (const auto& s : layout.segments()) {
            if (!s.is_visual()) continue;
            std::vector<std::int64_t> span(static_cast<std::size_t>(s.length));
            std::iota(span.begin(), span.end(), s.start);
            auto k = detail::top_of(span, TokenBudget::ratio(1.0 - P.rate).resolve(s.length), score_of);
            chosen.insert(chosen.end(), k.begin(), k.end());
        }
    }
    TokenSelection r = detail::keep_outside_scope(layout, BaselineScope::visual, std::move(chosen));
    r.scores.push_back(std::move(scores));
    return r;
}

// Random selection for layer `layer`: k = min(keep.resolve(m), m) of the m scope tokens, drawn by
// sample_without_replacement(m, k, seed + layer); tokens outside the scope stay. Shared list.
inline TokenSelection random_select(const Layout& layout, std::int64_t layer, const RandomParams& P) {
    constexpr const char* fn = "random_select";
    P.validate(fn);
    detail::require(layout.n() > 0, fn, "empty layout, expected n > 0");
    detail::require(layer >= 0, fn, "layer = ", layer, ", expected >= 0");
    const auto cand = detail::scope_tokens(layout, P.scope);
    const auto m = static_cast<std::int64_t>(cand.size());
    const std::int64_t k = std::min(P.keep.resolve(m), m);
    std::vector<std::int64_t> chosen;
    chosen.reserve(static_cast<std::size_t>(k));
    for (auto i : sample_without_replacement(m, k, P.seed + static_cast<std::uint64_t>(layer)))
        chosen.push_back(cand[static_cast<std::size_t>(i)]);
    return detail::keep_outside_scope(layout, P.scope, std::move(chosen));
}

// Fixed-ratio selection: k = min(keep.resolve(m), m) of the m scope tokens at offsets floor(i * m / k)
// (uniform stride), or the first / last k. Tokens outside the scope stay. Shared list.
inline TokenSelection fixed_ratio_select(const Layout& layout, const FixedRatioParams& P) {
    constexpr const char* fn = "fixed_ratio_select";
    P.validate(fn);
    detail::require(layout.n() > 0, fn, "empty layout, expected n > 0");
    const auto cand = detail::scope_tokens(layout, P.scope);
    const auto m = static_cast<std::int64_t>(cand.size());
    const std::int64_t k = std::min(P.keep.resolve(m), m);
    std::vector<std::int64_t> chosen;
    for (std::int64_t i = 0; i < k; ++i) {
        const std::int64_t off = P.mode == FixedRatioMode::uniform_stride ? i * m / k
                                 : P.mode == FixedRatioMode::first        ? i
                                                                          : m - k + i;
        chosen.push_back(cand[static_cast<std::size_t>(off)]);
    }
    return detail::keep_outside_scope(layout, P.scope, std::move(chosen));
}


// ---------------------------------------------------------------------------------------------------
// The prefill selections of H2O, SnapKV and FastV, written once over a backend's ops type
// (reference::BaselineOps, simd::BaselineOps: h2o_scores, snapkv_window_scores, snapkv_pool,
// fastv_scores): the checks, the scores by the backend, the selection by the steps above.
// reference::h2o_select and simd::h2o_select (and the others) call them; `fn` names the caller.

template <class Ops, class TQ, class TK>
TokenSelection h2o_select_over(View3<const TQ> q, View3<const TK> k, const H2OParams& P, const char* fn) {
    P.validate(fn);
    return h2o_select_from_scores(Ops::h2o_scores(q, k, P.groups, P.attention()), P);
}

template <class Ops, class TQ, class TK>
TokenSelection snapkv_select_over(View3<const TQ> q, View3<const TK> k, const SnapKVParams& P, const char* fn) {
    P.validate(fn);
    detail::check_prefill_qk(q, k, fn);
    const std::int64_t n = q.shape[0];
    detail::require(P.window <= n, fn, "window = ", P.window, " is larger than the prompt (n = ", n,
                    "), expected 1 <= window <= n");
    std::vector<std::vector<double>> pooled;
    for (const auto& s : Ops::snapkv_window_scores(q, k, P.window, P.groups, P.attention()))
        pooled.push_back(Ops::snapkv_pool(s, P.kernel, P.pooling));
    return snapkv_select_from_pooled(std::move(pooled), n, P);
}

template <class Ops, class TQ, class TK>
TokenSelection fastv_select_over(View3<const TQ> q, View3<const TK> k, const Layout& layout, const FastVParams& P,
                                 const char* fn) {
    P.validate(fn);
    detail::check_prefill_qk(q, k, fn);
    layout.require_tokens(q.shape[0], fn);
    return fastv_select_from_scores(Ops::fastv_scores(q, k, P.attention()), layout, P);
}

}  // namespace vlsparse
