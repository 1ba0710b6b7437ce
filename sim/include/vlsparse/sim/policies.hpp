// vlsparse/sim/policies.hpp -- the simulator's policy registry: a scenario's {name, params} -> AnyPolicy.
//
// Every policy the simulator can run is one row of policy_registry(): its name, a one-line summary,
// the JSON of its default Params (which names the known keys and their types), a factory that reads
// the params strictly (unknown keys, wrong types and out-of-range values are reported with their JSON
// path) and returns the library's adapter (<vlsparse/policies/policy.hpp>) behind AnyPolicy, and the
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
#include "vlsparse/io/blindsight_json.hpp"
#include "vlsparse/io/params_json.hpp"
#include "vlsparse/io/purekv_json.hpp"
#include "vlsparse/policies/policy.hpp"
#include "vlsparse/policies/purekv_policy.hpp"
#include "vlsparse/sim/json_util.hpp"

namespace vlsparse::sim {

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

inline constexpr std::pair<AvlSpans, const char*> kAvlSpanNames[] = {{AvlSpans::per_image, "per_image"},
                                                                    {AvlSpans::single_span, "single_span"}};
inline constexpr std::pair<AvlTextGroups, const char*> kAvlTextGroupNames[] = {
    {AvlTextGroups::per_kv_head, "per_kv_head"}, {AvlTextGroups::per_query_head, "per_query_head"}};

inline json avl_params_json(const AvlParams& P) {
    return json{{"rate", P.rate},
                {"compute_rate", P.compute_rate},
                {"refresh_every", P.refresh_every},
                {"spans", std::string(to_string(P.spans))},
                {"async_refresh", P.async_refresh},
                {"prefill_filter", P.prefill_filter},
                {"filter_layer", P.filter_layer},
                {"text_rate", P.text_rate},
                {"text_min_budget", P.text_min_budget},
                {"text_heavy_fraction", P.text_heavy_fraction},
                {"text_groups", std::string(to_string(P.text_groups))}};
}

inline AvlParams avl_params_from_json(const json& j, const std::string& where) {
    ::vlsparse::detail::check_keys(j, {"rate", "compute_rate", "refresh_every", "spans", "async_refresh", "prefill_filter",
                                       "filter_layer", "text_rate", "text_min_budget", "text_heavy_fraction",
                                       "text_groups"},
                                   where);
    AvlParams P;
    ::vlsparse::detail::read_number(j, "rate", P.rate, where);
    ::vlsparse::detail::read_number(j, "compute_rate", P.compute_rate, where);
    ::vlsparse::detail::read_number(j, "refresh_every", P.refresh_every, where);
    ::vlsparse::detail::read_number(j, "async_refresh", P.async_refresh, where);
    ::vlsparse::detail::read_number(j, "prefill_filter", P.prefill_filter, where);
    ::vlsparse::detail::read_number(j, "filter_layer", P.filter_layer, where);
    ::vlsparse::detail::read_number(j, "text_rate", P.text_rate, where);
    ::vlsparse::detail::read_number(j, "text_min_budget", P.text_min_budget, where);
    ::vlsparse::detail::read_number(j, "text_heavy_fraction", P.text_heavy_fraction, where);
    if (j.contains("spans")) P.spans = ::vlsparse::detail::enum_from_json(j["spans"], "spans", kAvlSpanNames, where);
    if (j.contains("text_groups"))
        P.text_groups = ::vlsparse::detail::enum_from_json(j["text_groups"], "text_groups", kAvlTextGroupNames, where);
    P.validate("avl_params_from_json");
    return P;
}

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

// ---- the baselines' params as JSON (a budget is a token count, a fraction, or {"tokens"|"fraction": x})

inline json budget_json(const TokenBudget& b) {
    return b.kind == BudgetKind::count ? json(b.count) : json(b.fraction);
}

inline TokenBudget budget_from_json(const json& v, const JsonWhere& at) {
    const std::string expect =
        "expected a token count (an integer), a fraction (e.g. 0.2) or {\"tokens\": N} / {\"fraction\": F}, got ";
    if (v.is_number_integer()) return TokenBudget::tokens(v.get<std::int64_t>());
    if (v.is_number_float()) return TokenBudget::ratio(v.get<double>());
    if (v.is_object() && v.size() == 1) {
        if (v.contains("tokens") && v["tokens"].is_number_integer()) return TokenBudget::tokens(v["tokens"].get<std::int64_t>());
        if (v.contains("fraction") && v["fraction"].is_number()) return TokenBudget::ratio(v["fraction"].get<double>());
    }
    at.fail(expect + json_repr(v));
}

// Reads the keys of a params object whose types check_params_like has checked.
struct ParamReader {
    const json& j;
    JsonWhere w;
    template <class T>
    void get(const char* key, T& out) const {
        const json* v = find_key(j, key);
        if (!v) return;
        if (const std::string p = ::vlsparse::detail::json_number_problem<T>(*v); !p.empty())
            w.key(key).fail(p + ", got " + json_repr(*v));
        out = v->get<T>();
    }
    template <class E, std::size_t N>
    void enumeration(const char* key, E& out, const std::pair<E, const char*> (&names)[N]) const {
        const json* v = find_key(j, key);
        if (!v) return;
        std::string list;
        for (const auto& [e, name] : names) {
            if (v->get<std::string>() == name) {
                out = e;
                return;
            }
            list += (list.empty() ? "" : ", ") + std::string(name);
        }
        w.key(key).fail("unknown value " + json_repr(*v) + ", expected one of " + list);
    }
    void budget(const char* key, TokenBudget& out) const {
        if (const json* v = find_key(j, key)) out = budget_from_json(*v, w.key(key));
    }
};

inline constexpr std::pair<BaselineGroups, const char*> kGroupNames[] = {{BaselineGroups::kv_head, "kv_head"},
                                                                        {BaselineGroups::layer, "layer"}};
inline constexpr std::pair<BaselineScope, const char*> kScopeNames[] = {{BaselineScope::visual, "visual"},
                                                                       {BaselineScope::all, "all"}};
inline constexpr std::pair<SnapKVPooling, const char*> kPoolingNames[] = {
    {SnapKVPooling::avg, "avg"}, {SnapKVPooling::max, "max"}, {SnapKVPooling::none, "none"}};
inline constexpr std::pair<FastVSpans, const char*> kFastVSpanNames[] = {{FastVSpans::joint, "joint"},
                                                                        {FastVSpans::per_image, "per_image"}};
inline constexpr std::pair<FixedRatioMode, const char*> kFixedModeNames[] = {
    {FixedRatioMode::uniform_stride, "uniform_stride"}, {FixedRatioMode::first, "first"}, {FixedRatioMode::last, "last"}};

inline json h2o_json(const H2OParams& P) {
    return json{{"heavy", budget_json(P.heavy)},   {"recent", budget_json(P.recent)},
                {"groups", std::string(to_string(P.groups))}, {"evict_during_decode", P.evict_during_decode},
                {"scale", P.scale},                 {"check_finite", P.check_finite}};
}
inline json snapkv_json(const SnapKVParams& P) {
    return json{{"window", P.window},     {"kernel", P.kernel}, {"pooling", std::string(to_string(P.pooling))},
                {"capacity", budget_json(P.capacity)}, {"groups", std::string(to_string(P.groups))},
                {"scale", P.scale},       {"check_finite", P.check_finite}};
}
inline json streamingllm_json(const StreamingLLMParams& P) {
    return json{{"sinks", P.sinks}, {"recent", budget_json(P.recent)}, {"evict_during_decode", P.evict_during_decode}};
}
inline json fastv_json(const FastVParams& P) {
    return json{{"k_layer", P.k_layer}, {"rate", P.rate}, {"spans", std::string(to_string(P.spans))},
                {"scale", P.scale},     {"check_finite", P.check_finite}};
}
inline json random_json(const RandomParams& P) {
    return json{{"keep", budget_json(P.keep)}, {"scope", std::string(to_string(P.scope))}, {"seed", P.seed}};
}
inline json fixed_ratio_json(const FixedRatioParams& P) {
    return json{{"keep", budget_json(P.keep)}, {"scope", std::string(to_string(P.scope))}, {"mode", std::string(to_string(P.mode))}};
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
                     to_json(ZipVLParams{}, true),
                     {},
                     [](const json& p, const JsonWhere& w, const PolicyContext&) -> AnyPolicy {
                         check_params_like(p, to_json(ZipVLParams{}, true), w);
                         const ZipVLParams P = with_json_path(p, w, [&] { return zipvl_params_from_json(p, w.path + "."); });
                         return ZipVLPolicy(P);
                     },
                     "tau",
                     detail::numbers({0.6, 0.7, 0.8, 0.9, 0.95, 0.975})});
        r.push_back({"avl",
                     "A-VL: per-image kept/core budgets, core-only decode steps refreshed every K steps",
                     detail::avl_params_json(AvlParams{}),
                     {},
                     [](const json& p, const JsonWhere& w, const PolicyContext&) -> AnyPolicy {
                         check_params_like(p, detail::avl_params_json(AvlParams{}), w);
                         const AvlParams P =
                             with_json_path(p, w, [&] { return detail::avl_params_from_json(p, w.path + "."); });
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
                             check_params_like(p, to_json(BlindSightParams{}), w,
                                               {"template", "head_map", "uniform_per_kv_group", "q_block", "k_block"});
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
                     detail::h2o_json(H2OParams{}),
                     {},
                     [](const json& p, const JsonWhere& w, const PolicyContext&) -> AnyPolicy {
                         check_params_like(p, detail::h2o_json(H2OParams{}), w, {"heavy", "recent"});
                         H2OParams P;
                         const detail::ParamReader rd{p, w};
                         rd.budget("heavy", P.heavy);
                         rd.budget("recent", P.recent);
                         rd.enumeration("groups", P.groups, detail::kGroupNames);
                         rd.get("evict_during_decode", P.evict_during_decode);
                         rd.get("scale", P.scale);
                         rd.get("check_finite", P.check_finite);
                         return H2OPolicy(P);
                     },
                     "",
                     {json{{"heavy", 0.05}, {"recent", 0.05}}, json{{"heavy", 0.1}, {"recent", 0.1}},
                      json{{"heavy", 0.15}, {"recent", 0.15}}, json{{"heavy", 0.2}, {"recent", 0.2}},
                      json{{"heavy", 0.25}, {"recent", 0.25}}, json{{"heavy", 0.35}, {"recent", 0.35}}}});
        r.push_back({"snapkv", "SnapKV: observation window + pooled window attention, a fixed capacity per KV head",
                     detail::snapkv_json(SnapKVParams{}),
                     {},
                     [](const json& p, const JsonWhere& w, const PolicyContext&) -> AnyPolicy {
                         check_params_like(p, detail::snapkv_json(SnapKVParams{}), w, {"capacity"});
                         SnapKVParams P;
                         const detail::ParamReader rd{p, w};
                         rd.get("window", P.window);
                         rd.get("kernel", P.kernel);
                         rd.enumeration("pooling", P.pooling, detail::kPoolingNames);
                         rd.budget("capacity", P.capacity);
                         rd.enumeration("groups", P.groups, detail::kGroupNames);
                         rd.get("scale", P.scale);
                         rd.get("check_finite", P.check_finite);
                         return SnapKVPolicy(P);
                     },
                     "capacity",
                     detail::numbers({0.1, 0.2, 0.3, 0.4, 0.5, 0.7})});
        r.push_back({"streamingllm", "StreamingLLM: the first sinks + the most recent tokens (a rolling window in decode)",
                     detail::streamingllm_json(StreamingLLMParams{}),
                     {},
                     [](const json& p, const JsonWhere& w, const PolicyContext&) -> AnyPolicy {
                         check_params_like(p, detail::streamingllm_json(StreamingLLMParams{}), w, {"recent"});
                         StreamingLLMParams P;
                         const detail::ParamReader rd{p, w};
                         rd.get("sinks", P.sinks);
                         rd.budget("recent", P.recent);
                         rd.get("evict_during_decode", P.evict_during_decode);
                         return StreamingLLMPolicy(P);
                     },
                     "recent",
                     detail::numbers({0.05, 0.1, 0.2, 0.3, 0.5, 0.7})});
        r.push_back({"fastv", "FastV: after layer K-1, only the top (1 - R) of the image tokens stay in the sequence",
                     detail::fastv_json(FastVParams{}),
                     {},
                     [](const json& p, const JsonWhere& w, const PolicyContext&) -> AnyPolicy {
                         check_params_like(p, detail::fastv_json(FastVParams{}), w);
                         FastVParams P;
                         const detail::ParamReader rd{p, w};
                         rd.get("k_layer", P.k_layer);
                         rd.get("rate", P.rate);
                         rd.enumeration("spans", P.spans, detail::kFastVSpanNames);
                         rd.get("scale", P.scale);
                         rd.get("check_finite", P.check_finite);
                         return FastVPolicy(P);
                     },
                     "rate",
                     detail::numbers({0.25, 0.5, 0.7, 0.8, 0.9, 0.97})});
        r.push_back({"random", "random: a seeded random share of the image tokens in every layer (a floor to beat)",
                     detail::random_json(RandomParams{}),
                     {},
                     [](const json& p, const JsonWhere& w, const PolicyContext&) -> AnyPolicy {
                         check_params_like(p, detail::random_json(RandomParams{}), w, {"keep"});
                         RandomParams P;
                         const detail::ParamReader rd{p, w};
                         rd.budget("keep", P.keep);
                         rd.enumeration("scope", P.scope, detail::kScopeNames);
                         P.seed = static_cast<std::uint64_t>(
                             read_int(p, "seed", w, 0, std::numeric_limits<std::int64_t>::max(), 0));
                         return RandomPolicy(P);
                     },
                     "keep",
                     detail::numbers({0.04, 0.1, 0.2, 0.3, 0.5, 0.7})});
        r.push_back({"fixed_ratio", "fixed ratio: an evenly spread (or first / last) share of the image tokens",
                     detail::fixed_ratio_json(FixedRatioParams{}),
                     {},
                     [](const json& p, const JsonWhere& w, const PolicyContext&) -> AnyPolicy {
                         check_params_like(p, detail::fixed_ratio_json(FixedRatioParams{}), w, {"keep"});
                         FixedRatioParams P;
                         const detail::ParamReader rd{p, w};
                         rd.budget("keep", P.keep);
                         rd.enumeration("scope", P.scope, detail::kScopeNames);
                         rd.enumeration("mode", P.mode, detail::kFixedModeNames);
                         return FixedRatioPolicy(P);
                     },
                     "keep",
                     detail::numbers({0.04, 0.1, 0.2, 0.3, 0.5, 0.7})});
        r.push_back({"purekv",
                     "PureKV: cross-layer importance (layer l0's window scores x ||V||), eviction to a budget, "
                     "ST-SpAttn masks on video (ablation: own_layer_scores=true, every layer scores itself)",
                     to_json(PureKVParams{}),
                     {"own_layer_scores"},
                     [](const json& p, const JsonWhere& w, const PolicyContext&) -> AnyPolicy {
                         check_params_like(p, to_json(PureKVParams{}), w, {"own_layer_scores"});
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
