// vlsparse/cuda/zipvl.cuh -- ZipVL's selection on the GPU (namespace vlsparse::cuda): probes, probe
// attention, accumulated and normalized scores, the adaptive count p from tau, top-k and the forced
// keeps, for one layer of a prefill whose q and k are already on the device.
//
// Same Params (ZipVLParams), same probes (zipvl_probes: same generator, same seed), same equations
// and tie rule as reference::zipvl_select and simd::zipvl_select (see vlsparse/policies/zipvl_params.hpp):
//
//   ZipVLSelector sel;                                            // owns its device workspace; reuse it
//   const cuda::DeviceZipVLSelection& s = sel.select(q, k, layout, layer, params, stream);
//   s.p[g], s.indptr (host), s.indices / s.indptr_dev (device CSR lists, int32 positions, ascending),
//   s.accumulated / s.normalized (device [G][n] fp32), s.rows() (the lists as BatchRowLists, the form
//   the decode kernels and the KV compaction take), s.to_host() (a TokenSelection, for tests and logs).
//
// q [n, H, d] and k [n, H_kv, d] are device views (any strides). bf16 / bf16 and fp16 / fp16 with
// d <= 128 run on the tensor cores; every other combination (fp32, mixed types, d up to 256) on the
// CUDA cores. The call ends with one synchronization of `stream` (the host needs p and the list lengths
// to describe the lists); the result stays valid until the next select() of the same selector.
// Differences from the CPU paths: scores are summed in fp32 (the reference sums in double), so p and
// the kept set can differ where the recomputed scores tie within that precision at the cut; nothing
// else. NaN / Inf in what the selection reads (every element of k, the probe rows of q) is always an
// error, found by the loads that read them (no extra pass; params.check_finite changes nothing here):
// the q rows that are not probes are not read, so not checked (the prefill that reads them checks
// its own inputs). An fp32 overflow of a probe logit is an error too. Errors are thrown after the
// call's synchronization; the selector stays usable.
// Include: this header, from a .cu translation unit (nvcc, C++20).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <type_traits>
#include <vector>

#include "vlsparse/attention/common.hpp"
#include "vlsparse/core/layout.hpp"
#include "vlsparse/core/selection.hpp"
#include "vlsparse/core/tensor.hpp"
#include "vlsparse/cuda/common.cuh"
#include "vlsparse/cuda/selection/probe_scores.cuh"
#include "vlsparse/cuda/selection/select.cuh"
#include "vlsparse/kv/kv_batch.hpp"
#include "vlsparse/policies/zipvl_params.hpp"

namespace vlsparse::cuda {

// What ZipVL decided for one layer, on the device (lists, scores) and on the host (probes, p, list
// bounds). G groups: 1 (layer-wise) or H_kv (per KV head); a dense layer has one list of every position.
struct DeviceZipVLSelection {
    std::int64_t n = 0;
    bool dense = false;
    std::int64_t heads_per_group = 0;
    std::vector<std::int64_t> probes;      // host, ascending
    std::vector<std::int64_t> p;           // host [G]: the adaptive count of each group
    std::vector<std::int32_t> indptr;      // host [lists + 1]
    const std::int32_t* indices = nullptr;     // device [indptr.back()]: the kept positions, list by list
    const std::int32_t* indptr_dev = nullptr;  // device copy of indptr
    const float* accumulated = nullptr;    // device [G][n] a_j (null in a dense layer)
    const float* normalized = nullptr;     // device [G][n] a~_j (null in a dense layer)

    std::int64_t groups() const { return static_cast<std::int64_t>(p.size()); }
    std::int64_t lists() const { return static_cast<std::int64_t>(indptr.size()) - 1; }
    std::int64_t kept(std::int64_t list) const { return indptr.at(static_cast<std::size_t>(list) + 1) - indptr.at(static_cast<std::size_t>(list)); }
    // Mean over lists of |kept| / n, as TokenSelection::kept_ratio.
    double kept_ratio() const {
        if (n == 0 || lists() == 0) return 0.0;
        return static_cast<double>(indptr.back()) / (static_cast<double>(lists()) * static_cast<double>(n));
    }
    // The lists as the decode kernels and the KV compaction take them (batch of one sequence): one list
    // shared by every KV head, or one per KV head.
    BatchRowLists rows() const { return {indptr_dev, indices, static_cast<std::int32_t>(lists())}; }
    // A host copy as the CPU paths return it (synchronizes the device).
    TokenSelection to_host() const {
        constexpr const char* fn = "cuda::DeviceZipVLSelection::to_host";
        TokenSelection s;
        s.n = n;
        s.indices.resize(static_cast<std::size_t>(lists()));
        std::vector<std::int32_t> all(static_cast<std::size_t>(indptr.empty() ? 0 : indptr.back()));
        if (!all.empty())
            detail::check_cuda(cudaMemcpy(all.data(), indices, all.size() * sizeof(std::int32_t), cudaMemcpyDeviceToHost),
                               fn, "cudaMemcpy");
        for (std::int64_t l = 0; l < lists(); ++l)
            s.indices[static_cast<std::size_t>(l)].assign(all.begin() + indptr[static_cast<std::size_t>(l)],
                                                          all.begin() + indptr[static_cast<std::size_t>(l) + 1]);
        if (!dense) {
            std::vector<float> sc(static_cast<std::size_t>(groups() * n));
            detail::check_cuda(cudaMemcpy(sc.data(), normalized, sc.size() * sizeof(float), cudaMemcpyDeviceToHost), fn,
                               "cudaMemcpy");
            s.scores.assign(static_cast<std::size_t>(groups()), std::vector<double>(static_cast<std::size_t>(n)));
            for (std::int64_t g = 0; g < groups(); ++g)
                for (std::int64_t j = 0; j < n; ++j)
                    s.scores[static_cast<std::size_t>(g)][static_cast<std::size_t>(j)] = sc[static_cast<std::size_t>(g * n + j)];
        }
        return s;
    }
};

namespace detail {

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
    void fill(int byte, const char* fn) {
        if (n_ == 0) return;
        check_cuda(cudaMemset(p_, byte, n_), fn, "cudaMemset");
        check_cuda(cudaDeviceSynchronize(), fn, "cudaDeviceSynchronize");
    }

private:
    void* p_ = nullptr;
    std::size_t n_ = 0;
};

inline std::size_t align256(std::size_t b) { return (b + 255) / 256 * 256; }

template <class T, int D>
void launch_probe_mma(ProbeArgs& a, cudaStream_t stream, const char* fn) {
    constexpr int KS = D / 16;
    const int chunks = a.qpk * a.npc;
    {
        const std::int64_t total = static_cast<std::int64_t>(a.Hkv) * chunks * KS * 32;
        probe_pack_mma_kernel<T, D><<<static_cast<unsigned>((total + 255) / 256), 256, 0, stream>>>(a);
        check_launch(fn, "probe_pack_mma_kernel");
    }
    constexpr std::size_t shm = probe_cols_smem_bytes<T, D>();
    const dim3 grid(static_cast<unsigned>((a.n + kProbeColTile - 1) / kProbeColTile), static_cast<unsigned>(a.Hkv),
                    static_cast<unsigned>(a.rsplit));
    {
        auto* k1 = probe_cols_mma_kernel<T, D, true>;
        static const cudaError_t attr = cudaFuncSetAttribute(k1, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shm));
        check_cuda(attr, fn, "cudaFuncSetAttribute");
        k1<<<grid, kProbeThreads, shm, stream>>>(a);
        check_launch(fn, "probe_cols_mma_kernel (pass 1)");
    }
    {
        const std::int64_t rows = static_cast<std::int64_t>(a.Hkv) * chunks * 16;  // a warp each
        probe_lse_kernel<><<<static_cast<unsigned>((rows + 7) / 8), 256, 0, stream>>>(a);
        check_launch(fn, "probe_lse_kernel");
    }
    {
        auto* k2 = probe_cols_mma_kernel<T, D, false>;
        static const cudaError_t attr = cudaFuncSetAttribute(k2, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shm));
        check_cuda(attr, fn, "cudaFuncSetAttribute");
        k2<<<grid, kProbeThreads, shm, stream>>>(a);
        check_launch(fn, "probe_cols_mma_kernel (pass 2)");
    }
}

inline void launch_probe_simt(ProbeArgs& a, cudaStream_t stream, const char* fn) {
    const std::int64_t rows = static_cast<std::int64_t>(a.qpk) * a.npc * 16;
    {
        const std::int64_t total = static_cast<std::int64_t>(a.Hkv) * rows * a.d;
        probe_pack_simt_kernel<><<<static_cast<unsigned>((total + 255) / 256), 256, 0, stream>>>(a);
        check_launch(fn, "probe_pack_simt_kernel");
    }
    {
        const std::size_t shm = static_cast<std::size_t>(4 * a.d) * sizeof(float);
        probe_pass1_simt_kernel<><<<static_cast<unsigned>((rows * a.Hkv + 3) / 4), kProbeThreads, shm, stream>>>(a);
        check_launch(fn, "probe_pass1_simt_kernel");
    }
    {
        const std::size_t shm = (static_cast<std::size_t>(kProbeSimtCols) * (a.d + 1) + a.d) * sizeof(float);
        auto* k2 = probe_pass2_simt_kernel<>;
        check_cuda(cudaFuncSetAttribute(k2, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shm)), fn,
                   "cudaFuncSetAttribute");
        const dim3 grid(static_cast<unsigned>((a.n + kProbeSimtCols - 1) / kProbeSimtCols), static_cast<unsigned>(a.Hkv));
        k2<<<grid, kProbeSimtCols, shm, stream>>>(a);
        check_launch(fn, "probe_pass2_simt_kernel");
    }
}

}  // namespace detail

// ZipVL's selection on the GPU with a reusable workspace (device buffers grow to the largest layer
// seen; pinned host staging for the per-call metadata). Not thread-safe: one selector per stream.
class ZipVLSelector {
public:
    ZipVLSelector() = default;
    ZipVLSelector(const ZipVLSelector&) = delete;
    ZipVLSelector& operator=(const ZipVLSelector&) = delete;
    ~ZipVLSelector() {
        cudaFreeHost(pinned_);
        if (staged_) cudaEventDestroy(staged_);
    }

    // The selection of layer `layer`. `probes` overrides the probe choice (sorted ascending, unique, in
    // [0, n)); empty = zipvl_probes(n, layer, params).
    template <ElementType TQ, ElementType TK>
    const DeviceZipVLSelection& select(View3<const TQ> q, View3<const TK> k, const Layout& layout, std::int64_t layer,
                                       const ZipVLParams& P, cudaStream_t stream = 0,
                                       std::span<const std::int64_t> probes = {}) {
        constexpr const char* fn = "cuda::zipvl_select";
        ::vlsparse::detail::check_zipvl_params(P, fn);
        detail::require(q.data != nullptr && k.data != nullptr, fn, "q or k is a null view");
        const std::int64_t n = q.shape[0], H = q.shape[1], d = q.shape[2], Hkv = k.shape[1];
        detail::require(n >= 1 && H >= 1 && d >= 1, fn, "q has shape [", n, ", ", H, ", ", d,
                        "], expected [n, H, d] with every extent >= 1");
        detail::require(k.shape[0] == n && k.shape[2] == d && Hkv >= 1, fn, "k has shape [", k.shape[0], ", ",
                        k.shape[1], ", ", k.shape[2], "], expected [", n, ", H_kv, ", d, "] (prefill: as many keys as queries)");
        detail::require(H % Hkv == 0, fn, "H = ", H, " query heads is not a multiple of H_kv = ", Hkv);
        detail::require(d <= 256, fn, "head_dim = ", d, ", expected <= 256");
        detail::require(n <= std::numeric_limits<std::int32_t>::max() / 2, fn, "n = ", n, " tokens, expected < 2^30");
        detail::require(layer >= 0, fn, "layer = ", layer, ", expected >= 0");
        layout.require_tokens(n, fn);
        const std::int64_t G = P.grouping == ZipVLGrouping::layer ? 1 : Hkv;

        DeviceZipVLSelection& r = res_;
        r = DeviceZipVLSelection{};
        r.n = n;
        r.heads_per_group = H / G;
        if (layer < P.dense_layers) {
            r.dense = true;
            r.p.assign(static_cast<std::size_t>(G), n);
            r.indptr = {0, static_cast<std::int32_t>(n)};
            auto* base = static_cast<char*>(dense_buf_.get(detail::align256(static_cast<std::size_t>(n) * 4) + 256, fn));
            auto* idx = reinterpret_cast<std::int32_t*>(base);
            auto* ip = reinterpret_cast<std::int32_t*>(base + detail::align256(static_cast<std::size_t>(n) * 4));
            detail::iota_kernel<><<<static_cast<unsigned>(std::min<std::int64_t>((n + 255) / 256, 1024)), 256, 0, stream>>>(idx, static_cast<int>(n));
            detail::check_launch(fn, "iota_kernel");
            const std::int32_t h_ip[2] = {0, static_cast<std::int32_t>(n)};
            detail::check_cuda(cudaMemcpyAsync(ip, h_ip, sizeof(h_ip), cudaMemcpyHostToDevice, stream), fn, "cudaMemcpyAsync");
            detail::check_cuda(cudaStreamSynchronize(stream), fn, "cudaStreamSynchronize");
            r.indices = idx;
            r.indptr_dev = ip;
            return r;
        }
        if (probes.empty()) {
            r.probes = zipvl_probes(n, layer, P);
        } else {
            ::vlsparse::detail::check_sorted_unique(probes, n, fn, "probes");
            r.probes.assign(probes.begin(), probes.end());
        }
        const std::int64_t np = static_cast<std::int64_t>(r.probes.size());
        const std::int64_t npc = (np + 15) / 16, qpk = H / Hkv;
        const std::int64_t rows = qpk * npc * 16;  // per KV head
        const double scale = ::vlsparse::detail::resolve_scale(P.attention(), d, fn);

        constexpr bool same16 = std::is_same_v<std::remove_const_t<TQ>, std::remove_const_t<TK>> && sizeof(TQ) == 2;
        const bool mma = same16 && d <= 128;
        // Device workspace.
        using detail::align256;
        const std::size_t b_pos = align256(static_cast<std::size_t>(npc * 16) * 4);
        const std::size_t b_cmax = align256(static_cast<std::size_t>(npc) * 4);
        const std::size_t b_probes = align256(static_cast<std::size_t>(np) * 4);
        const std::size_t b_text = P.keep_text ? align256(static_cast<std::size_t>(n)) : 0;
        const std::size_t b_q = mma ? align256(static_cast<std::size_t>(Hkv * qpk * npc * ((d <= 64 ? 64 : 128) / 16) * 32) * 16)
                                    : align256(static_cast<std::size_t>(Hkv * rows * d) * 4);
        const std::int64_t ncb = (n + detail::kProbeColTile - 1) / detail::kProbeColTile;
        const std::size_t b_part = mma ? align256(static_cast<std::size_t>(Hkv * rows * ncb) * 8) : 0;
        const std::size_t b_lse = align256(static_cast<std::size_t>(Hkv * rows) * 4);
        // Tensor cores: the chunks of a key block shared out over rsplit blocks when the key blocks alone
        // would leave the GPU short of work (about two waves of 4 blocks per multiprocessor wanted).
        int rsplit = 1;
        if (mma) {
            int dev = 0, sms = 0;
            detail::check_cuda(cudaGetDevice(&dev), fn, "cudaGetDevice");
            detail::check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), fn, "cudaDeviceGetAttribute");
            const std::int64_t blocks = ((n + detail::kProbeColTile - 1) / detail::kProbeColTile) * Hkv;
            rsplit = static_cast<int>(std::clamp<std::int64_t>((8 * sms + blocks - 1) / blocks, 1, 8));
        }
        const std::size_t b_col = align256(static_cast<std::size_t>(rsplit * Hkv * n) * 4);
        const std::size_t b_sc = align256(static_cast<std::size_t>(G * n) * 4);
        const std::size_t b_lists = align256(static_cast<std::size_t>(G * n) * 4);
        const std::size_t b_small = align256(static_cast<std::size_t>(4 * G + 8) * 4);  // p, count, indptr, status
        const std::size_t up = b_pos + b_cmax + b_probes + b_text;
        const std::size_t need = up + b_q + b_part + b_lse + b_col + 2 * b_sc + 2 * b_lists + b_small;
        char* base = static_cast<char*>(work_.get(need, fn));
        char* at = base;
        auto take = [&](std::size_t b) {
            char* p = at;
            at += b;
            return p;
        };
        auto* pos_d = reinterpret_cast<std::int32_t*>(take(b_pos));
        auto* cmax_d = reinterpret_cast<std::int32_t*>(take(b_cmax));
        auto* probes_d = reinterpret_cast<std::int32_t*>(take(b_probes));
        auto* text_d = reinterpret_cast<std::uint8_t*>(take(b_text));
        void* qbuf = take(b_q);
        auto* part_d = reinterpret_cast<float2*>(take(b_part));
        auto* lse_d = reinterpret_cast<float*>(take(b_lse));
        auto* col_d = reinterpret_cast<float*>(take(b_col));
        auto* acc_d = reinterpret_cast<float*>(take(b_sc));
        auto* nrm_d = reinterpret_cast<float*>(take(b_sc));
        auto* lists_d = reinterpret_cast<std::int32_t*>(take(b_lists));
        auto* idx_d = reinterpret_cast<std::int32_t*>(take(b_lists));
        auto* small_d = reinterpret_cast<int*>(take(b_small));
        int* p_d = small_d;
        int* cnt_d = small_d + G;
        auto* indptr_d = reinterpret_cast<std::int32_t*>(small_d + 2 * G);
        int* status_d = small_d + 3 * G + 2;

        // Host metadata, staged in pinned memory and uploaded in one copy.
        if (pinned_) detail::check_cuda(cudaEventSynchronize(staged_), fn, "cudaEventSynchronize");
        char* h = static_cast<char*>(pinned(up + b_small, fn));
        std::memset(h, 0, up);
        auto* pos_h = reinterpret_cast<std::int32_t*>(h);
        auto* cmax_h = reinterpret_cast<std::int32_t*>(h + b_pos);
        auto* probes_h = reinterpret_cast<std::int32_t*>(h + b_pos + b_cmax);
        for (std::int64_t i = 0; i < npc * 16; ++i) pos_h[i] = i < np ? static_cast<std::int32_t>(r.probes[static_cast<std::size_t>(i)]) : -1;
        for (std::int64_t c = 0; c < npc; ++c) cmax_h[c] = static_cast<std::int32_t>(r.probes[static_cast<std::size_t>(std::min(np - 1, 16 * c + 15))]);
        for (std::int64_t i = 0; i < np; ++i) probes_h[i] = static_cast<std::int32_t>(r.probes[static_cast<std::size_t>(i)]);
        if (P.keep_text) {
            const auto m = layout.text_mask();
            std::memcpy(h + b_pos + b_cmax + b_probes, m.data(), static_cast<std::size_t>(n));
        }
        detail::check_cuda(cudaMemcpyAsync(base, h, up, cudaMemcpyHostToDevice, stream), fn, "cudaMemcpyAsync");
        detail::check_cuda(cudaEventRecord(staged_, stream), fn, "cudaEventRecord");
        detail::check_cuda(cudaMemsetAsync(status_d, 0, sizeof(int), stream), fn, "cudaMemsetAsync");

        detail::ProbeArgs a;
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
        a.k_pairs = same16 && k.stride[2] == 1 && d % 2 == 0 && k.stride[0] % 2 == 0 && k.stride[1] % 2 == 0 &&
                    reinterpret_cast<std::uintptr_t>(k.data) % 4 == 0;
        a.pos = pos_d;
        a.cmax = cmax_d;
        a.part = part_d;
        a.lse = lse_d;
        a.col = col_d;
        a.status = status_d;
        a.rsplit = rsplit;
        if (mma) {
            a.qpack = static_cast<const uint4*>(qbuf);
            if constexpr (same16) {
                using T = std::remove_const_t<TQ>;
                if (d <= 64) detail::launch_probe_mma<T, 64>(a, stream, fn);
                else detail::launch_probe_mma<T, 128>(a, stream, fn);
            }
        } else {
            a.qrows = static_cast<const float*>(qbuf);
            detail::launch_probe_simt(a, stream, fn);
        }

        detail::ZipVLFinishArgs f;
        f.col = col_d;
        f.rsplit = rsplit;
        f.n = static_cast<int>(n);
        f.Hkv = static_cast<int>(Hkv);
        f.G = static_cast<int>(G);
        f.heads_per_group = static_cast<int>(r.heads_per_group);
        f.probe_rows_nnz = P.nnz == ZipVLNnz::probe_rows;
        f.probes = probes_d;
        f.n_probes = static_cast<int>(np);
        f.tau = P.tau;
        f.total = static_cast<double>(r.heads_per_group) * static_cast<double>(np);
        f.keep_last = static_cast<int>(std::min<std::int64_t>(P.keep_last, n));
        f.text = P.keep_text ? text_d : nullptr;
        f.accumulated = acc_d;
        f.normalized = nrm_d;
        f.lists = lists_d;
        f.p = p_d;
        f.count = cnt_d;
        f.status = status_d;
        f.cached = n <= detail::kSelectCacheMax ? static_cast<int>(n) : 0;
        // One group (layer-wise): the kernel writes the final list and indptr itself.
        if (G == 1) {
            f.lists = idx_d;
            f.indptr = indptr_d;
        }
        detail::zipvl_scores_kernel<><<<static_cast<unsigned>(std::min<std::int64_t>((G * n + 255) / 256, 4096)), 256, 0, stream>>>(f);
        detail::check_launch(fn, "zipvl_scores_kernel");
        {
            auto* kf = detail::zipvl_finish_kernel<>;
            static const cudaError_t attr = cudaFuncSetAttribute(
                kf, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(detail::select_smem_bytes(detail::kSelectCacheMax)));
            detail::check_cuda(attr, fn, "cudaFuncSetAttribute");
            kf<<<static_cast<unsigned>(G), detail::kSelectThreads, detail::select_smem_bytes(f.cached), stream>>>(f);
        }
        detail::check_launch(fn, "zipvl_finish_kernel");
        if (G > 1) {
            const dim3 pgrid(static_cast<unsigned>(G), static_cast<unsigned>((n + detail::kPackSpan - 1) / detail::kPackSpan));
            detail::pack_lists_kernel<><<<pgrid, 256, 0, stream>>>(lists_d, cnt_d, static_cast<int>(n), static_cast<int>(G),
                                                                    idx_d, indptr_d);
            detail::check_launch(fn, "pack_lists_kernel");
        }

        // p, counts, indptr and the status word back to the host: the one synchronization.
        auto* back = reinterpret_cast<int*>(h + up);
        detail::check_cuda(cudaMemcpyAsync(back, small_d, static_cast<std::size_t>(3 * G + 3) * sizeof(int), cudaMemcpyDeviceToHost, stream),
                           fn, "cudaMemcpyAsync");
        detail::check_cuda(cudaStreamSynchronize(stream), fn, "cudaStreamSynchronize");
        detail::require((back[3 * G + 2] & detail::kInputNonFinite) == 0, fn,
                        "q or k holds NaN or Inf (in k, or in a probe row of q: the rows the selection reads)");
        detail::require(back[3 * G + 2] == 0, fn,
                        "a score is not finite: an fp32 overflow of a probe logit (inputs too large for the scale)");
        r.p.resize(static_cast<std::size_t>(G));
        r.indptr.resize(static_cast<std::size_t>(G + 1));
        for (std::int64_t g = 0; g < G; ++g) r.p[static_cast<std::size_t>(g)] = back[g];
        for (std::int64_t g = 0; g <= G; ++g) r.indptr[static_cast<std::size_t>(g)] = back[2 * G + g];
        r.indices = idx_d;
        r.indptr_dev = indptr_d;
        r.accumulated = acc_d;
        r.normalized = nrm_d;
        return r;
    }

    const DeviceZipVLSelection& result() const { return res_; }

    // Tests: every byte of the device workspace (scores, lists, scratch) set to `byte`, so that an
    // output the next select() fails to write shows (0xff: NaN scores, -1 positions). Synchronizes.
    void fill_workspace(int byte) { work_.fill(byte, "cuda::ZipVLSelector::fill_workspace"); }

private:
    void* pinned(std::size_t bytes, const char* fn) {
        if (bytes > pinned_bytes_) {
            cudaFreeHost(pinned_);
            pinned_ = nullptr;
            pinned_bytes_ = 0;
            detail::check_cuda(cudaMallocHost(&pinned_, bytes), fn, "cudaMallocHost");
            pinned_bytes_ = bytes;
            if (!staged_) detail::check_cuda(cudaEventCreateWithFlags(&staged_, cudaEventDisableTiming), fn, "cudaEventCreate");
        }
        return pinned_;
    }

    detail::GrowBuffer work_, dense_buf_;
    void* pinned_ = nullptr;
    std::size_t pinned_bytes_ = 0;
    cudaEvent_t staged_ = nullptr;
    DeviceZipVLSelection res_;
};

}  // namespace vlsparse::cuda
