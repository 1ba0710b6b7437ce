// vlsparse-sim: the project's main job. This first version runs ZipVL layer by layer over a
// built-in structured scenario (one high-resolution image between two text segments) and reports,
// per layer, what ZipVL keeps and what it saves against dense attention. The scenario engine
// (JSON scenarios, every policy, reports) grows from here.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <vlsparse/vlsparse.hpp>
#include <vlsparse/sim/synthetic.hpp>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace {

struct Options {
    std::string layout = "text:35,image:2880,text:22";
    std::int64_t layers = 6, heads = 8, kv_heads = 8, head_dim = 128, decode_steps = 4;
    double tau = 0.975;
    std::uint64_t seed = 1;
    bool per_kv_head = false;
};

void usage() {
    std::puts(
        "usage: vlsparse-sim [run] [options]\n"
        "\n"
        "Runs ZipVL (adaptive ratio + normalized scores + token-sparse prefill + KV eviction) layer by\n"
        "layer over a synthetic VLM prompt and compares it with dense attention.\n"
        "\n"
        "options:\n"
        "  --layout SPEC       prompt layout (default text:35,image:2880,text:22)\n"
        "  --layers N          layers (default 6)\n"
        "  --heads H           query heads (default 8)\n"
        "  --kv-heads K        KV heads, H % K == 0 (default 8)\n"
        "  --head-dim D        head dimension >= 8 (default 128)\n"
        "  --tau T             retained attention mass, 0 < T <= 1 (default 0.975)\n"
        "  --per-kv-head       one kept set per KV head instead of per layer\n"
        "  --decode-steps N    decode steps after the prefill (default 4)\n"
        "  --seed S            seed of the synthetic Q/K/V and of the probes (default 1)\n"
        "  -h, --help          this text");
}

bool parse(int argc, char** argv, Options& o) {
    int i = 1;
    if (i < argc && std::strcmp(argv[i], "run") == 0) ++i;
    for (; i < argc; ++i) {
        const std::string a = argv[i];
        auto value = [&](const char* name) -> std::string {
            if (i + 1 >= argc) throw vlsparse::error("vlsparse-sim", std::string(name) + " needs a value");
            return argv[++i];
        };
        auto integer = [&](const char* name) {
            const std::string v = value(name);
            char* end = nullptr;
            const long long x = std::strtoll(v.c_str(), &end, 10);
            if (end == v.c_str() || *end) throw vlsparse::error("vlsparse-sim", std::string(name) + ": '" + v + "' is not an integer");
            return static_cast<std::int64_t>(x);
        };
        if (a == "-h" || a == "--help") { usage(); return false; }
        else if (a == "--layout") o.layout = value("--layout");
        else if (a == "--layers") o.layers = integer("--layers");
        else if (a == "--heads") o.heads = integer("--heads");
        else if (a == "--kv-heads") o.kv_heads = integer("--kv-heads");
        else if (a == "--head-dim") o.head_dim = integer("--head-dim");
        else if (a == "--decode-steps") o.decode_steps = integer("--decode-steps");
        else if (a == "--seed") o.seed = static_cast<std::uint64_t>(integer("--seed"));
        else if (a == "--tau") {
            const std::string v = value("--tau");
            char* end = nullptr;
            o.tau = std::strtod(v.c_str(), &end);
            if (end == v.c_str() || *end) throw vlsparse::error("vlsparse-sim", "--tau: '" + v + "' is not a number");
        } else if (a == "--per-kv-head") o.per_kv_head = true;
        else throw vlsparse::error("vlsparse-sim", "unknown argument '" + a + "' (see --help)");
    }
    if (o.layers < 1) throw vlsparse::error("vlsparse-sim", "--layers must be >= 1");
    if (o.decode_steps < 0) throw vlsparse::error("vlsparse-sim", "--decode-steps must be >= 0");
    return true;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double nmse_rows(const std::vector<float>& a, const std::vector<float>& b, std::int64_t H, std::int64_t d,
                 const std::vector<std::int64_t>& rows) {
    double num = 0.0, den = 0.0;
    for (auto i : rows)
        for (std::int64_t x = 0; x < H * d; ++x) {
            const double e = a[static_cast<std::size_t>(i * H * d + x)], r = b[static_cast<std::size_t>(i * H * d + x)];
            num += (e - r) * (e - r);
            den += r * r;
        }
    return den > 0 ? num / den : 0.0;
}

}  // namespace

int main(int argc, char** argv) try {
    Options o;
    if (!parse(argc, argv, o)) return 0;
    const auto layout = vlsparse::Layout::parse(o.layout);
    const std::int64_t n = layout.n(), H = o.heads, Hkv = o.kv_heads, d = o.head_dim;
    vlsparse::ZipVLParams P;
    P.tau = o.tau;
    P.seed = o.seed;
    if (o.per_kv_head) P.grouping = vlsparse::ZipVLGrouping::kv_head;
    vlsparse::sim::SyntheticParams S;
    S.n_heads = H;
    S.n_kv_heads = Hkv;
    S.head_dim = d;
    S.seed = o.seed;
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    std::printf("vlsparse-sim %s: ZipVL on a synthetic prompt\n", VLSPARSE_VERSION_STRING);
    std::printf("  layout  %s  (n = %lld: %lld text, %lld image, %lld video tokens)\n", layout.to_string().c_str(),
                static_cast<long long>(n), static_cast<long long>(layout.count(vlsparse::SegmentKind::text)),
                static_cast<long long>(layout.count(vlsparse::SegmentKind::image)),
                static_cast<long long>(layout.count(vlsparse::SegmentKind::video)));
    std::printf("  model   %lld layers, H = %lld, H_kv = %lld, d = %lld; tau = %.3f, probes %lld recent + %lld random, %s\n",
                static_cast<long long>(o.layers), static_cast<long long>(H), static_cast<long long>(Hkv),
                static_cast<long long>(d), P.tau, static_cast<long long>(P.probe_recent),
                static_cast<long long>(P.probe_random), o.per_kv_head ? "per KV head" : "layer-wise");
    std::printf("  threads %d\n\n", threads);

    std::printf("%5s %6s %7s %9s %11s %12s %10s %11s %9s %9s\n", "layer", "p", "kept", "mass kept", "attn FLOPs",
                "KV bytes", "NMSE kept", "NMSE decode", "dense ms", "zipvl ms");
    std::printf("%5s %6s %7s %9s %11s %12s %10s %11s %9s %9s\n", "", "", "", "(probes)", "vs dense", "vs dense",
                "rows", "", "", "");
    double sum_dense_ms = 0, sum_zip_ms = 0, sum_flops_dense = 0, sum_flops_zip = 0, sum_kv_dense = 0, sum_kv_zip = 0;
    double sum_ratio = 0;
    const auto t_all = std::chrono::steady_clock::now();
    for (std::int64_t layer = 0; layer < o.layers; ++layer) {
        const auto L = vlsparse::sim::synthetic_layer(layout, S, layer);
        const vlsparse::View3<const float> q(L.q.data(), {n, H, d}), k(L.k.data(), {n, Hkv, d}), v(L.v.data(), {n, Hkv, d});
        std::vector<float> dense(static_cast<std::size_t>(n * H * d)), sparse(dense.size());
        auto t0 = std::chrono::steady_clock::now();
        vlsparse::simd::dense_attention(q, k, v, vlsparse::View3<float>(dense.data(), {n, H, d}));
        const double dense_ms = 1e3 * seconds_since(t0);
        vlsparse::KvCache<float> cache(Hkv, d);
        t0 = std::chrono::steady_clock::now();
        const auto sel = vlsparse::simd::zipvl_prefill_layer(q, k, v, layout, layer, P,
                                                             vlsparse::View3<float>(sparse.data(), {n, H, d}), cache);
        const double zip_ms = 1e3 * seconds_since(t0);

        // Mass retained: share of the probes' attention that falls on kept tokens.
        double kept_mass = 0, all_mass = 0;
        for (std::int64_t g = 0; g < sel.groups(); ++g) {
            const auto& a = sel.accumulated[static_cast<std::size_t>(g)];
            for (double x : a) all_mass += x;
            for (auto j : sel.selection.indices[static_cast<std::size_t>(g)]) kept_mass += a[static_cast<std::size_t>(j)];
        }
        // Exact causal (q, k) pairs: dense n(n+1)/2 per head; sparse |T|(|T|+1)/2 per head of the group,
        // plus the probe rows' pairs; 4 d FLOPs per pair (QK^T and PV).
        const double pairs_dense = static_cast<double>(H) * static_cast<double>(n) * static_cast<double>(n + 1) / 2.0;
        double pairs_zip = 0;
        for (std::int64_t h = 0; h < H; ++h) {
            const double t = static_cast<double>(sel.selection.for_kv_head(h / (H / Hkv)).size());
            pairs_zip += t * (t + 1) / 2.0;
            for (auto p : sel.probes) pairs_zip += static_cast<double>(p + 1) / 2.0;  // QK^T only: half the cost
        }
        const double kv_dense = static_cast<double>(n * Hkv * d * 2 * 4);
        const double kv_zip = static_cast<double>(cache.kv_bytes());
        // Decode: the same new tokens against the compressed and the full cache.
        vlsparse::KvCache<float> full(Hkv, d);
        full.assign(k, v);
        double dec_num = 0, dec_den = 0;
        for (std::int64_t step = 0; step < o.decode_steps; ++step) {
            const auto next = vlsparse::sim::synthetic_layer(vlsparse::Layout::text_only(1), [&] {
                auto s2 = S;
                s2.seed = S.seed * 1000003 + static_cast<std::uint64_t>(layer * 131 + step);
                return s2;
            }(), 0);
            const vlsparse::View2<const float> kn(next.k.data(), {Hkv, d}), vn(next.v.data(), {Hkv, d}),
                qn(next.q.data(), {H, d});
            cache.append(kn, vn);
            full.append(kn, vn);
            std::vector<float> a(static_cast<std::size_t>(H * d)), b(a.size());
            vlsparse::simd::decode_attention(qn, cache, vlsparse::View2<float>(a.data(), {H, d}));
            vlsparse::simd::decode_attention(qn, full, vlsparse::View2<float>(b.data(), {H, d}));
            for (std::size_t x = 0; x < a.size(); ++x) {
                dec_num += (a[x] - b[x]) * (a[x] - b[x]);
                dec_den += b[x] * b[x];
            }
        }
        const double nmse = nmse_rows(sparse, dense, H, d, sel.selection.indices[0]);
        std::printf("%5lld %6lld %6.1f%% %8.1f%% %10.1f%% %11.1f%% %10.2e %11.2e %9.1f %9.1f\n",
                    static_cast<long long>(layer), static_cast<long long>(sel.p[0]), 100.0 * sel.kept_ratio(),
                    100.0 * kept_mass / all_mass, 100.0 * pairs_zip / pairs_dense, 100.0 * kv_zip / kv_dense, nmse,
                    dec_den > 0 ? dec_num / dec_den : 0.0, dense_ms, zip_ms);
        sum_dense_ms += dense_ms;
        sum_zip_ms += zip_ms;
        sum_flops_dense += pairs_dense;
        sum_flops_zip += pairs_zip;
        sum_kv_dense += kv_dense;
        sum_kv_zip += kv_zip;
        sum_ratio += sel.kept_ratio();
    }
    std::printf("\nsummary over %lld layers:\n", static_cast<long long>(o.layers));
    std::printf("  kept tokens          %.1f%% of %lld (mean over layers)\n", 100.0 * sum_ratio / static_cast<double>(o.layers),
                static_cast<long long>(n));
    std::printf("  prefill attention    %.1f%% of the dense FLOPs (probes included)\n", 100.0 * sum_flops_zip / sum_flops_dense);
    std::printf("  KV cache             %.1f MiB instead of %.1f MiB (%.1f%%)\n", sum_kv_zip / 1048576.0,
                sum_kv_dense / 1048576.0, 100.0 * sum_kv_zip / sum_kv_dense);
    std::printf("  measured time        zipvl %.0f ms vs dense %.0f ms (%.2fx), %d thread(s)\n", sum_zip_ms,
                sum_dense_ms, sum_dense_ms / sum_zip_ms, threads);
    std::printf("  wall time            %.1f s\n", seconds_since(t_all));
    std::printf("\nNMSE kept rows: prefill output of the kept tokens vs dense attention (rows outside the kept\n"
                "set are zero by design: the residual stream carries them). NMSE decode: decode outputs over\n"
                "the compressed cache vs the full cache.\n");
    return 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "vlsparse-sim: error: %s\n", e.what());
    return 2;
}
