// vlsparse/reference/batched_decode.hpp -- exact reference of batched decode attention over a batch
// of contiguous or paged KV caches, dense or restricted to row lists.
//
//   o_{i,h} = sum_{t in R_{b,g}, t <= n_b - q_b + i} softmax_t(scale * q_{i,h} . k_{b,g,t}) v_{b,g,t},
//   g = h / (H / H_kv)
//
// for every sequence b of the batch (n_b = seq_lens[b] rows), each of its q_b new tokens i (query row
// q_indptr[b] + i of q; q_b in 1..8, causal among themselves) and each query head h, over the rows
// R_{b,g} of the list its KV head reads (lists.list_of(b, g); every row when the lists are dense).
// The cache, lists and host metadata are described by vlsparse/kv/kv_batch.hpp, the description the
// CPU path (vlsparse::simd) and the CUDA path read too. Rows are read in place through the block
// table, never gathered. With B = 1, a contiguous cache and q_len = 1 this is exactly
// reference::indexed_decode_attention. Plain loops, double accumulation; every pointer is a host
// pointer. Include: <vlsparse/reference/batched_decode.hpp>
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "vlsparse/detail/batched_decode_check.hpp"
#include "vlsparse/kv/kv_batch.hpp"
#include "vlsparse/reference/attention.hpp"

namespace vlsparse::reference {

namespace detail {

// softmax(scale * q . k_t) over the rows k[0..m), then the weighted sum of the rows v[0..m): the
// arithmetic of attend_row (reference/attention.hpp) in the same order, over row pointers (each row
// d contiguous elements) instead of a view.
template <class TQ, class TC>
void attend_row_ptrs(const TQ* q, std::int64_t q_stride, const TC* const* k, const TC* const* v, std::size_t m,
                     std::int64_t d, double scale, std::vector<double>& probs, std::vector<double>& o) {
    probs.assign(m, 0.0);
    o.assign(static_cast<std::size_t>(d), 0.0);
    if (m == 0) return;
    double mx = -std::numeric_limits<double>::infinity();
    for (std::size_t t = 0; t < m; ++t) {
        double s = 0.0;
        for (std::int64_t c = 0; c < d; ++c)
            s += static_cast<double>(to_float(q[c * q_stride])) * static_cast<double>(to_float(k[t][c]));
        probs[t] = s * scale;
        mx = std::max(mx, probs[t]);
    }
    double sum = 0.0;
    for (auto& p : probs) {
        p = std::exp(p - mx);
        sum += p;
    }
    for (auto& p : probs) p /= sum;
    for (std::size_t t = 0; t < m; ++t)
        for (std::int64_t c = 0; c < d; ++c)
            o[static_cast<std::size_t>(c)] += probs[t] * static_cast<double>(to_float(v[t][c]));
}

// acc: null, or one double per list entry receiving sum_{i, h reading the list} P_{i,h}(row).
template <class TQ, class TC, class TO>
void run_batched_decode(const View3<const TQ>& q, const KvBatchView<const TC>& cache, const BatchRowLists& lists,
                        const DecodeBatchHost& meta, const View3<TO>& out, double* acc, const AttentionOptions& opt,
                        const char* fn) {
    const std::int64_t B = cache.batch, H = q.shape[1], d = q.shape[2], group = H / cache.n_kv_heads;
    check_batch_finite(q, cache, lists, meta, fn, [](const TC* row, std::int64_t n) {
        for (std::int64_t c = 0; c < n; ++c)
            if (!std::isfinite(to_float(row[c]))) return false;
        return true;
    });
    const double scale = resolve_scale(opt, d, fn);
    std::vector<std::int64_t> rows;
    std::vector<const TC*> kr, vr;
    std::vector<double> p, o;
    for (std::int64_t b = 0; b < B; ++b) {
        const std::int64_t len = meta.seq_lens[static_cast<std::size_t>(b)], ql = meta.q_len(b);
        const std::int64_t q0 = meta.q_indptr.empty() ? b : meta.q_indptr[static_cast<std::size_t>(b)];
        for (std::int64_t g = 0; g < cache.n_kv_heads; ++g) {
            // The rows of KV head g's list (dense: 0 .. len - 1) and where they live.
            const std::int64_t li = lists.list_of(b, g);
            const std::int64_t e0 = lists.dense() ? 0 : lists.indptr[li];
            const std::int64_t e1 = lists.dense() ? len : lists.indptr[li + 1];
            rows.clear();
            kr.clear();
            vr.clear();
            for (std::int64_t e = e0; e < e1; ++e) {
                const std::int64_t r = lists.dense() ? e : lists.indices[e];
                rows.push_back(r);
                kr.push_back(cache.k_row(b, r, g));
                vr.push_back(cache.v_row(b, r, g));
            }
            for (std::int64_t i = 0; i < ql; ++i) {
                // Query i sits at position len - ql + i and sees the listed rows up to it: a prefix.
                const std::int64_t pos = len - ql + i;
                const auto visible =
                    static_cast<std::size_t>(std::upper_bound(rows.begin(), rows.end(), pos) - rows.begin());
                for (std::int64_t a = 0; a < group; ++a) {
                    const std::int64_t h = g * group + a;
                    attend_row_ptrs(q.row(q0 + i, h), q.stride[2], kr.data(), vr.data(), visible, d, scale, p, o);
                    for (std::int64_t c = 0; c < d; ++c) store(out(q0 + i, h, c), o[static_cast<std::size_t>(c)]);
                    if (acc)
                        for (std::size_t t = 0; t < visible; ++t) acc[e0 + static_cast<std::int64_t>(t)] += p[t];
                }
            }
        }
    }
    check_narrowed_output(out, fn, "out");  // fp16 / bf16 outputs: nothing rounded to inf
}

}  // namespace detail

// Decode step of a batch. q [total_q, H, d] (any strides), out [total_q, H, d]; cache, lists and meta
// as in vlsparse/kv/kv_batch.hpp (meta: the host copy of the lengths and indptr arrays; lists:
// lists.indptr null for dense decode). Throws vlsparse::error on any malformed input: shapes, strides,
// lengths, q_len outside 1..8 or above a sequence's length, indptr arrays, list entries unsorted,
// duplicated or outside the sequence, block-table entries outside the pool, a new token that sees no
// listed row, non-finite q or K/V rows that are read, out aliasing q or the cache, an fp16 / bf16
// output the narrowing turned into inf.
template <ElementType TQ, ElementType TC, OutputElement TO>
void batched_decode_attention(View3<const TQ> q, const KvBatchView<const TC>& cache, const BatchRowLists& lists,
                              const DecodeBatchHost& meta, View3<TO> out, const AttentionOptions& opt = {}) {
    constexpr const char* fn = "reference::batched_decode_attention";
    detail::check_batched_decode(q, cache, lists, meta, out, fn);
    detail::run_batched_decode(q, cache, lists, meta, out, nullptr, opt, fn);
}

// Same, also writing probabilities: probs has one entry per element of lists.indices (CSR order; the
// lists must not be dense). For entry e, a row of list l of sequence b,
//
//   probs[e] = sum_{i < q_len_b} mean_{h reading list l} P_{i,h}(row)
//
// with P_{i,h} the softmax probability of query token i, head h (0 where the row is after query i)
// and the heads reading list l all H heads when lists_per_seq == 1, else the H / H_kv heads of KV
// head l. With q_len = 1 this is the mean attention a row received (H2O's accumulated score).
template <ElementType TQ, ElementType TC, OutputElement TO, detail::ProbElement TP>
void batched_decode_attention(View3<const TQ> q, const KvBatchView<const TC>& cache, const BatchRowLists& lists,
                              const DecodeBatchHost& meta, View3<TO> out, std::span<TP> probs,
                              const AttentionOptions& opt = {}) {
    constexpr const char* fn = "reference::batched_decode_attention";
    detail::check_batched_decode(q, cache, lists, meta, out, fn);
    detail::check_batched_probs(probs, lists, meta, q, out, fn);
    std::vector<double> acc(probs.size(), 0.0);
    detail::run_batched_decode(q, cache, lists, meta, out, acc.data(), opt, fn);
    const double readers = lists.lists_per_seq == 1 ? static_cast<double>(q.shape[1])
                                                    : static_cast<double>(q.shape[1] / cache.n_kv_heads);
    for (std::size_t e = 0; e < probs.size(); ++e) probs[e] = static_cast<TP>(acc[e] / readers);
}

}  // namespace vlsparse::reference
