// vlsparse/sim/report_json.hpp -- the simulator's machine-readable report (--json FILE).
//
//   {"format": "vlsparse.sim.report", "version": 1, "generator": "vlsparse-sim 0.1.0",
//    "command": "run", "scenario": {...}, "source": "...", "threads": 2, "device": "...", "wall_s": 4.2,
//    "residual": false, "hidden_size": 0,
//    "purekv_validation": null or {"policy", "l0", "window", "grouping", "mean_rho", "mean_rho_without_v",
//                          "mean_topk_overlap", "layers": [{"layer", "source_layer", "rho": [G], "p": [G],
//                          "rho_without_v": [G], "topk_overlap": [G], "mean_rho"}]} (sim/purekv_validation.hpp),
//    "runs": [{"label", "name", "params", "sweep_of", "sweep_value",
//              "summary": {"kept_ratio", "prefill_flops_ratio", "decode_flops_ratio", "flops_ratio",
//                          "kv_ratio_prefill", "kv_ratio_end", "prefill_nmse", "decode_nmse",
//                          "mass_prefill", "mass_decode", "wall_s", "attention_s", "attention_flops",
//                          "gflops", "prefill_attention_s", "decode_attention_s", "prefill_tflops",
//                          "decode_gbps", ["final_hidden_nmse", "token_agreement", "tokens_agree", "tokens",
//                          "kl_to_dense"]},
//              "layers": [{"layer", "rows", "prefill_kind", "kept_ratio", "kept_ratio_end",
//                          "prefill_pairs", "dense_prefill_pairs", "decode_pairs", "dense_decode_pairs",
//                          "kv_bytes_prefill", "kv_bytes_end", "dense_kv_bytes_prefill", "dense_kv_bytes_end",
//                          "prefill_nmse", "decode_nmse", "mass_prefill", "mass_decode",
//                          "decide_s", "attention_s", "prefill_attention_s", "decode_attention_s",
//                          "decode_kv_bytes", "other_s"}, ...]}, ...]}
// runs[0] is the dense reference. Ratios are fractions of 1; an infinite NMSE is written as null.
// Include: <vlsparse/sim/report_json.hpp>
#pragma once

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "vlsparse/core/config.hpp"
#include "vlsparse/sim/engine.hpp"
#include "vlsparse/sim/scenario.hpp"

namespace vlsparse::sim {

namespace detail {
inline json finite_or_null(double x) { return std::isfinite(x) ? json(x) : json(nullptr); }
}  // namespace detail

inline json to_json(const LayerMetrics& L) {
    using detail::finite_or_null;
    return json{{"layer", L.layer},
                {"rows", L.rows},
                {"prefill_kind", L.prefill_kind},
                {"kept_ratio", L.kept_ratio},
                {"kept_ratio_end", L.kept_ratio_end},
                {"prefill_pairs", L.prefill_pairs},
                {"dense_prefill_pairs", L.dense_prefill_pairs},
                {"decode_pairs", L.decode_pairs},
                {"dense_decode_pairs", L.dense_decode_pairs},
                {"kv_bytes_prefill", L.kv_bytes_prefill},
                {"kv_bytes_end", L.kv_bytes_end},
                {"dense_kv_bytes_prefill", L.dense_kv_bytes_prefill},
                {"dense_kv_bytes_end", L.dense_kv_bytes_end},
                {"prefill_nmse", finite_or_null(L.prefill_err.value())},
                {"decode_nmse", finite_or_null(L.decode_err.value())},
                {"mass_prefill", L.mass_prefill},
                {"mass_decode", L.mass_decode},
                {"decide_s", L.decide_s},
                {"attention_s", L.attention_s},
                {"prefill_attention_s", L.prefill_attention_s},
                {"decode_attention_s", L.decode_attention_s},
                {"decode_kv_bytes", L.decode_kv_bytes},
                {"other_s", L.other_s}};
}

inline json to_json(const PolicyResult& p, std::int64_t head_dim) {
    using detail::finite_or_null;
    json sum{{"kept_ratio", p.kept_ratio()},
             {"prefill_flops_ratio", p.prefill_flops_ratio()},
             {"decode_flops_ratio", p.decode_flops_ratio()},
             {"flops_ratio", p.flops_ratio()},
             {"kv_ratio_prefill", p.kv_ratio_prefill()},
             {"kv_ratio_end", p.kv_ratio_end()},
             {"prefill_nmse", finite_or_null(p.prefill_nmse())},
             {"decode_nmse", finite_or_null(p.decode_nmse())},
             {"mass_prefill", p.mass_prefill()},
             {"mass_decode", p.mass_decode()},
             {"wall_s", p.wall_s()},
             {"attention_s", p.attention_s()},
             {"attention_flops", p.attention_flops(head_dim)},
             {"gflops", p.gflops(head_dim)},
             {"prefill_attention_s", p.prefill_attention_s()},
             {"decode_attention_s", p.decode_attention_s()},
             {"prefill_tflops", p.prefill_tflops(head_dim)},
             {"decode_gbps", p.decode_gbps()}};
    if (p.residual) {
        sum["final_hidden_nmse"] = finite_or_null(p.final_hidden_err.value());
        sum["token_agreement"] = p.token_agreement();
        sum["tokens_agree"] = p.tokens_agree;  // of tokens.size() = S + 1 points
        sum["kl_to_dense"] = p.kl_to_dense();
        sum["tokens"] = p.tokens;
    }
    json layers = json::array();
    for (const auto& L : p.layers) layers.push_back(to_json(L));
    return json{{"label", p.label},     {"name", p.name},      {"params", p.params}, {"sweep_of", p.sweep_of},
                {"sweep_value", p.sweep_value}, {"summary", sum}, {"layers", layers}};
}

inline json report_json(const std::string& command, const Scenario& s, const RunResult& r) {
    json runs = json::array();
    for (const auto& p : r.runs) runs.push_back(to_json(p, s.model.head_dim));
    return json{{"format", "vlsparse.sim.report"},
                {"version", 1},
                {"generator", std::string("vlsparse-sim ") + VLSPARSE_VERSION_STRING},
                {"command", command},
                {"scenario", to_json(s)},
                {"source", r.source},
                {"threads", r.threads},
                {"device", r.device},
                {"source_s", r.source_s},
                {"wall_s", r.wall_s},
                {"residual", r.residual},
                {"hidden_size", r.hidden_size},
                {"purekv_validation", r.purekv.enabled ? r.purekv.to_json() : json(nullptr)},
                {"runs", runs}};
}

// Throws unless `path` can be written (its folder created if needed), the way write_text_file would:
// for the reports' paths, checked before a run rather than after it. Leaves no file behind.
inline void check_writable(const std::filesystem::path& path, const char* what) {
    std::error_code ec;
    if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), ec);
    const bool existed = std::filesystem::exists(path, ec);
    bool ok = !std::filesystem::is_directory(path, ec);
    if (ok) {
        std::ofstream f(path, std::ios::binary | std::ios::app);  // app: an existing file is not truncated
        ok = static_cast<bool>(f);
    }
    if (!existed) std::filesystem::remove(path, ec);
    if (!ok)
        throw ::vlsparse::error("vlsparse-sim", std::string("cannot write the ") + what + " to '" + path.string() + "'");
}

inline void write_text_file(const std::filesystem::path& path, const std::string& text, const char* what) {
    if (path.has_parent_path()) {
        std::error_code ec;
        std::filesystem::create_directories(path.parent_path(), ec);
    }
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    if (!f) throw ::vlsparse::error("vlsparse-sim", std::string("cannot write the ") + what + " to '" + path.string() + "'");
    f << text;
    f.close();
    if (f.fail()) throw ::vlsparse::error("vlsparse-sim", std::string("writing the ") + what + " to '" + path.string() + "' failed");
}

}  // namespace vlsparse::sim
