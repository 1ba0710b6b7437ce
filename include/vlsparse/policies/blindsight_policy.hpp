// vlsparse/policies/blindsight_policy.hpp -- BlindSight as a Policy (policies/policy_interface.hpp):
// per-head mask templates (BlindSight, Sec. 4; docs/blindsight.md) turned into each layer's prefill
// block mask; nothing is evicted.
// Include: <vlsparse/policies/blindsight_policy.hpp> (or <vlsparse/policies/policy.hpp>).
#pragma once

#include <concepts>
#include <cstdint>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "vlsparse/masks/block_mask.hpp"
#include "vlsparse/masks/templates.hpp"
#include "vlsparse/policies/blindsight.hpp"
#include "vlsparse/policies/policy_interface.hpp"

namespace vlsparse {

// BlindSight: per-layer per-head templates from a HeadMap (or one template for every head of every
// layer) -> the layer's prefill attention mask, make_block_mask(make_mask_context(layout, params.mask),
// templates, q_block, k_block). Nothing is evicted. When earlier layers dropped rows, the mask is built
// on the compacted layout of the remaining rows (sinks recomputed from the shortened images).
struct BlindSightPolicy : DecodeReadsAll {
    std::optional<HeadMap> map;                 // per (layer, head) templates; nullopt: `uniform` everywhere
    MaskTemplate uniform = MaskTemplate::dense;
    BlindSightParams params;
    std::int64_t q_block = 128, k_block = 128;
    bool uniform_per_kv_group = false;          // force one template per KV group (the union of its heads')

    BlindSightPolicy() = default;
    explicit BlindSightPolicy(HeadMap m, const BlindSightParams& p = {}) : map(std::move(m)), params(p) {}
    explicit BlindSightPolicy(MaskTemplate t, const BlindSightParams& p = {}) : uniform(t), params(p) {}

    std::string_view name() const { return "blindsight"; }
    void begin(const Layout&, const ModelShape& shape) {
        constexpr const char* fn = "BlindSightPolicy::begin";
        shape.validate(fn);
        check_blindsight_params(params, fn);
        detail::require(q_block >= 1 && k_block >= 1, fn, "block sizes ", q_block, " x ", k_block, ", expected >= 1");
        if (map) {
            detail::require(map->layers == shape.layers && map->heads == shape.heads, fn, "head map is for ", map->layers,
                            " layers x ", map->heads, " heads, the model has ", shape.layers, " x ", shape.heads);
            detail::require(static_cast<std::int64_t>(map->map.size()) == map->layers * map->heads, fn, "head map holds ",
                            map->map.size(), " templates, expected ", map->layers * map->heads);
        }
    }
    // The templates of layer `layer` (one per query head).
    std::vector<MaskTemplate> templates(std::int64_t layer, const ModelShape& shape) const {
        std::vector<MaskTemplate> t;
        if (map) {
            const auto l = map->layer(layer);
            t.assign(l.begin(), l.end());
        } else {
            t.assign(static_cast<std::size_t>(shape.heads), uniform);
        }
        if (uniform_per_kv_group) t = ::vlsparse::uniform_per_kv_group(t, shape.kv_heads);
        return t;
    }
    template <std::same_as<PrefillLayer> In = PrefillLayer>
    PrefillDecision prefill(const In& in) {
        const auto pos = detail::check_prefill_layer(in, "BlindSightPolicy::prefill");
        const bool identity = detail::is_identity(pos) && static_cast<std::int64_t>(pos.size()) == in.layout->n();
        const Layout rows_layout = identity ? *in.layout : compact_layout(*in.layout, pos);
        const auto t = templates(in.layer, in.shape);
        PrefillDecision d;
        d.kv.n = in.layout->n();
        d.kv.indices.push_back(pos);
        d.mask = make_block_mask(make_mask_context(rows_layout, params.mask), t, q_block, k_block);
        return d;
    }
};

static_assert(Policy<BlindSightPolicy>);

}  // namespace vlsparse
