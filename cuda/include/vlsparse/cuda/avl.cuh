// vlsparse/cuda/avl.cuh -- A-VL's prefill-time selection on the GPU (namespace vlsparse::cuda): the last
// prompt token's head-mean attention, the kept and core image sets of every span, and the prefill
// filter (P%), as device lists.
//
// Same Params (AvlParams), same rules and tie order as avl_select / avl_prefill_filter
// (vlsparse/policies/avl_params.hpp), ranked on the device:
//
//   cuda::AvlSelector sel;                                             // owns its device workspace
//   const cuda::DeviceAvlSelection& s = sel.select(q, k, layout, params, present, stream);
//   s.kept   (DeviceSelection: kept image tokens of every span + every present non-image token, one list)
//   s.core   (DeviceSelection: the core image tokens, what a non-refresh decode step reads besides text)
//   s.core_budget (host, per span), s.kept.scores (device, the head-mean score of every position)
//   const cuda::DeviceSelection& f = sel.prefill_filter(q, k, layout, params, present, stream);
//
// `opt`: the softmax scale (0: 1/sqrt(d)), as the CPU paths' avl_scores take it; check_finite changes
// nothing (NaN / Inf in k or the last row of q is always an error).
// q [m, H, d] and k [m, H_kv, d] are device views of the rows still in the sequence: every position
// (present empty, m = n = layout.n()) or the ascending positions `present` left by an earlier prefill
// filter (m = present.size()). The scores are the probe column sums of the last row (the runner ZipVL
// and the baselines share), fp32; the ranking is exact on them (see selection/lists.cuh), so the kept
// sets equal what the CPU code keeps on the same fp32 scores and differ from the reference only where
// its double scores tie within fp32 precision at a cut. Each call synchronizes `stream` once.
// Not on the GPU yet: the text budget (text_rate > 0: H2O for text) and the decode refresh re-rank
// (DecodeSchedule); both are an error here, use the CPU path's avl_text_h2o / DecodeSchedule.
// Include: this header, from a .cu translation unit (nvcc, C++20).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include "vlsparse/attention/common.hpp"
#include "vlsparse/core/layout.hpp"
#include "vlsparse/core/tensor.hpp"
#include "vlsparse/cuda/common.cuh"
#include "vlsparse/cuda/selection/lists.cuh"
#include "vlsparse/cuda/selection/probe_columns.cuh"
#include "vlsparse/policies/avl_params.hpp"

namespace vlsparse::cuda {

// A-VL's decision for one layer, on the device.
struct DeviceAvlSelection {
    std::int64_t n = 0;
    std::vector<AvlSpan> spans;
    std::vector<std::int64_t> core_budget;  // per span: min(floor((1 - compute_rate) len), its kept count)
    DeviceSelection kept;                   // one shared list; kept.scores = the score of every position
    DeviceSelection core;                   // one list: the core image positions of every span
};

namespace detail {

// scores[present[i]] = sums over the KV heads (and row splits) of the last row's column sums at row i;
// scores[j] = 0 elsewhere (zeroed first by the caller). present null: row i is position i.
template <int Unused = 0>
__global__ void avl_scatter_kernel(const float* col, int rsplit, int Hkv, int m, const std::int32_t* present, float* scores) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < m; i += gridDim.x * blockDim.x) {
        float a = 0.0f;
        for (int z = 0; z < rsplit; ++z)
            for (int h = 0; h < Hkv; ++h) a += col[(static_cast<std::int64_t>(z) * Hkv + h) * m + i];
        scores[present ? present[i] : i] = a;
    }
}

}  // namespace detail

class AvlSelector {
public:
    AvlSelector() = default;
    AvlSelector(const AvlSelector&) = delete;
    AvlSelector& operator=(const AvlSelector&) = delete;

    // Kept and core sets of one layer (avl_select without text lists).
    template <ElementType TQ, ElementType TK>
    const DeviceAvlSelection& select(View3<const TQ> q, View3<const TK> k, const Layout& layout, const AvlParams& P,
                                     std::span<const std::int64_t> present = {}, cudaStream_t stream = 0,
                                     const AttentionOptions& opt = {}) {
        constexpr const char* fn = "cuda::avl_select";
        P.validate(fn);
        detail::require(P.text_rate == 0.0, fn, "text_rate = ", P.text_rate,
                        ": the text budget (H2O for text) is not on the GPU yet; use the CPU path's avl_text_h2o");
        const std::vector<std::int64_t> pr = prepare(q, k, layout, present, opt, stream, fn);
        DeviceAvlSelection& r = res_;
        r = DeviceAvlSelection{};
        r.n = layout.n();
        r.spans = avl_spans(layout, P.spans);
        // Kept: every present non-image position, plus each span's top floor((1 - rate) len) present ones.
        std::vector<std::uint8_t> other(static_cast<std::size_t>(r.n), 0);
        for (auto p : pr)
            if (!::vlsparse::detail::in_spans(r.spans, p)) other[static_cast<std::size_t>(p)] = 1;
        kept_.begin(1, r.n, 0, 0, other, stream, fn);
        for (const auto& s : r.spans) kept_.rank(0, s.start, s.end(), avl_budget(s.length, P.rate));
        kept_.run_tasks(scores_, r.n, present_mask_, stream, fn);
        // Core: each span's top min(floor((1 - compute_rate) len), kept) among its kept positions (the
        // kept ranking's mask, before it is compacted: both lists then share one synchronization).
        core_.begin(1, r.n, 0, 0, {}, stream, fn);
        for (const auto& s : r.spans) {
            const std::int64_t in_span = static_cast<std::int64_t>(std::lower_bound(pr.begin(), pr.end(), s.end()) -
                                                                   std::lower_bound(pr.begin(), pr.end(), s.start));
            const std::int64_t kept = std::min(avl_budget(s.length, P.rate), in_span);
            const std::int64_t cb = std::min(avl_budget(s.length, P.compute_rate), kept);
            r.core_budget.push_back(cb);
            core_.rank(0, s.start, s.end(), cb);
        }
        core_.run_tasks_device(scores_, r.n, kept_.keep_mask(), stream, fn);
        kept_.compact(stream, fn);
        core_.compact(stream, fn);
        kept_.enqueue_read(stream, fn, status_);
        core_.enqueue_read(stream, fn, status_);
        detail::check_cuda(cudaStreamSynchronize(stream), fn, "cudaStreamSynchronize");
        r.kept = collect(kept_, fn);
        r.core = collect(core_, fn);
        return r;
    }

    // The prefill filter: the present non-image positions plus each span's top floor((1 - prefill_filter)
    // len) present image positions (avl_prefill_filter). One list.
    template <ElementType TQ, ElementType TK>
    const DeviceSelection& prefill_filter(View3<const TQ> q, View3<const TK> k, const Layout& layout, const AvlParams& P,
                                          std::span<const std::int64_t> present = {}, cudaStream_t stream = 0,
                                          const AttentionOptions& opt = {}) {
        constexpr const char* fn = "cuda::avl_prefill_filter";
        P.validate(fn);
        const std::vector<std::int64_t> pr = prepare(q, k, layout, present, opt, stream, fn);
        const std::int64_t n = layout.n();
        const auto spans = avl_spans(layout, P.spans);
        std::vector<std::uint8_t> other(static_cast<std::size_t>(n), 0);
        for (auto p : pr)
            if (!::vlsparse::detail::in_spans(spans, p)) other[static_cast<std::size_t>(p)] = 1;
        kept_.begin(1, n, 0, 0, other, stream, fn);
        for (const auto& s : spans) kept_.rank(0, s.start, s.end(), avl_budget(s.length, P.prefill_filter));
        kept_.run_tasks(scores_, n, present_mask_, stream, fn);
        filter_ = finish(kept_, stream, fn);
        return filter_;
    }

    // Tests: every byte of the workspace set to `byte`. Synchronizes.
    void fill_workspace(int byte) {
        constexpr const char* fn = "cuda::AvlSelector::fill_workspace";
        probe_.fill(byte, fn);
        work_.fill(byte, fn);
        kept_.fill(byte, fn);
        core_.fill(byte, fn);
    }

private:
    // Checks, the present rows on the device, and the scores of every position into scores_ ([n], 0 where
    // absent). Returns the present positions (every position when `present` is empty).
    template <ElementType TQ, ElementType TK>
    std::vector<std::int64_t> prepare(View3<const TQ> q, View3<const TK> k, const Layout& layout,
                                      std::span<const std::int64_t> present, const AttentionOptions& opt,
                                      cudaStream_t stream, const char* fn) {
        detail::require(q.data != nullptr && k.data != nullptr, fn, "q or k is a null view");
        ::vlsparse::detail::check_prefill_qk(q, k, fn);
        const std::int64_t n = layout.n(), m = q.shape[0], H = q.shape[1], d = q.shape[2], Hkv = k.shape[1];
        detail::require(n >= 1 && n <= std::numeric_limits<std::int32_t>::max() / 2, fn, "the layout has n = ", n,
                        " tokens, expected 1 <= n < 2^30");
        detail::require(d <= 256, fn, "head_dim = ", d, ", expected <= 256");
        std::vector<std::int64_t> pr = ::vlsparse::detail::check_present(present, n, fn);
        detail::require(static_cast<std::int64_t>(pr.size()) == m, fn, "q has ", m, " rows but ",
                        present.empty() ? "the layout has " : "present lists ", pr.size(),
                        present.empty() ? " tokens" : " positions", "; expected one row per present position");
        const double scale = ::vlsparse::detail::resolve_scale(opt, d, fn);
        const std::int64_t last[1] = {m - 1};
        const detail::ProbeColumnsResult pc = probe_.run(q, k, std::span<const std::int64_t>(last), scale, stream, fn);
        const std::size_t b_sc = detail::align256(static_cast<std::size_t>(n) * 4);
        const std::size_t b_pr = detail::align256(static_cast<std::size_t>(m) * 4);
        char* base = static_cast<char*>(work_.get(b_sc + b_pr, fn));
        scores_ = reinterpret_cast<float*>(base);
        auto* present_d = reinterpret_cast<std::int32_t*>(base + b_sc);
        present_mask_.clear();
        if (!present.empty()) {
            char* h = staging_.get(static_cast<std::size_t>(m) * 4, fn);
            auto* hp = reinterpret_cast<std::int32_t*>(h);
            for (std::int64_t i = 0; i < m; ++i) hp[i] = static_cast<std::int32_t>(pr[static_cast<std::size_t>(i)]);
            detail::check_cuda(cudaMemcpyAsync(present_d, h, static_cast<std::size_t>(m) * 4, cudaMemcpyHostToDevice, stream),
                               fn, "cudaMemcpyAsync");
            staging_.mark(stream, fn);
            detail::check_cuda(cudaMemsetAsync(scores_, 0, static_cast<std::size_t>(n) * 4, stream), fn, "cudaMemsetAsync");
            present_mask_.assign(static_cast<std::size_t>(n), 0);
            for (auto p : pr) present_mask_[static_cast<std::size_t>(p)] = 1;
        }
        const unsigned blocks = static_cast<unsigned>(std::clamp<std::int64_t>((m + 255) / 256, 1, 4096));
        detail::avl_scatter_kernel<><<<blocks, 256, 0, stream>>>(pc.col, pc.rsplit, static_cast<int>(Hkv), static_cast<int>(m),
                                                                  present.empty() ? nullptr : present_d, scores_);
        detail::check_launch(fn, "avl_scatter_kernel");
        status_ = pc.status;
        H_ = H;
        return pr;
    }

    DeviceSelection finish(detail::ListBuilder& b, cudaStream_t stream, const char* fn) {
        b.finish(stream, fn, status_);
        return checked(b, fn);
    }
    DeviceSelection collect(detail::ListBuilder& b, const char* fn) {
        b.collect();
        return checked(b, fn);
    }
    DeviceSelection checked(detail::ListBuilder& b, const char* fn) {
        detail::require((b.extra_status() & detail::kInputNonFinite) == 0, fn,
                        "q or k holds NaN or Inf (in k, or in the last row of q)");
        detail::require((b.status() & detail::kScoreBad) == 0, fn,
                        "a score is not finite: an fp32 overflow of a logit (inputs too large for the scale)");
        DeviceSelection r = b.result();
        r.scores = scores_;
        r.score_groups = 1;
        r.score_len = r.n;
        r.score_divisor = static_cast<double>(H_);
        return r;
    }

    detail::ProbeColumns probe_;
    detail::GrowBuffer work_;
    detail::PinnedStaging staging_;
    detail::ListBuilder kept_, core_;
    float* scores_ = nullptr;
    int* status_ = nullptr;
    std::int64_t H_ = 1;
    std::vector<std::uint8_t> present_mask_;
    DeviceAvlSelection res_;
    DeviceSelection filter_;
};

}  // namespace vlsparse::cuda
