// vlsparse/cuda/baselines.cuh -- the attention-based baselines' scores on the GPU (namespace
// vlsparse::cuda): H2O, SnapKV and FastV (FastV's score is also A-VL's: the last prompt token's
// head-mean attention), by the probe column sums of vlsparse/cuda/selection/, with the selection
// itself done by the same host code as the CPU paths (vlsparse/policies/baselines_params.hpp), so the
// kept sets follow the CPU rules exactly.
//
//   H2O     a_j = sum_{i >= j} sum_{h in group} A[h,i,j]         probes: every row
//   SnapKV  s_j = sum_{i >= n-w} sum_{h in group} A[h,i,j], j < n - w, pooled on the device
//   FastV   s_j = (1/H) sum_h A[h,n-1,j]                        probes: the last row
//
//   cuda::BaselineScorer scorer;                                   // owns its device workspace; reuse it
//   TokenSelection s = scorer.snapkv_select(q, k, params, stream); // q, k: device views, any strides
//   auto scores = scorer.h2o_scores(q, k, BaselineGroups::kv_head); // host [G][n] (double, from fp32)
//
// q [n, H, d] and k [n, H_kv, d] on the device; bf16 / bf16 and fp16 / fp16 with d <= 128 on the tensor
// cores, everything else on the CUDA cores (see vlsparse/cuda/zipvl.cuh for the precision: fp32 sums,
// scores within 1e-4 relative of the reference). Each call synchronizes `stream` once (the scores come
// back to the host, G x n floats). NaN / Inf in what is read (k, the probe rows of q) and fp32 overflow
// of a logit are errors.
//
// Cost: the work is that of the probe rows' attention logits, twice. SnapKV's window and FastV's row are
// cheap; H2O standalone computes every row's logits twice and keeps 8 bytes per (row, 128 keys) of
// pass-1 statistics (H x n x n / 16 bytes: 0.5 GB at H = 28, n = 16K) -- engines that use H2O on the
// GPU want it fused into the prefill attention, which has the row statistics anyway (the prefill
// kernels are not written yet). Include: this header, from a .cu translation unit (nvcc, C++20).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <span>
#include <vector>

#include "vlsparse/attention/common.hpp"
#include "vlsparse/core/layout.hpp"
#include "vlsparse/core/selection.hpp"
#include "vlsparse/core/tensor.hpp"
#include "vlsparse/cuda/common.cuh"
#include "vlsparse/cuda/selection/probe_columns.cuh"
#include "vlsparse/policies/baselines_params.hpp"

namespace vlsparse::cuda {

namespace detail {

// out[g][j] (j < L) = sum over the splits (and, for one group, the KV heads) of col[z][h][j], in order.
template <int Unused = 0>
__global__ void group_column_sums_kernel(const float* col, int rsplit, int Hkv, int n, int G, int L, float* out) {
    const std::int64_t total = static_cast<std::int64_t>(G) * L;
    for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
         i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
        const int g = static_cast<int>(i / L), j = static_cast<int>(i % L);
        float a = 0.0f;
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

// SnapKV's pooling of each group's L scores: stride 1, padding kernel / 2; avg divides by the kernel
// (zero padding counted, as F.avg_pool1d), max ignores the padding. mode: 0 none, 1 avg, 2 max.
template <int Unused = 0>
__global__ void pool1d_kernel(const float* in, int G, int L, int kernel, int mode, float* out) {
    const std::int64_t total = static_cast<std::int64_t>(G) * L;
    const int r = kernel / 2;
    for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
         i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
        const std::int64_t g0 = (i / L) * L;
        const int j = static_cast<int>(i % L);
        const int a = max(0, j - r), b = min(L - 1, j + r);
        float acc = mode == 1 ? 0.0f : in[g0 + a];
        for (int t = a; t <= b; ++t) acc = mode == 1 ? acc + in[g0 + t] : fmaxf(acc, in[g0 + t]);
        out[i] = mode == 0 ? in[i] : (mode == 1 ? acc / static_cast<float>(kernel) : acc);
    }
}

}  // namespace detail

class BaselineScorer {
public:
    BaselineScorer() = default;
    BaselineScorer(const BaselineScorer&) = delete;
    BaselineScorer& operator=(const BaselineScorer&) = delete;

    // H2O's accumulated attention over the causal prefill: host [G][n], G = H_kv (kv_head) or 1 (layer).
    template <ElementType TQ, ElementType TK>
    std::vector<std::vector<double>> h2o_scores(View3<const TQ> q, View3<const TK> k, BaselineGroups groups,
                                                const AttentionOptions& opt = {}, cudaStream_t stream = 0) {
        constexpr const char* fn = "cuda::h2o_scores";
        check(q, k, fn);
        std::vector<std::int64_t> rows(static_cast<std::size_t>(q.shape[0]));
        std::iota(rows.begin(), rows.end(), std::int64_t{0});
        return scores(q, k, rows, groups == BaselineGroups::kv_head, q.shape[0], opt, -1, 0, stream, fn);
    }

    template <ElementType TQ, ElementType TK>
    TokenSelection h2o_select(View3<const TQ> q, View3<const TK> k, const H2OParams& P, cudaStream_t stream = 0) {
        P.validate("cuda::h2o_select");
        return h2o_select_from_scores(h2o_scores(q, k, P.groups, P.attention(), stream), P);
    }

    // SnapKV's raw window scores: host [G][n - window].
    template <ElementType TQ, ElementType TK>
    std::vector<std::vector<double>> snapkv_window_scores(View3<const TQ> q, View3<const TK> k, std::int64_t window,
                                                          BaselineGroups groups, const AttentionOptions& opt = {},
                                                          cudaStream_t stream = 0) {
        constexpr const char* fn = "cuda::snapkv_window_scores";
        check(q, k, fn);
        const std::int64_t n = q.shape[0];
        detail::require(window >= 1 && window <= n, fn, "window = ", window, ", expected 1 <= window <= n = ", n);
        return scores(q, k, window_rows(n, window), groups == BaselineGroups::kv_head, n - window, opt, -1, 0, stream, fn);
    }

    // The window scores pooled as SnapKV pools them (on the device): host [G][n - window].
    template <ElementType TQ, ElementType TK>
    std::vector<std::vector<double>> snapkv_pooled_scores(View3<const TQ> q, View3<const TK> k, const SnapKVParams& P,
                                                          cudaStream_t stream = 0) {
        constexpr const char* fn = "cuda::snapkv_pooled_scores";
        P.validate(fn);
        check(q, k, fn);
        const std::int64_t n = q.shape[0];
        detail::require(P.window <= n, fn, "window = ", P.window, " is larger than the prompt (n = ", n,
                        "), expected 1 <= window <= n");
        const int mode = P.pooling == SnapKVPooling::none ? 0 : (P.pooling == SnapKVPooling::avg ? 1 : 2);
        return scores(q, k, window_rows(n, P.window), P.groups == BaselineGroups::kv_head, n - P.window, P.attention(),
                      mode, static_cast<int>(P.kernel), stream, fn);
    }

    template <ElementType TQ, ElementType TK>
    TokenSelection snapkv_select(View3<const TQ> q, View3<const TK> k, const SnapKVParams& P, cudaStream_t stream = 0) {
        return snapkv_select_from_pooled(snapkv_pooled_scores(q, k, P, stream), q.shape[0], P);
    }

    // FastV's (and A-VL's) score: the last row's attention averaged over every query head, host [n].
    template <ElementType TQ, ElementType TK>
    std::vector<double> fastv_scores(View3<const TQ> q, View3<const TK> k, const AttentionOptions& opt = {},
                                     cudaStream_t stream = 0) {
        constexpr const char* fn = "cuda::fastv_scores";
        check(q, k, fn);
        const std::int64_t n = q.shape[0];
        const std::vector<std::int64_t> last{n - 1};
        auto s = scores(q, k, last, false, n, opt, -1, 0, stream, fn);
        for (auto& x : s[0]) x /= static_cast<double>(q.shape[1]);
        return std::move(s[0]);
    }

    template <ElementType TQ, ElementType TK>
    TokenSelection fastv_select(View3<const TQ> q, View3<const TK> k, const Layout& layout, const FastVParams& P,
                                cudaStream_t stream = 0) {
        constexpr const char* fn = "cuda::fastv_select";
        P.validate(fn);
        layout.require_tokens(q.shape[0], fn);
        return fastv_select_from_scores(fastv_scores(q, k, P.attention(), stream), layout, P);
    }

    // Tests: every byte of the device workspace set to `byte`. Synchronizes.
    void fill_workspace(int byte) {
        probe_.fill(byte, "cuda::BaselineScorer::fill_workspace");
        work_.fill(byte, "cuda::BaselineScorer::fill_workspace");
    }

private:
    template <ElementType TQ, ElementType TK>
    static void check(View3<const TQ> q, View3<const TK> k, const char* fn) {
        detail::require(q.data != nullptr && k.data != nullptr, fn, "q or k is a null view");
        ::vlsparse::detail::check_prefill_qk(q, k, fn);
        detail::require(q.shape[0] >= 1, fn, "n = 0: no tokens");
        detail::require(q.shape[2] <= 256, fn, "head_dim = ", q.shape[2], ", expected <= 256");
        detail::require(q.shape[0] <= std::numeric_limits<std::int32_t>::max() / 2, fn, "n = ", q.shape[0],
                        " tokens, expected < 2^30");
    }

    static std::vector<std::int64_t> window_rows(std::int64_t n, std::int64_t window) {
        std::vector<std::int64_t> rows(static_cast<std::size_t>(window));
        std::iota(rows.begin(), rows.end(), n - window);
        return rows;
    }

    // Column sums of the probe rows' attention, per group, first L keys, optionally pooled; to the host.
    template <ElementType TQ, ElementType TK>
    std::vector<std::vector<double>> scores(View3<const TQ> q, View3<const TK> k, const std::vector<std::int64_t>& rows,
                                            bool per_kv_head, std::int64_t L, const AttentionOptions& opt, int pool_mode,
                                            int kernel, cudaStream_t stream, const char* fn) {
        const std::int64_t n = q.shape[0], d = q.shape[2], Hkv = k.shape[1];
        const std::int64_t G = per_kv_head ? Hkv : 1;
        const double scale = ::vlsparse::detail::resolve_scale(opt, d, fn);
        const detail::ProbeColumnsResult pc = probe_.run(q, k, std::span<const std::int64_t>(rows), scale, stream, fn);
        const std::size_t b = detail::align256(static_cast<std::size_t>(std::max<std::int64_t>(G * L, 1)) * 4);
        auto* sums = static_cast<float*>(work_.get(2 * b, fn));
        float* pooled = sums + b / 4;
        const unsigned blocks = static_cast<unsigned>(std::clamp<std::int64_t>((G * L + 255) / 256, 1, 4096));
        if (L > 0) {
            detail::group_column_sums_kernel<><<<blocks, 256, 0, stream>>>(pc.col, pc.rsplit, static_cast<int>(Hkv),
                                                                            static_cast<int>(n), static_cast<int>(G),
                                                                            static_cast<int>(L), sums);
            detail::check_launch(fn, "group_column_sums_kernel");
            if (pool_mode >= 0) {
                detail::pool1d_kernel<><<<blocks, 256, 0, stream>>>(sums, static_cast<int>(G), static_cast<int>(L), kernel,
                                                                    pool_mode, pooled);
                detail::check_launch(fn, "pool1d_kernel");
            }
        }
        const float* src = pool_mode >= 0 ? pooled : sums;
        std::vector<float> host(static_cast<std::size_t>(G * L));
        int status = 0;
        if (!host.empty())
            detail::check_cuda(cudaMemcpyAsync(host.data(), src, host.size() * sizeof(float), cudaMemcpyDeviceToHost, stream),
                               fn, "cudaMemcpyAsync");
        detail::check_cuda(cudaMemcpyAsync(&status, pc.status, sizeof(int), cudaMemcpyDeviceToHost, stream), fn,
                           "cudaMemcpyAsync");
        detail::check_cuda(cudaStreamSynchronize(stream), fn, "cudaStreamSynchronize");
        detail::require((status & detail::kInputNonFinite) == 0, fn,
                        "q or k holds NaN or Inf (in k, or in a query row whose attention is scored)");
        std::vector<std::vector<double>> out(static_cast<std::size_t>(G), std::vector<double>(static_cast<std::size_t>(L)));
        for (std::int64_t g = 0; g < G; ++g)
            for (std::int64_t j = 0; j < L; ++j) {
                const float x = host[static_cast<std::size_t>(g * L + j)];
                detail::require(std::isfinite(x), fn,
                                "a score is not finite: an fp32 overflow of a logit (inputs too large for the scale)");
                out[static_cast<std::size_t>(g)][static_cast<std::size_t>(j)] = x;
            }
        return out;
    }

    detail::ProbeColumns probe_;
    detail::GrowBuffer work_;
};

}  // namespace vlsparse::cuda
