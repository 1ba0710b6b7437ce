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
// each other may be ordered differently at the cut. Each step is two kernels over blocks of 256 list
// entries: the scores added and each block's eviction candidate folded into a per-group minimum, then
// the lists written without the dropped entry, the next token appended; both are programmatic
// dependent launches (common.cuh), each launch overlapping the end of the kernel before it.
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

// Step part 1, grid (chunks, G): a[g][pos] += p[e] * heads for the entries of group g's list (count c
// at offset g * c of `cur`); with evict, the lowest score among the older entries [0, c - recent) and,
// among equal lowest scores, the highest entry into best[g] (atomicMin of key(score) << 32 | ~index). A
// non-finite score sets *status. p: probs, or (FromPlan) computed here from the scores the decode
// kernel left in its plan (list g of the plan's one sequence), the same bits decode_probs_kernel writes.
template <bool FromPlan>
__global__ void h2o_accumulate_kernel(const std::int32_t* cur, int c, const float* probs, const ProbArgs pa, float heads,
                                      float* a, std::int64_t a_stride, int older, int evict, unsigned long long* best,
                                      int* status) {
    dependent_entry();
    const int g = blockIdx.y, tid = threadIdx.x;
    const std::int32_t* list = cur + static_cast<std::int64_t>(g) * c;
    const float* p = FromPlan ? nullptr : probs + static_cast<std::int64_t>(g) * c;
    float* ag = a + static_cast<std::int64_t>(g) * a_stride;
    unsigned long long mine = ~0ull;
    bool bad = false;
    const int i0 = static_cast<int>(blockIdx.x) * kH2OChunk, i1 = min(c, i0 + kH2OChunk);
    for (int i = i0 + tid; i < i1; i += blockDim.x) {
        const std::int32_t pos = list[i];
        const float pe = FromPlan ? decode_entry_prob(pa, static_cast<std::int64_t>(g) * c + i, g) : p[i];
        const float x = __fmaf_rn(pe, heads, ag[pos]);  // the CPU test replays this exact operation
        ag[pos] = x;
        bad |= !isfinite(x);
        if (evict && i < older) {
            const unsigned long long k = static_cast<unsigned long long>(h2o_order_key(x)) << 32 | (0xffffffffu - static_cast<unsigned>(i));
            mine = min(mine, k);
        }
    }
    if (bad) atomicOr(status, 1);
    if (!evict) return;
    for (int o = 16; o > 0; o >>= 1) mine = min(mine, __shfl_xor_sync(0xffffffffu, mine, o));
    __shared__ unsigned long long s_best[kH2OThreads / 32];
    if ((tid & 31) == 0) s_best[tid >> 5] = mine;
    __syncthreads();
    if (tid == 0) {
        for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w) mine = min(mine, s_best[w]);
        if (mine != ~0ull) atomicMin(best + g, mine);
    }
}

// Step part 2, grid (chunks, G): the entries of group g's list but the dropped one (from best[g], when
// evicting) written at offset g * c_next of `next`, then `next_pos`; next_indptr; best_next[g] reset for
// the next step.
template <int Unused = 0>
__global__ void h2o_compact_kernel(const std::int32_t* cur, int c, int evict, const unsigned long long* best,
                                   unsigned long long* best_next, int next_pos, std::int32_t* next,
                                   std::int32_t* next_indptr, int c_next) {
    dependent_entry();
    const int g = blockIdx.y, tid = threadIdx.x;
    const std::int32_t* list = cur + static_cast<std::int64_t>(g) * c;
    const int drop = evict ? static_cast<int>(0xffffffffu - static_cast<unsigned>(best[g] & 0xffffffffull)) : -1;
    std::int32_t* out = next + static_cast<std::int64_t>(g) * c_next;
    const int i0 = static_cast<int>(blockIdx.x) * kH2OChunk, i1 = min(c, i0 + kH2OChunk);
    for (int i = i0 + tid; i < i1; i += blockDim.x)
        if (i != drop) out[drop >= 0 && i > drop ? i - 1 : i] = list[i];
    if (blockIdx.x == 0 && tid == 0) {
        out[c_next - 1] = next_pos;
        next_indptr[g + 1] = (g + 1) * c_next;
        if (g == 0) next_indptr[0] = 0;
        best_next[g] = ~0ull;
    }
}

// Appends `pos` to each of G lists of count c (kept at offset g * c of `in`) into `out` (count c + 1).
template <int Unused = 0>
__global__ void h2o_append_kernel(const std::int32_t* in, int c, int G, int pos, std::int32_t* out, std::int32_t* indptr) {
    const std::int64_t total = static_cast<std::int64_t>(G) * (c + 1);
    for (std::int64_t x = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; x < total;
         x += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
        const int g = static_cast<int>(x / (c + 1)), i = static_cast<int>(x % (c + 1));
        out[x] = i < c ? in[static_cast<std::int64_t>(g) * c + i] : pos;
        if (i == 0) indptr[g + 1] = (g + 1) * (c + 1);
        if (x == 0) indptr[0] = 0;
    }
}

}  // namespace detail

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
        const std::size_t cap = static_cast<std::size_t>(G * (std::min(c, heavy_ + recent_) + max_steps + 2));
        for (auto& b : lists_)
            if (b.size() < cap) b = DeviceArray<std::int32_t>(cap);
        for (auto& b : indptr_dev_)
            if (b.size() < static_cast<std::size_t>(G + 1)) b = DeviceArray<std::int32_t>(static_cast<std::size_t>(G + 1));
        if (scores_.size() < static_cast<std::size_t>(G * W_)) scores_ = DeviceArray<float>(static_cast<std::size_t>(G * W_));
        if (status_.size() != 1) status_ = DeviceArray<int>(1);
        if (best_.size() < static_cast<std::size_t>(2 * G)) best_ = DeviceArray<unsigned long long>(static_cast<std::size_t>(2 * G));
        detail::check_cuda(cudaMemsetAsync(status_.data(), 0, sizeof(int), stream), fn, "cudaMemsetAsync");
        detail::check_cuda(cudaMemsetAsync(best_.data(), 0xff, static_cast<std::size_t>(2 * G) * sizeof(unsigned long long), stream),
                           fn, "cudaMemsetAsync");
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
                                                                             static_cast<int>(n), lists_[0].data(), indptr_dev_[0].data());
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
        unsigned long long* best = best_.data() + (step_ % 2) * G_;
        unsigned long long* best_next = best_.data() + ((step_ + 1) % 2) * G_;
        // Both as programmatic dependent launches (common.cuh): each launch overlaps the end of the kernel
        // before it (the decode's probability kernel, then the accumulation); each waits for it first.
        const detail::ProbArgs none{};
        detail::launch_dependent(pa ? detail::h2o_accumulate_kernel<true> : detail::h2o_accumulate_kernel<false>, grid,
                                 detail::kH2OThreads, 0, stream, fn, "h2o_accumulate_kernel", lists_[cur_].data(),
                                 static_cast<int>(count_), probs, pa ? *pa : none, heads_, scores_.data(), W_,
                                 static_cast<int>(count_ - recent_), evict ? 1 : 0, best, status_.data());
        detail::launch_dependent(detail::h2o_compact_kernel<>, grid, detail::kH2OThreads, 0, stream, fn,
                                 "h2o_compact_kernel", lists_[cur_].data(), static_cast<int>(count_), evict ? 1 : 0,
                                 best, best_next, static_cast<int>(n_ + step_ + 1), lists_[nxt].data(),
                                 indptr_dev_[nxt].data(), static_cast<int>(c_next));
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

    std::int64_t G_ = 0, n_ = 0, W_ = 0, heavy_ = 0, recent_ = 0, step_ = 0, count_ = 0;
    float heads_ = 1.0f;
    bool evict_ = true;
    int cur_ = 0;
    DeviceArray<std::int32_t> lists_[2], indptr_dev_[2];
    DeviceArray<float> scores_;
    DeviceArray<int> status_;
    DeviceArray<unsigned long long> best_;  // [2][G]: each step's eviction choice (steps alternate)
    DeviceSelection view_;
};

}  // namespace vlsparse::cuda
