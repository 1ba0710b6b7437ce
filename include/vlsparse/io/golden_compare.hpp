// vlsparse/io/golden_compare.hpp -- compares a port's output with a golden tensor under the metric and
// tolerance its manifest entry gives (docs/golden-format.md):
//   exact   every element equal (indices, counts, masks)
//   rel     max|got - expected| / max|expected| <= tol   (scores)
//   abs     max|got - expected| <= tol
//   nmse    ||got - expected||^2 / ||expected||^2 <= tol (attention outputs; both zero passes)
// Works on NpyArray values (npy.hpp) and a GoldenTensor entry (golden_tensor.hpp); no JSON, so a port
// that reads its manifests otherwise can still use it.
// Include: <vlsparse/io/golden.hpp> (or this header alone).
#pragma once

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "vlsparse/core/error.hpp"
#include "vlsparse/io/golden_tensor.hpp"
#include "vlsparse/io/npy.hpp"

namespace vlsparse {

struct CompareResult {
    bool pass = false;
    // One line: the metric value against the tolerance, and the first difference (flat index,
    // multi-index, expected, got); on a shape mismatch, both shapes.
    std::string detail;
    double value = 0;  // the metric's value (exact: the number of differing elements)
    // On a failure with equal shapes, the element that decides it: exact, the first unequal one; rel
    // and abs, the first over the per-element limit (tol, or tol * max|expected|); nmse, the first
    // nonzero difference. first = its flat index (-1: none), diff = |got - expected| (inf when one
    // side is not finite and they differ).
    std::int64_t first = -1;
    double expected = std::numeric_limits<double>::quiet_NaN(), got = std::numeric_limits<double>::quiet_NaN(),
           diff = std::numeric_limits<double>::quiet_NaN();
};

namespace detail {

inline std::string multi_index(const std::vector<std::int64_t>& shape, std::int64_t flat) {
    std::vector<std::int64_t> ix(shape.size());
    for (std::size_t d = shape.size(); d-- > 0;) {
        ix[d] = shape[d] ? flat % shape[d] : 0;
        flat = shape[d] ? flat / shape[d] : 0;
    }
    return shape_str(ix);
}

// Shortest text that reads back as the same double.
inline std::string fmt_num(double x) {
    char buf[64];
    const auto res = std::to_chars(buf, buf + sizeof(buf), x);
    return std::string(buf, res.ptr);
}

// An element read exactly: integers as integers (no rounding of 64-bit values), floats as double.
struct ExactElem {
    bool is_int = false, negative = false;
    std::uint64_t mag = 0;  // |value| for integers
    double f = 0;           // the value for floats (and an approximation for integers)
};

inline ExactElem exact_elem(const NpyArray& a, std::size_t i, U2As u2) {
    ExactElem e;
    const char kind = a.descr[1];
    const bool integer = kind == 'i' || kind == 'b' || (kind == 'u' && !(a.descr == "<u2" && u2 == U2As::bfloat16));
    e.f = a.at_double(i, u2);
    if (!integer) return e;
    e.is_int = true;
    const std::size_t sz = a.itemsize();
    unsigned char b[8] = {};
    npy_copy_le(b, a.data.data() + i * sz, 1, sz);
    std::uint64_t u = 0;
    for (std::size_t k = 0; k < sz; ++k) u |= static_cast<std::uint64_t>(b[k]) << (8 * k);
    if (kind == 'b') u = u != 0;
    const bool neg = kind == 'i' && (u >> (8 * sz - 1)) & 1u;
    if (neg) {
        const std::uint64_t ext = sz == 8 ? u : (u | (~std::uint64_t{0} << (8 * sz)));  // sign-extend
        e.mag = ~ext + 1;                                                                 // two's complement magnitude
    } else {
        e.mag = u;
    }
    e.negative = neg;
    return e;
}

inline bool exact_equal(const ExactElem& a, const ExactElem& b) {
    if (a.is_int && b.is_int) return a.negative == b.negative && (a.mag == b.mag);
    if (!a.is_int && !b.is_int) return a.f == b.f || (std::isnan(a.f) && std::isnan(b.f));
    const ExactElem& i = a.is_int ? a : b;
    const ExactElem& f = a.is_int ? b : a;
    if (!std::isfinite(f.f) || f.f != std::floor(f.f) || std::fabs(f.f) >= 18446744073709551616.0) return false;
    const bool fneg = f.f < 0;
    const auto fmag = static_cast<std::uint64_t>(std::fabs(f.f));
    return (fmag == 0 && i.mag == 0) || (fneg == i.negative && fmag == i.mag);
}

}  // namespace detail

// Compares a port's output `got` with the golden `expected` under spec.metric and spec.tol.
// rel/abs/nmse use b = expected as the reference. Non-finite values: equal infinities match, a NaN
// matches only a NaN under exact; any other non-finite difference fails. '<u2' data is read as
// bfloat16 when spec.dtype is "bf16". `got` may have another numeric dtype than the golden file
// (e.g. int32 indices against int64): values are compared, not bytes.
inline CompareResult compare(const GoldenTensor& spec, const NpyArray& expected, const NpyArray& got) {
    constexpr const char* fn = "compare";
    detail::require(is_golden_metric(spec.metric), fn, "tensor '", spec.name, "' has ",
                    spec.metric.empty() ? std::string("no metric") : "unknown metric '" + spec.metric + "'",
                    ", expected exact, rel, nmse or abs");
    CompareResult r;
    const std::string& m = spec.metric;
    if (expected.shape != spec.shape) {
        r.detail = "shape mismatch: the golden tensor has shape " + detail::shape_str(expected.shape) +
                   ", the manifest says " + detail::shape_str(spec.shape);
        return r;
    }
    if (got.shape != expected.shape) {
        r.detail = "shape mismatch: expected " + detail::shape_str(expected.shape) + ", got " +
                   detail::shape_str(got.shape);
        return r;
    }
    for (const NpyArray* a : {&expected, &got}) {
        const auto n = static_cast<std::size_t>(a->numel());
        if (a->itemsize() == 0 || a->data.size() != n * a->itemsize()) {
            r.detail = std::string(a == &expected ? "expected" : "got") + " array is malformed (descr '" + a->descr +
                       "', " + std::to_string(a->data.size()) + " bytes for shape " + detail::shape_str(a->shape) + ")";
            return r;
        }
    }
    const U2As u2 = spec.dtype == "bf16" ? U2As::bfloat16 : U2As::uint16;
    const auto n = static_cast<std::size_t>(expected.numel());
    auto where = [&](std::size_t i) {
        return "flat index " + std::to_string(i) + " " + detail::multi_index(expected.shape, static_cast<std::int64_t>(i));
    };
    auto elem = [&](std::size_t i) {
        return where(i) + ": expected " + detail::fmt_num(expected.at_double(i, u2)) + ", got " +
               detail::fmt_num(got.at_double(i, u2));
    };
    // diff(i) = |got - expected|, inf for an unmatched non-finite.
    const double inf = std::numeric_limits<double>::infinity();
    auto diff = [&](std::size_t i) {
        const double a = got.at_double(i, u2), b = expected.at_double(i, u2);
        if (a == b) return 0.0;
        if (!std::isfinite(a) || !std::isfinite(b)) return inf;
        return std::fabs(a - b);
    };
    auto note_first = [&](std::size_t i) {
        r.first = static_cast<std::int64_t>(i);
        r.expected = expected.at_double(i, u2);
        r.got = got.at_double(i, u2);
        r.diff = diff(i);
        return elem(i) + " (|diff| = " + detail::fmt_num(r.diff) + ")";
    };

    if (m == "exact") {
        std::size_t diffs = 0, first = n;
        for (std::size_t i = 0; i < n; ++i) {
            if (!detail::exact_equal(detail::exact_elem(expected, i, u2), detail::exact_elem(got, i, u2))) {
                if (diffs++ == 0) first = i;
            }
        }
        r.value = static_cast<double>(diffs);
        r.pass = diffs == 0;
        r.detail = r.pass ? "exact: all " + std::to_string(n) + " elements equal"
                          : "exact: " + std::to_string(diffs) + " of " + std::to_string(n) +
                                " elements differ; first difference at " + note_first(first);
        return r;
    }

    // rel / abs / nmse over b = expected.
    double max_diff = 0, max_ref = 0, sq_diff = 0, sq_ref = 0;
    std::size_t first_diff = n;
    for (std::size_t i = 0; i < n; ++i) {
        const double di = diff(i), b = expected.at_double(i, u2);
        if (di != 0 && first_diff == n) first_diff = i;
        max_diff = std::max(max_diff, di);
        if (std::isfinite(b)) {
            max_ref = std::max(max_ref, std::fabs(b));
            sq_ref += b * b;
        }
        sq_diff += di * di;
    }
    std::string formula;
    double limit = 0;  // per-element |diff| above which one element alone fails (rel, abs)
    if (m == "abs") {
        r.value = max_diff;
        formula = "max|got-expected|";
        limit = spec.tol;
    } else if (m == "rel") {
        r.value = max_diff == 0 ? 0.0 : max_ref == 0 ? inf : max_diff / max_ref;
        formula = "max|got-expected|/max|expected|";
        limit = spec.tol * max_ref;
    } else {  // nmse
        r.value = sq_diff == 0 ? 0.0 : sq_ref == 0 ? inf : sq_diff / sq_ref;
        formula = "||got-expected||^2/||expected||^2";
    }
    r.pass = r.value <= spec.tol;
    r.detail = m + ": " + formula + " = " + detail::fmt_num(r.value) + (r.pass ? " <= tol " : " > tol ") +
               detail::fmt_num(spec.tol) + " over " + std::to_string(n) + " elements";
    if (!r.pass) {
        std::size_t first = first_diff;
        if (m != "nmse")
            for (std::size_t i = 0; i < n; ++i)
                if (diff(i) > limit) {
                    first = i;
                    break;
                }
        if (first < n)
            r.detail += std::string(m == "nmse" ? "; first difference at " : "; first element over tolerance at ") +
                        note_first(first);
    }
    return r;
}

}  // namespace vlsparse
