// vlsparse/sim/golden_cpu.hpp -- the cpu backend of `vlsparse-sim golden verify --backend`: every
// golden case through the SIMD path (vlsparse/sim/golden_run.hpp has the command's description).
// Include: <vlsparse/sim/golden_cpu.hpp>
#pragma once

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "vlsparse/policies/avl.hpp"
#include "vlsparse/policies/baselines.hpp"
#include "vlsparse/policies/blindsight.hpp"
#include "vlsparse/policies/purekv.hpp"
#include "vlsparse/policies/zipvl.hpp"
#include "vlsparse/reference/avl_golden.hpp"
#include "vlsparse/reference/baselines_golden.hpp"
#include "vlsparse/reference/blindsight_golden.hpp"
#include "vlsparse/reference/purekv_golden.hpp"
#include "vlsparse/reference/zipvl_golden.hpp"
#include "vlsparse/sim/golden_run.hpp"

namespace vlsparse::sim {

// The SIMD path of every algorithm (fp32 arithmetic), through the same run_<algorithm>_case code as
// the golden generator and the tests.
inline std::vector<GoldenRunOutput> cpu_golden_case(const std::filesystem::path& dir, const GoldenManifest& m) {
    const std::string fp32 = "fp32";
    if (m.algorithm == "zipvl") return detail::with_precision(golden::run_zipvl_case<simd::ZipVLOps>(golden::read_zipvl_inputs(dir)), fp32);
    if (m.algorithm == "avl") return detail::with_precision(golden::run_avl_case<simd::AvlOps>(golden::read_avl_inputs(dir)), fp32);
    if (m.algorithm == "baselines")
        return detail::with_precision(golden::run_baselines_case<simd::BaselineOps>(golden::read_baselines_inputs(dir)), fp32);
    if (m.algorithm == "blindsight")
        return detail::with_precision(golden::run_blindsight_case<simd::BlindSightOps>(golden::read_blindsight_inputs(dir)), fp32);
    if (m.algorithm == "purekv")
        return detail::with_precision(golden::run_purekv_case<simd::PureKVEstimator>(golden::read_purekv_inputs(dir)), fp32);
    throw error("golden verify --backend cpu", "algorithm '" + m.algorithm + "', expected zipvl, avl, baselines, blindsight or purekv");
}

}  // namespace vlsparse::sim
