// vlsparse/attention/dense.hpp -- dense causal attention, CPU fast path (namespace vlsparse::simd).
//
//   O[i,h,:] = sum_{j <= n_k - n_q + i} softmax_j(scale * q_{i,h} . k_{j,g}) v_{j,g},   g = h / (H / H_kv)
//
// Same signature and semantics as vlsparse::reference::dense_attention (switch backends by namespace);
// fp32 accumulation. The GEMM-shaped products run on Eigen (maps over packed fp32 rows), the row
// softmax on the xsimd kernels of detail/simd_kernels.hpp, blocked over query rows and chunked over
// keys with an online (running max) softmax, so the scratch stays in cache for any sequence length.
// With OpenMP (consumer compiles with -fopenmp) the (query head, query block) pairs run in parallel;
// Eigen's own threading does not nest (it runs single-threaded inside the parallel region). The
// instruction set is the one the consumer's flags allow (simd::native_arch); a trailing template
// argument (simd::scalar_arch) selects the always-compiled scalar kernels instead.
// A row whose fp32 scores or output overflow (possible only with finite inputs near the float range)
// is recomputed in double, so no input gives a silently wrong answer.
//
// The block engine (blocking, packing, online softmax, run_attention) is detail/block_engine.hpp,
// shared with sparse.hpp, probe.hpp and masked.hpp.
// Include: <vlsparse/vlsparse.hpp> (or this header alone).
#pragma once

#include "vlsparse/core/config.hpp"
VLSPARSE_GCC12_AVX512_DIAGNOSTICS_BEGIN

#include <cstdint>

#include "vlsparse/attention/common.hpp"
#include "vlsparse/detail/block_engine.hpp"

namespace vlsparse::simd {

// Dense causal attention. q [n_q, H, d], k, v [n_k, H_kv, d], out [n_q, H, d]; n_q <= n_k.
// Query i sits at position n_k - n_q + i. `Arch` picks the instruction set of the softmax kernels
// (default: what the consumer's flags allow; simd::scalar_arch forces the scalar kernels).
template <ElementType TQ, ElementType TK, OutputElement TO, class Arch = native_arch>
void dense_attention(View3<const TQ> q, View3<const TK> k, View3<const TK> v, View3<TO> out,
                     const AttentionOptions& opt = {}) {
    constexpr const char* fn = "simd::dense_attention";
    detail::check_qkv(q, k, v, fn);
    const std::int64_t nq = q.shape[0], H = q.shape[1], d = q.shape[2], nk = k.shape[0];
    detail::require(nq <= nk, fn, "q has ", nq, " tokens and k has ", nk, ", expected n_q <= n_k");
    detail::check_out3(out, {nq, H, d}, q, k, v, fn, "out");
    if (opt.check_finite) detail::check_all_finite(q, k, v, fn);
    const float scale = detail::resolve_scale(opt, d, fn);
    detail::run_attention<Arch>(q, k, v, out, scale, nullptr, UnselectedRows::zero);
    if (opt.check_finite) ::vlsparse::detail::check_narrowed_output(out, fn, "out");
}

}  // namespace vlsparse::simd

VLSPARSE_GCC12_AVX512_DIAGNOSTICS_END
