// vlsparse/policies/blindsight.hpp -- BlindSight per-head calibration: Algorithms 1 and 2 (CPU fast path).
//
//   Algorithm 1 (prompt level), per head h:  NMSE_t = ||O_t - O_dense||_F^2 / ||O_dense||_F^2 over all rows,
//     template = first t in (Sink, Document, Document-Sink) with NMSE_t < alpha, else Dense.
//   Algorithm 2 (dataset level), per (layer, head) with fractions f over the prompts:
//     Dense if f_Dense > gamma_c, else Sink if f_Sink > gamma_s, else Document if f_Document > gamma_d,
//     else Document-Sink.
// BlindSight (Srikrishnan, Shah, Reinhardt 2025), Sections 4.1, 4.2, 5.1 (alpha 0.1, gamma_c 0.25,
// gamma_s = gamma_d = 0.6). The three NMSEs are always all computed (reported), the decision is the
// paper's first-wins rule. A head with ||O_dense|| = 0 has NMSE 0 when O_t is also zero.
// The exact twin is vlsparse::reference::characterize_prompt (<vlsparse/reference/blindsight.hpp>);
// the head map's JSON form is in <vlsparse/io/blindsight_json.hpp>. The parameters, Algorithm 2 and the
// head map (no attention, no Eigen) are in <vlsparse/policies/blindsight_params.hpp> and
// <vlsparse/policies/blindsight_select.hpp>, included here.
// Include: <vlsparse/policies/blindsight.hpp>
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "vlsparse/attention/dense.hpp"
#include "vlsparse/attention/masked.hpp"
#include "vlsparse/masks/block_mask.hpp"
#include "vlsparse/masks/templates.hpp"
#include "vlsparse/policies/blindsight_select.hpp"

namespace vlsparse {

namespace simd {

namespace detail {

// Algorithm 1's attention on the SIMD path (the ops of characterize_prompt_over): fp32 outputs of the
// masked attention over each template's block mask (blocks of q_block queries x k_block keys).
struct CharacterizeOps {
    using value_type = float;
    std::int64_t q_block, k_block;
    template <class TQ, class TK>
    void masked(View3<const TQ> q, View3<const TK> k, View3<const TK> v, const MaskContext& ctx,
                std::span<const MaskTemplate> heads, View3<float> out, const AttentionOptions& opt) const {
        simd::masked_attention(q, k, v, make_block_mask(ctx, heads, q_block, k_block), out, opt);
    }
};

}  // namespace detail

// Algorithm 1 for every head of one layer (prefill: q [n, H, d], k, v [n, H_kv, d], layout of n tokens):
// characterize_prompt_over on this backend's arithmetic. Block sizes of the masked attention:
// q_block x k_block.
template <ElementType TQ, ElementType TK>
std::vector<HeadCharacterization> characterize_prompt(View3<const TQ> q, View3<const TK> k, View3<const TK> v,
                                                      const Layout& layout, const BlindSightParams& P = {},
                                                      std::int64_t q_block = 128, std::int64_t k_block = 128) {
    return characterize_prompt_over(q, k, v, layout, P, detail::CharacterizeOps{q_block, k_block},
                                    "simd::blindsight_characterize");
}

// BlindSight's operations on the SIMD backend: the concept of golden::run_blindsight_case (the signatures
// are listed at reference::BlindSightOps), for code written once over a backend. The block mask of
// masked() and of characterize() has blocks of kQBlock queries x kKBlock keys (make_block_mask's default
// 128 x 128 in BlindSightOps; the tests use blocks that do not divide n, so results cross block edges).
template <std::int64_t kQBlock = 128, std::int64_t kKBlock = 128>
struct BasicBlindSightOps {
    template <ElementType T>
    static void masked(View3<const T> q, View3<const T> k, View3<const T> v, const MaskContext& ctx,
                       std::span<const MaskTemplate> heads, View3<float> out, const AttentionOptions& opt = {}) {
        simd::masked_attention(q, k, v, make_block_mask(ctx, heads, kQBlock, kKBlock), out, opt);
    }
    template <ElementType T>
    static std::vector<HeadCharacterization> characterize(View3<const T> q, View3<const T> k, View3<const T> v,
                                                          const Layout& layout, const BlindSightParams& P) {
        return simd::characterize_prompt(q, k, v, layout, P, kQBlock, kKBlock);
    }
};
using BlindSightOps = BasicBlindSightOps<>;

}  // namespace simd

}  // namespace vlsparse
