// vlsparse/io/purekv_json.hpp -- PureKV params to and from JSON (golden manifests, scenarios).
//
// Every field is one key of the same name; enums by their names (purekv_params.hpp); the ST options
// are flat keys: st_mask ("none", "spatial", "temporal", "spatial_temporal", "local_window",
// "atrous"; masks/templates.hpp), st_window, st_dilation. to_json writes every key. Reading is strict
// (io/json.hpp): keys not present keep their defaults, an unknown key, a wrong type or an unknown
// name throws vlsparse::error naming the key; the result is validated.
// Needs nlohmann/json. Include: <vlsparse/io/purekv_json.hpp> (or <vlsparse/io/params_json.hpp>: all)
#pragma once

#include <concepts>
#include <string>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "vlsparse/io/json.hpp"
#include "vlsparse/policies/purekv_params.hpp"

namespace vlsparse {

// The fields of PureKVParams, one JSON key each (io/json.hpp); the ST options are flat keys.
template <class Self, class F>
    requires std::same_as<std::remove_const_t<Self>, PureKVParams>
void json_fields(Self& P, F&& f) {
    f("l0", P.l0);
    f("window", P.window);
    f("budget", P.budget);
    f("top_h", P.top_h);
    f("budget_fraction", P.budget_fraction);
    f("grouping", P.grouping);
    f("lower_layers", P.lower_layers);
    f("st_mask", P.st.kind);
    f("st_window", P.st.window);
    f("st_dilation", P.st.dilation);
    f("st_start_layer", P.st_start_layer);
    f("q_block", P.q_block);
    f("k_block", P.k_block);
    f("scale", P.scale);
    f("check_finite", P.check_finite);
}

inline nlohmann::json to_json(const PureKVParams& P) { return fields_to_json(P); }

// `where`: the JSON path prefix of the object's keys in messages ("params.", "policies[0].params.").
inline PureKVParams purekv_params_from_json(const nlohmann::json& j, const std::string& where = "") {
    constexpr const char* fn = "purekv_params_from_json";
    const auto P = fields_from_json<PureKVParams>(j, JsonPath::from_prefix(where, fn));
    detail::check_purekv_params(P, fn);
    return P;
}

}  // namespace vlsparse
