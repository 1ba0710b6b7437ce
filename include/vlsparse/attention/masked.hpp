// vlsparse/attention/masked.hpp -- block-masked attention, CPU fast path (namespace vlsparse::simd).
//
//   O[i,h,:] = sum_{j : mask_h(i, j)} softmax_j(scale * q_{i,h} . k_{j,g}) v_{j,g},   g = h / (H / H_kv)
//
// The mask is a BlockMask (masks/block_mask.hpp), read only through its block lists (the CSR
// arrays), its head templates and mask.context.row_intervals, so any mask kind of that form runs
// unchanged. Skipped blocks cost nothing: the work scales with the allowed pairs (plus the partial
// blocks' slack), not with n^2. Prefill only (n_q == n_k == mask.n). fp32 accumulation, Eigen GEMMs
// and the xsimd softmax kernels of the dense engine (attention/dense.hpp), online softmax over key
// chunks. The work is planned per call by masks/masked_plan.hpp (masked_plan: head classes, work
// items, key spans, GEMM chunks of VLSPARSE_SIMD_K_CHUNK to 2 VLSPARSE_SIMD_K_CHUNK - 1 keys, each
// row's holes); this header runs it. A chunk without masked columns runs as in the dense engine. In a
// masked chunk each row gets -inf in its holes and its softmax stops at its last allowed column, and
// each group of kMaskedRowGroup rows stops its GEMMs at the group's last allowed column (about half of
// the causal triangle is skipped).
// K and V are packed (fp32, unit stride) a group of KV heads at a time into a ring of two slots, the
// next group while the current one runs; the threads (OpenMP) take tasks (build an item, pack rows,
// run an item for some heads) from one ordered list, with no barrier between KV heads. Large outputs
// are written with streaming stores. Rows whose fp32 result overflows are recomputed in double.
// Same semantics as vlsparse::reference::masked_attention. Include: <vlsparse/attention/masked.hpp>
#pragma once

#include "vlsparse/core/config.hpp"
VLSPARSE_GCC12_AVX512_DIAGNOSTICS_BEGIN

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

#include "vlsparse/attention/dense.hpp"
#include "vlsparse/masks/block_mask.hpp"
#include "vlsparse/masks/masked_plan.hpp"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

// detail::check_masked_args (masks/block_mask.hpp): the checks every backend runs first.
namespace vlsparse {
namespace simd {
namespace detail {

// store_row through streaming stores where it can (fp32, unit stride, 16-byte aligned rows): the
// output is written once and not read here, so its lines need not be read into the cache first.
// The caller ends with stream_fence().
template <class TO>
void store_row_stream(TO* dst, std::int64_t stride, const float* src, std::int64_t d) {
#if defined(__SSE2__)
    if constexpr (std::is_same_v<TO, float>) {
        if (stride == 1 && d % 4 == 0 && (reinterpret_cast<std::uintptr_t>(dst) & 15u) == 0) {
            for (std::int64_t c = 0; c < d; c += 4) _mm_stream_ps(dst + c, _mm_loadu_ps(src + c));
            return;
        }
    }
#endif
    store_row(dst, stride, src, d);
}
inline void stream_fence() {
#if defined(__SSE2__)
    _mm_sfence();
#endif
}

// Outputs of at least this many bytes are written with streaming stores.
inline constexpr std::int64_t kMaskedStreamBytes = std::int64_t{8} << 20;

// Packed K/V (fp32): the ring's two slots take at most this many bytes together (but hold one KV
// head each at least). Kept under the size that malloc serves by mmap (32 MiB by default), so that
// the buffer is reused from one call to the next instead of being faulted in (and zeroed) again.
inline constexpr std::int64_t kMaskedPackBytes = std::int64_t{16} << 20;

// One work item for one head: Q [nr, d] (row-major), keys and values of the head's KV head in ks; S
// scratch for the scores, m and l for the running max and sum (nr each), gk / gv for gathered keys.
// On return O [nr, d] holds the normalized outputs and bad[r] != 0 marks rows to recompute in double.
template <class Arch>
void attend_item(const float* Q, std::int64_t d, const KeySet& ks, float scale, const MaskedItem& it, float* O,
                 float* S, float* m, float* l, std::uint8_t* bad, float* gk, float* gv) {
    using K = Kernels<Arch>;
    constexpr float ninf = -std::numeric_limits<float>::infinity();
    const auto nr = static_cast<std::int64_t>(it.pos.size());
    for (std::int64_t r = 0; r < nr; ++r) {
        m[r] = ninf;
        l[r] = 0.0f;
        bad[r] = 0;
    }
    std::fill(O, O + nr * d, 0.0f);
    for (const auto& ch : it.chunks) {
        const std::int64_t kc = ch.kc;
        const auto& first = it.pieces[static_cast<std::size_t>(ch.p0)];
        const float *kptr = ks.k + first.lo * ks.ldk, *vptr = ks.v + first.lo * ks.ldv;
        std::int64_t ldk = ks.ldk, ldv = ks.ldv;
        if (ch.p1 - ch.p0 > 1) {  // gather the short spans
            for (std::int64_t p = ch.p0; p < ch.p1; ++p) {
                const auto& pc = it.pieces[static_cast<std::size_t>(p)];
                for (std::int64_t j = pc.lo, c = pc.col; j < pc.hi; ++j, ++c) {
                    std::memcpy(gk + c * d, ks.k + j * ks.ldk, static_cast<std::size_t>(d) * sizeof(float));
                    std::memcpy(gv + c * d, ks.v + j * ks.ldv, static_cast<std::size_t>(d) * sizeof(float));
                }
            }
            kptr = gk;
            vptr = gv;
            ldk = ldv = d;
        }
        const bool masked = ch.rows >= 0;
        const RowGroup all{0, nr, kc};
        const RowGroup* g = masked ? it.groups.data() + ch.grp0 : &all;
        const RowGroup* gend = masked ? it.groups.data() + ch.grp1 : &all + 1;
        for (; g != gend; ++g) {
            const std::int64_t rows = g->r1 - g->r0, ext = g->ext;
            if (ext == 0) continue;  // nothing allowed to these rows in this chunk
            MapR Sm(S, rows, ext, Eigen::OuterStride<>(ext));
            const CMapR Qm(Q + g->r0 * d, rows, d, Eigen::OuterStride<>(d));
            const CMapR Km(kptr, ext, d, Eigen::OuterStride<>(ldk));
            const CMapR Vm(vptr, ext, d, Eigen::OuterStride<>(ldv));
            Sm.noalias() = scale * (Qm * Km.transpose());
            for (std::int64_t r = g->r0; r < g->r1; ++r) {
                float* srow = S + (r - g->r0) * ext;
                std::int64_t cnt = ext;
                if (masked) {
                    cnt = it.cend[static_cast<std::size_t>(ch.rows + r)];
                    const auto h0 = static_cast<std::size_t>(it.hole_off[static_cast<std::size_t>(ch.holes + r)]);
                    const auto h1 = static_cast<std::size_t>(it.hole_off[static_cast<std::size_t>(ch.holes + r) + 1]);
                    for (std::size_t x = h0; x < h1; ++x) std::fill(srow + it.holes[x].lo, srow + it.holes[x].hi, ninf);
                }
                if (cnt == 0) {
                    std::fill(srow, srow + ext, 0.0f);
                    continue;
                }
                const float mx = K::max(srow, cnt);
                const float mnew = std::max(m[r], mx);
                if (mnew == ninf) {  // only -inf scores so far (overflowed input): the row goes to double
                    bad[r] = 1;
                    std::fill(srow, srow + ext, 0.0f);
                    continue;
                }
                const float alpha = m[r] == ninf ? 0.0f : std::exp(m[r] - mnew);
                const float sum = K::exp_sub_sum(srow, cnt, mnew);  // exp(-inf) = 0 in the holes
                std::fill(srow + cnt, srow + ext, 0.0f);
                if (m[r] != ninf && alpha != 1.0f) K::scale(O + r * d, d, alpha);
                l[r] = l[r] * alpha + sum;
                m[r] = mnew;
            }
            MapR Om(O + g->r0 * d, rows, d, Eigen::OuterStride<>(d));
            Om.noalias() += Sm * Vm;
        }
    }
    for (std::int64_t r = 0; r < nr; ++r) {
        float* orow = O + r * d;
        if (bad[r] || !(l[r] > 0.0f) || !std::isfinite(l[r])) {
            bad[r] = 1;
            continue;
        }
        K::scale(orow, d, 1.0f / l[r]);
        if (!K::all_finite(orow, d)) bad[r] = 1;
    }
}

template <class Arch, class TQ, class TK, class TO>
void run_masked_attention(const View3<const TQ>& q, const View3<const TK>& k, const View3<const TK>& v,
                          const BlockMask& bm, const View3<TO>& out, float scale, Blocking blocking = {},
                          std::int64_t pack_bytes = kMaskedPackBytes) {
    const std::int64_t n = q.shape[0], H = q.shape[1], d = q.shape[2], Hkv = k.shape[1];
    const std::int64_t group = H / Hkv;
    // Chunks of kt to 2 kt - 1 keys in place, gathered chunks of at most kt keys.
    const std::int64_t kt = std::max<std::int64_t>(1, blocking.k_chunk);
    MaskedPlan plan = masked_plan(bm);
    const bool in_place = usable_in_place(k) && usable_in_place(v);
    // KV heads are packed in groups, into a ring of two slots of at most pack_bytes together (one head
    // per slot at least): group p + 1 is packed while group p runs. Read in place: one group.
    const std::int64_t head_bytes = 2 * n * d * static_cast<std::int64_t>(sizeof(float));
    const std::int64_t heads_per_pack =
        in_place ? Hkv : std::clamp<std::int64_t>(pack_bytes / std::max<std::int64_t>(2 * head_bytes, 1), 1, Hkv);
    const std::int64_t n_groups = (Hkv + heads_per_pack - 1) / heads_per_pack;
    const int nthreads = max_threads();
    // Work: (item, heads of its class in the pack group): the query rows and outputs of one token for
    // several heads lie together in token-major views. Within a group the most expensive first (the
    // group then ends on small ones); heads are split further when there would be fewer than 8 pieces
    // of work per thread.
    struct Work {
        std::int64_t item, h0, nh;  // heads work_heads[h0 : h0 + nh)
        double cost;
    };
    std::vector<Work> work;
    std::vector<std::int64_t> work_heads, group_work(1, 0), class_heads;
    std::int64_t max_nh = 1;
    for (std::int64_t p = 0; p < n_groups; ++p) {
        const std::int64_t ha = p * heads_per_pack * group, hb = std::min(Hkv, (p + 1) * heads_per_pack) * group;
        class_heads.assign(1, static_cast<std::int64_t>(work_heads.size()));
        std::int64_t per = 1;  // heads per piece of work
        for (std::size_t c = 0; c < plan.class_head.size(); ++c) {
            for (std::int64_t h = ha; h < hb; ++h)
                if (plan.head_class[static_cast<std::size_t>(h)] == static_cast<std::int64_t>(c)) work_heads.push_back(h);
            class_heads.push_back(static_cast<std::int64_t>(work_heads.size()));
            per = std::max(per, class_heads[c + 1] - class_heads[c]);
        }
        auto pieces = [&](std::int64_t x) {
            std::int64_t total = 0;
            for (std::size_t c = 0; c < plan.class_head.size(); ++c)
                total += (plan.class_items[c + 1] - plan.class_items[c]) * ((class_heads[c + 1] - class_heads[c] + x - 1) / x);
            return total;
        };
        while (per > 1 && pieces(per) < 8 * static_cast<std::int64_t>(nthreads)) per = (per + 1) / 2;
        const auto w0 = static_cast<std::ptrdiff_t>(work.size());
        for (std::size_t c = 0; c < plan.class_head.size(); ++c) {
            const std::int64_t nh = class_heads[c + 1] - class_heads[c];
            for (std::int64_t x = plan.class_items[c]; x < plan.class_items[c + 1]; ++x)
                for (std::int64_t e = 0; e < nh; e += per) {
                    const std::int64_t cnt = std::min(per, nh - e);
                    work.push_back({x, class_heads[c] + e, cnt, plan.items[static_cast<std::size_t>(x)].cost * static_cast<double>(cnt)});
                    max_nh = std::max(max_nh, cnt);
                }
        }
        std::stable_sort(work.begin() + w0, work.end(), [](const Work& x, const Work& y) { return x.cost > y.cost; });
        group_work.push_back(static_cast<std::int64_t>(work.size()));
    }
    // One list of tasks taken in order by every thread, no barrier: build every item and pack group
    // 0, then per group p its work (which waits for its packing and every build), with the packing of
    // group p + 1 spread over the first half of it (which waits for the work of group p - 1, the last
    // user of the same slot). A task waits only for earlier tasks, so the list cannot deadlock.
    constexpr std::int64_t kPackRows = 256;
    const std::int64_t pack_chunks = in_place ? 0 : (n + kPackRows - 1) / kPackRows;
    struct Task {
        std::int8_t kind;  // 0 build item a, 1 pack rows chunk a of group b, 2 work a of group b
        std::int64_t a, b;
    };
    std::vector<Task> tasks;
    for (std::int64_t x = 0; x < static_cast<std::int64_t>(plan.items.size()); ++x) tasks.push_back({0, x, 0});
    for (std::int64_t c = 0; c < pack_chunks; ++c) tasks.push_back({1, c, 0});
    for (std::int64_t p = 0; p < n_groups; ++p) {
        // The next group's packing overlaps with other threads' GEMMs instead of all threads packing at once.
        const std::int64_t w0 = group_work[static_cast<std::size_t>(p)], w1 = group_work[static_cast<std::size_t>(p) + 1];
        const std::int64_t next_chunks = p + 1 < n_groups ? pack_chunks : 0, span = std::max<std::int64_t>(1, (w1 - w0) / 2);
        std::int64_t c = 0;
        for (std::int64_t x = w0; x < w1; ++x) {
            tasks.push_back({2, x, p});
            for (const std::int64_t due = std::min(next_chunks, (x - w0 + 1) * next_chunks / span); c < due; ++c)
                tasks.push_back({1, c, p + 1});
        }
        for (; c < next_chunks; ++c) tasks.push_back({1, c, p + 1});
    }
    std::atomic<std::int64_t> next{0}, built{0};
    std::vector<std::atomic<std::int64_t>> packed_chunks(static_cast<std::size_t>(n_groups)), done_work(static_cast<std::size_t>(n_groups));
    for (std::int64_t p = 0; p < n_groups; ++p) {
        packed_chunks[static_cast<std::size_t>(p)].store(0, std::memory_order_relaxed);
        done_work[static_cast<std::size_t>(p)].store(0, std::memory_order_relaxed);
    }
    auto wait_for = [](const std::atomic<std::int64_t>& c, std::int64_t target) {
        while (c.load(std::memory_order_acquire) < target) std::this_thread::yield();
    };

    // The ring: slot s holds K of heads_per_pack heads, then their V; written before read (no zero fill).
    const std::int64_t slots = std::min<std::int64_t>(2, n_groups), slot_floats = heads_per_pack * n * d;
    std::unique_ptr<float[]> ring(in_place ? nullptr : new float[static_cast<std::size_t>(2 * slots * slot_floats)]);
    auto slot_k = [&](std::int64_t p) { return in_place ? nullptr : ring.get() + (p % slots) * 2 * slot_floats; };
    auto slot_v = [&](std::int64_t p) { return in_place ? nullptr : ring.get() + (p % slots) * 2 * slot_floats + slot_floats; };

    const std::int64_t R = plan.max_rows, S_cols = std::min(n, 2 * kt - 1), G_rows = std::min(n, kt);
    struct Buffers {
        std::vector<float> q, o, s, m, l, gk, gv;
        std::vector<std::uint8_t> bad;
        std::vector<double> dp, dout;
        std::vector<KeyInterval> row_iv;
        std::vector<std::int64_t> keys;
        std::vector<KeySet> ks;
        MaskedScratch build;
    };
    std::vector<Buffers> buffers(static_cast<std::size_t>(nthreads));
    for (auto& B : buffers) {
        const auto rows = static_cast<std::size_t>(max_nh * R);
        B.q.resize(rows * static_cast<std::size_t>(d));
        B.o.resize(rows * static_cast<std::size_t>(d));
        B.m.resize(rows);
        B.l.resize(rows);
        B.bad.resize(rows);
        B.s.resize(static_cast<std::size_t>(R * S_cols));
        B.gk.resize(static_cast<std::size_t>(G_rows * d));
        B.gv.resize(static_cast<std::size_t>(G_rows * d));
        B.dout.resize(static_cast<std::size_t>(d));
        B.ks.resize(static_cast<std::size_t>(heads_per_pack));
    }
    // Streaming stores for outputs well beyond the caches (smaller ones may be read back soon).
    const bool stream_out = n * H * d * static_cast<std::int64_t>(sizeof(TO)) >= kMaskedStreamBytes;
    ErrorSlot err;

    VLSPARSE_OMP(omp parallel num_threads(nthreads))
    {
        Buffers& B = buffers[static_cast<std::size_t>(thread_id())];
        for (std::int64_t t = next.fetch_add(1); t < static_cast<std::int64_t>(tasks.size()); t = next.fetch_add(1)) {
            const Task task = tasks[static_cast<std::size_t>(t)];
            const auto p = static_cast<std::size_t>(task.b);
            const std::int64_t g0 = task.b * heads_per_pack, g1 = std::min(Hkv, g0 + heads_per_pack);
            if (task.kind == 0) {
                auto& it = plan.items[static_cast<std::size_t>(task.a)];
                bool ok = false;
                err.run([&] {
                    const auto c = static_cast<std::size_t>(
                        std::upper_bound(plan.class_items.begin(), plan.class_items.end(), task.a) - plan.class_items.begin() - 1);
                    const auto& qbs = plan.item_blocks[static_cast<std::size_t>(task.a)];
                    item_key_lists(bm, plan.class_head[c], qbs.data(), static_cast<std::int64_t>(qbs.size()), it, B.build);
                    item_chunks(kt, it, B.build);
                    item_chunk_rows(it, B.build);
                    ok = true;
                });
                if (!ok) it = MaskedItem{};  // the error is rethrown after the region; no rows to run
                built.fetch_add(1, std::memory_order_release);
            } else if (task.kind == 1) {
                if (task.b >= slots)
                    wait_for(done_work[p - static_cast<std::size_t>(slots)],
                             group_work[p - static_cast<std::size_t>(slots) + 1] - group_work[p - static_cast<std::size_t>(slots)]);
                err.run([&] {
                    pack_kv_rows(k, v, g0, g1, nullptr, n, task.a * kPackRows, std::min(n, (task.a + 1) * kPackRows),
                                 slot_k(task.b), slot_v(task.b));
                });
                packed_chunks[p].fetch_add(1, std::memory_order_release);
            } else {
                wait_for(built, static_cast<std::int64_t>(plan.items.size()));
                wait_for(packed_chunks[p], pack_chunks);
                err.run([&] {
                    kv_key_sets(k, v, g0, g1, n, in_place, slot_k(task.b), slot_v(task.b), B.ks.data());
                    const Work& wk = work[static_cast<std::size_t>(task.a)];
                    const MaskedItem& it = plan.items[static_cast<std::size_t>(wk.item)];
                    const std::int64_t* heads = work_heads.data() + wk.h0;
                    const auto nr = static_cast<std::int64_t>(it.pos.size());
                    for (std::int64_t r = 0; r < nr; ++r)
                        for (std::int64_t e = 0; e < wk.nh; ++e)
                            widen_row(q.row(it.pos[static_cast<std::size_t>(r)], heads[e]), q.stride[2],
                                      B.q.data() + (e * nr + r) * d, d);
                    for (std::int64_t e = 0; e < wk.nh; ++e) {
                        const std::int64_t g = heads[e] / group;
                        attend_item<Arch>(B.q.data() + e * nr * d, d, B.ks[static_cast<std::size_t>(g - g0)], scale, it,
                                          B.o.data() + e * nr * d, B.s.data(), B.m.data() + e * nr, B.l.data() + e * nr,
                                          B.bad.data() + e * nr, B.gk.data(), B.gv.data());
                    }
                    for (std::int64_t r = 0; r < nr; ++r) {
                        const std::int64_t i = it.pos[static_cast<std::size_t>(r)];
                        for (std::int64_t e = 0; e < wk.nh; ++e) {
                            const std::int64_t h = heads[e];
                            TO* dst = out.row(i, h);
                            if (!B.bad[static_cast<std::size_t>(e * nr + r)]) {
                                if (stream_out) store_row_stream(dst, out.stride[2], B.o.data() + (e * nr + r) * d, d);
                                else store_row(dst, out.stride[2], B.o.data() + (e * nr + r) * d, d);
                                continue;
                            }
                            bm.context.row_intervals(bm.head_template[static_cast<std::size_t>(h)], i, B.row_iv);
                            B.keys.clear();
                            for (const auto& y : B.row_iv)
                                for (std::int64_t j = y.lo; j < y.hi; ++j) B.keys.push_back(j);
                            attend_row_double(q.row(i, h), q.stride[2], k, v, h / group, B.keys.data(),
                                              static_cast<std::int64_t>(B.keys.size()), static_cast<double>(scale), B.dp,
                                              B.dout.data());
                            for (std::int64_t c = 0; c < d; ++c) store(dst[c * out.stride[2]], B.dout[static_cast<std::size_t>(c)]);
                        }
                    }
                });
                if (stream_out) stream_fence();
                done_work[p].fetch_add(1, std::memory_order_release);
            }
        }
    }
    err.rethrow();
}

}  // namespace detail

// Block-masked prefill attention. q [n, H, d], k, v [n, H_kv, d], out [n, H, d]; mask.n == n and
// mask.heads == H (one template per query head; GQA heads share the packed K/V of their group).
template <ElementType TQ, ElementType TK, OutputElement TO, class Arch = native_arch>
void masked_attention(View3<const TQ> q, View3<const TK> k, View3<const TK> v, const BlockMask& mask, View3<TO> out,
                      const AttentionOptions& opt = {}) {
    constexpr const char* fn = "simd::masked_attention";
    ::vlsparse::detail::check_masked_args(q, k, v, mask, out, fn);
    if (opt.check_finite) detail::check_all_finite(q, k, v, fn);
    const float scale = detail::resolve_scale(opt, q.shape[2], fn);
    detail::run_masked_attention<Arch>(q, k, v, mask, out, scale);
    if (opt.check_finite) ::vlsparse::detail::check_narrowed_output(out, fn, "out");
}

}  // namespace simd
}  // namespace vlsparse

VLSPARSE_GCC12_AVX512_DIAGNOSTICS_END
