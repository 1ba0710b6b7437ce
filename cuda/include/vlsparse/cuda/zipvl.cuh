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
#include <utility>
#include <vector>

#include "vlsparse/attention/common.hpp"
#include "vlsparse/core/layout.hpp"
#include "vlsparse/core/selection.hpp"
#include "vlsparse/core/tensor.hpp"
#include "vlsparse/cuda/common.cuh"
#include "vlsparse/cuda/selection/lists.cuh"
#include "vlsparse/cuda/selection/probe_columns.cuh"
#include "vlsparse/cuda/selection/probe_scores.cuh"
#include "vlsparse/cuda/selection/select.cuh"
#include "vlsparse/kv/kv_batch.hpp"
#include "vlsparse/policies/zipvl_select.hpp"

namespace vlsparse::cuda {

// What ZipVL decided for one layer: the kept lists as every policy's (DeviceSelection: n, indptr,
// indices, indptr_dev, rows(), kept_ratio(), to_host() with the ranked scores), plus ZipVL's own
// results. G groups: 1 (layer-wise) or H_kv (per KV head); a dense layer has one list of every position.
struct DeviceZipVLSelection : DeviceSelection {
    bool dense = false;
    std::int64_t heads_per_group = 0;
    std::vector<std::int64_t> probes;      // host, ascending
    std::vector<std::int64_t> p;           // host [G]: the adaptive count of each group
    const float* accumulated = nullptr;    // device [G][n] a_j (null in a dense layer)
    const float* normalized = nullptr;     // device [G][n] a~_j (null in a dense layer)
    bool ranked_by_accumulated = false;    // params.ranking == accumulated: the lists rank a_j, not a~_j
                                           // (DeviceSelection::scores points to the ranked ones)

    std::int64_t groups() const { return static_cast<std::int64_t>(p.size()); }

    // A host copy in the CPU paths' form (synchronizes the device): the kept lists (with the ranked
    // scores, as to_host()), probes, p, and a_j / a~_j widened to double (empty in a dense layer, as on
    // the CPU).
    ZipVLSelection to_host_selection() const {
        ZipVLSelection r;
        r.n = n;
        r.dense = dense;
        r.probes = probes;
        r.heads_per_group = heads_per_group;
        r.p = p;
        r.selection = to_host();
        const auto G = static_cast<std::size_t>(groups());
        for (auto [src, dst] : {std::pair{accumulated, &r.accumulated}, std::pair{normalized, &r.normalized}}) {
            if (!src) continue;
            std::vector<float> h(G * static_cast<std::size_t>(n));
            if (!h.empty())
                detail::check_cuda(cudaMemcpy(h.data(), src, h.size() * sizeof(float), cudaMemcpyDeviceToHost),
                                   "cuda::DeviceZipVLSelection::to_host_selection", "cudaMemcpy");
            dst->assign(G, std::vector<double>(static_cast<std::size_t>(n)));
            for (std::size_t g = 0; g < G; ++g)
                for (std::int64_t j = 0; j < n; ++j)
                    (*dst)[g][static_cast<std::size_t>(j)] = h[g * static_cast<std::size_t>(n) + static_cast<std::size_t>(j)];
        }
        return r;
    }
};

// ZipVL's selection on the GPU with a reusable workspace (device buffers grow to the largest layer
// seen; pinned host staging for the per-call metadata). Not thread-safe: one selector per stream.
class ZipVLSelector {
public:
    ZipVLSelector() = default;
    ZipVLSelector(const ZipVLSelector&) = delete;
    ZipVLSelector& operator=(const ZipVLSelector&) = delete;

    // The selection of layer `layer`. `probes` overrides the probe choice (sorted ascending, unique, in
    // [0, n)); empty = zipvl_probes(n, layer, params) (zipvl_probes_or, as on the CPU).
    template <ElementType TQ, ElementType TK>
    const DeviceZipVLSelection& select(View3<const TQ> q, View3<const TK> k, const Layout& layout, std::int64_t layer,
                                       const ZipVLParams& P, cudaStream_t stream = 0,
                                       std::span<const std::int64_t> probes = {}) {
        constexpr const char* fn = "cuda::zipvl_select";
        ::vlsparse::detail::check_zipvl_params(P, fn);
        ::vlsparse::detail::check_zipvl_modes(P, fn);
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
            detail::launch_dependent(detail::iota_kernel<>,
                                     static_cast<unsigned>(std::min<std::int64_t>((n + 255) / 256, 1024)), 256, 0,
                                     stream, fn, "iota_kernel", idx, static_cast<int>(n));
            const std::int32_t h_ip[2] = {0, static_cast<std::int32_t>(n)};
            detail::check_cuda(cudaMemcpyAsync(ip, h_ip, sizeof(h_ip), cudaMemcpyHostToDevice, stream), fn, "cudaMemcpyAsync");
            detail::check_cuda(cudaStreamSynchronize(stream), fn, "cudaStreamSynchronize");
            r.indices = idx;
            r.indptr_dev = ip;
            return r;
        }
        // The CPU paths' one probe choice (zipvl_select.hpp): the same probes for the same params and seed.
        r.probes = zipvl_probes_or(probes, n, layer, P, fn);
        const std::int64_t np = static_cast<std::int64_t>(r.probes.size());
        const double scale = ::vlsparse::detail::resolve_scale(P.attention(), d, fn);
        const detail::ProbeColumnsResult pc = probe_.run(q, k, std::span<const std::int64_t>(r.probes), scale, stream, fn);

        // This front end's buffers: the text mask (keep_text), scores, lists, p / counts / indptr.
        using detail::align256;
        const std::size_t b_text = P.keep_text ? align256(static_cast<std::size_t>(n)) : 0;
        const std::size_t b_sc = align256(static_cast<std::size_t>(G * n) * 4);
        const std::size_t b_lists = align256(static_cast<std::size_t>(G * n) * 4);
        const std::size_t b_small = align256(static_cast<std::size_t>(3 * G + 2) * 4);  // p, count, indptr, status
        char* base = static_cast<char*>(work_.get(b_text + 2 * b_sc + 2 * b_lists + b_small, fn));
        auto* text_d = reinterpret_cast<std::uint8_t*>(base);
        auto* acc_d = reinterpret_cast<float*>(base + b_text);
        auto* nrm_d = reinterpret_cast<float*>(base + b_text + b_sc);
        auto* lists_d = reinterpret_cast<std::int32_t*>(base + b_text + 2 * b_sc);
        auto* idx_d = reinterpret_cast<std::int32_t*>(base + b_text + 2 * b_sc + b_lists);
        auto* small_d = reinterpret_cast<int*>(base + b_text + 2 * b_sc + 2 * b_lists);
        int* p_d = small_d;
        int* cnt_d = small_d + G;
        auto* indptr_d = reinterpret_cast<std::int32_t*>(small_d + 2 * G);
        char* h = staging_.get(b_text + b_small + 256, fn);
        if (P.keep_text) {
            const auto m = layout.text_mask();
            std::memcpy(h, m.data(), static_cast<std::size_t>(n));
            detail::check_cuda(cudaMemcpyAsync(text_d, h, static_cast<std::size_t>(n), cudaMemcpyHostToDevice, stream), fn,
                               "cudaMemcpyAsync");
        }
        int* status_d = pc.status;
        const int rsplit = pc.rsplit;
        const float* col_d = pc.col;
        const std::int32_t* probes_d = pc.probes;

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
        f.status_copy = small_d + 3 * G + 1;
        f.fixed_p = P.ratio == ZipVLRatio::fixed ? static_cast<int>(zipvl_fixed_count(n, P.fixed_ratio)) : 0;
        f.rank_accumulated = P.ranking == ZipVLRanking::accumulated;
        // One group (layer-wise): the kernel writes the final list and indptr itself.
        if (G == 1) {
            f.lists = idx_d;
            f.indptr = indptr_d;
        }
        detail::launch_dependent(detail::zipvl_scores_kernel<>,
                                 static_cast<unsigned>(std::min<std::int64_t>((G * n + 255) / 256, 4096)), 256, 0,
                                 stream, fn, "zipvl_scores_kernel", f);
        {
            auto* kf = detail::zipvl_finish_kernel<>;
            detail::SelectLaunch L = detail::plan_select_launch(kf, n, fn);
            detail::launch_select_kernel(kf, static_cast<int>(G), L, stream, f, fn, "zipvl_finish_kernel");
        }
        if (G > 1) {
            const dim3 pgrid(static_cast<unsigned>(G), static_cast<unsigned>((n + detail::kPackSpan - 1) / detail::kPackSpan));
            detail::launch_dependent(detail::pack_lists_kernel<>, pgrid, 256, 0, stream, fn, "pack_lists_kernel",
                                     lists_d, cnt_d, static_cast<int>(n), static_cast<int>(G), idx_d, indptr_d);
        }

        // p [G], counts [G], indptr [G + 1] and the status word (copied there by the ranking kernel) back
        // to the host in one copy: the one synchronization.
        auto* back = reinterpret_cast<int*>(h + b_text);
        detail::check_cuda(cudaMemcpyAsync(back, small_d, static_cast<std::size_t>(3 * G + 2) * sizeof(int), cudaMemcpyDeviceToHost, stream),
                           fn, "cudaMemcpyAsync");
        staging_.mark(stream, fn);
        detail::check_cuda(cudaStreamSynchronize(stream), fn, "cudaStreamSynchronize");
        detail::require((back[3 * G + 1] & detail::kInputNonFinite) == 0, fn,
                        "q or k holds NaN or Inf (in k, or in a probe row of q: the rows the selection reads)");
        detail::require(back[3 * G + 1] == 0, fn,
                        "a score is not finite: an fp32 overflow of a probe logit (inputs too large for the scale)");
        r.p.resize(static_cast<std::size_t>(G));
        r.indptr.resize(static_cast<std::size_t>(G + 1));
        for (std::int64_t g = 0; g < G; ++g) r.p[static_cast<std::size_t>(g)] = back[g];
        for (std::int64_t g = 0; g <= G; ++g) r.indptr[static_cast<std::size_t>(g)] = back[2 * G + g];
        r.indices = idx_d;
        r.indptr_dev = indptr_d;
        r.accumulated = acc_d;
        r.normalized = nrm_d;
        r.ranked_by_accumulated = P.ranking == ZipVLRanking::accumulated;
        r.scores = r.ranked_by_accumulated ? acc_d : nrm_d;
        r.score_groups = G;
        r.score_len = n;
        return r;
    }

    const DeviceZipVLSelection& result() const { return res_; }

    // Tests: every byte of the device workspace (scores, lists, scratch) set to `byte`, so that an
    // output the next select() fails to write shows (0xff: NaN scores, -1 positions). Synchronizes.
    void fill_workspace(int byte) {
        work_.fill(byte, "cuda::ZipVLSelector::fill_workspace");
        probe_.fill(byte, "cuda::ZipVLSelector::fill_workspace");
    }

private:
    detail::ProbeColumns probe_;
    detail::GrowBuffer work_, dense_buf_;
    detail::PinnedStaging staging_;
    DeviceZipVLSelection res_;
};

}  // namespace vlsparse::cuda
