// ZipVL: SIMD path against the reference on fresh seeded inputs, hand-computed cases, options,
// eviction + decode, and bad input.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>

#include <vlsparse/policies/zipvl.hpp>
#include <vlsparse/attention/decode.hpp>
#include <vlsparse/reference/zipvl.hpp>

#include "test_util.hpp"

using namespace vlsparse;

namespace {

using vt::Qkv;

// Random Q/K/V with a few "sink" keys so the attention is peaked like a real model's (otherwise a
// random input has near-uniform attention and every p is close to n).
template <class T>
Qkv<T> make_qkv(std::int64_t n, std::int64_t H, std::int64_t Hkv, std::int64_t d, std::uint64_t seed) {
    Qkv<T> r{n, H, Hkv, d, {}, {}, {}};
    auto q = vt::random_buffer<float>(static_cast<std::size_t>(n * H * d), seed, 1.0f);
    auto k = vt::random_buffer<float>(static_cast<std::size_t>(n * Hkv * d), seed + 1, 1.0f);
    r.v = vt::random_buffer<T>(static_cast<std::size_t>(n * Hkv * d), seed + 2, 1.0f);
    // Shared direction u: keys at every 13th position get +3u, queries +1.5u.
    auto u = vt::random_buffer<float>(static_cast<std::size_t>(d), seed + 3, 1.0f);
    for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t c = 0; c < d; ++c) {
            for (std::int64_t h = 0; h < H; ++h) q[static_cast<std::size_t>((i * H + h) * d + c)] += 1.5f * u[c];
            if (i % 13 == 0)
                for (std::int64_t g = 0; g < Hkv; ++g) k[static_cast<std::size_t>((i * Hkv + g) * d + c)] += 3.0f * u[c];
        }
    for (float x : q) r.q.push_back(from_float<T>(x));
    for (float x : k) r.k.push_back(from_float<T>(x));
    return r;
}

double max_abs(const std::vector<double>& v) {
    double m = 0.0;
    for (double x : v) m = std::max(m, std::abs(x));
    return m;
}

// The SIMD path may differ from the reference only where the reference itself is within rounding
// of a decision boundary: p may differ only if the reference's running sum at the other count is
// within `tol` of tau * M, and kept sets may differ only in positions whose normalized score is
// within `tol` of the cutoff score.
void check_selection_matches(const ZipVLSelection& s, const ZipVLSelection& r, const ZipVLParams& P) {
    REQUIRE(s.dense == r.dense);
    REQUIRE(s.probes == r.probes);
    REQUIRE(s.groups() == r.groups());
    REQUIRE(s.heads_per_group == r.heads_per_group);
    const double tol = vt::kSimdVsReference.score_rel;
    for (std::int64_t g = 0; g < r.groups(); ++g) {
        INFO("group " << g);
        const auto& ar = r.accumulated[g];
        const auto& as = s.accumulated[g];
        const double scale_a = max_abs(ar);
        for (std::size_t j = 0; j < ar.size(); ++j) {
            INFO("accumulated[" << j << "]");
            REQUIRE(std::abs(as[j] - ar[j]) <= tol * scale_a);
        }
        const double scale_n = max_abs(r.normalized[g]);
        for (std::size_t j = 0; j < ar.size(); ++j) {
            INFO("normalized[" << j << "]");
            REQUIRE(std::abs(s.normalized[g][j] - r.normalized[g][j]) <= tol * scale_n);
        }
        // p: equal, or the boundary is a genuine near-tie in the reference.
        const auto pr = r.p[g], ps = s.p[g];
        if (pr != ps) {
            std::vector<double> sorted = ar;
            std::sort(sorted.begin(), sorted.end(), std::greater<double>());
            const double M = static_cast<double>(r.heads_per_group * static_cast<std::int64_t>(r.probes.size()));
            double acc = 0.0;
            for (std::int64_t t = 0; t < std::min(pr, ps); ++t) acc += sorted[t];
            INFO("p differs: reference " << pr << ", simd " << ps << ", running sum " << acc << " vs tau*M "
                                         << P.tau * M);
            REQUIRE(std::abs(pr - ps) <= 1);
            REQUIRE(std::abs(acc - P.tau * M) <= tol * M);
            continue;  // the kept sets legitimately differ by the boundary token
        }
        const auto& kr = r.selection.indices[g];
        const auto& ks = s.selection.indices[g];
        REQUIRE(kr.size() == ks.size());
        if (kr != ks && pr > 0) {
            std::vector<double> sorted = r.normalized[g];
            std::sort(sorted.begin(), sorted.end(), std::greater<double>());
            const double cutoff = sorted[static_cast<std::size_t>(pr - 1)];
            std::vector<std::int64_t> diff;
            std::set_symmetric_difference(kr.begin(), kr.end(), ks.begin(), ks.end(), std::back_inserter(diff));
            for (auto j : diff) {
                INFO("kept sets differ at position " << j << ": normalized " << r.normalized[g][j] << ", cutoff "
                                                     << cutoff);
                REQUIRE(std::abs(r.normalized[g][j] - cutoff) <= tol * scale_n);
            }
        }
    }
}

template <class T>
void run_case(std::int64_t n, std::int64_t H, std::int64_t Hkv, std::int64_t d, const ZipVLParams& P,
              std::uint64_t seed, std::int64_t layer = 0) {
    INFO("n=" << n << " H=" << H << " Hkv=" << Hkv << " d=" << d << " dtype=" << dtype_name(dtype_of<T>())
              << " grouping=" << to_string(P.grouping) << " nnz=" << to_string(P.nnz) << " tau=" << P.tau
              << " seed=" << seed);
    auto in = make_qkv<T>(n, H, Hkv, d, seed);
    const Layout layout = Layout::text_only(n);
    const auto r = reference::zipvl_select(in.qv(), in.kv(), layout, layer, P);
    const auto s = simd::zipvl_select(in.qv(), in.kv(), layout, layer, P);
    check_selection_matches(s, r, P);

    // Prefill outputs on the reference's selection (so both attend the same set).
    std::vector<float> out_s(static_cast<std::size_t>(n * H * d)), out_r(out_s.size());
    reference::zipvl_prefill(in.qv(), in.kv(), in.vv(), r, View3<float>(out_r.data(), {n, H, d}), P);
    simd::zipvl_prefill(in.qv(), in.kv(), in.vv(), r, View3<float>(out_s.data(), {n, H, d}), P);
    REQUIRE(vt::nmse(out_s, out_r) <= vt::kSimdVsReference.attention_nmse);
}

}  // namespace

TEST_CASE("zipvl: simd matches reference over a sweep of shapes", "[zipvl]") {
    const std::uint64_t seed = vt::base_seed();
    INFO("seed " << seed);
    ZipVLParams P;
    P.tau = 0.9;
    P.probe_recent = 16;
    P.probe_random = 16;
    // Sanitizer builds (VLSPARSE_TEST_SMALL): the longest prompt is 300 tokens, not 1000 (its 8 runs took
    // most of this test's 24 s under ASan + UBSan at -O0).
    const std::int64_t lengths[] = {1, 7, 128, vt::small_run() ? 300 : 1000};
    for (std::int64_t n : lengths) {
        for (auto [H, Hkv] : {std::pair<std::int64_t, std::int64_t>{4, 4}, {4, 2}, {8, 2}, {8, 1}}) {
            for (auto grouping : {ZipVLGrouping::layer, ZipVLGrouping::kv_head}) {
                P.grouping = grouping;
                P.nnz = grouping == ZipVLGrouping::layer ? ZipVLNnz::causal_column : ZipVLNnz::probe_rows;
                run_case<float>(n, H, Hkv, 64, P, seed + static_cast<std::uint64_t>(n * 131 + H * 7 + Hkv));
            }
        }
    }
    if (!vt::small_run()) {
        P.grouping = ZipVLGrouping::kv_head;
        P.probe_recent = P.probe_random = 64;
        run_case<float>(4096, 2, 1, 128, P, seed + 4096);
    }
}

TEST_CASE("zipvl: simd matches reference for fp16 and bf16 inputs", "[zipvl]") {
    const std::uint64_t seed = vt::base_seed() + 77;
    INFO("seed " << seed);
    ZipVLParams P;
    P.tau = 0.95;
    P.probe_recent = 8;
    P.probe_random = 24;
    run_case<bfloat16>(300, 8, 2, 128, P, seed);
    run_case<half>(257, 4, 1, 64, P, seed + 1);
    P.grouping = ZipVLGrouping::kv_head;
    P.unselected = UnselectedRows::attend_selected;
    run_case<bfloat16>(129, 8, 8, 64, P, seed + 2);
}

TEST_CASE("zipvl: strided (head-major) inputs give the same selection as contiguous ones", "[zipvl]") {
    const std::int64_t n = 200, H = 4, Hkv = 2, d = 64;
    auto in = make_qkv<float>(n, H, Hkv, d, vt::base_seed() + 5);
    // Re-layout to [H, n, d] buffers and view them token-major.
    auto to_head_major = [&](const std::vector<float>& src, std::int64_t heads) {
        std::vector<float> dst(src.size());
        for (std::int64_t i = 0; i < n; ++i)
            for (std::int64_t h = 0; h < heads; ++h)
                for (std::int64_t c = 0; c < d; ++c) dst[(h * n + i) * d + c] = src[(i * heads + h) * d + c];
        return dst;
    };
    const auto qh = to_head_major(in.q, H), kh = to_head_major(in.k, Hkv);
    ZipVLParams P;
    P.tau = 0.9;
    const Layout layout = Layout::text_only(n);
    const auto a = simd::zipvl_select(in.qv(), in.kv(), layout, 0, P);
    const auto b = simd::zipvl_select(View3<const float>(head_major(qh.data(), n, H, d)),
                                      View3<const float>(head_major(kh.data(), n, Hkv, d)), layout, 0, P);
    const auto r = reference::zipvl_select(View3<const float>(head_major(qh.data(), n, H, d)),
                                           View3<const float>(head_major(kh.data(), n, Hkv, d)), layout, 0, P);
    REQUIRE(a.selection.indices == b.selection.indices);
    REQUIRE(a.accumulated == b.accumulated);
    check_selection_matches(b, r, P);
}

TEST_CASE("zipvl: hand-computed uniform attention", "[zipvl]") {
    // q = 0 gives uniform causal attention: row i puts 1/(i+1) on each key j <= i. With n = 4 and
    // every token a probe: a = [25/12, 13/12, 7/12, 3/12], M = 4.
    const std::int64_t n = 4, d = 2;
    std::vector<float> q(n * d, 0.0f), k = {1, 0, 0, 1, 1, 1, -1, 0};
    const View3<const float> qv(q.data(), {n, 1, d}), kv(k.data(), {n, 1, d});
    const Layout layout = Layout::text_only(n);
    ZipVLParams P;
    P.tau = 0.5;  // target 2: 25/12 alone reaches it
    auto check = [&](const ZipVLSelection& s) {
        const std::vector<double> a = {25.0 / 12, 13.0 / 12, 7.0 / 12, 3.0 / 12};
        REQUIRE(s.probes == std::vector<std::int64_t>{0, 1, 2, 3});
        for (int j = 0; j < 4; ++j) REQUIRE(s.accumulated[0][j] == Approx(a[j]).epsilon(1e-6));
        REQUIRE(s.p[0] == 1);
        REQUIRE(s.selection.indices[0] == std::vector<std::int64_t>{0});
        // causal_column: a~ = a / (n - j) = [25/48, 13/36, 7/24, 1/4]
        REQUIRE(s.normalized[0][1] == Approx(13.0 / 36).epsilon(1e-6));
    };
    check(reference::zipvl_select(qv, kv, layout, 0, P));
    check(simd::zipvl_select(qv, kv, layout, 0, P));
    P.tau = 0.8;  // target 3.2: 25/12 + 13/12 = 3.17 < 3.2, so p = 3
    for (const auto& s : {reference::zipvl_select(qv, kv, layout, 0, P), simd::zipvl_select(qv, kv, layout, 0, P)}) {
        REQUIRE(s.p[0] == 3);
        REQUIRE(s.selection.indices[0] == std::vector<std::int64_t>{0, 1, 2});
    }
    P.tau = 1.0;
    for (const auto& s : {reference::zipvl_select(qv, kv, layout, 0, P), simd::zipvl_select(qv, kv, layout, 0, P)})
        REQUIRE(s.p[0] == 4);
}

TEST_CASE("zipvl: exact ties are broken by lower position in both paths", "[zipvl]") {
    // q = 0: columns between two consecutive probes get identical scores; with nnz = probe_rows the
    // normalized scores tie too, and the lower positions must win.
    const std::int64_t n = 64, H = 2, d = 8;
    std::vector<float> q(n * H * d, 0.0f);
    auto k = vt::random_buffer<float>(n * d, vt::base_seed() + 9);
    const View3<const float> qv(q.data(), {n, H, d}), kv(k.data(), {n, 1, d});
    ZipVLParams P;
    P.tau = 0.6;
    P.nnz = ZipVLNnz::probe_rows;
    const std::vector<std::int64_t> probes = {15, 31, 47, 63};
    const auto r = reference::zipvl_select(qv, kv, Layout::text_only(n), 0, P, probes);
    const auto s = simd::zipvl_select(qv, kv, Layout::text_only(n), 0, P, probes);
    REQUIRE(r.p == s.p);
    REQUIRE(r.selection.indices == s.selection.indices);
    // Within the tied block [0, 16) the kept ones are a prefix.
    const auto& kept = r.selection.indices[0];
    const auto in_block = std::count_if(kept.begin(), kept.end(), [](auto j) { return j < 16; });
    for (std::int64_t j = 0; j < in_block; ++j) REQUIRE(kept[j] == j);
}

TEST_CASE("zipvl: probes", "[zipvl]") {
    ZipVLParams P;  // 64 + 64
    SECTION("n not larger than recent + random: every token is a probe") {
        const auto p = zipvl_probes(100, 0, P);
        REQUIRE(p.size() == 100);
        REQUIRE(p.front() == 0);
        REQUIRE(p.back() == 99);
    }
    SECTION("recent tail plus seeded random draws, sorted, reproducible, layer-dependent") {
        const auto a = zipvl_probes(1000, 3, P);
        REQUIRE(a.size() == 128);
        REQUIRE(std::is_sorted(a.begin(), a.end()));
        REQUIRE(std::set<std::int64_t>(a.begin(), a.end()).size() == 128);
        for (std::int64_t i = 936; i < 1000; ++i) REQUIRE(std::binary_search(a.begin(), a.end(), i));
        REQUIRE(a == zipvl_probes(1000, 3, P));
        REQUIRE(a != zipvl_probes(1000, 4, P));
        // The random part is exactly sample_without_replacement(n - recent, random, seed + layer).
        const auto rnd = sample_without_replacement(936, 64, P.seed + 3);
        REQUIRE(std::vector<std::int64_t>(a.begin(), a.begin() + 64) == rnd);
    }
    SECTION("ratio form") {
        P.probe_mode = ZipVLProbes::ratios;
        const auto a = zipvl_probes(1000, 0, P);  // ceil(50) + ceil(50)
        REQUIRE(a.size() == 100);
        REQUIRE(a.back() == 999);
    }
    SECTION("ratio form: a product that is an integer is not rounded up") {
        // 0.07 * 100 = 7.000000000000001 in double; a plain ceil gives 8 + 8 probes.
        P.probe_mode = ZipVLProbes::ratios;
        P.probe_recent_ratio = 0.07;
        P.probe_random_ratio = 0.07;
        REQUIRE(0.07 * 100.0 > 7.0);
        const auto a = zipvl_probes(100, 0, P);
        REQUIRE(a.size() == 14);
        std::vector<std::int64_t> tail(7);
        std::iota(tail.begin(), tail.end(), std::int64_t{93});
        REQUIRE(std::vector<std::int64_t>(a.end() - 7, a.end()) == tail);
        REQUIRE(std::vector<std::int64_t>(a.begin(), a.begin() + 7) == sample_without_replacement(93, 7, P.seed));
        // A product really above an integer still rounds up: 0.07 * 101 = 7.07 -> 8 + 8.
        REQUIRE(zipvl_probes(101, 0, P).size() == 16);
    }
    SECTION("recent = 0 still probes the last token") {
        P.probe_recent = 0;
        P.probe_random = 10;
        const auto a = zipvl_probes(500, 0, P);
        REQUIRE(a.back() == 499);
        REQUIRE(a.size() == 11);
    }
}

TEST_CASE("zipvl: options keep_last, keep_text, dense_layers, attend_selected", "[zipvl]") {
    const std::int64_t n = 120, H = 4, Hkv = 2, d = 32;
    auto in = make_qkv<float>(n, H, Hkv, d, vt::base_seed() + 11);
    const Layout layout = Layout::parse("text:10,image:100,text:10");
    ZipVLParams P;
    P.tau = 0.5;
    const auto base = simd::zipvl_select(in.qv(), in.kv(), layout, 0, P);
    REQUIRE(base.selection.indices[0].size() == static_cast<std::size_t>(base.p[0]));

    P.keep_last = 7;
    P.keep_text = true;
    for (const auto& s : {simd::zipvl_select(in.qv(), in.kv(), layout, 0, P),
                          reference::zipvl_select(in.qv(), in.kv(), layout, 0, P)}) {
        const auto& kept = s.selection.indices[0];
        for (std::int64_t j = 0; j < n; ++j) {
            const bool must = j >= n - 7 || layout.is_text(j);
            if (must) REQUIRE(std::binary_search(kept.begin(), kept.end(), j));
        }
        // Top-p tokens are still kept.
        for (auto j : base.selection.indices[0]) REQUIRE(std::binary_search(kept.begin(), kept.end(), j));
    }

    P.dense_layers = 2;
    const auto dense = simd::zipvl_select(in.qv(), in.kv(), layout, 1, P);
    REQUIRE(dense.dense);
    REQUIRE(dense.selection.indices[0].size() == static_cast<std::size_t>(n));
    REQUIRE_FALSE(simd::zipvl_select(in.qv(), in.kv(), layout, 2, P).dense);

    // attend_selected: unselected rows are not zero; zero mode leaves them zero.
    P.dense_layers = 0;
    P.keep_last = 0;
    P.keep_text = false;
    const auto s = simd::zipvl_select(in.qv(), in.kv(), layout, 0, P);
    std::vector<float> out(n * H * d);
    const View3<float> ov(out.data(), {n, H, d});
    simd::zipvl_prefill(in.qv(), in.kv(), in.vv(), s, ov, P);
    const auto& kept = s.selection.indices[0];
    std::int64_t unselected = -1;
    for (std::int64_t j = 1; j < n; ++j)
        if (!std::binary_search(kept.begin(), kept.end(), j) && kept.front() < j) unselected = j;
    REQUIRE(unselected > 0);
    for (std::int64_t c = 0; c < d; ++c) REQUIRE(ov(unselected, 0, c) == 0.0f);
    P.unselected = UnselectedRows::attend_selected;
    simd::zipvl_prefill(in.qv(), in.kv(), in.vv(), s, ov, P);
    double norm = 0.0;
    for (std::int64_t c = 0; c < d; ++c) norm += std::abs(ov(unselected, 0, c));
    REQUIRE(norm > 0.0);
}

TEST_CASE("zipvl: eviction keeps positions and decode matches the reference", "[zipvl]") {
    const std::int64_t n = 300, H = 8, Hkv = 2, d = 64;
    auto in = make_qkv<float>(n, H, Hkv, d, vt::base_seed() + 21);
    ZipVLParams P;
    P.tau = 0.9;
    P.grouping = ZipVLGrouping::kv_head;
    std::vector<float> out(n * H * d);
    KvCache<float> cache(Hkv, d);
    const auto s = simd::zipvl_prefill_layer(in.qv(), in.kv(), in.vv(), Layout::text_only(n), 0, P,
                                             View3<float>(out.data(), {n, H, d}), cache);
    for (std::int64_t g = 0; g < Hkv; ++g) {
        const auto pos = cache.positions(g);
        const auto& want = s.selection.indices[g];
        REQUIRE(std::vector<std::int64_t>(pos.begin(), pos.end()) == want);
        // Rows are the original K rows of those positions.
        for (std::size_t r = 0; r < want.size(); r += 17)
            for (std::int64_t c = 0; c < d; ++c) REQUIRE(cache.k(g)(r, c) == in.kv()(want[r], g, c));
    }
    REQUIRE(cache.seq_len() == n);
    // Three decode steps: append, attend, compare.
    for (int step = 0; step < 3; ++step) {
        auto qn = vt::random_buffer<float>(H * d, 1000 + step);
        auto kn = vt::random_buffer<float>(Hkv * d, 2000 + step);
        auto vn = vt::random_buffer<float>(Hkv * d, 3000 + step);
        cache.append(View2<const float>(kn.data(), {Hkv, d}), View2<const float>(vn.data(), {Hkv, d}));
        REQUIRE(cache.positions(0).back() == n + step);
        std::vector<float> os(H * d), orf(H * d);
        simd::decode_attention(View2<const float>(qn.data(), {H, d}), cache, View2<float>(os.data(), {H, d}));
        reference::decode_attention(View2<const float>(qn.data(), {H, d}), cache, View2<float>(orf.data(), {H, d}));
        REQUIRE(vt::nmse(os, orf) <= vt::kSimdVsReference.attention_nmse);
    }
}

TEST_CASE("zipvl: bad input is a clear error in both paths", "[zipvl][errors]") {
    const std::int64_t n = 32, H = 4, Hkv = 2, d = 16;
    auto in = make_qkv<float>(n, H, Hkv, d, 3);
    const Layout layout = Layout::text_only(n);
    using Catch::Matchers::Contains;
    auto both = [&](const ZipVLParams& P, const std::string& msg, std::int64_t layer = 0,
                    std::span<const std::int64_t> probes = {}) {
        REQUIRE_THROWS_WITH(reference::zipvl_select(in.qv(), in.kv(), layout, layer, P, probes), Contains(msg));
        REQUIRE_THROWS_WITH(simd::zipvl_select(in.qv(), in.kv(), layout, layer, P, probes), Contains(msg));
        REQUIRE_THROWS_AS(simd::zipvl_select(in.qv(), in.kv(), layout, layer, P, probes), vlsparse::error);
    };
    ZipVLParams P;
    for (double tau : {0.0, -0.1, 1.5, std::numeric_limits<double>::quiet_NaN()}) {
        P.tau = tau;
        both(P, "expected 0 < tau <= 1");
    }
    P = {};
    P.probe_recent = 0;
    P.probe_random = 0;
    both(P, "at least one probe");
    P = {};
    P.probe_mode = ZipVLProbes::ratios;
    P.probe_random_ratio = 1.5;
    both(P, "must be in [0, 1]");
    P = {};
    P.keep_last = -1;
    both(P, "keep_last");
    both(ZipVLParams{}, "layer = -1", -1);
    const std::vector<std::int64_t> bad_probes = {5, 3};
    both(ZipVLParams{}, "not sorted", 0, bad_probes);
    const std::vector<std::int64_t> far_probes = {40};
    both(ZipVLParams{}, "expected an index in [0, 32)", 0, far_probes);
    // Layout not matching n.
    REQUIRE_THROWS_WITH(simd::zipvl_select(in.qv(), in.kv(), Layout::text_only(n + 1), 0, ZipVLParams{}),
                        Contains("layout covers 33 tokens"));
    // H % H_kv != 0.
    const View3<const float> k3(in.k.data(), {n, 3, 8});
    REQUIRE_THROWS_WITH(simd::zipvl_select(in.qv(), View3<const float>(in.k.data(), {n / 2, 3, d}),
                                           Layout::text_only(n), 0, ZipVLParams{}),
                        Contains("GQA"));
    REQUIRE_THROWS_WITH(reference::zipvl_select(in.qv(), View3<const float>(in.k.data(), {n / 2, 3, d}),
                                                Layout::text_only(n), 0, ZipVLParams{}),
                        Contains("GQA"));
    // Empty input.
    REQUIRE_THROWS_WITH(simd::zipvl_select(View3<const float>(in.q.data(), {0, H, d}),
                                           View3<const float>(in.k.data(), {0, Hkv, d}), layout, 0, ZipVLParams{}),
                        Contains("empty input"));
    // NaN / Inf in the inputs: always an error in the reference, in the SIMD path when validating.
    auto q_bad = in.q;
    q_bad[5 * H * d + 3] = std::numeric_limits<float>::quiet_NaN();
    const View3<const float> qb(q_bad.data(), {n, H, d});
    REQUIRE_THROWS_WITH(reference::zipvl_select(qb, in.kv(), layout, 0, ZipVLParams{}), Contains("NaN"));
    REQUIRE_THROWS_WITH(simd::zipvl_select(qb, in.kv(), layout, 0, ZipVLParams{}), Contains("q[5, 0, 3]"));
    auto k_bad = in.k;
    k_bad[7] = std::numeric_limits<float>::infinity();
    REQUIRE_THROWS_WITH(simd::zipvl_select(in.qv(), View3<const float>(k_bad.data(), {n, Hkv, d}), layout, 0,
                                           ZipVLParams{}),
                        Contains("expected finite"));
    // Without validation the SIMD path does not scan, but a NaN that reaches the scores is still
    // rejected by the ranking step (n = 32 < 128 probes: every row is a probe, so it does reach them).
    ZipVLParams unchecked;
    unchecked.check_finite = false;
    REQUIRE_THROWS_WITH(simd::zipvl_select(qb, in.kv(), layout, 0, unchecked), Contains("finite"));
}
