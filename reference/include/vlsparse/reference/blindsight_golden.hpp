// vlsparse/reference/blindsight_golden.hpp -- one BlindSight golden case: its inputs, how its outputs
// are computed (by any backend), and each output's metric. Shared by the generator
// (reference/golden_blindsight.cpp) and the tests (tests/blindsight_test.cpp), so both run the same steps.
//
// Case folder golden/blindsight/<case>/: manifest.json (params = BlindSightParams JSON, layout spec)
// and, depending on the case:
//   inputs:  q [n, H, d], k, v [n, H_kv, d] (fp32 or bf16), heads [H] int64 (template codes),
//            counts [L*H, 4] int64 (aggregation tallies)
//   outputs: masks [4, n, n] uint8, allowed_pairs [4] int64, flops_paper [4] fp64,
//            flops_exact [4] fp64 (always); masked_out [n, H, d] fp32 (with q/k/v and heads);
//            nmse [H, 4] fp64 and chosen [H] int64 (with q/k/v); aggregated [L*H] int64 (with counts).
// Template codes and the [4] axis: 0 Dense, 1 Sink, 2 Document, 3 Document-Sink.
// Include: <vlsparse/reference/blindsight_golden.hpp> (needs nlohmann/json).
#pragma once

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "vlsparse/core/tensor.hpp"
#include "vlsparse/io/blindsight_json.hpp"
#include "vlsparse/io/golden.hpp"
#include "vlsparse/masks/flops.hpp"
#include "vlsparse/masks/templates.hpp"
#include "vlsparse/policies/blindsight_select.hpp"
#include "vlsparse/reference/golden_case.hpp"

namespace vlsparse::golden {

struct BlindSightCaseInputs {
    Layout layout;
    BlindSightParams params;
    std::string dtype = "fp32";  // of q, k, v
    std::int64_t H = 0, Hkv = 0, d = 0;  // 0: no attention in this case
    std::vector<float> q, k, v;          // values exactly representable in dtype
    std::vector<std::int64_t> heads;     // [H] template codes for masked_out
    std::vector<std::int64_t> counts;    // [L*H, 4] tallies for aggregation (empty: none)
};

struct BlindSightOutput {
    std::string name;
    NpyArray array;
};

// metric, tolerances of each output (what a port must meet; golden_case.hpp, OutputMetric).
inline OutputMetric blindsight_output_metric(const std::string& name) {
    if (name == "masked_out") return attention_metric();
    if (name == "nmse") return score_metric();  // Algorithm 1's NMSE values, rel like scores
    if (name == "flops_paper" || name == "flops_exact") return {"rel", 1e-12, {}};
    return {};
}

namespace detail {
template <class T>
std::vector<T> narrow_to(const std::vector<float>& x) {
    std::vector<T> y;
    y.reserve(x.size());
    for (float f : x) y.push_back(from_float<T>(f));
    return y;
}
}  // namespace detail

// Backend: static void masked(View3<const T> q, k, v, const MaskContext&, std::span<const MaskTemplate>, View3<float>)
//          static std::vector<HeadCharacterization> characterize(View3<const T> q, k, v, const Layout&, const BlindSightParams&)
template <class Backend>
std::vector<BlindSightOutput> run_blindsight_case(const BlindSightCaseInputs& c) {
    std::vector<BlindSightOutput> out;
    const MaskContext ctx = make_mask_context(c.layout, c.params.mask);
    const std::int64_t n = ctx.n;
    {
        std::vector<std::uint8_t> masks;
        std::vector<std::int64_t> pairs;
        std::vector<double> fe;
        const auto exact = flops_reduction_exact(ctx);
        for (MaskTemplate t : kAllTemplates) {
            const auto m = expand_mask(ctx, t);
            masks.insert(masks.end(), m.begin(), m.end());
            pairs.push_back(count_allowed_pairs(ctx, t));
            fe.push_back(exact[t]);
        }
        out.push_back({"masks", NpyArray::from(masks.data(), {4, n, n})});
        out.push_back({"allowed_pairs", NpyArray::from(pairs.data(), {4})});
        const auto paper = flops_reduction_paper(c.layout);
        out.push_back({"flops_paper", NpyArray::from(paper.v.data(), {4})});
        out.push_back({"flops_exact", NpyArray::from(fe.data(), {4})});
    }
    if (c.H > 0) {
        auto run = [&](auto tag) {
            using T = decltype(tag);
            const auto q = detail::narrow_to<T>(c.q), k = detail::narrow_to<T>(c.k), v = detail::narrow_to<T>(c.v);
            const View3<const T> qv(q.data(), {n, c.H, c.d}), kv(k.data(), {n, c.Hkv, c.d}), vv(v.data(), {n, c.Hkv, c.d});
            if (!c.heads.empty()) {
                std::vector<MaskTemplate> heads;
                for (auto h : c.heads) heads.push_back(static_cast<MaskTemplate>(h));
                std::vector<float> o(static_cast<std::size_t>(n * c.H * c.d));
                Backend::masked(qv, kv, vv, ctx, heads, View3<float>(o.data(), {n, c.H, c.d}));
                out.push_back({"masked_out", NpyArray::from(o.data(), {n, c.H, c.d})});
            }
            const auto r = Backend::characterize(qv, kv, vv, c.layout, c.params);
            std::vector<double> nm;
            std::vector<std::int64_t> chosen;
            for (const auto& h : r) {
                nm.insert(nm.end(), h.nmse.begin(), h.nmse.end());
                chosen.push_back(static_cast<std::int64_t>(h.chosen));
            }
            out.push_back({"nmse", NpyArray::from(nm.data(), {c.H, 4})});
            out.push_back({"chosen", NpyArray::from(chosen.data(), {c.H})});
        };
        if (c.dtype == "bf16") run(bfloat16{});
        else run(float{});
    }
    if (!c.counts.empty()) {
        std::vector<TemplateCounts> tc(c.counts.size() / 4);
        for (std::size_t i = 0; i < tc.size(); ++i)
            for (std::size_t t = 0; t < 4; ++t) tc[i].count[t] = c.counts[i * 4 + t];
        std::vector<std::int64_t> agg;
        for (auto t : aggregate(tc, c.params)) agg.push_back(static_cast<std::int64_t>(t));
        out.push_back({"aggregated", NpyArray::from(agg.data(), {static_cast<std::int64_t>(agg.size())})});
    }
    return out;
}

// Reads a case's inputs (and its manifest into *m when given).
inline BlindSightCaseInputs read_blindsight_inputs(const std::filesystem::path& dir, GoldenManifest* m_out = nullptr) {
    const GoldenManifest m = read_manifest(dir);
    BlindSightCaseInputs c;
    c.layout = Layout::parse(m.layout);
    c.params = blindsight_params_from_json(m.params, "params.");
    for (const auto& t : m.inputs) {
        const NpyArray a = read_tensor(dir, t);
        if (t.name == "heads") c.heads = a.to_vector<std::int64_t>();
        else if (t.name == "counts") c.counts = a.to_vector<std::int64_t>();
        else if (t.name == "q" || t.name == "k" || t.name == "v") {
            std::vector<float> x(static_cast<std::size_t>(a.numel()));
            for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(a.at_double(i, U2As::bfloat16));
            c.dtype = t.dtype;
            if (t.name == "q") {
                c.q = x;
                c.H = t.shape[1];
                c.d = t.shape[2];
            } else if (t.name == "k") {
                c.k = x;
                c.Hkv = t.shape[1];
            } else {
                c.v = x;
            }
        }
    }
    if (m_out) *m_out = m;
    return c;
}

}  // namespace vlsparse::golden
