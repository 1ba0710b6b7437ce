// vlsparse/cuda/indexed_decode.cuh -- decode attention over listed cache rows, CUDA path
// (namespace vlsparse::cuda).
//
//   o_h = sum_{t in R_g} softmax_t(scale * q_h . k_{g,t}) v_{g,t},   g = h / (H / H_kv)
//
// The CUDA counterpart of simd::indexed_decode_attention (same semantics, same checks, fp32
// accumulation): one decode query against a KV cache in device memory restricted to row lists, the
// rows read in place by index (never gathered into a copy). Serves ZipVL's decode (every kept row)
// and A-VL's core / secondary steps; dense decode is the same call with every row listed.
//
// Split over the list, flash-decoding style. Kernel 1: one block per (chunk of 64 list entries, KV
// head); each of its 4 warps takes 16 entries, 4 rows at a time (4 K rows and 4 V rows in flight
// per warp), and keeps an online softmax (running max, sum, unnormalized output) for every query
// head of the group; lanes hold d / 32 consecutive columns, so a warp reads a row as one
// contiguous span. The warps' states are merged in shared memory and written as one partial per
// (head, chunk). Kernel 2: one block per query head merges its partials exactly (the same
// max-rescaled sum as the CPU path) and writes the output in its element type. Groups of query
// heads that are not a power of two run as blocks of 8 / 4 / 2 / 1 heads, like the CPU kernels.
//
// Memory: device pointers throughout (q, out, the cache, the row lists); a workspace of
// `indexed_decode_workspace_bytes(...)` bytes is taken from the caller or allocated stream-ordered
// (cudaMallocAsync). Stream-ordered: nothing synchronizes unless `check_finite` is set, which waits
// for the stream and turns a non-finite output (NaN / Inf in the inputs, or fp32 overflow of a
// score) into a vlsparse::error; the CPU path recomputes such heads in double, this one does not.
// Host-side errors (shapes, lists) are vlsparse::error before anything is launched; every CUDA
// status is checked. Include: this header, from a .cu translation unit (nvcc, C++20).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "vlsparse/attention/cache_rows.hpp"
#include "vlsparse/attention/common.hpp"
#include "vlsparse/core/dtype.hpp"
#include "vlsparse/core/error.hpp"
#include "vlsparse/core/tensor.hpp"
#include "vlsparse/kv/kv_cache.hpp"

namespace vlsparse::cuda {

namespace detail {

using ::vlsparse::detail::require;

inline void check_cuda(cudaError_t e, const char* fn, const char* what) {
    require(e == cudaSuccess, fn, what, " failed: ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
}

}  // namespace detail

// A KV cache in device memory: KV head g's row r is K at k + g * head_stride + r * head_dim (V the
// same from v), head_dim contiguous elements. `rows` bounds the row indices every list may name.
template <ElementType T>
struct KvCacheView {
    const T* k = nullptr;
    const T* v = nullptr;
    std::int64_t n_kv_heads = 0, head_dim = 0, head_stride = 0, rows = 0;
};

// An owning device copy of a host KvCache: [H_kv, max rows, d] for K and for V. For tests, the
// simulator and engines that keep their cache on the host; engines with their own device cache
// describe it with a KvCacheView instead.
template <ElementType T>
class DeviceKvCache {
public:
    explicit DeviceKvCache(const KvCache<T>& c) : hkv_(c.n_kv_heads()), d_(c.head_dim()) {
        constexpr const char* fn = "cuda::DeviceKvCache";
        detail::require(hkv_ > 0, fn, "the cache has no KV heads (default-constructed)");
        for (std::int64_t g = 0; g < hkv_; ++g) rows_ = std::max(rows_, c.rows(g));
        const std::size_t per_head = static_cast<std::size_t>(std::max<std::int64_t>(rows_, 1) * d_);
        const std::size_t bytes = per_head * static_cast<std::size_t>(hkv_) * sizeof(T);
        detail::check_cuda(cudaMalloc(&k_, bytes), fn, "cudaMalloc");
        if (cudaMalloc(&v_, bytes) != cudaSuccess) {
            cudaFree(k_);
            detail::check_cuda(cudaErrorMemoryAllocation, fn, "cudaMalloc");
        }
        // Heads shorter than the longest are padded with zero rows (never listed by a checked list).
        detail::check_cuda(cudaMemset(k_, 0, bytes), fn, "cudaMemset");
        detail::check_cuda(cudaMemset(v_, 0, bytes), fn, "cudaMemset");
        for (std::int64_t g = 0; g < hkv_; ++g) {
            const std::size_t n = static_cast<std::size_t>(c.rows(g) * d_) * sizeof(T);
            if (n == 0) continue;
            detail::check_cuda(cudaMemcpy(k_ + g * per_head, c.k(g).data, n, cudaMemcpyHostToDevice), fn, "cudaMemcpy");
            detail::check_cuda(cudaMemcpy(v_ + g * per_head, c.v(g).data, n, cudaMemcpyHostToDevice), fn, "cudaMemcpy");
        }
        stride_ = static_cast<std::int64_t>(per_head);
    }
    DeviceKvCache(const DeviceKvCache&) = delete;
    DeviceKvCache& operator=(const DeviceKvCache&) = delete;
    ~DeviceKvCache() {
        cudaFree(k_);
        cudaFree(v_);
    }
    KvCacheView<T> view() const { return {k_, v_, hkv_, d_, stride_, rows_}; }

private:
    std::int64_t hkv_ = 0, d_ = 0, rows_ = 0, stride_ = 0;
    T* k_ = nullptr;
    T* v_ = nullptr;
};

// Row lists in device memory, CSR: list i is rows[offsets[i] .. offsets[i+1]); n_lists is 1 (one
// list shared by every KV head) or H_kv. max_len (the longest list) sizes the launch; the host
// knows it without reading device memory.
struct RowListsView {
    const std::int64_t* offsets = nullptr;
    const std::int64_t* rows = nullptr;
    std::int64_t n_lists = 0, max_len = 0;
};

// An owning device copy of host CacheRows, checked on the host as the CPU path checks them
// (non-empty, sorted, unique, inside the cache): a view built from one is valid.
class DeviceRowLists {
public:
    // Checked against a device cache view (rows < cache.rows for every head).
    template <ElementType T>
    DeviceRowLists(const CacheRows& lists, const KvCacheView<T>& cache) {
        constexpr const char* fn = "cuda::DeviceRowLists";
        const auto n = static_cast<std::int64_t>(lists.size());
        detail::require(n == 1 || n == cache.n_kv_heads, fn, "got ", n, " row lists, expected 1 (shared) or H_kv = ",
                        cache.n_kv_heads);
        for (std::int64_t i = 0; i < n; ++i) {
            const auto& l = lists[static_cast<std::size_t>(i)];
            detail::require(!l.empty(), fn, "row list ", i, " is empty; expected at least one row");
            for (std::size_t t = 0; t < l.size(); ++t) {
                detail::require(l[t] >= 0 && l[t] < cache.rows, fn, "row list ", i, " entry ", t, " = ", l[t],
                                " is outside the cache's ", cache.rows, " rows");
                detail::require(t == 0 || l[t] > l[t - 1], fn, "row list ", i,
                                " is not sorted ascending without duplicates at entry ", t);
            }
        }
        upload(lists);
    }
    // Checked against the host cache the device copy was made from, exactly as the CPU path checks.
    template <ElementType T>
    DeviceRowLists(const CacheRows& lists, const KvCache<T>& host_cache) {
        ::vlsparse::detail::check_cache_rows(host_cache, lists, "cuda::DeviceRowLists");
        upload(lists);
    }
    DeviceRowLists(const DeviceRowLists&) = delete;
    DeviceRowLists& operator=(const DeviceRowLists&) = delete;
    ~DeviceRowLists() {
        cudaFree(offsets_);
        cudaFree(rows_);
    }
    RowListsView view() const { return {offsets_, rows_, n_lists_, max_len_}; }

private:
    void upload(const CacheRows& lists) {
        constexpr const char* fn = "cuda::DeviceRowLists";
        std::vector<std::int64_t> offsets{0}, flat;
        for (const auto& l : lists) {
            flat.insert(flat.end(), l.begin(), l.end());
            offsets.push_back(static_cast<std::int64_t>(flat.size()));
            max_len_ = std::max(max_len_, static_cast<std::int64_t>(l.size()));
        }
        n_lists_ = static_cast<std::int64_t>(lists.size());
        detail::check_cuda(cudaMalloc(&offsets_, offsets.size() * sizeof(std::int64_t)), fn, "cudaMalloc");
        if (cudaMalloc(&rows_, std::max<std::size_t>(flat.size(), 1) * sizeof(std::int64_t)) != cudaSuccess) {
            cudaFree(offsets_);
            detail::check_cuda(cudaErrorMemoryAllocation, fn, "cudaMalloc");
        }
        detail::check_cuda(cudaMemcpy(offsets_, offsets.data(), offsets.size() * sizeof(std::int64_t), cudaMemcpyHostToDevice),
                           fn, "cudaMemcpy");
        if (!flat.empty())
            detail::check_cuda(cudaMemcpy(rows_, flat.data(), flat.size() * sizeof(std::int64_t), cudaMemcpyHostToDevice),
                               fn, "cudaMemcpy");
    }

    std::int64_t* offsets_ = nullptr;
    std::int64_t* rows_ = nullptr;
    std::int64_t n_lists_ = 0, max_len_ = 0;
};

namespace detail {

inline constexpr int kChunk = 64;     // list entries per block of kernel 1
inline constexpr int kWarps = 4;      // warps per block of kernel 1
inline constexpr int kRowLanes = 8;   // lanes sharing one row: 4 rows per warp step
inline constexpr int kMaxHeadDim = 256;

__device__ __forceinline__ float load_f(const float* p) { return __ldg(p); }
__device__ __forceinline__ float load_f(const half* p) {
    const unsigned short b = __ldg(reinterpret_cast<const unsigned short*>(p));
    return __half2float(__ushort_as_half(b));
}
__device__ __forceinline__ float load_f(const bfloat16* p) {
    const unsigned short b = __ldg(reinterpret_cast<const unsigned short*>(p));
    return __uint_as_float(static_cast<unsigned>(b) << 16);
}

__device__ __forceinline__ void store_f(float* p, float x) { *p = x; }
__device__ __forceinline__ void store_f(half* p, float x) {
    *reinterpret_cast<unsigned short*>(p) = __half_as_ushort(__float2half_rn(x));
}
__device__ __forceinline__ void store_f(bfloat16* p, float x) {
    // Round to nearest even, NaN kept quiet: the same rounding as vlsparse::bfloat16(float).
    unsigned u = __float_as_uint(x);
    unsigned short b;
    if ((u & 0x7fffffffu) > 0x7f800000u) b = static_cast<unsigned short>((u >> 16) | 0x40u);
    else b = static_cast<unsigned short>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    *reinterpret_cast<unsigned short*>(p) = b;
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// 16-byte global -> shared copies, asynchronous on sm_80+ (cp.async; inline PTX rather than
// <cuda_pipeline.h>, whose global namespace `cuda` would clash with vlsparse::cuda in user code).
__device__ __forceinline__ void copy16_async(void* dst_shared, const void* src_global) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst_shared));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(src_global));
#else
    *reinterpret_cast<uint4*>(dst_shared) = *reinterpret_cast<const uint4*>(src_global);
#endif
}
__device__ __forceinline__ void copy_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int Pending>
__device__ __forceinline__ void copy_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending));
#endif
}

// Shared-memory reads of a staged tile (16-byte aligned spans; EPL * sizeof(T) a multiple of 16).
__device__ __forceinline__ float tile_f(const float* p) { return *p; }
__device__ __forceinline__ float tile_f(const bfloat16* p) {
    return __uint_as_float(static_cast<unsigned>(*reinterpret_cast<const unsigned short*>(p)) << 16);
}
__device__ __forceinline__ float tile_f(const half* p) {
    return __half2float(*reinterpret_cast<const __half*>(p));
}
template <int EPL, class T>
__device__ __forceinline__ void load_tile_span(const T* p, float (&x)[EPL]) {
#pragma unroll
    for (int e = 0; e < EPL; ++e) x[e] = tile_f(p + e);
}

// EPL consecutive elements of a row (widened), from p (the lane's first column). Vec: the span is
// 16-byte aligned and EPL * sizeof(T) is a multiple of 16: read as 16-byte vectors.
template <int EPL, bool Vec>
__device__ __forceinline__ void load_span(const float* p, int ncols, float (&x)[EPL]) {
    if constexpr (Vec) {
#pragma unroll
        for (int i = 0; i < EPL / 4; ++i) {
            const float4 f = __ldg(reinterpret_cast<const float4*>(p) + i);
            x[4 * i] = f.x;
            x[4 * i + 1] = f.y;
            x[4 * i + 2] = f.z;
            x[4 * i + 3] = f.w;
        }
    } else {
#pragma unroll
        for (int e = 0; e < EPL; ++e) x[e] = e < ncols ? __ldg(p + e) : 0.0f;
    }
}
// Two 16-bit elements packed in one 32-bit word, widened (element 0 in the low half).
__device__ __forceinline__ float2 widen_pair(unsigned w, const bfloat16*) {
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}
__device__ __forceinline__ float2 widen_pair(unsigned w, const half*) {
    return __half22float2(*reinterpret_cast<const __half2*>(&w));
}
template <int EPL, bool Vec, class T16>
__device__ __forceinline__ void load_span(const T16* p, int ncols, float (&x)[EPL]) {
    static_assert(sizeof(T16) == 2, "16-bit element types only");
    if constexpr (Vec) {
#pragma unroll
        for (int i = 0; i < EPL / 8; ++i) {
            const uint4 u = __ldg(reinterpret_cast<const uint4*>(p) + i);
            const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const float2 f = widen_pair(w[j], p);
                x[8 * i + 2 * j] = f.x;
                x[8 * i + 2 * j + 1] = f.y;
            }
        }
    } else {
#pragma unroll
        for (int e = 0; e < EPL; ++e) x[e] = e < ncols ? load_f(p + e) : 0.0f;
    }
}

// q . row over the 8 lanes that share a row (each holds EPL columns of both): every lane of the
// slot gets the sum.
template <int EPL>
__device__ __forceinline__ float row_dot(const float (&q)[EPL], const float (&k)[EPL]) {
    float x = 0.0f;
#pragma unroll
    for (int e = 0; e < EPL; ++e) x = fmaf(q[e], k[e], x);
#pragma unroll
    for (int o = 1; o < kRowLanes; o <<= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// Kernel 1. Block (chunk c, KV head g) for query heads g * G + a0 .. + GB. Lanes 8 s .. 8 s + 7 of a
// warp share one row (row slot s, 4 rows per warp step); lane j of a slot holds columns
// [j * EPL, j * EPL + EPL). Running max per head is warp-uniform; each lane sums its slot's rows
// (sum and output), and the slots are added at the end.
// Partial layout: part[((h * n_chunks) + c) * (d + 2) + {0: max, 1: sum, 2..: unnormalized out}].
template <int GB, int EPL, bool Vec, class TQ, class TC>
__global__ void __launch_bounds__(kWarps * 32)
    indexed_decode_partial(const TQ* __restrict__ q, std::int64_t q_sh, std::int64_t q_sd, KvCacheView<TC> cache,
                           RowListsView lists, int group, int a0, float scale, int n_chunks, float* __restrict__ part) {
    extern __shared__ float smem[];  // [kWarps][GB][2 + d]
    const int d = static_cast<int>(cache.head_dim);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int slot = lane / kRowLanes, col0 = (lane % kRowLanes) * EPL;
    const int ncols = max(0, min(EPL, d - col0));
    const int c = blockIdx.x, g = blockIdx.y;
    const std::int64_t li = lists.n_lists == 1 ? 0 : g;
    const std::int64_t off = lists.offsets[li], len = lists.offsets[li + 1] - off;
    const std::int64_t t0 = static_cast<std::int64_t>(c) * kChunk, t1 = min(len, t0 + kChunk);

    float qr[GB][EPL];
#pragma unroll
    for (int a = 0; a < GB; ++a)
#pragma unroll
        for (int e = 0; e < EPL; ++e) {
            const std::int64_t h = static_cast<std::int64_t>(g) * group + a0 + a;
            qr[a][e] = e < ncols ? scale * load_f(q + h * q_sh + (col0 + e) * q_sd) : 0.0f;
        }
    constexpr float ninf = -INFINITY;
    float m[GB], l[GB], acc[GB][EPL];
#pragma unroll
    for (int a = 0; a < GB; ++a) {
        m[a] = ninf;
        l[a] = 0.0f;
#pragma unroll
        for (int e = 0; e < EPL; ++e) acc[a][e] = 0.0f;
    }
    const TC* kb = cache.k + g * cache.head_stride + col0;
    const TC* vb = cache.v + g * cache.head_stride + col0;
    const std::int64_t* idx = lists.rows + off;
    constexpr int kRowsPerStep = 32 / kRowLanes;
    // Warp w takes entries t0 + w * 4 + i * 16 (4 rows per step, one per slot).
    for (std::int64_t t = t0 + warp * kRowsPerStep; t < t1; t += kWarps * kRowsPerStep) {
        const bool ok = t + slot < t1;
        const std::int64_t r = ok ? idx[t + slot] : idx[t];
        float kr[EPL], vr[EPL];
        load_span<EPL, Vec>(kb + r * d, ncols, kr);
        load_span<EPL, Vec>(vb + r * d, ncols, vr);
#pragma unroll
        for (int a = 0; a < GB; ++a) {
            const float x = row_dot(qr[a], kr);
            const float sc = ok ? x : ninf;
            float mx = fmaxf(sc, __shfl_xor_sync(0xffffffffu, sc, 8));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
            mx = fmaxf(mx, m[a]);  // warp-uniform; finite unless a score is +-Inf / NaN
            const float p = ok ? expf(sc - mx) : 0.0f;
            if (mx != m[a]) {  // warp-uniform branch: rescale only when the max moves
                const float corr = m[a] == ninf ? 0.0f : expf(m[a] - mx);
                l[a] *= corr;
#pragma unroll
                for (int e = 0; e < EPL; ++e) acc[a][e] *= corr;
                m[a] = mx;
            }
            l[a] += p;
#pragma unroll
            for (int e = 0; e < EPL; ++e) acc[a][e] = fmaf(p, vr[e], acc[a][e]);
        }
    }
    // Add the 4 slots (same running max), then merge the warps in shared memory.
    const int ps = 2 + d;
#pragma unroll
    for (int a = 0; a < GB; ++a) {
        l[a] += __shfl_xor_sync(0xffffffffu, l[a], 8);
        l[a] += __shfl_xor_sync(0xffffffffu, l[a], 16);
#pragma unroll
        for (int e = 0; e < EPL; ++e) {
            acc[a][e] += __shfl_xor_sync(0xffffffffu, acc[a][e], 8);
            acc[a][e] += __shfl_xor_sync(0xffffffffu, acc[a][e], 16);
        }
        float* w = smem + (warp * GB + a) * ps;
        if (lane == 0) {
            w[0] = m[a];
            w[1] = l[a];
        }
        if (slot == 0)
#pragma unroll
            for (int e = 0; e < EPL; ++e)
                if (e < ncols) w[2 + col0 + e] = acc[a][e];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < GB * (d + 2); i += blockDim.x) {
        const int a = i / (d + 2), j = i % (d + 2);
        float M = ninf;
        for (int w = 0; w < kWarps; ++w) M = fmaxf(M, smem[(w * GB + a) * ps]);
        float r = 0.0f;
        if (j == 0) {
            r = M;
        } else if (M != ninf) {
            for (int w = 0; w < kWarps; ++w) {
                const float* sw = smem + (w * GB + a) * ps;
                if (sw[0] != ninf) r += sw[j] * expf(sw[0] - M);
            }
        }
        const std::int64_t h = static_cast<std::int64_t>(g) * group + a0 + a;
        part[(h * n_chunks + c) * (d + 2) + j] = r;
    }
}

// Kernel 1, tiled (rows 16-byte aligned): the block copies its chunk's K rows and V rows into
// shared memory with cp.async (every row of the chunk in flight at once: one round trip to memory
// per block, the V copy overlapping the scores), then computes from shared memory: scores with 8
// lanes per row, the chunk's softmax per head by one warp, and each thread a few (head, column)
// outputs over the chunk's rows. No cross-warp merge: one partial per (head, chunk) directly.
template <int GB, int EPL, class TQ, class TC>
__global__ void __launch_bounds__(kWarps * 32)
    indexed_decode_partial_tiled(const TQ* __restrict__ q, std::int64_t q_sh, std::int64_t q_sd, KvCacheView<TC> cache,
                                 RowListsView lists, int group, int a0, float scale, int n_chunks, float* __restrict__ part) {
    extern __shared__ __align__(16) unsigned char shm[];
    const int d = static_cast<int>(cache.head_dim);
    const int rowbytes = d * static_cast<int>(sizeof(TC));
    TC* ks = reinterpret_cast<TC*>(shm);
    TC* vs = ks + kChunk * d;
    float* sc = reinterpret_cast<float*>(vs + kChunk * d);  // [GB][kChunk] scores, then probabilities
    float* stat = sc + GB * kChunk;                          // [GB][2]: max, sum
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int slot = lane / kRowLanes, col0 = (lane % kRowLanes) * EPL;
    const int c = blockIdx.x, g = blockIdx.y;
    const std::int64_t li = lists.n_lists == 1 ? 0 : g;
    const std::int64_t off = lists.offsets[li], len = lists.offsets[li + 1] - off;
    const std::int64_t t0 = static_cast<std::int64_t>(c) * kChunk;
    const int cnt = static_cast<int>(max(std::int64_t{0}, min(len - t0, std::int64_t{kChunk})));
    constexpr float ninf = -INFINITY;
    if (cnt == 0) {  // a chunk past this head's list: an empty partial
        for (int i = threadIdx.x; i < GB * (d + 2); i += blockDim.x) {
            const int a = i / (d + 2), j = i % (d + 2);
            const std::int64_t h = static_cast<std::int64_t>(g) * group + a0 + a;
            part[(h * n_chunks + c) * (d + 2) + j] = j == 0 ? ninf : 0.0f;
        }
        return;
    }
    // The chunk's row indices into shared memory first (one coalesced load), so that issuing the
    // copies waits on no global load.
    __shared__ std::int64_t idx[kChunk];
    for (int r = threadIdx.x; r < cnt; r += blockDim.x) idx[r] = lists.rows[off + t0 + r];
    __syncthreads();
    const char* kg = reinterpret_cast<const char*>(cache.k + g * cache.head_stride);
    const char* vg = reinterpret_cast<const char*>(cache.v + g * cache.head_stride);
    const int pieces = rowbytes / 16;
    for (int i = threadIdx.x; i < cnt * pieces; i += blockDim.x) {
        const int r = i / pieces, p = i % pieces;
        copy16_async(reinterpret_cast<char*>(ks) + r * rowbytes + p * 16, kg + idx[r] * rowbytes + p * 16);
    }
    copy_commit();
    for (int i = threadIdx.x; i < cnt * pieces; i += blockDim.x) {
        const int r = i / pieces, p = i % pieces;
        copy16_async(reinterpret_cast<char*>(vs) + r * rowbytes + p * 16, vg + idx[r] * rowbytes + p * 16);
    }
    copy_commit();
    float qr[GB][EPL];
#pragma unroll
    for (int a = 0; a < GB; ++a)
#pragma unroll
        for (int e = 0; e < EPL; ++e) {
            const std::int64_t h = static_cast<std::int64_t>(g) * group + a0 + a;
            qr[a][e] = scale * load_f(q + h * q_sh + (col0 + e) * q_sd);
        }
    copy_wait<1>();  // K tile
    __syncthreads();
    // Scores: warp w takes rows w * 4 + i * 16, one per slot of 8 lanes.
    for (int t = warp * 4 + slot; t - slot < cnt; t += kWarps * 4) {
        const bool ok = t < cnt;
        float kr[EPL];
        load_tile_span<EPL>(ks + (ok ? t : 0) * d + col0, kr);
#pragma unroll
        for (int a = 0; a < GB; ++a) {
            const float x = row_dot(qr[a], kr);
            if (ok && (lane % kRowLanes) == 0) sc[a * kChunk + t] = x;
        }
    }
    __syncthreads();
    // Softmax of the chunk per head: warp w takes heads w, w + 4, ...
    for (int a = warp; a < GB; a += kWarps) {
        float* sa = sc + a * kChunk;
        float mx = ninf;
        for (int t = lane; t < cnt; t += 32) mx = fmaxf(mx, sa[t]);
        for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        float sum = 0.0f;
        for (int t = lane; t < cnt; t += 32) {
            const float p = expf(sa[t] - mx);
            sa[t] = p;
            sum += p;
        }
        sum = warp_sum(sum);
        if (lane == 0) {
            stat[2 * a] = mx;
            stat[2 * a + 1] = sum;
        }
    }
    copy_wait<0>();  // V tile
    __syncthreads();
    // Each thread one column for every head of the block: a V element read once serves GB heads.
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        float o[GB];
#pragma unroll
        for (int a = 0; a < GB; ++a) o[a] = 0.0f;
        for (int t = 0; t < cnt; ++t) {
            const float v = tile_f(vs + t * d + j);
#pragma unroll
            for (int a = 0; a < GB; ++a) o[a] = fmaf(sc[a * kChunk + t], v, o[a]);
        }
#pragma unroll
        for (int a = 0; a < GB; ++a) {
            const std::int64_t h = static_cast<std::int64_t>(g) * group + a0 + a;
            float* dst = part + (h * n_chunks + c) * (d + 2);
            dst[2 + j] = o[a];
            if (j == 0) {
                dst[0] = stat[2 * a];
                dst[1] = stat[2 * a + 1];
            }
        }
    }
}

// Kernel 2. Block h merges head h's partials and writes out[h, :]; flags a non-finite result. Warp w
// takes chunks w, w + 8, ... (lanes across the columns, independent loads in flight), weighting
// each by exp(max_c - M); the 8 warps' sums are added in shared memory.
inline constexpr int kMergeWarps = 8;

template <class TO>
__global__ void __launch_bounds__(kMergeWarps * 32)
    indexed_decode_merge(const float* __restrict__ part, int n_chunks, int d, TO* out, std::int64_t o_sh,
                         std::int64_t o_sd, int* status) {
    __shared__ float red[kMergeWarps];
    __shared__ float o_part[kMergeWarps][kMaxHeadDim];
    __shared__ float l_part[kMergeWarps];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const std::int64_t h = blockIdx.x;
    const int ps = d + 2;
    const float* ph = part + h * n_chunks * ps;
    constexpr float ninf = -INFINITY;
    float M = ninf;
    for (int c = threadIdx.x; c < n_chunks; c += blockDim.x) M = fmaxf(M, ph[c * ps]);
    for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
    if (lane == 0) red[warp] = M;
    __syncthreads();
    M = red[0];
    for (int w = 1; w < kMergeWarps; ++w) M = fmaxf(M, red[w]);
    constexpr int kCols = kMaxHeadDim / 32;
    float acc[kCols];
#pragma unroll
    for (int k = 0; k < kCols; ++k) acc[k] = 0.0f;
    float lsum = 0.0f;
#pragma unroll 4
    for (int c = warp; c < n_chunks; c += kMergeWarps) {
        const float* pc = ph + c * ps;
        const float mc = pc[0];
        const float wt = mc == ninf ? 0.0f : expf(mc - M);
        lsum = fmaf(wt, pc[1], lsum);
#pragma unroll
        for (int k = 0; k < kCols; ++k) {
            const int j = lane + 32 * k;
            if (j < d) acc[k] = fmaf(wt, pc[2 + j], acc[k]);
        }
    }
#pragma unroll
    for (int k = 0; k < kCols; ++k) {
        const int j = lane + 32 * k;
        if (j < d) o_part[warp][j] = acc[k];
    }
    if (lane == 0) l_part[warp] = lsum;
    __syncthreads();
    float L = 0.0f;
    for (int w = 0; w < kMergeWarps; ++w) L += l_part[w];
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        float o = 0.0f;
        for (int w = 0; w < kMergeWarps; ++w) o += o_part[w][j];
        o /= L;
        if (!isfinite(o) && status) atomicOr(status, 1);
        store_f(out + h * o_sh + j * o_sd, o);
    }
}

template <int GB, int EPL, class TQ, class TC>
void launch_partial(const View2<const TQ>& q, const KvCacheView<TC>& cache, const RowListsView& lists, int group,
                    int a0, float scale, int n_chunks, float* part, cudaStream_t stream) {
    const dim3 grid(static_cast<unsigned>(n_chunks), static_cast<unsigned>(cache.n_kv_heads));
    const std::size_t shm = static_cast<std::size_t>(kWarps * GB * (cache.head_dim + 2)) * sizeof(float);
    // 16-byte vector loads when every lane's span is whole and aligned.
    const auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
    const bool vec = (EPL * sizeof(TC)) % 16 == 0 && cache.head_dim == kRowLanes * EPL && aligned(cache.k) &&
                     aligned(cache.v) && (cache.head_stride * static_cast<std::int64_t>(sizeof(TC))) % 16 == 0;
    if (vec) {
        const std::size_t tile = static_cast<std::size_t>(2 * kChunk * cache.head_dim) * sizeof(TC) +
                                 static_cast<std::size_t>(GB * kChunk + 2 * GB) * sizeof(float);
        auto* kernel = indexed_decode_partial_tiled<GB, EPL, TQ, TC>;
        if (tile > 48 * 1024)
            check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(tile)),
                       "cuda::indexed_decode_attention", "cudaFuncSetAttribute");
        kernel<<<grid, kWarps * 32, tile, stream>>>(q.data, q.stride[0], q.stride[1], cache, lists, group, a0, scale,
                                                    n_chunks, part);
    } else
        indexed_decode_partial<GB, EPL, false, TQ, TC><<<grid, kWarps * 32, shm, stream>>>(
            q.data, q.stride[0], q.stride[1], cache, lists, group, a0, scale, n_chunks, part);
}

// Heads in blocks of a power of two, at most 64 / EPL (q and the outputs stay in registers).
template <int EPL, class TQ, class TC>
void launch_partial_heads(const View2<const TQ>& q, const KvCacheView<TC>& cache, const RowListsView& lists, int group,
                          float scale, int n_chunks, float* part, cudaStream_t stream) {
    constexpr int cap = std::min(8, 64 / EPL);
    for (int a0 = 0; a0 < group;) {
        const int left = std::min(group - a0, cap);
        const int gb = left >= 8 ? 8 : left >= 4 ? 4 : left >= 2 ? 2 : 1;
        switch (gb) {
            case 8: if constexpr (cap >= 8) launch_partial<8, EPL>(q, cache, lists, group, a0, scale, n_chunks, part, stream); break;
            case 4: if constexpr (cap >= 4) launch_partial<4, EPL>(q, cache, lists, group, a0, scale, n_chunks, part, stream); break;
            case 2: launch_partial<2, EPL>(q, cache, lists, group, a0, scale, n_chunks, part, stream); break;
            default: launch_partial<1, EPL>(q, cache, lists, group, a0, scale, n_chunks, part, stream); break;
        }
        a0 += gb;
    }
}

inline int n_chunks_for(std::int64_t max_len) { return static_cast<int>((max_len + kChunk - 1) / kChunk); }

}  // namespace detail

// Bytes of device workspace one call needs: H x ceil(longest list / 64) partials of d + 2 floats,
// plus a status word.
inline std::size_t indexed_decode_workspace_bytes(std::int64_t H, std::int64_t head_dim, std::int64_t max_len) {
    return static_cast<std::size_t>(H * detail::n_chunks_for(max_len) * (head_dim + 2)) * sizeof(float) + 256;
}

// One decode step over the listed rows. q [H, d] and out [H, d]: device views (any strides); the
// cache and lists: device. workspace: null (allocated on the stream) or indexed_decode_workspace_bytes.
template <ElementType TQ, ElementType TC, ElementType TO>
void indexed_decode_attention(View2<const TQ> q, const KvCacheView<TC>& cache, const RowListsView& lists,
                              View2<TO> out, const AttentionOptions& opt = {}, cudaStream_t stream = nullptr,
                              void* workspace = nullptr) {
    constexpr const char* fn = "cuda::indexed_decode_attention";
    using ::vlsparse::detail::require;
    const std::int64_t H = q.shape[0], d = q.shape[1], Hkv = cache.n_kv_heads;
    require(Hkv > 0 && cache.k && cache.v, fn, "the cache view is empty; expected H_kv > 0 and K / V pointers");
    require(H > 0 && d == cache.head_dim, fn, "q has shape [", H, ", ", d, "], expected [H, ", cache.head_dim,
            "] with H > 0");
    require(d >= 1 && d <= detail::kMaxHeadDim, fn, "head_dim = ", d, "; the CUDA path supports 1..", detail::kMaxHeadDim);
    require(H % Hkv == 0, fn, "H = ", H, " query heads is not a multiple of the cache's H_kv = ", Hkv);
    require(cache.head_stride >= cache.rows * d, fn, "head_stride = ", cache.head_stride, " is smaller than rows x head_dim = ",
            cache.rows * d);
    require(out.shape == q.shape, fn, "out has shape [", out.shape[0], ", ", out.shape[1], "], expected [", H, ", ", d, "]");
    require(q.data && out.data, fn, "q and out must be device pointers, got null");
    require(lists.offsets && lists.rows && lists.max_len > 0, fn, "the row lists are empty; expected at least one row");
    require(lists.n_lists == 1 || lists.n_lists == Hkv, fn, "got ", lists.n_lists, " row lists, expected 1 (shared) or H_kv = ", Hkv);
    const float scale = opt.scale != 0.0f ? opt.scale : 1.0f / std::sqrt(static_cast<float>(d));
    require(std::isfinite(scale) && scale > 0.0f, fn, "scale = ", scale, ", expected a finite value > 0 (or 0 for 1/sqrt(d))");

    const int n_chunks = detail::n_chunks_for(lists.max_len);
    const std::size_t need = indexed_decode_workspace_bytes(H, d, lists.max_len);
    void* ws = workspace;
    if (!ws) detail::check_cuda(cudaMallocAsync(&ws, need, stream), fn, "cudaMallocAsync");
    float* part = static_cast<float*>(ws);
    int* status = reinterpret_cast<int*>(static_cast<char*>(ws) + need - 256);
    if (opt.check_finite) detail::check_cuda(cudaMemsetAsync(status, 0, sizeof(int), stream), fn, "cudaMemsetAsync");
    const int group = static_cast<int>(H / Hkv);
    if (d <= 32)
        detail::launch_partial_heads<4>(q, cache, lists, group, scale, n_chunks, part, stream);
    else if (d <= 64)
        detail::launch_partial_heads<8>(q, cache, lists, group, scale, n_chunks, part, stream);
    else if (d <= 128)
        detail::launch_partial_heads<16>(q, cache, lists, group, scale, n_chunks, part, stream);
    else
        detail::launch_partial_heads<32>(q, cache, lists, group, scale, n_chunks, part, stream);
    detail::check_cuda(cudaGetLastError(), fn, "kernel launch (partials)");
    detail::indexed_decode_merge<TO><<<static_cast<unsigned>(H), detail::kMergeWarps * 32, 0, stream>>>(
        part, n_chunks, static_cast<int>(d), out.data, out.stride[0], out.stride[1], opt.check_finite ? status : nullptr);
    detail::check_cuda(cudaGetLastError(), fn, "kernel launch (merge)");
    int flag = 0;
    if (opt.check_finite)
        detail::check_cuda(cudaMemcpyAsync(&flag, status, sizeof(int), cudaMemcpyDeviceToHost, stream), fn, "cudaMemcpyAsync");
    if (!workspace) detail::check_cuda(cudaFreeAsync(ws, stream), fn, "cudaFreeAsync");
    if (opt.check_finite) {
        detail::check_cuda(cudaStreamSynchronize(stream), fn, "cudaStreamSynchronize");
        require(flag == 0, fn, "non-finite attention output: NaN / Inf in q or in a listed K / V row, or an fp32 overflow "
                               "of a score (the CPU path recomputes such heads in double; this path does not)");
    }
}

}  // namespace vlsparse::cuda
