// vlsparse/cuda/prefill/kernels_mma.cuh -- the tiled prefill attention kernel on tensor cores
// (mma.sync m16n8k16, sm_80+): online softmax, bf16 / fp16 inputs, fp32 accumulation, head dims 64
// and 128. Internal to vlsparse/cuda/prefill.cuh (namespace vlsparse::cuda::detail).
//
// One block computes 128 "m rows" against a sequence of key tiles. An m row is a (query row, query
// head) pair: with heads_packed = hp > 1 the hp query heads of a KV group are packed row-minor
// (m = row * hp + head_in_group), so every K / V tile a block loads serves its whole head group; with
// hp = 1 a block holds one head's rows. Each of the 8 warps owns 16 m rows: their Q fragments stay in
// registers, S = Q K^T and O += P V run on the tensor cores with P rounded to the input type (the
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
//     marked kCausal whose last key lies at or before every row of the block runs unmasked.
// K and V tiles are double-buffered in shared memory (cp.async, XOR-swizzled 16-byte chunks, read by
// ldmatrix); the positions of the next tile's rows are fetched one tile ahead.
//
// Outputs: o = (sum p v) / (sum p), 0 for a row that sees no key; rounded to the output type. With a
// status pointer, a non-finite output (NaN / Inf in what was read, an fp32 overflow of a score) sets
// bit 1 of *status; the host turns it into an error.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <type_traits>

#include "vlsparse/cuda/common.cuh"

namespace vlsparse::cuda::detail {

inline constexpr int kPrefillThreads = 256;  // 8 warps
inline constexpr int kPrefillRows = 128;     // m rows per block (16 per warp)
inline constexpr int kPrefillKeys = 64;      // key entries per tile

enum PrefillSegKind : int { kSegFull = 0, kSegCausal = 1, kSegGeneral = 2, kSegTail = 3 };  // kSegTail: kernel-internal

// A contiguous range of key entries [lo, hi) and its mask kind.
struct PrefillSegment {
    int lo = 0, hi = 0, kind = kSegFull, pad = 0;
};

// A block of the block-sparse front end: one query head, rows [row_lo, row_hi) (positions), its key
// segments segs[seg_begin, seg_end).
struct PrefillItem {
    int head = 0, row_lo = 0, row_hi = 0, seg_begin = 0, seg_end = 0, pad0 = 0, pad1 = 0, pad2 = 0;
};

// The mask of vlsparse/masks/templates.hpp (MaskContext) on the device: what kGeneral tiles evaluate.
struct DeviceMask {
    const std::int32_t* token_image = nullptr;  // [n] image of each token, -1 for text
    const std::uint8_t* token_sink = nullptr;   // [n]
    const std::int32_t* image_start = nullptr;  // [images]
    const std::int32_t* image_end = nullptr;    // [images]
    const std::int32_t* frame_tokens = nullptr; // [images] tokens per frame of a video, 0 for an image
    const std::uint8_t* head_template = nullptr; // [H] MaskTemplate of each query head
    int bidirectional = 0;
    int video = 0;          // VideoMask
    int video_window = 0;   // 0: tokens per frame
    int video_dilation = 1;
};

// What the template mask needs of a query row, read once per block.
struct MaskRow {
    int a = -1;    // the row's image, -1 for text
    int hi = 0;    // keys at or past hi are not allowed (bidirectional: the image's end, else i + 1)
    int vs = 0;    // the image's first position
    int T = 0;     // tokens per frame of a video, 0 otherwise
    int tmpl = 0;  // the head's MaskTemplate
};
__device__ __forceinline__ MaskRow mask_row(const DeviceMask& m, int i, int head) {
    MaskRow r;
    r.tmpl = m.head_template[head];
    if (i < 0) return r;
    r.a = __ldg(m.token_image + i);
    r.hi = i + 1;
    if (r.a >= 0) {
        if (m.bidirectional) r.hi = __ldg(m.image_end + r.a);
        r.vs = __ldg(m.image_start + r.a);
        r.T = m.video ? __ldg(m.frame_tokens + r.a) : 0;
    }
    return r;
}

// MaskContext::template_allows(t, i, j) && video_allows(i, j), line for line (the host header is the
// definition); b = token_image[j], sink = token_sink[j].
__device__ __forceinline__ bool mask_allows(const DeviceMask& m, const MaskRow& r, int i, int j, int b, bool sink) {
    if (j == i) return true;
    if (r.a < 0) return j < i;
    if (j >= r.hi) return false;
    if (b < 0) return true;
    const int t = r.tmpl;
    if (b != r.a) return t == 0 ? true : (t == 2 ? false : sink);  // an earlier image: Dense all, Document none
    if (t == 1 && !sink) return false;                            // Sink: only the image's sinks (and i)
    if (r.T == 0) return true;
    if (j > i) return false;
    const int fi = (i - r.vs) / r.T, si = (i - r.vs) - fi * r.T, fj = (j - r.vs) / r.T, sj = (j - r.vs) - fj * r.T;
    const int W = m.video_window > 0 ? m.video_window : r.T;
    switch (m.video) {
        case 1: return fj == 0 || fj == fi;
        case 2: return fj == 0 || (fj == fi - 1 && sj == si);
        case 3: return fj == 0 || fj == fi || (fj == fi - 1 && sj == si);
        case 4: return i - j < W;
        case 5: return (i - j) % m.video_dilation == 0 && (i - j) / m.video_dilation < W;
        default: return true;
    }
}

struct PrefillArgs {
    const void* q = nullptr;  // [n_q, H, d], unit inner stride
    const void* k = nullptr;  // [n_k, H_kv, d]
    const void* v = nullptr;
    void* out = nullptr;      // [n_q, H, d], any strides
    std::int64_t q_s0 = 0, q_s1 = 0, k_s0 = 0, k_s1 = 0, v_s0 = 0, v_s1 = 0, o_s0 = 0, o_s1 = 0, o_s2 = 0;
    int H = 0, Hkv = 0, G = 1;  // query heads, KV heads, query heads per KV head
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
    // Block-sparse: items (grid.x = n_items, hp = 1) with their segments, and the mask.
    const PrefillItem* items = nullptr;
    const PrefillSegment* segs = nullptr;
    DeviceMask mask;
    int* status = nullptr;      // bit 1: a non-finite output
};

template <int D>
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
    static constexpr int STAGES = 3;             // K / V tiles in flight
    // Element offset of chunk c of row r (chunks XOR-swizzled by row: conflict-free ldmatrix).
    __device__ static constexpr int swz(int r, int c) { return r * D + ((c ^ (r & 7)) << 3); }
    static constexpr std::size_t smem_bytes() {
        return static_cast<std::size_t>(BM * D + 2 * STAGES * TILE) * 2 + 3 * STAGES * BN * sizeof(int);
    }
};

template <class T>
__device__ __forceinline__ void prefill_mma(float (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                            unsigned b0, unsigned b1) {
    if constexpr (std::is_same_v<T, bfloat16>) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
}

template <class T>
__device__ __forceinline__ unsigned prefill_pack(float x0, float x1) {
    unsigned r;
    if constexpr (std::is_same_v<T, bfloat16>) {
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(x1), "f"(x0));
    } else {
        asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(x1), "f"(x0));
    }
    return r;
}

__device__ __forceinline__ void prefill_ldsm(unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3, const void* p) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(s));
}
__device__ __forceinline__ void prefill_ldsm_t(unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3, const void* p) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(s));
}
__device__ __forceinline__ float prefill_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// Walks the key tiles of a block: segment by segment, 64 entries at a time from each segment's start.
struct TileCursor {
    int seg = 0, seg_end = 0, lo = 0, hi = 0, kind = kSegFull;  // current segment
    int tile = 0;                                                // first entry of the current tile
    bool valid = false;
    __device__ void load(const PrefillSegment* segs) {
        while (seg < seg_end) {
            const PrefillSegment s = segs[seg];
            if (s.hi > s.lo) {
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

template <class T, class TO, int D>
__global__ void __launch_bounds__(kPrefillThreads, 1) prefill_mma_kernel(const PrefillArgs a) {
    using S = PrefillShape<D>;
    extern __shared__ __align__(16) unsigned char prefill_smem[];
    T* sq = reinterpret_cast<T*>(prefill_smem);
    T* skv = sq + S::BM * D;  // [stage][K, V][TILE]
    int* skpos = reinterpret_cast<int*>(skv + 2 * S::STAGES * S::TILE);  // [stage][BN] key position, -1: empty
    int* skimg = skpos + S::STAGES * S::BN;   // [stage][BN] the key's image (template masks)
    int* sksink = skimg + S::STAGES * S::BN;  // [stage][BN] the key is a sink

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

    // ---- what this block computes -------------------------------------------------------------------
    // Block-sparse items: mbase = the first row's position; otherwise the first m index of the block
    // (m = row index * hp + head in group; the row index maps to a position through rows_list or q_offset).
    int g, head0, hp = a.hp, m_count, mbase;
    const std::int32_t* rlist = nullptr;
    const std::int32_t* klist = nullptr;
    PrefillSegment one{};
    const PrefillSegment* segs;
    int seg_begin = 0, seg_end = 1;
    if (a.items) {
        const PrefillItem it = a.items[blockIdx.x];
        head0 = it.head;
        g = it.head / a.G;
        hp = 1;
        mbase = it.row_lo;
        m_count = it.row_hi - it.row_lo;
        segs = a.segs;
        seg_begin = it.seg_begin;
        seg_end = it.seg_end;
    } else {
        g = blockIdx.y;
        head0 = g * a.G;
        int rows = a.n_rows, r0 = 0;
        if (a.rows_list) {
            const int l = g * a.rows_per_group;
            r0 = a.rows_indptr[l];
            rows = a.rows_indptr[l + 1] - r0;
            rlist = a.rows_list + r0;
        }
        const int tiles = (rows * hp + S::BM - 1) / S::BM;
        if (static_cast<int>(blockIdx.x) >= tiles) return;
        const int mt = tiles - 1 - static_cast<int>(blockIdx.x);  // the longest rows first
        const int m0 = mt * S::BM;
        // m rows of this block: [m0, min(m0 + BM, rows * hp)); m - m0 indexes them, row = m / hp.
        m_count = min(S::BM, rows * hp - m0);
        // Keys: entries [0, upper) where upper counts the entries at or before the last row's position.
        const int last_row = (m0 + m_count - 1) / hp;
        const int last_pos = rlist ? rlist[last_row] : last_row + a.q_offset;
        int upper = last_pos + 1;
        if (a.keys_list) {
            const int l = g * a.keys_per_group;
            const int k0 = a.keys_indptr[l], k1 = a.keys_indptr[l + 1];
            klist = a.keys_list + k0;
            int lo = 0, hi = k1 - k0;  // first entry with position > last_pos
            while (lo < hi) {
                const int mid = (lo + hi) >> 1;
                if (klist[mid] <= last_pos) lo = mid + 1;
                else hi = mid;
            }
            upper = lo;
        }
        one.lo = 0;
        one.hi = upper;
        one.kind = kSegCausal;
        segs = &one;
        mbase = m0;
    }

    // Row (position, head) of local m row lm; position -1 for rows past the end.
    auto row_of = [&](int lm, int& pos, int& head) {
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
    };

    // ---- Q tile into shared memory ------------------------------------------------------------------
    {
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
    const bool masked = a.mask.token_image != nullptr;
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
            const std::int64_t p = pos < 0 ? 0 : pos;
            copy16_async(sk + S::swz(r, c), kbase + p * a.k_s0 + c * 8, ok);
            copy16_async(sv + S::swz(r, c), vbase + p * a.v_s0 + c * 8, ok);
            if (c == 0) {
                skpos[st * S::BN + r] = pos;
                if (masked && ld.kind == kSegGeneral) {  // what the template mask needs of the key (general tiles only)
                    skimg[st * S::BN + r] = pos < 0 ? -1 : __ldg(a.mask.token_image + pos);
                    sksink[st * S::BN + r] = pos < 0 ? 0 : __ldg(a.mask.token_sink + pos);
                }
            }
        }
        ld.next(segs);
        fetch();
    };
    // Prologue: the first STAGES - 1 tiles in flight (one commit group each, empty when there is none).
    int n_issued = 0;
#pragma unroll
    for (int st = 0; st < S::STAGES - 1; ++st) {
        if (ld.valid) {
            issue(st);
            ++n_issued;
        }
        copy_commit();
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

    copy_wait<S::STAGES - 1>();  // Q (the oldest group)
    __syncthreads();
    unsigned qf[S::KS][4];
    {
        const int r = warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
        for (int ks = 0; ks < S::KS; ++ks)
            prefill_ldsm(qf[ks][0], qf[ks][1], qf[ks][2], qf[ks][3], sq + S::swz(r, 2 * ks + (lane >> 4)));
    }

    float o[S::DT][4];
#pragma unroll
    for (int j = 0; j < S::DT; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.0f, 0.0f};

    for (int t = 0; t < n_issued; ++t) {
        const int stage = t % S::STAGES;
        // Tile t has landed once at most STAGES - 2 younger groups are pending; the barrier also frees
        // the stage tile t - 1 used, which the load below reuses.
        copy_wait<S::STAGES - 2>();
        __syncthreads();
        if (ld.valid) {
            issue((t + S::STAGES - 1) % S::STAGES);
            ++n_issued;
        }
        copy_commit();

        const T* sk = skv + stage * 2 * S::TILE;
        const T* sv = sk + S::TILE;
        const int* kp = skpos + stage * S::BN;

        // S = Q K^T for the warp's 16 rows x 64 keys.
        float s[8][4];
#pragma unroll
        for (int j = 0; j < 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < S::KS; ++ks) {
#pragma unroll
            for (int j = 0; j < 8; j += 2) {
                unsigned b0, b1, b2, b3;
                const int r = j * 8 + (lane & 7) + (lane >> 4) * 8;
                prefill_ldsm(b0, b1, b2, b3, sk + S::swz(r, 2 * ks + ((lane >> 3) & 1)));
                prefill_mma<T>(s[j], qf[ks][0], qf[ks][1], qf[ks][2], qf[ks][3], b0, b1);
                prefill_mma<T>(s[j + 1], qf[ks][0], qf[ks][1], qf[ks][2], qf[ks][3], b2, b3);
            }
        }

        // Mask: kFull tiles none; kCausal tiles only when their last key lies after the block's first row.
        const int kind = kind_q[stage];
        const bool need_mask = kind == kSegGeneral || kind == kSegTail || (kind == kSegCausal && last_q[stage] > min_pos);
        if (need_mask) {
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
        float p_scale[2];
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
#pragma unroll
        for (int j = 0; j < S::DT; ++j) {
            o[j][0] *= p_scale[0];
            o[j][1] *= p_scale[0];
            o[j][2] *= p_scale[1];
            o[j][3] *= p_scale[1];
        }

        // O += P V: P's A fragments straight from the S accumulators.
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
            const unsigned a0 = prefill_pack<T>(s[2 * kk][0], s[2 * kk][1]);
            const unsigned a1 = prefill_pack<T>(s[2 * kk][2], s[2 * kk][3]);
            const unsigned a2 = prefill_pack<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            const unsigned a3 = prefill_pack<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
            const int r = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
            for (int jd = 0; jd < S::DT; jd += 2) {
                unsigned b0, b1, b2, b3;
                prefill_ldsm_t(b0, b1, b2, b3, sv + S::swz(r, jd + (lane >> 4)));
                prefill_mma<T>(o[jd], a0, a1, a2, a3, b0, b1);
                prefill_mma<T>(o[jd + 1], a0, a1, a2, a3, b2, b3);
            }
        }
    }
    copy_wait<0>();

    // ---- outputs ----------------------------------------------------------------------------------
    bool bad = false;
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
        float l = lrow[rr];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        if (qpos[rr] < 0) continue;
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        TO* dst = static_cast<TO*>(a.out) + static_cast<std::int64_t>(qpos[rr] - a.q_offset) * a.o_s0 +
                  static_cast<std::int64_t>(qhead[rr]) * a.o_s1;
#pragma unroll
        for (int j = 0; j < S::DT; ++j) {
            const int c = j * 8 + (lane & 3) * 2;
            const float x0 = o[j][2 * rr] * inv, x1 = o[j][2 * rr + 1] * inv;
            bad |= !isfinite(x0) || !isfinite(x1) || (l > 0.0f && !isfinite(l));
            store_f(dst + c * a.o_s2, x0);
            store_f(dst + (c + 1) * a.o_s2, x1);
        }
    }
    if (a.status && __any_sync(0xffffffffu, bad) && lane == 0) atomicOr(a.status, 1);
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
