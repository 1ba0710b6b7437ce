// vlsparse/policies/avl.hpp -- A-VL, CPU fast path (namespace vlsparse::simd): the last-token
// head-mean score, H2O's accumulated attention, and one scheduled decode step by indexed decode
// attention (real skipping by index lists, not a -inf mask; GQA-correct).
//
//   s_j = (1/H) sum_h softmax_j(scale q_{last,h} . k_{j,g(h)})
//   decode step t: t % K == 0 -> every kept row + re-rank core; otherwise core image rows + non-image rows
//
// Same signatures and semantics as vlsparse/reference/avl.hpp; the selection, the prefill filter,
// H2O's text choice and PPCI are the shared code of avl_select.hpp, the DecodeSchedule of avl_schedule.hpp.
// Scores by simd::probe_attention (fp32 accumulation), head means in double.
// Include: <vlsparse/vlsparse.hpp> (or this header alone).
#pragma once

#include "vlsparse/attention/indexed_decode.hpp"
#include "vlsparse/attention/probe.hpp"
#include "vlsparse/policies/avl_schedule.hpp"
#include "vlsparse/policies/avl_select.hpp"

namespace vlsparse::simd {

// A-VL's score of every key (n_k values): last query row's attention averaged over all query heads.
template <ElementType TQ, ElementType TK>
std::vector<double> avl_scores(View3<const TQ> q, View3<const TK> k, const AttentionOptions& opt = {}) {
    constexpr const char* fn = "simd::avl_scores";
    detail::check_avl_qk(q, k, fn);
    const std::int64_t nq = q.shape[0], H = q.shape[1], nk = k.shape[0];
    const std::int64_t rows[1] = {nq - 1};
    std::vector<float> probs(static_cast<std::size_t>(H * nk));
    probe_attention(q, k, std::span<const std::int64_t>(rows), View3<float>(probs.data(), {H, 1, nk}), opt);
    std::vector<double> s(static_cast<std::size_t>(nk), 0.0);
    for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t j = 0; j < nk; ++j) s[static_cast<std::size_t>(j)] += probs[static_cast<std::size_t>(h * nk + j)];
    for (auto& x : s) x /= static_cast<double>(H);
    return s;
}

// H2O's accumulated attention over the causal prefill, per KV head or per query head; the query rows
// go through probe_attention in blocks of 64 (memory H x 64 x n_k floats).
template <ElementType TQ, ElementType TK>
std::vector<std::vector<double>> avl_h2o_scores(View3<const TQ> q, View3<const TK> k, AvlTextGroups groups,
                                                const AttentionOptions& opt = {}) {
    constexpr const char* fn = "simd::avl_h2o_scores";
    detail::check_avl_qk(q, k, fn);
    const std::int64_t nq = q.shape[0], H = q.shape[1], nk = k.shape[0], group = H / k.shape[1];
    const std::int64_t G = groups == AvlTextGroups::per_kv_head ? k.shape[1] : H;
    std::vector<std::vector<double>> acc(static_cast<std::size_t>(G), std::vector<double>(static_cast<std::size_t>(nk), 0.0));
    constexpr std::int64_t kBlock = 64;
    std::vector<float> probs;
    std::vector<std::int64_t> rows;
    for (std::int64_t i0 = 0; i0 < nq; i0 += kBlock) {
        const std::int64_t B = std::min(kBlock, nq - i0);
        rows.resize(static_cast<std::size_t>(B));
        std::iota(rows.begin(), rows.end(), i0);
        probs.resize(static_cast<std::size_t>(H * B * nk));
        probe_attention(q, k, std::span<const std::int64_t>(rows), View3<float>(probs.data(), {H, B, nk}), opt);
        for (std::int64_t h = 0; h < H; ++h) {
            auto& a = acc[static_cast<std::size_t>(groups == AvlTextGroups::per_kv_head ? h / group : h)];
            for (std::int64_t i = 0; i < B; ++i) {
                const float* pr = probs.data() + (h * B + i) * nk;
                for (std::int64_t j = 0; j < nk; ++j) a[static_cast<std::size_t>(j)] += pr[j];
            }
        }
    }
    return acc;
}

// One A-VL decode step t (see reference::avl_decode_step): reads the schedule's positions for step t
// by indexed decode attention; on a refresh step re-ranks the core set from the step's head-mean
// attention. out [H, d].
template <ElementType TQ, ElementType TC, OutputElement TO>
AvlStep avl_decode_step(View2<const TQ> q, const KvCache<TC>& cache, DecodeSchedule& sched, std::int64_t t,
                        View2<TO> out, const AttentionOptions& opt = {}) {
    return avl_decode_step_over<float>(cache, q.shape[0], sched, t, [&](const CacheRows& rows, float* probs, std::int64_t L) {
        if (probs) indexed_decode_attention(q, cache, rows, out, View2<float>(probs, {q.shape[0], L}), opt);
        else indexed_decode_attention(q, cache, rows, out, opt);
    });
}

// A-VL's operations on the SIMD backend: the concept of golden::run_avl_case (the signatures are listed
// at reference::AvlOps), for code written once over a backend.
struct AvlOps {
    template <class... A> static auto scores(A&&... a) { return simd::avl_scores(std::forward<A>(a)...); }
    template <class... A> static auto h2o(A&&... a) { return simd::avl_h2o_scores(std::forward<A>(a)...); }
    template <class... A> static auto decode_step(A&&... a) { return simd::avl_decode_step(std::forward<A>(a)...); }
};

}  // namespace vlsparse::simd
