// vlsparse/detail/group_kernels.hpp -- decode kernels: the G query heads of one KV group against
// listed rows of a K/V cache, read in the cache's own element type (not for users).
//
//   group_dots(q, G, base, idx, m, d, s, ss)         s[a * ss + t] = q_a . row(t)         a < G, t < m
//   group_weighted_sum(o, os, p, ps, G, base, idx, m, d)
//                                                    o[a * os + c] += sum_{t < m} p[a * ps + t] * row(t)[c]
//
// with q_a = q + a * d (fp32, contiguous) and row(t) = base + idx[t] * d (float, half or bfloat16).
// Each cache row is loaded once per block of query heads and widened in registers (bf16: a zero
// extension and a shift; fp16: vcvtph2ps), so no widened copy of the rows is ever written: decode is
// bound by reading the cache, and this reads each listed byte once. Heads are taken in blocks of a
// power of two (G = 6 runs as 4 + 2); a dots tile is W (head, row) pairs reduced together by one
// transpose-and-add. Every result is exact fp32 arithmetic on exactly widened inputs; only the order
// of the additions differs from a plain loop. Include: internal (attention/indexed_decode.hpp).
#pragma once

#include "vlsparse/core/config.hpp"
VLSPARSE_GCC12_AVX512_DIAGNOSTICS_BEGIN

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "vlsparse/detail/simd_kernels.hpp"

#ifndef VLSPARSE_SIMD_GROUP_PREFETCH_ROWS
#define VLSPARSE_SIMD_GROUP_PREFETCH_ROWS 8  // group_dots prefetches the listed rows this many entries ahead
#endif
#ifndef VLSPARSE_SIMD_GROUP_PREFETCH_K_LOCALITY
#define VLSPARSE_SIMD_GROUP_PREFETCH_K_LOCALITY 3  // __builtin_prefetch locality of K rows (3: L1, 2: L2)
#endif

namespace vlsparse::detail {

inline constexpr std::int64_t kGroupPrefetchRows = VLSPARSE_SIMD_GROUP_PREFETCH_ROWS;
static_assert(kGroupPrefetchRows >= 1, "VLSPARSE_SIMD_GROUP_PREFETCH_ROWS must be >= 1");

template <class Arch>
struct GroupKernels {
    using K = Kernels<Arch>;
    using batch = typename K::batch;
    static constexpr std::int64_t W = K::W;
    // Accumulator registers a kernel may hold: 16 of the 32 AVX-512 registers, 8 of the 16 AVX ones.
    static constexpr std::int64_t kAcc = W >= 16 ? 16 : 8;

    // W consecutive elements of a row, widened to fp32 in registers.
    static batch load(const float* p) { return batch::load_unaligned(p); }
    static batch load(const bfloat16* p) {
#if defined(__AVX512F__)
        if constexpr (W == 16 && std::is_base_of_v<xsimd::avx512f, Arch>) {
            const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
            return batch(_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
        } else
#endif
#if defined(__AVX2__)
            if constexpr (W == 8 && std::is_base_of_v<xsimd::avx2, Arch>) {
            const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
            return batch(_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
        } else
#endif
        {
            return widened(p);
        }
    }
    static batch load(const half* p) {
#if defined(__AVX512F__)
        if constexpr (W == 16 && std::is_base_of_v<xsimd::avx512f, Arch>) {
            return batch(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
        } else
#endif
#if defined(VLSPARSE_HAS_F16C)
            if constexpr (W == 8 && std::is_base_of_v<xsimd::avx, Arch>) {
            return batch(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
        } else
#endif
        {
            return widened(p);
        }
    }

    // also: null, or a second base (V) whose rows are prefetched with the first pass (into L2).
    template <class TC>
    static void dots(const float* q, std::int64_t G, const TC* base, const std::int64_t* idx, std::int64_t m,
                     std::int64_t d, float* s, std::int64_t ss, const TC* also = nullptr) {
        for (std::int64_t a0 = 0; a0 < G;) {
            const std::int64_t gb = block_of(G - a0, W);
            const bool pf = a0 == 0;  // the first pass over the rows prefetches them
            const TC* pf2 = pf ? also : nullptr;
            const float* qa = q + a0 * d;
            float* sa = s + a0 * ss;
            switch (gb) {
                case 1: dots_if<1>(qa, base, idx, m, d, sa, ss, pf, pf2); break;
                case 2: dots_if<2>(qa, base, idx, m, d, sa, ss, pf, pf2); break;
                case 4: dots_if<4>(qa, base, idx, m, d, sa, ss, pf, pf2); break;
                case 8: dots_if<8>(qa, base, idx, m, d, sa, ss, pf, pf2); break;
                default: dots_if<16>(qa, base, idx, m, d, sa, ss, pf, pf2); break;
            }
            a0 += gb;
        }
    }

    template <class TC>
    static void weighted_sum(float* o, std::int64_t os, const float* p, std::int64_t ps, std::int64_t G,
                             const TC* base, const std::int64_t* idx, std::int64_t m, std::int64_t d) {
        for (std::int64_t a0 = 0; a0 < G;) {
            const std::int64_t gb = block_of(G - a0, kAcc);
            float* oa = o + a0 * os;
            const float* pa = p + a0 * ps;
            switch (gb) {
                case 1: wsum_block<1>(oa, os, pa, ps, base, idx, m, d); break;
                case 2: wsum_block<2>(oa, os, pa, ps, base, idx, m, d); break;
                case 4: wsum_block<4>(oa, os, pa, ps, base, idx, m, d); break;
                case 8: wsum_block<8>(oa, os, pa, ps, base, idx, m, d); break;
                default: wsum_block<16>(oa, os, pa, ps, base, idx, m, d); break;
            }
            a0 += gb;
        }
    }

private:
    template <class TC>
    static batch widened(const TC* p) {
        alignas(64) float buf[W];
        for (std::int64_t l = 0; l < W; ++l) buf[l] = to_float(p[l]);
        return batch::load_aligned(buf);
    }

    // The largest power of two <= min(n, cap) (cap a power of two <= 16).
    static std::int64_t block_of(std::int64_t n, std::int64_t cap) {
        std::int64_t b = 1;
        while (b * 2 <= std::min(n, cap)) b *= 2;
        return b;
    }

    template <int Locality, class TC>
    static void prefetch_row(const TC* r, std::int64_t d) {
        constexpr std::int64_t line = 64 / static_cast<std::int64_t>(sizeof(TC));
        for (std::int64_t c = 0; c < d; c += line) __builtin_prefetch(r + c, 0, Locality);
    }

    template <int GB, class TC>
    static void dots_if(const float* q, const TC* base, const std::int64_t* idx, std::int64_t m, std::int64_t d,
                        float* s, std::int64_t ss, bool prefetch, const TC* also) {
        if constexpr (GB <= W) dots_block<GB>(q, base, idx, m, d, s, ss, prefetch, also);
    }

    // GB heads x R = W / GB rows per tile: accumulator j = r * GB + a, reduced together.
    template <int GB, class TC>
    static void dots_block(const float* q, const TC* base, const std::int64_t* idx, std::int64_t m,
                           std::int64_t d, float* s, std::int64_t ss, bool prefetch, const TC* also) {
        constexpr std::int64_t R = W / GB;
        const std::int64_t db = d - d % W;
        for (std::int64_t t = 0; t < m; t += R) {
            if (prefetch)
                for (std::int64_t r = t + kGroupPrefetchRows; r < std::min(m, t + kGroupPrefetchRows + R); ++r) {
                    prefetch_row<VLSPARSE_SIMD_GROUP_PREFETCH_K_LOCALITY>(base + idx[r] * d, d);
                    if (also) prefetch_row<2>(also + idx[r] * d, d);
                }
            const TC* rp[R];
            for (std::int64_t r = 0; r < R; ++r) rp[r] = base + idx[std::min(t + r, m - 1)] * d;
            batch acc[W];
            for (auto& x : acc) x = batch(0.0f);
            for (std::int64_t c = 0; c < db; c += W) {
                batch qb[GB];
                for (std::int64_t a = 0; a < GB; ++a) qb[a] = batch::load_unaligned(q + a * d + c);
                for (std::int64_t r = 0; r < R; ++r) {
                    const batch kb = load(rp[r] + c);
                    for (std::int64_t a = 0; a < GB; ++a) acc[r * GB + a] = xsimd::fma(qb[a], kb, acc[r * GB + a]);
                }
            }
            alignas(64) float lanes[W];
            K::reduce_rows(acc).store_aligned(lanes);
            for (std::int64_t r = 0; r < R && t + r < m; ++r)
                for (std::int64_t a = 0; a < GB; ++a) {
                    float v = lanes[r * GB + a];
                    for (std::int64_t c = db; c < d; ++c) v += q[a * d + c] * to_float(rp[r][c]);
                    s[a * ss + t + r] = v;
                }
        }
    }

    // GB heads x CB batches of columns in registers while the rows stream past.
    template <int GB, int CB, class TC>
    static void wsum_cols(float* o, std::int64_t os, const float* p, std::int64_t ps, const TC* base,
                          const std::int64_t* idx, std::int64_t m, std::int64_t d, std::int64_t c0) {
        batch acc[GB][CB];
        for (std::int64_t a = 0; a < GB; ++a)
            for (std::int64_t b = 0; b < CB; ++b) acc[a][b] = batch::load_unaligned(o + a * os + c0 + b * W);
        for (std::int64_t t = 0; t < m; ++t) {
            const TC* r = base + idx[t] * d + c0;
            batch vb[CB];
            for (std::int64_t b = 0; b < CB; ++b) vb[b] = load(r + b * W);
            for (std::int64_t a = 0; a < GB; ++a) {
                const batch pt(p[a * ps + t]);
                for (std::int64_t b = 0; b < CB; ++b) acc[a][b] = xsimd::fma(pt, vb[b], acc[a][b]);
            }
        }
        for (std::int64_t a = 0; a < GB; ++a)
            for (std::int64_t b = 0; b < CB; ++b) acc[a][b].store_unaligned(o + a * os + c0 + b * W);
    }

    template <int GB, class TC>
    static void wsum_block(float* o, std::int64_t os, const float* p, std::int64_t ps, const TC* base,
                           const std::int64_t* idx, std::int64_t m, std::int64_t d) {
        constexpr int CB = std::max<int>(1, std::min<int>(4, static_cast<int>(kAcc) / GB));
        const std::int64_t db = d - d % W;
        std::int64_t c = 0;
        for (; c + CB * W <= db; c += CB * W) wsum_cols<GB, CB>(o, os, p, ps, base, idx, m, d, c);
        for (; c < db; c += W) wsum_cols<GB, 1>(o, os, p, ps, base, idx, m, d, c);
        for (; c < d; ++c)
            for (std::int64_t a = 0; a < GB; ++a) {
                float acc = o[a * os + c];
                for (std::int64_t t = 0; t < m; ++t) acc = std::fma(p[a * ps + t], to_float(base[idx[t] * d + c]), acc);
                o[a * os + c] = acc;
            }
    }
};

// scalar_arch: plain loops, always compiled.
template <>
struct GroupKernels<scalar_arch> {
    template <class TC>
    static void dots(const float* q, std::int64_t G, const TC* base, const std::int64_t* idx, std::int64_t m,
                     std::int64_t d, float* s, std::int64_t ss, const TC* = nullptr) {
        for (std::int64_t a = 0; a < G; ++a)
            for (std::int64_t t = 0; t < m; ++t) {
                const TC* r = base + idx[t] * d;
                float v = 0.0f;
                for (std::int64_t c = 0; c < d; ++c) v += q[a * d + c] * to_float(r[c]);
                s[a * ss + t] = v;
            }
    }

    template <class TC>
    static void weighted_sum(float* o, std::int64_t os, const float* p, std::int64_t ps, std::int64_t G,
                             const TC* base, const std::int64_t* idx, std::int64_t m, std::int64_t d) {
        for (std::int64_t a = 0; a < G; ++a)
            for (std::int64_t t = 0; t < m; ++t) {
                const TC* r = base + idx[t] * d;
                for (std::int64_t c = 0; c < d; ++c) o[a * os + c] = std::fma(p[a * ps + t], to_float(r[c]), o[a * os + c]);
            }
    }
};

}  // namespace vlsparse::detail

VLSPARSE_GCC12_AVX512_DIAGNOSTICS_END
