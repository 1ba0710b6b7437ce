// vlsparse/sim/backend.hpp -- the simulator engine's one seam to the arithmetic: attention (prefill,
// decode), the policies' scoring, and the KV cache, implemented by a CPU backend (sim/cpu_backend.hpp,
// the SIMD path on fp32) and a CUDA backend (sim/cuda_backend.cu, the CUDA kernels on bf16, built with
// -Dcuda=enabled). The engine (sim/engine.hpp) keeps everything else in one place for both: the
// layer loop, the policies' decisions and their checks, position bookkeeping, metrics.
//
// Per layer, for each run (the dense reference first):
//   set_rows(rows)                  the run's rows of the layer: q [m, H, d], k, v [m, H_kv, d] (host
//                                   fp32, position order); the backend may copy them (the CUDA backend
//                                   uploads once per distinct set of rows)
//   policy.prefill(in) with in.scoring = scoring()   (null: the SIMD path on the host views)
//   dense_prefill / sparse_prefill / masked_prefill  the layer's prefill attention into the backend's
//                                   output of the run; keep_as_reference() after the dense run's
//   prefill_error(seq, computed)    || out - ref ||^2 and || ref ||^2 over the outputs the run computed
//   cache->fill(seq, n), cache->keep(sel)
// Decode step: cache->append(k, v); decode(cache, q, read, want_attention, want_group_mass) -> out [H, d],
// optionally the head-mean probabilities per read list (for policies that read them) and the per-KV-group
// probability mass per position (the dense run's, for the mass metrics).
// Include: <vlsparse/sim/backend.hpp>
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "vlsparse/core/model_shape.hpp"
#include "vlsparse/core/selection.hpp"
#include "vlsparse/masks/block_mask.hpp"
#include "vlsparse/policies/scoring.hpp"
#include "vlsparse/sim/metrics.hpp"

namespace vlsparse::sim {

// One run's KV cache of one layer, held by a backend. Positions are absolute (0 .. seq_len - 1).
class SimCache {
public:
    virtual ~SimCache() = default;
    virtual std::int64_t n_kv_heads() const = 0;
    virtual std::int64_t seq_len() const = 0;
    virtual std::span<const std::int64_t> positions(std::int64_t g) const = 0;  // ascending
    virtual std::int64_t element_bytes() const = 0;                             // 4 (fp32) or 2 (bf16)
    // The K / V rows of the backend's current rows (set_rows) at positions `seq` (one per row,
    // ascending) of a prompt of n tokens; replaces the contents.
    virtual void fill(std::span<const std::int64_t> seq, std::int64_t n) = 0;
    // KvCache::keep's contract: listed positions (per KV head or shared) stay, the rest leave; every
    // listed position must be present; on error nothing changes.
    virtual void keep(const TokenSelection& sel) = 0;
    // One token's K, V [H_kv, d] (host fp32) at position seq_len().
    virtual void append(const float* k, const float* v) = 0;

    std::int64_t rows(std::int64_t g) const { return static_cast<std::int64_t>(positions(g).size()); }
    std::int64_t kv_bytes(std::int64_t head_dim) const {
        std::int64_t r = 0;
        for (std::int64_t g = 0; g < n_kv_heads(); ++g) r += rows(g);
        return r * head_dim * 2 * element_bytes();
    }
};

// The run's rows of one prefill layer (host fp32, position order).
struct SimRows {
    const float* q = nullptr;  // [m, H, d]
    const float* k = nullptr;  // [m, H_kv, d]
    const float* v = nullptr;  // [m, H_kv, d]
    std::int64_t m = 0;
    // >= 0: rows shared by several runs (the source's layer, every run that kept the whole sequence);
    // a backend that copies rows may reuse its copy while the id stays the same. -1: new rows.
    std::int64_t shared_id = -1;
};

// One decode step's results.
struct SimDecode {
    std::vector<float> out;                        // [H, d]
    std::vector<std::vector<double>> attn;         // with want_attention: per read list, the mean over the
                                                   // heads that read it (else empty)
    std::vector<std::vector<double>> group_mass;   // with want_group_mass: [H_kv][seq_len], sum over the
                                                   // group's heads of P at each position read (0 elsewhere)
    double seconds = 0.0;                          // the attention's time (GPU: the kernels' own)
};

class SimBackend {
public:
    virtual ~SimBackend() = default;
    virtual std::string name() const = 0;      // "cpu" or "cuda"
    virtual std::string describe() const = 0;  // for the report: the device, the element type
    // Called once before a scenario runs: the model shape and the longest sequence (n + decode steps).
    virtual void begin(const ModelShape& shape, std::int64_t n, std::int64_t decode_steps) = 0;
    virtual std::unique_ptr<SimCache> make_cache() = 0;

    // Returns the rows as the policies are to see them (host fp32): `rows`, or the backend's copy of the
    // values it computes on (the cpu backend's bf16-rounded inputs).
    virtual SimRows set_rows(const SimRows& rows) = 0;
    virtual PrefillScoring* scoring() = 0;  // null: the policies' SIMD path on the host views

    // The prefill attention over the current rows; each returns the attention's seconds.
    virtual double dense_prefill() = 0;
    virtual double sparse_prefill(const TokenSelection& rows, UnselectedRows unselected) = 0;  // row indices
    virtual double masked_prefill(const BlockMask& mask) = 0;
    // The current output [m, H, d] becomes the layer's dense reference (the dense run: rows = positions).
    virtual void keep_as_reference() = 0;
    // The error of the current output against the reference: row i is position seq[i]; computed
    // (empty: every row) [H_kv][m] says which (KV group, row) outputs the run computed.
    virtual NmseAcc prefill_error(std::span<const std::int64_t> seq,
                                  const std::vector<std::vector<std::uint8_t>>& computed) = 0;
    // The current output on the host, fp32 [m, H, d] (residual mode's update).
    virtual std::span<const float> prefill_output() = 0;
    // The dense attention probabilities of the current rows' last row, summed over each KV group's
    // heads: [H_kv][m] (the reference's last-row mass).
    virtual std::vector<std::vector<double>> last_row_mass() = 0;

    // One decode token q [H, d] (host fp32) over the positions `read` (per KV head or shared) of the cache.
    virtual SimDecode decode(SimCache& cache, const float* q, const TokenSelection& read, bool want_attention,
                             bool want_group_mass) = 0;
};

// make_backend(name): sim/cpu_backend.hpp.
#ifdef VLSPARSE_SIM_CUDA
// sim/cuda_backend.cu (built with -Dcuda=enabled).
std::unique_ptr<SimBackend> make_cuda_backend();
#endif

}  // namespace vlsparse::sim
