// vlsparse/sim/report_text.hpp -- the simulator's terminal output: aligned tables.
//
//   print_header        the scenario in a few lines (model, prompt, decode, source, threads)
//   print_run_table     one row per run (dense reference first): kept ratio, FLOPs, KV bytes, NMSE, mass,
//                       residual-mode fidelity, time and achieved GFLOP/s
//   print_layer_tables  per policy, one row per layer
//   print_sweep_table   compare: one row per (policy, sweep value), cost against fidelity
// Metric definitions: sim/metrics.hpp and docs/simulator.md. Include: <vlsparse/sim/report_text.hpp>
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "vlsparse/core/config.hpp"
#include "vlsparse/sim/engine.hpp"
#include "vlsparse/sim/scenario.hpp"

namespace vlsparse::sim {

namespace text {

inline std::string pct(double x, int prec = 1) {
    if (!std::isfinite(x)) return "-";
    char b[32];
    std::snprintf(b, sizeof b, "%.*f%%", prec, 100.0 * x);
    return b;
}
inline std::string sci(double x) {
    if (std::isnan(x)) return "-";
    if (std::isinf(x)) return "inf";
    if (x == 0.0) return "0";
    char b[32];
    std::snprintf(b, sizeof b, "%.2e", x);
    return b;
}
inline std::string fix(double x, int prec) {
    if (!std::isfinite(x)) return "-";
    char b[32];
    std::snprintf(b, sizeof b, "%.*f", prec, x);
    return b;
}

// Token agreement with its sample size: "88% (22/25)".
inline std::string agree(std::int64_t agree, std::size_t of) {
    if (of == 0) return "-";
    return pct(static_cast<double>(agree) / static_cast<double>(of), 0) + " (" + std::to_string(agree) + "/" +
           std::to_string(of) + ")";
}

// Columns right-aligned except the first; a header of one or two lines.
class Table {
public:
    explicit Table(std::vector<std::string> h1, std::vector<std::string> h2 = {}) : h1_(std::move(h1)), h2_(std::move(h2)) {
        if (h2_.empty()) h2_.assign(h1_.size(), "");
    }
    void row(std::vector<std::string> r) { rows_.push_back(std::move(r)); }
    void print(std::FILE* f, const std::string& indent = "") const {
        std::vector<std::size_t> w(h1_.size(), 0);
        auto fit = [&](const std::vector<std::string>& r) {
            for (std::size_t i = 0; i < r.size() && i < w.size(); ++i) w[i] = std::max(w[i], r[i].size());
        };
        fit(h1_);
        fit(h2_);
        for (const auto& r : rows_) fit(r);
        auto line = [&](const std::vector<std::string>& r) {
            std::string s = indent;
            for (std::size_t i = 0; i < w.size(); ++i) {
                const std::string c = i < r.size() ? r[i] : "";
                const std::string pad(w[i] - c.size(), ' ');
                s += i == 0 ? c + pad : "  " + pad + c;
            }
            while (!s.empty() && s.back() == ' ') s.pop_back();
            std::fprintf(f, "%s\n", s.c_str());
        };
        line(h1_);
        if (std::any_of(h2_.begin(), h2_.end(), [](const std::string& x) { return !x.empty(); })) line(h2_);
        for (const auto& r : rows_) line(r);
    }

private:
    std::vector<std::string> h1_, h2_;
    std::vector<std::vector<std::string>> rows_;
};

}  // namespace text

// The run's source and thread count (known once the run has started).
inline void print_source(std::FILE* f, const RunResult& r) {
    std::fprintf(f, "  source   %s\n", r.source.c_str());
    std::fprintf(f, "  threads  %d\n", r.threads);
    std::fprintf(f, "  device   %s\n", r.device.c_str());
}

inline void print_header(std::FILE* f, const std::string& command, const Scenario& s, const RunResult* r) {
    const auto& m = s.model;
    std::fprintf(f, "vlsparse-sim %s %s: %s\n", VLSPARSE_VERSION_STRING, command.c_str(), s.name.c_str());
    if (!s.description.empty()) std::fprintf(f, "  %s\n", s.description.c_str());
    std::fprintf(f, "  model    %lld layers, H = %lld query heads, H_kv = %lld KV heads, d = %lld\n",
                 static_cast<long long>(m.layers), static_cast<long long>(m.heads), static_cast<long long>(m.kv_heads),
                 static_cast<long long>(m.head_dim));
    std::fprintf(f, "  prompt   n = %lld tokens (%lld text, %lld image, %lld video): %s\n", static_cast<long long>(s.n()),
                 static_cast<long long>(s.layout.count(SegmentKind::text)),
                 static_cast<long long>(s.layout.count(SegmentKind::image)),
                 static_cast<long long>(s.layout.count(SegmentKind::video)), s.layout.to_string().c_str());
    std::fprintf(f, "  decode   %lld steps; backend %s; seed %llu\n", static_cast<long long>(s.decode_steps), s.backend.c_str(),
                 static_cast<unsigned long long>(s.seed));
    if (r) print_source(f, *r);
}

inline void print_run_table(std::FILE* f, const Scenario& s, const RunResult& r) {
    const bool res = r.residual;
    std::vector<std::string> h1 = {"policy", "kept", "prefill", "decode", "KV bytes", "NMSE", "NMSE", "mass", "mass"};
    std::vector<std::string> h2 = {"", "(KV)", "FLOPs", "FLOPs", "(end)", "prefill", "decode", "prefill", "decode"};
    if (res) {
        h1.insert(h1.end(), {"hidden", "tokens", "KL to"});
        h2.insert(h2.end(), {"NMSE", "agree", "dense"});
    }
    h1.insert(h1.end(), {"time", "attention"});
    h2.insert(h2.end(), {"(s)", "GFLOP/s"});
    text::Table t(h1, h2);
    for (const auto& p : r.runs) {
        std::vector<std::string> row = {p.label,
                                        text::pct(p.kept_ratio()),
                                        text::pct(p.prefill_flops_ratio()),
                                        s.decode_steps > 0 ? text::pct(p.decode_flops_ratio()) : "-",
                                        text::pct(p.kv_ratio_end()),
                                        text::sci(p.prefill_nmse()),
                                        s.decode_steps > 0 ? text::sci(p.decode_nmse()) : "-",
                                        text::pct(p.mass_prefill()),
                                        s.decode_steps > 0 ? text::pct(p.mass_decode()) : "-"};
        if (res) {
            row.push_back(text::sci(p.final_hidden_err.value()));
            row.push_back(text::agree(p.tokens_agree, p.tokens.size()));
            row.push_back(text::sci(p.kl_to_dense()));
        }
        row.push_back(text::fix(p.wall_s(), 2));
        row.push_back(text::fix(p.gflops(s.model.head_dim), 1));
        t.row(row);
    }
    t.print(f);
}

// The attention's own time on the backend (GPU: the kernels' time by CUDA events): prefill time, TF/s on
// the pairs computed and the speedup over the dense run; decode time, GB/s of K and V read, speedup.
inline void print_time_table(std::FILE* f, const Scenario& s, const RunResult& r) {
    if (r.runs.empty()) return;
    const PolicyResult& dense = r.runs[0];
    const bool dec = s.decode_steps > 0;
    text::Table t({"policy", "prefill", "prefill", "prefill", "decode", "decode", "decode"},
                  {"", "attn (ms)", "TF/s", "x dense", "attn (ms)", "GB/s", "x dense"});
    auto speedup = [](double dense_s, double s) { return s > 0 ? text::fix(dense_s / s, 2) + "x" : std::string("-"); };
    for (const auto& p : r.runs)
        t.row({p.label, text::fix(1e3 * p.prefill_attention_s(), 2), text::fix(p.prefill_tflops(s.model.head_dim), 1),
               speedup(dense.prefill_attention_s(), p.prefill_attention_s()),
               dec ? text::fix(1e3 * p.decode_attention_s(), 2) : "-", dec ? text::fix(p.decode_gbps(), 1) : "-",
               dec ? speedup(dense.decode_attention_s(), p.decode_attention_s()) : "-"});
    std::fprintf(f, "attention time on %s (all layers):\n", r.device.c_str());
    t.print(f);
}

inline void print_layer_tables(std::FILE* f, const Scenario& s, const RunResult& r) {
    for (std::size_t k = 1; k < r.runs.size(); ++k) {
        const auto& p = r.runs[k];
        std::fprintf(f, "\n%s: per layer\n", p.label.c_str());
        text::Table t({"layer", "rows", "prefill", "kept", "prefill", "KV bytes", "NMSE", "NMSE", "mass", "mass", "time"},
                      {"", "", "attention", "(KV)", "FLOPs", "(end)", "prefill", "decode", "prefill", "decode", "(ms)"});
        for (const auto& L : p.layers) {
            t.row({std::to_string(L.layer), std::to_string(L.rows), L.prefill_kind, text::pct(L.kept_ratio),
                   text::pct(L.dense_prefill_pairs > 0 ? L.prefill_pairs / L.dense_prefill_pairs : 0.0),
                   text::pct(L.dense_kv_bytes_end > 0 ? L.kv_bytes_end / L.dense_kv_bytes_end : 0.0),
                   text::sci(L.prefill_err.value()), s.decode_steps > 0 ? text::sci(L.decode_err.value()) : "-",
                   text::pct(L.mass_prefill), s.decode_steps > 0 ? text::pct(L.mass_decode) : "-",
                   text::fix(1e3 * (L.decide_s + L.attention_s + L.other_s), 1)});
        }
        t.print(f, "  ");
    }
}

inline void print_sweep_table(std::FILE* f, const Scenario& s, const RunResult& r) {
    const bool res = r.residual;
    std::vector<std::string> h1 = {"policy", "value", "kept", "FLOPs", "FLOPs", "KV bytes", "NMSE", "NMSE", "mass"};
    std::vector<std::string> h2 = {"", "", "(KV)", "(all)", "decode", "(end)", "prefill", "decode", "decode"};
    if (res) {
        h1.insert(h1.end(), {"hidden", "tokens", "KL to"});
        h2.insert(h2.end(), {"NMSE", "agree", "dense"});
    }
    text::Table t(h1, h2);
    for (const auto& p : r.runs) {
        std::vector<std::string> row = {p.sweep_of.empty() ? p.label : p.sweep_of,
                                        p.sweep_value.empty() ? "-" : p.sweep_value,
                                        text::pct(p.kept_ratio()),
                                        text::pct(p.flops_ratio()),
                                        s.decode_steps > 0 ? text::pct(p.decode_flops_ratio()) : "-",
                                        text::pct(p.kv_ratio_end()),
                                        text::sci(p.prefill_nmse()),
                                        s.decode_steps > 0 ? text::sci(p.decode_nmse()) : "-",
                                        s.decode_steps > 0 ? text::pct(p.mass_decode()) : text::pct(p.mass_prefill())};
        if (res) {
            row.push_back(text::sci(p.final_hidden_err.value()));
            row.push_back(text::agree(p.tokens_agree, p.tokens.size()));
            row.push_back(text::sci(p.kl_to_dense()));
        }
        t.row(row);
    }
    t.print(f);
}

}  // namespace vlsparse::sim
