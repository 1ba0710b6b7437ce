// vlsparse/cuda/decode/kernels.cuh -- device code of batched / paged / indexed decode attention.
// Internal to vlsparse/cuda/decode.cuh (namespace vlsparse::cuda::detail); include that header.
//
// One thread block (4 warps) per work item: a chunk of one unit's row list, where a unit is
// (sequence b, KV head g, block of NQB query vectors of that KV group). A query vector is one
// (new token i, query head a of the group) pair, numbered j = i * G + a. The block streams the
// chunk's K and V rows through shared memory in tiles of R rows (16 KiB of K + V per tile), S stages
// deep with cp.async, so that 3 tiles are in flight while one is computed:
//   - row addresses: list entry -> logical row -> (page, slot) -> element offset; the list entries of
//     the tile after next are loaded one iteration ahead, so issuing copies waits on no list load;
//   - scores: L lanes share a row (each holds 16 bytes = 8 bf16 / fp16 or 4 fp32 columns), the
//     NQB partial dots are reduced across the L lanes by a butterfly that halves the values kept per
//     lane at each step (NQB + log2(L / NQB) shuffles instead of NQB * log2 L);
//   - softmax: one warp per query vector over the tile (online: running max and sum, rescale of the
//     accumulators only when the max moves);
//   - P.V: each thread accumulates its columns for all NQB vectors over its rows of the tile; one V
//     element read from shared memory serves every query vector (the GQA group, the new tokens).
// At the end the row slots' accumulators are added in shared memory; a unit of one chunk writes its
// output directly, otherwise each chunk writes a partial (max, sum, unnormalized output per vector)
// and the last chunk of the unit to finish (an atomic counter, reset by that block) merges them.
// fp32 arithmetic throughout; exponentials in base 2 with the scale folded into q.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "vlsparse/cuda/common.cuh"
#include "vlsparse/kv/kv_batch.hpp"

namespace vlsparse::cuda::detail {

inline constexpr int kDecodeThreads = 128;
inline constexpr int kDecodeStages = 4;
inline constexpr int kDecodeTileBytes = 16384;  // K + V bytes of one tile
inline constexpr int kMaxQueryBlock = 8;        // NQB: query vectors per block
inline constexpr int kChunkQuantum = 64;        // chunk sizes are multiples of this (every R divides it)

// One block's work (built by DecodePlan on the host).
struct DecodeItem {
    std::int32_t b, g, qb, unit;        // sequence, KV head, query block, unit index
    std::int32_t begin, end;            // list entries [begin, end) of the unit's list
    std::int32_t first_item, n_items;   // the unit's items (partial slots first_item .. + n_items)
    std::int64_t list_base;             // the list's first entry in `indices` (0 when dense)
    std::int32_t seq_len, q_len, q_row0, list_len;
};

// Status bits written by the kernels (read by the host when checks are on).
inline constexpr int kStatusNonFinite = 1;

template <class TC>
struct DecodeArgs {
    const void* q = nullptr;
    std::int64_t q_s0 = 0, q_s1 = 0, q_s2 = 0;  // token, head, column strides (elements)
    DType q_type = DType::f32;
    void* out = nullptr;
    std::int64_t o_s0 = 0, o_s1 = 0, o_s2 = 0;
    DType o_type = DType::f32;
    KvBatchView<const TC> cache;
    const std::int32_t* indices = nullptr;  // null: dense (entry e is row e)
    const DecodeItem* items = nullptr;
    float* part = nullptr;      // [n_items][decode_partial_floats(NQB, D)]
    int* counters = nullptr;    // [n_units], zero between launches
    int* status = nullptr;      // null: no checks
    float* logits = nullptr;    // null, or [entries][heads_per_entry] scaled log2 logits (probabilities)
    float* stats = nullptr;     // with logits: [total_q * H][2] final (max, sum) per query vector
    std::int64_t logit_stride = 0;  // logits per entry: (lists shared ? H_kv : 1) * G * longest q_len
    int group = 1;              // G = H / H_kv
    int n_heads = 1;
    int head_dim = 0;
    int lists_per_seq = 1;
    float scale_log2 = 0.0f;    // scale * log2(e)
    bool vec16 = true;          // rows 16-byte aligned and d * sizeof(TC) % 16 == 0: cp.async path
    int page_shift = -1;        // log2(page_size) when a paged cache's page size is a power of two
};

__device__ __forceinline__ float load_any(const void* p, DType t, std::int64_t i) {
    switch (t) {
        case DType::f32: return load_f(static_cast<const float*>(p) + i);
        case DType::f16: return load_f(static_cast<const half*>(p) + i);
        default: return load_f(static_cast<const bfloat16*>(p) + i);
    }
}
__device__ __forceinline__ void store_any(void* p, DType t, std::int64_t i, float x) {
    switch (t) {
        case DType::f32: store_f(static_cast<float*>(p) + i, x); break;
        case DType::f16: store_f(static_cast<half*>(p) + i, x); break;
        default: store_f(static_cast<bfloat16*>(p) + i, x); break;
    }
}

// x[i] = p[idx(i)] as float (0 where idx(i) < 0), i < N. The N loads are issued back to back, none
// under a branch: an index < 0 loads element 0 instead (p holds at least one element) and the value is
// replaced by 0 after every load was issued; the element type's switch is taken once, outside the loop.
// (With each load under its own `if`, ptxas could not hoist it past the previous conversion: the 32 q
// loads of a tensor-core decode block ran one after the other, ~4.7 us of round trips at B = 1 before
// warp 0 issued its first copies -- an H100 trace.)
template <int N, class Idx>
__device__ __forceinline__ void load_values(const void* p, DType t, float (&x)[N], Idx&& idx) {
    static_assert(N <= 64, "load_values: at most 64 values (one validity bit each)");
    auto run = [&](const auto* ptr, auto convert) {
        unsigned long long valid = 0;
#pragma unroll
        for (int i = 0; i < N; ++i) {
            const std::int64_t k = idx(i);
            valid |= static_cast<unsigned long long>(k >= 0) << i;
            x[i] = convert(__ldg(ptr + (k >= 0 ? k : 0)));
        }
#pragma unroll
        for (int i = 0; i < N; ++i) x[i] = (valid >> i) & 1u ? x[i] : 0.0f;
    };
    switch (t) {
        case DType::f32: run(static_cast<const float*>(p), [](float v) { return v; }); break;
        case DType::f16:
            run(static_cast<const unsigned short*>(p), [](unsigned short b) { return __half2float(__ushort_as_half(b)); });
            break;
        default:
            run(static_cast<const unsigned short*>(p),
                [](unsigned short b) { return __uint_as_float(static_cast<unsigned>(b) << 16); });
            break;
    }
}

// Butterfly reduce-scatter of V values over the L lanes of a row group (V <= L, both powers of two):
// on return v[0] is the group's total of value number `owner(lane)`.
template <int V, int L>
__device__ __forceinline__ float reduce_scatter(float (&v)[V], int lane) {
    int cnt = V;
#pragma unroll
    for (int o = 1; o < V; o <<= 1) {
        const int half = cnt / 2;
        const bool upper = (lane & o) != 0;
#pragma unroll
        for (int k = 0; k < V / 2; ++k) {
            if (k < half) {
                const float send = upper ? v[k] : v[k + half];
                const float keep = upper ? v[k + half] : v[k];
                v[k] = keep + __shfl_xor_sync(0xffffffffu, send, o);
            }
        }
        cnt = half;
    }
#pragma unroll
    for (int o = V; o < L; o <<= 1) v[0] += __shfl_xor_sync(0xffffffffu, v[0], o);
    return v[0];
}
// Which value reduce_scatter<V, L> leaves in `lane`.
template <int V>
__device__ __forceinline__ int reduce_owner(int lane) {
    int idx = 0, half = V / 2;
#pragma unroll
    for (int o = 1; o < V; o <<= 1, half >>= 1)
        if (lane & o) idx += half;
    return idx;
}

template <class TC, int D>
struct DecodeShape {
    static constexpr int PE = 16 / static_cast<int>(sizeof(TC));  // elements per 16-byte vector
    static constexpr int PCS = D / PE;                             // vectors per row
    static constexpr int L = PCS < 32 ? PCS : 32;                  // lanes per row
    static constexpr int VPL = PCS / L;                            // vectors per lane
    static constexpr int EPL = VPL * PE;                           // columns per lane
    static constexpr int NS = kDecodeThreads / L;                  // row slots
    static constexpr int ROWB = D * static_cast<int>(sizeof(TC));  // bytes per row
    static constexpr int R = kDecodeTileBytes / (2 * ROWB);        // rows per tile
    static constexpr int RPT = R / NS;                             // rows per thread per tile
    static_assert(PCS % L == 0 && RPT >= 1 && R * NS >= NS && kChunkQuantum % R == 0, "decode tile shape");
    // Column of element e of vector v held by lane j (vectors interleaved across lanes: conflict-free).
    __device__ static constexpr int col(int j, int v, int e) { return (v * L + j) * PE + e; }
};

// Floats of one work item's partial result: a 16-float header (max, sum per vector), then [NQB][D].
constexpr int decode_partial_floats(int nqb, int d_pad) { return 16 + nqb * d_pad; }

template <class TC, int D, int NQB>
constexpr std::size_t decode_smem_bytes() {
    using S = DecodeShape<TC, D>;
    return static_cast<std::size_t>(kDecodeStages) * kDecodeTileBytes  // K and V tiles
           + static_cast<std::size_t>(NQB) * S::R * sizeof(float)       // scores / probabilities
           + static_cast<std::size_t>(kDecodeStages) * S::R * sizeof(std::int32_t)  // rows of each tile
           + 2 * static_cast<std::size_t>(NQB) * sizeof(float) + 16;    // alpha, flags
}

// The address pipeline of one thread of a decode block: the rows it copies in every tile (its slot's
// rows slot + k * NSL, k < RPT, of the R rows of a tile) and their element offsets in the cache. List
// entries are loaded two tiles ahead of their copies and block-table entries one tile ahead, so that
// issuing a tile's copies waits on no load. Shared by both decode kernels; fully unrolled (the
// arrays stay in registers).
template <class TC, int R, int NSL, int RPT>
struct RowPipeline {
    const KvBatchView<const TC>& cache;
    const DecodeItem& it;
    const std::int32_t* list;  // the unit's list (null: dense)
    int slot, cnt, ntiles, page_shift;
    std::int32_t row2[RPT], row1[RPT], page1[RPT];  // rows of the tile after next; rows + pages of the next
    std::int64_t base;  // the (sequence, KV head) part of every offset, set by start(): one multiply per row left

    __device__ __forceinline__ std::int32_t row_of(int t) const {
        return list ? __ldg(list + it.begin + t) : it.begin + t;
    }
    __device__ __forceinline__ void fetch_rows(int tile, std::int32_t (&dst)[RPT]) const {
#pragma unroll
        for (int k = 0; k < RPT; ++k) {
            const int t = tile * R + slot + k * NSL;
            dst[k] = tile < ntiles && t < cnt ? row_of(t) : -1;
        }
    }
    __device__ __forceinline__ void fetch_pages() {
#pragma unroll
        for (int k = 0; k < RPT; ++k) {
            page1[k] = 0;
            if (cache.block_table && row1[k] >= 0) {
                const std::int32_t pi =
                    page_shift >= 0 ? (row1[k] >> page_shift) : static_cast<std::int32_t>(row1[k] / cache.page_size);
                page1[k] = __ldg(cache.block_table + it.b * cache.block_table_stride + pi);
            }
        }
    }
    // Fill the pipeline: tile 0's rows and pages, tile 1's rows.
    __device__ __forceinline__ void start() {
        base = (cache.block_table ? 0 : static_cast<std::int64_t>(it.b) * cache.page_stride) +
               static_cast<std::int64_t>(it.g) * cache.head_stride;
        fetch_rows(0, row1);
        fetch_pages();
        fetch_rows(1, row2);
    }
    // One tile on: row1 <- row2 (and its pages), row2 <- the rows of tile `next`.
    __device__ __forceinline__ void advance(int next) {
#pragma unroll
        for (int k = 0; k < RPT; ++k) row1[k] = row2[k];
        fetch_pages();
        fetch_rows(next, row2);
    }
    // Element offset of row1[k] (>= 0) in this sequence and KV head.
    __device__ __forceinline__ std::int64_t offset(int k) const {
        const std::int32_t r = row1[k];
        if (cache.block_table) {
            const std::int64_t in_page = page_shift >= 0 ? (r & (cache.page_size - 1)) : r % cache.page_size;
            return page1[k] * cache.page_stride + in_page * cache.row_stride + base;
        }
        return static_cast<std::int64_t>(r) * cache.row_stride + base;
    }
};

// The end of a work item, shared by the decode kernels: red [NS][NQB][D] holds the row slots' (or
// warps') unnormalized outputs, all relative to the common max in stat_s [NQB][2] = {max, sum}. A
// unit of one chunk writes its outputs; otherwise the chunk writes its partial and the unit's last
// chunk merges them. scratch: >= 2 * NQB floats of shared memory that may be overwritten.
template <int NQB, int D, int NS, class TC>
__device__ __forceinline__ void decode_finish(const DecodeArgs<TC>& a, const DecodeItem& it, const float* red,
                                              const float* stat_s, float* scratch, int* last_flag) {
    constexpr float ninf = -INFINITY;
    const int tid = threadIdx.x;
    const int G = a.group;
    const int nqv = G * it.q_len;
    const int d = a.head_dim;
    (void)scratch;
    const bool single = it.n_items == 1;
    // Where query vector v's output goes.
    auto out_index = [&](int v, int c) -> std::int64_t {
        const int qv = it.qb * NQB + v;
        const int i = qv / G, h = it.g * G + qv % G;
        return (it.q_row0 + i) * a.o_s0 + h * a.o_s1 + c * a.o_s2;
    };
    const int nv = min(NQB, nqv - it.qb * NQB);
    if (single) {
        for (int idx = tid; idx < nv * d; idx += kDecodeThreads) {
            const int v = idx / d, c = idx % d;
            float o = 0.0f;
#pragma unroll 4
            for (int s = 0; s < NS; ++s) o += red[(s * NQB + v) * D + c];
            o /= stat_s[2 * v + 1];
            if (a.status && !isfinite(o)) atomicOr(a.status, kStatusNonFinite);
            store_any(a.out, a.o_type, out_index(v, c), o);
        }
        if (a.stats && tid < nv) {
            const int qv = it.qb * NQB + tid;
            const std::int64_t qi = (static_cast<std::int64_t>(it.q_row0) + qv / G) * a.n_heads + it.g * G + qv % G;
            a.stats[2 * qi] = stat_s[2 * tid];
            a.stats[2 * qi + 1] = stat_s[2 * tid + 1];
        }
        return;
    }

    // Several chunks: write this chunk's partial, then the unit's last chunk merges. Partial layout:
    // a 16-float header (max of vector v at [v], sum at [NQB + v]), then the unnormalized outputs
    // [NQB][D] (16-byte aligned rows: the merge reads them as float4).
    constexpr int PS = decode_partial_floats(NQB, D);
    float* pp = a.part + static_cast<std::int64_t>(blockIdx.x) * PS;
    for (int idx = tid; idx < nv * D; idx += kDecodeThreads) {
        const int v = idx / D, c = idx % D;
        float o = 0.0f;
#pragma unroll 4
        for (int s = 0; s < NS; ++s) o += red[(s * NQB + v) * D + c];
        pp[16 + v * D + c] = o;
    }
    if (tid < nv) {
        pp[tid] = stat_s[2 * tid];
        pp[NQB + tid] = stat_s[2 * tid + 1];
    }
    __threadfence();
    __syncthreads();
    if (tid == 0) {
        const int done = atomicAdd(a.counters + it.unit, 1);
        *last_flag = done == it.n_items - 1;
    }
    __syncthreads();
    if (!*last_flag) return;
    __threadfence();
    const float* p0 = a.part + static_cast<std::int64_t>(it.first_item) * PS;
    const int nch = it.n_items;
    // Where vector v's (max, sum) go when the caller asked for them.
    auto write_stats = [&](int v, float M, float Ls) {
        const int qv = it.qb * NQB + v;
        const std::int64_t qi = (static_cast<std::int64_t>(it.q_row0) + qv / G) * a.n_heads + it.g * G + qv % G;
        a.stats[2 * qi] = M;
        a.stats[2 * qi + 1] = Ls;
    };
    // Vector v's merged columns 4 c4 .. 4 c4 + 3, o / Ls, into the output (the status word on a non-finite value).
    auto write_out = [&](int v, int c4, const float4& o, float Ls) {
        const float inv = 1.0f / Ls;
        const float ov[4] = {o.x * inv, o.y * inv, o.z * inv, o.w * inv};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int c = c4 * 4 + e;
            if (c < d) {
                if (a.status && !isfinite(ov[e])) atomicOr(a.status, kStatusNonFinite);
                store_any(a.out, a.o_type, out_index(v, c), ov[e]);
            }
        }
    };
    if constexpr (D == 128) {
        // One warp per vector, a float4 of its 128 columns per lane. Per batch of up to 32 chunks the
        // warp issues every load at once -- the lanes' 32 float4 of output and, in lane u, chunk u's
        // (max, sum) -- so the batch costs one L2 round trip; the common max is a warp reduction, the
        // weights 2^(m_u - M) one exponential per lane, handed to the others by shuffles. (The
        // per-thread merge below read each header in every thread and took two round trips for 32
        // chunks: 3-4 us of a B = 1 step, traced on an H100.)
        const int lane = tid & 31;
        for (int v = tid >> 5; v < nv; v += kDecodeThreads / 32) {
            float M = ninf, Ls = 0.0f;
            float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            for (int ch = 0; ch < nch; ch += 32) {
                const int nb = min(32, nch - ch);
                float4 xx[32];
                if (nb == 32) {
#pragma unroll
                    for (int u = 0; u < 32; ++u)
                        xx[u] = __ldcg(reinterpret_cast<const float4*>(p0 + static_cast<std::int64_t>(ch + u) * PS + 16 + v * D) + lane);
                } else {
#pragma unroll
                    for (int u = 0; u < 32; ++u)
                        xx[u] = u < nb ? __ldcg(reinterpret_cast<const float4*>(p0 + static_cast<std::int64_t>(ch + u) * PS + 16 + v * D) + lane)
                                       : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                }
                const float* hc = p0 + static_cast<std::int64_t>(ch + lane) * PS;
                const float mu = lane < nb ? __ldcg(hc + v) : ninf;
                const float lu = lane < nb ? __ldcg(hc + NQB + v) : 0.0f;
                const float Mn = fmaxf(M, warp_max(mu));  // a chunk that saw no row of v has m = -inf
                const float sc = M == ninf ? 0.0f : exp2f(M - Mn);
                M = Mn;
                const float wu = mu == ninf ? 0.0f : exp2f(mu - M);
                Ls = fmaf(Ls, sc, warp_sum(wu * lu));
                o.x *= sc;
                o.y *= sc;
                o.z *= sc;
                o.w *= sc;
#pragma unroll
                for (int u = 0; u < 32; ++u) {
                    const float w = __shfl_sync(0xffffffffu, wu, u);
                    o.x = fmaf(w, xx[u].x, o.x);
                    o.y = fmaf(w, xx[u].y, o.y);
                    o.z = fmaf(w, xx[u].z, o.z);
                    o.w = fmaf(w, xx[u].w, o.w);
                }
            }
            if (a.stats && lane == 0) write_stats(v, M, Ls);
            write_out(v, lane, o, Ls);
        }
        if (tid == 0) a.counters[it.unit] = 0;  // ready for the next launch
        return;
    }
    // The merge: every chunk's partial of this unit, rescaled to a common max. Each thread takes four
    // columns of one vector and reads the chunks in batches of kMergeBatch whose loads are issued
    // together (no predicate: the last partial batch takes the one-at-a-time loop), with the running
    // max, sum and output rescaled once per batch -- one pass, about nch / kMergeBatch L2 round trips
    // (a max pass then a sum pass took twice as many: 1 us more at B = 1, n = 16K; batches of 16 rather
    // than 8: 1-2 us less at B = 1, where a unit has 32 chunks; the registers are free by then).
    constexpr int kMergeBatch = 16;
    for (int idx = tid; idx < nv * (D / 4); idx += kDecodeThreads) {
        const int v = idx / (D / 4), c4 = idx % (D / 4);
        float M = ninf, Ls = 0.0f;
        float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        // Adds partial (m, l, x) at weight 2^(m - M), M already >= m; a chunk that saw no row of this
        // vector has m = -inf and weight 0.
        auto add = [&](float m, float l, const float4& x) {
            const float w = m == ninf ? 0.0f : exp2f(m - M);
            Ls = fmaf(w, l, Ls);
            o.x = fmaf(w, x.x, o.x);
            o.y = fmaf(w, x.y, o.y);
            o.z = fmaf(w, x.z, o.z);
            o.w = fmaf(w, x.w, o.w);
        };
        auto raise = [&](float m_new) {  // M -> m_new >= M, the running sums rescaled
            const float sc = M == ninf ? 0.0f : exp2f(M - m_new);
            Ls *= sc;
            o.x *= sc;
            o.y *= sc;
            o.z *= sc;
            o.w *= sc;
            M = m_new;
        };
        int ch = 0;
        for (; ch + kMergeBatch <= nch; ch += kMergeBatch) {
            float mm[kMergeBatch], ll[kMergeBatch];
            float4 xx[kMergeBatch];
#pragma unroll
            for (int u = 0; u < kMergeBatch; ++u) {
                const float* pc = p0 + static_cast<std::int64_t>(ch + u) * PS;
                mm[u] = __ldcg(pc + v);
                ll[u] = __ldcg(pc + NQB + v);
                xx[u] = __ldcg(reinterpret_cast<const float4*>(pc + 16 + v * D) + c4);
            }
            float mb = M;
#pragma unroll
            for (int u = 0; u < kMergeBatch; ++u) mb = fmaxf(mb, mm[u]);
            raise(mb);
#pragma unroll
            for (int u = 0; u < kMergeBatch; ++u) add(mm[u], ll[u], xx[u]);
        }
        for (; ch < nch; ++ch) {
            const float* pc = p0 + static_cast<std::int64_t>(ch) * PS;
            const float m = __ldcg(pc + v), l = __ldcg(pc + NQB + v);
            const float4 x = __ldcg(reinterpret_cast<const float4*>(pc + 16 + v * D) + c4);
            raise(fmaxf(M, m));
            add(m, l, x);
        }
        if (a.stats && c4 == 0) write_stats(v, M, Ls);
        write_out(v, c4, o, Ls);
    }
    if (tid == 0) a.counters[it.unit] = 0;  // ready for the next launch
}

template <class TC, int D, int NQB>
__global__ void __launch_bounds__(kDecodeThreads) decode_kernel(const __grid_constant__ DecodeArgs<TC> a) {
    using S = DecodeShape<TC, D>;
    constexpr int R = S::R, L = S::L, NS = S::NS, RPT = S::RPT, EPL = S::EPL, VPL = S::VPL, PE = S::PE;
    constexpr float ninf = -INFINITY;
    extern __shared__ __align__(16) unsigned char smem[];
    TC* kt = reinterpret_cast<TC*>(smem);                                    // [S][R][D]
    TC* vt = kt + kDecodeStages * R * D;                                     // [S][R][D]
    float* sc = reinterpret_cast<float*>(vt + kDecodeStages * R * D);        // [NQB][R]
    std::int32_t* rowbuf = reinterpret_cast<std::int32_t*>(sc + NQB * R);    // [S][R]
    float* alpha_s = reinterpret_cast<float*>(rowbuf + kDecodeStages * R);   // [NQB]
    int* last_flag = reinterpret_cast<int*>(alpha_s + NQB);

    const DecodeItem it = a.items[blockIdx.x];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int j = lane % L;       // lane within the row group
    const int slot = tid / L;     // row slot
    const int G = a.group;
    const int nqv = G * it.q_len;  // query vectors of this sequence and KV head
    const int cnt = it.end - it.begin;
    const int ntiles = (cnt + R - 1) / R;
    const int d = a.head_dim;
    const KvBatchView<const TC>& cache = a.cache;
    const std::int32_t* list = a.indices ? a.indices + it.list_base : nullptr;

    // q of the block's query vectors for this lane's columns, times scale * log2(e). (Loaded through
    // load_values -- no branch per load -- this kernel measured 4-8 us slower at B = 1, 16K, for fp16 and
    // fp32 and faster at 128K, with 16 bytes of spill at d = 128 and 4 query vectors: left as it is.)
    float qr[NQB][EPL];
#pragma unroll
    for (int v = 0; v < NQB; ++v) {
        const int qv = it.qb * NQB + v;
        const bool ok = qv < nqv;
        const int i = ok ? qv / G : 0, h = it.g * G + (ok ? qv % G : 0);
        const std::int64_t base = (it.q_row0 + i) * a.q_s0 + h * a.q_s1;
#pragma unroll
        for (int w = 0; w < VPL; ++w)
#pragma unroll
            for (int e = 0; e < PE; ++e) {
                const int c = S::col(j, w, e);
                qr[v][w * PE + e] = ok && c < d ? a.scale_log2 * load_any(a.q, a.q_type, base + c * a.q_s2) : 0.0f;
            }
    }

    RowPipeline<TC, R, NS, RPT> rows{cache, it, list, slot, cnt, ntiles, a.page_shift, {}, {}, {}, 0};
    // Copies of tile `tile` from the rows and pages in row1 / page1.
    auto issue = [&](int tile) {
        const int st = tile % kDecodeStages;
        if (tile < ntiles) {
#pragma unroll
            for (int k = 0; k < RPT; ++k) {
                const int r = slot + k * NS;
                const std::int32_t row = rows.row1[k];
                const bool valid = row >= 0;
                if (j == 0) rowbuf[st * R + r] = row;
                const std::int64_t off = valid ? rows.offset(k) : 0;
                TC* kd = kt + (st * R + r) * D;
                TC* vd = vt + (st * R + r) * D;
                if (a.vec16) {
#pragma unroll
                    for (int w = 0; w < VPL; ++w) {
                        const int c = S::col(j, w, 0);
                        const bool ok = valid && c < d;
                        copy16_async(kd + c, cache.k + off + (ok ? c : 0), ok);
                        copy16_async(vd + c, cache.v + off + (ok ? c : 0), ok);
                    }
                } else {  // element by element (odd head_dim or unaligned rows): synchronous
#pragma unroll
                    for (int w = 0; w < VPL; ++w)
#pragma unroll
                        for (int e = 0; e < PE; ++e) {
                            const int c = S::col(j, w, e);
                            const bool ok = valid && c < d;
                            kd[c] = ok ? cache.k[off + c] : TC{};
                            vd[c] = ok ? cache.v[off + c] : TC{};
                        }
                }
            }
        }
        copy_commit();  // one group per tile slot, empty past the end: the wait counts stay uniform
    };
    // Prologue: tiles 0 .. S-2 in flight; then rows.row1 holds tile S-1, rows.row2 tile S (the
    // invariant at the top of every iteration: row1 = tile + S - 1, row2 = tile + S).
    rows.start();
#pragma unroll
    for (int s = 0; s < kDecodeStages - 1; ++s) {
        issue(s);
        rows.advance(s + 2);
    }

    float acc[NQB][EPL];
#pragma unroll
    for (int v = 0; v < NQB; ++v)
#pragma unroll
        for (int e = 0; e < EPL; ++e) acc[v][e] = 0.0f;
    // Running max and sum of the query vectors this warp owns in the softmax (v = warp + 4 k).
    constexpr int VW = (NQB + 3) / 4;
    float m_run[VW], l_run[VW];
#pragma unroll
    for (int k = 0; k < VW; ++k) {
        m_run[k] = ninf;
        l_run[k] = 0.0f;
    }
    // Visibility limit of each query vector (causal among the new tokens): row <= limit.
    const bool causal = it.q_len > 1;

    for (int tile = 0; tile < ntiles; ++tile) {
        copy_wait<kDecodeStages - 2>();
        __syncthreads();
        issue(tile + kDecodeStages - 1);
        rows.advance(tile + kDecodeStages + 1);
        const int st = tile % kDecodeStages;
        const TC* kts = kt + st * R * D;
        const TC* vts = vt + st * R * D;
        const int tcnt = min(R, cnt - tile * R);

        // Scores of the tile.
#pragma unroll
        for (int k = 0; k < RPT; ++k) {
            const int r = slot + k * NS;
            float part[NQB];
#pragma unroll
            for (int v = 0; v < NQB; ++v) part[v] = 0.0f;
#pragma unroll
            for (int w = 0; w < VPL; ++w) {
                const uint4 u = *reinterpret_cast<const uint4*>(kts + r * D + S::col(j, w, 0));
                float x[PE];
                widen16<TC>(u, x);
#pragma unroll
                for (int v = 0; v < NQB; ++v)
#pragma unroll
                    for (int e = 0; e < PE; ++e) part[v] = fmaf(qr[v][w * PE + e], x[e], part[v]);
            }
            const float s = reduce_scatter<NQB, L>(part, lane);
            if (j < NQB) {
                const int v = reduce_owner<NQB>(lane);
                const int qv = it.qb * NQB + v;
                bool ok = r < tcnt && qv < nqv;
                if (ok && causal) ok = rowbuf[st * R + r] <= it.seq_len - it.q_len + qv / G;
                sc[v * R + r] = ok ? s : ninf;
                if (a.logits && r < tcnt && qv < nqv) {
                    // Entry-major: one slot per (KV head reading the list, query vector) of the entry.
                    const std::int64_t e = it.list_base + it.begin + tile * R + r;
                    const int hs = (a.lists_per_seq == 1 ? it.g * nqv : 0) + qv;
                    a.logits[e * a.logit_stride + hs] = ok ? s : ninf;
                }
            }
        }
        __syncthreads();

        // Online softmax of the tile, one warp per query vector.
#pragma unroll
        for (int k = 0; k < VW; ++k) {
            const int v = warp + 4 * k;
            if (v < NQB) {
                float x0 = lane < R ? sc[v * R + lane] : ninf;
                float x1 = lane + 32 < R ? sc[v * R + lane + 32] : ninf;
                const float mt = warp_max(fmaxf(x0, x1));
                const float mn = fmaxf(m_run[k], mt);
                const float al = mn == ninf ? 1.0f : exp2f(m_run[k] - mn);
                const float p0 = x0 == ninf ? 0.0f : exp2f(x0 - mn);
                const float p1 = x1 == ninf ? 0.0f : exp2f(x1 - mn);
                if (lane < R) sc[v * R + lane] = p0;
                if (lane + 32 < R) sc[v * R + lane + 32] = p1;
                l_run[k] = l_run[k] * al + warp_sum(p0 + p1);
                m_run[k] = mn;
                if (lane == 0) alpha_s[v] = al;
            }
        }
        __syncthreads();

        // P.V over this thread's rows and columns.
#pragma unroll
        for (int v = 0; v < NQB; ++v) {
            const float al = alpha_s[v];
            if (al != 1.0f)
#pragma unroll
                for (int e = 0; e < EPL; ++e) acc[v][e] *= al;
        }
#pragma unroll
        for (int k = 0; k < RPT; ++k) {
            const int r = slot + k * NS;
#pragma unroll
            for (int w = 0; w < VPL; ++w) {
                const uint4 u = *reinterpret_cast<const uint4*>(vts + r * D + S::col(j, w, 0));
                float x[PE];
                widen16<TC>(u, x);
#pragma unroll
                for (int v = 0; v < NQB; ++v) {
                    const float p = sc[v * R + r];
#pragma unroll
                    for (int e = 0; e < PE; ++e) acc[v][w * PE + e] = fmaf(p, x[e], acc[v][w * PE + e]);
                }
            }
        }
    }
    copy_wait<0>();
    __syncthreads();

    // Add the row slots' accumulators: red[slot][v][c] in the (now idle) tile buffers.
    float* red = reinterpret_cast<float*>(smem);
#pragma unroll
    for (int v = 0; v < NQB; ++v)
#pragma unroll
        for (int w = 0; w < VPL; ++w)
#pragma unroll
            for (int e = 0; e < PE; ++e) red[(slot * NQB + v) * D + S::col(j, w, e)] = acc[v][w * PE + e];
    // The softmax warps publish their (max, sum): stat_s[v] = {m, l}.
    float* stat_s = sc;  // [NQB][2]
    if (lane == 0) {
#pragma unroll
        for (int k = 0; k < VW; ++k) {
            const int v = warp + 4 * k;
            if (v < NQB) {
                stat_s[2 * v] = m_run[k];
                stat_s[2 * v + 1] = l_run[k];
            }
        }
    }
    __syncthreads();

    decode_finish<NQB, D, NS>(a, it, red, stat_s, sc, last_flag);
}

// Probabilities of the listed rows: probs[e] = sum over the step's query tokens of the mean over the
// query heads reading the list of exp2(logit - M) / L (0 where the row was masked).
struct ProbArgs {
    const float* logits = nullptr;
    const float* stats = nullptr;
    float* probs = nullptr;
    const std::int32_t* list_indptr = nullptr;  // device copy of the plan's indptr
    const std::int32_t* q_indptr = nullptr;     // device, [B + 1] (null: one query per sequence)
    std::int64_t n_entries = 0, logit_stride = 0;
    int n_lists = 0, lists_per_seq = 1, n_kv_heads = 1, group = 1, n_heads = 1;
};

// The probability of entry e of list l (of sequence l / lists_per_seq) from the decode kernel's scores
// and stats: summed over the sequence's new tokens, averaged over the query heads that read the list.
// One function for decode_probs_kernel and the consumers of deferred probabilities
// (DecodeOptions::defer_probs, H2ODecode::observe(plan)), so that both compute the same bits.
//
// The entry's scores are contiguous (k = gi * nqv + qv, in that order): they and their queries' (max,
// sum) are loaded eight at a time before any is used, so that the round trips overlap (one at a time
// they made a chain of up to 2 x ng x nqv waits), and summed in order k, skipping masked ones.
__device__ __forceinline__ float decode_entry_prob(const ProbArgs& a, std::int64_t e, int l) {
    const int b = l / a.lists_per_seq;
    const int q0 = a.q_indptr ? a.q_indptr[b] : b;
    const int q_len = a.q_indptr ? a.q_indptr[b + 1] - q0 : 1;
    const int nqv = a.group * q_len;
    const int g0 = a.lists_per_seq == 1 ? 0 : l % a.lists_per_seq;
    const int ng = a.lists_per_seq == 1 ? a.n_kv_heads : 1;
    const int total = ng * nqv;
    const float* x_e = a.logits + e * a.logit_stride;
    float p = 0.0f;
    const float2* stats = reinterpret_cast<const float2*>(a.stats);  // (max, sum) per query and head
    for (int k0 = 0; k0 < total; k0 += 8) {
        float x[8];
        float2 ms[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int k = k0 + j;
            x[j] = -INFINITY;
            ms[j] = make_float2(0.0f, 1.0f);
            if (k < total) {
                const int gi = k / nqv, qv = k - gi * nqv;
                const int i = qv / a.group, h = (g0 + gi) * a.group + qv % a.group;
                x[j] = x_e[k];
                ms[j] = stats[static_cast<std::int64_t>(q0 + i) * a.n_heads + h];
            }
        }
#pragma unroll
        for (int j = 0; j < 8; ++j)
            if (x[j] != -INFINITY) p += exp2f(x[j] - ms[j].x) / ms[j].y;  // masked (or past the entry's scores): skipped
    }
    return p / static_cast<float>(ng * a.group);
}

// (A template, as every kernel of this header-only library: a plain __global__ function defined in a
// header is defined again in every translation unit that includes it.)
template <int Unused = 0>
__global__ void decode_probs_kernel(const ProbArgs a) {
    const std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (e >= a.n_entries) return;
    // The list holding entry e: binary search over indptr.
    int lo = 0, hi = a.n_lists;
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (a.list_indptr[mid] <= e) lo = mid;
        else hi = mid;
    }
    a.probs[e] = decode_entry_prob(a, e, lo);
}

// Device-side checks of what the host cannot see without reading device memory: the device lengths
// and indptr equal the plan's, list entries sorted / unique / in range, block-table entries of the
// pages in use inside the pool, and the first new token sees at least one listed row. The first
// failure found is reported as {code, sequence, list, entry, value} in `report` (code 0: none).
inline constexpr int kCheckSeqLen = 1, kCheckIndptr = 2, kCheckOrder = 3, kCheckRange = 4, kCheckPage = 5,
                     kCheckVisible = 6;

template <class TC>
__global__ void decode_check_kernel(KvBatchView<const TC> cache, const std::int32_t* list_indptr,
                                    const std::int32_t* indices, int lists_per_seq, const std::int32_t* plan_seq_lens,
                                    const std::int32_t* plan_indptr, const std::int32_t* plan_q_len,
                                    long long* report) {
    const int b = blockIdx.x;
    auto fail = [&](int code, long long l, long long e, long long v) {
        // Lowest (sequence, code) wins; the fields are written by the winner only.
        const unsigned long long key = (static_cast<unsigned long long>(b) << 8) | static_cast<unsigned>(code);
        const unsigned long long prev = atomicMin(reinterpret_cast<unsigned long long*>(report), key);
        if (key < prev) {
            report[1] = b;
            report[2] = l;
            report[3] = e;
            report[4] = v;
            report[5] = code;
        }
    };
    const std::int32_t len = plan_seq_lens[b];
    if (threadIdx.x == 0 && cache.seq_lens[b] != len) fail(kCheckSeqLen, -1, -1, cache.seq_lens[b]);
    if (cache.block_table) {
        const std::int64_t pages = (len + cache.page_size - 1) / cache.page_size;
        for (std::int64_t p = threadIdx.x; p < pages; p += blockDim.x) {
            const std::int32_t pg = cache.block_table[b * cache.block_table_stride + p];
            if (pg < 0 || pg >= cache.n_pages) fail(kCheckPage, -1, p, pg);
        }
    }
    if (!list_indptr) return;
    for (int l = 0; l < lists_per_seq; ++l) {
        const int li = b * lists_per_seq + l;
        if (threadIdx.x == 0 && (list_indptr[li] != plan_indptr[li] || list_indptr[li + 1] != plan_indptr[li + 1]))
            fail(kCheckIndptr, l, li, list_indptr[li]);
        const std::int32_t e0 = plan_indptr[li], e1 = plan_indptr[li + 1];
        for (std::int32_t e = e0 + static_cast<std::int32_t>(threadIdx.x); e < e1; e += blockDim.x) {
            const std::int32_t r = indices[e];
            if (r < 0 || r >= len) fail(kCheckRange, l, e - e0, r);
            else if (e > e0 && indices[e - 1] >= r) fail(kCheckOrder, l, e - e0, r);
        }
        if (threadIdx.x == 0 && e1 > e0 && indices[e0] > len - plan_q_len[b]) fail(kCheckVisible, l, 0, indices[e0]);
    }
}

}  // namespace vlsparse::cuda::detail
