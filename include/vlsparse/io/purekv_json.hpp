// vlsparse/io/purekv_json.hpp -- PureKV params to and from JSON (golden manifests, scenarios).
//
// Reading is strict: an unknown key, a wrong type or an unknown enum name throws vlsparse::error
// naming the key. The ST options are flat keys: st_mask ("none", "spatial", "temporal",
// "spatial_temporal", "local_window", "atrous"), st_window, st_dilation.
// Needs nlohmann/json. Include: <vlsparse/io/purekv_json.hpp>
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "vlsparse/io/params_json.hpp"
#include "vlsparse/policies/purekv_params.hpp"

namespace vlsparse {

namespace detail {
inline constexpr std::pair<PureKVGrouping, const char*> kPureKVGroupingNames[] = {
    {PureKVGrouping::kv_head, "kv_head"}, {PureKVGrouping::layer, "layer"}};
inline constexpr std::pair<PureKVBudget, const char*> kPureKVBudgetNames[] = {{PureKVBudget::count, "count"},
                                                                             {PureKVBudget::fraction, "fraction"}};
inline constexpr std::pair<PureKVLowerLayers, const char*> kPureKVLowerNames[] = {
    {PureKVLowerLayers::own_scores, "own_scores"}, {PureKVLowerLayers::dense, "dense"}};
inline constexpr std::pair<VideoMask, const char*> kVideoMaskNames[] = {
    {VideoMask::none, "none"},
    {VideoMask::spatial, "spatial"},
    {VideoMask::temporal, "temporal"},
    {VideoMask::spatial_temporal, "spatial_temporal"},
    {VideoMask::local_window, "local_window"},
    {VideoMask::atrous, "atrous"}};
}  // namespace detail

inline nlohmann::json to_json(const PureKVParams& P) {
    return nlohmann::json{
        {"l0", P.l0},
        {"window", P.window},
        {"budget", std::string(to_string(P.budget))},
        {"top_h", P.top_h},
        {"budget_fraction", P.budget_fraction},
        {"grouping", std::string(to_string(P.grouping))},
        {"lower_layers", std::string(to_string(P.lower_layers))},
        {"st_mask", std::string(to_string(P.st.kind))},
        {"st_window", P.st.window},
        {"st_dilation", P.st.dilation},
        {"st_start_layer", P.st_start_layer},
        {"q_block", P.q_block},
        {"k_block", P.k_block},
        {"scale", P.scale},
        {"check_finite", P.check_finite},
    };
}

// Keys not present keep their defaults; unknown keys are an error. `where` prefixes messages.
inline PureKVParams purekv_params_from_json(const nlohmann::json& j, const std::string& where = "") {
    detail::check_keys(j,
                       {"l0", "window", "budget", "top_h", "budget_fraction", "grouping", "lower_layers", "st_mask",
                        "st_window", "st_dilation", "st_start_layer", "q_block", "k_block", "scale", "check_finite"},
                       where);
    PureKVParams P;
    detail::read_number(j, "l0", P.l0, where);
    detail::read_number(j, "window", P.window, where);
    detail::read_number(j, "top_h", P.top_h, where);
    detail::read_number(j, "budget_fraction", P.budget_fraction, where);
    detail::read_number(j, "st_window", P.st.window, where);
    detail::read_number(j, "st_dilation", P.st.dilation, where);
    detail::read_number(j, "st_start_layer", P.st_start_layer, where);
    detail::read_number(j, "q_block", P.q_block, where);
    detail::read_number(j, "k_block", P.k_block, where);
    detail::read_number(j, "scale", P.scale, where);
    detail::read_number(j, "check_finite", P.check_finite, where);
    if (j.contains("budget")) P.budget = detail::enum_from_json(j["budget"], "budget", detail::kPureKVBudgetNames, where);
    if (j.contains("grouping"))
        P.grouping = detail::enum_from_json(j["grouping"], "grouping", detail::kPureKVGroupingNames, where);
    if (j.contains("lower_layers"))
        P.lower_layers = detail::enum_from_json(j["lower_layers"], "lower_layers", detail::kPureKVLowerNames, where);
    if (j.contains("st_mask")) P.st.kind = detail::enum_from_json(j["st_mask"], "st_mask", detail::kVideoMaskNames, where);
    detail::check_purekv_params(P, "purekv_params_from_json");
    return P;
}

}  // namespace vlsparse
