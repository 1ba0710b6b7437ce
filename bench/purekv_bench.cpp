// PureKV on the CPU: ST-SpAttn masked prefill vs dense SIMD attention, and the cost of the cross-layer
// importance estimate vs the attention-score computation it replaces.
//
// Layout: text:14, a video of 32 frames x 144 tokens (12 x 12 grid), text:30 (n = 4652), fp32 random
// Q/K/V, H = 16, H_kv = 4 (GQA 4), d = 128 by default.
// Part 1, for each video mask (one mask for all heads): the block mask build time, the masked attention
// time (simd::masked_attention), dense causal attention (simd::dense_attention) measured next to it,
// speedup = dense / masked, ideal = causal pairs / allowed pairs (exact count), of ideal = speedup /
// ideal, and the pairs inside the listed blocks (what the kernel computes) against the allowed ones.
// Part 2: the window scores of one layer (Eq. 2, simd::purekv_window_scores: what a score-based method
// such as H2O / SnapKV must compute in EVERY layer, and PureKV only at layers <= l0), the higher-layer
// estimate (Eq. 4, simd::purekv_select on l0's scores: ||V|| + top-h, no attention scores), and the
// layer's dense attention for scale. Medians of --reps runs after a warm-up; cpu_util = process CPU
// time / (wall time x threads) over the timed runs (well below 1: the machine was busy).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <vector>

#include <vlsparse/vlsparse.hpp>

#include "bench_util.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace {

std::vector<float> random_floats(std::size_t count, std::uint64_t seed) {
    vlsparse::SplitMix64 rng(seed);
    std::vector<float> x(count);
    for (auto& v : x) v = static_cast<float>(2.0 * rng.uniform() - 1.0);
    return x;
}

// Median wall seconds of f (bench_util) and the process CPU utilisation over those runs.
struct Timing {
    double seconds = 0.0, cpu_util = 0.0;
};
template <class F>
Timing timed(int reps, int threads, F&& f) {
    const std::clock_t c0 = std::clock();
    const auto w0 = std::chrono::steady_clock::now();
    Timing t;
    t.seconds = vlsparse::bench::median_seconds(reps, f);
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
    const double cpu = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
    t.cpu_util = cpu / (wall * threads);
    return t;
}

}  // namespace

int main(int argc, char** argv) {
    int reps = 3;
    std::string only;          // --mask NAME: run only this video mask (and skip part 2)
    std::int64_t q_block = 64, k_block = 128, H = 16, Hkv = 4, d = 128, frames = 32, tokens = 144, window = 32;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto next = [&] { return std::max<std::int64_t>(1, std::atoll(argv[++i])); };
        if (a == "--reps" && i + 1 < argc) reps = static_cast<int>(next());
        else if (a == "--q-block" && i + 1 < argc) q_block = next();
        else if (a == "--k-block" && i + 1 < argc) k_block = next();
        else if (a == "--heads" && i + 1 < argc) H = next();
        else if (a == "--kv-heads" && i + 1 < argc) Hkv = next();
        else if (a == "--dim" && i + 1 < argc) d = next();
        else if (a == "--frames" && i + 1 < argc) frames = next();
        else if (a == "--tokens" && i + 1 < argc) tokens = next();
        else if (a == "--window" && i + 1 < argc) window = next();
        else if (a == "--mask" && i + 1 < argc) only = argv[++i];
        else {
            std::printf("usage: purekv_bench [--reps 3] [--q-block 64] [--k-block 128] [--heads 16] [--kv-heads 4]\n"
                        "                    [--dim 128] [--frames 32] [--tokens 144] [--window 32] [--mask NAME]\n"
                        "--mask runs one video mask (spatial, temporal, spatial_temporal, local_window, atrous)\n"
                        "and skips the importance-estimation part.\n");
            return a == "--help" ? 0 : 2;
        }
    }
    const auto layout = vlsparse::Layout::parse("text:14,video:" + std::to_string(frames) + "x" + std::to_string(tokens) +
                                                ",text:30");
    const std::int64_t n = layout.n();
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    std::printf("purekv_bench: %s (n = %lld), H = %lld, H_kv = %lld, d = %lld, fp32, blocks %lld x %lld, threads = %d, "
                "median of %d runs\n\n",
                layout.to_string().c_str(), static_cast<long long>(n), static_cast<long long>(H),
                static_cast<long long>(Hkv), static_cast<long long>(d), static_cast<long long>(q_block),
                static_cast<long long>(k_block), threads, reps);
    const auto qb = random_floats(static_cast<std::size_t>(n * H * d), 1);
    const auto kb = random_floats(static_cast<std::size_t>(n * Hkv * d), 2);
    const auto vb = random_floats(static_cast<std::size_t>(n * Hkv * d), 3);
    const vlsparse::View3<const float> q(qb.data(), {n, H, d}), k(kb.data(), {n, Hkv, d}), v(vb.data(), {n, Hkv, d});
    std::vector<float> out(static_cast<std::size_t>(n * H * d));
    const vlsparse::View3<float> o(out.data(), {n, H, d});
    const double causal = static_cast<double>(n) * static_cast<double>(n + 1) / 2.0;

    // Part 1: masked prefill.
    std::printf("%-17s %8s %9s %8s %9s %10s %8s %8s %8s %8s\n", "mask", "allowed", "computed", "mask ms", "dense ms",
                "masked ms", "speedup", "ideal", "of ideal", "cpu_util");
    for (const auto kind : vlsparse::kVideoMasks) {
        if (!only.empty() && only != to_string(kind)) continue;
        vlsparse::PureKVParams P;
        P.st.kind = kind;
        P.q_block = q_block;
        P.k_block = k_block;
        const auto ctx = vlsparse::purekv_mask_context(layout, P);
        const double allowed = static_cast<double>(vlsparse::count_allowed_pairs(ctx, vlsparse::MaskTemplate::dense));
        vlsparse::BlockMask bm;
        const auto t_mask = timed(reps, threads, [&] { bm = vlsparse::purekv_block_mask(layout, H, P); });
        const auto t_dense = timed(reps, threads, [&] { vlsparse::simd::dense_attention(q, k, v, o); });
        const auto t_masked = timed(reps, threads, [&] { vlsparse::simd::masked_attention(q, k, v, bm, o, P.attention()); });
        const double computed = static_cast<double>(bm.computed_pairs()) / static_cast<double>(H);
        const double speedup = t_dense.seconds / t_masked.seconds, ideal = causal / allowed;
        std::printf("%-17s %7.1f%% %8.1f%% %8.2f %9.1f %10.1f %7.2fx %7.2fx %7.0f%% %8.2f\n",
                    std::string(to_string(kind)).c_str(), 100.0 * allowed / causal, 100.0 * computed / causal,
                    1e3 * t_mask.seconds, 1e3 * t_dense.seconds, 1e3 * t_masked.seconds, speedup, ideal,
                    100.0 * speedup / ideal, std::min(t_dense.cpu_util, t_masked.cpu_util));
        std::fflush(stdout);
    }
    std::printf("\nallowed = exact allowed pairs / causal pairs; computed = pairs inside the listed blocks (partial\n"
                "blocks trimmed to their key range) / causal pairs; dense ms = dense causal attention measured next\n"
                "to the mask; speedup = dense ms / masked ms; ideal = 1 / allowed; of ideal = speedup / ideal.\n"
                "local_window and atrous: window = 144 keys (one frame), atrous dilation 2. Mask build time is\n"
                "not included in masked ms (an engine builds the mask once per prompt, for every layer).\n\n");

    if (!only.empty()) return 0;
    // Part 2: importance estimation.
    vlsparse::PureKVParams P;
    P.window = window;
    const auto t_dense = timed(reps, threads, [&] { vlsparse::simd::dense_attention(q, k, v, o); });
    vlsparse::PureKVScores s;
    const auto t_scores = timed(reps, threads, [&] { s = vlsparse::simd::purekv_window_scores(q, k, 2, P); });
    vlsparse::PureKVSelection sel;
    const auto t_select = timed(reps, threads, [&] { sel = vlsparse::simd::purekv_select(s, v, 5, P); });
    std::printf("importance estimation (w = %lld, 20%% budget: keeps %lld of %lld tokens per KV head)\n",
                static_cast<long long>(window), static_cast<long long>(sel.selection.indices[0].size()),
                static_cast<long long>(n));
    std::printf("  %-58s %9.2f ms  cpu_util %.2f\n", "dense causal attention of one layer (simd::dense_attention)",
                1e3 * t_dense.seconds, t_dense.cpu_util);
    std::printf("  %-58s %9.2f ms  (%.1f%% of dense)\n", "window scores, Eq. 2 (score-based methods: every layer)",
                1e3 * t_scores.seconds, 100.0 * t_scores.seconds / t_dense.seconds);
    std::printf("  %-58s %9.2f ms  (%.2f%% of dense, %.1fx cheaper than the scores)\n",
                "PureKV higher layer, Eq. 4: ||V|| + top-h on l0's scores", 1e3 * t_select.seconds,
                100.0 * t_select.seconds / t_dense.seconds, t_scores.seconds / t_select.seconds);
    return 0;
}
