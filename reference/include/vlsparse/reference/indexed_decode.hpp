// vlsparse/reference/indexed_decode.hpp -- exact reference of indexed decode attention.
//
//   o_h = sum_{t in R_g} softmax_t(scale * q_h . k_{g,t}) v_{g,t},   g = h / (H / H_kv)
//
// One decode query against a KV cache restricted to the cache rows R_g listed for its KV head
// (CacheRows: one shared list or one per KV head; see vlsparse/attention/cache_rows.hpp). Rows are
// read in place, never gathered into a copy. The same primitive serves ZipVL's decode (all kept
// rows) and A-VL's decode steps (core + non-image rows). Plain loops, double accumulation.
// Include: <vlsparse/reference/indexed_decode.hpp>
#pragma once

#include "vlsparse/attention/cache_rows.hpp"
#include "vlsparse/reference/attention.hpp"

namespace vlsparse::reference {

namespace detail {

template <class TQ, class TC, class TO>
void check_indexed_decode(const View2<const TQ>& q, const KvCache<TC>& cache, const CacheRows& rows,
                          const View2<TO>& out, const char* fn) {
    check_strides(q, fn, "q", false);
    check_strides(out, fn, "out", true);
    const std::int64_t H = q.shape[0], d = q.shape[1], Hkv = cache.n_kv_heads();
    require(Hkv > 0, fn, "the cache has no KV heads (default-constructed); expected H_kv > 0");
    require(H > 0 && d == cache.head_dim(), fn, "q has shape [", H, ", ", d, "], expected [H, ", cache.head_dim(),
            "] with H > 0");
    require(H % Hkv == 0, fn, "H = ", H, " query heads is not a multiple of the cache's H_kv = ", Hkv);
    require(out.shape == q.shape, fn, "out has shape [", out.shape[0], ", ", out.shape[1], "], expected [", H, ", ",
            d, "]");
    require(!overlaps(out, q), fn, "output out aliases input q; expected separate buffers");
    check_cache_rows(cache, rows, fn);
}

inline std::int64_t longest_list(const CacheRows& rows) {
    std::size_t m = 0;
    for (const auto& l : rows) m = std::max(m, l.size());
    return static_cast<std::int64_t>(m);
}

template <class TQ, class TC, class TO, class TP>
void run_indexed_decode(const View2<const TQ>& q, const KvCache<TC>& cache, const CacheRows& rows,
                        const View2<TO>& out, const View2<TP>* probs, const AttentionOptions& opt, const char* fn) {
    const std::int64_t H = q.shape[0], d = q.shape[1], group = H / cache.n_kv_heads();
    for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t c = 0; c < d; ++c)
            require(std::isfinite(to_float(q(h, c))), fn, "q[", h, ", ", c, "] = ", to_float(q(h, c)),
                    "; expected finite values (no NaN or Inf)");
    const double scale = resolve_scale(opt, d, fn);
    std::vector<double> p, o;
    for (std::int64_t h = 0; h < H; ++h) {
        const std::int64_t g = h / group, m = cache.rows(g);
        const auto& list = rows.size() == 1 ? rows[0] : rows[static_cast<std::size_t>(g)];
        const View3<const TC> kk(cache.k(g).data, {m, 1, d}), vv(cache.v(g).data, {m, 1, d});
        for (auto r : list)  // only the rows read must be finite
            for (std::int64_t c = 0; c < d; ++c) {
                require(std::isfinite(to_float(kk(r, 0, c))), fn, "cache k[", r, ", ", c, "] of KV head ", g,
                        " is not finite; expected finite values (no NaN or Inf)");
                require(std::isfinite(to_float(vv(r, 0, c))), fn, "cache v[", r, ", ", c, "] of KV head ", g,
                        " is not finite; expected finite values (no NaN or Inf)");
            }
        attend_row(q.row(h), q.stride[1], kk, vv, 0, list, scale, p, o);
        for (std::int64_t c = 0; c < d; ++c) store(out(h, c), o[static_cast<std::size_t>(c)]);
        if (probs) {
            for (std::int64_t t = 0; t < probs->shape[1]; ++t)
                store((*probs)(h, t), t < static_cast<std::int64_t>(list.size()) ? p[static_cast<std::size_t>(t)] : 0.0);
        }
    }
    ::vlsparse::detail::check_narrowed_output(out, fn, "out");  // fp16 / bf16 outputs: nothing rounded to inf
}

}  // namespace detail

// One decode step reading only the listed cache rows. q [H, d], out [H, d]; rows: 1 or H_kv lists of
// cache rows (sorted, unique, non-empty). The caller has already appended the new token's K/V and
// normally lists its row.
template <ElementType TQ, ElementType TC, OutputElement TO>
void indexed_decode_attention(View2<const TQ> q, const KvCache<TC>& cache, const CacheRows& rows, View2<TO> out,
                              const AttentionOptions& opt = {}) {
    constexpr const char* fn = "reference::indexed_decode_attention";
    detail::check_indexed_decode(q, cache, rows, out, fn);
    detail::run_indexed_decode<TQ, TC, TO, double>(q, cache, rows, out, nullptr, opt, fn);
}

// Same, also writing the attention probabilities: probs [H, L] with L the longest list; probs[h, t]
// is the probability of the t-th listed row of head h's KV group, 0 beyond the end of its list.
template <ElementType TQ, ElementType TC, OutputElement TO, OutputElement TP>
void indexed_decode_attention(View2<const TQ> q, const KvCache<TC>& cache, const CacheRows& rows, View2<TO> out,
                              View2<TP> probs, const AttentionOptions& opt = {}) {
    constexpr const char* fn = "reference::indexed_decode_attention";
    detail::check_indexed_decode(q, cache, rows, out, fn);
    const std::int64_t L = detail::longest_list(rows);
    detail::require(probs.shape[0] == q.shape[0] && probs.shape[1] == L, fn, "probs has shape [", probs.shape[0], ", ",
                    probs.shape[1], "], expected [", q.shape[0], ", ", L, "] (H x longest row list)");
    detail::check_strides(probs, fn, "probs", true);
    detail::require(!detail::overlaps(probs, out) && !detail::overlaps(probs, q), fn,
                    "output probs aliases out or q; expected separate buffers");
    detail::run_indexed_decode(q, cache, rows, out, &probs, opt, fn);
}

}  // namespace vlsparse::reference
