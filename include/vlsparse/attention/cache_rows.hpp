// vlsparse/attention/cache_rows.hpp -- index lists of KV-cache rows for indexed decode attention.
//
// An indexed decode step reads, for KV head g, only the cache rows listed in rows[g] (or rows[0] when
// one list is shared by every KV head). Lists hold ROW numbers of the KvCache (0 <= r < rows(g)),
// not token positions: a row is addressed in O(1), so a step costs nothing beyond the rows it reads.
// rows_for_positions() converts a position list (what policies produce: TokenSelection, A-VL's
// DecodeSchedule) into row lists, by binary search over the cache's positions, and rejects any
// position the cache does not hold. Lists are sorted ascending without duplicates and non-empty.
// Shared by vlsparse::reference and vlsparse::simd. Include: <vlsparse/vlsparse.hpp>
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "vlsparse/core/error.hpp"
#include "vlsparse/core/selection.hpp"
#include "vlsparse/kv/kv_cache.hpp"

namespace vlsparse {

// Row lists of one layer's cache: [1] (shared by every KV head) or [n_kv_heads].
using CacheRows = std::vector<std::vector<std::int64_t>>;

namespace detail {

// Throws unless `rows` is well formed for `cache`: 1 or H_kv lists, each non-empty, sorted ascending
// without duplicates, every row inside its KV head.
template <class TC>
void check_cache_rows(const KvCache<TC>& cache, const CacheRows& rows, const char* fn) {
    const std::int64_t Hkv = cache.n_kv_heads();
    require(rows.size() == 1 || static_cast<std::int64_t>(rows.size()) == Hkv, fn, "rows has ", rows.size(),
            " lists, expected 1 (shared) or ", Hkv, " (one per KV head)");
    for (std::int64_t g = 0; g < Hkv; ++g) {
        const std::size_t li = rows.size() == 1 ? 0 : static_cast<std::size_t>(g);
        const auto& l = rows[li];
        const std::int64_t m = cache.rows(g);
        require(!l.empty(), fn, "row list ", li, " is empty; expected at least one row (the new token's)");
        for (std::size_t i = 0; i < l.size(); ++i) {
            require(l[i] >= 0 && l[i] < m, fn, "row list ", li, " holds row ", l[i], " at entry ", i,
                    ", expected a row in [0, ", m, ") of KV head ", g);
            require(i == 0 || l[i] > l[i - 1], fn, "row list ", li,
                    " is not sorted ascending without duplicates at entry ", i);
        }
    }
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
    CacheRows out(static_cast<std::size_t>(Hkv));
    for (std::int64_t g = 0; g < Hkv; ++g) {
        const auto pos = cache.positions(g);
        const auto want = sel.for_kv_head(g);
        auto& r = out[static_cast<std::size_t>(g)];
        r.reserve(want.size());
        for (std::size_t i = 0; i < want.size(); ++i) {
            detail::require(i == 0 || want[i] > want[i - 1], fn, "position list for KV head ", g,
                            " is not sorted ascending without duplicates at entry ", i);
            const auto it = std::lower_bound(pos.begin(), pos.end(), want[i]);
            detail::require(it != pos.end() && *it == want[i], fn, "position ", want[i], " is not in KV head ", g,
                            " of the cache (evicted, or beyond seq_len ", cache.seq_len(), ")");
            r.push_back(static_cast<std::int64_t>(it - pos.begin()));
        }
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
