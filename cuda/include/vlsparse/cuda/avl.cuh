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
// Decode: cuda::AvlDecodeSchedule is DecodeSchedule on the device -- the rows each step reads as a
// device list (no synchronization: the lengths are known on the host) and the core set re-ranked
// after a refresh step from the probabilities batched_decode_attention wrote for that step:
//
//   cuda::AvlDecodeSchedule sch;
//   sch.reset(s, params, stream);                       // after sel.select(...) of the layer
//   for each step t: sch.begin_step(t);
//       const cuda::DeviceSelection& rows = sch.positions(t, seq_len, stream);   // rows.rows() -> decode
//       if (sch.is_refresh(t) && sch.splits()) sch.refresh(t, probs, stream);   // probs: one per entry of rows
//
// Not on the GPU yet: the text budget (text_rate > 0: H2O for text); an error here, use the CPU
// path's avl_text_h2o.
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
#include "vlsparse/policies/avl_select.hpp"

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
// out = base[0 .. base_len) followed by the decode tokens first .. last - 1; indptr = {0, total}.
template <int Unused = 0>
__global__ void avl_step_list_kernel(const std::int32_t* base, int base_len, int first, int last, std::int32_t* out,
                                     std::int32_t* indptr) {
    const int total = base_len + (last - first);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x)
        out[i] = i < base_len ? base[i] : first + (i - base_len);
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        indptr[0] = 0;
        indptr[1] = total;
    }
}

// scores[rows[e]] = probs[e] for the first m entries (the kept prompt rows of a refresh step's list).
template <int Unused = 0>
__global__ void avl_refresh_scatter_kernel(const std::int32_t* rows, const float* probs, int m, float* scores) {
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < m; e += gridDim.x * blockDim.x) scores[rows[e]] = probs[e];
}

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
        core_.begin(1, r.n, 0, 0, {}, stream, fn);
        for (const auto& s : r.spans) kept_.rank(0, s.start, s.end(), avl_budget(s.length, P.rate));
        // Core: each span's top min(floor((1 - compute_rate) len), kept) among its kept positions. The
        // kept ones are the span's top kb present positions in the one ranking order, so their top cb
        // (cb <= kb) are the span's top cb present positions: ranked in the same launch as the kept
        // set, over the same eligible mask (both lists then share one synchronization).
        for (const auto& s : r.spans) {
            const std::int64_t in_span = static_cast<std::int64_t>(std::lower_bound(pr.begin(), pr.end(), s.end()) -
                                                                   std::lower_bound(pr.begin(), pr.end(), s.start));
            const std::int64_t kept = std::min(avl_budget(s.length, P.rate), in_span);
            const std::int64_t cb = std::min(avl_budget(s.length, P.compute_rate), kept);
            r.core_budget.push_back(cb);
            kept_.rank_into(core_, 0, s.start, s.end(), cb, fn);
        }
        kept_.run_tasks(scores_, r.n, present_mask_, stream, fn);
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

// DecodeSchedule (vlsparse/policies/avl_params.hpp) on the device, for one layer: which rows decode
// step t reads (a refresh step: every kept row; otherwise the core image rows and every kept
// non-image row; always every decode token), and the core set re-ranked per span after a refresh
// step from that step's head-mean attention -- the probabilities batched_decode_attention writes for
// the step's list (one per entry; for one list shared by the KV heads, averaged over every query
// head: the head mean). Same rules and tie order as the CPU schedule (top core_budget of each span's
// kept image rows, score descending, position ascending), ranked exactly on the fp32 probabilities:
// given the same probabilities, the core sets are equal. positions() never synchronizes (its length
// is known on the host); refresh() synchronizes once when `check` is on (scores finite and >= 0),
// never when off. Cost (H100, one span of n image rows, bf16 H 28 / H_kv 4 / d 128, docs/cuda.md):
// positions() 3-4 us, under 10% of a dense decode step of the layer; refresh() 57-77 us at 16K,
// 1.5-3x a dense decode step (the re-rank runs in one thread block per span).
class AvlDecodeSchedule {
public:
    AvlDecodeSchedule() = default;
    AvlDecodeSchedule(const AvlDecodeSchedule&) = delete;
    AvlDecodeSchedule& operator=(const AvlDecodeSchedule&) = delete;

    // Starts the schedule of a layer from its prefill selection (AvlSelector::select). Copies the lists
    // it needs (the selection may be overwritten afterwards). Synchronizes `stream`.
    void reset(const DeviceAvlSelection& sel, const AvlParams& P, cudaStream_t stream = 0) {
        constexpr const char* fn = "cuda::AvlDecodeSchedule::reset";
        P.validate(fn);
        detail::require(sel.n >= 1 && sel.kept.lists() == 1 && sel.core.lists() == 1, fn,
                        "expected a selection of AvlSelector::select (one kept list, one core list, n >= 1); got ",
                        sel.kept.lists(), " kept lists, n = ", sel.n);
        P_ = P;
        n_ = sel.n;
        spans_ = sel.spans;
        core_budget_ = sel.core_budget;
        const TokenSelection kept = sel.kept.to_host(), core = sel.core.to_host();
        const auto& kl = kept.indices[0];
        kept_len_ = static_cast<std::int64_t>(kl.size());
        std::vector<std::uint8_t> base_mask(static_cast<std::size_t>(n_), 0), eligible(static_cast<std::size_t>(n_), 0);
        non_image_.assign(static_cast<std::size_t>(n_), 0);
        std::int64_t non_image = 0;
        for (auto p : kl) {
            if (::vlsparse::detail::in_spans(spans_, p)) {
                eligible[static_cast<std::size_t>(p)] = 1;
            } else {
                non_image_[static_cast<std::size_t>(p)] = 1;
                base_mask[static_cast<std::size_t>(p)] = 1;
                ++non_image;
            }
        }
        for (auto p : core.indices[0]) base_mask[static_cast<std::size_t>(p)] = 1;
        std::int64_t budget = 0;
        for (auto b : core_budget_) budget += b;
        base_len_ = non_image + budget;
        detail::require(non_image + static_cast<std::int64_t>(core.indices[0].size()) == base_len_, fn,
                        "the selection's core set has ", core.indices[0].size(), " rows, its core budgets sum to ", budget);
        // Device: the kept list and the eligible mask (kept image rows), scores [n].
        const std::size_t b_kept = detail::align256(static_cast<std::size_t>(std::max<std::int64_t>(kept_len_, 1)) * 4);
        const std::size_t b_el = detail::align256(static_cast<std::size_t>(n_));
        const std::size_t b_sc = detail::align256(static_cast<std::size_t>(n_) * 4);
        char* base = static_cast<char*>(work_.get(b_kept + b_el + b_sc, fn));
        kept_ = reinterpret_cast<std::int32_t*>(base);
        eligible_ = reinterpret_cast<std::uint8_t*>(base + b_kept);
        scores_ = reinterpret_cast<float*>(base + b_kept + b_el);
        char* h = staging_.get(b_kept + b_el, fn);
        auto* hk = reinterpret_cast<std::int32_t*>(h);
        for (std::int64_t i = 0; i < kept_len_; ++i) hk[i] = static_cast<std::int32_t>(kl[static_cast<std::size_t>(i)]);
        std::memcpy(h + b_kept, eligible.data(), eligible.size());
        detail::check_cuda(cudaMemcpyAsync(base, h, b_kept + b_el, cudaMemcpyHostToDevice, stream), fn, "cudaMemcpyAsync");
        staging_.mark(stream, fn);
        // The first base list: the prefill's core rows and the non-image kept rows.
        builders_[0].begin(1, n_, 0, 0, base_mask, stream, fn);
        builders_[0].finish(stream, fn);
        detail::require(builders_[0].result().indptr.back() == base_len_, fn, "internal: base list of ",
                        builders_[0].result().indptr.back(), " rows, expected ", base_len_);
        cur_ = 0;
        has_pending_ = false;
        last_step_ = -1;
        ready_ = true;
    }

    bool is_refresh(std::int64_t t) const { return P_.refresh_every <= 0 || t % P_.refresh_every == 0; }
    bool splits() const { return P_.refresh_every > 0; }
    std::int64_t prompt_length() const { return n_; }
    // Rows of the list positions(t) returns on a refresh step and on other steps (prompt rows only).
    std::int64_t kept_rows() const { return kept_len_; }
    std::int64_t base_rows() const { return base_len_; }

    // Applies a pending core set due at step t. Steps must be begun in increasing order.
    void begin_step(std::int64_t t) {
        constexpr const char* fn = "cuda::AvlDecodeSchedule::begin_step";
        detail::require(ready_, fn, "reset() the schedule from a prefill selection first");
        detail::require(t >= 0 && t > last_step_, fn, "step ", t, ", expected steps in increasing order after ", last_step_);
        last_step_ = t;
        if (has_pending_ && t >= pending_at_) {
            cur_ = pending_;
            has_pending_ = false;
        }
    }

    // The rows step t reads when the sequence holds seq_len rows (decode tokens included), ascending, as
    // one list shared by every KV head (rows() is what batched_decode_attention takes). Valid until the
    // next positions() call. No synchronization.
    const DeviceSelection& positions(std::int64_t t, std::int64_t seq_len, cudaStream_t stream = 0) {
        constexpr const char* fn = "cuda::AvlDecodeSchedule::positions";
        detail::require(ready_, fn, "reset() the schedule from a prefill selection first");
        detail::require(t == last_step_, fn, "step ", t, " is not the current step ", last_step_, " (begin_step first)");
        detail::require(seq_len > n_ && seq_len <= std::numeric_limits<std::int32_t>::max(), fn, "seq_len = ", seq_len,
                        ", expected > the prompt length ", n_, " (append the decode token first)");
        const bool full = is_refresh(t);
        const std::int32_t* src = full ? kept_ : builders_[cur_].indices_device();
        const std::int64_t blen = full ? kept_len_ : base_len_;
        const std::int64_t total = blen + (seq_len - n_);
        const std::size_t b_out = detail::align256(static_cast<std::size_t>(total) * 4);
        char* base = static_cast<char*>(out_.get(b_out + 256, fn));
        auto* out = reinterpret_cast<std::int32_t*>(base);
        auto* indptr = reinterpret_cast<std::int32_t*>(base + b_out);
        const unsigned blocks = static_cast<unsigned>(std::clamp<std::int64_t>((total + 255) / 256, 1, 1024));
        detail::avl_step_list_kernel<><<<blocks, 256, 0, stream>>>(src, static_cast<int>(blen), static_cast<int>(n_),
                                                                   static_cast<int>(seq_len), out, indptr);
        detail::check_launch(fn, "avl_step_list_kernel");
        step_ = DeviceSelection{};
        step_.n = seq_len;
        step_.indptr = {0, static_cast<std::int32_t>(total)};
        step_.indices = out;
        step_.indptr_dev = indptr;
        step_list_full_ = full;
        step_list_t_ = t;
        return step_;
    }

    // Re-ranks the core set after refresh step t from `probs` (device, one per entry of positions(t): the
    // head-mean attention of the step, as batched_decode_attention writes it for that list). The new
    // core set is read from step t + 1 (t + 2 with async_refresh); only the kept image rows'
    // probabilities are read. check: synchronize once and turn a probability of a kept image row that
    // is not finite or is negative into an error; off: no synchronization -- the probabilities must
    // then be finite (the decode step's check_finite, or the engine's own guarantee): a NaN gives an
    // unspecified core list.
    void refresh(std::int64_t t, const float* probs, cudaStream_t stream = 0, bool check = true) {
        constexpr const char* fn = "cuda::AvlDecodeSchedule::refresh";
        detail::require(ready_, fn, "reset() the schedule from a prefill selection first");
        detail::require(splits() && is_refresh(t), fn, "step ", t, " is not a refresh step (K = ", P_.refresh_every, ")");
        detail::require(t == last_step_ && step_list_t_ == t && step_list_full_, fn, "step ", t,
                        " is not the current step, or positions(", t, ") was not taken for it");
        detail::require(probs != nullptr, fn, "probs is null; expected the step's probabilities on the device");
        detail::check_cuda(cudaMemsetAsync(scores_, 0, static_cast<std::size_t>(n_) * 4, stream), fn, "cudaMemsetAsync");
        if (kept_len_ > 0) {
            const unsigned blocks = static_cast<unsigned>(std::clamp<std::int64_t>((kept_len_ + 255) / 256, 1, 1024));
            detail::avl_refresh_scatter_kernel<><<<blocks, 256, 0, stream>>>(kept_, probs, static_cast<int>(kept_len_), scores_);
            detail::check_launch(fn, "avl_refresh_scatter_kernel");
        }
        // The builder the steps before the new set takes effect do not read (two alternate).
        const int next = cur_ ^ 1;
        detail::ListBuilder& b = builders_[next];
        b.begin(1, n_, 0, 0, non_image_, stream, fn);
        for (std::size_t i = 0; i < spans_.size(); ++i) b.rank(0, spans_[i].start, spans_[i].end(), core_budget_[i]);
        b.run_tasks_device(scores_, n_, eligible_, stream, fn);
        if (check) {
            b.finish(stream, fn);
            detail::require((b.status() & detail::kScoreBad) == 0, fn,
                            "a probability is not finite or is negative (NaN / Inf in the decode step?)");
            detail::require(b.result().indptr.back() == base_len_, fn, "internal: core list of ", b.result().indptr.back(),
                            " rows, expected ", base_len_);
        } else {
            b.compact(stream, fn);
        }
        if (P_.async_refresh) {
            pending_ = next;
            pending_at_ = t + 2;
            has_pending_ = true;
        } else {
            cur_ = next;
        }
    }

private:
    AvlParams P_;
    std::int64_t n_ = 0, kept_len_ = 0, base_len_ = 0;
    std::vector<AvlSpan> spans_;
    std::vector<std::int64_t> core_budget_;
    std::vector<std::uint8_t> non_image_;  // host [n]: kept rows outside every span
    detail::GrowBuffer work_, out_;
    detail::PinnedStaging staging_;
    detail::ListBuilder builders_[2];
    std::int32_t* kept_ = nullptr;
    std::uint8_t* eligible_ = nullptr;
    float* scores_ = nullptr;
    DeviceSelection step_;
    int cur_ = 0, pending_ = 0;
    std::int64_t pending_at_ = 0, last_step_ = -1, step_list_t_ = -1;
    bool has_pending_ = false, ready_ = false, step_list_full_ = false;
};

}  // namespace vlsparse::cuda
