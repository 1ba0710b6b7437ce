// vlsparse/masks/block_mask.hpp -- the compressed block form of a per-head template mask.
//
// Query blocks follow the prompt: each maximal run of text tokens and each image is cut into blocks
// of at most q_block rows, so no query block mixes text rows (dense) with image rows (sparse); with a
// PureKV video mask on the context (make_video_mask_context) each frame of a video is cut on its own;
// block qb holds rows [q_block_start[qb], q_block_start[qb+1]). For head h and query block qb the key blocks
// kb (keys [kb*k_block, ...)) split into: fully allowed (every pair allowed), partly allowed (some
// pairs), and skipped (none). Row r = h * n_q_blocks + qb of the CSR arrays lists them ascending:
//   full_indices[full_offsets[r] .. full_offsets[r+1]),  partial_indices[partial_offsets[r] .. partial_offsets[r+1]).
// For each partial block, partial_key_lo / partial_key_hi (parallel to partial_indices) bound the
// keys any row of the query block may see inside it: [lo, hi) is the smallest key range holding
// every allowed pair of the block, so a kernel computes rows x (hi - lo), not rows x k_block (a
// strip of 18 text keys between two images costs 18 columns, not a whole block).
// Inside a partial block the pair (i, j) is allowed when context.allows(head_template[h], i, j)
// (or, equivalently, j lies in one of context.row_intervals(...)). Plain data (vectors of integers),
// the form a CUDA kernel consumes; the idea of FlexAttention's block masks (docs/blindsight.md).
// Built from the layout in O(H_distinct * n * (segments + sinks + n / k_block)) (plus the atrous
// window per row), never n x n.
// Include: <vlsparse/masks/block_mask.hpp>
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "vlsparse/attention/common.hpp"
#include "vlsparse/core/error.hpp"
#include "vlsparse/masks/templates.hpp"

namespace vlsparse {

struct BlockMask {
    std::int64_t n = 0;        // tokens (queries == keys: prefill)
    std::int64_t heads = 0;    // query heads
    std::int64_t q_block = 0;  // query rows per block
    std::int64_t k_block = 0;  // keys per block
    std::int64_t n_q_blocks = 0, n_k_blocks = 0;
    std::vector<std::int64_t> q_block_start;                     // [n_q_blocks + 1] first row of each query block
    std::vector<std::int64_t> full_offsets, full_indices;        // CSR over rows h * n_q_blocks + qb
    std::vector<std::int64_t> partial_offsets, partial_indices;  // CSR over the same rows
    std::vector<std::int64_t> partial_key_lo, partial_key_hi;    // [lo, hi) of each partial block's keys
    std::vector<MaskTemplate> head_template;                     // [heads]
    MaskContext context;                                         // the mask inside partial blocks

    bool allows(std::int64_t h, std::int64_t i, std::int64_t j) const {
        return context.allows(head_template[static_cast<std::size_t>(h)], i, j);
    }
    // The context and the head templates as pointers (valid while this mask lives and is not modified).
    BlockMaskView<std::int64_t> view() const {
        static_assert(sizeof(MaskTemplate) == 1, "head_template is read as bytes");
        return {context.view(), reinterpret_cast<const std::uint8_t*>(head_template.data())};
    }
    std::span<const std::int64_t> full(std::int64_t h, std::int64_t qb) const {
        const auto r = static_cast<std::size_t>(h * n_q_blocks + qb);
        return std::span<const std::int64_t>(full_indices).subspan(
            static_cast<std::size_t>(full_offsets[r]), static_cast<std::size_t>(full_offsets[r + 1] - full_offsets[r]));
    }
    std::span<const std::int64_t> partial(std::int64_t h, std::int64_t qb) const {
        const auto r = static_cast<std::size_t>(h * n_q_blocks + qb);
        return std::span<const std::int64_t>(partial_indices)
            .subspan(static_cast<std::size_t>(partial_offsets[r]),
                     static_cast<std::size_t>(partial_offsets[r + 1] - partial_offsets[r]));
    }
    // (q, k) pairs inside the listed blocks (partial ones trimmed to [lo, hi)): the work a block kernel does.
    std::int64_t computed_pairs() const {
        std::int64_t total = 0;
        for (std::int64_t h = 0; h < heads; ++h)
            for (std::int64_t qb = 0; qb < n_q_blocks; ++qb) {
                const std::int64_t rows = q_block_start[static_cast<std::size_t>(qb) + 1] - q_block_start[static_cast<std::size_t>(qb)];
                for (auto kb : full(h, qb)) total += rows * std::min(k_block, n - kb * k_block);
                const auto r = static_cast<std::size_t>(h * n_q_blocks + qb);
                for (auto p = partial_offsets[r]; p < partial_offsets[r + 1]; ++p)
                    total += rows * (partial_key_hi[static_cast<std::size_t>(p)] - partial_key_lo[static_cast<std::size_t>(p)]);
            }
        return total;
    }
};

namespace detail {

// Per (query block, key block): count of allowed pairs and the [lo, hi) range of allowed keys of one
// template; the only pass over rows. O(rows x intervals + query blocks x key blocks): the key blocks a
// row's interval covers whole are counted through a difference array per query block (one add at each
// end), only the one or two blocks it cuts are updated directly. (Walking every block of every
// interval cost O(n^2 / k_block) per template: 5.6 s for 28 mixed heads at 128K.)
struct BlockStats {
    std::vector<std::int64_t> cnt, lo, hi;
};
inline BlockStats block_counts(const MaskContext& c, MaskTemplate t, const std::vector<std::int64_t>& q_start,
                               std::int64_t kb_size, std::int64_t nkb) {
    const auto nqb = static_cast<std::int64_t>(q_start.size()) - 1;
    BlockStats st;
    st.cnt.assign(static_cast<std::size_t>(nqb * nkb), 0);
    st.lo.assign(st.cnt.size(), c.n);
    st.hi.assign(st.cnt.size(), 0);
    std::vector<KeyInterval> iv;
    std::vector<std::int64_t> whole(static_cast<std::size_t>(nkb) + 1);  // rows covering each key block whole (differences)
    auto block_end = [&](std::int64_t kb) { return std::min(c.n, (kb + 1) * kb_size); };
    for (std::int64_t qb = 0; qb < nqb; ++qb) {
        const std::int64_t base = qb * nkb;
        std::fill(whole.begin(), whole.end(), 0);
        bool any_whole = false;
        auto part = [&](std::int64_t kb, std::int64_t lo, std::int64_t hi) {  // keys [lo, hi) of block kb
            const auto b = static_cast<std::size_t>(base + kb);
            st.cnt[b] += hi - lo;
            st.lo[b] = std::min(st.lo[b], lo);
            st.hi[b] = std::max(st.hi[b], hi);
        };
        for (std::int64_t i = q_start[static_cast<std::size_t>(qb)]; i < q_start[static_cast<std::size_t>(qb) + 1]; ++i) {
            c.row_intervals(t, i, iv);
            for (const auto& x : iv) {
                const std::int64_t kb0 = x.lo / kb_size, kb1 = (x.hi - 1) / kb_size;
                // Blocks [wa, wb] lie inside [x.lo, x.hi) whole.
                const std::int64_t wa = (x.lo + kb_size - 1) / kb_size;
                const std::int64_t wb = x.hi == c.n ? nkb - 1 : x.hi / kb_size - 1;
                if (wa <= wb) {
                    whole[static_cast<std::size_t>(wa)] += 1;
                    whole[static_cast<std::size_t>(wb) + 1] -= 1;
                    any_whole = true;
                    if (kb0 < wa) part(kb0, x.lo, block_end(kb0));
                    if (kb1 > wb) part(kb1, kb1 * kb_size, x.hi);
                } else if (kb0 == kb1) {
                    part(kb0, x.lo, x.hi);
                } else {  // two cut blocks, none whole between them
                    part(kb0, x.lo, block_end(kb0));
                    part(kb1, kb1 * kb_size, x.hi);
                }
            }
        }
        if (!any_whole) continue;
        std::int64_t rows = 0;
        for (std::int64_t kb = 0; kb < nkb; ++kb) {
            rows += whole[static_cast<std::size_t>(kb)];
            if (rows == 0) continue;
            const auto b = static_cast<std::size_t>(base + kb);
            const std::int64_t lo = kb * kb_size, hi = block_end(kb);
            st.cnt[b] += rows * (hi - lo);
            st.lo[b] = lo;  // a whole block: its first and last keys are allowed
            st.hi[b] = hi;
        }
    }
    return st;
}

// Query block starts: every maximal text run and every image cut into pieces of at most q_block rows;
// with a video mask, every frame of a video on its own.
inline std::vector<std::int64_t> query_block_starts(const MaskContext& c, std::int64_t q_block) {
    std::vector<std::int64_t> st;
    std::int64_t i = 0;
    while (i < c.n) {
        const std::int32_t a = c.token_image[static_cast<std::size_t>(i)];
        std::int64_t e = i;
        while (e < c.n && c.token_image[static_cast<std::size_t>(e)] == a) ++e;  // a run of one image, or of text
        const std::int64_t frame =
            c.video != VideoMask::none && a >= 0 ? c.image_frame_tokens[static_cast<std::size_t>(a)] : 0;
        if (frame > 0) {
            for (std::int64_t f = i; f < e; f += frame)
                for (std::int64_t b = f; b < std::min(e, f + frame); b += q_block) st.push_back(b);
        } else {
            for (std::int64_t b = i; b < e; b += q_block) st.push_back(b);
        }
        i = e;
    }
    st.push_back(c.n);
    return st;
}

}  // namespace detail

namespace detail {

// The checks of make_block_mask (fn names the caller in the messages): head templates, block sizes, a
// context from make_mask_context / make_video_mask_context.
inline void check_block_mask_request(const MaskContext& ctx, std::span<const MaskTemplate> heads, std::int64_t q_block,
                                     std::int64_t k_block, const char* fn) {
    detail::require(!heads.empty(), fn, "no head templates given, expected one per query head");
    detail::require(q_block >= 1, fn, "q_block = ", q_block, ", expected >= 1");
    detail::require(k_block >= 1, fn, "k_block = ", k_block, ", expected >= 1");
    detail::require(ctx.n > 0 && static_cast<std::int64_t>(ctx.token_image.size()) == ctx.n, fn,
                    "mask context has n = ", ctx.n, " and ", ctx.token_image.size(),
                    " token entries, expected a context from make_mask_context");
    if (ctx.video != VideoMask::none) {
        check_video_mask_options({ctx.video, ctx.video_window, ctx.video_dilation}, fn);
        detail::require(static_cast<std::int64_t>(ctx.image_frame_tokens.size()) == ctx.images(), fn,
                        "mask context has a video mask but ", ctx.image_frame_tokens.size(), " frame sizes for ",
                        ctx.images(), " images, expected a context from make_video_mask_context");
    }
    for (std::size_t h = 0; h < heads.size(); ++h)
        detail::require(static_cast<std::uint8_t>(heads[h]) <= 3, fn, "head ", h, " has template value ",
                        static_cast<int>(heads[h]), ", expected one of Dense, Sink, Document, Document-Sink");
}

}  // namespace detail

// Builds the block mask of per-head templates (heads.size() query heads) on a mask context.
inline BlockMask make_block_mask(const MaskContext& ctx, std::span<const MaskTemplate> heads, std::int64_t q_block = 128,
                                 std::int64_t k_block = 128) {
    detail::check_block_mask_request(ctx, heads, q_block, k_block, "make_block_mask");
    BlockMask bm;
    bm.n = ctx.n;
    bm.heads = static_cast<std::int64_t>(heads.size());
    bm.q_block = q_block;
    bm.k_block = k_block;
    bm.q_block_start = detail::query_block_starts(ctx, q_block);
    bm.n_q_blocks = static_cast<std::int64_t>(bm.q_block_start.size()) - 1;
    bm.n_k_blocks = (ctx.n + k_block - 1) / k_block;
    bm.head_template.assign(heads.begin(), heads.end());
    bm.context = ctx;
    // Each template's lists once (a scan of its counts), then copied for every head that uses it.
    struct TemplateLists {
        bool made = false;
        std::vector<std::int64_t> full_off, full, part_off, part, part_lo, part_hi;  // per query block (CSR)
    };
    TemplateLists lists[4];
    bm.full_offsets.push_back(0);
    bm.partial_offsets.push_back(0);
    for (std::int64_t h = 0; h < bm.heads; ++h) {
        const auto t = static_cast<std::size_t>(heads[static_cast<std::size_t>(h)]);
        TemplateLists& L = lists[t];
        if (!L.made) {
            L.made = true;
            const detail::BlockStats counts =
                detail::block_counts(ctx, heads[static_cast<std::size_t>(h)], bm.q_block_start, k_block, bm.n_k_blocks);
            L.full_off.push_back(0);
            L.part_off.push_back(0);
            for (std::int64_t qb = 0; qb < bm.n_q_blocks; ++qb) {
                const std::int64_t rows = bm.q_block_start[static_cast<std::size_t>(qb) + 1] - bm.q_block_start[static_cast<std::size_t>(qb)];
                for (std::int64_t kb = 0; kb < bm.n_k_blocks; ++kb) {
                    const std::int64_t cols = std::min(k_block, ctx.n - kb * k_block);
                    const auto b = static_cast<std::size_t>(qb * bm.n_k_blocks + kb);
                    const std::int64_t c = counts.cnt[b];
                    if (c == rows * cols) {
                        L.full.push_back(kb);
                    } else if (c > 0) {
                        L.part.push_back(kb);
                        L.part_lo.push_back(counts.lo[b]);
                        L.part_hi.push_back(counts.hi[b]);
                    }
                }
                L.full_off.push_back(static_cast<std::int64_t>(L.full.size()));
                L.part_off.push_back(static_cast<std::int64_t>(L.part.size()));
            }
        }
        const auto f0 = static_cast<std::int64_t>(bm.full_indices.size()), p0 = static_cast<std::int64_t>(bm.partial_indices.size());
        bm.full_indices.insert(bm.full_indices.end(), L.full.begin(), L.full.end());
        bm.partial_indices.insert(bm.partial_indices.end(), L.part.begin(), L.part.end());
        bm.partial_key_lo.insert(bm.partial_key_lo.end(), L.part_lo.begin(), L.part_lo.end());
        bm.partial_key_hi.insert(bm.partial_key_hi.end(), L.part_hi.begin(), L.part_hi.end());
        for (std::int64_t qb = 0; qb < bm.n_q_blocks; ++qb) {
            bm.full_offsets.push_back(f0 + L.full_off[static_cast<std::size_t>(qb) + 1]);
            bm.partial_offsets.push_back(p0 + L.part_off[static_cast<std::size_t>(qb) + 1]);
        }
    }
    return bm;
}

namespace detail {

// Throws unless `bm` is a consistent block mask of n tokens and H query heads (the shape a kernel
// reading its CSR arrays relies on): every backend's masked attention checks it before use.
inline void check_block_mask(const BlockMask& bm, std::int64_t n, std::int64_t H, const char* fn) {
    require(bm.n == n, fn, "block mask covers ", bm.n, " tokens, the input has ", n, "; expected equal");
    require(bm.heads == H, fn, "block mask has ", bm.heads, " heads, q has ", H, " query heads; expected equal");
    require(bm.q_block >= 1 && bm.k_block >= 1 && static_cast<std::int64_t>(bm.q_block_start.size()) == bm.n_q_blocks + 1 &&
                bm.q_block_start.front() == 0 && bm.q_block_start.back() == n &&
                bm.n_k_blocks == (n + bm.k_block - 1) / bm.k_block &&
                static_cast<std::int64_t>(bm.full_offsets.size()) == H * bm.n_q_blocks + 1 &&
                static_cast<std::int64_t>(bm.partial_offsets.size()) == H * bm.n_q_blocks + 1 &&
                bm.partial_key_lo.size() == bm.partial_indices.size() &&
                bm.partial_key_hi.size() == bm.partial_indices.size() &&
                bm.full_offsets.back() == static_cast<std::int64_t>(bm.full_indices.size()) &&
                bm.partial_offsets.back() == static_cast<std::int64_t>(bm.partial_indices.size()) &&
                static_cast<std::int64_t>(bm.head_template.size()) == H && bm.context.n == n,
            fn, "block mask is inconsistent (block counts or offsets do not match n = ", n, ", H = ", H,
            "); expected a mask from make_block_mask");
}


// The checks every backend's masked prefill attention runs first, in the two forms the backends take:
// a context with one template per query head, and a BlockMask (shape-consistent, check_block_mask).
// q [n, H, d], k and v [n, H_kv, d], out [n, H, d] (n_q == n_k: prefill only).
template <class TQ, class TK, class TO>
void check_masked_context_args(const View3<const TQ>& q, const View3<const TK>& k, const View3<const TK>& v,
                               const MaskContext& ctx, std::span<const MaskTemplate> heads, const View3<TO>& out,
                               const char* fn) {
    check_qkv(q, k, v, fn);
    const std::int64_t n = q.shape[0], H = q.shape[1];
    require(k.shape[0] == n, fn, "q has ", n, " tokens and k has ", k.shape[0], ", expected equal (masked prefill)");
    require(ctx.n == n && static_cast<std::int64_t>(ctx.token_image.size()) == n, fn, "mask covers ", ctx.n,
            " tokens, the input has ", n, "; expected equal");
    require(static_cast<std::int64_t>(heads.size()) == H, fn, heads.size(), " head templates given, q has ", H,
            " query heads; expected one per query head");
    check_out3(out, {n, H, q.shape[2]}, q, k, v, fn, "out");
}

template <class TQ, class TK, class TO>
void check_masked_args(const View3<const TQ>& q, const View3<const TK>& k, const View3<const TK>& v,
                       const BlockMask& bm, const View3<TO>& out, const char* fn) {
    check_qkv(q, k, v, fn);
    const std::int64_t n = q.shape[0], H = q.shape[1], d = q.shape[2];
    require(k.shape[0] == n, fn, "q has ", n, " tokens and k has ", k.shape[0], ", expected equal (masked prefill)");
    check_block_mask(bm, n, H, fn);
    check_out3(out, {n, H, d}, q, k, v, fn, "out");
}

}  // namespace detail

// Dense boolean expansion [heads, n, n] of a block mask (1 = allowed), reading only the block lists
// (partial blocks only inside [lo, hi)) and, there, the mask description: what a block kernel computes. For tests and pictures.
inline std::vector<std::uint8_t> expand_block_mask(const BlockMask& bm) {
    const std::int64_t n = bm.n;
    std::vector<std::uint8_t> m(static_cast<std::size_t>(bm.heads * n * n), 0);
    for (std::int64_t h = 0; h < bm.heads; ++h)
        for (std::int64_t qb = 0; qb < bm.n_q_blocks; ++qb) {
            const std::int64_t i0 = bm.q_block_start[static_cast<std::size_t>(qb)], i1 = bm.q_block_start[static_cast<std::size_t>(qb) + 1];
            auto fill = [&](std::int64_t j0, std::int64_t j1, bool partial) {
                for (std::int64_t i = i0; i < i1; ++i)
                    for (std::int64_t j = j0; j < j1; ++j)
                        m[static_cast<std::size_t>((h * n + i) * n + j)] = !partial || bm.allows(h, i, j) ? 1 : 0;
            };
            for (auto kb : bm.full(h, qb)) fill(kb * bm.k_block, std::min(n, (kb + 1) * bm.k_block), false);
            const auto r = static_cast<std::size_t>(h * bm.n_q_blocks + qb);
            for (auto p = bm.partial_offsets[r]; p < bm.partial_offsets[r + 1]; ++p)
                fill(bm.partial_key_lo[static_cast<std::size_t>(p)], bm.partial_key_hi[static_cast<std::size_t>(p)], true);
        }
    return m;
}

}  // namespace vlsparse
