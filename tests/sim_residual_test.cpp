// Tests of the residual-stream model (sim/include/vlsparse/sim/residual.hpp): shapes, determinism,
// bad input, structured attention through depth, and a dense prefill + decode computed two ways
// (full recompute of every step vs an incremental KV cache) giving the same tokens, bit for bit.
#include <vlsparse/sim/residual.hpp>  // first: the header compiles on its own

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include <vlsparse/kv/kv_cache.hpp>
#include <vlsparse/reference/attention.hpp>

#include "test_util.hpp"
#include "error_of.hpp"

using Catch::Matchers::Contains;
using vlsparse::Layout;
using vlsparse::View2;
using vlsparse::View3;
using vlsparse::sim::HeadKind;
using vlsparse::sim::ModelShape;
using vlsparse::sim::ResidualModel;
using vlsparse::sim::ResidualParams;

namespace {

using vt::error_of;

std::vector<std::int64_t> iota(std::int64_t n, std::int64_t from = 0) {
    std::vector<std::int64_t> p(static_cast<std::size_t>(n));
    std::iota(p.begin(), p.end(), from);
    return p;
}

// One dense causal layer over all rows of x [len, hidden] (positions 0..len-1), in place; returns the
// attention probabilities of the listed rows [H, rows, len] when asked.
void dense_layer(const ResidualModel& M, std::int64_t layer, std::vector<float>& x, std::vector<double>* probs = nullptr,
                 const std::vector<std::int64_t>& rows = {}) {
    const auto& s = M.shape();
    const std::int64_t len = static_cast<std::int64_t>(x.size()) / M.hidden_size();
    std::vector<float> q, k, v, out(static_cast<std::size_t>(len * s.heads * s.head_dim));
    M.project(layer, x, iota(len), q, k, v);
    const View3<const float> Q(q.data(), {len, s.heads, s.head_dim}), K(k.data(), {len, s.kv_heads, s.head_dim}),
        V(v.data(), {len, s.kv_heads, s.head_dim});
    vlsparse::reference::dense_attention(Q, K, V, View3<float>(out.data(), {len, s.heads, s.head_dim}));
    if (probs) {
        probs->assign(static_cast<std::size_t>(s.heads * static_cast<std::int64_t>(rows.size()) * len), 0.0);
        vlsparse::reference::probe_attention(Q, K, rows,
                                             View3<double>(probs->data(), {s.heads, static_cast<std::int64_t>(rows.size()), len}));
    }
    M.update(layer, x, out);
}

double content_rms(const ResidualModel& M, const std::vector<float>& x) {
    const std::int64_t D = M.hidden_size(), n = static_cast<std::int64_t>(x.size()) / D;
    double ss = 0.0;
    for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t e = M.structure_size(); e < D; ++e) ss += static_cast<double>(x[static_cast<std::size_t>(i * D + e)]) * x[static_cast<std::size_t>(i * D + e)];
    return std::sqrt(ss / static_cast<double>(n * M.content_size()));
}

}  // namespace

TEST_CASE("residual: shapes of every output", "[sim][residual]") {
    const ModelShape shape{3, 8, 2, 32};
    ResidualParams p;
    p.seed = vt::base_seed();
    const ResidualModel M(shape, p);
    const Layout l = Layout::parse("text:5,image:16[4x4],text:3");
    CHECK(M.hidden_size() == 256);
    CHECK(M.vocab() == 512);
    CHECK(M.structure_size() + M.content_size() == 256);
    const auto x = M.embed_prompt(l);
    CHECK(x.size() == static_cast<std::size_t>(24 * 256));
    CHECK(M.embed_token(7, 24).size() == 256u);
    std::vector<float> q, k, v;
    M.project(1, x, iota(24), q, k, v);
    CHECK(q.size() == static_cast<std::size_t>(24 * 8 * 32));
    CHECK(k.size() == static_cast<std::size_t>(24 * 2 * 32));
    CHECK(v.size() == k.size());
    const auto one = M.embed_token(3, 30);
    M.project(2, one, std::vector<std::int64_t>{30}, q, k, v);
    CHECK(q.size() == static_cast<std::size_t>(8 * 32));
    CHECK(M.logits(one).size() == 512u);
    const auto t = M.lm_head(one);
    CHECK(t >= 0);
    CHECK(t < 512);
    CHECK(M.head_kinds(0).size() == 8u);
    const auto toks = M.prompt_tokens(l);
    REQUIRE(toks.size() == 24u);
    for (std::int64_t i = 0; i < 24; ++i) CHECK((toks[static_cast<std::size_t>(i)] >= 0) == l.is_text(i));
}

TEST_CASE("residual: same seed same bytes, another seed other bytes", "[sim][residual]") {
    const ModelShape shape{2, 4, 4, 16};
    ResidualParams p;
    p.hidden = 96;
    p.vocab = 64;
    p.seed = vt::base_seed();
    const Layout l = Layout::parse("text:4,video:3x9[3x3],text:4");
    const ResidualModel A(shape, p), B(shape, p);
    auto xa = A.embed_prompt(l), xb = B.embed_prompt(l);
    REQUIRE(xa.size() == xb.size());
    CHECK(std::memcmp(xa.data(), xb.data(), xa.size() * 4) == 0);
    std::vector<float> qa, ka, va, qb, kb, vb;
    A.project(1, xa, iota(l.n()), qa, ka, va);
    B.project(1, xb, iota(l.n()), qb, kb, vb);
    CHECK(qa == qb);
    CHECK(ka == kb);
    CHECK(va == vb);
    dense_layer(A, 0, xa);
    dense_layer(B, 0, xb);
    CHECK(xa == xb);
    CHECK(A.lm_head(std::span<const float>(xa).last(96)) == B.lm_head(std::span<const float>(xb).last(96)));

    auto p2 = p;
    p2.seed = p.seed + 1;
    const ResidualModel C(shape, p2);
    const auto xc = C.embed_prompt(l);
    std::vector<float> qc, kc, vc;
    C.project(1, xc, iota(l.n()), qc, kc, vc);
    std::size_t same = 0;
    for (std::size_t i = 0; i < va.size(); ++i) same += va[i] == vc[i];
    CHECK(same < va.size() / 100);
    // Near-duplicate video frames: the content of frame 2 is close to frame 1's.
    const auto x0 = A.embed_prompt(l);
    const std::int64_t D = 96, S = A.structure_size();
    double num = 0.0, den = 0.0;
    for (std::int64_t u = 0; u < 9; ++u)
        for (std::int64_t e = S; e < D; ++e) {
            const double a = x0[static_cast<std::size_t>((4 + 18 + u) * D + e)], b = x0[static_cast<std::size_t>((4 + 9 + u) * D + e)];
            num += (a - b) * (a - b);
            den += b * b;
        }
    CHECK(std::sqrt(num / den) < 0.3);
}

TEST_CASE("residual: bad input is rejected with a clear error", "[sim][residual]") {
    const ModelShape shape{2, 4, 2, 16};
    ResidualParams p;
    p.hidden = 96;
    const ResidualModel M(shape, p);
    const auto x = M.embed_prompt(Layout::parse("text:3,image:4,text:1"));  // 8 rows
    std::vector<float> q, k, v;
    CHECK_THAT(error_of([&] { M.project(2, x, iota(8), q, k, v); }), Contains("layer = 2, expected 0 <= layer < 2"));
    CHECK_THAT(error_of([&] { M.project(-1, x, iota(8), q, k, v); }), Contains("layer = -1"));
    CHECK_THAT(error_of([&] { M.project(0, std::span<const float>(x).first(100), iota(1), q, k, v); }),
               Contains("hidden has 100 values, expected a positive multiple of hidden = 96"));
    CHECK_THAT(error_of([&] { M.project(0, std::span<const float>(), iota(0), q, k, v); }), Contains("hidden has 0 values"));
    CHECK_THAT(error_of([&] { M.project(0, x, iota(7), q, k, v); }), Contains("positions has 7 entries, expected one per hidden row (8)"));
    CHECK_THAT(error_of([&] { M.project(0, x, iota(8, -1), q, k, v); }), Contains("positions[0] = -1"));
    auto bad = x;
    bad[100] = std::nanf("");
    CHECK_THAT(error_of([&] { M.project(0, bad, iota(8), q, k, v); }), Contains("hidden[1, 4] = nan"));
    auto h = x;
    std::vector<float> out(static_cast<std::size_t>(8 * 4 * 16), 0.5f);
    CHECK_THAT(error_of([&] { M.update(5, h, out); }), Contains("sim::ResidualModel::update: layer = 5"));
    CHECK_THAT(error_of([&] { M.update(0, h, std::span<const float>(out).first(100)); }),
               Contains("attn_out has 100 values, expected m * H * d = 8 * 4 * 16 = 512"));
    out[3] = INFINITY;
    CHECK_THAT(error_of([&] { M.update(0, h, out); }), Contains("attn_out[3] = inf"));
    CHECK(h == x);  // a rejected update leaves the hidden state alone
    CHECK_THAT(error_of([&] { M.embed_token(96 * 100, 3); }), Contains("token = 9600, expected 0 <= token < vocab = 512"));
    CHECK_THAT(error_of([&] { M.embed_token(-1, 3); }), Contains("token = -1"));
    CHECK_THAT(error_of([&] { M.embed_token(1, -3); }), Contains("position = -3"));
    CHECK_THAT(error_of([&] { M.lm_head(std::span<const float>(x).first(95)); }), Contains("hidden_row has 95 values, expected hidden = 96"));
    CHECK_THAT(error_of([&] { M.head_kinds(2); }), Contains("layer = 2"));
    // Construction.
    CHECK_THAT(error_of([&] { ResidualModel(ModelShape{2, 4, 3, 16}, p); }), Contains("not a multiple of kv_heads"));
    CHECK_THAT(error_of([&] { ResidualModel(ModelShape{0, 4, 2, 16}, p); }), Contains("layers = 0"));
    CHECK_THAT(error_of([&] { ResidualModel(ModelShape{2, 4, 2, 4}, p); }), Contains("head_dim = 4, expected >= 8"));
    auto small = p;
    small.hidden = 30;
    CHECK_THAT(error_of([&] { ResidualModel(shape, small); }), Contains("hidden = 30 leaves 12 content values"));
    auto v1 = p;
    v1.vocab = 1;
    CHECK_THAT(error_of([&] { ResidualModel(shape, v1); }), Contains("vocab = 1"));
    auto nan_scale = p;
    nan_scale.residual_scale = std::nan("");
    CHECK_THAT(error_of([&] { ResidualModel(shape, nan_scale); }), Contains("residual_scale = nan"));
    auto old = p;
    old.structure.version = 1;
    CHECK_THAT(error_of([&] { ResidualModel(shape, old); }), Contains("structure.version = 1, expected 2"));
    auto strength = p;
    strength.structure.sink = -2;
    CHECK_THAT(error_of([&] { ResidualModel(shape, strength); }), Contains("sink = -2"));
}

TEST_CASE("residual: attention stays structured and the hidden state bounded through depth", "[sim][residual]") {
    // Sanitizer builds (VLSPARSE_TEST_SMALL): 4 layers, not 8 (8 took 76 s under ASan + UBSan at -O0, half
    // of the whole sim test; every layer is checked alike).
    const std::int64_t layers = vt::small_run() ? 4 : 8;
    const ModelShape shape{layers, 4, 4, 64};
    ResidualParams p;
    p.seed = vt::base_seed();
    p.structure.head_kinds = {HeadKind::sink, HeadKind::heavy, HeadKind::local, HeadKind::diffuse};
    p.structure.minor_weight = 0.0;  // pure kinds: the diffuse head has no planted pattern at all
    INFO("seed " << p.seed);
    const ResidualModel M(shape, p);
    const Layout l = Layout::parse("text:12,image:400[20x20],text:16");
    const auto S = vlsparse::sim::synthetic_prompt(l, M.structure());
    auto x = M.embed_prompt(l);
    const double rms0 = content_rms(M, x);
    std::vector<std::int64_t> rows;
    for (std::int64_t i = 212; i < 428; i += 3) rows.push_back(i);  // second half of the image and the text after it
    std::vector<double> A;
    for (std::int64_t layer = 0; layer < layers; ++layer) {
        dense_layer(M, layer, x, &A, rows);
        const auto R = static_cast<std::int64_t>(rows.size()), n = l.n();
        double sink = 0.0, heavy_text = 0.0, diffuse_sink = 0.0, near = 0.0;
        std::int64_t text_rows = 0, image_rows = 0;
        for (std::int64_t r = 0; r < R; ++r) {
            const std::int64_t i = rows[static_cast<std::size_t>(r)];
            auto P = [&](std::int64_t h, std::int64_t j) { return A[static_cast<std::size_t>((h * R + r) * n + j)]; };
            for (std::int64_t j = 0; j <= i; ++j) {
                if (S.sink[static_cast<std::size_t>(j)]) {
                    sink += P(0, j);
                    diffuse_sink += P(3, j);
                }
                if (!S.visual[static_cast<std::size_t>(i)] && S.heavy[static_cast<std::size_t>(j)]) heavy_text += P(1, j);
                if (S.visual[static_cast<std::size_t>(i)] && j >= 12) {
                    const std::int64_t ui = i - 12, uj = j - 12;
                    if (std::abs(ui / 20 - uj / 20) <= 2 && std::abs(ui % 20 - uj % 20) <= 2) near += P(2, j);
                }
            }
            (S.visual[static_cast<std::size_t>(i)] ? image_rows : text_rows) += 1;
        }
        INFO("layer " << layer << ": sink head on sinks " << sink / R << ", heavy head's text queries on heavy hitters "
                      << heavy_text / text_rows << ", local head near " << near / image_rows << ", diffuse head on sinks "
                      << diffuse_sink / R << ", content rms " << content_rms(M, x));
        CHECK(sink / R > 0.9);
        CHECK(heavy_text / text_rows > 0.8);
        CHECK(near / image_rows > 0.5);
        CHECK(diffuse_sink / R < 0.1);  // no focus appears from the residual stream itself
    }
    // Bounded: the content grows by at most O(1) per layer and the projections see it normalized.
    CHECK(content_rms(M, x) < rms0 * std::sqrt(1.0 + layers));
    std::vector<float> q, k, v;
    M.project(layers - 1, x, iota(l.n()), q, k, v);
    double qmax = 0.0;
    for (float e : q) qmax = std::max(qmax, static_cast<double>(std::abs(e)));
    CHECK(qmax < 50.0);
}

TEST_CASE("residual: a change in one layer's attention reaches the later layers", "[sim][residual]") {
    const ModelShape shape{4, 4, 2, 32};
    ResidualParams p;
    p.seed = vt::base_seed();
    const ResidualModel M(shape, p);
    const Layout l = Layout::parse("text:8,image:64[8x8],text:8");
    auto dense = M.embed_prompt(l), changed = dense;
    dense_layer(M, 0, dense);
    // Layer 0 of the other run: the last token's attention output is zeroed (as a policy that drops it).
    {
        std::vector<float> q, k, v, out(static_cast<std::size_t>(80 * 4 * 32));
        M.project(0, changed, iota(80), q, k, v);
        vlsparse::reference::dense_attention(View3<const float>(q.data(), {80, 4, 32}), View3<const float>(k.data(), {80, 2, 32}),
                                             View3<const float>(v.data(), {80, 2, 32}), View3<float>(out.data(), {80, 4, 32}));
        std::fill(out.begin() + 40 * 128, out.begin() + 41 * 128, 0.0f);  // row 40
        M.update(0, changed, out);
    }
    for (std::int64_t layer = 1; layer < 4; ++layer) {
        dense_layer(M, layer, dense);
        dense_layer(M, layer, changed);
    }
    // Rows before 40 are untouched (causality); row 40 and the later rows differ.
    const std::int64_t D = M.hidden_size();
    CHECK(std::equal(dense.begin(), dense.begin() + 40 * D, changed.begin()));
    CHECK(!std::equal(dense.begin() + 40 * D, dense.begin() + 41 * D, changed.begin() + 40 * D));
    CHECK(!std::equal(dense.end() - D, dense.end(), changed.end() - D));
}

TEST_CASE("residual: dense prefill + decode, full recompute == incremental KV cache", "[sim][residual]") {
    for (const auto& [shape, spec] : {std::pair{ModelShape{3, 4, 2, 32}, "text:6,image:36[6x6],text:4"},
                                      std::pair{ModelShape{2, 8, 1, 16}, "text:3,text:1,video:3x16[4x4],text:1,text:5"}}) {
        ResidualParams p;
        p.hidden = 128;
        p.vocab = 97;
        p.seed = vt::base_seed();
        INFO("seed " << p.seed << ", layout " << spec);
        const ResidualModel M(shape, p);
        const Layout l = Layout::parse(spec);
        const std::int64_t n = l.n(), D = M.hidden_size(), H = shape.heads, Hkv = shape.kv_heads, d = shape.head_dim;
        const int steps = 6;

        // (a) Incremental: prefill once into per-layer caches, then one row per step.
        std::vector<std::int64_t> inc;
        std::vector<float> inc_last;
        {
            auto x = M.embed_prompt(l);
            std::vector<vlsparse::KvCache<float>> cache;
            for (std::int64_t layer = 0; layer < shape.layers; ++layer) {
                std::vector<float> q, k, v, out(static_cast<std::size_t>(n * H * d));
                M.project(layer, x, iota(n), q, k, v);
                cache.emplace_back(Hkv, d);
                cache.back().assign(View3<const float>(k.data(), {n, Hkv, d}), View3<const float>(v.data(), {n, Hkv, d}));
                vlsparse::reference::dense_attention(View3<const float>(q.data(), {n, H, d}), View3<const float>(k.data(), {n, Hkv, d}),
                                                     View3<const float>(v.data(), {n, Hkv, d}), View3<float>(out.data(), {n, H, d}));
                M.update(layer, x, out);
            }
            inc.push_back(M.lm_head(std::span<const float>(x).last(static_cast<std::size_t>(D))));
            for (int s = 0; s < steps; ++s) {
                const std::int64_t pos = n + s;
                auto row = M.embed_token(inc.back(), pos);
                for (std::int64_t layer = 0; layer < shape.layers; ++layer) {
                    std::vector<float> q, k, v, out(static_cast<std::size_t>(H * d));
                    M.project(layer, row, std::vector<std::int64_t>{pos}, q, k, v);
                    auto& c = cache[static_cast<std::size_t>(layer)];
                    c.append(View2<const float>(k.data(), {Hkv, d}), View2<const float>(v.data(), {Hkv, d}));
                    vlsparse::reference::decode_attention(View2<const float>(q.data(), {H, d}), c, View2<float>(out.data(), {H, d}));
                    M.update(layer, row, out);
                }
                inc.push_back(M.lm_head(row));
                inc_last = row;
            }
        }
        // (b) Full recompute: every step runs the whole sequence (prompt + tokens so far) again.
        std::vector<std::int64_t> full;
        std::vector<float> full_last;
        {
            std::vector<float> seq = M.embed_prompt(l);
            for (int s = 0; s <= steps; ++s) {
                auto x = seq;
                for (std::int64_t layer = 0; layer < shape.layers; ++layer) dense_layer(M, layer, x);
                full_last.assign(x.end() - D, x.end());
                full.push_back(M.lm_head(full_last));
                const auto e = M.embed_token(full.back(), n + s);
                seq.insert(seq.end(), e.begin(), e.end());
            }
        }
        CHECK(full == inc);
        CHECK(full_last == inc_last);
    }
}
