// BlindSight on a 4-image prompt: the four templates, their cost, masked attention, and calibration.
//
//   blindsight_masks [OUT_DIR]
// Builds the masks of a prompt with four images of unequal sizes (delimiters and text between them)
// from its layout alone, prints the exact allowed pairs and both FLOPs estimates of each template,
// runs per-head masked attention with GQA on toy numbers, characterizes every head (Algorithm 1) and
// aggregates over a few prompts (Algorithm 2). With OUT_DIR it also writes one SVG picture per
// template and one of the head map (the pictures in docs/blindsight.md come from here).
#include <cctype>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <vlsparse/vlsparse.hpp>

int main(int argc, char** argv) {
    using namespace vlsparse;
    const std::string out_dir = argc > 1 ? argv[1] : "";
    // <image_start> image <image_end> as text:1, image:N, text:1; a question at the end.
    const auto layout = Layout::parse(
        "text:6,text:1,image:40,text:1,text:3,text:1,image:24,text:1,text:3,text:1,image:32,text:1,text:3,"
        "text:1,image:16,text:1,text:10");
    const MaskContext ctx = make_mask_context(layout);  // sinks: first ceil(0.1 * len) tokens of each image
    const auto paper = flops_reduction_paper(layout);
    const auto exact = flops_reduction_exact(ctx);
    std::printf("prompt: n = %lld, %lld images\n\n", static_cast<long long>(layout.n()), static_cast<long long>(ctx.images()));
    std::printf("%-14s %8s %12s %12s\n", "template", "pairs", "saved exact", "saved paper");
    for (MaskTemplate t : kAllTemplates) {
        std::printf("%-14s %8lld %11.1f%% %11.1f%%\n", std::string(to_string(t)).c_str(),
                    static_cast<long long>(count_allowed_pairs(ctx, t)), 100.0 * exact[t], 100.0 * paper[t]);
        if (!out_dir.empty()) {
            std::string name = std::string(to_string(t));
            for (auto& ch : name) ch = ch == '-' ? '_' : static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
            std::ofstream(out_dir + "/blindsight_" + name + ".svg") << mask_svg(ctx, t, 3);
        }
    }

    // One layer of toy Q/K/V (GQA 8 query heads / 2 KV heads), one template per head.
    const std::int64_t n = layout.n(), H = 8, Hkv = 2, d = 32;
    std::vector<float> q(static_cast<std::size_t>(n * H * d)), k(static_cast<std::size_t>(n * Hkv * d)), v(k.size());
    SplitMix64 rng(7);
    for (auto* buf : {&q, &k, &v})
        for (auto& x : *buf) x = static_cast<float>(rng.uniform() - 0.5);
    // Sink heads: KV head 0's sink keys share a direction (component 0) that its query heads 0-3 look for.
    auto add_sinks = [&] {
        for (std::int64_t i = 0; i < n; ++i) {
            if (ctx.token_sink[static_cast<std::size_t>(i)]) k[static_cast<std::size_t>(i * Hkv * d)] += 6.0f;
            for (std::int64_t h = 0; h < 4; ++h) q[static_cast<std::size_t>((i * H + h) * d)] += 3.0f;
        }
    };
    add_sinks();
    const View3<const float> qv(q.data(), {n, H, d}), kv(k.data(), {n, Hkv, d}), vv(v.data(), {n, Hkv, d});
    const std::vector<MaskTemplate> heads = {MaskTemplate::dense, MaskTemplate::sink, MaskTemplate::document,
                                             MaskTemplate::document_sink, MaskTemplate::sink, MaskTemplate::sink,
                                             MaskTemplate::document, MaskTemplate::dense};
    const BlockMask bm = make_block_mask(ctx, heads, 32, 32);  // plain data: what a kernel consumes
    std::vector<float> out(q.size());
    simd::masked_attention(qv, kv, vv, bm, View3<float>(out.data(), {n, H, d}));
    std::printf("\nmasked attention: %lld of %lld causal pairs computed over %lld heads (block lists, 32 x 32 blocks)\n",
                static_cast<long long>(bm.computed_pairs()), static_cast<long long>(H * n * (n + 1) / 2),
                static_cast<long long>(H));

    // Calibration: Algorithm 1 on a few prompts (here: reseeded toy inputs), then Algorithm 2.
    BlindSightParams P;  // alpha 0.1, gamma_c 0.25, gamma_s = gamma_d = 0.6
    std::vector<TemplateCounts> counts(static_cast<std::size_t>(H));
    for (int prompt = 0; prompt < 3; ++prompt) {
        for (auto& x : q) x = static_cast<float>(rng.uniform() - 0.5);
        for (std::int64_t i = 0; i < n; ++i)
            for (std::int64_t h = 0; h < 4; ++h) q[static_cast<std::size_t>((i * H + h) * d)] += 3.0f;
        const auto r = simd::characterize_prompt(qv, kv, vv, layout, P);
        for (std::int64_t h = 0; h < H; ++h) counts[static_cast<std::size_t>(h)].add(r[static_cast<std::size_t>(h)].chosen);
    }
    HeadMap map;
    map.layers = 1;
    map.heads = H;
    map.kv_heads = Hkv;
    map.head_dim = d;
    map.prompts = 3;
    map.params = P;
    map.map = aggregate(counts, P);
    std::printf("\nhead map (1 layer):");
    for (auto t : map.map) std::printf(" %s", std::string(to_string(t)).c_str());
    std::printf("\nmodel-level FLOPs saved (exact, weighted by template shares): %.1f%%\n",
                100.0 * model_flops_reduction(template_shares(map.map), exact));
    if (!out_dir.empty()) std::ofstream(out_dir + "/blindsight_head_map.svg") << head_map_svg(map, 16);
    return 0;
}
