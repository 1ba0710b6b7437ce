// vlsparse/sim/characterize.hpp -- BlindSight's calibration of one model over N prompts (Algorithm 1 on
// every layer of every prompt, Algorithm 2 over the prompts): the work of `vlsparse-sim characterize`,
// also used by `claims`.
//
// A synthetic source is N prompts of ONE model: the head roles come from `model_seed` (set to the
// scenario's seed when not given), the content from seeds seed, seed + 1, ... (sim/synthetic.hpp). A
// residual source is calibrated on its dense run's Q/K/V, a dump on its one prompt (callers pass
// prompts = 1 for both).
// Include: <vlsparse/sim/characterize.hpp>
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "vlsparse/io/blindsight_json.hpp"
#include "vlsparse/policies/blindsight.hpp"
#include "vlsparse/sim/export.hpp"
#include "vlsparse/sim/layer_source.hpp"
#include "vlsparse/sim/progress.hpp"
#include "vlsparse/sim/scenario.hpp"

namespace vlsparse::sim {

inline HeadMap characterize_model(Scenario s, std::int64_t prompts, const BlindSightParams& P, Progress* progress = nullptr) {
    if (s.source.kind == SourceKind::synthetic && !s.source.params.contains("model_seed"))
        s.source.params["model_seed"] = static_cast<std::int64_t>(s.seed);
    const std::int64_t L = s.model.layers, H = s.model.heads, n = s.n();
    std::vector<TemplateCounts> counts(static_cast<std::size_t>(L * H));
    if (progress) progress->start(static_cast<double>(prompts * L));
    for (std::int64_t pi = 0; pi < prompts; ++pi) {
        Scenario sp = s;
        sp.seed = s.seed + static_cast<std::uint64_t>(pi);
        sp.decode_steps = 0;
        std::unique_ptr<PlainSource> src;
        std::vector<DumpLayer> dense;  // residual: the dense run's layers
        if (sp.source.kind == SourceKind::residual) {
            std::vector<std::int64_t> tokens;
            dense = detail::export_residual_dense(sp, tokens);
        } else {
            src = make_plain_source(sp);
        }
        for (std::int64_t l = 0; l < L; ++l) {
            LayerQKV x;
            if (src) {
                x = src->layer(l);
            } else {
                x.rows = n;
                x.q = std::move(dense[static_cast<std::size_t>(l)].q);
                x.k = std::move(dense[static_cast<std::size_t>(l)].k);
                x.v = std::move(dense[static_cast<std::size_t>(l)].v);
            }
            const View3<const float> q(x.q.data(), {n, H, s.model.head_dim}),
                k(x.k.data(), {n, s.model.kv_heads, s.model.head_dim}), v(x.v.data(), {n, s.model.kv_heads, s.model.head_dim});
            const auto ch = simd::characterize_prompt(q, k, v, s.layout, P);
            for (std::int64_t h = 0; h < H; ++h) counts[static_cast<std::size_t>(l * H + h)].add(ch[static_cast<std::size_t>(h)].chosen);
            if (progress)
                progress->advance(1.0, "prompt " + std::to_string(pi + 1) + "/" + std::to_string(prompts) + ", layer " +
                                           std::to_string(l + 1) + "/" + std::to_string(L));
        }
    }
    if (progress) progress->finish();
    HeadMap map;
    map.layers = L;
    map.heads = H;
    map.kv_heads = s.model.kv_heads;
    map.head_dim = s.model.head_dim;
    map.prompts = prompts;
    map.params = P;
    map.map = aggregate(counts, P);
    return map;
}

}  // namespace vlsparse::sim
