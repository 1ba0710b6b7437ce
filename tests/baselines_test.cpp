// Baselines (H2O, SnapKV, StreamingLLM, FastV, random, fixed ratio): SIMD path against the reference
// on fresh seeded inputs (GQA 1/2/4/8, fp32/bf16/fp16, odd lengths, ties), hand-computed cases, the
// Policy adapters against direct calls (H2O's decode eviction, StreamingLLM's rolling window, FastV's
// sequence drop), the golden files from both paths, and bad input.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include <vlsparse/policies/policy.hpp>
#include <vlsparse/reference/baselines.hpp>
#include <vlsparse/reference/indexed_decode.hpp>

#include "golden_util.hpp"
#include "test_util.hpp"

using namespace vlsparse;
using Catch::Matchers::Contains;

namespace {

using vt::Qkv;

// Random Q/K/V with a shared direction on every 13th key, so the attention is peaked.
template <class T>
Qkv<T> baselines_make_qkv(std::int64_t n, std::int64_t H, std::int64_t Hkv, std::int64_t d, std::uint64_t seed, bool zero_k = false) {
    Qkv<T> r{n, H, Hkv, d, {}, {}, {}};
    auto q = vt::random_buffer<float>(static_cast<std::size_t>(n * H * d), seed, 1.0f);
    auto k = vt::random_buffer<float>(static_cast<std::size_t>(n * Hkv * d), seed + 1, 1.0f);
    r.v = vt::random_buffer<T>(static_cast<std::size_t>(n * Hkv * d), seed + 2, 1.0f);
    auto u = vt::random_buffer<float>(static_cast<std::size_t>(d), seed + 3, 1.0f);
    for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t c = 0; c < d; ++c) {
            for (std::int64_t h = 0; h < H; ++h) q[static_cast<std::size_t>((i * H + h) * d + c)] += 1.5f * u[c];
            if (i % 13 == 0)
                for (std::int64_t g = 0; g < Hkv; ++g) k[static_cast<std::size_t>((i * Hkv + g) * d + c)] += 3.0f * u[c];
        }
    if (zero_k) std::fill(k.begin(), k.end(), 0.0f);
    for (float x : q) r.q.push_back(from_float<T>(x));
    for (float x : k) r.k.push_back(from_float<T>(x));
    return r;
}

double baselines_max_abs(const std::vector<double>& v) {
    double m = 0.0;
    for (double x : v) m = std::max(m, std::abs(x));
    return m;
}

void check_scores(const std::vector<std::vector<double>>& s, const std::vector<std::vector<double>>& r) {
    REQUIRE(s.size() == r.size());
    for (std::size_t g = 0; g < r.size(); ++g) {
        REQUIRE(s[g].size() == r[g].size());
        const double scale = baselines_max_abs(r[g]);
        for (std::size_t j = 0; j < r[g].size(); ++j) {
            INFO("group " << g << " score[" << j << "] simd " << s[g][j] << " reference " << r[g][j]);
            REQUIRE(std::abs(s[g][j] - r[g][j]) <= vt::kSimdVsReference.score_rel * scale);
        }
    }
}

// Kept lists equal, or differing only at genuine near-ties: every position in one list and not the
// other has a reference score within the tolerance of the score of the other list's differing entries.
void check_selection(const TokenSelection& s, const TokenSelection& r) {
    REQUIRE(s.n == r.n);
    REQUIRE(s.groups() == r.groups());
    for (std::size_t g = 0; g < r.groups(); ++g) {
        INFO("group " << g);
        REQUIRE(s.indices[g].size() == r.indices[g].size());
        if (s.indices[g] == r.indices[g]) continue;
        REQUIRE(r.scores.size() == r.groups());
        const auto& sc = r.scores[g];
        const double tol = vt::kSimdVsReference.score_rel * baselines_max_abs(sc);
        std::vector<std::int64_t> only_s, only_r;
        std::set_difference(s.indices[g].begin(), s.indices[g].end(), r.indices[g].begin(), r.indices[g].end(), std::back_inserter(only_s));
        std::set_difference(r.indices[g].begin(), r.indices[g].end(), s.indices[g].begin(), s.indices[g].end(), std::back_inserter(only_r));
        for (auto a : only_s)
            for (auto b : only_r) {
                INFO("kept sets differ at " << a << " (simd) / " << b << " (reference): scores " << sc[a] << ", " << sc[b]);
                REQUIRE(std::abs(sc[a] - sc[b]) <= tol);
            }
    }
}

std::vector<std::int64_t> iota(std::int64_t a, std::int64_t b) {
    std::vector<std::int64_t> r;
    for (std::int64_t i = a; i < b; ++i) r.push_back(i);
    return r;
}

template <class T>
void h2o_case(std::int64_t n, std::int64_t H, std::int64_t Hkv, const H2OParams& P, std::uint64_t seed) {
    INFO("H2O n=" << n << " H=" << H << "/" << Hkv << " dtype=" << dtype_name(dtype_of<T>()) << " groups="
                  << to_string(P.groups) << " seed=" << seed);
    const auto in = baselines_make_qkv<T>(n, H, Hkv, 24, seed);
    const auto rs = reference::h2o_scores(in.qv(), in.kv(), P.groups);
    const auto ss = simd::h2o_scores(in.qv(), in.kv(), P.groups);
    check_scores(ss, rs);
    const auto r = reference::h2o_select(in.qv(), in.kv(), P);
    const auto s = simd::h2o_select(in.qv(), in.kv(), P);
    check_selection(s, r);
    REQUIRE(r.groups() == (P.groups == BaselineGroups::kv_head ? static_cast<std::size_t>(Hkv) : 1u));
    const std::int64_t heavy = P.heavy.resolve(n), recent = std::min(P.recent.resolve(n), n);
    for (const auto& l : r.indices) {
        REQUIRE(static_cast<std::int64_t>(l.size()) == std::min(n, heavy + recent));
        for (std::int64_t p = n - recent; p < n; ++p) REQUIRE(std::binary_search(l.begin(), l.end(), p));
    }
    r.validate(Hkv, "test");
}

template <class T>
void snapkv_case(std::int64_t n, std::int64_t H, std::int64_t Hkv, const SnapKVParams& P, std::uint64_t seed, bool zero_k = false) {
    INFO("SnapKV n=" << n << " H=" << H << "/" << Hkv << " dtype=" << dtype_name(dtype_of<T>()) << " window=" << P.window
                     << " kernel=" << P.kernel << " pooling=" << to_string(P.pooling) << " seed=" << seed);
    const auto in = baselines_make_qkv<T>(n, H, Hkv, 24, seed, zero_k);
    const auto rw = reference::snapkv_window_scores(in.qv(), in.kv(), P.window, P.groups);
    const auto sw = simd::snapkv_window_scores(in.qv(), in.kv(), P.window, P.groups);
    check_scores(sw, rw);
    std::vector<std::vector<double>> rp, sp;
    for (const auto& x : rw) rp.push_back(reference::snapkv_pool(x, P.kernel, P.pooling));
    for (const auto& x : sw) sp.push_back(simd::snapkv_pool(x, P.kernel, P.pooling));
    check_scores(sp, rp);
    // Same input, same pooled values: the two pooling implementations agree bit for bit.
    for (const auto& x : rw) REQUIRE(simd::snapkv_pool(x, P.kernel, P.pooling) == reference::snapkv_pool(x, P.kernel, P.pooling));
    const auto r = reference::snapkv_select(in.qv(), in.kv(), P);
    const auto s = simd::snapkv_select(in.qv(), in.kv(), P);
    if (zero_k) {
        REQUIRE(s.indices == r.indices);  // exact ties: both paths keep the lowest positions
    } else {
        check_selection(s, r);
    }
    const std::int64_t C = P.capacity.resolve(n);
    for (const auto& l : r.indices) {
        REQUIRE(static_cast<std::int64_t>(l.size()) == std::min(n, C));
        for (std::int64_t p = n - P.window; p < n; ++p) REQUIRE(std::binary_search(l.begin(), l.end(), p));
    }
}

template <class T>
void fastv_case(const std::string& spec, std::int64_t H, std::int64_t Hkv, const FastVParams& P, std::uint64_t seed,
                bool zero_k = false) {
    const Layout layout = Layout::parse(spec);
    const std::int64_t n = layout.n();
    INFO("FastV " << spec << " H=" << H << "/" << Hkv << " dtype=" << dtype_name(dtype_of<T>()) << " rate=" << P.rate
                  << " spans=" << to_string(P.spans) << " seed=" << seed);
    const auto in = baselines_make_qkv<T>(n, H, Hkv, 24, seed, zero_k);
    const auto rs = reference::fastv_scores(in.qv(), in.kv());
    const auto ss = simd::fastv_scores(in.qv(), in.kv());
    check_scores({ss}, {rs});
    const auto r = reference::fastv_select(in.qv(), in.kv(), layout, P);
    const auto s = simd::fastv_select(in.qv(), in.kv(), layout, P);
    if (zero_k) REQUIRE(s.indices == r.indices);
    else check_selection(s, r);
    const auto& l = r.indices[0];
    for (std::int64_t p = 0; p < n; ++p)
        if (layout.is_text(p)) REQUIRE(std::binary_search(l.begin(), l.end(), p));
    const std::int64_t m = layout.count(SegmentKind::image) + layout.count(SegmentKind::video);
    const std::int64_t kept_visual = static_cast<std::int64_t>(l.size()) - layout.count(SegmentKind::text);
    if (P.spans == FastVSpans::joint) REQUIRE(kept_visual == static_cast<std::int64_t>(std::floor((1.0 - P.rate) * m)));
}

}  // namespace

// ------------------------------------------------------------------------------------------------
TEST_CASE("baselines: budgets resolve as counts or floor(fraction * n)", "[baselines]") {
    REQUIRE(TokenBudget::tokens(7).resolve(100) == 7);
    REQUIRE(TokenBudget::ratio(0.25).resolve(10) == 2);
    REQUIRE(TokenBudget::ratio(0.1).resolve(96) == 9);
    REQUIRE(TokenBudget::ratio(1.0).resolve(13) == 13);
    REQUIRE(TokenBudget::ratio(0.0).resolve(13) == 0);
    REQUIRE_THROWS_WITH(TokenBudget::tokens(-1).validate("f", "heavy"), Contains("heavy = -1"));
    REQUIRE_THROWS_WITH(TokenBudget::ratio(1.5).validate("f", "recent"), Contains("expected 0 <= fraction <= 1"));
    REQUIRE_THROWS_AS(TokenBudget::ratio(std::nan("")).validate("f", "x"), vlsparse::error);
    REQUIRE_THROWS_AS(TokenBudget::ratio(-0.01).validate("f", "x"), vlsparse::error);
}

TEST_CASE("baselines: hand-computed H2O, StreamingLLM, pooling, random and fixed-ratio", "[baselines]") {
    // H2O among cached positions: last 2 + top 2 of the others by score (tie: lower position first).
    const std::vector<std::int64_t> cached = {0, 2, 3, 5, 8, 9, 11};
    const std::vector<double> sc = {0.5, 0, 0.9, 0.1, 0, 0.9, 0, 0, 0.3, 0.7, 0, 0.2};
    auto score = [&](std::int64_t p) { return sc[static_cast<std::size_t>(p)]; };
    REQUIRE(h2o_keep(cached, 2, 2, score) == std::vector<std::int64_t>{2, 5, 9, 11});
    REQUIRE(h2o_keep(cached, 3, 0, score) == std::vector<std::int64_t>{2, 5, 9});
    REQUIRE(h2o_keep(cached, 4, 3, score) == cached);  // within budget: everything
    // StreamingLLM.
    StreamingLLMParams S;
    S.sinks = 2;
    S.recent = TokenBudget::tokens(3);
    REQUIRE(streamingllm_select(10, S).indices[0] == std::vector<std::int64_t>{0, 1, 7, 8, 9});
    REQUIRE(streamingllm_select(5, S).indices[0] == iota(0, 5));
    S.sinks = 0;
    S.recent = TokenBudget::ratio(0.5);
    REQUIRE(streamingllm_select(9, S).indices[0] == std::vector<std::int64_t>{5, 6, 7, 8});
    // Pooling: avg counts the zero padding, max ignores it.
    const std::vector<double> s = {1, 2, 3, 4, 5};
    for (auto pool : {&simd::snapkv_pool, &reference::snapkv_pool}) {
        const auto avg = pool(s, 3, SnapKVPooling::avg);
        const std::vector<double> want_avg = {1.0, 2.0, 3.0, 4.0, 3.0};
        for (std::size_t i = 0; i < s.size(); ++i) REQUIRE(avg[i] == Approx(want_avg[i]).epsilon(1e-15));
        REQUIRE(pool(s, 3, SnapKVPooling::max) == std::vector<double>{2, 3, 4, 5, 5});
        REQUIRE(pool(s, 5, SnapKVPooling::none) == s);
        REQUIRE(pool(s, 1, SnapKVPooling::avg) == s);
        REQUIRE(pool(std::vector<double>{}, 5, SnapKVPooling::avg).empty());
    }
    // Fixed ratio: m = 10 image tokens at [2, 12), k = 4 -> offsets 0, 2, 5, 7.
    const Layout L = Layout::parse("text:2,image:10,text:3");
    FixedRatioParams F;
    F.keep = TokenBudget::tokens(4);
    REQUIRE(fixed_ratio_select(L, F).indices[0] == std::vector<std::int64_t>{0, 1, 2, 4, 7, 9, 12, 13, 14});
    F.mode = FixedRatioMode::first;
    REQUIRE(fixed_ratio_select(L, F).indices[0] == std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 12, 13, 14});
    F.mode = FixedRatioMode::last;
    F.scope = BaselineScope::all;
    F.keep = TokenBudget::ratio(0.2);  // floor(0.2 * 15) = 3
    REQUIRE(fixed_ratio_select(L, F).indices[0] == std::vector<std::int64_t>{12, 13, 14});
    F.keep = TokenBudget::tokens(100);  // more than there is: everything
    REQUIRE(fixed_ratio_select(L, F).indices[0] == iota(0, 15));
    // Random: exactly sample_without_replacement(m, k, seed + layer) over the scope tokens.
    RandomParams R;
    R.keep = TokenBudget::ratio(0.5);
    R.seed = 42;
    const auto draw = sample_without_replacement(10, 5, 42 + 3);
    std::vector<std::int64_t> want = {0, 1};
    for (auto i : draw) want.push_back(2 + i);
    want.insert(want.end(), {12, 13, 14});
    REQUIRE(random_select(L, 3, R).indices[0] == want);
    REQUIRE(random_select(L, 3, R).indices == random_select(L, 3, R).indices);  // deterministic
    REQUIRE(random_select(L, 4, R).indices != random_select(L, 3, R).indices);  // per-layer draws
}

TEST_CASE("baselines: H2O simd matches reference (GQA 1/2/4/8, dtypes, odd lengths)", "[baselines][h2o]") {
    const auto seed = vt::base_seed();
    INFO("seed " << seed);
    H2OParams P;
    P.heavy = TokenBudget::ratio(0.2);
    P.recent = TokenBudget::ratio(0.1);
    std::uint64_t s = seed;
    for (const auto& [H, Hkv] : std::vector<std::pair<std::int64_t, std::int64_t>>{{4, 4}, {4, 2}, {8, 2}, {8, 1}}) {
        for (const std::int64_t n : {1, 7, 33, 97}) {
            if (vt::small_run() && n > 33) continue;
            P.groups = (n % 2) ? BaselineGroups::kv_head : BaselineGroups::layer;
            h2o_case<float>(n, H, Hkv, P, ++s);
            h2o_case<bfloat16>(n, H, Hkv, P, ++s);
        }
    }
    P.heavy = TokenBudget::tokens(5);
    P.recent = TokenBudget::tokens(3);
    P.groups = BaselineGroups::layer;
    h2o_case<half>(61, 8, 4, P, ++s);
    P.heavy = TokenBudget::tokens(500);  // beyond n: everything
    h2o_case<float>(40, 4, 2, P, ++s);
}

TEST_CASE("baselines: H2O with uniform attention keeps the earliest heavy hitters", "[baselines][h2o]") {
    // Zero keys: a_j = sum_{i >= j} 1/(i+1) per head, strictly decreasing in j.
    const auto in = baselines_make_qkv<float>(30, 4, 2, 16, vt::base_seed() + 5, true);
    H2OParams P;
    P.heavy = TokenBudget::tokens(6);
    P.recent = TokenBudget::tokens(4);
    const std::vector<std::int64_t> want = {0, 1, 2, 3, 4, 5, 26, 27, 28, 29};
    for (const auto& sel : {reference::h2o_select(in.qv(), in.kv(), P), simd::h2o_select(in.qv(), in.kv(), P)}) {
        REQUIRE(sel.groups() == 2);
        for (const auto& l : sel.indices) REQUIRE(l == want);
        double expect = 0.0;
        for (std::int64_t i = 29; i >= 0; --i) expect += 2.0 / static_cast<double>(i + 1);  // two heads per group
        REQUIRE(sel.scores[0][0] == Approx(expect).epsilon(1e-6));
    }
}

TEST_CASE("baselines: SnapKV simd matches reference (GQA, dtypes, pooling, ties)", "[baselines][snapkv]") {
    std::uint64_t s = vt::base_seed() + 100;
    INFO("seed " << s);
    SnapKVParams P;
    P.window = 8;
    P.capacity = TokenBudget::tokens(24);
    for (const auto& [H, Hkv] : std::vector<std::pair<std::int64_t, std::int64_t>>{{4, 4}, {4, 2}, {8, 2}, {8, 1}}) {
        for (const auto pooling : {SnapKVPooling::avg, SnapKVPooling::max, SnapKVPooling::none}) {
            P.pooling = pooling;
            P.groups = H == 8 ? BaselineGroups::layer : BaselineGroups::kv_head;
            snapkv_case<float>(61, H, Hkv, P, ++s);
            snapkv_case<bfloat16>(45, H, Hkv, P, ++s);
        }
    }
    P.kernel = 7;
    P.pooling = SnapKVPooling::avg;
    P.window = 1;
    P.capacity = TokenBudget::ratio(0.3);
    snapkv_case<half>(97, 8, 4, P, ++s);
    P.window = 9;
    P.capacity = TokenBudget::tokens(9);
    snapkv_case<float>(9, 4, 2, P, ++s);  // window = n: everything is window
    // Exact ties (zero keys): interior pooled scores are equal; both paths keep the lowest positions.
    P.window = 8;
    P.kernel = 5;
    P.capacity = TokenBudget::tokens(16);
    snapkv_case<float>(40, 4, 2, P, ++s, true);
    const auto in = baselines_make_qkv<float>(40, 4, 2, 16, ++s, true);
    const auto sel = simd::snapkv_select(in.qv(), in.kv(), P);
    // Prefix of 32 columns, every one with the same window sum; avg pooling is lower at the two
    // edges (zero padding), so the 8 chosen are positions 2..9, then the window 32..39.
    std::vector<std::int64_t> want = iota(2, 10);
    for (std::int64_t p = 32; p < 40; ++p) want.push_back(p);
    for (const auto& l : sel.indices) REQUIRE(l == want);
}

TEST_CASE("baselines: FastV simd matches reference (joint, per image, ties)", "[baselines][fastv]") {
    std::uint64_t s = vt::base_seed() + 200;
    INFO("seed " << s);
    FastVParams P;
    const std::string spec = "text:5,image:36,text:3,image:21,text:4";
    for (const auto& [H, Hkv] : std::vector<std::pair<std::int64_t, std::int64_t>>{{4, 4}, {4, 2}, {8, 2}, {8, 1}}) {
        for (const auto spans : {FastVSpans::joint, FastVSpans::per_image}) {
            P.spans = spans;
            P.rate = spans == FastVSpans::joint ? 0.5 : 0.75;
            fastv_case<float>(spec, H, Hkv, P, ++s);
            fastv_case<bfloat16>(spec, H, Hkv, P, ++s);
        }
    }
    P.rate = 0.0;
    fastv_case<half>("text:3,video:3x5,text:2", 4, 2, P, ++s);
    // Ties: uniform attention; the lowest visual positions are kept.
    P.rate = 0.5;
    P.spans = FastVSpans::joint;
    fastv_case<float>("text:2,image:10,text:1,image:6,text:2", 4, 2, P, ++s, true);
    const auto in = baselines_make_qkv<float>(21, 4, 2, 16, ++s, true);
    const auto sel = simd::fastv_select(in.qv(), in.kv(), Layout::parse("text:2,image:10,text:1,image:6,text:2"), P);
    REQUIRE(sel.indices[0] == std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 19, 20});
}

// ------------------------------------------------------------------------------------------------
namespace {

// One layer's prompt as an engine would see it in a policy run.
struct OneLayer {
    Layout layout;
    ModelShape shape;
    Qkv<float> in;
    PrefillLayer input(std::int64_t layer = 0) const {
        return {&layout, shape, layer, in.qv(), in.kv(), in.vv(), {}};
    }
};

OneLayer one_layer(const std::string& spec, ModelShape shape, std::uint64_t seed) {
    const Layout L = Layout::parse(spec);
    return {L, shape, baselines_make_qkv<float>(L.n(), shape.heads, shape.kv_heads, shape.head_dim, seed)};
}

// Per-group mean over query heads of probs [H, Lmax] for per-KV-head row lists.
std::vector<std::vector<double>> group_means(const std::vector<float>& probs, std::int64_t H, std::int64_t Hkv,
                                             const CacheRows& rows, std::size_t L) {
    std::vector<std::vector<double>> a(static_cast<std::size_t>(Hkv));
    const std::int64_t qpk = H / Hkv;
    for (std::int64_t g = 0; g < Hkv; ++g) {
        a[g].assign(rows.for_kv_head(g).size(), 0.0);
        for (std::int64_t h = g * qpk; h < (g + 1) * qpk; ++h)
            for (std::size_t i = 0; i < a[g].size(); ++i) a[g][i] += probs[static_cast<std::size_t>(h) * L + i] / static_cast<double>(qpk);
    }
    return a;
}

TokenSelection cached_of(const KvCache<float>& cache) {
    TokenSelection s;
    s.n = cache.seq_len();
    for (std::int64_t g = 0; g < cache.n_kv_heads(); ++g) s.indices.emplace_back(cache.positions(g).begin(), cache.positions(g).end());
    return s;
}

}  // namespace

TEST_CASE("baselines: prefill adapters equal the direct calls", "[baselines][policy]") {
    const auto L = one_layer("text:7,image:40,text:5,image:21,text:6", {3, 8, 2, 16}, vt::base_seed() + 300);
    const std::int64_t n = L.layout.n();
    {
        H2OParams P;
        P.heavy = TokenBudget::ratio(0.15);
        H2OPolicy pol(P);
        pol.begin(L.layout, L.shape);
        const auto d = pol.prefill(L.input(1));
        REQUIRE(d.kv.indices == simd::h2o_select(L.in.qv(), L.in.kv(), P).indices);
        REQUIRE_FALSE(d.sparse_prefill);
        REQUIRE(d.sequence.empty());
    }
    {
        SnapKVParams P;
        P.window = 8;
        P.capacity = TokenBudget::ratio(0.4);
        SnapKVPolicy pol(P);
        pol.begin(L.layout, L.shape);
        REQUIRE(pol.prefill(L.input()).kv.indices == simd::snapkv_select(L.in.qv(), L.in.kv(), P).indices);
    }
    {
        StreamingLLMParams P;
        P.recent = TokenBudget::tokens(10);
        StreamingLLMPolicy pol(P);
        pol.begin(L.layout, L.shape);
        REQUIRE(pol.prefill(L.input()).kv.indices == streamingllm_select(n, P).indices);
    }
    {
        RandomParams P;
        P.seed = 9;
        RandomPolicy pol(P);
        pol.begin(L.layout, L.shape);
        for (std::int64_t l = 0; l < 3; ++l) REQUIRE(pol.prefill(L.input(l)).kv.indices == random_select(L.layout, l, P).indices);
    }
    {
        FixedRatioParams P;
        P.keep = TokenBudget::ratio(0.3);
        FixedRatioPolicy pol(P);
        pol.begin(L.layout, L.shape);
        REQUIRE(pol.prefill(L.input(2)).kv.indices == fixed_ratio_select(L.layout, P).indices);
    }
}

TEST_CASE("baselines: FastVPolicy drops visual tokens from the sequence after layer K-1", "[baselines][policy][fastv]") {
    const ModelShape shape{5, 4, 2, 16};
    const Layout layout = Layout::parse("text:6,image:30,text:4,image:20,text:5");
    const std::int64_t N = layout.n();
    std::vector<Qkv<float>> layers;
    for (std::int64_t l = 0; l < shape.layers; ++l)
        layers.push_back(baselines_make_qkv<float>(N, shape.heads, shape.kv_heads, shape.head_dim, vt::base_seed() + 400 + 10 * l));
    FastVParams P;
    P.k_layer = 2;
    FastVPolicy pol(P);
    pol.begin(layout, shape);
    std::vector<std::int64_t> pos = iota(0, N);
    for (std::int64_t l = 0; l < shape.layers; ++l) {
        INFO("layer " << l);
        // Gather the rows still in the sequence.
        std::vector<float> q, k, v;
        const auto& x = layers[static_cast<std::size_t>(l)];
        for (auto p : pos) {
            q.insert(q.end(), x.q.begin() + p * shape.heads * shape.head_dim, x.q.begin() + (p + 1) * shape.heads * shape.head_dim);
            k.insert(k.end(), x.k.begin() + p * shape.kv_heads * shape.head_dim, x.k.begin() + (p + 1) * shape.kv_heads * shape.head_dim);
            v.insert(v.end(), x.v.begin() + p * shape.kv_heads * shape.head_dim, x.v.begin() + (p + 1) * shape.kv_heads * shape.head_dim);
        }
        const auto m = static_cast<std::int64_t>(pos.size());
        const PrefillLayer in{&layout, shape, l, View3<const float>(q.data(), {m, shape.heads, shape.head_dim}),
                              View3<const float>(k.data(), {m, shape.kv_heads, shape.head_dim}),
                              View3<const float>(v.data(), {m, shape.kv_heads, shape.head_dim}), pos};
        const auto d = pol.prefill(in);
        REQUIRE(d.kv.indices == std::vector<std::vector<std::int64_t>>{pos});  // nothing evicted
        if (l == P.k_layer - 1) {
            const auto sel = simd::fastv_select(x.qv(), x.kv(), layout, P);
            REQUIRE(d.sequence == sel.indices[0]);
            REQUIRE(static_cast<std::int64_t>(d.sequence.size()) == N - 25);  // 50 visual tokens, 25 dropped
            pos = d.sequence;
        } else {
            REQUIRE(d.sequence.empty());
        }
        if (l >= P.k_layer) REQUIRE(static_cast<std::int64_t>(pos.size()) == N - 25);
    }
    FastVParams bad;
    bad.k_layer = 5;
    FastVPolicy too_deep(bad);
    REQUIRE_THROWS_WITH(too_deep.begin(layout, shape), Contains("expected K < layers"));
}

TEST_CASE("baselines: H2OPolicy keeps the cache within budget during decode", "[baselines][policy][h2o]") {
    for (const auto groups : {BaselineGroups::kv_head, BaselineGroups::layer}) {
        INFO("groups " << to_string(groups));
        const auto L = one_layer("text:6,image:40,text:6", {1, 8, 2, 16}, vt::base_seed() + 500);
        const std::int64_t n = L.layout.n(), H = 8, Hkv = 2, d = 16, steps = 8;
        H2OParams P;
        P.heavy = TokenBudget::tokens(10);
        P.recent = TokenBudget::tokens(6);
        P.groups = groups;
        H2OPolicy pol(P);
        pol.begin(L.layout, L.shape);
        const auto dec = pol.prefill(L.input());
        KvCache<float> cache(Hkv, d);
        cache.assign(L.in.kv(), L.in.vv());
        cache.keep(dec.kv);
        // The same accumulation by hand: sum over the query heads of each group (or all heads).
        auto acc = reference::h2o_scores(L.in.qv(), L.in.kv(), groups);
        for (auto& a : acc) a.resize(static_cast<std::size_t>(n + steps), 0.0);
        const auto dq = vt::random_buffer<float>(static_cast<std::size_t>(steps * H * d), vt::base_seed() + 501);
        const auto dk = vt::random_buffer<float>(static_cast<std::size_t>(steps * Hkv * d), vt::base_seed() + 502);
        const auto dv = vt::random_buffer<float>(static_cast<std::size_t>(steps * Hkv * d), vt::base_seed() + 503);
        std::vector<float> out(static_cast<std::size_t>(H * d));
        for (std::int64_t t = 0; t < steps; ++t) {
            INFO("step " << t);
            cache.append(View2<const float>(dk.data() + t * Hkv * d, {Hkv, d}), View2<const float>(dv.data() + t * Hkv * d, {Hkv, d}));
            const TokenSelection cached = cached_of(cache);
            const TokenSelection read = pol.decode_read(0, t, cached);
            REQUIRE(read.indices == cached.indices);
            const CacheRows rows = rows_for_positions(cache, read);
            const auto Lmax = static_cast<std::size_t>(rows.longest());
            std::vector<float> probs(static_cast<std::size_t>(H) * Lmax);
            simd::indexed_decode_attention(View2<const float>(dq.data() + t * H * d, {H, d}), cache, rows,
                                           View2<float>(out.data(), {H, d}), View2<float>(probs.data(), {H, static_cast<std::int64_t>(Lmax)}));
            const auto attn = group_means(probs, H, Hkv, rows, Lmax);
            for (std::int64_t h = 0; h < H; ++h) {
                const std::int64_t g = h / (H / Hkv);
                auto& a = acc[groups == BaselineGroups::layer ? 0 : g];
                const auto& list = read.for_kv_head(g);
                for (std::size_t i = 0; i < list.size(); ++i) a[list[i]] += probs[static_cast<std::size_t>(h) * Lmax + i];
            }
            const auto keep = pol.decode_observe(0, t, read, attn);
            REQUIRE(keep.has_value());  // 16 + 1 rows > budget 16 at every step
            for (std::int64_t g = 0; g < Hkv; ++g) {
                const auto list = read.for_kv_head(g);
                const auto& a = acc[groups == BaselineGroups::layer ? 0 : g];
                const auto want = h2o_keep(list, 10, 6, [&](std::int64_t p) { return a[static_cast<std::size_t>(p)]; });
                const auto got = keep->for_kv_head(g);
                REQUIRE(std::vector<std::int64_t>(got.begin(), got.end()) == want);
            }
            for (std::size_t g = 0; g < acc.size(); ++g) {
                const auto& pa = pol.accumulated(0)[g];
                for (std::int64_t p = 0; p < cache.seq_len(); ++p) REQUIRE(pa[p] == Approx(acc[g][p]).epsilon(1e-5).margin(1e-9));
            }
            cache.keep(*keep);
            for (std::int64_t g = 0; g < Hkv; ++g) REQUIRE(cache.rows(g) == 16);
            if (groups == BaselineGroups::layer) REQUIRE(keep->shared());
        }
    }
    H2OParams P;
    P.evict_during_decode = false;
    H2OPolicy off(P);
    const auto L = one_layer("text:20", {1, 4, 2, 16}, vt::base_seed() + 510);
    off.begin(L.layout, L.shape);
    const auto d = off.prefill(L.input());
    std::vector<std::vector<double>> attn;
    for (const auto& l : d.kv.indices) attn.emplace_back(l.size(), 0.1);
    REQUIRE_FALSE(off.decode_observe(0, 0, d.kv, attn).has_value());
    REQUIRE_THROWS_AS(off.decode_read(1, 0, d.kv), vlsparse::error);  // layer never prefilled
}

TEST_CASE("baselines: StreamingLLMPolicy rolls the window during decode", "[baselines][policy]") {
    const auto L = one_layer("text:10,image:20,text:5", {2, 4, 2, 16}, vt::base_seed() + 600);
    StreamingLLMParams P;
    P.sinks = 4;
    P.recent = TokenBudget::tokens(12);
    StreamingLLMPolicy pol(P);
    pol.begin(L.layout, L.shape);
    const std::int64_t n = L.layout.n();
    TokenSelection cached = pol.prefill(L.input()).kv;
    REQUIRE(cached.indices[0] == [&] { auto v = iota(0, 4); auto r = iota(n - 12, n); v.insert(v.end(), r.begin(), r.end()); return v; }());
    for (std::int64_t t = 0; t < 5; ++t) {
        cached.indices[0].push_back(n + t);
        cached.n = n + t + 1;
        const auto read = pol.decode_read(0, t, cached);
        auto want = iota(0, 4);
        const auto r = iota(n + t + 1 - 12, n + t + 1);
        want.insert(want.end(), r.begin(), r.end());
        REQUIRE(read.indices[0] == want);
        const auto keep = pol.decode_observe(0, t, read, {});
        REQUIRE(keep.has_value());
        REQUIRE(keep->indices == read.indices);
        cached = *keep;
    }
    REQUIRE_THROWS_AS(pol.decode_read(1, 0, cached), vlsparse::error);  // layer 1 never prefilled
}

// ------------------------------------------------------------------------------------------------
TEST_CASE("baselines: bad input is a clear error", "[baselines][errors]") {
    const auto in = baselines_make_qkv<float>(20, 4, 2, 16, vt::base_seed() + 700);
    const Layout layout = Layout::parse("text:4,image:12,text:4");
    // H2O.
    H2OParams H;
    H.heavy = TokenBudget::tokens(-3);
    REQUIRE_THROWS_WITH(simd::h2o_select(in.qv(), in.kv(), H), Contains("heavy = -3"));
    REQUIRE_THROWS_WITH(reference::h2o_select(in.qv(), in.kv(), H), Contains("heavy = -3"));
    H = {};
    H.recent = TokenBudget::ratio(1.2);
    REQUIRE_THROWS_WITH(simd::h2o_select(in.qv(), in.kv(), H), Contains("recent = 1.2"));
    H = {};
    const View3<const float> k_short(in.k.data(), {19, 2, 16});
    REQUIRE_THROWS_WITH(simd::h2o_select(in.qv(), k_short, H), Contains("expected equal (prefill)"));
    REQUIRE_THROWS_WITH(reference::h2o_select(in.qv(), k_short, H), Contains("expected equal (prefill)"));
    auto nan_q = in.q;
    nan_q[5] = std::numeric_limits<float>::quiet_NaN();
    REQUIRE_THROWS_AS(simd::h2o_select(View3<const float>(nan_q.data(), {20, 4, 16}), in.kv(), H), vlsparse::error);
    REQUIRE_THROWS_AS(reference::h2o_select(View3<const float>(nan_q.data(), {20, 4, 16}), in.kv(), H), vlsparse::error);
    const View3<const float> k3(in.k.data(), {20, 3, 16});
    REQUIRE_THROWS_WITH(simd::h2o_scores(in.qv(), View3<const float>(in.k.data(), {10, 4, 16}), BaselineGroups::kv_head),
                        Contains("expected equal"));
    REQUIRE_THROWS_AS(simd::h2o_scores(in.qv(), k3, BaselineGroups::kv_head), vlsparse::error);  // H % H_kv != 0
    // SnapKV.
    SnapKVParams S;
    S.window = 32;  // larger than n = 20
    REQUIRE_THROWS_WITH(simd::snapkv_select(in.qv(), in.kv(), S), Contains("larger than the prompt"));
    REQUIRE_THROWS_WITH(reference::snapkv_select(in.qv(), in.kv(), S), Contains("larger than the prompt"));
    S.window = 0;
    REQUIRE_THROWS_WITH(simd::snapkv_select(in.qv(), in.kv(), S), Contains("window = 0"));
    S.window = 4;
    S.kernel = 4;
    REQUIRE_THROWS_WITH(simd::snapkv_select(in.qv(), in.kv(), S), Contains("odd kernel"));
    REQUIRE_THROWS_AS(simd::snapkv_pool(std::vector<double>{1, 2}, 0, SnapKVPooling::avg), vlsparse::error);
    REQUIRE_THROWS_AS(reference::snapkv_pool(std::vector<double>{1, 2}, 2, SnapKVPooling::avg), vlsparse::error);
    S.kernel = 5;
    S.capacity = TokenBudget::tokens(3);  // below the window
    REQUIRE_THROWS_WITH(simd::snapkv_select(in.qv(), in.kv(), S), Contains("expected capacity >= window"));
    S.capacity = TokenBudget::ratio(-0.5);
    REQUIRE_THROWS_WITH(reference::snapkv_select(in.qv(), in.kv(), S), Contains("capacity = -0.5"));
    REQUIRE_THROWS_AS(simd::snapkv_window_scores(in.qv(), in.kv(), 21, BaselineGroups::kv_head), vlsparse::error);
    // StreamingLLM.
    StreamingLLMParams St;
    St.sinks = -1;
    REQUIRE_THROWS_WITH(streamingllm_select(10, St), Contains("sinks = -1"));
    St = {};
    REQUIRE_THROWS_WITH(streamingllm_select(0, St), Contains("n = 0"));
    St.recent = TokenBudget::ratio(2.0);
    REQUIRE_THROWS_AS(streamingllm_select(10, St), vlsparse::error);
    // FastV.
    FastVParams F;
    for (const double bad : {1.0, -0.1, 1.5, std::nan("")}) {
        F.rate = bad;
        REQUIRE_THROWS_WITH(simd::fastv_select(in.qv(), in.kv(), layout, F), Contains("expected 0 <= rate < 1"));
        REQUIRE_THROWS_WITH(reference::fastv_select(in.qv(), in.kv(), layout, F), Contains("expected 0 <= rate < 1"));
    }
    F = {};
    F.k_layer = 0;
    REQUIRE_THROWS_WITH(simd::fastv_select(in.qv(), in.kv(), layout, F), Contains("k_layer = 0"));
    F = {};
    REQUIRE_THROWS_WITH(F.validate("f", 2), Contains("expected K < layers"));
    REQUIRE_THROWS_AS(simd::fastv_select(in.qv(), in.kv(), Layout::parse("text:4,image:12,text:5"), F), vlsparse::error);
    REQUIRE_THROWS_AS(fastv_select_from_scores(std::vector<double>(19, 0.0), layout, F), vlsparse::error);
    std::vector<double> nan_scores(20, 0.0);
    nan_scores[3] = std::nan("");
    REQUIRE_THROWS_WITH(fastv_select_from_scores(nan_scores, layout, F), Contains("expected finite scores"));
    // Random and fixed ratio.
    RandomParams R;
    R.keep = TokenBudget::ratio(1.01);
    REQUIRE_THROWS_WITH(random_select(layout, 0, R), Contains("keep = 1.01"));
    R = {};
    REQUIRE_THROWS_WITH(random_select(layout, -1, R), Contains("layer = -1"));
    FixedRatioParams X;
    X.keep = TokenBudget::tokens(-1);
    REQUIRE_THROWS_WITH(fixed_ratio_select(layout, X), Contains("keep = -1"));
    // Score-level entry points.
    H = {};
    REQUIRE_THROWS_AS(h2o_select_from_scores({}, H), vlsparse::error);
    REQUIRE_THROWS_AS(h2o_select_from_scores({{1.0, 2.0}, {1.0}}, H), vlsparse::error);
    REQUIRE_THROWS_WITH(h2o_select_from_scores({{1.0, std::nan("")}}, H), Contains("expected finite scores"));
    S = {};
    S.window = 2;
    REQUIRE_THROWS_AS(snapkv_select_from_pooled({{1.0, 2.0}}, 5, S), vlsparse::error);  // needs n - window = 3 entries
    // Policies refuse bad params at begin().
    const ModelShape shape{2, 4, 2, 16};
    H.heavy = TokenBudget::tokens(-1);
    H2OPolicy hp(H);
    REQUIRE_THROWS_AS(hp.begin(layout, shape), vlsparse::error);
    SnapKVParams S2;
    S2.kernel = 2;
    SnapKVPolicy sp(S2);
    REQUIRE_THROWS_AS(sp.begin(layout, shape), vlsparse::error);
    FastVParams F2;
    F2.k_layer = 2;  // == layers
    FastVPolicy fp(F2);
    REQUIRE_THROWS_WITH(fp.begin(layout, shape), Contains("k_layer = 2 with 2 layers"));
    // A SnapKV policy on a prompt shorter than its window.
    SnapKVPolicy sp2;  // window 32
    sp2.begin(layout, shape);
    const PrefillLayer pl{&layout, shape, 0, in.qv(), in.kv(), in.vv(), {}};
    REQUIRE_THROWS_WITH(sp2.prefill(pl), Contains("larger than the prompt"));
}

// ------------------------------------------------------------------------------------------------
#ifdef VLSPARSE_SOURCE_DIR
#include <cstdlib>
#include <filesystem>
#include <set>

#include <vlsparse/reference/baselines_golden.hpp>

namespace {

std::filesystem::path baselines_golden_root() {
    if (const char* d = std::getenv("VLSPARSE_GOLDEN_DIR")) return std::filesystem::path(d) / "baselines";
    return std::filesystem::path(VLSPARSE_SOURCE_DIR) / "golden" / "baselines";
}

template <class Backend>
void check_baselines_case(const std::filesystem::path& dir, const char* backend) {
    INFO("case " << dir.string() << ", backend " << backend);
    GoldenManifest m;
    const auto inputs = golden::read_baselines_inputs(dir, &m);
    const auto outputs = golden::run_baselines_case<Backend>(inputs);
    vt::check_golden_outputs(dir, m, outputs, golden::baselines_output_metric, vt::precision_of(backend));
}

}  // namespace

TEST_CASE("baselines: golden cases from both paths", "[baselines][golden]") {
    std::vector<std::filesystem::path> dirs;
    for (const auto& e : std::filesystem::directory_iterator(baselines_golden_root()))
        if (e.is_directory()) dirs.push_back(e.path());
    std::sort(dirs.begin(), dirs.end());
    REQUIRE(dirs.size() == 11);
    std::set<std::string> kinds;
    for (const auto& d : dirs) {
        kinds.insert(golden::read_baselines_inputs(d).baseline);
        check_baselines_case<reference::BaselineOps>(d, "reference");
        check_baselines_case<simd::BaselineOps>(d, "simd");
    }
    REQUIRE(kinds == std::set<std::string>{"h2o", "snapkv", "streamingllm", "fastv", "random", "fixed_ratio"});
}

TEST_CASE("baselines: H2OPolicy and StreamingLLMPolicy reproduce the golden decode traces", "[baselines][golden][policy]") {
    for (const char* name : {"h2o_gqa_fp32", "h2o_layer_bf16", "streamingllm_rolling"}) {
        INFO("case " << name);
        const auto dir = baselines_golden_root() / name;
        GoldenManifest m;
        const auto c = golden::read_baselines_inputs(dir, &m);
        const auto kept = read_tensor(dir, m.output("decode_kept_mask")).to_vector<std::uint8_t>();
        const std::int64_t n = c.n, S = c.steps, W = n + S;
        if (c.baseline == "streamingllm") {
            StreamingLLMPolicy pol(streamingllm_params_from_json(c.params));
            const ModelShape shape{1, 1, 1, 8};
            pol.begin(c.layout, shape);
            std::vector<float> z(static_cast<std::size_t>(n * 8), 0.0f);
            const View3<const float> zv(z.data(), {n, 1, 8});
            TokenSelection cached = pol.prefill({&c.layout, shape, 0, zv, zv, zv, {}}).kv;
            for (std::int64_t t = 0; t < S; ++t) {
                cached.indices[0].push_back(n + t);
                cached.n = n + t + 1;
                const auto read = pol.decode_read(0, t, cached);
                if (auto k = pol.decode_observe(0, t, read, {})) cached = *k;
                for (std::int64_t p = 0; p < W; ++p)
                    REQUIRE(kept[static_cast<std::size_t>(t * W + p)] ==
                            (std::binary_search(cached.indices[0].begin(), cached.indices[0].end(), p) ? 1 : 0));
            }
            continue;
        }
        // H2O: bf16 inputs are exactly representable, so run the policy in fp32 on the same values.
        const H2OParams P = h2o_params_from_json(c.params);
        const ModelShape shape{1, c.H, c.Hkv, c.d};
        H2OPolicy pol(P);
        pol.begin(c.layout, shape);
        const View3<const float> qv(c.q.data(), {n, c.H, c.d}), kv(c.k.data(), {n, c.Hkv, c.d}), vv(c.v.data(), {n, c.Hkv, c.d});
        const auto d = pol.prefill({&c.layout, shape, 0, qv, kv, vv, {}});
        KvCache<float> cache(c.Hkv, c.d);
        cache.assign(kv, vv);
        cache.keep(d.kv);
        const auto G = static_cast<std::int64_t>(d.kv.groups());
        std::vector<float> out(static_cast<std::size_t>(c.H * c.d));
        for (std::int64_t t = 0; t < S; ++t) {
            INFO("step " << t);
            cache.append(View2<const float>(c.dk.data() + t * c.Hkv * c.d, {c.Hkv, c.d}),
                         View2<const float>(c.dv.data() + t * c.Hkv * c.d, {c.Hkv, c.d}));
            const TokenSelection read = pol.decode_read(0, t, cached_of(cache));
            const CacheRows rows = rows_for_positions(cache, read);
            const auto L = static_cast<std::size_t>(rows.longest());
            std::vector<float> probs(static_cast<std::size_t>(c.H) * L);
            simd::indexed_decode_attention(View2<const float>(c.dq.data() + t * c.H * c.d, {c.H, c.d}), cache, rows,
                                           View2<float>(out.data(), {c.H, c.d}), View2<float>(probs.data(), {c.H, static_cast<std::int64_t>(L)}));
            auto attn = group_means(probs, c.H, c.Hkv, rows, L);
            if (read.shared()) {  // one list: the mean over every query head
                std::vector<double> all(attn[0].size(), 0.0);
                for (const auto& a : attn)
                    for (std::size_t i = 0; i < a.size(); ++i) all[i] += a[i] / static_cast<double>(attn.size());
                attn = {all};
            }
            if (auto k = pol.decode_observe(0, t, read, attn)) cache.keep(*k);
            for (std::int64_t g = 0; g < G; ++g) {
                const auto pos = cache.positions(g);
                for (std::int64_t p = 0; p < W; ++p)
                    REQUIRE(kept[static_cast<std::size_t>((t * G + g) * W + p)] ==
                            (std::binary_search(pos.begin(), pos.end(), p) ? 1 : 0));
            }
        }
    }
}
#endif
