// CUDA indexed decode attention (A-VL's non-refresh steps, ZipVL's decode) against dense decode over
// the full cache, on one layer's KV cache in GPU memory -- the GPU counterpart of avl_bench.
//
// The cache holds n tokens (default 16384) of H_kv = 8 KV heads, d = 128, queried by H = 32 heads
// (GQA 4); the list keeps `frac` (default 30%) of the rows, built as avl_bench builds it (10%
// contiguous rows at the end, the rest scattered at random). Dense decode is the same call with
// every row listed. Before every timed run a 512 MiB buffer is written, so the 50 MiB L2 holds
// none of the cache; each time is a CUDA-event interval around one call (workspace preallocated,
// check_finite off), median of --reps runs after 3 warm-ups. The device's read bandwidth is
// measured in the same run (a device-to-device copy of 1 GiB: 2 bytes moved per byte copied).
// Build: meson -Dcuda=enabled (target cuda_decode_bench); run: ./cuda_decode_bench [--n N]
// [--frac F] [--reps R].
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <vlsparse/attention/cache_rows.hpp>
#include <vlsparse/core/rng.hpp>
#include <vlsparse/cuda/indexed_decode.cuh>
#include <vlsparse/kv/kv_cache.hpp>

#include "bench_util.hpp"

using namespace vlsparse;

namespace {

void ok(cudaError_t e, const char* what) {
    if (e != cudaSuccess) {
        std::fprintf(stderr, "cuda_decode_bench: %s: %s\n", what, cudaGetErrorString(e));
        std::exit(1);
    }
}

struct Timer {
    void* flush = nullptr;
    std::size_t flush_bytes = 512ull << 20;
    cudaEvent_t a{}, b{};
    Timer() {
        ok(cudaMalloc(&flush, flush_bytes), "cudaMalloc flush");
        ok(cudaEventCreate(&a), "event");
        ok(cudaEventCreate(&b), "event");
    }
    ~Timer() {
        cudaFree(flush);
        cudaEventDestroy(a);
        cudaEventDestroy(b);
    }
    template <class F>
    double median_ms(int reps, F&& f) {
        std::vector<float> t;
        for (int r = 0; r < reps + 3; ++r) {
            ok(cudaMemsetAsync(flush, r & 0xff, flush_bytes), "flush");
            ok(cudaEventRecord(a), "record");
            f();
            ok(cudaEventRecord(b), "record");
            ok(cudaEventSynchronize(b), "sync");
            float ms = 0.0f;
            ok(cudaEventElapsedTime(&ms, a, b), "elapsed");
            if (r >= 3) t.push_back(ms);
        }
        std::sort(t.begin(), t.end());
        return t[t.size() / 2];
    }
};

double read_bandwidth(Timer& tm) {
    const std::size_t bytes = 1ull << 30;
    void *src = nullptr, *dst = nullptr;
    ok(cudaMalloc(&src, bytes), "cudaMalloc");
    ok(cudaMalloc(&dst, bytes), "cudaMalloc");
    ok(cudaMemset(src, 1, bytes), "memset");
    const double ms = tm.median_ms(9, [&] { ok(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice), "copy"); });
    cudaFree(src);
    cudaFree(dst);
    return 2.0 * static_cast<double>(bytes) / (ms * 1e-3);  // bytes read + written per second
}

template <class T>
void run(const char* dtype, std::int64_t n, double frac, int reps, double bw, Timer& tm) {
    const std::int64_t H = 32, Hkv = 8, d = 128;
    SplitMix64 rng(42);
    std::vector<T> k(static_cast<std::size_t>(n * Hkv * d)), v(k.size());
    std::vector<float> q(static_cast<std::size_t>(H * d));
    for (auto& x : k) x = from_float<T>(static_cast<float>(rng.uniform() - 0.5));
    for (auto& x : v) x = from_float<T>(static_cast<float>(rng.uniform() - 0.5));
    for (auto& x : q) x = static_cast<float>(rng.uniform() - 0.5);
    KvCache<T> cache(Hkv, d);
    cache.assign(View3<const T>(k.data(), {n, Hkv, d}), View3<const T>(v.data(), {n, Hkv, d}));
    const CacheRows rows{bench::avl_shaped_rows(n, frac, rng)};  // the list avl_bench reads
    CacheRows all(1);
    for (std::int64_t i = 0; i < n; ++i) all[0].push_back(i);
    cuda::DeviceKvCache<T> dc(cache);
    cuda::DeviceRowLists dl(rows, cache), da(all, cache);
    float *qd = nullptr, *od = nullptr;
    void* ws = nullptr;
    ok(cudaMalloc(&qd, q.size() * sizeof(float)), "cudaMalloc");
    ok(cudaMalloc(&od, q.size() * sizeof(float)), "cudaMalloc");
    ok(cudaMalloc(&ws, cuda::indexed_decode_workspace_bytes(H, d, n)), "cudaMalloc");
    ok(cudaMemcpy(qd, q.data(), q.size() * sizeof(float), cudaMemcpyHostToDevice), "copy q");
    AttentionOptions opt;
    opt.check_finite = false;
    const View2<const float> qv(qd, {H, d});
    const View2<float> ov(od, {H, d});
    const double t_dense = tm.median_ms(reps, [&] { cuda::indexed_decode_attention(qv, dc.view(), da.view(), ov, opt, nullptr, ws); });
    const double t_idx = tm.median_ms(reps, [&] { cuda::indexed_decode_attention(qv, dc.view(), dl.view(), ov, opt, nullptr, ws); });
    const double bytes_full = static_cast<double>(n * Hkv * d * 2) * sizeof(T);
    const double bytes_idx = static_cast<double>(static_cast<std::int64_t>(rows[0].size()) * Hkv * d * 2) * sizeof(T);
    std::printf("%-5s n=%-6lld list=%5.1f%%  dense %8.4f ms (%6.0f GB/s, %3.0f%% of bw)  indexed %8.4f ms (%6.0f GB/s, "
                "%3.0f%%)  = %5.1f%% of dense\n",
                dtype, static_cast<long long>(n), 100.0 * static_cast<double>(rows[0].size()) / static_cast<double>(n),
                t_dense, bytes_full / (t_dense * 1e-3) / 1e9, 100.0 * bytes_full / (t_dense * 1e-3) / bw, t_idx,
                bytes_idx / (t_idx * 1e-3) / 1e9, 100.0 * bytes_idx / (t_idx * 1e-3) / bw, 100.0 * t_idx / t_dense);
    cudaFree(qd);
    cudaFree(od);
    cudaFree(ws);
}

}  // namespace

int main(int argc, char** argv) {
    std::int64_t n = 16384;
    double frac = 0.3;
    int reps = 51;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--n" && i + 1 < argc) n = std::atoll(argv[++i]);
        else if (a == "--frac" && i + 1 < argc) frac = std::atof(argv[++i]);
        else if (a == "--reps" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
        else {
            std::printf("usage: cuda_decode_bench [--n 16384] [--frac 0.3] [--reps 51]\n");
            return a == "--help" ? 0 : 2;
        }
    }
    if (n < 20 || !(frac > 0.1 && frac <= 1.0)) {
        std::printf("cuda_decode_bench: need n >= 20 and 0.1 < frac <= 1\n");
        return 2;
    }
    cudaDeviceProp prop{};
    ok(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    Timer tm;
    const double bw = read_bandwidth(tm);
    std::printf("cuda_decode_bench: %s, %d SMs, L2 %d MiB; H=32 H_kv=8 d=128; device copy bandwidth %.0f GB/s "
                "(read + write)\n",
                prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20, bw / 1e9);
    for (std::int64_t nn : {n / 4, n, n * 4}) {
        run<float>("fp32", nn, frac, reps, bw, tm);
        run<bfloat16>("bf16", nn, frac, reps, bw, tm);
    }
    return 0;
}
