// vlsparse/reference/zipvl.hpp -- the exact scalar reference of ZipVL (arXiv:2410.08584, Sections 4.1-4.2, Supp. A).
//
//   A'[h,p,j] = softmax_{j <= p}(scale * q_{p,h} . k_{j,g(h)})       probe attention (Eq. A)
//   a_j       = sum_{h in group} sum_{p in P} A'[h,p,j]             accumulated score
//   p         = min { p : sum of the p largest a_j >= tau * |group| * |P| }   (Eq. 7)
//   a~_j      = a_j / nnz_j                                          (Eq. 8)
//   T         = topk(a~, p) (larger first, ties by lower position)  (Eq. 9), plus forced keeps
//
// Plain loops, double accumulation, full sorts instead of selection algorithms: an implementation
// independent of the SIMD path's, readable beside the paper. Include: <vlsparse/reference/zipvl.hpp>
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <span>
#include <utility>
#include <vector>

#include "vlsparse/core/layout.hpp"
#include "vlsparse/kv/kv_cache.hpp"
#include "vlsparse/policies/zipvl_select.hpp"
#include "vlsparse/reference/attention.hpp"

namespace vlsparse::reference {

namespace detail {

// Index order by (score descending, position ascending), by a full stable sort.
inline std::vector<std::int64_t> ranked(const std::vector<double>& s) {
    std::vector<std::int64_t> idx(s.size());
    std::iota(idx.begin(), idx.end(), std::int64_t{0});
    std::stable_sort(idx.begin(), idx.end(), [&](std::int64_t a, std::int64_t b) { return s[a] > s[b]; });
    return idx;
}

// Steps after the accumulated scores: p, normalized scores, top-k, forced keeps.
inline void zipvl_finish(ZipVLSelection& r, const Layout& layout, const ZipVLParams& P, const char* fn) {
    const std::int64_t n = r.n, G = static_cast<std::int64_t>(r.accumulated.size());
    const double total = static_cast<double>(r.heads_per_group) * static_cast<double>(r.probes.size());
    r.normalized.assign(static_cast<std::size_t>(G), std::vector<double>(static_cast<std::size_t>(n), 0.0));
    r.p.assign(static_cast<std::size_t>(G), 0);
    r.selection = TokenSelection{};
    r.selection.n = n;
    r.selection.indices.resize(static_cast<std::size_t>(G));
    for (std::int64_t g = 0; g < G; ++g) {
        const auto& a = r.accumulated[static_cast<std::size_t>(g)];
        auto& an = r.normalized[static_cast<std::size_t>(g)];
        for (std::int64_t j = 0; j < n; ++j)
            require(std::isfinite(a[static_cast<std::size_t>(j)]), fn, "accumulated score ", j, " is not finite");
        // Eq. 7 on the accumulated scores.
        const auto by_a = ranked(a);
        double acc = 0.0;
        std::int64_t p = n;
        for (std::int64_t t = 0; t < n; ++t) {
            acc += a[static_cast<std::size_t>(by_a[static_cast<std::size_t>(t)])];
            if (acc >= P.tau * total) {
                p = t + 1;
                break;
            }
        }
        p = zipvl_kept_count(p, n, P);  // the fixed-ratio ablation replaces Eq. 7's count
        r.p[static_cast<std::size_t>(g)] = p;
        // Eq. 8.
        for (std::int64_t j = 0; j < n; ++j) {
            double nnz = 0.0;
            if (P.nnz == ZipVLNnz::causal_column) {
                nnz = static_cast<double>(n - j);
            } else {
                for (auto q : r.probes) nnz += q >= j ? 1.0 : 0.0;
                nnz *= static_cast<double>(r.heads_per_group);
            }
            an[static_cast<std::size_t>(j)] = nnz > 0.0 ? a[static_cast<std::size_t>(j)] / nnz : 0.0;
        }
        // Eq. 9 plus the forced keeps.
        std::vector<std::uint8_t> keep(static_cast<std::size_t>(n), 0);
        const auto by_an = ranked(P.ranking == ZipVLRanking::normalized ? an : a);  // Eq. 9 or the ablation
        for (std::int64_t t = 0; t < p; ++t) keep[static_cast<std::size_t>(by_an[static_cast<std::size_t>(t)])] = 1;
        for (std::int64_t j = std::max<std::int64_t>(0, n - P.keep_last); j < n; ++j) keep[static_cast<std::size_t>(j)] = 1;
        if (P.keep_text)
            for (std::int64_t j = 0; j < n; ++j)
                if (layout.is_text(j)) keep[static_cast<std::size_t>(j)] = 1;
        auto& list = r.selection.indices[static_cast<std::size_t>(g)];
        for (std::int64_t j = 0; j < n; ++j)
            if (keep[static_cast<std::size_t>(j)]) list.push_back(j);
    }
    r.selection.scores = P.ranking == ZipVLRanking::normalized ? r.normalized : r.accumulated;
}

// Eq. 6: r.accumulated[g][j] = sum over the group's heads and the probes of A'[h, p, j] (r from
// zipvl_begin_select), from the probe attention of every head at once, in double.
template <class TQ, class TK>
void zipvl_accumulate(ZipVLSelection& r, View3<const TQ> q, View3<const TK> k, const ZipVLParams& P) {
    const std::int64_t n = q.shape[0], H = q.shape[1];
    const std::int64_t G = H / r.heads_per_group;
    const auto np = static_cast<std::int64_t>(r.probes.size());
    std::vector<double> probs(static_cast<std::size_t>(H * np * n));
    reference::probe_attention(q, k, std::span<const std::int64_t>(r.probes), View3<double>(probs.data(), {H, np, n}),
                               P.attention());
    r.accumulated.assign(static_cast<std::size_t>(G), std::vector<double>(static_cast<std::size_t>(n), 0.0));
    for (std::int64_t h = 0; h < H; ++h) {
        auto& a = r.accumulated[static_cast<std::size_t>(h / r.heads_per_group)];
        for (std::int64_t p = 0; p < np; ++p)
            for (std::int64_t j = 0; j < n; ++j) a[static_cast<std::size_t>(j)] += probs[static_cast<std::size_t>((h * np + p) * n + j)];
    }
}

}  // namespace detail

struct ZipVLOps;

// ZipVL's selection for layer `layer`: probes, scores, p and the kept set. q [n, H, d], k [n, H_kv, d].
// `probes` overrides the probe choice (sorted ascending, unique, in [0, n)); empty = zipvl_probes().
// zipvl_select_over on the reference's arithmetic.
template <ElementType TQ, ElementType TK>
ZipVLSelection zipvl_select(View3<const TQ> q, View3<const TK> k, const Layout& layout, std::int64_t layer,
                            const ZipVLParams& P, std::span<const std::int64_t> probes = {}) {
    return zipvl_select_over<ZipVLOps>(q, k, layout, layer, P, probes, "reference::zipvl_select");
}

// Token-sparse prefill (Algorithm 1; zipvl_prefill_over on this backend's attention). out [n, H, d].
template <ElementType TQ, ElementType TK, OutputElement TO>
void zipvl_prefill(View3<const TQ> q, View3<const TK> k, View3<const TK> v, const ZipVLSelection& s, View3<TO> out,
                   const ZipVLParams& P) {
    zipvl_prefill_over<ZipVLOps>(q, k, v, s, out, P);
}

// ZipVL's operations on the reference backend: the concept of golden::run_zipvl_case, for code written
// once over a backend (simd::ZipVLOps is the SIMD twin):
//   select(q [n, H, d], k [n, H_kv, d], layout, layer, P[, probes]) -> ZipVLSelection
//   prefill(q, k, v, selection, out [n, H, d], P);  decode(q [H, d], KvCache, out [H, d], AttentionOptions)
//   dense(q, k, v, out, AttentionOptions);  sparse(q, k, v, TokenSelection, out, UnselectedRows, AttentionOptions)
//     (the attention zipvl_prefill_over runs)
//   check_finite(q, k, P, fn);  accumulate(selection, q, k, P);  finish(selection, layout, P, fn)
//     (the arithmetic zipvl_select_over runs: the NaN/Inf scan, Eq. 6, Eq. 7-9 and the kept set)
struct ZipVLOps {
    template <class... A> static auto select(A&&... a) { return reference::zipvl_select(std::forward<A>(a)...); }
    template <class... A> static void prefill(A&&... a) { reference::zipvl_prefill(std::forward<A>(a)...); }
    template <class... A> static void decode(A&&... a) { reference::decode_attention(std::forward<A>(a)...); }
    template <class... A> static void dense(A&&... a) { reference::dense_attention(std::forward<A>(a)...); }
    template <class... A> static void sparse(A&&... a) { reference::sparse_attention(std::forward<A>(a)...); }
    template <class Q, class K> static void check_finite(Q q, K k, const ZipVLParams&, const char* fn) {
        detail::check_finite(q, fn, "q");  // the reference scans whatever P.check_finite says
        detail::check_finite(k, fn, "k");
    }
    template <class... A> static void accumulate(A&&... a) { detail::zipvl_accumulate(std::forward<A>(a)...); }
    template <class... A> static void finish(A&&... a) { detail::zipvl_finish(std::forward<A>(a)...); }
};

}  // namespace vlsparse::reference
