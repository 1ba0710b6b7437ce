// vlsparse/policies/dense_policy.hpp -- DensePolicy: the Policy (policies/policy_interface.hpp) that
// keeps every token: dense prefill, every position cached, decode reads everything. The baseline
// every other policy is measured against.
// Include: <vlsparse/policies/dense_policy.hpp> (or <vlsparse/policies/policy.hpp>).
#pragma once

#include <concepts>
#include <string_view>

#include "vlsparse/policies/policy_interface.hpp"

namespace vlsparse {

// Keeps everything, no mask, dense prefill and decode.
struct DensePolicy : DecodeReadsAll {
    std::string_view name() const { return "dense"; }
    void begin(const Layout&, const ModelShape& shape) { shape.validate("DensePolicy::begin"); }
    template <std::same_as<PrefillLayer> In = PrefillLayer>
    PrefillDecision prefill(const In& in) {
        PrefillDecision d;
        d.kv.n = in.layout ? in.layout->n() : 0;
        d.kv.indices.push_back(detail::check_prefill_layer(in, "DensePolicy::prefill"));
        return d;
    }
};

static_assert(Policy<DensePolicy>);

}  // namespace vlsparse
