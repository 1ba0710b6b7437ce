// vlsparse/attention/masked.hpp -- block-masked attention, CPU fast path (namespace vlsparse::simd).
//
//   O[i,h,:] = sum_{j : mask_h(i, j)} softmax_j(scale * q_{i,h} . k_{j,g}) v_{j,g},   g = h / (H / H_kv)
//
// The mask is a BlockMask (masks/block_mask.hpp): for each (query head, query block) only the listed
// key blocks are computed; fully allowed blocks without any mask test, partly allowed blocks with the
// mask evaluated per row from the mask's key intervals; skipped blocks cost nothing, so the work
// scales with the allowed pairs (plus the partial blocks' slack), not with n^2. Prefill only
// (n_q == n_k == mask.n). fp32 accumulation, Eigen GEMMs per block and the xsimd softmax kernels of
// the dense engine (attention/dense.hpp), online softmax over the listed blocks (adjacent listed
// blocks merged, and runs of short non-adjacent ranges gathered, into chunks of up to
// VLSPARSE_SIMD_K_CHUNK keys), OpenMP over
// (query head, query block). Rows whose fp32 result overflows are recomputed in double.
// Same semantics as vlsparse::reference::masked_attention. Include: <vlsparse/attention/masked.hpp>
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "vlsparse/attention/dense.hpp"
#include "vlsparse/masks/block_mask.hpp"

namespace vlsparse {
namespace detail {

template <class TQ, class TK, class TO>
void check_masked_args(const View3<const TQ>& q, const View3<const TK>& k, const View3<const TK>& v,
                       const BlockMask& bm, const View3<TO>& out, const char* fn) {
    check_qkv(q, k, v, fn);
    const std::int64_t n = q.shape[0], H = q.shape[1], d = q.shape[2];
    require(k.shape[0] == n, fn, "q has ", n, " tokens and k has ", k.shape[0], ", expected equal (masked prefill)");
    require(bm.n == n, fn, "block mask covers ", bm.n, " tokens, the input has ", n, "; expected equal");
    require(bm.heads == H, fn, "block mask has ", bm.heads, " heads, q has ", H, " query heads; expected equal");
    require(bm.q_block >= 1 && bm.k_block >= 1 && static_cast<std::int64_t>(bm.q_block_start.size()) == bm.n_q_blocks + 1 &&
                bm.q_block_start.front() == 0 && bm.q_block_start.back() == n &&
                bm.n_k_blocks == (n + bm.k_block - 1) / bm.k_block &&
                static_cast<std::int64_t>(bm.full_offsets.size()) == H * bm.n_q_blocks + 1 &&
                static_cast<std::int64_t>(bm.partial_offsets.size()) == H * bm.n_q_blocks + 1 &&
                bm.partial_key_lo.size() == bm.partial_indices.size() &&
                bm.partial_key_hi.size() == bm.partial_indices.size() &&
                bm.full_offsets.back() == static_cast<std::int64_t>(bm.full_indices.size()) &&
                bm.partial_offsets.back() == static_cast<std::int64_t>(bm.partial_indices.size()) &&
                static_cast<std::int64_t>(bm.head_template.size()) == H && bm.context.n == n,
            fn, "block mask is inconsistent (block counts or offsets do not match n = ", n, ", H = ", H,
            "); expected a mask from make_block_mask");
    check_out3(out, {n, H, d}, q, k, v, fn, "out");
}

}  // namespace detail

namespace simd {
namespace detail {

// One (query head, query block) of masked attention: Q [nr, d] packed at sc.q, keys and values of the
// KV head in ks (all n rows). Key ranges [lo_[b], hi_[b]) ascending (full blocks, and partial blocks
// trimmed to their allowed range; flag in `part`).
// Row r's allowed keys inside partial blocks come from `iv` (intervals of row r at iv_off[r]).
template <class Arch>
void attend_block_masked(const float* Q, std::int64_t nr, std::int64_t d, const KeySet& ks, const std::int64_t* lo_,
                         const std::int64_t* hi_, const std::uint8_t* part, std::int64_t nblocks,
                         const std::vector<KeyInterval>& iv, const std::vector<std::int64_t>& iv_off, float scale,
                         std::int64_t kc_max, float* gk, float* gv, Scratch& sc) {
    using K = Kernels<Arch>;
    constexpr float ninf = -std::numeric_limits<float>::infinity();
    float* O = sc.o.data();
    float* S = sc.s.data();
    float* m = sc.m.data();
    float* l = sc.l.data();
    for (std::int64_t r = 0; r < nr; ++r) {
        m[r] = ninf;
        l[r] = 0.0f;
        sc.bad[static_cast<std::size_t>(r)] = 0;
    }
    std::fill(O, O + nr * d, 0.0f);
    const CMapR Qm(Q, nr, d, Eigen::OuterStride<>(d));
    MapR Om(O, nr, d, Eigen::OuterStride<>(d));
    std::vector<std::int64_t>& cur = sc.rows;  // per-row cursor into its intervals (ascending blocks)
    for (std::int64_t r = 0; r < nr; ++r) cur[static_cast<std::size_t>(r)] = iv_off[static_cast<std::size_t>(r)];
    // Consecutive ranges are grouped into chunks of at most kc_max keys; a chunk of several ranges
    // (short, non-contiguous: sink strips, text strips) is gathered into gk/gv so that it runs as one
    // GEMM instead of many narrow ones.
    for (std::int64_t b = 0; b < nblocks;) {
        std::int64_t e = b + 1, kc = hi_[b] - lo_[b];
        while (e < nblocks && kc + (hi_[e] - lo_[e]) <= kc_max) {
            kc += hi_[e] - lo_[e];
            ++e;
        }
        const float *kptr = ks.k + lo_[b] * ks.ldk, *vptr = ks.v + lo_[b] * ks.ldv;
        std::int64_t ldk = ks.ldk, ldv = ks.ldv;
        if (e - b > 1) {
            std::int64_t off = 0;
            for (std::int64_t x = b; x < e; ++x)
                for (std::int64_t j = lo_[x]; j < hi_[x]; ++j, ++off) {
                    std::memcpy(gk + off * d, ks.k + j * ks.ldk, static_cast<std::size_t>(d) * sizeof(float));
                    std::memcpy(gv + off * d, ks.v + j * ks.ldv, static_cast<std::size_t>(d) * sizeof(float));
                }
            kptr = gk;
            vptr = gv;
            ldk = ldv = d;
        }
        MapR Sm(S, nr, kc, Eigen::OuterStride<>(kc));
        const CMapR Km(kptr, kc, d, Eigen::OuterStride<>(ldk));
        const CMapR Vm(vptr, kc, d, Eigen::OuterStride<>(ldv));
        Sm.noalias() = scale * (Qm * Km.transpose());
        bool masked = false;
        for (std::int64_t x = b; x < e; ++x) masked |= part[x] != 0;
        for (std::int64_t r = 0; r < nr; ++r) {
            float* srow = S + r * kc;
            if (masked) {  // -inf outside the row's intervals, piece by piece (pieces ascending)
                std::int64_t off = 0;
                for (std::int64_t x = b; x < e; ++x) {
                    const std::int64_t c0 = lo_[x], kx = hi_[x] - lo_[x];
                    float* seg = srow + off;
                    off += kx;
                    if (!part[x]) continue;
                    std::int64_t t = cur[static_cast<std::size_t>(r)];
                    const std::int64_t tend = iv_off[static_cast<std::size_t>(r) + 1];
                    while (t < tend && iv[static_cast<std::size_t>(t)].hi <= c0) ++t;
                    cur[static_cast<std::size_t>(r)] = t;
                    std::int64_t pos = 0;
                    for (; t < tend && iv[static_cast<std::size_t>(t)].lo < c0 + kx; ++t) {
                        const std::int64_t lo = std::max<std::int64_t>(iv[static_cast<std::size_t>(t)].lo - c0, 0);
                        const std::int64_t hi = std::min<std::int64_t>(iv[static_cast<std::size_t>(t)].hi - c0, kx);
                        std::fill(seg + pos, seg + lo, ninf);
                        pos = hi;
                    }
                    std::fill(seg + pos, seg + kx, ninf);
                }
            }
            const float mx = K::max(srow, kc);
            const float mnew = std::max(m[r], mx);
            if (mnew == ninf) {  // nothing allowed so far in this row
                std::fill(srow, srow + kc, 0.0f);
                continue;
            }
            const float alpha = m[r] == ninf ? 0.0f : std::exp(m[r] - mnew);
            const float sum = K::exp_sub_sum(srow, kc, mnew);  // exp(-inf) = 0 for masked entries
            if (alpha != 1.0f) K::scale(O + r * d, d, alpha);
            l[r] = l[r] * alpha + sum;
            m[r] = mnew;
        }
        Om.noalias() += Sm * Vm;
        b = e;
    }
    for (std::int64_t r = 0; r < nr; ++r) {
        float* orow = O + r * d;
        if (!(l[r] > 0.0f) || !std::isfinite(l[r])) {
            sc.bad[static_cast<std::size_t>(r)] = 1;
            continue;
        }
        K::scale(orow, d, 1.0f / l[r]);
        bool finite = true;
        for (std::int64_t c = 0; c < d; ++c) finite &= std::isfinite(orow[c]);
        if (!finite) sc.bad[static_cast<std::size_t>(r)] = 1;
    }
}

template <class Arch, class TQ, class TK, class TO>
void run_masked_attention(const View3<const TQ>& q, const View3<const TK>& k, const View3<const TK>& v,
                          const BlockMask& bm, const View3<TO>& out, float scale) {
    const std::int64_t n = q.shape[0], H = q.shape[1], d = q.shape[2], Hkv = k.shape[1];
    const std::int64_t group = H / Hkv, KB = bm.k_block;
    std::int64_t QB = 1;  // largest query block
    for (std::int64_t b = 0; b < bm.n_q_blocks; ++b)
        QB = std::max(QB, bm.q_block_start[static_cast<std::size_t>(b) + 1] - bm.q_block_start[static_cast<std::size_t>(b)]);
    const bool in_place = usable_in_place(k) && usable_in_place(v);
    std::vector<float> kp, vp;
    if (!in_place) {
        kp.resize(static_cast<std::size_t>(n * d));
        vp.resize(static_cast<std::size_t>(n * d));
    }
    const int nthreads = max_threads();
    std::vector<Scratch> scratch(static_cast<std::size_t>(nthreads));
    // Keys per GEMM: contiguous listed blocks are merged up to the dense engine's chunk (or one block).
    const std::int64_t kc_max = std::min(n, std::max(KB, kKChunk));
    for (auto& s : scratch) s.reserve(QB, d, kc_max);
    struct Extra {
        std::vector<KeyInterval> iv, row_iv;
        std::vector<std::int64_t> iv_off, blocks, his, keys;
        std::vector<std::uint8_t> part;
        std::vector<float> gk, gv;  // gathered keys / values of a chunk of short ranges
    };
    std::vector<Extra> extra(static_cast<std::size_t>(nthreads));
    for (auto& x : extra) {
        x.gk.resize(static_cast<std::size_t>(kc_max * d));
        x.gv.resize(static_cast<std::size_t>(kc_max * d));
    }
    constexpr std::int64_t kPackRows = 256;
    ErrorSlot err;

    VLSPARSE_OMP(omp parallel num_threads(nthreads))
    {
        Scratch& sc = scratch[static_cast<std::size_t>(thread_id())];
        Extra& ex = extra[static_cast<std::size_t>(thread_id())];
        for (std::int64_t g = 0; g < Hkv; ++g) {
            KeySet ks;
            ks.n = n;
            if (in_place) {
                ks.k = in_place_rows(k, g);
                ks.ldk = n == 1 ? d : k.stride[0];
                ks.v = in_place_rows(v, g);
                ks.ldv = n == 1 ? d : v.stride[0];
            } else {
                ks.k = kp.data();
                ks.v = vp.data();
                ks.ldk = ks.ldv = d;
                const std::int64_t nchunks = (n + kPackRows - 1) / kPackRows;
                VLSPARSE_OMP(omp for schedule(static))
                for (std::int64_t c = 0; c < nchunks; ++c) {
                    err.run([&] {
                        const std::int64_t t0 = c * kPackRows, t1 = std::min(n, t0 + kPackRows);
                        pack_rows(k, g, nullptr, t0, t1, kp.data());
                        pack_rows(v, g, nullptr, t0, t1, vp.data());
                    });
                }
            }
            const std::int64_t items = bm.n_q_blocks * group;
            VLSPARSE_OMP(omp for schedule(dynamic, 1))
            for (std::int64_t w = 0; w < items; ++w) {
                err.run([&] {
                    const std::int64_t h = g * group + w % group;
                    const std::int64_t qb = bm.n_q_blocks - 1 - w / group;  // later blocks first (more keys)
                    const std::int64_t r0 = bm.q_block_start[static_cast<std::size_t>(qb)];
                    const std::int64_t nr = bm.q_block_start[static_cast<std::size_t>(qb) + 1] - r0;
                    const MaskTemplate t = bm.head_template[static_cast<std::size_t>(h)];
                    // Merge the full and partial key blocks in ascending order.
                    const auto full = bm.full(h, qb), partial = bm.partial(h, qb);
                    const auto prow = static_cast<std::size_t>(h * bm.n_q_blocks + qb);
                    const std::int64_t p0 = bm.partial_offsets[prow];
                    ex.blocks.clear();
                    ex.his.clear();
                    ex.part.clear();
                    std::size_t a = 0, b = 0;
                    while (a < full.size() || b < partial.size()) {
                        const bool take_full = b == partial.size() || (a < full.size() && full[a] < partial[b]);
                        if (take_full) {
                            ex.blocks.push_back(full[a] * KB);
                            ex.his.push_back(std::min(n, (full[a] + 1) * KB));
                            ++a;
                        } else {
                            ex.blocks.push_back(bm.partial_key_lo[static_cast<std::size_t>(p0) + b]);
                            ex.his.push_back(bm.partial_key_hi[static_cast<std::size_t>(p0) + b]);
                            ++b;
                        }
                        ex.part.push_back(take_full ? 0 : 1);
                        // Contiguous ranges merge into chunks of up to kc_max keys (fewer, larger GEMMs);
                        // a merged chunk is masked when any piece of it is partial.
                        const std::size_t m = ex.blocks.size();
                        if (m >= 2 && ex.his[m - 2] == ex.blocks[m - 1] && ex.his[m - 1] - ex.blocks[m - 2] <= kc_max) {
                            ex.his[m - 2] = ex.his[m - 1];
                            ex.part[m - 2] = static_cast<std::uint8_t>(ex.part[m - 2] | ex.part[m - 1]);
                            ex.blocks.pop_back();
                            ex.his.pop_back();
                            ex.part.pop_back();
                        }
                    }
                    // Rows' key intervals (needed for partial blocks and the double fallback).
                    ex.iv.clear();
                    ex.iv_off.assign(1, 0);
                    for (std::int64_t r = 0; r < nr; ++r) {
                        if (!partial.empty()) {
                            bm.context.row_intervals(t, r0 + r, ex.row_iv);
                            ex.iv.insert(ex.iv.end(), ex.row_iv.begin(), ex.row_iv.end());
                        }
                        ex.iv_off.push_back(static_cast<std::int64_t>(ex.iv.size()));
                        widen_row(q.row(r0 + r, h), q.stride[2], sc.q.data() + r * d, d);
                    }
                    attend_block_masked<Arch>(sc.q.data(), nr, d, ks, ex.blocks.data(), ex.his.data(), ex.part.data(),
                                              static_cast<std::int64_t>(ex.blocks.size()), ex.iv, ex.iv_off, scale,
                                              kc_max, ex.gk.data(), ex.gv.data(), sc);
                    for (std::int64_t r = 0; r < nr; ++r) {
                        const std::int64_t i = r0 + r;
                        TO* dst = out.row(i, h);
                        if (sc.bad[static_cast<std::size_t>(r)]) {
                            bm.context.row_intervals(t, i, ex.row_iv);
                            ex.keys.clear();
                            for (const auto& x : ex.row_iv)
                                for (std::int64_t j = x.lo; j < x.hi; ++j) ex.keys.push_back(j);
                            attend_row_double(q.row(i, h), q.stride[2], k, v, g, ex.keys.data(),
                                              static_cast<std::int64_t>(ex.keys.size()), static_cast<double>(scale),
                                              sc.dp, sc.dout.data());
                            for (std::int64_t c = 0; c < d; ++c)
                                store(dst[c * out.stride[2]], sc.dout[static_cast<std::size_t>(c)]);
                        } else {
                            store_row(dst, out.stride[2], sc.o.data() + r * d, d);
                        }
                    }
                });
            }
        }
    }
    err.rethrow();
}

}  // namespace detail

// Block-masked prefill attention. q [n, H, d], k, v [n, H_kv, d], out [n, H, d]; mask.n == n and
// mask.heads == H (one template per query head; GQA heads share the packed K/V of their group).
template <ElementType TQ, ElementType TK, OutputElement TO, class Arch = detail::native_arch>
void masked_attention(View3<const TQ> q, View3<const TK> k, View3<const TK> v, const BlockMask& mask, View3<TO> out,
                      const AttentionOptions& opt = {}) {
    constexpr const char* fn = "simd::masked_attention";
    ::vlsparse::detail::check_masked_args(q, k, v, mask, out, fn);
    if (opt.check_finite) detail::check_all_finite(q, k, v, fn);
    const float scale = detail::resolve_scale(opt, q.shape[2], fn);
    detail::run_masked_attention<Arch>(q, k, v, mask, out, scale);
}

}  // namespace simd
}  // namespace vlsparse
