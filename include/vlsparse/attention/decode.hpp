// vlsparse/attention/decode.hpp -- one decode step over a KV cache, CPU fast path (namespace vlsparse::simd).
//
//   o_h = sum_{t < rows(g)} softmax_t(scale * q_h . k_{g,t}) v_{g,t},   g = h / (H / H_kv)
//
// The newest token (whose K/V the caller has already appended) attends to every row the cache holds
// for its KV head -- after eviction (KvCache::keep) that is the kept set, ZipVL's decode phase
// (Algorithm 2). Same signature and semantics as vlsparse::reference::decode_attention.
// Memory bound: no packing; the cache is read in chunks of rows that stay in cache while every
// query head of the GQA group uses them (fp16/bf16 chunks widened once per group), scores by the
// xsimd dots kernel, the weighted sum of values by weighted_sum, fp32 accumulation. The rows of a head are split into
// chunks that run in parallel with OpenMP (each a local softmax with its own max), merged exactly.
// Include: <vlsparse/vlsparse.hpp> (or this header alone).
#pragma once

#include "vlsparse/attention/dense.hpp"
#include "vlsparse/kv/kv_cache.hpp"

#ifndef VLSPARSE_SIMD_DECODE_CHUNK
#define VLSPARSE_SIMD_DECODE_CHUNK 128  // cache rows per work item (64 KiB of fp32 K at d = 128)
#endif

namespace vlsparse::simd {

namespace detail {

inline constexpr std::int64_t kDecodeChunk = VLSPARSE_SIMD_DECODE_CHUNK;
static_assert(kDecodeChunk >= 1, "VLSPARSE_SIMD_DECODE_CHUNK must be >= 1");

template <class Arch, class TQ, class TC, class TO>
void run_decode(const View2<const TQ>& q, const KvCache<TC>& cache, const View2<TO>& out, float scale,
                std::int64_t chunk = kDecodeChunk) {
    using Kn = Kernels<Arch>;
    const std::int64_t CH = std::max<std::int64_t>(chunk, 1);  // rows per work item
    const std::int64_t H = q.shape[0], d = q.shape[1], Hkv = cache.n_kv_heads(), group = H / Hkv;
    // Query rows widened once: qf [H, d].
    std::vector<float> qf(static_cast<std::size_t>(H * d));
    for (std::int64_t h = 0; h < H; ++h) widen_row(q.row(h), q.stride[1], qf.data() + h * d, d);

    // Work items: (KV head, chunk of its rows). Each writes, per query head of the group, its local
    // max m, local sum l and unnormalized output o [d] into `part` (stride d + 2).
    struct Item {
        std::int64_t g, t0, t1;
    };
    std::vector<Item> items;
    std::vector<std::int64_t> first_item(static_cast<std::size_t>(Hkv + 1));
    for (std::int64_t g = 0; g < Hkv; ++g) {
        first_item[static_cast<std::size_t>(g)] = static_cast<std::int64_t>(items.size());
        const std::int64_t m = cache.rows(g);
        for (std::int64_t t0 = 0; t0 < m; t0 += CH) items.push_back({g, t0, std::min(m, t0 + CH)});
    }
    first_item[static_cast<std::size_t>(Hkv)] = static_cast<std::int64_t>(items.size());
    const std::int64_t pstride = d + 2;
    std::vector<float> part(items.size() * static_cast<std::size_t>(group * pstride));

    const int nthreads = max_threads();
    struct Local {
        std::vector<float> s, kbuf, vbuf;  // scores [group, CH]; widened rows [CH, d] (fp16 / bf16 caches)
    };
    std::vector<Local> scratch(static_cast<std::size_t>(nthreads));
    for (auto& l : scratch) {
        l.s.resize(static_cast<std::size_t>(group * CH));
        if constexpr (!std::is_same_v<TC, float>) {
            l.kbuf.resize(static_cast<std::size_t>(CH * d));
            l.vbuf.resize(static_cast<std::size_t>(CH * d));
        }
    }
    const auto n_items = static_cast<std::int64_t>(items.size());
    ErrorSlot err;

    VLSPARSE_OMP(omp parallel for schedule(dynamic, 1) num_threads(nthreads))
    for (std::int64_t w = 0; w < n_items; ++w) {
        err.run([&] {
            Local& sc = scratch[static_cast<std::size_t>(thread_id())];
            const Item it = items[static_cast<std::size_t>(w)];
            const std::int64_t cnt = it.t1 - it.t0;
            // The chunk's rows as fp32 [cnt, d]: in place, or widened once for the whole group.
            const float* kc;
            const float* vc;
            if constexpr (std::is_same_v<TC, float>) {
                kc = cache.k(it.g).data + it.t0 * d;
                vc = cache.v(it.g).data + it.t0 * d;
            } else {
                const TC* kb = cache.k(it.g).data + it.t0 * d;
                const TC* vb = cache.v(it.g).data + it.t0 * d;
                for (std::int64_t t = 0; t < cnt; ++t) {
                    widen_row(kb + t * d, 1, sc.kbuf.data() + t * d, d);
                    widen_row(vb + t * d, 1, sc.vbuf.data() + t * d, d);
                }
                kc = sc.kbuf.data();
                vc = sc.vbuf.data();
            }
            const float* qg = qf.data() + it.g * group * d;
            float* pw = part.data() + w * group * pstride;
            for (std::int64_t a = 0; a < group; ++a) {
                float* sa = sc.s.data() + a * CH;
                Kn::dots(qg + a * d, kc, d, cnt, d, sa);
                Kn::scale(sa, cnt, scale);
                const float mx = Kn::max(sa, cnt);
                pw[a * pstride] = mx;
                pw[a * pstride + 1] = Kn::exp_sub_sum(sa, cnt, mx);
                std::fill(pw + a * pstride + 2, pw + (a + 1) * pstride, 0.0f);
                Kn::weighted_sum(pw + a * pstride + 2, sa, vc, d, cnt, d);
            }
        });
    }
    err.rethrow();

    // Merge the chunks of each query head: O = sum_c e^{m_c - M} o_c / sum_c e^{m_c - M} l_c.
    std::vector<float> o(static_cast<std::size_t>(d));
    std::vector<double> dp, dout(static_cast<std::size_t>(d));
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
        float L = 0.0f;
        std::fill(o.begin(), o.end(), 0.0f);
        if (ok) {
            for (std::int64_t c = c0; c < c1; ++c) {
                const float* pc = part.data() + (c * group + a) * pstride;
                const float wgt = std::exp(pc[0] - M);
                L += wgt * pc[1];
                Kn::axpy(o.data(), wgt, pc + 2, d);
            }
            ok = std::isfinite(L) && L > 0.0f;
        }
        if (ok) {
            Kn::scale(o.data(), d, 1.0f / L);
            for (std::int64_t c = 0; c < d; ++c) ok &= std::isfinite(o[static_cast<std::size_t>(c)]);
        }
        if (ok) {
            for (std::int64_t c = 0; c < d; ++c) store(out(h, c), o[static_cast<std::size_t>(c)]);
        } else {  // fp32 overflow (or non-finite input with check_finite off): redo this head in double
            const std::int64_t m = cache.rows(g);
            const View3<const TC> kk(cache.k(g).data, {m, 1, d}), vv(cache.v(g).data, {m, 1, d});
            attend_row_double(q.row(h), q.stride[1], kk, vv, 0, nullptr, m, static_cast<double>(scale), dp,
                              dout.data());
            for (std::int64_t c = 0; c < d; ++c) store(out(h, c), dout[static_cast<std::size_t>(c)]);
        }
    }
}

}  // namespace detail

// One decode step: q [H, d] (the newest token, whose K/V the caller has already appended) attends to
// every row the cache holds for its KV head. out [H, d].
template <ElementType TQ, ElementType TC, OutputElement TO, class Arch = detail::native_arch>
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
            detail::check_finite_fast(kk, fn, "cache k");  // [rows, 1, d]: the element is [row, 0, c]
            detail::check_finite_fast(vv, fn, "cache v");
        }
    }
    detail::run_decode<Arch>(q, cache, out, scale);
}

}  // namespace vlsparse::simd
