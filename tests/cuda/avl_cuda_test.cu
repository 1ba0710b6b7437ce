// CUDA A-VL selection (vlsparse/cuda/avl.cuh) against the reference and the CPU rules: bf16 / fp16 (probe
// scores on the tensor cores), fp32 (CUDA cores), GQA 1 / 4, several images or one span, the whole
// sequence or the positions left by a prefill filter, budgets down to zero and up to every token, ties
// (q = 0: every score equal). The selector's workspace is poisoned (0xff bytes) before each checked call.
//
// What must match: the head-mean scores the reference's to a relative error of 1e-4 (fp32 on the GPU,
// double in the reference); the kept, core and prefill-filter lists exactly what avl_select /
// avl_prefill_filter (the CPU paths' code) keep on the GPU's own scores, ties included; the golden/avl
// cases: scores and kept masks (one per KV head with the text budget), and the core set the CPU rule
// gives on the golden scores (the golden files are built with no near tie at a cut). The text budget:
// H2O's scores against the reference's, the kept lists exactly what avl_text_h2o + avl_select keep on
// the GPU's own scores.
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include <vlsparse/core/rng.hpp>
#include <vlsparse/cuda/avl.cuh>
#include <vlsparse/reference/avl.hpp>
#include <vlsparse/reference/avl_golden.hpp>

#include "../test_core.hpp"
#include "row_lse.hpp"

using namespace vlsparse;
using Catch::Matchers::Contains;

namespace {

// Relative, scores (fp32 on the GPU).
constexpr double kTol = vt::tolerance(vt::TestBackend::cuda, vt::Metric::score_rel);

template <class T>
std::vector<T> random_values(std::size_t count, double spread, SplitMix64& rng) {
    std::vector<T> v(count);
    for (auto& x : v) x = from_float<T>(static_cast<float>(spread * (2.0 * rng.uniform() - 1.0)));
    return v;
}

template <class T>
void random_case(const std::string& spec, std::int64_t H, std::int64_t Hkv, std::int64_t d, bool filtered, bool zero_q,
                 std::uint64_t seed, cuda::AvlSelector& sel) {
    const Layout layout = Layout::parse(spec);
    const std::int64_t n = layout.n();
    SplitMix64 rng(seed);
    // The present positions: every one, or every non-image one plus a random ~60% of the image tokens.
    std::vector<std::int64_t> present;
    if (filtered)
        for (std::int64_t p = 0; p < n; ++p)
            if (layout.is_text(p) || rng.uniform() < 0.6 || p == n - 1) present.push_back(p);
    const std::int64_t m = filtered ? static_cast<std::int64_t>(present.size()) : n;
    auto q = random_values<T>(static_cast<std::size_t>(m * H * d), 2.0, rng);
    if (zero_q) std::fill(q.begin(), q.end(), from_float<T>(0.0f));
    const auto k = random_values<T>(static_cast<std::size_t>(m * Hkv * d), 1.0, rng);
    cuda::DeviceArray<T> qd(q), kd(k);
    const View3<const T> qh(q.data(), {m, H, d}), kh(k.data(), {m, Hkv, d});
    const View3<const T> qv(qd.data(), {m, H, d}), kv(kd.data(), {m, Hkv, d});
    INFO("layout " << spec << " H " << H << " H_kv " << Hkv << " d " << d << " present " << m << " of " << n << " zero q "
                   << zero_q << " seed " << seed);
    // The reference's scores of the present rows, spread over [0, n).
    const auto ref_rows = reference::avl_scores(qh, kh);
    std::vector<double> ref(static_cast<std::size_t>(n), 0.0);
    for (std::int64_t i = 0; i < m; ++i) ref[static_cast<std::size_t>(filtered ? present[static_cast<std::size_t>(i)] : i)] = ref_rows[static_cast<std::size_t>(i)];
    double mx = 0.0;
    for (double x : ref) mx = std::max(mx, x);
    for (const auto& [rate, compute] : std::vector<std::pair<double, double>>{{0.0, 0.0}, {0.5, 0.7}, {0.3, 0.9}, {0.9, 0.95}}) {
        for (auto spans : {AvlSpans::per_image, AvlSpans::single_span}) {
            AvlParams P;
            P.rate = rate;
            P.compute_rate = compute;
            P.spans = spans;
            P.prefill_filter = 0.45;
            INFO("rate " << rate << " compute_rate " << compute << " spans " << to_string(spans));
            sel.fill_workspace(0xff);
            const cuda::DeviceAvlSelection& s = sel.select(qv, kv, layout, P, present);
            const TokenSelection kept = s.kept.to_host();
            const std::vector<double>& got = kept.scores.at(0);
            for (std::int64_t j = 0; j < n; ++j) {
                INFO("score of position " << j << ": " << got[static_cast<std::size_t>(j)] << ", reference " << ref[static_cast<std::size_t>(j)]);
                REQUIRE(std::abs(got[static_cast<std::size_t>(j)] - ref[static_cast<std::size_t>(j)]) <=
                        kTol * (std::abs(ref[static_cast<std::size_t>(j)]) + 1e-3 * mx));
            }
            // The CPU rules on the same scores: the same lists, exactly.
            const AvlSelection want = avl_select(got, layout, P, present);
            REQUIRE(kept.indices.size() == 1);
            REQUIRE(kept.indices[0] == want.kept.indices[0]);
            REQUIRE(s.core.to_host().indices.at(0) == want.core);
            REQUIRE(s.core_budget == want.core_budget);
            sel.fill_workspace(0xff);
            const TokenSelection f = sel.prefill_filter(qv, kv, layout, P, present).to_host();
            REQUIRE(f.indices.at(0) == avl_prefill_filter(got, layout, P, present));
        }
    }
    // The text budget (H2O for text): the GPU's H2O scores against the reference's, and the kept lists
    // (one per KV head) and core set exactly what avl_text_h2o + avl_select keep on the GPU's own scores.
    // The reference scores every row in double: small layouts only.
    if (n > 2000) return;
    // The rows' statistics as a prefill would give them (select with row_lse: only the 128-key blocks of
    // older text tokens scored).
    const std::vector<float> lse = vt::row_lse_of(qh, kh);
    const cuda::DeviceArray<float> lse_d(lse);
    const View2<const float> lse_v(lse_d.data(), {m, H});
    // (row_lse given: on Hopper with sm_90a code also with q's chunks from the packed copy, path 4, and
    // on mma.sync, path 1 -- the key-block subset's splits on both kernels.)
    for (auto groups : {AvlTextGroups::per_kv_head, AvlTextGroups::per_query_head})
    for (int with_lse : {0, 1, 2, 3}) {
        cuda::detail::probe_path_override().store(with_lse == 2 ? 4 : with_lse == 3 ? 1 : 0);
        const auto ref_acc = reference::avl_h2o_scores(qh, kh, groups);
        const std::int64_t TG = static_cast<std::int64_t>(ref_acc.size());
        for (const auto& [trate, tmin, theavy] : std::vector<std::tuple<double, std::int64_t, double>>{
                 {0.5, 3, 0.7}, {0.8, 0, 0.5}, {0.3, 1000, 0.7}, {0.6, 2, 1.0}, {0.6, 2, 0.0}}) {
            AvlParams P;
            P.rate = 0.5;
            P.compute_rate = 0.7;
            P.text_rate = trate;
            P.text_min_budget = tmin;
            P.text_heavy_fraction = theavy;
            P.text_groups = groups;
            INFO("text budget " << trate << " min " << tmin << " heavy fraction " << theavy << " groups " << to_string(groups)
                                << " row_lse given " << with_lse);
            sel.fill_workspace(0xff);
            const cuda::DeviceAvlSelection& s = with_lse ? sel.select(qv, kv, lse_v, layout, P, present) : sel.select(qv, kv, layout, P, present);
            // With row_lse, the blocks scored: those of the older text tokens (the budget's heavy candidates:
            // every seen text token but the last B - heavy), in row space.
            std::vector<std::uint8_t> scored(static_cast<std::size_t>((m + 127) / 128), with_lse ? 0 : 1);
            if (with_lse) {
                std::vector<std::int64_t> tx;
                const auto spans = avl_spans(layout, P.spans);
                for (std::int64_t i = 0; i < m; ++i)
                    if (!vlsparse::detail::in_spans(spans, filtered ? present[static_cast<std::size_t>(i)] : i)) tx.push_back(i);
                const AvlTextBudget tb = avl_text_budget(static_cast<std::int64_t>(tx.size()), P);
                for (std::size_t i = 0; i + static_cast<std::size_t>(tb.recent) < tx.size(); ++i) scored[static_cast<std::size_t>(tx[i] / 128)] = 1;
            }
            REQUIRE(s.text_groups == TG);
            REQUIRE(s.text_scores != nullptr);
            std::vector<float> ts(static_cast<std::size_t>(TG * n));
            REQUIRE(cudaMemcpy(ts.data(), s.text_scores, ts.size() * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
            std::vector<std::vector<double>> acc(static_cast<std::size_t>(TG), std::vector<double>(static_cast<std::size_t>(n), 0.0));
            for (std::int64_t a = 0; a < TG; ++a) {
                double amx = 0.0;
                for (double x : ref_acc[static_cast<std::size_t>(a)]) amx = std::max(amx, x);
                for (std::int64_t i = 0; i < m; ++i) {
                    const std::int64_t p = filtered ? present[static_cast<std::size_t>(i)] : i;
                    const double want = ref_acc[static_cast<std::size_t>(a)][static_cast<std::size_t>(i)];
                    const double g = ts[static_cast<std::size_t>(a * n + p)];
                    INFO("H2O score of group " << a << " position " << p << ": " << g << ", reference " << want);
                    if (scored[static_cast<std::size_t>(i / 128)]) REQUIRE(std::abs(g - want) <= kTol * (std::abs(want) + 1e-3 * amx));
                    else REQUIRE(g == 0.0);
                }
                for (std::int64_t j = 0; j < n; ++j) acc[static_cast<std::size_t>(a)][static_cast<std::size_t>(j)] = ts[static_cast<std::size_t>(a * n + j)];
            }
            const TokenSelection kept = s.kept.to_host();
            const std::int64_t group = groups == AvlTextGroups::per_query_head ? H / Hkv : 1;
            const auto text = avl_text_h2o(acc, layout, P, group, present);
            const AvlSelection want = avl_select(kept.scores.at(0), layout, P, present, text);
            REQUIRE(kept.indices.size() == static_cast<std::size_t>(Hkv));
            for (std::int64_t g = 0; g < Hkv; ++g) {
                INFO("KV head " << g);
                REQUIRE(kept.indices[static_cast<std::size_t>(g)] == want.kept.indices[static_cast<std::size_t>(g)]);
            }
            REQUIRE(s.core.to_host().indices.at(0) == want.core);
            REQUIRE(s.core_budget == want.core_budget);
        }
    }
    cuda::detail::probe_path_override().store(0);
}

}  // namespace

TEST_CASE("cuda avl: kept, core and prefill-filter sets against the CPU rules and the reference's scores", "[cuda][avl]") {
    cuda::AvlSelector sel;
    std::uint64_t seed = 20261125u;
    for (bool filtered : {false, true}) {
        random_case<bfloat16>("text:9,image:64,text:5,image:100,text:7", 8, 2, 64, filtered, false, ++seed, sel);
        random_case<vlsparse::half>("text:31,image:576,text:9,image:576,text:20", 4, 4, 128, filtered, false, ++seed, sel);
        random_case<float>("image:300,text:3", 6, 3, 40, filtered, false, ++seed, sel);
        random_case<bfloat16>("text:4,image:40,text:2,image:40,text:3", 4, 1, 64, filtered, true, ++seed, sel);
    }
    random_case<bfloat16>("text:100,video:8x2400,text:60", 8, 2, 128, false, false, ++seed, sel);
    // 40 images: more spans (ranking tasks) than the kernel takes in its parameters.
    std::string many = "text:3";
    for (int i = 0; i < 40; ++i) many += ",image:" + std::to_string(17 + i % 5) + ",text:2";
    random_case<bfloat16>(many, 4, 2, 64, true, false, ++seed, sel);
}

TEST_CASE("cuda avl: the golden/avl cases (scores, kept and core masks)", "[cuda][avl][golden]") {
    namespace fs = std::filesystem;
    const char* env = std::getenv("VLSPARSE_GOLDEN_DIR");
    const fs::path root = fs::path(env ? env : "golden") / "avl";
    REQUIRE(fs::is_directory(root));
    cuda::AvlSelector sel;
    int checked = 0, with_text = 0;
    for (const auto& e : fs::directory_iterator(root)) {
        if (!e.is_directory()) continue;
        GoldenManifest m;
        const auto c = golden::read_avl_inputs(e.path(), &m);
        INFO("case " << e.path().filename().string());
        auto run = [&](auto tag) {
            using T = decltype(tag);
            const auto q = golden::detail::narrow<T>(c.q), k = golden::detail::narrow<T>(c.k);
            cuda::DeviceArray<T> qd(q), kd(k);
            const View3<const T> qv(qd.data(), {c.n, c.H, c.d}), kv(kd.data(), {c.n, c.Hkv, c.d});
            auto out = [&](const char* name) { return read_tensor(e.path(), m.output(name)); };
            sel.fill_workspace(0xff);
            const cuda::DeviceAvlSelection& s = sel.select(qv, kv, c.layout, c.params);
            const TokenSelection kept = s.kept.to_host();
            const auto want = out("scores").template to_vector<double>();
            double mx = 0.0;
            for (double x : want) mx = std::max(mx, x);
            for (std::int64_t j = 0; j < c.n; ++j)
                REQUIRE(std::abs(kept.scores[0][static_cast<std::size_t>(j)] - want[static_cast<std::size_t>(j)]) <=
                        kTol * (std::abs(want[static_cast<std::size_t>(j)]) + 1e-3 * mx));
            // kept_mask [G][n]: one row per kept list (per KV head with the text budget).
            const auto kept_mask = out("kept_mask").template to_vector<std::uint8_t>();
            const std::size_t G = kept.indices.size();
            REQUIRE(G == (c.params.text_rate > 0.0 ? static_cast<std::size_t>(c.Hkv) : 1u));
            REQUIRE(kept_mask.size() == G * static_cast<std::size_t>(c.n));
            std::vector<std::uint8_t> mk(G * static_cast<std::size_t>(c.n), 0), mc(static_cast<std::size_t>(c.n), 0);
            for (std::size_t g = 0; g < G; ++g)
                for (auto p : kept.indices[g]) mk[g * static_cast<std::size_t>(c.n) + static_cast<std::size_t>(p)] = 1;
            const TokenSelection core = s.core.to_host();  // (a named copy: a range-for over
            for (auto p : core.indices[0]) mc[static_cast<std::size_t>(p)] = 1;  // to_host().indices[0] dangles)
            REQUIRE(kept_mask == mk);
            if (c.params.text_rate > 0.0) ++with_text;
            // The golden core_mask is the set in force after each decode step (refreshed at step 0): the
            // prefill's core set is checked by the CPU rule on the golden scores instead.
            std::vector<std::uint8_t> wc(static_cast<std::size_t>(c.n), 0);
            for (auto p : avl_select(want, c.layout, c.params).core) wc[static_cast<std::size_t>(p)] = 1;
            REQUIRE(mc == wc);
            ++checked;
        };
        if (c.dtype == "fp32") run(float{});
        else if (c.dtype == "fp16") run(vlsparse::half{});
        else run(bfloat16{});
    }
    REQUIRE(checked >= 3);
    REQUIRE(with_text >= 1);
}

TEST_CASE("cuda avl: errors", "[cuda][avl]") {
    cuda::AvlSelector sel;
    const Layout layout = Layout::parse("text:8,image:48,text:8");
    const std::int64_t n = 64, H = 4, Hkv = 2, d = 64;
    std::vector<bfloat16> q(static_cast<std::size_t>(n * H * d), bfloat16(0.5f)), k(static_cast<std::size_t>(n * Hkv * d), bfloat16(0.25f));
    cuda::DeviceArray<bfloat16> qd(q), kd(k);
    const View3<const bfloat16> qv(qd.data(), {n, H, d}), kv(kd.data(), {n, Hkv, d});
    AvlParams P;
    // The text budget: NaN in a row of q other than the last is an error too (every row is scored), and
    // the device decode schedule takes such a selection (one kept list per KV head).
    P.text_rate = 0.5;
    {
        std::vector<bfloat16> qn(q);
        qn[static_cast<std::size_t>(5 * H * d + 3)] = bfloat16(std::nanf(""));
        cuda::DeviceArray<bfloat16> qnd(qn);
        REQUIRE_THROWS_WITH(sel.select(View3<const bfloat16>(qnd.data(), {n, H, d}), kv, layout, P),
                            Contains("every row of q"));
        P.text_rate = 0.0;
        REQUIRE_NOTHROW(sel.select(View3<const bfloat16>(qnd.data(), {n, H, d}), kv, layout, P));  // row 5 unread
        P.text_rate = 0.5;
        // The rows' statistics given: a NaN in a scored row is an error naming row_lse; a wrong shape and a
        // null view are refused before anything runs.
        std::vector<float> lse(static_cast<std::size_t>(n * H), 1.0f);
        lse[static_cast<std::size_t>(20 * H + 1)] = std::nanf("");
        const cuda::DeviceArray<float> lsed(lse);
        REQUIRE_THROWS_WITH(sel.select(qv, kv, View2<const float>(lsed.data(), {n, H}), layout, P), Contains("row_lse holds NaN"));
        REQUIRE_THROWS_WITH(sel.select(qv, kv, View2<const float>(lsed.data(), {n - 1, H}), layout, P),
                            Contains("row_lse has shape [63, 4], expected [64, 4]"));
        REQUIRE_THROWS_WITH(sel.select(qv, kv, View2<const float>(nullptr, {n, H}), layout, P), Contains("row_lse is a null view"));
        const auto& st = sel.select(qv, kv, layout, P);
        REQUIRE(st.kept.lists() == Hkv);
        cuda::AvlDecodeSchedule sch;
        REQUIRE_NOTHROW(sch.reset(st, P));  // the schedule takes the per-KV-head lists (check_schedule below)
        sch.begin_step(0);
        REQUIRE(sch.positions(0, n + 1).lists() == Hkv);
    }
    P.text_rate = 0.0;
    P.rate = 0.8;  // above compute_rate 0.7
    REQUIRE_THROWS_WITH(sel.select(qv, kv, layout, P), Contains("compute_rate"));
    P.rate = 0.5;
    REQUIRE_THROWS_WITH(sel.select(qv, kv, Layout::parse("text:10"), P), Contains("one row per present position"));
    const std::vector<std::int64_t> unsorted{3, 2};
    REQUIRE_THROWS_WITH(sel.select(View3<const bfloat16>(qd.data(), {2, H, d}), View3<const bfloat16>(kd.data(), {2, Hkv, d}),
                                   layout, P, unsorted),
                        Contains("sorted"));
    std::vector<bfloat16> kn(k);
    kn[300] = bfloat16(std::nanf(""));
    cuda::DeviceArray<bfloat16> knd(kn);
    REQUIRE_THROWS_WITH(sel.select(qv, View3<const bfloat16>(knd.data(), {n, Hkv, d}), layout, P), Contains("NaN or Inf"));
    const auto& s = sel.select(qv, kv, layout, P);  // still usable
    REQUIRE(s.kept.indptr.back() == 16 + 24);        // the text tokens and half of the image
    REQUIRE(s.core.indptr.back() == 14);             // floor(0.3 * 48)
}

// cuda::AvlDecodeSchedule against the CPU's DecodeSchedule built from the same selection: the rows of
// every step and the core set re-ranked from the same probabilities (quantized to `levels` levels, so
// that ranks tie), synchronous and asynchronous refresh, refresh every step (K = 0).
struct ScheduleVariant {
    double rate, compute;
    std::int64_t K;
    bool async, check;
    AvlSpans spans;
    double text_rate = 0.0;  // > 0: the text budget (one kept list per KV head)
    AvlTextGroups text_groups = AvlTextGroups::per_kv_head;
};

static void check_schedule(cuda::AvlSelector& sel, cuda::AvlDecodeSchedule& sch, const Layout& layout, std::int64_t H,
                           std::int64_t Hkv, std::int64_t d, const std::vector<ScheduleVariant>& variants, int levels,
                           std::uint64_t seed) {
    const std::int64_t n = layout.n();
    INFO("seed " << seed << " n " << n);
    SplitMix64 rng(seed);
    const auto q = random_values<bfloat16>(static_cast<std::size_t>(n * H * d), 2.0, rng);
    const auto k = random_values<bfloat16>(static_cast<std::size_t>(n * Hkv * d), 1.0, rng);
    cuda::DeviceArray<bfloat16> qd(q), kd(k);
    const View3<const bfloat16> qv(qd.data(), {n, H, d}), kv(kd.data(), {n, Hkv, d});
    for (const auto& v : variants) {
        AvlParams P;
        P.rate = v.rate;
        P.compute_rate = v.compute;
        P.refresh_every = v.K;
        P.async_refresh = v.async;
        P.spans = v.spans;
        P.text_rate = v.text_rate;
        P.text_groups = v.text_groups;
        P.text_min_budget = 2;
        INFO("rate " << v.rate << " compute_rate " << v.compute << " K " << v.K << " async " << v.async << " check "
                     << v.check << " spans " << to_string(v.spans) << " text budget " << v.text_rate << " "
                     << to_string(v.text_groups));
        const cuda::DeviceAvlSelection& s = sel.select(qv, kv, layout, P);
        const TokenSelection kept = s.kept.to_host();
        // With the text budget, the CPU's text lists from the GPU's own H2O scores (the selection test
        // checks those against the reference).
        std::vector<std::vector<std::int64_t>> text;
        if (v.text_rate > 0.0) {
            const std::int64_t TG = s.text_groups;
            std::vector<float> ts(static_cast<std::size_t>(TG * n));
            REQUIRE(cudaMemcpy(ts.data(), s.text_scores, ts.size() * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
            std::vector<std::vector<double>> acc(static_cast<std::size_t>(TG));
            for (std::int64_t a = 0; a < TG; ++a) acc[static_cast<std::size_t>(a)].assign(ts.begin() + a * n, ts.begin() + (a + 1) * n);
            text = avl_text_h2o(acc, layout, P, v.text_groups == AvlTextGroups::per_query_head ? H / Hkv : 1);
        }
        const AvlSelection want = avl_select(kept.scores.at(0), layout, P, {}, text);
        REQUIRE(kept.indices == want.kept.indices);
        REQUIRE(kept.indices.size() == (v.text_rate > 0.0 ? static_cast<std::size_t>(Hkv) : 1u));
        DecodeSchedule cpu(want, P);
        sch.reset(s, P);
        // With async_refresh the re-rank runs on a second (non-blocking) stream, as an engine would run it
        // beside the next step's decode; the default stream waits for it before the step that reads it.
        cudaStream_t side = nullptr;
        cudaEvent_t ranked = nullptr;
        if (v.async) {
            REQUIRE(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking) == cudaSuccess);
            REQUIRE(cudaEventCreateWithFlags(&ranked, cudaEventDisableTiming) == cudaSuccess);
        }
        std::int64_t join_at = -1;
        std::vector<cuda::DeviceArray<float>> kept_alive;
        for (std::int64_t t = 0; t < 10; ++t) {
            INFO("step " << t);
            const std::int64_t seq = n + t + 1;
            if (t == join_at) REQUIRE(cudaStreamWaitEvent(nullptr, ranked, 0) == cudaSuccess);
            cpu.begin_step(t);
            sch.begin_step(t);
            const TokenSelection cpos = cpu.positions(t, seq);
            const TokenSelection gl = sch.positions(t, seq).to_host();
            REQUIRE(gl.n == seq);
            REQUIRE(gl.indices == cpos.indices);
            if (!cpu.splits() || !cpu.is_refresh(t)) continue;
            REQUIRE(sch.is_refresh(t));
            // Probabilities of the listed rows (every list's, concatenated), a few levels only (ties at
            // the cuts; sums of a few of them are exact in fp32 and in double).
            std::size_t entries = 0;
            for (const auto& l : cpos.indices) entries += l.size();
            std::vector<float> probs(entries);
            for (auto& x : probs) x = static_cast<float>(std::floor(rng.uniform() * levels)) / 64.0f;
            cuda::DeviceArray<float> pd(probs);
            if (v.async) {
                REQUIRE(cudaDeviceSynchronize() == cudaSuccess);  // (pd's upload, on the default stream)
                sch.refresh(t, pd.data(), side, v.check);
                REQUIRE(cudaEventRecord(ranked, side) == cudaSuccess);
                join_at = t + 2;
            } else {
                sch.refresh(t, pd.data(), nullptr, v.check);
            }
            // The CPU's score of a kept image row: its probability summed over the lists (each list's
            // probability is the mean over its KV head's query heads, so this is the head sum / group).
            cpu.refresh(t, [&](std::int64_t p) {
                double sum = 0.0;
                std::size_t off = 0;
                for (const auto& l : cpos.indices) {
                    const auto it = std::lower_bound(l.begin(), l.end(), p);
                    REQUIRE((it != l.end() && *it == p));
                    sum += static_cast<double>(probs[off + static_cast<std::size_t>(it - l.begin())]);
                    off += l.size();
                }
                return sum;
            });
            if (v.async) kept_alive.push_back(std::move(pd));  // (read by the second stream after this step)
        }
        if (v.async) {
            REQUIRE(cudaStreamSynchronize(side) == cudaSuccess);
            REQUIRE(cudaEventDestroy(ranked) == cudaSuccess);
            REQUIRE(cudaStreamDestroy(side) == cudaSuccess);
        }
    }
}

TEST_CASE("cuda avl: the decode schedule (rows per step, refresh re-rank) against DecodeSchedule", "[cuda][avl][decode]") {
    cuda::AvlSelector sel;
    cuda::AvlDecodeSchedule sch;
    const Layout layout = Layout::parse("text:9,image:64,text:5,image:100,text:7");
    const std::int64_t n = layout.n(), H = 8, Hkv = 2, d = 64;
    const std::uint64_t seed = vt::seed_or(20261125u) + 77;
    const std::vector<ScheduleVariant> variants{{0.5, 0.7, 3, false, true, AvlSpans::per_image},
                                                {0.5, 0.7, 3, true, true, AvlSpans::per_image},
                                                {0.3, 0.9, 2, false, false, AvlSpans::single_span},
                                                {0.6, 0.8, 4, true, false, AvlSpans::single_span},
                                                {0.5, 0.7, 0, false, true, AvlSpans::per_image}};
    check_schedule(sel, sch, layout, H, Hkv, d, variants, 6, seed);
    // The text budget: one kept list per KV head (their image rows shared, their text rows their own),
    // per KV head and per query head, synchronous and asynchronous, per-image and single-span.
    const std::vector<ScheduleVariant> text_variants{
        {0.5, 0.7, 3, false, true, AvlSpans::per_image, 0.5, AvlTextGroups::per_kv_head},
        {0.5, 0.7, 3, true, false, AvlSpans::per_image, 0.6, AvlTextGroups::per_query_head},
        {0.3, 0.9, 2, false, true, AvlSpans::single_span, 0.5, AvlTextGroups::per_kv_head},
        {0.5, 0.7, 0, false, true, AvlSpans::per_image, 0.7, AvlTextGroups::per_query_head}};
    check_schedule(sel, sch, layout, H, Hkv, d, text_variants, 6, seed + 10);
    check_schedule(sel, sch, Layout::parse("text:200,image:3000,text:150,image:2000,text:100"), 8, 4, 64, text_variants, 6,
                   seed + 11);
    // Spans of thousands of kept rows (ranked by a team of blocks), and more spans than the kernel takes in
    // its parameters (40 images: the spans read from device memory); many and few probability levels.
    const std::vector<ScheduleVariant> big{{0.5, 0.7, 3, false, true, AvlSpans::per_image},
                                           {0.6, 0.8, 2, true, false, AvlSpans::single_span}};
    check_schedule(sel, sch, Layout::parse("text:13,image:9000,text:7,image:5000,text:21"), 4, 1, 64, big, 6, seed + 1);
    check_schedule(sel, sch, Layout::parse("text:13,image:20000,text:7"), 4, 1, 64, big, 1000, seed + 2);
    std::string many = "text:3";
    for (int i = 0; i < 40; ++i) many += ",image:" + std::to_string(30 + 7 * (i % 5)) + ",text:2";
    check_schedule(sel, sch, Layout::parse(many), 4, 2, 64, big, 6, seed + 3);
    check_schedule(sel, sch, Layout::parse(many), 4, 2, 64, text_variants, 6, seed + 4);
    // Errors (and a checked refresh after a failed one).
    SplitMix64 rng(seed);
    const auto q = random_values<bfloat16>(static_cast<std::size_t>(n * H * d), 2.0, rng);
    const auto k = random_values<bfloat16>(static_cast<std::size_t>(n * Hkv * d), 1.0, rng);
    cuda::DeviceArray<bfloat16> qd(q), kd(k);
    const View3<const bfloat16> qv(qd.data(), {n, H, d}), kv(kd.data(), {n, Hkv, d});
    AvlParams P;
    P.refresh_every = 3;
    const cuda::DeviceAvlSelection& s = sel.select(qv, kv, layout, P);
    sch.reset(s, P);
    sch.begin_step(0);
    const auto& rows = sch.positions(0, n + 1);
    std::vector<float> bad(static_cast<std::size_t>(rows.indptr.back()), 0.01f);
    // NaN at a kept image row (the rows the re-rank reads; a text row's probability is not ranked).
    const std::vector<std::int64_t> listed = rows.to_host().indices.at(0);
    const auto img = std::find_if(listed.begin(), listed.end(), [](std::int64_t p) { return p >= 9 && p < 73; });
    REQUIRE(img != listed.end());
    bad[static_cast<std::size_t>(img - listed.begin())] = std::nanf("");
    cuda::DeviceArray<float> bd(bad);
    REQUIRE_THROWS_WITH(sch.refresh(0, bd.data()), Contains("not finite"));
    REQUIRE_THROWS_WITH(sch.positions(0, n), Contains("expected > the prompt length"));
    // The next refresh with finite probabilities is not blamed for the earlier one, checked or not.
    std::vector<float> good(bad.size(), 0.01f);
    cuda::DeviceArray<float> gd(good);
    sch.begin_step(3);
    sch.positions(3, n + 4);
    sch.refresh(3, gd.data(), nullptr, false);
    sch.begin_step(6);
    sch.positions(6, n + 7);
    sch.refresh(6, gd.data());
    sch.begin_step(7);
    REQUIRE_THROWS_WITH(sch.refresh(7, bd.data()), Contains("not a refresh step"));
    REQUIRE_THROWS_WITH(sch.begin_step(7), Contains("increasing order"));
    cuda::AvlDecodeSchedule fresh;
    REQUIRE_THROWS_WITH(fresh.begin_step(0), Contains("reset()"));
}
