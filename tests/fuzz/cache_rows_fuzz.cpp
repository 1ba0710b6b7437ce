// Fuzz target: the row and position lists that address a KV cache: CacheRows validation
// (detail::check_cache_rows, through reference::indexed_decode_attention), rows_for_positions and
// KvCache::keep (attention/cache_rows.hpp, kv/kv_cache.hpp). The bytes build a small cache (KV
// heads, head_dim, prompt length, an optional eviction, appended tokens) and the lists.
// Beyond "no crash": each function accepts exactly the lists the documented rules allow (checked by
// an independent plain implementation of the rules), indexed decode over accepted rows stays inside
// the cache (ASan) and gives finite outputs, rows_for_positions maps every position to the row that
// holds it, and keep leaves exactly the listed positions.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "fuzz_util.hpp"
#include "vlsparse/attention/cache_rows.hpp"
#include "vlsparse/kv/kv_cache.hpp"
#include "vlsparse/reference/indexed_decode.hpp"

using vlsparse::CacheRows;
using vlsparse::KvCache;
using vlsparse::TokenSelection;

namespace {

std::vector<std::vector<std::int64_t>> lists(fuzz::Bytes& in) {
    std::vector<std::vector<std::int64_t>> out(in.u8() % 6);
    for (auto& l : out) {
        l.resize(in.u8() % 12);
        // Mostly ascending (a running sum of small steps), sometimes anything.
        std::int64_t x = in.num() % 8;
        for (auto& e : l) {
            const std::uint8_t how = in.u8();
            x = how >= 200 ? in.num() : x < (std::int64_t{1} << 62) ? x + how % 4 : x;
            e = x;
        }
    }
    return out;
}

// The rules, written out plainly: 1 or Hkv lists; each sorted ascending, unique, inside `ok`.
template <class InRange>
bool lists_valid(const std::vector<std::vector<std::int64_t>>& v, std::int64_t Hkv, bool non_empty, InRange&& ok) {
    if (!(v.size() == 1 || static_cast<std::int64_t>(v.size()) == Hkv)) return false;
    for (std::int64_t g = 0; g < Hkv; ++g) {
        const auto& l = v.size() == 1 ? v[0] : v[static_cast<std::size_t>(g)];
        if (non_empty && l.empty()) return false;
        for (std::size_t i = 0; i < l.size(); ++i)
            if (!ok(g, l[i]) || (i > 0 && l[i] <= l[i - 1])) return false;
    }
    return true;
}

bool holds(const KvCache<float>& c, std::int64_t g, std::int64_t pos) {
    const auto p = c.positions(g);
    return std::binary_search(p.begin(), p.end(), pos);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    fuzz::Bytes in(data, size);
    const std::int64_t Hkv = 1 + in.u8() % 4, d = 1 + in.u8() % 4, n = in.u8() % 48;
    KvCache<float> cache(Hkv, d);
    if (n > 0) {
        std::vector<float> kv(static_cast<std::size_t>(n * Hkv * d));
        for (std::size_t i = 0; i < kv.size(); ++i) kv[i] = static_cast<float>((i * 37) % 17) / 8.0f - 1.0f;
        const vlsparse::View3<const float> k(kv.data(), {n, Hkv, d});
        cache.assign(k, k);
    }

    // KvCache::keep: accepted exactly when the lists are valid and every position is present.
    TokenSelection keep;
    keep.n = cache.seq_len();
    keep.indices = lists(in);
    const bool keep_ok =
        lists_valid(keep.indices, Hkv, false, [&](std::int64_t g, std::int64_t p) { return holds(cache, g, p); });
    try {
        cache.keep(keep);
        FUZZ_CHECK(keep_ok, "KvCache::keep accepted invalid lists");
        for (std::int64_t g = 0; g < Hkv; ++g) {
            const auto want = keep.for_kv_head(g);
            const auto got = cache.positions(g);
            FUZZ_CHECK(std::equal(want.begin(), want.end(), got.begin(), got.end()), "after keep, KV head ", g,
                       " holds other positions");
            FUZZ_CHECK(cache.k(g).shape[0] == cache.rows(g) && cache.v(g).shape[0] == cache.rows(g), "rows mismatch");
        }
    } catch (const vlsparse::error& e) {
        fuzz::check_message(e);
        FUZZ_CHECK(!keep_ok, "KvCache::keep refused valid lists: ", e.what());
    }
    // Appended tokens.
    for (int a = in.u8() % 3; a > 0; --a) {
        std::vector<float> row(static_cast<std::size_t>(Hkv * d), 0.25f);
        const vlsparse::View2<const float> r(row.data(), {Hkv, d});
        cache.append(r, r);
    }

    // rows_for_positions: accepted exactly when every position is present (lists ascending).
    TokenSelection sel;
    sel.n = cache.seq_len();
    sel.indices = lists(in);
    const bool sel_ok =
        lists_valid(sel.indices, Hkv, false, [&](std::int64_t g, std::int64_t p) { return holds(cache, g, p); });
    try {
        const CacheRows rows = vlsparse::rows_for_positions(cache, sel);
        FUZZ_CHECK(sel_ok, "rows_for_positions accepted invalid positions");
        FUZZ_CHECK(rows.lists() == Hkv, "rows_for_positions gave ", rows.lists(), " lists");
        for (std::int64_t g = 0; g < Hkv; ++g) {
            const auto want = sel.for_kv_head(g);
            const auto r = rows.list(g);
            FUZZ_CHECK(r.size() == want.size(), "rows_for_positions: list ", g, " has ", r.size(), " rows");
            for (std::size_t i = 0; i < r.size(); ++i)
                FUZZ_CHECK(cache.positions(g)[static_cast<std::size_t>(r[i])] == want[i], "row ", r[i],
                           " does not hold position ", want[i]);
        }
    } catch (const vlsparse::error& e) {
        fuzz::check_message(e);
        FUZZ_CHECK(!sel_ok, "rows_for_positions refused valid positions: ", e.what());
    }

    // CacheRows through indexed decode: accepted exactly when the rows are valid (entries beyond
    // int32 are refused when the CacheRows is built).
    const auto raw = lists(in);
    const std::int64_t H = Hkv * (1 + in.u8() % 2);
    const bool rows_ok = lists_valid(raw, Hkv, true, [&](std::int64_t g, std::int64_t r) { return r >= 0 && r < cache.rows(g); });
    std::vector<float> q(static_cast<std::size_t>(H * d), 0.5f), out(static_cast<std::size_t>(H * d), -7.0f);
    try {
        const CacheRows rows(raw);
        vlsparse::reference::indexed_decode_attention(vlsparse::View2<const float>(q.data(), {H, d}), cache, rows,
                                                      vlsparse::View2<float>(out.data(), {H, d}));
        FUZZ_CHECK(rows_ok, "indexed_decode_attention accepted invalid rows");
        for (float x : out) FUZZ_CHECK(std::isfinite(x) && std::fabs(x) <= 1.0f + 1e-5f, "output ", x, " out of range");
    } catch (const vlsparse::error& e) {
        fuzz::check_message(e);
        FUZZ_CHECK(!rows_ok, "indexed_decode_attention refused valid rows: ", e.what());
    }
    return 0;
}
