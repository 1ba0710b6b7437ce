// vlsparse/cuda/selection/probe_scores.cuh -- column sums of probe attention on the GPU: the scoring
// core of ZipVL (probe rows, Eq. A) and of every policy that sums an observation window's attention
// over the keys (SnapKV, PureKV's window scores). Internal to the selection front ends (namespace
// vlsparse::cuda::detail).
//
// For KV head g, its query heads h (qpk = H / H_kv of them) and the probe positions P (ascending):
//
//   lse[h,p]   = log2 sum_{j <= p} 2^(c q_{p,h} . k_{j,g})              c = scale * log2(e)   (pass 1)
//   col[g, j]  = sum_{h of g} sum_{p in P, p >= j} 2^(c q_{p,h} . k_{j,g} - lse[h,p])        (pass 2)
//
// No |P| x n matrix is stored: pass 1 keeps one running (max, sum) per probe row and split of the keys,
// pass 2 recomputes the scores and sums them straight into the columns. Rows are (query head of the
// group, probe) pairs, head-major, each head's probes padded to a multiple of 16 (padding rows see no
// key). Both passes are deterministic: every sum is taken in a fixed order, no floating-point atomics.
//
// Two implementations of the same arithmetic:
//   - tensor cores (fp32 accumulation) when q and k share a 16-bit type (bf16 or fp16) and d <= 128:
//     the inputs enter the tensor cores unrounded (q is not pre-scaled), so every product is exact and
//     the scores carry fp32 accumulation error only. On Hopper with sm_90a code and 64 probes or more,
//     wgmma over 64-row chunks (probe_cols_wg_kernel, below); otherwise mma.sync m16n8k16, both passes
//     one kernel:
//     a block owns 128 keys of one KV head (32 per warp, held as B fragments in registers for the whole
//     block) and streams the probe rows' A fragments (packed once by probe_pack_mma_kernel) through a
//     deep cp.async pipeline, skipping every 16-row chunk whose probes all lie before its first key
//     (causal). Pass 1 writes (max, sum) per row and key block, a small kernel turns them into lse;
//     pass 2 sums the probabilities into its keys. Every block has the same shape of work, whatever
//     the probe positions.
//   - CUDA cores for every other input (fp32, mixed types, d up to 256): one warp per probe row in
//     pass 1, one thread per key in pass 2, fp32 arithmetic.
// And for at most kProbeFewRows rows per KV head of 16-bit inputs (FastV's and A-VL's last row), a
// kernel of its own: every row against a 128-key tile at once, the logits kept between the passes
// (probe_few_kernel, at the end of this file).
// The loads that read q's probe rows and every element of K also check them: NaN / Inf in anything
// the selection reads sets a status bit (no separate pass over the inputs).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "vlsparse/core/tensor.hpp"
#include "vlsparse/cuda/common.cuh"
#include "vlsparse/cuda/hopper.cuh"

namespace vlsparse::cuda::detail {

inline constexpr int kProbeThreads = 128;  // 4 warps per block in both passes
inline constexpr int kProbeKeyTile = 64;   // keys per pass-1 tile
inline constexpr int kProbeColTile = 128;  // keys per pass-2 block (tensor cores)
inline constexpr int kProbeSimtCols = 64;  // keys per pass-2 block (CUDA cores)
inline constexpr int kProbeFewRows = 16;   // most (query head, probe) rows per KV head of probe_few_kernel
inline constexpr int kInputNonFinite = 2;  // status bit: NaN / Inf in what the selection reads
inline constexpr int kRowLseBad = 32;      // status bit: a row statistic given by the caller is NaN / Inf

// What both passes read. Positions and chunk maxima describe one head's padded probe list; every head
// of every KV head shares them.
struct ProbeArgs {
    const void* q = nullptr;  // [n, H, d] (strides in elements)
    const void* k = nullptr;  // [n, H_kv, d]
    DType q_type = DType::f32, k_type = DType::f32;
    std::int64_t q_s0 = 0, q_s1 = 0, q_s2 = 0, k_s0 = 0, k_s1 = 0, k_s2 = 0;
    int n = 0, d = 0, H = 0, Hkv = 0, qpk = 1;
    int n_probes = 0, npc = 0;             // probes, 16-row chunks per head (npc * 16 = padded probes)
    float scale_log2 = 0.0f;               // softmax scale * log2(e)
    bool k_pairs = false;                  // K's elements readable as aligned 32-bit pairs (unit inner
                                           // stride, even strides and d, 4-byte aligned base)
    bool k_rows16 = false;                 // K's rows copyable in 16-byte pieces (k_pairs, and strides and
                                           // d multiples of 8 elements, 16-byte aligned base)
    const std::int32_t* pos = nullptr;     // [npc * 16] probe position of each padded row (-1: padding)
    const std::int32_t* cmax = nullptr;    // [npc] largest position in each chunk
    // wgmma path: a KV head's chunk rows (64 per chunk) in wg_segs segments of equal length: 1 (its
    // query heads' probe rows merged in position order, the heads' rows of one probe side by side) or
    // qpk (segment h: head h's rows in position order); wg_pad padding rows (no probe) first in each
    // segment. probe_wg_row() says which probe and head a row holds; wg_pos [rows] the rows' positions (-1:
    // padding), written by the pack kernel for the passes' bulk copies and the lse kernel. The
    // positions ascend within a segment and every segment holds the same ones.
    const std::int32_t* probes = nullptr;  // [n_probes] ascending, on the device (wgmma path)
    std::int32_t* wg_pos = nullptr;
    const std::int32_t* wg_first = nullptr;  // [ceil(n / 128)] per key block, the first chunk of a segment
                                             // whose last position is at or after the block's first key
    int wg_segs = 1, wg_pad = 0;
    const uint4* qpack = nullptr;          // tensor cores: [H_kv][qpk * npc][KS][32] A fragments
    const float* qrows = nullptr;          // CUDA cores: [H_kv][qpk * npc * 16][d] fp32 rows (scaled by nothing)
    float2* part = nullptr;                // [H_kv][rows][ceil(n / 128)] (max, sum) in the log2 domain
    int* status = nullptr;                 // kInputNonFinite set when a read element of q or k is NaN / Inf
    float* lse = nullptr;                  // [H_kv][rows]
    float* col = nullptr;                  // [rsplit][H_kv][n] (tensor cores), [H_kv][n] (CUDA cores)
    int rsplit = 1;                        // tensor cores: the active chunks of a key block are shared
                                           // out over rsplit blocks (adjacent in grid.x), for parallelism at small n
    // Row statistics from the caller instead of pass 1 (null: pass 1 runs): row_lse[p * s0 + h * s1] is the
    // natural log-sum-exp of probe p, query head h (a prefill's softmax_lse), turned into lse by
    // probe_lse_ext_kernel. K's elements are then checked by no pass (pass 2 does not check them).
    const float* row_lse = nullptr;
    std::int64_t row_lse_s0 = 0, row_lse_s1 = 0;
    // Pass 2 over some key blocks only (null: all; columns of other blocks are not written): the 128-key
    // blocks key_blocks[0 .. n_key_blocks) (ascending, unique; the CUDA-core pass 2 takes two 64-key blocks
    // of each), and for the tensor cores key_splits[x] = {key block, z, R, its index in key_blocks} of grid
    // block x: each key block's chunks shared out over its own R blocks (R <= rsplit, by its rows: a few
    // key blocks seen by very different numbers of rows), n_splits of them; their partial sums then go to
    // col as [rsplit][H_kv][n_key_blocks][128] (probe_fold_kernel sums them into the columns).
    const std::int32_t* key_blocks = nullptr;
    int n_key_blocks = 0;
    const int4* key_splits = nullptr;
    int n_splits = 0;
    // wgmma pass 2 with the probes every row 0 .. n - 1 in the per-head layout (H2O, A-VL's text budget)
    // and q of exactly D columns: each chunk is 64 consecutive rows of one query head of q, copied by the
    // bulk tensor copy straight from q (tmap_q: {d, n, H}, 64 x 64 boxes, rows before 0 read as zeros)
    // instead of from a packed copy -- no pack kernel, no q check (a non-finite q gives non-finite
    // scores, which the ranking reports).
    CUtensorMap tmap_q{};
    int q_tma = 0;
    // The few-row kernel (probe_few_kernel): the probe positions (n_probes of them), and whether q's rows
    // are readable in 16-byte pieces (q of K's 16-bit type, unit inner stride, strides multiples of 8,
    // 16-byte aligned base).
    std::int32_t few_pos[kProbeFewRows] = {};
    bool q_rows16 = false;
    // Pass 1's logits c q . k of the real rows [H_kv][qpk * n_probes][n] (log2 domain), which pass 2 then
    // reads instead of K (null: pass 2 recomputes them from K, as when row_lse is given).
    float* few_logit = nullptr;
};

// Block x of a tensor-core pass: its 128-key block, its index z among the R blocks sharing that key
// block's chunks (pass 1: every key block, R = rsplit; pass 2 over a subset: ProbeArgs::key_splits).
struct ProbeSplit {
    int kb, z, R, i;  // i: the key block's index in key_blocks (a subset), else kb
};
__device__ __forceinline__ ProbeSplit probe_split(const ProbeArgs& a, int x, bool pass1) {
    if (!pass1 && a.key_splits) {
        const int4 s = a.key_splits[x];
        return {s.x, s.y, s.z, s.w};
    }
    return {x / a.rsplit, x % a.rsplit, a.rsplit, x / a.rsplit};
}
// Where pass 2's block writes its partial column sums: out[key] for its keys col0 .. col0 + 127 of KV head g.
__device__ __forceinline__ float* probe_col_out(const ProbeArgs& a, const ProbeSplit& sp, int g) {
    if (a.key_splits)
        return a.col + ((static_cast<std::int64_t>(sp.z) * a.Hkv + g) * a.n_key_blocks + sp.i) * kProbeColTile -
               static_cast<std::int64_t>(sp.kb) * kProbeColTile;
    return a.col + (static_cast<std::int64_t>(sp.z) * a.Hkv + g) * a.n;
}

// ---- small device helpers ---------------------------------------------------------------------------

__device__ __forceinline__ float ld_elem(const void* p, DType t, std::int64_t i) {
    switch (t) {
        case DType::f32: return __ldg(static_cast<const float*>(p) + i);
        case DType::f16: return load_f(static_cast<const half*>(p) + i);
        default: return load_f(static_cast<const bfloat16*>(p) + i);
    }
}

// 2^x on the special-function unit (ex2.approx.ftz: relative error below 2^-22, 2^-inf = 0).
__device__ __forceinline__ float exp2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// NaN or Inf in either half of a packed 16-bit pair (exponent field all ones).
template <class T>
__device__ __forceinline__ bool pair_nonfinite(unsigned w) {
    constexpr unsigned e = std::is_same_v<T, bfloat16> ? 0x7f80u : 0x7c00u;
    return (w & e) == e || ((w >> 16) & e) == e;
}

// The same over four packed pairs (eight values, e.g. one 16-byte load or an ldmatrix x4 fragment), both
// halves of each word compared at once: nonzero when any value is NaN or Inf.
template <class T>
__device__ __forceinline__ unsigned quad_nonfinite(unsigned a, unsigned b, unsigned c, unsigned d) {
    constexpr unsigned E = std::is_same_v<T, bfloat16> ? 0x7f807f80u : 0x7c007c00u;  // exponent fields of a pair
    return __vcmpeq2(a & E, E) | __vcmpeq2(b & E, E) | __vcmpeq2(c & E, E) | __vcmpeq2(d & E, E);
}
template <class T>
__device__ __forceinline__ unsigned quad_nonfinite(const uint4& w) {
    return quad_nonfinite<T>(w.x, w.y, w.z, w.w);
}

// (max, sum) pairs in the log2 domain merged: the sum rescaled to the larger max.
__device__ __forceinline__ void merge_ml(float& m, float& l, float m2, float l2) {
    const float M = fmaxf(m, m2);
    if (M == -INFINITY) return;
    l = (m == -INFINITY ? 0.0f : l * exp2f(m - M)) + (m2 == -INFINITY ? 0.0f : l2 * exp2f(m2 - M));
    m = M;
}

// The maximum / sum over the four lanes of an mma row (lanes 4 r .. 4 r + 3), in a fixed order.
__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// wgmma path: the probe position (-1: padding) and the query head within the group of chunk row r of a
// KV head (rows per KV head: `rows`), from the layout in ProbeArgs.
struct ProbeWgRow {
    int pos, head;
};
__device__ __forceinline__ ProbeWgRow probe_wg_row(const ProbeArgs& a, int r, int rows) {
    if (a.wg_segs > 1) {
        const int per = rows / a.wg_segs, hl = r / per, i = r - hl * per - a.wg_pad;
        return {i >= 0 ? a.probes[i] : -1, hl};
    }
    const int i = r - a.wg_pad;
    if (i < 0) return {-1, 0};
    return {a.probes[i / a.qpk], i % a.qpk};
}

// ---- packing: q's probe rows into A fragments (tensor cores) or fp32 rows (CUDA cores) ------------------

// One thread per (KV head, chunk, k-step, lane): the four 32-bit A registers of m16n8k16 for rows
// gq and gq + 8 of the chunk, columns 16 ks + 2 tq + {0, 1} and + 8. Dims past d and padding rows are 0.
template <class T, int D>
__global__ void probe_pack_mma_kernel(const ProbeArgs a) {
    dependent_entry();  // programmatic dependent launch: see common.cuh
    constexpr int KS = D / 16;
    const std::int64_t chunks = static_cast<std::int64_t>(a.qpk) * a.npc;
    const std::int64_t total = static_cast<std::int64_t>(a.Hkv) * chunks * KS * 32;
    const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const int lane = static_cast<int>(i % 32), ks = static_cast<int>((i / 32) % KS);
    const std::int64_t ch = (i / (32 * KS)) % chunks;
    const int g = static_cast<int>(i / (32 * KS * chunks));
    const int hl = static_cast<int>(ch / a.npc), c = static_cast<int>(ch % a.npc);
    const int h = g * a.qpk + hl;
    const int gq = lane >> 2, tq = lane & 3;
    bool bad = false;
    auto val = [&](int r, int col) -> float {
        const int pr = c * 16 + r;
        const int p = pr < a.n_probes ? a.pos[pr] : -1;
        if (p < 0 || col >= a.d) return 0.0f;
        const float x = ld_elem(a.q, a.q_type, p * a.q_s0 + h * a.q_s1 + col * a.q_s2);
        bad |= !isfinite(x);
        return x;
    };
    const int c0 = 16 * ks + 2 * tq;
    uint4 f;
    f.x = pack_pair<T>(val(gq, c0), val(gq, c0 + 1));
    f.y = pack_pair<T>(val(gq + 8, c0), val(gq + 8, c0 + 1));
    f.z = pack_pair<T>(val(gq, c0 + 8), val(gq, c0 + 9));
    f.w = pack_pair<T>(val(gq + 8, c0 + 8), val(gq + 8, c0 + 9));
    const_cast<uint4*>(a.qpack)[i] = f;
    if (bad && a.status) atomicOr(a.status, kInputNonFinite);
}

// One thread per element of the fp32 probe rows [H_kv][qpk * npc * 16][d].
template <int Unused = 0>
__global__ void probe_pack_simt_kernel(const ProbeArgs a) {
    dependent_entry();  // programmatic dependent launch: see common.cuh
    const std::int64_t rows = static_cast<std::int64_t>(a.qpk) * a.npc * 16;
    const std::int64_t total = static_cast<std::int64_t>(a.Hkv) * rows * a.d;
    const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const int col = static_cast<int>(i % a.d);
    const std::int64_t r = (i / a.d) % rows;
    const int g = static_cast<int>(i / (a.d * rows));
    const int hl = static_cast<int>(r / (a.npc * 16)), pr = static_cast<int>(r % (a.npc * 16));
    const int p = pr < a.n_probes ? a.pos[pr] : -1;
    const int h = g * a.qpk + hl;
    const float x = p < 0 ? 0.0f : ld_elem(a.q, a.q_type, p * a.q_s0 + h * a.q_s1 + col * a.q_s2);
    const_cast<float*>(a.qrows)[i] = x;
    if (!isfinite(x) && a.status) atomicOr(a.status, kInputNonFinite);
}

// A block's walk over its active chunks: its i-th is t = z + i R of the active ones, query head
// t / per_head and that head's chunk first + t % per_head, kept as (head, c) so that the loop needs no
// division (both tensor-core kernels). per_head must be positive.
struct ProbeChunkCursor {
    int head, c;  // chunk index = head * (chunks per head) + first + c
    __device__ void advance(int R, int per_head) {
        c += R;
        while (c >= per_head) {
            c -= per_head;
            ++head;
        }
    }
};

// ---- both passes on the tensor cores: one kernel, K stationary, probe rows streamed --------------------

// Shared memory of one pipeline stage: a chunk's A fragments (D / 16 k-steps x 32 lanes x 16 B), then
// its 16 rows' lse (pass 2) and positions.
template <int D>
constexpr int probe_stage_bytes() {
    return (D / 16) * 32 * 16 + 16 * 4 + 16 * 4;
}
inline constexpr int kProbeStages = 8;  // chunks in flight: an iteration is short, L2 latency is not
// Blocks per multiprocessor pass 1 is compiled for (registers <= 65536 / (128 x 5) = 102; the launcher
// asks for the shared-memory carveout that holds them): its loop is latency-bound, so more resident
// warps hide more of it (H200, ZipVL at 16K: 114 -> 105 us). Pass 2 keeps 4: held to 102 registers it
// spilled and ran 8% slower (73 -> 79 us).
inline constexpr int kProbeBlocksPerSM = 5;

template <class T, int D>
constexpr std::size_t probe_cols_smem_bytes() {
    // stages, plus pass 1's per-warp row statistics of two chunks [2][4 warps][16 rows] (max, sum)
    return static_cast<std::size_t>(kProbeStages) * probe_stage_bytes<D>() + 2 * 4 * 16 * 8;
}

// Grid: (ceil(n / 128) x rsplit, H_kv), 128 threads. Block (x, g) owns keys 128 y .. 128 y + 127 of KV
// head g, y = x / rsplit (and of the chunks t = z, z + rsplit, ... of its active ones, z = x % rsplit);
// warp w keys 128 y + 32 w .. + 31, held as B fragments (four n-tiles of 8) for the whole block. The block
// streams every 16-row chunk of probe rows that can see one of its keys (chunks whose last probe is at
// or after the block's first key: per head a suffix of its chunks) through a cp.async pipeline and
// computes that chunk's 16 x 128 scores with mma.sync.
//   Pass1: per row, (max, sum) of 2^(c s) over the block's visible keys -> part[(g, row), block].
//   else:  per key, the sum over the rows of 2^(c s - lse[row])       -> col[g, key].
// Every sum runs in a fixed order (rows in chunk order, lanes and warps by fixed trees).
template <class T, int D, bool Pass1>
__global__ void __launch_bounds__(kProbeThreads, Pass1 ? kProbeBlocksPerSM : 4) probe_cols_mma_kernel(const __grid_constant__ ProbeArgs a) {
    dependent_entry();  // programmatic dependent launch: see common.cuh
    constexpr int KS = D / 16, NT = 4, ST = kProbeStages, SB = probe_stage_bytes<D>();
    static_assert(D == 64 || D == 128, "tensor-core probe scores take head dims padded to 64 or 128");
    extern __shared__ __align__(16) unsigned char smem[];
    float2* wst = reinterpret_cast<float2*>(smem + ST * SB);  // [2][4][16]
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int gq = lane >> 2, tq = lane & 3;
    // (grid x: key block x row split, the splits of one key block next to each other, so that the
    // siblings' reads of the same K tile meet in L2 instead of going to memory rsplit times)
    const int g = blockIdx.y;
    const ProbeSplit sp = probe_split(a, static_cast<int>(blockIdx.x), Pass1);
    const int kb = sp.kb;
    const int col0 = kb * kProbeColTile;
    const int key0 = col0 + 32 * warp;
    const int chunks = a.qpk * a.npc;
    const std::int64_t rows = static_cast<std::int64_t>(chunks) * 16;
    const int ncb = (a.n + kProbeColTile - 1) / kProbeColTile;

    // This warp's keys as B fragments: n-tile nt, k-step ks -> key key0 + 8 nt + gq, dims 16 ks + 2 tq
    // (+ 1, + 8, + 9). Pass 1 reads every element of K exactly once: it checks them.
    unsigned kf[NT][KS][2];
    bool bad = false;
    if (a.k_rows16) {
        // The block's 128 keys copied row by row in 16-byte pieces (16 consecutive lanes per 256-byte
        // row: whole lines), into the stage buffers (free until the pipeline starts), each row's pieces
        // XOR-swizzled by the row so that the ldmatrix reads below are conflict-free; then each warp
        // takes its B fragments with ldmatrix (non-transposed: K's rows are B's columns). Keys past n
        // and dims past d are zero-filled. (The pair loads below touch 8 rows per warp request for 128
        // bytes; on this path they had kept the blocks waiting for most of their lives, ncu.)
        constexpr int CH = D / 8;  // 16-byte pieces per row
        static_assert(kProbeColTile * D * 2 <= kProbeStages * probe_stage_bytes<D>(), "the K tile fits the stages");
        const T* kbase = static_cast<const T*>(a.k) + static_cast<std::int64_t>(g) * a.k_s1;
#pragma unroll 4
        for (int i = tid; i < kProbeColTile * CH; i += kProbeThreads) {
            const int r = i / CH, c = i % CH;
            const int key = col0 + r;
            const bool ok = key < a.n && c * 8 < a.d;
            copy16_async(smem + r * (D * 2) + ((c ^ (r & 7)) * 16), ok ? kbase + static_cast<std::int64_t>(key) * a.k_s0 + c * 8 : kbase, ok);
        }
        copy_commit();
        copy_wait<0>();
        __syncthreads();
        const int mi = lane >> 3, rr = lane & 7;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            const int r = 32 * warp + 8 * nt + rr;
#pragma unroll
            for (int ks = 0; ks < KS; ks += 2) {
                const int c = 2 * ks + mi;
                ldsm_x4(kf[nt][ks][0], kf[nt][ks][1], kf[nt][ks + 1][0], kf[nt][ks + 1][1], smem + r * (D * 2) + ((c ^ (r & 7)) * 16));
                if (Pass1)
                    bad |= pair_nonfinite<T>(kf[nt][ks][0]) || pair_nonfinite<T>(kf[nt][ks][1]) ||
                           pair_nonfinite<T>(kf[nt][ks + 1][0]) || pair_nonfinite<T>(kf[nt][ks + 1][1]);
            }
        }
        __syncthreads();  // the stages are overwritten next
    } else if (a.k_pairs) {
        // Pairs of K's own 16-bit type read as 32-bit words (bit copies; k_pairs: T is K's type, unit
        // inner stride, 4-byte aligned pairs). Dims past d read zero.
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            const int key = key0 + 8 * nt + gq;
            const bool kok = key < a.n;
            const unsigned* row = reinterpret_cast<const unsigned*>(static_cast<const T*>(a.k) +
                                                                    (kok ? static_cast<std::int64_t>(key) * a.k_s0 + static_cast<std::int64_t>(g) * a.k_s1 : 0));
#pragma unroll
            for (int ks = 0; ks < KS; ++ks) {
                const int c0 = 16 * ks + 2 * tq;
                const unsigned w0 = kok && c0 < a.d ? __ldg(row + c0 / 2) : 0u;
                const unsigned w1 = kok && c0 + 8 < a.d ? __ldg(row + c0 / 2 + 4) : 0u;
                if (Pass1) bad |= pair_nonfinite<T>(w0) || pair_nonfinite<T>(w1);
                kf[nt][ks][0] = w0;
                kf[nt][ks][1] = w1;
            }
        }
    } else {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            const int key = key0 + 8 * nt + gq;
            const bool kok = key < a.n;
            const std::int64_t base = static_cast<std::int64_t>(key) * a.k_s0 + static_cast<std::int64_t>(g) * a.k_s1;
#pragma unroll
            for (int ks = 0; ks < KS; ++ks) {
                float x[4];
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int cc = 16 * ks + 2 * tq + (e & 1) + 8 * (e >> 1);
                    x[e] = kok && cc < a.d ? ld_elem(a.k, a.k_type, base + cc * a.k_s2) : 0.0f;
                    if (Pass1) bad |= !isfinite(x[e]);
                }
                kf[nt][ks][0] = pack_pair<T>(x[0], x[1]);
                kf[nt][ks][1] = pack_pair<T>(x[2], x[3]);
            }
        }
    }
    if (Pass1 && bad && a.status) atomicOr(a.status, kInputNonFinite);

    // Active chunks: per head those whose last probe is at or after col0.
    int first;
    {
        int lo = 0, hi = a.npc;
        while (lo < hi) {
            const int mid = (lo + hi) / 2;
            if (a.cmax[mid] >= col0) hi = mid;
            else lo = mid + 1;
        }
        first = lo;
    }
    const int per_head = a.npc - first;
    const int z = sp.z, R = sp.R;
    const int n_active = per_head * a.qpk;
    const int n_mine = n_active > z ? (n_active - z + R - 1) / R : 0;  // this block's: t = z + i R
    // This block's i-th chunk is t = z + i R of the active ones: query head t / per_head, its chunk
    // first + t % per_head. Two cursors walk that sequence without divisions in the loop: one for the
    // copies (ST - 1 chunks ahead), one for the chunk being computed.
    ProbeChunkCursor issue_at{z / max(per_head, 1), z % max(per_head, 1)}, compute_at = issue_at;
    const int npc = a.npc;
    // A chunk's fragments are KS x 32 pieces of 16 bytes: each thread copies the same few of every chunk.
    static_assert((KS * 32) % kProbeThreads == 0, "whole pieces per thread");
    const uint4* qsrc = a.qpack + static_cast<std::int64_t>(g) * chunks * KS * 32 + tid;
    auto issue = [&](int i) {
        if (i < n_mine) {
            const int cc = first + issue_at.c;
            const int ch = issue_at.head * npc + cc;
            unsigned char* dst = smem + (i % ST) * SB;
            const uint4* src = qsrc + ch * (KS * 32);
#pragma unroll
            for (int k = 0; k < KS * 32 / kProbeThreads; ++k)
                copy16_async(dst + (tid + k * kProbeThreads) * 16, src + k * kProbeThreads);
            if (!Pass1 && tid < 4) copy16_async(dst + KS * 512 + tid * 16, a.lse + g * rows + ch * 16 + tid * 4);
            else if (tid >= 4 && tid < 8) copy16_async(dst + KS * 512 + 64 + (tid - 4) * 16, a.pos + cc * 16 + (tid - 4) * 4);
            issue_at.advance(R, per_head);
        }
        copy_commit();
    };
#pragma unroll
    for (int s = 0; s < ST - 1; ++s) issue(s);

    // Pass 1: the previous chunk's four per-warp statistics merged (fixed warp order) and written, by
    // the warps in turn (so that no one warp is behind at every barrier).
    auto flush_stats = [&](int t, int ch) {
        if (warp == (t & 3) && lane < 16) {
            const float2* w = wst + (t & 1) * 64;
            float m = -INFINITY, l = 0.0f;
#pragma unroll
            for (int v = 0; v < 4; ++v) merge_ml(m, l, w[v * 16 + lane].x, w[v * 16 + lane].y);
            const std::int64_t row = static_cast<std::int64_t>(g) * rows + ch * 16 + lane;
            a.part[row * ncb + kb] = make_float2(m, l);
        }
    };
    int prev_chunk = 0;

    float acc[NT][2];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = 0.0f;
    for (int t = 0; t < n_mine; ++t) {
        copy_wait<ST - 2>();
        __syncthreads();
        issue(t + ST - 1);
        if (Pass1 && t > 0) flush_stats(t - 1, prev_chunk);
        if (Pass1) {
            prev_chunk = compute_at.head * npc + first + compute_at.c;
            compute_at.advance(R, per_head);
        }
        const unsigned char* cs = smem + (t % ST) * SB;
        const uint4* af = reinterpret_cast<const uint4*>(cs);
        const float* lse = reinterpret_cast<const float*>(cs + KS * 512);
        const std::int32_t* pos = reinterpret_cast<const std::int32_t*>(cs + KS * 512 + 64);
        const int p_lo = pos[gq], p_hi = pos[gq + 8];
        // (warp-uniform: the mma below needs every lane)
        const bool any = __any_sync(0xffffffffu, max(p_lo, p_hi) >= key0);
        float s[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
        if (any) {
#pragma unroll
            for (int ks = 0; ks < KS; ++ks) {
                const uint4 f = af[ks * 32 + lane];
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) mma_m16n8k16<T>(s[nt], f, kf[nt][ks][0], kf[nt][ks][1]);
            }
        }
        // Rows of this chunk that see every key of this warp need no mask (the common case).
        const bool full = __all_sync(0xffffffffu, min(p_lo, p_hi) >= key0 + 31);
        if constexpr (Pass1) {
            // The maxima of the raw scores (c > 0: c times the largest is the largest of c times each),
            // then 2^(c s - c max) with one rounding (an fma).
            float mlo = -INFINITY, mhi = -INFINITY;
            if (full) {
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        mlo = fmaxf(mlo, s[nt][e]);
                        mhi = fmaxf(mhi, s[nt][2 + e]);
                    }
            } else {
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int key = key0 + 8 * nt + 2 * tq + e;
                        s[nt][e] = any && key <= p_lo ? s[nt][e] : -INFINITY;
                        s[nt][2 + e] = any && key <= p_hi ? s[nt][2 + e] : -INFINITY;
                        mlo = fmaxf(mlo, s[nt][e]);
                        mhi = fmaxf(mhi, s[nt][2 + e]);
                    }
            }
            mlo = quad_max(mlo) * a.scale_log2;
            mhi = quad_max(mhi) * a.scale_log2;
            // (a row that sees none of these keys: max -inf; its terms 2^(-inf - 0) are 0)
            const float olo = mlo == -INFINITY ? 0.0f : mlo, ohi = mhi == -INFINITY ? 0.0f : mhi;
            float llo = 0.0f, lhi = 0.0f;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    llo += exp2_approx(fmaf(s[nt][e], a.scale_log2, -olo));
                    lhi += exp2_approx(fmaf(s[nt][2 + e], a.scale_log2, -ohi));
                }
            llo = quad_sum(llo);
            lhi = quad_sum(lhi);
            if (tq == 0) {
                float2* w = wst + (t & 1) * 64 + warp * 16;
                w[gq] = make_float2(mlo, llo);
                w[gq + 8] = make_float2(mhi, lhi);
            }
        } else if (any) {
            const float lse_lo = lse[gq], lse_hi = lse[gq + 8];
            if (full) {
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int e = 0; e < 2; ++e)
                        acc[nt][e] += exp2_approx(fmaf(s[nt][e], a.scale_log2, -lse_lo)) +
                                      exp2_approx(fmaf(s[nt][2 + e], a.scale_log2, -lse_hi));
            } else {
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int key = key0 + 8 * nt + 2 * tq + e;
                        const float w_lo = key <= p_lo ? exp2_approx(fmaf(s[nt][e], a.scale_log2, -lse_lo)) : 0.0f;
                        const float w_hi = key <= p_hi ? exp2_approx(fmaf(s[nt][2 + e], a.scale_log2, -lse_hi)) : 0.0f;
                        acc[nt][e] += w_lo + w_hi;
                    }
            }
        }
    }
    copy_wait<0>();
    if constexpr (Pass1) {
        __syncthreads();
        if (n_mine > 0) flush_stats(n_mine - 1, prev_chunk);
    } else {
        // Sum over the 8 row groups (lanes with the same tq), then lanes 0..3 write their 8 keys.
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                float v = acc[nt][e];
                v += __shfl_xor_sync(0xffffffffu, v, 4);
                v += __shfl_xor_sync(0xffffffffu, v, 8);
                v += __shfl_xor_sync(0xffffffffu, v, 16);
                acc[nt][e] = v;
            }
        if (gq == 0) {
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int key = key0 + 8 * nt + 2 * tq + e;
                    if (key < a.n) probe_col_out(a, sp, g)[key] = acc[nt][e];
                }
        }
    }
}

// ---- both passes on Hopper's wgmma: 64-row probe chunks streamed past a 128-key block ------------------

// The same arithmetic as probe_cols_mma_kernel, shaped for wgmma (sm_90a): a block owns 128 keys of one
// KV head and streams the probe rows in chunks of 64 (packed once by probe_pack_wg_kernel in the layout
// of the swizzled shared-memory tile (swizzle128_offset), so a chunk is one contiguous bulk copy). A
// producer warp copies the chunks into a ring; two warpgroups compute them:
//   Pass1: the warpgroups take the chunks in turn; S = chunk K^T (m64n128k16, both operands by
//          descriptor: the chunk's rows and the block's keys); per row, (max, sum) over the block's
//          keys -> part.
//   else:  both warpgroups take every chunk, each against its half of the keys: S^T = K chunk^T (the
//          half's keys as A fragments held for the whole block, the chunk by descriptor); per key, the
//          sum over the chunk's rows of 2^(c s - lse[row]) -> col.
// Against the mma.sync kernel's 16-row chunks (one block barrier per 16 rows, 32 mma.sync and about 350
// instructions per warp), a chunk is eight wgmma per warpgroup and no block barrier.
// (Measured, ZipVL at 16K: see docs/cuda.md, the notes of sessions 25 and 26.)
// A KV head's chunks come in one of two layouts (ProbeArgs::wg_segs), chosen per call by the host:
//   merged (1 segment): its query heads' probe rows in position order (the heads' rows of one probe side
//     by side; the chunks of padding only first), so a chunk spans a narrow range of positions and the
//     key blocks after its last position skip it: with ZipVL's 64 random probes per head, about half the
//     random rows' chunks are skipped on average, where per-head chunks (spanning the whole prompt) are
//     active almost everywhere;
//   per head (qpk segments): head h's rows in position order, padding first. Where the two skip about
//     as many (chunk, key block) pairs -- every row a probe, H2O -- a block walking head by head runs
//     faster (H2O at 16K, H100: 5.7 against 7.5 ms; docs/cuda.md, session 26).
// The lse and column sums keep their layout, rows indexed by chunk row; each head's list is padded to a
// multiple of 64 rows (npc a multiple of 4).
inline constexpr int kProbeWgRows = 64;                          // probe rows per chunk
inline constexpr int kProbeWgConsumers = 256;                    // two warpgroups
inline constexpr int kProbeWgThreads = kProbeWgConsumers + 32;   // and the producer warp
inline constexpr int kProbeWgStages = 4;                         // chunks in flight

template <int D>
struct ProbeWgShape {
    static_assert(D == 64 || D == 128, "wgmma probe passes take head dims padded to 64 or 128");
    static constexpr int CH = D / 8;                             // 16-byte pieces per row
    static constexpr int KS = D / 16;                            // k-steps
    static constexpr int KTILE_BYTES = kProbeColTile * D * 2;    // the block's keys
    static constexpr int CHUNK_BYTES = kProbeWgRows * D * 2;     // one chunk of probe rows
    static constexpr int META_BYTES = kProbeWgRows * 8;          // a chunk's positions and lse
    static constexpr int K_PLANE = kProbeColTile * 128;          // one 64-column plane of the key tile
    static constexpr int C_PLANE = kProbeWgRows * 128;           // of a chunk
    // key tile, chunk ring, chunk metadata, the stages' mbarriers (full, empty), alignment slack
    static constexpr std::size_t smem_bytes() {
        return static_cast<std::size_t>(KTILE_BYTES) + kProbeWgStages * (CHUNK_BYTES + META_BYTES) + 2 * kProbeWgStages * 8 +
               1024;
    }
};

// One thread per 16-byte piece of the packed chunks [H_kv][qpk * npc / 4][64 rows x D] (each chunk in
// wgmma's 128-byte swizzle: swizzle128_offset); chunk row r is probe_wg_row(r)'s position and head
// (written to wg_pos by the KV head 0 threads); dims past d and padding rows are 0.
template <class T, int D>
__global__ void probe_pack_wg_kernel(const ProbeArgs a) {
    dependent_entry();  // programmatic dependent launch: see common.cuh
    using S = ProbeWgShape<D>;
    const int nc = a.npc / 4;
    const std::int64_t chunks = static_cast<std::int64_t>(a.qpk) * nc;
    const std::int64_t total = static_cast<std::int64_t>(a.Hkv) * chunks * kProbeWgRows * S::CH;
    const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    const int rows = static_cast<int>(chunks) * kProbeWgRows;
    if (i >= total) return;
    const int c = static_cast<int>(i % S::CH), r = static_cast<int>((i / S::CH) % kProbeWgRows);
    const std::int64_t ch = (i / (S::CH * kProbeWgRows)) % chunks;
    const int g = static_cast<int>(i / (S::CH * kProbeWgRows * chunks));
    const int cr = static_cast<int>(ch) * kProbeWgRows + r;  // the chunk row
    const ProbeWgRow w = probe_wg_row(a, cr, rows);
    const int p = w.pos;  // (the lse kernels write wg_pos as well: with q_tma this kernel does not run)
    const int h = g * a.qpk + w.head;
    if (g == 0 && c == 0) a.wg_pos[cr] = p;
    float x[8];
    bool bad = false;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        const int col = c * 8 + e;
        x[e] = p >= 0 && col < a.d ? ld_elem(a.q, a.q_type, p * a.q_s0 + h * a.q_s1 + col * a.q_s2) : 0.0f;
        bad |= !isfinite(x[e]);
    }
    uint4 f;
    f.x = pack_pair<T>(x[0], x[1]);
    f.y = pack_pair<T>(x[2], x[3]);
    f.z = pack_pair<T>(x[4], x[5]);
    f.w = pack_pair<T>(x[6], x[7]);
    const std::int64_t at = (static_cast<std::int64_t>(g) * chunks + ch) * (kProbeWgRows * D) + swizzle128_offset<kProbeWgRows>(r, c);
    const_cast<uint4*>(a.qpack)[at / 8] = f;
    if (bad && a.status) atomicOr(a.status, kInputNonFinite);
}

// Grid: (ceil(n / 128) x rsplit, H_kv), 288 threads: two consumer warpgroups and a producer warp; block
// (x, g) owns keys 128 y .. + 127 of KV head g, y = x / rsplit, and the items z, z + rsplit, ... (z = x %
// rsplit) of the KV head's active chunks: in each segment (wg_segs) the suffix of chunks whose last
// position is at or after the block's first key (the others see none of its keys), segment after
// segment. The producer's one thread copies each chunk (16 KiB at d = 128), its positions and (pass 2) its
// lse into a ring stage by the bulk copy engine; the warpgroups wait on the stage's full barrier and
// release it on its empty barrier, each at its own pace (no block barrier per chunk; in pass 1 neither
// warpgroup waits for the other). Only launched where
// wgmma runs (wgmma_runs_here): compiled without sm_90a, the body is empty.
template <class T, int D, bool Pass1>
__global__ void __launch_bounds__(kProbeWgThreads, 2) probe_cols_wg_kernel(const __grid_constant__ ProbeArgs a) {
    dependent_entry();  // programmatic dependent launch: see common.cuh
#if VLSPARSE_CUDA_HAS_WGMMA
    using S = ProbeWgShape<D>;
    constexpr int KS = S::KS, CH = S::CH, ST = kProbeWgStages, NC = kProbeWgConsumers;
    extern __shared__ __align__(16) unsigned char probe_wg_smem[];
    const unsigned raw = static_cast<unsigned>(__cvta_generic_to_shared(probe_wg_smem));
    unsigned char* base = probe_wg_smem + ((1024u - (raw & 1023u)) & 1023u);  // 1024-byte aligned (swizzle atoms)
    T* ktile = reinterpret_cast<T*>(base);
    unsigned char* ring = base + S::KTILE_BYTES;
    unsigned char* meta = ring + ST * S::CHUNK_BYTES;                             // [ST][positions 64, lse 64]
    std::uint64_t* full_bar = reinterpret_cast<std::uint64_t*>(meta + ST * S::META_BYTES);
    std::uint64_t* empty_bar = full_bar + ST;
    const unsigned kaddr = static_cast<unsigned>(__cvta_generic_to_shared(ktile));
    const unsigned raddr = static_cast<unsigned>(__cvta_generic_to_shared(ring));
    const int tid = threadIdx.x, lane = tid & 31, wg = tid >> 7, wi = (tid >> 5) & 3;
    const int gq = lane >> 2, tq = lane & 3;
    const int g = blockIdx.y;
    const ProbeSplit sp = probe_split(a, static_cast<int>(blockIdx.x), Pass1);
    const int kb = sp.kb, z = sp.z, R = sp.R;
    const int col0 = kb * kProbeColTile;
    const int nc = a.npc / 4;
    const std::int64_t rows = static_cast<std::int64_t>(a.qpk) * a.npc * 16;
    const int ncb = (a.n + kProbeColTile - 1) / kProbeColTile;

    // The block's keys, zero past n and d: the consumers' copies, issued first (waited for below).
    if (tid < NC) {
        const T* kbase = static_cast<const T*>(a.k) + static_cast<std::int64_t>(g) * a.k_s1;
        for (int i = tid; i < kProbeColTile * CH; i += NC) {
            const int r = i / CH, c = i % CH;
            const int key = col0 + r;
            const bool ok = key < a.n && c * 8 < a.d;
            copy16_async(ktile + swizzle128_offset<kProbeColTile>(r, c), ok ? kbase + static_cast<std::int64_t>(key) * a.k_s0 + c * 8 : kbase, ok);
        }
        copy_commit();
    }
    if (tid == 0) {
        for (int st = 0; st < ST; ++st) {
            mbar_init(full_bar + st, 1);                        // the producer's arrive (with the bytes)
            mbar_init(empty_bar + st, Pass1 ? NC / 2 : NC);  // every thread of the warpgroup(s) that read the chunk
        }
    }
    // Active chunks: in each segment those from wg_first[kb] on (whose last position is at or after
    // col0: positions ascend within a segment, and the segments hold the same ones); the block's are
    // the items z, z + R, ... of the segments' suffixes one after the other.
    const int nseg = a.wg_segs, cps = a.qpk * nc / nseg;
    const int first = a.wg_first[kb];
    const int per_seg = cps - first;
    const int n_active = per_seg * nseg;
    const int n_mine = n_active > z ? (n_active - z + R - 1) / R : 0;
    // The block's t-th chunk, item z + t R: segment (z + t R) / per_seg, walked without divisions.
    const ProbeChunkCursor at0{z / max(per_seg, 1), z % max(per_seg, 1)};
    __syncthreads();  // the barriers initialized (the last block-wide barrier: the producer leaves early)

    if (tid >= NC) {
        // The producer: chunk i into stage i % ST once the consumers have released the stage's last chunk.
        if (tid == NC) {
            const unsigned char* qsrc = reinterpret_cast<const unsigned char*>(a.qpack) +
                                        static_cast<std::int64_t>(g) * a.qpk * nc * S::CHUNK_BYTES;
            ProbeChunkCursor at = at0;
            for (int i = 0; i < n_mine; ++i, at.advance(R, per_seg)) {
                const int st = i % ST;
                if (i >= ST) mbar_wait(empty_bar + st, static_cast<unsigned>((i / ST - 1) & 1));
                const std::int64_t ch = at.head * cps + first + at.c;
                mbar_arrive_expect_tx(full_bar + st, S::CHUNK_BYTES + (Pass1 ? 256 : 512));
                if (a.q_tma) {
                    const int row0 = (first + at.c) * kProbeWgRows - a.wg_pad, head = g * a.qpk + at.head;
#pragma unroll
                    for (int pl = 0; pl < D / 64; ++pl)
                        tma_load_3d(ring + st * S::CHUNK_BYTES + pl * S::C_PLANE, &a.tmap_q, pl * 64, row0, head, full_bar + st);
                } else {
                    bulk_load(ring + st * S::CHUNK_BYTES, qsrc + ch * S::CHUNK_BYTES, S::CHUNK_BYTES, full_bar + st);
                }
                unsigned char* md = meta + st * S::META_BYTES;
                bulk_load(md, a.wg_pos + ch * kProbeWgRows, 256, full_bar + st);
                if (!Pass1) bulk_load(md + 256, a.lse + g * rows + ch * kProbeWgRows, 256, full_bar + st);
            }
        }
        return;
    }

    copy_wait<0>();
    fence_proxy_async_shared();
    named_barrier_sync<1, NC>();  // the key tile, for every consumer and the tensor cores

    auto wait_full = [&](int t) { mbar_wait(full_bar + t % ST, static_cast<unsigned>((t / ST) & 1)); };
    // The descriptor of the ring's first bytes: a chunk's is this plus the offset / 16 (the address
    // field's low bits; shared-memory addresses stay below 2^18, so no carry leaves it). Pass 1 builds the
    // key tile's the same way.
    const std::uint64_t rdesc = wgmma_desc(raddr, 16, 1024);
    const int kfirst = col0 + 64 * wg;  // this warpgroup's first key
    if constexpr (!Pass1) {
        // This warpgroup's 64 keys as wgmma A fragments for the whole block (each warp 16 rows: the
        // mma.sync A layout), then S^T of the chunk in stage st with the chunk's rows (B) by descriptor.
        unsigned kf[KS][4];
        {
            const int r = 64 * wg + 16 * wi + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
            for (int ks = 0; ks < KS; ++ks)
                ldsm_x4(kf[ks][0], kf[ks][1], kf[ks][2], kf[ks][3], ktile + swizzle128_offset<kProbeColTile>(r, 2 * ks + (lane >> 4)));
        }
        auto products = [&](float (&s)[32], int st) {
            const std::uint64_t cdesc = rdesc + ((st * S::CHUNK_BYTES) >> 4);
            wgmma_reg_fence(s);
            wgmma_reg_fence_u(kf);
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < KS; ++ks)
                wgmma_rs_n64<T, 0>(s, kf[ks][0], kf[ks][1], kf[ks][2], kf[ks][3],
                                   cdesc + (((ks >> 2) * S::C_PLANE + (ks & 3) * 32) >> 4), ks > 0);
            wgmma_commit();
        };
        // s[4 j + e]: key kfirst + 16 wi + gq (+ 8 for e >= 2), chunk row 8 j + 2 tq + (e & 1).
        const int klo = kfirst + 16 * wi + gq, khi = klo + 8;
        float acc[2] = {0.0f, 0.0f};
        auto terms = [&](float (&s)[32], int st) {
            const int* pos = reinterpret_cast<const int*>(meta + st * S::META_BYTES);
            const float* lse = reinterpret_cast<const float*>(meta + st * S::META_BYTES + 256);
            int pc[16];
            float lc[16];
            int pmin = INT_MAX;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const int2 pp = *reinterpret_cast<const int2*>(pos + 8 * j + 2 * tq);
                const float2 ll = *reinterpret_cast<const float2*>(lse + 8 * j + 2 * tq);
                pc[2 * j] = pp.x;
                pc[2 * j + 1] = pp.y;
                lc[2 * j] = ll.x;
                lc[2 * j + 1] = ll.y;
                pmin = min(pmin, min(pp.x, pp.y));
            }
            mbar_arrive(empty_bar + st);  // (the stage's last read by this thread; the products are done)
            // Every row of the chunk sees every key of this warp (the common case): no mask.
            const bool full = __all_sync(0xffffffffu, pmin >= kfirst + 16 * wi + 15);
            float alo = 0.0f, ahi = 0.0f;
#pragma unroll
            for (int j = 0; j < 8; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const float x_lo = exp2_approx(fmaf(s[4 * j + e], a.scale_log2, -lc[2 * j + e]));
                    const float x_hi = exp2_approx(fmaf(s[4 * j + 2 + e], a.scale_log2, -lc[2 * j + e]));
                    if (full) {
                        alo += x_lo;
                        ahi += x_hi;
                    } else {
                        alo += klo <= pc[2 * j + e] ? x_lo : 0.0f;
                        ahi += khi <= pc[2 * j + e] ? x_hi : 0.0f;
                    }
                }
            acc[0] += alo;
            acc[1] += ahi;
        };
        // One chunk per step. (Two per step, the second's products in flight while the first's terms are
        // summed -- both operands by descriptor to make room for the second accumulator -- measured
        // slower: 43.3 -> 46.9 us at 16K, H200.)
        for (int t = 0; t < n_mine; ++t) {
            float s[32];
            wait_full(t);
            products(s, t % ST);
            wgmma_wait<0>();
            wgmma_reg_fence(s);
            terms(s, t % ST);
        }
        // The four lanes of a key row (tq) summed in a fixed order; lane tq = 0 writes the row's key.
#pragma unroll
        for (int i = 0; i < 2; ++i) acc[i] = quad_sum(acc[i]);
        if (tq == 0) {
            float* out = probe_col_out(a, sp, g);
            if (klo < a.n) out[klo] = acc[0];
            if (khi < a.n) out[khi] = acc[1];
        }
    } else {
        // The warpgroups take the block's chunks in turn (warpgroup wg: the chunks t = wg, wg + 2, ...),
        // each against all 128 keys: S = chunk K^T as m64n128k16, both operands by descriptor (the chunk's
        // rows, A, K-major; the key tile, B). A row's (max, sum) over the block's keys is then one
        // warpgroup's, written without waiting for the other.
        // s[4 j + e]: row 16 wi + gq (+ 8 for e >= 2), key col0 + 8 j + 2 tq + (e & 1).
        const std::uint64_t kdesc = wgmma_desc(kaddr, 16, 1024);
        ProbeChunkCursor at = at0;
        if (wg == 1 && per_seg > 0) at.advance(R, per_seg);  // (per_seg 0: nothing to walk, and advance would not end)
        for (int t = wg; t < n_mine; t += 2) {
            const int st = t % ST;
            const int ch = at.head * cps + first + at.c;
            at.advance(R, per_seg);
            at.advance(R, per_seg);
            float s[64];
            wait_full(t);
            {
                const std::uint64_t cdesc = rdesc + ((st * S::CHUNK_BYTES) >> 4);
                wgmma_reg_fence(s);
                wgmma_fence();
#pragma unroll
                for (int ks = 0; ks < KS; ++ks)
                    wgmma_ss_n128<T>(s, cdesc + (((ks >> 2) * S::C_PLANE + (ks & 3) * 32) >> 4),
                                     kdesc + (((ks >> 2) * S::K_PLANE + (ks & 3) * 32) >> 4), ks > 0);
                wgmma_commit();
            }
            const int* pos = reinterpret_cast<const int*>(meta + st * S::META_BYTES);
            const int p_lo = pos[16 * wi + gq], p_hi = pos[16 * wi + gq + 8];
            wgmma_wait<0>();
            wgmma_reg_fence(s);
            mbar_arrive(empty_bar + st);  // (the stage's last read by this thread; the products are done)
            // The causal mask only where a row of the chunk misses a key of the block (warp-uniform; the
            // common case skips it whole).
            if (!__all_sync(0xffffffffu, min(p_lo, p_hi) >= col0 + kProbeColTile - 1)) {
                // (key - col0 - 2 tq) against each row's limit: one compare per element
                const int lim_lo = p_lo - col0 - 2 * tq, lim_hi = p_hi - col0 - 2 * tq;
#pragma unroll
                for (int j = 0; j < 16; ++j)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        if (8 * j + e > lim_lo) s[4 * j + e] = -INFINITY;
                        if (8 * j + e > lim_hi) s[4 * j + 2 + e] = -INFINITY;
                    }
            }
            float mlo = -INFINITY, mhi = -INFINITY;
#pragma unroll
            for (int j = 0; j < 16; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    mlo = fmaxf(mlo, s[4 * j + e]);
                    mhi = fmaxf(mhi, s[4 * j + 2 + e]);
                }
            mlo = quad_max(mlo) * a.scale_log2;
            mhi = quad_max(mhi) * a.scale_log2;
            const float olo = mlo == -INFINITY ? 0.0f : mlo, ohi = mhi == -INFINITY ? 0.0f : mhi;
            float llo = 0.0f, lhi = 0.0f;
#pragma unroll
            for (int j = 0; j < 16; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    llo += exp2_approx(fmaf(s[4 * j + e], a.scale_log2, -olo));
                    lhi += exp2_approx(fmaf(s[4 * j + 2 + e], a.scale_log2, -ohi));
                }
            llo = quad_sum(llo);
            lhi = quad_sum(lhi);
            if (tq == 0) {
                const std::int64_t row = static_cast<std::int64_t>(g) * rows + static_cast<std::int64_t>(ch) * kProbeWgRows + 16 * wi + gq;
                a.part[row * ncb + kb] = make_float2(mlo, llo);
                a.part[(row + 8) * ncb + kb] = make_float2(mhi, lhi);
            }
        }
        // Pass 1 reads every element of K: the first of a key block's rsplit blocks checks its tile, after
        // its chunks (the tile stays; checked before the first chunk it delayed every block's start).
        unsigned hits = 0;
        if (z == 0) {
            for (int i = tid; i < kProbeColTile * CH; i += NC) {
                const uint4 w = *reinterpret_cast<const uint4*>(ktile + swizzle128_offset<kProbeColTile>(i / CH, i % CH));
                hits |= quad_nonfinite<T>(w);
            }
        }
        if (hits != 0 && a.status) atomicOr(a.status, kInputNonFinite);
    }
#else
    (void)a;
#endif
}

// ---- pass 1 on the CUDA cores: one warp per probe row, all its keys -----------------------------------

template <int Unused = 0>
__global__ void __launch_bounds__(kProbeThreads) probe_pass1_simt_kernel(const ProbeArgs a) {
    dependent_entry();  // programmatic dependent launch: see common.cuh
    extern __shared__ __align__(16) unsigned char smem[];
    float* qs = reinterpret_cast<float*>(smem);  // [4 warps][d]
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const std::int64_t rows = static_cast<std::int64_t>(a.qpk) * a.npc * 16;
    const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * 4 + warp;
    if (row >= rows * a.Hkv) return;  // whole warps only: no block barrier below
    const int g = static_cast<int>(row / rows);
    const int pr = static_cast<int>((row % rows) % (a.npc * 16));
    const int p = pr < a.n_probes ? a.pos[pr] : -1;
    float* q = qs + warp * a.d;
    for (int c = lane; c < a.d; c += 32) q[c] = a.qrows[row * a.d + c];
    __syncwarp();
    float m = -INFINITY, l = 0.0f;
    for (int j = lane; j <= p; j += 32) {
        float s = 0.0f;
        for (int c = 0; c < a.d; ++c) s = fmaf(q[c], ld_elem(a.k, a.k_type, j * a.k_s0 + g * a.k_s1 + c * a.k_s2), s);
        merge_ml(m, l, s * a.scale_log2, 1.0f);
    }
#pragma unroll
    for (int o = 1; o < 32; o <<= 1)
        merge_ml(m, l, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, l, o));
    if (lane == 0) a.lse[row] = m == -INFINITY ? 0.0f : m + log2f(l);
}

// Pass 1's (max, sum) per 128-key block -> lse per row, one warp per row: row r of a head sees blocks
// 0 .. p_r / 128, all written by probe_cols_mma_kernel<.., true>. Padding rows (no key) get 0. The
// lanes merge strided blocks, then a fixed butterfly merges the lanes.
template <int Unused = 0>
__global__ void probe_lse_kernel(const ProbeArgs a) {
    dependent_entry();  // programmatic dependent launch: see common.cuh
    const std::int64_t rows = static_cast<std::int64_t>(a.qpk) * a.npc * 16;
    const int lane = threadIdx.x & 31;
    const std::int64_t r = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
    if (r >= rows * a.Hkv) return;  // whole warps
    const int pr = static_cast<int>((r % rows) % (a.npc * 16));
    const int p = a.wg_pos ? a.wg_pos[r % rows] : pr < a.n_probes ? a.pos[pr] : -1;
    const int ncb = (a.n + kProbeColTile - 1) / kProbeColTile;
    const int nb = p >= 0 ? p / kProbeColTile + 1 : 0;
    // Four blocks per lane loaded before any is merged (128 per round: every row up to 16K keys in one
    // round), in a fixed order.
    float m = -INFINITY, l = 0.0f;
    const float2* pr_part = a.part + r * ncb;
    for (int b0 = 0; b0 < nb; b0 += 128) {
        float2 x[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int b = b0 + 32 * u + lane;
            x[u] = b < nb ? __ldcg(pr_part + b) : make_float2(-INFINITY, 0.0f);
        }
        // (max, sum) of the four and the running pair: one rescale each
        const float M = fmaxf(fmaxf(m, fmaxf(x[0].x, x[1].x)), fmaxf(x[2].x, x[3].x));
        if (M != -INFINITY) {
            float t = m == -INFINITY ? 0.0f : l * exp2f(m - M);
#pragma unroll
            for (int u = 0; u < 4; ++u) t += x[u].x == -INFINITY ? 0.0f : x[u].y * exp2f(x[u].x - M);
            m = M;
            l = t;
        }
    }
#pragma unroll
    for (int o = 1; o < 32; o <<= 1)
        merge_ml(m, l, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, l, o));
    if (lane == 0) a.lse[r] = m == -INFINITY ? 0.0f : m + log2f(l);
}

// The row statistics given by the caller (ProbeArgs::row_lse, natural log) -> lse in the log2 domain, in
// the rows' layout (the passes' chunk rows on the wgmma path, head-major padded rows otherwise); padding
// rows get 0, as from probe_lse_kernel. One thread per (KV head, row).
template <int Unused = 0>
__global__ void probe_lse_ext_kernel(const ProbeArgs a) {
    dependent_entry();  // programmatic dependent launch: see common.cuh
    const std::int64_t rows = static_cast<std::int64_t>(a.qpk) * a.npc * 16;
    const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= rows * a.Hkv) return;
    const int g = static_cast<int>(i / rows), r = static_cast<int>(i % rows);
    int p = -1, hl = 0;
    if (a.wg_pos) {
        const ProbeWgRow w = probe_wg_row(a, r, static_cast<int>(rows));
        p = w.pos;
        hl = w.head;
        if (g == 0) a.wg_pos[r] = p;  // (the pack kernel's too, which does not run with q_tma)
    } else {
        const int pr = r % (a.npc * 16);
        hl = r / (a.npc * 16);
        p = pr < a.n_probes ? a.pos[pr] : -1;
    }
    float v = 0.0f;
    if (p >= 0) {
        const float x = __ldg(a.row_lse + static_cast<std::int64_t>(p) * a.row_lse_s0 +
                              static_cast<std::int64_t>(g * a.qpk + hl) * a.row_lse_s1);
        if (isfinite(x)) v = x * 1.4426950408889634f;
        else if (a.status) atomicOr(a.status, kRowLseBad);
    }
    a.lse[i] = v;
}

// Pass 2 over a key-block subset (ProbeArgs::key_splits): the partials [rsplit][H_kv][n_key_blocks][128]
// summed over the splits (in z order; those a key block did not use are 0) into out [H_kv][n] at the
// subset's keys. One thread per (KV head, subset column).
template <int Unused = 0>
__global__ void probe_fold_kernel(const float* part, int rsplit, int Hkv, int nkb, const std::int32_t* key_blocks, int n, float* out) {
    dependent_entry();  // programmatic dependent launch: see common.cuh
    const std::int64_t per = static_cast<std::int64_t>(nkb) * kProbeColTile;
    const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= per * Hkv) return;
    const int g = static_cast<int>(i / per), c = static_cast<int>(i % per);
    const int key = key_blocks[c / kProbeColTile] * kProbeColTile + c % kProbeColTile;
    if (key >= n) return;
    float acc = 0.0f;
    for (int z = 0; z < rsplit; ++z) acc += part[(static_cast<std::int64_t>(z) * Hkv + g) * per + c];
    out[static_cast<std::int64_t>(g) * n + key] = acc;
}

// ---- pass 2 on the CUDA cores: one thread per key -----------------------------------------------------

// Grid: (ceil(n / 64), H_kv), 64 threads. Shared: the block's keys [64][d + 1] and one probe row [d].
template <int Unused = 0>
__global__ void __launch_bounds__(kProbeSimtCols) probe_pass2_simt_kernel(const ProbeArgs a) {
    dependent_entry();  // programmatic dependent launch: see common.cuh
    extern __shared__ __align__(16) unsigned char smem[];
    const int d = a.d, ld = a.d + 1;
    float* ks = reinterpret_cast<float*>(smem);  // [64][d + 1]
    float* qs = ks + kProbeSimtCols * ld;        // [d]
    const int tid = threadIdx.x, g = blockIdx.y;
    // (a key-block subset: two 64-key blocks per 128-key block)
    const int col0 = a.key_blocks ? a.key_blocks[blockIdx.x / 2] * kProbeColTile + (blockIdx.x % 2) * kProbeSimtCols
                                  : blockIdx.x * kProbeSimtCols;
    const int key = col0 + tid;
    for (int i = tid; i < kProbeSimtCols * d; i += kProbeSimtCols) {
        const int r = i / d, c = i % d;
        const int kk = col0 + r;
        const float x = kk < a.n ? ld_elem(a.k, a.k_type, kk * a.k_s0 + g * a.k_s1 + c * a.k_s2) : 0.0f;
        ks[r * ld + c] = x;
        if (!isfinite(x) && a.status) atomicOr(a.status, kInputNonFinite);
    }
    const std::int64_t rows = static_cast<std::int64_t>(a.qpk) * a.npc * 16;
    float acc = 0.0f;
    for (std::int64_t r = 0; r < rows; ++r) {
        const int pr = static_cast<int>(r % (a.npc * 16));
        const int p = pr < a.n_probes ? a.pos[pr] : -1;
        if (p < col0) continue;  // uniform over the block
        __syncthreads();
        for (int c = tid; c < d; c += kProbeSimtCols) qs[c] = a.qrows[(g * rows + r) * d + c];
        __syncthreads();
        if (key <= p) {
            float s = 0.0f;
            for (int c = 0; c < d; ++c) s = fmaf(qs[c], ks[tid * ld + c], s);
            acc += exp2f(fmaf(s, a.scale_log2, -a.lse[g * rows + r]));
        }
    }
    if (key < a.n) a.col[static_cast<std::int64_t>(g) * a.n + key] = acc;
}

// ---- a few probe rows (FastV's and A-VL's last row, short observation windows) --------------------------

// At most kProbeFewRows (query head, probe) rows per KV head: the chunked passes would pad each head's
// probes to a 16-row chunk and stream K tiles through a pipeline shaped for many rows. Here a block owns
// 128 keys of one KV head and computes their logits against all the rows at once (a few mma.sync per
// warp). Pass 1 writes each row's (max, sum) over the block's keys (the part layout of the other passes,
// so probe_lse_kernel merges them) and the logits (ProbeArgs::few_logit); pass 2 (probe_few_cols_kernel,
// or this kernel's second form where the caller gave row_lse and pass 1 did not run) sums each key's
// probabilities over the rows in a fixed order into col [H_kv][n] (rsplit 1). Every read element of q is
// checked, every element of K by pass 1. 16-bit q and K of one type, K rows in 16-byte pieces, d <= D.

// Grid: (ceil(n / 128) -- or the key-block subset's length, pass 2 --, H_kv), 128 threads. NR (8 or 16)
// >= the rows qpk * n_probes; rows past them are zeros and never used. The probe positions come in the
// arguments (ProbeArgs::few_pos), so no load waits for another: the K tile's copies are issued first,
// q's rows (16-byte pieces where ProbeArgs::q_rows16) and the statistics load under them. The logits are
// one mma.sync m16n8k16 per (16 keys, 8 rows, 16 dims): warp w's keys 32 w .. 32 w + 31 as A fragments
// (ldmatrix from the tile), the rows as B fragments (from q's rows in shared memory), fp32 accumulation
// of exact products, as on the other tensor-core paths.
template <class T, int D, int NR, bool Pass1>
__global__ void __launch_bounds__(kProbeColTile) probe_few_kernel(const __grid_constant__ ProbeArgs a) {
    dependent_entry();  // programmatic dependent launch: see common.cuh
    static_assert((NR == 8 || NR == 16) && NR <= kProbeFewRows && D % 64 == 0, "few-row shape");
    constexpr int CH = D / 8;    // 16-byte pieces per row
    constexpr int KS = D / 16;   // k-steps
    constexpr int NT = NR / 8;   // n-tiles (8 rows each)
    constexpr int QLD = D + 8;   // q rows' stride in elements (272 / 144 bytes: B fragment loads conflict-free)
    __shared__ __align__(128) unsigned char kt[kProbeColTile * D * 2];  // piece c of row r at (r CH + (c ^ (r & 7))) 16
    __shared__ __align__(16) unsigned short qs[NR][QLD];
    __shared__ float ls[NR];
    __shared__ float wm[kProbeColTile / 32][NR], wl[kProbeColTile / 32][NR];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = blockIdx.y;
    const int gq = lane >> 2, tq = lane & 3;
    const int kb = !Pass1 && a.key_blocks ? a.key_blocks[blockIdx.x] : static_cast<int>(blockIdx.x);
    const int col0 = kb * kProbeColTile;
    const int nr = a.qpk * a.n_probes;
    const std::int64_t rows = static_cast<std::int64_t>(a.qpk) * a.npc * 16;  // padded rows per KV head
    {   // the block's 128 keys, whole rows per 16 threads (zeros past n and past d)
        const T* kbase = static_cast<const T*>(a.k) + static_cast<std::int64_t>(g) * a.k_s1;
#pragma unroll 4
        for (int i = tid; i < kProbeColTile * CH; i += kProbeColTile) {
            const int r = i / CH, c = i % CH;
            const bool ok = col0 + r < a.n && c * 8 < a.d;
            copy16_async(kt + (r * CH + (c ^ (r & 7))) * 16, ok ? kbase + static_cast<std::int64_t>(col0 + r) * a.k_s0 + c * 8 : kbase, ok);
        }
        copy_commit();
    }
    // Row i: query head i / n_probes of the group, probe i % n_probes (padded row index r). Its elements
    // as they are (q is of K's 16-bit type), zeros past nr and past d.
    bool bad = false;
    if (a.q_rows16) {
        for (int e = tid; e < NR * CH; e += kProbeColTile) {
            const int i = e / CH, c = e % CH;
            uint4 w = make_uint4(0, 0, 0, 0);
            if (i < nr && c * 8 < a.d) {
                const int hl = i / a.n_probes, pr = i % a.n_probes;
                w = __ldg(reinterpret_cast<const uint4*>(static_cast<const T*>(a.q) + static_cast<std::int64_t>(a.few_pos[pr]) * a.q_s0 +
                                                         static_cast<std::int64_t>(g * a.qpk + hl) * a.q_s1) + c);
                bad |= quad_nonfinite<T>(w) != 0;
            }
            *reinterpret_cast<uint4*>(&qs[i][8 * c]) = w;
        }
    } else {
        for (int e = tid; e < NR * D; e += kProbeColTile) {
            const int i = e / D, c = e % D;
            unsigned short x = 0;
            if (i < nr && c < a.d) {
                const int hl = i / a.n_probes, pr = i % a.n_probes;
                x = static_cast<const unsigned short*>(a.q)[static_cast<std::int64_t>(a.few_pos[pr]) * a.q_s0 +
                                                            static_cast<std::int64_t>(g * a.qpk + hl) * a.q_s1 +
                                                            static_cast<std::int64_t>(c) * a.q_s2];
                bad |= pair_nonfinite<T>(x);
            }
            qs[i][c] = x;
        }
    }
    if (!Pass1 && tid < NR) {
        float l = 0.0f;
        if (tid < nr) l = a.lse[static_cast<std::int64_t>(g) * rows + tid / a.n_probes * a.npc * 16 + tid % a.n_probes];
        ls[tid] = l;
    }
    copy_wait<0>();
    __syncthreads();
    // The rows as B fragments: n-tile nt, k-step ks -> row 8 nt + gq, dims 16 ks + 2 tq (+ 1, + 8, + 9).
    unsigned bf[NT][KS][2];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) {
            bf[nt][ks][0] = *reinterpret_cast<const unsigned*>(&qs[8 * nt + gq][16 * ks + 2 * tq]);
            bf[nt][ks][1] = *reinterpret_cast<const unsigned*>(&qs[8 * nt + gq][16 * ks + 2 * tq + 8]);
        }
    // c[mt][nt]: keys 32 w + 16 mt + gq (+ 8 for elements 2, 3), rows 8 nt + 2 tq (+ 1 for elements 1, 3).
    float acc[2][NT][4] = {};
    unsigned hits = 0;
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) {
            const int mi = lane >> 3, row = 32 * warp + 16 * mt + (mi & 1) * 8 + (lane & 7), c = 2 * ks + (mi >> 1);
            unsigned a0, a1, a2, a3;
            ldsm_x4(a0, a1, a2, a3, kt + (row * CH + (c ^ (row & 7))) * 16);
            if (Pass1) hits |= quad_nonfinite<T>(a0, a1, a2, a3);
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) mma_m16n8k16<T>(acc[mt][nt], a0, a1, a2, a3, bf[nt][ks][0], bf[nt][ks][1]);
        }
    bad |= hits != 0;
    if (bad && a.status) atomicOr(a.status, kInputNonFinite);
    const int key0 = col0 + 32 * warp + gq;  // + 16 mt + 8 (e >> 1)
    if constexpr (Pass1) {
        // Each row's (max, sum) over the block's keys at or before its position: the thread's four keys,
        // then the eight lanes sharing the row (xor 4, 8, 16), then the four warps in order. The logits
        // go to few_logit.
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int i = 8 * nt + 2 * tq + h;
                const int p = i < nr ? a.few_pos[i % a.n_probes] : -1;
                float v[4];
#pragma unroll
                for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                    for (int hi = 0; hi < 2; ++hi) {
                        const int key = key0 + 16 * mt + 8 * hi;
                        const float x = acc[mt][nt][2 * hi + h] * a.scale_log2;
                        if (a.few_logit && i < nr && key < a.n) a.few_logit[(static_cast<std::int64_t>(g) * nr + i) * a.n + key] = x;
                        v[2 * mt + hi] = key < a.n && key <= p ? x : -INFINITY;
                    }
                float m = fmaxf(fmaxf(v[0], v[1]), fmaxf(v[2], v[3]));
#pragma unroll
                for (int o = 4; o < 32; o <<= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
                float l = 0.0f;
                if (m != -INFINITY)
#pragma unroll
                    for (int u = 0; u < 4; ++u) l += exp2f(v[u] - m);
#pragma unroll
                for (int o = 4; o < 32; o <<= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
                if (gq == 0) {
                    wm[warp][i] = m;
                    wl[warp][i] = l;
                }
            }
        __syncthreads();
        if (tid < nr && a.few_pos[tid % a.n_probes] >= col0) {
            float m = -INFINITY, l = 0.0f;
#pragma unroll
            for (int w = 0; w < kProbeColTile / 32; ++w) merge_ml(m, l, wm[w][tid], wl[w][tid]);
            const int ncb = (a.n + kProbeColTile - 1) / kProbeColTile;
            a.part[(static_cast<std::int64_t>(g) * rows + tid / a.n_probes * a.npc * 16 + tid % a.n_probes) * ncb + kb] = make_float2(m, l);
        }
    } else {
        // Each key's probabilities: the thread's rows, then the four lanes sharing the key (xor 1, 2).
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int hi = 0; hi < 2; ++hi) {
                const int key = key0 + 16 * mt + 8 * hi;
                float t = 0.0f;
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int i = 8 * nt + 2 * tq + h;
                        if (i < nr && key <= a.few_pos[i % a.n_probes]) t += exp2f(fmaf(acc[mt][nt][2 * hi + h], a.scale_log2, -ls[i]));
                    }
                t += __shfl_xor_sync(0xffffffffu, t, 1);
                t += __shfl_xor_sync(0xffffffffu, t, 2);
                if (tq == 0 && key < a.n) a.col[static_cast<std::int64_t>(g) * a.n + key] = t;
            }
    }
}

// Pass 2 of the few-row kernel from pass 1's logits (ProbeArgs::few_logit): col[g][j] = the sum over the
// rows i with j <= p_i of 2^(logit - lse_i), in row order. One thread per (KV head, key): grid (ceil(n /
// 128) -- or the key-block subset's length --, H_kv), 128 threads.
template <int Unused = 0>
__global__ void __launch_bounds__(kProbeColTile) probe_few_cols_kernel(const __grid_constant__ ProbeArgs a) {
    dependent_entry();  // programmatic dependent launch: see common.cuh
    __shared__ float ls[kProbeFewRows];
    const int g = blockIdx.y, nr = a.qpk * a.n_probes;
    const std::int64_t rows = static_cast<std::int64_t>(a.qpk) * a.npc * 16;
    if (static_cast<int>(threadIdx.x) < nr)
        ls[threadIdx.x] = a.lse[static_cast<std::int64_t>(g) * rows + threadIdx.x / a.n_probes * a.npc * 16 + threadIdx.x % a.n_probes];
    __syncthreads();
    const int kb = a.key_blocks ? a.key_blocks[blockIdx.x] : static_cast<int>(blockIdx.x);
    const int key = kb * kProbeColTile + static_cast<int>(threadIdx.x);
    if (key >= a.n) return;
    const float* lg = a.few_logit + static_cast<std::int64_t>(g) * nr * a.n + key;
    float acc = 0.0f;
    for (int i = 0; i < nr; ++i)
        if (key <= a.few_pos[i % a.n_probes]) acc += exp2f(__ldcs(lg + static_cast<std::int64_t>(i) * a.n) - ls[i]);
    a.col[static_cast<std::int64_t>(g) * a.n + key] = acc;
}

}  // namespace vlsparse::cuda::detail
