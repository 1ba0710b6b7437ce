// vlsparse/reference/avl_golden.hpp -- the A-VL golden cases: the case runner used by the generator
// (reference/golden_avl.cpp) and by the tests, and the metric of each output. Params: to_json and
// avl_params_from_json of <vlsparse/io/avl_json.hpp>.
//
// Case folder golden/avl/<case>/ (see docs/avl.md):
//   inputs   q [n,H,d], k, v [n,H_kv,d] (dtype of the case), decode_q [S,H,d], decode_k, decode_v [S,H_kv,d]
//   outputs  scores [n] (rel)               last-token head-mean score of every prompt token
//            kept_mask [G,n] (exact)        positions kept after prefill (G = 1, or H_kv with the text budget)
//            core_mask [S,n] (exact)        core image positions in effect at each decode step
//            read_mask [S,G,n+S] (exact)    positions each step read (the index lists, as positions)
//            refresh [S] (exact)            1 on refresh steps
//            refresh_scores [S,n] (rel)     head-mean attention of the kept image tokens on refresh steps
//            decode_out [S,H,d] (nmse)      the attention outputs
// Needs nlohmann/json. Include: <vlsparse/reference/avl_golden.hpp>
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "vlsparse/io/avl_json.hpp"
#include "vlsparse/io/golden.hpp"
#include "vlsparse/kv/kv_cache.hpp"
#include "vlsparse/policies/avl_select.hpp"
#include "vlsparse/policies/avl_schedule.hpp"
#include "vlsparse/reference/golden_case.hpp"

namespace vlsparse {

namespace golden {

// The inputs of one A-VL golden case: those of every prefill + decode case and the Params.
struct AvlCaseInputs : DecodeCaseInputs {
    AvlParams params;
};

inline AvlCaseInputs read_avl_inputs(const std::filesystem::path& dir, GoldenManifest* manifest = nullptr) {
    constexpr const char* fn = "read_avl_inputs";
    const GoldenManifest m = detail::read_case_manifest(dir, "avl", fn);
    AvlCaseInputs c;
    c.params = avl_params_from_json(m.params, "params.");
    c.layout = Layout::parse(m.layout);
    detail::read_decode_case_inputs(dir, m, c, fn);
    if (manifest) *manifest = m;
    return c;
}

// What a run produced besides the named outputs: the decision margins (for the generator's check).
struct AvlRunInfo {
    double margin = 1.0;  // smallest relative gap at a top-k cutoff (an exact tie counts as 0)
};

namespace detail {


template <class Backend, ElementType T>
std::vector<NamedArray> run_avl_typed(const AvlCaseInputs& c, AvlRunInfo* info) {
    const auto q = narrow<T>(c.q), k = narrow<T>(c.k), v = narrow<T>(c.v);
    const auto dq = narrow<T>(c.dq), dk = narrow<T>(c.dk), dv = narrow<T>(c.dv);
    const std::int64_t n = c.n, H = c.H, Hkv = c.Hkv, d = c.d, S = c.steps;
    const AvlParams& P = c.params;
    const View3<const T> qv(q.data(), {n, H, d}), kv(k.data(), {n, Hkv, d}), vv(v.data(), {n, Hkv, d});
    const std::vector<double> scores = Backend::scores(qv, kv);
    std::vector<std::vector<std::int64_t>> text;
    double margin = 1.0;
    if (P.text_rate > 0.0) {
        const auto acc = Backend::h2o(qv, kv, P.text_groups);
        const std::int64_t group = P.text_groups == AvlTextGroups::per_kv_head ? 1 : H / Hkv;
        text = avl_text_h2o(acc, c.layout, P, group);
        // Margin of the heavy-hitter cut among the non-recent text tokens (as in avl_text_h2o).
        std::vector<std::int64_t> tx;
        const auto spans = avl_spans(c.layout, P.spans);
        for (std::int64_t p = 0; p < n; ++p)
            if (!::vlsparse::detail::in_spans(spans, p)) tx.push_back(p);
        const auto seen = static_cast<std::int64_t>(tx.size());
        const AvlTextBudget tb = avl_text_budget(seen, P);
        const std::int64_t heavy = tb.heavy;
        for (const auto& a : acc) {
            std::vector<double> s;
            for (std::int64_t i = 0; i < seen - tb.recent; ++i) s.push_back(a[static_cast<std::size_t>(tx[static_cast<std::size_t>(i)])]);
            margin = std::min(margin, cut_margin(s, heavy));
        }
    }
    const AvlSelection sel = avl_select(scores, c.layout, P, {}, text);
    for (std::size_t i = 0; i < sel.spans.size(); ++i) {
        const auto& sp = sel.spans[i];
        std::vector<double> s(scores.begin() + sp.start, scores.begin() + sp.end());
        margin = std::min(margin, cut_margin(s, avl_budget(sp.length, P.rate)));
        margin = std::min(margin, cut_margin(s, sel.core_budget[i]));
    }
    KvCache<T> cache(Hkv, d);
    cache.assign(kv, vv);
    cache.keep(sel.kept);
    DecodeSchedule sch(sel, P);
    const auto G = static_cast<std::int64_t>(sel.kept.groups());
    std::vector<std::uint8_t> kept_mask(static_cast<std::size_t>(G * n), 0), core_mask(static_cast<std::size_t>(S * n), 0),
        read_mask(static_cast<std::size_t>(S * G * (n + S)), 0), refresh(static_cast<std::size_t>(S), 0);
    std::vector<double> refresh_scores(static_cast<std::size_t>(S * n), 0.0);
    for (std::int64_t g = 0; g < G; ++g)
        for (auto p : sel.kept.indices[static_cast<std::size_t>(g)]) kept_mask[static_cast<std::size_t>(g * n + p)] = 1;
    std::vector<float> out(static_cast<std::size_t>(S * H * d));
    for (std::int64_t t = 0; t < S; ++t) {
        cache.append(View2<const T>(dk.data() + t * Hkv * d, {Hkv, d}), View2<const T>(dv.data() + t * Hkv * d, {Hkv, d}));
        const AvlStep st = Backend::decode_step(View2<const T>(dq.data() + t * H * d, {H, d}), cache, sch, t,
                                                View2<float>(out.data() + t * H * d, {H, d}));
        for (auto p : sch.core()) core_mask[static_cast<std::size_t>(t * n + p)] = 1;
        for (std::int64_t g = 0; g < G; ++g)
            for (auto p : st.read.indices[static_cast<std::size_t>(g)])
                read_mask[static_cast<std::size_t>((t * G + g) * (n + S) + p)] = 1;
        refresh[static_cast<std::size_t>(t)] = st.refresh ? 1 : 0;
        if (st.refresh) {
            std::size_t off = 0;
            for (std::size_t i = 0; i < sel.spans.size(); ++i) {
                std::vector<double> s;
                for (std::size_t j = 0; j < sel.kept_image[i].size(); ++j) {
                    const auto& ps = sch.last_refresh_scores()[off + j];
                    refresh_scores[static_cast<std::size_t>(t * n + ps.first)] = ps.second;
                    s.push_back(ps.second);
                }
                off += sel.kept_image[i].size();
                margin = std::min(margin, cut_margin(s, sel.core_budget[i]));
            }
        }
    }
    if (info) info->margin = margin;
    std::vector<NamedArray> r;
    r.push_back({"scores", NpyArray::from(scores.data(), {n})});
    r.push_back({"kept_mask", NpyArray::from(kept_mask.data(), {G, n})});
    r.push_back({"core_mask", NpyArray::from(core_mask.data(), {S, n})});
    r.push_back({"read_mask", NpyArray::from(read_mask.data(), {S, G, n + S})});
    r.push_back({"refresh", NpyArray::from(refresh.data(), {S})});
    r.push_back({"refresh_scores", NpyArray::from(refresh_scores.data(), {S, n})});
    r.push_back({"decode_out", NpyArray::from(out.data(), {S, H, d})});
    return r;
}

}  // namespace detail

// Runs a case through a backend: a type with static scores / h2o / decode_step functions that
// forward to reference:: or simd::. Returns every output by name.
template <class Backend>
std::vector<NamedArray> run_avl_case(const AvlCaseInputs& c, AvlRunInfo* info = nullptr) {
    if (c.dtype == "fp32") return detail::run_avl_typed<Backend, float>(c, info);
    if (c.dtype == "fp16") return detail::run_avl_typed<Backend, half>(c, info);
    if (c.dtype == "bf16") return detail::run_avl_typed<Backend, bfloat16>(c, info);
    throw error("run_avl_case", "input dtype '" + c.dtype + "', expected fp32, fp16 or bf16");
}

inline OutputMetric avl_output_metric(const std::string& name) {
    if (name == "scores" || name == "refresh_scores") return score_metric();
    if (name == "decode_out") return attention_metric();
    return {};
}

}  // namespace golden
}  // namespace vlsparse
