// vlsparse/policies/blindsight_params.hpp -- BlindSight's parameters and their check, Algorithm 1's
// per-head result and tallies, and the head-to-template map (no Eigen, no xsimd). Algorithms 1 and 2
// on given NMSEs (choose_template, aggregate, uniform_per_kv_group): policies/blindsight_select.hpp.
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
// Include: <vlsparse/policies/blindsight.hpp> (or policies/blindsight_select.hpp, without the attention code).
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

// Algorithm 1's result for one head: the chosen template and the NMSE of each template
// (indexed by MaskTemplate; the Dense entry is 0).
struct HeadCharacterization {
    MaskTemplate chosen = MaskTemplate::dense;
    std::array<double, 4> nmse{};
};

// Per-head tallies of Algorithm 1's decisions over a dataset (indexed by MaskTemplate).
struct TemplateCounts {
    std::array<std::int64_t, 4> count{};
    std::int64_t total() const { return count[0] + count[1] + count[2] + count[3]; }
    void add(MaskTemplate t) { ++count[static_cast<std::size_t>(t)]; }
};

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
