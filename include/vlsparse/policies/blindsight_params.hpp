// vlsparse/policies/blindsight_params.hpp -- BlindSight's parameters, Algorithms 1 and 2 on given
// NMSEs, and the head-to-template map: the part of BlindSight without attention (no Eigen, no xsimd).
//
//   Algorithm 1 (prompt level), per head h:  template = first t in (Sink, Document, Document-Sink) with
//     NMSE_t < alpha, else Dense (choose_template; the NMSEs come from simd:: or reference::
//     characterize_prompt).
//   Algorithm 2 (dataset level), per (layer, head) with fractions f over the prompts:
//     Dense if f_Dense > gamma_c, else Sink if f_Sink > gamma_s, else Document if f_Document > gamma_d,
//     else Document-Sink.
// BlindSight (Srikrishnan, Shah, Reinhardt 2025), Sections 4.1, 4.2, 5.1 (alpha 0.1, gamma_c 0.25,
// gamma_s = gamma_d = 0.6). The CPU fast path of Algorithm 1 is in <vlsparse/policies/blindsight.hpp>,
// its exact twin in <vlsparse/reference/blindsight.hpp>; the JSON form of the head map in
// <vlsparse/io/blindsight_json.hpp>.
// Include: <vlsparse/policies/blindsight.hpp> (or this header alone, without the attention code).
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "vlsparse/core/error.hpp"
#include "vlsparse/masks/templates.hpp"

namespace vlsparse {

struct BlindSightParams {
    double alpha = 0.1;    // Algorithm 1: NMSE threshold
    double gamma_c = 0.25; // Algorithm 2: Dense if its fraction > gamma_c
    double gamma_s = 0.6;  // ... Sink if its fraction > gamma_s
    double gamma_d = 0.6;  // ... Document if its fraction > gamma_d
    MaskOptions mask;      // sinks, bidirectional images
    float scale = 0.0f;    // softmax scale; 0 = 1/sqrt(d)
    bool check_finite = true;
};

inline void check_blindsight_params(const BlindSightParams& P, const char* fn) {
    detail::require(std::isfinite(P.alpha) && P.alpha > 0.0, fn, "alpha = ", P.alpha, ", expected a finite alpha > 0");
    const std::pair<const char*, double> g[] = {{"gamma_c", P.gamma_c}, {"gamma_s", P.gamma_s}, {"gamma_d", P.gamma_d}};
    for (const auto& [name, x] : g)
        detail::require(std::isfinite(x) && x >= 0.0 && x <= 1.0, fn, name, " = ", x, ", expected 0 <= ", name, " <= 1");
    check_mask_options(P.mask, fn);
    detail::require(std::isfinite(P.scale) && P.scale >= 0.0f, fn, "scale = ", P.scale,
                    ", expected a finite scale >= 0 (0 = 1/sqrt(d))");
}

// The three templates Algorithm 1 tries, in its order.
inline constexpr MaskTemplate kCandidateTemplates[] = {MaskTemplate::sink, MaskTemplate::document,
                                                       MaskTemplate::document_sink};

// Algorithm 1's result for one head: the chosen template and the NMSE of each template
// (indexed by MaskTemplate; the Dense entry is 0).
struct HeadCharacterization {
    MaskTemplate chosen = MaskTemplate::dense;
    std::array<double, 4> nmse{};
};

// The first-wins rule of Algorithm 1 on given NMSEs.
inline MaskTemplate choose_template(const std::array<double, 4>& nmse, double alpha) {
    for (MaskTemplate t : kCandidateTemplates)
        if (nmse[static_cast<std::size_t>(t)] < alpha) return t;
    return MaskTemplate::dense;
}

// Per-head tallies of Algorithm 1's decisions over a dataset (indexed by MaskTemplate).
struct TemplateCounts {
    std::array<std::int64_t, 4> count{};
    std::int64_t total() const { return count[0] + count[1] + count[2] + count[3]; }
    void add(MaskTemplate t) { ++count[static_cast<std::size_t>(t)]; }
};

// Algorithm 2 for one head. Throws when no prompt was counted.
inline MaskTemplate aggregate_head(const TemplateCounts& c, const BlindSightParams& P = {}) {
    constexpr const char* fn = "blindsight_aggregate";
    check_blindsight_params(P, fn);
    for (std::size_t t = 0; t < 4; ++t)
        detail::require(c.count[t] >= 0, fn, "count[", to_string(static_cast<MaskTemplate>(t)), "] = ", c.count[t],
                        ", expected >= 0");
    const std::int64_t total = c.total();
    detail::require(total > 0, fn, "no prompts counted for this head, expected at least one");
    auto frac = [&](MaskTemplate t) { return static_cast<double>(c.count[static_cast<std::size_t>(t)]) / static_cast<double>(total); };
    if (frac(MaskTemplate::dense) > P.gamma_c) return MaskTemplate::dense;
    if (frac(MaskTemplate::sink) > P.gamma_s) return MaskTemplate::sink;
    if (frac(MaskTemplate::document) > P.gamma_d) return MaskTemplate::document;
    return MaskTemplate::document_sink;
}

// Algorithm 2 over a whole model: counts[layer * heads + head] -> templates (same order).
inline std::vector<MaskTemplate> aggregate(std::span<const TemplateCounts> counts, const BlindSightParams& P = {}) {
    std::vector<MaskTemplate> r;
    r.reserve(counts.size());
    for (const auto& c : counts) r.push_back(aggregate_head(c, P));
    return r;
}

// The smallest template whose mask contains both (Document and Sink -> Document-Sink; anything with
// Dense -> Dense): used to force one template per KV group without dropping pairs a head needs.
inline MaskTemplate template_union(MaskTemplate a, MaskTemplate b) {
    if (a == b) return a;
    if (a == MaskTemplate::dense || b == MaskTemplate::dense) return MaskTemplate::dense;
    return MaskTemplate::document_sink;
}

// Option (docs/blindsight.md, "Per KV group"): one template per KV group, the union of its query heads'
// templates.
inline std::vector<MaskTemplate> uniform_per_kv_group(std::span<const MaskTemplate> heads, std::int64_t kv_heads) {
    constexpr const char* fn = "uniform_per_kv_group";
    const auto H = static_cast<std::int64_t>(heads.size());
    detail::require(kv_heads > 0 && H > 0 && H % kv_heads == 0, fn, "H = ", H, " heads and H_kv = ", kv_heads,
                    ", expected H_kv > 0 dividing H");
    const std::int64_t group = H / kv_heads;
    std::vector<MaskTemplate> r(heads.begin(), heads.end());
    for (std::int64_t g = 0; g < kv_heads; ++g) {
        MaskTemplate u = heads[static_cast<std::size_t>(g * group)];
        for (std::int64_t h = g * group; h < (g + 1) * group; ++h) u = template_union(u, heads[static_cast<std::size_t>(h)]);
        for (std::int64_t h = g * group; h < (g + 1) * group; ++h) r[static_cast<std::size_t>(h)] = u;
    }
    return r;
}

namespace detail {

// ||a - b||^2 / ||b||^2 over the rows of head h of two [n, H, d] fp32 buffers, in double.
inline double head_nmse(const std::vector<float>& a, const std::vector<float>& b, std::int64_t n, std::int64_t H,
                        std::int64_t d, std::int64_t h) {
    double num = 0.0, den = 0.0;
    for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t c = 0; c < d; ++c) {
            const auto idx = static_cast<std::size_t>((i * H + h) * d + c);
            const double x = a[idx], y = b[idx];
            num += (x - y) * (x - y);
            den += y * y;
        }
    if (den == 0.0) return num == 0.0 ? 0.0 : INFINITY;
    return num / den;
}

}  // namespace detail

// A model's head-to-template map (layer-major: map[layer * heads + head]) with the model shape and
// the parameters that produced it. JSON in <vlsparse/io/blindsight_json.hpp>.
struct HeadMap {
    std::int64_t layers = 0, heads = 0, kv_heads = 0, head_dim = 0;
    std::int64_t prompts = 0;  // prompts aggregated (0 = unknown)
    BlindSightParams params;
    std::vector<MaskTemplate> map;

    MaskTemplate at(std::int64_t layer, std::int64_t head) const {
        detail::require(layer >= 0 && layer < layers && head >= 0 && head < heads, "HeadMap::at", "(layer, head) = (",
                        layer, ", ", head, "), expected 0 <= layer < ", layers, " and 0 <= head < ", heads);
        return map[static_cast<std::size_t>(layer * heads + head)];
    }
    std::span<const MaskTemplate> layer(std::int64_t l) const {
        detail::require(l >= 0 && l < layers, "HeadMap::layer", "layer = ", l, ", expected 0 <= layer < ", layers);
        return std::span<const MaskTemplate>(map).subspan(static_cast<std::size_t>(l * heads), static_cast<std::size_t>(heads));
    }
};

}  // namespace vlsparse
