// vlsparse/policies/zipvl_policy.hpp -- ZipVL as a Policy (policies/policy_interface.hpp): adaptive
// ratio + normalized importance (ZipVL, arXiv:2410.08584, Sec. 4.1-4.2; docs/zipvl.md) selecting each
// layer's kept set, token-sparse prefill over it, and the cache keeping it.
// prefill() is a member template taking a PrefillLayer only: the SIMD code it calls is then compiled
// where a program uses the adapter, not in every translation unit that includes this header
// (docs/performance.md "Compile time").
// Include: <vlsparse/policies/zipvl_policy.hpp> (or <vlsparse/policies/policy.hpp>).
#pragma once

#include <concepts>
#include <string_view>

#include "vlsparse/policies/policy_interface.hpp"
#include "vlsparse/policies/zipvl.hpp"

namespace vlsparse {

// ZipVL: simd::zipvl_select on the layer's rows; the layer's prefill is token-sparse over the kept
// set (sparse_prefill = true, rows outside per params.unselected) and the cache keeps it. Dense
// layers (layer < params.dense_layers) keep everything with a dense prefill. When earlier layers
// dropped rows, ZipVL runs on the remaining rows with their compacted layout (compact_layout).
struct ZipVLPolicy : DecodeReadsAll {
    ZipVLParams params;
    ZipVLPolicy() = default;
    explicit ZipVLPolicy(const ZipVLParams& p) : params(p) {}

    std::string_view name() const { return "zipvl"; }
    void begin(const Layout&, const ModelShape& shape) {
        shape.validate("ZipVLPolicy::begin");
        detail::check_zipvl_params(params, "ZipVLPolicy::begin");
        detail::check_zipvl_modes(params, "ZipVLPolicy::begin");
    }
    template <std::same_as<PrefillLayer> In = PrefillLayer>
    PrefillDecision prefill(const In& in) {
        const auto pos = detail::check_prefill_layer(in, "ZipVLPolicy::prefill");
        const bool identity = detail::is_identity(pos) && static_cast<std::int64_t>(pos.size()) == in.layout->n();
        const Layout rows_layout = identity ? *in.layout : compact_layout(*in.layout, pos);
        const ZipVLSelection s = in.scoring ? in.scoring->zipvl_select(in, rows_layout, params)
                                             : simd::zipvl_select(in.q, in.k, rows_layout, in.layer, params);
        PrefillDecision d;
        d.kv = rows_to_positions(s.selection, pos, in.layout->n());
        d.sparse_prefill = zipvl_sparse_prefill(s, params);  // false: dense or eviction-only (prefill = dense)
        d.unselected = params.unselected;
        return d;
    }
};

static_assert(Policy<ZipVLPolicy>);

}  // namespace vlsparse
