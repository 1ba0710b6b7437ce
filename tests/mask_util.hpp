// Mask cases shared by the BlindSight tests and the masked-attention tests: layouts, mask options,
// random inputs, per-head templates, and attention over an explicit boolean mask (the oracle).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <vlsparse/attention/common.hpp>
#include <vlsparse/core/rng.hpp>
#include <vlsparse/masks/templates.hpp>

#include "test_util.hpp"

namespace vt {

// Layouts covering: 1, 4 and 8 images of unequal sizes, text between images, delimiters, video.
inline const char* const kMaskLayouts[] = {
    "text:3,image:20,text:2",
    "text:2,image:9,text:1,text:1,image:13,text:1,text:3,image:5,text:1,image:11,text:4",
    "image:7,image:5,text:1,image:6",
    "text:1,image:4,text:1,image:6,text:1,image:3,text:1,image:8,text:1,image:5,text:1,image:7,text:1,image:2,text:1,image:9,text:2",
    "text:2,video:3x4,text:1",
};

inline std::vector<vlsparse::MaskOptions> mask_option_sets() {
    std::vector<vlsparse::MaskOptions> r(4);
    r[1].sink_fraction = 0.3;
    r[2].sink_offsets = {0, 2, 5};
    r[3].bidirectional_images = true;
    r[3].sink_offsets = {1, 3};
    return r;
}

template <class T>
Qkv<T> mask_make_qkv(std::int64_t n, std::int64_t H, std::int64_t Hkv, std::int64_t d, std::uint64_t seed) {
    return {n, H, Hkv, d, vt::random_buffer<T>(static_cast<std::size_t>(n * H * d), seed, 1.0f),
            vt::random_buffer<T>(static_cast<std::size_t>(n * Hkv * d), seed + 1, 1.0f),
            vt::random_buffer<T>(static_cast<std::size_t>(n * Hkv * d), seed + 2, 1.0f)};
}

// One template per head, drawn from the four at random.
inline std::vector<vlsparse::MaskTemplate> mixed_heads(std::int64_t H, std::uint64_t seed) {
    vlsparse::SplitMix64 rng(seed);
    std::vector<vlsparse::MaskTemplate> r;
    for (std::int64_t h = 0; h < H; ++h) r.push_back(static_cast<vlsparse::MaskTemplate>(rng.next() % 4));
    return r;
}

// Attention of every row over an explicit [H, n, n] boolean mask, in double: the independent oracle.
template <class T>
std::vector<double> attention_over_mask(const Qkv<T>& in, const std::vector<std::uint8_t>& mask) {
    const std::int64_t n = in.n, H = in.H, d = in.d, group = in.H / in.Hkv;
    const double scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));  // the float scale every path uses
    std::vector<double> out(static_cast<std::size_t>(n * H * d), 0.0);
    for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t i = 0; i < n; ++i) {
            std::vector<double> s(static_cast<std::size_t>(n), -INFINITY);
            double mx = -INFINITY;
            for (std::int64_t j = 0; j < n; ++j) {
                if (!mask[static_cast<std::size_t>((h * n + i) * n + j)]) continue;
                double acc = 0.0;
                for (std::int64_t c = 0; c < d; ++c)
                    acc += static_cast<double>(vlsparse::detail::load(in.qv()(i, h, c))) *
                           static_cast<double>(vlsparse::detail::load(in.kv()(j, h / group, c)));
                s[static_cast<std::size_t>(j)] = acc * scale;
                mx = std::max(mx, acc * scale);
            }
            double sum = 0.0;
            for (auto& x : s) sum += (x = std::exp(x - mx));
            for (std::int64_t j = 0; j < n; ++j)
                for (std::int64_t c = 0; c < d; ++c)
                    out[static_cast<std::size_t>((i * H + h) * d + c)] +=
                        s[static_cast<std::size_t>(j)] / sum * static_cast<double>(vlsparse::detail::load(in.vv()(j, h / group, c)));
        }
    return out;
}

}  // namespace vt
