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
    INFO("seed " << seed << " H " << H << " Hkv " << cache.n_kv_heads() << " lists " << rows.lists() << " len "
                 << rows.list(0).size());
    const auto q = vt::random_buffer<T>(static_cast<std::size_t>(H * d), seed, 1.0f);
    const View2<const T> qv(q.data(), {H, d});
    const auto L = static_cast<std::size_t>(rows.longest());
    std::vector<double> o_r(static_cast<std::size_t>(H * d)), p_r(static_cast<std::size_t>(H) * L);
    std::vector<float> o_s(static_cast<std::size_t>(H * d)), p_s(static_cast<std::size_t>(H) * L), o_s2(o_s.size());
    const auto Li = static_cast<std::int64_t>(L);
    reference::indexed_decode_attention(qv, cache, rows, View2<double>(o_r.data(), {H, d}),
                                        View2<double>(p_r.data(), {H, Li}));
    simd::indexed_decode_attention(qv, cache, rows, View2<float>(o_s.data(), {H, d}), View2<float>(p_s.data(), {H, Li}));
    simd::indexed_decode_attention(qv, cache, rows, View2<float>(o_s2.data(), {H, d}));
    REQUIRE(vt::max_abs_diff(o_r, std::vector<double>(o_r.size(), 0.0)) > 0.0);  // not all zero
    REQUIRE(vt::nmse(o_s, o_r) <= vt::kSimdVsReference.attention_nmse);
    REQUIRE(o_s2 == o_s);  // the probabilities do not change the output
    // The always-compiled scalar instruction set meets the same bar.
    std::vector<float> o_sc(o_s.size());
    simd::indexed_decode_attention<T, T, float, vlsparse::simd::scalar_arch>(qv, cache, rows,
                                                                             View2<float>(o_sc.data(), {H, d}));
    REQUIRE(vt::nmse(o_sc, o_r) <= vt::kSimdVsReference.attention_nmse);
    double pmax = 0.0;
    for (double x : p_r) pmax = std::max(pmax, x);
    REQUIRE(vt::max_abs_diff(p_s, p_r) <= vt::kSimdVsReference.score_rel * pmax);
    // Small chunks: every list crosses chunk boundaries, merged exactly as one softmax.
    std::vector<float> o_c(o_s.size());
    simd::detail::run_indexed_decode<simd::detail::native_arch>(qv, cache, rows, View2<float>(o_c.data(), {H, d}),
                                                                 1.0f / std::sqrt(static_cast<float>(d)), nullptr, 0, 5);
    REQUIRE(vt::nmse(o_c, o_r) <= vt::kSimdVsReference.attention_nmse);
    // The reference reads the listed rows exactly as a cache holding only those rows would.
    for (std::int64_t h = 0; h < H; h += std::max<std::int64_t>(1, H - 1)) {
        const std::int64_t g = h / (H / cache.n_kv_heads());
        const auto list = rows.for_kv_head(g);
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
                for (std::int64_t g = 0; g < Hkv; ++g) per.push(vt::random_subset(n, std::max<std::int64_t>(1, len - g * 3), s + 3 + g));
                compare_indexed(cf, per, H, s + 4);
                compare_indexed(cb, per, H, s + 5);
                // Long runs of consecutive rows next to scattered rows.
                std::vector<std::int64_t> run_rows;
                for (std::int64_t i = 0; i < n; ++i)
                    if ((i >= 3 && i < 3 + len) || (i > n - 40 && i % 5 == 0)) run_rows.push_back(i);
                compare_indexed(cf, CacheRows{run_rows}, H, s + 6);
            }
        }
    }
}

TEST_CASE("indexed decode: the full list equals decode_attention", "[indexed]") {
    const std::int64_t n = 150, H = 8, Hkv = 2, d = 64;
    const auto cache = random_cache<float>(n, Hkv, d, vt::base_seed() + 601);
    const auto q = vt::random_buffer<float>(H * d, vt::base_seed() + 602);
    std::vector<std::int64_t> every(n);
    std::iota(every.begin(), every.end(), std::int64_t{0});
    const CacheRows all{every};
    std::vector<double> a(H * d), b(H * d);
    reference::indexed_decode_attention(View2<const float>(q.data(), {H, d}), cache, all, View2<double>(a.data(), {H, d}));
    reference::decode_attention(View2<const float>(q.data(), {H, d}), cache, View2<double>(b.data(), {H, d}));
    REQUIRE(a == b);
    std::vector<float> s(H * d), t(H * d);
    simd::indexed_decode_attention(View2<const float>(q.data(), {H, d}), cache, all, View2<float>(s.data(), {H, d}));
    simd::decode_attention(View2<const float>(q.data(), {H, d}), cache, View2<float>(t.data(), {H, d}));
    REQUIRE(vt::nmse(s, b) <= vt::kSimdVsReference.attention_nmse);
    REQUIRE(vt::nmse(t, b) <= vt::kSimdVsReference.attention_nmse);
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
        const auto m = static_cast<std::int64_t>(rows.list(0).size());
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
                for (const auto r : rows.list(0)) acc += static_cast<double>(detail::load(cache.v(g)(r, c)));
                mean[static_cast<std::size_t>(h * d + c)] = acc / static_cast<double>(m);
            }
        }
        for (std::size_t i = 0; i < p_r.size(); ++i) {
            REQUIRE(p_r[i] == Approx(1.0 / static_cast<double>(m)).epsilon(1e-14));
            REQUIRE(p_s[i] == Approx(1.0 / static_cast<double>(m)).epsilon(1e-6));
        }
        REQUIRE(vt::nmse(o_r, mean) <= 1e-26);
        REQUIRE(vt::nmse(o_s, mean) <= vt::kSimdVsReference.attention_nmse);
    };
    for (const auto& [H, Hkv] : {std::pair<std::int64_t, std::int64_t>{1, 1}, {4, 2}, {8, 2}, {8, 1}}) {
        run(float{}, H, Hkv);
        run(half{}, H, Hkv);
        run(bfloat16{}, H, Hkv);
    }
}

TEST_CASE("CacheRows: CSR lists, for_kv_head, longest, view", "[indexed][cache_rows]") {
    const CacheRows none;
    REQUIRE(none.lists() == 0);
    REQUIRE(none.empty());
    REQUIRE(none.longest() == 0);
    REQUIRE(std::ranges::equal(none.indptr(), std::vector<std::int32_t>{0}));

    const CacheRows shared{{0, 5, 9}};
    REQUIRE(shared.shared());
    REQUIRE(shared.lists() == 1);
    REQUIRE(shared.total() == 3);
    REQUIRE(shared.longest() == 3);
    for (std::int64_t g : {0, 1, 7}) REQUIRE(std::ranges::equal(shared.for_kv_head(g), std::vector<std::int32_t>{0, 5, 9}));

    CacheRows per;
    per.push(std::vector<std::int64_t>{1, 2});
    per.push(std::vector<std::int32_t>{0, 3, 4, 8});
    per.push_all(3);
    REQUIRE(!per.shared());
    REQUIRE(per.lists() == 3);
    REQUIRE(per.longest() == 4);
    REQUIRE(std::ranges::equal(per.for_kv_head(1), std::vector<std::int32_t>{0, 3, 4, 8}));
    REQUIRE(std::ranges::equal(per.list(2), std::vector<std::int32_t>{0, 1, 2}));
    REQUIRE(std::ranges::equal(per.indptr(), std::vector<std::int32_t>{0, 2, 6, 9}));
    REQUIRE(std::ranges::equal(per.indices(), std::vector<std::int32_t>{1, 2, 0, 3, 4, 8, 0, 1, 2}));
    REQUIRE(per == CacheRows{{1, 2}, {0, 3, 4, 8}, {0, 1, 2}});
    REQUIRE(per == CacheRows(std::vector<std::vector<std::int64_t>>{{1, 2}, {0, 3, 4, 8}, {0, 1, 2}}));
    REQUIRE_FALSE(per == CacheRows{{1, 2}, {0, 3, 4, 8}, {0, 1}});
    REQUIRE_FALSE(CacheRows{{1}, {2}} == CacheRows{{1, 2}});  // same entries, other lists

    // view(): the BatchRowLists of one sequence the batched decode reads, over the same arrays.
    const BatchRowLists v = per.view();
    REQUIRE(!v.dense());
    REQUIRE(v.lists_per_seq == 3);
    REQUIRE(v.indptr == per.indptr().data());
    REQUIRE(v.indices == per.indices().data());
    REQUIRE(v.list_of(0, 2) == 2);
    REQUIRE(shared.view().lists_per_seq == 1);
    REQUIRE(shared.view().list_of(0, 5) == 0);

    // Empty and unordered lists are held as given: the decode functions report them (tested below).
    const CacheRows odd{{}, {3, 1}};
    REQUIRE(odd.list(0).empty());
    REQUIRE(odd.longest() == 2);
}

TEST_CASE("CacheRows: what it cannot hold is a clear error", "[indexed][cache_rows][errors]") {
    CacheRows r;
    REQUIRE_THROWS_WITH(r.push({0, std::int64_t{1} << 31}), Contains("list 0 holds row 2147483648 at entry 1") &&
                                                                Contains("does not fit in int32"));
    REQUIRE_THROWS_WITH(CacheRows({{0}, {-(std::int64_t{1} << 40)}}), Contains("list 1 holds row -1099511627776"));
    REQUIRE(r.lists() == 0);  // a refused list is not added
    REQUIRE_THROWS_WITH(r.push_all(-1), Contains("n = -1, expected >= 0"));
    r.push({4, 5});
    r.push({6});
    REQUIRE_THROWS_WITH(r.list(2), Contains("list 2 of 2 lists; expected 0 <= l < 2"));
    REQUIRE_THROWS_WITH(r.for_kv_head(2), Contains("CacheRows::for_kv_head") && Contains("KV head 2 of 2 lists"));
    REQUIRE_THROWS_WITH(r.for_kv_head(-1), Contains("KV head -1"));
    REQUIRE_THROWS_WITH(CacheRows{{1}}.for_kv_head(-1), Contains("the list is shared"));
}

namespace {

// One sequence's K/V in an engine's own buffers, and the same rows in a KvCache.
template <class T>
struct EngineCache {
    std::int64_t n, Hkv, d, cap;
    std::vector<T> k, v;         // the engine's buffers (layout per view below)
    std::vector<std::int32_t> len, table;
    KvCache<T> cache;
};

// Token-major [cap, H_kv, d] with rows n.. (capacity not yet used) holding NaN: never read.
template <class T>
EngineCache<T> engine_cache(std::int64_t n, std::int64_t Hkv, std::int64_t d, std::uint64_t seed) {
    EngineCache<T> e{n, Hkv, d, n + 5, {}, {}, {static_cast<std::int32_t>(n)}, {}, KvCache<T>(Hkv, d)};
    e.k = vt::random_buffer<T>(static_cast<std::size_t>(e.cap * Hkv * d), seed, 1.0f);
    e.v = vt::random_buffer<T>(e.k.size(), seed + 1, 1.0f);
    for (std::size_t i = static_cast<std::size_t>(n * Hkv * d); i < e.k.size(); ++i)
        e.k[i] = e.v[i] = from_float<T>(std::numeric_limits<float>::quiet_NaN());
    e.cache.assign(View3<const T>(e.k.data(), {n, Hkv, d}), View3<const T>(e.v.data(), {n, Hkv, d}));
    return e;
}

}  // namespace

TEST_CASE("indexed and dense decode over an engine's own cache (KvBatchView) equal the KvCache results bit for bit",
          "[indexed][view]") {
    const std::uint64_t seed = vt::base_seed() + 1000;
    INFO("seed " << seed);
    const std::int64_t n = 150, d = 40;
    auto run = [&](auto tag, std::int64_t H, std::int64_t Hkv) {
        using T = decltype(tag);
        INFO("dtype " << dtype_name(dtype_of<T>()) << " H " << H << " H_kv " << Hkv);
        auto e = engine_cache<T>(n, Hkv, d, seed + static_cast<std::uint64_t>(H * 10 + Hkv));
        const auto q = vt::random_buffer<T>(static_cast<std::size_t>(H * d), seed + 2, 1.0f);
        const View2<const T> qv(q.data(), {H, d});
        // The same rows in three layouts: token-major (NHD), head-major (HND) and NHD pages of 16 rows
        // in a shuffled pool; and a token-major buffer with a row stride that is not a multiple of d.
        const KvBatchView<const T> nhd =
            contiguous_kv_batch<const T>(e.k.data(), e.v.data(), 1, e.cap, static_cast<std::int32_t>(Hkv),
                                         static_cast<std::int32_t>(d), e.len.data());
        std::vector<T> kh(e.k.size()), vh(e.v.size());
        for (std::int64_t r = 0; r < e.cap; ++r)
            for (std::int64_t g = 0; g < Hkv; ++g)
                for (std::int64_t c = 0; c < d; ++c) {
                    kh[static_cast<std::size_t>((g * e.cap + r) * d + c)] = e.k[static_cast<std::size_t>((r * Hkv + g) * d + c)];
                    vh[static_cast<std::size_t>((g * e.cap + r) * d + c)] = e.v[static_cast<std::size_t>((r * Hkv + g) * d + c)];
                }
        KvBatchView<const T> hnd = nhd;
        hnd.k = kh.data();
        hnd.v = vh.data();
        hnd.row_stride = d;
        hnd.head_stride = e.cap * d;
        hnd.page_stride = Hkv * e.cap * d;
        const std::int64_t P = 16, pages = (n + P - 1) / P, pool = pages + 3;
        std::vector<T> kp(static_cast<std::size_t>(pool * P * Hkv * d), from_float<T>(0.0f)), vp(kp);
        std::vector<std::int32_t> table(static_cast<std::size_t>(pages));
        for (std::int64_t p = 0; p < pages; ++p) table[static_cast<std::size_t>(p)] = static_cast<std::int32_t>((p * 5 + 2) % pool);
        for (std::int64_t r = 0; r < n; ++r) {
            const std::int64_t dst = (table[static_cast<std::size_t>(r / P)] * P + r % P) * Hkv * d;
            std::copy_n(e.k.begin() + r * Hkv * d, Hkv * d, kp.begin() + dst);
            std::copy_n(e.v.begin() + r * Hkv * d, Hkv * d, vp.begin() + dst);
        }
        const KvBatchView<const T> paged = paged_kv_batch_nhd<const T>(
            kp.data(), vp.data(), 1, pool, P, static_cast<std::int32_t>(Hkv), static_cast<std::int32_t>(d), table.data(),
            pages, e.len.data());
        const std::int64_t rs = Hkv * d + 3;  // rows 3 elements apart beyond their heads
        std::vector<T> ks(static_cast<std::size_t>(e.cap * rs)), vs(ks.size());
        for (std::int64_t r = 0; r < n; ++r) {
            std::copy_n(e.k.begin() + r * Hkv * d, Hkv * d, ks.begin() + r * rs);
            std::copy_n(e.v.begin() + r * Hkv * d, Hkv * d, vs.begin() + r * rs);
        }
        KvBatchView<const T> odd = nhd;
        odd.k = ks.data();
        odd.v = vs.data();
        odd.row_stride = rs;
        odd.page_stride = e.cap * rs;

        const CacheRows shared{vt::random_subset(n, 57, seed + 3)};
        CacheRows per;
        for (std::int64_t g = 0; g < Hkv; ++g) per.push(vt::random_subset(n, 30 + 11 * g, seed + 4 + static_cast<std::uint64_t>(g)));
        for (const CacheRows* rows : std::initializer_list<const CacheRows*>{&shared, &per}) {
            const std::int64_t L = rows->longest();
            std::vector<double> ro(static_cast<std::size_t>(H * d)), rp(static_cast<std::size_t>(H * L));
            std::vector<float> so(ro.size()), sp(rp.size());
            reference::indexed_decode_attention(qv, e.cache, *rows, View2<double>(ro.data(), {H, d}), View2<double>(rp.data(), {H, L}));
            simd::indexed_decode_attention(qv, e.cache, *rows, View2<float>(so.data(), {H, d}), View2<float>(sp.data(), {H, L}));
            for (const auto& [view, name] : {std::pair{nhd, "nhd"}, std::pair{hnd, "hnd"}, std::pair{paged, "paged"},
                                             std::pair{odd, "row stride d + 3"}}) {
                INFO("layout " << name << ", lists " << rows->lists());
                std::vector<double> ro2(ro.size()), rp2(rp.size());
                std::vector<float> so2(so.size()), sp2(sp.size()), so3(so.size());
                reference::indexed_decode_attention(qv, view, *rows, View2<double>(ro2.data(), {H, d}),
                                                    View2<double>(rp2.data(), {H, L}));
                REQUIRE(ro2 == ro);
                REQUIRE(rp2 == rp);
                simd::indexed_decode_attention(qv, view, *rows, View2<float>(so2.data(), {H, d}), View2<float>(sp2.data(), {H, L}));
                simd::indexed_decode_attention(qv, view, *rows, View2<float>(so3.data(), {H, d}));
                REQUIRE(so3 == so2);
                if (view.row_stride % d == 0) {  // the same kernels over the same rows
                    REQUIRE(so2 == so);
                    REQUIRE(sp2 == sp);
                } else {  // one kernel call per row: the same arithmetic up to fp32 rounding
                    REQUIRE(vt::nmse(so2, ro) <= vt::kSimdVsReference.attention_nmse);
                    REQUIRE(vt::max_abs_diff(sp2, rp) <= vt::kSimdVsReference.score_rel);
                }
            }
        }
        // Dense decode: every row of the sequence (never the NaN rows past it).
        std::vector<double> rd(static_cast<std::size_t>(H * d)), rd2(rd.size());
        std::vector<float> sd(rd.size()), sd2(rd.size());
        reference::decode_attention(qv, e.cache, View2<double>(rd.data(), {H, d}));
        simd::decode_attention(qv, e.cache, View2<float>(sd.data(), {H, d}));
        for (const auto& view : {nhd, hnd, paged}) {
            reference::decode_attention(qv, view, View2<double>(rd2.data(), {H, d}));
            REQUIRE(rd2 == rd);
            simd::decode_attention(qv, view, View2<float>(sd2.data(), {H, d}));
            REQUIRE(sd2 == sd);
        }
    };
    for (const auto& [H, Hkv] : {std::pair<std::int64_t, std::int64_t>{1, 1}, {4, 2}, {8, 2}, {6, 3}}) {
        run(float{}, H, Hkv);
        run(half{}, H, Hkv);
        run(bfloat16{}, H, Hkv);
    }
}

TEST_CASE("decode over an engine's cache view: bad input is a clear error in both paths", "[indexed][view][errors]") {
    const std::int64_t n = 12, H = 4, Hkv = 2, d = 8;
    auto e = engine_cache<float>(n, Hkv, d, vt::base_seed() + 1100);
    const auto q = vt::random_buffer<float>(H * d, vt::base_seed() + 1101);
    std::vector<float> out(H * d);
    const View2<const float> qv(q.data(), {H, d});
    const View2<float> ov(out.data(), {H, d});
    const KvBatchView<const float> view = contiguous_kv_batch<const float>(e.k.data(), e.v.data(), 1, e.cap, Hkv, d, e.len.data());
    auto both = [&](const KvBatchView<const float>& c, const CacheRows& rows, View2<float> o, const std::string& msg) {
        INFO(msg);
        REQUIRE_THROWS_WITH(reference::indexed_decode_attention(qv, c, rows, o), Contains(msg));
        REQUIRE_THROWS_WITH(simd::indexed_decode_attention(qv, c, rows, o), Contains(msg));
    };
    both(view, CacheRows{{0, 12}}, ov, "holds row 12 at entry 1, expected a row in [0, 12)");  // the sequence's length
    both(view, CacheRows{{}}, ov, "row list 0 is empty");
    both(view, CacheRows{{1}, {2}, {3}}, ov, "rows has 3 lists, expected 1 (shared) or 2");
    KvBatchView<const float> two = view;
    two.batch = 2;
    both(two, CacheRows{{0}}, ov, "the cache view holds 2 sequences; expected 1");
    std::vector<std::int32_t> long_len{static_cast<std::int32_t>(e.cap + 1)};
    KvBatchView<const float> too_long = view;
    too_long.seq_lens = long_len.data();
    both(too_long, CacheRows{{0}}, ov, "holds 18 rows, expected 1..17");
    both(view, CacheRows{{0}}, View2<float>(const_cast<float*>(e.k.data()) + 3, {H, d}), "aliases input cache k");
    REQUIRE_THROWS_WITH(simd::decode_attention(qv, two, ov), Contains("simd::decode_attention") && Contains("2 sequences"));
    REQUIRE_THROWS_WITH(reference::decode_attention(qv, two, ov), Contains("reference::decode_attention"));
    // NaN in a listed row: an error; rows past the sequence's length (NaN here) are never read.
    e.k[static_cast<std::size_t>((4 * Hkv + 1) * d + 2)] = std::numeric_limits<float>::quiet_NaN();
    REQUIRE_THROWS_WITH(simd::indexed_decode_attention(qv, view, CacheRows{{3, 4}}, ov), Contains("cache k row 4 of KV head 1"));
    REQUIRE_THROWS_WITH(reference::indexed_decode_attention(qv, view, CacheRows{{3, 4}}, ov), Contains("cache k[4, 2] of KV head 1"));
    REQUIRE_NOTHROW(simd::indexed_decode_attention(qv, view, CacheRows{{3, 11}}, ov));
    REQUIRE_NOTHROW(reference::indexed_decode_attention(qv, view, CacheRows{{3, 11}}, ov));
}
