// The CUDA KV-cache updates (vlsparse/cuda/kv_cache.cuh) against reference::kv_batch_append /
// kv_batch_compact on identical inputs, bit for bit: the whole K / V pools, the block table, the
// device seq_lens and the caller's host mirror, the positions and the released pages after every
// step. fp32 / fp16 / bf16 caches, appended rows of the same or another element type (also strided);
// contiguous caches and paged ones (P = 1, 16, 64; NHD and HND pages from a shuffled pool); head dims
// 33 / 36 / 40 / 64 / 128 and a cache view off 16-byte alignment (the 16-, 4- and 2-byte compaction
// units, the vector and element-wise append paths); batches of 3 sequences (one empty at first);
// keep lists of every row, one row, random rows, every other row, a suffix, and all rows but an early
// one (every destination row is then the source of the entry before it: the in-place hazard), over
// sequences long enough for many tiles; compaction, then append, then compaction, chained on the
// device (its lengths and block table evolve on the GPU); check_inputs on and off; DeviceKvBatch;
// every error. Before each step every dead element (rows past a sequence's length, free pages,
// positions) is poisoned with 0xff bytes on both sides, and the released-pages output is poisoned,
// so an element the GPU should write and does not fails. Built with -Dcuda=enabled; runs on a GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>
#include <vlsparse/core/rng.hpp>

#include "../test_core.hpp"
#include <vlsparse/cuda/kv_cache.cuh>
#include <vlsparse/kv/kv_batch.hpp>
#include <vlsparse/reference/kv_batch.hpp>

#include "../error_of.hpp"

using namespace vlsparse;
using Catch::Matchers::Contains;

namespace {

std::uint64_t base_seed() { return vt::seed_or(20261124u); }

using vt::error_of;

template <class T>
void copy_to_device(T* dst, const std::vector<T>& src) {
    if (!src.empty())
        REQUIRE(cudaMemcpy(dst, src.data(), src.size() * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
}

template <class T>
std::vector<T> copy_to_host(const T* src, std::size_t n) {
    std::vector<T> h(n);
    if (n > 0) REQUIRE(cudaMemcpy(h.data(), src, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
    return h;
}

// Index of the first element whose bytes differ, or -1.
template <class T>
std::int64_t first_diff(const std::vector<T>& a, const std::vector<T>& b) {
    if (a.size() != b.size()) return 0;
    for (std::size_t i = 0; i < a.size(); ++i)
        if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return static_cast<std::int64_t>(i);
    return -1;
}

struct Geometry {
    std::int32_t B = 3, Hkv = 2, d = 64;
    std::int64_t cap = 1500;  // rows a sequence may hold
    std::int64_t P = 0;       // page size; 0: contiguous
    bool hnd = false;
    std::int64_t offset = 0;  // elements between the allocation and the cache view (misalignment)
    std::string describe() const {
        return "B " + std::to_string(B) + ", H_kv " + std::to_string(Hkv) + ", d " + std::to_string(d) + ", cap " +
               std::to_string(cap) + (P == 0 ? ", contiguous" : ", P " + std::to_string(P) + (hnd ? " HND" : " NHD")) +
               (offset ? ", view offset " + std::to_string(offset) : "");
    }
};

// The same batch twice: on the host for the reference, on the device for the CUDA path.
template <class T>
struct Twin {
    Geometry geo;
    std::int64_t stride = 0, n_pages = 0, elems = 0, width = 0;
    bool with_pos = false;
    cuda::KvUpdateOptions opt;
    // Reference state (host).
    std::vector<T> k, v;
    std::vector<std::int32_t> table, lens, free;
    std::vector<std::int64_t> pos;
    KvBatchView<T> hview;
    // CUDA state: device arrays and the caller's host mirror of the lengths.
    cuda::DeviceArray<T> dk, dv;
    cuda::DeviceArray<std::int32_t> dtable, dlens;
    cuda::DeviceArray<std::int64_t> dpos;
    std::vector<std::int32_t> mirror;
    KvBatchView<T> dview;
    std::string step;  // what the last compare checked

    Twin(const Geometry& g, bool positions, std::uint64_t seed) : geo(g), with_pos(positions) {
        const std::int64_t row = static_cast<std::int64_t>(g.Hkv) * g.d;
        if (g.P == 0) {
            elems = g.B * g.cap * row;
            width = g.cap;
        } else {
            stride = (g.cap + g.P - 1) / g.P;
            n_pages = stride * g.B + 4;
            elems = n_pages * g.P * row;
            width = stride * g.P;
            table.assign(static_cast<std::size_t>(g.B * stride), -1);
            free.resize(static_cast<std::size_t>(n_pages));
            std::iota(free.begin(), free.end(), 0);
            SplitMix64 rng(seed ^ 0x5eedu);
            for (std::int64_t i = n_pages - 1; i > 0; --i)
                std::swap(free[static_cast<std::size_t>(i)], free[rng.below(static_cast<std::uint64_t>(i + 1))]);
        }
        k.resize(static_cast<std::size_t>(elems + g.offset));
        v.resize(k.size());
        lens.assign(static_cast<std::size_t>(g.B), 0);
        mirror = lens;
        pos.assign(static_cast<std::size_t>(g.B * width), -1);
        dk = cuda::DeviceArray<T>(k.size());
        dv = cuda::DeviceArray<T>(k.size());
        dlens = cuda::DeviceArray<std::int32_t>(lens);
        dpos = cuda::DeviceArray<std::int64_t>(pos);
        if (g.P > 0) dtable = cuda::DeviceArray<std::int32_t>(table);
        hview = make_view(k.data(), v.data(), table.data(), lens.data());
        dview = make_view(dk.data(), dv.data(), dtable.data(), dlens.data());
    }
    KvBatchView<T> make_view(T* kp, T* vp, std::int32_t* tp, std::int32_t* lp) const {
        const auto& g = geo;
        if (g.P == 0) return contiguous_kv_batch<T>(kp + g.offset, vp + g.offset, g.B, g.cap, g.Hkv, g.d, lp);
        return g.hnd
                   ? paged_kv_batch_hnd<T>(kp + g.offset, vp + g.offset, g.B, n_pages, g.P, g.Hkv, g.d, tp, stride, lp)
                   : paged_kv_batch_nhd<T>(kp + g.offset, vp + g.offset, g.B, n_pages, g.P, g.Hkv, g.d, tp, stride, lp);
    }
    View2<std::int64_t> hpos() {
        return with_pos ? View2<std::int64_t>(pos.data(), {geo.B, width}) : View2<std::int64_t>{};
    }
    View2<std::int64_t> dposv() {
        return with_pos ? View2<std::int64_t>(dpos.data(), {geo.B, width}) : View2<std::int64_t>{};
    }

    // Every element no live row holds (and every position past a length) becomes 0xff bytes, on the
    // host and, by upload, on the device (whose K / V / positions equal the host's after each compare).
    void poison_dead() {
        std::vector<char> live(k.size(), 0);
        for (std::int64_t b = 0; b < geo.B; ++b)
            for (std::int64_t r = 0; r < lens[static_cast<std::size_t>(b)]; ++r)
                for (std::int64_t g = 0; g < geo.Hkv; ++g)
                    std::fill_n(live.begin() + geo.offset + hview.offset(b, r, g), geo.d, 1);
        T ones;  // 0xff bytes: NaN in every element type
        std::memset(static_cast<void*>(&ones), 0xff, sizeof(T));
        for (std::size_t i = 0; i < k.size(); ++i)
            if (!live[i]) k[i] = v[i] = ones;
        for (std::int64_t b = 0; b < geo.B; ++b)
            for (std::int64_t r = lens[static_cast<std::size_t>(b)]; r < width; ++r)
                pos[static_cast<std::size_t>(b * width + r)] = -1;
        copy_to_device(dk.data(), k);
        copy_to_device(dv.data(), v);
        copy_to_device(dpos.data(), pos);
    }
    // Pages for every sequence's rows after the append (a paged cache's caller allocates them),
    // written to both tables.
    void reserve(const std::vector<std::int32_t>& indptr) {
        if (geo.P == 0) return;
        for (std::int64_t b = 0; b < geo.B; ++b) {
            const std::int64_t rows = lens[static_cast<std::size_t>(b)] + indptr[static_cast<std::size_t>(b + 1)] -
                                      indptr[static_cast<std::size_t>(b)];
            for (std::int64_t s = 0; s < (rows + geo.P - 1) / geo.P; ++s) {
                auto& e = table[static_cast<std::size_t>(b * stride + s)];
                if (e >= 0) continue;
                REQUIRE(!free.empty());
                e = free.back();
                free.pop_back();
            }
        }
        copy_to_device(dtable.data(), table);
    }
    // Device state == reference state, bit for bit.
    void compare() {
        INFO(geo.describe() << ", after " << step);
        REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
        CHECK(mirror == lens);
        CHECK(copy_to_host(dlens.data(), lens.size()) == lens);
        if (geo.P > 0) CHECK(copy_to_host(dtable.data(), table.size()) == table);
        const auto kd = copy_to_host(dk.data(), k.size()), vd = copy_to_host(dv.data(), v.size());
        const auto ik = first_diff(kd, k), iv = first_diff(vd, v);
        INFO("first K element that differs " << ik << ", first V element " << iv);
        CHECK(ik == -1);
        CHECK(iv == -1);
        if (with_pos) CHECK(copy_to_host(dpos.data(), pos.size()) == pos);
    }

    // Appends rows (values exact in every type) to every sequence: a[b] rows to sequence b, given to
    // both paths as TI [total, H_kv, d], token-major or (strided) head-major.
    template <class TI>
    void append(const std::vector<std::int32_t>& a, SplitMix64& rng, bool head_major = false) {
        step = "append";
        poison_dead();
        std::vector<std::int32_t> indptr{0};
        for (auto x : a) indptr.push_back(indptr.back() + x);
        const std::int64_t n = indptr.back(), Hkv = geo.Hkv, d = geo.d;
        reserve(indptr);
        std::vector<TI> kn(static_cast<std::size_t>(std::max<std::int64_t>(n, 1) * Hkv * d)), vn(kn.size());
        for (auto& x : kn) x = from_float<TI>(static_cast<float>(static_cast<int>(rng.below(512)) - 256) * 0.125f);
        for (auto& x : vn) x = from_float<TI>(static_cast<float>(static_cast<int>(rng.below(512)) - 256) * 0.125f);
        std::vector<std::int64_t> np(static_cast<std::size_t>(std::max<std::int64_t>(n, 1)));
        for (auto& p : np) p = static_cast<std::int64_t>(rng.below(1u << 30));
        auto view_of = [&](const TI* p) {
            return head_major ? View3<const TI>(p, {n, Hkv, d}, {d, n * d, 1}) : View3<const TI>(p, {n, Hkv, d});
        };
        reference::kv_batch_append(hview, std::span<std::int32_t>(lens), view_of(kn.data()), view_of(vn.data()), indptr,
                                   hpos(),
                                   with_pos ? View1<const std::int64_t>(np.data(), {n}) : View1<const std::int64_t>{});
        cuda::DeviceArray<TI> dkn(kn), dvn(vn);
        cuda::DeviceArray<std::int32_t> dind(indptr);
        cuda::DeviceArray<std::int64_t> dnp(np);
        cuda::kv_batch_append(
            dview, std::span<std::int32_t>(mirror), view_of(dkn.data()), view_of(dvn.data()), dind.data(), indptr,
            dposv(), with_pos ? View1<const std::int64_t>(dnp.data(), {n}) : View1<const std::int64_t>{}, nullptr, opt);
        compare();
    }

    // Compacts every sequence to its list (CSR), both paths; the device-array form or the host-vector form.
    void compact(const std::vector<std::vector<std::int32_t>>& lists, bool host_vector_form) {
        step = host_vector_form ? "batched compaction (host-vector form)" : "batched compaction";
        poison_dead();
        std::vector<std::int32_t> indptr{0}, keep;
        for (const auto& l : lists) {
            keep.insert(keep.end(), l.begin(), l.end());
            indptr.push_back(static_cast<std::int32_t>(keep.size()));
        }
        const auto freed_ref = reference::kv_batch_compact(hview, std::span<std::int32_t>(lens), indptr, keep, hpos());
        cuda::DeviceArray<std::int32_t> dind(indptr), dkeep(keep);
        std::vector<std::int32_t> freed;
        if (host_vector_form) {
            freed = cuda::kv_batch_compact(dview, std::span<std::int32_t>(mirror), indptr, dind.data(), dkeep.data(),
                                           dposv(), nullptr, opt);
        } else {
            const std::int64_t room = cuda::kv_batch_pages_released(dview, mirror, indptr);
            CHECK(room == static_cast<std::int64_t>(freed_ref.size()));
            cuda::DeviceArray<std::int32_t> out(static_cast<std::size_t>(room + 3));
            out.fill_bytes(0xff);
            const std::int64_t n =
                cuda::kv_batch_compact(dview, std::span<std::int32_t>(mirror), indptr, dind.data(), dkeep.data(),
                                       std::span<std::int32_t>(out.data(), out.size()), dposv(), nullptr, opt);
            CHECK(n == room);
            const auto all = out.download();
            freed.assign(all.begin(), all.begin() + n);
            for (std::size_t i = static_cast<std::size_t>(n); i < all.size(); ++i) CHECK(all[i] == -1);  // untouched
        }
        CHECK(freed == freed_ref);
        free.insert(free.end(), freed_ref.begin(), freed_ref.end());
        compare();
    }

    // Compacts sequence b alone.
    void compact_one(std::int64_t b, const std::vector<std::int32_t>& keep, bool host_vector_form) {
        step = "compaction of sequence " + std::to_string(b) + (host_vector_form ? " (host-vector form)" : "");
        poison_dead();
        const auto freed_ref = reference::kv_batch_compact(hview, std::span<std::int32_t>(lens), b, keep, hpos());
        cuda::DeviceArray<std::int32_t> dkeep(keep);
        const std::span<const std::int32_t> dk_span(dkeep.data(), keep.size());
        std::vector<std::int32_t> freed;
        if (host_vector_form) {
            freed = cuda::kv_batch_compact(dview, std::span<std::int32_t>(mirror), b, dk_span, dposv(), nullptr, opt);
        } else {
            cuda::DeviceArray<std::int32_t> out(freed_ref.size() + 2);
            out.fill_bytes(0xff);
            const std::int64_t n =
                cuda::kv_batch_compact(dview, std::span<std::int32_t>(mirror), b, dk_span,
                                       std::span<std::int32_t>(out.data(), out.size()), dposv(), nullptr, opt);
            const auto all = out.download();
            freed.assign(all.begin(), all.begin() + n);
            for (std::size_t i = static_cast<std::size_t>(n); i < all.size(); ++i) CHECK(all[i] == -1);
        }
        CHECK(freed == freed_ref);
        free.insert(free.end(), freed_ref.begin(), freed_ref.end());
        compare();
    }
};

// Keep lists: 0 every row, 1 one row, 2 random rows, 3 every other row, 4 a suffix, 5 every row but an
// early one (keep[i] = i + 1 from there on: each destination row is the source of the entry before).
std::vector<std::int32_t> keep_list(int kind, std::int64_t n, SplitMix64& rng) {
    std::vector<std::int32_t> k;
    for (std::int64_t r = 0; r < n; ++r) {
        bool take = false;
        switch (kind) {
            case 0:
                take = true;
                break;
            case 1:
                take = r == n / 2;
                break;
            case 2:
                take = rng.uniform() < 0.45 || r == n - 1;
                break;
            case 3:
                take = r % 2 == 1;
                break;
            case 4:
                take = r >= n / 3;
                break;
            default:
                take = r != std::min<std::int64_t>(3, n - 1) || n == 1;
                break;
        }
        if (take) k.push_back(static_cast<std::int32_t>(r));
    }
    if (k.empty() && n > 0) k.push_back(static_cast<std::int32_t>(n - 1));
    return k;
}

// Prefill (ragged, one sequence empty), then rounds of: batched compaction (each sequence its own kind
// of list), a decode-like append, a compaction of one sequence, an append of a few rows.
template <class T, class TI>
void run_chain(const Geometry& geo, bool with_pos, bool check_inputs, std::uint64_t seed, int rounds = 6) {
    INFO(geo.describe() << ", cache " << dtype_name(dtype_of<T>()) << ", new rows " << dtype_name(dtype_of<TI>())
                        << (with_pos ? ", positions" : "") << (check_inputs ? "" : ", check_inputs off") << ", seed "
                        << seed);
    Twin<T> tw(geo, with_pos, seed);
    tw.opt.check_inputs = check_inputs;
    SplitMix64 rng(seed);
    std::vector<std::int32_t> pre(static_cast<std::size_t>(geo.B));
    for (std::int64_t b = 0; b < geo.B; ++b)
        pre[static_cast<std::size_t>(b)] = b == 1 ? 0 : static_cast<std::int32_t>(geo.cap - 60 - 37 * b);
    tw.template append<TI>(pre, rng);
    for (int round = 0; round < rounds; ++round) {
        std::vector<std::vector<std::int32_t>> lists;
        for (std::int64_t b = 0; b < geo.B; ++b)
            lists.push_back(keep_list((round + static_cast<int>(b)) % 6, tw.lens[static_cast<std::size_t>(b)], rng));
        tw.compact(lists, round % 2 == 1);
        tw.template append<TI>(std::vector<std::int32_t>(static_cast<std::size_t>(geo.B), 1), rng, round % 3 == 2);
        const std::int64_t b = (round + 1) % geo.B;
        if (tw.lens[static_cast<std::size_t>(b)] > 0)
            tw.compact_one(b, keep_list((round + 3) % 6, tw.lens[static_cast<std::size_t>(b)], rng), round % 2 == 0);
        std::vector<std::int32_t> a(static_cast<std::size_t>(geo.B));
        for (auto& x : a) x = static_cast<std::int32_t>(rng.below(20));
        tw.template append<TI>(a, rng);
    }
}

std::vector<Geometry> layouts(std::int32_t d, std::int64_t cap) {
    std::vector<Geometry> r;
    Geometry g;
    g.d = d;
    g.cap = cap;
    r.push_back(g);
    for (std::int64_t P : {1, 16, 64})
        for (bool hnd : {false, true}) {
            g.P = P;
            g.hnd = hnd;
            r.push_back(g);
        }
    return r;
}

}  // namespace

TEMPLATE_TEST_CASE("cuda kv cache: append and compaction match the reference bit for bit, contiguous and paged",
                   "[cuda][kv_cache]", float, vlsparse::half, bfloat16) {
    using T = TestType;
    std::uint64_t seed = base_seed() + 3000 + sizeof(T);
    for (const auto& geo : layouts(64, 1500)) {
        ++seed;
        run_chain<T, T>(geo, /*with_pos=*/geo.P != 16, /*check_inputs=*/true, seed);
        // New rows of another type (converted), and the same steps without the device-side checks.
        if constexpr (std::is_same_v<T, float>) run_chain<T, bfloat16>(geo, geo.P == 16, false, seed + 100, 3);
        else run_chain<T, float>(geo, geo.P == 16, false, seed + 100, 3);
    }
}

TEMPLATE_TEST_CASE("cuda kv cache: head dims, unaligned views and the 16-, 4- and 2-byte paths", "[cuda][kv_cache]",
                   float, vlsparse::half, bfloat16) {
    using T = TestType;
    std::uint64_t seed = base_seed() + 4000 + sizeof(T);
    for (std::int32_t d : {33, 36, 40, 128})
        for (std::int64_t offset : {0, 1})
            for (std::int64_t P : {0, 16}) {
                Geometry g;
                g.B = 2;
                g.Hkv = 3;
                g.d = d;
                g.cap = 700;
                g.P = P;
                g.hnd = d == 36;
                g.offset = offset;
                run_chain<T, T>(g, offset == 1, true, ++seed, 3);
                if constexpr (!std::is_same_v<T, vlsparse::half>)
                    run_chain<T, vlsparse::half>(g, false, false, ++seed, 2);
            }
}

TEST_CASE("cuda kv cache: long sequences, shift-1 keep lists (every destination is a later source)",
          "[cuda][kv_cache]") {
    // 5000 rows: ~10 tiles of 512 rows per block; dropping row 3 makes row i + 1 -> i for every i >= 3,
    // so every row is written right after the entry before it read it.
    for (std::int64_t P : {0, 16}) {
        Geometry g;
        g.B = 2;
        g.Hkv = 4;
        g.d = 128;
        g.cap = 5200;
        g.P = P;
        INFO(g.describe());
        Twin<vlsparse::half> tw(g, true, base_seed() + 5000);
        SplitMix64 rng(base_seed() + 5001);
        tw.append<vlsparse::half>({5000, 4100}, rng);
        for (int i = 0; i < 3; ++i) {
            tw.compact({keep_list(5, tw.lens[0], rng), keep_list(5, tw.lens[1], rng)}, i == 1);
            tw.compact_one(0, keep_list(5, tw.lens[0], rng), false);
        }
        tw.compact({keep_list(3, tw.lens[0], rng), keep_list(2, tw.lens[1], rng)}, false);
        tw.append<vlsparse::half>({7, 900}, rng);
        tw.compact({keep_list(4, tw.lens[0], rng), keep_list(5, tw.lens[1], rng)}, false);
    }
}

TEST_CASE("cuda kv cache: hundreds of sequences (the released-pages scan over several chunks of 256)",
          "[cuda][kv_cache]") {
    Geometry g;
    g.B = 600;
    g.Hkv = 1;
    g.d = 8;
    g.cap = 12;
    g.P = 2;
    Twin<bfloat16> tw(g, true, base_seed() + 8000);
    SplitMix64 rng(base_seed() + 8001);
    for (int round = 0; round < 3; ++round) {
        std::vector<std::int32_t> a(static_cast<std::size_t>(g.B));
        for (std::int64_t b = 0; b < g.B; ++b)
            a[static_cast<std::size_t>(b)] = static_cast<std::int32_t>(
                rng.below(static_cast<std::uint64_t>(g.cap - tw.lens[static_cast<std::size_t>(b)] + 1)));
        tw.append<float>(a, rng);
        std::vector<std::vector<std::int32_t>> lists;
        for (std::int64_t b = 0; b < g.B; ++b)
            lists.push_back(keep_list(static_cast<int>(rng.below(6)), tw.lens[static_cast<std::size_t>(b)], rng));
        tw.compact(lists, round == 1);
    }
}

TEST_CASE("cuda kv cache: DeviceKvBatch uploads, appends and compacts as the reference, pages recycled",
          "[cuda][kv_cache]") {
    const std::int32_t B = 2, Hkv = 2, d = 16;
    const std::int64_t P = 4, n_pages = 12;
    for (bool paged : {false, true}) {
        INFO((paged ? "paged" : "contiguous"));
        auto dkv = paged ? cuda::DeviceKvBatch<bfloat16>::paged(B, n_pages, P, cuda::PageLayout::hnd, Hkv, d, 8)
                         : cuda::DeviceKvBatch<bfloat16>::contiguous(B, 32, Hkv, d);
        // The reference on a host copy of the same layout.
        std::vector<bfloat16> hk(static_cast<std::size_t>((paged ? n_pages * P : B * 32) * Hkv * d)), hv(hk.size());
        std::vector<std::int32_t> lens(B, 0), table(static_cast<std::size_t>(B * 8), -1);
        auto hview = paged ? paged_kv_batch_hnd<bfloat16>(hk.data(), hv.data(), B, n_pages, P, Hkv, d, table.data(), 8,
                                                          lens.data())
                           : contiguous_kv_batch<bfloat16>(hk.data(), hv.data(), B, 32, Hkv, d, lens.data());
        SplitMix64 rng(base_seed() + 6000);
        auto rows = [&](std::int64_t n) {
            std::vector<float> x(static_cast<std::size_t>(n * Hkv * d));
            for (auto& e : x) e = static_cast<float>(static_cast<int>(rng.below(256)) - 128) * 0.5f;
            return x;
        };
        auto logical = [&](std::int64_t b) {  // the reference's rows of sequence b, [len, H_kv, d]
            std::vector<bfloat16> kk, vv;
            for (std::int64_t r = 0; r < lens[static_cast<std::size_t>(b)]; ++r)
                for (std::int64_t g = 0; g < Hkv; ++g)
                    for (std::int64_t c = 0; c < d; ++c) {
                        kk.push_back(hview.k_row(b, r, g)[c]);
                        vv.push_back(hview.v_row(b, r, g)[c]);
                    }
            return std::make_pair(kk, vv);
        };
        auto same = [&](std::int64_t b) {
            const auto got = dkv.download_sequence(b);
            const auto want = logical(b);
            CHECK(first_diff(got.first, want.first) == -1);
            CHECK(first_diff(got.second, want.second) == -1);
            CHECK(dkv.seq_lens()[static_cast<std::size_t>(b)] == lens[static_cast<std::size_t>(b)]);
        };
        // Upload 13 rows into sequence 0 and 6 into 1 (host fp32 rows: converted to bf16).
        const auto k0 = rows(13), v0 = rows(13), k1 = rows(6), v1 = rows(6);
        dkv.upload_sequence(0, View3<const float>(k0.data(), {13, Hkv, d}),
                            View3<const float>(v0.data(), {13, Hkv, d}));
        dkv.upload_sequence(1, View3<const float>(k1.data(), {6, Hkv, d}), View3<const float>(v1.data(), {6, Hkv, d}));
        // The reference: pages 0..3 for sequence 0, 4..5 for sequence 1, as the free list hands them out.
        if (paged) {
            for (int s = 0; s < 4; ++s) table[static_cast<std::size_t>(s)] = s;
            for (int s = 0; s < 2; ++s) table[static_cast<std::size_t>(8 + s)] = 4 + s;
            CHECK(std::vector<std::int32_t>(dkv.block_table().begin(), dkv.block_table().end()) == table);
            CHECK(dkv.free_pages() == n_pages - 6);
        }
        std::vector<float> kk = k0, vv = v0;
        kk.insert(kk.end(), k1.begin(), k1.end());
        vv.insert(vv.end(), v1.begin(), v1.end());
        reference::kv_batch_append(hview, std::span<std::int32_t>(lens), View3<const float>(kk.data(), {19, Hkv, d}),
                                   View3<const float>(vv.data(), {19, Hkv, d}), std::vector<std::int32_t>{0, 13, 19});
        same(0);
        same(1);
        // Compact sequence 0 to 3 rows (pages 1..3 released), then both; then append from device rows.
        const std::vector<std::int32_t> keep0{2, 9, 12};
        const auto f0 = dkv.compact(0, keep0);
        CHECK(f0 == reference::kv_batch_compact(hview, std::span<std::int32_t>(lens), 0, keep0));
        if (paged) CHECK(dkv.free_pages() == n_pages - 3);
        same(0);
        const std::vector<std::int32_t> ind{0, 3, 5}, keep{0, 1, 2, 0, 5};
        const auto f1 = dkv.compact(ind, keep);
        CHECK(f1 == reference::kv_batch_compact(hview, std::span<std::int32_t>(lens), ind, keep));
        same(0);
        same(1);
        const auto kn = rows(9), vn = rows(9);
        const std::vector<std::int32_t> nind{0, 4, 9};
        std::vector<bfloat16> knb(kn.size()), vnb(vn.size());
        for (std::size_t i = 0; i < kn.size(); ++i) {
            knb[i] = bfloat16(kn[i]);
            vnb[i] = bfloat16(vn[i]);
        }
        cuda::DeviceArray<bfloat16> dkn(knb), dvn(vnb);
        if (paged) {  // the reference's caller allocates what DeviceKvBatch takes from its free list
            const auto t = dkv.block_table();
            const auto t0 = table;
            dkv.append(View3<const bfloat16>(dkn.data(), {9, Hkv, d}), View3<const bfloat16>(dvn.data(), {9, Hkv, d}),
                       nind);
            table.assign(t.begin(), t.end());
            for (std::size_t i = 0; i < t0.size(); ++i)
                if (t0[i] >= 0) CHECK(table[i] == t0[i]);  // pages in use stay where they were
        } else {
            dkv.append(View3<const bfloat16>(dkn.data(), {9, Hkv, d}), View3<const bfloat16>(dvn.data(), {9, Hkv, d}),
                       nind);
        }
        reference::kv_batch_append(hview, std::span<std::int32_t>(lens), View3<const bfloat16>(knb.data(), {9, Hkv, d}),
                                   View3<const bfloat16>(vnb.data(), {9, Hkv, d}), nind);
        same(0);
        same(1);
        // Errors leave the batch as it was: out of pages / capacity, a bad keep list.
        std::vector<float> big(static_cast<std::size_t>(40 * Hkv * d));
        CHECK_THAT(error_of([&] {
                       dkv.upload_sequence(1, View3<const float>(big.data(), {40, Hkv, d}),
                                           View3<const float>(big.data(), {40, Hkv, d}));
                   }),
                   Contains("cannot hold 40 rows"));
        CHECK_THAT(error_of([&] {
                       dkv.compact(1, std::vector<std::int32_t>{1, 0});
                   }),
                   Contains("keep list of sequence 1: entry 1 = 0 is not above entry 0 = 1"));
        same(0);
        same(1);
        if (paged) {
            cuda::DeviceArray<bfloat16> many(static_cast<std::size_t>(30 * Hkv * d));
            const auto t0 = std::vector<std::int32_t>(dkv.block_table().begin(), dkv.block_table().end());
            const auto free0 = dkv.free_pages();
            CHECK_THAT(error_of([&] {
                           dkv.append(View3<const bfloat16>(many.data(), {30, Hkv, d}),
                                      View3<const bfloat16>(many.data(), {30, Hkv, d}),
                                      std::vector<std::int32_t>{0, 0, 30});
                       }),
                       Contains("more than its block table holds"));
            CHECK(std::vector<std::int32_t>(dkv.block_table().begin(), dkv.block_table().end()) == t0);
            CHECK(dkv.free_pages() == free0);
            same(1);
        }
    }
}

TEST_CASE("cuda kv cache: bad input is a clear error and changes nothing", "[cuda][kv_cache][errors]") {
    // Two sequences of 5 and 3 rows in pages of 2 (NHD), fp16; a contiguous twin for its own errors.
    Geometry g;
    g.B = 2;
    g.Hkv = 1;
    g.d = 8;
    g.cap = 8;
    g.P = 2;
    Twin<vlsparse::half> tw(g, false, base_seed() + 7000);
    SplitMix64 rng(base_seed() + 7001);
    tw.append<vlsparse::half>({5, 3}, rng);
    const auto lens0 = tw.mirror;
    const auto table0 = tw.table;
    auto unchanged = [&] {
        tw.step = "a failed call";
        tw.compare();
    };
    using V = std::vector<std::int32_t>;
    const std::span<std::int32_t> M(tw.mirror);
    cuda::DeviceArray<vlsparse::half> nk(static_cast<std::size_t>(4 * 8));
    nk.fill_bytes(0);
    const View3<const vlsparse::half> kn(nk.data(), {4, 1, 8});
    auto app = [&](V indptr, const cuda::KvUpdateOptions& opt = {}) {
        cuda::DeviceArray<std::int32_t> di(indptr);
        cuda::kv_batch_append(tw.dview, M, kn, kn, di.data(), indptr, {}, {}, nullptr, opt);
    };
    auto cmp = [&](V indptr, V keep, const cuda::KvUpdateOptions& opt = {}) {
        cuda::DeviceArray<std::int32_t> di(indptr), dk(keep);
        return cuda::kv_batch_compact(tw.dview, M, indptr, di.data(), dk.data(), {}, nullptr, opt);
    };

    // Host-side checks: the reference's messages, under this function's name.
    CHECK_THAT(error_of([&] { app({0, 4}); }), Contains("cuda::kv_batch_append: new_indptr has 2 entries"));
    CHECK_THAT(error_of([&] { app({0, 3, 2}); }), Contains("expected non-decreasing offsets"));
    CHECK_THAT(error_of([&] { app({0, 1, 3}); }), Contains("new_indptr[batch] = 3 but k_new has 4 rows"));
    CHECK_THAT(error_of([&] {
                   app({0, 4, 4});
               }),
               Contains("sequence 0 holds 5 rows and gets 4 new ones: 9 rows exceed its capacity 8"));
    CHECK_THAT(error_of([&] {
                   cuda::DeviceArray<std::int32_t> di(V{0, 0, 4});
                   cuda::kv_batch_append(tw.dview, M, kn, View3<const vlsparse::half>(nk.data(), {3, 1, 8}), di.data(),
                                         V{0, 0, 4});
               }),
               Contains("v_new has shape [3, 1, 8], expected the shape of k_new"));
    CHECK_THAT(error_of([&] {
                   cuda::kv_batch_append(tw.dview, M, kn, kn, nullptr, V{0, 0, 4});
               }),
               Contains("new_indptr (device) is null"));
    CHECK_THAT(error_of([&] {
                   cmp({0, 0, 3}, {0, 1, 2});
               }),
               Contains("cuda::kv_batch_compact: the keep list of sequence 0 is empty"));
    CHECK_THAT(error_of([&] {
                   cmp({0, 6, 9}, {0, 1, 2, 3, 4, 4, 0, 1, 2});
               }),
               Contains("the keep list of sequence 0 has 6 entries but the sequence holds 5 rows"));
    CHECK_THAT(error_of([&] {
                   cuda::DeviceArray<std::int32_t> out(1);
                   cuda::DeviceArray<std::int32_t> di(V{0, 1, 2}), dk(V{0, 0});
                   cuda::kv_batch_compact(tw.dview, M, V{0, 1, 2}, di.data(), dk.data(),
                                          std::span<std::int32_t>(out.data(), 1));
               }),
               Contains("freed_pages has room for 1 pages but this compaction releases 3"));
    CHECK_THAT(error_of([&] {
                   cuda::DeviceArray<std::int32_t> dk(V{0});
                   cuda::kv_batch_compact(tw.dview, M, 2, std::span<const std::int32_t>(dk.data(), 1));
               }),
               Contains("sequence 2, expected 0 <= b < batch = 2"));
    CHECK_THAT(error_of([&] { cuda::kv_batch_compact(tw.dview, M, 1, std::span<const std::int32_t>{}); }),
               Contains("the keep list of sequence 1 is empty"));
    {
        auto bad = tw.dview;
        bad.row_stride = 4;  // rows of d = 8 overlap
        cuda::DeviceArray<std::int32_t> di(V{0, 0, 0});
        const View3<const vlsparse::half> none(nk.data(), {0, 1, 8});
        CHECK_THAT(error_of([&] {
                       cuda::kv_batch_append(bad, M, none, none, di.data(), V{0, 0, 0});
                   }),
                   Contains("overlap"));
    }
    unchanged();

    // What only the device holds, checked with check_inputs (the default).
    tw.mirror[1] = 2;  // the host mirror disagrees with the device lengths
    CHECK_THAT(error_of([&] { app({0, 0, 4}); }), Contains("the device seq_lens[1] = 3 but the host copy says 2"));
    tw.mirror = lens0;
    CHECK_THAT(error_of([&] {
                   cuda::DeviceArray<std::int32_t> di(V{0, 1, 4});
                   cuda::kv_batch_append(tw.dview, M, kn, kn, di.data(), V{0, 0, 4});
               }),
               Contains("the device new_indptr[1] = 1 but the host copy says 0"));
    CHECK_THAT(error_of([&] {
                   cmp({0, 2, 3}, {3, 1, 0});
               }),
               Contains("keep list of sequence 0: entry 1 = 1 is not above entry 0 = 3"));
    CHECK_THAT(error_of([&] {
                   cmp({0, 2, 3}, {0, 5, 0});
               }),
               Contains("keep list of sequence 0: entry 1 = 5, expected a row in [0, 5)"));
    // Sequence 1 needs slot 2 (its rows 3..6): still -1 in the table.
    CHECK_THAT(error_of([&] { app({0, 0, 4}); }), Contains("block_table[1][2] = -1, expected a page in [0, 12)"));
    // Sequence 1's slot 1 is page X of sequence 0: compacting 1 would write a page 0 uses.
    tw.table[static_cast<std::size_t>(tw.stride + 1)] = tw.table[0];
    copy_to_device(tw.dtable.data(), tw.table);
    CHECK_THAT(error_of([&] {
                   cmp({0, 5, 7}, {0, 1, 2, 3, 4, 0, 2});
               }),
               Contains("(block_table[1][1]) is written or released by this update but used 2 times"));
    tw.table = table0;
    copy_to_device(tw.dtable.data(), tw.table);
    // fp32 rows beyond fp16's range.
    {
        std::vector<float> big(8, 1.0f);
        big[5] = 1e6f;
        cuda::DeviceArray<float> db(big);
        cuda::DeviceArray<std::int32_t> di(V{0, 0, 1});
        tw.reserve(V{0, 0, 1});
        const auto table1 = tw.table;
        CHECK_THAT(error_of([&] {
                       cuda::kv_batch_append(tw.dview, M, View3<const float>(db.data(), {1, 1, 8}),
                                             View3<const float>(db.data(), {1, 1, 8}), di.data(), V{0, 0, 1});
                   }),
                   Contains("k_new[0, 0, 5] = 1e+06 overflows the cache's fp16"));
        CHECK(tw.table == table1);
    }
    unchanged();
    CHECK(tw.mirror == lens0);
}
