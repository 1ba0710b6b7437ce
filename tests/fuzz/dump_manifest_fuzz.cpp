// Fuzz target: the Q/K/V dump manifest (read_dump_manifest / DumpSource in sim/dump.hpp), what a
// scenario's "source": {"kind": "dump"} opens first.
// Beyond "no crash": only vlsparse::error escapes (invalid JSON included); an accepted manifest has a
// valid model shape, a layout, a dtype and storage of the documented sets, tokens() that does not
// overflow and input_ids of that length; written with write_dump_manifest() it reads back to the
// same fields. DumpSource on the folder (which holds no tensors) refuses it with a vlsparse::error.
// A safetensors "file" is a plain name in the scratch folder (the fuzzer does not open this machine's
// files; the safetensors reader has its own target).
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "fuzz_util.hpp"
#include "vlsparse/sim/dump.hpp"

using nlohmann::json;
namespace sim = vlsparse::sim;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    try {
        const json j = json::parse(text);
        if (j.is_object() && j.contains("file") && j["file"].is_string() &&
            j["file"].get<std::string>().find('/') != std::string::npos)
            return 0;
    } catch (const json::exception&) {
    }
    const auto dir = fuzz::scratch() / "dump";
    const auto again = fuzz::scratch() / "dump_again";
    static const bool made = std::filesystem::create_directories(dir) && std::filesystem::create_directories(again);
    (void)made;
    fuzz::write_file(dir / "manifest.json", text);
    sim::DumpManifest m;
    try {
        m = sim::read_dump_manifest(dir);
    } catch (const vlsparse::error& e) {
        fuzz::check_message(e);
        return 0;
    }
    m.shape.validate("fuzz");
    FUZZ_CHECK(m.layout.n() >= 1 && m.decode_steps >= 0, "layout of ", m.layout.n(), " tokens, decode_steps ",
               m.decode_steps, " accepted");
    const std::int64_t tokens = m.tokens();  // must not throw
    FUZZ_CHECK(m.input_ids.empty() || static_cast<std::int64_t>(m.input_ids.size()) == tokens, "input_ids of ",
               m.input_ids.size(), " for ", tokens, " tokens accepted");
    FUZZ_CHECK(m.storage == "npy" || m.storage == "safetensors", "storage '", m.storage, "' accepted");
    FUZZ_CHECK(std::isfinite(m.scale) && m.scale >= 0 && m.softmax_scale() > 0, "scale ", m.scale, " accepted");

    sim::write_dump_manifest(again, m);
    sim::DumpManifest r;
    try {
        r = sim::read_dump_manifest(again);
    } catch (const vlsparse::error& e) {
        FUZZ_CHECK(false, "write_dump_manifest() of an accepted manifest does not read back: ", e.what());
    }
    FUZZ_CHECK(r.model == m.model && r.shape == m.shape && r.dtype == m.dtype && r.layout == m.layout &&
                   r.decode_steps == m.decode_steps && r.scale == m.scale && r.storage == m.storage &&
                   (m.storage != "safetensors" || r.file == m.file) && r.input_ids == m.input_ids,
               "round trip differs");

    try {
        sim::DumpSource src(dir);
        FUZZ_CHECK(false, "DumpSource accepted a folder with no tensors");
    } catch (const vlsparse::error& e) {
        fuzz::check_message(e);
    }
    return 0;
}
