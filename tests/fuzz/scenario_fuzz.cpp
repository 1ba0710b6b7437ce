// Fuzz target: the simulator's scenario files (load_scenario / scenario_from_json in
// sim/scenario.hpp): the model, layout, source (synthetic generator and residual model params, dump
// folder), every policy's params through the registry, sweeps, the memory estimate.
// Beyond "no crash": only vlsparse::error escapes (invalid JSON included); an accepted scenario is
// within the documented limits (model fields in 1..4096, heads % kv_heads == 0, at most 2^22 prompt
// tokens and 2^16 decode steps, unique policy labels, estimated memory within the limit) and its
// to_json() reads back to the same JSON.
// The memory limit is set to 64 MiB (VLSPARSE_SIM_MAX_MEMORY_GIB) so that each input stays fast; a
// head map or dump folder is looked up only by a plain name in the scratch folder (the fuzzer does not
// get to open this machine's files; the head-map and dump readers have targets of their own).
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "fuzz_util.hpp"
#include "vlsparse/sim/scenario.hpp"

using nlohmann::json;
namespace sim = vlsparse::sim;

namespace {

// True when some "head_map" or "dir" string holds a path (a '/').
bool names_a_path(const json& j) {
    if (j.is_object()) {
        for (auto it = j.begin(); it != j.end(); ++it) {
            if ((it.key() == "head_map" || it.key() == "dir") && it.value().is_string() &&
                it.value().get<std::string>().find('/') != std::string::npos)
                return true;
            if (names_a_path(it.value())) return true;
        }
    } else if (j.is_array()) {
        for (const auto& e : j)
            if (names_a_path(e)) return true;
    }
    return false;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    setenv("VLSPARSE_SIM_MAX_MEMORY_GIB", "0.0625", 1);
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    try {
        if (names_a_path(json::parse(text))) return 0;
    } catch (const json::exception&) {
        // not JSON: load_scenario must say so with a vlsparse::error
    }
    const auto dir = fuzz::scratch() / "scenario";
    static const bool made = std::filesystem::create_directories(dir);
    (void)made;
    const auto path = dir / "scenario.json";
    fuzz::write_file(path, text);
    sim::Scenario s;
    try {
        s = sim::load_scenario(path);
    } catch (const vlsparse::error& e) {
        fuzz::check_message(e);
        return 0;
    }
    const auto& m = s.model;
    FUZZ_CHECK(m.layers >= 1 && m.layers <= 4096 && m.heads >= 1 && m.heads <= 4096 && m.kv_heads >= 1 &&
                   m.kv_heads <= 4096 && m.head_dim >= 1 && m.head_dim <= 4096 && m.heads % m.kv_heads == 0,
               "model ", m.layers, " x ", m.heads, " / ", m.kv_heads, " x ", m.head_dim, " accepted");
    FUZZ_CHECK(s.layout.n() >= 1 && s.layout.n() <= (1 << 22), "layout of ", s.layout.n(), " tokens accepted");
    FUZZ_CHECK(s.decode_steps >= 0 && s.decode_steps <= (1 << 16), "decode_steps = ", s.decode_steps, " accepted");
    FUZZ_CHECK(!s.policies.empty(), "no policy accepted");
    std::set<std::string> labels;
    for (const auto& p : s.policies) FUZZ_CHECK(labels.insert(p.label).second, "label '", p.label, "' used twice");
    const double need = sim::estimate_memory(s).total();
    FUZZ_CHECK(need <= sim::max_memory_bytes(), "estimated ", need, " bytes accepted over the limit");

    const json first = sim::to_json(s);
    json second;
    try {
        second = sim::to_json(sim::scenario_from_json(first, path.string(), dir));
    } catch (const vlsparse::error& e) {
        FUZZ_CHECK(false, "to_json() of an accepted scenario does not read back: ", e.what(), "\n", first.dump());
    }
    FUZZ_CHECK(first == second, "round trip differs:\n", first.dump(), "\n->\n", second.dump());
    return 0;
}
