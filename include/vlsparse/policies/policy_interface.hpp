// vlsparse/policies/policy_interface.hpp -- the policy interface every algorithm's adapter implements.
//
// A policy answers three questions an engine (or the simulator) asks, layer by layer:
//   prefill:  which positions each layer's KV cache keeps after the prefill, whether the layer's
//             prefill attention is token-sparse or masked, and which tokens stay in the sequence for
//             the later layers                                           -> PrefillDecision
//   decode:   which cached positions decode step t of layer l reads      -> TokenSelection
//   feedback: after the step, the step's head-mean attention; the policy may evict (H2O)
// The concepts PrefillPolicy, DecodePolicy and Policy say it in C++20; AnyPolicy erases the type for
// a runtime choice; the helpers below (check_prefill_layer, compact_layout, rows_to_positions,
// intersect_selections) are shared by the adapters and useful to engines. No algorithm code: each
// adapter has its own header (<algo>_policy.hpp) and <vlsparse/policies/policy.hpp> includes them all.
//
// Engine loop (see docs/baselines.md, "The policy interface"):
//   policy.begin(layout, shape);
//   positions = 0..n-1
//   for l in 0..L-1: d = policy.prefill({&layout, shape, l, q_l, k_l, v_l, positions});
//                    run the layer's prefill (dense / d.mask / token-sparse over d.kv), fill the cache,
//                    cache.keep(d.kv); if (!d.sequence.empty()) positions = d.sequence (rows dropped)
//   for t = 0, 1, ...: for l: append the token's K/V; read = policy.decode_read(l, t, cached_l);
//                    attend over `read`; if (auto k = policy.decode_observe(l, t, read, attn)) cache.keep(*k)
// Include: <vlsparse/policies/policy_interface.hpp> (an engine with its own policies), or
// <vlsparse/policies/policy.hpp> (the interface and every adapter).
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

#include "vlsparse/attention/common.hpp"
#include "vlsparse/core/error.hpp"
#include "vlsparse/core/layout.hpp"
#include "vlsparse/core/model_shape.hpp"
#include "vlsparse/core/selection.hpp"
#include "vlsparse/core/tensor.hpp"
#include "vlsparse/detail/check.hpp"
#include "vlsparse/masks/block_mask.hpp"
#include "vlsparse/policies/scoring.hpp"

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

// Throws vlsparse::error (function "PrefillDecision") unless `d` is well formed for a prompt of n
// positions and kv_heads KV heads: kv over n positions (one shared list or one per KV head, each
// ascending, unique and in range), `sequence` ascending, unique and in [0, n), not both a mask and
// sparse_prefill. What depends on the engine's state (a kept position that already left the
// sequence) the engine checks itself (the simulator does: sim/engine.hpp).
inline void check_prefill_decision(const PrefillDecision& d, std::int64_t n, std::int64_t kv_heads) {
    constexpr const char* fn = "PrefillDecision";
    require(d.kv.n == n, fn, "kv.n = ", d.kv.n, ", expected the prompt length ", n);
    d.kv.validate(kv_heads, "PrefillDecision::kv");
    detail::check_sorted_unique(d.sequence, n, fn, "sequence");
    require(!(d.mask && d.sparse_prefill), fn, "both a mask and sparse_prefill are set; expected one of them");
}

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

}  // namespace vlsparse
