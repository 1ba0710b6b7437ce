// vlsparse/attention/decode.hpp -- one decode step over a KV cache, CPU fast path (namespace vlsparse::simd).
//
//   o_h = sum_{t < rows(g)} softmax_t(scale * q_h . k_{g,t}) v_{g,t},   g = h / (H / H_kv)
//
// The newest token (whose K/V the caller has already appended) attends to every row the cache holds
// for its KV head -- after eviction (KvCache::keep) that is the kept set, ZipVL's decode phase
// (Algorithm 2); or every row of an engine's own cache (a batch-of-one KvBatchView). Same signatures
// and semantics as vlsparse::reference::decode_attention.
// It is the indexed decode engine (vlsparse/attention/indexed_decode.hpp) with every row listed:
// each list is one run of consecutive rows, so fp32 caches are read in place and fp16/bf16 rows are
// widened chunk by chunk; work items (KV head, chunk of rows) run in parallel with OpenMP, each a
// local softmax merged exactly.
// Include: <vlsparse/vlsparse.hpp> (or this header alone).
#pragma once

#include <utility>

#include "vlsparse/attention/indexed_decode.hpp"

namespace vlsparse::simd {

namespace detail {

// Every row of every KV head, in order: the row lists of a full decode step.
template <class TC>
CacheRows all_cache_rows(const KvCache<TC>& cache) {
    CacheRows rows;
    for (std::int64_t g = 0; g < cache.n_kv_heads(); ++g) rows.push_all(cache.rows(g));
    return rows;
}

template <class Arch, class TQ, class TC, class TO>
void run_decode(const View2<const TQ>& q, const KvCache<TC>& cache, const View2<TO>& out, float scale,
                std::int64_t chunk = kDecodeChunk) {
    run_indexed_decode<Arch>(q, cache, all_cache_rows(cache), out, scale, nullptr, 0, chunk);
}

}  // namespace detail

// One decode step: q [H, d] (the newest token, whose K/V the caller has already appended) attends to
// every row the cache holds for its KV head. out [H, d].
template <ElementType TQ, ElementType TC, OutputElement TO, class Arch = native_arch>
void decode_attention(View2<const TQ> q, const KvCache<TC>& cache, View2<TO> out, const AttentionOptions& opt = {}) {
    constexpr const char* fn = "simd::decode_attention";
    detail::check_strides(q, fn, "q", false);
    detail::check_strides(out, fn, "out", true);
    const std::int64_t H = q.shape[0], d = q.shape[1], Hkv = cache.n_kv_heads();
    detail::require(Hkv > 0, fn, "the cache has no KV heads (default-constructed); expected H_kv > 0");
    detail::require(H > 0 && d == cache.head_dim(), fn, "q has shape [", H, ", ", d, "], expected [H, ",
                    cache.head_dim(), "] with H > 0");
    detail::require(H % Hkv == 0, fn, "H = ", H, " query heads is not a multiple of the cache's H_kv = ", Hkv);
    detail::require(out.shape == q.shape, fn, "out has shape [", out.shape[0], ", ", out.shape[1], "], expected [", H,
                    ", ", d, "]");
    detail::require(!detail::overlaps(out, q), fn, "output out aliases input q; expected separate buffers");
    if (opt.check_finite) {
        for (std::int64_t h = 0; h < H; ++h)
            for (std::int64_t c = 0; c < d; ++c)
                detail::require(std::isfinite(to_float(q(h, c))), fn, "q[", h, ", ", c, "] = ", to_float(q(h, c)),
                                "; expected finite values (no NaN or Inf)");
    }
    const float scale = detail::resolve_scale(opt, d, fn);
    for (std::int64_t g = 0; g < Hkv; ++g) {
        const std::int64_t m = cache.rows(g);
        detail::require(m > 0, fn, "KV head ", g, " of the cache is empty; append the new token's K/V first");
        if (opt.check_finite) {
            const View3<const TC> kk(cache.k(g).data, {m, 1, d}), vv(cache.v(g).data, {m, 1, d});
            detail::check_finite_vectorized(kk, fn, "cache k");  // [rows, 1, d]: the element is [row, 0, c]
            detail::check_finite_vectorized(vv, fn, "cache v");
        }
    }
    detail::run_decode<Arch>(q, cache, out, scale);
    if (opt.check_finite) ::vlsparse::detail::check_narrowed_output(out, fn, "out");
}

// The same step over an engine's own cache: a batch-of-one KvBatchView (host memory; every KV head
// holds cache.seq_lens[0] rows), read in place. Same results as the KvCache overload holding the same
// rows, bit for bit.
template <ElementType TQ, ElementType TC, OutputElement TO, class Arch = native_arch>
void decode_attention(View2<const TQ> q, const KvBatchView<const TC>& cache, View2<TO> out,
                      const AttentionOptions& opt = {}) {
    constexpr const char* fn = "simd::decode_attention";
    detail::check_decode_shapes(q, cache.n_kv_heads, cache.head_dim, out, fn);
    const std::int64_t len = ::vlsparse::detail::check_sequence_cache(cache, q.shape[0], out, fn);
    CacheRows all;
    all.push_all(len);  // one list: every KV head of a view holds the same rows
    const auto heads = ::vlsparse::detail::decode_heads(cache);
    const std::span<const detail::DecodeHead<TC>> hs(heads);
    const float scale = detail::check_decode_values<Arch>(q, hs, all, opt, fn);
    detail::run_indexed_decode<Arch>(q, hs, all, out, scale, nullptr, 0);
    if (opt.check_finite) ::vlsparse::detail::check_narrowed_output(out, fn, "out");
}

// Decode attention on the SIMD backend as a type, for code written once over a backend (the Python
// bindings' decode over a cache); reference::DecodeOps is the twin. prob_type: the probabilities'
// element type, the only one its probs overloads write.
struct DecodeOps {
    using prob_type = float;
    template <class... A> static auto decode(A&&... a) { return simd::decode_attention(std::forward<A>(a)...); }
    template <class... A> static auto indexed_decode(A&&... a) {
        return simd::indexed_decode_attention(std::forward<A>(a)...);
    }
};

}  // namespace vlsparse::simd
