// vlsparse/cuda/kv_cache.cuh -- the two updates of a batch of KV caches (vlsparse/kv/kv_batch.hpp) on
// the GPU: appending new tokens and compacting sequences to keep lists, in place, for contiguous and
// paged caches (namespace vlsparse::cuda).
//
//   append:   rows n_b .. n_b + a_b - 1 of sequence b  <-  its a_b new rows;   n_b += a_b
//   compact:  row i of sequence b  <-  row keep_b[i]   (i = 0 .. m_b - 1);      n_b  = m_b
//
// The semantics, checks and error messages of reference::kv_batch_append / kv_batch_compact
// (vlsparse/reference/kv_batch.hpp, which this header includes for its host-side checks), and the
// same bytes: appended rows converted through fp32 with vlsparse::from_float (rows of the cache's own
// type copied bit for bit), kept rows moved, released pages listed in slot order and their block-table
// slots set to -1, rows past a sequence's new length left stale. A-VL's and ZipVL's KV eviction and
// H2O's decode eviction all go through `kv_batch_compact`.
//
// Device pointers throughout (the cache view, k_new / v_new, indptr and keep arrays, positions,
// freed pages); host copies of the metadata the caller always has on the host -- seq_lens and the
// indptr arrays -- are passed beside them, as FlashInfer's plan takes them. The host copy of seq_lens
// is the caller's mirror: both it and the device seq_lens are updated (the device one on the stream).
// Stream-ordered: nothing synchronizes unless opt.check_inputs is set (the default), which downloads
// what only the device holds (its seq_lens, the device indptr and keep lists, the block-table rows in
// use), checks it as the reference does and throws before anything changes. Engines switch it off in
// the decode loop. Without it the kernels still never touch memory outside the rows, pages and arrays
// the metadata names (out-of-range list or table entries are skipped), but wrong metadata then gives
// wrong contents. Every CUDA status is checked; device code never throws.
//
// Compaction in place, race-free (see kv_compact_kernel): one thread block per (sequence, KV head, K or
// V, 32-byte column strip) walks the keep list in tiles, reading tile t + 1's source rows before
// writing tile t's destination rows, one barrier per tile. Blocks touch disjoint bytes; inside a
// block every row is read before it is overwritten because a row x is only read by list entries
// j <= x, which belong to tile(x) or an earlier tile. No scratch memory.
//
// DeviceKvBatch<T> is an owning device cache (contiguous or paged, with a host-side page allocator)
// for tests, benchmarks and the simulator. Include: this header, from a .cu translation unit (nvcc,
// C++20).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "vlsparse/core/dtype.hpp"
#include "vlsparse/core/error.hpp"
#include "vlsparse/core/tensor.hpp"
#include "vlsparse/cuda/common.cuh"
#include "vlsparse/kv/kv_batch.hpp"
#include "vlsparse/reference/kv_batch.hpp"

namespace vlsparse::cuda {

struct KvUpdateOptions {
    // Download and check what only the device holds before anything changes (waits for the stream).
    bool check_inputs = true;
};

namespace detail {

inline constexpr int kKvThreads = 256;
inline constexpr int kKvCompactRows = 4;  // rows per thread per tile of kv_compact_kernel
inline constexpr int kKvStripBytes = 32;  // column strip of one compaction block: one DRAM sector

// ---- append ------------------------------------------------------------------------------------

template <class T>
struct alignas(16) KvPack8 {
    T x[8];
};

// Thread-per-(new row, KV head, K or V, 8 columns): copies 8 elements of a new row into the cache,
// converted through fp32 when the types differ. Vec: d % 8 == 0, unit column stride and 16-byte
// aligned rows on both sides, so the 8 elements are one or two 16-byte loads and stores. The
// destination row is read from the device seq_lens, which a second kernel advances afterwards.
template <class T, class TI, bool Vec>
__global__ void __launch_bounds__(kKvThreads)
    kv_append_kernel(KvBatchView<T> c, View3<const TI> kn, View3<const TI> vn, const std::int32_t* indptr,
                     std::int64_t total_new, View2<std::int64_t> pos, View1<const std::int64_t> npos) {
    const std::int64_t chunks = (c.head_dim + 7) / 8;
    const std::int64_t per_row = static_cast<std::int64_t>(c.n_kv_heads) * 2 * chunks;
    const std::int64_t items = total_new * per_row;
    for (std::int64_t it = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; it < items;
         it += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
        const std::int64_t t = it / per_row;
        std::int64_t rem = it % per_row;
        const std::int64_t ch = rem % chunks;
        rem /= chunks;
        const int kv = static_cast<int>(rem % 2);
        const std::int64_t g = rem / 2;
        // The sequence owning new row t: the last b with indptr[b] <= t.
        std::int32_t lo = 0, hi = c.batch;
        while (hi - lo > 1) {
            const std::int32_t mid = lo + (hi - lo) / 2;
            if (indptr[mid] <= t) lo = mid;
            else hi = mid;
        }
        const std::int64_t b = lo;
        const std::int64_t r = static_cast<std::int64_t>(c.seq_lens[b]) + (t - indptr[b]);
        if (r < 0 || r >= c.capacity()) continue;  // only with metadata the host did not check
        if (c.block_table) {
            const std::int32_t page = c.block_table[b * c.block_table_stride + r / c.page_size];
            if (page < 0 || page >= c.n_pages) continue;
        }
        T* dst = (kv ? c.v : c.k) + c.offset(b, r, g) + ch * 8;
        // K or V: pointer and strides picked one by one (a reference to either view would copy the
        // kernel parameters to the stack).
        const TI* src = kv ? vn.data : kn.data;
        const std::int64_t s2 = kv ? vn.stride[2] : kn.stride[2];
        src += t * (kv ? vn.stride[0] : kn.stride[0]) + g * (kv ? vn.stride[1] : kn.stride[1]) + ch * 8 * s2;
        if constexpr (Vec) {
            const KvPack8<TI> a = *reinterpret_cast<const KvPack8<TI>*>(src);
            if constexpr (std::is_same_v<T, TI>) {
                *reinterpret_cast<KvPack8<T>*>(dst) = a;
            } else {
                KvPack8<T> o;
#pragma unroll
                for (int e = 0; e < 8; ++e) o.x[e] = from_float<T>(to_float(a.x[e]));
                *reinterpret_cast<KvPack8<T>*>(dst) = o;
            }
        } else {
            const std::int64_t n = c.head_dim - ch * 8 < 8 ? c.head_dim - ch * 8 : 8;
            for (std::int64_t e = 0; e < n; ++e) {
                if constexpr (std::is_same_v<T, TI>) dst[e] = src[e * s2];
                else dst[e] = from_float<T>(to_float(src[e * s2]));
            }
        }
        if (pos.data && g == 0 && kv == 0 && ch == 0 && r < pos.shape[1]) pos(b, r) = npos(t);
    }
}

// seq_lens[b] += a_b, after kv_append_kernel has read the old lengths.
template <int Unused = 0>
__global__ void kv_add_lengths_kernel(std::int32_t* seq_lens, const std::int32_t* indptr, std::int32_t batch) {
    for (std::int64_t b = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; b < batch;
         b += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
        seq_lens[b] += indptr[b + 1] - indptr[b];
}

// ---- compaction --------------------------------------------------------------------------------

// A compaction's device-side description. Byte strides: the kernel moves bytes, whatever T is.
struct KvCompactParams {
    unsigned char* k = nullptr;
    unsigned char* v = nullptr;
    std::int64_t page_size = 0, page_stride = 0, row_stride = 0, head_stride = 0;  // bytes (page_size: rows)
    std::int64_t n_pages = 0;
    std::int32_t* block_table = nullptr;  // null: contiguous
    std::int64_t table_stride = 0;
    std::int32_t* seq_lens = nullptr;           // device: the old lengths (rewritten by kv_release_kernel)
    const std::int32_t* keep_indptr = nullptr;  // device [batch + 1]; null: the one sequence seq0
    const std::int32_t* keep = nullptr;
    std::int64_t keep_total = 0;  // entries of `keep` (host-known): no list entry is read past it
    std::int64_t row_limit = 0;   // rows a sequence may hold here: capacity (and the positions' width)
    std::int32_t batch = 0, seq0 = 0, single_len = 0;
    std::int32_t n_kv_heads = 0;
    std::int32_t row_units = 0;    // units of U in a row (d * sizeof(T) / sizeof(U))
    std::int32_t strip_units = 0;  // units per column strip (<= row_units)
    std::int32_t n_strips = 0;
    View2<std::int64_t> pos;        // optional positions [batch, >= rows]
    std::int32_t* freed = nullptr;  // device out: released pages
    std::int64_t freed_capacity = 0;
};

// Byte offset of row r of sequence b (head 0, column 0); false when its block-table entry is outside
// the pool (metadata the host did not check).
__device__ __forceinline__ bool kv_row_offset(const KvCompactParams& p, std::int64_t b, std::int64_t r,
                                              std::int64_t& off) {
    std::int64_t page = b;
    if (p.block_table) {
        page = p.block_table[b * p.table_stride + r / p.page_size];
        if (page < 0 || page >= p.n_pages) return false;
    }
    off = page * p.page_stride + (r % p.page_size) * p.row_stride;
    return true;
}

// In-place compaction of one (sequence b, KV head g, K or V, column strip) per block.
//
// Wanted: new[i] = old[keep[i]] for i < m, keep ascending and unique, so keep[i] >= i. Entry i writes
// row i and reads row keep[i]; a row x is therefore read only by the entry j with keep[j] = x, and
// j <= x. The only hazard is writing row x before entry j has read it (write-after-read); the old
// values are all a row ever needs, never a value this kernel wrote.
//
// The block walks the entries from f (the first with keep[i] != i: entries below f keep their row in
// place; valid lists have keep[i] == i below f and keep[i] > i from f on, found by binary search) in
// tiles of TR = R x (256 / strip units) entries. Prologue: load tile 0's source rows into registers,
// barrier. Iteration t: load tile t + 1's sources, store tile t's destinations, barrier. Row x is
// written in iteration tile(x); its only reader j <= x is in tile(j) <= tile(x), loaded in iteration
// tile(j) - 1 (or the prologue), which ended with a barrier before iteration tile(x) began; bar.sync
// orders the block's global accesses (a load before it is performed before a store after it).
// Loading tile t + 1 while storing tile t is safe: tile t + 1 reads rows >= its first entry, which tile
// t never writes. Other blocks touch other (head, K/V, column) bytes or other sequences' pages (the
// host checks that written pages are not shared). Thread -> (row of the tile, unit of the strip).
template <class U, int R>
__global__ void __launch_bounds__(kKvThreads) kv_compact_kernel(KvCompactParams p) {
    std::int64_t blk = blockIdx.x;
    const std::int32_t strip = static_cast<std::int32_t>(blk % p.n_strips);
    blk /= p.n_strips;
    const int kv = static_cast<int>(blk % 2);
    blk /= 2;
    const std::int64_t g = blk % p.n_kv_heads;
    const std::int64_t b = p.keep_indptr ? blk / p.n_kv_heads : p.seq0;
    // Lengths clamped to what the host knows is addressable (they only differ from the host's copies,
    // which passed its checks, when check_inputs was off and the device metadata is wrong).
    const std::int64_t start = p.keep_indptr ? p.keep_indptr[b] : 0;
    std::int64_t m = p.keep_indptr ? p.keep_indptr[b + 1] - start : p.single_len;
    if (start < 0 || start > p.keep_total || m < 0) m = 0;
    m = m < p.keep_total - start ? m : p.keep_total - start;
    const std::int64_t old = p.seq_lens[b] < p.row_limit ? p.seq_lens[b] : p.row_limit;
    const std::int32_t* keep = p.keep + start;

    __shared__ std::int64_t first_s;
    if (threadIdx.x == 0) {
        std::int64_t lo = 0, hi = m;  // first entry with keep[i] != i
        while (lo < hi) {
            const std::int64_t mid = lo + (hi - lo) / 2;
            if (keep[mid] == mid) lo = mid + 1;
            else hi = mid;
        }
        first_s = lo;
    }
    __syncthreads();
    const std::int64_t f = first_s;
    if (f >= m) return;  // nothing moves (uniform over the block)

    const int su = p.strip_units;
    const int rows_per_pass = kKvThreads / su;
    const int lane = static_cast<int>(threadIdx.x) % su, rr = static_cast<int>(threadIdx.x) / su;
    const bool active = rr < rows_per_pass && strip * su + lane < p.row_units;
    const std::int64_t tile = static_cast<std::int64_t>(rows_per_pass) * R;
    unsigned char* base = kv ? p.v : p.k;
    const std::int64_t col =
        g * p.head_stride + static_cast<std::int64_t>(strip * su + lane) * static_cast<std::int64_t>(sizeof(U));
    const bool with_pos = p.pos.data != nullptr && g == 0 && kv == 0 && strip == 0 && lane == 0;

    U cur[R], nxt[R];
    std::int64_t cur_dst[R], nxt_dst[R], cur_pos[R], nxt_pos[R];
    bool cur_ok[R], nxt_ok[R];
    // Loads the source rows of the tile starting at entry t0 (registers: values, destination offsets).
    auto load = [&](std::int64_t t0, U* val, std::int64_t* dst, std::int64_t* pv, bool* ok) {
#pragma unroll
        for (int j = 0; j < R; ++j) {
            const std::int64_t i = t0 + rr + static_cast<std::int64_t>(j) * rows_per_pass;
            ok[j] = false;
            if (!active || i >= m) continue;
            const std::int64_t src = keep[i];
            std::int64_t so = 0, dof = 0;
            if (src == i || src < 0 || src >= old || i >= old) continue;  // in place, or unchecked bad entries
            if (!kv_row_offset(p, b, src, so) || !kv_row_offset(p, b, i, dof)) continue;
            val[j] = *reinterpret_cast<const U*>(base + so + col);
            dst[j] = dof;
            if (with_pos) pv[j] = p.pos(b, src);
            ok[j] = true;
        }
    };
    auto store = [&](const U* val, const std::int64_t* dst, const std::int64_t* pv, const bool* ok, std::int64_t t0) {
#pragma unroll
        for (int j = 0; j < R; ++j) {
            if (!ok[j]) continue;
            *reinterpret_cast<U*>(base + dst[j] + col) = val[j];
            if (with_pos) p.pos(b, t0 + rr + static_cast<std::int64_t>(j) * rows_per_pass) = pv[j];
        }
    };

    load(f, cur, cur_dst, cur_pos, cur_ok);
    __syncthreads();
    for (std::int64_t t0 = f; t0 < m; t0 += tile) {
        if (t0 + tile < m) {
            load(t0 + tile, nxt, nxt_dst, nxt_pos, nxt_ok);
        } else {
#pragma unroll
            for (int j = 0; j < R; ++j) nxt_ok[j] = false;
        }
        store(cur, cur_dst, cur_pos, cur_ok, t0);
        __syncthreads();
#pragma unroll
        for (int j = 0; j < R; ++j) {
            cur[j] = nxt[j];
            cur_dst[j] = nxt_dst[j];
            cur_pos[j] = nxt_pos[j];
            cur_ok[j] = nxt_ok[j];
        }
    }
}

// One block, after kv_compact_kernel: for every compacted sequence (in order) lists the pages past
// its kept rows -- slots ceil(m / P) .. ceil(old / P) - 1 -- into `freed` at the running offset (a
// block-wide scan of the per-sequence counts), sets those slots to -1, and writes seq_lens[b] = m.
template <int Unused = 0>
__global__ void __launch_bounds__(kKvThreads) kv_release_kernel(KvCompactParams p) {
    __shared__ std::int64_t scan[kKvThreads];
    __shared__ std::int64_t carry;
    const int tid = static_cast<int>(threadIdx.x);
    const std::int64_t nseq = p.keep_indptr ? p.batch : 1;
    if (tid == 0) carry = 0;
    __syncthreads();
    for (std::int64_t base = 0; base < nseq; base += kKvThreads) {
        const std::int64_t i = base + tid;
        const std::int64_t b = p.keep_indptr ? i : p.seq0;
        std::int64_t count = 0, first = 0, m = 0;
        if (i < nseq) {
            m = p.keep_indptr ? p.keep_indptr[b + 1] - p.keep_indptr[b] : p.single_len;
            m = m < 0 ? 0 : m < p.row_limit ? m : p.row_limit;  // as in kv_compact_kernel
            if (p.block_table) {
                first = (m + p.page_size - 1) / p.page_size;
                std::int64_t last = (static_cast<std::int64_t>(p.seq_lens[b]) + p.page_size - 1) / p.page_size;
                if (last > p.table_stride) last = p.table_stride;
                count = last > first ? last - first : 0;
            }
        }
        scan[tid] = count;
        __syncthreads();
        for (int off = 1; off < kKvThreads; off <<= 1) {  // inclusive scan (Hillis-Steele)
            const std::int64_t add = tid >= off ? scan[tid - off] : 0;
            __syncthreads();
            scan[tid] += add;
            __syncthreads();
        }
        const std::int64_t out = carry + scan[tid] - count;
        if (i < nseq) {
            for (std::int64_t s = 0; s < count; ++s) {
                std::int32_t& e = p.block_table[b * p.table_stride + first + s];
                if (out + s < p.freed_capacity) p.freed[out + s] = e;
                e = -1;
            }
            p.seq_lens[b] = static_cast<std::int32_t>(m);
        }
        __syncthreads();
        if (tid == kKvThreads - 1) carry += scan[tid];
        __syncthreads();
    }
}

// ---- host side ---------------------------------------------------------------------------------

template <class T>
std::vector<T> kv_download(const T* dev, std::size_t n, cudaStream_t stream, const char* fn) {
    std::vector<T> h(n);
    if (n > 0) {
        check_cuda(cudaMemcpyAsync(h.data(), dev, n * sizeof(T), cudaMemcpyDeviceToHost, stream), fn,
                   "cudaMemcpyAsync");
        check_cuda(cudaStreamSynchronize(stream), fn, "cudaStreamSynchronize");
    }
    return h;
}

// With check_inputs: the device seq_lens must equal the host mirror.
template <class T>
void kv_check_device_lengths(const KvBatchView<T>& cache, std::span<const std::int32_t> seq_lens_host,
                             cudaStream_t stream, const char* fn) {
    const auto dev = kv_download(cache.seq_lens, seq_lens_host.size(), stream, fn);
    for (std::size_t b = 0; b < dev.size(); ++b)
        require(dev[b] == seq_lens_host[b], fn, "the device seq_lens[", b, "] = ", dev[b], " but the host copy says ",
                seq_lens_host[b], "; expected the same lengths");
}

inline void kv_check_device_indptr(const std::int32_t* dev_ptr, std::span<const std::int32_t> host, const char* name,
                                   cudaStream_t stream, const char* fn) {
    const auto dev = kv_download(dev_ptr, host.size(), stream, fn);
    for (std::size_t i = 0; i < dev.size(); ++i)
        require(dev[i] == host[i], fn, "the device ", name, "[", i, "] = ", dev[i], " but the host copy says ", host[i],
                "; expected the same offsets");
}

// With check_inputs, when T is a 16-bit type and TI another type: the new rows (downloaded) must
// convert without a finite value turning into inf, as the reference checks.
template <class T, class TI>
void kv_check_device_narrowing(const View3<const TI>& x, const char* name, cudaStream_t stream, const char* fn) {
    if constexpr (!std::is_same_v<std::remove_const_t<TI>, T> && !std::is_same_v<T, float>) {
        if (x.numel() == 0) return;
        std::int64_t extent = 1;  // elements from x.data to its last element
        for (int i = 0; i < 3; ++i) extent += (x.shape[i] - 1) * x.stride[i];
        const auto h = kv_download(x.data, static_cast<std::size_t>(extent), stream, fn);
        ::vlsparse::reference::detail::check_narrowing<T>(View3<const TI>(h.data(), x.shape, x.stride), name, fn);
    }
}

// 16, 4 or 2: the widest unit that divides a row's bytes, the pointers and every stride of the cache.
template <class T>
int kv_unit_bytes(const KvBatchView<T>& c) {
    const std::int64_t es = static_cast<std::int64_t>(sizeof(T));
    for (int u : {16, 4, 2}) {
        const bool ok = (c.head_dim * es) % u == 0 && reinterpret_cast<std::uintptr_t>(c.k) % u == 0 &&
                        reinterpret_cast<std::uintptr_t>(c.v) % u == 0 && (c.page_stride * es) % u == 0 &&
                        (c.row_stride * es) % u == 0 && (c.head_stride * es) % u == 0;
        if (ok) return u;
    }
    return 2;  // unreachable for fp32 / fp16 / bf16 (2-byte aligned elements)
}

template <class T>
bool kv_aligned16(const T* p, std::initializer_list<std::int64_t> strides) {
    if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0) return false;
    for (auto s : strides)
        if ((s * static_cast<std::int64_t>(sizeof(T))) % 16 != 0) return false;
    return true;
}

inline unsigned kv_grid(std::int64_t items) {
    const std::int64_t blocks = (items + kKvThreads - 1) / kKvThreads;
    return static_cast<unsigned>(std::clamp<std::int64_t>(blocks, 1, 1 << 16));
}

template <class U>
void kv_launch_compact(const KvCompactParams& p, std::int64_t blocks, cudaStream_t stream, const char* fn) {
    kv_compact_kernel<U, kKvCompactRows><<<static_cast<unsigned>(blocks), kKvThreads, 0, stream>>>(p);
    check_launch(fn, "kv_compact_kernel");
}

// Both public forms: keep_indptr (device) non-null compacts every sequence (CSR; keep_indptr_host its
// host copy), null compacts sequence `only` to its `only_len` entries of `keep`. Returns the number of
// pages released (written to freed).
template <class T>
std::int64_t kv_compact(KvBatchView<T> cache, std::span<std::int32_t> seq_lens_host,
                        std::span<const std::int32_t> keep_indptr_host, const std::int32_t* keep_indptr,
                        const std::int32_t* keep, std::int64_t only, std::int64_t only_len,
                        std::span<std::int32_t> freed, View2<std::int64_t> positions, cudaStream_t stream,
                        const KvUpdateOptions& opt, const char* fn) {
    static_assert(!std::is_const_v<T>, "a cache update needs a writable view: KvBatchView<T> with T not const");
    namespace rd = ::vlsparse::reference::detail;
    rd::check_update_layout(cache, seq_lens_host, fn);
    const std::int64_t B = cache.batch, P = cache.page_size;
    const bool batched = keep_indptr != nullptr || !keep_indptr_host.empty();
    std::int64_t total_keep = 0;
    if (batched) {
        rd::check_keep_indptr(keep_indptr_host, seq_lens_host, fn);
        require(keep_indptr != nullptr, fn, "keep_indptr (device) is null");
        total_keep = keep_indptr_host[static_cast<std::size_t>(B)];
    } else {
        require(only >= 0 && only < B, fn, "sequence ", only, ", expected 0 <= b < batch = ", B);
        const std::int64_t len = seq_lens_host[static_cast<std::size_t>(only)];
        require(only_len <= len, fn, "the keep list of sequence ", only, " has ", only_len,
                " entries but the sequence holds ", len, " rows");
        require(only_len >= 1 || len == 0, fn, "the keep list of sequence ", only,
                " is empty; expected at least one row (to evict every row, drop the sequence)");
        total_keep = only_len;
    }
    require(total_keep == 0 || keep != nullptr, fn, "keep (device) is null");
    auto kept = [&](std::int64_t b) -> std::int64_t {
        if (batched)
            return keep_indptr_host[static_cast<std::size_t>(b + 1)] - keep_indptr_host[static_cast<std::size_t>(b)];
        return b == only ? only_len : seq_lens_host[static_cast<std::size_t>(b)];
    };
    std::int64_t longest = 0, n_freed = 0;
    for (std::int64_t b = 0; b < B; ++b) {
        const std::int64_t n = seq_lens_host[static_cast<std::size_t>(b)];
        longest = std::max(longest, n);
        if (cache.paged()) n_freed += rd::pages_for(n, P) - rd::pages_for(kept(b), P);
    }
    if (positions.data) rd::check_positions(positions, B, longest, fn);
    require(static_cast<std::int64_t>(freed.size()) >= n_freed, fn, "freed_pages has room for ", freed.size(),
            " pages but this compaction releases ", n_freed);
    require(n_freed == 0 || freed.data() != nullptr, fn, "freed_pages (device) is null");

    if (opt.check_inputs) {
        kv_check_device_lengths(cache, seq_lens_host, stream, fn);
        if (batched) kv_check_device_indptr(keep_indptr, keep_indptr_host, "keep_indptr", stream, fn);
        const auto lists = kv_download(keep, static_cast<std::size_t>(total_keep), stream, fn);
        auto list = [&](std::int64_t b) -> std::span<const std::int32_t> {
            if (batched)
                return std::span<const std::int32_t>(lists).subspan(
                    static_cast<std::size_t>(keep_indptr_host[static_cast<std::size_t>(b)]),
                    static_cast<std::size_t>(kept(b)));
            return b == only ? std::span<const std::int32_t>(lists) : std::span<const std::int32_t>{};
        };
        for (std::int64_t b = 0; b < B; ++b)
            if (batched || b == only) rd::check_keep_list(list(b), b, seq_lens_host[static_cast<std::size_t>(b)], fn);
        if (cache.paged()) {
            const auto table =
                kv_download(cache.block_table, static_cast<std::size_t>(B * cache.block_table_stride), stream, fn);
            // As the reference: pages from the first moved row's on are written or released.
            std::vector<std::int64_t> in_use(static_cast<std::size_t>(B)), from(static_cast<std::size_t>(B));
            for (std::int64_t b = 0; b < B; ++b) {
                const std::int64_t n = seq_lens_host[static_cast<std::size_t>(b)], m = kept(b);
                in_use[static_cast<std::size_t>(b)] = rd::pages_for(n, P);
                if (!batched && b != only) {
                    from[static_cast<std::size_t>(b)] = in_use[static_cast<std::size_t>(b)];
                    continue;
                }
                const std::int64_t f = rd::first_moved(list(b));
                from[static_cast<std::size_t>(b)] = f < m ? f / P : rd::pages_for(m, P);
            }
            rd::check_pages(table, cache.block_table_stride, cache.n_pages, in_use, from, fn);
        }
    }

    const std::int64_t es = static_cast<std::int64_t>(sizeof(T));
    const int unit = kv_unit_bytes(cache);
    KvCompactParams p;
    p.k = reinterpret_cast<unsigned char*>(cache.k);
    p.v = reinterpret_cast<unsigned char*>(cache.v);
    p.page_size = P;
    p.page_stride = cache.page_stride * es;
    p.row_stride = cache.row_stride * es;
    p.head_stride = cache.head_stride * es;
    p.n_pages = cache.n_pages;
    p.block_table = const_cast<std::int32_t*>(cache.block_table);  // written: released slots become -1
    p.table_stride = cache.block_table_stride;
    p.seq_lens = const_cast<std::int32_t*>(cache.seq_lens);  // written: the new lengths
    p.keep_indptr = batched ? keep_indptr : nullptr;
    p.keep = keep;
    p.keep_total = total_keep;
    p.row_limit = positions.data ? std::min(cache.capacity(), positions.shape[1]) : cache.capacity();
    p.batch = cache.batch;
    p.seq0 = batched ? 0 : static_cast<std::int32_t>(only);
    p.single_len = batched ? 0 : static_cast<std::int32_t>(only_len);
    p.n_kv_heads = cache.n_kv_heads;
    p.row_units = static_cast<std::int32_t>(cache.head_dim * es / unit);
    p.strip_units = std::min<std::int32_t>(kKvStripBytes / unit, p.row_units);
    p.n_strips = (p.row_units + p.strip_units - 1) / p.strip_units;
    p.pos = positions;
    p.freed = freed.data();
    p.freed_capacity = static_cast<std::int64_t>(freed.size());
    const std::int64_t nseq = batched ? B : 1;
    const std::int64_t blocks = nseq * cache.n_kv_heads * 2 * p.n_strips;
    require(blocks <= std::numeric_limits<std::int32_t>::max(), fn, "batch x H_kv x 2 x column strips = ", blocks,
            " thread blocks, more than one launch takes");
    if (total_keep > 0) {
        if (unit == 16) kv_launch_compact<uint4>(p, blocks, stream, fn);
        else if (unit == 4) kv_launch_compact<unsigned>(p, blocks, stream, fn);
        else kv_launch_compact<unsigned short>(p, blocks, stream, fn);
    }
    kv_release_kernel<><<<1, kKvThreads, 0, stream>>>(p);
    check_launch(fn, "kv_release_kernel");
    for (std::int64_t b = 0; b < B; ++b)
        seq_lens_host[static_cast<std::size_t>(b)] = static_cast<std::int32_t>(kept(b));
    return n_freed;
}

// The host-vector forms: a stream-allocated buffer for the released pages, downloaded (synchronizes).
template <class F>
std::vector<std::int32_t> kv_freed_to_host(std::int64_t n_freed, cudaStream_t stream, const char* fn, F&& run) {
    std::int32_t* d = nullptr;
    if (n_freed > 0)
        check_cuda(cudaMallocAsync(reinterpret_cast<void**>(&d),
                                   static_cast<std::size_t>(n_freed) * sizeof(std::int32_t), stream),
                   fn, "cudaMallocAsync");
    std::vector<std::int32_t> h;
    try {
        run(std::span<std::int32_t>(d, static_cast<std::size_t>(n_freed)));
        h = kv_download(d, static_cast<std::size_t>(n_freed), stream, fn);
    } catch (...) {
        if (d) cudaFreeAsync(d, stream);
        throw;
    }
    if (d) check_cuda(cudaFreeAsync(d, stream), fn, "cudaFreeAsync");
    return h;
}

// Pages a compaction releases, from host metadata alone (contiguous caches: 0).
template <class T>
std::int64_t kv_pages_released(const KvBatchView<T>& cache, std::span<const std::int32_t> seq_lens_host, std::int64_t b,
                               std::int64_t kept) {
    if (!cache.paged() || b < 0 || b >= static_cast<std::int64_t>(seq_lens_host.size())) return 0;
    return std::max<std::int64_t>(
        0, ::vlsparse::reference::detail::pages_for(seq_lens_host[static_cast<std::size_t>(b)], cache.page_size) -
               ::vlsparse::reference::detail::pages_for(kept, cache.page_size));
}

}  // namespace detail

// Appends each sequence's new rows after its current rows: sequence b gets rows
// new_indptr[b] .. new_indptr[b + 1] - 1 of k_new / v_new [total_new, H_kv, d] (device, any strides,
// fp32 / fp16 / bf16, converted to T) at rows seq_lens[b] .., then seq_lens[b] grows by their count,
// on the device (on the stream) and in seq_lens_host. new_indptr: device [batch + 1];
// new_indptr_host: its host copy. Paged caches: the block table must already list pages for the new
// rows. positions (optional, device [batch, >= longest new length]) receives new_positions (device
// [total_new]) at the same rows; pass both or neither. One launch copies the rows of the whole batch
// (a thread per 8 elements of a row, 16-byte loads and stores when the rows allow), a second one
// advances the device lengths.
template <ElementType T, ElementType TI>
void kv_batch_append(KvBatchView<T> cache, std::span<std::int32_t> seq_lens_host, View3<const TI> k_new,
                     View3<const TI> v_new, const std::int32_t* new_indptr,
                     std::span<const std::int32_t> new_indptr_host, View2<std::int64_t> positions = {},
                     View1<const std::int64_t> new_positions = {}, cudaStream_t stream = nullptr,
                     const KvUpdateOptions& opt = {}) {
    constexpr const char* fn = "cuda::kv_batch_append";
    static_assert(!std::is_const_v<T>, "a cache update needs a writable view: KvBatchView<T> with T not const");
    namespace rd = ::vlsparse::reference::detail;
    using detail::require;
    rd::check_update_layout(cache, seq_lens_host, fn);
    const std::int64_t B = cache.batch, Hkv = cache.n_kv_heads, d = cache.head_dim;
    ::vlsparse::detail::check_strides(k_new, fn, "k_new", false);
    ::vlsparse::detail::check_strides(v_new, fn, "v_new", false);
    require(k_new.shape[1] == Hkv && k_new.shape[2] == d, fn, "k_new has shape [", k_new.shape[0], ", ", k_new.shape[1],
            ", ", k_new.shape[2], "], expected [total_new, ", Hkv, ", ", d, "]");
    require(v_new.shape == k_new.shape, fn, "v_new has shape [", v_new.shape[0], ", ", v_new.shape[1], ", ",
            v_new.shape[2], "], expected the shape of k_new");
    rd::check_append_indptr(new_indptr_host, seq_lens_host, cache.capacity(), k_new.shape[0], fn);
    require(new_indptr != nullptr, fn, "new_indptr (device) is null");
    std::int64_t longest = 0;
    for (std::int64_t b = 0; b < B; ++b)
        longest = std::max<std::int64_t>(longest, seq_lens_host[static_cast<std::size_t>(b)] +
                                                      new_indptr_host[static_cast<std::size_t>(b + 1)] -
                                                      new_indptr_host[static_cast<std::size_t>(b)]);
    require((positions.data == nullptr) == (new_positions.data == nullptr), fn,
            "positions and new_positions: pass both (positions of the cache rows and of the new rows) or neither");
    if (positions.data) {
        rd::check_positions(positions, B, longest, fn);
        require(new_positions.shape[0] == k_new.shape[0], fn, "new_positions has ", new_positions.shape[0],
                " entries, expected one per new row (", k_new.shape[0], ")");
    }
    if (opt.check_inputs) {
        detail::kv_check_device_lengths(cache, seq_lens_host, stream, fn);
        detail::kv_check_device_indptr(new_indptr, new_indptr_host, "new_indptr", stream, fn);
        if (cache.paged()) {
            const auto table = detail::kv_download(cache.block_table,
                                                   static_cast<std::size_t>(B * cache.block_table_stride), stream, fn);
            std::vector<std::int64_t> in_use(static_cast<std::size_t>(B)), from(static_cast<std::size_t>(B));
            for (std::int64_t b = 0; b < B; ++b) {
                const std::int64_t n = seq_lens_host[static_cast<std::size_t>(b)];
                const std::int64_t a =
                    new_indptr_host[static_cast<std::size_t>(b + 1)] - new_indptr_host[static_cast<std::size_t>(b)];
                in_use[static_cast<std::size_t>(b)] = rd::pages_for(n + a, cache.page_size);
                from[static_cast<std::size_t>(b)] = a > 0 ? n / cache.page_size : in_use[static_cast<std::size_t>(b)];
            }
            rd::check_pages(table, cache.block_table_stride, cache.n_pages, in_use, from, fn);
        }
        detail::kv_check_device_narrowing<T>(k_new, "k_new", stream, fn);
        detail::kv_check_device_narrowing<T>(v_new, "v_new", stream, fn);
    }

    const std::int64_t total_new = k_new.shape[0];
    if (total_new > 0) {
        const std::int64_t items = total_new * Hkv * 2 * ((d + 7) / 8);
        const bool vec = d % 8 == 0 && k_new.stride[2] == 1 && v_new.stride[2] == 1 &&
                         detail::kv_aligned16(k_new.data, {k_new.stride[0], k_new.stride[1]}) &&
                         detail::kv_aligned16(v_new.data, {v_new.stride[0], v_new.stride[1]}) &&
                         detail::kv_aligned16(cache.k, {cache.page_stride, cache.row_stride, cache.head_stride}) &&
                         detail::kv_aligned16(cache.v, {cache.page_stride, cache.row_stride, cache.head_stride});
        using TIm = std::remove_const_t<TI>;
        if (vec)
            detail::kv_append_kernel<T, TIm, true><<<detail::kv_grid(items), detail::kKvThreads, 0, stream>>>(
                cache, k_new, v_new, new_indptr, total_new, positions, new_positions);
        else
            detail::kv_append_kernel<T, TIm, false><<<detail::kv_grid(items), detail::kKvThreads, 0, stream>>>(
                cache, k_new, v_new, new_indptr, total_new, positions, new_positions);
        detail::check_launch(fn, "kv_append_kernel");
        detail::kv_add_lengths_kernel<><<<detail::kv_grid(B), detail::kKvThreads, 0, stream>>>(
            const_cast<std::int32_t*>(cache.seq_lens), new_indptr, cache.batch);
        detail::check_launch(fn, "kv_add_lengths_kernel");
    }
    for (std::int64_t b = 0; b < B; ++b)
        seq_lens_host[static_cast<std::size_t>(b)] +=
            new_indptr_host[static_cast<std::size_t>(b + 1)] - new_indptr_host[static_cast<std::size_t>(b)];
}

// Pages a batched compaction with these host lengths and keep_indptr releases (the room freed_pages
// needs); 0 for contiguous caches.
template <class T>
std::int64_t kv_batch_pages_released(const KvBatchView<T>& cache, std::span<const std::int32_t> seq_lens_host,
                                     std::span<const std::int32_t> keep_indptr_host) {
    std::int64_t n = 0;
    for (std::int64_t b = 0; b + 1 < static_cast<std::int64_t>(keep_indptr_host.size()); ++b)
        n += detail::kv_pages_released(
            cache, seq_lens_host, b,
            keep_indptr_host[static_cast<std::size_t>(b + 1)] - keep_indptr_host[static_cast<std::size_t>(b)]);
    return n;
}

// Compacts every sequence of the batch in place: sequence b keeps rows keep[keep_indptr[b] ..
// keep_indptr[b + 1]) (device CSR, ascending, unique, in [0, seq_lens[b]), not empty; a sequence to
// leave alone lists all its rows); keep_indptr_host: the host copy of keep_indptr. Row keep[i] becomes
// row i for every KV head, seq_lens[b] becomes the list's length (device and host). Paged caches: the
// pages past each sequence's kept rows (slots ceil(m / P) .. ceil(old / P) - 1) are written to
// freed_pages (device, sequence by sequence, slot order; room for at least kv_batch_pages_released
// entries) and their block-table slots set to -1 (the view's block table must be writable).
// positions (optional, device [batch, >= longest length]) are moved with the rows. Returns the number
// of pages released. Stream-ordered (synchronizes only for opt.check_inputs).
template <ElementType T>
std::int64_t kv_batch_compact(KvBatchView<T> cache, std::span<std::int32_t> seq_lens_host,
                              std::span<const std::int32_t> keep_indptr_host, const std::int32_t* keep_indptr,
                              const std::int32_t* keep, std::span<std::int32_t> freed_pages,
                              View2<std::int64_t> positions = {}, cudaStream_t stream = nullptr,
                              const KvUpdateOptions& opt = {}) {
    constexpr const char* fn = "cuda::kv_batch_compact";
    detail::require(!keep_indptr_host.empty(), fn, "keep_indptr is empty, expected batch + 1 = ", cache.batch + 1,
                    " entries");
    return detail::kv_compact(cache, seq_lens_host, keep_indptr_host, keep_indptr, keep, -1, 0, freed_pages, positions,
                              stream, opt, fn);
}

// The same for one sequence b: keep is its list (device memory; keep.size() entries). Other sequences
// are not touched.
template <ElementType T>
std::int64_t kv_batch_compact(KvBatchView<T> cache, std::span<std::int32_t> seq_lens_host, std::int64_t b,
                              std::span<const std::int32_t> keep, std::span<std::int32_t> freed_pages,
                              View2<std::int64_t> positions = {}, cudaStream_t stream = nullptr,
                              const KvUpdateOptions& opt = {}) {
    constexpr const char* fn = "cuda::kv_batch_compact";
    return detail::kv_compact(cache, seq_lens_host, {}, nullptr, keep.data(), b, static_cast<std::int64_t>(keep.size()),
                              freed_pages, positions, stream, opt, fn);
}

// Convenience forms: the released pages as a host vector (stream-allocated device buffer, downloaded;
// these synchronize the stream).
template <ElementType T>
std::vector<std::int32_t> kv_batch_compact(KvBatchView<T> cache, std::span<std::int32_t> seq_lens_host,
                                           std::span<const std::int32_t> keep_indptr_host,
                                           const std::int32_t* keep_indptr, const std::int32_t* keep,
                                           View2<std::int64_t> positions = {}, cudaStream_t stream = nullptr,
                                           const KvUpdateOptions& opt = {}) {
    constexpr const char* fn = "cuda::kv_batch_compact";
    detail::require(!keep_indptr_host.empty(), fn, "keep_indptr is empty, expected batch + 1 = ", cache.batch + 1,
                    " entries");
    ::vlsparse::reference::detail::check_update_layout(cache, seq_lens_host, fn);  // before sizing the buffer
    ::vlsparse::reference::detail::check_keep_indptr(keep_indptr_host, seq_lens_host, fn);
    const std::int64_t n = kv_batch_pages_released(cache, seq_lens_host, keep_indptr_host);
    return detail::kv_freed_to_host(n, stream, fn, [&](std::span<std::int32_t> freed) {
        detail::kv_compact(cache, seq_lens_host, keep_indptr_host, keep_indptr, keep, -1, 0, freed, positions, stream,
                           opt, fn);
    });
}

template <ElementType T>
std::vector<std::int32_t> kv_batch_compact(KvBatchView<T> cache, std::span<std::int32_t> seq_lens_host, std::int64_t b,
                                           std::span<const std::int32_t> keep, View2<std::int64_t> positions = {},
                                           cudaStream_t stream = nullptr, const KvUpdateOptions& opt = {}) {
    constexpr const char* fn = "cuda::kv_batch_compact";
    ::vlsparse::reference::detail::check_update_layout(cache, seq_lens_host, fn);  // before sizing the buffer
    const std::int64_t n = detail::kv_pages_released(cache, seq_lens_host, b, static_cast<std::int64_t>(keep.size()));
    return detail::kv_freed_to_host(n, stream, fn, [&](std::span<std::int32_t> freed) {
        detail::kv_compact(cache, seq_lens_host, {}, nullptr, keep.data(), b, static_cast<std::int64_t>(keep.size()),
                           freed, positions, stream, opt, fn);
    });
}

// How the pages of a paged DeviceKvBatch are laid out: [n_pages, P, H_kv, d] or [n_pages, H_kv, P, d].
enum class PageLayout { nhd, hnd };

// An owning batch of KV caches in device memory, for tests, benchmarks and the simulator: contiguous
// ([batch, capacity, H_kv, d]) or paged (a pool of pages, a block table, and a host-side free list
// that hands out pages as sequences grow and takes back those compaction releases). Keeps host
// mirrors of seq_lens and the block table. Calls are stream-ordered on the stream given (use one
// stream at a time: the object's small device buffers are reused from call to call);
// upload_sequence and download_sequence synchronize.
template <ElementType T>
class DeviceKvBatch {
    static_assert(!std::is_const_v<T>, "DeviceKvBatch<T>: T is the element type, not const");

public:
    static DeviceKvBatch contiguous(std::int32_t batch, std::int64_t capacity, std::int32_t n_kv_heads,
                                    std::int32_t head_dim) {
        constexpr const char* fn = "cuda::DeviceKvBatch::contiguous";
        check_shape(batch, n_kv_heads, head_dim, fn);
        detail::require(capacity >= 1, fn, "capacity = ", capacity, ", expected >= 1");
        DeviceKvBatch r(batch, n_kv_heads, head_dim);
        r.P_ = capacity;
        const auto n = static_cast<std::size_t>(batch * capacity * n_kv_heads * head_dim);
        r.k_ = DeviceArray<T>(n);
        r.v_ = DeviceArray<T>(n);
        r.zero_pools();
        r.init_lengths();
        return r;
    }
    // max_pages_per_seq: block-table slots per sequence (0: n_pages).
    static DeviceKvBatch paged(std::int32_t batch, std::int64_t n_pages, std::int64_t page_size, PageLayout layout,
                               std::int32_t n_kv_heads, std::int32_t head_dim, std::int64_t max_pages_per_seq = 0) {
        constexpr const char* fn = "cuda::DeviceKvBatch::paged";
        check_shape(batch, n_kv_heads, head_dim, fn);
        detail::require(n_pages >= 1 && n_pages <= std::numeric_limits<std::int32_t>::max() && page_size >= 1, fn,
                        "n_pages = ", n_pages, ", page_size = ", page_size, "; expected both >= 1");
        detail::require(max_pages_per_seq >= 0, fn, "max_pages_per_seq = ", max_pages_per_seq, ", expected >= 0");
        DeviceKvBatch r(batch, n_kv_heads, head_dim);
        r.P_ = page_size;
        r.n_pages_ = n_pages;
        r.hnd_ = layout == PageLayout::hnd;
        r.stride_ = max_pages_per_seq == 0 ? n_pages : max_pages_per_seq;
        const auto n = static_cast<std::size_t>(n_pages * page_size * n_kv_heads * head_dim);
        r.k_ = DeviceArray<T>(n);
        r.v_ = DeviceArray<T>(n);
        r.zero_pools();
        r.table_.assign(static_cast<std::size_t>(batch * r.stride_), -1);
        r.table_dev_ = DeviceArray<std::int32_t>(r.table_);
        for (std::int64_t p = n_pages - 1; p >= 0; --p) r.free_.push_back(static_cast<std::int32_t>(p));  // 0 first
        r.init_lengths();
        return r;
    }

    DeviceKvBatch(DeviceKvBatch&&) noexcept = default;
    DeviceKvBatch& operator=(DeviceKvBatch&&) noexcept = default;

    bool is_paged() const { return n_pages_ > 0; }
    std::int32_t batch() const { return B_; }
    std::int32_t n_kv_heads() const { return Hkv_; }
    std::int32_t head_dim() const { return d_; }
    std::int64_t page_size() const { return P_; }
    // The device view (device pointers; seq_lens and block table in device memory).
    KvBatchView<T> view() const {
        if (!is_paged()) return contiguous_kv_batch<T>(k_.data(), v_.data(), B_, P_, Hkv_, d_, lens_dev_.data());
        return hnd_ ? paged_kv_batch_hnd<T>(k_.data(), v_.data(), B_, n_pages_, P_, Hkv_, d_, table_dev_.data(),
                                            stride_, lens_dev_.data())
                    : paged_kv_batch_nhd<T>(k_.data(), v_.data(), B_, n_pages_, P_, Hkv_, d_, table_dev_.data(),
                                            stride_, lens_dev_.data());
    }
    // Host mirrors.
    std::span<const std::int32_t> seq_lens() const { return lens_; }
    std::span<const std::int32_t> block_table() const { return table_; }  // [batch, stride]; empty: contiguous
    std::int64_t free_pages() const { return static_cast<std::int64_t>(free_.size()); }
    KvUpdateOptions& options() { return opt_; }

    // Replaces sequence b with the n rows of k / v (host memory, [n, H_kv, d], any strides and element
    // type): its pages go back to the free list, then pages for n rows are taken. Synchronizes.
    template <ElementType TI>
    void upload_sequence(std::int64_t b, View3<const TI> k, View3<const TI> v, cudaStream_t stream = nullptr) {
        constexpr const char* fn = "cuda::DeviceKvBatch::upload_sequence";
        detail::require(b >= 0 && b < B_, fn, "sequence ", b, ", expected 0 <= b < batch = ", B_);
        ::vlsparse::detail::check_strides(k, fn, "k", false);
        ::vlsparse::detail::check_strides(v, fn, "v", false);
        detail::require(k.shape[1] == Hkv_ && k.shape[2] == d_ && v.shape == k.shape, fn, "k / v have shapes [",
                        k.shape[0], ", ", k.shape[1], ", ", k.shape[2], "] / [", v.shape[0], ", ", v.shape[1], ", ",
                        v.shape[2], "], expected [n, ", Hkv_, ", ", d_, "] both");
        const std::int64_t n = k.shape[0];
        using TIm = std::remove_const_t<TI>;
        std::vector<TIm> kh(static_cast<std::size_t>(n * Hkv_ * d_)), vh(kh.size());
        for (std::int64_t t = 0; t < n; ++t)
            for (std::int64_t g = 0; g < Hkv_; ++g)
                for (std::int64_t c = 0; c < d_; ++c) {
                    kh[static_cast<std::size_t>((t * Hkv_ + g) * d_ + c)] = k(t, g, c);
                    vh[static_cast<std::size_t>((t * Hkv_ + g) * d_ + c)] = v(t, g, c);
                }
        detail::require(n <= capacity_for(b, /*after_release=*/true), fn, "sequence ", b, " cannot hold ", n,
                        " rows (capacity ", is_paged() ? stride_ * P_ : P_,
                        is_paged() ? ", or not enough free pages)" : ")");
        // Empty the sequence, then append its rows.
        release_rows(b, 0, stream, fn);
        std::vector<std::int32_t> indptr(static_cast<std::size_t>(B_ + 1), 0);
        for (std::int64_t i = b + 1; i <= B_; ++i) indptr[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(n);
        DeviceArray<TIm> kd(kh), vd(vh);
        append(View3<const TIm>(kd.data(), {n, Hkv_, d_}), View3<const TIm>(vd.data(), {n, Hkv_, d_}), indptr, stream);
        detail::check_cuda(cudaStreamSynchronize(stream), fn, "cudaStreamSynchronize");
    }

    // Appends new rows (device k_new / v_new [total_new, H_kv, d], CSR new_indptr [batch + 1] on the
    // host), taking pages from the free list as sequences grow.
    template <ElementType TI>
    void append(View3<const TI> k_new, View3<const TI> v_new, std::span<const std::int32_t> new_indptr,
                cudaStream_t stream = nullptr) {
        constexpr const char* fn = "cuda::DeviceKvBatch::append";
        detail::require(static_cast<std::int64_t>(new_indptr.size()) == B_ + 1, fn, "new_indptr has ",
                        new_indptr.size(), " entries, expected batch + 1 = ", B_ + 1);
        const auto table0 = table_;
        const auto free0 = free_;
        try {
            if (is_paged()) {
                bool changed = false;
                for (std::int64_t b = 0; b < B_; ++b) {
                    const std::int64_t a =
                        new_indptr[static_cast<std::size_t>(b + 1)] - new_indptr[static_cast<std::size_t>(b)];
                    const std::int64_t rows = lens_[static_cast<std::size_t>(b)] + std::max<std::int64_t>(a, 0);
                    detail::require(rows <= stride_ * P_, fn, "sequence ", b, " would hold ", rows,
                                    " rows, more than its block table holds (", stride_, " pages of ", P_, ")");
                    for (std::int64_t s =
                             ::vlsparse::reference::detail::pages_for(lens_[static_cast<std::size_t>(b)], P_);
                         s < ::vlsparse::reference::detail::pages_for(rows, P_); ++s) {
                        detail::require(!free_.empty(), fn, "out of pages: sequence ", b, " needs more than the ",
                                        free0.size(), " free pages of the pool (", n_pages_, ")");
                        table_[static_cast<std::size_t>(b * stride_ + s)] = free_.back();
                        free_.pop_back();
                        changed = true;
                    }
                }
                if (changed) upload(table_dev_, table_, stream, fn);
            }
            upload(indptr_dev_, new_indptr, stream, fn);
            cuda::kv_batch_append(view(), std::span<std::int32_t>(lens_), k_new, v_new, indptr_dev_.data(), new_indptr,
                                  {}, {}, stream, opt_);
        } catch (...) {
            if (table_ != table0) {
                table_ = table0;
                free_ = free0;
                upload(table_dev_, table_, stream, fn);
            }
            throw;
        }
    }

    // Compacts every sequence (host CSR keep lists, as reference::kv_batch_compact takes them) and puts
    // the released pages back on the free list; returns them.
    std::vector<std::int32_t> compact(std::span<const std::int32_t> keep_indptr, std::span<const std::int32_t> keep,
                                      cudaStream_t stream = nullptr) {
        constexpr const char* fn = "cuda::DeviceKvBatch::compact";
        detail::require(!keep_indptr.empty(), fn, "keep_indptr is empty, expected batch + 1 = ", B_ + 1, " entries");
        detail::require(static_cast<std::int64_t>(keep.size()) == keep_indptr.back(), fn, "keep has ", keep.size(),
                        " entries, expected keep_indptr[batch] = ", keep_indptr.back());
        upload(indptr_dev_, keep_indptr, stream, fn);
        upload(keep_dev_, keep, stream, fn);
        const std::int64_t n = kv_batch_pages_released(view(), lens_, keep_indptr);
        grow(freed_dev_, static_cast<std::size_t>(std::max<std::int64_t>(n, 0)));
        const auto slots = released_slots(keep_indptr, -1, 0);
        cuda::kv_batch_compact(view(), std::span<std::int32_t>(lens_), keep_indptr, indptr_dev_.data(),
                               keep_dev_.data(), std::span<std::int32_t>(freed_dev_.data(), freed_dev_.size()), {},
                               stream, opt_);
        return take_back(slots);
    }
    // Compacts sequence b to `keep` (host).
    std::vector<std::int32_t> compact(std::int64_t b, std::span<const std::int32_t> keep,
                                      cudaStream_t stream = nullptr) {
        constexpr const char* fn = "cuda::DeviceKvBatch::compact";
        upload(keep_dev_, keep, stream, fn);
        const std::int64_t n = detail::kv_pages_released(view(), lens_, b, static_cast<std::int64_t>(keep.size()));
        grow(freed_dev_, static_cast<std::size_t>(n));
        const auto slots = released_slots({}, b, static_cast<std::int64_t>(keep.size()));
        cuda::kv_batch_compact(view(), std::span<std::int32_t>(lens_), b,
                               std::span<const std::int32_t>(keep_dev_.data(), keep.size()),
                               std::span<std::int32_t>(freed_dev_.data(), freed_dev_.size()), {}, stream, opt_);
        return take_back(slots);
    }

    // The K / V rows sequence b holds, [seq_len, H_kv, d] on the host (synchronizes).
    std::pair<std::vector<T>, std::vector<T>> download_sequence(std::int64_t b, cudaStream_t stream = nullptr) const {
        constexpr const char* fn = "cuda::DeviceKvBatch::download_sequence";
        detail::require(b >= 0 && b < B_, fn, "sequence ", b, ", expected 0 <= b < batch = ", B_);
        detail::check_cuda(cudaStreamSynchronize(stream), fn, "cudaStreamSynchronize");
        const auto kh = k_.download(), vh = v_.download();
        auto hv = view();
        hv.k = const_cast<T*>(kh.data());
        hv.v = const_cast<T*>(vh.data());
        hv.block_table = table_.empty() ? nullptr : table_.data();
        const std::int64_t n = lens_[static_cast<std::size_t>(b)];
        std::pair<std::vector<T>, std::vector<T>> r;
        r.first.resize(static_cast<std::size_t>(n * Hkv_ * d_));
        r.second.resize(r.first.size());
        for (std::int64_t t = 0; t < n; ++t)
            for (std::int64_t g = 0; g < Hkv_; ++g)
                for (std::int64_t c = 0; c < d_; ++c) {
                    r.first[static_cast<std::size_t>((t * Hkv_ + g) * d_ + c)] = hv.k_row(b, t, g)[c];
                    r.second[static_cast<std::size_t>((t * Hkv_ + g) * d_ + c)] = hv.v_row(b, t, g)[c];
                }
        return r;
    }

private:
    DeviceKvBatch(std::int32_t batch, std::int32_t hkv, std::int32_t d) : B_(batch), Hkv_(hkv), d_(d) {}

    static void check_shape(std::int32_t batch, std::int32_t hkv, std::int32_t d, const char* fn) {
        detail::require(batch >= 1 && hkv >= 1 && d >= 1, fn, "batch = ", batch, ", H_kv = ", hkv, ", head_dim = ", d,
                        "; expected all >= 1");
    }
    // Rows no sequence holds yet are zeros, not whatever the allocation held: download_sequence copies
    // whole pools, and compute-sanitizer's initcheck would flag the copy of never-written memory.
    void zero_pools() {
        k_.fill_bytes(0);
        v_.fill_bytes(0);
    }
    void init_lengths() {
        lens_.assign(static_cast<std::size_t>(B_), 0);
        lens_dev_ = DeviceArray<std::int32_t>(lens_);
        indptr_dev_ = DeviceArray<std::int32_t>(static_cast<std::size_t>(B_ + 1));
    }
    template <class U>
    static void grow(DeviceArray<U>& a, std::size_t n) {
        if (a.size() < n) a = DeviceArray<U>(std::max(n, 2 * a.size()));
    }
    // Stream-ordered upload of host data into a (grown) device buffer. From pageable memory the copy
    // is staged before cudaMemcpyAsync returns, so the host data may change afterwards.
    template <class U>
    static void upload(DeviceArray<U>& a, std::span<const U> h, cudaStream_t stream, const char* fn) {
        if (a.size() < h.size()) {  // the old buffer may still be read by work on the stream
            detail::check_cuda(cudaStreamSynchronize(stream), fn, "cudaStreamSynchronize");
            grow(a, h.size());
        }
        if (!h.empty())
            detail::check_cuda(
                cudaMemcpyAsync(a.data(), h.data(), h.size() * sizeof(U), cudaMemcpyHostToDevice, stream), fn,
                "cudaMemcpyAsync");
    }
    template <class U>
    static void upload(DeviceArray<U>& a, const std::vector<U>& h, cudaStream_t stream, const char* fn) {
        upload(a, std::span<const U>(h), stream, fn);
    }
    // Rows sequence b could hold (paged: its table width, and the free pages plus its own if released).
    std::int64_t capacity_for(std::int64_t b, bool after_release) const {
        if (!is_paged()) return P_;
        std::int64_t own = 0;
        for (std::int64_t s = 0; s < stride_; ++s) own += table_[static_cast<std::size_t>(b * stride_ + s)] >= 0;
        return std::min(stride_, free_pages() + (after_release ? own : 0)) * P_;
    }
    // Sequence b keeps its first `rows` rows (0: empty): pages past them back to the free list.
    void release_rows(std::int64_t b, std::int64_t rows, cudaStream_t stream, const char* fn) {
        if (is_paged()) {
            bool changed = false;
            for (std::int64_t s = ::vlsparse::reference::detail::pages_for(rows, P_); s < stride_; ++s) {
                auto& e = table_[static_cast<std::size_t>(b * stride_ + s)];
                if (e < 0) continue;
                free_.push_back(e);
                e = -1;
                changed = true;
            }
            if (changed) upload(table_dev_, table_, stream, fn);
        }
        lens_[static_cast<std::size_t>(b)] = static_cast<std::int32_t>(rows);
        upload(lens_dev_, lens_, stream, fn);
    }
    // The block-table slots a compaction releases (host mirror), in its order: computed before the
    // call, used only when it succeeds.
    std::vector<std::size_t> released_slots(std::span<const std::int32_t> keep_indptr, std::int64_t only,
                                            std::int64_t only_len) const {
        std::vector<std::size_t> r;
        if (!is_paged()) return r;
        if (!keep_indptr.empty() && static_cast<std::int64_t>(keep_indptr.size()) != B_ + 1) return r;
        for (std::int64_t b = 0; b < B_; ++b) {
            if (keep_indptr.empty() && b != only) continue;
            const std::int64_t m = keep_indptr.empty() ? only_len
                                                       : keep_indptr[static_cast<std::size_t>(b + 1)] -
                                                             keep_indptr[static_cast<std::size_t>(b)];
            const std::int64_t hi = ::vlsparse::reference::detail::pages_for(lens_[static_cast<std::size_t>(b)], P_);
            for (std::int64_t s = ::vlsparse::reference::detail::pages_for(std::max<std::int64_t>(m, 0), P_); s < hi;
                 ++s)
                r.push_back(static_cast<std::size_t>(b * stride_ + s));
        }
        return r;
    }
    // After a successful compaction: the mirror's released slots become -1, their pages free.
    std::vector<std::int32_t> take_back(const std::vector<std::size_t>& slots) {
        std::vector<std::int32_t> pages;
        for (auto s : slots) {
            pages.push_back(table_[s]);
            free_.push_back(table_[s]);
            table_[s] = -1;
        }
        return pages;
    }

    std::int32_t B_ = 0, Hkv_ = 0, d_ = 0;
    std::int64_t P_ = 0, n_pages_ = 0, stride_ = 0;  // contiguous: P_ = capacity, n_pages_ = 0
    bool hnd_ = false;
    DeviceArray<T> k_, v_;
    DeviceArray<std::int32_t> lens_dev_, table_dev_, indptr_dev_, keep_dev_, freed_dev_;
    std::vector<std::int32_t> lens_, table_, free_;
    KvUpdateOptions opt_;
};

}  // namespace vlsparse::cuda
