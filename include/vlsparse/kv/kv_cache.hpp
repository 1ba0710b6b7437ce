// vlsparse/kv/kv_cache.hpp -- one layer's KV cache: per KV head, contiguous rows plus their positions.
//
// Rows are stored in T (float, half or bfloat16), [rows, head_dim] per KV head, in ascending
// position order. Eviction (`keep`) compacts in place and never renumbers positions: decode after
// eviction continues from the original sequence length. A model holds one KvCache per layer.
// Include: <vlsparse/vlsparse.hpp>
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "vlsparse/core/dtype.hpp"
#include "vlsparse/core/error.hpp"
#include "vlsparse/core/selection.hpp"
#include "vlsparse/core/tensor.hpp"
#include "vlsparse/detail/check.hpp"
#include "vlsparse/detail/large_page_allocator.hpp"

namespace vlsparse {

template <ElementType T = float>
class KvCache {
public:
    using element_type = T;

    KvCache() = default;
    KvCache(std::int64_t n_kv_heads, std::int64_t head_dim)
        : n_kv_heads_(n_kv_heads), head_dim_(head_dim), heads_(static_cast<std::size_t>(n_kv_heads)) {
        detail::require(n_kv_heads > 0, "KvCache", "n_kv_heads = ", n_kv_heads, ", expected > 0");
        detail::require(head_dim > 0, "KvCache", "head_dim = ", head_dim, ", expected > 0");
    }

    std::int64_t n_kv_heads() const { return n_kv_heads_; }
    std::int64_t head_dim() const { return head_dim_; }
    // Number of tokens the sequence has seen (prefill length + appended tokens), evicted ones included.
    std::int64_t seq_len() const { return seq_len_; }
    // Rows currently held by KV head g.
    std::int64_t rows(std::int64_t g) const { return static_cast<std::int64_t>(head(g).pos.size()); }

    // [rows, head_dim] views of KV head g.
    View2<const T> k(std::int64_t g) const { return {head(g).k.data(), {rows(g), head_dim_}}; }
    View2<const T> v(std::int64_t g) const { return {head(g).v.data(), {rows(g), head_dim_}}; }
    std::span<const std::int64_t> positions(std::int64_t g) const { return head(g).pos; }

    // Bytes held by K and V rows (positions not counted).
    std::int64_t kv_bytes() const {
        std::int64_t r = 0;
        for (std::int64_t g = 0; g < n_kv_heads_; ++g) r += rows(g);
        return r * head_dim_ * 2 * static_cast<std::int64_t>(sizeof(T));
    }
    // Bytes of the position arrays (int64 per row and head).
    std::int64_t position_bytes() const {
        std::int64_t r = 0;
        for (std::int64_t g = 0; g < n_kv_heads_; ++g) r += rows(g);
        return r * static_cast<std::int64_t>(sizeof(std::int64_t));
    }

    // Replace the contents with a prefill's K, V [n, n_kv_heads, head_dim]; positions 0..n-1.
    template <ElementType TI>
    void assign(View3<const TI> k, View3<const TI> v) {
        constexpr const char* fn = "KvCache::assign";
        check_kv(k, v, fn);
        check_fits(k, fn, "k");
        check_fits(v, fn, "v");
        const std::int64_t n = k.shape[0];
        for (std::int64_t g = 0; g < n_kv_heads_; ++g) {
            auto& h = heads_[static_cast<std::size_t>(g)];
            h.k.resize(static_cast<std::size_t>(n * head_dim_));
            h.v.resize(static_cast<std::size_t>(n * head_dim_));
            h.pos.resize(static_cast<std::size_t>(n));
            for (std::int64_t i = 0; i < n; ++i) {
                copy_row(k.row(i, g), k.stride[2], &h.k[static_cast<std::size_t>(i * head_dim_)]);
                copy_row(v.row(i, g), v.stride[2], &h.v[static_cast<std::size_t>(i * head_dim_)]);
                h.pos[static_cast<std::size_t>(i)] = i;
            }
        }
        seq_len_ = n;
    }

    // Replace the contents with K, V [m, n_kv_heads, head_dim] of the tokens at `positions` (m entries,
    // ascending, unique, each in [0, seq_len)); the sequence has seen seq_len tokens, so decode appends
    // at position seq_len. For layers after a sequence filter (FastV, A-VL's prefill filter): they hold
    // only the tokens still in the sequence, under their original positions.
    template <ElementType TI>
    void assign(View3<const TI> k, View3<const TI> v, std::span<const std::int64_t> positions, std::int64_t seq_len) {
        constexpr const char* fn = "KvCache::assign";
        check_kv(k, v, fn);
        const std::int64_t m = k.shape[0];
        detail::require(static_cast<std::int64_t>(positions.size()) == m, fn, "positions has ", positions.size(),
                        " entries and k has ", m, " rows, expected equal");
        for (std::size_t i = 0; i < positions.size(); ++i) {
            detail::require(positions[i] >= 0 && positions[i] < seq_len, fn, "positions[", i, "] = ", positions[i],
                            ", expected a position in [0, seq_len = ", seq_len, ")");
            if (i == 0) continue;  // the message reads positions[i - 1]: only from i = 1
            detail::require(positions[i] > positions[i - 1], fn, "positions[", i, "] = ", positions[i],
                            " is not above positions[", i - 1, "] = ", positions[i - 1],
                            "; expected ascending positions without duplicates");
        }
        assign(k, v);
        for (auto& h : heads_) std::copy(positions.begin(), positions.end(), h.pos.begin());
        seq_len_ = seq_len;
    }

    // Append one token's K, V [n_kv_heads, head_dim] at position seq_len() to every KV head.
    template <ElementType TI>
    void append(View2<const TI> k, View2<const TI> v) {
        constexpr const char* fn = "KvCache::append";
        detail::require(k.shape[0] == n_kv_heads_ && k.shape[1] == head_dim_, fn, "k has shape [", k.shape[0], ", ",
                        k.shape[1], "], expected [", n_kv_heads_, ", ", head_dim_, "]");
        detail::require(v.shape == k.shape, fn, "v has shape [", v.shape[0], ", ", v.shape[1], "], expected [",
                        n_kv_heads_, ", ", head_dim_, "]");
        for (const auto& [x, name] : {std::pair{k, "k"}, std::pair{v, "v"}})
            for (std::int64_t g = 0; g < n_kv_heads_; ++g)
                if (const auto c = detail::first_narrowing_overflow<T>(x.row(g), x.stride[1], head_dim_); c >= 0)
                    throw error(fn, detail::concat(name, "[", g, ", ", c, "] = ", to_float(x(g, c)), does_not_fit()));
        for (std::int64_t g = 0; g < n_kv_heads_; ++g) {
            auto& h = heads_[static_cast<std::size_t>(g)];
            const auto off = h.k.size();
            h.k.resize(off + static_cast<std::size_t>(head_dim_));
            h.v.resize(off + static_cast<std::size_t>(head_dim_));
            copy_row(k.row(g), k.stride[1], &h.k[off]);
            copy_row(v.row(g), v.stride[1], &h.v[off]);
            h.pos.push_back(seq_len_);
        }
        ++seq_len_;
    }

    // Keep only the listed positions (per KV head or shared) and compact in place, in position order.
    // Every listed position must be present in the cache. On error the cache is left unchanged.
    void keep(const TokenSelection& sel) {
        constexpr const char* fn = "KvCache::keep";
        detail::require(sel.shared() || static_cast<std::int64_t>(sel.groups()) == n_kv_heads_, fn, "selection has ",
                        sel.groups(), " lists, expected 1 or ", n_kv_heads_);
        for (std::int64_t g = 0; g < n_kv_heads_; ++g) check_keep(g, sel.for_kv_head(g));  // all heads first
        for (std::int64_t g = 0; g < n_kv_heads_; ++g) keep_positions(g, sel.for_kv_head(g));
    }

    // Keep the listed positions (sorted ascending, unique, present) in KV head g. On error the
    // cache is left unchanged.
    void keep_positions(std::int64_t g, std::span<const std::int64_t> keep_pos) {
        check_keep(g, keep_pos);
        auto& h = heads_[static_cast<std::size_t>(g)];
        std::size_t dst = 0, src = 0;
        for (std::size_t i = 0; i < keep_pos.size(); ++i) {
            while (h.pos[src] < keep_pos[i]) ++src;  // present: check_keep found it
            if (dst != src) {
                std::copy_n(&h.k[src * head_dim_], head_dim_, &h.k[dst * head_dim_]);
                std::copy_n(&h.v[src * head_dim_], head_dim_, &h.v[dst * head_dim_]);
                h.pos[dst] = h.pos[src];
            }
            ++dst;
            ++src;
        }
        h.pos.resize(dst);
        h.k.resize(dst * static_cast<std::size_t>(head_dim_));
        h.v.resize(dst * static_cast<std::size_t>(head_dim_));
    }

private:
    // Throws unless keep_pos is sorted ascending without duplicates and every entry is in KV head g.
    void check_keep(std::int64_t g, std::span<const std::int64_t> keep_pos) const {
        constexpr const char* fn = "KvCache::keep";
        detail::require(g >= 0 && g < n_kv_heads_, fn, "KV head ", g, ", expected 0 <= g < ", n_kv_heads_);
        const auto& h = heads_[static_cast<std::size_t>(g)];
        std::size_t src = 0;
        for (std::size_t i = 0; i < keep_pos.size(); ++i) {
            detail::require(i == 0 || keep_pos[i] > keep_pos[i - 1], fn, "position list for KV head ", g,
                            " is not sorted ascending without duplicates at entry ", i);
            while (src < h.pos.size() && h.pos[src] < keep_pos[i]) ++src;
            detail::require(src < h.pos.size() && h.pos[src] == keep_pos[i], fn, "position ", keep_pos[i],
                            " is not in KV head ", g, " of the cache (evicted earlier, or beyond seq_len ", seq_len_,
                            ")");
            ++src;
        }
    }

    struct Head {
        std::vector<T, detail::LargePageAllocator<T>> k, v;  // 2 MiB-aligned, huge pages advised (Linux)
        std::vector<std::int64_t> pos;
    };
    const Head& head(std::int64_t g) const {
        detail::require(g >= 0 && g < n_kv_heads_, "KvCache", "KV head ", g, ", expected 0 <= g < ", n_kv_heads_);
        return heads_[static_cast<std::size_t>(g)];
    }
    template <class TI>
    void copy_row(const TI* src, std::int64_t stride, T* dst) const {
        for (std::int64_t c = 0; c < head_dim_; ++c) dst[c] = from_float<T>(to_float(src[c * stride]));
    }
    // A finite input value that T cannot hold (beyond fp16's 65504) would be stored as inf: an error,
    // raised before anything changes. Values already inf or NaN are stored as they are.
    template <class TI>
    void check_fits(View3<const TI> x, const char* fn, const char* name) const {
        for (std::int64_t i = 0; i < x.shape[0]; ++i)
            for (std::int64_t g = 0; g < x.shape[1]; ++g)
                if (const auto c = detail::first_narrowing_overflow<T>(x.row(i, g), x.stride[2], x.shape[2]); c >= 0)
                    throw error(fn, detail::concat(name, "[", i, ", ", g, ", ", c, "] = ", to_float(x(i, g, c)),
                                                   does_not_fit()));
    }
    static std::string does_not_fit() {
        return detail::concat(" does not fit ", dtype_name(dtype_of<T>()), " (largest finite value ",
                              detail::largest_finite<T>(), "); expected values the cache's element type holds");
    }
    template <class TI>
    void check_kv(View3<const TI> k, View3<const TI> v, const char* fn) const {
        detail::check_strides(k, fn, "k", false);
        detail::check_strides(v, fn, "v", false);
        detail::require(k.shape[1] == n_kv_heads_ && k.shape[2] == head_dim_, fn, "k has shape [", k.shape[0], ", ",
                        k.shape[1], ", ", k.shape[2], "], expected [n, ", n_kv_heads_, ", ", head_dim_, "]");
        detail::require(v.shape == k.shape, fn, "v has shape [", v.shape[0], ", ", v.shape[1], ", ", v.shape[2],
                        "], expected the shape of k");
    }

    std::int64_t n_kv_heads_ = 0, head_dim_ = 0, seq_len_ = 0;
    std::vector<Head> heads_;
};

}  // namespace vlsparse
