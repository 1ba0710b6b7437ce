// PureKV golden cases for vlsparse-golden (see golden_gen.cpp and docs/golden-format.md).
//
// Every case runs a small multi-layer prefill through reference::PureKVEstimator (window scores at
// the lower layers, Eq. 3/4 importance, kept sets, ST-masked attention, per-layer Spearman
// validation) and writes the five video masks of its layout; one case holds a Spearman example with
// ties. Inputs come from a small structured generator defined here (sinks, heavy hitters that stay
// heavy across layers, video frames that repeat with small changes, per-token V magnitudes), so the
// cases do not move when the simulator's generator changes. A case whose importance values (estimate
// or own) come within 1e-5 (relative) of each other without being equal is rejected: a port could then
// rank them differently. Every case is small (the folder is well under 1 MB).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <vlsparse/reference/golden_writer.hpp>
#include <vlsparse/reference/purekv.hpp>
#include <vlsparse/reference/purekv_golden.hpp>

namespace fs = std::filesystem;
using namespace vlsparse;

namespace {

struct CaseDef {
    std::string name, description, layout, dtype = "fp32";
    ModelShape shape{};  // layers 0: no attention part
    PureKVParams params{};
    std::uint64_t seed = 1;
    bool uniform = false;  // q = 0 and |V| equal everywhere: exact ties, resolved by position
    std::vector<double> x, y;
};

CaseDef make_def(std::string name, std::string description, std::string layout, std::string dtype = "fp32") {
    CaseDef c;
    c.name = std::move(name);
    c.description = std::move(description);
    c.layout = std::move(layout);
    c.dtype = std::move(dtype);
    return c;
}

double normal(SplitMix64& rng) {  // Box-Muller
    const double u1 = (static_cast<double>(rng.next() >> 11) + 0.5) * 0x1.0p-53;
    const double u2 = static_cast<double>(rng.next() >> 11) * 0x1.0p-53;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// Q/K/V of every layer [L, n, heads, d]. Coordinate 0 is a sink direction (the first token of every
// segment), coordinate 1 a heavy-hitter direction (every 7th visual token, the same in every layer);
// each head weighs them by its own per-layer weights. Video keys of frame f >= 1 repeat frame f-1's
// keys at the same slot with 30% innovation. V rows have a per-token magnitude in [0.5, 1.5] that
// drifts a little from layer to layer.
void generate(const CaseDef& def, const Layout& layout, golden::PureKVCaseInputs& c) {
    const std::int64_t n = layout.n(), L = def.shape.layers, H = def.shape.heads, Hkv = def.shape.kv_heads,
                       d = def.shape.head_dim;
    SplitMix64 rng(def.seed);
    std::vector<std::uint8_t> sink(static_cast<std::size_t>(n), 0), heavy(sink.size(), 0);
    std::vector<std::int64_t> prev(sink.size(), -1);
    std::vector<double> mag(sink.size());
    for (const auto& s : layout.segments()) {
        sink[static_cast<std::size_t>(s.start)] = 1;
        if (!s.is_visual()) continue;
        for (std::int64_t p = s.start; p < s.end(); ++p) heavy[static_cast<std::size_t>(p)] = (p - s.start) % 7 == 3;
        if (s.kind == SegmentKind::video)
            for (std::int64_t p = s.start + s.tokens_per_frame; p < s.end(); ++p)
                prev[static_cast<std::size_t>(p)] = p - s.tokens_per_frame;
    }
    for (auto& m : mag) m = 0.5 + rng.uniform();
    const double root_d = std::sqrt(static_cast<double>(d));
    c.q.assign(static_cast<std::size_t>(L * n * H * d), 0.0f);
    c.k.assign(static_cast<std::size_t>(L * n * Hkv * d), 0.0f);
    c.v.assign(c.k.size(), 0.0f);
    for (std::int64_t l = 0; l < L; ++l) {
        std::vector<double> ws(static_cast<std::size_t>(H)), wh(static_cast<std::size_t>(H));
        for (std::int64_t h = 0; h < H; ++h) {
            ws[static_cast<std::size_t>(h)] = 2.0 * rng.uniform();
            wh[static_cast<std::size_t>(h)] = 0.5 + 1.5 * rng.uniform();
        }
        for (std::int64_t j = 0; j < n; ++j) {
            const auto J = static_cast<std::size_t>(j);
            for (std::int64_t h = 0; h < H; ++h)
                for (std::int64_t x = 0; x < d; ++x) {
                    double val = 0.6 * normal(rng);
                    if (x == 0) val += ws[static_cast<std::size_t>(h)] * root_d / 3.0;
                    if (x == 1) val += wh[static_cast<std::size_t>(h)] * root_d / 2.5;
                    c.q[static_cast<std::size_t>(((l * n + j) * H + h) * d + x)] = def.uniform ? 0.0f : golden::round_to_dtype(def.dtype, static_cast<float>(val));
                }
            const double drift = mag[J] * (0.9 + 0.2 * rng.uniform());
            for (std::int64_t g = 0; g < Hkv; ++g)
                for (std::int64_t x = 0; x < d; ++x) {
                    const auto at = static_cast<std::size_t>(((l * n + j) * Hkv + g) * d + x);
                    double kk = 0.8 * normal(rng);
                    if (prev[J] >= 0) {
                        const auto from = static_cast<std::size_t>(((l * n + prev[J]) * Hkv + g) * d + x);
                        kk = 0.95 * static_cast<double>(c.k[from]) + 0.3 * kk;
                    }
                    if (x == 0 && sink[J]) kk += 3.0;
                    if (x == 1 && heavy[J]) kk += 2.5;
                    c.k[at] = golden::round_to_dtype(def.dtype, static_cast<float>(kk));
                    const double vv = def.uniform ? ((rng.next() & 1) ? 1.0 : -1.0) : drift * normal(rng);
                    c.v[at] = golden::round_to_dtype(def.dtype, static_cast<float>(vv));
                }
        }
    }
}

// Smallest relative gap between distinct values among the first m entries (1 when none).
double min_gap(const std::vector<double>& v, std::int64_t m) {
    std::vector<double> s(v.begin(), v.begin() + m);
    std::sort(s.begin(), s.end());
    const double top = std::max(std::abs(s.front()), std::abs(s.back()));
    double worst = 1.0;
    for (std::size_t i = 1; i < s.size(); ++i)
        if (s[i] != s[i - 1]) worst = std::min(worst, (s[i] - s[i - 1]) / top);
    return worst;
}

void write_case(const fs::path& root, const CaseDef& def) {
    golden::PureKVCaseInputs c;
    c.layout = Layout::parse(def.layout);
    c.params = def.params;
    c.dtype = def.dtype;
    c.shape = def.shape;
    c.x = def.x;
    c.y = def.y;
    const std::int64_t n = c.layout.n();
    if (def.shape.layers > 0) generate(def, c.layout, c);

    // Margins: every importance vector the outputs depend on (the estimator's, and each validated
    // layer's own) must rank stably under rounding.
    double margin = 1.0;
    if (def.shape.layers > 0 && !def.uniform) {
        const std::int64_t L = c.shape.layers, H = c.shape.heads, Hkv = c.shape.kv_heads, d = c.shape.head_dim;
        auto view = [&](const std::vector<float>& x, std::int64_t l, std::int64_t heads) {
            return View3<const float>(x.data() + l * n * heads * d, {n, heads, d});
        };
        reference::PureKVEstimator est(c.params, c.layout, c.shape);
        for (std::int64_t l = 0; l < L; ++l) {
            if (est.needs_scores(l)) est.observe(l, view(c.q, l, H), view(c.k, l, Hkv));
            const auto s = est.select(l, view(c.v, l, Hkv));
            if (s.dense) continue;
            for (const auto& imp : s.importance) margin = std::min(margin, min_gap(imp, n - s.window));
            if (l > c.params.l0) {
                const auto own = reference::purekv_select(
                    reference::purekv_window_scores(view(c.q, l, H), view(c.k, l, Hkv), l, c.params), view(c.v, l, Hkv), l,
                    c.params);
                for (const auto& imp : own.importance) margin = std::min(margin, min_gap(imp, n - own.window));
            }
        }
        if (margin < 1e-5)
            throw error("vlsparse-golden", def.name + ": two importance values are within " + std::to_string(margin) +
                                               " (relative) of each other; change the seed");
    }
    const auto outputs = golden::run_purekv_case<reference::PureKVEstimator>(c);
    std::printf("  %-28s n=%-4lld L=%lld H=%lld/%lld d=%-3lld %-4s margin %.2e  %s\n", def.name.c_str(),
                static_cast<long long>(n), static_cast<long long>(c.shape.layers), static_cast<long long>(c.shape.heads),
                static_cast<long long>(c.shape.kv_heads), static_cast<long long>(c.shape.head_dim), def.dtype.c_str(),
                margin, def.layout.c_str());

    golden::CaseWriter w(root, "purekv", def.name, to_json(def.params), c.layout.to_string(), def.dtype);
    if (c.shape.layers > 0) {
        const std::int64_t L = c.shape.layers;
        w.input("q", c.q, {L, n, c.shape.heads, c.shape.head_dim}, "queries of every layer [L, n, H, d]");
        w.input("k", c.k, {L, n, c.shape.kv_heads, c.shape.head_dim}, "keys of every layer [L, n, H_kv, d]");
        w.input("v", c.v, {L, n, c.shape.kv_heads, c.shape.head_dim}, "values of every layer [L, n, H_kv, d]");
    }
    if (!c.x.empty()) {
        const char* sample = "Spearman sample (paired with the other)";
        w.input_exact("x", c.x, {static_cast<std::int64_t>(c.x.size())}, sample);
        w.input_exact("y", c.y, {static_cast<std::int64_t>(c.y.size())}, sample);
    }
    w.outputs(outputs, golden::purekv_output_metric, {
        {"masks", "video masks [5, n, n] with the Dense template (1 = query row may attend key column): spatial, "
                  "temporal, spatial_temporal, local_window, atrous (params st_window, st_dilation)"},
        {"allowed_pairs", "exact allowed (query, key) pairs of each video mask"},
        {"scores_l0", "Eq. 2 window scores of layer l0 [G, n] (0 in the window)"},
        {"v_norm", "||V_j|| per layer and group [L, G, n] (0 in dense layers)"},
        {"importance", "Eq. 3 (layers <= l0) / Eq. 4 (above) importance [L, G, n] (0 in the window and dense layers)"},
        {"kept_mask", "kept positions after each layer's prefill [L, G, n] (1 = kept)"},
        {"prefill_out", "each layer's prefill attention [L, n, H, d]: ST-masked from st_start_layer, causal dense before"},
        {"validation_rho", "Spearman rho per layer above l0 and group [L - l0 - 1, G] (Eq. 5-7)"},
        {"validation_p", "two-sided p-value of validation_rho (t approximation, n - w - 2 dof)"},
        {"spearman", "rho and two-sided p-value of (x, y), average ranks for ties"},
    });
    w.finish(def.description);
}

std::vector<CaseDef> purekv_cases() {
    std::vector<CaseDef> cases;
    {
        CaseDef c = make_def("st_video_gqa_fp32",
                  "4 frames x 16 tokens (4x4 grid) between text, GQA 4/2, fp32, 5 layers, l0 = 2, window 8, 30% budget, "
                  "per-KV-head groups, ST-SpAttn from layer 1.",
                  "text:6,video:4x16[4x4],text:10");
        c.shape = {5, 4, 2, 16};
        c.params.window = 8;
        c.params.budget_fraction = 0.3;
        c.params.st_start_layer = 1;
        c.params.q_block = 16;
        c.params.k_block = 16;
        c.seed = 9;
        cases.push_back(c);
    }
    {
        CaseDef c = make_def("layer_grouping_bf16_mqa",
                  "5 frames x 12 tokens, MQA 4/1, bf16, 4 layers, l0 = 1 with a dense layer 0, window 6, top_h = 20, "
                  "one group per layer, spatial mask from layer 2.",
                  "text:4,video:5x12,text:8", "bf16");
        c.shape = {4, 4, 1, 32};
        c.params.l0 = 1;
        c.params.window = 6;
        c.params.budget = PureKVBudget::count;
        c.params.top_h = 20;
        c.params.grouping = PureKVGrouping::layer;
        c.params.lower_layers = PureKVLowerLayers::dense;
        c.params.st.kind = VideoMask::spatial;
        c.params.st_start_layer = 2;
        c.seed = 5;
        cases.push_back(c);
    }
    {
        CaseDef c = make_def("two_videos_atrous_fp16",
                  "Two videos and an image with text between, GQA 8/2, fp16, 4 layers, l0 = 2, window 12, 25% budget, "
                  "atrous mask (window 4, dilation 3) from layer 0.",
                  "text:3,video:3x8[2x4],text:2,image:10,text:2,video:4x6,text:5", "fp16");
        c.shape = {4, 8, 2, 16};
        c.params.window = 12;
        c.params.budget_fraction = 0.25;
        c.params.st = {VideoMask::atrous, 4, 3};
        c.params.q_block = 8;
        c.params.k_block = 8;
        c.seed = 20;
        cases.push_back(c);
    }
    {
        CaseDef c = make_def("ties_uniform",
                  "q = 0 (uniform attention) and |V| equal everywhere: every importance ties, the top-h are the lowest "
                  "positions; a single-frame video and a one-token-per-frame video; 3 layers (no validation).",
                  "text:2,video:3x5,text:1,video:1x4,text:1,video:5x1,text:2");
        c.shape = {3, 2, 2, 16};
        c.params.window = 4;
        c.params.budget = PureKVBudget::count;
        c.params.top_h = 7;
        c.params.st = {VideoMask::spatial_temporal, 3, 2};
        c.uniform = true;
        c.seed = 5;
        cases.push_back(c);
    }
    {
        CaseDef c = make_def("spearman_ties", "A Spearman example with ties in both samples (average ranks), and a small video's masks.",
                  "text:2,video:3x3,text:1");
        c.x = {3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0, 5.0, 3.0, 5.0, 8.0};
        c.y = {2.0, 7.0, 1.0, 8.0, 2.0, 8.0, 1.0, 8.0, 2.0, 8.0, 4.0, 5.0};
        c.params.st = {VideoMask::spatial_temporal, 2, 2};
        cases.push_back(c);
    }
    return cases;
}

}  // namespace

namespace vlsparse::golden {
void write_purekv_golden(const fs::path& root) {
    std::printf("purekv:\n");
    for (const auto& c : purekv_cases()) write_case(root, c);
}
}  // namespace vlsparse::golden
