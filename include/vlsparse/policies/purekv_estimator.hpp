// vlsparse/policies/purekv_estimator.hpp -- PureKV's cross-layer estimator: the state of one prefill
// that keeps the lower layers' window scores (layers <= l0) for the layers above, which never compute
// attention scores (PureKV, arXiv:2510.25600, Eq. 2-4; docs/purekv.md). Written once over a backend's
// ops type (simd::PureKVOps, reference::PureKVOps).
//
// The estimator (BasicPureKVEstimator, used as simd::PureKVEstimator or reference::PureKVEstimator)
// carries the lower layers' scores through one prefill, layer by layer:
//   simd::PureKVEstimator est(params, layout, shape);
//   for (l = 0; l < L; ++l) {
//       if (est.needs_scores(l)) est.observe(l, q_l, k_l);          // layers <= l0: window attention
//       est.attention(l, q_l, k_l, v_l, out_l);                     // ST-masked from st_start_layer on
//       cache_l.assign(k_l, v_l); purekv_evict(cache_l, est.select(l, v_l));   // no scores above l0
//   }
// Include: <vlsparse/policies/purekv.hpp> (SIMD path) or <vlsparse/reference/purekv.hpp> (reference).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "vlsparse/core/error.hpp"
#include "vlsparse/core/layout.hpp"
#include "vlsparse/core/model_shape.hpp"
#include "vlsparse/core/selection.hpp"
#include "vlsparse/core/tensor.hpp"
#include "vlsparse/masks/block_mask.hpp"
#include "vlsparse/masks/templates.hpp"
#include "vlsparse/policies/purekv_select.hpp"

namespace vlsparse {

namespace detail {

// The estimator's checks that read no values, one set for every backend (reference, SIMD, CUDA's
// cuda::PureKVEstimator), so that a bad argument is reported with the same message on each.

// What does not depend on a layer's tensors: params, the model shape, l0 < layers, st_start_layer <
// layers (when ST-SpAttn is on), a non-empty prompt, the window and the budget range against it.
inline void check_purekv_estimator(const PureKVParams& P, const Layout& layout, const ModelShape& shape,
                                   const char* fn) {
    check_purekv_params(P, fn);
    shape.validate(fn);
    require(P.l0 < shape.layers, fn, "l0 = ", P.l0, " is beyond the model's layers, expected 0 <= l0 < ", shape.layers);
    require(P.st.kind == VideoMask::none || P.st_start_layer < shape.layers, fn, "st_start_layer = ",
            P.st_start_layer, ", expected < layers = ", shape.layers, " (set st.kind = none to switch ST-SpAttn off)");
    require(layout.n() > 0, fn, "empty layout, expected at least one token");
    (void)purekv_top_h(layout.n(), P);  // window <= n, budget in range
}

inline void check_purekv_layer(std::int64_t layer, const ModelShape& shape, const char* fn) {
    require(layer >= 0 && layer < shape.layers, fn, "layer = ", layer, ", expected 0 <= layer < ", shape.layers);
}

// True when layer `layer` computes its own window scores (observe): l0 itself, and the layers below it
// unless lower_layers == dense. Higher layers never compute attention scores (Eq. 4).
inline bool purekv_needs_scores(std::int64_t layer, const PureKVParams& P) {
    return layer == P.l0 || (layer < P.l0 && P.lower_layers == PureKVLowerLayers::own_scores);
}

// observe(layer)'s check: a layer of the model that needs its own scores.
inline void check_purekv_observe(std::int64_t layer, const PureKVParams& P, const ModelShape& shape, const char* fn) {
    check_purekv_layer(layer, shape, fn);
    require(purekv_needs_scores(layer, P), fn, "layer ", layer, " does not use its own attention scores (l0 = ", P.l0,
            layer > P.l0 ? "; higher layers reuse l0's scores, Eq. 4)" : "; lower_layers = dense)");
}

// The layer whose scores select(layer) uses: the layer's own up to l0, l0's above. Throws for a layer
// that has none (below l0 with lower_layers == dense) and, with `observed` the backend's record of
// that source layer, when its scores have not been observed yet.
template <class Observed>
std::int64_t purekv_score_source(std::int64_t layer, const PureKVParams& P, const ModelShape& shape,
                                 const Observed& observed, const char* fn) {
    check_purekv_layer(layer, shape, fn);
    require(layer >= P.l0 || P.lower_layers == PureKVLowerLayers::own_scores, fn, "layer ", layer, " is below l0 = ",
            P.l0, " with lower_layers = dense: it has no scores");
    const std::int64_t src = layer <= P.l0 ? layer : P.l0;
    require(observed(src), fn, "the scores of layer ", src, " are needed for layer ", layer,
            " but were not observed; call observe(", src, ", q, k) first");
    return src;
}

// q [n, H, d] and k [n, H_kv, d] of one layer against the prompt (n tokens) and the model.
template <class TQ, class TK>
void check_purekv_qk(const View3<const TQ>& q, const View3<const TK>& k, std::int64_t n, const ModelShape& shape,
                     const char* fn) {
    require(q.shape[0] == n && q.shape[1] == shape.heads && q.shape[2] == shape.head_dim && k.shape[0] == n &&
                k.shape[1] == shape.kv_heads && k.shape[2] == shape.head_dim,
            fn, "q [", q.shape[0], ", ", q.shape[1], ", ", q.shape[2], "] and k [", k.shape[0], ", ", k.shape[1], ", ",
            k.shape[2], "] do not match the prompt and model (n = ", n, ", H = ", shape.heads, ", H_kv = ",
            shape.kv_heads, ", d = ", shape.head_dim, ")");
}

// v [n, H_kv, d] of one layer against the prompt and the model.
template <class TV>
void check_purekv_v(const View3<const TV>& v, std::int64_t n, const ModelShape& shape, const char* fn) {
    require(v.shape[0] == n && v.shape[1] == shape.kv_heads && v.shape[2] == shape.head_dim, fn, "v has shape [",
            v.shape[0], ", ", v.shape[1], ", ", v.shape[2], "], expected [", n, ", ", shape.kv_heads, ", ",
            shape.head_dim, "]");
}

}  // namespace detail

// The paper's validation (Eq. 5-7) of layer `layer` on a backend's ops: `est`, the layer's selection
// from l0's scores, against the layer's own (Eq. 2 from its q, k, weighted by its ||V||), Spearman per
// group. simd::purekv_validate, reference::purekv_validate and BasicPureKVEstimator::validate call it.
template <class Ops, class TQ, class TK>
PureKVLayerValidation purekv_validate_over(const PureKVSelection& est, View3<const TQ> q, View3<const TK> k,
                                           View3<const TK> v, std::int64_t layer, const PureKVParams& P) {
    return purekv_validation(est, Ops::select(Ops::window_scores(q, k, layer, P), v, layer, P));
}

// The cross-layer estimator state of one prefill (see the header comment). Backend supplies the
// numerical steps: window_scores(q, k, layer, P), select(scores, v, layer, P), masked(q, k, v,
// ctx, block_mask or nullptr, out, P) and dense(q, k, v, out, P); `uses_block_mask` says whether
// masked() reads a BlockMask (SIMD) or only the MaskContext (reference).
template <class Backend>
class BasicPureKVEstimator {
public:
    // Checks everything that does not depend on a layer's tensors (detail::check_purekv_estimator):
    // params, the model shape, l0 < layers, the window against the prompt length, the budget range,
    // st_start_layer < layers.
    BasicPureKVEstimator(const PureKVParams& P, const Layout& layout, const ModelShape& shape)
        : P_(P), layout_(layout), shape_(shape) {
        detail::check_purekv_estimator(P, layout, shape, "PureKVEstimator");
        scores_.resize(static_cast<std::size_t>(shape.layers));
        if (P.st.kind != VideoMask::none && purekv_masked_layer(layout, P.st_start_layer, P)) {
            ctx_ = make_video_mask_context(layout, P.st);
            if constexpr (Backend::uses_block_mask)
                block_mask_ = make_block_mask(
                    ctx_, std::vector<MaskTemplate>(static_cast<std::size_t>(shape.heads), MaskTemplate::dense),
                    P.q_block, P.k_block);
        }
    }

    const PureKVParams& params() const { return P_; }
    const Layout& layout() const { return layout_; }
    const ModelShape& shape() const { return shape_; }
    std::int64_t n() const { return layout_.n(); }

    // True when select(layer) needs observe(layer) first: l0 itself, and the layers below it unless
    // lower_layers == dense. Higher layers never compute attention scores (Eq. 4).
    bool needs_scores(std::int64_t layer) const {
        check_layer(layer, "PureKVEstimator::needs_scores");
        return detail::purekv_needs_scores(layer, P_);
    }

    // Computes and keeps layer `layer`'s window scores (Eq. 2). q [n, H, d], k [n, H_kv, d].
    template <ElementType TQ, ElementType TK>
    const PureKVScores& observe(std::int64_t layer, View3<const TQ> q, View3<const TK> k) {
        constexpr const char* fn = "PureKVEstimator::observe";
        detail::check_purekv_observe(layer, P_, shape_, fn);
        check_shape(q, k, fn);
        return observe_scores(layer, Backend::window_scores(q, k, layer, P_));
    }

    // observe() with the window scores computed elsewhere from the same rows (another backend that holds
    // them: the policy's PrefillScoring). Checks that they are Eq. 2 of this layer over this prompt with
    // this grouping and window.
    const PureKVScores& observe_scores(std::int64_t layer, PureKVScores s) {
        constexpr const char* fn = "PureKVEstimator::observe_scores";
        detail::check_purekv_observe(layer, P_, shape_, fn);
        const std::int64_t G = P_.grouping == PureKVGrouping::kv_head ? shape_.kv_heads : 1;
        detail::require(s.layer == layer && s.n == n() && s.window == P_.window && s.groups() == G, fn,
                        "scores of layer ", s.layer, " over ", s.n, " tokens, window ", s.window, ", ", s.groups(),
                        " groups; expected layer ", layer, ", ", n(), " tokens, window ", P_.window, ", ", G, " groups");
        for (std::int64_t g = 0; g < G; ++g)
            detail::require(static_cast<std::int64_t>(s.s[static_cast<std::size_t>(g)].size()) == n(), fn, "group ", g,
                            " has ", s.s[static_cast<std::size_t>(g)].size(), " scores, expected ", n());
        auto& slot = scores_[static_cast<std::size_t>(layer)];
        slot = std::move(s);
        return *slot;
    }

    bool observed(std::int64_t layer) const {
        check_layer(layer, "PureKVEstimator::observed");
        return scores_[static_cast<std::size_t>(layer)].has_value();
    }

    // The scores select(layer) uses: the layer's own up to l0, l0's above. Throws when they have not
    // been observed yet (or the layer is dense).
    const PureKVScores& scores(std::int64_t layer) const { return scores_for(layer, "PureKVEstimator::scores"); }

    // Eq. 3 (layers <= l0) or Eq. 4 (higher layers) and the kept set. v [n, H_kv, d] of this layer.
    template <ElementType TV>
    PureKVSelection select(std::int64_t layer, View3<const TV> v) const {
        constexpr const char* fn = "PureKVEstimator::select";
        check_layer(layer, fn);
        detail::check_purekv_v(v, n(), shape_, fn);
        if (layer < P_.l0 && P_.lower_layers == PureKVLowerLayers::dense) return detail::purekv_dense_selection(n(), layer);
        return Backend::select(scores_for(layer, fn), v, layer, P_);
    }

    // The paper's validation for layer `layer` > l0: its own window scores (Eq. 2 with its q, k) against
    // l0's, both weighted by its ||V|| (Eq. 5-6), compared by Spearman per group (Eq. 7).
    template <ElementType TQ, ElementType TK>
    PureKVLayerValidation validate(std::int64_t layer, View3<const TQ> q, View3<const TK> k, View3<const TK> v) const {
        constexpr const char* fn = "PureKVEstimator::validate";
        check_layer(layer, fn);
        detail::require(layer > P_.l0, fn, "layer = ", layer, ", expected a layer above l0 = ", P_.l0);
        check_shape(q, k, fn);
        return purekv_validate_over<Backend>(select(layer, v), q, k, v, layer, P_);
    }

    // True when layer `layer`'s prefill uses the ST-SpAttn mask.
    bool masked(std::int64_t layer) const {
        check_layer(layer, "PureKVEstimator::masked");
        return purekv_masked_layer(layout_, layer, P_);
    }
    // The video mask description (valid when some layer is masked).
    const MaskContext& mask_context() const { return ctx_; }
    // The ST block mask (SIMD backend, when some layer is masked).
    const BlockMask* block_mask() const { return block_mask_ ? &*block_mask_ : nullptr; }

    // The layer's prefill attention: ST-SpAttn masked from st_start_layer on (video layouts), dense
    // causal otherwise. q [n, H, d], k, v [n, H_kv, d], out [n, H, d].
    template <ElementType TQ, ElementType TK, OutputElement TO>
    void attention(std::int64_t layer, View3<const TQ> q, View3<const TK> k, View3<const TK> v, View3<TO> out) const {
        constexpr const char* fn = "PureKVEstimator::attention";
        check_layer(layer, fn);
        check_shape(q, k, fn);
        if (masked(layer)) Backend::masked(q, k, v, ctx_, block_mask(), out, P_);
        else Backend::dense(q, k, v, out, P_);
    }

    // One whole layer the way an engine runs it: observe (when needed), the prefill attention into
    // `out`, the cache filled with the layer's K/V and evicted to the kept set. Returns the selection.
    template <ElementType TQ, ElementType TK, OutputElement TO, ElementType TC>
    PureKVSelection prefill_layer(std::int64_t layer, View3<const TQ> q, View3<const TK> k, View3<const TK> v,
                                  View3<TO> out, KvCache<TC>& cache) {
        if (needs_scores(layer)) observe(layer, q, k);
        attention(layer, q, k, v, out);
        PureKVSelection s = select(layer, v);
        cache.assign(k, v);
        purekv_evict(cache, s);
        return s;
    }

private:
    const PureKVScores& scores_for(std::int64_t layer, const char* fn) const {
        const std::int64_t src = detail::purekv_score_source(
            layer, P_, shape_, [this](std::int64_t l) { return scores_[static_cast<std::size_t>(l)].has_value(); }, fn);
        return *scores_[static_cast<std::size_t>(src)];
    }
    void check_layer(std::int64_t layer, const char* fn) const { detail::check_purekv_layer(layer, shape_, fn); }
    template <class TQ, class TK>
    void check_shape(const View3<const TQ>& q, const View3<const TK>& k, const char* fn) const {
        detail::check_purekv_qk(q, k, n(), shape_, fn);
    }

    PureKVParams P_;
    Layout layout_;
    ModelShape shape_;
    std::vector<std::optional<PureKVScores>> scores_;  // [layers]; only layers <= l0 are ever set
    MaskContext ctx_;
    std::optional<BlockMask> block_mask_;
};

}  // namespace vlsparse
