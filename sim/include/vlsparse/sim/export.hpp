// vlsparse/sim/export.hpp -- `vlsparse-sim export SCENARIO OUTDIR`: a scenario's Q/K/V as a dump.
//
// Writes the Q/K/V the simulator's engine would feed its policies, per layer, in the dump format of
// sim/dump.hpp (the format sim/tools/dump_qkv.py writes), so that external tools and ports (numpy,
// PyTorch, another implementation) run on exactly the simulator's inputs:
//   plain sources (synthetic, dump)  layer l's rows as PlainSource::layer(l) gives them: the n prompt
//                                    rows, then one row per decode step. A scenario that reads the
//                                    export as {"source": {"kind": "dump", "dir": OUTDIR}} gets the same
//                                    Q/K/V bit for bit (fp32 storage), hence the same report.
//   residual source                  the DENSE run's Q/K/V (the dense reference's hidden states, its
//                                    greedy tokens fed back at each decode step): what every policy
//                                    would see if it made no error. A policy's own Q/K/V in residual
//                                    mode depend on its errors and are not exported. The dense tokens
//                                    (the LM head after the prompt and after each decode step) are
//                                    recorded in the manifest as "dense_tokens" (ignored by the loader).
// Storage is fp32 npy by default ("--dtype fp16|bf16" rounds, "--safetensors" writes one file).
// The manifest's "model" names the scenario and its source. Include: <vlsparse/sim/export.hpp>
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "vlsparse/attention/decode.hpp"
#include "vlsparse/attention/dense.hpp"
#include "vlsparse/kv/kv_cache.hpp"
#include "vlsparse/sim/cli.hpp"
#include "vlsparse/sim/dump.hpp"
#include "vlsparse/sim/layer_source.hpp"
#include "vlsparse/sim/scenario.hpp"

namespace vlsparse::sim {

inline const char* kExportUsage =
    "usage: vlsparse-sim export [SCENARIO.json] OUTDIR [options]\n"
    "\n"
    "Writes the scenario's Q/K/V, every layer, as a dump directory (the format of sim/tools/dump_qkv.py,\n"
    "docs/simulator-sources.md): OUTDIR/manifest.json and layer_LLL_{q,k,v}.npy. A scenario with\n"
    "{\"source\": {\"kind\": \"dump\", \"dir\": OUTDIR}} then runs on exactly the same inputs. Synthetic and\n"
    "dump sources: the rows every policy sees. Residual source: the dense run's Q/K/V (its tokens fed\n"
    "back at each decode step). With one argument, the built-in default scenario is exported to it.\n"
    "\n"
    "options:\n"
    "  --set PATH=VALUE     change a scenario key first (as for run)\n"
    "  --dtype T            storage dtype: fp32 (default, exact), fp16 or bf16 (rounded)\n"
    "  --safetensors        one qkv.safetensors file instead of .npy files\n";

struct ExportOptions {
    DType dtype = DType::f32;
    std::string storage = "npy";
};

struct ExportResult {
    DumpManifest manifest;
    std::vector<std::int64_t> dense_tokens;  // residual source: the dense run's LM-head tokens (1 + S)
};

namespace detail {

inline void export_check_layer(const LayerQKV& x, std::int64_t rows, const ModelShape& m, std::int64_t l) {
    const auto nq = static_cast<std::size_t>(rows * m.heads * m.head_dim);
    const auto nkv = static_cast<std::size_t>(rows * m.kv_heads * m.head_dim);
    require(x.rows == rows && x.q.size() == nq && x.k.size() == nkv && x.v.size() == nkv, "vlsparse-sim export",
            "layer ", l, ": the source gave ", x.rows, " rows (", x.q.size(), " q values), expected ", rows);
}

// The residual model's dense run, layer by layer for the prompt, then token by token.
inline std::vector<DumpLayer> export_residual_dense(const Scenario& s, std::vector<std::int64_t>& tokens) {
    auto model = make_residual_source(s);
    const std::int64_t n = s.n(), S = s.decode_steps, H = s.model.heads, Hkv = s.model.kv_heads,
                       d = s.model.head_dim, L = s.model.layers, D = model->hidden_size();
    std::vector<DumpLayer> out(static_cast<std::size_t>(L));
    std::vector<float> hidden = model->embed_prompt();
    std::vector<std::int64_t> pos(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) pos[static_cast<std::size_t>(i)] = i;
    std::vector<KvCache<float>> caches(static_cast<std::size_t>(L), KvCache<float>(Hkv, d));
    LayerQKV qkv;
    std::vector<float> o;
    for (std::int64_t l = 0; l < L; ++l) {
        model->project(l, std::span<const float>(hidden), std::span<const std::int64_t>(pos), qkv);
        export_check_layer(qkv, n, s.model, l);
        o.assign(static_cast<std::size_t>(n * H * d), 0.0f);
        simd::dense_attention(View3<const float>(qkv.q.data(), {n, H, d}), View3<const float>(qkv.k.data(), {n, Hkv, d}),
                              View3<const float>(qkv.v.data(), {n, Hkv, d}), View3<float>(o.data(), {n, H, d}));
        caches[static_cast<std::size_t>(l)].assign(View3<const float>(qkv.k.data(), {n, Hkv, d}),
                                                    View3<const float>(qkv.v.data(), {n, Hkv, d}));
        model->update(l, std::span<float>(hidden), std::span<const float>(o));
        auto& x = out[static_cast<std::size_t>(l)];
        x.q = qkv.q;
        x.k = qkv.k;
        x.v = qkv.v;
    }
    std::int64_t token = model->lm_head(std::span<const float>(hidden.data() + (n - 1) * D, static_cast<std::size_t>(D)));
    tokens.push_back(token);
    for (std::int64_t t = 0; t < S; ++t) {
        std::vector<float> x = model->embed_token(token, n + t);
        const std::int64_t p = n + t;
        for (std::int64_t l = 0; l < L; ++l) {
            model->project(l, std::span<const float>(x), std::span<const std::int64_t>(&p, 1), qkv);
            export_check_layer(qkv, 1, s.model, l);
            auto& c = caches[static_cast<std::size_t>(l)];
            c.append(View2<const float>(qkv.k.data(), {Hkv, d}), View2<const float>(qkv.v.data(), {Hkv, d}));
            o.assign(static_cast<std::size_t>(H * d), 0.0f);
            simd::decode_attention(View2<const float>(qkv.q.data(), {H, d}), c, View2<float>(o.data(), {H, d}));
            model->update(l, std::span<float>(x), std::span<const float>(o));
            auto& y = out[static_cast<std::size_t>(l)];
            y.q.insert(y.q.end(), qkv.q.begin(), qkv.q.end());
            y.k.insert(y.k.end(), qkv.k.begin(), qkv.k.end());
            y.v.insert(y.v.end(), qkv.v.begin(), qkv.v.end());
        }
        token = model->lm_head(std::span<const float>(x));
        tokens.push_back(token);
    }
    return out;
}

}  // namespace detail

// Writes the scenario's Q/K/V into `dir` as a dump; returns its manifest.
inline ExportResult export_scenario(const Scenario& s, const std::filesystem::path& dir, const ExportOptions& opt = {}) {
    ExportResult r;
    DumpManifest& m = r.manifest;
    m.shape = s.model;
    m.layout = s.layout;
    m.decode_steps = s.decode_steps;
    m.dtype = opt.dtype;
    m.storage = opt.storage;
    m.scale = 0.0;  // the engine's default scale 1/sqrt(d): a dump source scales q by 1 on loading
    std::vector<DumpLayer> layers;
    std::string what;
    if (s.source.kind == SourceKind::residual) {
        layers = detail::export_residual_dense(s, r.dense_tokens);
        what = "residual source, dense run";
    } else {
        auto src = make_plain_source(s);
        what = src->describe();
        layers.resize(static_cast<std::size_t>(s.model.layers));
        for (std::int64_t l = 0; l < s.model.layers; ++l) {
            LayerQKV x = src->layer(l);
            detail::export_check_layer(x, s.n() + s.decode_steps, s.model, l);
            auto& y = layers[static_cast<std::size_t>(l)];
            y.q = std::move(x.q);
            y.k = std::move(x.k);
            y.v = std::move(x.v);
        }
        if (s.source.kind == SourceKind::dump) {
            const DumpManifest src_m = read_dump_manifest(s.source.dir);
            if (!src_m.input_ids.empty() &&
                static_cast<std::int64_t>(src_m.input_ids.size()) >= s.n() + s.decode_steps)
                m.input_ids.assign(src_m.input_ids.begin(), src_m.input_ids.begin() + (s.n() + s.decode_steps));
        }
    }
    m.model = "vlsparse-sim export of scenario '" + s.name + "' (" + what + ")";
    write_dump(dir, m, std::span<const DumpLayer>(layers));
    if (!r.dense_tokens.empty()) {  // an extra manifest key, ignored by the loader
        std::ifstream f(dir / "manifest.json");
        nlohmann::ordered_json j = nlohmann::ordered_json::parse(f);
        f.close();
        j["dense_tokens"] = r.dense_tokens;
        std::ofstream g(dir / "manifest.json");
        g << j.dump(2) << "\n";
        g.close();
        detail::require(!g.fail(), "vlsparse-sim export", "'", (dir / "manifest.json").string(), "': write error");
    }
    return r;
}

}  // namespace vlsparse::sim
