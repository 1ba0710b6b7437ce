// ZipVL's ablations and matched-cost modes (issue 17): eviction-only (dense prefill), fixed ratio,
// accumulated-score ranking. Each option must equal its hand-built equivalent, on the reference and
// on the SIMD path: the same selection machinery with the one step replaced by hand.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>

#include <nlohmann/json.hpp>

#include <vlsparse/io/params_json.hpp>
#include <vlsparse/policies/policy.hpp>
#include <vlsparse/policies/zipvl.hpp>
#include <vlsparse/reference/zipvl.hpp>

#include "test_util.hpp"

using namespace vlsparse;

namespace {

using vt::Qkv;

// Random Q/K/V with a shared direction on every 13th key (peaked attention, so p < n).
Qkv<float> make_peaked(std::int64_t n, std::int64_t H, std::int64_t Hkv, std::int64_t d, std::uint64_t seed) {
    Qkv<float> r{n, H, Hkv, d, {}, {}, {}};
    r.q = vt::random_buffer<float>(static_cast<std::size_t>(n * H * d), seed, 1.0f);
    r.k = vt::random_buffer<float>(static_cast<std::size_t>(n * Hkv * d), seed + 1, 1.0f);
    r.v = vt::random_buffer<float>(static_cast<std::size_t>(n * Hkv * d), seed + 2, 1.0f);
    auto u = vt::random_buffer<float>(static_cast<std::size_t>(d), seed + 3, 1.0f);
    for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t c = 0; c < d; ++c) {
            for (std::int64_t h = 0; h < H; ++h) r.q[static_cast<std::size_t>((i * H + h) * d + c)] += 1.5f * u[c];
            if (i % 13 == 0)
                for (std::int64_t g = 0; g < Hkv; ++g) r.k[static_cast<std::size_t>((i * Hkv + g) * d + c)] += 3.0f * u[c];
        }
    return r;
}

// The hand-built top-p: positions ordered by score descending, ties by lower position, the first p,
// sorted ascending.
std::vector<std::int64_t> hand_topk(const std::vector<double>& s, std::int64_t p) {
    std::vector<std::int64_t> idx(s.size());
    std::iota(idx.begin(), idx.end(), std::int64_t{0});
    std::stable_sort(idx.begin(), idx.end(), [&](std::int64_t a, std::int64_t b) { return s[a] > s[b]; });
    idx.resize(static_cast<std::size_t>(p));
    std::sort(idx.begin(), idx.end());
    return idx;
}

template <class Select>
void check_ablations(Select select, const char* path) {
    INFO("path " << path);
    const std::int64_t n = 150, H = 4, Hkv = 2, d = 32;
    const auto in = make_peaked(n, H, Hkv, d, vt::base_seed() + 170);
    const Layout layout = Layout::parse("text:10,image:130,text:10");
    for (const auto grouping : {ZipVLGrouping::layer, ZipVLGrouping::kv_head}) {
        ZipVLParams P;
        P.tau = 0.6;
        P.probe_recent = 16;
        P.probe_random = 16;
        P.grouping = grouping;
        INFO("grouping " << to_string(grouping));
        const ZipVLSelection base = select(in, layout, P);
        REQUIRE(base.groups() >= 1);
        for (std::int64_t g = 0; g < base.groups(); ++g) REQUIRE(base.p[g] < n);  // a real selection

        // Eviction-only: the selection is the paper's (prefill changes nothing in it).
        {
            ZipVLParams E = P;
            E.prefill = ZipVLPrefill::dense;
            const ZipVLSelection s = select(in, layout, E);
            REQUIRE(s.selection.indices == base.selection.indices);
            REQUIRE(s.p == base.p);
            REQUIRE_FALSE(zipvl_sparse_prefill(s, E));
            REQUIRE(zipvl_sparse_prefill(base, P));
        }
        // Fixed ratio: p = ceil(r n) in every group, kept = hand top-p of the same normalized scores.
        for (const double r : {0.1, 0.3, 0.5, 1.0}) {
            ZipVLParams F = P;
            F.ratio = ZipVLRatio::fixed;
            F.fixed_ratio = r;
            INFO("fixed_ratio " << r);
            const ZipVLSelection s = select(in, layout, F);
            const auto want_p = static_cast<std::int64_t>(std::ceil(r * static_cast<double>(n) - 1e-9));
            REQUIRE(zipvl_fixed_count(n, r) == want_p);
            REQUIRE(s.accumulated == base.accumulated);
            REQUIRE(s.normalized == base.normalized);
            for (std::int64_t g = 0; g < s.groups(); ++g) {
                REQUIRE(s.p[g] == want_p);
                REQUIRE(s.selection.indices[g] == hand_topk(base.normalized[g], want_p));
            }
        }
        // Accumulated ranking: the same adaptive p, kept = hand top-p of the accumulated scores.
        {
            ZipVLParams A = P;
            A.ranking = ZipVLRanking::accumulated;
            const ZipVLSelection s = select(in, layout, A);
            REQUIRE(s.p == base.p);
            bool differs = false;
            for (std::int64_t g = 0; g < s.groups(); ++g) {
                REQUIRE(s.selection.indices[g] == hand_topk(base.accumulated[g], base.p[g]));
                REQUIRE(s.selection.scores[g] == base.accumulated[g]);
                differs |= s.selection.indices[g] != base.selection.indices[g];
            }
            REQUIRE(differs);  // the ablation changes the kept set on this input
        }
        // Fixed ratio and accumulated ranking together.
        {
            ZipVLParams B = P;
            B.ratio = ZipVLRatio::fixed;
            B.fixed_ratio = 0.25;
            B.ranking = ZipVLRanking::accumulated;
            const ZipVLSelection s = select(in, layout, B);
            for (std::int64_t g = 0; g < s.groups(); ++g)
                REQUIRE(s.selection.indices[g] == hand_topk(base.accumulated[g], zipvl_fixed_count(n, 0.25)));
        }
    }
}

}  // namespace

TEST_CASE("zipvl ablations: each option equals its hand-built equivalent (reference)", "[zipvl][ablation]") {
    check_ablations(
        [](const Qkv<float>& in, const Layout& layout, const ZipVLParams& P) {
            return reference::zipvl_select(in.qv(), in.kv(), layout, 0, P);
        },
        "reference");
}

TEST_CASE("zipvl ablations: each option equals its hand-built equivalent (simd)", "[zipvl][ablation]") {
    check_ablations(
        [](const Qkv<float>& in, const Layout& layout, const ZipVLParams& P) {
            return simd::zipvl_select(in.qv(), in.kv(), layout, 0, P);
        },
        "simd");
}

TEST_CASE("zipvl ablations: eviction-only prefill is dense attention, eviction unchanged", "[zipvl][ablation]") {
    const std::int64_t n = 120, H = 4, Hkv = 2, d = 32;
    const auto in = make_peaked(n, H, Hkv, d, vt::base_seed() + 171);
    const Layout layout = Layout::text_only(n);
    ZipVLParams P;
    P.tau = 0.6;
    ZipVLParams E = P;
    E.prefill = ZipVLPrefill::dense;
    const std::size_t m = static_cast<std::size_t>(n * H * d);
    std::vector<float> got(m), dense(m), sparse(m);
    // Reference.
    {
        const auto s = reference::zipvl_select(in.qv(), in.kv(), layout, 0, E);
        reference::zipvl_prefill(in.qv(), in.kv(), in.vv(), s, View3<float>(got.data(), {n, H, d}), E);
        reference::dense_attention(in.qv(), in.kv(), in.vv(), View3<float>(dense.data(), {n, H, d}), E.attention());
        REQUIRE(got == dense);
        reference::zipvl_prefill(in.qv(), in.kv(), in.vv(), s, View3<float>(sparse.data(), {n, H, d}), P);
        REQUIRE(sparse != dense);  // the paper's mode on the same selection is token-sparse
    }
    // SIMD, and the engine's adapter: same kept set as the paper's mode, but a dense prefill.
    {
        const auto s = simd::zipvl_select(in.qv(), in.kv(), layout, 0, E);
        simd::zipvl_prefill(in.qv(), in.kv(), in.vv(), s, View3<float>(got.data(), {n, H, d}), E);
        simd::dense_attention(in.qv(), in.kv(), in.vv(), View3<float>(dense.data(), {n, H, d}), E.attention());
        REQUIRE(got == dense);
        KvCache<float> ce(Hkv, d), cp(Hkv, d);
        simd::zipvl_prefill_layer(in.qv(), in.kv(), in.vv(), layout, 0, E, View3<float>(got.data(), {n, H, d}), ce);
        simd::zipvl_prefill_layer(in.qv(), in.kv(), in.vv(), layout, 0, P, View3<float>(sparse.data(), {n, H, d}), cp);
        REQUIRE(got == dense);
        for (std::int64_t g = 0; g < Hkv; ++g) {
            const auto a = ce.positions(g), b = cp.positions(g);
            REQUIRE(std::vector<std::int64_t>(a.begin(), a.end()) == std::vector<std::int64_t>(b.begin(), b.end()));
            REQUIRE(static_cast<std::int64_t>(a.size()) < n);
        }
    }
}

TEST_CASE("zipvl ablations: JSON keys, bad values rejected", "[zipvl][ablation][io]") {
    // to_json writes every key, the ablation keys too (one format: manifests, scenarios, Python).
    const auto all = to_json(ZipVLParams{});
    REQUIRE(all.at("prefill") == "sparse");
    REQUIRE(all.at("ratio") == "adaptive");
    REQUIRE(all.at("ranking") == "normalized");
    REQUIRE(all.at("fixed_ratio") == 0.5);
    REQUIRE(zipvl_params_from_json(all).prefill == ZipVLPrefill::sparse);

    ZipVLParams P;
    P.prefill = ZipVLPrefill::dense;
    P.ratio = ZipVLRatio::fixed;
    P.fixed_ratio = 0.2;
    P.ranking = ZipVLRanking::accumulated;
    const auto j = to_json(P);
    REQUIRE(j.at("prefill") == "dense");
    const ZipVLParams R = zipvl_params_from_json(j);
    REQUIRE(R.prefill == ZipVLPrefill::dense);
    REQUIRE(R.ratio == ZipVLRatio::fixed);
    REQUIRE(R.fixed_ratio == 0.2);
    REQUIRE(R.ranking == ZipVLRanking::accumulated);
    REQUIRE(to_json(R) == j);

    REQUIRE_THROWS_WITH(zipvl_params_from_json(nlohmann::json{{"fixed_ratio", 0.0}}),
                        Catch::Contains("expected 0 < fixed_ratio <= 1"));
    REQUIRE_THROWS_WITH(zipvl_params_from_json(nlohmann::json{{"ratio", "sometimes"}}),
                        Catch::Contains("expected one of adaptive, fixed"));
    REQUIRE_THROWS_WITH(zipvl_params_from_json(nlohmann::json{{"ranking", 1}}), Catch::Contains("expected a string"));
}

TEST_CASE("zipvl ablations: the engine adapter reports a dense prefill in eviction-only mode", "[zipvl][ablation]") {
    const std::int64_t n = 96, H = 4, Hkv = 2, d = 32;
    const auto in = make_peaked(n, H, Hkv, d, vt::base_seed() + 172);
    const Layout layout = Layout::text_only(n);
    const ModelShape shape{2, H, Hkv, d};
    std::vector<std::int64_t> pos(static_cast<std::size_t>(n));
    std::iota(pos.begin(), pos.end(), std::int64_t{0});
    ZipVLParams P;
    P.tau = 0.6;
    ZipVLParams E = P;
    E.prefill = ZipVLPrefill::dense;
    ZipVLPolicy paper(P), evict(E);
    paper.begin(layout, shape);
    evict.begin(layout, shape);
    const PrefillLayer layer{&layout, shape, 0, in.qv(), in.kv(), in.vv(), pos};
    const auto dp = paper.prefill(layer);
    const auto de = evict.prefill(layer);
    REQUIRE(dp.sparse_prefill);
    REQUIRE_FALSE(de.sparse_prefill);
    REQUIRE(de.kv.indices == dp.kv.indices);
}
