// Tests of the scalar reference attention against hand-computed cases and against itself
// (probe rows, sparse vs dense, decode vs the last dense row), plus its input checks.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <vlsparse/core/rng.hpp>
#include <vlsparse/core/selection.hpp>
#include <vlsparse/kv/kv_cache.hpp>
#include <vlsparse/reference/attention.hpp>
#include "error_of.hpp"

using Catch::Matchers::Contains;
using vlsparse::View2;
using vlsparse::View3;
namespace ref = vlsparse::reference;

namespace {

const float kLn3 = static_cast<float>(std::log(3.0));

// A [n, H, d] buffer with its views.
struct T3 {
    std::int64_t n, H, d;
    std::vector<float> data;
    T3(std::int64_t n_, std::int64_t h, std::int64_t d_, std::vector<float> values = {})
        : n(n_), H(h), d(d_), data(std::move(values)) {
        if (data.empty()) data.assign(static_cast<std::size_t>(n * H * d), 0.0f);
        REQUIRE(data.size() == static_cast<std::size_t>(n * H * d));
    }
    View3<const float> view() const { return View3<const float>(data.data(), {n, H, d}); }
    float& at(std::int64_t i, std::int64_t h, std::int64_t c) { return data[static_cast<std::size_t>((i * H + h) * d + c)]; }
};

// Output buffer in double.
struct Out3 {
    std::int64_t n, H, d;
    std::vector<double> data;
    Out3(std::int64_t n_, std::int64_t h, std::int64_t d_)
        : n(n_), H(h), d(d_), data(static_cast<std::size_t>(n_ * h * d_), -777.0) {}
    View3<double> view() { return View3<double>(data.data(), {n, H, d}); }
    double at(std::int64_t i, std::int64_t h, std::int64_t c) const {
        return data[static_cast<std::size_t>((i * H + h) * d + c)];
    }
};

T3 random3(std::int64_t n, std::int64_t H, std::int64_t d, std::uint64_t seed) {
    vlsparse::SplitMix64 r(seed);
    std::vector<float> v(static_cast<std::size_t>(n * H * d));
    for (auto& x : v) x = static_cast<float>(r.uniform() * 2.0 - 1.0);
    return T3(n, H, d, std::move(v));
}

vlsparse::AttentionOptions scale(float s) {
    vlsparse::AttentionOptions o;
    o.scale = s;
    return o;
}

using vt::error_of;

}  // namespace

TEST_CASE("reference::dense_attention: hand-computed n = 2, d = 2", "[reference]") {
    // k0 = e0, k1 = e1; q1 = (0, ln 3) with scale 1: logits (0, ln 3) -> softmax (1/4, 3/4).
    T3 q(2, 1, 2, {5.0f, -7.0f, 0.0f, kLn3});
    T3 k(2, 1, 2, {1.0f, 0.0f, 0.0f, 1.0f});
    T3 v(2, 1, 2, {1.0f, 2.0f, 3.0f, -2.0f});
    Out3 out(2, 1, 2);
    ref::dense_attention(q.view(), k.view(), v.view(), out.view(), scale(1.0f));
    // Row 0 sees key 0 only: its value whatever the logit.
    CHECK(out.at(0, 0, 0) == 1.0);
    CHECK(out.at(0, 0, 1) == 2.0);
    // Row 1: 1/4 * (1, 2) + 3/4 * (3, -2) = (2.5, -1).
    CHECK(out.at(1, 0, 0) == Approx(2.5).epsilon(1e-7));
    CHECK(out.at(1, 0, 1) == Approx(-1.0).epsilon(1e-7));

    // Default scale 1/sqrt(d): d = 4, scale 1/2, q1 = (0, 2 ln 3, 0, 0) gives the same weights.
    T3 q4(2, 1, 4, {0, 0, 0, 0, 0, 2 * kLn3, 0, 0});
    T3 k4(2, 1, 4, {1, 0, 0, 0, 0, 1, 0, 0});
    T3 v4(2, 1, 4, {4, 0, 0, 8, 0, 4, 0, 0});
    Out3 o4(2, 1, 4);
    ref::dense_attention(q4.view(), k4.view(), v4.view(), o4.view());
    CHECK(o4.at(1, 0, 0) == Approx(1.0).epsilon(1e-7));   // 1/4 * 4
    CHECK(o4.at(1, 0, 1) == Approx(3.0).epsilon(1e-7));   // 3/4 * 4
    CHECK(o4.at(1, 0, 3) == Approx(2.0).epsilon(1e-7));   // 1/4 * 8
    CHECK(o4.at(1, 0, 2) == 0.0);
}

TEST_CASE("reference::dense_attention: uniform weights give running means (n = 3)", "[reference]") {
    // Zero keys: every visible key has logit 0, so row i is the mean of v_0..v_i (exact in double).
    T3 q = random3(3, 1, 2, 1);
    T3 k(3, 1, 2);
    T3 v(3, 1, 2, {3, 6, 6, 0, 0, 9});
    Out3 out(3, 1, 2);
    ref::dense_attention(q.view(), k.view(), v.view(), out.view());
    CHECK(out.at(0, 0, 0) == 3.0);
    CHECK(out.at(0, 0, 1) == 6.0);
    CHECK(out.at(1, 0, 0) == 4.5);
    CHECK(out.at(1, 0, 1) == 3.0);
    CHECK(out.at(2, 0, 0) == Approx(3.0).epsilon(1e-15));
    CHECK(out.at(2, 0, 1) == Approx(5.0).epsilon(1e-15));

    // n_q < n_k: one query at position 2 sees all three keys.
    T3 q1(1, 1, 2, {0.3f, 0.4f});
    Out3 o1(1, 1, 2);
    ref::dense_attention(q1.view(), k.view(), v.view(), o1.view());
    CHECK(o1.at(0, 0, 0) == Approx(3.0).epsilon(1e-15));
    CHECK(o1.at(0, 0, 1) == Approx(5.0).epsilon(1e-15));
}

TEST_CASE("reference::dense_attention: GQA H = 2, H_kv = 1, hand-computed", "[reference]") {
    // Head 0 prefers key 1 (weights 1/4, 3/4), head 1 prefers key 0 (3/4, 1/4); one shared KV head.
    T3 q(2, 2, 2, {0, 0, 0, 0, /* row 1: */ 0, kLn3, kLn3, 0});
    T3 k(2, 1, 2, {1, 0, 0, 1});
    T3 v(2, 1, 2, {4, 0, 0, 8});
    Out3 out(2, 2, 2);
    ref::dense_attention(q.view(), k.view(), v.view(), out.view(), scale(1.0f));
    CHECK(out.at(0, 0, 0) == 4.0);  // row 0, both heads: v0
    CHECK(out.at(0, 1, 1) == 0.0);
    CHECK(out.at(1, 0, 0) == Approx(1.0).epsilon(1e-7));
    CHECK(out.at(1, 0, 1) == Approx(6.0).epsilon(1e-7));
    CHECK(out.at(1, 1, 0) == Approx(3.0).epsilon(1e-7));
    CHECK(out.at(1, 1, 1) == Approx(2.0).epsilon(1e-7));

    // H = 4, H_kv = 2: heads 0, 1 read KV head 0 and heads 2, 3 read KV head 1. With equal queries per
    // pair, the pair's outputs are equal and differ from the other pair.
    T3 q4 = random3(3, 4, 2, 5);
    for (std::int64_t i = 0; i < 3; ++i)
        for (std::int64_t c = 0; c < 2; ++c) {
            q4.at(i, 1, c) = q4.at(i, 0, c);
            q4.at(i, 3, c) = q4.at(i, 0, c);
            q4.at(i, 2, c) = q4.at(i, 0, c);
        }
    T3 k2 = random3(3, 2, 2, 6), v2 = random3(3, 2, 2, 7);
    Out3 o(3, 4, 2);
    ref::dense_attention(q4.view(), k2.view(), v2.view(), o.view());
    for (std::int64_t c = 0; c < 2; ++c) {
        CHECK(o.at(2, 0, c) == o.at(2, 1, c));
        CHECK(o.at(2, 2, c) == o.at(2, 3, c));
        CHECK(o.at(2, 0, c) != o.at(2, 2, c));
    }
}

TEST_CASE("reference::probe_attention: rows sum to 1, zero beyond the causal position", "[reference]") {
    const std::int64_t n = 7, H = 4, Hkv = 2, d = 8;
    const T3 q = random3(n, H, d, 11), k = random3(n, Hkv, d, 12);
    const std::vector<std::int64_t> rows{0, 3, 6};
    Out3 p(H, 3, n);
    ref::probe_attention(q.view(), k.view(), rows, p.view());
    const double sc = 1.0 / std::sqrt(static_cast<double>(d));
    for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t r = 0; r < 3; ++r) {
            const std::int64_t pos = rows[static_cast<std::size_t>(r)];
            double sum = 0;
            // Independent softmax in double over keys 0..pos of KV head h / 2.
            std::vector<double> logit(static_cast<std::size_t>(pos + 1));
            double mx = -1e300, z = 0;
            for (std::int64_t j = 0; j <= pos; ++j) {
                double s = 0;
                for (std::int64_t c = 0; c < d; ++c)
                    s += static_cast<double>(q.data[static_cast<std::size_t>((pos * H + h) * d + c)]) *
                         static_cast<double>(k.data[static_cast<std::size_t>((j * Hkv + h / 2) * d + c)]);
                logit[static_cast<std::size_t>(j)] = s * static_cast<double>(static_cast<float>(sc));
                mx = std::max(mx, logit[static_cast<std::size_t>(j)]);
            }
            for (auto x : logit) z += std::exp(x - mx);
            for (std::int64_t j = 0; j < n; ++j) {
                const double got = p.at(h, r, j);
                sum += got;
                if (j > pos) {
                    REQUIRE(got == 0.0);
                } else {
                    REQUIRE(got > 0.0);
                    REQUIRE(got == Approx(std::exp(logit[static_cast<std::size_t>(j)] - mx) / z).epsilon(1e-12));
                }
            }
            REQUIRE(sum == Approx(1.0).epsilon(1e-12));
        }
    // Row 0 attends only to itself.
    CHECK(p.at(0, 0, 0) == 1.0);

    // Uniform case by hand: zero keys, probe row r gives 1/(r+1) on keys 0..r.
    const T3 kz(5, 1, 2);
    const T3 q5 = random3(5, 1, 2, 13);
    const std::vector<std::int64_t> r2{1, 4};
    Out3 pu(1, 2, 5);
    ref::probe_attention(q5.view(), kz.view(), r2, pu.view());
    CHECK(pu.at(0, 0, 0) == 0.5);
    CHECK(pu.at(0, 0, 1) == 0.5);
    CHECK(pu.at(0, 0, 2) == 0.0);
    for (std::int64_t j = 0; j < 5; ++j) CHECK(pu.at(0, 1, j) == Approx(0.2).epsilon(1e-15));

    // n_q < n_k: query row r sits at position n_k - n_q + r.
    const T3 q2 = random3(2, 1, 2, 14);
    Out3 pc(1, 1, 5);
    ref::probe_attention(q2.view(), kz.view(), std::vector<std::int64_t>{0}, pc.view());
    for (std::int64_t j = 0; j < 4; ++j) CHECK(pc.at(0, 0, j) == Approx(0.25).epsilon(1e-15));
    CHECK(pc.at(0, 0, 4) == 0.0);
}

TEST_CASE("reference::sparse_attention: zero rows vs attend_selected rows", "[reference]") {
    // Zero keys: a query attends uniformly to the kept keys at or before it.
    const std::int64_t n = 5;
    const T3 q = random3(n, 1, 2, 21);
    const T3 k(n, 1, 2);
    const T3 v(n, 1, 2, {1, 10, 2, 20, 3, 30, 6, 60, 5, 50});
    vlsparse::TokenSelection sel;
    sel.n = n;
    sel.indices = {{0, 2, 3}};

    Out3 z(n, 1, 2);
    ref::sparse_attention(q.view(), k.view(), v.view(), sel, z.view(), vlsparse::UnselectedRows::zero);
    CHECK(z.at(0, 0, 0) == 1.0);                              // T ∩ [0,0] = {0}
    CHECK(z.at(1, 0, 0) == 0.0);                              // not selected: zero
    CHECK(z.at(1, 0, 1) == 0.0);
    CHECK(z.at(2, 0, 1) == Approx(20.0).epsilon(1e-15));      // {0, 2}: (10 + 30) / 2
    CHECK(z.at(3, 0, 0) == Approx(10.0 / 3).epsilon(1e-15));  // {0, 2, 3}: (1 + 3 + 6) / 3
    CHECK(z.at(4, 0, 0) == 0.0);
    CHECK(z.at(4, 0, 1) == 0.0);

    Out3 a(n, 1, 2);
    ref::sparse_attention(q.view(), k.view(), v.view(), sel, a.view(), vlsparse::UnselectedRows::attend_selected);
    for (std::int64_t i : {0, 2, 3})
        for (std::int64_t c = 0; c < 2; ++c) CHECK(a.at(i, 0, c) == z.at(i, 0, c));  // selected rows agree
    CHECK(a.at(1, 0, 0) == 1.0);                               // {0}
    CHECK(a.at(1, 0, 1) == 10.0);
    CHECK(a.at(4, 0, 1) == Approx(100.0 / 3).epsilon(1e-15));  // {0, 2, 3}: (10 + 30 + 60) / 3

    // A row with no kept key at or before it is zero even with attend_selected.
    sel.indices = {{2, 4}};
    Out3 e(n, 1, 2);
    ref::sparse_attention(q.view(), k.view(), v.view(), sel, e.view(), vlsparse::UnselectedRows::attend_selected);
    CHECK(e.at(0, 0, 0) == 0.0);
    CHECK(e.at(1, 0, 1) == 0.0);
    CHECK(e.at(3, 0, 0) == 3.0);
    CHECK(e.at(4, 0, 0) == 4.0);  // (3 + 5) / 2

    // Per-KV-head lists with GQA 2/2: each head reads its own list.
    const T3 q2 = random3(n, 2, 2, 22);
    const T3 k2(n, 2, 2);
    T3 v2(n, 2, 2);
    for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t g = 0; g < 2; ++g) v2.at(i, g, 0) = static_cast<float>(i + 10 * g);
    vlsparse::TokenSelection per;
    per.n = n;
    per.indices = {{1, 3}, {0, 4}};
    Out3 o2(n, 2, 2);
    ref::sparse_attention(q2.view(), k2.view(), v2.view(), per, o2.view());
    CHECK(o2.at(3, 0, 0) == 2.0);   // head 0, {1, 3}: (1 + 3) / 2
    CHECK(o2.at(3, 1, 0) == 0.0);   // head 1 does not keep 3
    CHECK(o2.at(4, 1, 0) == 12.0);  // head 1, {0, 4}: (10 + 14) / 2
    CHECK(o2.at(0, 0, 0) == 0.0);   // head 0 does not keep 0
}

TEST_CASE("reference: sparse with everything kept equals dense; decode equals the last dense row", "[reference]") {
    const std::int64_t n = 9, H = 4, Hkv = 2, d = 5;
    const T3 q = random3(n, H, d, 31), k = random3(n, Hkv, d, 32), v = random3(n, Hkv, d, 33);
    Out3 dense(n, H, d), sparse(n, H, d);
    ref::dense_attention(q.view(), k.view(), v.view(), dense.view());
    ref::sparse_attention(q.view(), k.view(), v.view(), vlsparse::TokenSelection::all(n), sparse.view());
    CHECK(sparse.data == dense.data);

    // The cache holds the whole sequence; the newest token (position n-1) decodes.
    vlsparse::KvCache<float> cache(Hkv, d);
    cache.assign(k.view(), v.view());
    std::vector<double> dout(static_cast<std::size_t>(H * d));
    ref::decode_attention(View2<const float>(q.data.data() + (n - 1) * H * d, {H, d}), cache,
                          View2<double>(dout.data(), {H, d}));
    for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t c = 0; c < d; ++c)
            REQUIRE(dout[static_cast<std::size_t>(h * d + c)] == Approx(dense.at(n - 1, h, c)).epsilon(1e-14));

    // After eviction the decode step attends to the kept rows: the sparse row of the same query.
    vlsparse::TokenSelection sel;
    sel.n = n;
    sel.indices = {{0, 3, 4, 8}, {1, 2, 8}};
    Out3 sp(n, H, d);
    ref::sparse_attention(q.view(), k.view(), v.view(), sel, sp.view());
    cache.keep(sel);
    ref::decode_attention(View2<const float>(q.data.data() + (n - 1) * H * d, {H, d}), cache,
                          View2<double>(dout.data(), {H, d}));
    for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t c = 0; c < d; ++c)
            REQUIRE(dout[static_cast<std::size_t>(h * d + c)] == Approx(sp.at(n - 1, h, c)).epsilon(1e-14));

    // fp32 outputs are the double result rounded once.
    std::vector<float> fout(static_cast<std::size_t>(n * H * d));
    ref::dense_attention(q.view(), k.view(), v.view(), View3<float>(fout.data(), {n, H, d}));
    for (std::size_t i = 0; i < fout.size(); ++i) REQUIRE(fout[i] == static_cast<float>(dense.data[i]));
}

TEST_CASE("reference: head-major (strided) inputs give the same result", "[reference]") {
    const std::int64_t n = 6, H = 2, Hkv = 1, d = 3;
    const T3 q = random3(n, H, d, 41), k = random3(n, Hkv, d, 42), v = random3(n, Hkv, d, 43);
    // Copy q into an [H, n, d] buffer and view it as [n, H, d].
    std::vector<float> qh(q.data.size());
    for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t h = 0; h < H; ++h)
            for (std::int64_t c = 0; c < d; ++c)
                qh[static_cast<std::size_t>((h * n + i) * d + c)] = q.data[static_cast<std::size_t>((i * H + h) * d + c)];
    Out3 a(n, H, d), b(n, H, d);
    ref::dense_attention(q.view(), k.view(), v.view(), a.view());
    ref::dense_attention(vlsparse::head_major<const float>(qh.data(), n, H, d), k.view(), v.view(), b.view());
    CHECK(a.data == b.data);
}

TEST_CASE("reference: bad inputs throw with a message", "[reference]") {
    const T3 q = random3(3, 3, 2, 51), k = random3(3, 2, 2, 52), v = random3(3, 2, 2, 53);
    Out3 out(3, 3, 2);
    CHECK_THAT(error_of([&] { ref::dense_attention(q.view(), k.view(), v.view(), out.view()); }),
               Contains("reference::dense_attention: H = 3 query heads is not a multiple of H_kv = 2"));

    const T3 q2 = random3(3, 2, 2, 54), k1 = random3(3, 1, 2, 55), v1 = random3(3, 1, 2, 56);
    Out3 o2(3, 2, 2);
    CHECK_NOTHROW(ref::dense_attention(q2.view(), k1.view(), v1.view(), o2.view()));
    const T3 empty(0, 2, 2);
    Out3 oe(0, 2, 2);
    CHECK_THAT(error_of([&] { ref::dense_attention(empty.view(), k1.view(), v1.view(), oe.view()); }),
               Contains("q has 0 tokens, expected at least one (empty input)"));
    const T3 ke(0, 1, 2);
    CHECK_THAT(error_of([&] { ref::dense_attention(q2.view(), ke.view(), ke.view(), o2.view()); }),
               Contains("k has 0 tokens"));
    Out3 wrong(3, 2, 3);
    CHECK_THAT(error_of([&] { ref::dense_attention(q2.view(), k1.view(), v1.view(), wrong.view()); }),
               Contains("out has shape [3, 2, 3], expected [3, 2, 2]"));
    const T3 kd(3, 1, 3);
    CHECK_THAT(error_of([&] { ref::dense_attention(q2.view(), kd.view(), kd.view(), o2.view()); }),
               Contains("k has head_dim 3, q has 2"));
    CHECK_THAT(error_of([&] { ref::dense_attention(q2.view(), k1.view(), k.view(), o2.view()); }),
               Contains("v has shape [3, 2, 2], expected the shape of k"));
    const T3 qlong = random3(4, 2, 2, 57);
    Out3 o4(4, 2, 2);
    CHECK_THAT(error_of([&] { ref::dense_attention(qlong.view(), k1.view(), v1.view(), o4.view()); }),
               Contains("q has 4 tokens and k has 3, expected n_q <= n_k"));

    // Output aliasing an input: out written over q's buffer.
    std::vector<float> buf = q2.data;
    const View3<const float> qa(buf.data(), {3, 2, 2});
    CHECK_THAT(error_of([&] { ref::dense_attention(qa, k1.view(), v1.view(), View3<float>(buf.data(), {3, 2, 2})); }),
               Contains("output out aliases input q; expected separate buffers"));
    // ... and over the buffer that holds k (k is the first half of it).
    std::vector<float> big(12, 0.25f);
    CHECK_THAT(error_of([&] {
                   ref::dense_attention(q2.view(), View3<const float>(big.data(), {3, 1, 2}), v1.view(),
                                        View3<float>(big.data(), {3, 2, 2}));
               }),
               Contains("output out aliases input k"));
    // Overlapping output strides.
    CHECK_THAT(error_of([&] {
                   ref::dense_attention(q2.view(), k1.view(), v1.view(), View3<float>(big.data(), {3, 2, 2}, {2, 1, 1}));
               }),
               Contains("output out has overlapping strides"));

    // NaN / Inf in inputs.
    T3 kn = k1;
    kn.at(1, 0, 0) = std::numeric_limits<float>::quiet_NaN();
    CHECK_THAT(error_of([&] { ref::dense_attention(q2.view(), kn.view(), v1.view(), o2.view()); }),
               Contains("reference::dense_attention: k[1, 0, 0] = nan; expected finite values"));
    T3 vn = v1;
    vn.at(2, 0, 1) = std::numeric_limits<float>::infinity();
    CHECK_THAT(error_of([&] { ref::dense_attention(q2.view(), k1.view(), vn.view(), o2.view()); }),
               Contains("v[2, 0, 1] = inf"));
    CHECK_THAT(error_of([&] { ref::dense_attention(q2.view(), k1.view(), v1.view(), o2.view(), scale(-1.0f)); }),
               Contains("scale = -1"));

    // probe_attention.
    Out3 pr(2, 2, 3);
    CHECK_THAT(error_of([&] { ref::probe_attention(q2.view(), k1.view(), std::vector<std::int64_t>{}, pr.view()); }),
               Contains("no probe rows given"));
    CHECK_THAT(error_of([&] { ref::probe_attention(q2.view(), k1.view(), std::vector<std::int64_t>{2, 1}, pr.view()); }),
               Contains("rows is not sorted ascending without duplicates"));
    CHECK_THAT(error_of([&] { ref::probe_attention(q2.view(), k1.view(), std::vector<std::int64_t>{0, 3}, pr.view()); }),
               Contains("rows[1] = 3, expected an index in [0, 3)"));
    Out3 pw(2, 3, 3);
    CHECK_THAT(error_of([&] { ref::probe_attention(q2.view(), k1.view(), std::vector<std::int64_t>{0, 1}, pw.view()); }),
               Contains("probs has shape [2, 3, 3], expected [2, 2, 3]"));
    CHECK_THAT(error_of([&] { ref::probe_attention(q2.view(), kn.view(), std::vector<std::int64_t>{0, 1}, pr.view()); }),
               Contains("k[1, 0, 0] = nan"));

    // sparse_attention.
    vlsparse::TokenSelection sel;
    sel.n = 4;
    sel.indices = {{0, 1}};
    CHECK_THAT(error_of([&] { ref::sparse_attention(q2.view(), k1.view(), v1.view(), sel, o2.view()); }),
               Contains("selection refers to 4 tokens, the input has 3"));
    sel.n = 3;
    sel.indices = {{1, 0}};
    CHECK_THAT(error_of([&] { ref::sparse_attention(q2.view(), k1.view(), v1.view(), sel, o2.view()); }),
               Contains("selection list 0 is not sorted ascending"));
    sel.indices = {{0}, {1}};
    CHECK_THAT(error_of([&] { ref::sparse_attention(q2.view(), k1.view(), v1.view(), sel, o2.view()); }),
               Contains("selection has 2 lists, expected 1 (shared) or 1 (one per KV head)"));

    // decode_attention.
    vlsparse::KvCache<float> cache(1, 2);
    std::vector<float> qd{1, 2, 3, 4};
    std::vector<double> od(4);
    CHECK_THAT(error_of([&] {
                   ref::decode_attention(View2<const float>(qd.data(), {2, 2}), cache, View2<double>(od.data(), {2, 2}));
               }),
               Contains("KV head 0 of the cache is empty"));
    cache.assign(k1.view(), v1.view());
    CHECK_NOTHROW(
        ref::decode_attention(View2<const float>(qd.data(), {2, 2}), cache, View2<double>(od.data(), {2, 2})));
    vlsparse::KvCache<float> cache2(2, 2);
    cache2.assign(k.view(), v.view());
    std::vector<float> q3(6, 0.5f);
    std::vector<double> o3(6);
    CHECK_THAT(error_of([&] {
                   ref::decode_attention(View2<const float>(q3.data(), {3, 2}), cache2, View2<double>(o3.data(), {3, 2}));
               }),
               Contains("H = 3 query heads is not a multiple of the cache's H_kv = 2"));
    CHECK_THAT(error_of([&] {
                   ref::decode_attention(View2<const float>(q3.data(), {2, 3}), cache, View2<double>(o3.data(), {2, 3}));
               }),
               Contains("q has shape [2, 3], expected [H, 2]"));
    CHECK_THAT(error_of([&] {
                   ref::decode_attention(View2<const float>(qd.data(), {2, 2}), cache, View2<double>(od.data(), {1, 2}));
               }),
               Contains("out has shape [1, 2], expected [2, 2]"));
    CHECK_THAT(error_of([&] {
                   ref::decode_attention(View2<const float>(qd.data(), {2, 2}), cache, View2<float>(qd.data(), {2, 2}));
               }),
               Contains("output out aliases input q"));
    qd[3] = std::numeric_limits<float>::quiet_NaN();
    CHECK_THAT(error_of([&] {
                   ref::decode_attention(View2<const float>(qd.data(), {2, 2}), cache, View2<double>(od.data(), {2, 2}));
               }),
               Contains("q[1, 1] = nan"));
}

TEST_CASE("reference: an output that overflows fp16 is an error, not inf (issue 21)", "[reference][issue21]") {
    // bf16 inputs, V = 1e5 everywhere: every output is 1e5 (a mean of equal values), finite in fp32 and
    // bf16 but beyond fp16's 65504. The fp16 output used to be all inf, silently.
    const std::int64_t n = 2, H = 1, d = 4;
    std::vector<vlsparse::bfloat16> q(static_cast<std::size_t>(n * H * d), vlsparse::bfloat16(0.5f)), k(q),
        v(q.size(), vlsparse::bfloat16(1e5f));
    const View3<const vlsparse::bfloat16> qv(q.data(), {n, H, d}), kv(k.data(), {n, H, d}), vv(v.data(), {n, H, d});
    std::vector<vlsparse::half> oh(q.size());
    CHECK_THAT(error_of([&] { ref::dense_attention(qv, kv, vv, View3<vlsparse::half>(oh.data(), {n, H, d})); }),
               Contains("reference::dense_attention: out[0, 0, 0] overflows fp16") && Contains("65504"));
    vlsparse::TokenSelection all;
    all.n = n;
    all.indices = {{0, 1}};
    CHECK_THAT(error_of([&] { ref::sparse_attention(qv, kv, vv, all, View3<vlsparse::half>(oh.data(), {n, H, d})); }),
               Contains("reference::sparse_attention: out[0, 0, 0] overflows fp16"));
    vlsparse::KvCache<vlsparse::bfloat16> cache(1, d);
    cache.assign(kv, vv);
    CHECK_THAT(error_of([&] {
                   ref::decode_attention(View2<const vlsparse::bfloat16>(q.data(), {1, d}), cache,
                                         View2<vlsparse::half>(oh.data(), {1, d}));
               }),
               Contains("reference::decode_attention: out[0, 0] overflows fp16"));
    // fp32 and bf16 outputs hold 1e5.
    std::vector<float> of(q.size());
    CHECK_NOTHROW(ref::dense_attention(qv, kv, vv, View3<float>(of.data(), {n, H, d})));
    CHECK(of[0] == 99840.0f);
    std::vector<vlsparse::bfloat16> ob(q.size());
    CHECK_NOTHROW(ref::dense_attention(qv, kv, vv, View3<vlsparse::bfloat16>(ob.data(), {n, H, d})));
}
