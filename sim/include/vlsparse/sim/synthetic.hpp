// vlsparse/sim/synthetic.hpp -- a deterministic generator of structured Q/K/V for one layer.
//
// Random Q/K/V give near-uniform attention, nothing like a VLM's. This generator plants the
// patterns the papers report, each as a logit contribution in known units (the scaled dot product
// scale * q.k, scale = 1/sqrt(d)), for query i, key j and query head h:
//
//   sink      + w_sink(h)  * sink      if j is a sink: token 0, the first `image_sinks` tokens of
//                                      every image / video, every delimiter (a text segment of
//                                      length 1, e.g. <image_start>) and the token after it
//   heavy     + w_heavy(h) * heavy * f if j is a planted heavy hitter (`heavy_fraction` of each
//                                      image's tokens, in heavy_patch x heavy_patch patches on a
//                                      grid); f = text_focus for text queries (the question), else 1
//   document  + w_doc(h)   * document  if i and j are visual tokens of the same image / video
//   local     + w_local(h) * local * exp(-|p_i - p_j|^2 / (2 local_radius^2))   (approximately)
//   noise     N(0, noise^2) per coordinate of q and k: a diffuse background
//
// p_i is a token's 3-D position (t, row, col), like Qwen2-VL's M-RoPE: a text token at position i
// has (i, i, i); token (row r, col c) of frame f of a visual segment starting at s has
// (s + f * video_time_scale, s + r, s + c) (no grid: r = c = index within the frame). So a local
// head attends to the 2-D neighbourhood of an image token, and in a video also to the same place in
// the previous frames. The kernel uses random Fourier features: coordinates cos/sin(w_m . p) / sqrt(M)
// with w_m ~ N(0, I / local_radius^2), whose dot product is mean_m cos(w_m . (p_i - p_j)).
//
// Video frames are near duplicates: the random parts (q, k noise and v) of a token in frame f >= 1
// are a * x(same slot, frame f-1) + video_change * z with a = sqrt(1 - video_change^2); heavy
// hitters sit at the same slots in every frame.
//
// Head kinds. Every query head has one dominant kind (HeadKind) whose weight w is 1; the weights of
// the others are uniform in [0, minor_weight]; a diffuse head has only minor weights. Per layer,
// round(p * H) heads are diffuse, p = diffuse_layer0 / diffuse_layer1 / diffuse_later (early layers
// are mostly diffuse: ZipVL Fig. 3, FastV "after layer 2"); the others are split between sink,
// heavy, local and document by the shares (largest remainders), then the kinds are shuffled over
// the heads. `head_kinds` fixes them instead. SyntheticLayer::head_kind says which head is which.
// The MODEL (each (layer, head)'s kind and its minor weights) is drawn from `model_seed` when it is
// >= 0 and from `seed` otherwise (the default, -1, keeps the generator of before bit for bit); the
// PROMPT content (q/k noise, V, heavy-hitter places, locality frequencies) always from `seed`. So
// several prompts of one model are seeds s, s+1, ... with one model_seed: the head roles stay, the
// content changes (what `characterize` does).
// KV heads carry every planted key feature at full strength; the query heads choose.
//
// Coordinates of a head's d (d >= 8): 0 sink, 1 heavy, 2 .. 2+D document (one per image, image
// index mod D, D = clamp((d-2)/6, 1, 8)), then 2M locality features (M = min(48, (d-2-D)/2)), the
// rest noise only; planted amplitudes are multiplied by d^(1/4) so that scale * q.k is their product.
// Everything derives from SplitMix64 streams keyed by (seed, layer, token), so a run is
// reproducible bit for bit, and the prompt's rows do not depend on how many decode rows follow.
//
// version = 1 reproduces, bit for bit, the generator of vlsparse <= 0.1 (1-D locality, no document
// heads, no video structure), which made the committed golden files. It reads sink, heavy,
// heavy_fraction, text_focus, local, noise, minor_weight and diffuse_*: keep their defaults. It
// runs the frozen copy of that generator in <vlsparse/reference/golden_synthetic.hpp>.
// Include: <vlsparse/sim/synthetic.hpp>
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <span>
#include <vector>

#include "vlsparse/core/dtype.hpp"
#include "vlsparse/core/enum_names.hpp"
#include "vlsparse/core/error.hpp"
#include "vlsparse/core/layout.hpp"
#include "vlsparse/core/rng.hpp"
#include "vlsparse/reference/golden_synthetic.hpp"

namespace vlsparse::sim {

// What a query head mostly does.
enum class HeadKind : std::uint8_t { diffuse, sink, local, heavy, document };

inline constexpr std::array<HeadKind, 5> kHeadKinds = {HeadKind::diffuse, HeadKind::sink, HeadKind::local,
                                                       HeadKind::heavy, HeadKind::document};

inline constexpr ::vlsparse::EnumName<HeadKind> kHeadKindNames[] = {{HeadKind::diffuse, "diffuse"},
                                                                     {HeadKind::sink, "sink"},
                                                                     {HeadKind::local, "local"},
                                                                     {HeadKind::heavy, "heavy"},
                                                                     {HeadKind::document, "document"}};
constexpr std::span<const ::vlsparse::EnumName<HeadKind>> enum_names(HeadKind) { return kHeadKindNames; }
constexpr std::string_view to_string(HeadKind k) { return ::vlsparse::enum_name(k); }

// "diffuse", "sink", "local", "heavy" or "document"; anything else throws vlsparse::error.
inline HeadKind parse_head_kind(std::string_view s) {
    if (const auto k = ::vlsparse::enum_from_name<HeadKind>(s)) return *k;
    throw ::vlsparse::error("sim::parse_head_kind",
                            ::vlsparse::concat("unknown head kind '", s, "', expected ",
                                                       ::vlsparse::enum_name_list<HeadKind>()));
}

struct SyntheticParams {
    std::int64_t n_heads = 8, n_kv_heads = 8, head_dim = 128;
    // Logit contributions (units of scale * q.k) for a head whose dominant kind this is.
    double sink = 16.0;            // a sink key
    double heavy = 8.0;            // a heavy-hitter key
    double text_focus = 1.25;      // text queries weigh heavy hitters this much more
    double local = 10.0;           // the key at the query's own 3-D position
    double document = 6.0;         // a key of the query's own image
    double noise = 0.7;            // per-coordinate std of the random part of q and k (logit std ~ noise^2)
    double minor_weight = 0.25;    // weights of a head's non-dominant kinds are uniform in [0, this]
    // Where the patterns sit.
    double heavy_fraction = 0.02;  // share of each image's (each frame's) tokens that are heavy hitters
    std::int64_t heavy_patch = 2;  // heavy hitters come in patches of this side on images with a grid
    std::int64_t image_sinks = 1;  // the first tokens of every image / video that are sinks
    bool delimiter_sinks = true;   // text segments of length 1 and the token after each are sinks
    double local_radius = 1.5;     // length scale of the locality kernel, in tokens
    double video_change = 0.1;     // per-frame innovation of a video token's random part, in [0, 1]
    double video_time_scale = 0.25;  // distance between consecutive frames in the 3-D position
    // Head mix. Probability that a head is diffuse, by layer: layer 0, layer 1, later layers.
    double diffuse_layer0 = 0.6, diffuse_layer1 = 0.3, diffuse_later = 0.03;
    // Relative shares of the other kinds (need not sum to 1).
    double share_sink = 0.30, share_heavy = 0.25, share_local = 0.30, share_document = 0.15;
    std::vector<HeadKind> head_kinds;  // non-empty: the kind of every query head (size n_heads), all layers
    std::int64_t model_seed = -1;      // >= 0: head kinds and weights (the model) from this seed; -1: from seed
    int version = 2;                   // 1: the generator of vlsparse <= 0.1, bit for bit (golden files)
    std::uint64_t seed = 1;
};

// One layer's Q [n, H, d], K and V [n, H_kv, d], token-major, in fp32.
struct SyntheticLayer {
    std::int64_t n = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
    std::int64_t n_prompt = 0;        // rows [0, n_prompt) are the prompt, [n_prompt, n) decode tokens
    std::vector<float> q, k, v;
    std::vector<std::uint8_t> heavy;  // [n] 1 where the token is a planted heavy hitter
    std::vector<std::uint8_t> sink;   // [n] 1 where the token is a planted sink
    std::vector<HeadKind> head_kind;  // [n_heads] the dominant kind of each query head
};

// The prompt-level structure (the same in every layer).
struct SyntheticPrompt {
    std::int64_t n = 0, n_prompt = 0;  // rows; the last n - n_prompt are decode (text) tokens
    std::vector<std::uint8_t> sink, heavy, visual;  // [n] flags
    std::vector<std::int64_t> image;  // [n] index of the token's image / video among the visual segments; -1: text
    std::vector<std::int64_t> prev;   // [n] the same slot in the previous video frame; -1 elsewhere
    std::vector<double> coord;        // [n, 3] the 3-D position (t, row, col)
};

// The weights of one query head (see the header comment).
struct HeadWeights {
    double sink = 0.0, heavy = 0.0, local = 0.0, document = 0.0;
};

namespace detail {

using ::vlsparse::require;

inline double gaussian(SplitMix64& rng) {  // Box-Muller (version 1)
    const double u1 = (static_cast<double>(rng.next() >> 11) + 0.5) * 0x1.0p-53;
    const double u2 = static_cast<double>(rng.next() >> 11) * 0x1.0p-53;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// The SplitMix64 output function, used to derive independent streams from keys.
inline std::uint64_t mix64(std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Stream tags.
enum : std::uint64_t { kTagQ = 1, kTagK, kTagV, kTagKinds, kTagWeights, kTagHeavy, kTagFreq };

// An independent stream for (seed, layer, index, tag); layer -1 for prompt-level draws.
inline SplitMix64 stream(std::uint64_t seed, std::int64_t layer, std::int64_t index, std::uint64_t tag) {
    std::uint64_t h = mix64(seed + 0x9E3779B97F4A7C15ull);
    h = mix64(h ^ (static_cast<std::uint64_t>(layer) + 0x632BE59BD9B4E019ull));
    h = mix64(h ^ (static_cast<std::uint64_t>(index) + 0x8CB92BA72F3D8DD7ull));
    h = mix64(h ^ (tag * 0xD1B54A32D192ED03ull));
    return SplitMix64(h);
}

// Standard normal draws, two per Box-Muller transform.
class Gaussian {
public:
    explicit Gaussian(SplitMix64 rng) : rng_(rng) {}
    double operator()() {
        if (has_) {
            has_ = false;
            return second_;
        }
        const double u1 = (static_cast<double>(rng_.next() >> 11) + 0.5) * 0x1.0p-53;
        const double u2 = static_cast<double>(rng_.next() >> 11) * 0x1.0p-53;
        const double r = std::sqrt(-2.0 * std::log(u1)), a = 6.283185307179586 * u2;
        second_ = r * std::sin(a);
        has_ = true;
        return r * std::cos(a);
    }

private:
    SplitMix64 rng_;
    double second_ = 0.0;
    bool has_ = false;
};

// Where the planted features sit in a head's d coordinates (version 2).
struct FeatureLayout {
    std::int64_t doc0 = 2, n_doc = 1;  // document coordinates [doc0, doc0 + n_doc)
    std::int64_t loc0 = 3, n_freq = 1;  // locality coordinates [loc0, loc0 + 2 n_freq)
};
inline FeatureLayout feature_layout(std::int64_t d) {
    FeatureLayout F;
    F.n_doc = std::clamp<std::int64_t>((d - 2) / 6, 1, 8);
    F.loc0 = F.doc0 + F.n_doc;
    F.n_freq = std::min<std::int64_t>(48, (d - F.loc0) / 2);
    return F;
}

inline void validate(const SyntheticParams& P, const char* fn) {
    const std::int64_t H = P.n_heads, Hkv = P.n_kv_heads, d = P.head_dim;
    require(P.version == 1 || P.version == 2, fn, "version = ", P.version, ", expected 1 or 2");
    require(d >= 8, fn, "head_dim = ", d, ", expected >= 8");
    require(H > 0 && Hkv > 0 && H % Hkv == 0, fn, "heads ", H, " / KV heads ", Hkv, ", expected H % H_kv == 0");
    if (P.version == 1) return;  // version 1 checks nothing else, as before
    // Strengths, noise and scales up to 1e6: far beyond any useful value, and small enough that the
    // fp32 Q/K (and their dot products over d <= 4096) stay finite.
    constexpr double kMaxStrength = 1e6;
    auto nonneg = [&](double x, const char* name) {
        require(std::isfinite(x) && x >= 0.0, fn, name, " = ", x, ", expected a finite value >= 0");
        require(x <= kMaxStrength, fn, name, " = ", x, ", expected at most ", kMaxStrength,
                " (larger values overflow the fp32 Q/K)");
    };
    auto unit = [&](double x, const char* name) {
        require(std::isfinite(x) && x >= 0.0 && x <= 1.0, fn, name, " = ", x, ", expected 0 <= ", name, " <= 1");
    };
    nonneg(P.sink, "sink");
    nonneg(P.heavy, "heavy");
    nonneg(P.text_focus, "text_focus");
    nonneg(P.local, "local");
    nonneg(P.document, "document");
    nonneg(P.noise, "noise");
    nonneg(P.video_time_scale, "video_time_scale");
    unit(P.minor_weight, "minor_weight");
    unit(P.heavy_fraction, "heavy_fraction");
    unit(P.video_change, "video_change");
    unit(P.diffuse_layer0, "diffuse_layer0");
    unit(P.diffuse_layer1, "diffuse_layer1");
    unit(P.diffuse_later, "diffuse_later");
    nonneg(P.share_sink, "share_sink");
    nonneg(P.share_heavy, "share_heavy");
    nonneg(P.share_local, "share_local");
    nonneg(P.share_document, "share_document");
    require(P.share_sink + P.share_heavy + P.share_local + P.share_document > 0.0, fn,
            "the shares of sink, heavy, local and document heads are all 0, expected a positive sum");
    require(std::isfinite(P.local_radius) && P.local_radius > 0.0, fn, "local_radius = ", P.local_radius,
            ", expected > 0");
    require(P.local_radius >= 1.0 / kMaxStrength && P.local_radius <= kMaxStrength, fn, "local_radius = ",
            P.local_radius, ", expected ", 1.0 / kMaxStrength, " <= local_radius <= ", kMaxStrength,
            " (the locality frequencies are 1 / local_radius: beyond these they overflow)");
    require(P.heavy_patch >= 1, fn, "heavy_patch = ", P.heavy_patch, ", expected >= 1");
    require(P.image_sinks >= 0, fn, "image_sinks = ", P.image_sinks, ", expected >= 0");
    require(P.head_kinds.empty() || static_cast<std::int64_t>(P.head_kinds.size()) == H, fn, "head_kinds has ",
            P.head_kinds.size(), " entries, expected 0 (use the mix) or n_heads = ", H);
}

// The generator of vlsparse <= 0.1 (SyntheticParams::version = 1): the frozen copy the golden files
// are built from (<vlsparse/reference/golden_synthetic.hpp>), fed with the parameters it knows.
inline SyntheticLayer synthetic_layer_v1(const Layout& layout, const SyntheticParams& P, std::int64_t layer) {
    golden::SyntheticParams G;
    G.n_heads = P.n_heads;
    G.n_kv_heads = P.n_kv_heads;
    G.head_dim = P.head_dim;
    G.sink = P.sink;
    G.heavy = P.heavy;
    G.heavy_fraction = P.heavy_fraction;
    G.text_focus = P.text_focus;
    G.local = P.local;
    G.noise = P.noise;
    G.minor_weight = P.minor_weight;
    G.diffuse_layer0 = P.diffuse_layer0;
    G.diffuse_layer1 = P.diffuse_layer1;
    G.diffuse_later = P.diffuse_later;
    G.seed = P.seed;
    auto g = golden::synthetic_layer(layout, G, layer);
    SyntheticLayer L;
    L.n = L.n_prompt = g.n;
    L.n_heads = g.n_heads;
    L.n_kv_heads = g.n_kv_heads;
    L.head_dim = g.head_dim;
    L.q = std::move(g.q);
    L.k = std::move(g.k);
    L.v = std::move(g.v);
    L.heavy = std::move(g.heavy);
    L.sink = std::move(g.sink);
    return L;
}

// The random Fourier frequencies of the locality kernel: [M, 3], w ~ N(0, I / local_radius^2).
inline std::vector<double> locality_frequencies(const SyntheticParams& P, std::int64_t M) {
    Gaussian g(stream(P.seed, -1, 0, kTagFreq));
    std::vector<double> w(static_cast<std::size_t>(3 * M));
    for (auto& x : w) x = g() / P.local_radius;
    return w;
}

// The 2M locality features of 3-D position p (cos then sin per frequency, / sqrt(M)).
inline void locality_features(const std::vector<double>& freq, const double* p, double* out) {
    const auto M = static_cast<std::int64_t>(freq.size() / 3);
    const double inv = 1.0 / std::sqrt(static_cast<double>(M));
    for (std::int64_t m = 0; m < M; ++m) {
        const double* w = &freq[static_cast<std::size_t>(3 * m)];
        const double a = w[0] * p[0] + w[1] * p[1] + w[2] * p[2];
        out[2 * m] = std::cos(a) * inv;
        out[2 * m + 1] = std::sin(a) * inv;
    }
}

}  // namespace detail

// The prompt-level structure of `layout` followed by `decode_tokens` text tokens (version 2):
// sinks, heavy hitters, image index, previous-frame slot and 3-D position of every token.
inline SyntheticPrompt synthetic_prompt(const Layout& layout, const SyntheticParams& P, std::int64_t decode_tokens = 0) {
    constexpr const char* fn = "sim::synthetic_prompt";
    detail::validate(P, fn);
    detail::require(layout.n() > 0, fn, "empty layout, expected at least one token");
    detail::require(decode_tokens >= 0, fn, "decode_tokens = ", decode_tokens, ", expected >= 0");
    SyntheticPrompt S;
    S.n_prompt = layout.n();
    S.n = S.n_prompt + decode_tokens;
    const auto n = static_cast<std::size_t>(S.n);
    S.sink.assign(n, 0);
    S.heavy.assign(n, 0);
    S.visual.assign(n, 0);
    S.image.assign(n, -1);
    S.prev.assign(n, -1);
    S.coord.assign(3 * n, 0.0);
    for (std::int64_t i = 0; i < S.n; ++i)  // text default: (i, i, i)
        for (int a = 0; a < 3; ++a) S.coord[static_cast<std::size_t>(3 * i + a)] = static_cast<double>(i);
    S.sink[0] = 1;

    std::int64_t image = 0;
    const auto& segs = layout.segments();
    for (std::size_t si = 0; si < segs.size(); ++si) {
        const Segment& s = segs[si];
        if (!s.is_visual()) {
            if (P.delimiter_sinks && s.length == 1) {
                S.sink[static_cast<std::size_t>(s.start)] = 1;
                if (s.end() < S.n_prompt) S.sink[static_cast<std::size_t>(s.end())] = 1;
            }
            continue;
        }
        const std::int64_t tpf = s.kind == SegmentKind::video ? s.tokens_per_frame : s.length;
        const std::int64_t frames = s.length / tpf;
        const bool grid = s.grid_h > 0 && s.grid_w > 0;
        for (std::int64_t j = 0; j < s.length; ++j) {
            const auto i = static_cast<std::size_t>(s.start + j);
            const std::int64_t f = j / tpf, u = j % tpf;
            const std::int64_t r = grid ? u / s.grid_w : u, c = grid ? u % s.grid_w : u;
            S.visual[i] = 1;
            S.image[i] = image;
            if (f > 0) S.prev[i] = static_cast<std::int64_t>(i) - tpf;
            if (j < P.image_sinks) S.sink[i] = 1;
            S.coord[3 * i + 0] = static_cast<double>(s.start) + static_cast<double>(f) * P.video_time_scale;
            S.coord[3 * i + 1] = static_cast<double>(s.start + r);
            S.coord[3 * i + 2] = static_cast<double>(s.start + c);
        }
        // Heavy hitters: the same slots in every frame; never a sink slot.
        const std::int64_t first_free = std::min(P.image_sinks, tpf);
        const std::int64_t free = tpf - first_free;
        const std::int64_t target =
            std::min<std::int64_t>(free, P.heavy_fraction > 0.0
                                             ? std::max<std::int64_t>(1, std::llround(P.heavy_fraction * static_cast<double>(tpf)))
                                             : 0);
        std::vector<std::uint8_t> slot(static_cast<std::size_t>(tpf), 0);
        SplitMix64 rng = detail::stream(P.seed, -1, image, detail::kTagHeavy);
        if (target > 0 && grid && P.heavy_patch > 1) {
            std::int64_t marked = 0;
            const std::int64_t side = P.heavy_patch;
            for (std::int64_t tries = 0; marked < target && tries < 64 * tpf; ++tries) {
                const auto r0 = static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(s.grid_h)));
                const auto c0 = static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(s.grid_w)));
                for (std::int64_t r = r0; r < std::min(r0 + side, s.grid_h) && marked < target; ++r)
                    for (std::int64_t c = c0; c < std::min(c0 + side, s.grid_w) && marked < target; ++c) {
                        const std::int64_t u = r * s.grid_w + c;
                        if (u >= first_free && !slot[static_cast<std::size_t>(u)]) {
                            slot[static_cast<std::size_t>(u)] = 1;
                            ++marked;
                        }
                    }
            }
            // A grid this crowded (target close to every free slot) completes in slot order.
            for (std::int64_t u = first_free; u < tpf && marked < target; ++u)
                if (!slot[static_cast<std::size_t>(u)]) {
                    slot[static_cast<std::size_t>(u)] = 1;
                    ++marked;
                }
        } else if (target > 0) {
            for (auto u : sample_without_replacement(free, target, rng)) slot[static_cast<std::size_t>(first_free + u)] = 1;
        }
        for (std::int64_t f = 0; f < frames; ++f)
            for (std::int64_t u = 0; u < tpf; ++u)
                if (slot[static_cast<std::size_t>(u)]) S.heavy[static_cast<std::size_t>(s.start + f * tpf + u)] = 1;
        ++image;
    }
    return S;
}

// The seed of the model-level draws (head kinds and weights): model_seed when given, else seed.
inline std::uint64_t synthetic_model_seed(const SyntheticParams& P) {
    return P.model_seed >= 0 ? static_cast<std::uint64_t>(P.model_seed) : P.seed;
}

// The kind of every query head in `layer` (version 2; see the header comment).
inline std::vector<HeadKind> synthetic_head_kinds(const SyntheticParams& P, std::int64_t layer) {
    constexpr const char* fn = "sim::synthetic_head_kinds";
    detail::validate(P, fn);
    detail::require(layer >= 0, fn, "layer = ", layer, ", expected >= 0");
    if (!P.head_kinds.empty()) return P.head_kinds;
    const std::int64_t H = P.n_heads;
    const double p = layer == 0 ? P.diffuse_layer0 : layer == 1 ? P.diffuse_layer1 : P.diffuse_later;
    const std::int64_t n_diffuse = std::min<std::int64_t>(H, std::llround(p * static_cast<double>(H)));
    const std::int64_t rest = H - n_diffuse;
    const std::array<HeadKind, 4> kinds = {HeadKind::sink, HeadKind::heavy, HeadKind::local, HeadKind::document};
    const std::array<double, 4> share = {P.share_sink, P.share_heavy, P.share_local, P.share_document};
    const double total = share[0] + share[1] + share[2] + share[3];
    std::array<std::int64_t, 4> count{};
    std::array<double, 4> remainder{};
    std::int64_t given = 0;
    for (int c = 0; c < 4; ++c) {
        const double quota = share[static_cast<std::size_t>(c)] / total * static_cast<double>(rest);
        count[static_cast<std::size_t>(c)] = static_cast<std::int64_t>(std::floor(quota));
        remainder[static_cast<std::size_t>(c)] = quota - std::floor(quota);
        given += count[static_cast<std::size_t>(c)];
    }
    while (given < rest) {  // largest remainder first; ties in the order sink, heavy, local, document
        int best = 0;
        for (int c = 1; c < 4; ++c)
            if (remainder[static_cast<std::size_t>(c)] > remainder[static_cast<std::size_t>(best)]) best = c;
        ++count[static_cast<std::size_t>(best)];
        remainder[static_cast<std::size_t>(best)] = -1.0;
        ++given;
    }
    std::vector<HeadKind> out(static_cast<std::size_t>(n_diffuse), HeadKind::diffuse);
    for (int c = 0; c < 4; ++c) out.insert(out.end(), static_cast<std::size_t>(count[static_cast<std::size_t>(c)]), kinds[static_cast<std::size_t>(c)]);
    SplitMix64 rng = detail::stream(synthetic_model_seed(P), layer, 0, detail::kTagKinds);
    for (std::int64_t i = H - 1; i > 0; --i)  // Fisher-Yates
        std::swap(out[static_cast<std::size_t>(i)], out[static_cast<std::size_t>(rng.below(static_cast<std::uint64_t>(i + 1)))]);
    return out;
}

// The weights of every query head in `layer`: 1 for its kind, uniform in [0, minor_weight] otherwise.
inline std::vector<HeadWeights> synthetic_head_weights(const SyntheticParams& P, std::int64_t layer) {
    const auto kinds = synthetic_head_kinds(P, layer);
    std::vector<HeadWeights> w(kinds.size());
    for (std::size_t h = 0; h < kinds.size(); ++h) {
        SplitMix64 rng = detail::stream(synthetic_model_seed(P), layer, static_cast<std::int64_t>(h), detail::kTagWeights);
        w[h].sink = P.minor_weight * rng.uniform();
        w[h].heavy = P.minor_weight * rng.uniform();
        w[h].local = P.minor_weight * rng.uniform();
        w[h].document = P.minor_weight * rng.uniform();
        switch (kinds[h]) {
            case HeadKind::sink: w[h].sink = 1.0; break;
            case HeadKind::heavy: w[h].heavy = 1.0; break;
            case HeadKind::local: w[h].local = 1.0; break;
            case HeadKind::document: w[h].document = 1.0; break;
            case HeadKind::diffuse: break;
        }
    }
    return w;
}

// One layer of structured Q/K/V for `layout`, followed by `decode_tokens` text tokens (decode
// steps, positions layout.n() ...). The prompt's rows are the same whatever decode_tokens is.
inline SyntheticLayer synthetic_layer(const Layout& layout, const SyntheticParams& P, std::int64_t layer,
                                      std::int64_t decode_tokens = 0) {
    constexpr const char* fn = "sim::synthetic_layer";
    detail::validate(P, fn);
    detail::require(layer >= 0, fn, "layer = ", layer, ", expected >= 0");
    if (P.version == 1) {
        detail::require(decode_tokens == 0, fn, "decode_tokens = ", decode_tokens,
                        ", version 1 generates prompts only (expected 0)");
        return detail::synthetic_layer_v1(layout, P, layer);
    }
    const SyntheticPrompt S = synthetic_prompt(layout, P, decode_tokens);
    const std::int64_t n = S.n, H = P.n_heads, Hkv = P.n_kv_heads, d = P.head_dim;
    const auto F = detail::feature_layout(d);
    const auto freq = detail::locality_frequencies(P, F.n_freq);
    const auto W = synthetic_head_weights(P, layer);

    SyntheticLayer L;
    L.n = n;
    L.n_prompt = S.n_prompt;
    L.n_heads = H;
    L.n_kv_heads = Hkv;
    L.head_dim = d;
    L.q.resize(static_cast<std::size_t>(n * H * d));
    L.k.resize(static_cast<std::size_t>(n * Hkv * d));
    L.v.resize(static_cast<std::size_t>(n * Hkv * d));
    L.heavy = S.heavy;
    L.sink = S.sink;
    L.head_kind = synthetic_head_kinds(P, layer);

    // 1. Unit random parts; a video token continues its slot of the previous frame (AR(1)).
    const double b = P.video_change, a = std::sqrt(1.0 - b * b);
    // Every row draws from its own stream, so rows are independent -- except a video row, which reads
    // its slot's row of the previous frame: rows without one in parallel, then those in row order
    // (the same values whatever the thread count).
    auto fill = [&](std::vector<float>& x, std::int64_t width, std::uint64_t tag) {
        auto row_of = [&](std::int64_t i) {
            detail::Gaussian g(detail::stream(P.seed, layer, i, tag));
            float* row = &x[static_cast<std::size_t>(i * width)];
            const std::int64_t p = S.prev[static_cast<std::size_t>(i)];
            if (p < 0) {
                for (std::int64_t e = 0; e < width; ++e) row[e] = static_cast<float>(g());
            } else {
                const float* pr = &x[static_cast<std::size_t>(p * width)];
                for (std::int64_t e = 0; e < width; ++e)
                    row[e] = static_cast<float>(a * static_cast<double>(pr[e]) + b * g());
            }
        };
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
        for (std::int64_t i = 0; i < n; ++i)
            if (S.prev[static_cast<std::size_t>(i)] < 0) row_of(i);
        for (std::int64_t i = 0; i < n; ++i)
            if (S.prev[static_cast<std::size_t>(i)] >= 0) row_of(i);
    };
    fill(L.q, H * d, detail::kTagQ);
    fill(L.k, Hkv * d, detail::kTagK);
    fill(L.v, Hkv * d, detail::kTagV);

    // 2. Scale the noise and add the planted features.
    const double r4 = std::pow(static_cast<double>(d), 0.25);  // scale*q.k = (a r4)(b r4)/sqrt(d) = a b
    const double a_sink = std::sqrt(P.sink) * r4, a_heavy = std::sqrt(P.heavy) * r4;
    const double a_doc = std::sqrt(P.document) * r4, a_loc = std::sqrt(P.local) * r4;
    // Row by row, each row on its own (in parallel).
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (std::int64_t i = 0; i < n; ++i) {
        std::vector<double> phi(static_cast<std::size_t>(2 * F.n_freq));
        const auto iu = static_cast<std::size_t>(i);
        detail::locality_features(freq, &S.coord[3 * iu], phi.data());
        const bool visual = S.visual[iu] != 0;
        const std::int64_t doc = visual ? F.doc0 + S.image[iu] % F.n_doc : -1;
        for (std::int64_t g = 0; g < Hkv; ++g) {
            float* kr = &L.k[static_cast<std::size_t>((i * Hkv + g) * d)];
            for (std::int64_t c = 0; c < d; ++c) {
                double x = P.noise * static_cast<double>(kr[c]);
                if (c == 0 && S.sink[iu]) x += a_sink;
                if (c == 1 && S.heavy[iu]) x += a_heavy;
                if (c == doc) x += a_doc;
                if (c >= F.loc0 && c < F.loc0 + 2 * F.n_freq) x += a_loc * phi[static_cast<std::size_t>(c - F.loc0)];
                kr[c] = static_cast<float>(x);
            }
        }
        const double focus = visual ? 1.0 : P.text_focus;
        for (std::int64_t h = 0; h < H; ++h) {
            const HeadWeights& w = W[static_cast<std::size_t>(h)];
            float* qr = &L.q[static_cast<std::size_t>((i * H + h) * d)];
            for (std::int64_t c = 0; c < d; ++c) {
                double x = P.noise * static_cast<double>(qr[c]);
                if (c == 0) x += w.sink * a_sink;
                if (c == 1) x += w.heavy * focus * a_heavy;
                if (c == doc) x += w.document * a_doc;
                if (c >= F.loc0 && c < F.loc0 + 2 * F.n_freq)
                    x += w.local * a_loc * phi[static_cast<std::size_t>(c - F.loc0)];
                qr[c] = static_cast<float>(x);
            }
        }
    }
    return L;
}

}  // namespace vlsparse::sim
