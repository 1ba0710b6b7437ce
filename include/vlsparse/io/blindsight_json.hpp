// vlsparse/io/blindsight_json.hpp -- BlindSight params and head-to-template maps to and from JSON.
//
// A head map file: {"format": "vlsparse.blindsight.head_map", "version": 1,
//   "model": {"layers", "heads", "kv_heads", "head_dim"}, "prompts": N, "params": {...},
//   "map": [["Sink", "Dense", ...], ...]}   (one array of template names per layer).
// BlindSightParams as JSON: one key per field, the mask options flat: {"alpha": 0.1, "gamma_c": 0.25,
//   "gamma_s": 0.6, "gamma_d": 0.6, "sink_fraction": 0.1, "sink_offsets": [], "bidirectional_images":
//   false, "scale": 0.0, "check_finite": true}; to_json writes every key.
// Reading is strict (io/json.hpp): unknown keys, wrong types, unknown template names, a map whose size
// does not match the model shape, or (load with an expected shape) a map for another model throw
// vlsparse::error.
// Needs nlohmann/json. Include: <vlsparse/io/blindsight_json.hpp>
#pragma once

#include <concepts>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "vlsparse/core/model_shape.hpp"
#include "vlsparse/io/json.hpp"
#include "vlsparse/policies/blindsight_params.hpp"

namespace vlsparse {

// The fields of BlindSightParams, one JSON key each (io/json.hpp); the mask options are flat keys.
template <class Self, class F>
    requires std::same_as<std::remove_const_t<Self>, BlindSightParams>
void json_fields(Self& P, F&& f) {
    f("alpha", P.alpha);
    f("gamma_c", P.gamma_c);
    f("gamma_s", P.gamma_s);
    f("gamma_d", P.gamma_d);
    f("sink_fraction", P.mask.sink_fraction);
    f("sink_offsets", P.mask.sink_offsets);
    f("bidirectional_images", P.mask.bidirectional_images);
    f("scale", P.scale);
    f("check_finite", P.check_finite);
}

inline nlohmann::json to_json(const BlindSightParams& P) { return fields_to_json(P); }

// `where`: the JSON path prefix of the object's keys in messages ("params.", "policies[0].params.").
inline BlindSightParams blindsight_params_from_json(const nlohmann::json& j, const std::string& where = "") {
    constexpr const char* fn = "blindsight_params_from_json";
    const auto P = fields_from_json<BlindSightParams>(j, JsonPath::from_prefix(where, fn));
    check_blindsight_params(P, fn);
    return P;
}

inline nlohmann::json to_json(const HeadMap& m) {
    nlohmann::json layers = nlohmann::json::array();
    for (std::int64_t l = 0; l < m.layers; ++l) {
        nlohmann::json row = nlohmann::json::array();
        for (auto t : m.layer(l)) row.push_back(std::string(to_string(t)));
        layers.push_back(row);
    }
    return nlohmann::json{{"format", "vlsparse.blindsight.head_map"},
                          {"version", 1},
                          {"model", {{"layers", m.layers}, {"heads", m.heads}, {"kv_heads", m.kv_heads}, {"head_dim", m.head_dim}}},
                          {"prompts", m.prompts},
                          {"params", to_json(m.params)},
                          {"map", layers}};
}

inline HeadMap head_map_from_json(const nlohmann::json& j) {
    constexpr const char* fn = "head_map_from_json";
    detail::require(j.is_object(), fn, "expected a JSON object");
    for (const auto& [key, val] : j.items())
        detail::require(key == "format" || key == "version" || key == "model" || key == "prompts" || key == "params" ||
                            key == "map",
                        fn, "unknown key '", key, "'");
    detail::require(j.contains("format") && j["format"] == "vlsparse.blindsight.head_map", fn,
                    "format is missing or not \"vlsparse.blindsight.head_map\"");
    detail::require(j.contains("version") && j["version"] == 1, fn, "version is missing or not 1");
    detail::require(j.contains("model") && j["model"].is_object(), fn, "model: expected an object");
    HeadMap m;
    const auto& mo = j["model"];
    check_object_keys(mo, JsonPath{"", "model", fn}, {"layers", "heads", "kv_heads", "head_dim"});
    for (const char* key : {"layers", "heads", "kv_heads", "head_dim"})
        detail::require(mo.contains(key) && mo[key].is_number_integer() && mo[key].get<std::int64_t>() > 0, fn, "model.",
                        key, ": expected an integer > 0");
    m.layers = mo["layers"].get<std::int64_t>();
    m.heads = mo["heads"].get<std::int64_t>();
    m.kv_heads = mo["kv_heads"].get<std::int64_t>();
    m.head_dim = mo["head_dim"].get<std::int64_t>();
    detail::require(m.heads % m.kv_heads == 0, fn, "model: heads = ", m.heads, " is not a multiple of kv_heads = ", m.kv_heads);
    if (j.contains("prompts")) {
        detail::require(j["prompts"].is_number_integer() && j["prompts"].get<std::int64_t>() >= 0, fn,
                        "prompts: expected an integer >= 0");
        m.prompts = j["prompts"].get<std::int64_t>();
    }
    if (j.contains("params")) m.params = blindsight_params_from_json(j["params"], "params.");
    detail::require(j.contains("map") && j["map"].is_array(), fn, "map: expected an array of layers");
    const auto& layers = j["map"];
    detail::require(static_cast<std::int64_t>(layers.size()) == m.layers, fn, "map has ", layers.size(),
                    " layers, the model has ", m.layers);
    for (std::size_t l = 0; l < layers.size(); ++l) {
        detail::require(layers[l].is_array() && static_cast<std::int64_t>(layers[l].size()) == m.heads, fn, "map[", l,
                        "]: expected an array of ", m.heads, " template names");
        for (std::size_t h = 0; h < layers[l].size(); ++h) {
            detail::require(layers[l][h].is_string(), fn, "map[", l, "][", h, "]: expected a template name");
            const auto name = layers[l][h].get<std::string>();
            try {
                m.map.push_back(mask_template_from_string(name, fn));
            } catch (const error&) {
                throw error(fn, detail::concat("map[", l, "][", h, "] = '", name,
                                               "': unknown mask template, expected Dense, Sink, Document or Document-Sink"));
            }
        }
    }
    return m;
}

// Loads a head map and checks it was made for `expected` (layers, heads, KV heads, head_dim).
inline HeadMap head_map_from_json(const nlohmann::json& j, const ModelShape& expected) {
    HeadMap m = head_map_from_json(j);
    const ModelShape got{m.layers, m.heads, m.kv_heads, m.head_dim};
    detail::require(got == expected, "head_map_from_json", "map is for a model with ", got.layers, " layers, ",
                    got.heads, " heads, ", got.kv_heads, " KV heads, head_dim ", got.head_dim, "; expected ",
                    expected.layers, " layers, ", expected.heads, " heads, ", expected.kv_heads, " KV heads, head_dim ",
                    expected.head_dim);
    return m;
}

inline void save_head_map(const HeadMap& m, const std::filesystem::path& path) {
    std::ofstream f(path);
    detail::require(static_cast<bool>(f), "save_head_map", "cannot open '", path.string(), "' for writing");
    f << to_json(m).dump(2) << "\n";
    detail::require(static_cast<bool>(f), "save_head_map", "writing '", path.string(), "' failed");
}

inline HeadMap load_head_map(const std::filesystem::path& path, const ModelShape& expected) {
    std::ifstream f(path);
    detail::require(static_cast<bool>(f), "load_head_map", "cannot open '", path.string(), "'");
    nlohmann::json j;
    try {
        f >> j;
    } catch (const std::exception& e) {
        throw error("load_head_map", detail::concat("'", path.string(), "' is not valid JSON: ", e.what()));
    }
    return head_map_from_json(j, expected);
}

}  // namespace vlsparse
