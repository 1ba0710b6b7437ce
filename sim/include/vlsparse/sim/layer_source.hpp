// vlsparse/sim/layer_source.hpp -- where the engine gets each layer's Q/K/V: the two source shapes.
//
//   PlainSource     Q/K/V of layer l do not depend on what earlier layers computed: the synthetic
//                   generator (sim/synthetic.hpp) and Q/K/V dumped from a real model (sim/dump.hpp).
//                   layer(l) returns n + S rows (the prompt, then one row per decode step).
//   ResidualSource  Q/K/V are projections of a hidden state that each layer's attention output
//                   updates (sim/residual.hpp): the engine keeps one hidden state per policy, so a
//                   policy's errors propagate through depth, and an LM head turns the final hidden
//                   state into a token at every decode step.
// make_plain_source / make_residual_source build them from a scenario. The engine
// (sim/engine.hpp) drives both; it never sees which generator is behind them.
// Include: <vlsparse/sim/layer_source.hpp>
#pragma once

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "vlsparse/core/layout.hpp"
#include "vlsparse/core/model_shape.hpp"
#include "vlsparse/sim/scenario.hpp"
#include "vlsparse/sim/synthetic.hpp"

#include "vlsparse/sim/residual.hpp"
#include "vlsparse/sim/dump.hpp"

namespace vlsparse::sim {

// One layer's Q [rows, H, d], K and V [rows, H_kv, d] in fp32, token-major.
struct LayerQKV {
    std::int64_t rows = 0;
    std::vector<float> q, k, v;
};

class PlainSource {
public:
    virtual ~PlainSource() = default;
    // Layer l: the prompt's n rows followed by one row per decode step (n + decode_steps rows).
    virtual LayerQKV layer(std::int64_t l) = 0;
    virtual std::string describe() const = 0;
};

class ResidualSource {
public:
    virtual ~ResidualSource() = default;
    virtual std::int64_t hidden_size() const = 0;
    virtual std::vector<float> embed_prompt() const = 0;                  // [n, D]
    virtual std::vector<float> embed_token(std::int64_t token, std::int64_t position) const = 0;  // [D]
    // Q [m, H, d], K, V [m, H_kv, d] of layer l for the hidden rows [m, D] at absolute `positions`.
    virtual void project(std::int64_t l, std::span<const float> hidden, std::span<const std::int64_t> positions,
                         LayerQKV& out) const = 0;
    // hidden [m, D] += the layer's update from its attention output [m, H, d] (in place).
    virtual void update(std::int64_t l, std::span<float> hidden, std::span<const float> attn_out) const = 0;
    virtual std::int64_t lm_head(std::span<const float> hidden_row) const = 0;
    virtual std::vector<float> logits(std::span<const float> hidden_row) const = 0;  // [vocab]; lm_head is their argmax
    virtual std::string describe() const = 0;
};

// ---- synthetic -----------------------------------------------------------------------------------

// The generator (sim/synthetic.hpp): the prompt's rows followed by one text row per decode step
// (positions n, n+1, ...), deterministic from the seed; the prompt's rows do not depend on S.
class SyntheticSource final : public PlainSource {
public:
    SyntheticSource(const Layout& layout, std::int64_t decode_steps, const SyntheticParams& P)
        : P_(P), layout_(layout), steps_(decode_steps) {}
    LayerQKV layer(std::int64_t l) override {
        SyntheticLayer L = synthetic_layer(layout_, P_, l, steps_);
        LayerQKV r;
        r.rows = L.n;
        r.q = std::move(L.q);
        r.k = std::move(L.k);
        r.v = std::move(L.v);
        return r;
    }
    std::string describe() const override {
        return "synthetic Q/K/V (sim/synthetic.hpp version " + std::to_string(P_.version) + ", seed " +
               std::to_string(P_.seed) + ")";
    }

private:
    SyntheticParams P_;
    Layout layout_;
    std::int64_t steps_ = 0;
};

// ---- dump ---------------------------------------------------------------------------------------

// Q/K/V dumped from a real model (sim/dump.hpp): the prompt's rows, then the dump's decode rows.
// When the model's softmax scale differs from 1/sqrt(d), q is multiplied by scale * sqrt(d), so that
// attention with the default scale (what the engine and every policy use) gives the model's logits.
class DumpPlainSource final : public PlainSource {
public:
    explicit DumpPlainSource(const std::filesystem::path& dir) : src_(dir) {
        const double d = static_cast<double>(src_.shape().head_dim);
        q_factor_ = static_cast<float>(src_.manifest().softmax_scale() * std::sqrt(d));
    }
    LayerQKV layer(std::int64_t l) override {
        DumpLayer x = src_.layer(l);
        LayerQKV r;
        r.rows = src_.tokens();
        r.q = std::move(x.q);
        r.k = std::move(x.k);
        r.v = std::move(x.v);
        if (std::abs(q_factor_ - 1.0f) > 1e-6f)
            for (auto& e : r.q) e *= q_factor_;
        return r;
    }
    std::string describe() const override {
        const auto& m = src_.manifest();
        return "Q/K/V dumped from " + (m.model.empty() ? std::string("a model") : m.model) + " (" + src_.dir().string() +
               ", " + std::string(dump_dtype_name(m.dtype)) + ")";
    }

private:
    DumpSource src_;
    float q_factor_ = 1.0f;
};

// ---- residual ---------------------------------------------------------------------------------------

// The residual-stream model of sim/residual.hpp over the scenario's prompt.
class ResidualModelSource final : public ResidualSource {
public:
    ResidualModelSource(const ModelShape& shape, const ResidualParams& P, const Layout& layout)
        : m_(shape, P), layout_(layout) {}
    std::int64_t hidden_size() const override { return m_.hidden_size(); }
    std::vector<float> embed_prompt() const override { return m_.embed_prompt(layout_); }
    std::vector<float> embed_token(std::int64_t token, std::int64_t position) const override {
        return m_.embed_token(token, position);
    }
    void project(std::int64_t l, std::span<const float> hidden, std::span<const std::int64_t> positions,
                 LayerQKV& out) const override {
        m_.project(l, hidden, positions, out.q, out.k, out.v);
        out.rows = static_cast<std::int64_t>(positions.size());
    }
    void update(std::int64_t l, std::span<float> hidden, std::span<const float> attn_out) const override {
        m_.update(l, hidden, attn_out);
    }
    std::int64_t lm_head(std::span<const float> hidden_row) const override { return m_.lm_head(hidden_row); }
    std::vector<float> logits(std::span<const float> hidden_row) const override { return m_.logits(hidden_row); }
    std::string describe() const override {
        return "residual-stream model (sim/residual.hpp: hidden " + std::to_string(m_.hidden_size()) + ", vocab " +
               std::to_string(m_.vocab()) + ", seed " + std::to_string(m_.params().seed) + ")";
    }
    const ResidualModel& model() const { return m_; }

private:
    ResidualModel m_;
    Layout layout_;
};

// ---- factories -------------------------------------------------------------------------------------

inline std::unique_ptr<PlainSource> make_plain_source(const Scenario& s) {
    switch (s.source.kind) {
        case SourceKind::synthetic: return std::make_unique<SyntheticSource>(s.layout, s.decode_steps, synthetic_params(s));
        case SourceKind::dump: return std::make_unique<DumpPlainSource>(s.source.dir);
        case SourceKind::residual: break;
    }
    throw ::vlsparse::error("vlsparse-sim", "make_plain_source: the residual source is not a plain source");
}

inline std::unique_ptr<ResidualSource> make_residual_source(const Scenario& s) {
    if (s.source.kind != SourceKind::residual)
        throw ::vlsparse::error("vlsparse-sim", "make_residual_source: the scenario's source is not residual");
    return std::make_unique<ResidualModelSource>(s.model, residual_params(s), s.layout);
}

}  // namespace vlsparse::sim
