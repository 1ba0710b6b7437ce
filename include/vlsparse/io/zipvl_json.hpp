// vlsparse/io/zipvl_json.hpp -- ZipVLParams to and from JSON (golden manifests, scenarios, Python).
//
// Every field is one key of the same name; enums by their names (zipvl_params.hpp, attention/common.hpp):
//   {"tau": 0.975, "probe_mode": "counts", "probe_recent": 64, "probe_random": 64,
//    "probe_recent_ratio": 0.05, "probe_random_ratio": 0.05, "seed": 0, "grouping": "layer",
//    "nnz": "causal_column", "keep_last": 0, "keep_text": false, "dense_layers": 0,
//    "unselected": "zero", "scale": 0.0, "check_finite": true,
//    "prefill": "sparse", "ratio": "adaptive", "fixed_ratio": 0.5, "ranking": "normalized"}
// to_json writes every key; zipvl_params_from_json reads strictly (io/json.hpp): keys not present
// keep their defaults, an unknown key, a wrong type or an unknown name throws vlsparse::error naming
// the key, and the result is validated as zipvl_select would.
// Needs nlohmann/json. Include: <vlsparse/io/zipvl_json.hpp> (or <vlsparse/io/params_json.hpp>: all)
#pragma once

#include <concepts>
#include <string>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "vlsparse/io/json.hpp"
#include "vlsparse/policies/zipvl_params.hpp"

namespace vlsparse {

// The fields of ZipVLParams, one JSON key each (io/json.hpp).
template <class Self, class F>
    requires std::same_as<std::remove_const_t<Self>, ZipVLParams>
void json_fields(Self& P, F&& f) {
    f("tau", P.tau);
    f("probe_mode", P.probe_mode);
    f("probe_recent", P.probe_recent);
    f("probe_random", P.probe_random);
    f("probe_recent_ratio", P.probe_recent_ratio);
    f("probe_random_ratio", P.probe_random_ratio);
    f("seed", P.seed);
    f("grouping", P.grouping);
    f("nnz", P.nnz);
    f("keep_last", P.keep_last);
    f("keep_text", P.keep_text);
    f("dense_layers", P.dense_layers);
    f("unselected", P.unselected);
    f("scale", P.scale);
    f("check_finite", P.check_finite);
    f("prefill", P.prefill);
    f("ratio", P.ratio);
    f("fixed_ratio", P.fixed_ratio);
    f("ranking", P.ranking);
}

inline nlohmann::json to_json(const ZipVLParams& P) { return fields_to_json(P); }

// `where` is the JSON path of the object, as a prefix of its keys in messages (e.g. "params." or
// "policies[0].params."; "" for the top level).
inline ZipVLParams zipvl_params_from_json(const nlohmann::json& j, const std::string& where = "") {
    constexpr const char* fn = "zipvl_params_from_json";
    const auto P = fields_from_json<ZipVLParams>(j, JsonPath::from_prefix(where, fn));
    detail::check_zipvl_params(P, fn);
    detail::check_zipvl_modes(P, fn);
    return P;
}

}  // namespace vlsparse
