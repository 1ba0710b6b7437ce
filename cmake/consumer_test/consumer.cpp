// The CMake consumer of .ci/consumer: dense causal attention on a few tokens, the SIMD path against
// the exact reference, both from the installed headers found through find_package(vlsparse).
#include <cmath>
#include <cstdio>
#include <vector>

#include <vlsparse/reference/attention.hpp>
#include <vlsparse/vlsparse.hpp>

int main() {
    const std::int64_t n = 5, H = 4, Hkv = 2, d = 16;
    std::vector<float> q(static_cast<std::size_t>(n * H * d)), k(static_cast<std::size_t>(n * Hkv * d)),
        v(k.size()), out_simd(q.size()), out_ref(q.size());
    vlsparse::SplitMix64 rng(7);
    for (auto* buf : {&q, &k, &v})
        for (auto& x : *buf) x = static_cast<float>(rng.uniform() - 0.5);
    const vlsparse::View3<const float> qv(q.data(), {n, H, d}), kv(k.data(), {n, Hkv, d}), vv(v.data(), {n, Hkv, d});
    vlsparse::simd::dense_attention(qv, kv, vv, vlsparse::View3<float>(out_simd.data(), {n, H, d}));
    vlsparse::reference::dense_attention(qv, kv, vv, vlsparse::View3<float>(out_ref.data(), {n, H, d}));
    double err = 0.0;
    for (std::size_t i = 0; i < q.size(); ++i) err = std::fmax(err, std::fabs(out_simd[i] - out_ref[i]));
    std::printf("vlsparse %s through find_package: max |simd - reference| = %.2e\n", VLSPARSE_VERSION_STRING, err);
    return err < 1e-5 ? 0 : 1;
}
