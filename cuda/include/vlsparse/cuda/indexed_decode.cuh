// vlsparse/cuda/indexed_decode.cuh -- one sequence's decode attention over listed cache rows, CUDA
// path (namespace vlsparse::cuda): the single-sequence front end of vlsparse/cuda/decode.cuh.
//
//   o_h = sum_{t in R_g} softmax_t(scale * q_h . k_{g,t}) v_{g,t},   g = h / (H / H_kv)
//
// The CUDA counterpart of simd::indexed_decode_attention (same semantics, same host checks, fp32
// accumulation) for callers that hold one sequence: a host KvCache copied to the device
// (DeviceKvCache) or an engine's own device cache described by a KvBatchView of batch 1, and host
// CacheRows copied to the device as CSR (DeviceRowLists, checked as the CPU path checks them). Each
// call plans (DecodePlan) and launches the batched kernel; engines that decode every step keep a
// DecodePlan and call cuda::batched_decode_attention themselves, which plans once for all layers.
// Include: this header, from a .cu translation unit (nvcc, C++20).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
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
        for (std::int64_t g = 0; g < hkv_; ++g) rows_ = std::max(rows_, c.rows(g));
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
    std::int64_t rows() const { return rows_; }

private:
    std::int64_t hkv_ = 0, d_ = 0, rows_ = 0;
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
    DeviceRowLists(const CacheRows& lists, const KvCache<T>& host_cache) {
        ::vlsparse::detail::check_cache_rows(host_cache, lists, "cuda::DeviceRowLists");
        upload(lists);
    }
    // Checked against a batch-of-one device cache whose KV heads hold `rows` rows each (given on the host).
    DeviceRowLists(const CacheRows& lists, std::int64_t n_kv_heads, std::int64_t rows) {
        ::vlsparse::detail::check_cache_rows(lists, n_kv_heads, [rows](std::int64_t) { return rows; },
                                             "cuda::DeviceRowLists");
        upload(lists);
    }
    BatchRowLists view() const { return {indptr_d_.data(), rows_d_.data(), lists_per_seq_}; }
    std::span<const std::int32_t> host_indptr() const { return indptr_; }
    std::int32_t lists_per_seq() const { return lists_per_seq_; }
    std::int64_t longest() const { return longest_; }

private:
    void upload(const CacheRows& lists) {
        indptr_.assign(lists.indptr().begin(), lists.indptr().end());
        longest_ = lists.longest();
        lists_per_seq_ = static_cast<std::int32_t>(lists.lists());
        indptr_d_ = DeviceArray<std::int32_t>(indptr_);
        rows_d_ = DeviceArray<std::int32_t>(lists.indices());
    }

    std::vector<std::int32_t> indptr_;
    DeviceArray<std::int32_t> indptr_d_, rows_d_;
    std::int32_t lists_per_seq_ = 1;
    std::int64_t longest_ = 0;
};

// One decode step over the listed rows of one sequence. q [H, d] and out [H, d]: device views (any
// strides); cache: a batch-of-one device view (DeviceKvCache::view() or an engine's own); lists: its
// rows. Plans and launches; with opt.check_finite (default), waits and reports a non-finite output.
template <ElementType TQ, ElementType TC, ElementType TO>
void indexed_decode_attention(View2<const TQ> q, const KvBatchView<const TC>& cache, const DeviceRowLists& lists,
                              View2<TO> out, const AttentionOptions& opt = {}, cudaStream_t stream = nullptr) {
    constexpr const char* fn = "cuda::indexed_decode_attention";
    detail::require(cache.batch == 1, fn, "the cache view holds ", cache.batch, " sequences; this front end takes one "
                                          "(use cuda::batched_decode_attention for batches)");
    detail::require(q.shape[1] == cache.head_dim && q.shape[0] >= 1, fn, "q has shape [", q.shape[0], ", ", q.shape[1],
                    "], expected [H, ", cache.head_dim, "] with H > 0");
    std::int32_t len = 0;
    detail::check_cuda(cudaMemcpyAsync(&len, cache.seq_lens, sizeof(len), cudaMemcpyDeviceToHost, stream), fn,
                       "cudaMemcpyAsync");
    detail::check_cuda(cudaStreamSynchronize(stream), fn, "cudaStreamSynchronize");
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
    detail::require(out.shape == q.shape, fn, "out has shape [", out.shape[0], ", ", out.shape[1], "], expected [",
                    q.shape[0], ", ", q.shape[1], "]");
    batched_decode_attention(plan, q3, cache, lists.view(), o3, o, stream);
    // The plan's buffers are freed when it goes out of scope: let the launch finish first.
    detail::check_cuda(cudaStreamSynchronize(stream), fn, "cudaStreamSynchronize");
}

}  // namespace vlsparse::cuda
