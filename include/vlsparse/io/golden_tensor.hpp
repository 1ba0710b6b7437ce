// vlsparse/io/golden_tensor.hpp -- one tensor of a golden case as its manifest describes it: name,
// file, dtype, shape, metric and tolerance (docs/golden-format.md), and the golden dtype and metric names.
// No JSON: the manifest (<vlsparse/io/golden.hpp>) reads and writes these; the comparison
// (<vlsparse/io/golden_compare.hpp>) applies them.
// Include: <vlsparse/io/golden.hpp> (or this header alone).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "vlsparse/core/dtype.hpp"

namespace vlsparse {

struct GoldenTensor {
    std::string name;         // unique within the manifest, e.g. "indices"
    std::string file;         // plain file name inside the case folder, e.g. "indices.npy"
    std::string dtype;        // fp32 | fp64 | fp16 | bf16 | int64 | int32 | uint8 | bool
    std::vector<std::int64_t> shape;
    std::string metric;       // exact | rel | nmse | abs; required for outputs, optional ("") for inputs
    double tol = 0;           // tolerance of rel/abs/nmse (ignored by exact); the bar for fp32 arithmetic
    // Optional: the tolerance by the arithmetic precision of the port (keys fp64, fp32, fp16, bf16;
    // JSON "tols"). A precision not listed uses `tol`.
    std::map<std::string, double> tols;
    std::string description;  // optional, free text

    double tol_for(std::string_view precision) const {
        const auto it = tols.find(std::string(precision));
        return it == tols.end() ? tol : it->second;
    }
};

// The .npy descr of a golden dtype name ("" when the name is unknown).
inline std::string_view golden_descr(std::string_view dtype) {
    if (dtype == "fp32") return "<f4";
    if (dtype == "fp64") return "<f8";
    if (dtype == "fp16") return "<f2";
    if (dtype == "bf16") return "<u2";
    if (dtype == "int64") return "<i8";
    if (dtype == "int32") return "<i4";
    if (dtype == "uint8") return "|u1";
    if (dtype == "bool") return "|b1";
    return "";
}

// The golden dtype name of a C++ element type.
template <class T>
constexpr std::string_view golden_dtype_of() {
    using U = std::remove_const_t<T>;
    if constexpr (std::is_same_v<U, float>) return "fp32";
    else if constexpr (std::is_same_v<U, double>) return "fp64";
    else if constexpr (std::is_same_v<U, half>) return "fp16";
    else if constexpr (std::is_same_v<U, bfloat16>) return "bf16";
    else if constexpr (std::is_same_v<U, std::int64_t>) return "int64";
    else if constexpr (std::is_same_v<U, std::int32_t>) return "int32";
    else if constexpr (std::is_same_v<U, std::uint8_t>) return "uint8";
    else if constexpr (std::is_same_v<U, bool>) return "bool";
    else static_assert(sizeof(U) == 0, "no golden dtype for this element type");
}

template <class T>
concept GoldenElement = (std::is_same_v<std::remove_const_t<T>, float> || std::is_same_v<std::remove_const_t<T>, double> ||
                         std::is_same_v<std::remove_const_t<T>, half> ||
                         std::is_same_v<std::remove_const_t<T>, bfloat16> ||
                         std::is_same_v<std::remove_const_t<T>, std::int64_t> ||
                         std::is_same_v<std::remove_const_t<T>, std::int32_t> ||
                         std::is_same_v<std::remove_const_t<T>, std::uint8_t> ||
                         std::is_same_v<std::remove_const_t<T>, bool>);

inline bool is_golden_metric(std::string_view m) { return m == "exact" || m == "rel" || m == "abs" || m == "nmse"; }
// The arithmetic precisions a tensor's "tols" may name.
inline bool is_golden_precision(std::string_view p) { return p == "fp64" || p == "fp32" || p == "fp16" || p == "bf16"; }

namespace detail {

inline std::string shape_str(const std::vector<std::int64_t>& s) {
    std::string out = "[";
    for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + "]";
}

}  // namespace detail

}  // namespace vlsparse
