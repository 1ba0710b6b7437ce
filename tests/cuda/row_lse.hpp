// Each query row's log-sum-exp of its causal attention, in double on the host: the rows' statistics a
// prefill hands to the selections that take them (AvlSelector::select and
// BaselineScorer::h2o_device_select with row_lse). For the CUDA tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <vlsparse/core/dtype.hpp>
#include <vlsparse/core/tensor.hpp>

namespace vt {

// lse [m][H] (row-major), natural log of sum_{j <= i} exp(scale q_{i,h} . k_{j,g}), scale = 1 / sqrt(d),
// rounded to fp32. q [m, H, d], k [m, H_kv, d] host views. Rows before `first` are NaN (for callers that
// read only the last rows -- FastV's, SnapKV's window: a NaN read would be reported).
template <class T>
std::vector<float> row_lse_of(const vlsparse::View3<const T>& q, const vlsparse::View3<const T>& k, std::int64_t first = 0) {
    const std::int64_t m = q.shape[0], H = q.shape[1], d = q.shape[2], Hkv = k.shape[1];
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    std::vector<float> out(static_cast<std::size_t>(m * H), std::nanf(""));
    std::vector<double> s(static_cast<std::size_t>(m));
    for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t i = std::max<std::int64_t>(first, 0); i < m; ++i) {
            double mx = -INFINITY;
            for (std::int64_t j = 0; j <= i; ++j) {
                double dot = 0.0;
                for (std::int64_t c = 0; c < d; ++c)
                    dot += static_cast<double>(vlsparse::to_float(q.row(i, h)[c * q.stride[2]])) *
                           static_cast<double>(vlsparse::to_float(k.row(j, h / (H / Hkv))[c * k.stride[2]]));
                s[static_cast<std::size_t>(j)] = scale * dot;
                mx = std::max(mx, s[static_cast<std::size_t>(j)]);
            }
            double l = 0.0;
            for (std::int64_t j = 0; j <= i; ++j) l += std::exp(s[static_cast<std::size_t>(j)] - mx);
            out[static_cast<std::size_t>(i * H + h)] = static_cast<float>(mx + std::log(l));
        }
    return out;
}

}  // namespace vt
