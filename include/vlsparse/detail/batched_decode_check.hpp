// vlsparse/detail/batched_decode_check.hpp -- the argument checks of batched decode attention shared
// by vlsparse::reference and vlsparse::simd (not for users). Both read host memory only.
//
// check_batched_decode: q [total_q, H, d] and out [total_q, H, d] (shapes, strides, out aliasing
// neither q nor the cache's K/V), the cache and host metadata (detail::check_kv_batch) and what lives
// behind their pointers: list contents, block tables, device-side lengths (detail::check_batch_contents).
// check_batched_probs: the probability span of the probs overloads. check_batch_finite: q and every
// K/V row some query reads, with the caller's row test (the reference's plain loop, the CPU path's
// widened scan). Include: internal (reference/batched_decode.hpp, attention/batched_decode.hpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <type_traits>

#include "vlsparse/attention/common.hpp"
#include "vlsparse/detail/check.hpp"
#include "vlsparse/kv/kv_batch.hpp"

namespace vlsparse::detail {

// Probabilities are written as float or double.
template <class T>
concept ProbElement = std::is_same_v<T, float> || std::is_same_v<T, double>;

template <class TQ, class TC, class TO>
void check_batched_decode(const View3<const TQ>& q, const KvBatchView<const TC>& cache, const BatchRowLists& lists,
                          const DecodeBatchHost& meta, const View3<TO>& out, const char* fn) {
    check_strides(q, fn, "q", false);
    check_strides(out, fn, "out", true);
    const std::int64_t H = q.shape[1], d = q.shape[2];
    require(d == cache.head_dim, fn, "q has head_dim ", d, ", the cache ", cache.head_dim, "; expected equal");
    check_kv_batch(cache, meta, H, fn);
    const std::int64_t total_q = meta.total_q(cache.batch);
    require(q.shape[0] == total_q, fn, "q has ", q.shape[0], " query tokens, expected total_q = ", total_q,
            meta.q_indptr.empty() ? " (one per sequence: q_indptr is empty)" : " (q_indptr[batch])");
    require(out.shape == q.shape, fn, "out has shape [", out.shape[0], ", ", out.shape[1], ", ", out.shape[2],
            "], expected [", q.shape[0], ", ", H, ", ", d, "] (the shape of q)");
    check_no_alias(out, q, fn, "out", "q");
    const std::int64_t extent = kv_batch_extent(cache);
    check_no_alias(out, TensorView<const TC, 1>(cache.k, {extent}), fn, "out", "cache k");
    check_no_alias(out, TensorView<const TC, 1>(cache.v, {extent}), fn, "out", "cache v");
    check_batch_contents(cache, lists, meta, fn);
}

// probs: one entry per element of lists.indices (CSR order); lists must not be dense.
template <class TP, class TQ, class TO>
void check_batched_probs(std::span<TP> probs, const BatchRowLists& lists, const DecodeBatchHost& meta,
                         const View3<const TQ>& q, const View3<TO>& out, const char* fn) {
    require(!lists.dense(), fn, "probabilities were asked for with dense lists (indptr null); they are written per "
            "list entry, so pass explicit row lists");
    const std::int64_t n = meta.list_indptr.back();
    require(static_cast<std::int64_t>(probs.size()) == n, fn, "probs has ", probs.size(),
            " entries, expected one per list entry: ", n, " (list indptr[batch x lists_per_seq])");
    const TensorView<TP, 1> pv(probs.data(), {n});
    check_strides(pv, fn, "probs", true);
    check_no_alias(pv, q, fn, "probs", "q");
    require(!overlaps(pv, out), fn, "output probs aliases output out; expected separate buffers");
}

// Every element of q and of every K/V row a query reads (the listed rows; dense: rows 0..seq_len-1)
// is finite; row_finite(const TC* row, d) tests one row of d contiguous elements.
template <class TQ, class TC, class RowFinite>
void check_batch_finite(const View3<const TQ>& q, const KvBatchView<const TC>& cache, const BatchRowLists& lists,
                        const DecodeBatchHost& meta, const char* fn, RowFinite&& row_finite) {
    check_finite(q, fn, "q");
    const std::int64_t d = cache.head_dim;
    for (std::int64_t b = 0; b < cache.batch; ++b) {
        const std::int64_t len = meta.seq_lens[static_cast<std::size_t>(b)];
        for (std::int64_t g = 0; g < cache.n_kv_heads; ++g) {
            const std::int64_t li = lists.list_of(b, g);
            const std::int64_t e0 = lists.dense() ? 0 : lists.indptr[li];
            const std::int64_t e1 = lists.dense() ? len : lists.indptr[li + 1];
            for (std::int64_t e = e0; e < e1; ++e) {
                const std::int64_t r = lists.dense() ? e : lists.indices[e];
                require(row_finite(cache.k_row(b, r, g), d), fn, "cache k row ", r, " of sequence ", b, ", KV head ", g,
                        " is not finite; expected finite values (no NaN or Inf)");
                require(row_finite(cache.v_row(b, r, g), d), fn, "cache v row ", r, " of sequence ", b, ", KV head ", g,
                        " is not finite; expected finite values (no NaN or Inf)");
            }
        }
    }
}

}  // namespace vlsparse::detail
