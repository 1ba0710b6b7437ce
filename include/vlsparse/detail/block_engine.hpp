// vlsparse/detail/block_engine.hpp -- the CPU block attention engine shared by dense, token-sparse,
// probe and masked attention (namespace vlsparse::simd::detail; internal, not for users).
//
// Query rows are blocked (VLSPARSE_SIMD_Q_BLOCK rows per GEMM) and keys chunked (VLSPARSE_SIMD_K_CHUNK
// keys per chunk of an online, running-max softmax), so the scratch stays in cache for any sequence
// length. The GEMM-shaped products run on Eigen (maps over packed fp32 rows), the row softmax on the
// xsimd kernels of detail/simd_kernels.hpp. Keys and values of a KV head are read in place when they
// are packed fp32 rows already, else widened into packed fp32 rows (KeySet). run_attention drives the
// engine for dense and token-sparse attention over all heads (OpenMP over (query head, query block)
// pairs when the consumer compiles with it). A row whose fp32 scores or output overflow is flagged and
// recomputed in double by the caller. The helpers the decode engines share with it (threads, errors,
// double fallback, finite checks) are in detail/simd_common.hpp, which needs no Eigen.
// Users include <vlsparse/attention/dense.hpp>, sparse.hpp, probe.hpp or masked.hpp, which use it.
#pragma once

#include "vlsparse/core/config.hpp"
VLSPARSE_GCC12_AVX512_DIAGNOSTICS_BEGIN

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <span>
#include <type_traits>
#include <vector>

#include <Eigen/Core>

#include "vlsparse/attention/common.hpp"
#include "vlsparse/core/selection.hpp"
#include "vlsparse/detail/check.hpp"
#include "vlsparse/detail/simd_common.hpp"
#include "vlsparse/detail/simd_kernels.hpp"

// Query rows per block (rows of one GEMM) and keys per chunk of the online softmax; consumers may
// override them. Tuned with bench/attention_bench.cpp on an Ice Lake Xeon core (AVX-512, 1.25 MiB
// L2), fp32, n = 4096, H = 8, d = 128, best of 4 rounds, GFLOP/s: q_block 128 with k_chunk 256: 72,
// 512: 70, 128: 65, 1024: 64; q_block 64: 58-70; q_block 256: 67; q_block 32: 57; unchunked
// (k_chunk >= n) with q_block 64: 54. At 128 x 256 the scores (128 KiB) and one chunk of K and V
// (128 KiB each at d = 128) stay in L2. Define them identically in every translation unit of a
// program (they become inline variables).
#ifndef VLSPARSE_SIMD_Q_BLOCK
#define VLSPARSE_SIMD_Q_BLOCK 128
#endif
#ifndef VLSPARSE_SIMD_K_CHUNK
#define VLSPARSE_SIMD_K_CHUNK 256
#endif

namespace vlsparse::simd {

namespace detail {

using namespace ::vlsparse::detail;

using MatR = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MapR = Eigen::Map<MatR, Eigen::Unaligned, Eigen::OuterStride<>>;
using CMapR = Eigen::Map<const MatR, Eigen::Unaligned, Eigen::OuterStride<>>;

inline constexpr std::int64_t kQBlock = VLSPARSE_SIMD_Q_BLOCK;
inline constexpr std::int64_t kKChunk = VLSPARSE_SIMD_K_CHUNK;
static_assert(kQBlock >= 1 && kKChunk >= 1, "VLSPARSE_SIMD_Q_BLOCK and VLSPARSE_SIMD_K_CHUNK must be >= 1");

// Block sizes of one call. The public functions use the defaults; tests run the engine with tiny
// blocks (so short inputs cross block and chunk boundaries) and the benchmark sweeps them.
struct Blocking {
    std::int64_t q_block = kQBlock;  // query rows per block
    std::int64_t k_chunk = kKChunk;  // keys per chunk of the online softmax
};

// Rows per block for n_rows rows of `group` query heads on `threads` threads: q_block, or fewer (not
// below 16) when there would be fewer blocks than threads (short inputs, few kept tokens, few heads).
inline std::int64_t rows_per_block(std::int64_t q_block, std::int64_t n_rows, std::int64_t group, int threads) {
    std::int64_t b = std::max<std::int64_t>(q_block, 1);
    const std::int64_t blocks_wanted = (threads + group - 1) / group;
    if (blocks_wanted > 1 && n_rows > 0) b = std::min(b, std::max<std::int64_t>(16, (n_rows + blocks_wanted - 1) / blocks_wanted));
    return b;
}
// Packed fp32 keys and values of one KV head: row t at k + t * ldk (unit inner stride).
struct KeySet {
    const float* k = nullptr;
    std::int64_t ldk = 0;
    const float* v = nullptr;
    std::int64_t ldv = 0;
    std::int64_t n = 0;
};

// Per-thread scratch, sized once per call and reused for every block.
struct Scratch {
    std::vector<float> q, s, o, m, l;
    std::vector<std::int64_t> vis, rows;
    std::vector<std::uint8_t> bad;
    std::vector<double> dp, dout;  // double fallback

    void reserve(std::int64_t block, std::int64_t d, std::int64_t s_cols) {
        const auto B = static_cast<std::size_t>(block), D = static_cast<std::size_t>(d);
        q.resize(B * D);
        o.resize(B * D);
        s.resize(B * static_cast<std::size_t>(std::max<std::int64_t>(s_cols, 1)));
        m.resize(B);
        l.resize(B);
        vis.resize(B);
        rows.resize(B);
        bad.resize(B);
        dout.resize(D);
    }
};

// True when the rows of each head of a [n, H, d] view are already packed fp32 (head-major buffers):
// unit inner stride and token stride d. Token-major rows (stride H * d, often a multiple of 4 KiB) are
// packed anyway: read in place they alias in the caches, which cost a third of the speed at n = 4096.
template <class T>
bool usable_in_place(const View3<const T>& x) {
    if constexpr (!std::is_same_v<std::remove_const_t<T>, float>) {
        return false;
    } else {
        return x.stride[2] == 1 && (x.shape[0] == 1 || x.stride[0] == x.shape[2]);
    }
}

// Rows of KV head g of an fp32 view used in place (null for other element types, which are packed).
template <class T>
const float* in_place_rows(const View3<const T>& x, std::int64_t g) {
    if constexpr (std::is_same_v<std::remove_const_t<T>, float>) return x.row(0, g);
    else return nullptr;
}

// Widen rows keys[t0:t1) (identity when keys is null) of KV head g of x into dst (row t at dst + t*d).
template <class T>
void pack_rows(const View3<const T>& x, std::int64_t g, const std::int64_t* keys, std::int64_t t0, std::int64_t t1,
               float* dst) {
    const std::int64_t d = x.shape[2];
    for (std::int64_t t = t0; t < t1; ++t) widen_row(x.row(keys ? keys[t] : t, g), x.stride[2], dst + t * d, d);
}

// The keys and values of KV heads [g0, g1) as KeySets, ks[g - g0], of rows keys[0:n_keys) (every row
// when keys is null): read in place when `in_place` (fp32 rows, see usable_in_place), else packed at
// kp / vp (head g at offset (g - g0) * n_keys * d) by pack_kv_rows.
template <class TK>
void kv_key_sets(const View3<const TK>& k, const View3<const TK>& v, std::int64_t g0, std::int64_t g1,
                 std::int64_t n_keys, bool in_place, float* kp, float* vp, KeySet* ks) {
    const std::int64_t d = k.shape[2];
    for (std::int64_t g = g0; g < g1; ++g) {
        KeySet& s = ks[g - g0];
        s.n = n_keys;
        if (in_place) {
            s.k = in_place_rows(k, g);
            s.ldk = k.shape[0] == 1 ? d : k.stride[0];  // a single row: its token stride is meaningless
            s.v = in_place_rows(v, g);
            s.ldv = v.shape[0] == 1 ? d : v.stride[0];
        } else {
            s.k = kp + (g - g0) * n_keys * d;
            s.v = vp + (g - g0) * n_keys * d;
            s.ldk = s.ldv = d;
        }
    }
}

// Widens rows [t0, t1) of the packed key set of KV heads [g0, g1) (see kv_key_sets), token by token
// for all the heads: their rows of one token lie together in a token-major view.
template <class TK>
void pack_kv_rows(const View3<const TK>& k, const View3<const TK>& v, std::int64_t g0, std::int64_t g1,
                  const std::int64_t* keys, std::int64_t n_keys, std::int64_t t0, std::int64_t t1, float* kp, float* vp) {
    const std::int64_t d = k.shape[2];
    for (std::int64_t t = t0; t < t1; ++t) {
        const std::int64_t j = keys ? keys[t] : t;
        for (std::int64_t g = g0; g < g1; ++g) {
            const std::int64_t off = ((g - g0) * n_keys + t) * d;
            widen_row(k.row(j, g), k.stride[2], kp + off, d);
            widen_row(v.row(j, g), v.stride[2], vp + off, d);
        }
    }
}

// kv_key_sets, and the packing by all threads of the enclosing parallel region: an orphaned
// work-sharing loop, so every thread of the region must call this, and its closing barrier makes the
// rows visible.
template <class TK>
void kv_head_keys(const View3<const TK>& k, const View3<const TK>& v, std::int64_t g0, std::int64_t g1,
                  const std::int64_t* keys, std::int64_t n_keys, bool in_place, float* kp, float* vp, ErrorSlot& err,
                  KeySet* ks) {
    constexpr std::int64_t kPackRows = 256;
    kv_key_sets(k, v, g0, g1, n_keys, in_place, kp, vp, ks);
    if (in_place) return;
    const std::int64_t nchunks = (n_keys + kPackRows - 1) / kPackRows;
    VLSPARSE_OMP(omp for schedule(static))
    for (std::int64_t c = 0; c < nchunks; ++c)
        err.run([&] { pack_kv_rows(k, v, g0, g1, keys, n_keys, c * kPackRows, std::min(n_keys, (c + 1) * kPackRows), kp, vp); });
}

// The block engine. Attends nr packed query rows Q [nr, d] (row-major, ld d) to the key set ks; row r
// sees keys [0, vis[r]) (keys sorted by position, so causal visibility is a prefix). On return
// sc.o [nr, d] holds the normalized outputs (zero rows where vis[r] == 0) and sc.bad[r] != 0 marks
// rows whose fp32 scores or outputs are not finite (the caller recomputes them in double).
// Keys are processed in chunks of kc_max with a running max per row (online softmax).
template <class Arch>
void attend_block(const float* Q, std::int64_t nr, std::int64_t d, const KeySet& ks, const std::int64_t* vis,
                  float scale, std::int64_t kc_max, Scratch& sc) {
    using K = Kernels<Arch>;
    constexpr float ninf = -std::numeric_limits<float>::infinity();
    float* O = sc.o.data();
    float* S = sc.s.data();
    float* m = sc.m.data();
    float* l = sc.l.data();
    std::int64_t kmax = 0;
    for (std::int64_t r = 0; r < nr; ++r) {
        kmax = std::max(kmax, vis[r]);
        m[r] = ninf;
        l[r] = 0.0f;
        sc.bad[static_cast<std::size_t>(r)] = 0;
    }
    if (kmax == 0) {
        std::fill(O, O + nr * d, 0.0f);
        return;
    }
    const CMapR Qm(Q, nr, d, Eigen::OuterStride<>(d));
    MapR Om(O, nr, d, Eigen::OuterStride<>(d));
    for (std::int64_t c0 = 0; c0 < kmax; c0 += kc_max) {
        const std::int64_t kc = std::min(kc_max, kmax - c0);
        MapR Sm(S, nr, kc, Eigen::OuterStride<>(kc));
        const CMapR Km(ks.k + c0 * ks.ldk, kc, d, Eigen::OuterStride<>(ks.ldk));
        const CMapR Vm(ks.v + c0 * ks.ldv, kc, d, Eigen::OuterStride<>(ks.ldv));
        Sm.noalias() = scale * (Qm * Km.transpose());
        for (std::int64_t r = 0; r < nr; ++r) {
            float* srow = S + r * kc;
            const std::int64_t cnt = std::clamp<std::int64_t>(vis[r] - c0, 0, kc);
            if (cnt == 0) {
                std::fill(srow, srow + kc, 0.0f);
                continue;
            }
            const float mx = K::max(srow, cnt);
            const float mnew = std::max(m[r], mx);
            const float alpha = m[r] == ninf ? 0.0f : std::exp(m[r] - mnew);
            const float sum = K::exp_sub_sum(srow, cnt, mnew);
            std::fill(srow + cnt, srow + kc, 0.0f);
            if (c0 > 0 && alpha != 1.0f) K::scale(O + r * d, d, alpha);
            l[r] = l[r] * alpha + sum;  // a non-finite score makes l (or the output row) non-finite
            m[r] = mnew;
        }
        if (c0 == 0) Om.noalias() = Sm * Vm;
        else Om.noalias() += Sm * Vm;
    }
    for (std::int64_t r = 0; r < nr; ++r) {
        float* orow = O + r * d;
        if (vis[r] == 0) {
            std::fill(orow, orow + d, 0.0f);
            continue;
        }
        if (!(l[r] > 0.0f) || !std::isfinite(l[r])) {
            sc.bad[static_cast<std::size_t>(r)] = 1;
            continue;
        }
        K::scale(orow, d, 1.0f / l[r]);
        bool finite = true;
        for (std::int64_t c = 0; c < d; ++c) finite &= std::isfinite(orow[c]);
        if (!finite) sc.bad[static_cast<std::size_t>(r)] = 1;
    }
}

// Dense (sel == nullptr) and token-sparse attention over all heads. For KV head g the key set is
// every key (dense) or the kept list T_g (sparse); query rows are every row (dense, and sparse with
// attend_selected) or T_g (sparse, zero mode; the other rows are written as zero). Row i sees the keys
// with position <= n_k - n_q + i.
template <class Arch, class TQ, class TK, class TO>
void run_attention(const View3<const TQ>& q, const View3<const TK>& k, const View3<const TK>& v, const View3<TO>& out,
                   float scale, const TokenSelection* sel, UnselectedRows unselected, Blocking blocking = {}) {
    const std::int64_t QB = std::max<std::int64_t>(blocking.q_block, 1);
    const std::int64_t nq = q.shape[0], H = q.shape[1], d = q.shape[2], nk = k.shape[0], Hkv = k.shape[1];
    const std::int64_t group = H / Hkv, offset = nk - nq;
    const bool in_place = sel == nullptr && usable_in_place(k) && usable_in_place(v);

    // Largest key set over the KV heads, for the shared packed buffer.
    std::int64_t max_keys = nk;
    if (sel) {
        max_keys = 0;
        for (std::int64_t g = 0; g < Hkv; ++g) max_keys = std::max<std::int64_t>(max_keys, sel->for_kv_head(g).size());
    }
    std::vector<float> kp, vp;
    if (!in_place) {
        kp.resize(static_cast<std::size_t>(max_keys * d));
        vp.resize(static_cast<std::size_t>(max_keys * d));
    }
    const int nthreads = max_threads();
    std::vector<Scratch> scratch(static_cast<std::size_t>(nthreads));
    const std::int64_t kc = std::min<std::int64_t>(std::max<std::int64_t>(blocking.k_chunk, 1),
                                                   std::max<std::int64_t>(max_keys, 1));
    for (auto& s : scratch) s.reserve(QB, d, kc);
    ErrorSlot err;

    VLSPARSE_OMP(omp parallel num_threads(nthreads))
    {
        Scratch& sc = scratch[static_cast<std::size_t>(thread_id())];
        for (std::int64_t g = 0; g < Hkv; ++g) {
            const std::int64_t* keys = nullptr;  // dense: identity (null); sparse: T_g (null when empty)
            std::int64_t n_keys = nk;
            if (sel) {
                const auto T = sel->for_kv_head(g);
                keys = T.data();
                n_keys = static_cast<std::int64_t>(T.size());
            }
            const bool rows_are_keys = sel && unselected == UnselectedRows::zero;
            const std::int64_t n_rows = rows_are_keys ? n_keys : nq;

            KeySet ks;
            kv_head_keys(k, v, g, g + 1, keys, n_keys, in_place, kp.data(), vp.data(), err, &ks);
            // Zero mode: rows not in T_g are zero for every query head of the group.
            if (rows_are_keys) {
                VLSPARSE_OMP(omp for schedule(static))
                for (std::int64_t i = 0; i < nq; ++i) {
                    if (std::binary_search(keys, keys + n_keys, i)) continue;
                    for (std::int64_t h = g * group; h < (g + 1) * group; ++h)
                        zero_row(out.row(i, h), out.stride[2], d);
                }
            }
            // (query head of the group, query block) pairs, most expensive blocks first.
            const std::int64_t B = rows_per_block(QB, n_rows, group, nthreads);
            const std::int64_t nblocks = (n_rows + B - 1) / B;
            const std::int64_t items = nblocks * group;
            VLSPARSE_OMP(omp for schedule(dynamic, 1))
            for (std::int64_t w = 0; w < items; ++w) {
                err.run([&] {
                    const std::int64_t h = g * group + w % group;
                    const std::int64_t r0 = (nblocks - 1 - w / group) * B;
                    const std::int64_t nr = std::min(B, n_rows - r0);
                    for (std::int64_t r = 0; r < nr; ++r) {
                        const std::int64_t i = rows_are_keys ? keys[r0 + r] : r0 + r;
                        sc.rows[static_cast<std::size_t>(r)] = i;
                        const std::int64_t pos = offset + i;
                        sc.vis[static_cast<std::size_t>(r)] =
                            rows_are_keys ? r0 + r + 1
                            : sel         ? std::upper_bound(keys, keys + n_keys, pos) - keys
                                          : pos + 1;
                        widen_row(q.row(i, h), q.stride[2], sc.q.data() + r * d, d);
                    }
                    attend_block<Arch>(sc.q.data(), nr, d, ks, sc.vis.data(), scale, kc, sc);
                    for (std::int64_t r = 0; r < nr; ++r) {
                        const std::int64_t i = sc.rows[static_cast<std::size_t>(r)];
                        TO* dst = out.row(i, h);
                        if (sc.bad[static_cast<std::size_t>(r)]) {
                            attend_row_double(q.row(i, h), q.stride[2], k, v, g, keys,
                                              sc.vis[static_cast<std::size_t>(r)], static_cast<double>(scale), sc.dp,
                                              sc.dout.data());
                            for (std::int64_t c = 0; c < d; ++c)
                                store(dst[c * out.stride[2]], sc.dout[static_cast<std::size_t>(c)]);
                        } else {
                            store_row(dst, out.stride[2], sc.o.data() + r * d, d);
                        }
                    }
                });
            }
        }
    }
    err.rethrow();
}

}  // namespace detail

}  // namespace vlsparse::simd

VLSPARSE_GCC12_AVX512_DIAGNOSTICS_END
