// vlsparse/cuda/h2o_decode.cuh -- H2O's decode-time work on the device (namespace vlsparse::cuda): each
// step's attention added to the accumulated scores a_j and every group's cached positions cut back to
// heavy + recent, the CPU path's rule (H2OPolicy's decode step, h2o_keep: the last `recent` positions
// plus the `heavy` best of the older ones by a_j, equal scores broken by the lower position), with no
// synchronization.
//
//   cuda::H2ODecode h2o;
//   h2o.reset(kept, P, H, stream);            // after the prefill: h2o_device_select's lists and scores
//   per decode step t (the new token at position n + t):
//     const DeviceSelection& rows = h2o.rows();  // the cached positions, the new token's included
//     plan.plan({lens, {}, rows.indptr, rows.lists()}, H, H_kv, d, true, stream, dtype);
//     batched_decode_attention(plan, q, cache, rows.rows(), out, opt, stream, probs);
//     h2o.observe(probs, stream);              // a_j += the step's attention; evict; append n + t + 1
//   or, one kernel fewer per step, with the probabilities computed inside the update from the scores the
//   decode leaves in its plan:
//     opt.defer_probs = true;
//     batched_decode_attention(plan, q, cache, rows.rows(), out, opt, stream);
//     h2o.observe(plan, stream);
//
// The lists name positions of the sequence: the logical rows of a cache indexed by position (a paged
// cache through its block table, or a contiguous one that is not compacted), which is what decode reads
// through row lists; an engine that compacts its cache maps them (cuda/kv_cache.cuh). G groups: one
// list per KV head (grouping kv_head) or one for the layer, shared by the KV heads (grouping layer).
// Every group holds the same number of positions (prefill: min(n, heavy + recent); each step one more,
// then one fewer when over heavy + recent), so the host knows every list's length without reading the
// device: the plan of the next step needs no synchronization. `probs` is what batched_decode_attention
// writes for these lists (each listed row's probability averaged over the query heads that read the
// list): observe() multiplies it by the heads per list (H / G) to add what the CPU path adds, the sum
// over the group's heads. a_j is kept in fp32 (the CPU path in double): scores within fp32 rounding of
// each other may be ordered differently at the cut; each list entry's a_j is also kept beside the list,
// so a step reads it without first reading the position. A step is one kernel over blocks of 256 list
// entries: the scores added, each block's eviction candidate folded into a per-group minimum, a barrier
// among the group's blocks, then each block writes its entries into the next list without the dropped
// one, the next token appended. The barrier needs every block of the grid resident at once; where the
// grid does not fit (an H100 holds 660: 4 lists of more than about 42K positions do not), a step is two
// kernels split at that barrier. Both are programmatic dependent launches (common.cuh), overlapping the
// end of the kernel before them (H2OStepPath chooses or forces the path).
// Include: this header, from a .cu translation unit (nvcc, C++20).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "vlsparse/cuda/common.cuh"
#include "vlsparse/cuda/decode.cuh"
#include "vlsparse/cuda/selection/lists.cuh"
#include "vlsparse/policies/baselines_select.hpp"

namespace vlsparse::cuda {

namespace detail {

inline constexpr int kH2OThreads = 256;
// List entries per block: one per thread. Each entry is a chain of two dependent loads (the position,
// then its score), so the step is latency-bound: 2048 per block (8 per thread, run one after the
// other) took 8.8 us for the scores at 16K on an H200; spread over more blocks the chains overlap.
inline constexpr int kH2OChunk = kH2OThreads;

// A float's bits mapped to an unsigned order (a < b  <=>  key(a) < key(b) for non-NaN floats).
__device__ __forceinline__ unsigned h2o_order_key(float x) {
    const unsigned b = __float_as_uint(x);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// What a step's kernels read and write (one struct for both paths below). Group g's list: count c at
// offset g c of `cur`, its entries' scores a_j at the same places of `cur_es`; a [G][a_stride] the
// scores by position; probs one probability per entry, or (FromPlan) pa, the scores the decode kernel
// left in its plan (list g of the plan's one sequence: the same bits decode_probs_kernel writes). The
// eviction (evict): the lowest score among the older entries [0, older) and, among equal lowest scores,
// the highest entry, through best[g] (atomicMin of key(score) << 32 | ~index). The next lists: count
// c_next at offset g c_next of next / next_es, next_pos appended; best_next / arrive_next reset for the
// next step (steps alternate between two of each).
struct H2OStepArgs {
    const std::int32_t* cur = nullptr;
    float* cur_es = nullptr;
    const float* probs = nullptr;
    ProbArgs pa{};
    float heads = 1.0f;
    float* a = nullptr;
    std::int64_t a_stride = 0;
    int c = 0, older = 0, evict = 0, next_pos = 0, c_next = 0;
    unsigned long long* best = nullptr;
    unsigned long long* best_next = nullptr;
    unsigned* arrive = nullptr;
    unsigned* arrive_next = nullptr;
    std::int32_t* next = nullptr;
    float* next_es = nullptr;
    std::int32_t* next_indptr = nullptr;
    int* status = nullptr;
};

// Entry i of group g (i < c): a_j += p x heads, written at its position; a non-finite sum sets *status.
// Returns the new score; `cand` is the entry's eviction candidate (~0 when it is not one).
template <bool FromPlan>
__device__ __forceinline__ float h2o_add_entry(const H2OStepArgs& a, int g, int i, std::int32_t& pos, unsigned long long& cand) {
    const std::int64_t e = static_cast<std::int64_t>(g) * a.c + i;
    pos = a.cur[e];
    const float pe = FromPlan ? decode_entry_prob(a.pa, e, g) : a.probs[e];
    const float x = __fmaf_rn(pe, a.heads, a.cur_es[e]);  // the CPU test replays this exact operation
    a.a[static_cast<std::int64_t>(g) * a.a_stride + pos] = x;
    if (!isfinite(x)) atomicOr(a.status, 1);
    cand = a.evict && i < a.older ? static_cast<unsigned long long>(h2o_order_key(x)) << 32 | (0xffffffffu - static_cast<unsigned>(i))
                                  : ~0ull;
    return x;
}

// The block's smallest candidate, in thread 0 (every thread calls it: it synchronizes the block).
__device__ __forceinline__ unsigned long long h2o_block_min(unsigned long long mine) {
    for (int o = 16; o > 0; o >>= 1) mine = min(mine, __shfl_xor_sync(0xffffffffu, mine, o));
    __shared__ unsigned long long s_best[kH2OThreads / 32];
    if ((threadIdx.x & 31) == 0) s_best[threadIdx.x >> 5] = mine;
    __syncthreads();
    if (threadIdx.x == 0)
        for (int w = 1; w < kH2OThreads / 32; ++w) mine = min(mine, s_best[w]);
    return mine;
}

// The dropped entry of best's choice.
__device__ __forceinline__ int h2o_dropped(unsigned long long best) {
    return static_cast<int>(0xffffffffu - static_cast<unsigned>(best & 0xffffffffull));
}

// Entry i (position pos, score x) of group g into the next list, without the dropped one (drop < 0:
// none); block 0's first thread also appends next_pos (score 0), writes next_indptr and resets the
// next step's choice and barrier (this step's were reset by the step before, or by reset()).
__device__ __forceinline__ void h2o_write_next(const H2OStepArgs& a, int g, int i, bool valid, std::int32_t pos, float x, int drop) {
    std::int32_t* out = a.next + static_cast<std::int64_t>(g) * a.c_next;
    float* out_es = a.next_es + static_cast<std::int64_t>(g) * a.c_next;
    if (valid && i != drop) {
        const int o = drop >= 0 && i > drop ? i - 1 : i;
        out[o] = pos;
        out_es[o] = x;
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        out[a.c_next - 1] = a.next_pos;
        out_es[a.c_next - 1] = 0.0f;
        a.next_indptr[g + 1] = (g + 1) * a.c_next;
        if (g == 0) a.next_indptr[0] = 0;
        a.best_next[g] = ~0ull;
        a.arrive_next[g] = 0u;
    }
}

__device__ __forceinline__ unsigned h2o_load_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ unsigned long long h2o_load_relaxed(const unsigned long long* p) {
    unsigned long long v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

// The whole step in one kernel, grid (chunks, G), one entry per thread: each block adds its entries,
// then (evicting) the blocks of group g meet at a barrier on arrive[g] -- each block's candidate folded
// into best[g] before it arrives, so that past the barrier best[g] is the group's choice -- and each
// block writes its own entries, still in registers, into the next list without the dropped one: no
// second launch and no second read of the list. A barrier between the blocks of a grid needs them all
// resident at once: the host launches this kernel only where the grid fits the device's resident
// blocks (H2ODecode::advance), and since a dependent launch starts no block before the decode kernel
// ahead of it has retired, every block reaches the barrier. (Kernels of other streams may hold
// multiprocessors meanwhile and delay the later blocks; they cannot stop them unless they themselves
// wait on this kernel.)
template <bool FromPlan>
__global__ void __launch_bounds__(kH2OThreads, 5) h2o_step_kernel(const __grid_constant__ H2OStepArgs a) {
    dependent_entry();
    const int g = blockIdx.y, i = static_cast<int>(blockIdx.x) * kH2OChunk + static_cast<int>(threadIdx.x);
    const bool valid = i < a.c;
    std::int32_t pos = 0;
    float x = 0.0f;
    unsigned long long mine = ~0ull;
    if (valid) x = h2o_add_entry<FromPlan>(a, g, i, pos, mine);
    int drop = -1;
    if (a.evict) {
        __shared__ int s_drop;
        mine = h2o_block_min(mine);
        if (threadIdx.x == 0) {
            if (mine != ~0ull) atomicMin(a.best + g, mine);
            __threadfence();  // the candidate is in best[g] before this block counts as arrived
            atomicAdd(a.arrive + g, 1u);
            while (h2o_load_acquire(a.arrive + g) < gridDim.x) {
            }
            s_drop = h2o_dropped(h2o_load_relaxed(a.best + g));
        }
        __syncthreads();
        drop = s_drop;
    }
    h2o_write_next(a, g, i, valid, pos, x, drop);
}

// The same step as two kernels split at that barrier (for grids that do not fit): part 1 adds the
// entries, keeps the new scores in cur_es and folds each block's candidate into best[g]; part 2 writes
// the next lists.
template <bool FromPlan>
__global__ void __launch_bounds__(kH2OThreads) h2o_accumulate_kernel(const __grid_constant__ H2OStepArgs a) {
    dependent_entry();
    const int g = blockIdx.y, i = static_cast<int>(blockIdx.x) * kH2OChunk + static_cast<int>(threadIdx.x);
    unsigned long long mine = ~0ull;
    if (i < a.c) {
        std::int32_t pos;
        a.cur_es[static_cast<std::int64_t>(g) * a.c + i] = h2o_add_entry<FromPlan>(a, g, i, pos, mine);
    }
    if (!a.evict) return;
    mine = h2o_block_min(mine);
    if (threadIdx.x == 0 && mine != ~0ull) atomicMin(a.best + g, mine);
}
template <int Unused = 0>
__global__ void __launch_bounds__(kH2OThreads) h2o_compact_kernel(const __grid_constant__ H2OStepArgs a) {
    dependent_entry();
    const int g = blockIdx.y, i = static_cast<int>(blockIdx.x) * kH2OChunk + static_cast<int>(threadIdx.x);
    const bool valid = i < a.c;
    const std::int64_t e = static_cast<std::int64_t>(g) * a.c + i;
    h2o_write_next(a, g, i, valid, valid ? a.cur[e] : 0, valid ? a.cur_es[e] : 0.0f, a.evict ? h2o_dropped(a.best[g]) : -1);
}

// Appends `pos` to each of G lists of count c (kept at offset g * c of `in`) into `out` (count c + 1),
// and each entry's score (scores [G][n] by position; 0 for `pos`) into out_es.
template <int Unused = 0>
__global__ void h2o_append_kernel(const std::int32_t* in, int c, int G, int pos, const float* scores, std::int64_t n,
                                  std::int32_t* out, float* out_es, std::int32_t* indptr) {
    const std::int64_t total = static_cast<std::int64_t>(G) * (c + 1);
    for (std::int64_t x = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; x < total;
         x += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
        const int g = static_cast<int>(x / (c + 1)), i = static_cast<int>(x % (c + 1));
        const std::int32_t p = i < c ? in[static_cast<std::int64_t>(g) * c + i] : pos;
        out[x] = p;
        out_es[x] = i < c ? scores[static_cast<std::int64_t>(g) * n + p] : 0.0f;
        if (i == 0) indptr[g + 1] = (g + 1) * (c + 1);
        if (x == 0) indptr[0] = 0;
    }
}

}  // namespace detail

// How H2ODecode runs a step: automatic (one kernel where its grid, a block per 256 list entries, fits
// the device's resident blocks -- 660 on an H100; two kernels beyond), or either way forced (one_kernel
// is an error where the grid does not fit).
enum class H2OStepPath { automatic, one_kernel, two_kernels };

class H2ODecode {
public:
    H2ODecode() = default;
    H2ODecode(const H2ODecode&) = delete;
    H2ODecode& operator=(const H2ODecode&) = delete;

    // Starts the decode of one sequence from H2O's prefill selection (h2o_device_select of
    // BaselineScorer with the same P: its lists, equal in length, and its scores a_j [G][n] on the
    // device), for a model of H query heads; room for max_steps decode tokens. Enqueued on `stream`.
    void reset(const DeviceSelection& kept, const H2OParams& P, std::int64_t H, std::int64_t max_steps,
               cudaStream_t stream = nullptr) {
        constexpr const char* fn = "cuda::H2ODecode::reset";
        using ::vlsparse::detail::require;
        P.validate(fn);
        const std::int64_t G = kept.lists(), n = kept.n;
        require(G >= 1 && n >= 1, fn, "the selection is empty (", G, " lists over ", n, " positions)");
        require(kept.scores != nullptr && kept.score_groups == G && kept.score_len == n, fn,
                "the selection carries no scores of its ", G, " groups over n = ", n,
                " positions (expected h2o_device_select's selection)");
        require(H >= G && H % G == 0, fn, "H = ", H, " query heads, expected a multiple of the ", G, " lists");
        require(max_steps >= 0 && n + max_steps < (std::int64_t{1} << 30), fn, "max_steps = ", max_steps,
                ", expected 0 <= n + max_steps < 2^30");
        const std::int64_t c = kept.kept(0);
        for (std::int64_t g = 1; g < G; ++g)
            require(kept.kept(g) == c, fn, "list ", g, " keeps ", kept.kept(g), " positions and list 0 ", c,
                    "; H2O keeps the same number in every group");
        G_ = G;
        n_ = n;
        W_ = n + max_steps + 1;
        heads_ = static_cast<float>(H / G);
        heavy_ = P.heavy.resolve(n);
        recent_ = std::min(P.recent.resolve(n), n);
        evict_ = P.evict_during_decode;
        step_ = 0;
        // A list holds at most max(c, heavy + recent) + 1 positions (one appended past the cut), which
        // c + max_steps + 1 bounds (the lists grow by one a step until they are over heavy + recent).
        const std::size_t cap = static_cast<std::size_t>(G * (c + max_steps + 2));
        for (auto& b : lists_)
            if (b.size() < cap) b = DeviceArray<std::int32_t>(cap);
        for (auto& b : es_)
            if (b.size() < cap) b = DeviceArray<float>(cap);
        if (arrive_.size() < static_cast<std::size_t>(2 * G)) arrive_ = DeviceArray<unsigned>(static_cast<std::size_t>(2 * G));
        resident_blocks_ = resident_step_blocks(fn);
        for (auto& b : indptr_dev_)
            if (b.size() < static_cast<std::size_t>(G + 1)) b = DeviceArray<std::int32_t>(static_cast<std::size_t>(G + 1));
        if (scores_.size() < static_cast<std::size_t>(G * W_)) scores_ = DeviceArray<float>(static_cast<std::size_t>(G * W_));
        if (status_.size() != 1) status_ = DeviceArray<int>(1);
        if (best_.size() < static_cast<std::size_t>(2 * G)) best_ = DeviceArray<unsigned long long>(static_cast<std::size_t>(2 * G));
        detail::check_cuda(cudaMemsetAsync(status_.data(), 0, sizeof(int), stream), fn, "cudaMemsetAsync");
        detail::check_cuda(cudaMemsetAsync(best_.data(), 0xff, static_cast<std::size_t>(2 * G) * sizeof(unsigned long long), stream),
                           fn, "cudaMemsetAsync");
        detail::check_cuda(cudaMemsetAsync(arrive_.data(), 0, static_cast<std::size_t>(2 * G) * sizeof(unsigned), stream), fn,
                           "cudaMemsetAsync");
        detail::check_cuda(cudaMemsetAsync(scores_.data(), 0, static_cast<std::size_t>(G * W_) * sizeof(float), stream), fn,
                           "cudaMemsetAsync");
        detail::check_cuda(cudaMemcpy2DAsync(scores_.data(), static_cast<std::size_t>(W_) * sizeof(float), kept.scores,
                                             static_cast<std::size_t>(n) * sizeof(float), static_cast<std::size_t>(n) * sizeof(float),
                                             static_cast<std::size_t>(G), cudaMemcpyDeviceToDevice, stream),
                           fn, "cudaMemcpy2DAsync");
        // The first step's lists: the prefill's kept positions and the first decode token (position n).
        cur_ = 0;
        count_ = c + 1;
        detail::h2o_append_kernel<><<<grid_for(G * count_), 256, 0, stream>>>(kept.indices, static_cast<int>(c), static_cast<int>(G),
                                                                             static_cast<int>(n), kept.scores, n, lists_[0].data(),
                                                                             es_[0].data(), indptr_dev_[0].data());
        detail::check_launch(fn, "h2o_append_kernel");
        publish();
    }

    // The positions the current step reads (the new token's included), as device lists with their host
    // indptr: rows().rows() is what batched_decode_attention takes; the lengths are known on the host.
    const DeviceSelection& rows() const { return view_; }
    // a_j [G][W] on the device (row stride W = n + max_steps + 1; positions never cached are 0).
    const float* scores() const { return scores_.data(); }
    std::int64_t score_stride() const { return W_; }
    std::int64_t step() const { return step_; }
    std::int64_t groups() const { return G_; }
    // The kernels a step runs (H2OStepPath; automatic unless set), and the path the last observe() took
    // (one_kernel or two_kernels; automatic before the first).
    void set_step_path(H2OStepPath path) { path_ = path; }
    H2OStepPath step_path() const { return path_; }
    H2OStepPath last_step_path() const { return last_path_; }

    // The current step's attention (probs: batched_decode_attention's, plan.n_entries() = G x rows per
    // list, device) added to a_j; the older positions cut to `heavy` when a list is over heavy + recent
    // (evict_during_decode); the next token's position appended. Enqueued on `stream`; no
    // synchronization. check: wait and report a non-finite score (of this or an earlier step).
    void observe(const float* probs, cudaStream_t stream = nullptr, bool check = false) {
        constexpr const char* fn = "cuda::H2ODecode::observe";
        ::vlsparse::detail::require(G_ > 0, fn, "reset() was not called");
        ::vlsparse::detail::require(probs != nullptr, fn, "probs is null (plan the decode with with_probs)");
        advance(probs, nullptr, stream, check, fn);
    }
    // The same from the scores the step's decode left in `plan` (made with with_probs over rows(), run
    // with DecodeOptions::defer_probs or with a probs array): the probabilities are computed inside the
    // update, bit for bit as batched_decode_attention writes them, and no probability kernel runs.
    void observe(const DecodePlan& plan, cudaStream_t stream = nullptr, bool check = false) {
        constexpr const char* fn = "cuda::H2ODecode::observe";
        using ::vlsparse::detail::require;
        require(G_ > 0, fn, "reset() was not called");
        require(plan.planned() && plan.with_probs(), fn, "the plan was not made with with_probs");
        require(plan.batch() == 1 && plan.lists_per_seq() == G_ && plan.n_entries() == G_ * count_ &&
                    plan.n_heads() == static_cast<std::int64_t>(heads_) * G_,
                fn, "the plan is not this step's decode over rows(): batch ", plan.batch(), ", ", plan.lists_per_seq(),
                " lists, ", plan.n_entries(), " entries, H = ", plan.n_heads(), " (expected 1, ", G_, ", ", G_ * count_,
                ", ", static_cast<std::int64_t>(heads_) * G_, ")");
        const detail::ProbArgs pa = detail::prob_args(plan, nullptr);
        advance(nullptr, &pa, stream, check, fn);
    }

private:
    // One step: the accumulation (from probs, or from the plan's scores through pa), the eviction, the
    // next lists.
    void advance(const float* probs, const detail::ProbArgs* pa, cudaStream_t stream, bool check, const char* fn) {
        ::vlsparse::detail::require(n_ + step_ + 1 < W_, fn, "step ", step_ + 1, " is past the max_steps given to reset()");
        const bool evict = evict_ && count_ > heavy_ + recent_;
        const std::int64_t c_next = count_ - (evict ? 1 : 0) + 1;
        const int nxt = 1 - cur_;
        const dim3 grid(static_cast<unsigned>((count_ + detail::kH2OChunk - 1) / detail::kH2OChunk), static_cast<unsigned>(G_));
        const std::int64_t slot = step_ % 2, slot_next = (step_ + 1) % 2;
        unsigned long long* best = best_.data() + slot * G_;
        unsigned long long* best_next = best_.data() + slot_next * G_;
        const std::int64_t blocks = static_cast<std::int64_t>(grid.x) * grid.y;
        const bool fits = blocks <= resident_blocks_;
        ::vlsparse::detail::require(path_ != H2OStepPath::one_kernel || fits, fn, "the one-kernel step needs its ", blocks,
                                    " blocks resident at once and the device holds ", resident_blocks_,
                                    " (lists of ", count_, " positions in ", G_, " groups); use H2OStepPath::two_kernels or automatic");
        const bool one = path_ == H2OStepPath::one_kernel || (path_ == H2OStepPath::automatic && fits);
        detail::H2OStepArgs a;
        a.cur = lists_[cur_].data();
        a.cur_es = es_[cur_].data();
        a.probs = probs;
        if (pa) a.pa = *pa;
        a.heads = heads_;
        a.a = scores_.data();
        a.a_stride = W_;
        a.c = static_cast<int>(count_);
        a.older = static_cast<int>(count_ - recent_);
        a.evict = evict ? 1 : 0;
        a.next_pos = static_cast<int>(n_ + step_ + 1);
        a.c_next = static_cast<int>(c_next);
        a.best = best;
        a.best_next = best_next;
        a.arrive = arrive_.data() + slot * G_;
        a.arrive_next = arrive_.data() + slot_next * G_;
        a.next = lists_[nxt].data();
        a.next_es = es_[nxt].data();
        a.next_indptr = indptr_dev_[nxt].data();
        a.status = status_.data();
        // Programmatic dependent launches (common.cuh): each overlaps the end of the kernel before it (the
        // decode's, then the accumulation); each waits for it first.
        if (one) {
            detail::launch_dependent(pa ? detail::h2o_step_kernel<true> : detail::h2o_step_kernel<false>, grid, detail::kH2OThreads, 0,
                                     stream, fn, "h2o_step_kernel", a);
        } else {
            detail::launch_dependent(pa ? detail::h2o_accumulate_kernel<true> : detail::h2o_accumulate_kernel<false>, grid,
                                     detail::kH2OThreads, 0, stream, fn, "h2o_accumulate_kernel", a);
            detail::launch_dependent(detail::h2o_compact_kernel<>, grid, detail::kH2OThreads, 0, stream, fn, "h2o_compact_kernel", a);
        }
        last_path_ = one ? H2OStepPath::one_kernel : H2OStepPath::two_kernels;
        cur_ = nxt;
        count_ = c_next;
        ++step_;
        publish();
        if (check) {
            int st = 0;
            detail::check_cuda(cudaMemcpyAsync(&st, status_.data(), sizeof(int), cudaMemcpyDeviceToHost, stream), fn, "cudaMemcpyAsync");
            detail::check_cuda(cudaStreamSynchronize(stream), fn, "cudaStreamSynchronize");
            ::vlsparse::detail::require(st == 0, fn, "an accumulated score is not finite (NaN / Inf in the step's probabilities)");
        }
    }

    // Blocks of h2o_step_kernel the current device holds resident at once (the smaller of its two
    // instances' occupancy x the multiprocessors).
    static std::int64_t resident_step_blocks(const char* fn) {
        int dev = 0, sms = 0, per_sm_a = 0, per_sm_b = 0;
        detail::check_cuda(cudaGetDevice(&dev), fn, "cudaGetDevice");
        detail::check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), fn, "cudaDeviceGetAttribute");
        detail::check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm_a, detail::h2o_step_kernel<true>, detail::kH2OThreads, 0),
                           fn, "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
        detail::check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm_b, detail::h2o_step_kernel<false>, detail::kH2OThreads, 0),
                           fn, "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
        return static_cast<std::int64_t>(sms) * std::min(per_sm_a, per_sm_b);
    }
    static unsigned grid_for(std::int64_t total) {
        return static_cast<unsigned>(std::clamp<std::int64_t>((total + 255) / 256, 1, 4096));
    }
    void publish() {
        view_ = DeviceSelection{};
        view_.n = n_ + step_ + 1;
        view_.indptr.resize(static_cast<std::size_t>(G_ + 1));
        for (std::int64_t g = 0; g <= G_; ++g) view_.indptr[static_cast<std::size_t>(g)] = static_cast<std::int32_t>(g * count_);
        view_.indices = lists_[cur_].data();
        view_.indptr_dev = indptr_dev_[cur_].data();
    }

    std::int64_t G_ = 0, n_ = 0, W_ = 0, heavy_ = 0, recent_ = 0, step_ = 0, count_ = 0, resident_blocks_ = 0;
    H2OStepPath path_ = H2OStepPath::automatic, last_path_ = H2OStepPath::automatic;
    float heads_ = 1.0f;
    bool evict_ = true;
    int cur_ = 0;
    DeviceArray<std::int32_t> lists_[2], indptr_dev_[2];
    DeviceArray<float> es_[2];          // each list entry's a_j, aligned with lists_ (read without the position)
    DeviceArray<unsigned> arrive_;      // [2][G]: the one-kernel step's barrier counts (steps alternate)
    DeviceArray<float> scores_;
    DeviceArray<int> status_;
    DeviceArray<unsigned long long> best_;  // [2][G]: each step's eviction choice (steps alternate)
    DeviceSelection view_;
};

}  // namespace vlsparse::cuda
