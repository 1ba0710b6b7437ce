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

// Algorithm 1 for every head of one layer, in double: O_ref = dense causal attention (the Dense
// template, i.e. causal, or causal with bidirectional images when the options ask for them).
template <ElementType TQ, ElementType TK>
std::vector<HeadCharacterization> characterize_prompt(View3<const TQ> q, View3<const TK> k, View3<const TK> v,
                                                      const Layout& layout, const BlindSightParams& P = {}) {
    constexpr const char* fn = "reference::blindsight_characterize";
    check_blindsight_params(P, fn);
    detail::check_qkv(q, k, v, fn);
    const std::int64_t n = q.shape[0], H = q.shape[1], d = q.shape[2];
    detail::require(k.shape[0] == n, fn, "q has ", n, " tokens and k has ", k.shape[0], ", expected equal (prefill)");
    layout.require_tokens(n, fn);
    const MaskContext ctx = make_mask_context(layout, P.mask);
    const AttentionOptions opt{P.scale, true};
    std::vector<double> ref(static_cast<std::size_t>(n * H * d)), o(ref.size());
    const View3<double> ref_v(ref.data(), {n, H, d}), o_v(o.data(), {n, H, d});
    masked_attention(q, k, v, ctx, std::vector<MaskTemplate>(static_cast<std::size_t>(H), MaskTemplate::dense), ref_v, opt);
    std::vector<HeadCharacterization> r(static_cast<std::size_t>(H));
    for (MaskTemplate t : kCandidateTemplates) {
        masked_attention(q, k, v, ctx, std::vector<MaskTemplate>(static_cast<std::size_t>(H), t), o_v, opt);
        for (std::int64_t h = 0; h < H; ++h) {
            double num = 0.0, den = 0.0;
            for (std::int64_t i = 0; i < n; ++i)
                for (std::int64_t c = 0; c < d; ++c) {
                    const auto idx = static_cast<std::size_t>((i * H + h) * d + c);
                    num += (o[idx] - ref[idx]) * (o[idx] - ref[idx]);
                    den += ref[idx] * ref[idx];
                }
            r[static_cast<std::size_t>(h)].nmse[static_cast<std::size_t>(t)] = den == 0.0 ? (num == 0.0 ? 0.0 : INFINITY) : num / den;
        }
    }
    for (auto& c : r) c.chosen = choose_template(c.nmse, P.alpha);
    return r;
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
