// vlsparse/io/baselines_json.hpp -- the baselines' Params to and from JSON (golden manifests,
// scenarios, Python): H2OParams, SnapKVParams, StreamingLLMParams, FastVParams, RandomParams,
// FixedRatioParams.
//
// Every field is one key of the same name; enums by their names (baselines_params.hpp). One more key,
// "baseline", names the struct ("h2o", "snapkv", "streamingllm", "fastv", "random", "fixed_ratio"), so
// the baselines' golden cases, which share one folder, say which one they are. A budget (TokenBudget)
// is written {"tokens": N} or {"fraction": F}:
//   {"baseline": "h2o", "heavy": {"fraction": 0.1}, "recent": {"fraction": 0.1}, "groups": "kv_head",
//    "evict_during_decode": true, "scale": 0.0, "check_finite": true}
// Reading is strict (io/json.hpp): keys not present keep their defaults; "baseline" may be left out,
// and when given must name the struct read; an unknown key, a wrong type or an unknown name throws
// vlsparse::error naming the key; the result is validated. A budget is also read in its short form, a
// plain number: an integer is a token count (2048), a number with a decimal point a fraction (0.3);
// scenario files and sweeps use it. Written budgets are always the explicit objects.
// Needs nlohmann/json. Include: <vlsparse/io/baselines_json.hpp> (or <vlsparse/io/params_json.hpp>: all)
#pragma once

#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "vlsparse/io/json.hpp"
#include "vlsparse/policies/baselines_params.hpp"

namespace vlsparse {

inline nlohmann::json to_json(const TokenBudget& b) {
    return b.kind == BudgetKind::count ? nlohmann::json{{"tokens", b.count}} : nlohmann::json{{"fraction", b.fraction}};
}

// {"tokens": N} (N >= 0 is checked by the Params' validate), {"fraction": F}, or the short form N / F.
inline TokenBudget token_budget_from_json(const nlohmann::json& v, const JsonPath& at) {
    const auto wrong = [&] {
        at.fail("expected a token count (an integer N or {\"tokens\": N}) or a fraction (a number with a decimal "
                "point F or {\"fraction\": F}), got " +
                json_repr(v));
    };
    TokenBudget b;
    if (v.is_number_integer()) {
        b.kind = BudgetKind::count;
        read_json_value(v, b.count, at);
    } else if (v.is_number()) {
        b.kind = BudgetKind::fraction;
        read_json_value(v, b.fraction, at);
    } else if (v.is_object() && v.size() == 1 && v.contains("tokens")) {
        b.kind = BudgetKind::count;
        read_json_value(v["tokens"], b.count, at.key("tokens"));
    } else if (v.is_object() && v.size() == 1 && v.contains("fraction")) {
        b.kind = BudgetKind::fraction;
        read_json_value(v["fraction"], b.fraction, at.key("fraction"));
    } else {
        wrong();
    }
    return b;
}

// A TokenBudget field of a Params (fields_from_json, io/json.hpp).
inline void read_json_value(const nlohmann::json& v, TokenBudget& out, const JsonPath& at) {
    out = token_budget_from_json(v, at);
}

// The fields of each baseline's Params, one JSON key each (io/json.hpp).
template <class Self, class F>
    requires std::same_as<std::remove_const_t<Self>, H2OParams>
void json_fields(Self& P, F&& f) {
    f("heavy", P.heavy);
    f("recent", P.recent);
    f("groups", P.groups);
    f("evict_during_decode", P.evict_during_decode);
    f("scale", P.scale);
    f("check_finite", P.check_finite);
}
template <class Self, class F>
    requires std::same_as<std::remove_const_t<Self>, SnapKVParams>
void json_fields(Self& P, F&& f) {
    f("window", P.window);
    f("kernel", P.kernel);
    f("pooling", P.pooling);
    f("capacity", P.capacity);
    f("groups", P.groups);
    f("scale", P.scale);
    f("check_finite", P.check_finite);
}
template <class Self, class F>
    requires std::same_as<std::remove_const_t<Self>, StreamingLLMParams>
void json_fields(Self& P, F&& f) {
    f("sinks", P.sinks);
    f("recent", P.recent);
    f("evict_during_decode", P.evict_during_decode);
}
template <class Self, class F>
    requires std::same_as<std::remove_const_t<Self>, FastVParams>
void json_fields(Self& P, F&& f) {
    f("k_layer", P.k_layer);
    f("rate", P.rate);
    f("spans", P.spans);
    f("scale", P.scale);
    f("check_finite", P.check_finite);
}
template <class Self, class F>
    requires std::same_as<std::remove_const_t<Self>, RandomParams>
void json_fields(Self& P, F&& f) {
    f("keep", P.keep);
    f("scope", P.scope);
    f("seed", P.seed);
}
template <class Self, class F>
    requires std::same_as<std::remove_const_t<Self>, FixedRatioParams>
void json_fields(Self& P, F&& f) {
    f("keep", P.keep);
    f("scope", P.scope);
    f("mode", P.mode);
}

namespace detail {

// A baseline's JSON: its fields plus "baseline", its name.
template <class P>
nlohmann::json baseline_to_json(const P& p, std::string_view name) {
    nlohmann::json j = fields_to_json(p);
    j["baseline"] = std::string(name);
    return j;
}

// Reads a baseline's JSON; "baseline" may be left out, and when given must be `name`. Validates.
template <class P>
P baseline_from_json(const nlohmann::json& j, const std::string& where, const char* fn, std::string_view name) {
    const JsonPath w = JsonPath::from_prefix(where, fn);
    const P p = fields_from_json<P>(j, w, {"baseline"});
    if (const nlohmann::json* b = find_key(j, "baseline")) {
        if (!b->is_string()) w.key("baseline").fail("expected the string \"" + std::string(name) + "\", got " + json_repr(*b));
        if (b->get<std::string>() != name)
            w.key("baseline").fail("these are the params of '" + std::string(name) + "', got " + json_repr(*b));
    }
    p.validate(fn);
    return p;
}

}  // namespace detail

inline nlohmann::json to_json(const H2OParams& P) { return detail::baseline_to_json(P, "h2o"); }
inline nlohmann::json to_json(const SnapKVParams& P) { return detail::baseline_to_json(P, "snapkv"); }
inline nlohmann::json to_json(const StreamingLLMParams& P) { return detail::baseline_to_json(P, "streamingllm"); }
inline nlohmann::json to_json(const FastVParams& P) { return detail::baseline_to_json(P, "fastv"); }
inline nlohmann::json to_json(const RandomParams& P) { return detail::baseline_to_json(P, "random"); }
inline nlohmann::json to_json(const FixedRatioParams& P) { return detail::baseline_to_json(P, "fixed_ratio"); }

// `where`: the JSON path prefix of the object's keys in messages ("params.", "policies[0].params.").
inline H2OParams h2o_params_from_json(const nlohmann::json& j, const std::string& where = "") {
    return detail::baseline_from_json<H2OParams>(j, where, "h2o_params_from_json", "h2o");
}
inline SnapKVParams snapkv_params_from_json(const nlohmann::json& j, const std::string& where = "") {
    return detail::baseline_from_json<SnapKVParams>(j, where, "snapkv_params_from_json", "snapkv");
}
inline StreamingLLMParams streamingllm_params_from_json(const nlohmann::json& j, const std::string& where = "") {
    return detail::baseline_from_json<StreamingLLMParams>(j, where, "streamingllm_params_from_json", "streamingllm");
}
inline FastVParams fastv_params_from_json(const nlohmann::json& j, const std::string& where = "") {
    return detail::baseline_from_json<FastVParams>(j, where, "fastv_params_from_json", "fastv");
}
inline RandomParams random_params_from_json(const nlohmann::json& j, const std::string& where = "") {
    return detail::baseline_from_json<RandomParams>(j, where, "random_params_from_json", "random");
}
inline FixedRatioParams fixed_ratio_params_from_json(const nlohmann::json& j, const std::string& where = "") {
    return detail::baseline_from_json<FixedRatioParams>(j, where, "fixed_ratio_params_from_json", "fixed_ratio");
}

}  // namespace vlsparse
