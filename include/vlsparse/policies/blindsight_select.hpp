// vlsparse/policies/blindsight_select.hpp -- BlindSight's Algorithms 1 and 2 on given NMSEs (the
// first-wins template choice, the dataset-level aggregation, one template per KV group), the per-head
// NMSE of two outputs and Algorithm 1's sequencing over a backend's attention (characterize_prompt_over);
// no attention code, no Eigen, no xsimd, no OpenMP (nvcc compiles it). The Params,
// checks and the HeadMap / HeadCharacterization / TemplateCounts types are in
// policies/blindsight_params.hpp (included here).
//   Algorithm 1, per head: the first t in (Sink, Document, Document-Sink) with NMSE_t < alpha, else Dense.
//   Algorithm 2, per (layer, head): Dense if f_Dense > gamma_c, else Sink if f_Sink > gamma_s, else
//     Document if f_Document > gamma_d, else Document-Sink.
// BlindSight (Srikrishnan, Shah, Reinhardt 2025), Sections 4.1, 4.2.
// Include: <vlsparse/policies/blindsight.hpp> (or this header alone, without the attention code).
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "vlsparse/attention/common.hpp"
#include "vlsparse/core/error.hpp"
#include "vlsparse/core/layout.hpp"
#include "vlsparse/core/tensor.hpp"
#include "vlsparse/masks/templates.hpp"
#include "vlsparse/policies/blindsight_params.hpp"

namespace vlsparse {

// The three templates Algorithm 1 tries, in its order.
inline constexpr MaskTemplate kCandidateTemplates[] = {MaskTemplate::sink, MaskTemplate::document,
                                                       MaskTemplate::document_sink};

// The first-wins rule of Algorithm 1 on given NMSEs.
inline MaskTemplate choose_template(const std::array<double, 4>& nmse, double alpha) {
    for (MaskTemplate t : kCandidateTemplates)
        if (nmse[static_cast<std::size_t>(t)] < alpha) return t;
    return MaskTemplate::dense;
}

// Algorithm 2 for one head. Throws when no prompt was counted.
inline MaskTemplate aggregate_head(const TemplateCounts& c, const BlindSightParams& P = {}) {
    constexpr const char* fn = "blindsight_aggregate";
    check_blindsight_params(P, fn);
    for (std::size_t t = 0; t < 4; ++t)
        detail::require(c.count[t] >= 0, fn, "count[", to_string(static_cast<MaskTemplate>(t)), "] = ", c.count[t],
                        ", expected >= 0");
    const std::int64_t total = c.total();
    detail::require(total > 0, fn, "no prompts counted for this head, expected at least one");
    auto frac = [&](MaskTemplate t) { return static_cast<double>(c.count[static_cast<std::size_t>(t)]) / static_cast<double>(total); };
    if (frac(MaskTemplate::dense) > P.gamma_c) return MaskTemplate::dense;
    if (frac(MaskTemplate::sink) > P.gamma_s) return MaskTemplate::sink;
    if (frac(MaskTemplate::document) > P.gamma_d) return MaskTemplate::document;
    return MaskTemplate::document_sink;
}

// Algorithm 2 over a whole model: counts[layer * heads + head] -> templates (same order).
inline std::vector<MaskTemplate> aggregate(std::span<const TemplateCounts> counts, const BlindSightParams& P = {}) {
    std::vector<MaskTemplate> r;
    r.reserve(counts.size());
    for (const auto& c : counts) r.push_back(aggregate_head(c, P));
    return r;
}

// The smallest template whose mask contains both (Document and Sink -> Document-Sink; anything with
// Dense -> Dense): used to force one template per KV group without dropping pairs a head needs.
inline MaskTemplate template_union(MaskTemplate a, MaskTemplate b) {
    if (a == b) return a;
    if (a == MaskTemplate::dense || b == MaskTemplate::dense) return MaskTemplate::dense;
    return MaskTemplate::document_sink;
}

// Option (docs/blindsight.md, "Per KV group"): one template per KV group, the union of its query heads'
// templates.
inline std::vector<MaskTemplate> uniform_per_kv_group(std::span<const MaskTemplate> heads, std::int64_t kv_heads) {
    constexpr const char* fn = "uniform_per_kv_group";
    const auto H = static_cast<std::int64_t>(heads.size());
    detail::require(kv_heads > 0 && H > 0 && H % kv_heads == 0, fn, "H = ", H, " heads and H_kv = ", kv_heads,
                    ", expected H_kv > 0 dividing H");
    const std::int64_t group = H / kv_heads;
    std::vector<MaskTemplate> r(heads.begin(), heads.end());
    for (std::int64_t g = 0; g < kv_heads; ++g) {
        MaskTemplate u = heads[static_cast<std::size_t>(g * group)];
        for (std::int64_t h = g * group; h < (g + 1) * group; ++h) u = template_union(u, heads[static_cast<std::size_t>(h)]);
        for (std::int64_t h = g * group; h < (g + 1) * group; ++h) r[static_cast<std::size_t>(h)] = u;
    }
    return r;
}

namespace detail {

// ||a - b||^2 / ||b||^2 over the rows of head h of two [n, H, d] buffers (fp32 or double), in double;
// 0 when both are zero, infinite when only b is.
template <class T>
double head_nmse(const std::vector<T>& a, const std::vector<T>& b, std::int64_t n, std::int64_t H, std::int64_t d,
                 std::int64_t h) {
    double num = 0.0, den = 0.0;
    for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t c = 0; c < d; ++c) {
            const auto idx = static_cast<std::size_t>((i * H + h) * d + c);
            const double x = a[idx], y = b[idx];
            num += (x - y) * (x - y);
            den += y * y;
        }
    if (den == 0.0) return num == 0.0 ? 0.0 : INFINITY;
    return num / den;
}

}  // namespace detail

// Algorithm 1 for every head of one layer (prefill: q [n, H, d], k, v [n, H_kv, d], layout of n
// tokens), written once over a backend's ops: the checks, O_ref under the Dense template (causal, or
// causal with bidirectional images when P.mask asks), each candidate template in Algorithm 1's order
// with its NMSE per head (detail::head_nmse, in double), the first-wins choice. `ops` supplies the
// attention, in its own precision:
//   Ops::value_type                                   the outputs' element type (fp32 SIMD, double reference)
//   ops.masked(q, k, v, ctx, heads, out, opt)         masked attention, one template per query head, into
//                                                     out [n, H, d] of value_type
// O_ref is computed with P.check_finite, the candidates (same inputs) without the scan again.
// simd::characterize_prompt and reference::characterize_prompt call it; `fn` names the caller.
template <class Ops, class TQ, class TK>
std::vector<HeadCharacterization> characterize_prompt_over(View3<const TQ> q, View3<const TK> k, View3<const TK> v,
                                                           const Layout& layout, const BlindSightParams& P,
                                                           const Ops& ops, const char* fn) {
    using T = typename Ops::value_type;
    check_blindsight_params(P, fn);
    detail::check_qkv(q, k, v, fn);
    const std::int64_t n = q.shape[0], H = q.shape[1], d = q.shape[2];
    detail::require(k.shape[0] == n, fn, "q has ", n, " tokens and k has ", k.shape[0], ", expected equal (prefill)");
    layout.require_tokens(n, fn);
    const MaskContext ctx = make_mask_context(layout, P.mask);
    std::vector<T> ref(static_cast<std::size_t>(n * H * d)), o(ref.size());
    const View3<T> ref_v(ref.data(), {n, H, d}), o_v(o.data(), {n, H, d});
    ops.masked(q, k, v, ctx, std::vector<MaskTemplate>(static_cast<std::size_t>(H), MaskTemplate::dense), ref_v,
               AttentionOptions{P.scale, P.check_finite});
    std::vector<HeadCharacterization> r(static_cast<std::size_t>(H));
    for (MaskTemplate t : kCandidateTemplates) {
        ops.masked(q, k, v, ctx, std::vector<MaskTemplate>(static_cast<std::size_t>(H), t), o_v,
                   AttentionOptions{P.scale, false});
        for (std::int64_t h = 0; h < H; ++h)
            r[static_cast<std::size_t>(h)].nmse[static_cast<std::size_t>(t)] = detail::head_nmse(o, ref, n, H, d, h);
    }
    for (auto& c : r) c.chosen = choose_template(c.nmse, P.alpha);
    return r;
}

}  // namespace vlsparse
