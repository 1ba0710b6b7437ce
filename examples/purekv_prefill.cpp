// PureKV in an engine's prefill loop: a layer-by-layer prefill of a video prompt with the cross-layer
// estimator, then a few decode steps on the compressed caches.
//
// Layers 0..l0 compute their window attention scores (Eq. 2, the last w queries); every higher layer
// reuses layer l0's scores weighted by its own ||V|| (Eq. 4), so it never needs attention scores and
// could run a FlashAttention-style kernel. The prefill attention itself uses ST-SpAttn (spatial +
// temporal video mask) from st_start_layer on. Each layer's KV cache keeps the window + the top-h
// tokens; the paper's validation (Spearman between the estimate and the layer's own importance,
// Eq. 5-7) is printed for the higher layers. The Q/K/V are toy numbers with a few strong keys that
// stay strong across layers (as real models' heavy hitters do).
#include <cmath>
#include <cstdio>
#include <vector>

#include <vlsparse/vlsparse.hpp>

int main() {
    const auto layout = vlsparse::Layout::parse("text:12,video:8x36[6x6],text:20");  // n = 320
    const std::int64_t n = layout.n();
    const vlsparse::ModelShape shape{6, 8, 2, 64};  // layers, H, H_kv (GQA 4), d
    const std::int64_t H = shape.heads, Hkv = shape.kv_heads, d = shape.head_dim;

    vlsparse::PureKVParams params;  // l0 = 2, w = 32, 20% budget per KV head, ST-SpAttn
    params.st_start_layer = 1;      // layer 0 keeps dense attention in this example

    vlsparse::simd::PureKVEstimator est(params, layout, shape);
    std::vector<vlsparse::KvCache<float>> caches(static_cast<std::size_t>(shape.layers), vlsparse::KvCache<float>(Hkv, d));

    // One layer's toy projections: random values, keys at every 9th video position carry a strong
    // component along the queries' shared direction (coordinate 0), V magnitudes vary per token.
    vlsparse::SplitMix64 rng(7);
    auto make = [&](std::int64_t heads, bool is_q, bool is_v, std::int64_t layer) {
        std::vector<float> x(static_cast<std::size_t>(n * heads * d));
        for (std::int64_t i = 0; i < n; ++i)
            for (std::int64_t h = 0; h < heads; ++h)
                for (std::int64_t c = 0; c < d; ++c) {
                    float val = static_cast<float>(rng.uniform() - 0.5);
                    if (c == 0 && is_q) val += 2.0f + 0.2f * static_cast<float>(layer);
                    if (c == 0 && !is_q && !is_v && i >= 12 && i < 300 && i % 9 == 0) val += 4.0f;
                    if (is_v) val *= 0.5f + static_cast<float>((i * 37) % 11) / 10.0f;
                    x[static_cast<std::size_t>((i * heads + h) * d + c)] = val;
                }
        return x;
    };

    std::printf("layer  scores      prefill attention  kept/KV head  source  validation rho (p)\n");
    std::vector<float> out(static_cast<std::size_t>(n * H * d));
    for (std::int64_t l = 0; l < shape.layers; ++l) {
        const auto qb = make(H, true, false, l), kb = make(Hkv, false, false, l), vb = make(Hkv, false, true, l);
        const vlsparse::View3<const float> q(qb.data(), {n, H, d}), k(kb.data(), {n, Hkv, d}), v(vb.data(), {n, Hkv, d});
        // What an engine does per layer (est.prefill_layer(l, q, k, v, out, cache) does the same in one call):
        const bool scored = est.needs_scores(l);
        if (scored) est.observe(l, q, k);                                      // Eq. 2 (layers <= l0)
        est.attention(l, q, k, v, vlsparse::View3<float>(out.data(), {n, H, d}));  // ST-SpAttn or dense
        const vlsparse::PureKVSelection sel = est.select(l, v);               // Eq. 3 / Eq. 4
        auto& cache = caches[static_cast<std::size_t>(l)];
        cache.assign(k, v);
        vlsparse::purekv_evict(cache, sel);
        std::printf("%5lld  %-10s  %-17s  %5lld / %lld  %6lld", static_cast<long long>(l), scored ? "computed" : "reused",
                    est.masked(l) ? "ST-SpAttn" : "dense causal", static_cast<long long>(cache.rows(0)),
                    static_cast<long long>(n), static_cast<long long>(sel.source_layer));
        if (l > params.l0) {
            const auto val = est.validate(l, q, k, v);  // needs this layer's scores: for analysis only
            for (const auto& g : val.groups) std::printf("  %.3f (%.1e)", g.rho, g.p_value);
        }
        std::printf("\n");
    }
    std::int64_t bytes = 0;
    for (const auto& c : caches) bytes += c.kv_bytes();
    std::printf("KV cache: %lld bytes for %lld layers (dense: %lld)\n", static_cast<long long>(bytes),
                static_cast<long long>(shape.layers), static_cast<long long>(shape.layers * n * Hkv * d * 2 * 4));

    // Decode: every layer appends the new token's K/V and attends over its compressed cache.
    std::vector<float> q_new(static_cast<std::size_t>(H * d)), k_new(static_cast<std::size_t>(Hkv * d)),
        v_new(k_new.size()), o_new(q_new.size());
    for (int step = 0; step < 3; ++step) {
        double norm = 0.0;
        for (std::int64_t l = 0; l < shape.layers; ++l) {
            for (auto& x : q_new) x = static_cast<float>(rng.uniform() - 0.5);
            for (auto& x : k_new) x = static_cast<float>(rng.uniform() - 0.5);
            for (auto& x : v_new) x = static_cast<float>(rng.uniform() - 0.5);
            auto& cache = caches[static_cast<std::size_t>(l)];
            cache.append(vlsparse::View2<const float>(k_new.data(), {Hkv, d}), vlsparse::View2<const float>(v_new.data(), {Hkv, d}));
            vlsparse::simd::decode_attention(vlsparse::View2<const float>(q_new.data(), {H, d}), cache,
                                             vlsparse::View2<float>(o_new.data(), {H, d}));
            for (float x : o_new) norm += static_cast<double>(x) * x;
        }
        std::printf("decode step %d: position %lld, output norm %.4f\n", step,
                    static_cast<long long>(caches[0].seq_len() - 1), std::sqrt(norm));
    }
    return 0;
}
