// vlsparse/sim/scenario.hpp -- a simulator scenario: model shape, prompt layout, decode steps, the
// attention source, the policies with their Params, backend and seed; read strictly from JSON.
//
//   {
//     "name": "default", "description": "...",
//     "model":  {"layers": 8, "heads": 8, "kv_heads": 4, "head_dim": 128},
//     "layout": "text:30,image:576,text:24",            (Layout::parse syntax)
//     "decode_steps": 16,
//     "source": {"kind": "synthetic", "params": {...}}   (or "residual" with params, or "dump" with "dir")
//     "policies": [{"name": "zipvl", "label": "zipvl", "params": {"tau": 0.95},
//                   "sweep": {"param": "tau", "values": [0.9, 0.95]}}, ...],
//     "backend": "cpu", "seed": 1
//   }
// With a dump source, "model", "layout" and "decode_steps" may be left out (the dump's manifest gives
// them; given, they must match it). Every unknown key, wrong type, impossible shape (heads not a
// multiple of kv_heads, a layout that does not parse, params out of range) is rejected with the
// file and the JSON path of the problem; so is a scenario whose estimated memory exceeds the limit
// (16 GiB, or $VLSPARSE_SIM_MAX_MEMORY_GIB), checked before anything that grows with it is allocated.
// docs/simulator.md describes every key. Include: <vlsparse/sim/scenario.hpp>
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "vlsparse/core/layout.hpp"
#include "vlsparse/core/model_shape.hpp"
#include "vlsparse/io/json.hpp"
#include "vlsparse/sim/policies.hpp"
#include "vlsparse/sim/dump.hpp"
#include "vlsparse/sim/residual.hpp"
#include "vlsparse/sim/synthetic.hpp"

namespace vlsparse::sim {

enum class SourceKind : std::uint8_t { synthetic, residual, dump };

inline constexpr ::vlsparse::EnumName<SourceKind> kSourceKindNames[] = {
    {SourceKind::synthetic, "synthetic"}, {SourceKind::residual, "residual"}, {SourceKind::dump, "dump"}};
constexpr std::span<const ::vlsparse::EnumName<SourceKind>> enum_names(SourceKind) { return kSourceKindNames; }
constexpr std::string_view to_string(SourceKind k) { return ::vlsparse::enum_name(k); }

struct SourceSpec {
    SourceKind kind = SourceKind::synthetic;
    json params = json::object();  // synthetic / residual: the generator's or model's parameters as given
    std::string dir;               // dump: the folder of the dumped Q/K/V (resolved against the scenario's folder)
};

struct PolicySpec {
    std::string name;                 // registry name (policies.hpp)
    std::string label;                // unique within the scenario; defaults to the name (name#2, ... for repeats)
    json params = json::object();     // as given (defaults filled in by effective_params)
    std::string sweep_param;          // compare: the swept key ("" with object values)
    std::vector<json> sweep_values;   // compare: empty = the registry's default sweep
};

struct Scenario {
    std::string name = "scenario";
    std::string description;
    ModelShape model;
    Layout layout;
    std::int64_t decode_steps = 0;
    SourceSpec source;
    std::vector<PolicySpec> policies;
    std::string backend = "cpu";
    std::uint64_t seed = 1;
    std::string file;                  // where it was read from ("" = built in)
    std::filesystem::path base_dir;    // relative paths inside the scenario resolve here
    bool model_from_dump = false;      // "model" / "layout" left out: the dump's manifest gave them
    bool layout_from_dump = false;

    std::int64_t n() const { return layout.n(); }
};

// ---- the synthetic generator's parameters as JSON ------------------------------------------------

inline json synthetic_params_json(const SyntheticParams& P) {
    json kinds = json::array();
    for (auto k : P.head_kinds) kinds.push_back(std::string(to_string(k)));
    return json{{"sink", P.sink},
                {"heavy", P.heavy},
                {"text_focus", P.text_focus},
                {"local", P.local},
                {"document", P.document},
                {"noise", P.noise},
                {"minor_weight", P.minor_weight},
                {"heavy_fraction", P.heavy_fraction},
                {"heavy_patch", P.heavy_patch},
                {"image_sinks", P.image_sinks},
                {"delimiter_sinks", P.delimiter_sinks},
                {"local_radius", P.local_radius},
                {"video_change", P.video_change},
                {"video_time_scale", P.video_time_scale},
                {"diffuse_layer0", P.diffuse_layer0},
                {"diffuse_layer1", P.diffuse_layer1},
                {"diffuse_later", P.diffuse_later},
                {"share_sink", P.share_sink},
                {"share_heavy", P.share_heavy},
                {"share_local", P.share_local},
                {"share_document", P.share_document},
                {"head_kinds", kinds},
                {"model_seed", P.model_seed},
                {"version", P.version}};
}

// The generator's parameters for a scenario: its source params over the defaults (keys, types and
// ranges checked, problems reported with their JSON path), the model's heads and head dimension, the
// scenario's seed.
inline SyntheticParams synthetic_params_from_json(const json& j, const JsonWhere& w, const ModelShape& model,
                                                  std::uint64_t seed) {
    SyntheticParams P;
    check_params_like(j, synthetic_params_json(P), w);
    auto get = [&](const char* key, auto& out) {  // types checked above; ranges in the JSON's own type
        using T = std::remove_reference_t<decltype(out)>;
        const json* v = find_key(j, key);
        if (!v) return;
        if (const std::string p = ::vlsparse::json_number_problem<T>(*v); !p.empty())
            w.key(key).fail(p + ", got " + json_repr(*v));
        out = v->get<T>();
    };
    get("sink", P.sink);
    get("heavy", P.heavy);
    get("text_focus", P.text_focus);
    get("local", P.local);
    get("document", P.document);
    get("noise", P.noise);
    get("minor_weight", P.minor_weight);
    get("heavy_fraction", P.heavy_fraction);
    get("heavy_patch", P.heavy_patch);
    get("image_sinks", P.image_sinks);
    get("delimiter_sinks", P.delimiter_sinks);
    get("local_radius", P.local_radius);
    get("video_change", P.video_change);
    get("video_time_scale", P.video_time_scale);
    get("diffuse_layer0", P.diffuse_layer0);
    get("diffuse_layer1", P.diffuse_layer1);
    get("diffuse_later", P.diffuse_later);
    get("share_sink", P.share_sink);
    get("share_heavy", P.share_heavy);
    get("share_local", P.share_local);
    get("share_document", P.share_document);
    get("version", P.version);
    if (find_key(j, "model_seed"))
        P.model_seed = read_int(j, "model_seed", w, -1, std::numeric_limits<std::int64_t>::max());
    if (const json* v = find_key(j, "head_kinds")) {
        for (std::size_t i = 0; i < v->size(); ++i) {
            const json& e = (*v)[i];
            const JsonWhere at = w.key("head_kinds").index(i);
            if (!e.is_string()) at.fail("expected a head kind name, got " + json_repr(e));
            try {
                P.head_kinds.push_back(parse_head_kind(e.get<std::string>()));
            } catch (const ::vlsparse::error&) {
                at.fail("unknown head kind " + json_repr(e) + ", expected diffuse, sink, local, heavy or document");
            }
        }
    }
    P.n_heads = model.heads;
    P.n_kv_heads = model.kv_heads;
    P.head_dim = model.head_dim;
    P.seed = seed;
    with_json_path(j, w, [&] {
        detail::validate(P, "synthetic source");
        return 0;
    });
    return P;
}

inline SyntheticParams synthetic_params(const Scenario& s) {
    return synthetic_params_from_json(s.source.params, JsonWhere{s.file, "source.params"}, s.model, s.seed);
}

// ---- the residual-stream model's parameters as JSON ---------------------------------------------

inline json residual_params_json(const ResidualParams& P) {
    return json{{"hidden", P.hidden},
                {"vocab", P.vocab},
                {"residual_scale", P.residual_scale},
                {"norm_eps", P.norm_eps},
                {"structure", synthetic_params_json(P.structure)}};
}

// The residual model's parameters: source.params over the defaults ("structure" holds the synthetic
// generator's keys), the scenario's seed. Checked by building the model's first layer.
inline ResidualParams residual_params(const Scenario& s) {
    ResidualParams P;
    const JsonWhere w{s.file, "source.params"};
    const json& j = s.source.params;
    check_params_like(j, residual_params_json(P), w, {"structure"});
    if (find_key(j, "hidden")) P.hidden = read_int(j, "hidden", w, 1, 1 << 20);
    if (find_key(j, "vocab")) P.vocab = read_int(j, "vocab", w, 2, 1 << 24);
    if (const json* v = find_key(j, "residual_scale")) P.residual_scale = v->get<double>();
    if (const json* v = find_key(j, "norm_eps")) P.norm_eps = v->get<double>();
    if (const json* v = find_key(j, "structure")) {
        const JsonWhere sw = w.key("structure");
        if (!v->is_object()) sw.fail("expected an object of synthetic generator keys, got " + json_repr(*v));
        if (v->contains("version")) sw.key("version").fail("the residual model needs version 2 (omit the key)");
        P.structure = synthetic_params_from_json(*v, sw, s.model, s.seed);
    }
    P.seed = s.seed;
    ModelShape one = s.model;
    one.layers = 1;  // the checks do not depend on the depth
    with_json_path(j, w, [&] {
        const ResidualModel check(one, P);
        return check.hidden_size();
    });
    return P;
}

// ---- memory: estimated from the sizes alone, checked before anything large is allocated -----------
//
// A scenario's run holds one layer's Q/K/V (plain sources) or the residual model's weights and every
// layer's KV cache (residual source), a KV cache and an attention output per run (the dense reference
// and each policy), and the block masks of BlindSight (and of PureKV on video). The estimate adds
// these up in doubles (no size can overflow it); scenario_from_json rejects a scenario whose estimate
// exceeds the limit, naming the key that weighs most, before it allocates anything that grows with
// the sizes (the residual check model included).

inline constexpr double kDefaultMaxMemoryGiB = 16.0;

// The limit in bytes: $VLSPARSE_SIM_MAX_MEMORY_GIB (a positive number of GiB) or 16 GiB.
inline double max_memory_bytes() {
    double gib = kDefaultMaxMemoryGiB;
    if (const char* e = std::getenv("VLSPARSE_SIM_MAX_MEMORY_GIB"); e && *e) {
        char* end = nullptr;
        gib = std::strtod(e, &end);
        if (*end != '\0' || !std::isfinite(gib) || gib <= 0.0)
            throw ::vlsparse::error("scenario", std::string("VLSPARSE_SIM_MAX_MEMORY_GIB = '") + e +
                                                    "', expected a positive number of GiB");
    }
    return gib * 1073741824.0;
}

// "1.23 GiB", "456 MiB" (three significant digits).
inline std::string memory_text(double bytes) {
    const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    int u = 0;
    while (u < 6 && bytes >= 1024.0) bytes /= 1024.0, ++u;
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.3g %s", bytes, units[u]);
    return buf;
}

// The sizes an estimate reads, as doubles.
struct MemorySizes {
    double tokens = 0, segments = 1, decode_steps = 0;
    double layers = 0, heads = 0, kv_heads = 0, head_dim = 0;
    double runs = 1;            // the dense reference and every policy run
    bool residual = false;      // residual source: hidden, vocab
    double hidden = 0, vocab = 0;
    struct Masks {
        std::size_t policy = 0;              // index in Scenario::policies
        double q_block = 0, k_block = 0;     // its block sizes
        double q_default = 0, k_default = 0;
    };
    std::vector<Masks> block_masks;  // one per policy that builds a block mask
};

struct MemoryEstimate {
    std::vector<std::pair<std::string, double>> parts;  // what, bytes
    double total() const {
        double t = 0.0;
        for (const auto& p : parts) t += p.second;
        return t;
    }
    // "3.2 GiB of memory (Q/K/V of a layer 1.1 GiB, KV caches 2 GiB, ...)"
    std::string str() const {
        std::string s = memory_text(total()) + " of memory (";
        for (std::size_t i = 0; i < parts.size(); ++i)
            s += (i ? ", " : "") + parts[i].first + " " + memory_text(parts[i].second);
        return s + ")";
    }
};

inline MemoryEstimate estimate_memory(const MemorySizes& z) {
    constexpr double f = sizeof(float);
    const double n = z.tokens, T = n + z.decode_steps, H = z.heads, Hkv = z.kv_heads, d = z.head_dim;
    const double wq = H * d, wkv = Hkv * d;  // values per token of Q, and of K (or V)
    MemoryEstimate e;
    if (!z.residual) {  // one layer at a time: Q/K/V, a gathered copy for runs with fewer rows, one cache per run
        e.parts.push_back({"Q/K/V of a layer", (T + n) * (wq + 2.0 * wkv) * f});
        e.parts.push_back({"KV caches", z.runs * T * wkv * (2.0 * f + 8.0) + n * wkv * 2.0 * f});
    } else {  // the model's weights, every layer's cache per run, a hidden state per run
        e.parts.push_back({"Q/K/V of a layer", n * (wq + 2.0 * wkv) * f});
        e.parts.push_back({"KV caches", z.runs * z.layers * T * wkv * (2.0 * f + 8.0)});
        e.parts.push_back({"residual model", (2.0 * z.vocab + 2.0 * z.layers * (wq + wkv)) * z.hidden * f});
        e.parts.push_back({"hidden states", (z.runs + 2.0) * n * z.hidden * f});
    }
    e.parts.push_back({"attention outputs", (z.runs + 1.0) * n * wq * f});
    e.parts.push_back({"per-token bookkeeping", z.runs * T * Hkv * 16.0 + n * (H * 8.0 + 64.0)});
    double masks = 0.0;
    for (const auto& m : z.block_masks)
        masks += (std::ceil(n / m.q_block) + z.segments) * std::ceil(n / m.k_block) * (96.0 + 8.0 * H);
    if (!z.block_masks.empty()) e.parts.push_back({"block masks", masks});
    return e;
}

namespace detail {
// An integer key of a params object when it is one in [lo, hi], else `fallback` (the checks of the
// params report bad values; the estimate only needs a plausible size).
inline double int_or(const json& params, const char* key, std::int64_t lo, std::int64_t hi, std::int64_t fallback) {
    const json* v = params.is_object() ? find_key(params, key) : nullptr;
    if (!v || !v->is_number_integer()) return static_cast<double>(fallback);
    const auto x = v->is_number_unsigned() ? static_cast<double>(v->get<std::uint64_t>())
                                           : static_cast<double>(v->get<std::int64_t>());
    return x >= static_cast<double>(lo) && x <= static_cast<double>(hi) ? x : static_cast<double>(fallback);
}
}  // namespace detail

// The sizes of a scenario; `runs` = 0 counts the dense reference and one run per policy (`run`),
// compare passes its number of sweep runs + 1.
inline MemorySizes memory_sizes(const Scenario& s, std::size_t runs = 0) {
    MemorySizes z;
    z.tokens = static_cast<double>(s.layout.n());
    z.segments = static_cast<double>(std::max<std::size_t>(s.layout.size(), 1));
    z.decode_steps = static_cast<double>(s.decode_steps);
    z.layers = static_cast<double>(s.model.layers);
    z.heads = static_cast<double>(s.model.heads);
    z.kv_heads = static_cast<double>(s.model.kv_heads);
    z.head_dim = static_cast<double>(s.model.head_dim);
    z.runs = static_cast<double>(runs > 0 ? runs : s.policies.size() + 1);
    if (s.source.kind == SourceKind::residual) {
        const ResidualParams def;
        z.residual = true;
        z.hidden = detail::int_or(s.source.params, "hidden", 1, 1 << 20, def.hidden);
        z.vocab = detail::int_or(s.source.params, "vocab", 2, 1 << 24, def.vocab);
    }
    bool video = false;
    for (const auto& seg : s.layout.segments()) video |= seg.kind == SegmentKind::video;
    for (std::size_t i = 0; i < s.policies.size(); ++i) {
        const auto& p = s.policies[i];
        MemorySizes::Masks m{i, 0, 0, 128, 128};
        if (p.name == "purekv") {
            if (!video) continue;  // PureKV's ST-SpAttn masks: video prompts only
            const PureKVParams def;
            m.q_default = static_cast<double>(def.q_block);
            m.k_default = static_cast<double>(def.k_block);
        } else if (p.name != "blindsight") {
            continue;
        }
        m.q_block = detail::int_or(p.params, "q_block", 1, 1 << 20, static_cast<std::int64_t>(m.q_default));
        m.k_block = detail::int_or(p.params, "k_block", 1, 1 << 20, static_cast<std::int64_t>(m.k_default));
        z.block_masks.push_back(m);
    }
    return z;
}

inline MemoryEstimate estimate_memory(const Scenario& s, std::size_t runs = 0) {
    return estimate_memory(memory_sizes(s, runs));
}

// Throws when the estimate exceeds max_memory_bytes(), naming the key that weighs most: the one whose
// value, set back to the built-in default scenario's, removes the most memory.
inline void check_memory(const Scenario& s, std::size_t runs = 0) {
    const MemorySizes z = memory_sizes(s, runs);
    const MemoryEstimate e = estimate_memory(z);
    const double limit = max_memory_bytes();
    if (e.total() <= limit) return;
    using Edit = std::function<void(MemorySizes&)>;
    auto model = [&](const char* key) {
        return s.model_from_dump ? std::string("source.dir") : std::string("model.") + key;
    };
    std::vector<std::pair<std::string, Edit>> keys = {  // each set back to the built-in default scenario's
        {s.layout_from_dump ? "source.dir" : "layout", [](MemorySizes& x) { x.tokens = std::min(x.tokens, 1222.0); }},
        {"decode_steps", [](MemorySizes& x) { x.decode_steps = std::min(x.decode_steps, 16.0); }},
        {model("layers"), [](MemorySizes& x) { x.layers = std::min(x.layers, 8.0); }},
        {model("heads"), [](MemorySizes& x) { x.heads = std::min(x.heads, 8.0); }},
        {model("kv_heads"), [](MemorySizes& x) { x.kv_heads = std::min(x.kv_heads, 4.0); }},
        {model("head_dim"), [](MemorySizes& x) { x.head_dim = std::min(x.head_dim, 128.0); }},
        {"source.params.hidden", [](MemorySizes& x) { x.hidden = std::min(x.hidden, 256.0); }},
        {"source.params.vocab", [](MemorySizes& x) { x.vocab = std::min(x.vocab, 512.0); }},
        {"policies", [](MemorySizes& x) { x.runs = std::min(x.runs, 11.0); }},
    };
    for (std::size_t k = 0; k < z.block_masks.size(); ++k) {
        const std::string at = "policies[" + std::to_string(z.block_masks[k].policy) + "].params.";
        keys.push_back({at + "q_block", [k](MemorySizes& x) {
                            auto& m = x.block_masks[k];
                            m.q_block = std::max(m.q_block, m.q_default);
                        }});
        keys.push_back({at + "k_block", [k](MemorySizes& x) {
                            auto& m = x.block_masks[k];
                            m.k_block = std::max(m.k_block, m.k_default);
                        }});
    }
    std::string best = keys[0].first;
    double best_saving = -1.0;
    for (const auto& [key, edit] : keys) {
        MemorySizes x = z;
        edit(x);
        const double saving = e.total() - estimate_memory(x).total();
        if (saving > best_saving) best = key, best_saving = saving;
    }
    char lim[32];
    std::snprintf(lim, sizeof lim, "%g GiB", limit / 1073741824.0);
    JsonWhere{s.file, best}.fail("the scenario needs an estimated " + e.str() + ", above the limit of " + lim +
                                 " (VLSPARSE_SIM_MAX_MEMORY_GIB); this key weighs most: make it smaller, or raise the "
                                 "limit");
}

// ---- parsing ---------------------------------------------------------------------------------------

// The source's kind, params and folder (their shape only; check_source_params checks the values).
inline void read_source(Scenario& s, const json& j, const JsonWhere& w) {
    check_object_keys(j, w, {"kind", "params", "dir"});
    const std::string kind = read_string(j, "kind", w, std::string("synthetic"));
    if (const auto k = ::vlsparse::enum_from_name<SourceKind>(kind)) s.source.kind = *k;
    else w.key("kind").fail("unknown source " + json_repr(j["kind"]) + ", expected \"synthetic\", \"residual\" or \"dump\"");
    if (const json* p = find_key(j, "params")) {
        if (s.source.kind == SourceKind::dump) w.key("params").fail("a dump source takes no params (only \"dir\")");
        if (!p->is_object()) w.key("params").fail("expected an object, got " + json_repr(*p));
        s.source.params = *p;
    }
    if (find_key(j, "dir")) {
        if (s.source.kind != SourceKind::dump) w.key("dir").fail("only a \"dump\" source has a folder");
    } else if (s.source.kind == SourceKind::dump) {
        w.key("dir").fail("missing (a dump source needs the folder of the dumped Q/K/V)");
    }
}

// The source's params: every key, type and range (the residual model is built for one layer).
inline void check_source_params(const Scenario& s, const JsonWhere& w) {
    if (s.source.kind == SourceKind::synthetic) {
        if (s.model.head_dim < 8)
            JsonWhere{s.file, "model.head_dim"}.fail("the synthetic source needs head_dim >= 8, got " +
                                                       std::to_string(s.model.head_dim));
        const SyntheticParams P = synthetic_params(s);  // checks every key, type and range
        if (P.version == 1 && s.decode_steps > 0)
            w.key("params").key("version").fail("version 1 generates prompts only; set decode_steps to 0 or use version 2");
    }
    if (s.source.kind == SourceKind::residual) {
        if (s.model.head_dim < 8)
            JsonWhere{s.file, "model.head_dim"}.fail("the residual source needs head_dim >= 8, got " +
                                                       std::to_string(s.model.head_dim));
        (void)residual_params(s);
    }
}

// The policies' names, labels, params and sweeps as given (check_policies checks the values).
inline void read_policies(Scenario& s, const json& j, const JsonWhere& w) {
    if (!j.is_array()) w.fail("expected an array of policies, got " + json_repr(j));
    if (j.empty()) w.fail("expected at least one policy");
    for (std::size_t i = 0; i < j.size(); ++i) {
        const JsonWhere pw = w.index(i);
        const json& e = j[i];
        if (e.is_string()) {  // shorthand: "zipvl"
            PolicySpec p;
            p.name = e.get<std::string>();
            s.policies.push_back(p);
        } else {
            check_object_keys(e, pw, {"name", "label", "params", "sweep"});
            PolicySpec p;
            p.name = read_string(e, "name", pw);
            p.label = read_string(e, "label", pw, std::string());
            if (const json* q = find_key(e, "params")) p.params = *q;
            if (const json* sw = find_key(e, "sweep")) {
                const JsonWhere sww = pw.key("sweep");
                check_object_keys(*sw, sww, {"param", "values"});
                p.sweep_param = read_string(*sw, "param", sww, std::string());
                const json* v = find_key(*sw, "values");
                if (!v) sww.key("values").fail("missing (expected a non-empty array)");
                if (!v->is_array() || v->empty()) sww.key("values").fail("expected a non-empty array, got " + json_repr(*v));
                for (std::size_t k = 0; k < v->size(); ++k) {
                    const json& x = (*v)[k];
                    if (!x.is_object() && p.sweep_param.empty())
                        sww.key("values").index(k).fail("a plain value needs \"param\" (or give an object of keys)");
                    if (!(x.is_object() || x.is_number() || x.is_string() || x.is_boolean()))
                        sww.key("values").index(k).fail("expected a number, string, boolean or object, got " + json_repr(x));
                    p.sweep_values.push_back(x);
                }
            }
            s.policies.push_back(p);
        }
    }
    // unique labels
    for (std::size_t i = 0; i < s.policies.size(); ++i) {
        auto& p = s.policies[i];
        const bool given = !p.label.empty();
        if (!given) p.label = p.name;
        int copy = 1;
        std::string base = p.label;
        for (bool clash = true; clash;) {
            clash = false;
            for (std::size_t k = 0; k < i; ++k) clash |= s.policies[k].label == p.label;
            if (clash) {
                if (given) w.index(i).key("label").fail("'" + p.label + "' is used by an earlier policy; labels must be unique");
                p.label = base + "#" + std::to_string(++copy);
            }
        }
    }
}

// Every policy and sweep value made through the registry and begun on the scenario's prompt.
inline void check_policies(const Scenario& s, const JsonWhere& w) {
    const PolicyContext ctx{s.model, s.base_dir};
    for (std::size_t i = 0; i < s.policies.size(); ++i) {
        const JsonWhere pw = w.index(i);
        const PolicySpec& p = s.policies[i];
        const PolicyInfo& info = policy_info(p.name, pw.key("name"));
        const JsonWhere prm = pw.key("params");
        AnyPolicy pol = info.make(p.params, prm, ctx);
        with_json_path(p.params, prm, [&] {
            pol.begin(s.layout, s.model);
            return 0;
        });
        // every sweep value must give valid params too
        for (std::size_t k = 0; k < p.sweep_values.size(); ++k) {
            const json q = apply_sweep_value(p.params, p.sweep_param, p.sweep_values[k]);
            const JsonWhere sv = pw.key("sweep").key("values").index(k);
            AnyPolicy sp = info.make(q, sv, ctx);
            with_json_path(q, sv, [&] {
                sp.begin(s.layout, s.model);
                return 0;
            });
        }
    }
}

// Reads a scenario from JSON. `file` names it in messages; `base_dir` resolves relative paths.
inline Scenario scenario_from_json(const json& j, const std::string& file = "", const std::filesystem::path& base_dir = {}) {
    Scenario s;
    s.file = file;
    s.base_dir = base_dir;
    const JsonWhere root{file, ""};
    check_object_keys(j, root, {"name", "description", "model", "layout", "decode_steps", "source", "policies", "backend",
                                "seed"});
    s.name = read_string(j, "name", root, std::string("scenario"));
    s.description = read_string(j, "description", root, std::string());
    // A dump source brings its own model shape, layout and decode rows: read its manifest first.
    std::optional<DumpManifest> dump;
    if (const json* src = find_key(j, "source"); src && src->is_object() && src->contains("kind") &&
                                                  (*src)["kind"] == "dump" && src->contains("dir")) {
        const JsonWhere w = root.key("source").key("dir");
        std::filesystem::path d = read_string(*src, "dir", root.key("source"));
        if (d.is_relative() && !s.base_dir.empty()) d = s.base_dir / d;
        d = std::filesystem::absolute(d).lexically_normal();
        try {
            DumpSource open(d);  // the manifest, and every layer's files or tensors present
            dump = open.manifest();
        } catch (const ::vlsparse::error& e) {
            w.fail(e.what());
        }
        s.source.dir = d.string();
    }
    // model
    constexpr std::int64_t kMaxModel = 4096;     // layers, heads, KV heads, head_dim
    constexpr std::int64_t kMaxTokens = 1 << 22;  // a prompt's tokens
    constexpr std::int64_t kMaxDecode = 1 << 16;  // decode steps
    if (dump && !find_key(j, "model")) {
        s.model = dump->shape;
        s.model_from_dump = true;
        for (const auto& [what, v] : {std::pair{"layers", s.model.layers}, std::pair{"heads", s.model.heads},
                                      std::pair{"KV heads", s.model.kv_heads}, std::pair{"head_dim", s.model.head_dim}})
            if (v > kMaxModel)
                root.key("source").key("dir").fail("the dump's model has " + std::string(what) + " = " +
                                                   std::to_string(v) + ", expected at most " + std::to_string(kMaxModel) +
                                                   " (the limit of a scenario's model)");
    } else {
        const JsonWhere w = root.key("model");
        const json* m = find_key(j, "model");
        if (!m) w.fail("missing (expected {\"layers\", \"heads\", \"kv_heads\", \"head_dim\"})");
        check_object_keys(*m, w, {"layers", "heads", "kv_heads", "head_dim"});
        s.model.layers = read_int(*m, "layers", w, 1, kMaxModel);
        s.model.heads = read_int(*m, "heads", w, 1, kMaxModel);
        s.model.kv_heads = read_int(*m, "kv_heads", w, 1, kMaxModel);
        s.model.head_dim = read_int(*m, "head_dim", w, 1, kMaxModel);
        if (s.model.heads % s.model.kv_heads != 0)
            w.key("heads").fail(std::to_string(s.model.heads) + " is not a multiple of model.kv_heads = " +
                                std::to_string(s.model.kv_heads) + " (GQA needs heads % kv_heads == 0)");
        if (dump && !(s.model == dump->shape))
            w.fail("the dump in " + s.source.dir + " is of a model with " + std::to_string(dump->shape.layers) +
                   " layers, " + std::to_string(dump->shape.heads) + " heads, " + std::to_string(dump->shape.kv_heads) +
                   " KV heads, head_dim " + std::to_string(dump->shape.head_dim) + " (omit \"model\" to use it)");
    }
    // layout
    if (dump && !find_key(j, "layout")) {
        s.layout = dump->layout;
        s.layout_from_dump = true;
        if (s.layout.n() > kMaxTokens)
            root.key("source").key("dir").fail("the dump's prompt has " + std::to_string(s.layout.n()) +
                                               " tokens, expected at most " + std::to_string(kMaxTokens) +
                                               " (the limit of a scenario's layout)");
    } else {
        const JsonWhere w = root.key("layout");
        const std::string spec = read_string(j, "layout", root);
        try {
            s.layout = Layout::parse(spec);
        } catch (const ::vlsparse::error& e) {
            w.fail(e.what());
        }
        if (dump && !(s.layout == dump->layout))
            w.fail("the dump's prompt is " + dump->layout.to_string() + " (omit \"layout\" to use it)");
        if (s.layout.n() > kMaxTokens)
            w.fail("the prompt has " + std::to_string(s.layout.n()) + " tokens, expected at most " +
                   std::to_string(kMaxTokens));
    }
    if (dump && !find_key(j, "decode_steps") && dump->decode_steps > kMaxDecode)
        root.key("decode_steps").fail("the dump holds " + std::to_string(dump->decode_steps) +
                                      " decode rows, expected at most " + std::to_string(kMaxDecode) +
                                      " (give decode_steps to use fewer)");
    s.decode_steps = read_int(j, "decode_steps", root, 0, kMaxDecode, dump ? dump->decode_steps : 0);
    if (dump && s.decode_steps > dump->decode_steps)
        root.key("decode_steps").fail(std::to_string(s.decode_steps) + " steps, but the dump holds " +
                                      std::to_string(dump->decode_steps) + " decode rows after the prompt");
    s.seed = static_cast<std::uint64_t>(read_int(j, "seed", root, 0, std::numeric_limits<std::int64_t>::max(), 1));
    s.backend = read_string(j, "backend", root, std::string("cpu"));
    if (s.backend != "cpu" && s.backend != "cuda")
        root.key("backend").fail("\"" + s.backend + "\" is not a backend, expected \"cpu\" or \"cuda\"");
#ifndef VLSPARSE_SIM_CUDA
    if (s.backend == "cuda")
        root.key("backend").fail("\"cuda\" is not available in this build (configure with -Dcuda=enabled on a machine "
                                 "with nvcc), expected \"cpu\"");
#endif
    const json* src = find_key(j, "source");
    read_source(s, src ? *src : json::object(), root.key("source"));
    const json* pol = find_key(j, "policies");
    if (!pol) root.key("policies").fail("missing (expected an array of {\"name\", \"params\"})");
    read_policies(s, *pol, root.key("policies"));
    // The sizes are known: reject what would not fit in memory before anything grows with them.
    check_memory(s);
    check_source_params(s, root.key("source"));
    check_policies(s, root.key("policies"));
    return s;
}

inline Scenario load_scenario(const std::filesystem::path& path) {
    if (std::filesystem::is_directory(path))
        throw ::vlsparse::error("scenario", path.string() + ": is a directory, expected a scenario file (.json)");
    std::ifstream f(path);
    if (!f) throw ::vlsparse::error("scenario", path.string() + ": cannot open (no such file?)");
    std::stringstream ss;
    ss << f.rdbuf();
    json j;
    try {
        j = json::parse(ss.str());
    } catch (const json::exception& e) {
        throw ::vlsparse::error("scenario", path.string() + ": invalid JSON: " + e.what());
    }
    return scenario_from_json(j, path.string(), path.parent_path());
}

// The scenario as JSON (every policy with its params as given; the effective params are in the report).
inline json to_json(const Scenario& s) {
    json pols = json::array();
    for (const auto& p : s.policies) {
        json e{{"name", p.name}, {"label", p.label}, {"params", p.params}};
        if (!p.sweep_values.empty()) {
            json sw{{"values", p.sweep_values}};
            if (!p.sweep_param.empty()) sw["param"] = p.sweep_param;
            e["sweep"] = sw;
        }
        pols.push_back(e);
    }
    json src{{"kind", std::string(to_string(s.source.kind))}};
    if (s.source.kind == SourceKind::dump) src["dir"] = s.source.dir;
    else src["params"] = s.source.params;
    return json{{"name", s.name},
                {"description", s.description},
                {"model",
                 {{"layers", s.model.layers}, {"heads", s.model.heads}, {"kv_heads", s.model.kv_heads}, {"head_dim", s.model.head_dim}}},
                {"layout", s.layout.to_string()},
                {"decode_steps", s.decode_steps},
                {"source", src},
                {"policies", pols},
                {"backend", s.backend},
                {"seed", s.seed}};
}

// The built-in default scenario (also sim/scenarios/default.json; a test keeps the two equal).
inline const char* default_scenario_text() {
    return R"json({
  "name": "default",
  "description": "Two 576-token images with text around and between them (a LLaVA-1.5-like two-image prompt), an 8-layer model with GQA (8 query heads, 4 KV heads, d = 128), synthetic attention; every policy against dense attention.",
  "model": {"layers": 8, "heads": 8, "kv_heads": 4, "head_dim": 128},
  "layout": "text:30,text:1,image:576,text:1,text:12,text:1,image:576,text:1,text:24",
  "decode_steps": 16,
  "source": {"kind": "synthetic"},
  "policies": [
    {"name": "zipvl", "params": {"tau": 0.975}},
    {"name": "avl", "params": {"rate": 0.5, "compute_rate": 0.7, "refresh_every": 3}},
    {"name": "blindsight", "params": {"template": "Document-Sink"}},
    {"name": "h2o", "params": {"heavy": 0.1, "recent": 0.1}},
    {"name": "snapkv", "params": {"capacity": 0.3}},
    {"name": "streamingllm", "params": {"sinks": 4, "recent": 0.3}},
    {"name": "fastv", "params": {"k_layer": 2, "rate": 0.5}},
    {"name": "random", "params": {"keep": 0.5}},
    {"name": "fixed_ratio", "params": {"keep": 0.5}},
    {"name": "purekv", "params": {"budget_fraction": 0.3}}
  ],
  "backend": "cpu",
  "seed": 1
}
)json";
}

inline Scenario default_scenario() { return scenario_from_json(json::parse(default_scenario_text()), "(built-in default)"); }

}  // namespace vlsparse::sim
