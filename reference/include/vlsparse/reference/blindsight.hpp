// vlsparse/reference/blindsight.hpp -- the exact reference of BlindSight: template-masked attention
// (reference::masked_attention, reference/masked.hpp) and Algorithm 1 (prompt-level
// characterization). Plain loops, double accumulation.
// Include: <vlsparse/reference/blindsight.hpp>
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "vlsparse/masks/templates.hpp"
#include "vlsparse/policies/blindsight_select.hpp"
#include "vlsparse/reference/attention.hpp"
#include "vlsparse/reference/masked.hpp"

namespace vlsparse::reference {

namespace detail {

// Algorithm 1's attention in the reference (the ops of characterize_prompt_over): outputs of
// reference::masked_attention (which scans its inputs whatever opt.check_finite says), in double.
struct CharacterizeOps {
    using value_type = double;
    template <class... A> static void masked(A&&... a) { reference::masked_attention(std::forward<A>(a)...); }
};

}  // namespace detail

// Algorithm 1 for every head of one layer, in double: O_ref = dense causal attention (the Dense
// template, i.e. causal, or causal with bidirectional images when the options ask for them);
// characterize_prompt_over on the reference's arithmetic.
template <ElementType TQ, ElementType TK>
std::vector<HeadCharacterization> characterize_prompt(View3<const TQ> q, View3<const TK> k, View3<const TK> v,
                                                      const Layout& layout, const BlindSightParams& P = {}) {
    return characterize_prompt_over(q, k, v, layout, P, detail::CharacterizeOps{}, "reference::blindsight_characterize");
}

// BlindSight's operations on the reference backend: the concept of golden::run_blindsight_case, for code
// written once over a backend (simd::BlindSightOps is the SIMD twin):
//   masked(q [n, H, d], k, v [n, H_kv, d], MaskContext, heads (one template per query head), out [n, H, d][, opt])
//   characterize(q, k, v, layout, P) -> one HeadCharacterization per query head (Algorithm 1)
struct BlindSightOps {
    template <class... A> static void masked(A&&... a) { reference::masked_attention(std::forward<A>(a)...); }
    template <class... A> static auto characterize(A&&... a) { return reference::characterize_prompt(std::forward<A>(a)...); }
};

}  // namespace vlsparse::reference
