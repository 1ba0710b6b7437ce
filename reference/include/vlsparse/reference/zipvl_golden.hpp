// vlsparse/reference/zipvl_golden.hpp -- the ZipVL golden cases: their definitions, the writer used
// by the generator (reference/golden_gen.cpp) and the loader used by tests and `golden verify`.
//
// Case folder golden/zipvl/<case>/ (see docs/golden-format.md):
//   inputs   q [n,H,d], k, v [n,H_kv,d] (dtype of the case), layer [1], decode_q [S,H,d],
//            decode_k, decode_v [S,H_kv,d]
//   outputs  probes [P], accumulated [G,n], normalized [G,n], p [G], kept_mask [G,n],
//            prefill_out [n,H,d], cache_pos_g<i> [rows], cache_k_g<i>, cache_v_g<i> [rows,d]
//            (i over H_kv), decode_out [S,H,d]
// Needs nlohmann/json. Include: <vlsparse/reference/zipvl_golden.hpp>
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "vlsparse/io/golden.hpp"
#include "vlsparse/io/zipvl_json.hpp"
#include "vlsparse/kv/kv_cache.hpp"
#include "vlsparse/policies/zipvl_select.hpp"
#include "vlsparse/reference/golden_case.hpp"
#include "vlsparse/reference/zipvl.hpp"

namespace vlsparse::golden {

// The inputs of one ZipVL golden case: those of every prefill + decode case, the layer and the Params.
struct ZipVLCaseInputs : DecodeCaseInputs {
    std::int64_t layer = 0;
    ZipVLParams params;
};

// Reads the inputs of a case folder (any dtype) into fp32 plus the stated dtype.
inline ZipVLCaseInputs read_zipvl_inputs(const std::filesystem::path& dir, GoldenManifest* manifest = nullptr) {
    constexpr const char* fn = "read_zipvl_inputs";
    const GoldenManifest m = detail::read_case_manifest(dir, "zipvl", fn);
    ZipVLCaseInputs c;
    c.params = zipvl_params_from_json(m.params, "params.");
    c.layout = Layout::parse(m.layout);
    detail::read_decode_case_inputs(dir, m, c, fn);
    c.layer = read_tensor(dir, m.input("layer")).to_vector<std::int64_t>().at(0);
    if (manifest) *manifest = m;
    return c;
}

namespace detail {

template <class Backend, ElementType T>
std::vector<NamedArray> run_zipvl_typed(const ZipVLCaseInputs& c) {
    const auto q = narrow<T>(c.q), k = narrow<T>(c.k), v = narrow<T>(c.v);
    const auto dq = narrow<T>(c.dq), dk = narrow<T>(c.dk), dv = narrow<T>(c.dv);
    const std::int64_t n = c.n, H = c.H, Hkv = c.Hkv, d = c.d;
    const View3<const T> qv(q.data(), {n, H, d}), kv(k.data(), {n, Hkv, d}), vv(v.data(), {n, Hkv, d});
    const ZipVLSelection s = Backend::select(qv, kv, c.layout, c.layer, c.params);
    std::vector<NamedArray> out;
    const auto G = static_cast<std::int64_t>(s.p.size());
    out.push_back({"probes", NpyArray::from(s.probes.data(), {static_cast<std::int64_t>(s.probes.size())})});
    auto flat = [&](const std::vector<std::vector<double>>& m) {
        std::vector<double> f;
        for (const auto& r : m) f.insert(f.end(), r.begin(), r.end());
        return f;
    };
    const auto acc = flat(s.accumulated), nrm = flat(s.normalized);
    out.push_back({"accumulated", NpyArray::from(acc.data(), {static_cast<std::int64_t>(s.accumulated.size()), n})});
    out.push_back({"normalized", NpyArray::from(nrm.data(), {static_cast<std::int64_t>(s.normalized.size()), n})});
    out.push_back({"p", NpyArray::from(s.p.data(), {G})});
    std::vector<std::uint8_t> mask(static_cast<std::size_t>(G * n), 0);
    for (std::int64_t g = 0; g < G; ++g)
        for (auto j : s.selection.indices[static_cast<std::size_t>(g)]) mask[static_cast<std::size_t>(g * n + j)] = 1;
    out.push_back({"kept_mask", NpyArray::from(mask.data(), {G, n})});

    std::vector<float> o(static_cast<std::size_t>(n * H * d));
    Backend::prefill(qv, kv, vv, s, View3<float>(o.data(), {n, H, d}), c.params);
    out.push_back({"prefill_out", NpyArray::from(o.data(), {n, H, d})});

    KvCache<T> cache(Hkv, d);
    cache.assign(kv, vv);
    zipvl_evict(cache, s);
    for (std::int64_t g = 0; g < Hkv; ++g) {
        const auto pos = cache.positions(g);
        const auto rows = static_cast<std::int64_t>(pos.size());
        const std::string suffix = "_g" + std::to_string(g);
        out.push_back({"cache_pos" + suffix, NpyArray::from(pos.data(), {rows})});
        out.push_back({"cache_k" + suffix, NpyArray::from(cache.k(g).data, {rows, d})});
        out.push_back({"cache_v" + suffix, NpyArray::from(cache.v(g).data, {rows, d})});
    }
    std::vector<float> dout(static_cast<std::size_t>(c.steps * H * d));
    for (std::int64_t t = 0; t < c.steps; ++t) {
        cache.append(View2<const T>(dk.data() + t * Hkv * d, {Hkv, d}), View2<const T>(dv.data() + t * Hkv * d, {Hkv, d}));
        Backend::decode(View2<const T>(dq.data() + t * H * d, {H, d}), cache,
                        View2<float>(dout.data() + t * H * d, {H, d}), c.params.attention());
    }
    out.push_back({"decode_out", NpyArray::from(dout.data(), {c.steps, H, d})});
    return out;
}

}  // namespace detail

// Runs a case through a backend: a type with static select / prefill / decode functions
// (reference::ZipVLOps, simd::ZipVLOps; signatures at reference::ZipVLOps). Returns every output by name.
template <class Backend>
std::vector<NamedArray> run_zipvl_case(const ZipVLCaseInputs& c) {
    if (c.dtype == "fp32") return detail::run_zipvl_typed<Backend, float>(c);
    if (c.dtype == "fp16") return detail::run_zipvl_typed<Backend, half>(c);
    if (c.dtype == "bf16") return detail::run_zipvl_typed<Backend, bfloat16>(c);
    throw error("run_zipvl_case", "input dtype '" + c.dtype + "', expected fp32, fp16 or bf16");
}

// The metric and tolerances of each ZipVL output.
inline OutputMetric zipvl_output_metric(const std::string& name) {
    if (name == "accumulated" || name == "normalized") return score_metric();
    if (name == "prefill_out" || name == "decode_out") return attention_metric();
    return {};
}

}  // namespace vlsparse::golden
