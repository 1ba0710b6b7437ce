// vlsparse/cuda/selection/probe_columns.cuh -- the host side of the probe column sums
// (selection/probe_scores.cuh): one reusable runner that every policy scoring "attention of some query
// rows, summed into the keys" calls -- ZipVL's probes, SnapKV's observation window, H2O's every row,
// FastV's and A-VL's last row. Internal to the selection front ends (namespace vlsparse::cuda::detail).
//
//   ProbeColumns pc;
//   ProbeColumnsResult r = pc.run(q, k, probes, scale, stream, fn);
//   // r.col: device [r.rsplit][H_kv][n]: for KV head g and key j, partial sums over its query heads and
//   // the probes p >= j of softmax_{j' <= p}(scale q_{p,h} . k_{j',g}); the caller adds the r.rsplit
//   // partials (and the KV heads, for one group per layer) in a fixed order.
//   // r.status: device int, bit kInputNonFinite set when an element read was NaN / Inf.
//
// q [n, H, d] and k [n, H_kv, d] are device views (any strides); the caller has checked the shapes and
// the probes (ascending, unique, in [0, n), at least one). Everything is enqueued on `stream`; nothing
// synchronizes except a workspace that has to grow.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>
#include <vector>

#include "vlsparse/core/dtype.hpp"
#include "vlsparse/core/tensor.hpp"
#include "vlsparse/detail/check.hpp"
#include "vlsparse/cuda/common.cuh"
#include "vlsparse/cuda/selection/probe_scores.cuh"

namespace vlsparse::cuda::detail {

// A device buffer that only grows (bytes), for workspaces reused across calls.
class GrowBuffer {
public:
    GrowBuffer() = default;
    GrowBuffer(const GrowBuffer&) = delete;
    GrowBuffer& operator=(const GrowBuffer&) = delete;
    ~GrowBuffer() { cudaFree(p_); }
    void* get(std::size_t bytes, const char* fn) {
        if (bytes > n_) {
            // Work queued earlier may still use the old buffer.
            check_cuda(cudaDeviceSynchronize(), fn, "cudaDeviceSynchronize");
            cudaFree(p_);
            p_ = nullptr;
            n_ = 0;
            check_cuda(cudaMalloc(&p_, bytes), fn, "cudaMalloc");
            n_ = bytes;
        }
        return p_;
    }
    // Tests: every byte set to `byte` (poison). Synchronizes.
    void fill(int byte, const char* fn) {
        if (n_ == 0) return;
        check_cuda(cudaMemset(p_, byte, n_), fn, "cudaMemset");
        check_cuda(cudaDeviceSynchronize(), fn, "cudaDeviceSynchronize");
    }

private:
    void* p_ = nullptr;
    std::size_t n_ = 0;
};

// Pinned host memory that only grows, with an event marking when the last copy out of it was done.
class PinnedStaging {
public:
    PinnedStaging() = default;
    PinnedStaging(const PinnedStaging&) = delete;
    PinnedStaging& operator=(const PinnedStaging&) = delete;
    ~PinnedStaging() {
        cudaFreeHost(p_);
        if (done_) cudaEventDestroy(done_);
    }
    // `bytes` of pinned memory, once the copies queued from it before have finished.
    char* get(std::size_t bytes, const char* fn) {
        if (done_) check_cuda(cudaEventSynchronize(done_), fn, "cudaEventSynchronize");
        else check_cuda(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), fn, "cudaEventCreate");
        if (bytes > n_) {
            cudaFreeHost(p_);
            p_ = nullptr;
            n_ = 0;
            check_cuda(cudaMallocHost(&p_, bytes), fn, "cudaMallocHost");
            n_ = bytes;
        }
        return static_cast<char*>(p_);
    }
    // After the copies out of it are enqueued on `stream`.
    void mark(cudaStream_t stream, const char* fn) { check_cuda(cudaEventRecord(done_, stream), fn, "cudaEventRecord"); }

private:
    void* p_ = nullptr;
    std::size_t n_ = 0;
    cudaEvent_t done_ = nullptr;
};

inline std::size_t align256(std::size_t b) { return (b + 255) / 256 * 256; }

// The caller's row statistics into lse (ProbeArgs::row_lse), in place of pass 1 and its lse merge.
inline void launch_probe_lse_ext(ProbeArgs& a, cudaStream_t stream, const char* fn) {
    const std::int64_t total = static_cast<std::int64_t>(a.Hkv) * a.qpk * a.npc * 16;
    launch_dependent(probe_lse_ext_kernel<>, static_cast<unsigned>((total + 255) / 256), 256, 0, stream, fn,
                     "probe_lse_ext_kernel", a);
}

// The tensor-core probe passes: the packing of q's probe rows (`pack_total` threads), pass 1, the lse
// merge, pass 2 (grid: key blocks x rsplit, H_kv). Both paths (mma.sync, wgmma) launch this chain.
template <class Pack, class Pass>
void launch_probe_chain(ProbeArgs& a, Pack* pack, std::int64_t pack_total, Pass* pass1, Pass* pass2, int threads,
                        std::size_t shm, const char* const (&names)[3], cudaStream_t stream, const char* fn) {
    if (!a.q_tma) launch_dependent(pack, static_cast<unsigned>((pack_total + 255) / 256), 256, 0, stream, fn, names[0], a);
    const unsigned ncb = static_cast<unsigned>((a.n + kProbeColTile - 1) / kProbeColTile);
    for (int pass = 1; pass <= 2; ++pass) {
        if (pass == 1 && a.row_lse) {  // the caller's row statistics instead of pass 1
            launch_probe_lse_ext(a, stream, fn);
            continue;
        }
        const dim3 grid(pass == 2 && a.key_splits ? static_cast<unsigned>(a.n_splits) : ncb * a.rsplit, static_cast<unsigned>(a.Hkv));
        Pass* k = pass == 1 ? pass1 : pass2;
        check_cuda(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shm)), fn,
                   "cudaFuncSetAttribute");
        check_cuda(cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared), fn,
                   "cudaFuncSetAttribute");
        launch_dependent(k, grid, threads, shm, stream, fn, names[pass], a);
        if (pass == 1) {
            const std::int64_t rows = static_cast<std::int64_t>(a.Hkv) * a.qpk * a.npc * 16;  // a warp each
            launch_dependent(probe_lse_kernel<>, static_cast<unsigned>((rows + 7) / 8), 256, 0, stream, fn,
                             "probe_lse_kernel", a);
        }
    }
}

// mma.sync: 16-row chunks.
template <class T, int D>
void launch_probe_mma(ProbeArgs& a, cudaStream_t stream, const char* fn) {
    static const char* const names[3] = {"probe_pack_mma_kernel", "probe_cols_mma_kernel (pass 1)",
                                         "probe_cols_mma_kernel (pass 2)"};
    const std::int64_t total = static_cast<std::int64_t>(a.Hkv) * a.qpk * a.npc * (D / 16) * 32;
    launch_probe_chain(a, probe_pack_mma_kernel<T, D>, total, probe_cols_mma_kernel<T, D, true>,
                       probe_cols_mma_kernel<T, D, false>, kProbeThreads, probe_cols_smem_bytes<T, D>(), names, stream, fn);
}

// wgmma (sm_90a; npc a multiple of 4): 64-row chunks.
template <class T, int D>
void launch_probe_wg(ProbeArgs& a, cudaStream_t stream, const char* fn) {
    using S = ProbeWgShape<D>;
    static const char* const names[3] = {"probe_pack_wg_kernel", "probe_cols_wg_kernel (pass 1)",
                                         "probe_cols_wg_kernel (pass 2)"};
    const std::int64_t total = static_cast<std::int64_t>(a.Hkv) * a.qpk * (a.npc / 4) * kProbeWgRows * S::CH;
    launch_probe_chain(a, probe_pack_wg_kernel<T, D>, total, probe_cols_wg_kernel<T, D, true>,
                       probe_cols_wg_kernel<T, D, false>, kProbeWgThreads, S::smem_bytes(), names, stream, fn);
}

// Which tensor-core probe passes run: 0 the automatic choice (the few-row kernel for up to kProbeFewRows
// rows per KV head, wgmma where it runs and the probe rows fill 64-row chunks, else mma.sync; on wgmma,
// the chunk layout that the (chunk, key block) pairs favour), 1 mma.sync always (never the few-row
// kernel), 2 / 3 wgmma (where the automatic choice would take it) with the merged / per-head chunk
// layout, 4 as 3 but chunks always from the packed copy of q (never read from q by the bulk tensor copy:
// ProbeArgs::q_tma). For the tests, which check every path on one GPU; not an API.
inline std::atomic<int>& probe_path_override() {
    static std::atomic<int> v{0};
    return v;
}

// A few probe rows (probe_few_kernel): pass 1 (or the caller's row statistics), the lse merge, pass 2.
template <class T, int D, int NR>
void launch_probe_few_rows(ProbeArgs& a, cudaStream_t stream, const char* fn) {
    const unsigned ncb = static_cast<unsigned>((a.n + kProbeColTile - 1) / kProbeColTile);
    if (a.row_lse) {
        launch_probe_lse_ext(a, stream, fn);
    } else {
        launch_dependent(probe_few_kernel<T, D, NR, true>, dim3(ncb, static_cast<unsigned>(a.Hkv)), kProbeColTile, 0, stream, fn,
                         "probe_few_kernel (pass 1)", a);
        const std::int64_t rows = static_cast<std::int64_t>(a.Hkv) * a.qpk * a.npc * 16;  // a warp each
        launch_dependent(probe_lse_kernel<>, static_cast<unsigned>((rows + 7) / 8), 256, 0, stream, fn, "probe_lse_kernel", a);
    }
    // Pass 2 from pass 1's logits (a small read per key), else from K.
    const dim3 grid2(a.key_blocks ? static_cast<unsigned>(a.n_key_blocks) : ncb, static_cast<unsigned>(a.Hkv));
    if (a.few_logit) launch_dependent(probe_few_cols_kernel<>, grid2, kProbeColTile, 0, stream, fn, "probe_few_cols_kernel", a);
    else launch_dependent(probe_few_kernel<T, D, NR, false>, grid2, kProbeColTile, 0, stream, fn, "probe_few_kernel (pass 2)", a);
}
template <class T>
void launch_probe_few(ProbeArgs& a, cudaStream_t stream, const char* fn) {
    const bool r8 = a.qpk * a.n_probes <= 8;
    if (a.d <= 64) {
        if (r8) launch_probe_few_rows<T, 64, 8>(a, stream, fn);
        else launch_probe_few_rows<T, 64, kProbeFewRows>(a, stream, fn);
    } else if (r8) {
        launch_probe_few_rows<T, 128, 8>(a, stream, fn);
    } else {
        launch_probe_few_rows<T, 128, kProbeFewRows>(a, stream, fn);
    }
}

inline void launch_probe_simt(ProbeArgs& a, cudaStream_t stream, const char* fn) {
    const std::int64_t rows = static_cast<std::int64_t>(a.qpk) * a.npc * 16;
    {
        const std::int64_t total = static_cast<std::int64_t>(a.Hkv) * rows * a.d;
        launch_dependent(probe_pack_simt_kernel<>, static_cast<unsigned>((total + 255) / 256), 256, 0, stream, fn,
                         "probe_pack_simt_kernel", a);
    }
    if (a.row_lse) {
        launch_probe_lse_ext(a, stream, fn);
    } else {
        const std::size_t shm = static_cast<std::size_t>(4 * a.d) * sizeof(float);
        launch_dependent(probe_pass1_simt_kernel<>, static_cast<unsigned>((rows * a.Hkv + 3) / 4), kProbeThreads, shm,
                         stream, fn, "probe_pass1_simt_kernel", a);
    }
    {
        const std::size_t shm = (static_cast<std::size_t>(kProbeSimtCols) * (a.d + 1) + a.d) * sizeof(float);
        auto* k2 = probe_pass2_simt_kernel<>;
        check_cuda(cudaFuncSetAttribute(k2, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shm)), fn,
                   "cudaFuncSetAttribute");
        const dim3 grid(a.key_blocks ? static_cast<unsigned>(a.n_key_blocks) * (kProbeColTile / kProbeSimtCols)
                                     : static_cast<unsigned>((a.n + kProbeSimtCols - 1) / kProbeSimtCols),
                        static_cast<unsigned>(a.Hkv));
        launch_dependent(k2, grid, kProbeSimtCols, shm, stream, fn, "probe_pass2_simt_kernel", a);
    }
}

// The column sums of each group from the runner's partials: out[g * out_len + j] = the sum over the
// splits (and, for one group, over the KV heads) of col[z][h][j] for j < L, in a fixed order; 0 for
// L <= j < out_len. Grid-stride over G x out_len.
template <int Unused = 0>
__global__ void group_column_sums_kernel(const float* col, int rsplit, int Hkv, int n, int G, int L, int out_len,
                                         float* out) {
    dependent_entry();  // programmatic dependent launch: see common.cuh
    const std::int64_t total = static_cast<std::int64_t>(G) * out_len;
    for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
         i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
        const int g = static_cast<int>(i / out_len), j = static_cast<int>(i % out_len);
        float a = 0.0f;
        if (j < L)
            for (int z = 0; z < rsplit; ++z) {
                const float* cz = col + static_cast<std::int64_t>(z) * Hkv * n + j;
                if (G == 1) {
                    for (int h = 0; h < Hkv; ++h) a += cz[static_cast<std::int64_t>(h) * n];
                } else {
                    a += cz[static_cast<std::int64_t>(g) * n];
                }
            }
        out[i] = a;
    }
}

// Row statistics computed elsewhere (ProbeColumns::run): the natural log-sum-exp of query row p, head h at
// lse[p * s0 + h * s1] (the dense prefill's, cuda::dense_prefill_attention with lse), in place of pass 1.
struct ProbeRowLse {
    const float* lse = nullptr;  // null: none given (pass 1 computes them)
    std::int64_t s0 = 0, s1 = 0;
    // Head h's statistics alone (for a run over a one-head view of q).
    ProbeRowLse head(std::int64_t h) const { return lse ? ProbeRowLse{lse + h * s1, s0, s1} : ProbeRowLse{}; }
};

// A front end's row_lse argument checked against q's rows and heads (a device view [rows, H], any strides).
inline ProbeRowLse checked_row_lse(View2<const float> v, std::int64_t rows, std::int64_t H, const char* fn) {
    require(v.data != nullptr, fn, "row_lse is a null view (the overload without it computes the rows' statistics)");
    require(v.shape[0] == rows && v.shape[1] == H, fn, "row_lse has shape [", v.shape[0], ", ", v.shape[1], "], expected [",
            rows, ", ", H, "] (rows of q, H)");
    ::vlsparse::detail::check_strides(v, fn, "row_lse", false);
    return {v.data, v.stride[0], v.stride[1]};
}

struct ProbeColumnsResult {
    const float* col = nullptr;            // device [rsplit][H_kv][n]
    int rsplit = 1;
    const std::int32_t* probes = nullptr;  // device [n_probes] (int32 positions, ascending)
    int n_probes = 0;
    int* status = nullptr;                 // device status word (cleared by run)
};

class ProbeColumns {
public:
    // row_lse: the probe rows' statistics given (pass 1 skipped; K -- and q where its chunks are read by
    // the bulk tensor copy -- is then not checked for NaN / Inf).
    // key_blocks: pass 2 over these 128-key blocks only (ascending, unique, in [0, ceil(n / 128))); the
    // columns of the other blocks are 0 in r.col.
    template <ElementType TQ, ElementType TK>
    ProbeColumnsResult run(View3<const TQ> q, View3<const TK> k, std::span<const std::int64_t> probes, double scale,
                           cudaStream_t stream, const char* fn, ProbeRowLse row_lse = {},
                           std::span<const std::int32_t> key_blocks = {}) {
        const std::int64_t n = q.shape[0], H = q.shape[1], d = q.shape[2], Hkv = k.shape[1];
        const auto np = static_cast<std::int64_t>(probes.size());
        constexpr bool same16 = std::is_same_v<std::remove_const_t<TQ>, std::remove_const_t<TK>> && sizeof(TQ) == 2;
        const bool mma = same16 && d <= 128;
        // K's elements readable as aligned 32-bit pairs / its rows copyable in 16-byte pieces.
        const bool k_pairs = same16 && k.stride[2] == 1 && d % 2 == 0 && k.stride[0] % 2 == 0 && k.stride[1] % 2 == 0 &&
                             reinterpret_cast<std::uintptr_t>(k.data) % 4 == 0;
        const bool k_rows16 = k_pairs && d % 8 == 0 && k.stride[0] % 8 == 0 && k.stride[1] % 8 == 0 &&
                              reinterpret_cast<std::uintptr_t>(k.data) % 16 == 0;
        // wgmma (Hopper, sm_90a code): probe rows in chunks of 64, so for at least 64 probes (fewer would
        // leave most of a chunk padding: the mma.sync passes take 16-row chunks).
        const bool wg = mma && k_rows16 && np >= kProbeWgRows && probe_path_override().load() != 1 && wgmma_runs_here(fn);
        // A few rows per KV head (FastV's and A-VL's last row, short windows): one CUDA-core thread per key
        // instead of the tensor-core passes' 16-row chunks (probe_few_kernel).
        const bool few = mma && k_rows16 && H / Hkv * np <= kProbeFewRows && probe_path_override().load() == 0;
        const std::int64_t npc = wg ? (np + kProbeWgRows - 1) / kProbeWgRows * 4 : (np + 15) / 16, qpk = H / Hkv;
        const std::int64_t rows = qpk * npc * 16;  // per KV head
        // Tensor cores: the chunks of a key block shared out over rsplit blocks (and, over a key-block
        // subset, the blocks' splits).
        std::vector<int4> splits;
        const int rsplit = mma && !few ? plan_rsplit(n, Hkv, wg, probes, key_blocks, splits, fn) : 1;
        const std::int64_t ncb = (n + kProbeColTile - 1) / kProbeColTile;
        const std::size_t b_part = mma && !row_lse.lse ? align256(static_cast<std::size_t>(Hkv * rows * ncb) * 8) : 0;
        const std::size_t b_lse = align256(static_cast<std::size_t>(Hkv * rows) * 4) +
                                  (few && !row_lse.lse ? align256(static_cast<std::size_t>(Hkv * qpk * np * n) * 4) : 0);  // (+ few_logit)
        // (a key-block subset on the tensor cores: the columns [H_kv][n], and the splits' partials of the
        // subset's columns [rsplit][H_kv][n_key_blocks][128], folded into them)
        const std::size_t b_col = align256(static_cast<std::size_t>((splits.empty() ? rsplit : 1) * Hkv * n) * 4) +
                                  align256(splits.size() ? static_cast<std::size_t>(rsplit * Hkv) * key_blocks.size() * kProbeColTile * 4 : 0);
        // wgmma: a KV head's chunk rows merged (its heads' probe rows in position order) or per head.
        bool per_head = false;
        int wg_pad = 0;
        if (wg) choose_wg_layout(probes, qpk, rows, ncb, per_head, wg_pad);
        // Uploaded: (mma.sync) the padded probe positions and each 16-row chunk's last; (wgmma) each key
        // block's first active chunk of a segment; the probes as int32; the status word (cleared by the
        // same copy). On the device only: (wgmma) the rows' positions.
        const std::size_t b_pos = wg ? 0 : align256(static_cast<std::size_t>(npc * 16) * 4);
        const std::size_t b_cmax = wg ? 0 : align256(static_cast<std::size_t>(npc) * 4);
        const std::size_t b_first = wg ? align256(static_cast<std::size_t>(ncb) * 4) : 0;
        const std::size_t b_probes = align256(static_cast<std::size_t>(np) * 4);
        const std::size_t b_status = 256;
        const std::size_t b_kb = align256(key_blocks.size() * 4) + align256(splits.size() * sizeof(int4));
        const std::size_t b_wrows = wg ? align256(static_cast<std::size_t>(rows) * 4) : 0;
        const std::size_t up = b_pos + b_cmax + b_first + b_probes + b_status + b_kb;
        // Pass 2 alone over every row in the per-head layout, q of D columns: its chunks straight from q by
        // the bulk tensor copy (ProbeArgs::q_tma), so no packed copy of q is made or allocated.
        CUtensorMap tmap_q{};
        bool q_tma = false;
        if constexpr (same16) {
            const bool every_row = np == n && probes.front() == 0 && probes.back() == n - 1;  // (ascending, unique)
            if (wg && per_head && row_lse.lse && every_row && (d == 64 || d == 128) && q.stride[2] == 1 && q.stride[0] % 8 == 0 &&
                q.stride[1] % 8 == 0 && reinterpret_cast<std::uintptr_t>(q.data) % 16 == 0 && probe_path_override().load() != 4)
                q_tma = encode_rows_tensor_map<std::remove_const_t<TQ>>(tmap_q, q.data, static_cast<int>(d), static_cast<int>(n),
                                                                        static_cast<int>(H), q.stride[0], q.stride[1], kProbeWgRows);
        }
        // The probe rows of q packed for the passes (none for the few-row kernel, which reads q itself, or
        // under q_tma).
        const std::size_t b_q = few || q_tma ? 0
                                : mma ? align256(static_cast<std::size_t>(Hkv * qpk * npc * ((d <= 64 ? 64 : 128) / 16) * 32) * 16)
                                      : align256(static_cast<std::size_t>(Hkv * rows * d) * 4);
        char* base = static_cast<char*>(work_.get(up + b_wrows + b_q + b_part + b_lse + b_col, fn));
        auto* pos_d = reinterpret_cast<std::int32_t*>(base);
        auto* cmax_d = reinterpret_cast<std::int32_t*>(base + b_pos);
        auto* first_d = reinterpret_cast<std::int32_t*>(base + b_pos + b_cmax);
        auto* probes_d = reinterpret_cast<std::int32_t*>(base + b_pos + b_cmax + b_first);
        int* status_d = reinterpret_cast<int*>(base + b_pos + b_cmax + b_first + b_probes);
        const std::size_t at_kb = b_pos + b_cmax + b_first + b_probes + b_status, at_ks = at_kb + align256(key_blocks.size() * 4);
        auto* kb_d = reinterpret_cast<std::int32_t*>(base + at_kb);
        auto* ks_d = reinterpret_cast<int4*>(base + at_ks);
        auto* wpos_d = reinterpret_cast<std::int32_t*>(base + up);
        char* at = base + up + b_wrows;
        void* qbuf = at;
        auto* part_d = reinterpret_cast<float2*>(at + b_q);
        auto* lse_d = reinterpret_cast<float*>(at + b_q + b_part);
        auto* col_d = reinterpret_cast<float*>(at + b_q + b_part + b_lse);
        float* sub_d = col_d + align256(static_cast<std::size_t>(Hkv * n) * 4) / 4;  // (splits only)

        char* h = staging_.get(up, fn);
        if (wg) {
            // Key block kb's first active chunk: the first of a segment whose last row's position is at
            // or after 128 kb (positions ascend in a segment, so one merge over blocks and chunks).
            auto* first_h = reinterpret_cast<std::int32_t*>(h + b_pos + b_cmax);
            const std::int64_t cps = per_head ? rows / qpk / kProbeWgRows : rows / kProbeWgRows;
            std::int64_t c = 0;
            for (std::int64_t kb = 0; kb < ncb; ++kb) {
                while (c < cps && wg_chunk_last(probes, qpk, per_head, wg_pad, c) < kb * kProbeColTile) ++c;
                first_h[kb] = static_cast<std::int32_t>(c);
            }
        } else {
            auto* pos_h = reinterpret_cast<std::int32_t*>(h);
            auto* cmax_h = reinterpret_cast<std::int32_t*>(h + b_pos);
            for (std::int64_t i = 0; i < npc * 16; ++i) pos_h[i] = i < np ? static_cast<std::int32_t>(probes[static_cast<std::size_t>(i)]) : -1;
            for (std::int64_t c = 0; c < npc; ++c)
                cmax_h[c] = static_cast<std::int32_t>(probes[static_cast<std::size_t>(std::min(np - 1, 16 * c + 15))]);
        }
        auto* probes_h = reinterpret_cast<std::int32_t*>(h + b_pos + b_cmax + b_first);
        for (std::int64_t i = 0; i < np; ++i) probes_h[i] = static_cast<std::int32_t>(probes[static_cast<std::size_t>(i)]);
        std::memset(h + b_pos + b_cmax + b_first + b_probes, 0, b_status);
        if (!key_blocks.empty()) std::memcpy(h + at_kb, key_blocks.data(), key_blocks.size() * 4);
        if (!splits.empty()) std::memcpy(h + at_ks, splits.data(), splits.size() * sizeof(int4));
        check_cuda(cudaMemcpyAsync(base, h, up, cudaMemcpyHostToDevice, stream), fn, "cudaMemcpyAsync");
        staging_.mark(stream, fn);

        ProbeArgs a;
        a.q = q.data;
        a.k = k.data;
        a.q_type = dtype_of<TQ>();
        a.k_type = dtype_of<TK>();
        a.q_s0 = q.stride[0];
        a.q_s1 = q.stride[1];
        a.q_s2 = q.stride[2];
        a.k_s0 = k.stride[0];
        a.k_s1 = k.stride[1];
        a.k_s2 = k.stride[2];
        a.n = static_cast<int>(n);
        a.d = static_cast<int>(d);
        a.H = static_cast<int>(H);
        a.Hkv = static_cast<int>(Hkv);
        a.qpk = static_cast<int>(qpk);
        a.n_probes = static_cast<int>(np);
        a.npc = static_cast<int>(npc);
        a.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
        a.k_pairs = k_pairs;
        a.k_rows16 = k_rows16;
        if (wg) {
            a.probes = probes_d;
            a.wg_pos = wpos_d;
            a.wg_first = first_d;
            a.wg_segs = per_head ? static_cast<int>(qpk) : 1;
            a.wg_pad = wg_pad;
        } else {
            a.pos = pos_d;
            a.cmax = cmax_d;
        }
        a.part = part_d;
        a.lse = lse_d;
        a.col = col_d;
        a.status = status_d;
        a.rsplit = rsplit;
        a.row_lse = row_lse.lse;
        a.row_lse_s0 = row_lse.s0;
        a.row_lse_s1 = row_lse.s1;
        if (q_tma) {
            a.tmap_q = tmap_q;
            a.q_tma = 1;
        }
        if (!key_blocks.empty()) {
            a.key_blocks = kb_d;
            a.n_key_blocks = static_cast<int>(key_blocks.size());
            if (!splits.empty()) {
                a.key_splits = ks_d;
                a.n_splits = static_cast<int>(splits.size());
                a.col = sub_d;
            }
            check_cuda(cudaMemsetAsync(col_d, 0, b_col, stream), fn, "cudaMemsetAsync");
        }
        if (few) {
            for (std::int64_t i = 0; i < np; ++i) a.few_pos[i] = static_cast<std::int32_t>(probes[static_cast<std::size_t>(i)]);
            if (!row_lse.lse) a.few_logit = lse_d + align256(static_cast<std::size_t>(Hkv * rows) * 4) / 4;
            a.q_rows16 = q.stride[2] == 1 && d % 8 == 0 && q.stride[0] % 8 == 0 && q.stride[1] % 8 == 0 &&
                         reinterpret_cast<std::uintptr_t>(q.data) % 16 == 0;
            if constexpr (same16) launch_probe_few<std::remove_const_t<TQ>>(a, stream, fn);
        } else if (mma) {
            a.qpack = static_cast<const uint4*>(qbuf);
            if constexpr (same16) {
                using T = std::remove_const_t<TQ>;
                if (wg) {
                    if (d <= 64) launch_probe_wg<T, 64>(a, stream, fn);
                    else launch_probe_wg<T, 128>(a, stream, fn);
                } else if (d <= 64) {
                    launch_probe_mma<T, 64>(a, stream, fn);
                } else {
                    launch_probe_mma<T, 128>(a, stream, fn);
                }
            }
        } else {
            a.qrows = static_cast<const float*>(qbuf);
            launch_probe_simt(a, stream, fn);
        }
        if (!splits.empty()) {  // the splits' partials of the subset's columns, summed into col_d
            const std::int64_t total = Hkv * static_cast<std::int64_t>(key_blocks.size()) * kProbeColTile;
            launch_dependent(probe_fold_kernel<>, static_cast<unsigned>((total + 255) / 256), 256, 0, stream, fn, "probe_fold_kernel",
                             static_cast<const float*>(sub_d), rsplit, static_cast<int>(Hkv), static_cast<int>(key_blocks.size()),
                             static_cast<const std::int32_t*>(kb_d), static_cast<int>(n), col_d);
            return {col_d, 1, probes_d, static_cast<int>(np), status_d};
        }
        return {col_d, rsplit, probes_d, static_cast<int>(np), status_d};
    }

    void fill(int byte, const char* fn) { work_.fill(byte, fn); }

private:
    // How many blocks share a key block's chunks (rsplit: about two waves of 4 blocks per multiprocessor
    // wanted on the mma.sync passes, one of 2 on wgmma); over a key-block subset, each block's share of
    // them by its rows (`splits`: {key block, z, R, index in key_blocks} per block).
    static int plan_rsplit(std::int64_t n, std::int64_t Hkv, bool wg, std::span<const std::int64_t> probes,
                           std::span<const std::int32_t> key_blocks, std::vector<int4>& splits, const char* fn) {
        int dev = 0, sms = 0;
        check_cuda(cudaGetDevice(&dev), fn, "cudaGetDevice");
        check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), fn, "cudaDeviceGetAttribute");
        const std::int64_t blocks =
            (key_blocks.empty() ? (n + kProbeColTile - 1) / kProbeColTile : static_cast<std::int64_t>(key_blocks.size())) * Hkv;
        // (wgmma: one wave of 2 blocks of 288 threads per multiprocessor is enough: more splits add
        // blocks whose start -- the key tile, the chunk search -- costs more than their chunks. A few
        // key blocks of many rows -- A-VL's text columns -- split further.)
        const std::int64_t want = wg ? 2 * sms : 8 * sms;
        int rsplit = static_cast<int>(std::clamp<std::int64_t>((want + blocks - 1) / blocks, 1, 8));
        if (!key_blocks.empty()) {
            // Each key block's share of the wanted blocks by the probes at or after its first key (its
            // rows; a text block at the prompt's start is seen by every row, one at its end by a few).
            std::vector<std::int64_t> work(key_blocks.size());
            std::int64_t total = 0;
            for (std::size_t i = 0; i < key_blocks.size(); ++i) {
                const std::int64_t first_key = static_cast<std::int64_t>(key_blocks[i]) * kProbeColTile;
                work[i] = static_cast<std::int64_t>(probes.end() - std::lower_bound(probes.begin(), probes.end(), first_key));
                total += work[i];
            }
            rsplit = 1;
            for (std::size_t i = 0; i < key_blocks.size(); ++i) {
                const double share = total > 0 ? static_cast<double>(work[i]) / static_cast<double>(total) : 0.0;
                const int R = static_cast<int>(std::clamp<std::int64_t>(std::llround(static_cast<double>(want) / static_cast<double>(Hkv) * share), 1, 64));
                rsplit = std::max(rsplit, R);
                for (int z = 0; z < R; ++z) splits.push_back(make_int4(key_blocks[i], z, R, static_cast<int>(i)));
            }
        }
        return rsplit;
    }

    // The position of wgmma chunk c's last row in either layout (its padding rows first), -1 for a chunk
    // of padding only: the host's form of probe_wg_row (probe_scores.cuh), for the pair counts of
    // choose_wg_layout and each key block's first chunk.
    static std::int64_t wg_chunk_last(std::span<const std::int64_t> probes, std::int64_t qpk, bool head_layout,
                                      std::int64_t pad, std::int64_t c) {
        const std::int64_t r = c * kProbeWgRows + kProbeWgRows - 1 - pad;
        return r < 0 ? -1 : probes[static_cast<std::size_t>(head_layout ? r : r / qpk)];
    }

    // wgmma: a KV head's chunk rows in one of two layouts (probe_scores.cuh, above kProbeWgRows):
    // merged, its heads' probe rows in position order, or per head. Merged makes a chunk span fewer
    // positions, so the key blocks after its last one skip more chunks; per head walks faster where
    // both skip about as many (every row a probe: H2O at 16K 5.7 against 7.5 ms, H100). So merged
    // where it leaves 10% fewer (chunk, key block) pairs: ZipVL's recent + random probes (about 25%
    // fewer), not H2O (under 1%). The rows' positions are worked out on the device (the pack kernel
    // writes them): built per row on the host, H2O's 115K rows per KV head at 16K took about 0.15 ms
    // of loops and a 1 MB upload before the first launch. Padding rows come first in either layout.
    static void choose_wg_layout(std::span<const std::int64_t> probes, std::int64_t qpk, std::int64_t rows, std::int64_t ncb,
                                 bool& per_head, int& wg_pad) {
        const std::int64_t np = static_cast<std::int64_t>(probes.size());
        auto blocks_seen = [&](std::int64_t last) { return last < 0 ? 0 : std::min(last / kProbeColTile + 1, ncb); };
        const std::int64_t pad_head = rows / qpk - np;  // per head: padding rows first
        const std::int64_t pad_merged = rows - qpk * np;
        std::int64_t pairs_head = 0, pairs_merged = 0;
        for (std::int64_t c = 0; c < rows / qpk / kProbeWgRows; ++c)
            pairs_head += qpk * blocks_seen(wg_chunk_last(probes, qpk, true, pad_head, c));
        for (std::int64_t c = 0; c < rows / kProbeWgRows; ++c)
            pairs_merged += blocks_seen(wg_chunk_last(probes, qpk, false, pad_merged, c));
        const int force = probe_path_override().load();
        per_head = force == 3 || force == 4 || (force != 2 && 10 * pairs_merged > 9 * pairs_head);
        wg_pad = static_cast<int>(per_head ? pad_head : pad_merged);
    }

    GrowBuffer work_;
    PinnedStaging staging_;
};

}  // namespace vlsparse::cuda::detail
