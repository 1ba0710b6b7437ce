// A-VL: SIMD path against the reference on fresh seeded inputs, hand-computed selections and
// schedules, a full decode trace, and bad input (indexed decode attention: indexed_decode_test.cpp).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>

#include <vlsparse/policies/avl.hpp>
#include <vlsparse/reference/avl.hpp>

#include "golden_util.hpp"
#include "test_util.hpp"

using namespace vlsparse;
using Catch::Matchers::Contains;

namespace {

// Random Q/K/V with "sink" keys every 7th position so the attention is peaked (few near-ties).
struct AvlQkv {
    std::int64_t n, H, Hkv, d;
    std::vector<float> q, k, v;
    View3<const float> qv() const { return {q.data(), {n, H, d}}; }
    View3<const float> kv() const { return {k.data(), {n, Hkv, d}}; }
    View3<const float> vv() const { return {v.data(), {n, Hkv, d}}; }
};
AvlQkv avl_make_qkv(std::int64_t n, std::int64_t H, std::int64_t Hkv, std::int64_t d, std::uint64_t seed) {
    AvlQkv r{n, H, Hkv, d, vt::random_buffer<float>(static_cast<std::size_t>(n * H * d), seed),
          vt::random_buffer<float>(static_cast<std::size_t>(n * Hkv * d), seed + 1),
          vt::random_buffer<float>(static_cast<std::size_t>(n * Hkv * d), seed + 2)};
    const auto u = vt::random_buffer<float>(static_cast<std::size_t>(d), seed + 3);
    SplitMix64 rng(seed + 4);
    for (std::int64_t i = 0; i < n; ++i) {
        const float w = static_cast<float>(1.0 + 3.0 * rng.uniform());  // distinct strengths: no ties
        for (std::int64_t c = 0; c < d; ++c) {
            for (std::int64_t h = 0; h < H; ++h) r.q[static_cast<std::size_t>((i * H + h) * d + c)] += 0.5f * u[c];
            for (std::int64_t g = 0; g < Hkv; ++g) r.k[static_cast<std::size_t>((i * Hkv + g) * d + c)] += (i % 7 == 0 ? w : 0.3f * w) * u[c];
        }
    }
    return r;
}

}  // namespace

TEST_CASE("avl: PPCI of the slides' example is 2/3", "[avl]") {
    // Tokens 1..9 (index 0 unused as a token: positions 0..8 are tokens 1..9). Top 30% of 9 -> k = 3.
    // s1's top three are tokens {8, 6, 5}; s2's are {6, 5, 9}.
    const std::vector<double> s1{0.01, 0.02, 0.03, 0.04, 0.15, 0.20, 0.05, 0.40, 0.10};
    const std::vector<double> s2{0.01, 0.02, 0.03, 0.04, 0.20, 0.30, 0.05, 0.06, 0.29};
    REQUIRE(ppci(s1, s2, 0.3) == Approx(2.0 / 3.0).epsilon(1e-15));
    REQUIRE(ppci(s1, s1, 0.3) == 1.0);
    REQUIRE(ppci(s1, s2, 1.0) == 1.0);
    REQUIRE(ppci(s1, s2, 0.1) == 0.0);  // k = 1: token 8 vs token 6
    REQUIRE_THROWS_WITH(ppci(s1, s2, 0.0), Contains("p = 0, expected 0 < p <= 1"));
    REQUIRE_THROWS_WITH(ppci(s1, std::vector<double>{1.0}, 0.5), Contains("lengths 9 and 1"));
}

TEST_CASE("avl: budgets are truncated and spans follow the layout", "[avl]") {
    REQUIRE(avl_budget(10, 0.5) == 5);
    REQUIRE(avl_budget(11, 0.5) == 5);
    REQUIRE(avl_budget(10, 0.7) == 3);
    REQUIRE(avl_budget(10, 0.9) == 0);  // (1 - 0.9) * 10 = 0.999... in double, truncated as in the released code
    REQUIRE(avl_budget(576, 0.7) == 172);
    const Layout l = Layout::parse("text:3,image:10,text:2,image:6,text:1");
    const auto per = avl_spans(l, AvlSpans::per_image);
    REQUIRE(per.size() == 2);
    REQUIRE((per[0].start == 3 && per[0].length == 10 && per[1].start == 15 && per[1].length == 6));
    const auto one = avl_spans(l, AvlSpans::single_span);
    REQUIRE(one.size() == 1);
    REQUIRE((one[0].start == 3 && one[0].length == 18));
}

TEST_CASE("avl: hand-computed kept and core sets per image", "[avl]") {
    // n = 22: text 0-2, image A 3-12 (10 tokens), text 13-14, image B 15-20 (6 tokens), text 21.
    const Layout l = Layout::parse("text:3,image:10,text:2,image:6,text:1");
    std::vector<double> s(22, 0.0);
    // Image A scores rise with position except 5 (large) and a tie 9 == 10; image B descending.
    const double a[10] = {0.10, 0.20, 0.90, 0.30, 0.40, 0.50, 0.60, 0.60, 0.70, 0.05};
    for (int i = 0; i < 10; ++i) s[3 + i] = a[i];
    const double b[6] = {0.6, 0.5, 0.4, 0.3, 0.2, 0.1};
    for (int i = 0; i < 6; ++i) s[15 + i] = b[i];
    for (int t : {0, 1, 2, 13, 14, 21}) s[t] = 5.0;  // text never competes with images
    AvlParams P;  // rate 0.5, compute_rate 0.7
    const auto r = avl_select(s, l, P);
    // A: kept 5 = {5 (0.9), 11 (0.7), 9 (0.6), 10 (0.6, tie -> lower first so both), 8 (0.5)}; core 3 = {5, 11, 9}.
    REQUIRE(r.kept_image[0] == std::vector<std::int64_t>{5, 8, 9, 10, 11});
    // B: kept 3 = {15, 16, 17}; core floor(0.3 * 6) = 1 = {15}.
    REQUIRE(r.kept_image[1] == std::vector<std::int64_t>{15, 16, 17});
    REQUIRE(r.core == std::vector<std::int64_t>{5, 9, 11, 15});
    REQUIRE(r.core_budget == std::vector<std::int64_t>{3, 1});
    REQUIRE(r.kept.shared());
    REQUIRE(r.kept.indices[0] == std::vector<std::int64_t>{0, 1, 2, 5, 8, 9, 10, 11, 13, 14, 15, 16, 17, 21});
    // Single-span mode: one span 3..20 of 18 tokens (text 13, 14 inside it compete as image tokens).
    P.spans = AvlSpans::single_span;
    const auto r1 = avl_select(s, l, P);
    REQUIRE(r1.spans.size() == 1);
    REQUIRE(r1.kept_image[0].size() == 9);  // floor(0.5 * 18)
    REQUIRE(r1.core.size() == 5);           // floor(0.3 * 18) = 5.4 -> 5
    REQUIRE(std::count(r1.kept_image[0].begin(), r1.kept_image[0].end(), 13) == 1);  // score 5.0 wins
    // 13, 14 (5.0), 5 (0.9), 11 (0.7), the 0.6 tie 9, 10, 15, the 0.5 tie 8, 16.
    REQUIRE(r1.kept.indices[0] == std::vector<std::int64_t>{0, 1, 2, 5, 8, 9, 10, 11, 13, 14, 15, 16, 21});
    REQUIRE(r1.core == std::vector<std::int64_t>{5, 9, 11, 13, 14});
    // rate == compute_rate: core == kept.
    P = AvlParams{};
    P.rate = P.compute_rate = 0.5;
    const auto r2 = avl_select(s, l, P);
    REQUIRE(r2.core == std::vector<std::int64_t>{5, 8, 9, 10, 11, 15, 16, 17});
    // A text-only layout: nothing is image, everything is kept.
    const auto r3 = avl_select(std::vector<double>(5, 1.0), Layout::text_only(5), AvlParams{});
    REQUIRE(r3.kept.indices[0] == std::vector<std::int64_t>{0, 1, 2, 3, 4});
    REQUIRE(r3.core.empty());
}

TEST_CASE("avl: the schedule reads core + non-image rows between refreshes", "[avl][schedule]") {
    const Layout l = Layout::parse("text:3,image:10,text:2,image:6,text:1");
    std::vector<double> s(22, 5.0);
    for (int i = 0; i < 10; ++i) s[3 + i] = 0.01 * (i + 1);  // A: 12 > 11 > ... ; kept {8..12}, core {10,11,12}
    for (int i = 0; i < 6; ++i) s[15 + i] = 0.01 * (6 - i);   // B: kept {15,16,17}, core {15}
    for (bool async : {false, true}) {
        AvlParams P;
        P.async_refresh = async;
        DecodeSchedule sch(avl_select(s, l, P), P);
        const std::vector<std::int64_t> non_image{0, 1, 2, 13, 14, 21};
        const std::vector<std::int64_t> kept{0, 1, 2, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 21};
        std::vector<std::int64_t> core = {10, 11, 12, 15};
        // Refresh scores: image A now prefers low positions, B prefers 17.
        auto refresh_score = [](std::int64_t p) { return p <= 12 ? 1.0 / static_cast<double>(p) : (p == 17 ? 1.0 : 0.1); };
        const std::vector<std::int64_t> new_core{8, 9, 10, 17};
        for (std::int64_t t = 0; t < 12; ++t) {
            INFO("async " << async << " step " << t);
            const std::int64_t seq = 22 + t + 1;
            sch.begin_step(t);
            const auto pos = sch.positions(t, seq);
            REQUIRE(pos.shared());
            std::vector<std::int64_t> want;
            if (t % 3 == 0) {
                want = kept;
            } else {
                const auto& c = (async && t % 3 == 1 && t > 0) ? core : (t > 0 ? new_core : core);
                std::merge(c.begin(), c.end(), non_image.begin(), non_image.end(), std::back_inserter(want));
                REQUIRE(sch.core() == c);
            }
            for (std::int64_t p = 22; p < seq; ++p) want.push_back(p);
            REQUIRE(pos.indices[0] == want);
            if (t % 3 == 0) {
                sch.refresh(t, refresh_score);
                if (!async) REQUIRE(sch.core() == new_core);
                if (async) REQUIRE(sch.core() == (t == 0 ? core : new_core));
            }
            if (async && t % 3 == 1) core = new_core;  // from step 2 on the re-ranked set is the one in use
        }
    }
    AvlParams P0;
    P0.refresh_every = 0;  // K = 0: no split, every step reads every kept row, no refresh
    DecodeSchedule none(avl_select(s, l, P0), P0);
    for (std::int64_t t = 0; t < 4; ++t) {
        none.begin_step(t);
        REQUIRE(none.positions(t, 22 + t + 1).indices[0].size() == 14 + static_cast<std::size_t>(t) + 1);
        REQUIRE_THROWS_WITH(none.refresh(t, [](std::int64_t) { return 1.0; }), Contains("not a refresh step (K = 0)"));
    }
}

namespace {

// Prefill (scores, H2O text budget, selection, eviction) then `steps` decode steps through one backend.
struct Trace {
    AvlSelection sel;
    std::vector<std::vector<std::int64_t>> core, read0;  // per step: core in effect, positions read by KV head 0
    std::vector<std::vector<std::vector<std::int64_t>>> read;  // per step, per group
    std::vector<std::uint8_t> refresh;
    std::vector<double> out;
};

template <bool Simd>
Trace run_trace(const AvlQkv& in, const Layout& l, const AvlParams& P, std::int64_t steps, std::uint64_t seed) {
    const std::int64_t n = in.n, H = in.H, Hkv = in.Hkv, d = in.d;
    Trace tr;
    std::vector<double> sc;
    std::vector<std::vector<std::int64_t>> text;
    if constexpr (Simd) {
        sc = simd::avl_scores(in.qv(), in.kv());
        if (P.text_rate > 0.0)
            text = avl_text_h2o(simd::avl_h2o_scores(in.qv(), in.kv(), P.text_groups), l, P,
                                P.text_groups == AvlTextGroups::per_kv_head ? 1 : H / Hkv);
    } else {
        sc = reference::avl_scores(in.qv(), in.kv());
        if (P.text_rate > 0.0)
            text = avl_text_h2o(reference::avl_h2o_scores(in.qv(), in.kv(), P.text_groups), l, P,
                                P.text_groups == AvlTextGroups::per_kv_head ? 1 : H / Hkv);
    }
    tr.sel = avl_select(sc, l, P, {}, text);
    KvCache<float> cache(Hkv, d);
    cache.assign(in.kv(), in.vv());
    cache.keep(tr.sel.kept);
    DecodeSchedule sch(tr.sel, P);
    const auto dq = vt::random_buffer<float>(static_cast<std::size_t>(steps * H * d), seed);
    const auto dk = vt::random_buffer<float>(static_cast<std::size_t>(steps * Hkv * d), seed + 1);
    const auto dv = vt::random_buffer<float>(static_cast<std::size_t>(steps * Hkv * d), seed + 2);
    tr.out.resize(static_cast<std::size_t>(steps * H * d));
    for (std::int64_t t = 0; t < steps; ++t) {
        cache.append(View2<const float>(dk.data() + t * Hkv * d, {Hkv, d}), View2<const float>(dv.data() + t * Hkv * d, {Hkv, d}));
        std::vector<float> o(static_cast<std::size_t>(H * d));
        const View2<const float> q(dq.data() + t * H * d, {H, d});
        const AvlStep st = Simd ? simd::avl_decode_step(q, cache, sch, t, View2<float>(o.data(), {H, d}))
                                : reference::avl_decode_step(q, cache, sch, t, View2<float>(o.data(), {H, d}));
        REQUIRE(st.step == t);
        tr.core.push_back(sch.core());
        tr.read.push_back(st.read.indices);
        tr.refresh.push_back(st.refresh ? 1 : 0);
        std::copy(o.begin(), o.end(), tr.out.begin() + t * H * d);
    }
    (void)n;
    return tr;
}

}  // namespace

TEST_CASE("avl: full decode trace, simd against reference, GQA 1/2/4/8", "[avl][trace]") {
    const std::uint64_t seed = vt::base_seed() + 900;
    INFO("seed " << seed);
    const Layout l = Layout::parse(vt::small_run() ? "text:5,image:24,text:3,image:16,text:4" : "text:9,image:64,text:5,image:40,text:7");
    const std::int64_t steps = 12, d = 32, Hkv = 2;
    for (std::int64_t ratio : {1, 2, 4, 8}) {
        for (int variant = 0; variant < 3; ++variant) {
            const std::int64_t H = Hkv * ratio;
            INFO("H " << H << " variant " << variant);
            const AvlQkv in = avl_make_qkv(l.n(), H, Hkv, d, seed + static_cast<std::uint64_t>(ratio * 10 + variant));
            AvlParams P;
            if (variant == 1) P.async_refresh = true;
            if (variant == 2) {
                P.text_rate = 0.5;
                P.text_min_budget = 4;
                if (ratio == 4) P.text_groups = AvlTextGroups::per_query_head;
            }
            const Trace r = run_trace<false>(in, l, P, steps, seed + 77);
            const Trace s = run_trace<true>(in, l, P, steps, seed + 77);
            REQUIRE(s.sel.kept.indices == r.sel.kept.indices);
            REQUIRE(s.sel.core == r.sel.core);
            REQUIRE(s.core == r.core);
            REQUIRE(s.read == r.read);
            REQUIRE(s.refresh == r.refresh);
            REQUIRE(vt::nmse(s.out, r.out) <= vt::kSimdVsReference.attention_nmse);
            // Non-refresh steps read exactly core + kept non-image + decode tokens.
            for (std::int64_t t = 0; t < steps; ++t) {
                REQUIRE(static_cast<bool>(r.refresh[static_cast<std::size_t>(t)]) == (t % 3 == 0));
                for (std::size_t g = 0; g < r.read[static_cast<std::size_t>(t)].size(); ++g) {
                    std::vector<std::int64_t> want;
                    if (t % 3 == 0) {
                        want = r.sel.kept.indices[g];
                    } else {
                        std::vector<std::int64_t> non_image;
                        for (auto p : r.sel.kept.indices[g])
                            if (l.is_text(p)) non_image.push_back(p);
                        std::merge(r.core[static_cast<std::size_t>(t)].begin(), r.core[static_cast<std::size_t>(t)].end(),
                                   non_image.begin(), non_image.end(), std::back_inserter(want));
                    }
                    for (std::int64_t p = l.n(); p <= l.n() + t; ++p) want.push_back(p);
                    REQUIRE(r.read[static_cast<std::size_t>(t)][g] == want);
                }
            }
            if (variant == 2) REQUIRE(r.sel.kept.groups() == static_cast<std::size_t>(Hkv));
            // The core set changes at some refresh (otherwise the trace would not test re-ranking).
            if (variant == 0 && ratio == 1) {
                bool changed = false;
                for (const auto& c : r.core) changed |= c != r.sel.core;
                REQUIRE(changed);
            }
        }
    }
}

TEST_CASE("avl: prefill filter keeps positions; later layers budget from the original length", "[avl]") {
    const Layout l = Layout::parse("text:2,image:10,text:2");
    std::vector<double> s(14, 1.0);
    for (int i = 0; i < 10; ++i) s[2 + i] = 0.01 * (10 - i);  // position 2 highest
    AvlParams P;
    P.prefill_filter = 0.4;  // keep floor(0.6 * 10) = 6 image tokens: 2..7
    const auto present = avl_prefill_filter(s, l, P);
    REQUIRE(present == std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 12, 13});
    // A later layer sees only the present rows; its scores (here rising) are scattered back to positions.
    std::vector<double> rows_scores{1, 1, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 1, 1};
    const auto s2 = avl_scatter_scores(rows_scores, present, 14);
    const auto r = avl_select(s2, l, AvlParams{}, present);
    // kept = floor(0.5 * 10) = 5 of the 6 present image tokens; core = floor(0.3 * 10) = 3.
    REQUIRE(r.kept_image[0] == std::vector<std::int64_t>{3, 4, 5, 6, 7});
    REQUIRE(r.core == std::vector<std::int64_t>{5, 6, 7});
    REQUIRE(r.kept.indices[0] == std::vector<std::int64_t>{0, 1, 3, 4, 5, 6, 7, 12, 13});
    // A budget larger than what is present keeps everything present (no error, no invented tokens).
    const std::vector<std::int64_t> few{0, 1, 2, 3, 12, 13};
    const auto r2 = avl_select(s2, l, AvlParams{}, few);
    REQUIRE(r2.kept_image[0] == std::vector<std::int64_t>{2, 3});
}

TEST_CASE("avl: H2O text budget, heavy hitters plus recent", "[avl]") {
    const Layout l = Layout::parse("text:10,image:4,text:10");
    // Two KV groups. Text tokens: 0..9 and 14..23 (20). T = 0.5 -> round(10) = 10 >= min 4; heavy 7, recent 3.
    std::vector<std::vector<double>> acc(2, std::vector<double>(24, 0.0));
    for (int j = 0; j < 24; ++j) {
        acc[0][j] = static_cast<double>(j);       // group 0 prefers late tokens
        acc[1][j] = static_cast<double>(24 - j);  // group 1 prefers early tokens
    }
    AvlParams P;
    P.text_rate = 0.5;
    P.text_min_budget = 4;
    auto t = avl_text_h2o(acc, l, P);
    REQUIRE(t.size() == 2);
    // recent: 21, 22, 23; group 0 heavy among older text {0..9, 14..20}: 20..14 (7).
    REQUIRE(t[0] == std::vector<std::int64_t>{14, 15, 16, 17, 18, 19, 20, 21, 22, 23});
    REQUIRE(t[1] == std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 6, 21, 22, 23});
    // Per query head: 2 query heads per KV head; the KV head keeps the union.
    auto u = avl_text_h2o(acc, l, P, 2);
    REQUIRE(u.size() == 1);
    REQUIRE(u[0].size() == 17);
    // The minimum budget wins over T, and a budget above the text count keeps all text.
    P.text_rate = 0.9;
    P.text_min_budget = 20;
    REQUIRE(avl_text_h2o(acc, l, P)[0].size() == 20);
    P.text_min_budget = 100;
    REQUIRE(avl_text_h2o(acc, l, P)[1].size() == 20);
    const auto sel = avl_select(std::vector<double>(24, 1.0), l, AvlParams{}, {}, t);
    REQUIRE(sel.kept.groups() == 2);
    REQUIRE(sel.kept.indices[0] == std::vector<std::int64_t>{10, 11, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23});
}

TEST_CASE("avl: text budget rounds halves away from zero and counts only text outside the spans", "[avl]") {
    // Images 3..4 and 7..8; single_span covers 3..8, so its text tokens are 0..2 and 9..10 (5).
    const Layout l = Layout::parse("text:3,image:2,text:2,image:2,text:2");
    std::vector<std::vector<double>> acc(1, std::vector<double>(11, 0.0));
    for (int j = 0; j < 11; ++j) acc[0][j] = static_cast<double>(11 - j);
    AvlParams P;
    P.text_rate = 0.5;
    P.text_min_budget = 0;
    P.text_heavy_fraction = 0.5;
    P.spans = AvlSpans::single_span;
    // (1 - 0.5) * 5 = 2.5 -> 3 (Python's round() would give 2): heavy floor(1.5) = 1, recent 2.
    REQUIRE(avl_text_h2o(acc, l, P)[0] == std::vector<std::int64_t>{0, 9, 10});
    // per_image: the text between the images counts too, text_seen = 7; 3.5 -> 4, heavy 2, recent 2.
    P.spans = AvlSpans::per_image;
    REQUIRE(avl_text_h2o(acc, l, P)[0] == std::vector<std::int64_t>{0, 1, 9, 10});
    // text_min_budget is a floor on B, capped at text_seen.
    P.text_min_budget = 6;
    REQUIRE(avl_text_h2o(acc, l, P)[0].size() == 6);
    P.text_min_budget = 20;
    REQUIRE(avl_text_h2o(acc, l, P)[0].size() == 7);
}

TEST_CASE("avl: bad input is a clear error", "[avl][errors]") {
    const Layout l = Layout::parse("text:2,image:10,text:2");
    const std::vector<double> s(14, 1.0);
    auto bad = [&](AvlParams P, const std::string& msg) {
        INFO(msg);
        REQUIRE_THROWS_WITH(avl_select(s, l, P), Contains(msg));
        REQUIRE_THROWS_AS(avl_select(s, l, P), vlsparse::error);
    };
    AvlParams P;
    P.rate = 1.0;
    bad(P, "rate = 1, expected 0 <= rate < 1");
    P = {};
    P.rate = -0.1;
    bad(P, "rate = -0.1, expected 0 <= rate < 1");
    P = {};
    P.compute_rate = 1.5;
    bad(P, "compute_rate = 1.5, expected 0 <= compute_rate < 1");
    P = {};
    P.compute_rate = 0.3;
    bad(P, "compute_rate = 0.3 is below rate = 0.5");
    P = {};
    P.rate = std::numeric_limits<double>::quiet_NaN();
    bad(P, "expected 0 <= rate < 1");
    P = {};
    P.prefill_filter = 1.0;
    bad(P, "prefill_filter = 1, expected 0 <= prefill_filter < 1");
    P = {};
    P.text_rate = 2.0;
    bad(P, "text_rate = 2, expected 0 <= text_rate < 1");
    P = {};
    P.text_heavy_fraction = 1.5;
    bad(P, "text_heavy_fraction = 1.5");
    // Scores that do not match the layout (an image span outside the scored sequence).
    REQUIRE_THROWS_WITH(avl_select(std::vector<double>(10, 1.0), l, AvlParams{}),
                        Contains("scores has length 10, expected the layout's n = 14"));
    REQUIRE_THROWS_WITH(avl_prefill_filter(std::vector<double>(10, 1.0), l, AvlParams{}),
                        Contains("scores has length 10, expected the layout's n = 14"));
    std::vector<double> nan = s;
    nan[4] = std::numeric_limits<double>::quiet_NaN();
    REQUIRE_THROWS_WITH(avl_select(nan, l, AvlParams{}), Contains("score[4] = nan"));
    const std::vector<std::int64_t> outside{0, 14};
    REQUIRE_THROWS_WITH(avl_select(s, l, AvlParams{}, outside), Contains("present position 14, expected a position in [0, 14)"));
    REQUIRE_THROWS_WITH(avl_select(s, l, AvlParams{}, {}, {{5}}), Contains("not a present non-image token"));
    // Q/K shapes.
    const AvlQkv in = avl_make_qkv(14, 4, 2, 8, 3);
    REQUIRE_THROWS_WITH(reference::avl_scores(in.qv(), View3<const float>(in.k.data(), {14, 3, 8})), Contains("not a multiple"));
    REQUIRE_THROWS_WITH(simd::avl_scores(View3<const float>(in.q.data(), {0, 4, 8}), in.kv()), Contains("empty"));
    // Schedule misuse.
    DecodeSchedule sch(avl_select(s, l, AvlParams{}), AvlParams{});
    sch.begin_step(0);
    REQUIRE_THROWS_WITH(sch.begin_step(0), Contains("expected steps in increasing order"));
    REQUIRE_THROWS_WITH(sch.positions(1, 14), Contains("seq_len = 14, expected > the prompt length 14"));
    sch.begin_step(1);
    REQUIRE_THROWS_WITH(sch.refresh(1, [](std::int64_t) { return 1.0; }), Contains("step 1 is not a refresh step"));
    // A decode step whose cache lost a scheduled position.
    KvCache<float> cache(2, 8);
    cache.assign(in.kv(), in.vv());
    const auto extra = vt::random_buffer<float>(16, 9);
    cache.append(View2<const float>(extra.data(), {2, 8}), View2<const float>(extra.data(), {2, 8}));
    TokenSelection k;
    k.n = 15;
    k.indices = {{0, 1, 14}};
    cache.keep(k);
    DecodeSchedule s2(avl_select(s, l, AvlParams{}), AvlParams{});
    std::vector<float> o(32);
    const auto q = vt::random_buffer<float>(32, 10);
    REQUIRE_THROWS_WITH(simd::avl_decode_step(View2<const float>(q.data(), {4, 8}), cache, s2, 0, View2<float>(o.data(), {4, 8})),
                        Contains("is not in KV head 0 of the cache"));
}

#ifdef VLSPARSE_SOURCE_DIR
#include <cstdlib>
#include <filesystem>
#include <set>

#include <vlsparse/reference/avl_golden.hpp>

namespace {

std::filesystem::path avl_golden_root() {
    if (const char* d = std::getenv("VLSPARSE_GOLDEN_DIR")) return std::filesystem::path(d) / "avl";
    return std::filesystem::path(VLSPARSE_SOURCE_DIR) / "golden" / "avl";
}

template <class Backend>
void check_avl_case(const std::filesystem::path& dir, const char* backend) {
    INFO("case " << dir.string() << ", backend " << backend);
    GoldenManifest m;
    const auto inputs = golden::read_avl_inputs(dir, &m);
    REQUIRE(inputs.steps == 12);
    REQUIRE(inputs.params.refresh_every == 3);
    const auto outputs = golden::run_avl_case<Backend>(inputs);
    vt::check_golden_outputs(dir, m, outputs, golden::avl_output_metric, vt::precision_of(backend));
}

}  // namespace

TEST_CASE("avl: golden traces (12 steps, K = 3) from both paths", "[avl][golden]") {
    std::vector<std::filesystem::path> dirs;
    for (const auto& e : std::filesystem::directory_iterator(avl_golden_root()))
        if (e.is_directory()) dirs.push_back(e.path());
    std::sort(dirs.begin(), dirs.end());
    REQUIRE(dirs.size() == 3);
    for (const auto& d : dirs) {
        check_avl_case<reference::AvlOps>(d, "reference");
        check_avl_case<simd::AvlOps>(d, "simd");
    }
}
#endif
