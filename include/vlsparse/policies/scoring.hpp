// vlsparse/policies/scoring.hpp -- what a policy sees of one prefill layer (PrefillLayer), and the seam
// through which the policies' arithmetic runs on another backend (PrefillScoring).
//
// The policy adapters (policies/policy.hpp, purekv_policy.hpp) keep every non-arithmetic step --
// budgets, forced keeps, tie rules, position bookkeeping, decode schedules -- in one place and take
// the scores they rank from the layer's q / k. By default those scores come from the SIMD path on the
// fp32 host views of PrefillLayer. An engine whose tensors live elsewhere (the simulator's CUDA
// backend: the same rows as bf16 device tensors) sets PrefillLayer::scoring; the adapters then ask it
// for the scores instead, and rank them with the same CPU code. A backend computes each quantity with
// the definition the SIMD function of the same name documents (policies/zipvl.hpp, avl.hpp,
// baselines.hpp, purekv.hpp); its precision is its own (docs/simulator.md, "The CUDA backend").
//
// This header is light on purpose (no SIMD code): a CUDA translation unit includes it to implement
// PrefillScoring.
// Include: <vlsparse/policies/scoring.hpp> (or <vlsparse/policies/policy.hpp>).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "vlsparse/attention/common.hpp"
#include "vlsparse/core/layout.hpp"
#include "vlsparse/core/model_shape.hpp"
#include "vlsparse/core/selection.hpp"
#include "vlsparse/core/tensor.hpp"
#include "vlsparse/policies/avl_select.hpp"
#include "vlsparse/policies/baselines_select.hpp"
#include "vlsparse/policies/purekv_params.hpp"
#include "vlsparse/policies/zipvl_select.hpp"

namespace vlsparse {

class PrefillScoring;

// What a policy sees of one prefill layer. q [n, H, d], k and v [n, H_kv, d] in fp32, rows in
// position order; `positions` are the absolute positions of the rows (size n; 0..n-1 unless an
// earlier layer dropped tokens from the sequence, e.g. FastV / A-VL prefill filter). An empty
// `positions` means 0..n-1. `scoring`: null = the SIMD path on q / k; else the backend that holds
// the same rows and computes the policies' scores from them (see above).
struct PrefillLayer {
    const Layout* layout = nullptr;          // the prompt's original layout (positions [0, layout->n()))
    ModelShape shape;
    std::int64_t layer = 0;
    View3<const float> q, k, v;
    std::span<const std::int64_t> positions;
    PrefillScoring* scoring = nullptr;
};

// The scores the policy adapters rank, computed by a backend from the rows of `in` (the rows it
// holds for in.q / in.k; an implementation checks that they are the same rows). Each returns what the
// SIMD function named in its comment returns for in.q / in.k; errors are vlsparse::error.
class PrefillScoring {
public:
    virtual ~PrefillScoring() = default;
    virtual std::string backend_name() const = 0;
    // simd::zipvl_select(in.q, in.k, layout, in.layer, P): probes, scores, p, kept lists.
    virtual ZipVLSelection zipvl_select(const PrefillLayer& in, const Layout& layout, const ZipVLParams& P) = 0;
    // simd::avl_scores / simd::fastv_scores: the last row's attention averaged over every query head [n].
    virtual std::vector<double> last_row_scores(const PrefillLayer& in, const AttentionOptions& opt) = 0;
    // simd::h2o_scores(in.q, in.k, groups, opt): accumulated attention over the causal prefill [G][n].
    virtual std::vector<std::vector<double>> h2o_scores(const PrefillLayer& in, BaselineGroups groups,
                                                        const AttentionOptions& opt) = 0;
    // simd::avl_h2o_scores(in.q, in.k, groups, opt): per KV head ([H_kv][n]) or per query head ([H][n]).
    virtual std::vector<std::vector<double>> avl_h2o_scores(const PrefillLayer& in, AvlTextGroups groups,
                                                            const AttentionOptions& opt) = 0;
    // simd::snapkv_select(in.q, in.k, P): the kept rows (row indices of in's rows) with their scores.
    virtual TokenSelection snapkv_select(const PrefillLayer& in, const SnapKVParams& P) = 0;
    // simd::purekv_window_scores(in.q, in.k, in.layer, P): PureKV's Eq. 2, the last P.window rows'
    // attention summed per group (the policy ranks them, weighted by ||V||, on the CPU).
    virtual PureKVScores purekv_window_scores(const PrefillLayer& in, const PureKVParams& P) = 0;
};

}  // namespace vlsparse
