// BlindSight: templates (hand-checked pairs, intervals vs pairwise definition), BlockMask vs the
// expanded mask, Algorithms 1-3, head map JSON, and bad input (the masked attention primitive:
// masked_attention_test.cpp).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <limits>
#include <string>

#include <vlsparse/attention/masked.hpp>
#include <vlsparse/io/blindsight_json.hpp>
#include <vlsparse/masks/flops.hpp>
#include <vlsparse/masks/render.hpp>
#include <vlsparse/policies/blindsight.hpp>
#include <vlsparse/reference/blindsight.hpp>
#include <vlsparse/reference/blindsight_golden.hpp>

#include "golden_util.hpp"
#include "mask_util.hpp"
#include "test_util.hpp"

using namespace vlsparse;
using Catch::Matchers::Contains;

TEST_CASE("blindsight: templates on a hand-checked layout", "[blindsight][masks]") {
    // positions: text 0-1 | image A 2-5 | text 6 | image B 7-10 | text 11; sink fraction 0.25 -> 1 sink each.
    const Layout L = Layout::parse("text:2,image:4,text:1,image:4,text:1");
    MaskOptions o;
    o.sink_fraction = 0.25;
    const MaskContext c = make_mask_context(L, o);
    REQUIRE(c.sink_pos == std::vector<std::int64_t>{2, 7});
    using T = MaskTemplate;
    // Text rows: causal dense under every template.
    for (T t : kAllTemplates) {
        for (std::int64_t j = 0; j < 12; ++j) REQUIRE(c.allows(t, 6, j) == (j <= 6));
        for (std::int64_t j = 0; j < 12; ++j) REQUIRE(c.allows(t, 11, j) == true);
    }
    // Query 9 (image B, third token).
    auto row = [&](T t) {
        std::string s;
        for (std::int64_t j = 0; j < 12; ++j) s += c.allows(t, 9, j) ? '1' : '0';
        return s;
    };
    REQUIRE(row(T::dense) == "111111111100");
    REQUIRE(row(T::document) == "110000111100");
    REQUIRE(row(T::sink) == "111000110100");          // text, sink 2, text 6, own sink 7, self 9
    REQUIRE(row(T::document_sink) == "111000111100");  // + own image causal
    // Exact pair counts: Dense = 12*13/2 = 78.
    REQUIRE(count_allowed_pairs(c, T::dense) == 78);
    // Document: image B rows (7..10) lose image A's 4 keys each -> 78 - 16.
    REQUIRE(count_allowed_pairs(c, T::document) == 62);
    // Document-Sink: image B rows keep A's sink -> lose 3 each.
    REQUIRE(count_allowed_pairs(c, T::document_sink) == 66);
    // Sink: inside its own image a row sees only the sink and itself: A rows 2..5 lose 0, 0, 1, 2 keys
    // ({2}, {2,3}, {2,4}, {2,5}); B rows lose A's 3 non-sinks each (12) and 0, 0, 1, 2 inside B (3):
    // 78 - 3 - 12 - 3 = 60.
    REQUIRE(count_allowed_pairs(c, T::sink) == 60);
    // Bidirectional images: image A row 3 sees all of A.
    o.bidirectional_images = true;
    const MaskContext cb = make_mask_context(L, o);
    REQUIRE(cb.allows(T::document, 3, 5));
    REQUIRE_FALSE(cb.allows(T::document, 3, 6));
    REQUIRE(cb.allows(T::sink, 8, 7));
    REQUIRE_FALSE(cb.allows(T::sink, 8, 10));
    REQUIRE(cb.allows(T::sink, 8, 8));
    REQUIRE(count_allowed_pairs(cb, T::dense) == 78 + 2 * 6);  // 6 above-diagonal pairs per image
}

TEST_CASE("blindsight: sinks by fraction (ceil) and by offsets", "[blindsight][masks]") {
    MaskOptions o;
    auto sinks = [&](const char* spec) { return make_mask_context(Layout::parse(spec), o).sink_pos; };
    REQUIRE(sinks("image:10") == std::vector<std::int64_t>{0});          // ceil(1.0) = 1, not 2
    REQUIRE(sinks("image:11") == std::vector<std::int64_t>{0, 1});       // ceil(1.1) = 2
    REQUIRE(sinks("text:1,image:30").size() == 3);                       // ceil(3.0) = 3
    REQUIRE(sinks("image:3") == std::vector<std::int64_t>{0});
    o.sink_fraction = 0.07;
    REQUIRE(0.07 * 100.0 > 7.0);                                          // 7.000000000000001 in double
    REQUIRE(sinks("image:100").size() == 7);                              // the guard: not ceil(7.0...01) = 8
    REQUIRE(sinks("image:101").size() == 8);                              // ceil(7.07) = 8
    o.sink_fraction = 1.0;
    REQUIRE(sinks("image:3,text:1") == std::vector<std::int64_t>{0, 1, 2});
    o.sink_offsets = {1, 4};
    REQUIRE(sinks("image:3,text:1,image:6") == std::vector<std::int64_t>{1, 5, 8});  // offset 4 >= 3 ignored in image 0
}

TEST_CASE("blindsight: row intervals equal the pairwise definition", "[blindsight][masks]") {
    std::vector<KeyInterval> iv;
    for (const char* spec : vt::kMaskLayouts)
        for (const auto& o : vt::mask_option_sets()) {
            const MaskContext c = make_mask_context(Layout::parse(spec), o);
            for (MaskTemplate t : kAllTemplates) {
                INFO(spec << " template " << to_string(t) << " bidir " << o.bidirectional_images);
                for (std::int64_t i = 0; i < c.n; ++i) {
                    c.row_intervals(t, i, iv);
                    std::vector<std::uint8_t> a(static_cast<std::size_t>(c.n), 0);
                    for (std::size_t x = 0; x < iv.size(); ++x) {
                        REQUIRE(iv[x].lo < iv[x].hi);
                        if (x > 0) REQUIRE(iv[x - 1].hi < iv[x].lo);  // sorted, disjoint, not adjacent
                        for (auto j = iv[x].lo; j < iv[x].hi; ++j) a[static_cast<std::size_t>(j)] = 1;
                    }
                    REQUIRE(a[static_cast<std::size_t>(i)] == 1);  // every query sees itself
                    for (std::int64_t j = 0; j < c.n; ++j) {
                        INFO("i " << i << " j " << j);
                        REQUIRE((a[static_cast<std::size_t>(j)] != 0) == c.allows(t, i, j));
                        if (j > i && !o.bidirectional_images) REQUIRE_FALSE(c.allows(t, i, j));
                        if (c.token_image[static_cast<std::size_t>(i)] < 0 || c.token_image[static_cast<std::size_t>(j)] < 0)
                            REQUIRE(c.allows(t, i, j) == (j <= i));  // text rows and columns: causal dense
                    }
                }
            }
        }
}

TEST_CASE("blindsight: BlockMask equals the expanded mask for every template and block size", "[blindsight][block_mask]") {
    for (const char* spec : vt::kMaskLayouts)
        for (const auto& o : vt::mask_option_sets()) {
            const MaskContext c = make_mask_context(Layout::parse(spec), o);
            const std::int64_t n = c.n;
            const std::vector<MaskTemplate> heads = {MaskTemplate::dense, MaskTemplate::sink, MaskTemplate::document,
                                                     MaskTemplate::document_sink, MaskTemplate::sink};
            std::vector<std::pair<std::int64_t, std::int64_t>> sizes = {{1, 1}, {3, 5}, {16, 16}, {64, 7}, {n + 3, 2}};
            if (!vt::small_run()) sizes.insert(sizes.end(), {{4, 4}, {7, 2}, {n, n}});
            for (auto [qb, kb] : sizes) {
                INFO(spec << " q_block " << qb << " k_block " << kb);
                const BlockMask bm = make_block_mask(c, heads, qb, kb);
                const auto e = expand_block_mask(bm);
                std::int64_t allowed = 0;
                for (std::size_t h = 0; h < heads.size(); ++h) {
                    const auto ref = expand_mask(c, heads[h]);
                    for (std::int64_t x = 0; x < n * n; ++x) {
                        REQUIRE(e[h * n * n + x] == ref[x]);
                        allowed += ref[x];
                    }
                    // Classification is tight: full blocks are all allowed, partial blocks mixed, unlisted empty.
                    for (std::int64_t q = 0; q < bm.n_q_blocks; ++q) {
                        const std::int64_t i0 = bm.q_block_start[q], i1 = bm.q_block_start[q + 1];
                        REQUIRE(i0 < i1);
                        REQUIRE(i1 - i0 <= qb);
                        for (std::int64_t i = i0; i < i1; ++i)  // a block never mixes text rows and image rows, or two images
                            REQUIRE(c.token_image[i] == c.token_image[i0]);
                        std::vector<int> kind(static_cast<std::size_t>(bm.n_k_blocks), 0);
                        for (auto b : bm.full(h, q)) kind[b] = 1;
                        const auto prow = static_cast<std::size_t>(h * bm.n_q_blocks + q);
                        for (auto p = bm.partial_offsets[prow]; p < bm.partial_offsets[prow + 1]; ++p) {
                            const auto b = bm.partial_indices[static_cast<std::size_t>(p)];
                            REQUIRE(kind[b] == 0);
                            kind[b] = 2;
                            // [lo, hi) is the tight range of allowed keys of the block.
                            std::int64_t lo = n, hi = 0;
                            for (std::int64_t i = i0; i < i1; ++i)
                                for (std::int64_t j = b * kb; j < std::min(n, (b + 1) * kb); ++j)
                                    if (ref[i * n + j]) {
                                        lo = std::min(lo, j);
                                        hi = std::max(hi, j + 1);
                                    }
                            REQUIRE(bm.partial_key_lo[static_cast<std::size_t>(p)] == lo);
                            REQUIRE(bm.partial_key_hi[static_cast<std::size_t>(p)] == hi);
                        }
                        for (std::int64_t b = 0; b < bm.n_k_blocks; ++b) {
                            std::int64_t on = 0, all = 0;
                            for (std::int64_t i = i0; i < i1; ++i)
                                for (std::int64_t j = b * kb; j < std::min(n, (b + 1) * kb); ++j, ++all)
                                    on += ref[i * n + j];
                            REQUIRE(kind[b] == (on == 0 ? 0 : on == all ? 1 : 2));
                        }
                    }
                }
                if (qb == 1 && kb == 1) REQUIRE(bm.computed_pairs() == allowed);
                REQUIRE(bm.computed_pairs() >= allowed);
            }
        }
}

TEST_CASE("blindsight: block work scales with the allowed pairs", "[blindsight][block_mask]") {
    // 8 images of 1000 tokens with text between them, n = 8192: Document computes a small slice of n^2.
    std::string spec = "text:56";
    for (int i = 0; i < 8; ++i) spec += ",text:1,image:1000,text:1,text:" + std::to_string(i == 7 ? 8 : 16);
    const Layout L = Layout::parse(spec);
    REQUIRE(L.n() == 8192);
    const MaskContext c = make_mask_context(L);
    const std::vector<MaskTemplate> heads = {MaskTemplate::document};
    const BlockMask bm = make_block_mask(c, heads, 128, 128);
    const auto allowed = count_allowed_pairs(c, MaskTemplate::document);
    INFO("allowed " << allowed << " computed " << bm.computed_pairs());
    REQUIRE(bm.computed_pairs() <= allowed + allowed / 8);  // partial-block slack well below the masked area
    REQUIRE(static_cast<double>(allowed) < 0.2 * 8192.0 * 8193.0 / 2.0);
}

TEST_CASE("blindsight: Algorithm 1 on a hand-made case and simd vs reference", "[blindsight][characterize]") {
    const auto seed = vt::base_seed() + 11;
    INFO("seed " << seed);
    // One image: Document and Document-Sink equal Dense exactly (no other image to drop).
    {
        const Layout L = Layout::parse("text:3,image:20,text:2");
        const auto in = vt::mask_make_qkv<float>(L.n(), 2, 1, 8, seed);
        const auto r = reference::characterize_prompt(in.qv(), in.kv(), in.vv(), L);
        for (const auto& h : r) {
            REQUIRE(h.nmse[1] > 0.1);  // Sink drops most of the image: random V -> large error
            REQUIRE(h.nmse[2] <= 1e-30);
            REQUIRE(h.nmse[3] <= 1e-30);
            REQUIRE(h.chosen == MaskTemplate::document);
        }
        BlindSightParams P;
        P.alpha = 1e9;  // everything passes: the first candidate (Sink) wins
        for (const auto& h : reference::characterize_prompt(in.qv(), in.kv(), in.vv(), L, P)) REQUIRE(h.chosen == MaskTemplate::sink);
    }
    // Several images: simd and reference agree on NMSE and decisions.
    for (double alpha : {0.1, 0.5}) {
        BlindSightParams P;
        P.alpha = alpha;
        const Layout L = Layout::parse(vt::kMaskLayouts[3]);
        const auto in = vt::mask_make_qkv<bfloat16>(L.n(), 8, 2, 16, seed + 1);
        const auto r = reference::characterize_prompt(in.qv(), in.kv(), in.vv(), L, P);
        const auto s = simd::characterize_prompt(in.qv(), in.kv(), in.vv(), L, P, 8, 16);
        REQUIRE(r.size() == 8);
        for (std::size_t h = 0; h < r.size(); ++h)
            for (MaskTemplate t : kCandidateTemplates) {
                const double a = r[h].nmse[static_cast<std::size_t>(t)], b = s[h].nmse[static_cast<std::size_t>(t)];
                REQUIRE(std::abs(a - b) <= 1e-4 * std::max(a, 1e-6));
                if (std::abs(a - alpha) > 1e-4 * alpha) REQUIRE(r[h].chosen == s[h].chosen);
            }
    }
}

TEST_CASE("blindsight: Algorithm 2 thresholds are strict", "[blindsight][aggregate]") {
    auto counts = [](std::int64_t d, std::int64_t s, std::int64_t doc, std::int64_t ds) {
        TemplateCounts c;
        c.count = {d, s, doc, ds};
        return c;
    };
    using T = MaskTemplate;
    REQUIRE(aggregate_head(counts(26, 74, 0, 0)) == T::dense);          // 0.26 > 0.25
    REQUIRE(aggregate_head(counts(25, 75, 0, 0)) == T::sink);           // 0.25 not > 0.25; 0.75 > 0.6
    REQUIRE(aggregate_head(counts(0, 60, 40, 0)) == T::document_sink);  // 0.6 not > 0.6, 0.4 not > 0.6
    REQUIRE(aggregate_head(counts(10, 20, 61, 9)) == T::document);
    REQUIRE(aggregate_head(counts(0, 50, 0, 50)) == T::document_sink);
    REQUIRE(aggregate_head(counts(0, 0, 0, 1)) == T::document_sink);
    BlindSightParams P;
    P.gamma_c = 0.0;
    REQUIRE(aggregate_head(counts(1, 99, 0, 0), P) == T::dense);
    const std::vector<TemplateCounts> all = {counts(26, 74, 0, 0), counts(0, 0, 5, 0)};
    REQUIRE(aggregate(all) == std::vector<T>{T::dense, T::document});
    REQUIRE_THROWS_WITH(aggregate_head(counts(0, 0, 0, 0)), Contains("no prompts counted"));
    REQUIRE(uniform_per_kv_group(std::vector<T>{T::sink, T::document, T::sink, T::sink}, 2) ==
            std::vector<T>{T::document_sink, T::document_sink, T::sink, T::sink});
    REQUIRE(uniform_per_kv_group(std::vector<T>{T::sink, T::dense}, 1) == std::vector<T>{T::dense, T::dense});
}

TEST_CASE("blindsight: Algorithm 3 exactly as printed, against hand-computed values", "[blindsight][flops]") {
    using T = MaskTemplate;
    // Images [0,10) and [10,30), S = 40: start = 0: end = 0 -> sink 0.45*100 = 45; end = 1 -> doc-sink 180,
    // sink 180; document 200. After the loop sink += 0.45 * 400 = 180. Areas / 800.
    {
        const std::int64_t s[] = {0, 10}, e[] = {10, 30};
        const auto r = flops_reduction_paper(s, e, 40);
        REQUIRE(r[T::sink] == Approx(405.0 / 800.0).epsilon(1e-15));
        REQUIRE(r[T::document] == Approx(200.0 / 800.0).epsilon(1e-15));
        REQUIRE(r[T::document_sink] == Approx(180.0 / 800.0).epsilon(1e-15));
        REQUIRE(r[T::dense] == 0.0);
    }
    // One image: the loop does not run; only the last image's sink term: 0.45 * 100 / (0.5 * 400).
    {
        const std::int64_t s[] = {5}, e[] = {15};
        const auto r = flops_reduction_paper(s, e, 20);
        REQUIRE(r[T::sink] == Approx(45.0 / 200.0).epsilon(1e-15));
        REQUIRE(r[T::document] == 0.0);
        REQUIRE(r[T::document_sink] == 0.0);
    }
    // Three images of 2, 3, 4 tokens, S = 10: sink = 0.45*(4+9) + 0.9*(2*3+2*4+3*4) + 0.45*16 = 5.85 + 23.4 + 7.2;
    // doc-sink = 0.9 * 26 = 23.4; document = 26. original 50.
    {
        const std::int64_t s[] = {0, 2, 5}, e[] = {2, 5, 9};
        const auto r = flops_reduction_paper(s, e, 10);
        REQUIRE(r[T::sink] == Approx(36.45 / 50.0).epsilon(1e-14));
        REQUIRE(r[T::document_sink] == Approx(23.4 / 50.0).epsilon(1e-14));
        REQUIRE(r[T::document] == Approx(26.0 / 50.0).epsilon(1e-14));
        const auto rl = flops_reduction_paper(Layout::parse("image:2,image:3,image:4,text:1"));
        for (T t : kAllTemplates) REQUIRE(rl[t] == r[t]);
    }
    REQUIRE_THROWS_WITH(flops_reduction_paper(std::span<const std::int64_t>{}, std::span<const std::int64_t>{}, 4),
                        Contains("no images"));
    const std::int64_t a[] = {0}, b2[] = {1, 2};
    REQUIRE_THROWS_WITH(flops_reduction_paper(a, b2, 4), Contains("expected equal counts"));
    REQUIRE_THROWS_WITH(flops_reduction_paper(a, std::span<const std::int64_t>(b2, 1), 0), Contains("S = 0"));
}

TEST_CASE("blindsight: exact FLOPs and model totals", "[blindsight][flops]") {
    using T = MaskTemplate;
    MaskOptions o;
    o.sink_fraction = 0.25;
    const MaskContext c = make_mask_context(Layout::parse("text:2,image:4,text:1,image:4,text:1"), o);
    const auto p = allowed_pairs(c);
    REQUIRE(p[T::dense] == 78.0);
    const auto r = flops_reduction_exact(c);
    REQUIRE(r[T::dense] == 0.0);
    REQUIRE(r[T::document] == Approx(16.0 / 78.0).epsilon(1e-15));
    REQUIRE(r[T::sink] == Approx(18.0 / 78.0).epsilon(1e-15));
    REQUIRE(attention_flops(78, 128) == 4.0 * 128 * 78);
    const std::vector<T> heads = {T::dense, T::sink, T::document, T::document};
    const auto share = template_shares(heads);
    REQUIRE(share[T::document] == 0.5);
    REQUIRE(model_flops_reduction(share, r) == Approx(0.25 * 18.0 / 78.0 + 0.5 * 16.0 / 78.0).epsilon(1e-15));
    TemplateValues bad = share;
    bad[T::dense] = 0.5;
    REQUIRE_THROWS_WITH(model_flops_reduction(bad, r), Contains("shares sum to"));
    // The exact count equals the sum of the expanded mask, per template.
    for (T t : kAllTemplates) {
        std::int64_t sum = 0;
        for (auto x : expand_mask(c, t)) sum += x;
        REQUIRE(count_allowed_pairs(c, t) == sum);
    }
}

TEST_CASE("blindsight: head map JSON round trip and strict reading", "[blindsight][json]") {
    HeadMap m;
    m.layers = 2;
    m.heads = 4;
    m.kv_heads = 2;
    m.head_dim = 64;
    m.prompts = 17;
    m.params.alpha = 0.05;
    m.params.mask.sink_offsets = {0, 7};
    m.params.mask.bidirectional_images = true;
    m.map = {MaskTemplate::dense, MaskTemplate::sink, MaskTemplate::document, MaskTemplate::document_sink,
             MaskTemplate::sink, MaskTemplate::sink, MaskTemplate::dense, MaskTemplate::document};
    const ModelShape shape{2, 4, 2, 64};
    const auto path = std::filesystem::temp_directory_path() / "vlsparse_blindsight_head_map_test.json";
    save_head_map(m, path);
    const HeadMap r = load_head_map(path, shape);
    std::filesystem::remove(path);
    REQUIRE(r.map == m.map);
    REQUIRE(r.prompts == 17);
    REQUIRE(r.params.alpha == 0.05);
    REQUIRE(r.params.mask.sink_offsets == m.params.mask.sink_offsets);
    REQUIRE(r.params.mask.bidirectional_images);
    REQUIRE(r.at(1, 3) == MaskTemplate::document);
    auto j = to_json(m);
    REQUIRE(j["map"][0][3] == "Document-Sink");
    auto bad = j;
    bad["map"][1][2] = "Diagonal";
    REQUIRE_THROWS_WITH(head_map_from_json(bad, shape), Contains("map[1][2] = 'Diagonal': unknown mask template"));
    REQUIRE_THROWS_WITH(head_map_from_json(j, ModelShape{2, 4, 4, 64}), Contains("expected 2 layers, 4 heads, 4 KV heads"));
    REQUIRE_THROWS_WITH(head_map_from_json(j, ModelShape{3, 4, 2, 64}), Contains("map is for a model with 2 layers"));
    bad = j;
    bad["map"][0].erase(0);
    REQUIRE_THROWS_WITH(head_map_from_json(bad), Contains("map[0]: expected an array of 4 template names"));
    bad = j;
    bad["params"]["gamma"] = 0.5;
    REQUIRE_THROWS_WITH(head_map_from_json(bad), Contains("params.gamma: unknown key"));
    bad = j;
    bad["params"]["sink_fraction"] = 1.5;
    REQUIRE_THROWS_WITH(head_map_from_json(bad), Contains("sink_fraction = 1.5"));
    REQUIRE_THROWS_WITH(mask_template_from_string("dense"), Contains("unknown mask template 'dense'"));
    REQUIRE_THROWS_WITH(m.at(2, 0), Contains("(layer, head) = (2, 0)"));
}

TEST_CASE("blindsight: bad input is a clear error", "[blindsight][errors]") {
    const Layout L = Layout::parse("text:2,image:6,text:1,image:5,text:2");
    const std::int64_t n = L.n(), H = 4, Hkv = 2, d = 8;
    const auto in = vt::mask_make_qkv<float>(n, H, Hkv, d, 3);
    for (double f : {0.0, -0.1, 1.5, std::numeric_limits<double>::quiet_NaN()}) {
        MaskOptions o;
        o.sink_fraction = f;
        REQUIRE_THROWS_WITH(make_mask_context(L, o), Contains("sink_fraction = ") && Contains("expected 0 < sink_fraction <= 1"));
        BlindSightParams P;
        P.mask = o;
        REQUIRE_THROWS_WITH(reference::characterize_prompt(in.qv(), in.kv(), in.vv(), L, P), Contains("sink_fraction"));
        REQUIRE_THROWS_WITH(simd::characterize_prompt(in.qv(), in.kv(), in.vv(), L, P), Contains("sink_fraction"));
    }
    MaskOptions o;
    o.sink_offsets = {3, 1};
    REQUIRE_THROWS_WITH(make_mask_context(L, o), Contains("strictly ascending"));
    o.sink_offsets = {-1};
    REQUIRE_THROWS_WITH(make_mask_context(L, o), Contains("sink_offsets[0] = -1"));
    // Layout not matching n.
    const Layout L2 = Layout::parse("text:2,image:6,text:1,image:5,text:3");
    REQUIRE_THROWS_WITH(reference::characterize_prompt(in.qv(), in.kv(), in.vv(), L2), Contains("layout covers 17 tokens"));
    REQUIRE_THROWS_WITH(simd::characterize_prompt(in.qv(), in.kv(), in.vv(), L2), Contains("layout covers 17 tokens"));
    const MaskContext c2 = make_mask_context(L2);
    const std::vector<MaskTemplate> heads(H, MaskTemplate::sink);
    std::vector<float> out(static_cast<std::size_t>(n * H * d));
    const View3<float> ov(out.data(), {n, H, d});
    REQUIRE_THROWS_WITH(simd::masked_attention(in.qv(), in.kv(), in.vv(), make_block_mask(c2, heads), ov),
                        Contains("block mask covers 17 tokens, the input has 16"));
    REQUIRE_THROWS_WITH(reference::masked_attention(in.qv(), in.kv(), in.vv(), c2, heads, ov), Contains("mask covers 17 tokens"));
    const MaskContext c = make_mask_context(L);
    const std::vector<MaskTemplate> three(3, MaskTemplate::sink);
    REQUIRE_THROWS_WITH(simd::masked_attention(in.qv(), in.kv(), in.vv(), make_block_mask(c, three), ov),
                        Contains("block mask has 3 heads, q has 4"));
    REQUIRE_THROWS_WITH(reference::masked_attention(in.qv(), in.kv(), in.vv(), c, three, ov), Contains("3 head templates given"));
    REQUIRE_THROWS_WITH(make_block_mask(c, heads, 0, 4), Contains("q_block = 0"));
    REQUIRE_THROWS_WITH(make_block_mask(c, heads, 4, -2), Contains("k_block = -2"));
    BlockMask broken = make_block_mask(c, heads, 4, 4);
    broken.full_offsets.pop_back();
    REQUIRE_THROWS_WITH(simd::masked_attention(in.qv(), in.kv(), in.vv(), broken, ov), Contains("block mask is inconsistent"));
    // NaN input.
    auto qn = in.q;
    qn[5] = std::numeric_limits<float>::quiet_NaN();
    REQUIRE_THROWS_WITH(simd::masked_attention(View3<const float>(qn.data(), {n, H, d}), in.kv(), in.vv(), make_block_mask(c, heads), ov),
                        Contains("q["));
    BlindSightParams P;
    P.alpha = 0.0;
    REQUIRE_THROWS_WITH(simd::characterize_prompt(in.qv(), in.kv(), in.vv(), L, P), Contains("alpha = 0"));
    P = {};
    P.gamma_s = 1.2;
    REQUIRE_THROWS_WITH(aggregate_head(TemplateCounts{{1, 0, 0, 0}}, P), Contains("gamma_s = 1.2"));
}

TEST_CASE("blindsight: SVG pictures of masks and head maps", "[blindsight][render]") {
    const MaskContext c = make_mask_context(Layout::parse("text:2,image:4,text:1,image:4,text:1"));
    const std::string svg = mask_svg(c, MaskTemplate::document, 4);
    REQUIRE(svg.rfind("<svg", 0) == 0);
    REQUIRE(svg.find("</svg>") != std::string::npos);
    // One rectangle per run of allowed keys per row: Document rows of image B have 2 runs.
    std::size_t rects = 0;
    for (std::size_t p = svg.find("<rect class=\"on\""); p != std::string::npos; p = svg.find("<rect class=\"on\"", p + 1)) ++rects;
    std::vector<KeyInterval> iv;
    std::size_t runs = 0;
    for (std::int64_t i = 0; i < c.n; ++i) {
        c.row_intervals(MaskTemplate::document, i, iv);
        runs += iv.size();
    }
    REQUIRE(rects == runs);
    HeadMap m;
    m.layers = 2;
    m.heads = 2;
    m.kv_heads = 1;
    m.head_dim = 8;
    m.map = {MaskTemplate::dense, MaskTemplate::sink, MaskTemplate::document, MaskTemplate::document_sink};
    const std::string hm = head_map_svg(m, 10);
    REQUIRE(hm.find("Document-Sink") != std::string::npos);
}

namespace {

std::filesystem::path golden_dir() {
    if (const char* d = std::getenv("VLSPARSE_GOLDEN_DIR")) return std::filesystem::path(d) / "blindsight";
    return std::filesystem::path(VLSPARSE_SOURCE_DIR) / "golden" / "blindsight";
}

std::vector<std::filesystem::path> golden_cases() {
    std::vector<std::filesystem::path> out;
    for (const auto& e : std::filesystem::directory_iterator(golden_dir()))
        if (e.is_directory()) out.push_back(e.path());
    std::sort(out.begin(), out.end());
    return out;
}

template <class Backend>
void check_golden_case(const std::filesystem::path& dir, const char* backend) {
    INFO("case " << dir.string() << ", backend " << backend);
    GoldenManifest m;
    const auto inputs = golden::read_blindsight_inputs(dir, &m);
    vt::check_golden_outputs(dir, m, golden::run_blindsight_case<Backend>(inputs), golden::blindsight_output_metric,
                            vt::precision_of(backend));
}

}  // namespace

TEST_CASE("golden blindsight: the suite covers the required cases", "[blindsight][golden]") {
    const auto all = golden_cases();
    REQUIRE(all.size() >= 7);
    std::set<std::int64_t> image_counts;
    std::set<std::string> dtypes;
    bool offsets = false, bidir = false, gqa = false, aggregation = false, attention = false;
    std::set<int> on_gamma;  // templates whose fraction sits exactly on its gamma in some tally (strict >)
    for (const auto& dir : all) {
        GoldenManifest m;
        const auto c = golden::read_blindsight_inputs(dir, &m);
        image_counts.insert(make_mask_context(c.layout, c.params.mask).images());
        offsets |= !c.params.mask.sink_offsets.empty();
        bidir |= c.params.mask.bidirectional_images;
        gqa |= c.H > c.Hkv && c.Hkv > 0;
        aggregation |= !c.counts.empty();
        for (std::size_t i = 0; i + 4 <= c.counts.size(); i += 4) {
            const double total = static_cast<double>(c.counts[i] + c.counts[i + 1] + c.counts[i + 2] + c.counts[i + 3]);
            const double gamma[3] = {c.params.gamma_c, c.params.gamma_s, c.params.gamma_d};
            for (int t = 0; t < 3; ++t)
                if (static_cast<double>(c.counts[i + static_cast<std::size_t>(t)]) / total == gamma[t]) on_gamma.insert(t);
        }
        attention |= !c.heads.empty();
        if (c.H > 0) dtypes.insert(c.dtype);
    }
    REQUIRE(image_counts.count(1));
    REQUIRE(image_counts.count(4));
    REQUIRE(image_counts.count(8));
    REQUIRE(dtypes == std::set<std::string>{"fp32", "bf16"});
    REQUIRE((offsets && bidir && gqa && aggregation && attention));
    REQUIRE(on_gamma == std::set<int>{0, 1, 2});
}

TEST_CASE("golden blindsight: the reference reproduces every case", "[blindsight][golden]") {
    for (const auto& dir : golden_cases()) check_golden_case<reference::BlindSightOps>(dir, "reference");
}

TEST_CASE("golden blindsight: the SIMD path meets every case's tolerances", "[blindsight][golden]") {
    // Small blocks that do not divide n, so the goldens cross block boundaries.
    for (const auto& dir : golden_cases()) check_golden_case<simd::BasicBlindSightOps<16, 24>>(dir, "simd");
}
