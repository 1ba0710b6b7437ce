// CUDA PureKV (vlsparse/cuda/purekv.cuh) against reference::PureKVEstimator on identical inputs and against
// the golden/purekv files: bf16 and fp16 (window scores on the tensor cores), fp32 (CUDA cores), GQA 1 / 2 /
// 4, head dims 40 / 64 / 128, n not a multiple of any tile, both groupings, both budgets, dense or scored
// lower layers, a window as long as the prompt, strided (head-major) v. The estimator's workspace is
// poisoned (0xff bytes) before each checked call.
//
// What must match: the window scores and the importance to a relative error of 1e-4 (fp32 on the GPU,
// double in the reference), the V norms to 1e-5; the kept lists exactly, except where the reference's
// own importance puts the h-th and (h+1)-th candidates within 1e-4 of each other: then the list must be a
// top-h of the reference's importance up to that tolerance (the test counts these). Independently of the
// reference, the device lists must equal exactly what the host's top-k keeps on the GPU's own fp32
// importance (the ranking itself is exact). The ST-masked prefill attention of a video layout matches the
// reference within the bf16 NMSE of the golden files. The checks that read no values are the CPU
// estimator's: the same messages, case by case.
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <vlsparse/core/rng.hpp>
#include <vlsparse/core/topk.hpp>
#include <vlsparse/cuda/purekv.cuh>
#include <vlsparse/reference/purekv.hpp>
#include <vlsparse/reference/purekv_golden.hpp>

#include "../error_of.hpp"
#include "../test_core.hpp"
#include "row_lse.hpp"

using namespace vlsparse;
using Catch::Matchers::Contains;

namespace {

constexpr double kScoreTol = vt::tolerance(vt::TestBackend::cuda, vt::Metric::score_rel),
                 kNormTol = vt::tolerance(vt::TestBackend::cuda, vt::Metric::norm_rel);

int& near_ties() {
    static int c = 0;
    return c;
}
int& exact_groups() {
    static int c = 0;
    return c;
}

template <class T>
std::vector<T> random_values(std::size_t count, double spread, SplitMix64& rng) {
    std::vector<T> v(count);
    for (auto& x : v) x = from_float<T>(static_cast<float>(spread * (2.0 * rng.uniform() - 1.0)));
    return v;
}

void check_rows(const std::vector<std::vector<double>>& got, const std::vector<std::vector<double>>& want, double tol,
                const char* what) {
    REQUIRE(got.size() == want.size());
    for (std::size_t g = 0; g < got.size(); ++g) {
        REQUIRE(got[g].size() == want[g].size());
        double mx = 0.0;
        for (double x : want[g]) mx = std::max(mx, std::abs(x));
        for (std::size_t j = 0; j < got[g].size(); ++j) {
            INFO(what << "[" << g << "][" << j << "] = " << got[g][j] << ", reference " << want[g][j]);
            REQUIRE(std::abs(got[g][j] - want[g][j]) <= tol * (std::abs(want[g][j]) + 1e-3 * mx));
        }
    }
}

// One layer's GPU selection against the reference's.
void check_selection(const PureKVSelection& got, const PureKVSelection& want) {
    REQUIRE(got.dense == want.dense);
    REQUIRE(got.n == want.n);
    REQUIRE(got.groups() == want.groups());
    if (want.dense) {
        REQUIRE(got.selection.indices == want.selection.indices);
        return;
    }
    REQUIRE(got.source_layer == want.source_layer);
    REQUIRE(got.top_h == want.top_h);
    check_rows(got.v_norm, want.v_norm, kNormTol, "v_norm");
    check_rows(got.importance, want.importance, kScoreTol, "importance");
    const std::int64_t n = want.n, w = want.window, m = n - w, h = want.top_h;
    for (std::int64_t g = 0; g < want.groups(); ++g) {
        const auto& have = got.selection.indices[static_cast<std::size_t>(g)];
        const auto& list = want.selection.indices[static_cast<std::size_t>(g)];
        // Exact ranking of the GPU's own fp32 importance (what the device lists must equal, ties included).
        {
            std::vector<std::int64_t> own = topk_indices(
                std::span<const double>(got.importance[static_cast<std::size_t>(g)].data(), static_cast<std::size_t>(m)), h);
            for (std::int64_t j = m; j < n; ++j) own.push_back(j);
            REQUIRE(have == own);
        }
        const auto& ref = want.importance[static_cast<std::size_t>(g)];
        std::vector<double> sorted(ref.begin(), ref.begin() + m);
        std::sort(sorted.begin(), sorted.end(), std::greater<double>());
        const double mx = sorted.empty() ? 0.0 : sorted.front();
        const bool near = h > 0 && h < m && sorted[static_cast<std::size_t>(h - 1)] - sorted[static_cast<std::size_t>(h)] <=
                                                 kScoreTol * (sorted[static_cast<std::size_t>(h - 1)] + 1e-3 * mx);
        INFO("group " << g << ": kept " << have.size() << " (reference " << list.size() << "), h " << h);
        if (!near) {
            REQUIRE(have == list);
            ++exact_groups();
            continue;
        }
        ++near_ties();
        REQUIRE(have.size() == list.size());
        const double v = sorted[static_cast<std::size_t>(h - 1)], tol = kScoreTol * (v + 1e-3 * mx);
        std::vector<std::uint8_t> kept(static_cast<std::size_t>(n), 0);
        for (auto j : have) kept[static_cast<std::size_t>(j)] = 1;
        for (std::int64_t j = 0; j < n; ++j) {
            INFO("position " << j << " importance " << (j < m ? ref[static_cast<std::size_t>(j)] : -1.0) << ", cut " << v);
            if (j >= m) REQUIRE(kept[static_cast<std::size_t>(j)]);
            else if (ref[static_cast<std::size_t>(j)] > v + tol) REQUIRE(kept[static_cast<std::size_t>(j)]);
            else if (kept[static_cast<std::size_t>(j)]) REQUIRE(ref[static_cast<std::size_t>(j)] >= v - tol);
        }
    }
}

// L layers of random q / k / v through both estimators.
template <class T>
void random_case(std::int64_t n, std::int64_t H, std::int64_t Hkv, std::int64_t d, const PureKVParams& P, bool head_major_v,
                 std::uint64_t seed) {
    const std::int64_t L = 4;
    const Layout layout = Layout::parse("text:" + std::to_string(n));
    const ModelShape shape{L, H, Hkv, d};
    SplitMix64 rng(seed);
    INFO("n " << n << " H " << H << " H_kv " << Hkv << " d " << d << " l0 " << P.l0 << " window " << P.window << " grouping "
              << to_string(P.grouping) << " budget " << to_string(P.budget) << " lower " << to_string(P.lower_layers)
              << " head-major v " << head_major_v << " seed " << seed);
    reference::PureKVEstimator ref(P, layout, shape);
    cuda::PureKVEstimator gpu(P, layout, shape);
    for (std::int64_t l = 0; l < L; ++l) {
        INFO("layer " << l);
        const auto q = random_values<T>(static_cast<std::size_t>(n * H * d), 2.0, rng);
        const auto k = random_values<T>(static_cast<std::size_t>(n * Hkv * d), 1.0, rng);
        auto v = random_values<T>(static_cast<std::size_t>(n * Hkv * d), 1.0, rng);
        for (std::size_t i = 0; i < v.size(); i += 7) v[i] = from_float<T>(3.0f * to_float(v[i]));  // uneven norms
        const View3<const T> qh(q.data(), {n, H, d}), kh(k.data(), {n, Hkv, d}), vh(v.data(), {n, Hkv, d});
        cuda::DeviceArray<T> qd(q), kd(k);
        // v on the device token-major, or head-major [H_kv, n, d] read through strides.
        std::vector<T> vdev(v);
        std::array<std::int64_t, 3> vstride{Hkv * d, d, 1};
        if (head_major_v) {
            for (std::int64_t j = 0; j < n; ++j)
                for (std::int64_t g = 0; g < Hkv; ++g)
                    for (std::int64_t c = 0; c < d; ++c)
                        vdev[static_cast<std::size_t>((g * n + j) * d + c)] = v[static_cast<std::size_t>((j * Hkv + g) * d + c)];
            vstride = {d, n * d, 1};
        }
        cuda::DeviceArray<T> vd(vdev);
        const View3<const T> qv(qd.data(), {n, H, d}), kv(kd.data(), {n, Hkv, d}), vv(vd.data(), {n, Hkv, d}, vstride);
        if (ref.needs_scores(l)) {
            REQUIRE(gpu.needs_scores(l));
            ref.observe(l, qh, kh);
            gpu.fill_workspace(0xff);
            gpu.observe(l, qv, kv);
            check_rows(gpu.scores(l).to_host().s, ref.scores(l).s, kScoreTol, "window scores");
        } else {
            REQUIRE_FALSE(gpu.needs_scores(l));
        }
        const PureKVSelection want = ref.select(l, vh);
        gpu.fill_workspace(0xff);
        const cuda::DevicePureKVSelection& s = gpu.select(l, vv);
        REQUIRE(s.lists.rows().lists_per_seq == (want.dense ? 1 : gpu.groups()));
        check_selection(s.to_host(), want);
        if (gpu.needs_scores(l)) {
            // The window rows' statistics given (row_lse NaN outside the window: only the window is read),
            // then the selection on those scores.
            const std::vector<float> lse = vt::row_lse_of(qh, kh, n - P.window);
            const cuda::DeviceArray<float> lse_d(lse);
            gpu.fill_workspace(0xff);
            gpu.observe(l, qv, kv, View2<const float>(lse_d.data(), {n, H}));
            check_rows(gpu.scores(l).to_host().s, ref.scores(l).s, kScoreTol, "window scores, row_lse given");
            gpu.fill_workspace(0xff);
            INFO("row_lse given");
            check_selection(gpu.select(l, vv).to_host(), want);
            gpu.observe(l, qv, kv);  // (the layers above l0 go on from the scores of the plain observe)
        }
    }
}

}  // namespace

TEST_CASE("cuda purekv: the estimator against the reference on random inputs", "[cuda][purekv]") {
    std::uint64_t seed = 20261125u;
    PureKVParams P;
    for (auto grouping : {PureKVGrouping::kv_head, PureKVGrouping::layer}) {
        P.grouping = grouping;
        P.l0 = 2;
        P.window = 32;
        P.budget = PureKVBudget::fraction;
        P.budget_fraction = 0.2;
        P.lower_layers = PureKVLowerLayers::own_scores;
        random_case<bfloat16>(777, 8, 2, 64, P, false, ++seed);
        random_case<vlsparse::half>(1500, 8, 4, 128, P, true, ++seed);
        random_case<float>(300, 4, 4, 40, P, false, ++seed);  // d = 40: V norms one warp per position
        random_case<float>(301, 4, 2, 128, P, true, ++seed);  // fp32 rows of 512 bytes: one head per warp load
        random_case<bfloat16>(203, 6, 3, 128, P, false, ++seed);  // H_kv odd: the second half-warp idle on the last load
        P.l0 = 1;
        P.window = 5;
        P.lower_layers = PureKVLowerLayers::dense;
        P.budget = PureKVBudget::count;
        P.top_h = 100;
        random_case<bfloat16>(4099, 4, 1, 128, P, true, ++seed);
        P.l0 = 0;
        P.window = 61;  // the whole prompt: only the window is kept
        P.top_h = 0;
        random_case<bfloat16>(61, 8, 2, 64, P, false, ++seed);
        P.window = 1;
        P.budget = PureKVBudget::fraction;
        P.budget_fraction = 0.5;
        random_case<bfloat16>(20000, 8, 2, 64, P, false, ++seed);
    }
}

TEST_CASE("cuda purekv: ST-SpAttn prefill attention through the estimator", "[cuda][purekv]") {
    const Layout layout = Layout::parse("text:9,video:6x40[5x8],text:13");
    const std::int64_t n = layout.n(), H = 4, Hkv = 2, d = 64;
    const ModelShape shape{3, H, Hkv, d};
    PureKVParams P;
    P.l0 = 0;
    P.window = 8;
    P.st_start_layer = 1;
    reference::PureKVEstimator ref(P, layout, shape);
    cuda::PureKVEstimator gpu(P, layout, shape);
    SplitMix64 rng(77);
    const auto q = random_values<bfloat16>(static_cast<std::size_t>(n * H * d), 2.0, rng);
    const auto k = random_values<bfloat16>(static_cast<std::size_t>(n * Hkv * d), 1.0, rng);
    const auto v = random_values<bfloat16>(static_cast<std::size_t>(n * Hkv * d), 1.0, rng);
    cuda::DeviceArray<bfloat16> qd(q), kd(k), vd(v);
    cuda::DeviceArray<float> od(static_cast<std::size_t>(n * H * d));
    for (std::int64_t l : {0, 1, 2}) {
        INFO("layer " << l << " masked " << gpu.masked(l));
        REQUIRE(gpu.masked(l) == ref.masked(l));
        std::vector<float> want(static_cast<std::size_t>(n * H * d)), got(want.size(), std::nanf(""));
        ref.attention(l, View3<const bfloat16>(q.data(), {n, H, d}), View3<const bfloat16>(k.data(), {n, Hkv, d}),
                      View3<const bfloat16>(v.data(), {n, Hkv, d}), View3<float>(want.data(), {n, H, d}));
        od.upload(got);  // poison
        gpu.attention(l, View3<const bfloat16>(qd.data(), {n, H, d}), View3<const bfloat16>(kd.data(), {n, Hkv, d}),
                      View3<const bfloat16>(vd.data(), {n, Hkv, d}), View3<float>(od.data(), {n, H, d}));
        got = od.download();
        double num = 0.0, den = 0.0;
        for (std::size_t i = 0; i < got.size(); ++i) {
            REQUIRE(std::isfinite(got[i]));
            num += (got[i] - want[i]) * (got[i] - want[i]);
            den += want[i] * want[i];
        }
        REQUIRE(num / den <= golden::kAttentionNmseBf16);
    }
}

TEST_CASE("cuda purekv: the golden/purekv cases (scores, norms, importance, kept masks)", "[cuda][purekv][golden]") {
    namespace fs = std::filesystem;
    const char* env = std::getenv("VLSPARSE_GOLDEN_DIR");
    const fs::path root = fs::path(env ? env : "golden") / "purekv";
    REQUIRE(fs::is_directory(root));
    int checked = 0;
    for (const auto& e : fs::directory_iterator(root)) {
        if (!e.is_directory()) continue;
        GoldenManifest m;
        const auto c = golden::read_purekv_inputs(e.path(), &m);
        if (c.shape.layers == 0) continue;  // the Spearman case
        INFO("case " << e.path().filename().string());
        auto run = [&](auto tag) {
            using T = decltype(tag);
            const auto q = golden::detail::narrow<T>(c.q), k = golden::detail::narrow<T>(c.k), v = golden::detail::narrow<T>(c.v);
            const std::int64_t L = c.shape.layers, n = c.layout.n(), H = c.shape.heads, Hkv = c.shape.kv_heads, d = c.shape.head_dim;
            cuda::DeviceArray<T> qd(q), kd(k), vd(v);
            cuda::PureKVEstimator gpu(c.params, c.layout, c.shape);
            const std::int64_t G = gpu.groups();
            auto out = [&](const char* name) { return read_tensor(e.path(), m.output(name)).template to_vector<double>(); };
            const auto want_s0 = out("scores_l0"), want_vn = out("v_norm"), want_imp = out("importance");
            const auto want_kept = read_tensor(e.path(), m.output("kept_mask")).template to_vector<std::uint8_t>();
            auto rows = [&](const std::vector<double>& flat, std::int64_t off) {
                std::vector<std::vector<double>> r(static_cast<std::size_t>(G));
                for (std::int64_t g = 0; g < G; ++g)
                    r[static_cast<std::size_t>(g)].assign(flat.begin() + off + g * n, flat.begin() + off + (g + 1) * n);
                return r;
            };
            for (std::int64_t l = 0; l < L; ++l) {
                INFO("layer " << l);
                const View3<const T> qv(qd.data() + l * n * H * d, {n, H, d}), kv(kd.data() + l * n * Hkv * d, {n, Hkv, d}),
                    vv(vd.data() + l * n * Hkv * d, {n, Hkv, d});
                if (gpu.needs_scores(l)) gpu.observe(l, qv, kv);
                gpu.fill_workspace(0xff);
                const PureKVSelection s = gpu.select(l, vv).to_host();
                if (!s.dense) {
                    check_rows(s.v_norm, rows(want_vn, l * G * n), kNormTol, "v_norm");
                    check_rows(s.importance, rows(want_imp, l * G * n), kScoreTol, "importance");
                }
                // Kept masks: exact unless the golden importance ties within the tolerance at the cut.
                for (std::int64_t g = 0; g < G; ++g) {
                    std::vector<std::uint8_t> mask(static_cast<std::size_t>(n), 0);
                    for (auto j : s.selection.for_kv_head(g)) mask[static_cast<std::size_t>(j)] = 1;
                    const std::vector<std::uint8_t> want(want_kept.begin() + (l * G + g) * n, want_kept.begin() + (l * G + g + 1) * n);
                    if (mask == want) continue;
                    // Not identical: allowed only within a tie of the golden importance at the cut.
                    ++near_ties();
                    const auto imp = rows(want_imp, l * G * n)[static_cast<std::size_t>(g)];
                    double cut = 1e300, mx = 0.0;
                    for (std::int64_t j = 0; j < n; ++j) {
                        mx = std::max(mx, imp[static_cast<std::size_t>(j)]);
                        if (want[static_cast<std::size_t>(j)] && j < n - c.params.window) cut = std::min(cut, imp[static_cast<std::size_t>(j)]);
                    }
                    for (std::int64_t j = 0; j < n; ++j)
                        if (mask[static_cast<std::size_t>(j)] != want[static_cast<std::size_t>(j)]) {
                            INFO("group " << g << " position " << j << " importance " << imp[static_cast<std::size_t>(j)] << " cut " << cut);
                            REQUIRE(std::abs(imp[static_cast<std::size_t>(j)] - cut) <= kScoreTol * (cut + 1e-3 * mx));
                        }
                }
            }
            check_rows(gpu.scores(c.params.l0).to_host().s, rows(want_s0, 0), kScoreTol, "scores_l0");
            ++checked;
        };
        if (c.dtype == "fp32") run(float{});
        else if (c.dtype == "fp16") run(vlsparse::half{});
        else run(bfloat16{});
    }
    REQUIRE(checked >= 4);
}

TEST_CASE("cuda purekv: errors", "[cuda][purekv]") {
    const std::int64_t n = 64, H = 4, Hkv = 2, d = 64;
    const Layout layout = Layout::parse("text:64");
    PureKVParams P;
    P.l0 = 1;
    P.window = 8;
    const ModelShape shape{3, H, Hkv, d};
    std::vector<bfloat16> q(static_cast<std::size_t>(n * H * d), bfloat16(0.5f)), k(static_cast<std::size_t>(n * Hkv * d), bfloat16(0.25f));
    cuda::DeviceArray<bfloat16> qd(q), kd(k), vd(k);
    const View3<const bfloat16> qv(qd.data(), {n, H, d}), kv(kd.data(), {n, Hkv, d}), vv(vd.data(), {n, Hkv, d});
    cuda::PureKVEstimator est(P, layout, shape);
    REQUIRE_THROWS_WITH(est.select(1, vv), Contains("were not observed"));
    REQUIRE_THROWS_WITH(est.observe(2, qv, kv), Contains("reuse l0's scores"));
    REQUIRE_THROWS_WITH(est.observe(0, View3<const bfloat16>(qd.data(), {n, 3, d}), kv), Contains("do not match"));
    REQUIRE_THROWS_WITH(est.select(0, View3<const bfloat16>(vd.data(), {n - 1, Hkv, d})), Contains("expected [64"));
    REQUIRE_THROWS_WITH(est.select(7, vv), Contains("layer = 7"));
    PureKVParams bad = P;
    bad.l0 = 3;
    REQUIRE_THROWS_WITH(cuda::PureKVEstimator(bad, layout, shape), Contains("l0 = 3"));
    bad = P;
    bad.window = 65;
    REQUIRE_THROWS_WITH(cuda::PureKVEstimator(bad, layout, shape), Contains("window = 65"));
    // NaN in k (found by the observe's loads, reported by the select that uses the scores), in v.
    std::vector<bfloat16> kn(k);
    kn[100] = bfloat16(std::nanf(""));
    cuda::DeviceArray<bfloat16> knd(kn);
    est.observe(0, qv, View3<const bfloat16>(knd.data(), {n, Hkv, d}));
    REQUIRE_THROWS_WITH(est.select(0, vv), Contains("NaN or Inf"));
    est.observe(0, qv, kv);
    REQUIRE_THROWS_WITH(est.select(0, View3<const bfloat16>(knd.data(), {n, Hkv, d})), Contains("v holds NaN"));
    REQUIRE_NOTHROW(est.select(0, vv));  // still usable
    {  // row_lse: NaN in a window row (reported by select), NaN outside the window (not read), its shape
        std::vector<float> lse(static_cast<std::size_t>(n * H), 1.0f);
        lse[static_cast<std::size_t>(3 * H + 1)] = std::nanf("");  // row 3: outside the window of 8
        const cuda::DeviceArray<float> lsed(lse);
        est.observe(0, qv, kv, View2<const float>(lsed.data(), {n, H}));
        REQUIRE_NOTHROW(est.select(0, vv));
        lse[static_cast<std::size_t>((n - 2) * H + 3)] = INFINITY;
        const cuda::DeviceArray<float> lsew(lse);
        est.observe(0, qv, kv, View2<const float>(lsew.data(), {n, H}));
        REQUIRE_THROWS_WITH(est.select(0, vv), Contains("row_lse of layer 0 holds NaN or Inf"));
        REQUIRE_THROWS_WITH(est.observe(0, qv, kv, View2<const float>(lsed.data(), {n, H - 1})),
                            Contains("row_lse has shape [64, 3], expected [64, 4]"));
        REQUIRE_THROWS_WITH(est.observe(0, qv, kv, View2<const float>(nullptr, {n, H})), Contains("row_lse is a null view"));
        est.observe(0, qv, kv);
    }
    REQUIRE_NOTHROW(est.select(0, vv));
    REQUIRE(est.select(0, vv).lists.indptr.back() == Hkv * (n * 2 / 10));  // floor(0.2 n) per KV head, window included

    // The checks that read no values are the CPU estimator's (detail::check_purekv_*): the same message
    // case by case, the estimator's own functions named cuda:: on the GPU (a shared helper such as
    // purekv_top_h names itself on both).
    const auto same = [](const std::string& cuda_msg, const std::string& cpu_msg) {
        INFO("cuda: " << cuda_msg << "\ncpu:  " << cpu_msg);
        REQUIRE(!cpu_msg.empty());
        CHECK(cuda_msg == (cpu_msg.starts_with("PureKVEstimator") ? "cuda::" + cpu_msg : cpu_msg));
    };
    const auto construct = [&](const PureKVParams& p, const Layout& l, const ModelShape& m) {
        same(vt::error_of([&] { cuda::PureKVEstimator e(p, l, m); }),
             vt::error_of([&] { reference::PureKVEstimator e(p, l, m); }));
    };
    bad = P;
    bad.l0 = 3;
    construct(bad, layout, shape);  // l0 beyond the layers
    bad = P;
    bad.window = 65;
    construct(bad, layout, shape);  // window beyond n
    bad = P;
    bad.budget = PureKVBudget::count;
    bad.top_h = 57;
    construct(bad, layout, shape);  // budget beyond n - window
    bad = P;
    bad.st.kind = VideoMask::spatial_temporal;
    bad.st_start_layer = 3;
    construct(bad, layout, shape);
    bad = P;
    bad.q_block = 0;
    construct(bad, layout, shape);  // the params' own check
    construct(P, layout, ModelShape{3, 3, Hkv, d});  // H not a multiple of H_kv

    // The per-call checks, on views of the right kind for each path (never read: they fail first).
    cuda::PureKVEstimator ce(P, layout, shape);
    reference::PureKVEstimator re(P, layout, shape);
    // q [qn, heads, d], k [n, H_kv, d], v [vn, H_kv, d] (v over k's buffer).
    const auto views = [&](const bfloat16* qp, const bfloat16* kp, std::int64_t qn, std::int64_t heads, std::int64_t vn) {
        return std::array{View3<const bfloat16>(qp, {qn, heads, d}), View3<const bfloat16>(kp, {n, Hkv, d}),
                          View3<const bfloat16>(kp, {vn, Hkv, d})};
    };
    for (const auto& [qn, qheads, vn] : {std::array<std::int64_t, 3>{n, 3, n}, std::array<std::int64_t, 3>{n - 1, H, n - 1}}) {
        const auto c = views(qd.data(), kd.data(), qn, qheads, vn);
        const auto r = views(q.data(), k.data(), qn, qheads, vn);
        same(vt::error_of([&] { ce.observe(0, c[0], c[1]); }), vt::error_of([&] { re.observe(0, r[0], r[1]); }));
        same(vt::error_of([&] { ce.select(0, c[2]); }), vt::error_of([&] { re.select(0, r[2]); }));
        same(vt::error_of([&] { ce.attention(2, c[0], c[1], c[1], View3<bfloat16>(nullptr, {n, H, d})); }),
             vt::error_of([&] { re.attention(2, r[0], r[1], r[1], View3<bfloat16>(nullptr, {n, H, d})); }));
    }
    const auto c = views(qd.data(), kd.data(), n, H, n);
    const auto r = views(q.data(), k.data(), n, H, n);
    same(vt::error_of([&] { ce.observe(2, c[0], c[1]); }), vt::error_of([&] { re.observe(2, r[0], r[1]); }));
    same(vt::error_of([&] { ce.observe(-1, c[0], c[1]); }), vt::error_of([&] { re.observe(-1, r[0], r[1]); }));
    same(vt::error_of([&] { ce.scores(2); }), vt::error_of([&] { re.scores(2); }));  // l0 = 1 not observed
    same(vt::error_of([&] { (void)ce.needs_scores(3); }), vt::error_of([&] { (void)re.needs_scores(3); }));
    same(vt::error_of([&] { (void)ce.masked(5); }), vt::error_of([&] { (void)re.masked(5); }));
    PureKVParams dense = P;
    dense.lower_layers = PureKVLowerLayers::dense;
    cuda::PureKVEstimator cd(dense, layout, shape);
    reference::PureKVEstimator rd(dense, layout, shape);
    same(vt::error_of([&] { cd.scores(0); }), vt::error_of([&] { rd.scores(0); }));  // a dense lower layer has none
    same(vt::error_of([&] { cd.observe(0, c[0], c[1]); }), vt::error_of([&] { rd.observe(0, r[0], r[1]); }));
}

TEST_CASE("cuda purekv: how many kept sets went through the tie rule", "[cuda][purekv]") {
    std::printf("cuda purekv: %d groups matched the reference exactly, %d were decided within the tolerance of a tie\n",
                exact_groups(), near_ties());
    REQUIRE(exact_groups() >= near_ties());
}
