// vlsparse/detail/simd_common.hpp -- helpers shared by the attention engines of the CPU fast path
// (not for users): OpenMP threads, the error slot of parallel regions, the double-precision row
// fallback, output row stores and the fast finite checks. No Eigen: the decode engines
// (indexed_decode.hpp, decode.hpp, batched_decode.hpp) include this and not dense.hpp.
// Include: internal; the attention headers include it.
#pragma once

#include "vlsparse/core/config.hpp"
VLSPARSE_GCC12_AVX512_DIAGNOSTICS_BEGIN

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <type_traits>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "vlsparse/core/dtype.hpp"
#include "vlsparse/core/tensor.hpp"
#include "vlsparse/detail/check.hpp"
#include "vlsparse/detail/simd_kernels.hpp"

#ifdef _OPENMP
#define VLSPARSE_OMP(x) _Pragma(#x)
#else
#define VLSPARSE_OMP(x)
#endif

namespace vlsparse::simd {

namespace detail {

using namespace ::vlsparse::detail;

inline int max_threads() {
#ifdef _OPENMP
    return std::max(1, omp_get_max_threads());
#else
    return 1;
#endif
}
inline int thread_id() {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

// The first exception thrown inside a parallel region, rethrown after it (exceptions must not cross
// an OpenMP region or work-sharing loop).
class ErrorSlot {
public:
    template <class F>
    void run(F&& f) noexcept {
        try {
            f();
        } catch (...) {
            VLSPARSE_OMP(omp critical(vlsparse_simd_error))
            if (!err_) err_ = std::current_exception();
        }
    }
    void rethrow() const {
        if (err_) std::rethrow_exception(err_);
    }

private:
    std::exception_ptr err_;
};

// Store a float row (length d) into an output row with element stride `stride`.
template <class TO>
void store_row(TO* dst, std::int64_t stride, const float* src, std::int64_t d) {
    if constexpr (std::is_same_v<TO, float>) {
        if (stride == 1) {
            std::memcpy(dst, src, static_cast<std::size_t>(d) * sizeof(float));
            return;
        }
    }
    for (std::int64_t c = 0; c < d; ++c) store(dst[c * stride], src[c]);
}
template <class TO>
void zero_row(TO* dst, std::int64_t stride, std::int64_t d) {
    for (std::int64_t c = 0; c < d; ++c) store(dst[c * stride], 0.0f);
}

// Double-precision softmax attention of one query row over `count` keys: k_at(t, c) and v_at(t, c)
// read element c of key / value t. probs gets the probabilities; o (length d, may be null) the output.
// The one arithmetic of the SIMD paths' double fallbacks (the twin of the reference's row kernel).
template <class TQ, class KAt, class VAt>
void attend_rows_double(const TQ* q, std::int64_t q_stride, std::int64_t d, std::int64_t count, double scale,
                        const KAt& k_at, const VAt& v_at, std::vector<double>& probs, double* o) {
    probs.assign(static_cast<std::size_t>(count), 0.0);
    if (o) std::fill(o, o + d, 0.0);
    if (count == 0) return;
    double mx = -std::numeric_limits<double>::infinity();
    for (std::int64_t t = 0; t < count; ++t) {
        double s = 0.0;
        for (std::int64_t c = 0; c < d; ++c) s += static_cast<double>(to_float(q[c * q_stride])) * static_cast<double>(k_at(t, c));
        probs[static_cast<std::size_t>(t)] = s * scale;
        mx = std::max(mx, probs[static_cast<std::size_t>(t)]);
    }
    double sum = 0.0;
    for (auto& p : probs) {
        p = std::exp(p - mx);
        sum += p;
    }
    for (auto& p : probs) p /= sum;
    if (!o) return;
    for (std::int64_t t = 0; t < count; ++t)
        for (std::int64_t c = 0; c < d; ++c) o[c] += probs[static_cast<std::size_t>(t)] * static_cast<double>(v_at(t, c));
}

// The same over keys[0:count) (identity when keys is null) of KV head g of k / v: the fallback for rows
// whose fp32 computation overflowed.
template <class TQ, class TK>
void attend_row_double(const TQ* q, std::int64_t q_stride, const View3<const TK>& k, const View3<const TK>& v,
                       std::int64_t g, const std::int64_t* keys, std::int64_t count, double scale,
                       std::vector<double>& probs, double* o) {
    attend_rows_double(
        q, q_stride, k.shape[2], count, scale,
        [&](std::int64_t t, std::int64_t c) { return to_float(k.row(keys ? keys[t] : t, g)[c * k.stride[2]]); },
        [&](std::int64_t t, std::int64_t c) { return to_float(v.row(keys ? keys[t] : t, g)[c * v.stride[2]]); }, probs, o);
}

// True when every element of x is finite: the all_finite kernel on contiguous fp32 rows, a test of
// the exponent bits otherwise; several times faster than the exact check, which runs only when
// this finds something (so the error names the element exactly as the reference's does).
template <class T>
bool all_finite_vectorized(const View3<const T>& x) {
    using U = std::remove_const_t<T>;
    if constexpr (std::is_same_v<U, float>) {
        if (x.stride[2] == 1) {
            for (std::int64_t i = 0; i < x.shape[0]; ++i)
                for (std::int64_t j = 0; j < x.shape[1]; ++j)
                    if (!Kernels<native_arch>::all_finite(x.row(i, j), x.shape[2])) return false;
            return true;
        }
    }
    constexpr std::uint32_t mask = std::is_same_v<U, float> ? 0x7F800000u : std::is_same_v<U, half> ? 0x7C00u : 0x7F80u;
    auto bits = [](const U& e) -> std::uint32_t {
        if constexpr (std::is_same_v<U, float>) {
            std::uint32_t u;
            std::memcpy(&u, &e, sizeof u);
            return u;
        } else {
            return e.bits;
        }
    };
    const std::int64_t d = x.shape[2], s = x.stride[2];
    for (std::int64_t i = 0; i < x.shape[0]; ++i)
        for (std::int64_t j = 0; j < x.shape[1]; ++j) {
            const T* row = x.row(i, j);
            std::uint32_t bad = 0;
            if (s == 1) {
                for (std::int64_t c = 0; c < d; ++c) bad |= static_cast<std::uint32_t>((bits(row[c]) & mask) == mask);
            } else {
                for (std::int64_t c = 0; c < d; ++c) bad |= static_cast<std::uint32_t>((bits(row[c * s]) & mask) == mask);
            }
            if (bad) return false;
        }
    return true;
}

template <class T>
void check_finite_vectorized(const View3<const T>& x, const char* fn, const char* name) {
    if (!all_finite_vectorized(x)) check_finite(x, fn, name);
}

template <class TQ, class TK>
void check_all_finite(const View3<const TQ>& q, const View3<const TK>& k, const View3<const TK>& v, const char* fn) {
    check_finite_vectorized(q, fn, "q");
    check_finite_vectorized(k, fn, "k");
    check_finite_vectorized(v, fn, "v");
}

}  // namespace detail

}  // namespace vlsparse::simd

VLSPARSE_GCC12_AVX512_DIAGNOSTICS_END
