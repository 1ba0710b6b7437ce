// vlsparse/attention/sparse.hpp -- token-sparse prefill attention, CPU fast path (namespace vlsparse::simd).
//
//   O[i,h,:] = sum_{j in T_g, j <= i} softmax_j(scale * q_{i,h} . k_{j,g}) v_{j,g}   for i in T_g,   g = h / (H / H_kv)
//
// ZipVL's token-level sparse prefill (Sec. 4.2, Algorithm 1): queries of the kept set T_g attend to the
// keys of T_g in causal order; rows not in T_g are zero (UnselectedRows::zero, the paper's "padded"
// output) or attend to the kept keys at or before their position (UnselectedRows::attend_selected).
// Same signature and semantics as vlsparse::reference::sparse_attention. Real skipping: the kept
// keys and values of each KV head are gathered into packed fp32 rows, and only the kept queries
// (or every query with attend_selected) run through the block engine of dense.hpp.
// Include: <vlsparse/vlsparse.hpp> (or this header alone).
#pragma once

#include "vlsparse/attention/dense.hpp"

namespace vlsparse::simd {

// Token-sparse attention over a TokenSelection (prefill, n_q == n_k == sel.n). q [n, H, d],
// k, v [n, H_kv, d], out [n, H, d].
template <ElementType TQ, ElementType TK, OutputElement TO, class Arch = native_arch>
void sparse_attention(View3<const TQ> q, View3<const TK> k, View3<const TK> v, const TokenSelection& sel,
                      View3<TO> out, UnselectedRows unselected = UnselectedRows::zero,
                      const AttentionOptions& opt = {}) {
    constexpr const char* fn = "simd::sparse_attention";
    detail::check_qkv(q, k, v, fn);
    const std::int64_t n = q.shape[0], H = q.shape[1], d = q.shape[2], Hkv = k.shape[1];
    detail::require(k.shape[0] == n, fn, "q has ", n, " tokens and k has ", k.shape[0],
                    ", expected equal (token-sparse prefill)");
    detail::require(sel.n == n, fn, "selection refers to ", sel.n, " tokens, the input has ", n);
    sel.validate(Hkv, fn);
    detail::require(unselected == UnselectedRows::zero || unselected == UnselectedRows::attend_selected, fn,
                    "unselected = ", static_cast<int>(unselected), ", expected zero or attend_selected");
    detail::check_out3(out, {n, H, d}, q, k, v, fn, "out");
    if (opt.check_finite) detail::check_all_finite(q, k, v, fn);
    const float scale = detail::resolve_scale(opt, d, fn);
    detail::run_attention<Arch>(q, k, v, out, scale, &sel, unselected);
    if (opt.check_finite) ::vlsparse::detail::check_narrowed_output(out, fn, "out");
}

}  // namespace vlsparse::simd
