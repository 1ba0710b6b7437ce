// vlsparse/sim/residual.hpp -- a fixed random "model" whose Q/K/V are projections of a residual
// stream, so that what a sparse attention changes in one layer propagates to the next.
//
// The hidden state of a token is x = [structure | content] (hidden = S + C values):
//   structure  S = 4 + D + 2M values, set by the embedding and never written by a layer:
//              bias (1), is-text, is-sink, is-heavy, a one-hot image slot (D values) and the
//              locality features of the token's 3-D position (2M values): the prompt structure of
//              the synthetic generator (synthetic.hpp), so attention is structured in every layer.
//              Positions enter here, as added position features (no RoPE): project() does not use
//              its `positions` argument except to check it.
//   content    C values: a token embedding E[token] (text), a structured random vector (visual
//              tokens; video frames are near duplicates), plus what every layer's attention adds.
// Layer l, one token, c = RMSNorm(content) (unit gain, eps = norm_eps):
//   q_h = noise * Rq_l,h^T c + planted_q(h, structure)      [d]   (h = 0 .. H-1)
//   k_g = noise * Rk_l,g^T c + planted_k(structure)          [d]   (g = 0 .. H_kv-1)
//   v_g = Rv_l,g^T c                                         [d]
//   content += residual_scale * Wo_l^T attn_out              attn_out [H*d]
// The planted parts are the synthetic generator's (same coordinates and strengths), with the head
// kinds of synthetic_head_kinds(structure, l): with content unit-norm per coordinate and Rq, Rk, Rv
// entries ~ N(0, 1/C), layer 0 has exactly the generator's statistics; deeper layers see the
// content the attention wrote. Wo entries ~ N(0, 1/(H d)), so one layer adds at most O(1) per
// content coordinate; the RMSNorm keeps the projections bounded whatever the depth.
// LM head: logits = Wlm^T RMSNorm(content), Wlm [C, vocab] ~ N(0, 1/C); the token is the argmax
// (ties: lowest index). All weights fp32, drawn from SplitMix64 streams of the seed.
// Every row is computed on its own with one fixed order of operations, so projecting m rows at
// once or one at a time gives the same bits (full recompute == incremental KV cache).
// Include: <vlsparse/sim/residual.hpp>
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "vlsparse/core/error.hpp"
#include "vlsparse/core/layout.hpp"
#include "vlsparse/core/rng.hpp"
#include "vlsparse/core/simd_arch.hpp"
#include "vlsparse/sim/model_shape.hpp"
#include "vlsparse/sim/synthetic.hpp"

namespace vlsparse::sim {

struct ResidualParams {
    std::int64_t hidden = 256;    // hidden size: structure + content
    std::int64_t vocab = 512;     // vocabulary of the embedding table and the LM head
    double residual_scale = 1.0;  // hidden += residual_scale * Wo^T attn_out
    std::uint64_t seed = 1;       // weights, prompt tokens and the prompt structure
    double norm_eps = 1e-6;       // RMSNorm epsilon
    // Head kinds, their mix and the planted strengths. n_heads, n_kv_heads, head_dim and seed are
    // taken from the shape and `seed` above; version must be 2.
    SyntheticParams structure{};
};

class ResidualModel {
public:
    ResidualModel(const ModelShape& shape, const ResidualParams& p) : shape_(shape), p_(p) {
        constexpr const char* fn = "sim::ResidualModel";
        shape.validate(fn);
        detail::require(p.vocab >= 2, fn, "vocab = ", p.vocab, ", expected >= 2");
        detail::require(std::isfinite(p.residual_scale), fn, "residual_scale = ", p.residual_scale, ", expected finite");
        detail::require(std::abs(p.residual_scale) <= 1e6, fn, "residual_scale = ", p.residual_scale,
                        ", expected -1e6 <= residual_scale <= 1e6 (larger values overflow the fp32 hidden state)");
        detail::require(std::isfinite(p.norm_eps) && p.norm_eps > 0.0, fn, "norm_eps = ", p.norm_eps, ", expected > 0");
        detail::require(p.structure.version == 2, fn, "structure.version = ", p.structure.version, ", expected 2");
        S_ = p.structure;
        S_.n_heads = shape.heads;
        S_.n_kv_heads = shape.kv_heads;
        S_.head_dim = shape.head_dim;
        S_.seed = p.seed;
        detail::validate(S_, fn);
        F_ = detail::feature_layout(shape.head_dim);
        M_ = std::min<std::int64_t>(F_.n_freq, 32);
        n_doc_ = F_.n_doc;
        struct_ = 4 + n_doc_ + 2 * M_;
        content_ = p.hidden - struct_;
        detail::require(content_ >= 16, fn, "hidden = ", p.hidden, " leaves ", content_,
                        " content values after the ", struct_, " structure values (head_dim ", shape.head_dim,
                        "), expected hidden >= ", struct_ + 16);
        freq_ = detail::locality_frequencies(S_, M_);

        const std::int64_t C = content_, Hd = shape.heads * shape.head_dim, Kd = shape.kv_heads * shape.head_dim;
        auto gauss = [&](std::vector<float>& w, std::size_t count, double sd, std::int64_t layer, std::uint64_t tag) {
            w.resize(count);
            detail::Gaussian g(detail::stream(p.seed, layer, 0, tag));
            for (auto& x : w) x = static_cast<float>(sd * g());
        };
        const double sc = 1.0 / std::sqrt(static_cast<double>(C));
        gauss(embed_, static_cast<std::size_t>(p.vocab * C), 1.0, -2, kTagEmbed);
        gauss(lm_, static_cast<std::size_t>(C * p.vocab), sc, -2, kTagLm);
        layers_.resize(static_cast<std::size_t>(shape.layers));
        for (std::int64_t l = 0; l < shape.layers; ++l) {
            Layer& L = layers_[static_cast<std::size_t>(l)];
            gauss(L.wq, static_cast<std::size_t>(C * Hd), sc, l, kTagWq);
            gauss(L.wk, static_cast<std::size_t>(C * Kd), sc, l, kTagWk);
            gauss(L.wv, static_cast<std::size_t>(C * Kd), sc, l, kTagWv);
            gauss(L.wo, static_cast<std::size_t>(Hd * C), 1.0 / std::sqrt(static_cast<double>(Hd)), l, kTagWo);
            L.heads = synthetic_head_weights(S_, l);
            L.kinds = synthetic_head_kinds(S_, l);
        }
    }

    const ModelShape& shape() const { return shape_; }
    const ResidualParams& params() const { return p_; }
    std::int64_t hidden_size() const { return p_.hidden; }
    std::int64_t vocab() const { return p_.vocab; }
    // Offsets of the two parts of a hidden row: structure [0, structure_size()), content after it.
    std::int64_t structure_size() const { return struct_; }
    std::int64_t content_size() const { return content_; }
    // The kind of every query head of `layer` (the planted pattern it mostly follows).
    const std::vector<HeadKind>& head_kinds(std::int64_t layer) const { return at(layer, "sim::ResidualModel::head_kinds").kinds; }
    // The synthetic parameters the structure follows (shape and seed filled in).
    const SyntheticParams& structure() const { return S_; }

    // The synthetic prompt's token ids: text positions get ids in [0, vocab), visual positions -1.
    std::vector<std::int64_t> prompt_tokens(const Layout& layout) const {
        const auto S = synthetic_prompt(layout, S_);
        std::vector<std::int64_t> t(static_cast<std::size_t>(S.n), -1);
        for (std::int64_t i = 0; i < S.n; ++i)
            if (!S.visual[static_cast<std::size_t>(i)]) t[static_cast<std::size_t>(i)] = prompt_token(i);
        return t;
    }

    // The prompt's initial hidden states [n, hidden].
    std::vector<float> embed_prompt(const Layout& layout) const {
        const auto S = synthetic_prompt(layout, S_);
        const std::int64_t n = S.n, D = p_.hidden, C = content_;
        std::vector<float> x(static_cast<std::size_t>(n * D), 0.0f);
        const double b = S_.video_change, a = std::sqrt(1.0 - b * b);
        for (std::int64_t i = 0; i < n; ++i) {
            const auto iu = static_cast<std::size_t>(i);
            float* row = &x[iu * static_cast<std::size_t>(D)];
            const bool visual = S.visual[iu] != 0;
            write_structure(row, !visual, S.sink[iu] != 0, S.heavy[iu] != 0, visual ? S.image[iu] : -1, &S.coord[3 * iu]);
            float* c = row + struct_;
            if (!visual) {
                const float* e = &embed_[static_cast<std::size_t>(prompt_token(i) * C)];
                std::copy(e, e + C, c);
            } else {  // a structured random vector; a video frame continues the previous one
                detail::Gaussian g(detail::stream(p_.seed, -1, i, kTagVisual));
                const std::int64_t pi = S.prev[iu];
                if (pi < 0) {
                    for (std::int64_t e = 0; e < C; ++e) c[e] = static_cast<float>(g());
                } else {
                    const float* pc = &x[static_cast<std::size_t>(pi * D + struct_)];
                    for (std::int64_t e = 0; e < C; ++e) c[e] = static_cast<float>(a * static_cast<double>(pc[e]) + b * g());
                }
            }
        }
        return x;
    }

    // The hidden state [hidden] of text token `token` at absolute position `position` (decode steps).
    std::vector<float> embed_token(std::int64_t token, std::int64_t position) const {
        constexpr const char* fn = "sim::ResidualModel::embed_token";
        detail::require(token >= 0 && token < p_.vocab, fn, "token = ", token, ", expected 0 <= token < vocab = ", p_.vocab);
        detail::require(position >= 0, fn, "position = ", position, ", expected >= 0");
        std::vector<float> x(static_cast<std::size_t>(p_.hidden), 0.0f);
        const double pos[3] = {static_cast<double>(position), static_cast<double>(position), static_cast<double>(position)};
        write_structure(x.data(), true, false, false, -1, pos);
        const float* e = &embed_[static_cast<std::size_t>(token * content_)];
        std::copy(e, e + content_, x.begin() + struct_);
        return x;
    }

    // Q [m, H, d], K and V [m, H_kv, d] of m hidden rows [m, hidden] at the given absolute positions.
    void project(std::int64_t layer, std::span<const float> hidden, std::span<const std::int64_t> positions,
                 std::vector<float>& q, std::vector<float>& k, std::vector<float>& v) const {
        constexpr const char* fn = "sim::ResidualModel::project";
        const Layer& L = at(layer, fn);
        const std::int64_t m = rows_of(hidden, fn);
        detail::require(static_cast<std::int64_t>(positions.size()) == m, fn, "positions has ", positions.size(),
                        " entries, expected one per hidden row (", m, ")");
        for (std::size_t i = 0; i < positions.size(); ++i)
            detail::require(positions[i] >= 0, fn, "positions[", i, "] = ", positions[i], ", expected >= 0");
        const std::int64_t H = shape_.heads, Hkv = shape_.kv_heads, d = shape_.head_dim, C = content_, D = p_.hidden;
        const auto c = normalized_content(hidden, m);
        q.assign(static_cast<std::size_t>(m * H * d), 0.0f);
        k.assign(static_cast<std::size_t>(m * Hkv * d), 0.0f);
        v.assign(static_cast<std::size_t>(m * Hkv * d), 0.0f);
        rows_times(c.data(), m, C, L.wq.data(), H * d, q.data());
        rows_times(c.data(), m, C, L.wk.data(), Hkv * d, k.data());
        rows_times(c.data(), m, C, L.wv.data(), Hkv * d, v.data());

        const double r4 = std::pow(static_cast<double>(d), 0.25);
        const double a_sink = std::sqrt(S_.sink) * r4, a_heavy = std::sqrt(S_.heavy) * r4;
        const double a_doc = std::sqrt(S_.document) * r4, a_loc = std::sqrt(S_.local) * r4;
        const auto noise = static_cast<float>(S_.noise);
        for (std::int64_t i = 0; i < m; ++i) {
            const float* x = &hidden[static_cast<std::size_t>(i * D)];
            const double bias = x[kBias], text = x[kText];
            for (std::int64_t g = 0; g < Hkv; ++g) {
                float* kr = &k[static_cast<std::size_t>((i * Hkv + g) * d)];
                for (std::int64_t e = 0; e < d; ++e) kr[e] *= noise;
                kr[0] += static_cast<float>(a_sink * x[kSink]);
                kr[1] += static_cast<float>(a_heavy * x[kHeavy]);
                for (std::int64_t t = 0; t < n_doc_; ++t) kr[F_.doc0 + t] += static_cast<float>(a_doc * x[kDoc + t]);
                for (std::int64_t f = 0; f < 2 * M_; ++f) kr[F_.loc0 + f] += static_cast<float>(a_loc * x[kDoc + n_doc_ + f]);
            }
            for (std::int64_t h = 0; h < H; ++h) {
                const HeadWeights& w = L.heads[static_cast<std::size_t>(h)];
                float* qr = &q[static_cast<std::size_t>((i * H + h) * d)];
                for (std::int64_t e = 0; e < d; ++e) qr[e] *= noise;
                qr[0] += static_cast<float>(w.sink * a_sink * bias);
                qr[1] += static_cast<float>(w.heavy * a_heavy * (bias + (S_.text_focus - 1.0) * text));
                for (std::int64_t t = 0; t < n_doc_; ++t)
                    qr[F_.doc0 + t] += static_cast<float>(w.document * a_doc * x[kDoc + t]);
                for (std::int64_t f = 0; f < 2 * M_; ++f)
                    qr[F_.loc0 + f] += static_cast<float>(w.local * a_loc * x[kDoc + n_doc_ + f]);
            }
        }
    }

    // hidden [m, hidden] += residual_scale * Wo^T attn_out, attn_out [m, H, d] (the content part only).
    void update(std::int64_t layer, std::span<float> hidden, std::span<const float> attn_out) const {
        constexpr const char* fn = "sim::ResidualModel::update";
        const Layer& L = at(layer, fn);
        const std::int64_t m = rows_of(std::span<const float>(hidden.data(), hidden.size()), fn);
        const std::int64_t Hd = shape_.heads * shape_.head_dim, C = content_, D = p_.hidden;
        detail::require(static_cast<std::int64_t>(attn_out.size()) == m * Hd, fn, "attn_out has ", attn_out.size(),
                        " values, expected m * H * d = ", m, " * ", shape_.heads, " * ", shape_.head_dim, " = ", m * Hd);
        for (std::size_t i = 0; i < attn_out.size(); ++i)
            detail::require(std::isfinite(attn_out[i]), fn, "attn_out[", i, "] = ", attn_out[i],
                            ", expected finite values");
        std::vector<float> delta(static_cast<std::size_t>(m * C));
        rows_times(attn_out.data(), m, Hd, L.wo.data(), C, delta.data());
        const auto s = static_cast<float>(p_.residual_scale);
        for (std::int64_t i = 0; i < m; ++i) {
            float* c = &hidden[static_cast<std::size_t>(i * D + struct_)];
            const float* dl = &delta[static_cast<std::size_t>(i * C)];
            for (std::int64_t e = 0; e < C; ++e) c[e] += s * dl[e];
        }
    }

    // The LM head's logits [vocab] of one hidden row.
    std::vector<float> logits(std::span<const float> hidden_row) const {
        constexpr const char* fn = "sim::ResidualModel::logits";
        detail::require(static_cast<std::int64_t>(hidden_row.size()) == p_.hidden, fn, "hidden_row has ",
                        hidden_row.size(), " values, expected hidden = ", p_.hidden);
        const auto c = normalized_content(hidden_row, 1);
        std::vector<float> out(static_cast<std::size_t>(p_.vocab));
        rows_times(c.data(), 1, content_, lm_.data(), p_.vocab, out.data());
        return out;
    }

    // The LM head's token: argmax of logits (ties: lowest index).
    std::int64_t lm_head(std::span<const float> hidden_row) const {
        const auto z = logits(hidden_row);
        std::int64_t best = 0;
        for (std::int64_t t = 1; t < p_.vocab; ++t)
            if (z[static_cast<std::size_t>(t)] > z[static_cast<std::size_t>(best)]) best = t;
        return best;
    }

private:
    struct Layer {
        std::vector<float> wq, wk, wv, wo;  // [C, H d], [C, H_kv d], [C, H_kv d], [H d, C]
        std::vector<HeadWeights> heads;
        std::vector<HeadKind> kinds;
    };
    enum : std::uint64_t { kTagEmbed = 101, kTagLm, kTagWq, kTagWk, kTagWv, kTagWo, kTagToken, kTagVisual };
    enum : std::int64_t { kBias = 0, kText = 1, kSink = 2, kHeavy = 3, kDoc = 4 };

    const Layer& at(std::int64_t layer, const char* fn) const {
        detail::require(layer >= 0 && layer < shape_.layers, fn, "layer = ", layer, ", expected 0 <= layer < ",
                        shape_.layers);
        return layers_[static_cast<std::size_t>(layer)];
    }

    std::int64_t rows_of(std::span<const float> hidden, const char* fn) const {
        const auto D = static_cast<std::size_t>(p_.hidden);
        detail::require(!hidden.empty() && hidden.size() % D == 0, fn, "hidden has ", hidden.size(),
                        " values, expected a positive multiple of hidden = ", D);
        for (std::size_t i = 0; i < hidden.size(); ++i)
            detail::require(std::isfinite(hidden[i]), fn, "hidden[", i / D, ", ", i % D, "] = ", hidden[i],
                            ", expected finite values");
        return static_cast<std::int64_t>(hidden.size() / D);
    }

    std::int64_t prompt_token(std::int64_t i) const {
        SplitMix64 r = detail::stream(p_.seed, -1, i, kTagToken);
        return static_cast<std::int64_t>(r.below(static_cast<std::uint64_t>(p_.vocab)));
    }

    void write_structure(float* row, bool text, bool sink, bool heavy, std::int64_t image, const double* pos) const {
        row[kBias] = 1.0f;
        row[kText] = text ? 1.0f : 0.0f;
        row[kSink] = sink ? 1.0f : 0.0f;
        row[kHeavy] = heavy ? 1.0f : 0.0f;
        if (image >= 0) row[kDoc + image % n_doc_] = 1.0f;
        std::vector<double> phi(static_cast<std::size_t>(2 * M_));
        detail::locality_features(freq_, pos, phi.data());
        for (std::int64_t f = 0; f < 2 * M_; ++f) row[kDoc + n_doc_ + f] = static_cast<float>(phi[static_cast<std::size_t>(f)]);
    }

    // RMSNorm of the content part of m rows: [m, C].
    std::vector<float> normalized_content(std::span<const float> hidden, std::int64_t m) const {
        const std::int64_t C = content_, D = p_.hidden;
        std::vector<float> c(static_cast<std::size_t>(m * C));
        for (std::int64_t i = 0; i < m; ++i) {
            const float* x = &hidden[static_cast<std::size_t>(i * D + struct_)];
            double ss = 0.0;
            for (std::int64_t e = 0; e < C; ++e) ss += static_cast<double>(x[e]) * x[e];
            const double inv = 1.0 / std::sqrt(ss / static_cast<double>(C) + p_.norm_eps);
            for (std::int64_t e = 0; e < C; ++e) c[static_cast<std::size_t>(i * C + e)] = static_cast<float>(x[e] * inv);
        }
        return c;
    }

    // out [m, N] = x [m, K] * W [K, N] with xsimd, in tiles of up to 4 rows that share each loaded
    // row of W. Every output element is fma(x[i,k], W[k,j], acc) for k = 0 .. K-1 in order from 0,
    // the same operations whatever m and the tiling are, so a row's result does not depend on the
    // other rows (projecting m rows at once or one at a time gives the same bits).
    template <int R>
    static void rows_tile(const float* x, std::int64_t K, const float* W, std::int64_t N, float* out) {
        using batch = xsimd::batch<float, ::vlsparse::simd::native_arch>;
        constexpr std::int64_t B = static_cast<std::int64_t>(batch::size);
        std::int64_t c = 0;
        for (; c + 2 * B <= N; c += 2 * B) {
            batch a0[R], a1[R];
            for (int r = 0; r < R; ++r) a0[r] = a1[r] = batch(0.0f);
            for (std::int64_t k = 0; k < K; ++k) {
                const batch w0 = batch::load_unaligned(W + k * N + c), w1 = batch::load_unaligned(W + k * N + c + B);
                for (int r = 0; r < R; ++r) {
                    const batch xr(x[r * K + k]);
                    a0[r] = xsimd::fma(xr, w0, a0[r]);
                    a1[r] = xsimd::fma(xr, w1, a1[r]);
                }
            }
            for (int r = 0; r < R; ++r) {
                a0[r].store_unaligned(out + r * N + c);
                a1[r].store_unaligned(out + r * N + c + B);
            }
        }
        for (; c + B <= N; c += B) {
            batch a0[R];
            for (int r = 0; r < R; ++r) a0[r] = batch(0.0f);
            for (std::int64_t k = 0; k < K; ++k) {
                const batch w0 = batch::load_unaligned(W + k * N + c);
                for (int r = 0; r < R; ++r) a0[r] = xsimd::fma(batch(x[r * K + k]), w0, a0[r]);
            }
            for (int r = 0; r < R; ++r) a0[r].store_unaligned(out + r * N + c);
        }
        for (; c < N; ++c)
            for (int r = 0; r < R; ++r) {
                float a = 0.0f;
                for (std::int64_t k = 0; k < K; ++k) a = std::fma(x[r * K + k], W[k * N + c], a);
                out[r * N + c] = a;
            }
    }
    static void rows_times(const float* x, std::int64_t m, std::int64_t K, const float* W, std::int64_t N, float* out) {
        const std::int64_t tiles = (m + 3) / 4;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (m * K * N > (1 << 22))
#endif
        for (std::int64_t t = 0; t < tiles; ++t) {
            const std::int64_t i = 4 * t;
            switch (std::min<std::int64_t>(4, m - i)) {
                case 4: rows_tile<4>(x + i * K, K, W, N, out + i * N); break;
                case 3: rows_tile<3>(x + i * K, K, W, N, out + i * N); break;
                case 2: rows_tile<2>(x + i * K, K, W, N, out + i * N); break;
                default: rows_tile<1>(x + i * K, K, W, N, out + i * N); break;
            }
        }
    }

    ModelShape shape_;
    ResidualParams p_;
    SyntheticParams S_;
    detail::FeatureLayout F_;
    std::int64_t M_ = 0, n_doc_ = 0, struct_ = 0, content_ = 0;
    std::vector<double> freq_;
    std::vector<float> embed_, lm_;  // [vocab, C], [C, vocab]
    std::vector<Layer> layers_;
};

}  // namespace vlsparse::sim
