// vlsparse/sim/cpu_backend.hpp -- the simulator's CPU backend (sim/backend.hpp): the SIMD path on fp32,
// the library's KvCache<float>, the policies' own SIMD scoring. make_backend(name) picks a backend.
// Include: <vlsparse/sim/cpu_backend.hpp>
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "vlsparse/attention/cache_rows.hpp"
#include "vlsparse/attention/dense.hpp"
#include "vlsparse/attention/indexed_decode.hpp"
#include "vlsparse/attention/masked.hpp"
#include "vlsparse/attention/probe.hpp"
#include "vlsparse/attention/sparse.hpp"
#include "vlsparse/core/error.hpp"
#include "vlsparse/kv/kv_cache.hpp"
#include "vlsparse/sim/backend.hpp"

namespace vlsparse::sim {

namespace detail {

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace detail

class CpuBackend;

class CpuCache final : public SimCache {
public:
    CpuCache(const CpuBackend& b, std::int64_t Hkv, std::int64_t d) : b_(&b), cache_(Hkv, d) {}
    std::int64_t n_kv_heads() const override { return cache_.n_kv_heads(); }
    std::int64_t seq_len() const override { return cache_.seq_len(); }
    std::span<const std::int64_t> positions(std::int64_t g) const override { return cache_.positions(g); }
    std::int64_t element_bytes() const override { return sizeof(float); }
    void fill(std::span<const std::int64_t> seq, std::int64_t n) override;
    void keep(const TokenSelection& sel) override { cache_.keep(sel); }
    void append(const float* k, const float* v) override;
    const KvCache<float>& kv() const { return cache_; }

private:
    const CpuBackend* b_;
    KvCache<float> cache_;
};

class CpuBackend final : public SimBackend {
public:
    // round_bf16: every input (the layer's rows, the decode tokens) rounded to bf16 first, then fp32 as
    // usual: the values the CUDA backend computes on (tests compare the two).
    explicit CpuBackend(bool round_bf16 = false) : round_(round_bf16) {}
    std::string name() const override { return "cpu"; }
    std::string describe() const override { return round_ ? "CPU, SIMD path, fp32 on bf16-rounded inputs" : "CPU, SIMD path, fp32"; }
    void begin(const ModelShape& shape, std::int64_t, std::int64_t) override { shape_ = shape; }
    std::unique_ptr<SimCache> make_cache() override {
        return std::make_unique<CpuCache>(*this, shape_.kv_heads, shape_.head_dim);
    }
    SimRows set_rows(const SimRows& rows) override {
        rows_ = rows;
        if (!round_) return rows_;
        const std::int64_t H = shape_.heads, Hkv = shape_.kv_heads, d = shape_.head_dim;
        rounded(rq_, rows.q, rows.m * H * d);
        rounded(rk_, rows.k, rows.m * Hkv * d);
        rounded(rv_, rows.v, rows.m * Hkv * d);
        rows_.q = rq_.data();
        rows_.k = rk_.data();
        rows_.v = rv_.data();
        return rows_;
    }
    // fp32 -> bf16 -> fp32 (round to nearest even) when round_bf16; else x itself.
    const float* round_input(std::vector<float>& buf, const float* x, std::int64_t count) const {
        if (!round_) return x;
        rounded(buf, x, count);
        return buf.data();
    }
    PrefillScoring* scoring() override { return nullptr; }

    double dense_prefill() override {
        const auto t0 = std::chrono::steady_clock::now();
        simd::dense_attention(qv(), kv(), vv(), ov());
        return detail::seconds_since(t0);
    }
    double sparse_prefill(const TokenSelection& rows, UnselectedRows unselected) override {
        const auto t0 = std::chrono::steady_clock::now();
        simd::sparse_attention(qv(), kv(), vv(), rows, ov(), unselected);
        return detail::seconds_since(t0);
    }
    double masked_prefill(const BlockMask& mask) override {
        const auto t0 = std::chrono::steady_clock::now();
        simd::masked_attention(qv(), kv(), vv(), mask, ov());
        return detail::seconds_since(t0);
    }
    void keep_as_reference() override { ref_ = out_; }
    NmseAcc prefill_error(std::span<const std::int64_t> seq, const std::vector<std::vector<std::uint8_t>>& computed) override {
        const std::int64_t H = shape_.heads, d = shape_.head_dim, grp = H / shape_.kv_heads;
        NmseAcc e;
        for (std::int64_t i = 0; i < rows_.m; ++i) {
            const std::int64_t pos = seq[static_cast<std::size_t>(i)];
            for (std::int64_t h = 0; h < H; ++h) {
                if (!computed.empty() && !computed[static_cast<std::size_t>(h / grp)][static_cast<std::size_t>(i)]) continue;
                const float* a = out_.data() + (i * H + h) * d;
                const float* b = ref_.data() + (pos * H + h) * d;
                for (std::int64_t c = 0; c < d; ++c) e.add(a[c], b[c]);
            }
        }
        return e;
    }
    std::span<const float> prefill_output() override { return out_; }
    std::vector<std::vector<double>> last_row_mass() override {
        const std::int64_t m = rows_.m, H = shape_.heads, Hkv = shape_.kv_heads, grp = H / Hkv;
        std::vector<float> probs(static_cast<std::size_t>(H * m));
        const std::int64_t rows[1] = {m - 1};
        simd::probe_attention(qv(), kv(), std::span<const std::int64_t>(rows), View3<float>(probs.data(), {H, 1, m}));
        std::vector<std::vector<double>> mass(static_cast<std::size_t>(Hkv), std::vector<double>(static_cast<std::size_t>(m), 0.0));
        for (std::int64_t h = 0; h < H; ++h)
            for (std::int64_t j = 0; j < m; ++j)
                mass[static_cast<std::size_t>(h / grp)][static_cast<std::size_t>(j)] += probs[static_cast<std::size_t>(h * m + j)];
        return mass;
    }

    SimDecode decode(SimCache& c, const float* q, const TokenSelection& read, bool want_attention,
                     bool want_group_mass) override {
        const auto& cache = static_cast<CpuCache&>(c).kv();
        const std::int64_t H = shape_.heads, Hkv = shape_.kv_heads, d = shape_.head_dim, grp = H / Hkv;
        const CacheRows rows = rows_for_positions(cache, read);
        const auto L = static_cast<std::size_t>(rows.longest());
        std::vector<float> probs(static_cast<std::size_t>(H) * L);
        SimDecode r;
        r.out.assign(static_cast<std::size_t>(H * d), 0.0f);
        std::vector<float> qr;
        q = round_input(qr, q, H * d);
        const auto t0 = std::chrono::steady_clock::now();
        simd::indexed_decode_attention(View2<const float>(q, {H, d}), cache, rows, View2<float>(r.out.data(), {H, d}),
                                       View2<float>(probs.data(), {H, static_cast<std::int64_t>(L)}));
        r.seconds = detail::seconds_since(t0);
        if (want_attention) r.attn.resize(read.groups());
        for (std::size_t g = 0; g < r.attn.size(); ++g) {
            const auto len = read.indices[g].size();
            r.attn[g].assign(len, 0.0);
            const std::int64_t h0 = read.shared() ? 0 : static_cast<std::int64_t>(g) * grp;
            const std::int64_t h1 = read.shared() ? H : h0 + grp;
            for (std::int64_t h = h0; h < h1; ++h)
                for (std::size_t i = 0; i < len; ++i) r.attn[g][i] += probs[static_cast<std::size_t>(h) * L + i];
            for (auto& a : r.attn[g]) a /= static_cast<double>(h1 - h0);
        }
        if (want_group_mass) {
            const std::int64_t P = cache.seq_len();
            r.group_mass.assign(static_cast<std::size_t>(Hkv), std::vector<double>(static_cast<std::size_t>(P), 0.0));
            for (std::int64_t h = 0; h < H; ++h) {
                const auto& list = read.for_kv_head(h / grp);
                for (std::size_t i = 0; i < list.size(); ++i)
                    r.group_mass[static_cast<std::size_t>(h / grp)][static_cast<std::size_t>(list[i])] +=
                        probs[static_cast<std::size_t>(h) * L + i];
            }
        }
        return r;
    }

    const SimRows& rows() const { return rows_; }
    const ModelShape& shape() const { return shape_; }

private:
    View3<const float> qv() const { return {rows_.q, {rows_.m, shape_.heads, shape_.head_dim}}; }
    View3<const float> kv() const { return {rows_.k, {rows_.m, shape_.kv_heads, shape_.head_dim}}; }
    View3<const float> vv() const { return {rows_.v, {rows_.m, shape_.kv_heads, shape_.head_dim}}; }
    View3<float> ov() {
        out_.assign(static_cast<std::size_t>(rows_.m * shape_.heads * shape_.head_dim), 0.0f);
        return {out_.data(), {rows_.m, shape_.heads, shape_.head_dim}};
    }

    static void rounded(std::vector<float>& dst, const float* x, std::int64_t count) {
        dst.resize(static_cast<std::size_t>(count));
        for (std::int64_t i = 0; i < count; ++i) dst[static_cast<std::size_t>(i)] = to_float(bfloat16(x[i]));
    }

    bool round_ = false;
    ModelShape shape_;
    SimRows rows_;
    std::vector<float> out_, ref_, rq_, rk_, rv_;
};

// The layer's K/V rows at their positions (KvCache::assign with positions), as the engine always did.
inline void CpuCache::fill(std::span<const std::int64_t> seq, std::int64_t n) {
    const SimRows& r = b_->rows();
    const std::int64_t Hkv = b_->shape().kv_heads, d = b_->shape().head_dim;
    const auto m = static_cast<std::int64_t>(seq.size());
    if (m == n) {
        cache_.assign(View3<const float>(r.k, {n, Hkv, d}), View3<const float>(r.v, {n, Hkv, d}));
        return;
    }
    cache_.assign(View3<const float>(r.k, {m, Hkv, d}), View3<const float>(r.v, {m, Hkv, d}), seq, n);
}

inline void CpuCache::append(const float* k, const float* v) {
    const std::int64_t Hkv = cache_.n_kv_heads(), d = cache_.head_dim();
    std::vector<float> kr, vr;
    k = b_->round_input(kr, k, Hkv * d);
    v = b_->round_input(vr, v, Hkv * d);
    cache_.append(View2<const float>(k, {Hkv, d}), View2<const float>(v, {Hkv, d}));
}

// The backend a scenario names. "cuda" needs a build with -Dcuda=enabled.
inline std::unique_ptr<SimBackend> make_backend(const std::string& name, bool cpu_round_bf16 = false) {
    if (name == "cpu") return std::make_unique<CpuBackend>(cpu_round_bf16);
#ifdef VLSPARSE_SIM_CUDA
    if (name == "cuda") return make_cuda_backend();
    throw ::vlsparse::error("vlsparse-sim", "backend \"" + name + "\" is not available, expected \"cpu\" or \"cuda\"");
#else
    if (name == "cuda")
        throw ::vlsparse::error("vlsparse-sim", "backend \"cuda\": this vlsparse-sim was built without CUDA "
                                                "(configure with -Dcuda=enabled on a machine with nvcc)");
    throw ::vlsparse::error("vlsparse-sim", "backend \"" + name + "\" is not available, expected \"cpu\"");
#endif
}

}  // namespace vlsparse::sim
