// vlsparse/policies/policy.hpp -- one policy interface for every algorithm.
//
// A policy answers three questions an engine (or the simulator) asks, layer by layer:
//   prefill:  which positions each layer's KV cache keeps after the prefill, whether the layer's
//             prefill attention is token-sparse or masked, and which tokens stay in the sequence for
//             the later layers                                           -> PrefillDecision
//   decode:   which cached positions decode step t of layer l reads      -> TokenSelection
//   feedback: after the step, the step's head-mean attention; the policy may evict (H2O)
// The concepts PrefillPolicy, DecodePolicy and Policy say it in C++20; AnyPolicy erases the type for
// a runtime choice. Adapters here turn every algorithm of the library into a Policy: DensePolicy,
// ZipVLPolicy, AvlPolicy, BlindSightPolicy and the baselines (H2OPolicy, SnapKVPolicy,
// StreamingLLMPolicy, FastVPolicy, RandomPolicy, FixedRatioPolicy). Each adapter calls the library's
// own functions (SIMD path) exactly as an engine would; tests/policy_test.cpp checks that.
//
// Engine loop (see docs/baselines.md, "The policy interface"):
//   policy.begin(layout, shape);
//   positions = 0..n-1
//   for l in 0..L-1: d = policy.prefill({&layout, shape, l, q_l, k_l, v_l, positions});
//                    run the layer's prefill (dense / d.mask / token-sparse over d.kv), fill the cache,
//                    cache.keep(d.kv); if (!d.sequence.empty()) positions = d.sequence (rows dropped)
//   for t = 0, 1, ...: for l: append the token's K/V; read = policy.decode_read(l, t, cached_l);
//                    attend over `read`; if (auto k = policy.decode_observe(l, t, read, attn)) cache.keep(*k)
// Include: <vlsparse/policies/policy.hpp> (or <vlsparse/vlsparse.hpp>).
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "vlsparse/core/error.hpp"
#include "vlsparse/core/layout.hpp"
#include "vlsparse/core/model_shape.hpp"
#include "vlsparse/core/selection.hpp"
#include "vlsparse/core/tensor.hpp"
#include "vlsparse/masks/block_mask.hpp"
#include "vlsparse/masks/templates.hpp"
#include "vlsparse/policies/avl.hpp"
#include "vlsparse/policies/baselines.hpp"
#include "vlsparse/policies/blindsight.hpp"
#include "vlsparse/policies/scoring.hpp"
#include "vlsparse/policies/zipvl.hpp"

namespace vlsparse {

// PrefillLayer (what a policy sees of one prefill layer) and PrefillScoring: policies/scoring.hpp.

// What a policy decides for one prefill layer. Positions are absolute (kv.n = layout->n()).
struct PrefillDecision {
    TokenSelection kv;               // positions (absolute) this layer's KV cache keeps after prefill;
                                     // every present position = no eviction. Shared or per KV head.
    bool sparse_prefill = false;     // this layer's prefill attention reads only the `kv` keys
                                     // (ZipVL's token-sparse prefill; rows outside per `unselected`)
    std::vector<std::int64_t> sequence;  // non-empty: the positions that stay in the sequence for
                                         // the layers after this one (FastV, A-VL prefill filter)
    std::optional<BlockMask> mask;   // this layer's prefill attention mask over the layer's rows
                                     // (BlindSight, PureKV ST); nullopt = causal dense
    UnselectedRows unselected = UnselectedRows::zero;  // with sparse_prefill: output of rows outside kv
};

// Prefill selection: called once per prompt per layer, in layer order 0..L-1, after begin().
template <class P>
concept PrefillPolicy = requires(P& p, const P& cp, const Layout& layout, const ModelShape& shape,
                                 const PrefillLayer& in) {
    { cp.name() } -> std::convertible_to<std::string_view>;
    p.begin(layout, shape);                                   // new prompt: reset state
    { p.prefill(in) } -> std::same_as<PrefillDecision>;
};

// Decode: which cached positions step t of `layer` reads, and feedback after the step.
// `cached` = the positions the layer's cache holds now (ascending; per KV head or shared; the current
// token's position included; cached.n = the sequence length so far), `attn` = the step's attention
// probabilities over the positions read, mean over query heads (attn[g] parallel to the read list of
// group g: for a shared list one vector, the mean over all query heads; for per-KV-head lists one
// vector per KV head, the mean over its query heads). The policy may ignore it.
// Steps count from 0 (the first generated token) in each layer and increase.
template <class P>
concept DecodePolicy = requires(P& p, std::int64_t layer, std::int64_t step, const TokenSelection& cached,
                                const TokenSelection& read, std::span<const std::vector<double>> attn) {
    { p.decode_read(layer, step, cached) } -> std::same_as<TokenSelection>;
    { p.decode_observe(layer, step, read, attn) } -> std::same_as<std::optional<TokenSelection>>;
        // returns the positions to keep when the policy evicts during decode (H2O), else nullopt
};

template <class P>
concept Policy = PrefillPolicy<P> && DecodePolicy<P>;

// Optional: whether decode_observe(layer, step, ...) will read its `attn` argument. An engine may skip
// computing the step's probabilities when it returns false (and pass empty vectors); a policy without
// this member is asked for them every step.
template <class P>
concept AttentionAwarePolicy = requires(const P& cp, std::int64_t layer, std::int64_t step) {
    { cp.decode_wants_attention(layer, step) } -> std::convertible_to<bool>;
};

// Defaults a policy can inherit: no decode behaviour (read everything cached, never evict, no use for
// the step's attention). A policy that inherits it and reads `attn` in its own decode_observe says so
// in its own decode_wants_attention.
struct DecodeReadsAll {
    TokenSelection decode_read(std::int64_t, std::int64_t, const TokenSelection& cached) const { return cached; }
    bool decode_wants_attention(std::int64_t, std::int64_t) const { return false; }
    std::optional<TokenSelection> decode_observe(std::int64_t, std::int64_t, const TokenSelection&,
                                                 std::span<const std::vector<double>>) {
        return std::nullopt;
    }
};

// ---------------------------------------------------------------------------------------------------
// Helpers shared by the adapters (and useful to engines).
namespace detail {

// Checks a PrefillLayer and returns its row positions (0..n-1 when `positions` is empty).
inline std::vector<std::int64_t> check_prefill_layer(const PrefillLayer& in, const char* fn) {
    require(in.layout != nullptr, fn, "layout is null, expected the prompt's layout");
    in.shape.validate(fn);
    check_qkv(in.q, in.k, in.v, fn);
    const std::int64_t n = in.q.shape[0], N = in.layout->n();
    require(in.k.shape[0] == n, fn, "q has ", n, " rows and k has ", in.k.shape[0], ", expected equal (prefill)");
    require(in.q.shape[1] == in.shape.heads && in.k.shape[1] == in.shape.kv_heads && in.q.shape[2] == in.shape.head_dim,
            fn, "q [", n, ", ", in.q.shape[1], ", ", in.q.shape[2], "] and k [", in.k.shape[0], ", ", in.k.shape[1], ", ",
            in.k.shape[2], "] do not match the model shape (H = ", in.shape.heads, ", H_kv = ", in.shape.kv_heads,
            ", d = ", in.shape.head_dim, ")");
    require(in.layer >= 0 && in.layer < in.shape.layers, fn, "layer = ", in.layer, ", expected 0 <= layer < ",
            in.shape.layers);
    std::vector<std::int64_t> pos;
    if (in.positions.empty()) {
        require(n == N, fn, "the layer has ", n, " rows but the layout covers ", N,
                " tokens; pass `positions` when earlier layers dropped tokens");
        pos.resize(static_cast<std::size_t>(n));
        for (std::int64_t i = 0; i < n; ++i) pos[static_cast<std::size_t>(i)] = i;
        return pos;
    }
    require(static_cast<std::int64_t>(in.positions.size()) == n, fn, "positions has ", in.positions.size(),
            " entries, expected one per row (", n, ")");
    for (std::size_t i = 0; i < in.positions.size(); ++i)
        require(in.positions[i] >= 0 && in.positions[i] < N && (i == 0 || in.positions[i] > in.positions[i - 1]), fn,
                "positions[", i, "] = ", in.positions[i], ", expected ascending unique positions in [0, ", N, ")");
    pos.assign(in.positions.begin(), in.positions.end());
    return pos;
}

inline bool is_identity(std::span<const std::int64_t> pos) {
    for (std::size_t i = 0; i < pos.size(); ++i)
        if (pos[i] != static_cast<std::int64_t>(i)) return false;
    return true;
}

}  // namespace detail

// The layout of the rows that remain: each segment shortened to its present positions, empty segments
// dropped, neighbouring text runs merged. A shortened image loses its grid; a shortened video becomes
// an image segment (its frame structure is gone). Equal to `layout` when every position is present.
inline Layout compact_layout(const Layout& layout, std::span<const std::int64_t> positions) {
    constexpr const char* fn = "compact_layout";
    detail::require(!positions.empty(), fn, "no positions, expected at least one");
    std::vector<Segment> segs;
    std::size_t i = 0;
    std::int64_t start = 0;
    for (const auto& s : layout.segments()) {
        std::int64_t c = 0;
        while (i < positions.size() && positions[i] < s.end()) {
            detail::require(positions[i] >= s.start && (i == 0 || positions[i] > positions[i - 1]), fn, "positions[", i,
                            "] = ", positions[i], ", expected ascending unique positions inside the layout");
            ++c, ++i;
        }
        if (c == 0) continue;
        Segment t = s;
        t.start = start;
        if (c != s.length) {
            t = s.kind == SegmentKind::text ? Segment::text(start, c) : Segment::image(start, c);
        }
        if (t.kind == SegmentKind::text && !segs.empty() && segs.back().kind == SegmentKind::text)
            segs.back().length += c;
        else
            segs.push_back(t);
        start += c;
    }
    detail::require(i == positions.size(), fn, "position ", i < positions.size() ? positions[i] : -1,
                    " lies outside the layout of ", layout.n(), " tokens");
    return Layout(std::move(segs));
}

// Maps a selection over rows [0, rows) to absolute positions (pos[row]) in [0, n).
inline TokenSelection rows_to_positions(const TokenSelection& s, std::span<const std::int64_t> pos, std::int64_t n) {
    TokenSelection r;
    r.n = n;
    r.indices.resize(s.indices.size());
    for (std::size_t g = 0; g < s.indices.size(); ++g) {
        r.indices[g].reserve(s.indices[g].size());
        for (auto i : s.indices[g]) r.indices[g].push_back(pos[static_cast<std::size_t>(i)]);
    }
    r.scores.resize(s.scores.size());
    for (std::size_t g = 0; g < s.scores.size(); ++g) {
        r.scores[g].assign(static_cast<std::size_t>(n), 0.0);
        for (std::size_t i = 0; i < s.scores[g].size() && i < pos.size(); ++i) r.scores[g][static_cast<std::size_t>(pos[i])] = s.scores[g][i];
    }
    return r;
}

// Positions in both selections, group by group (a shared list meets every group). Shared when both are.
inline TokenSelection intersect_selections(const TokenSelection& a, const TokenSelection& b) {
    constexpr const char* fn = "intersect_selections";
    detail::require(a.shared() || b.shared() || a.groups() == b.groups(), fn, "selections have ", a.groups(), " and ",
                    b.groups(), " lists, expected equal counts or a shared list");
    TokenSelection r;
    r.n = std::max(a.n, b.n);
    const std::size_t G = std::max(a.groups(), b.groups());
    r.indices.resize(G);
    for (std::size_t g = 0; g < G; ++g) {
        const auto x = a.for_kv_head(static_cast<std::int64_t>(g)), y = b.for_kv_head(static_cast<std::int64_t>(g));
        std::set_intersection(x.begin(), x.end(), y.begin(), y.end(), std::back_inserter(r.indices[g]));
    }
    return r;
}

// ---------------------------------------------------------------------------------------------------
// Type erasure: AnyPolicy holds any Policy by value (copyable when the policy is).
class AnyPolicy {
public:
    template <class P>
        requires(!std::same_as<std::remove_cvref_t<P>, AnyPolicy> && Policy<P>)
    AnyPolicy(P p) : self_(std::make_unique<Model<P>>(std::move(p))) {}  // implicit

    AnyPolicy(const AnyPolicy& o) : self_(o.self_ ? o.self_->clone() : nullptr) {}
    AnyPolicy(AnyPolicy&&) noexcept = default;
    AnyPolicy& operator=(const AnyPolicy& o) {
        if (this != &o) self_ = o.self_ ? o.self_->clone() : nullptr;
        return *this;
    }
    AnyPolicy& operator=(AnyPolicy&&) noexcept = default;

    std::string_view name() const { return get().name(); }
    void begin(const Layout& layout, const ModelShape& shape) { get().begin(layout, shape); }
    PrefillDecision prefill(const PrefillLayer& in) { return get().prefill(in); }
    TokenSelection decode_read(std::int64_t layer, std::int64_t step, const TokenSelection& cached) {
        return get().decode_read(layer, step, cached);
    }
    std::optional<TokenSelection> decode_observe(std::int64_t layer, std::int64_t step, const TokenSelection& read,
                                                 std::span<const std::vector<double>> attn) {
        return get().decode_observe(layer, step, read, attn);
    }
    // The held policy's decode_wants_attention, or true when it has none (AttentionAwarePolicy).
    bool decode_wants_attention(std::int64_t layer, std::int64_t step) const {
        return get().decode_wants_attention(layer, step);
    }

    // The held policy when it is a P, else nullptr.
    template <class P>
    P* target() {
        auto* m = dynamic_cast<Model<P>*>(self_.get());
        return m ? &m->p : nullptr;
    }
    template <class P>
    const P* target() const {
        auto* m = dynamic_cast<const Model<P>*>(self_.get());
        return m ? &m->p : nullptr;
    }

private:
    struct Concept {
        virtual ~Concept() = default;
        virtual std::unique_ptr<Concept> clone() const = 0;
        virtual std::string_view name() const = 0;
        virtual void begin(const Layout&, const ModelShape&) = 0;
        virtual PrefillDecision prefill(const PrefillLayer&) = 0;
        virtual TokenSelection decode_read(std::int64_t, std::int64_t, const TokenSelection&) = 0;
        virtual std::optional<TokenSelection> decode_observe(std::int64_t, std::int64_t, const TokenSelection&,
                                                             std::span<const std::vector<double>>) = 0;
        virtual bool decode_wants_attention(std::int64_t, std::int64_t) const = 0;
    };
    template <class P>
    struct Model final : Concept {
        P p;
        explicit Model(P x) : p(std::move(x)) {}
        std::unique_ptr<Concept> clone() const override {
            if constexpr (std::copy_constructible<P>) return std::make_unique<Model<P>>(p);
            else throw error("AnyPolicy", "the held policy is not copyable");
        }
        std::string_view name() const override { return p.name(); }
        void begin(const Layout& l, const ModelShape& s) override { p.begin(l, s); }
        PrefillDecision prefill(const PrefillLayer& in) override { return p.prefill(in); }
        TokenSelection decode_read(std::int64_t l, std::int64_t t, const TokenSelection& c) override {
            return p.decode_read(l, t, c);
        }
        std::optional<TokenSelection> decode_observe(std::int64_t l, std::int64_t t, const TokenSelection& r,
                                                     std::span<const std::vector<double>> a) override {
            return p.decode_observe(l, t, r, a);
        }
        bool decode_wants_attention(std::int64_t l, std::int64_t t) const override {
            if constexpr (AttentionAwarePolicy<P>) return p.decode_wants_attention(l, t);
            else return true;
        }
    };
    Concept& get() const {
        detail::require(self_ != nullptr, "AnyPolicy", "empty (moved-from) policy");
        return *self_;
    }
    std::unique_ptr<Concept> self_;
};

// ---------------------------------------------------------------------------------------------------
// Adapters. Each keeps the prompt's layout and shape from begin() and checks every PrefillLayer.
// prefill() is a member template taking a PrefillLayer only: the SIMD code it calls is then compiled
// where a program uses the adapter, not in every translation unit that includes this header (about
// 1 s of the umbrella header's compile time, docs/performance.md "Compile time").

// Keeps everything, no mask, dense prefill and decode.
struct DensePolicy : DecodeReadsAll {
    std::string_view name() const { return "dense"; }
    void begin(const Layout&, const ModelShape& shape) { shape.validate("DensePolicy::begin"); }
    template <std::same_as<PrefillLayer> In = PrefillLayer>
    PrefillDecision prefill(const In& in) {
        PrefillDecision d;
        d.kv.n = in.layout ? in.layout->n() : 0;
        d.kv.indices.push_back(detail::check_prefill_layer(in, "DensePolicy::prefill"));
        return d;
    }
};

// ZipVL: simd::zipvl_select on the layer's rows; the layer's prefill is token-sparse over the kept
// set (sparse_prefill = true, rows outside per params.unselected) and the cache keeps it. Dense
// layers (layer < params.dense_layers) keep everything with a dense prefill. When earlier layers
// dropped rows, ZipVL runs on the remaining rows with their compacted layout (compact_layout).
struct ZipVLPolicy : DecodeReadsAll {
    ZipVLParams params;
    ZipVLPolicy() = default;
    explicit ZipVLPolicy(const ZipVLParams& p) : params(p) {}

    std::string_view name() const { return "zipvl"; }
    void begin(const Layout&, const ModelShape& shape) {
        shape.validate("ZipVLPolicy::begin");
        detail::check_zipvl_params(params, "ZipVLPolicy::begin");
        detail::check_zipvl_modes(params, "ZipVLPolicy::begin");
    }
    template <std::same_as<PrefillLayer> In = PrefillLayer>
    PrefillDecision prefill(const In& in) {
        const auto pos = detail::check_prefill_layer(in, "ZipVLPolicy::prefill");
        const bool identity = detail::is_identity(pos) && static_cast<std::int64_t>(pos.size()) == in.layout->n();
        const Layout rows_layout = identity ? *in.layout : compact_layout(*in.layout, pos);
        const ZipVLSelection s = in.scoring ? in.scoring->zipvl_select(in, rows_layout, params)
                                             : simd::zipvl_select(in.q, in.k, rows_layout, in.layer, params);
        PrefillDecision d;
        d.kv = rows_to_positions(s.selection, pos, in.layout->n());
        d.sparse_prefill = zipvl_sparse_prefill(s, params);  // false: dense or eviction-only (prefill = dense)
        d.unselected = params.unselected;
        return d;
    }
};

// A-VL, driven the way examples/avl_decode_loop.cpp and docs/avl.md drive it, in every layer:
//   s = simd::avl_scores(q, k) (last row's head-mean attention), spread over [0, n) by position;
//   at layer filter_layer (when prefill_filter > 0): sequence = avl_prefill_filter(s, layout, P, present);
//   with text_rate > 0: text = avl_text_h2o(simd::avl_h2o_scores(q, k, text_groups), ...);
//   kv = avl_select(s, layout, P, present, text).kept, and a DecodeSchedule per layer.
// Decode: step t reads schedule.positions(t, cached.n) (intersected with `cached`); after a refresh
// step the head-mean attention of the step re-ranks the core set (schedule.refresh).
struct AvlPolicy {
    AvlParams params;
    AttentionOptions attention;
    AvlPolicy() = default;
    explicit AvlPolicy(const AvlParams& p, const AttentionOptions& opt = {}) : params(p), attention(opt) {}

    std::string_view name() const { return "avl"; }
    void begin(const Layout&, const ModelShape& shape) {
        constexpr const char* fn = "AvlPolicy::begin";
        shape.validate(fn);
        params.validate(fn);
        detail::require(params.prefill_filter == 0.0 || params.filter_layer < shape.layers, fn, "filter_layer = ",
                        params.filter_layer, " with prefill_filter = ", params.prefill_filter,
                        ", expected a layer < ", shape.layers);
        schedules_.assign(static_cast<std::size_t>(shape.layers), DecodeSchedule{});
        ready_.assign(static_cast<std::size_t>(shape.layers), 0);
        begun_.assign(static_cast<std::size_t>(shape.layers), -1);
    }
    template <std::same_as<PrefillLayer> In = PrefillLayer>
    PrefillDecision prefill(const In& in) {
        constexpr const char* fn = "AvlPolicy::prefill";
        const auto pos = detail::check_prefill_layer(in, fn);
        detail::require(static_cast<std::size_t>(in.layer) < schedules_.size(), fn, "layer ", in.layer,
                        " was not announced by begin() (", schedules_.size(), " layers)");
        const Layout& layout = *in.layout;
        const std::int64_t n = layout.n();
        const auto rows = in.scoring ? in.scoring->last_row_scores(in, attention) : simd::avl_scores(in.q, in.k, attention);
        const auto scores = avl_scatter_scores(rows, pos, n);
        PrefillDecision d;
        if (params.prefill_filter > 0.0 && in.layer == params.filter_layer)
            d.sequence = avl_prefill_filter(scores, layout, params, pos);
        std::vector<std::vector<std::int64_t>> text;
        if (params.text_rate > 0.0) {
            const auto acc_rows = in.scoring ? in.scoring->avl_h2o_scores(in, params.text_groups, attention)
                                             : simd::avl_h2o_scores(in.q, in.k, params.text_groups, attention);
            std::vector<std::vector<double>> acc;
            for (const auto& a : acc_rows) acc.push_back(avl_scatter_scores(a, pos, n));
            const std::int64_t group =
                params.text_groups == AvlTextGroups::per_query_head ? in.shape.heads / in.shape.kv_heads : 1;
            text = avl_text_h2o(acc, layout, params, group, pos);
        }
        AvlSelection sel = avl_select(scores, layout, params, pos, text);
        d.kv = sel.kept;
        schedules_[static_cast<std::size_t>(in.layer)] = DecodeSchedule(sel, params);
        ready_[static_cast<std::size_t>(in.layer)] = 1;
        begun_[static_cast<std::size_t>(in.layer)] = -1;
        return d;
    }
    TokenSelection decode_read(std::int64_t layer, std::int64_t step, const TokenSelection& cached) {
        DecodeSchedule& s = schedule_for(layer, "AvlPolicy::decode_read");
        if (step > begun_[static_cast<std::size_t>(layer)]) {
            s.begin_step(step);
            begun_[static_cast<std::size_t>(layer)] = step;
        }
        return intersect_selections(s.positions(step, cached.n), cached);
    }
    // The attention re-ranks the core set after a refresh step only.
    bool decode_wants_attention(std::int64_t layer, std::int64_t step) const {
        if (layer < 0 || static_cast<std::size_t>(layer) >= schedules_.size() || !ready_[static_cast<std::size_t>(layer)])
            return true;  // decode_observe reports the error
        const DecodeSchedule& s = schedules_[static_cast<std::size_t>(layer)];
        return s.splits() && s.is_refresh(step);
    }
    std::optional<TokenSelection> decode_observe(std::int64_t layer, std::int64_t step, const TokenSelection& read,
                                                 std::span<const std::vector<double>> attn) {
        constexpr const char* fn = "AvlPolicy::decode_observe";
        DecodeSchedule& s = schedule_for(layer, fn);
        if (!s.splits() || !s.is_refresh(step)) return std::nullopt;
        detail::require(attn.size() == read.groups(), fn, "attn has ", attn.size(), " vectors, expected one per read list (",
                        read.groups(), ")");
        // Head mean over all query heads: the mean over the groups' head means (equal group sizes).
        std::vector<double> score(static_cast<std::size_t>(read.n), 0.0);
        for (std::size_t g = 0; g < read.groups(); ++g) {
            detail::require(attn[g].size() == read.indices[g].size(), fn, "attn[", g, "] has ", attn[g].size(),
                            " entries, expected ", read.indices[g].size(), " (one per position read)");
            for (std::size_t i = 0; i < attn[g].size(); ++i) score[static_cast<std::size_t>(read.indices[g][i])] += attn[g][i];
        }
        const double G = static_cast<double>(read.groups());
        s.refresh(step, [&](std::int64_t p) { return score[static_cast<std::size_t>(p)] / G; });
        return std::nullopt;
    }
    // The layer's schedule (after its prefill).
    const DecodeSchedule& schedule(std::int64_t layer) const {
        detail::require(layer >= 0 && static_cast<std::size_t>(layer) < schedules_.size() && ready_[static_cast<std::size_t>(layer)],
                        "AvlPolicy::schedule", "layer ", layer, " has no schedule (prefill it first)");
        return schedules_[static_cast<std::size_t>(layer)];
    }

private:
    DecodeSchedule& schedule_for(std::int64_t layer, const char* fn) {
        detail::require(layer >= 0 && static_cast<std::size_t>(layer) < schedules_.size() && ready_[static_cast<std::size_t>(layer)],
                        fn, "layer ", layer, " has no schedule; call begin() and prefill() for it first");
        return schedules_[static_cast<std::size_t>(layer)];
    }
    std::vector<DecodeSchedule> schedules_;
    std::vector<std::uint8_t> ready_;
    std::vector<std::int64_t> begun_;
};

// BlindSight: per-layer per-head templates from a HeadMap (or one template for every head of every
// layer) -> the layer's prefill attention mask, make_block_mask(make_mask_context(layout, params.mask),
// templates, q_block, k_block). Nothing is evicted. When earlier layers dropped rows, the mask is built
// on the compacted layout of the remaining rows (sinks recomputed from the shortened images).
struct BlindSightPolicy : DecodeReadsAll {
    std::optional<HeadMap> map;                 // per (layer, head) templates; nullopt: `uniform` everywhere
    MaskTemplate uniform = MaskTemplate::dense;
    BlindSightParams params;
    std::int64_t q_block = 128, k_block = 128;
    bool uniform_per_kv_group = false;          // force one template per KV group (the union of its heads')

    BlindSightPolicy() = default;
    explicit BlindSightPolicy(HeadMap m, const BlindSightParams& p = {}) : map(std::move(m)), params(p) {}
    explicit BlindSightPolicy(MaskTemplate t, const BlindSightParams& p = {}) : uniform(t), params(p) {}

    std::string_view name() const { return "blindsight"; }
    void begin(const Layout&, const ModelShape& shape) {
        constexpr const char* fn = "BlindSightPolicy::begin";
        shape.validate(fn);
        check_blindsight_params(params, fn);
        detail::require(q_block >= 1 && k_block >= 1, fn, "block sizes ", q_block, " x ", k_block, ", expected >= 1");
        if (map) {
            detail::require(map->layers == shape.layers && map->heads == shape.heads, fn, "head map is for ", map->layers,
                            " layers x ", map->heads, " heads, the model has ", shape.layers, " x ", shape.heads);
            detail::require(static_cast<std::int64_t>(map->map.size()) == map->layers * map->heads, fn, "head map holds ",
                            map->map.size(), " templates, expected ", map->layers * map->heads);
        }
    }
    // The templates of layer `layer` (one per query head).
    std::vector<MaskTemplate> templates(std::int64_t layer, const ModelShape& shape) const {
        std::vector<MaskTemplate> t;
        if (map) {
            const auto l = map->layer(layer);
            t.assign(l.begin(), l.end());
        } else {
            t.assign(static_cast<std::size_t>(shape.heads), uniform);
        }
        if (uniform_per_kv_group) t = ::vlsparse::uniform_per_kv_group(t, shape.kv_heads);
        return t;
    }
    template <std::same_as<PrefillLayer> In = PrefillLayer>
    PrefillDecision prefill(const In& in) {
        const auto pos = detail::check_prefill_layer(in, "BlindSightPolicy::prefill");
        const bool identity = detail::is_identity(pos) && static_cast<std::int64_t>(pos.size()) == in.layout->n();
        const Layout rows_layout = identity ? *in.layout : compact_layout(*in.layout, pos);
        const auto t = templates(in.layer, in.shape);
        PrefillDecision d;
        d.kv.n = in.layout->n();
        d.kv.indices.push_back(pos);
        d.mask = make_block_mask(make_mask_context(rows_layout, params.mask), t, q_block, k_block);
        return d;
    }
};

// ---------------------------------------------------------------------------------------------------
// The baselines (docs/baselines.md). Budgets given as fractions resolve against the rows the layer
// holds at prefill (its prompt length) and stay fixed for decode.

namespace detail {
// The layer's layout: the original one when every position is present, else the compacted one.
inline Layout rows_layout(const PrefillLayer& in, std::span<const std::int64_t> pos) {
    const bool identity = is_identity(pos) && static_cast<std::int64_t>(pos.size()) == in.layout->n();
    return identity ? *in.layout : compact_layout(*in.layout, pos);
}
inline void check_decode_layer(std::int64_t layer, std::size_t layers, bool ready, const char* fn) {
    require(layer >= 0 && static_cast<std::size_t>(layer) < layers && ready, fn, "layer ", layer,
            " has no prefill state; call begin() and prefill() for it first");
}
}  // namespace detail

// H2O: heavy hitters by accumulated attention + the recent window, per KV head by default. Prefill:
// simd::h2o_scores over the layer's rows, h2o_select_from_scores. Decode: reads every cached position;
// decode_observe adds the step's attention (attn[g] times the query heads it averages) to the
// accumulated scores and, when a list holds more than heavy + recent positions, returns the H2O keep
// set (last `recent` + top `heavy` of the rest), so the cache stays within budget.
struct H2OPolicy {
    H2OParams params;
    H2OPolicy() = default;
    explicit H2OPolicy(const H2OParams& p) : params(p) {}

    std::string_view name() const { return "h2o"; }
    void begin(const Layout&, const ModelShape& shape) {
        constexpr const char* fn = "H2OPolicy::begin";
        shape.validate(fn);
        params.validate(fn);
        shape_ = shape;
        layers_.assign(static_cast<std::size_t>(shape.layers), LayerState{});
    }
    template <std::same_as<PrefillLayer> In = PrefillLayer>
    PrefillDecision prefill(const In& in) {
        constexpr const char* fn = "H2OPolicy::prefill";
        const auto pos = detail::check_prefill_layer(in, fn);
        detail::require(static_cast<std::size_t>(in.layer) < layers_.size(), fn, "layer ", in.layer,
                        " was not announced by begin()");
        const auto nrows = static_cast<std::int64_t>(pos.size());
        PrefillDecision d;
        auto scores = in.scoring ? in.scoring->h2o_scores(in, params.groups, params.attention())
                                  : simd::h2o_scores(in.q, in.k, params.groups, params.attention());
        d.kv = rows_to_positions(h2o_select_from_scores(std::move(scores), params), pos, in.layout->n());
        LayerState& st = layers_[static_cast<std::size_t>(in.layer)];
        st = LayerState{};
        st.ready = true;
        st.heavy = params.heavy.resolve(nrows);
        st.recent = params.recent.resolve(nrows);
        st.acc = d.kv.scores;  // accumulated scores by position
        return d;
    }
    TokenSelection decode_read(std::int64_t layer, std::int64_t, const TokenSelection& cached) {
        detail::check_decode_layer(layer, layers_.size(), layer >= 0 && static_cast<std::size_t>(layer) < layers_.size() &&
                                                              layers_[static_cast<std::size_t>(layer)].ready,
                                   "H2OPolicy::decode_read");
        return cached;
    }
    std::optional<TokenSelection> decode_observe(std::int64_t layer, std::int64_t, const TokenSelection& read,
                                                 std::span<const std::vector<double>> attn) {
        constexpr const char* fn = "H2OPolicy::decode_observe";
        detail::check_decode_layer(layer, layers_.size(), layer >= 0 && static_cast<std::size_t>(layer) < layers_.size() &&
                                                              layers_[static_cast<std::size_t>(layer)].ready, fn);
        if (!params.evict_during_decode) return std::nullopt;
        LayerState& st = layers_[static_cast<std::size_t>(layer)];
        const std::size_t Gr = read.groups(), Gp = st.acc.size();
        detail::require(attn.size() == Gr, fn, "attn has ", attn.size(), " vectors, expected one per read list (", Gr, ")");
        detail::require(Gr == 1 || Gr == Gp || Gp == 1, fn, "read has ", Gr, " lists and the policy ", Gp,
                        " score groups, expected a shared list or one per KV head");
        for (auto& a : st.acc)
            if (static_cast<std::int64_t>(a.size()) < read.n) a.resize(static_cast<std::size_t>(read.n), 0.0);
        // Sum over query heads = mean over the read group's heads times their count.
        const double heads_per_read = static_cast<double>(shape_.heads) / static_cast<double>(Gr);
        const double heads_per_policy = static_cast<double>(shape_.heads) / static_cast<double>(Gp);
        for (std::size_t r = 0; r < Gr; ++r) {
            detail::require(attn[r].size() == read.indices[r].size(), fn, "attn[", r, "] has ", attn[r].size(),
                            " entries, expected ", read.indices[r].size(), " (one per position read)");
            for (std::size_t gp = 0; gp < Gp; ++gp) {
                if (Gr > 1 && Gp > 1 && gp != r) continue;
                // A shared read averaged over every head stands for each KV group's heads.
                const double w = Gr == 1 && Gp > 1 ? heads_per_policy : heads_per_read;
                auto& a = st.acc[gp];
                for (std::size_t i = 0; i < attn[r].size(); ++i) a[static_cast<std::size_t>(read.indices[r][i])] += w * attn[r][i];
            }
        }
        const std::size_t G = std::max(Gr, Gp);
        bool evict = false;
        TokenSelection keep;
        keep.n = read.n;
        for (std::size_t g = 0; g < G; ++g) {
            const auto list = read.for_kv_head(static_cast<std::int64_t>(Gr == 1 ? 0 : g));
            const auto& a = st.acc[Gp == 1 ? 0 : g];
            evict |= static_cast<std::int64_t>(list.size()) > st.heavy + st.recent;
            keep.indices.push_back(h2o_keep(list, st.heavy, std::min<std::int64_t>(st.recent, static_cast<std::int64_t>(list.size())),
                                            [&](std::int64_t p) { return a[static_cast<std::size_t>(p)]; }));
        }
        if (!evict) return std::nullopt;
        // One score group and identical lists: one shared list.
        if (Gp == 1 && std::all_of(keep.indices.begin(), keep.indices.end(), [&](const auto& l) { return l == keep.indices[0]; }))
            keep.indices.resize(1);
        return keep;
    }
    // Accumulated scores of `layer` by position (one vector per score group).
    const std::vector<std::vector<double>>& accumulated(std::int64_t layer) const {
        return layers_.at(static_cast<std::size_t>(layer)).acc;
    }

private:
    struct LayerState {
        bool ready = false;
        std::int64_t heavy = 0, recent = 0;
        std::vector<std::vector<double>> acc;
    };
    ModelShape shape_;
    std::vector<LayerState> layers_;
};

// SnapKV: per layer, the observation window + the top (capacity - window) prefix positions by pooled
// window attention (simd::snapkv_select); decode reads every cached position.
struct SnapKVPolicy : DecodeReadsAll {
    SnapKVParams params;
    SnapKVPolicy() = default;
    explicit SnapKVPolicy(const SnapKVParams& p) : params(p) {}

    std::string_view name() const { return "snapkv"; }
    void begin(const Layout&, const ModelShape& shape) {
        shape.validate("SnapKVPolicy::begin");
        params.validate("SnapKVPolicy::begin");
    }
    template <std::same_as<PrefillLayer> In = PrefillLayer>
    PrefillDecision prefill(const In& in) {
        const auto pos = detail::check_prefill_layer(in, "SnapKVPolicy::prefill");
        PrefillDecision d;
        d.kv = rows_to_positions(in.scoring ? in.scoring->snapkv_select(in, params) : simd::snapkv_select(in.q, in.k, params),
                                 pos, in.layout->n());
        return d;
    }
};

// StreamingLLM: the first `sinks` and the last `recent` positions, after the prefill and, with
// evict_during_decode, at every decode step (the step reads sinks + the last `recent` cached positions,
// its own included; decode_observe then returns that set, so the oldest non-sink row leaves the cache).
struct StreamingLLMPolicy {
    StreamingLLMParams params;
    StreamingLLMPolicy() = default;
    explicit StreamingLLMPolicy(const StreamingLLMParams& p) : params(p) {}

    std::string_view name() const { return "streamingllm"; }
    void begin(const Layout&, const ModelShape& shape) {
        constexpr const char* fn = "StreamingLLMPolicy::begin";
        shape.validate(fn);
        params.validate(fn);
        layers_.assign(static_cast<std::size_t>(shape.layers), LayerState{});
    }
    template <std::same_as<PrefillLayer> In = PrefillLayer>
    PrefillDecision prefill(const In& in) {
        constexpr const char* fn = "StreamingLLMPolicy::prefill";
        const auto pos = detail::check_prefill_layer(in, fn);
        detail::require(static_cast<std::size_t>(in.layer) < layers_.size(), fn, "layer ", in.layer,
                        " was not announced by begin()");
        const auto nrows = static_cast<std::int64_t>(pos.size());
        PrefillDecision d;
        d.kv = rows_to_positions(streamingllm_select(nrows, params), pos, in.layout->n());
        layers_[static_cast<std::size_t>(in.layer)] = {true, false, params.recent.resolve(nrows)};
        return d;
    }
    TokenSelection decode_read(std::int64_t layer, std::int64_t, const TokenSelection& cached) {
        LayerState& st = state(layer, "StreamingLLMPolicy::decode_read");
        if (!params.evict_during_decode) return cached;
        TokenSelection r;
        r.n = cached.n;
        st.dropped = false;
        for (const auto& l : cached.indices) {
            r.indices.push_back(streamingllm_keep(l, params.sinks, std::min<std::int64_t>(st.recent, static_cast<std::int64_t>(l.size()))));
            st.dropped |= r.indices.back().size() < l.size();
        }
        return r;
    }
    bool decode_wants_attention(std::int64_t, std::int64_t) const { return false; }  // evicts by position only
    std::optional<TokenSelection> decode_observe(std::int64_t layer, std::int64_t, const TokenSelection& read,
                                                 std::span<const std::vector<double>>) {
        LayerState& st = state(layer, "StreamingLLMPolicy::decode_observe");
        if (!params.evict_during_decode || !st.dropped) return std::nullopt;
        st.dropped = false;
        return read;
    }

private:
    struct LayerState {
        bool ready = false, dropped = false;
        std::int64_t recent = 0;
    };
    LayerState& state(std::int64_t layer, const char* fn) {
        const bool ok = layer >= 0 && static_cast<std::size_t>(layer) < layers_.size() && layers_[static_cast<std::size_t>(layer)].ready;
        detail::check_decode_layer(layer, layers_.size(), ok, fn);
        return layers_[static_cast<std::size_t>(layer)];
    }
    std::vector<LayerState> layers_;
};

// FastV: layers 0..K-1 see every token; at layer K-1, simd::fastv_select ranks the visual tokens by the
// last row's head-mean attention and `sequence` keeps the top floor((1 - rate) m) of them plus every
// text token for layers K, K+1, ...; nothing is evicted from any layer's cache (the dropped tokens
// never reach the later layers). Decode reads every cached position.
struct FastVPolicy : DecodeReadsAll {
    FastVParams params;
    FastVPolicy() = default;
    explicit FastVPolicy(const FastVParams& p) : params(p) {}

    std::string_view name() const { return "fastv"; }
    void begin(const Layout&, const ModelShape& shape) {
        shape.validate("FastVPolicy::begin");
        params.validate("FastVPolicy::begin", shape.layers);
    }
    template <std::same_as<PrefillLayer> In = PrefillLayer>
    PrefillDecision prefill(const In& in) {
        const auto pos = detail::check_prefill_layer(in, "FastVPolicy::prefill");
        PrefillDecision d;
        d.kv.n = in.layout->n();
        d.kv.indices.push_back(pos);
        if (in.layer == params.k_layer - 1) {
            const Layout rows = detail::rows_layout(in, pos);
            TokenSelection s;
            if (in.scoring) {
                params.validate("FastVPolicy::prefill");
                rows.require_tokens(in.q.shape[0], "FastVPolicy::prefill");
                s = fastv_select_from_scores(in.scoring->last_row_scores(in, params.attention()), rows, params);
            } else {
                s = simd::fastv_select(in.q, in.k, rows, params);
            }
            d.sequence = rows_to_positions(s, pos, in.layout->n()).indices[0];
        }
        return d;
    }
};

// Random selection: every layer's cache keeps random_select(layout of the layer's rows, layer, params)
// (seeded, deterministic; text stays with scope = visual). Decode reads every cached position.
struct RandomPolicy : DecodeReadsAll {
    RandomParams params;
    RandomPolicy() = default;
    explicit RandomPolicy(const RandomParams& p) : params(p) {}

    std::string_view name() const { return "random"; }
    void begin(const Layout&, const ModelShape& shape) {
        shape.validate("RandomPolicy::begin");
        params.validate("RandomPolicy::begin");
    }
    template <std::same_as<PrefillLayer> In = PrefillLayer>
    PrefillDecision prefill(const In& in) {
        const auto pos = detail::check_prefill_layer(in, "RandomPolicy::prefill");
        PrefillDecision d;
        d.kv = rows_to_positions(random_select(detail::rows_layout(in, pos), in.layer, params), pos, in.layout->n());
        return d;
    }
};

// Fixed-ratio selection: every layer's cache keeps fixed_ratio_select(layout of the layer's rows, params).
struct FixedRatioPolicy : DecodeReadsAll {
    FixedRatioParams params;
    FixedRatioPolicy() = default;
    explicit FixedRatioPolicy(const FixedRatioParams& p) : params(p) {}

    std::string_view name() const { return "fixed_ratio"; }
    void begin(const Layout&, const ModelShape& shape) {
        shape.validate("FixedRatioPolicy::begin");
        params.validate("FixedRatioPolicy::begin");
    }
    template <std::same_as<PrefillLayer> In = PrefillLayer>
    PrefillDecision prefill(const In& in) {
        const auto pos = detail::check_prefill_layer(in, "FixedRatioPolicy::prefill");
        PrefillDecision d;
        d.kv = rows_to_positions(fixed_ratio_select(detail::rows_layout(in, pos), params), pos, in.layout->n());
        return d;
    }
};

// Every adapter of this header satisfies the interface (PureKVPolicy joins in <vlsparse/policies/purekv.hpp>
// or here when added).
static_assert(Policy<DensePolicy> && Policy<ZipVLPolicy> && Policy<AvlPolicy> && Policy<BlindSightPolicy> &&
              Policy<H2OPolicy> && Policy<SnapKVPolicy> && Policy<StreamingLLMPolicy> && Policy<FastVPolicy> &&
              Policy<RandomPolicy> && Policy<FixedRatioPolicy> && Policy<AnyPolicy>);

}  // namespace vlsparse
