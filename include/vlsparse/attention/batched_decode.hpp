// vlsparse/attention/batched_decode.hpp -- batched decode attention over a batch of contiguous or
// paged KV caches, dense or restricted to row lists: CPU fast path (namespace vlsparse::simd).
//
//   o_{i,h} = sum_{t in R_{b,g}, t <= n_b - q_b + i} softmax_t(scale * q_{i,h} . k_{b,g,t}) v_{b,g,t},
//   g = h / (H / H_kv)
//
// for every sequence b (n_b rows), each of its q_b new tokens i (1..8, causal among themselves) and
// each query head h, over the rows R_{b,g} of the list its KV head reads (every row when the lists
// are dense). The cache, lists and host metadata are described by vlsparse/kv/kv_batch.hpp, shared
// with the reference and the CUDA path. Same signature and semantics as
// vlsparse::reference::batched_decode_attention; fp32 accumulation; every pointer a host pointer.
//
// How it runs, and what it costs. Work items are (sequence, KV head, chunk of up to 128 list entries),
// run in parallel with OpenMP, each a local softmax merged exactly afterwards (as
// simd::indexed_decode_attention does). An item reads each of its K and V rows once, in place and in
// the cache's element type, for all q_len x (H / H_kv) query rows of its (sequence, KV head), through
// the group kernels of detail/group_kernels.hpp: when every stride of the cache is a multiple of d
// (contiguous caches, NHD and HND pages) a row's element offset is a multiple of d, so the page
// lookup becomes one index per row into the pool and the kernels run unchanged; other strides fall
// back to one kernel call per row (correct, several times slower). Costs beyond indexed decode: a
// query token's scores for the newest rows it may not see (at most q_len - 1 rows per list) are
// computed and then zeroed; the partial results (d + 2 floats per query row and chunk) are merged per
// sequence; with probabilities every item's scores are kept until the merge (q_len x H / H_kv x list
// length floats per (sequence, KV head)). A query row whose fp32 softmax overflows is recomputed in
// double. With opt.check_finite the listed K/V rows are scanned once more before the step.
// Include: <vlsparse/vlsparse.hpp> (or this header alone).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "vlsparse/attention/indexed_decode.hpp"
#include "vlsparse/detail/batched_decode_check.hpp"
#include "vlsparse/kv/kv_batch.hpp"

namespace vlsparse::simd {

namespace detail {

// attend_batch_row_double (the double fallback of a row): attention/indexed_decode.hpp.

// The engine. acc: null, or one float per list entry (zeroed by the caller) receiving
// sum_{i, h reading the list} P_{i,h}(row). chunk: list entries per work item (tests use tiny ones).
template <class Arch, class TQ, class TC, class TO>
void run_batched_decode(const View3<const TQ>& q, const KvBatchView<const TC>& cache, const BatchRowLists& lists,
                        const DecodeBatchHost& meta, const View3<TO>& out, float scale, float* acc,
                        std::int64_t chunk = kDecodeChunk) {
    using Kn = Kernels<Arch>;
    using Gk = GroupKernels<Arch>;
    const std::int64_t CH = std::max<std::int64_t>(chunk, 1);
    const std::int64_t B = cache.batch, H = q.shape[1], d = q.shape[2], Hkv = cache.n_kv_heads, group = H / Hkv;
    const bool dense = lists.dense();
    // Every row offset a multiple of d: rows are addressed as pool + index * d (see the header comment).
    const bool by_index = cache.row_stride % d == 0 && cache.head_stride % d == 0 &&
                          (cache.page_stride % d == 0 || (!cache.paged() && B == 1));

    struct Pair {  // one (sequence, KV head)
        std::int64_t b, g, q0, ql, len, e0, n, qoff, item0, item1;
    };
    struct Item {  // entries [t0, t1) of a pair's list
        std::int64_t pair, t0, t1, poff, soff;
    };
    std::vector<Pair> pairs;
    std::vector<Item> items;
    std::int64_t qf_size = 0, part_size = 0, score_size = 0, rows_max = 1;
    const std::int64_t pstride = d + 2;  // partial result of one query row: max, sum, o[d]
    for (std::int64_t b = 0; b < B; ++b) {
        const std::int64_t len = meta.seq_lens[static_cast<std::size_t>(b)], ql = meta.q_len(b);
        const std::int64_t q0 = meta.q_indptr.empty() ? b : meta.q_indptr[static_cast<std::size_t>(b)];
        rows_max = std::max(rows_max, ql * group);
        for (std::int64_t g = 0; g < Hkv; ++g) {
            const std::int64_t li = lists.list_of(b, g);
            const std::int64_t e0 = dense ? 0 : lists.indptr[li], n = dense ? len : lists.indptr[li + 1] - e0;
            Pair p{b, g, q0, ql, len, e0, n, qf_size, static_cast<std::int64_t>(items.size()), 0};
            qf_size += ql * group * d;
            for (std::int64_t t0 = 0; t0 < n; t0 += CH) {
                const std::int64_t t1 = std::min(n, t0 + CH);
                items.push_back({static_cast<std::int64_t>(pairs.size()), t0, t1, part_size, score_size});
                part_size += ql * group * pstride;
                if (acc) score_size += ql * group * (t1 - t0);
            }
            p.item1 = static_cast<std::int64_t>(items.size());
            pairs.push_back(p);
        }
    }
    auto row_at = [&](const Pair& p, std::int64_t t) -> std::int64_t { return dense ? t : lists.indices[p.e0 + t]; };

    // The queries of each pair, widened: rows (i, a) at qf + qoff + (i * group + a) * d.
    std::vector<float> qf(static_cast<std::size_t>(qf_size));
    for (const Pair& p : pairs)
        for (std::int64_t i = 0; i < p.ql; ++i)
            for (std::int64_t a = 0; a < group; ++a)
                widen_row(q.row(p.q0 + i, p.g * group + a), q.stride[2], qf.data() + p.qoff + (i * group + a) * d, d);

    std::vector<float> part(static_cast<std::size_t>(part_size)), kept(static_cast<std::size_t>(score_size));
    const int nthreads = max_threads();
    struct Scratch {
        std::vector<std::int64_t> idx, rows;
        std::vector<float> s;
    };
    std::vector<Scratch> scratch(static_cast<std::size_t>(nthreads));
    for (auto& s : scratch) {
        s.idx.resize(static_cast<std::size_t>(CH));
        s.rows.resize(static_cast<std::size_t>(CH));
        if (!acc) s.s.resize(static_cast<std::size_t>(rows_max * CH));
    }
    const auto n_items = static_cast<std::int64_t>(items.size());
    constexpr float ninf = -std::numeric_limits<float>::infinity();
    const std::int64_t zero = 0;
    ErrorSlot err;

    VLSPARSE_OMP(omp parallel for schedule(dynamic, 1) num_threads(nthreads))
    for (std::int64_t w = 0; w < n_items; ++w) {
        err.run([&] {
            const Item it = items[static_cast<std::size_t>(w)];
            const Pair& p = pairs[static_cast<std::size_t>(it.pair)];
            Scratch& sc = scratch[static_cast<std::size_t>(thread_id())];
            const std::int64_t cnt = it.t1 - it.t0, G = p.ql * group;
            for (std::int64_t t = 0; t < cnt; ++t) {
                const std::int64_t r = row_at(p, it.t0 + t);
                const std::int64_t off = cache.offset(p.b, r, p.g);
                sc.rows[static_cast<std::size_t>(t)] = r;
                sc.idx[static_cast<std::size_t>(t)] = by_index ? off / d : off;
            }
            const std::int64_t* idx = sc.idx.data();
            float* sg = acc ? kept.data() + it.soff : sc.s.data();  // scores [G, cnt], row stride cnt
            const float* qg = qf.data() + p.qoff;
            float* pw = part.data() + it.poff;
            if (by_index) {
                Gk::dots(qg, G, cache.k, idx, cnt, d, sg, cnt, cache.v);
            } else {
                for (std::int64_t t = 0; t < cnt; ++t) Gk::dots(qg, G, cache.k + idx[t], &zero, 1, d, sg + t, cnt);
            }
            for (std::int64_t i = 0; i < p.ql; ++i) {
                // Query i sees the entries with row <= its position: a prefix of the chunk.
                const std::int64_t pos = p.len - p.ql + i;
                const std::int64_t nv = std::upper_bound(sc.rows.begin(), sc.rows.begin() + cnt, pos) - sc.rows.begin();
                for (std::int64_t a = 0; a < group; ++a) {
                    const std::int64_t ra = i * group + a;
                    float* sa = sg + ra * cnt;
                    float* pr = pw + ra * pstride;
                    if (nv == 0) {
                        pr[0] = ninf;
                        pr[1] = 0.0f;
                    } else {
                        Kn::scale(sa, nv, scale);
                        pr[0] = Kn::max(sa, nv);
                        pr[1] = Kn::exp_sub_sum(sa, nv, pr[0]);
                    }
                    std::fill(sa + nv, sa + cnt, 0.0f);
                    std::fill(pr + 2, pr + pstride, 0.0f);
                }
            }
            if (by_index) {
                Gk::weighted_sum(pw + 2, pstride, sg, cnt, G, cache.v, idx, cnt, d);
            } else {
                for (std::int64_t t = 0; t < cnt; ++t)
                    Gk::weighted_sum(pw + 2, pstride, sg + t, cnt, G, cache.v + idx[t], &zero, 1, d);
            }
        });
    }
    err.rethrow();

    // Merge the chunks of every query row; sequences in parallel (a shared list's entries are summed
    // over the KV heads of one sequence, in one thread).
    VLSPARSE_OMP(omp parallel for schedule(dynamic, 1) num_threads(nthreads))
    for (std::int64_t b = 0; b < B; ++b) {
        err.run([&] {
            std::vector<float> o(static_cast<std::size_t>(d));
            std::vector<double> dp, dout(static_cast<std::size_t>(d));
            std::vector<std::int64_t> rows;
            for (std::int64_t g = 0; g < Hkv; ++g) {
                const Pair& p = pairs[static_cast<std::size_t>(b * Hkv + g)];
                for (std::int64_t i = 0; i < p.ql; ++i) {
                    const std::int64_t pos = p.len - p.ql + i;
                    auto sees = [&](const Item& it) { return row_at(p, it.t0) <= pos; };  // any entry of the chunk
                    for (std::int64_t a = 0; a < group; ++a) {
                        const std::int64_t ra = i * group + a, h = g * group + a;
                        float M = ninf;
                        bool ok = true;
                        for (std::int64_t c = p.item0; c < p.item1; ++c) {
                            const Item& it = items[static_cast<std::size_t>(c)];
                            if (!sees(it)) continue;
                            const float mc = part[static_cast<std::size_t>(it.poff + ra * pstride)];
                            ok &= std::isfinite(mc);
                            M = std::max(M, mc);
                        }
                        float Lsum = 0.0f;
                        std::fill(o.begin(), o.end(), 0.0f);
                        if (ok) {
                            for (std::int64_t c = p.item0; c < p.item1; ++c) {
                                const Item& it = items[static_cast<std::size_t>(c)];
                                if (!sees(it)) continue;
                                const float* pc = part.data() + it.poff + ra * pstride;
                                const float wgt = std::exp(pc[0] - M);
                                Lsum += wgt * pc[1];
                                Kn::axpy(o.data(), wgt, pc + 2, d);
                            }
                            ok = std::isfinite(Lsum) && Lsum > 0.0f;
                        }
                        if (ok) {
                            Kn::scale(o.data(), d, 1.0f / Lsum);
                            ok = Kn::all_finite(o.data(), d);
                        }
                        if (ok) {
                            for (std::int64_t c = 0; c < d; ++c) store(out(p.q0 + i, h, c), o[static_cast<std::size_t>(c)]);
                            if (acc)
                                for (std::int64_t c = p.item0; c < p.item1; ++c) {
                                    const Item& it = items[static_cast<std::size_t>(c)];
                                    if (!sees(it)) continue;
                                    const std::int64_t cnt = it.t1 - it.t0;
                                    const float* sc = kept.data() + it.soff + ra * cnt;
                                    const float f = std::exp(part[static_cast<std::size_t>(it.poff + ra * pstride)] - M) / Lsum;
                                    float* ac = acc + p.e0 + it.t0;
                                    for (std::int64_t t = 0; t < cnt; ++t) ac[t] += sc[t] * f;
                                }
                        } else {  // fp32 overflow (or non-finite input with check_finite off): this row in double
                            rows.clear();
                            for (std::int64_t t = 0; t < p.n && row_at(p, t) <= pos; ++t) rows.push_back(row_at(p, t));
                            const auto m = static_cast<std::int64_t>(rows.size());
                            attend_batch_row_double(q.row(p.q0 + i, h), q.stride[2], cache, b, g, rows.data(), m,
                                                    static_cast<double>(scale), dp, dout.data());
                            for (std::int64_t c = 0; c < d; ++c) store(out(p.q0 + i, h, c), dout[static_cast<std::size_t>(c)]);
                            if (acc)
                                for (std::int64_t t = 0; t < m; ++t)
                                    acc[p.e0 + t] += static_cast<float>(dp[static_cast<std::size_t>(t)]);
                        }
                    }
                }
            }
        });
    }
    err.rethrow();
}

template <class Arch, class TQ, class TC, class TO>
float check_batched_decode(const View3<const TQ>& q, const KvBatchView<const TC>& cache, const BatchRowLists& lists,
                           const DecodeBatchHost& meta, const View3<TO>& out, const AttentionOptions& opt,
                           const char* fn) {
    ::vlsparse::detail::check_batched_decode(q, cache, lists, meta, out, fn);
    if (opt.check_finite) {
        std::vector<float> buf(static_cast<std::size_t>(cache.head_dim));
        check_batch_finite(q, cache, lists, meta, fn, [&](const TC* row, std::int64_t n) {
            widen_row(row, 1, buf.data(), n);
            return Kernels<Arch>::all_finite(buf.data(), n);
        });
    }
    return resolve_scale(opt, q.shape[2], fn);
}

}  // namespace detail

// Decode step of a batch: q [total_q, H, d] (any strides), out [total_q, H, d]; cache, lists and meta
// as in vlsparse/kv/kv_batch.hpp (lists.indptr null: dense decode). Same checks as the reference;
// opt.check_finite off skips only the NaN/Inf scan of q and the listed rows before the step and the
// scan of fp16 / bf16 outputs for values the narrowing turned into inf after it.
template <ElementType TQ, ElementType TC, OutputElement TO, class Arch = native_arch>
void batched_decode_attention(View3<const TQ> q, const KvBatchView<const TC>& cache, const BatchRowLists& lists,
                              const DecodeBatchHost& meta, View3<TO> out, const AttentionOptions& opt = {}) {
    constexpr const char* fn = "simd::batched_decode_attention";
    const float scale = detail::check_batched_decode<Arch>(q, cache, lists, meta, out, opt, fn);
    detail::run_batched_decode<Arch>(q, cache, lists, meta, out, scale, nullptr);
    if (opt.check_finite) ::vlsparse::detail::check_narrowed_output(out, fn, "out");
}

// Same, also writing probabilities (float or double): one entry per element of lists.indices (CSR
// order; lists must not be dense), probs[e] = sum over the sequence's query tokens i of the mean over
// the heads reading the list of P_{i,h}(row), 0 where the row is after query i (see
// reference::batched_decode_attention). Accumulated in fp32.
template <ElementType TQ, ElementType TC, OutputElement TO, detail::ProbElement TP, class Arch = native_arch>
void batched_decode_attention(View3<const TQ> q, const KvBatchView<const TC>& cache, const BatchRowLists& lists,
                              const DecodeBatchHost& meta, View3<TO> out, std::span<TP> probs,
                              const AttentionOptions& opt = {}) {
    constexpr const char* fn = "simd::batched_decode_attention";
    const float scale = detail::check_batched_decode<Arch>(q, cache, lists, meta, out, opt, fn);
    detail::check_batched_probs(probs, lists, meta, q, out, fn);
    std::vector<float> acc(probs.size(), 0.0f);
    detail::run_batched_decode<Arch>(q, cache, lists, meta, out, scale, acc.data());
    const float readers = static_cast<float>(lists.lists_per_seq == 1 ? q.shape[1] : q.shape[1] / cache.n_kv_heads);
    for (std::size_t e = 0; e < probs.size(); ++e) probs[e] = static_cast<TP>(acc[e] / readers);
    if (opt.check_finite) ::vlsparse::detail::check_narrowed_output(out, fn, "out");
}

}  // namespace vlsparse::simd
