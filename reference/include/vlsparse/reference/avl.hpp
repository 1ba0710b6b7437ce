// vlsparse/reference/avl.hpp -- exact reference of A-VL's arithmetic: the last-token head-mean score,
// H2O's accumulated attention for the text budget, and one scheduled decode step.
//
//   s_j   = (1/H) sum_h softmax_{j}(scale q_{last,h} . k_{j,g(h)})             (score, every layer)
//   acc_a[j] = sum_{i} sum_{h in a} softmax_{j <= i}(scale q_{i,h} . k_{j,g(h)})  (H2O, group a)
// The selection and the schedule are the backend-independent code of vlsparse/policies/avl_params.hpp.
// Plain loops, double accumulation. Include: <vlsparse/reference/avl.hpp>
#pragma once

#include "vlsparse/policies/avl_select.hpp"
#include "vlsparse/policies/avl_schedule.hpp"
#include "vlsparse/reference/attention.hpp"
#include "vlsparse/reference/indexed_decode.hpp"

namespace vlsparse::reference {

// A-VL's score of every key: the attention of the last query row (position n_k - 1) averaged over all
// query heads. q [n_q, H, d], k [n_k, H_kv, d]; returns n_k scores.
template <ElementType TQ, ElementType TK>
std::vector<double> avl_scores(View3<const TQ> q, View3<const TK> k, const AttentionOptions& opt = {}) {
    constexpr const char* fn = "reference::avl_scores";
    detail::check_avl_qk(q, k, fn);
    const std::int64_t nq = q.shape[0], H = q.shape[1], nk = k.shape[0];
    const std::int64_t rows[1] = {nq - 1};
    std::vector<double> probs(static_cast<std::size_t>(H * nk));
    probe_attention(q, k, std::span<const std::int64_t>(rows), View3<double>(probs.data(), {H, 1, nk}), opt);
    std::vector<double> s(static_cast<std::size_t>(nk), 0.0);
    for (std::int64_t j = 0; j < nk; ++j) {
        double a = 0.0;
        for (std::int64_t h = 0; h < H; ++h) a += probs[static_cast<std::size_t>(h * nk + j)];
        s[static_cast<std::size_t>(j)] = a / static_cast<double>(H);
    }
    return s;
}

// H2O's accumulated attention over the whole causal prefill: one vector of n_k per KV head (summed over
// its query heads) or per query head (AvlTextGroups::per_query_head).
template <ElementType TQ, ElementType TK>
std::vector<std::vector<double>> avl_h2o_scores(View3<const TQ> q, View3<const TK> k, AvlTextGroups groups,
                                                const AttentionOptions& opt = {}) {
    constexpr const char* fn = "reference::avl_h2o_scores";
    detail::check_avl_qk(q, k, fn);
    const std::int64_t nq = q.shape[0], H = q.shape[1], nk = k.shape[0], group = H / k.shape[1];
    const std::int64_t G = groups == AvlTextGroups::per_kv_head ? k.shape[1] : H;
    std::vector<std::vector<double>> acc(static_cast<std::size_t>(G), std::vector<double>(static_cast<std::size_t>(nk), 0.0));
    std::vector<std::int64_t> rows(static_cast<std::size_t>(nq));
    std::iota(rows.begin(), rows.end(), std::int64_t{0});
    std::vector<double> probs(static_cast<std::size_t>(H * nq * nk));
    probe_attention(q, k, std::span<const std::int64_t>(rows), View3<double>(probs.data(), {H, nq, nk}), opt);
    for (std::int64_t h = 0; h < H; ++h) {
        auto& a = acc[static_cast<std::size_t>(groups == AvlTextGroups::per_kv_head ? h / group : h)];
        for (std::int64_t i = 0; i < nq; ++i)
            for (std::int64_t j = 0; j < nk; ++j) a[static_cast<std::size_t>(j)] += probs[static_cast<std::size_t>((h * nq + i) * nk + j)];
    }
    return acc;
}

// One A-VL decode step t: q [H, d] (the new token, whose K/V the caller has already appended to the
// cache) reads the positions the schedule gives for step t, by an index list of cache rows; on a
// refresh step the head-mean attention of the kept image positions re-ranks the core set. out [H, d].
template <ElementType TQ, ElementType TC, OutputElement TO>
AvlStep avl_decode_step(View2<const TQ> q, const KvCache<TC>& cache, DecodeSchedule& sched, std::int64_t t,
                        View2<TO> out, const AttentionOptions& opt = {}) {
    return avl_decode_step_over<double>(cache, q.shape[0], sched, t, [&](const CacheRows& rows, double* probs, std::int64_t L) {
        if (probs) indexed_decode_attention(q, cache, rows, out, View2<double>(probs, {q.shape[0], L}), opt);
        else indexed_decode_attention(q, cache, rows, out, opt);
    });
}

// A-VL's operations on the reference backend: the concept of golden::run_avl_case, for code written once
// over a backend (simd::AvlOps is the SIMD twin):
//   scores(q [n, H, d], k [n, H_kv, d][, opt]) -> [n] (avl_scores);  h2o(q, k, AvlTextGroups[, opt]) -> [G][n]
//   decode_step(q [H, d], KvCache, DecodeSchedule&, t, out [H, d][, opt]) -> AvlStep (avl_decode_step)
struct AvlOps {
    template <class... A> static auto scores(A&&... a) { return reference::avl_scores(std::forward<A>(a)...); }
    template <class... A> static auto h2o(A&&... a) { return reference::avl_h2o_scores(std::forward<A>(a)...); }
    template <class... A> static auto decode_step(A&&... a) { return reference::avl_decode_step(std::forward<A>(a)...); }
};

}  // namespace vlsparse::reference
