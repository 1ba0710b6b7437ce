// BlindSight masked attention vs dense SIMD attention on structured synthetic input.
//
// Layout: 8 images of 1000 tokens, each wrapped in <image_start>/<image_end> delimiters with 16 text
// tokens after it (8 after the last), 56 text tokens first: n = 8192. For each template (one template
// for all heads): the block mask build time, the masked attention time, the measured speedup over
// dense causal attention (simd::dense_attention), and the ideal speedup pairs(Dense) / pairs(template)
// from the exact pair count; "of ideal" = measured / ideal. Dense and masked attention alternate in
// --reps rounds after a warm-up (a load change on a shared machine then hits both sides of a round's
// ratio alike); the table gives median times, the median of the rounds' ratios and their range.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
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
    int reps = 5;
    std::int64_t q_block = 128, k_block = 128;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--reps" && i + 1 < argc) {
            reps = std::max(1, std::atoi(argv[++i]));
        } else if (a == "--q-block" && i + 1 < argc) {
            q_block = std::max(1, std::atoi(argv[++i]));
        } else if (a == "--k-block" && i + 1 < argc) {
            k_block = std::max(1, std::atoi(argv[++i]));
        } else {
            std::printf("usage: blindsight_bench [--reps 5] [--q-block 128] [--k-block 128]\n");
            return a == "--help" ? 0 : 2;
        }
    }
    std::string spec = "text:56";
    for (int i = 0; i < 8; ++i) spec += ",text:1,image:1000,text:1,text:" + std::to_string(i == 7 ? 8 : 16);
    const auto layout = vlsparse::Layout::parse(spec);
    const std::int64_t n = layout.n(), H = 8, Hkv = 8, d = 128;
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    std::printf("blindsight_bench: n = %lld (8 images x 1000 tokens, delimiters and text between), H = %lld, "
                "H_kv = %lld, d = %lld, fp32, blocks %lld x %lld, threads = %d, %d rounds\n",
                static_cast<long long>(n), static_cast<long long>(H), static_cast<long long>(Hkv),
                static_cast<long long>(d), static_cast<long long>(q_block), static_cast<long long>(k_block), threads,
                reps);
    std::printf("input: vlsparse::sim::synthetic_layer (seed default, layer 3); sinks: first ceil(0.1 len) tokens\n\n");
    vlsparse::sim::SyntheticParams S;
    S.n_heads = H;
    S.n_kv_heads = Hkv;
    S.head_dim = d;
    const auto L = vlsparse::sim::synthetic_layer(layout, S, 3);
    const vlsparse::View3<const float> q(L.q.data(), {n, H, d}), k(L.k.data(), {n, Hkv, d}), v(L.v.data(), {n, Hkv, d});
    std::vector<float> out(static_cast<std::size_t>(n * H * d));
    const vlsparse::View3<float> o(out.data(), {n, H, d});
    const double t_dense = median_seconds(reps, [&] { vlsparse::simd::dense_attention(q, k, v, o); });
    const auto ctx = vlsparse::make_mask_context(layout);
    const auto pairs = vlsparse::allowed_pairs(ctx);
    std::printf("dense causal (simd::dense_attention): %.1f ms, %.1f GFLOP/s\n\n", 1e3 * t_dense,
                vlsparse::attention_flops(static_cast<std::int64_t>(pairs[vlsparse::MaskTemplate::dense]), d) * H /
                    t_dense * 1e-9);
    std::printf("%-14s %9s %10s %9s %9s %10s %9s %9s %9s %11s\n", "template", "allowed", "computed", "mask ms", "dense ms",
                "masked ms", "speedup", "ideal", "of ideal", "range");
    auto time_once = [](auto&& f) {  // one timed call; the warm-up is done by the caller
        const auto t0 = std::chrono::steady_clock::now();
        f();
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    auto median = [](std::vector<double> x) {
        std::sort(x.begin(), x.end());
        return x[x.size() / 2];
    };
    for (const auto t : vlsparse::kAllTemplates) {
        const std::vector<vlsparse::MaskTemplate> heads(static_cast<std::size_t>(H), t);
        vlsparse::BlockMask bm;
        const double t_mask = median_seconds(reps, [&] { bm = vlsparse::make_block_mask(ctx, heads, q_block, k_block); });
        const double frac = pairs[t] / pairs[vlsparse::MaskTemplate::dense];
        const double computed = static_cast<double>(bm.computed_pairs()) / static_cast<double>(H) /
                                pairs[vlsparse::MaskTemplate::dense];
        auto dense = [&] { vlsparse::simd::dense_attention(q, k, v, o); };
        auto masked = [&] { vlsparse::simd::masked_attention(q, k, v, bm, o); };
        dense();  // warm-up
        masked();
        std::vector<double> td, tm, of_ideal;
        for (int r = 0; r < reps; ++r) {  // dense and masked alternate; the order flips every round
            const double a = r % 2 ? time_once(masked) : time_once(dense);
            const double b = r % 2 ? time_once(dense) : time_once(masked);
            td.push_back(r % 2 ? b : a);
            tm.push_back(r % 2 ? a : b);
            of_ideal.push_back(td.back() / tm.back() * frac);
        }
        const double ideal = 1.0 / frac, share = median(of_ideal);
        std::printf("%-14s %8.1f%% %9.1f%% %9.2f %9.1f %10.1f %8.2fx %8.2fx %8.0f%% %5.0f-%3.0f%%\n",
                    std::string(to_string(t)).c_str(), 100.0 * frac, 100.0 * computed, 1e3 * t_mask, 1e3 * median(td),
                    1e3 * median(tm), share * ideal, ideal, 100.0 * share,
                    100.0 * *std::min_element(of_ideal.begin(), of_ideal.end()),
                    100.0 * *std::max_element(of_ideal.begin(), of_ideal.end()));
    }
    std::printf("\nallowed = exact allowed pairs / causal pairs; computed = pairs inside the listed blocks (partial\n"
                "blocks trimmed) / causal pairs; dense ms, masked ms = medians over the rounds, dense causal\n"
                "attention and the template's masked attention alternating; of ideal = median over the rounds of\n"
                "(dense time / masked time) / ideal, range = its smallest and largest round; speedup = of ideal x\n"
                "ideal; ideal = 1 / allowed. Mask build time is not included in masked ms.\n");
    return 0;
}
