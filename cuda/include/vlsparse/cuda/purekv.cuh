// vlsparse/cuda/purekv.cuh -- PureKV on the GPU (namespace vlsparse::cuda): the window scores of Eq. 2,
// the V norms, the importance of Eq. 3 / Eq. 4, window + top-h as device lists, and the layer's prefill
// attention (ST-SpAttn on video layouts), carried through one prefill by a device-resident estimator.
//
// Same Params (PureKVParams), same equations and tie rule as reference:: / simd::PureKVEstimator
// (vlsparse/policies/purekv_params.hpp), and the same checks of what reads no values, with the same
// messages (detail::check_purekv_*, vlsparse/policies/purekv_estimator.hpp):
//
//   cuda::PureKVEstimator est(params, layout, shape);       // owns its device workspace
//   for each layer l (q, k, v: device views [n, H, d] / [n, H_kv, d]):
//       if (est.needs_scores(l)) est.observe(l, q, k, stream);   // layers <= l0: window attention
//       est.attention(l, q, k, v, out, stream);                  // ST-masked from st_start_layer on (bf16 / fp16)
//       const cuda::DevicePureKVSelection& s = est.select(l, v, stream);  // no attention above l0 (Eq. 4)
//       kv_batch_compact(..., s.lists.rows(), ...);              // evict (vlsparse/cuda/kv_cache.cuh)
//
// The scores of every observed layer stay on the device ([G][n] fp32; l0's for the whole prefill); a
// layer above l0 reads only its V (one pass, the norms) and l0's scores. Nothing goes through the host
// but the list bounds (select() ends in one synchronization; observe() and attention() none).
// Differences from the CPU paths: scores, norms and importance in fp32 (the reference uses double), so
// the kept set can differ where the recomputed importance ties within that precision at the cut; NaN /
// Inf in the window rows of q, in k or in v is always an error (params.check_finite changes nothing
// here), and so is an fp32 overflow of a logit or of the importance.
// Include: this header, from a .cu translation unit (nvcc, C++20).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <limits>
#include <span>
#include <type_traits>
#include <vector>

#include "vlsparse/attention/common.hpp"
#include "vlsparse/core/layout.hpp"
#include "vlsparse/core/model_shape.hpp"
#include "vlsparse/core/tensor.hpp"
#include "vlsparse/cuda/common.cuh"
#include "vlsparse/cuda/prefill.cuh"
#include "vlsparse/cuda/selection/lists.cuh"
#include "vlsparse/cuda/selection/probe_columns.cuh"
#include "vlsparse/policies/purekv_estimator.hpp"
#include "vlsparse/policies/purekv_select.hpp"

namespace vlsparse::cuda {

namespace detail {

// A device [groups][n] fp32 array as the CPU paths' [groups][n] doubles (synchronizes the device).
inline std::vector<std::vector<double>> purekv_groups_to_host(const float* p, std::int64_t groups, std::int64_t n,
                                                              const char* fn) {
    std::vector<float> h(static_cast<std::size_t>(groups * n));
    if (!h.empty()) check_cuda(cudaMemcpy(h.data(), p, h.size() * sizeof(float), cudaMemcpyDeviceToHost), fn, "cudaMemcpy");
    std::vector<std::vector<double>> out(static_cast<std::size_t>(groups));
    for (std::int64_t g = 0; g < groups; ++g)
        out[static_cast<std::size_t>(g)].assign(h.begin() + static_cast<std::ptrdiff_t>(g * n),
                                                h.begin() + static_cast<std::ptrdiff_t>((g + 1) * n));
    return out;
}

}  // namespace detail

// Eq. 2 of one layer on the device.
struct DevicePureKVScores {
    std::int64_t layer = -1, n = 0, window = 0, heads_per_group = 0, groups = 0;
    const float* s = nullptr;  // device [groups][n]: s_j for j < n - w, 0 on the window

    // A host copy in the CPU paths' form (synchronizes the device).
    PureKVScores to_host() const {
        PureKVScores r;
        r.layer = layer;
        r.n = n;
        r.window = window;
        r.heads_per_group = heads_per_group;
        r.s = detail::purekv_groups_to_host(s, groups, n, "cuda::DevicePureKVScores::to_host");
        return r;
    }
};

// What PureKV keeps in one layer, on the device.
struct DevicePureKVSelection {
    std::int64_t n = 0, layer = 0, source_layer = -1, window = 0, top_h = 0, groups = 0;
    bool dense = false;              // a lower layer with lower_layers == dense: every position, no scores
    const float* v_norm = nullptr;   // device [groups][n]: ||V_{j,g}|| (kv_head) or mean_g ||V_{j,g}|| (layer)
    const float* importance = nullptr;  // device [groups][n]: I_j = s_j ||V_j|| (0 on the window)
    DeviceSelection lists;           // window + top-h per group (device CSR; lists.rows() for decode / compaction)

    double kept_ratio() const { return lists.kept_ratio(); }

    // A host copy in the CPU paths' form (synchronizes the device).
    PureKVSelection to_host() const {
        constexpr const char* fn = "cuda::DevicePureKVSelection::to_host";
        PureKVSelection r;
        r.n = n;
        r.layer = layer;
        r.source_layer = source_layer;
        r.dense = dense;
        r.window = window;
        r.top_h = top_h;
        r.selection = lists.to_host();
        if (dense) return r;
        r.v_norm = detail::purekv_groups_to_host(v_norm, groups, n, fn);
        r.importance = detail::purekv_groups_to_host(importance, groups, n, fn);
        r.selection.scores = r.importance;
        return r;
    }
};

namespace detail {

inline constexpr int kVNonFinite = 8;  // status bit: NaN / Inf in v

// One warp per position j: ||V_{j,g}|| for every KV head (fp32 sum of squares), then the group's norm
// (its own, or the mean over KV heads for one group) and I_j = s_j * norm (0 on the window).
template <class TV>
__global__ void purekv_importance_kernel(const TV* v, std::int64_t s0, std::int64_t s1, std::int64_t s2, int n, int Hkv,
                                         int d, int G, int m, const float* s, float* vnorm, float* imp, int* status) {
    dependent_entry();  // programmatic dependent launch: see common.cuh
    const int lane = threadIdx.x & 31;
    const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * (blockDim.x >> 5);
    bool bad = false;
    for (std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5); j < n; j += warps) {
        float mean = 0.0f;
        for (int g = 0; g < Hkv; ++g) {
            const TV* row = v + j * s0 + g * s1;
            float ss = 0.0f;
            for (int c = lane; c < d; c += 32) {
                const float x = load_f(row + c * s2);
                bad |= !isfinite(x);
                ss = fmaf(x, x, ss);
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
            const float norm = sqrtf(ss);
            if (G == 1) {
                mean += norm / static_cast<float>(Hkv);
            } else if (lane == 0) {
                const std::int64_t at = static_cast<std::int64_t>(g) * n + j;
                vnorm[at] = norm;
                imp[at] = j < m ? s[at] * norm : 0.0f;
            }
        }
        if (G == 1 && lane == 0) {
            vnorm[j] = mean;
            imp[j] = j < m ? s[j] * mean : 0.0f;
        }
    }
    // (The position loop is warp-uniform: every lane of a warp is here together.)
    if (__any_sync(0xffffffffu, bad) && lane == 0) atomicOr(status, kVNonFinite);
}

// Sum of squares of the 16 bytes `r` read as elements of TV (8 bf16 / fp16, 4 fp32), in element order;
// `bad` set when one is NaN or Inf.
template <class TV>
__device__ __forceinline__ float sum_squares16(const uint4& r, bool& bad) {
    const unsigned w[4] = {r.x, r.y, r.z, r.w};
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        if constexpr (std::is_same_v<TV, float>) {
            const float x = __uint_as_float(w[i]);
            bad |= !isfinite(x);
            ss = fmaf(x, x, ss);
        } else {
            float lo, hi;
            if constexpr (std::is_same_v<TV, bfloat16>) {
                lo = __uint_as_float(w[i] << 16);
                hi = __uint_as_float(w[i] & 0xffff0000u);
            } else {
                lo = __half2float(__ushort_as_half(static_cast<unsigned short>(w[i] & 0xffffu)));
                hi = __half2float(__ushort_as_half(static_cast<unsigned short>(w[i] >> 16)));
            }
            bad |= !isfinite(lo) || !isfinite(hi);
            ss = fmaf(lo, lo, ss);
            ss = fmaf(hi, hi, ss);
        }
    }
    return ss;
}

// purekv_importance_kernel for rows whose elements are contiguous and 16-byte aligned, with a head row
// of LPH x 16 bytes (bf16 / fp16 d = 64 / 128 / 256, fp32 d = 32 / 64 / 128): each lane reads 16 bytes,
// a warp 32 / LPH heads of a position per load, and it keeps the loads of kPos positions in flight
// before it reduces any (the one-warp-per-position kernel waited on each head in turn).
inline constexpr int kImportancePos = 4;
template <class TV, int LPH>
__global__ void purekv_importance_vec_kernel(const TV* v, std::int64_t s0, std::int64_t s1, int n, int Hkv, int G,
                                             int m, const float* s, float* vnorm, float* imp, int* status) {
    dependent_entry();  // programmatic dependent launch: see common.cuh
    constexpr int HPL = 32 / LPH, P = kImportancePos;
    const int lane = threadIdx.x & 31, sub = lane / LPH, part = lane % LPH;
    const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * (blockDim.x >> 5);
    bool bad = false;
    for (std::int64_t j0 = (static_cast<std::int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5)) * P; j0 < n;
         j0 += warps * P) {
        float mean[P];
#pragma unroll
        for (int p = 0; p < P; ++p) mean[p] = 0.0f;
        for (int h0 = 0; h0 < Hkv; h0 += HPL) {
            const int g = h0 + sub;
            uint4 raw[P];
#pragma unroll
            for (int p = 0; p < P; ++p) {
                raw[p] = make_uint4(0u, 0u, 0u, 0u);
                if (j0 + p < n && g < Hkv) raw[p] = __ldg(reinterpret_cast<const uint4*>(v + (j0 + p) * s0 + g * s1) + part);
            }
#pragma unroll
            for (int p = 0; p < P; ++p) {
                float ss = sum_squares16<TV>(raw[p], bad);
#pragma unroll
                for (int o = LPH / 2; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
                const float norm = sqrtf(ss);
                const std::int64_t j = j0 + p;
                if (G == 1) {
                    // The heads of this load in order, as the one-warp kernel adds them: lane 0 takes
                    // each sub-group's norm in turn.
#pragma unroll
                    for (int t = 0; t < HPL; ++t) {
                        const float nt = __shfl_sync(0xffffffffu, norm, t * LPH);
                        if (h0 + t < Hkv) mean[p] += nt / static_cast<float>(Hkv);
                    }
                } else if (part == 0 && j < n && g < Hkv) {
                    const std::int64_t at = static_cast<std::int64_t>(g) * n + j;
                    vnorm[at] = norm;
                    imp[at] = j < m ? s[at] * norm : 0.0f;
                }
            }
        }
        if (G == 1 && lane == 0)
#pragma unroll
            for (int p = 0; p < P; ++p)
                if (j0 + p < n) {
                    const std::int64_t j = j0 + p;
                    vnorm[j] = mean[p];
                    imp[j] = j < m ? s[j] * mean[p] : 0.0f;
                }
    }
    if (__any_sync(0xffffffffu, bad) && lane == 0) atomicOr(status, kVNonFinite);
}

// Launches the importance kernel for v: the vectorized one where v's rows allow it, else one warp per
// position.
template <class TV>
void launch_purekv_importance(View3<const TV> v, int n, int Hkv, int d, int G, int m, const float* s, float* vnorm,
                              float* imp, int* status, cudaStream_t stream, const char* fn) {
    using T = std::remove_const_t<TV>;
    constexpr int E = static_cast<int>(16 / sizeof(T));
    const int lph = d % E == 0 ? d / E : 0;
    const bool vec = v.stride[2] == 1 && (lph == 8 || lph == 16 || lph == 32) && v.stride[0] % E == 0 &&
                     v.stride[1] % E == 0 && (reinterpret_cast<std::uintptr_t>(v.data) & 15u) == 0;
    if (vec) {
        const std::int64_t warps_needed = (n + kImportancePos - 1) / kImportancePos;
        const auto blocks = static_cast<unsigned>(std::clamp<std::int64_t>((warps_needed + 7) / 8, 1, 8192));
        const T* p = v.data;
        auto* k = lph == 8 ? purekv_importance_vec_kernel<T, 8>
                           : lph == 16 ? purekv_importance_vec_kernel<T, 16> : purekv_importance_vec_kernel<T, 32>;
        launch_dependent(k, blocks, 256, 0, stream, fn, "purekv_importance_vec_kernel", p, v.stride[0], v.stride[1], n,
                         Hkv, G, m, s, vnorm, imp, status);
        return;
    }
    const auto blocks = static_cast<unsigned>(std::clamp<std::int64_t>((static_cast<std::int64_t>(n) + 7) / 8, 1, 8192));
    launch_dependent(purekv_importance_kernel<T>, blocks, 256, 0, stream, fn, "purekv_importance_kernel", v.data,
                     v.stride[0], v.stride[1], v.stride[2], n, Hkv, d, G, m, s, vnorm, imp, status);
}

}  // namespace detail

// The cross-layer estimator of one prefill, on the device (see the header comment). Not thread-safe:
// one estimator per stream. Results stay valid until the next call of the same kind.
class PureKVEstimator {
public:
    // Checks what does not depend on a layer's tensors with the CPU estimator's own check
    // (detail::check_purekv_estimator, same messages), then the limits of this path's kernels.
    PureKVEstimator(const PureKVParams& P, const Layout& layout, const ModelShape& shape)
        : P_(P), layout_(layout), shape_(shape) {
        constexpr const char* fn = "cuda::PureKVEstimator";
        ::vlsparse::detail::check_purekv_estimator(P, layout, shape, fn);
        detail::require(layout.n() <= std::numeric_limits<std::int32_t>::max() / 2, fn, "n = ", layout.n(),
                        " tokens, expected < 2^30");
        detail::require(shape.head_dim <= 256, fn, "head_dim = ", shape.head_dim, ", expected <= 256");
        G_ = P.grouping == PureKVGrouping::kv_head ? shape.kv_heads : 1;
        slots_.resize(static_cast<std::size_t>(P.l0 + 1));
        if (P.st.kind != VideoMask::none && purekv_masked_layer(layout, P.st_start_layer, P)) {
            const MaskContext ctx = make_video_mask_context(layout, P.st);
            const std::vector<MaskTemplate> heads(static_cast<std::size_t>(shape.heads), MaskTemplate::dense);
            plan_.plan(ctx, heads, shape.kv_heads);
        }
    }
    PureKVEstimator(const PureKVEstimator&) = delete;
    PureKVEstimator& operator=(const PureKVEstimator&) = delete;

    const PureKVParams& params() const { return P_; }
    std::int64_t n() const { return layout_.n(); }
    std::int64_t groups() const { return G_; }

    bool needs_scores(std::int64_t layer) const {
        check_layer(layer, "cuda::PureKVEstimator::needs_scores");
        return ::vlsparse::detail::purekv_needs_scores(layer, P_);
    }

    // Eq. 2 of layer `layer` (a layer that needs_scores), kept on the device. q [n, H, d], k [n, H_kv, d]
    // device views; only q's last w rows are read. Enqueued on `stream`; input errors are reported by the
    // select() that uses the scores (its one synchronization).
    template <ElementType TQ, ElementType TK>
    const DevicePureKVScores& observe(std::int64_t layer, View3<const TQ> q, View3<const TK> k, cudaStream_t stream = 0) {
        constexpr const char* fn = "cuda::PureKVEstimator::observe";
        ::vlsparse::detail::check_purekv_observe(layer, P_, shape_, fn);
        check_shape(q, k, fn);
        return observe_impl(layer, q, k, {}, stream, fn);
    }

    // The same with each row's log-sum-exp of the layer's dense causal attention given: row_lse [n, H]
    // (fp32, device, natural log, for the same scale: what cuda::dense_prefill_attention writes with its
    // lse argument, or FlashAttention's softmax_lse -- not the statistics of an ST-masked prefill, which
    // sees fewer keys). Only the window's rows are read; the window rows' pass over every key for their
    // statistics is skipped. A NaN / Inf among them is reported by select() as an error naming row_lse.
    template <ElementType TQ, ElementType TK>
    const DevicePureKVScores& observe(std::int64_t layer, View3<const TQ> q, View3<const TK> k, View2<const float> row_lse,
                                      cudaStream_t stream = 0) {
        constexpr const char* fn = "cuda::PureKVEstimator::observe";
        ::vlsparse::detail::check_purekv_observe(layer, P_, shape_, fn);
        check_shape(q, k, fn);
        return observe_impl(layer, q, k, detail::checked_row_lse(row_lse, q.shape[0], q.shape[1], fn), stream, fn);
    }

    bool observed(std::int64_t layer) const {
        check_layer(layer, "cuda::PureKVEstimator::observed");
        return layer <= P_.l0 && slots_[static_cast<std::size_t>(layer)].observed;
    }

    // The scores select(layer) uses: the layer's own up to l0, l0's above.
    const DevicePureKVScores& scores(std::int64_t layer) const { return slot_for(layer, "cuda::PureKVEstimator::scores").scores; }

    // Eq. 3 / Eq. 4 and the kept set of layer `layer`; v [n, H_kv, d] of this layer (device view). One
    // synchronization; errors of the observe() whose scores it uses are reported here.
    template <ElementType TV>
    const DevicePureKVSelection& select(std::int64_t layer, View3<const TV> v, cudaStream_t stream = 0) {
        constexpr const char* fn = "cuda::PureKVEstimator::select";
        check_layer(layer, fn);
        detail::require(v.data != nullptr, fn, "v is a null view");
        ::vlsparse::detail::check_purekv_v(v, n(), shape_, fn);
        const std::int64_t n = this->n(), w = P_.window, m = n - w;
        DevicePureKVSelection& r = sel_;
        r = DevicePureKVSelection{};
        r.n = n;
        r.layer = layer;
        if (layer < P_.l0 && P_.lower_layers == PureKVLowerLayers::dense) {
            r.dense = true;
            lists_.begin(1, n, 0, n, {}, stream, fn);
            r.lists = lists_.finish(stream, fn);
            return r;
        }
        const Slot& sl = slot_for(layer, fn);
        const std::int64_t h = purekv_top_h(n, P_);
        r.source_layer = sl.scores.layer;
        r.window = w;
        r.top_h = h;
        r.groups = G_;
        const std::size_t b = detail::align256(static_cast<std::size_t>(G_ * n) * 4);
        char* base = static_cast<char*>(work_.get(2 * b + 256, fn));
        auto* vn = reinterpret_cast<float*>(base);
        auto* imp = reinterpret_cast<float*>(base + b);
        auto* status = reinterpret_cast<int*>(base + 2 * b);
        detail::check_cuda(cudaMemcpyAsync(status, sl.status.data(), sizeof(int), cudaMemcpyDeviceToDevice, stream), fn,
                           "cudaMemcpyAsync");
        detail::launch_purekv_importance(v, static_cast<int>(n), static_cast<int>(shape_.kv_heads),
                                         static_cast<int>(shape_.head_dim), static_cast<int>(G_), static_cast<int>(m),
                                         sl.s.data(), vn, imp, status, stream, fn);
        lists_.begin(G_, n, m, n, {}, stream, fn);
        for (std::int64_t g = 0; g < G_; ++g) lists_.rank(g, 0, m, h);
        lists_.run_tasks(imp, n, {}, stream, fn);
        r.lists = lists_.finish(stream, fn, status);
        const int st = lists_.extra_status();
        detail::require((st & detail::kInputNonFinite) == 0, fn, "q or k of layer ", sl.scores.layer,
                        " holds NaN or Inf (in k, or in a window row of q)");
        detail::require((st & detail::kRowLseBad) == 0, fn, "row_lse of layer ", sl.scores.layer,
                        " holds NaN or Inf (in a window row)");
        detail::require((st & detail::kVNonFinite) == 0, fn, "v holds NaN or Inf");
        detail::require((lists_.status() & detail::kScoreBad) == 0, fn,
                        "an importance score is not finite: an fp32 overflow of a logit or of s_j * ||V_j||");
        r.v_norm = vn;
        r.importance = imp;
        r.lists.scores = imp;
        r.lists.score_groups = G_;
        r.lists.score_len = n;
        return r;
    }

private:
    template <ElementType TQ, ElementType TK>
    const DevicePureKVScores& observe_impl(std::int64_t layer, View3<const TQ> q, View3<const TK> k, detail::ProbeRowLse row_lse,
                                           cudaStream_t stream, const char* fn) {  // (checked by the caller)
        const std::int64_t n = this->n(), w = P_.window, m = n - w, Hkv = shape_.kv_heads;
        std::vector<std::int64_t> rows(static_cast<std::size_t>(w));
        std::iota(rows.begin(), rows.end(), m);
        const double scale = ::vlsparse::detail::resolve_scale(P_.attention(), shape_.head_dim, fn);
        const detail::ProbeColumnsResult pc = probe_.run(q, k, std::span<const std::int64_t>(rows), scale, stream, fn, row_lse);
        Slot& sl = slots_[static_cast<std::size_t>(layer)];
        if (sl.s.size() != static_cast<std::size_t>(G_ * n)) sl.s = DeviceArray<float>(static_cast<std::size_t>(G_ * n));
        // The probe status is sticky for the layer: copied next to the scores.
        if (sl.status.size() != 1) sl.status = DeviceArray<int>(1);
        // s[g][j]: the window's column sums for j < m, 0 on the window.
        detail::launch_dependent(detail::group_column_sums_kernel<>, grid_for(G_ * n), 256, 0, stream, fn,
                                 "group_column_sums_kernel", pc.col, pc.rsplit, static_cast<int>(Hkv),
                                 static_cast<int>(n), static_cast<int>(G_), static_cast<int>(m), static_cast<int>(n),
                                 sl.s.data());
        detail::check_cuda(cudaMemcpyAsync(sl.status.data(), pc.status, sizeof(int), cudaMemcpyDeviceToDevice, stream), fn,
                           "cudaMemcpyAsync");
        sl.scores = DevicePureKVScores{layer, n, w, shape_.heads / G_, G_, sl.s.data()};
        sl.observed = true;
        return sl.scores;
    }

public:
    // True when layer `layer`'s prefill uses the ST-SpAttn mask.
    bool masked(std::int64_t layer) const {
        check_layer(layer, "cuda::PureKVEstimator::masked");
        return purekv_masked_layer(layout_, layer, P_);
    }

    // The layer's prefill attention on the tensor cores: ST-SpAttn from st_start_layer on (video layouts),
    // dense causal otherwise. bf16 / fp16 q, k, v [n, H(_kv), d] with d 64 or 128, out [n, H, d].
    template <ElementType T, OutputElement TO>
        requires ElementType<TO>
    void attention(std::int64_t layer, View3<const T> q, View3<const T> k, View3<const T> v, View3<TO> out,
                   cudaStream_t stream = 0, const PrefillOptions& opt = {}) const {
        constexpr const char* fn = "cuda::PureKVEstimator::attention";
        check_layer(layer, fn);
        check_shape(q, k, fn);
        PrefillOptions o = opt;
        if (o.scale == 0.0f) o.scale = P_.scale;
        if (masked(layer)) masked_prefill_attention(plan_, q, k, v, out, o, stream);
        else dense_prefill_attention(q, k, v, out, o, stream);
    }

    // Tests: every byte of the workspace set to `byte` (the stored scores are left alone). Synchronizes.
    void fill_workspace(int byte) {
        work_.fill(byte, "cuda::PureKVEstimator::fill_workspace");
        probe_.fill(byte, "cuda::PureKVEstimator::fill_workspace");
        lists_.fill(byte, "cuda::PureKVEstimator::fill_workspace");
    }

private:
    struct Slot {
        DeviceArray<float> s;
        DeviceArray<int> status;
        DevicePureKVScores scores;
        bool observed = false;
    };

    static unsigned grid_for(std::int64_t total) {
        return static_cast<unsigned>(std::clamp<std::int64_t>((total + 255) / 256, 1, 4096));
    }
    // The checks that read no values are the CPU estimator's (policies/purekv_estimator.hpp), so a bad
    // argument gets the same message on every backend; device views are also checked for null.
    void check_layer(std::int64_t layer, const char* fn) const {
        ::vlsparse::detail::check_purekv_layer(layer, shape_, fn);
    }
    const Slot& slot_for(std::int64_t layer, const char* fn) const {
        const std::int64_t src = ::vlsparse::detail::purekv_score_source(
            layer, P_, shape_, [this](std::int64_t l) { return slots_[static_cast<std::size_t>(l)].observed; }, fn);
        return slots_[static_cast<std::size_t>(src)];
    }
    template <class TQ, class TK>
    void check_shape(const View3<const TQ>& q, const View3<const TK>& k, const char* fn) const {
        detail::require(q.data != nullptr && k.data != nullptr, fn, "q or k is a null view");
        ::vlsparse::detail::check_purekv_qk(q, k, n(), shape_, fn);
    }

    PureKVParams P_;
    Layout layout_;
    ModelShape shape_;
    std::int64_t G_ = 1;
    std::vector<Slot> slots_;  // [l0 + 1]
    MaskedPrefillPlan plan_;
    detail::ProbeColumns probe_;
    detail::GrowBuffer work_;
    detail::ListBuilder lists_;
    DevicePureKVSelection sel_;
};

}  // namespace vlsparse::cuda
