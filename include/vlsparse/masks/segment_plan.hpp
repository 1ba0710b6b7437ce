// vlsparse/masks/segment_plan.hpp -- the key segments of a block-sparse prefill: for every template and
// query block, the keys its rows may see as a short list of ranges, each with the cheapest way to compute
// it. The GPU's block-sparse prefill (cuda::MaskedPrefillPlan, cuda/prefill/kernels_*.cuh) runs on it.
//
// A segment is a range of key positions [lo, hi) of one query block (rows [r0, r1)) with a kind:
//   full      every (row, key) pair of the range is allowed: computed without evaluating the mask;
//   causal    the allowed pairs are exactly key <= row: a position compare;
//   general   anything else: the mask (templates.hpp: template AND video mask) evaluated per pair;
//   diagonal  row r sees exactly one key of the range, r - delta, and no other: PureKV's temporal keys
//             (the same slot one frame back). A kernel computes one score per row (no tile of which one
//             column is used); a kernel without that path may evaluate it as a general segment, which
//             yields the same pairs.
// Cut from the per-block counts of block_mask.hpp (64-key column blocks): a column block whose count
// fills its trimmed range is full, one whose count equals the causal count of its range is causal (every
// template and video mask is a subset of causal without bidirectional images, so equal counts mean equal
// sets), the rest general; touching full and causal ranges merge. A diagonal is taken out first when the
// query block lies in frame f >= 1 of a video under the temporal or spatial-temporal mask (delta = the
// frame's token count T, so the candidate keys are [r0 - T, r1 - T)): it is used only when every row
// may see its key r - T and the rows may see no other key of that range (counted), and the column
// blocks around it are then cut at the range's ends, so no other segment covers a key of it.
// Plain integers and std::vector only; nvcc compiles it too. Internal to the backends (namespace
// vlsparse::detail). Include: <vlsparse/masks/segment_plan.hpp>
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

#include "vlsparse/core/error.hpp"
#include "vlsparse/masks/block_mask.hpp"
#include "vlsparse/masks/templates.hpp"

namespace vlsparse::detail {

enum KeySegmentKind : int { kKeySegFull = 0, kKeySegCausal = 1, kKeySegGeneral = 2, kKeySegDiagonal = 4 };

// Key positions [lo, hi) of one query block, their kind, and (diagonal segments) the distance delta:
// row r sees key r - delta.
struct KeySegment {
    int lo = 0, hi = 0, kind = kKeySegFull, delta = 0;
};

// One work item: one query head's rows [row_lo, row_hi) and its segments segs[seg_begin, seg_end).
struct SegmentItem {
    int head = 0, row_lo = 0, row_hi = 0, seg_begin = 0, seg_end = 0, pad0 = 0, pad1 = 0, pad2 = 0;
};

struct SegmentPlan {
    std::vector<KeySegment> segs;   // per (template, query block), in key order
    std::vector<SegmentItem> items; // per (head, query block), the longest first
    std::int64_t allowed = 0;       // allowed pairs, summed over heads
    std::int64_t computed = 0;      // rows x keys of every non-diagonal segment + one pair per diagonal row
    std::int64_t diagonal_rows = 0; // rows whose key was taken out as a diagonal, summed over heads
    std::int64_t block_pairs = 0;   // BlockMask::computed_pairs of the same query blocks and kb-key blocks
};

// The candidate diagonal of query block [r0, r1): delta = T when the block lies in frame >= 1 of a video
// whose mask keeps the same slot one frame back; 0 otherwise.
inline std::int64_t diagonal_candidate(const MaskContext& ctx, std::int64_t r0, std::int64_t r1) {
    if (ctx.video != VideoMask::temporal && ctx.video != VideoMask::spatial_temporal) return 0;
    const std::int32_t a = ctx.token_image[static_cast<std::size_t>(r0)];
    if (a < 0 || static_cast<std::size_t>(a) >= ctx.image_frame_tokens.size()) return 0;
    const std::int64_t T = ctx.image_frame_tokens[static_cast<std::size_t>(a)];
    if (T <= 0 || r0 - T < ctx.image_start[static_cast<std::size_t>(a)]) return 0;
    if (ctx.token_image[static_cast<std::size_t>(r1 - 1)] != a) return 0;
    return T;
}

// The segments of every used template's query blocks and the items of every head. q_start: the query
// blocks (BlockMask::q_block_start); kb: the column blocks of the counts (the kernel's key tile).
inline SegmentPlan plan_key_segments(const MaskContext& ctx, std::span<const MaskTemplate> heads,
                                     const std::vector<std::int64_t>& q_start, std::int64_t kb) {
    constexpr const char* fn = "plan_key_segments";
    require(kb >= 1, fn, "kb = ", kb, ", expected >= 1");
    require(q_start.size() >= 2 && q_start.front() == 0 && q_start.back() == ctx.n, fn,
            "query blocks do not cover the context's ", ctx.n, " tokens");
    const std::int64_t n = ctx.n, nkb = (n + kb - 1) / kb;
    const auto nqb = static_cast<std::int64_t>(q_start.size()) - 1;
    SegmentPlan plan;
    std::vector<std::int64_t> seg_off(static_cast<std::size_t>(4 * nqb + 1), 0);  // [template][qb] -> first segment
    std::vector<std::int64_t> work(static_cast<std::size_t>(4 * nqb), 0);         // rows x tile-rounded keys
    std::int64_t allowed_t[4] = {0, 0, 0, 0}, computed_t[4] = {0, 0, 0, 0}, diag_t[4] = {0, 0, 0, 0},
                 block_t[4] = {0, 0, 0, 0};
    bool used[4] = {false, false, false, false};
    for (auto t : heads) used[static_cast<int>(t)] = true;
    std::vector<KeyInterval> iv;
    auto merge_kind = [&](int x, int y) {  // the kind two touching segments merge into, or -1
        if (x == kKeySegDiagonal || y == kKeySegDiagonal) return -1;
        if (x == y) return x;
        if (!ctx.bidirectional_images && (x == kKeySegFull || x == kKeySegCausal) && (y == kKeySegFull || y == kKeySegCausal))
            return static_cast<int>(kKeySegCausal);
        return -1;
    };

    // A range's pair count and trimmed key range over the block's rows.
    struct Stat {
        std::int64_t cnt = 0, lo = 0, hi = 0;
    };
    auto range_stat = [&](MaskTemplate t, std::int64_t r0, std::int64_t r1, std::int64_t klo, std::int64_t khi) {
        Stat s{0, khi, klo};
        for (std::int64_t r = r0; r < r1; ++r) {
            ctx.row_intervals(t, r, iv);
            for (const auto& x : iv) {
                const std::int64_t lo = std::max(x.lo, klo), hi = std::min(x.hi, khi);
                if (lo >= hi) continue;
                s.cnt += hi - lo;
                s.lo = std::min(s.lo, lo);
                s.hi = std::max(s.hi, hi);
            }
        }
        return s;
    };

    for (int t = 0; t < 4; ++t) {
        if (!used[t]) {
            for (std::int64_t b = 0; b < nqb; ++b)
                seg_off[static_cast<std::size_t>(t * nqb + b + 1)] = static_cast<std::int64_t>(plan.segs.size());
            continue;
        }
        const auto tm = static_cast<MaskTemplate>(t);
        const BlockStats st = block_counts(ctx, tm, q_start, kb, nkb);
        for (std::int64_t b = 0; b < nqb; ++b) {
            const std::int64_t r0 = q_start[static_cast<std::size_t>(b)], r1 = q_start[static_cast<std::size_t>(b) + 1];
            const std::int64_t rows = r1 - r0;
            for (std::int64_t c = 0; c < nkb; ++c) {  // every listed block trimmed to its allowed keys
                const auto i = static_cast<std::size_t>(b * nkb + c);
                if (st.cnt[i] > 0) block_t[t] += rows * (st.hi[i] - st.lo[i]);
            }
            // The diagonal, if the block has one: keys [dlo, dhi), column blocks ca .. cb cut around it.
            std::int64_t delta = diagonal_candidate(ctx, r0, r1), dlo = 0, dhi = 0, ca = nkb, cb = -1;
            if (delta > 0) {
                dlo = r0 - delta;
                dhi = r1 - delta;
                bool every = true;
                for (std::int64_t r = r0; r < r1 && every; ++r) every = ctx.allows(tm, r, r - delta);
                if (every && range_stat(tm, r0, r1, dlo, dhi).cnt == rows) {
                    ca = dlo / kb;
                    cb = (dhi - 1) / kb;
                } else {
                    delta = 0;
                }
            }
            // The block's ranges in key order: column blocks, or around the diagonal the pieces of the
            // cut column blocks and the diagonal itself.
            struct Range {
                Stat s;
                bool diagonal = false;
            };
            std::vector<Range> ranges;
            for (std::int64_t c = 0; c < nkb; ++c) {
                if (c == ca) {
                    const Stat left = range_stat(tm, r0, r1, ca * kb, dlo);
                    if (left.cnt > 0) ranges.push_back({left, false});
                    ranges.push_back({Stat{rows, dlo, dhi}, true});
                    const Stat right = range_stat(tm, r0, r1, dhi, std::min(n, (cb + 1) * kb));
                    if (right.cnt > 0) ranges.push_back({right, false});
                    c = cb;
                    continue;
                }
                const auto i = static_cast<std::size_t>(b * nkb + c);
                if (st.cnt[i] > 0) ranges.push_back({Stat{st.cnt[i], st.lo[i], st.hi[i]}, false});
            }
            const std::size_t first = plan.segs.size();
            std::int64_t cols = 0;
            for (const Range& rg : ranges) {
                const std::int64_t lo = rg.s.lo, hi = rg.s.hi;
                allowed_t[t] += rg.s.cnt;
                if (rg.diagonal) {
                    plan.segs.push_back({static_cast<int>(lo), static_cast<int>(hi), kKeySegDiagonal, static_cast<int>(delta)});
                    computed_t[t] += rows;
                    diag_t[t] += rows;
                    continue;
                }
                int kind = kKeySegGeneral;
                if (rg.s.cnt == rows * (hi - lo)) {
                    kind = kKeySegFull;
                } else if (!ctx.bidirectional_images) {
                    // Every mask is causal without bidirectional images (allowed pairs are a subset of
                    // j <= i), so an equal count means the allowed pairs are exactly the causal ones.
                    std::int64_t causal = 0;
                    for (std::int64_t r = r0; r < r1; ++r) causal += std::max<std::int64_t>(0, std::min(hi, r + 1) - lo);
                    if (causal == rg.s.cnt) kind = kKeySegCausal;
                }
                if (plan.segs.size() > first && plan.segs.back().hi == lo && merge_kind(plan.segs.back().kind, kind) >= 0) {
                    plan.segs.back().kind = merge_kind(plan.segs.back().kind, kind);
                    plan.segs.back().hi = static_cast<int>(hi);
                } else {
                    plan.segs.push_back({static_cast<int>(lo), static_cast<int>(hi), kind, 0});
                }
            }
            for (std::size_t s = first; s < plan.segs.size(); ++s) {
                const KeySegment& sg = plan.segs[s];
                if (sg.kind == kKeySegDiagonal) continue;
                cols += (sg.hi - sg.lo + kb - 1) / kb * kb;
                computed_t[t] += rows * (sg.hi - sg.lo);
            }
            work[static_cast<std::size_t>(t * nqb + b)] = rows * cols;
            seg_off[static_cast<std::size_t>(t * nqb + b + 1)] = static_cast<std::int64_t>(plan.segs.size());
        }
    }
    const auto H = static_cast<std::int64_t>(heads.size());
    std::vector<SegmentItem> items;
    std::vector<std::int64_t> item_work;
    for (std::int64_t h = 0; h < H; ++h) {
        const int t = static_cast<int>(heads[static_cast<std::size_t>(h)]);
        plan.allowed += allowed_t[t];
        plan.computed += computed_t[t];
        plan.diagonal_rows += diag_t[t];
        plan.block_pairs += block_t[t];
        for (std::int64_t b = 0; b < nqb; ++b) {
            const auto i = static_cast<std::size_t>(t * nqb + b);
            const auto s0 = seg_off[i], s1 = seg_off[i + 1];
            if (s0 == s1) continue;  // cannot happen (a row sees itself), kept for safety
            items.push_back({static_cast<int>(h), static_cast<int>(q_start[static_cast<std::size_t>(b)]),
                             static_cast<int>(q_start[static_cast<std::size_t>(b) + 1]), static_cast<int>(s0),
                             static_cast<int>(s1), 0, 0, 0});
            item_work.push_back(work[i]);
        }
    }
    // Longest items first: the tail of a launch is short blocks.
    std::vector<std::size_t> order(items.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) { return item_work[x] > item_work[y]; });
    plan.items.resize(items.size());
    for (std::size_t i = 0; i < order.size(); ++i) plan.items[i] = items[order[i]];
    return plan;
}

}  // namespace vlsparse::detail
