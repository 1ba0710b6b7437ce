// Tests of the Params <-> JSON of every algorithm (io/*_json.hpp, io/params_json.hpp), of the strict
// reader behind them (io/json.hpp) and of the enum name tables (core/enum_names.hpp):
// Params -> JSON -> Params gives the same Params; every malformed field is an error naming its key.
#include <catch2/catch.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <vlsparse/io/json.hpp>
#include <vlsparse/io/params_json.hpp>
#include "error_of.hpp"

using Catch::Matchers::Contains;
using nlohmann::json;
using namespace vlsparse;

namespace params_json_test {

// One algorithm's JSON functions, type-erased for the table-driven tests below.
struct Algo {
    std::string name;
    json defaults;                                                  // to_json(Params{})
    json changed;                                                   // to_json of Params with every field changed
    std::function<json(const json&, const std::string&)> round;    // to_json(from_json(j, where))
};

ZipVLParams changed_zipvl() {
    ZipVLParams P;
    P.tau = 0.9;
    P.probe_mode = ZipVLProbes::ratios;
    P.probe_recent = 7;
    P.probe_random = 9;
    P.probe_recent_ratio = 0.03;
    P.probe_random_ratio = 0.07;
    P.seed = 18446744073709551615ULL;  // the largest uint64 survives
    P.grouping = ZipVLGrouping::kv_head;
    P.nnz = ZipVLNnz::probe_rows;
    P.keep_last = 4;
    P.keep_text = true;
    P.dense_layers = 2;
    P.unselected = UnselectedRows::attend_selected;
    P.scale = 0.125f;
    P.check_finite = false;
    P.prefill = ZipVLPrefill::dense;
    P.ratio = ZipVLRatio::fixed;
    P.fixed_ratio = 0.25;
    P.ranking = ZipVLRanking::accumulated;
    return P;
}

AvlParams changed_avl() {
    AvlParams P;
    P.rate = 0.4;
    P.compute_rate = 0.8;
    P.refresh_every = 5;
    P.spans = AvlSpans::single_span;
    P.async_refresh = true;
    P.prefill_filter = 0.3;
    P.filter_layer = 1;
    P.text_rate = 0.2;
    P.text_min_budget = 7;
    P.text_heavy_fraction = 0.5;
    P.text_groups = AvlTextGroups::per_query_head;
    return P;
}

PureKVParams changed_purekv() {
    PureKVParams P;
    P.l0 = 1;
    P.window = 8;
    P.budget = PureKVBudget::count;
    P.top_h = 17;
    P.budget_fraction = 0.3;
    P.grouping = PureKVGrouping::layer;
    P.lower_layers = PureKVLowerLayers::dense;
    P.st.kind = VideoMask::atrous;
    P.st.window = 6;
    P.st.dilation = 3;
    P.st_start_layer = 2;
    P.q_block = 32;
    P.k_block = 32;
    P.scale = 0.25f;
    P.check_finite = false;
    return P;
}

BlindSightParams changed_blindsight() {
    BlindSightParams P;
    P.alpha = 0.05;
    P.gamma_c = 0.3;
    P.gamma_s = 0.5;
    P.gamma_d = 0.7;
    P.mask.sink_fraction = 0.2;
    P.mask.sink_offsets = {0, 3, 9};
    P.mask.bidirectional_images = true;
    P.scale = 0.5f;
    P.check_finite = false;
    return P;
}

H2OParams changed_h2o() {
    H2OParams P;
    P.heavy = TokenBudget::tokens(12);
    P.recent = TokenBudget::ratio(0.25);
    P.groups = BaselineGroups::layer;
    P.evict_during_decode = false;
    P.scale = 0.125f;
    P.check_finite = false;
    return P;
}

SnapKVParams changed_snapkv() {
    SnapKVParams P;
    P.window = 16;
    P.kernel = 7;
    P.pooling = SnapKVPooling::max;
    P.capacity = TokenBudget::ratio(0.4);
    P.groups = BaselineGroups::layer;
    P.scale = 0.125f;
    P.check_finite = false;
    return P;
}

StreamingLLMParams changed_streamingllm() {
    StreamingLLMParams P;
    P.sinks = 2;
    P.recent = TokenBudget::ratio(0.3);
    P.evict_during_decode = false;
    return P;
}

FastVParams changed_fastv() {
    FastVParams P;
    P.k_layer = 3;
    P.rate = 0.75;
    P.spans = FastVSpans::per_image;
    P.scale = 0.125f;
    P.check_finite = false;
    return P;
}

RandomParams changed_random() {
    RandomParams P;
    P.keep = TokenBudget::tokens(40);
    P.scope = BaselineScope::all;
    P.seed = 99;
    return P;
}

FixedRatioParams changed_fixed_ratio() {
    FixedRatioParams P;
    P.keep = TokenBudget::ratio(0.2);
    P.scope = BaselineScope::all;
    P.mode = FixedRatioMode::last;
    return P;
}

template <class P, class F>
Algo algo(std::string name, const P& changed, F from_json) {
    return {std::move(name), to_json(P{}), to_json(changed),
            [from_json](const json& j, const std::string& where) { return to_json(from_json(j, where)); }};
}

std::vector<Algo> algos() {
    return {
        algo("zipvl", changed_zipvl(), [](const json& j, const std::string& w) { return zipvl_params_from_json(j, w); }),
        algo("avl", changed_avl(), [](const json& j, const std::string& w) { return avl_params_from_json(j, w); }),
        algo("purekv", changed_purekv(), [](const json& j, const std::string& w) { return purekv_params_from_json(j, w); }),
        algo("blindsight", changed_blindsight(),
             [](const json& j, const std::string& w) { return blindsight_params_from_json(j, w); }),
        algo("h2o", changed_h2o(), [](const json& j, const std::string& w) { return h2o_params_from_json(j, w); }),
        algo("snapkv", changed_snapkv(), [](const json& j, const std::string& w) { return snapkv_params_from_json(j, w); }),
        algo("streamingllm", changed_streamingllm(),
             [](const json& j, const std::string& w) { return streamingllm_params_from_json(j, w); }),
        algo("fastv", changed_fastv(), [](const json& j, const std::string& w) { return fastv_params_from_json(j, w); }),
        algo("random", changed_random(), [](const json& j, const std::string& w) { return random_params_from_json(j, w); }),
        algo("fixed_ratio", changed_fixed_ratio(),
             [](const json& j, const std::string& w) { return fixed_ratio_params_from_json(j, w); }),
    };
}

// A value of another JSON type than `v`, and the start of the message it must give.
std::pair<json, std::string> wrong_type_for(const json& v) {
    if (v.is_boolean()) return {json(1), "expected true or false"};
    if (v.is_number_integer()) return {json("3"), "expected an integer"};
    if (v.is_number()) return {json(true), "expected a number"};
    if (v.is_string()) return {json(1), "expected a string"};
    if (v.is_array()) return {json(3), "expected an array"};
    return {json("x"), "expected a token count"};  // a budget object
}

}  // namespace params_json_test

using params_json_test::algos;

TEST_CASE("params json: every algorithm's Params round-trip through JSON", "[io][params_json]") {
    for (const auto& a : algos()) {
        INFO(a.name);
        // every field changed from its default: to_json -> from_json -> to_json is the identity,
        // also through the text
        CHECK(a.changed != a.defaults);
        CHECK(a.round(a.changed, "") == a.changed);
        CHECK(a.round(json::parse(a.changed.dump()), "params.") == a.changed);
        // every key of the defaults differs in `changed` (the test changes every field), and the two
        // have the same keys: to_json writes every field
        for (auto it = a.defaults.begin(); it != a.defaults.end(); ++it) {
            INFO(it.key());
            REQUIRE(a.changed.contains(it.key()));
            if (it.key() != "baseline") CHECK(a.changed[it.key()] != it.value());
        }
        CHECK(a.changed.size() == a.defaults.size());
        // keys not present keep their defaults
        CHECK(a.round(json::object(), "") == a.defaults);
        // each key alone
        for (auto it = a.changed.begin(); it != a.changed.end(); ++it) {
            INFO(it.key());
            json one = a.defaults;
            one[it.key()] = it.value();
            CHECK(a.round(json{{it.key(), it.value()}}, "") == one);
        }
    }
}

TEST_CASE("params json: every malformed field is an error naming the key", "[io][params_json]") {
    for (const auto& a : algos()) {
        INFO(a.name);
        const std::string where = "policies[3].params.";
        // not an object
        CHECK_THAT(vt::error_of([&] { a.round(json::array({1}), where); }),
                   Contains("policies[3].params: expected an object, got [1]"));
        // an unknown key, with the known keys listed
        CHECK_THAT(vt::error_of([&] { a.round(json{{"bogus", 1}}, where); }),
                   Contains(where + "bogus: unknown key (known keys: "));
        // every key with a value of the wrong type
        for (auto it = a.defaults.begin(); it != a.defaults.end(); ++it) {
            // Not a structured binding: Clang 14 cannot capture one in a lambda.
            const auto wrong = params_json_test::wrong_type_for(it.value());
            const auto& bad = wrong.first;
            const auto& expect = wrong.second;
            INFO(it.key() << " = " << bad.dump());
            const std::string msg = vt::error_of([&] { a.round(json{{it.key(), bad}}, where); });
            CHECK_THAT(msg, Contains(where + it.key() + ": " + (it.key() == "baseline" ? "expected the string" : expect)));
            CHECK_THAT(msg, Contains("got " + bad.dump()));
        }
        // every enum key with an unknown name: the message lists the names, the default among them
        for (auto it = a.defaults.begin(); it != a.defaults.end(); ++it) {
            if (!it.value().is_string() || it.key() == "baseline") continue;
            INFO(it.key());
            const std::string msg = vt::error_of([&] { a.round(json{{it.key(), "bogus"}}, where); });
            CHECK_THAT(msg, Contains(where + it.key() + ": unknown value 'bogus', expected one of "));
            CHECK_THAT(msg, Contains(it.value().get<std::string>()));
        }
    }
}

TEST_CASE("params json: numbers are checked against their field's type", "[io][params_json]") {
    // an int64 field: 2^63 does not fit
    CHECK_THAT(vt::error_of([] { zipvl_params_from_json(json{{"keep_last", 9223372036854775808ULL}}, "p."); }),
               Contains("p.keep_last: expected an integer in [-9223372036854775808, 9223372036854775807], got 9223372036854775808"));
    // a uint64 field: -1 does not fit, 2^64 - 1 does
    CHECK_THAT(vt::error_of([] { zipvl_params_from_json(json{{"seed", -1}}, "p."); }),
               Contains("p.seed: expected an integer in [0, 18446744073709551615], got -1"));
    CHECK(zipvl_params_from_json(json{{"seed", 18446744073709551615ULL}}).seed == 18446744073709551615ULL);
    // a float field: beyond fp32's range, or below its smallest magnitude
    CHECK_THAT(vt::error_of([] { h2o_params_from_json(json{{"scale", 1e300}}, "p."); }),
               Contains("p.scale: expected 0 or a magnitude in ["));
    CHECK_THAT(vt::error_of([] { purekv_params_from_json(json{{"scale", 1e-50}}, "p."); }), Contains("p.scale: expected 0"));
    // a double field takes an integer
    CHECK(zipvl_params_from_json(json{{"tau", 1}}).tau == 1.0);
    // an integer field does not take 2.0
    CHECK_THAT(vt::error_of([] { avl_params_from_json(json{{"refresh_every", 2.0}}, "p."); }),
               Contains("p.refresh_every: expected an integer, got 2.0"));
    // sink offsets: each element is an integer
    CHECK_THAT(vt::error_of([] { blindsight_params_from_json(json{{"sink_offsets", {0, "a"}}}, "p."); }),
               Contains("p.sink_offsets[1]: expected an integer, got \"a\""));
}

TEST_CASE("params json: values out of range are rejected by the Params' own checks", "[io][params_json]") {
    CHECK_THAT(vt::error_of([] { zipvl_params_from_json(json{{"tau", 1.5}}); }),
               Contains("zipvl_params_from_json: tau = 1.5, expected 0 < tau <= 1"));
    CHECK_THAT(vt::error_of([] { avl_params_from_json(json{{"rate", 0.8}, {"compute_rate", 0.5}}); }),
               Contains("avl_params_from_json: compute_rate = 0.5 is below rate = 0.8"));
    CHECK_THAT(vt::error_of([] { purekv_params_from_json(json{{"budget_fraction", 1.5}}); }),
               Contains("purekv_params_from_json: budget_fraction = 1.5"));
    CHECK_THAT(vt::error_of([] { blindsight_params_from_json(json{{"alpha", -1.0}}); }),
               Contains("blindsight_params_from_json: alpha = -1"));
    CHECK_THAT(vt::error_of([] { h2o_params_from_json(json{{"heavy", -3}}); }),
               Contains("h2o_params_from_json: heavy = -3 tokens, expected a count >= 0"));
    CHECK_THAT(vt::error_of([] { snapkv_params_from_json(json{{"kernel", 4}}); }),
               Contains("snapkv_params_from_json: kernel = 4, expected an odd kernel >= 1"));
    CHECK_THAT(vt::error_of([] { streamingllm_params_from_json(json{{"recent", {{"fraction", 1.5}}}}); }),
               Contains("streamingllm_params_from_json: recent = 1.5 (fraction), expected 0 <= fraction <= 1"));
    CHECK_THAT(vt::error_of([] { fastv_params_from_json(json{{"rate", 1.0}}); }),
               Contains("fastv_params_from_json: rate = 1, expected 0 <= rate < 1"));
    CHECK_THAT(vt::error_of([] { random_params_from_json(json{{"keep", -1}}); }), Contains("keep = -1 tokens"));
    CHECK_THAT(vt::error_of([] { fixed_ratio_params_from_json(json{{"keep", 2.5}}); }), Contains("keep = 2.5 (fraction)"));
}

TEST_CASE("params json: budgets are written explicitly and read in both spellings", "[io][params_json]") {
    // written: {"tokens": N} or {"fraction": F}
    CHECK(to_json(TokenBudget::tokens(48)) == json{{"tokens", 48}});
    CHECK(to_json(TokenBudget::ratio(0.2)) == json{{"fraction", 0.2}});
    CHECK(to_json(H2OParams{}).at("heavy") == json{{"fraction", 0.1}});
    // read: the explicit objects, or the short form (an integer: tokens; a number with a point: fraction)
    const H2OParams a = h2o_params_from_json(json{{"heavy", 12}, {"recent", 0.25}});
    CHECK(a.heavy == TokenBudget::tokens(12));
    CHECK(a.recent == TokenBudget::ratio(0.25));
    const H2OParams b = h2o_params_from_json(json{{"heavy", {{"tokens", 12}}}, {"recent", {{"fraction", 0.25}}}});
    CHECK(b.heavy == a.heavy);
    CHECK(b.recent == a.recent);
    CHECK(h2o_params_from_json(json{{"heavy", 1.0}}).heavy == TokenBudget::ratio(1.0));  // 1.0 is all, 1 is one token
    CHECK(h2o_params_from_json(json{{"heavy", 1}}).heavy == TokenBudget::tokens(1));
    CHECK(to_json(h2o_params_from_json(json{{"heavy", 12}})).at("heavy") == json{{"tokens", 12}});
    // malformed budgets
    for (const json& bad : {json("x"), json::array({1}), json{{"tokens", 3}, {"fraction", 0.1}}, json{{"count", 3}},
                           json::object(), json(nullptr)})
        CHECK_THAT(vt::error_of([&] { snapkv_params_from_json(json{{"capacity", bad}}, "p."); }),
                   Contains("p.capacity: expected a token count (an integer N or {\"tokens\": N}) or a fraction"));
    CHECK_THAT(vt::error_of([] { snapkv_params_from_json(json{{"capacity", {{"tokens", 1.5}}}}, "p."); }),
               Contains("p.capacity.tokens: expected an integer, got 1.5"));
    CHECK_THAT(vt::error_of([] { snapkv_params_from_json(json{{"capacity", {{"fraction", "a"}}}}, "p."); }),
               Contains("p.capacity.fraction: expected a number, got \"a\""));
}

TEST_CASE("params json: a baseline's params name it", "[io][params_json]") {
    CHECK(to_json(H2OParams{}).at("baseline") == "h2o");
    CHECK(to_json(SnapKVParams{}).at("baseline") == "snapkv");
    CHECK(to_json(StreamingLLMParams{}).at("baseline") == "streamingllm");
    CHECK(to_json(FastVParams{}).at("baseline") == "fastv");
    CHECK(to_json(RandomParams{}).at("baseline") == "random");
    CHECK(to_json(FixedRatioParams{}).at("baseline") == "fixed_ratio");
    // optional when read; when given, it must be the struct's own name
    CHECK_NOTHROW(fastv_params_from_json(json{{"baseline", "fastv"}}));
    CHECK_THAT(vt::error_of([] { fastv_params_from_json(json{{"baseline", "h2o"}}, "params."); }),
               Contains("fastv_params_from_json: params.baseline: these are the params of 'fastv', got \"h2o\""));
}

TEST_CASE("params json: JsonPath and the strict reader", "[io][params_json]") {
    const JsonPath w{"my.json", "policies", "scenario"};
    CHECK(w.index(2).key("params").str() == "policies[2].params");
    CHECK(JsonPath{}.str() == "(top level)");
    CHECK_THAT(vt::error_of([&] { w.index(2).key("tau").fail("expected a number"); }),
               Contains("scenario: my.json: policies[2].tau: expected a number"));
    CHECK(JsonPath::from_prefix("params.", "f").path == "params");
    CHECK(JsonPath::from_prefix("", "f").path.empty());
    // check_object_keys and read_json_value: known keys, typed reads
    const json j{{"n", 3}, {"mode", "kv_head"}, {"on", true}, {"list", {1, 2}}};
    const JsonPath x{"", "x", "t"};
    check_object_keys(j, x, {"n", "mode", "on", "list", "off"});
    std::int64_t n = 0;
    ZipVLGrouping g = ZipVLGrouping::layer;
    bool on = false;
    std::vector<int> list;
    read_json_value(j["n"], n, x.key("n"));
    read_json_value(j["mode"], g, x.key("mode"));
    read_json_value(j["on"], on, x.key("on"));
    read_json_value(j["list"], list, x.key("list"));
    CHECK(n == 3);
    CHECK(g == ZipVLGrouping::kv_head);
    CHECK(on);
    CHECK(list == std::vector<int>{1, 2});
    CHECK_THAT(vt::error_of([&] { check_object_keys(j, x, {"n"}); }), Contains("t: x.list: unknown key (known keys: n)"));  // keys in sorted order
    CHECK_THAT(vt::error_of([&] { read_json_value(json{1, "a"}, list, x); }), Contains("t: x[1]: expected an integer, got \"a\""));
    CHECK_THAT(vt::error_of([&] { read_json_value(json("layer "), g, x); }),
               Contains("t: x: unknown value 'layer ', expected one of layer, kv_head"));
    // the keys of a field list, in its order
    CHECK(json_field_keys<StreamingLLMParams>() == std::vector<std::string_view>{"sinks", "recent", "evict_during_decode"});
    std::uint8_t small = 0;
    CHECK_THAT(vt::error_of([&] { read_json_value(json(300), small, JsonPath{"", "x", "t"}); }),
               Contains("t: x: expected an integer in [0, 255], got 300"));
    // with_json_path re-addresses a Params check to the key's path
    CHECK_THAT(vt::error_of([&] { with_json_path(json{{"tau", 2.0}}, w.index(0).key("params"), [] {
                   return zipvl_params_from_json(json{{"tau", 2.0}});
               }); }),
               Contains("scenario: my.json: policies[0].params.tau = 2, expected 0 < tau <= 1"));
}

TEST_CASE("enum names: one table per enum, to_string and back", "[io][params_json]") {
    auto check = [](auto e, std::string_view name) {
        using E = decltype(e);
        CHECK(to_string(e) == name);
        CHECK(enum_from_name<E>(name) == e);
        bool listed = false;
        for (const auto& x : enum_names(e)) listed |= x.value == e && x.name == name;
        CHECK(listed);
    };
    check(ZipVLGrouping::kv_head, "kv_head");
    check(ZipVLNnz::probe_rows, "probe_rows");
    check(ZipVLProbes::ratios, "ratios");
    check(ZipVLPrefill::dense, "dense");
    check(ZipVLRatio::fixed, "fixed");
    check(ZipVLRanking::accumulated, "accumulated");
    check(UnselectedRows::attend_selected, "attend_selected");
    check(AvlSpans::single_span, "single_span");
    check(AvlTextGroups::per_query_head, "per_query_head");
    check(BudgetKind::fraction, "fraction");
    check(BaselineGroups::layer, "layer");
    check(BaselineScope::all, "all");
    check(SnapKVPooling::none, "none");
    check(FastVSpans::per_image, "per_image");
    check(FixedRatioMode::uniform_stride, "uniform_stride");
    check(PureKVGrouping::layer, "layer");
    check(PureKVBudget::count, "count");
    check(PureKVLowerLayers::own_scores, "own_scores");
    check(VideoMask::spatial_temporal, "spatial_temporal");
    check(MaskTemplate::document_sink, "Document-Sink");
    CHECK_FALSE(enum_from_name<SnapKVPooling>("mean").has_value());
    CHECK(enum_name_list<SnapKVPooling>() == "avg, max, none");
    CHECK(enum_name_list<MaskTemplate>() == "Dense, Sink, Document, Document-Sink");
    CHECK(enum_name_list<VideoMask>() == "none, spatial, temporal, spatial_temporal, local_window, atrous");
    // every value of every table maps back to itself
    auto whole = [](auto e) {
        using E = decltype(e);
        for (const auto& x : enum_names(e)) {
            CHECK(to_string(x.value) == x.name);
            CHECK(enum_from_name<E>(x.name) == x.value);
        }
    };
    whole(ZipVLGrouping{});
    whole(AvlSpans{});
    whole(SnapKVPooling{});
    whole(FixedRatioMode{});
    whole(PureKVLowerLayers{});
    whole(VideoMask{});
    whole(MaskTemplate{});
}
