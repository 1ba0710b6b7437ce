// vlsparse/detail/check.hpp -- argument validation shared by every backend (not for users).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "vlsparse/core/dtype.hpp"
#include "vlsparse/core/error.hpp"
#include "vlsparse/core/tensor.hpp"

namespace vlsparse::detail {

// Byte range [lo, hi) a view can touch. Views with a zero extent touch nothing.
template <class T, int R>
std::pair<const char*, const char*> byte_range(const TensorView<T, R>& v) {
    if (v.numel() == 0) return {nullptr, nullptr};
    std::int64_t last = 0;
    for (int i = 0; i < R; ++i) last += (v.shape[i] - 1) * v.stride[i];
    const char* lo = reinterpret_cast<const char*>(v.data);
    return {lo, lo + (last + 1) * static_cast<std::int64_t>(sizeof(T))};
}

template <class A, int RA, class B, int RB>
bool overlaps(const TensorView<A, RA>& a, const TensorView<B, RB>& b) {
    auto [alo, ahi] = byte_range(a);
    auto [blo, bhi] = byte_range(b);
    if (!alo || !blo) return false;
    return alo < bhi && blo < ahi;
}

// Strides must be non-negative, and an output view must not map two indices to one element.
template <class T, int R>
void check_strides(const TensorView<T, R>& v, const char* fn, const char* name, bool is_output) {
    for (int i = 0; i < R; ++i) {
        require(v.shape[i] >= 0, fn, name, " has negative extent ", v.shape[i], " in dimension ", i);
        require(v.stride[i] >= 0, fn, name, " has negative stride ", v.stride[i], " in dimension ", i,
                "; expected strides >= 0 (in elements)");
    }
    require(v.numel() == 0 || v.data != nullptr, fn, name, " has a null data pointer");
    if (!is_output || v.numel() == 0) return;
    // Sufficient condition for no self-aliasing: sorted by stride, each stride covers the previous extent.
    std::array<int, R> order;
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return v.stride[a] < v.stride[b]; });
    std::int64_t span = 1;
    for (int k = 0; k < R; ++k) {
        const int i = order[k];
        if (v.shape[i] == 1) continue;
        require(v.stride[i] >= span, fn, "output ", name, " has overlapping strides (stride ", v.stride[i],
                " in dimension ", i, " is smaller than the extent ", span, " of the faster dimensions)");
        span = v.stride[i] * v.shape[i];
    }
}

template <class O, int RO, class I, int RI>
void check_no_alias(const TensorView<O, RO>& out, const TensorView<I, RI>& in, const char* fn, const char* out_name,
                    const char* in_name) {
    require(!overlaps(out, in), fn, "output ", out_name, " aliases input ", in_name,
            "; expected separate buffers");
}

// Every element finite (no NaN, no Inf).
template <class T, int R>
void check_finite(const TensorView<T, R>& v, const char* fn, const char* name) {
    if (v.numel() == 0) return;
    static_assert(R == 3, "check_finite is written for rank-3 views");
    for (std::int64_t i = 0; i < v.shape[0]; ++i)
        for (std::int64_t j = 0; j < v.shape[1]; ++j) {
            const T* row = v.row(i, j);
            for (std::int64_t k = 0; k < v.shape[2]; ++k) {
                const float x = to_float(row[k * v.stride[2]]);
                if (!std::isfinite(x))
                    throw ::vlsparse::error(fn, concat(name, "[", i, ", ", j, ", ", k, "] = ", x,
                                                       "; expected finite values (no NaN or Inf)"));
            }
        }
}

inline void check_sorted_unique(std::span<const std::int64_t> idx, std::int64_t n, const char* fn,
                                const char* name) {
    for (std::size_t i = 0; i < idx.size(); ++i) {
        require(idx[i] >= 0 && idx[i] < n, fn, name, "[", i, "] = ", idx[i], ", expected an index in [0, ", n, ")");
        if (i == 0) continue;  // require evaluates its message arguments: idx[i - 1] only exists from i = 1
        require(idx[i] > idx[i - 1], fn, name, " is not sorted ascending without duplicates (", name, "[", i - 1,
                "] = ", idx[i - 1], ", ", name, "[", i, "] = ", idx[i], ")");
    }
}

// ---- narrowing to a 16-bit element type ----------------------------------------------------------
// Values are computed in fp32 (or double) and stored as T. Rounding to fp16 turns every finite value
// beyond 65504 into inf (bf16: beyond 3.39e38); the checks below make that an error instead.

template <class T>
inline constexpr bool is_16bit_element_v =
    std::is_same_v<std::remove_const_t<T>, half> || std::is_same_v<std::remove_const_t<T>, bfloat16>;

// The largest finite value of a 16-bit element type.
template <class T>
constexpr float largest_finite() {
    if constexpr (std::is_same_v<std::remove_const_t<T>, half>) return 65504.0f;
    else return 3.38953139e38f;  // bf16 0x7F7F
}

// An output view of rank 2 or 3 written from fp32 results of finite inputs: every element must be
// finite, so a non-finite one is a value the narrowing to T overflowed. Throws naming the first one;
// nothing to check for fp32 and double outputs.
template <class T, int R>
void check_narrowed_output(const TensorView<T, R>& v, const char* fn, const char* name) {
    static_assert(R == 2 || R == 3, "check_narrowed_output is written for rank-2 and rank-3 views");
    if constexpr (is_16bit_element_v<T>) {
        if (v.numel() == 0) return;
        const std::int64_t n2 = R == 3 ? v.shape[2] : 1;
        for (std::int64_t i = 0; i < v.shape[0]; ++i)
            for (std::int64_t j = 0; j < v.shape[1]; ++j)
                for (std::int64_t k = 0; k < n2; ++k) {
                    const T* e = v.data + i * v.stride[0] + j * v.stride[1];
                    if constexpr (R == 3) e += k * v.stride[2];
                    if (std::isfinite(to_float(*e))) continue;
                    const std::string at = R == 3 ? concat(i, ", ", j, ", ", k) : concat(i, ", ", j);
                    throw ::vlsparse::error(fn, concat(name, "[", at, "] overflows ", dtype_name(dtype_of<T>()),
                                                       " (a value beyond ", largest_finite<T>(),
                                                       " rounds to inf); expected values the output type holds"));
                }
    }
}

// The first element of `count` values (stride apart, any element type) whose conversion to T turns a
// finite value into inf, or -1. Always -1 when T is float (widening or the same type).
template <class T, class S>
std::int64_t first_narrowing_overflow(const S* src, std::int64_t stride, std::int64_t count) {
    if constexpr (is_16bit_element_v<T> && !std::is_same_v<std::remove_const_t<S>, std::remove_const_t<T>>) {
        for (std::int64_t c = 0; c < count; ++c) {
            const float x = to_float(src[c * stride]);
            if (std::isfinite(x) && !std::isfinite(to_float(from_float<T>(x)))) return c;
        }
    }
    return -1;
}

}  // namespace vlsparse::detail
