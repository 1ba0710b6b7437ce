// Tests of the dump loader (sim/include/vlsparse/sim/dump.hpp) and the safetensors reader/writer
// (sim/include/vlsparse/sim/safetensors.hpp): round trips through files the tests write (npy and
// safetensors, fp32 / fp16 / bf16), the exact bytes of a safetensors file, and every error case.
#include <vlsparse/sim/dump.hpp>  // first: the header compiles on its own

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "test_util.hpp"
#include "error_of.hpp"

using Catch::Matchers::Contains;
using Catch::Matchers::Equals;
using vlsparse::DType;
using vlsparse::Layout;
using vlsparse::sim::DumpLayer;
using vlsparse::sim::DumpManifest;
using vlsparse::sim::DumpSource;
using vlsparse::sim::SafetensorsFile;
using vlsparse::sim::SafetensorsTensor;
namespace fs = std::filesystem;

namespace {

using vt::error_of;

// A fresh empty directory under the system temp dir, removed at scope exit.
struct TempDir {
    fs::path path;
    TempDir() {
        static int counter = 0;
        path = fs::temp_directory_path() /
               ("vlsparse_sim_loader_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
        fs::remove_all(path);
        fs::create_directories(path);
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path, ec);
    }
};

DumpManifest small_manifest(DType dt, const std::string& storage) {
    DumpManifest m;
    m.model = "test/random";
    m.shape = {2, 4, 2, 8};
    m.dtype = dt;
    m.layout = Layout::parse("text:3,text:1,image:4[2x2],text:1,text:2");
    m.decode_steps = 2;
    m.scale = 0.25;
    m.storage = storage;
    for (std::int64_t i = 0; i < m.tokens(); ++i) m.input_ids.push_back(100 + i);
    return m;
}

std::vector<DumpLayer> random_layers(const DumpManifest& m, std::uint64_t seed) {
    std::vector<DumpLayer> L(static_cast<std::size_t>(m.shape.layers));
    const auto n = static_cast<std::size_t>(m.tokens());
    for (std::size_t l = 0; l < L.size(); ++l) {
        L[l].q = vt::random_buffer<float>(n * 4 * 8, seed + 3 * l);
        L[l].k = vt::random_buffer<float>(n * 2 * 8, seed + 3 * l + 1);
        L[l].v = vt::random_buffer<float>(n * 2 * 8, seed + 3 * l + 2);
    }
    return L;
}

std::vector<float> rounded(const std::vector<float>& x, DType t) {
    std::vector<float> y(x);
    for (auto& e : y)
        e = t == DType::f16 ? vlsparse::to_float(vlsparse::half(e)) : t == DType::bf16 ? vlsparse::to_float(vlsparse::bfloat16(e)) : e;
    return y;
}

std::string slurp(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
}
void spit(const fs::path& p, const std::string& s) {
    std::ofstream f(p, std::ios::binary | std::ios::trunc);
    f.write(s.data(), static_cast<std::streamsize>(s.size()));
}

// A raw safetensors file from a header string and data bytes (independent of the writer).
std::string raw_safetensors(const std::string& header, const std::string& data) {
    std::string out(8, '\0');
    std::uint64_t h = header.size();
    for (int i = 0; i < 8; ++i, h >>= 8) out[static_cast<std::size_t>(i)] = static_cast<char>(h & 0xFF);
    return out + header + data;
}

void edit_manifest(const fs::path& dir, const std::string& from, const std::string& to) {
    std::string s = slurp(dir / "manifest.json");
    const auto at = s.find(from);
    REQUIRE(at != std::string::npos);
    s.replace(at, from.size(), to);
    spit(dir / "manifest.json", s);
}

}  // namespace

TEST_CASE("dump: round trip through npy and safetensors in fp32, fp16 and bf16", "[sim][loader]") {
    for (const std::string storage : {"npy", "safetensors"})
        for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
            INFO(storage << " " << vlsparse::sim::dump_dtype_name(dt));
            TempDir tmp;
            const DumpManifest m = small_manifest(dt, storage);
            const auto layers = random_layers(m, vt::base_seed());
            vlsparse::sim::write_dump(tmp.path, m, layers);
            CHECK(fs::exists(tmp.path / "manifest.json"));
            CHECK(fs::exists(tmp.path / (storage == "npy" ? "layer_001_v.npy" : "qkv.safetensors")));
            const DumpSource src(tmp.path);
            CHECK(src.manifest().model == "test/random");
            CHECK(src.shape() == m.shape);
            CHECK(src.layout() == m.layout);
            CHECK(src.manifest().dtype == dt);
            CHECK(src.manifest().decode_steps == 2);
            CHECK(src.tokens() == 13);
            CHECK(src.manifest().scale == 0.25);
            CHECK(src.manifest().softmax_scale() == 0.25);
            CHECK(src.manifest().input_ids == m.input_ids);
            for (std::int64_t l = 0; l < 2; ++l) {
                const DumpLayer got = src.layer(l);
                const auto& want = layers[static_cast<std::size_t>(l)];
                CHECK(got.q == rounded(want.q, dt));
                CHECK(got.k == rounded(want.k, dt));
                CHECK(got.v == rounded(want.v, dt));
            }
        }
}

TEST_CASE("dump: the npy files are what numpy reads (bf16 as raw uint16 bits)", "[sim][loader]") {
    TempDir tmp;
    const DumpManifest m = small_manifest(DType::bf16, "npy");
    const auto layers = random_layers(m, vt::base_seed());
    vlsparse::sim::write_dump(tmp.path, m, layers);
    const auto a = vlsparse::read_npy(tmp.path / "layer_000_k.npy");
    CHECK(a.descr == "<u2");
    CHECK(a.shape == std::vector<std::int64_t>{13, 2, 8});
    const auto bits = a.to_vector<std::uint16_t>();
    for (std::size_t i = 0; i < bits.size(); ++i) CHECK(bits[i] == vlsparse::bfloat16(layers[0].k[i]).bits);
    // The manifest holds what the format documents.
    const std::string s = slurp(tmp.path / "manifest.json");
    for (const char* key : {"\"format\": \"vlsparse-qkv-dump\"", "\"layers\": 2", "\"heads\": 4", "\"kv_heads\": 2",
                            "\"head_dim\": 8", "\"dtype\": \"bf16\"", "\"layout\": \"text:3,text:1,image:4[2x2],text:1,text:2\"",
                            "\"positions\": \"post-RoPE\"", "\"storage\": \"npy\"", "\"decode_steps\": 2"})
        CHECK_THAT(s, Contains(key));
}

TEST_CASE("safetensors: the writer's bytes, a hand-made file, metadata and dtypes", "[sim][loader]") {
    TempDir tmp;
    // Two F32 values: 8-byte length, the JSON header padded with spaces to a multiple of 8, the data.
    const float v[2] = {1.0f, -2.5f};
    std::vector<std::byte> bytes(8);
    std::memcpy(bytes.data(), v, 8);
    vlsparse::sim::write_safetensors(tmp.path / "a.safetensors", {SafetensorsTensor{"a", "F32", {2}, bytes}});
    const std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
    std::string padded = header;
    padded.append((8 - padded.size() % 8) % 8, ' ');
    CHECK(slurp(tmp.path / "a.safetensors") == raw_safetensors(padded, std::string(reinterpret_cast<const char*>(v), 8)));

    // A file made by hand: metadata, three dtypes, a scalar, tensors not in offset order, no padding.
    const std::uint16_t h16[3] = {0x3C00, 0xC000, 0x3800};  // fp16 1, -2, 0.5
    const std::uint16_t b16[2] = {0x3F80, 0x4040};          // bf16 1, 3
    const std::int64_t i64 = 42;
    std::string data(reinterpret_cast<const char*>(b16), 4);
    data += std::string(reinterpret_cast<const char*>(h16), 6);
    data += std::string(reinterpret_cast<const char*>(&i64), 8);
    spit(tmp.path / "b.safetensors",
         raw_safetensors(R"({"__metadata__":{"who":"test"},"h":{"dtype":"F16","shape":[3,1],"data_offsets":[4,10]},)"
                         R"("b":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},"s":{"dtype":"I64","shape":[],"data_offsets":[10,18]}})",
                         data));
    const SafetensorsFile f(tmp.path / "b.safetensors");
    CHECK(f.tensors().size() == 3);
    CHECK(f.metadata().at("who") == "test");
    CHECK(f.read_float("h") == std::vector<float>{1.0f, -2.0f, 0.5f});
    CHECK(f.read_float("b") == std::vector<float>{1.0f, 3.0f});
    REQUIRE(f.find("h") != nullptr);
    CHECK(f.find("h")->shape == std::vector<std::int64_t>{3, 1});
    CHECK(f.find("s")->numel() == 1);
    const auto raw = f.read_bytes(*f.find("s"));
    std::int64_t back = 0;
    std::memcpy(&back, raw.data(), 8);
    CHECK(back == 42);
    CHECK_THAT(error_of([&] { f.read_float("s"); }), Contains("tensor 's' has dtype I64, expected F32, F16 or BF16"));
    CHECK_THAT(error_of([&] { f.read_float("zz"); }), Contains("no tensor named 'zz'"));
    // The writer round-trips what the reader reads, metadata included.
    std::vector<SafetensorsTensor> ts;
    for (const auto& e : f.tensors()) ts.push_back({e.name, e.dtype, e.shape, f.read_bytes(e)});
    vlsparse::sim::write_safetensors(tmp.path / "c.safetensors", ts, f.metadata());
    const SafetensorsFile g(tmp.path / "c.safetensors");
    CHECK(g.metadata() == f.metadata());
    CHECK(g.read_float("h") == f.read_float("h"));
    CHECK(g.read_bytes(*g.find("s")) == raw);
}

TEST_CASE("safetensors: malformed files are rejected naming the file and the problem", "[sim][loader]") {
    TempDir tmp;
    const auto p = tmp.path / "x.safetensors";
    auto err = [&](const std::string& content) {
        spit(p, content);
        return error_of([&] { SafetensorsFile f(p); });
    };
    const std::string ok_header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
    CHECK_THAT(err(raw_safetensors(ok_header, std::string(8, '\0'))), Equals(std::string()));
    CHECK_THAT(err("abc"), Contains("too short for the 8-byte header length (truncated file)"));
    CHECK_THAT(err(raw_safetensors(ok_header, "").substr(0, 30)), Contains("exceeds the 22 bytes after the length field"));
    CHECK_THAT(err(raw_safetensors(ok_header, std::string(5, '\0'))),
               Contains("tensor 'a': data_offsets end at byte 8 but the file holds 5 data bytes (truncated file)"));
    CHECK_THAT(err(raw_safetensors("{not json", "")), Contains("the header is not valid JSON"));
    CHECK_THAT(err(raw_safetensors("[1,2]", "")), Contains("the header is not a JSON object"));
    CHECK_THAT(err(raw_safetensors(R"({"a":{"dtype":"F12","shape":[2],"data_offsets":[0,8]}})", std::string(8, '\0'))),
               Contains("tensor 'a': unknown dtype 'F12'"));
    CHECK_THAT(err(raw_safetensors(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, '\0'))),
               Contains("shape of 3 F32 elements needs 12 bytes, data_offsets [0, 8] hold 8"));
    CHECK_THAT(err(raw_safetensors(R"({"a":{"dtype":"F32","shape":[2]}})", std::string(8, '\0'))),
               Contains("no 'data_offsets'"));
    CHECK_THAT(err(raw_safetensors(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", std::string(8, '\0'))),
               Contains("no string 'dtype'"));
    CHECK_THAT(err(raw_safetensors(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", std::string(8, '\0'))),
               Contains("negative extent"));
    CHECK_THAT(err(raw_safetensors(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", std::string(8, '\0'))),
               Contains("end before they begin"));
    CHECK_THAT(err(raw_safetensors(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                   std::string(8, '\0'))),
               Contains("overlap"));
    // Found by tests/fuzz (safetensors): an empty tensor sorted between two overlapping ones hid the
    // overlap, since only neighbours in offset order were compared.
    CHECK_THAT(err(raw_safetensors(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},"b":{"dtype":"U8","shape":[0],"data_offsets":[4,4]},)"
                                   R"("c":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}})",
                                   std::string(12, '\0'))),
               Contains("tensors 'a' and 'c' overlap in the data section"));
    CHECK_THAT(err(raw_safetensors(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[0],"data_offsets":[2,2]},)"
                                   R"("c":{"dtype":"U8","shape":[0],"data_offsets":[4,4]},"d":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})",
                                   std::string(8, '\0'))),
               Equals(std::string()));  // empty tensors anywhere, touching ranges: fine
    CHECK_THAT(err(raw_safetensors(R"({"__metadata__":{"k":3}})", "")), Contains("__metadata__ 'k' is not a string"));
    CHECK_THAT(error_of([&] { SafetensorsFile f(tmp.path / "none.safetensors"); }), Contains("none.safetensors': no such file"));
    CHECK_THAT(error_of([&] { SafetensorsFile f(tmp.path); }), Contains("is a directory"));
    // Every message names the file.
    CHECK_THAT(err("abc"), Contains(p.string()));
    // The writer checks its input.
    CHECK_THAT(error_of([&] { vlsparse::sim::write_safetensors(p, {SafetensorsTensor{"a", "F32", {3}, std::vector<std::byte>(8)}}); }),
               Contains("shape needs 12 bytes, the tensor holds 8"));
    CHECK_THAT(error_of([&] {
                   vlsparse::sim::write_safetensors(p, {SafetensorsTensor{"a", "F32", {1}, std::vector<std::byte>(4)},
                                                        SafetensorsTensor{"a", "F32", {1}, std::vector<std::byte>(4)}});
               }),
               Contains("appears twice"));
    CHECK_THAT(error_of([&] { vlsparse::sim::write_safetensors(p, {SafetensorsTensor{"a", "Q4", {1}, {}}}); }),
               Contains("unknown dtype 'Q4'"));
}

TEST_CASE("dump: bad manifests are rejected naming the file and the key", "[sim][loader]") {
    TempDir tmp;
    const DumpManifest m = small_manifest(DType::f32, "npy");
    const auto layers = random_layers(m, vt::base_seed());
    vlsparse::sim::write_dump(tmp.path, m, layers);
    const std::string good = slurp(tmp.path / "manifest.json");
    auto err_after = [&](const std::string& from, const std::string& to) {
        spit(tmp.path / "manifest.json", good);
        edit_manifest(tmp.path, from, to);
        return error_of([&] { DumpSource s(tmp.path); });
    };
    CHECK(err_after("\"layers\": 2", "\"layers\": 2") == "");
    CHECK_THAT(err_after("\"layers\": 2,", ""), Contains("manifest.json': missing key 'layers'"));
    CHECK_THAT(err_after("\"layers\": 2", "\"layers\": \"two\""), Contains("'layers' is \"two\", expected an integer"));
    CHECK_THAT(err_after("\"heads\": 4", "\"heads\": 0"), Contains("'heads' = 0, expected >= 1"));
    CHECK_THAT(err_after("\"heads\": 4", "\"heads\": 3"), Contains("heads = 3 is not a multiple of kv_heads = 2"));
    CHECK_THAT(err_after("\"dtype\": \"fp32\"", "\"dtype\": \"fp8\""), Contains("dtype 'fp8' is unsupported, expected fp32, fp16 or bf16"));
    CHECK_THAT(err_after("image:4[2x2]", "image:4[3x3]"), Contains("layout: Layout: segment 2 (image) grid 3x3 does not match"));
    CHECK_THAT(err_after("\"post-RoPE\"", "\"pre-RoPE\""), Contains("positions 'pre-RoPE', expected \"post-RoPE\""));
    CHECK_THAT(err_after("\"storage\": \"npy\"", "\"storage\": \"hdf5\""), Contains("storage 'hdf5'"));
    CHECK_THAT(err_after("\"vlsparse-qkv-dump\"", "\"other\""), Contains("format \"other\""));
    CHECK_THAT(err_after("\"version\": 1", "\"version\": 2"), Contains("version 2, expected 1"));
    CHECK_THAT(err_after("\"decode_steps\": 2", "\"decode_steps\": -1"), Contains("'decode_steps' = -1, expected >= 0"));
    CHECK_THAT(err_after("\"scale\": 0.25", "\"scale\": \"x\""), Contains("'scale' is \"x\", expected a number"));
    CHECK_THAT(err_after("\"input_ids\": [", "\"input_ids\": [7,"), Contains("'input_ids' has 14 entries, expected layout tokens + decode_steps = 13"));
    spit(tmp.path / "manifest.json", "{\"layers\": ");
    CHECK_THAT(error_of([&] { DumpSource s(tmp.path); }), Contains("manifest.json': not valid JSON"));
    fs::remove(tmp.path / "manifest.json");
    CHECK_THAT(error_of([&] { DumpSource s(tmp.path); }), Contains("manifest.json': no such file"));
    CHECK_THAT(error_of([&] { DumpSource s(tmp.path / "nothing"); }), Contains("not a directory"));
}

TEST_CASE("dump: missing layers, wrong shapes, dtypes, truncated files and NaN name the file", "[sim][loader]") {
    SECTION("npy") {
        TempDir tmp;
        const DumpManifest m = small_manifest(DType::f16, "npy");
        const auto layers = random_layers(m, vt::base_seed());
        vlsparse::sim::write_dump(tmp.path, m, layers);
        const DumpSource ok(tmp.path);
        CHECK_THAT(error_of([&] { ok.layer(2); }), Contains("layer = 2, expected 0 <= layer < 2"));
        CHECK_THAT(error_of([&] { ok.layer(-1); }), Contains("layer = -1"));

        // Missing layer file: found when the dump is opened.
        const auto k1 = tmp.path / "layer_001_k.npy";
        const std::string k1_bytes = slurp(k1);
        fs::remove(k1);
        CHECK_THAT(error_of([&] { DumpSource s(tmp.path); }), Contains("layer_001_k.npy': no such file (layer 1 of 2 is missing)"));
        // Shape that does not match the manifest.
        vlsparse::write_npy(k1, std::vector<vlsparse::half>(13 * 4 * 8), {13, 4, 8});
        CHECK_THAT(error_of([&] { DumpSource(tmp.path).layer(1); }),
                   Contains("layer_001_k.npy': shape (13, 4, 8) does not match the manifest: expected (13, 2, 8)"));
        vlsparse::write_npy(k1, std::vector<vlsparse::half>(12 * 2 * 8), {12, 2, 8});
        CHECK_THAT(error_of([&] { DumpSource(tmp.path).layer(1); }), Contains("expected (13, 2, 8) (tokens = layout 11 + decode_steps 2"));
        // Another dtype than the manifest's.
        vlsparse::write_npy(k1, std::vector<float>(13 * 2 * 8), {13, 2, 8});
        CHECK_THAT(error_of([&] { DumpSource(tmp.path).layer(1); }),
                   Contains("layer_001_k.npy': holds '<f4', the manifest says dtype fp16 (expected '<f2')"));
        // Truncated file.
        spit(k1, k1_bytes.substr(0, k1_bytes.size() - 10));
        CHECK_THAT(error_of([&] { DumpSource(tmp.path).layer(1); }), Contains("layer_001_k.npy"));
        CHECK_THAT(error_of([&] { DumpSource(tmp.path).layer(1); }), Contains("truncated data"));
        // NaN.
        std::vector<vlsparse::half> nan(13 * 2 * 8, vlsparse::half(0.5f));
        nan[17] = vlsparse::half(std::nanf(""));
        vlsparse::write_npy(k1, nan, {13, 2, 8});
        CHECK_THAT(error_of([&] { DumpSource(tmp.path).layer(1); }), Contains("layer_001_k.npy': element 17 is nan, expected finite values"));
        spit(k1, k1_bytes);
        CHECK(DumpSource(tmp.path).layer(1).k == rounded(layers[1].k, DType::f16));
    }
    SECTION("bf16 npy written as fp16 is caught") {
        TempDir tmp;
        auto m = small_manifest(DType::f16, "npy");
        vlsparse::sim::write_dump(tmp.path, m, random_layers(m, 5));
        edit_manifest(tmp.path, "\"dtype\": \"fp16\"", "\"dtype\": \"bf16\"");
        CHECK_THAT(error_of([&] { DumpSource(tmp.path).layer(0); }),
                   Contains("holds '<f2', the manifest says dtype bf16 (expected '<u2', the raw bits of bf16)"));
    }
    SECTION("safetensors") {
        TempDir tmp;
        const DumpManifest m = small_manifest(DType::bf16, "safetensors");
        const auto layers = random_layers(m, vt::base_seed());
        vlsparse::sim::write_dump(tmp.path, m, layers);
        const auto file = tmp.path / "qkv.safetensors";
        std::vector<SafetensorsTensor> orig;
        {
            const SafetensorsFile full(file);
            for (const auto& e : full.tensors()) orig.push_back({e.name, e.dtype, e.shape, full.read_bytes(e)});
        }
        REQUIRE(orig.size() == 6u);
        auto rewrite = [&](auto&& edit) {
            auto ts = orig;
            for (auto it = ts.begin(); it != ts.end(); ++it)
                if (it->name == "layers.1.k") {
                    if (!edit(*it)) ts.erase(it);
                    break;
                }
            vlsparse::sim::write_safetensors(file, ts);
        };
        rewrite([](SafetensorsTensor&) { return false; });  // drop layers.1.k
        CHECK_THAT(error_of([&] { DumpSource s(tmp.path); }), Contains("qkv.safetensors': no tensor 'layers.1.k' (layer 1 of 2 is missing)"));
        rewrite([](SafetensorsTensor& t) {
            t.dtype = "F16";
            return true;
        });
        CHECK_THAT(error_of([&] { DumpSource s(tmp.path); }), Contains("tensor 'layers.1.k' has dtype F16, the manifest says bf16 (BF16)"));
        rewrite([](SafetensorsTensor& t) {
            t.shape = {13, 1, 16};
            return true;
        });
        CHECK_THAT(error_of([&] { DumpSource s(tmp.path); }),
                   Contains("tensor 'layers.1.k': shape (13, 1, 16) does not match the manifest: expected (13, 2, 8)"));
        rewrite([](SafetensorsTensor&) { return true; });
        CHECK(DumpSource(tmp.path).layer(1).k == rounded(layers[1].k, DType::bf16));
        const std::string bytes = slurp(file);
        spit(file, bytes.substr(0, bytes.size() - 100));
        CHECK_THAT(error_of([&] { DumpSource s(tmp.path); }), Contains("(truncated file)"));
        CHECK_THAT(error_of([&] { DumpSource s(tmp.path); }), Contains("qkv.safetensors"));
        fs::remove(file);
        CHECK_THAT(error_of([&] { DumpSource s(tmp.path); }), Contains("qkv.safetensors': no such file"));
        // Another file name, named by the manifest.
        auto m2 = m;
        m2.file = "other.safetensors";
        vlsparse::sim::write_dump(tmp.path, m2, layers);
        CHECK(DumpSource(tmp.path).layer(1).v == rounded(layers[1].v, DType::bf16));
    }
    SECTION("the writer checks its input") {
        TempDir tmp;
        auto m = small_manifest(DType::f32, "npy");
        auto layers = random_layers(m, 1);
        CHECK_THAT(error_of([&] { vlsparse::sim::write_dump(tmp.path, m, std::span<const DumpLayer>(layers).first(1)); }),
                   Contains("got 1 layers, the manifest says 2"));
        layers[1].q.pop_back();
        CHECK_THAT(error_of([&] { vlsparse::sim::write_dump(tmp.path, m, layers); }),
                   Contains("layer 1: q has 415 values, expected tokens * heads * head_dim = 416"));
    }
}

TEST_CASE("safetensors: element counts beyond int64 are errors, not overflow (issue 21)", "[sim][loader][issue21]") {
    // [2^63 - 1, 2] of U8 needs 2^64 - 2 bytes, which fits the byte count, but its element count does
    // not fit int64: numel() overflowed (signed: UBSan reports it), and the header check evaluated it
    // for its message even when the check passed.
    TempDir tmp;
    spit(tmp.path / "big.safetensors",
         raw_safetensors(R"({"t":{"dtype":"U8","shape":[9223372036854775807,2],"data_offsets":[0,18446744073709551614]}})",
                         ""));
    CHECK_THAT(error_of([&] { SafetensorsFile f(tmp.path / "big.safetensors"); }),
               Contains("tensor 't': its shape has too many elements"));
    vlsparse::sim::SafetensorsEntry e;
    e.name = "t";
    e.shape = {9223372036854775807, 2};
    CHECK_THAT(error_of([&] { (void)e.numel(); }), Contains("SafetensorsEntry::numel: tensor 't'") && Contains("too many elements"));
    e.shape = {4611686018427387904, 2};  // 2^63: one past the largest int64
    CHECK_THAT(error_of([&] { (void)e.numel(); }), Contains("too many elements"));
    e.shape = {4611686018427387903, 2};  // 2^63 - 2 fits
    CHECK(e.numel() == 9223372036854775806);
    e.shape = {0, 9223372036854775807, 2};  // an empty tensor, whatever the other extents
    CHECK(e.numel() == 0);
}

TEST_CASE("dump: tokens() and decode_steps cannot overflow (issue 21)", "[sim][loader][issue21]") {
    // layout tokens + decode_steps was a signed int64 sum: decode_steps near 2^63 overflowed it.
    DumpManifest m;
    m.layout = Layout::parse("text:10");
    m.decode_steps = 9223372036854775807;
    CHECK_THAT(error_of([&] { (void)m.tokens(); }),
               Contains("DumpManifest::tokens: layout tokens 10 + decode_steps 9223372036854775807 overflow int64"));
    m.decode_steps = 9223372036854775797;  // the largest that fits
    CHECK(m.tokens() == 9223372036854775807);

    // A manifest with such decode_steps is rejected when it is read, naming the key.
    TempDir tmp;
    const DumpManifest small = small_manifest(DType::f32, "npy");
    vlsparse::sim::write_dump(tmp.path, small, random_layers(small, vt::base_seed()));
    edit_manifest(tmp.path, "\"decode_steps\": 2", "\"decode_steps\": 9223372036854775807");
    CHECK_THAT(error_of([&] { DumpSource s(tmp.path); }),
               Contains("manifest.json': 'decode_steps' = 9223372036854775807: layout tokens 11 + decode_steps overflow int64"));
}
