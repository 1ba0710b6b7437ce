// ZipVL inside an inference engine, on raw buffers.
//
// An engine typically holds one layer's projections as a fused QKV buffer in bf16:
//   qkv [n_tokens, (H + 2 * H_kv) * d]   (Q heads, then K heads, then V heads, per token)
// vlsparse reads it in place through strided views: no copy, no Eigen type, no ownership.
// This program fills such a buffer with toy numbers, runs ZipVL's selection and token-sparse
// prefill into the engine's own fp32 output buffer, evicts the KV cache, and decodes a few tokens.
#include <cmath>
#include <cstdio>
#include <vector>

#include <vlsparse/vlsparse.hpp>

int main() {
    using vlsparse::bfloat16;
    const std::int64_t n = 600, H = 8, Hkv = 2, d = 64;  // GQA: 4 query heads per KV head
    const std::int64_t row = (H + 2 * Hkv) * d;          // elements per token in the fused buffer
    const auto layout = vlsparse::Layout::parse("text:20,image:560,text:20");

    // The engine's buffer: toy values with a few strong "sink" keys at the image start.
    std::vector<bfloat16> qkv(static_cast<std::size_t>(n * row));
    vlsparse::SplitMix64 rng(42);
    for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t c = 0; c < row; ++c) {
            float x = static_cast<float>(rng.uniform() - 0.5);
            const bool is_k = c >= H * d && c < (H + Hkv) * d;
            if (is_k && (i == 0 || i == 20) && c % d == 0) x += 40.0f;  // sink keys
            if (c < H * d && c % d == 0) x += 1.5f;                      // queries look at them
            qkv[static_cast<std::size_t>(i * row + c)] = bfloat16(x);
        }

    // Views [n, heads, d] into the fused buffer: token stride `row`, head stride d, unit inner stride.
    const vlsparse::View3<const bfloat16> q(qkv.data(), {n, H, d}, {row, d, 1});
    const vlsparse::View3<const bfloat16> k(qkv.data() + H * d, {n, Hkv, d}, {row, d, 1});
    const vlsparse::View3<const bfloat16> v(qkv.data() + (H + Hkv) * d, {n, Hkv, d}, {row, d, 1});

    // ZipVL with the paper's defaults (tau = 0.975, 64 recent + 64 random probes, layer-wise).
    vlsparse::ZipVLParams params;
    const std::int64_t layer = 0;
    const auto sel = vlsparse::simd::zipvl_select(q, k, layout, layer, params);

    std::vector<float> out(static_cast<std::size_t>(n * H * d));  // the engine's attention output
    const vlsparse::View3<float> o(out.data(), {n, H, d});
    vlsparse::simd::zipvl_prefill(q, k, v, sel, o, params);

    vlsparse::KvCache<bfloat16> cache(Hkv, d);
    cache.assign(k, v);
    const auto bytes_before = cache.kv_bytes();
    vlsparse::zipvl_evict(cache, sel);

    std::printf("probes: %zu, p = %lld of %lld tokens (%.1f%% kept)\n", sel.probes.size(),
                static_cast<long long>(sel.p[0]), static_cast<long long>(n), 100.0 * sel.kept_ratio());
    std::printf("KV cache: %lld -> %lld bytes\n", static_cast<long long>(bytes_before),
                static_cast<long long>(cache.kv_bytes()));

    // Decode: append the new token's K/V, then attend over the compressed cache.
    std::vector<bfloat16> q_new(static_cast<std::size_t>(H * d)), kv_new(static_cast<std::size_t>(2 * Hkv * d));
    std::vector<float> o_new(static_cast<std::size_t>(H * d));
    for (int step = 0; step < 3; ++step) {
        for (auto& x : q_new) x = bfloat16(static_cast<float>(rng.uniform() - 0.5));
        for (auto& x : kv_new) x = bfloat16(static_cast<float>(rng.uniform() - 0.5));
        cache.append(vlsparse::View2<const bfloat16>(kv_new.data(), {Hkv, d}),
                     vlsparse::View2<const bfloat16>(kv_new.data() + Hkv * d, {Hkv, d}));
        vlsparse::simd::decode_attention(vlsparse::View2<const bfloat16>(q_new.data(), {H, d}), cache,
                                         vlsparse::View2<float>(o_new.data(), {H, d}));
        std::printf("decode step %d: position %lld, cache rows %lld, out[0] = %.4f\n", step,
                    static_cast<long long>(cache.seq_len() - 1), static_cast<long long>(cache.rows(0)), o_new[0]);
    }
    // Errors are exceptions with the function, the value and the expectation:
    try {
        params.tau = 1.5;
        (void)vlsparse::simd::zipvl_select(q, k, layout, layer, params);
    } catch (const vlsparse::error& e) {
        std::printf("bad input is reported: %s\n", e.what());
    }
    return 0;
}
