// vlsparse/masks/masked_plan.hpp -- the work plan of block-masked attention: which keys each group of
// query rows reads, cut into GEMM-sized chunks, with each row's holes where the mask differs.
//
// Built from a BlockMask (masks/block_mask.hpp) alone, once per call, and shared by every backend that
// runs block-masked prefill (the CPU path attention/masked.hpp; a GPU kernel can read the same plan):
//   1. heads with the same template and block lists share one plan (same_head_mask). A query block is
//      a work item; small blocks (text runs between images) whose keys contain the previous small
//      block's are chained into one item of up to twice the largest block's rows (masked_plan).
//   2. an item's listed keys (full blocks; partial ones trimmed to [lo, hi)) are fused into maximal
//      contiguous spans, and their columns counted over the rows' key intervals: columns every row
//      may see need no mask, columns no row may see are dropped, only the others ("masked": the
//      causal diagonal, holes between sinks) are tested per row (item_key_lists).
//   3. spans are cut into chunks of kt to 2 kt - 1 keys read in place (cut where the masked columns
//      start); runs of short spans are gathered into one (item_chunks).
//   4. in a masked chunk each row has its holes and its last allowed column, and each group of
//      kMaskedRowGroup rows stops at the group's last allowed column (item_chunk_rows).
// Plain integers and std::vector only: no Eigen, no xsimd, no OpenMP, so nvcc compiles it too.
// Internal to the backends (namespace vlsparse::detail). Include: <vlsparse/masks/masked_plan.hpp>
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "vlsparse/masks/block_mask.hpp"
#include "vlsparse/masks/templates.hpp"

namespace vlsparse::detail {
// Keys [lo, hi) placed at columns [col, col + hi - lo) of a chunk.
struct KeyPiece {
    std::int64_t lo = 0, hi = 0, col = 0;
};

// Rows [r0, r1) of a work item whose GEMMs in one masked chunk stop at column ext.
struct RowGroup {
    std::int64_t r0 = 0, r1 = 0, ext = 0;
};

// The key columns of one GEMM: pieces [p0, p1) of the item's piece list, kc keys in all. A masked
// chunk (rows differ in some of its columns) has, for row r, cend[rows + r] and the holes
// holes[hole_off[holes + r] .. hole_off[holes + r + 1]), and the row groups groups[grp0 .. grp1);
// rows < 0: unmasked (every row sees every column).
struct KeyChunk {
    std::int64_t p0 = 0, p1 = 0, kc = 0;
    std::int64_t rows = -1, holes = 0, grp0 = 0, grp1 = 0;
};

// The head-independent part of one work item: one or more query blocks as they apply to every head
// of a class (heads with the same template and the same block lists). Built once per call.
struct MaskedItem {
    std::vector<std::int64_t> pos;  // position of each row
    std::vector<KeyPiece> pieces;
    std::vector<KeyChunk> chunks;
    std::vector<RowGroup> groups;        // of the masked chunks
    std::vector<std::int64_t> cend;      // masked chunks: each row's last allowed column + 1 (0: none)
    std::vector<std::int64_t> hole_off;  // masked chunks: offsets into holes, rows + 1 per chunk
    std::vector<KeyInterval> holes;      // columns a row may not see, before its cend
    double cost = 0;                     // rows x listed keys (for the schedule)
};

// Per-thread scratch of the item builder.
struct MaskedScratch {
    std::vector<std::int64_t> gstart;  // row groups: each block cut into pieces of at most kMaskedRowGroup
    std::vector<KeyInterval> fullk;    // keys every row may see (full blocks), ascending
    std::vector<KeyInterval> partial;  // keys to count per row (partial blocks trimmed to [lo, hi))
    std::vector<KeyInterval> spans;    // listed keys as maximal contiguous ranges, ascending
    std::vector<KeyInterval> masked;   // key ranges where the rows differ, ascending
    std::vector<KeyInterval> tmp, iv, row_iv;
    std::vector<std::int64_t> poff, iv_off;
    std::vector<std::int32_t> cover;  // rows allowing each column of `partial` (difference array)
};

// Rows per GEMM group inside masked chunks.
inline constexpr std::int64_t kMaskedRowGroup = 32;

inline void push_keys(std::vector<KeyInterval>& v, std::int64_t lo, std::int64_t hi) {
    if (lo >= hi) return;
    if (!v.empty() && v.back().hi >= lo) v.back().hi = std::max(v.back().hi, hi);
    else v.push_back({lo, hi});
}

// Keys listed for (head h, query block qb): full blocks and trimmed partial blocks, as ascending
// maximal ranges appended to `out`; the full blocks' ranges also to *full_only and the trimmed
// partial blocks to *partial_only when given.
inline void listed_keys(const BlockMask& bm, std::int64_t h, std::int64_t qb, std::vector<KeyInterval>& out,
                        std::vector<KeyInterval>* full_only = nullptr, std::vector<KeyInterval>* partial_only = nullptr) {
    const std::int64_t KB = bm.k_block;
    const auto full = bm.full(h, qb);
    const auto row = static_cast<std::size_t>(h * bm.n_q_blocks + qb);
    const auto p0 = static_cast<std::size_t>(bm.partial_offsets[row]);
    const auto np = static_cast<std::size_t>(bm.partial_offsets[row + 1]) - p0;
    std::size_t a = 0, b = 0;
    while (a < full.size() || b < np) {
        if (b == np || (a < full.size() && full[a] * KB < bm.partial_key_lo[p0 + b])) {
            const std::int64_t lo = full[a] * KB, hi = std::min(bm.n, (full[a] + 1) * KB);
            push_keys(out, lo, hi);
            if (full_only) push_keys(*full_only, lo, hi);
            ++a;
        } else {
            push_keys(out, bm.partial_key_lo[p0 + b], bm.partial_key_hi[p0 + b]);
            if (partial_only) partial_only->push_back({bm.partial_key_lo[p0 + b], bm.partial_key_hi[p0 + b]});
            ++b;
        }
    }
}

// Step 2 of the header comment for query blocks qbs[0:nqb) of head h: it.pos, s.gstart,
// s.spans (columns no row may see removed), s.masked, and the rows' intervals when some column
// needs them (s.iv / s.iv_off; else iv_off is all zero). One block: only its partial blocks are
// counted (its full blocks are allowed to every row). Several blocks: every listed column is counted
// (a full block of one is not necessarily allowed to the rows of another).
inline void item_key_lists(const BlockMask& bm, std::int64_t h, const std::int64_t* qbs, std::int64_t nqb,
                           MaskedItem& it, MaskedScratch& s) {
    const auto t = bm.head_template[static_cast<std::size_t>(h)];
    it.pos.clear();
    s.gstart.clear();
    s.fullk.clear();
    s.partial.clear();
    for (std::int64_t x = 0; x < nqb; ++x) {
        const auto qb = static_cast<std::size_t>(qbs[x]);
        const std::int64_t r0 = bm.q_block_start[qb], r1 = bm.q_block_start[qb + 1];
        for (std::int64_t g = static_cast<std::int64_t>(it.pos.size()), e = g + (r1 - r0); g < e; g += kMaskedRowGroup)
            s.gstart.push_back(g);
        for (std::int64_t i = r0; i < r1; ++i) it.pos.push_back(i);
        if (nqb == 1) {
            s.tmp.clear();
            listed_keys(bm, h, qbs[x], s.tmp, &s.fullk, &s.partial);
            continue;
        }
        s.tmp.clear();
        listed_keys(bm, h, qbs[x], s.tmp);
        s.masked.clear();  // scratch: the union of s.partial and s.tmp
        std::size_t i = 0, j = 0;
        while (i < s.partial.size() || j < s.tmp.size()) {
            const bool left = j == s.tmp.size() || (i < s.partial.size() && s.partial[i].lo <= s.tmp[j].lo);
            const KeyInterval y = left ? s.partial[i++] : s.tmp[j++];
            push_keys(s.masked, y.lo, y.hi);
        }
        s.partial.swap(s.masked);
    }
    const auto nr = static_cast<std::int64_t>(it.pos.size());
    s.gstart.push_back(nr);
    s.iv.clear();
    s.iv_off.assign(static_cast<std::size_t>(nr) + 1, 0);
    s.masked.clear();
    // Coverage of the counted columns: a difference array per range, one pass over each row's intervals.
    if (!s.partial.empty()) {
        s.poff.resize(s.partial.size() + 1);
        s.poff[0] = 0;
        for (std::size_t p = 0; p < s.partial.size(); ++p) s.poff[p + 1] = s.poff[p] + (s.partial[p].hi - s.partial[p].lo) + 1;
        s.cover.assign(static_cast<std::size_t>(s.poff.back()), 0);
        for (std::int64_t r = 0; r < nr; ++r) {
            bm.context.row_intervals(t, it.pos[static_cast<std::size_t>(r)], s.row_iv);
            std::size_t p = 0;
            for (const auto& y : s.row_iv) {
                while (p < s.partial.size() && s.partial[p].hi <= y.lo) ++p;
                for (std::size_t e = p; e < s.partial.size() && s.partial[e].lo < y.hi; ++e) {
                    const std::int64_t a = std::max(y.lo, s.partial[e].lo), b = std::min(y.hi, s.partial[e].hi);
                    if (a >= b) continue;
                    ++s.cover[static_cast<std::size_t>(s.poff[e] + a - s.partial[e].lo)];
                    --s.cover[static_cast<std::size_t>(s.poff[e] + b - s.partial[e].lo)];
                }
            }
            s.iv.insert(s.iv.end(), s.row_iv.begin(), s.row_iv.end());
            s.iv_off[static_cast<std::size_t>(r) + 1] = static_cast<std::int64_t>(s.iv.size());
        }
    }
    // Listed keys in ascending order: full ranges whole; counted ranges split by their coverage into
    // dropped (no row), unmasked (every row) and masked (some rows) columns.
    s.spans.clear();
    auto add = [&](std::int64_t lo, std::int64_t hi) {
        if (!s.spans.empty() && s.spans.back().hi == lo) s.spans.back().hi = hi;
        else s.spans.push_back({lo, hi});
    };
    std::size_t a = 0, b = 0;
    while (a < s.fullk.size() || b < s.partial.size()) {
        if (b == s.partial.size() || (a < s.fullk.size() && s.fullk[a].lo < s.partial[b].lo)) {
            add(s.fullk[a].lo, s.fullk[a].hi);
            ++a;
            continue;
        }
        const auto [lo, hi] = s.partial[b];
        const std::int32_t* cv = s.cover.data() + s.poff[b];
        auto cls = [nr](std::int32_t c) { return c == 0 ? 0 : c == nr ? 2 : 1; };
        std::int32_t c = 0;
        for (std::int64_t j = lo; j < hi;) {  // runs of one class: 0 no row, 1 some rows, 2 every row
            c += cv[j - lo];
            const int k = cls(c);
            std::int64_t e = j + 1;
            while (e < hi && cls(c + cv[e - lo]) == k) c += cv[e++ - lo];
            if (k != 0) add(j, e);
            if (k == 1) push_keys(s.masked, j, e);
            j = e;
        }
        ++b;
    }
}

// Step 3: cuts s.spans into chunks (it.pieces, it.chunks). Each span is first cut where the mask
// starts or stops differing between rows (s.masked), so that the row groups of a masked chunk cover
// little more than the masked columns, unless the pieces together are shorter than kt. A piece of at
// least kt keys runs in place as floor(len / kt) chunks of equal width (kt to 2 kt - 1 keys);
// shorter pieces are collected while they fit in kt keys (gathered when not contiguous).
inline void item_chunks(std::int64_t kt, MaskedItem& it, const MaskedScratch& s) {
    it.pieces.clear();
    it.chunks.clear();
    KeyChunk cur;
    auto close = [&] {
        if (cur.kc > 0) {
            cur.p1 = static_cast<std::int64_t>(it.pieces.size());
            it.chunks.push_back(cur);
        }
        cur = KeyChunk{};
        cur.p0 = static_cast<std::int64_t>(it.pieces.size());
    };
    auto add = [&](std::int64_t lo, std::int64_t hi) {
        const std::int64_t L = hi - lo;
        if (cur.kc > 0 && cur.kc + L <= kt) {
            if (it.pieces.back().hi == lo) it.pieces.back().hi = hi;  // contiguous: stays in place
            else it.pieces.push_back({lo, hi, cur.kc});
            cur.kc += L;
            return;
        }
        close();
        if (L < kt) {
            it.pieces.push_back({lo, hi, 0});
            cur.kc = L;
            return;
        }
        const std::int64_t c = L / kt;
        for (std::int64_t x = 0; x < c; ++x) {
            const std::int64_t a = lo + L * x / c, b = lo + L * (x + 1) / c;
            it.pieces.push_back({a, b, 0});
            cur.kc = b - a;
            close();
        }
    };
    close();
    std::size_t m = 0;
    for (const auto& sp : s.spans) {
        std::int64_t seg = sp.lo, at = sp.lo;  // open piece [seg, at); the next cut after at
        while (at < sp.hi) {
            while (m < s.masked.size() && s.masked[m].hi <= at) ++m;
            std::int64_t cut = sp.hi;
            if (m < s.masked.size() && s.masked[m].lo < sp.hi) cut = s.masked[m].lo > at ? s.masked[m].lo : std::min(s.masked[m].hi, sp.hi);
            if (2 * (at - seg) >= kt && cut - seg >= kt) {  // [seg, at) is long, and [at, cut) would make it too long
                add(seg, at);
                seg = at;
            }
            at = cut;
        }
        add(seg, sp.hi);
    }
    close();
}

// Step 4 for the chunks overlapping s.masked: each row's holes (columns it may not see) before its
// last allowed column, cend = that column + 1 (0: nothing allowed in the chunk), and the GEMM row
// groups (consecutive groups of s.gstart that stop at the same column merged into one).
inline void item_chunk_rows(MaskedItem& it, const MaskedScratch& s) {
    const auto nr = static_cast<std::int64_t>(it.pos.size());
    it.groups.clear();
    it.cend.clear();
    it.hole_off.clear();
    it.holes.clear();
    std::vector<std::int64_t> cur(s.iv_off.begin(), s.iv_off.end() - 1);  // per-row cursor into s.iv
    std::size_t m0 = 0;
    for (auto& ch : it.chunks) {
        const auto& first = it.pieces[static_cast<std::size_t>(ch.p0)];
        while (m0 < s.masked.size() && s.masked[m0].hi <= first.lo) ++m0;
        bool masked = false;
        for (std::int64_t p = ch.p0, m = static_cast<std::int64_t>(m0); p < ch.p1 && !masked; ++p) {
            const auto& pc = it.pieces[static_cast<std::size_t>(p)];
            while (m < static_cast<std::int64_t>(s.masked.size()) && s.masked[static_cast<std::size_t>(m)].hi <= pc.lo) ++m;
            masked = m < static_cast<std::int64_t>(s.masked.size()) && s.masked[static_cast<std::size_t>(m)].lo < pc.hi;
        }
        if (!masked) continue;
        ch.rows = static_cast<std::int64_t>(it.cend.size());
        ch.holes = static_cast<std::int64_t>(it.hole_off.size());
        it.hole_off.push_back(static_cast<std::int64_t>(it.holes.size()));
        for (std::int64_t r = 0; r < nr; ++r) {
            std::int64_t t = cur[static_cast<std::size_t>(r)];
            const std::int64_t tend = s.iv_off[static_cast<std::size_t>(r) + 1];
            std::int64_t cend = 0;
            const std::size_t h0 = it.holes.size();
            std::size_t m = m0;
            for (std::int64_t p = ch.p0; p < ch.p1; ++p) {
                const auto& pc = it.pieces[static_cast<std::size_t>(p)];
                for (std::int64_t j = pc.lo; j < pc.hi;) {
                    while (m < s.masked.size() && s.masked[m].hi <= j) ++m;
                    const std::int64_t mlo = m < s.masked.size() ? std::max(s.masked[m].lo, j) : pc.hi;
                    if (mlo > j) {  // unmasked [j, min(mlo, hi)): every row sees it
                        const std::int64_t e = std::min(mlo, pc.hi);
                        cend = pc.col + (e - pc.lo);
                        j = e;
                        continue;
                    }
                    const std::int64_t mhi = std::min(s.masked[m].hi, pc.hi);  // masked [j, mhi): the row's intervals
                    while (t < tend && s.iv[static_cast<std::size_t>(t)].hi <= j) ++t;
                    std::int64_t at = j;
                    for (std::int64_t u = t; u < tend && s.iv[static_cast<std::size_t>(u)].lo < mhi; ++u) {
                        const std::int64_t lo = std::max(s.iv[static_cast<std::size_t>(u)].lo, j);
                        const std::int64_t hi = std::min(s.iv[static_cast<std::size_t>(u)].hi, mhi);
                        if (at < lo) it.holes.push_back({pc.col + (at - pc.lo), pc.col + (lo - pc.lo)});
                        cend = pc.col + (hi - pc.lo);
                        at = hi;
                    }
                    if (at < mhi) it.holes.push_back({pc.col + (at - pc.lo), pc.col + (mhi - pc.lo)});
                    j = mhi;
                }
            }
            cur[static_cast<std::size_t>(r)] = t;
            while (it.holes.size() > h0 && it.holes.back().lo >= cend) it.holes.pop_back();
            it.cend.push_back(cend);
            it.hole_off.push_back(static_cast<std::int64_t>(it.holes.size()));
        }
        ch.grp0 = static_cast<std::int64_t>(it.groups.size());
        for (std::size_t x = 0; x + 1 < s.gstart.size(); ++x) {
            std::int64_t ext = 0;
            for (std::int64_t r = s.gstart[x]; r < s.gstart[x + 1]; ++r)
                ext = std::max(ext, it.cend[static_cast<std::size_t>(ch.rows + r)]);
            if (it.groups.size() > static_cast<std::size_t>(ch.grp0) && it.groups.back().ext == ext)
                it.groups.back().r1 = s.gstart[x + 1];
            else
                it.groups.push_back({s.gstart[x], s.gstart[x + 1], ext});
        }
        ch.grp1 = static_cast<std::int64_t>(it.groups.size());
    }
}

// True when every key of `in` is in `out` (both ascending disjoint ranges).
inline bool keys_within(const std::vector<KeyInterval>& in, const std::vector<KeyInterval>& out) {
    std::size_t j = 0;
    for (const auto& x : in) {
        while (j < out.size() && out[j].hi <= x.lo) ++j;
        if (j == out.size() || out[j].lo > x.lo || out[j].hi < x.hi) return false;
    }
    return true;
}

// True when heads a and b have the same template and the same block lists (then every work item is
// the same for both).
inline bool same_head_mask(const BlockMask& bm, std::int64_t a, std::int64_t b) {
    if (!(bm.head_template[static_cast<std::size_t>(a)] == bm.head_template[static_cast<std::size_t>(b)])) return false;
    const auto nq = static_cast<std::size_t>(bm.n_q_blocks);
    const auto ra = static_cast<std::size_t>(a) * nq, rb = static_cast<std::size_t>(b) * nq;
    auto same = [&](const std::vector<std::int64_t>& off, std::initializer_list<const std::vector<std::int64_t>*> vals) {
        if (off[ra + nq] - off[ra] != off[rb + nq] - off[rb]) return false;
        for (std::size_t x = 0; x <= nq; ++x)
            if (off[ra + x] - off[ra] != off[rb + x] - off[rb]) return false;
        for (const auto* v : vals)
            if (!std::equal(v->begin() + off[ra], v->begin() + off[ra + nq], v->begin() + off[rb])) return false;
        return true;
    };
    return same(bm.full_offsets, {&bm.full_indices}) &&
           same(bm.partial_offsets, {&bm.partial_indices, &bm.partial_key_lo, &bm.partial_key_hi});
}

// The work of one call. Heads fall into classes (same_head_mask); each class's query blocks become
// items: each block alone, except that small blocks (at most half the largest block's rows: the text
// runs between images) whose listed keys contain the previous small block's are chained into one
// item of up to twice the largest block's rows (a later text run sees every key an earlier one sees),
// so their GEMMs run over many rows at once instead of a few. Every head runs every item of its class.
struct MaskedPlan {
    std::vector<std::int64_t> head_class;                 // [heads] class of each head
    std::vector<std::int64_t> class_head;                 // a head of each class
    std::vector<std::int64_t> class_items;                // [classes + 1] offsets into items
    std::vector<std::vector<std::int64_t>> item_blocks;  // query blocks of each item
    std::vector<MaskedItem> items;
    std::int64_t max_rows = 1;
};

inline MaskedPlan masked_plan(const BlockMask& bm) {
    MaskedPlan plan;
    std::int64_t QB = 1;
    for (std::int64_t b = 0; b < bm.n_q_blocks; ++b)
        QB = std::max(QB, bm.q_block_start[static_cast<std::size_t>(b) + 1] - bm.q_block_start[static_cast<std::size_t>(b)]);
    plan.head_class.assign(static_cast<std::size_t>(bm.heads), -1);
    for (std::int64_t h = 0; h < bm.heads; ++h) {
        for (std::size_t c = 0; c < plan.class_head.size() && plan.head_class[static_cast<std::size_t>(h)] < 0; ++c)
            if (same_head_mask(bm, plan.class_head[c], h)) plan.head_class[static_cast<std::size_t>(h)] = static_cast<std::int64_t>(c);
        if (plan.head_class[static_cast<std::size_t>(h)] < 0) {
            plan.head_class[static_cast<std::size_t>(h)] = static_cast<std::int64_t>(plan.class_head.size());
            plan.class_head.push_back(h);
        }
    }
    std::vector<KeyInterval> prev, cur;
    std::vector<double> costs;
    plan.class_items.push_back(0);
    for (const std::int64_t h : plan.class_head) {
        std::int64_t chain = -1, chain_rows = 0;  // the open chain of small blocks (item index)
        for (std::int64_t qb = 0; qb < bm.n_q_blocks; ++qb) {
            const std::int64_t rows = bm.q_block_start[static_cast<std::size_t>(qb) + 1] - bm.q_block_start[static_cast<std::size_t>(qb)];
            cur.clear();
            listed_keys(bm, h, qb, cur);
            double keys = 0;
            for (const auto& x : cur) keys += static_cast<double>(x.hi - x.lo);
            const double cost = static_cast<double>(rows) * keys;
            if (2 * rows <= QB) {
                if (chain >= 0 && chain_rows + rows <= 2 * QB && keys_within(prev, cur)) {
                    plan.item_blocks[static_cast<std::size_t>(chain)].push_back(qb);
                    costs[static_cast<std::size_t>(chain)] += cost;
                    chain_rows += rows;
                    prev.swap(cur);
                    continue;
                }
                chain = static_cast<std::int64_t>(plan.item_blocks.size());
                chain_rows = rows;
                prev.swap(cur);
            }
            plan.item_blocks.push_back({qb});
            costs.push_back(cost);
        }
        plan.class_items.push_back(static_cast<std::int64_t>(plan.item_blocks.size()));
    }
    plan.items.resize(plan.item_blocks.size());
    for (std::size_t x = 0; x < plan.items.size(); ++x) {
        plan.items[x].cost = costs[x];
        std::int64_t rows = 0;
        for (const auto qb : plan.item_blocks[x])
            rows += bm.q_block_start[static_cast<std::size_t>(qb) + 1] - bm.q_block_start[static_cast<std::size_t>(qb)];
        plan.max_rows = std::max(plan.max_rows, rows);
    }
    return plan;
}

}  // namespace vlsparse::detail
