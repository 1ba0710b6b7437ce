// sim/golden_cuda.cu -- the cuda backend of `vlsparse-sim golden verify --backend`: every golden case
// through the CUDA path (vlsparse/sim/golden_run.hpp has the command's description).
//
// The golden runners of the library (golden::run_<algorithm>_case) sequence each case once for every
// backend: the reference, the SIMD path and this one. Here each algorithm's ops type runs the arithmetic
// on the GPU -- the inputs of a call copied to the device, the CUDA front end called, its result copied
// back -- so every number a case checks comes from a CUDA kernel:
//   - ZipVL: cuda::ZipVLSelector (probes, a_j, a~_j, p, the kept lists ranked on the device), the
//     token-sparse or dense prefill, decode over the evicted cache (batched decode kernel);
//   - A-VL: the last row's head-mean scores and H2O's text scores (cuda::BaselineScorer), each decode
//     step over the schedule's rows with the kernel's probabilities for the refresh re-rank;
//   - baselines: H2O / SnapKV / FastV scores (BaselineScorer, SnapKV's pooling kernel), H2O's decode steps
//     with the kernel's probabilities;
//   - BlindSight: masked_prefill_attention per head template; Algorithm 1 by cuda::BlindSightCalibrator on
//     the CUDA-core prefill kernel (fp32 arithmetic: the golden NMSE bar is fp32's);
//   - PureKV: cuda::PureKVEstimator (window scores, ||V||, importance, kept lists, the layer's ST or
//     dense prefill); the validation's own-layer selection from a second estimator on the GPU.
// The host code every backend shares does the rest: KvCache eviction and append (the cache rows a case
// checks are copies of its inputs), the ranking of host scores where the golden runner does it, masks,
// FLOPs, Spearman. Prefill outputs of 16-bit inputs that the tensor cores computed (head dims 64 / 128)
// are held to the manifest's bar for that type (P rounded to 16 bits); everything else, decode included,
// to the fp32 bar.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "vlsparse/cuda/host_ops.cuh"
#include "vlsparse/reference/avl_golden.hpp"
#include "vlsparse/reference/baselines_golden.hpp"
#include "vlsparse/reference/blindsight_golden.hpp"
#include "vlsparse/reference/purekv_golden.hpp"
#include "vlsparse/reference/zipvl_golden.hpp"
#include "vlsparse/sim/golden_run.hpp"

namespace vlsparse::sim {
namespace {

constexpr const char* kFn = "golden verify --backend cuda";

// ---- precisions -------------------------------------------------------------------------------------

// The bar of each output: a prefill output that the tensor cores computed (16-bit inputs, head dim 64
// or 128: P rounded to the input type) is held to its type's tolerance, everything else -- the
// CUDA-core prefill of other inputs, decode, scores -- to fp32's.
std::string prefill_precision(const std::string& dtype, std::int64_t d) {
    return (dtype == "bf16" || dtype == "fp16") && (d == 64 || d == 128) ? dtype : "fp32";
}

// The fp32 bar for every output but `prefill_output`, which gets `prefill_prec`.
template <class Named>
std::vector<GoldenRunOutput> with_prefill_precision(std::vector<Named> a, const char* prefill_output,
                                                    const std::string& prefill_prec) {
    auto r = detail::with_precision(std::move(a), "fp32");
    for (auto& o : r)
        if (o.name == prefill_output) o.precision = prefill_prec;
    return r;
}

}  // namespace

std::vector<GoldenRunOutput> cuda_golden_case(const std::filesystem::path& dir, const GoldenManifest& m) {
    int devices = 0;
    ::vlsparse::require(cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0, kFn,
                                "no CUDA device is visible to this process");
    if (m.algorithm == "zipvl") {
        const auto c = golden::read_zipvl_inputs(dir);
        return with_prefill_precision(golden::run_zipvl_case<cuda::ZipVLOps>(c), "prefill_out", prefill_precision(c.dtype, c.d));
    }
    if (m.algorithm == "avl") {
        const auto c = golden::read_avl_inputs(dir);
        return detail::with_precision(golden::run_avl_case<cuda::AvlOps>(c), "fp32");
    }
    if (m.algorithm == "baselines") {
        const auto c = golden::read_baselines_inputs(dir);
        return detail::with_precision(golden::run_baselines_case<cuda::BaselineOps>(c), "fp32");
    }
    if (m.algorithm == "blindsight") {
        const auto c = golden::read_blindsight_inputs(dir);
        return with_prefill_precision(golden::run_blindsight_case<cuda::BlindSightOps>(c), "masked_out", prefill_precision(c.dtype, c.d));
    }
    if (m.algorithm == "purekv") {
        const auto c = golden::read_purekv_inputs(dir);
        return with_prefill_precision(golden::run_purekv_case<cuda::PureKVHostEstimator>(c), "prefill_out",
                                      prefill_precision(c.dtype, c.shape.head_dim));
    }
    throw error(kFn, "algorithm '" + m.algorithm + "', expected zipvl, avl, baselines, blindsight or purekv");
}

}  // namespace vlsparse::sim
