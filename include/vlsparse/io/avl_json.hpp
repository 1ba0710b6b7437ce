// vlsparse/io/avl_json.hpp -- AvlParams to and from JSON (golden manifests, scenarios, Python).
//
// Every field is one key of the same name; enums by their names (avl_params.hpp):
//   {"rate": 0.5, "compute_rate": 0.7, "refresh_every": 3, "spans": "per_image",
//    "async_refresh": false, "prefill_filter": 0.0, "filter_layer": 3, "text_rate": 0.0,
//    "text_min_budget": 20, "text_heavy_fraction": 0.7, "text_groups": "per_kv_head"}
// to_json writes every key; avl_params_from_json reads strictly (io/json.hpp): keys not present keep
// their defaults, an unknown key, a wrong type or an unknown name throws vlsparse::error naming the
// key, and the result is validated (AvlParams::validate).
// Needs nlohmann/json. Include: <vlsparse/io/avl_json.hpp> (or <vlsparse/io/params_json.hpp>: all)
#pragma once

#include <concepts>
#include <string>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "vlsparse/io/json.hpp"
#include "vlsparse/policies/avl_params.hpp"

namespace vlsparse {

// The fields of AvlParams, one JSON key each (io/json.hpp).
template <class Self, class F>
    requires std::same_as<std::remove_const_t<Self>, AvlParams>
void json_fields(Self& P, F&& f) {
    f("rate", P.rate);
    f("compute_rate", P.compute_rate);
    f("refresh_every", P.refresh_every);
    f("spans", P.spans);
    f("async_refresh", P.async_refresh);
    f("prefill_filter", P.prefill_filter);
    f("filter_layer", P.filter_layer);
    f("text_rate", P.text_rate);
    f("text_min_budget", P.text_min_budget);
    f("text_heavy_fraction", P.text_heavy_fraction);
    f("text_groups", P.text_groups);
}

inline nlohmann::json to_json(const AvlParams& P) { return fields_to_json(P); }

// `where`: the JSON path prefix of the object's keys in messages ("params.", "policies[0].params.").
inline AvlParams avl_params_from_json(const nlohmann::json& j, const std::string& where = "") {
    constexpr const char* fn = "avl_params_from_json";
    const auto P = fields_from_json<AvlParams>(j, JsonPath::from_prefix(where, fn));
    P.validate(fn);
    return P;
}

}  // namespace vlsparse
