// vlsparse/sim/policies.hpp -- the simulator's policy registry: a scenario's {name, params} -> AnyPolicy.
//
// Every policy the simulator can run is one row of policy_registry(): its name, a one-line summary,
// the JSON of its default Params (to_json(Params{}): the same form as the golden manifests), a factory
// that reads the params with the library's reader (<vlsparse/io/params_json.hpp>: unknown keys, wrong
// types and out-of-range values are reported with their JSON path) and returns the library's adapter (<vlsparse/policies/policy.hpp>) behind AnyPolicy, and the
// default sweep `compare` runs (a parameter and its values: thresholds, budgets or templates).
// The engine never looks at a policy's name: it only drives AnyPolicy.
// Include: <vlsparse/sim/policies.hpp>
#pragma once

#include <filesystem>
#include <system_error>
#include <functional>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "vlsparse/core/model_shape.hpp"
#include "vlsparse/io/json.hpp"
#include "vlsparse/io/params_json.hpp"
#include "vlsparse/policies/policy.hpp"
#include "vlsparse/policies/purekv_policy.hpp"

namespace vlsparse::sim {

using json = nlohmann::json;

// Where a value of a scenario sits (<vlsparse/io/json.hpp>): errors read
// "scenario: <file>: <JSON path>: <what>".
struct JsonWhere : ::vlsparse::JsonPath {
    JsonWhere(std::string file = {}, std::string path = {})
        : ::vlsparse::JsonPath{std::move(file), std::move(path), "scenario"} {}
    JsonWhere(const ::vlsparse::JsonPath& w) : ::vlsparse::JsonPath(w) {}
};
// The strict readers the scenario parser uses, from <vlsparse/io/json.hpp>.
using ::vlsparse::check_object_keys;
using ::vlsparse::check_params_like;
using ::vlsparse::find_key;
using ::vlsparse::json_repr;
using ::vlsparse::json_type_name;
using ::vlsparse::read_int;
using ::vlsparse::read_string;
using ::vlsparse::with_json_path;

// What a factory may need besides the params: the model shape, and the folder relative paths in the
// params (a BlindSight head map) are resolved against (the scenario file's folder).
struct PolicyContext {
    ModelShape shape;
    std::filesystem::path base_dir;
};

struct PolicyInfo {
    std::string name;
    std::string summary;
    json defaults;                         // every key with its default value
    std::vector<std::string> extra_keys;   // keys read by the factory beyond the Params (e.g. a head map)
    std::function<AnyPolicy(const json& params, const JsonWhere& where, const PolicyContext& ctx)> make;
    // compare's default sweep: each value is a number / string for `sweep_param`, or an object of keys.
    std::string sweep_param;
    std::vector<json> sweep_values;
};

namespace detail {

// params minus the keys in `drop`.
inline json without_keys(const json& j, std::initializer_list<std::string_view> drop) {
    json r = json::object();
    for (auto it = j.begin(); it != j.end(); ++it) {
        bool d = false;
        for (auto k : drop) d |= it.key() == k;
        if (!d) r[it.key()] = it.value();
    }
    return r;
}

inline std::vector<json> numbers(std::initializer_list<double> v) {
    std::vector<json> r;
    for (double x : v) r.emplace_back(x);
    return r;
}

}  // namespace detail

// The registry, in the order `--help` lists it.
inline const std::vector<PolicyInfo>& policy_registry() {
    static const std::vector<PolicyInfo> reg = [] {
        std::vector<PolicyInfo> r;
        r.push_back({"dense", "no sparsity: dense prefill, everything cached and read (the reference)", json::object(),
                     {},
                     [](const json& p, const JsonWhere& w, const PolicyContext&) -> AnyPolicy {
                         check_params_like(p, json::object(), w);
                         return DensePolicy{};
                     },
                     "",
                     {}});
        r.push_back({"zipvl",
                     "ZipVL: adaptive ratio from tau on probe attention, token-sparse prefill, KV eviction "
                     "(ablations: prefill=dense eviction-only, ratio=fixed with fixed_ratio, ranking=accumulated)",
                     to_json(ZipVLParams{}),
                     {},
                     [](const json& p, const JsonWhere& w, const PolicyContext&) -> AnyPolicy {
                         const ZipVLParams P = with_json_path(p, w, [&] { return zipvl_params_from_json(p, w.path + "."); });
                         return ZipVLPolicy(P);
                     },
                     "tau",
                     detail::numbers({0.6, 0.7, 0.8, 0.9, 0.95, 0.975})});
        r.push_back({"avl",
                     "A-VL: per-image kept/core budgets, core-only decode steps refreshed every K steps",
                     to_json(AvlParams{}),
                     {},
                     [](const json& p, const JsonWhere& w, const PolicyContext&) -> AnyPolicy {
                         const AvlParams P = with_json_path(p, w, [&] { return avl_params_from_json(p, w.path + "."); });
                         return AvlPolicy(P);
                     },
                     "",
                     {json{{"rate", 0.97}, {"compute_rate", 0.985}}, json{{"rate", 0.9}, {"compute_rate", 0.95}},
                      json{{"rate", 0.8}, {"compute_rate", 0.9}}, json{{"rate", 0.7}, {"compute_rate", 0.85}},
                      json{{"rate", 0.6}, {"compute_rate", 0.8}}, json{{"rate", 0.5}, {"compute_rate", 0.7}}}});
        {
            json d = to_json(BlindSightParams{});
            r.push_back({"blindsight",
                         "BlindSight: per-head mask templates (one template for all heads, or a head map from "
                         "`characterize`)",
                         d,
                         {"template", "head_map", "uniform_per_kv_group", "q_block", "k_block"},
                         [](const json& p, const JsonWhere& w, const PolicyContext& ctx) -> AnyPolicy {
                             if (!p.is_object()) w.fail("expected an object, got " + json_repr(p));
                             const json base =
                                 detail::without_keys(p, {"template", "head_map", "uniform_per_kv_group", "q_block", "k_block"});
                             const BlindSightParams P =
                                 with_json_path(p, w, [&] { return blindsight_params_from_json(base, w.path + "."); });
                             BlindSightPolicy pol;
                             pol.params = P;
                             pol.uniform = MaskTemplate::document_sink;
                             if (p.contains("template") && p.contains("head_map"))
                                 w.fail("give either 'template' or 'head_map', not both");
                             if (p.contains("template")) {
                                 const std::string t = read_string(p, "template", w);
                                 try {
                                     pol.uniform = mask_template_from_string(t);
                                 } catch (const ::vlsparse::error&) {
                                     w.key("template").fail("unknown template " + json_repr(p["template"]) +
                                                            ", expected Dense, Sink, Document or Document-Sink");
                                 }
                             }
                             if (p.contains("head_map")) {
                                 std::filesystem::path f = read_string(p, "head_map", w);
                                 std::error_code ec;  // (a path the OS refuses, e.g. too long: not there)
                                 if (f.is_relative() && !ctx.base_dir.empty() && std::filesystem::exists(ctx.base_dir / f, ec))
                                     f = ctx.base_dir / f;
                                 try {
                                     pol.map = load_head_map(f, ctx.shape);
                                 } catch (const ::vlsparse::error& e) {
                                     w.key("head_map").fail(e.what());
                                 }
                             }
                             if (const json* u = find_key(p, "uniform_per_kv_group")) {
                                 if (!u->is_boolean())
                                     w.key("uniform_per_kv_group").fail("expected true or false, got " + json_repr(*u));
                                 pol.uniform_per_kv_group = u->get<bool>();
                             }
                             pol.q_block = read_int(p, "q_block", w, 1, 1 << 20, 128);
                             pol.k_block = read_int(p, "k_block", w, 1, 1 << 20, 128);
                             return pol;
                         },
                         "template",
                         {json("Sink"), json("Document"), json("Document-Sink")}});
        }
        r.push_back({"h2o", "H2O: heavy hitters by accumulated attention + the recent window (evicts during decode)",
                     to_json(H2OParams{}),
                     {},
                     [](const json& p, const JsonWhere& w, const PolicyContext&) -> AnyPolicy {
                         return H2OPolicy(with_json_path(p, w, [&] { return h2o_params_from_json(p, w.path + "."); }));
                     },
                     "",
                     {json{{"heavy", 0.05}, {"recent", 0.05}}, json{{"heavy", 0.1}, {"recent", 0.1}},
                      json{{"heavy", 0.15}, {"recent", 0.15}}, json{{"heavy", 0.2}, {"recent", 0.2}},
                      json{{"heavy", 0.25}, {"recent", 0.25}}, json{{"heavy", 0.35}, {"recent", 0.35}}}});
        r.push_back({"snapkv", "SnapKV: observation window + pooled window attention, a fixed capacity per KV head",
                     to_json(SnapKVParams{}),
                     {},
                     [](const json& p, const JsonWhere& w, const PolicyContext&) -> AnyPolicy {
                         return SnapKVPolicy(with_json_path(p, w, [&] { return snapkv_params_from_json(p, w.path + "."); }));
                     },
                     "capacity",
                     detail::numbers({0.1, 0.2, 0.3, 0.4, 0.5, 0.7})});
        r.push_back({"streamingllm", "StreamingLLM: the first sinks + the most recent tokens (a rolling window in decode)",
                     to_json(StreamingLLMParams{}),
                     {},
                     [](const json& p, const JsonWhere& w, const PolicyContext&) -> AnyPolicy {
                         return StreamingLLMPolicy(with_json_path(p, w, [&] { return streamingllm_params_from_json(p, w.path + "."); }));
                     },
                     "recent",
                     detail::numbers({0.05, 0.1, 0.2, 0.3, 0.5, 0.7})});
        r.push_back({"fastv", "FastV: after layer K-1, only the top (1 - R) of the image tokens stay in the sequence",
                     to_json(FastVParams{}),
                     {},
                     [](const json& p, const JsonWhere& w, const PolicyContext&) -> AnyPolicy {
                         return FastVPolicy(with_json_path(p, w, [&] { return fastv_params_from_json(p, w.path + "."); }));
                     },
                     "rate",
                     detail::numbers({0.25, 0.5, 0.7, 0.8, 0.9, 0.97})});
        r.push_back({"random", "random: a seeded random share of the image tokens in every layer (a floor to beat)",
                     to_json(RandomParams{}),
                     {},
                     [](const json& p, const JsonWhere& w, const PolicyContext&) -> AnyPolicy {
                         return RandomPolicy(with_json_path(p, w, [&] { return random_params_from_json(p, w.path + "."); }));
                     },
                     "keep",
                     detail::numbers({0.04, 0.1, 0.2, 0.3, 0.5, 0.7})});
        r.push_back({"fixed_ratio", "fixed ratio: an evenly spread (or first / last) share of the image tokens",
                     to_json(FixedRatioParams{}),
                     {},
                     [](const json& p, const JsonWhere& w, const PolicyContext&) -> AnyPolicy {
                         return FixedRatioPolicy(with_json_path(p, w, [&] { return fixed_ratio_params_from_json(p, w.path + "."); }));
                     },
                     "keep",
                     detail::numbers({0.04, 0.1, 0.2, 0.3, 0.5, 0.7})});
        r.push_back({"purekv",
                     "PureKV: cross-layer importance (layer l0's window scores x ||V||), eviction to a budget, "
                     "ST-SpAttn masks on video (ablation: own_layer_scores=true, every layer scores itself)",
                     to_json(PureKVParams{}),
                     {"own_layer_scores"},
                     [](const json& p, const JsonWhere& w, const PolicyContext&) -> AnyPolicy {
                         if (!p.is_object()) w.fail("expected an object, got " + json_repr(p));
                         bool own = false;
                         if (const json* o = find_key(p, "own_layer_scores")) {
                             if (!o->is_boolean())
                                 w.key("own_layer_scores").fail("expected true or false, got " + json_repr(*o));
                             own = o->get<bool>();
                         }
                         const json base = detail::without_keys(p, {"own_layer_scores"});
                         const PureKVParams P =
                             with_json_path(p, w, [&] { return purekv_params_from_json(base, w.path + "."); });
                         return PureKVPolicy(P, own);
                     },
                     "",
                     {json{{"budget", "fraction"}, {"budget_fraction", 0.1}}, json{{"budget", "fraction"}, {"budget_fraction", 0.2}},
                      json{{"budget", "fraction"}, {"budget_fraction", 0.3}}, json{{"budget", "fraction"}, {"budget_fraction", 0.4}},
                      json{{"budget", "fraction"}, {"budget_fraction", 0.5}}, json{{"budget", "fraction"}, {"budget_fraction", 0.7}}}});
        return r;
    }();
    return reg;
}

inline const PolicyInfo& policy_info(std::string_view name, const JsonWhere& where) {
    for (const auto& p : policy_registry())
        if (p.name == name) return p;
    std::string list;
    for (const auto& p : policy_registry()) list += (list.empty() ? "" : ", ") + p.name;
    where.fail("unknown policy '" + std::string(name) + "' (known: " + list + ")");
}

// The params with every default filled in (what the report prints as the policy's parameters).
inline json effective_params(const PolicyInfo& info, const json& params) {
    json r = info.defaults;
    for (auto it = params.begin(); it != params.end(); ++it) r[it.key()] = it.value();
    return r;
}

// params with one sweep value applied: a scalar sets `param`, an object sets each of its keys.
inline json apply_sweep_value(const json& params, const std::string& param, const json& value) {
    json r = params.is_object() ? params : json::object();
    if (value.is_object()) {
        for (auto it = value.begin(); it != value.end(); ++it) r[it.key()] = it.value();
    } else {
        r[param] = value;
    }
    return r;
}

// A short text for a sweep value: "tau=0.95", "rate=0.5,compute_rate=0.7", "template=Sink".
inline std::string sweep_value_label(const std::string& param, const json& value) {
    auto scalar = [](const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); };
    if (!value.is_object()) return param + "=" + scalar(value);
    std::string s;
    for (auto it = value.begin(); it != value.end(); ++it) s += (s.empty() ? "" : ",") + it.key() + "=" + scalar(it.value());
    return s;
}

}  // namespace vlsparse::sim
