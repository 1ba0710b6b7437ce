// vlsparse/kv/kv_batch.hpp -- a batch of sequences' KV caches, contiguous or paged, and the row lists
// a decode step reads from them: the description an engine hands to the reference, the CPU path and
// the CUDA kernels alike (plain structs of pointers and strides, usable in host and device code).
//
// Sequence b holds seq_lens[b] rows per KV head (all KV heads of a sequence hold the same rows).
// Row r of sequence b, KV head g lives at
//
//     page = block_table ? block_table[b * block_table_stride + r / page_size] : b
//     K:  k + page * page_stride + (r % page_size) * row_stride + g * head_stride   (V: same from v)
//
// with head_dim contiguous elements. Two layouts of this one formula:
//   - contiguous: block_table == nullptr; "page" b is the whole of sequence b (page_size = its
//     capacity in rows, page_stride = the distance between sequences); B = 1 is the single-buffer
//     cache of an engine that keeps one sequence;
//   - paged (vLLM, FlashInfer): pages of page_size rows drawn from one pool of n_pages pages, listed
//     per sequence in a block table [batch, block_table_stride]; NHD pages (row_stride = H_kv * d,
//     head_stride = d) and HND pages (head_stride = page_size * d, row_stride = d) both fit.
//
// Row lists (BatchRowLists) name LOGICAL rows of a sequence (0 <= r < seq_lens[b]), never pages, so a
// list means the same thing in either layout and pages are never gathered. CSR over (sequence, list):
// list l of sequence b is indices[indptr[b * lists_per_seq + l] .. indptr[b * lists_per_seq + l + 1]);
// lists_per_seq is 1 (one list read by every KV head) or H_kv (one per KV head); each list sorted
// ascending, no duplicates. indptr == nullptr means "every row" (dense decode).
//
// Queries of a step: q [total_q, H, d] (token-major, strides in elements), sequence b owning rows
// q_indptr[b] .. q_indptr[b + 1] (q_len_b = 1 for plain decode, up to kMaxQueriesPerSeq for
// speculative / chunked decode). The new tokens are already appended: they are the last q_len_b rows
// of the sequence, and query i of sequence b sees rows r <= seq_lens[b] - q_len_b + i (causal among
// the new tokens; every older row is visible).
//
// Where the pointers point (host or device memory) is the caller's business: the reference and the
// CPU path read host memory, the CUDA path device memory. The host-side checks below validate the
// metadata a caller always has on the host (batch size, lengths, indptr arrays, strides);
// detail::check_batch_contents also reads what the pointers hold (list entries, block tables,
// seq_lens), so it takes host memory only: the reference and the CPU path call it.
// Include: <vlsparse/vlsparse.hpp> (or this header alone).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <span>
#include <type_traits>

#include "vlsparse/core/config.hpp"
#include "vlsparse/core/error.hpp"

namespace vlsparse {

// The most queries one sequence may bring to one decode step (q_len: speculative / chunked decode).
inline constexpr std::int32_t kMaxQueriesPerSeq = 8;

// Where a batch's K/V rows live (see the header comment). T is const for read-only use.
template <class T>
struct KvBatchView {
    T* k = nullptr;
    T* v = nullptr;
    std::int32_t batch = 0;       // sequences
    std::int32_t n_kv_heads = 0;  // H_kv
    std::int32_t head_dim = 0;    // d
    std::int64_t page_size = 0;   // rows per page (contiguous: each sequence's capacity)
    std::int64_t page_stride = 0, row_stride = 0, head_stride = 0;  // elements
    // Paged: pages in the pool (every block-table entry is in [0, n_pages)). Contiguous: 0 (unused).
    std::int64_t n_pages = 0;
    // block_table and seq_lens are const for what decode reads; the cache updates (append, compaction:
    // reference/kv_batch.hpp, cuda/kv_cache.cuh) take the same view and write both through it (released
    // block-table slots become -1, lengths change), so they must point to writable memory there.
    const std::int32_t* block_table = nullptr;  // [batch, block_table_stride]; null: contiguous
    std::int64_t block_table_stride = 0;         // entries per sequence (pages it may address)
    const std::int32_t* seq_lens = nullptr;      // [batch]: rows each sequence holds now

    VLSPARSE_HD bool paged() const { return block_table != nullptr; }
    // Element offset of row r of sequence b, KV head g (r < seq_lens[b]; not checked here).
    VLSPARSE_HD std::int64_t offset(std::int64_t b, std::int64_t r, std::int64_t g) const {
        const std::int64_t page = block_table ? block_table[b * block_table_stride + r / page_size] : b;
        return page * page_stride + (r % page_size) * row_stride + g * head_stride;
    }
    VLSPARSE_HD T* k_row(std::int64_t b, std::int64_t r, std::int64_t g) const { return k + offset(b, r, g); }
    VLSPARSE_HD T* v_row(std::int64_t b, std::int64_t r, std::int64_t g) const { return v + offset(b, r, g); }
    // Rows sequence b can hold without new pages (contiguous: page_size; paged: table width x P).
    VLSPARSE_HD std::int64_t capacity() const { return block_table ? block_table_stride * page_size : page_size; }

    // A read-only view of the same cache.
    template <class U = T>
        requires(!std::is_const_v<U>)
    VLSPARSE_HD operator KvBatchView<const U>() const {
        return {k, v, batch, n_kv_heads, head_dim, page_size, page_stride, row_stride, head_stride, n_pages,
                block_table, block_table_stride, seq_lens};
    }
};

// Row lists of a decode step, CSR over (sequence, list) (see the header comment).
struct BatchRowLists {
    const std::int32_t* indptr = nullptr;   // [batch * lists_per_seq + 1], indptr[0] == 0; null: every row
    const std::int32_t* indices = nullptr;  // logical rows, ascending and unique within each list
    std::int32_t lists_per_seq = 1;         // 1 (shared by the KV heads) or H_kv

    VLSPARSE_HD bool dense() const { return indptr == nullptr; }
    // Which list KV head g of sequence b reads.
    VLSPARSE_HD std::int64_t list_of(std::int64_t b, std::int64_t g) const {
        return b * lists_per_seq + (lists_per_seq == 1 ? 0 : g);
    }
};

// A contiguous cache of B sequences in one buffer [B, capacity, H_kv, d] (token-major, the layout of
// View3 caches); seq_lens: [B].
template <class T>
VLSPARSE_HD KvBatchView<T> contiguous_kv_batch(T* k, T* v, std::int32_t batch, std::int64_t capacity,
                                               std::int32_t n_kv_heads, std::int32_t head_dim,
                                               const std::int32_t* seq_lens) {
    const std::int64_t row = static_cast<std::int64_t>(n_kv_heads) * head_dim;
    return {k, v, batch, n_kv_heads, head_dim, capacity, capacity * row, row, head_dim, 0, nullptr, 0, seq_lens};
}

// A paged cache in NHD pages: pool [n_pages, page_size, H_kv, d] (vLLM's and FlashInfer's NHD layout);
// block_table [batch, block_table_stride].
template <class T>
VLSPARSE_HD KvBatchView<T> paged_kv_batch_nhd(T* k, T* v, std::int32_t batch, std::int64_t n_pages,
                                              std::int64_t page_size, std::int32_t n_kv_heads, std::int32_t head_dim,
                                              const std::int32_t* block_table, std::int64_t block_table_stride,
                                              const std::int32_t* seq_lens) {
    const std::int64_t row = static_cast<std::int64_t>(n_kv_heads) * head_dim;
    return {k, v, batch, n_kv_heads, head_dim, page_size, page_size * row, row, head_dim, n_pages, block_table,
            block_table_stride, seq_lens};
}

// A paged cache in HND pages: pool [n_pages, H_kv, page_size, d] (FlashInfer's HND layout).
template <class T>
VLSPARSE_HD KvBatchView<T> paged_kv_batch_hnd(T* k, T* v, std::int32_t batch, std::int64_t n_pages,
                                              std::int64_t page_size, std::int32_t n_kv_heads, std::int32_t head_dim,
                                              const std::int32_t* block_table, std::int64_t block_table_stride,
                                              const std::int32_t* seq_lens) {
    return {k, v, batch, n_kv_heads, head_dim, page_size, page_size * n_kv_heads * head_dim, head_dim,
            page_size * head_dim, n_pages, block_table, block_table_stride, seq_lens};
}

// The host-side copy of a step's metadata that every backend's checks (and the CUDA plan) read:
// lengths and indptr arrays, never the K/V rows or the list entries themselves.
struct DecodeBatchHost {
    std::span<const std::int32_t> seq_lens;     // [batch]
    std::span<const std::int32_t> q_indptr;     // [batch + 1]; empty: one query per sequence
    std::span<const std::int32_t> list_indptr;  // [batch * lists_per_seq + 1]; empty: dense (every row)
    std::int32_t lists_per_seq = 1;

    // Differences taken in int64: two int32 entries of a malformed array may differ by more than int32 holds.
    std::int64_t q_len(std::int64_t b) const {
        return q_indptr.empty() ? 1
                                : static_cast<std::int64_t>(q_indptr[static_cast<std::size_t>(b + 1)]) -
                                      q_indptr[static_cast<std::size_t>(b)];
    }
    std::int64_t total_q(std::int64_t batch) const {
        return q_indptr.empty() ? batch : q_indptr[static_cast<std::size_t>(batch)];
    }
    // Rows list l of sequence b reads (dense: all of them).
    std::int64_t list_len(std::int64_t b, std::int64_t l) const {
        if (list_indptr.empty()) return seq_lens[static_cast<std::size_t>(b)];
        const auto i = static_cast<std::size_t>(b * lists_per_seq + l);
        return static_cast<std::int64_t>(list_indptr[i + 1]) - list_indptr[i];
    }
};

namespace detail {

// a * b + c for a, b, c >= 0, or -1 when it exceeds int64 (sizes and strides come from the caller).
inline std::int64_t mul_add_or_overflow(std::int64_t a, std::int64_t b, std::int64_t c) {
    constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
    if (b != 0 && a > (kMax - c) / b) return -1;
    return a * b + c;
}

// The checks of a step's host metadata alone (every backend's, and the CUDA plan's, which has no
// cache view yet): sizes of the indptr arrays, indptr[0] == 0, each sequence's length within
// `capacity` (< 0: unknown, only >= 1 is checked), q_len in 1..kMaxQueriesPerSeq and <= its length,
// list lengths in 1..its length.
inline void check_decode_meta(const DecodeBatchHost& meta, std::int64_t B, std::int64_t Hkv, std::int64_t capacity,
                              bool paged, const char* fn) {
    require(static_cast<std::int64_t>(meta.seq_lens.size()) == B, fn, "seq_lens has ", meta.seq_lens.size(),
            " entries, expected batch = ", B);
    require(meta.lists_per_seq == 1 || meta.lists_per_seq == Hkv, fn, "lists_per_seq = ", meta.lists_per_seq,
            ", expected 1 (shared) or H_kv = ", Hkv);
    require(meta.q_indptr.empty() || static_cast<std::int64_t>(meta.q_indptr.size()) == B + 1, fn, "q_indptr has ",
            meta.q_indptr.size(), " entries, expected batch + 1 = ", B + 1, " (or none: one query per sequence)");
    if (!meta.q_indptr.empty()) require(meta.q_indptr[0] == 0, fn, "q_indptr[0] = ", meta.q_indptr[0], ", expected 0");
    const std::int64_t n_lists = B * meta.lists_per_seq;
    require(meta.list_indptr.empty() || static_cast<std::int64_t>(meta.list_indptr.size()) == n_lists + 1, fn,
            "list indptr has ", meta.list_indptr.size(), " entries, expected batch x lists_per_seq + 1 = ", n_lists + 1,
            " (or none: dense)");
    if (!meta.list_indptr.empty())
        require(meta.list_indptr[0] == 0, fn, "list indptr[0] = ", meta.list_indptr[0], ", expected 0");
    for (std::int64_t b = 0; b < B; ++b) {
        const std::int64_t len = meta.seq_lens[static_cast<std::size_t>(b)];
        if (capacity < 0) require(len >= 1, fn, "sequence ", b, " holds ", len, " rows, expected >= 1");
        else
            require(len >= 1 && len <= capacity, fn, "sequence ", b, " holds ", len, " rows, expected 1..", capacity,
                    paged ? " (block_table_stride x page_size)" : " (its capacity, page_size)");
        const std::int64_t ql = meta.q_len(b);
        require(ql >= 1 && ql <= kMaxQueriesPerSeq && ql <= len, fn, "sequence ", b, " has q_len = ", ql,
                ", expected 1..", kMaxQueriesPerSeq, " and <= its ", len, " rows (the new tokens are appended first)");
        for (std::int64_t l = 0; l < (meta.list_indptr.empty() ? 0 : meta.lists_per_seq); ++l) {
            const std::int64_t n = meta.list_len(b, l);
            require(n >= 1 && n <= len, fn, "list ", l, " of sequence ", b, " has ", n, " entries, expected 1..", len,
                    " (its rows)");
        }
    }
}

// Checks the cache description against the host metadata: shapes, strides that keep every row of
// every sequence inside its own page and head, lengths within capacity, q_len in 1..kMaxQueriesPerSeq
// and <= seq_len, indptr arrays monotone with list lengths <= seq_len. `meta.seq_lens` must hold the
// same lengths as `cache.seq_lens` (which may point to device memory).
template <class T>
void check_kv_batch(const KvBatchView<T>& cache, const DecodeBatchHost& meta, std::int64_t n_heads, const char* fn) {
    const std::int64_t B = cache.batch, Hkv = cache.n_kv_heads, d = cache.head_dim;
    require(B >= 1, fn, "batch = ", B, ", expected at least one sequence");
    require(Hkv >= 1 && d >= 1, fn, "cache has H_kv = ", Hkv, ", head_dim = ", d, "; expected both >= 1");
    require(n_heads >= 1 && n_heads % Hkv == 0, fn, "H = ", n_heads, " query heads is not a positive multiple of H_kv = ",
            Hkv);
    require(cache.k != nullptr && cache.v != nullptr && cache.seq_lens != nullptr, fn,
            "the cache view has a null K, V or seq_lens pointer");
    require(cache.page_size >= 1, fn, "page_size = ", cache.page_size, ", expected >= 1");
    require(cache.row_stride >= 0 && cache.head_stride >= 0 && cache.page_stride >= 0, fn,
            "negative strides (page ", cache.page_stride, ", row ", cache.row_stride, ", head ", cache.head_stride, ")");
    // Rows and heads of one page must not overlap: the (row, head) grid of d-element spans fits the page.
    const bool rows_outer = cache.row_stride >= cache.head_stride;
    const std::int64_t inner = rows_outer ? cache.head_stride : cache.row_stride;
    const std::int64_t inner_n = rows_outer ? Hkv : cache.page_size;
    const std::int64_t outer = rows_outer ? cache.row_stride : cache.head_stride;
    const std::int64_t outer_n = rows_outer ? cache.page_size : Hkv;
    // Spans in elements, each checked against int64 before it is used: a row's heads (or a head's
    // rows), one page, the whole pool (kv_batch_extent).
    const std::int64_t inner_span = mul_add_or_overflow(inner, inner_n - 1, d);
    const std::int64_t page_span = inner_span < 0 ? -1 : mul_add_or_overflow(outer, outer_n - 1, inner_span);
    require(page_span >= 0, fn, "strides (row ", cache.row_stride, ", head ", cache.head_stride, ") with page_size = ",
            cache.page_size, ", H_kv = ", Hkv, ", d = ", d, " make one page span more than 2^63 elements");
    require((inner_n == 1 || inner >= d) && (outer_n == 1 || outer >= inner_span), fn, "strides (row ",
            cache.row_stride, ", head ", cache.head_stride, ") make rows or heads of d = ", d, " elements overlap");
    require(B == 1 && !cache.paged() ? true : cache.page_stride >= page_span, fn, "page_stride = ", cache.page_stride,
            " is smaller than one page's span (", page_span, " elements): pages (or sequences) overlap");
    if (cache.paged()) {
        require(cache.n_pages >= 1, fn, "paged cache with n_pages = ", cache.n_pages, ", expected >= 1");
        require(cache.block_table_stride >= 1, fn, "block_table_stride = ", cache.block_table_stride, ", expected >= 1");
        require(cache.block_table_stride <= std::numeric_limits<std::int64_t>::max() / cache.page_size, fn,
                "block_table_stride = ", cache.block_table_stride, " x page_size = ", cache.page_size,
                " rows per sequence exceed int64");
    }
    const std::int64_t pages = cache.paged() ? cache.n_pages : B;
    require(mul_add_or_overflow(cache.page_stride, pages - 1, page_span) >= 0, fn, "page_stride = ", cache.page_stride,
            " x ", pages, cache.paged() ? " pages" : " sequences", " span more than 2^63 elements");
    check_decode_meta(meta, B, Hkv, cache.capacity(), cache.paged(), fn);
}

// Element span [0, n) of the K (or V) buffer a cache view may address from its base pointer: the
// largest offset() of any row and head, plus d (contiguous: its batch sequences; paged: its n_pages
// pages). For alias checks of outputs; assumes check_kv_batch passed.
template <class T>
std::int64_t kv_batch_extent(const KvBatchView<T>& cache) {
    const std::int64_t pages = cache.paged() ? cache.n_pages : cache.batch;
    return (pages - 1) * cache.page_stride + (cache.page_size - 1) * cache.row_stride +
           (cache.n_kv_heads - 1) * cache.head_stride + cache.head_dim;
}

// Checks what check_kv_batch cannot see because it lives behind pointers: it READS HOST MEMORY
// (cache.seq_lens, cache.block_table, lists.indptr, lists.indices), so the reference and the CPU path
// call it, the CUDA path does the same on the device. Call check_kv_batch first. Throws unless
//   - cache.seq_lens[b] == meta.seq_lens[b] for every sequence;
//   - lists and meta agree: lists_per_seq, dense or not, and lists.indptr[i] == meta.list_indptr[i];
//   - every list is sorted ascending without duplicates, each row in [0, seq_lens[b]);
//   - every query sees at least one listed row: the first row of every list of sequence b is
//     <= seq_lens[b] - q_len_b (the position of its first new token, which sees the fewest rows);
//   - paged: the block-table entries of the pages each sequence uses (0 .. ceil(seq_len / page_size)
//     - 1) are pages of the pool, in [0, n_pages).
// Pages may be shared between sequences (prefix sharing); nothing checks that they are not.
template <class T>
void check_batch_contents(const KvBatchView<T>& cache, const BatchRowLists& lists, const DecodeBatchHost& meta,
                          const char* fn) {
    const std::int64_t B = cache.batch;
    require(lists.lists_per_seq == meta.lists_per_seq, fn, "the row lists have lists_per_seq = ", lists.lists_per_seq,
            " but the host metadata says ", meta.lists_per_seq, "; expected the same");
    require(lists.dense() == meta.list_indptr.empty(), fn,
            lists.dense() ? "the row lists are dense (indptr null) but the host metadata has a list indptr"
                          : "the row lists have an indptr but the host metadata's list indptr is empty (dense)",
            "; expected both dense or both listed");
    const std::int64_t n_lists = B * lists.lists_per_seq;
    if (!lists.dense()) {
        const std::int64_t total = meta.list_indptr[static_cast<std::size_t>(n_lists)];
        require(lists.indices != nullptr || total == 0, fn, "the row lists have a null indices pointer and ", total,
                " entries");
        for (std::int64_t i = 0; i <= n_lists; ++i)
            require(lists.indptr[i] == meta.list_indptr[static_cast<std::size_t>(i)], fn, "list indptr[", i, "] = ",
                    lists.indptr[i], " but the host metadata's copy holds ", meta.list_indptr[static_cast<std::size_t>(i)],
                    "; expected the same arrays");
    }
    for (std::int64_t b = 0; b < B; ++b) {
        const std::int64_t len = meta.seq_lens[static_cast<std::size_t>(b)];
        require(cache.seq_lens[b] == len, fn, "cache.seq_lens[", b, "] = ", cache.seq_lens[b],
                " but the host metadata says ", len, "; expected the same lengths");
        const std::int64_t first_query_pos = len - meta.q_len(b);  // the newest row its first query sees
        if (cache.paged()) {
            const std::int64_t used = len == 0 ? 0 : (len - 1) / cache.page_size + 1;  // no overflow for any page_size
            for (std::int64_t p = 0; p < used; ++p) {
                const std::int64_t page = cache.block_table[b * cache.block_table_stride + p];
                require(page >= 0 && page < cache.n_pages, fn, "block_table[", b, ", ", p, "] = ", page, " (sequence ", b,
                        ", rows ", p * cache.page_size, "..", std::min(len, (p + 1) * cache.page_size) - 1,
                        "), expected a page of the pool in [0, ", cache.n_pages, ")");
            }
        }
        if (lists.dense()) continue;
        for (std::int64_t l = 0; l < lists.lists_per_seq; ++l) {
            const std::int64_t li = b * lists.lists_per_seq + l;
            const std::int64_t e0 = lists.indptr[li], e1 = lists.indptr[li + 1];
            for (std::int64_t e = e0; e < e1; ++e) {
                const std::int64_t r = lists.indices[e];
                require(r >= 0 && r < len, fn, "list ", l, " of sequence ", b, " holds row ", r, " at entry ", e - e0,
                        " (indices[", e, "]), expected a row in [0, ", len, ")");
                if (e == e0) continue;  // require evaluates its message: indices[e - 1] only from the second entry
                require(r > lists.indices[e - 1], fn, "list ", l, " of sequence ", b,
                        " is not sorted ascending without duplicates at entry ", e - e0, " (rows ", lists.indices[e - 1],
                        ", ", r, ")");
            }
            const std::int64_t first = e1 > e0 ? lists.indices[e0] : len;
            require(first <= first_query_pos, fn, "query 0 of sequence ", b, " (position ", first_query_pos,
                    ") sees no row of list ", l, " (its first row is ", first,
                    "); expected every new token to see at least one listed row");
        }
    }
}

}  // namespace detail

}  // namespace vlsparse
