// Fuzz target: the golden manifest reader (read_manifest in io/golden.hpp, dir/manifest.json).
// Beyond "no crash": only vlsparse::error escapes (invalid JSON included); an accepted manifest has
// unique tensor names and files, known dtypes, outputs with a metric, plain ".npy" file names and
// non-negative extents; written with manifest_json() it reads back to the same manifest (the same
// text again), and a manifest read from that text has the same text.
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <set>
#include <string>

#include "fuzz_util.hpp"
#include "vlsparse/io/golden.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const auto dir = fuzz::scratch() / "case";
    const auto again = fuzz::scratch() / "again";
    static const bool made = std::filesystem::create_directories(dir) && std::filesystem::create_directories(again);
    (void)made;
    fuzz::write_file(dir / "manifest.json", data, size);
    vlsparse::GoldenManifest m;
    try {
        m = vlsparse::read_manifest(dir);
    } catch (const vlsparse::error& e) {
        fuzz::check_message(e);
        return 0;
    }
    std::set<std::string> names, files;
    for (const auto* list : {&m.inputs, &m.outputs})
        for (const auto& t : *list) {
            FUZZ_CHECK(names.insert(t.name).second && files.insert(t.file).second, "duplicate name or file '", t.name, "'");
            FUZZ_CHECK(!vlsparse::golden_descr(t.dtype).empty(), "unknown dtype '", t.dtype, "' accepted");
            FUZZ_CHECK(t.file.size() > 4 && t.file.find('/') == std::string::npos &&
                           t.file.compare(t.file.size() - 4, 4, ".npy") == 0,
                       "file '", t.file, "' accepted");
            for (auto e : t.shape) FUZZ_CHECK(e >= 0, "negative extent accepted in '", t.name, "'");
            FUZZ_CHECK(list == &m.inputs || vlsparse::is_golden_metric(t.metric), "output '", t.name, "' has metric '",
                       t.metric, "'");
            FUZZ_CHECK(std::isfinite(t.tol) && t.tol >= 0, "tol ", t.tol, " accepted");
        }
    std::string text;
    try {
        text = vlsparse::manifest_json(m);
    } catch (const vlsparse::error& e) {
        FUZZ_CHECK(false, "manifest_json refused an accepted manifest: ", e.what());
    }
    fuzz::write_file(again / "manifest.json", text);
    vlsparse::GoldenManifest m2;
    try {
        m2 = vlsparse::read_manifest(again);
    } catch (const vlsparse::error& e) {
        FUZZ_CHECK(false, "manifest_json() of an accepted manifest does not read back: ", e.what(), "\n", text);
    }
    FUZZ_CHECK(vlsparse::manifest_json(m2) == text, "round trip differs:\n", text, "\n->\n", vlsparse::manifest_json(m2));
    FUZZ_CHECK(m2.algorithm == m.algorithm && m2.case_name == m.case_name && m2.generator == m.generator &&
                   m2.note == m.note && m2.layout == m.layout && m2.params == m.params &&
                   m2.inputs.size() == m.inputs.size() && m2.outputs.size() == m.outputs.size(),
               "the manifest read back differs");
    return 0;
}
