// vlsparse/core/selection.hpp -- TokenSelection: the kept token positions of one layer.
//
// Either one sorted position list shared by every KV head (`indices.size() == 1`), or one list per
// KV head (`indices.size() == n_kv_heads`). Lists are sorted ascending without duplicates and refer to
// absolute token positions. `scores` optionally carries the per-group scores that produced the lists.
// Every policy (ZipVL, PureKV, A-VL, the baselines) returns this type.
// Include: <vlsparse/vlsparse.hpp>
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "vlsparse/core/error.hpp"

namespace vlsparse {

struct TokenSelection {
    std::int64_t n = 0;                                // length of the sequence the lists select from
    std::vector<std::vector<std::int64_t>> indices;    // [1] or [n_kv_heads] sorted position lists
    std::vector<std::vector<double>> scores;           // optional: the scores per group, each of length n

    bool shared() const { return indices.size() == 1; }
    std::size_t groups() const { return indices.size(); }

    // The list that KV head `g` keeps (the shared list when there is one).
    std::span<const std::int64_t> for_kv_head(std::int64_t g) const {
        return shared() ? std::span<const std::int64_t>(indices[0])
                        : std::span<const std::int64_t>(indices.at(static_cast<std::size_t>(g)));
    }

    // Mean over groups of |kept| / n.
    double kept_ratio() const {
        if (n == 0 || indices.empty()) return 0.0;
        double s = 0.0;
        for (const auto& l : indices) s += static_cast<double>(l.size());
        return s / (static_cast<double>(indices.size()) * static_cast<double>(n));
    }

    // Every position of [0, n), shared.
    static TokenSelection all(std::int64_t n) {
        TokenSelection s;
        s.n = n;
        s.indices.resize(1);
        s.indices[0].resize(static_cast<std::size_t>(n));
        for (std::int64_t i = 0; i < n; ++i) s.indices[0][static_cast<std::size_t>(i)] = i;
        return s;
    }

    // Throws unless the lists are well formed for `n_kv_heads` KV heads.
    void validate(std::int64_t n_kv_heads, const char* fn) const {
        detail::require(indices.size() == 1 || static_cast<std::int64_t>(indices.size()) == n_kv_heads, fn,
                        "selection has ", indices.size(), " lists, expected 1 (shared) or ", n_kv_heads,
                        " (one per KV head)");
        for (std::size_t g = 0; g < indices.size(); ++g) {
            const auto& l = indices[g];
            for (std::size_t i = 0; i < l.size(); ++i) {
                detail::require(l[i] >= 0 && l[i] < n, fn, "selection list ", g, " holds position ", l[i],
                                ", expected a position in [0, ", n, ")");
                detail::require(i == 0 || l[i] > l[i - 1], fn, "selection list ", g,
                                " is not sorted ascending without duplicates at entry ", i);
            }
        }
    }
};

}  // namespace vlsparse
