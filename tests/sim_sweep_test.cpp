// Tests of `vlsparse-sim sweep` (interpolation at matched budgets, seeds, outputs), of the ablations of
// issue 16 (PureKV's own-layer scores, A-VL's K = 1 and no core split, BlindSight uniform against a
// head map), of `vlsparse-sim claims` end to end on a small scenario, and of `realism` and `fit`.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <vlsparse/sim/commands.hpp>

#include "sim_cli.hpp"
#include "test_util.hpp"

namespace sim_sweep_test {

namespace fs = std::filesystem;
using namespace vlsparse;
using namespace vlsparse::sim;
using Catch::Matchers::Contains;

// The default scenario's policies on a small shape.
json sweep_small_json(std::int64_t decode_steps = 3) {
    json j = json::parse(default_scenario_text());
    j["model"] = {{"layers", 3}, {"heads", 4}, {"kv_heads", 2}, {"head_dim", 32}};
    j["layout"] = "text:8,text:1,image:48,text:1,text:6,text:1,image:40,text:1,text:10";
    j["decode_steps"] = decode_steps;
    for (auto& p : j["policies"])  // SnapKV's window of 32 is above 10% of 116 tokens
        if (p.is_object() && p["name"] == "snapkv") p["params"]["window"] = 8;
    return j;
}

fs::path sweep_temp_dir(const std::string& tag) {
    static std::mt19937_64 rng(std::random_device{}());
    const fs::path p = fs::temp_directory_path() / ("vlsparse_sweep_test_" + tag + "_" + std::to_string(rng()));
    fs::create_directories(p);
    return p;
}

using vt::sim_cli;
using vt::SimCliOutput;

fs::path sweep_write_scenario(const json& j, const std::string& tag) {
    const fs::path d = sweep_temp_dir(tag);
    std::ofstream(d / "s.json") << j.dump(2);
    return d / "s.json";
}

}  // namespace sim_sweep_test

using namespace sim_sweep_test;

TEST_CASE("sim sweep: interpolation at a budget", "[sim][sweep]") {
    const std::vector<double> x = {0.1, 0.3, 0.5}, y = {1e-1, 1e-3, 1e-4};
    // exact at a measured point (matched budgets give the measured value, bit for bit)
    for (std::size_t i = 0; i < x.size(); ++i) {
        CHECK(interpolate(x, y, x[i], true).value() == y[i]);
        CHECK(interpolate(x, y, x[i], false).value() == y[i]);
    }
    // linear in x, on log10(y) for log metrics
    CHECK(interpolate(x, y, 0.2, false).value() == Approx((1e-1 + 1e-3) / 2));
    CHECK(interpolate(x, y, 0.2, true).value() == Approx(1e-2));
    CHECK(interpolate(x, y, 0.4, true).value() == Approx(std::sqrt(1e-3 * 1e-4)));
    // a zero end falls back to linear
    const std::vector<double> z = {0.0, 1.0};
    CHECK(interpolate(std::vector<double>{0.0, 1.0}, z, 0.25, true).value() == Approx(0.25));
    // never extrapolated
    CHECK_FALSE(interpolate(x, y, 0.05, false).has_value());
    CHECK_FALSE(interpolate(x, y, 0.55, true).has_value());
    CHECK_FALSE(interpolate(std::vector<double>{}, std::vector<double>{}, 0.1, false).has_value());
}

TEST_CASE("sim sweep: curves over seeds, mean and spread", "[sim][sweep]") {
    std::vector<SweepPoint> pts;
    auto add = [&](std::uint64_t seed, double kept, double nmse) {
        SweepPoint p;
        p.policy = "a";
        p.seed = seed;
        p.kept = kept;
        p.flops = 1.0 - kept;  // a different axis
        p.decode_nmse = nmse;
        pts.push_back(p);
    };
    add(1, 0.3, 0.01), add(1, 0.1, 0.1);  // out of order: sorted by the axis
    add(2, 0.2, 0.04), add(2, 0.4, 0.02);
    SweepOptions o;
    o.budgets = {0.1, 0.2, 0.3, 0.5};
    const auto curves = sweep_curves(pts, {"a"}, o, false, true);
    const SweepCurve* c = nullptr;
    for (const auto& x : curves)
        if (std::string(x.metric->key) == "decode_nmse") c = &x;
    REQUIRE(c != nullptr);
    REQUIRE(c->cells.size() == 4);
    CHECK(c->cells[0].seeds == 1);  // only seed 1 reaches 10%
    CHECK(c->cells[0].mean == 0.1);
    CHECK(c->cells[1].seeds == 2);  // seed 1 interpolated (log), seed 2 measured
    CHECK(c->cells[1].min == Approx(std::sqrt(0.1 * 0.01)));
    CHECK(c->cells[1].max == 0.04);
    CHECK(c->cells[1].mean == Approx((std::sqrt(0.1 * 0.01) + 0.04) / 2));
    CHECK(c->cells[2].seeds == 2);
    CHECK(c->cells[3].seeds == 0);
    CHECK(std::isnan(c->cells[3].mean));
    // the FLOPs axis reads the other coordinate
    o.axis = SweepAxis::flops;
    o.budgets = {0.7};
    const auto cf = sweep_curves(pts, {"a"}, o, false, true);
    CHECK(cf[0].cells[0].seeds == 2);
    CHECK(cf[0].cells[0].min == 0.01);  // seed 1 at flops 0.7 = kept 0.3, measured
    CHECK(cf[0].cells[0].max == Approx(std::sqrt(0.02 * 0.04)));  // seed 2 between flops 0.6 and 0.8
}

TEST_CASE("sim sweep: every policy's default sweep, seeds, matched budgets", "[sim][sweep]") {
    json js = sweep_small_json();
    if (vt::small_run()) {  // sanitizer builds: three policies' sweeps (26 s -> 9 s under ASan + UBSan at -O0)
        WARN("VLSPARSE_TEST_SMALL is set: the sweeps of zipvl, avl and snapkv only");
        json keep = json::array();
        for (const auto& p : js["policies"])
            if (p["name"] == "zipvl" || p["name"] == "avl" || p["name"] == "snapkv") keep.push_back(p);
        js["policies"] = keep;
    }
    const Scenario s = scenario_from_json(js, "small");
    SweepOptions o;
    o.seeds = 2;
    o.budgets = {0.2, 0.3, 0.5};
    const SweepResult R = run_sweep(s, o, [](const Scenario& si) { return sweep_policies(si); });
    REQUIRE(R.seeds == std::vector<std::uint64_t>{s.seed, s.seed + 1});
    // one point per (run of compare, seed)
    const std::size_t per_seed = sweep_policies(s).size() + 1;
    CHECK(R.points.size() == 2 * per_seed);
    // monotone budgets: along each policy's sweep, the achieved kept ratio moves one way
    for (const auto& pol : R.policies) {
        for (std::uint64_t seed : R.seeds) {
            std::vector<double> k;
            for (const auto& p : R.points)
                if (p.policy == pol && p.seed == seed) k.push_back(p.kept);
            if (k.size() < 2) continue;
            bool up = true, down = true;
            for (std::size_t i = 1; i < k.size(); ++i) up &= k[i] >= k[i - 1], down &= k[i] <= k[i - 1];
            INFO(pol << " seed " << seed);
            CHECK((up || down));
        }
    }
    // each seed's numbers equal a plain compare run of that seed (ZipVL's and SnapKV's sweeps: each run
    // is independent of the others in plain mode)
    Scenario s2 = s;
    s2.seed = s.seed + 1;
    std::vector<PolicyToRun> some;
    for (auto& p : sweep_policies(s2))
        if (p.name == "zipvl" || p.name == "snapkv") some.push_back(std::move(p));
    const std::size_t compared = some.size() + 1;
    const RunResult r2 = run_engine(s2, std::move(some));
    std::size_t checked = 0;
    for (const auto& p : r2.runs) {
        const std::string pol = p.sweep_of.empty() ? p.label : p.sweep_of;
        for (const auto& q : R.points)
            if (q.seed == s2.seed && q.policy == pol && q.value == p.sweep_value) {
                CHECK(q.kept == p.kept_ratio());
                CHECK(q.decode_nmse == p.decode_nmse());
                ++checked;
            }
    }
    CHECK(checked == compared);
    // matched interpolation: a budget equal to a measured kept ratio returns that point's value
    const SweepPoint* snap = nullptr;
    for (const auto& q : R.points)
        if (q.policy == "snapkv" && q.seed == s.seed && q.value == "capacity=0.3") snap = &q;
    REQUIRE(snap != nullptr);
    SweepOptions one;
    one.budgets = {snap->kept};
    std::vector<SweepPoint> seed1;
    for (const auto& q : R.points)
        if (q.seed == s.seed) seed1.push_back(q);
    for (const auto& c : sweep_curves(seed1, {"snapkv"}, one, false, true)) {
        INFO(c.metric->key);
        REQUIRE(c.cells[0].seeds == 1);
        CHECK(c.cells[0].mean == (*snap).*(c.metric->field));
    }
    // text, JSON and HTML
    const json j = sweep_json(s, R);
    CHECK(j["format"] == "vlsparse.sim.sweep");
    CHECK(j["points"].size() == R.points.size());
    CHECK(j["curves"].size() == R.curves.size());
    const std::string html = sweep_html(s, R);
    CHECK(html.find("<svg") != std::string::npos);
    CHECK(html.find("NMSE decode at matched budget") != std::string::npos);
}

TEST_CASE("sim sweep: command line, outputs and bad input", "[sim][sweep]") {
    json js = sweep_small_json(2);
    json keep = json::array();  // a few policies: the command's outputs, not every policy again
    for (const auto& p : js["policies"])
        if (p["name"] == "zipvl" || p["name"] == "blindsight" || p["name"] == "snapkv") keep.push_back(p);
    js["policies"] = keep;
    const fs::path f = sweep_write_scenario(js, "cli");
    const fs::path d = f.parent_path();
    const SimCliOutput r = sim_cli({"sweep", f.string(), "--seeds", "1", "--budgets", "20%,0.5", "--quiet", "--json",
                                    (d / "s.json.out").string(), "--out", d.string()});
    INFO(r.out << r.err);
    REQUIRE(r.rc == 0);
    CHECK_THAT(r.out, Contains("NMSE decode at matched kept ratio (KV)"));
    CHECK_THAT(r.out, Contains("not shown (no sweep point within the budgets on this axis): dense, blindsight"));
    CHECK_THAT(r.out, Contains("(BlindSight and dense keep every token: see --x flops)"));
    CHECK(fs::exists(d / "sim-sweep.html"));
    std::ifstream jf(d / "s.json.out");
    const json j = json::parse(jf);
    CHECK(j["budgets"] == json::array({0.2, 0.5}));
    CHECK(j["axis"] == "kept");
    // FLOPs axis: BlindSight has points there
    const SimCliOutput rf = sim_cli({"sweep", f.string(), "--seeds", "1", "--x", "flops", "--budgets", "0.3,0.6", "--quiet",
                                     "--no-html", "--json", (d / "flops.json").string()});
    REQUIRE(rf.rc == 0);
    CHECK_THAT(rf.out, Contains("at matched attention FLOPs"));
    std::ifstream ff(d / "flops.json");
    const json jflops = json::parse(ff);
    bool blindsight_reached = false;
    for (const auto& c : jflops["curves"])
        if (c["policy"] == "blindsight" && c["metric"] == "prefill_nmse") blindsight_reached = c["cells"][1]["seeds"] == 1;
    CHECK(blindsight_reached);
    // bad input: named, exit status 2, before anything runs
    const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
        {{"--seeds", "0"}, "--seeds: '0' is not an integer in [1, 1000]"},
        {{"--budgets", "0.5,0.2"}, "--budgets: expected increasing budgets, got 0.500000 then 0.200000"},
        {{"--budgets", "1.5"}, "--budgets: 1.500000 is not in (0, 1]"},
        {{"--budgets", "0.1,x"}, "--budgets: 'x' is not a number"},
        {{"--x", "tokens"}, "--x: 'tokens', expected kept or flops"},
        {{"--bogus"}, "unknown option '--bogus'"},
    };
    for (const auto& [args, msg] : bad) {
        std::vector<std::string> a = {"sweep", f.string(), "--quiet", "--no-html"};
        a.insert(a.end(), args.begin(), args.end());
        const SimCliOutput e = sim_cli(a);
        INFO(args[0]);
        CHECK(e.rc == 2);
        CHECK_THAT(e.err, Contains(msg));
    }
}

TEST_CASE("sim ablation: PureKV's own-layer scores equal l0 moved to that layer", "[sim][ablation]") {
    const Scenario s = scenario_from_json(sweep_small_json(0), "purekv");
    const auto src = make_plain_source(s);
    PureKVParams P;
    P.l0 = 0;
    P.window = 8;
    P.budget_fraction = 0.3;
    const PolicyContext ctx{s.model, {}};
    const PolicyInfo& info = policy_info("purekv", JsonWhere{});
    AnyPolicy own = info.make(json{{"l0", 0}, {"window", 8}, {"budget_fraction", 0.3}, {"own_layer_scores", true}}, JsonWhere{}, ctx);
    own.begin(s.layout, s.model);
    AnyPolicy cross = PureKVPolicy(P);
    cross.begin(s.layout, s.model);
    const std::int64_t n = s.n(), H = s.model.heads, Hkv = s.model.kv_heads, d = s.model.head_dim;
    std::vector<std::int64_t> pos(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) pos[static_cast<std::size_t>(i)] = i;
    int differs_from_cross = 0;
    for (std::int64_t l = 0; l < s.model.layers; ++l) {
        const LayerQKV x = src->layer(l);
        const View3<const float> q(x.q.data(), {n, H, d}), k(x.k.data(), {n, Hkv, d}), v(x.v.data(), {n, Hkv, d});
        const PrefillLayer in{&s.layout, s.model, l, q, k, v, pos};
        // the hand-built equivalent: PureKV with l0 = l scores layer l with its own window (Eq. 3)
        PureKVParams Pl = P;
        Pl.l0 = l;
        PureKVPolicy here(Pl);
        here.begin(s.layout, s.model);
        for (std::int64_t m = 0; m < l; ++m) {  // lower layers observe their own scores first
            const LayerQKV xm = src->layer(m);
            (void)here.prefill(PrefillLayer{&s.layout, s.model, m, View3<const float>(xm.q.data(), {n, H, d}),
                                            View3<const float>(xm.k.data(), {n, Hkv, d}),
                                            View3<const float>(xm.v.data(), {n, Hkv, d}), pos});
        }
        const PrefillDecision a = own.prefill(in), b = here.prefill(in), c = cross.prefill(in);
        INFO("layer " << l);
        CHECK(a.kv.indices == b.kv.indices);
        differs_from_cross += a.kv.indices != c.kv.indices;
    }
    CHECK(differs_from_cross > 0);  // the ablation changes something above l0
    // bad type, named
    CHECK_THROWS_WITH(info.make(json{{"own_layer_scores", 1}}, JsonWhere{"t.json", "policies[0].params"}, ctx),
                      Contains("policies[0].params.own_layer_scores: expected true or false, got 1"));
}

TEST_CASE("sim ablation: A-VL with K = 1, without the core split, and with core = kept agree", "[sim][ablation]") {
    json j = sweep_small_json(5);
    j["policies"] = json::array({json{{"name", "avl"}, {"label", "k1"}, {"params", {{"refresh_every", 1}}}},
                                 json{{"name", "avl"}, {"label", "nosplit"}, {"params", {{"refresh_every", 0}}}},
                                 json{{"name", "avl"}, {"label", "core=kept"}, {"params", {{"compute_rate", 0.5}}}},
                                 json{{"name", "avl"}, {"label", "k3"}}});
    const RunResult r = run_scenario(scenario_from_json(j, "avl"));
    REQUIRE(r.runs.size() == 5);
    // every step reads every kept row: K = 1 (always refresh), K = 0 (no split) and a core as large as
    // the kept set (compute_rate = rate) are one computation
    for (std::size_t k : {2, 3}) {
        INFO(r.runs[k].label);
        for (std::size_t l = 0; l < r.runs[1].layers.size(); ++l) {
            CHECK(r.runs[k].layers[l].decode_pairs == r.runs[1].layers[l].decode_pairs);
            CHECK(r.runs[k].layers[l].decode_err.num == r.runs[1].layers[l].decode_err.num);
            CHECK(r.runs[k].layers[l].mass_decode == r.runs[1].layers[l].mass_decode);
        }
    }
    // the paper's K = 3 reads fewer rows on the steps between refreshes
    CHECK(r.runs[4].decode_flops_ratio() < r.runs[1].decode_flops_ratio());
}

TEST_CASE("sim ablation: BlindSight uniform template equals a head map of that template", "[sim][ablation]") {
    const fs::path d = sweep_temp_dir("map");
    const json base = sweep_small_json(0);
    const Scenario s0 = scenario_from_json(base, "bs");
    for (const char* t : {"Sink", "Document"}) {
        HeadMap m;
        m.layers = s0.model.layers;
        m.heads = s0.model.heads;
        m.kv_heads = s0.model.kv_heads;
        m.head_dim = s0.model.head_dim;
        m.map.assign(static_cast<std::size_t>(m.layers * m.heads), mask_template_from_string(t));
        const fs::path f = d / (std::string(t) + ".json");
        save_head_map(m, f.string());
        json j = base;
        j["policies"] = json::array({json{{"name", "blindsight"}, {"label", "uniform"}, {"params", {{"template", t}}}},
                                     json{{"name", "blindsight"}, {"label", "map"}, {"params", {{"head_map", f.string()}}}}});
        const RunResult r = run_scenario(scenario_from_json(j, "bs"));
        INFO(t);
        for (std::size_t l = 0; l < r.runs[1].layers.size(); ++l) {
            CHECK(r.runs[1].layers[l].prefill_pairs == r.runs[2].layers[l].prefill_pairs);
            CHECK(r.runs[1].layers[l].prefill_err.num == r.runs[2].layers[l].prefill_err.num);
        }
        CHECK(r.runs[1].prefill_nmse() > 0.0);
    }
}

TEST_CASE("sim claims: end to end on a small scenario", "[sim][claims]") {
    json j = sweep_small_json(3);
    const Scenario s = scenario_from_json(j, "claims");
    ClaimsOptions o;
    o.seeds = 1;
    o.prompts = 1;
    const ClaimsResult R = run_claims(s, o);
    REQUIRE(R.rows.size() == 5);
    const std::vector<std::string> ids = {"zipvl-adaptive", "zipvl-normalized", "purekv-budget", "blindsight-share", "avl-core"};
    for (std::size_t i = 0; i < ids.size(); ++i) {
        CHECK(R.rows[i].id == ids[i]);
        const std::string& v = R.rows[i].verdict;
        CHECK((v == "reproduced" || v == "not reproduced" || v.rfind("partly (", 0) == 0));
    }
    // the PureKV row's numbers are those of the same policies run by hand
    json h = j;
    h["policies"] = json::array({json{{"name", "purekv"}, {"params", {{"budget", "fraction"}, {"budget_fraction", 0.1}}}},
                                 json{{"name", "snapkv"}, {"params", {{"capacity", 0.1}, {"window", 8}}}},  // the scenario's window
                                 json{{"name", "h2o"}, {"params", {{"heavy", 0.05}, {"recent", 0.05}}}}});
    const RunResult r = run_scenario(scenario_from_json(h, "hand"));
    const json& d = R.rows[2].data[0];
    CHECK(d["budget"] == 0.1);
    CHECK(d["nmse_purekv"].get<double>() == r.runs[1].decode_nmse());
    CHECK(d["nmse_snapkv"].get<double>() == r.runs[2].decode_nmse());
    CHECK(d["nmse_h2o"].get<double>() == r.runs[3].decode_nmse());
    int agree = 0;
    for (const auto& x : R.rows[2].data)
        agree += x["nmse_purekv"].get<double>() <= std::min(x["nmse_snapkv"].get<double>(), x["nmse_h2o"].get<double>());
    CHECK(R.rows[2].verdict == vlsparse::sim::detail::verdict(agree, 2));
    // ZipVL's fixed runs are matched to the adaptive runs' kept ratios
    for (const auto& x : R.rows[0].data) CHECK(std::abs(x["kept_adaptive"].get<double>() - x["kept_fixed"].get<double>()) < 0.02);
    // BlindSight's share is Algorithm 2's
    const HeadMap m = characterize_model(s, 1, BlindSightParams{});
    CHECK(R.rows[3].data["sparse_share"].get<double>() == 1.0 - template_shares(m.map)[MaskTemplate::dense]);
    // JSON and the command line
    CHECK(claims_json(s, R)["claims"].size() == 5);
    const fs::path f = sweep_write_scenario(j, "claims");
    const SimCliOutput c = sim_cli({"claims", f.string(), "--seeds", "1", "--prompts", "1", "--quiet"});
    INFO(c.out << c.err);
    REQUIRE(c.rc == 0);
    CHECK_THAT(c.out, Contains("zipvl-normalized"));
    CHECK_THAT(c.out, Contains("BlindSight"));
    // decode steps are needed
    const SimCliOutput e = sim_cli({"claims", f.string(), "--set", "decode_steps=0", "--quiet"});
    CHECK(e.rc == 2);
    CHECK_THAT(e.err, Contains("decode_steps = 0: the claims compare decode outputs"));
    const SimCliOutput e2 = sim_cli({"claims", f.string(), "--prompts", "0"});
    CHECK(e2.rc == 2);
    CHECK_THAT(e2.err, Contains("--prompts: '0' is not an integer in [1, 10000]"));
}

TEST_CASE("sim realism: uniform attention gives the closed-form statistics", "[sim][realism]") {
    // q = 0: every row attends uniformly to the keys at or before it
    const Layout layout = Layout::parse("text:4,image:20,text:8");
    const ModelShape m{1, 2, 1, 8};
    const std::int64_t n = layout.n();
    std::vector<float> q(static_cast<std::size_t>(n * 2 * 8), 0.0f), k(static_cast<std::size_t>(n * 8)), v(k.size(), 1.0f);
    std::mt19937 rng(3);
    std::normal_distribution<float> nd;
    for (auto& x : k) x = nd(rng);
    RealismOptions o;
    o.window = 8;
    std::vector<double> scores;
    const LayerRealism r = measure_layer(layout, m, 0, q.data(), k.data(), v.data(), o, scores);
    double first = 0, sinks = 0, local = 0;
    for (std::int64_t i = n / 4; i < n; ++i) {  // 24 rows: all of [8, 32)
        first += 1.0 / double(i + 1);
        sinks += 2.0 / double(i + 1);  // ceil(0.1 * 20) = 2 image sinks, positions 4 and 5
        local += 5.0 / double(i + 1);  // keys i - 4 .. i
    }
    CHECK(r.first_token_mass == Approx(first / 24).epsilon(1e-12));
    CHECK(r.image_sink_mass == Approx(sinks / 24).epsilon(1e-12));
    CHECK(r.local_mass == Approx(local / 24).epsilon(1e-12));
    CHECK(r.entropy == Approx(1.0).epsilon(1e-12));
    CHECK(r.head_entropy_std == Approx(0.0).margin(1e-12));
    CHECK(r.diffuse_share == 1.0);
    REQUIRE(scores.size() == 24);  // the keys before the window of 8
    CHECK(r.heavy_share == Approx(2.0 / 24).epsilon(1e-9));  // equal scores: the top 5% (2 keys) hold 2/24
}

TEST_CASE("sim realism: the generator's planted head kinds show in the statistics", "[sim][realism]") {
    auto measure = [](const char* kind) {
        json j = sweep_small_json(0);
        j["source"] = {{"kind", "synthetic"}, {"params", {{"head_kinds", json::array({kind, kind, kind, kind})}}}};
        return measure_realism(scenario_from_json(j, kind), RealismOptions{});
    };
    const RealismResult sink = measure("sink"), local = measure("local"), diffuse = measure("diffuse");
    REQUIRE(sink.layers.size() == 3);
    CHECK(sink.mean.first_token_mass + sink.mean.image_sink_mass > 2 * (local.mean.first_token_mass + local.mean.image_sink_mass));
    CHECK(local.mean.local_mass > 2 * sink.mean.local_mass);
    CHECK(diffuse.mean.entropy > sink.mean.entropy);
    CHECK(diffuse.mean.entropy > local.mean.entropy);
    CHECK(std::isfinite(sink.layers[0].rho_next));
    CHECK(std::isnan(sink.layers[2].rho_next));  // no next layer
    // the command line: table, JSON, bad input
    const fs::path f = sweep_write_scenario(sweep_small_json(0), "realism");
    const SimCliOutput r = sim_cli({"realism", f.string(), "--quiet", "--json", (f.parent_path() / "r.json").string()});
    INFO(r.out << r.err);
    REQUIRE(r.rc == 0);
    CHECK_THAT(r.out, Contains("rho"));
    std::ifstream jf(f.parent_path() / "r.json");
    const json j = json::parse(jf);
    CHECK(j["format"] == "vlsparse.sim.realism");
    CHECK(j["layers"].size() == 3);
    const SimCliOutput e = sim_cli({"realism", f.string(), "--rows", "0"});
    CHECK(e.rc == 2);
    CHECK_THAT(e.err, Contains("--rows: '0' is not an integer in [1, 1048576]"));
}

TEST_CASE("sim fit: the generator fitted to a synthetic target with other parameters", "[sim][realism][fit]") {
    // a target whose planted sink and locality differ from the defaults: the fit lowers the distance
    json t = sweep_small_json(0);
    t["source"] = {{"kind", "synthetic"}, {"params", {{"sink", 4.0}, {"local", 20.0}}}};
    t["seed"] = 5;
    const Scenario target = scenario_from_json(t, "target");
    RealismOptions o;
    o.rows = 8;
    const FitResult F = fit_generator(target, o, 1);
    CHECK(F.distance_start == realism_distance(F.start, F.target));
    CHECK(F.distance_fitted == realism_distance(F.fitted, F.target));
    CHECK(F.distance_fitted < 0.75 * F.distance_start);  // one pass of a local search: measured 0.54x at 16 rows
    CHECK(F.params["sink"].get<double>() < 16.0);   // moved towards the target's 4
    CHECK(F.params["local"].get<double>() > 10.0);  // and its 20
    CHECK(F.evaluations > 8);
    // the command line writes a scenario that runs
    const fs::path f = sweep_write_scenario(t, "fit");
    const fs::path out = f.parent_path() / "fitted.json";
    const SimCliOutput r = sim_cli({"fit", f.string(), "--rows", "8", "--passes", "1", "--quiet", "--out", out.string()});
    INFO(r.out << r.err);
    REQUIRE(r.rc == 0);
    CHECK_THAT(r.out, Contains("generator defaults"));
    std::ifstream jf(out);
    const json fitted = json::parse(jf);
    CHECK(fitted["source"]["kind"] == "synthetic");
    CHECK(fitted["source"]["params"] == F.params);
    const Scenario back = scenario_from_json(fitted, out.string());
    CHECK(back.layout.to_string() == target.layout.to_string());
    const SimCliOutput e = sim_cli({"fit"});
    CHECK(e.rc == 2);
    CHECK_THAT(e.err, Contains("missing TARGET"));
}
