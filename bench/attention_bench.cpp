// attention_bench: dense causal attention, SIMD path (vlsparse::simd) against the scalar reference.
//
//   attention_bench [--n 2048,4096,8192] [--reps 5] [--threads N] [--heads 8] [--kv-heads 8] [--dim 128]
//                   [--ref-rows 64] [--q-block B] [--k-chunk C]
//
// --q-block / --k-chunk override the SIMD path's block sizes (for tuning; the defaults are the
// library's VLSPARSE_SIMD_Q_BLOCK / VLSPARSE_SIMD_K_CHUNK).
// fp32 inputs, token-major [n, H, d]. Causal FLOPs = 4 * d * H * n (n + 1) / 2 (QK^T and PV, two flops
// per multiply-add). Times are the median of --reps runs after one warm-up run. The reference (double,
// scalar) is far too slow for whole runs at these sizes, so it is timed on the last --ref-rows query
// rows of every head (n_q = ref_rows against all n keys; the heaviest rows) and its full-run time is
// extrapolated by the causal FLOP count of those rows; the output says so. Columns: cpu_util =
// process CPU time / (wall time x threads) (well below 1: the machine was busy with other work, and
// the wall-time rates understate the code); GF/cpu_s/core = FLOPs per CPU-second per thread; nmse =
// SIMD output of the reference's rows against the reference (a sanity check, not the test).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include <vlsparse/attention/dense.hpp>
#include <vlsparse/core/rng.hpp>
#include <vlsparse/reference/attention.hpp>

namespace {

struct Args {
    std::vector<std::int64_t> n{2048, 4096, 8192};
    int reps = 5;
    int threads = 0;  // 0: OpenMP default
    std::int64_t H = 8, Hkv = 8, d = 128, ref_rows = 64;
    std::int64_t q_block = 0, k_chunk = 0;  // 0: the library's defaults
};

[[noreturn]] void usage(const char* msg) {
    std::fprintf(stderr,
                 "attention_bench: %s\nusage: attention_bench [--n LIST] [--reps N] [--threads N] [--heads H] "
                 "[--kv-heads H_kv] [--dim d] [--ref-rows R] [--q-block B] [--k-chunk C]\n",
                 msg);
    std::exit(2);
}

std::int64_t parse_int(const char* s, const char* what) {
    char* end = nullptr;
    const long long v = std::strtoll(s, &end, 10);
    if (!end || *end != '\0' || v <= 0) usage((std::string("bad value for ") + what + ": '" + s + "'").c_str());
    return v;
}

Args parse(int argc, char** argv) {
    Args a;
    for (int i = 1; i < argc; ++i) {
        const std::string k = argv[i];
        auto next = [&]() -> const char* {
            if (i + 1 >= argc) usage(("missing value after " + k).c_str());
            return argv[++i];
        };
        if (k == "--n") {
            a.n.clear();
            std::string list = next();
            std::size_t pos = 0;
            while (pos <= list.size()) {
                const std::size_t comma = list.find(',', pos);
                const std::string item = list.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
                a.n.push_back(parse_int(item.c_str(), "--n"));
                if (comma == std::string::npos) break;
                pos = comma + 1;
            }
        } else if (k == "--reps") {
            a.reps = static_cast<int>(parse_int(next(), "--reps"));
        } else if (k == "--threads") {
            a.threads = static_cast<int>(parse_int(next(), "--threads"));
        } else if (k == "--heads") {
            a.H = parse_int(next(), "--heads");
        } else if (k == "--kv-heads") {
            a.Hkv = parse_int(next(), "--kv-heads");
        } else if (k == "--dim") {
            a.d = parse_int(next(), "--dim");
        } else if (k == "--ref-rows") {
            a.ref_rows = parse_int(next(), "--ref-rows");
        } else if (k == "--q-block") {
            a.q_block = parse_int(next(), "--q-block");
        } else if (k == "--k-chunk") {
            a.k_chunk = parse_int(next(), "--k-chunk");
        } else if (k == "--help" || k == "-h") {
            usage("help");
        } else {
            usage(("unknown argument " + k).c_str());
        }
    }
    if (a.H % a.Hkv != 0) usage("--heads must be a multiple of --kv-heads");
    return a;
}

std::vector<float> random_floats(std::size_t count, std::uint64_t seed) {
    vlsparse::SplitMix64 rng(seed);
    std::vector<float> v(count);
    for (auto& x : v) x = static_cast<float>(2.0 * rng.uniform() - 1.0);
    return v;
}

struct Timing {
    double median_s = 0.0;  // median wall time
    double cpu_util = 0.0;  // process CPU time / (wall time * threads) over the timed runs
    double cpu_s = 0.0;     // process CPU time per run (all threads)
};

// Median wall time of `reps` runs after one warm-up. cpu_util well below 1 means the machine was
// busy with other work (or threads idled): then the wall times overstate the cost.
template <class F>
Timing time_runs(int reps, int threads, F&& f) {
    f();  // warm-up
    std::vector<double> t;
    const std::clock_t c0 = std::clock();
    double wall = 0.0;
    for (int r = 0; r < reps; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        f();
        const auto t1 = std::chrono::steady_clock::now();
        t.push_back(std::chrono::duration<double>(t1 - t0).count());
        wall += t.back();
    }
    const double cpu = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
    std::sort(t.begin(), t.end());
    return {t[t.size() / 2], cpu / (wall * threads), cpu / reps};
}

// Causal FLOPs of query rows [r0, r1) of an n-key prefill (row i sees i + 1 keys).
double causal_flops(std::int64_t n_keys, std::int64_t n_q, std::int64_t H, std::int64_t d) {
    // rows at positions n_keys - n_q .. n_keys - 1 see n_keys - n_q + 1 .. n_keys keys
    const double lo = static_cast<double>(n_keys - n_q + 1), hi = static_cast<double>(n_keys);
    const double keys = (lo + hi) * static_cast<double>(n_q) / 2.0;
    return 4.0 * static_cast<double>(d) * static_cast<double>(H) * keys;
}

}  // namespace

int main(int argc, char** argv) {
    const Args a = parse(argc, argv);
    int threads = 1;
#ifdef _OPENMP
    if (a.threads > 0) omp_set_num_threads(a.threads);
    threads = omp_get_max_threads();
#else
    if (a.threads > 1) std::fprintf(stderr, "note: built without OpenMP; --threads %d ignored, running 1 thread\n", a.threads);
#endif
    vlsparse::simd::detail::Blocking blocking;
    if (a.q_block > 0) blocking.q_block = a.q_block;
    if (a.k_chunk > 0) blocking.k_chunk = a.k_chunk;
    std::printf("dense causal attention, fp32, H=%lld H_kv=%lld d=%lld, threads=%d, SIMD arch %s, "
                "q_block=%lld k_chunk=%lld, median of %d runs after 1 warm-up\n",
                static_cast<long long>(a.H), static_cast<long long>(a.Hkv), static_cast<long long>(a.d), threads,
                vlsparse::simd::native_arch::name(), static_cast<long long>(blocking.q_block),
                static_cast<long long>(blocking.k_chunk), a.reps);
    std::printf("reference: timed on the last %lld query rows of every head (all keys visible to them), "
                "full-run time extrapolated by causal FLOPs\n",
                static_cast<long long>(a.ref_rows));
    std::printf("%7s %9s %9s %10s %14s %9s %15s %12s %10s %9s %10s\n", "n", "GFLOP", "simd_s", "simd_GF/s",
                "simd_GF/s/core", "cpu_util", "GF/cpu_s/core", "ref_s(extr)", "ref_GF/s", "speedup", "nmse");
    for (const std::int64_t n : a.n) {
        const std::int64_t H = a.H, Hkv = a.Hkv, d = a.d;
        const auto q = random_floats(static_cast<std::size_t>(n * H * d), 1);
        const auto k = random_floats(static_cast<std::size_t>(n * Hkv * d), 2);
        const auto v = random_floats(static_cast<std::size_t>(n * Hkv * d), 3);
        std::vector<float> out(static_cast<std::size_t>(n * H * d));
        const vlsparse::View3<const float> Q(q.data(), {n, H, d}), K(k.data(), {n, Hkv, d}), V(v.data(), {n, Hkv, d});
        const vlsparse::View3<float> O(out.data(), {n, H, d});
        const double flops = causal_flops(n, n, H, d);
        const Timing ts = time_runs(a.reps, threads, [&] {
            if (a.q_block == 0 && a.k_chunk == 0) {
                vlsparse::simd::dense_attention(Q, K, V, O);
            } else {  // the same engine with other block sizes (the public call's checks are skipped)
                const float scale = 1.0f / std::sqrt(static_cast<float>(d));
                vlsparse::simd::detail::run_attention<vlsparse::detail::native_arch>(
                    Q, K, V, O, scale, nullptr, vlsparse::UnselectedRows::zero, blocking);
            }
        });
        const double t_simd = ts.median_s;

        // Reference on the last ref_rows rows: q rows [n - R, n) against all n keys.
        const std::int64_t R = std::min(a.ref_rows, n);
        const vlsparse::View3<const float> Qs(q.data() + (n - R) * H * d, {R, H, d});
        std::vector<float> out_s(static_cast<std::size_t>(R * H * d));
        const vlsparse::View3<float> Os(out_s.data(), {R, H, d});
        const double t_ref_sub = time_runs(std::max(1, std::min(a.reps, 3)), 1, [&] {
                                     vlsparse::reference::dense_attention(Qs, K, V, Os);
                                 }).median_s;
        const double ref_rate = causal_flops(n, R, H, d) / t_ref_sub;
        // Sanity check: the SIMD output of those rows against the reference's.
        double num = 0.0, den = 0.0;
        for (std::size_t i = 0; i < out_s.size(); ++i) {
            const double x = out[static_cast<std::size_t>((n - R) * H * d) + i], y = out_s[i];
            num += (x - y) * (x - y);
            den += y * y;
        }
        const double nmse = den > 0.0 ? num / den : num;
        const double t_ref = flops / ref_rate;
        std::printf("%7lld %9.2f %9.4f %10.2f %14.2f %9.2f %15.2f %12.2f %10.3f %9.1f %10.1e\n",
                    static_cast<long long>(n), flops * 1e-9, t_simd, flops / t_simd * 1e-9, flops / t_simd * 1e-9 / threads,
                    ts.cpu_util, flops / ts.cpu_s * 1e-9, t_ref, ref_rate * 1e-9, t_ref / t_simd, nmse);
        std::fflush(stdout);
    }
    return 0;
}
