// vlsparse/sim/claims.hpp -- `vlsparse-sim claims`: one row per central claim of the four papers, measured
// on a scenario's source (synthetic, residual or dump) at matched budgets, with a verdict.
//
// Every claim is measured over seeds seed, seed + 1, ... (--seeds, default 3; means over the seeds; a dump
// source is one prompt: one seed), on the scenario's model, prompt, decode steps and source. The
// scenario's policies are not run; each claim's policy starts from the params of the scenario's first
// entry of that policy (if any), with the claim's budget keys on top.
//   zipvl-adaptive   ZipVL (arXiv:2410.08584, Table 3): the adaptive ratio beats a fixed ratio of the same
//                    normalized scores at equal budget. Adaptive at tau 0.7 / 0.8 / 0.9 against
//                    `ratio: fixed` with fixed_ratio = the adaptive run's achieved kept ratio (a second
//                    pass, same seed). Reproduced when adaptive has the lower decode NMSE at every tau.
//   zipvl-normalized ZipVL (Eq. 8): normalized scores beat accumulated ones. `ratio: fixed` at 10 / 20 /
//                    30%, `ranking` normalized against accumulated. Reproduced when normalized is lower
//                    at every budget.
//   purekv-budget    PureKV (arXiv:2510.25600): at 10-20% KV budget PureKV is at least as good as H2O and
//                    SnapKV. budget_fraction / capacity / heavy + recent = 10% and 20%. Reproduced when
//                    PureKV's (default params) decode NMSE is at most the better baseline's at both;
//                    PureKV with grouping = layer is measured beside it.
//   blindsight-share BlindSight: about 60% of the heads calibrate as sparse (not Dense). Algorithm 1 +
//                    2 over --prompts prompts of one model (a residual or dump source: its one prompt,
//                    per seed; the share is the mean over seeds). Reproduced when within 0.6 +- 0.1.
//   avl-core         A-VL: decoding on a 30% core (compute_rate 0.7, K = 3) keeps the outputs close to
//                    reading every kept token. Reproduced when its decode NMSE is at most 1.5x that of
//                    the same kept set read in full every step (refresh_every = 0).
// The verdict names how many of the compared budgets agree with the claim ("partly" in between).
// Include: <vlsparse/sim/claims.hpp>
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "vlsparse/core/config.hpp"
#include "vlsparse/sim/characterize.hpp"
#include "vlsparse/sim/engine.hpp"
#include "vlsparse/sim/report_json.hpp"
#include "vlsparse/sim/report_text.hpp"
#include "vlsparse/sim/scenario.hpp"

namespace vlsparse::sim {

struct ClaimsOptions {
    std::int64_t seeds = 3;
    std::int64_t prompts = 4;  // BlindSight calibration prompts (synthetic source)
};

struct ClaimRow {
    std::string id, paper, claim, measured, verdict;
    json data;  // the numbers behind `measured`
};

struct ClaimsResult {
    std::vector<ClaimRow> rows;
    std::vector<std::uint64_t> seeds;
    bool residual = false;
    std::string source;
    double wall_s = 0;
};

// The claims' fixed settings, shared with the tests.
inline const std::vector<double>& claims_zipvl_taus() {
    static const std::vector<double> v = {0.7, 0.8, 0.9};
    return v;
}
inline const std::vector<double>& claims_zipvl_budgets() {
    static const std::vector<double> v = {0.1, 0.2, 0.3};
    return v;
}
inline const std::vector<double>& claims_purekv_budgets() {
    static const std::vector<double> v = {0.1, 0.2};
    return v;
}

// A policy of the registry as a run (label, name, params), checked like a scenario entry. The params
// start from the scenario's first entry of the same policy, when it has one (e.g. a SnapKV window that
// fits a short prompt), and the claim's own keys override them.
inline PolicyToRun claims_policy(const Scenario& s, const std::string& label, const std::string& name, const json& params) {
    json p = json::object();
    for (const auto& e : s.policies)
        if (e.name == name) {
            if (e.params.is_object()) p = e.params;
            break;
        }
    for (auto it = params.begin(); it != params.end(); ++it) p[it.key()] = it.value();
    const JsonWhere w{"claims", label};
    const PolicyInfo& info = policy_info(name, w);
    return {label, name, effective_params(info, p), info.make(p, w.key("params"), PolicyContext{s.model, s.base_dir}), "", ""};
}

namespace detail {

inline std::string pct_label(double x) { return text::pct(x, 0); }

// "reproduced" / "not reproduced" / "partly (k of n)".
inline std::string verdict(int agree, int of) {
    if (agree == of) return "reproduced";
    if (agree == 0) return "not reproduced";
    return "partly (" + std::to_string(agree) + " of " + std::to_string(of) + ")";
}

// Mean decode NMSE over the seeds of the run labelled `label` (runs of each seed, by label).
struct SeedRuns {
    std::vector<std::vector<PolicyResult>> per_seed;
    const PolicyResult* find(std::size_t seed, const std::string& label) const {
        for (const auto& p : per_seed[seed])
            if (p.label == label) return &p;
        return nullptr;
    }
    template <class F>
    double mean(const std::string& label, F f) const {
        double s = 0;
        for (std::size_t i = 0; i < per_seed.size(); ++i) {
            const PolicyResult* p = find(i, label);
            if (!p) throw ::vlsparse::error("vlsparse-sim claims", "internal: no run '" + label + "'");
            s += f(*p);
        }
        return s / static_cast<double>(per_seed.size());
    }
    double nmse(const std::string& label) const {
        return mean(label, [](const PolicyResult& p) { return p.decode_nmse(); });
    }
    double kept(const std::string& label) const {
        return mean(label, [](const PolicyResult& p) { return p.kept_ratio(); });
    }
};

inline std::string tau_label(double t) { return "zipvl adaptive tau=" + text::fix(t, 2); }
inline std::string fixed_label(double r, bool accumulated) {
    return std::string("zipvl fixed ") + (accumulated ? "accumulated " : "normalized ") + text::fix(r, 2);
}

}  // namespace detail

inline ClaimsResult run_claims(const Scenario& s0, const ClaimsOptions& opt, Progress* progress = nullptr) {
    if (opt.seeds < 1 || opt.seeds > 1000)
        throw ::vlsparse::error("vlsparse-sim claims", "--seeds " + std::to_string(opt.seeds) + ", expected 1 <= seeds <= 1000");
    if (opt.prompts < 1 || opt.prompts > 10000)
        throw ::vlsparse::error("vlsparse-sim claims",
                                "--prompts " + std::to_string(opt.prompts) + ", expected 1 <= prompts <= 10000");
    if (s0.decode_steps < 1)
        throw ::vlsparse::error("vlsparse-sim claims", "decode_steps = 0: the claims compare decode outputs, expected "
                                                       "decode_steps >= 1 (e.g. --set decode_steps=16)");
    const auto t0 = detail::clock::now();
    ClaimsResult R;
    detail::SeedRuns runs;
    std::vector<double> sparse_share;
    const std::int64_t seeds = s0.source.kind == SourceKind::dump ? 1 : opt.seeds;  // a dump is one prompt
    for (std::int64_t i = 0; i < seeds; ++i) {
        Scenario s = s0;
        s.seed = s0.seed + static_cast<std::uint64_t>(i);
        R.seeds.push_back(s.seed);
        std::vector<PolicyToRun> a;
        for (double t : claims_zipvl_taus()) a.push_back(claims_policy(s, detail::tau_label(t), "zipvl", json{{"tau", t}}));
        for (double r : claims_zipvl_budgets())
            for (bool acc : {false, true})
                a.push_back(claims_policy(s, detail::fixed_label(r, acc), "zipvl",
                                          json{{"ratio", "fixed"}, {"fixed_ratio", r}, {"ranking", acc ? "accumulated" : "normalized"}}));
        for (double r : claims_purekv_budgets()) {
            const std::string b = text::fix(r, 2);
            a.push_back(claims_policy(s, "purekv " + b, "purekv", json{{"budget", "fraction"}, {"budget_fraction", r}}));
            a.push_back(claims_policy(s, "purekv layer " + b, "purekv",
                                      json{{"budget", "fraction"}, {"budget_fraction", r}, {"grouping", "layer"}}));
            a.push_back(claims_policy(s, "snapkv " + b, "snapkv", json{{"capacity", r}}));
            a.push_back(claims_policy(s, "h2o " + b, "h2o", json{{"heavy", r / 2}, {"recent", r / 2}}));
        }
        a.push_back(claims_policy(s, "avl core", "avl", json::object()));
        a.push_back(claims_policy(s, "avl no split", "avl", json{{"refresh_every", 0}}));
        check_memory(s, a.size() + 1);
        EngineOptions eo;
        eo.progress = progress;
        RunResult r1 = run_engine(s, std::move(a), eo);
        if (i == 0) {
            R.residual = r1.residual;
            R.source = r1.source;
        }
        // pass 2: fixed ratio at each adaptive run's achieved kept ratio
        std::vector<PolicyToRun> b;
        for (double t : claims_zipvl_taus()) {
            double kept = 0;
            for (const auto& p : r1.runs)
                if (p.label == detail::tau_label(t)) kept = p.kept_ratio();
            b.push_back(claims_policy(s, "zipvl fixed matched tau=" + text::fix(t, 2), "zipvl",
                                      json{{"ratio", "fixed"}, {"fixed_ratio", std::max(kept, 1e-6)}}));
        }
        RunResult r2 = run_engine(s, std::move(b), eo);
        std::vector<PolicyResult> all = std::move(r1.runs);
        for (auto& p : r2.runs) all.push_back(std::move(p));
        runs.per_seed.push_back(std::move(all));
        // BlindSight: Algorithm 1 + 2 (a residual or dump source is one prompt per seed)
        const std::int64_t prompts = s.source.kind == SourceKind::synthetic ? opt.prompts : 1;
        const HeadMap map = characterize_model(s, prompts, BlindSightParams{}, progress);
        sparse_share.push_back(1.0 - template_shares(map.map)[MaskTemplate::dense]);
    }
    {  // ZipVL adaptive vs fixed
        ClaimRow c{"zipvl-adaptive", "ZipVL", "adaptive ratio beats a fixed ratio of the same scores at equal budget", "",
                   "", json::array()};
        int agree = 0;
        for (double t : claims_zipvl_taus()) {
            const std::string al = detail::tau_label(t), fl = "zipvl fixed matched tau=" + text::fix(t, 2);
            const double ka = runs.kept(al), kf = runs.kept(fl), na = runs.nmse(al), nf = runs.nmse(fl);
            agree += na < nf;
            c.measured += (c.measured.empty() ? "" : "; ") + text::pct(ka) + " kept: " + text::sci(na) + " vs " + text::sci(nf);
            c.data.push_back({{"tau", t}, {"kept_adaptive", ka}, {"kept_fixed", kf}, {"nmse_adaptive", na}, {"nmse_fixed", nf}});
        }
        c.measured = "decode NMSE adaptive vs fixed at " + c.measured;
        c.verdict = detail::verdict(agree, static_cast<int>(claims_zipvl_taus().size()));
        R.rows.push_back(c);
    }
    {  // normalized vs accumulated
        ClaimRow c{"zipvl-normalized", "ZipVL", "normalized scores beat accumulated scores at equal budget", "", "",
                   json::array()};
        int agree = 0;
        for (double r : claims_zipvl_budgets()) {
            const double nn = runs.nmse(detail::fixed_label(r, false)), na = runs.nmse(detail::fixed_label(r, true));
            agree += nn < na;
            c.measured += (c.measured.empty() ? "" : "; ") + detail::pct_label(r) + ": " + text::sci(nn) + " vs " + text::sci(na);
            c.data.push_back({{"budget", r}, {"nmse_normalized", nn}, {"nmse_accumulated", na}});
        }
        c.measured = "decode NMSE normalized vs accumulated at " + c.measured;
        c.verdict = detail::verdict(agree, static_cast<int>(claims_zipvl_budgets().size()));
        R.rows.push_back(c);
    }
    {  // PureKV vs H2O / SnapKV
        ClaimRow c{"purekv-budget", "PureKV", "at 10-20% KV budget PureKV >= H2O and SnapKV", "", "", json::array()};
        int agree = 0;
        for (double r : claims_purekv_budgets()) {
            const std::string b = text::fix(r, 2);
            const double p = runs.nmse("purekv " + b), pl = runs.nmse("purekv layer " + b), sk = runs.nmse("snapkv " + b),
                         h = runs.nmse("h2o " + b);
            agree += p <= std::min(sk, h);
            c.measured += (c.measured.empty() ? "" : "; ") + detail::pct_label(r) + ": " + text::sci(p) + " (layer " +
                          text::sci(pl) + ") vs H2O " + text::sci(h) + ", SnapKV " + text::sci(sk);
            c.data.push_back({{"budget", r}, {"nmse_purekv", p}, {"nmse_purekv_layer", pl}, {"nmse_h2o", h}, {"nmse_snapkv", sk}});
        }
        c.measured = "decode NMSE PureKV (grouping layer) vs baselines at " + c.measured;
        c.verdict = detail::verdict(agree, static_cast<int>(claims_purekv_budgets().size()));
        R.rows.push_back(c);
    }
    {  // BlindSight's share of sparse heads
        double m = 0, lo = 1, hi = 0;
        for (double x : sparse_share) m += x, lo = std::min(lo, x), hi = std::max(hi, x);
        m /= static_cast<double>(sparse_share.size());
        ClaimRow c{"blindsight-share", "BlindSight", "about 60% of the heads calibrate as sparse (Sink / Document / Document-Sink)",
                   "sparse heads " + text::pct(m) + (sparse_share.size() > 1 ? " (" + text::pct(lo) + " to " + text::pct(hi) + " over seeds)" : ""),
                   std::abs(m - 0.6) <= 0.1 ? "reproduced" : "not reproduced",
                   json{{"sparse_share", m}, {"per_seed", sparse_share}}};
        R.rows.push_back(c);
    }
    {  // A-VL core
        const double core = runs.nmse("avl core"), full = runs.nmse("avl no split");
        const double mc = runs.mean("avl core", [](const PolicyResult& p) { return p.mass_decode(); });
        ClaimRow c{"avl-core", "A-VL", "decoding on the 30% core (K = 3) keeps outputs close to reading every kept token",
                   "decode NMSE " + text::sci(core) + " vs " + text::sci(full) + " (all kept read), mass " + text::pct(mc),
                   core <= 1.5 * full ? "reproduced" : "not reproduced",
                   json{{"nmse_core", core}, {"nmse_all_kept", full}, {"mass_decode_core", mc}}};
        if (R.residual) {
            const double kl = runs.mean("avl core", [](const PolicyResult& p) { return p.kl_to_dense(); });
            c.measured += ", KL to dense " + text::sci(kl);
            c.data["kl_to_dense_core"] = kl;
        }
        R.rows.push_back(c);
    }
    R.wall_s = detail::since(t0);
    return R;
}

inline void print_claims(std::FILE* f, const ClaimsResult& R) {
    text::Table t({"paper", "claim", "verdict"});
    for (const auto& c : R.rows) t.row({c.paper, c.claim, c.verdict});
    t.print(f, "  ");
    std::fprintf(f, "\nmeasured (decode NMSE against dense, lower is better; means over %zu seed(s)):\n", R.seeds.size());
    for (const auto& c : R.rows) std::fprintf(f, "  %-16s %s\n", c.id.c_str(), c.measured.c_str());
}

inline json claims_json(const Scenario& s, const ClaimsResult& R) {
    json rows = json::array();
    for (const auto& c : R.rows)
        rows.push_back({{"id", c.id}, {"paper", c.paper}, {"claim", c.claim}, {"measured", c.measured}, {"verdict", c.verdict},
                        {"data", c.data}});
    return json{{"format", "vlsparse.sim.claims"},
                {"version", 1},
                {"generator", std::string("vlsparse-sim ") + VLSPARSE_VERSION_STRING},
                {"scenario", to_json(s)},
                {"source", R.source},
                {"residual", R.residual},
                {"seeds", R.seeds},
                {"wall_s", R.wall_s},
                {"claims", rows}};
}

}  // namespace vlsparse::sim
