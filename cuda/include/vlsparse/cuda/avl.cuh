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

// One span of a decode refresh, in the index space of the kept list (ascending positions, so a span's
// kept image rows are one run of it): entries [lo, lo + len), of which the k best join the core set,
// written from out + off of the base list (every span contributes exactly k rows, so the base list's
// other rows -- the kept non-image ones -- never move).
struct AvlRefreshSpan {
    std::int32_t lo = 0, len = 0, k = 0, off = 0;
};
inline constexpr int kAvlInlineSpans = 32;  // spans passed in the kernel parameters (more: a device array)

struct AvlRefreshArgs {
    AvlRefreshSpan inline_spans[kAvlInlineSpans];
    const AvlRefreshSpan* spans = nullptr;  // device, when there are more than kAvlInlineSpans
    const float* probs = nullptr;           // [kept_len]: the refresh step's probability of each kept row
    const std::int32_t* kept = nullptr;     // [kept_len]: the kept rows, ascending
    std::int32_t* out = nullptr;            // the base list the span's core rows are written into
    int* status = nullptr;                  // [2]: status[slot] |= kScoreBad; status[1 - slot] cleared
    int slot = 0;
    int cached = 0;                         // probabilities per block kept in shared memory (launch_select_kernel)
};

// The core re-rank of a refresh step, one span per team (grid spans x team size, the team a cluster
// or one block: select.cuh): the span's k best kept rows by probability (descending, ties to the lower
// position) written in ascending order at out + off. A probability that is not finite or is negative
// is flagged in the status word and ranked as 0 (the host reports it when checking).
template <int Unused = 0>
__global__ void __launch_bounds__(kSelectThreads) avl_refresh_kernel(const __grid_constant__ AvlRefreshArgs a) {
    __shared__ RadixShared sh;
    __shared__ int s_bad;
    extern __shared__ __align__(16) unsigned char refresh_dyn[];
    const RadixTeam team = RadixTeam::current();
    const int si = static_cast<int>(blockIdx.x) / team.size;
    const AvlRefreshSpan sp = a.spans ? a.spans[si] : a.inline_spans[si];
    if (threadIdx.x == 0) {
        sh.wh = reinterpret_cast<RadixWarpHist*>(refresh_dyn);
        sh.pass = 0;
        s_bad = 0;
        if (blockIdx.x == 0) a.status[1 - a.slot] = 0;  // the next refresh's word
    }
    __syncthreads();
    const int n = sp.len, lo = team.slice_lo(n), hi = team.slice_hi(n);
    const float* pr = a.probs + sp.lo;
    float* cache = reinterpret_cast<float*>(refresh_dyn + sizeof(RadixWarpHist));
    const bool cached = hi - lo <= a.cached;
    bool bad = false;
    for (int j = lo + static_cast<int>(threadIdx.x); j < hi; j += blockDim.x) {
        const float x = pr[j];
        bad |= !(x >= 0.0f) || !isfinite(x);
        if (cached) cache[j - lo] = x > 0.0f ? x : 0.0f;
    }
    if (bad) s_bad = 1;
    __syncthreads();
    if (s_bad && threadIdx.x == 0) atomicOr(a.status + a.slot, kScoreBad);
    const auto score = [&](int j) {
        if (cached) return cache[j - lo];
        const float x = pr[j];
        return x > 0.0f ? x : 0.0f;  // (NaN and negatives as 0: flagged above)
    };
    const bool all = sp.k >= n;
    unsigned vkey = 0, vmask = 0xffffffffu;
    int need = n, eq_count = 0, eq_before = 0;
    if (!all) block_topk_threshold(sh, team, score, n, sp.k, vkey, vmask, need, eq_count, eq_before);
    const bool ranked = !all && need < eq_count;
    const auto tie = [&](int j) { return (score_key(score(j)) & vmask) == vkey; };
    const auto keep = [&](int j, bool t, int rank) {
        if (all) return true;
        const unsigned key = score_key(score(j)) & vmask;
        return key > vkey || (key == vkey && (!ranked || (t && rank < need)));
    };
    std::int32_t* out = a.out + sp.off;
    const std::int32_t* kp = a.kept + sp.lo;
    team_compact(sh, team, lo, hi, ranked, tie, keep, [&](int at, int j) { out[at] = kp[j]; }, eq_before);
    team.sync();  // no block leaves while another may still read its shared memory
}

template <int Unused = 0>
__global__ void avl_scatter_kernel(const float* col, int rsplit, int Hkv, int m, const std::int32_t* present, float* scores) {
    dependent_entry();  // programmatic dependent launch: see common.cuh
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
        detail::launch_dependent(detail::avl_scatter_kernel<>, blocks, 256, 0, stream, fn, "avl_scatter_kernel", pc.col,
                                 pc.rsplit, static_cast<int>(Hkv), static_cast<int>(m),
                                 present.empty() ? nullptr : present_d, scores_);
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
// never when off. The re-rank is one kernel over the kept list (a span's kept image rows are one run
// of it, and every span contributes a fixed number of rows, so the base list's other rows never move):
// a team of blocks per span ranks the step's probabilities and writes the span's core rows into the
// base list the next steps read. With async_refresh the new set is read from step t + 2, so refresh()
// may run on a second stream beside step t + 1's decode (the engine orders the step t + 2 after it
// with an event). Cost (H100, one span, bf16 H 28 / H_kv 4 / d 128, docs/cuda.md): positions() 3-4
// us; positions() + refresh() unchecked 21.5 us at 16K and 34.8 us at 128K; added to a refresh step in
// the decode stream, a half / a third of a dense decode step; on a second stream beside the next step,
// 1-4 us.
class AvlDecodeSchedule {
public:
    static constexpr int kRefreshSlice = 2048;  // kept rows per block of a span's team

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
        const auto& cl = core.indices[0];
        kept_len_ = static_cast<std::int64_t>(kl.size());
        // Each span's kept image rows are one run of the ascending kept list: entries [lo, lo + len).
        // The span's k = min(budget, len) best join the core set; in the base list (the kept rows
        // outside every span and the core rows, ascending) they start at off = lo minus the rows the
        // earlier spans leave out.
        std::vector<detail::AvlRefreshSpan> ranked;
        std::int64_t left_out = 0, budget = 0, prev_end = 0, longest = 0;
        for (std::size_t i = 0; i < spans_.size(); ++i) {
            const AvlSpan& sp = spans_[i];
            detail::require(sp.start >= prev_end && sp.length >= 0, fn, "image span ", i, " [", sp.start, ", ", sp.end(),
                            ") overlaps or precedes the span before it (expected ascending, disjoint spans)");
            prev_end = sp.end();
            const std::int64_t lo = std::lower_bound(kl.begin(), kl.end(), sp.start) - kl.begin();
            const std::int64_t hi = std::lower_bound(kl.begin(), kl.end(), sp.end()) - kl.begin();
            const std::int64_t len = hi - lo, k = std::clamp<std::int64_t>(core_budget_[i], 0, len);
            budget += k;
            if (k > 0) {
                ranked.push_back({static_cast<std::int32_t>(lo), static_cast<std::int32_t>(len), static_cast<std::int32_t>(k),
                                  static_cast<std::int32_t>(lo - left_out)});
                longest = std::max(longest, len);
            }
            left_out += len - k;
        }
        base_len_ = kept_len_ - left_out;
        detail::require(static_cast<std::int64_t>(cl.size()) == budget, fn, "the selection's core set has ", cl.size(),
                        " rows, its core budgets (each at most its span's kept rows) sum to ", budget);
        // The first base list: the kept rows outside every span and the prefill's core rows, ascending.
        std::vector<std::int32_t> base_list;
        base_list.reserve(static_cast<std::size_t>(base_len_));
        {
            std::size_t c = 0;
            for (auto p : kl) {
                while (c < cl.size() && cl[c] < p) ++c;
                if (!::vlsparse::detail::in_spans(spans_, p) || (c < cl.size() && cl[c] == p))
                    base_list.push_back(static_cast<std::int32_t>(p));
            }
        }
        detail::require(static_cast<std::int64_t>(base_list.size()) == base_len_, fn, "the selection's core set (", cl.size(),
                        " rows) is not a subset of its kept image rows");
        refresh_args_ = detail::AvlRefreshArgs{};
        refresh_spans_ = static_cast<int>(ranked.size());
        if (refresh_spans_ <= detail::kAvlInlineSpans) std::copy(ranked.begin(), ranked.end(), refresh_args_.inline_spans);
        // Device: the kept list, two base lists (alternating between refreshes), the spans, two status words.
        const std::size_t b_kept = detail::align256(static_cast<std::size_t>(std::max<std::int64_t>(kept_len_, 1)) * 4);
        const std::size_t b_base = detail::align256(static_cast<std::size_t>(std::max<std::int64_t>(base_len_, 1)) * 4);
        const std::size_t b_sp = detail::align256(std::max<std::size_t>(ranked.size(), 1) * sizeof(detail::AvlRefreshSpan));
        const std::size_t bytes = b_kept + 2 * b_base + b_sp + 256;
        char* base = static_cast<char*>(work_.get(bytes, fn));
        kept_ = reinterpret_cast<std::int32_t*>(base);
        base_[0] = reinterpret_cast<std::int32_t*>(base + b_kept);
        base_[1] = reinterpret_cast<std::int32_t*>(base + b_kept + b_base);
        auto* spans_d = reinterpret_cast<detail::AvlRefreshSpan*>(base + b_kept + 2 * b_base);
        status_ = reinterpret_cast<int*>(base + b_kept + 2 * b_base + b_sp);
        char* h = staging_.get(bytes, fn);
        std::memset(h, 0, bytes);
        auto* hk = reinterpret_cast<std::int32_t*>(h);
        for (std::int64_t i = 0; i < kept_len_; ++i) hk[i] = static_cast<std::int32_t>(kl[static_cast<std::size_t>(i)]);
        if (!base_list.empty()) {
            std::memcpy(h + b_kept, base_list.data(), base_list.size() * 4);
            std::memcpy(h + b_kept + b_base, base_list.data(), base_list.size() * 4);
        }
        if (!ranked.empty()) std::memcpy(h + b_kept + 2 * b_base, ranked.data(), ranked.size() * sizeof(detail::AvlRefreshSpan));
        detail::check_cuda(cudaMemcpyAsync(base, h, bytes, cudaMemcpyHostToDevice, stream), fn, "cudaMemcpyAsync");
        staging_.mark(stream, fn);
        if (refresh_spans_ > detail::kAvlInlineSpans) refresh_args_.spans = spans_d;
        refresh_args_.kept = kept_;
        refresh_args_.status = status_;
        if (refresh_spans_ > 0) launch_ = detail::plan_select_launch(detail::avl_refresh_kernel<>, longest, fn, kRefreshSlice);
        refreshes_ = 0;
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
        const std::int32_t* src = full ? kept_ : base_[cur_];
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
        // The base list the steps before the new set takes effect do not read (two alternate).
        const int next = cur_ ^ 1;
        if (refresh_spans_ > 0) {
            detail::AvlRefreshArgs a = refresh_args_;
            a.probs = probs;
            a.out = base_[next];
            a.slot = static_cast<int>(refreshes_ & 1);
            detail::launch_select_kernel(detail::avl_refresh_kernel<>, refresh_spans_, launch_, stream, a, fn, "avl_refresh_kernel", false);
            ++refreshes_;
            if (check) {
                int st = 0;
                detail::check_cuda(cudaMemcpyAsync(&st, status_ + a.slot, sizeof(int), cudaMemcpyDeviceToHost, stream), fn,
                                   "cudaMemcpyAsync");
                detail::check_cuda(cudaStreamSynchronize(stream), fn, "cudaStreamSynchronize");
                detail::require((st & detail::kScoreBad) == 0, fn,
                                "a probability is not finite or is negative (NaN / Inf in the decode step?)");
            }
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
    detail::GrowBuffer work_, out_;
    detail::PinnedStaging staging_;
    detail::SelectLaunch launch_;
    detail::AvlRefreshArgs refresh_args_;  // the spans and the kept list; probs / out / slot per refresh
    int refresh_spans_ = 0;                // spans with rows to rank
    std::int64_t refreshes_ = 0;
    std::int32_t* kept_ = nullptr;         // device [kept_len]
    std::int32_t* base_[2] = {nullptr, nullptr};  // device [base_len] each: the core set in use and the next
    int* status_ = nullptr;                // device [2]: the refreshes' check words, alternating
    DeviceSelection step_;
    int cur_ = 0, pending_ = 0;
    std::int64_t pending_at_ = 0, last_step_ = -1, step_list_t_ = -1;
    bool has_pending_ = false, ready_ = false, step_list_full_ = false;
};

}  // namespace vlsparse::cuda
