// vlsparse/io/params_json.hpp -- Params structs to and from JSON (golden manifests, scenarios).
//
// Reading is strict: an unknown key, a wrong type or an unknown enum name throws vlsparse::error
// naming the key, so a typo in a manifest or scenario never silently falls back to a default.
// Needs nlohmann/json. Include: <vlsparse/io/params_json.hpp>
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "vlsparse/core/error.hpp"
#include "vlsparse/policies/zipvl_params.hpp"

namespace vlsparse {

namespace detail {

template <class E, std::size_t N>
E enum_from_json(const nlohmann::json& j, const char* key, const std::pair<E, const char*> (&names)[N],
                 const std::string& where) {
    require(j.is_string(), "params_from_json", where, key, ": expected a string");
    const auto s = j.get<std::string>();
    std::string options;
    for (const auto& [e, name] : names) {
        if (s == name) return e;
        options += (options.empty() ? "" : ", ") + std::string(name);
    }
    throw error("params_from_json", concat(where, key, ": unknown value '", s, "', expected one of ", options));
}

inline void check_keys(const nlohmann::json& j, const std::set<std::string>& known, const std::string& where) {
    require(j.is_object(), "params_from_json", where, ": expected an object");
    for (const auto& [k, v] : j.items())
        require(known.count(k) > 0, "params_from_json", where, ": unknown key '", k, "'");
}

// What is wrong with reading the JSON number `v` as T ("" when nothing is): the range is checked in
// the JSON's own type before narrowing, so an integer must fit T (4294967297 is not an int, -1 is not
// unsigned) and a number read as float must be 0 or within float's range (1e-50 would round to 0,
// 1e300 to inf). `v` must already be a number (an integer for integral T).
template <class T>
std::string json_number_problem(const nlohmann::json& v) {
    if constexpr (std::is_same_v<T, bool>) {
        return "";
    } else if constexpr (std::is_integral_v<T>) {
        using L = std::numeric_limits<T>;
        const std::string range = concat("expected an integer in [", +L::min(), ", ", +L::max(), "]");
        if (v.is_number_unsigned())
            return v.get<std::uint64_t>() > static_cast<std::uint64_t>(L::max()) ? range : "";
        const auto x = v.get<std::int64_t>();
        if constexpr (std::is_signed_v<T>)
            return x < static_cast<std::int64_t>(L::min()) || x > static_cast<std::int64_t>(L::max()) ? range : "";
        else
            return x < 0 || static_cast<std::uint64_t>(x) > static_cast<std::uint64_t>(L::max()) ? range : "";
    } else {
        const auto x = v.get<double>();
        if (!std::isfinite(x)) return "expected a finite number";
        if constexpr (std::is_same_v<T, float>) {
            using F = std::numeric_limits<float>;
            const double a = std::abs(x);
            if (a != 0.0 && (a < static_cast<double>(F::denorm_min()) || a > static_cast<double>(F::max())))
                return concat("expected 0 or a magnitude in [", F::denorm_min(), ", ", F::max(), "] (fp32)");
        }
        return "";
    }
}

template <class T>
void read_number(const nlohmann::json& j, const char* key, T& out, const std::string& where) {
    if (!j.contains(key)) return;
    const auto& v = j.at(key);
    if constexpr (std::is_same_v<T, bool>) {
        require(v.is_boolean(), "params_from_json", where, key, ": expected true or false");
    } else if constexpr (std::is_integral_v<T>) {
        require(v.is_number_integer(), "params_from_json", where, key, ": expected an integer");
    } else {
        require(v.is_number(), "params_from_json", where, key, ": expected a number");
    }
    if (const std::string p = json_number_problem<T>(v); !p.empty())
        throw error("params_from_json", concat(where, key, ": ", p, ", got ", v.dump()));
    out = v.get<T>();
}

inline constexpr std::pair<ZipVLGrouping, const char*> kGroupingNames[] = {{ZipVLGrouping::layer, "layer"},
                                                                          {ZipVLGrouping::kv_head, "kv_head"}};
inline constexpr std::pair<ZipVLNnz, const char*> kNnzNames[] = {{ZipVLNnz::causal_column, "causal_column"},
                                                                {ZipVLNnz::probe_rows, "probe_rows"}};
inline constexpr std::pair<ZipVLProbes, const char*> kProbeNames[] = {{ZipVLProbes::counts, "counts"},
                                                                     {ZipVLProbes::ratios, "ratios"}};
inline constexpr std::pair<UnselectedRows, const char*> kUnselectedNames[] = {
    {UnselectedRows::zero, "zero"}, {UnselectedRows::attend_selected, "attend_selected"}};
inline constexpr std::pair<ZipVLPrefill, const char*> kZipVLPrefillNames[] = {{ZipVLPrefill::sparse, "sparse"},
                                                                             {ZipVLPrefill::dense, "dense"}};
inline constexpr std::pair<ZipVLRatio, const char*> kZipVLRatioNames[] = {{ZipVLRatio::adaptive, "adaptive"},
                                                                         {ZipVLRatio::fixed, "fixed"}};
inline constexpr std::pair<ZipVLRanking, const char*> kZipVLRankingNames[] = {
    {ZipVLRanking::normalized, "normalized"}, {ZipVLRanking::accumulated, "accumulated"}};

}  // namespace detail

// The ablation keys (prefill, ratio, fixed_ratio, ranking) are written only when `all_keys` is set
// or when one of them differs from its default, so the manifests of the paper's method (every golden
// case) keep their exact bytes; the simulator's registry asks for all keys.
inline nlohmann::json to_json(const ZipVLParams& P, bool all_keys) {
    nlohmann::json j{
        {"tau", P.tau},
        {"probe_mode", std::string(to_string(P.probe_mode))},
        {"probe_recent", P.probe_recent},
        {"probe_random", P.probe_random},
        {"probe_recent_ratio", P.probe_recent_ratio},
        {"probe_random_ratio", P.probe_random_ratio},
        {"seed", P.seed},
        {"grouping", std::string(to_string(P.grouping))},
        {"nnz", std::string(to_string(P.nnz))},
        {"keep_last", P.keep_last},
        {"keep_text", P.keep_text},
        {"dense_layers", P.dense_layers},
        {"unselected", std::string(to_string(P.unselected))},
        {"scale", P.scale},
        {"check_finite", P.check_finite},
    };
    const ZipVLParams D;
    if (all_keys || P.prefill != D.prefill || P.ratio != D.ratio || P.fixed_ratio != D.fixed_ratio ||
        P.ranking != D.ranking) {
        j["prefill"] = std::string(to_string(P.prefill));
        j["ratio"] = std::string(to_string(P.ratio));
        j["fixed_ratio"] = P.fixed_ratio;
        j["ranking"] = std::string(to_string(P.ranking));
    }
    return j;
}
inline nlohmann::json to_json(const ZipVLParams& P) { return to_json(P, false); }

// Keys not present keep their defaults; unknown keys are an error. `where` prefixes messages
// (e.g. a JSON path such as "policies[0].params.").
inline ZipVLParams zipvl_params_from_json(const nlohmann::json& j, const std::string& where = "") {
    detail::check_keys(j,
                       {"tau", "probe_mode", "probe_recent", "probe_random", "probe_recent_ratio", "probe_random_ratio",
                        "seed", "grouping", "nnz", "keep_last", "keep_text", "dense_layers", "unselected", "scale",
                        "check_finite", "prefill", "ratio", "fixed_ratio", "ranking"},
                       where);
    ZipVLParams P;
    detail::read_number(j, "tau", P.tau, where);
    detail::read_number(j, "probe_recent", P.probe_recent, where);
    detail::read_number(j, "probe_random", P.probe_random, where);
    detail::read_number(j, "probe_recent_ratio", P.probe_recent_ratio, where);
    detail::read_number(j, "probe_random_ratio", P.probe_random_ratio, where);
    detail::read_number(j, "seed", P.seed, where);
    detail::read_number(j, "keep_last", P.keep_last, where);
    detail::read_number(j, "keep_text", P.keep_text, where);
    detail::read_number(j, "dense_layers", P.dense_layers, where);
    detail::read_number(j, "scale", P.scale, where);
    detail::read_number(j, "check_finite", P.check_finite, where);
    detail::read_number(j, "fixed_ratio", P.fixed_ratio, where);
    if (j.contains("prefill")) P.prefill = detail::enum_from_json(j["prefill"], "prefill", detail::kZipVLPrefillNames, where);
    if (j.contains("ratio")) P.ratio = detail::enum_from_json(j["ratio"], "ratio", detail::kZipVLRatioNames, where);
    if (j.contains("ranking")) P.ranking = detail::enum_from_json(j["ranking"], "ranking", detail::kZipVLRankingNames, where);
    if (j.contains("probe_mode")) P.probe_mode = detail::enum_from_json(j["probe_mode"], "probe_mode", detail::kProbeNames, where);
    if (j.contains("grouping")) P.grouping = detail::enum_from_json(j["grouping"], "grouping", detail::kGroupingNames, where);
    if (j.contains("nnz")) P.nnz = detail::enum_from_json(j["nnz"], "nnz", detail::kNnzNames, where);
    if (j.contains("unselected"))
        P.unselected = detail::enum_from_json(j["unselected"], "unselected", detail::kUnselectedNames, where);
    detail::check_zipvl_params(P, "zipvl_params_from_json");
    detail::check_zipvl_modes(P, "zipvl_params_from_json");
    return P;
}

}  // namespace vlsparse
