// Golden files: the reference reproduces every golden/zipvl case, and the SIMD path meets each
// output's metric and tolerance from the manifest (the same bar a port must clear).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <set>

#include <vlsparse/attention/decode.hpp>
#include <vlsparse/policies/zipvl.hpp>
#include <vlsparse/reference/zipvl.hpp>
#include <vlsparse/reference/zipvl_golden.hpp>

#include "golden_util.hpp"

namespace fs = std::filesystem;
using namespace vlsparse;

namespace {

fs::path golden_root() {
    if (const char* d = std::getenv("VLSPARSE_GOLDEN_DIR")) return d;
    return fs::path(VLSPARSE_SOURCE_DIR) / "golden";
}

std::vector<fs::path> cases(const std::string& algorithm) {
    std::vector<fs::path> out;
    for (const auto& e : fs::directory_iterator(golden_root() / algorithm))
        if (e.is_directory()) out.push_back(e.path());
    std::sort(out.begin(), out.end());
    return out;
}

template <class Backend>
void check_case(const fs::path& dir, const char* backend) {
    INFO("case " << dir.string() << ", backend " << backend);
    GoldenManifest m;
    const auto inputs = golden::read_zipvl_inputs(dir, &m);
    const auto outputs = golden::run_zipvl_case<Backend>(inputs);
    vt::check_golden_outputs(dir, m, outputs, golden::zipvl_output_metric, vt::precision_of(backend));
}

}  // namespace

TEST_CASE("golden zipvl: the suite covers the required cases", "[golden]") {
    const auto all = cases("zipvl");
    REQUIRE(all.size() >= 6);
    std::set<std::string> dtypes, groupings, nnz;
    bool multi_image = false, small_n = false, gqa = false, mha = false, ratios = false, dense = false;
    bool rows_without_kept_key = false;  // attend_selected with a row before its group's first kept key
    for (const auto& dir : all) {
        GoldenManifest m;
        const auto c = golden::read_zipvl_inputs(dir, &m);
        dtypes.insert(c.dtype);
        groupings.insert(m.params.at("grouping").get<std::string>());
        nnz.insert(m.params.at("nnz").get<std::string>());
        std::int64_t images = 0;
        for (const auto& s : c.layout.segments()) images += s.kind == SegmentKind::image;
        multi_image |= images >= 2;
        small_n |= c.n <= c.params.probe_recent + c.params.probe_random;
        gqa |= c.Hkv < c.H;
        mha |= c.Hkv == c.H;
        ratios |= c.params.probe_mode == ZipVLProbes::ratios;
        dense |= c.layer < c.params.dense_layers;
        if (c.params.unselected == UnselectedRows::attend_selected) {
            const NpyArray kept = read_tensor(dir, m.output("kept_mask"));
            const auto mask = kept.to_vector<std::uint8_t>();
            for (std::int64_t g = 0; g < kept.shape[0]; ++g) rows_without_kept_key |= mask[static_cast<std::size_t>(g * c.n)] == 0;
        }
    }
    REQUIRE(dtypes.count("fp32"));
    REQUIRE(dtypes.count("bf16"));
    REQUIRE(groupings == std::set<std::string>{"layer", "kv_head"});
    REQUIRE(nnz == std::set<std::string>{"causal_column", "probe_rows"});
    REQUIRE(multi_image);
    REQUIRE(small_n);
    REQUIRE(gqa);
    REQUIRE(mha);
    REQUIRE(ratios);
    REQUIRE(dense);
    REQUIRE(rows_without_kept_key);
}

TEST_CASE("golden zipvl: attend_selected rows that see no kept key are zero; dense layers report p = n", "[golden]") {
    for (const auto& dir : cases("zipvl")) {
        GoldenManifest m;
        const auto c = golden::read_zipvl_inputs(dir, &m);
        const NpyArray kept = read_tensor(dir, m.output("kept_mask"));
        const auto mask = kept.to_vector<std::uint8_t>();
        const auto p = read_tensor(dir, m.output("p")).to_vector<std::int64_t>();
        if (c.layer < c.params.dense_layers)
            for (auto x : p) REQUIRE(x == c.n);
        if (c.params.unselected != UnselectedRows::attend_selected) continue;
        const auto out = read_tensor(dir, m.output("prefill_out")).to_vector<float>();
        const std::int64_t G = kept.shape[0];
        for (std::int64_t h = 0; h < c.H; ++h) {
            const std::int64_t g = G == 1 ? 0 : h / (c.H / c.Hkv);
            bool seen = false;  // a kept key at or before row i
            for (std::int64_t i = 0; i < c.n; ++i) {
                seen |= mask[static_cast<std::size_t>(g * c.n + i)] != 0;
                double norm = 0.0;
                for (std::int64_t e = 0; e < c.d; ++e) norm += std::abs(out[static_cast<std::size_t>((i * c.H + h) * c.d + e)]);
                INFO(dir.string() << " head " << h << " row " << i);
                REQUIRE((norm > 0.0) == seen);
            }
        }
    }
}

TEST_CASE("golden zipvl: the reference reproduces every case", "[golden]") {
    for (const auto& dir : cases("zipvl")) check_case<reference::ZipVLOps>(dir, "reference");
}

TEST_CASE("golden zipvl: the SIMD path meets every case's tolerances", "[golden]") {
    for (const auto& dir : cases("zipvl")) check_case<simd::ZipVLOps>(dir, "simd");
}

TEST_CASE("golden zipvl: a corrupted output is caught with its first difference", "[golden]") {
    const auto dir = cases("zipvl").front();
    const GoldenManifest m = read_manifest(dir);
    const GoldenTensor& spec = m.output("kept_mask");
    const NpyArray good = read_tensor(dir, spec);
    NpyArray bad = good;
    bad.data[3] = bad.data[3] == std::byte{0} ? std::byte{1} : std::byte{0};
    REQUIRE(compare(spec, good, good).pass);
    const auto r = compare(spec, good, bad);
    REQUIRE_FALSE(r.pass);
    REQUIRE_THAT(r.detail, Catch::Matchers::Contains("3"));
    // An attention output off by 1% of its norm fails the nmse bar (fp32: 1e-10).
    const GoldenTensor& po = m.output("prefill_out");
    const NpyArray ref = read_tensor(dir, po);
    auto vals = ref.to_vector<float>();
    for (auto& x : vals) x *= 1.01f;
    REQUIRE_FALSE(compare(po, ref, NpyArray::from(vals.data(), ref.shape)).pass);
    // Off by 1e-6 of its norm (NMSE 1e-12): within what fp32 arithmetic gives, not what a double
    // port gives (fp64: 1e-13).
    std::vector<double> close(vals.size());
    const auto exact = ref.to_vector<float>();
    for (std::size_t i = 0; i < close.size(); ++i) close[i] = static_cast<double>(exact[i]) * (1.0 + 1e-6);
    const NpyArray got = NpyArray::from(close.data(), ref.shape);
    GoldenTensor fp64 = po;
    fp64.tol = po.tol_for("fp64");
    REQUIRE(po.tol_for("fp32") == po.tol);
    REQUIRE(fp64.tol < po.tol);
    REQUIRE(compare(po, ref, got).pass);
    REQUIRE_FALSE(compare(fp64, ref, got).pass);
}
