// The key segments of the GPU's block-sparse prefill (masks/segment_plan.hpp), checked on the host: every
// row's computed keys, segment by segment, are exactly the keys the mask allows (no key in two segments,
// full segments wholly allowed, causal ones exactly the causal pairs, diagonal ones exactly row - delta),
// and the diagonal is taken where PureKV's temporal masks have one. The GPU tests run the kernels over the
// same plans against the reference.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <vlsparse/core/layout.hpp>
#include <vlsparse/masks/block_mask.hpp>
#include <vlsparse/masks/segment_plan.hpp>
#include <vlsparse/masks/templates.hpp>

namespace {

using namespace vlsparse;
namespace vd = vlsparse::detail;

constexpr MaskTemplate kSegPlanHeads[] = {MaskTemplate::dense, MaskTemplate::sink, MaskTemplate::document,
                                          MaskTemplate::document_sink};

// Walks every item's segments row by row against ctx.allows; returns the allowed pairs counted.
std::int64_t check_segments_exact(const MaskContext& ctx, std::span<const MaskTemplate> heads, const vd::SegmentPlan& plan) {
    std::int64_t allowed = 0;
    std::vector<KeyInterval> iv;
    for (const vd::SegmentItem& it : plan.items) {
        const MaskTemplate t = heads[static_cast<std::size_t>(it.head)];
        // Segments in key order, disjoint.
        for (int s = it.seg_begin; s < it.seg_end; ++s) {
            const vd::KeySegment& sg = plan.segs[static_cast<std::size_t>(s)];
            REQUIRE(sg.lo < sg.hi);
            if (s > it.seg_begin) REQUIRE(plan.segs[static_cast<std::size_t>(s) - 1].hi <= sg.lo);
        }
        for (std::int64_t r = it.row_lo; r < it.row_hi; ++r) {
            std::vector<std::int64_t> got;
            for (int s = it.seg_begin; s < it.seg_end; ++s) {
                const vd::KeySegment& sg = plan.segs[static_cast<std::size_t>(s)];
                for (std::int64_t j = sg.lo; j < sg.hi; ++j) {
                    const bool a = ctx.allows(t, r, j);
                    bool ok = true;  // what the segment's kind promises of the pair
                    if (sg.kind == vd::kKeySegFull) ok = a;
                    else if (sg.kind == vd::kKeySegCausal) ok = a == (j <= r);
                    else if (sg.kind == vd::kKeySegDiagonal) ok = a == (j == r - sg.delta);
                    else ok = sg.kind == vd::kKeySegGeneral;
                    if (!ok) {
                        FAIL("segment [" << sg.lo << ", " << sg.hi << ") kind " << sg.kind << " delta " << sg.delta
                                         << ", head " << it.head << ", row " << r << ", key " << j << ": allowed " << a);
                    }
                    if (a) got.push_back(j);
                }
            }
            std::vector<std::int64_t> want;
            ctx.row_intervals(t, r, iv);
            for (const auto& x : iv)
                for (std::int64_t j = x.lo; j < x.hi; ++j) want.push_back(j);
            if (got != want) FAIL("head " << it.head << " (" << to_string(t) << "), row " << r << ": the segments hold "
                                          << got.size() << " allowed keys, the mask allows " << want.size());
            allowed += static_cast<std::int64_t>(want.size());
        }
    }
    return allowed;
}

vd::SegmentPlan plan_of(const MaskContext& ctx, std::span<const MaskTemplate> heads) {
    const BlockMask bm = make_block_mask(ctx, heads, 128, 64);
    return vd::plan_key_segments(ctx, heads, bm.q_block_start, 64);
}

}  // namespace

TEST_CASE("segment plan: every row's segments hold exactly its allowed keys", "[segment_plan]") {
    const char* layouts[] = {
        "text:3,image:20,text:2",
        "text:2,image:9,text:1,text:1,image:13,text:1,text:3,image:5,text:1,image:11,text:4",
        "text:70,image:300,text:5,image:130,text:64",
        "text:5,video:6x40,text:7,image:50,text:3,video:4x33,text:2",
        "text:64,video:5x256,text:64",          // the benchmark's frames (64-aligned)
        "text:37,video:7x100,text:11",          // frames not a multiple of the tile, unaligned start
        "video:9x16,text:3,video:3x200,text:1", // frames smaller than a tile; a video first
    };
    std::vector<MaskOptions> opts(3);
    opts[1].sink_offsets = {0, 3};
    opts[2].bidirectional_images = true;
    opts[2].sink_fraction = 0.25;
    for (const char* ls : layouts) {
        const Layout layout = Layout::parse(ls);
        for (const MaskOptions& mo : opts) {
            std::vector<MaskContext> ctxs{make_mask_context(layout, mo)};
            for (VideoMask kind : kVideoMasks)
                for (std::int64_t window : {0, 7}) ctxs.push_back(make_video_mask_context(layout, {kind, window, 3}, mo));
            for (const MaskContext& ctx : ctxs) {
                INFO("layout " << ls << ", video mask " << to_string(ctx.video) << " window " << ctx.video_window
                               << ", bidirectional " << ctx.bidirectional_images);
                const vd::SegmentPlan plan = plan_of(ctx, kSegPlanHeads);
                const std::int64_t allowed = check_segments_exact(ctx, kSegPlanHeads, plan);
                CHECK(plan.allowed == allowed);
                CHECK(plan.computed >= plan.allowed);
                CHECK(plan.block_pairs == make_block_mask(ctx, kSegPlanHeads, 128, 64).computed_pairs());
                // Every (head, query block) is one item.
                CHECK(plan.items.size() == 4 * (detail::query_block_starts(ctx, 128).size() - 1));
            }
        }
    }
}

TEST_CASE("segment plan: the temporal key one frame back is a diagonal", "[segment_plan]") {
    const Layout layout = Layout::parse("text:37,video:7x100,text:11");
    const MaskTemplate dense[] = {MaskTemplate::dense};
    for (VideoMask kind : {VideoMask::temporal, VideoMask::spatial_temporal}) {
        INFO(to_string(kind));
        const MaskContext ctx = make_video_mask_context(layout, {kind, 0, 2});
        const vd::SegmentPlan plan = plan_of(ctx, dense);
        // Frames 2 .. 6 (frame 1's key one frame back lies in frame 0, which every frame sees whole).
        CHECK(plan.diagonal_rows == 5 * 100);
        std::int64_t diag_segs = 0;
        for (const auto& s : plan.segs)
            if (s.kind == vd::kKeySegDiagonal) {
                ++diag_segs;
                CHECK(s.delta == 100);
                CHECK(s.hi - s.lo == 100);
            }
        CHECK(diag_segs == 5);
        // The Sink template sees only the video's sinks: no diagonal.
        const MaskTemplate sink[] = {MaskTemplate::sink};
        CHECK(plan_of(ctx, sink).diagonal_rows == 0);
    }
    // Other video masks and plain templates have none.
    for (VideoMask kind : {VideoMask::spatial, VideoMask::local_window, VideoMask::atrous})
        CHECK(plan_of(make_video_mask_context(layout, {kind, 0, 2}), dense).diagonal_rows == 0);
    CHECK(plan_of(make_mask_context(layout), dense).diagonal_rows == 0);
}

TEST_CASE("segment plan: computed pairs of the benchmark's spatial-temporal mask", "[segment_plan]") {
    // The GPU benchmark's layout at 32K: 64 text tokens, a video of 256-token frames, 64 text tokens.
    // "CUDA III" asks for computed pairs <= 1.15x the allowed ones; without the diagonal the previous
    // frame's key cost a 128-key strip per query block (1.30x).
    const std::int64_t n = 32768, frames = (n - 128) / 256;
    const Layout layout = Layout::parse("text:64,video:" + std::to_string(frames) + "x256,text:" +
                                        std::to_string(n - 64 - frames * 256));
    const MaskContext ctx = make_video_mask_context(layout, {VideoMask::spatial_temporal, 0, 2});
    const MaskTemplate dense[] = {MaskTemplate::dense};
    const vd::SegmentPlan plan = plan_of(ctx, dense);
    const double ratio = static_cast<double>(plan.computed) / static_cast<double>(plan.allowed);
    INFO("computed / allowed = " << ratio);
    CHECK(plan.diagonal_rows == (frames - 2) * 256);
    CHECK(ratio <= 1.15);
}

TEST_CASE("segment plan: bad arguments", "[segment_plan]") {
    const MaskContext ctx = make_mask_context(Layout::parse("text:3,image:20,text:2"));
    const MaskTemplate dense[] = {MaskTemplate::dense};
    CHECK_THROWS_WITH(vd::plan_key_segments(ctx, dense, {0, 25}, 0), Catch::Contains("kb = 0"));
    CHECK_THROWS_WITH(vd::plan_key_segments(ctx, dense, {0, 10}, 64), Catch::Contains("do not cover"));
}

TEST_CASE("segment plan: block_counts against a pair-by-pair count", "[segment_plan]") {
    // The per-block counts and trimmed key ranges the plan (and make_block_mask) are cut from: counted
    // here pair by pair, on images with sink runs and sink offsets with gaps, and on videos under every
    // video mask, for key blocks of 1, 5, 64 and more than n.
    std::vector<MaskContext> ctxs;
    MaskOptions gaps, runs, bidir;
    gaps.sink_offsets = {0, 2, 3, 9};
    runs.sink_offsets = {1, 2, 3};
    bidir.bidirectional_images = true;
    for (const MaskOptions& mo : {MaskOptions{}, gaps, runs, bidir})
        ctxs.push_back(make_mask_context(Layout::parse("text:3,image:40,text:5,image:70,text:2,image:33,text:4"), mo));
    for (VideoMask kind : kVideoMasks)
        ctxs.push_back(make_video_mask_context(Layout::parse("text:9,video:5x23,text:4,image:30,text:2"), {kind, 5, 2}, gaps));
    for (const MaskContext& c : ctxs) {
        const auto qs = detail::query_block_starts(c, 16);
        const auto nqb = static_cast<std::int64_t>(qs.size()) - 1;
        for (std::int64_t kb : {std::int64_t{1}, std::int64_t{5}, std::int64_t{64}, c.n + 3}) {
            const std::int64_t nkb = (c.n + kb - 1) / kb;
            for (MaskTemplate t : kAllTemplates) {
                INFO("video mask " << to_string(c.video) << ", bidirectional " << c.bidirectional_images << ", template "
                                   << to_string(t) << ", kb " << kb);
                const vd::BlockStats st = vd::block_counts(c, t, qs, kb, nkb);
                std::vector<std::int64_t> cnt(static_cast<std::size_t>(nqb * nkb), 0), lo(cnt.size(), c.n), hi(cnt.size(), 0);
                for (std::int64_t qb = 0; qb < nqb; ++qb)
                    for (std::int64_t i = qs[static_cast<std::size_t>(qb)]; i < qs[static_cast<std::size_t>(qb) + 1]; ++i)
                        for (std::int64_t j = 0; j < c.n; ++j)
                            if (c.allows(t, i, j)) {
                                const auto b = static_cast<std::size_t>(qb * nkb + j / kb);
                                ++cnt[b];
                                lo[b] = std::min(lo[b], j);
                                hi[b] = std::max(hi[b], j + 1);
                            }
                CHECK(st.cnt == cnt);
                CHECK(st.lo == lo);
                CHECK(st.hi == hi);
            }
        }
    }
}
