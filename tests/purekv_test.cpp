// PureKV: video masks against a per-pair definition written here (and their BlockMask, masked
// attention SIMD vs reference vs attention over the expanded mask), window scores / importance /
// selection SIMD vs reference on fresh seeded inputs, hand-computed cases, Spearman against
// hand-computed values with ties, the cross-layer estimator layer by layer, the golden files, and
// bad input.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <set>
#include <stdexcept>
#include <string>

#include <vlsparse/attention/masked.hpp>
#include <vlsparse/io/purekv_json.hpp>
#include <vlsparse/masks/flops.hpp>
#include <vlsparse/policies/purekv.hpp>
#include <vlsparse/policies/purekv_policy.hpp>
#include <vlsparse/reference/purekv.hpp>
#include <vlsparse/reference/purekv_golden.hpp>

#include "golden_util.hpp"
#include "mask_util.hpp"
#include "test_util.hpp"

using namespace vlsparse;
using Catch::Matchers::Contains;

namespace {

// ---------------------------------------------------------------------------------------------------
// The video masks, defined pair by pair from the layout alone (independent of MaskContext).
struct VideoPos {
    bool video = false;
    std::int64_t segment = -1, frame = 0, slot = 0, tpf = 0;
};
VideoPos video_pos(const Layout& L, std::int64_t p) {
    for (std::size_t s = 0; s < L.size(); ++s) {
        const Segment& seg = L[s];
        if (p < seg.start || p >= seg.end()) continue;
        VideoPos r;
        r.segment = static_cast<std::int64_t>(s);
        if (seg.kind == SegmentKind::video) {
            r.video = true;
            r.tpf = seg.tokens_per_frame;
            r.frame = (p - seg.start) / seg.tokens_per_frame;
            r.slot = (p - seg.start) % seg.tokens_per_frame;
        }
        return r;
    }
    return {};
}
// The mask of the Dense template with a video mask: causal everywhere, and for a video query and a key
// of the same video the rule of the kind (ARCHITECTURE.md 4.3 and the ablations).
bool direct_video_rule(const Layout& L, const VideoMaskOptions& o, std::int64_t i, std::int64_t j) {
    if (j > i) return false;
    if (j == i) return true;
    const VideoPos a = video_pos(L, i), b = video_pos(L, j);
    if (!a.video || b.segment != a.segment || o.kind == VideoMask::none) return true;
    const bool first = b.frame == 0, own = b.frame == a.frame, prev = b.frame + 1 == a.frame && b.slot == a.slot;
    const std::int64_t W = o.window > 0 ? o.window : a.tpf, dist = i - j;
    switch (o.kind) {
        case VideoMask::spatial: return first || own;
        case VideoMask::temporal: return first || prev;
        case VideoMask::spatial_temporal: return first || own || prev;
        case VideoMask::local_window: return dist < W;
        case VideoMask::atrous: {
            bool hit = false;
            for (std::int64_t t = 0; t < W; ++t) hit |= dist == t * o.dilation;
            return hit;
        }
        case VideoMask::none: break;
    }
    return true;
}

const char* const kVideoLayouts[] = {
    "text:3,video:4x5,text:2",
    "video:3x4",
    "text:2,video:5x3[1x3],text:1,image:6,text:1,video:2x4[2x2],text:2",
    "text:1,video:1x6,text:1",
    "text:2,video:6x1,text:1",
    "image:5,video:3x3,video:2x2,text:2",
};

std::vector<VideoMaskOptions> video_option_sets() {
    std::vector<VideoMaskOptions> r;
    for (VideoMask k : kVideoMasks) {
        r.push_back({k, 0, 2});
        if (k == VideoMask::local_window || k == VideoMask::atrous) {
            r.push_back({k, 3, 1});
            r.push_back({k, 2, 3});
            r.push_back({k, 7, 2});
        }
    }
    return r;
}

// ---------------------------------------------------------------------------------------------------
using vt::Qkv;

// Random Q/K/V with a few "heavy" keys (every 11th position gets +3u, queries +1.5u) so the window
// attention is peaked like a real model's, and V rows of varying magnitude.
template <class T>
Qkv<T> purekv_make_qkv(std::int64_t n, std::int64_t H, std::int64_t Hkv, std::int64_t d, std::uint64_t seed) {
    Qkv<T> r{n, H, Hkv, d, {}, {}, {}};
    auto q = vt::random_buffer<float>(static_cast<std::size_t>(n * H * d), seed, 1.0f);
    auto k = vt::random_buffer<float>(static_cast<std::size_t>(n * Hkv * d), seed + 1, 1.0f);
    auto v = vt::random_buffer<float>(static_cast<std::size_t>(n * Hkv * d), seed + 2, 1.0f);
    auto u = vt::random_buffer<float>(static_cast<std::size_t>(d), seed + 3, 1.0f);
    SplitMix64 rng(seed + 4);
    for (std::int64_t i = 0; i < n; ++i) {
        const float mag = 0.5f + static_cast<float>(rng.uniform());
        for (std::int64_t c = 0; c < d; ++c) {
            for (std::int64_t h = 0; h < H; ++h) q[static_cast<std::size_t>((i * H + h) * d + c)] += 1.5f * u[static_cast<std::size_t>(c)];
            for (std::int64_t g = 0; g < Hkv; ++g) {
                if (i % 11 == 0) k[static_cast<std::size_t>((i * Hkv + g) * d + c)] += 3.0f * u[static_cast<std::size_t>(c)];
                v[static_cast<std::size_t>((i * Hkv + g) * d + c)] *= mag;
            }
        }
    }
    for (float x : q) r.q.push_back(from_float<T>(x));
    for (float x : k) r.k.push_back(from_float<T>(x));
    for (float x : v) r.v.push_back(from_float<T>(x));
    return r;
}

double purekv_max_abs(const std::vector<double>& v) {
    double m = 0.0;
    for (double x : v) m = std::max(m, std::abs(x));
    return m;
}

// SIMD path against the reference: scores, norms and importance within the score tolerance; kept sets
// equal except at genuine near-ties of the reference's cutoff.
void check_selection_matches(const PureKVSelection& s, const PureKVSelection& r) {
    REQUIRE(s.dense == r.dense);
    REQUIRE(s.n == r.n);
    REQUIRE(s.window == r.window);
    REQUIRE(s.top_h == r.top_h);
    REQUIRE(s.source_layer == r.source_layer);
    REQUIRE(s.groups() == r.groups());
    if (r.dense) {
        REQUIRE(s.selection.indices == r.selection.indices);
        return;
    }
    const double tol = vt::kSimdVsReference.score_rel;
    for (std::int64_t g = 0; g < r.groups(); ++g) {
        INFO("group " << g);
        const auto G = static_cast<std::size_t>(g);
        const double sv = purekv_max_abs(r.v_norm[G]), si = purekv_max_abs(r.importance[G]);
        for (std::size_t j = 0; j < r.v_norm[G].size(); ++j) {
            INFO("position " << j);
            REQUIRE(std::abs(s.v_norm[G][j] - r.v_norm[G][j]) <= tol * sv);
            REQUIRE(std::abs(s.importance[G][j] - r.importance[G][j]) <= tol * si);
        }
        const auto& kr = r.selection.indices[G];
        const auto& ks = s.selection.indices[G];
        REQUIRE(kr.size() == ks.size());
        REQUIRE(kr.size() == static_cast<std::size_t>(r.top_h + r.window));
        if (kr != ks) {
            std::vector<double> sorted(r.importance[G].begin(), r.importance[G].end() - r.window);
            std::sort(sorted.begin(), sorted.end(), std::greater<double>());
            const double cutoff = sorted[static_cast<std::size_t>(r.top_h - 1)];
            std::vector<std::int64_t> diff;
            std::set_symmetric_difference(kr.begin(), kr.end(), ks.begin(), ks.end(), std::back_inserter(diff));
            for (auto j : diff) {
                INFO("kept sets differ at position " << j << ": importance " << r.importance[G][static_cast<std::size_t>(j)]
                                                     << ", cutoff " << cutoff);
                REQUIRE(std::abs(r.importance[G][static_cast<std::size_t>(j)] - cutoff) <= tol * si);
            }
        }
    }
}

void check_scores_match(const PureKVScores& s, const PureKVScores& r) {
    REQUIRE(s.layer == r.layer);
    REQUIRE(s.n == r.n);
    REQUIRE(s.window == r.window);
    REQUIRE(s.heads_per_group == r.heads_per_group);
    REQUIRE(s.groups() == r.groups());
    for (std::int64_t g = 0; g < r.groups(); ++g) {
        const auto& a = s.s[static_cast<std::size_t>(g)];
        const auto& b = r.s[static_cast<std::size_t>(g)];
        const double scale = purekv_max_abs(b);
        for (std::size_t j = 0; j < b.size(); ++j) {
            INFO("group " << g << " s[" << j << "]");
            REQUIRE(std::abs(a[j] - b[j]) <= vt::kSimdVsReference.score_rel * scale);
            if (static_cast<std::int64_t>(j) >= r.n - r.window) REQUIRE(b[j] == 0.0);  // the window holds no score
        }
    }
}

// Attention of every row over an explicit [n, n] boolean mask (same for every head), in double.
template <class T>
std::vector<double> purekv_attention_over_mask(const Qkv<T>& in, const std::vector<std::uint8_t>& mask) {
    std::vector<std::uint8_t> per_head;
    for (std::int64_t h = 0; h < in.H; ++h) per_head.insert(per_head.end(), mask.begin(), mask.end());
    return vt::attention_over_mask(in, per_head);
}

std::filesystem::path purekv_golden_root() {
    if (const char* d = std::getenv("VLSPARSE_GOLDEN_DIR")) return d;
    return std::filesystem::path(VLSPARSE_SOURCE_DIR) / "golden";
}

}  // namespace

// ===================================================================================================
// Video masks

TEST_CASE("purekv: hand-checked ST-SpAttn rows", "[purekv][masks]") {
    // positions: text 0-1 | video 2-13: frame 0 = 2-5, frame 1 = 6-9, frame 2 = 10-13 (4 slots) | text 14
    const Layout L = Layout::parse("text:2,video:3x4[2x2],text:1");
    auto row = [&](VideoMask kind, std::int64_t i, std::int64_t window = 0, std::int64_t dilation = 2) {
        const MaskContext c = make_video_mask_context(L, {kind, window, dilation});
        std::string s;
        for (std::int64_t j = 0; j < c.n; ++j) s += c.allows(MaskTemplate::dense, i, j) ? '1' : '0';
        return s;
    };
    // Query 12: frame 2, slot 2.
    REQUIRE(row(VideoMask::spatial, 12) == "111111000011100");           // text, frame 0, frame 2 up to itself
    REQUIRE(row(VideoMask::temporal, 12) == "111111001000100");          // text, frame 0, slot 2 of frame 1 (8), itself
    REQUIRE(row(VideoMask::spatial_temporal, 12) == "111111001011100");  // union
    REQUIRE(row(VideoMask::local_window, 12) == "110000000111100");      // the 4 latest tokens (window = T = 4)
    REQUIRE(row(VideoMask::atrous, 12) == "110000101010100");            // 12, 10, 8, 6 (4 keys, dilation 2)
    REQUIRE(row(VideoMask::atrous, 12, 2, 3) == "110000000100100");      // 12, 9
    // Frame 0 queries are causal within frame 0; frame 1 queries see all of frame 0.
    REQUIRE(row(VideoMask::spatial_temporal, 4) == "111110000000000");
    REQUIRE(row(VideoMask::temporal, 7) == "111111010000000");           // frame 0 (includes slot 1 = 3) and itself
    // The text query after the video is dense.
    REQUIRE(row(VideoMask::spatial_temporal, 14) == "111111111111111");
    // Exact pair counts. Causal: 15*16/2 = 120. Spatial: frame-1 rows lose nothing (frame 0 + own
    // frame = causal); frame-2 rows 10..13 lose frame 1 (4 keys each) -> 120 - 16 = 104.
    const MaskContext sp = make_video_mask_context(L, {VideoMask::spatial, 0, 2});
    REQUIRE(count_allowed_pairs(sp, MaskTemplate::dense) == 104);
    // ST: frame-2 rows get one key of frame 1 back -> 108. Temporal: frame-1 rows 6..9 keep frame 0 and
    // themselves (lose 0, 1, 2, 3 own-frame keys), frame-2 rows keep frame 0 + 1 + themselves (lose
    // 4 - 1 + 0, 1, 2, 3 = 3, 4, 5, 6) -> 120 - 6 - 18 = 96.
    REQUIRE(count_allowed_pairs(make_video_mask_context(L, {VideoMask::spatial_temporal, 0, 2}), MaskTemplate::dense) == 108);
    REQUIRE(count_allowed_pairs(make_video_mask_context(L, {VideoMask::temporal, 0, 2}), MaskTemplate::dense) == 96);
    // VideoMask::none and make_mask_context: the plain causal mask.
    REQUIRE(count_allowed_pairs(make_video_mask_context(L, {VideoMask::none, 0, 2}), MaskTemplate::dense) == 120);
}

TEST_CASE("purekv: video masks equal the per-pair definition, alone and with every template", "[purekv][masks]") {
    std::vector<KeyInterval> iv;
    for (const char* spec : kVideoLayouts) {
        const Layout L = Layout::parse(spec);
        MaskOptions mo;
        mo.sink_fraction = 0.4;
        for (const auto& o : video_option_sets()) {
            const MaskContext c = make_video_mask_context(L, o, mo);
            const MaskContext plain = make_mask_context(L, mo);
            for (MaskTemplate t : kAllTemplates) {
                INFO(spec << " mask " << to_string(o.kind) << " window " << o.window << " dilation " << o.dilation
                          << " template " << to_string(t));
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
                        const bool want = plain.allows(t, i, j) && direct_video_rule(L, o, i, j);
                        REQUIRE(c.allows(t, i, j) == want);
                        REQUIRE((a[static_cast<std::size_t>(j)] != 0) == want);
                        if (t == MaskTemplate::dense) REQUIRE(want == direct_video_rule(L, o, i, j));
                    }
                }
            }
        }
    }
}

TEST_CASE("purekv: the video mask leaves BlindSight templates unchanged when off", "[purekv][masks]") {
    for (const char* spec : kVideoLayouts) {
        const Layout L = Layout::parse(spec);
        const MaskContext plain = make_mask_context(L), off = make_video_mask_context(L, {VideoMask::none, 0, 2});
        REQUIRE(plain.video == VideoMask::none);
        for (MaskTemplate t : kAllTemplates) REQUIRE(expand_mask(plain, t) == expand_mask(off, t));
        // Query blocks of a context without a video mask are unchanged (not cut at frames).
        const auto bm = make_block_mask(plain, std::vector<MaskTemplate>{MaskTemplate::dense}, 4, 4);
        REQUIRE(bm.q_block_start == detail::query_block_starts(off, 4));
    }
}

TEST_CASE("purekv: BlockMask of every video mask equals the expanded mask", "[purekv][block_mask]") {
    for (const char* spec : kVideoLayouts) {
        const Layout L = Layout::parse(spec);
        for (const auto& o : video_option_sets()) {
            const MaskContext c = make_video_mask_context(L, o);
            const std::int64_t n = c.n;
            const std::vector<MaskTemplate> heads = {MaskTemplate::dense, MaskTemplate::sink, MaskTemplate::dense,
                                                     MaskTemplate::document_sink};
            std::vector<std::pair<std::int64_t, std::int64_t>> sizes = {{1, 1}, {3, 5}, {16, 16}, {n + 3, 2}};
            if (!vt::small_run()) sizes.insert(sizes.end(), {{2, 7}, {4, 4}, {n, n}});
            for (auto [qb, kb] : sizes) {
                INFO(spec << " mask " << to_string(o.kind) << " window " << o.window << " q_block " << qb << " k_block " << kb);
                const BlockMask bm = make_block_mask(c, heads, qb, kb);
                // Query blocks never straddle a frame boundary (nor a segment).
                for (std::int64_t b = 0; b < bm.n_q_blocks; ++b) {
                    const auto lo = bm.q_block_start[static_cast<std::size_t>(b)], hi = bm.q_block_start[static_cast<std::size_t>(b) + 1];
                    const VideoPos a = video_pos(L, lo), z = video_pos(L, hi - 1);
                    REQUIRE(a.segment == z.segment);
                    if (a.video) REQUIRE(a.frame == z.frame);
                    REQUIRE(hi - lo <= qb);
                }
                const auto e = expand_block_mask(bm);
                for (std::size_t h = 0; h < heads.size(); ++h) {
                    const auto ref = expand_mask(c, heads[h]);
                    REQUIRE(std::equal(ref.begin(), ref.end(), e.begin() + static_cast<std::ptrdiff_t>(h * n * n)));
                }
                // Work of the block kernel >= allowed pairs (exact count).
                std::int64_t allowed = 0;
                for (auto t : heads) allowed += count_allowed_pairs(c, t);
                REQUIRE(bm.computed_pairs() >= allowed);
            }
        }
    }
}

TEST_CASE("purekv: masked attention with video masks, SIMD vs reference vs the expanded mask", "[purekv][attention]") {
    const std::uint64_t seed = vt::base_seed() + 400;
    INFO("seed " << seed);
    struct Shape {
        const char* layout;
        std::int64_t H, Hkv, d, qb, kb;
    };
    std::vector<Shape> shapes = {{"text:3,video:4x5,text:2", 2, 2, 8, 4, 4},
                                 {"text:2,video:5x3[1x3],text:1,image:6,text:1,video:2x4[2x2],text:2", 4, 2, 16, 3, 5},
                                 {"text:5,video:6x9,text:7", 8, 1, 24, 16, 16}};
    if (!vt::small_run()) shapes.push_back({"text:14,video:8x36[6x6],text:11", 8, 2, 64, 32, 64});
    for (const auto& sh : shapes)
        for (VideoMask kind : kVideoMasks) {
            const Layout L = Layout::parse(sh.layout);
            const std::int64_t n = L.n();
            PureKVParams P;
            P.st = {kind, kind == VideoMask::atrous ? 5 : 0, 2};
            P.q_block = sh.qb;
            P.k_block = sh.kb;
            INFO(sh.layout << " H " << sh.H << "/" << sh.Hkv << " d " << sh.d << " mask " << to_string(kind));
            auto run = [&](auto tag) {
                using T = decltype(tag);
                const auto in = purekv_make_qkv<T>(n, sh.H, sh.Hkv, sh.d, seed + static_cast<std::uint64_t>(n));
                std::vector<float> os(static_cast<std::size_t>(n * sh.H * sh.d)), orf(os.size());
                simd::purekv_st_attention(in.qv(), in.kv(), in.vv(), L, View3<float>(os.data(), {n, sh.H, sh.d}), P);
                reference::purekv_st_attention(in.qv(), in.kv(), in.vv(), L, View3<float>(orf.data(), {n, sh.H, sh.d}), P);
                const auto oracle = purekv_attention_over_mask(in, expand_mask(purekv_mask_context(L, P), MaskTemplate::dense));
                REQUIRE(vt::nmse(orf, oracle) <= 1e-12);
                REQUIRE(vt::nmse(os, orf) <= vt::kSimdVsReference.attention_nmse);
            };
            run(float{});
            run(bfloat16{});
        }
}

// ===================================================================================================
// Scores, importance, selection

TEST_CASE("purekv: simd matches reference over shapes, dtypes, GQA ratios, groupings and budgets", "[purekv]") {
    const std::uint64_t seed = vt::base_seed() + 100;
    INFO("seed " << seed);
    struct Case {
        std::int64_t n, H, Hkv, d, window;
    };
    std::vector<Case> cases = {{1, 1, 1, 8, 1},    {7, 2, 1, 8, 3},    {33, 4, 4, 16, 32}, {100, 8, 1, 40, 16},
                               {100, 8, 2, 16, 8}, {129, 8, 8, 17, 5}, {257, 4, 2, 64, 32}};
    if (!vt::small_run()) cases.push_back({1000, 8, 1, 128, 32});
    for (const auto& c : cases)
        for (PureKVGrouping grouping : {PureKVGrouping::kv_head, PureKVGrouping::layer})
            for (int budget = 0; budget < 3; ++budget) {
                PureKVParams P;
                P.window = c.window;
                P.grouping = grouping;
                if (budget == 0) {
                    P.budget = PureKVBudget::count;
                    P.top_h = (c.n - c.window) / 3;
                } else {
                    P.budget_fraction = budget == 1 ? 0.2 : 1.0;
                }
                auto run = [&](auto tag) {
                    using T = decltype(tag);
                    INFO("n " << c.n << " H " << c.H << "/" << c.Hkv << " d " << c.d << " w " << c.window << " "
                              << to_string(grouping) << " budget " << budget << " dtype " << dtype_name(dtype_of<T>()));
                    const auto in = purekv_make_qkv<T>(c.n, c.H, c.Hkv, c.d, seed + static_cast<std::uint64_t>(c.n * 7 + c.H));
                    const auto sr = reference::purekv_window_scores(in.qv(), in.kv(), 3, P);
                    const auto ss = simd::purekv_window_scores(in.qv(), in.kv(), 3, P);
                    check_scores_match(ss, sr);
                    const auto r = reference::purekv_select(sr, in.vv(), 5, P);
                    const auto s = simd::purekv_select(sr, in.vv(), 5, P);
                    REQUIRE(r.layer == 5);
                    REQUIRE(r.source_layer == 3);
                    REQUIRE(r.top_h == purekv_top_h(c.n, P));
                    check_selection_matches(s, r);
                    // The whole SIMD path (its own scores) agrees too.
                    check_selection_matches(simd::purekv_select(ss, in.vv(), 5, P), r);
                };
                run(float{});
                run(bfloat16{});
                if (c.n <= 129) run(half{});
            }
}

TEST_CASE("purekv: window scores and importance on hand-computed inputs", "[purekv]") {
    // q = 0: every window row i (positions n-w .. n-1) spreads 1/(i+1) on each key j <= i.
    const std::int64_t n = 10, H = 4, Hkv = 2, d = 4, w = 3;
    std::vector<float> q(static_cast<std::size_t>(n * H * d), 0.0f), k = vt::random_buffer<float>(static_cast<std::size_t>(n * Hkv * d), 5);
    std::vector<float> v(static_cast<std::size_t>(n * Hkv * d), 0.0f);
    // V rows: (3, 4, 0, 0) * (j + 1) for KV head 0, (0, 0, 1, 0) * 2 for KV head 1: norms 5 (j+1) and 2.
    for (std::int64_t j = 0; j < n; ++j) {
        v[static_cast<std::size_t>((j * Hkv + 0) * d + 0)] = 3.0f * static_cast<float>(j + 1);
        v[static_cast<std::size_t>((j * Hkv + 0) * d + 1)] = 4.0f * static_cast<float>(j + 1);
        v[static_cast<std::size_t>((j * Hkv + 1) * d + 2)] = 2.0f;
    }
    const View3<const float> qv(q.data(), {n, H, d}), kv(k.data(), {n, Hkv, d}), vv(v.data(), {n, Hkv, d});
    PureKVParams P;
    P.window = w;
    P.budget = PureKVBudget::count;
    P.top_h = 3;
    const double per_head = 1.0 / 8 + 1.0 / 9 + 1.0 / 10;  // rows 7, 8, 9
    for (int backend = 0; backend < 2; ++backend) {
        INFO("backend " << (backend == 0 ? "reference" : "simd"));
        const PureKVScores s = backend == 0 ? reference::purekv_window_scores(qv, kv, 0, P)
                                            : simd::purekv_window_scores(qv, kv, 0, P);
        REQUIRE(s.groups() == 2);
        REQUIRE(s.heads_per_group == 2);
        for (std::int64_t g = 0; g < 2; ++g)
            for (std::int64_t j = 0; j < n; ++j)
                REQUIRE(s.s[static_cast<std::size_t>(g)][static_cast<std::size_t>(j)] ==
                        Approx(j < n - w ? 2.0 * per_head : 0.0).epsilon(1e-6));
        const PureKVSelection sel = backend == 0 ? reference::purekv_select(s, vv, 0, P) : simd::purekv_select(s, vv, 0, P);
        for (std::int64_t j = 0; j < n - w; ++j) {
            REQUIRE(sel.v_norm[0][static_cast<std::size_t>(j)] == Approx(5.0 * static_cast<double>(j + 1)).epsilon(1e-6));
            REQUIRE(sel.importance[0][static_cast<std::size_t>(j)] ==
                    Approx(2.0 * per_head * 5.0 * static_cast<double>(j + 1)).epsilon(1e-6));
            REQUIRE(sel.importance[1][static_cast<std::size_t>(j)] == Approx(2.0 * per_head * 2.0).epsilon(1e-6));
        }
        // KV head 0: the largest |V| wins (positions 4, 5, 6) + window; KV head 1: exact ties -> lowest positions.
        REQUIRE(sel.selection.indices[0] == std::vector<std::int64_t>{4, 5, 6, 7, 8, 9});
        REQUIRE(sel.selection.indices[1] == std::vector<std::int64_t>{0, 1, 2, 7, 8, 9});
        // Layer grouping: s sums all 4 heads, |V| is the mean of the KV heads' norms.
        PureKVParams Pl = P;
        Pl.grouping = PureKVGrouping::layer;
        const PureKVScores sl = backend == 0 ? reference::purekv_window_scores(qv, kv, 0, Pl)
                                             : simd::purekv_window_scores(qv, kv, 0, Pl);
        const PureKVSelection ll = backend == 0 ? reference::purekv_select(sl, vv, 0, Pl) : simd::purekv_select(sl, vv, 0, Pl);
        REQUIRE(ll.groups() == 1);
        REQUIRE(ll.selection.shared());
        REQUIRE(sl.s[0][0] == Approx(4.0 * per_head).epsilon(1e-6));
        REQUIRE(ll.v_norm[0][2] == Approx((15.0 + 2.0) / 2.0).epsilon(1e-6));
        REQUIRE(ll.selection.indices[0] == std::vector<std::int64_t>{4, 5, 6, 7, 8, 9});
    }
}

TEST_CASE("purekv: budgets as counts and fractions", "[purekv]") {
    PureKVParams P;
    P.window = 32;
    REQUIRE(purekv_top_h(1000, P) == 200 - 32);  // 20% of 1000 in all, window included
    P.budget_fraction = 0.25;
    REQUIRE(purekv_top_h(8 * 16, P) == 0);       // 32 = the window alone
    REQUIRE(purekv_top_h(200, P) == 50 - 32);
    P.budget_fraction = 0.1;
    REQUIRE(purekv_top_h(100, P) == 0);          // the window exceeds the budget: it is still kept
    P.budget_fraction = 1.0;
    REQUIRE(purekv_top_h(100, P) == 68);
    P.budget = PureKVBudget::count;
    P.top_h = 68;
    REQUIRE(purekv_top_h(100, P) == 68);
    P.top_h = 0;
    REQUIRE(purekv_top_h(32, P) == 0);
}

// ===================================================================================================
// Spearman

TEST_CASE("purekv: average ranks with ties", "[purekv][spearman]") {
    REQUIRE(average_ranks(std::vector<double>{10, 20, 20, 30}) == std::vector<double>{1, 2.5, 2.5, 4});
    REQUIRE(average_ranks(std::vector<double>{5, 5, 5}) == std::vector<double>{2, 2, 2});
    REQUIRE(average_ranks(std::vector<double>{3, 1, 2}) == std::vector<double>{3, 1, 2});
    REQUIRE(average_ranks(std::vector<double>{2, 1, 2, 1, 3}) == std::vector<double>{3.5, 1.5, 3.5, 1.5, 5});
}

TEST_CASE("purekv: Spearman rho and p-value against hand-computed values", "[purekv][spearman]") {
    // x = 1..5, y = 5, 6, 7, 8, 7: ranks of y 1, 2, 3.5, 5, 3.5 (tie). Centered ranks (mean 3):
    // x: -2 -1 0 1 2, y: -2 -1 0.5 2 0.5. sum xy = 4 + 1 + 0 + 2 + 1 = 8, sum xx = 10, sum yy = 9.5:
    // rho = 8 / sqrt(95) = 0.82078268166812329. With n - 2 = 3 dof, t = rho sqrt(3 / (1 - rho^2)) and
    // the closed form p = 1 - (2/pi) (atan(u) + u / (1 + u^2)), u = t / sqrt(3). (scipy's spearmanr
    // documents the same pair: 0.8207826816681233, 0.08858700531354381.)
    {
        const auto r = spearman(std::vector<double>{1, 2, 3, 4, 5}, std::vector<double>{5, 6, 7, 8, 7});
        const double rho = 8.0 / std::sqrt(95.0);
        const double t = rho * std::sqrt(3.0 / (1.0 - rho * rho)), u = t / std::sqrt(3.0);
        const double p = 1.0 - 2.0 / M_PI * (std::atan(u) + u / (1.0 + u * u));
        REQUIRE(r.n == 5);
        REQUIRE(r.rho == Approx(rho).epsilon(1e-14));
        REQUIRE(r.p_value == Approx(p).epsilon(1e-12));
        REQUIRE(r.p_value == Approx(0.08858700531354381).epsilon(1e-12));
    }
    // Ties in both, n = 4 (2 dof): x = 1, 1, 2, 3 -> ranks 1.5 1.5 3 4; y = 4, 2, 2, 9 -> 3 1.5 1.5 4.
    // Centered (mean 2.5): x -1 -1 0.5 1.5, y 0.5 -1 -1 1.5: sum xy = -0.5 + 1 - 0.5 + 2.25 = 2.25,
    // sum xx = 1 + 1 + 0.25 + 2.25 = 4.5 = sum yy: rho = 0.5. 2 dof: p = 1 - |t| / sqrt(2 + t^2).
    {
        const auto r = spearman(std::vector<double>{1, 1, 2, 3}, std::vector<double>{4, 2, 2, 9});
        const double t = 0.5 * std::sqrt(2.0 / 0.75);
        REQUIRE(r.rho == Approx(0.5).epsilon(1e-14));
        REQUIRE(r.p_value == Approx(1.0 - t / std::sqrt(2.0 + t * t)).epsilon(1e-12));
    }
    // n = 3 (1 dof, Cauchy): x = 1, 2, 3, y = 1, 3, 2 -> d = 0, -1, 1, rho = 1 - 6 * 2 / 24 = 0.5;
    // p = 1 - (2/pi) atan(|t|).
    {
        const auto r = spearman(std::vector<double>{1, 2, 3}, std::vector<double>{1, 3, 2});
        const double t = 0.5 * std::sqrt(1.0 / 0.75);
        REQUIRE(r.rho == Approx(0.5).epsilon(1e-14));
        REQUIRE(r.p_value == Approx(1.0 - 2.0 / M_PI * std::atan(t)).epsilon(1e-12));
    }
    // Without ties rho equals Eq. 7: 1 - 6 sum d^2 / (n (n^2 - 1)).
    {
        const std::vector<double> x = {0.3, 1.7, -2.0, 5.5, 4.0, 0.9, 2.2}, y = {1.0, 0.0, -1.0, 3.0, 4.0, 2.0, 0.5};
        const auto rx = average_ranks(x), ry = average_ranks(y);
        double d2 = 0.0;
        for (std::size_t i = 0; i < x.size(); ++i) d2 += (rx[i] - ry[i]) * (rx[i] - ry[i]);
        REQUIRE(spearman(x, y).rho == Approx(1.0 - 6.0 * d2 / (7.0 * 48.0)).epsilon(1e-14));
    }
    // Perfect agreement and perfect reversal: p = 0; symmetric.
    {
        const auto a = spearman(std::vector<double>{1, 2, 3, 4}, std::vector<double>{10, 20, 30, 40});
        REQUIRE(a.rho == 1.0);
        REQUIRE(a.p_value == 0.0);
        const auto b = spearman(std::vector<double>{1, 2, 3, 4}, std::vector<double>{4, 3, 2, 1});
        REQUIRE(b.rho == -1.0);
        REQUIRE(b.p_value == 0.0);
        const auto c = spearman(std::vector<double>{4, 3, 2, 1}, std::vector<double>{1, 2, 3, 4});
        REQUIRE(c.rho == b.rho);
    }
    // Monotonic transforms do not change rho.
    {
        const std::vector<double> x = {0.1, 0.7, 0.3, 0.9, 0.5, 0.2}, y = {3, 1, 2, 6, 5, 4};
        std::vector<double> ex;
        for (double v : x) ex.push_back(std::exp(10 * v));
        REQUIRE(spearman(x, y).rho == spearman(ex, y).rho);
    }
}

TEST_CASE("purekv: t p-values and the incomplete beta function against closed forms", "[purekv][spearman]") {
    for (double t : {0.0, 0.3, 1.0, 2.5, 7.0, 40.0}) {
        INFO("t " << t);
        REQUIRE(student_t_two_sided_p(t, 1) == Approx(1.0 - 2.0 / M_PI * std::atan(t)).margin(1e-14));
        REQUIRE(student_t_two_sided_p(-t, 2) == Approx(1.0 - t / std::sqrt(2.0 + t * t)).margin(1e-14));
        const double u = t / std::sqrt(3.0);
        REQUIRE(student_t_two_sided_p(t, 3) == Approx(1.0 - 2.0 / M_PI * (std::atan(u) + u / (1.0 + u * u))).margin(1e-14));
        // 4 dof: P(|T| >= t) = 1 - (t / sqrt(4 + t^2)) (1 + 2 / (4 + t^2)).
        const double s = 4.0 + t * t;
        REQUIRE(student_t_two_sided_p(t, 4) == Approx(1.0 - t / std::sqrt(s) * (1.0 + 2.0 / s)).margin(1e-14));
    }
    REQUIRE(student_t_two_sided_p(INFINITY, 5) == 0.0);
    // Large dof approaches the normal: P(|Z| >= 1.96) = erfc(1.96 / sqrt 2).
    REQUIRE(student_t_two_sided_p(1.96, 1e6) == Approx(std::erfc(1.96 / std::sqrt(2.0))).epsilon(1e-5));
    // I_x(1/2, 1/2) = (2/pi) asin(sqrt x); I_x(a, 1) = x^a; I_x(1, b) = 1 - (1 - x)^b; symmetry.
    for (double x : {0.01, 0.3, 0.5, 0.77, 0.999}) {
        INFO("x " << x);
        REQUIRE(regularized_incomplete_beta(0.5, 0.5, x) == Approx(2.0 / M_PI * std::asin(std::sqrt(x))).epsilon(1e-13));
        REQUIRE(regularized_incomplete_beta(3.5, 1.0, x) == Approx(std::pow(x, 3.5)).epsilon(1e-13));
        REQUIRE(regularized_incomplete_beta(1.0, 7.0, x) == Approx(1.0 - std::pow(1.0 - x, 7.0)).epsilon(1e-13));
        REQUIRE(regularized_incomplete_beta(2.0, 9.0, x) + regularized_incomplete_beta(9.0, 2.0, 1.0 - x) ==
                Approx(1.0).epsilon(1e-13));
    }
    // Large a (the p-value of a few thousand tokens): a numerically integrated value (numpy trapz on
    // 2e6 points of the beta density over [0.9, 0.99]; agrees to 1e-9).
    REQUIRE(regularized_incomplete_beta(2300.0, 0.5, 0.99) == Approx(1.0534119157e-11).epsilon(1e-8));
}

// ===================================================================================================
// The estimator

TEST_CASE("purekv: the estimator layer by layer, SIMD vs reference, against the free functions", "[purekv][estimator]") {
    const std::uint64_t seed = vt::base_seed() + 200;
    INFO("seed " << seed);
    const Layout layout = Layout::parse("text:9,video:5x12[3x4],text:13");
    const std::int64_t n = layout.n(), L = 6, H = 8, Hkv = 2, d = 16;
    const ModelShape shape{L, H, Hkv, d};
    for (PureKVLowerLayers lower : {PureKVLowerLayers::own_scores, PureKVLowerLayers::dense}) {
        PureKVParams P;
        P.window = 10;
        P.lower_layers = lower;
        P.st_start_layer = 3;
        P.q_block = 8;
        P.k_block = 16;
        INFO("lower_layers " << to_string(lower));
        std::vector<Qkv<float>> layers;
        for (std::int64_t l = 0; l < L; ++l) layers.push_back(purekv_make_qkv<float>(n, H, Hkv, d, seed + static_cast<std::uint64_t>(l) * 10));
        simd::PureKVEstimator es(P, layout, shape);
        reference::PureKVEstimator er(P, layout, shape);
        REQUIRE(es.block_mask() != nullptr);
        REQUIRE(er.block_mask() == nullptr);  // the reference evaluates the context pair by pair
        for (std::int64_t l = 0; l < L; ++l) {
            INFO("layer " << l);
            const auto& in = layers[static_cast<std::size_t>(l)];
            const bool needs = l == P.l0 || (l < P.l0 && lower == PureKVLowerLayers::own_scores);
            REQUIRE(es.needs_scores(l) == needs);
            if (l > P.l0) REQUIRE_THROWS_WITH(es.observe(l, in.qv(), in.kv()), Contains("reuse l0's scores"));
            if (needs) {
                REQUIRE_THROWS_WITH(es.select(l, in.vv()), Contains("call observe(" + std::to_string(l)));
                check_scores_match(es.observe(l, in.qv(), in.kv()), er.observe(l, in.qv(), in.kv()));
                REQUIRE(es.observed(l));
            }
            // Prefill attention: dense causal below st_start_layer, ST-masked from it on.
            REQUIRE(es.masked(l) == (l >= P.st_start_layer));
            std::vector<float> os(static_cast<std::size_t>(n * H * d)), orf(os.size()), od(os.size());
            es.attention(l, in.qv(), in.kv(), in.vv(), View3<float>(os.data(), {n, H, d}));
            er.attention(l, in.qv(), in.kv(), in.vv(), View3<float>(orf.data(), {n, H, d}));
            REQUIRE(vt::nmse(os, orf) <= vt::kSimdVsReference.attention_nmse);
            reference::dense_attention(in.qv(), in.kv(), in.vv(), View3<float>(od.data(), {n, H, d}));
            if (l < P.st_start_layer) REQUIRE(vt::nmse(orf, od) <= 1e-12);
            else REQUIRE(vt::nmse(orf, od) > 1e-6);  // the ST mask changes video rows
            // Selection: l0's scores above l0 (Eq. 4), the layer's own at and below it (Eq. 3).
            const PureKVSelection ss = es.select(l, in.vv()), sr = er.select(l, in.vv());
            check_selection_matches(ss, sr);
            if (l < P.l0 && lower == PureKVLowerLayers::dense) {
                REQUIRE(sr.dense);
                REQUIRE(sr.selection.indices[0].size() == static_cast<std::size_t>(n));
                continue;
            }
            REQUIRE(sr.source_layer == std::min(l, P.l0));
            const PureKVSelection direct = reference::purekv_select(er.scores(l), in.vv(), l, P);
            REQUIRE(direct.selection.indices == sr.selection.indices);
            REQUIRE(sr.selection.scores == sr.importance);
            // Eviction into the KvCache.
            KvCache<float> cache(Hkv, d);
            cache.assign(in.kv(), in.vv());
            purekv_evict(cache, ss);
            for (std::int64_t g = 0; g < Hkv; ++g) {
                const auto pos = cache.positions(g);
                const auto want = ss.selection.for_kv_head(g);
                REQUIRE(std::vector<std::int64_t>(pos.begin(), pos.end()) == std::vector<std::int64_t>(want.begin(), want.end()));
                for (std::size_t r = 0; r < pos.size(); ++r)
                    for (std::int64_t c = 0; c < d; ++c) REQUIRE(cache.v(g)(static_cast<std::int64_t>(r), c) == in.vv()(pos[r], g, c));
            }
            // Validation above l0: SIMD vs reference.
            if (l > P.l0) {
                const auto vs = es.validate(l, in.qv(), in.kv(), in.vv()), vr = er.validate(l, in.qv(), in.kv(), in.vv());
                REQUIRE(vr.layer == l);
                REQUIRE(vr.source_layer == P.l0);
                REQUIRE(vr.groups.size() == static_cast<std::size_t>(Hkv));
                for (std::size_t g = 0; g < vr.groups.size(); ++g) {
                    REQUIRE(vr.groups[g].n == n - P.window);
                    REQUIRE(vs.groups[g].rho == Approx(vr.groups[g].rho).margin(1e-4));
                }
            }
        }
    }
}

TEST_CASE("purekv: validation is rho = 1 against itself and matches a direct Spearman", "[purekv][estimator]") {
    const Layout layout = Layout::parse("text:4,video:4x10,text:6");
    const std::int64_t n = layout.n(), H = 4, Hkv = 2, d = 16;
    const auto a = purekv_make_qkv<float>(n, H, Hkv, d, vt::base_seed() + 300);
    const auto b = purekv_make_qkv<float>(n, H, Hkv, d, vt::base_seed() + 301);
    PureKVParams P;
    P.window = 8;
    P.l0 = 0;
    reference::PureKVEstimator est(P, layout, {3, H, Hkv, d});
    est.observe(0, a.qv(), a.kv());
    // Layer 1 with layer 0's q, k: its own scores are l0's, so the rankings agree exactly.
    const auto same = est.validate(1, a.qv(), a.kv(), b.vv());
    for (const auto& g : same.groups) {
        REQUIRE(g.rho == Approx(1.0).margin(1e-12));
        REQUIRE(g.p_value < 1e-12);
    }
    // Layer 2 with other q, k: Spearman of the two importance vectors over [0, n - w).
    const auto val = est.validate(2, b.qv(), b.kv(), b.vv());
    const auto e = reference::purekv_select(est.scores(2), b.vv(), 2, P);
    const auto o = reference::purekv_select(reference::purekv_window_scores(b.qv(), b.kv(), 2, P), b.vv(), 2, P);
    for (std::int64_t g = 0; g < Hkv; ++g) {
        const auto& x = e.importance[static_cast<std::size_t>(g)];
        const auto& y = o.importance[static_cast<std::size_t>(g)];
        const auto r = spearman(std::vector<double>(x.begin(), x.end() - P.window), std::vector<double>(y.begin(), y.end() - P.window));
        REQUIRE(val.groups[static_cast<std::size_t>(g)].rho == r.rho);
        REQUIRE(val.groups[static_cast<std::size_t>(g)].p_value == r.p_value);
    }
    REQUIRE(simd::purekv_validate(est.scores(2), b.qv(), b.kv(), b.vv(), 2, P).groups.size() == 2);
}

TEST_CASE("purekv: prefill_layer runs observe, attention, select and eviction", "[purekv][estimator]") {
    const Layout layout = Layout::parse("text:5,video:3x8,text:7");
    const std::int64_t n = layout.n(), L = 4, H = 2, Hkv = 1, d = 8;
    PureKVParams P;
    P.window = 4;
    P.budget = PureKVBudget::count;
    P.top_h = 6;
    simd::PureKVEstimator est(P, layout, {L, H, Hkv, d});
    for (std::int64_t l = 0; l < L; ++l) {
        const auto in = purekv_make_qkv<bfloat16>(n, H, Hkv, d, vt::base_seed() + 500 + static_cast<std::uint64_t>(l));
        std::vector<float> out(static_cast<std::size_t>(n * H * d));
        KvCache<bfloat16> cache(Hkv, d);
        const auto s = est.prefill_layer(l, in.qv(), in.kv(), in.vv(), View3<float>(out.data(), {n, H, d}), cache);
        REQUIRE(cache.rows(0) == 10);
        REQUIRE(cache.seq_len() == n);
        REQUIRE(s.selection.indices[0].back() == n - 1);
        REQUIRE(vt::max_abs_diff(out, std::vector<float>(out.size(), 0.0f)) > 0.0);  // attention ran
    }
}

TEST_CASE("purekv: the Policy adapter drives the estimator layer by layer", "[purekv][policy]") {
    const Layout layout = Layout::parse("text:6,video:4x9,text:10");
    const std::int64_t n = layout.n(), L = 5, H = 4, Hkv = 2, d = 16;
    const ModelShape shape{L, H, Hkv, d};
    PureKVParams P;
    P.window = 6;
    P.st_start_layer = 2;
    AnyPolicy any = PureKVPolicy(P);
    REQUIRE(any.name() == "purekv");
    PureKVPolicy direct(P);
    simd::PureKVEstimator est(P, layout, shape);
    any.begin(layout, shape);
    direct.begin(layout, shape);
    for (std::int64_t l = 0; l < L; ++l) {
        INFO("layer " << l);
        const auto in = purekv_make_qkv<float>(n, H, Hkv, d, vt::base_seed() + 700 + static_cast<std::uint64_t>(l));
        const PrefillLayer pl{&layout, shape, l, in.qv(), in.kv(), in.vv(), {}};
        const PrefillDecision a = any.prefill(pl), b = direct.prefill(pl);
        if (est.needs_scores(l)) est.observe(l, in.qv(), in.kv());
        const PureKVSelection s = est.select(l, in.vv());
        REQUIRE(a.kv.indices == s.selection.indices);
        REQUIRE(b.kv.indices == s.selection.indices);
        REQUIRE(a.kv.n == n);
        REQUIRE_FALSE(a.sparse_prefill);
        REQUIRE(a.sequence.empty());
        REQUIRE(a.mask.has_value() == (l >= P.st_start_layer));
        if (a.mask) REQUIRE(expand_block_mask(*a.mask) == expand_block_mask(*est.block_mask()));
    }
    REQUIRE(direct.estimator()->observed(P.l0));
    // Decode reads everything and never evicts.
    const TokenSelection cached = TokenSelection::all(n + 1);
    REQUIRE(any.decode_read(3, 0, cached).indices == cached.indices);
    REQUIRE_FALSE(any.decode_observe(3, 0, cached, {}).has_value());
    // Dropped rows and a missing begin() are errors.
    const auto in = purekv_make_qkv<float>(n - 1, H, Hkv, d, 1);
    std::vector<std::int64_t> pos(static_cast<std::size_t>(n - 1));
    for (std::int64_t i = 0; i < n - 1; ++i) pos[static_cast<std::size_t>(i)] = i + 1;
    REQUIRE_THROWS_WITH(direct.prefill({&layout, shape, 1, in.qv(), in.kv(), in.vv(), pos}), Contains("needs every position"));
    PureKVPolicy fresh(P);
    const auto full = purekv_make_qkv<float>(n, H, Hkv, d, 2);
    REQUIRE_THROWS_WITH(fresh.prefill({&layout, shape, 0, full.qv(), full.kv(), full.vv(), {}}), Contains("call begin"));
    PureKVParams bad = P;
    bad.l0 = 9;
    REQUIRE_THROWS_WITH(PureKVPolicy(bad).begin(layout, shape), Contains("l0 = 9 is beyond"));
}

namespace {
// A scoring backend for PureKV's tests: every score but PureKV's window scores is a logic error.
class PureKVOnlyScoring : public PrefillScoring {
public:
    std::string backend_name() const override { return "purekv-only"; }
    ZipVLSelection zipvl_select(const PrefillLayer&, const Layout&, const ZipVLParams&) override { throw std::logic_error("unused"); }
    std::vector<double> last_row_scores(const PrefillLayer&, const AttentionOptions&) override { throw std::logic_error("unused"); }
    std::vector<std::vector<double>> h2o_scores(const PrefillLayer&, BaselineGroups, const AttentionOptions&) override {
        throw std::logic_error("unused");
    }
    std::vector<std::vector<double>> avl_h2o_scores(const PrefillLayer&, AvlTextGroups, const AttentionOptions&) override {
        throw std::logic_error("unused");
    }
    TokenSelection snapkv_select(const PrefillLayer&, const SnapKVParams&) override { throw std::logic_error("unused"); }
};

// Computes PureKV's window scores with the SIMD path (as a GPU backend would with its kernels), scaled
// by `factor`, and counts the calls.
class PureKVScoringProbe final : public PureKVOnlyScoring {
public:
    explicit PureKVScoringProbe(double factor) : factor_(factor) {}
    int calls = 0;
    PureKVScores purekv_window_scores(const PrefillLayer& in, const PureKVParams& P) override {
        ++calls;
        PureKVScores s = simd::purekv_window_scores(in.q, in.k, in.layer, P);
        for (auto& g : s.s)
            for (auto& x : g) x *= factor_;
        return s;
    }

private:
    double factor_;
};

// Hands back scores labelled with the wrong layer.
class PureKVScoringWrongLayer final : public PureKVOnlyScoring {
public:
    PureKVScores purekv_window_scores(const PrefillLayer& in, const PureKVParams& P) override {
        PureKVScores s = simd::purekv_window_scores(in.q, in.k, in.layer, P);
        s.layer += 1;
        return s;
    }
};
}  // namespace

TEST_CASE("purekv: the Policy adapter takes its window scores from the layer's scoring backend", "[purekv][policy]") {
    const Layout layout = Layout::parse("text:6,image:30,text:10");
    const std::int64_t n = layout.n(), L = 4, H = 4, Hkv = 2, d = 16;
    const ModelShape shape{L, H, Hkv, d};
    PureKVParams P;
    P.window = 6;
    P.l0 = 1;
    for (bool own : {false, true}) {
        INFO("own_layer_scores " << own);
        // factor 1: the same scores as the SIMD path, so the same decisions; factor -1 reverses the
        // ranking, so a policy that ignored the backend would keep a different set.
        PureKVScoringProbe same(1.0), reversed(-1.0);
        PureKVPolicy plain(P, own), via(P, own), flipped(P, own);
        plain.begin(layout, shape);
        via.begin(layout, shape);
        flipped.begin(layout, shape);
        bool differs = false;
        for (std::int64_t l = 0; l < L; ++l) {
            const auto in = purekv_make_qkv<float>(n, H, Hkv, d, vt::base_seed() + 760 + static_cast<std::uint64_t>(l));
            PrefillLayer pl{&layout, shape, l, in.qv(), in.kv(), in.vv(), {}};
            const PrefillDecision a = plain.prefill(pl);
            pl.scoring = &same;
            REQUIRE(via.prefill(pl).kv.indices == a.kv.indices);
            pl.scoring = &reversed;
            const PrefillDecision f = flipped.prefill(pl);
            if (f.kv.indices != a.kv.indices) differs = true;
        }
        // Layers 0..l0 score their own window (lower_layers = own_scores by default); with the ablation,
        // every layer does.
        const int want = own ? static_cast<int>(L) : static_cast<int>(P.l0 + 1);
        REQUIRE(same.calls == want);
        REQUIRE(reversed.calls == want);
        REQUIRE(differs);
    }
    // Scores of the wrong shape from a backend are an error, not a silent selection.
    PureKVScoringWrongLayer wrong;
    PureKVPolicy p(P);
    p.begin(layout, shape);
    const auto in = purekv_make_qkv<float>(n, H, Hkv, d, 5);
    REQUIRE_THROWS_WITH(p.prefill({&layout, shape, 0, in.qv(), in.kv(), in.vv(), {}, &wrong}),
                        Contains("observe_scores") && Contains("expected layer 0"));
}

// ===================================================================================================
// Golden files

namespace {
std::vector<std::filesystem::path> purekv_cases() {
    std::vector<std::filesystem::path> out;
    for (const auto& e : std::filesystem::directory_iterator(purekv_golden_root() / "purekv"))
        if (e.is_directory()) out.push_back(e.path());
    std::sort(out.begin(), out.end());
    return out;
}

template <class Estimator>
void check_golden(const std::filesystem::path& dir, const char* backend) {
    INFO("case " << dir.string() << ", backend " << backend);
    GoldenManifest m;
    const auto c = golden::read_purekv_inputs(dir, &m);
    vt::check_golden_outputs(dir, m, golden::run_purekv_case<Estimator>(c), golden::purekv_output_metric,
                            vt::precision_of(backend));
}
}  // namespace

TEST_CASE("golden purekv: the suite covers the required cases", "[purekv][golden]") {
    const auto all = purekv_cases();
    REQUIRE(all.size() >= 5);
    std::set<std::string> dtypes, groupings, masks, budgets;
    bool validation = false, spearman_ties = false, gqa = false, mqa = false, text_around = false;
    for (const auto& dir : all) {
        GoldenManifest m;
        const auto c = golden::read_purekv_inputs(dir, &m);
        masks.insert(m.params.at("st_mask").get<std::string>());
        if (c.shape.layers > 0) {
            dtypes.insert(c.dtype);
            groupings.insert(m.params.at("grouping").get<std::string>());
            budgets.insert(m.params.at("budget").get<std::string>());
            gqa |= c.shape.kv_heads > 1 && c.shape.kv_heads < c.shape.heads;
            mqa |= c.shape.kv_heads == 1;
        }
        for (const auto& t : m.outputs) validation |= t.name == "validation_rho";
        if (!c.x.empty()) spearman_ties |= std::set<double>(c.x.begin(), c.x.end()).size() < c.x.size();
        const auto& segs = c.layout.segments();
        text_around |= segs.size() >= 3 && segs.front().kind == SegmentKind::text && segs.back().kind == SegmentKind::text;
    }
    REQUIRE(dtypes == std::set<std::string>{"fp32", "fp16", "bf16"});
    REQUIRE(groupings == std::set<std::string>{"kv_head", "layer"});
    REQUIRE(budgets == std::set<std::string>{"count", "fraction"});
    REQUIRE(masks.count("spatial_temporal"));
    REQUIRE(validation);
    REQUIRE(spearman_ties);
    REQUIRE(gqa);
    REQUIRE(mqa);
    REQUIRE(text_around);
}

TEST_CASE("golden purekv: the reference reproduces every case", "[purekv][golden]") {
    for (const auto& dir : purekv_cases()) check_golden<reference::PureKVEstimator>(dir, "reference");
}

TEST_CASE("golden purekv: the SIMD path meets every case's tolerances", "[purekv][golden]") {
    for (const auto& dir : purekv_cases()) check_golden<simd::PureKVEstimator>(dir, "simd");
}

TEST_CASE("purekv: params JSON round trip and strict reading", "[purekv]") {
    PureKVParams P;
    P.l0 = 4;
    P.window = 16;
    P.budget = PureKVBudget::count;
    P.top_h = 99;
    P.grouping = PureKVGrouping::layer;
    P.lower_layers = PureKVLowerLayers::dense;
    P.st = {VideoMask::atrous, 9, 3};
    P.st_start_layer = 5;
    const PureKVParams Q = purekv_params_from_json(to_json(P));
    REQUIRE(to_json(Q) == to_json(P));
    REQUIRE_THROWS_WITH(purekv_params_from_json(nlohmann::json{{"windw", 3}}), Contains("windw: unknown key"));
    REQUIRE_THROWS_WITH(purekv_params_from_json(nlohmann::json{{"st_mask", "diagonal"}}), Contains("unknown value 'diagonal'"));
    REQUIRE_THROWS_WITH(purekv_params_from_json(nlohmann::json{{"budget_fraction", 1.5}}), Contains("budget_fraction = 1.5"));
    for (VideoMask k : kVideoMasks) REQUIRE(video_mask_from_string(to_string(k)) == k);
    REQUIRE(video_mask_from_string("none") == VideoMask::none);
    REQUIRE_THROWS_WITH(video_mask_from_string("st"), Contains("unknown video mask 'st'"));
}

// ===================================================================================================
// Bad input

TEST_CASE("purekv: bad input is rejected with a clear error", "[purekv][errors]") {
    const Layout layout = Layout::parse("text:4,video:3x8,text:4");
    const std::int64_t n = layout.n(), H = 4, Hkv = 2, d = 8;
    const auto in = purekv_make_qkv<float>(n, H, Hkv, d, 9);
    const ModelShape shape{4, H, Hkv, d};
    PureKVParams P;
    P.window = 4;

    SECTION("window larger than n") {
        PureKVParams W = P;
        W.window = n + 1;
        REQUIRE_THROWS_WITH(simd::purekv_window_scores(in.qv(), in.kv(), 0, W), Contains("window = 33 is larger than the sequence (n = 32)"));
        REQUIRE_THROWS_WITH(reference::purekv_window_scores(in.qv(), in.kv(), 0, W), Contains("window = 33"));
        REQUIRE_THROWS_WITH(simd::PureKVEstimator(W, layout, shape), Contains("window = 33 is larger"));
        W.window = 0;
        REQUIRE_THROWS_WITH(simd::PureKVEstimator(W, layout, shape), Contains("window = 0, expected >= 1"));
    }
    SECTION("budget outside its range") {
        PureKVParams B = P;
        B.budget = PureKVBudget::count;
        B.top_h = n - P.window + 1;
        REQUIRE_THROWS_WITH(purekv_top_h(n, B), Contains("top_h = 29 is outside the budget range, expected 0 <= top_h <= n - window = 28"));
        REQUIRE_THROWS_WITH(reference::PureKVEstimator(B, layout, shape), Contains("top_h = 29"));
        B.top_h = -1;
        REQUIRE_THROWS_WITH(purekv_top_h(n, B), Contains("top_h = -1, expected >= 0"));
        B = P;
        for (double f : {0.0, -0.1, 1.5, std::nan("")}) {
            B.budget_fraction = f;
            REQUIRE_THROWS_WITH(simd::PureKVEstimator(B, layout, shape), Contains("expected 0 < budget_fraction <= 1"));
        }
        // The selection checks the budget against its own n.
        const auto s = simd::purekv_window_scores(in.qv(), in.kv(), 0, P);
        B = P;
        B.budget = PureKVBudget::count;
        B.top_h = 100;
        REQUIRE_THROWS_WITH(simd::purekv_select(s, in.vv(), 0, B), Contains("top_h = 100 is outside the budget range"));
    }
    SECTION("frame grid not matching the segment") {
        REQUIRE_THROWS_WITH(Layout::parse("text:2,video:4x16[3x5],text:1"),
                            Contains("segment 1 (video) grid 3x5 does not match its 16 tokens per frame"));
        REQUIRE_THROWS_WITH(Layout({Segment::text(0, 2), Segment::video(2, 4, 16, 4, 5)}), Contains("grid 4x5 does not match"));
        Segment bad = Segment::video(0, 4, 16);
        bad.length = 60;  // frames x tokens per frame != length
        REQUIRE_THROWS_WITH(Layout({bad}), Contains("4 frames x 16 tokens, which does not match its length 60"));
        REQUIRE_THROWS_WITH(Layout::parse("video:0x16"), Contains("expected frames x tokens-per-frame, both > 0"));
    }
    SECTION("l0 and st_start_layer beyond the number of layers") {
        PureKVParams Q = P;
        Q.l0 = 4;
        REQUIRE_THROWS_WITH(simd::PureKVEstimator(Q, layout, shape), Contains("l0 = 4 is beyond the model's layers, expected 0 <= l0 < 4"));
        Q.l0 = -1;
        REQUIRE_THROWS_WITH(simd::PureKVEstimator(Q, layout, shape), Contains("l0 = -1, expected >= 0"));
        Q = P;
        Q.st_start_layer = 7;
        REQUIRE_THROWS_WITH(simd::PureKVEstimator(Q, layout, shape), Contains("st_start_layer = 7, expected < layers = 4"));
        Q.st.kind = VideoMask::none;
        REQUIRE_NOTHROW(simd::PureKVEstimator(Q, layout, shape));
        simd::PureKVEstimator est(P, layout, shape);
        REQUIRE_THROWS_WITH(est.select(4, in.vv()), Contains("layer = 4, expected 0 <= layer < 4"));
        REQUIRE_THROWS_WITH(est.observe(-1, in.qv(), in.kv()), Contains("layer = -1"));
    }
    SECTION("estimator order and shapes") {
        simd::PureKVEstimator est(P, layout, shape);
        REQUIRE_THROWS_WITH(est.select(3, in.vv()), Contains("the scores of layer 2 are needed for layer 3 but were not observed"));
        const auto other = purekv_make_qkv<float>(n - 1, H, Hkv, d, 3);
        REQUIRE_THROWS_WITH(est.observe(2, other.qv(), other.kv()), Contains("do not match the prompt and model (n = 32"));
        REQUIRE_THROWS_WITH(est.select(2, other.vv()), Contains("v has shape [31, 2, 8], expected [32, 2, 8]"));
        REQUIRE_THROWS_WITH(est.validate(1, in.qv(), in.kv(), in.vv()), Contains("expected a layer above l0 = 2"));
        REQUIRE_THROWS_WITH(simd::PureKVEstimator(P, layout, ModelShape{4, 6, 4, d}), Contains("not a multiple of kv_heads"));
    }
    SECTION("NaN / Inf inputs and mismatched scores") {
        auto bad = in;
        bad.q[static_cast<std::size_t>(((n - 1) * H + 1) * d + 5)] = std::numeric_limits<float>::quiet_NaN();  // a window row
        REQUIRE_THROWS_WITH(simd::purekv_window_scores(bad.qv(), bad.kv(), 0, P), Contains("q (window rows)[3, 1, 5] = nan"));
        REQUIRE_THROWS_WITH(reference::purekv_window_scores(bad.qv(), bad.kv(), 0, P), Contains("q (window rows)[3, 1, 5] = nan"));
        auto badk = in;
        badk.k[7] = std::numeric_limits<float>::infinity();
        REQUIRE_THROWS_WITH(simd::purekv_window_scores(badk.qv(), badk.kv(), 0, P), Contains("k[0, 0, 7] = inf"));
        REQUIRE_THROWS_WITH(reference::purekv_window_scores(badk.qv(), badk.kv(), 0, P), Contains("k[0, 0, 7] = inf"));
        // Rows outside the window are never read by the scores (both paths agree; the prefill attention
        // itself rejects them).
        auto outside = in;
        outside.q[5] = std::numeric_limits<float>::quiet_NaN();
        check_scores_match(simd::purekv_window_scores(outside.qv(), outside.kv(), 0, P),
                           reference::purekv_window_scores(outside.qv(), outside.kv(), 0, P));
        std::vector<float> o(static_cast<std::size_t>(n * H * d));
        REQUIRE_THROWS_WITH(simd::PureKVEstimator(P, layout, shape).attention(0, outside.qv(), outside.kv(), outside.vv(),
                                                                              View3<float>(o.data(), {n, H, d})),
                            Contains("expected finite values"));
        auto badv = in;
        badv.v[3] = std::numeric_limits<float>::infinity();
        const auto s = simd::purekv_window_scores(in.qv(), in.kv(), 0, P);
        REQUIRE_THROWS_WITH(simd::purekv_select(s, badv.vv(), 0, P), Contains("expected finite values"));
        REQUIRE_THROWS_WITH(reference::purekv_select(s, badv.vv(), 0, P), Contains("expected finite values"));
        PureKVParams Lg = P;
        Lg.grouping = PureKVGrouping::layer;
        REQUIRE_THROWS_WITH(simd::purekv_select(s, in.vv(), 0, Lg), Contains("scores have 2 groups, expected 1"));
        PureKVParams Wd = P;
        Wd.window = 5;
        REQUIRE_THROWS_WITH(reference::purekv_select(s, in.vv(), 0, Wd), Contains("window 4"));
    }
    SECTION("bad video mask options") {
        REQUIRE_THROWS_WITH(make_video_mask_context(layout, {VideoMask::atrous, 4, 0}), Contains("dilation = 0, expected >= 1"));
        REQUIRE_THROWS_WITH(make_video_mask_context(layout, {VideoMask::local_window, -2, 1}), Contains("window = -2"));
        REQUIRE_THROWS_WITH(make_video_mask_context(layout, {static_cast<VideoMask>(9), 0, 1}), Contains("video mask kind has value 9"));
        MaskContext c = make_video_mask_context(layout, {VideoMask::spatial, 0, 1});
        c.image_frame_tokens.clear();
        REQUIRE_THROWS_WITH(make_block_mask(c, std::vector<MaskTemplate>{MaskTemplate::dense}), Contains("frame sizes"));
        PureKVParams Q = P;
        Q.st.dilation = -3;
        REQUIRE_THROWS_WITH(simd::PureKVEstimator(Q, layout, shape), Contains("dilation = -3"));
    }
    SECTION("Spearman input") {
        REQUIRE_THROWS_WITH(spearman(std::vector<double>{1, 2, 3}, std::vector<double>{1, 2}), Contains("expected equal lengths"));
        REQUIRE_THROWS_WITH(spearman(std::vector<double>{1, 2}, std::vector<double>{1, 2}), Contains("n = 2, expected n >= 3"));
        REQUIRE_THROWS_WITH(spearman(std::vector<double>{4, 4, 4}, std::vector<double>{1, 2, 3}), Contains("x is constant"));
        REQUIRE_THROWS_WITH(spearman(std::vector<double>{1, 2, 3}, std::vector<double>{7, 7, 7}), Contains("y is constant"));
        REQUIRE_THROWS_WITH(spearman(std::vector<double>{1, NAN, 3}, std::vector<double>{1, 2, 3}), Contains("x[1] = nan"));
        REQUIRE_THROWS_WITH(regularized_incomplete_beta(0.0, 1.0, 0.5), Contains("expected finite a > 0"));
        REQUIRE_THROWS_WITH(regularized_incomplete_beta(1.0, 1.0, 1.5), Contains("x = 1.5, expected 0 <= x <= 1"));
        REQUIRE_THROWS_WITH(student_t_two_sided_p(1.0, 0.0), Contains("dof = 0"));
        // Validation with fewer than 3 positions outside the window.
        PureKVParams Q = P;
        Q.window = n - 2;
        const auto s = reference::purekv_window_scores(in.qv(), in.kv(), 0, Q);
        const auto a = reference::purekv_select(s, in.vv(), 1, Q);
        REQUIRE_THROWS_WITH(purekv_validation(a, a), Contains("only 2 positions outside the window"));
    }
}
