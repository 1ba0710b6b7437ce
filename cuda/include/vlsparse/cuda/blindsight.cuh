// vlsparse/cuda/blindsight.cuh -- BlindSight's calibration (Algorithm 1) on the GPU (namespace
// vlsparse::cuda): for every head of a layer, the NMSE of each candidate template's attention output
// against the dense output, and the template Algorithm 1 chooses (choose_template: the first of Sink,
// Document, Document-Sink with NMSE < alpha, else Dense), as simd::characterize_prompt and
// reference::characterize_prompt compute them on the CPU.
//
//   cuda::BlindSightCalibrator cal(layout, P, H, H_kv);     // once per prompt layout: the four mask plans
//   std::vector<HeadCharacterization> r = cal.characterize(q, k, v, stream);   // per layer
//
// q [n, H, d], k, v [n, H_kv, d]: device views, as the prefill front ends take them (vlsparse/cuda/
// prefill.cuh: bf16 / fp16 with head dim 64 or 128 on the tensor cores, fp32 and other head dims up to
// 256 on the CUDA-core kernel). Per layer: the Dense template's output (causal; bidirectional images as
// P.mask says) and each candidate's, written into fp32 device buffers, and one reduction kernel per
// template that sums (o_t - o_dense)^2 and o_dense^2 per head in double; one synchronization at the end.
// The NMSE is a statistic of two attention outputs: on the tensor cores each output carries the rounding
// of P to the input type (a relative error of about 2^-9 for bf16), which moves an NMSE by about
// 2 sqrt(NMSE) 2^-9 plus a floor near 1e-6; PrefillOptions::kernel = simt computes both outputs in fp32
// (tests/cuda/blindsight_cuda_test.cu measures both against the reference). A head whose dense output
// is zero gets NMSE 0 (no error) or infinity, as on the CPU.
// Include: this header, from a .cu translation unit (nvcc, C++20).
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <vector>

#include "vlsparse/core/layout.hpp"
#include "vlsparse/core/tensor.hpp"
#include "vlsparse/cuda/common.cuh"
#include "vlsparse/cuda/prefill.cuh"
#include "vlsparse/masks/templates.hpp"
#include "vlsparse/policies/blindsight_select.hpp"

namespace vlsparse::cuda {

namespace detail {

// sums[h][0] += sum (a - b)^2, sums[h][1] += sum b^2 over rows and columns of head h; a, b [n, H, d]
// contiguous fp32. Grid (blocks over n * d, H).
template <int Unused = 0>
__global__ void head_nmse_sums_kernel(const float* a, const float* b, std::int64_t n, int H, int d, double* sums) {
    const int h = blockIdx.y;
    const std::int64_t total = n * d;
    double num = 0.0, den = 0.0;
    for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
         i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
        const std::int64_t r = i / d, c = i - r * d;
        const std::int64_t idx = (r * H + h) * d + c;
        const double x = a[idx], y = b[idx];
        num += (x - y) * (x - y);
        den += y * y;
    }
    __shared__ double s_num[32], s_den[32];
    for (int o = 16; o > 0; o >>= 1) {
        num += __shfl_xor_sync(0xffffffffu, num, o);
        den += __shfl_xor_sync(0xffffffffu, den, o);
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) {
        s_num[warp] = num;
        s_den[warp] = den;
    }
    __syncthreads();
    if (warp == 0) {
        const int warps = static_cast<int>(blockDim.x >> 5);
        num = lane < warps ? s_num[lane] : 0.0;
        den = lane < warps ? s_den[lane] : 0.0;
        for (int o = 16; o > 0; o >>= 1) {
            num += __shfl_xor_sync(0xffffffffu, num, o);
            den += __shfl_xor_sync(0xffffffffu, den, o);
        }
        if (lane == 0) {
            atomicAdd(sums + 2 * h, num);
            atomicAdd(sums + 2 * h + 1, den);
        }
    }
}

}  // namespace detail

class BlindSightCalibrator {
public:
    // The mask plans of the Dense template and of the three candidates for this layout (P.mask: sinks,
    // bidirectional images) and a model of H query heads over H_kv KV heads.
    BlindSightCalibrator(const Layout& layout, const BlindSightParams& P, std::int64_t n_heads, std::int64_t n_kv_heads)
        : P_(P), n_(layout.n()), H_(n_heads) {
        constexpr const char* fn = "cuda::BlindSightCalibrator";
        check_blindsight_params(P, fn);
        ::vlsparse::detail::require(n_heads >= 1 && n_kv_heads >= 1 && n_heads % n_kv_heads == 0, fn, "H = ", n_heads,
                                    " query heads over H_kv = ", n_kv_heads, ", expected H a positive multiple of H_kv");
        const MaskContext ctx = make_mask_context(layout, P.mask);
        for (int t = 0; t < 4; ++t)
            plans_[t].plan(ctx, std::vector<MaskTemplate>(static_cast<std::size_t>(n_heads), static_cast<MaskTemplate>(t)),
                           n_kv_heads);
    }
    BlindSightCalibrator(const BlindSightCalibrator&) = delete;
    BlindSightCalibrator& operator=(const BlindSightCalibrator&) = delete;

    std::int64_t n() const { return n_; }
    const BlindSightParams& params() const { return P_; }
    // The plan of one template (e.g. for the prefill once the heads are calibrated).
    const MaskedPrefillPlan& plan(MaskTemplate t) const { return plans_[static_cast<int>(t)]; }

    // Algorithm 1 for every head of one layer. opt.scale 0 takes P.scale (0: 1/sqrt(d)); opt.kernel picks
    // the prefill kernel (PrefillKernel::simt: fp32 arithmetic for both outputs). One synchronization.
    template <ElementType T>
    std::vector<HeadCharacterization> characterize(View3<const T> q, View3<const T> k, View3<const T> v,
                                                   PrefillOptions opt = {}, cudaStream_t stream = nullptr) {
        constexpr const char* fn = "cuda::BlindSightCalibrator::characterize";
        ::vlsparse::detail::require(q.shape[0] == n_ && q.shape[1] == H_, fn, "q has shape [", q.shape[0], ", ", q.shape[1],
                                    ", ", q.shape[2], "], the calibrator was made for n = ", n_, " tokens and H = ", H_);
        const std::int64_t d = q.shape[2];
        if (opt.scale == 0.0f) opt.scale = P_.scale;
        const bool check_finite = opt.check_finite && P_.check_finite;
        const std::size_t count = static_cast<std::size_t>(n_ * H_ * d);
        if (ref_.size() != count) {
            ref_ = DeviceArray<float>(count);
            out_ = DeviceArray<float>(count);
        }
        if (sums_.size() != static_cast<std::size_t>(8 * H_)) sums_ = DeviceArray<double>(static_cast<std::size_t>(8 * H_));
        detail::check_cuda(cudaMemsetAsync(sums_.data(), 0, sums_.size() * sizeof(double), stream), fn, "cudaMemsetAsync");
        // The reference output is checked for non-finite values (it reads every allowed pair of the other
        // templates too); the candidates' outputs are not.
        PrefillOptions o_ref = opt;
        o_ref.check_finite = check_finite;
        masked_prefill_attention(plans_[0], q, k, v, View3<float>(ref_.data(), {n_, H_, d}), o_ref, stream);
        PrefillOptions o_cand = opt;
        o_cand.check_finite = false;
        const unsigned bx = static_cast<unsigned>(std::min<std::int64_t>((n_ * d + 255) / 256, 1024));
        for (MaskTemplate t : kCandidateTemplates) {
            const int ti = static_cast<int>(t);
            masked_prefill_attention(plans_[ti], q, k, v, View3<float>(out_.data(), {n_, H_, d}), o_cand, stream);
            detail::head_nmse_sums_kernel<><<<dim3(bx, static_cast<unsigned>(H_)), 256, 0, stream>>>(
                out_.data(), ref_.data(), n_, static_cast<int>(H_), static_cast<int>(d), sums_.data() + 2 * ti * H_);
            detail::check_launch(fn, "head_nmse_sums_kernel");
        }
        std::vector<double> sums(sums_.size());
        detail::check_cuda(cudaMemcpyAsync(sums.data(), sums_.data(), sums.size() * sizeof(double), cudaMemcpyDeviceToHost, stream),
                           fn, "cudaMemcpyAsync");
        detail::check_cuda(cudaStreamSynchronize(stream), fn, "cudaStreamSynchronize");
        std::vector<HeadCharacterization> r(static_cast<std::size_t>(H_));
        for (MaskTemplate t : kCandidateTemplates) {
            const auto ti = static_cast<std::size_t>(t);
            for (std::int64_t h = 0; h < H_; ++h) {
                const double num = sums[2 * (ti * static_cast<std::size_t>(H_) + static_cast<std::size_t>(h))];
                const double den = sums[2 * (ti * static_cast<std::size_t>(H_) + static_cast<std::size_t>(h)) + 1];
                r[static_cast<std::size_t>(h)].nmse[ti] = den == 0.0 ? (num == 0.0 ? 0.0 : INFINITY) : num / den;
            }
        }
        for (auto& c : r) c.chosen = choose_template(c.nmse, P_.alpha);
        return r;
    }

private:
    BlindSightParams P_;
    std::int64_t n_ = 0, H_ = 0;
    MaskedPrefillPlan plans_[4];
    DeviceArray<float> ref_, out_;
    DeviceArray<double> sums_;
};

}  // namespace vlsparse::cuda
