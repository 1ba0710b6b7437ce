// vlsparse/cuda/prefill/kernels_simt.cuh -- the prefill attention kernel on CUDA cores: what the
// tensor-core kernel (kernels_mma.cuh) does not take -- fp32 inputs and head dims other than 64 / 128
// (any d <= 256) -- and, on request (PrefillKernel::simt), any input, as a second implementation of
// the same front ends. Internal to vlsparse/cuda/prefill.cuh (namespace vlsparse::cuda::detail).
//
// It reads the same launch description (PrefillArgs: rows, key lists, the block-sparse items and
// segments, the template / video mask) and the same grid as the tensor-core kernel, and splits each
// block the same way (prefill_block_work); only the arithmetic differs. The block walks its key
// segments in tiles of 32 keys (16 for d > 128), staged in shared memory in fp32 by all its threads
// (coalesced row loads), and every warp computes R (query row, head) pairs of the block against each
// tile: one key per lane (the lane's dot product over d from the staged tile, the mask decided per
// key), the tile's maximum and the online softmax across lanes, then O += P V with each lane owning
// d / 32 output columns. Everything in fp32, P unrounded: for 16-bit inputs this is more accurate than
// the tensor-core kernel, which rounds P to the input type. No tensor cores: a path for fp32, odd head
// dims and checking, far slower than the tensor-core kernel on long prompts (docs/cuda.md has the
// measured rate).
//
// Outputs and status as the tensor-core kernel: o = (sum p v) / (sum p), 0 for a row that sees no key;
// a non-finite output sets bit 1 of *status.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "vlsparse/cuda/common.cuh"
#include "vlsparse/cuda/prefill/kernels_mma.cuh"

namespace vlsparse::cuda::detail {

inline constexpr int kPrefillSimtMaxDim = 256;  // head dims 1 .. 256
inline constexpr int kPrefillSimtWarps = kPrefillThreads / 32;

// The shape for C output columns per lane (d <= 32 C): R rows per warp in a pass (the block's 8 warps
// take 8 R rows of its m rows at a time), TK keys per staged tile, K's rows padded by one element (lane
// kk reads row kk of the tile: with the pad, the 32 lanes hit 32 banks). Static shared memory < 48 KiB.
template <int C>
struct SimtShape {
    static constexpr int D = 32 * C;
    static constexpr int R = C == 2 ? 4 : (C == 4 ? 2 : 1);
    static constexpr int TK = C <= 4 ? 32 : 16;
    static constexpr int KP = D + 1;
};

template <class T, class TO, int C>
__global__ void __launch_bounds__(kPrefillThreads) prefill_simt_kernel(const PrefillArgs a, int d) {
    using S = SimtShape<C>;
    __shared__ float sk[S::TK][S::KP];
    __shared__ float sv[S::TK][S::D];
    __shared__ float sq[kPrefillSimtWarps][S::R][S::D];
    __shared__ int spos[S::TK], simg[S::TK];
    __shared__ unsigned char ssink[S::TK];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const PrefillBlockWork w = prefill_block_work(a, kPrefillRows);
    if (w.m_count <= 0) return;
    const PrefillSegment* segs = w.segs ? w.segs : &w.one;
    const bool masked = a.mask.context.token_image != nullptr;
    const T* kbase = static_cast<const T*>(a.k) + static_cast<std::int64_t>(w.g) * a.k_s1;
    const T* vbase = static_cast<const T*>(a.v) + static_cast<std::int64_t>(w.g) * a.v_s1;
    constexpr int kPass = kPrefillSimtWarps * S::R;
    bool bad = false;
    for (int base = 0; base < w.m_count; base += kPass) {
        // This warp's rows of the pass (position -1: none), and the pass's last position (block-uniform).
        int pos[S::R], head[S::R];
        MaskRow mr[S::R];
        float m[S::R], l[S::R], acc[S::R][C];
        int last = -1;
        for (int i = 0; i < kPass; ++i) {
            int p, h;
            w.row(a, base + i, p, h);
            last = max(last, p);
        }
#pragma unroll
        for (int r = 0; r < S::R; ++r) {
            w.row(a, base + warp * S::R + r, pos[r], head[r]);
            mr[r] = masked && pos[r] >= 0 ? mask_row(a.mask, pos[r], head[r]) : MaskRow{};
            m[r] = -INFINITY;
            l[r] = 0.0f;
#pragma unroll
            for (int i = 0; i < C; ++i) acc[r][i] = 0.0f;
            if (pos[r] >= 0) {
                const T* qrow = static_cast<const T*>(a.q) + static_cast<std::int64_t>(pos[r] - a.q_offset) * a.q_s0 +
                                static_cast<std::int64_t>(head[r]) * a.q_s1;
                for (int c = lane; c < d; c += 32) sq[warp][r][c] = load_f(qrow + c) * a.scale_log2;
            }
        }
        __syncwarp();
        for (int sg = w.seg_begin; sg < w.seg_end; ++sg) {
            PrefillSegment s = segs[sg];
            // A diagonal segment's keys are evaluated through the mask (the plan guarantees that its only
            // allowed pairs are the diagonal ones): the same pairs, on the general path.
            if (s.kind == kSegDiagonal) s.kind = kSegGeneral;
            for (int e0 = s.lo; e0 < s.hi; e0 += S::TK) {
                // Causal segments hold ascending positions: nothing more for this pass's rows.
                if (s.kind == kSegCausal && (w.klist ? __ldg(w.klist + e0) : e0) > last) break;
                __syncthreads();  // the previous tile is consumed
                const int nk = min(S::TK, s.hi - e0);
                if (tid < S::TK) {
                    const int j = tid < nk ? (w.klist ? __ldg(w.klist + e0 + tid) : e0 + tid) : -1;
                    spos[tid] = j;
                    if (masked && s.kind == kSegGeneral) {
                        simg[tid] = j < 0 ? -1 : __ldg(a.mask.context.token_image + j);
                        ssink[tid] = j < 0 ? 0 : __ldg(a.mask.context.token_sink + j);
                    }
                }
                for (int x = tid; x < nk * d; x += kPrefillThreads) {
                    const int kk = x / d, c = x - kk * d;
                    const int j = w.klist && !a.keys_kept ? __ldg(w.klist + e0 + kk) : e0 + kk;  // the source row
                    sk[kk][c] = load_f(kbase + static_cast<std::int64_t>(j) * a.k_s0 + c);
                    sv[kk][c] = load_f(vbase + static_cast<std::int64_t>(j) * a.v_s0 + c);
                }
                __syncthreads();
#pragma unroll
                for (int r = 0; r < S::R; ++r) {
                    if (pos[r] < 0) continue;  // warp-uniform
                    // This lane's key: tile entry `lane`.
                    const int j = lane < S::TK ? spos[lane] : -1;
                    bool ok = false;
                    if (j >= 0) {
                        if (s.kind == kSegFull) ok = true;
                        else if (s.kind == kSegCausal) ok = j <= pos[r];
                        else ok = mask_allows(a.mask, mr[r], pos[r], j, simg[lane], ssink[lane] != 0);
                    }
                    const unsigned live = __ballot_sync(0xffffffffu, ok);
                    if (live == 0u) continue;
                    float sc = -INFINITY;
                    if (ok) {
                        float dot = 0.0f;
                        for (int c = 0; c < d; ++c) dot = fmaf(sq[warp][r][c], sk[lane][c], dot);
                        sc = dot;
                    }
                    const float mt = warp_max(sc);
                    const float mn = fmaxf(m[r], mt);
                    const float corr = exp2f(m[r] - mn);  // m = -inf on the first tile: 0
                    const float p = ok ? exp2f(sc - mn) : 0.0f;
                    l[r] = l[r] * corr + warp_sum(p);
#pragma unroll
                    for (int i = 0; i < C; ++i) acc[r][i] *= corr;
                    m[r] = mn;
                    unsigned left = live;
                    while (left) {
                        const int src = __ffs(left) - 1;
                        left &= left - 1u;
                        const float ps = __shfl_sync(0xffffffffu, p, src);
#pragma unroll
                        for (int i = 0; i < C; ++i) {
                            const int c = lane + 32 * i;
                            if (c < d) acc[r][i] = fmaf(ps, sv[src][c], acc[r][i]);
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int r = 0; r < S::R; ++r) {
            if (pos[r] < 0) continue;
            if (a.lse && lane == 0)
                a.lse[static_cast<std::int64_t>(pos[r] - a.q_offset) * a.lse_s0 + static_cast<std::int64_t>(head[r]) * a.lse_s1] =
                    l[r] > 0.0f ? (m[r] + log2f(l[r])) * 0.6931471805599453f : -INFINITY;
            const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
            TO* dst = static_cast<TO*>(a.out) + static_cast<std::int64_t>(pos[r] - a.q_offset) * a.o_s0 +
                      static_cast<std::int64_t>(head[r]) * a.o_s1;
#pragma unroll
            for (int i = 0; i < C; ++i) {
                const int c = lane + 32 * i;
                if (c >= d) continue;
                const float x = acc[r][i] * inv;
                bad |= !isfinite(x) || (l[r] > 0.0f && !isfinite(l[r]));
                store_f(dst + static_cast<std::int64_t>(c) * a.o_s2, x);
            }
        }
        __syncthreads();  // sq of this pass read by its owner only, but the next pass's first tile
                          // must not overwrite sk / sv while a warp still computes on them
    }
    if (a.status && __any_sync(0xffffffffu, bad) && lane == 0) atomicOr(a.status, 1);
}

}  // namespace vlsparse::cuda::detail
