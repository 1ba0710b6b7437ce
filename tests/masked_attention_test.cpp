// Masked prefill attention (attention/masked.hpp, reference/masked.hpp): the SIMD path and the
// reference, both over a BlockMask, against each other and against a dense attention over the
// expanded mask, on fresh seeded inputs: every template and video mask, shapes from one token up,
// head dims below and above the SIMD width, fp32 / fp16 / bf16, GQA ratios 1 / 2 / 4 / 8, ties, the
// engine's small blockings, head-major strides, and inconsistent masks.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <vlsparse/attention/dense.hpp>
#include <vlsparse/attention/masked.hpp>
#include <vlsparse/masks/block_mask.hpp>
#include <vlsparse/masks/mask_view.hpp>
#include <vlsparse/masks/templates.hpp>
#include <vlsparse/reference/attention.hpp>
#include <vlsparse/reference/masked.hpp>

#include "mask_util.hpp"
#include "test_util.hpp"

using namespace vlsparse;
using Catch::Matchers::Contains;

TEST_CASE("masked attention: simd vs reference vs dense attention over the expanded mask", "[masked][attention]") {
    const auto seed = vt::base_seed();
    INFO("seed " << seed);
    struct Shape { const char* spec; std::int64_t H, Hkv, d, qb, kb; int opt; };
    std::vector<Shape> shapes = {
        {vt::kMaskLayouts[0], 2, 2, 8, 4, 4, 0},  {vt::kMaskLayouts[1], 4, 2, 16, 16, 16, 0}, {vt::kMaskLayouts[2], 4, 1, 5, 3, 7, 2},
        {vt::kMaskLayouts[3], 8, 1, 16, 8, 32, 1}, {vt::kMaskLayouts[3], 8, 2, 32, 32, 8, 3},  {vt::kMaskLayouts[4], 4, 4, 4, 5, 3, 0},
    };
    const auto opts = vt::mask_option_sets();
    for (const auto& s : shapes) {
        const Layout L = Layout::parse(s.spec);
        const std::int64_t n = L.n();
        INFO(s.spec << " H " << s.H << " Hkv " << s.Hkv << " d " << s.d << " blocks " << s.qb << "x" << s.kb);
        const MaskContext c = make_mask_context(L, opts[static_cast<std::size_t>(s.opt)]);
        const auto heads = vt::mixed_heads(s.H, seed + static_cast<std::uint64_t>(n));
        const BlockMask bm = make_block_mask(c, heads, s.qb, s.kb);
        auto check = [&](auto tag) {
            using T = decltype(tag);
            const auto in = vt::mask_make_qkv<T>(n, s.H, s.Hkv, s.d, seed + static_cast<std::uint64_t>(s.H * 7 + s.d));
            std::vector<double> ref(static_cast<std::size_t>(n * s.H * s.d));
            std::vector<float> simd_out(ref.size()), scal(ref.size());
            reference::masked_attention(in.qv(), in.kv(), in.vv(), c, heads, View3<double>(ref.data(), {n, s.H, s.d}));
            simd::masked_attention(in.qv(), in.kv(), in.vv(), bm, View3<float>(simd_out.data(), {n, s.H, s.d}));
            simd::masked_attention<T, T, float, simd::scalar_arch>(in.qv(), in.kv(), in.vv(), bm,
                                                                          View3<float>(scal.data(), {n, s.H, s.d}));
            const auto oracle = vt::attention_over_mask(in, expand_block_mask(bm));
            INFO("nmse ref vs oracle " << vt::nmse(ref, oracle));
            REQUIRE(vt::nmse(ref, oracle) <= 1e-24);
            REQUIRE(vt::nmse(simd_out, ref) <= vt::kSimdVsReference.attention_nmse);
            REQUIRE(vt::nmse(scal, ref) <= vt::kSimdVsReference.attention_nmse);
            REQUIRE(vt::max_abs_diff(simd_out, std::vector<float>(simd_out.size(), 0.0f)) > 0.0);  // not all zero
        };
        check(float{});
        check(bfloat16{});
    }
}

TEST_CASE("masked attention: the engine with small blocks, chunks and packing slots", "[masked][attention]") {
    // The public call uses the default blocking and a packing slot that holds every KV head here;
    // small values reach the paths large prompts take: several query blocks and key chunks per
    // item, gathered chunks of single keys, and K/V heads packed a few at a time in turn.
    const auto seed = vt::base_seed() + 77;
    INFO("seed " << seed);
    const Layout L = Layout::parse(vt::kMaskLayouts[3]);
    const std::int64_t n = L.n(), d = 16;
    const MaskContext c = make_mask_context(L, vt::mask_option_sets()[1]);
    for (const std::int64_t Hkv : {2, 4}) {
        const std::int64_t H = 8;
        const auto heads = vt::mixed_heads(H, seed + static_cast<std::uint64_t>(Hkv));
        const BlockMask bm = make_block_mask(c, heads, 8, 8);
        const auto in = vt::mask_make_qkv<float>(n, H, Hkv, d, seed + 10 + static_cast<std::uint64_t>(Hkv));
        std::vector<double> ref(static_cast<std::size_t>(n * H * d));
        reference::masked_attention(in.qv(), in.kv(), in.vv(), c, heads, View3<double>(ref.data(), {n, H, d}));
        const float scale = 1.0f / std::sqrt(static_cast<float>(d));
        for (const auto blocking : {simd::detail::Blocking{1, 1}, simd::detail::Blocking{4, 3}, simd::detail::Blocking{7, 16}}) {
            for (const std::int64_t pack : {std::int64_t{1}, std::int64_t{4096}, simd::detail::kMaskedPackBytes}) {
                INFO("H_kv " << Hkv << ", q_block " << blocking.q_block << ", k_chunk " << blocking.k_chunk
                             << ", pack_bytes " << pack);
                std::vector<float> out(ref.size(), -1.0f);
                simd::detail::run_masked_attention<simd::detail::native_arch>(
                    in.qv(), in.kv(), in.vv(), bm, View3<float>(out.data(), {n, H, d}), scale, blocking, pack);
                REQUIRE(vt::nmse(out, ref) <= vt::kSimdVsReference.attention_nmse);
            }
        }
    }
}

TEST_CASE("masked attention: the Dense template equals dense causal attention; head-major strides", "[masked][attention]") {
    const auto seed = vt::base_seed() + 5;
    INFO("seed " << seed);
    const Layout L = Layout::parse(vt::kMaskLayouts[1]);
    const std::int64_t n = L.n(), H = 4, Hkv = 2, d = 12;
    const auto in = vt::mask_make_qkv<float>(n, H, Hkv, d, seed);
    const MaskContext c = make_mask_context(L);
    const std::vector<MaskTemplate> heads(H, MaskTemplate::dense);
    std::vector<double> a(static_cast<std::size_t>(n * H * d)), b(a.size());
    reference::masked_attention(in.qv(), in.kv(), in.vv(), c, heads, View3<double>(a.data(), {n, H, d}));
    reference::dense_attention(in.qv(), in.kv(), in.vv(), View3<double>(b.data(), {n, H, d}));
    REQUIRE(a == b);
    // Head-major K/V (strides {d, n*d, 1}) give the same output as token-major.
    std::vector<float> khm(in.k.size()), vhm(in.v.size());
    for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t g = 0; g < Hkv; ++g)
            for (std::int64_t x = 0; x < d; ++x) {
                khm[static_cast<std::size_t>((g * n + i) * d + x)] = in.k[static_cast<std::size_t>((i * Hkv + g) * d + x)];
                vhm[static_cast<std::size_t>((g * n + i) * d + x)] = in.v[static_cast<std::size_t>((i * Hkv + g) * d + x)];
            }
    const auto mh = vt::mixed_heads(H, seed);
    const BlockMask bm = make_block_mask(c, mh, 8, 8);
    std::vector<float> o1(a.size()), o2(a.size());
    simd::masked_attention(in.qv(), in.kv(), in.vv(), bm, View3<float>(o1.data(), {n, H, d}));
    simd::masked_attention(in.qv(), head_major<const float>(khm.data(), n, Hkv, d),
                           head_major<const float>(vhm.data(), n, Hkv, d), bm, View3<float>(o2.data(), {n, H, d}));
    REQUIRE(vt::nmse(o1, o2) <= vt::kSimdVsReference.attention_nmse);
}

TEST_CASE("masked attention: reference and simd over one BlockMask, shapes, dtypes, GQA ratios, video masks",
          "[masked][attention]") {
    // The reference evaluates every (query, key) pair of the mask's context and templates; the SIMD
    // path reads the block lists. Both take the same BlockMask, as an engine would pass it.
    const auto seed = vt::base_seed() + 300;
    INFO("seed " << seed);
    struct Case {
        const char* layout;
        std::int64_t H, Hkv, d, qb, kb;
        VideoMask video;  // none: the image templates (mixed per head); else that video mask, Dense template
    };
    const std::vector<Case> cases = {
        {"text:1", 1, 1, 1, 4, 4, VideoMask::none},                       // one token
        {"image:3", 2, 1, 3, 2, 2, VideoMask::none},                      // shorter than a SIMD register
        {vt::kMaskLayouts[0], 4, 4, 17, 8, 8, VideoMask::none},           // GQA 1, d not a multiple of 8
        {vt::kMaskLayouts[1], 4, 2, 8, 16, 5, VideoMask::none},           // GQA 2
        {vt::kMaskLayouts[2], 4, 1, 16, 3, 7, VideoMask::none},           // GQA 4
        {vt::kMaskLayouts[3], 8, 1, 64, 32, 32, VideoMask::none},         // GQA 8, 8 images
        {"text:3,video:4x5,text:2", 2, 1, 8, 4, 4, VideoMask::spatial_temporal},
        {"text:2,video:5x3[1x3],text:1,image:6,text:1", 4, 2, 12, 3, 5, VideoMask::temporal},
        {"text:5,video:6x9,text:7", 8, 2, 24, 16, 16, VideoMask::atrous},
        {"text:2,video:3x8,text:1", 4, 4, 5, 8, 3, VideoMask::local_window},
    };
    const auto opts = vt::mask_option_sets();
    for (std::size_t ci = 0; ci < cases.size(); ++ci) {
        const Case& cs = cases[ci];
        const Layout L = Layout::parse(cs.layout);
        const std::int64_t n = L.n(), H = cs.H, Hkv = cs.Hkv, d = cs.d;
        const MaskOptions& mo = opts[ci % opts.size()];
        const MaskContext c = cs.video == VideoMask::none
                                  ? make_mask_context(L, mo)
                                  : make_video_mask_context(L, {cs.video, cs.video == VideoMask::atrous ? 5 : 0, 2});
        const auto heads = cs.video == VideoMask::none ? vt::mixed_heads(H, seed + ci)
                                                       : std::vector<MaskTemplate>(static_cast<std::size_t>(H), MaskTemplate::dense);
        const BlockMask bm = make_block_mask(c, heads, cs.qb, cs.kb);
        auto run = [&](auto tag) {
            using T = decltype(tag);
            INFO(cs.layout << " H " << H << " H_kv " << Hkv << " d " << d << " blocks " << cs.qb << "x" << cs.kb << " video "
                           << to_string(cs.video) << " dtype " << dtype_name(dtype_of<T>()));
            const auto in = vt::mask_make_qkv<T>(n, H, Hkv, d, seed + 31 * ci + static_cast<std::uint64_t>(dtype_of<T>()));
            const auto size = static_cast<std::size_t>(n * H * d);
            std::vector<double> ref(size), ref_ctx(size);
            std::vector<float> simd_out(size), scal(size);
            reference::masked_attention(in.qv(), in.kv(), in.vv(), bm, View3<double>(ref.data(), {n, H, d}));
            reference::masked_attention(in.qv(), in.kv(), in.vv(), c, heads, View3<double>(ref_ctx.data(), {n, H, d}));
            REQUIRE(ref == ref_ctx);  // the BlockMask form is the pairs of its context and templates
            simd::masked_attention(in.qv(), in.kv(), in.vv(), bm, View3<float>(simd_out.data(), {n, H, d}));
            simd::masked_attention<T, T, float, simd::scalar_arch>(in.qv(), in.kv(), in.vv(), bm,
                                                                          View3<float>(scal.data(), {n, H, d}));
            REQUIRE(vt::max_abs_diff(ref, std::vector<double>(size, 0.0)) > 0.0);  // not all zero
            REQUIRE(vt::nmse(ref, vt::attention_over_mask(in, expand_block_mask(bm))) <= 1e-24);
            REQUIRE(vt::nmse(simd_out, ref) <= vt::kSimdVsReference.attention_nmse);
            REQUIRE(vt::nmse(scal, ref) <= vt::kSimdVsReference.attention_nmse);
            // Outputs in the input type (fp16 / bf16 rounding of the fp32 result) stay within the bar.
            std::vector<T> narrow(size);
            simd::masked_attention(in.qv(), in.kv(), in.vv(), bm, View3<T>(narrow.data(), {n, H, d}));
            std::vector<float> widened(size);
            for (std::size_t x = 0; x < size; ++x) widened[x] = detail::load(narrow[x]);
            REQUIRE(vt::nmse(widened, ref) <= (std::is_same_v<T, float> ? vt::kSimdVsReference.attention_nmse : 1e-4));
        };
        run(float{});
        run(half{});
        run(bfloat16{});
    }
}

TEST_CASE("masked attention: equal keys tie every score: each row is the mean of its allowed values",
          "[masked][attention]") {
    // Every key is the same row, so each query spreads its weight evenly over the keys its mask allows:
    // the output is the mean of those values, a hand-checkable result that a wrong hole, a skipped block
    // or a key counted twice would change.
    const auto seed = vt::base_seed() + 350;
    INFO("seed " << seed);
    const Layout L = Layout::parse(vt::kMaskLayouts[1]);
    const std::int64_t n = L.n(), H = 4, Hkv = 2, d = 9, group = H / Hkv;
    const MaskContext c = make_mask_context(L, vt::mask_option_sets()[1]);
    const std::vector<MaskTemplate> heads = {MaskTemplate::sink, MaskTemplate::document, MaskTemplate::document_sink,
                                             MaskTemplate::dense};
    const BlockMask bm = make_block_mask(c, heads, 8, 8);
    auto in = vt::mask_make_qkv<float>(n, H, Hkv, d, seed);
    for (std::int64_t i = 1; i < n; ++i)
        for (std::int64_t x = 0; x < Hkv * d; ++x) in.k[static_cast<std::size_t>(i * Hkv * d + x)] = in.k[static_cast<std::size_t>(x)];
    std::vector<double> mean(static_cast<std::size_t>(n * H * d), 0.0);
    for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t i = 0; i < n; ++i) {
            std::int64_t cnt = 0;
            for (std::int64_t j = 0; j < n; ++j) {
                if (!c.allows(heads[static_cast<std::size_t>(h)], i, j)) continue;
                ++cnt;
                for (std::int64_t x = 0; x < d; ++x)
                    mean[static_cast<std::size_t>((i * H + h) * d + x)] += in.vv()(j, h / group, x);
            }
            for (std::int64_t x = 0; x < d; ++x) mean[static_cast<std::size_t>((i * H + h) * d + x)] /= static_cast<double>(cnt);
        }
    std::vector<double> ref(mean.size());
    std::vector<float> simd_out(mean.size());
    reference::masked_attention(in.qv(), in.kv(), in.vv(), bm, View3<double>(ref.data(), {n, H, d}));
    simd::masked_attention(in.qv(), in.kv(), in.vv(), bm, View3<float>(simd_out.data(), {n, H, d}));
    REQUIRE(vt::nmse(ref, mean) <= 1e-26);
    REQUIRE(vt::nmse(simd_out, mean) <= vt::kSimdVsReference.attention_nmse);
}

TEST_CASE("masked attention: an inconsistent BlockMask is the same clear error in both paths", "[masked][errors]") {
    const Layout L = Layout::parse("text:2,image:6,text:1");
    const std::int64_t n = L.n(), H = 2, Hkv = 1, d = 4;
    const auto in = vt::mask_make_qkv<float>(n, H, Hkv, d, vt::base_seed() + 360);
    const MaskContext c = make_mask_context(L);
    const std::vector<MaskTemplate> heads(H, MaskTemplate::sink);
    std::vector<double> out_r(static_cast<std::size_t>(n * H * d));
    std::vector<float> out_s(out_r.size());
    auto both = [&](const BlockMask& bm, const std::string& msg) {
        INFO(msg);
        REQUIRE_THROWS_WITH(reference::masked_attention(in.qv(), in.kv(), in.vv(), bm, View3<double>(out_r.data(), {n, H, d})),
                            Contains(msg));
        REQUIRE_THROWS_WITH(simd::masked_attention(in.qv(), in.kv(), in.vv(), bm, View3<float>(out_s.data(), {n, H, d})),
                            Contains(msg));
    };
    both(make_block_mask(c, std::vector<MaskTemplate>(3, MaskTemplate::sink), 4, 4), "block mask has 3 heads, q has 2");
    both(make_block_mask(make_mask_context(Layout::parse("text:2,image:6")), heads, 4, 4), "block mask covers 8 tokens");
    BlockMask bad = make_block_mask(c, heads, 4, 4);
    bad.full_offsets.pop_back();
    both(bad, "block mask is inconsistent");
    bad = make_block_mask(c, heads, 4, 4);
    bad.partial_key_hi.push_back(1);
    both(bad, "block mask is inconsistent");
}

TEST_CASE("mask views: the one pair rule equals the template and video definitions (int64 and int32 views)",
          "[masked][masks]") {
    // MaskContext::allows and the GPU kernels evaluate mask_rule_allows (masks/mask_view.hpp); the
    // header's words are template_allows && video_allows. Every pair of every template, for image
    // layouts under each option set (sinks, bidirectional images) and for every video mask.
    std::vector<std::pair<MaskContext, std::string>> ctxs;
    const auto opts = vt::mask_option_sets();
    for (const char* spec : vt::kMaskLayouts)
        for (std::size_t o = 0; o < opts.size(); ++o)
            ctxs.emplace_back(make_mask_context(Layout::parse(spec), opts[o]), std::string(spec) + " options " + std::to_string(o));
    for (VideoMask vm : kVideoMasks)
        for (const char* spec : {"text:3,video:4x5,text:2", "text:2,video:5x3[1x3],text:1,image:6,text:1"})
            for (std::int64_t window : {0, 3})
                ctxs.emplace_back(make_video_mask_context(Layout::parse(spec), {vm, window, 2}),
                                  std::string(spec) + " video " + std::string(to_string(vm)) + " window " + std::to_string(window));
    std::size_t pairs = 0;
    for (const auto& [c, name] : ctxs) {
        INFO(name);
        if (c.n > 400) continue;  // (every pair: keep it quick)
        // The same context as int32 arrays: the form the prefill kernels read.
        std::vector<std::int32_t> is(c.image_start.begin(), c.image_start.end()), ie(c.image_end.begin(), c.image_end.end()),
            ft(c.image_frame_tokens.begin(), c.image_frame_tokens.end());
        MaskContextView<std::int32_t> v32;
        v32.n = static_cast<std::int32_t>(c.n);
        v32.token_image = c.token_image.data();
        v32.token_sink = c.token_sink.data();
        v32.image_start = is.data();
        v32.image_end = ie.data();
        v32.frame_tokens = ft.empty() ? nullptr : ft.data();
        v32.bidirectional = c.bidirectional_images ? 1 : 0;
        v32.video = static_cast<int>(c.video);
        v32.video_window = static_cast<std::int32_t>(c.video_window);
        v32.video_dilation = static_cast<std::int32_t>(c.video_dilation);
        const MaskContextView<std::int64_t> v64 = c.view();
        for (MaskTemplate t : kAllTemplates)
            for (std::int64_t i = 0; i < c.n; ++i)
                for (std::int64_t j = 0; j < c.n; ++j) {
                    const bool want = c.template_allows(t, i, j) && c.video_allows(i, j);
                    const bool a = c.allows(t, i, j), b = v64.allows(static_cast<int>(t), i, j),
                               d = v32.allows(static_cast<int>(t), static_cast<std::int32_t>(i), static_cast<std::int32_t>(j));
                    if (a != want || b != want || d != want) {
                        INFO("template " << to_string(t) << " i " << i << " j " << j);
                        REQUIRE(a == want);
                        REQUIRE(b == want);
                        REQUIRE(d == want);
                    }
                    ++pairs;
                }
    }
    REQUIRE(pairs > 100000);
    // BlockMask::view: the context and the head templates.
    const MaskContext c = make_mask_context(Layout::parse(vt::kMaskLayouts[1]), opts[0]);
    const auto heads = vt::mixed_heads(4, 7);
    const BlockMask bm = make_block_mask(c, heads, 8, 8);
    const BlockMaskView<std::int64_t> bv = bm.view();
    for (std::int64_t h = 0; h < 4; ++h)
        for (std::int64_t i = 0; i < c.n; i += 3)
            for (std::int64_t j = 0; j < c.n; j += 2) REQUIRE(bv.allows(h, i, j) == bm.allows(h, i, j));
}
