// vlsparse/cuda/common.cuh -- what every CUDA kernel family of vlsparse shares: CUDA status checks,
// an owning device array, element loads / stores widened to fp32, and asynchronous copies.
// Namespace vlsparse::cuda (detail:: for the device helpers). Include from a .cu translation unit
// compiled by nvcc (C++20); the families' headers include it.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "vlsparse/core/dtype.hpp"
#include "vlsparse/core/error.hpp"

namespace vlsparse::cuda {

// Throws vlsparse::error naming the function, the CUDA call and the CUDA error unless e == cudaSuccess
// (public: an engine's own CUDA calls around the library's raise the same errors).
inline void check_cuda(cudaError_t e, const char* fn, const char* what) {
    require(e == cudaSuccess, fn, what, " failed: ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
}

// The kernel launch just issued on this thread: a launch error (bad configuration, no device code for
// this GPU) as a vlsparse::error.
inline void check_launch(const char* fn, const char* kernel) {
    const cudaError_t e = cudaGetLastError();
    require(e == cudaSuccess, fn, "launch of ", kernel, " failed: ", cudaGetErrorName(e), " (", cudaGetErrorString(e),
            ")");
}

namespace detail {
using ::vlsparse::require;
using ::vlsparse::cuda::check_cuda;
using ::vlsparse::cuda::check_launch;
}  // namespace detail

// An owning array in device memory (cudaMalloc / cudaFree), for tests, benchmarks and the owning
// convenience types; engines pass their own pointers instead.
template <class T>
class DeviceArray {
public:
    DeviceArray() = default;
    explicit DeviceArray(std::size_t count) : n_(count) {
        if (n_ > 0) detail::check_cuda(cudaMalloc(&p_, n_ * sizeof(T)), "cuda::DeviceArray", "cudaMalloc");
    }
    explicit DeviceArray(std::span<const T> host) : DeviceArray(host.size()) { upload(host); }
    explicit DeviceArray(const std::vector<T>& host) : DeviceArray(std::span<const T>(host)) {}
    DeviceArray(const DeviceArray&) = delete;
    DeviceArray& operator=(const DeviceArray&) = delete;
    DeviceArray(DeviceArray&& o) noexcept : p_(o.p_), n_(o.n_) {
        o.p_ = nullptr;
        o.n_ = 0;
    }
    DeviceArray& operator=(DeviceArray&& o) noexcept {
        if (this != &o) {
            cudaFree(p_);
            p_ = o.p_;
            n_ = o.n_;
            o.p_ = nullptr;
            o.n_ = 0;
        }
        return *this;
    }
    ~DeviceArray() { cudaFree(p_); }

    T* data() const { return p_; }
    std::size_t size() const { return n_; }
    // Synchronous copies (tests, set-up); the count must match.
    void upload(std::span<const T> host) {
        detail::require(host.size() == n_, "cuda::DeviceArray::upload", "got ", host.size(), " elements, expected ", n_);
        if (n_ > 0)
            detail::check_cuda(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), "cuda::DeviceArray",
                               "cudaMemcpy");
    }
    std::vector<T> download() const {
        std::vector<T> h(n_);
        if (n_ > 0)
            detail::check_cuda(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), "cuda::DeviceArray",
                               "cudaMemcpy");
        return h;
    }
    // Every byte set to `byte` (tests poison outputs with 0xff: NaN in every float type).
    void fill_bytes(int byte) {
        if (n_ > 0) detail::check_cuda(cudaMemset(p_, byte, n_ * sizeof(T)), "cuda::DeviceArray", "cudaMemset");
    }

private:
    T* p_ = nullptr;
    std::size_t n_ = 0;
};

namespace detail {

// ---- programmatic dependent launch (sm_90+) -----------------------------------------------------
//
// A kernel launched by launch_dependent() (or a ClusterLaunchConfig with `dependent`) may be
// launched before the kernel ahead of it in the stream has been retired, so that its launch overlaps
// that kernel's completion. Every such kernel begins with dependent_entry(): it waits there until the
// kernels before it have completed and their memory is visible (griddepcontrol.wait), before it
// reads or writes anything. No kernel triggers its dependents early (griddepcontrol.launch_dependents),
// so a dependent grid is never resident beside the one it follows. Launched without the attribute, or
// on a GPU before sm_90, it is a no-op.
__device__ __forceinline__ void dependent_entry() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// True when `kernel` may be launched as a programmatic dependent launch: the current device takes them
// (compute capability 9.0+) and the kernel's code was compiled for sm_90 or later, so that its
// dependent_entry() holds the wait (code JIT-compiled from an older PTX target has none: launched
// dependent, it could read what the kernel before it is still writing). The answer is kept per
// (device, kernel address) after the first query -- the address is what cudaFuncGetAttributes itself
// is asked with, so the cache answers as the query would -- and a launch costs one cudaGetDevice
// instead of three runtime queries.
template <class Kernel>
bool dependent_launch_supported(Kernel* kernel, const char* fn) {
    int dev = 0;
    check_cuda(cudaGetDevice(&dev), fn, "cudaGetDevice");
    static std::mutex mu;
    static std::map<std::pair<int, const void*>, bool> known;
    const std::pair<int, const void*> key{dev, reinterpret_cast<const void*>(kernel)};
    {
        const std::lock_guard<std::mutex> lock(mu);
        if (const auto it = known.find(key); it != known.end()) return it->second;
    }
    int major = 0;
    check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), fn, "cudaDeviceGetAttribute");
    bool ok = false;
    if (major >= 9) {
        cudaFuncAttributes fa{};
        check_cuda(cudaFuncGetAttributes(&fa, kernel), fn, "cudaFuncGetAttributes");
        ok = fa.ptxVersion >= 90 && fa.binaryVersion >= 90;
    }
    const std::lock_guard<std::mutex> lock(mu);
    known.emplace(key, ok);
    return ok;
}

// kernel<<<grid, block, smem, stream>>>(args...) as a programmatic dependent launch where the device
// supports it (the kernel must begin with dependent_entry()); launch errors as vlsparse::error.
template <class... KernelArgs, class... Args>
void launch_dependent(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, std::size_t smem, cudaStream_t stream,
                      const char* fn, const char* name, Args&&... args) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1]{};
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = dependent_launch_supported(kernel, fn) ? 1 : 0;
    check_cuda(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...), fn, name);
    check_launch(fn, name);
}

// ---- element loads and stores, widened to / rounded from fp32 -----------------------------------

__device__ __forceinline__ float load_f(const float* p) { return __ldg(p); }
__device__ __forceinline__ float load_f(const half* p) {
    const unsigned short b = __ldg(reinterpret_cast<const unsigned short*>(p));
    return __half2float(__ushort_as_half(b));
}
__device__ __forceinline__ float load_f(const bfloat16* p) {
    const unsigned short b = __ldg(reinterpret_cast<const unsigned short*>(p));
    return __uint_as_float(static_cast<unsigned>(b) << 16);
}
// Plain (non-__ldg) loads, for memory the same kernel may have written.
__device__ __forceinline__ float plain_f(const float* p) { return *p; }
__device__ __forceinline__ float plain_f(const bfloat16* p) {
    return __uint_as_float(static_cast<unsigned>(*reinterpret_cast<const unsigned short*>(p)) << 16);
}
__device__ __forceinline__ float plain_f(const half* p) { return __half2float(*reinterpret_cast<const __half*>(p)); }

__device__ __forceinline__ void store_f(float* p, float x) { *p = x; }
__device__ __forceinline__ void store_f(half* p, float x) {
    *reinterpret_cast<unsigned short*>(p) = __half_as_ushort(__float2half_rn(x));
}
__device__ __forceinline__ void store_f(bfloat16* p, float x) {
    // Round to nearest even, NaN kept quiet: the same rounding as vlsparse::bfloat16(float).
    const unsigned u = __float_as_uint(x);
    unsigned short b;
    if ((u & 0x7fffffffu) > 0x7f800000u) b = static_cast<unsigned short>((u >> 16) | 0x40u);
    else b = static_cast<unsigned short>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    *reinterpret_cast<unsigned short*>(p) = b;
}

// ---- tensor-core fragments (mma.sync m16n8k16, ldmatrix), shared by the decode, selection and prefill
// kernels. T: bfloat16 or half.
// c += A B for one m16n8k16 tile (A: 4 registers of T pairs, B: 2; fp32 accumulators).
template <class T>
__device__ __forceinline__ void mma_m16n8k16(float (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                             unsigned b0, unsigned b1) {
    if constexpr (std::is_same_v<T, bfloat16>)
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    else
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
// The same with A as one 4-register quad the caller keeps whole. (The decode kernel's A rows 8..15 are
// zero: with a0 and a2 passed alone and constant zeros for a1 and a3, ptxas assembled a fresh quad for
// every mma -- ~6 register moves per mma, 185 of a warp's ~970 instructions per tile, ncu, B = 1, n = 16K.)
template <class T>
__device__ __forceinline__ void mma_m16n8k16(float (&c)[4], const uint4& a, unsigned b0, unsigned b1) {
    mma_m16n8k16<T>(c, a.x, a.y, a.z, a.w, b0, b1);
}
// Two floats as a pair of T (x0 in the low half), rounded to nearest even.
template <class T>
__device__ __forceinline__ unsigned pack_pair(float x0, float x1) {
    unsigned r;
    if constexpr (std::is_same_v<T, bfloat16>) asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(x1), "f"(x0));
    else asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(x1), "f"(x0));
    return r;
}
// Four 8 x 8 matrices of 16-bit elements from shared memory (ldmatrix .x4), and the same transposed.
__device__ __forceinline__ void ldsm_x4(unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3, const void* p) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(s));
}
__device__ __forceinline__ void ldsm_x4_t(unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3, const void* p) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(s));
}

// Two 16-bit elements packed in one 32-bit word, widened (element 0 in the low half).
__device__ __forceinline__ float2 widen_pair(unsigned w, const bfloat16*) {
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}
__device__ __forceinline__ float2 widen_pair(unsigned w, const half*) {
    return __half22float2(*reinterpret_cast<const __half2*>(&w));
}

// 16 bytes (one uint4) of elements widened: 8 for 16-bit types, 4 for fp32.
template <class T>
inline constexpr int kPerVec16 = 16 / static_cast<int>(sizeof(T));

template <class T>
__device__ __forceinline__ void widen16(const uint4& u, float* x) {
    if constexpr (sizeof(T) == 4) {
        x[0] = __uint_as_float(u.x);
        x[1] = __uint_as_float(u.y);
        x[2] = __uint_as_float(u.z);
        x[3] = __uint_as_float(u.w);
    } else {
        const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const float2 f = widen_pair(w[j], static_cast<const T*>(nullptr));
            x[2 * j] = f.x;
            x[2 * j + 1] = f.y;
        }
    }
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

// ---- asynchronous global -> shared copies (cp.async, sm_80+; inline PTX rather than
// <cuda_pipeline.h>, whose global namespace `cuda` would clash with vlsparse::cuda in user code) ----

// 16 bytes; with `valid` false the destination is zero-filled and nothing is read.
__device__ __forceinline__ void copy16_async(void* dst_shared, const void* src_global, bool valid = true) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst_shared));
    const int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src_global), "r"(n));
#else
    *reinterpret_cast<uint4*>(dst_shared) = valid ? *reinterpret_cast<const uint4*>(src_global) : make_uint4(0, 0, 0, 0);
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

}  // namespace detail

}  // namespace vlsparse::cuda
