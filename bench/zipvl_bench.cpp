// ZipVL prefill vs dense SIMD attention on structured synthetic input.
//
// For each n: dense causal attention (SIMD) once as the baseline, then for each tau the ZipVL prefill
// split into its two parts: selection (probe attention + scores + p + top-k) and token-sparse
// attention. Prints GFLOP/s of the dense run, the selection overhead as a share of dense time, the
// measured speedup, and the ideal speedup 1/ratio^2 from the kept ratio (attention cost of |T| tokens).
// Times are medians of --reps runs after one warm-up, all measured in this process.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <vlsparse/vlsparse.hpp>
#include <vlsparse/sim/synthetic.hpp>

#include "bench_util.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

using vlsparse::bench::median_seconds;

int main(int argc, char** argv) {
    std::vector<std::int64_t> ns = {2048, 4096, 8192};
    std::vector<double> taus = {0.95, 0.975};
    int reps = 3;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--n" && i + 1 < argc) {
            ns.clear();
            std::string s = argv[++i];
            for (std::size_t p = 0; p < s.size();) {
                const auto c = s.find(',', p);
                ns.push_back(std::stoll(s.substr(p, c - p)));
                p = c == std::string::npos ? s.size() : c + 1;
            }
        } else if (a == "--reps" && i + 1 < argc) {
            reps = std::max(1, std::atoi(argv[++i]));
        } else {
            std::printf("usage: zipvl_bench [--n 2048,4096,8192] [--reps 3]\n");
            return a == "--help" ? 0 : 2;
        }
    }
    const std::int64_t H = 8, Hkv = 8, d = 128;
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    std::printf("zipvl_bench: H = %lld, H_kv = %lld, d = %lld, fp32, threads = %d, median of %d runs\n",
                static_cast<long long>(H), static_cast<long long>(Hkv), static_cast<long long>(d), threads, reps);
    std::printf("input: vlsparse::sim::synthetic_layer on layout text:64,image:n-96,text:32 (seed 1, layer 3)\n\n");
    std::printf("%6s %6s %10s %10s %8s %9s %10s %9s %9s %9s %8s\n", "n", "tau", "dense ms", "GFLOP/s", "kept",
                "select ms", "overhead", "sparse ms", "zipvl ms", "speedup", "ideal");
    for (const auto n : ns) {
        const auto layout = vlsparse::Layout::parse("text:64,image:" + std::to_string(n - 96) + ",text:32");
        vlsparse::sim::SyntheticParams S;
        S.n_heads = H;
        S.n_kv_heads = Hkv;
        S.head_dim = d;
        S.version = 1;  // the generator the figures in docs/performance.md were measured with
        const auto L = vlsparse::sim::synthetic_layer(layout, S, 3);
        const vlsparse::View3<const float> q(L.q.data(), {n, H, d}), k(L.k.data(), {n, Hkv, d}), v(L.v.data(), {n, Hkv, d});
        std::vector<float> out(static_cast<std::size_t>(n * H * d));
        const vlsparse::View3<float> o(out.data(), {n, H, d});
        const double t_dense = median_seconds(reps, [&] { vlsparse::simd::dense_attention(q, k, v, o); });
        const double flops = 4.0 * static_cast<double>(d * H) * static_cast<double>(n) * static_cast<double>(n + 1) / 2.0;
        for (const double tau : taus) {
            vlsparse::ZipVLParams P;
            P.tau = tau;
            vlsparse::ZipVLSelection sel;
            const double t_sel = median_seconds(reps, [&] { sel = vlsparse::simd::zipvl_select(q, k, layout, 3, P); });
            const double t_sparse = median_seconds(reps, [&] { vlsparse::simd::zipvl_prefill(q, k, v, sel, o, P); });
            const double ratio = sel.kept_ratio();
            std::printf("%6lld %6.3f %10.1f %10.1f %7.1f%% %9.1f %9.1f%% %9.1f %9.1f %8.2fx %7.2fx\n",
                        static_cast<long long>(n), tau, 1e3 * t_dense, flops / t_dense * 1e-9, 100.0 * ratio,
                        1e3 * t_sel, 100.0 * t_sel / t_dense, 1e3 * t_sparse, 1e3 * (t_sel + t_sparse),
                        t_dense / (t_sel + t_sparse), 1.0 / (ratio * ratio));
        }
    }
    std::printf("\noverhead = selection time / dense time; speedup = dense / (selection + sparse);\n"
                "ideal = 1 / kept_ratio^2 (the attention cost of the kept tokens alone, no selection).\n");
    return 0;
}
