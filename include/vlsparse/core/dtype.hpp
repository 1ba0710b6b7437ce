// vlsparse/core/dtype.hpp -- element types: fp32 (float), fp16 (vlsparse::half), bf16 (vlsparse::bfloat16).
// The 16-bit types are plain 16-bit storage with exact IEEE conversions (round to nearest even), so
// inputs can come straight from an engine's buffers. Fast paths widen to fp32, the reference to double.
// Include: <vlsparse/vlsparse.hpp>
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <type_traits>

#include "vlsparse/core/config.hpp"
#include "vlsparse/core/enum_names.hpp"

namespace vlsparse {

enum class DType : std::uint8_t { f32, f16, bf16 };

inline constexpr EnumName<DType> kDTypeNames[] = {{DType::f32, "fp32"}, {DType::f16, "fp16"}, {DType::bf16, "bf16"}};
constexpr std::span<const EnumName<DType>> enum_names(DType) { return kDTypeNames; }
constexpr std::string_view dtype_name(DType t) { return enum_name(t); }
constexpr std::size_t dtype_size(DType t) { return t == DType::f32 ? 4 : 2; }

// The bits of an fp32 value, and the fp32 value of 32 bits (no conversion: a copy).
VLSPARSE_HD inline std::uint32_t float_bits(float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}
VLSPARSE_HD inline float bits_float(std::uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
namespace detail {
using ::vlsparse::bits_float;
using ::vlsparse::float_bits;
}  // namespace detail

// IEEE 754 binary16 storage.
struct half {
    std::uint16_t bits = 0;

    half() = default;
    VLSPARSE_HD explicit half(float f) : bits(from_float(f)) {}
    VLSPARSE_HD static half from_bits(std::uint16_t b) {
        half h;
        h.bits = b;
        return h;
    }
    VLSPARSE_HD explicit operator float() const { return to_float(bits); }

    VLSPARSE_HD static float to_float(std::uint16_t h) {
        const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
        std::uint32_t exp = (h >> 10) & 0x1Fu;
        std::uint32_t man = h & 0x3FFu;
        std::uint32_t out;
        if (exp == 0x1F) {
            out = sign | 0x7F800000u | (man << 13);  // inf / nan
        } else if (exp == 0) {
            if (man == 0) {
                out = sign;
            } else {  // subnormal: normalize
                int e = -1;
                do {
                    ++e;
                    man <<= 1;
                } while ((man & 0x400u) == 0);
                out = sign | (static_cast<std::uint32_t>(127 - 15 - e) << 23) | ((man & 0x3FFu) << 13);
            }
        } else {
            out = sign | ((exp + (127 - 15)) << 23) | (man << 13);
        }
        return detail::bits_float(out);
    }

    VLSPARSE_HD static std::uint16_t from_float(float f) {
        const std::uint32_t u = detail::float_bits(f);
        const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
        const std::uint32_t absu = u & 0x7FFFFFFFu;
        if (absu >= 0x7F800000u) {  // inf or nan
            return static_cast<std::uint16_t>(sign | 0x7C00u | (absu > 0x7F800000u ? 0x200u : 0u));
        }
        if (absu >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);  // rounds to inf
        if (absu < 0x38800000u) {  // result is subnormal or zero
            if (absu < 0x33000000u) return sign;  // below half of the smallest subnormal
            const std::uint32_t exp = absu >> 23;
            const std::uint32_t man = (absu & 0x7FFFFFu) | 0x800000u;
            const std::uint32_t shift = 126 - exp;  // 14 + (112 - exp) ... yields subnormal mantissa
            std::uint32_t r = man >> shift;
            const std::uint32_t rem = man & ((1u << shift) - 1u);
            const std::uint32_t halfway = 1u << (shift - 1);
            if (rem > halfway || (rem == halfway && (r & 1u))) ++r;
            return static_cast<std::uint16_t>(sign | r);
        }
        std::uint32_t r = absu - 0x38000000u;  // rebias exponent 127 -> 15
        const std::uint32_t rem = r & 0x1FFFu;
        r >>= 13;
        if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
        return static_cast<std::uint16_t>(sign | r);
    }
};

// bfloat16 storage: the upper 16 bits of an IEEE binary32.
struct bfloat16 {
    std::uint16_t bits = 0;

    bfloat16() = default;
    VLSPARSE_HD explicit bfloat16(float f) : bits(from_float(f)) {}
    VLSPARSE_HD static bfloat16 from_bits(std::uint16_t b) {
        bfloat16 h;
        h.bits = b;
        return h;
    }
    VLSPARSE_HD explicit operator float() const { return to_float(bits); }

    VLSPARSE_HD static float to_float(std::uint16_t b) {
        return detail::bits_float(static_cast<std::uint32_t>(b) << 16);
    }
    VLSPARSE_HD static std::uint16_t from_float(float f) {
        const std::uint32_t u = detail::float_bits(f);
        if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);  // quiet nan
        const std::uint32_t lsb = (u >> 16) & 1u;
        return static_cast<std::uint16_t>((u + 0x7FFFu + lsb) >> 16);
    }
};

template <class T>
inline constexpr bool is_element_type_v =
    std::is_same_v<std::remove_const_t<T>, float> || std::is_same_v<std::remove_const_t<T>, half> ||
    std::is_same_v<std::remove_const_t<T>, bfloat16>;

template <class T>
concept ElementType = is_element_type_v<T>;

template <ElementType T>
constexpr DType dtype_of() {
    using U = std::remove_const_t<T>;
    if constexpr (std::is_same_v<U, float>) return DType::f32;
    else if constexpr (std::is_same_v<U, half>) return DType::f16;
    else return DType::bf16;
}

// Widen any element type to float.
VLSPARSE_HD inline float to_float(float x) { return x; }
VLSPARSE_HD inline float to_float(half x) { return half::to_float(x.bits); }
VLSPARSE_HD inline float to_float(bfloat16 x) { return bfloat16::to_float(x.bits); }

// Narrow a float to element type T (round to nearest even).
template <ElementType T>
VLSPARSE_HD inline std::remove_const_t<T> from_float(float f) {
    using U = std::remove_const_t<T>;
    if constexpr (std::is_same_v<U, float>) return f;
    else return U(f);
}

}  // namespace vlsparse
