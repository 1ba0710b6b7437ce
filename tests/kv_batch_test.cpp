// Tests of reference::kv_batch_append / kv_batch_compact (vlsparse/reference/kv_batch.hpp) against a
// plain model (per sequence: a list of rows and their positions): contiguous caches and paged ones
// (P = 1, 3, 16; NHD and HND pages drawn from a shuffled pool) hold identical logical contents after
// the same ragged appends and compactions (batched and single-sequence, keep lists of every row, one
// row, a suffix, every other row, random rows), appended rows converted between element types, the
// released pages and their -1 block-table slots, positions moved with the rows, and every error
// (each leaving the cache untouched).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <vector>
#include <vlsparse/core/dtype.hpp>
#include <vlsparse/core/rng.hpp>
#include <vlsparse/kv/kv_batch.hpp>
#include <vlsparse/reference/kv_batch.hpp>
#include "error_of.hpp"
#include "test_core.hpp"

using namespace vlsparse;
using Catch::Matchers::Contains;

namespace {

std::uint64_t base_seed() { return vt::seed_or(20261124u); }

using vt::error_of;

// Multiples of 1/4 in [-32, 32): exact in fp32, fp16 and bf16.
float small_value(SplitMix64& rng) { return static_cast<float>(static_cast<int>(rng.below(256)) - 128) * 0.25f; }

// Where a host batch keeps its rows.
struct Layout {
    std::int64_t P = 0;  // 0: contiguous
    bool hnd = false;
};

// A host batch of B sequences in one of the layouts, with a page pool and a free list (paged).
template <class T>
struct HostKv {
    std::int32_t B, Hkv, d;
    std::int64_t cap;
    Layout lay;
    std::vector<T> k, v;
    std::vector<std::int32_t> table, lens, free;
    std::vector<std::int64_t> pos;  // [B, cap]
    KvBatchView<T> view;

    HostKv(std::int32_t b, std::int32_t hkv, std::int32_t dd, std::int64_t capacity, Layout l, std::uint64_t seed)
        : B(b),
          Hkv(hkv),
          d(dd),
          cap(capacity),
          lay(l),
          lens(static_cast<std::size_t>(b), 0),
          pos(static_cast<std::size_t>(b * capacity), -1) {
        if (l.P == 0) {
            k.resize(static_cast<std::size_t>(B * cap * Hkv * d));
            v.resize(k.size());
            view = contiguous_kv_batch<T>(k.data(), v.data(), B, cap, Hkv, d, lens.data());
        } else {
            const std::int64_t stride = (cap + l.P - 1) / l.P, n_pages = stride * B + 3;
            k.resize(static_cast<std::size_t>(n_pages * l.P * Hkv * d));
            v.resize(k.size());
            table.assign(static_cast<std::size_t>(B * stride), -1);
            free.resize(static_cast<std::size_t>(n_pages));
            std::iota(free.begin(), free.end(), 0);
            SplitMix64 rng(seed);
            for (std::int64_t i = n_pages - 1; i > 0; --i)
                std::swap(free[static_cast<std::size_t>(i)], free[rng.below(static_cast<std::uint64_t>(i + 1))]);
            view = l.hnd ? paged_kv_batch_hnd<T>(k.data(), v.data(), B, n_pages, l.P, Hkv, d, table.data(), stride,
                                                 lens.data())
                         : paged_kv_batch_nhd<T>(k.data(), v.data(), B, n_pages, l.P, Hkv, d, table.data(), stride,
                                                 lens.data());
        }
        std::fill(k.begin(), k.end(), from_float<T>(-1000.0f));
        std::fill(v.begin(), v.end(), from_float<T>(-1000.0f));
    }
    View2<std::int64_t> positions() { return {pos.data(), {B, cap}}; }
    // Pages for `rows` rows of sequence b (a paged cache's caller allocates before appending).
    void reserve(std::int64_t b, std::int64_t rows) {
        if (lay.P == 0) return;
        for (std::int64_t s = 0; s < (rows + lay.P - 1) / lay.P; ++s) {
            auto& e = table[static_cast<std::size_t>(b * view.block_table_stride + s)];
            if (e >= 0) continue;
            REQUIRE(!free.empty());
            e = free.back();
            free.pop_back();
        }
    }
    float kat(std::int64_t b, std::int64_t r, std::int64_t g, std::int64_t c) const {
        return to_float(view.k_row(b, r, g)[c]);
    }
    float vat(std::int64_t b, std::int64_t r, std::int64_t g, std::int64_t c) const {
        return to_float(view.v_row(b, r, g)[c]);
    }
};

// The logical contents: per sequence, rows of [H_kv, d] K then V values, and positions.
struct Model {
    std::int32_t Hkv, d;
    std::vector<std::vector<std::vector<float>>> rows;  // [b][r] -> 2 * Hkv * d
    std::vector<std::vector<std::int64_t>> pos;
    std::vector<std::int64_t> next_pos;
};

// New rows for every sequence (a[b] each), float values, positions continuing each sequence.
struct NewRows {
    std::vector<float> k, v;
    std::vector<std::int32_t> indptr;
    std::vector<std::int64_t> pos;
    std::int64_t total = 0;
};

NewRows make_new(Model& m, const std::vector<std::int32_t>& a, SplitMix64& rng) {
    NewRows n;
    n.indptr.push_back(0);
    for (std::size_t b = 0; b < a.size(); ++b) {
        for (std::int32_t i = 0; i < a[b]; ++i) {
            std::vector<float> row(static_cast<std::size_t>(2 * m.Hkv * m.d));
            for (auto& x : row) x = small_value(rng);
            n.k.insert(n.k.end(), row.begin(), row.begin() + m.Hkv * m.d);
            n.v.insert(n.v.end(), row.begin() + m.Hkv * m.d, row.end());
            n.pos.push_back(m.next_pos[b]);
            m.rows[b].push_back(std::move(row));
            m.pos[b].push_back(m.next_pos[b]++);
        }
        n.indptr.push_back(n.indptr.back() + a[b]);
    }
    n.total = n.indptr.back();
    return n;
}

void model_keep(Model& m, std::size_t b, const std::vector<std::int32_t>& keep) {
    std::vector<std::vector<float>> r;
    std::vector<std::int64_t> p;
    for (auto i : keep) {
        r.push_back(m.rows[b][static_cast<std::size_t>(i)]);
        p.push_back(m.pos[b][static_cast<std::size_t>(i)]);
    }
    m.rows[b] = std::move(r);
    m.pos[b] = std::move(p);
}

template <class T>
void check_contents(const HostKv<T>& h, const Model& m) {
    for (std::int64_t b = 0; b < h.B; ++b) {
        const auto& rows = m.rows[static_cast<std::size_t>(b)];
        REQUIRE(h.lens[static_cast<std::size_t>(b)] == static_cast<std::int64_t>(rows.size()));
        for (std::int64_t r = 0; r < static_cast<std::int64_t>(rows.size()); ++r) {
            INFO("sequence " << b << " row " << r);
            REQUIRE(h.pos[static_cast<std::size_t>(b * h.cap + r)] ==
                    m.pos[static_cast<std::size_t>(b)][static_cast<std::size_t>(r)]);
            for (std::int64_t g = 0; g < h.Hkv; ++g)
                for (std::int64_t c = 0; c < h.d; ++c) {
                    const auto& row = rows[static_cast<std::size_t>(r)];
                    REQUIRE(h.kat(b, r, g, c) == to_float(from_float<T>(row[static_cast<std::size_t>(g * h.d + c)])));
                    REQUIRE(h.vat(b, r, g, c) ==
                            to_float(from_float<T>(row[static_cast<std::size_t>((h.Hkv + g) * h.d + c)])));
                }
        }
        if (h.lay.P > 0)  // slots past the sequence's pages are free (-1), those below hold pages
            for (std::int64_t s = 0; s < h.view.block_table_stride; ++s)
                CHECK((h.table[static_cast<std::size_t>(b * h.view.block_table_stride + s)] >= 0) ==
                      (s < (h.lens[static_cast<std::size_t>(b)] + h.lay.P - 1) / h.lay.P));
    }
}

template <class T>
void append(HostKv<T>& h, const NewRows& n) {
    for (std::int64_t b = 0; b < h.B; ++b)
        h.reserve(b, h.lens[static_cast<std::size_t>(b)] + n.indptr[static_cast<std::size_t>(b + 1)] -
                         n.indptr[static_cast<std::size_t>(b)]);
    const View3<const float> kn(n.k.data(), {n.total, h.Hkv, h.d}), vn(n.v.data(), {n.total, h.Hkv, h.d});
    reference::kv_batch_append(h.view, std::span<std::int32_t>(h.lens), kn, vn, n.indptr, h.positions(),
                               View1<const std::int64_t>(n.pos.data(), {n.total}));
}

// The pages sequence b releases when it keeps m rows: its slots ceil(m/P) .. ceil(len/P) - 1.
template <class T>
std::vector<std::int32_t> expected_freed(const HostKv<T>& h, std::int64_t b, std::int64_t m) {
    std::vector<std::int32_t> r;
    if (h.lay.P == 0) return r;
    for (std::int64_t s = (m + h.lay.P - 1) / h.lay.P;
         s < (h.lens[static_cast<std::size_t>(b)] + h.lay.P - 1) / h.lay.P; ++s)
        r.push_back(h.table[static_cast<std::size_t>(b * h.view.block_table_stride + s)]);
    return r;
}

// Keep lists of the kinds the GPU tests also use.
std::vector<std::int32_t> keep_list(int kind, std::int64_t n, SplitMix64& rng) {
    std::vector<std::int32_t> k;
    for (std::int64_t r = 0; r < n; ++r) {
        bool take = false;
        switch (kind) {
            case 0:
                take = true;
                break;  // every row
            case 1:
                take = r == n / 2;
                break;  // one row
            case 2:
                take = rng.uniform() < 0.4 || r == n - 1;
                break;  // random (newest kept)
            case 3:
                take = r % 2 == 1;
                break;  // every other row
            default:
                take = r >= n / 3;
                break;  // a suffix
        }
        if (take) k.push_back(static_cast<std::int32_t>(r));
    }
    if (k.empty()) k.push_back(static_cast<std::int32_t>(n - 1));
    return k;
}

template <class T>
void run_scenario(Layout lay, std::uint64_t seed) {
    const std::int32_t B = 3, Hkv = 2, d = 5;
    const std::int64_t cap = 40;
    INFO("P " << lay.P << (lay.hnd ? " HND" : "") << ", seed " << seed);
    HostKv<T> h(B, Hkv, d, cap, lay, seed);
    Model m{Hkv, d, std::vector<std::vector<std::vector<float>>>(B), std::vector<std::vector<std::int64_t>>(B),
            std::vector<std::int64_t>(B, 0)};
    SplitMix64 rng(seed + 1);
    // Ragged prefill through append (one sequence gets nothing), then a decode-like step.
    append(h, make_new(m, {17, 0, 33}, rng));
    check_contents(h, m);
    append(h, make_new(m, {1, 4, 2}, rng));
    check_contents(h, m);
    // Batched compaction: sequence 0 random, 1 untouched (all rows), 2 every other row.
    for (int round = 0; round < 5; ++round) {
        std::vector<std::int32_t> indptr{0}, keep, freed;
        const int kinds[3] = {(round + 2) % 5, 0, (round + 3) % 5};
        for (std::int64_t b = 0; b < B; ++b) {
            const auto l = keep_list(kinds[b], h.lens[static_cast<std::size_t>(b)], rng);
            const auto f = expected_freed(h, b, static_cast<std::int64_t>(l.size()));
            freed.insert(freed.end(), f.begin(), f.end());
            keep.insert(keep.end(), l.begin(), l.end());
            indptr.push_back(static_cast<std::int32_t>(keep.size()));
            model_keep(m, static_cast<std::size_t>(b), l);
        }
        const auto got =
            reference::kv_batch_compact(h.view, std::span<std::int32_t>(h.lens), indptr, keep, h.positions());
        CHECK(got == freed);
        h.free.insert(h.free.end(), got.begin(), got.end());
        check_contents(h, m);
        // Then an append (the released pages are reused) and a single-sequence compaction.
        append(h, make_new(m, {3, 2, 1}, rng));
        check_contents(h, m);
        const std::int64_t b = round % B;
        const auto l = keep_list(round, h.lens[static_cast<std::size_t>(b)], rng);
        const auto f = expected_freed(h, b, static_cast<std::int64_t>(l.size()));
        model_keep(m, static_cast<std::size_t>(b), l);
        const auto got1 = reference::kv_batch_compact(h.view, std::span<std::int32_t>(h.lens), b, l, h.positions());
        CHECK(got1 == f);
        h.free.insert(h.free.end(), got1.begin(), got1.end());
        check_contents(h, m);
    }
}

}  // namespace

TEMPLATE_TEST_CASE("reference kv_batch: contiguous and paged caches hold the same rows after appends and compactions",
                   "[kv][kv_batch]", float, bfloat16, vlsparse::half) {
    const auto seed = base_seed();
    run_scenario<TestType>({0, false}, seed);
    for (std::int64_t P : {1, 3, 16}) {
        run_scenario<TestType>({P, false}, seed + static_cast<std::uint64_t>(P));
        run_scenario<TestType>({P, true}, seed + 100 + static_cast<std::uint64_t>(P));
    }
}

TEST_CASE("reference kv_batch: appended rows are converted to the cache's type, or copied bit for bit",
          "[kv][kv_batch]") {
    std::vector<std::int32_t> lens{0};
    std::vector<bfloat16> k(4 * 2), v(k.size());
    const auto cache = contiguous_kv_batch<bfloat16>(k.data(), v.data(), 1, 4, 1, 2, lens.data());
    const std::vector<float> kn{1.00390625f, -3.0f, 1.01171875f, 0.1f}, vn{2.0f, 4.0f, 8.0f, 16.0f};
    reference::kv_batch_append(cache, std::span<std::int32_t>(lens), View3<const float>(kn.data(), {2, 1, 2}),
                               View3<const float>(vn.data(), {2, 1, 2}), std::vector<std::int32_t>{0, 2});
    CHECK(lens[0] == 2);
    for (std::size_t i = 0; i < 4; ++i) {
        CHECK(k[i].bits == bfloat16(kn[i]).bits);  // round to nearest even (1.00390625 -> 1, 1.01171875 -> 1.015625)
        CHECK(to_float(v[i]) == vn[i]);
    }
    // A finite fp32 value beyond fp16's range would round to inf: an error, nothing written.
    std::vector<std::int32_t> hlens{0};
    std::vector<vlsparse::half> hk(2), hv(2);
    const auto hc = contiguous_kv_batch<vlsparse::half>(hk.data(), hv.data(), 1, 1, 1, 2, hlens.data());
    const std::vector<float> big{1.0f, 70000.0f}, inf{INFINITY, 1.0f};
    CHECK_THAT(error_of([&] {
                   reference::kv_batch_append(
                       hc, std::span<std::int32_t>(hlens), View3<const float>(inf.data(), {1, 1, 2}),
                       View3<const float>(big.data(), {1, 1, 2}), std::vector<std::int32_t>{0, 1});
               }),
               Contains("v_new[0, 0, 1] = 70000 overflows the cache's fp16"));
    CHECK(hlens[0] == 0);
    // Inf itself is not an overflow: it is stored as inf.
    reference::kv_batch_append(hc, std::span<std::int32_t>(hlens), View3<const float>(inf.data(), {1, 1, 2}),
                               View3<const float>(inf.data(), {1, 1, 2}), std::vector<std::int32_t>{0, 1});
    CHECK(std::isinf(to_float(hk[0])));
    // A NaN with a payload, in the cache's own type: copied as is.
    const std::vector<bfloat16> raw{bfloat16::from_bits(0x7f81), bfloat16::from_bits(0x1234)};
    reference::kv_batch_append(cache, std::span<std::int32_t>(lens), View3<const bfloat16>(raw.data(), {1, 1, 2}),
                               View3<const bfloat16>(raw.data(), {1, 1, 2}), std::vector<std::int32_t>{0, 1});
    CHECK(k[4].bits == 0x7f81);
    CHECK(v[5].bits == 0x1234);
    CHECK(lens[0] == 3);
}

TEST_CASE("reference kv_batch: compaction releases the pages past the kept rows, in slot order, as -1 slots",
          "[kv][kv_batch]") {
    // One sequence of 10 rows in pages of 4: pages 7, 2, 5 (rows 0-3, 4-7, 8-9). Keeping 5 rows
    // needs 2 pages: page 5 is released and slot 2 becomes -1. Keeping 1 row releases page 2.
    std::vector<std::int32_t> lens{10}, table{7, 2, 5, -1};
    std::vector<float> k(8 * 4 * 1 * 1), v(k.size());
    const auto cache = paged_kv_batch_nhd<float>(k.data(), v.data(), 1, 8, 4, 1, 1, table.data(), 4, lens.data());
    for (std::int64_t r = 0; r < 10; ++r) {
        *cache.k_row(0, r, 0) = static_cast<float>(r);
        *cache.v_row(0, r, 0) = static_cast<float>(-r);
    }
    std::vector<std::int64_t> pos{100, 101, 102, 103, 104, 105, 106, 107, 108, 109, -1, -1, -1, -1, -1, -1};
    const View2<std::int64_t> pv(pos.data(), {1, 16});
    auto freed = reference::kv_batch_compact(cache, std::span<std::int32_t>(lens), 0,
                                             std::vector<std::int32_t>{0, 3, 4, 8, 9}, pv);
    CHECK(freed == std::vector<std::int32_t>{5});
    CHECK(table == std::vector<std::int32_t>{7, 2, -1, -1});
    CHECK(lens[0] == 5);
    const float want[5] = {0, 3, 4, 8, 9};
    for (std::int64_t i = 0; i < 5; ++i) {
        CHECK(*cache.k_row(0, i, 0) == want[i]);
        CHECK(*cache.v_row(0, i, 0) == -want[i]);
        CHECK(pos[static_cast<std::size_t>(i)] == 100 + static_cast<std::int64_t>(want[i]));
    }
    freed = reference::kv_batch_compact(cache, std::span<std::int32_t>(lens), 0, std::vector<std::int32_t>{4});
    CHECK(freed == std::vector<std::int32_t>{2});
    CHECK(table == std::vector<std::int32_t>{7, -1, -1, -1});
    CHECK(*cache.k_row(0, 0, 0) == 9.0f);
    // Keeping every row moves nothing and releases nothing.
    freed = reference::kv_batch_compact(cache, std::span<std::int32_t>(lens), 0, std::vector<std::int32_t>{0});
    CHECK(freed.empty());
    CHECK(lens[0] == 1);
    // Contiguous caches release nothing.
    std::vector<std::int32_t> clens{3};
    std::vector<float> ck(6), cv(6);
    const auto cc = contiguous_kv_batch<float>(ck.data(), cv.data(), 1, 6, 1, 1, clens.data());
    CHECK(reference::kv_batch_compact(cc, std::span<std::int32_t>(clens), 0, std::vector<std::int32_t>{2}).empty());
    CHECK(clens[0] == 1);
}

TEST_CASE("reference kv_batch: bad input is a clear error and changes nothing", "[kv][kv_batch][errors]") {
    // Two sequences of 3 and 2 rows, paged P = 2 (pages 0 1 | 2), one spare page 3.
    std::vector<std::int32_t> lens{3, 2}, table{0, 1, -1, 2, -1, -1};
    std::vector<float> k(4 * 2 * 1 * 2), v(k.size());
    for (std::size_t i = 0; i < k.size(); ++i) k[i] = v[i] = static_cast<float>(i);
    auto cache = paged_kv_batch_nhd<float>(k.data(), v.data(), 2, 4, 2, 1, 2, table.data(), 3, lens.data());
    const auto k0 = k, v0 = v;
    const auto table0 = table, lens0 = lens;
    const std::span<std::int32_t> L(lens);
    std::vector<float> nk(3 * 2), nv(nk.size());
    const View3<const float> kn(nk.data(), {3, 1, 2}), vn(nv.data(), {3, 1, 2});
    using V = std::vector<std::int32_t>;
    auto app = [&](auto c, V indptr) { reference::kv_batch_append(c, L, kn, vn, indptr); };
    auto cmp = [&](auto c, V indptr, V keep) { return reference::kv_batch_compact(c, L, indptr, keep); };
    auto one = [&](auto c, std::int64_t b, V keep) { return reference::kv_batch_compact(c, L, b, keep); };

    // Append.
    CHECK_THAT(error_of([&] { app(cache, {0, 3}); }), Contains("new_indptr has 2 entries, expected batch + 1 = 3"));
    CHECK_THAT(error_of([&] { app(cache, {1, 2, 3}); }), Contains("new_indptr[0] = 1, expected 0"));
    CHECK_THAT(error_of([&] { app(cache, {0, 2, 1}); }), Contains("expected non-decreasing offsets"));
    CHECK_THAT(error_of([&] { app(cache, {0, 1, 2}); }), Contains("new_indptr[batch] = 2 but k_new has 3 rows"));
    // Sequence 1 gets 3 rows (5 fit its capacity of 6): it needs pages in slots 1 and 2, both -1.
    CHECK_THAT(error_of([&] { app(cache, {0, 0, 3}); }), Contains("block_table[1][1] = -1, expected a page in [0, 4)"));
    // Sequence 0 gets 3 rows but its capacity is 6 and it has 3: fits; slot 2 = -1.
    CHECK_THAT(error_of([&] { app(cache, {0, 3, 3}); }), Contains("block_table[0][2] = -1"));
    table[2] = 2;  // sequence 0's slot 2 is page 2, which sequence 1 also uses: sequence 0 would write it.
    CHECK_THAT(error_of([&] {
                   app(cache, {0, 3, 3});
               }),
               Contains("page 2 (block_table[0][2]) is written or released by this update but used 2 times"));
    table = table0;
    {
        std::vector<float> wk(3 * 2 * 2);
        CHECK_THAT(error_of([&] {
                       reference::kv_batch_append(cache, L, View3<const float>(wk.data(), {3, 2, 2}),
                                                  View3<const float>(wk.data(), {3, 2, 2}), V{0, 0, 3});
                   }),
                   Contains("k_new has shape [3, 2, 2], expected [total_new, 1, 2]"));
        CHECK_THAT(error_of([&] {
                       reference::kv_batch_append(cache, L, kn, View3<const float>(wk.data(), {2, 1, 2}), V{0, 0, 3});
                   }),
                   Contains("v_new has shape [2, 1, 2], expected the shape of k_new"));
        std::vector<std::int64_t> p(8), np(3);
        CHECK_THAT(
            error_of([&] {
                reference::kv_batch_append(cache, L, kn, vn, V{0, 3, 3}, View2<std::int64_t>(p.data(), {2, 4}), {});
            }),
            Contains("pass both"));
        CHECK_THAT(error_of([&] {
                       reference::kv_batch_append(cache, L, kn, vn, V{0, 3, 3}, View2<std::int64_t>(p.data(), {2, 4}),
                                                  View1<const std::int64_t>(np.data(), {3}));
                   }),
                   Contains("positions has shape [2, 4], expected [batch = 2, >= 6]"));
    }
    std::vector<std::int32_t> other{3, 2};
    CHECK_THAT(error_of([&] {
                   reference::kv_batch_append(cache, std::span<std::int32_t>(other), kn, vn, V{0, 0, 0});
               }),
               Contains("cache.seq_lens does not point to seq_lens_host"));
    CHECK_THAT(error_of([&] {
                   reference::kv_batch_append(cache, L.first(1), kn, vn, V{0, 3});
               }),
               Contains("seq_lens has 1 entries, expected batch = 2"));
    lens[1] = 7;
    CHECK_THAT(error_of([&] { app(cache, {0, 0, 0}); }), Contains("sequence 1 holds 7 rows, expected 0..6"));
    lens = lens0;
    {
        auto bad = cache;
        bad.head_stride = 1;  // heads of d = 2 elements overlap (H_kv = 1 makes it harmless: use row stride)
        bad.row_stride = 1;
        CHECK_THAT(error_of([&] { app(bad, {0, 0, 0}); }), Contains("overlap"));
        bad = cache;
        bad.n_pages = 0;
        CHECK_THAT(error_of([&] { app(bad, {0, 0, 0}); }), Contains("n_pages = 0"));
        bad = cache;
        bad.k = nullptr;
        CHECK_THAT(error_of([&] { app(bad, {0, 0, 0}); }), Contains("null K, V or seq_lens pointer"));
    }

    // Compaction.
    CHECK_THAT(error_of([&] {
                   cmp(cache, {0, 2}, {0, 1});
               }),
               Contains("keep_indptr has 2 entries, expected batch + 1 = 3"));
    CHECK_THAT(error_of([&] { cmp(cache, {}, {}); }), Contains("keep_indptr is empty"));
    CHECK_THAT(error_of([&] {
                   cmp(cache, {0, 0, 2}, {0, 1});
               }),
               Contains("the keep list of sequence 0 is empty; expected at least one row"));
    CHECK_THAT(error_of([&] {
                   cmp(cache, {0, 4, 6}, {0, 1, 2, 2, 0, 1});
               }),
               Contains("the keep list of sequence 0 has 4 entries but the sequence holds 3 rows"));
    CHECK_THAT(error_of([&] {
                   cmp(cache, {0, 2, 3}, {0, 1, 2, 0});
               }),
               Contains("keep has 4 entries, expected keep_indptr[batch] = 3"));
    CHECK_THAT(error_of([&] {
                   cmp(cache, {0, 2, 3}, {1, 1, 0});
               }),
               Contains("keep list of sequence 0: entry 1 = 1 is not above entry 0 = 1"));
    CHECK_THAT(error_of([&] { cmp(cache, {0, 2, 3}, {2, 1, 0}); }), Contains("entry 1 = 1 is not above entry 0 = 2"));
    CHECK_THAT(error_of([&] {
                   cmp(cache, {0, 2, 3}, {0, 3, 0});
               }),
               Contains("keep list of sequence 0: entry 1 = 3, expected a row in [0, 3)"));
    CHECK_THAT(error_of([&] {
                   cmp(cache, {0, 2, 3}, {0, 1, -1});
               }),
               Contains("keep list of sequence 1: entry 0 = -1, expected a row in [0, 2)"));
    CHECK_THAT(error_of([&] { one(cache, 2, {0}); }), Contains("sequence 2, expected 0 <= b < batch = 2"));
    CHECK_THAT(error_of([&] { one(cache, -1, {0}); }), Contains("sequence -1, expected 0 <= b < batch = 2"));
    CHECK_THAT(error_of([&] { one(cache, 1, {}); }), Contains("the keep list of sequence 1 is empty"));
    CHECK_THAT(error_of([&] { one(cache, 1, {0, 1, 1}); }), Contains("has 3 entries but the sequence holds 2 rows"));
    table[3] = 1;  // sequence 1 now shares page 1 with sequence 0; compacting 1 writes it
    CHECK_THAT(error_of([&] { one(cache, 1, {1}); }), Contains("page 1 (block_table[1][0]) is written or released"));
    CHECK(one(cache, 0, {0, 1, 2}).empty());  // sequence 0 moves and releases nothing: sharing page 1 is fine
    CHECK(lens == lens0);
    table[3] = 9;
    CHECK_THAT(error_of([&] { one(cache, 0, {1}); }), Contains("block_table[1][0] = 9, expected a page in [0, 4)"));
    table = table0;
    {
        std::vector<std::int64_t> p(4);
        CHECK_THAT(error_of([&] {
                       reference::kv_batch_compact(cache, L, 0, V{1}, View2<std::int64_t>(p.data(), {2, 2}));
                   }),
                   Contains("positions has shape [2, 2], expected [batch = 2, >= 3]"));
        CHECK_THAT(error_of([&] {
                       reference::kv_batch_compact(cache, L, 0, V{1}, View2<std::int64_t>(p.data(), {2, 3}, {1, 1}));
                   }),
                   Contains("output positions has overlapping strides"));
    }
    // Nothing changed by any of the failed calls.
    CHECK(k == k0);
    CHECK(v == v0);
    CHECK(lens == lens0);
    CHECK(table == table0);
}

// Found by tests/fuzz (kv_batch): the checks' own arithmetic overflowed int64 (undefined behaviour,
// flagged by UBSan) on hostile sizes and strides, and int32 indptr entries far apart overflowed int.
// Each is now a clear error. The views only describe: no K/V memory is needed to check them.
TEST_CASE("kv_batch checks: sizes and strides whose spans exceed int64 are errors, not overflows",
          "[kv][kv_batch][errors]") {
    float dummy = 0;
    const std::int32_t table[2] = {0, 0};
    std::vector<std::int32_t> lens{4};
    const DecodeBatchHost meta{lens, {}, {}, 1};
    auto check = [&](const KvBatchView<const float>& c) { detail::check_kv_batch(c, meta, c.n_kv_heads, "check"); };
    auto paged = [&](std::int64_t page_size, std::int64_t page_stride, std::int64_t row_stride, std::int64_t head_stride,
                     std::int32_t Hkv, std::int64_t n_pages, std::int64_t table_stride) {
        return KvBatchView<const float>{&dummy, &dummy, 1, Hkv, 2, page_size, page_stride, row_stride, head_stride,
                                        n_pages, table, table_stride, lens.data()};
    };
    // One page's rows: (page_size - 1) x row_stride (3 x 8174439530702664188, what the fuzzer found).
    CHECK_THAT(error_of([&] { check(paged(4, 8, 8174439530702664188, 2, 1, 1, 1)); }),
               Contains("make one page span more than 2^63 elements"));
    // One row's heads: (H_kv - 1) x head_stride.
    CHECK_THAT(error_of([&] { check(paged(1, 8, 0, std::int64_t{1} << 62, 3, 1, 4)); }),
               Contains("make one page span more than 2^63 elements"));
    // The pool: (n_pages - 1) x page_stride.
    CHECK_THAT(error_of([&] { check(paged(4, std::int64_t{1} << 62, 2, 0, 1, 3, 1)); }),
               Contains("page_stride = 4611686018427387904 x 3 pages span more than 2^63 elements"));
    // Rows per sequence: block_table_stride x page_size.
    CHECK_THAT(error_of([&] { check(paged(std::int64_t{1} << 40, std::int64_t{1} << 41, 2, 0, 1, 1, std::int64_t{1} << 30)); }),
               Contains("rows per sequence exceed int64"));
    // The same sizes that fit are fine, and kv_batch_extent is the pool's span.
    const auto ok = paged(4, 8, 2, 0, 1, 3, 1);
    CHECK(error_of([&] { check(ok); }).empty());
    CHECK(detail::kv_batch_extent(ok) == 2 * 8 + 3 * 2 + 2);
}

TEST_CASE("kv_batch checks: indptr entries far apart are errors, not int overflows", "[kv][kv_batch][errors]") {
    std::vector<float> kv(2 * 4 * 2);
    std::vector<std::int32_t> lens{4, 4};
    const auto c = contiguous_kv_batch<const float>(kv.data(), kv.data(), 2, 4, 1, 2, lens.data());
    // q_len of sequence 1 = q_indptr[2] - q_indptr[1] = INT32_MIN - 1: below INT_MIN in int.
    const std::vector<std::int32_t> q_indptr{0, 1, std::numeric_limits<std::int32_t>::min()};
    CHECK_THAT(error_of([&] { detail::check_kv_batch(c, DecodeBatchHost{lens, q_indptr, {}, 1}, 1, "check"); }),
               Contains("sequence 1 has q_len = -2147483649"));
    // A list's length = list_indptr[2] - list_indptr[1] = INT32_MIN - 4.
    const std::vector<std::int32_t> list_indptr{0, 4, std::numeric_limits<std::int32_t>::min()};
    CHECK_THAT(error_of([&] { detail::check_kv_batch(c, DecodeBatchHost{lens, {}, list_indptr, 1}, 1, "check"); }),
               Contains("list 0 of sequence 1 has -2147483652 entries"));
    const DecodeBatchHost meta{lens, q_indptr, list_indptr, 1};
    CHECK(meta.q_len(1) == -2147483649LL);
    CHECK(meta.list_len(1, 0) == -2147483652LL);
}
