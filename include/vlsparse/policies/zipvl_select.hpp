// vlsparse/policies/zipvl_select.hpp -- ZipVL's backend-independent steps: the probe positions, the
// kept count p (adaptive or fixed ratio), the prefill mode of a layer and the eviction of a selection,
// and the selection's and the prefill's sequencing written once over a backend's ZipVLOps;
// shared by the reference, the SIMD path and CUDA (no Eigen, no xsimd, no OpenMP; nvcc compiles it).
// The Params, enums, result type and checks are in policies/zipvl_params.hpp (included here).
//   probes P = the last max(recent, 1) positions + `random` drawn from [0, n - recent) by SplitMix64(seed + layer)
// ZipVL: He et al., arXiv:2410.08584, Sections 4.1-4.2; docs/zipvl.md.
// Include: <vlsparse/policies/zipvl.hpp> (SIMD path) or <vlsparse/reference/zipvl.hpp> (reference).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "vlsparse/attention/common.hpp"
#include "vlsparse/core/error.hpp"
#include "vlsparse/core/layout.hpp"
#include "vlsparse/core/rng.hpp"
#include "vlsparse/core/selection.hpp"
#include "vlsparse/core/tensor.hpp"
#include "vlsparse/detail/check.hpp"
#include "vlsparse/kv/kv_cache.hpp"
#include "vlsparse/policies/zipvl_params.hpp"

namespace vlsparse {

// The kept count of the fixed-ratio mode: ceil(ratio * n), at least 1 and at most n, computed as
// ceil(x - 1e-9 max(1, x)) so that a product that is mathematically an integer stays that integer.
inline std::int64_t zipvl_fixed_count(std::int64_t n, double ratio) {
    const double x = ratio * static_cast<double>(n);
    const auto c = static_cast<std::int64_t>(std::ceil(x - 1e-9 * std::max(1.0, x)));
    return std::clamp<std::int64_t>(c, 1, std::max<std::int64_t>(n, 1));
}

// The group's kept count p: Eq. 7's adaptive count (given), or the fixed-ratio count.
inline std::int64_t zipvl_kept_count(std::int64_t adaptive_p, std::int64_t n, const ZipVLParams& P) {
    return P.ratio == ZipVLRatio::fixed ? zipvl_fixed_count(n, P.fixed_ratio) : adaptive_p;
}

// The prefill of a selective layer is token-sparse (false: dense, eviction-only).
inline bool zipvl_sparse_prefill(const ZipVLSelection& s, const ZipVLParams& P) {
    return !s.dense && P.prefill == ZipVLPrefill::sparse;
}

// The probe positions of ZipVL for a sequence of n tokens in layer `layer` (docs/zipvl.md):
// the last max(recent, 1) positions plus `random` positions drawn without replacement from [0, n - recent)
// with SplitMix64(seed + layer); every position when n <= recent + random. Ascending. In ratio mode
// recent = ceil(probe_recent_ratio * n) and random = ceil(probe_random_ratio * n), each computed as
// ceil(x - 1e-9 max(1, x)) so that a product that is mathematically an integer stays that integer.
inline std::vector<std::int64_t> zipvl_probes(std::int64_t n, std::int64_t layer, const ZipVLParams& P) {
    constexpr const char* fn = "zipvl_probes";
    detail::check_zipvl_params(P, fn);
    detail::require(n > 0, fn, "n = ", n, ", expected n > 0 (empty input)");
    detail::require(layer >= 0, fn, "layer = ", layer, ", expected >= 0");
    std::int64_t recent = P.probe_recent, random = P.probe_random;
    if (P.probe_mode == ZipVLProbes::ratios) {
        // ceil(ratio * n), computed so that exact products (0.07 * 100 = 7.000000000000001 in double) are not
        // pushed up by rounding: the same guard as BlindSight's sink count (masks/templates.hpp).
        auto count = [n](double ratio) {
            const double x = ratio * static_cast<double>(n);
            return static_cast<std::int64_t>(std::ceil(x - 1e-9 * std::max(1.0, x)));
        };
        recent = count(P.probe_recent_ratio);
        random = count(P.probe_random_ratio);
    }
    std::vector<std::int64_t> out;
    if (n <= recent + random) {
        out.resize(static_cast<std::size_t>(n));
        for (std::int64_t i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = i;
        return out;
    }
    recent = std::max<std::int64_t>(recent, 1);  // n-1 is always a probe, so recent is at least 1
    out = sample_without_replacement(n - recent, random, P.seed + static_cast<std::uint64_t>(layer));
    for (std::int64_t i = n - recent; i < n; ++i) out.push_back(i);
    return out;
}

// The probe positions of a selection: `given` when not empty (checked: sorted, unique, in [0, n)),
// else zipvl_probes(n, layer, P).
inline std::vector<std::int64_t> zipvl_probes_or(std::span<const std::int64_t> given, std::int64_t n, std::int64_t layer,
                                                 const ZipVLParams& P, const char* fn) {
    if (given.empty()) return zipvl_probes(n, layer, P);
    detail::check_sorted_unique(given, n, fn, "probes");
    return {given.begin(), given.end()};
}

// The prefill of a layer (Algorithm 1), written once over a backend's ZipVLOps: token-sparse
// attention restricted to the kept set (rows outside it per P.unselected) by Ops::sparse, or dense
// attention by Ops::dense on a dense layer or with P.prefill == dense (eviction-only). out [n, H, d].
template <class Ops, class TQ, class TK, class TO>
void zipvl_prefill_over(View3<const TQ> q, View3<const TK> k, View3<const TK> v, const ZipVLSelection& s, View3<TO> out,
                        const ZipVLParams& P) {
    if (!zipvl_sparse_prefill(s, P)) {
        Ops::dense(q, k, v, out, P.attention());
        return;
    }
    Ops::sparse(q, k, v, s.selection, out, P.unselected, P.attention());
}

namespace detail {

// The start of zipvl_select on every CPU backend, after its checks (q [n, H, d], k [n, H_kv, d]): the
// selection's n and heads per group; on a dense layer (layer < P.dense_layers) the whole selection
// (every token, p = n) and true; otherwise the probes (zipvl_probes_or) and false. The backend then
// accumulates the probe attention (Eq. 6) and finishes the selection.
inline bool zipvl_begin_select(ZipVLSelection& r, std::int64_t n, std::int64_t H, std::int64_t Hkv, std::int64_t layer,
                               const ZipVLParams& P, std::span<const std::int64_t> probes, const char* fn) {
    r.n = n;
    const std::int64_t G = P.grouping == ZipVLGrouping::layer ? 1 : Hkv;
    r.heads_per_group = H / G;
    if (layer < P.dense_layers) {
        r.dense = true;
        r.p.assign(static_cast<std::size_t>(G), n);
        r.selection = TokenSelection::all(n);
        return true;
    }
    r.probes = zipvl_probes_or(probes, n, layer, P, fn);
    return false;
}

}  // namespace detail

// ZipVL's selection for layer `layer` (q [n, H, d], k [n, H_kv, d]), written once over a backend's
// ZipVLOps: the checks, the NaN/Inf scan (Ops::check_finite: the reference always scans, the SIMD path
// when P.check_finite), the start (detail::zipvl_begin_select: probes, or the whole selection on a dense
// layer), then the backend's arithmetic: Ops::accumulate(r, q, k, P) fills r.accumulated (Eq. 6) and
// Ops::finish(r, layout, P, fn) the count p, the normalized scores and the kept set (Eq. 7-9).
// reference::zipvl_select and simd::zipvl_select call it; `fn` names the caller.
template <class Ops, class TQ, class TK>
ZipVLSelection zipvl_select_over(View3<const TQ> q, View3<const TK> k, const Layout& layout, std::int64_t layer,
                                 const ZipVLParams& P, std::span<const std::int64_t> probes, const char* fn) {
    detail::check_zipvl_params(P, fn);
    detail::check_zipvl_modes(P, fn);
    detail::check_prefill_qk(q, k, fn);
    detail::require(layer >= 0, fn, "layer = ", layer, ", expected >= 0");
    layout.require_tokens(q.shape[0], fn);
    Ops::check_finite(q, k, P, fn);
    ZipVLSelection r;
    if (detail::zipvl_begin_select(r, q.shape[0], q.shape[1], k.shape[1], layer, P, probes, fn)) return r;
    Ops::accumulate(r, q, k, P);
    Ops::finish(r, layout, P, fn);
    return r;
}

// Eviction: the layer's cache keeps the selected positions (nothing is evicted in a dense layer).
template <ElementType TC>
void zipvl_evict(KvCache<TC>& cache, const ZipVLSelection& s) {
    if (!s.dense) cache.keep(s.selection);
}

}  // namespace vlsparse
