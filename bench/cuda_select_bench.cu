// GPU selection benchmark: ZipVL's whole selection (probes, probe attention, scores, p from tau, top-k,
// the device lists) per layer, on the tensor cores, over the shapes of "CUDA II" (bf16, H = 28,
// H_kv = 4, d = 128, batch 1, n = 8K .. 128K). The PyTorch side (cuDNN / flash dense causal prefill of
// the same layer, and the same selection written with PyTorch ops) is bench/torch_select_bench.py;
// bench/cuda_select_report.py joins the two CSV files.
//
// Timing: CUDA events around one select() call (which ends in its one stream synchronization), after a
// 256 MiB write that evicts the L2; median of --reps calls after --warmup calls. q and k hold random
// values in [-1, 1] with every 97th key row scaled by 3 (the kept ratio is printed: such diffuse
// attention keeps most tokens at tau = 0.975; the cost barely depends on it).
//
//   cuda_decode_bench-style CSV (--out FILE): impl,policy,dtype,H,H_kv,d,n,time_us,kept,p,note
//   build-gpu/bench/cuda_select_bench --out select.csv [--n 8192,16384] [--reps 21] [--quick]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <vlsparse/core/rng.hpp>
#include <vlsparse/cuda/zipvl.cuh>

#include "cuda_bench_util.cuh"

using namespace vlsparse;

int main(int argc, char** argv) {
    std::vector<std::int64_t> ns{8192, 16384, 32768, 131072};
    int reps = 21, warmup = 3;
    const char* out_path = nullptr;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--n" && i + 1 < argc) ns = bench::parse_size_list(argv[++i]);
        else if (a == "--reps" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
        else if (a == "--quick") {
            ns = {8192, 16384};
            reps = 7;
        } else if (a == "--out" && i + 1 < argc) out_path = argv[++i];
        else {
            std::fprintf(stderr, "usage: %s [--out FILE] [--n LIST] [--reps R] [--quick]\n", argv[0]);
            return 2;
        }
    }
    FILE* out = out_path ? std::fopen(out_path, "w") : stdout;
    if (!out) {
        std::fprintf(stderr, "cannot write %s\n", out_path);
        return 1;
    }
    std::fprintf(out, "impl,policy,dtype,H,H_kv,d,n,time_us,kept,p,note\n");
    cudaDeviceProp prop{};
    VLSPARSE_BENCH_CK(cudaGetDeviceProperties(&prop, 0));
    std::fprintf(stderr, "device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);

    const std::int64_t H = 28, Hkv = 4, d = 128;
    bench::EventTimer timer;
    cuda::ZipVLSelector sel;

    for (const std::int64_t n : ns) {
        // Inputs: uniform [-1, 1], and every 97th key row scaled by 3 (heavy hitters).
        SplitMix64 rng(static_cast<std::uint64_t>(n));
        std::vector<bfloat16> q(static_cast<std::size_t>(n * H * d)), k(static_cast<std::size_t>(n * Hkv * d));
        for (auto& x : q) x = bfloat16(static_cast<float>(2.0 * rng.uniform() - 1.0));
        for (std::int64_t j = 0; j < n; ++j)
            for (std::int64_t e = 0; e < Hkv * d; ++e)
                k[static_cast<std::size_t>(j * Hkv * d + e)] =
                    bfloat16(static_cast<float>((j % 97 == 0 ? 3.0 : 1.0) * (2.0 * rng.uniform() - 1.0)));
        cuda::DeviceArray<bfloat16> qd(q), kd(k);
        const View3<const bfloat16> qv(qd.data(), {n, H, d}), kv(kd.data(), {n, Hkv, d});
        const Layout layout = Layout::parse("image:" + std::to_string(n));
        {
            ZipVLParams P;  // paper defaults: 64 + 64 probes, layer-wise, tau 0.975
            const double med = timer.median_us([&] { sel.select(qv, kv, layout, 1, P); }, warmup, reps);
            const auto& s = sel.result();
            std::fprintf(out, "vlsparse,%s,bf16,%lld,%lld,%lld,%lld,%.2f,%.4f,%lld,%s\n",
                         "zipvl_select", static_cast<long long>(H),
                         static_cast<long long>(Hkv), static_cast<long long>(d), static_cast<long long>(n),
                         med, s.kept_ratio(), static_cast<long long>(s.p.at(0)),
                         "probes 64+64 layer-wise tau 0.975");
            std::fflush(out);
            std::fprintf(stderr, "n %lld: %.1f us, kept %.3f, p %lld\n", static_cast<long long>(n), med,
                         s.kept_ratio(), static_cast<long long>(s.p.at(0)));
        }
    }
    if (out != stdout) std::fclose(out);
    return 0;
}
