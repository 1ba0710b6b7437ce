// vlsparse/reference/indexed_decode.hpp -- exact reference of indexed decode attention.
//
//   o_h = sum_{t in R_g} softmax_t(scale * q_h . k_{g,t}) v_{g,t},   g = h / (H / H_kv)
//
// One decode query against a KV cache restricted to the cache rows R_g listed for its KV head
// (CacheRows: one shared list or one per KV head; see vlsparse/attention/cache_rows.hpp). Rows are
// read in place, never gathered into a copy. The same primitive serves ZipVL's decode (all kept
// rows) and A-VL's decode steps (core + non-image rows). The cache is the library's KvCache or an
// engine's own, a batch-of-one KvBatchView (vlsparse/kv/kv_batch.hpp), read through the same code;
// decode_attention over such a view is here too. Plain loops, double accumulation.
// Include: <vlsparse/reference/indexed_decode.hpp>
#pragma once

#include <utility>

#include "vlsparse/attention/cache_rows.hpp"
#include "vlsparse/kv/kv_batch.hpp"
#include "vlsparse/reference/attention.hpp"
#include "vlsparse/reference/batched_decode.hpp"

namespace vlsparse::reference {

namespace detail {

// The step over KV heads heads[g] (the owning KvCache's or an engine's view): rows read in place
// through their pointers, the arithmetic of attend_row.
template <class TQ, class TC, class TO, class TP>
void run_indexed_decode(const View2<const TQ>& q, std::span<const DecodeHead<TC>> heads, const CacheRows& rows,
                        const View2<TO>& out, const View2<TP>* probs, const AttentionOptions& opt, const char* fn) {
    const std::int64_t H = q.shape[0], d = q.shape[1], group = H / static_cast<std::int64_t>(heads.size());
    for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t c = 0; c < d; ++c)
            require(std::isfinite(to_float(q(h, c))), fn, "q[", h, ", ", c, "] = ", to_float(q(h, c)),
                    "; expected finite values (no NaN or Inf)");
    const double scale = resolve_scale(opt, d, fn);
    std::vector<double> p, o;
    std::vector<const TC*> kr, vr;
    for (std::int64_t h = 0; h < H; ++h) {
        const std::int64_t g = h / group;
        const DecodeHead<TC>& hd = heads[static_cast<std::size_t>(g)];
        const auto list = rows.for_kv_head(g);
        kr.clear();
        vr.clear();
        for (const std::int64_t r : list) {  // only the rows read must be finite
            kr.push_back(hd.cache.k_row(0, r, hd.head));
            vr.push_back(hd.cache.v_row(0, r, hd.head));
            for (std::int64_t c = 0; c < d; ++c) {
                require(std::isfinite(to_float(kr.back()[c])), fn, "cache k[", r, ", ", c, "] of KV head ", g,
                        " is not finite; expected finite values (no NaN or Inf)");
                require(std::isfinite(to_float(vr.back()[c])), fn, "cache v[", r, ", ", c, "] of KV head ", g,
                        " is not finite; expected finite values (no NaN or Inf)");
            }
        }
        attend_row_ptrs(q.row(h), q.stride[1], kr.data(), vr.data(), list.size(), d, scale, p, o);
        for (std::int64_t c = 0; c < d; ++c) store(out(h, c), o[static_cast<std::size_t>(c)]);
        if (probs) {
            for (std::int64_t t = 0; t < probs->shape[1]; ++t)
                store((*probs)(h, t), t < static_cast<std::int64_t>(list.size()) ? p[static_cast<std::size_t>(t)] : 0.0);
        }
    }
    ::vlsparse::detail::check_narrowed_output(out, fn, "out");  // fp16 / bf16 outputs: nothing rounded to inf
}

// The public functions' one body, for either kind of cache.
template <class TQ, class Cache, class TO, class TP>
void indexed_decode(const View2<const TQ>& q, const Cache& cache, const CacheRows& rows, const View2<TO>& out,
                    const View2<TP>* probs, const AttentionOptions& opt, const char* fn) {
    check_indexed_decode(q, cache, rows, out, fn);
    if (probs) {
        const std::int64_t L = rows.longest();
        require(probs->shape[0] == q.shape[0] && probs->shape[1] == L, fn, "probs has shape [", probs->shape[0], ", ",
                probs->shape[1], "], expected [", q.shape[0], ", ", L, "] (H x longest row list)");
        check_strides(*probs, fn, "probs", true);
        require(!overlaps(*probs, out) && !overlaps(*probs, q), fn,
                "output probs aliases out or q; expected separate buffers");
    }
    const auto heads = decode_heads(cache);
    using TC = typename std::remove_cvref_t<decltype(heads)>::value_type::element_type;
    run_indexed_decode(q, std::span<const DecodeHead<TC>>(heads), rows, out, probs, opt, fn);
}

}  // namespace detail

// One decode step reading only the listed cache rows. q [H, d], out [H, d]; rows: 1 or H_kv lists of
// cache rows (sorted, unique, non-empty). The caller has already appended the new token's K/V and
// normally lists its row.
template <ElementType TQ, ElementType TC, OutputElement TO>
void indexed_decode_attention(View2<const TQ> q, const KvCache<TC>& cache, const CacheRows& rows, View2<TO> out,
                              const AttentionOptions& opt = {}) {
    detail::indexed_decode(q, cache, rows, out, static_cast<const View2<double>*>(nullptr), opt,
                           "reference::indexed_decode_attention");
}

// Same, also writing the attention probabilities: probs [H, L] with L the longest list; probs[h, t]
// is the probability of the t-th listed row of head h's KV group, 0 beyond the end of its list.
template <ElementType TQ, ElementType TC, OutputElement TO, OutputElement TP>
void indexed_decode_attention(View2<const TQ> q, const KvCache<TC>& cache, const CacheRows& rows, View2<TO> out,
                              View2<TP> probs, const AttentionOptions& opt = {}) {
    detail::indexed_decode(q, cache, rows, out, &probs, opt, "reference::indexed_decode_attention");
}

// The same step over an engine's own cache: a batch-of-one KvBatchView (vlsparse/kv/kv_batch.hpp:
// contiguous, NHD or HND pages; host memory, cache.seq_lens[0] rows in every KV head), read in place.
template <ElementType TQ, ElementType TC, OutputElement TO>
void indexed_decode_attention(View2<const TQ> q, const KvBatchView<const TC>& cache, const CacheRows& rows,
                              View2<TO> out, const AttentionOptions& opt = {}) {
    detail::indexed_decode(q, cache, rows, out, static_cast<const View2<double>*>(nullptr), opt,
                           "reference::indexed_decode_attention");
}

// Same, with the probabilities [H, L] of the KvCache overload.
template <ElementType TQ, ElementType TC, OutputElement TO, OutputElement TP>
void indexed_decode_attention(View2<const TQ> q, const KvBatchView<const TC>& cache, const CacheRows& rows,
                              View2<TO> out, View2<TP> probs, const AttentionOptions& opt = {}) {
    detail::indexed_decode(q, cache, rows, out, &probs, opt, "reference::indexed_decode_attention");
}

// One dense decode step over an engine's own cache (a batch-of-one KvBatchView): every row of its
// sequence; the same results as decode_attention over a KvCache holding the same rows.
template <ElementType TQ, ElementType TC, OutputElement TO>
void decode_attention(View2<const TQ> q, const KvBatchView<const TC>& cache, View2<TO> out,
                      const AttentionOptions& opt = {}) {
    constexpr const char* fn = "reference::decode_attention";
    detail::check_decode_shapes(q, cache.n_kv_heads, cache.head_dim, out, fn);
    const std::int64_t len = detail::check_sequence_cache(cache, q.shape[0], out, fn);
    CacheRows all;
    all.push_all(len);  // one list: every KV head of a view holds the same rows
    const auto heads = detail::decode_heads(cache);
    detail::run_indexed_decode(q, std::span<const detail::DecodeHead<TC>>(heads), all, out,
                               static_cast<const View2<double>*>(nullptr), opt, fn);
}

// Decode attention on the reference backend as a type, for code written once over a backend (the
// Python bindings' decode over a cache); simd::DecodeOps is the twin. prob_type: the probabilities'
// element type that keeps the reference's precision (its probs overloads take any output type).
struct DecodeOps {
    using prob_type = double;
    template <class... A> static auto decode(A&&... a) { return reference::decode_attention(std::forward<A>(a)...); }
    template <class... A> static auto indexed_decode(A&&... a) {
        return reference::indexed_decode_attention(std::forward<A>(a)...);
    }
};

}  // namespace vlsparse::reference
