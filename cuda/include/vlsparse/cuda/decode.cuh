// vlsparse/cuda/decode.cuh -- batched decode attention over contiguous or paged KV caches, dense or
// restricted to row lists, on the GPU (namespace vlsparse::cuda).
//
//   o_{i,h} = sum_{t in R_{b,g}, t <= n_b - q_b + i} softmax_t(scale * q_{i,h} . k_{b,g,t}) v_{b,g,t},
//   g = h / (H / H_kv)
//
// for every sequence b of the batch, its q_b new tokens i (1..8; causal among themselves) and query
// heads h, over the rows R_{b,g} listed for its KV head (every row when the lists are dense). The
// cache and lists are described by vlsparse/kv/kv_batch.hpp (KvBatchView, BatchRowLists,
// DecodeBatchHost), the same description the reference and the CPU path read. Serves ZipVL's decode
// (every kept row), A-VL's core / refresh steps, H2O with its probabilities, and plain dense decode.
//
// Two phases, as in FlashInfer: `DecodePlan::plan` reads the step's host metadata (lengths, indptr
// arrays), splits the work into chunks sized from the list lengths and the GPU's multiprocessor
// count, and uploads the work list (stream-ordered, from pinned memory); `batched_decode_attention`
// launches one kernel (plus a small one for probabilities). One plan serves every layer of a step.
// The kernels: decode/kernels_mma.cuh (tensor cores: bf16 and fp16 caches, head_dim <= 128) and
// decode/kernels.cuh (CUDA cores: fp32 caches, head_dim up to 256, unaligned rows). Device pointers
// throughout; fp32 accumulation; output in the output view's element type, rounded to nearest even.
//
// Checks: shapes, strides, lengths and indptr arrays on the host before anything is launched
// (vlsparse::error). With opt.check_inputs (default on) a small kernel also checks what only the
// device holds -- device seq_lens equal the plan's, list entries sorted, unique and in range,
// block-table entries of the pages in use inside the pool, every new token sees a listed row -- and
// the host waits for its verdict; with opt.check_finite (default on) the host waits and turns a
// non-finite output into an error. Engines switch both off in the decode loop (no synchronization,
// CUDA-graph capturable) and validate where their metadata is produced. Every CUDA status is checked.
// Include: this header, from a .cu translation unit (nvcc, C++20).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "vlsparse/attention/common.hpp"
#include "vlsparse/core/dtype.hpp"
#include "vlsparse/core/error.hpp"
#include "vlsparse/core/tensor.hpp"
#include "vlsparse/cuda/common.cuh"
#include "vlsparse/cuda/decode/kernels.cuh"
#include "vlsparse/cuda/decode/kernels_mma.cuh"
#include "vlsparse/kv/kv_batch.hpp"

namespace vlsparse::cuda {

// Which kernel computes the step. automatic: the tensor-core kernel for bf16 and fp16 caches with
// head_dim <= 128 and 16-byte aligned rows, the CUDA-core kernel otherwise. The others force one
// (tests and benchmarks compare them; tensor_cores on a case it cannot take is an error).
enum class DecodeKernel : std::uint8_t { automatic, cuda_cores, tensor_cores };

struct DecodeOptions {
    float scale = 0.0f;         // softmax scale; 0: 1/sqrt(head_dim) (computed in double, rounded to fp32)
    DecodeKernel kernel = DecodeKernel::automatic;
    bool check_inputs = true;   // device-side checks of lengths, lists and block tables (waits for the stream)
    bool check_finite = true;   // wait for the stream; a non-finite output is a vlsparse::error
    // With a plan made with_probs and no probs array: the kernel keeps each listed row's scores and each
    // query's (max, sum) in the plan, and no probability kernel runs; a consumer that reads them from
    // the plan turns them into probabilities itself (H2ODecode::observe(plan): one kernel fewer per step).
    bool defer_probs = false;
};

// The work split of one decode step (see the header comment). Reusable: plan() again for the next
// step; its device buffers grow as needed and are kept.
class DecodePlan {
public:
    DecodePlan() = default;
    DecodePlan(const DecodePlan&) = delete;
    DecodePlan& operator=(const DecodePlan&) = delete;
    ~DecodePlan() {
        if (uploaded_) {
            cudaEventSynchronize(uploaded_);
            cudaEventDestroy(uploaded_);
        }
        cudaFreeHost(pinned_);
        cudaFree(dev_);
    }

    // meta: the step's host metadata (lengths of every sequence, q_indptr, list indptr). With
    // with_probs, the plan also holds room for the probabilities of every listed row.
    // cache_type: the element type of the cache the plan will serve, when known: a bf16 / fp16 cache
    // with 64 < head_dim <= 128 and one new token per sequence gets chunks sized for the tensor-core
    // kernel's 3-stage ring (2 blocks per multiprocessor; 1-6% faster at B = 1, docs/cuda.md); anything
    // else plans for 3 blocks per multiprocessor, which every kernel serves (the default: unknown).
    void plan(const DecodeBatchHost& meta, std::int64_t n_heads, std::int64_t n_kv_heads, std::int64_t head_dim,
              bool with_probs = false, cudaStream_t stream = nullptr, DType cache_type = DType::f32) {
        constexpr const char* fn = "cuda::DecodePlan::plan";
        using ::vlsparse::detail::require;
        require(n_kv_heads >= 1 && n_heads >= 1 && n_heads % n_kv_heads == 0, fn, "H = ", n_heads,
                " is not a positive multiple of H_kv = ", n_kv_heads);
        require(head_dim >= 1 && head_dim <= 256, fn, "head_dim = ", head_dim, "; the CUDA path supports 1..256");
        const auto B = static_cast<std::int64_t>(meta.seq_lens.size());
        require(B >= 1 && B <= std::numeric_limits<std::int32_t>::max(), fn, "batch = ", B, ", expected >= 1");
        require(!with_probs || !meta.list_indptr.empty(), fn,
                "probabilities need row lists (for dense decode pass the all-rows list)");
        // The same checks as every backend's (a cache view is checked again at run time).
        ::vlsparse::detail::check_decode_meta(meta, B, n_kv_heads, -1, false, fn);
        H_ = n_heads;
        Hkv_ = n_kv_heads;
        d_ = head_dim;
        B_ = B;
        lists_per_seq_ = meta.lists_per_seq;
        dense_ = meta.list_indptr.empty();
        with_probs_ = with_probs;
        const std::int64_t G = H_ / Hkv_;
        std::int64_t qmax = 1;
        for (std::int64_t b = 0; b < B; ++b) qmax = std::max(qmax, meta.q_len(b));
        qmax_ = qmax;
        // The tensor-core kernel's 3-stage ring, 2 blocks per multiprocessor: one new token per sequence
        // only (with q_len 4 at B = 8 it measured 12% slower than 2 stages at 3 blocks).
        const bool tc16 = cache_type == DType::bf16 || cache_type == DType::f16;
        blocks_per_sm_ = tc16 && head_dim > 64 && head_dim <= 128 && qmax == 1 ? 2 : 3;
        nqb_ = 1;
        while (nqb_ < std::min<std::int64_t>(G * qmax, detail::kMaxQueryBlock)) nqb_ *= 2;
        total_q_ = meta.total_q(B);
        seq_lens_.assign(meta.seq_lens.begin(), meta.seq_lens.end());
        q_indptr_.assign(meta.q_indptr.begin(), meta.q_indptr.end());
        list_indptr_.assign(meta.list_indptr.begin(), meta.list_indptr.end());
        n_entries_ = dense_ ? 0 : list_indptr_.back();

        // Units: (sequence, KV head, query block) with their list lengths.
        struct Unit {
            std::int32_t b, g, qb, len;
            std::int64_t base;
        };
        std::vector<Unit> units;
        std::int64_t total_rows = 0, longest = 0;
        for (std::int64_t b = 0; b < B; ++b) {
            const std::int64_t nqv = G * meta.q_len(b), nqb = (nqv + nqb_ - 1) / nqb_;
            for (std::int64_t g = 0; g < Hkv_; ++g) {
                const std::int64_t l = dense_ ? 0 : b * lists_per_seq_ + (lists_per_seq_ == 1 ? 0 : g);
                const std::int64_t len = meta.list_len(b, lists_per_seq_ == 1 ? 0 : g);
                const std::int64_t base = dense_ ? 0 : list_indptr_[static_cast<std::size_t>(l)];
                for (std::int64_t qb = 0; qb < nqb; ++qb) {
                    units.push_back({static_cast<std::int32_t>(b), static_cast<std::int32_t>(g),
                                     static_cast<std::int32_t>(qb), static_cast<std::int32_t>(len), base});
                    total_rows += len;
                    longest = std::max(longest, len);
                }
            }
        }
        n_units_ = static_cast<std::int64_t>(units.size());
        chunk_ = choose_chunk([&](std::int64_t c) {
            std::int64_t n = 0;
            for (const auto& u : units) n += (u.len + c - 1) / c;
            return n;
        }, longest);

        items_.clear();
        for (std::size_t ui = 0; ui < units.size(); ++ui) {
            const auto& u = units[ui];
            const auto n = static_cast<std::int32_t>((u.len + chunk_ - 1) / chunk_);
            const auto first = static_cast<std::int32_t>(items_.size());
            const std::int64_t q0 = meta.q_indptr.empty() ? u.b : meta.q_indptr[static_cast<std::size_t>(u.b)];
            for (std::int32_t c = 0; c < n; ++c) {
                detail::DecodeItem it{};
                it.b = u.b;
                it.g = u.g;
                it.qb = u.qb;
                it.unit = static_cast<std::int32_t>(ui);
                it.begin = static_cast<std::int32_t>(c * chunk_);
                it.end = static_cast<std::int32_t>(std::min<std::int64_t>(u.len, (c + 1) * chunk_));
                it.first_item = first;
                it.n_items = n;
                it.list_base = u.base;
                it.seq_len = seq_lens_[static_cast<std::size_t>(u.b)];
                it.q_len = static_cast<std::int32_t>(meta.q_len(u.b));
                it.q_row0 = static_cast<std::int32_t>(q0);
                it.list_len = u.len;
                items_.push_back(it);
            }
        }
        require(items_.size() <= static_cast<std::size_t>(std::numeric_limits<int>::max()), fn, "too many work items");
        upload(stream, fn);
    }

    std::int64_t batch() const { return B_; }
    std::int64_t n_heads() const { return H_; }
    std::int64_t n_kv_heads() const { return Hkv_; }
    std::int64_t head_dim() const { return d_; }
    std::int64_t total_q() const { return total_q_; }
    std::int64_t n_items() const { return static_cast<std::int64_t>(items_.size()); }
    std::int64_t n_units() const { return n_units_; }
    std::int64_t chunk_rows() const { return chunk_; }         // list entries per work item (at most)
    std::int64_t query_block() const { return nqb_; }          // query vectors per unit
    int blocks_per_sm() const { return blocks_per_sm_; }       // 2: the tensor-core kernel's 3-stage ring
    std::int64_t n_entries() const { return n_entries_; }      // listed rows in all (0 when dense)
    bool dense() const { return dense_; }
    bool with_probs() const { return with_probs_; }
    std::int32_t lists_per_seq() const { return lists_per_seq_; }
    bool planned() const { return H_ > 0; }
    // The host metadata the plan was made from.
    DecodeBatchHost meta() const { return {seq_lens_, q_indptr_, list_indptr_, lists_per_seq_}; }
    // Device memory the plan holds (work list, partials, counters, probabilities scratch).
    std::size_t device_bytes() const { return dev_bytes_; }

    // Internal to batched_decode_attention.
    struct Device {
        const detail::DecodeItem* items;
        float* part;
        int* counters;
        int* status;
        long long* report;
        float* logits;
        float* stats;
        std::int32_t* seq_lens;
        std::int32_t* list_indptr;
        std::int32_t* q_indptr;
        std::int32_t* q_lens;
        std::int64_t logit_stride;
    };
    Device device() const { return dev_view_; }
    std::int64_t max_q_len() const { return qmax_; }

private:
    // Chunk size (a multiple of kChunkQuantum) minimizing the estimated time: waves of blocks over the
    // GPU x (the longest chunk + a block's fixed cost, worth kBlockCostRows rows), plus a small cost per
    // item (the merge). The fixed cost (a block's start: q, the first tiles' round trips; its partial)
    // keeps large batches from being cut into many short waves for a few percent of quantization: at
    // B = 8 / 32 and 128K a cost of 64 rows chose 10 / 35 waves of ~3.5K-row chunks over one wave of
    // whole units, 1.07-1.08x cuDNN's time against 1.01-1.03x at 64K (H200, docs/cuda.md).
    static constexpr std::int64_t kBlockCostRows = 256;
    template <class CountItems>
    std::int64_t choose_chunk(CountItems&& count, std::int64_t longest) {
        const std::int64_t q = detail::kChunkQuantum;
        const std::int64_t slots = static_cast<std::int64_t>(sm_count()) * blocks_per_sm_;
        const std::int64_t top = std::max<std::int64_t>(q, (longest + q - 1) / q * q);
        std::int64_t best = top;
        double best_cost = std::numeric_limits<double>::infinity();
        // Candidates: the chunk sizes that split the longest list into k pieces, k = 1, 2, ... (every
        // distinct multiple of q up to 64 pieces, then a geometric sweep).
        std::vector<std::int64_t> cands;
        for (std::int64_t k = 1; k <= 4096; k = k < 64 ? k + 1 : k + k / 16) {
            const std::int64_t c = std::max(q, ((longest + k - 1) / k + q - 1) / q * q);
            if (cands.empty() || c < cands.back()) cands.push_back(c);
            if (c == q) break;
        }
        for (const std::int64_t c : cands) {
            const std::int64_t items = count(c);
            const double waves = std::ceil(static_cast<double>(items) / static_cast<double>(slots));
            const double cost = waves * static_cast<double>(c + q + kBlockCostRows) + 0.02 * static_cast<double>(items);
            if (cost < best_cost) {
                best_cost = cost;
                best = c;
            }
        }
        return std::min(best, top);
    }

    int sm_count() {
        if (sms_ == 0) {
            int dev = 0;
            detail::check_cuda(cudaGetDevice(&dev), "cuda::DecodePlan", "cudaGetDevice");
            detail::check_cuda(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, dev), "cuda::DecodePlan",
                               "cudaDeviceGetAttribute");
        }
        return sms_;
    }

    static std::size_t align_up(std::size_t x) { return (x + 255) / 256 * 256; }

    void upload(cudaStream_t stream, const char* fn) {
        // Device layout: items | part | counters | status + report | logits | stats | seq_lens | list indptr |
        // q indptr | q lens.
        const std::size_t n_items = items_.size();
        const std::size_t b_items = align_up(n_items * sizeof(detail::DecodeItem));
        const std::size_t b_part = align_up(n_items * static_cast<std::size_t>(detail::decode_partial_floats(static_cast<int>(nqb_), 256)) * sizeof(float));
        const std::size_t b_cnt = align_up(static_cast<std::size_t>(n_units_) * sizeof(int));
        const std::size_t b_status = 256;
        const std::int64_t lstride = (lists_per_seq_ == 1 ? Hkv_ : 1) * (H_ / Hkv_) * qmax_;
        const std::size_t b_logits = with_probs_ ? align_up(static_cast<std::size_t>(n_entries_ * lstride) * sizeof(float)) : 0;
        const std::size_t b_stats = with_probs_ ? align_up(static_cast<std::size_t>(total_q_ * H_ * 2) * sizeof(float)) : 0;
        const std::size_t b_seq = align_up(seq_lens_.size() * sizeof(std::int32_t));
        const std::size_t b_lind = align_up(std::max<std::size_t>(list_indptr_.size(), 1) * sizeof(std::int32_t));
        const std::size_t b_qind = align_up((static_cast<std::size_t>(B_) + 1) * sizeof(std::int32_t));
        const std::size_t b_qlen = align_up(static_cast<std::size_t>(B_) * sizeof(std::int32_t));
        const std::size_t need = b_items + b_part + b_cnt + b_status + b_logits + b_stats + b_seq + b_lind + b_qind + b_qlen;
        // What is uploaded: items, then seq lens / indptrs / q lens (contiguous in pinned memory too).
        const std::size_t up_meta = b_seq + b_lind + b_qind + b_qlen;
        const std::size_t up = b_items + up_meta;
        if (uploaded_) detail::check_cuda(cudaEventSynchronize(uploaded_), fn, "cudaEventSynchronize");
        else detail::check_cuda(cudaEventCreateWithFlags(&uploaded_, cudaEventDisableTiming), fn, "cudaEventCreate");
        if (need > dev_bytes_) {
            // The old buffer may still be read by work queued before this plan: wait for the device.
            detail::check_cuda(cudaDeviceSynchronize(), fn, "cudaDeviceSynchronize");
            cudaFree(dev_);
            dev_ = nullptr;
            dev_bytes_ = 0;
            detail::check_cuda(cudaMalloc(&dev_, need), fn, "cudaMalloc");
            dev_bytes_ = need;
        }
        if (up > pinned_bytes_) {
            cudaFreeHost(pinned_);
            pinned_ = nullptr;
            pinned_bytes_ = 0;
            detail::check_cuda(cudaMallocHost(&pinned_, up), fn, "cudaMallocHost");
            pinned_bytes_ = up;
        }
        char* h = static_cast<char*>(pinned_);
        std::memcpy(h, items_.data(), n_items * sizeof(detail::DecodeItem));
        char* hm = h + b_items;
        std::memset(hm, 0, up_meta);
        std::memcpy(hm, seq_lens_.data(), seq_lens_.size() * sizeof(std::int32_t));
        if (!list_indptr_.empty()) std::memcpy(hm + b_seq, list_indptr_.data(), list_indptr_.size() * sizeof(std::int32_t));
        std::vector<std::int32_t> qind(static_cast<std::size_t>(B_) + 1), qlen(static_cast<std::size_t>(B_));
        for (std::int64_t b = 0; b <= B_; ++b) qind[static_cast<std::size_t>(b)] = q_indptr_.empty() ? static_cast<std::int32_t>(b) : q_indptr_[static_cast<std::size_t>(b)];
        for (std::int64_t b = 0; b < B_; ++b) qlen[static_cast<std::size_t>(b)] = qind[static_cast<std::size_t>(b + 1)] - qind[static_cast<std::size_t>(b)];
        std::memcpy(hm + b_seq + b_lind, qind.data(), qind.size() * sizeof(std::int32_t));
        std::memcpy(hm + b_seq + b_lind + b_qind, qlen.data(), qlen.size() * sizeof(std::int32_t));

        char* d = static_cast<char*>(dev_);
        Device v{};
        v.items = reinterpret_cast<const detail::DecodeItem*>(d);
        v.part = reinterpret_cast<float*>(d + b_items);
        v.counters = reinterpret_cast<int*>(d + b_items + b_part);
        v.status = reinterpret_cast<int*>(d + b_items + b_part + b_cnt);
        v.report = reinterpret_cast<long long*>(d + b_items + b_part + b_cnt + 64);
        char* after = d + b_items + b_part + b_cnt + b_status;
        v.logits = with_probs_ ? reinterpret_cast<float*>(after) : nullptr;
        v.stats = with_probs_ ? reinterpret_cast<float*>(after + b_logits) : nullptr;
        char* meta_d = after + b_logits + b_stats;
        v.seq_lens = reinterpret_cast<std::int32_t*>(meta_d);
        v.list_indptr = dense_ ? nullptr : reinterpret_cast<std::int32_t*>(meta_d + b_seq);
        v.q_indptr = reinterpret_cast<std::int32_t*>(meta_d + b_seq + b_lind);
        v.q_lens = reinterpret_cast<std::int32_t*>(meta_d + b_seq + b_lind + b_qind);
        v.logit_stride = lstride;
        dev_view_ = v;

        detail::check_cuda(cudaMemcpyAsync(d, h, n_items * sizeof(detail::DecodeItem), cudaMemcpyHostToDevice, stream), fn,
                           "cudaMemcpyAsync");
        detail::check_cuda(cudaMemcpyAsync(meta_d, hm, up_meta, cudaMemcpyHostToDevice, stream), fn, "cudaMemcpyAsync");
        // Counters start at zero and every merge resets its own; cleared again here so that a launch that
        // failed half-way cannot leave a stale count behind.
        detail::check_cuda(cudaMemsetAsync(v.counters, 0, b_cnt, stream), fn, "cudaMemsetAsync");
        detail::check_cuda(cudaEventRecord(uploaded_, stream), fn, "cudaEventRecord");
    }

    int blocks_per_sm_ = 3;  // resident decode blocks per multiprocessor the chunks are sized for

    std::int64_t H_ = 0, Hkv_ = 0, d_ = 0, B_ = 0, total_q_ = 0, qmax_ = 1, nqb_ = 1, n_units_ = 0, chunk_ = 0,
                 n_entries_ = 0;
    std::int32_t lists_per_seq_ = 1;
    bool dense_ = true, with_probs_ = false;
    std::vector<std::int32_t> seq_lens_, q_indptr_, list_indptr_;
    std::vector<detail::DecodeItem> items_;
    void* dev_ = nullptr;
    std::size_t dev_bytes_ = 0;
    void* pinned_ = nullptr;
    std::size_t pinned_bytes_ = 0;
    cudaEvent_t uploaded_ = nullptr;
    int sms_ = 0;
    Device dev_view_{};
};

namespace detail {

template <class TC, int D, int NQB>
void launch_decode(const DecodeArgs<TC>& args, int n_items, cudaStream_t stream, const char* fn) {
    constexpr std::size_t shm = decode_smem_bytes<TC, D, NQB>();
    auto* kernel = decode_kernel<TC, D, NQB>;
    const cudaError_t attr =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shm));
    check_cuda(attr, fn, "cudaFuncSetAttribute");
    kernel<<<static_cast<unsigned>(n_items), kDecodeThreads, shm, stream>>>(args);
    check_launch(fn, "decode_kernel");
}

template <class TC, int D, int NQB, int ST = MmaShape<D>::STAGES>
void launch_decode_mma(const DecodeArgs<TC>& args, int n_items, cudaStream_t stream, const char* fn) {
    constexpr std::size_t shm = decode_mma_smem_bytes<D, NQB, ST>();
    auto* kernel = decode_mma_kernel<TC, D, NQB, ST>;
    const cudaError_t attr =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shm));
    check_cuda(attr, fn, "cudaFuncSetAttribute");
    kernel<<<static_cast<unsigned>(n_items), kDecodeThreads, shm, stream>>>(args);
    check_launch(fn, "decode_mma_kernel");
}

template <int D, int ST = MmaShape<D>::STAGES, class TC>
void launch_decode_mma_nqb(const DecodeArgs<TC>& args, int nqb, int n_items, cudaStream_t stream, const char* fn) {
    switch (nqb) {
        case 1: launch_decode_mma<TC, D, 1, ST>(args, n_items, stream, fn); break;
        case 2: launch_decode_mma<TC, D, 2, ST>(args, n_items, stream, fn); break;
        case 4: launch_decode_mma<TC, D, 4, ST>(args, n_items, stream, fn); break;
        default: launch_decode_mma<TC, D, 8, ST>(args, n_items, stream, fn); break;
    }
}

template <class TC, int D>
void launch_decode_nqb(const DecodeArgs<TC>& args, int nqb, int n_items, cudaStream_t stream, const char* fn) {
    switch (nqb) {
        case 1: launch_decode<TC, D, 1>(args, n_items, stream, fn); break;
        case 2: launch_decode<TC, D, 2>(args, n_items, stream, fn); break;
        case 4: launch_decode<TC, D, 4>(args, n_items, stream, fn); break;
        default: launch_decode<TC, D, 8>(args, n_items, stream, fn); break;
    }
}

inline std::string check_message(const long long* r) {
    const long long code = r[5], b = r[1], l = r[2], e = r[3], v = r[4];
    std::string s = "sequence " + std::to_string(b) + ": ";
    switch (code) {
        case kCheckSeqLen: return s + "the device seq_lens holds " + std::to_string(v) + ", the plan's host copy another length (re-plan after append / compaction)";
        case kCheckIndptr: return s + "the device list indptr differs from the plan's host copy at entry " + std::to_string(e) + " (value " + std::to_string(v) + ")";
        case kCheckOrder: return s + "row list " + std::to_string(l) + " is not sorted ascending without duplicates at entry " + std::to_string(e) + " (row " + std::to_string(v) + ")";
        case kCheckRange: return s + "row list " + std::to_string(l) + " holds row " + std::to_string(v) + " at entry " + std::to_string(e) + ", outside the sequence's rows";
        case kCheckPage: return s + "block-table entry " + std::to_string(e) + " = " + std::to_string(v) + " is outside the page pool";
        case kCheckVisible: return s + "row list " + std::to_string(l) + " starts at row " + std::to_string(v) + ", after the first new token: that token sees no listed row";
        default: return s + "unknown check code " + std::to_string(code);
    }
}

// What decode_probs_kernel (and a consumer of deferred probabilities) reads of a plan made with_probs,
// after a decode step that wrote its scores there.
inline ProbArgs prob_args(const DecodePlan& plan, float* probs) {
    const auto dv = plan.device();
    ProbArgs p;
    p.logits = dv.logits;
    p.stats = dv.stats;
    p.probs = probs;
    p.list_indptr = dv.list_indptr;
    p.q_indptr = dv.q_indptr;
    p.n_entries = plan.n_entries();
    p.logit_stride = dv.logit_stride;
    p.n_lists = static_cast<int>(plan.batch() * plan.lists_per_seq());
    p.lists_per_seq = plan.lists_per_seq();
    p.n_kv_heads = static_cast<int>(plan.n_kv_heads());
    p.group = static_cast<int>(plan.n_heads() / plan.n_kv_heads());
    p.n_heads = static_cast<int>(plan.n_heads());
    return p;
}

inline bool overlaps_bytes(const void* a, std::size_t na, const void* b, std::size_t nb) {
    const auto pa = reinterpret_cast<std::uintptr_t>(a), pb = reinterpret_cast<std::uintptr_t>(b);
    return pa < pb + nb && pb < pa + na;
}

template <class T>
std::size_t span_bytes(const View3<T>& v) {
    std::int64_t last = 0;
    for (int i = 0; i < 3; ++i) last += (v.shape[i] - 1) * v.stride[i];
    return static_cast<std::size_t>(last + 1) * sizeof(T);
}

}  // namespace detail

// One decode step of the batch the plan describes. q, out: [total_q, H, d] device views (any strides,
// fp32 / fp16 / bf16 each); cache: a device KvBatchView; lists: device CSR (or dense), the same
// structure the plan was made from. probs: null, or a device array of plan.n_entries() floats
// receiving each listed row's probability (summed over the sequence's new tokens, averaged over
// the query heads that read the list); needs a plan made with with_probs.
template <ElementType TQ, ElementType TC, ElementType TO>
void batched_decode_attention(const DecodePlan& plan, View3<const TQ> q, const KvBatchView<const TC>& cache,
                              const BatchRowLists& lists, View3<TO> out, const DecodeOptions& opt = {},
                              cudaStream_t stream = nullptr, float* probs = nullptr) {
    constexpr const char* fn = "cuda::batched_decode_attention";
    using ::vlsparse::detail::require;
    require(plan.planned(), fn, "the plan is empty; call DecodePlan::plan first");
    const std::int64_t H = plan.n_heads(), d = plan.head_dim();
    require(cache.batch == plan.batch() && cache.n_kv_heads == plan.n_kv_heads() && cache.head_dim == d, fn,
            "the cache has batch ", cache.batch, ", H_kv ", cache.n_kv_heads, ", head_dim ", cache.head_dim,
            "; the plan was made for ", plan.batch(), ", ", plan.n_kv_heads(), ", ", d);
    ::vlsparse::detail::check_kv_batch(cache, plan.meta(), H, fn);
    require(lists.dense() == plan.dense(), fn, lists.dense() ? "dense lists (indptr null) but the plan has row lists"
                                                             : "row lists but the plan was made for dense decode");
    require(lists.dense() || (lists.indices != nullptr && lists.lists_per_seq == plan.lists_per_seq()), fn,
            "row lists with a null indices pointer or lists_per_seq = ", lists.lists_per_seq, " (plan: ",
            plan.lists_per_seq(), ")");
    require(q.shape[0] == plan.total_q() && q.shape[1] == H && q.shape[2] == d, fn, "q has shape [", q.shape[0], ", ",
            q.shape[1], ", ", q.shape[2], "], expected [", plan.total_q(), ", ", H, ", ", d, "] (total_q, H, d)");
    require(out.shape == q.shape, fn, "out has shape [", out.shape[0], ", ", out.shape[1], ", ", out.shape[2],
            "], expected [", plan.total_q(), ", ", H, ", ", d, "]");
    require(q.data && out.data, fn, "q and out must be device pointers, got null");
    require(!detail::overlaps_bytes(q.data, detail::span_bytes(q), out.data, detail::span_bytes(out)), fn,
            "output out aliases input q; expected separate buffers");
    require(!probs || plan.with_probs(), fn, "probabilities asked for, but the plan was made without with_probs");
    require(!opt.defer_probs || (plan.with_probs() && !probs), fn,
            "defer_probs keeps the scores in the plan: it needs a plan made with with_probs and no probs array");
    const float scale = ::vlsparse::detail::resolve_scale(AttentionOptions{opt.scale, false}, d, fn);

    const auto dv = plan.device();
    if (opt.check_inputs) {
        // The host cannot see device lists and tables: one block per sequence checks them.
        detail::check_cuda(cudaMemsetAsync(dv.report, 0x7f, 6 * sizeof(long long), stream), fn, "cudaMemsetAsync");
        detail::decode_check_kernel<TC><<<static_cast<unsigned>(plan.batch()), 128, 0, stream>>>(
            cache, lists.indptr, lists.indices, lists.lists_per_seq, dv.seq_lens, dv.list_indptr, dv.q_lens, dv.report);
        detail::check_launch(fn, "decode_check_kernel");
        long long rep[6];
        detail::check_cuda(cudaMemcpyAsync(rep, dv.report, sizeof(rep), cudaMemcpyDeviceToHost, stream), fn,
                           "cudaMemcpyAsync");
        detail::check_cuda(cudaStreamSynchronize(stream), fn, "cudaStreamSynchronize");
        require(rep[0] == 0x7f7f7f7f7f7f7f7fLL, fn, detail::check_message(rep));
    }

    detail::DecodeArgs<TC> a;
    a.q = q.data;
    a.q_s0 = q.stride[0];
    a.q_s1 = q.stride[1];
    a.q_s2 = q.stride[2];
    a.q_type = dtype_of<TQ>();
    a.out = out.data;
    a.o_s0 = out.stride[0];
    a.o_s1 = out.stride[1];
    a.o_s2 = out.stride[2];
    a.o_type = dtype_of<TO>();
    a.cache = cache;
    a.indices = lists.dense() ? nullptr : lists.indices;
    a.items = dv.items;
    a.part = dv.part;
    a.counters = dv.counters;
    a.status = opt.check_finite ? dv.status : nullptr;
    const bool scores = probs || opt.defer_probs;
    a.logits = scores ? dv.logits : nullptr;
    a.stats = scores ? dv.stats : nullptr;
    a.logit_stride = dv.logit_stride;
    a.group = static_cast<int>(H / plan.n_kv_heads());
    a.n_heads = static_cast<int>(H);
    a.head_dim = static_cast<int>(d);
    a.lists_per_seq = lists.lists_per_seq;
    a.scale_log2 = static_cast<float>(static_cast<double>(scale) * 1.4426950408889634);
    const auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
    constexpr std::int64_t pe = 16 / static_cast<std::int64_t>(sizeof(TC));
    a.vec16 = d % pe == 0 && aligned(cache.k) && aligned(cache.v) && cache.page_stride % pe == 0 &&
              cache.row_stride % pe == 0 && cache.head_stride % pe == 0;
    if (cache.block_table && (cache.page_size & (cache.page_size - 1)) == 0)
        for (a.page_shift = 0; (std::int64_t{1} << a.page_shift) < cache.page_size; ++a.page_shift) {}

    if (opt.check_finite) detail::check_cuda(cudaMemsetAsync(dv.status, 0, sizeof(int), stream), fn, "cudaMemsetAsync");
    const int n_items = static_cast<int>(plan.n_items());
    const int nqb = static_cast<int>(plan.query_block());
    constexpr bool mma_type = !std::is_same_v<std::remove_const_t<TC>, float>;
    const bool mma_ok = mma_type && a.vec16 && d <= 128;
    require(opt.kernel != DecodeKernel::tensor_cores || mma_ok, fn,
            "the tensor-core kernel takes bf16 / fp16 caches with head_dim <= 128, a multiple of 8, and 16-byte "
            "aligned rows; this call has none of that or not all");
    if (mma_ok && opt.kernel != DecodeKernel::cuda_cores) {
        if constexpr (mma_type) {
            if (d <= 64) detail::launch_decode_mma_nqb<64>(a, nqb, n_items, stream, fn);
            else if (plan.blocks_per_sm() == 2) detail::launch_decode_mma_nqb<128, 3>(a, nqb, n_items, stream, fn);
            else detail::launch_decode_mma_nqb<128>(a, nqb, n_items, stream, fn);
        }
    } else if (d <= 64) detail::launch_decode_nqb<TC, 64>(a, nqb, n_items, stream, fn);
    else if (d <= 128) detail::launch_decode_nqb<TC, 128>(a, nqb, n_items, stream, fn);
    else detail::launch_decode_nqb<TC, 256>(a, nqb, n_items, stream, fn);

    if (probs && plan.n_entries() > 0) {
        const detail::ProbArgs p = detail::prob_args(plan, probs);
        const auto blocks = static_cast<unsigned>((plan.n_entries() + 255) / 256);
        detail::decode_probs_kernel<><<<blocks, 256, 0, stream>>>(p);
        detail::check_launch(fn, "decode_probs_kernel");
    }
    if (opt.check_finite) {
        int flag = 0;
        detail::check_cuda(cudaMemcpyAsync(&flag, dv.status, sizeof(int), cudaMemcpyDeviceToHost, stream), fn,
                           "cudaMemcpyAsync");
        detail::check_cuda(cudaStreamSynchronize(stream), fn, "cudaStreamSynchronize");
        require(flag == 0, fn, "non-finite attention output: NaN / Inf in q or in a listed K / V row, or an fp32 "
                               "overflow of a score");
    }
}

}  // namespace vlsparse::cuda
