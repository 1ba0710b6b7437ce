// The memory ceilings of B = 1 decode: how fast a kernel that does nothing but move the bytes a decode
// step reads can move them on this GPU, with the decode kernel's grid (256 blocks of 128 threads, two
// per multiprocessor, a 3-stage ring of 32 KiB tiles: 64 rows of K and 64 of V) and the decode
// benchmark's shapes (bf16, H_kv = 8, d = 128, head-major K / V [H_kv][n][d], one sequence):
//   stream cp.async   each block copies a contiguous chunk of K and V into its ring with 16-byte cp.async
//                     (the decode kernel's copies; every byte of a landed tile is then read once)
//   stream bulk       the same with one cp.async.bulk (TMA) per 16 KiB tile of K and of V, landing on an
//                     mbarrier (sm_90)
//   stream loads      plain 16-byte loads into registers, two tiles in flight per thread
//   stream ... +Nns   (--spin N,...) stream cp.async with every thread waiting N ns after reading each
//                     landed stage, a stand-in for the decode kernel's arithmetic on a tile
//   stream early      the same, but each stage is read first and refilled at once (every other stage
//                     in flight during the wait)
//   unit interleaved  per KV head, its 32 blocks take tiles w + 32 k in turn (a static split)
//   unit stealing     the same for each block's first 3 tiles, later ones taken from a counter per head
//                     (work stealing)
//   gather cp.async   the rows of a list, read through the list (per KV head: 256-byte rows), as the
//                     indexed decode reads them; the list of cuda_decode_bench (bench::avl_shaped_rows:
//                     the last 10% of the rows, the rest at random) at 30%, and every row (100%)
// Each figure is the median of --reps calls between CUDA events after a 512 MiB read that evicts the L2,
// the method of cuda_decode_bench, so the two compare row for row: what a decode step's time is above
// the corresponding ceiling is what its arithmetic, merge and launch structure cost. Bytes: K and V
// read (2 x 8 x rows x 256). The device-to-device copy bandwidth (read + write) is measured too.
//
//   build-gpu/bench/cuda_stream_bench [--n 4096,16384,65536,131072] [--reps 21] [--out FILE.csv] [--spin N,...]
//   CSV: method,n,frac,blocks,stages,time_us,bytes,GBps,copy_GBps
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <vlsparse/core/rng.hpp>

#include "bench_util.hpp"
#include "cuda_bench_util.cuh"

namespace {

using vlsparse::bench::cuda_die;
constexpr int kTile = 16384;  // bytes of K (and of V) per tile: 64 rows x 256 bytes
constexpr int kRowBytes = 256;
constexpr int kHkv = 8;
constexpr int kThreads = 128;
constexpr int kStages = 3;
constexpr int kBlocks = 256;

__device__ __forceinline__ unsigned smem_addr(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void cp16(void* dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst)), "l"(src));
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n"); }
template <int N>
__device__ __forceinline__ void wait_groups() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
__device__ __forceinline__ void mbar_init(unsigned long long* b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_addr(b)) : "memory");
#else
    (void)b;
#endif
}
__device__ __forceinline__ void mbar_expect(unsigned long long* b, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(b)), "r"(bytes) : "memory");
#else
    (void)b, (void)bytes;
#endif
}
__device__ __forceinline__ void mbar_wait(unsigned long long* b, unsigned parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile(
        "{\n.reg .pred p;\nwait_%=:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra wait_%=;\n}\n" ::"r"(
            smem_addr(b)),
        "r"(parity)
        : "memory");
#else
    (void)b, (void)parity;
#endif
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, unsigned long long* b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                     smem_addr(dst)),
                 "l"(src), "r"(bytes), "r"(smem_addr(b))
                 : "memory");
#else
    (void)dst, (void)src, (void)bytes, (void)b;
#endif
}

enum class Method { stream_cp_async, stream_bulk, stream_loads, stream_early };

// Reads every byte of a landed stage once (what a decode block's arithmetic would read), into acc.
__device__ __forceinline__ void consume_stage(const unsigned char* stage, int tid, unsigned& acc) {
    const uint4* p = reinterpret_cast<const uint4*>(stage);
#pragma unroll
    for (int i = 0; i < 2 * kTile / 16 / kThreads; ++i) {
        const uint4 x = p[i * kThreads + tid];
        acc ^= x.x ^ x.w;
    }
}

// Block b streams tiles [b * tpb, (b + 1) * tpb) of K and V. `sink` keeps the reads alive.
// spin_ns: after reading a landed stage, every thread waits this long (%globaltimer) before the next
// step, a stand-in for the decode kernel's arithmetic on the tile (the stage is not refilled meanwhile).
template <Method M>
__global__ void __launch_bounds__(kThreads) stream_kernel(const char* K, const char* V, int tpb, unsigned* sink,
                                                          unsigned spin_ns = 0) {
    extern __shared__ __align__(128) unsigned char sm[];
    const int tid = threadIdx.x;
    const std::size_t base = static_cast<std::size_t>(blockIdx.x) * tpb * kTile;
    unsigned acc = 0;
    if constexpr (M == Method::stream_loads) {
        for (int t = 0; t < tpb; t += 2) {
            uint4 x[32];
#pragma unroll
            for (int u = 0; u < 2; ++u)
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    const std::size_t o = base + static_cast<std::size_t>(min(t + u, tpb - 1)) * kTile + (i * kThreads + tid) * 16;
                    x[u * 16 + i] = __ldcs(reinterpret_cast<const uint4*>(K + o));
                    x[u * 16 + 8 + i] = __ldcs(reinterpret_cast<const uint4*>(V + o));
                }
#pragma unroll
            for (int i = 0; i < 32; ++i) acc ^= x[i].x ^ x[i].w;
        }
    } else {
        unsigned long long* full = reinterpret_cast<unsigned long long*>(sm + kStages * 2 * kTile);
        if (M == Method::stream_bulk && tid == 0) {
            for (int s = 0; s < kStages; ++s) mbar_init(full + s);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
            asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
        }
        __syncthreads();
        auto issue = [&](int t) {
            const int s = t % kStages;
            unsigned char* kd = sm + s * 2 * kTile;
            if (t < tpb) {
                const char* ks = K + base + static_cast<std::size_t>(t) * kTile;
                const char* vs = V + base + static_cast<std::size_t>(t) * kTile;
                if constexpr (M == Method::stream_cp_async || M == Method::stream_early) {
#pragma unroll
                    for (int i = 0; i < 8; ++i) {
                        const int c = i * kThreads + tid;
                        cp16(kd + c * 16, ks + c * 16);
                        cp16(kd + kTile + c * 16, vs + c * 16);
                    }
                } else if (tid == 0) {
                    mbar_expect(full + s, 2 * kTile);
                    bulk_copy(kd, ks, kTile, full + s);
                    bulk_copy(kd + kTile, vs, kTile, full + s);
                }
            }
            if constexpr (M == Method::stream_cp_async || M == Method::stream_early) commit();
        };
        constexpr bool early = M == Method::stream_early;
        for (int s = 0; s < kStages - (early ? 0 : 1); ++s) issue(s);
        for (int t = 0; t < tpb; ++t) {
            if constexpr (early) wait_groups<kStages - 1>();
            else if constexpr (M == Method::stream_cp_async) wait_groups<kStages - 2>();
            else mbar_wait(full + t % kStages, (t / kStages) & 1);
            __syncthreads();
            if constexpr (early) {
                // The stage is read first and refilled at once: every stage but the one being read is in
                // flight during the spin (a kernel that moved its tile into registers before computing).
                consume_stage(sm + (t % kStages) * 2 * kTile, tid, acc);
                __syncthreads();
                issue(t + kStages);
            } else {
                issue(t + kStages - 1);
                consume_stage(sm + (t % kStages) * 2 * kTile, tid, acc);
            }
            if (spin_ns) {
                unsigned long long t0, t1;
                asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
                do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
                while (t1 - t0 < spin_ns);
            }
        }
    }
    if (acc == 0x9e3779b9u) *sink = acc;
}

// Block b reads chunk b % cph of KV head b / cph's list entries: the rows' K and V through the list.
__global__ void __launch_bounds__(kThreads) gather_kernel(const char* K, const char* V, const std::int32_t* list,
                                                          std::int64_t n, int len, int cph, unsigned* sink) {
    extern __shared__ __align__(128) unsigned char sm[];
    const int tid = threadIdx.x, g = blockIdx.x / cph, c = blockIdx.x % cph;
    const int per = (len + cph - 1) / cph;
    const int e0 = c * per, e1 = min(len, e0 + per), nt = (max(0, e1 - e0) + 63) / 64;
    const std::size_t head = static_cast<std::size_t>(g) * static_cast<std::size_t>(n) * kRowBytes;
    unsigned acc = 0;
    auto issue = [&](int t) {
        unsigned char* kd = sm + (t % kStages) * 2 * kTile;
        if (t < nt) {
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const int ch = i * kThreads + tid, r = ch >> 4, w = ch & 15;  // row of the tile, 16-byte piece
                const int e = e0 + t * 64 + r;
                if (e < e1) {
                    const std::size_t o = head + static_cast<std::size_t>(__ldg(list + e)) * kRowBytes + w * 16;
                    cp16(kd + ch * 16, K + o);
                    cp16(kd + kTile + ch * 16, V + o);
                }
            }
        }
        commit();
    };
    for (int s = 0; s < kStages - 1; ++s) issue(s);
    for (int t = 0; t < nt; ++t) {
        wait_groups<kStages - 2>();
        __syncthreads();
        issue(t + kStages - 1);
        consume_stage(sm + (t % kStages) * 2 * kTile, tid, acc);
    }
    if (acc == 0x9e3779b9u) *sink = acc;
}

// Per KV head g (a decode unit), its 32 blocks b = 32 g + w stream the head's nt tiles of K and V in
// turn: tile w + 32 k for the k-th (Steal = false: a static split, the tiles interleaved), or, with
// Steal, the first kStages that way and every later one taken from a counter of the head (work
// stealing: a block on a faster multiprocessor takes more tiles). Thread 0 takes the tile of step
// t + kStages at step t, so the atomic's round trip overlaps two tiles' copies; the head's last
// block resets its counters.
template <bool Steal>
__global__ void __launch_bounds__(kThreads) unit_kernel(const char* K, const char* V, int nt, unsigned* ctr, unsigned* sink) {
    extern __shared__ __align__(128) unsigned char sm[];
    int* claim = reinterpret_cast<int*>(sm + kStages * 2 * kTile);  // [8]: tiles of steps >= kStages
    constexpr int nw = kBlocks / kHkv;
    const int tid = threadIdx.x, g = blockIdx.x / nw, w = blockIdx.x % nw;
    const std::size_t head = static_cast<std::size_t>(g) * static_cast<std::size_t>(nt) * kTile;
    unsigned acc = 0;
    auto tile_of = [&](int s) -> int { return !Steal || s < kStages ? w + s * nw : claim[s & 7]; };
    auto issue = [&](int s) {
        const int tile = tile_of(s);
        unsigned char* kd = sm + (s % kStages) * 2 * kTile;
        if (tile < nt) {
            const char* ks = K + head + static_cast<std::size_t>(tile) * kTile;
            const char* vs = V + head + static_cast<std::size_t>(tile) * kTile;
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const int c = i * kThreads + tid;
                cp16(kd + c * 16, ks + c * 16);
                cp16(kd + kTile + c * 16, vs + c * 16);
            }
        }
        commit();
    };
    for (int s = 0; s < kStages - 1; ++s) issue(s);
    for (int t = 0;; ++t) {
        wait_groups<kStages - 2>();
        __syncthreads();
        if (tile_of(t) >= nt) break;  // (the tiles of a block's steps increase)
        if (Steal && tid == 0) claim[(t + kStages) & 7] = kStages * nw + static_cast<int>(atomicAdd(ctr + g, 1u));
        issue(t + kStages - 1);
        consume_stage(sm + (t % kStages) * 2 * kTile, tid, acc);
    }
    if (Steal) {
        __syncthreads();
        if (tid == 0 && atomicAdd(ctr + kHkv + g, 1u) == nw - 1) {
            ctr[g] = 0;
            ctr[kHkv + g] = 0;
        }
    }
    if (acc == 0x9e3779b9u) *sink = acc;
}

void ck(cudaError_t e, const char* what) {
    if (e != cudaSuccess) cuda_die(what, e);
}

struct Bench {
    char *K = nullptr, *V = nullptr;
    unsigned* sink = nullptr;
    void* flush = nullptr;
    static constexpr std::size_t kFlush = std::size_t{512} << 20;
    cudaEvent_t a{}, b{};
    int reps = 21;
    double copy_gbps = 0.0;
    std::FILE* csv = nullptr;

    template <class F>
    double median_us(F&& launch) {
        std::vector<float> t;
        for (int r = 0; r < reps + 3; ++r) {
            vlsparse::bench::bench_read_flush<><<<1056, 512>>>(static_cast<const uint4*>(flush), kFlush / 16, sink);
            ck(cudaEventRecord(a), "cudaEventRecord");
            launch();
            ck(cudaEventRecord(b), "cudaEventRecord");
            ck(cudaEventSynchronize(b), "cudaEventSynchronize");
            ck(cudaGetLastError(), "kernel");
            float ms = 0.0f;
            ck(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
            if (r >= 3) t.push_back(ms * 1000.0f);
        }
        std::sort(t.begin(), t.end());
        return t[t.size() / 2];
    }
    void row(const char* method, long long n, double frac, int blocks, double us, double bytes) {
        const double gbps = bytes / (us * 1e-6) / 1e9;
        std::printf("%-16s n=%-7lld list %3.0f%%  %9.1f us  %6.0f GB/s  %3.0f%% of copy bw\n", method, n, frac * 100, us,
                    gbps, 100.0 * gbps / copy_gbps);
        if (csv)
            std::fprintf(csv, "%s,%lld,%.2f,%d,%d,%.2f,%.0f,%.1f,%.1f\n", method, n, frac, blocks, kStages, us, bytes, gbps,
                         copy_gbps);
    }
};

template <Method M>
void run_stream(Bench& B, const char* name, long long n, unsigned spin_ns = 0) {
    const std::size_t bytes_each = static_cast<std::size_t>(kHkv) * static_cast<std::size_t>(n) * kRowBytes;
    const int tpb = static_cast<int>(bytes_each / kTile / kBlocks);
    const int smem = M == Method::stream_loads ? 0 : kStages * 2 * kTile + 64;
    ck(cudaFuncSetAttribute(stream_kernel<M>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "cudaFuncSetAttribute");
    const double us = B.median_us([&] { stream_kernel<M><<<kBlocks, kThreads, smem>>>(B.K, B.V, tpb, B.sink, spin_ns); });
    std::string label = name;
    if (spin_ns) label += " +" + std::to_string(spin_ns) + "ns";
    B.row(label.c_str(), n, 1.0, kBlocks, us, 2.0 * static_cast<double>(tpb) * kBlocks * kTile);
}

template <bool Steal>
void run_unit(Bench& B, const char* name, long long n, unsigned* ctr) {
    const int nt = static_cast<int>(n * kRowBytes / kTile);
    const int smem = kStages * 2 * kTile + 64;
    ck(cudaFuncSetAttribute(unit_kernel<Steal>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "cudaFuncSetAttribute");
    const double us = B.median_us([&] { unit_kernel<Steal><<<kBlocks, kThreads, smem>>>(B.K, B.V, nt, ctr, B.sink); });
    B.row(name, n, 1.0, kBlocks, us, 2.0 * kHkv * static_cast<double>(nt) * kTile);
}

void run_gather(Bench& B, long long n, double frac) {
    vlsparse::SplitMix64 rng(20261127);
    std::vector<std::int32_t> list;
    for (const auto r : vlsparse::bench::avl_shaped_rows(n, frac, rng)) list.push_back(static_cast<std::int32_t>(r));
    std::int32_t* dl = nullptr;
    ck(cudaMalloc(&dl, list.size() * sizeof(std::int32_t)), "cudaMalloc");
    ck(cudaMemcpy(dl, list.data(), list.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice), "cudaMemcpy");
    const int smem = kStages * 2 * kTile;
    ck(cudaFuncSetAttribute(gather_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "cudaFuncSetAttribute");
    const int cph = kBlocks / kHkv, len = static_cast<int>(list.size());
    const double us = B.median_us([&] { gather_kernel<<<kBlocks, kThreads, smem>>>(B.K, B.V, dl, n, len, cph, B.sink); });
    B.row("gather cp.async", n, frac, kBlocks, us, 2.0 * kHkv * static_cast<double>(list.size()) * kRowBytes);
    ck(cudaFree(dl), "cudaFree");
}

}  // namespace

int main(int argc, char** argv) {
    std::vector<std::int64_t> ns{4096, 16384, 65536, 131072};
    Bench B;
    const char* out = nullptr;
    std::vector<std::int64_t> spins;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--n" && i + 1 < argc) ns = vlsparse::bench::parse_size_list(argv[++i]);
        else if (a == "--reps" && i + 1 < argc) B.reps = std::max(1, std::atoi(argv[++i]));
        else if (a == "--out" && i + 1 < argc) out = argv[++i];
        else if (a == "--spin" && i + 1 < argc) spins = vlsparse::bench::parse_size_list(argv[++i]);
        else {
            std::printf("usage: cuda_stream_bench [--n 4096,16384,65536,131072] [--reps 21] [--out FILE.csv] "
                        "[--spin NS,NS,...]\n");
            return a == "--help" || a == "-h" ? 0 : 2;
        }
    }
    for (const auto n : ns)
        if (n % 4096 != 0) {
            std::fprintf(stderr, "cuda_stream_bench: n must be a multiple of 4096 (whole tile pairs for 256 blocks), got %lld\n",
                         static_cast<long long>(n));
            return 2;
        }
    const std::int64_t nmax = *std::max_element(ns.begin(), ns.end());
    const std::size_t bytes = static_cast<std::size_t>(kHkv) * static_cast<std::size_t>(nmax) * kRowBytes;
    cudaDeviceProp p{};
    ck(cudaGetDeviceProperties(&p, 0), "cudaGetDeviceProperties");
    ck(cudaMalloc(&B.K, bytes), "cudaMalloc K");
    ck(cudaMalloc(&B.V, bytes), "cudaMalloc V");
    ck(cudaMemset(B.K, 1, bytes), "cudaMemset");
    ck(cudaMemset(B.V, 2, bytes), "cudaMemset");
    ck(cudaMalloc(&B.sink, 64), "cudaMalloc");
    ck(cudaMalloc(&B.flush, Bench::kFlush), "cudaMalloc flush");
    ck(cudaMemset(B.flush, 0, Bench::kFlush), "cudaMemset");
    ck(cudaEventCreate(&B.a), "cudaEventCreate");
    ck(cudaEventCreate(&B.b), "cudaEventCreate");
    {
        void *s = nullptr, *d = nullptr;
        const std::size_t cb = std::size_t{1} << 30;
        ck(cudaMalloc(&s, cb), "cudaMalloc");
        ck(cudaMalloc(&d, cb), "cudaMalloc");
        std::vector<float> t;
        for (int r = 0; r < 8; ++r) {
            ck(cudaEventRecord(B.a), "cudaEventRecord");
            ck(cudaMemcpy(d, s, cb, cudaMemcpyDeviceToDevice), "cudaMemcpy");
            ck(cudaEventRecord(B.b), "cudaEventRecord");
            ck(cudaEventSynchronize(B.b), "cudaEventSynchronize");
            float ms = 0.0f;
            ck(cudaEventElapsedTime(&ms, B.a, B.b), "cudaEventElapsedTime");
            t.push_back(ms);
        }
        std::sort(t.begin(), t.end());
        B.copy_gbps = 2.0 * static_cast<double>(cb) / (t[t.size() / 2] * 1e-3) / 1e9;
        ck(cudaFree(s), "cudaFree");
        ck(cudaFree(d), "cudaFree");
    }
    std::printf("cuda_stream_bench: %s, %d SMs; device copy %.0f GB/s (read + write); %d blocks x %d threads, %d stages "
                "of 32 KiB; medians of %d\n",
                p.name, p.multiProcessorCount, B.copy_gbps, kBlocks, kThreads, kStages, B.reps);
    if (out) {
        B.csv = std::fopen(out, "w");
        if (!B.csv) {
            std::fprintf(stderr, "cuda_stream_bench: cannot write %s\n", out);
            return 1;
        }
        std::fprintf(B.csv, "method,n,frac,blocks,stages,time_us,bytes,GBps,copy_GBps\n");
    }
    const bool bulk = p.major >= 9;
    {   // Warm-up, untimed: ~0.3 s of the first configuration. Without it the first configuration measured
        // in a process came out 16% slow for its whole series (29.6 against 25.5 us at 16K, H100), twice.
        std::FILE* keep = B.csv;
        B.csv = nullptr;
        const int reps = B.reps;
        B.reps = 1000;
        const std::size_t bytes_each = static_cast<std::size_t>(kHkv) * static_cast<std::size_t>(ns.front()) * kRowBytes;
        const int tpb = static_cast<int>(bytes_each / kTile / kBlocks);
        const int smem = kStages * 2 * kTile + 64;
        ck(cudaFuncSetAttribute(stream_kernel<Method::stream_cp_async>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
           "cudaFuncSetAttribute");
        (void)B.median_us([&] { stream_kernel<Method::stream_cp_async><<<kBlocks, kThreads, smem>>>(B.K, B.V, tpb, B.sink); });
        B.reps = reps;
        B.csv = keep;
    }
    unsigned* ctr = nullptr;
    ck(cudaMalloc(&ctr, 2 * kHkv * sizeof(unsigned)), "cudaMalloc");
    ck(cudaMemset(ctr, 0, 2 * kHkv * sizeof(unsigned)), "cudaMemset");
    for (const auto n : ns) {
        run_stream<Method::stream_cp_async>(B, "stream cp.async", n);
        for (const auto sp : spins) run_stream<Method::stream_cp_async>(B, "stream cp.async", n, static_cast<unsigned>(sp));
        for (const auto sp : spins) run_stream<Method::stream_early>(B, "stream early", n, static_cast<unsigned>(sp));
        run_unit<false>(B, "unit interleaved", n, ctr);
        run_unit<true>(B, "unit stealing", n, ctr);
        if (bulk) run_stream<Method::stream_bulk>(B, "stream bulk", n);
        run_stream<Method::stream_loads>(B, "stream loads", n);
        run_gather(B, n, 1.0);
        run_gather(B, n, 0.3);
    }
    if (!bulk) std::printf("(stream bulk: needs sm_90, not run on this GPU)\n");
    ck(cudaFree(ctr), "cudaFree");
    if (B.csv) std::fclose(B.csv);
    return 0;
}
