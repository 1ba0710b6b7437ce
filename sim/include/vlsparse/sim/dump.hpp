// vlsparse/sim/dump.hpp -- Q/K/V dumped from a real model: the directory format, a loader and a writer.
//
// A dump is a directory with manifest.json and the tensors of every layer l = 0 .. layers-1:
//   manifest.json   {"format": "vlsparse-qkv-dump", "version": 1,
//                    "model": "Qwen/Qwen2-VL-2B-Instruct",        (free text, optional)
//                    "layers": 28, "heads": 12, "kv_heads": 2, "head_dim": 128,
//                    "dtype": "bf16",                 storage dtype: "fp32", "fp16" or "bf16"
//                    "layout": "text:15,image:64[8x8],text:20",   Layout::parse syntax, the prompt
//                    "positions": "post-RoPE",        q and k after the rotary embedding (the only
//                                                     convention accepted: scale * q.k are the logits)
//                    "storage": "npy",                "npy" (default) or "safetensors"
//                    "file": "qkv.safetensors",       safetensors only (this is the default name)
//                    "decode_steps": 0,               optional: rows after the prompt that are decode
//                                                     tokens (generated one at a time, greedy)
//                    "scale": 0.0883883,              optional: the model's softmax scale (default 1/sqrt(d))
//                    "input_ids": [...]}              optional: the token ids (prompt, then decode tokens)
//   npy storage:    layer_{l:03d}_q.npy [n, heads, d], layer_{l:03d}_k.npy and layer_{l:03d}_v.npy
//                   [n, kv_heads, d], with n = tokens of the layout + decode_steps; '<f4' (fp32),
//                   '<f2' (fp16) or '<u2' holding the raw bits of bf16 (numpy has no bfloat16).
//   safetensors:    one file with tensors "layers.{l}.q", "layers.{l}.k", "layers.{l}.v" of the same
//                   shapes, dtype F32, F16 or BF16 matching the manifest.
// Other keys of the manifest are ignored; other files and tensors are ignored.
// DumpSource checks the manifest and that every layer's files (or tensors) exist when it is opened,
// and each layer's dtype, shape and values when it is read; errors name the file and the problem.
// sim/tools/dump_qkv.py writes this format from Hugging Face transformers models.
// Needs nlohmann/json (3.10 or newer). Include: <vlsparse/sim/dump.hpp>
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "vlsparse/core/dtype.hpp"
#include "vlsparse/core/error.hpp"
#include "vlsparse/core/layout.hpp"
#include "vlsparse/io/npy.hpp"
#include "vlsparse/sim/model_shape.hpp"
#include "vlsparse/sim/safetensors.hpp"

namespace vlsparse::sim {

struct DumpManifest {
    std::string model;                   // free text
    ModelShape shape;                    // layers, heads, kv_heads, head_dim
    DType dtype = DType::f32;            // storage dtype
    Layout layout;                       // the prompt
    std::int64_t decode_steps = 0;       // decode rows after the prompt
    double scale = 0.0;                  // softmax scale; 0: 1/sqrt(head_dim)
    std::string storage = "npy";         // "npy" or "safetensors"
    std::string file = "qkv.safetensors";  // safetensors file name inside the directory
    std::vector<std::int64_t> input_ids;   // optional token ids (empty: not recorded)

    // Rows: prompt + decode steps. Throws vlsparse::error when the sum does not fit int64.
    std::int64_t tokens() const {
        const std::int64_t n = layout.n();
        if (decode_steps < 0 || decode_steps > std::numeric_limits<std::int64_t>::max() - n)
            throw ::vlsparse::error("DumpManifest::tokens", ::vlsparse::concat("layout tokens ", n,
                                                                                      " + decode_steps ", decode_steps,
                                                                                      " overflow int64"));
        return n + decode_steps;
    }
    double softmax_scale() const { return scale > 0.0 ? scale : 1.0 / std::sqrt(static_cast<double>(shape.head_dim)); }
};

// One layer of a dump in fp32: q [n, H, d], k and v [n, H_kv, d].
struct DumpLayer {
    std::vector<float> q, k, v;
};

inline std::string_view dump_dtype_name(DType t) { return t == DType::f32 ? "fp32" : t == DType::f16 ? "fp16" : "bf16"; }

namespace detail {

using ::vlsparse::require;

inline std::string dump_npy_name(std::int64_t layer, char which) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "layer_%03lld_%c.npy", static_cast<long long>(layer), which);
    return buf;
}
inline std::string dump_tensor_name(std::int64_t layer, char which) {
    return "layers." + std::to_string(layer) + "." + std::string(1, which);
}
inline std::string_view npy_descr_of(DType t) { return t == DType::f32 ? "<f4" : t == DType::f16 ? "<f2" : "<u2"; }
inline std::string_view safetensors_dtype_of(DType t) { return t == DType::f32 ? "F32" : t == DType::f16 ? "F16" : "BF16"; }

}  // namespace detail

// Reads and checks dir/manifest.json.
inline DumpManifest read_dump_manifest(const std::filesystem::path& dir) {
    constexpr const char* fn = "read_dump_manifest";
    const auto path = dir / "manifest.json";
    const std::string name = path.string();
    detail::require(std::filesystem::is_directory(dir), fn, "'", dir.string(), "': not a directory");
    detail::require(std::filesystem::exists(path), fn, "'", name, "': no such file (a dump directory holds manifest.json)");
    std::ifstream f(path);
    detail::require(static_cast<bool>(f), fn, "'", name, "': cannot open for reading");
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(f);
    } catch (const nlohmann::json::exception& ex) {
        throw ::vlsparse::error(fn, "'" + name + "': not valid JSON (" + ex.what() + ")");
    }
    detail::require(j.is_object(), fn, "'", name, "': expected a JSON object");
    auto need = [&](const char* key) -> const nlohmann::json& {
        detail::require(j.contains(key), fn, "'", name, "': missing key '", key, "'");
        return j[key];
    };
    auto integer = [&](const char* key, std::int64_t min) {
        const auto& v = need(key);
        detail::require(v.is_number_integer(), fn, "'", name, "': '", key, "' is ", v.dump(), ", expected an integer");
        const auto x = v.get<std::int64_t>();
        detail::require(x >= min, fn, "'", name, "': '", key, "' = ", x, ", expected >= ", min);
        return x;
    };
    auto string = [&](const char* key) {
        const auto& v = need(key);
        detail::require(v.is_string(), fn, "'", name, "': '", key, "' is ", v.dump(), ", expected a string");
        return v.get<std::string>();
    };
    DumpManifest m;
    if (j.contains("format"))
        detail::require(j["format"] == "vlsparse-qkv-dump", fn, "'", name, "': format ", j["format"].dump(),
                        ", expected \"vlsparse-qkv-dump\"");
    if (j.contains("version"))
        detail::require(j["version"] == 1, fn, "'", name, "': version ", j["version"].dump(), ", expected 1");
    if (j.contains("model")) m.model = string("model");
    m.shape.layers = integer("layers", 1);
    m.shape.heads = integer("heads", 1);
    m.shape.kv_heads = integer("kv_heads", 1);
    m.shape.head_dim = integer("head_dim", 1);
    detail::require(m.shape.heads % m.shape.kv_heads == 0, fn, "'", name, "': heads = ", m.shape.heads,
                    " is not a multiple of kv_heads = ", m.shape.kv_heads);
    const std::string dt = string("dtype");
    if (dt == "fp32") m.dtype = DType::f32;
    else if (dt == "fp16") m.dtype = DType::f16;
    else if (dt == "bf16") m.dtype = DType::bf16;
    else throw ::vlsparse::error(fn, "'" + name + "': dtype '" + dt + "' is unsupported, expected fp32, fp16 or bf16");
    try {
        m.layout = Layout::parse(string("layout"));
    } catch (const ::vlsparse::error& e) {
        throw ::vlsparse::error(fn, "'" + name + "': layout: " + e.what());
    }
    const std::string pos = string("positions");
    detail::require(pos == "post-RoPE", fn, "'", name, "': positions '", pos,
                    "', expected \"post-RoPE\" (q and k recorded after the rotary embedding)");
    if (j.contains("storage")) m.storage = string("storage");
    detail::require(m.storage == "npy" || m.storage == "safetensors", fn, "'", name, "': storage '", m.storage,
                    "', expected \"npy\" or \"safetensors\"");
    if (j.contains("file")) m.file = string("file");
    if (j.contains("decode_steps")) m.decode_steps = integer("decode_steps", 0);
    detail::require(m.decode_steps <= std::numeric_limits<std::int64_t>::max() - m.layout.n(), fn, "'", name,
                    "': 'decode_steps' = ", m.decode_steps, ": layout tokens ", m.layout.n(),
                    " + decode_steps overflow int64");
    if (j.contains("scale")) {
        const auto& v = j["scale"];
        detail::require(v.is_number(), fn, "'", name, "': 'scale' is ", v.dump(), ", expected a number");
        m.scale = v.get<double>();
        detail::require(std::isfinite(m.scale) && m.scale >= 0.0, fn, "'", name, "': scale = ", m.scale, ", expected >= 0");
    }
    if (j.contains("input_ids")) {
        const auto& v = j["input_ids"];
        detail::require(v.is_array(), fn, "'", name, "': 'input_ids' is not an array");
        for (const auto& x : v) {
            detail::require(x.is_number_integer(), fn, "'", name, "': 'input_ids' holds ", x.dump(), ", expected integers");
            m.input_ids.push_back(x.get<std::int64_t>());
        }
        detail::require(static_cast<std::int64_t>(m.input_ids.size()) == m.tokens(), fn, "'", name, "': 'input_ids' has ",
                        m.input_ids.size(), " entries, expected layout tokens + decode_steps = ", m.tokens());
    }
    return m;
}

// Writes dir/manifest.json (creating dir).
inline void write_dump_manifest(const std::filesystem::path& dir, const DumpManifest& m) {
    constexpr const char* fn = "write_dump_manifest";
    m.shape.validate(fn);
    std::filesystem::create_directories(dir);
    nlohmann::ordered_json j;
    j["format"] = "vlsparse-qkv-dump";
    j["version"] = 1;
    j["model"] = m.model;
    j["layers"] = m.shape.layers;
    j["heads"] = m.shape.heads;
    j["kv_heads"] = m.shape.kv_heads;
    j["head_dim"] = m.shape.head_dim;
    j["dtype"] = std::string(dump_dtype_name(m.dtype));
    j["layout"] = m.layout.to_string();
    j["positions"] = "post-RoPE";
    j["storage"] = m.storage;
    if (m.storage == "safetensors") j["file"] = m.file;
    j["decode_steps"] = m.decode_steps;
    if (m.scale > 0.0) j["scale"] = m.scale;
    if (!m.input_ids.empty()) j["input_ids"] = m.input_ids;
    std::ofstream f(dir / "manifest.json");
    detail::require(static_cast<bool>(f), fn, "'", (dir / "manifest.json").string(), "': cannot open for writing");
    f << j.dump(2) << "\n";
    f.close();
    detail::require(!f.fail(), fn, "'", (dir / "manifest.json").string(), "': write error");
}

// Q/K/V of a dump directory, one layer at a time, in fp32.
class DumpSource {
public:
    explicit DumpSource(std::filesystem::path dir) : dir_(std::move(dir)), m_(read_dump_manifest(dir_)) {
        constexpr const char* fn = "DumpSource";
        if (m_.storage == "npy") {
            for (std::int64_t l = 0; l < m_.shape.layers; ++l)
                for (char w : {'q', 'k', 'v'}) {
                    const auto p = dir_ / detail::dump_npy_name(l, w);
                    detail::require(std::filesystem::exists(p), fn, "'", p.string(), "': no such file (layer ", l,
                                    " of ", m_.shape.layers, " is missing)");
                }
        } else {
            st_.emplace(dir_ / m_.file);
            for (std::int64_t l = 0; l < m_.shape.layers; ++l)
                for (char w : {'q', 'k', 'v'}) {
                    const std::string t = detail::dump_tensor_name(l, w);
                    const SafetensorsEntry* e = st_->find(t);
                    detail::require(e != nullptr, fn, "'", st_->path().string(), "': no tensor '", t, "' (layer ", l,
                                    " of ", m_.shape.layers, " is missing)");
                    const std::string_view want = detail::safetensors_dtype_of(m_.dtype);
                    detail::require(e->dtype == want, fn, "'", st_->path().string(), "': tensor '", t, "' has dtype ",
                                    e->dtype, ", the manifest says ", dump_dtype_name(m_.dtype), " (", want, ")");
                    check_shape(e->shape, l, w, "'" + st_->path().string() + "': tensor '" + t + "'");
                }
        }
    }

    const std::filesystem::path& dir() const { return dir_; }
    const DumpManifest& manifest() const { return m_; }
    const Layout& layout() const { return m_.layout; }
    const ModelShape& shape() const { return m_.shape; }
    std::int64_t tokens() const { return m_.tokens(); }  // rows: prompt + decode steps

    // Layer l's q [n, H, d], k and v [n, H_kv, d] in fp32 (read from disk at each call).
    DumpLayer layer(std::int64_t l) const {
        constexpr const char* fn = "DumpSource::layer";
        detail::require(l >= 0 && l < m_.shape.layers, fn, "layer = ", l, ", expected 0 <= layer < ", m_.shape.layers);
        DumpLayer out;
        for (char w : {'q', 'k', 'v'}) {
            std::vector<float>& dst = w == 'q' ? out.q : w == 'k' ? out.k : out.v;
            std::string where;
            if (m_.storage == "npy") {
                const auto p = dir_ / detail::dump_npy_name(l, w);
                where = "'" + p.string() + "'";
                const NpyArray a = read_npy(p);
                const std::string_view want = detail::npy_descr_of(m_.dtype);
                detail::require(a.descr == want, fn, where, ": holds '", a.descr, "', the manifest says dtype ",
                                dump_dtype_name(m_.dtype), " (expected '", want, "'",
                                m_.dtype == DType::bf16 ? ", the raw bits of bf16" : "", ")");
                check_shape(a.shape, l, w, where);
                dst.resize(static_cast<std::size_t>(a.numel()));
                const auto* b = reinterpret_cast<const unsigned char*>(a.data.data());
                for (std::size_t i = 0; i < dst.size(); ++i) {
                    if (m_.dtype == DType::f32) {
                        const std::uint32_t u = static_cast<std::uint32_t>(b[4 * i]) | (static_cast<std::uint32_t>(b[4 * i + 1]) << 8) |
                                                (static_cast<std::uint32_t>(b[4 * i + 2]) << 16) |
                                                (static_cast<std::uint32_t>(b[4 * i + 3]) << 24);
                        dst[i] = ::vlsparse::bits_float(u);
                    } else {
                        const auto u = static_cast<std::uint16_t>(b[2 * i] | (b[2 * i + 1] << 8));
                        dst[i] = m_.dtype == DType::f16 ? half::to_float(u) : bfloat16::to_float(u);
                    }
                }
            } else {
                const std::string t = detail::dump_tensor_name(l, w);
                where = "'" + st_->path().string() + "': tensor '" + t + "'";
                dst = st_->read_float(t);
            }
            for (std::size_t i = 0; i < dst.size(); ++i)
                detail::require(std::isfinite(dst[i]), fn, where, ": element ", i, " is ", dst[i], ", expected finite values");
        }
        return out;
    }

private:
    void check_shape(const std::vector<std::int64_t>& shape, std::int64_t l, char w, const std::string& where) const {
        const std::int64_t heads = w == 'q' ? m_.shape.heads : m_.shape.kv_heads;
        const std::vector<std::int64_t> want{tokens(), heads, m_.shape.head_dim};
        if (shape == want) return;
        throw ::vlsparse::error("DumpSource", where + ": shape " + ::vlsparse::npy_shape_repr(shape) +
                                                  " does not match the manifest: expected " +
                                                  ::vlsparse::npy_shape_repr(want) + " (tokens = layout " +
                                                  std::to_string(m_.layout.n()) + " + decode_steps " +
                                                  std::to_string(m_.decode_steps) + ", " +
                                                  (w == 'q' ? "heads" : "kv_heads") + ", head_dim) for layer " +
                                                  std::to_string(l));
    }

    std::filesystem::path dir_;
    DumpManifest m_;
    std::optional<SafetensorsFile> st_;
};

// Writes a dump directory: the manifest and every layer (fp32 values rounded to m.dtype, nearest
// even), in m.storage. layers.size() must equal m.shape.layers.
inline void write_dump(const std::filesystem::path& dir, const DumpManifest& m, std::span<const DumpLayer> layers) {
    constexpr const char* fn = "write_dump";
    m.shape.validate(fn);
    detail::require(static_cast<std::int64_t>(layers.size()) == m.shape.layers, fn, "got ", layers.size(),
                    " layers, the manifest says ", m.shape.layers);
    detail::require(m.storage == "npy" || m.storage == "safetensors", fn, "storage '", m.storage,
                    "', expected npy or safetensors");
    const std::int64_t n = m.tokens(), d = m.shape.head_dim;
    auto values = [&](std::int64_t heads) {  // n * heads * d, which a manifest may make overflow
        constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
        detail::require(n <= kMax / heads / d, fn, "tokens ", n, " x heads ", heads, " x head_dim ", d,
                        " overflows int64");
        return n * heads * d;
    };
    const std::int64_t nq = values(m.shape.heads), nkv = values(m.shape.kv_heads);
    for (std::size_t l = 0; l < layers.size(); ++l) {
        detail::require(layers[l].q.size() == static_cast<std::size_t>(nq), fn, "layer ", l, ": q has ",
                        layers[l].q.size(), " values, expected tokens * heads * head_dim = ", nq);
        for (const auto* x : {&layers[l].k, &layers[l].v})
            detail::require(x->size() == static_cast<std::size_t>(nkv), fn, "layer ", l, ": k or v has ", x->size(),
                            " values, expected tokens * kv_heads * head_dim = ", nkv);
    }
    write_dump_manifest(dir, m);
    const std::string_view st = detail::safetensors_dtype_of(m.dtype);
    auto shape_of = [&](char w) { return std::vector<std::int64_t>{n, w == 'q' ? m.shape.heads : m.shape.kv_heads, d}; };
    if (m.storage == "npy") {
        for (std::size_t l = 0; l < layers.size(); ++l)
            for (char w : {'q', 'k', 'v'}) {
                const auto& x = w == 'q' ? layers[l].q : w == 'k' ? layers[l].k : layers[l].v;
                NpyArray a;
                a.descr = std::string(detail::npy_descr_of(m.dtype));
                a.shape = shape_of(w);
                a.data = safetensors_encode(x, st);  // the same little-endian bytes
                write_npy(dir / detail::dump_npy_name(static_cast<std::int64_t>(l), w), a);
            }
    } else {
        std::vector<SafetensorsTensor> ts;
        for (std::size_t l = 0; l < layers.size(); ++l)
            for (char w : {'q', 'k', 'v'}) {
                const auto& x = w == 'q' ? layers[l].q : w == 'k' ? layers[l].k : layers[l].v;
                ts.push_back({detail::dump_tensor_name(static_cast<std::int64_t>(l), w), std::string(st), shape_of(w),
                              safetensors_encode(x, st)});
            }
        write_safetensors(dir / m.file, ts, {{"format", "vlsparse-qkv-dump"}});
    }
}

}  // namespace vlsparse::sim
