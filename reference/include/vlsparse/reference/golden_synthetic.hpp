// vlsparse/reference/golden_synthetic.hpp -- the structured Q/K/V the golden cases are built from.
//
// A frozen copy of the simulator's first synthetic generator (vlsparse/sim/synthetic.hpp as of
// version 0.1): the golden files must not move when the simulator's generator is improved, so the
// generator keeps its own. Changing anything here changes golden inputs; the golden-regenerate test
// then fails until the files are regenerated on purpose.
//
// Random Q/K/V give near-uniform attention, nothing like a VLM's. This generator plants the
// patterns the papers report, each as a logit contribution in known units (the scaled dot product
// scale * q.k with scale = 1/sqrt(d)):
//   sinks      the first token of the prompt and of every image/video segment:  + sink * w_sink(h)
//   heavy      a fraction of visual tokens that queries focus on:              + heavy * w_heavy(h)
//                                                        (text queries: x text_focus)
//   locality   sinusoidal position features, e(i).e(j) = mean_m cos(w_m (i - j)): + local * w_local(h) * e(i).e(j)
//   noise      N(0, noise^2) per coordinate in q and k (a diffuse background)
// Each head has one dominant pattern, drawn per layer and head: sink, heavy, local or diffuse. The
// dominant pattern's weight w_*(h) is 1, the others' are uniform in [0, minor_weight]; a diffuse
// head has only minor weights. Needs d >= 8. Everything derives from SplitMix64(seed).
// Include: <vlsparse/reference/golden_synthetic.hpp>
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "vlsparse/core/dtype.hpp"
#include "vlsparse/core/layout.hpp"
#include "vlsparse/core/rng.hpp"

namespace vlsparse::golden {

struct SyntheticParams {
    std::int64_t n_heads = 8, n_kv_heads = 8, head_dim = 128;
    double sink = 16.0;           // logit boost of a sink key for a pure sink head
    double heavy = 8.0;           // logit boost of a heavy-hitter key for a pure heavy head
    double heavy_fraction = 0.02; // share of visual tokens that are heavy hitters
    double text_focus = 1.25;     // text queries weigh heavy hitters this much more
    double local = 10.0;          // logit boost of the key at the query's own position (pure local head)
    double noise = 0.7;           // per-coordinate std of the random part of q and k (logit std noise^2)
    double minor_weight = 0.25;   // weights of a head's non-dominant patterns are uniform in [0, this]
    // Probability that a head is diffuse, by layer: layer 0, layer 1, later layers. The rest of the
    // heads are sink, heavy or local heads in the ratio 35 : 30 : 35.
    double diffuse_layer0 = 0.6, diffuse_layer1 = 0.3, diffuse_later = 0.03;
    std::uint64_t seed = 1;
};

// One layer's Q [n, H, d], K and V [n, H_kv, d], token-major, in fp32.
struct SyntheticLayer {
    std::int64_t n = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
    std::vector<float> q, k, v;
    std::vector<std::uint8_t> heavy;  // [n] 1 where the token is a planted heavy hitter
    std::vector<std::uint8_t> sink;   // [n] 1 where the token is a planted sink
};

namespace detail {
inline double gaussian(SplitMix64& rng) {  // Box-Muller
    const double u1 = (static_cast<double>(rng.next() >> 11) + 0.5) * 0x1.0p-53;
    const double u2 = static_cast<double>(rng.next() >> 11) * 0x1.0p-53;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}
}  // namespace detail

inline SyntheticLayer synthetic_layer(const Layout& layout, const SyntheticParams& P, std::int64_t layer) {
    constexpr const char* fn = "golden::synthetic_layer";
    const std::int64_t n = layout.n(), H = P.n_heads, Hkv = P.n_kv_heads, d = P.head_dim;
    ::vlsparse::detail::require(d >= 8, fn, "head_dim = ", d, ", expected >= 8");
    ::vlsparse::detail::require(H > 0 && Hkv > 0 && H % Hkv == 0, fn, "heads ", H, " / KV heads ", Hkv,
                                ", expected H % H_kv == 0");
    SyntheticLayer L;
    L.n = n;
    L.n_heads = H;
    L.n_kv_heads = Hkv;
    L.head_dim = d;
    L.q.resize(static_cast<std::size_t>(n * H * d));
    L.k.resize(static_cast<std::size_t>(n * Hkv * d));
    L.v.resize(static_cast<std::size_t>(n * Hkv * d));
    L.heavy.assign(static_cast<std::size_t>(n), 0);
    L.sink.assign(static_cast<std::size_t>(n), 0);

    SplitMix64 rng(P.seed * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(layer) * 0xD1B54A32D192ED03ull + 1);
    L.sink[0] = 1;
    for (const auto& s : layout.segments())
        if (s.is_visual()) {
            L.sink[static_cast<std::size_t>(s.start)] = 1;
            for (std::int64_t j = s.start + 1; j < s.end(); ++j)
                if (rng.uniform() < P.heavy_fraction) L.heavy[static_cast<std::size_t>(j)] = 1;
        }
    const auto text = layout.text_mask();

    // Per query head weights; KV heads carry the planted key features at full strength.
    std::vector<double> w_sink(H), w_heavy(H), w_local(H);
    const double p_diffuse = layer == 0 ? P.diffuse_layer0 : layer == 1 ? P.diffuse_layer1 : P.diffuse_later;
    for (std::int64_t h = 0; h < H; ++h) {
        w_sink[h] = P.minor_weight * rng.uniform();
        w_heavy[h] = P.minor_weight * rng.uniform();
        w_local[h] = P.minor_weight * rng.uniform();
        const double u = rng.uniform();
        if (u >= p_diffuse) {
            const double t = (u - p_diffuse) / (1.0 - p_diffuse);  // uniform in [0, 1)
            (t < 0.35 ? w_sink[h] : t < 0.65 ? w_heavy[h] : w_local[h]) = 1.0;
        }
    }
    const double r4 = std::pow(static_cast<double>(d), 0.25);  // scale*q.k = (a r4)(b r4)/sqrt(d) = a b
    const std::int64_t M = (d - 2) / 4;
    auto feature = [&](std::int64_t t, std::int64_t m, bool sine) {
        const double wavelength = 4.0 * std::pow(256.0, static_cast<double>(m) / static_cast<double>(std::max<std::int64_t>(M - 1, 1)));
        const double a = 6.283185307179586 * static_cast<double>(t) / wavelength;
        return (sine ? std::sin(a) : std::cos(a)) / std::sqrt(static_cast<double>(M));
    };
    for (std::int64_t i = 0; i < n; ++i) {
        for (std::int64_t g = 0; g < Hkv; ++g) {
            float* kr = &L.k[static_cast<std::size_t>((i * Hkv + g) * d)];
            float* vr = &L.v[static_cast<std::size_t>((i * Hkv + g) * d)];
            for (std::int64_t c = 0; c < d; ++c) {
                kr[c] = static_cast<float>(P.noise * detail::gaussian(rng));
                vr[c] = static_cast<float>(detail::gaussian(rng));
            }
            kr[0] += static_cast<float>(L.sink[static_cast<std::size_t>(i)] ? std::sqrt(P.sink) * r4 : 0.0);
            kr[1] += static_cast<float>(L.heavy[static_cast<std::size_t>(i)] ? std::sqrt(P.heavy) * r4 : 0.0);
            for (std::int64_t m = 0; m < M; ++m) {
                kr[2 + 2 * m] += static_cast<float>(std::sqrt(P.local) * r4 * feature(i, m, false));
                kr[3 + 2 * m] += static_cast<float>(std::sqrt(P.local) * r4 * feature(i, m, true));
            }
        }
        for (std::int64_t h = 0; h < H; ++h) {
            float* qr = &L.q[static_cast<std::size_t>((i * H + h) * d)];
            for (std::int64_t c = 0; c < d; ++c) qr[c] = static_cast<float>(P.noise * detail::gaussian(rng));
            const double focus = text[static_cast<std::size_t>(i)] ? P.text_focus : 1.0;
            qr[0] += static_cast<float>(w_sink[h] * std::sqrt(P.sink) * r4);
            qr[1] += static_cast<float>(w_heavy[h] * focus * std::sqrt(P.heavy) * r4);
            for (std::int64_t m = 0; m < M; ++m) {
                qr[2 + 2 * m] += static_cast<float>(w_local[h] * std::sqrt(P.local) * r4 * feature(i, m, false));
                qr[3 + 2 * m] += static_cast<float>(w_local[h] * std::sqrt(P.local) * r4 * feature(i, m, true));
            }
        }
    }
    return L;
}

}  // namespace vlsparse::golden
