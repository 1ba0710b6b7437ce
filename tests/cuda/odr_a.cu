// ODR check of the CUDA headers, translation unit A: every public .cuh in two translation units of one
// program, linked (a kernel or function defined in a header without `inline` or a template fails here).
// Built with the CUDA targets (CI links it); it runs nothing on a GPU.
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

int odr_b();

int main() { return odr_b() == 1 ? 0 : 1; }
