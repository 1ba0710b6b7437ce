// vlsparse/cuda/prefill/kernels_simt.cuh -- the prefill attention kernel on CUDA cores: what the
// tensor-core kernel (kernels_mma.cuh) does not take -- fp32 inputs and head dims other than 64 / 128
// (any d <= 256) -- and, on request (PrefillKernel::simt), any input, as a second implementation of
// the same front ends. Internal to vlsparse/cuda/prefill.cuh (namespace vlsparse::cuda::detail).
//
// It reads the same launch description (PrefillArgs: rows, key lists, the block-sparse items and
// segments, the template / video mask) and the same grid as the tensor-core kernel, and splits each
// block the same way (prefill_block_work); only the arithmetic differs. Each warp takes one (query row,
// query head) pair at a time: the row of q, scaled into the log2 domain, in shared memory; 32 keys at a
// time, one per lane (the lane's dot product over d, the mask decided per key); the tile's maximum and
// the online softmax across lanes; then O += P V with each lane owning d / 32 output columns (V rows
// read whole by the warp, coalesced). Everything in fp32, P unrounded: for 16-bit inputs this is more
// accurate than the tensor-core kernel, which rounds P to the input type. No tensor cores and no reuse
// of a K / V row beyond the L1 / L2 caches: a path for fp32, odd head dims and checking, far slower
// than the tensor-core kernel on long prompts (docs/cuda.md has the measured rate).
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

// C: output columns per lane (d <= 32 C).
template <class T, class TO, int C>
__global__ void __launch_bounds__(kPrefillThreads) prefill_simt_kernel(const PrefillArgs a, int d) {
    __shared__ float sq_all[kPrefillSimtWarps][32 * C];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const PrefillBlockWork w = prefill_block_work(a, kPrefillRows);
    if (w.m_count <= 0) return;
    const PrefillSegment* segs = w.segs ? w.segs : &w.one;
    const bool masked = a.mask.token_image != nullptr;
    const T* kbase = static_cast<const T*>(a.k) + static_cast<std::int64_t>(w.g) * a.k_s1;
    const T* vbase = static_cast<const T*>(a.v) + static_cast<std::int64_t>(w.g) * a.v_s1;
    float* sq = sq_all[warp];
    bool bad = false;
    for (int lm = warp; lm < w.m_count; lm += kPrefillSimtWarps) {
        int pos, head;
        w.row(a, lm, pos, head);
        const T* qrow = static_cast<const T*>(a.q) + static_cast<std::int64_t>(pos - a.q_offset) * a.q_s0 +
                        static_cast<std::int64_t>(head) * a.q_s1;
        __syncwarp();
        for (int c = lane; c < d; c += 32) sq[c] = load_f(qrow + c) * a.scale_log2;
        __syncwarp();
        const MaskRow mr = masked ? mask_row(a.mask, pos, head) : MaskRow{};
        float m = -INFINITY, l = 0.0f, acc[C];
#pragma unroll
        for (int i = 0; i < C; ++i) acc[i] = 0.0f;
        for (int sg = w.seg_begin; sg < w.seg_end; ++sg) {
            const PrefillSegment s = segs[sg];
            for (int e0 = s.lo; e0 < s.hi; e0 += 32) {
                // Causal segments hold ascending positions: nothing more for this row past its position.
                if (s.kind == kSegCausal && (w.klist ? __ldg(w.klist + e0) : e0) > pos) break;
                // This lane's key: entry e0 + lane.
                const int e = e0 + lane;
                int j = -1;
                bool ok = false;
                if (e < s.hi) {
                    j = w.klist ? __ldg(w.klist + e) : e;
                    if (s.kind == kSegFull) ok = true;
                    else if (s.kind == kSegCausal) ok = j <= pos;
                    else ok = mask_allows(a.mask, mr, pos, j, __ldg(a.mask.token_image + j), __ldg(a.mask.token_sink + j) != 0);
                }
                const unsigned live = __ballot_sync(0xffffffffu, ok);
                if (live == 0u) continue;
                float sc = -INFINITY;
                if (ok) {
                    const T* krow = kbase + static_cast<std::int64_t>(j) * a.k_s0;
                    float dot = 0.0f;
                    for (int c = 0; c < d; ++c) dot = fmaf(sq[c], load_f(krow + c), dot);
                    sc = dot;
                }
                const float mt = warp_max(sc);
                const float mn = fmaxf(m, mt);
                const float corr = exp2f(m - mn);  // m = -inf on the first tile: 0
                const float p = ok ? exp2f(sc - mn) : 0.0f;
                l = l * corr + warp_sum(p);
#pragma unroll
                for (int i = 0; i < C; ++i) acc[i] *= corr;
                m = mn;
                unsigned left = live;
                while (left) {
                    const int src = __ffs(left) - 1;
                    left &= left - 1u;
                    const float ps = __shfl_sync(0xffffffffu, p, src);
                    const int js = __shfl_sync(0xffffffffu, j, src);
                    const T* vrow = vbase + static_cast<std::int64_t>(js) * a.v_s0;
#pragma unroll
                    for (int i = 0; i < C; ++i) {
                        const int c = lane + 32 * i;
                        if (c < d) acc[i] = fmaf(ps, load_f(vrow + c), acc[i]);
                    }
                }
            }
        }
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        TO* dst = static_cast<TO*>(a.out) + static_cast<std::int64_t>(pos - a.q_offset) * a.o_s0 +
                  static_cast<std::int64_t>(head) * a.o_s1;
#pragma unroll
        for (int i = 0; i < C; ++i) {
            const int c = lane + 32 * i;
            if (c >= d) continue;
            const float x = acc[i] * inv;
            bad |= !isfinite(x) || (l > 0.0f && !isfinite(l));
            store_f(dst + static_cast<std::int64_t>(c) * a.o_s2, x);
        }
    }
    if (a.status && __any_sync(0xffffffffu, bad) && lane == 0) atomicOr(a.status, 1);
}

}  // namespace vlsparse::cuda::detail
