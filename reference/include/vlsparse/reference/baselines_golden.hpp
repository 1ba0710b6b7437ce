// vlsparse/reference/baselines_golden.hpp -- the baselines' golden cases: the case runner used by the
// generator (reference/golden_baselines.cpp) and by the tests, and the metric of each output. Case
// folder golden/baselines/<case>/ (see docs/baselines.md):
//   params   to_json of the baseline's Params (<vlsparse/io/baselines_json.hpp>), whose "baseline" key
//            names it: "h2o" | "snapkv" | "streamingllm" | "fastv" | "random" | "fixed_ratio"
//   h2o          inputs q [n,H,d], k, v [n,H_kv,d], decode_q [S,H,d], decode_k, decode_v [S,H_kv,d]
//                outputs scores [G,n] (rel), kept_mask [G,n], decode_kept_mask [S,G,n+S] (exact: positions
//                held after step t's eviction), decode_scores [G,n+S] (rel: accumulated after the last
//                step), decode_out [S,H,d] (nmse)
//   snapkv       inputs q, k; outputs window_scores [G,n-w], pooled [G,n-w] (rel), kept_mask [G,n]
//   fastv        inputs q, k; outputs scores [n] (rel), sequence_mask [n] (exact)
//   streamingllm inputs steps [1]; outputs kept_mask [n], decode_kept_mask [S,n+S] (exact)
//   random       inputs layer [1]; outputs kept_mask [n] (exact)
//   fixed_ratio  outputs kept_mask [n] (exact)
// Needs nlohmann/json. Include: <vlsparse/reference/baselines_golden.hpp>
#pragma once

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "vlsparse/attention/cache_rows.hpp"
#include "vlsparse/io/baselines_json.hpp"
#include "vlsparse/io/golden.hpp"
#include "vlsparse/kv/kv_cache.hpp"
#include "vlsparse/policies/baselines_select.hpp"
#include "vlsparse/reference/zipvl_golden.hpp"

namespace vlsparse {

namespace golden {

struct BaselineCaseInputs {
    std::string baseline;  // h2o | snapkv | streamingllm | fastv | random | fixed_ratio
    std::string dtype = "fp32";
    std::int64_t n = 0, H = 0, Hkv = 0, d = 0, steps = 0, layer = 0;
    Layout layout;
    nlohmann::json params = nlohmann::json::object();  // as in the manifest (with "baseline")
    std::vector<float> q, k, v, dq, dk, dv;             // values exactly representable in `dtype` (when used)
};

inline BaselineCaseInputs read_baselines_inputs(const std::filesystem::path& dir, GoldenManifest* manifest = nullptr) {
    constexpr const char* fn = "read_baselines_inputs";
    const GoldenManifest m = read_manifest(dir);
    ::vlsparse::detail::require(m.algorithm == "baselines", fn, dir.string(), ": algorithm '", m.algorithm,
                                "', expected 'baselines'");
    ::vlsparse::detail::require(m.params.contains("baseline") && m.params["baseline"].is_string(), fn, dir.string(),
                                ": params.baseline is missing, expected the baseline's name");
    BaselineCaseInputs c;
    c.baseline = m.params["baseline"].get<std::string>();
    c.params = m.params;
    c.layout = Layout::parse(m.layout);
    c.n = c.layout.n();
    auto has = [&](const char* name) {
        return std::any_of(m.inputs.begin(), m.inputs.end(), [&](const GoldenTensor& t) { return t.name == name; });
    };
    auto load = [&](const char* name) { return read_tensor_f32(dir, m.input(name)); };
    if (has("q")) {
        const auto& tq = m.input("q");
        const auto& tk = m.input("k");
        ::vlsparse::detail::require(tq.shape.size() == 3 && tk.shape.size() == 3 && tq.shape[0] == c.n, fn, dir.string(),
                                    ": q and k must be [n, H, d] with n the layout's ", c.n);
        c.dtype = tq.dtype;
        c.H = tq.shape[1];
        c.d = tq.shape[2];
        c.Hkv = tk.shape[1];
        c.q = load("q");
        c.k = load("k");
    }
    if (has("v")) c.v = load("v");
    if (has("decode_q")) {
        c.dq = load("decode_q");
        c.dk = load("decode_k");
        c.dv = load("decode_v");
        c.steps = m.input("decode_q").shape.at(0);
    }
    if (has("steps")) c.steps = read_tensor(dir, m.input("steps")).to_vector<std::int64_t>().at(0);
    if (has("layer")) c.layer = read_tensor(dir, m.input("layer")).to_vector<std::int64_t>().at(0);
    if (manifest) *manifest = m;
    return c;
}

// The decision margins of a run (for the generator's check).
struct BaselineRunInfo {
    double margin = 1.0;  // smallest relative gap at a top-k cutoff (an exact tie counts as 0)
};

namespace detail {


inline std::vector<std::uint8_t> mask_of(const TokenSelection& s, std::int64_t width) {
    std::vector<std::uint8_t> m(s.groups() * static_cast<std::size_t>(width), 0);
    for (std::size_t g = 0; g < s.groups(); ++g)
        for (auto p : s.indices[g]) m[g * static_cast<std::size_t>(width) + static_cast<std::size_t>(p)] = 1;
    return m;
}

inline std::vector<double> flatten(const std::vector<std::vector<double>>& x) {
    std::vector<double> r;
    for (const auto& v : x) r.insert(r.end(), v.begin(), v.end());
    return r;
}

// H2O: prefill selection, then S decode steps: append, attend over every cached row, add the step's
// attention (summed over each group's query heads) to the accumulated scores, evict to heavy + recent.
template <class Backend, ElementType T>
std::vector<NamedArray> run_h2o(const BaselineCaseInputs& c, double& margin) {
    const H2OParams P = h2o_params_from_json(c.params, "params.");
    const auto q = narrow<T>(c.q), k = narrow<T>(c.k), v = narrow<T>(c.v);
    const auto dq = narrow<T>(c.dq), dk = narrow<T>(c.dk), dv = narrow<T>(c.dv);
    const std::int64_t n = c.n, H = c.H, Hkv = c.Hkv, d = c.d, S = c.steps, W = n + S;
    const View3<const T> qv(q.data(), {n, H, d}), kv(k.data(), {n, Hkv, d}), vv(v.data(), {n, Hkv, d});
    auto acc = Backend::h2o_scores(qv, kv, P.groups);
    const auto G = static_cast<std::int64_t>(acc.size());
    const std::int64_t heavy = P.heavy.resolve(n), recent = std::min(P.recent.resolve(n), n);
    const TokenSelection sel = h2o_select_from_scores(acc, P);
    std::vector<NamedArray> r;
    r.push_back({"scores", NpyArray::from(flatten(acc), {G, n})});
    r.push_back({"kept_mask", NpyArray::from(mask_of(sel, n), {G, n})});
    auto cut = [&](std::span<const std::int64_t> cached, const std::vector<double>& a) {
        const auto m = static_cast<std::int64_t>(cached.size());
        if (heavy + recent >= m) return;
        std::vector<double> s;
        for (std::int64_t i = 0; i < m - recent; ++i) s.push_back(a[static_cast<std::size_t>(cached[static_cast<std::size_t>(i)])]);
        margin = std::min(margin, cut_margin(s, heavy));
    };
    {
        std::vector<std::int64_t> all(static_cast<std::size_t>(n));
        std::iota(all.begin(), all.end(), std::int64_t{0});
        for (const auto& a : acc) cut(all, a);
    }
    for (auto& a : acc) a.resize(static_cast<std::size_t>(W), 0.0);
    KvCache<T> cache(Hkv, d);
    cache.assign(kv, vv);
    cache.keep(sel);
    std::vector<std::uint8_t> kept(static_cast<std::size_t>(S * G * W), 0);
    std::vector<float> out(static_cast<std::size_t>(S * H * d));
    for (std::int64_t t = 0; t < S; ++t) {
        cache.append(View2<const T>(dk.data() + t * Hkv * d, {Hkv, d}), View2<const T>(dv.data() + t * Hkv * d, {Hkv, d}));
        CacheRows rows;
        for (std::int64_t g = 0; g < Hkv; ++g) rows.push_all(cache.rows(g));
        const auto L = static_cast<std::size_t>(rows.longest());
        const auto probs = Backend::decode(View2<const T>(dq.data() + t * H * d, {H, d}), cache, rows,
                                           View2<float>(out.data() + t * H * d, {H, d}), rows.longest());
        for (std::int64_t h = 0; h < H; ++h) {
            const std::int64_t g = h / (H / Hkv);
            auto& a = acc[static_cast<std::size_t>(G == 1 ? 0 : g)];
            const auto pos = cache.positions(g);
            for (std::size_t i = 0; i < pos.size(); ++i)
                a[static_cast<std::size_t>(pos[i])] += probs[static_cast<std::size_t>(h) * L + i];
        }
        TokenSelection keep;
        keep.n = cache.seq_len();
        bool evict = false;
        for (std::int64_t g = 0; g < (G == 1 ? 1 : Hkv); ++g) {
            const auto pos = cache.positions(g);
            const auto& a = acc[static_cast<std::size_t>(G == 1 ? 0 : g)];
            if (P.evict_during_decode) cut(pos, a);
            evict |= static_cast<std::int64_t>(pos.size()) > heavy + recent;
            keep.indices.push_back(h2o_keep(pos, heavy, recent, [&](std::int64_t p) { return a[static_cast<std::size_t>(p)]; }));
        }
        if (P.evict_during_decode && evict) cache.keep(keep);
        for (std::int64_t g = 0; g < G; ++g)
            for (auto p : cache.positions(G == 1 ? 0 : g)) kept[static_cast<std::size_t>((t * G + g) * W + p)] = 1;
    }
    r.push_back({"decode_kept_mask", NpyArray::from(kept, {S, G, W})});
    r.push_back({"decode_scores", NpyArray::from(flatten(acc), {G, W})});
    r.push_back({"decode_out", NpyArray::from(out, {S, H, d})});
    return r;
}

template <class Backend, ElementType T>
std::vector<NamedArray> run_snapkv(const BaselineCaseInputs& c, double& margin) {
    const SnapKVParams P = snapkv_params_from_json(c.params, "params.");
    const auto q = narrow<T>(c.q), k = narrow<T>(c.k);
    const std::int64_t n = c.n;
    const View3<const T> qv(q.data(), {n, c.H, c.d}), kv(k.data(), {n, c.Hkv, c.d});
    const auto raw = Backend::snapkv_window_scores(qv, kv, P.window, P.groups);
    std::vector<std::vector<double>> pooled;
    for (const auto& s : raw) pooled.push_back(Backend::snapkv_pool(s, P.kernel, P.pooling));
    const auto G = static_cast<std::int64_t>(raw.size()), L = n - P.window;
    const std::int64_t C = P.capacity.resolve(n);
    if (C < n)
        for (const auto& s : pooled) margin = std::min(margin, cut_margin(s, C - P.window));
    std::vector<NamedArray> r;
    r.push_back({"window_scores", NpyArray::from(flatten(raw), {G, L})});
    r.push_back({"pooled", NpyArray::from(flatten(pooled), {G, L})});
    const TokenSelection sel = snapkv_select_from_pooled(pooled, n, P);
    r.push_back({"kept_mask", NpyArray::from(mask_of(sel, n), {G, n})});
    return r;
}

template <class Backend, ElementType T>
std::vector<NamedArray> run_fastv(const BaselineCaseInputs& c, double& margin) {
    const FastVParams P = fastv_params_from_json(c.params, "params.");
    const auto q = narrow<T>(c.q), k = narrow<T>(c.k);
    const std::int64_t n = c.n;
    const auto s = Backend::fastv_scores(View3<const T>(q.data(), {n, c.H, c.d}), View3<const T>(k.data(), {n, c.Hkv, c.d}));
    auto cut_in = [&](std::int64_t a, std::int64_t b, std::int64_t k) {
        std::vector<double> x;
        for (const auto& seg : c.layout.segments())
            if (seg.is_visual())
                for (std::int64_t p = std::max(a, seg.start); p < std::min(b, seg.end()); ++p) x.push_back(s[static_cast<std::size_t>(p)]);
        margin = std::min(margin, cut_margin(x, k));
    };
    if (P.spans == FastVSpans::joint) {
        cut_in(0, n, TokenBudget::ratio(1.0 - P.rate).resolve(c.layout.count(SegmentKind::image) + c.layout.count(SegmentKind::video)));
    } else {
        for (const auto& seg : c.layout.segments())
            if (seg.is_visual()) cut_in(seg.start, seg.end(), TokenBudget::ratio(1.0 - P.rate).resolve(seg.length));
    }
    const TokenSelection sel = fastv_select_from_scores(s, c.layout, P);
    std::vector<NamedArray> r;
    r.push_back({"scores", NpyArray::from(s, {n})});
    r.push_back({"sequence_mask", NpyArray::from(mask_of(sel, n), {n})});
    return r;
}

inline std::vector<NamedArray> run_streamingllm(const BaselineCaseInputs& c) {
    const StreamingLLMParams P = streamingllm_params_from_json(c.params, "params.");
    const std::int64_t n = c.n, S = c.steps, W = n + S;
    const TokenSelection sel = streamingllm_select(n, P);
    const std::int64_t recent = std::min(P.recent.resolve(n), n);
    std::vector<std::int64_t> cached = sel.indices[0];
    std::vector<std::uint8_t> kept(static_cast<std::size_t>(S * W), 0);
    for (std::int64_t t = 0; t < S; ++t) {
        cached.push_back(n + t);
        if (P.evict_during_decode) cached = streamingllm_keep(cached, P.sinks, std::min<std::int64_t>(recent, static_cast<std::int64_t>(cached.size())));
        for (auto p : cached) kept[static_cast<std::size_t>(t * W + p)] = 1;
    }
    return {{"kept_mask", NpyArray::from(mask_of(sel, n), {n})}, {"decode_kept_mask", NpyArray::from(kept, {S, W})}};
}

template <class Backend, ElementType T>
std::vector<NamedArray> run_baselines_typed(const BaselineCaseInputs& c, double& margin) {
    if (c.baseline == "h2o") return run_h2o<Backend, T>(c, margin);
    if (c.baseline == "snapkv") return run_snapkv<Backend, T>(c, margin);
    if (c.baseline == "fastv") return run_fastv<Backend, T>(c, margin);
    throw error("run_baselines_case", "baseline '" + c.baseline + "' has no attention inputs");
}

}  // namespace detail

// Runs a case through a backend: a type with static h2o_scores / snapkv_window_scores / snapkv_pool /
// fastv_scores / decode functions that forward to reference:: or simd::. Returns every output by name.
template <class Backend>
std::vector<NamedArray> run_baselines_case(const BaselineCaseInputs& c, BaselineRunInfo* info = nullptr) {
    double margin = 1.0;
    std::vector<NamedArray> r;
    if (c.baseline == "streamingllm") {
        r = detail::run_streamingllm(c);
    } else if (c.baseline == "random") {
        const auto s = random_select(c.layout, c.layer, random_params_from_json(c.params, "params."));
        r.push_back({"kept_mask", NpyArray::from(detail::mask_of(s, c.n), {c.n})});
    } else if (c.baseline == "fixed_ratio") {
        const auto s = fixed_ratio_select(c.layout, fixed_ratio_params_from_json(c.params, "params."));
        r.push_back({"kept_mask", NpyArray::from(detail::mask_of(s, c.n), {c.n})});
    } else if (c.baseline == "h2o" || c.baseline == "snapkv" || c.baseline == "fastv") {
        if (c.dtype == "fp32") r = detail::run_baselines_typed<Backend, float>(c, margin);
        else if (c.dtype == "fp16") r = detail::run_baselines_typed<Backend, half>(c, margin);
        else if (c.dtype == "bf16") r = detail::run_baselines_typed<Backend, bfloat16>(c, margin);
        else throw error("run_baselines_case", "input dtype '" + c.dtype + "', expected fp32, fp16 or bf16");
    } else {
        throw error("run_baselines_case", "baseline '" + c.baseline +
                                              "', expected h2o, snapkv, streamingllm, fastv, random or fixed_ratio");
    }
    if (info) info->margin = margin;
    return r;
}

inline OutputMetric baselines_output_metric(const std::string& name) {
    if (name == "scores" || name == "decode_scores" || name == "window_scores" || name == "pooled") return score_metric();
    if (name == "decode_out") return attention_metric();
    return {};
}

}  // namespace golden
}  // namespace vlsparse
