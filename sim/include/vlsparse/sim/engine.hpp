// vlsparse/sim/engine.hpp -- the simulator's engine: a scenario's prefill layer by layer, then its
// decode steps, for the dense reference and every policy, all driven through AnyPolicy, the arithmetic
// through one SimBackend (sim/backend.hpp: cpu = the SIMD path, cuda = the CUDA kernels).
//
// Per layer l and run (the dense reference first, then each policy):
//   be.set_rows(the run's rows); d = policy.prefill({layout, shape, l, q, k, v, positions, be.scoring()})
//   prefill attention:  d.mask -> be.masked_prefill;  d.sparse_prefill -> be.sparse_prefill over d.kv
//                       (rows outside per d.unselected);  else be.dense_prefill (causal)
//   cache:              the layer's K/V at their positions (cache.fill), then cache.keep(d.kv)
//   sequence:           d.sequence non-empty -> only those positions stay for the layers after l
// Decode step t of layer l: cache.append(the token's K/V); read = policy.decode_read(l, t, cached);
//   be.decode over `read` (probabilities when the policy reads them, decode_wants_attention);
//   policy.decode_observe(l, t, read, head-mean attention) may return positions to keep (eviction).
// run_plain (synthetic, dump sources): each layer runs its prefill and then its decode steps, all runs
// side by side, so only one layer's caches are alive. run_residual: every run keeps its own hidden state
// and all its caches; prefill layer by layer, then decode step by step through all layers, every run
// fed the dense run's LM-head token (teacher forcing). Metrics: sim/metrics.hpp.
// Include: <vlsparse/sim/engine.hpp>
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <future>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include <nlohmann/json.hpp>

#include "vlsparse/masks/flops.hpp"
#include "vlsparse/policies/policy.hpp"
#include "vlsparse/sim/backend.hpp"
#include "vlsparse/sim/cpu_backend.hpp"
#include "vlsparse/sim/layer_source.hpp"
#include "vlsparse/sim/metrics.hpp"
#include "vlsparse/sim/policies.hpp"
#include "vlsparse/sim/progress.hpp"
#include "vlsparse/sim/purekv_validation.hpp"
#include "vlsparse/sim/scenario.hpp"

namespace vlsparse::sim {

// One policy to run: its label, registry name, effective params and the policy itself.
struct PolicyToRun {
    std::string label, name;
    json params = json::object();
    AnyPolicy policy;
    std::string sweep_of, sweep_value;  // compare: the swept policy's label and the value's text
};

struct EngineOptions {
    Progress* progress = nullptr;
    std::string backend;             // non-empty: overrides the scenario's backend ("cpu", "cuda")
    std::int64_t bins = 256;         // position bins of the kept-token pictures
    bool keep_final_hidden = false;  // residual mode: keep the final hidden states (tests)
    bool keep_kept_sets = false;     // keep each layer's cached positions after the prefill (tests)
    bool cpu_round_bf16 = false;     // cpu backend: round every input to bf16 first (what the cuda backend
                                     // computes on; the CPU / GPU agreement test)
};

struct RunResult {
    std::vector<PolicyResult> runs;  // runs[0] is the dense reference
    double wall_s = 0.0;
    int threads = 1;
    bool residual = false;
    std::int64_t hidden_size = 0;
    std::string source;
    std::string backend = "cpu";  // the backend's name
    std::string device;           // what it ran on (SimBackend::describe)
    double source_s = 0.0;        // generating or loading the layers' Q/K/V (plain sources; on the cuda
                                  // backend overlapped with the GPU's work on the layer before)
    PureKVValidation purekv;  // PureKV's Eq. 5-7 check on the dense run (when a purekv policy runs)
};

// The scenario's policies, made through the registry (labels, effective params).
inline std::vector<PolicyToRun> instantiate_policies(const Scenario& s) {
    std::vector<PolicyToRun> out;
    const PolicyContext ctx{s.model, s.base_dir};
    for (std::size_t i = 0; i < s.policies.size(); ++i) {
        const auto& p = s.policies[i];
        const JsonWhere w = JsonWhere{s.file, "policies"}.index(i);
        const PolicyInfo& info = policy_info(p.name, w.key("name"));
        out.push_back({p.label, p.name, effective_params(info, p.params), info.make(p.params, w.key("params"), ctx), "", ""});
    }
    return out;
}

namespace detail {

using clock = std::chrono::steady_clock;
inline double since(clock::time_point t0) { return std::chrono::duration<double>(clock::now() - t0).count(); }

// What the other runs are measured against, from the dense reference run.
struct RefLayer {
    std::vector<std::vector<double>> last_mass;    // [H_kv][n]: sum over the group's heads of P(n-1, h, j)
    std::vector<float> decode_out;                 // [H, d] of the current step
    std::vector<std::vector<double>> decode_mass;  // [H_kv][positions]: same for the current decode token
};

struct Run {
    PolicyToRun p;
    PolicyResult res;
    std::vector<std::int64_t> seq;                 // the positions in the sequence
    std::vector<std::unique_ptr<SimCache>> caches;  // plain: one (the current layer), residual: one per layer
    std::vector<float> hidden;           // residual: [seq, D]
    std::vector<float> x;                // residual: the decode token's hidden state [D]
    std::vector<float> out;              // the last decode step's attention output [H, d]
    std::vector<float> final_rows;       // residual: final hidden states [S + 1, D]
    std::int64_t last_token = -1;
};

[[noreturn]] inline void policy_fail(const Run& r, std::int64_t layer, const std::string& what) {
    throw ::vlsparse::error("vlsparse-sim", "policy '" + r.p.label + "' (" + r.p.name + "), layer " +
                                                std::to_string(layer) + ": " + what);
}

inline bool contains_sorted(std::span<const std::int64_t> v, std::int64_t x) {
    return std::binary_search(v.begin(), v.end(), x);
}

// The cache's positions as a selection (shared when every KV head holds the same positions).
inline TokenSelection cache_selection(const SimCache& c) {
    TokenSelection s;
    s.n = c.seq_len();
    const std::int64_t G = c.n_kv_heads();
    bool same = true;
    for (std::int64_t g = 1; g < G && same; ++g) {
        const auto a = c.positions(0), b = c.positions(g);
        same = a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
    }
    for (std::int64_t g = 0; g < (same ? 1 : G); ++g) {
        const auto p = c.positions(g);
        s.indices.emplace_back(p.begin(), p.end());
    }
    return s;
}

// Throws unless every position `read` lists is held by its KV head of the cache, each list sorted
// ascending without duplicates (rows_for_positions' contract, for any backend's cache).
inline void check_read_positions(const SimCache& cache, const TokenSelection& read) {
    constexpr const char* fn = "rows_for_positions";
    for (std::int64_t g = 0; g < cache.n_kv_heads(); ++g) {
        const auto pos = cache.positions(g);
        const auto want = read.for_kv_head(g);
        std::size_t src = 0;  // one walk over both ascending lists
        for (std::size_t i = 0; i < want.size(); ++i) {
            ::vlsparse::require(i == 0 || want[i] > want[i - 1], fn, "position list for KV head ", g,
                                        " is not sorted ascending without duplicates at entry ", i);
            while (src < pos.size() && pos[src] < want[i]) ++src;
            ::vlsparse::require(src < pos.size() && pos[src] == want[i], fn, "position ", want[i],
                                        " is not in KV head ", g, " of the cache (evicted, or beyond seq_len ",
                                        cache.seq_len(), ")");
            ++src;
        }
    }
}

// Kept share per position bin, over KV heads.
inline std::vector<float> kept_bins(const SimCache& c, std::int64_t n, std::int64_t bins) {
    const std::int64_t B = std::max<std::int64_t>(1, std::min(bins, n));
    std::vector<double> cnt(static_cast<std::size_t>(B), 0.0);
    for (std::int64_t g = 0; g < c.n_kv_heads(); ++g)
        for (auto p : c.positions(g))
            if (p < n) cnt[static_cast<std::size_t>(p * B / n)] += 1.0;
    std::vector<float> r(static_cast<std::size_t>(B));
    for (std::int64_t b = 0; b < B; ++b) {
        const std::int64_t lo = (b * n + B - 1) / B, hi = ((b + 1) * n + B - 1) / B;  // positions p with p*B/n == b
        const double size = static_cast<double>(std::max<std::int64_t>(hi - lo, 1)) * static_cast<double>(c.n_kv_heads());
        r[static_cast<std::size_t>(b)] = static_cast<float>(cnt[static_cast<std::size_t>(b)] / size);
    }
    return r;
}

// One run's prefill of layer l over its sequence rows q [m, H, d], k, v [m, H_kv, d] on the backend
// (the output stays there: SimBackend::prefill_output), fills `cache`, records the layer's metrics
// (against `ref` and the backend's reference output unless ref is null), and returns the row indices
// that stay in the sequence (empty: all).
inline std::vector<std::int64_t> prefill_step(Run& r, const Scenario& s, std::int64_t l, const float* q, const float* k,
                                              const float* v, SimBackend& be, SimCache& cache, const RefLayer* ref,
                                              std::int64_t bins, std::int64_t shared_id = -1, bool keep_set = false) {
    const std::int64_t n = s.n(), H = s.model.heads, Hkv = s.model.kv_heads, d = s.model.head_dim, grp = H / Hkv;
    const auto m = static_cast<std::int64_t>(r.seq.size());
    LayerMetrics& M = r.res.layers[static_cast<std::size_t>(l)];
    M.layer = l;
    M.rows = m;
    auto t0 = clock::now();
    const SimRows seen = be.set_rows(SimRows{q, k, v, m, shared_id});  // what the policies see
    M.other_s += since(t0);
    const View3<const float> qv(seen.q, {m, H, d}), kv(seen.k, {m, Hkv, d}), vv(seen.v, {m, Hkv, d});
    const PrefillLayer in{&s.layout, s.model, l, qv, kv, vv, std::span<const std::int64_t>(r.seq), be.scoring()};

    t0 = clock::now();
    PrefillDecision dec;
    try {
        dec = r.p.policy.prefill(in);
    } catch (const ::vlsparse::error& e) {
        policy_fail(r, l, e.what());
    }
    M.decide_s += since(t0);

    // Check the decision against the sequence.
    try {
        check_prefill_decision(dec, n, Hkv);
        for (const auto& list : dec.kv.indices)
            for (auto p : list)
                if (!contains_sorted(r.seq, p))
                    throw ::vlsparse::error("PrefillDecision", "kv keeps position " + std::to_string(p) +
                                                                   ", which is not in the layer's sequence");
        for (auto p : dec.sequence)
            if (!contains_sorted(r.seq, p))
                throw ::vlsparse::error("PrefillDecision", "sequence holds position " + std::to_string(p) +
                                                               ", which already left the sequence");
    } catch (const ::vlsparse::error& e) {
        policy_fail(r, l, e.what());
    }

    // The prefill attention.
    std::vector<std::vector<std::uint8_t>> computed;  // per KV group: rows with outputs (empty: all rows)
    try {
        if (dec.mask) {
            M.prefill_kind = "masked";
            M.prefill_attention_s += be.masked_prefill(*dec.mask);
            double pairs[4] = {-1, -1, -1, -1};
            double total = 0.0;
            for (const auto t : dec.mask->head_template) {
                auto& pp = pairs[static_cast<std::size_t>(t)];
                if (pp < 0) pp = static_cast<double>(count_allowed_pairs(dec.mask->context, t));
                total += pp;
            }
            M.prefill_pairs = total;
        } else if (dec.sparse_prefill) {
            M.prefill_kind = "token-sparse";
            TokenSelection rows;  // kv as row indices of the sequence
            rows.n = m;
            for (const auto& list : dec.kv.indices) {
                std::vector<std::int64_t> rl;
                rl.reserve(list.size());
                for (auto p : list)
                    rl.push_back(std::lower_bound(r.seq.begin(), r.seq.end(), p) - r.seq.begin());
                rows.indices.push_back(std::move(rl));
            }
            M.prefill_attention_s += be.sparse_prefill(rows, dec.unselected);
            double pairs = 0.0;
            for (std::int64_t h = 0; h < H; ++h) {
                const auto T = rows.for_kv_head(h / grp);
                const auto t = static_cast<double>(T.size());
                if (dec.unselected == UnselectedRows::zero) {
                    pairs += t * (t + 1.0) / 2.0;
                } else {
                    for (auto j : T) pairs += static_cast<double>(m - j);
                }
            }
            M.prefill_pairs = pairs;
            if (dec.unselected == UnselectedRows::zero) {
                computed.assign(static_cast<std::size_t>(Hkv), std::vector<std::uint8_t>(static_cast<std::size_t>(m), 0));
                for (std::int64_t g = 0; g < Hkv; ++g)
                    for (auto j : rows.for_kv_head(g)) computed[static_cast<std::size_t>(g)][static_cast<std::size_t>(j)] = 1;
            }
        } else {
            M.prefill_kind = "dense";
            M.prefill_attention_s += be.dense_prefill();
            M.prefill_pairs = static_cast<double>(H) * static_cast<double>(m) * static_cast<double>(m + 1) / 2.0;
        }
    } catch (const ::vlsparse::error& e) {
        policy_fail(r, l, e.what());
    }
    M.attention_s = M.prefill_attention_s;  // the layer's prefill runs once, before its decode steps
    M.dense_prefill_pairs = static_cast<double>(H) * static_cast<double>(n) * static_cast<double>(n + 1) / 2.0;

    // The cache: the rows at their positions, then the policy's kept set.
    t0 = clock::now();
    try {
        cache.fill(r.seq, n);
        cache.keep(dec.kv);
    } catch (const ::vlsparse::error& e) {
        policy_fail(r, l, e.what());
    }
    M.other_s += since(t0);
    double rows_kept = 0.0;
    for (std::int64_t g = 0; g < Hkv; ++g) rows_kept += static_cast<double>(cache.rows(g));
    M.kept_ratio = rows_kept / (static_cast<double>(Hkv) * static_cast<double>(n));
    M.kv_bytes_prefill = static_cast<double>(cache.kv_bytes(d));
    M.dense_kv_bytes_prefill = static_cast<double>(n * Hkv * d * 2 * cache.element_bytes());
    M.kept_bins = kept_bins(cache, n, bins);
    if (keep_set) {
        if (r.res.kept_sets.size() <= static_cast<std::size_t>(l)) r.res.kept_sets.resize(static_cast<std::size_t>(l) + 1);
        r.res.kept_sets[static_cast<std::size_t>(l)] = cache_selection(cache);
    }

    if (ref) {
        t0 = clock::now();
        M.prefill_err = be.prefill_error(r.seq, computed);
        M.other_s += since(t0);
        double mass = 0.0;
        for (std::int64_t g = 0; g < Hkv; ++g)
            for (auto p : cache.positions(g)) mass += ref->last_mass[static_cast<std::size_t>(g)][static_cast<std::size_t>(p)];
        M.mass_prefill = mass / static_cast<double>(H);
    }

    std::vector<std::int64_t> keep_rows;
    if (!dec.sequence.empty()) {
        for (auto p : dec.sequence) keep_rows.push_back(std::lower_bound(r.seq.begin(), r.seq.end(), p) - r.seq.begin());
        r.seq = dec.sequence;
    }
    return keep_rows;
}

// One run's decode step t of layer l: q [H, d], k, v [H_kv, d] of the new token. Writes r.out [H, d].
// With `fill` (the reference run) records the step's output and probabilities into it; with `ref`
// measures against them.
inline void decode_step(Run& r, const Scenario& s, std::int64_t l, std::int64_t t, const float* q, const float* k,
                        const float* v, SimBackend& be, SimCache& cache, const RefLayer* ref, RefLayer* fill) {
    const std::int64_t n = s.n(), H = s.model.heads, Hkv = s.model.kv_heads, d = s.model.head_dim, grp = H / Hkv;
    LayerMetrics& M = r.res.layers[static_cast<std::size_t>(l)];
    auto t0 = clock::now();
    cache.append(k, v);
    const TokenSelection cached = cache_selection(cache);
    M.other_s += since(t0);

    t0 = clock::now();
    TokenSelection read;
    try {
        read = r.p.policy.decode_read(l, t, cached);
    } catch (const ::vlsparse::error& e) {
        policy_fail(r, l, "decode step " + std::to_string(t) + ": " + e.what());
    }
    M.decide_s += since(t0);
    SimDecode dec;
    try {
        if (read.groups() != 1 && static_cast<std::int64_t>(read.groups()) != Hkv)
            throw ::vlsparse::error("decode_read", "returned " + std::to_string(read.groups()) + " lists, expected 1 or " +
                                                       std::to_string(Hkv));
        if (read.indices != cached.indices) check_read_positions(cache, read);  // `cached` holds by construction
    } catch (const ::vlsparse::error& e) {
        policy_fail(r, l, "decode step " + std::to_string(t) + ": the positions read: " + e.what());
    }
    try {
        dec = be.decode(cache, q, read, r.p.policy.decode_wants_attention(l, t), fill != nullptr);
    } catch (const ::vlsparse::error& e) {
        policy_fail(r, l, "decode step " + std::to_string(t) + ": " + e.what());
    }
    M.attention_s += dec.seconds;
    M.decode_attention_s += dec.seconds;
    for (std::int64_t g = 0; g < Hkv; ++g)
        M.decode_kv_bytes += static_cast<double>(read.for_kv_head(g).size()) * static_cast<double>(d * 2 * cache.element_bytes());
    r.out = std::move(dec.out);
    const std::vector<std::vector<double>>& attn = dec.attn;
    t0 = clock::now();
    std::optional<TokenSelection> ev;
    try {
        ev = r.p.policy.decode_observe(l, t, read, std::span<const std::vector<double>>(attn));
    } catch (const ::vlsparse::error& e) {
        policy_fail(r, l, "decode step " + std::to_string(t) + ": " + e.what());
    }
    M.decide_s += since(t0);
    if (ev) {
        t0 = clock::now();
        try {
            cache.keep(*ev);
        } catch (const ::vlsparse::error& e) {
            policy_fail(r, l, "decode step " + std::to_string(t) + ": eviction: " + e.what());
        }
        M.other_s += since(t0);
    }

    for (std::int64_t h = 0; h < H; ++h) M.decode_pairs += static_cast<double>(read.for_kv_head(h / grp).size());
    M.dense_decode_pairs += static_cast<double>(H) * static_cast<double>(n + t + 1);

    if (fill) {
        fill->decode_out = r.out;
        fill->decode_mass = std::move(dec.group_mass);
    }
    if (ref) {
        for (std::int64_t x = 0; x < H * d; ++x)
            M.decode_err.add(r.out[static_cast<std::size_t>(x)], ref->decode_out[static_cast<std::size_t>(x)]);
        double mass = 0.0;
        for (std::int64_t g = 0; g < Hkv; ++g)
            for (auto p : read.for_kv_head(g)) mass += ref->decode_mass[static_cast<std::size_t>(g)][static_cast<std::size_t>(p)];
        // mass_decode holds the running sum until the layer finishes; divided by S in finish_layer
        M.mass_decode += mass / static_cast<double>(H);
    }
}

inline void finish_layer(Run& r, const Scenario& s, std::int64_t l, const SimCache& cache) {
    const std::int64_t n = s.n(), Hkv = s.model.kv_heads, d = s.model.head_dim, S = s.decode_steps;
    LayerMetrics& M = r.res.layers[static_cast<std::size_t>(l)];
    M.kv_bytes_end = static_cast<double>(cache.kv_bytes(d));
    M.dense_kv_bytes_end = static_cast<double>((n + S) * Hkv * d * 2 * cache.element_bytes());
    double rows = 0.0;
    for (std::int64_t g = 0; g < Hkv; ++g) rows += static_cast<double>(cache.rows(g));
    M.kept_ratio_end = rows / (static_cast<double>(Hkv) * static_cast<double>(n + S));
    if (S > 0) M.mass_decode /= static_cast<double>(S);
}

// Gathers rows `seq` of a [rows, width] buffer.
inline std::vector<float> gather_rows(const std::vector<float>& src, std::span<const std::int64_t> seq, std::int64_t width) {
    std::vector<float> out(seq.size() * static_cast<std::size_t>(width));
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (seq.size() * static_cast<std::size_t>(width) > (1u << 20))
#endif
    for (std::size_t i = 0; i < seq.size(); ++i)
        std::copy_n(src.data() + seq[i] * width, width, out.data() + i * static_cast<std::size_t>(width));
    return out;
}

inline bool is_identity_seq(const std::vector<std::int64_t>& seq, std::int64_t n) {
    return static_cast<std::int64_t>(seq.size()) == n;  // subsets of [0, n) of size n are the identity
}

// The LM head at one point (after the prefill, or after a decode step): the run's token (argmax of the
// logits, ties to the lowest index, as ResidualModel::lm_head) and KL(p_dense || p) of the softmax
// distributions, in nats, added to the run's kl_sum. The dense run (is_ref) stores its log-probabilities
// in ref_logp for the other runs of the same point.
template <class Model>
void lm_head_point(Run& r, const Model& model, std::span<const float> row, bool is_ref, std::vector<double>& ref_logp) {
    const std::vector<float> z = model.logits(row);
    std::size_t best = 0;
    for (std::size_t t = 1; t < z.size(); ++t)
        if (z[t] > z[best]) best = t;
    r.last_token = static_cast<std::int64_t>(best);
    r.res.tokens.push_back(r.last_token);
    double lse = 0.0;
    const double zmax = z[best];
    for (float x : z) lse += std::exp(static_cast<double>(x) - zmax);
    lse = zmax + std::log(lse);
    std::vector<double> logp(z.size());
    for (std::size_t t = 0; t < z.size(); ++t) logp[t] = static_cast<double>(z[t]) - lse;
    if (is_ref) {
        ref_logp = std::move(logp);
        return;
    }
    double kl = 0.0;
    for (std::size_t t = 0; t < logp.size(); ++t) kl += std::exp(ref_logp[t]) * (ref_logp[t] - logp[t]);
    r.res.kl_sum += std::max(kl, 0.0);  // >= 0 mathematically; rounding may leave -1e-17
}

inline int thread_count() {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

}  // namespace detail

namespace detail {

// Reports progress (units of attention work) when the options carry a Progress.
struct Ticker {
    Progress* progress = nullptr;
    void operator()(double units, const std::string& what) const {
        if (progress) progress->advance(units, what);
    }
};

// Plain sources (synthetic, dump): layer by layer, each layer's prefill and then its decode steps for
// every run; one layer's caches alive.
inline void run_plain(const Scenario& s, const EngineOptions& opt, SimBackend& be, std::vector<Run>& runs,
                      RunResult& result, const Ticker& tick) {
    const std::int64_t n = s.n(), H = s.model.heads, Hkv = s.model.kv_heads, d = s.model.head_dim, Lyr = s.model.layers,
                       S = s.decode_steps;
    const double nruns = static_cast<double>(runs.size());
    const std::string Ls = std::to_string(Lyr);
    auto src = make_plain_source(s);
    result.source = src->describe();
    for (auto& r : runs) {
        r.caches.clear();
        r.caches.push_back(be.make_cache());
    }
    // A backend that computes off the host (cuda) gets layer l + 1 generated on a host thread while
    // it works on layer l; the cpu backend computes on the same cores, so it generates in turn.
    const bool prefetch = be.name() != "cpu";
    auto generate = [&src](std::int64_t layer) {
        const auto t0 = clock::now();
        LayerQKV q = src->layer(layer);
        return std::pair<LayerQKV, double>(std::move(q), since(t0));
    };
    std::future<std::pair<LayerQKV, double>> next;
    for (std::int64_t l = 0; l < Lyr; ++l) {
        if (opt.progress) opt.progress->note("layer " + std::to_string(l + 1) + "/" + Ls + ": generating Q/K/V");
        auto [qkv, gen_s] = next.valid() ? next.get() : generate(l);
        result.source_s += gen_s;
        if (prefetch && l + 1 < Lyr) next = std::async(std::launch::async, generate, l + 1);
        if (qkv.rows < n + S)
            throw ::vlsparse::error("vlsparse-sim", "the source gave " + std::to_string(qkv.rows) + " rows for layer " +
                                                        std::to_string(l) + ", expected n + decode_steps = " +
                                                        std::to_string(n + S));
        RefLayer ref;
        for (std::size_t ri = 0; ri < runs.size(); ++ri) {
            Run& r = runs[ri];
            const bool identity = is_identity_seq(r.seq, n);
            std::vector<float> gq, gk, gv;
            if (!identity) {
                gq = gather_rows(qkv.q, r.seq, H * d);
                gk = gather_rows(qkv.k, r.seq, Hkv * d);
                gv = gather_rows(qkv.v, r.seq, Hkv * d);
            }
            const float* q = identity ? qkv.q.data() : gq.data();
            const float* k = identity ? qkv.k.data() : gk.data();
            const float* v = identity ? qkv.v.data() : gv.data();
            prefill_step(r, s, l, q, k, v, be, *r.caches[0], ri == 0 ? nullptr : &ref, opt.bins, identity ? l : -1,
                         opt.keep_kept_sets);
            if (ri == 0) {
                be.keep_as_reference();
                ref.last_mass = be.last_row_mass();
                r.res.layers[static_cast<std::size_t>(l)].mass_prefill = 1.0;
                result.purekv.observe(l, View3<const float>(qkv.q.data(), {n, H, d}),
                                      View3<const float>(qkv.k.data(), {n, Hkv, d}),
                                      View3<const float>(qkv.v.data(), {n, Hkv, d}));
            }
            tick(static_cast<double>(n) * static_cast<double>(n) / 2.0,
                 "layer " + std::to_string(l + 1) + "/" + Ls + " prefill: " + r.p.label);
        }
        for (std::int64_t t = 0; t < S; ++t) {
            const std::int64_t row = n + t;
            for (std::size_t ri = 0; ri < runs.size(); ++ri) {
                Run& r = runs[ri];
                decode_step(r, s, l, t, qkv.q.data() + row * H * d, qkv.k.data() + row * Hkv * d,
                            qkv.v.data() + row * Hkv * d, be, *r.caches[0], ri == 0 ? nullptr : &ref,
                            ri == 0 ? &ref : nullptr);
                if (ri == 0) r.res.layers[static_cast<std::size_t>(l)].mass_decode += 1.0;
            }
            tick(nruns * (static_cast<double>(n) + static_cast<double>(t)),
                 "layer " + std::to_string(l + 1) + "/" + Ls + " decode step " + std::to_string(t + 1));
        }
        for (auto& r : runs) finish_layer(r, s, l, *r.caches[0]);
    }
}

// Residual source: every run keeps its hidden state and all its caches; prefill layer by layer, then
// decode step by step through all layers, every run fed the dense run's LM-head token.
inline void run_residual(const Scenario& s, const EngineOptions& opt, SimBackend& be, std::vector<Run>& runs,
                         RunResult& result, const Ticker& tick) {
    const std::int64_t n = s.n(), H = s.model.heads, Hkv = s.model.kv_heads, d = s.model.head_dim, Lyr = s.model.layers,
                       S = s.decode_steps;
    const double nruns = static_cast<double>(runs.size());
    const std::string Ls = std::to_string(Lyr);
    auto model = make_residual_source(s);
    result.source = model->describe();
    const std::int64_t D = model->hidden_size();
    result.hidden_size = D;
    const std::vector<float> h0 = model->embed_prompt();
    if (static_cast<std::int64_t>(h0.size()) != n * D)
        throw ::vlsparse::error("vlsparse-sim", "the residual model embedded the prompt into " + std::to_string(h0.size()) +
                                                    " values, expected n x D = " + std::to_string(n * D));
    for (auto& r : runs) {
        r.hidden = h0;
        r.caches.clear();
        for (std::int64_t l = 0; l < Lyr; ++l) r.caches.push_back(be.make_cache());
    }
    LayerQKV qkv;
    for (std::int64_t l = 0; l < Lyr; ++l) {
        RefLayer ref;
        for (std::size_t ri = 0; ri < runs.size(); ++ri) {
            Run& r = runs[ri];
            const auto m = static_cast<std::int64_t>(r.seq.size());
            auto t0 = clock::now();
            model->project(l, std::span<const float>(r.hidden), std::span<const std::int64_t>(r.seq), qkv);
            if (qkv.rows != m)
                throw ::vlsparse::error("vlsparse-sim", "the residual model projected " + std::to_string(qkv.rows) +
                                                            " rows, expected " + std::to_string(m));
            r.res.layers[static_cast<std::size_t>(l)].other_s += since(t0);
            const auto keep = prefill_step(r, s, l, qkv.q.data(), qkv.k.data(), qkv.v.data(), be,
                                           *r.caches[static_cast<std::size_t>(l)], ri == 0 ? nullptr : &ref, opt.bins,
                                           -1, opt.keep_kept_sets);
            if (ri == 0) {
                be.keep_as_reference();  // the reference never drops rows: rows are positions
                ref.last_mass = be.last_row_mass();
                r.res.layers[static_cast<std::size_t>(l)].mass_prefill = 1.0;
                result.purekv.observe(l, View3<const float>(qkv.q.data(), {n, H, d}),
                                      View3<const float>(qkv.k.data(), {n, Hkv, d}),
                                      View3<const float>(qkv.v.data(), {n, Hkv, d}));
            }
            t0 = clock::now();
            model->update(l, std::span<float>(r.hidden), be.prefill_output());
            if (!keep.empty()) r.hidden = gather_rows(r.hidden, keep, D);
            r.res.layers[static_cast<std::size_t>(l)].other_s += since(t0);
            tick(static_cast<double>(n) * static_cast<double>(n) / 2.0,
                 "layer " + std::to_string(l + 1) + "/" + Ls + " prefill: " + r.p.label);
        }
    }
    // The LM head on the last prompt row's final hidden state (the last row still in the sequence).
    std::int64_t token = -1;
    std::vector<double> ref_logp;  // the dense run's log-probabilities at the current point
    for (std::size_t ri = 0; ri < runs.size(); ++ri) {
        Run& r = runs[ri];
        const std::span<const float> last(r.hidden.data() + (r.seq.size() - 1) * static_cast<std::size_t>(D),
                                          static_cast<std::size_t>(D));
        lm_head_point(r, *model, last, ri == 0, ref_logp);
        r.final_rows.assign(last.begin(), last.end());
        if (ri == 0) token = r.last_token;
        r.res.tokens_agree += r.last_token == runs[0].last_token;
    }
    std::vector<RefLayer> refs(static_cast<std::size_t>(Lyr));
    for (std::int64_t t = 0; t < S; ++t) {
        const std::vector<float> e = model->embed_token(token, n + t);
        for (auto& r : runs) r.x = e;
        for (std::int64_t l = 0; l < Lyr; ++l) {
            const std::int64_t pos = n + t;
            for (std::size_t ri = 0; ri < runs.size(); ++ri) {
                Run& r = runs[ri];
                auto t0 = clock::now();
                model->project(l, std::span<const float>(r.x), std::span<const std::int64_t>(&pos, 1), qkv);
                r.res.layers[static_cast<std::size_t>(l)].other_s += since(t0);
                decode_step(r, s, l, t, qkv.q.data(), qkv.k.data(), qkv.v.data(), be, *r.caches[static_cast<std::size_t>(l)],
                            ri == 0 ? nullptr : &refs[static_cast<std::size_t>(l)],
                            ri == 0 ? &refs[static_cast<std::size_t>(l)] : nullptr);
                if (ri == 0) r.res.layers[static_cast<std::size_t>(l)].mass_decode += 1.0;
                t0 = clock::now();
                model->update(l, std::span<float>(r.x), std::span<const float>(r.out));
                r.res.layers[static_cast<std::size_t>(l)].other_s += since(t0);
            }
            tick(nruns * (static_cast<double>(n) + static_cast<double>(t)),
                 "decode step " + std::to_string(t + 1) + ", layer " + std::to_string(l + 1) + "/" + Ls);
        }
        for (std::size_t ri = 0; ri < runs.size(); ++ri) {
            Run& r = runs[ri];
            lm_head_point(r, *model, std::span<const float>(r.x), ri == 0, ref_logp);
            r.final_rows.insert(r.final_rows.end(), r.x.begin(), r.x.end());
            r.res.tokens_agree += r.last_token == runs[0].last_token;
        }
        token = runs[0].last_token;
    }
    for (auto& r : runs) {
        for (std::size_t x = 0; x < r.final_rows.size(); ++x) r.res.final_hidden_err.add(r.final_rows[x], runs[0].final_rows[x]);
        if (opt.keep_final_hidden) r.res.final_hidden = r.final_rows;
    }
    for (auto& r : runs)
        for (std::int64_t l = 0; l < Lyr; ++l) finish_layer(r, s, l, *r.caches[static_cast<std::size_t>(l)]);
}

}  // namespace detail

// Runs the dense reference and `policies` over the scenario. RunResult::runs[0] is the reference.
inline RunResult run_engine(const Scenario& s, std::vector<PolicyToRun> policies, const EngineOptions& opt = {}) {
    using namespace detail;
    const auto t_all = clock::now();
    const std::int64_t n = s.n(), Lyr = s.model.layers, S = s.decode_steps;
    RunResult result;
    result.threads = thread_count();
    result.residual = s.source.kind == SourceKind::residual;
    const std::unique_ptr<SimBackend> backend =
        make_backend(opt.backend.empty() ? s.backend : opt.backend, opt.cpu_round_bf16);
    SimBackend& be = *backend;
    be.begin(s.model, n, S);
    result.backend = be.name();
    result.device = be.describe();

    std::vector<Run> runs;
    runs.push_back(Run{PolicyToRun{"dense", "dense", json::object(), DensePolicy{}, "", ""}, {}, {}, {}, {}, {}, {}, {}, -1});
    for (auto& p : policies) runs.push_back(Run{std::move(p), {}, {}, {}, {}, {}, {}, {}, -1});
    for (auto& r : runs) {
        r.res.label = r.p.label;
        r.res.name = r.p.name;
        r.res.params = r.p.params;
        r.res.sweep_of = r.p.sweep_of;
        r.res.sweep_value = r.p.sweep_value;
        r.res.residual = result.residual;
        r.res.layers.assign(static_cast<std::size_t>(Lyr), LayerMetrics{});
        r.seq.resize(static_cast<std::size_t>(n));
        for (std::int64_t i = 0; i < n; ++i) r.seq[static_cast<std::size_t>(i)] = i;
        try {
            r.p.policy.begin(s.layout, s.model);
        } catch (const ::vlsparse::error& e) {
            throw ::vlsparse::error("vlsparse-sim", "policy '" + r.p.label + "': " + e.what());
        }
    }
    // PureKV's cross-layer validation, with the first purekv policy's params (sim/purekv_validation.hpp).
    for (const auto& r : runs)
        if (r.p.name == "purekv") {
            result.purekv.enabled = true;
            result.purekv.policy = r.p.label;
            result.purekv.params = purekv_params_from_json(detail::without_keys(r.p.params, {"own_layer_scores"}));
            break;
        }
    const double nruns = static_cast<double>(runs.size());
    const double per_layer = static_cast<double>(n) * static_cast<double>(n) / 2.0 +
                             static_cast<double>(S) * (static_cast<double>(n) + static_cast<double>(S) / 2.0);
    if (opt.progress) opt.progress->start(per_layer * nruns * static_cast<double>(Lyr));
    const Ticker tick{opt.progress};

    if (result.residual)
        run_residual(s, opt, be, runs, result, tick);
    else
        run_plain(s, opt, be, runs, result, tick);
    if (opt.progress) opt.progress->finish();
    for (auto& r : runs) result.runs.push_back(std::move(r.res));
    result.wall_s = since(t_all);
    return result;
}

// The scenario's own policies.
inline RunResult run_scenario(const Scenario& s, const EngineOptions& opt = {}) {
    return run_engine(s, instantiate_policies(s), opt);
}

}  // namespace vlsparse::sim
