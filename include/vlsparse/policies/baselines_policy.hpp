// vlsparse/policies/baselines_policy.hpp -- the baselines as Policies (policies/policy_interface.hpp):
// H2OPolicy, SnapKVPolicy, StreamingLLMPolicy, FastVPolicy, RandomPolicy, FixedRatioPolicy, over the
// selections of policies/baselines.hpp (docs/baselines.md).
// prefill() is a member template taking a PrefillLayer only: the SIMD code it calls is then compiled
// where a program uses the adapter, not in every translation unit that includes this header
// (docs/performance.md "Compile time").
// Include: <vlsparse/policies/baselines_policy.hpp> (or <vlsparse/policies/policy.hpp>).
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "vlsparse/policies/baselines.hpp"
#include "vlsparse/policies/policy_interface.hpp"

namespace vlsparse {

// Budgets given as fractions resolve against the rows the layer holds at prefill (its prompt length)
// and stay fixed for decode.

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

static_assert(Policy<H2OPolicy> && Policy<SnapKVPolicy> && Policy<StreamingLLMPolicy> && Policy<FastVPolicy> &&
              Policy<RandomPolicy> && Policy<FixedRatioPolicy>);

}  // namespace vlsparse
