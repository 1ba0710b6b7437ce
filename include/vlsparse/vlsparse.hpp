// vlsparse/vlsparse.hpp -- umbrella header: the whole CPU library (vocabulary, SIMD path, policies).
//
// Needs Eigen 3.4 and xsimd 8.1 on the include path; C++20. Optional: compile with -fopenmp to
// parallelise the SIMD path over heads and query blocks (the headers honour _OPENMP, never force it).
// The exact scalar reference lives in <vlsparse/reference/...>; golden-file I/O (needs nlohmann/json)
// in <vlsparse/io/golden.hpp>.
#pragma once

#include "vlsparse/core/config.hpp"
#include "vlsparse/core/dtype.hpp"
#include "vlsparse/core/error.hpp"
#include "vlsparse/core/layout.hpp"
#include "vlsparse/core/model_shape.hpp"
#include "vlsparse/core/rng.hpp"
#include "vlsparse/core/selection.hpp"
#include "vlsparse/core/tensor.hpp"
#include "vlsparse/core/topk.hpp"
#include "vlsparse/kv/kv_cache.hpp"
#include "vlsparse/io/npy.hpp"
#include "vlsparse/attention/common.hpp"
#include "vlsparse/attention/dense.hpp"
#include "vlsparse/attention/probe.hpp"
#include "vlsparse/attention/sparse.hpp"
#include "vlsparse/attention/decode.hpp"
#include "vlsparse/policies/zipvl.hpp"
#include "vlsparse/masks/templates.hpp"
#include "vlsparse/masks/block_mask.hpp"
#include "vlsparse/masks/flops.hpp"
#include "vlsparse/masks/render.hpp"
#include "vlsparse/attention/masked.hpp"
#include "vlsparse/policies/blindsight.hpp"
#include "vlsparse/attention/cache_rows.hpp"
#include "vlsparse/attention/indexed_decode.hpp"
#include "vlsparse/kv/kv_batch.hpp"
#include "vlsparse/attention/batched_decode.hpp"
#include "vlsparse/policies/avl_params.hpp"
#include "vlsparse/policies/avl.hpp"
#include "vlsparse/policies/baselines_params.hpp"
#include "vlsparse/policies/baselines.hpp"
#include "vlsparse/policies/policy.hpp"
#include "vlsparse/core/rank_correlation.hpp"
#include "vlsparse/policies/purekv_params.hpp"
#include "vlsparse/policies/purekv.hpp"
#include "vlsparse/policies/purekv_policy.hpp"
