// vlsparse/sim/report_html.hpp -- the simulator's self-contained HTML report (inline SVG, no scripts,
// no network): the scenario, the summary table, kept ratio per layer per policy, output NMSE per
// layer, attention FLOPs and KV bytes against dense, fidelity against budget (every point of a
// `compare` sweep, or one point per policy for `run`), which tokens each policy keeps in every layer,
// the BlindSight mask templates of the prompt, per-layer tables and the metric definitions.
// Include: <vlsparse/sim/report_html.hpp>
#pragma once

#include <ctime>
#include <map>
#include <string>
#include <vector>

#include "vlsparse/core/config.hpp"
#include "vlsparse/masks/templates.hpp"
#include "vlsparse/sim/engine.hpp"
#include "vlsparse/sim/report_text.hpp"
#include "vlsparse/sim/scenario.hpp"
#include "vlsparse/sim/svg.hpp"

namespace vlsparse::sim {

namespace detail {

// A table; with drop_empty, a column whose every cell is "" or "-" (e.g. decode columns without decode
// steps) is left out; a header row of empty names is left out.
inline std::string html_table(const std::vector<std::string>& head, const std::vector<std::vector<std::string>>& rows,
                              bool drop_empty = true) {
    std::vector<bool> keep(head.size(), true);
    if (!rows.empty() && drop_empty)
        for (std::size_t i = 1; i < head.size(); ++i) {
            bool empty = true;
            for (const auto& r : rows) empty &= i >= r.size() || r[i].empty() || r[i] == "-";
            keep[i] = !empty;
        }
    bool named = false;
    for (const auto& h : head) named |= !h.empty();
    std::string s = "<div class=\"wide\"><table>";
    if (named) {
        s += "<thead><tr>";
        for (std::size_t i = 0; i < head.size(); ++i)
            if (keep[i]) s += "<th>" + svg::esc(head[i]) + "</th>";
        s += "</tr></thead>";
    }
    s += "<tbody>\n";
    for (const auto& r : rows) {
        s += "<tr>";
        for (std::size_t i = 0; i < r.size(); ++i)
            if (i >= keep.size() || keep[i]) s += (i == 0 ? "<td class=\"l\">" : "<td>") + svg::esc(r[i]) + "</td>";
        s += "</tr>\n";
    }
    return s + "</tbody></table></div>\n";
}

// The report's style sheet: the page fits a 1280 px window (plots scale down, wide tables scroll inside
// their box, long JSON wraps).
inline const char* report_css() {
    return "body{font-family:sans-serif;max-width:1100px;margin:24px auto;padding:0 12px;color:#222}\n"
           "table{border-collapse:collapse;margin:8px 0 16px;font-size:13px}\n"
           "th,td{border:1px solid #ddd;padding:3px 7px;text-align:right}th{background:#f3f3f3}td.l{text-align:left}\n"
           "h2{margin-top:32px;border-bottom:1px solid #ddd}figure{margin:8px 0}figcaption,.note{font-size:12px;color:#555}\n"
           "svg{max-width:100%;height:auto}.wide{max-width:100%;overflow-x:auto}\n"
           ".pair,.grid{display:flex;flex-wrap:wrap;gap:8px}.pair figure{margin:0;flex:1 1 520px;max-width:540px}\n"
           ".grid figure{margin:0;flex:0 1 266px}.masks svg{width:260px;height:auto;margin-right:8px}\n"
           "code{background:#f3f3f3;padding:0 3px;overflow-wrap:anywhere}dt{font-weight:bold;margin-top:6px}\n"
           "summary{overflow-wrap:anywhere}\n";
}

inline std::string now_utc() {
    const std::time_t t = std::time(nullptr);
    char b[64];
    std::strftime(b, sizeof b, "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&t));
    return b;
}

}  // namespace detail

// The report. `command` is "run" or "compare" (compare: runs carry sweep_of / sweep_value).
// `first_screen`: HTML put first, under the title (run: the budget sweep's decision_html, sweep.hpp);
// with it, the one-point-per-policy fidelity plots are left out (the sweep's curves replace them).
inline std::string report_html(const std::string& command, const Scenario& s, const RunResult& r,
                               const std::string& first_screen = "") {
    using svg::esc;
    const bool dec = s.decode_steps > 0;
    const auto& runs = r.runs;
    std::string h;
    h += "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>vlsparse-sim " + esc(command) + ": " +
         esc(s.name) + "</title>\n<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<style>\n" +
         detail::report_css() + "</style></head><body>\n";
    h += "<h1>vlsparse-sim " + esc(command) + ": " + esc(s.name) + "</h1>\n";
    if (!s.description.empty()) h += "<p>" + esc(s.description) + "</p>\n";
    h += first_screen;
    if (!first_screen.empty()) h += "<h2>Scenario</h2>\n";
    h += detail::html_table(
        {"", ""},
        {{"model", std::to_string(s.model.layers) + " layers, H = " + std::to_string(s.model.heads) +
                       " query heads, H_kv = " + std::to_string(s.model.kv_heads) + " KV heads, d = " +
                       std::to_string(s.model.head_dim)},
         {"prompt", "n = " + std::to_string(s.n()) + " tokens: " + s.layout.to_string()},
         {"decode steps", std::to_string(s.decode_steps)},
         {"source", r.source + (r.residual ? " (hidden size " + std::to_string(r.hidden_size) + ")" : "")},
         {"backend", r.device + ", " + std::to_string(r.threads) + " host thread(s)"},
         {"seed", std::to_string(s.seed)},
         {"wall time", text::fix(r.wall_s, 2) + " s (the whole " + command + ", every policy and the dense reference)"},
         {"generated", detail::now_utc() + " by vlsparse-sim " + VLSPARSE_VERSION_STRING},
         {"scenario file", s.file.empty() ? "(built in)" : s.file}});

    // ---- summary table
    h += "<h2>Summary</h2>\n";
    {
        std::vector<std::string> head = {"policy", "value", "kept (KV)", "prefill FLOPs", "decode FLOPs", "KV bytes (end)",
                                         "NMSE prefill", "NMSE decode", "mass prefill", "mass decode"};
        if (r.residual) head.insert(head.end(), {"hidden NMSE", "tokens agree", "KL to dense"});
        head.insert(head.end(), {"time (s)", "attention GFLOP/s"});
        std::vector<std::vector<std::string>> rows;
        for (const auto& p : runs) {
            std::vector<std::string> row = {p.sweep_of.empty() ? p.label : p.sweep_of, p.sweep_value.empty() ? "" : p.sweep_value,
                                            text::pct(p.kept_ratio()), text::pct(p.prefill_flops_ratio()),
                                            dec ? text::pct(p.decode_flops_ratio()) : "-", text::pct(p.kv_ratio_end()),
                                            text::sci(p.prefill_nmse()), dec ? text::sci(p.decode_nmse()) : "-",
                                            text::pct(p.mass_prefill()), dec ? text::pct(p.mass_decode()) : "-"};
            if (r.residual) {
                row.push_back(text::sci(p.final_hidden_err.value()));
                row.push_back(text::agree(p.tokens_agree, p.tokens.size()));
                row.push_back(text::sci(p.kl_to_dense()));
            }
            row.push_back(text::fix(p.wall_s(), 2));
            row.push_back(text::fix(p.gflops(s.model.head_dim), 1));
            rows.push_back(row);
        }
        h += detail::html_table(head, rows);
    }

    // ---- per layer plots (one series per run; a compare run shows every sweep point)
    // One colour per policy: the runs of one sweep share it, and only the first is in the legend.
    std::vector<std::size_t> group_of(runs.size());
    std::vector<bool> first_of_group(runs.size());
    {
        std::map<std::string, std::size_t> g;
        for (std::size_t k = 0; k < runs.size(); ++k) {
            const std::string key = runs[k].sweep_of.empty() ? runs[k].label : runs[k].sweep_of;
            first_of_group[k] = !g.count(key);
            if (first_of_group[k]) g[key] = g.size();
            group_of[k] = g[key];
        }
    }
    const bool sweep = command == "compare";
    // Small multiples: one panel per policy (the dense reference left out: 100% and NMSE 0 by
    // construction), every panel on the same axes; a compare run draws each sweep value as a line.
    auto multiples = [&](const std::string& title, auto value, svg::ChartOptions o, const std::string& caption) {
        double lo = INFINITY, hi = -INFINITY;
        for (std::size_t k = 1; k < runs.size(); ++k)
            for (const auto& L : runs[k].layers) {
                const double v = value(L);
                if (!std::isfinite(v) || (o.log_y && v <= 0)) continue;
                lo = std::min(lo, v), hi = std::max(hi, v);
            }
        if (std::isfinite(lo)) {
            if (!std::isfinite(o.y_min)) o.y_min = lo;
            if (!std::isfinite(o.y_max)) o.y_max = hi;
        }
        o.legend = false;
        o.width = 266;
        o.height = 190;
        std::string out = "<h3>" + esc(title) + "</h3>\n<div class=\"grid\">\n";
        for (std::size_t k = 1; k < runs.size(); ++k) {
            if (!first_of_group[k]) continue;
            std::vector<svg::Series> ser;
            for (std::size_t j = 1; j < runs.size(); ++j) {
                if (group_of[j] != group_of[k]) continue;
                svg::Series se;
                se.name = runs[j].label;
                se.colour = svg::color(group_of[j]);
                se.marker = static_cast<int>(group_of[j] % 7);
                se.point_labels.assign(runs[j].layers.size(), runs[j].sweep_value);
                for (const auto& L : runs[j].layers) {
                    se.x.push_back(static_cast<double>(L.layer));
                    se.y.push_back(value(L));
                }
                ser.push_back(se);
            }
            svg::ChartOptions oo = o;
            oo.title = sweep && !runs[k].sweep_of.empty() ? runs[k].sweep_of : runs[k].label;
            out += "<figure class=\"panel\" data-policy=\"" + esc(oo.title) + "\">" + svg::line_chart(ser, oo) + "</figure>\n";
        }
        return out + "</div>\n" + (caption.empty() ? "" : "<p class=\"note\">" + caption + "</p>\n");
    };
    h += "<h2>Per layer</h2>\n<p class=\"note\">One panel per policy, all on the same axes" +
         std::string(sweep ? "; one line per sweep value (hover a point for its value)" : "") + ".</p>\n";
    {
        svg::ChartOptions o;
        o.xlabel = "layer";
        o.integer_x = true;
        o.ylabel = "kept pairs";
        o.percent_y = true;
        o.y_min = 0;
        o.y_max = 1;
        h += multiples("Kept ratio of the KV cache after the prefill", [](const LayerMetrics& L) { return L.kept_ratio; }, o, "");
        o = {};
        o.xlabel = "layer";
        o.integer_x = true;
        o.ylabel = "NMSE (log)";
        o.log_y = true;
        h += multiples("Prefill output NMSE against dense", [](const LayerMetrics& L) { return L.prefill_err.value(); }, o,
                       "Over the outputs each policy computes; a layer whose outputs equal dense (NMSE 0) is a hollow "
                       "marker on the row marked 0.");
        if (dec) {
            h += multiples("Decode output NMSE against dense", [](const LayerMetrics& L) { return L.decode_err.value(); }, o, "");
            o = {};
            o.xlabel = "layer";
            o.integer_x = true;
            o.ylabel = "mass retained";
            o.percent_y = true;
            o.y_max = 1;
            h += multiples("Dense attention mass on the keys each decode step reads",
                           [](const LayerMetrics& L) { return L.mass_decode; }, o, "");
        }
    }

    // ---- cost bars
    h += "<h2>Cost against dense</h2>\n";
    {
        std::vector<std::string> cats;
        std::vector<std::vector<double>> vals(3);
        for (const auto& p : runs) {
            cats.push_back(p.label);
            vals[0].push_back(p.prefill_flops_ratio());
            vals[1].push_back(dec ? p.decode_flops_ratio() : NAN);
            vals[2].push_back(p.kv_ratio_end());
        }
        svg::ChartOptions o;
        o.title = "Attention FLOPs and KV-cache bytes, % of dense";
        o.ylabel = "% of dense";
        o.percent_y = true;
        o.height = 320;
        h += "<figure>" + svg::bar_chart(cats, {"prefill FLOPs", "decode FLOPs", "KV bytes (end)"}, vals, o) +
             "<figcaption>Attention FLOPs count the (query, key) pairs the attention kernels compute (4 d FLOPs per "
             "pair); a policy's own scoring (probes, last-row scores) is in its wall time, not here.</figcaption></figure>\n";
    }

    // ---- attention time on the backend
    if (!runs.empty()) {
        h += "<h2>Attention time on " + esc(r.device) + "</h2>\n";
        const PolicyResult& dense = runs[0];
        auto speedup = [](double dense_s, double t) { return t > 0 ? text::fix(dense_s / t, 2) + "x" : std::string("-"); };
        std::vector<std::vector<std::string>> rows;
        for (const auto& p : runs)
            rows.push_back({p.label, text::fix(1e3 * p.prefill_attention_s(), 2), text::fix(p.prefill_tflops(s.model.head_dim), 1),
                            speedup(dense.prefill_attention_s(), p.prefill_attention_s()),
                            dec ? text::fix(1e3 * p.decode_attention_s(), 2) : "-", dec ? text::fix(p.decode_gbps(), 1) : "-",
                            dec ? speedup(dense.decode_attention_s(), p.decode_attention_s()) : "-"});
        h += detail::html_table({"policy", "prefill attention (ms)", "prefill TF/s", "prefill x dense",
                                 "decode attention (ms)", "decode GB/s", "decode x dense"},
                                rows);
        h += "<p class=\"note\">The attention's own time over all layers (on a GPU the kernels' time, by CUDA events): "
             "TF/s on the (query, key) pairs computed (4 d FLOPs per pair), GB/s of the K and V rows the decode steps "
             "read; x dense = the dense run's time over the policy's.</p>\n";
        const double L = static_cast<double>(std::max<std::size_t>(dense.layers.size(), 1));
        svg::ChartOptions o;
        o.xlabel = "layer";
        o.integer_x = true;
        o.ylabel = "ms";
        o.y_min = 0;
        h += multiples("Prefill attention time per layer (ms)",
                       [](const LayerMetrics& x) { return 1e3 * x.prefill_attention_s; }, o,
                       "Dense: " + text::fix(1e3 * dense.prefill_attention_s() / L, 2) + " ms per layer on average.");
        if (dec)
            h += multiples("Decode attention time per layer, all steps (ms)",
                           [](const LayerMetrics& x) { return 1e3 * x.decode_attention_s; }, o,
                           "Dense: " + text::fix(1e3 * dense.decode_attention_s() / L, 2) + " ms per layer on average.");
    }

    // ---- fidelity against budget (run with the sweep: the first section has the curves)
    if (!first_screen.empty())
        h += "<h2>Fidelity against budget</h2>\n<p>Curves per policy, the Pareto front and the best policy at each budget: "
             "<a href=\"#decide\">the first section</a>.</p>\n";
    else {
        h += "<h2>Fidelity against budget</h2>\n";
    {
        // One series per policy (a compare sweep: one point per value), sorted by the x value.
        auto fidelity = [&](auto xval, auto yval) {
            std::map<std::string, std::size_t> index;
            std::vector<svg::Series> out;
            for (std::size_t k = 1; k < runs.size(); ++k) {
                const auto& p = runs[k];
                const std::string key = p.sweep_of.empty() ? p.label : p.sweep_of;
                if (!index.count(key)) {
                    index[key] = out.size();
                    out.push_back(svg::Series{key, {}, {}, svg::color(group_of[k]), {}, true, true, 3.2, {}, {},
                                              static_cast<int>(group_of[k] % 7), 1.5, ""});
                }
                auto& se = out[index[key]];
                se.x.push_back(xval(p));
                se.y.push_back(yval(p));
                se.point_labels.push_back(p.sweep_value);
            }
            for (auto& se : out) {
                std::vector<std::size_t> o(se.x.size());
                for (std::size_t i = 0; i < o.size(); ++i) o[i] = i;
                std::sort(o.begin(), o.end(), [&](std::size_t a, std::size_t b) { return se.x[a] < se.x[b]; });
                svg::Series t{se.name, {}, {}, se.colour, {}, true, true, 3.2, {}, {}, se.marker, 1.5, ""};
                for (auto i : o) {
                    t.x.push_back(se.x[i]);
                    t.y.push_back(se.y[i]);
                    t.point_labels.push_back(se.point_labels[i]);
                }
                se = t;
            }
            return out;
        };
        auto nmse = [&](const PolicyResult& p) { return dec ? p.decode_nmse() : p.prefill_nmse(); };
        auto mass = [&](const PolicyResult& p) { return dec ? p.mass_decode() : p.mass_prefill(); };
        auto kv = [](const PolicyResult& p) { return p.kv_ratio_end(); };
        auto pflops = [](const PolicyResult& p) { return p.prefill_flops_ratio(); };
        auto pnmse = [](const PolicyResult& p) { return p.prefill_nmse(); };
        const std::string what = dec ? "Decode" : "Prefill";
        svg::ChartOptions o;
        o.xlabel = "KV-cache bytes at the end, % of dense";
        o.ylabel = "NMSE (log)";
        o.log_y = true;
        o.percent_x = true;
        o.x_min = 0;
        o.x_max = 1;
        o.title = what + " output NMSE against the KV-cache budget";
        h += "<figure>" + svg::line_chart(fidelity(kv, nmse), o) +
             "<figcaption>A policy whose outputs equal dense (NMSE 0) is a hollow marker on the row marked 0.</figcaption></figure>\n";
        o.title = std::string("Dense attention mass retained (") + (dec ? "decode steps" : "last prompt token") +
                  ") against the KV-cache budget";
        o.ylabel = "mass retained";
        o.log_y = false;
        o.percent_y = true;
        o.y_min = 0;
        o.y_max = 1;
        h += "<figure>" + svg::line_chart(fidelity(kv, mass), o) + "</figure>\n";
        o = {};
        o.title = "Prefill output NMSE against prefill attention FLOPs";
        o.xlabel = "prefill attention FLOPs, % of dense";
        o.ylabel = "NMSE (log)";
        o.log_y = true;
        o.percent_x = true;
        o.x_min = 0;
        o.x_max = 1;
        h += "<figure>" + svg::line_chart(fidelity(pflops, pnmse), o) +
             "<figcaption>Policies that only evict after a dense prefill (H2O, SnapKV, StreamingLLM, A-VL, PureKV "
             "without ST masks, random, fixed ratio) spend 100% of the prefill FLOPs and change no prefill output "
             "(NMSE 0): hollow markers on the row marked 0 (in plain mode).</figcaption></figure>\n";
        if (command != "compare")
            h += "<p>One point per policy. <code>vlsparse-sim compare</code> sweeps each policy's budget or threshold "
                 "and draws a curve per policy.</p>\n";
    }
    }

    // ---- kept tokens per layer
    h += "<h2>Which tokens each policy keeps</h2>\n<p>Rows are layers, columns are positions of the prompt (binned); "
         "darker = a larger share of the bin's (KV head, position) pairs kept in the cache after the prefill. "
         "The marks below show the image and video segments.</p>\n<div class=\"kept\">\n";
    {
        std::vector<svg::ColumnMark> marks;
        const double n = static_cast<double>(s.n());
        const double B = runs.empty() || runs[0].layers.empty() ? 1.0 : static_cast<double>(runs[0].layers[0].kept_bins.size());
        for (const auto& seg : s.layout.segments())
            if (seg.is_visual())
                marks.push_back({static_cast<double>(seg.start) * B / n, static_cast<double>(seg.end()) * B / n,
                                 seg.kind == SegmentKind::video ? "#5aa55a" : "#3a7dc9",
                                 std::string(to_string(seg.kind)) + " at " + std::to_string(seg.start)});
        for (std::size_t k = 0; k < runs.size(); ++k) {
            std::vector<std::vector<float>> rows;
            std::vector<std::string> labels;
            for (const auto& L : runs[k].layers) {
                rows.push_back(L.kept_bins);
                labels.push_back("layer " + std::to_string(L.layer));
            }
            h += "<figure>" + svg::heat_rows(rows, labels, marks, runs[k].label + " (kept " + text::pct(runs[k].kept_ratio()) + ")",
                                             std::max(1, 768 / std::max(1, static_cast<int>(B))), 9) +
                 "</figure>\n";
        }
    }
    h += "</div>\n";

    // ---- mask templates
    bool visual = false, blindsight = false;
    for (const auto& seg : s.layout.segments()) visual |= seg.is_visual();
    for (const auto& p : runs) blindsight |= p.name == "blindsight";
    if (visual && blindsight) {
        h += "<h2>Mask templates of this prompt (BlindSight)</h2>\n<p>Query (rows) x key (columns), binned; darker = "
             "larger share of allowed pairs. Text rows and columns stay dense; the marks show the images.</p>\n"
             "<div class=\"masks\">\n";
        const MaskContext ctx = make_mask_context(s.layout);
        for (MaskTemplate t : kAllTemplates) h += svg::binned_mask(ctx, t, 160, 2);
        h += "</div>\n";
    }

    // ---- per layer tables
    h += "<h2>Per-layer tables</h2>\n";
    for (std::size_t k = 0; k < runs.size(); ++k) {
        const auto& p = runs[k];
        h += "<details><summary>" + esc(p.label) + " &mdash; params <code>" + esc(p.params.dump()) + "</code></summary>\n";
        std::vector<std::vector<std::string>> rows;
        for (const auto& L : p.layers)
            rows.push_back({std::to_string(L.layer), std::to_string(L.rows), L.prefill_kind, text::pct(L.kept_ratio),
                            text::pct(L.dense_prefill_pairs > 0 ? L.prefill_pairs / L.dense_prefill_pairs : 0.0),
                            dec ? text::pct(L.dense_decode_pairs > 0 ? L.decode_pairs / L.dense_decode_pairs : 0.0) : "-",
                            text::pct(L.dense_kv_bytes_end > 0 ? L.kv_bytes_end / L.dense_kv_bytes_end : 0.0),
                            text::sci(L.prefill_err.value()), dec ? text::sci(L.decode_err.value()) : "-",
                            text::pct(L.mass_prefill), dec ? text::pct(L.mass_decode) : "-",
                            text::fix(1e3 * L.decide_s, 1), text::fix(1e3 * L.attention_s, 1)});
        h += detail::html_table({"layer", "rows", "prefill attention", "kept (KV)", "prefill FLOPs", "decode FLOPs",
                                 "KV bytes (end)", "NMSE prefill", "NMSE decode", "mass prefill", "mass decode",
                                 "policy ms", "attention ms"},
                                rows);
        h += "</details>\n";
    }

    // ---- definitions
    h += "<h2>Definitions</h2>\n<dl>\n"
         "<dt>kept (KV)</dt><dd>Share of the (KV head, prompt position) pairs a layer's cache holds after the prefill, "
         "mean over layers.</dd>\n"
         "<dt>prefill / decode FLOPs</dt><dd>(query, key) pairs the attention computes (dense: n(n+1)/2 per head; "
         "token-sparse: over the kept set; masked: the mask's allowed pairs; decode: the positions each step reads), "
         "summed over heads and layers, as a share of the dense run's.</dd>\n"
         "<dt>KV bytes (end)</dt><dd>Bytes of K and V in every layer's cache after the last decode step, as a share "
         "of the dense cache (n + S tokens).</dd>\n"
         "<dt>NMSE prefill / decode</dt><dd>||O - O_dense||<sup>2</sup> / ||O_dense||<sup>2</sup> of the attention "
         "outputs the policy computes, per layer, mean over layers. Rows a token-sparse prefill leaves at zero and rows "
         "that left the sequence are not outputs.</dd>\n"
         "<dt>mass prefill / decode</dt><dd>The dense run's attention probability (mean over query heads) of the last "
         "prompt token on the keys the cache keeps, and of each decode token on the keys its step reads.</dd>\n"
         "<dt>hidden NMSE, tokens agree, KL to dense</dt><dd>Residual mode: NMSE of the final-layer hidden states (last "
         "prompt token and every decode token) against the dense run; the share of the S + 1 LM-head tokens equal to the "
         "dense run's, with the count (every run is fed the dense run's tokens); and the mean over the same S + 1 points "
         "of KL(p_dense || p) between the LM head's softmax distributions, in nats.</dd>\n"
         "<dt>time, GFLOP/s</dt><dd>Wall time spent on the policy (its decisions, attention, cache updates); attention "
         "FLOPs (4 d per pair) divided by the time inside the attention kernels.</dd>\n"
         "<dt>attention time, TF/s, GB/s</dt><dd>The prefill and decode attention's own time over all layers (CUDA "
         "events on the cuda backend); prefill TF/s on the pairs computed, decode GB/s of the K and V rows read.</dd>\n"
         "</dl>\n<p>docs/simulator.md has the full definitions.</p>\n</body></html>\n";
    return h;
}

}  // namespace vlsparse::sim
