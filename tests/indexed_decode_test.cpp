// Indexed decode attention (attention/indexed_decode.hpp, reference/indexed_decode.hpp): one decode
// step over listed cache rows. SIMD path against the reference on fresh seeded inputs over GQA ratios,
// dtypes, list lengths and ties; the full list against decode_attention; row lists after eviction;
// bad input in both paths.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

#include <vlsparse/attention/decode.hpp>
#include <vlsparse/attention/indexed_decode.hpp>
#include <vlsparse/reference/attention.hpp>
#include <vlsparse/reference/indexed_decode.hpp>

#include "test_util.hpp"

using namespace vlsparse;
using Catch::Matchers::Contains;

namespace {

// A cache of n rows per KV head with random K/V (values exactly representable in T).
template <class T>
KvCache<T> random_cache(std::int64_t n, std::int64_t Hkv, std::int64_t d, std::uint64_t seed) {
    const auto k = vt::random_buffer<T>(static_cast<std::size_t>(n * Hkv * d), seed, 1.0f);
    const auto v = vt::random_buffer<T>(static_cast<std::size_t>(n * Hkv * d), seed + 1, 1.0f);
    KvCache<T> c(Hkv, d);
    c.assign(View3<const T>(k.data(), {n, Hkv, d}), View3<const T>(v.data(), {n, Hkv, d}));
    return c;
}

template <class T>
void compare_indexed(const KvCache<T>& cache, const CacheRows& rows, std::int64_t H, std::uint64_t seed) {
    const std::int64_t d = cache.head_dim();
    INFO("seed " << seed << " H " << H << " Hkv " << cache.n_kv_heads() << " lists " << rows.size() << " len "
                 << rows[0].size());
    const auto q = vt::random_buffer<T>(static_cast<std::size_t>(H * d), seed, 1.0f);
    const View2<const T> qv(q.data(), {H, d});
    std::size_t L = 0;
    for (const auto& l : rows) L = std::max(L, l.size());
    std::vector<double> o_r(static_cast<std::size_t>(H * d)), p_r(static_cast<std::size_t>(H) * L);
    std::vector<float> o_s(static_cast<std::size_t>(H * d)), p_s(static_cast<std::size_t>(H) * L), o_s2(o_s.size());
    const auto Li = static_cast<std::int64_t>(L);
    reference::indexed_decode_attention(qv, cache, rows, View2<double>(o_r.data(), {H, d}),
                                        View2<double>(p_r.data(), {H, Li}));
    simd::indexed_decode_attention(qv, cache, rows, View2<float>(o_s.data(), {H, d}), View2<float>(p_s.data(), {H, Li}));
    simd::indexed_decode_attention(qv, cache, rows, View2<float>(o_s2.data(), {H, d}));
    REQUIRE(vt::max_abs_diff(o_r, std::vector<double>(o_r.size(), 0.0)) > 0.0);  // not all zero
    REQUIRE(vt::nmse(o_s, o_r) <= vt::kFastVsReference.attention_nmse);
    REQUIRE(o_s2 == o_s);  // the probabilities do not change the output
    // The always-compiled scalar instruction set meets the same bar.
    std::vector<float> o_sc(o_s.size());
    simd::indexed_decode_attention<T, T, float, vlsparse::detail::scalar_arch>(qv, cache, rows,
                                                                             View2<float>(o_sc.data(), {H, d}));
    REQUIRE(vt::nmse(o_sc, o_r) <= vt::kFastVsReference.attention_nmse);
    double pmax = 0.0;
    for (double x : p_r) pmax = std::max(pmax, x);
    REQUIRE(vt::max_abs_diff(p_s, p_r) <= vt::kFastVsReference.score_rel * pmax);
    // Small chunks: every list crosses chunk boundaries, merged exactly as one softmax.
    std::vector<float> o_c(o_s.size());
    simd::detail::run_indexed_decode<simd::detail::native_arch>(qv, cache, rows, View2<float>(o_c.data(), {H, d}),
                                                                 1.0f / std::sqrt(static_cast<float>(d)), nullptr, 0, 5);
    REQUIRE(vt::nmse(o_c, o_r) <= vt::kFastVsReference.attention_nmse);
    // The reference reads the listed rows exactly as a cache holding only those rows would.
    for (std::int64_t h = 0; h < H; h += std::max<std::int64_t>(1, H - 1)) {
        const std::int64_t g = h / (H / cache.n_kv_heads());
        const auto& list = rows.size() == 1 ? rows[0] : rows[static_cast<std::size_t>(g)];
        KvCache<T> sub(1, d);
        std::vector<T> kk, vv;
        for (auto r : list)
            for (std::int64_t c = 0; c < d; ++c) {
                kk.push_back(cache.k(g)(r, c));
                vv.push_back(cache.v(g)(r, c));
            }
        const auto m = static_cast<std::int64_t>(list.size());
        sub.assign(View3<const T>(kk.data(), {m, 1, d}), View3<const T>(vv.data(), {m, 1, d}));
        std::vector<double> o1(static_cast<std::size_t>(d));
        reference::decode_attention(View2<const T>(q.data() + h * d, {1, d}), sub, View2<double>(o1.data(), {1, d}));
        for (std::int64_t c = 0; c < d; ++c) REQUIRE(o1[static_cast<std::size_t>(c)] == o_r[static_cast<std::size_t>(h * d + c)]);
    }
}

}  // namespace

TEST_CASE("indexed decode: simd matches reference over GQA ratios, dtypes and list lengths", "[indexed]") {
    const std::uint64_t seed = vt::base_seed() + 500;
    INFO("seed " << seed);
    const std::int64_t n = vt::small_run() ? 90 : 300, d = 40;  // d = 40: not a multiple of the SIMD width
    for (std::int64_t Hkv : {1, 2}) {
        for (std::int64_t ratio : {1, 2, 3, 4, 8}) {  // 3: head blocks of 2 + 1 in the group kernels
            const std::int64_t H = Hkv * ratio;
            const auto cf = random_cache<float>(n, Hkv, d, seed + static_cast<std::uint64_t>(H * 10 + Hkv));
            const auto cb = random_cache<bfloat16>(n, Hkv, d, seed + 7 + static_cast<std::uint64_t>(H * 10 + Hkv));
            const auto ch = random_cache<half>(n, Hkv, d, seed + 9 + static_cast<std::uint64_t>(H * 10 + Hkv));
            for (std::int64_t len : {std::int64_t{1}, std::int64_t{7}, std::int64_t{17}, std::int64_t{33}, n * 3 / 10, n}) {
                const auto s = seed + static_cast<std::uint64_t>(len * 100 + H);
                const CacheRows shared{vt::random_subset(n, len, s)};
                compare_indexed(cf, shared, H, s);
                compare_indexed(cb, shared, H, s + 1);
                compare_indexed(ch, shared, H, s + 2);
                CacheRows per;
                for (std::int64_t g = 0; g < Hkv; ++g) per.push_back(vt::random_subset(n, std::max<std::int64_t>(1, len - g * 3), s + 3 + g));
                compare_indexed(cf, per, H, s + 4);
                compare_indexed(cb, per, H, s + 5);
                // Long runs of consecutive rows next to scattered rows.
                CacheRows runs{{}};
                for (std::int64_t i = 0; i < n; ++i)
                    if ((i >= 3 && i < 3 + len) || (i > n - 40 && i % 5 == 0)) runs[0].push_back(i);
                compare_indexed(cf, runs, H, s + 6);
            }
        }
    }
}

TEST_CASE("indexed decode: the full list equals decode_attention", "[indexed]") {
    const std::int64_t n = 150, H = 8, Hkv = 2, d = 64;
    const auto cache = random_cache<float>(n, Hkv, d, vt::base_seed() + 601);
    const auto q = vt::random_buffer<float>(H * d, vt::base_seed() + 602);
    CacheRows all{std::vector<std::int64_t>(n)};
    std::iota(all[0].begin(), all[0].end(), std::int64_t{0});
    std::vector<double> a(H * d), b(H * d);
    reference::indexed_decode_attention(View2<const float>(q.data(), {H, d}), cache, all, View2<double>(a.data(), {H, d}));
    reference::decode_attention(View2<const float>(q.data(), {H, d}), cache, View2<double>(b.data(), {H, d}));
    REQUIRE(a == b);
    std::vector<float> s(H * d), t(H * d);
    simd::indexed_decode_attention(View2<const float>(q.data(), {H, d}), cache, all, View2<float>(s.data(), {H, d}));
    simd::decode_attention(View2<const float>(q.data(), {H, d}), cache, View2<float>(t.data(), {H, d}));
    REQUIRE(vt::nmse(s, b) <= vt::kFastVsReference.attention_nmse);
    REQUIRE(vt::nmse(t, b) <= vt::kFastVsReference.attention_nmse);
}

TEST_CASE("indexed decode: rows_for_positions after eviction", "[indexed]") {
    const std::int64_t n = 20, Hkv = 2, d = 8;
    auto cache = random_cache<float>(n, Hkv, d, vt::base_seed() + 700);
    TokenSelection keep;
    keep.n = n;
    keep.indices = {{0, 3, 4, 9, 15, 19}, {1, 3, 10, 19}};
    cache.keep(keep);
    TokenSelection want;
    want.n = n;
    want.indices = {{3, 19}};
    REQUIRE(rows_for_positions(cache, want) == CacheRows{{1, 5}, {1, 3}});
    want.indices = {{3, 15}, {10}};
    REQUIRE(rows_for_positions(cache, want) == CacheRows{{1, 4}, {2}});
    want.indices = {{3, 9, 19}};
    REQUIRE_THROWS_WITH(rows_for_positions(cache, want), Contains("position 9 is not in KV head 1"));
    want.indices = {{9, 3}};
    REQUIRE_THROWS_WITH(rows_for_positions(cache, want), Contains("not sorted"));
}

TEST_CASE("indexed decode: bad input is a clear error in both paths", "[indexed][errors]") {
    const std::int64_t n = 12, H = 4, Hkv = 2, d = 8;
    auto cache = random_cache<float>(n, Hkv, d, vt::base_seed() + 800);
    const auto q = vt::random_buffer<float>(H * d, vt::base_seed() + 801);
    std::vector<float> out(H * d);
    const View2<const float> qv(q.data(), {H, d});
    const View2<float> ov(out.data(), {H, d});
    auto both = [&](const CacheRows& rows, const std::string& msg) {
        INFO(msg);
        REQUIRE_THROWS_WITH(reference::indexed_decode_attention(qv, cache, rows, ov), Contains(msg));
        REQUIRE_THROWS_WITH(simd::indexed_decode_attention(qv, cache, rows, ov), Contains(msg));
        REQUIRE_THROWS_AS(simd::indexed_decode_attention(qv, cache, rows, ov), vlsparse::error);
    };
    both(CacheRows{{}}, "row list 0 is empty");
    both(CacheRows{{0, 1}, {}}, "row list 1 is empty");
    both(CacheRows{{0, 12}}, "holds row 12 at entry 1, expected a row in [0, 12)");
    both(CacheRows{{-1}}, "holds row -1");
    both(CacheRows{{3, 2}}, "not sorted ascending without duplicates at entry 1");
    both(CacheRows{{2, 2}}, "not sorted ascending without duplicates at entry 1");
    both(CacheRows{{0}, {1}, {2}}, "rows has 3 lists, expected 1 (shared) or 2");
    both(CacheRows{}, "rows has 0 lists");
    REQUIRE_THROWS_WITH(simd::indexed_decode_attention(View2<const float>(q.data(), {3, d}), cache, CacheRows{{0}},
                                                       View2<float>(out.data(), {3, d})),
                        Contains("not a multiple"));
    std::vector<float> pr(H * 5);
    REQUIRE_THROWS_WITH(simd::indexed_decode_attention(qv, cache, CacheRows{{0, 1, 2}}, ov, View2<float>(pr.data(), {H, 5})),
                        Contains("probs has shape [4, 5], expected [4, 3]"));
    std::vector<double> prd(H * 5);
    REQUIRE_THROWS_WITH(reference::indexed_decode_attention(qv, cache, CacheRows{{0, 1, 2}}, ov,
                                                            View2<double>(prd.data(), {H, 5})),
                        Contains("probs has shape [4, 5], expected [4, 3]"));
    // NaN in a row that is read is an error; in a row that is not read it is never touched.
    std::vector<float> kb = vt::random_buffer<float>(n * Hkv * d, 5), vb = kb;
    kb[(4 * Hkv + 1) * d + 2] = std::numeric_limits<float>::quiet_NaN();
    KvCache<float> bad(Hkv, d);
    bad.assign(View3<const float>(kb.data(), {n, Hkv, d}), View3<const float>(vb.data(), {n, Hkv, d}));
    REQUIRE_THROWS_WITH(simd::indexed_decode_attention(qv, bad, CacheRows{{3, 4}}, ov), Contains("cache k row 4 of KV head 1"));
    REQUIRE_THROWS_WITH(reference::indexed_decode_attention(qv, bad, CacheRows{{3, 4}}, ov), Contains("cache k[4, 2] of KV head 1"));
    REQUIRE_NOTHROW(simd::indexed_decode_attention(qv, bad, CacheRows{{3, 5}}, ov));
    REQUIRE_NOTHROW(reference::indexed_decode_attention(qv, bad, CacheRows{{3, 5}}, ov));
    REQUIRE_THROWS_WITH(simd::indexed_decode_attention(qv, KvCache<float>{}, CacheRows{{0}}, ov), Contains("no KV heads"));
}

TEST_CASE("indexed decode: equal keys tie every score: the mean of the listed values on both paths", "[indexed]") {
    // Every cached key is the same row, so every listed position gets probability 1 / m and the output
    // is the mean of the listed values: ties that a wrong softmax or a skipped row would break.
    const std::uint64_t seed = vt::base_seed() + 900;
    INFO("seed " << seed);
    const std::int64_t n = 37, d = 12;
    auto run = [&](auto tag, std::int64_t H, std::int64_t Hkv) {
        using T = decltype(tag);
        INFO("dtype " << dtype_name(dtype_of<T>()) << " H " << H << " H_kv " << Hkv);
        const auto row = vt::random_buffer<T>(static_cast<std::size_t>(d), seed, 1.0f);
        std::vector<T> k(static_cast<std::size_t>(n * Hkv * d));
        for (std::size_t i = 0; i < k.size(); ++i) k[i] = row[i % static_cast<std::size_t>(d)];
        const auto v = vt::random_buffer<T>(k.size(), seed + 1, 1.0f);
        KvCache<T> cache(Hkv, d);
        cache.assign(View3<const T>(k.data(), {n, Hkv, d}), View3<const T>(v.data(), {n, Hkv, d}));
        const auto q = vt::random_buffer<T>(static_cast<std::size_t>(H * d), seed + 2, 1.0f);
        const CacheRows rows{{0, 1, 2, 5, 8, 13, 21, 34, 36}};
        const auto m = static_cast<std::int64_t>(rows[0].size());
        std::vector<double> o_r(static_cast<std::size_t>(H * d)), p_r(static_cast<std::size_t>(H * m));
        std::vector<float> o_s(o_r.size()), p_s(p_r.size());
        reference::indexed_decode_attention(View2<const T>(q.data(), {H, d}), cache, rows, View2<double>(o_r.data(), {H, d}),
                                            View2<double>(p_r.data(), {H, m}));
        simd::indexed_decode_attention(View2<const T>(q.data(), {H, d}), cache, rows, View2<float>(o_s.data(), {H, d}),
                                       View2<float>(p_s.data(), {H, m}));
        std::vector<double> mean(o_r.size(), 0.0);
        for (std::int64_t h = 0; h < H; ++h) {
            const std::int64_t g = h / (H / Hkv);
            for (std::int64_t c = 0; c < d; ++c) {
                double acc = 0.0;
                for (const auto r : rows[0]) acc += static_cast<double>(detail::load(cache.v(g)(r, c)));
                mean[static_cast<std::size_t>(h * d + c)] = acc / static_cast<double>(m);
            }
        }
        for (std::size_t i = 0; i < p_r.size(); ++i) {
            REQUIRE(p_r[i] == Approx(1.0 / static_cast<double>(m)).epsilon(1e-14));
            REQUIRE(p_s[i] == Approx(1.0 / static_cast<double>(m)).epsilon(1e-6));
        }
        REQUIRE(vt::nmse(o_r, mean) <= 1e-26);
        REQUIRE(vt::nmse(o_s, mean) <= vt::kFastVsReference.attention_nmse);
    };
    for (const auto& [H, Hkv] : {std::pair<std::int64_t, std::int64_t>{1, 1}, {4, 2}, {8, 2}, {8, 1}}) {
        run(float{}, H, Hkv);
        run(half{}, H, Hkv);
        run(bfloat16{}, H, Hkv);
    }
}
