// The policy interface: every adapter satisfies Policy, and each adapter's decisions equal the
// direct calls of the library functions it wraps, over a whole prompt (every layer, rows dropped by
// earlier layers where the policy does that) and a run of decode steps; AnyPolicy forwards exactly.
#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>

#include <vlsparse/policies/policy.hpp>

#include "test_util.hpp"

using namespace vlsparse;

static_assert(Policy<DensePolicy>);
static_assert(Policy<ZipVLPolicy>);
static_assert(Policy<AvlPolicy>);
static_assert(Policy<BlindSightPolicy>);
static_assert(Policy<H2OPolicy>);
static_assert(Policy<SnapKVPolicy>);
static_assert(Policy<StreamingLLMPolicy>);
static_assert(Policy<FastVPolicy>);
static_assert(Policy<RandomPolicy>);
static_assert(Policy<FixedRatioPolicy>);
static_assert(Policy<AnyPolicy>);
static_assert(!Policy<int>);

namespace {

// One prompt: per layer, random fp32 Q/K/V of every position (an engine gathers the present rows).
struct Prompt {
    Layout layout;
    ModelShape shape;
    std::vector<std::vector<float>> q, k, v;  // [layer] -> [N, H|Hkv, d]
};

Prompt make_prompt(const std::string& spec, ModelShape shape, std::uint64_t seed) {
    Prompt p{Layout::parse(spec), shape, {}, {}, {}};
    const std::int64_t N = p.layout.n();
    for (std::int64_t l = 0; l < shape.layers; ++l) {
        p.q.push_back(vt::random_buffer<float>(static_cast<std::size_t>(N * shape.heads * shape.head_dim), seed + 10 * l, 1.5f));
        p.k.push_back(vt::random_buffer<float>(static_cast<std::size_t>(N * shape.kv_heads * shape.head_dim), seed + 10 * l + 1, 1.5f));
        p.v.push_back(vt::random_buffer<float>(static_cast<std::size_t>(N * shape.kv_heads * shape.head_dim), seed + 10 * l + 2));
    }
    return p;
}

// The rows of `pos` of an [N, heads, d] buffer.
std::vector<float> gather(const std::vector<float>& x, std::int64_t heads, std::int64_t d, std::span<const std::int64_t> pos) {
    std::vector<float> r;
    r.reserve(pos.size() * static_cast<std::size_t>(heads * d));
    for (auto p : pos) r.insert(r.end(), x.begin() + p * heads * d, x.begin() + (p + 1) * heads * d);
    return r;
}

struct LayerRows {
    std::vector<std::int64_t> pos;
    std::vector<float> q, k, v;
    std::int64_t n() const { return static_cast<std::int64_t>(pos.size()); }
};

LayerRows rows_of(const Prompt& p, std::int64_t l, const std::vector<std::int64_t>& pos) {
    const auto& s = p.shape;
    return {pos, gather(p.q[l], s.heads, s.head_dim, pos), gather(p.k[l], s.kv_heads, s.head_dim, pos),
            gather(p.v[l], s.kv_heads, s.head_dim, pos)};
}

PrefillLayer layer_input(const Prompt& p, std::int64_t l, const LayerRows& r) {
    const auto& s = p.shape;
    return {&p.layout, s, l, View3<const float>(r.q.data(), {r.n(), s.heads, s.head_dim}),
            View3<const float>(r.k.data(), {r.n(), s.kv_heads, s.head_dim}),
            View3<const float>(r.v.data(), {r.n(), s.kv_heads, s.head_dim}), r.pos};
}

// Runs a policy's prefill over every layer the way an engine does; returns the decisions.
template <class P>
std::vector<PrefillDecision> run_prefill(P& pol, const Prompt& p) {
    pol.begin(p.layout, p.shape);
    std::vector<std::int64_t> pos(static_cast<std::size_t>(p.layout.n()));
    std::iota(pos.begin(), pos.end(), std::int64_t{0});
    std::vector<PrefillDecision> out;
    for (std::int64_t l = 0; l < p.shape.layers; ++l) {
        const LayerRows r = rows_of(p, l, pos);
        out.push_back(pol.prefill(layer_input(p, l, r)));
        if (!out.back().sequence.empty()) pos = out.back().sequence;
    }
    return out;
}

std::vector<std::int64_t> iota(std::int64_t n) {
    std::vector<std::int64_t> r(static_cast<std::size_t>(n));
    std::iota(r.begin(), r.end(), std::int64_t{0});
    return r;
}

bool same_mask(const BlockMask& a, const BlockMask& b) {
    return a.n == b.n && a.heads == b.heads && a.q_block == b.q_block && a.k_block == b.k_block &&
           a.q_block_start == b.q_block_start && a.full_offsets == b.full_offsets && a.full_indices == b.full_indices &&
           a.partial_offsets == b.partial_offsets && a.partial_indices == b.partial_indices &&
           a.partial_key_lo == b.partial_key_lo && a.partial_key_hi == b.partial_key_hi &&
           a.head_template == b.head_template && expand_block_mask(a) == expand_block_mask(b);
}

const std::string kSpec = "text:9,image:40,text:5,image:33,text:7";

}  // namespace

TEST_CASE("policy: DensePolicy keeps every present position", "[policy]") {
    const auto p = make_prompt(kSpec, {3, 4, 2, 16}, vt::base_seed());
    DensePolicy pol;
    for (const auto& d : run_prefill(pol, p)) {
        REQUIRE(d.kv.n == p.layout.n());
        REQUIRE(d.kv.indices == std::vector<std::vector<std::int64_t>>{iota(p.layout.n())});
        REQUIRE_FALSE(d.sparse_prefill);
        REQUIRE(d.sequence.empty());
        REQUIRE_FALSE(d.mask.has_value());
    }
    const auto all = TokenSelection::all(p.layout.n() + 1);
    REQUIRE(pol.decode_read(0, 0, all).indices == all.indices);
    REQUIRE_FALSE(pol.decode_observe(0, 0, all, {}).has_value());
}

TEST_CASE("policy: ZipVLPolicy equals simd::zipvl_select in every layer", "[policy][zipvl]") {
    for (const std::int64_t Hkv : {1, 2, 4}) {
        const auto p = make_prompt(kSpec, {3, 4, Hkv, 16}, vt::base_seed() + static_cast<std::uint64_t>(Hkv));
        ZipVLParams P;
        P.probe_recent = 8;
        P.probe_random = 8;
        P.tau = 0.9;
        P.dense_layers = 1;
        P.grouping = Hkv == 2 ? ZipVLGrouping::kv_head : ZipVLGrouping::layer;
        P.unselected = UnselectedRows::attend_selected;
        ZipVLPolicy pol(P);
        const auto ds = run_prefill(pol, p);
        for (std::int64_t l = 0; l < p.shape.layers; ++l) {
            INFO("Hkv " << Hkv << " layer " << l);
            const LayerRows r = rows_of(p, l, iota(p.layout.n()));
            const auto in = layer_input(p, l, r);
            const auto s = simd::zipvl_select(in.q, in.k, p.layout, l, P);
            REQUIRE(ds[l].kv.indices == s.selection.indices);
            REQUIRE(ds[l].kv.n == p.layout.n());
            REQUIRE(ds[l].sparse_prefill == (l >= P.dense_layers));
            REQUIRE(ds[l].unselected == UnselectedRows::attend_selected);
            REQUIRE(ds[l].sequence.empty());
            REQUIRE_FALSE(ds[l].mask.has_value());
        }
    }
}

TEST_CASE("policy: ZipVLPolicy on rows left by an earlier filter maps rows to positions", "[policy][zipvl]") {
    const auto p = make_prompt(kSpec, {1, 4, 2, 16}, vt::base_seed() + 5);
    std::vector<std::int64_t> pos;
    for (std::int64_t i = 0; i < p.layout.n(); ++i)
        if (i % 3 != 1 || p.layout.is_text(i)) pos.push_back(i);
    const LayerRows r = rows_of(p, 0, pos);
    ZipVLParams P;
    P.probe_recent = 4;
    P.probe_random = 4;
    P.keep_text = true;
    ZipVLPolicy pol(P);
    pol.begin(p.layout, p.shape);
    const auto d = pol.prefill(layer_input(p, 0, r));
    const auto in = layer_input(p, 0, r);
    const Layout sub = compact_layout(p.layout, pos);
    REQUIRE(sub.n() == r.n());
    const auto s = simd::zipvl_select(in.q, in.k, sub, 0, P);
    REQUIRE(d.kv.groups() == s.selection.groups());
    for (std::size_t g = 0; g < s.selection.groups(); ++g) {
        std::vector<std::int64_t> mapped;
        for (auto i : s.selection.indices[g]) mapped.push_back(pos[static_cast<std::size_t>(i)]);
        REQUIRE(d.kv.indices[g] == mapped);
        for (auto q : d.kv.indices[g]) REQUIRE(std::binary_search(pos.begin(), pos.end(), q));
        // keep_text: every text position present is kept.
        for (auto q : pos)
            if (p.layout.is_text(q)) REQUIRE(std::binary_search(d.kv.indices[g].begin(), d.kv.indices[g].end(), q));
    }
    d.kv.validate(p.shape.kv_heads, "test");
}

TEST_CASE("policy: compact_layout shortens segments and merges text", "[policy]") {
    const auto L = Layout::parse("text:3,image:4[2x2],text:2,video:2x3,text:1");
    const std::vector<std::int64_t> all = iota(L.n());
    REQUIRE(compact_layout(L, all) == L);
    const std::vector<std::int64_t> some = {0, 1, 2, 7, 8, 9, 10, 11, 12, 13, 14, 15};  // image dropped
    REQUIRE(compact_layout(L, some).to_string() == "text:5,video:2x3,text:1");
    const std::vector<std::int64_t> part = {0, 3, 5, 8, 9, 10, 15};  // video shortened -> image
    REQUIRE(compact_layout(L, part).to_string() == "text:1,image:2,text:1,image:2,text:1");
    const std::vector<std::int64_t> bad = {0, 16};
    REQUIRE_THROWS_AS(compact_layout(L, bad), vlsparse::error);
}

TEST_CASE("policy: AvlPolicy reproduces the direct A-VL driving, prefill and decode", "[policy][avl]") {
    for (const std::int64_t Hkv : {1, 2, 4}) {
        const auto p = make_prompt(kSpec, {4, 4, Hkv, 16}, vt::base_seed() + 20 + static_cast<std::uint64_t>(Hkv));
        AvlParams P;
        P.prefill_filter = 0.25;
        P.filter_layer = 1;
        P.text_rate = Hkv == 2 ? 0.5 : 0.0;
        P.text_min_budget = 4;
        P.text_groups = Hkv == 4 ? AvlTextGroups::per_kv_head : AvlTextGroups::per_query_head;
        P.async_refresh = Hkv == 4;
        AvlPolicy pol(P);
        const auto ds = run_prefill(pol, p);
        // Direct: the same calls by hand, layer by layer.
        std::vector<std::int64_t> pos = iota(p.layout.n());
        std::vector<DecodeSchedule> direct;
        for (std::int64_t l = 0; l < p.shape.layers; ++l) {
            INFO("Hkv " << Hkv << " layer " << l);
            const LayerRows r = rows_of(p, l, pos);
            const auto in = layer_input(p, l, r);
            const auto sc = avl_scatter_scores(simd::avl_scores(in.q, in.k), pos, p.layout.n());
            std::vector<std::vector<std::int64_t>> text;
            if (P.text_rate > 0) {
                std::vector<std::vector<double>> acc;
                for (const auto& a : simd::avl_h2o_scores(in.q, in.k, P.text_groups))
                    acc.push_back(avl_scatter_scores(a, pos, p.layout.n()));
                text = avl_text_h2o(acc, p.layout, P,
                                    P.text_groups == AvlTextGroups::per_query_head ? p.shape.heads / Hkv : 1, pos);
            }
            const auto sel = avl_select(sc, p.layout, P, pos, text);
            REQUIRE(ds[l].kv.indices == sel.kept.indices);
            REQUIRE_FALSE(ds[l].sparse_prefill);
            REQUIRE_FALSE(ds[l].mask.has_value());
            REQUIRE(pol.schedule(l).core() == sel.core);
            direct.emplace_back(sel, P);
            if (l == P.filter_layer) {
                const auto seq = avl_prefill_filter(sc, p.layout, P, pos);
                REQUIRE(ds[l].sequence == seq);
                REQUIRE(seq.size() < pos.size());
                pos = seq;
            } else {
                REQUIRE(ds[l].sequence.empty());
            }
        }
        // Decode 10 steps: caches hold the kept sets + decode tokens; random head-mean attention.
        vlsparse::SplitMix64 rng(vt::base_seed() + 99);
        const std::int64_t N = p.layout.n();
        for (std::int64_t t = 0; t < 10; ++t) {
            for (std::int64_t l = 0; l < p.shape.layers; ++l) {
                INFO("Hkv " << Hkv << " layer " << l << " step " << t);
                TokenSelection cached = ds[l].kv;
                cached.n = N + t + 1;
                for (auto& li : cached.indices)
                    for (std::int64_t q = N; q <= N + t; ++q) li.push_back(q);
                const TokenSelection read = pol.decode_read(l, t, cached);
                DecodeSchedule& s = direct[static_cast<std::size_t>(l)];
                s.begin_step(t);
                const TokenSelection want = s.positions(t, N + t + 1);
                REQUIRE(read.indices == want.indices);
                // Calling decode_read twice for one step is harmless.
                REQUIRE(pol.decode_read(l, t, cached).indices == want.indices);
                std::vector<std::vector<double>> attn;
                for (const auto& li : read.indices) {
                    std::vector<double> a(li.size());
                    for (auto& x : a) x = std::floor(rng.uniform() * 64.0) / 64.0;  // ties on purpose
                    attn.push_back(a);
                }
                REQUIRE_FALSE(pol.decode_observe(l, t, read, attn).has_value());
                if (s.splits() && s.is_refresh(t)) {
                    std::vector<double> score(static_cast<std::size_t>(N + t + 1), 0.0);
                    for (std::size_t g = 0; g < read.groups(); ++g)
                        for (std::size_t i = 0; i < read.indices[g].size(); ++i) score[read.indices[g][i]] += attn[g][i];
                    s.refresh(t, [&](std::int64_t q) { return score[q] / static_cast<double>(read.groups()); });
                }
            }
        }
        for (std::int64_t l = 0; l < p.shape.layers; ++l) REQUIRE(pol.schedule(l).core() == direct[l].core());
    }
}

TEST_CASE("policy: AvlPolicy decode reads are restricted to the cache", "[policy][avl]") {
    const auto p = make_prompt(kSpec, {1, 4, 2, 16}, vt::base_seed() + 31);
    AvlPolicy pol;
    const auto ds = run_prefill(pol, p);
    const std::int64_t N = p.layout.n();
    TokenSelection cached = ds[0].kv;
    cached.indices[0].erase(cached.indices[0].begin());  // the engine evicted one more row
    cached.indices[0].push_back(N);
    cached.n = N + 1;
    const auto read = pol.decode_read(0, 0, cached);
    REQUIRE(read.indices == cached.indices);
    REQUIRE_THROWS_AS(pol.decode_read(1, 0, cached), vlsparse::error);  // no such layer
}

TEST_CASE("policy: BlindSightPolicy masks equal make_block_mask per layer", "[policy][blindsight]") {
    const ModelShape shape{3, 4, 2, 16};
    const auto p = make_prompt(kSpec, shape, vt::base_seed() + 40);
    HeadMap m;
    m.layers = shape.layers;
    m.heads = shape.heads;
    m.kv_heads = shape.kv_heads;
    m.head_dim = shape.head_dim;
    vlsparse::SplitMix64 rng(vt::base_seed() + 41);
    for (std::int64_t i = 0; i < shape.layers * shape.heads; ++i) m.map.push_back(static_cast<MaskTemplate>(rng.below(4)));
    BlindSightParams P;
    P.mask.sink_fraction = 0.2;
    for (const bool forced : {false, true}) {
        BlindSightPolicy pol(m, P);
        pol.q_block = 16;
        pol.k_block = 8;
        pol.uniform_per_kv_group = forced;
        const auto ds = run_prefill(pol, p);
        const MaskContext ctx = make_mask_context(p.layout, P.mask);
        for (std::int64_t l = 0; l < shape.layers; ++l) {
            INFO("layer " << l << " forced " << forced);
            std::vector<MaskTemplate> t(m.layer(l).begin(), m.layer(l).end());
            if (forced) t = uniform_per_kv_group(t, shape.kv_heads);
            REQUIRE(ds[l].mask.has_value());
            REQUIRE(same_mask(*ds[l].mask, make_block_mask(ctx, t, 16, 8)));
            REQUIRE(ds[l].kv.indices == std::vector<std::vector<std::int64_t>>{iota(p.layout.n())});
            REQUIRE_FALSE(ds[l].sparse_prefill);
        }
    }
    BlindSightPolicy uni(MaskTemplate::document_sink, P);
    const auto du = run_prefill(uni, p);
    const std::vector<MaskTemplate> all(static_cast<std::size_t>(shape.heads), MaskTemplate::document_sink);
    REQUIRE(same_mask(*du[2].mask, make_block_mask(make_mask_context(p.layout, P.mask), all)));
    // A head map of another shape is refused.
    HeadMap wrong = m;
    wrong.layers = 2;
    wrong.map.resize(8);
    BlindSightPolicy bad(wrong, P);
    REQUIRE_THROWS_AS(bad.begin(p.layout, shape), vlsparse::error);
}

TEST_CASE("policy: AnyPolicy forwards to the held policy and copies it", "[policy]") {
    const auto p = make_prompt(kSpec, {4, 4, 2, 16}, vt::base_seed() + 50);
    AvlParams A;
    A.prefill_filter = 0.5;
    A.filter_layer = 2;
    ZipVLParams Z;
    Z.probe_recent = 8;
    Z.probe_random = 8;
    std::vector<AnyPolicy> pols = {DensePolicy{}, ZipVLPolicy(Z), AvlPolicy(A), BlindSightPolicy(MaskTemplate::sink),
                                   H2OPolicy{}, SnapKVPolicy{}, StreamingLLMPolicy{}, FastVPolicy{}, RandomPolicy{},
                                   FixedRatioPolicy{}};
    const std::vector<std::string_view> names = {"dense", "zipvl", "avl", "blindsight", "h2o", "snapkv",
                                                 "streamingllm", "fastv", "random", "fixed_ratio"};
    REQUIRE(pols.size() == names.size());
    for (std::size_t i = 0; i < pols.size(); ++i) {
        INFO(names[i]);
        REQUIRE(pols[i].name() == names[i]);
        AnyPolicy copy = pols[i];
        const auto a = run_prefill(pols[i], p);
        const auto b = run_prefill(copy, p);
        REQUIRE(a.size() == b.size());
        for (std::size_t l = 0; l < a.size(); ++l) {
            REQUIRE(a[l].kv.indices == b[l].kv.indices);
            REQUIRE(a[l].sequence == b[l].sequence);
            REQUIRE(a[l].sparse_prefill == b[l].sparse_prefill);
            REQUIRE(a[l].mask.has_value() == b[l].mask.has_value());
            a[l].kv.validate(p.shape.kv_heads, "test");
        }
    }
    // The direct adapter gives the same answer as the erased one.
    AvlPolicy direct(A);
    const auto d = run_prefill(direct, p);
    const auto e = run_prefill(pols[2], p);
    for (std::size_t l = 0; l < d.size(); ++l) REQUIRE(d[l].kv.indices == e[l].kv.indices);
    REQUIRE(pols[2].target<AvlPolicy>() != nullptr);
    REQUIRE(pols[2].target<ZipVLPolicy>() == nullptr);
    AnyPolicy moved = std::move(pols[0]);
    REQUIRE(moved.name() == "dense");
}

TEST_CASE("policy: decode_wants_attention says when decode_observe reads the attention", "[policy]") {
    const auto p = make_prompt(kSpec, {2, 4, 2, 16}, vt::base_seed() + 51);
    AvlParams A;
    A.refresh_every = 3;
    std::vector<AnyPolicy> pols = {DensePolicy{}, ZipVLPolicy{}, AvlPolicy(A), H2OPolicy{}, StreamingLLMPolicy{},
                                   SnapKVPolicy{}};
    for (auto& pol : pols) (void)run_prefill(pol, p);
    for (std::int64_t t = 0; t < 7; ++t) {
        INFO("step " << t);
        CHECK_FALSE(pols[0].decode_wants_attention(0, t));  // DecodeReadsAll
        CHECK_FALSE(pols[1].decode_wants_attention(1, t));
        CHECK(pols[2].decode_wants_attention(0, t) == (t % 3 == 0));  // A-VL: refresh steps re-rank the core set
        CHECK(pols[3].decode_wants_attention(1, t));                  // H2O (no member): every step
        CHECK_FALSE(pols[4].decode_wants_attention(0, t));            // StreamingLLM evicts by position
        CHECK_FALSE(pols[5].decode_wants_attention(0, t));
    }
    static_assert(AttentionAwarePolicy<AvlPolicy> && AttentionAwarePolicy<DensePolicy>);
    static_assert(!AttentionAwarePolicy<H2OPolicy>);
    // A-VL without a split schedule (K = 0: every step reads every kept row) never re-ranks.
    A.refresh_every = 0;
    AnyPolicy flat = AvlPolicy(A);
    (void)run_prefill(flat, p);
    CHECK_FALSE(flat.decode_wants_attention(0, 0));
}

TEST_CASE("policy: bad prefill input is a clear error", "[policy][errors]") {
    const auto p = make_prompt(kSpec, {2, 4, 2, 16}, vt::base_seed() + 60);
    DensePolicy pol;
    pol.begin(p.layout, p.shape);
    const LayerRows r = rows_of(p, 0, iota(p.layout.n()));
    PrefillLayer in = layer_input(p, 0, r);
    in.layout = nullptr;
    REQUIRE_THROWS_AS(pol.prefill(in), vlsparse::error);
    in = layer_input(p, 0, r);
    in.layer = 2;
    REQUIRE_THROWS_AS(pol.prefill(in), vlsparse::error);
    in = layer_input(p, 0, r);
    in.shape.heads = 8;
    REQUIRE_THROWS_AS(pol.prefill(in), vlsparse::error);
    std::vector<std::int64_t> unsorted = iota(p.layout.n());
    std::swap(unsorted[3], unsorted[4]);
    in = layer_input(p, 0, r);
    in.positions = unsorted;
    REQUIRE_THROWS_AS(pol.prefill(in), vlsparse::error);
    const std::vector<std::int64_t> short_pos = iota(p.layout.n() - 1);
    in.positions = short_pos;
    REQUIRE_THROWS_AS(pol.prefill(in), vlsparse::error);
    AvlParams A;
    A.prefill_filter = 0.5;
    A.filter_layer = 5;  // beyond the model's 2 layers
    AvlPolicy avl(A);
    REQUIRE_THROWS_AS(avl.begin(p.layout, p.shape), vlsparse::error);
}
