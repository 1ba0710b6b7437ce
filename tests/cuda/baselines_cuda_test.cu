// CUDA baselines' scores (vlsparse/cuda/baselines.cuh: H2O, SnapKV, FastV / A-VL) against the reference
// on identical inputs and against the golden/baselines files: bf16 and fp16 (tensor cores), fp32 and
// d = 256 (CUDA cores), GQA 1 / 4 / 8, both groupings, avg / max / no pooling, n not a multiple of the
// tiles. The scorer's workspace is poisoned (0xff) before each checked call. Scores must agree to 1e-4
// relative (fp32 on the GPU, double in the reference); the kept sets of the golden cases (built with no
// near tie at the cut, except the documented tie cases) must match exactly.
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <vlsparse/core/rng.hpp>
#include <vlsparse/cuda/baselines.cuh>
#include <vlsparse/reference/baselines.hpp>
#include <vlsparse/reference/baselines_golden.hpp>

#include "../test_core.hpp"
#include "row_lse.hpp"

using namespace vlsparse;
using Catch::Matchers::Contains;

namespace {

// Relative, scores (fp32 on the GPU).
constexpr double kTol = vt::tolerance(vt::TestBackend::cuda, vt::Metric::score_rel);

void check_close(const std::vector<double>& got, const std::vector<double>& want, const char* what) {
    REQUIRE(got.size() == want.size());
    double mx = 0.0;
    for (double x : want) mx = std::max(mx, std::abs(x));
    for (std::size_t i = 0; i < got.size(); ++i) {
        INFO(what << "[" << i << "] = " << got[i] << ", reference " << want[i]);
        REQUIRE(std::abs(got[i] - want[i]) <= kTol * (std::abs(want[i]) + 1e-3 * mx));
    }
}
void check_close(const std::vector<std::vector<double>>& got, const std::vector<std::vector<double>>& want,
                 const char* what) {
    REQUIRE(got.size() == want.size());
    for (std::size_t g = 0; g < got.size(); ++g) check_close(got[g], want[g], what);
}

template <class T>
std::vector<T> random_values(std::size_t count, double spread, SplitMix64& rng) {
    std::vector<T> v(count);
    for (auto& x : v) x = from_float<T>(static_cast<float>(spread * (2.0 * rng.uniform() - 1.0)));
    return v;
}

template <class T>
void random_case(std::int64_t n, std::int64_t H, std::int64_t Hkv, std::int64_t d, std::uint64_t seed, cuda::BaselineScorer& sc) {
    SplitMix64 rng(seed);
    const auto q = random_values<T>(static_cast<std::size_t>(n * H * d), 2.0, rng);
    const auto k = random_values<T>(static_cast<std::size_t>(n * Hkv * d), 1.0, rng);
    const View3<const T> qh(q.data(), {n, H, d}), kh(k.data(), {n, Hkv, d});
    cuda::DeviceArray<T> qd(q), kd(k);
    const View3<const T> qv(qd.data(), {n, H, d}), kv(kd.data(), {n, Hkv, d});
    INFO("n " << n << " H " << H << " H_kv " << Hkv << " d " << d << " seed " << seed);
    for (auto groups : {BaselineGroups::kv_head, BaselineGroups::layer}) {
        const auto want = reference::h2o_scores(qh, kh, groups);
        // The automatic probe path (on Hopper, wgmma with per-head chunks for H2O's every-row probes), then
        // wgmma's merged chunk layout forced (vlsparse/cuda/selection/probe_columns.cuh).
        for (int path : {0, 2}) {
            INFO("probe path " << path);
            cuda::detail::probe_path_override().store(path);
            sc.h2o_scores(qv, kv, groups);
            sc.fill_workspace(0xff);
            check_close(sc.h2o_scores(qv, kv, groups), want, "h2o");
        }
        cuda::detail::probe_path_override().store(0);
        const std::int64_t w = std::min<std::int64_t>(n, 1 + static_cast<std::int64_t>(seed % 17));
        const auto raw = reference::snapkv_window_scores(qh, kh, w, groups);
        // The automatic path (for up to 16 rows per KV head, 16-bit inputs and d <= 128, the few-row
        // kernel), then mma.sync forced.
        for (int path : {0, 1}) {
            INFO("probe path " << path);
            cuda::detail::probe_path_override().store(path);
            sc.fill_workspace(0xff);
            check_close(sc.snapkv_window_scores(qv, kv, w, groups), raw, "snapkv window");
        }
        cuda::detail::probe_path_override().store(0);
        for (auto pool : {SnapKVPooling::avg, SnapKVPooling::max, SnapKVPooling::none}) {
            SnapKVParams P;
            P.window = w;
            P.kernel = 5;
            P.pooling = pool;
            P.groups = groups;
            P.capacity = TokenBudget::tokens(std::max<std::int64_t>(w, n / 2));
            std::vector<std::vector<double>> pooled;
            for (const auto& s : raw) pooled.push_back(reference::snapkv_pool(s, P.kernel, P.pooling));
            const auto got = sc.snapkv_pooled_scores(qv, kv, P);
            check_close(got, pooled, "snapkv pooled");
            // The selection is the CPU's code on these scores.
            REQUIRE(sc.snapkv_select(qv, kv, P).indices == snapkv_select_from_pooled(got, n, P).indices);
        }
    }
    const auto fastv_want = reference::fastv_scores(qh, kh);
    for (int path : {0, 1}) {  // (the few-row kernel where it applies, then mma.sync)
        INFO("probe path " << path);
        cuda::detail::probe_path_override().store(path);
        sc.fill_workspace(0xff);
        check_close(sc.fastv_scores(qv, kv), fastv_want, "fastv");
    }
    cuda::detail::probe_path_override().store(0);
}

}  // namespace

TEST_CASE("cuda baselines: H2O, SnapKV and FastV scores against the reference", "[cuda][baselines]") {
    cuda::BaselineScorer sc;
    std::uint64_t seed = 20261123u;
    for (std::int64_t n : {1, 37, 200, 777}) {
        random_case<bfloat16>(n, 8, 2, 64, ++seed, sc);
        random_case<vlsparse::half>(n, 4, 4, 128, ++seed, sc);
        random_case<bfloat16>(n, 8, 1, 40, ++seed, sc);
        random_case<float>(n, 4, 2, 32, ++seed, sc);
    }
    random_case<bfloat16>(150, 4, 2, 256, ++seed, sc);  // d = 256: CUDA cores
}

TEST_CASE("cuda baselines: the golden/baselines cases (scores and kept sets)", "[cuda][baselines][golden]") {
    namespace fs = std::filesystem;
    const char* env = std::getenv("VLSPARSE_GOLDEN_DIR");
    const fs::path root = fs::path(env ? env : "golden") / "baselines";
    REQUIRE(fs::is_directory(root));
    cuda::BaselineScorer sc;
    int checked = 0;
    for (const auto& e : fs::directory_iterator(root)) {
        if (!e.is_directory()) continue;
        GoldenManifest m;
        const auto c = golden::read_baselines_inputs(e.path(), &m);
        if (c.baseline != "h2o" && c.baseline != "snapkv" && c.baseline != "fastv") continue;
        INFO("case " << e.path().filename().string());
        auto run = [&](auto tag) {
            using T = decltype(tag);
            const auto q = golden::detail::narrow<T>(c.q), k = golden::detail::narrow<T>(c.k);
            cuda::DeviceArray<T> qd(q), kd(k);
            const View3<const T> qv(qd.data(), {c.n, c.H, c.d}), kv(kd.data(), {c.n, c.Hkv, c.d});
            auto out = [&](const char* name) { return read_tensor(e.path(), m.output(name)); };
            auto rows = [&](const std::vector<double>& flat, std::int64_t G) {
                std::vector<std::vector<double>> r(static_cast<std::size_t>(G));
                const auto L = static_cast<std::int64_t>(flat.size()) / G;
                for (std::int64_t g = 0; g < G; ++g) r[static_cast<std::size_t>(g)].assign(flat.begin() + g * L, flat.begin() + (g + 1) * L);
                return r;
            };
            auto mask = [&](const TokenSelection& s, std::int64_t width) { return golden::detail::mask_of(s, width); };
            if (c.baseline == "h2o") {
                const H2OParams P = h2o_params_from_json(c.params, "params.");
                const auto want = out("scores").template to_vector<double>();
                const auto G = static_cast<std::int64_t>(want.size()) / c.n;
                const auto got = sc.h2o_scores(qv, kv, P.groups);
                check_close(got, rows(want, G), "h2o scores");
                REQUIRE(mask(h2o_select_from_scores(got, P), c.n) == out("kept_mask").template to_vector<std::uint8_t>());
                REQUIRE(sc.h2o_select(qv, kv, P).indices == h2o_select_from_scores(got, P).indices);
                sc.fill_workspace(0xff);
                REQUIRE(mask(sc.h2o_device_select(qv, kv, P).to_host(), c.n) == out("kept_mask").template to_vector<std::uint8_t>());
            } else if (c.baseline == "snapkv") {
                const SnapKVParams P = snapkv_params_from_json(c.params, "params.");
                const auto raw = out("window_scores").template to_vector<double>();
                const auto pooled = out("pooled").template to_vector<double>();
                const auto G = static_cast<std::int64_t>(raw.size()) / (c.n - P.window);
                check_close(sc.snapkv_window_scores(qv, kv, P.window, P.groups), rows(raw, G), "snapkv window");
                const auto got = sc.snapkv_pooled_scores(qv, kv, P);
                check_close(got, rows(pooled, G), "snapkv pooled");
                REQUIRE(mask(sc.snapkv_select(qv, kv, P), c.n) == out("kept_mask").template to_vector<std::uint8_t>());
                sc.fill_workspace(0xff);
                REQUIRE(mask(sc.snapkv_device_select(qv, kv, P).to_host(), c.n) == out("kept_mask").template to_vector<std::uint8_t>());
            } else {
                const FastVParams P = fastv_params_from_json(c.params, "params.");
                check_close(sc.fastv_scores(qv, kv), out("scores").template to_vector<double>(), "fastv scores");
                REQUIRE(mask(sc.fastv_select(qv, kv, c.layout, P), c.n) == out("sequence_mask").template to_vector<std::uint8_t>());
                sc.fill_workspace(0xff);
                REQUIRE(mask(sc.fastv_device_select(qv, kv, c.layout, P).to_host(), c.n) ==
                        out("sequence_mask").template to_vector<std::uint8_t>());
            }
            ++checked;
        };
        if (c.dtype == "fp32") run(float{});
        else if (c.dtype == "fp16") run(vlsparse::half{});
        else run(bfloat16{});
    }
    REQUIRE(checked >= 5);
}

TEST_CASE("cuda baselines: errors", "[cuda][baselines]") {
    cuda::BaselineScorer sc;
    const std::int64_t n = 64, H = 4, Hkv = 2, d = 64;
    std::vector<bfloat16> q(static_cast<std::size_t>(n * H * d), bfloat16(0.5f)), k(static_cast<std::size_t>(n * Hkv * d), bfloat16(0.25f));
    cuda::DeviceArray<bfloat16> qd(q), kd(k);
    const View3<const bfloat16> qv(qd.data(), {n, H, d}), kv(kd.data(), {n, Hkv, d});
    REQUIRE_NOTHROW(sc.fastv_scores(qv, kv));
    REQUIRE_THROWS_WITH(sc.snapkv_window_scores(qv, kv, n + 1, BaselineGroups::kv_head), Contains("window"));
    REQUIRE_THROWS_WITH(sc.h2o_scores(View3<const bfloat16>(nullptr, {n, H, d}), kv, BaselineGroups::layer), Contains("null"));
    REQUIRE_THROWS(sc.h2o_scores(qv, View3<const bfloat16>(kd.data(), {n, 3, d}), BaselineGroups::layer));
    std::vector<bfloat16> kn(k);
    kn[5] = bfloat16(std::nanf(""));
    cuda::DeviceArray<bfloat16> knd(kn);
    REQUIRE_THROWS_WITH(sc.fastv_scores(qv, View3<const bfloat16>(knd.data(), {n, Hkv, d})), Contains("NaN or Inf"));
    REQUIRE_NOTHROW(sc.fastv_scores(qv, kv));  // still usable
    // Through the few-row kernel and through mma.sync: Inf in the last row of q (the row FastV reads), and
    // Inf in a K row past the first 128-key block (read by another block of pass 1).
    for (int path : {0, 1}) {
        INFO("probe path " << path);
        cuda::detail::probe_path_override().store(path);
        std::vector<bfloat16> qn(q);
        qn[static_cast<std::size_t>((n - 1) * H * d + 2 * d + 7)] = bfloat16(INFINITY);
        cuda::DeviceArray<bfloat16> qnd(qn);
        REQUIRE_THROWS_WITH(sc.fastv_scores(View3<const bfloat16>(qnd.data(), {n, H, d}), kv), Contains("NaN or Inf"));
        const std::int64_t n2 = 300;
        std::vector<bfloat16> q2(static_cast<std::size_t>(n2 * H * d), bfloat16(0.5f)), k2(static_cast<std::size_t>(n2 * Hkv * d), bfloat16(0.25f));
        k2[static_cast<std::size_t>(200 * Hkv * d + d + 63)] = bfloat16(-INFINITY);
        cuda::DeviceArray<bfloat16> q2d(q2), k2d(k2);
        REQUIRE_THROWS_WITH(sc.fastv_scores(View3<const bfloat16>(q2d.data(), {n2, H, d}), View3<const bfloat16>(k2d.data(), {n2, Hkv, d})),
                            Contains("NaN or Inf"));
        REQUIRE_NOTHROW(sc.fastv_scores(qv, kv));
    }
    cuda::detail::probe_path_override().store(0);
}

namespace {

// The device lists against the CPU paths' selection code run on the same fp32 scores (copied back by
// the host-side scorer): the same lists exactly, ties included, and the same scores.
template <class T>
void device_select_case(std::int64_t n, std::int64_t H, std::int64_t Hkv, std::int64_t d, const std::string& spec,
                        bool zero_q, std::uint64_t seed, cuda::BaselineScorer& sc) {
    SplitMix64 rng(seed);
    auto q = random_values<T>(static_cast<std::size_t>(n * H * d), 2.0, rng);
    if (zero_q) std::fill(q.begin(), q.end(), from_float<T>(0.0f));  // uniform attention: every score ties
    const auto k = random_values<T>(static_cast<std::size_t>(n * Hkv * d), 1.0, rng);
    cuda::DeviceArray<T> qd(q), kd(k);
    const View3<const T> qv(qd.data(), {n, H, d}), kv(kd.data(), {n, Hkv, d});
    const Layout layout = Layout::parse(spec);
    REQUIRE(layout.n() == n);
    INFO("n " << n << " H " << H << " H_kv " << Hkv << " d " << d << " layout " << spec << " zero q " << zero_q);
    const std::vector<float> lse = n <= 5000 ? vt::row_lse_of(View3<const T>(q.data(), {n, H, d}), View3<const T>(k.data(), {n, Hkv, d}))
                                             : std::vector<float>(static_cast<std::size_t>(n * H), 0.0f);
    const cuda::DeviceArray<float> lse_d(lse);
    const View2<const float> lse_v(lse_d.data(), {n, H});
    const std::int64_t window = std::min<std::int64_t>(n, 1 + static_cast<std::int64_t>(seed % 13));  // SnapKV's
    const std::vector<float> lse_w =
        vt::row_lse_of(View3<const T>(q.data(), {n, H, d}), View3<const T>(k.data(), {n, Hkv, d}), n - window);
    const cuda::DeviceArray<float> lse_wd(lse_w);
    const View2<const float> lse_wv(lse_wd.data(), {n, H});
    for (auto groups : {BaselineGroups::kv_head, BaselineGroups::layer}) {
        for (double heavy : {0.0, 0.1, 0.37, 0.9}) {
            H2OParams P;
            P.groups = groups;
            P.heavy = TokenBudget::ratio(heavy);
            P.recent = TokenBudget::tokens(std::min<std::int64_t>(n, 1 + static_cast<std::int64_t>(seed % 9)));
            const auto host_scores = sc.h2o_scores(qv, kv, groups, P.attention());
            const TokenSelection want = h2o_select_from_scores(host_scores, P);
            sc.fill_workspace(0xff);
            const TokenSelection got = sc.h2o_device_select(qv, kv, P).to_host();
            INFO("h2o heavy " << heavy);
            REQUIRE(got.indices == want.indices);
            REQUIRE(got.scores == want.scores);
            // With the rows' statistics given (row_lse, pass 1 skipped): scores within the score tolerance
            // of the ones above, and the lists exactly what the CPU rule keeps on them.
            // (The host's row_lse costs n^2 H d: up to 5000 rows.)
            // On Hopper with sm_90a code: q's chunks read by the bulk tensor copy (automatic, for d = 64 /
            // 128) and from the packed copy (path 4), and the merged layout (path 2).
            if (n <= 5000)
                for (int path : {0, 4, 2}) {
                    INFO("row_lse given, probe path " << path);
                    cuda::detail::probe_path_override().store(path);
                    sc.fill_workspace(0xff);
                    const TokenSelection gl = sc.h2o_device_select(qv, kv, lse_v, P).to_host();
                    check_close(gl.scores, host_scores, "H2O score with row_lse given");
                    REQUIRE(gl.indices == h2o_select_from_scores(gl.scores, P).indices);
                    // The host scores' overload with row_lse (what the simulator's cuda backend calls).
                    sc.fill_workspace(0xff);
                    check_close(sc.h2o_scores(qv, kv, lse_v, groups, P.attention()), host_scores, "H2O host score with row_lse given");
                }
            cuda::detail::probe_path_override().store(0);
        }
        for (double cap : {0.05, 0.3, 0.75, 1.0}) {
            SnapKVParams P;
            P.groups = groups;
            P.window = window;
            P.kernel = 3;
            P.pooling = seed % 2 ? SnapKVPooling::max : SnapKVPooling::avg;
            P.capacity = TokenBudget::tokens(std::max<std::int64_t>(P.window, static_cast<std::int64_t>(cap * static_cast<double>(n))));
            const TokenSelection want = snapkv_select_from_pooled(sc.snapkv_pooled_scores(qv, kv, P), n, P);
            sc.fill_workspace(0xff);
            const TokenSelection got = sc.snapkv_device_select(qv, kv, P).to_host();
            INFO("snapkv capacity " << P.capacity.count << " window " << P.window);
            REQUIRE(got.indices == want.indices);
            REQUIRE(got.scores == want.scores);
            // The window rows' statistics given (every other row of row_lse NaN: only the window is read).
            const auto pooled = sc.snapkv_pooled_scores(qv, kv, P);
            for (int path : {0, 1}) {
                INFO("row_lse given, probe path " << path);
                cuda::detail::probe_path_override().store(path);
                sc.fill_workspace(0xff);
                const TokenSelection gl = sc.snapkv_device_select(qv, kv, lse_wv, P).to_host();
                check_close(gl.scores, want.scores, "SnapKV score with row_lse given");
                std::vector<std::vector<double>> gp(gl.scores);  // (to_host: [G][n], 0 on the window)
                for (auto& row : gp) row.resize(static_cast<std::size_t>(n - P.window));
                REQUIRE(gl.indices == snapkv_select_from_pooled(gp, n, P).indices);
                sc.fill_workspace(0xff);
                check_close(sc.snapkv_pooled_scores(qv, kv, lse_wv, P), pooled, "SnapKV pooled score with row_lse given");
            }
            cuda::detail::probe_path_override().store(0);
        }
    }
    // FastV's last row: its statistics alone given (row_lse NaN elsewhere).
    const std::vector<float> lse_last = vt::row_lse_of(View3<const T>(q.data(), {n, H, d}), View3<const T>(k.data(), {n, Hkv, d}), n - 1);
    const cuda::DeviceArray<float> lse_lastd(lse_last);
    const View2<const float> lse_lastv(lse_lastd.data(), {n, H});
    for (auto spans : {FastVSpans::joint, FastVSpans::per_image})
        for (double rate : {0.0, 0.25, 0.5, 0.93, 0.999}) {
            FastVParams P;
            P.spans = spans;
            P.rate = rate;
            const TokenSelection want = fastv_select_from_scores(sc.fastv_scores(qv, kv, P.attention()), layout, P);
            sc.fill_workspace(0xff);
            const TokenSelection got = sc.fastv_device_select(qv, kv, layout, P).to_host();
            INFO("fastv rate " << rate);
            REQUIRE(got.indices == want.indices);
            REQUIRE(got.scores == want.scores);
            // With the last row's statistics given, on the few-row kernel (automatic where it applies) and
            // on the mma.sync passes.
            for (int path : {0, 1}) {
                INFO("row_lse given, probe path " << path);
                cuda::detail::probe_path_override().store(path);
                sc.fill_workspace(0xff);
                const TokenSelection gl = sc.fastv_device_select(qv, kv, lse_lastv, layout, P).to_host();
                check_close(gl.scores, want.scores, "FastV score with row_lse given");
                REQUIRE(gl.indices == fastv_select_from_scores(gl.scores.at(0), layout, P).indices);
                sc.fill_workspace(0xff);
                check_close(sc.fastv_scores(qv, kv, lse_lastv, P.attention()), want.scores.at(0),
                            "FastV host score with row_lse given");
            }
            cuda::detail::probe_path_override().store(0);
        }
}

}  // namespace

TEST_CASE("cuda baselines: device lists equal the CPU selection on the same scores (ties included)",
          "[cuda][baselines][device_select]") {
    cuda::BaselineScorer sc;
    std::uint64_t seed = 20261125u;
    device_select_case<bfloat16>(97, 8, 2, 64, "text:5,image:40,text:3,image:45,text:4", false, ++seed, sc);
    device_select_case<bfloat16>(97, 8, 2, 64, "text:5,image:40,text:3,image:45,text:4", true, ++seed, sc);
    device_select_case<vlsparse::half>(1000, 4, 4, 128, "text:31,image:576,text:9,image:380,text:4", false, ++seed, sc);
    device_select_case<float>(300, 6, 3, 40, "image:300", false, ++seed, sc);
    device_select_case<bfloat16>(40000, 4, 1, 64, "text:100,image:19900,text:50,image:19900,text:50", false, ++seed, sc);
    device_select_case<bfloat16>(5000, 4, 2, 64, "text:10,image:4980,text:10", true, ++seed, sc);
    device_select_case<bfloat16>(1, 2, 1, 64, "text:1", false, ++seed, sc);
    // 40 images: more ranking tasks (FastV per image) than the kernel takes in its parameters.
    std::string many = "text:3";
    for (int i = 0; i < 40; ++i) many += ",image:" + std::to_string(17 + i % 5) + ",text:2";
    device_select_case<bfloat16>(Layout::parse(many).n(), 4, 2, 64, many, false, ++seed, sc);
}

TEST_CASE("cuda baselines: StreamingLLM, random and fixed-ratio lists on the device", "[cuda][baselines][device_select]") {
    cuda::BaselineScorer sc;
    const Layout layout = Layout::parse("text:7,image:64,text:3,image:100,text:9");
    const std::int64_t n = layout.n();
    for (std::int64_t sinks : {0, 4}) {
        StreamingLLMParams P;
        P.sinks = sinks;
        P.recent = TokenBudget::ratio(0.3);
        sc.fill_workspace(0xff);
        const TokenSelection got = sc.streamingllm_device_select(n, P).to_host();
        REQUIRE(got.indices == streamingllm_select(n, P).indices);
        REQUIRE(sc.streamingllm_device_select(n, P).rows().lists_per_seq == 1);
    }
    for (auto scope : {BaselineScope::visual, BaselineScope::all}) {
        RandomParams R;
        R.scope = scope;
        R.keep = TokenBudget::ratio(0.4);
        for (std::int64_t layer : {0, 3})
            REQUIRE(sc.random_device_select(layout, layer, R).to_host().indices == random_select(layout, layer, R).indices);
        FixedRatioParams F;
        F.scope = scope;
        F.keep = TokenBudget::ratio(0.25);
        const auto& d = sc.fixed_ratio_device_select(layout, F);
        REQUIRE(d.to_host().indices == fixed_ratio_select(layout, F).indices);
        REQUIRE(d.kept_ratio() == Approx(fixed_ratio_select(layout, F).kept_ratio()));
    }
}

TEST_CASE("cuda baselines: device selection errors", "[cuda][baselines][device_select]") {
    cuda::BaselineScorer sc;
    const std::int64_t n = 64, H = 4, Hkv = 2, d = 64;
    std::vector<bfloat16> q(static_cast<std::size_t>(n * H * d), bfloat16(0.5f)), k(static_cast<std::size_t>(n * Hkv * d), bfloat16(0.25f));
    cuda::DeviceArray<bfloat16> qd(q), kd(k);
    const View3<const bfloat16> qv(qd.data(), {n, H, d}), kv(kd.data(), {n, Hkv, d});
    SnapKVParams S;
    S.window = 16;
    S.capacity = TokenBudget::tokens(8);
    REQUIRE_THROWS_WITH(sc.snapkv_device_select(qv, kv, S), Contains("below window"));
    S.window = n + 1;
    REQUIRE_THROWS_WITH(sc.snapkv_device_select(qv, kv, S), Contains("larger than the prompt"));
    REQUIRE_THROWS_WITH(sc.fastv_device_select(qv, kv, Layout::parse("text:10"), FastVParams{}), Contains("layout covers"));
    std::vector<bfloat16> kn(k);
    kn[77] = bfloat16(std::nanf(""));
    cuda::DeviceArray<bfloat16> knd(kn);
    H2OParams P;
    P.heavy = TokenBudget::tokens(8);
    P.recent = TokenBudget::tokens(8);
    REQUIRE_THROWS_WITH(sc.h2o_device_select(qv, View3<const bfloat16>(knd.data(), {n, Hkv, d}), P), Contains("NaN or Inf"));
    // Logits beyond fp32: the scores overflow.
    std::vector<float> qb(static_cast<std::size_t>(n * H * d), 3e18f), kb(static_cast<std::size_t>(n * Hkv * d), 3e18f);
    cuda::DeviceArray<float> qbd(qb), kbd(kb);
    REQUIRE_THROWS_WITH(sc.h2o_device_select(View3<const float>(qbd.data(), {n, H, d}), View3<const float>(kbd.data(), {n, Hkv, d}), P),
                        Contains("not finite"));
    REQUIRE(sc.h2o_device_select(qv, kv, P).indptr.back() == 2 * 16);  // still usable: 8 heavy + 8 recent per KV head
    {  // row_lse: NaN in it, its shape, a null view
        std::vector<float> lse(static_cast<std::size_t>(n * H), 2.0f);
        lse[static_cast<std::size_t>(33 * H + 2)] = std::nanf("");
        const cuda::DeviceArray<float> lsed(lse);
        REQUIRE_THROWS_WITH(sc.h2o_device_select(qv, kv, View2<const float>(lsed.data(), {n, H}), P), Contains("row_lse holds NaN or Inf"));
        REQUIRE_THROWS_WITH(sc.h2o_device_select(qv, kv, View2<const float>(lsed.data(), {n, H + 1}), P),
                            Contains("row_lse has shape [64, 5], expected [64, 4]"));
        REQUIRE_THROWS_WITH(sc.h2o_device_select(qv, kv, View2<const float>(nullptr, {n, H}), P), Contains("row_lse is a null view"));
        REQUIRE(sc.h2o_device_select(qv, kv, P).indptr.back() == 2 * 16);  // still usable
        // The host scores' overload: the same checks.
        REQUIRE_THROWS_WITH(sc.h2o_scores(qv, kv, View2<const float>(lsed.data(), {n, H}), BaselineGroups::kv_head),
                            Contains("row_lse holds NaN or Inf"));
        REQUIRE_THROWS_WITH(sc.h2o_scores(qv, kv, View2<const float>(lsed.data(), {n, H + 1}), BaselineGroups::layer),
                            Contains("row_lse has shape [64, 5], expected [64, 4]"));
        // FastV and SnapKV read only their rows' statistics: a NaN there is an error, one elsewhere is not read.
        const Layout lay = Layout::parse("text:4,image:56,text:4");
        REQUIRE_NOTHROW(sc.fastv_device_select(qv, kv, View2<const float>(lsed.data(), {n, H}), lay, FastVParams{}));
        std::vector<float> lse_bad_last(lse);
        lse_bad_last[static_cast<std::size_t>((n - 1) * H + 1)] = INFINITY;
        const cuda::DeviceArray<float> lbl(lse_bad_last);
        REQUIRE_THROWS_WITH(sc.fastv_device_select(qv, kv, View2<const float>(lbl.data(), {n, H}), lay, FastVParams{}),
                            Contains("row_lse holds NaN or Inf"));
        REQUIRE_THROWS_WITH(sc.fastv_scores(qv, kv, View2<const float>(lbl.data(), {n, H})), Contains("row_lse holds NaN or Inf"));
        REQUIRE_THROWS_WITH(sc.fastv_scores(qv, kv, View2<const float>(nullptr, {n, H})), Contains("row_lse is a null view"));
        SnapKVParams W;
        W.window = 8;
        W.capacity = TokenBudget::tokens(24);
        REQUIRE_NOTHROW(sc.snapkv_device_select(qv, kv, View2<const float>(lsed.data(), {n, H}), W));
        REQUIRE_THROWS_WITH(sc.snapkv_device_select(qv, kv, View2<const float>(lbl.data(), {n, H}), W),
                            Contains("row_lse holds NaN or Inf"));
        REQUIRE_THROWS_WITH(sc.snapkv_pooled_scores(qv, kv, View2<const float>(lsed.data(), {n - 1, H}), W),
                            Contains("row_lse has shape [63, 4], expected [64, 4]"));
        REQUIRE(sc.fastv_device_select(qv, kv, lay, FastVParams{}).indptr.back() > 0);  // still usable
    }
}
