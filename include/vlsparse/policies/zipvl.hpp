// vlsparse/policies/zipvl.hpp -- ZipVL on the CPU fast path (namespace vlsparse::simd).
//
// Same Params, same results as <vlsparse/reference/zipvl.hpp> (see zipvl_params.hpp for the
// equations): probe attention with the SIMD attention kernels (fp32 accumulation, per-head sums
// widened to double), then O(n log n) selection with the library's deterministic top-k.
//
// Typical engine use, one layer of a prefill:
//   auto sel = vlsparse::simd::zipvl_select(q, k, layout, layer, params);
//   vlsparse::simd::zipvl_prefill(q, k, v, sel, out, params);   // token-sparse attention
//   cache.assign(k, v); vlsparse::zipvl_evict(cache, sel);        // KV eviction
// and at each decode step: cache.append(k_new, v_new); vlsparse::simd::decode_attention(q_new, cache, o).
// Include: <vlsparse/vlsparse.hpp> or this header.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "vlsparse/attention/decode.hpp"
#include "vlsparse/attention/dense.hpp"
#include "vlsparse/attention/probe.hpp"
#include "vlsparse/attention/sparse.hpp"
#include "vlsparse/core/layout.hpp"
#include "vlsparse/core/topk.hpp"
#include "vlsparse/kv/kv_cache.hpp"
#include "vlsparse/policies/zipvl_select.hpp"

namespace vlsparse {

namespace detail {

// p, normalized scores, top-k and forced keeps from the accumulated scores (shared selection code).
inline void zipvl_select_from_scores(ZipVLSelection& r, const Layout& layout, const ZipVLParams& P) {
    const std::int64_t n = r.n, G = static_cast<std::int64_t>(r.accumulated.size());
    const double total = static_cast<double>(r.heads_per_group) * static_cast<double>(r.probes.size());
    // nnz_j for the probe_rows convention: probes at or after j, times the heads of the group.
    std::vector<double> probe_nnz;
    if (P.nnz == ZipVLNnz::probe_rows) {
        probe_nnz.assign(static_cast<std::size_t>(n), 0.0);
        for (auto p : r.probes) probe_nnz[static_cast<std::size_t>(p)] += 1.0;
        double run = 0.0;
        for (std::int64_t j = n - 1; j >= 0; --j) {
            run += probe_nnz[static_cast<std::size_t>(j)];
            probe_nnz[static_cast<std::size_t>(j)] = run * static_cast<double>(r.heads_per_group);
        }
    }
    r.normalized.resize(static_cast<std::size_t>(G));
    r.p.resize(static_cast<std::size_t>(G));
    r.selection = TokenSelection{};
    r.selection.n = n;
    r.selection.indices.resize(static_cast<std::size_t>(G));
    std::vector<std::uint8_t> text;
    if (P.keep_text) text = layout.text_mask();
    for (std::int64_t g = 0; g < G; ++g) {
        const auto& a = r.accumulated[static_cast<std::size_t>(g)];
        auto& an = r.normalized[static_cast<std::size_t>(g)];
        an.resize(static_cast<std::size_t>(n));
        for (std::int64_t j = 0; j < n; ++j) {
            const double nnz = P.nnz == ZipVLNnz::causal_column ? static_cast<double>(n - j)
                                                                : probe_nnz[static_cast<std::size_t>(j)];
            an[static_cast<std::size_t>(j)] = nnz > 0.0 ? a[static_cast<std::size_t>(j)] / nnz : 0.0;
        }
        const std::int64_t p = P.ratio == ZipVLRatio::fixed
                                    ? zipvl_fixed_count(n, P.fixed_ratio)
                                    : count_for_mass(std::span<const double>(a), P.tau, total);
        r.p[static_cast<std::size_t>(g)] = p;
        auto top = topk_indices(std::span<const double>(P.ranking == ZipVLRanking::normalized ? an : a), p);
        // Forced keeps (union), then back to one sorted list.
        std::vector<std::uint8_t> keep(static_cast<std::size_t>(n), 0);
        for (auto j : top) keep[static_cast<std::size_t>(j)] = 1;
        for (std::int64_t j = std::max<std::int64_t>(0, n - P.keep_last); j < n; ++j) keep[static_cast<std::size_t>(j)] = 1;
        for (std::size_t j = 0; j < text.size(); ++j) keep[j] |= text[j];
        auto& list = r.selection.indices[static_cast<std::size_t>(g)];
        list.reserve(top.size());
        for (std::int64_t j = 0; j < n; ++j)
            if (keep[static_cast<std::size_t>(j)]) list.push_back(j);
    }
    r.selection.scores = P.ranking == ZipVLRanking::normalized ? r.normalized : r.accumulated;
}

}  // namespace detail

namespace simd {

namespace detail {

// Eq. 6 on the SIMD path: r.accumulated[g][j], the probe attention of the group's heads summed over the
// probes (r from zipvl_begin_select). One query head at a time: probabilities [1, P, n] in fp32,
// summed over probes in fp32, then added to the group's double accumulator (keeps the scratch small
// and the sums accurate). q [n, H, d], k [n, H_kv, d], already checked.
template <class TQ, class TK>
void zipvl_accumulate(ZipVLSelection& r, View3<const TQ> q, View3<const TK> k, const ZipVLParams& P) {
    const std::int64_t n = q.shape[0], H = q.shape[1], d = q.shape[2], qpk = H / k.shape[1];
    const std::int64_t G = H / r.heads_per_group;
    const auto np = static_cast<std::int64_t>(r.probes.size());
    std::vector<float> probs(static_cast<std::size_t>(np * n));
    std::vector<float> head_sum(static_cast<std::size_t>(n));
    r.accumulated.assign(static_cast<std::size_t>(G), std::vector<double>(static_cast<std::size_t>(n), 0.0));
    AttentionOptions opt = P.attention();
    opt.check_finite = false;  // zipvl_select_over has scanned the inputs when asked
    for (std::int64_t h = 0; h < H; ++h) {
        const View3<const TQ> qh(q.row(0, h), {n, 1, d}, q.stride);
        const View3<const TK> kh(k.row(0, h / qpk), {n, 1, d}, k.stride);
        simd::probe_attention(qh, kh, std::span<const std::int64_t>(r.probes), View3<float>(probs.data(), {1, np, n}), opt);
        std::fill(head_sum.begin(), head_sum.end(), 0.0f);
        for (std::int64_t p = 0; p < np; ++p) {
            const float* row = probs.data() + p * n;
            const std::int64_t visible = r.probes[static_cast<std::size_t>(p)] + 1;  // zero beyond
            for (std::int64_t j = 0; j < visible; ++j) head_sum[static_cast<std::size_t>(j)] += row[j];
        }
        auto& a = r.accumulated[static_cast<std::size_t>(h / r.heads_per_group)];
        for (std::int64_t j = 0; j < n; ++j) a[static_cast<std::size_t>(j)] += head_sum[static_cast<std::size_t>(j)];
    }
}

}  // namespace detail

struct ZipVLOps;

// ZipVL's selection for layer `layer`: probes, scores, p and the kept set. q [n, H, d], k [n, H_kv, d].
// `probes` overrides the probe choice (sorted ascending, unique, in [0, n)); empty = zipvl_probes().
// zipvl_select_over on this backend's arithmetic.
template <ElementType TQ, ElementType TK>
ZipVLSelection zipvl_select(View3<const TQ> q, View3<const TK> k, const Layout& layout, std::int64_t layer,
                            const ZipVLParams& P, std::span<const std::int64_t> probes = {}) {
    return zipvl_select_over<ZipVLOps>(q, k, layout, layer, P, probes, "simd::zipvl_select");
}

// Token-sparse prefill (Algorithm 1; zipvl_prefill_over on this backend's attention). out [n, H, d].
template <ElementType TQ, ElementType TK, OutputElement TO>
void zipvl_prefill(View3<const TQ> q, View3<const TK> k, View3<const TK> v, const ZipVLSelection& s, View3<TO> out,
                   const ZipVLParams& P) {
    zipvl_prefill_over<ZipVLOps>(q, k, v, s, out, P);
}

// One whole layer the way an engine runs it: select, token-sparse prefill into `out`, and fill the
// layer's cache with the kept K/V rows. Returns the selection (for logging and metrics).
template <ElementType TQ, ElementType TK, OutputElement TO, ElementType TC>
ZipVLSelection zipvl_prefill_layer(View3<const TQ> q, View3<const TK> k, View3<const TK> v, const Layout& layout,
                                   std::int64_t layer, const ZipVLParams& P, View3<TO> out, KvCache<TC>& cache) {
    ZipVLSelection s = zipvl_select(q, k, layout, layer, P);
    zipvl_prefill(q, k, v, s, out, P);
    cache.assign(k, v);
    zipvl_evict(cache, s);
    return s;
}

// ZipVL's operations on the SIMD backend: the concept of golden::run_zipvl_case and of
// zipvl_select_over (the signatures are listed at reference::ZipVLOps), for code written once over a
// backend.
struct ZipVLOps {
    template <class... A> static auto select(A&&... a) { return simd::zipvl_select(std::forward<A>(a)...); }
    template <class... A> static void prefill(A&&... a) { simd::zipvl_prefill(std::forward<A>(a)...); }
    template <class... A> static void decode(A&&... a) { simd::decode_attention(std::forward<A>(a)...); }
    template <class... A> static void dense(A&&... a) { simd::dense_attention(std::forward<A>(a)...); }
    template <class... A> static void sparse(A&&... a) { simd::sparse_attention(std::forward<A>(a)...); }
    template <class Q, class K> static void check_finite(Q q, K k, const ZipVLParams& P, const char* fn) {
        if (!P.check_finite) return;
        simd::detail::check_finite_vectorized(q, fn, "q");
        simd::detail::check_finite_vectorized(k, fn, "k");
    }
    template <class... A> static void accumulate(A&&... a) { simd::detail::zipvl_accumulate(std::forward<A>(a)...); }
    static void finish(ZipVLSelection& r, const Layout& layout, const ZipVLParams& P, const char*) {
        ::vlsparse::detail::zipvl_select_from_scores(r, layout, P);
    }
};

}  // namespace simd
}  // namespace vlsparse
