// vlsparse/attention/indexed_decode.hpp -- decode attention over listed cache rows, CPU fast path
// (namespace vlsparse::simd).
//
//   o_h = sum_{t in R_g} softmax_t(scale * q_h . k_{g,t}) v_{g,t},   g = h / (H / H_kv)
//
// One decode query against a KV cache restricted to the cache rows R_g of its KV head (CacheRows:
// one shared list or one per KV head, see vlsparse/attention/cache_rows.hpp). No copy of the listed
// K/V is made: the group kernels (detail/group_kernels.hpp) read each listed row in place, once for
// all query heads of its KV group, in the cache's element type (bf16 / fp16 widened in registers),
// prefetching the rows a few list entries ahead. Work items are (KV head, chunk of 128 list entries),
// run in parallel with OpenMP, each a local softmax merged exactly. Serves ZipVL's decode and A-VL's
// core/secondary steps; simd::decode_attention is this engine with every row listed.
// The cache is the library's KvCache or an engine's own (a batch-of-one KvBatchView: contiguous, NHD
// or HND pages, read in place); both run the same engine, so they agree bit for bit on the same rows.
// Same signatures and semantics as vlsparse::reference::indexed_decode_attention.
// Include: <vlsparse/vlsparse.hpp> (or this header alone).
#pragma once

#include "vlsparse/attention/cache_rows.hpp"
#include "vlsparse/attention/common.hpp"
#include "vlsparse/detail/group_kernels.hpp"
#include "vlsparse/detail/simd_common.hpp"
#include "vlsparse/kv/kv_batch.hpp"
#include "vlsparse/kv/kv_cache.hpp"

#ifndef VLSPARSE_SIMD_DECODE_CHUNK
#define VLSPARSE_SIMD_DECODE_CHUNK 128  // listed rows per work item (64 KiB of fp32 K at d = 128)
#endif

namespace vlsparse::simd {

namespace detail {

inline constexpr std::int64_t kDecodeChunk = VLSPARSE_SIMD_DECODE_CHUNK;
static_assert(kDecodeChunk >= 1, "VLSPARSE_SIMD_DECODE_CHUNK must be >= 1");

using ::vlsparse::detail::DecodeHead;

// Double-precision attention of one query row over rows[0:m) of sequence b, KV head g (the fallback
// for rows whose fp32 softmax overflowed; the arithmetic of attend_row_double in the same order).
// probs gets the probabilities, o (length d) the output.
template <class TQ, class TC>
void attend_batch_row_double(const TQ* q, std::int64_t q_stride, const KvBatchView<const TC>& cache, std::int64_t b,
                             std::int64_t g, const std::int64_t* rows, std::int64_t m, double scale,
                             std::vector<double>& probs, double* o) {
    attend_rows_double(
        q, q_stride, cache.head_dim, m, scale,
        [&](std::int64_t t, std::int64_t c) { return to_float(cache.k_row(b, rows[t], g)[c]); },
        [&](std::int64_t t, std::int64_t c) { return to_float(cache.v_row(b, rows[t], g)[c]); }, probs, o);
}

// How the group kernels address one KV head's rows: row r's K at k + idx(r) * d when by_index (every
// stride a multiple of d: the KvCache, contiguous and NHD / HND caches), else at k + idx(r) (one
// kernel call per row).
template <class TC>
struct HeadAddress {
    const TC* k;
    const TC* v;
    bool by_index;
    DecodeHead<TC> h;
    std::int64_t d, step;  // not paged: idx(r) = r * step

    HeadAddress(const DecodeHead<TC>& head, std::int64_t dim) : h(head), d(dim) {
        const auto& c = h.cache;
        if (c.paged()) {
            k = c.k;
            v = c.v;
            by_index = c.row_stride % d == 0 && c.head_stride % d == 0 && c.page_stride % d == 0;
            step = 0;
        } else {  // one page (batch of one): row r at head * head_stride + r * row_stride
            k = c.k + h.head * c.head_stride;
            v = c.v + h.head * c.head_stride;
            by_index = c.row_stride % d == 0;
            step = by_index ? c.row_stride / d : c.row_stride;
        }
    }
    std::int64_t idx(std::int64_t r) const {
        if (!h.cache.paged()) return r * step;
        const std::int64_t off = h.cache.offset(0, r, h.head);
        return by_index ? off / d : off;
    }
};

// The decode engine, shared with simd::decode_attention (which lists every row), for the owning
// KvCache and an engine's own cache alike: KV head g is heads[g].
// probs_f: null, or [H, L] fp32 (row stride L) receiving the probabilities of every listed row.
template <class Arch, class TQ, class TC, class TO>
void run_indexed_decode(const View2<const TQ>& q, std::span<const DecodeHead<TC>> heads, const CacheRows& rows,
                        const View2<TO>& out, float scale, float* probs_f, std::int64_t L,
                        std::int64_t chunk = kDecodeChunk) {
    using Kn = Kernels<Arch>;
    using Gk = GroupKernels<Arch>;
    const std::int64_t CH = std::max<std::int64_t>(chunk, 1);
    const std::int64_t H = q.shape[0], d = q.shape[1], Hkv = static_cast<std::int64_t>(heads.size()), group = H / Hkv;
    std::vector<float> qf(static_cast<std::size_t>(H * d));
    for (std::int64_t h = 0; h < H; ++h) widen_row(q.row(h), q.stride[1], qf.data() + h * d, d);
    std::vector<HeadAddress<TC>> addr;
    addr.reserve(heads.size());
    for (const auto& h : heads) addr.emplace_back(h, d);

    struct Item {
        std::int64_t g, t0, t1;  // entries [t0, t1) of KV head g's list
    };
    std::vector<Item> items;
    std::vector<std::int64_t> first_item(static_cast<std::size_t>(Hkv + 1));
    for (std::int64_t g = 0; g < Hkv; ++g) {
        first_item[static_cast<std::size_t>(g)] = static_cast<std::int64_t>(items.size());
        const auto m = static_cast<std::int64_t>(rows.for_kv_head(g).size());
        for (std::int64_t t0 = 0; t0 < m; t0 += CH) items.push_back({g, t0, std::min(m, t0 + CH)});
    }
    first_item[static_cast<std::size_t>(Hkv)] = static_cast<std::int64_t>(items.size());
    const std::int64_t pstride = d + 2;
    std::vector<float> part(items.size() * static_cast<std::size_t>(group * pstride));

    const int nthreads = max_threads();
    struct Scratch {
        std::vector<float> s;           // scores [group, CH] when probs are not kept
        std::vector<std::int64_t> idx;  // the chunk's row indices for the group kernels
    };
    std::vector<Scratch> scratch(static_cast<std::size_t>(nthreads));
    for (auto& sc : scratch) {
        if (!probs_f) sc.s.resize(static_cast<std::size_t>(group * CH));
        sc.idx.resize(static_cast<std::size_t>(CH));
    }
    const auto n_items = static_cast<std::int64_t>(items.size());
    const std::int64_t zero = 0;
    ErrorSlot err;

    VLSPARSE_OMP(omp parallel for schedule(dynamic, 1) num_threads(nthreads))
    for (std::int64_t w = 0; w < n_items; ++w) {
        err.run([&] {
            const Item it = items[static_cast<std::size_t>(w)];
            const std::int64_t cnt = it.t1 - it.t0;
            const HeadAddress<TC>& ad = addr[static_cast<std::size_t>(it.g)];
            Scratch& sc = scratch[static_cast<std::size_t>(thread_id())];
            const auto list = rows.for_kv_head(it.g);
            for (std::int64_t t = 0; t < cnt; ++t)
                sc.idx[static_cast<std::size_t>(t)] = ad.idx(list[static_cast<std::size_t>(it.t0 + t)]);
            const std::int64_t* idx = sc.idx.data();
            // Scores of the group's heads for this chunk: straight into probs when asked for, else scratch.
            float* sg = probs_f ? probs_f + it.g * group * L + it.t0 : sc.s.data();
            const std::int64_t ss = probs_f ? L : CH;
            const float* qg = qf.data() + it.g * group * d;
            float* pw = part.data() + w * group * pstride;
            // K rows read once for all heads of the group (V rows prefetched meanwhile), widened in registers.
            if (ad.by_index) {
                Gk::dots(qg, group, ad.k, idx, cnt, d, sg, ss, ad.v);
            } else {
                for (std::int64_t t = 0; t < cnt; ++t) Gk::dots(qg, group, ad.k + idx[t], &zero, 1, d, sg + t, ss);
            }
            for (std::int64_t a = 0; a < group; ++a) {
                float* sa = sg + a * ss;
                Kn::scale(sa, cnt, scale);
                const float mx = Kn::max(sa, cnt);
                pw[a * pstride] = mx;
                pw[a * pstride + 1] = Kn::exp_sub_sum(sa, cnt, mx);
                std::fill(pw + a * pstride + 2, pw + (a + 1) * pstride, 0.0f);
            }
            if (ad.by_index) {
                Gk::weighted_sum(pw + 2, pstride, sg, ss, group, ad.v, idx, cnt, d);
            } else {
                for (std::int64_t t = 0; t < cnt; ++t)
                    Gk::weighted_sum(pw + 2, pstride, sg + t, ss, group, ad.v + idx[t], &zero, 1, d);
            }
        });
    }
    err.rethrow();

    std::vector<float> o(static_cast<std::size_t>(d));
    std::vector<double> dp, dout(static_cast<std::size_t>(d));
    std::vector<std::int64_t> list64;
    constexpr float ninf = -std::numeric_limits<float>::infinity();
    for (std::int64_t h = 0; h < H; ++h) {
        const std::int64_t g = h / group, a = h % group;
        const std::int64_t c0 = first_item[static_cast<std::size_t>(g)], c1 = first_item[static_cast<std::size_t>(g + 1)];
        float M = ninf;
        bool ok = true;
        for (std::int64_t c = c0; c < c1; ++c) {
            const float mc = part[static_cast<std::size_t>((c * group + a) * pstride)];
            ok &= std::isfinite(mc);
            M = std::max(M, mc);
        }
        float Lsum = 0.0f;
        std::fill(o.begin(), o.end(), 0.0f);
        if (ok) {
            for (std::int64_t c = c0; c < c1; ++c) {
                const float* pc = part.data() + (c * group + a) * pstride;
                const float wgt = std::exp(pc[0] - M);
                Lsum += wgt * pc[1];
                Kn::axpy(o.data(), wgt, pc + 2, d);
            }
            ok = std::isfinite(Lsum) && Lsum > 0.0f;
        }
        if (ok) {
            Kn::scale(o.data(), d, 1.0f / Lsum);
            for (std::int64_t c = 0; c < d; ++c) ok &= std::isfinite(o[static_cast<std::size_t>(c)]);
        }
        const auto list = rows.for_kv_head(g);
        const auto cnt = static_cast<std::int64_t>(list.size());
        if (ok) {
            for (std::int64_t c = 0; c < d; ++c) store(out(h, c), o[static_cast<std::size_t>(c)]);
            if (probs_f) {
                float* ph = probs_f + h * L;
                for (std::int64_t c = c0; c < c1; ++c) {
                    const Item it = items[static_cast<std::size_t>(c)];
                    const float f = std::exp(part[static_cast<std::size_t>((c * group + a) * pstride)] - M) / Lsum;
                    Kn::scale(ph + it.t0, it.t1 - it.t0, f);
                }
            }
        } else {  // fp32 overflow (or non-finite input with check_finite off): redo this head in double
            list64.assign(list.begin(), list.end());
            const DecodeHead<TC>& hd = heads[static_cast<std::size_t>(g)];
            attend_batch_row_double(q.row(h), q.stride[1], hd.cache, 0, hd.head, list64.data(), cnt,
                                    static_cast<double>(scale), dp, dout.data());
            for (std::int64_t c = 0; c < d; ++c) store(out(h, c), dout[static_cast<std::size_t>(c)]);
            if (probs_f)
                for (std::int64_t t = 0; t < cnt; ++t) probs_f[h * L + t] = static_cast<float>(dp[static_cast<std::size_t>(t)]);
        }
        if (probs_f) std::fill(probs_f + h * L + cnt, probs_f + (h + 1) * L, 0.0f);
    }
}

// The engine over the library's owning cache.
template <class Arch, class TQ, class TC, class TO>
void run_indexed_decode(const View2<const TQ>& q, const KvCache<TC>& cache, const CacheRows& rows,
                        const View2<TO>& out, float scale, float* probs_f, std::int64_t L,
                        std::int64_t chunk = kDecodeChunk) {
    const auto heads = ::vlsparse::detail::decode_heads(cache);
    run_indexed_decode<Arch>(q, std::span<const DecodeHead<TC>>(heads), rows, out, scale, probs_f, L, chunk);
}

// With opt.check_finite: q and every listed K/V row finite. Returns the scale.
template <class Arch, class TQ, class TC>
float check_decode_values(const View2<const TQ>& q, std::span<const DecodeHead<TC>> heads, const CacheRows& rows,
                          const AttentionOptions& opt, const char* fn) {
    const std::int64_t H = q.shape[0], d = q.shape[1];
    if (opt.check_finite) {
        for (std::int64_t h = 0; h < H; ++h)
            for (std::int64_t c = 0; c < d; ++c)
                require(std::isfinite(to_float(q(h, c))), fn, "q[", h, ", ", c, "] = ", to_float(q(h, c)),
                        "; expected finite values (no NaN or Inf)");
        std::vector<float> buf(static_cast<std::size_t>(d));
        for (std::size_t g = 0; g < heads.size(); ++g) {
            const auto& hd = heads[g];
            for (const std::int64_t r : rows.for_kv_head(static_cast<std::int64_t>(g))) {
                widen_row(hd.cache.k_row(0, r, hd.head), 1, buf.data(), d);
                require(Kernels<Arch>::all_finite(buf.data(), d), fn, "cache k row ", r, " of KV head ", g,
                        " is not finite; expected finite values (no NaN or Inf)");
                widen_row(hd.cache.v_row(0, r, hd.head), 1, buf.data(), d);
                require(Kernels<Arch>::all_finite(buf.data(), d), fn, "cache v row ", r, " of KV head ", g,
                        " is not finite; expected finite values (no NaN or Inf)");
            }
        }
    }
    return resolve_scale(opt, d, fn);
}

// probs [H, L] for the probs overloads: L the longest list, contiguous, aliasing neither out nor q.
template <class TQ, class TO>
void check_decode_probs(const View2<float>& probs, const View2<const TQ>& q, const View2<TO>& out, std::int64_t L,
                        const char* fn) {
    require(probs.shape[0] == q.shape[0] && probs.shape[1] == L, fn, "probs has shape [", probs.shape[0], ", ",
            probs.shape[1], "], expected [", q.shape[0], ", ", L, "] (H x longest row list)");
    require(probs.is_contiguous(), fn, "probs must be contiguous [H, L]");
    require(!overlaps(probs, out) && !overlaps(probs, q), fn,
            "output probs aliases out or q; expected separate buffers");
}

// The public functions' one body: checks, the engine, the scan of narrowed outputs.
template <class Arch, class TQ, class Cache, class TO>
void indexed_decode(const View2<const TQ>& q, const Cache& cache, const CacheRows& rows, const View2<TO>& out,
                    const View2<float>* probs, const AttentionOptions& opt, const char* fn) {
    const auto heads = ::vlsparse::detail::decode_heads(cache);
    using TC = typename std::remove_cvref_t<decltype(heads)>::value_type::element_type;
    const std::span<const DecodeHead<TC>> hs(heads);
    ::vlsparse::detail::check_indexed_decode(q, cache, rows, out, fn);
    const float scale = check_decode_values<Arch>(q, hs, rows, opt, fn);
    const std::int64_t L = rows.longest();
    if (probs) check_decode_probs(*probs, q, out, L, fn);
    run_indexed_decode<Arch>(q, hs, rows, out, scale, probs ? probs->data : nullptr, L);
    if (opt.check_finite) ::vlsparse::detail::check_narrowed_output(out, fn, "out");
}

}  // namespace detail

// One decode step reading only the listed cache rows. q [H, d], out [H, d]; rows: 1 or H_kv lists of
// cache rows (sorted, unique, non-empty).
template <ElementType TQ, ElementType TC, OutputElement TO, class Arch = native_arch>
void indexed_decode_attention(View2<const TQ> q, const KvCache<TC>& cache, const CacheRows& rows, View2<TO> out,
                              const AttentionOptions& opt = {}) {
    detail::indexed_decode<Arch>(q, cache, rows, out, nullptr, opt, "simd::indexed_decode_attention");
}

// Same, also writing the probabilities: probs [H, L] fp32, contiguous, L the longest list; probs[h, t]
// is the probability of the t-th listed row of head h's KV group, 0 beyond the end of its list.
template <ElementType TQ, ElementType TC, OutputElement TO, class Arch = native_arch>
void indexed_decode_attention(View2<const TQ> q, const KvCache<TC>& cache, const CacheRows& rows, View2<TO> out,
                              View2<float> probs, const AttentionOptions& opt = {}) {
    detail::indexed_decode<Arch>(q, cache, rows, out, &probs, opt, "simd::indexed_decode_attention");
}

// The same step over an engine's own cache: a batch-of-one KvBatchView (vlsparse/kv/kv_batch.hpp:
// contiguous, NHD or HND pages; host memory, cache.seq_lens[0] rows in every KV head), read in place.
// Same results as the KvCache overload holding the same rows, bit for bit.
template <ElementType TQ, ElementType TC, OutputElement TO, class Arch = native_arch>
void indexed_decode_attention(View2<const TQ> q, const KvBatchView<const TC>& cache, const CacheRows& rows,
                              View2<TO> out, const AttentionOptions& opt = {}) {
    detail::indexed_decode<Arch>(q, cache, rows, out, nullptr, opt, "simd::indexed_decode_attention");
}

// Same, with the probabilities [H, L] of the KvCache overload.
template <ElementType TQ, ElementType TC, OutputElement TO, class Arch = native_arch>
void indexed_decode_attention(View2<const TQ> q, const KvBatchView<const TC>& cache, const CacheRows& rows,
                              View2<TO> out, View2<float> probs, const AttentionOptions& opt = {}) {
    detail::indexed_decode<Arch>(q, cache, rows, out, &probs, opt, "simd::indexed_decode_attention");
}

}  // namespace vlsparse::simd
