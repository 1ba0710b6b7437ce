// vlsparse/reference/purekv_golden.hpp -- the PureKV golden cases: inputs, how the outputs are computed
// (by either estimator, reference::PureKVEstimator or simd::PureKVEstimator), and each output's metric.
// Shared by the generator (reference/golden_purekv.cpp) and the tests (tests/purekv_test.cpp).
//
// Case folder golden/purekv/<case>/: manifest.json (params = PureKVParams JSON, layout spec) and,
// depending on the case:
//   inputs:  q [L, n, H, d], k, v [L, n, H_kv, d] (fp32, fp16 or bf16): L layers of one prefill;
//            x, y [m] fp64 (a Spearman case)
//   outputs: masks [5, n, n] uint8 and allowed_pairs [5] int64: the video masks (spatial, temporal,
//            spatial_temporal, local_window, atrous; the case's st_window / st_dilation) with the
//            Dense template, 1 = query row may attend key column (always);
//            with q/k/v, layer by layer through the estimator (observe for layers <= l0, attention,
//            select):  scores_l0 [G, n] fp64 (Eq. 2 at l0), v_norm [L, G, n] fp64,
//            importance [L, G, n] fp64 (Eq. 3/4; 0 in the window and in dense layers),
//            kept_mask [L, G, n] uint8, prefill_out [L, n, H, d] fp32 (ST-masked from
//            st_start_layer), validation_rho, validation_p [L - l0 - 1, G] fp64 (Eq. 5-7 for
//            the layers above l0);
//            with x/y: spearman [2] fp64 (rho, two-sided p).
// G = H_kv (kv_head grouping) or 1 (layer grouping). Needs nlohmann/json.
// Include: <vlsparse/reference/purekv_golden.hpp>
#pragma once

#include <filesystem>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "vlsparse/io/golden.hpp"
#include "vlsparse/io/purekv_json.hpp"
#include "vlsparse/masks/flops.hpp"
#include "vlsparse/masks/templates.hpp"
#include "vlsparse/policies/purekv_select.hpp"
#include "vlsparse/reference/golden_case.hpp"

namespace vlsparse::golden {

struct PureKVCaseInputs {
    Layout layout;
    PureKVParams params;
    std::string dtype = "fp32";          // of q, k, v
    ModelShape shape;                    // layers == 0: no attention part in this case
    std::vector<float> q, k, v;          // [L, n, H, d] / [L, n, H_kv, d], exactly representable in dtype
    std::vector<double> x, y;            // Spearman inputs (empty: none)
};

using PureKVOutput = NamedArray;  // one named output tensor (golden_case.hpp)

// metric, tolerances of each output (what a port must meet; golden_case.hpp, OutputMetric).
inline OutputMetric purekv_output_metric(const std::string& name) {
    if (name == "scores_l0" || name == "v_norm" || name == "importance") return score_metric();
    if (name == "validation_rho" || name == "validation_p") return {"rel", 1e-9, {}};
    if (name == "spearman") return {"rel", 1e-12, {}};
    if (name == "prefill_out") return attention_metric();
    return {};  // masks, allowed_pairs, kept_mask
}

// Runs a case through an estimator type (reference::PureKVEstimator or simd::PureKVEstimator).
template <class Estimator>
std::vector<PureKVOutput> run_purekv_case(const PureKVCaseInputs& c) {
    std::vector<PureKVOutput> out;
    const std::int64_t n = c.layout.n();
    {
        std::vector<std::uint8_t> masks;
        std::vector<std::int64_t> pairs;
        for (VideoMask kind : kVideoMasks) {
            const MaskContext ctx = make_video_mask_context(c.layout, {kind, c.params.st.window, c.params.st.dilation});
            const auto m = expand_mask(ctx, MaskTemplate::dense);
            masks.insert(masks.end(), m.begin(), m.end());
            pairs.push_back(count_allowed_pairs(ctx, MaskTemplate::dense));
        }
        const auto K = static_cast<std::int64_t>(std::size(kVideoMasks));
        out.push_back({"masks", NpyArray::from(masks.data(), {K, n, n})});
        out.push_back({"allowed_pairs", NpyArray::from(pairs.data(), {K})});
    }
    if (c.shape.layers > 0) {
        auto run = [&](auto tag) {
            using T = decltype(tag);
            const auto q = detail::narrow<T>(c.q), k = detail::narrow<T>(c.k), v = detail::narrow<T>(c.v);
            const std::int64_t L = c.shape.layers, H = c.shape.heads, Hkv = c.shape.kv_heads, d = c.shape.head_dim;
            const std::int64_t G = c.params.grouping == PureKVGrouping::kv_head ? Hkv : 1;
            const std::int64_t l0 = c.params.l0;
            auto qv = [&](std::int64_t l) { return View3<const T>(q.data() + l * n * H * d, {n, H, d}); };
            auto kv = [&](std::int64_t l) { return View3<const T>(k.data() + l * n * Hkv * d, {n, Hkv, d}); };
            auto vv = [&](std::int64_t l) { return View3<const T>(v.data() + l * n * Hkv * d, {n, Hkv, d}); };
            Estimator est(c.params, c.layout, c.shape);
            std::vector<double> vnorm(static_cast<std::size_t>(L * G * n), 0.0), imp(vnorm.size(), 0.0);
            std::vector<std::uint8_t> kept(vnorm.size(), 0);
            std::vector<float> o(static_cast<std::size_t>(L * n * H * d));
            std::vector<double> rho, p;
            for (std::int64_t l = 0; l < L; ++l) {
                if (est.needs_scores(l)) est.observe(l, qv(l), kv(l));
                est.attention(l, qv(l), kv(l), vv(l), View3<float>(o.data() + l * n * H * d, {n, H, d}));
                const PureKVSelection s = est.select(l, vv(l));
                for (std::int64_t g = 0; g < G; ++g) {
                    const std::size_t base = static_cast<std::size_t>((l * G + g) * n);
                    for (auto j : s.selection.for_kv_head(g)) kept[base + static_cast<std::size_t>(j)] = 1;
                    if (s.dense) continue;
                    for (std::int64_t j = 0; j < n; ++j) {
                        vnorm[base + static_cast<std::size_t>(j)] = s.v_norm[static_cast<std::size_t>(g)][static_cast<std::size_t>(j)];
                        imp[base + static_cast<std::size_t>(j)] = s.importance[static_cast<std::size_t>(g)][static_cast<std::size_t>(j)];
                    }
                }
                if (l > l0) {
                    const PureKVLayerValidation val = est.validate(l, qv(l), kv(l), vv(l));
                    for (const auto& r : val.groups) {
                        rho.push_back(r.rho);
                        p.push_back(r.p_value);
                    }
                }
            }
            std::vector<double> s0;
            for (const auto& row : est.scores(l0).s) s0.insert(s0.end(), row.begin(), row.end());
            out.push_back({"scores_l0", NpyArray::from(s0.data(), {G, n})});
            out.push_back({"v_norm", NpyArray::from(vnorm.data(), {L, G, n})});
            out.push_back({"importance", NpyArray::from(imp.data(), {L, G, n})});
            out.push_back({"kept_mask", NpyArray::from(kept.data(), {L, G, n})});
            out.push_back({"prefill_out", NpyArray::from(o.data(), {L, n, H, d})});
            if (L - l0 - 1 > 0) {
                out.push_back({"validation_rho", NpyArray::from(rho.data(), {L - l0 - 1, G})});
                out.push_back({"validation_p", NpyArray::from(p.data(), {L - l0 - 1, G})});
            }
        };
        if (c.dtype == "bf16") run(bfloat16{});
        else if (c.dtype == "fp16") run(half{});
        else run(float{});
    }
    if (!c.x.empty()) {
        const SpearmanResult r = spearman(c.x, c.y);
        const double v[2] = {r.rho, r.p_value};
        out.push_back({"spearman", NpyArray::from(v, {2})});
    }
    return out;
}

// Reads a case's inputs (and its manifest into *m_out when given).
inline PureKVCaseInputs read_purekv_inputs(const std::filesystem::path& dir, GoldenManifest* m_out = nullptr) {
    constexpr const char* fn = "read_purekv_inputs";
    const GoldenManifest m = detail::read_case_manifest(dir, "purekv", fn);
    PureKVCaseInputs c;
    c.layout = Layout::parse(m.layout);
    c.params = purekv_params_from_json(m.params, "params.");
    for (const auto& t : m.inputs) {
        if (t.name == "x") c.x = read_tensor(dir, t).to_vector<double>();
        else if (t.name == "y") c.y = read_tensor(dir, t).to_vector<double>();
        else if (t.name == "q" || t.name == "k" || t.name == "v") {
            std::vector<float> x = read_tensor_f32(dir, t);
            ::vlsparse::detail::require(t.shape.size() == 4, fn, dir.string(), ": ", t.name, " must have rank 4 [L, n, heads, d]");
            c.dtype = t.dtype;
            c.shape.layers = t.shape[0];
            c.shape.head_dim = t.shape[3];
            if (t.name == "q") {
                c.q = std::move(x);
                c.shape.heads = t.shape[2];
            } else if (t.name == "k") {
                c.k = std::move(x);
                c.shape.kv_heads = t.shape[2];
            } else {
                c.v = std::move(x);
            }
        } else {
            read_tensor(dir, t);  // an input this reader does not use is still checked against the manifest
        }
    }
    if (m_out) *m_out = m;
    return c;
}

}  // namespace vlsparse::golden
