// Indexed decode attention (A-VL's non-refresh steps) against dense decode over the full cache and
// against gather-then-dense, on one layer's KV cache.
//
// The cache holds n tokens (default 16384) of H_kv = 8 KV heads, d = 128, queried by H = 32 heads
// (GQA 4). The index list keeps `frac` (default 30%) of the rows: a shared list of 10% contiguous
// "text" rows plus randomly scattered "image" rows, as A-VL's core + non-image list looks. Reported:
// median time of one decode step, the ratio to dense decode, and the bytes of K/V each variant must
// read per second against this machine's read bandwidth, measured here by a parallel streaming sum
// over a 1 GiB buffer. Gather-then-dense = the time to copy the listed rows into a preallocated
// buffer + dense decode over a cache of exactly those rows. Before every timed run a 256 MiB buffer is read so no variant starts from a
// warm last-level cache. Times are medians of --reps runs after one warm-up. The line after each
// dtype says how much of the process's memory the kernel backs with transparent huge pages (the KV
// cache asks for them: detail/large_page_allocator.hpp).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <vlsparse/vlsparse.hpp>

#include "bench_util.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

using namespace vlsparse;

namespace {

std::vector<float> g_flush(64ull << 20);  // 256 MiB
float g_sink = 0.0f;

void flush_caches() {
    float s = 0.0f;
    for (std::size_t i = 0; i < g_flush.size(); i += 16) s += g_flush[i];
    g_sink += s;
}

// AnonHugePages of this process in MiB (Linux), or -1 where /proc does not say. The KV cache's
// blocks are advised for transparent huge pages; this shows whether the kernel granted them.
double anon_huge_mib() {
    std::FILE* f = std::fopen("/proc/self/smaps_rollup", "r");
    if (!f) return -1.0;
    char line[256];
    double kb = -1.0;
    while (std::fgets(line, sizeof line, f))
        if (std::sscanf(line, "AnonHugePages: %lf kB", &kb) == 1) break;
    std::fclose(f);
    return kb < 0.0 ? -1.0 : kb / 1024.0;
}

template <class F>
double median_seconds(int reps, F&& f) {
    flush_caches();
    f();  // warm-up
    std::vector<double> t;
    for (int r = 0; r < reps; ++r) {
        flush_caches();
        const auto t0 = std::chrono::steady_clock::now();
        f();
        t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

// Read bandwidth: a parallel sum over a 1 GiB float buffer (bytes / best of 5 runs).
double read_bandwidth() {
    const std::size_t n = 256ull << 20;
    std::vector<float> buf(n, 1.0f);
    double best = 1e30;
    for (int r = 0; r < 5; ++r) {
        double s = 0.0;
        const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel for reduction(+ : s) schedule(static)
        for (std::int64_t i = 0; i < static_cast<std::int64_t>(n); i += 16) {
            float a = 0.0f;
            for (int j = 0; j < 16; ++j) a += buf[static_cast<std::size_t>(i + j)];
            s += a;
        }
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        g_sink += static_cast<float>(s);
    }
    return static_cast<double>(n * sizeof(float)) / best;
}

template <class T>
void run(const char* dtype, std::int64_t n, double frac, int reps, double bw) {
    const std::int64_t H = 32, Hkv = 8, d = 128;
    SplitMix64 rng(42);
    std::vector<T> k(static_cast<std::size_t>(n * Hkv * d)), v(k.size()), q(static_cast<std::size_t>(H * d));
    for (auto& x : k) x = from_float<T>(static_cast<float>(rng.uniform() - 0.5));
    for (auto& x : v) x = from_float<T>(static_cast<float>(rng.uniform() - 0.5));
    for (auto& x : q) x = from_float<T>(static_cast<float>(rng.uniform() - 0.5));
    KvCache<T> cache(Hkv, d);
    cache.assign(View3<const T>(k.data(), {n, Hkv, d}), View3<const T>(v.data(), {n, Hkv, d}));
    // 10% contiguous rows at the end ("text" + decode tokens), the rest of the budget scattered.
    const CacheRows rows{bench::avl_shaped_rows(n, frac, rng)};
    const std::int64_t m = rows.longest();
    std::vector<float> out(static_cast<std::size_t>(H * d));
    const View2<const T> qv(q.data(), {H, d});
    const View2<float> ov(out.data(), {H, d});
    AttentionOptions opt;
    opt.check_finite = false;  // time the attention, not the input scan (an engine validates once)

    const double t_dense = median_seconds(reps, [&] { simd::decode_attention(qv, cache, ov, opt); });
    const double t_idx = median_seconds(reps, [&] { simd::indexed_decode_attention(qv, cache, rows, ov, opt); });
    // Gather-then-dense: copy the listed rows into a preallocated [m, H_kv, d] buffer (an engine's
    // scratch), then dense decode over a cache holding exactly those rows (built once, outside the
    // timing: its decode time alone is also the floor for reading 30% of the rows contiguously).
    std::vector<T> gk(static_cast<std::size_t>(m * Hkv * d)), gv(gk.size());
    auto gather = [&] {
        const auto list = rows.list(0);
        for (std::size_t r = 0; r < list.size(); ++r)
            for (std::int64_t g = 0; g < Hkv; ++g) {
                std::copy_n(cache.k(g).data + list[r] * d, d, gk.data() + (static_cast<std::int64_t>(r) * Hkv + g) * d);
                std::copy_n(cache.v(g).data + list[r] * d, d, gv.data() + (static_cast<std::int64_t>(r) * Hkv + g) * d);
            }
    };
    const double t_copy = median_seconds(reps, gather);
    KvCache<T> compact(Hkv, d);
    compact.assign(View3<const T>(gk.data(), {m, Hkv, d}), View3<const T>(gv.data(), {m, Hkv, d}));
    const double t_compact = median_seconds(reps, [&] { simd::decode_attention(qv, compact, ov, opt); });
    const double t_gather = t_copy + t_compact;
    const double bytes_full = static_cast<double>(n * Hkv * d * 2) * sizeof(T);
    const double bytes_idx = static_cast<double>(m * Hkv * d * 2) * sizeof(T);
    std::printf("%-5s n=%-6lld list=%5.1f%%  dense %8.3f ms (%5.1f GB/s, %3.0f%% of bw)  indexed %8.3f ms "
                "(%5.1f GB/s, %3.0f%%)  = %5.1f%% of dense  gather %7.3f + dense %7.3f = %8.3f ms (%5.1f%% of dense)\n",
                dtype, static_cast<long long>(n), 100.0 * static_cast<double>(m) / static_cast<double>(n), 1e3 * t_dense,
                bytes_full / t_dense / 1e9, 100.0 * bytes_full / t_dense / bw, 1e3 * t_idx, bytes_idx / t_idx / 1e9,
                100.0 * bytes_idx / t_idx / bw, 100.0 * t_idx / t_dense, 1e3 * t_copy, 1e3 * t_compact, 1e3 * t_gather, 100.0 * t_gather / t_dense);
    std::printf("      KV cache %.0f MiB; transparent huge pages held by this process: %.0f MiB\n", bytes_full / 1048576.0,
                anon_huge_mib());
}

}  // namespace

int main(int argc, char** argv) {
    std::int64_t n = 16384;
    double frac = 0.3;
    int reps = 9;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--n" && i + 1 < argc) n = std::atoll(argv[++i]);
        else if (a == "--frac" && i + 1 < argc) frac = std::atof(argv[++i]);
        else if (a == "--reps" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
        else {
            std::printf("usage: avl_bench [--n 16384] [--frac 0.3] [--reps 9]\n");
            return a == "--help" ? 0 : 2;
        }
    }
    if (n < 20 || !(frac > 0.1 && frac <= 1.0)) {
        std::printf("avl_bench: need n >= 20 and 0.1 < frac <= 1\n");
        return 2;
    }
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    for (auto& x : g_flush) x = 1.0f;
    const double bw = read_bandwidth();
    std::printf("avl_bench: H=32 H_kv=8 d=128, %d thread(s), %s; measured read bandwidth %.1f GB/s\n", threads,
                simd::native_arch::name(), bw / 1e9);
    run<float>("fp32", n, frac, reps, bw);
    run<bfloat16>("bf16", n, frac, reps, bw);
    if (g_sink == 12345.0f) std::puts("");
    return 0;
}
