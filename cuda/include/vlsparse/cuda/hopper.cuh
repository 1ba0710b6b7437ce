// vlsparse/cuda/hopper.cuh -- the Hopper (sm_90a) instructions the tensor-core kernels share, as inline
// device functions: wgmma (matrix descriptors, fences, commit / wait, the m64nNk16 shapes with A from
// registers or shared memory), the async-proxy fence, mbarriers, the bulk tensor copy and setmaxnreg.
// Internal to the kernels (namespace vlsparse::cuda::detail): the prefill (prefill/kernels_mma.cuh)
// and the probe passes of the selection (selection/probe_scores.cuh).
//
// The instructions exist only in code compiled for the arch-specific target sm_90a
// (VLSPARSE_CUDA_HAS_WGMMA is 1 there); elsewhere every helper is empty, and a kernel that uses them
// must take another path (the prefill's mma.sync loop) or must not be launched (the host asks
// wgmma_runs_here(), below).
#pragma once

#include <cuda.h>  // CUtensorMap and its enums (the driver function that encodes one is looked up at run time)
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "vlsparse/cuda/common.cuh"

namespace vlsparse::cuda::detail {

// ---- wgmma (sm_90a) ---------------------------------------------------------------------------------
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define VLSPARSE_CUDA_HAS_WGMMA 1
#else
#define VLSPARSE_CUDA_HAS_WGMMA 0
#endif

// cuTensorMapEncodeTiled, looked up once in the driver through the runtime (no link against libcuda);
// null when the driver does not provide it.
using TensorMapEncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                            const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                            CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
inline TensorMapEncodeTiledFn tensor_map_encoder() {
    static const TensorMapEncodeTiledFn f = [] {
        void* p = nullptr;
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess) {
            (void)cudaGetLastError();  // (not sticky; cleared so that the next check does not see it)
            return TensorMapEncodeTiledFn{};
        }
        return reinterpret_cast<TensorMapEncodeTiledFn>(p);
    }();
    return f;
}

// A [rows, heads, cols] tensor of 16-bit elements (unit inner stride; row and head strides s0, s1 in
// elements, multiples of 8, 16-byte aligned base) as a 3-D tensor map {cols, rows, heads} of boxes of 64
// columns x box_rows rows x 1 head, 128-byte swizzle (a tile plane's layout in shared memory:
// swizzle128_offset), elements out of bounds read as zeros. False when the driver refuses it.
template <class T>
bool encode_rows_tensor_map(CUtensorMap& map, const void* base, int cols, int rows, int heads, std::int64_t s0, std::int64_t s1,
                            int box_rows) {
    const TensorMapEncodeTiledFn encode = tensor_map_encoder();
    if (!encode) return false;
    const CUtensorMapDataType type = std::is_same_v<T, bfloat16> ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    const cuuint64_t dims[3] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows), static_cast<cuuint64_t>(heads)};
    const cuuint64_t strides[2] = {static_cast<cuuint64_t>(s0) * sizeof(T), static_cast<cuuint64_t>(s1) * sizeof(T)};
    const cuuint32_t box[3] = {64, static_cast<cuuint32_t>(box_rows), 1};
    const cuuint32_t estr[3] = {1, 1, 1};
    return encode(&map, type, 3, const_cast<void*>(base), dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                  CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// Element offset of 16-byte piece c (8 16-bit elements) of row r in a tile of R rows stored for wgmma's
// 128-byte swizzle: 64-column planes of R rows x 128 bytes, the piece at (c % 8) ^ (r % 8) of its row
// (the XOR of address bits 4-6 with 7-9; atoms of 8 rows = 1024 bytes, so tiles start 1024-byte
// aligned). Conflict-free for ldmatrix too. The prefill's tiles and the probe chunks use it.
template <int R>
__host__ __device__ constexpr int swizzle128_offset(int r, int c) {
    return ((c >> 3) * R + r) * 64 + (((c & 7) ^ (r & 7)) << 3);
}

// Shared-memory matrix descriptor: start address, leading and stride byte offsets, 128-byte swizzle.
// K-major B (K for S = Q K^T): SBO = 1024 (the next 8 rows), LBO unused (1). N-major B (V for O += P V,
// transposed by the instruction): SBO = 1024 (the next 8 rows along k), LBO = the next 64 columns.
__device__ __forceinline__ std::uint64_t wgmma_desc(unsigned addr, unsigned lbo, unsigned sbo) {
    return static_cast<std::uint64_t>((addr & 0x3FFFFu) >> 4) | (static_cast<std::uint64_t>(lbo >> 4) << 16) |
           (static_cast<std::uint64_t>(sbo >> 4) << 32) | (std::uint64_t{1} << 62);
}
__device__ __forceinline__ void wgmma_fence() {
#if VLSPARSE_CUDA_HAS_WGMMA
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if VLSPARSE_CUDA_HAS_WGMMA
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
// Waits until at most N of this warpgroup's wgmma commit groups are pending.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if VLSPARSE_CUDA_HAS_WGMMA
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Shared memory written by cp.async (the generic proxy) becomes visible to wgmma (the async proxy).
__device__ __forceinline__ void fence_proxy_async_shared() {
#if VLSPARSE_CUDA_HAS_WGMMA
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// mbarriers in shared memory (sm_90): the warp-specialized loop's stage hand-offs.
__device__ __forceinline__ void mbar_init(std::uint64_t* bar, unsigned count) {
#if VLSPARSE_CUDA_HAS_WGMMA
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(static_cast<unsigned>(__cvta_generic_to_shared(bar))), "r"(count)
                 : "memory");
#else
    (void)bar, (void)count;
#endif
}
// Arrive (release: this thread's earlier shared-memory writes are visible to the threads that see the phase complete).
__device__ __forceinline__ void mbar_arrive(std::uint64_t* bar) {
#if VLSPARSE_CUDA_HAS_WGMMA
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(static_cast<unsigned>(__cvta_generic_to_shared(bar)))
                 : "memory");
#else
    (void)bar;
#endif
}
// Waits until the phase with the given parity has completed (acquire).
__device__ __forceinline__ void mbar_wait(std::uint64_t* bar, unsigned parity) {
#if VLSPARSE_CUDA_HAS_WGMMA
    asm volatile(
        "{\n.reg .pred done;\nwait_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra wait_%=;\n}\n" ::"r"(static_cast<unsigned>(__cvta_generic_to_shared(bar))),
        "r"(parity)
        : "memory");
#else
    (void)bar, (void)parity;
#endif
}
// Arrive and add `bytes` to the transactions the current phase waits for (the bulk copies that complete
// on this barrier count them down).
__device__ __forceinline__ void mbar_arrive_expect_tx(std::uint64_t* bar, unsigned bytes) {
#if VLSPARSE_CUDA_HAS_WGMMA
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(static_cast<unsigned>(__cvta_generic_to_shared(bar))),
                 "r"(bytes)
                 : "memory");
#else
    (void)bar, (void)bytes;
#endif
}
// One box of a 3-D tensor map (a __grid_constant__ kernel parameter) at coordinates {c0, c1, c2} into
// shared memory at dst (1024-byte aligned for the 128-byte swizzle), completing on bar.
__device__ __forceinline__ void tma_load_3d(void* dst, const CUtensorMap* map, int c0, int c1, int c2, std::uint64_t* bar) {
#if VLSPARSE_CUDA_HAS_WGMMA
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(
            static_cast<unsigned>(__cvta_generic_to_shared(dst))),
        "l"(reinterpret_cast<std::uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2),
        "r"(static_cast<unsigned>(__cvta_generic_to_shared(bar)))
        : "memory");
#else
    (void)dst, (void)map, (void)c0, (void)c1, (void)c2, (void)bar;
#endif
}
// A contiguous copy of `bytes` (a multiple of 16; both addresses 16-byte aligned) from global into shared
// memory by the bulk copy engine, completing on bar (whose phase expects the bytes: mbar_arrive_expect_tx).
__device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned bytes, std::uint64_t* bar) {
#if VLSPARSE_CUDA_HAS_WGMMA
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                     static_cast<unsigned>(__cvta_generic_to_shared(dst))),
                 "l"(src), "r"(bytes), "r"(static_cast<unsigned>(__cvta_generic_to_shared(bar)))
                 : "memory");
#else
    (void)dst, (void)src, (void)bytes, (void)bar;
#endif
}
// Named barrier `Id` (1-15; 0 is __syncthreads') over the first `Threads` threads of the block: the
// consumer warps of a warp-specialized block, without its producer.
template <int Id, int Threads>
__device__ __forceinline__ void named_barrier_sync() {
    static_assert(Id > 0 && Id < 16 && Threads % 32 == 0, "a named barrier over whole warps");
    asm volatile("bar.sync %0, %1;\n" ::"n"(Id), "n"(Threads) : "memory");
}
template <int N>
__device__ __forceinline__ void set_max_regs_inc() {
#if VLSPARSE_CUDA_HAS_WGMMA
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}
template <int N>
__device__ __forceinline__ void set_max_regs_dec() {
#if VLSPARSE_CUDA_HAS_WGMMA
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}

// Keeps the compiler from moving accumulator accesses across the asynchronous matrix instructions.
template <int N>
__device__ __forceinline__ void wgmma_reg_fence(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int M, int N>
__device__ __forceinline__ void wgmma_reg_fence_u(unsigned (&r)[M][N]) {
#pragma unroll
    for (int i = 0; i < M; ++i)
#pragma unroll
        for (int j = 0; j < N; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}

// The instructions, one macro per shape; TY is the input type's PTX name ("bf16" or "f16"), the only
// difference between the two element types. The accumulator's registers (operands %0 ..) are written
// out once per size.
#define VLSPARSE_WGMMA_D32_LIST \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define VLSPARSE_WGMMA_D32_REGS "{" VLSPARSE_WGMMA_D32_LIST "}"
#define VLSPARSE_WGMMA_D64_REGS \
    "{" VLSPARSE_WGMMA_D32_LIST ", " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define VLSPARSE_WGMMA_D32_OUT \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), \
    "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), \
    "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), \
    "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
    "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define VLSPARSE_WGMMA_D64_OUT \
    VLSPARSE_WGMMA_D32_OUT, \
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), \
    "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), \
    "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), \
    "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), \
    "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
// D[64 x 64] (+)= A[64 x 16] (registers) * B[16 x 64] (shared memory, descriptor); TN: B is N-major.
#define VLSPARSE_WGMMA_RS_N64(TY) \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n" \
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " VLSPARSE_WGMMA_D32_REGS ", " \
                 "{%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n" \
                 : VLSPARSE_WGMMA_D32_OUT \
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(scale_d), "n"(TN))
// D[64 x 128] (+)= A[64 x 16] (registers) * B[16 x 128] (shared memory, descriptor); TN: B is N-major.
#define VLSPARSE_WGMMA_RS_N128(TY) \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n" \
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " VLSPARSE_WGMMA_D64_REGS ", " \
                 "{%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n" \
                 : VLSPARSE_WGMMA_D64_OUT \
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(scale_d), "n"(TN))
// D[64 x 128] (+)= A[64 x 16] * B[16 x 128], both from shared memory (descriptors, K-major).
#define VLSPARSE_WGMMA_SS_N128(TY) \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n" \
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " VLSPARSE_WGMMA_D64_REGS ", " \
                 "%64, %65, p, 1, 1, 0, 0;\n}\n" \
                 : VLSPARSE_WGMMA_D64_OUT \
                 : "l"(desc_a), "l"(desc_b), "r"(scale_d))

template <class T, int TN>
__device__ __forceinline__ void wgmma_rs_n64(float (&d)[32], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                             std::uint64_t desc, int scale_d) {
#if VLSPARSE_CUDA_HAS_WGMMA
    if constexpr (std::is_same_v<T, bfloat16>) VLSPARSE_WGMMA_RS_N64("bf16");
    else VLSPARSE_WGMMA_RS_N64("f16");
#else
    (void)d, (void)a0, (void)a1, (void)a2, (void)a3, (void)desc, (void)scale_d;
#endif
}
template <class T, int TN>
__device__ __forceinline__ void wgmma_rs_n128(float (&d)[64], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                              std::uint64_t desc, int scale_d) {
#if VLSPARSE_CUDA_HAS_WGMMA
    if constexpr (std::is_same_v<T, bfloat16>) VLSPARSE_WGMMA_RS_N128("bf16");
    else VLSPARSE_WGMMA_RS_N128("f16");
#else
    (void)d, (void)a0, (void)a1, (void)a2, (void)a3, (void)desc, (void)scale_d;
#endif
}
template <class T>
__device__ __forceinline__ void wgmma_ss_n128(float (&d)[64], std::uint64_t desc_a, std::uint64_t desc_b, int scale_d) {
#if VLSPARSE_CUDA_HAS_WGMMA
    if constexpr (std::is_same_v<T, bfloat16>) VLSPARSE_WGMMA_SS_N128("bf16");
    else VLSPARSE_WGMMA_SS_N128("f16");
#else
    (void)d, (void)desc_a, (void)desc_b, (void)scale_d;
#endif
}
#undef VLSPARSE_WGMMA_RS_N64
#undef VLSPARSE_WGMMA_SS_N128
#undef VLSPARSE_WGMMA_RS_N128
#undef VLSPARSE_WGMMA_D32_LIST
#undef VLSPARSE_WGMMA_D32_REGS
#undef VLSPARSE_WGMMA_D32_OUT
#undef VLSPARSE_WGMMA_D64_REGS
#undef VLSPARSE_WGMMA_D64_OUT

// 1 where this kernel was compiled with the sm_90a instructions, else 0.
template <int Unused = 0>
__global__ void wgmma_flag_kernel(int* out) {
    *out = VLSPARSE_CUDA_HAS_WGMMA;
}

// The answer of ask(dev) for the current device, asked once per device and then read from `known`
// (0 unknown, 1 no, 2 yes; devices past its size are asked every time).
inline constexpr int kMaxDevicesCached = 64;
template <class Ask>
bool per_device_answer(std::atomic<int> (&known)[kMaxDevicesCached], const char* fn, Ask&& ask) {
    int dev = 0;
    check_cuda(cudaGetDevice(&dev), fn, "cudaGetDevice");
    const bool cached = dev >= 0 && dev < kMaxDevicesCached;
    if (cached && known[dev].load(std::memory_order_relaxed) != 0) return known[dev].load(std::memory_order_relaxed) == 2;
    const bool yes = ask(dev);
    if (cached) known[dev].store(yes ? 2 : 1, std::memory_order_relaxed);
    return yes;
}

// Compute capability 9.0 (Hopper) of the current device.
inline bool device_is_sm90(const char* fn) {
    static std::atomic<int> known[kMaxDevicesCached] = {};
    return per_device_answer(known, fn, [fn](int dev) {
        int major = 0, minor = 0;
        check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), fn, "cudaDeviceGetAttribute");
        check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev), fn, "cudaDeviceGetAttribute");
        return major == 9 && minor == 0;
    });
}

// Whether kernels of this binary run the sm_90a instructions on the current device: a compute
// capability 9.0 GPU and sm_90a code loaded for it. Asked once per device (a one-thread kernel and a
// copy back, synchronous).
inline bool wgmma_runs_here(const char* fn) {
    static std::atomic<int> known[kMaxDevicesCached] = {};
    return per_device_answer(known, fn, [fn](int) {
        if (!device_is_sm90(fn)) return false;
        int* flag = nullptr;
        check_cuda(cudaMalloc(&flag, sizeof(int)), fn, "cudaMalloc");
        wgmma_flag_kernel<><<<1, 1>>>(flag);
        int h = 0;
        cudaError_t e = cudaGetLastError();
        if (e == cudaSuccess) e = cudaMemcpy(&h, flag, sizeof(int), cudaMemcpyDeviceToHost);
        cudaFree(flag);
        check_cuda(e, fn, "wgmma_flag_kernel");
        return h == 1;
    });
}

}  // namespace vlsparse::cuda::detail
