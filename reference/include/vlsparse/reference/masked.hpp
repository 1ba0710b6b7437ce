// vlsparse/reference/masked.hpp -- the exact reference of masked prefill attention (the oracle of
// simd::masked_attention, <vlsparse/attention/masked.hpp>, and of the CUDA prefill kernels).
//
//   O[i,h,:] = sum_{j : allowed_h(i, j)} softmax_j(scale * q_{i,h} . k_{j,g}) v_{j,g},   g = h / (H / H_kv)
// with allowed_h(i, j) = MaskContext::allows(template of head h, i, j) (masks/templates.hpp), evaluated
// pair by pair over all n keys: never through the block lists of a BlockMask, so a wrong block list
// of a fast path shows up against it. Plain loops, double accumulation; a row with no allowed key
// cannot occur (every query may attend to itself). NaN/Inf inputs are always an error here.
// Two forms: a MaskContext and one template per query head, or a BlockMask (its context and head
// templates; the same signature as simd::masked_attention).
// Include: <vlsparse/reference/masked.hpp>
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "vlsparse/masks/block_mask.hpp"
#include "vlsparse/masks/templates.hpp"
#include "vlsparse/reference/attention.hpp"

namespace vlsparse::reference {

// Masked prefill attention with one template per query head (heads.size() == H).
// q [n, H, d], k, v [n, H_kv, d], out [n, H, d]; ctx.n == n.
template <ElementType TQ, ElementType TK, OutputElement TO>
void masked_attention(View3<const TQ> q, View3<const TK> k, View3<const TK> v, const MaskContext& ctx,
                      std::span<const MaskTemplate> heads, View3<TO> out, const AttentionOptions& opt = {}) {
    constexpr const char* fn = "reference::masked_attention";
    ::vlsparse::detail::check_masked_context_args(q, k, v, ctx, heads, out, fn);  // the checks of every backend
    const std::int64_t n = q.shape[0], H = q.shape[1], d = q.shape[2], group = H / k.shape[1];
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

// Masked prefill attention over a BlockMask, as simd::masked_attention: q [n, H, d], k, v [n, H_kv, d],
// out [n, H, d]; mask.n == n and mask.heads == H. The pairs are those of mask.context and
// mask.head_template, evaluated one by one (the block lists are only checked for consistency).
template <ElementType TQ, ElementType TK, OutputElement TO>
void masked_attention(View3<const TQ> q, View3<const TK> k, View3<const TK> v, const BlockMask& mask, View3<TO> out,
                      const AttentionOptions& opt = {}) {
    constexpr const char* fn = "reference::masked_attention";
    ::vlsparse::detail::check_masked_args(q, k, v, mask, out, fn);  // the checks of every backend
    masked_attention(q, k, v, mask.context, std::span<const MaskTemplate>(mask.head_template), out, opt);
}

}  // namespace vlsparse::reference
