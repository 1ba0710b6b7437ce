// BlindSight golden cases for vlsparse-golden (see golden_gen.cpp and docs/golden-format.md).
//
// Template masks for several layouts (1, 4 and 8 images of unequal sizes, text between images,
// delimiters, Gemma-style offsets with bidirectional images), masked attention outputs with per-head
// templates (GQA, fp32 and bf16), Algorithm 1 decisions with their NMSE values (a case whose NMSE
// lies within 1e-3 (relative) of alpha is rejected: a port could legitimately decide otherwise),
// Algorithm 2 results, and FLOPs by both methods. Every case is small (the folder is well under 1 MB).
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <vlsparse/reference/blindsight.hpp>
#include <vlsparse/reference/blindsight_golden.hpp>
#include <vlsparse/reference/golden_writer.hpp>
#include <vlsparse/reference/golden_synthetic.hpp>

namespace fs = std::filesystem;
using namespace vlsparse;

namespace {

struct CaseDef {
    std::string name, description, layout;
    BlindSightParams params{};
    std::string dtype = "fp32";
    std::int64_t H = 0, Hkv = 0, d = 0;
    std::vector<std::int64_t> heads;
    std::int64_t agg_layers = 0, agg_heads = 0;  // aggregation tallies (random, seeded) when > 0
    std::vector<std::int64_t> agg_counts;        // explicit tallies [agg_layers * agg_heads, 4] instead
    std::uint64_t seed = 1;
};

CaseDef make_def(std::string name, std::string description, std::string layout) {
    CaseDef c;
    c.name = std::move(name);
    c.description = std::move(description);
    c.layout = std::move(layout);
    return c;
}

void write_case(const fs::path& root, const CaseDef& def) {
    golden::BlindSightCaseInputs c;
    c.layout = Layout::parse(def.layout);
    c.params = def.params;
    c.dtype = def.dtype;
    c.H = def.H;
    c.Hkv = def.Hkv;
    c.d = def.d;
    c.heads = def.heads;
    const std::int64_t n = c.layout.n();
    if (def.H > 0) {
        golden::SyntheticParams S;
        S.n_heads = def.H;
        S.n_kv_heads = def.Hkv;
        S.head_dim = def.d;
        S.seed = def.seed;
        const auto L = golden::synthetic_layer(c.layout, S, 3);
        c.q = golden::round_to_dtype(def.dtype, L.q);
        c.k = golden::round_to_dtype(def.dtype, L.k);
        c.v = golden::round_to_dtype(def.dtype, L.v);
    }
    if (!def.agg_counts.empty()) {
        c.counts = def.agg_counts;
    } else if (def.agg_layers > 0) {
        SplitMix64 rng(def.seed);
        for (std::int64_t i = 0; i < def.agg_layers * def.agg_heads; ++i) {
            // Tallies over 20 prompts, skewed so every branch of Algorithm 2 occurs.
            std::int64_t cnt[4] = {0, 0, 0, 0};
            const auto bias = static_cast<std::size_t>(rng.next() % 4);
            for (int p = 0; p < 20; ++p) ++cnt[rng.uniform() < 0.7 ? bias : static_cast<std::size_t>(rng.next() % 4)];
            c.counts.insert(c.counts.end(), cnt, cnt + 4);
        }
    }
    const auto outputs = golden::run_blindsight_case<reference::BlindSightOps>(c);
    for (const auto& o : outputs)
        if (o.name == "nmse") {
            const auto v = o.array.to_vector<double>();
            for (double x : v)
                if (std::abs(x - c.params.alpha) <= 1e-3 * c.params.alpha)
                    throw error("vlsparse-golden", def.name + ": an NMSE is within 1e-3 of alpha; change the seed or alpha");
        }
    std::printf("  %-28s n=%-4lld %s\n", def.name.c_str(), static_cast<long long>(n), def.layout.c_str());

    golden::CaseWriter w(root, "blindsight", def.name, to_json(def.params), c.layout.to_string(), def.dtype);
    if (def.H > 0) {
        w.input("q", c.q, {n, c.H, c.d}, "queries [n, H, d]");
        w.input("k", c.k, {n, c.Hkv, c.d}, "keys [n, H_kv, d]");
        w.input("v", c.v, {n, c.Hkv, c.d}, "values [n, H_kv, d]");
    }
    if (!c.heads.empty())
        w.input_exact("heads", c.heads, {c.H},
                      "template code per query head for masked_out (0 Dense, 1 Sink, 2 Document, 3 Document-Sink)");
    if (!c.counts.empty())
        w.input_exact("counts", c.counts, {def.agg_layers * def.agg_heads, 4},
                      "Algorithm 1 tallies per (layer, head), columns Dense, Sink, Document, Document-Sink");
    w.outputs(outputs, golden::blindsight_output_metric, {
        {"masks", "expanded masks [4, n, n] (1 = query row may attend key column), templates in code order"},
        {"allowed_pairs", "exact allowed (query, key) pairs per template"},
        {"flops_paper", "Algorithm 3 as printed, FLOPs reduction per template (Dense 0)"},
        {"flops_exact", "1 - allowed_pairs / allowed_pairs[Dense]"},
        {"masked_out", "masked attention output [n, H, d] with the per-head templates of input heads"},
        {"nmse", "Algorithm 1 NMSE [H, 4] against the Dense output (column 0 is 0)"},
        {"chosen", "Algorithm 1 template code per head"},
        {"aggregated", "Algorithm 2 template code per (layer, head)"},
    });
    w.finish(def.description);
}

std::vector<CaseDef> blindsight_cases() {
    std::vector<CaseDef> cases;
    cases.push_back(make_def("one_image", "One image between text: Document and Document-Sink equal Dense.",
                     "text:5,text:1,image:24,text:1,text:3"));
    cases.push_back(make_def("four_images_unequal",
                     "Four images of unequal sizes, each between <image_start>/<image_end> delimiters, text between.",
                     "text:4,text:1,image:12,text:1,text:2,text:1,image:20,text:1,text:1,image:9,text:1,text:3,text:1,"
                     "image:16,text:1,text:2"));
    {
        std::string spec = "text:3";
        const int sizes[] = {5, 11, 3, 8, 14, 6, 9, 4};
        for (int s : sizes) spec += ",text:1,image:" + std::to_string(s) + ",text:1,text:2";
        CaseDef c = make_def("eight_images", "Eight images of 3 to 14 tokens with delimiters and text between; sink fraction 0.25.", spec);
        c.params.mask.sink_fraction = 0.25;
        cases.push_back(c);
    }
    {
        CaseDef c = make_def("gemma_offsets_bidirectional",
                  "Gemma 3 style: equal images, sinks at fixed offsets {0, 3, 7}, bidirectional attention inside an image.",
                  "text:4,text:1,image:12,text:1,text:2,text:1,image:12,text:1,text:2,text:1,image:12,text:1,text:1");
        c.params.mask.sink_offsets = {0, 3, 7};
        c.params.mask.bidirectional_images = true;
        cases.push_back(c);
    }
    {
        CaseDef c = make_def("attention_gqa_fp32", "Masked attention and Algorithm 1, GQA 8/2, fp32, four images, mixed head templates.",
                  "text:6,text:1,image:30,text:1,text:4,text:1,image:22,text:1,text:2,text:1,image:26,text:1,text:3,"
                  "text:1,image:18,text:1,text:5");
        c.H = 8;
        c.Hkv = 2;
        c.d = 16;
        c.heads = {0, 1, 2, 3, 3, 2, 1, 0};
        c.seed = 11;
        cases.push_back(c);
    }
    {
        CaseDef c = make_def("attention_bf16_gemma", "Masked attention and Algorithm 1, MQA 4/1, bf16, Gemma-style offsets, bidirectional.",
                  "text:5,text:1,image:16,text:1,text:3,text:1,image:16,text:1,text:3,text:1,image:16,text:1,text:2");
        c.params.mask.sink_offsets = {1, 6, 11};
        c.params.mask.bidirectional_images = true;
        c.params.alpha = 0.2;
        c.dtype = "bf16";
        c.H = 4;
        c.Hkv = 1;
        c.d = 32;
        c.heads = {1, 2, 3, 0};
        c.seed = 5;
        cases.push_back(c);
    }
    {
        CaseDef c = make_def("aggregation", "Algorithm 2 on seeded tallies of 20 prompts for 6 layers x 8 heads (default gammas).",
                  "text:2,image:6,text:1,image:4,text:1");
        c.agg_layers = 6;
        c.agg_heads = 8;
        c.seed = 3;
        cases.push_back(c);
    }
    {
        CaseDef c = make_def("aggregation_thresholds",
                             "Algorithm 2 with fractions exactly on gamma_c = 0.25, gamma_s = 0.6 and gamma_d = 0.6 "
                             "(strict comparisons: a fraction equal to its gamma does not select the template) and "
                             "just above them.",
                             "text:2,image:4,text:1");
        c.agg_layers = 1;
        c.agg_heads = 8;
        c.agg_counts = {
            5,  15, 0,  0,  // Dense 5/20 = 0.25 (not > gamma_c), Sink 0.75 -> Sink
            6,  14, 0,  0,  // Dense 0.3 -> Dense
            0,  12, 8,  0,  // Sink 12/20 = 0.6 (not > gamma_s), Document 0.4 -> Document-Sink
            0,  13, 7,  0,  // Sink 0.65 -> Sink
            4,  4,  12, 0,  // Document 12/20 = 0.6 (not > gamma_d) -> Document-Sink
            4,  3,  13, 0,  // Document 0.65 -> Document
            1,  3,  0,  1,  // 5 prompts: Sink 3/5 = 0.6 -> Document-Sink
            10, 24, 6,  0,  // 40 prompts: Dense 0.25 and Sink 0.6 exactly -> Document-Sink
        };
        cases.push_back(c);
    }
    return cases;
}

}  // namespace

namespace vlsparse::golden {
void write_blindsight_golden(const std::filesystem::path& root) {
    std::printf("blindsight:\n");
    for (const auto& c : blindsight_cases()) write_case(root, c);
}
}  // namespace vlsparse::golden
