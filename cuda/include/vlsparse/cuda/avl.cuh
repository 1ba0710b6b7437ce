// vlsparse/cuda/avl.cuh -- A-VL's prefill-time selection on the GPU (namespace vlsparse::cuda): the last
// prompt token's head-mean attention, the kept and core image sets of every span, and the prefill
// filter (P%), as device lists.
//
// Same Params (AvlParams), same rules and tie order as avl_select / avl_prefill_filter
// (vlsparse/policies/avl_params.hpp), ranked on the device:
//
//   cuda::AvlSelector sel;                                             // owns its device workspace
//   const cuda::DeviceAvlSelection& s = sel.select(q, k, layout, params, present, stream);
//   s.kept   (DeviceSelection: kept image tokens of every span + every present non-image token, one list;
//             with the text budget, one list per KV head with that head's text tokens)
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
// The text budget (text_rate > 0: H2O for text, avl_text_h2o) is ranked on the device as well: H2O's
// accumulated attention of every present row (the probe column sums of all rows, per KV head or per
// query head; as costly as H2O's own scoring, unless the rows' log-sum-exp from the layer's prefill is
// given -- select(q, k, row_lse, ...): then only the key blocks of older text tokens are scored), and one
// kept list per KV head, which the decode schedule
// takes as it is (a step's lists one per KV head; the re-rank sums each kept image row's probability
// over the lists).
// Include: this header, from a .cu translation unit (nvcc, C++20).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
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
    DeviceSelection kept;                   // one shared list, or one per KV head with the text budget;
                                            // kept.scores = the score of every position
    DeviceSelection core;                   // one list: the core image positions of every span
    // With the text budget (text_rate > 0): H2O's accumulated attention over the prefill, device
    // [text_groups][n] (row stride n; text_groups = H_kv per_kv_head, H per_query_head; 0 where absent),
    // the scores the text tokens were ranked by. Null otherwise.
    const float* text_scores = nullptr;
    std::int64_t text_groups = 0;
};

namespace detail {

// A step's lists, grid (blocks, G): list g = src[off[g] .. off[g + 1]) followed by the decode tokens
// first .. last - 1, written from out + off[g] + g (last - first); indptr [G + 1].
template <int Unused = 0>
__global__ void avl_step_list_kernel(const std::int32_t* src, const std::int32_t* off, int first, int last,
                                     std::int32_t* out, std::int32_t* indptr) {
    const int g = static_cast<int>(blockIdx.y), ntok = last - first;
    const int s0 = off[g], len = off[g + 1] - s0, o0 = s0 + g * ntok, total = len + ntok;
    for (int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); i < total; i += static_cast<int>(gridDim.x * blockDim.x))
        out[o0 + i] = i < len ? src[s0 + i] : first + (i - len);
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        indptr[g + 1] = o0 + total;
        if (g == 0) indptr[0] = 0;
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

inline constexpr int kAvlMaxLists = 64;    // kept lists (KV heads, with the text budget) of a schedule

struct AvlRefreshArgs {
    AvlRefreshSpan inline_spans[kAvlInlineSpans];
    const AvlRefreshSpan* spans = nullptr;  // device, when there are more than kAvlInlineSpans
    const float* probs = nullptr;           // the refresh step's probability of each entry of its lists
    const std::int32_t* kept = nullptr;     // the kept rows of list 0, ascending (lo and off index list 0)
    std::int32_t* out = nullptr;            // the base lists the span's core rows are written into
    int* status = nullptr;                  // [2]: status[slot] |= kScoreBad; status[1 - slot] cleared
    int slot = 0;
    int cached = 0;                         // probabilities per block kept in shared memory (launch_select_kernel)
    // Several lists (A-VL's text budget: one per KV head; G = 1 otherwise): list g's kept rows start at
    // kept_off[g] (its entries on the refresh step at kept_off[g] + g ntok: the decode tokens of the
    // lists before it), its base list at base_off[g]; a span's run in list g is shifted by
    // shift[span][g] from list 0's (the text rows before it differ), at the same place of both.
    int G = 1, ntok = 0;
    const std::int32_t* kept_off = nullptr;  // device [G]
    const std::int32_t* base_off = nullptr;  // device [G]
    const std::int32_t* shift = nullptr;     // device [spans][G]
};

// The core re-rank of a refresh step, one span per team (grid spans x team size, the team a cluster
// or one block: select.cuh): the span's k best kept rows by probability (descending, ties to the lower
// position) written in ascending order at out + off. A probability that is not finite or is negative
// is flagged in the status word and ranked as 0 (the host reports it when checking).
template <int Unused = 0>
__global__ void __launch_bounds__(kSelectThreads) avl_refresh_kernel(const __grid_constant__ AvlRefreshArgs a) {
    __shared__ RadixShared sh;
    __shared__ int s_bad;
    __shared__ int s_pofs[kAvlMaxLists], s_oofs[kAvlMaxLists];  // list g's run: probs / base-list offsets
    extern __shared__ __align__(16) unsigned char refresh_dyn[];
    const RadixTeam team = RadixTeam::current();
    const int si = static_cast<int>(blockIdx.x) / team.size;
    const AvlRefreshSpan sp = a.spans ? a.spans[si] : a.inline_spans[si];
    const int G = a.G;
    if (threadIdx.x == 0) {
        sh.wh = reinterpret_cast<RadixWarpHist*>(refresh_dyn);
        sh.pass = 0;
        s_bad = 0;
        if (blockIdx.x == 0) a.status[1 - a.slot] = 0;  // the next refresh's word
    }
    if (G > 1)
        for (int g = static_cast<int>(threadIdx.x); g < G; g += static_cast<int>(blockDim.x)) {
            const int d = a.shift[si * G + g];
            s_pofs[g] = a.kept_off[g] + g * a.ntok + sp.lo + d;
            s_oofs[g] = a.base_off[g] + sp.off + d;
        }
    __syncthreads();
    const int n = sp.len, lo = team.slice_lo(n), hi = team.slice_hi(n);
    const float* pr = a.probs + sp.lo;
    float* cache = reinterpret_cast<float*>(refresh_dyn + sizeof(RadixWarpHist));
    const bool cached = hi - lo <= a.cached;
    // Entry j's probability: the sum over the lists (in list order) of its probability in each, flagged
    // when any is not finite or is negative.
    const auto prob = [&](int j, bool& bad_j) {
        if (G == 1) {
            const float x = pr[j];
            bad_j = !(x >= 0.0f) || !isfinite(x);
            return x;
        }
        float x = 0.0f;
        bad_j = false;
        for (int g = 0; g < G; ++g) {
            const float y = a.probs[s_pofs[g] + j];
            bad_j |= !(y >= 0.0f) || !isfinite(y);
            x += y;
        }
        return x;
    };
    bool bad = false;
    for (int j = lo + static_cast<int>(threadIdx.x); j < hi; j += blockDim.x) {
        bool b = false;
        const float x = prob(j, b);
        bad |= b;
        if (cached) cache[j - lo] = !b && x > 0.0f ? x : 0.0f;
    }
    if (bad) s_bad = 1;
    __syncthreads();
    if (s_bad && threadIdx.x == 0) atomicOr(a.status + a.slot, kScoreBad);
    const auto score = [&](int j) {
        if (cached) return cache[j - lo];
        bool b = false;
        const float x = prob(j, b);
        return !b && x > 0.0f ? x : 0.0f;  // (NaN and negatives as 0: flagged above)
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
    team_compact(sh, team, lo, hi, ranked, tie, keep, [&](int at, int j) {
        const std::int32_t p = kp[j];
        if (G == 1) {
            out[at] = p;
        } else {
            for (int g = 0; g < G; ++g) a.out[s_oofs[g] + at] = p;
        }
    }, eq_before);
    team.sync();  // no block leaves while another may still read its shared memory
}

// Probe column sums scattered by position: out[(row0 + r) * n + present[i]] = the sum over the row
// splits z of col[z][r][i] (r < rows: the KV heads of a run, or the one query head of a per-head run:
// the text budget's H2O scores); with sum_rows, row0 alone = the sum over z and then r (the last row's
// score of every position, summed over the KV heads). present null: row i is position i; positions
// not present are left as they are (the caller zeroes them).
template <int Unused = 0>
__global__ void avl_scatter_kernel(const float* col, int rsplit, int rows, int m, const std::int32_t* present, int n,
                                   float* out, int row0, int sum_rows) {
    dependent_entry();  // programmatic dependent launch: see common.cuh
    const std::int64_t total = static_cast<std::int64_t>(sum_rows ? 1 : rows) * m;
    for (std::int64_t x = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; x < total;
         x += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
        const int r = static_cast<int>(x / m), i = static_cast<int>(x % m);
        float a = 0.0f;
        for (int z = 0; z < rsplit; ++z)
            if (sum_rows) {
                for (int h = 0; h < rows; ++h) a += col[(static_cast<std::int64_t>(z) * rows + h) * m + i];
            } else {
                a += col[(static_cast<std::int64_t>(z) * rows + r) * m + i];
            }
        out[static_cast<std::int64_t>(row0 + r) * n + (present ? present[i] : i)] = a;
    }
}

// *dst |= *src (a scoring run's status word into the selection's).
template <int Unused = 0>
__global__ void avl_or_status_kernel(const int* src, int* dst) {
    dependent_entry();  // programmatic dependent launch: see common.cuh
    if (threadIdx.x == 0 && *src) atomicOr(dst, *src);
}

}  // namespace detail

class AvlSelector {
public:
    AvlSelector() = default;
    AvlSelector(const AvlSelector&) = delete;
    AvlSelector& operator=(const AvlSelector&) = delete;

    // Kept and core sets of one layer: avl_select, with the text lists of avl_text_h2o when the text budget
    // is on (text_rate > 0: H2O's accumulated attention over every present row, per KV head or per query
    // head, ranked on the device; the kept lists are then one per KV head).
    template <ElementType TQ, ElementType TK>
    const DeviceAvlSelection& select(View3<const TQ> q, View3<const TK> k, const Layout& layout, const AvlParams& P,
                                     std::span<const std::int64_t> present = {}, cudaStream_t stream = 0,
                                     const AttentionOptions& opt = {}) {
        return select_impl(q, k, detail::ProbeRowLse{}, layout, P, present, stream, opt, "cuda::avl_select");
    }

    // The same, with each row's log-sum-exp of the layer's dense causal attention given: row_lse [m, H]
    // (fp32, device; natural log of sum_{j <= i} exp(scale q_{i,h} . k_{j,g}), over the present rows as q
    // holds them) -- what cuda::dense_prefill_attention writes with its lse argument, or FlashAttention's
    // softmax_lse. The text budget's H2O scores then need no pass over every key to normalize the rows:
    // only the 128-key blocks that hold an older text token are scored (text_scores is 0 in the other
    // blocks), a few percent of the prefill's work for a prompt mostly of image tokens, instead of as much
    // as the prefill. The last row's statistics also spare A-VL's own score its pass over every key. q and
    // K are then not checked for NaN / Inf as such: non-finite inputs give non-finite scores, an error
    // where they reach a ranked position (elsewhere the prefill's check_finite is what sees them).
    template <ElementType TQ, ElementType TK>
    const DeviceAvlSelection& select(View3<const TQ> q, View3<const TK> k, View2<const float> row_lse, const Layout& layout,
                                     const AvlParams& P, std::span<const std::int64_t> present = {},
                                     cudaStream_t stream = 0, const AttentionOptions& opt = {}) {
        constexpr const char* fn = "cuda::avl_select";
        return select_impl(q, k, detail::checked_row_lse(row_lse, q.shape[0], q.shape[1], fn), layout, P, present, stream, opt, fn);
    }

private:
    template <ElementType TQ, ElementType TK>
    const DeviceAvlSelection& select_impl(View3<const TQ> q, View3<const TK> k, detail::ProbeRowLse row_lse,
                                          const Layout& layout, const AvlParams& P, std::span<const std::int64_t> present,
                                          cudaStream_t stream, const AttentionOptions& opt, const char* fn) {
        P.validate(fn);
        const std::vector<std::int64_t> pr = prepare(q, k, layout, present, opt, stream, fn, row_lse);
        DeviceAvlSelection& r = res_;
        r = DeviceAvlSelection{};
        r.n = layout.n();
        r.spans = avl_spans(layout, P.spans);
        const bool text = P.text_rate > 0.0;
        const std::int64_t H = q.shape[1], Hkv = k.shape[1];
        // Kept: every present non-image position (or, with the text budget, the text tokens of each KV
        // head's H2O set), plus each span's top floor((1 - rate) len) present ones.
        std::vector<std::uint8_t> other(static_cast<std::size_t>(r.n), 0), older;
        std::int64_t heavy = 0;
        if (!text) {
            for (auto p : pr)
                if (!::vlsparse::detail::in_spans(r.spans, p)) other[static_cast<std::size_t>(p)] = 1;
        } else {
            // avl_text_h2o's budget: B of the seen text tokens, the last B - heavy always (forced here), the
            // heavy best of the older ones by each group's score (a ranking task per group below).
            std::vector<std::int64_t> tx;
            for (auto p : pr)
                if (!::vlsparse::detail::in_spans(r.spans, p)) tx.push_back(p);
            const auto seen = static_cast<std::int64_t>(tx.size());
            const AvlTextBudget tb = avl_text_budget(seen, P);
            heavy = tb.heavy;
            const std::int64_t recent = tb.recent;
            older.assign(static_cast<std::size_t>(r.n), 0);
            for (std::int64_t i = 0; i < seen; ++i)
                (i < seen - recent ? older : other)[static_cast<std::size_t>(tx[static_cast<std::size_t>(i)])] = 1;
            // With the rows' statistics given: the 128-key blocks (in q / k's row space) that hold an older
            // text token, the only columns ranked.
            std::vector<std::int32_t> blocks;
            if (row_lse.lse) {
                for (std::int64_t i = 0; i < seen - recent; ++i) {
                    const std::int64_t p = tx[static_cast<std::size_t>(i)];
                    const std::int64_t row = present.empty() ? p : std::lower_bound(pr.begin(), pr.end(), p) - pr.begin();
                    const auto b = static_cast<std::int32_t>(row / detail::kProbeColTile);
                    if (blocks.empty() || blocks.back() != b) blocks.push_back(b);
                }
            }
            text_scores(q, k, row_lse, blocks, P.text_groups, opt, stream, fn);
        }
        kept_.begin(text ? Hkv : 1, r.n, 0, 0, other, stream, fn);
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
        if (text) {
            // The image positions (ranked into group 0) copied to every KV head's list; each text group's
            // heavy hitters among the older text tokens ranked by its H2O scores and added to its KV head's
            // list (per query head: the union over the head's group).
            const std::int64_t T = P.text_groups == AvlTextGroups::per_query_head ? H : Hkv;
            text_.begin(T, r.n, 0, 0, {}, stream, fn);
            for (std::int64_t a = 0; a < T; ++a) text_.rank(a, 0, r.n, heavy);
            text_.run_tasks(text_scores_, r.n, older, stream, fn);
            kept_.absorb(true, &text_, T / Hkv, stream, fn);
            r.text_scores = text_scores_;
            r.text_groups = T;
        }
        kept_.compact(stream, fn);
        core_.compact(stream, fn);
        kept_.enqueue_read(stream, fn, status_);
        core_.enqueue_read(stream, fn, status_);
        detail::check_cuda(cudaStreamSynchronize(stream), fn, "cudaStreamSynchronize");
        r.kept = collect(kept_, fn, text);
        r.core = collect(core_, fn, text);
        return r;
    }

public:
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
        text_probe_.fill(byte, fn);
        work_.fill(byte, fn);
        text_work_.fill(byte, fn);
        kept_.fill(byte, fn);
        core_.fill(byte, fn);
        text_.fill(byte, fn);
    }

private:
    // Checks, the present rows on the device, and the scores of every position into scores_ ([n], 0 where
    // absent). Returns the present positions (every position when `present` is empty).
    template <ElementType TQ, ElementType TK>
    std::vector<std::int64_t> prepare(View3<const TQ> q, View3<const TK> k, const Layout& layout,
                                      std::span<const std::int64_t> present, const AttentionOptions& opt,
                                      cudaStream_t stream, const char* fn, detail::ProbeRowLse row_lse = {}) {
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
        // (With the rows' statistics given, the last row's too: its probe pass over every key for them goes.)
        const detail::ProbeColumnsResult pc = probe_.run(q, k, std::span<const std::int64_t>(last), scale, stream, fn, row_lse);
        const std::size_t b_sc = detail::align256(static_cast<std::size_t>(n) * 4);
        const std::size_t b_pr = detail::align256(static_cast<std::size_t>(m) * 4);
        char* base = static_cast<char*>(work_.get(b_sc + b_pr, fn));
        scores_ = reinterpret_cast<float*>(base);
        auto* present_d = reinterpret_cast<std::int32_t*>(base + b_sc);
        present_d_ = present.empty() ? nullptr : present_d;
        n_ = n;
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
                                 static_cast<const std::int32_t*>(present.empty() ? nullptr : present_d), static_cast<int>(n),
                                 scores_, 0, 1);
        status_ = pc.status;
        H_ = H;
        return pr;
    }

    // H2O's accumulated attention of every present row (the text budget) into text_scores_ [T][n]: the
    // probe column sums of all m rows, per KV head (one run), or per query head (one run per head over
    // that head's q and its KV head's k). Each run's status word joins status_ (the last row's).
    // With row_lse (the rows' statistics given): pass 2 only, over the key blocks `blocks` (row space).
    template <ElementType TQ, ElementType TK>
    void text_scores(View3<const TQ> q, View3<const TK> k, detail::ProbeRowLse row_lse, std::span<const std::int32_t> blocks,
                     AvlTextGroups groups, const AttentionOptions& opt, cudaStream_t stream, const char* fn) {
        const std::int64_t m = q.shape[0], H = q.shape[1], d = q.shape[2], Hkv = k.shape[1], n = n_;
        const bool per_head = groups == AvlTextGroups::per_query_head;
        const std::int64_t T = per_head ? H : Hkv;
        text_scores_ = static_cast<float*>(text_work_.get(detail::align256(static_cast<std::size_t>(T * n) * 4), fn));
        if (present_d_)
            detail::check_cuda(cudaMemsetAsync(text_scores_, 0, static_cast<std::size_t>(T * n) * 4, stream), fn, "cudaMemsetAsync");
        const double scale = ::vlsparse::detail::resolve_scale(opt, d, fn);
        std::vector<std::int64_t> rows(static_cast<std::size_t>(m));
        for (std::int64_t i = 0; i < m; ++i) rows[static_cast<std::size_t>(i)] = i;
        auto one_run = [&](const detail::ProbeColumnsResult& pc, int run_rows, int row0) {
            const unsigned blocks = static_cast<unsigned>(std::clamp<std::int64_t>((run_rows * m + 255) / 256, 1, 4096));
            detail::launch_dependent(detail::avl_scatter_kernel<>, blocks, 256, 0, stream, fn, "avl_scatter_kernel", pc.col,
                                     pc.rsplit, run_rows, static_cast<int>(m), present_d_, static_cast<int>(n), text_scores_,
                                     row0, 0);
            detail::launch_dependent(detail::avl_or_status_kernel<>, 1, 32, 0, stream, fn, "avl_or_status_kernel",
                                     static_cast<const int*>(pc.status), status_);
        };
        if (row_lse.lse && blocks.empty()) {  // no older text token: nothing is ranked, every score 0
            detail::check_cuda(cudaMemsetAsync(text_scores_, 0, static_cast<std::size_t>(T * n) * 4, stream), fn, "cudaMemsetAsync");
            return;
        }
        if (!per_head) {
            one_run(text_probe_.run(q, k, std::span<const std::int64_t>(rows), scale, stream, fn, row_lse, blocks),
                    static_cast<int>(Hkv), 0);
            return;
        }
        const std::int64_t qpk = H / Hkv;
        for (std::int64_t h = 0; h < H; ++h) {
            const View3<const TQ> qh(q.row(0, h), {m, 1, d}, q.stride);
            const View3<const TK> kh(k.row(0, h / qpk), {m, 1, d}, k.stride);
            one_run(text_probe_.run(qh, kh, std::span<const std::int64_t>(rows), scale, stream, fn, row_lse.head(h), blocks), 1,
                    static_cast<int>(h));
        }
    }

    DeviceSelection finish(detail::ListBuilder& b, cudaStream_t stream, const char* fn) {
        b.finish(stream, fn, status_);
        return checked(b, fn);
    }
    DeviceSelection collect(detail::ListBuilder& b, const char* fn, bool every_row = false) {
        b.collect();
        return checked(b, fn, every_row);
    }
    DeviceSelection checked(detail::ListBuilder& b, const char* fn, bool every_row = false) {
        detail::require((b.extra_status() & detail::kInputNonFinite) == 0, fn,
                        every_row ? "q or k holds NaN or Inf (the text budget scores every row of q)"
                                  : "q or k holds NaN or Inf (in k, or in the last row of q)");
        detail::require((b.extra_status() & detail::kRowLseBad) == 0, fn, "row_lse holds NaN or Inf (in a row the text budget scores)");
        detail::require((b.status() & detail::kScoreBad) == 0, fn,
                        "a score is not finite: an fp32 overflow of a logit (inputs too large for the scale)");
        DeviceSelection r = b.result();
        r.scores = scores_;
        r.score_groups = 1;
        r.score_len = r.n;
        r.score_divisor = static_cast<double>(H_);
        return r;
    }

    detail::ProbeColumns probe_, text_probe_;
    detail::GrowBuffer work_, text_work_;
    detail::PinnedStaging staging_;
    detail::ListBuilder kept_, core_, text_;
    float* scores_ = nullptr;
    float* text_scores_ = nullptr;
    const std::int32_t* present_d_ = nullptr;  // the present positions on the device (null: every position)
    int* status_ = nullptr;
    std::int64_t H_ = 1, n_ = 0;
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
// base list the next steps read. With A-VL's text budget the selection has one kept list per KV head
// (the same image rows, each head's own text rows): the step's lists are one per KV head, the base
// lists too, and a span's run sits at a shift of list 0's in each (worked out at reset()); the re-rank
// sums a row's probabilities over the lists and writes the core rows into every base list. With async_refresh the new set is read from step t + 2, so refresh()
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
        const std::int64_t G = sel.kept.lists();
        detail::require(sel.n >= 1 && G >= 1 && G <= detail::kAvlMaxLists && sel.core.lists() == 1, fn,
                        "expected a selection of AvlSelector::select (one kept list, or one per KV head up to ",
                        detail::kAvlMaxLists, "; one core list; n >= 1); got ", G, " kept lists, ", sel.core.lists(),
                        " core lists, n = ", sel.n);
        P_ = P;
        n_ = sel.n;
        G_ = G;
        spans_ = sel.spans;
        core_budget_ = sel.core_budget;
        const TokenSelection kept = sel.kept.to_host(), core = sel.core.to_host();
        const auto& cl = core.indices[0];
        // Each span's kept image rows are one run of each ascending kept list: entries [lo_g, lo_g + len)
        // of list g, the same rows in every list (the text rows around them may differ: the text budget).
        // The span's k = min(budget, len) best join the core set; in list g's base list (its kept rows
        // outside every span and the core rows, ascending) they start at lo_g minus the rows the earlier
        // spans leave out -- the same count for every list, so the shift lo_g - lo_0 carries over.
        std::vector<detail::AvlRefreshSpan> ranked;
        std::vector<std::int32_t> shift;  // [ranked][G]
        std::int64_t left_out = 0, budget = 0, prev_end = 0, longest = 0;
        for (std::size_t i = 0; i < spans_.size(); ++i) {
            const AvlSpan& sp = spans_[i];
            detail::require(sp.start >= prev_end && sp.length >= 0, fn, "image span ", i, " [", sp.start, ", ", sp.end(),
                            ") overlaps or precedes the span before it (expected ascending, disjoint spans)");
            prev_end = sp.end();
            std::int64_t lo0 = 0, len = 0;
            std::vector<std::int32_t> sh(static_cast<std::size_t>(G));
            for (std::int64_t g = 0; g < G; ++g) {
                const auto& kl = kept.indices[static_cast<std::size_t>(g)];
                const auto b = std::lower_bound(kl.begin(), kl.end(), sp.start), e = std::lower_bound(kl.begin(), kl.end(), sp.end());
                const std::int64_t lo = b - kl.begin();
                if (g == 0) {
                    lo0 = lo;
                    len = e - b;
                }
                detail::require(e - b == len && std::equal(b, e, kept.indices[0].begin() + lo0), fn, "kept list ", g,
                                " holds other image rows of span ", i, " than list 0 (expected the same image rows in every list)");
                sh[static_cast<std::size_t>(g)] = static_cast<std::int32_t>(lo - lo0);
            }
            const std::int64_t k = std::clamp<std::int64_t>(core_budget_[i], 0, len);
            budget += k;
            if (k > 0) {
                ranked.push_back({static_cast<std::int32_t>(lo0), static_cast<std::int32_t>(len), static_cast<std::int32_t>(k),
                                  static_cast<std::int32_t>(lo0 - left_out)});
                shift.insert(shift.end(), sh.begin(), sh.end());
                longest = std::max(longest, len);
            }
            left_out += len - k;
        }
        detail::require(static_cast<std::int64_t>(cl.size()) == budget, fn, "the selection's core set has ", cl.size(),
                        " rows, its core budgets (each at most its span's kept rows) sum to ", budget);
        // The first base lists: each list's kept rows outside every span and the prefill's core rows,
        // ascending; lists concatenated (kept_off_ / base_off_: where list g starts).
        std::vector<std::int32_t> kept_all, base_all;
        kept_off_.assign(1, 0);
        base_off_.assign(1, 0);
        for (std::int64_t g = 0; g < G; ++g) {
            const auto& kl = kept.indices[static_cast<std::size_t>(g)];
            std::size_t c = 0;
            for (auto p : kl) {
                kept_all.push_back(static_cast<std::int32_t>(p));
                while (c < cl.size() && cl[c] < p) ++c;
                if (!::vlsparse::detail::in_spans(spans_, p) || (c < cl.size() && cl[c] == p))
                    base_all.push_back(static_cast<std::int32_t>(p));
            }
            kept_off_.push_back(static_cast<std::int32_t>(kept_all.size()));
            base_off_.push_back(static_cast<std::int32_t>(base_all.size()));
            detail::require(base_off_[static_cast<std::size_t>(g) + 1] - base_off_[static_cast<std::size_t>(g)] ==
                                static_cast<std::int64_t>(kl.size()) - left_out,
                            fn, "the selection's core set (", cl.size(), " rows) is not a subset of its kept image rows");
        }
        kept_len_ = static_cast<std::int64_t>(kept_all.size());
        base_len_ = static_cast<std::int64_t>(base_all.size());
        refresh_args_ = detail::AvlRefreshArgs{};
        refresh_spans_ = static_cast<int>(ranked.size());
        if (refresh_spans_ <= detail::kAvlInlineSpans) std::copy(ranked.begin(), ranked.end(), refresh_args_.inline_spans);
        // Device: the kept lists, two base lists each (alternating between refreshes), the spans, the
        // lists' offsets (kept, then base: G + 1 each) and the spans' shifts, two status words.
        const std::size_t b_kept = detail::align256(static_cast<std::size_t>(std::max<std::int64_t>(kept_len_, 1)) * 4);
        const std::size_t b_base = detail::align256(static_cast<std::size_t>(std::max<std::int64_t>(base_len_, 1)) * 4);
        const std::size_t b_sp = detail::align256(std::max<std::size_t>(ranked.size(), 1) * sizeof(detail::AvlRefreshSpan));
        const std::size_t b_off = detail::align256(static_cast<std::size_t>(2 * (G + 1)) * 4);
        const std::size_t b_shift = detail::align256(std::max<std::size_t>(shift.size(), 1) * 4);
        const std::size_t bytes = b_kept + 2 * b_base + b_sp + b_off + b_shift + 256;
        char* base = static_cast<char*>(work_.get(bytes, fn));
        kept_ = reinterpret_cast<std::int32_t*>(base);
        base_[0] = reinterpret_cast<std::int32_t*>(base + b_kept);
        base_[1] = reinterpret_cast<std::int32_t*>(base + b_kept + b_base);
        char* at = base + b_kept + 2 * b_base;
        auto* spans_d = reinterpret_cast<detail::AvlRefreshSpan*>(at);
        auto* off_d = reinterpret_cast<std::int32_t*>(at + b_sp);
        auto* shift_d = reinterpret_cast<std::int32_t*>(at + b_sp + b_off);
        status_ = reinterpret_cast<int*>(at + b_sp + b_off + b_shift);
        kept_off_d_ = off_d;
        base_off_d_ = off_d + (G + 1);
        char* h = staging_.get(bytes, fn);
        std::memset(h, 0, bytes);
        if (!kept_all.empty()) std::memcpy(h, kept_all.data(), kept_all.size() * 4);
        if (!base_all.empty()) {
            std::memcpy(h + b_kept, base_all.data(), base_all.size() * 4);
            std::memcpy(h + b_kept + b_base, base_all.data(), base_all.size() * 4);
        }
        char* hat = h + b_kept + 2 * b_base;
        if (!ranked.empty()) std::memcpy(hat, ranked.data(), ranked.size() * sizeof(detail::AvlRefreshSpan));
        std::memcpy(hat + b_sp, kept_off_.data(), kept_off_.size() * 4);
        std::memcpy(hat + b_sp + (G + 1) * 4, base_off_.data(), base_off_.size() * 4);
        if (!shift.empty()) std::memcpy(hat + b_sp + b_off, shift.data(), shift.size() * 4);
        detail::check_cuda(cudaMemcpyAsync(base, h, bytes, cudaMemcpyHostToDevice, stream), fn, "cudaMemcpyAsync");
        staging_.mark(stream, fn);
        if (refresh_spans_ > detail::kAvlInlineSpans) refresh_args_.spans = spans_d;
        refresh_args_.kept = kept_;
        refresh_args_.status = status_;
        refresh_args_.G = static_cast<int>(G);
        refresh_args_.kept_off = kept_off_d_;
        refresh_args_.base_off = base_off_d_;
        refresh_args_.shift = G > 1 ? shift_d : nullptr;
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
    // Rows of the lists positions(t) returns on a refresh step and on other steps (prompt rows only,
    // summed over the lists).
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
    // one list shared by every KV head -- or one per KV head for a selection with the text budget (rows()
    // is what batched_decode_attention takes either way). Valid until the next positions() call. No
    // synchronization.
    const DeviceSelection& positions(std::int64_t t, std::int64_t seq_len, cudaStream_t stream = 0) {
        constexpr const char* fn = "cuda::AvlDecodeSchedule::positions";
        detail::require(ready_, fn, "reset() the schedule from a prefill selection first");
        detail::require(t == last_step_, fn, "step ", t, " is not the current step ", last_step_, " (begin_step first)");
        detail::require(seq_len > n_ && seq_len <= std::numeric_limits<std::int32_t>::max(), fn, "seq_len = ", seq_len,
                        ", expected > the prompt length ", n_, " (append the decode token first)");
        const bool full = is_refresh(t);
        const std::int32_t* src = full ? kept_ : base_[cur_];
        const std::vector<std::int32_t>& off = full ? kept_off_ : base_off_;
        const std::int64_t ntok = seq_len - n_, total = off.back() + G_ * ntok;
        detail::require(total <= std::numeric_limits<std::int32_t>::max(), fn, "the step's lists hold ", total,
                        " entries, expected < 2^31");
        const std::size_t b_out = detail::align256(static_cast<std::size_t>(total) * 4);
        char* base = static_cast<char*>(out_.get(b_out + detail::align256(static_cast<std::size_t>(G_ + 1) * 4), fn));
        auto* out = reinterpret_cast<std::int32_t*>(base);
        auto* indptr = reinterpret_cast<std::int32_t*>(base + b_out);
        std::int64_t longest = 0;
        for (std::int64_t g = 0; g < G_; ++g)
            longest = std::max<std::int64_t>(longest, off[static_cast<std::size_t>(g) + 1] - off[static_cast<std::size_t>(g)] + ntok);
        const dim3 grid(static_cast<unsigned>(std::clamp<std::int64_t>((longest + 255) / 256, 1, 1024)), static_cast<unsigned>(G_));
        detail::avl_step_list_kernel<><<<grid, 256, 0, stream>>>(src, full ? kept_off_d_ : base_off_d_, static_cast<int>(n_),
                                                                 static_cast<int>(seq_len), out, indptr);
        detail::check_launch(fn, "avl_step_list_kernel");
        step_ = DeviceSelection{};
        step_.n = seq_len;
        step_.indptr.resize(static_cast<std::size_t>(G_ + 1));
        for (std::int64_t g = 0; g <= G_; ++g)
            step_.indptr[static_cast<std::size_t>(g)] = static_cast<std::int32_t>(off[static_cast<std::size_t>(g)] + g * ntok);
        step_.indices = out;
        step_.indptr_dev = indptr;
        step_list_full_ = full;
        step_list_t_ = t;
        step_ntok_ = ntok;
        return step_;
    }

    // Re-ranks the core set after refresh step t from `probs` (device, one per entry of positions(t): the
    // attention of the step, as batched_decode_attention writes it for those lists -- the head mean for
    // one shared list; per KV head lists, each row's probabilities over the lists are summed in list
    // order before ranking, the CPU schedule's sum over the heads up to a constant factor). The new
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
            a.ntok = static_cast<int>(step_ntok_);
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
    std::int64_t G_ = 1, step_ntok_ = 0;
    std::vector<std::int32_t> kept_off_, base_off_;  // [G + 1]: where each list starts in kept_ / base_
    const std::int32_t* kept_off_d_ = nullptr;      // device copies
    const std::int32_t* base_off_d_ = nullptr;
    std::int32_t* kept_ = nullptr;         // device [kept_len]: the kept lists
    std::int32_t* base_[2] = {nullptr, nullptr};  // device [base_len] each: the core set in use and the next
    int* status_ = nullptr;                // device [2]: the refreshes' check words, alternating
    DeviceSelection step_;
    int cur_ = 0, pending_ = 0;
    std::int64_t pending_at_ = 0, last_step_ = -1, step_list_t_ = -1;
    bool has_pending_ = false, ready_ = false, step_list_full_ = false;
};

}  // namespace vlsparse::cuda
