// Fuzz target: the BlindSight head-map JSON (head_map_from_json, load_head_map in
// io/blindsight_json.hpp). Beyond "no crash": only vlsparse::error escapes (invalid JSON in a file
// included); an accepted map has layers x heads templates and heads % kv_heads == 0, reads back from
// its to_json() to the same JSON, is accepted for its own model shape and refused for another, and
// load_head_map of the same text in a file gives the same map.
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "fuzz_util.hpp"
#include "vlsparse/io/blindsight_json.hpp"

using nlohmann::json;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    const auto path = fuzz::scratch() / "head_map.json";
    fuzz::write_file(path, text);
    const vlsparse::ModelShape some{2, 4, 2, 8};

    json j;
    try {
        j = json::parse(text);
    } catch (const json::exception&) {
        try {
            (void)vlsparse::load_head_map(path, some);
            FUZZ_CHECK(false, "load_head_map accepted text that is not JSON");
        } catch (const vlsparse::error& e) {
            fuzz::check_message(e);
        }
        return 0;
    }
    vlsparse::HeadMap m;
    try {
        m = vlsparse::head_map_from_json(j);
    } catch (const vlsparse::error& e) {
        fuzz::check_message(e);
        try {
            (void)vlsparse::load_head_map(path, some);
            FUZZ_CHECK(false, "load_head_map accepted a map head_map_from_json refused: ", e.what());
        } catch (const vlsparse::error&) {
        }
        return 0;
    }
    FUZZ_CHECK(m.layers > 0 && m.heads > 0 && m.kv_heads > 0 && m.head_dim > 0 && m.heads % m.kv_heads == 0,
               "accepted model shape ", m.layers, " x ", m.heads, " / ", m.kv_heads, " x ", m.head_dim);
    FUZZ_CHECK(static_cast<std::int64_t>(m.map.size()) == m.layers * m.heads, "map has ", m.map.size(),
               " templates for ", m.layers, " x ", m.heads);
    const json first = vlsparse::to_json(m);
    json second;
    try {
        second = vlsparse::to_json(vlsparse::head_map_from_json(first));
    } catch (const vlsparse::error& e) {
        FUZZ_CHECK(false, "to_json() of an accepted map does not read back: ", e.what());
    }
    FUZZ_CHECK(first == second, "round trip differs: ", first.dump(), " -> ", second.dump());

    const vlsparse::ModelShape own{m.layers, m.heads, m.kv_heads, m.head_dim};
    try {
        const vlsparse::HeadMap loaded = vlsparse::load_head_map(path, own);
        FUZZ_CHECK(vlsparse::to_json(loaded) == first, "load_head_map differs from head_map_from_json");
    } catch (const vlsparse::error& e) {
        FUZZ_CHECK(false, "load_head_map refused the map for its own shape: ", e.what());
    }
    vlsparse::ModelShape other = own;
    other.head_dim = own.head_dim == 1 ? 2 : 1;
    try {
        (void)vlsparse::head_map_from_json(j, other);
        FUZZ_CHECK(false, "a map was accepted for another model shape");
    } catch (const vlsparse::error& e) {
        fuzz::check_message(e);
    }
    return 0;
}
