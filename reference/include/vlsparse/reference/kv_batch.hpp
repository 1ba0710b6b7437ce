// vlsparse/reference/kv_batch.hpp -- the exact reference of the two updates of a batch of KV caches
// (vlsparse/kv/kv_batch.hpp): appending new tokens, and compacting a sequence to a keep list.
//
//   append:   rows n_b .. n_b + a_b - 1 of sequence b  <-  its a_b new rows;   n_b += a_b
//   compact:  row i of sequence b  <-  row keep_b[i]   (i = 0 .. m_b - 1);      n_b  = m_b
//
// for every KV head, K and V alike. Compaction keeps the order of the kept rows (keep_b ascending,
// unique) and renumbers them 0 .. m_b - 1: rows are LOGICAL indices, never positions (an optional
// [batch, capacity] array of positions is compacted with the rows when the caller keeps one). Paged
// caches release the pages the sequence no longer needs -- block-table slots ceil(m_b / P) ..
// ceil(n_b / P) - 1 -- returning their ids in that order and writing -1 into those slots. The
// KV-eviction of A-VL and ZipVL and H2O's decode eviction all reduce to `compact`.
//
// Host memory throughout: the cache view's pointers (K, V, block table, seq_lens) point to host
// arrays, and cache.seq_lens must be seq_lens_host.data() (this oracle updates the lengths through
// it). Plain loops, one row at a time, in the order a reader would write them; the CUDA path
// (vlsparse/cuda/kv_cache.cuh) produces the same bytes. Every check comes first: on error nothing is
// changed. Include: <vlsparse/reference/kv_batch.hpp>
//
// Semantics shared with the CUDA path:
//   - Lengths. A sequence may hold 0 rows (before its first append). Append needs
//     n_b + a_b <= capacity(): contiguous caches their page_size; paged caches the block table must
//     already list pages for the new rows (block_table_stride x page_size rows at most; allocating
//     pages is the caller's job, or DeviceKvBatch's).
//   - Keep lists. Sorted ascending, unique, in [0, n_b), and not empty: evicting every row of a
//     sequence is not a compaction (drop the sequence instead). A sequence of 0 rows passes an empty
//     list. In the batched form every sequence has a list (CSR keep_indptr [batch + 1]); a sequence
//     to leave alone lists all its rows (its rows do not move, nothing is released).
//   - Pages. Every block-table entry a sequence uses (slots below ceil(max(old, new length) / P)) is in
//     [0, n_pages). A page the update writes or releases must appear once among the pages in use by
//     the batch: sequences may share read-only prefix pages, never a page an update changes.
//   - Rows past a sequence's new length keep stale bytes (nothing is cleared).
//   - Element types. Appended rows are converted to the cache's type (through fp32, rounded to
//     nearest even); rows of the cache's own type are copied bit for bit.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <type_traits>
#include <vector>

#include "vlsparse/core/dtype.hpp"
#include "vlsparse/core/error.hpp"
#include "vlsparse/core/tensor.hpp"
#include "vlsparse/detail/check.hpp"
#include "vlsparse/kv/kv_batch.hpp"

namespace vlsparse::reference {

namespace detail {

using ::vlsparse::detail::require;

// Block-table slots (pages) that hold `rows` rows.
inline std::int64_t pages_for(std::int64_t rows, std::int64_t page_size) {
    return rows <= 0 ? 0 : (rows - 1) / page_size + 1;  // rows + page_size - 1 may overflow for a large page_size
}

// The layout of a cache an update writes: the layout checks of check_kv_batch (shapes, strides that
// keep rows, heads and pages apart, n_pages, table width), and lengths 0 .. capacity() (a sequence
// may be empty here, which check_kv_batch does not allow for a decode step).
template <class T>
void check_update_layout(const KvBatchView<T>& cache, std::span<const std::int32_t> seq_lens_host, const char* fn) {
    require(cache.batch >= 1, fn, "batch = ", cache.batch, ", expected at least one sequence");
    require(static_cast<std::int64_t>(seq_lens_host.size()) == cache.batch, fn, "seq_lens has ", seq_lens_host.size(),
            " entries, expected batch = ", cache.batch);
    const std::vector<std::int32_t> one(static_cast<std::size_t>(cache.batch), 1);
    ::vlsparse::detail::check_kv_batch(cache, DecodeBatchHost{one, {}, {}, 1}, cache.n_kv_heads, fn);
    for (std::size_t b = 0; b < seq_lens_host.size(); ++b)
        require(seq_lens_host[b] >= 0 && seq_lens_host[b] <= cache.capacity(), fn, "sequence ", b, " holds ",
                seq_lens_host[b], " rows, expected 0..", cache.capacity(),
                cache.paged() ? " (block_table_stride x page_size)" : " (its capacity, page_size)");
}

// new_indptr [batch + 1] from 0, non-decreasing; every sequence's length after the append within
// capacity(); `total_new` (the rows of k_new) equal to new_indptr[batch].
inline void check_append_indptr(std::span<const std::int32_t> new_indptr, std::span<const std::int32_t> seq_lens,
                                std::int64_t capacity, std::int64_t total_new, const char* fn) {
    const std::size_t B = seq_lens.size();
    require(new_indptr.size() == B + 1, fn, "new_indptr has ", new_indptr.size(),
            " entries, expected batch + 1 = ", B + 1);
    require(new_indptr[0] == 0, fn, "new_indptr[0] = ", new_indptr[0], ", expected 0");
    for (std::size_t b = 0; b < B; ++b) {
        const std::int64_t a = static_cast<std::int64_t>(new_indptr[b + 1]) - new_indptr[b];
        require(a >= 0, fn, "new_indptr[", b + 1, "] = ", new_indptr[b + 1], " is below new_indptr[", b,
                "] = ", new_indptr[b], "; expected non-decreasing offsets");
        require(seq_lens[b] + a <= capacity, fn, "sequence ", b, " holds ", seq_lens[b], " rows and gets ", a,
                " new ones: ", seq_lens[b] + a, " rows exceed its capacity ", capacity,
                " (contiguous: page_size; paged: block_table_stride x page_size)");
    }
    require(new_indptr[B] == total_new, fn, "new_indptr[batch] = ", new_indptr[B], " but k_new has ", total_new,
            " rows; expected equal");
}

// keep_indptr [batch + 1] from 0, non-decreasing; each list 1 .. n_b entries (0 for an empty sequence).
inline void check_keep_indptr(std::span<const std::int32_t> keep_indptr, std::span<const std::int32_t> seq_lens,
                              const char* fn) {
    const std::size_t B = seq_lens.size();
    require(keep_indptr.size() == B + 1, fn, "keep_indptr has ", keep_indptr.size(),
            " entries, expected batch + 1 = ", B + 1);
    require(keep_indptr[0] == 0, fn, "keep_indptr[0] = ", keep_indptr[0], ", expected 0");
    for (std::size_t b = 0; b < B; ++b) {
        const std::int64_t m = static_cast<std::int64_t>(keep_indptr[b + 1]) - keep_indptr[b];
        require(m >= 0, fn, "keep_indptr[", b + 1, "] = ", keep_indptr[b + 1], " is below keep_indptr[", b,
                "] = ", keep_indptr[b], "; expected non-decreasing offsets");
        require(m <= seq_lens[b], fn, "the keep list of sequence ", b, " has ", m, " entries but the sequence holds ",
                seq_lens[b], " rows");
        require(m >= 1 || seq_lens[b] == 0, fn, "the keep list of sequence ", b,
                " is empty; expected at least one row (to leave a sequence alone, list all its rows; to evict all, "
                "drop the sequence)");
    }
}

// One sequence's keep list: ascending, unique, in [0, len).
inline void check_keep_list(std::span<const std::int32_t> keep, std::int64_t b, std::int64_t len, const char* fn) {
    for (std::size_t i = 0; i < keep.size(); ++i) {
        require(keep[i] >= 0 && keep[i] < len, fn, "keep list of sequence ", b, ": entry ", i, " = ", keep[i],
                ", expected a row in [0, ", len, ")");
        if (i == 0) continue;  // require evaluates its message arguments: keep[i - 1] only exists from i = 1
        require(keep[i] > keep[i - 1], fn, "keep list of sequence ", b, ": entry ", i, " = ", keep[i],
                " is not above entry ", i - 1, " = ", keep[i - 1], "; expected ascending rows without duplicates");
    }
}

// First entry of a keep list that moves its row (keep[i] != i); keep.size() when none does. Valid
// lists have keep[i] == i for i below it and keep[i] > i from it on.
inline std::int64_t first_moved(std::span<const std::int32_t> keep) {
    std::int64_t i = 0;
    while (i < static_cast<std::int64_t>(keep.size()) && keep[static_cast<std::size_t>(i)] == i) ++i;
    return i;
}

// The block-table entries an update touches, host copy `table` [batch, table_stride]: sequence b uses
// slots [0, in_use[b]), each entry in [0, n_pages); it writes or releases slots [written_from[b],
// in_use[b]), whose pages must appear exactly once among the pages the batch uses.
inline void check_pages(std::span<const std::int32_t> table, std::int64_t table_stride, std::int64_t n_pages,
                        std::span<const std::int64_t> in_use, std::span<const std::int64_t> written_from,
                        const char* fn) {
    std::vector<std::int32_t> uses(static_cast<std::size_t>(n_pages), 0);
    for (std::size_t b = 0; b < in_use.size(); ++b)
        for (std::int64_t s = 0; s < in_use[b]; ++s) {
            const std::int32_t p = table[static_cast<std::size_t>(static_cast<std::int64_t>(b) * table_stride + s)];
            require(p >= 0 && p < n_pages, fn, "block_table[", b, "][", s, "] = ", p, ", expected a page in [0, ",
                    n_pages, ") (sequence ", b, " uses ", in_use[b], " pages)");
            ++uses[static_cast<std::size_t>(p)];
        }
    for (std::size_t b = 0; b < in_use.size(); ++b)
        for (std::int64_t s = written_from[b]; s < in_use[b]; ++s) {
            const std::int32_t p = table[static_cast<std::size_t>(static_cast<std::int64_t>(b) * table_stride + s)];
            require(uses[static_cast<std::size_t>(p)] == 1, fn, "page ", p, " (block_table[", b, "][", s,
                    "]) is written or released by this update but used ", uses[static_cast<std::size_t>(p)],
                    " times in the batch; expected the pages an update changes to belong to one sequence only");
        }
}

// New rows converted to a 16-bit cache type must stay finite: a finite value beyond the type's range
// (fp16: 65504) would round to inf, silently. Nothing to check when the types match or T is fp32.
template <class T, class TI>
void check_narrowing(const View3<const TI>& x, const char* name, const char* fn) {
    if constexpr (!std::is_same_v<std::remove_const_t<TI>, T> && !std::is_same_v<T, float>) {
        for (std::int64_t t = 0; t < x.shape[0]; ++t)
            for (std::int64_t g = 0; g < x.shape[1]; ++g)
                for (std::int64_t c = 0; c < x.shape[2]; ++c) {
                    const float v = to_float(x(t, g, c));
                    require(!std::isfinite(v) || std::isfinite(to_float(from_float<T>(v))), fn, name, "[", t, ", ", g,
                            ", ", c, "] = ", v, " overflows the cache's ", dtype_name(dtype_of<T>()),
                            " (rounds to inf); expected values the cache's type holds");
                }
    }
}

// Positions view [batch, >= rows]: shape, strides, not self-overlapping (written).
inline void check_positions(const View2<std::int64_t>& positions, std::int64_t batch, std::int64_t rows,
                            const char* fn) {
    require(positions.shape[0] == batch && positions.shape[1] >= rows, fn, "positions has shape [", positions.shape[0],
            ", ", positions.shape[1], "], expected [batch = ", batch, ", >= ", rows,
            "] (the longest sequence this update leaves)");
    ::vlsparse::detail::check_strides(positions, fn, "positions", true);
}

}  // namespace detail

// Appends each sequence's new rows after its current rows: sequence b gets rows
// new_indptr[b] .. new_indptr[b + 1] - 1 of k_new / v_new [total_new, H_kv, d] (any strides, any
// element type; converted to T) at rows seq_lens[b] .., then seq_lens[b] grows by their count.
// positions (optional, [batch, >= longest new length]) receives new_positions [total_new] at the same
// rows; pass both or neither.
template <ElementType T, ElementType TI>
void kv_batch_append(KvBatchView<T> cache, std::span<std::int32_t> seq_lens_host, View3<const TI> k_new,
                     View3<const TI> v_new, std::span<const std::int32_t> new_indptr,
                     View2<std::int64_t> positions = {}, View1<const std::int64_t> new_positions = {}) {
    constexpr const char* fn = "reference::kv_batch_append";
    static_assert(!std::is_const_v<T>, "a cache update needs a writable view: KvBatchView<T> with T not const");
    detail::check_update_layout(cache, seq_lens_host, fn);
    detail::require(
        cache.seq_lens == seq_lens_host.data(), fn,
        "cache.seq_lens does not point to seq_lens_host; the reference updates the lengths in place through it");
    const std::int64_t B = cache.batch, Hkv = cache.n_kv_heads, d = cache.head_dim;
    ::vlsparse::detail::check_strides(k_new, fn, "k_new", false);
    ::vlsparse::detail::check_strides(v_new, fn, "v_new", false);
    detail::require(k_new.shape[1] == Hkv && k_new.shape[2] == d, fn, "k_new has shape [", k_new.shape[0], ", ",
                    k_new.shape[1], ", ", k_new.shape[2], "], expected [total_new, ", Hkv, ", ", d, "]");
    detail::require(v_new.shape == k_new.shape, fn, "v_new has shape [", v_new.shape[0], ", ", v_new.shape[1], ", ",
                    v_new.shape[2], "], expected the shape of k_new");
    detail::check_append_indptr(new_indptr, seq_lens_host, cache.capacity(), k_new.shape[0], fn);
    std::int64_t longest = 0;
    for (std::int64_t b = 0; b < B; ++b)
        longest = std::max<std::int64_t>(longest, seq_lens_host[static_cast<std::size_t>(b)] +
                                                      new_indptr[static_cast<std::size_t>(b + 1)] -
                                                      new_indptr[static_cast<std::size_t>(b)]);
    detail::require(
        (positions.data == nullptr) == (new_positions.data == nullptr), fn,
        "positions and new_positions: pass both (positions of the cache rows and of the new rows) or neither");
    if (positions.data) {
        detail::check_positions(positions, B, longest, fn);
        detail::require(new_positions.shape[0] == k_new.shape[0], fn, "new_positions has ", new_positions.shape[0],
                        " entries, expected one per new row (", k_new.shape[0], ")");
    }
    if (cache.paged()) {
        std::vector<std::int64_t> in_use(static_cast<std::size_t>(B)), from(static_cast<std::size_t>(B));
        for (std::int64_t b = 0; b < B; ++b) {
            const std::int64_t n = seq_lens_host[static_cast<std::size_t>(b)];
            const std::int64_t a =
                new_indptr[static_cast<std::size_t>(b + 1)] - new_indptr[static_cast<std::size_t>(b)];
            in_use[static_cast<std::size_t>(b)] = detail::pages_for(n + a, cache.page_size);
            from[static_cast<std::size_t>(b)] = a > 0 ? n / cache.page_size : in_use[static_cast<std::size_t>(b)];
        }
        detail::check_pages(
            std::span<const std::int32_t>(cache.block_table, static_cast<std::size_t>(B * cache.block_table_stride)),
            cache.block_table_stride, cache.n_pages, in_use, from, fn);
    }
    detail::check_narrowing<T>(k_new, "k_new", fn);
    detail::check_narrowing<T>(v_new, "v_new", fn);

    for (std::int64_t b = 0; b < B; ++b) {
        const std::int64_t n = seq_lens_host[static_cast<std::size_t>(b)];
        for (std::int64_t t = new_indptr[static_cast<std::size_t>(b)]; t < new_indptr[static_cast<std::size_t>(b + 1)];
             ++t) {
            const std::int64_t r = n + t - new_indptr[static_cast<std::size_t>(b)];
            for (std::int64_t g = 0; g < Hkv; ++g) {
                T* kd = cache.k_row(b, r, g);
                T* vd = cache.v_row(b, r, g);
                for (std::int64_t c = 0; c < d; ++c) {
                    if constexpr (std::is_same_v<std::remove_const_t<TI>, T>) {
                        kd[c] = k_new(t, g, c);
                        vd[c] = v_new(t, g, c);
                    } else {
                        kd[c] = from_float<T>(to_float(k_new(t, g, c)));
                        vd[c] = from_float<T>(to_float(v_new(t, g, c)));
                    }
                }
            }
            if (positions.data) positions(b, r) = new_positions(t);
        }
    }
    for (std::int64_t b = 0; b < B; ++b)
        seq_lens_host[static_cast<std::size_t>(b)] +=
            new_indptr[static_cast<std::size_t>(b + 1)] - new_indptr[static_cast<std::size_t>(b)];
}

namespace detail {

// Compacts the sequences b with keep_indptr non-null (CSR, every sequence) or the one sequence `only`
// (keep_indptr empty, `keep` its list); the checks of both public forms, then the moves.
template <class T>
std::vector<std::int32_t> compact(KvBatchView<T> cache, std::span<std::int32_t> seq_lens_host,
                                  std::span<const std::int32_t> keep_indptr, std::span<const std::int32_t> keep,
                                  std::int64_t only, View2<std::int64_t> positions, const char* fn) {
    static_assert(!std::is_const_v<T>, "a cache update needs a writable view: KvBatchView<T> with T not const");
    check_update_layout(cache, seq_lens_host, fn);
    require(cache.seq_lens == seq_lens_host.data(), fn,
            "cache.seq_lens does not point to seq_lens_host; the reference updates the lengths in place through it");
    const std::int64_t B = cache.batch;
    const bool batched = only < 0;
    // The keep list of sequence b (empty span: b is not compacted by the single-sequence form).
    auto list = [&](std::int64_t b) -> std::span<const std::int32_t> {
        if (batched)
            return keep.subspan(static_cast<std::size_t>(keep_indptr[static_cast<std::size_t>(b)]),
                                static_cast<std::size_t>(keep_indptr[static_cast<std::size_t>(b + 1)] -
                                                         keep_indptr[static_cast<std::size_t>(b)]));
        return b == only ? keep : std::span<const std::int32_t>{};
    };
    auto touched = [&](std::int64_t b) { return batched || b == only; };
    if (batched) {
        check_keep_indptr(keep_indptr, seq_lens_host, fn);
        require(static_cast<std::int64_t>(keep.size()) == keep_indptr[static_cast<std::size_t>(B)], fn, "keep has ",
                keep.size(), " entries, expected keep_indptr[batch] = ", keep_indptr[static_cast<std::size_t>(B)]);
    } else {
        require(only < B, fn, "sequence ", only, ", expected 0 <= b < batch = ", B);
        const std::int64_t len = seq_lens_host[static_cast<std::size_t>(only)];
        require(static_cast<std::int64_t>(keep.size()) <= len, fn, "the keep list of sequence ", only, " has ",
                keep.size(), " entries but the sequence holds ", len, " rows");
        require(!keep.empty() || len == 0, fn, "the keep list of sequence ", only,
                " is empty; expected at least one row (to evict every row, drop the sequence)");
    }
    for (std::int64_t b = 0; b < B; ++b)
        if (touched(b)) check_keep_list(list(b), b, seq_lens_host[static_cast<std::size_t>(b)], fn);
    if (positions.data) {
        std::int64_t longest = 0;
        for (std::int64_t b = 0; b < B; ++b)
            longest = std::max<std::int64_t>(longest, seq_lens_host[static_cast<std::size_t>(b)]);
        check_positions(positions, B, longest, fn);
    }
    if (cache.paged()) {
        std::vector<std::int64_t> in_use(static_cast<std::size_t>(B)), from(static_cast<std::size_t>(B));
        for (std::int64_t b = 0; b < B; ++b) {
            const auto l = list(b);
            const std::int64_t n = seq_lens_host[static_cast<std::size_t>(b)], m = static_cast<std::int64_t>(l.size());
            const std::int64_t f = first_moved(l);
            in_use[static_cast<std::size_t>(b)] = pages_for(n, cache.page_size);
            from[static_cast<std::size_t>(b)] = !touched(b) ? in_use[static_cast<std::size_t>(b)]
                                                : f < m     ? f / cache.page_size
                                                            : pages_for(m, cache.page_size);
        }
        check_pages(
            std::span<const std::int32_t>(cache.block_table, static_cast<std::size_t>(B * cache.block_table_stride)),
            cache.block_table_stride, cache.n_pages, in_use, from, fn);
    }

    // Row keep[i] -> row i in ascending i. In place and safe in this order: the row written at step i
    // is read only by entries j <= i (keep[j] = i needs j <= i), which came before.
    std::vector<std::int32_t> freed;
    auto* table = const_cast<std::int32_t*>(cache.block_table);  // the caller's table, written here
    for (std::int64_t b = 0; b < B; ++b) {
        if (!touched(b)) continue;
        const auto l = list(b);
        const std::int64_t n = seq_lens_host[static_cast<std::size_t>(b)], m = static_cast<std::int64_t>(l.size());
        for (std::int64_t i = 0; i < m; ++i) {
            const std::int64_t src = l[static_cast<std::size_t>(i)];
            if (src == i) continue;
            for (std::int64_t g = 0; g < cache.n_kv_heads; ++g) {
                std::copy_n(cache.k_row(b, src, g), cache.head_dim, cache.k_row(b, i, g));
                std::copy_n(cache.v_row(b, src, g), cache.head_dim, cache.v_row(b, i, g));
            }
            if (positions.data) positions(b, i) = positions(b, src);
        }
        if (cache.paged())
            for (std::int64_t s = pages_for(m, cache.page_size); s < pages_for(n, cache.page_size); ++s) {
                std::int32_t& e = table[b * cache.block_table_stride + s];
                freed.push_back(e);
                e = -1;
            }
        seq_lens_host[static_cast<std::size_t>(b)] = static_cast<std::int32_t>(m);
    }
    return freed;
}

}  // namespace detail

// Compacts sequence b to the rows listed in `keep` (ascending, unique, in [0, seq_lens[b]), at least
// one): row keep[i] becomes row i for every KV head, seq_lens[b] becomes keep.size(). Paged caches:
// returns the pages released (block-table slots ceil(kept / P) .. ceil(old length / P) - 1 of b, in
// slot order) and sets those slots to -1 (cache.block_table must point to writable memory);
// contiguous caches: returns nothing. positions (optional, [batch, >= longest length]) are moved
// with the rows. Other sequences are not touched.
template <ElementType T>
std::vector<std::int32_t> kv_batch_compact(KvBatchView<T> cache, std::span<std::int32_t> seq_lens_host, std::int64_t b,
                                           std::span<const std::int32_t> keep, View2<std::int64_t> positions = {}) {
    constexpr const char* fn = "reference::kv_batch_compact";
    detail::require(b >= 0, fn, "sequence ", b, ", expected 0 <= b < batch = ", cache.batch);
    return detail::compact(cache, seq_lens_host, {}, keep, b, positions, fn);
}

// Compacts every sequence of the batch at once: sequence b keeps rows
// keep[keep_indptr[b] .. keep_indptr[b + 1]) (CSR, keep_indptr [batch + 1]; a sequence to leave alone
// lists all its rows). Returns the released pages of every sequence, sequence by sequence.
template <ElementType T>
std::vector<std::int32_t> kv_batch_compact(KvBatchView<T> cache, std::span<std::int32_t> seq_lens_host,
                                           std::span<const std::int32_t> keep_indptr,
                                           std::span<const std::int32_t> keep, View2<std::int64_t> positions = {}) {
    constexpr const char* fn = "reference::kv_batch_compact";
    detail::require(!keep_indptr.empty(), fn, "keep_indptr is empty, expected batch + 1 = ", cache.batch + 1,
                    " entries");
    return detail::compact(cache, seq_lens_host, keep_indptr, keep, -1, positions, fn);
}

}  // namespace vlsparse::reference
