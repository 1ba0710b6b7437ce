// vlsparse/sim/realism.hpp -- `vlsparse-sim realism`: the attention statistics the papers' methods rely
// on, measured on a scenario's source (synthetic, residual: its dense run, dump: the recorded model), so
// that a synthetic scenario can be compared with a real model's dump on the same numbers.
//
// Per layer, over the prompt's n tokens, query head h, and R query rows i spread evenly over [n/4, n)
// (the last row n - 1 included; --rows, default 64), with p_i = softmax_{j <= i}(q_i . k_j / sqrt(d)):
//   first_token_mass  mean over rows and heads of p_i[0]
//   image_sink_mass   mean of the mass on the first ceil(0.1 len) tokens of every image / video segment
//                     (BlindSight's sinks) at or before i
//   local_mass        mean of the mass on keys i - r <= j <= i (r = --local-radius, default 4 tokens)
//   entropy           mean of the normalized entropy H(p_i) / ln(i + 1) in [0, 1] (1: uniform)
//   head_entropy_std  the standard deviation over heads of each head's mean normalized entropy (how
//                     different the heads are)
//   diffuse_share     the share of heads whose mean normalized entropy exceeds 0.75
//   heavy_share       PureKV's window scores s_j (Eq. 2: the last w = 32 rows, every head summed) over
//                     [0, n - w): the share of their sum on the top 5% of the keys (how concentrated
//                     importance is: what H2O, SnapKV and ZipVL exploit)
//   rho_next          Spearman's rho of those scores against the next layer's (cross-layer consistency
//                     of importance: what PureKV exploits); NaN for the last layer or a constant sample
// Overall: the mean over layers (rho_next over the layers that have one).
//
// fit_generator(target): the synthetic generator's parameters that make these statistics resemble the
// target's (typically a dump of a real model, sim/tools/dump_qkv.py) on the target's prompt layout and
// model shape. Distance: the mean over layers of the squared differences of every statistic above
// (rho_next where both are finite). Search: coordinate descent from the generator's defaults over
// sink, heavy, local, document, noise (each tried x0.5, x0.75, x1.33, x2 within bounds) and the
// diffuse shares of layer 0, layer 1 and later layers (each tried -0.2, -0.1, +0.1, +0.2 within
// [0, 1]), keeping every move that lowers the distance, for `passes` passes. A local search: it
// never makes the distance worse than the defaults', and says how much it lowered it.
// Include: <vlsparse/sim/realism.hpp>
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "vlsparse/core/rank_correlation.hpp"
#include "vlsparse/policies/purekv.hpp"
#include "vlsparse/sim/export.hpp"
#include "vlsparse/sim/layer_source.hpp"
#include "vlsparse/sim/progress.hpp"
#include "vlsparse/sim/report_json.hpp"
#include "vlsparse/sim/report_text.hpp"
#include "vlsparse/sim/scenario.hpp"
#include "vlsparse/sim/synthetic.hpp"

namespace vlsparse::sim {

struct RealismOptions {
    std::int64_t rows = 64;          // query rows per layer
    std::int64_t local_radius = 4;   // tokens
    std::int64_t window = 32;        // PureKV's window for the importance scores
    double heavy_top = 0.05;         // the top share of keys for heavy_share
    double diffuse_entropy = 0.75;   // a head above this mean normalized entropy counts as diffuse
};

struct LayerRealism {
    std::int64_t layer = 0;
    double first_token_mass = 0, image_sink_mass = 0, local_mass = 0, entropy = 0, head_entropy_std = 0,
           diffuse_share = 0, heavy_share = 0, rho_next = NAN;
};

struct RealismResult {
    std::vector<LayerRealism> layers;
    LayerRealism mean;  // over layers (layer = -1)
    std::string source;
};

inline const std::vector<std::pair<const char*, double LayerRealism::*>>& realism_fields() {
    static const std::vector<std::pair<const char*, double LayerRealism::*>> f = {
        {"first_token_mass", &LayerRealism::first_token_mass}, {"image_sink_mass", &LayerRealism::image_sink_mass},
        {"local_mass", &LayerRealism::local_mass},             {"entropy", &LayerRealism::entropy},
        {"head_entropy_std", &LayerRealism::head_entropy_std}, {"diffuse_share", &LayerRealism::diffuse_share},
        {"heavy_share", &LayerRealism::heavy_share},           {"rho_next", &LayerRealism::rho_next}};
    return f;
}

// The statistics of one layer's prompt rows q [n, H, d], k [n, H_kv, d] (rho_next left NaN); also
// returns the window scores in `scores` for the cross-layer correlation.
inline LayerRealism measure_layer(const Layout& layout, const ModelShape& m, std::int64_t l, const float* q, const float* k,
                                  const float* v, const RealismOptions& o, std::vector<double>& scores) {
    const std::int64_t n = layout.n(), H = m.heads, Hkv = m.kv_heads, d = m.head_dim, grp = H / Hkv;
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    std::vector<char> sink(static_cast<std::size_t>(n), 0);
    for (const auto& seg : layout.segments())
        if (seg.is_visual()) {
            const auto c = static_cast<std::int64_t>(std::ceil(0.1 * static_cast<double>(seg.length)));
            for (std::int64_t j = seg.start; j < seg.start + c; ++j) sink[static_cast<std::size_t>(j)] = 1;
        }
    const std::int64_t lo = n / 4, span = n - lo, R = std::min(o.rows, span);
    LayerRealism r;
    r.layer = l;
    std::vector<double> head_entropy(static_cast<std::size_t>(H), 0.0), logit(static_cast<std::size_t>(n));
    double rows_counted = 0;
    for (std::int64_t t = 0; t < R; ++t) {
        const std::int64_t i = lo + ((t + 1) * span) / R - 1;  // the last one is n - 1
        for (std::int64_t h = 0; h < H; ++h) {
            const float* qi = q + (i * H + h) * d;
            double mx = -INFINITY;
            for (std::int64_t j = 0; j <= i; ++j) {
                const float* kj = k + (j * Hkv + h / grp) * d;
                double s = 0;
                for (std::int64_t e = 0; e < d; ++e) s += static_cast<double>(qi[e]) * static_cast<double>(kj[e]);
                logit[static_cast<std::size_t>(j)] = s * scale;
                mx = std::max(mx, s * scale);
            }
            double z = 0;
            for (std::int64_t j = 0; j <= i; ++j) z += std::exp(logit[static_cast<std::size_t>(j)] - mx);
            double ent = 0, sm = 0, lm = 0;
            for (std::int64_t j = 0; j <= i; ++j) {
                const double p = std::exp(logit[static_cast<std::size_t>(j)] - mx) / z;
                if (p > 0) ent -= p * std::log(p);
                if (sink[static_cast<std::size_t>(j)]) sm += p;
                if (i - j <= o.local_radius) lm += p;
                if (j == 0) r.first_token_mass += p;
            }
            r.image_sink_mass += sm;
            r.local_mass += lm;
            const double ne = i > 0 ? ent / std::log(static_cast<double>(i + 1)) : 0.0;
            r.entropy += ne;
            head_entropy[static_cast<std::size_t>(h)] += ne;
        }
        rows_counted += 1;
    }
    const double cnt = rows_counted * static_cast<double>(H);
    r.first_token_mass /= cnt;
    r.image_sink_mass /= cnt;
    r.local_mass /= cnt;
    r.entropy /= cnt;
    double mean = 0, var = 0;
    for (auto& e : head_entropy) e /= rows_counted, mean += e;
    mean /= static_cast<double>(H);
    for (double e : head_entropy) var += (e - mean) * (e - mean), r.diffuse_share += e > o.diffuse_entropy;
    r.head_entropy_std = std::sqrt(var / static_cast<double>(H));
    r.diffuse_share /= static_cast<double>(H);
    // PureKV's window scores, one group (every head)
    PureKVParams P;
    P.window = std::min(o.window, n);
    P.grouping = PureKVGrouping::layer;
    const PureKVScores s = simd::purekv_window_scores(View3<const float>(q, {n, H, d}), View3<const float>(k, {n, Hkv, d}), l, P);
    (void)v;
    scores.assign(s.s[0].begin(), s.s[0].begin() + (n - P.window));
    std::vector<double> sorted = scores;
    std::sort(sorted.begin(), sorted.end(), std::greater<>());
    const auto top = std::max<std::size_t>(1, static_cast<std::size_t>(std::ceil(o.heavy_top * static_cast<double>(sorted.size()))));
    const double total = std::accumulate(sorted.begin(), sorted.end(), 0.0);
    r.heavy_share = total > 0 && !sorted.empty() ? std::accumulate(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(std::min(top, sorted.size())), 0.0) / total : NAN;
    return r;
}

// The scenario's layers as the engine's dense run sees them (plain sources: the source's rows; a
// residual source: its dense run, sim/export.hpp), measured layer by layer.
inline RealismResult measure_realism(const Scenario& s0, const RealismOptions& o, Progress* progress = nullptr) {
    if (o.rows < 1 || o.rows > 1 << 20) throw ::vlsparse::error("vlsparse-sim realism", "--rows " + std::to_string(o.rows) + ", expected 1 <= rows <= 1048576");
    if (o.local_radius < 0)
        throw ::vlsparse::error("vlsparse-sim realism", "--local-radius " + std::to_string(o.local_radius) + ", expected >= 0");
    const Scenario& s = s0;
    const std::int64_t n = s.n(), L = s.model.layers;
    if (n < 4) throw ::vlsparse::error("vlsparse-sim realism", "n = " + std::to_string(n) + " tokens, expected at least 4");
    RealismResult R;
    std::unique_ptr<PlainSource> src;
    std::vector<DumpLayer> dense;
    if (s.source.kind == SourceKind::residual) {
        std::vector<std::int64_t> tokens;
        dense = detail::export_residual_dense(s, tokens);
        R.source = "residual model (its dense run), seed " + std::to_string(s.seed);
    } else {
        src = make_plain_source(s);
        R.source = src->describe();
    }
    if (progress) progress->start(static_cast<double>(L));
    std::vector<double> prev, cur;
    for (std::int64_t l = 0; l < L; ++l) {
        LayerQKV x;
        if (src) {
            x = src->layer(l);
        } else {
            x.q = std::move(dense[static_cast<std::size_t>(l)].q);
            x.k = std::move(dense[static_cast<std::size_t>(l)].k);
            x.v = std::move(dense[static_cast<std::size_t>(l)].v);
        }
        R.layers.push_back(measure_layer(s.layout, s.model, l, x.q.data(), x.k.data(), x.v.data(), o, cur));
        if (l > 0) {
            try {
                R.layers[static_cast<std::size_t>(l - 1)].rho_next =
                    spearman(std::span<const double>(prev), std::span<const double>(cur)).rho;
            } catch (const ::vlsparse::error&) {
                // a constant sample: rho undefined, left NaN
            }
        }
        prev.swap(cur);
        if (progress) progress->advance(1.0, "layer " + std::to_string(l + 1) + "/" + std::to_string(L));
    }
    if (progress) progress->finish();
    R.mean.layer = -1;
    for (const auto& [key, f] : realism_fields()) {
        double sum = 0, k = 0;
        for (const auto& x : R.layers)
            if (std::isfinite(x.*f)) sum += x.*f, k += 1;
        R.mean.*f = k > 0 ? sum / k : NAN;
    }
    return R;
}

inline void print_realism(std::FILE* f, const RealismResult& R) {
    text::Table t({"layer", "first", "image", "local", "entropy", "head", "diffuse", "heavy", "rho"},
                  {"", "token", "sinks", "mass", "(norm.)", "entropy sd", "heads", "top 5%", "next layer"});
    auto row = [&](const LayerRealism& x, const std::string& name) {
        t.row({name, text::pct(x.first_token_mass), text::pct(x.image_sink_mass), text::pct(x.local_mass), text::fix(x.entropy, 3),
               text::fix(x.head_entropy_std, 3), text::pct(x.diffuse_share, 0), text::pct(x.heavy_share),
               std::isfinite(x.rho_next) ? text::fix(x.rho_next, 3) : "-"});
    };
    for (const auto& x : R.layers) row(x, std::to_string(x.layer));
    row(R.mean, "mean");
    t.print(f, "  ");
}

inline json realism_json(const Scenario& s, const RealismResult& R, const RealismOptions& o) {
    auto one = [](const LayerRealism& x) {
        json j = {{"layer", x.layer}};
        for (const auto& [key, f] : realism_fields()) j[key] = detail::finite_or_null(x.*f);
        return j;
    };
    json layers = json::array();
    for (const auto& x : R.layers) layers.push_back(one(x));
    return json{{"format", "vlsparse.sim.realism"},
                {"version", 1},
                {"scenario", to_json(s)},
                {"source", R.source},
                {"options",
                 {{"rows", o.rows}, {"local_radius", o.local_radius}, {"window", o.window}, {"heavy_top", o.heavy_top},
                  {"diffuse_entropy", o.diffuse_entropy}}},
                {"layers", layers},
                {"mean", one(R.mean)}};
}

// The distance between two measurements of the same number of layers (see the header comment).
inline double realism_distance(const RealismResult& a, const RealismResult& b) {
    if (a.layers.size() != b.layers.size() || a.layers.empty())
        throw ::vlsparse::error("realism_distance", "the measurements have " + std::to_string(a.layers.size()) + " and " +
                                                        std::to_string(b.layers.size()) + " layers, expected the same number > 0");
    double d = 0;
    for (std::size_t l = 0; l < a.layers.size(); ++l)
        for (const auto& [key, f] : realism_fields()) {
            const double x = a.layers[l].*f, y = b.layers[l].*f;
            if (std::isfinite(x) && std::isfinite(y)) d += (x - y) * (x - y);
        }
    return d / static_cast<double>(a.layers.size());
}

struct FitResult {
    json params;                              // the fitted synthetic source's params
    RealismResult target, start, fitted;      // start: the generator's defaults
    double distance_start = 0, distance_fitted = 0;
    std::int64_t evaluations = 0;
};

inline FitResult fit_generator(const Scenario& target, const RealismOptions& o, std::int64_t passes = 2,
                               Progress* progress = nullptr) {
    if (passes < 1 || passes > 100)
        throw ::vlsparse::error("vlsparse-sim fit", "--passes " + std::to_string(passes) + ", expected 1 <= passes <= 100");
    struct Key {
        const char* name;
        double start, lo, hi;
        bool share;  // a share in [0, 1]: additive steps
    };
    const SyntheticParams D;
    const std::vector<Key> keys = {{"sink", D.sink, 0.0, 64.0, false},         {"heavy", D.heavy, 0.0, 32.0, false},
                                   {"local", D.local, 0.0, 40.0, false},       {"document", D.document, 0.0, 24.0, false},
                                   {"noise", D.noise, 0.05, 3.0, false},       {"diffuse_layer0", D.diffuse_layer0, 0.0, 1.0, true},
                                   {"diffuse_layer1", D.diffuse_layer1, 0.0, 1.0, true}, {"diffuse_later", D.diffuse_later, 0.0, 1.0, true}};
    FitResult F;
    F.target = measure_realism(target, o);
    Scenario c = target;
    c.decode_steps = 0;
    c.source = SourceSpec{};
    c.source.kind = SourceKind::synthetic;
    auto eval = [&](const json& params) {
        c.source.params = params;
        ++F.evaluations;
        return measure_realism(c, o);
    };
    json best = json::object();
    for (const auto& k : keys) best[k.name] = k.start;
    F.start = eval(best);
    F.distance_start = realism_distance(F.start, F.target);
    double best_d = F.distance_start;
    F.fitted = F.start;
    const std::vector<double> factors = {0.5, 0.75, 4.0 / 3.0, 2.0}, steps = {-0.2, -0.1, 0.1, 0.2};
    if (progress) progress->start(static_cast<double>(passes) * static_cast<double>(keys.size()));
    for (std::int64_t pass = 0; pass < passes; ++pass)
        for (const auto& k : keys) {
            const double v0 = best[k.name].get<double>();
            for (double f : k.share ? steps : factors) {
                const double v = std::clamp(k.share ? v0 + f : v0 * f, k.lo, k.hi);
                if (v == best[k.name].get<double>()) continue;
                json trial = best;
                trial[k.name] = v;
                RealismResult r = eval(trial);
                const double dist = realism_distance(r, F.target);
                if (dist < best_d) {
                    best_d = dist;
                    best = trial;
                    F.fitted = std::move(r);
                }
            }
            if (progress) progress->advance(1.0, std::string("pass ") + std::to_string(pass + 1) + ", " + k.name);
        }
    if (progress) progress->finish();
    F.params = best;
    F.distance_fitted = best_d;
    return F;
}

}  // namespace vlsparse::sim
