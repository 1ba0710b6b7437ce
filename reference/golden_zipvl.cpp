// ZipVL golden cases for vlsparse-golden (see golden_gen.cpp and docs/golden-format.md).
//
// Each case is small (well under 1 MB), built from the structured synthetic generator so the
// selections are meaningful, and checked for decision margins: a case whose adaptive count p or
// top-k cutoff sits within rounding of a boundary is rejected (a port could then legitimately
// differ), except where exact ties are the point of the case.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <vlsparse/reference/golden_writer.hpp>
#include <vlsparse/reference/zipvl.hpp>
#include <vlsparse/reference/zipvl_golden.hpp>

namespace fs = std::filesystem;
using namespace vlsparse;

namespace {

struct CaseDef {
    std::string name, description, dtype, layout;
    std::int64_t H, Hkv, d, layer = 0, steps = 3;
    ZipVLParams params{};
    bool uniform_q = false;  // q = 0: uniform attention, exact ties
    bool rows_before_kept = false;  // some group's first kept position is > 0 (rows that see no kept key)
    std::uint64_t seed = 1;
};

// Smallest relative margin of the decisions of a selection (p boundary and top-k cutoff). An exact tie
// at the cutoff (equal values, resolved by position) has margin 0 unless `allow_ties` (ties_uniform).
double decision_margin(const ZipVLSelection& s, const ZipVLParams& P, bool allow_ties) {
    double worst = 1.0;
    for (std::size_t g = 0; g < s.p.size(); ++g) {
        const auto n = static_cast<std::int64_t>(s.accumulated[g].size());
        std::vector<double> a = s.accumulated[g], an = s.normalized[g];
        std::sort(a.begin(), a.end(), std::greater<double>());
        std::sort(an.begin(), an.end(), std::greater<double>());
        const double M = static_cast<double>(s.heads_per_group) * static_cast<double>(s.probes.size());
        const std::int64_t p = s.p[g];
        double before = 0.0;
        for (std::int64_t t = 0; t + 1 < p; ++t) before += a[static_cast<std::size_t>(t)];
        const double after = before + a[static_cast<std::size_t>(p - 1)];
        if (p < n || after > P.tau * M) worst = std::min(worst, (after - P.tau * M) / M);
        if (p > 1 || before > 0) worst = std::min(worst, (P.tau * M - before) / M);
        if (p < n) {
            const double gap = an[static_cast<std::size_t>(p - 1)] - an[static_cast<std::size_t>(p)];
            if (gap != 0.0 || !allow_ties) worst = std::min(worst, gap / an[0]);
        }
    }
    return worst;
}

// Writes the case from synthetic seed `seed`; false (nothing written) when its decision margins are below
// 1e-5 or the case's own requirement does not hold.
bool try_case(const fs::path& root, const CaseDef& def, std::uint64_t seed) {
    const Layout layout = Layout::parse(def.layout);
    const std::int64_t n = layout.n();
    golden::ZipVLCaseInputs c;
    golden::synthetic_decode_case(c, def.dtype, layout, def.H, def.Hkv, def.d, def.steps, seed, def.layer);
    c.layer = def.layer;
    c.params = def.params;
    if (def.uniform_q) c.q.assign(c.q.size(), 0.0f);

    // Margin check on the reference's own decisions.
    {
        std::vector<float> q = c.q, k = c.k;
        const auto s = reference::zipvl_select(View3<const float>(q.data(), {n, c.H, c.d}),
                                               View3<const float>(k.data(), {n, c.Hkv, c.d}), layout, c.layer, c.params);
        if (!s.dense) {
            const double m = decision_margin(s, c.params, def.uniform_q);
            if (m < 1e-5) return false;
            if (def.rows_before_kept &&
                std::none_of(s.selection.indices.begin(), s.selection.indices.end(),
                             [](const std::vector<std::int64_t>& l) { return l.empty() || l.front() > 0; }))
                return false;
            std::printf("  %-28s n=%-4lld H=%lld/%lld d=%-3lld %-4s p=%-4lld kept %5.1f%%  margin %.2e\n",
                        def.name.c_str(), static_cast<long long>(n), static_cast<long long>(c.H),
                        static_cast<long long>(c.Hkv), static_cast<long long>(c.d), def.dtype.c_str(),
                        static_cast<long long>(s.p[0]), 100.0 * s.kept_ratio(), m);
        } else {
            std::printf("  %-28s n=%-4lld dense layer (layer %lld < dense_layers %lld)\n", def.name.c_str(),
                        static_cast<long long>(n), static_cast<long long>(c.layer),
                        static_cast<long long>(c.params.dense_layers));
        }
    }

    golden::CaseWriter w(root, "zipvl", def.name, to_json(def.params), layout.to_string(), def.dtype);
    w.input("q", c.q, {n, c.H, c.d}, "queries [n, H, d]");
    w.input("k", c.k, {n, c.Hkv, c.d}, "keys [n, H_kv, d]");
    w.input("v", c.v, {n, c.Hkv, c.d}, "values [n, H_kv, d]");
    w.input_exact("layer", std::vector<std::int64_t>{c.layer}, {1},
                  "layer index passed to zipvl_select (probe seed = params.seed + layer)");
    w.decode_inputs(c);
    w.outputs(golden::run_zipvl_case<reference::ZipVLOps>(c), golden::zipvl_output_metric);
    w.finish(def.description + (seed != def.seed ? " Synthetic seed " + std::to_string(seed) + "." : std::string()));
    return true;
}

// The case with the first synthetic seed from def.seed (at most 50 tries) that passes.
void write_case(const fs::path& root, const CaseDef& def) {
    golden::write_first_passing(def.name, def.seed, [&](std::uint64_t s) { return try_case(root, def, s); },
                                "decision margins >= 1e-5 (and the case's requirement)");
}

std::vector<CaseDef> zipvl_cases() {
    std::vector<CaseDef> cases;
    {
        CaseDef c{"mha_fp32_layer", "MHA, fp32, layer-wise selection, causal-column nnz, 16+16 probes.", "fp32",
                  "text:12,image:100,text:8", 4, 4, 32};
        c.layer = 2;
        c.params.tau = 0.9;
        c.params.probe_recent = 16;
        c.params.probe_random = 16;
        c.params.seed = 7;
        cases.push_back(c);
    }
    {
        CaseDef c{"gqa_bf16_kv_head", "GQA 8/2, bf16 inputs, per-KV-head selection, probe-rows nnz, unselected rows attend the kept keys.",
                  "bf16", "text:6,image:150,text:4", 8, 2, 64};
        c.layer = 5;
        c.params.tau = 0.95;
        c.params.probe_recent = 24;
        c.params.probe_random = 24;
        c.params.grouping = ZipVLGrouping::kv_head;
        c.params.nnz = ZipVLNnz::probe_rows;
        c.params.unselected = UnselectedRows::attend_selected;
        c.seed = 3;
        cases.push_back(c);
    }
    {
        CaseDef c{"multi_image_fp16_mqa", "Two images with delimiter tokens, MQA (H_kv = 1), fp16, keep_text and keep_last = 4.",
                  "fp16", "text:5,text:1,image:48,text:1,text:3,text:1,image:36,text:1,text:8", 4, 1, 32};
        c.layer = 1;
        c.params.tau = 0.8;
        c.params.probe_recent = 8;
        c.params.probe_random = 8;
        c.params.keep_text = true;
        c.params.keep_last = 4;
        c.seed = 11;
        cases.push_back(c);
    }
    {
        CaseDef c{"small_n_all_probes", "n = 20 below the default 64+64 probes: every token is a probe.", "fp32",
                  "text:4,image:12,text:4", 2, 1, 16};
        c.seed = 5;
        cases.push_back(c);
    }
    {
        CaseDef c{"ties_uniform", "q = 0: uniform attention, exact score ties broken by lower position (probe-rows nnz, per KV head).",
                  "fp32", "image:56,text:8", 2, 2, 16};
        c.uniform_q = true;
        c.params.tau = 0.7;
        c.params.probe_recent = 4;
        c.params.probe_random = 4;
        c.params.nnz = ZipVLNnz::probe_rows;
        c.params.grouping = ZipVLGrouping::kv_head;
        cases.push_back(c);
    }
    {
        CaseDef c{"ratio_probes_bf16", "Probes as ratios (5% recent + 5% random), bf16, GQA 4/2, tau 0.975.", "bf16",
                  "text:20,image:160,text:20", 4, 2, 32};
        c.layer = 3;
        c.params.probe_mode = ZipVLProbes::ratios;
        c.params.seed = 99;
        c.seed = 17;
        cases.push_back(c);
    }
    {
        CaseDef c{"attend_selected_fp32",
                  "GQA 4/2, fp32, per-KV-head sets, unselected rows attend the kept keys at or before them; a KV "
                  "head's first kept position is > 0, so the rows before it see no kept key and are zero.",
                  "fp32", "text:10,image:60,text:10", 4, 2, 32};
        c.layer = 0;
        c.params.tau = 0.9;
        c.params.probe_recent = 8;
        c.params.probe_random = 8;
        c.params.grouping = ZipVLGrouping::kv_head;
        c.params.unselected = UnselectedRows::attend_selected;
        c.params.seed = 5;
        c.rows_before_kept = true;
        c.seed = 23;
        cases.push_back(c);
    }
    {
        CaseDef c{"dense_layer", "layer 0 < dense_layers = 2: nothing selected or evicted, dense prefill.", "fp32",
                  "text:8,image:24,text:8", 2, 2, 16};
        c.params.dense_layers = 2;
        cases.push_back(c);
    }
    return cases;
}

}  // namespace

namespace vlsparse::golden {
void write_zipvl_golden(const fs::path& root) {
    std::printf("zipvl:\n");
    for (const auto& c : zipvl_cases()) write_case(root, c);
}
}  // namespace vlsparse::golden
