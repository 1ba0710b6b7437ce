// vlsparse/policies/purekv_policy.hpp -- PureKV as a Policy (policies/policy_interface.hpp): the adapter an engine
// loop or the simulator drives layer by layer.
//
//   begin(layout, shape):  a fresh simd::PureKVEstimator for the prompt (checks l0 < layers, the window
//                          against n, the budget range, st_start_layer)
//   prefill(layer):        the window scores (Eq. 2) when the layer computes its own (layers <= l0),
//                          from the layer's PrefillScoring when set (the simulator's CUDA backend),
//                          else the SIMD path on q / k;
//                          kv = window + top-h by Eq. 3 / Eq. 4 (per KV head by default);
//                          mask = the ST-SpAttn block mask from st_start_layer on (video prompts), else
//                          nullopt (causal dense); sparse_prefill = false (PureKV evicts after a full
//                          or ST-masked prefill); no rows leave the sequence
//   decode:                reads every cached position, never evicts (DecodeReadsAll)
// Ablation: own_layer_scores = true makes every layer above l0 score its keys with its OWN
// window attention (Eq. 2-3 with s^l) instead of reusing l0's (Eq. 4): what the cross-layer estimate
// saves, against what it costs in fidelity. Layers up to l0 are unchanged. Not a PureKVParams key
// (the golden files and the GPU estimator follow the paper); the simulator's `own_layer_scores`.
// PureKV scores every position of the prompt, so it needs all rows (positions 0..n-1) in every layer.
// Include: <vlsparse/policies/purekv_policy.hpp> (or <vlsparse/policies/policy.hpp>).
#pragma once

#include <concepts>
#include <optional>
#include <string_view>

#include "vlsparse/policies/policy_interface.hpp"
#include "vlsparse/policies/purekv.hpp"

namespace vlsparse {

struct PureKVPolicy : DecodeReadsAll {
    PureKVParams params;
    bool own_layer_scores = false;  // the ablation above: layers > l0 use their own window scores
    PureKVPolicy() = default;
    explicit PureKVPolicy(const PureKVParams& p, bool own_scores = false) : params(p), own_layer_scores(own_scores) {}

    std::string_view name() const { return "purekv"; }
    void begin(const Layout& layout, const ModelShape& shape) { est_.emplace(params, layout, shape); }
    template <std::same_as<PrefillLayer> In = PrefillLayer>
    PrefillDecision prefill(const In& in) {
        constexpr const char* fn = "PureKVPolicy::prefill";
        const auto pos = detail::check_prefill_layer(in, fn);
        detail::require(est_.has_value(), fn, "no prompt: call begin(layout, shape) first");
        detail::require(in.shape == est_->shape() && *in.layout == est_->layout(), fn,
                        "the layer's layout or model shape differs from the one given to begin()");
        detail::require(detail::is_identity(pos) && static_cast<std::int64_t>(pos.size()) == in.layout->n(), fn,
                        "PureKV needs every position of the prompt in every layer (", pos.size(), " of ",
                        in.layout->n(), " rows present); it does not combine with policies that drop rows");
        PureKVSelection s;
        if (own_layer_scores && in.layer > params.l0) {
            s = simd::purekv_select(window_scores(in), in.v, in.layer, params);
        } else {
            if (est_->needs_scores(in.layer)) est_->observe_scores(in.layer, window_scores(in));
            s = est_->select(in.layer, in.v);
        }
        PrefillDecision d;
        d.kv = std::move(s.selection);
        if (est_->masked(in.layer)) d.mask = *est_->block_mask();
        return d;
    }
    // The prompt's estimator (after begin()), e.g. for scores and validation.
    const simd::PureKVEstimator* estimator() const { return est_ ? &*est_ : nullptr; }

private:
    // Eq. 2 of the layer: from the layer's scoring backend when it has one (PrefillLayer::scoring), else
    // the SIMD path on the host views.
    PureKVScores window_scores(const PrefillLayer& in) const {
        if (in.scoring) return in.scoring->purekv_window_scores(in, params);
        return simd::purekv_window_scores(in.q, in.k, in.layer, params);
    }

    std::optional<simd::PureKVEstimator> est_;
};

static_assert(Policy<PureKVPolicy>);

}  // namespace vlsparse
