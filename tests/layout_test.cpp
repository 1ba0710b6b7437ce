// Tests of Layout: the spec grammar, queries, from_token_ids and every malformed layout.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include <vlsparse/core/error.hpp>
#include <vlsparse/core/layout.hpp>
#include "error_of.hpp"

using Catch::Matchers::Contains;
using Catch::Matchers::Matches;
using vlsparse::Layout;
using vlsparse::Segment;
using vlsparse::SegmentKind;

namespace {
using vt::error_of;
}  // namespace

TEST_CASE("Layout::parse: text, image, video", "[layout]") {
    const Layout l = Layout::parse("text:35,image:576,text:22");
    REQUIRE(l.size() == 3);
    CHECK(l.n() == 633);
    CHECK(l[0].kind == SegmentKind::text);
    CHECK(l[0].start == 0);
    CHECK(l[0].length == 35);
    CHECK(l[1].kind == SegmentKind::image);
    CHECK(l[1].start == 35);
    CHECK(l[1].length == 576);
    CHECK(l[1].grid_h == 0);
    CHECK(l[2].start == 611);
    CHECK(l[2].end() == 633);
    CHECK(l[1].is_visual());
    CHECK_FALSE(l[2].is_visual());

    const Layout g = Layout::parse("text:1,image:576[24x24],text:1,image:4[1x4]");
    REQUIRE(g.size() == 4);
    CHECK(g[1].grid_h == 24);
    CHECK(g[1].grid_w == 24);
    CHECK(g[3].start == 578);
    CHECK(g[3].grid_h == 1);
    CHECK(g[3].grid_w == 4);

    const Layout v = Layout::parse("text:14,video:64x144,text:30");
    REQUIRE(v.size() == 3);
    CHECK(v[1].kind == SegmentKind::video);
    CHECK(v[1].frames == 64);
    CHECK(v[1].tokens_per_frame == 144);
    CHECK(v[1].length == 64 * 144);
    CHECK(v.n() == 14 + 64 * 144 + 30);

    const Layout vg = Layout::parse("video:4x6[2x3]");
    CHECK(vg[0].grid_h == 2);
    CHECK(vg[0].grid_w == 3);
    CHECK(vg[0].frames == 4);
    CHECK(vg.n() == 24);

    // Whitespace anywhere is ignored.
    CHECK(Layout::parse(" text : 3 ,\timage:4 [2 x 2]\n") == Layout::parse("text:3,image:4[2x2]"));
    // Equality compares every field.
    CHECK_FALSE(Layout::parse("text:3,image:4") == Layout::parse("text:3,image:4[2x2]"));
    CHECK_FALSE(Layout::parse("text:3,image:4") == Layout::parse("text:3,text:4"));
}

TEST_CASE("Layout::to_string round trip", "[layout]") {
    for (const char* spec : {"text:35,image:576,text:22", "text:14,video:64x144,text:30", "image:576[24x24]",
                             "text:1,video:8x4[2x2],text:1,image:9[3x3],text:2", "text:1"}) {
        const Layout l = Layout::parse(spec);
        CHECK(l.to_string() == spec);
        CHECK(Layout::parse(l.to_string()) == l);
    }
    const Layout p({Segment::text(0, 2), Segment::image(2, 6, 2, 3), Segment::video(8, 3, 4, 2, 2), Segment::text(20, 1)});
    CHECK(p.to_string() == "text:2,image:6[2x3],video:3x4[2x2],text:1");
    CHECK(Layout::parse(p.to_string()) == p);
    CHECK(Layout::text_only(7).to_string() == "text:7");
}

TEST_CASE("Layout queries: segment_of, kind_at, text_mask, count", "[layout]") {
    const Layout l = Layout::parse("text:2,image:3,text:1,video:2x2");
    REQUIRE(l.n() == 10);
    const std::size_t seg[] = {0, 0, 1, 1, 1, 2, 3, 3, 3, 3};
    for (std::int64_t p = 0; p < 10; ++p) CHECK(l.segment_of(p) == seg[p]);
    CHECK(l.kind_at(0) == SegmentKind::text);
    CHECK(l.kind_at(2) == SegmentKind::image);
    CHECK(l.kind_at(4) == SegmentKind::image);
    CHECK(l.kind_at(5) == SegmentKind::text);
    CHECK(l.kind_at(9) == SegmentKind::video);
    CHECK(l.is_text(5));
    CHECK_FALSE(l.is_text(6));
    CHECK(l.text_mask() == std::vector<std::uint8_t>{1, 1, 0, 0, 0, 1, 0, 0, 0, 0});
    CHECK(l.count(SegmentKind::text) == 3);
    CHECK(l.count(SegmentKind::image) == 3);
    CHECK(l.count(SegmentKind::video) == 4);
    CHECK_THROWS_WITH(l.segment_of(10), Contains("Layout::segment_of") && Contains("pos = 10") &&
                                            Contains("0 <= pos < 10"));
    CHECK_THROWS_WITH(l.segment_of(-1), Contains("pos = -1"));
    CHECK_NOTHROW(l.require_tokens(10, "my_policy"));
    CHECK_THROWS_WITH(l.require_tokens(11, "my_policy"),
                      Contains("my_policy: layout covers 10 tokens") && Contains("the input has 11 tokens"));
    CHECK(Layout().n() == 0);
    CHECK_THROWS_WITH(Layout::text_only(0), Contains("n = 0"));
}

TEST_CASE("Layout::from_token_ids", "[layout]") {
    constexpr std::int64_t IMG = 151655, VID = 151656;
    const std::vector<std::int64_t> ids{1, 2, IMG, IMG, IMG, 7, IMG, IMG, 9};
    const Layout l = Layout::from_token_ids(ids, IMG);
    CHECK(l.to_string() == "text:2,image:3,text:1,image:2,text:1");
    CHECK(l.n() == 9);

    // All image tokens, and an image at each end.
    CHECK(Layout::from_token_ids(std::vector<std::int64_t>{IMG, IMG}, IMG).to_string() == "image:2");
    CHECK(Layout::from_token_ids(std::vector<std::int64_t>{IMG, 3, IMG}, IMG).to_string() == "image:1,text:1,image:1");

    // Video frames: runs of the video id split into tokens_per_frame frames.
    const std::vector<std::int64_t> vids{5, VID, VID, VID, VID, VID, VID, 6, IMG, IMG};
    const Layout v = Layout::from_token_ids(vids, IMG, VID, 3);
    CHECK(v.to_string() == "text:1,video:2x3,text:1,image:2");
    CHECK(v[1].frames == 2);
    // Without a video id the video tokens are text.
    CHECK(Layout::from_token_ids(vids, IMG).to_string() == "text:8,image:2");

    const std::vector<std::int64_t> bad{5, VID, VID, VID, VID, 6};
    CHECK_THROWS_WITH(Layout::from_token_ids(bad, IMG, VID, 3),
                      Contains("Layout::from_token_ids") && Contains("video run at 1 has 4 tokens") &&
                          Contains("not a multiple of tokens_per_frame = 3"));
    CHECK_THROWS_WITH(Layout::from_token_ids(vids, IMG, VID, 0), Contains("tokens_per_frame = 0"));
    CHECK_THROWS_WITH(Layout::from_token_ids(std::vector<std::int64_t>{}, IMG), Contains("no token ids"));
}

TEST_CASE("Layout::parse rejects malformed specs, naming the segment", "[layout]") {
    struct Case {
        const char* spec;
        const char* pattern;  // regex the whole what() must match
    };
    const Case cases[] = {
        {"", "Layout::parse: empty layout spec.*"},
        {"  \t", "Layout::parse: empty layout spec.*"},
        {"text:3,picture:4", "Layout::parse: segment 1 'picture:4': unknown kind 'picture'.*"},
        {"text3", "Layout::parse: segment 0 'text3': expected kind:count.*"},
        {"text:3,image", "Layout::parse: segment 1 'image': expected kind:count.*"},
        {"text:0", "Layout::parse: segment 0 'text:0' has length 0.*"},
        {"text:2,image:0", "Layout::parse: segment 1 'image:0' has length 0.*"},
        {"text:3,", "Layout::parse: segment 1 is empty \\(two commas in a row, or a trailing comma\\).*"},
        {"text:3,,image:4", "Layout::parse: segment 1 is empty.*"},
        {",text:3", "Layout::parse: segment 0 is empty.*"},
        {"text:3x", "Layout::parse: segment 0 'text:3x': '3x' is not a non-negative integer"},
        {"text:", "Layout::parse: segment 0 'text:': '' is not a non-negative integer"},
        {"text:-3", "Layout::parse: segment 0 'text:-3': '-3' is not a non-negative integer"},
        {"text:1,image:abc", "Layout::parse: segment 1 'image:abc': 'abc' is not a non-negative integer"},
        {"text:99999999999999999999", "Layout::parse: segment 0 .*is not a non-negative integer"},
        {"video:64", "Layout::parse: segment 0 'video:64': expected AxB, got '64'"},
        {"video:0x144", "Layout::parse: segment 0 'video:0x144': expected frames x tokens-per-frame, both > 0"},
        {"video:4x", "Layout::parse: segment 0 'video:4x': '' is not a non-negative integer"},
        {"video:4000000000x4000000000", "Layout::parse: segment 0 .*overflows int64"},
        {"text:9000000000000000000,text:9000000000000000000", "Layout::parse: segment 1 .*overflows int64"},
        {"image:576[24x24", "Layout::parse: segment 0 'image:576\\[24x24': unterminated grid.*"},
        {"image:576[24]", "Layout::parse: segment 0 'image:576\\[24\\]': expected AxB, got '24'"},
        {"text:4[2x2]", "Layout::parse: segment 0 'text:4\\[2x2\\]': text segments have no grid"},
        {"text:1,image:576[24x25]", "Layout: segment 1 \\(image\\) grid 24x25 does not match its 576 tokens"},
        {"image:6[0x0]", "Layout::parse: segment 0 'image:6\\[0x0\\]': grid extents must be > 0"},
        {"image:6[2x0]", "Layout::parse: segment 0 'image:6\\[2x0\\]': grid extents must be > 0"},
        {"video:2x6[2x2]", "Layout: segment 0 \\(video\\) grid 2x2 does not match its 6 tokens per frame"},
        {"image:4[99999999999x99999999999]", "Layout: segment 0 \\(image\\) grid .* does not match its 4 tokens"},
    };
    for (const auto& c : cases) {
        INFO("spec: '" << c.spec << "'");
        CHECK_THROWS_AS(Layout::parse(c.spec), vlsparse::error);
        CHECK_THAT(error_of([&] { (void)Layout::parse(c.spec); }), Matches(c.pattern));
    }
}

TEST_CASE("Layout rejects malformed programmatic layouts, naming the segment", "[layout]") {
    auto msg = [](std::vector<Segment> s) { return error_of([&] { Layout l(std::move(s)); }); };
    CHECK_THAT(msg({}), Matches("Layout: a layout needs at least one segment"));
    CHECK_THAT(msg({Segment::text(0, 3), Segment::image(4, 2)}),
               Matches("Layout: segment 1 \\(image\\) starts at 4, expected 3 \\(gap after the previous segment\\)"));
    CHECK_THAT(msg({Segment::text(1, 3)}), Matches("Layout: segment 0 \\(text\\) starts at 1, expected 0 \\(gap.*"));
    CHECK_THAT(msg({Segment::text(0, 3), Segment::image(2, 2)}),
               Matches("Layout: segment 1 \\(image\\) starts at 2, expected 3 \\(overlaps the previous segment\\)"));
    CHECK_THAT(msg({Segment::text(0, 3), Segment::text(3, 0)}),
               Matches("Layout: segment 1 \\(text\\) has length 0, expected > 0"));
    CHECK_THAT(msg({Segment::image(0, -2)}), Matches("Layout: segment 0 \\(image\\) has length -2, expected > 0"));
    Segment v = Segment::video(0, 3, 4);
    v.length = 10;
    CHECK_THAT(msg({v}), Matches("Layout: segment 0 \\(video\\) has 3 frames x 4 tokens, which does not match its "
                                 "length 10"));
    Segment vbig = Segment::video(0, 1, 4);
    vbig.frames = std::int64_t{1} << 62;  // frames * tokens_per_frame would overflow
    CHECK_THAT(msg({vbig}), Contains("segment 0 (video) has 4611686018427387904 frames x 4 tokens"));
    Segment vzero = Segment::video(1, 1, 4);
    vzero.frames = 0;
    CHECK_THAT(msg({Segment::text(0, 1), vzero}), Contains("segment 1 (video) has 0 frames"));
    Segment imgf = Segment::image(0, 4);
    imgf.frames = 2;
    imgf.tokens_per_frame = 2;
    CHECK_THAT(msg({imgf}), Contains("segment 0 (image) has frames set; only video segments have frames"));
    Segment tg = Segment::text(0, 4);
    tg.grid_h = tg.grid_w = 2;
    CHECK_THAT(msg({tg}), Contains("segment 0 (text) has a grid"));
    CHECK_THAT(msg({Segment::image(0, 6, 2, 2)}), Matches("Layout: segment 0 \\(image\\) grid 2x2 does not match its "
                                                           "6 tokens"));
    CHECK_THAT(msg({Segment::image(0, 4, 4, 0)}), Contains("segment 0 (image) grid 4x0"));
    CHECK_THAT(msg({Segment::text(0, 2), Segment::video(2, 2, 6, 3, 3)}),
               Contains("segment 1 (video) grid 3x3 does not match its 6 tokens per frame"));
    CHECK_THAT(msg({Segment::text(0, INT64_MAX), Segment::text(INT64_MAX, 1)}),
               Contains("segment 1 (text) has length 1, which overflows the token count"));
    // And a valid one does not throw.
    CHECK(msg({Segment::text(0, 2), Segment::image(2, 4, 2, 2), Segment::video(6, 2, 6, 2, 3)}).empty());
}
