// vlsparse/sim/commands.hpp -- the subcommands of vlsparse-sim: run, compare, characterize, masks,
// golden verify, policies. main() is sim_main(argc, argv). Usage texts: sim/cli.hpp.
// Include: <vlsparse/sim/commands.hpp>
#pragma once

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "vlsparse/core/config.hpp"
#include "vlsparse/io/blindsight_json.hpp"
#include "vlsparse/masks/flops.hpp"
#include "vlsparse/masks/render.hpp"
#include "vlsparse/policies/blindsight.hpp"
#include "vlsparse/sim/characterize.hpp"
#include "vlsparse/sim/claims.hpp"
#include "vlsparse/sim/realism.hpp"
#include "vlsparse/sim/cli.hpp"
#include "vlsparse/sim/engine.hpp"
#include "vlsparse/sim/export.hpp"
#include "vlsparse/sim/golden_cpu.hpp"
#include "vlsparse/sim/golden_run.hpp"
#include "vlsparse/sim/golden_verify.hpp"
#include "vlsparse/sim/report_html.hpp"
#include "vlsparse/sim/report_json.hpp"
#include "vlsparse/sim/report_text.hpp"
#include "vlsparse/sim/scenario.hpp"
#include "vlsparse/sim/sweep.hpp"

namespace vlsparse::sim {

// The scenario of a run: the file (or, without one, the built-in default scenario) with `--set`
// overrides ("key.path=value", cli.hpp's apply_set) applied, then parsed and checked. What the
// commands and the Python module's sim.run load. Throws vlsparse::error naming the file and the key.
inline Scenario load_scenario_with_sets(const std::optional<std::string>& file, const std::vector<std::string>& sets) {
    nlohmann::json j;
    std::string name = "(built-in default)";
    std::filesystem::path base;
    if (file) {
        if (std::filesystem::is_directory(*file))
            throw ::vlsparse::error("scenario", *file + ": is a directory, expected a scenario file (.json)");
        std::ifstream f(*file);
        if (!f) throw ::vlsparse::error("scenario", *file + ": cannot open (no such file?)");
        std::stringstream ss;
        ss << f.rdbuf();
        try {
            j = nlohmann::json::parse(ss.str());
        } catch (const nlohmann::json::exception& e) {
            throw ::vlsparse::error("scenario", *file + ": invalid JSON: " + e.what());
        }
        name = *file;
        base = std::filesystem::path(*file).parent_path();
    } else {
        j = nlohmann::json::parse(default_scenario_text());
    }
    for (const auto& s : sets) apply_set(j, s);
    return scenario_from_json(j, name, base);
}

namespace detail {


struct ReportPaths {
    std::filesystem::path out = ".";
    std::optional<std::string> html, json;
    bool no_html = false;
    bool quiet = false;
    bool per_layer = false;
    bool no_sweep = false;  // run: no budget sweep (the report's first section)
    std::vector<std::string> sets;
    std::optional<std::string> scenario;
};

// Every command's argument loop: -h or --help prints `usage` and returns false (the command then exits
// 0); option() consumes an option of the command and returns true, or returns false when the next
// argument is none of them; any other argument that starts with '-' is an unknown option; the rest go
// to positional(), which consumes one or fails.
template <class Option, class Positional>
bool parse_args(Args& a, const char* usage, Option&& option, Positional&& positional) {
    while (!a.empty()) {
        if (a.flag("-h") || a.flag("--help")) {
            std::fputs(usage, stdout);
            return false;
        }
        if (option()) continue;
        if (!a.peek().empty() && a.peek()[0] == '-') a.fail("unknown option '" + a.peek() + "'");
        positional();
    }
    return true;
}

// The positional() of parse_args for one argument at most, stored in `into`; a second one is an
// unexpected argument (`why`: what the message adds, e.g. " (one scenario file at most)").
inline auto at_most_one(Args& a, std::optional<std::string>& into, const char* why = "") {
    return [&a, &into, why] {
        if (!into) into = a.next();
        else a.fail("unexpected argument '" + a.peek() + "'" + why);
    };
}
inline constexpr const char* kOneScenario = " (one scenario file at most)";

// The report options of run, compare and sweep (--out, --html, --json, --set, --no-html, --quiet): true
// when the next argument was one of them.
inline bool report_option(Args& a, ReportPaths& o) {
    if (auto v = a.value("--out")) o.out = *v;
    else if (auto v2 = a.value("--html")) o.html = *v2;
    else if (auto v3 = a.value("--json")) o.json = *v3;
    else if (auto v4 = a.value("--set")) o.sets.push_back(*v4);
    else if (auto v5 = a.value("--backend")) o.sets.push_back("backend=" + *v5);
    else if (a.flag("--no-html")) o.no_html = true;
    else if (a.flag("--quiet")) o.quiet = true;
    else return false;
    return true;
}

// Options shared by run and compare (--no-sweep: run only); returns false on --help.
inline bool parse_report_args(Args& a, ReportPaths& o, const char* usage, bool sweep_flag = false) {
    return parse_args(
        a, usage,
        [&] {
            if (report_option(a, o)) return true;
            if (a.flag("--per-layer")) o.per_layer = true;
            else if (sweep_flag && a.flag("--no-sweep")) o.no_sweep = true;
            else return false;
            return true;
        },
        at_most_one(a, o.scenario, kOneScenario));
}

// The reports' paths can be written: checked before the run, not found out after it.
inline void check_report_paths(const ReportPaths& o, const char* default_html) {
    if (o.json) check_writable(*o.json, "JSON report");
    if (!o.no_html) check_writable(o.html ? std::filesystem::path(*o.html) : o.out / default_html, "HTML report");
}

// Writes a JSON report (two-space indent) and says where.
inline void write_json_report(const std::string& path, const json& j) {
    write_text_file(path, j.dump(2) + "\n", "JSON report");
    std::printf("JSON report: %s\n", path.c_str());
}

// sw: run's budget sweep (the HTML report's first section, "budget_sweep" in the JSON), or null.
inline void write_reports(const std::string& command, const Scenario& s, const RunResult& r, const ReportPaths& o,
                          const char* default_html, const SweepResult* sw = nullptr) {
    if (o.json) {
        json j = report_json(command, s, r);
        if (sw) j["budget_sweep"] = sweep_json(s, *sw);
        write_json_report(*o.json, j);
    }
    if (!o.no_html) {
        const std::filesystem::path html = o.html ? std::filesystem::path(*o.html) : o.out / default_html;
        write_text_file(html, report_html(command, s, r, sw ? decision_html(*sw) : std::string()), "HTML report");
        std::printf("HTML report: %s\n", std::filesystem::absolute(html).lexically_normal().string().c_str());
    }
}

// The options of claims and realism besides their own: the scenario, --json, --set, --quiet.
struct StudyOptions {
    std::optional<std::string> scenario, json;
    std::vector<std::string> sets;
    bool quiet = false;
};

// --json, --set or --quiet of claims and realism: true when the next argument was one of them.
inline bool study_option(Args& a, StudyOptions& o) {
    if (auto v = a.value("--json")) o.json = *v;
    else if (auto v1 = a.value("--set")) o.sets.push_back(*v1);
    else if (a.flag("--quiet")) o.quiet = true;
    else return false;
    return true;
}

// The scenario of claims or realism with its --set overrides, the JSON report's path checked before
// the run, and the command's header printed.
inline Scenario start_study(const StudyOptions& o, const char* command) {
    const Scenario s = load_scenario_with_sets(o.scenario, o.sets);
    if (o.json) check_writable(*o.json, "JSON report");
    print_header(stdout, command, s, nullptr);
    std::fflush(stdout);
    return s;
}

}  // namespace detail

inline std::vector<PolicyToRun> sweep_policies(const Scenario& s);

// run's budget sweep: one seed, budgets 10, 20, 30, 50% (on the default scenario about 20 s on 2 cores;
// `sweep` has seeds and other budgets).
inline SweepOptions run_sweep_options() {
    SweepOptions so;
    so.seeds = 1;
    so.budgets = {0.1, 0.2, 0.3, 0.5};
    return so;
}

inline int cmd_run(Args& a) {
    detail::ReportPaths o;
    if (!detail::parse_report_args(a, o, kRunUsage, true)) return 0;
    const Scenario s = load_scenario_with_sets(o.scenario, o.sets);
    detail::check_report_paths(o, "sim-report.html");
    if (!o.no_sweep) check_memory(s, sweep_policies(s).size() + 1);
    print_header(stdout, "run", s, nullptr);
    std::fflush(stdout);
    Progress progress(!o.quiet);
    EngineOptions eo;
    eo.progress = &progress;
    const RunResult r = run_scenario(s, eo);
    print_source(stdout, r);
    std::printf("\n");
    print_run_table(stdout, s, r);
    std::printf("\n");
    print_time_table(stdout, s, r);
    if (o.per_layer) print_layer_tables(stdout, s, r);
    r.purekv.print(stdout);
    std::printf("\nwall time %.2f s (%d thread(s)); ratios are against the dense run (first row); docs/simulator.md "
                "defines every column.\n",
                r.wall_s, r.threads);
    std::optional<SweepResult> sw;
    if (!o.no_sweep) {
        std::printf("\nbudget sweep: every policy over its sweep (as compare), 1 seed; --no-sweep skips it\n");
        std::fflush(stdout);
        sw = run_sweep(s, run_sweep_options(), [](const Scenario& si) { return sweep_policies(si); }, &progress);
        print_best_at(stdout, *sw);
        if (const std::string note = detail::out_of_range_note(*sw); !note.empty()) std::printf("  kept axis: %s\n", note.c_str());
        std::printf("sweep: %zu runs, %.2f s; `vlsparse-sim sweep` for more seeds and budgets\n", sw->points.size(), sw->wall_s);
    }
    detail::write_reports("run", s, r, o, "sim-report.html", sw ? &*sw : nullptr);
    return 0;
}

// The sweep runs of a scenario: every policy once per value of its sweep (or once, without one).
inline std::vector<PolicyToRun> sweep_policies(const Scenario& s) {
    std::vector<PolicyToRun> out;
    const PolicyContext ctx{s.model, s.base_dir};
    for (std::size_t i = 0; i < s.policies.size(); ++i) {
        const auto& p = s.policies[i];
        const JsonWhere w = JsonWhere{s.file, "policies"}.index(i);
        const PolicyInfo& info = policy_info(p.name, w.key("name"));
        std::string param = p.sweep_param;
        std::vector<json> values = p.sweep_values;
        if (values.empty()) {
            param = info.sweep_param;
            values = info.sweep_values;
        }
        if (values.empty()) {
            out.push_back({p.label, p.name, effective_params(info, p.params), info.make(p.params, w.key("params"), ctx), p.label, ""});
            continue;
        }
        for (std::size_t k = 0; k < values.size(); ++k) {
            const json q = apply_sweep_value(p.params, param, values[k]);
            const std::string vl = sweep_value_label(param, values[k]);
            out.push_back({p.label + " " + vl, p.name, effective_params(info, q),
                           info.make(q, w.key("sweep").key("values").index(k), ctx), p.label, vl});
        }
    }
    return out;
}

inline int cmd_compare(Args& a) {
    detail::ReportPaths o;
    if (!detail::parse_report_args(a, o, kCompareUsage)) return 0;
    const Scenario s = load_scenario_with_sets(o.scenario, o.sets);
    detail::check_report_paths(o, "sim-compare.html");
    std::vector<PolicyToRun> runs = sweep_policies(s);
    check_memory(s, runs.size() + 1);  // the scenario was checked for one run per policy; compare runs the sweeps
    print_header(stdout, "compare", s, nullptr);
    std::fflush(stdout);
    Progress progress(!o.quiet);
    EngineOptions eo;
    eo.progress = &progress;
    const RunResult r = run_engine(s, std::move(runs), eo);
    print_source(stdout, r);
    std::printf("\n");
    print_sweep_table(stdout, s, r);
    r.purekv.print(stdout);
    std::printf("\nwall time %.2f s (%d thread(s)); FLOPs = prefill + decode attention against dense.\n", r.wall_s,
                r.threads);
    detail::write_reports("compare", s, r, o, "sim-compare.html");
    return 0;
}

// A comma-separated list of budgets: "0.1,0.2,30%" (a trailing % divides by 100).
inline std::vector<double> parse_budgets(const Args& a, const std::string& v) {
    std::vector<double> r;
    std::size_t p = 0;
    while (p <= v.size()) {
        const std::size_t e = std::min(v.find(',', p), v.size());
        std::string item = v.substr(p, e - p);
        double div = 1.0;
        if (!item.empty() && item.back() == '%') item.pop_back(), div = 100.0;
        r.push_back(a.number("--budgets", item) / div);
        p = e + 1;
    }
    return r;
}

inline int cmd_sweep(Args& a) {
    detail::ReportPaths o;
    SweepOptions so;
    const bool parsed = detail::parse_args(
        a, kSweepUsage,
        [&] {
            if (auto v = a.value("--seeds")) so.seeds = a.integer("--seeds", *v, 1, 1000);
            else if (auto v1 = a.value("--budgets")) so.budgets = parse_budgets(a, *v1);
            else if (auto v2 = a.value("--x")) {
                if (*v2 == "kept") so.axis = SweepAxis::kept;
                else if (*v2 == "flops") so.axis = SweepAxis::flops;
                else a.fail("--x: '" + *v2 + "', expected kept or flops");
            } else return detail::report_option(a, o);
            return true;
        },
        detail::at_most_one(a, o.scenario, detail::kOneScenario));
    if (!parsed) return 0;
    check_sweep_options(so, "vlsparse-sim sweep");
    const Scenario s = load_scenario_with_sets(o.scenario, o.sets);
    detail::check_report_paths(o, "sim-sweep.html");
    check_memory(s, sweep_policies(s).size() + 1);
    print_header(stdout, "sweep", s, nullptr);
    std::printf("  seeds    %lld (%llu..%llu); budgets on the %s axis\n", static_cast<long long>(so.seeds),
                static_cast<unsigned long long>(s.seed), static_cast<unsigned long long>(s.seed + static_cast<std::uint64_t>(so.seeds - 1)),
                to_string(so.axis));
    std::fflush(stdout);
    Progress progress(!o.quiet);
    const SweepResult R = run_sweep(s, so, [](const Scenario& si) { return sweep_policies(si); }, &progress);
    std::printf("  source   %s\n  threads  %d\n\n", R.source.c_str(), R.threads);
    print_sweep_tables(stdout, R);
    std::printf("\nwall time %.2f s (%d thread(s), %lld seed(s), %zu runs).\n", R.wall_s, R.threads,
                static_cast<long long>(so.seeds), R.points.size());
    if (o.json) detail::write_json_report(*o.json, sweep_json(s, R));
    if (!o.no_html) {
        const std::filesystem::path html = o.html ? std::filesystem::path(*o.html) : o.out / "sim-sweep.html";
        write_text_file(html, sweep_html(s, R), "HTML report");
        std::printf("HTML report: %s\n", std::filesystem::absolute(html).lexically_normal().string().c_str());
    }
    return 0;
}

inline int cmd_claims(Args& a) {
    detail::StudyOptions o;
    ClaimsOptions co;
    const bool parsed = detail::parse_args(
        a, kClaimsUsage,
        [&] {
            if (auto v = a.value("--seeds")) co.seeds = a.integer("--seeds", *v, 1, 1000);
            else if (auto v1 = a.value("--prompts")) co.prompts = a.integer("--prompts", *v1, 1, 10000);
            else return detail::study_option(a, o);
            return true;
        },
        detail::at_most_one(a, o.scenario, detail::kOneScenario));
    if (!parsed) return 0;
    const Scenario s = detail::start_study(o, "claims");
    Progress progress(!o.quiet);
    const ClaimsResult R = run_claims(s, co, &progress);
    std::string seeds;
    for (auto x : R.seeds) seeds += (seeds.empty() ? "" : ", ") + std::to_string(x);
    std::printf("  source   %s\n  seeds    %s\n\n", R.source.c_str(), seeds.c_str());
    print_claims(stdout, R);
    std::printf("\nwall time %.2f s. What each row runs and its criterion: vlsparse-sim claims --help; which results the\n"
                "generator plants: docs/simulator.md (The papers' claims).\n",
                R.wall_s);
    if (o.json) detail::write_json_report(*o.json, claims_json(s, R));
    return 0;
}

inline int cmd_realism(Args& a) {
    detail::StudyOptions o;
    RealismOptions ro;
    const bool parsed = detail::parse_args(
        a, kRealismUsage,
        [&] {
            if (auto v = a.value("--rows")) ro.rows = a.integer("--rows", *v, 1, 1 << 20);
            else if (auto v1 = a.value("--local-radius")) ro.local_radius = a.integer("--local-radius", *v1, 0, 1 << 20);
            else return detail::study_option(a, o);
            return true;
        },
        detail::at_most_one(a, o.scenario, detail::kOneScenario));
    if (!parsed) return 0;
    const Scenario s = detail::start_study(o, "realism");
    Progress progress(!o.quiet);
    const RealismResult R = measure_realism(s, ro, &progress);
    std::printf("  source   %s\n  rows     %lld query rows per layer over [n/4, n); local radius %lld tokens\n\n",
                R.source.c_str(), static_cast<long long>(ro.rows), static_cast<long long>(ro.local_radius));
    print_realism(stdout, R);
    std::printf("\nmasses: mean attention probability of the sampled rows (all heads) on token 0, on the first 10%% of\n"
                "every image, on the last local-radius + 1 keys; entropy normalized by ln(i + 1); diffuse heads: mean\n"
                "normalized entropy > 0.75; heavy: share of PureKV's window scores on the top 5%% of keys; rho: Spearman\n"
                "of those scores against the next layer's. docs/simulator.md (Generator realism) defines them.\n");
    if (o.json) detail::write_json_report(*o.json, realism_json(s, R, ro));
    return 0;
}

// fit TARGET: the synthetic generator's parameters that resemble the target's statistics (sim/realism.hpp).
inline int cmd_fit(Args& a) {
    std::optional<std::string> file;
    std::string out = "fitted-scenario.json";
    std::vector<std::string> sets;
    RealismOptions ro;
    std::int64_t passes = 2;
    bool quiet = false;
    const bool parsed = detail::parse_args(
        a, kFitUsage,
        [&] {
            if (auto v = a.value("--rows")) ro.rows = a.integer("--rows", *v, 1, 1 << 20);
            else if (auto v1 = a.value("--passes")) passes = a.integer("--passes", *v1, 1, 100);
            else if (auto v2 = a.value("--out")) out = *v2;
            else if (auto v3 = a.value("--set")) sets.push_back(*v3);
            else if (a.flag("--quiet")) quiet = true;
            else return false;
            return true;
        },
        detail::at_most_one(a, file, detail::kOneScenario));
    if (!parsed) return 0;
    if (!file) a.fail("missing TARGET: a scenario whose source to fit (e.g. one with a dump source)");
    const Scenario s = load_scenario_with_sets(file, sets);
    if (s.model.head_dim < 8) a.fail("the target's head_dim = " + std::to_string(s.model.head_dim) + ", the generator needs >= 8");
    check_writable(out, "fitted scenario");
    print_header(stdout, "fit", s, nullptr);
    std::fflush(stdout);
    Progress progress(!quiet);
    const auto t0 = std::chrono::steady_clock::now();
    const FitResult F = fit_generator(s, ro, passes, &progress);
    std::printf("  target   %s\n\n", F.target.source.c_str());
    RealismResult shown;
    shown.layers = {F.target.mean, F.start.mean, F.fitted.mean};
    text::Table t({"", "first", "image", "local", "entropy", "head", "diffuse", "heavy", "rho"},
                  {"(means over layers)", "token", "sinks", "mass", "(norm.)", "entropy sd", "heads", "top 5%", "next layer"});
    const char* names[] = {"target", "generator defaults", "fitted"};
    for (int i = 0; i < 3; ++i) {
        const LayerRealism& x = shown.layers[static_cast<std::size_t>(i)];
        t.row({names[i], text::pct(x.first_token_mass), text::pct(x.image_sink_mass), text::pct(x.local_mass), text::fix(x.entropy, 3),
               text::fix(x.head_entropy_std, 3), text::pct(x.diffuse_share, 0), text::pct(x.heavy_share),
               std::isfinite(x.rho_next) ? text::fix(x.rho_next, 3) : "-"});
    }
    t.print(stdout, "  ");
    std::printf("\ndistance (mean over layers of the squared differences of every statistic): defaults %.4g, fitted %.4g "
                "(%lld evaluations, %.1f s)\nfitted source params: %s\n",
                F.distance_start, F.distance_fitted, static_cast<long long>(F.evaluations),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), F.params.dump().c_str());
    json j = to_json(s);
    j["name"] = s.name + " (synthetic, fitted)";
    j["description"] = "The synthetic generator fitted by `vlsparse-sim fit` to the statistics of " +
                       (s.file.empty() ? std::string("the built-in default") : s.file) + " (" + F.target.source + ").";
    j["source"] = {{"kind", "synthetic"}, {"params", F.params}};
    write_text_file(out, j.dump(2) + "\n", "fitted scenario");
    std::printf("fitted scenario: %s\n", std::filesystem::absolute(out).lexically_normal().string().c_str());
    return 0;
}

inline int cmd_characterize(Args& a) {
    std::optional<std::string> file, svg_out;
    std::string out = "blindsight-head-map.json";
    std::vector<std::string> sets;
    std::int64_t prompts = 4;
    BlindSightParams P;
    bool quiet = false;
    const bool parsed = detail::parse_args(
        a, kCharacterizeUsage,
        [&] {
            if (auto v = a.value("--prompts")) prompts = a.integer("--prompts", *v, 1, 10000);
            else if (auto v1 = a.value("--out")) out = *v1;
            else if (auto v2 = a.value("--svg")) svg_out = *v2;
            else if (auto v3 = a.value("--alpha")) P.alpha = a.number("--alpha", *v3);
            else if (auto v4 = a.value("--gamma-c")) P.gamma_c = a.number("--gamma-c", *v4);
            else if (auto v5 = a.value("--gamma-s")) P.gamma_s = a.number("--gamma-s", *v5);
            else if (auto v6 = a.value("--gamma-d")) P.gamma_d = a.number("--gamma-d", *v6);
            else if (auto v7 = a.value("--sink-fraction")) P.mask.sink_fraction = a.number("--sink-fraction", *v7);
            else if (auto v8 = a.value("--set")) sets.push_back(*v8);
            else if (a.flag("--quiet")) quiet = true;
            else return false;
            return true;
        },
        detail::at_most_one(a, file));
    if (!parsed) return 0;
    check_blindsight_params(P, "vlsparse-sim characterize");
    Scenario s = load_scenario_with_sets(file, sets);
    check_writable(out, "head map");
    if (svg_out) check_writable(*svg_out, "head map picture");
    if (s.source.kind == SourceKind::dump && prompts > 1) {
        std::printf("note: a dump source is one prompt; calibrating on it alone\n");
        prompts = 1;
    }
    // A residual model's weights and its prompt both derive from the seed: other seeds would be other
    // models. It is calibrated on its one prompt, with the dense run's Q/K/V (sim/export.hpp).
    if (s.source.kind == SourceKind::residual && prompts > 1) {
        std::printf("note: a residual source is one model and one prompt; calibrating on its dense run alone\n");
        prompts = 1;
    }
    Progress progress(!quiet);
    const auto t0 = std::chrono::steady_clock::now();
    const HeadMap map = characterize_model(s, prompts, P, &progress);
    save_head_map(map, out);
    const std::int64_t L = s.model.layers;

    print_header(stdout, "characterize", s, nullptr);
    std::printf("  prompts  %lld (seeds %llu..%llu); alpha %.3g, gamma_c %.3g, gamma_s %.3g, gamma_d %.3g\n\n",
                static_cast<long long>(prompts), static_cast<unsigned long long>(s.seed),
                static_cast<unsigned long long>(s.seed + static_cast<std::uint64_t>(prompts - 1)), P.alpha, P.gamma_c,
                P.gamma_s, P.gamma_d);
    text::Table t({"layer", "Dense", "Sink", "Document", "Document-Sink", "templates (head 0..H-1)"});
    for (std::int64_t l = 0; l < L; ++l) {
        int c[4] = {0, 0, 0, 0};
        std::string row;
        for (auto tpl : map.layer(l)) {
            ++c[static_cast<int>(tpl)];
            row += "DSOX"[static_cast<int>(tpl)];
        }
        t.row({std::to_string(l), std::to_string(c[0]), std::to_string(c[1]), std::to_string(c[2]), std::to_string(c[3]), row});
    }
    t.print(stdout, "  ");
    std::printf("  (D = Dense, S = Sink, O = Document, X = Document-Sink)\n");
    const TemplateValues shares = template_shares(map.map);
    bool visual = false;
    for (const auto& seg : s.layout.segments()) visual |= seg.is_visual();
    if (visual) {
        const TemplateValues red = flops_reduction_exact(make_mask_context(s.layout, P.mask));
        std::printf("\nheads: %.1f%% Dense, %.1f%% Sink, %.1f%% Document, %.1f%% Document-Sink; attention FLOPs saved on "
                    "this prompt (exact pair counts): %.1f%%\n",
                    100 * shares[MaskTemplate::dense], 100 * shares[MaskTemplate::sink], 100 * shares[MaskTemplate::document],
                    100 * shares[MaskTemplate::document_sink], 100 * model_flops_reduction(shares, red));
    }
    std::printf("calibration time %.2f s\nhead map: %s\n",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                std::filesystem::absolute(out).lexically_normal().string().c_str());
    if (svg_out) {
        write_text_file(*svg_out, head_map_svg(map), "head map picture");
        std::printf("head map picture: %s\n", svg_out->c_str());
    }
    return 0;
}

inline int cmd_masks(Args& a) {
    std::optional<std::string> file, layout_spec, only, head_map;
    std::string out = "masks";
    int cell = 0;
    MaskOptions mo;
    const bool parsed = detail::parse_args(
        a, kMasksUsage,
        [&] {
            if (auto v = a.value("--layout")) layout_spec = *v;
            else if (auto v1 = a.value("--template")) only = *v1;
            else if (auto v2 = a.value("--out")) out = *v2;
            else if (auto v3 = a.value("--cell")) cell = static_cast<int>(a.integer("--cell", *v3, 1, 64));
            else if (auto v4 = a.value("--sink-fraction")) mo.sink_fraction = a.number("--sink-fraction", *v4);
            else if (auto v5 = a.value("--head-map")) head_map = *v5;
            else return false;
            return true;
        },
        detail::at_most_one(a, file));
    if (!parsed) return 0;
    if (file && layout_spec) a.fail("give a scenario or --layout, not both");
    Scenario s;
    Layout layout;
    if (layout_spec) {
        layout = Layout::parse(*layout_spec);
    } else {
        s = load_scenario_with_sets(file, {});
        layout = s.layout;
    }
    {  // the mask context (a few bytes per token) and one picture at a time: a rectangle per run of
       // allowed keys of each row, at most images + 2 runs a row, about 80 bytes each
        std::int64_t images = 0;
        for (const auto& seg : layout.segments()) images += seg.is_visual();
        const double n = static_cast<double>(layout.n());
        const double need = n * 16.0 + n * static_cast<double>(images + 2) * 80.0, limit = max_memory_bytes();
        if (need > limit) {
            char lim[32];
            std::snprintf(lim, sizeof lim, "%g GiB", limit / 1073741824.0);
            throw ::vlsparse::error("vlsparse-sim masks", std::string(layout_spec ? "--layout" : "layout") +
                                                              ": the pictures need an estimated " + memory_text(need) +
                                                              " of memory for " + std::to_string(layout.n()) +
                                                              " tokens, above the limit of " + lim +
                                                              " (VLSPARSE_SIM_MAX_MEMORY_GIB)");
        }
    }
    const MaskContext ctx = make_mask_context(layout, mo);
    if (cell == 0) cell = layout.n() <= 512 ? 2 : 1;
    std::vector<MaskTemplate> ts(std::begin(kAllTemplates), std::end(kAllTemplates));
    if (only) ts = {mask_template_from_string(*only, "vlsparse-sim masks")};
    std::error_code ec;
    std::filesystem::create_directories(out, ec);
    std::printf("masks of %s (n = %lld, %lld images)\n", layout.to_string().c_str(), static_cast<long long>(layout.n()),
                static_cast<long long>(ctx.images()));
    const TemplateValues red = flops_reduction_exact(ctx);
    for (MaskTemplate t : ts) {
        std::string name(to_string(t));
        for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        const auto path = std::filesystem::path(out) / ("mask-" + name + ".svg");
        write_text_file(path, mask_svg(ctx, t, cell), "mask picture");
        std::printf("  %-14s %5.1f%% of the dense pairs skipped -> %s\n", std::string(to_string(t)).c_str(), 100 * red[t],
                    path.string().c_str());
    }
    if (head_map) {
        std::ifstream f(*head_map);
        if (!f) a.fail("--head-map: cannot open '" + *head_map + "'");
        nlohmann::json j;
        try {
            f >> j;
        } catch (const std::exception& e) {
            a.fail("--head-map: '" + *head_map + "' is not valid JSON: " + e.what());
        }
        const HeadMap m = head_map_from_json(j);
        const auto path = std::filesystem::path(out) / "head-map.svg";
        write_text_file(path, head_map_svg(m), "head map picture");
        std::printf("  head map       -> %s\n", path.string().c_str());
    }
    return 0;
}

inline std::filesystem::path default_golden_dir() {
    if (const char* e = std::getenv("VLSPARSE_GOLDEN_DIR"); e && *e) return e;
    if (std::filesystem::is_directory("golden")) return "golden";
#ifdef VLSPARSE_SOURCE_DIR
    return std::filesystem::path(VLSPARSE_SOURCE_DIR) / "golden";
#else
    return "golden";
#endif
}

inline int cmd_golden(Args& a) {
    if (a.empty() || a.flag("-h") || a.flag("--help")) {
        std::fputs(kGoldenUsage, stdout);
        return a.empty() ? 0 : 0;
    }
    if (!a.flag("verify")) a.fail("unknown golden command '" + a.peek() + "', expected: golden verify DIR");
    std::optional<std::string> dir, json_out, backend, out_dir, precision;
    std::optional<std::filesystem::path> golden;
    const bool parsed = detail::parse_args(
        a, kGoldenUsage,
        [&] {
            if (auto v = a.value("--golden")) golden = *v;
            else if (auto v1 = a.value("--json")) json_out = *v1;
            else if (auto v2 = a.value("--backend")) backend = *v2;
            else if (auto v3 = a.value("--out")) out_dir = *v3;
            else if (auto v4 = a.value("--precision")) precision = *v4;
            else return false;
            return true;
        },
        detail::at_most_one(a, dir));
    if (!parsed) return 0;
    GoldenVerifyResult r;
    if (backend) {
        // The backend computes the outputs of the golden cases named by DIR (default: every case).
        if (golden) a.fail("--golden is for a port's outputs; with --backend, name the golden cases as DIR");
        if (precision) a.fail("--precision is for a port's outputs; with --backend, each output's bar is its arithmetic's");
        GoldenCaseRunner run;
        if (*backend == "cpu") {
            run = cpu_golden_case;
        } else if (*backend == "cuda") {
#ifdef VLSPARSE_SIM_CUDA
            run = cuda_golden_case;
#else
            a.fail("--backend cuda: this vlsparse-sim was built without CUDA (configure with -Dcuda=enabled)");
#endif
        } else {
            a.fail("--backend '" + *backend + "', expected cpu or cuda");
        }
        const std::filesystem::path cases = dir ? std::filesystem::path(*dir) : default_golden_dir();
        std::optional<std::filesystem::path> out;
        if (out_dir) out = std::filesystem::path(*out_dir);
        std::printf("golden verify --backend %s: the golden cases' inputs through the %s path\n\n", backend->c_str(),
                    *backend == "cpu" ? "SIMD" : "CUDA");
        r = golden_run(cases, run, out);
    } else {
        if (out_dir) a.fail("--out is for --backend (where the computed outputs are written)");
        if (!dir) a.fail("missing DIR: the folder of the port's outputs");
        if (precision && !is_golden_precision(*precision))
            a.fail("--precision '" + *precision + "', expected fp64, fp32, fp16 or bf16");
        r = golden_verify(*dir, golden ? *golden : default_golden_dir(), precision ? *precision : "fp32");
    }
    print_golden_verify(stdout, r);
    if (json_out) write_text_file(*json_out, to_json(r).dump(2) + "\n", "JSON result");
    return r.pass() ? 0 : 1;
}

inline int cmd_policies(Args& a) {
    if (a.flag("-h") || a.flag("--help")) {
        std::puts("usage: vlsparse-sim policies\n\nLists every policy a scenario can name, its parameters with their "
                  "defaults, and the sweep `compare` runs by default.");
        return 0;
    }
    if (!a.empty()) a.fail("unexpected argument '" + a.peek() + "'");
    for (const auto& p : policy_registry()) {
        std::printf("%s\n  %s\n  params: %s\n", p.name.c_str(), p.summary.c_str(), p.defaults.dump().c_str());
        if (!p.extra_keys.empty()) {
            std::string k;
            for (const auto& e : p.extra_keys) k += (k.empty() ? "" : ", ") + e;
            std::printf("  also:   %s\n", k.c_str());
        }
        if (!p.sweep_values.empty()) {
            std::string v;
            for (const auto& x : p.sweep_values) v += (v.empty() ? "" : "; ") + sweep_value_label(p.sweep_param, x);
            std::printf("  sweep:  %s\n", v.c_str());
        }
        std::printf("\n");
    }
    return 0;
}

// export [SCENARIO] OUTDIR: the scenario's Q/K/V as a dump directory (sim/export.hpp).
inline int cmd_export(Args& a) {
    std::vector<std::string> pos, sets;
    ExportOptions opt;
    const bool parsed = detail::parse_args(
        a, kExportUsage,
        [&] {
            if (auto v = a.value("--set")) sets.push_back(*v);
            else if (auto v1 = a.value("--dtype")) {
                if (const auto t = ::vlsparse::enum_from_name<DType>(*v1)) opt.dtype = *t;
                else a.fail("--dtype: '" + *v1 + "', expected fp32, fp16 or bf16");
            } else if (a.flag("--safetensors")) opt.storage = "safetensors";
            else return false;
            return true;
        },
        [&] {
            if (pos.size() < 2) pos.push_back(a.next());
            else a.fail("unexpected argument '" + a.peek() + "' (a scenario and an output folder at most)");
        });
    if (!parsed) return 0;
    if (pos.empty()) a.fail("missing OUTDIR");
    const std::optional<std::string> file = pos.size() == 2 ? std::optional<std::string>(pos[0]) : std::nullopt;
    const Scenario s = load_scenario_with_sets(file, sets);
    const std::filesystem::path dir = pos.back();
    const ExportResult r = export_scenario(s, dir, opt);
    std::printf("exported %lld layers x %lld rows (%lld prompt + %lld decode) of '%s' to %s\n",
                static_cast<long long>(s.model.layers), static_cast<long long>(r.manifest.tokens()),
                static_cast<long long>(s.n()), static_cast<long long>(s.decode_steps), s.name.c_str(),
                std::filesystem::absolute(dir).lexically_normal().string().c_str());
    return 0;
}

// The program: exit status 0 (success), 1 (golden verify found differences), 2 (bad input or error).
inline int sim_main(int argc, char** argv) {
    std::vector<std::string> args(argv + 1, argv + argc);
    std::string cmd = "run";
    if (!args.empty() && (args[0] == "-h" || args[0] == "--help")) {
        std::fputs(kTopUsage, stdout);
        return 0;
    }
    if (!args.empty() && args[0] == "--version") {
        std::printf("vlsparse-sim %s\n", VLSPARSE_VERSION_STRING);
        return 0;
    }
    if (!args.empty() && !args[0].empty() && args[0][0] != '-') {
        const std::string& c = args[0];
        if (c == "run" || c == "compare" || c == "characterize" || c == "masks" || c == "golden" || c == "policies" ||
            c == "export" || c == "sweep" || c == "claims" || c == "realism" || c == "fit") {
            cmd = c;
            args.erase(args.begin());
        } else if (!(c.size() > 5 && c.compare(c.size() - 5, 5, ".json") == 0)) {
            std::fprintf(stderr, "vlsparse-sim: unknown command '%s' (see vlsparse-sim --help)\n", c.c_str());
            return 2;
        }
    }
    try {
        Args a(args, cmd);
        if (cmd == "run") return cmd_run(a);
        if (cmd == "compare") return cmd_compare(a);
        if (cmd == "sweep") return cmd_sweep(a);
        if (cmd == "claims") return cmd_claims(a);
        if (cmd == "realism") return cmd_realism(a);
        if (cmd == "fit") return cmd_fit(a);
        if (cmd == "characterize") return cmd_characterize(a);
        if (cmd == "masks") return cmd_masks(a);
        if (cmd == "golden") return cmd_golden(a);
        if (cmd == "export") return cmd_export(a);
        return cmd_policies(a);
    } catch (const std::exception& e) {
        std::fflush(stdout);
        std::fprintf(stderr, "vlsparse-sim: error: %s\n", e.what());
        return 2;
    }
}

}  // namespace vlsparse::sim
