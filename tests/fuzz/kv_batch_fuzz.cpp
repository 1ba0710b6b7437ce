// Fuzz target: the description of a batch of KV caches and its row lists (kv/kv_batch.hpp):
// check_kv_batch / check_decode_meta, kv_batch_extent, check_batch_contents and BatchRowLists, through
// reference::batched_decode_attention, and the block-table, length and keep-list checks of the two
// cache updates, reference::kv_batch_append and reference::kv_batch_compact. The bytes build the batch:
// contiguous, paged NHD / HND, or raw (hostile) sizes and strides; lengths, block table, query and
// list indptr arrays, list entries, appended rows, keep lists.
// Beyond "no crash" (ASan, UBSan: the checks' own arithmetic must not overflow either):
//   - an accepted layout's (page, row, head) spans of d elements are pairwise disjoint and inside
//     kv_batch_extent(); every row a decode step reads, through the block table, lies inside it;
//   - accepted contents obey the documented rules (lists sorted, unique, within the sequence, every
//     new token sees a listed row; block-table entries in the pool), and decode over them gives finite
//     outputs within the range of V; where the whole pool is small it runs on buffers of exactly
//     kv_batch_extent() elements, so a read outside is an ASan report;
//   - an accepted append leaves every old row as it was and writes the new rows; an accepted compaction
//     moves row keep[i] to row i, leaves other sequences alone and releases exactly the documented
//     block-table slots.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "fuzz_util.hpp"
#include "vlsparse/kv/kv_batch.hpp"
#include "vlsparse/reference/batched_decode.hpp"
#include "vlsparse/reference/kv_batch.hpp"

using vlsparse::BatchRowLists;
using vlsparse::DecodeBatchHost;
using vlsparse::KvBatchView;
using i128 = __int128;

namespace {

constexpr std::int64_t kMaxPool = 1 << 16;  // elements of K (and of V) the target allocates at most
constexpr std::int64_t kMaxArray = 4096;    // entries of a block table / list array it builds at most
const std::int32_t kDummyEntry = 0;  // a non-null block table the metadata checks never read

struct Batch {
    std::int32_t B = 1, Hkv = 1, d = 1;
    std::int64_t H = 1;
    bool paged = false;
    std::int64_t page_size = 1, page_stride = 0, row_stride = 0, head_stride = 0, n_pages = 0, bts = 0;
    std::vector<std::int32_t> seq_lens, block_table, q_indptr, list_indptr, indices;
    std::int32_t lps = 1;
    bool dense = true;
    bool table_built = false, lists_built = false;
    // Elements of K the harness computes the pool to span (exact, no overflow); nullopt when a size
    // is not positive or a stride negative (the library must refuse those anyway).
    std::optional<i128> extent() const {
        const i128 pages = paged ? n_pages : B;
        if (pages < 1 || page_size < 1 || Hkv < 1 || d < 1 || page_stride < 0 || row_stride < 0 || head_stride < 0)
            return std::nullopt;
        return (pages - 1) * i128(page_stride) + (page_size - 1) * i128(row_stride) + (Hkv - 1) * i128(head_stride) + d;
    }
    i128 offset(std::int64_t b, std::int64_t r, std::int64_t g) const {
        const i128 page = paged ? block_table[static_cast<std::size_t>(b * bts + r / page_size)] : b;
        return page * page_stride + i128(r % page_size) * row_stride + i128(g) * head_stride;
    }
    i128 capacity() const { return paged ? i128(bts) * page_size : i128(page_size); }
};

std::int32_t small_or_any(fuzz::Bytes& in, std::int64_t mod) {
    const std::uint8_t tag = in.u8();
    if (tag < 232) return static_cast<std::int32_t>(in.u8() % std::max<std::int64_t>(mod, 1));
    return in.num32();
}

Batch build(fuzz::Bytes& in) {
    Batch x;
    x.B = 1 + in.u8() % 4;
    const std::uint8_t lay = in.u8();
    x.paged = lay & 1;
    const int style = (lay >> 1) % 4;  // 0, 1: NHD (or contiguous), 2: HND (or contiguous), 3: raw
    if (style == 3) {
        x.Hkv = in.u8() < 240 ? 1 + in.u8() % 3 : in.num32();
        x.d = in.u8() < 240 ? 1 + in.u8() % 4 : in.num32();
        x.H = static_cast<std::int64_t>(x.Hkv) * (1 + in.u8() % 2);
        x.page_size = in.num();
        x.page_stride = in.num();
        x.row_stride = in.num();
        x.head_stride = in.num();
        if (x.paged) {
            x.n_pages = in.num();
            x.bts = in.num();
        }
    } else {
        x.Hkv = 1 + in.u8() % 3;
        x.d = 1 + in.u8() % 4;
        x.H = x.Hkv * (1 + in.u8() % 2);
        x.page_size = 1 + in.u8() % 8;
        const std::int64_t row = std::int64_t{x.Hkv} * x.d;
        if (x.paged) {
            x.n_pages = 1 + in.u8() % 12;
            x.bts = 1 + in.u8() % 6;
            if (style == 2) {  // HND
                x.page_stride = x.page_size * row, x.row_stride = x.d, x.head_stride = x.page_size * x.d;
            } else {
                x.page_stride = x.page_size * row, x.row_stride = row, x.head_stride = x.d;
            }
        } else {
            x.page_stride = x.page_size * row, x.row_stride = row, x.head_stride = x.d;
        }
    }
    const std::int64_t cap_small =
        std::clamp<std::int64_t>(x.paged ? std::clamp<std::int64_t>(x.bts, 0, 64) * std::clamp<std::int64_t>(x.page_size, 0, 64)
                                         : x.page_size, 0, 40);
    for (int b = 0; b < x.B; ++b) x.seq_lens.push_back(small_or_any(in, cap_small + 2));
    if (x.paged && x.bts >= 1 && x.bts <= kMaxArray / x.B) {
        const std::int64_t pages_small = std::clamp<std::int64_t>(x.n_pages, 1, 64);
        for (std::int64_t i = 0; i < x.bts * x.B; ++i) x.block_table.push_back(small_or_any(in, pages_small + 1));
        x.table_built = true;
    }
    if (in.u8() % 3 != 0) {
        x.q_indptr.push_back(in.u8() < 250 ? 0 : in.num32());
        for (int b = 0; b < x.B; ++b) {
            const std::uint8_t tag = in.u8();
            const std::int64_t step = tag < 232 ? 1 + tag % 4 : in.num32();
            x.q_indptr.push_back(static_cast<std::int32_t>(x.q_indptr.back() + step));
        }
    }
    const int lists = in.u8() % 3;
    x.dense = lists == 0;
    x.lps = lists == 2 ? (in.u8() < 240 ? x.Hkv : in.num32()) : 1;
    if (!x.dense && x.lps >= 1 && std::int64_t{x.lps} * x.B + 1 <= kMaxArray) {
        const std::int64_t n_lists = std::int64_t{x.lps} * x.B;
        x.list_indptr.push_back(in.u8() < 250 ? 0 : in.num32());
        for (std::int64_t l = 0; l < n_lists; ++l) {
            const std::uint8_t tag = in.u8();
            const std::int64_t step = tag < 232 ? 1 + tag % 6 : in.num32();
            x.list_indptr.push_back(static_cast<std::int32_t>(x.list_indptr.back() + step));
        }
        const std::int64_t total = x.list_indptr.back();
        if (x.list_indptr.front() == 0 && total >= 0 && total <= kMaxArray) {
            x.indices.resize(static_cast<std::size_t>(total));
            for (std::int64_t l = 0; l < n_lists; ++l) {
                const std::int64_t e0 = std::clamp<std::int64_t>(x.list_indptr[static_cast<std::size_t>(l)], 0, total);
                const std::int64_t e1 = std::clamp<std::int64_t>(x.list_indptr[static_cast<std::size_t>(l + 1)], 0, total);
                std::int64_t r = in.u8() % 4;
                for (std::int64_t e = e0; e < e1; ++e) {
                    const std::uint8_t tag = in.u8();
                    r = tag < 232 ? r + (e == e0 ? 0 : 1 + tag % 3) : in.num32();
                    x.indices[static_cast<std::size_t>(e)] = static_cast<std::int32_t>(r);
                }
            }
            x.lists_built = true;
        }
    }
    return x;
}

template <class T>
KvBatchView<T> view_of(Batch& x, T* k, T* v) {
    return {k, v, x.B, x.Hkv, x.d, x.page_size, x.page_stride, x.row_stride, x.head_stride, x.n_pages,
            x.paged ? (x.table_built ? x.block_table.data() : &kDummyEntry) : nullptr,
            x.bts, x.seq_lens.data()};
}

// Accepted layout: every (page, row, head) span of d elements lies in [0, extent) and none overlaps
// another (checked when there are few enough to list).
void check_layout(const Batch& x, std::int64_t extent) {
    const auto ext = x.extent();
    FUZZ_CHECK(ext.has_value() && *ext == extent, "kv_batch_extent() = ", extent, " differs from the pool's span");
    const std::int64_t pages = x.paged ? x.n_pages : x.B;
    if (i128(pages) * x.page_size * x.Hkv > kMaxArray) return;
    std::vector<std::pair<i128, i128>> spans;
    for (std::int64_t p = 0; p < pages; ++p)
        for (std::int64_t i = 0; i < x.page_size; ++i)
            for (std::int64_t g = 0; g < x.Hkv; ++g) {
                const i128 o = p * i128(x.page_stride) + i * i128(x.row_stride) + g * i128(x.head_stride);
                FUZZ_CHECK(o >= 0 && o + x.d <= extent, "span of page ", p, " row ", i, " head ", g, " outside the pool");
                spans.emplace_back(o, o + x.d);
            }
    std::sort(spans.begin(), spans.end());
    for (std::size_t i = 1; i < spans.size(); ++i)
        FUZZ_CHECK(spans[i].first >= spans[i - 1].second, "accepted strides (page ", x.page_stride, ", row ", x.row_stride,
                   ", head ", x.head_stride, ", page_size ", x.page_size, ", H_kv ", x.Hkv, ", d ", x.d,
                   ") make two spans overlap");
}

// Accepted contents obey the rules, and every row read lies in the pool. Dense lists and many KV
// heads are sampled where an offset is monotone: the first and last row of every page a sequence
// uses, the first and last KV head (unless each head has its own list).
void check_contents(const Batch& x, std::int64_t extent) {
    auto check_row = [&](std::int64_t b, std::int64_t r, std::int64_t g) {
        if (x.paged) {
            const std::int64_t page = x.block_table[static_cast<std::size_t>(b * x.bts + r / x.page_size)];
            FUZZ_CHECK(page >= 0 && page < x.n_pages, "block-table entry ", page, " accepted");
        }
        const i128 o = x.offset(b, r, g);
        FUZZ_CHECK(o >= 0 && o + x.d <= extent, "row ", r, " of sequence ", b, ", head ", g, " lies outside the pool");
    };
    for (std::int64_t b = 0; b < x.B; ++b) {
        const std::int64_t len = x.seq_lens[static_cast<std::size_t>(b)];
        const std::int64_t ql = x.q_indptr.empty() ? 1 : std::int64_t{x.q_indptr[b + 1]} - x.q_indptr[b];
        FUZZ_CHECK(len >= 1 && len <= x.capacity() && ql >= 1 && ql <= 8 && ql <= len, "sequence ", b, ": length ", len,
                   ", q_len ", ql, " accepted");
        std::vector<std::int64_t> heads;
        if (x.lps > 1 || x.Hkv <= 2) {
            for (std::int64_t g = 0; g < x.Hkv; ++g) heads.push_back(g);
        } else {
            heads = {0, x.Hkv - 1};
        }
        for (std::int64_t g : heads) {
            if (x.dense) {
                const std::int64_t P = x.paged ? x.page_size : len;
                for (i128 p0 = 0; p0 < len; p0 += P) {
                    check_row(b, static_cast<std::int64_t>(p0), g);
                    check_row(b, static_cast<std::int64_t>(std::min<i128>(len, p0 + P) - 1), g);
                }
                continue;
            }
            const std::int64_t li = b * x.lps + (x.lps == 1 ? 0 : g);
            const std::int64_t e0 = x.list_indptr[static_cast<std::size_t>(li)];
            const std::int64_t e1 = x.list_indptr[static_cast<std::size_t>(li + 1)];
            FUZZ_CHECK(e1 > e0, "sequence ", b, " head ", g, ": empty list accepted");
            for (std::int64_t e = e0; e < e1; ++e) {
                const std::int64_t r = x.indices[static_cast<std::size_t>(e)];
                FUZZ_CHECK(r >= 0 && r < len, "row ", r, " of sequence ", b, " accepted");
                if (e > e0) FUZZ_CHECK(r > x.indices[static_cast<std::size_t>(e - 1)], "unsorted list accepted");
                if (e == e0) FUZZ_CHECK(r <= len - ql, "a list no new token of sequence ", b, " sees into was accepted");
                check_row(b, r, g);
            }
        }
    }
}

void decode(fuzz::Bytes& in, Batch& x) {
    const DecodeBatchHost meta{x.seq_lens, x.q_indptr, x.list_indptr, x.lps};
    const std::optional<i128> ext = x.extent();
    const bool small = ext && *ext <= kMaxPool && x.table_built == x.paged && (x.dense || x.lists_built) &&
                       x.Hkv <= 64 && x.d <= 64;  // q and out: at most 64 x 128 x 64 elements
    if (!small) {  // metadata only: the checks never read K/V, so a dummy pointer stands for the pool
        float dummy = 0;
        const KvBatchView<const float> view = view_of<const float>(x, &dummy, &dummy);
        try {
            vlsparse::detail::check_kv_batch(view, meta, x.H, "fuzz");
        } catch (const vlsparse::error& e) {
            fuzz::check_message(e);
            return;
        }
        const std::int64_t extent = vlsparse::detail::kv_batch_extent(view);
        check_layout(x, extent);
        if (x.table_built != x.paged || !(x.dense || x.lists_built)) return;
        const BatchRowLists lists{x.dense ? nullptr : x.list_indptr.data(), x.dense ? nullptr : x.indices.data(), x.lps};
        try {
            vlsparse::detail::check_batch_contents(view, lists, meta, "fuzz");
        } catch (const vlsparse::error& e) {
            fuzz::check_message(e);
            return;
        }
        check_contents(x, extent);
        return;
    }
    // The whole public call on buffers of exactly the pool's span.
    const auto n = static_cast<std::size_t>(*ext);
    std::vector<float> k(n), v(n);
    for (std::size_t i = 0; i < n; ++i) k[i] = static_cast<float>(i % 7) * 0.25f - 0.75f, v[i] = static_cast<float>(i % 5) * 0.5f - 1.0f;
    const KvBatchView<const float> view = view_of<const float>(x, k.data(), v.data());
    const BatchRowLists lists{x.dense ? nullptr : x.list_indptr.data(), x.dense ? nullptr : x.indices.data(), x.lps};
    const std::int64_t total_q = x.q_indptr.empty() ? x.B : std::clamp<std::int64_t>(x.q_indptr.back(), 0, 64);
    std::vector<float> q(static_cast<std::size_t>(total_q * x.H * x.d), 0.3f), out(q.size(), -9.0f);
    const vlsparse::View3<const float> qv(q.data(), {total_q, x.H, x.d});
    const vlsparse::View3<float> ov(out.data(), {total_q, x.H, x.d});
    const bool with_probs = !x.dense && (in.u8() & 1);
    std::vector<double> probs(with_probs ? x.indices.size() : 0);
    try {
        if (with_probs)
            vlsparse::reference::batched_decode_attention(qv, view, lists, meta, ov, std::span<double>(probs));
        else
            vlsparse::reference::batched_decode_attention(qv, view, lists, meta, ov);
    } catch (const vlsparse::error& e) {
        fuzz::check_message(e);
        return;
    }
    const std::int64_t extent = vlsparse::detail::kv_batch_extent(view);
    check_layout(x, extent);
    check_contents(x, extent);
    for (float o : out) FUZZ_CHECK(std::isfinite(o) && std::fabs(o) <= 1.0f + 1e-5f, "output ", o, " outside V's range");
    for (double p : probs) FUZZ_CHECK(std::isfinite(p) && p >= 0 && p <= 8.0 + 1e-9, "probability ", p);
}

// The updates write: they run only on pools small enough to allocate, with unique values per element.
void update(fuzz::Bytes& in, Batch& x, bool append) {
    const std::optional<i128> ext = x.extent();
    if (!ext || *ext > kMaxPool || x.table_built != x.paged || x.Hkv > 64 || x.d > 64) return;
    const auto n = static_cast<std::size_t>(*ext);
    std::vector<float> k(n), v(n);
    for (std::size_t i = 0; i < n; ++i) k[i] = static_cast<float>(i), v[i] = -static_cast<float>(i);
    const std::vector<float> k0 = k;
    const std::vector<std::int32_t> lens0 = x.seq_lens, table0 = x.block_table;
    KvBatchView<float> view = view_of<float>(x, k.data(), v.data());
    std::span<std::int32_t> lens(x.seq_lens);
    // Where row r of sequence b, head g was before the update (nullopt: not addressable).
    auto old_offset = [&](std::int64_t b, std::int64_t r, std::int64_t g) -> std::int64_t {
        const i128 page = x.paged ? table0[static_cast<std::size_t>(b * x.bts + r / x.page_size)] : b;
        return static_cast<std::int64_t>(page * x.page_stride + i128(r % x.page_size) * x.row_stride + i128(g) * x.head_stride);
    };
    if (append) {
        std::vector<std::int32_t> new_indptr{in.u8() < 250 ? 0 : in.num32()};
        for (int b = 0; b < x.B; ++b) {
            const std::uint8_t tag = in.u8();
            const std::int64_t step = tag < 232 ? tag % 4 : in.num32();
            new_indptr.push_back(static_cast<std::int32_t>(new_indptr.back() + step));
        }
        const std::int64_t total = std::clamp<std::int64_t>(new_indptr.back(), 0, 64);
        std::vector<float> kn(static_cast<std::size_t>(total * x.Hkv * x.d));
        for (std::size_t i = 0; i < kn.size(); ++i) kn[i] = 1e6f + static_cast<float>(i);
        const vlsparse::View3<const float> knv(kn.data(), {total, x.Hkv, x.d});
        try {
            vlsparse::reference::kv_batch_append(view, lens, knv, knv, std::span<const std::int32_t>(new_indptr));
        } catch (const vlsparse::error& e) {
            fuzz::check_message(e);
            return;
        }
        for (std::int64_t b = 0; b < x.B; ++b) {
            const std::int64_t n0 = lens0[static_cast<std::size_t>(b)], a = new_indptr[b + 1] - new_indptr[b];
            FUZZ_CHECK(n0 >= 0 && a >= 0 && x.seq_lens[static_cast<std::size_t>(b)] == n0 + a, "sequence ", b, " length");
            for (std::int64_t r = 0; r < n0 + a; ++r)
                for (std::int64_t g = 0; g < x.Hkv; ++g) {
                    const std::int64_t o = old_offset(b, r, g);
                    FUZZ_CHECK(o >= 0 && o + x.d <= *ext, "row ", r, " of sequence ", b, " outside the pool");
                    for (std::int64_t c = 0; c < x.d; ++c) {
                        const float want = r < n0 ? k0[static_cast<std::size_t>(o + c)]
                                                  : kn[static_cast<std::size_t>(((new_indptr[b] + r - n0) * x.Hkv + g) * x.d + c)];
                        FUZZ_CHECK(k[static_cast<std::size_t>(o + c)] == want, "after append, sequence ", b, " row ", r,
                                   " head ", g, " holds ", k[static_cast<std::size_t>(o + c)], ", expected ", want);
                    }
                }
        }
        return;
    }
    // compact: the batched form (every sequence) or one sequence
    const bool batched = in.u8() & 1;
    const std::int64_t only = batched ? -1 : (in.u8() < 240 ? in.u8() % x.B : in.num());
    std::vector<std::int32_t> keep_indptr{0}, keep;
    for (std::int64_t b = 0; b < x.B; ++b) {
        const std::int64_t len = std::clamp<std::int64_t>(lens0[static_cast<std::size_t>(b)], 0, 64);
        std::vector<std::int32_t> l;
        if (batched || b == only) {
            const std::uint8_t how = in.u8();
            for (std::int64_t r = 0; r < len + 1; ++r)
                if (how < 16 ? in.num() : (in.u8() & 3) != 0) l.push_back(static_cast<std::int32_t>(r));
            if (how >= 248) l.push_back(in.num32());  // an entry that may be anything
        }
        if (batched || b == only) keep.insert(keep.end(), l.begin(), l.end());
        keep_indptr.push_back(static_cast<std::int32_t>(keep.size()));
    }
    if (batched && in.u8() >= 248) keep_indptr[in.u8() % keep_indptr.size()] = in.num32();
    std::vector<std::int32_t> freed;
    try {
        freed = batched ? vlsparse::reference::kv_batch_compact(view, lens, std::span<const std::int32_t>(keep_indptr),
                                                                std::span<const std::int32_t>(keep))
                        : vlsparse::reference::kv_batch_compact(view, lens, only, std::span<const std::int32_t>(keep));
    } catch (const vlsparse::error& e) {
        fuzz::check_message(e);
        return;
    }
    std::vector<std::int32_t> want_freed;
    for (std::int64_t b = 0; b < x.B; ++b) {
        const std::int64_t n0 = lens0[static_cast<std::size_t>(b)];
        const bool touched = batched || b == only;
        const std::span<const std::int32_t> l =
            !touched ? std::span<const std::int32_t>{}
                     : batched ? std::span<const std::int32_t>(keep).subspan(static_cast<std::size_t>(keep_indptr[b]),
                                                                            static_cast<std::size_t>(keep_indptr[b + 1] - keep_indptr[b]))
                               : std::span<const std::int32_t>(keep);
        const std::int64_t m = touched ? static_cast<std::int64_t>(l.size()) : n0;
        FUZZ_CHECK(x.seq_lens[static_cast<std::size_t>(b)] == m, "sequence ", b, " length ", x.seq_lens[b], ", expected ", m);
        for (std::int64_t i = 0; i < m; ++i) {
            const std::int64_t src = touched ? l[static_cast<std::size_t>(i)] : i;
            FUZZ_CHECK(src >= 0 && src < n0 && (i == 0 || !touched || src > l[static_cast<std::size_t>(i - 1)]),
                       "keep list of sequence ", b, " accepted with entry ", src);
            for (std::int64_t g = 0; g < x.Hkv; ++g)
                for (std::int64_t c = 0; c < x.d; ++c) {
                    const float got = k[static_cast<std::size_t>(old_offset(b, i, g) + c)];
                    const float want = k0[static_cast<std::size_t>(old_offset(b, src, g) + c)];
                    FUZZ_CHECK(got == want, "after compaction, sequence ", b, " row ", i, " head ", g, " holds ", got,
                               ", expected row ", src, "'s ", want);
                }
        }
        if (x.paged && touched)
            for (std::int64_t s = (m + x.page_size - 1) / x.page_size; s < (n0 + x.page_size - 1) / x.page_size; ++s) {
                want_freed.push_back(table0[static_cast<std::size_t>(b * x.bts + s)]);
                FUZZ_CHECK(x.block_table[static_cast<std::size_t>(b * x.bts + s)] == -1, "released slot not cleared");
            }
    }
    FUZZ_CHECK(freed == want_freed, "released pages differ from the documented slots");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    fuzz::Bytes in(data, size);
    const int mode = in.u8() % 3;
    Batch x = build(in);
    if (mode == 0) decode(in, x);
    else update(in, x, mode == 1);
    return 0;
}
