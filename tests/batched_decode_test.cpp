// Batched decode attention over contiguous and paged KV caches (kv/kv_batch.hpp): the reference
// against the single-sequence references (indexed decode per query token, dense causal attention),
// paged layouts against contiguous ones on identical logical contents, the SIMD path against the
// reference on fresh seeded inputs, and bad input.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include <vlsparse/attention/batched_decode.hpp>
#include <vlsparse/reference/attention.hpp>
#include <vlsparse/reference/batched_decode.hpp>
#include <vlsparse/reference/indexed_decode.hpp>

#include "test_util.hpp"

using namespace vlsparse;
using Catch::Matchers::Contains;

namespace {

// How the logical rows of a batch are laid out in memory.
enum class Kind : std::uint8_t {
    contiguous,   // [B, capacity, H_kv, d]
    nhd,          // paged, pool [n_pages, P, H_kv, d], pages shuffled
    hnd,          // paged, pool [n_pages, H_kv, P, d], pages shuffled
    odd_strides,  // contiguous with padding: strides that are not multiples of d
};
const char* kind_name(Kind k) {
    switch (k) {
        case Kind::contiguous: return "contiguous";
        case Kind::nhd: return "paged NHD";
        case Kind::hnd: return "paged HND";
        default: return "odd strides";
    }
}

enum class Lists : std::uint8_t { dense, shared, per_head };
const char* lists_name(Lists l) { return l == Lists::dense ? "dense" : l == Lists::shared ? "shared" : "per KV head"; }

// The logical contents of one decode step of a batch: lengths, queries, lists, and K/V per sequence.
template <class T>
struct Case {
    std::int64_t B = 0, H = 0, Hkv = 0, d = 0;
    std::vector<std::int32_t> seq_lens, q_indptr;  // q_indptr empty: one query per sequence
    std::int32_t lists_per_seq = 1;
    bool dense = false;
    std::vector<std::int32_t> list_indptr, indices;
    std::vector<std::vector<T>> k, v;  // per sequence: [len, H_kv, d]
    std::vector<T> q;                  // [total_q, H, d]

    std::int64_t total_q() const { return q_indptr.empty() ? B : q_indptr.back(); }
    std::int64_t q0(std::int64_t b) const { return q_indptr.empty() ? b : q_indptr[static_cast<std::size_t>(b)]; }
    std::int64_t q_len(std::int64_t b) const { return q_indptr.empty() ? 1 : q_indptr[b + 1] - q_indptr[b]; }
    std::int64_t len(std::int64_t b) const { return seq_lens[static_cast<std::size_t>(b)]; }
    DecodeBatchHost meta() const { return {seq_lens, q_indptr, list_indptr, lists_per_seq}; }
    BatchRowLists lists() const {
        return dense ? BatchRowLists{nullptr, nullptr, lists_per_seq}
                     : BatchRowLists{list_indptr.data(), indices.data(), lists_per_seq};
    }
    View3<const T> qv() const { return {q.data(), {total_q(), H, d}}; }
    // The rows of list l of sequence b (dense: every row).
    std::vector<std::int64_t> list(std::int64_t b, std::int64_t l) const {
        std::vector<std::int64_t> r;
        if (dense) {
            r.resize(static_cast<std::size_t>(len(b)));
            std::iota(r.begin(), r.end(), std::int64_t{0});
        } else {
            const auto li = static_cast<std::size_t>(b * lists_per_seq + l);
            for (auto e = list_indptr[li]; e < list_indptr[li + 1]; ++e) r.push_back(indices[static_cast<std::size_t>(e)]);
        }
        return r;
    }
    std::int64_t n_entries() const { return dense ? 0 : list_indptr.back(); }
};

// A random case: lens[b] rows and q_lens[b] new tokens per sequence (q_lens empty: q_indptr empty),
// lists of about frac x len rows (plus the first new token's row, and some of the other new rows).
template <class T>
Case<T> make_case(std::int64_t H, std::int64_t Hkv, std::int64_t d, const std::vector<std::int32_t>& lens,
                  const std::vector<std::int32_t>& q_lens, Lists lists, double frac, std::uint64_t seed) {
    Case<T> c;
    c.B = static_cast<std::int64_t>(lens.size());
    c.H = H;
    c.Hkv = Hkv;
    c.d = d;
    c.seq_lens = lens;
    if (!q_lens.empty()) {
        c.q_indptr.push_back(0);
        for (auto n : q_lens) c.q_indptr.push_back(c.q_indptr.back() + n);
    }
    c.dense = lists == Lists::dense;
    c.lists_per_seq = lists == Lists::per_head ? static_cast<std::int32_t>(Hkv) : 1;
    SplitMix64 rng(seed);
    for (std::int64_t b = 0; b < c.B; ++b) {
        const auto n = static_cast<std::size_t>(c.len(b) * Hkv * d);
        c.k.push_back(vt::random_buffer<T>(n, seed + 10 + static_cast<std::uint64_t>(b) * 2));
        c.v.push_back(vt::random_buffer<T>(n, seed + 11 + static_cast<std::uint64_t>(b) * 2));
    }
    c.q = vt::random_buffer<T>(static_cast<std::size_t>(c.total_q() * H * d), seed + 5);
    if (!c.dense) {
        c.list_indptr.push_back(0);
        for (std::int64_t b = 0; b < c.B; ++b) {
            const std::int64_t len = c.len(b), ql = c.q_len(b);
            for (std::int64_t l = 0; l < c.lists_per_seq; ++l) {
                const auto m = std::max<std::int64_t>(1, static_cast<std::int64_t>(frac * static_cast<double>(len)));
                auto rows = vt::random_subset(len, std::min(m, len), seed + 100 + static_cast<std::uint64_t>(b * 16 + l));
                rows.push_back(len - ql);  // query 0's own row: every query sees a listed row
                for (std::int64_t r = len - ql + 1; r < len; ++r)
                    if (rng.uniform() < 0.7) rows.push_back(r);
                std::sort(rows.begin(), rows.end());
                rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
                for (auto r : rows) c.indices.push_back(static_cast<std::int32_t>(r));
                c.list_indptr.push_back(static_cast<std::int32_t>(c.indices.size()));
            }
        }
    }
    return c;
}

// One physical layout of a case's K/V. Slots no row occupies hold NaN: reading one poisons the output.
template <class T>
struct Storage {
    Kind kind = Kind::contiguous;
    std::vector<T> k, v;
    std::vector<std::int32_t> block_table;
    KvBatchView<const T> view;
};

template <class T>
Storage<T> lay_out(const Case<T>& c, Kind kind, std::int64_t P, std::uint64_t seed) {
    Storage<T> s;
    s.kind = kind;
    const T nan = from_float<T>(std::numeric_limits<float>::quiet_NaN());
    const std::int64_t B = c.B, Hkv = c.Hkv, d = c.d;
    const std::int64_t max_len = *std::max_element(c.seq_lens.begin(), c.seq_lens.end());
    KvBatchView<T> w;  // filled below, over s.k / s.v
    if (kind == Kind::contiguous || kind == Kind::odd_strides) {
        const std::int64_t cap = max_len + 3;
        if (kind == Kind::contiguous) {
            s.k.assign(static_cast<std::size_t>(B * cap * Hkv * d), nan);
            s.v = s.k;
            w = contiguous_kv_batch(s.k.data(), s.v.data(), static_cast<std::int32_t>(B), cap,
                                    static_cast<std::int32_t>(Hkv), static_cast<std::int32_t>(d), c.seq_lens.data());
        } else {
            const std::int64_t hs = d + 1, rs = Hkv * hs + 3, ps = cap * rs + 7;
            s.k.assign(static_cast<std::size_t>(B * ps), nan);
            s.v = s.k;
            w = {s.k.data(), s.v.data(), static_cast<std::int32_t>(B), static_cast<std::int32_t>(Hkv),
                 static_cast<std::int32_t>(d), cap, ps, rs, hs, 0, nullptr, 0, c.seq_lens.data()};
        }
    } else {
        std::vector<std::int64_t> pages_of(static_cast<std::size_t>(B));
        std::int64_t total = 0, widest = 0;
        for (std::int64_t b = 0; b < B; ++b) {
            pages_of[static_cast<std::size_t>(b)] = (c.len(b) + P - 1) / P;
            total += pages_of[static_cast<std::size_t>(b)];
            widest = std::max(widest, pages_of[static_cast<std::size_t>(b)]);
        }
        const std::int64_t n_pages = total + 3, bts = widest + 1;  // spare pages and table entries
        std::vector<std::int64_t> perm = vt::random_subset(n_pages, n_pages, seed);
        SplitMix64 rng(seed + 1);  // shuffle the pool
        for (std::int64_t i = n_pages - 1; i > 0; --i)
            std::swap(perm[static_cast<std::size_t>(i)], perm[static_cast<std::size_t>(rng.uniform() * static_cast<double>(i + 1)) % static_cast<std::size_t>(i + 1)]);
        s.block_table.assign(static_cast<std::size_t>(B * bts), -1);  // unused entries: never read
        std::int64_t next = 0;
        for (std::int64_t b = 0; b < B; ++b)
            for (std::int64_t p = 0; p < pages_of[static_cast<std::size_t>(b)]; ++p)
                s.block_table[static_cast<std::size_t>(b * bts + p)] = static_cast<std::int32_t>(perm[static_cast<std::size_t>(next++)]);
        s.k.assign(static_cast<std::size_t>(n_pages * P * Hkv * d), nan);
        s.v = s.k;
        const auto make = kind == Kind::nhd ? paged_kv_batch_nhd<T> : paged_kv_batch_hnd<T>;
        w = make(s.k.data(), s.v.data(), static_cast<std::int32_t>(B), n_pages, P, static_cast<std::int32_t>(Hkv),
                 static_cast<std::int32_t>(d), s.block_table.data(), bts, c.seq_lens.data());
    }
    for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t r = 0; r < c.len(b); ++r)
            for (std::int64_t g = 0; g < Hkv; ++g)
                for (std::int64_t e = 0; e < d; ++e) {
                    const auto src = static_cast<std::size_t>((r * Hkv + g) * d + e);
                    w.k_row(b, r, g)[e] = c.k[static_cast<std::size_t>(b)][src];
                    w.v_row(b, r, g)[e] = c.v[static_cast<std::size_t>(b)][src];
                }
    s.view = w;
    return s;
}

// The oracle: reference::indexed_decode_attention per sequence and query token, over the cache of
// that sequence and the rows each list holds up to the token's position. probs as the batched
// overload defines them (sum over tokens of the mean over the heads reading the list).
template <class T>
void oracle(const Case<T>& c, std::vector<double>& out, std::vector<double>& probs) {
    const std::int64_t H = c.H, Hkv = c.Hkv, d = c.d, group = H / Hkv;
    out.assign(static_cast<std::size_t>(c.total_q() * H * d), 0.0);
    probs.assign(static_cast<std::size_t>(c.n_entries()), 0.0);
    for (std::int64_t b = 0; b < c.B; ++b) {
        const std::int64_t len = c.len(b), ql = c.q_len(b);
        KvCache<T> cache(Hkv, d);
        cache.assign(View3<const T>(c.k[static_cast<std::size_t>(b)].data(), {len, Hkv, d}),
                     View3<const T>(c.v[static_cast<std::size_t>(b)].data(), {len, Hkv, d}));
        for (std::int64_t i = 0; i < ql; ++i) {
            const std::int64_t pos = len - ql + i, row = c.q0(b) + i;
            CacheRows rows;
            for (std::int64_t l = 0; l < c.lists_per_seq; ++l) {
                auto r = c.list(b, l);
                r.erase(std::upper_bound(r.begin(), r.end(), pos), r.end());
                rows.push(r);
            }
            const auto L = static_cast<std::size_t>(rows.longest());
            std::vector<double> p(static_cast<std::size_t>(H) * L);
            reference::indexed_decode_attention(View2<const T>(c.q.data() + row * H * d, {H, d}), cache, rows,
                                                View2<double>(out.data() + row * H * d, {H, d}),
                                                View2<double>(p.data(), {H, static_cast<std::int64_t>(L)}));
            if (c.dense) continue;
            for (std::int64_t h = 0; h < H; ++h) {
                const std::int64_t l = c.lists_per_seq == 1 ? 0 : h / group;
                const auto e0 = c.list_indptr[static_cast<std::size_t>(b * c.lists_per_seq + l)];
                for (std::size_t t = 0; t < rows.list(l).size(); ++t)
                    probs[static_cast<std::size_t>(e0) + t] += p[static_cast<std::size_t>(h) * L + t];
            }
        }
    }
    const double readers = static_cast<double>(c.lists_per_seq == 1 ? H : group);
    for (auto& x : probs) x /= readers;
}

template <class T, class TO = double>
std::vector<TO> run_reference(const Case<T>& c, const Storage<T>& s, std::vector<double>* probs = nullptr) {
    std::vector<TO> out(static_cast<std::size_t>(c.total_q() * c.H * c.d));
    const View3<TO> ov(out.data(), {c.total_q(), c.H, c.d});
    if (probs) {
        probs->assign(static_cast<std::size_t>(c.n_entries()), -1.0);
        reference::batched_decode_attention(c.qv(), s.view, c.lists(), c.meta(), ov, std::span<double>(*probs));
    } else {
        reference::batched_decode_attention(c.qv(), s.view, c.lists(), c.meta(), ov);
    }
    return out;
}

// Bit-for-bit equality (half and bfloat16 have no operator==).
template <class T>
bool identical(const std::vector<T>& a, const std::vector<T>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

double max_of(const std::vector<double>& x) {
    double m = 0.0;
    for (double v : x) m = std::max(m, std::abs(v));
    return m;
}

// Output tolerances of the SIMD path against the reference, by output element type: the fp32
// accumulation bar plus the rounding of the output type (test_core.hpp's table).
template <class TO>
double out_nmse_tol() {
    if constexpr (std::is_same_v<TO, half> || std::is_same_v<TO, bfloat16>)
        return vt::tolerance<TO>(vt::TestBackend::simd, vt::Metric::rounded_output_nmse);
    else return vt::kSimdVsReference.attention_nmse;  // fp32 / double outputs
}

// The SIMD path (native and scalar instruction sets, default and tiny chunks, with and without
// probabilities) against the reference on one layout.
template <class T, class TO = float>
void compare_simd(const Case<T>& c, const Storage<T>& s, const std::string& what) {
    INFO(what << " layout " << kind_name(s.kind));
    std::vector<double> p_r;
    const auto o_r = run_reference(c, s, c.dense ? nullptr : &p_r);
    REQUIRE(vt::max_abs_diff(o_r, std::vector<double>(o_r.size(), 0.0)) > 0.0);  // not all zero
    const std::size_t n_out = o_r.size();
    const std::int64_t tq = c.total_q(), H = c.H, d = c.d;
    std::vector<TO> o_s(n_out), o_s2(n_out);
    simd::batched_decode_attention(c.qv(), s.view, c.lists(), c.meta(), View3<TO>(o_s.data(), {tq, H, d}));
    REQUIRE(vt::nmse(o_s, o_r) <= out_nmse_tol<TO>());
    if (!c.dense) {
        std::vector<float> p_s(static_cast<std::size_t>(c.n_entries()), -1.0f);
        simd::batched_decode_attention(c.qv(), s.view, c.lists(), c.meta(), View3<TO>(o_s2.data(), {tq, H, d}),
                                       std::span<float>(p_s));
        REQUIRE(identical(o_s2, o_s));  // the probabilities do not change the output
        REQUIRE(vt::max_abs_diff(p_s, p_r) <= vt::kSimdVsReference.score_rel * max_of(p_r));
        std::vector<double> p_d(p_s.size());
        simd::batched_decode_attention(c.qv(), s.view, c.lists(), c.meta(), View3<TO>(o_s2.data(), {tq, H, d}),
                                       std::span<double>(p_d));
        for (std::size_t e = 0; e < p_d.size(); ++e) REQUIRE(p_d[e] == static_cast<double>(p_s[e]));
    }
    // The always-compiled scalar instruction set meets the same bar.
    std::vector<TO> o_sc(n_out);
    simd::batched_decode_attention<T, T, TO, vlsparse::simd::scalar_arch>(c.qv(), s.view, c.lists(), c.meta(),
                                                                            View3<TO>(o_sc.data(), {tq, H, d}));
    REQUIRE(vt::nmse(o_sc, o_r) <= out_nmse_tol<TO>());
    // Tiny chunks: lists cross chunk boundaries (and query tokens see none of some chunks), merged exactly.
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
    for (std::int64_t chunk : {1, 3}) {
        std::vector<TO> o_c(n_out);
        std::vector<float> acc(static_cast<std::size_t>(c.n_entries()), 0.0f);
        simd::detail::run_batched_decode<simd::detail::native_arch>(c.qv(), s.view, c.lists(), c.meta(),
                                                                     View3<TO>(o_c.data(), {tq, H, d}), scale,
                                                                     c.dense ? nullptr : acc.data(), chunk);
        INFO("chunk " << chunk);
        REQUIRE(vt::nmse(o_c, o_r) <= out_nmse_tol<TO>());
        if (!c.dense) {
            const double readers = static_cast<double>(c.lists_per_seq == 1 ? H : H / c.Hkv);
            double worst = 0.0;
            for (std::size_t e = 0; e < acc.size(); ++e) worst = std::max(worst, std::abs(acc[e] / readers - p_r[e]));
            REQUIRE(worst <= vt::kSimdVsReference.score_rel * max_of(p_r));
        }
    }
}

std::vector<std::int32_t> ragged_lens(std::int64_t B, std::int64_t lo, std::int64_t hi, std::uint64_t seed) {
    SplitMix64 rng(seed);
    std::vector<std::int32_t> r;
    for (std::int64_t b = 0; b < B; ++b)
        r.push_back(static_cast<std::int32_t>(lo + static_cast<std::int64_t>(rng.uniform() * static_cast<double>(hi - lo + 1)) % (hi - lo + 1)));
    return r;
}
std::vector<std::int32_t> q_lens_for(const std::vector<std::int32_t>& lens, std::int32_t most, std::uint64_t seed) {
    SplitMix64 rng(seed);
    std::vector<std::int32_t> r;
    for (auto len : lens)
        r.push_back(std::min<std::int32_t>(len, 1 + static_cast<std::int32_t>(rng.uniform() * most) % most));
    return r;
}

}  // namespace

TEST_CASE("batched decode: the reference with B = 1, a contiguous cache and q_len 1 is indexed decode",
          "[batched][reference]") {
    const std::uint64_t seed = vt::base_seed() + 31000;
    INFO("seed " << seed);
    const std::int64_t n = 70, H = 8, Hkv = 2, d = 24;
    const auto kb = vt::random_buffer<float>(static_cast<std::size_t>(n * Hkv * d), seed);
    const auto vb = vt::random_buffer<float>(static_cast<std::size_t>(n * Hkv * d), seed + 1);
    const auto q = vt::random_buffer<float>(static_cast<std::size_t>(H * d), seed + 2);
    KvCache<float> cache(Hkv, d);
    cache.assign(View3<const float>(kb.data(), {n, Hkv, d}), View3<const float>(vb.data(), {n, Hkv, d}));
    const std::vector<std::int32_t> lens{static_cast<std::int32_t>(n)};
    const KvBatchView<const float> view =
        contiguous_kv_batch(kb.data(), vb.data(), 1, n, static_cast<std::int32_t>(Hkv), static_cast<std::int32_t>(d), lens.data());
    for (const bool per_head : {false, true}) {
        INFO("per-head lists " << per_head);
        CacheRows rows;
        std::vector<std::int32_t> indptr{0}, indices;
        for (std::int64_t l = 0; l < (per_head ? Hkv : 1); ++l) {
            rows.push(vt::random_subset(n, 20 + 7 * l, seed + 10 + static_cast<std::uint64_t>(l)));
            for (auto r : rows.list(rows.lists() - 1)) indices.push_back(r);
            indptr.push_back(static_cast<std::int32_t>(indices.size()));
        }
        const auto lps = static_cast<std::int32_t>(rows.lists());
        REQUIRE(std::ranges::equal(rows.indptr(), indptr));  // CacheRows is this CSR: its view() reads the same arrays
        REQUIRE(std::ranges::equal(rows.indices(), indices));
        const std::int64_t L = 20 + 7 * (lps - 1);
        std::vector<double> o_i(static_cast<std::size_t>(H * d)), p_i(static_cast<std::size_t>(H * L));
        reference::indexed_decode_attention(View2<const float>(q.data(), {H, d}), cache, rows,
                                            View2<double>(o_i.data(), {H, d}), View2<double>(p_i.data(), {H, L}));
        std::vector<double> o_b(o_i.size()), p_b(indices.size());
        reference::batched_decode_attention(View3<const float>(q.data(), {1, H, d}), view,
                                            BatchRowLists{indptr.data(), indices.data(), lps},
                                            DecodeBatchHost{lens, {}, indptr, lps}, View3<double>(o_b.data(), {1, H, d}),
                                            std::span<double>(p_b));
        REQUIRE(o_b == o_i);  // bit for bit
        const std::int64_t readers = lps == 1 ? H : H / Hkv;
        for (std::int64_t l = 0; l < lps; ++l)
            for (std::size_t t = 0; t < rows.list(l).size(); ++t) {
                double mean = 0.0;
                for (std::int64_t h = 0; h < H; ++h)
                    if (lps == 1 || h / (H / Hkv) == l) mean += p_i[static_cast<std::size_t>(h * L) + t];
                mean /= static_cast<double>(readers);
                REQUIRE(std::abs(p_b[static_cast<std::size_t>(indptr[static_cast<std::size_t>(l)]) + t] - mean) <= 1e-15);
            }
        double total = 0.0;  // each query head's probabilities sum to 1, so a list's sum to 1 as well
        for (auto x : p_b) total += x;
        REQUIRE(std::abs(total - static_cast<double>(lps)) <= 1e-12);
        // Dense lists: decode over every row.
        std::vector<double> o_d(o_i.size()), o_all(o_i.size());
        reference::batched_decode_attention(View3<const float>(q.data(), {1, H, d}), view, BatchRowLists{},
                                            DecodeBatchHost{lens, {}, {}, 1}, View3<double>(o_d.data(), {1, H, d}));
        reference::decode_attention(View2<const float>(q.data(), {H, d}), cache, View2<double>(o_all.data(), {H, d}));
        REQUIRE(o_d == o_all);
    }
}

TEST_CASE("batched decode: the reference over ragged batches is indexed decode per query token",
          "[batched][reference]") {
    const std::uint64_t seed = vt::base_seed() + 32000;
    INFO("seed " << seed);
    const std::int64_t d = 20;
    int n_cases = 0;
    for (std::int64_t Hkv : {1, 2}) {
        for (std::int64_t ratio : {1, 2, 4, 8}) {
            const std::int64_t H = Hkv * ratio;
            for (Lists lists : {Lists::shared, Lists::per_head, Lists::dense}) {
                const auto s = seed + static_cast<std::uint64_t>(H * 100 + Hkv * 10 + static_cast<int>(lists));
                INFO("H " << H << " Hkv " << Hkv << " lists " << lists_name(lists) << " case seed " << s);
                const auto lens = ragged_lens(5, 1, 90, s);
                const auto qls = q_lens_for(lens, 8, s + 1);
                const Kind kind = (s % 3 == 0) ? Kind::contiguous : (s % 3 == 1) ? Kind::nhd : Kind::hnd;
                std::vector<double> o_o, p_o, p_r;
                {
                    const auto c = make_case<float>(H, Hkv, d, lens, qls, lists, 0.4, s);
                    oracle(c, o_o, p_o);
                    const auto o_r = run_reference(c, lay_out(c, kind, 16, s), c.dense ? nullptr : &p_r);
                    REQUIRE(o_r == o_o);
                    if (!c.dense) REQUIRE(vt::max_abs_diff(p_r, p_o) <= 1e-14);
                }
                {
                    const auto c = make_case<bfloat16>(H, Hkv, d, lens, qls, lists, 0.4, s + 2);
                    oracle(c, o_o, p_o);
                    const auto o_r = run_reference(c, lay_out(c, kind, 16, s), c.dense ? nullptr : &p_r);
                    REQUIRE(o_r == o_o);
                    if (!c.dense) REQUIRE(vt::max_abs_diff(p_r, p_o) <= 1e-14);
                }
                {
                    const auto c = make_case<half>(H, Hkv, d, lens, {}, lists, 0.4, s + 3);  // q_indptr empty
                    oracle(c, o_o, p_o);
                    const auto o_r = run_reference(c, lay_out(c, kind, 16, s), c.dense ? nullptr : &p_r);
                    REQUIRE(o_r == o_o);
                    if (!c.dense) REQUIRE(vt::max_abs_diff(p_r, p_o) <= 1e-14);
                }
                ++n_cases;
            }
        }
    }
    REQUIRE(n_cases == 24);
}

TEST_CASE("batched decode: q_len 1..8 over dense lists is dense causal attention over the last rows",
          "[batched][reference]") {
    const std::uint64_t seed = vt::base_seed() + 33000;
    INFO("seed " << seed);
    const std::int64_t H = 4, Hkv = 2, d = 16;
    const std::vector<std::int32_t> lens{8, 9, 40, 1, 17, 64, 33, 12};
    const std::vector<std::int32_t> qls{8, 1, 2, 1, 3, 8, 5, 7};
    const auto c = make_case<float>(H, Hkv, d, lens, qls, Lists::dense, 1.0, seed);
    // Every row listed explicitly: the same rows, so the same result.
    auto all = make_case<float>(H, Hkv, d, lens, qls, Lists::shared, 1.0, seed);
    all.k = c.k;
    all.v = c.v;
    all.q = c.q;
    for (Kind kind : {Kind::contiguous, Kind::nhd}) {
        INFO(kind_name(kind));
        const auto o = run_reference(c, lay_out(c, kind, 4, seed + 1));
        REQUIRE(run_reference(all, lay_out(all, kind, 4, seed + 1)) == o);
        for (std::int64_t b = 0; b < c.B; ++b) {
            const std::int64_t len = c.len(b), ql = c.q_len(b), q0 = c.q0(b);
            std::vector<double> ref(static_cast<std::size_t>(ql * H * d));
            reference::dense_attention(View3<const float>(c.q.data() + q0 * H * d, {ql, H, d}),
                                       View3<const float>(c.k[static_cast<std::size_t>(b)].data(), {len, Hkv, d}),
                                       View3<const float>(c.v[static_cast<std::size_t>(b)].data(), {len, Hkv, d}),
                                       View3<double>(ref.data(), {ql, H, d}));
            INFO("sequence " << b);
            REQUIRE(std::equal(ref.begin(), ref.end(), o.begin() + q0 * H * d));
        }
        // And the CPU path.
        std::vector<float> s(o.size());
        const auto st = lay_out(c, kind, 4, seed + 1);
        simd::batched_decode_attention(c.qv(), st.view, c.lists(), c.meta(), View3<float>(s.data(), {c.total_q(), H, d}));
        REQUIRE(vt::nmse(s, o) <= vt::kSimdVsReference.attention_nmse);
    }
}

TEST_CASE("batched decode: paged caches equal the contiguous cache on identical contents",
          "[batched][paged]") {
    const std::uint64_t seed = vt::base_seed() + 34000;
    INFO("seed " << seed);
    const std::int64_t H = 8, Hkv = 2, d = 32;
    const auto lens = ragged_lens(6, 1, 200, seed);
    const auto qls = q_lens_for(lens, 8, seed + 1);
    for (Lists lists : {Lists::per_head, Lists::shared, Lists::dense}) {
        INFO("lists " << lists_name(lists));
        const auto c = make_case<bfloat16>(H, Hkv, d, lens, qls, lists, 0.3, seed + 2);
        std::vector<double> p_c, p;
        const auto st_c = lay_out(c, Kind::contiguous, 0, seed);
        const auto o_c = run_reference(c, st_c, c.dense ? nullptr : &p_c);
        std::vector<float> s_c(o_c.size());
        simd::batched_decode_attention(c.qv(), st_c.view, c.lists(), c.meta(), View3<float>(s_c.data(), {c.total_q(), H, d}));
        for (Kind kind : {Kind::nhd, Kind::hnd}) {
            for (std::int64_t P : {1, 16, 64}) {
                INFO(kind_name(kind) << " page size " << P);
                const auto st = lay_out(c, kind, P, seed + static_cast<std::uint64_t>(P));
                REQUIRE(run_reference(c, st, c.dense ? nullptr : &p) == o_c);  // exact
                if (!c.dense) REQUIRE(p == p_c);
                std::vector<float> s(o_c.size());
                simd::batched_decode_attention(c.qv(), st.view, c.lists(), c.meta(), View3<float>(s.data(), {c.total_q(), H, d}));
                REQUIRE(s == s_c);  // the same arithmetic: only the addresses differ
            }
        }
        // Strides that are not multiples of d (rows read one by one by the CPU path).
        const auto st = lay_out(c, Kind::odd_strides, 0, seed);
        REQUIRE(run_reference(c, st) == o_c);
        std::vector<float> s(o_c.size());
        simd::batched_decode_attention(c.qv(), st.view, c.lists(), c.meta(), View3<float>(s.data(), {c.total_q(), H, d}));
        REQUIRE(vt::nmse(s, o_c) <= vt::kSimdVsReference.attention_nmse);
    }
}

TEST_CASE("batched decode: simd matches reference over GQA ratios, dtypes, lists, layouts and q_len",
          "[batched][simd]") {
    const std::uint64_t seed = vt::base_seed() + 35000;
    INFO("seed " << seed);
    const std::int64_t d = 40;  // not a multiple of the SIMD width
    const std::int64_t hi = vt::small_run() ? 60 : 300;
    for (std::int64_t Hkv : {1, 2}) {
        for (std::int64_t ratio : {1, 2, 3, 4, 8}) {  // 3: head blocks of 2 + 1 in the group kernels
            const std::int64_t H = Hkv * ratio;
            for (Lists lists : {Lists::shared, Lists::per_head, Lists::dense}) {
                const auto s = seed + static_cast<std::uint64_t>(H * 100 + Hkv * 10 + static_cast<int>(lists));
                const std::string what = "H " + std::to_string(H) + " Hkv " + std::to_string(Hkv) + " lists " +
                                         lists_name(lists) + " case seed " + std::to_string(s);
                const auto lens = ragged_lens(4, 1, hi, s);
                const auto qls = q_lens_for(lens, 8, s + 1);
                const auto cf = make_case<float>(H, Hkv, d, lens, qls, lists, 0.3, s);
                const auto cb = make_case<bfloat16>(H, Hkv, d, lens, qls, lists, 0.5, s + 1);
                const auto ch = make_case<half>(H, Hkv, d, lens, {}, lists, 0.2, s + 2);
                compare_simd(cf, lay_out(cf, Kind::nhd, 16, s), what + " fp32");
                compare_simd(cf, lay_out(cf, Kind::contiguous, 0, s), what + " fp32");
                compare_simd(cb, lay_out(cb, Kind::hnd, 64, s), what + " bf16");
                compare_simd(ch, lay_out(ch, Kind::nhd, 1, s), what + " fp16");
                compare_simd(cb, lay_out(cb, Kind::odd_strides, 0, s), what + " bf16");
            }
        }
    }
}

TEST_CASE("batched decode: simd outputs in every element type, strided q, fp32 overflow recomputed",
          "[batched][simd]") {
    const std::uint64_t seed = vt::base_seed() + 36000;
    INFO("seed " << seed);
    const std::int64_t H = 4, Hkv = 2, d = 64;
    const std::vector<std::int32_t> lens{50, 300, 7, 129};
    const std::vector<std::int32_t> qls{3, 8, 1, 2};
    const auto c = make_case<float>(H, Hkv, d, lens, qls, Lists::per_head, 0.5, seed);
    const auto st = lay_out(c, Kind::nhd, 16, seed);
    compare_simd<float, half>(c, st, "fp16 out");
    compare_simd<float, bfloat16>(c, st, "bf16 out");
    compare_simd<float, double>(c, st, "fp64 out");

    // q head-major [H, total_q, d] viewed as [total_q, H, d]: same results, bit for bit.
    const std::int64_t tq = c.total_q();
    std::vector<float> qh(c.q.size());
    for (std::int64_t i = 0; i < tq; ++i)
        for (std::int64_t h = 0; h < H; ++h)
            for (std::int64_t e = 0; e < d; ++e) qh[static_cast<std::size_t>((h * tq + i) * d + e)] = c.q[static_cast<std::size_t>((i * H + h) * d + e)];
    const View3<const float> qs(qh.data(), {tq, H, d}, {d, tq * d, 1});
    std::vector<double> r1(c.q.size()), r2(c.q.size());
    std::vector<float> s1(c.q.size()), s2(c.q.size());
    reference::batched_decode_attention(c.qv(), st.view, c.lists(), c.meta(), View3<double>(r1.data(), {tq, H, d}));
    reference::batched_decode_attention(qs, st.view, c.lists(), c.meta(), View3<double>(r2.data(), {tq, H, d}));
    simd::batched_decode_attention(c.qv(), st.view, c.lists(), c.meta(), View3<float>(s1.data(), {tq, H, d}));
    simd::batched_decode_attention(qs, st.view, c.lists(), c.meta(), View3<float>(s2.data(), {tq, H, d}));
    REQUIRE(r1 == r2);
    REQUIRE(s1 == s2);
    // out written through strides as well: [H, total_q, d].
    std::vector<float> s3(c.q.size());
    simd::batched_decode_attention(c.qv(), st.view, c.lists(), c.meta(), View3<float>(s3.data(), {tq, H, d}, {d, tq * d, 1}));
    for (std::int64_t i = 0; i < tq; ++i)
        for (std::int64_t h = 0; h < H; ++h)
            for (std::int64_t e = 0; e < d; ++e)
                REQUIRE(s3[static_cast<std::size_t>((h * tq + i) * d + e)] == s1[static_cast<std::size_t>((i * H + h) * d + e)]);

    // q . k ~ 1e38 * d overflows fp32: those query rows are recomputed in double.
    auto big = c;
    for (auto& x : big.q) x *= 1e19f;
    for (auto& kb : big.k)
        for (auto& x : kb) x *= 1e19f;
    const auto sb = lay_out(big, Kind::hnd, 16, seed);
    std::vector<double> p_r;
    const auto o_r = run_reference(big, sb, &p_r);
    std::vector<float> o_s(o_r.size()), p_s(p_r.size());
    simd::batched_decode_attention(big.qv(), sb.view, big.lists(), big.meta(), View3<float>(o_s.data(), {tq, H, d}),
                                   std::span<float>(p_s));
    REQUIRE(std::all_of(o_s.begin(), o_s.end(), [](float x) { return std::isfinite(x); }));
    REQUIRE(vt::nmse(o_s, o_r) <= vt::kSimdVsReference.attention_nmse);
    REQUIRE(vt::max_abs_diff(p_s, p_r) <= vt::kSimdVsReference.score_rel * max_of(p_r));
}

TEST_CASE("batched decode: bad input is a clear error in both paths", "[batched][errors]") {
    // Two sequences (10 and 6 rows, 2 and 1 new tokens), per-KV-head lists, NHD pages of 4 rows.
    const std::int64_t H = 4, Hkv = 2, d = 8;
    // Lists: sequence 0 {0, 2, 5, 8, 9} and {1, 3, 8, 9} (rows 4, 6, 7 unread), sequence 1 {0, 4, 5} and {2, 5}.
    auto base = make_case<float>(H, Hkv, d, {10, 6}, {2, 1}, Lists::per_head, 0.5, vt::base_seed() + 37000);
    base.indices = {0, 2, 5, 8, 9, 1, 3, 8, 9, 0, 4, 5, 2, 5};
    base.list_indptr = {0, 5, 9, 12, 14};
    struct Input {
        Case<float> c;
        Storage<float> st;
        KvBatchView<const float> view;
        BatchRowLists lists;
        DecodeBatchHost meta;
        View3<const float> q;
        std::vector<float> out_buf;
        View3<float> out;
        AttentionOptions opt;
    };
    auto fresh = [&](const Case<float>& c) {
        auto in = std::make_unique<Input>();
        in->c = c;
        in->st = lay_out(in->c, Kind::nhd, 4, 5);
        in->view = in->st.view;
        in->lists = in->c.lists();
        in->meta = in->c.meta();
        in->q = in->c.qv();
        in->out_buf.assign(in->c.q.size(), 0.0f);
        in->out = View3<float>(in->out_buf.data(), {in->c.total_q(), H, d});
        return in;
    };
    auto error_of = [](auto&& f) -> std::string {
        try {
            f();
        } catch (const vlsparse::error& e) {
            return e.what();
        }
        return "(no error)";
    };
    // Every check in both paths (the probability overloads too, where the lists allow them).
    auto both = [&](const std::function<void(Input&)>& spoil, const std::string& msg) {
        auto in = fresh(base);
        spoil(*in);
        INFO("expected: " << msg);
        CHECK_THAT(error_of([&] { reference::batched_decode_attention(in->q, in->view, in->lists, in->meta, in->out, in->opt); }),
                   Contains("reference::batched_decode_attention") && Contains(msg));
        CHECK_THAT(error_of([&] { simd::batched_decode_attention(in->q, in->view, in->lists, in->meta, in->out, in->opt); }),
                   Contains("simd::batched_decode_attention") && Contains(msg));
        if (!in->lists.dense() && !in->meta.list_indptr.empty()) {
            std::vector<double> pd(static_cast<std::size_t>(std::max(0, in->meta.list_indptr.back())));
            std::vector<float> pf(pd.size());
            CHECK_THAT(error_of([&] {
                           reference::batched_decode_attention(in->q, in->view, in->lists, in->meta, in->out,
                                                               std::span<double>(pd), in->opt);
                       }),
                       Contains(msg));
            CHECK_THAT(error_of([&] {
                           simd::batched_decode_attention(in->q, in->view, in->lists, in->meta, in->out,
                                                          std::span<float>(pf), in->opt);
                       }),
                       Contains(msg));
        }
    };
    {  // the unspoiled input runs, and so does one with unused block-table entries out of the pool
        auto in = fresh(base);
        REQUIRE(in->st.block_table[3] == -1);  // sequence 0 uses pages 0..2 of 4 entries
        REQUIRE_NOTHROW(reference::batched_decode_attention(in->q, in->view, in->lists, in->meta, in->out));
        REQUIRE_NOTHROW(simd::batched_decode_attention(in->q, in->view, in->lists, in->meta, in->out));
    }
    // Lengths.
    std::vector<std::int32_t> one{10}, zero_len{10, 0}, long_len{10, 40};
    both([&](Input& in) { in.meta.seq_lens = one; }, "seq_lens has 1 entries, expected batch = 2");
    both([&](Input& in) { in.meta.seq_lens = zero_len; }, "sequence 1 holds 0 rows, expected 1..");
    both([&](Input& in) { in.meta.seq_lens = long_len; }, "sequence 1 holds 40 rows, expected 1..16");
    std::vector<std::int32_t> other_lens{10, 5};
    both([&](Input& in) { in.view.seq_lens = other_lens.data(); }, "cache.seq_lens[1] = 5 but the host metadata says 6");
    // q_len and q_indptr.
    std::vector<std::int32_t> ql0{0, 2, 2}, ql9{0, 9, 10}, ql_long{0, 2, 9}, short_ptr{0, 2}, not0{1, 3, 4};
    both([&](Input& in) { in.meta.q_indptr = ql0; }, "sequence 1 has q_len = 0, expected 1..8");
    both([&](Input& in) { in.meta.q_indptr = ql9; }, "sequence 0 has q_len = 9, expected 1..8");
    both([&](Input& in) { in.meta.q_indptr = ql_long; }, "sequence 1 has q_len = 7, expected 1..8 and <= its 6 rows");
    both([&](Input& in) { in.meta.q_indptr = short_ptr; }, "q_indptr has 2 entries, expected batch + 1 = 3");
    both([&](Input& in) { in.meta.q_indptr = not0; }, "q_indptr[0] = 1, expected 0");
    both([&](Input& in) { in.meta.q_indptr = {}; }, "q has 3 query tokens, expected total_q = 2 (one per sequence");
    // List indptr and the lists' agreement with the metadata.
    std::vector<std::int32_t> lp_short, lp_not0;
    both([&](Input& in) {
            lp_short.assign(in.c.list_indptr.begin(), in.c.list_indptr.end() - 1);
            in.meta.list_indptr = lp_short;
        },
        "list indptr has 4 entries, expected batch x lists_per_seq + 1 = 5");
    both([&](Input& in) {
            lp_not0 = in.c.list_indptr;
            lp_not0[0] = 1;
            in.meta.list_indptr = lp_not0;
        },
        "list indptr[0] = 1, expected 0");
    both([&](Input& in) {
            in.meta.lists_per_seq = 3;
            in.lists.lists_per_seq = 3;
        },
        "lists_per_seq = 3, expected 1 (shared) or H_kv = 2");
    both([&](Input& in) { in.lists.lists_per_seq = 1; }, "the row lists have lists_per_seq = 1 but the host metadata says 2");
    both([&](Input& in) { in.lists = BatchRowLists{nullptr, nullptr, 2}; }, "the row lists are dense (indptr null)");
    std::vector<std::int32_t> lp_other;
    both([&](Input& in) {
            lp_other = in.c.list_indptr;
            in.lists.indptr = lp_other.data();
            lp_other[2] -= 1;  // list 1 of sequence 0 one entry shorter on the "device"
        },
        "list indptr[2] = ");
    both([&](Input& in) { in.c.list_indptr[2] = in.c.list_indptr[1]; }, "list 1 of sequence 0 has 0 entries, expected 1..10");
    // List contents (indices[5..8] is list 1 of sequence 0, indices[9..11] list 0 of sequence 1).
    both([&](Input& in) { std::swap(in.c.indices[5], in.c.indices[6]); },
         "list 1 of sequence 0 is not sorted ascending without duplicates at entry 1 (rows 3, 1)");
    both([&](Input& in) { in.c.indices[6] = 1; },
         "list 1 of sequence 0 is not sorted ascending without duplicates at entry 1 (rows 1, 1)");
    both([&](Input& in) { in.c.indices[13] = 6; },
         "list 1 of sequence 1 holds row 6 at entry 1 (indices[13]), expected a row in [0, 6)");
    both([&](Input& in) { in.c.indices[9] = -1; }, "list 0 of sequence 1 holds row -1 at entry 0");
    both([&](Input& in) {
            // list 1 of sequence 0 is {9}: query 0 (position 8) sees none of it
            in.c.indices = {0, 2, 5, 8, 9, 9, 0, 4, 5, 2, 5};
            in.c.list_indptr = {0, 5, 6, 9, 11};
            in.lists = in.c.lists();
            in.meta = in.c.meta();
        },
        "query 0 of sequence 0 (position 8) sees no row of list 1 (its first row is 9)");
    // Block tables: only the entries of pages in use are read.
    both([&](Input& in) { in.st.block_table[4] = static_cast<std::int32_t>(in.view.n_pages); },
         "block_table[1, 0] = ");
    both([&](Input& in) { in.st.block_table[1] = -1; }, "block_table[0, 1] = -1 (sequence 0, rows 4..7), expected a page of the pool in [0, ");
    // Cache strides and shapes.
    both([&](Input& in) { in.view.head_stride = d - 1; }, "make rows or heads of d = 8 elements overlap");
    both([&](Input& in) { in.view.page_stride = 4 * Hkv * d - 1; }, "pages (or sequences) overlap");
    both([&](Input& in) { in.view.n_kv_heads = 3; }, "H = 4 query heads is not a positive multiple of H_kv = 3");
    both([&](Input& in) { in.view.head_dim = 4; }, "q has head_dim 8, the cache 4; expected equal");
    both([&](Input& in) { in.view.n_pages = 0; }, "paged cache with n_pages = 0");
    // q and out.
    both([&](Input& in) { in.q = View3<const float>(in.c.q.data(), {2, H, d}); }, "q has 2 query tokens, expected total_q = 3");
    both([&](Input& in) { in.out = View3<float>(in.out_buf.data(), {3, H, d - 1}); }, "out has shape [3, 4, 7], expected [3, 4, 8]");
    both([&](Input& in) { in.out = View3<float>(in.out_buf.data(), {3, H, d}, {H * d, d / 2, 1}); },
         "output out has overlapping strides");
    both([&](Input& in) { in.out = View3<float>(in.c.q.data(), {3, H, d}); }, "output out aliases input q");
    both([&](Input& in) { in.out = View3<float>(in.st.k.data() + 40, {3, H, d}); }, "output out aliases input cache k");
    both([&](Input& in) { in.out = View3<float>(in.st.v.data(), {3, H, d}); }, "output out aliases input cache v");
    both([&](Input& in) { in.opt.scale = -1.0f; }, "scale = -1");
    // Non-finite values: in q, and in a K/V row that is read; one in a row no list names is never read.
    both([&](Input& in) { in.c.q[17] = std::numeric_limits<float>::quiet_NaN(); }, "q[0, 2, 1] = nan");
    const std::int64_t read_row = base.list(0, 1)[0];
    both([&](Input& in) { const_cast<float*>(in.view.k_row(0, read_row, 1))[3] = std::numeric_limits<float>::infinity(); },
         "cache k row " + std::to_string(read_row) + " of sequence 0, KV head 1 is not finite");
    both([&](Input& in) { const_cast<float*>(in.view.v_row(1, base.list(1, 0)[0], 0))[0] = std::numeric_limits<float>::quiet_NaN(); },
         "cache v row " + std::to_string(base.list(1, 0)[0]) + " of sequence 1, KV head 0 is not finite");
    {
        std::int64_t unread = -1;  // a row of sequence 0 in neither of its lists
        for (std::int64_t r = 0; r < 10 && unread < 0; ++r) {
            const auto l0 = base.list(0, 0), l1 = base.list(0, 1);
            if (!std::binary_search(l0.begin(), l0.end(), r) && !std::binary_search(l1.begin(), l1.end(), r)) unread = r;
        }
        REQUIRE(unread >= 0);
        auto in = fresh(base);
        for (std::int64_t g = 0; g < Hkv; ++g) {
            const_cast<float*>(in->view.k_row(0, unread, g))[0] = std::numeric_limits<float>::quiet_NaN();
            const_cast<float*>(in->view.v_row(0, unread, g))[1] = std::numeric_limits<float>::quiet_NaN();
        }
        REQUIRE_NOTHROW(reference::batched_decode_attention(in->q, in->view, in->lists, in->meta, in->out));
        REQUIRE_NOTHROW(simd::batched_decode_attention(in->q, in->view, in->lists, in->meta, in->out));
        REQUIRE(std::all_of(in->out_buf.begin(), in->out_buf.end(), [](float x) { return std::isfinite(x); }));
        // check_finite off: the scan is skipped (the read NaN then reaches the output).
        const_cast<float*>(in->view.k_row(0, read_row, 1))[0] = std::numeric_limits<float>::quiet_NaN();
        AttentionOptions unchecked;
        unchecked.check_finite = false;
        REQUIRE_NOTHROW(simd::batched_decode_attention(in->q, in->view, in->lists, in->meta, in->out, unchecked));
    }
    // An fp16 output beyond 65504 is an error, not inf: bf16 V = 1e5 everywhere makes every output 99840.
    {
        auto big = make_case<bfloat16>(H, Hkv, d, {10, 6}, {2, 1}, Lists::dense, 1.0, 11);
        for (auto& vb : big.v)
            for (auto& x : vb) x = bfloat16(1e5f);
        const auto sb = lay_out(big, Kind::contiguous, 0, 11);
        std::vector<half> oh(big.q.size());
        const View3<half> ov(oh.data(), {big.total_q(), H, d});
        CHECK_THAT(error_of([&] { reference::batched_decode_attention(big.qv(), sb.view, big.lists(), big.meta(), ov); }),
                   Contains("reference::batched_decode_attention: out[0, 0, 0] overflows fp16") && Contains("65504"));
        CHECK_THAT(error_of([&] { simd::batched_decode_attention(big.qv(), sb.view, big.lists(), big.meta(), ov); }),
                   Contains("simd::batched_decode_attention: out[0, 0, 0] overflows fp16") && Contains("65504"));
        std::vector<float> of(oh.size());
        REQUIRE_NOTHROW(simd::batched_decode_attention(big.qv(), sb.view, big.lists(), big.meta(),
                                                       View3<float>(of.data(), {big.total_q(), H, d})));
        REQUIRE(std::abs(of[0] - 99840.0f) <= 0.1f);
        AttentionOptions unchecked;  // check_finite off: the caller takes what the conversion gives
        unchecked.check_finite = false;
        CHECK_NOTHROW(simd::batched_decode_attention(big.qv(), sb.view, big.lists(), big.meta(), ov, unchecked));
    }
    // Probabilities: one per list entry, and only for explicit lists.
    {
        auto in = fresh(base);
        std::vector<float> pf(static_cast<std::size_t>(in->c.n_entries() + 1));
        CHECK_THAT(error_of([&] {
                       simd::batched_decode_attention(in->q, in->view, in->lists, in->meta, in->out, std::span<float>(pf));
                   }),
                   Contains("probs has " + std::to_string(pf.size()) + " entries, expected one per list entry: " +
                            std::to_string(in->c.n_entries())));
        std::vector<double> pd(pf.size());
        CHECK_THAT(error_of([&] {
                       reference::batched_decode_attention(in->q, in->view, in->lists, in->meta, in->out, std::span<double>(pd));
                   }),
                   Contains("expected one per list entry"));
        const auto dense = make_case<float>(H, Hkv, d, {10, 6}, {2, 1}, Lists::dense, 1.0, 3);
        const auto sd = lay_out(dense, Kind::contiguous, 0, 3);
        CHECK_THAT(error_of([&] {
                       reference::batched_decode_attention(dense.qv(), sd.view, dense.lists(), dense.meta(), in->out,
                                                           std::span<double>(pd));
                   }),
                   Contains("probabilities were asked for with dense lists"));
        std::vector<float> alias(in->out_buf.size());
        CHECK_THAT(error_of([&] {
                       simd::batched_decode_attention(in->q, in->view, in->lists, in->meta, in->out,
                                                      std::span<float>(in->out_buf.data(), static_cast<std::size_t>(in->c.n_entries())));
                   }),
                   Contains("output probs aliases output out"));
    }
}
