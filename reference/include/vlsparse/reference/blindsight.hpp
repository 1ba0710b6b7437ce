// vlsparse/reference/blindsight.hpp -- the exact reference of BlindSight: template-masked attention
// and Algorithm 1 (prompt-level characterization).
//
//   O[i,h,:] = sum_{j : allowed_h(i, j)} softmax_j(scale * q_{i,h} . k_{j,g}) v_{j,g}
// with allowed_h = MaskContext::allows(template of head h) evaluated pair by pair over all n keys
// (masks/templates.hpp), never through a BlockMask. Plain loops, double accumulation.
// Include: <vlsparse/reference/blindsight.hpp>
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "vlsparse/masks/templates.hpp"
#include "vlsparse/policies/blindsight_params.hpp"
#include "vlsparse/reference/attention.hpp"

namespace vlsparse::reference {

// Masked prefill attention with one template per query head (heads.size() == H).
// q [n, H, d], k, v [n, H_kv, d], out [n, H, d]; ctx.n == n.
template <ElementType TQ, ElementType TK, OutputElement TO>
void masked_attention(View3<const TQ> q, View3<const TK> k, View3<const TK> v, const MaskContext& ctx,
                      std::span<const MaskTemplate> heads, View3<TO> out, const AttentionOptions& opt = {}) {
    constexpr const char* fn = "reference::masked_attention";
    detail::check_qkv(q, k, v, fn);
    const std::int64_t n = q.shape[0], H = q.shape[1], d = q.shape[2], group = H / k.shape[1];
    detail::require(k.shape[0] == n, fn, "q has ", n, " tokens and k has ", k.shape[0], ", expected equal (masked prefill)");
    detail::require(ctx.n == n && static_cast<std::int64_t>(ctx.token_image.size()) == n, fn, "mask covers ", ctx.n,
                    " tokens, the input has ", n, "; expected equal");
    detail::require(static_cast<std::int64_t>(heads.size()) == H, fn, heads.size(), " head templates given, q has ", H,
                    " query heads; expected one per query head");
    detail::check_out3(out, {n, H, d}, q, k, v, fn, "out");
    detail::check_all_finite(q, k, v, fn);
    const double scale = detail::resolve_scale(opt, d, fn);
    std::vector<double> probs, o;
    std::vector<std::int64_t> keys;
    for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t i = 0; i < n; ++i) {
            keys.clear();
            for (std::int64_t j = 0; j < n; ++j)
                if (ctx.allows(heads[static_cast<std::size_t>(h)], i, j)) keys.push_back(j);
            detail::attend_row(q.row(i, h), q.stride[2], k, v, h / group, keys, scale, probs, o);
            for (std::int64_t c = 0; c < d; ++c) detail::store(out(i, h, c), o[static_cast<std::size_t>(c)]);
        }
    ::vlsparse::detail::check_narrowed_output(out, fn, "out");  // fp16 / bf16 outputs: nothing rounded to inf
}

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
