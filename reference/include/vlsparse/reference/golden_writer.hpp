// vlsparse/reference/golden_writer.hpp -- writes one golden case directory (the generator's side of
// docs/golden-format.md): golden/<algorithm>/<case>/manifest.json plus one .npy per tensor.
//
//   golden::CaseWriter w(root, "zipvl", "mha_fp32_layer", to_json(params), layout.to_string(), "bf16");
//   w.input("q", q, {n, H, d}, "queries [n, H, d]");        // fp32 values stored in the case dtype
//   w.input_exact("layer", std::vector<std::int64_t>{2}, {1}, "layer index");
//   w.output(std::move(t), array);                           // t carries name, metric, tolerance
//   w.outputs(run_outputs, zipvl_output_metric);             // or a run's outputs, each with its metric
//   w.finish("what the case is for");                        // the note, then manifest.json
// The directory is emptied first, so a case that changes shape leaves no stale files. Also the
// generators' common steps: the first seed whose case passes (write_first_passing) and the
// synthetic inputs of a prefill + decode case (synthetic_decode_case).
// Include: <vlsparse/reference/golden_writer.hpp>
#pragma once

#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "vlsparse/core/config.hpp"
#include "vlsparse/core/dtype.hpp"
#include "vlsparse/core/error.hpp"
#include "vlsparse/core/layout.hpp"
#include "vlsparse/io/golden.hpp"
#include "vlsparse/reference/golden_synthetic.hpp"

namespace vlsparse::golden {

// fp32 values rounded to a golden dtype ("fp32", "fp16" or "bf16") and back: the values a case of
// that dtype really holds.
inline float round_to_dtype(const std::string& dtype, float x) {
    if (dtype == "fp16") return to_float(half(x));
    if (dtype == "bf16") return to_float(bfloat16(x));
    return x;
}
inline std::vector<float> round_to_dtype(const std::string& dtype, const std::vector<float>& x) {
    std::vector<float> y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = round_to_dtype(dtype, x[i]);
    return y;
}

class CaseWriter {
public:
    CaseWriter(const std::filesystem::path& root, std::string algorithm, std::string case_name, nlohmann::json params,
               std::string layout, std::string dtype)
        : dir_(root / algorithm / case_name), dtype_(std::move(dtype)) {
        ::vlsparse::detail::require(dtype_ == "fp32" || dtype_ == "fp16" || dtype_ == "bf16", "golden::CaseWriter", "case '",
                        case_name, "': dtype '", dtype_, "', expected fp32, fp16 or bf16");
        std::filesystem::remove_all(dir_);
        std::filesystem::create_directories(dir_);
        m_.algorithm = std::move(algorithm);
        m_.case_name = std::move(case_name);
        m_.generator = std::string("vlsparse-golden ") + VLSPARSE_VERSION_STRING;
        m_.params = std::move(params);
        m_.layout = std::move(layout);
    }

    const std::filesystem::path& dir() const { return dir_; }
    GoldenManifest& manifest() { return m_; }

    // An fp32 input stored in the case dtype.
    void input(const std::string& name, const std::vector<float>& x, const std::vector<std::int64_t>& shape,
               const std::string& what) {
        GoldenTensor t = named(name, what);
        if (dtype_ == "fp32") write_tensor(dir_, t, x, shape);
        else if (dtype_ == "fp16") write_tensor(dir_, t, narrowed<half>(x), shape);
        else write_tensor(dir_, t, narrowed<bfloat16>(x), shape);
        m_.inputs.push_back(std::move(t));
    }
    // An input stored as it is (indices, counts, codes, or values already in their dtype).
    template <GoldenElement T>
    void input_exact(const std::string& name, const std::vector<T>& x, const std::vector<std::int64_t>& shape,
                     const std::string& what) {
        GoldenTensor t = named(name, what);
        write_tensor(dir_, t, x, shape);
        m_.inputs.push_back(std::move(t));
    }
    // An output: `t` names it and carries its metric and tolerance (and optionally a description).
    void output(GoldenTensor t, const NpyArray& a) {
        write_tensor(dir_, t, a);
        m_.outputs.push_back(std::move(t));
    }
    // The decode-step inputs of a prefill + decode case: c.dq [S, H, d], c.dk, c.dv [S, H_kv, d].
    template <class Case>
    void decode_inputs(const Case& c) {
        input("decode_q", c.dq, {c.steps, c.H, c.d}, "decode-step queries [S, H, d]");
        input("decode_k", c.dk, {c.steps, c.Hkv, c.d}, "decode-step keys, appended before each step [S, H_kv, d]");
        input("decode_v", c.dv, {c.steps, c.Hkv, c.d}, "decode-step values [S, H_kv, d]");
    }
    // A run's outputs in order (each with .name and .array), each with the metric and tolerances of
    // metric_of(name) and the description `what` pairs with its name (none when it is not there).
    template <class Outputs, class MetricOf>
    void outputs(const Outputs& outs, MetricOf&& metric_of,
                 std::initializer_list<std::pair<const char*, const char*>> what = {}) {
        for (const auto& o : outs) {
            GoldenTensor t;
            t.name = o.name;
            for (const auto& [name, description] : what)
                if (o.name == name) t.description = description;
            metric_of(o.name).apply(t);
            output(std::move(t), o.array);
        }
    }
    // The manifest, with the standard note followed by `description`.
    void finish(const std::string& description) {
        m_.note = "generated by reference/golden_gen.cpp (vlsparse-golden), do not edit. " + description;
        write_manifest(dir_, m_);
    }

private:
    template <class T>
    static std::vector<T> narrowed(const std::vector<float>& x) {
        std::vector<T> out(x.size());
        for (std::size_t i = 0; i < x.size(); ++i) out[i] = from_float<T>(x[i]);
        return out;
    }
    static GoldenTensor named(const std::string& name, const std::string& what) {
        GoldenTensor t;
        t.name = name;
        t.description = what;
        return t;
    }

    std::filesystem::path dir_;
    std::string dtype_;
    GoldenManifest m_;
};

// Writes a case from the first seed of [first, first + tries) for which try_seed(seed) returns true
// (try_seed writes the case, or returns false without writing when its decisions are too close to call);
// throws "<name>: no seed in <tries> tries gives <what>" when none does.
template <class TrySeed>
void write_first_passing(const std::string& name, std::uint64_t first, TrySeed&& try_seed, const std::string& what,
                         std::uint64_t tries = 50) {
    for (std::uint64_t s = first; s < first + tries; ++s)
        if (try_seed(s)) return;
    throw error("vlsparse-golden", name + ": no seed in " + std::to_string(tries) + " tries gives " + what);
}

// The inputs of a prefill + decode case from the synthetic generator, rounded to `dtype`: the prompt's
// q [n, H, d], k, v [n, H_kv, d] (layer `layer` of seed `seed` over `layout`) and `steps` decode tokens
// (a text-only layer of the same shape from seed + 1000); sets c's dtype, layout, n, H, H_kv, d and steps.
// `Case`: DecodeCaseInputs (golden_case.hpp) or a case type derived from it.
template <class Case>
void synthetic_decode_case(Case& c, const std::string& dtype, const Layout& layout, std::int64_t H, std::int64_t Hkv,
                           std::int64_t d, std::int64_t steps, std::uint64_t seed, std::int64_t layer) {
    SyntheticParams S;
    S.n_heads = H;
    S.n_kv_heads = Hkv;
    S.head_dim = d;
    S.seed = seed;
    const auto L = synthetic_layer(layout, S, layer);
    S.seed = seed + 1000;
    const auto D = synthetic_layer(Layout::text_only(steps), S, layer);
    c.dtype = dtype;
    c.layout = layout;
    c.n = layout.n();
    c.H = H;
    c.Hkv = Hkv;
    c.d = d;
    c.steps = steps;
    c.q = round_to_dtype(dtype, L.q);
    c.k = round_to_dtype(dtype, L.k);
    c.v = round_to_dtype(dtype, L.v);
    c.dq = round_to_dtype(dtype, D.q);
    c.dk = round_to_dtype(dtype, D.k);
    c.dv = round_to_dtype(dtype, D.v);
}

}  // namespace vlsparse::golden
