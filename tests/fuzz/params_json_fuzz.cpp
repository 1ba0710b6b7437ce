// Fuzz target: every policy-params JSON reader. The first byte picks the reader, the rest is JSON:
//   the library's   zipvl_, avl_, purekv_, blindsight_params_from_json and the six baselines'
//                   *_params_from_json (io/params_json.hpp: io/zipvl_json.hpp, io/avl_json.hpp,
//                   io/purekv_json.hpp, io/blindsight_json.hpp, io/baselines_json.hpp);
//   the simulator's registry: each policy's factory (sim/policies.hpp, what a scenario's
//                   "policies[i].params" goes through), then begin() on a small prompt.
// Beyond "no crash": only vlsparse::error escapes; accepted params written with to_json() read back
// to the same JSON; a factory that accepts params also accepts them with every default filled in
// (effective_params) and behaves the same in begin().
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "fuzz_util.hpp"
#include "vlsparse/io/params_json.hpp"
#include "vlsparse/sim/policies.hpp"

using nlohmann::json;

namespace {

// from_json(j) accepted: to_json of the result reads back to the same JSON.
template <class FromJson>
void round_trip(const json& j, FromJson&& from_json, const char* what) {
    json first;
    try {
        first = to_json(from_json(j));
    } catch (const vlsparse::error& e) {
        fuzz::check_message(e);
        return;
    }
    json second;
    try {
        second = to_json(from_json(first));
    } catch (const vlsparse::error& e) {
        FUZZ_CHECK(false, what, ": to_json() of accepted params does not read back: ", first.dump(), ": ", e.what());
    }
    FUZZ_CHECK(first == second, what, ": round trip differs: ", first.dump(), " -> ", second.dump());
}

// The registry's factory, then begin() on the prompt; "" when both accept, else the error.
std::string make_and_begin(const vlsparse::sim::PolicyInfo& info, const json& p, const vlsparse::Layout& layout,
                           const vlsparse::sim::PolicyContext& ctx) {
    const vlsparse::sim::JsonWhere w{"fuzz.json", "policies[0].params"};
    try {
        vlsparse::AnyPolicy pol = info.make(p, w, ctx);
        vlsparse::sim::with_json_path(p, w, [&] {
            pol.begin(layout, ctx.shape);
            return 0;
        });
    } catch (const vlsparse::error& e) {
        fuzz::check_message(e);
        return e.what();
    }
    return "";
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size < 1) return 0;
    const std::uint8_t pick = data[0];
    json j;
    try {
        j = json::parse(std::string_view(reinterpret_cast<const char*>(data + 1), size - 1));
    } catch (const json::exception&) {
        return 0;  // not JSON: the callers' parse (load_scenario, read_manifest, ...) reports that
    }
    const auto& reg = vlsparse::sim::policy_registry();
    constexpr unsigned kLibrary = 10;
    switch (pick % (kLibrary + reg.size())) {
        case 0: round_trip(j, [](const json& x) { return vlsparse::zipvl_params_from_json(x, "p."); }, "zipvl"); break;
        case 1: round_trip(j, [](const json& x) { return vlsparse::purekv_params_from_json(x, "p."); }, "purekv"); break;
        case 2: round_trip(j, [](const json& x) { return vlsparse::blindsight_params_from_json(x, "p."); }, "blindsight"); break;
        case 3: round_trip(j, [](const json& x) { return vlsparse::avl_params_from_json(x, "p."); }, "avl"); break;
        case 4: round_trip(j, [](const json& x) { return vlsparse::h2o_params_from_json(x, "p."); }, "h2o"); break;
        case 5: round_trip(j, [](const json& x) { return vlsparse::snapkv_params_from_json(x, "p."); }, "snapkv"); break;
        case 6: round_trip(j, [](const json& x) { return vlsparse::streamingllm_params_from_json(x, "p."); }, "streamingllm"); break;
        case 7: round_trip(j, [](const json& x) { return vlsparse::fastv_params_from_json(x, "p."); }, "fastv"); break;
        case 8: round_trip(j, [](const json& x) { return vlsparse::random_params_from_json(x, "p."); }, "random"); break;
        case 9: round_trip(j, [](const json& x) { return vlsparse::fixed_ratio_params_from_json(x, "p."); }, "fixed_ratio"); break;
        default: {
            const auto& info = reg[pick % (kLibrary + reg.size()) - kLibrary];
            // A BlindSight head map is a file: only a plain name, looked up in the scratch folder (no
            // device files or paths of this machine; the head-map reader has its own target).
            if (j.is_object() && j.contains("head_map") && j["head_map"].is_string() &&
                j["head_map"].get<std::string>().find('/') != std::string::npos)
                return 0;
            // Bit 7 of the first byte picks a video prompt (PureKV's ST masks), else two images.
            const vlsparse::Layout layout = vlsparse::Layout::parse(
                pick & 0x80 ? "text:6,video:4x16[4x4],text:5" : "text:7,image:16[4x4],text:2,image:9[3x3],text:4");
            const vlsparse::sim::PolicyContext ctx{vlsparse::ModelShape{3, 4, 2, 16}, fuzz::scratch()};
            const std::string as_given = make_and_begin(info, j, layout, ctx);
            if (!as_given.empty()) return 0;
            const json full = vlsparse::sim::effective_params(info, j);
            const std::string filled = make_and_begin(info, full, layout, ctx);
            FUZZ_CHECK(filled.empty(), info.name, ": accepted ", j.dump(), " but not with the defaults filled in, ",
                       full.dump(), ": ", filled);
        }
    }
    return 0;
}
