// vlsparse/policies/avl_policy.hpp -- A-VL as a Policy (policies/policy_interface.hpp): core /
// secondary / minor image tokens per layer after the prefill, and the decode schedule that reads the
// core set between refresh steps (A-VL, arXiv:2409.14846; docs/avl.md).
// prefill() is a member template taking a PrefillLayer only: the SIMD code it calls is then compiled
// where a program uses the adapter, not in every translation unit that includes this header
// (docs/performance.md "Compile time").
// Include: <vlsparse/policies/avl_policy.hpp> (or <vlsparse/policies/policy.hpp>).
#pragma once

#include <concepts>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "vlsparse/policies/avl.hpp"
#include "vlsparse/policies/avl_schedule.hpp"
#include "vlsparse/policies/policy_interface.hpp"

namespace vlsparse {

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

static_assert(Policy<AvlPolicy>);

}  // namespace vlsparse
