// Tests of KvCache: assign from strided views, append, eviction with shared and per-head lists,
// positions, compaction, byte accounting, and errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <vlsparse/core/dtype.hpp>
#include <vlsparse/core/selection.hpp>
#include <vlsparse/core/tensor.hpp>
#include <vlsparse/kv/kv_cache.hpp>
#include "error_of.hpp"

using Catch::Matchers::Contains;
using vlsparse::bfloat16;
using vlsparse::KvCache;
using vlsparse::TokenSelection;

namespace {

// Distinct for i < 8, g < 4, c < 4, and at most 7 significant bits: exact in fp32, fp16 and bf16,
// so stored values compare exactly.
float kval(std::int64_t i, std::int64_t g, std::int64_t c) { return static_cast<float>(16 * i + 4 * g + c) * 0.5f; }
float vval(std::int64_t i, std::int64_t g, std::int64_t c) { return -kval(i, g, c) - 1.0f; }

// K, V of n tokens stored head-major [Hkv, n, d], as an engine might hold them.
struct HeadMajorKv {
    std::int64_t n, Hkv, d;
    std::vector<float> k, v;
    HeadMajorKv(std::int64_t n_, std::int64_t hkv, std::int64_t d_) : n(n_), Hkv(hkv), d(d_) {
        k.resize(static_cast<std::size_t>(n * Hkv * d));
        v.resize(k.size());
        for (std::int64_t g = 0; g < Hkv; ++g)
            for (std::int64_t i = 0; i < n; ++i)
                for (std::int64_t c = 0; c < d; ++c) {
                    k[static_cast<std::size_t>((g * n + i) * d + c)] = kval(i, g, c);
                    v[static_cast<std::size_t>((g * n + i) * d + c)] = vval(i, g, c);
                }
    }
    vlsparse::View3<const float> kview() const { return vlsparse::head_major<const float>(k.data(), n, Hkv, d); }
    vlsparse::View3<const float> vview() const { return vlsparse::head_major<const float>(v.data(), n, Hkv, d); }
};

template <class T>
std::vector<std::int64_t> positions(const KvCache<T>& c, std::int64_t g) {
    const auto p = c.positions(g);
    return {p.begin(), p.end()};
}

// Every row of every head holds the K/V of the position it records.
template <class T>
void check_rows(const KvCache<T>& c) {
    for (std::int64_t g = 0; g < c.n_kv_heads(); ++g) {
        const auto pos = c.positions(g);
        REQUIRE(c.rows(g) == static_cast<std::int64_t>(pos.size()));
        const auto k = c.k(g), v = c.v(g);
        REQUIRE(k.shape[0] == c.rows(g));
        REQUIRE(k.shape[1] == c.head_dim());
        for (std::int64_t r = 0; r < c.rows(g); ++r)
            for (std::int64_t col = 0; col < c.head_dim(); ++col) {
                INFO("head " << g << " row " << r << " position " << pos[static_cast<std::size_t>(r)]);
                REQUIRE(vlsparse::to_float(k(r, col)) == kval(pos[static_cast<std::size_t>(r)], g, col));
                REQUIRE(vlsparse::to_float(v(r, col)) == vval(pos[static_cast<std::size_t>(r)], g, col));
            }
    }
}

TokenSelection shared(std::int64_t n, std::vector<std::int64_t> idx) {
    TokenSelection s;
    s.n = n;
    s.indices = {std::move(idx)};
    return s;
}

using vt::error_of;

}  // namespace

TEMPLATE_TEST_CASE("KvCache: assign from a strided view, append, keep", "[kv]", float, bfloat16, vlsparse::half) {
    const HeadMajorKv src(6, 2, 4);
    KvCache<TestType> c(2, 4);
    CHECK(c.seq_len() == 0);
    CHECK(c.kv_bytes() == 0);
    c.assign(src.kview(), src.vview());
    CHECK(c.seq_len() == 6);
    CHECK(c.rows(0) == 6);
    CHECK(c.rows(1) == 6);
    CHECK(positions(c, 0) == std::vector<std::int64_t>{0, 1, 2, 3, 4, 5});
    check_rows(c);
    CHECK(c.kv_bytes() == 2 * 6 * 4 * 2 * static_cast<std::int64_t>(sizeof(TestType)));
    CHECK(c.position_bytes() == 2 * 6 * 8);

    // Shared eviction: every head keeps {0, 2, 5}, rows compacted in position order.
    c.keep(shared(6, {0, 2, 5}));
    CHECK(c.seq_len() == 6);  // eviction never renumbers nor shortens the sequence
    CHECK(positions(c, 0) == std::vector<std::int64_t>{0, 2, 5});
    CHECK(positions(c, 1) == std::vector<std::int64_t>{0, 2, 5});
    check_rows(c);
    CHECK(c.kv_bytes() == 2 * 3 * 4 * 2 * static_cast<std::int64_t>(sizeof(TestType)));

    // Decode continues at the original length: the appended token is position 6.
    std::vector<float> kn(2 * 4), vn(2 * 4);
    for (std::int64_t g = 0; g < 2; ++g)
        for (std::int64_t col = 0; col < 4; ++col) {
            kn[static_cast<std::size_t>(g * 4 + col)] = kval(6, g, col);
            vn[static_cast<std::size_t>(g * 4 + col)] = vval(6, g, col);
        }
    c.append(vlsparse::View2<const float>(kn.data(), {2, 4}), vlsparse::View2<const float>(vn.data(), {2, 4}));
    CHECK(c.seq_len() == 7);
    CHECK(positions(c, 0) == std::vector<std::int64_t>{0, 2, 5, 6});
    check_rows(c);

    // Per-head eviction: each KV head keeps its own list.
    TokenSelection per;
    per.n = 7;
    per.indices = {{2, 6}, {0, 5, 6}};
    c.keep(per);
    CHECK(positions(c, 0) == std::vector<std::int64_t>{2, 6});
    CHECK(positions(c, 1) == std::vector<std::int64_t>{0, 5, 6});
    check_rows(c);
    CHECK(c.kv_bytes() == (2 + 3) * 4 * 2 * static_cast<std::int64_t>(sizeof(TestType)));
    CHECK(c.position_bytes() == (2 + 3) * 8);
    CHECK(c.seq_len() == 7);

    // Keeping a position evicted earlier is an error naming the head and the position.
    CHECK_THAT(error_of([&] { c.keep(shared(7, {0, 5})); }),
               Contains("KvCache::keep: position 0 is not in KV head 0 of the cache") &&
                   Contains("evicted earlier, or beyond seq_len 7"));
    // Keeping everything that is left is a no-op.
    c.keep_positions(1, std::vector<std::int64_t>{0, 5, 6});
    CHECK(positions(c, 1) == std::vector<std::int64_t>{0, 5, 6});
    // An empty list empties the head.
    c.keep_positions(0, std::vector<std::int64_t>{});
    CHECK(c.rows(0) == 0);
    CHECK(c.kv_bytes() == 3 * 4 * 2 * static_cast<std::int64_t>(sizeof(TestType)));
    check_rows(c);
}

TEST_CASE("KvCache: bf16 storage rounds to nearest even", "[kv]") {
    // One token, one head, d = 3; values that are not exact in bf16.
    const std::vector<float> k{1.00390625f /* 1 + 2^-8: tie -> 1.0 */, 1.01171875f /* 1 + 3*2^-8 -> 1 + 2^-6 */,
                               0.1f};
    const std::vector<float> v{-1.00390625f, 3.0f, 1e-3f};
    KvCache<bfloat16> c(1, 3);
    c.assign(vlsparse::View3<const float>(k.data(), {1, 1, 3}), vlsparse::View3<const float>(v.data(), {1, 1, 3}));
    CHECK(c.k(0)(0, 0).bits == 0x3F80);
    CHECK(c.k(0)(0, 1).bits == 0x3F82);
    CHECK(c.k(0)(0, 2).bits == bfloat16::from_float(0.1f));
    CHECK(c.v(0)(0, 0).bits == 0xBF80);
    CHECK(c.v(0)(0, 2).bits == bfloat16::from_float(1e-3f));
    CHECK(c.kv_bytes() == 1 * 3 * 2 * 2);

    // fp32 storage keeps the exact values; a bf16 input widens exactly into it.
    KvCache<float> f(1, 3);
    std::vector<bfloat16> kb{bfloat16(1.5f), bfloat16(-2.0f), bfloat16(0.1f)};
    f.assign(vlsparse::View3<const bfloat16>(kb.data(), {1, 1, 3}), vlsparse::View3<const bfloat16>(kb.data(), {1, 1, 3}));
    CHECK(f.k(0)(0, 0) == 1.5f);
    CHECK(f.k(0)(0, 2) == bfloat16::to_float(bfloat16::from_float(0.1f)));
}

TEST_CASE("KvCache: assign from token-major and padded strides; reassign resets", "[kv]") {
    // Token-major [n, Hkv, d] with each token row padded to 8 elements (Hkv * d = 6).
    const std::int64_t n = 3, Hkv = 2, d = 3, pad = 8;
    std::vector<float> kb(static_cast<std::size_t>(n * pad), -99.0f), vb(kb.size(), -99.0f);
    for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t g = 0; g < Hkv; ++g)
            for (std::int64_t c = 0; c < d; ++c) {
                kb[static_cast<std::size_t>(i * pad + g * d + c)] = kval(i, g, c);
                vb[static_cast<std::size_t>(i * pad + g * d + c)] = vval(i, g, c);
            }
    const vlsparse::View3<const float> kv(kb.data(), {n, Hkv, d}, {pad, d, 1});
    const vlsparse::View3<const float> vv(vb.data(), {n, Hkv, d}, {pad, d, 1});
    KvCache<float> c(Hkv, d);
    c.assign(kv, vv);
    check_rows(c);
    // A strided innermost dimension: every other element of a [n, Hkv, 2d] buffer.
    std::vector<float> wide(static_cast<std::size_t>(n * Hkv * 2 * d), -99.0f);
    for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t g = 0; g < Hkv; ++g)
            for (std::int64_t col = 0; col < d; ++col)
                wide[static_cast<std::size_t>((i * Hkv + g) * 2 * d + 2 * col)] = kval(i, g, col);
    const vlsparse::View3<const float> ks(wide.data(), {n, Hkv, d}, {Hkv * 2 * d, 2 * d, 2});
    KvCache<float> s(Hkv, d);
    s.assign(ks, vv);
    for (std::int64_t g = 0; g < Hkv; ++g)
        for (std::int64_t i = 0; i < n; ++i)
            for (std::int64_t col = 0; col < d; ++col) REQUIRE(s.k(g)(i, col) == kval(i, g, col));

    // assign replaces everything, positions restart at 0.
    c.keep(shared(3, {1}));
    c.assign(kv, vv);
    CHECK(c.seq_len() == 3);
    CHECK(positions(c, 1) == std::vector<std::int64_t>{0, 1, 2});
    check_rows(c);
}

TEST_CASE("KvCache: errors leave the cache unchanged", "[kv]") {
    const HeadMajorKv src(5, 2, 2);
    KvCache<float> c(2, 2);
    c.assign(src.kview(), src.vview());
    c.keep(shared(5, {0, 1, 3, 4}));  // position 2 evicted

    auto unchanged = [&] {
        CHECK(positions(c, 0) == std::vector<std::int64_t>{0, 1, 3, 4});
        CHECK(positions(c, 1) == std::vector<std::int64_t>{0, 1, 3, 4});
        check_rows(c);
    };
    CHECK_THAT(error_of([&] { c.keep(shared(5, {0, 2, 3})); }),
               Contains("KvCache::keep: position 2 is not in KV head 0 of the cache (evicted earlier"));
    unchanged();
    // Beyond seq_len, after some positions that were present (a partial compaction must not happen).
    CHECK_THAT(error_of([&] { c.keep(shared(9, {1, 3, 7})); }),
               Contains("position 7 is not in KV head 0") && Contains("beyond seq_len 5"));
    unchanged();
    // Unsorted and duplicate lists.
    CHECK_THAT(error_of([&] { c.keep(shared(5, {3, 1})); }),
               Contains("position list for KV head 0 is not sorted ascending without duplicates at entry 1"));
    unchanged();
    CHECK_THAT(error_of([&] { c.keep(shared(5, {1, 1})); }), Contains("not sorted ascending without duplicates"));
    unchanged();
    // Per-head lists where only the second head's list is bad: the first head is not touched either.
    TokenSelection per;
    per.n = 5;
    per.indices = {{0, 4}, {1, 2}};
    CHECK_THAT(error_of([&] { c.keep(per); }), Contains("position 2 is not in KV head 1"));
    unchanged();
    per.indices = {{0}, {1}, {3}};
    CHECK_THAT(error_of([&] { c.keep(per); }), Contains("selection has 3 lists, expected 1 or 2"));
    unchanged();
    CHECK_THAT(error_of([&] { c.keep_positions(2, std::vector<std::int64_t>{0}); }),
               Contains("KV head 2, expected 0 <= g < 2"));
    CHECK_THAT(error_of([&] { (void)c.k(-1); }), Contains("KV head -1"));
    CHECK_THAT(error_of([&] { (void)c.rows(2); }), Contains("KV head 2"));

    // Shape errors in assign / append.
    const HeadMajorKv three(4, 3, 2);
    CHECK_THAT(error_of([&] { c.assign(three.kview(), three.vview()); }),
               Contains("KvCache::assign: k has shape [4, 3, 2], expected [n, 2, 2]"));
    const HeadMajorKv other_n(4, 2, 2);
    CHECK_THAT(error_of([&] { c.assign(src.kview(), other_n.vview()); }),
               Contains("KvCache::assign: v has shape [4, 2, 2], expected the shape of k"));
    const vlsparse::View3<const float> negative(src.k.data() + 8, {2, 2, 2}, {-2, 4, 1});
    CHECK_THAT(error_of([&] { c.assign(negative, negative); }), Contains("k has negative stride -2"));
    unchanged();
    std::vector<float> row(6, 1.0f);
    CHECK_THAT(error_of([&] {
                   c.append(vlsparse::View2<const float>(row.data(), {3, 2}),
                            vlsparse::View2<const float>(row.data(), {3, 2}));
               }),
               Contains("KvCache::append: k has shape [3, 2], expected [2, 2]"));
    CHECK_THAT(error_of([&] {
                   c.append(vlsparse::View2<const float>(row.data(), {2, 2}),
                            vlsparse::View2<const float>(row.data(), {1, 2}));
               }),
               Contains("KvCache::append: v has shape [1, 2]"));
    CHECK(c.seq_len() == 5);
    unchanged();

    CHECK_THAT(error_of([] { KvCache<float> bad(0, 4); }), Contains("n_kv_heads = 0, expected > 0"));
    CHECK_THAT(error_of([] { KvCache<float> bad(2, 0); }), Contains("head_dim = 0, expected > 0"));
}

TEST_CASE("KvCache: assign with positions (a layer after a sequence filter)", "[kv]") {
    const HeadMajorKv src(4, 2, 2);  // the K/V of the 4 tokens still in the sequence
    KvCache<float> c(2, 2);
    const std::vector<std::int64_t> pos = {0, 3, 4, 8};
    c.assign(src.kview(), src.vview(), pos, 10);
    CHECK(c.seq_len() == 10);
    CHECK(positions(c, 0) == pos);
    CHECK(positions(c, 1) == pos);
    for (std::int64_t g = 0; g < 2; ++g)  // row i holds input token i, under position pos[i]
        for (std::int64_t r = 0; r < 4; ++r)
            for (std::int64_t col = 0; col < 2; ++col) {
                REQUIRE(c.k(g)(r, col) == kval(r, g, col));
                REQUIRE(c.v(g)(r, col) == vval(r, g, col));
            }
    // Eviction speaks in positions; decode appends at seq_len.
    c.keep(shared(10, {3, 8}));
    CHECK(positions(c, 0) == std::vector<std::int64_t>{3, 8});
    std::vector<float> row(4, 1.0f);
    c.append(vlsparse::View2<const float>(row.data(), {2, 2}), vlsparse::View2<const float>(row.data(), {2, 2}));
    CHECK(positions(c, 1) == std::vector<std::int64_t>{3, 8, 10});
    CHECK(c.seq_len() == 11);

    // Bad positions: wrong count, out of range, unsorted; the cache is left unchanged.
    KvCache<float> d(2, 2);
    d.assign(src.kview(), src.vview());
    const std::vector<std::int64_t> three = {0, 1, 2}, beyond = {0, 1, 2, 10}, unsorted = {0, 2, 1, 3};
    CHECK_THAT(error_of([&] { d.assign(src.kview(), src.vview(), three, 10); }),
               Contains("KvCache::assign: positions has 3 entries and k has 4 rows"));
    CHECK_THAT(error_of([&] { d.assign(src.kview(), src.vview(), beyond, 10); }),
               Contains("positions[3] = 10, expected a position in [0, seq_len = 10)"));
    CHECK_THAT(error_of([&] { d.assign(src.kview(), src.vview(), unsorted, 10); }),
               Contains("positions[2] = 1 is not above positions[1] = 2"));
    CHECK(d.seq_len() == 4);
    CHECK(positions(d, 0) == std::vector<std::int64_t>{0, 1, 2, 3});
}

TEST_CASE("KvCache: large blocks are 2 MiB-aligned (huge pages advised), small ones ordinary; data survive growth",
          "[kv]") {
    using vlsparse::detail::kLargePage;
    using vlsparse::detail::LargePageAllocator;
    LargePageAllocator<float> a;
    float* small = a.allocate(100);
    float* large = a.allocate(kLargePage / sizeof(float) + 1);  // just over 2 MiB: rounded up to 4 MiB
    REQUIRE(reinterpret_cast<std::uintptr_t>(large) % kLargePage == 0);
    large[kLargePage / sizeof(float)] = 1.0f;  // the last element is writable
    small[99] = 2.0f;
    a.deallocate(large, kLargePage / sizeof(float) + 1);
    a.deallocate(small, 100);
    REQUIRE(a == LargePageAllocator<double>{});
    REQUIRE_THROWS_AS(a.allocate(static_cast<std::size_t>(-1) / 2), std::bad_array_new_length);

    // A cache of 2048 rows x d = 256 fp32 holds 2 MiB per KV head: its rows start on a 2 MiB boundary.
    const std::int64_t n = 2048, Hkv = 2, d = 256;
    std::vector<float> k(static_cast<std::size_t>(n * Hkv * d)), v(k.size());
    for (std::size_t i = 0; i < k.size(); ++i) {
        k[i] = static_cast<float>(i % 1000);
        v[i] = -static_cast<float>(i % 777);
    }
    KvCache<float> c(Hkv, d);
    c.assign(vlsparse::View3<const float>(k.data(), {n, Hkv, d}), vlsparse::View3<const float>(v.data(), {n, Hkv, d}));
    for (std::int64_t g = 0; g < Hkv; ++g) {
        REQUIRE(reinterpret_cast<std::uintptr_t>(c.k(g).data) % kLargePage == 0);
        REQUIRE(reinterpret_cast<std::uintptr_t>(c.v(g).data) % kLargePage == 0);
    }
    // Appending past the block reallocates; every row is still there.
    const std::vector<float> row(static_cast<std::size_t>(Hkv * d), 3.0f);
    c.append(vlsparse::View2<const float>(row.data(), {Hkv, d}), vlsparse::View2<const float>(row.data(), {Hkv, d}));
    REQUIRE(c.rows(1) == n + 1);
    for (std::int64_t i : {std::int64_t{0}, n / 2, n - 1})
        for (std::int64_t col : {std::int64_t{0}, d - 1}) {
            REQUIRE(c.k(1)(i, col) == k[static_cast<std::size_t>((i * Hkv + 1) * d + col)]);
            REQUIRE(c.v(1)(i, col) == v[static_cast<std::size_t>((i * Hkv + 1) * d + col)]);
        }
    REQUIRE(c.k(1)(n, 0) == 3.0f);
}

TEST_CASE("KvCache: assign with positions reads no position before the first (issue 21)", "[kv][issue21]") {
    // The order check's message indexed positions[i - 1] at i == 0 too: a read before the span that
    // -D_GLIBCXX_ASSERTIONS (the sanitizer build) aborts on. One row, then the first row's error.
    const HeadMajorKv src(1, 2, 2);
    KvCache<float> c(2, 2);
    const std::vector<std::int64_t> pos{3};
    c.assign(src.kview(), src.vview(), pos, 5);
    CHECK(positions(c, 0) == pos);
    const HeadMajorKv two(2, 2, 2);
    const std::vector<std::int64_t> down{4, 1};
    CHECK_THAT(error_of([&] { c.assign(two.kview(), two.vview(), down, 5); }),
               Contains("positions[1] = 1 is not above positions[0] = 4"));
}

TEST_CASE("KvCache: a finite value that overflows the storage type is an error (issue 21)", "[kv][issue21]") {
    // bf16 1e5 is finite; fp16 holds at most 65504, so it used to be stored as inf silently.
    std::vector<bfloat16> kb(2 * 1 * 4, bfloat16(1.0f)), vb(kb);
    vb[6] = bfloat16(1e5f);  // token 1, KV head 0, column 2
    const vlsparse::View3<const bfloat16> k(kb.data(), {2, 1, 4}), v(vb.data(), {2, 1, 4});
    KvCache<vlsparse::half> h(1, 4);
    CHECK_THAT(error_of([&] { h.assign(k, v); }),
               Contains("KvCache::assign: v[1, 0, 2] = 99840 does not fit fp16") && Contains("65504"));
    CHECK(h.seq_len() == 0);  // left unchanged
    const std::vector<std::int64_t> pos{0, 1};
    CHECK_THAT(error_of([&] { h.assign(k, v, pos, 2); }), Contains("v[1, 0, 2] = 99840 does not fit fp16"));
    CHECK_THAT(error_of([&] {
                   h.append(vlsparse::View2<const bfloat16>(vb.data() + 4, {1, 4}),
                            vlsparse::View2<const bfloat16>(vb.data() + 4, {1, 4}));
               }),
               Contains("KvCache::append: k[0, 2] = 99840 does not fit fp16"));
    // Wider storage holds it; values that are already inf or NaN are stored as they are (the attention's
    // check_finite rejects them), only a finite value that the conversion turns into inf is an error.
    KvCache<float> f(1, 4);
    CHECK_NOTHROW(f.assign(k, v));
    KvCache<bfloat16> b(1, 4);
    CHECK_NOTHROW(b.assign(k, v));
    vb[6] = bfloat16(std::numeric_limits<float>::infinity());
    CHECK_NOTHROW(h.assign(k, v));
    CHECK(std::isinf(vlsparse::to_float(h.v(0)(1, 2))));
}
