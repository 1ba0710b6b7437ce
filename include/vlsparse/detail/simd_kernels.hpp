// vlsparse/detail/simd_kernels.hpp -- the small vector kernels of the CPU fast path (not for users).
//
// Kernels<Arch> is specialized per instruction set, xsimd style: one implementation for every xsimd
// architecture (xsimd::batch<float, Arch>, tails handled for n not a multiple of the width) and one
// for the tag `scalar_arch`, which is always compiled (and tested) whatever the flags are.
//
//   dot(a, b, n)          sum_i a[i] * b[i]
//   max(x, n)             max_i x[i]                        (n >= 1)
//   exp_sub_sum(x, n, m)  x[i] = exp(x[i] - m) in place; returns sum_i x[i]
//   scale(x, n, s)        x[i] *= s
//   axpy(y, a, x, n)      y[i] += a * x[i]
//   sum_into(acc, x, n)   acc[i] += x[i]
//   all_finite(x, n)      no x[i] is NaN or +-Inf
//   dots(q, k, ldk, m, n, out)          out[t] = dot(q, k + t * ldk, n) for t < m  (rows of a matrix)
//   weighted_sum(o, p, v, ldv, m, n)    o[c] += sum_{t < m} p[t] * v[t * ldv + c] for c < n
//
// `native_arch` and `scalar_arch`: core/simd_arch.hpp. The widening helpers copy a strided row of float / half / bfloat16 into a contiguous
// float buffer (exact conversions). Include: internal; the attention headers include it.
#pragma once

#include "vlsparse/core/config.hpp"
VLSPARSE_GCC12_AVX512_DIAGNOSTICS_BEGIN

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include <xsimd/xsimd.hpp>

#if defined(__F16C__) && (defined(__x86_64__) || defined(__i386__) || defined(_M_X64))
#define VLSPARSE_HAS_F16C 1
#endif
#if defined(VLSPARSE_HAS_F16C) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "vlsparse/core/dtype.hpp"
#include "vlsparse/core/simd_arch.hpp"

namespace vlsparse::detail {

// scalar_arch and native_arch: core/simd_arch.hpp.

// ---------------------------------------------------------------------------------------------
// xsimd architectures
// ---------------------------------------------------------------------------------------------
template <class Arch>
struct Kernels {
    using batch = xsimd::batch<float, Arch>;
    static constexpr std::int64_t W = static_cast<std::int64_t>(batch::size);

    static float dot(const float* a, const float* b, std::int64_t n) {
        batch s0(0.0f), s1(0.0f), s2(0.0f), s3(0.0f);
        std::int64_t i = 0;
        for (; i + 4 * W <= n; i += 4 * W) {
            s0 = xsimd::fma(batch::load_unaligned(a + i), batch::load_unaligned(b + i), s0);
            s1 = xsimd::fma(batch::load_unaligned(a + i + W), batch::load_unaligned(b + i + W), s1);
            s2 = xsimd::fma(batch::load_unaligned(a + i + 2 * W), batch::load_unaligned(b + i + 2 * W), s2);
            s3 = xsimd::fma(batch::load_unaligned(a + i + 3 * W), batch::load_unaligned(b + i + 3 * W), s3);
        }
        for (; i + W <= n; i += W) s0 = xsimd::fma(batch::load_unaligned(a + i), batch::load_unaligned(b + i), s0);
        float s = xsimd::hadd((s0 + s1) + (s2 + s3));
        for (; i < n; ++i) s += a[i] * b[i];
        return s;
    }

    // n >= 1. NaN lanes are not propagated reliably (as with std::max); callers check finiteness.
    static float max(const float* x, std::int64_t n) {
        std::int64_t i = 0;
        float m = -std::numeric_limits<float>::infinity();
        if (n >= W) {
            batch m0 = batch::load_unaligned(x), m1 = m0;
            i = W;
            for (; i + 2 * W <= n; i += 2 * W) {
                m0 = xsimd::max(m0, batch::load_unaligned(x + i));
                m1 = xsimd::max(m1, batch::load_unaligned(x + i + W));
            }
            for (; i + W <= n; i += W) m0 = xsimd::max(m0, batch::load_unaligned(x + i));
            alignas(64) float lanes[W];
            xsimd::max(m0, m1).store_unaligned(lanes);
            for (std::int64_t l = 0; l < W; ++l) m = std::max(m, lanes[l]);
        }
        for (; i < n; ++i) m = std::max(m, x[i]);
        return m;
    }

    static float exp_sub_sum(float* x, std::int64_t n, float m) {
        const batch bm(m);
        batch s0(0.0f), s1(0.0f);
        std::int64_t i = 0;
        for (; i + 2 * W <= n; i += 2 * W) {
            const batch e0 = xsimd::exp(batch::load_unaligned(x + i) - bm);
            const batch e1 = xsimd::exp(batch::load_unaligned(x + i + W) - bm);
            e0.store_unaligned(x + i);
            e1.store_unaligned(x + i + W);
            s0 += e0;
            s1 += e1;
        }
        for (; i + W <= n; i += W) {
            const batch e0 = xsimd::exp(batch::load_unaligned(x + i) - bm);
            e0.store_unaligned(x + i);
            s0 += e0;
        }
        float s = xsimd::hadd(s0 + s1);
        if (i < n) {  // tail: through a padded batch so every element sees the same exp as the body
            alignas(64) float buf[W];
            const std::int64_t r = n - i;
            for (std::int64_t l = 0; l < W; ++l) buf[l] = l < r ? x[i + l] : m;
            const batch e = xsimd::exp(batch::load_unaligned(buf) - bm);
            e.store_unaligned(buf);
            for (std::int64_t l = 0; l < r; ++l) {
                x[i + l] = buf[l];
                s += buf[l];
            }
        }
        return s;
    }

    static void scale(float* x, std::int64_t n, float s) {
        const batch bs(s);
        std::int64_t i = 0;
        for (; i + W <= n; i += W) (batch::load_unaligned(x + i) * bs).store_unaligned(x + i);
        for (; i < n; ++i) x[i] *= s;
    }

    static void axpy(float* y, float a, const float* x, std::int64_t n) {
        const batch ba(a);
        std::int64_t i = 0;
        for (; i + W <= n; i += W)
            xsimd::fma(ba, batch::load_unaligned(x + i), batch::load_unaligned(y + i)).store_unaligned(y + i);
        for (; i < n; ++i) y[i] = std::fma(a, x[i], y[i]);
    }

    static void sum_into(float* acc, const float* x, std::int64_t n) {
        std::int64_t i = 0;
        for (; i + W <= n; i += W)
            (batch::load_unaligned(acc + i) + batch::load_unaligned(x + i)).store_unaligned(acc + i);
        for (; i < n; ++i) acc[i] += x[i];
    }

    // W rows at a time: one accumulator per row (unrolled at compile time, so they live in
    // registers at -O2 too), reduced together by haddp: one horizontal reduction per W dot products.
    static void dots(const float* q, const float* k, std::int64_t ldk, std::int64_t m, std::int64_t n, float* out) {
        const std::int64_t nb = n - n % W;
        std::int64_t t = 0;
        for (; t + W <= m; t += W) {
            dots_tile(q, k + t * ldk, ldk, nb, out + t, std::make_index_sequence<static_cast<std::size_t>(W)>{});
            if (nb < n)
                for (std::int64_t r = 0; r < W; ++r) {
                    const float* kr = k + (t + r) * ldk;
                    float tail = 0.0f;
                    for (std::int64_t c = nb; c < n; ++c) tail += q[c] * kr[c];
                    out[t + r] += tail;
                }
        }
        for (; t < m; ++t) out[t] = dot(q, k + t * ldk, n);
    }

    // Up to 4 batches of o stay in registers while the rows stream past.
    static void weighted_sum(float* o, const float* p, const float* v, std::int64_t ldv, std::int64_t m, std::int64_t n) {
        std::int64_t c = 0;
        for (; c + 4 * W <= n; c += 4 * W) {
            batch a0 = batch::load_unaligned(o + c), a1 = batch::load_unaligned(o + c + W);
            batch a2 = batch::load_unaligned(o + c + 2 * W), a3 = batch::load_unaligned(o + c + 3 * W);
            for (std::int64_t t = 0; t < m; ++t) {
                const batch pt(p[t]);
                const float* vr = v + t * ldv + c;
                a0 = xsimd::fma(pt, batch::load_unaligned(vr), a0);
                a1 = xsimd::fma(pt, batch::load_unaligned(vr + W), a1);
                a2 = xsimd::fma(pt, batch::load_unaligned(vr + 2 * W), a2);
                a3 = xsimd::fma(pt, batch::load_unaligned(vr + 3 * W), a3);
            }
            a0.store_unaligned(o + c);
            a1.store_unaligned(o + c + W);
            a2.store_unaligned(o + c + 2 * W);
            a3.store_unaligned(o + c + 3 * W);
        }
        for (; c + W <= n; c += W) {
            batch a0 = batch::load_unaligned(o + c);
            for (std::int64_t t = 0; t < m; ++t) a0 = xsimd::fma(batch(p[t]), batch::load_unaligned(v + t * ldv + c), a0);
            a0.store_unaligned(o + c);
        }
        for (; c < n; ++c) {
            float a = o[c];
            for (std::int64_t t = 0; t < m; ++t) a = std::fma(p[t], v[t * ldv + c], a);
            o[c] = a;
        }
    }

    // x * 0 is 0 for finite x and NaN for NaN or Inf; NaN survives the sum.
    static bool all_finite(const float* x, std::int64_t n) {
        const batch zero(0.0f);
        batch a0(0.0f), a1(0.0f);
        std::int64_t i = 0;
        for (; i + 2 * W <= n; i += 2 * W) {
            a0 = xsimd::fma(batch::load_unaligned(x + i), zero, a0);
            a1 = xsimd::fma(batch::load_unaligned(x + i + W), zero, a1);
        }
        for (; i + W <= n; i += W) a0 = xsimd::fma(batch::load_unaligned(x + i), zero, a0);
        float t = xsimd::hadd(a0 + a1);
        for (; i < n; ++i) t += x[i] * 0.0f;
        return t == 0.0f;
    }

private:
    template <std::size_t... R>
    static void dots_tile(const float* q, const float* k, std::int64_t ldk, std::int64_t nb, float* out,
                          std::index_sequence<R...>) {
        batch acc[sizeof...(R)] = {((void)R, batch(0.0f))...};
        for (std::int64_t c = 0; c < nb; c += W) {
            const batch qb = batch::load_unaligned(q + c);
            ((acc[R] = xsimd::fma(batch::load_unaligned(k + static_cast<std::int64_t>(R) * ldk + c), qb, acc[R])), ...);
        }
        reduce_rows(acc).store_unaligned(out);
    }

public:
    // Lane r of the result = horizontal sum of acc[r] (acc: W batches). xsimd 8.1's haddp is correct for SSE and AVX
    // but permutes lanes 2-3 / 4-5 and 10-11 / 12-13 for AVX-512 (found by the dots test), so AVX-512
    // gets its own transpose-and-add tree (written out, so that everything stays in registers). The
    // tree's output lane j holds the sum of its input slot p[j], p = {0, 2, 1, 3, 8, 10, 9, 11, 4, 6,
    // 5, 7, 12, 14, 13, 15} (an involution), so slot s is fed acc[p[s]].
    static batch reduce_rows(const batch* acc) {
#if defined(__AVX512F__)
        if constexpr (W == 16 && std::is_base_of_v<xsimd::avx512f, Arch>) {
            const auto halves = [](__m512 a, __m512 b) {  // [a.lo + a.hi, b.lo + b.hi] (256-bit halves)
                return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                                     _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
            };
            const auto quarters = [](__m512 a, __m512 b) {  // 128-bit quarters added pairwise
                return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(2, 0, 2, 0)),
                                     _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
            };
            const auto pairs = [](__m512 a, __m512 b) {  // 64-bit pairs within 128-bit lanes
                return _mm512_add_ps(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                                     _mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
            };
            const auto singles = [](__m512 a, __m512 b) {  // even + odd elements
                return _mm512_add_ps(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)),
                                     _mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
            };
            const __m512 t0 = halves(acc[0], acc[4]), t1 = halves(acc[2], acc[6]);
            const __m512 t2 = halves(acc[1], acc[5]), t3 = halves(acc[3], acc[7]);
            const __m512 t4 = halves(acc[8], acc[12]), t5 = halves(acc[10], acc[14]);
            const __m512 t6 = halves(acc[9], acc[13]), t7 = halves(acc[11], acc[15]);
            const __m512 u0 = quarters(t0, t4), u1 = quarters(t1, t5), u2 = quarters(t2, t6), u3 = quarters(t3, t7);
            return batch(singles(pairs(u0, u2), pairs(u1, u3)));
        } else
#endif
        {
            return xsimd::haddp(acc);
        }
    }
};

// ---------------------------------------------------------------------------------------------
// scalar_arch: plain loops, always compiled
// ---------------------------------------------------------------------------------------------
template <>
struct Kernels<scalar_arch> {
    static constexpr std::int64_t W = 1;

    static float dot(const float* a, const float* b, std::int64_t n) {
        float s = 0.0f;
        for (std::int64_t i = 0; i < n; ++i) s += a[i] * b[i];
        return s;
    }
    static float max(const float* x, std::int64_t n) {
        float m = -std::numeric_limits<float>::infinity();
        for (std::int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
        return m;
    }
    static float exp_sub_sum(float* x, std::int64_t n, float m) {
        float s = 0.0f;
        for (std::int64_t i = 0; i < n; ++i) {
            x[i] = std::exp(x[i] - m);
            s += x[i];
        }
        return s;
    }
    static void scale(float* x, std::int64_t n, float s) {
        for (std::int64_t i = 0; i < n; ++i) x[i] *= s;
    }
    static void axpy(float* y, float a, const float* x, std::int64_t n) {
        for (std::int64_t i = 0; i < n; ++i) y[i] += a * x[i];
    }
    static void sum_into(float* acc, const float* x, std::int64_t n) {
        for (std::int64_t i = 0; i < n; ++i) acc[i] += x[i];
    }
    static bool all_finite(const float* x, std::int64_t n) {
        for (std::int64_t i = 0; i < n; ++i)
            if (!std::isfinite(x[i])) return false;
        return true;
    }
    static void dots(const float* q, const float* k, std::int64_t ldk, std::int64_t m, std::int64_t n, float* out) {
        for (std::int64_t t = 0; t < m; ++t) out[t] = dot(q, k + t * ldk, n);
    }
    static void weighted_sum(float* o, const float* p, const float* v, std::int64_t ldv, std::int64_t m, std::int64_t n) {
        for (std::int64_t t = 0; t < m; ++t) axpy(o, p[t], v + t * ldv, n);
    }
};

// ---------------------------------------------------------------------------------------------
// Widening: a strided row of n elements of T into a contiguous float buffer (exact conversions).
// ---------------------------------------------------------------------------------------------
inline void widen_row(const float* src, std::int64_t stride, float* dst, std::int64_t n) {
    if (stride == 1) {
        if (n > 0) std::memcpy(dst, src, static_cast<std::size_t>(n) * sizeof(float));
        return;
    }
    for (std::int64_t i = 0; i < n; ++i) dst[i] = src[i * stride];
}

inline void widen_row(const half* src, std::int64_t stride, float* dst, std::int64_t n) {
    std::int64_t i = 0;
#if defined(VLSPARSE_HAS_F16C)
    if (stride == 1) {  // vcvtph2ps is exact, like half::to_float
        for (; i + 8 <= n; i += 8) {
            const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
        }
    }
#endif
    for (; i < n; ++i) dst[i] = half::to_float(src[i * stride].bits);
}

inline void widen_row(const bfloat16* src, std::int64_t stride, float* dst, std::int64_t n) {
    if (stride == 1) {
        std::uint16_t bits;
        for (std::int64_t i = 0; i < n; ++i) {
            std::memcpy(&bits, src + i, 2);
            const std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
            std::memcpy(dst + i, &u, 4);
        }
        return;
    }
    for (std::int64_t i = 0; i < n; ++i) dst[i] = bfloat16::to_float(src[i * stride].bits);
}

// A view with a const element type converts through the same overloads.
template <class T>
inline void widen_row(T* src, std::int64_t stride, float* dst, std::int64_t n)
    requires(!std::is_const_v<T> && is_element_type_v<T>)
{
    widen_row(static_cast<const T*>(src), stride, dst, n);
}

}  // namespace vlsparse::detail

VLSPARSE_GCC12_AVX512_DIAGNOSTICS_END
