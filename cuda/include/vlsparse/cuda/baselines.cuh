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
#include "vlsparse/cuda/selection/lists.cuh"
#include "vlsparse/cuda/selection/probe_columns.cuh"
#include "vlsparse/policies/baselines_select.hpp"

namespace vlsparse::cuda {

namespace detail {

// SnapKV's pooling of each group's L scores: stride 1, padding kernel / 2; avg divides by the kernel
// (zero padding counted, as F.avg_pool1d), max ignores the padding. mode: 0 none, 1 avg, 2 max.
template <int Unused = 0>
__global__ void pool1d_kernel(const float* in, int G, int L, int kernel, int mode, float* out) {
    dependent_entry();  // programmatic dependent launch: see common.cuh
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
        return h2o_scores_impl(q, k, {}, groups, opt, stream, fn);
    }

    // The same with each row's log-sum-exp of the layer's causal attention given (row_lse [n, H], device,
    // natural log, for the same scale: what cuda::dense_prefill_attention writes with its lse argument):
    // no pass over every key for the rows' statistics (see h2o_device_select's overload for what is then
    // checked). A non-finite row_lse is an error naming it.
    template <ElementType TQ, ElementType TK>
    std::vector<std::vector<double>> h2o_scores(View3<const TQ> q, View3<const TK> k, View2<const float> row_lse,
                                                BaselineGroups groups, const AttentionOptions& opt = {},
                                                cudaStream_t stream = 0) {
        constexpr const char* fn = "cuda::h2o_scores";
        check(q, k, fn);
        return h2o_scores_impl(q, k, detail::checked_row_lse(row_lse, q.shape[0], q.shape[1], fn), groups, opt, stream, fn);
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
        return snapkv_pooled_scores_impl(q, k, {}, P, stream, fn);
    }

    // The same with each row's log-sum-exp of the layer's causal attention given (row_lse [n, H], as for
    // h2o_scores; only the window's rows are read): the window rows' pass over every key for their
    // statistics is skipped.
    template <ElementType TQ, ElementType TK>
    std::vector<std::vector<double>> snapkv_pooled_scores(View3<const TQ> q, View3<const TK> k, View2<const float> row_lse,
                                                          const SnapKVParams& P, cudaStream_t stream = 0) {
        constexpr const char* fn = "cuda::snapkv_pooled_scores";
        P.validate(fn);
        check(q, k, fn);
        return snapkv_pooled_scores_impl(q, k, detail::checked_row_lse(row_lse, q.shape[0], q.shape[1], fn), P, stream, fn);
    }

    template <ElementType TQ, ElementType TK>
    TokenSelection snapkv_select(View3<const TQ> q, View3<const TK> k, const SnapKVParams& P, cudaStream_t stream = 0) {
        return snapkv_select_from_pooled(snapkv_pooled_scores(q, k, P, stream), q.shape[0], P);
    }
    template <ElementType TQ, ElementType TK>
    TokenSelection snapkv_select(View3<const TQ> q, View3<const TK> k, View2<const float> row_lse, const SnapKVParams& P,
                                 cudaStream_t stream = 0) {
        return snapkv_select_from_pooled(snapkv_pooled_scores(q, k, row_lse, P, stream), q.shape[0], P);
    }

    // FastV's (and A-VL's) score: the last row's attention averaged over every query head, host [n].
    template <ElementType TQ, ElementType TK>
    std::vector<double> fastv_scores(View3<const TQ> q, View3<const TK> k, const AttentionOptions& opt = {},
                                     cudaStream_t stream = 0) {
        constexpr const char* fn = "cuda::fastv_scores";
        check(q, k, fn);
        return fastv_scores_impl(q, k, {}, opt, stream, fn);
    }

    // The same with each row's log-sum-exp of the layer's causal attention given (row_lse [n, H], as for
    // h2o_scores; only the last row is read): one pass over the keys instead of two.
    template <ElementType TQ, ElementType TK>
    std::vector<double> fastv_scores(View3<const TQ> q, View3<const TK> k, View2<const float> row_lse,
                                     const AttentionOptions& opt = {}, cudaStream_t stream = 0) {
        constexpr const char* fn = "cuda::fastv_scores";
        check(q, k, fn);
        return fastv_scores_impl(q, k, detail::checked_row_lse(row_lse, q.shape[0], q.shape[1], fn), opt, stream, fn);
    }

    template <ElementType TQ, ElementType TK>
    TokenSelection fastv_select(View3<const TQ> q, View3<const TK> k, const Layout& layout, const FastVParams& P,
                                cudaStream_t stream = 0) {
        constexpr const char* fn = "cuda::fastv_select";
        P.validate(fn);
        layout.require_tokens(q.shape[0], fn);
        return fastv_select_from_scores(fastv_scores(q, k, P.attention(), stream), layout, P);
    }

    // ---- Selections as device lists (cuda::DeviceSelection: ranked on the GPU, one synchronization) ----
    // The same kept sets as the host selects above (the CPU paths' rules, exactly, on the same fp32
    // scores); the lists stay on the device for the prefill, decode and KV compaction kernels. The
    // result stays valid until the next *_device_select call of this scorer.

    // H2O: per group, the last `recent` positions plus the top `heavy` of the others by accumulated
    // attention (everything when heavy + recent >= n). Scores: a_j.
    template <ElementType TQ, ElementType TK>
    const DeviceSelection& h2o_device_select(View3<const TQ> q, View3<const TK> k, const H2OParams& P,
                                             cudaStream_t stream = 0) {
        return h2o_device_select_impl(q, k, {}, P, stream, "cuda::h2o_device_select");
    }

    // The same, with each row's log-sum-exp of the layer's causal attention given: row_lse [n, H] (fp32,
    // device; natural log, what cuda::dense_prefill_attention writes with its lse argument, or
    // FlashAttention's softmax_lse, for the same scale). The rows' statistics pass over every key is then
    // skipped: about half the work (every row's logits once instead of twice), and no 8 bytes per (row,
    // 128 keys) of workspace. q and K are then not checked for NaN / Inf as such: non-finite inputs give
    // non-finite scores, an error where they reach a ranked position (not among the `recent` ones).
    template <ElementType TQ, ElementType TK>
    const DeviceSelection& h2o_device_select(View3<const TQ> q, View3<const TK> k, View2<const float> row_lse,
                                             const H2OParams& P, cudaStream_t stream = 0) {
        constexpr const char* fn = "cuda::h2o_device_select";
        return h2o_device_select_impl(q, k, detail::checked_row_lse(row_lse, q.shape[0], q.shape[1], fn), P, stream, fn);
    }

private:
    template <ElementType TQ, ElementType TK>
    std::vector<std::vector<double>> h2o_scores_impl(View3<const TQ> q, View3<const TK> k, detail::ProbeRowLse row_lse,
                                                     BaselineGroups groups, const AttentionOptions& opt, cudaStream_t stream,
                                                     const char* fn) {  // (q and k checked by the caller)
        std::vector<std::int64_t> rows(static_cast<std::size_t>(q.shape[0]));
        std::iota(rows.begin(), rows.end(), std::int64_t{0});
        return scores(q, k, rows, groups == BaselineGroups::kv_head, q.shape[0], opt, -1, 0, stream, fn, row_lse);
    }

    template <ElementType TQ, ElementType TK>
    const DeviceSelection& h2o_device_select_impl(View3<const TQ> q, View3<const TK> k, detail::ProbeRowLse row_lse,
                                                  const H2OParams& P, cudaStream_t stream, const char* fn) {
        P.validate(fn);
        check(q, k, fn);
        const std::int64_t n = q.shape[0];
        std::vector<std::int64_t> rows(static_cast<std::size_t>(n));
        std::iota(rows.begin(), rows.end(), std::int64_t{0});
        const DeviceScores ds = device_scores(q, k, rows, P.groups == BaselineGroups::kv_head, n, P.attention(), -1, 0,
                                              stream, fn, row_lse);
        const std::int64_t heavy = P.heavy.resolve(n), recent = std::min(P.recent.resolve(n), n);
        const bool all = heavy + recent >= n;
        lists_.begin(ds.G, n, all ? 0 : n - recent, n, {}, stream, fn);
        if (!all)
            for (std::int64_t g = 0; g < ds.G; ++g) lists_.rank(g, 0, n - recent, heavy);
        return finish_scored(ds, 1.0, {}, stream, fn);
    }

    template <ElementType TQ, ElementType TK>
    std::vector<std::vector<double>> snapkv_pooled_scores_impl(View3<const TQ> q, View3<const TK> k,
                                                               detail::ProbeRowLse row_lse, const SnapKVParams& P,
                                                               cudaStream_t stream, const char* fn) {  // (checked by the caller)
        const std::int64_t n = q.shape[0];
        detail::require(P.window <= n, fn, "window = ", P.window, " is larger than the prompt (n = ", n,
                        "), expected 1 <= window <= n");
        return scores(q, k, window_rows(n, P.window), P.groups == BaselineGroups::kv_head, n - P.window, P.attention(),
                      pool_mode(P), static_cast<int>(P.kernel), stream, fn, row_lse);
    }

    template <ElementType TQ, ElementType TK>
    std::vector<double> fastv_scores_impl(View3<const TQ> q, View3<const TK> k, detail::ProbeRowLse row_lse,
                                          const AttentionOptions& opt, cudaStream_t stream, const char* fn) {
        const std::int64_t n = q.shape[0];
        const std::vector<std::int64_t> last{n - 1};
        auto s = scores(q, k, last, false, n, opt, -1, 0, stream, fn, row_lse);
        for (auto& x : s[0]) x /= static_cast<double>(q.shape[1]);
        return std::move(s[0]);
    }

    template <ElementType TQ, ElementType TK>
    const DeviceSelection& snapkv_device_select_impl(View3<const TQ> q, View3<const TK> k, detail::ProbeRowLse row_lse,
                                                     const SnapKVParams& P, cudaStream_t stream, const char* fn) {
        const std::int64_t n = q.shape[0];
        detail::require(P.window <= n, fn, "window = ", P.window, " is larger than the prompt (n = ", n,
                        "), expected 1 <= window <= n");
        const std::int64_t C = P.capacity.resolve(n), L = n - P.window;
        detail::require(C >= P.window, fn, "capacity = ", C, " tokens is below window = ", P.window,
                        ", expected capacity >= window (the window is always kept)");
        const DeviceScores ds = device_scores(q, k, window_rows(n, P.window), P.groups == BaselineGroups::kv_head, L,
                                              P.attention(), pool_mode(P), static_cast<int>(P.kernel), stream, fn, row_lse);
        lists_.begin(ds.G, n, C >= n ? 0 : L, n, {}, stream, fn);
        if (C < n)
            for (std::int64_t g = 0; g < ds.G; ++g) lists_.rank(g, 0, L, C - P.window);
        return finish_scored(ds, 1.0, {}, stream, fn);
    }

    template <ElementType TQ, ElementType TK>
    const DeviceSelection& fastv_device_select_impl(View3<const TQ> q, View3<const TK> k, detail::ProbeRowLse row_lse,
                                                    const Layout& layout, const FastVParams& P, cudaStream_t stream,
                                                    const char* fn) {
        const std::int64_t n = q.shape[0];
        layout.require_tokens(n, fn);
        const std::vector<std::int64_t> last{n - 1};
        const DeviceScores ds = device_scores(q, k, last, false, n, P.attention(), -1, 0, stream, fn, row_lse);
        std::vector<std::uint8_t> visual(static_cast<std::size_t>(n), 0), other(static_cast<std::size_t>(n), 1);
        std::int64_t first = n, end = 0, m = 0;
        for (const auto& s : layout.segments()) {
            if (!s.is_visual()) continue;
            for (std::int64_t p = s.start; p < s.end(); ++p) {
                visual[static_cast<std::size_t>(p)] = 1;
                other[static_cast<std::size_t>(p)] = 0;
            }
            first = std::min(first, s.start);
            end = std::max(end, s.end());
            m += s.length;
        }
        lists_.begin(1, n, 0, 0, other, stream, fn);
        if (P.spans == FastVSpans::joint) {
            lists_.rank(0, first, end, TokenBudget::ratio(1.0 - P.rate).resolve(m));
            return finish_scored(ds, static_cast<double>(q.shape[1]), visual, stream, fn);
        }
        for (const auto& s : layout.segments())
            if (s.is_visual()) lists_.rank(0, s.start, s.end(), TokenBudget::ratio(1.0 - P.rate).resolve(s.length));
        return finish_scored(ds, static_cast<double>(q.shape[1]), {}, stream, fn);
    }

    static int pool_mode(const SnapKVParams& P) {
        return P.pooling == SnapKVPooling::none ? 0 : (P.pooling == SnapKVPooling::avg ? 1 : 2);
    }

public:
    // SnapKV: per group, the window plus the top capacity - window prefix positions by pooled window
    // attention (everything when n <= capacity). Scores: the pooled scores (0 on the window).
    template <ElementType TQ, ElementType TK>
    const DeviceSelection& snapkv_device_select(View3<const TQ> q, View3<const TK> k, const SnapKVParams& P,
                                                cudaStream_t stream = 0) {
        constexpr const char* fn = "cuda::snapkv_device_select";
        P.validate(fn);
        check(q, k, fn);
        return snapkv_device_select_impl(q, k, {}, P, stream, fn);
    }

    // The same with row_lse [n, H] given (as for h2o_device_select; only the window's rows are read).
    template <ElementType TQ, ElementType TK>
    const DeviceSelection& snapkv_device_select(View3<const TQ> q, View3<const TK> k, View2<const float> row_lse,
                                                const SnapKVParams& P, cudaStream_t stream = 0) {
        constexpr const char* fn = "cuda::snapkv_device_select";
        P.validate(fn);
        check(q, k, fn);
        return snapkv_device_select_impl(q, k, detail::checked_row_lse(row_lse, q.shape[0], q.shape[1], fn), P, stream, fn);
    }

    // FastV: every non-visual token plus the top floor((1 - rate) m) visual tokens (jointly, or per
    // image) by the last row's head-mean attention. One shared list. Scores: (1/H) sum_h A[h, n-1, j].
    template <ElementType TQ, ElementType TK>
    const DeviceSelection& fastv_device_select(View3<const TQ> q, View3<const TK> k, const Layout& layout,
                                               const FastVParams& P, cudaStream_t stream = 0) {
        constexpr const char* fn = "cuda::fastv_device_select";
        P.validate(fn);
        check(q, k, fn);
        return fastv_device_select_impl(q, k, {}, layout, P, stream, fn);
    }

    // The same with row_lse [n, H] given (as for h2o_device_select; only the last row is read): the
    // last row's scores in one pass over the keys instead of two.
    template <ElementType TQ, ElementType TK>
    const DeviceSelection& fastv_device_select(View3<const TQ> q, View3<const TK> k, View2<const float> row_lse,
                                               const Layout& layout, const FastVParams& P, cudaStream_t stream = 0) {
        constexpr const char* fn = "cuda::fastv_device_select";
        P.validate(fn);
        check(q, k, fn);
        return fastv_device_select_impl(q, k, detail::checked_row_lse(row_lse, q.shape[0], q.shape[1], fn), layout, P,
                                        stream, fn);
    }

    // StreamingLLM, random and fixed ratio compute nothing: the CPU paths' lists, uploaded.
    const DeviceSelection& streamingllm_device_select(std::int64_t n, const StreamingLLMParams& P, cudaStream_t stream = 0) {
        return lists_.upload(streamingllm_select(n, P), stream, "cuda::streamingllm_device_select");
    }
    const DeviceSelection& random_device_select(const Layout& layout, std::int64_t layer, const RandomParams& P,
                                                cudaStream_t stream = 0) {
        return lists_.upload(random_select(layout, layer, P), stream, "cuda::random_device_select");
    }
    const DeviceSelection& fixed_ratio_device_select(const Layout& layout, const FixedRatioParams& P,
                                                     cudaStream_t stream = 0) {
        return lists_.upload(fixed_ratio_select(layout, P), stream, "cuda::fixed_ratio_device_select");
    }

    // Tests: every byte of the device workspace set to `byte`. Synchronizes.
    void fill_workspace(int byte) {
        probe_.fill(byte, "cuda::BaselineScorer::fill_workspace");
        work_.fill(byte, "cuda::BaselineScorer::fill_workspace");
        lists_.fill(byte, "cuda::BaselineScorer::fill_workspace");
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

    // Column sums of the probe rows' attention, per group, first L keys, optionally pooled, on the device
    // ([G][L], enqueued on `stream`, nothing synchronized); `status` the probe step's status word.
    struct DeviceScores {
        const float* data = nullptr;
        const int* status = nullptr;
        std::int64_t G = 0, L = 0;
    };
    template <ElementType TQ, ElementType TK>
    DeviceScores device_scores(View3<const TQ> q, View3<const TK> k, const std::vector<std::int64_t>& rows,
                               bool per_kv_head, std::int64_t L, const AttentionOptions& opt, int pool_mode, int kernel,
                               cudaStream_t stream, const char* fn, detail::ProbeRowLse row_lse = {}) {
        const std::int64_t n = q.shape[0], d = q.shape[2], Hkv = k.shape[1];
        const std::int64_t G = per_kv_head ? Hkv : 1;
        const double scale = ::vlsparse::detail::resolve_scale(opt, d, fn);
        const detail::ProbeColumnsResult pc = probe_.run(q, k, std::span<const std::int64_t>(rows), scale, stream, fn, row_lse);
        const std::size_t b = detail::align256(static_cast<std::size_t>(std::max<std::int64_t>(G * L, 1)) * 4);
        auto* sums = static_cast<float*>(work_.get(2 * b, fn));
        float* pooled = sums + b / 4;
        const unsigned blocks = static_cast<unsigned>(std::clamp<std::int64_t>((G * L + 255) / 256, 1, 4096));
        if (L > 0) {
            detail::launch_dependent(detail::group_column_sums_kernel<>, blocks, 256, 0, stream, fn,
                                     "group_column_sums_kernel", pc.col, pc.rsplit, static_cast<int>(Hkv),
                                     static_cast<int>(n), static_cast<int>(G), static_cast<int>(L), static_cast<int>(L),
                                     sums);
            if (pool_mode >= 0) {
                detail::launch_dependent(detail::pool1d_kernel<>, blocks, 256, 0, stream, fn, "pool1d_kernel", sums,
                                         static_cast<int>(G), static_cast<int>(L), kernel, pool_mode, pooled);
            }
        }
        return {pool_mode >= 0 ? pooled : sums, pc.status, G, L};
    }

    // The same, copied to the host (one synchronization) and checked.
    template <ElementType TQ, ElementType TK>
    std::vector<std::vector<double>> scores(View3<const TQ> q, View3<const TK> k, const std::vector<std::int64_t>& rows,
                                            bool per_kv_head, std::int64_t L, const AttentionOptions& opt, int pool_mode,
                                            int kernel, cudaStream_t stream, const char* fn, detail::ProbeRowLse row_lse = {}) {
        const DeviceScores ds = device_scores(q, k, rows, per_kv_head, L, opt, pool_mode, kernel, stream, fn, row_lse);
        const std::int64_t G = ds.G;
        std::vector<float> host(static_cast<std::size_t>(G * L));
        int status = 0;
        if (!host.empty())
            detail::check_cuda(cudaMemcpyAsync(host.data(), ds.data, host.size() * sizeof(float), cudaMemcpyDeviceToHost, stream),
                               fn, "cudaMemcpyAsync");
        detail::check_cuda(cudaMemcpyAsync(&status, ds.status, sizeof(int), cudaMemcpyDeviceToHost, stream), fn,
                           "cudaMemcpyAsync");
        detail::check_cuda(cudaStreamSynchronize(stream), fn, "cudaStreamSynchronize");
        check_status(status, 0, fn);
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

    static void check_status(int probe_status, int list_status, const char* fn) {
        detail::require((probe_status & detail::kInputNonFinite) == 0, fn,
                        "q or k holds NaN or Inf (in k, or in a query row whose attention is scored)");
        detail::require((probe_status & detail::kRowLseBad) == 0, fn, "row_lse holds NaN or Inf");
        detail::require((list_status & detail::kScoreBad) == 0, fn,
                        "a score is not finite: an fp32 overflow of a logit (inputs too large for the scale)");
    }

    // The device lists of a scored selection: ranks ds with the builder's tasks, one synchronization.
    const DeviceSelection& finish_scored(const DeviceScores& ds, double score_divisor, std::span<const std::uint8_t> eligible,
                                         cudaStream_t stream, const char* fn) {
        lists_.run_tasks(ds.data, ds.L, eligible, stream, fn);
        lists_.finish(stream, fn, ds.status);
        check_status(lists_.extra_status(), lists_.status(), fn);
        DeviceSelection& r = lists_.result();
        r.scores = ds.L > 0 ? ds.data : nullptr;
        r.score_groups = ds.G;  // (every score 0 on the host when L = 0: the window is the whole prompt)
        r.score_len = ds.L;
        r.score_divisor = score_divisor;
        return r;
    }

    detail::ProbeColumns probe_;
    detail::GrowBuffer work_;
    detail::ListBuilder lists_;
};

}  // namespace vlsparse::cuda
