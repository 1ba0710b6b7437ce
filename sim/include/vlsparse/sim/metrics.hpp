// vlsparse/sim/metrics.hpp -- what the simulator measures for each policy, and the exact definitions.
//
// Per layer l (n prompt tokens, S decode steps, H query heads, H_kv KV heads, d head dim):
//   kept_ratio      sum_g |cache_g after prefill| / (H_kv n): the share of (KV head, prompt position)
//                   pairs the layer's cache keeps after the prefill
//   prefill_pairs   (query, key) pairs the layer's prefill attention computes, summed over query heads:
//                   dense over m rows: m(m+1)/2 per head; token-sparse (rows outside zero): |T|(|T|+1)/2;
//                   token-sparse (rows outside attend the kept keys): sum over rows of the kept keys at or
//                   before them; masked: the mask's allowed pairs (exact count)
//   decode_pairs    sum over steps and query heads of the positions the step reads
//   attention FLOPs 4 d pairs (QK^T and PV, 2 FLOPs per multiply-add); the policies' own scoring work
//                   (ZipVL's probes, A-VL's last-row scores) is not counted here, it is in the wall time
//   kv_bytes        bytes of K and V the layer's cache holds (fp32) after the prefill and at the end
//   prefill_nmse    ||O - O_dense||^2 / ||O_dense||^2 over the (row, head) outputs the policy computes
//                   (rows that left the sequence, and rows a token-sparse prefill leaves at zero, are
//                   not outputs); O_dense = the dense run's output of the same layer
//   decode_nmse     the same over the decode steps' outputs of the layer
//   mass_prefill    (1/H) sum_h sum_{j kept by h's KV head} P_dense(n-1, h, j): the dense attention mass
//                   of the last prompt token on the keys the cache keeps
//   mass_decode     the same for each decode step's token on the keys the step reads, mean over steps
// Overall: kept ratio, NMSEs and masses are means over layers; FLOPs and bytes are sums over layers,
// reported as a fraction of the dense run's. Residual mode adds final_hidden_nmse (the final-layer
// hidden states of the last prompt token and of every decode token against the dense run's) and
// token_agreement (the share of the S + 1 LM-head tokens -- after the prefill and after each decode
// step -- equal to the dense run's; every run is fed the dense run's tokens) and kl_to_dense (at each of
// the same S + 1 points, KL(p_dense || p) of the LM head's softmax distributions over the vocabulary, in
// nats; mean over the points).
// Include: <vlsparse/sim/metrics.hpp>
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "vlsparse/core/selection.hpp"

namespace vlsparse::sim {

// ||a - b||^2 / ||b||^2 accumulated in double; 0 when both are zero.
struct NmseAcc {
    double num = 0.0, den = 0.0;
    void add(float a, float b) {
        const double e = static_cast<double>(a) - static_cast<double>(b);
        num += e * e;
        den += static_cast<double>(b) * static_cast<double>(b);
    }
    void add(const NmseAcc& o) {
        num += o.num;
        den += o.den;
    }
    double value() const { return den > 0.0 ? num / den : (num == 0.0 ? 0.0 : INFINITY); }
};

struct LayerMetrics {
    std::int64_t layer = 0;
    std::int64_t rows = 0;            // rows in the sequence at this layer's prefill
    double kept_ratio = 0.0;          // after the prefill
    double kept_ratio_end = 0.0;      // cache rows at the end / (H_kv (n + S))
    double prefill_pairs = 0.0, decode_pairs = 0.0;
    double dense_prefill_pairs = 0.0, dense_decode_pairs = 0.0;
    double kv_bytes_prefill = 0.0, kv_bytes_end = 0.0;
    double dense_kv_bytes_prefill = 0.0, dense_kv_bytes_end = 0.0;
    NmseAcc prefill_err, decode_err;
    double mass_prefill = 0.0;
    double mass_decode = 0.0;          // mean over steps
    double decide_s = 0.0;             // time inside the policy (prefill decision, decode_read/observe)
    double attention_s = 0.0;          // time in the attention kernels (prefill + decode)
    double prefill_attention_s = 0.0;  // of it: the prefill's (GPU: the kernels' own time, CUDA events)
    double decode_attention_s = 0.0;   // of it: the decode steps'
    double decode_kv_bytes = 0.0;      // bytes of K and V the decode steps read (rows read x d x 2 x element size)
    double other_s = 0.0;              // cache fills, evictions, gathers
    std::string prefill_kind;          // "dense", "token-sparse", "masked"
    std::vector<float> kept_bins;      // kept share per position bin after the prefill (pictures)
};

struct PolicyResult {
    std::string label, name;
    nlohmann::json params;               // effective params (defaults filled in)
    std::vector<LayerMetrics> layers;
    // residual mode
    bool residual = false;
    NmseAcc final_hidden_err;
    std::vector<std::int64_t> tokens;    // LM-head tokens (S + 1)
    std::int64_t tokens_agree = 0;
    double kl_sum = 0.0;                 // sum over the S + 1 LM-head points of KL(p_dense || p), nats
    std::vector<float> final_hidden;     // [S + 1, D] final-layer hidden states (tests)
    std::vector<TokenSelection> kept_sets;  // EngineOptions::keep_kept_sets: per layer, the cache's positions
                                            // after the prefill (tests: CPU / GPU agreement)
    // sweep (compare): which swept policy and value this run is
    std::string sweep_of, sweep_value;

    double mean(double LayerMetrics::*f) const {
        double s = 0.0;
        for (const auto& l : layers) s += l.*f;
        return layers.empty() ? 0.0 : s / static_cast<double>(layers.size());
    }
    double sum(double LayerMetrics::*f) const {
        double s = 0.0;
        for (const auto& l : layers) s += l.*f;
        return s;
    }
    double kept_ratio() const { return mean(&LayerMetrics::kept_ratio); }
    double prefill_nmse() const {
        double s = 0.0;
        for (const auto& l : layers) s += l.prefill_err.value();
        return layers.empty() ? 0.0 : s / static_cast<double>(layers.size());
    }
    double decode_nmse() const {
        double s = 0.0;
        for (const auto& l : layers) s += l.decode_err.value();
        return layers.empty() ? 0.0 : s / static_cast<double>(layers.size());
    }
    double prefill_flops_ratio() const {
        const double d = sum(&LayerMetrics::dense_prefill_pairs);
        return d > 0 ? sum(&LayerMetrics::prefill_pairs) / d : 0.0;
    }
    double decode_flops_ratio() const {
        const double d = sum(&LayerMetrics::dense_decode_pairs);
        return d > 0 ? sum(&LayerMetrics::decode_pairs) / d : 0.0;
    }
    double flops_ratio() const {
        const double d = sum(&LayerMetrics::dense_prefill_pairs) + sum(&LayerMetrics::dense_decode_pairs);
        return d > 0 ? (sum(&LayerMetrics::prefill_pairs) + sum(&LayerMetrics::decode_pairs)) / d : 0.0;
    }
    double kv_ratio_prefill() const {
        const double d = sum(&LayerMetrics::dense_kv_bytes_prefill);
        return d > 0 ? sum(&LayerMetrics::kv_bytes_prefill) / d : 0.0;
    }
    double kv_ratio_end() const {
        const double d = sum(&LayerMetrics::dense_kv_bytes_end);
        return d > 0 ? sum(&LayerMetrics::kv_bytes_end) / d : 0.0;
    }
    double mass_prefill() const { return mean(&LayerMetrics::mass_prefill); }
    double mass_decode() const { return mean(&LayerMetrics::mass_decode); }
    double wall_s() const {
        return sum(&LayerMetrics::decide_s) + sum(&LayerMetrics::attention_s) + sum(&LayerMetrics::other_s);
    }
    double attention_s() const { return sum(&LayerMetrics::attention_s); }
    double prefill_attention_s() const { return sum(&LayerMetrics::prefill_attention_s); }
    double decode_attention_s() const { return sum(&LayerMetrics::decode_attention_s); }
    // Prefill attention TF/s on the pairs computed (4 d per pair); decode GB/s of K and V read.
    double prefill_tflops(std::int64_t head_dim) const {
        const double t = prefill_attention_s();
        return t > 0 ? 4.0 * static_cast<double>(head_dim) * sum(&LayerMetrics::prefill_pairs) / t * 1e-12 : 0.0;
    }
    double decode_gbps() const {
        const double t = decode_attention_s();
        return t > 0 ? sum(&LayerMetrics::decode_kv_bytes) / t * 1e-9 : 0.0;
    }
    // Attention FLOPs actually computed (4 d pairs), given the head dimension.
    double attention_flops(std::int64_t head_dim) const {
        return 4.0 * static_cast<double>(head_dim) * (sum(&LayerMetrics::prefill_pairs) + sum(&LayerMetrics::decode_pairs));
    }
    double gflops(std::int64_t head_dim) const {
        const double t = attention_s();
        return t > 0 ? attention_flops(head_dim) / t * 1e-9 : 0.0;
    }
    double token_agreement() const {
        return tokens.empty() ? 0.0 : static_cast<double>(tokens_agree) / static_cast<double>(tokens.size());
    }
    // Mean over the S + 1 LM-head points of KL(p_dense || p) (residual mode; 0 for the dense run).
    double kl_to_dense() const { return tokens.empty() ? 0.0 : kl_sum / static_cast<double>(tokens.size()); }
};

}  // namespace vlsparse::sim
