// Issue 17 in the simulator: `vlsparse-sim export` (a scenario's Q/K/V as a dump; reading the export
// back as a dump source gives the same report; the residual source exports its dense run), and
// PureKV's Spearman validation (Eq. 5-7) in the report.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <vlsparse/sim/commands.hpp>

#include "sim_cli.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;
using namespace vlsparse;
using namespace vlsparse::sim;

namespace {

// Named apart from sim_engine_test.cpp's temp_dir: the two files are compiled as one translation unit
// (tests/meson.build).
fs::path export_temp_dir(const std::string& tag) {
    static std::mt19937_64 rng(std::random_device{}());
    const fs::path p = fs::temp_directory_path() / ("vlsparse_export_test_" + tag + "_" + std::to_string(rng()));
    fs::create_directories(p);
    return p;
}

// A run's report without the wall-clock fields (everything else must be identical).
json without_times(json run) {
    for (const char* k : {"wall_s", "attention_s", "gflops", "prefill_attention_s", "decode_attention_s", "prefill_tflops",
                          "decode_gbps"})
        run["summary"].erase(k);
    for (auto& L : run["layers"])
        for (const char* k : {"decide_s", "attention_s", "other_s", "prefill_attention_s", "decode_attention_s"}) L.erase(k);
    return run;
}

}  // namespace

TEST_CASE("sim export: a synthetic scenario exported and loaded as a dump gives the same report", "[sim][export]") {
    const fs::path d = export_temp_dir("syn");
    json j = json::parse(default_scenario_text());
    j["model"] = {{"layers", 3}, {"heads", 4}, {"kv_heads", 2}, {"head_dim", 32}};
    j["layout"] = "text:8,text:1,image:48,text:1,text:6,text:1,image:40,text:1,text:10";
    j["decode_steps"] = 3;
    j["policies"].push_back(json{{"name", "zipvl"}, {"label", "zipvl-evict"}, {"params", {{"prefill", "dense"}}}});
    j["policies"].push_back("purekv");
    {
        std::ofstream f(d / "s.json");
        f << j.dump(2);
    }
    // Through the command line, as a user would.
    REQUIRE(vt::sim_cli_status({"export", (d / "s.json").string(), (d / "qkv").string()}) == 0);
    const DumpManifest m = read_dump_manifest(d / "qkv");
    const Scenario syn = load_scenario(d / "s.json");
    CHECK(m.shape == syn.model);
    CHECK(m.layout == syn.layout);
    CHECK(m.decode_steps == 3);
    CHECK(m.dtype == DType::f32);
    CHECK(fs::exists(d / "qkv" / "layer_002_v.npy"));

    json k = j;
    k.erase("model");
    k.erase("layout");
    k.erase("decode_steps");
    k["source"] = {{"kind", "dump"}, {"dir", "qkv"}};
    {
        std::ofstream f(d / "dump.json");
        f << k.dump(2);
    }
    const Scenario ds = load_scenario(d / "dump.json");
    const RunResult a = run_scenario(syn), b = run_scenario(ds);
    const json ra = report_json("run", syn, a), rb = report_json("run", ds, b);
    REQUIRE(ra["runs"].size() == rb["runs"].size());
    REQUIRE(ra["runs"].size() == syn.policies.size() + 1);
    for (std::size_t r = 0; r < ra["runs"].size(); ++r) {
        INFO(ra["runs"][r]["label"]);
        CHECK(without_times(ra["runs"][r]) == without_times(rb["runs"][r]));
    }
    // A ZipVL run really selects (the comparison is not vacuous).
    CHECK(a.runs[1].kept_ratio() < 1.0);

    // The export of the dump is the same dump again (values bit for bit).
    REQUIRE(vt::sim_cli_status({"export", (d / "dump.json").string(), (d / "qkv2").string()}) == 0);
    auto p1 = make_plain_source(ds);
    DumpPlainSource p2(d / "qkv2");
    for (std::int64_t l = 0; l < 3; ++l) {
        const LayerQKV x = p1->layer(l), y = p2.layer(l);
        CHECK(x.q == y.q);
        CHECK(x.k == y.k);
        CHECK(x.v == y.v);
    }
    // Bad use is reported.
    CHECK(vt::sim_cli_status({"export"}) == 2);
    CHECK(vt::sim_cli_status({"export", "--dtype", "fp8", (d / "x").string()}) == 2);
    fs::remove_all(d);
}

TEST_CASE("sim export: the residual source exports its dense run", "[sim][export][residual]") {
    const fs::path d = export_temp_dir("res");
    json j = json::parse(default_scenario_text());
    j["model"] = {{"layers", 2}, {"heads", 4}, {"kv_heads", 2}, {"head_dim", 16}};
    j["layout"] = "text:6,image:16[4x4],text:5";
    j["decode_steps"] = 2;
    j["source"] = {{"kind", "residual"}, {"params", {{"hidden", 64}, {"vocab", 50}}}};
    j["policies"] = json::array({"dense"});
    const Scenario s = scenario_from_json(j, "res");
    const ExportResult e = export_scenario(s, d / "qkv", ExportOptions{});
    CHECK(e.dense_tokens.size() == 3);
    DumpPlainSource src(d / "qkv");
    const std::int64_t n = s.n();
    // Layer 0's prompt rows are the projections of the embedded prompt.
    ResidualModelSource model(s.model, residual_params(s), s.layout);
    std::vector<std::int64_t> pos(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) pos[static_cast<std::size_t>(i)] = i;
    LayerQKV want;
    const auto h0 = model.embed_prompt();
    model.project(0, std::span<const float>(h0), std::span<const std::int64_t>(pos), want);
    const LayerQKV got = src.layer(0);
    REQUIRE(got.rows == n + 2);
    CHECK(std::vector<float>(got.q.begin(), got.q.begin() + static_cast<std::ptrdiff_t>(want.q.size())) == want.q);
    // The dense run's tokens match the engine's dense reference.
    EngineOptions eo;
    const RunResult r = run_scenario(s, eo);
    CHECK(r.runs[0].tokens == e.dense_tokens);
    // The manifest records them; the loader ignores the extra key.
    std::ifstream f(d / "qkv" / "manifest.json");
    const json mj = json::parse(f);
    CHECK(mj.at("dense_tokens").get<std::vector<std::int64_t>>() == e.dense_tokens);
    fs::remove_all(d);
}

TEST_CASE("sim purekv validation: the report's Spearman equals the library's validate, per layer and KV head",
          "[sim][purekv][validation]") {
    json j = json::parse(default_scenario_text());
    j["model"] = {{"layers", 4}, {"heads", 4}, {"kv_heads", 2}, {"head_dim", 32}};
    j["layout"] = "text:8,text:1,image:48,text:1,text:6,text:1,image:40,text:1,text:10";
    j["decode_steps"] = 0;
    j["policies"] = json::array({json{{"name", "purekv"}, {"params", {{"l0", 1}, {"window", 8}}}}});
    const Scenario s = scenario_from_json(j, "pv");
    const RunResult r = run_scenario(s);
    REQUIRE(r.purekv.enabled);
    REQUIRE(r.purekv.layers.size() == 2);  // layers 2 and 3
    PureKVParams P;
    P.l0 = 1;
    P.window = 8;
    simd::PureKVEstimator est(P, s.layout, s.model);
    auto src = make_plain_source(s);
    const std::int64_t n = s.n(), H = 4, Hkv = 2, d = 32;
    for (std::int64_t l = 0; l < 4; ++l) {
        const LayerQKV x = src->layer(l);
        const View3<const float> q(x.q.data(), {n, H, d}), k(x.k.data(), {n, Hkv, d}), v(x.v.data(), {n, Hkv, d});
        if (est.needs_scores(l)) est.observe(l, q, k);
        if (l <= 1) continue;
        const PureKVLayerValidation want = est.validate(l, q, k, v);
        const auto& got = r.purekv.layers[static_cast<std::size_t>(l - 2)];
        REQUIRE(got.layer == l);
        REQUIRE(got.rho.size() == 2);
        for (std::size_t g = 0; g < 2; ++g) {
            CHECK(got.rho[g] == want.groups[g].rho);
            CHECK(got.p[g] == want.groups[g].p_value);
            CHECK(got.topk_overlap[g] >= 0.0);
            CHECK(got.topk_overlap[g] <= 1.0);
            CHECK(std::isfinite(got.rho_without_v[g]));
        }
    }
    const json rep = report_json("run", s, r);
    REQUIRE(rep["purekv_validation"]["layers"].size() == 2);
    CHECK(rep["purekv_validation"]["l0"] == 1);
    CHECK(rep["purekv_validation"]["layers"][0]["rho"].size() == 2);
    // Without a purekv policy there is no validation.
    j["policies"] = json::array({"zipvl"});
    const RunResult r2 = run_scenario(scenario_from_json(j, "no pv"));
    CHECK_FALSE(r2.purekv.enabled);
    CHECK(report_json("run", s, r2)["purekv_validation"].is_null());
}

TEST_CASE("sim generator: head roles are fixed by model_seed, prompt content by seed", "[sim][synthetic][issue17]") {
    const Layout layout = Layout::parse("text:8,image:36[6x6],text:6");
    SyntheticParams P;
    P.n_heads = 8;
    P.n_kv_heads = 4;
    P.head_dim = 32;
    // Default (model_seed -1): the model follows the seed, bit for bit as before.
    P.seed = 3;
    const SyntheticLayer a = synthetic_layer(layout, P, 2);
    SyntheticParams M = P;
    M.model_seed = 3;
    const SyntheticLayer b = synthetic_layer(layout, M, 2);
    CHECK(a.q == b.q);
    CHECK(a.k == b.k);
    CHECK(a.v == b.v);
    // One model, several prompts: every layer's kinds and weights stay, the content changes.
    M.model_seed = 11;
    bool kinds_differ_without = false;
    for (std::int64_t l = 0; l < 6; ++l) {
        SyntheticParams p1 = M, p2 = M;
        p1.seed = 1;
        p2.seed = 2;
        CHECK(synthetic_head_kinds(p1, l) == synthetic_head_kinds(p2, l));
        const auto w1 = synthetic_head_weights(p1, l), w2 = synthetic_head_weights(p2, l);
        for (std::size_t h = 0; h < w1.size(); ++h) {
            CHECK(w1[h].sink == w2[h].sink);
            CHECK(w1[h].heavy == w2[h].heavy);
            CHECK(w1[h].local == w2[h].local);
            CHECK(w1[h].document == w2[h].document);
        }
        CHECK(synthetic_layer(layout, p1, l).q != synthetic_layer(layout, p2, l).q);
        // Without a model seed, the seed redraws the model (what issue 17 found).
        SyntheticParams o1 = p1, o2 = p2;
        o1.model_seed = o2.model_seed = -1;
        kinds_differ_without |= synthetic_head_kinds(o1, l) != synthetic_head_kinds(o2, l);
    }
    CHECK(kinds_differ_without);
    // The scenario key: read, range-checked.
    json j = json::parse(default_scenario_text());
    j["source"] = {{"kind", "synthetic"}, {"params", {{"model_seed", 5}}}};
    CHECK(synthetic_params(scenario_from_json(j, "ms")).model_seed == 5);
    j["source"]["params"]["model_seed"] = -2;
    CHECK_THROWS_WITH(scenario_from_json(j, "ms"), Catch::Contains("model_seed"));
}

TEST_CASE("sim characterize: a residual source is calibrated on its dense run", "[sim][characterize][residual][issue17]") {
    const fs::path d = export_temp_dir("char");
    json j = json::parse(default_scenario_text());
    j["model"] = {{"layers", 2}, {"heads", 4}, {"kv_heads", 2}, {"head_dim", 16}};
    j["layout"] = "text:6,image:16[4x4],text:2,image:16[4x4],text:5";
    j["decode_steps"] = 0;
    j["source"] = {{"kind", "residual"}, {"params", {{"hidden", 64}, {"vocab", 50}}}};
    j["policies"] = json::array({"dense"});
    {
        std::ofstream f(d / "r.json");
        f << j.dump(2);
    }
    REQUIRE(vt::sim_cli_status({"characterize", (d / "r.json").string(), "--out", (d / "map.json").string(), "--quiet"}) == 0);
    const HeadMap map = load_head_map(d / "map.json", ModelShape{2, 4, 2, 16});
    CHECK(map.prompts == 1);
    CHECK(map.map.size() == 8);
    fs::remove_all(d);
}
