// ODR check of the CUDA headers, translation unit B (see odr_a.cu).
#include <vlsparse/cuda/avl.cuh>
#include <vlsparse/cuda/baselines.cuh>
#include <vlsparse/cuda/blindsight.cuh>
#include <vlsparse/cuda/decode.cuh>
#include <vlsparse/cuda/h2o_decode.cuh>
#include <vlsparse/cuda/indexed_decode.cuh>
#include <vlsparse/cuda/kv_cache.cuh>
#include <vlsparse/cuda/prefill.cuh>
#include <vlsparse/cuda/purekv.cuh>
#include <vlsparse/cuda/zipvl.cuh>

int odr_b() { return 1; }
