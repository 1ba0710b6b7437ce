// vlsparse/reference/golden_case.hpp -- what every algorithm's golden runner (X_golden.hpp) shares: the
// metric and tolerances of an output (OutputMetric, score_metric, attention_metric), a run's named
// outputs (NamedArray), the decision margin of a top-k cutoff, the dtype narrowing of the fp32 inputs,
// and the reading of a case folder's manifest and of the inputs of a prefill + decode case.
// Case folders and tolerances: docs/golden-format.md. Needs nlohmann/json.
// Include: any <vlsparse/reference/X_golden.hpp>, or this header.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "vlsparse/core/dtype.hpp"
#include "vlsparse/core/error.hpp"
#include "vlsparse/core/layout.hpp"
#include "vlsparse/io/golden.hpp"

namespace vlsparse::golden {

// The metric of one golden output and the tolerances a port must meet (docs/golden-format.md,
// "Tolerances"): `tol` is the bar for fp32 arithmetic (what the SIMD path meets), `tols` the bar by the
// port's arithmetic precision (fp64: what the double reference and the numpy ports meet; fp16 / bf16:
// attention kernels that round probabilities and outputs to 16 bits). Empty `tols`: one bar for all.
struct OutputMetric {
    std::string metric = "exact";
    double tol = 0.0;
    std::map<std::string, double> tols;

    void apply(GoldenTensor& t) const {
        t.metric = metric;
        t.tol = tol;
        t.tols = tols;
    }
};

// Scores (attention probabilities summed or averaged over rows and heads, and quantities derived from
// them; rel) and attention outputs (nmse), shared by every algorithm's golden files. Each is 10-500x
// above what was measured (docs/golden-format.md, "Tolerances"): fp64 ports 3e-15 (scores) and 1e-15
// (outputs, stored in fp32); the SIMD path 4.5e-7 and 1.1e-12; an fp32 numpy port 1.4e-6 and
// 1.6e-12; FlashAttention-style 16-bit probabilities and outputs 9.5e-8 (fp16) and 6.3e-6 (bf16).
inline constexpr double kScoreRelFp64 = 1e-12, kScoreRelFp32 = 1e-5;
inline constexpr double kAttentionNmseFp64 = 1e-13, kAttentionNmseFp32 = 1e-10, kAttentionNmseFp16 = 1e-6,
                        kAttentionNmseBf16 = 1e-4;
inline OutputMetric score_metric() { return {"rel", kScoreRelFp32, {{"fp64", kScoreRelFp64}, {"fp32", kScoreRelFp32}}}; }
inline OutputMetric attention_metric() {
    return {"nmse", kAttentionNmseFp32,
            {{"fp64", kAttentionNmseFp64}, {"fp32", kAttentionNmseFp32}, {"fp16", kAttentionNmseFp16},
             {"bf16", kAttentionNmseBf16}}};
}

// The inputs every prefill + decode case has (ZipVL's, A-VL's), in fp32, plus the dtype they are stored
// and fed in: q [n, H, d], k, v [n, H_kv, d], decode_q [S, H, d], decode_k, decode_v [S, H_kv, d].
struct DecodeCaseInputs {
    std::string dtype;  // fp32 | fp16 | bf16
    std::int64_t n = 0, H = 0, Hkv = 0, d = 0, steps = 0;
    Layout layout;
    std::vector<float> q, k, v, dq, dk, dv;  // values exactly representable in `dtype`
};

// One named output tensor of a run.
struct NamedArray {
    std::string name;
    NpyArray array;
};

namespace detail {

// Relative gap between the k-th and (k+1)-th largest of s: the decision margin of a top-k cutoff, which
// every golden generator checks. An exact tie at the cutoff gives 0 (a case with one is rejected: only
// the ties_uniform cases hold deliberate ties), unless every value is 0.
inline double cut_margin(std::vector<double> s, std::int64_t k) {
    if (k <= 0 || k >= static_cast<std::int64_t>(s.size())) return 1.0;
    std::sort(s.begin(), s.end(), std::greater<double>());
    const double gap = s[static_cast<std::size_t>(k - 1)] - s[static_cast<std::size_t>(k)];
    return s[0] == 0.0 ? 1.0 : gap / s[0];
}

template <class T>
std::vector<T> narrow(const std::vector<float>& x) {
    std::vector<T> out(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) out[i] = from_float<T>(x[i]);
    return out;
}

// The manifest of case folder `dir`, checked to be of `algorithm` (fn names the caller).
inline GoldenManifest read_case_manifest(const std::filesystem::path& dir, const char* algorithm, const char* fn) {
    GoldenManifest m = read_manifest(dir);
    ::vlsparse::detail::require(m.algorithm == algorithm, fn, dir.string(), ": algorithm '", m.algorithm, "', expected '",
                                algorithm, "'");
    return m;
}

// The tensors of a prefill + decode case into `c` (its dtype, n, H, d, H_kv and steps from their
// shapes; the layout is the caller's). `m` is the case's manifest.
inline void read_decode_case_inputs(const std::filesystem::path& dir, const GoldenManifest& m, DecodeCaseInputs& c,
                                    const char* fn) {
    const auto& tq = m.input("q");
    const auto& tk = m.input("k");
    ::vlsparse::detail::require(tq.shape.size() == 3 && tk.shape.size() == 3, fn, dir.string(), ": q and k must have rank 3");
    c.dtype = tq.dtype;
    c.n = tq.shape[0];
    c.H = tq.shape[1];
    c.d = tq.shape[2];
    c.Hkv = tk.shape[1];
    auto load = [&](const char* name) { return read_tensor_f32(dir, m.input(name)); };
    c.q = load("q");
    c.k = load("k");
    c.v = load("v");
    c.dq = load("decode_q");
    c.dk = load("decode_k");
    c.dv = load("decode_v");
    c.steps = m.input("decode_q").shape.at(0);
}

}  // namespace detail

}  // namespace vlsparse::golden
