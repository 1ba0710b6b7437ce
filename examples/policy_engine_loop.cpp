// One engine loop, every policy: the Policy interface (policies/policy.hpp) lets an engine swap
// ZipVL, A-VL, BlindSight and the baselines (H2O, SnapKV, StreamingLLM, FastV, random, fixed ratio)
// without special cases. For each policy this program runs a toy model (4 layers, random Q/K/V)
// through the prefill (the policy says what each layer's cache keeps, whether the prefill is sparse
// or masked, and which tokens stay in the sequence) and 6 decode steps (the policy says which cached
// positions each step reads, and may evict afterwards), and prints what was kept and read.
#include <cstdio>
#include <vector>

#include <vlsparse/vlsparse.hpp>

namespace vs = vlsparse;

int main() {
    const vs::ModelShape shape{4, 8, 2, 32};  // layers, query heads, KV heads, head dim
    const auto layout = vs::Layout::parse("text:12,image:96,text:6,image:64,text:14");
    const std::int64_t N = layout.n(), H = shape.heads, Hkv = shape.kv_heads, d = shape.head_dim, steps = 6;
    vs::SplitMix64 rng(11);
    auto fill = [&](std::int64_t count) {
        std::vector<float> x(static_cast<std::size_t>(count));
        for (auto& e : x) e = static_cast<float>(2.0 * rng.uniform() - 1.0);
        return x;
    };
    // The toy model's Q/K/V of every position in every layer (an engine computes them layer by layer).
    std::vector<std::vector<float>> Q, K, V;
    for (std::int64_t l = 0; l < shape.layers; ++l) {
        Q.push_back(fill(N * H * d));
        K.push_back(fill(N * Hkv * d));
        V.push_back(fill(N * Hkv * d));
    }

    vs::ZipVLParams zipvl;
    zipvl.probe_recent = zipvl.probe_random = 16;
    vs::H2OParams h2o;  // heavy 10% + recent 10% of the prompt, evicting during decode
    vs::SnapKVParams snapkv;
    snapkv.capacity = vs::TokenBudget::ratio(0.3);
    vs::StreamingLLMParams streaming;
    streaming.recent = vs::TokenBudget::tokens(60);
    std::vector<vs::AnyPolicy> policies = {
        vs::DensePolicy{}, vs::ZipVLPolicy(zipvl), vs::AvlPolicy{}, vs::BlindSightPolicy(vs::MaskTemplate::document_sink),
        vs::H2OPolicy(h2o), vs::SnapKVPolicy(snapkv), vs::StreamingLLMPolicy(streaming), vs::FastVPolicy{},
        vs::RandomPolicy{}, vs::FixedRatioPolicy{}};

    std::printf("prompt %s (%lld tokens), %lld layers, H %lld / H_kv %lld\n", layout.to_string().c_str(),
                static_cast<long long>(N), static_cast<long long>(shape.layers), static_cast<long long>(H),
                static_cast<long long>(Hkv));
    std::printf("%-13s %-26s %-12s %s\n", "policy", "cache rows after prefill", "prefill", "rows read at the last step");
    for (vs::AnyPolicy& policy : policies) {
        policy.begin(layout, shape);
        // Prefill, layer by layer. `positions`: the tokens still in the sequence.
        std::vector<std::int64_t> positions(static_cast<std::size_t>(N));
        for (std::int64_t i = 0; i < N; ++i) positions[static_cast<std::size_t>(i)] = i;
        std::vector<vs::KvCache<float>> caches;
        std::string kept_rows, prefill_kind = "dense";
        for (std::int64_t l = 0; l < shape.layers; ++l) {
            // The layer's rows: Q/K/V of the positions still in the sequence, in position order.
            const auto m = static_cast<std::int64_t>(positions.size());
            std::vector<float> q, k, v;
            for (auto p : positions) {
                q.insert(q.end(), Q[l].begin() + p * H * d, Q[l].begin() + (p + 1) * H * d);
                k.insert(k.end(), K[l].begin() + p * Hkv * d, K[l].begin() + (p + 1) * Hkv * d);
                v.insert(v.end(), V[l].begin() + p * Hkv * d, V[l].begin() + (p + 1) * Hkv * d);
            }
            const vs::PrefillDecision dec = policy.prefill(
                {&layout, shape, l, vs::View3<const float>(q.data(), {m, H, d}), vs::View3<const float>(k.data(), {m, Hkv, d}),
                 vs::View3<const float>(v.data(), {m, Hkv, d}), positions});
            // The engine's prefill attention goes here: dec.mask -> simd::masked_attention;
            // dec.sparse_prefill -> simd::sparse_attention over dec.kv; otherwise dense.
            if (dec.mask) prefill_kind = "masked";
            else if (dec.sparse_prefill) prefill_kind = "token-sparse";
            // The cache holds the layer's K/V by absolute position, then keeps what the policy says.
            // (This toy has K/V for every position; a real engine never computed the dropped rows.)
            vs::KvCache<float>& cache = caches.emplace_back(Hkv, d);
            cache.assign(vs::View3<const float>(K[l].data(), {N, Hkv, d}), vs::View3<const float>(V[l].data(), {N, Hkv, d}));
            cache.keep(dec.kv);
            kept_rows += (kept_rows.empty() ? "" : " ") + std::to_string(cache.rows(0));
            if (!dec.sequence.empty()) positions = dec.sequence;  // FastV / A-VL prefill filter
        }
        // Decode: append the token, ask which positions to read, attend, report back.
        std::size_t last_read = 0;
        for (std::int64_t t = 0; t < steps; ++t) {
            const auto qn = fill(H * d);
            for (std::int64_t l = 0; l < shape.layers; ++l) {
                vs::KvCache<float>& cache = caches[static_cast<std::size_t>(l)];
                const auto kn = fill(Hkv * d), vn = fill(Hkv * d);
                cache.append(vs::View2<const float>(kn.data(), {Hkv, d}), vs::View2<const float>(vn.data(), {Hkv, d}));
                vs::TokenSelection cached;
                cached.n = cache.seq_len();
                for (std::int64_t g = 0; g < Hkv; ++g)
                    cached.indices.emplace_back(cache.positions(g).begin(), cache.positions(g).end());
                const vs::TokenSelection read = policy.decode_read(l, t, cached);
                const vs::CacheRows rows = vs::rows_for_positions(cache, read);
                const auto L = static_cast<std::size_t>(rows.longest());
                std::vector<float> out(static_cast<std::size_t>(H * d)), probs(static_cast<std::size_t>(H) * L);
                vs::simd::indexed_decode_attention(vs::View2<const float>(qn.data(), {H, d}), cache, rows,
                                                   vs::View2<float>(out.data(), {H, d}),
                                                   vs::View2<float>(probs.data(), {H, static_cast<std::int64_t>(L)}));
                // The step's attention per read list: the mean over the query heads that read it.
                const std::int64_t heads_per_list = H / static_cast<std::int64_t>(read.groups());
                std::vector<std::vector<double>> attn(read.groups());
                for (std::size_t g = 0; g < read.groups(); ++g) {
                    attn[g].assign(read.indices[g].size(), 0.0);
                    for (std::int64_t h = static_cast<std::int64_t>(g) * heads_per_list; h < (static_cast<std::int64_t>(g) + 1) * heads_per_list; ++h)
                        for (std::size_t i = 0; i < attn[g].size(); ++i)
                            attn[g][i] += probs[static_cast<std::size_t>(h) * L + i] / static_cast<double>(heads_per_list);
                }
                if (auto keep = policy.decode_observe(l, t, read, attn)) cache.keep(*keep);
                if (l == 0) last_read = read.indices[0].size();
            }
        }
        std::printf("%-13.*s %-26s %-12s %zu of %lld\n", static_cast<int>(policy.name().size()), policy.name().data(),
                    kept_rows.c_str(), prefill_kind.c_str(), last_read, static_cast<long long>(N + steps));
    }
    return 0;
}
