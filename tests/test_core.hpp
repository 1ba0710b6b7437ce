// Test-utility core shared by the CPU tests (through test_util.hpp) and the CUDA tests (nvcc includes
// it): the seed of a test's random inputs, the error metrics, and the one tolerance table, keyed by
// backend, element type and metric. The standard library and vlsparse/core/dtype.hpp only: no SIMD,
// Eigen or umbrella header, so that every compiler of the suite can read it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include <vlsparse/core/dtype.hpp>

namespace vt {

// ---- seed ---------------------------------------------------------------------------------------------
// The seed of a test's random inputs: VLSPARSE_TEST_SEED when set, else the test file's own default.
// Each test prints the seed it used (Catch2 INFO), so that a failure can be replayed.
inline std::uint64_t seed_or(std::uint64_t fallback) {
    if (const char* s = std::getenv("VLSPARSE_TEST_SEED")) return std::strtoull(s, nullptr, 0);
    return fallback;
}

// ---- metrics ------------------------------------------------------------------------------------------
// One element as double: double as it is, float / half / bfloat16 widened exactly.
template <class T>
double as_double(T x) {
    if constexpr (std::is_same_v<T, double>) return x;
    else return static_cast<double>(vlsparse::to_float(x));
}

// Normalized mean squared error ||a - b||^2 / ||b||^2 (b the reference) over a's elements; 0 when both
// are zero, infinite when only b is.
template <class A, class B>
double nmse(const std::vector<A>& a, const std::vector<B>& b) {
    double num = 0.0, den = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        const double x = as_double(a[i]);
        const double y = as_double(b[i]);
        num += (x - y) * (x - y);
        den += y * y;
    }
    if (den == 0.0) return num == 0.0 ? 0.0 : INFINITY;
    return num / den;
}

// The largest |a[i] - b[i]| over a's elements.
template <class A, class B>
double max_abs_diff(const std::vector<A>& a, const std::vector<B>& b) {
    double m = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(as_double(a[i]) - as_double(b[i])));
    return m;
}

// ---- tolerances ---------------------------------------------------------------------------------------
// A backend's results against the reference (double accumulation). Inputs are exactly representable
// in their element type (both sides read the same values), so the gap is the backend's arithmetic:
// fp32 accumulation everywhere, plus the rounding of P to the input type on the tensor cores.
enum class TestBackend { simd, cuda };

// What a tolerance bounds. The form of the comparison (what "relative" is relative to) is the
// test's; the table holds the numbers.
enum class Metric {
    // NMSE of attention outputs in fp32 (SIMD path; CUDA decode and indexed decode).
    attention_nmse,
    // NMSE of attention outputs written in the element type: attention_nmse plus the output's rounding
    // (unit roundoff u: NMSE <= u^2). SIMD path (batched decode).
    rounded_output_nmse,
    // NMSE of the CUDA prefill kernels' outputs (also under the Blindsight characterization): fp32 on
    // the CUDA cores; bf16 / fp16 through the tensor cores, P rounded to the input type.
    prefill_nmse,
    // Accumulated / normalized scores, probabilities, importance. SIMD: relative to the largest;
    // CUDA: relative to the element plus 1e-3 of the largest.
    score_rel,
    // PureKV's V norms (CUDA), relative as score_rel.
    norm_rel,
    // ZipVL's cumulative mass of Eq. 7 against its target tau * total (CUDA), relative.
    mass_rel,
};

// The table. A combination without an entry throws, so a test that asks for one fails.
constexpr double tolerance(TestBackend backend, vlsparse::DType type, Metric metric) {
    using vlsparse::DType;
    const bool simd = backend == TestBackend::simd;
    switch (metric) {
        case Metric::attention_nmse: return 1e-9;  // SIMD and CUDA
        case Metric::rounded_output_nmse:
            if (simd) return type == DType::f16 ? 2.5e-7 : type == DType::bf16 ? 1.6e-5 : 1e-9;  // u = 2^-11, 2^-8
            break;
        case Metric::prefill_nmse:
            if (!simd) return type == DType::bf16 ? 1e-4 : type == DType::f16 ? 1e-6 : 1e-10;
            break;
        case Metric::score_rel: return simd ? 1e-5 : 1e-4;
        case Metric::norm_rel:
            if (!simd) return 1e-5;
            break;
        case Metric::mass_rel:
            if (!simd) return 1e-5;
            break;
    }
    throw std::invalid_argument("vt::tolerance: no entry for this backend and metric");
}

// The entry for element type T.
template <class T>
constexpr double tolerance(TestBackend backend, Metric metric) {
    return tolerance(backend, vlsparse::dtype_of<T>(), metric);
}

// The metrics whose bound depends on the element type.
constexpr bool depends_on_dtype(Metric metric) {
    return metric == Metric::rounded_output_nmse || metric == Metric::prefill_nmse;
}

// The entry of a metric that does not depend on the element type (the same for every type); one that
// does throws.
constexpr double tolerance(TestBackend backend, Metric metric) {
    if (depends_on_dtype(metric)) throw std::invalid_argument("vt::tolerance: this metric depends on the element type");
    return tolerance(backend, vlsparse::DType::f32, metric);
}

// The two numbers most CPU tests read: the SIMD path against the reference (not dtype-dependent).
struct Tol {
    double attention_nmse;  // attention outputs
    double score_rel;       // accumulated / normalized scores, probabilities (relative to the largest)
};
inline constexpr Tol kSimdVsReference{tolerance(TestBackend::simd, Metric::attention_nmse),
                                      tolerance(TestBackend::simd, Metric::score_rel)};

}  // namespace vt
