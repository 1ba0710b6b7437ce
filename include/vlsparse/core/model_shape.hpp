// vlsparse/core/model_shape.hpp -- the attention shape of a model: layers, query heads, KV heads,
// head dimension. Policies, the simulator and the head-map files describe a model with it.
// Include: <vlsparse/vlsparse.hpp>
#pragma once

#include <cstdint>

#include "vlsparse/core/error.hpp"

namespace vlsparse {

struct ModelShape {
    std::int64_t layers = 0;    // decoder layers
    std::int64_t heads = 0;     // query heads H
    std::int64_t kv_heads = 0;  // KV heads H_kv (H % H_kv == 0; GQA group size H / H_kv)
    std::int64_t head_dim = 0;  // d

    std::int64_t group_size() const { return kv_heads > 0 ? heads / kv_heads : 0; }

    // Throws unless every field is positive and H is a multiple of H_kv.
    void validate(const char* fn) const {
        detail::require(layers > 0, fn, "layers = ", layers, ", expected > 0");
        detail::require(heads > 0, fn, "heads = ", heads, ", expected > 0");
        detail::require(kv_heads > 0, fn, "kv_heads = ", kv_heads, ", expected > 0");
        detail::require(heads % kv_heads == 0, fn, "heads = ", heads, " is not a multiple of kv_heads = ", kv_heads,
                        ", expected H % H_kv == 0");
        detail::require(head_dim > 0, fn, "head_dim = ", head_dim, ", expected > 0");
    }

    friend bool operator==(const ModelShape&, const ModelShape&) = default;
};

}  // namespace vlsparse
