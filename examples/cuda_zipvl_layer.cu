// One ZipVL layer of a prompt's prefill on the GPU, in the order an engine that evicts runs it:
//   1. ZipVL's selection (probes, their attention, normalized scores, the adaptive count, top-k), the
//      kept positions left on the device;
//   2. the eviction of the layer's KV cache to those rows (cuda::kv_batch_compact, in place);
//   3. the token-sparse prefill over the evicted cache (cuda::sparse_prefill_attention_kept), whose
//      keys are whole tiles of rows.
// The output is checked bit for bit against the token-sparse prefill over the cache before the
// eviction (cuda::sparse_prefill_attention, keys read through the lists): the same pairs, the same
// arithmetic. Built with -Dcuda=enabled; runs where a GPU is present (exits 77, "skipped", where none
// is).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <vector>

#include <vlsparse/core/rng.hpp>
#include <vlsparse/cuda/kv_cache.cuh>
#include <vlsparse/cuda/prefill.cuh>
#include <vlsparse/cuda/zipvl.cuh>

using namespace vlsparse;

int main() {
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        std::printf("cuda_zipvl_layer: no CUDA device, skipped\n");
        return 77;
    }
    // One layer of a prompt: 64 text tokens, an image of 2880, 56 text tokens; H = 8 query heads over
    // H_kv = 2 KV heads, d = 128, bf16 as the engine holds them.
    constexpr std::int64_t n = 3000, H = 8, Hkv = 2, d = 128;
    const Layout layout = Layout::parse("text:64,image:2880,text:56");
    std::vector<bfloat16> q(static_cast<std::size_t>(n * H * d)), k(static_cast<std::size_t>(n * Hkv * d)), v(k.size());
    SplitMix64 rng(11);
    for (auto& x : q) x = bfloat16(static_cast<float>(2.0 * rng.uniform() - 1.0));
    for (auto& x : k) x = bfloat16(static_cast<float>(2.0 * rng.uniform() - 1.0));
    for (auto& x : v) x = bfloat16(static_cast<float>(rng.uniform() - 0.5));
    cuda::DeviceArray<bfloat16> q_d(q), k_d(k), v_d(v), out_full(q.size()), out_kept(q.size());
    const View3<const bfloat16> qv(q_d.data(), {n, H, d}), kv(k_d.data(), {n, Hkv, d}), vv(v_d.data(), {n, Hkv, d});

    // 1. Selection: the paper's defaults (tau = 0.975, 64 recent + 64 random probes, one list per layer).
    cuda::ZipVLSelector selector;
    const ZipVLParams params;
    const cuda::DeviceZipVLSelection& s = selector.select(qv, kv, layout, /*layer=*/1, params);
    const cuda::DeviceTokenLists lists{n, s.indptr, s.indptr_dev, s.indices};
    const std::int64_t kept = s.indptr.back();

    // For the check only: the prefill over the whole cache, keys read through the list.
    cuda::sparse_prefill_attention(qv, kv, vv, lists, View3<bfloat16>(out_full.data(), {n, H, d}), UnselectedRows::zero);

    // 2. Eviction: the cache (one sequence, contiguous) keeps the listed rows, in order, in place.
    std::vector<std::int32_t> lens{static_cast<std::int32_t>(n)};
    cuda::DeviceArray<std::int32_t> lens_d(lens);
    const KvBatchView<bfloat16> cache = contiguous_kv_batch<bfloat16>(k_d.data(), v_d.data(), 1, n, static_cast<std::int32_t>(Hkv),
                                                                      static_cast<std::int32_t>(d), lens_d.data());
    cuda::kv_batch_compact(cache, std::span<std::int32_t>(lens), s.indptr, s.indptr_dev, s.indices);

    // 3. The prefill over the evicted cache: rows 0 .. kept - 1 of K and V.
    const View3<const bfloat16> k_kept(k_d.data(), {lens[0], Hkv, d}), v_kept(v_d.data(), {lens[0], Hkv, d});
    cuda::sparse_prefill_attention_kept(qv, k_kept, v_kept, lists, View3<bfloat16>(out_kept.data(), {n, H, d}),
                                        UnselectedRows::zero);

    const std::vector<bfloat16> a = out_full.download(), b = out_kept.download();
    const bool same = std::memcmp(a.data(), b.data(), a.size() * sizeof(bfloat16)) == 0;
    std::printf("cuda_zipvl_layer: ZipVL kept %lld of %lld tokens (p = %lld); the cache now holds %d rows; "
                "prefill over the evicted cache %s the prefill through the list\n",
                static_cast<long long>(kept), static_cast<long long>(n), static_cast<long long>(s.p.empty() ? 0 : s.p[0]),
                lens[0], same ? "equals, bit for bit," : "DIFFERS FROM");
    return same && lens[0] == kept ? 0 : 1;
}
