// vlsparse/policies/avl_schedule.hpp -- A-VL's decode schedule: the state machine that says which
// positions each decode step of one layer reads (core image tokens between refresh steps, every kept
// token on a refresh step) and re-ranks the core set after a refresh (A-VL, arXiv:2409.14846;
// docs/avl.md, "DecodeSchedule"). Backend-independent: the reference and the SIMD path drive the same
// schedule (reference::avl_decode_step, simd::avl_decode_step); cuda::AvlDecodeSchedule is its twin on
// the device.
// Include: <vlsparse/policies/avl.hpp> (SIMD path), <vlsparse/reference/avl.hpp> (reference), or this
// header alone.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <span>
#include <utility>
#include <vector>

#include "vlsparse/attention/cache_rows.hpp"
#include "vlsparse/core/error.hpp"
#include "vlsparse/core/selection.hpp"
#include "vlsparse/core/topk.hpp"
#include "vlsparse/policies/avl_select.hpp"

namespace vlsparse {

// Which positions each decode step of one layer reads (docs/avl.md, "DecodeSchedule").
// Decode step t (0-based, counted from the first token after the prompt):
//   - refresh step (K > 0 and t % K == 0), or K <= 0: every kept position, plus every decode token;
//   - otherwise: the core image positions, every kept non-image position, every decode token.
// After a refresh step the caller hands the step's head-mean attention to refresh(); the new core
// set (per span, the top core_budget of its kept image tokens) is used from step t + 1, or from
// t + 2 with async_refresh (computed off the critical path; step t + 1 still uses the old set).
class DecodeSchedule {
public:
    DecodeSchedule() = default;
    DecodeSchedule(const AvlSelection& sel, const AvlParams& P) : P_(P), sel_(sel), core_(sel.core) {
        P.validate("DecodeSchedule");
        const std::size_t G = sel.kept.groups();
        non_image_.resize(G);
        for (std::size_t g = 0; g < G; ++g)
            for (auto p : sel.kept.indices[g])
                if (!detail::in_spans(sel.spans, p)) non_image_[g].push_back(p);
    }

    const AvlParams& params() const { return P_; }
    const AvlSelection& selection() const { return sel_; }
    std::int64_t prompt_length() const { return sel_.n; }
    // True when step t reads every kept position (and re-ranks the core set).
    bool is_refresh(std::int64_t t) const { return P_.refresh_every <= 0 || t % P_.refresh_every == 0; }
    bool splits() const { return P_.refresh_every > 0; }
    // The core image positions in effect at step t (call begin_step(t) first).
    const std::vector<std::int64_t>& core() const { return core_; }
    // The scores the last refresh() ranked: (position, score) of every kept image token, in span order.
    const std::vector<std::pair<std::int64_t, double>>& last_refresh_scores() const { return last_scores_; }

    // Applies a pending core set that is due at step t. Steps must be begun in increasing order.
    void begin_step(std::int64_t t) {
        constexpr const char* fn = "DecodeSchedule::begin_step";
        detail::require(t >= 0 && t > last_step_, fn, "step ", t, ", expected steps in increasing order after ",
                        last_step_);
        last_step_ = t;
        if (has_pending_ && t >= pending_at_) {
            core_ = std::move(pending_);
            has_pending_ = false;
        }
    }

    // The positions step t reads when the sequence has seq_len tokens (decode tokens included): one
    // list per group of the kept selection (shared, or per KV head).
    TokenSelection positions(std::int64_t t, std::int64_t seq_len) const {
        constexpr const char* fn = "DecodeSchedule::positions";
        detail::require(seq_len > sel_.n, fn, "seq_len = ", seq_len, ", expected > the prompt length ", sel_.n,
                        " (append the decode token first)");
        TokenSelection s;
        s.n = seq_len;
        for (std::size_t g = 0; g < sel_.kept.groups(); ++g) {
            std::vector<std::int64_t> l;
            if (is_refresh(t)) {
                l = sel_.kept.indices[g];
            } else {
                l.reserve(core_.size() + non_image_[g].size());
                std::merge(core_.begin(), core_.end(), non_image_[g].begin(), non_image_[g].end(), std::back_inserter(l));
            }
            for (std::int64_t p = sel_.n; p < seq_len; ++p) l.push_back(p);
            s.indices.push_back(std::move(l));
        }
        return s;
    }

    // Re-rank the core set after refresh step t from that step's scores: score_of(position) for every
    // kept image position (head-mean attention of the step's query). Ties: lower position first.
    template <class F>
    void refresh(std::int64_t t, F&& score_of) {
        constexpr const char* fn = "DecodeSchedule::refresh";
        detail::require(splits() && is_refresh(t), fn, "step ", t, " is not a refresh step (K = ", P_.refresh_every, ")");
        detail::require(t == last_step_, fn, "step ", t, " is not the current step ", last_step_);
        std::vector<std::int64_t> next;
        last_scores_.clear();
        for (std::size_t i = 0; i < sel_.spans.size(); ++i) {
            const auto& kept = sel_.kept_image[i];
            std::vector<double> s(kept.size());
            for (std::size_t j = 0; j < kept.size(); ++j) {
                s[j] = static_cast<double>(score_of(kept[j]));
                detail::require(std::isfinite(s[j]), fn, "score of position ", kept[j], " = ", s[j], ", expected finite");
                last_scores_.emplace_back(kept[j], s[j]);
            }
            for (auto j : topk_indices(std::span<const double>(s), sel_.core_budget[i]))
                next.push_back(kept[static_cast<std::size_t>(j)]);
        }
        std::sort(next.begin(), next.end());
        if (P_.async_refresh) {
            pending_ = std::move(next);
            pending_at_ = t + 2;
            has_pending_ = true;
        } else {
            core_ = std::move(next);
        }
    }

private:
    AvlParams P_;
    AvlSelection sel_;
    std::vector<std::int64_t> core_, pending_;
    std::vector<std::vector<std::int64_t>> non_image_;
    std::vector<std::pair<std::int64_t, double>> last_scores_;
    std::int64_t last_step_ = -1, pending_at_ = 0;
    bool has_pending_ = false;
};

// One A-VL decode step t, written once for every backend: the positions the schedule gives for step t
// (as rows of `cache`), the step's attention by the backend's `decode`, and on a refresh step the core
// set re-ranked by the head-mean attention of the rows read. decode(rows, probs, L) computes the
// attention of the step's H query heads over `rows`; probs is null on a step that is not a refresh,
// else [H][L] (L = the longest list) to receive each head's probability of each listed row, in the
// backend's precision P (double for the reference, float for the SIMD path). reference::avl_decode_step
// and simd::avl_decode_step call it with their indexed decode attention.
template <class P, class TC, class Decode>
AvlStep avl_decode_step_over(const KvCache<TC>& cache, std::int64_t H, DecodeSchedule& sched, std::int64_t t,
                             Decode&& decode) {
    sched.begin_step(t);
    AvlStep st{t, sched.splits() && sched.is_refresh(t), sched.positions(t, cache.seq_len())};
    const CacheRows rows = rows_for_positions(cache, st.read);
    if (!st.refresh) {
        decode(rows, static_cast<P*>(nullptr), std::int64_t{0});
        return st;
    }
    const std::int64_t group = H / cache.n_kv_heads();
    const auto L = static_cast<std::size_t>(rows.longest());
    std::vector<P> probs(static_cast<std::size_t>(H) * L);
    decode(rows, probs.data(), static_cast<std::int64_t>(L));
    std::vector<double> score(static_cast<std::size_t>(cache.seq_len()), 0.0);
    for (std::int64_t h = 0; h < H; ++h) {
        const auto& list = st.read.for_kv_head(h / group);
        for (std::size_t i = 0; i < list.size(); ++i) score[static_cast<std::size_t>(list[i])] += probs[static_cast<std::size_t>(h) * L + i];
    }
    sched.refresh(t, [&](std::int64_t p) { return score[static_cast<std::size_t>(p)] / static_cast<double>(H); });
    return st;
}

}  // namespace vlsparse
