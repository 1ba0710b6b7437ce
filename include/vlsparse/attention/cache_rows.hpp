// vlsparse/attention/cache_rows.hpp -- CacheRows: the KV-cache rows an indexed decode step reads.
//
// An indexed decode step reads, for KV head g, only the cache rows listed for it: list g, or list 0
// when one list is shared by every KV head. Lists hold ROW numbers of one sequence's cache
// (0 <= r < rows of KV head g), not token positions: a row is addressed in O(1), so a step costs
// nothing beyond the rows it reads. rows_for_positions() converts a position list (what policies
// produce: TokenSelection, A-VL's DecodeSchedule) into row lists, by binary search over the cache's
// positions, and rejects any position the cache does not hold.
//
// CacheRows owns the lists in CSR form: list l is indices()[indptr()[l] .. indptr()[l + 1]). view()
// is the same lists as a non-owning BatchRowLists of one sequence (vlsparse/kv/kv_batch.hpp), the
// row-list description the batched decode of every backend reads (reference, CPU, CUDA: a device
// copy is two memcpys). Entries are int32, as in BatchRowLists and the CUDA kernels: the rows of one
// sequence's cache number below 2^31, and 4-byte indices halve what a step reads besides K and V.
// Building a CacheRows rejects only what int32 cannot hold; the decode functions check the lists
// against their cache (detail::check_cache_rows: 1 or H_kv lists, each non-empty, sorted ascending
// without duplicates, every row inside its KV head), so one malformed list is reported by the call
// that would read it, with the same message on every backend.
// Shared by vlsparse::reference, vlsparse::simd and vlsparse::cuda. Include: <vlsparse/vlsparse.hpp>
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <span>
#include <vector>

#include "vlsparse/core/error.hpp"
#include "vlsparse/core/selection.hpp"
#include "vlsparse/core/tensor.hpp"
#include "vlsparse/detail/check.hpp"
#include "vlsparse/kv/kv_batch.hpp"
#include "vlsparse/kv/kv_cache.hpp"

namespace vlsparse {

// Row lists of one sequence's cache in one layer: 1 list (shared by every KV head) or one per KV head.
class CacheRows {
public:
    using index_type = std::int32_t;

    // No lists (a decode step rejects it; push() adds lists).
    CacheRows() = default;
    // From lists of rows, one per braced list: CacheRows{{0, 5, 9}} (shared), CacheRows{{0, 5}, {1, 9}}.
    CacheRows(std::initializer_list<std::vector<std::int64_t>> lists) {
        for (const auto& l : lists) push(l);
    }
    explicit CacheRows(const std::vector<std::vector<std::int64_t>>& lists) {
        for (const auto& l : lists) push(l);
    }

    // Appends one list (the next KV head's, or the shared one). Throws if an entry or the total
    // number of entries does not fit in int32; order and range are checked where the lists are read.
    void push(std::span<const std::int64_t> list) { push_checked(list); }
    void push(std::span<const std::int32_t> list) { push_checked(list); }
    void push(std::initializer_list<std::int64_t> list) { push_checked(std::span<const std::int64_t>(list.begin(), list.size())); }
    // Appends the list of every row 0 .. n - 1 (a dense decode step of a head holding n rows).
    void push_all(std::int64_t n) {
        constexpr const char* fn = "CacheRows::push_all";
        detail::require(n >= 0, fn, "n = ", n, ", expected >= 0 rows");
        check_total(n, fn);
        for (std::int64_t r = 0; r < n; ++r) indices_.push_back(static_cast<index_type>(r));
        indptr_.push_back(static_cast<index_type>(indices_.size()));
    }

    // Number of lists: 1 (shared) or H_kv when well formed.
    std::int64_t lists() const { return static_cast<std::int64_t>(indptr_.size()) - 1; }
    bool shared() const { return lists() == 1; }
    // Entries of all lists together.
    std::int64_t total() const { return static_cast<std::int64_t>(indices_.size()); }
    bool empty() const { return lists() == 0; }

    // List l (0 <= l < lists()).
    std::span<const index_type> list(std::int64_t l) const {
        detail::require(l >= 0 && l < lists(), "CacheRows::list", "list ", l, " of ", lists(),
                        " lists; expected 0 <= l < ", lists());
        return list_unchecked(l);
    }
    // The list KV head g reads: the shared list, or list g.
    std::span<const index_type> for_kv_head(std::int64_t g) const {
        detail::require(g >= 0 && (shared() || g < lists()), "CacheRows::for_kv_head", "KV head ", g, " of ", lists(),
                        lists() == 1 ? " list (shared)" : " lists", "; expected 0 <= g < ", lists(),
                        lists() == 1 ? " or any g >= 0 (the list is shared)" : "");
        return list_unchecked(shared() ? 0 : g);
    }
    // Entries of the longest list (0 without lists): the width L of a step's probabilities [H, L].
    std::int64_t longest() const {
        std::int64_t m = 0;
        for (std::int64_t l = 0; l < lists(); ++l) m = std::max<std::int64_t>(m, indptr_[l + 1] - indptr_[l]);
        return m;
    }

    // The CSR arrays: indptr [lists() + 1] (indptr[0] == 0), indices [total()].
    std::span<const index_type> indptr() const { return indptr_; }
    std::span<const index_type> indices() const { return indices_; }
    // The lists as a non-owning BatchRowLists of one sequence (valid while this object is alive and
    // unchanged): list_of(0, g) is the list KV head g reads. Host memory.
    BatchRowLists view() const {
        return {indptr_.data(), indices_.data(), static_cast<std::int32_t>(std::max<std::int64_t>(lists(), 0))};
    }

    friend bool operator==(const CacheRows&, const CacheRows&) = default;

private:
    std::span<const index_type> list_unchecked(std::int64_t l) const {
        const auto b = static_cast<std::size_t>(indptr_[static_cast<std::size_t>(l)]);
        const auto e = static_cast<std::size_t>(indptr_[static_cast<std::size_t>(l) + 1]);
        return std::span<const index_type>(indices_).subspan(b, e - b);
    }
    void check_total(std::int64_t add, const char* fn) const {
        detail::require(add <= std::numeric_limits<index_type>::max() - total(), fn, "list ", lists(), " has ", add,
                        " entries after ", total(), " in earlier lists; expected at most 2^31 - 1 entries in all");
    }
    template <class I>
    void push_checked(std::span<const I> list) {
        constexpr const char* fn = "CacheRows::push";
        check_total(static_cast<std::int64_t>(list.size()), fn);
        for (std::size_t i = 0; i < list.size(); ++i) {
            const std::int64_t r = list[i];
            detail::require(r >= std::numeric_limits<index_type>::min() && r <= std::numeric_limits<index_type>::max(),
                            fn, "list ", lists(), " holds row ", r, " at entry ", i,
                            ", which does not fit in int32; expected a row of one sequence's cache (below 2^31)");
        }
        indices_.insert(indices_.end(), list.begin(), list.end());
        indptr_.push_back(static_cast<index_type>(indices_.size()));
    }

    std::vector<index_type> indptr_{0};
    std::vector<index_type> indices_;
};

namespace detail {

// Throws unless `rows` is well formed for one sequence's cache of Hkv KV heads, KV head g holding
// rows_of(g) rows: 1 or Hkv lists, each non-empty, sorted ascending without duplicates, every row
// inside its KV head. The one check of every backend (reference, CPU, CUDA host side).
template <class RowsOf>
void check_cache_rows(const CacheRows& rows, std::int64_t Hkv, const RowsOf& rows_of, const char* fn) {
    const std::int64_t n = rows.lists();
    require(n == 1 || n == Hkv, fn, "rows has ", n, " lists, expected 1 (shared) or ", Hkv, " (one per KV head)");
    for (std::int64_t g = 0; g < Hkv; ++g) {
        const std::int64_t li = n == 1 ? 0 : g;
        if (n == 1 && g > 0) {  // the shared list, already checked against KV head 0: its rows past m
            const auto l = rows.list(0);
            const std::int64_t m = rows_of(g);
            const auto i = static_cast<std::size_t>(std::lower_bound(l.begin(), l.end(), m) - l.begin());
            if (i < l.size())
                require(false, fn, "row list 0 holds row ", l[i], " at entry ", i, ", expected a row in [0, ", m,
                        ") of KV head ", g);
            continue;
        }
        const auto l = rows.list(li);
        const std::int64_t m = rows_of(g);
        require(!l.empty(), fn, "row list ", li, " is empty; expected at least one row (the new token's)");
        for (std::size_t i = 0; i < l.size(); ++i) {
            require(l[i] >= 0 && l[i] < m, fn, "row list ", li, " holds row ", l[i], " at entry ", i,
                    ", expected a row in [0, ", m, ") of KV head ", g);
            require(i == 0 || l[i] > l[i - 1], fn, "row list ", li,
                    " is not sorted ascending without duplicates at entry ", i);
        }
    }
}

// Same, for the library's owning cache.
template <class TC>
void check_cache_rows(const KvCache<TC>& cache, const CacheRows& rows, const char* fn) {
    check_cache_rows(rows, cache.n_kv_heads(), [&](std::int64_t g) { return cache.rows(g); }, fn);
}

// KV head g of one sequence as the single-sequence decode engines read it (reference and CPU path):
// head `head` of a batch-of-one view. An engine's own cache is one view for every head; the owning
// KvCache gives each KV head a view of its own buffer (kv_head_view).
template <class TC>
struct DecodeHead {
    using element_type = TC;
    KvBatchView<const TC> cache;
    std::int64_t head = 0;
};

// KV head g of a KvCache as a batch-of-one view with one KV head: rows(g) contiguous rows of d
// elements (seq_lens null: the engines take the row count from the KvCache).
template <class TC>
KvBatchView<const TC> kv_head_view(const KvCache<TC>& cache, std::int64_t g) {
    const std::int64_t m = cache.rows(g), d = cache.head_dim();
    return {cache.k(g).data, cache.v(g).data, 1, 1, static_cast<std::int32_t>(d), std::max<std::int64_t>(m, 1), m * d,
            d, d, 0, nullptr, 0, nullptr};
}

template <class TC>
std::vector<DecodeHead<TC>> decode_heads(const KvCache<TC>& cache) {
    std::vector<DecodeHead<TC>> h(static_cast<std::size_t>(cache.n_kv_heads()));
    for (std::int64_t g = 0; g < cache.n_kv_heads(); ++g) h[static_cast<std::size_t>(g)] = {kv_head_view(cache, g), 0};
    return h;
}

template <class TC>
std::vector<DecodeHead<TC>> decode_heads(const KvBatchView<const TC>& cache) {
    std::vector<DecodeHead<TC>> h(static_cast<std::size_t>(std::max<std::int32_t>(cache.n_kv_heads, 0)));
    for (std::size_t g = 0; g < h.size(); ++g) h[g] = {cache, static_cast<std::int64_t>(g)};
    return h;
}

// The checks of an engine's own cache for a single-sequence decode step of H query heads writing out:
// a batch of one (the length read from cache.seq_lens[0], HOST memory), its layout and block table
// (check_kv_batch, check_batch_contents), out aliasing neither K nor V. Returns the sequence's length.
template <class TC, class TO>
std::int64_t check_sequence_cache(const KvBatchView<const TC>& cache, std::int64_t H, const TensorView<TO, 2>& out,
                                  const char* fn) {
    require(cache.batch == 1, fn, "the cache view holds ", cache.batch,
            " sequences; expected 1 (batched_decode_attention takes batches)");
    require(cache.seq_lens != nullptr, fn, "the cache view has a null seq_lens pointer");
    const std::int32_t len = cache.seq_lens[0];
    const DecodeBatchHost meta{std::span<const std::int32_t>(&len, 1), {}, {}, 1};
    check_kv_batch(cache, meta, H, fn);
    check_batch_contents(cache, BatchRowLists{}, meta, fn);
    const std::int64_t extent = kv_batch_extent(cache);
    check_no_alias(out, TensorView<const TC, 1>(cache.k, {extent}), fn, "out", "cache k");
    check_no_alias(out, TensorView<const TC, 1>(cache.v, {extent}), fn, "out", "cache v");
    return len;
}

// The checks of a single-sequence decode step's q [H, d] and out [H, d] against a cache of Hkv KV
// heads of head_dim d (reference and CPU path).
template <class TQ, class TO>
void check_decode_shapes(const TensorView<const TQ, 2>& q, std::int64_t Hkv, std::int64_t head_dim,
                         const TensorView<TO, 2>& out, const char* fn) {
    check_strides(q, fn, "q", false);
    check_strides(out, fn, "out", true);
    const std::int64_t H = q.shape[0], d = q.shape[1];
    require(Hkv > 0, fn, "the cache has no KV heads (default-constructed); expected H_kv > 0");
    require(H > 0 && d == head_dim, fn, "q has shape [", H, ", ", d, "], expected [H, ", head_dim, "] with H > 0");
    require(H % Hkv == 0, fn, "H = ", H, " query heads is not a multiple of the cache's H_kv = ", Hkv);
    require(out.shape == q.shape, fn, "out has shape [", out.shape[0], ", ", out.shape[1], "], expected [", H, ", ",
            d, "]");
    require(!overlaps(out, q), fn, "output out aliases input q; expected separate buffers");
}

// Every check of an indexed decode step that reads no values, over the owning cache: the shapes and
// the row lists. The reference's and the CPU path's one check (the CPU path adds opt.check_finite).
template <class TQ, class TC, class TO>
void check_indexed_decode(const TensorView<const TQ, 2>& q, const KvCache<TC>& cache, const CacheRows& rows,
                          const TensorView<TO, 2>& out, const char* fn) {
    check_decode_shapes(q, cache.n_kv_heads(), cache.head_dim(), out, fn);
    check_cache_rows(cache, rows, fn);
}

// Same, over an engine's own cache (a batch-of-one view, check_sequence_cache).
template <class TQ, class TC, class TO>
void check_indexed_decode(const TensorView<const TQ, 2>& q, const KvBatchView<const TC>& cache, const CacheRows& rows,
                          const TensorView<TO, 2>& out, const char* fn) {
    check_decode_shapes(q, cache.n_kv_heads, cache.head_dim, out, fn);
    const std::int64_t len = check_sequence_cache(cache, q.shape[0], out, fn);
    check_cache_rows(rows, cache.n_kv_heads, [len](std::int64_t) { return len; }, fn);
}

}  // namespace detail

// The cache rows holding the positions listed in sel (shared or per KV head), one list per KV head.
// Throws if a position is not in the cache (evicted, or never appended).
template <ElementType TC>
CacheRows rows_for_positions(const KvCache<TC>& cache, const TokenSelection& sel) {
    constexpr const char* fn = "rows_for_positions";
    const std::int64_t Hkv = cache.n_kv_heads();
    detail::require(sel.shared() || static_cast<std::int64_t>(sel.groups()) == Hkv, fn, "selection has ",
                    sel.groups(), " lists, expected 1 or ", Hkv);
    CacheRows out;
    std::vector<std::int64_t> r;
    for (std::int64_t g = 0; g < Hkv; ++g) {
        const auto pos = cache.positions(g);
        const auto want = sel.for_kv_head(g);
        r.clear();
        r.reserve(want.size());
        for (std::size_t i = 0; i < want.size(); ++i) {
            detail::require(i == 0 || want[i] > want[i - 1], fn, "position list for KV head ", g,
                            " is not sorted ascending without duplicates at entry ", i);
            const auto it = std::lower_bound(pos.begin(), pos.end(), want[i]);
            detail::require(it != pos.end() && *it == want[i], fn, "position ", want[i], " is not in KV head ", g,
                            " of the cache (evicted, or beyond seq_len ", cache.seq_len(), ")");
            r.push_back(static_cast<std::int64_t>(it - pos.begin()));
        }
        out.push(r);
    }
    return out;
}

// Same, for one position list shared by every KV head.
template <ElementType TC>
CacheRows rows_for_positions(const KvCache<TC>& cache, std::span<const std::int64_t> positions) {
    TokenSelection s;
    s.n = cache.seq_len();
    s.indices.emplace_back(positions.begin(), positions.end());
    return rows_for_positions(cache, s);
}

}  // namespace vlsparse
