// vlsparse/cuda/decode/kernels_mma.cuh -- the tensor-core decode kernel for bf16 and fp16 caches
// (head dims up to 128). Internal to vlsparse/cuda/decode.cuh (namespace vlsparse::cuda::detail).
//
// The same work items, address pipeline and epilogue as decode_kernel (kernels.cuh); the arithmetic
// runs on the tensor cores (mma.sync m16n8k16, bf16 or fp16 in as the cache, fp32 accumulate),
// FlashAttention-2 style:
//   - a tile is 64 rows of K and V (16 per warp), copied with cp.async into shared memory whose 16-byte
//     chunks are XOR-swizzled by row, so that ldmatrix reads are free of bank conflicts;
//   - S = Q K^T with the block's query vectors as the 16 rows of the A operand (up to 8 used), K rows
//     as the 8 columns of B (ldmatrix), so each thread holds the scores of one query vector;
//   - online softmax per warp (its own running max and sum: no block-wide barrier per tile besides the
//     pipeline's), then O += P V with P as the A operand straight from the score fragments and V
//     through ldmatrix.trans;
//   - precision: q and P are split into two halves of the cache's type (x = hi + lo, lo = x - hi
//     rounded) and each product is issued twice, so they carry ~16 (bf16) or ~22 (fp16) significant
//     bits and the result keeps the CUDA-core kernel's tolerance (NMSE <= 1e-9 against the reference
//     for fp32 outputs); K and V are in the operand type already, products are exact in fp32.
//   - q of the cache's own type is exact as an operand: no split (the lo products are skipped, half of
//     Q K^T's mma), and the scale multiplies the scores in fp32 instead of q.
//   - fp16's range (q of another type): q times the softmax scale is first multiplied by a power of two
//     per query vector that brings its largest element to [2^14, 2^15) (no overflow of fp16's 65504, no
//     precision lost to subnormal lo halves), and the scores are multiplied back in fp32 (exact).
// At the end the four warps' states are rescaled to a common max and handed to decode_finish.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "vlsparse/cuda/decode/kernels.cuh"

namespace vlsparse::cuda::detail {

// The low / high element of a pair of T as a float.
template <class T>
__device__ __forceinline__ float lo_float(unsigned x) {
    if constexpr (std::is_same_v<T, bfloat16>) return __uint_as_float(x << 16);
    else return __half2float(__ushort_as_half(static_cast<unsigned short>(x & 0xffffu)));
}
template <class T>
__device__ __forceinline__ float hi_float(unsigned x) {
    if constexpr (std::is_same_v<T, bfloat16>) return __uint_as_float(x & 0xffff0000u);
    else return __half2float(__ushort_as_half(static_cast<unsigned short>(x >> 16)));
}
// x = hi + lo: hi = T(x), lo = T(x - hi); ~16 significant bits for bf16, ~22 for fp16 (in its range).
template <class T>
__device__ __forceinline__ void split_x2(float x0, float x1, unsigned& hi, unsigned& lo) {
    hi = pack_pair<T>(x0, x1);
    lo = pack_pair<T>(x0 - lo_float<T>(hi), x1 - hi_float<T>(hi));
}

template <int D>
struct MmaShape {
    static constexpr int R = 64;                        // rows per tile: 16 per warp
    static constexpr int CPR = D / 8;                   // 16-byte chunks per row
    static constexpr int LPR = 8;                       // lanes per row when copying
    static constexpr int CPL = CPR / LPR;               // chunks per lane
    static constexpr int NSL = kDecodeThreads / LPR;    // row slots when copying
    static constexpr int RPT = R / NSL;                 // rows per thread per tile
    static constexpr int TILE = 2 * R * D * 2;          // K + V bytes of a tile
    // Stages of the ring: d = 64, 4 of 16 KiB; d = 128, 2 of 32 KiB (3 blocks per multiprocessor, one
    // tile in flight per block) or, for a plan sized for 2 blocks per multiprocessor, 3 of 32 KiB (two
    // tiles in flight per block): DecodePlan::blocks_per_sm() decides.
    static constexpr int STAGES = TILE <= 16384 ? 4 : 2;
    static constexpr int KS = D / 16;                   // k-steps of Q K^T
    static_assert(D == 64 || D == 128, "the tensor-core decode kernel takes head dims padded to 64 or 128");
    // Element offset of chunk c of row r in a tile (chunks XOR-swizzled by row).
    __device__ static constexpr int swz(int r, int c) { return (r * CPR + (c ^ (r & 7))) * 8; }
};

template <int D, int NQB, int ST = MmaShape<D>::STAGES>
constexpr std::size_t decode_mma_smem_bytes() {
    using S = MmaShape<D>;
    // Tiles, row indices, q's fragments, then floats: the warps' stats, the block's, the merge's flag
    // (in a slot of 8) and the query vectors' score factors (8).
    return static_cast<std::size_t>(ST) * S::TILE + static_cast<std::size_t>(ST) * S::R * 4 +
           static_cast<std::size_t>(S::KS) * 2 * 32 * 16 + (4 * 8 * 2 + 2 * NQB + 16) * sizeof(float);
}

// TC: the cache's element type, bfloat16 or half. ST: stages of the ring (MmaShape<D>::STAGES, or 3 at
// d = 128 for 2 blocks per multiprocessor).
template <class TC, int D, int NQB, int ST_ = MmaShape<D>::STAGES>
__global__ void __launch_bounds__(kDecodeThreads, (D == 128 && ST_ == 3) ? 2 : 3)
    decode_mma_kernel(const __grid_constant__ DecodeArgs<TC> a) {
    static_assert(std::is_same_v<TC, bfloat16> || std::is_same_v<TC, half>, "bf16 or fp16 caches");
    constexpr bool kF16 = std::is_same_v<TC, half>;
    using S = MmaShape<D>;
    constexpr int R = S::R, LPR = S::LPR, CPL = S::CPL, NSL = S::NSL, RPT = S::RPT, ST = ST_, KS = S::KS;
    constexpr float ninf = -INFINITY;
    extern __shared__ __align__(16) unsigned char smem[];
    TC* kt = reinterpret_cast<TC*>(smem);                                   // [ST][R][D], swizzled
    TC* vt = kt + ST * R * D;                                               // [ST][R][D], swizzled
    std::int32_t* rowbuf = reinterpret_cast<std::int32_t*>(vt + ST * R * D);  // [ST][R]
    uint4* qfrag = reinterpret_cast<uint4*>(rowbuf + ST * R);               // [KS][hi, lo][32 lanes]: {a0, 0, a2, 0}
    float* wstat = reinterpret_cast<float*>(qfrag + KS * 2 * 32);           // [4 warps][8][2]
    float* stat_s = wstat + 4 * 8 * 2;                                      // [NQB][2]
    int* last_flag = reinterpret_cast<int*>(stat_s + 2 * NQB);
    float* qscale = stat_s + 2 * NQB + 8;                                   // [8]: each query vector's score factor

    const DecodeItem it = a.items[blockIdx.x];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int gq = lane >> 2, tq = lane & 3;  // mma fragment coordinates: row group, thread in group
    const int j = tid % LPR, slot = tid / LPR;
    const int G = a.group;
    const int nqv = G * it.q_len;
    const int cnt = it.end - it.begin;
    const int ntiles = (cnt + R - 1) / R;
    const int d = a.head_dim;
    const KvBatchView<const TC>& cache = a.cache;
    const std::int32_t* list = a.indices ? a.indices + it.list_base : nullptr;

    // q fragments of query vector gq (the fragment row), times scale * log2(e), split hi / lo: k-step ks
    // holds columns 16 ks + 2 tq + {0, 1} (a0) and + 8 + {0, 1} (a2). Identical for the four warps:
    // written once to shared memory by warp 0 (registers are the scarce resource here). Warp 0 issues
    // the loads of q, then its share of the prologue's copies, and only then waits for q to build the
    // fragments: when q was converted first, warp 0's copies of the first two tiles went out ~6 us after
    // the other warps' at B = 1 (a per-block timeline, H200), and every block's first tile waited for them.
    // q's 32 loads must also be issued together (load_values: no branch per load); one by one they kept
    // warp 0 from its copies until ~8 us after the block's start (H100 trace; ~4.5 us now).
    float qx[KS * 4];
    if (warp == 0) {
        const int qv = it.qb * NQB + gq;
        const bool ok = gq < NQB && qv < nqv;
        const std::int64_t base = ok ? (it.q_row0 + qv / G) * a.q_s0 + (it.g * G + qv % G) * a.q_s1 : 0;
        load_values(a.q, a.q_type, qx, [&](int x) -> std::int64_t {
            const int c = 16 * (x / 4) + 8 * ((x / 2) & 1) + 2 * tq + (x & 1);
            return ok && c < d ? base + c * a.q_s2 : -1;
        });
    }
    const bool causal = it.q_len > 1;
    RowPipeline<TC, R, NSL, RPT> rows{cache, it, list, slot, cnt, ntiles, a.page_shift, {}, {}, {}, 0};
    // Copies of tile `tile` into stage `st` (= tile % ST, kept by the caller: no division per tile).
    auto issue = [&](int tile, int st) {
        if (tile < ntiles) {
#pragma unroll
            for (int k = 0; k < RPT; ++k) {
                const int r = slot + k * NSL;
                const std::int32_t row = rows.row1[k];
                const bool valid = row >= 0;
                if (causal && j == 0) rowbuf[st * R + r] = row;  // read only by the causal mask
                const std::int64_t off = valid ? rows.offset(k) : 0;
#pragma unroll
                for (int w = 0; w < CPL; ++w) {
                    const int c = j + LPR * w;
                    const bool ok = valid && c * 8 < d;
                    copy16_async(kt + st * R * D + S::swz(r, c), cache.k + off + (ok ? c * 8 : 0), ok);
                    copy16_async(vt + st * R * D + S::swz(r, c), cache.v + off + (ok ? c * 8 : 0), ok);
                }
            }
        }
        copy_commit();
    };
    rows.start();
#pragma unroll
    for (int s = 0; s < ST - 1; ++s) {
        issue(s, s);
        rows.advance(s + 2);
    }
    // q of the cache's own type (the usual engine call) is exact as an mma operand: its fragments are q
    // itself, the lo halves zero and their products skipped, and the softmax scale is applied to the
    // scores in fp32. Other q types carry the scale in the split fragments (fp16: with a shift).
    const bool qexact = a.q_type == dtype_of<TC>();
    if (warp == 0) {
        float sc = a.scale_log2, factor = 1.0f;  // q's multiplier before the split; the scores' after the mma
        if (qexact) {
            sc = 1.0f;
            factor = a.scale_log2;
        } else if constexpr (kF16) {
            // A power of two per query vector: its largest |q * scale| to [2^14, 2^15) (see the header).
            float amax = 0.0f;
#pragma unroll
            for (int x = 0; x < KS * 4; ++x) amax = fmaxf(amax, fabsf(a.scale_log2 * qx[x]));
            amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
            amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
            // amax < 2^(E - 126) for its biased exponent E; shift in [-113, 120] (0 when q is non-finite
            // or zero), so 2^shift and 2^-shift are normal floats built from their exponent bits.
            const int E = static_cast<int>(__float_as_uint(amax) >> 23);
            const int shift = E == 0 || E == 255 ? 0 : min(15 - (E - 126), 120);
            sc = a.scale_log2 * __uint_as_float(static_cast<unsigned>(127 + shift) << 23);
            factor = __uint_as_float(static_cast<unsigned>(127 - shift) << 23);
        }
        if (tq == 0) qscale[gq] = factor;
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) {
            uint4 hi, lo;
            const float* x = qx + 4 * ks;
            split_x2<TC>(sc * x[0], sc * x[1], hi.x, lo.x);
            split_x2<TC>(sc * x[2], sc * x[3], hi.z, lo.z);
            hi.y = hi.w = lo.y = lo.w = 0u;
            qfrag[(2 * ks) * 32 + lane] = hi;
            qfrag[(2 * ks + 1) * 32 + lane] = lo;
        }
    }
    // (The first barrier of the tile loop orders these writes before their reads.)

    float o[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m_run = ninf, l_run = 0.0f;  // this thread's share of its query vector's running max / sum
    const int qv_mine = it.qb * NQB + gq;
    const int limit = it.seq_len - it.q_len + (qv_mine < nqv ? qv_mine / G : 0);
    const bool logits_mine = a.logits && gq < NQB && qv_mine < nqv;
    const int r0 = 16 * warp;  // this warp's rows of every tile

    int st = 0, st_next = ST - 1;  // stage of this tile, stage of the tile issued in this iteration
    for (int tile = 0; tile < ntiles; ++tile, st = st == ST - 1 ? 0 : st + 1, st_next = st_next == ST - 1 ? 0 : st_next + 1) {
        copy_wait<ST - 2>();
        __syncthreads();
        issue(tile + ST - 1, st_next);
        rows.advance(tile + ST + 1);
        const TC* kts = kt + st * R * D;
        const TC* vts = vt + st * R * D;
        const int tcnt = min(R, cnt - tile * R);
        if (r0 >= tcnt) continue;  // this warp's rows are all past the end (last tile only)

        // S = Q K^T for rows r0 .. r0 + 7 (s[0]) and r0 + 8 .. r0 + 15 (s[1]).
        float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
        for (int ks = 0; ks < KS; ks += 2)
#pragma unroll
            for (int ng = 0; ng < 2; ++ng) {
                unsigned b0, b1, b2, b3;
                ldsm_x4(b0, b1, b2, b3, kts + S::swz(r0 + 8 * ng + (lane & 7), 2 * ks + (lane >> 3)));
                const uint4 h0 = qfrag[(2 * ks) * 32 + lane], l0 = qfrag[(2 * ks + 1) * 32 + lane];
                const uint4 h1 = qfrag[(2 * ks + 2) * 32 + lane], l1 = qfrag[(2 * ks + 3) * 32 + lane];
                mma_m16n8k16<TC>(s[ng], h0, b0, b1);
                mma_m16n8k16<TC>(s[ng], h1, b2, b3);
                if (!qexact) {  // (uniform)
                    mma_m16n8k16<TC>(s[ng], l0, b0, b1);
                    mma_m16n8k16<TC>(s[ng], l1, b2, b3);
                }
            }
        // This thread's four scores: query gq, rows r0 + 8 ng + 2 tq + e. The masks and the logits
        // output are each one uniform branch around the four (not one per element).
        float x[4];
        const float factor = qscale[gq];  // scale * log2(e) for exact q; 2^-shift (fp16) or 1 otherwise
#pragma unroll
        for (int ng = 0; ng < 2; ++ng)
#pragma unroll
            for (int e = 0; e < 2; ++e) x[2 * ng + e] = r0 + 8 * ng + 2 * tq + e < tcnt ? s[ng][e] * factor : ninf;
        if (causal) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = r0 + 8 * (e >> 1) + 2 * tq + (e & 1);
                if (r < tcnt && rowbuf[st * R + r] > limit) x[e] = ninf;
            }
        }
        if (logits_mine) {
            const std::int64_t e0 = it.list_base + it.begin + static_cast<std::int64_t>(tile) * R;
            const int hs = (a.lists_per_seq == 1 ? it.g * nqv : 0) + qv_mine;
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = r0 + 8 * (e >> 1) + 2 * tq + (e & 1);
                if (r < tcnt) a.logits[(e0 + r) * a.logit_stride + hs] = x[e];
            }
        }
        // Online softmax of the query vector across the 4 threads of its fragment row.
        float mt = fmaxf(fmaxf(x[0], x[1]), fmaxf(x[2], x[3]));
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 2));
        const float mn = fmaxf(m_run, mt);
        const float al = mn == ninf ? 1.0f : exp2f(m_run - mn);
        float p[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) p[e] = x[e] == ninf ? 0.0f : exp2f(x[e] - mn);
        l_run = l_run * al + (p[0] + p[1] + p[2] + p[3]);
        m_run = mn;
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            o[n][0] *= al;
            o[n][1] *= al;
        }
        // O += P V: P (query gq, rows 2 tq + {0, 1} and + 8) as the A operand, split hi / lo.
        uint4 ph, pl;  // {a0, 0, a2, 0}, built once for the tile's 2 D / 8 products
        split_x2<TC>(p[0], p[1], ph.x, pl.x);
        split_x2<TC>(p[2], p[3], ph.z, pl.z);
        ph.y = ph.w = pl.y = pl.w = 0u;
#pragma unroll
        for (int n = 0; n < D / 8; n += 2) {
            unsigned b0, b1, b2, b3;
            ldsm_x4_t(b0, b1, b2, b3, vts + S::swz(r0 + (lane & 7) + 8 * ((lane >> 3) & 1), n + (lane >> 4)));
            mma_m16n8k16<TC>(o[n], ph, b0, b1);
            mma_m16n8k16<TC>(o[n], pl, b0, b1);
            mma_m16n8k16<TC>(o[n + 1], ph, b2, b3);
            mma_m16n8k16<TC>(o[n + 1], pl, b2, b3);
        }
    }
    copy_wait<0>();
    __syncthreads();

    // Combine the four warps: each warp's state rescaled to the common max of its query vector.
    l_run += __shfl_xor_sync(0xffffffffu, l_run, 1);
    l_run += __shfl_xor_sync(0xffffffffu, l_run, 2);
    if (tq == 0) {
        wstat[(warp * 8 + gq) * 2] = m_run;
        wstat[(warp * 8 + gq) * 2 + 1] = l_run;
    }
    __syncthreads();
    float M = ninf;
#pragma unroll
    for (int w = 0; w < 4; ++w) M = fmaxf(M, wstat[(w * 8 + gq) * 2]);
    const float f = m_run == ninf ? 0.0f : exp2f(m_run - M);
    float* red = reinterpret_cast<float*>(smem);  // [4 warps][NQB][D] in the idle tile buffers
    if (gq < NQB) {
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            red[(warp * NQB + gq) * D + 8 * n + 2 * tq] = o[n][0] * f;
            red[(warp * NQB + gq) * D + 8 * n + 2 * tq + 1] = o[n][1] * f;
        }
        if (warp == 0 && tq == 0) {
            float L = 0.0f;
#pragma unroll
            for (int w = 0; w < 4; ++w) {
                const float mw = wstat[(w * 8 + gq) * 2];
                if (mw != ninf) L += exp2f(mw - M) * wstat[(w * 8 + gq) * 2 + 1];
            }
            stat_s[2 * gq] = M;
            stat_s[2 * gq + 1] = L;
        }
    }
    __syncthreads();
    decode_finish<NQB, D, 4>(a, it, red, stat_s, wstat, last_flag);
}

}  // namespace vlsparse::cuda::detail
