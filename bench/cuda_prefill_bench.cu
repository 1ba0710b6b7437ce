// GPU prefill benchmark: vlsparse's tensor-core prefill (vlsparse/cuda/prefill.cuh) over the shapes of
// "CUDA III" (bf16, H = 28, H_kv = 4, d = 128, batch 1, n = 8K .. 32K):
//   dense_causal           dense_prefill_attention (PrefillKernel::automatic: wgmma on an H100 with sm_90a code)
//   dense_causal_mma_sync  the same on the portable mma.sync path (PrefillKernel::mma_sync)
//   dense_causal_lse       the same, also writing each row's log-sum-exp (only when --cases names it)
//   dense_causal_cpasync   the same with whole key tiles copied by cp.async instead of the bulk tensor copy
//                          (PrefillOptions::bulk_copy = false; only when --cases names it)
//   dense_causal_simt      the same on the CUDA-core kernel (PrefillKernel::simt; slow: only when --cases
//                          names it)
//   dense_causal_fp32      fp32 q, k, v (the CUDA-core kernel; only when --cases names it)
//   blindsight_calibrate   BlindSight's Algorithm 1 for one layer (cuda::BlindSightCalibrator: the dense
//                          output, the three candidates', the per-head NMSEs) on the Document layout;
//                          pairs = the four masks' allowed pairs
//   blindsight_<template>  masked_prefill_attention, every head on one template, on 8 images with 64 text
//                          tokens around and between them (the issue's Document layout)
//   blindsight_mixed       the same layout, the 28 heads cycling through the four templates
//   purekv_st              PureKV's spatial-temporal mask (Dense template) on 64 text + a video of
//                          256-token frames + 64 text
//   zipvl_keep50           sparse_prefill_attention over a random shared list of half the positions
//                          (the last kept), unselected rows zero
//   zipvl_keep50_kept      the same lists over k, v compacted to them beforehand (untimed):
//                          sparse_prefill_attention_kept
//   zipvl_e2e50            ZipVL's selection on the GPU (fixed ratio 0.5, 64 + 64 probes) followed by the
//                          token-sparse prefill over its lists: what a ZipVL layer costs
//   zipvl_select50         its selection alone; zipvl_selprefill50: its prefill alone, over the kept lists
//   zipvl_e2e50_kept       ZipVL's layer in the order an evicting engine runs it: the selection, the
//                          eviction (cuda::kv_batch_compact of the contiguous cache to the kept list, in
//                          place) and sparse_prefill_attention_kept over the kept rows (the cache is
//                          restored before each call, untimed)
//   zipvl_evict50          that eviction alone (kv_batch_compact to the list of one selection)
// The PyTorch side (SDPA cuDNN / flash dense causal, FlexAttention with the same masks, gather + SDPA) is
// bench/torch_prefill_bench.py, reading the mask descriptions this program writes (--masks DIR: one
// JSON file per mask case and n, with the exact allowed-pair count it checks its own mask against);
// bench/cuda_prefill_report.py joins the two CSV files.
//
// Timing: CUDA events around one call, after a 256 MiB write that evicts the L2; median of --reps calls
// after --warmup calls; check_finite and check_inputs off (the production setting: no synchronization).
// pairs = the (query, key) pairs the mask allows, summed over heads; tflops = 4 d pairs / time.
//
//   CSV (--out FILE): impl,case,dtype,H,H_kv,d,n,time_us,pairs,tflops,note
//   build-gpu/bench/cuda_prefill_bench --out prefill.csv --masks masks/ [--n 8192,16384] [--reps 11] [--quick]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <vlsparse/core/rng.hpp>
#include <vlsparse/cuda/blindsight.cuh>
#include <vlsparse/cuda/kv_cache.cuh>
#include <vlsparse/cuda/prefill.cuh>
#include <vlsparse/cuda/zipvl.cuh>
#include <vlsparse/masks/flops.hpp>

#include "cuda_bench_util.cuh"

using namespace vlsparse;

namespace {

template <class V>
void json_list(std::ostream& o, const char* key, const V& v) {
    o << "\"" << key << "\": [";
    for (std::size_t i = 0; i < v.size(); ++i) o << (i ? "," : "") << static_cast<long long>(v[i]);
    o << "]";
}

// The mask description bench/torch_prefill_bench.py rebuilds its FlexAttention mask from.
void write_mask_json(const std::filesystem::path& file, const std::string& name, const MaskContext& c,
                     const std::vector<MaskTemplate>& heads, std::int64_t Hkv, std::int64_t d, std::int64_t allowed) {
    std::ofstream o(file);
    o << "{\"case\": \"" << name << "\", \"n\": " << c.n << ", \"H\": " << heads.size() << ", \"H_kv\": " << Hkv
      << ", \"d\": " << d << ", ";
    json_list(o, "token_image", c.token_image);
    o << ", ";
    json_list(o, "token_sink", c.token_sink);
    o << ", ";
    json_list(o, "image_start", c.image_start);
    o << ", ";
    json_list(o, "image_end", c.image_end);
    o << ", ";
    json_list(o, "image_frame_tokens", c.image_frame_tokens);
    o << ", \"bidirectional_images\": " << (c.bidirectional_images ? "true" : "false") << ", \"video\": \""
      << to_string(c.video) << "\", \"video_window\": " << c.video_window << ", \"video_dilation\": " << c.video_dilation
      << ", \"head_templates\": [";
    for (std::size_t h = 0; h < heads.size(); ++h) o << (h ? ", " : "") << "\"" << to_string(heads[h]) << "\"";
    o << "], \"allowed_pairs\": " << allowed << "}\n";
}

// ZipVL's parameters for the benchmark's selection cases: a fixed ratio of 0.5 (probes 64 + 64).
ZipVLParams zipvl_fixed50() {
    ZipVLParams P;
    P.ratio = ZipVLRatio::fixed;
    P.fixed_ratio = 0.5;
    return P;
}

}  // namespace

int main(int argc, char** argv) {
    std::vector<std::int64_t> ns{8192, 16384, 32768};
    int reps = 11, warmup = 3;
    const char* out_path = nullptr;
    const char* mask_dir = nullptr;
    std::string only;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--n" && i + 1 < argc) ns = bench::parse_size_list(argv[++i]);
        else if (a == "--reps" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
        else if (a == "--quick") {
            ns = {8192, 16384};
            reps = 5;
        } else if (a == "--out" && i + 1 < argc) out_path = argv[++i];
        else if (a == "--masks" && i + 1 < argc) mask_dir = argv[++i];
        else if (a == "--cases" && i + 1 < argc) only = std::string(",") + argv[++i] + ",";
        else {
            std::fprintf(stderr, "usage: %s [--out FILE] [--masks DIR] [--n LIST] [--reps R] [--cases a,b] [--quick]\n",
                         argv[0]);
            return 2;
        }
    }
    FILE* out = out_path ? std::fopen(out_path, "w") : stdout;
    if (!out) {
        std::fprintf(stderr, "cannot write %s\n", out_path);
        return 1;
    }
    if (mask_dir) std::filesystem::create_directories(mask_dir);
    std::fprintf(out, "impl,case,dtype,H,H_kv,d,n,time_us,pairs,tflops,note\n");
    cudaDeviceProp prop{};
    VLSPARSE_BENCH_CK(cudaGetDeviceProperties(&prop, 0));
    const bool wgmma = cuda::prefill_uses_wgmma();
    std::fprintf(stderr, "device: %s, %d SMs; prefill kernel: %s\n", prop.name, prop.multiProcessorCount,
                 wgmma ? "wgmma (sm_90a)" : "mma.sync");

    const std::int64_t H = 28, Hkv = 4, d = 128;
    bench::EventTimer timer;
    cuda::PrefillOptions opt;
    opt.check_finite = false;
    opt.check_inputs = false;
    auto want = [&](const std::string& c) { return only.empty() || only.find("," + c + ",") != std::string::npos; };
    // The CUDA-core cases run only when --cases names them (seconds per call at 16K).
    auto named = [&](const std::string& c) { return only.find("," + c + ",") != std::string::npos; };

    for (const std::int64_t n : ns) {
        SplitMix64 rng(static_cast<std::uint64_t>(n) * 31u + 7u);
        std::vector<bfloat16> q(static_cast<std::size_t>(n * H * d)), k(static_cast<std::size_t>(n * Hkv * d)), v(k.size());
        for (auto& x : q) x = bfloat16(static_cast<float>(2.0 * rng.uniform() - 1.0));
        for (auto& x : k) x = bfloat16(static_cast<float>(2.0 * rng.uniform() - 1.0));
        for (auto& x : v) x = bfloat16(static_cast<float>(2.0 * rng.uniform() - 1.0));
        cuda::DeviceArray<bfloat16> qd(q), kd(k), vd(v), od(static_cast<std::size_t>(n * H * d));
        const View3<const bfloat16> qv(qd.data(), {n, H, d}), kv(kd.data(), {n, Hkv, d}), vv(vd.data(), {n, Hkv, d});
        const View3<bfloat16> ov(od.data(), {n, H, d});

        auto timed = [&](auto&& call) { return timer.median_us(call, warmup, reps); };
        auto row = [&](const char* impl, const std::string& name, double us, std::int64_t pairs, const std::string& note) {
            const double tf = 4.0 * static_cast<double>(d) * static_cast<double>(pairs) / (us * 1e-6) / 1e12;
            std::fprintf(out, "%s,%s,bf16,%lld,%lld,%lld,%lld,%.2f,%lld,%.1f,%s\n", impl, name.c_str(),
                         static_cast<long long>(H), static_cast<long long>(Hkv), static_cast<long long>(d),
                         static_cast<long long>(n), us, static_cast<long long>(pairs), tf, note.c_str());
            std::fflush(out);
            std::fprintf(stderr, "n %lld %-22s %10.1f us  %6.1f TF/s  %s\n", static_cast<long long>(n), name.c_str(), us,
                         tf, note.c_str());
        };

        if (want("dense_causal")) {
            const double us = timed([&] { cuda::dense_prefill_attention(qv, kv, vv, ov, opt); });
            row("vlsparse", "dense_causal", us, H * n * (n + 1) / 2, wgmma ? "wgmma" : "mma.sync");
        }
        if (named("dense_causal_lse")) {  // also writing each row's log-sum-exp (the row statistics of A-VL / H2O)
            cuda::DeviceArray<float> lse(static_cast<std::size_t>(n * H));
            const View2<float> lv(lse.data(), {n, H});
            const double us = timed([&] { cuda::dense_prefill_attention(qv, kv, vv, ov, lv, opt); });
            row("vlsparse", "dense_causal_lse", us, H * n * (n + 1) / 2, std::string(wgmma ? "wgmma" : "mma.sync") + ", with lse");
        }
        if (want("dense_causal_mma_sync")) {  // the portable path on the same GPU
            cuda::PrefillOptions o2 = opt;
            o2.kernel = cuda::PrefillKernel::mma_sync;
            const double us = timed([&] { cuda::dense_prefill_attention(qv, kv, vv, ov, o2); });
            row("vlsparse", "dense_causal_mma_sync", us, H * n * (n + 1) / 2, "mma.sync");
        }

        if (named("dense_causal_cpasync")) {  // the producer warps' cp.async copies for every tile
            cuda::PrefillOptions o2 = opt;
            o2.bulk_copy = false;
            const double us = timed([&] { cuda::dense_prefill_attention(qv, kv, vv, ov, o2); });
            row("vlsparse", "dense_causal_cpasync", us, H * n * (n + 1) / 2, wgmma ? "wgmma, cp.async tiles" : "mma.sync");
        }
        if (named("dense_causal_simt")) {  // the CUDA-core kernel on the same bf16 inputs
            cuda::PrefillOptions o2 = opt;
            o2.kernel = cuda::PrefillKernel::simt;
            const double us = timed([&] { cuda::dense_prefill_attention(qv, kv, vv, ov, o2); });
            row("vlsparse", "dense_causal_simt", us, H * n * (n + 1) / 2, "CUDA cores");
        }
        if (named("dense_causal_fp32")) {  // fp32 inputs: the CUDA-core kernel
            std::vector<float> qf(q.size()), kf(k.size()), vf(v.size());
            for (std::size_t i = 0; i < q.size(); ++i) qf[i] = to_float(q[i]);
            for (std::size_t i = 0; i < k.size(); ++i) kf[i] = to_float(k[i]);
            for (std::size_t i = 0; i < v.size(); ++i) vf[i] = to_float(v[i]);
            cuda::DeviceArray<float> qfd(qf), kfd(kf), vfd(vf), ofd(static_cast<std::size_t>(n * H * d));
            const double us = timed([&] {
                cuda::dense_prefill_attention(View3<const float>(qfd.data(), {n, H, d}), View3<const float>(kfd.data(), {n, Hkv, d}),
                                              View3<const float>(vfd.data(), {n, Hkv, d}), View3<float>(ofd.data(), {n, H, d}), opt);
            });
            row("vlsparse", "dense_causal_fp32", us, H * n * (n + 1) / 2, "fp32 inputs, CUDA cores");
        }

        // BlindSight: 8 images with 64 text tokens around and between them.
        {
            const std::int64_t img = (n - 9 * 64) / 8, tail = n - 9 * 64 - 8 * img;
            std::string spec;
            for (int i = 0; i < 8; ++i) spec += "text:64,image:" + std::to_string(img) + ",";
            spec += "text:" + std::to_string(64 + tail);
            const Layout layout = Layout::parse(spec);
            const MaskContext ctx = make_mask_context(layout);
            struct Case {
                std::string name;
                std::vector<MaskTemplate> heads;
            };
            std::vector<Case> cases;
            for (MaskTemplate t : {MaskTemplate::document, MaskTemplate::sink, MaskTemplate::document_sink}) {
                std::string nm = "blindsight_" + std::string(to_string(t));
                std::transform(nm.begin(), nm.end(), nm.begin(), [](char c) { return c == '-' ? '_' : static_cast<char>(std::tolower(c)); });
                cases.push_back({nm, std::vector<MaskTemplate>(static_cast<std::size_t>(H), t)});
            }
            std::vector<MaskTemplate> mixed(static_cast<std::size_t>(H));
            for (std::int64_t h = 0; h < H; ++h) mixed[static_cast<std::size_t>(h)] = static_cast<MaskTemplate>(h % 4);
            cases.push_back({"blindsight_mixed", mixed});
            if (want("blindsight_calibrate")) {
                BlindSightParams P;
                cuda::BlindSightCalibrator cal(layout, P, H, Hkv);
                std::int64_t pairs = 0;
                for (int t = 0; t < 4; ++t) pairs += cal.plan(static_cast<MaskTemplate>(t)).allowed_pairs();
                int chosen = 0;
                const double us = timed([&] {
                    const auto r = cal.characterize(qv, kv, vv, opt);
                    chosen = static_cast<int>(std::count_if(r.begin(), r.end(), [](const auto& c) { return c.chosen != MaskTemplate::dense; }));
                });
                row("vlsparse", "blindsight_calibrate", us, pairs,
                    "Algorithm 1, one layer of " + std::to_string(H) + " heads (dense + 3 templates, NMSEs; " +
                        std::to_string(chosen) + " heads not dense on random inputs)");
            }
            for (const auto& c : cases) {
                if (!want(c.name)) continue;
                const cuda::MaskedPrefillPlan plan(ctx, c.heads, Hkv);
                if (mask_dir)
                    write_mask_json(std::filesystem::path(mask_dir) / (c.name + "_" + std::to_string(n) + ".json"), c.name,
                                    ctx, c.heads, Hkv, d, plan.allowed_pairs());
                const double us = timed([&] { cuda::masked_prefill_attention(plan, qv, kv, vv, ov, opt); });
                char note[160];
                std::snprintf(note, sizeof note, "computed/allowed %.3f; %lld blocks %lld segments",
                              static_cast<double>(plan.computed_pairs()) / static_cast<double>(plan.allowed_pairs()),
                              static_cast<long long>(plan.blocks()), static_cast<long long>(plan.segments()));
                row("vlsparse", c.name, us, plan.allowed_pairs(), note);
            }
        }
        // PureKV: spatial-temporal video mask.
        if (want("purekv_st")) {
            const std::int64_t T = 256, F = (n - 128) / T, tail = n - 128 - F * T;
            const Layout layout = Layout::parse("text:64,video:" + std::to_string(F) + "x" + std::to_string(T) + ",text:" +
                                                std::to_string(64 + tail));
            const MaskContext ctx = make_video_mask_context(layout, {VideoMask::spatial_temporal, 0, 2});
            const std::vector<MaskTemplate> heads(static_cast<std::size_t>(H), MaskTemplate::dense);
            const cuda::MaskedPrefillPlan plan(ctx, heads, Hkv);
            if (mask_dir)
                write_mask_json(std::filesystem::path(mask_dir) / ("purekv_st_" + std::to_string(n) + ".json"), "purekv_st",
                                ctx, heads, Hkv, d, plan.allowed_pairs());
            const double us = timed([&] { cuda::masked_prefill_attention(plan, qv, kv, vv, ov, opt); });
            char note[160];
            std::snprintf(note, sizeof note, "frames %lldx%lld; computed/allowed %.3f", static_cast<long long>(F),
                          static_cast<long long>(T),
                          static_cast<double>(plan.computed_pairs()) / static_cast<double>(plan.allowed_pairs()));
            row("vlsparse", "purekv_st", us, plan.allowed_pairs(), note);
        }
        // ZipVL: token-sparse prefill over a random half, and selection + prefill at a fixed ratio of 0.5.
        if (want("zipvl_keep50") || want("zipvl_keep50_kept")) {
            std::vector<std::int32_t> idx;
            for (std::int64_t j = 0; j < n; ++j)
                if (j == n - 1 || rng.uniform() < 0.5) idx.push_back(static_cast<std::int32_t>(j));
            const std::vector<std::int32_t> indptr{0, static_cast<std::int32_t>(idx.size())};
            cuda::DeviceArray<std::int32_t> ip(indptr), ix(idx);
            const cuda::DeviceTokenLists lists{n, indptr, ip.data(), ix.data()};
            const auto m = static_cast<std::int64_t>(idx.size());
            if (want("zipvl_keep50")) {
                const double us =
                    timed([&] { cuda::sparse_prefill_attention(qv, kv, vv, lists, ov, UnselectedRows::zero, opt); });
                row("vlsparse", "zipvl_keep50", us, H * m * (m + 1) / 2, "kept " + std::to_string(m) + "; unselected zero");
            }
            if (want("zipvl_keep50_kept")) {  // the same over k, v compacted to the list beforehand (untimed)
                std::vector<bfloat16> kk(static_cast<std::size_t>(m * Hkv * d)), vk(kk.size());
                for (std::int64_t e = 0; e < m; ++e)
                    for (std::int64_t c = 0; c < Hkv * d; ++c) {
                        kk[static_cast<std::size_t>(e * Hkv * d + c)] = k[static_cast<std::size_t>(idx[static_cast<std::size_t>(e)] * Hkv * d + c)];
                        vk[static_cast<std::size_t>(e * Hkv * d + c)] = v[static_cast<std::size_t>(idx[static_cast<std::size_t>(e)] * Hkv * d + c)];
                    }
                cuda::DeviceArray<bfloat16> kkd(kk), vkd(vk);
                const View3<const bfloat16> kkv(kkd.data(), {m, Hkv, d}), vkv(vkd.data(), {m, Hkv, d});
                const double us = timed(
                    [&] { cuda::sparse_prefill_attention_kept(qv, kkv, vkv, lists, ov, UnselectedRows::zero, opt); });
                row("vlsparse", "zipvl_keep50_kept", us, H * m * (m + 1) / 2,
                    "kept " + std::to_string(m) + " (k, v compacted to them beforehand); unselected zero");
            }
        }
        if (want("zipvl_e2e50")) {
            cuda::ZipVLSelector sel;
            const ZipVLParams P = zipvl_fixed50();
            const Layout layout = Layout::parse("image:" + std::to_string(n));
            std::int64_t kept = 0;
            const double us = timed([&] {
                const auto& s = sel.select(qv, kv, layout, 1, P);
                kept = s.indptr.back();
                cuda::sparse_prefill_attention(qv, kv, vv, cuda::DeviceTokenLists{n, s.indptr, s.indptr_dev, s.indices},
                                               ov, UnselectedRows::zero, opt);
            });
            row("vlsparse", "zipvl_e2e50", us, H * kept * (kept + 1) / 2,
                "selection (fixed ratio 0.5; probes 64+64) + token-sparse prefill; kept " + std::to_string(kept));
        }
        if (want("zipvl_e2e50_kept") || want("zipvl_evict50")) {
            cuda::ZipVLSelector sel;
            const ZipVLParams P = zipvl_fixed50();
            const Layout layout = Layout::parse("image:" + std::to_string(n));
            // The layer's cache (one contiguous sequence), restored from kd / vd before every call.
            cuda::DeviceArray<bfloat16> kw(k.size()), vw(v.size());
            const std::vector<std::int32_t> n_host{static_cast<std::int32_t>(n)};
            cuda::DeviceArray<std::int32_t> lens_dev(n_host), lens0(n_host);
            std::vector<std::int32_t> lens = n_host;
            auto restore = [&] {
                VLSPARSE_BENCH_CK(cudaMemcpyAsync(kw.data(), kd.data(), k.size() * sizeof(bfloat16), cudaMemcpyDeviceToDevice));
                VLSPARSE_BENCH_CK(cudaMemcpyAsync(vw.data(), vd.data(), v.size() * sizeof(bfloat16), cudaMemcpyDeviceToDevice));
                VLSPARSE_BENCH_CK(cudaMemcpyAsync(lens_dev.data(), lens0.data(), sizeof(std::int32_t), cudaMemcpyDeviceToDevice));
                lens = n_host;
            };
            const KvBatchView<bfloat16> cache =
                contiguous_kv_batch<bfloat16>(kw.data(), vw.data(), 1, n, static_cast<std::int32_t>(Hkv), static_cast<std::int32_t>(d), lens_dev.data());
            cuda::KvUpdateOptions ko;
            ko.check_inputs = false;
            std::int64_t kept = 0;
            if (want("zipvl_evict50")) {  // the eviction alone, over the lists of one selection (made untimed)
                const auto& s0 = sel.select(qv, kv, layout, 1, P);
                const std::int64_t m = s0.indptr.back();
                const double us = timer.median_us(
                    [&] {
                        cuda::kv_batch_compact(cache, std::span<std::int32_t>(lens), s0.indptr, s0.indptr_dev, s0.indices,
                                               std::span<std::int32_t>{}, {}, nullptr, ko);
                    },
                    warmup, reps, restore);
                row("vlsparse", "zipvl_evict50", us, H * m * (m + 1) / 2,
                    "kv_batch_compact of the layer's K and V to ZipVL's list, in place; kept " + std::to_string(m));
            }
            if (want("zipvl_e2e50_kept")) {
                const double us = timer.median_us(
                    [&] {
                        const View3<const bfloat16> kwv(kw.data(), {n, Hkv, d});
                        const auto& s = sel.select(qv, kwv, layout, 1, P);
                        kept = s.indptr.back();
                        cuda::kv_batch_compact(cache, std::span<std::int32_t>(lens), s.indptr, s.indptr_dev, s.indices,
                                               std::span<std::int32_t>{}, {}, nullptr, ko);
                        const View3<const bfloat16> kk(kw.data(), {kept, Hkv, d}), vk(vw.data(), {kept, Hkv, d});
                        cuda::sparse_prefill_attention_kept(qv, kk, vk, cuda::DeviceTokenLists{n, s.indptr, s.indptr_dev, s.indices},
                                                            ov, UnselectedRows::zero, opt);
                    },
                    warmup, reps, restore);
                row("vlsparse", "zipvl_e2e50_kept", us, H * kept * (kept + 1) / 2,
                    "selection + eviction (kv_batch_compact in place) + prefill over the kept rows; kept " + std::to_string(kept));
            }
        }
        // The two halves of zipvl_e2e50 timed apart: the selection alone (its one synchronization
        // included), and the token-sparse prefill over the lists that selection kept (made once, untimed).
        if (want("zipvl_select50") || want("zipvl_selprefill50")) {
            cuda::ZipVLSelector sel;
            const ZipVLParams P = zipvl_fixed50();
            const Layout layout = Layout::parse("image:" + std::to_string(n));
            const auto& s0 = sel.select(qv, kv, layout, 1, P);
            const std::int64_t kept = s0.indptr.back();
            const std::int64_t pairs = H * kept * (kept + 1) / 2;
            if (want("zipvl_selprefill50")) {
                const cuda::DeviceTokenLists lists{n, s0.indptr, s0.indptr_dev, s0.indices};
                const double us = timed([&] { cuda::sparse_prefill_attention(qv, kv, vv, lists, ov, UnselectedRows::zero, opt); });
                row("vlsparse", "zipvl_selprefill50", us, pairs,
                    "token-sparse prefill over ZipVL's kept lists (selection untimed); kept " + std::to_string(kept));
            }
            if (want("zipvl_select50")) {
                const double us = timed([&] { (void)sel.select(qv, kv, layout, 1, P); });
                row("vlsparse", "zipvl_select50", us, pairs, "ZipVL's selection alone (fixed ratio 0.5; probes 64+64)");
            }
        }
    }
    if (out != stdout) std::fclose(out);
    return 0;
}
