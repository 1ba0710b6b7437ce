// vlsparse/cuda/prefill/kernels_mma.cuh -- the tiled prefill attention kernel on tensor cores:
// online softmax, bf16 / fp16 inputs, fp32 accumulation, head dims 64 and 128. Internal to
// vlsparse/cuda/prefill.cuh (namespace vlsparse::cuda::detail). Two instruction paths, one kernel:
//   - mma.sync m16n8k16 (sm_80+): K and V fragments read from shared memory with ldmatrix;
//   - wgmma (sm_90a, Hopper; template flag WG, used on a cc 9.0 GPU): each group of 4 warps (a
//     warpgroup, 64 m rows) issues S = Q K^T as wgmma m64n64k16 (Q from registers, K read by the
//     tensor cores straight from shared memory through a matrix descriptor) and O += P V as m64n{D}k16
//     (P from registers, V transposed by the instruction). Warp-specialized: a third warpgroup only copies the
//     key tiles (the bulk tensor copy engine for whole tiles of positions, cp.async for the others;
//     handed over through mbarriers), the two compute warpgroups run without a
//     block barrier and take turns on the tensor cores (ping-pong). Compiled without sm_90a
//     (__CUDA_ARCH_FEAT_SM90_ALL undefined), the WG instantiation runs the mma.sync loop on its first
//     8 warps.
// Both paths share the shared-memory layout (K and V tiles in 128-byte-swizzled atoms of 8 rows x 64
// elements, the layout wgmma's descriptors name), the segments, the masks and the softmax: the
// accumulator fragments of wgmma m64nNk16 give each warp 16 rows in the same register order as
// mma.sync m16n8k16 (row lane / 4 and + 8, columns 2 (lane % 4) + {0, 1} of each 8-column chunk).
//
// One block computes 128 "m rows" against a sequence of key tiles. An m row is a (query row, query
// head) pair: with heads_packed = hp > 1 the hp query heads of a KV group are packed row-minor
// (m = row * hp + head_in_group), so every K / V tile a block loads serves its whole head group; with
// hp = 1 a block holds one head's rows. Each of the 8 compute warps owns 16 m rows (mma.sync: their Q
// fragments stay in registers), S = Q K^T and O += P V run on the tensor cores with P rounded to the input type (the
// usual FlashAttention arithmetic), the running max and sum in fp32, exp2 on the special-function
// unit in the log2 domain.
//
// The keys a block reads are a list of segments, each a contiguous range of "key entries" with a
// mask kind; a segment is cut into tiles of 64 entries from its own start (no block alignment), so a
// strip of 18 text keys costs one tile of 18 valid columns, not a block of 128:
//   - entries are positions themselves (dense, block-sparse) or indices into a key list whose
//     entries are the positions (token-sparse: ZipVL's kept rows, read in place, no gather pass);
//   - kFull: every pair of the tile is allowed (no mask is evaluated); kCausal: allowed when the
//     key's position is at or before the row's; kGeneral: the template / video mask of
//     vlsparse/masks/templates.hpp evaluated per element (the block's partial tiles only). A tile
//     marked kCausal whose last key lies at or before every row of the block runs unmasked;
//   - kDiagonal (block-sparse): row r sees the one key r - delta of the segment; not tiled, computed
//     per row on the CUDA cores after the tiles.
// K and V tiles go through a ring in shared memory (cp.async or, wgmma path, TMA; XOR-swizzled 16-byte
// chunks; 3 stages for mma.sync, 5 for wgmma); the positions of the next tile's rows are fetched one tile ahead.
//
// Outputs: o = (sum p v) / (sum p), 0 for a row that sees no key; rounded to the output type. With a
// status pointer, a non-finite output (NaN / Inf in what was read, an fp32 overflow of a score) sets
// bit 1 of *status; the host turns it into an error.
#pragma once

#include <cuda.h>  // CUtensorMap (the bulk tensor copy's descriptor); no driver call is made here
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <type_traits>

#include "vlsparse/cuda/common.cuh"
#include "vlsparse/cuda/hopper.cuh"
#include "vlsparse/masks/mask_view.hpp"
#include "vlsparse/masks/segment_plan.hpp"

namespace vlsparse::cuda::detail {

inline constexpr int kPrefillThreads = 256;  // 8 warps (the compute warps)
// wgmma: a block has a third warpgroup, the producer, that copies the key tiles (warp specialization).
inline constexpr int kPrefillThreadsWS = 384;
// setmaxnreg: the producer gives registers back, the compute warps take them. A block starts with its
// launch allocation (__launch_bounds__(384, 1): 168 per thread), and an increase waits until the block's
// pool holds what it asks for: 128 x producer + 256 x consumer above 384 x 168 hangs the block (seen on
// an H200 with 80 / 216).
inline constexpr int kPrefillProducerRegs = 56;
inline constexpr int kPrefillConsumerRegs = 224;
static_assert(128 * kPrefillProducerRegs + 256 * kPrefillConsumerRegs <= 384 * 168,
              "setmaxnreg would ask for more registers than the block holds");
inline constexpr int kPrefillRows = 128;     // m rows per block (16 per warp)
inline constexpr int kPrefillKeys = 64;      // key entries per tile

// Segment kinds: those of masks/segment_plan.hpp, plus kSegTail (kernel-internal: a short tile of a full
// segment, which checks only that its entries exist).
enum PrefillSegKind : int {
    kSegFull = ::vlsparse::detail::kKeySegFull,
    kSegCausal = ::vlsparse::detail::kKeySegCausal,
    kSegGeneral = ::vlsparse::detail::kKeySegGeneral,
    kSegTail = 3,
    kSegDiagonal = ::vlsparse::detail::kKeySegDiagonal,
};
static_assert(kSegTail != kSegFull && kSegTail != kSegCausal && kSegTail != kSegGeneral && kSegTail != kSegDiagonal);

// A contiguous range of key entries [lo, hi), its mask kind and (diagonal) the row-to-key distance.
using PrefillSegment = ::vlsparse::detail::KeySegment;

// A block of the block-sparse front end: one query head, rows [row_lo, row_hi) (positions), its key
// segments segs[seg_begin, seg_end).
using PrefillItem = ::vlsparse::detail::SegmentItem;

// The mask of vlsparse/masks/templates.hpp on the device (MaskedPrefillPlan uploads a MaskContext's
// arrays as int32 and the head templates): what kGeneral tiles evaluate, by the library's one rule
// (masks/mask_view.hpp).
using DeviceMask = BlockMaskView<std::int32_t>;
using MaskRow = MaskRowFacts<int>;

// What the rule needs of a query row, read once per block (MaskContextView::row: read-only loads; i <
// 0: a padding row).
__device__ __forceinline__ MaskRow mask_row(const DeviceMask& m, int i, int head) {
    const int tmpl = m.head_template[head];
    if (i >= 0) return m.context.row(tmpl, i);
    MaskRow r;
    r.tmpl = tmpl;
    return r;
}

// MaskContext::allows(t, i, j) for a row read by mask_row; b = token_image[j], sink = token_sink[j]
// (staged beside the key tile).
__device__ __forceinline__ bool mask_allows(const DeviceMask& m, const MaskRow& r, int i, int j, int b, bool sink) {
    return mask_rule_allows<int>(r, m.context.video, m.context.video_window, m.context.video_dilation, i, j, b, sink);
}

struct PrefillArgs {
    const void* q = nullptr;  // [n_q, H, d], unit inner stride
    const void* k = nullptr;  // [n_k, H_kv, d]
    const void* v = nullptr;
    void* out = nullptr;      // [n_q, H, d], any strides
    std::int64_t q_s0 = 0, q_s1 = 0, k_s0 = 0, k_s1 = 0, v_s0 = 0, v_s1 = 0, o_s0 = 0, o_s1 = 0, o_s2 = 0;
    int H = 0, Hkv = 0, G = 1;  // query heads, KV heads, query heads per KV head
    int n_k = 0;                // key rows of k and v
    int hp = 1;                 // heads packed per m row group (G, or 1 for per-head items)
    int q_offset = 0;           // position of query row r: r + q_offset (dense: n_k - n_q)
    float scale_log2 = 0.0f;    // softmax scale * log2(e)
    // Rows. Dense / token-sparse: grid (m tiles, KV heads). rows_list null: rows [0, n_rows) of every
    // group; otherwise group g's rows are rows_list[rows_indptr[g*rows_per_group] ...] (positions).
    int n_rows = 0;
    const std::int32_t* rows_list = nullptr;
    const std::int32_t* rows_indptr = nullptr;
    int rows_per_group = 0;     // 1: one list per KV head, 0: one list shared by all
    // Keys. keys_list null: entries are positions; otherwise entries index keys_list (group g's list
    // starts at keys_indptr[g*keys_per_group]); the segment of a dense / token-sparse block is
    // [0, count of entries at or before the block's last row), kind kCausal.
    const std::int32_t* keys_list = nullptr;
    const std::int32_t* keys_indptr = nullptr;
    int keys_per_group = 0;
    // Kept keys (with keys_list): entry e of group g's list is row e of k / v (head g) -- a cache already
    // compacted to the list, as ZipVL's eviction leaves it --, its position keys_list[e]. 0: row keys_list[e].
    int keys_kept = 0;
    // Block-sparse: items (grid.x = n_items, hp = 1) with their segments, and the mask.
    const PrefillItem* items = nullptr;
    const PrefillSegment* segs = nullptr;
    DeviceMask mask;
    int* status = nullptr;      // bit 1: a non-finite output
    // Optional: each row's log-sum-exp (natural log of sum_j exp(scale q . k_j) over the keys it saw, -inf for
    // none) at lse[r * lse_s0 + h * lse_s1], r the row of out. What FlashAttention calls softmax_lse: the row
    // statistics a second pass over some keys needs to turn scores into probabilities (A-VL's text budget).
    float* lse = nullptr;
    std::int64_t lse_s0 = 0, lse_s1 = 0;
    // The bulk tensor copy (wgmma path only): K and V as 3-D tensor maps {d, n_k, H_kv} of 64 x 64 boxes
    // with the 128-byte swizzle (one box per 64-column plane of a tile). tma = 1: every whole tile whose
    // entries are positions (dense, block-sparse without key metadata) is copied by one thread through
    // them; short tiles, gathered rows (token-sparse) and tiles with key metadata keep the cp.async copies.
    // Kept keys (keys_kept) are whole tiles of rows too: copied the same way, their positions from the list.
    CUtensorMap tmap_k{}, tmap_v{};
    int tma = 0;
};

// Tiles and shared memory of the kernel for head dim D with a ring of ST K / V stages (3 for mma.sync,
// 5 for the warp-specialized wgmma loop).
template <int D, int ST = 3>
struct PrefillShape {
    static_assert(D == 64 || D == 128, "the tensor-core prefill kernel takes head_dim 64 or 128");
    static constexpr int BM = kPrefillRows, BN = kPrefillKeys, NT = kPrefillThreads;
    static constexpr int CPR = D / 8;            // 16-byte chunks per row
    static constexpr int RPP = NT / CPR;         // rows per copy pass
    static constexpr int KPT = BN / RPP;         // key rows per thread per tile (4 or 2)
    static constexpr int QPT = BM / RPP;         // q rows per thread (8 or 4)
    static constexpr int KS = D / 16;            // k-steps of Q K^T
    static constexpr int DT = D / 8;             // n8 tiles of O
    static constexpr int TILE = BN * D;          // elements of one K (or V) tile
    static constexpr int STAGES = ST;            // K / V tiles in flight
    // Element offset of chunk c (8 elements) of row r in a tile of R rows, in wgmma's 128-byte swizzle
    // (hopper.cuh: swizzle128_offset). Q tiles have BM rows, K / V tiles BN.
    template <int R>
    __device__ static constexpr int swz_rows(int r, int c) { return swizzle128_offset<R>(r, c); }
    __device__ static constexpr int swz(int r, int c) { return swz_rows<BM>(r, c); }
    __device__ static constexpr int swz_kv(int r, int c) { return swz_rows<BN>(r, c); }
    static constexpr int PLANE_BYTES = BN * 128;    // one 64-column plane of a K / V tile
    static constexpr int Q_PLANE_BYTES = BM * 128;  // of the Q tile
    // [stage][K, V][TILE] (1024-byte aligned), Q [BM x D], then positions, images and sinks [stage][BN];
    // 1024 bytes of slack to align the base.
    // (+ the warp-specialized loop's full / empty mbarriers [STAGES] and each stage's tile kind, last key
    // position, first entry and entry count [STAGES][4].)
    static constexpr std::size_t smem_bytes() {
        return static_cast<std::size_t>(2 * STAGES * TILE + BM * D) * 2 + 3 * STAGES * BN * sizeof(int) +
               2 * STAGES * sizeof(std::uint64_t) + 4 * STAGES * sizeof(int) + 1024;
    }
};

__device__ __forceinline__ float prefill_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
// x rounded to T and back (P's rounding before P V).
template <class T>
__device__ __forceinline__ float prefill_round(float x) {
    const unsigned r = pack_pair<T>(x, x);
    if constexpr (std::is_same_v<T, bfloat16>) return __uint_as_float(r << 16);
    else return __half2float(__ushort_as_half(static_cast<unsigned short>(r & 0xffffu)));
}

// (The wgmma, mbarrier, bulk-copy and setmaxnreg helpers: vlsparse/cuda/hopper.cuh.)

// The compute warps' barrier when a block also has a producer warpgroup (named barrier 1, 256 threads).
__device__ __forceinline__ void sync_compute_warps() { asm volatile("bar.sync 1, 256;\n" ::: "memory"); }

// Walks the key tiles of a block: segment by segment, 64 entries at a time from each segment's start.
struct TileCursor {
    int seg = 0, seg_end = 0, lo = 0, hi = 0, kind = kSegFull;  // current segment
    int tile = 0;                                                // first entry of the current tile
    bool valid = false;
    __device__ void load(const PrefillSegment* segs) {
        while (seg < seg_end) {
            const PrefillSegment s = segs[seg];
            if (s.hi > s.lo && s.kind != kSegDiagonal) {  // diagonal segments are not tiled
                lo = s.lo;
                hi = s.hi;
                kind = s.kind;
                tile = s.lo;
                valid = true;
                return;
            }
            ++seg;
        }
        valid = false;
    }
    __device__ void next(const PrefillSegment* segs) {
        tile += kPrefillKeys;
        if (tile < hi) return;
        ++seg;
        load(segs);
    }
};

// What one block of a prefill launch computes (shared by the tensor-core and the CUDA-core kernels):
// its KV group g, first query head head0, heads packed per row hp, m rows [mbase, mbase + m_count)
// (block-sparse items: mbase is the first row's position; otherwise the first m index, m = row index *
// hp + head in group, the row index mapping to a position through rlist or q_offset), and its key
// segments: segs[seg_begin, seg_end) of the plan, or (segs null) the one causal segment `one` over the
// entries at or before the block's last row (klist: entries index the group's key list). m_count <= 0:
// the block has no rows (the grid is sized for the longest list).
struct PrefillBlockWork {
    int g = 0, head0 = 0, hp = 1, m_count = 0, mbase = 0, seg_begin = 0, seg_end = 1;
    const std::int32_t* rlist = nullptr;
    const std::int32_t* klist = nullptr;
    const PrefillSegment* segs = nullptr;
    PrefillSegment one{};

    // Position and query head of local m row lm; position -1 for rows past the end.
    __device__ __forceinline__ void row(const PrefillArgs& a, int lm, int& pos, int& head) const {
        if (lm >= m_count) {
            pos = -1;
            head = head0;
            return;
        }
        if (a.items) {
            pos = mbase + lm;
            head = head0;
        } else {
            const int m = mbase + lm, r = m / hp;
            head = head0 + (m - r * hp);
            pos = rlist ? rlist[r] : r + a.q_offset;
        }
    }
};
__device__ __forceinline__ PrefillBlockWork prefill_block_work(const PrefillArgs& a, int bm) {
    PrefillBlockWork w;
    w.hp = a.hp;
    if (a.items) {
        const PrefillItem it = a.items[blockIdx.x];
        w.head0 = it.head;
        w.g = it.head / a.G;
        w.hp = 1;
        w.mbase = it.row_lo;
        w.m_count = it.row_hi - it.row_lo;
        w.segs = a.segs;
        w.seg_begin = it.seg_begin;
        w.seg_end = it.seg_end;
        return w;
    }
    w.g = blockIdx.y;
    w.head0 = w.g * a.G;
    int rows = a.n_rows;
    if (a.rows_list) {
        const int l = w.g * a.rows_per_group;
        const int r0 = a.rows_indptr[l];
        rows = a.rows_indptr[l + 1] - r0;
        w.rlist = a.rows_list + r0;
    }
    const int tiles = (rows * w.hp + bm - 1) / bm;
    if (static_cast<int>(blockIdx.x) >= tiles) return w;  // m_count 0
    const int mt = tiles - 1 - static_cast<int>(blockIdx.x);  // the longest rows first
    const int m0 = mt * bm;
    // m rows of this block: [m0, min(m0 + bm, rows * hp)); m - m0 indexes them, row = m / hp.
    w.m_count = min(bm, rows * w.hp - m0);
    // Keys: entries [0, upper) where upper counts the entries at or before the last row's position.
    const int last_row = (m0 + w.m_count - 1) / w.hp;
    const int last_pos = w.rlist ? w.rlist[last_row] : last_row + a.q_offset;
    int upper = last_pos + 1;
    if (a.keys_list) {
        const int l = w.g * a.keys_per_group;
        const int k0 = a.keys_indptr[l], k1 = a.keys_indptr[l + 1];
        w.klist = a.keys_list + k0;
        int lo = 0, hi = k1 - k0;  // first entry with position > last_pos
        while (lo < hi) {
            const int mid = (lo + hi) >> 1;
            if (w.klist[mid] <= last_pos) lo = mid + 1;
            else hi = mid;
        }
        upper = lo;
    }
    w.one.lo = 0;
    w.one.hi = upper;
    w.one.kind = kSegCausal;
    w.mbase = m0;
    return w;
}

// WG: the wgmma path where this code is compiled for sm_90a (else the mma.sync path, same results).
template <class T, class TO, int D, bool WG>
__global__ void __launch_bounds__(WG ? kPrefillThreadsWS : kPrefillThreads, 1) prefill_mma_kernel(const __grid_constant__ PrefillArgs a) {
    using S = PrefillShape<D, WG ? 5 : 3>;
    constexpr bool use_wgmma = WG && VLSPARSE_CUDA_HAS_WGMMA;
    // A WG block compiled without sm_90a runs the mma.sync loop on its first 256 threads.
    if constexpr (WG && !use_wgmma) {
        if (threadIdx.x >= kPrefillThreads) return;
    }
    auto sync_compute = [&]() {
        if constexpr (WG) sync_compute_warps();
        else __syncthreads();
    };
    extern __shared__ __align__(16) unsigned char prefill_smem[];
    // The K / V ring starts at the first 1024-byte boundary (the swizzle atoms of wgmma's descriptors).
    const unsigned smem_raw = static_cast<unsigned>(__cvta_generic_to_shared(prefill_smem));
    T* skv = reinterpret_cast<T*>(prefill_smem + (((smem_raw + 1023u) & ~1023u) - smem_raw));  // [stage][K, V][TILE]
    T* sq = skv + 2 * S::STAGES * S::TILE;
    int* skpos = reinterpret_cast<int*>(sq + S::BM * D);  // [stage][BN] key position, -1: empty
    int* skimg = skpos + S::STAGES * S::BN;   // [stage][BN] the key's image (template masks)
    int* sksink = skimg + S::STAGES * S::BN;  // [stage][BN] the key is a sink
    std::uint64_t* full_bar = reinterpret_cast<std::uint64_t*>(sksink + S::STAGES * S::BN);  // [stage] (wgmma)
    std::uint64_t* empty_bar = full_bar + S::STAGES;                                         // [stage] (wgmma)
    int* smeta = reinterpret_cast<int*>(empty_bar + S::STAGES);  // [stage][kind, last key position, first, count] (wgmma)

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

    // ---- what this block computes -------------------------------------------------------------------
    const PrefillBlockWork w = prefill_block_work(a, S::BM);
    if (w.m_count <= 0) return;
    const int g = w.g;
    const std::int32_t* klist = w.klist;
    const PrefillSegment one = w.one;
    const PrefillSegment* segs = w.segs ? w.segs : &one;
    const int seg_begin = w.seg_begin, seg_end = w.seg_end;

    // Row (position, head) of local m row lm; position -1 for rows past the end.
    auto row_of = [&](int lm, int& pos, int& head) { w.row(a, lm, pos, head); };

    // ---- Q tile into shared memory ------------------------------------------------------------------
    if (tid < kPrefillThreads) {
        const int c = tid % S::CPR;
#pragma unroll
        for (int i = 0; i < S::QPT; ++i) {
            const int lm = tid / S::CPR + i * S::RPP;
            int pos, head;
            row_of(lm, pos, head);
            const T* src = static_cast<const T*>(a.q) + static_cast<std::int64_t>(pos < 0 ? 0 : pos - a.q_offset) * a.q_s0 +
                           static_cast<std::int64_t>(head) * a.q_s1 + c * 8;
            copy16_async(sq + S::swz(lm, c), src, pos >= 0);
        }
        copy_commit();
    }

    // ---- key tiles ------------------------------------------------------------------------------------
    const T* kbase = static_cast<const T*>(a.k) + static_cast<std::int64_t>(g) * a.k_s1;
    const T* vbase = static_cast<const T*>(a.v) + static_cast<std::int64_t>(g) * a.v_s1;
    const bool masked = a.mask.context.token_image != nullptr;
    TileCursor ld{seg_begin, seg_end};
    ld.load(segs);
    // Kind and last key position of each stage's tile, kept by every thread (the cursor is uniform across
    // the block). A short tile (past its segment's end) of a full segment checks only that its entries
    // exist (kSegTail); other kinds mask the empty entries (position -1) anyway.
    int kind_q[S::STAGES], last_q[S::STAGES];
    // Token-sparse keys: the list entries of the cursor's tile, fetched one issue ahead (the loads are
    // in flight while the tile before is computed, not waited for at the copy that needs them).
    int kpf[S::KPT], kpf_last = 0;
    auto fetch = [&]() {
        if (!klist || !ld.valid) return;
#pragma unroll
        for (int i = 0; i < S::KPT; ++i) {
            const int e = ld.tile + tid / S::CPR + i * S::RPP;
            kpf[i] = e < ld.hi ? __ldg(klist + e) : -1;
        }
        kpf_last = __ldg(klist + min(ld.tile + S::BN, ld.hi) - 1);
    };
    fetch();
    auto issue = [&](int st) {  // the cursor's tile into stage st, then the cursor advances
        const int last = min(ld.tile + S::BN, ld.hi) - 1;
        const bool short_tile = ld.tile + S::BN > ld.hi;
        kind_q[st] = short_tile && ld.kind == kSegFull ? kSegTail : ld.kind;
        last_q[st] = short_tile ? INT_MAX : (klist ? kpf_last : last);
        T* sk = skv + st * 2 * S::TILE;
        T* sv = sk + S::TILE;
        const int c = tid % S::CPR;
#pragma unroll
        for (int i = 0; i < S::KPT; ++i) {
            const int r = tid / S::CPR + i * S::RPP;
            const int e = ld.tile + r;
            const bool ok = e < ld.hi;
            const int pos = ok ? (klist ? kpf[i] : e) : -1;
            const std::int64_t p = pos < 0 ? 0 : (a.keys_kept ? e : pos);  // the source row
            copy16_async(sk + S::swz_kv(r, c), kbase + p * a.k_s0 + c * 8, ok);
            copy16_async(sv + S::swz_kv(r, c), vbase + p * a.v_s0 + c * 8, ok);
            if (c == 0) {
                skpos[st * S::BN + r] = pos;
                if (masked && ld.kind == kSegGeneral) {  // what the template mask needs of the key (general tiles only)
                    skimg[st * S::BN + r] = pos < 0 ? -1 : __ldg(a.mask.context.token_image + pos);
                    sksink[st * S::BN + r] = pos < 0 ? 0 : __ldg(a.mask.context.token_sink + pos);
                }
            }
        }
        ld.next(segs);
        fetch();
    };
    // Prologue (mma.sync): the first 2 tiles in flight (one commit group each, empty when there is none).
    int n_issued = 0;
    if constexpr (!use_wgmma) {
#pragma unroll
        for (int st = 0; st < 2; ++st) {
            if (ld.valid) {
                issue(st);
                ++n_issued;
            }
            copy_commit();
        }
    }

    // Rows of this thread: r0 = lane / 4 and r0 + 8 of the warp's 16.
    int qpos[2], qhead[2];
    row_of(warp * 16 + (lane >> 2), qpos[0], qhead[0]);
    row_of(warp * 16 + (lane >> 2) + 8, qpos[1], qhead[1]);
    // The block's smallest row position (positions ascend with m): a causal tile whose keys all lie at
    // or before it runs unmasked.
    int min_pos, head_first;
    row_of(0, min_pos, head_first);
    // What the template mask needs of each row, once (block-sparse items only).
    MaskRow mrows[2];
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) mrows[rr] = masked ? mask_row(a.mask, qpos[rr], qhead[rr]) : MaskRow{};

    if constexpr (use_wgmma) {
        if (tid == 0) {
            for (int st = 0; st < S::STAGES; ++st) {
                mbar_init(full_bar + st, kPrefillThreadsWS - kPrefillThreads);  // every producer thread
                mbar_init(empty_bar + st, kPrefillThreads);                     // every compute thread
            }
        }
        copy_wait<0>();              // Q
        fence_proxy_async_shared();  // Q, before wgmma reads it
        __syncthreads();             // Q and the initialized barriers, for all three warpgroups
    } else {
        copy_wait<2>();  // Q (the oldest group; the two tiles of the prologue may still be in flight)
        sync_compute();
    }
    // Q's A fragments in registers for the whole block, on both paths (the warp's 16 rows: wgmma's m64 A
    // fragment gives each warp of the warpgroup the mma.sync layout of its 16 rows). wgmma reads them
    // asynchronously, so every issue of S is preceded by a register fence on them (wgmma_reg_fence_u);
    // an earlier version without it saw ptxas 13.0 reuse those registers inside the loop. A
    // from registers halves S's shared-memory operand traffic against Q read through a descriptor
    // (3.5% faster dense, H200).
    unsigned qf[S::KS][4];
    auto load_q_fragments = [&]() {
        const int r = warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
        for (int ks = 0; ks < S::KS; ++ks)
            ldsm_x4(qf[ks][0], qf[ks][1], qf[ks][2], qf[ks][3], sq + S::swz(r, 2 * ks + (lane >> 4)));
    };
    if constexpr (!use_wgmma) load_q_fragments();

    float o[S::DT][4];
#pragma unroll
    for (int j = 0; j < S::DT; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.0f, 0.0f};

    // S = Q K^T for the warp's 16 rows x the 64 keys of the tile in `stage`: mma.sync computes it here;
    // wgmma issues it (one commit group) and leaves the wait to the caller.
    auto qk = [&](float (&s)[8][4], int stage) {
        const T* sk = skv + stage * 2 * S::TILE;
        if constexpr (use_wgmma) {
            // The warpgroup's 64 rows x 64 keys: k-step ks reads columns 16 ks .. of every Q and key row,
            // in plane ks / 4 at byte 32 (ks % 4) of each 128-byte row (the swizzle applies to the address).
            float(&sf)[32] = reinterpret_cast<float(&)[32]>(s);
            const unsigned kaddr = static_cast<unsigned>(__cvta_generic_to_shared(sk));
            wgmma_reg_fence(sf);
            wgmma_reg_fence_u(qf);
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < S::KS; ++ks)
                wgmma_rs_n64<T, 0>(sf, qf[ks][0], qf[ks][1], qf[ks][2], qf[ks][3],
                                   wgmma_desc(kaddr + (ks >> 2) * S::PLANE_BYTES + (ks & 3) * 32, 16, 1024), ks > 0);
            wgmma_commit();
        } else {
#pragma unroll
            for (int j = 0; j < 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < S::KS; ++ks) {
#pragma unroll
                for (int j = 0; j < 8; j += 2) {
                    unsigned b0, b1, b2, b3;
                    const int r = j * 8 + (lane & 7) + (lane >> 4) * 8;
                    ldsm_x4(b0, b1, b2, b3, sk + S::swz_kv(r, 2 * ks + ((lane >> 3) & 1)));
                    mma_m16n8k16<T>(s[j], qf[ks][0], qf[ks][1], qf[ks][2], qf[ks][3], b0, b1);
                    mma_m16n8k16<T>(s[j + 1], qf[ks][0], qf[ks][1], qf[ks][2], qf[ks][3], b2, b3);
                }
            }
        }
    };

    // The mask and the online softmax of the tile in `stage`: s becomes P (fp32), the row sums are
    // rescaled to the new row maxima, and p_scale gets the factor for O (applied by the caller).
    // `first` >= 0: the tile's entries are the positions first, first + 1, ... (no key list), `nvalid` of
    // them (a short tile's other columns are empty); causal and short tiles are then masked by one compare
    // per element against a per-row column limit, without reading the positions from shared memory (the
    // masked tiles of block-sparse plans -- a causal diagonal per query block -- had spent as long on that
    // as on their matrix products, ncu). first < 0: the positions are read per column.
    auto softmax = [&](float (&s)[8][4], int stage, int kind, int last, int first, int nvalid, float (&p_scale)[2]) {
        // Mask: kFull tiles none; kCausal tiles only when their last key lies after the block's first row.
        const int* kp = skpos + stage * S::BN;
        const bool need_mask = kind == kSegGeneral || kind == kSegTail || (kind == kSegCausal && last > min_pos);
        if (need_mask && kind != kSegGeneral && first >= 0) {
#pragma unroll
            for (int rr = 0; rr < 2; ++rr) {
                // The last column row rr sees (a padding row: none), less this thread's column offset.
                const int lim = (qpos[rr] < 0 ? -1 : kind == kSegTail ? nvalid - 1 : min(qpos[rr] - first, nvalid - 1)) -
                                (lane & 3) * 2;
#pragma unroll
                for (int j = 0; j < 8; ++j)
#pragma unroll
                    for (int e = 0; e < 2; ++e)
                        if (j * 8 + e > lim) s[j][2 * rr + e] = -INFINITY;
            }
        } else if (need_mask) {
            const int* ki = skimg + stage * S::BN;
            const int* ks_ = sksink + stage * S::BN;
#pragma unroll
            for (int j = 0; j < 8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int col = j * 8 + (lane & 3) * 2 + (e & 1);
                    const int rr = e >> 1;
                    const int kpos = kp[col];
                    bool ok = kpos >= 0 && qpos[rr] >= 0;
                    if (ok && kind != kSegTail) {
                        if (kind == kSegGeneral) ok = mask_allows(a.mask, mrows[rr], qpos[rr], kpos, ki[col], ks_[col] != 0);
                        else ok = kpos <= qpos[rr];
                    }
                    if (!ok) s[j][e] = -INFINITY;
                }
        }

        // Online softmax in the log2 domain.
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
            float mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < 8; ++j) mx = fmaxf(mx, fmaxf(s[j][2 * rr], s[j][2 * rr + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float mnew = fmaxf(mrow[rr], mx * a.scale_log2);
            const float muse = mnew == -INFINITY ? 0.0f : mnew;
            const float alpha = prefill_exp2(mrow[rr] - muse);  // 2^-inf = 0 on the first tile
            mrow[rr] = mnew;
            lrow[rr] *= alpha;
            p_scale[rr] = alpha;
            float sum = 0.0f;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const float p0 = prefill_exp2(s[j][2 * rr] * a.scale_log2 - muse);
                const float p1 = prefill_exp2(s[j][2 * rr + 1] * a.scale_log2 - muse);
                s[j][2 * rr] = p0;
                s[j][2 * rr + 1] = p1;
                sum += p0 + p1;
            }
            lrow[rr] += sum;
        }
    };
    auto rescale_o = [&](const float (&p_scale)[2]) {
        if (p_scale[0] == 1.0f && p_scale[1] == 1.0f) return;  // neither row's maximum moved (the usual case)
#pragma unroll
        for (int j = 0; j < S::DT; ++j) {
            o[j][0] *= p_scale[0];
            o[j][1] *= p_scale[0];
            o[j][2] *= p_scale[1];
            o[j][3] *= p_scale[1];
        }
    };
    // P (fp32 in the S accumulators) rounded to T as A fragments: k-step kk covers keys 16 kk ...
    auto pack_p = [&](const float (&s)[8][4], unsigned (&pa)[4][4]) {
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
            pa[kk][0] = pack_pair<T>(s[2 * kk][0], s[2 * kk][1]);
            pa[kk][1] = pack_pair<T>(s[2 * kk][2], s[2 * kk][3]);
            pa[kk][2] = pack_pair<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            pa[kk][3] = pack_pair<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
        }
    };

    // O += P V for the tile in `stage`, P as packed A fragments (wgmma: issued as one commit group, the
    // caller waits).
    auto pv = [&](const unsigned (&pa)[4][4], int stage) {
        const T* sv = skv + stage * 2 * S::TILE + S::TILE;
        if constexpr (use_wgmma) {
            // k-step kk: key rows 16 kk .. 16 kk + 15, two 8-row atoms from byte 2048 kk of each plane.
            float(&of)[S::DT * 4] = reinterpret_cast<float(&)[S::DT * 4]>(o);
            const unsigned vaddr = static_cast<unsigned>(__cvta_generic_to_shared(sv));
            wgmma_reg_fence(of);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
                const std::uint64_t desc = wgmma_desc(vaddr + kk * 2048, S::PLANE_BYTES, 1024);
                if constexpr (D == 128) wgmma_rs_n128<T, 1>(of, pa[kk][0], pa[kk][1], pa[kk][2], pa[kk][3], desc, 1);
                else wgmma_rs_n64<T, 1>(of, pa[kk][0], pa[kk][1], pa[kk][2], pa[kk][3], desc, 1);
            }
            wgmma_commit();
        } else {
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
                const int r = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
                for (int jd = 0; jd < S::DT; jd += 2) {
                    unsigned b0, b1, b2, b3;
                    ldsm_x4_t(b0, b1, b2, b3, sv + S::swz_kv(r, jd + (lane >> 4)));
                    mma_m16n8k16<T>(o[jd], pa[kk][0], pa[kk][1], pa[kk][2], pa[kk][3], b0, b1);
                    mma_m16n8k16<T>(o[jd + 1], pa[kk][0], pa[kk][1], pa[kk][2], pa[kk][3], b2, b3);
                }
            }
        }
    };

    float s[8][4];
    unsigned pa[4][4];
    float p_scale[2];
    // The block's diagonal segment, if it has one (the plan makes at most one per query block): read by
    // the wgmma path's walk of the segments before the key loop; the mma.sync path walks them after it.
    PrefillSegment diag{};
    diag.lo = diag.hi = 0;
    if constexpr (use_wgmma) {
        // Warp specialization. The producer warpgroup (warps 8-11) copies tile i into stage i % STAGES
        // once the compute warps have released the tile that was there (empty barrier), waits for its own
        // copies of tile i - 1, fences them for the tensor cores and signals that stage full. Each compute
        // warpgroup then runs on its own (no block barrier in the loop), FlashAttention-3's ordering
        // inside it: issue S_t = Q K_t^T, issue O += P_{t-1} V_{t-1}, wait for S_t, softmax of S_t while
        // P V runs, wait, release tile t - 1 (its V was the last use), rescale O, keep P_t. The two compute
        // warpgroups drift apart, so one's softmax overlaps the other's matrix products.
        if (warp >= kPrefillThreads / 32) {
            set_max_regs_dec<kPrefillProducerRegs>();
            constexpr int PT = kPrefillThreadsWS - kPrefillThreads;  // producer threads
            constexpr int PRPP = PT / S::CPR;                       // rows per copy pass
            constexpr int PKPT = S::BN / PRPP;                      // rows per thread per tile
            const int ptid = tid - kPrefillThreads, c = ptid % S::CPR;
            // Positions as entries (dense, block-sparse): this thread's rows of a tile are r0 + j PRPP, so its
            // sources are one pointer per tile plus a constant stride (64-bit multiplies once per tile, not
            // per row: the producer's address arithmetic was half of its instructions).
            const int r0 = ptid / S::CPR;
            const std::int64_t kstride = static_cast<std::int64_t>(PRPP) * a.k_s0, vstride = static_cast<std::int64_t>(PRPP) * a.v_s0;
            // Gathered rows (token-sparse): this thread's chunk of row 0, and the row pitches in bytes.
            const char* kbytes = reinterpret_cast<const char*>(kbase + c * 8);
            const char* vbytes = reinterpret_cast<const char*>(vbase + c * 8);
            const unsigned kpitch = static_cast<unsigned>(a.k_s0 * static_cast<std::int64_t>(sizeof(T)));
            const unsigned vpitch = static_cast<unsigned>(a.v_s0 * static_cast<std::int64_t>(sizeof(T)));
            // Token-sparse keys: the list entries of the next tile, loaded while this one is copied.
            int ppos[PKPT], plast = 0;
            auto pfetch = [&]() {
                if (!klist || !ld.valid) return;
#pragma unroll
                for (int j = 0; j < PKPT; ++j) {
                    const int e = ld.tile + ptid / S::CPR + j * PRPP;
                    ppos[j] = e < ld.hi ? __ldg(klist + e) : -1;
                }
                plast = __ldg(klist + min(ld.tile + S::BN, ld.hi) - 1);
            };
            pfetch();
            // Up to kDepth + 1 tiles in flight: tile i - kDepth is signalled after tile i is issued.
            // (kDepth <= STAGES - 3: signalling tile i - kDepth must not wait for a stage that the compute
            // warps release only after they have used tile i - kDepth; 3 in flight with 5 stages was 30% slower.)
            constexpr int kDepth = 2;
            if ((a.tma != 0 && !klist) || a.keys_kept) {
                // Whole tiles by the bulk tensor copy (entries are positions: dense, block-sparse). Per tile:
                // the first BN threads write the positions, thread 0 the kind and last position, arms the stage's
                // full barrier with the tile's bytes and issues one box per 64-column plane of K and of V; the
                // other threads arrive at once (the phase then completes when the bytes have landed). Short
                // tiles and tiles with key metadata: cp.async, signalled kDepth tiles later. `bulk`: which of
                // the last tiles went by the copy engine (bit j: tile i - j). Kept keys (rows of a compacted
                // cache) take this loop too, with or without the copy engine: their positions are the list's,
                // fetched one tile ahead by the first BN threads (kent) and thread 0 (klast). (A loop of its own: folded into
                // the cp.async loop below, it made that loop 1-9% slower for the token-sparse and cp.async
                // tiles, H200.)
                unsigned bulk = 0;
                int kent = -1, klast = 0;
                auto kfetch = [&]() {  // kept keys: the list entries of the cursor's tile this thread writes
                    if (!klist || !ld.valid) return;
                    const int e = ld.tile + ptid;
                    if (ptid < S::BN) kent = e < ld.hi ? __ldg(klist + e) : -1;
                    if (ptid == 0) klast = __ldg(klist + min(ld.tile + S::BN, ld.hi) - 1);
                };
                kfetch();
                int i = 0;
                while (ld.valid) {
                    const int st = i % S::STAGES;
                    if (i >= S::STAGES) mbar_wait(empty_bar + st, static_cast<unsigned>((i / S::STAGES - 1) & 1));
                    const bool short_tile = ld.tile + S::BN > ld.hi;
                    T* sk = skv + st * 2 * S::TILE;
                    T* sv = sk + S::TILE;
                    const bool key_meta = masked && ld.kind == kSegGeneral;
                    const bool by_tma = a.tma != 0 && !short_tile && !key_meta;
                    bulk = (bulk << 1) | (by_tma ? 1u : 0u);
                    if (by_tma) {
                        if (ptid < S::BN) skpos[st * S::BN + ptid] = klist ? kent : ld.tile + ptid;
                        if (ptid == 0) {
                            smeta[4 * st] = ld.kind;
                            smeta[4 * st + 1] = klist ? klast : ld.tile + S::BN - 1;
                            smeta[4 * st + 2] = klist ? -1 : ld.tile;
                            smeta[4 * st + 3] = S::BN;
                            mbar_arrive_expect_tx(full_bar + st, static_cast<unsigned>(2 * S::TILE * sizeof(T)));
#pragma unroll
                            for (int pl = 0; pl < D / 64; ++pl) {
                                tma_load_3d(sk + pl * S::BN * 64, &a.tmap_k, pl * 64, ld.tile, g, full_bar + st);
                                tma_load_3d(sv + pl * S::BN * 64, &a.tmap_v, pl * 64, ld.tile, g, full_bar + st);
                            }
                        } else {
                            mbar_arrive(full_bar + st);
                        }
                    } else {
                        const T* kt = kbase + static_cast<std::int64_t>(ld.tile + r0) * a.k_s0 + c * 8;
                        const T* vt = vbase + static_cast<std::int64_t>(ld.tile + r0) * a.v_s0 + c * 8;
#pragma unroll
                        for (int j = 0; j < PKPT; ++j) {
                            const int r = r0 + j * PRPP;
                            const int e = ld.tile + r;
                            const bool ok = e < ld.hi;
                            copy16_async(sk + S::swz_kv(r, c), ok ? kt + j * kstride : kbase, ok);
                            copy16_async(sv + S::swz_kv(r, c), ok ? vt + j * vstride : vbase, ok);
                            if (c == 0 && !klist) {
                                const int pos = ok ? e : -1;
                                skpos[st * S::BN + r] = pos;
                                if (key_meta) {
                                    skimg[st * S::BN + r] = pos < 0 ? -1 : __ldg(a.mask.context.token_image + pos);
                                    sksink[st * S::BN + r] = pos < 0 ? 0 : __ldg(a.mask.context.token_sink + pos);
                                }
                            }
                        }
                        if (klist && ptid < S::BN) skpos[st * S::BN + ptid] = kent;  // (-1 past the list's end)
                        if (ptid == 0) {
                            smeta[4 * st] = short_tile && ld.kind == kSegFull ? kSegTail : ld.kind;
                            smeta[4 * st + 1] = short_tile ? INT_MAX : (klist ? klast : min(ld.tile + S::BN, ld.hi) - 1);
                            smeta[4 * st + 2] = klist ? -1 : ld.tile;
                            smeta[4 * st + 3] = min(S::BN, ld.hi - ld.tile);
                        }
                    }
                    copy_commit();  // (empty for a bulk tile: the group count stays one per tile)
                    ld.next(segs);
                    kfetch();
                    if (i >= kDepth && !((bulk >> kDepth) & 1u)) {
                        copy_wait<kDepth>();
                        fence_proxy_async_shared();
                        mbar_arrive(full_bar + (i - kDepth) % S::STAGES);
                    }
                    ++i;
                }
                copy_wait<0>();
                fence_proxy_async_shared();
                for (int k = max(0, i - kDepth); k < i; ++k)
                    if (!((bulk >> (i - 1 - k)) & 1u)) mbar_arrive(full_bar + k % S::STAGES);
                return;
            }
            if (klist) {
                // Token-sparse: rows gathered through the list (no mask metadata: no items), each row's byte
                // offset as one 32 x 32 -> 64-bit multiply-add (row pitches < 4 GiB, checked on the host).
                // (A loop of its own, as the bulk-copy loop above.)
                int i = 0;
                while (ld.valid) {
                    const int st = i % S::STAGES;
                    if (i >= S::STAGES) mbar_wait(empty_bar + st, static_cast<unsigned>((i / S::STAGES - 1) & 1));
                    T* sk = skv + st * 2 * S::TILE;
                    T* sv = sk + S::TILE;
#pragma unroll
                    for (int j = 0; j < PKPT; ++j) {
                        const int r = r0 + j * PRPP;
                        const bool ok = ld.tile + r < ld.hi;
                        const int pos = ok ? ppos[j] : -1;
                        const std::uint64_t p = pos < 0 ? 0u : static_cast<unsigned>(pos);
                        copy16_async(sk + S::swz_kv(r, c), kbytes + p * kpitch, ok);
                        copy16_async(sv + S::swz_kv(r, c), vbytes + p * vpitch, ok);
                        if (c == 0) skpos[st * S::BN + r] = pos;
                    }
                    if (ptid == 0) {
                        const bool short_tile = ld.tile + S::BN > ld.hi;
                        smeta[4 * st] = short_tile && ld.kind == kSegFull ? kSegTail : ld.kind;
                        smeta[4 * st + 1] = short_tile ? INT_MAX : plast;
                        smeta[4 * st + 2] = -1;  // (entries index the list: positions read per column)
                        smeta[4 * st + 3] = 0;
                    }
                    copy_commit();
                    ld.next(segs);
                    pfetch();
                    if (i >= kDepth) {
                        copy_wait<kDepth>();
                        fence_proxy_async_shared();
                        mbar_arrive(full_bar + (i - kDepth) % S::STAGES);
                    }
                    ++i;
                }
                copy_wait<0>();
                fence_proxy_async_shared();
                for (int k = max(0, i - kDepth); k < i; ++k) mbar_arrive(full_bar + k % S::STAGES);
                return;
            }
            int i = 0;
            while (ld.valid) {
                const int st = i % S::STAGES;
                if (i >= S::STAGES) mbar_wait(empty_bar + st, static_cast<unsigned>((i / S::STAGES - 1) & 1));
                const bool short_tile = ld.tile + S::BN > ld.hi;
                T* sk = skv + st * 2 * S::TILE;
                T* sv = sk + S::TILE;
                // (The copy of issue() above, written out again for this loop: one lambda shared by both
                // made the dense prefill 5% slower on the H100, 4.76 -> 5.02 ms at 16K, in one call. This
                // one also takes full tiles without per-row checks and gathered rows by 32-bit pitches,
                // which the mma.sync loop, not the bottleneck there, does not.)
                const bool key_meta = masked && ld.kind == kSegGeneral;  // what general tiles' masks read of a key
                {
                    const T* kt = kbase + static_cast<std::int64_t>(ld.tile + r0) * a.k_s0 + c * 8;
                    const T* vt = vbase + static_cast<std::int64_t>(ld.tile + r0) * a.v_s0 + c * 8;
                    if (!short_tile && !key_meta) {  // every row present (the usual tile): no per-row checks
#pragma unroll
                        for (int j = 0; j < PKPT; ++j) {
                            const int r = r0 + j * PRPP;
                            copy16_async(sk + S::swz_kv(r, c), kt + j * kstride);
                            copy16_async(sv + S::swz_kv(r, c), vt + j * vstride);
                            if (c == 0) skpos[st * S::BN + r] = ld.tile + r;
                        }
                    } else
#pragma unroll
                    for (int j = 0; j < PKPT; ++j) {
                        const int r = r0 + j * PRPP;
                        const int e = ld.tile + r;
                        const bool ok = e < ld.hi;
                        // (a row past the segment reads nothing: zero-filled, its source kept in bounds)
                        copy16_async(sk + S::swz_kv(r, c), ok ? kt + j * kstride : kbase, ok);
                        copy16_async(sv + S::swz_kv(r, c), ok ? vt + j * vstride : vbase, ok);
                        if (c == 0) {
                            const int pos = ok ? e : -1;
                            skpos[st * S::BN + r] = pos;
                            if (key_meta) {
                                skimg[st * S::BN + r] = pos < 0 ? -1 : __ldg(a.mask.context.token_image + pos);
                                sksink[st * S::BN + r] = pos < 0 ? 0 : __ldg(a.mask.context.token_sink + pos);
                            }
                        }
                    }
                }
                if (ptid == 0) {
                    const int last_e = min(ld.tile + S::BN, ld.hi) - 1;
                    smeta[4 * st] = short_tile && ld.kind == kSegFull ? kSegTail : ld.kind;
                    smeta[4 * st + 1] = short_tile ? INT_MAX : last_e;
                    smeta[4 * st + 2] = ld.tile;
                    smeta[4 * st + 3] = last_e - ld.tile + 1;
                }
                copy_commit();
                ld.next(segs);
                if (i >= kDepth) {  // tile i - kDepth is complete: fence it for wgmma, signal its stage
                    copy_wait<kDepth>();
                    fence_proxy_async_shared();
                    mbar_arrive(full_bar + (i - kDepth) % S::STAGES);
                }
                ++i;
            }
            copy_wait<0>();
            fence_proxy_async_shared();
            for (int k = max(0, i - kDepth); k < i; ++k) mbar_arrive(full_bar + k % S::STAGES);
            return;
        }
        set_max_regs_inc<kPrefillConsumerRegs>();
        load_q_fragments();
        // The number of tiles (the producer's cursor, counted).
        int n_tiles = 0;
        for (int sg = seg_begin; sg < seg_end; ++sg) {
            const PrefillSegment sgm = segs[sg];
            if (sgm.hi > sgm.lo && sgm.kind != kSegDiagonal) n_tiles += (sgm.hi - sgm.lo + S::BN - 1) / S::BN;
            if (sgm.kind == kSegDiagonal) diag = sgm;
        }
        int pstage = -1;
        // Ping-pong: the two warpgroups take turns issuing their matrix products (named barriers 2 and 3),
        // so that one's softmax runs while the other's products occupy the tensor cores. Warpgroup 0 goes
        // first; warpgroup 1 skips its last hand-over so that every barrier sees as many arrivals as waits.
        const int wg = warp >> 2;
        if (wg == 1 && n_tiles > 0) asm volatile("bar.arrive 2, 256;\n" ::: "memory");
        for (int t = 0; t < n_tiles; ++t) {
            const int stage = t % S::STAGES;
            mbar_wait(full_bar + stage, static_cast<unsigned>((t / S::STAGES) & 1));
            if (wg == 0) asm volatile("bar.sync 2, 256;\n" ::: "memory");  // my turn
            else asm volatile("bar.sync 3, 256;\n" ::: "memory");
            qk(s, stage);
            if (pstage >= 0) pv(pa, pstage);
            if (pstage >= 0) {
                wgmma_wait<1>();  // S_t done; P V may still run
            } else {
                wgmma_wait<0>();
            }
            // The other warpgroup's turn, once S_t is done (the hand-over between the issue and the wait
            // made ptxas serialize the wgmma pipeline).
            if (wg == 0 || t + 1 < n_tiles) {
                if (wg == 0) asm volatile("bar.arrive 3, 256;\n");
                else asm volatile("bar.arrive 2, 256;\n");
            }
            wgmma_reg_fence(reinterpret_cast<float(&)[32]>(s));
            softmax(s, stage, smeta[4 * stage], smeta[4 * stage + 1], smeta[4 * stage + 2], smeta[4 * stage + 3], p_scale);
            wgmma_wait<0>();
            wgmma_reg_fence(reinterpret_cast<float(&)[S::DT * 4]>(o));
            wgmma_reg_fence_u(pa);
            // Tile t - 1: K, V and positions all read. Every thread arrives for its own reads (one arrival
            // per warp after __syncwarp is also correct, but compute-sanitizer's racecheck does not see
            // that ordering and reports the producer's next writes into the stage).
            if (pstage >= 0) mbar_arrive(empty_bar + pstage);
            rescale_o(p_scale);
            pack_p(s, pa);
            pstage = stage;
        }
        if (pstage >= 0) {
            pv(pa, pstage);
            wgmma_wait<0>();
            wgmma_reg_fence(reinterpret_cast<float(&)[S::DT * 4]>(o));
            wgmma_reg_fence_u(pa);
        }
    } else {
        // mma.sync: step t waits for tile t (at most one younger copy group pending), and its barrier tells
        // that every warp is done with step t - 1; then tile t + 2 is issued into the stage of tile t - 1,
        // then S_t, softmax, O += P_t V_t.
        for (int t = 0; t < n_issued; ++t) {
            const int stage = t % S::STAGES;
            copy_wait<1>();
            sync_compute();
            if (ld.valid) {
                issue((t + 2) % S::STAGES);
                ++n_issued;
            }
            copy_commit();
            qk(s, stage);
            softmax(s, stage, kind_q[stage], last_q[stage], -1, 0, p_scale);
            rescale_o(p_scale);
            pack_p(s, pa);
            pv(pa, stage);
        }
    }
    copy_wait<0>();

    // ---- diagonal segments (block-sparse items) -------------------------------------------------------
    // Row position p sees the one key p - delta of the segment (PureKV's temporal key: the same slot one
    // frame back; the plan guarantees the pair is allowed and that no other segment holds the key). One
    // score per row on the CUDA cores, folded into the online softmax after the tiles: the four threads of
    // a row each take the columns they hold of O (8 j + 2 (lane % 4) + {0, 1}), P rounded to T as for the
    // tiles, the row sum kept by the row's first thread (the quad's partial sums are added at the end).
    if (w.segs) {
        if constexpr (!use_wgmma) {
            for (int sg = seg_begin; sg < seg_end; ++sg) {
                const PrefillSegment sgm = segs[sg];
                if (sgm.kind == kSegDiagonal) diag = sgm;
            }
        }
        if (diag.hi > diag.lo) {
            // The key and value rows of both of the thread's rows are loaded at once (one round trip), q is
            // read from the block's Q tile in shared memory (chunk jd of row lm holds columns 8 jd ..; this
            // thread's pair sits at (lane % 4) * 2 in it).
            unsigned kraw[2][S::DT], vraw[2][S::DT];
            bool ok[2];
#pragma unroll
            for (int rr = 0; rr < 2; ++rr) {
                const int p = qpos[rr], j = p - diag.delta;
                ok[rr] = p >= 0 && j >= diag.lo && j < diag.hi;
                const unsigned* kr = reinterpret_cast<const unsigned*>(kbase + static_cast<std::int64_t>(ok[rr] ? j : 0) * a.k_s0 +
                                                                       (lane & 3) * 2);
                const unsigned* vr = reinterpret_cast<const unsigned*>(vbase + static_cast<std::int64_t>(ok[rr] ? j : 0) * a.v_s0 +
                                                                       (lane & 3) * 2);
#pragma unroll
                for (int jd = 0; jd < S::DT; ++jd) {
                    kraw[rr][jd] = ok[rr] ? __ldg(kr + jd * 4) : 0u;
                    vraw[rr][jd] = ok[rr] ? __ldg(vr + jd * 4) : 0u;
                }
            }
#pragma unroll
            for (int rr = 0; rr < 2; ++rr) {
                const int lm = warp * 16 + (lane >> 2) + rr * 8;
                float dot = 0.0f;
#pragma unroll
                for (int jd = 0; jd < S::DT; ++jd) {
                    const float2 qf2 = widen_pair(*reinterpret_cast<const unsigned*>(sq + S::swz(lm, jd) + (lane & 3) * 2),
                                                  static_cast<const T*>(nullptr));
                    const float2 kf2 = widen_pair(kraw[rr][jd], static_cast<const T*>(nullptr));
                    dot = fmaf(qf2.x, kf2.x, dot);
                    dot = fmaf(qf2.y, kf2.y, dot);
                }
                dot += __shfl_xor_sync(0xffffffffu, dot, 1);
                dot += __shfl_xor_sync(0xffffffffu, dot, 2);
                if (!ok[rr]) continue;  // uniform over the row's four threads
                const float sc = dot * a.scale_log2;
                const float mnew = fmaxf(mrow[rr], sc);
                const float alpha = prefill_exp2(mrow[rr] - mnew);  // 2^-inf = 0 when no tile was seen
                const float pp = prefill_exp2(sc - mnew);
                mrow[rr] = mnew;
                lrow[rr] = lrow[rr] * alpha + ((lane & 3) == 0 ? pp : 0.0f);
                const float pr = prefill_round<T>(pp);
#pragma unroll
                for (int jd = 0; jd < S::DT; ++jd) {
                    const float2 vf2 = widen_pair(vraw[rr][jd], static_cast<const T*>(nullptr));
                    o[jd][2 * rr] = fmaf(pr, vf2.x, o[jd][2 * rr] * alpha);
                    o[jd][2 * rr + 1] = fmaf(pr, vf2.y, o[jd][2 * rr + 1] * alpha);
                }
            }
        }
    }

    // ---- outputs ----------------------------------------------------------------------------------
    // A thread's two adjacent columns as one 4-byte store where out is 16-bit with unit inner stride and
    // every row starts 4-byte aligned (else two stores).
    constexpr bool out16 = std::is_same_v<TO, bfloat16> || std::is_same_v<TO, half>;
    const bool paired = out16 && a.o_s2 == 1 && a.o_s0 % 2 == 0 && a.o_s1 % 2 == 0 &&
                        reinterpret_cast<std::uintptr_t>(a.out) % 4 == 0;
    // (The non-finite check only where the caller asked for it: a.status; the store form chosen once per
    // row, not per column pair. Both are a block's fixed cost, which short units pay often.)
    const bool check = a.status != nullptr;
    bool bad = false;
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
        float l = lrow[rr];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        if (qpos[rr] < 0) continue;
        if (a.lse && (lane & 3) == 0)
            a.lse[static_cast<std::int64_t>(qpos[rr] - a.q_offset) * a.lse_s0 + static_cast<std::int64_t>(qhead[rr]) * a.lse_s1] =
                l > 0.0f ? (mrow[rr] + log2f(l)) * 0.6931471805599453f : -INFINITY;
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        TO* dst = static_cast<TO*>(a.out) + static_cast<std::int64_t>(qpos[rr] - a.q_offset) * a.o_s0 +
                  static_cast<std::int64_t>(qhead[rr]) * a.o_s1;
        if (check) {
            bool b = l > 0.0f && !isfinite(l);
#pragma unroll
            for (int j = 0; j < S::DT; ++j) b |= !isfinite(o[j][2 * rr] * inv) || !isfinite(o[j][2 * rr + 1] * inv);
            bad |= b;
        }
        bool done = false;
        if constexpr (out16) {
            if (paired) {
#pragma unroll
                for (int j = 0; j < S::DT; ++j) {
                    const int c = j * 8 + (lane & 3) * 2;
                    *reinterpret_cast<unsigned*>(dst + c) = pack_pair<TO>(o[j][2 * rr] * inv, o[j][2 * rr + 1] * inv);
                }
                done = true;
            }
        }
        if (!done) {
#pragma unroll
            for (int j = 0; j < S::DT; ++j) {
                const int c = j * 8 + (lane & 3) * 2;
                store_f(dst + c * a.o_s2, o[j][2 * rr] * inv);
                store_f(dst + (c + 1) * a.o_s2, o[j][2 * rr + 1] * inv);
            }
        }
    }
    if (check && __any_sync(0xffffffffu, bad) && lane == 0) atomicOr(a.status, 1);
}

// Zeroes out[n, H, d] (any strides): the unselected rows of the token-sparse front end.
template <class TO>
__global__ void prefill_zero_kernel(TO* out, std::int64_t n, int H, int d, std::int64_t s0, std::int64_t s1,
                                    std::int64_t s2) {
    const std::int64_t total = n * H * d;
    for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
         i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
        const std::int64_t c = i % d, h = (i / d) % H, r = i / (static_cast<std::int64_t>(d) * H);
        store_f(out + r * s0 + h * s1 + c * s2, 0.0f);
    }
}

}  // namespace vlsparse::cuda::detail
