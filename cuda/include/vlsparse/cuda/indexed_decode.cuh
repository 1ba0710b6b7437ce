// vlsparse/cuda/indexed_decode.cuh -- one sequence's decode attention over listed cache rows, CUDA
// path (namespace vlsparse::cuda): the single-sequence front end of vlsparse/cuda/decode.cuh.
//
//   o_h = sum_{t in R_g} softmax_t(scale * q_h . k_{g,t}) v_{g,t},   g = h / (H / H_kv)
//
// The CUDA counterpart of simd::indexed_decode_attention (same semantics, same host checks, fp32
// accumulation) for callers that hold one sequence: a host KvCache copied to the device
// (DeviceKvCache) or an engine's own device cache described by a KvBatchView of batch 1, and host
// CacheRows copied to the device as CSR (DeviceRowLists, checked as the CPU path checks them). The
// lists are given either as a DeviceRowLists made once, or as the CacheRows the reference and the CPU
// path take (checked and copied in the call). Each call plans (DecodePlan) and launches the batched
// kernel; engines that decode every step keep a DecodePlan and call cuda::batched_decode_attention
// themselves, which plans once for all layers.
// Include: this header, from a .cu translation unit (nvcc, C++20).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <span>
#include <type_traits>
#include <vector>

#include "vlsparse/attention/cache_rows.hpp"
#include "vlsparse/attention/common.hpp"
#include "vlsparse/core/tensor.hpp"
#include "vlsparse/cuda/common.cuh"
#include "vlsparse/cuda/decode.cuh"
#include "vlsparse/kv/kv_batch.hpp"
#include "vlsparse/kv/kv_cache.hpp"

namespace vlsparse::cuda {

// An owning device copy of a host KvCache as a batch of one sequence: K and V [H_kv, rows, d] (HND,
// one "page" holding the whole sequence), rows = the longest KV head's (shorter heads padded with
// zero rows that no checked list names).
template <ElementType T>
class DeviceKvCache {
public:
    explicit DeviceKvCache(const KvCache<T>& c) : hkv_(c.n_kv_heads()), d_(c.head_dim()) {
        constexpr const char* fn = "cuda::DeviceKvCache";
        detail::require(hkv_ > 0, fn, "the cache has no KV heads (default-constructed)");
        for (std::int64_t g = 0; g < hkv_; ++g) head_rows_.push_back(c.rows(g));
        rows_ = *std::max_element(head_rows_.begin(), head_rows_.end());
        detail::require(rows_ >= 1 && rows_ <= std::numeric_limits<std::int32_t>::max(), fn, "the cache holds ", rows_,
                        " rows; expected 1 .. 2^31 - 1");
        const std::size_t per_head = static_cast<std::size_t>(rows_ * d_);
        std::vector<T> k(per_head * static_cast<std::size_t>(hkv_), from_float<T>(0.0f)), v(k);
        for (std::int64_t g = 0; g < hkv_; ++g) {
            std::copy_n(c.k(g).data, c.rows(g) * d_, k.begin() + static_cast<std::ptrdiff_t>(g * rows_ * d_));
            std::copy_n(c.v(g).data, c.rows(g) * d_, v.begin() + static_cast<std::ptrdiff_t>(g * rows_ * d_));
        }
        k_ = DeviceArray<T>(k);
        v_ = DeviceArray<T>(v);
        const std::vector<std::int32_t> len{static_cast<std::int32_t>(rows_)};
        len_ = DeviceArray<std::int32_t>(len);
    }
    // Batch of one: row r of KV head g at g * rows * d + r * d.
    KvBatchView<const T> view() const {
        return {k_.data(), v_.data(), 1, static_cast<std::int32_t>(hkv_), static_cast<std::int32_t>(d_), rows_, 0, d_,
                rows_ * d_, 0, nullptr, 0, len_.data()};
    }
    // Rows of the device copy (the longest KV head's), and the rows KV head g holds (as KvCache::rows(g)):
    // lists are checked against the latter, so a padding row is never read.
    std::int64_t rows() const { return rows_; }
    std::int64_t rows(std::int64_t g) const {
        detail::require(g >= 0 && g < hkv_, "cuda::DeviceKvCache::rows", "KV head ", g, ", expected 0 <= g < ", hkv_);
        return head_rows_[static_cast<std::size_t>(g)];
    }
    std::int64_t n_kv_heads() const { return hkv_; }

private:
    std::int64_t hkv_ = 0, d_ = 0, rows_ = 0;
    std::vector<std::int64_t> head_rows_;  // [H_kv], host
    DeviceArray<T> k_, v_;
    DeviceArray<std::int32_t> len_;
};

// An owning device copy of host CacheRows (the same CSR arrays: two copies, no conversion), the
// BatchRowLists of batch 1 a decode step reads; checked on the host first by the check of every
// backend (detail::check_cache_rows); keeps the host indptr a plan needs.
class DeviceRowLists {
public:
    // Checked against the host cache the device copy was made from.
    template <ElementType T>
    DeviceRowLists(const CacheRows& lists, const KvCache<T>& host_cache)
        : DeviceRowLists(lists, host_cache.n_kv_heads(), [&](std::int64_t g) { return host_cache.rows(g); }) {}
    // Checked against a batch-of-one device cache whose KV heads hold `rows` rows each (given on the host).
    DeviceRowLists(const CacheRows& lists, std::int64_t n_kv_heads, std::int64_t rows)
        : DeviceRowLists(lists, n_kv_heads, [rows](std::int64_t) { return rows; }) {}
    // Checked against a cache of n_kv_heads KV heads, KV head g holding rows_of(g) rows; errors name
    // `fn`. The arrays are copied on `stream` (a launch on the same stream reads them complete), or
    // synchronously when `stream` is null.
    template <class RowsOf>
        requires std::is_invocable_r_v<std::int64_t, const RowsOf&, std::int64_t>
    DeviceRowLists(const CacheRows& lists, std::int64_t n_kv_heads, const RowsOf& rows_of,
                   const char* fn = "cuda::DeviceRowLists", cudaStream_t stream = nullptr) {
        ::vlsparse::detail::check_cache_rows(lists, n_kv_heads, rows_of, fn);
        indptr_.assign(lists.indptr().begin(), lists.indptr().end());
        longest_ = lists.longest();
        lists_per_seq_ = static_cast<std::int32_t>(lists.lists());
        indptr_d_ = DeviceArray<std::int32_t>(indptr_.size());
        rows_d_ = DeviceArray<std::int32_t>(static_cast<std::size_t>(lists.total()));
        copy(indptr_d_, lists.indptr(), stream, fn);
        copy(rows_d_, lists.indices(), stream, fn);
    }
    BatchRowLists view() const { return {indptr_d_.data(), rows_d_.data(), lists_per_seq_}; }
    std::span<const std::int32_t> host_indptr() const { return indptr_; }
    std::int32_t lists_per_seq() const { return lists_per_seq_; }
    std::int64_t longest() const { return longest_; }

private:
    // From pageable host memory: the host side is staged before the call returns, so `host` may go. With
    // no stream the copy is synchronous, so the lists can then be read from any stream (an asynchronous
    // copy on the legacy default stream would not order a launch on a non-blocking stream).
    static void copy(DeviceArray<std::int32_t>& dst, std::span<const std::int32_t> host, cudaStream_t stream,
                     const char* fn) {
        if (host.empty()) return;
        if (stream == nullptr)
            detail::check_cuda(cudaMemcpy(dst.data(), host.data(), host.size_bytes(), cudaMemcpyHostToDevice), fn,
                               "cudaMemcpy");
        else
            detail::check_cuda(cudaMemcpyAsync(dst.data(), host.data(), host.size_bytes(), cudaMemcpyHostToDevice, stream),
                               fn, "cudaMemcpyAsync");
    }

    std::vector<std::int32_t> indptr_;
    DeviceArray<std::int32_t> indptr_d_, rows_d_;
    std::int32_t lists_per_seq_ = 1;
    std::int64_t longest_ = 0;
};

namespace detail {

// The front end's checks that read nothing on the device: a batch of one, q [H, d] with the cache's
// head_dim, out of q's shape. The rest (H against H_kv, the head_dim limit, the layout) is the plan's.
template <class TQ, class TC, class TO>
void check_single_sequence(const View2<const TQ>& q, const KvBatchView<const TC>& cache, const View2<TO>& out,
                           const char* fn) {
    require(cache.batch == 1, fn, "the cache view holds ", cache.batch, " sequences; this front end takes one "
                                  "(use cuda::batched_decode_attention for batches)");
    require(q.shape[1] == cache.head_dim && q.shape[0] >= 1, fn, "q has shape [", q.shape[0], ", ", q.shape[1],
            "], expected [H, ", cache.head_dim, "] with H > 0");
    require(out.shape == q.shape, fn, "out has shape [", out.shape[0], ", ", out.shape[1], "], expected [", q.shape[0],
            ", ", q.shape[1], "]");
    require(cache.seq_lens != nullptr, fn, "the cache view has a null seq_lens pointer");
}

// The sequence's length, cache.seq_lens[0] in DEVICE memory: one copy and one synchronization of
// `stream` (the plan needs it on the host).
template <class TC>
std::int32_t sequence_length(const KvBatchView<const TC>& cache, cudaStream_t stream, const char* fn) {
    std::int32_t len = 0;
    check_cuda(cudaMemcpyAsync(&len, cache.seq_lens, sizeof(len), cudaMemcpyDeviceToHost, stream), fn,
               "cudaMemcpyAsync");
    check_cuda(cudaStreamSynchronize(stream), fn, "cudaStreamSynchronize");
    return len;
}

// The step of every overload, after its checks: plans for one sequence of `len` rows, launches, waits.
template <class TQ, class TC, class TO>
void indexed_decode(const View2<const TQ>& q, const KvBatchView<const TC>& cache, std::int32_t len,
                    const DeviceRowLists& lists, const View2<TO>& out, const AttentionOptions& opt,
                    cudaStream_t stream, const char* fn) {
    const std::vector<std::int32_t> lens{len};
    DecodePlan plan;
    plan.plan({lens, {}, lists.host_indptr(), lists.lists_per_seq()}, q.shape[0], cache.n_kv_heads, cache.head_dim,
              false, stream, dtype_of<TC>());
    DecodeOptions o;
    o.scale = opt.scale;
    o.check_finite = opt.check_finite;
    o.check_inputs = false;  // the lists were checked on the host when they were built
    const View3<const TQ> q3(q.data, {1, q.shape[0], q.shape[1]}, {0, q.stride[0], q.stride[1]});
    const View3<TO> o3(out.data, {1, out.shape[0], out.shape[1]}, {0, out.stride[0], out.stride[1]});
    batched_decode_attention(plan, q3, cache, lists.view(), o3, o, stream);
    // The plan's buffers (and a caller's temporary lists) are freed when they go out of scope: let the
    // launch finish first.
    check_cuda(cudaStreamSynchronize(stream), fn, "cudaStreamSynchronize");
}

}  // namespace detail

// One decode step over the listed rows of one sequence. q [H, d] and out [H, d]: device views (any
// strides); cache: a batch-of-one device view (DeviceKvCache::view() or an engine's own); lists: its
// rows. Plans and launches; with opt.check_finite (default), waits and reports a non-finite output.
template <ElementType TQ, ElementType TC, ElementType TO>
void indexed_decode_attention(View2<const TQ> q, const KvBatchView<const TC>& cache, const DeviceRowLists& lists,
                              View2<TO> out, const AttentionOptions& opt = {}, cudaStream_t stream = nullptr) {
    constexpr const char* fn = "cuda::indexed_decode_attention";
    detail::check_single_sequence(q, cache, out, fn);
    detail::indexed_decode(q, cache, detail::sequence_length(cache, stream, fn), lists, out, opt, stream, fn);
}

// Same, with the rows as host CacheRows, the type reference:: and simd::indexed_decode_attention take:
// checked by the check of every backend (detail::check_cache_rows; every KV head holds
// cache.seq_lens[0] rows, read from the device) and copied to the device on `stream` for this call.
// A caller that reads the same lists in several calls builds a DeviceRowLists once instead.
template <ElementType TQ, ElementType TC, ElementType TO>
void indexed_decode_attention(View2<const TQ> q, const KvBatchView<const TC>& cache, const CacheRows& rows,
                              View2<TO> out, const AttentionOptions& opt = {}, cudaStream_t stream = nullptr) {
    constexpr const char* fn = "cuda::indexed_decode_attention";
    detail::check_single_sequence(q, cache, out, fn);
    const std::int32_t len = detail::sequence_length(cache, stream, fn);
    const DeviceRowLists lists(rows, cache.n_kv_heads, [len](std::int64_t) { return std::int64_t{len}; }, fn, stream);
    detail::indexed_decode(q, cache, len, lists, out, opt, stream, fn);
}

// Same, over the device copy of a host KvCache: the lists are checked against the rows each KV head
// holds in the host cache (DeviceKvCache::rows(g)), as reference::indexed_decode_attention checks them
// against the KvCache itself, so a list never names a padding row of a shorter head.
template <ElementType TQ, ElementType TC, ElementType TO>
void indexed_decode_attention(View2<const TQ> q, const DeviceKvCache<TC>& cache, const CacheRows& rows, View2<TO> out,
                              const AttentionOptions& opt = {}, cudaStream_t stream = nullptr) {
    constexpr const char* fn = "cuda::indexed_decode_attention";
    const KvBatchView<const TC> view = cache.view();
    detail::check_single_sequence(q, view, out, fn);
    const DeviceRowLists lists(rows, cache.n_kv_heads(), [&cache](std::int64_t g) { return cache.rows(g); }, fn,
                               stream);
    // The copy's length (the longest KV head's) is known on the host: no device read.
    detail::indexed_decode(q, view, static_cast<std::int32_t>(cache.rows()), lists, out, opt, stream, fn);
}

}  // namespace vlsparse::cuda
