// The simulator's engine (sim/include/vlsparse/sim/): scenario parsing and every rejection with its
// JSON path, the engine's mechanics driven through AnyPolicy (token-sparse prefill, sequence
// reduction, decode eviction, masses, pair counts), the default scenario end to end on a small
// shape, the reports, and `golden verify` on a correct and a corrupted copy of a golden case.
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include <vlsparse/sim/commands.hpp>

#include "test_util.hpp"
#include "error_of.hpp"
#include "sim_cli.hpp"

namespace fs = std::filesystem;
using namespace vlsparse;
using namespace vlsparse::sim;

namespace {

fs::path source_dir() { return fs::path(VLSPARSE_SOURCE_DIR); }

fs::path golden_root() {
    if (const char* d = std::getenv("VLSPARSE_GOLDEN_DIR")) return d;
    return source_dir() / "golden";
}

// A fresh empty folder under the system temp folder.
fs::path temp_dir(const std::string& tag) {
    static std::mt19937_64 rng(std::random_device{}());
    const fs::path p = fs::temp_directory_path() / ("vlsparse_sim_test_" + tag + "_" + std::to_string(rng()));
    fs::create_directories(p);
    return p;
}

json default_json() { return json::parse(default_scenario_text()); }

// The default scenario on a small shape (same policies).
json small_default_json(std::int64_t decode_steps = 4) {
    json j = default_json();
    j["model"] = {{"layers", 3}, {"heads", 4}, {"kv_heads", 2}, {"head_dim", 32}};
    j["layout"] = "text:8,text:1,image:48,text:1,text:6,text:1,image:40,text:1,text:10";
    j["decode_steps"] = decode_steps;
    return j;
}

// Parses j and returns the error message ("" when it parses).
std::string parse_error(const json& j) {
    try {
        (void)scenario_from_json(j, "t.json");
    } catch (const vlsparse::error& e) {
        return e.what();
    }
    return "";
}

// Same, for a scenario whose relative paths resolve against `base`.
std::string parse_error_in(const json& j, const fs::path& base) {
    try {
        (void)scenario_from_json(j, "t.json", base);
    } catch (const vlsparse::error& e) {
        return e.what();
    }
    return "";
}

std::int64_t index_of(const json& j, const std::string& name) {
    for (std::size_t i = 0; i < j["policies"].size(); ++i)
        if (j["policies"][i]["name"] == name) return static_cast<std::int64_t>(i);
    return -1;
}

using vt::error_of;

using vt::sim_cli;
using vt::sim_cli_status;
using vt::SimCliOutput;

// Sets an environment variable for the scope (restoring the previous value).
struct ScopedEnv {
    std::string name;
    std::optional<std::string> old;
    ScopedEnv(std::string n, const std::string& value) : name(std::move(n)) {
        if (const char* v = std::getenv(name.c_str())) old = v;
        ::setenv(name.c_str(), value.c_str(), 1);
    }
    ~ScopedEnv() {
        if (old) ::setenv(name.c_str(), old->c_str(), 1);
        else ::unsetenv(name.c_str());
    }
};

// ---- test policies: each exercises one part of the engine's contract ---------------------------

// Keeps everything but declares a token-sparse prefill over every row: must equal dense attention.
struct AllSparsePolicy : DecodeReadsAll {
    std::string_view name() const { return "all_sparse"; }
    void begin(const Layout&, const ModelShape&) {}
    PrefillDecision prefill(const PrefillLayer& in) {
        PrefillDecision d;
        d.kv.n = in.layout->n();
        d.kv.indices.emplace_back(in.positions.begin(), in.positions.end());
        d.sparse_prefill = true;
        return d;
    }
};

// Keeps the positions with an even index of the sequence in the cache (shared), token-sparse prefill.
struct EvenPolicy : DecodeReadsAll {
    std::string_view name() const { return "even"; }
    void begin(const Layout&, const ModelShape&) {}
    PrefillDecision prefill(const PrefillLayer& in) {
        PrefillDecision d;
        d.kv.n = in.layout->n();
        d.kv.indices.emplace_back();
        for (auto p : in.positions)
            if (p % 2 == 0 || p == in.layout->n() - 1) d.kv.indices[0].push_back(p);
        d.sparse_prefill = true;
        return d;
    }
};

// At layer 0 drops every image token at an odd position from the sequence (FastV-like).
struct DropOddImagePolicy : DecodeReadsAll {
    std::string_view name() const { return "drop_odd_image"; }
    void begin(const Layout&, const ModelShape&) {}
    PrefillDecision prefill(const PrefillLayer& in) {
        PrefillDecision d;
        d.kv.n = in.layout->n();
        d.kv.indices.emplace_back(in.positions.begin(), in.positions.end());
        if (in.layer == 0)
            for (auto p : in.positions)
                if (in.layout->is_text(p) || p % 2 == 0) d.sequence.push_back(p);
        return d;
    }
};

// Decode: reads everything and evicts the oldest position after position 0 at every step.
struct EvictOldestPolicy {
    std::string_view name() const { return "evict_oldest"; }
    void begin(const Layout&, const ModelShape&) {}
    PrefillDecision prefill(const PrefillLayer& in) {
        PrefillDecision d;
        d.kv.n = in.layout->n();
        d.kv.indices.emplace_back(in.positions.begin(), in.positions.end());
        return d;
    }
    TokenSelection decode_read(std::int64_t, std::int64_t, const TokenSelection& cached) { return cached; }
    std::optional<TokenSelection> decode_observe(std::int64_t, std::int64_t, const TokenSelection& read,
                                                 std::span<const std::vector<double>> attn) {
        // attn: one head-mean vector per read list, summing to 1
        for (std::size_t g = 0; g < attn.size(); ++g) {
            double s = 0.0;
            for (double a : attn[g]) s += a;
            if (std::abs(s - 1.0) > 1e-5) throw vlsparse::error("evict_oldest", "attention does not sum to 1");
            if (attn[g].size() != read.indices[g].size()) throw vlsparse::error("evict_oldest", "attn size mismatch");
        }
        TokenSelection keep = read;
        for (auto& l : keep.indices)
            if (l.size() > 2) l.erase(l.begin() + 1);
        return keep;
    }
};

// A broken policy: keeps a position that left the sequence.
struct BrokenPolicy : DecodeReadsAll {
    std::string_view name() const { return "broken"; }
    void begin(const Layout&, const ModelShape&) {}
    PrefillDecision prefill(const PrefillLayer& in) {
        PrefillDecision d;
        d.kv.n = in.layout->n();
        d.kv.indices.push_back({0, in.layout->n()});  // n is out of range
        return d;
    }
};

static_assert(Policy<AllSparsePolicy> && Policy<EvenPolicy> && Policy<DropOddImagePolicy> && Policy<EvictOldestPolicy>);

PolicyToRun to_run(std::string label, AnyPolicy p) { return PolicyToRun{label, label, json::object(), std::move(p), "", ""}; }

Scenario small_dense_scenario(std::int64_t steps = 3) {
    json j = small_default_json(steps);
    j["policies"] = json::array({json{{"name", "dense"}}});
    return scenario_from_json(j, "small");
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
TEST_CASE("sim scenario: the built-in default, default.json and every scenario file parse", "[sim][scenario]") {
    const Scenario d = default_scenario();
    CHECK(d.name == "default");
    CHECK(d.model.layers > 0);
    CHECK(d.policies.size() >= 4);
    CHECK(d.backend == "cpu");
    // default.json is the built-in default
    const Scenario f = load_scenario(source_dir() / "sim" / "scenarios" / "default.json");
    CHECK(to_json(f) == to_json(d));
    int files = 0;
    for (const auto& e : fs::directory_iterator(source_dir() / "sim" / "scenarios")) {
        if (e.path().extension() != ".json") continue;
        INFO(e.path().string());
        std::ifstream in(e.path());
        json text = json::parse(in);
        if (text.value("backend", std::string("cpu")) == "cuda") {
            // A GPU scenario: this build (no -Dcuda=enabled) refuses it by name; the rest is checked
            // with the cpu backend.
            REQUIRE_THROWS_WITH(load_scenario(e.path()), Catch::Contains("backend: \"cuda\" is not available in this build"));
            text["backend"] = "cpu";
            const Scenario s = scenario_from_json(text, e.path().string(), e.path().parent_path());
            CHECK(s.n() > 0);
            CHECK(!s.policies.empty());
            ++files;
            continue;
        }
        const Scenario s = load_scenario(e.path());
        CHECK(s.n() > 0);
        CHECK(!s.policies.empty());
        // round trip: to_json reads back to the same scenario
        CHECK(to_json(scenario_from_json(to_json(s), "rt", s.base_dir)) == to_json(s));
        ++files;
    }
    CHECK(files >= 4);
}

TEST_CASE("sim scenario: the required scenarios have the documented shapes", "[sim][scenario]") {
    const fs::path dir = source_dir() / "sim" / "scenarios";
    const Scenario hires = load_scenario(dir / "llava_next_hires.json");
    CHECK(hires.layout.count(SegmentKind::image) >= 2800);
    CHECK(hires.layout.count(SegmentKind::image) <= 3000);
    const Scenario four = load_scenario(dir / "qwen25vl_four_images.json");
    int images = 0;
    for (const auto& s : four.layout.segments()) images += s.kind == SegmentKind::image;
    CHECK(images == 4);
    const Scenario video = load_scenario(dir / "video_32x144.json");
    bool found = false;
    for (const auto& s : video.layout.segments())
        found |= s.kind == SegmentKind::video && s.frames == 32 && s.tokens_per_frame == 144;
    CHECK(found);
}

TEST_CASE("sim scenario: every rejection names its JSON path", "[sim][scenario]") {
    struct Case {
        std::function<void(json&)> mutate;
        std::string expect;
    };
    const json base = small_default_json();
    const auto zi = index_of(base, "zipvl"), ai = index_of(base, "avl"), bi = index_of(base, "blindsight"),
               fi = index_of(base, "fastv"), hi = index_of(base, "h2o");
    REQUIRE(zi >= 0);
    REQUIRE(ai >= 0);
    REQUIRE(bi >= 0);
    const std::string zp = "policies[" + std::to_string(zi) + "].params";
    const std::vector<Case> cases = {
        {[](json& j) { j["modle"] = 1; }, "t.json: modle: unknown key"},
        {[](json& j) { j["model"]["heads"] = 5; }, "model.heads: 5 is not a multiple of model.kv_heads = 2"},
        {[](json& j) { j["model"]["layers"] = "x"; }, "model.layers: expected an integer in [1, 4096], got \"x\""},
        {[](json& j) { j["model"]["layers"] = 0; }, "model.layers: expected an integer in [1, 4096], got 0"},
        {[](json& j) { j["model"]["head_dim"] = 2.5; }, "model.head_dim: expected an integer"},
        {[](json& j) { j["model"].erase("kv_heads"); }, "model.kv_heads: missing"},
        {[](json& j) { j["model"]["experts"] = 8; }, "model.experts: unknown key"},
        {[](json& j) { j["model"]["head_dim"] = 4; }, "model.head_dim: the synthetic source needs head_dim >= 8"},
        {[](json& j) { j["layout"] = "text:10,imag:5"; }, "layout: Layout::parse: segment 1 'imag:5': unknown kind"},
        {[](json& j) { j["layout"] = 5; }, "layout: expected a string, got 5"},
        {[](json& j) { j["decode_steps"] = -1; }, "decode_steps: expected an integer in [0, 65536], got -1"},
        {[](json& j) { j["seed"] = "one"; }, "seed: expected an integer"},
        {[](json& j) { j["backend"] = "cuda"; }, "backend: \"cuda\" is not available in this build (configure with -Dcuda=enabled"},
        {[](json& j) { j["backend"] = "tpu"; }, "backend: \"tpu\" is not a backend, expected \"cpu\" or \"cuda\""},
        {[](json& j) { j["source"]["kind"] = "real"; }, "source.kind: unknown source \"real\""},
        {[](json& j) { j["source"]["params"] = {{"sink", -1.0}}; }, "source.params.sink = -1, expected a finite value >= 0"},
        {[](json& j) { j["source"]["params"] = {{"noise", "a"}}; }, "source.params.noise: expected a number, got \"a\""},
        {[](json& j) { j["source"]["params"] = {{"sinks", 1.0}}; }, "source.params.sinks: unknown key"},
        {[](json& j) { j["source"]["params"] = {{"head_kinds", {"sink", "blob"}}}; }, "source.params.head_kinds[1]: unknown head kind"},
        {[](json& j) { j["source"]["dir"] = "x"; }, "source.dir: only a \"dump\" source has a folder"},
        {[](json& j) { j["policies"] = json::array(); }, "policies: expected at least one policy"},
        {[](json& j) { j.erase("policies"); }, "policies: missing"},
        {[&](json& j) { j["policies"][zi]["params"]["tau"] = "x"; }, zp + ".tau: expected a number, got \"x\""},
        {[&](json& j) { j["policies"][zi]["params"]["tau"] = 1.5; }, zp + ".tau = 1.5, expected 0 < tau <= 1"},
        {[&](json& j) { j["policies"][zi]["params"]["grouping"] = "head"; }, zp + ".grouping: unknown value 'head'"},
        {[&](json& j) { j["policies"][zi]["params"]["foo"] = 1; }, zp + ".foo: unknown key"},
        {[&](json& j) { j["policies"][zi]["name"] = "zipvll"; },
         "policies[" + std::to_string(zi) + "].name: unknown policy 'zipvll'"},
        {[&](json& j) { j["policies"][zi]["colour"] = "red"; }, "policies[" + std::to_string(zi) + "].colour: unknown key"},
        {[&](json& j) { j["policies"][bi]["params"] = {{"template", "Docs"}}; },
         "policies[" + std::to_string(bi) + "].params.template: unknown template \"Docs\""},
        {[&](json& j) { j["policies"][bi]["params"] = {{"head_map", "/nonexistent/map.json"}}; },
         "policies[" + std::to_string(bi) + "].params.head_map: load_head_map: cannot open"},
        {[&](json& j) { j["policies"][ai]["params"] = {{"rate", 0.8}, {"compute_rate", 0.5}}; },
         "policies[" + std::to_string(ai) + "].params.compute_rate = 0.5 is below rate = 0.8"},
        {[&](json& j) { j["policies"][ai]["params"] = {{"prefill_filter", 0.5}, {"filter_layer", 9}}; },
         "policies[" + std::to_string(ai) + "].params.filter_layer = 9"},
        {[&](json& j) { j["policies"][ai]["params"] = {{"spans", "all"}}; }, "spans: unknown value 'all'"},
        {[&](json& j) { j["policies"][fi]["params"] = {{"k_layer", 3}}; },
         "policies[" + std::to_string(fi) + "].params.k_layer = 3 with 3 layers"},
        {[&](json& j) { j["policies"][hi]["params"] = {{"heavy", "x"}}; },
         "policies[" + std::to_string(hi) + "].params.heavy: expected a token count"},
        {[&](json& j) { j["policies"][hi]["params"] = {{"heavy", -3}}; },
         "policies[" + std::to_string(hi) + "].params.heavy = -3 tokens, expected a count >= 0"},
        {[&](json& j) { j["policies"][zi]["label"] = "x"; j["policies"][ai]["label"] = "x"; }, "label: 'x' is used by an earlier policy"},
        {[&](json& j) { j["policies"][zi]["sweep"] = {{"param", "tau"}, {"values", {0.9, 2.0}}}; },
         "policies[" + std::to_string(zi) + "].sweep.values[1].tau = 2, expected 0 < tau <= 1"},
        {[&](json& j) { j["policies"][zi]["sweep"] = {{"values", {0.9}}}; }, "sweep.values[0]: a plain value needs \"param\""},
    };
    for (const auto& c : cases) {
        json j = base;
        c.mutate(j);
        const std::string msg = parse_error(j);
        INFO("expected: " << c.expect << "\ngot: " << msg);
        CHECK(msg.find(c.expect) != std::string::npos);
    }
    // The base itself parses.
    CHECK(parse_error(base).empty());
    // Invalid JSON in a file names the file.
    const fs::path d = temp_dir("badjson");
    {
        std::ofstream f(d / "bad.json");
        f << "{\"name\": ";
    }
    try {
        (void)load_scenario(d / "bad.json");
        FAIL("invalid JSON was accepted");
    } catch (const vlsparse::error& e) {
        CHECK(std::string(e.what()).find("bad.json: invalid JSON") != std::string::npos);
    }
    fs::remove_all(d);
}

TEST_CASE("sim scenario: numbers that do not fit the parameter's type are rejected with their path (issue 21)",
          "[sim][scenario][issue21]") {
    // Each value used to be narrowed silently (version 4294967297 became 1, scale 1e-50 became 0 =
    // the default, seed -1 became 2^64 - 1), become inf (scale 1e300, failing later without its path),
    // or pass the check and overflow the fp32 Q/K (noise 1e308).
    const json base = small_default_json();
    const auto zi = index_of(base, "zipvl"), hi = index_of(base, "h2o"), fi = index_of(base, "fastv");
    REQUIRE(zi >= 0);
    REQUIRE(hi >= 0);
    REQUIRE(fi >= 0);
    const std::string zp = "policies[" + std::to_string(zi) + "].params", hp = "policies[" + std::to_string(hi) + "].params",
                      fp = "policies[" + std::to_string(fi) + "].params";
    const std::vector<std::pair<std::function<void(json&)>, std::string>> cases = {
        {[](json& j) { j["decode_steps"] = 0; j["source"]["params"] = {{"version", 4294967297LL}}; },
         "source.params.version: expected an integer in [-2147483648, 2147483647], got 4294967297"},
        {[](json& j) { j["source"]["params"] = {{"noise", 1e308}}; }, "source.params.noise = 1e+308, expected at most 1e+06"},
        {[](json& j) { j["source"]["params"] = {{"local_radius", 1e-300}}; }, "source.params.local_radius = 1e-300"},
        {[](json& j) { j["source"]["params"] = {{"heavy_patch", 18446744073709551615ULL}}; },
         "source.params.heavy_patch: expected an integer in [-9223372036854775808, 9223372036854775807], got 18446744073709551615"},
        {[&](json& j) { j["policies"][zi]["params"]["scale"] = 1e-50; },
         zp + ".scale: expected 0 or a magnitude in [1.4013e-45, 3.40282e+38] (fp32), got 1e-50"},
        {[&](json& j) { j["policies"][zi]["params"]["scale"] = 1e300; },
         zp + ".scale: expected 0 or a magnitude in [1.4013e-45, 3.40282e+38] (fp32), got 1e+300"},
        {[&](json& j) { j["policies"][zi]["params"]["seed"] = -1; },
         zp + ".seed: expected an integer in [0, 18446744073709551615], got -1"},
        {[&](json& j) { j["policies"][hi]["params"]["scale"] = 1e-50; },
         hp + ".scale: expected 0 or a magnitude in [1.4013e-45, 3.40282e+38] (fp32), got 1e-50"},
        {[&](json& j) { j["policies"][fi]["params"]["scale"] = -1e39; },
         fp + ".scale: expected 0 or a magnitude in [1.4013e-45, 3.40282e+38] (fp32), got -1e+39"},
    };
    for (const auto& [mutate, expect] : cases) {
        json j = base;
        mutate(j);
        const std::string msg = parse_error(j);
        INFO("expected: " << expect << "\ngot: " << msg);
        CHECK(msg.find(expect) != std::string::npos);
    }
    // Values at the edges of the types still parse.
    json j = base;
    j["policies"][zi]["params"]["seed"] = 18446744073709551615ULL;
    j["policies"][zi]["params"]["scale"] = 1e-40;  // a subnormal fp32
    j["source"]["params"] = {{"noise", 1e6}};
    CHECK(parse_error(j).empty());
}

TEST_CASE("sim scenario: a scenario needing more memory than the limit is rejected naming the key (issue 21)",
          "[sim][scenario][issue21]") {
    // Each of these used to be accepted and end in a bare std::bad_alloc (the residual one while the
    // scenario was being checked: its weights were allocated to validate it).
    const std::vector<std::pair<std::function<void(json&)>, std::string>> cases = {
        {[](json& j) { j["source"] = {{"kind", "residual"}, {"params", {{"hidden", 1048576}, {"vocab", 16777216}}}}; },
         "t.json: source.params.vocab: the scenario needs an estimated "},
        {[](json& j) {
             j["model"]["layers"] = 8;
             j["source"] = {{"kind", "residual"}, {"params", {{"hidden", 1048576}}}};
         },
         "t.json: source.params.hidden: the scenario needs an estimated "},
        {[](json& j) { j["layout"] = "text:4194304"; }, "t.json: layout: the scenario needs an estimated "},
        {[](json& j) { j["model"] = {{"layers", 4096}, {"heads", 4096}, {"kv_heads", 4096}, {"head_dim", 4096}}; },
         "t.json: model.head_dim: the scenario needs an estimated "},
    };
    for (const auto& [mutate, expect] : cases) {
        json j = small_default_json();
        mutate(j);
        std::string msg;
        try {
            (void)scenario_from_json(j, "t.json");
        } catch (const vlsparse::error& e) {
            msg = e.what();
        } catch (const std::exception& e) {  // std::bad_alloc: what these used to end in
            msg = std::string("not a vlsparse::error: ") + e.what();
        }
        INFO("expected: " << expect << "\ngot: " << msg);
        CHECK(msg.find(expect) != std::string::npos);
        CHECK(msg.find("above the limit of 16 GiB") != std::string::npos);
        CHECK(msg.find("VLSPARSE_SIM_MAX_MEMORY_GIB") != std::string::npos);
    }
    // A dump's prompt has the same token limit as a scenario's, naming the dump's folder.
    const fs::path d = temp_dir("issue21_dump");
    fs::create_directories(d / "dump");
    {
        std::ofstream f(d / "dump" / "manifest.json");
        f << R"({"layers": 1, "heads": 2, "kv_heads": 1, "head_dim": 8, "dtype": "fp32",
                "layout": "text:1000000000000", "positions": "post-RoPE"})";
    }
    for (const char* w : {"q", "k", "v"}) std::ofstream(d / "dump" / (std::string("layer_000_") + w + ".npy"));
    json dj = small_default_json();
    dj.erase("model");
    dj.erase("layout");
    dj.erase("decode_steps");
    dj["source"] = {{"kind", "dump"}, {"dir", "dump"}};
    dj["policies"] = json::array({"dense"});
    const std::string dm = parse_error_in(dj, d);
    INFO(dm);
    CHECK(dm.find("source.dir: the dump's prompt has 1000000000000 tokens, expected at most 4194304") != std::string::npos);
    // The masks command estimates its pictures before drawing them.
    const SimCliOutput mk = sim_cli({"masks", "--layout", "text:1000000000000", "--out", (d / "masks").string()});
    CHECK(mk.rc == 2);
    INFO(mk.err);
    CHECK(mk.err.find("--layout: the pictures need an estimated ") != std::string::npos);
    CHECK(mk.err.find("above the limit of 16 GiB") != std::string::npos);
    fs::remove_all(d);
}

TEST_CASE("sim scenario: the memory limit: the default's estimate, VLSPARSE_SIM_MAX_MEMORY_GIB, compare's runs (issue 21)",
          "[sim][scenario][issue21]") {
    // The estimate of the default scenario is far below the limit; the limit can be lowered or raised.
    CHECK(estimate_memory(default_scenario()).total() < 1024.0 * 1024 * 1024);
    {
        const ScopedEnv low("VLSPARSE_SIM_MAX_MEMORY_GIB", "0.001");
        const std::string msg = parse_error(default_json());
        CHECK(msg.find("above the limit of 0.001 GiB") != std::string::npos);
    }
    {
        const ScopedEnv bad("VLSPARSE_SIM_MAX_MEMORY_GIB", "lots");
        CHECK(parse_error(default_json()).find("VLSPARSE_SIM_MAX_MEMORY_GIB = 'lots'") != std::string::npos);
    }
    {
        const ScopedEnv high("VLSPARSE_SIM_MAX_MEMORY_GIB", "1e6");
        json j = small_default_json();
        j["layout"] = "text:4194304";
        CHECK(parse_error(j).empty());  // accepted (not run)
    }
    // compare counts its sweep runs.
    {
        const ScopedEnv low("VLSPARSE_SIM_MAX_MEMORY_GIB", "0.02");
        json j = small_default_json();
        j["layout"] = "text:2000";
        j["policies"] = json::array({json{{"name", "zipvl"}, {"sweep", {{"param", "tau"}, {"values", json::array()}}}}});
        j["policies"][0]["sweep"]["values"] = json::array();
        for (int i = 0; i < 40; ++i) j["policies"][0]["sweep"]["values"].push_back(0.5 + 0.01 * i);
        const Scenario s = scenario_from_json(j, "t.json");  // one run of zipvl fits
        CHECK_THAT(error_of([&] { check_memory(s, sweep_policies(s).size() + 1); }),
                   Catch::Matchers::Contains("t.json: policies: the scenario needs an estimated"));
    }
}

TEST_CASE("sim scenario: decode_steps taken from a dump is checked like a scenario's (issue 21)", "[sim][scenario][dump][issue21]") {
    // A dump whose manifest says 100000 decode rows: a scenario without decode_steps used to take them
    // all, skipping the [0, 65536] check of a scenario's own decode_steps.
    const fs::path d = temp_dir("issue21_decode");
    DumpManifest m;
    m.model = "test";
    m.shape = {1, 2, 1, 8};
    m.layout = Layout::parse("text:4");
    m.decode_steps = 0;
    std::vector<DumpLayer> layers(1);
    layers[0].q.assign(4 * 2 * 8, 0.5f);
    layers[0].k.assign(4 * 1 * 8, 0.5f);
    layers[0].v.assign(4 * 1 * 8, 0.5f);
    write_dump(d / "dump", m, layers);
    {
        std::ifstream f(d / "dump" / "manifest.json");
        json mj = json::parse(f);
        mj["decode_steps"] = 100000;
        std::ofstream(d / "dump" / "manifest.json") << mj.dump(2);
    }
    json j = small_default_json();
    j.erase("model");
    j.erase("layout");
    j.erase("decode_steps");
    j["source"] = {{"kind", "dump"}, {"dir", "dump"}};
    j["policies"] = json::array({"dense"});
    const std::string msg = parse_error_in(j, d);
    INFO(msg);
    CHECK(msg.find("t.json: decode_steps: the dump holds 100000 decode rows, expected at most 65536 (give decode_steps to "
                   "use fewer)") != std::string::npos);
    j["decode_steps"] = 2;  // fewer than the dump holds: accepted
    CHECK(parse_error_in(j, d).empty());
    fs::remove_all(d);
}

TEST_CASE("sim cli: a folder as the scenario, and an unwritable report, fail before the run (issue 21)", "[sim][cli][issue21]") {
    const fs::path d = temp_dir("issue21_cli");
    // A folder is named as one (it used to be reported as invalid JSON).
    const SimCliOutput dir = sim_cli({"run", d.string(), "--quiet"});
    CHECK(dir.rc == 2);
    CHECK(dir.err.find(d.string() + ": is a directory, expected a scenario file (.json)") != std::string::npos);
    CHECK(dir.err.find("invalid JSON") == std::string::npos);
    CHECK_THAT(error_of([&] { (void)load_scenario(d); }), Catch::Matchers::Contains(": is a directory, expected a scenario file"));
    // An --out under a regular file cannot be created: reported before anything runs (it used to be
    // found only when the reports were written, after the whole run).
    json j = small_default_json(0);
    j["model"]["layers"] = 1;
    j["policies"] = json::array({"dense"});
    {
        std::ofstream f(d / "s.json");
        f << j.dump(2);
    }
    std::ofstream(d / "file") << "x";
    for (const auto& args : std::vector<std::vector<std::string>>{
             {"run", (d / "s.json").string(), "--quiet", "--no-sweep", "--out", (d / "file" / "out").string()},
             {"run", (d / "s.json").string(), "--quiet", "--no-sweep", "--no-html", "--json", (d / "file" / "r.json").string()},
             {"compare", (d / "s.json").string(), "--quiet", "--html", (d / "file" / "c.html").string()},
             {"characterize", (d / "s.json").string(), "--quiet", "--out", (d / "file" / "map.json").string()}}) {
        const SimCliOutput r = sim_cli(args);
        INFO(args[0] << ": " << r.err);
        CHECK(r.rc == 2);
        CHECK(r.err.find("cannot write the ") != std::string::npos);
        CHECK(r.err.find((d / "file").string()) != std::string::npos);
        CHECK(r.out.empty());  // nothing ran, not even the header was printed
    }
    // A writable --out that does not exist yet is created, and the run writes its report there.
    const SimCliOutput ok = sim_cli({"run", (d / "s.json").string(), "--quiet", "--no-sweep", "--out", (d / "new" / "out").string()});
    CHECK(ok.rc == 0);
    CHECK(fs::exists(d / "new" / "out" / "sim-report.html"));
    fs::remove_all(d);
}

TEST_CASE("sim scenario: --set overrides and the policy shorthand", "[sim][scenario]") {
    json j = small_default_json();
    apply_set(j, "model.layers=2");
    apply_set(j, "policies[0].params.tau=0.9");
    apply_set(j, "layout=text:4,image:16,text:4");
    CHECK(j["model"]["layers"] == 2);
    CHECK(j["policies"][0]["params"]["tau"] == 0.9);
    CHECK(j["layout"] == "text:4,image:16,text:4");
    CHECK_THROWS_AS(apply_set(j, "policies[99].name=x"), vlsparse::error);
    CHECK_THROWS_AS(apply_set(j, "noequals"), vlsparse::error);
    j["policies"] = json::array({"zipvl", "zipvl"});
    const Scenario s = scenario_from_json(j, "t");
    REQUIRE(s.policies.size() == 2);
    CHECK(s.policies[0].label == "zipvl");
    CHECK(s.policies[1].label == "zipvl#2");
}

TEST_CASE("sim engine: a dense policy matches the reference exactly; masses and ratios are 1", "[sim][engine]") {
    const Scenario s = small_dense_scenario();
    const RunResult r = run_scenario(s);
    REQUIRE(r.runs.size() == 2);
    for (const auto& p : r.runs) {
        INFO(p.label);
        CHECK(p.prefill_nmse() == 0.0);
        CHECK(p.decode_nmse() == 0.0);
        CHECK(p.kept_ratio() == 1.0);
        CHECK(p.prefill_flops_ratio() == 1.0);
        CHECK(p.decode_flops_ratio() == 1.0);
        CHECK(p.kv_ratio_end() == 1.0);
        CHECK(p.mass_prefill() == Approx(1.0).epsilon(1e-5));
        CHECK(p.mass_decode() == Approx(1.0).epsilon(1e-5));
        for (const auto& L : p.layers) {
            CHECK(L.prefill_kind == "dense");
            CHECK(L.rows == s.n());
        }
    }
    // the dense pair counts: n(n+1)/2 per head per layer, and n + t + 1 per decode step
    const double n = static_cast<double>(s.n()), H = static_cast<double>(s.model.heads);
    CHECK(r.runs[1].layers[0].prefill_pairs == H * n * (n + 1) / 2);
    CHECK(r.runs[1].layers[0].decode_pairs == H * ((n + 1) + (n + 2) + (n + 3)));
}

TEST_CASE("sim engine: token-sparse, sequence and eviction decisions through AnyPolicy", "[sim][engine]") {
    const Scenario s = small_dense_scenario(4);
    const std::int64_t n = s.n(), H = s.model.heads, Hkv = s.model.kv_heads, S = s.decode_steps;
    std::vector<PolicyToRun> pol;
    pol.push_back(to_run("all_sparse", AllSparsePolicy{}));
    pol.push_back(to_run("even", EvenPolicy{}));
    pol.push_back(to_run("drop_odd_image", DropOddImagePolicy{}));
    pol.push_back(to_run("evict_oldest", EvictOldestPolicy{}));
    const RunResult r = run_engine(s, std::move(pol));
    REQUIRE(r.runs.size() == 5);
    const auto& all = r.runs[1];
    const auto& even = r.runs[2];
    const auto& drop = r.runs[3];
    const auto& evict = r.runs[4];

    // A token-sparse prefill over every row is dense attention (another code path): tiny NMSE.
    CHECK(all.layers[0].prefill_kind == "token-sparse");
    CHECK(all.prefill_nmse() < vt::kSimdVsReference.attention_nmse);
    CHECK(all.kept_ratio() == 1.0);

    // Even positions: the kept ratio, the pair count |T|(|T|+1)/2 per head, and a real error.
    std::int64_t kept = 0;
    for (std::int64_t p = 0; p < n; ++p) kept += p % 2 == 0 || p == n - 1;
    CHECK(even.kept_ratio() == Approx(static_cast<double>(kept) / static_cast<double>(n)));
    const double t = static_cast<double>(kept);
    CHECK(even.layers[0].prefill_pairs == static_cast<double>(H) * t * (t + 1) / 2);
    CHECK(even.prefill_nmse() > 1e-6);
    CHECK(even.mass_prefill() < 1.0);
    CHECK(even.mass_prefill() > 0.0);
    // decode reads the kept positions plus the decode tokens
    CHECK(even.layers[0].decode_pairs == static_cast<double>(H) * static_cast<double>(S * kept + S * (S + 1) / 2));
    // KV bytes: kept rows after prefill, plus one row per decode step at the end
    CHECK(even.layers[0].kv_bytes_prefill == static_cast<double>(kept * Hkv * s.model.head_dim * 2 * 4));
    CHECK(even.layers[0].kv_bytes_end == static_cast<double>((kept + S) * Hkv * s.model.head_dim * 2 * 4));

    // Sequence reduction at layer 0: later layers see fewer rows, with positions kept.
    std::int64_t remain = 0;
    for (std::int64_t p = 0; p < n; ++p) remain += s.layout.is_text(p) || p % 2 == 0;
    CHECK(drop.layers[0].rows == n);
    for (std::size_t l = 1; l < drop.layers.size(); ++l) {
        CHECK(drop.layers[l].rows == remain);
        CHECK(drop.layers[l].kept_ratio == Approx(static_cast<double>(remain) / static_cast<double>(n)));
        CHECK(drop.layers[l].prefill_pairs ==
              static_cast<double>(H) * static_cast<double>(remain) * static_cast<double>(remain + 1) / 2);
        CHECK(drop.layers[l].prefill_err.value() > 0.0);  // the dropped keys change the outputs
    }
    CHECK(drop.layers[0].prefill_err.value() == 0.0);

    // Decode eviction: each step evicts one old row, so the cache ends with n rows again.
    for (const auto& L : evict.layers) {
        CHECK(L.kv_bytes_end == static_cast<double>(n * Hkv * s.model.head_dim * 2 * 4));
        CHECK(L.decode_pairs == static_cast<double>(H) * static_cast<double>(S * (n + 1)));
    }
    CHECK(evict.layers[0].mass_decode < 1.0);
    CHECK(evict.decode_nmse() > 0.0);

    // A broken decision is an error naming the policy and the layer.
    std::vector<PolicyToRun> bad;
    bad.push_back(to_run("broken", BrokenPolicy{}));
    try {
        (void)run_engine(s, std::move(bad));
        FAIL("a broken decision was accepted");
    } catch (const vlsparse::error& e) {
        const std::string m = e.what();
        INFO(m);
        CHECK(m.find("policy 'broken'") != std::string::npos);
        CHECK(m.find("layer 0") != std::string::npos);
    }
}

TEST_CASE("sim engine: the default scenario end to end on a small shape", "[sim][engine][default]") {
    const Scenario s = scenario_from_json(small_default_json(3), "small default");
    const RunResult r = run_scenario(s);
    REQUIRE(r.runs.size() == s.policies.size() + 1);
    CHECK(r.runs[0].label == "dense");
    for (std::size_t k = 1; k < r.runs.size(); ++k) {
        const auto& p = r.runs[k];
        INFO(p.label);
        CHECK(p.layers.size() == static_cast<std::size_t>(s.model.layers));
        CHECK(p.kept_ratio() > 0.0);
        CHECK(p.kept_ratio() <= 1.0);
        CHECK(std::isfinite(p.prefill_nmse()));
        CHECK(std::isfinite(p.decode_nmse()));
        CHECK(p.mass_decode() >= 0.0);
        CHECK(p.mass_decode() <= 1.0 + 1e-6);
        CHECK(p.flops_ratio() <= 1.0 + 1e-12);
        CHECK(p.params.is_object());
        // every policy changes something: fewer keys or fewer pairs
        CHECK((p.kept_ratio() < 1.0 || p.prefill_flops_ratio() < 1.0));
        CHECK((p.prefill_nmse() > 0.0 || p.decode_nmse() > 0.0));
    }
    // deterministic: the same metrics again
    const RunResult r2 = run_scenario(s);
    for (std::size_t k = 0; k < r.runs.size(); ++k) {
        CHECK(r2.runs[k].kept_ratio() == r.runs[k].kept_ratio());
        CHECK(r2.runs[k].prefill_nmse() == r.runs[k].prefill_nmse());
        CHECK(r2.runs[k].decode_nmse() == r.runs[k].decode_nmse());
    }
    // reports
    const json rep = report_json("run", s, r);
    CHECK(rep["format"] == "vlsparse.sim.report");
    CHECK(rep["runs"].size() == r.runs.size());
    CHECK(rep["runs"][1]["layers"].size() == static_cast<std::size_t>(s.model.layers));
    CHECK(json::parse(rep.dump()) == rep);
    const std::string html = report_html("run", s, r);
    for (const char* part : {"<!DOCTYPE html>", "Kept ratio of the KV cache", "Attention FLOPs and KV-cache bytes",
                             "Fidelity against budget", "Which tokens each policy keeps", "Mask templates", "wall time"})
        CHECK(html.find(part) != std::string::npos);
    CHECK(html.find("http://www.w3.org/2000/svg") != std::string::npos);
    CHECK(html.find("<script") == std::string::npos);
    CHECK(html.find("src=\"http") == std::string::npos);
    for (const auto& p : r.runs) CHECK(html.find(svg::esc(p.label)) != std::string::npos);
}

TEST_CASE("sim engine: compare sweeps every policy's budget", "[sim][engine][compare]") {
    json j = small_default_json(2);
    j["policies"] = json::array({json{{"name", "zipvl"}, {"sweep", {{"param", "tau"}, {"values", {0.5, 0.9, 0.999}}}}},
                                 json{{"name", "streamingllm"}}});
    const Scenario s = scenario_from_json(j, "sweep");
    const auto runs = sweep_policies(s);
    const auto& info = policy_info("streamingllm", JsonWhere{});
    REQUIRE(runs.size() == 3 + info.sweep_values.size());
    CHECK(runs[0].sweep_of == "zipvl");
    CHECK(runs[0].sweep_value == "tau=0.5");
    const RunResult r = run_engine(s, sweep_policies(s));
    // a larger tau keeps at least as much
    CHECK(r.runs[1].kept_ratio() <= r.runs[2].kept_ratio());
    CHECK(r.runs[2].kept_ratio() <= r.runs[3].kept_ratio());
    CHECK(report_html("compare", s, r).find("tau=0.999") != std::string::npos);
}

TEST_CASE("sim cli: subcommands answer --help and reject unknown options", "[sim][cli]") {
    for (const char* c : {"run", "compare", "characterize", "masks", "golden", "policies"})
        CHECK(sim_cli_status({c, "--help"}) == 0);
    CHECK(sim_cli_status({"--help"}) == 0);
    CHECK(sim_cli_status({"run", "--frobnicate"}) == 2);
    CHECK(sim_cli_status({"launch"}) == 2);
    CHECK(sim_cli_status({"golden", "check", "x"}) == 2);
    // masks writes one SVG per template
    const fs::path d = temp_dir("masks");
    CHECK(sim_cli_status({"masks", "--layout", "text:4,image:16,text:2,image:16,text:3", "--out", d.string()}) == 0);
    for (const char* f : {"mask-dense.svg", "mask-sink.svg", "mask-document.svg", "mask-document-sink.svg"})
        CHECK(fs::exists(d / f));
    // characterize writes a head map that a blindsight policy loads
    json j = small_default_json(0);
    j["policies"] = json::array({"dense"});
    {
        std::ofstream f(d / "s.json");
        f << j.dump(2);
    }
    CHECK(sim_cli_status({"characterize", (d / "s.json").string(), "--prompts", "2", "--out", (d / "map.json").string(),
                    "--quiet"}) == 0);
    const HeadMap m = load_head_map(d / "map.json", ModelShape{3, 4, 2, 32});
    CHECK(m.prompts == 2);
    CHECK(m.map.size() == 12u);
    j["policies"] = json::array({json{{"name", "blindsight"}, {"params", {{"head_map", "map.json"}}}}});
    {
        std::ofstream f(d / "s2.json");
        f << j.dump(2);
    }
    const Scenario s2 = load_scenario(d / "s2.json");  // the head map resolves next to the scenario
    CHECK(s2.policies.size() == 1);
    fs::remove_all(d);
}

// ---------------------------------------------------------------------------------------------------
namespace {

json residual_json(std::int64_t steps) {
    json j = small_default_json(steps);
    j["source"] = {{"kind", "residual"}, {"params", {{"hidden", 192}, {"vocab", 64}}}};
    return j;
}

// The residual model's own dense forward, computed directly with the library's attention: the final
// hidden states (last prompt token, then each decode token) and the LM-head tokens. Decode attention
// is indexed decode over every cache row, the kernel the engine uses.
struct DirectForward {
    std::vector<float> final_rows;
    std::vector<std::int64_t> tokens;
};
DirectForward direct_dense_forward(const Scenario& s) {
    const ResidualModel model(s.model, residual_params(s));
    const std::int64_t n = s.n(), H = s.model.heads, Hkv = s.model.kv_heads, d = s.model.head_dim, L = s.model.layers;
    const std::int64_t D = model.hidden_size();
    std::vector<float> h = model.embed_prompt(s.layout);
    std::vector<std::int64_t> pos(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) pos[static_cast<std::size_t>(i)] = i;
    std::vector<KvCache<float>> caches(static_cast<std::size_t>(L), KvCache<float>(Hkv, d));
    std::vector<float> q, k, v, o;
    for (std::int64_t l = 0; l < L; ++l) {
        model.project(l, h, pos, q, k, v);
        o.assign(static_cast<std::size_t>(n * H * d), 0.0f);
        simd::dense_attention(View3<const float>(q.data(), {n, H, d}), View3<const float>(k.data(), {n, Hkv, d}),
                              View3<const float>(v.data(), {n, Hkv, d}), View3<float>(o.data(), {n, H, d}));
        caches[static_cast<std::size_t>(l)].assign(View3<const float>(k.data(), {n, Hkv, d}),
                                                   View3<const float>(v.data(), {n, Hkv, d}));
        model.update(l, h, o);
    }
    DirectForward f;
    const std::span<const float> last(h.data() + (n - 1) * D, static_cast<std::size_t>(D));
    f.final_rows.assign(last.begin(), last.end());
    f.tokens.push_back(model.lm_head(last));
    for (std::int64_t t = 0; t < s.decode_steps; ++t) {
        std::vector<float> x = model.embed_token(f.tokens.back(), n + t);
        const std::int64_t p = n + t;
        for (std::int64_t l = 0; l < L; ++l) {
            auto& c = caches[static_cast<std::size_t>(l)];
            model.project(l, x, std::span<const std::int64_t>(&p, 1), q, k, v);
            c.append(View2<const float>(k.data(), {Hkv, d}), View2<const float>(v.data(), {Hkv, d}));
            CacheRows rows;
            rows.push_all(c.rows(0));
            o.assign(static_cast<std::size_t>(H * d), 0.0f);
            simd::indexed_decode_attention(View2<const float>(q.data(), {H, d}), c, rows, View2<float>(o.data(), {H, d}));
            model.update(l, x, o);
        }
        f.final_rows.insert(f.final_rows.end(), x.begin(), x.end());
        f.tokens.push_back(model.lm_head(x));
    }
    return f;
}

}  // namespace

TEST_CASE("sim residual: with dense policies the engine is the model's own dense forward", "[sim][residual]") {
    json j = residual_json(5);
    j["policies"] = json::array({"dense", "dense"});
    const Scenario s = scenario_from_json(j, "residual dense");
    EngineOptions eo;
    eo.keep_final_hidden = true;
    const RunResult r = run_scenario(s, eo);
    CHECK(r.residual);
    const DirectForward f = direct_dense_forward(s);
    REQUIRE(f.tokens.size() == static_cast<std::size_t>(s.decode_steps + 1));
    REQUIRE(r.runs.size() == 3);
    for (const auto& p : r.runs) {
        INFO(p.label);
        // the same bits as the direct forward: hidden states and tokens
        CHECK(p.final_hidden == f.final_rows);
        CHECK(p.tokens == f.tokens);
        // and the plain-mode picture of a dense policy: nothing differs from dense
        CHECK(p.final_hidden_err.value() == 0.0);
        CHECK(p.token_agreement() == 1.0);
        CHECK(p.kl_to_dense() == 0.0);
        CHECK(p.prefill_nmse() == 0.0);
        CHECK(p.decode_nmse() == 0.0);
        CHECK(p.kept_ratio() == 1.0);
        CHECK(p.mass_decode() == Approx(1.0).epsilon(1e-5));
    }
    // the tokens are not all one value (the LM head sees a varying state)
    CHECK(std::set<std::int64_t>(f.tokens.begin(), f.tokens.end()).size() > 1);
}

TEST_CASE("sim residual: sparse policies' errors propagate through depth", "[sim][residual]") {
    json j = residual_json(4);
    j["policies"] = json::array({json{{"name", "streamingllm"}, {"params", {{"sinks", 2}, {"recent", 0.1}}}},
                                 json{{"name", "zipvl"}, {"params", {{"tau", 0.9}}}}});
    const Scenario s = scenario_from_json(j, "residual sparse");
    EngineOptions eo;
    eo.keep_final_hidden = true;
    const RunResult r = run_scenario(s, eo);
    REQUIRE(r.runs.size() == 3);
    // KL to dense, by hand from the final hidden states and the model's LM head
    const auto model = make_residual_source(s);
    const auto D = static_cast<std::size_t>(model->hidden_size());
    for (std::size_t k = 1; k < r.runs.size(); ++k) {
        const auto& p = r.runs[k];
        INFO(p.label);
        CHECK(p.residual);
        CHECK(p.final_hidden_err.value() > 0.0);
        CHECK(p.tokens.size() == static_cast<std::size_t>(s.decode_steps + 1));
        CHECK(p.token_agreement() >= 0.0);
        CHECK(p.token_agreement() <= 1.0);
        CHECK(p.layers.back().decode_err.value() > 0.0);
        double kl = 0.0;
        for (std::size_t t = 0; t < p.tokens.size(); ++t) {
            const auto zr = model->logits(std::span<const float>(r.runs[0].final_hidden).subspan(t * D, D));
            const auto zp = model->logits(std::span<const float>(p.final_hidden).subspan(t * D, D));
            double sr = 0.0, sp = 0.0;
            for (std::size_t v = 0; v < zr.size(); ++v) sr += std::exp(double(zr[v])), sp += std::exp(double(zp[v]));
            for (std::size_t v = 0; v < zr.size(); ++v)
                kl += std::exp(double(zr[v])) / sr * ((double(zr[v]) - std::log(sr)) - (double(zp[v]) - std::log(sp)));
        }
        CHECK(p.kl_to_dense() > 0.0);
        CHECK(p.kl_to_dense() == Approx(kl / double(p.tokens.size())).epsilon(1e-9));
    }
    // ZipVL's token-sparse prefill changes the hidden states the last layer sees
    CHECK(r.runs[2].layers.back().prefill_err.value() > 0.0);
    // StreamingLLM only evicts after the prefill: the prefill is the dense one, bit for bit
    CHECK(r.runs[1].prefill_nmse() == 0.0);
    const std::string html = report_html("run", s, r);
    CHECK(html.find("tokens agree") != std::string::npos);
    const json rep = report_json("run", s, r);
    CHECK(rep["runs"][1]["summary"].contains("token_agreement"));
    CHECK(rep["runs"][1]["summary"]["tokens_agree"] == r.runs[1].tokens_agree);
    CHECK(rep["runs"][1]["summary"]["kl_to_dense"] == r.runs[1].kl_to_dense());
}

namespace {
// Token-sparse over the even positions in layer 0 only; dense (keeps everything) in every later layer.
struct EvenAtLayer0Policy : DecodeReadsAll {
    std::string_view name() const { return "even_at_layer0"; }
    void begin(const Layout&, const ModelShape&) {}
    PrefillDecision prefill(const PrefillLayer& in) {
        PrefillDecision d = EvenPolicy{}.prefill(in);
        if (in.layer > 0) {
            d.sparse_prefill = false;
            d.kv.indices[0].assign(in.positions.begin(), in.positions.end());
        }
        return d;
    }
};
}  // namespace

TEST_CASE("sim residual: an error in layer 0 reaches every later layer only in residual mode", "[sim][residual]") {
    json j = residual_json(3);
    j["policies"] = json::array({"dense"});
    const Scenario res = scenario_from_json(j, "residual");
    const Scenario plain = scenario_from_json(small_default_json(3), "plain");
    std::vector<PolicyToRun> a, b;
    a.push_back(to_run("even_at_layer0", EvenAtLayer0Policy{}));
    b.push_back(to_run("even_at_layer0", EvenAtLayer0Policy{}));
    const RunResult rr = run_engine(res, std::move(a));
    const RunResult rp = run_engine(plain, std::move(b));
    const auto& R = rr.runs[1];
    const auto& P = rp.runs[1];
    CHECK(P.layers[0].prefill_err.value() > 0.0);
    CHECK(R.layers[0].prefill_err.value() > 0.0);
    for (std::size_t l = 1; l < P.layers.size(); ++l) {
        INFO("layer " << l);
        CHECK(P.layers[l].prefill_err.value() == 0.0);  // plain: later layers see the same Q/K/V as dense
        CHECK(P.layers[l].decode_err.value() == 0.0);
        CHECK(R.layers[l].prefill_err.value() > 0.0);   // residual: layer 0's error propagates
        CHECK(R.layers[l].decode_err.value() > 0.0);
    }
    CHECK(R.final_hidden_err.value() > 0.0);
}

TEST_CASE("sim residual: bad residual params name their path", "[sim][residual][scenario]") {
    const std::vector<std::pair<json, std::string>> cases = {
        {{{"hidden", "big"}}, "source.params.hidden: expected an integer"},
        {{{"vocab", 1}}, "source.params.vocab: expected an integer in [2, 16777216], got 1"},
        {{{"hidden", 20}}, "source.params.hidden = 20 leaves"},
        {{{"structure", {{"sink", -2.0}}}}, "source.params.structure.sink = -2"},
        {{{"structure", {{"version", 1}}}}, "source.params.structure.version: the residual model needs version 2"},
        {{{"width", 3}}, "source.params.width: unknown key"},
    };
    for (const auto& [params, expect] : cases) {
        json j = residual_json(2);
        j["source"]["params"] = params;
        const std::string msg = parse_error(j);
        INFO("expected: " << expect << "\ngot: " << msg);
        CHECK(msg.find(expect) != std::string::npos);
    }
}

TEST_CASE("sim dump: a dump of the synthetic Q/K/V runs exactly like the synthetic source", "[sim][dump]") {
    const Scenario syn = scenario_from_json(small_default_json(3), "synthetic");
    const fs::path d = temp_dir("dump");
    // write the synthetic Q/K/V (prompt + decode rows) as a dump, fp32, npy
    DumpManifest m;
    m.model = "synthetic";
    m.shape = syn.model;
    m.dtype = DType::f32;
    m.layout = syn.layout;
    m.decode_steps = syn.decode_steps;
    auto src = make_plain_source(syn);
    std::vector<DumpLayer> layers;
    for (std::int64_t l = 0; l < syn.model.layers; ++l) {
        LayerQKV x = src->layer(l);
        layers.push_back(DumpLayer{x.q, x.k, x.v});
    }
    write_dump(d / "dump", m, layers);
    // a scenario that takes model, layout and decode steps from the dump
    json j = small_default_json(3);
    j.erase("model");
    j.erase("layout");
    j.erase("decode_steps");
    j["source"] = {{"kind", "dump"}, {"dir", "dump"}};
    {
        std::ofstream f(d / "s.json");
        f << j.dump(2);
    }
    const Scenario ds = load_scenario(d / "s.json");
    CHECK(ds.model == syn.model);
    CHECK(ds.layout == syn.layout);
    CHECK(ds.decode_steps == syn.decode_steps);
    const RunResult a = run_scenario(syn), b = run_scenario(ds);
    REQUIRE(a.runs.size() == b.runs.size());
    for (std::size_t k = 0; k < a.runs.size(); ++k) {
        INFO(a.runs[k].label);
        CHECK(b.runs[k].kept_ratio() == a.runs[k].kept_ratio());
        CHECK(b.runs[k].prefill_nmse() == a.runs[k].prefill_nmse());
        CHECK(b.runs[k].decode_nmse() == a.runs[k].decode_nmse());
        CHECK(b.runs[k].mass_decode() == a.runs[k].mass_decode());
    }
    CHECK(b.source.find("dumped") != std::string::npos);
    // a scenario that disagrees with the dump is rejected with the path
    json bad = j;
    bad["model"] = {{"layers", 2}, {"heads", 4}, {"kv_heads", 2}, {"head_dim", 32}};
    CHECK(parse_error_in(bad, d).find("model: the dump in") != std::string::npos);
    bad = j;
    bad["decode_steps"] = 9;
    CHECK(parse_error_in(bad, d).find("decode_steps: 9 steps, but the dump holds 3") != std::string::npos);
    bad = j;
    bad["source"]["dir"] = "nope";
    CHECK(parse_error_in(bad, d).find("source.dir: read_dump_manifest") != std::string::npos);
    fs::remove_all(d);
}

// ---------------------------------------------------------------------------------------------------
TEST_CASE("sim golden verify: a correct copy passes, a corrupted copy names the output and index", "[sim][golden]") {
    const fs::path src = golden_root() / "zipvl" / "mha_fp32_layer";
    REQUIRE(fs::is_directory(src));
    const fs::path d = temp_dir("golden");
    const fs::path port = d / "port";
    fs::copy(src, port, fs::copy_options::recursive);

    GoldenVerifyResult ok = golden_verify(port, golden_root());
    REQUIRE(ok.cases.size() == 1);
    CHECK(ok.cases[0].algorithm == "zipvl");
    CHECK(ok.cases[0].case_name == "mha_fp32_layer");
    CHECK(ok.pass());
    CHECK(ok.cases[0].outputs.size() == read_manifest(src).outputs.size());

    // Corrupt one value of the prefill output (nmse) and one of the kept mask (exact).
    {
        NpyArray a = read_npy(port / "prefill_out.npy");
        auto v = a.to_vector<float>();
        v[5] += 1.0f;
        write_npy(port / "prefill_out.npy", NpyArray::from(v, a.shape));
        NpyArray m = read_npy(port / "kept_mask.npy");
        auto mv = m.to_vector<std::uint8_t>();
        const std::size_t idx = 17;
        mv[idx] = static_cast<std::uint8_t>(1 - mv[idx]);
        write_npy(port / "kept_mask.npy", NpyArray::from(mv, m.shape));
    }
    const GoldenVerifyResult bad = golden_verify(port, golden_root());
    REQUIRE(bad.cases.size() == 1);
    CHECK_FALSE(bad.pass());
    std::size_t failed = 0;
    for (const auto& o : bad.cases[0].outputs) {
        INFO(o.name << ": " << o.detail);
        if (o.name == "prefill_out") {
            CHECK_FALSE(o.pass);
            CHECK(o.first == 5);
            CHECK(o.diff == Approx(1.0).epsilon(1e-6));
            CHECK(o.got - o.expected == Approx(1.0).epsilon(1e-6));
            CHECK(o.detail.find("first difference at flat index 5") != std::string::npos);
            ++failed;
        } else if (o.name == "kept_mask") {
            CHECK_FALSE(o.pass);
            CHECK(o.first == 17);
            CHECK(o.diff == 1.0);
            CHECK(o.detail.find("flat index 17") != std::string::npos);
            ++failed;
        } else {
            CHECK(o.pass);
        }
    }
    CHECK(failed == 2);
    // the printed report and the JSON say the same
    const json jr = to_json(bad);
    CHECK(jr["pass"] == false);

    // A missing output fails; without manifest.json the case is found by its folder names.
    fs::remove(port / "decode_out.npy");
    fs::remove(port / "manifest.json");
    const fs::path named = d / "zipvl" / "mha_fp32_layer";
    fs::create_directories(named.parent_path());
    fs::rename(port, named);
    const GoldenVerifyResult miss = golden_verify(named, golden_root());
    REQUIRE(miss.cases.size() == 1);
    bool saw_missing = false;
    for (const auto& o : miss.cases[0].outputs)
        if (o.name == "decode_out") saw_missing = o.missing && !o.pass;
    CHECK(saw_missing);

    // A whole tree: every zipvl case copied passes.
    const fs::path tree = d / "tree";
    fs::create_directories(tree);
    fs::copy(golden_root() / "zipvl", tree / "zipvl", fs::copy_options::recursive);
    const GoldenVerifyResult all = golden_verify(tree, golden_root());
    CHECK(all.cases.size() >= 5);
    CHECK(all.pass());

    // The command's exit status.
    CHECK(sim_cli_status({"golden", "verify", tree.string(), "--golden", golden_root().string()}) == 0);
    CHECK(sim_cli_status({"golden", "verify", named.string(), "--golden", golden_root().string()}) == 1);
    CHECK(sim_cli_status({"golden", "verify", (d / "nothing").string(), "--golden", golden_root().string()}) == 2);
    fs::remove_all(d);
}

TEST_CASE("sim golden verify --backend cpu: every golden case through the SIMD path, outputs written and re-read",
          "[sim][golden]") {
    const fs::path d = temp_dir("golden_backend");
    // Every case of every algorithm: computed, compared, written as a port's tree.
    const GoldenVerifyResult r = golden_run(golden_root(), cpu_golden_case, d / "out");
    CHECK(r.cases.size() >= 30);
    for (const auto& c : r.cases) {
        INFO(c.algorithm << "/" << c.case_name << ": " << c.error);
        CHECK(c.pass());
        for (const auto& o : c.outputs) CHECK(o.precision == "fp32");
    }
    CHECK(r.pass());
    // The written outputs are a port's tree that `golden verify DIR` accepts.
    const GoldenVerifyResult again = golden_verify(d / "out", golden_root());
    CHECK(again.cases.size() == r.cases.size());
    CHECK(again.pass());
    // --precision: a port's prefill_out scaled by 1 + 1e-3 (NMSE 1e-6) fails the fp32 bar, passes the bf16 one.
    {
        const fs::path f = d / "out" / "zipvl" / "gqa_bf16_kv_head" / "prefill_out.npy";
        NpyArray a = read_npy(f);
        auto x = a.to_vector<float>();
        for (auto& e : x) e *= 1.0f + 1e-3f;
        write_npy(f, NpyArray::from(x.data(), a.shape));
        CHECK_FALSE(golden_verify(d / "out", golden_root()).pass());
        CHECK(golden_verify(d / "out", golden_root(), "bf16").pass());
        CHECK_THROWS_WITH(golden_verify(d / "out", golden_root(), "fp8"), Catch::Matchers::Contains("precision 'fp8'"));
        const std::string port = (d / "out").string(), gr = golden_root().string();
        CHECK(sim_cli_status({"golden", "verify", port, "--golden", gr}) == 1);
        CHECK(sim_cli_status({"golden", "verify", port, "--golden", gr, "--precision", "bf16"}) == 0);
        CHECK(sim_cli_status({"golden", "verify", port, "--golden", gr, "--precision", "fp8"}) == 2);
        CHECK(sim_cli_status({"golden", "verify", "--backend", "cpu", gr, "--precision", "bf16"}) == 2);
    }
    // One algorithm folder, one case.
    CHECK(golden_run(golden_root() / "avl", cpu_golden_case).cases.size() == 3);
    CHECK(golden_run(golden_root() / "zipvl" / "ties_uniform", cpu_golden_case).cases.size() == 1);

    // The bar follows the precision a backend names: prefill_out scaled by 1 + 1e-3 (NMSE 1e-6) passes
    // the bf16 bar (1e-4), not the fp32 one (1e-10).
    const fs::path one = golden_root() / "zipvl" / "gqa_bf16_kv_head";
    auto perturbed = [&](const std::string& precision) {
        return [&, precision](const fs::path& dir, const GoldenManifest& m) {
            auto outs = cpu_golden_case(dir, m);
            for (auto& o : outs)
                if (o.name == "prefill_out") {
                    auto x = o.array.to_vector<float>();
                    for (auto& e : x) e *= 1.0f + 1e-3f;
                    o.array = NpyArray::from(x.data(), o.array.shape);
                    o.precision = precision;
                }
            return outs;
        };
    };
    auto prefill_check = [](const GoldenVerifyResult& v) {
        for (const auto& o : v.cases.at(0).outputs)
            if (o.name == "prefill_out") return o;
        return GoldenOutputCheck{};
    };
    CHECK(prefill_check(golden_run(one, perturbed("bf16"))).pass);
    const GoldenOutputCheck f32 = prefill_check(golden_run(one, perturbed("fp32")));
    CHECK_FALSE(f32.pass);
    CHECK(f32.precision == "fp32");
    CHECK(f32.tol == 1e-10);
    // An output the backend does not compute fails as missing; a backend error fails the case with it.
    const GoldenVerifyResult missing = golden_run(one, [&](const fs::path& dir, const GoldenManifest& m) {
        auto outs = cpu_golden_case(dir, m);
        outs.erase(std::remove_if(outs.begin(), outs.end(), [](const auto& o) { return o.name == "decode_out"; }), outs.end());
        return outs;
    });
    CHECK_FALSE(missing.pass());
    bool saw = false;
    for (const auto& o : missing.cases.at(0).outputs)
        if (o.name == "decode_out") saw = o.missing && o.detail.find("does not compute") != std::string::npos;
    CHECK(saw);
    const GoldenVerifyResult failing = golden_run(one, [](const fs::path&, const GoldenManifest&) -> std::vector<GoldenRunOutput> {
        throw vlsparse::error("test backend", "no such kernel");
    });
    CHECK_FALSE(failing.pass());
    CHECK(failing.cases.at(0).error.find("the backend could not run it") != std::string::npos);
    CHECK(failing.cases.at(0).error.find("no such kernel") != std::string::npos);
    CHECK_THROWS_WITH(golden_run(d / "nothing_here", cpu_golden_case), Catch::Matchers::Contains("is not a folder"));
    fs::create_directories(d / "empty");
    CHECK_THROWS_WITH(golden_run(d / "empty", cpu_golden_case), Catch::Matchers::Contains("holds no golden case"));

    // The command.
    CHECK(sim_cli_status({"golden", "verify", "--backend", "cpu", (golden_root() / "baselines").string()}) == 0);
    const auto j = d / "r.json";
    CHECK(sim_cli_status({"golden", "verify", "--backend", "cpu", one.string(), "--json", j.string()}) == 0);
    CHECK(nlohmann::json::parse(std::ifstream(j))["cases"][0]["outputs"][0]["precision"] == "fp32");
    CHECK(sim_cli_status({"golden", "verify", "--backend", "tpu", one.string()}) == 2);
    CHECK(sim_cli_status({"golden", "verify", "--backend", "cpu", one.string(), "--golden", golden_root().string()}) == 2);
    CHECK(sim_cli_status({"golden", "verify", one.string(), "--out", (d / "x").string()}) == 2);
#ifndef VLSPARSE_SIM_CUDA
    const auto cuda = sim_cli({"golden", "verify", "--backend", "cuda", one.string()});
    CHECK(cuda.rc == 2);
    CHECK(cuda.err.find("built without CUDA") != std::string::npos);
#endif
    fs::remove_all(d);
}

TEST_CASE("sim golden verify: --golden names one case; an unnamed folder is matched by its outputs or told to name it",
          "[sim][golden]") {
    namespace sd = vlsparse::sim::detail;
    const fs::path d = temp_dir("golden_case");
    // A port's outputs of one case, in a folder not named like it and without manifest.json.
    auto port_of = [&](const fs::path& golden_case, const std::string& folder) {
        const fs::path p = d / folder;
        fs::create_directories(p);
        for (const auto& e : fs::directory_iterator(golden_case))
            if (e.path().extension() == ".npy") fs::copy_file(e.path(), p / e.path().filename());
        return p;
    };
    const fs::path src = golden_root() / "zipvl" / "mha_fp32_layer";
    REQUIRE(fs::is_directory(src));
    const fs::path port = port_of(src, "my_port_outputs");

    // The documented form: --golden golden/<algorithm>/<case>, whatever the folder is called.
    const GoldenVerifyResult one = golden_verify(port, src);
    REQUIRE(one.cases.size() == 1);
    CHECK(one.cases[0].algorithm == "zipvl");
    CHECK(one.cases[0].case_name == "mha_fp32_layer");
    CHECK(one.pass());

    // Against the whole golden tree, by file names: a case that alone has all its outputs there and
    // accounts for every file (outputs and inputs) is found; files that fit several cases give an
    // error listing them and saying how to name the case (nothing is guessed). Which holds for a case
    // depends on the golden files, so the expectation is computed from them.
    std::size_t found = 0, ambiguous = 0;
    for (const auto& algo : fs::directory_iterator(golden_root())) {
        if (!algo.is_directory()) continue;
        for (const auto& c : fs::directory_iterator(algo.path())) {
            if (!fs::exists(c.path() / "manifest.json")) continue;
            const fs::path p = port_of(c.path(), "unnamed_" + algo.path().filename().string() + "_" +
                                                     c.path().filename().string());
            const auto fits = sd::cases_with_outputs_in(p, golden_root());
            std::size_t exact = 0;
            for (const auto& f : fits) exact += f.exact ? 1 : 0;
            const GoldenVerifyResult r = golden_verify(p, golden_root());
            REQUIRE(r.cases.size() == 1);
            INFO(c.path().string() << ": " << r.cases[0].error);
            if (exact == 1 || (exact == 0 && fits.size() == 1)) {
                CHECK(r.cases[0].golden_dir == c.path());
                CHECK(r.pass());
                ++found;
            } else {
                CHECK_FALSE(r.pass());
                CHECK(r.cases[0].error.find("--golden") != std::string::npos);
                ++ambiguous;
            }
        }
    }
    CHECK(found >= 1);  // e.g. zipvl/mha_fp32_layer: the only case with all of its outputs
    CHECK(found + ambiguous >= 5);
    const GoldenVerifyResult by_names = golden_verify(port, golden_root());
    REQUIRE(by_names.cases.size() == 1);
    CHECK(by_names.cases[0].case_name == "mha_fp32_layer");
    CHECK(by_names.pass());

    // The command: exit 0 with --golden naming the case.
    CHECK(sim_cli_status({"golden", "verify", port.string(), "--golden", src.string()}) == 0);
    fs::remove_all(d);
}
