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
// Same signature and semantics as vlsparse::reference::indexed_decode_attention.
// Include: <vlsparse/vlsparse.hpp> (or this header alone).
#pragma once

#include "vlsparse/attention/cache_rows.hpp"
#include "vlsparse/attention/common.hpp"
#include "vlsparse/detail/group_kernels.hpp"
#include "vlsparse/detail/simd_common.hpp"
#include "vlsparse/kv/kv_cache.hpp"

#ifndef VLSPARSE_SIMD_DECODE_CHUNK
#define VLSPARSE_SIMD_DECODE_CHUNK 128  // listed rows per work item (64 KiB of fp32 K at d = 128)
#endif

namespace vlsparse::simd {

namespace detail {

inline constexpr std::int64_t kDecodeChunk = VLSPARSE_SIMD_DECODE_CHUNK;
static_assert(kDecodeChunk >= 1, "VLSPARSE_SIMD_DECODE_CHUNK must be >= 1");
// The decode engine, shared with simd::decode_attention (which lists every row).
// probs_f: null, or [H, L] fp32 (row stride L) receiving the probabilities of every listed row.
template <class Arch, class TQ, class TC, class TO>
void run_indexed_decode(const View2<const TQ>& q, const KvCache<TC>& cache, const CacheRows& rows,
                        const View2<TO>& out, float scale, float* probs_f, std::int64_t L,
                        std::int64_t chunk = kDecodeChunk) {
    using Kn = Kernels<Arch>;
    using Gk = GroupKernels<Arch>;
    const std::int64_t CH = std::max<std::int64_t>(chunk, 1);
    const std::int64_t H = q.shape[0], d = q.shape[1], Hkv = cache.n_kv_heads(), group = H / Hkv;
    auto list_of = [&](std::int64_t g) -> const std::vector<std::int64_t>& {
        return rows.size() == 1 ? rows[0] : rows[static_cast<std::size_t>(g)];
    };
    std::vector<float> qf(static_cast<std::size_t>(H * d));
    for (std::int64_t h = 0; h < H; ++h) widen_row(q.row(h), q.stride[1], qf.data() + h * d, d);

    struct Item {
        std::int64_t g, t0, t1;  // entries [t0, t1) of KV head g's list
    };
    std::vector<Item> items;
    std::vector<std::int64_t> first_item(static_cast<std::size_t>(Hkv + 1));
    for (std::int64_t g = 0; g < Hkv; ++g) {
        first_item[static_cast<std::size_t>(g)] = static_cast<std::int64_t>(items.size());
        const auto m = static_cast<std::int64_t>(list_of(g).size());
        for (std::int64_t t0 = 0; t0 < m; t0 += CH) items.push_back({g, t0, std::min(m, t0 + CH)});
    }
    first_item[static_cast<std::size_t>(Hkv)] = static_cast<std::int64_t>(items.size());
    const std::int64_t pstride = d + 2;
    std::vector<float> part(items.size() * static_cast<std::size_t>(group * pstride));

    const int nthreads = max_threads();
    std::vector<std::vector<float>> scratch(static_cast<std::size_t>(nthreads));  // scores [group, CH]
    if (!probs_f)
        for (auto& l : scratch) l.resize(static_cast<std::size_t>(group * CH));
    const auto n_items = static_cast<std::int64_t>(items.size());
    ErrorSlot err;

    VLSPARSE_OMP(omp parallel for schedule(dynamic, 1) num_threads(nthreads))
    for (std::int64_t w = 0; w < n_items; ++w) {
        err.run([&] {
            const Item it = items[static_cast<std::size_t>(w)];
            const std::int64_t cnt = it.t1 - it.t0;
            const std::int64_t* idx = list_of(it.g).data() + it.t0;
            const TC* kb = cache.k(it.g).data;
            const TC* vb = cache.v(it.g).data;
            // Scores of the group's heads for this chunk: straight into probs when asked for, else scratch.
            float* sg = probs_f ? probs_f + it.g * group * L + it.t0 : scratch[static_cast<std::size_t>(thread_id())].data();
            const std::int64_t ss = probs_f ? L : CH;
            const float* qg = qf.data() + it.g * group * d;
            float* pw = part.data() + w * group * pstride;
            // K rows read once for all heads of the group (V rows prefetched meanwhile), widened in registers.
            Gk::dots(qg, group, kb, idx, cnt, d, sg, ss, vb);
            for (std::int64_t a = 0; a < group; ++a) {
                float* sa = sg + a * ss;
                Kn::scale(sa, cnt, scale);
                const float mx = Kn::max(sa, cnt);
                pw[a * pstride] = mx;
                pw[a * pstride + 1] = Kn::exp_sub_sum(sa, cnt, mx);
                std::fill(pw + a * pstride + 2, pw + (a + 1) * pstride, 0.0f);
            }
            Gk::weighted_sum(pw + 2, pstride, sg, ss, group, vb, idx, cnt, d);
        });
    }
    err.rethrow();

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
        const auto& list = list_of(g);
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
            const std::int64_t m = cache.rows(g);
            const View3<const TC> kk(cache.k(g).data, {m, 1, d}), vv(cache.v(g).data, {m, 1, d});
            attend_row_double(q.row(h), q.stride[1], kk, vv, 0, list.data(), cnt, static_cast<double>(scale), dp,
                              dout.data());
            for (std::int64_t c = 0; c < d; ++c) store(out(h, c), dout[static_cast<std::size_t>(c)]);
            if (probs_f)
                for (std::int64_t t = 0; t < cnt; ++t) probs_f[h * L + t] = static_cast<float>(dp[static_cast<std::size_t>(t)]);
        }
        if (probs_f) std::fill(probs_f + h * L + cnt, probs_f + (h + 1) * L, 0.0f);
    }
}

template <class Arch, class TQ, class TC, class TO>
float check_indexed_decode(const View2<const TQ>& q, const KvCache<TC>& cache, const CacheRows& rows,
                           const View2<TO>& out, const AttentionOptions& opt, const char* fn) {
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
    if (opt.check_finite) {
        for (std::int64_t h = 0; h < H; ++h)
            for (std::int64_t c = 0; c < d; ++c)
                require(std::isfinite(to_float(q(h, c))), fn, "q[", h, ", ", c, "] = ", to_float(q(h, c)),
                        "; expected finite values (no NaN or Inf)");
        std::vector<float> buf(static_cast<std::size_t>(d));
        for (std::int64_t g = 0; g < Hkv; ++g) {
            const auto& list = rows.size() == 1 ? rows[0] : rows[static_cast<std::size_t>(g)];
            for (auto r : list) {
                widen_row(cache.k(g).data + r * d, 1, buf.data(), d);
                require(Kernels<Arch>::all_finite(buf.data(), d), fn, "cache k row ", r, " of KV head ", g,
                        " is not finite; expected finite values (no NaN or Inf)");
                widen_row(cache.v(g).data + r * d, 1, buf.data(), d);
                require(Kernels<Arch>::all_finite(buf.data(), d), fn, "cache v row ", r, " of KV head ", g,
                        " is not finite; expected finite values (no NaN or Inf)");
            }
        }
    }
    return resolve_scale(opt, d, fn);
}

}  // namespace detail

// One decode step reading only the listed cache rows. q [H, d], out [H, d]; rows: 1 or H_kv lists of
// cache rows (sorted, unique, non-empty).
template <ElementType TQ, ElementType TC, OutputElement TO, class Arch = detail::native_arch>
void indexed_decode_attention(View2<const TQ> q, const KvCache<TC>& cache, const CacheRows& rows, View2<TO> out,
                              const AttentionOptions& opt = {}) {
    constexpr const char* fn = "simd::indexed_decode_attention";
    const float scale = detail::check_indexed_decode<Arch>(q, cache, rows, out, opt, fn);
    detail::run_indexed_decode<Arch>(q, cache, rows, out, scale, nullptr, 0);
    if (opt.check_finite) ::vlsparse::detail::check_narrowed_output(out, fn, "out");
}

// Same, also writing the probabilities: probs [H, L] fp32, contiguous, L the longest list; probs[h, t]
// is the probability of the t-th listed row of head h's KV group, 0 beyond the end of its list.
template <ElementType TQ, ElementType TC, OutputElement TO, class Arch = detail::native_arch>
void indexed_decode_attention(View2<const TQ> q, const KvCache<TC>& cache, const CacheRows& rows, View2<TO> out,
                              View2<float> probs, const AttentionOptions& opt = {}) {
    constexpr const char* fn = "simd::indexed_decode_attention";
    const float scale = detail::check_indexed_decode<Arch>(q, cache, rows, out, opt, fn);
    std::size_t L = 0;
    for (const auto& l : rows) L = std::max(L, l.size());
    detail::require(probs.shape[0] == q.shape[0] && probs.shape[1] == static_cast<std::int64_t>(L), fn,
                    "probs has shape [", probs.shape[0], ", ", probs.shape[1], "], expected [", q.shape[0], ", ", L,
                    "] (H x longest row list)");
    detail::require(probs.is_contiguous(), fn, "probs must be contiguous [H, L]");
    detail::require(!detail::overlaps(probs, out) && !detail::overlaps(probs, q), fn,
                    "output probs aliases out or q; expected separate buffers");
    detail::run_indexed_decode<Arch>(q, cache, rows, out, scale, probs.data, static_cast<std::int64_t>(L));
    if (opt.check_finite) ::vlsparse::detail::check_narrowed_output(out, fn, "out");
}

}  // namespace vlsparse::simd
