// vlsparse/cuda/prefill.cuh -- prefill attention on the GPU's tensor cores (namespace vlsparse::cuda):
// dense causal, token-sparse over index lists (ZipVL), and block-sparse from per-head mask templates
// (BlindSight's templates, PureKV's spatial-temporal video masks). The same equations as the
// reference (vlsparse/reference/attention.hpp, reference::masked_attention):
//
//   out[i,h] = sum_{j allowed for (i, h)} softmax_j(scale * q_{i,h} . k_{j,g}) v_{j,g},   g = h / (H / H_kv)
//
//   dense_prefill_attention(q, k, v, out, opt, stream)            allowed: j <= pos(i) = n_k - n_q + i
//   sparse_prefill_attention(q, k, v, lists, out, unselected, ...)  ZipVL: i and j in T_g, j <= i; rows not
//                                                                   in T_g zero or attending to T_g's keys
//                                                                   at or before them (UnselectedRows)
//   MaskedPrefillPlan plan(ctx, heads, H_kv);                      once per prompt (every layer reuses it)
//   masked_prefill_attention(plan, q, k, v, out, opt, stream)      allowed: ctx.allows(heads[h], i, j)
//
// q [n_q, H, d], k, v [n_k, H_kv, d], out [n_q, H, d] are device views, q, k, v of one type with unit
// inner stride; out fp32, fp16 or bf16, any strides. Two kernels behind every front end:
//   - tensor cores (prefill/kernels_mma.cuh) for bf16 / fp16 inputs with head_dim 64 or 128, rows
//     16-byte aligned: wgmma on Hopper where the binary holds sm_90a code, mma.sync elsewhere
//     (PrefillOptions::kernel); fp32 accumulation, P rounded to the input type as in FlashAttention;
//   - CUDA cores (prefill/kernels_simt.cuh) for fp32 inputs and any other head_dim up to 256, or for
//     any input with PrefillKernel::simt: everything in fp32, far slower on long prompts.
// The dense and token-sparse front ends pack the query heads of a KV
// group into one block's rows, so each K / V tile is loaded once for the group; the token-sparse
// front end reads the kept rows of q, k and v in place (no gather pass). The block-sparse front end
// cuts the keys each query block may see into segments (vlsparse/masks/segment_plan.hpp, from the
// mask's counts at 64-key granularity): segments every row sees whole run without a mask, causal ones
// with a position compare, a video's key one frame back (temporal / spatial-temporal masks) as one
// score per row, and only the rest evaluate the template per element.
//
// Checks (vlsparse::error, before anything is launched): types, shapes, strides, alignment, aliasing,
// the host list bounds. opt.check_inputs (default on): a small kernel checks the device lists
// (ascending, unique, in range) and the host waits for its verdict. opt.check_finite (default on): the
// host waits and a non-finite output (NaN / Inf in q, k or v rows that were read, or an fp32 overflow
// of a score) is an error; rows and keys a mask excludes are not read, so not checked. Engines turn
// both off in production (no synchronization) and validate where their data is produced.
// Include: this header, from a .cu translation unit (nvcc, C++20).
#pragma once

#include <cuda.h>  // CUtensorMap and its enums (the driver function is looked up at run time)
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "vlsparse/attention/common.hpp"
#include "vlsparse/core/dtype.hpp"
#include "vlsparse/core/error.hpp"
#include "vlsparse/core/tensor.hpp"
#include "vlsparse/cuda/common.cuh"
#include "vlsparse/cuda/prefill/kernels_mma.cuh"
#include "vlsparse/cuda/prefill/kernels_simt.cuh"
#include "vlsparse/masks/block_mask.hpp"
#include "vlsparse/masks/templates.hpp"

namespace vlsparse::cuda {

// Which kernel runs. automatic: for bf16 / fp16 inputs with head_dim 64 or 128, the tensor cores --
// wgmma on a Hopper GPU (compute capability 9.0) where the binary holds sm_90a code
// (-gencode=arch=compute_90a,code=sm_90a; Meson -Dgpu_arch=sm_90), mma.sync elsewhere (a binary
// without sm_90a code runs mma.sync on Hopper too) --, and the CUDA-core kernel for everything else
// (fp32 inputs, other head dims). mma_sync: mma.sync wherever the tensor cores apply (to compare the
// paths; results agree within the rounding of P). simt: the CUDA-core kernel for every input (P not
// rounded; a second implementation to check against, slow).
enum class PrefillKernel { automatic, mma_sync, simt };

struct PrefillOptions {
    float scale = 0.0f;         // softmax scale; 0: 1/sqrt(head_dim) (computed in double, rounded to fp32)
    bool check_inputs = true;   // token-sparse: check the device lists on the device (waits for the stream)
    bool check_finite = true;   // wait for the stream; a non-finite output is a vlsparse::error
    PrefillKernel kernel = PrefillKernel::automatic;
    // wgmma path: whole key tiles of the dense and block-sparse front ends copied by the bulk tensor copy
    // engine (TMA: one thread per tile) instead of cp.async by the producer warps. Same results either
    // way; false is for comparisons and tests. Ignored where no tensor map can be made (a driver without
    // cuTensorMapEncodeTiled): cp.async then.
    bool bulk_copy = true;
};

// Token lists on the device for the token-sparse front end: lists() lists (1: shared by every KV head,
// or H_kv: one per KV head) of ascending unique positions in [0, n), CSR. indptr is the host copy of
// the offsets (it sizes the launch), indptr_dev the same array on the device.
struct DeviceTokenLists {
    std::int64_t n = 0;
    std::span<const std::int32_t> indptr;  // host [lists + 1]
    const std::int32_t* indptr_dev = nullptr;
    const std::int32_t* indices = nullptr;
    std::int64_t lists() const { return static_cast<std::int64_t>(indptr.size()) - 1; }
};

namespace detail {

inline constexpr int kPrefillBadList = 1;  // report code of prefill_check_lists_kernel

// One block per list: entries ascending, unique, in [0, n), and the device indptr equal to the host's.
template <int Unused = 0>
__global__ void prefill_check_lists_kernel(const std::int32_t* indptr, const std::int32_t* indices,
                                           const std::int32_t* indptr_host_copy, int lists, int n,
                                           long long* report) {
    const int l = blockIdx.x;
    if (l >= lists) return;
    const int b = indptr[l], e = indptr[l + 1];
    if (threadIdx.x == 0 && (b != indptr_host_copy[l] || e != indptr_host_copy[l + 1])) {
        atomicMin(reinterpret_cast<unsigned long long*>(report), static_cast<unsigned long long>(l) << 32 | 0xffffffffu);
        return;
    }
    if (b != indptr_host_copy[l] || e != indptr_host_copy[l + 1]) return;
    for (int i = b + static_cast<int>(threadIdx.x); i < e; i += blockDim.x) {
        const int x = indices[i];
        const bool ok = x >= 0 && x < n && (i == b || indices[i - 1] < x);
        if (!ok)
            atomicMin(reinterpret_cast<unsigned long long*>(report),
                      static_cast<unsigned long long>(l) << 32 | static_cast<unsigned>(i - b));
    }
}

// Host checks shared by the front ends; fills the kernel arguments' tensor fields.
// Whether a launch runs on the tensor cores (else the CUDA-core kernel).
template <class T>
bool prefill_on_tensor_cores(std::int64_t d, const PrefillOptions& opt) {
    return !std::is_same_v<T, float> && (d == 64 || d == 128) && opt.kernel != PrefillKernel::simt;
}

template <class T, class TO>
void prefill_common(View3<const T> q, View3<const T> k, View3<const T> v, View3<TO> out, const PrefillOptions& opt,
                    PrefillArgs& a, const char* fn, bool kept_keys = false) {
    using ::vlsparse::detail::require;
    static_assert(ElementType<T>, "the GPU prefill takes fp32, bf16 or fp16 q, k, v");
    const std::int64_t nq = q.shape[0], H = q.shape[1], d = q.shape[2], nk = k.shape[0], Hkv = k.shape[1];
    // The checks of every backend first (shapes, strides, null data, GQA; then out's shape, strides and
    // aliasing), then what only the GPU kernels ask for.
    ::vlsparse::detail::check_qkv(q, k, v, fn);
    ::vlsparse::detail::check_out3(out, {nq, H, d}, q, k, v, fn, "out");
    require(kept_keys || nq <= nk, fn, "q has ", nq, " tokens and k has ", nk, ", expected n_q <= n_k");
    require(nk <= (std::int64_t{1} << 30), fn, "k has ", nk, " tokens, at most 2^30 are supported");
    require(d <= kPrefillSimtMaxDim, fn, "head_dim = ", d, "; the GPU prefill takes head dims up to ", kPrefillSimtMaxDim,
            " (64 and 128 on the tensor cores)");
    require(opt.kernel == PrefillKernel::automatic || opt.kernel == PrefillKernel::mma_sync || opt.kernel == PrefillKernel::simt,
            fn, "opt.kernel has value ", static_cast<int>(opt.kernel), ", expected automatic, mma_sync or simt");
    require(q.stride[2] == 1 && k.stride[2] == 1 && v.stride[2] == 1, fn, "q, k and v need unit inner stride, got ",
            q.stride[2], ", ", k.stride[2], ", ", v.stride[2]);
    auto rows_ok = [](const auto& x) {
        return x.stride[0] % 8 == 0 && x.stride[1] % 8 == 0 && reinterpret_cast<std::uintptr_t>(x.data) % 16 == 0;
    };
    require(!prefill_on_tensor_cores<T>(d, opt) || (rows_ok(q) && rows_ok(k) && rows_ok(v)), fn,
            "q, k and v need row and head strides that are multiples of 8 elements and a 16-byte aligned base "
            "(the tensor cores read 16-byte chunks; PrefillKernel::simt takes any)");
    // (The tensor-core kernel gathers token-sparse K / V rows with 32-bit byte pitches.)
    require(!prefill_on_tensor_cores<T>(d, opt) ||
                (k.stride[0] * static_cast<std::int64_t>(sizeof(T)) < (std::int64_t{1} << 32) &&
                 v.stride[0] * static_cast<std::int64_t>(sizeof(T)) < (std::int64_t{1} << 32)),
            fn, "k and v rows ", k.stride[0], " and ", v.stride[0],
            " elements apart; the tensor cores take row strides below 4 GiB (PrefillKernel::simt takes any)");
    const float scale = ::vlsparse::detail::resolve_scale(AttentionOptions{opt.scale, false}, d, fn);
    a.q = q.data;
    a.k = k.data;
    a.v = v.data;
    a.out = out.data;
    a.q_s0 = q.stride[0];
    a.q_s1 = q.stride[1];
    a.k_s0 = k.stride[0];
    a.k_s1 = k.stride[1];
    a.v_s0 = v.stride[0];
    a.v_s1 = v.stride[1];
    a.o_s0 = out.stride[0];
    a.o_s1 = out.stride[1];
    a.o_s2 = out.stride[2];
    a.H = static_cast<int>(H);
    a.Hkv = static_cast<int>(Hkv);
    a.n_k = static_cast<int>(nk);
    a.G = static_cast<int>(H / Hkv);
    a.scale_log2 = static_cast<float>(static_cast<double>(scale) * 1.4426950408889634);
}

// K or V [n_k, H_kv, D] (prefill_common checked the strides and alignment) as the tensor map the kernel's
// bulk copies read: 64 x 64 boxes, rows past n_k read as zeros. False when the driver refuses it.
template <class T, int D>
bool encode_kv_tensor_map(CUtensorMap& map, const void* base, int n_k, int Hkv, std::int64_t s0, std::int64_t s1) {
    return encode_rows_tensor_map<T>(map, base, D, n_k, Hkv, s0, s1, kPrefillKeys);
}

template <class T, class TO, int D, bool WG>
void launch_prefill_kernel(PrefillArgs a, dim3 grid, bool bulk_copy, cudaStream_t stream, const char* fn) {
    constexpr std::size_t smem = PrefillShape<D, WG ? 5 : 3>::smem_bytes();
    // The attribute is per device: set it on every launch (a host-side call, no synchronization).
    check_cuda(cudaFuncSetAttribute(prefill_mma_kernel<T, TO, D, WG>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(smem)),
               fn, "cudaFuncSetAttribute");
    // Whole tiles by the bulk tensor copy where both tensor maps can be made (token-sparse launches that
    // gather their rows: cp.async; kept keys are whole tiles of rows).
    a.tma = 0;
    if constexpr (WG) {
        if (bulk_copy && (!a.keys_list || a.keys_kept) && encode_kv_tensor_map<T, D>(a.tmap_k, a.k, a.n_k, a.Hkv, a.k_s0, a.k_s1) &&
            encode_kv_tensor_map<T, D>(a.tmap_v, a.v, a.n_k, a.Hkv, a.v_s0, a.v_s1))
            a.tma = 1;
    }
    prefill_mma_kernel<T, TO, D, WG><<<grid, WG ? kPrefillThreadsWS : kPrefillThreads, smem, stream>>>(a);
    check_launch(fn, "prefill_mma_kernel");
}

template <class T, class TO, int D>
void launch_prefill_d(const PrefillArgs& a, dim3 grid, const PrefillOptions& opt, cudaStream_t stream, const char* fn) {
    if (opt.kernel == PrefillKernel::automatic && device_is_sm90(fn))
        launch_prefill_kernel<T, TO, D, true>(a, grid, opt.bulk_copy, stream, fn);
    else
        launch_prefill_kernel<T, TO, D, false>(a, grid, false, stream, fn);
}

template <class T, class TO>
void launch_prefill_simt(const PrefillArgs& a, int d, dim3 grid, cudaStream_t stream, const char* fn) {
    if (d <= 64) prefill_simt_kernel<T, TO, 2><<<grid, kPrefillThreads, 0, stream>>>(a, d);
    else if (d <= 128) prefill_simt_kernel<T, TO, 4><<<grid, kPrefillThreads, 0, stream>>>(a, d);
    else prefill_simt_kernel<T, TO, 8><<<grid, kPrefillThreads, 0, stream>>>(a, d);
    check_launch(fn, "prefill_simt_kernel");
}

// Launches the kernel, with the status word and the final wait when opt.check_finite.
template <class T, class TO>
void launch_prefill(PrefillArgs a, int d, dim3 grid, const PrefillOptions& opt, cudaStream_t stream, const char* fn) {
    int* status = nullptr;
    if (opt.check_finite) {
        check_cuda(cudaMallocAsync(reinterpret_cast<void**>(&status), sizeof(int), stream), fn, "cudaMallocAsync");
        check_cuda(cudaMemsetAsync(status, 0, sizeof(int), stream), fn, "cudaMemsetAsync");
    }
    a.status = status;
    if (grid.x > 0 && grid.y > 0) {
        bool tensor_cores = false;
        if constexpr (!std::is_same_v<T, float>) {
            tensor_cores = prefill_on_tensor_cores<T>(d, opt);
            if (tensor_cores) {
                if (d == 64) launch_prefill_d<T, TO, 64>(a, grid, opt, stream, fn);
                else launch_prefill_d<T, TO, 128>(a, grid, opt, stream, fn);
            }
        }
        if (!tensor_cores) launch_prefill_simt<T, TO>(a, d, grid, stream, fn);
    }
    if (status) {
        int flag = 0;
        check_cuda(cudaMemcpyAsync(&flag, status, sizeof(int), cudaMemcpyDeviceToHost, stream), fn, "cudaMemcpyAsync");
        check_cuda(cudaFreeAsync(status, stream), fn, "cudaFreeAsync");
        check_cuda(cudaStreamSynchronize(stream), fn, "cudaStreamSynchronize");
        ::vlsparse::detail::require(flag == 0, fn,
                                    "non-finite attention output: NaN / Inf in q, k or v (in a row the attention "
                                    "reads), or an fp32 overflow of a score");
    }
}

}  // namespace detail

// Whether the prefill front ends with PrefillKernel::automatic run on wgmma on the current device: a
// Hopper GPU (compute capability 9.0) and sm_90a code in this binary (detail::wgmma_runs_here: the first
// query on a device launches a probe kernel and waits for it). For tests, benchmarks and logs.
inline bool prefill_uses_wgmma() { return detail::wgmma_runs_here("cuda::prefill_uses_wgmma"); }

namespace detail {

template <class T, class TO>
void dense_prefill(View3<const T> q, View3<const T> k, View3<const T> v, View3<TO> out, float* lse, std::int64_t lse_s0,
                   std::int64_t lse_s1, const PrefillOptions& opt, cudaStream_t stream, const char* fn) {
    PrefillArgs a;
    prefill_common(q, k, v, out, opt, a, fn);
    a.hp = a.G;
    a.n_rows = static_cast<int>(q.shape[0]);
    a.q_offset = static_cast<int>(k.shape[0] - q.shape[0]);
    a.lse = lse;
    a.lse_s0 = lse_s0;
    a.lse_s1 = lse_s1;
    const auto m = static_cast<std::int64_t>(a.n_rows) * a.hp;
    const dim3 grid(static_cast<unsigned>((m + kPrefillRows - 1) / kPrefillRows), static_cast<unsigned>(a.Hkv));
    launch_prefill<T, TO>(a, static_cast<int>(q.shape[2]), grid, opt, stream, fn);
}

}  // namespace detail

// Dense causal prefill: query row i (position n_k - n_q + i) attends to keys 0 .. its position.
template <ElementType T, OutputElement TO>
    requires ElementType<TO>
void dense_prefill_attention(View3<const T> q, View3<const T> k, View3<const T> v, View3<TO> out,
                             const PrefillOptions& opt = {}, cudaStream_t stream = nullptr) {
    detail::dense_prefill(q, k, v, out, nullptr, 0, 0, opt, stream, "cuda::dense_prefill_attention");
}

// The same, also writing each row's log-sum-exp into lse [n_q, H] (fp32, any strides, not aliasing q, k, v
// or out): lse[i, h] = ln sum_{j <= pos(i)} exp(scale q_{i,h} . k_{j,g}), from the kernel's own running
// maximum and sum (FlashAttention's softmax_lse). With it, exp(scale q . k_j - lse[i, h]) is row i's
// probability of key j: a later pass over a few keys needs no pass over all of them (A-VL's text budget,
// AvlSelector::select with row statistics). Costs one store per row.
template <ElementType T, OutputElement TO>
    requires ElementType<TO>
void dense_prefill_attention(View3<const T> q, View3<const T> k, View3<const T> v, View3<TO> out, View2<float> lse,
                             const PrefillOptions& opt = {}, cudaStream_t stream = nullptr) {
    constexpr const char* fn = "cuda::dense_prefill_attention";
    using ::vlsparse::detail::require;
    require(lse.shape[0] == q.shape[0] && lse.shape[1] == q.shape[1], fn, "lse has shape [", lse.shape[0], ", ",
            lse.shape[1], "], expected [", q.shape[0], ", ", q.shape[1], "] (n_q, H)");
    ::vlsparse::detail::check_strides(lse, fn, "lse", true);
    ::vlsparse::detail::check_no_alias(lse, q, fn, "lse", "q");
    ::vlsparse::detail::check_no_alias(lse, k, fn, "lse", "k");
    ::vlsparse::detail::check_no_alias(lse, v, fn, "lse", "v");
    ::vlsparse::detail::check_no_alias(lse, out, fn, "lse", "out");
    detail::dense_prefill(q, k, v, out, lse.data, lse.stride[0], lse.stride[1], opt, stream, fn);
}

namespace detail {

// The two token-sparse front ends: keys read through the lists (kept = false) or kept keys, row e of k / v
// being entry e of the list (kept = true).
template <ElementType T, OutputElement TO>
    requires ElementType<TO>
void sparse_prefill(View3<const T> q, View3<const T> k, View3<const T> v, const DeviceTokenLists& lists, View3<TO> out,
                    UnselectedRows unselected, const PrefillOptions& opt, cudaStream_t stream, bool kept, const char* fn) {
    using ::vlsparse::detail::require;
    PrefillArgs a;
    prefill_common(q, k, v, out, opt, a, fn, kept);
    const std::int64_t n = q.shape[0];
    if (!kept)
        require(k.shape[0] == n, fn, "q has ", n, " tokens and k has ", k.shape[0], ", expected equal (token-sparse prefill)");
    require(lists.n == n, fn, "the lists refer to ", lists.n, " tokens, the input has ", n);
    const std::int64_t L = lists.lists();
    require(L == 1 || L == a.Hkv, fn, "got ", L, " lists, expected 1 (shared) or H_kv = ", a.Hkv);
    require(lists.indptr_dev && (lists.indices || lists.indptr.back() == 0), fn,
            "null device pointer in the lists (indptr_dev / indices)");
    require(unselected == UnselectedRows::zero || unselected == UnselectedRows::attend_selected, fn,
            "unselected has value ", static_cast<int>(unselected), ", expected zero or attend_selected");
    require(lists.indptr[0] == 0, fn, "indptr[0] = ", lists.indptr[0], ", expected 0");
    std::int64_t longest = 0;
    for (std::int64_t l = 0; l < L; ++l) {
        const std::int64_t c = lists.indptr[static_cast<std::size_t>(l) + 1] - lists.indptr[static_cast<std::size_t>(l)];
        require(c >= 0 && c <= n, fn, "list ", l, " has ", c, " entries (indptr ", lists.indptr[static_cast<std::size_t>(l)],
                " .. ", lists.indptr[static_cast<std::size_t>(l) + 1], "), expected 0 .. n = ", n);
        longest = std::max(longest, c);
    }
    if (kept)
        require(k.shape[0] >= longest, fn, "k_kept has ", k.shape[0], " rows and the longest list ", longest,
                " entries: list g's keys are rows 0 .. |T_g| - 1 of k_kept and v_kept");
    if (opt.check_inputs && lists.indptr.back() > 0) {
        long long* rep = nullptr;
        std::int32_t* host_copy = nullptr;
        const std::size_t ib = lists.indptr.size() * sizeof(std::int32_t);
        check_cuda(cudaMallocAsync(reinterpret_cast<void**>(&rep), sizeof(long long) + ib, stream), fn,
                           "cudaMallocAsync");
        host_copy = reinterpret_cast<std::int32_t*>(rep + 1);
        check_cuda(cudaMemsetAsync(rep, 0xff, sizeof(long long), stream), fn, "cudaMemsetAsync");
        check_cuda(cudaMemcpyAsync(host_copy, lists.indptr.data(), ib, cudaMemcpyHostToDevice, stream), fn,
                           "cudaMemcpyAsync");
        prefill_check_lists_kernel<><<<static_cast<unsigned>(L), 256, 0, stream>>>(
            lists.indptr_dev, lists.indices, host_copy, static_cast<int>(L), static_cast<int>(n), rep);
        check_launch(fn, "prefill_check_lists_kernel");
        unsigned long long r = 0;
        check_cuda(cudaMemcpyAsync(&r, rep, sizeof(r), cudaMemcpyDeviceToHost, stream), fn, "cudaMemcpyAsync");
        check_cuda(cudaFreeAsync(rep, stream), fn, "cudaFreeAsync");
        check_cuda(cudaStreamSynchronize(stream), fn, "cudaStreamSynchronize");
        if (r != ~0ull) {
            const auto l = static_cast<std::int64_t>(r >> 32), e = static_cast<std::int64_t>(r & 0xffffffffu);
            require(e != 0xffffffff, fn, "the device indptr of list ", l, " differs from the host indptr");
            require(false, fn, "list ", l, " entry ", e, ": expected ascending unique positions in [0, ", n, ")");
        }
    }
    a.hp = a.G;
    a.keys_list = lists.indices;
    a.keys_indptr = lists.indptr_dev;
    a.keys_per_group = L == 1 ? 0 : 1;
    a.keys_kept = kept ? 1 : 0;
    a.q_offset = 0;
    std::int64_t rows = longest;
    if (unselected == UnselectedRows::attend_selected) {
        a.n_rows = static_cast<int>(n);  // every row attends to the kept keys at or before it
        rows = n;
    } else {
        a.rows_list = lists.indices;
        a.rows_indptr = lists.indptr_dev;
        a.rows_per_group = a.keys_per_group;
        const std::int64_t total = out.shape[0] * out.shape[1] * out.shape[2];
        const auto blocks = static_cast<unsigned>(std::min<std::int64_t>((total + 255) / 256, 4096));
        prefill_zero_kernel<TO><<<blocks, 256, 0, stream>>>(out.data, out.shape[0], static_cast<int>(out.shape[1]),
                                                                   static_cast<int>(out.shape[2]), out.stride[0],
                                                                   out.stride[1], out.stride[2]);
        check_launch(fn, "prefill_zero_kernel");
    }
    const std::int64_t m = rows * a.hp;
    const dim3 grid(static_cast<unsigned>((m + kPrefillRows - 1) / kPrefillRows),
                    static_cast<unsigned>(a.Hkv));
    launch_prefill<T, TO>(a, static_cast<int>(q.shape[2]), grid, opt, stream, fn);
}

}  // namespace detail

// Token-sparse prefill (ZipVL), n_q == n_k == lists.n: query head h of KV head g with kept list T_g
// (lists.lists() == 1: one list for all) -- a query i in T_g attends to the keys j in T_g with j <= i;
// a query not in T_g is written as zero (UnselectedRows::zero) or attends to the keys of T_g at or
// before it (attend_selected; none: zero). As reference::sparse_attention. The kept rows of q, k and v
// are read in place through the lists.
template <ElementType T, OutputElement TO>
    requires ElementType<TO>
void sparse_prefill_attention(View3<const T> q, View3<const T> k, View3<const T> v, const DeviceTokenLists& lists,
                              View3<TO> out, UnselectedRows unselected = UnselectedRows::zero,
                              const PrefillOptions& opt = {}, cudaStream_t stream = nullptr) {
    detail::sparse_prefill(q, k, v, lists, out, unselected, opt, stream, false, "cuda::sparse_prefill_attention");
}

// The same attention over kept keys: row e of k_kept / v_kept (KV head g) holds the key and value of
// position T_g[e] (rows 0 .. |T_g| - 1; k_kept has at least as many rows as the longest list) -- the cache
// as ZipVL's eviction leaves it (cuda::kv_batch_compact with the same list), or a copy of the kept rows.
// q and out are the full [n, H, d] as above (queries read through the lists). The results are those of
// sparse_prefill_attention over the uncompacted k, v, bit for bit; the keys come as whole tiles of rows
// (on Hopper by the bulk tensor copy) instead of gathered rows.
template <ElementType T, OutputElement TO>
    requires ElementType<TO>
void sparse_prefill_attention_kept(View3<const T> q, View3<const T> k_kept, View3<const T> v_kept,
                                   const DeviceTokenLists& lists, View3<TO> out,
                                   UnselectedRows unselected = UnselectedRows::zero, const PrefillOptions& opt = {},
                                   cudaStream_t stream = nullptr) {
    detail::sparse_prefill(q, k_kept, v_kept, lists, out, unselected, opt, stream, true,
                           "cuda::sparse_prefill_attention_kept");
}

// The block-sparse description of one prompt's per-head masks on the device: query blocks (each text
// run and each image or video frame cut into blocks of at most 128 rows), and for each distinct
// template and query block the key segments, each marked full / causal / general. Made once per
// prompt; every layer with the same head templates reuses it.
class MaskedPrefillPlan {
public:
    MaskedPrefillPlan() = default;
    MaskedPrefillPlan(const MaskContext& ctx, std::span<const MaskTemplate> heads, std::int64_t n_kv_heads) {
        plan(ctx, heads, n_kv_heads);
    }

    void plan(const MaskContext& ctx, std::span<const MaskTemplate> heads, std::int64_t n_kv_heads) {
        constexpr const char* fn = "cuda::MaskedPrefillPlan::plan";
        using ::vlsparse::detail::require;
        const std::int64_t H = static_cast<std::int64_t>(heads.size());
        // The checks of make_block_mask (the context and the templates, same messages); the segments and
        // the block measure of block_mask_pairs() come from one pass of per-block counts.
        ::vlsparse::detail::check_block_mask_request(ctx, heads, detail::kPrefillRows, detail::kPrefillKeys, "make_block_mask");
        require(n_kv_heads >= 1 && H % n_kv_heads == 0, fn, "H = ", H, " head templates is not a multiple of H_kv = ",
                n_kv_heads);
        require(ctx.n <= (std::int64_t{1} << 30), fn, "the mask covers ", ctx.n, " tokens, at most 2^30 are supported");
        n_ = ctx.n;
        H_ = H;
        Hkv_ = n_kv_heads;
        // The segments of every (template, query block) and the items of every head (masks/segment_plan.hpp).
        ::vlsparse::detail::SegmentPlan sp = ::vlsparse::detail::plan_key_segments(
            ctx, heads, ::vlsparse::detail::query_block_starts(ctx, detail::kPrefillRows), detail::kPrefillKeys);
        allowed_ = sp.allowed;
        computed_ = sp.computed;
        diagonal_rows_ = sp.diagonal_rows;
        require(sp.items.size() < (std::size_t{1} << 31), fn, "too many blocks: ", sp.items.size());
        const std::vector<detail::PrefillItem>& items = sp.items;  // the longest first
        const std::vector<detail::PrefillSegment>& segs = sp.segs;

        std::vector<std::int32_t> img(ctx.token_image.begin(), ctx.token_image.end());
        std::vector<std::int32_t> istart(ctx.image_start.begin(), ctx.image_start.end());
        std::vector<std::int32_t> iend(ctx.image_end.begin(), ctx.image_end.end());
        std::vector<std::int32_t> frames(static_cast<std::size_t>(ctx.images()), 0);
        for (std::size_t i = 0; i < ctx.image_frame_tokens.size() && i < frames.size(); ++i)
            frames[i] = static_cast<std::int32_t>(ctx.image_frame_tokens[i]);
        std::vector<std::int32_t> sstart(ctx.sink_start.begin(), ctx.sink_start.end());
        std::vector<std::int32_t> spos(ctx.sink_pos.begin(), ctx.sink_pos.end());
        std::vector<std::uint8_t> tmpl(heads.size());
        for (std::size_t h = 0; h < heads.size(); ++h) tmpl[h] = static_cast<std::uint8_t>(heads[h]);
        items_ = DeviceArray<detail::PrefillItem>(items);
        segs_ = DeviceArray<detail::PrefillSegment>(segs);
        token_image_ = DeviceArray<std::int32_t>(img);
        token_sink_ = DeviceArray<std::uint8_t>(ctx.token_sink);
        image_start_ = DeviceArray<std::int32_t>(istart);
        image_end_ = DeviceArray<std::int32_t>(iend);
        frame_tokens_ = DeviceArray<std::int32_t>(frames);
        sink_start_ = DeviceArray<std::int32_t>(sstart);
        sink_pos_ = DeviceArray<std::int32_t>(spos);
        head_template_ = DeviceArray<std::uint8_t>(tmpl);
        mask_.context.n = static_cast<std::int32_t>(n_);
        mask_.context.token_image = token_image_.data();
        mask_.context.token_sink = token_sink_.data();
        mask_.context.image_start = image_start_.data();
        mask_.context.image_end = image_end_.data();
        mask_.context.frame_tokens = frame_tokens_.data();
        mask_.context.sink_start = sink_start_.data();
        mask_.context.sink_pos = sink_pos_.data();
        mask_.head_template = head_template_.data();
        mask_.context.bidirectional = ctx.bidirectional_images ? 1 : 0;
        mask_.context.video = static_cast<int>(ctx.video);
        mask_.context.video_window = static_cast<int>(ctx.video_window);
        mask_.context.video_dilation = static_cast<int>(ctx.video_dilation);
        n_items_ = static_cast<std::int64_t>(items.size());
        n_segments_ = static_cast<std::int64_t>(segs.size());
        block_pairs_ = sp.block_pairs;
    }

    bool planned() const { return n_ > 0; }
    std::int64_t n() const { return n_; }
    std::int64_t n_heads() const { return H_; }
    std::int64_t n_kv_heads() const { return Hkv_; }
    std::int64_t blocks() const { return n_items_; }
    std::int64_t segments() const { return n_segments_; }
    // (query, key) pairs the mask allows, summed over heads (the work an ideal kernel does).
    std::int64_t allowed_pairs() const { return allowed_; }
    // Pairs inside the segments (rows x keys of each segment, summed over heads and query blocks; one pair
    // per row of a diagonal segment): the pairs the kernel computes, before tiles of 64 keys round each
    // segment up.
    std::int64_t computed_pairs() const { return computed_; }
    // Rows (summed over heads) whose key one frame back is computed as a diagonal: one score per row
    // instead of a tile (PureKV's temporal and spatial-temporal video masks).
    std::int64_t diagonal_rows() const { return diagonal_rows_; }
    // The same measure for 128 x 64 blocks trimmed to their allowed key range (BlockMask::computed_pairs).
    std::int64_t block_mask_pairs() const { return block_pairs_; }

    // Kernel arguments (internal).
    const detail::PrefillItem* device_items() const { return items_.data(); }
    const detail::PrefillSegment* device_segments() const { return segs_.data(); }
    const detail::DeviceMask& device_mask() const { return mask_; }

private:
    std::int64_t n_ = 0, H_ = 0, Hkv_ = 0, n_items_ = 0, n_segments_ = 0, allowed_ = 0, computed_ = 0, block_pairs_ = 0,
                 diagonal_rows_ = 0;
    DeviceArray<detail::PrefillItem> items_;
    DeviceArray<detail::PrefillSegment> segs_;
    DeviceArray<std::int32_t> token_image_, image_start_, image_end_, frame_tokens_, sink_start_, sink_pos_;
    DeviceArray<std::uint8_t> token_sink_, head_template_;
    detail::DeviceMask mask_;
};

// Block-sparse prefill over the plan's per-head masks: out[i, h] attends to the keys j with
// ctx.allows(heads[h], i, j) (n_q == n_k == ctx.n). As reference::masked_attention.
template <ElementType T, OutputElement TO>
    requires ElementType<TO>
void masked_prefill_attention(const MaskedPrefillPlan& plan, View3<const T> q, View3<const T> k, View3<const T> v,
                              View3<TO> out, const PrefillOptions& opt = {}, cudaStream_t stream = nullptr) {
    constexpr const char* fn = "cuda::masked_prefill_attention";
    using ::vlsparse::detail::require;
    require(plan.planned(), fn, "the plan is empty; call MaskedPrefillPlan::plan first");
    detail::PrefillArgs a;
    detail::prefill_common(q, k, v, out, opt, a, fn);
    require(q.shape[0] == plan.n() && k.shape[0] == plan.n(), fn, "q has ", q.shape[0], " tokens and k ", k.shape[0],
            "; the plan covers ", plan.n(), " (masked prefill: n_q == n_k == n)");
    require(q.shape[1] == plan.n_heads() && k.shape[1] == plan.n_kv_heads(), fn, "q has ", q.shape[1],
            " heads and k ", k.shape[1], "; the plan was made for H = ", plan.n_heads(), ", H_kv = ", plan.n_kv_heads());
    a.hp = 1;
    a.items = plan.device_items();
    a.segs = plan.device_segments();
    a.mask = plan.device_mask();
    const dim3 grid(static_cast<unsigned>(plan.blocks()), 1);
    detail::launch_prefill<T, TO>(a, static_cast<int>(q.shape[2]), grid, opt, stream, fn);
}

}  // namespace vlsparse::cuda
