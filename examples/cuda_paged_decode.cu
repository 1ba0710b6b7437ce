// How an engine hands its paged batch to vlsparse's decode kernel: a vLLM-style page pool in device
// memory (NHD pages of 16 rows), a block table per sequence, ragged lengths, and per-KV-head row lists
// (the rows a sparsity policy kept). One plan per decode step, one call per layer; the result is
// checked against the reference on the host. Built with -Dcuda=enabled; runs where a GPU is present
// (exits 77, "skipped", where none is).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <vector>

#include <vlsparse/core/rng.hpp>
#include <vlsparse/cuda/decode.cuh>
#include <vlsparse/kv/kv_batch.hpp>
#include <vlsparse/reference/batched_decode.hpp>

using namespace vlsparse;

int main() {
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        std::printf("cuda_paged_decode: no CUDA device, skipped\n");
        return 77;
    }
    constexpr std::int32_t B = 3, Hkv = 4, G = 4, H = Hkv * G, d = 128, P = 16;
    const std::vector<std::int32_t> lens{700, 33, 2048};
    const std::int64_t max_pages = (2048 + P - 1) / P, n_pages = B * max_pages;

    // The engine's pool: K, V [n_pages, P, H_kv, d] bf16, pages handed out in a scrambled order.
    std::vector<bfloat16> k(static_cast<std::size_t>(n_pages * P * Hkv * d)), v(k.size());
    std::vector<std::int32_t> table(static_cast<std::size_t>(B * max_pages));
    std::iota(table.begin(), table.end(), 0);
    std::reverse(table.begin(), table.end());
    SplitMix64 rng(7);
    for (auto& x : k) x = bfloat16(static_cast<float>(rng.uniform() - 0.5));
    for (auto& x : v) x = bfloat16(static_cast<float>(rng.uniform() - 0.5));
    // Row lists: per KV head, every 3rd row plus the newest (logical rows, sorted).
    std::vector<std::int32_t> indptr{0}, rows;
    for (std::int32_t b = 0; b < B; ++b)
        for (std::int32_t g = 0; g < Hkv; ++g) {
            for (std::int32_t r = g % 3; r < lens[static_cast<std::size_t>(b)] - 1; r += 3) rows.push_back(r);
            rows.push_back(lens[static_cast<std::size_t>(b)] - 1);
            indptr.push_back(static_cast<std::int32_t>(rows.size()));
        }
    std::vector<bfloat16> q(static_cast<std::size_t>(B * H * d));
    for (auto& x : q) x = bfloat16(static_cast<float>(rng.uniform() - 0.5));

    // Device copies (an engine has these already).
    cuda::DeviceArray<bfloat16> k_d(k), v_d(v), q_d(q), out_d(q.size());
    cuda::DeviceArray<std::int32_t> table_d(table), lens_d(lens), indptr_d(indptr), rows_d(rows);
    const auto cache = paged_kv_batch_nhd<const bfloat16>(k_d.data(), v_d.data(), B, n_pages, P, Hkv, d,
                                                          table_d.data(), max_pages, lens_d.data());
    const BatchRowLists lists{indptr_d.data(), rows_d.data(), Hkv};

    // Once per step: the plan, from the host copies of the lengths and the list indptr.
    const DecodeBatchHost meta{lens, {}, indptr, Hkv};
    cuda::DecodePlan plan;
    plan.plan(meta, H, Hkv, d, /*with_probs=*/false, /*stream=*/nullptr, DType::bf16);  // sized for a bf16 cache
    // Per layer (checks on here; an engine's decode loop turns them off).
    cuda::batched_decode_attention(plan, View3<const bfloat16>(q_d.data(), {B, H, d}), cache, lists,
                                   View3<bfloat16>(out_d.data(), {B, H, d}));
    const auto out = out_d.download();

    // The same step by the reference, on the host copies.
    std::vector<double> ref(out.size());
    const auto cache_h = paged_kv_batch_nhd<const bfloat16>(k.data(), v.data(), B, n_pages, P, Hkv, d, table.data(),
                                                            max_pages, lens.data());
    reference::batched_decode_attention(View3<const bfloat16>(q.data(), {B, H, d}), cache_h,
                                        BatchRowLists{indptr.data(), rows.data(), Hkv}, meta,
                                        View3<double>(ref.data(), {B, H, d}));
    double worst = 0.0;
    for (std::size_t i = 0; i < out.size(); ++i)
        worst = std::max(worst, std::abs(static_cast<double>(static_cast<float>(out[i])) - ref[i]) /
                                    (std::abs(ref[i]) + 1e-3));
    std::printf("cuda_paged_decode: %d sequences, %lld listed rows, %lld work items; worst relative error %.2e\n", B,
                static_cast<long long>(rows.size()), static_cast<long long>(plan.n_items()), worst);
    return worst < 1.0 / 64 ? 0 : 1;  // bf16 output: within a few of its steps
}
