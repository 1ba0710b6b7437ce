// vlsparse/cuda/selection/lists.cuh -- kept sets as device lists, for every policy that ranks scores
// on the GPU or hands over lists it built on the host (namespace vlsparse::cuda).
//
//   cuda::DeviceSelection   what a policy decided for one layer: CSR lists of kept positions on the device
//                           (one list per group, ascending int32 positions), their bounds on the host,
//                           optionally the ranked scores on the device; rows() is the form the decode
//                           kernels and the KV compaction take, to_host() a TokenSelection.
//   detail::ListBuilder     builds one: a keep mask per group (forced positions, then ranking tasks
//                           "the top k of scores[g][lo, hi) among the eligible positions"), compacted
//                           into the lists with one synchronization; or a host TokenSelection uploaded.
//
// The ranking is the library's one order (score descending, position ascending: core/topk.hpp),
// computed exactly on the fp32 scores by the radix selection of select.cuh: given the same fp32 scores,
// the device lists equal what topk_indices on the host keeps. Scores must be finite and >= 0 (every
// policy's scores are attention mass or mass times a norm); anything else is an error.
// Include: a policy front end (baselines.cuh, purekv.cuh, avl.cuh), from a .cu translation unit.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include "vlsparse/core/selection.hpp"
#include "vlsparse/cuda/common.cuh"
#include "vlsparse/cuda/selection/probe_columns.cuh"
#include "vlsparse/cuda/selection/select.cuh"
#include "vlsparse/kv/kv_batch.hpp"

namespace vlsparse::cuda {

// What a policy decided for one layer, on the device (lists, scores) and on the host (list bounds).
struct DeviceSelection {
    std::int64_t n = 0;                        // prompt length the positions index
    std::vector<std::int32_t> indptr;          // host [lists + 1]
    const std::int32_t* indices = nullptr;     // device [indptr.back()]: kept positions, list by list, ascending
    const std::int32_t* indptr_dev = nullptr;  // device copy of indptr
    // The scores the lists were ranked by (device [score_groups][score_len], row stride score_len; null when
    // the policy ranks nothing). score_divisor: what they are divided by (in double, as the CPU paths do)
    // to give the CPU paths' scores (H for FastV's and A-VL's head mean; 1 otherwise). Positions at or
    // past score_len (a window) score 0 on the host.
    const float* scores = nullptr;
    std::int64_t score_groups = 0, score_len = 0;
    double score_divisor = 1.0;

    std::int64_t lists() const { return static_cast<std::int64_t>(indptr.size()) - 1; }
    std::int64_t kept(std::int64_t list) const {
        return indptr.at(static_cast<std::size_t>(list) + 1) - indptr.at(static_cast<std::size_t>(list));
    }
    // Mean over lists of |kept| / n, as TokenSelection::kept_ratio.
    double kept_ratio() const {
        if (n == 0 || lists() <= 0) return 0.0;
        return static_cast<double>(indptr.back()) / (static_cast<double>(lists()) * static_cast<double>(n));
    }
    // The lists as batched_decode_attention and kv_batch_compact take them (a batch of one sequence):
    // one list shared by every KV head, or one per KV head.
    BatchRowLists rows() const { return {indptr_dev, indices, static_cast<std::int32_t>(lists())}; }
    // A host copy as the CPU paths return it: lists, and scores [score_groups][n] (0 past score_len)
    // divided by score_divisor. Synchronizes the device.
    TokenSelection to_host() const {
        constexpr const char* fn = "cuda::DeviceSelection::to_host";
        TokenSelection s;
        s.n = n;
        s.indices.resize(static_cast<std::size_t>(std::max<std::int64_t>(lists(), 0)));
        std::vector<std::int32_t> all(static_cast<std::size_t>(indptr.empty() ? 0 : indptr.back()));
        if (!all.empty())
            detail::check_cuda(cudaMemcpy(all.data(), indices, all.size() * sizeof(std::int32_t), cudaMemcpyDeviceToHost),
                               fn, "cudaMemcpy");
        for (std::int64_t l = 0; l < lists(); ++l)
            s.indices[static_cast<std::size_t>(l)].assign(all.begin() + indptr[static_cast<std::size_t>(l)],
                                                          all.begin() + indptr[static_cast<std::size_t>(l) + 1]);
        if (score_groups > 0) {
            std::vector<float> sc(static_cast<std::size_t>(score_groups * score_len));
            if (!sc.empty() && scores)
                detail::check_cuda(cudaMemcpy(sc.data(), scores, sc.size() * sizeof(float), cudaMemcpyDeviceToHost), fn,
                                   "cudaMemcpy");
            s.scores.assign(static_cast<std::size_t>(score_groups), std::vector<double>(static_cast<std::size_t>(n), 0.0));
            for (std::int64_t g = 0; g < score_groups; ++g)
                for (std::int64_t j = 0; j < std::min(score_len, n); ++j)
                    s.scores[static_cast<std::size_t>(g)][static_cast<std::size_t>(j)] =
                        static_cast<double>(sc[static_cast<std::size_t>(g * score_len + j)]) / score_divisor;
        }
        return s;
    }
};

namespace detail {

// One ranking task: the top k of scores[group][lo, hi) among the eligible positions join the group's
// kept set (k at or above the number of eligible positions: all of them).
struct RankTask {
    std::int32_t group = 0, lo = 0, hi = 0, k = 0;
    std::int32_t into_other = 0;  // 1: marks group `group` of MarkArgs::keep_other (scores: row `group` as well)
};

inline constexpr int kScoreBad = 4;  // status bit: a ranked score is NaN, Inf or negative

inline constexpr int kInlineTasks = 32;  // tasks passed in the kernel parameters (more: a device array)

struct MarkArgs {
    RankTask inline_tasks[kInlineTasks];    // the tasks when there are at most kInlineTasks
    const float* scores = nullptr;          // score of (g, j) at scores[g * stride + j]
    std::int64_t stride = 0;
    const std::uint8_t* eligible = nullptr; // [n] shared by every group, or null (every position)
    const RankTask* tasks = nullptr;        // device [blocks]
    int n = 0;
    int cached = 0;                         // tasks up to this length are ranked from shared memory
    std::uint8_t* keep = nullptr;           // [G][n]
    std::uint8_t* keep_other = nullptr;     // another builder's [G'][n] (tasks with into_other), or null
    int* status = nullptr;
};

// keep[g][j] = (f_lo <= j < f_hi) || forced[j]   (forced: [n] or null), grid-stride over G x n; the
// status word cleared.
template <int Unused = 0>
__global__ void init_keep_kernel(std::uint8_t* keep, int G, int n, int f_lo, int f_hi, const std::uint8_t* forced,
                                 int* status) {
    dependent_entry();  // programmatic dependent launch: see common.cuh
    if (blockIdx.x == 0 && threadIdx.x == 0) *status = 0;
    const std::int64_t total = static_cast<std::int64_t>(G) * n;
    for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
         i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
        const int j = static_cast<int>(i % n);
        keep[i] = (j >= f_lo && j < f_hi) || (forced && forced[j]) ? 1 : 0;
    }
}

// Per position j (grid-stride over n): keep[g][j] = (broadcast ? keep[0][j] : keep[g][j]) | the OR of
// src[a][j] over the `div` source groups a of g (a / div == g); *status |= *src_status. Each thread
// owns a column, so reading group 0 before writing every group is race-free.
template <int Unused = 0>
__global__ void keep_absorb_kernel(std::uint8_t* keep, int G, int n, int broadcast, const std::uint8_t* src, int div,
                                   const int* src_status, int* status) {
    dependent_entry();  // programmatic dependent launch: see common.cuh
    if (blockIdx.x == 0 && threadIdx.x == 0 && src_status && *src_status) atomicOr(status, *src_status);
    for (int j = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); j < n; j += static_cast<int>(gridDim.x * blockDim.x)) {
        const std::uint8_t b0 = keep[j];
        for (int g = 0; g < G; ++g) {
            std::uint8_t v = broadcast ? b0 : keep[static_cast<std::int64_t>(g) * n + j];
            if (src)
                for (int a = g * div; a < (g + 1) * div; ++a) v |= src[static_cast<std::int64_t>(a) * n + j];
            keep[static_cast<std::int64_t>(g) * n + j] = v ? 1 : 0;
        }
    }
}

// One task per team (grid: tasks x team size; the team a cluster or one block, see select.cuh): marks
// the top k of the task's eligible scores (ties: lower position first). Each block of the team reads
// and marks its slice of the task's positions.
template <int Unused = 0>
__global__ void __launch_bounds__(kSelectThreads) mark_topk_kernel(const __grid_constant__ MarkArgs a) {
    dependent_entry();  // programmatic dependent launch: see common.cuh
    __shared__ RadixShared sh;
    __shared__ int s_count, s_bad;
    extern __shared__ __align__(16) unsigned char mark_dyn[];
    const RadixTeam team = RadixTeam::current();
    const int ti = static_cast<int>(blockIdx.x) / team.size;
    const RankTask t = a.tasks ? a.tasks[ti] : a.inline_tasks[ti];
    if (threadIdx.x == 0) {
        sh.wh = reinterpret_cast<RadixWarpHist*>(mark_dyn);
        sh.pass = 0;
        s_count = 0;
        s_bad = 0;
    }
    __syncthreads();
    const int len = t.hi - t.lo;
    const int lo = team.slice_lo(len), hi = team.slice_hi(len);
    const float* base = a.scores + static_cast<std::int64_t>(t.group) * a.stride + t.lo;
    const std::uint8_t* el = a.eligible ? a.eligible + t.lo : nullptr;
    std::uint8_t* keep = (t.into_other ? a.keep_other : a.keep) + static_cast<std::int64_t>(t.group) * a.n + t.lo;
    // One read of the slice: the eligible count and the check, and, for slices of up to a.cached
    // positions, the scores into shared memory (-1: not eligible; longer slices are ranked from global
    // memory).
    float* cache = reinterpret_cast<float*>(mark_dyn + sizeof(RadixWarpHist));
    const bool cached = hi - lo <= a.cached;
    int cnt = 0;
    bool bad = false;
    for (int j = lo + static_cast<int>(threadIdx.x); j < hi; j += blockDim.x) {
        const bool in = !el || el[j];
        const float x = in ? base[j] : -1.0f;
        if (cached) cache[j - lo] = x;
        if (!in) continue;
        ++cnt;
        bad |= !(x >= 0.0f) || !isfinite(x);
    }
    if (cnt) atomicAdd(&s_count, cnt);
    if (bad) atomicOr(&s_bad, 1);
    __syncthreads();
    // The team's totals (every block takes the same branches below).
    int m = 0, any_bad = 0;
    team_sum2(sh, team, 0, s_count, s_bad, m, any_bad);
    if (any_bad) {
        if (threadIdx.x == 0 && team.rank == 0) atomicOr(a.status, kScoreBad);
        team.sync();
        return;
    }
    const int k = min(t.k, m);
    if (k <= 0 || k >= m) {
        if (k > 0)
            for (int j = lo + static_cast<int>(threadIdx.x); j < hi; j += blockDim.x)
                if (!el || el[j]) keep[j] = 1;
        team.sync();
        return;
    }
    auto score = [&](int j) { return cached ? cache[j - lo] : (el && !el[j] ? -1.0f : base[j]); };
    unsigned vkey = 0, vmask = 0xffffffffu;
    int need = 0, eq_count = 0, eq_before = 0;
    block_topk_threshold(sh, team, score, len, k, vkey, vmask, need, eq_count, eq_before);
    const bool ranked = need < eq_count;
    block_compact(
        sh, lo, hi, ranked,
        [&](int j) {
            const float x = score(j);
            return x >= 0.0f && (score_key(x) & vmask) == vkey;
        },
        [&](int j, bool tie, int rank) {
            const float x = score(j);
            if (x < 0.0f) return false;  // not eligible
            const unsigned key = score_key(x) & vmask;
            if (key > vkey || (key == vkey && (!ranked || (tie && rank < need)))) keep[j] = 1;
            return false;  // nothing written by block_compact itself
        },
        static_cast<std::int32_t*>(nullptr), eq_before);
    team.sync();  // no block leaves while another may still read its shared memory
}

struct KeepListsArgs {
    const std::uint8_t* keep = nullptr;  // [G][n]
    int n = 0;
    std::int32_t* lists = nullptr;       // group g's list at lists + g * n
    int* count = nullptr;                // [G]
    std::int32_t* indptr = nullptr;      // G == 1: {0, count} written here (else null)
    int cached = 0;                      // (unused: launch_select_kernel sets it)
};

// Group g's kept positions (keep[g][j] != 0) into lists + g * n, ascending; count[g]. One team per
// group (grid G x team size): each block compacts its slice after the earlier slices' counts.
template <int Unused = 0>
__global__ void __launch_bounds__(kSelectThreads) keep_lists_kernel(const __grid_constant__ KeepListsArgs a) {
    dependent_entry();  // programmatic dependent launch: see common.cuh
    __shared__ RadixShared sh;
    const RadixTeam team = RadixTeam::current();
    const int g = static_cast<int>(blockIdx.x) / team.size;
    const int lo = team.slice_lo(a.n), hi = team.slice_hi(a.n);
    const std::uint8_t* kg = a.keep + static_cast<std::int64_t>(g) * a.n;
    std::int32_t* out = a.lists + static_cast<std::int64_t>(g) * a.n;
    const auto no_tie = [](int) { return false; };
    const auto keep = [&](int j, bool, int) { return kg[j] != 0; };
    const int c = team_compact(sh, team, lo, hi, false, no_tie, keep, [out](int at, int j) { out[at] = j; });
    if (threadIdx.x == 0 && team.rank == 0) {
        a.count[g] = c;
        if (a.indptr) {
            a.indptr[0] = 0;
            a.indptr[1] = c;
        }
    }
    team.sync();  // no block leaves while another may still read its shared memory
}

// Builds a DeviceSelection: begin(), forced positions and ranking tasks, finish() (one synchronization).
// Or upload() of a host TokenSelection. Buffers only grow; the last result stays valid until the next
// begin() / upload(). Not thread-safe.
class ListBuilder {
public:
    // Starts G groups of n positions: keep = [f_lo, f_hi) plus forced[j] (host [n] bytes, or empty).
    void begin(std::int64_t G, std::int64_t n, std::int64_t f_lo, std::int64_t f_hi, std::span<const std::uint8_t> forced,
               cudaStream_t stream, const char* fn) {
        require(G >= 1 && n >= 1 && n <= std::numeric_limits<std::int32_t>::max() / 2, fn, "selection of ", G,
                " groups of n = ", n, " positions, expected G >= 1 and 1 <= n < 2^30");
        G_ = G;
        n_ = n;
        tasks_.clear();
        other_ = nullptr;
        const std::size_t b_keep = align256(static_cast<std::size_t>(G * n));
        const std::size_t b_lists = align256(static_cast<std::size_t>(G * n) * 4);
        const std::size_t b_small = align256(static_cast<std::size_t>(2 * G + 2) * 4 + 4);
        const std::size_t b_masks = 2 * align256(static_cast<std::size_t>(n));
        char* base = static_cast<char*>(work_.get(b_keep + 2 * b_lists + b_small + b_masks, fn));
        keep_ = reinterpret_cast<std::uint8_t*>(base);
        lists_ = reinterpret_cast<std::int32_t*>(base + b_keep);
        indices_ = reinterpret_cast<std::int32_t*>(base + b_keep + b_lists);
        auto* small = reinterpret_cast<int*>(base + b_keep + 2 * b_lists);
        count_ = small;
        indptr_ = reinterpret_cast<std::int32_t*>(small + G);
        status_ = small + 2 * G + 1;
        forced_ = reinterpret_cast<std::uint8_t*>(base + b_keep + 2 * b_lists + b_small);
        eligible_ = forced_ + align256(static_cast<std::size_t>(n));
        const std::uint8_t* fd = nullptr;
        if (!forced.empty()) {
            require(static_cast<std::int64_t>(forced.size()) == n, fn, "forced mask of ", forced.size(), " bytes, expected ", n);
            upload_bytes(forced_, forced, stream, fn);
            fd = forced_;
        }
        const auto clamp = [&](std::int64_t x) { return static_cast<int>(std::clamp<std::int64_t>(x, 0, n)); };
        launch_dependent(init_keep_kernel<>, grid_for(G * n), 256, 0, stream, fn, "init_keep_kernel", keep_,
                         static_cast<int>(G), static_cast<int>(n), clamp(f_lo), clamp(f_hi), fd, status_);
    }

    // Adds "the top k of scores[g][lo, hi) (among the eligible positions)" for group g.
    void rank(std::int64_t g, std::int64_t lo, std::int64_t hi, std::int64_t k) {
        if (hi <= lo || k <= 0) return;
        tasks_.push_back({static_cast<std::int32_t>(g), static_cast<std::int32_t>(lo), static_cast<std::int32_t>(hi),
                          static_cast<std::int32_t>(std::min<std::int64_t>(k, hi - lo))});
    }

    // Adds "the top k of scores[g][lo, hi) (among the eligible positions)" for group g of `other`'s keep
    // mask: rankings of two builders over the same scores and eligible positions in one launch (their
    // teams run side by side). `other` must have been begun over the same n, and stay so until the
    // tasks have run.
    void rank_into(ListBuilder& other, std::int64_t g, std::int64_t lo, std::int64_t hi, std::int64_t k, const char* fn) {
        require(other.n_ == n_ && g >= 0 && g < other.G_ && &other != this, fn,
                "rank_into: another builder begun over the same n, and one of its groups");
        require(other_ == nullptr || other_ == &other, fn, "rank_into: one other builder per launch");
        if (hi <= lo || k <= 0) return;
        other_ = &other;
        tasks_.push_back({static_cast<std::int32_t>(g), static_cast<std::int32_t>(lo), static_cast<std::int32_t>(hi),
                          static_cast<std::int32_t>(std::min<std::int64_t>(k, hi - lo)), 1});
    }

    // Runs the tasks added since begin() over `scores` (device, row stride `stride`), restricted to the
    // positions with eligible[j] != 0 (host [n] bytes; empty: every position).
    void run_tasks(const float* scores, std::int64_t stride, std::span<const std::uint8_t> eligible, cudaStream_t stream,
                   const char* fn) {
        if (tasks_.empty()) return;
        const std::uint8_t* ed = nullptr;
        if (!eligible.empty()) {
            require(static_cast<std::int64_t>(eligible.size()) == n_, fn, "eligible mask of ", eligible.size(),
                    " bytes, expected ", n_);
            upload_bytes(eligible_, eligible, stream, fn);
            ed = eligible_;
        }
        run_tasks_device(scores, stride, ed, stream, fn);
    }

    // The same with the eligible mask already on the device ([n] bytes, e.g. another builder's keep_mask()).
    void run_tasks_device(const float* scores, std::int64_t stride, const std::uint8_t* ed, cudaStream_t stream,
                          const char* fn) {
        if (tasks_.empty()) return;
        MarkArgs a;
        RankTask* td = nullptr;
        if (tasks_.size() > static_cast<std::size_t>(kInlineTasks)) {
            td = static_cast<RankTask*>(task_buf_.get(tasks_.size() * sizeof(RankTask), fn));
            char* h = task_staging_.get(tasks_.size() * sizeof(RankTask), fn);
            std::memcpy(h, tasks_.data(), tasks_.size() * sizeof(RankTask));
            check_cuda(cudaMemcpyAsync(td, h, tasks_.size() * sizeof(RankTask), cudaMemcpyHostToDevice, stream), fn,
                       "cudaMemcpyAsync");
            task_staging_.mark(stream, fn);
        } else {
            std::copy(tasks_.begin(), tasks_.end(), a.inline_tasks);
        }
        a.scores = scores;
        a.stride = stride;
        a.eligible = ed;
        a.tasks = td;
        a.n = static_cast<int>(n_);
        a.keep = keep_;
        a.keep_other = other_ ? other_->keep_ : nullptr;
        a.status = status_;
        std::int32_t longest = 0;
        for (const auto& t : tasks_) longest = std::max(longest, t.hi - t.lo);
        auto* k = mark_topk_kernel<>;
        SelectLaunch L = plan_select_launch(k, longest, fn);
        launch_select_kernel(k, static_cast<int>(tasks_.size()), L, stream, a, fn, "mark_topk_kernel");
        tasks_.clear();
        other_ = nullptr;
    }

    // Group 0's keep mask copied to every group (broadcast), then the positions another builder `src` (same
    // n, G x div groups) kept added: group g of this builder gains src's groups g div .. g div + div - 1.
    // src's status (scores it found not finite or negative) joins this builder's. Before compact().
    void absorb(bool broadcast, const ListBuilder* src, std::int64_t div, cudaStream_t stream, const char* fn) {
        require(src == nullptr || (src != this && src->n_ == n_ && div >= 1 && src->G_ == G_ * div), fn,
                "absorb: another builder over the same n with ", div, " groups per group of this one");
        launch_dependent(keep_absorb_kernel<>, grid_for(n_), 256, 0, stream, fn, "keep_absorb_kernel", keep_,
                         static_cast<int>(G_), static_cast<int>(n_), broadcast ? 1 : 0, src ? src->keep_ : nullptr,
                         static_cast<int>(div), src ? src->status_ : nullptr, status_);
    }

    // The keep masks compacted into CSR lists; one synchronization (list bounds and status to the host;
    // also the device int `extra_status`, when given: a scoring step's status word, see extra_status()).
    const DeviceSelection& finish(cudaStream_t stream, const char* fn, const int* extra_status = nullptr) {
        compact(stream, fn);
        enqueue_read(stream, fn, extra_status);
        check_cuda(cudaStreamSynchronize(stream), fn, "cudaStreamSynchronize");
        return collect();
    }

    // finish() in three steps, so that several builders share one synchronization: compact() and
    // enqueue_read() on each, one cudaStreamSynchronize, then collect() on each. The keep mask stays
    // readable (keep_mask()) until the next begin().
    void compact(cudaStream_t stream, const char* fn) {
        const int G = static_cast<int>(G_), n = static_cast<int>(n_);
        KeepListsArgs ka;
        ka.keep = keep_;
        ka.n = n;
        ka.lists = G == 1 ? indices_ : lists_;
        ka.count = count_;
        ka.indptr = G == 1 ? indptr_ : nullptr;
        auto* kk = keep_lists_kernel<>;
        SelectLaunch L;
        L.team = select_team_size(kk, n, 0, fn);
        launch_select_kernel(kk, G, L, stream, ka, fn, "keep_lists_kernel");
        if (G > 1) {
            const dim3 pgrid(static_cast<unsigned>(G), static_cast<unsigned>((n + kPackSpan - 1) / kPackSpan));
            launch_dependent(pack_lists_kernel<>, pgrid, 256, 0, stream, fn, "pack_lists_kernel", lists_, count_, n, G,
                             indices_, indptr_);
        }
    }
    void enqueue_read(cudaStream_t stream, const char* fn, const int* extra_status = nullptr) {
        const std::int64_t G = G_;
        char* h = staging_.get(static_cast<std::size_t>(G + 3) * 4, fn);
        back_ = reinterpret_cast<int*>(h);
        check_cuda(cudaMemcpyAsync(back_, indptr_, static_cast<std::size_t>(G + 1) * 4, cudaMemcpyDeviceToHost, stream), fn,
                   "cudaMemcpyAsync");
        check_cuda(cudaMemcpyAsync(back_ + G + 1, status_, 4, cudaMemcpyDeviceToHost, stream), fn, "cudaMemcpyAsync");
        back_[G + 2] = 0;
        if (extra_status)
            check_cuda(cudaMemcpyAsync(back_ + G + 2, extra_status, 4, cudaMemcpyDeviceToHost, stream), fn, "cudaMemcpyAsync");
        staging_.mark(stream, fn);
    }
    // After the stream was synchronized.
    const DeviceSelection& collect() {
        const std::int64_t G = G_;
        status_host_ = back_[G + 1];
        extra_host_ = back_[G + 2];
        res_ = DeviceSelection{};
        res_.n = n_;
        res_.indptr.assign(back_, back_ + G + 1);
        res_.indices = indices_;
        res_.indptr_dev = indptr_;
        return res_;
    }

    // A host selection's lists on the device (StreamingLLM, random, fixed ratio: no arithmetic to do).
    const DeviceSelection& upload(const TokenSelection& s, cudaStream_t stream, const char* fn) {
        const std::int64_t L = static_cast<std::int64_t>(s.indices.size());
        require(L >= 1 && s.n >= 1, fn, "an empty selection (", L, " lists over n = ", s.n, ")");
        std::int64_t total = 0;
        for (const auto& l : s.indices) total += static_cast<std::int64_t>(l.size());
        G_ = L;
        n_ = s.n;
        const std::size_t b_idx = align256(static_cast<std::size_t>(std::max<std::int64_t>(total, 1)) * 4);
        const std::size_t b_ptr = align256(static_cast<std::size_t>(L + 1) * 4);
        char* base = static_cast<char*>(upload_buf_.get(b_idx + b_ptr, fn));
        char* h = staging_.get(b_idx + b_ptr, fn);
        auto* hi = reinterpret_cast<std::int32_t*>(h);
        auto* hp = reinterpret_cast<std::int32_t*>(h + b_idx);
        res_ = DeviceSelection{};
        res_.n = s.n;
        res_.indptr.assign(1, 0);
        std::int64_t at = 0;
        for (const auto& l : s.indices) {
            for (auto p : l) {
                require(p >= 0 && p < s.n, fn, "position ", p, " outside [0, ", s.n, ")");
                hi[at++] = static_cast<std::int32_t>(p);
            }
            res_.indptr.push_back(static_cast<std::int32_t>(at));
        }
        std::memcpy(hp, res_.indptr.data(), res_.indptr.size() * 4);
        check_cuda(cudaMemcpyAsync(base, h, b_idx + b_ptr, cudaMemcpyHostToDevice, stream), fn, "cudaMemcpyAsync");
        staging_.mark(stream, fn);
        check_cuda(cudaStreamSynchronize(stream), fn, "cudaStreamSynchronize");
        res_.indices = reinterpret_cast<const std::int32_t*>(base);
        res_.indptr_dev = reinterpret_cast<const std::int32_t*>(base + b_idx);
        return res_;
    }

    // Where compact() writes the lists (device, list by list; valid until the next begin()): for a caller
    // that knows the lists' lengths and skips the read-back of finish().
    const std::int32_t* indices_device() const { return indices_; }
    // The keep mask of the selection being built ([G][n] device bytes; valid until the next begin()).
    const std::uint8_t* keep_mask() const { return keep_; }
    const DeviceSelection& result() const { return res_; }
    DeviceSelection& result() { return res_; }

    // Tests: every byte of the workspace set to `byte`. Synchronizes.
    void fill(int byte, const char* fn) {
        work_.fill(byte, fn);
        upload_buf_.fill(byte, fn);
    }

private:
    static unsigned grid_for(std::int64_t total) {
        return static_cast<unsigned>(std::clamp<std::int64_t>((total + 255) / 256, 1, 4096));
    }

    void upload_bytes(std::uint8_t* dst, std::span<const std::uint8_t> src, cudaStream_t stream, const char* fn) {
        PinnedStaging& st = dst == forced_ ? forced_staging_ : eligible_staging_;
        char* h = st.get(src.size(), fn);
        std::memcpy(h, src.data(), src.size());
        check_cuda(cudaMemcpyAsync(dst, h, src.size(), cudaMemcpyHostToDevice, stream), fn, "cudaMemcpyAsync");
        st.mark(stream, fn);
    }


public:
    // The status word of the last finish() (kScoreBad: a ranked score was NaN, Inf or negative).
    int status() const { return status_host_; }
    // The `extra_status` word read back by the last finish() (0 when none was given).
    int extra_status() const { return extra_host_; }

private:
    std::int64_t G_ = 0, n_ = 0;
    std::vector<RankTask> tasks_;
    ListBuilder* other_ = nullptr;  // the builder that tasks added by rank_into mark
    GrowBuffer work_, task_buf_, upload_buf_;
    PinnedStaging staging_, task_staging_, forced_staging_, eligible_staging_;
    std::uint8_t *keep_ = nullptr, *forced_ = nullptr, *eligible_ = nullptr;
    std::int32_t *lists_ = nullptr, *indices_ = nullptr, *indptr_ = nullptr;
    int *count_ = nullptr, *status_ = nullptr;
    int status_host_ = 0, extra_host_ = 0;
    int* back_ = nullptr;  // pinned: list bounds and status words of the last enqueue_read()
    DeviceSelection res_;
};

}  // namespace detail

}  // namespace vlsparse::cuda
