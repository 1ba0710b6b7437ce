// vlsparse/sim/sweep.hpp -- `vlsparse-sim sweep`: every policy over its budget sweep (the runs `compare`
// makes: sweep_policies, the scenario's or the registry's default sweep), for several seeds, with each
// fidelity metric interpolated to common budgets so that policies compare at matched cost.
//
//   run_sweep(s, opt)        for seed s.seed + i, i < opt.seeds: the compare runs of the scenario with
//                            that seed (one dense reference + every sweep point); one SweepPoint per
//                            (policy, sweep value, seed)
//   sweep_curves(points)     per (policy, metric, budget b): each seed's curve (the policy's points of that
//                            seed, sorted by the axis: kept ratio or attention FLOPs) interpolated at b
//                            (interpolate()), then mean / min / max over the seeds whose curve reaches b
//   interpolate(x, y, b)     piecewise linear between the two points that bracket b (x sorted ascending);
//                            on log10(y) for NMSE and KL (when both ends are > 0); exact at a point;
//                            nullopt outside [x_first, x_last] (no extrapolation)
// Text, JSON and HTML outputs: print_sweep_tables, sweep_json, sweep_html.
// Include: <vlsparse/sim/sweep.hpp>
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "vlsparse/core/config.hpp"
#include "vlsparse/sim/engine.hpp"
#include "vlsparse/sim/report_html.hpp"
#include "vlsparse/sim/report_json.hpp"
#include "vlsparse/sim/report_text.hpp"
#include "vlsparse/sim/scenario.hpp"
#include "vlsparse/sim/svg.hpp"

namespace vlsparse::sim {

enum class SweepAxis : std::uint8_t { kept, flops };

inline const char* to_string(SweepAxis a) { return a == SweepAxis::kept ? "kept" : "flops"; }

struct SweepOptions {
    std::vector<double> budgets = {0.1, 0.2, 0.3, 0.45, 0.5};  // fractions of dense, in (0, 1]
    std::int64_t seeds = 3;                                    // seeds s.seed, s.seed + 1, ...
    SweepAxis axis = SweepAxis::kept;                          // kept ratio (KV) or attention FLOPs (all)
};

// One policy at one sweep value and one seed.
struct SweepPoint {
    std::string policy;  // the swept policy's label
    std::string value;   // the sweep value's text ("" without a sweep)
    std::uint64_t seed = 0;
    double kept = 0, flops = 0, decode_flops = 0, kv_end = 0;
    double prefill_nmse = 0, decode_nmse = 0, mass_prefill = 0, mass_decode = 0;
    double hidden_nmse = NAN, token_agreement = NAN, kl = NAN;  // residual mode only
    std::int64_t tokens_agree = 0, tokens = 0;
    double x(SweepAxis a) const { return a == SweepAxis::kept ? kept : flops; }
};

struct SweepMetric {
    const char* key;    // JSON name
    const char* title;  // table and plot title
    bool log;           // interpolated (and plotted) on a log scale
    bool percent;       // a share of 1
    bool residual_only, decode_only;
    double SweepPoint::*field;
};

inline const std::vector<SweepMetric>& sweep_metrics() {
    static const std::vector<SweepMetric> m = {
        {"decode_nmse", "NMSE decode", true, false, false, true, &SweepPoint::decode_nmse},
        {"prefill_nmse", "NMSE prefill", true, false, false, false, &SweepPoint::prefill_nmse},
        {"mass_decode", "mass decode", false, true, false, true, &SweepPoint::mass_decode},
        {"token_agreement", "tokens agree", false, true, true, false, &SweepPoint::token_agreement},
        {"kl_to_dense", "KL to dense (nats)", true, false, true, false, &SweepPoint::kl},
        {"hidden_nmse", "hidden NMSE", true, false, true, false, &SweepPoint::hidden_nmse},
    };
    return m;
}

// The metrics that apply to a scenario (decode metrics need decode steps, residual ones a residual source).
inline std::vector<const SweepMetric*> sweep_metrics_for(bool residual, bool decode) {
    std::vector<const SweepMetric*> r;
    for (const auto& m : sweep_metrics())
        if ((!m.residual_only || residual) && (!m.decode_only || decode)) r.push_back(&m);
    return r;
}

// y at b on the piecewise-linear curve through (x[i], y[i]), x ascending (see the header comment).
inline std::optional<double> interpolate(std::span<const double> x, std::span<const double> y, double b, bool log) {
    if (x.empty() || x.size() != y.size() || !(b >= x.front() && b <= x.back())) return std::nullopt;
    for (std::size_t i = 0; i < x.size(); ++i)
        if (x[i] == b) return std::isfinite(y[i]) ? std::optional<double>(y[i]) : std::nullopt;
    std::size_t i = 0;
    while (i + 1 < x.size() && x[i + 1] < b) ++i;  // x[i] < b < x[i + 1]
    const double x0 = x[i], x1 = x[i + 1], y0 = y[i], y1 = y[i + 1];
    if (!std::isfinite(y0) || !std::isfinite(y1)) return std::nullopt;
    const double f = (b - x0) / (x1 - x0);
    if (log && y0 > 0 && y1 > 0) return std::pow(10.0, std::log10(y0) + f * (std::log10(y1) - std::log10(y0)));
    return y0 + f * (y1 - y0);
}

// Mean and spread over the seeds whose curve reaches the budget.
struct SweepCell {
    double budget = 0;
    double mean = NAN, min = NAN, max = NAN;
    std::int64_t seeds = 0;  // how many seeds' curves reach the budget
};

struct SweepCurve {
    std::string policy;
    const SweepMetric* metric = nullptr;
    std::vector<SweepCell> cells;  // one per budget
};

struct SweepResult {
    SweepOptions opt;
    std::vector<std::uint64_t> seeds;
    std::vector<std::string> policies;  // in scenario order (the dense reference first)
    std::vector<SweepPoint> points;
    std::vector<SweepCurve> curves;     // per policy, per metric that applies
    bool residual = false, decode = false;
    double wall_s = 0;
    std::string source;  // of the first seed
    int threads = 1;
};

inline void check_sweep_options(const SweepOptions& o, const char* fn) {
    if (o.seeds < 1 || o.seeds > 1000)
        throw ::vlsparse::error(fn, "--seeds " + std::to_string(o.seeds) + ", expected 1 <= seeds <= 1000");
    if (o.budgets.empty()) throw ::vlsparse::error(fn, "--budgets: no budget given, expected e.g. 0.1,0.2,0.3");
    for (std::size_t i = 0; i < o.budgets.size(); ++i) {
        const double b = o.budgets[i];
        if (!(b > 0.0 && b <= 1.0))
            throw ::vlsparse::error(fn, "--budgets: " + text::fix(b, 6) + " is not in (0, 1] (budgets are fractions of dense, "
                                         "e.g. 0.1 for 10%)");
        if (i > 0 && !(b > o.budgets[i - 1]))
            throw ::vlsparse::error(fn, "--budgets: expected increasing budgets, got " + text::fix(o.budgets[i - 1], 6) +
                                         " then " + text::fix(b, 6));
    }
}

// The curves of a set of points (every point of one policy and one seed is one curve).
inline std::vector<SweepCurve> sweep_curves(const std::vector<SweepPoint>& points, const std::vector<std::string>& policies,
                                            const SweepOptions& opt, bool residual, bool decode) {
    std::vector<SweepCurve> out;
    for (const auto& pol : policies) {
        std::map<std::uint64_t, std::vector<const SweepPoint*>> by_seed;
        for (const auto& p : points)
            if (p.policy == pol) by_seed[p.seed].push_back(&p);
        for (auto& [seed, v] : by_seed)
            std::stable_sort(v.begin(), v.end(), [&](const SweepPoint* a, const SweepPoint* b) { return a->x(opt.axis) < b->x(opt.axis); });
        for (const SweepMetric* m : sweep_metrics_for(residual, decode)) {
            SweepCurve c{pol, m, {}};
            for (double b : opt.budgets) {
                SweepCell cell;
                cell.budget = b;
                double sum = 0;
                for (const auto& [seed, v] : by_seed) {
                    std::vector<double> x, y;
                    for (const SweepPoint* p : v) {
                        x.push_back(p->x(opt.axis));
                        y.push_back(p->*(m->field));
                    }
                    const auto val = interpolate(x, y, b, m->log);
                    if (!val) continue;
                    sum += *val;
                    cell.min = cell.seeds == 0 ? *val : std::min(cell.min, *val);
                    cell.max = cell.seeds == 0 ? *val : std::max(cell.max, *val);
                    ++cell.seeds;
                }
                if (cell.seeds > 0) cell.mean = sum / static_cast<double>(cell.seeds);
                c.cells.push_back(cell);
            }
            out.push_back(std::move(c));
        }
    }
    return out;
}

inline SweepPoint sweep_point(const PolicyResult& p, std::uint64_t seed, bool residual) {
    SweepPoint q;
    q.policy = p.sweep_of.empty() ? p.label : p.sweep_of;
    q.value = p.sweep_value;
    q.seed = seed;
    q.kept = p.kept_ratio();
    q.flops = p.flops_ratio();
    q.decode_flops = p.decode_flops_ratio();
    q.kv_end = p.kv_ratio_end();
    q.prefill_nmse = p.prefill_nmse();
    q.decode_nmse = p.decode_nmse();
    q.mass_prefill = p.mass_prefill();
    q.mass_decode = p.mass_decode();
    if (residual) {
        q.hidden_nmse = p.final_hidden_err.value();
        q.token_agreement = p.token_agreement();
        q.kl = p.kl_to_dense();
        q.tokens_agree = p.tokens_agree;
        q.tokens = static_cast<std::int64_t>(p.tokens.size());
    }
    return q;
}

// The sweep: for every seed, the compare runs of the scenario (commands.hpp's sweep_policies, passed
// in as `make_runs` so this header does not depend on the command layer).
template <class MakeRuns>
SweepResult run_sweep(const Scenario& s, const SweepOptions& opt, MakeRuns&& make_runs, Progress* progress = nullptr) {
    check_sweep_options(opt, "vlsparse-sim sweep");
    SweepResult R;
    R.opt = opt;
    R.decode = s.decode_steps > 0;
    const auto t0 = detail::clock::now();
    for (std::int64_t i = 0; i < opt.seeds; ++i) {
        Scenario si = s;
        si.seed = s.seed + static_cast<std::uint64_t>(i);
        std::vector<PolicyToRun> runs = make_runs(si);
        check_memory(si, runs.size() + 1);
        EngineOptions eo;
        eo.progress = progress;
        const RunResult r = run_engine(si, std::move(runs), eo);
        if (i == 0) {
            R.residual = r.residual;
            R.source = r.source;
            R.threads = r.threads;
        }
        R.seeds.push_back(si.seed);
        for (const auto& p : r.runs) {
            SweepPoint q = sweep_point(p, si.seed, r.residual);
            if (std::find(R.policies.begin(), R.policies.end(), q.policy) == R.policies.end()) R.policies.push_back(q.policy);
            R.points.push_back(std::move(q));
        }
    }
    R.curves = sweep_curves(R.points, R.policies, opt, R.residual, R.decode);
    R.wall_s = detail::since(t0);
    return R;
}

namespace detail {

inline std::string sweep_value_text(const SweepMetric& m, double v) {
    return m.percent ? text::pct(v) : text::sci(v);
}

// "3.27e-02 ±9%" (NMSE, KL: half the range over the seeds, relative to the mean) or "83.7% ±1.2"
// (shares: half the range in percentage points); "-" where no seed's curve reaches the budget; a
// trailing "(k/N)" when only k of the N seeds reach it.
inline std::string sweep_cell_text(const SweepMetric& m, const SweepCell& c, std::int64_t seeds) {
    if (c.seeds == 0) return "-";
    std::string s = sweep_value_text(m, c.mean);
    if (seeds > 1 && c.seeds > 1 && c.max > c.min) {
        const double half = (c.max - c.min) / 2.0;
        if (m.percent) s += " ±" + text::fix(100.0 * half, 1);
        else s += " ±" + (c.mean > 0 ? text::fix(100.0 * half / c.mean, 0) + "%" : text::sci(half));
    }
    if (c.seeds < seeds) s += " (" + std::to_string(c.seeds) + "/" + std::to_string(seeds) + ")";
    return s;
}

inline bool reaches_any(const SweepCurve& c) {
    for (const auto& x : c.cells)
        if (x.seeds > 0) return true;
    return false;
}

// The policies whose curves reach none of the budgets, as one line (or "").
inline std::string out_of_range_note(const SweepResult& R) {
    std::string names;
    for (const auto& p : R.policies) {
        bool any = false;
        for (const auto& c : R.curves) any |= c.policy == p && reaches_any(c);
        if (!any) names += (names.empty() ? "" : ", ") + p;
    }
    if (names.empty()) return "";
    return "not shown (no sweep point within the budgets on this axis): " + names +
           (R.opt.axis == SweepAxis::kept ? " (BlindSight and dense keep every token: see --x flops)" : "");
}

inline std::string axis_text(SweepAxis a) {
    return a == SweepAxis::kept ? "kept ratio (KV)" : "attention FLOPs (prefill + decode)";
}

}  // namespace detail

inline void print_sweep_tables(std::FILE* f, const SweepResult& R) {
    const auto N = static_cast<std::int64_t>(R.seeds.size());
    std::fprintf(f, "points (every policy and sweep value, mean over %lld seed(s))\n", static_cast<long long>(N));
    {
        std::vector<std::string> h1 = {"policy", "value", "kept", "FLOPs", "FLOPs", "NMSE", "NMSE", "mass"};
        std::vector<std::string> h2 = {"", "", "(KV)", "(all)", "decode", "prefill", "decode", "decode"};
        if (R.residual) {
            h1.insert(h1.end(), {"tokens", "KL to"});
            h2.insert(h2.end(), {"agree", "dense"});
        }
        text::Table t(h1, h2);
        std::vector<std::pair<std::string, std::string>> keys;
        for (const auto& p : R.points)
            if (std::find(keys.begin(), keys.end(), std::make_pair(p.policy, p.value)) == keys.end()) keys.emplace_back(p.policy, p.value);
        for (const auto& [pol, val] : keys) {
            SweepPoint m;
            double k = 0;
            std::int64_t agree = 0, tokens = 0;
            double kl = 0;
            for (const auto& p : R.points) {
                if (p.policy != pol || p.value != val) continue;
                m.kept += p.kept, m.flops += p.flops, m.decode_flops += p.decode_flops, m.prefill_nmse += p.prefill_nmse;
                m.decode_nmse += p.decode_nmse, m.mass_decode += p.mass_decode;
                agree += p.tokens_agree, tokens += p.tokens;
                if (R.residual) kl += p.kl;
                k += 1;
            }
            std::vector<std::string> row = {pol,
                                            val.empty() ? "-" : val,
                                            text::pct(m.kept / k),
                                            text::pct(m.flops / k),
                                            R.decode ? text::pct(m.decode_flops / k) : "-",
                                            text::sci(m.prefill_nmse / k),
                                            R.decode ? text::sci(m.decode_nmse / k) : "-",
                                            R.decode ? text::pct(m.mass_decode / k) : "-"};
            if (R.residual) {
                row.push_back(text::agree(agree, static_cast<std::size_t>(tokens)));
                row.push_back(text::sci(kl / k));
            }
            t.row(row);
        }
        t.print(f, "  ");
    }
    for (const SweepMetric* m : sweep_metrics_for(R.residual, R.decode)) {
        std::fprintf(f, "\n%s at matched %s (mean over %lld seed(s)%s)\n", m->title, detail::axis_text(R.opt.axis).c_str(),
                     static_cast<long long>(N),
                     N > 1 ? (m->percent ? ", ± half the range in points" : ", ± half the range relative to the mean") : "");
        std::vector<std::string> h1 = {"policy"};
        for (double b : R.opt.budgets) h1.push_back(text::pct(b, b * 100 == std::floor(b * 100) ? 0 : 1));
        text::Table t(h1);
        for (const auto& c : R.curves) {
            if (c.metric != m || !detail::reaches_any(c)) continue;
            std::vector<std::string> row = {c.policy};
            for (const auto& cell : c.cells) row.push_back(detail::sweep_cell_text(*m, cell, N));
            t.row(row);
        }
        t.print(f, "  ");
    }
    if (const std::string note = detail::out_of_range_note(R); !note.empty()) std::fprintf(f, "\n%s\n", note.c_str());
    std::fprintf(f, "\n'-': the policy's sweep does not reach that budget on any seed (no extrapolation); (k/N): only k of\n"
                    "the N seeds reach it. Values between two sweep points are interpolated linearly in the budget (NMSE and\n"
                    "KL on a log scale).\n");
}

inline json sweep_json(const Scenario& s, const SweepResult& R) {
    using detail::finite_or_null;
    json pts = json::array();
    for (const auto& p : R.points) {
        json q = {{"policy", p.policy},        {"value", p.value},
                  {"seed", p.seed},            {"kept_ratio", p.kept},
                  {"flops_ratio", p.flops},    {"decode_flops_ratio", p.decode_flops},
                  {"kv_ratio_end", p.kv_end},  {"prefill_nmse", finite_or_null(p.prefill_nmse)},
                  {"decode_nmse", finite_or_null(p.decode_nmse)}, {"mass_prefill", p.mass_prefill},
                  {"mass_decode", p.mass_decode}};
        if (R.residual) {
            q["hidden_nmse"] = finite_or_null(p.hidden_nmse);
            q["token_agreement"] = p.token_agreement;
            q["tokens_agree"] = p.tokens_agree;
            q["tokens"] = p.tokens;
            q["kl_to_dense"] = finite_or_null(p.kl);
        }
        pts.push_back(q);
    }
    json curves = json::array();
    for (const auto& c : R.curves) {
        json cells = json::array();
        for (const auto& x : c.cells)
            cells.push_back({{"budget", x.budget},
                             {"mean", finite_or_null(x.mean)},
                             {"min", finite_or_null(x.min)},
                             {"max", finite_or_null(x.max)},
                             {"seeds", x.seeds}});
        curves.push_back({{"policy", c.policy}, {"metric", c.metric->key}, {"cells", cells}});
    }
    return json{{"format", "vlsparse.sim.sweep"},
                {"version", 1},
                {"generator", std::string("vlsparse-sim ") + VLSPARSE_VERSION_STRING},
                {"scenario", to_json(s)},
                {"source", R.source},
                {"threads", R.threads},
                {"wall_s", R.wall_s},
                {"axis", to_string(R.opt.axis)},
                {"budgets", R.opt.budgets},
                {"seeds", R.seeds},
                {"residual", R.residual},
                {"points", pts},
                {"curves", curves}};
}

inline std::string sweep_html(const Scenario& s, const SweepResult& R) {
    using svg::esc;
    const auto N = static_cast<std::int64_t>(R.seeds.size());
    std::string h;
    h += "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>vlsparse-sim sweep: " + esc(s.name) +
         "</title>\n<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<style>\n" + detail::report_css() +
         "</style></head><body>\n";
    h += "<h1>vlsparse-sim sweep: " + esc(s.name) + "</h1>\n";
    std::string seeds;
    for (auto x : R.seeds) seeds += (seeds.empty() ? "" : ", ") + std::to_string(x);
    h += detail::html_table(
        {"", ""},
        {{"model", std::to_string(s.model.layers) + " layers, H = " + std::to_string(s.model.heads) + ", H_kv = " +
                       std::to_string(s.model.kv_heads) + ", d = " + std::to_string(s.model.head_dim)},
         {"prompt", "n = " + std::to_string(s.n()) + " tokens: " + s.layout.to_string()},
         {"decode steps", std::to_string(s.decode_steps)},
         {"source", R.source},
         {"seeds", seeds},
         {"budget axis", detail::axis_text(R.opt.axis)},
         {"wall time", text::fix(R.wall_s, 2) + " s (" + std::to_string(R.threads) + " thread(s))"},
         {"generated", detail::now_utc() + " by vlsparse-sim " + VLSPARSE_VERSION_STRING},
         {"scenario file", s.file.empty() ? "(built in)" : s.file}});
    h += "<p>Each policy runs over its sweep (as <code>compare</code>) for every seed; each seed's points, sorted by the "
         "budget axis, are interpolated linearly at the common budgets (NMSE and KL on a log scale), never extrapolated. "
         "Curves: the mean over the seeds that reach the budget; bars: min to max over those seeds. Small dots: every "
         "measured point of every seed.</p>\n";
    std::map<std::string, std::size_t> colour;
    for (const auto& p : R.policies) colour.emplace(p, colour.size());
    for (const SweepMetric* m : sweep_metrics_for(R.residual, R.decode)) {
        h += "<h2>" + esc(m->title) + "</h2>\n";
        std::vector<svg::Series> ser;
        for (const auto& c : R.curves) {
            if (c.metric != m || !detail::reaches_any(c)) continue;
            svg::Series se;
            se.name = c.policy;
            se.colour = svg::color(colour[c.policy]);
            for (const auto& x : c.cells) {
                se.x.push_back(x.budget);
                se.y.push_back(x.mean);
                se.y_lo.push_back(x.min);
                se.y_hi.push_back(x.max);
                se.point_labels.push_back(std::to_string(x.seeds) + "/" + std::to_string(N) + " seeds");
            }
            ser.push_back(se);
            svg::Series raw;
            raw.name = c.policy;
            raw.colour = se.colour;
            raw.in_legend = false;
            raw.line = false;
            raw.radius = 1.4;
            for (const auto& p : R.points) {
                if (p.policy != c.policy) continue;
                raw.x.push_back(p.x(R.opt.axis));
                raw.y.push_back(p.*(m->field));
                raw.point_labels.push_back(p.value + " seed " + std::to_string(p.seed));
            }
            ser.push_back(raw);
        }
        svg::ChartOptions o;
        o.title = std::string(m->title) + " at matched budget";
        o.xlabel = detail::axis_text(R.opt.axis) + " against dense";
        o.ylabel = m->title;
        o.percent_x = true;
        o.percent_y = m->percent;
        o.log_y = m->log;
        o.x_min = 0;
        o.x_max = 1;
        o.height = 340;
        h += "<figure>" + svg::line_chart(ser, o) + "<figcaption>" + esc(m->title) +
             " against the budget; an NMSE of exactly 0 has no point on the log scale.</figcaption></figure>\n";
        std::vector<std::string> head = {"policy"};
        for (double b : R.opt.budgets) head.push_back(text::pct(b, b * 100 == std::floor(b * 100) ? 0 : 1));
        std::vector<std::vector<std::string>> rows;
        for (const auto& c : R.curves) {
            if (c.metric != m || !detail::reaches_any(c)) continue;
            std::vector<std::string> row = {c.policy};
            for (const auto& cell : c.cells) row.push_back(detail::sweep_cell_text(*m, cell, N));
            rows.push_back(row);
        }
        h += detail::html_table(head, rows, false);  // a budget no policy reaches keeps its column of '-'
    }
    if (const std::string note = detail::out_of_range_note(R); !note.empty()) h += "<p>" + esc(note) + "</p>\n";
    h += "<p>docs/simulator.md defines every metric and the sweep.</p>\n</body></html>\n";
    return h;
}


// ---- the report's first screen: which policy for a budget (`run` without --no-sweep)
//
//   ranking_metric(residual, decode, axis)  the metric that ranks the policies (lower is better): KL to
//                                     dense in residual mode (it carries every error to the LM head); in
//                                     plain mode, where a layer's error stays in that layer, decode NMSE on
//                                     the kept axis (the cache serves the decode) and prefill NMSE on the
//                                     FLOPs axis (the prefill is most of the FLOPs: BlindSight's dense
//                                     decode has decode NMSE 0 whatever its prefill does)
//   mean_points(R, axis, m)           per (policy, sweep value): x and the metric, means over the seeds
//   pareto_front(R, axis, m)          the mean points no other point beats on both the budget and the metric
//   best_at(curves, m, budgets)       per budget, the policies ranked by the interpolated metric (mean over
//                                     the seeds that reach it); policies that do not reach it are left out
//   decision_html(s, R)               the section: best-at table, the metric against the kept ratio and
//                                     against the attention FLOPs (one curve per policy), the Pareto fronts

inline const SweepMetric* ranking_metric(bool residual, bool decode, SweepAxis axis = SweepAxis::kept) {
    const char* key = residual ? "kl_to_dense" : decode && axis == SweepAxis::kept ? "decode_nmse" : "prefill_nmse";
    for (const auto& m : sweep_metrics())
        if (std::string(m.key) == key) return &m;
    throw ::vlsparse::error("ranking_metric", std::string("no sweep metric '") + key + "'");
}

struct MeanPoint {
    std::string policy, value;
    double x = 0, y = 0;
};

inline std::vector<MeanPoint> mean_points(const SweepResult& R, SweepAxis axis, const SweepMetric* m) {
    std::vector<MeanPoint> out;
    std::vector<double> count;
    for (const auto& p : R.points) {
        const double y = p.*(m->field);
        if (!std::isfinite(y)) continue;
        std::size_t i = 0;
        while (i < out.size() && !(out[i].policy == p.policy && out[i].value == p.value)) ++i;
        if (i == out.size()) out.push_back({p.policy, p.value, 0.0, 0.0}), count.push_back(0.0);
        out[i].x += p.x(axis);
        out[i].y += y;
        count[i] += 1.0;
    }
    for (std::size_t i = 0; i < out.size(); ++i) out[i].x /= count[i], out[i].y /= count[i];
    return out;
}

// Lower metric and lower budget are better; sorted by the budget.
inline std::vector<MeanPoint> pareto_front(const SweepResult& R, SweepAxis axis, const SweepMetric* m) {
    std::vector<MeanPoint> v = mean_points(R, axis, m);
    std::stable_sort(v.begin(), v.end(), [](const MeanPoint& a, const MeanPoint& b) { return a.x < b.x || (a.x == b.x && a.y < b.y); });
    std::vector<MeanPoint> front;
    for (const auto& p : v)
        if (front.empty() || p.y < front.back().y) front.push_back(p);
    return front;
}

struct BestAt {
    double budget = 0;
    std::vector<std::pair<std::string, double>> ranked;  // (policy, mean metric), best first
};

inline std::vector<BestAt> best_at(const std::vector<SweepCurve>& curves, const SweepMetric* m, const std::vector<double>& budgets) {
    std::vector<BestAt> out;
    for (std::size_t b = 0; b < budgets.size(); ++b) {
        BestAt r;
        r.budget = budgets[b];
        for (const auto& c : curves)
            if (c.metric == m && b < c.cells.size() && c.cells[b].seeds > 0 && std::isfinite(c.cells[b].mean))
                r.ranked.emplace_back(c.policy, c.cells[b].mean);
        std::stable_sort(r.ranked.begin(), r.ranked.end(), [](const auto& x, const auto& y) { return x.second < y.second; });
        out.push_back(std::move(r));
    }
    return out;
}

namespace detail {

inline std::string budget_text(double b) { return text::pct(b, b * 100 == std::floor(b * 100) ? 0 : 1); }

inline std::string ranked_text(const BestAt& r, std::size_t i) {
    if (i >= r.ranked.size()) return "-";
    return r.ranked[i].first + " (" + text::sci(r.ranked[i].second) + ")";
}

inline std::string front_text(const std::vector<MeanPoint>& f) {
    std::string s;
    for (const auto& p : f)
        s += (s.empty() ? "" : "; ") + p.policy + (p.value.empty() ? "" : " " + p.value) + " at " + text::pct(p.x) + " (" +
             text::sci(p.y) + ")";
    return s;
}

}  // namespace detail

// The best-at table in the terminal (ranked on both axes).
inline void print_best_at(std::FILE* f, const SweepResult& R) {
    SweepOptions ok = R.opt, of = R.opt;
    ok.axis = SweepAxis::kept;
    of.axis = SweepAxis::flops;
    const SweepMetric* mk = ranking_metric(R.residual, R.decode, SweepAxis::kept);
    const SweepMetric* mf = ranking_metric(R.residual, R.decode, SweepAxis::flops);
    const auto kept = best_at(sweep_curves(R.points, R.policies, ok, R.residual, R.decode), mk, R.opt.budgets);
    const auto flops = best_at(sweep_curves(R.points, R.policies, of, R.residual, R.decode), mf, R.opt.budgets);
    std::fprintf(f, "best policy at a budget (lower is better; interpolated over each policy's sweep, %zu seed(s))\n",
                 R.seeds.size());
    text::Table t({"budget", "best at kept ratio", "next", "best at FLOPs", "next"},
                  {"", std::string("(") + mk->title + ")", "", std::string("(") + mf->title + ")", ""});
    for (std::size_t b = 0; b < kept.size(); ++b)
        t.row({detail::budget_text(kept[b].budget), detail::ranked_text(kept[b], 0), detail::ranked_text(kept[b], 1),
               detail::ranked_text(flops[b], 0), detail::ranked_text(flops[b], 1)});
    t.print(f, "  ");
}

inline std::string decision_html(const SweepResult& R) {
    using svg::esc;
    SweepOptions ok = R.opt, of = R.opt;
    ok.axis = SweepAxis::kept;
    of.axis = SweepAxis::flops;
    const SweepMetric* mk = ranking_metric(R.residual, R.decode, SweepAxis::kept);
    const SweepMetric* mf = ranking_metric(R.residual, R.decode, SweepAxis::flops);
    const auto kept = best_at(sweep_curves(R.points, R.policies, ok, R.residual, R.decode), mk, R.opt.budgets);
    const auto flops = best_at(sweep_curves(R.points, R.policies, of, R.residual, R.decode), mf, R.opt.budgets);
    std::string h = "<section id=\"decide\">\n<h2>Which policy for my budget</h2>\n";
    std::string seeds;
    for (auto x : R.seeds) seeds += (seeds.empty() ? "" : ", ") + std::to_string(x);
    h += "<p>Every policy over its sweep (the runs of <code>compare</code>), " + std::to_string(R.seeds.size()) +
         " seed(s) (" + seeds + "), " + std::to_string(R.points.size()) + " runs in " + text::fix(R.wall_s, 1) +
         " s; ranked by <b>" + esc(mk->title) + "</b> at a KV budget and <b>" + esc(mf->title) + "</b> at a FLOPs budget "
         "(lower is better), interpolated at each budget between the two sweep points around it, never extrapolated" +
         (R.residual ? "" : " (plain mode: a layer's error stays in that layer, so the KV cache is judged by the decode it "
                            "serves and the FLOPs, mostly the prefill's, by the prefill)") +
         ". <code>--no-sweep</code> leaves this section out; <code>vlsparse-sim sweep --seeds 3</code> gives the spread "
         "over seeds.</p>\n";
    h += "<table class=\"best\"><thead><tr><th rowspan=\"2\">budget (% of dense)</th><th colspan=\"2\">KV cache kept</th>"
         "<th colspan=\"2\">attention FLOPs (prefill + decode)</th></tr>\n<tr><th>best (" + esc(mk->title) +
         ")</th><th>next</th><th>best (" + esc(mf->title) + ")</th><th>next</th></tr></thead><tbody>\n";
    for (std::size_t b = 0; b < kept.size(); ++b)
        h += "<tr><td class=\"l\">" + detail::budget_text(kept[b].budget) + "</td><td class=\"l\"><b>" +
             esc(detail::ranked_text(kept[b], 0)) + "</b></td><td class=\"l\">" + esc(detail::ranked_text(kept[b], 1)) +
             "</td><td class=\"l\"><b>" + esc(detail::ranked_text(flops[b], 0)) + "</b></td><td class=\"l\">" +
             esc(detail::ranked_text(flops[b], 1)) + "</td></tr>\n";
    h += "</tbody></table>\n<p class=\"note\">'-': no policy's sweep reaches that budget. A policy whose sweep stays "
         "above a budget is not ranked there (on the kept axis BlindSight and dense keep every token).</p>\n";
    std::map<std::string, std::size_t> index;
    for (const auto& p : R.policies) index.emplace(p, index.size());
    auto chart = [&](SweepAxis axis) {
        const SweepMetric* m = axis == SweepAxis::kept ? mk : mf;
        std::vector<svg::Series> ser;
        const auto front = pareto_front(R, axis, m);
        svg::Series fr;
        fr.name = "Pareto front";
        fr.colour = "#9a9a9a";
        fr.stroke_width = 6;
        fr.radius = 0;
        for (const auto& p : front) fr.x.push_back(p.x), fr.y.push_back(p.y);
        ser.push_back(fr);
        const auto pts = mean_points(R, axis, m);
        for (const auto& pol : R.policies) {
            svg::Series se;
            se.name = pol;
            se.colour = svg::color(index[pol]);
            se.marker = static_cast<int>(index[pol] % 7);
            se.radius = 3.6;
            std::vector<MeanPoint> v;
            for (const auto& p : pts)
                if (p.policy == pol) v.push_back(p);
            std::stable_sort(v.begin(), v.end(), [](const MeanPoint& a, const MeanPoint& b) { return a.x < b.x; });
            for (const auto& p : v) se.x.push_back(p.x), se.y.push_back(p.y), se.point_labels.push_back(p.value);
            if (!se.x.empty()) ser.push_back(se);
        }
        svg::ChartOptions o;
        o.title = std::string(m->title) + " against " + (axis == SweepAxis::kept ? "the KV cache kept" : "attention FLOPs");
        o.xlabel = (axis == SweepAxis::kept ? "KV cache kept (kept ratio)" : "attention FLOPs, prefill + decode") +
                   std::string(", % of dense");
        o.ylabel = std::string(m->title) + (m->log ? " (log)" : "");
        o.log_y = m->log;
        o.percent_x = true;
        o.x_min = 0;
        o.x_max = 1;
        o.width = 540;
        o.height = 340;
        return "<figure>" + svg::line_chart(ser, o) + "<figcaption>Pareto front (" +
               (axis == SweepAxis::kept ? std::string("kept") : std::string("FLOPs")) + "): " + esc(detail::front_text(front)) +
               "</figcaption></figure>\n";
    };
    h += "<div class=\"pair\">\n" + chart(SweepAxis::kept) + chart(SweepAxis::flops) + "</div>\n";
    h += "<p class=\"note\">One point per sweep value (mean over the seeds), joined per policy; the grey band is the Pareto "
         "front (no other point is both cheaper and more faithful). On the log scale a value of exactly 0 sits on the row "
         "marked 0 as a hollow marker.</p>\n</section>\n";
    return h;
}

}  // namespace vlsparse::sim
