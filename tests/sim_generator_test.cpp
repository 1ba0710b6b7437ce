// Tests of the synthetic attention source (sim/include/vlsparse/sim/synthetic.hpp): every planted
// phenomenon is really there in the attention the reference computes, the head mix, determinism,
// near-duplicate video frames, bad input, and version 1 against the committed golden inputs.
#include <vlsparse/sim/synthetic.hpp>  // first: the header compiles on its own

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <vlsparse/io/npy.hpp>
#include <vlsparse/reference/attention.hpp>

#include "test_util.hpp"
#include "error_of.hpp"

using Catch::Matchers::Contains;
using vlsparse::Layout;
using vlsparse::View3;
using vlsparse::sim::HeadKind;
using vlsparse::sim::SyntheticLayer;
using vlsparse::sim::SyntheticParams;
using vlsparse::sim::SyntheticPrompt;

namespace {

using vt::error_of;

// Attention probabilities of the listed query rows, P(h, r, j), causal, scale 1/sqrt(d), by the reference.
struct Probs {
    std::int64_t H = 0, R = 0, n = 0;
    std::vector<double> p;
    double operator()(std::int64_t h, std::int64_t r, std::int64_t j) const {
        return p[static_cast<std::size_t>((h * R + r) * n + j)];
    }
};
Probs attention(const SyntheticLayer& L, const std::vector<std::int64_t>& rows) {
    Probs P;
    P.H = L.n_heads;
    P.R = static_cast<std::int64_t>(rows.size());
    P.n = L.n;
    P.p.assign(static_cast<std::size_t>(P.H * P.R * P.n), 0.0);
    vlsparse::reference::probe_attention(View3<const float>(L.q.data(), {L.n, L.n_heads, L.head_dim}),
                                         View3<const float>(L.k.data(), {L.n, L.n_kv_heads, L.head_dim}), rows,
                                         View3<double>(P.p.data(), {P.H, P.R, P.n}));
    return P;
}

// One query head of each kind, so every test sees every kind side by side.
constexpr std::int64_t kDiffuse = 0, kSink = 1, kLocal = 2, kHeavy = 3, kDocument = 4;
SyntheticParams five_kinds(std::int64_t d) {
    SyntheticParams P;
    P.head_dim = d;
    P.n_heads = 5;
    P.n_kv_heads = 5;
    P.head_kinds = {HeadKind::diffuse, HeadKind::sink, HeadKind::local, HeadKind::heavy, HeadKind::document};
    P.seed = vt::base_seed();
    return P;
}

// Two 24x24 images with delimiter tokens around each, text between and after.
const char* kTwoImages = "text:20,text:1,image:576[24x24],text:1,text:10,text:1,image:576[24x24],text:1,text:30";

// Image queries in the second half of each image (every 5th), and every text query after the first image.
std::vector<std::int64_t> image_rows(const Layout& l) {
    std::vector<std::int64_t> r;
    for (const auto& s : l.segments())
        if (s.is_visual())
            for (std::int64_t i = s.start + s.length / 2; i < s.end(); i += 5) r.push_back(i);
    return r;
}
std::vector<std::int64_t> text_rows_after_first_image(const Layout& l) {
    std::vector<std::int64_t> r;
    bool seen = false;
    for (const auto& s : l.segments()) {
        if (s.is_visual()) seen = true;
        else if (seen)
            for (std::int64_t i = s.start; i < s.end(); ++i) r.push_back(i);
    }
    return r;
}

// Mean over rows of the mass that head h puts on the keys for which `in(row, key)` holds.
template <class F>
double mean_mass(const Probs& P, const std::vector<std::int64_t>& rows, std::int64_t h, F&& in) {
    double total = 0.0;
    for (std::int64_t r = 0; r < P.R; ++r) {
        double m = 0.0;
        for (std::int64_t j = 0; j <= rows[static_cast<std::size_t>(r)]; ++j)
            if (in(rows[static_cast<std::size_t>(r)], j)) m += P(h, r, j);
        total += m;
    }
    return total / static_cast<double>(P.R);
}

// Mean normalized entropy H(p) / log(visible keys) of head h's rows.
double mean_entropy(const Probs& P, const std::vector<std::int64_t>& rows, std::int64_t h) {
    double total = 0.0;
    for (std::int64_t r = 0; r < P.R; ++r) {
        const std::int64_t i = rows[static_cast<std::size_t>(r)];
        double e = 0.0;
        for (std::int64_t j = 0; j <= i; ++j) {
            const double p = P(h, r, j);
            if (p > 0.0) e -= p * std::log(p);
        }
        total += e / std::log(static_cast<double>(i + 1));
    }
    return total / static_cast<double>(P.R);
}

double rel_diff(const float* a, const float* b, std::size_t count) {
    double num = 0.0, den = 0.0;
    for (std::size_t i = 0; i < count; ++i) {
        num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
        den += static_cast<double>(b[i]) * b[i];
    }
    return std::sqrt(num / den);
}

}  // namespace

TEST_CASE("synthetic: sinks sit at the prompt start, each image start and around delimiters", "[sim][generator]") {
    const Layout l = Layout::parse(kTwoImages);
    SyntheticParams P;
    const SyntheticPrompt S = vlsparse::sim::synthetic_prompt(l, P);
    std::vector<std::int64_t> sinks;
    for (std::int64_t i = 0; i < S.n; ++i)
        if (S.sink[static_cast<std::size_t>(i)]) sinks.push_back(i);
    // 0; delimiter 20 and the image start 21; delimiter 597 and the text after it 598; delimiter 608
    // and the image start 609; delimiter 1185 and the text after it 1186.
    CHECK(sinks == std::vector<std::int64_t>{0, 20, 21, 597, 598, 608, 609, 1185, 1186});

    P.delimiter_sinks = false;
    P.image_sinks = 3;
    const SyntheticPrompt S2 = vlsparse::sim::synthetic_prompt(l, P);
    sinks.clear();
    for (std::int64_t i = 0; i < S2.n; ++i)
        if (S2.sink[static_cast<std::size_t>(i)]) sinks.push_back(i);
    CHECK(sinks == std::vector<std::int64_t>{0, 21, 22, 23, 609, 610, 611});
}

TEST_CASE("synthetic: sink heads put their mass on the sinks", "[sim][generator]") {
    for (std::int64_t d : {64, 128}) {
        const Layout l = Layout::parse(kTwoImages);
        const SyntheticParams P = five_kinds(d);
        INFO("seed " << P.seed << ", d = " << d);
        const auto L = vlsparse::sim::synthetic_layer(l, P, 3);
        REQUIRE(L.head_kind[kSink] == HeadKind::sink);
        for (const auto& rows : {image_rows(l), text_rows_after_first_image(l)}) {
            const Probs A = attention(L, rows);
            auto on_sink = [&](std::int64_t, std::int64_t j) { return L.sink[static_cast<std::size_t>(j)] != 0; };
            const double sink = mean_mass(A, rows, kSink, on_sink);
            const double diffuse = mean_mass(A, rows, kDiffuse, on_sink);
            INFO("sink head " << sink << ", diffuse head " << diffuse);
            CHECK(sink > 0.95);
            // A diffuse head's sink weight is at most minor_weight (a logit of at most 4 on 9 sinks).
            CHECK(diffuse < 0.4);
        }
    }
}

TEST_CASE("synthetic: local heads attend to the 2-D neighbourhood of an image token", "[sim][generator]") {
    for (std::int64_t d : {64, 128}) {
        const Layout l = Layout::parse(kTwoImages);
        const SyntheticParams P = five_kinds(d);
        INFO("seed " << P.seed << ", d = " << d);
        const auto L = vlsparse::sim::synthetic_layer(l, P, 3);
        const auto rows = image_rows(l);
        const Probs A = attention(L, rows);
        // Keys of the query's own image within 2 rows and 2 columns of it (at most 13 causal keys of 1216).
        auto near = [&](std::int64_t i, std::int64_t j) {
            const auto& s = l[l.segment_of(i)];
            if (j < s.start) return false;
            const std::int64_t ui = i - s.start, uj = j - s.start;
            return std::abs(ui / s.grid_w - uj / s.grid_w) <= 2 && std::abs(ui % s.grid_w - uj % s.grid_w) <= 2;
        };
        const double local = mean_mass(A, rows, kLocal, near), diffuse = mean_mass(A, rows, kDiffuse, near);
        INFO("local head " << local << ", diffuse head " << diffuse);
        CHECK(local > 0.75);
        CHECK(diffuse < 0.15);
        // The neighbourhood is 2-D: the key one row up (24 positions back) outweighs the key 3 columns back.
        double up = 0.0, back3 = 0.0;
        for (std::int64_t r = 0; r < A.R; ++r) {
            const std::int64_t i = rows[static_cast<std::size_t>(r)];
            up += A(kLocal, r, i - 24);
            back3 += A(kLocal, r, i - 3);
        }
        CHECK(up > 3.0 * back3);
    }
}

TEST_CASE("synthetic: text queries of heavy heads focus on the planted heavy hitters", "[sim][generator]") {
    for (std::int64_t d : {64, 128}) {
        const Layout l = Layout::parse(kTwoImages);
        const SyntheticParams P = five_kinds(d);
        INFO("seed " << P.seed << ", d = " << d);
        const auto L = vlsparse::sim::synthetic_layer(l, P, 3);
        std::int64_t heavy = 0;
        for (auto h : L.heavy) heavy += h;
        CHECK(heavy == 2 * std::llround(P.heavy_fraction * 576));  // per image
        const auto rows = text_rows_after_first_image(l);
        const Probs A = attention(L, rows);
        auto on_heavy = [&](std::int64_t, std::int64_t j) { return L.heavy[static_cast<std::size_t>(j)] != 0; };
        const double h = mean_mass(A, rows, kHeavy, on_heavy), diffuse = mean_mass(A, rows, kDiffuse, on_heavy);
        INFO("heavy head " << h << ", diffuse head " << diffuse);
        CHECK(h > 0.9);
        CHECK(diffuse < 0.2);
        // Image queries of the heavy head look at them too, less than the text question (text_focus).
        const auto irows = image_rows(l);
        const double img = mean_mass(attention(L, irows), irows, kHeavy, on_heavy);
        INFO("image queries " << img);
        CHECK(img > 0.5);
        CHECK(img < h);
    }
}

TEST_CASE("synthetic: heavy hitters come in patches on a grid and never on a sink", "[sim][generator]") {
    const Layout l = Layout::parse("text:4,image:1024[32x32],text:4");
    SyntheticParams P;
    P.heavy_fraction = 0.05;
    P.seed = vt::base_seed();
    const auto S = vlsparse::sim::synthetic_prompt(l, P);
    std::int64_t count = 0, with_neighbour = 0;
    for (std::int64_t u = 0; u < 1024; ++u) {
        const auto i = static_cast<std::size_t>(4 + u);
        if (!S.heavy[i]) continue;
        ++count;
        CHECK(!S.sink[i]);
        const std::int64_t r = u / 32, c = u % 32;
        bool nb = false;
        for (auto [dr, dc] : {std::pair{-1, 0}, std::pair{1, 0}, std::pair{0, -1}, std::pair{0, 1}}) {
            const std::int64_t rr = r + dr, cc = c + dc;
            if (rr >= 0 && rr < 32 && cc >= 0 && cc < 32 && S.heavy[static_cast<std::size_t>(4 + rr * 32 + cc)]) nb = true;
        }
        with_neighbour += nb;
    }
    CHECK(count == std::llround(0.05 * 1024));
    CHECK(with_neighbour >= count * 3 / 4);
    // heavy_patch = 1: scattered single tokens, as many.
    P.heavy_patch = 1;
    const auto S1 = vlsparse::sim::synthetic_prompt(l, P);
    std::int64_t c1 = 0;
    for (auto h : S1.heavy) c1 += h;
    CHECK(c1 == count);
    P.heavy_fraction = 0.0;
    const auto S0 = vlsparse::sim::synthetic_prompt(l, P);
    for (auto h : S0.heavy) CHECK(h == 0);
}

TEST_CASE("synthetic: document heads stay inside their own image", "[sim][generator]") {
    for (std::int64_t d : {64, 128}) {
        const Layout l = Layout::parse(kTwoImages);
        const SyntheticParams P = five_kinds(d);
        INFO("seed " << P.seed << ", d = " << d);
        const auto L = vlsparse::sim::synthetic_layer(l, P, 3);
        const auto rows = image_rows(l);
        const Probs A = attention(L, rows);
        auto outside = [&](std::int64_t i, std::int64_t j) {
            const auto& s = l[l.segment_of(i)];
            return j < s.start;
        };
        const double doc = mean_mass(A, rows, kDocument, outside), diffuse = mean_mass(A, rows, kDiffuse, outside);
        INFO("mass outside the own image: document head " << doc << ", diffuse head " << diffuse);
        CHECK(doc < 0.02);
        CHECK(diffuse > 0.05);
        // Spread over the image, not on one spot: high entropy, unlike a local head.
        CHECK(mean_entropy(A, rows, kDocument) > 0.6);
    }
}

TEST_CASE("synthetic: diffuse heads have high entropy, the others low", "[sim][generator]") {
    for (std::int64_t d : {64, 128}) {
        const Layout l = Layout::parse(kTwoImages);
        const SyntheticParams P = five_kinds(d);
        INFO("seed " << P.seed << ", d = " << d);
        const auto L = vlsparse::sim::synthetic_layer(l, P, 3);
        auto rows = image_rows(l);
        for (auto t : text_rows_after_first_image(l)) rows.push_back(t);
        std::sort(rows.begin(), rows.end());
        const Probs A = attention(L, rows);
        const double diffuse = mean_entropy(A, rows, kDiffuse);
        INFO("normalized entropy: diffuse " << diffuse << ", sink " << mean_entropy(A, rows, kSink) << ", local "
                                            << mean_entropy(A, rows, kLocal) << ", heavy " << mean_entropy(A, rows, kHeavy));
        CHECK(diffuse > 0.8);
        CHECK(mean_entropy(A, rows, kSink) < 0.5);
        CHECK(mean_entropy(A, rows, kLocal) < 0.5);
        CHECK(mean_entropy(A, rows, kHeavy) < 0.5);
    }
}

TEST_CASE("synthetic: consecutive video frames are near duplicates, other videos and seeds are not", "[sim][generator]") {
    const Layout l = Layout::parse("text:10,video:8x64[8x8],text:10,video:8x64[8x8],text:6");
    SyntheticParams P;
    P.head_dim = 64;
    P.n_heads = 4;
    P.n_kv_heads = 2;
    P.seed = vt::base_seed();
    INFO("seed " << P.seed);
    const auto L = vlsparse::sim::synthetic_layer(l, P, 4);
    auto other = P;
    other.seed = P.seed + 1;
    const auto L2 = vlsparse::sim::synthetic_layer(l, other, 4);
    const std::int64_t kv = 64 * P.n_kv_heads * P.head_dim, qw = 64 * P.n_heads * P.head_dim;
    for (const std::int64_t start : {10, 532}) {
        for (std::int64_t f = 1; f < 8; ++f) {
            const std::int64_t a = start + f * 64, b = a - 64;
            INFO("video at " << start << ", frame " << f);
            CHECK(rel_diff(&L.k[static_cast<std::size_t>(a * 2 * 64)], &L.k[static_cast<std::size_t>(b * 2 * 64)],
                           static_cast<std::size_t>(kv)) < 0.3);
            CHECK(rel_diff(&L.v[static_cast<std::size_t>(a * 2 * 64)], &L.v[static_cast<std::size_t>(b * 2 * 64)],
                           static_cast<std::size_t>(kv)) < 0.3);
            CHECK(rel_diff(&L.q[static_cast<std::size_t>(a * 4 * 64)], &L.q[static_cast<std::size_t>(b * 4 * 64)],
                           static_cast<std::size_t>(qw)) < 0.3);
            // The same frame of another seed: unrelated.
            CHECK(rel_diff(&L2.k[static_cast<std::size_t>(a * 2 * 64)], &L.k[static_cast<std::size_t>(a * 2 * 64)],
                           static_cast<std::size_t>(kv)) > 0.8);
            CHECK(rel_diff(&L2.v[static_cast<std::size_t>(a * 2 * 64)], &L.v[static_cast<std::size_t>(a * 2 * 64)],
                           static_cast<std::size_t>(kv)) > 1.0);
            // Heavy hitters keep their slots.
            for (std::int64_t u = 0; u < 64; ++u)
                CHECK(L.heavy[static_cast<std::size_t>(a + u)] == L.heavy[static_cast<std::size_t>(start + u)]);
        }
        // Frame 0 of the two videos: unrelated.
    }
    CHECK(rel_diff(&L.v[static_cast<std::size_t>(532 * 2 * 64)], &L.v[static_cast<std::size_t>(10 * 2 * 64)],
                   static_cast<std::size_t>(kv)) > 1.0);
    CHECK(rel_diff(&L.k[static_cast<std::size_t>(532 * 2 * 64)], &L.k[static_cast<std::size_t>(10 * 2 * 64)],
                   static_cast<std::size_t>(kv)) > 0.8);
    // video_change = 1: frames are fresh draws.
    P.video_change = 1.0;
    const auto L3 = vlsparse::sim::synthetic_layer(l, P, 4);
    CHECK(rel_diff(&L3.v[static_cast<std::size_t>(74 * 2 * 64)], &L3.v[static_cast<std::size_t>(10 * 2 * 64)],
                   static_cast<std::size_t>(kv)) > 1.0);
}

TEST_CASE("synthetic: the head mix follows the layer's diffuse share and the kind shares", "[sim][generator]") {
    SyntheticParams P;
    P.seed = vt::base_seed();
    auto count = [](const std::vector<HeadKind>& k, HeadKind x) { return std::count(k.begin(), k.end(), x); };
    // H = 8. Layer 0: round(0.6 * 8) = 5 diffuse; 3 left: quotas 0.9, 0.75, 0.9, 0.45 -> sink, local, heavy.
    const auto k0 = vlsparse::sim::synthetic_head_kinds(P, 0);
    REQUIRE(k0.size() == 8);
    CHECK(count(k0, HeadKind::diffuse) == 5);
    CHECK(count(k0, HeadKind::sink) == 1);
    CHECK(count(k0, HeadKind::heavy) == 1);
    CHECK(count(k0, HeadKind::local) == 1);
    CHECK(count(k0, HeadKind::document) == 0);
    // Layer 1: round(2.4) = 2 diffuse; 6 left: quotas 1.8, 1.5, 1.8, 0.9 -> 1, 1, 1, 0; the 3 left go to the
    // largest remainders: document 0.9, sink 0.8, local 0.8 (heavy's 0.5 misses).
    const auto k1 = vlsparse::sim::synthetic_head_kinds(P, 1);
    CHECK(count(k1, HeadKind::diffuse) == 2);
    CHECK(count(k1, HeadKind::sink) == 2);
    CHECK(count(k1, HeadKind::heavy) == 1);
    CHECK(count(k1, HeadKind::local) == 2);
    CHECK(count(k1, HeadKind::document) == 1);
    // H = 32, a later layer: round(0.96) = 1 diffuse; 31 left: 9.3, 7.75, 9.3, 4.65 -> 9, 8, 9, 5.
    P.n_heads = 32;
    P.n_kv_heads = 8;
    const auto k5 = vlsparse::sim::synthetic_head_kinds(P, 5);
    CHECK(count(k5, HeadKind::diffuse) == 1);
    CHECK(count(k5, HeadKind::sink) == 9);
    CHECK(count(k5, HeadKind::heavy) == 8);
    CHECK(count(k5, HeadKind::local) == 9);
    CHECK(count(k5, HeadKind::document) == 5);
    // The shuffle differs across layers with the same counts, and is reproducible.
    CHECK(vlsparse::sim::synthetic_head_kinds(P, 5) == k5);
    bool differs = false;
    for (std::int64_t layer = 6; layer < 12; ++layer) differs |= vlsparse::sim::synthetic_head_kinds(P, layer) != k5;
    CHECK(differs);
    // Only document heads.
    P.share_sink = P.share_heavy = P.share_local = 0.0;
    P.diffuse_later = 0.0;
    const auto kd = vlsparse::sim::synthetic_head_kinds(P, 7);
    CHECK(count(kd, HeadKind::document) == 32);
    // The layer reports its kinds; a fixed list overrides the mix.
    P = SyntheticParams{};
    P.head_dim = 16;
    const Layout l = Layout::parse("text:5,image:16[4x4],text:3");
    CHECK(vlsparse::sim::synthetic_layer(l, P, 3).head_kind == vlsparse::sim::synthetic_head_kinds(P, 3));
    P.head_kinds.assign(8, HeadKind::local);
    CHECK(vlsparse::sim::synthetic_layer(l, P, 0).head_kind == P.head_kinds);
    CHECK(vlsparse::sim::parse_head_kind("document") == HeadKind::document);
    for (auto k : vlsparse::sim::kHeadKinds) CHECK(vlsparse::sim::parse_head_kind(vlsparse::sim::to_string(k)) == k);
}

TEST_CASE("synthetic: same seed gives identical bytes, another seed other bytes", "[sim][generator]") {
    const Layout l = Layout::parse("text:7,image:30[5x6],text:2,video:3x9[3x3],text:4");
    SyntheticParams P;
    P.n_heads = 8;
    P.n_kv_heads = 2;
    P.head_dim = 32;
    P.seed = vt::base_seed();
    for (std::int64_t layer : {0, 1, 5}) {
        const auto a = vlsparse::sim::synthetic_layer(l, P, layer), b = vlsparse::sim::synthetic_layer(l, P, layer);
        REQUIRE(a.q.size() == static_cast<std::size_t>(l.n() * 8 * 32));
        REQUIRE(a.k.size() == static_cast<std::size_t>(l.n() * 2 * 32));
        REQUIRE(a.v.size() == a.k.size());
        CHECK(std::memcmp(a.q.data(), b.q.data(), a.q.size() * 4) == 0);
        CHECK(std::memcmp(a.k.data(), b.k.data(), a.k.size() * 4) == 0);
        CHECK(std::memcmp(a.v.data(), b.v.data(), a.v.size() * 4) == 0);
        CHECK(a.heavy == b.heavy);
        CHECK(a.sink == b.sink);
        auto Q = P;
        Q.seed = P.seed + 1;
        const auto c = vlsparse::sim::synthetic_layer(l, Q, layer);
        std::size_t same = 0;
        for (std::size_t i = 0; i < a.v.size(); ++i) same += a.v[i] == c.v[i];
        CHECK(same < a.v.size() / 100);
        same = 0;
        for (std::size_t i = 0; i < a.q.size(); ++i) same += a.q[i] == c.q[i];
        CHECK(same < a.q.size() / 100);
    }
    // Layers differ from each other.
    const auto l3 = vlsparse::sim::synthetic_layer(l, P, 3), l4 = vlsparse::sim::synthetic_layer(l, P, 4);
    CHECK(l3.k != l4.k);
}

TEST_CASE("synthetic: decode rows continue the prompt without changing it", "[sim][generator]") {
    const Layout l = Layout::parse("text:9,image:36[6x6],text:5");
    SyntheticParams P;
    P.head_dim = 16;
    P.n_heads = 4;
    P.n_kv_heads = 2;
    P.seed = vt::base_seed();
    const auto a = vlsparse::sim::synthetic_layer(l, P, 2);
    const auto b = vlsparse::sim::synthetic_layer(l, P, 2, 7);
    CHECK(a.n == 50);
    CHECK(a.n_prompt == 50);
    CHECK(b.n == 57);
    CHECK(b.n_prompt == 50);
    REQUIRE(b.q.size() == static_cast<std::size_t>(57 * 4 * 16));
    CHECK(std::equal(a.q.begin(), a.q.end(), b.q.begin()));
    CHECK(std::equal(a.k.begin(), a.k.end(), b.k.begin()));
    CHECK(std::equal(a.v.begin(), a.v.end(), b.v.begin()));
    for (std::int64_t i = 50; i < 57; ++i) {
        CHECK(!b.sink[static_cast<std::size_t>(i)]);
        CHECK(!b.heavy[static_cast<std::size_t>(i)]);
    }
    // A decode query of a heavy head looks at the heavy hitters like a text query of the prompt.
    P.head_kinds.assign(4, HeadKind::heavy);
    P.head_dim = 64;
    const auto c = vlsparse::sim::synthetic_layer(Layout::parse("text:9,image:400[20x20],text:5"), P, 2, 3);
    const std::vector<std::int64_t> rows{414, 415, 416};
    const Probs A = attention(c, rows);
    for (std::int64_t h = 0; h < 4; ++h)
        CHECK(mean_mass(A, rows, h, [&](std::int64_t, std::int64_t j) { return c.heavy[static_cast<std::size_t>(j)] != 0; }) > 0.9);
}

TEST_CASE("synthetic: bad parameters are rejected with a clear error", "[sim][generator]") {
    const Layout l = Layout::parse("text:4,image:8,text:2");
    auto bad = [&](auto&& edit) {
        SyntheticParams P;
        P.head_dim = 16;
        edit(P);
        return error_of([&] { vlsparse::sim::synthetic_layer(l, P, 1); });
    };
    CHECK_THAT(bad([](SyntheticParams& P) { P.head_dim = 4; }), Contains("head_dim = 4, expected >= 8"));
    CHECK_THAT(bad([](SyntheticParams& P) { P.n_kv_heads = 3; }), Contains("expected H % H_kv == 0"));
    CHECK_THAT(bad([](SyntheticParams& P) { P.sink = -1.0; }), Contains("sink = -1"));
    CHECK_THAT(bad([](SyntheticParams& P) { P.noise = std::nan(""); }), Contains("noise = nan"));
    CHECK_THAT(bad([](SyntheticParams& P) { P.heavy_fraction = 1.5; }), Contains("heavy_fraction = 1.5"));
    CHECK_THAT(bad([](SyntheticParams& P) { P.video_change = -0.1; }), Contains("video_change"));
    CHECK_THAT(bad([](SyntheticParams& P) { P.minor_weight = 2.0; }), Contains("minor_weight"));
    CHECK_THAT(bad([](SyntheticParams& P) { P.local_radius = 0.0; }), Contains("local_radius = 0"));
    CHECK_THAT(bad([](SyntheticParams& P) { P.heavy_patch = 0; }), Contains("heavy_patch = 0"));
    CHECK_THAT(bad([](SyntheticParams& P) { P.image_sinks = -2; }), Contains("image_sinks = -2"));
    CHECK_THAT(bad([](SyntheticParams& P) { P.diffuse_layer1 = 1.2; }), Contains("diffuse_layer1"));
    CHECK_THAT(bad([](SyntheticParams& P) { P.share_sink = P.share_heavy = P.share_local = P.share_document = 0; }),
               Contains("all 0"));
    CHECK_THAT(bad([](SyntheticParams& P) { P.head_kinds.assign(3, HeadKind::sink); }),
               Contains("head_kinds has 3 entries"));
    CHECK_THAT(bad([](SyntheticParams& P) { P.version = 3; }), Contains("version = 3"));
    CHECK_THAT(error_of([&] { vlsparse::sim::synthetic_layer(l, SyntheticParams{}, -1); }), Contains("layer = -1"));
    CHECK_THAT(error_of([&] { vlsparse::sim::synthetic_layer(l, SyntheticParams{}, 0, -2); }),
               Contains("decode_tokens = -2"));
    SyntheticParams v1;
    v1.version = 1;
    CHECK_THAT(error_of([&] { vlsparse::sim::synthetic_layer(l, v1, 0, 2); }), Contains("version 1 generates prompts only"));
    CHECK_THAT(error_of([] { vlsparse::sim::parse_head_kind("sinky"); }), Contains("unknown head kind 'sinky'"));
    // Every failure names the function.
    CHECK_THAT(bad([](SyntheticParams& P) { P.head_dim = 4; }), Contains("sim::synthetic_layer"));
}

TEST_CASE("synthetic: strengths and scales that would overflow the fp32 Q/K are rejected (issue 21)",
          "[sim][generator][issue21]") {
    // noise 1e308 used to pass the check (finite, >= 0) and give inf in Q and K; local_radius 1e-300
    // gives locality frequencies of 1e300 and NaN features.
    const Layout l = Layout::parse("text:4,image:8,text:2");
    auto bad = [&](auto&& edit) {
        SyntheticParams P;
        P.head_dim = 16;
        edit(P);
        return error_of([&] { vlsparse::sim::synthetic_layer(l, P, 1); });
    };
    CHECK_THAT(bad([](SyntheticParams& P) { P.noise = 1e308; }), Contains("noise = 1e+308, expected at most 1e+06"));
    CHECK_THAT(bad([](SyntheticParams& P) { P.sink = 2e6; }), Contains("sink = 2e+06, expected at most 1e+06"));
    CHECK_THAT(bad([](SyntheticParams& P) { P.video_time_scale = 1e300; }), Contains("video_time_scale = 1e+300"));
    CHECK_THAT(bad([](SyntheticParams& P) { P.share_local = 1e300; }), Contains("share_local = 1e+300"));
    CHECK_THAT(bad([](SyntheticParams& P) { P.local_radius = 1e-300; }),
               Contains("local_radius = 1e-300, expected 1e-06 <= local_radius <= 1e+06"));
    // At the limits every value of Q, K and V is finite.
    SyntheticParams P;
    P.head_dim = 16;
    P.noise = P.sink = P.heavy = P.local = P.document = P.text_focus = 1e6;
    P.local_radius = 1e-6;
    const auto L = vlsparse::sim::synthetic_layer(l, P, 1);
    for (const auto* x : {&L.q, &L.k, &L.v})
        for (float e : *x) REQUIRE(std::isfinite(e));
}

TEST_CASE("synthetic: version 1 reproduces the inputs of the committed golden files", "[sim][generator][golden]") {
    // golden/zipvl cases made by reference/golden_zipvl.cpp with the generator of vlsparse <= 0.1
    // (default SyntheticParams, seed 1), stored in fp32.
    namespace fs = std::filesystem;
    const char* env = std::getenv("VLSPARSE_GOLDEN_DIR");
    const fs::path root = env ? fs::path(env) : fs::path(VLSPARSE_SOURCE_DIR) / "golden";
    struct Case {
        const char* name;
        const char* layout;
        std::int64_t H, Hkv, d, layer;
    };
    for (const Case& c : {Case{"mha_fp32_layer", "text:12,image:100,text:8", 4, 4, 32, 2},
                          Case{"dense_layer", "text:8,image:24,text:8", 2, 2, 16, 0}}) {
        INFO(c.name);
        const fs::path dir = root / "zipvl" / c.name;
        REQUIRE(fs::exists(dir / "q.npy"));
        SyntheticParams P;
        P.version = 1;
        P.n_heads = c.H;
        P.n_kv_heads = c.Hkv;
        P.head_dim = c.d;
        const auto L = vlsparse::sim::synthetic_layer(Layout::parse(c.layout), P, c.layer);
        CHECK(vlsparse::read_npy(dir / "q.npy").to_vector<float>() == L.q);
        CHECK(vlsparse::read_npy(dir / "k.npy").to_vector<float>() == L.k);
        CHECK(vlsparse::read_npy(dir / "v.npy").to_vector<float>() == L.v);
    }
}
