// GPU selection benchmark: every policy's selection of one layer, from the device q / k / v to the device
// lists, over the shapes of "CUDA II" (bf16, H = 28, H_kv = 4, d = 128, batch 1, n = 8K .. 128K): ZipVL's
// whole selection (probes, probe attention, scores, p from tau, top-k), H2O (n <= 32K: it scores every
// row), SnapKV, FastV, A-VL (kept + core sets), PureKV (at l0: window scores + V norms + top-h; above l0: V norms + top-h only),
// StreamingLLM, random and fixed ratio (host lists uploaded). The PyTorch side (cuDNN / flash dense causal prefill of
// the same layer, and the same selection written with PyTorch ops) is bench/torch_select_bench.py;
// bench/cuda_select_report.py joins the two CSV files.
//
// Timing: CUDA events around one select() call (which ends in its one stream synchronization), after a
// 256 MiB write that evicts the L2; median of --reps calls after --warmup calls. q and k hold random
// values in [-1, 1] with every 97th key row scaled by 3 (the kept ratio is printed: such diffuse
// attention keeps most tokens at tau = 0.975; the cost barely depends on it).
//
//   cuda_decode_bench-style CSV (--out FILE): impl,policy,dtype,H,H_kv,d,n,time_us,kept,p,note
//   build-gpu/bench/cuda_select_bench --out select.csv [--n 8192,16384] [--reps 21] [--quick]
//                                     [--warmup W] [--only zipvl,h2o,snapkv,fastv,purekv,avl,decode,lists]
// --only runs a subset of the groups (for profiling one policy under ncu); default: all of them.
// --probe-path 1 forces the probe scores onto the mma.sync passes (0, the default: the automatic choice,
// e.g. the few-row kernel for FastV's and A-VL's last row), for an A/B of the two in one binary.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <vlsparse/core/rng.hpp>
#include <vlsparse/cuda/avl.cuh>
#include <vlsparse/cuda/decode.cuh>
#include <vlsparse/cuda/baselines.cuh>
#include <vlsparse/cuda/h2o_decode.cuh>
#include <vlsparse/cuda/prefill.cuh>
#include <vlsparse/cuda/purekv.cuh>
#include <vlsparse/cuda/zipvl.cuh>

#include "cuda_bench_util.cuh"

using namespace vlsparse;

int main(int argc, char** argv) {
    std::vector<std::int64_t> ns{8192, 16384, 32768, 131072};
    int reps = 21, warmup = 3;
    const char* out_path = nullptr;
    std::string only;  // comma-separated groups; empty: all
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--n" && i + 1 < argc) ns = bench::parse_size_list(argv[++i]);
        else if (a == "--reps" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
        else if (a == "--quick") {
            ns = {8192, 16384};
            reps = 7;
        } else if (a == "--out" && i + 1 < argc) out_path = argv[++i];
        else if (a == "--only" && i + 1 < argc) only = argv[++i];
        else if (a == "--warmup" && i + 1 < argc) warmup = std::max(0, std::atoi(argv[++i]));
        else if (a == "--probe-path" && i + 1 < argc) {
            const int path = std::atoi(argv[++i]);
            if (path != 0 && path != 1) {
                std::fprintf(stderr, "--probe-path: 0 (automatic) or 1 (mma.sync), got %d\n", path);
                return 2;
            }
            cuda::detail::probe_path_override().store(path);
        } else {
            std::fprintf(stderr, "usage: %s [--out FILE] [--n LIST] [--reps R] [--quick] [--warmup W] [--only GROUPS] [--probe-path 0|1]\n",
                         argv[0]);
            return 2;
        }
    }
    const auto want = [&](const char* group) {
        if (only.empty()) return true;
        const std::string g = std::string(",") + group + ",";
        return (std::string(",") + only + ",").find(g) != std::string::npos;
    };
    if (!only.empty()) {
        std::size_t at = 0;
        while (at <= only.size()) {
            const std::size_t end = std::min(only.find(',', at), only.size());
            const std::string g = only.substr(at, end - at);
            static const char* known[] = {"zipvl", "h2o", "snapkv", "fastv", "purekv", "avl", "decode", "lists"};
            if (std::none_of(std::begin(known), std::end(known), [&](const char* k) { return g == k; })) {
                std::fprintf(stderr, "--only: unknown group '%s' (zipvl, h2o, snapkv, fastv, purekv, avl, decode, lists)\n", g.c_str());
                return 2;
            }
            at = end + 1;
        }
    }
    FILE* out = out_path ? std::fopen(out_path, "w") : stdout;
    if (!out) {
        std::fprintf(stderr, "cannot write %s\n", out_path);
        return 1;
    }
    std::fprintf(out, "impl,policy,dtype,H,H_kv,d,n,time_us,kept,p,note\n");
    cudaDeviceProp prop{};
    VLSPARSE_BENCH_CK(cudaGetDeviceProperties(&prop, 0));
    std::fprintf(stderr, "device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);

    const std::int64_t H = 28, Hkv = 4, d = 128;
    bench::EventTimer timer;
    cuda::ZipVLSelector sel;
    cuda::BaselineScorer scorer;
    cuda::AvlSelector avl;

    for (const std::int64_t n : ns) {
        // Inputs: uniform [-1, 1], and every 97th key row scaled by 3 (heavy hitters).
        SplitMix64 rng(static_cast<std::uint64_t>(n));
        std::vector<bfloat16> q(static_cast<std::size_t>(n * H * d)), k(static_cast<std::size_t>(n * Hkv * d));
        for (auto& x : q) x = bfloat16(static_cast<float>(2.0 * rng.uniform() - 1.0));
        for (std::int64_t j = 0; j < n; ++j)
            for (std::int64_t e = 0; e < Hkv * d; ++e)
                k[static_cast<std::size_t>(j * Hkv * d + e)] =
                    bfloat16(static_cast<float>((j % 97 == 0 ? 3.0 : 1.0) * (2.0 * rng.uniform() - 1.0)));
        cuda::DeviceArray<bfloat16> qd(q), kd(k);
        const View3<const bfloat16> qv(qd.data(), {n, H, d}), kv(kd.data(), {n, Hkv, d});
        const Layout layout = Layout::parse("image:" + std::to_string(n));
        if (want("zipvl")) {
            ZipVLParams P;  // paper defaults: 64 + 64 probes, layer-wise, tau 0.975
            const double med = timer.median_us([&] { sel.select(qv, kv, layout, 1, P); }, warmup, reps);
            const auto& s = sel.result();
            std::fprintf(out, "vlsparse,%s,bf16,%lld,%lld,%lld,%lld,%.2f,%.4f,%lld,%s\n",
                         "zipvl_select", static_cast<long long>(H),
                         static_cast<long long>(Hkv), static_cast<long long>(d), static_cast<long long>(n),
                         med, s.kept_ratio(), static_cast<long long>(s.p.at(0)),
                         "probes 64+64 layer-wise tau 0.975");
            std::fflush(out);
            std::fprintf(stderr, "n %lld: %.1f us, kept %.3f, p %lld\n", static_cast<long long>(n), med,
                         s.kept_ratio(), static_cast<long long>(s.p.at(0)));
        }
        // The other policies, each its whole selection call (which ends in one synchronization).
        auto row = [&](const char* policy, double med, double kept, const char* note) {
            std::fprintf(out, "vlsparse,%s,bf16,%lld,%lld,%lld,%lld,%.2f,%.4f,,%s\n", policy, static_cast<long long>(H),
                         static_cast<long long>(Hkv), static_cast<long long>(d), static_cast<long long>(n), med, kept, note);
            std::fflush(out);
            std::fprintf(stderr, "n %lld %s: %.1f us, kept %.3f\n", static_cast<long long>(n), policy, med, kept);
        };
        std::vector<bfloat16> vh(k);
        cuda::DeviceArray<bfloat16> vd(vh);
        const View3<const bfloat16> vv(vd.data(), {n, Hkv, d});
        // The layer's dense prefill with and without each row's log-sum-exp (the row statistics H2O,
        // SnapKV, FastV, A-VL and PureKV can take from it), timed; its lse kept for those selections.
        const bool with_lse = want("h2o") || want("avl") || want("fastv") || want("snapkv") || want("purekv");
        cuda::DeviceArray<float> lsed(static_cast<std::size_t>(with_lse ? n * H : 1));
        const View2<const float> lc(lsed.data(), {n, H});
        if (with_lse) {
            cuda::DeviceArray<bfloat16> od(static_cast<std::size_t>(n * H * d));
            const View3<bfloat16> ov(od.data(), {n, H, d});
            const View2<float> lv(lsed.data(), {n, H});
            cuda::PrefillOptions po;
            po.check_finite = false;
            po.check_inputs = false;
            const int preps = n > 65536 ? 3 : 7;
            const double mp = timer.median_us([&] { cuda::dense_prefill_attention(qv, kv, vv, ov, po); }, 1, preps);
            const double ml = timer.median_us([&] { cuda::dense_prefill_attention(qv, kv, vv, ov, lv, po); }, 1, preps);
            row("vlsparse_dense_prefill", mp, 1.0, "vlsparse dense causal prefill of the layer (wgmma)");
            row("vlsparse_dense_prefill_lse", ml, 1.0, "the same, also writing each row's log-sum-exp");
        }
        if (n <= 32768 && want("h2o")) {
            H2OParams P;
            P.heavy = TokenBudget::ratio(0.1);
            P.recent = TokenBudget::ratio(0.1);
            const double med = timer.median_us([&] { scorer.h2o_device_select(qv, kv, P); }, warmup, reps);
            row("h2o_select", med, scorer.h2o_device_select(qv, kv, P).kept_ratio(), "heavy 10% recent 10% per KV head");
            const double medl = timer.median_us([&] { scorer.h2o_device_select(qv, kv, lc, P); }, warmup, reps);
            row("h2o_select_lse", medl, scorer.h2o_device_select(qv, kv, lc, P).kept_ratio(),
                "as h2o_select, the rows' log-sum-exp from the prefill given (no pass for the row statistics)");
        }
        if (want("snapkv")) {
            SnapKVParams P;
            P.window = 32;
            P.kernel = 7;
            P.capacity = TokenBudget::ratio(0.2);
            const double med = timer.median_us([&] { scorer.snapkv_device_select(qv, kv, P); }, warmup, reps);
            row("snapkv_select", med, scorer.snapkv_device_select(qv, kv, P).kept_ratio(), "window 32 avg pool 7 capacity 20% per KV head");
            const double medl = timer.median_us([&] { scorer.snapkv_device_select(qv, kv, lc, P); }, warmup, reps);
            row("snapkv_select_lse", medl, scorer.snapkv_device_select(qv, kv, lc, P).kept_ratio(),
                "as snapkv_select, the window rows' log-sum-exp from the prefill given");
        }
        if (want("fastv")) {
            FastVParams P;
            P.rate = 0.5;
            const double med = timer.median_us([&] { scorer.fastv_device_select(qv, kv, layout, P); }, warmup, reps);
            row("fastv_select", med, scorer.fastv_device_select(qv, kv, layout, P).kept_ratio(), "rate 0.5 (also A-VL's prefill score)");
            const double medl = timer.median_us([&] { scorer.fastv_device_select(qv, kv, lc, layout, P); }, warmup, reps);
            row("fastv_select_lse", medl, scorer.fastv_device_select(qv, kv, lc, layout, P).kept_ratio(),
                "as fastv_select, the last row's log-sum-exp from the prefill given (one pass over the keys)");
        }
        if (want("purekv")) {
            PureKVParams P;  // window 32, 20% budget, per KV head, l0 = 2
            cuda::PureKVEstimator est(P, layout, ModelShape{4, H, Hkv, d});
            const double med0 = timer.median_us([&] { est.observe(2, qv, kv); est.select(2, vv); }, warmup, reps);
            row("purekv_select_l0", med0, est.select(2, vv).kept_ratio(), "window scores + V norms + top-h (layer l0)");
            const double med0l = timer.median_us([&] { est.observe(2, qv, kv, lc); est.select(2, vv); }, warmup, reps);
            row("purekv_select_l0_lse", med0l, est.select(2, vv).kept_ratio(),
                "as purekv_select_l0, the window rows' log-sum-exp from the prefill given");
            const double med1 = timer.median_us([&] { est.select(3, vv); }, warmup, reps);
            row("purekv_select_above_l0", med1, est.select(3, vv).kept_ratio(), "V norms + top-h (a layer above l0, Eq. 4)");
        }
        if (want("avl")) {
            AvlParams P;  // rate 0.5, compute_rate 0.7: kept and core sets (two list builds)
            const double med = timer.median_us([&] { avl.select(qv, kv, layout, P); }, warmup, reps);
            row("avl_select", med, avl.select(qv, kv, layout, P).kept.kept_ratio(), "rate 0.5 compute_rate 0.7 kept + core sets");
            const double meda = timer.median_us([&] { avl.select(qv, kv, lc, layout, P); }, warmup, reps);
            row("avl_select_lse", meda, avl.select(qv, kv, lc, layout, P).kept.kept_ratio(),
                "as avl_select, the last row's log-sum-exp from the prefill given (one pass over the keys)");
            if (n > 1024) {
                // The text budget (H2O for the text tokens) on a layout with 512 text tokens around the image:
                // every row scored against every key (as H2O's own selection), and with the rows' log-sum-exp
                // from the layer's dense prefill (cuda::dense_prefill_attention with lse, run once here and
                // timed beside the plain prefill): only the key blocks of older text tokens scored.
                AvlParams PT = P;
                PT.text_rate = 0.5;
                const Layout lt = Layout::parse("text:256,image:" + std::to_string(n - 512) + ",text:256");
                if (n <= 32768) {
                    const double medt = timer.median_us([&] { avl.select(qv, kv, lt, PT); }, warmup, reps);
                    row("avl_select_text", medt, avl.select(qv, kv, lt, PT).kept.kept_ratio(),
                        "rate 0.5 compute_rate 0.7, text budget 0.5 per KV head (text:256,image,text:256)");
                }
                const double medl = timer.median_us([&] { avl.select(qv, kv, lc, lt, PT); }, warmup, reps);
                row("avl_select_text_lse", medl, avl.select(qv, kv, lc, lt, PT).kept.kept_ratio(),
                    "as avl_select_text, the rows' log-sum-exp from the prefill given (key blocks of older text only)");
            }
        }
        if (want("decode")) {
            // Decode-time work (target: <= 10% of one dense decode step of the layer): A-VL's rows of a
            // step (cuda::AvlDecodeSchedule::positions, a non-refresh step) and the core re-rank after a
            // refresh step (refresh, checked: one synchronization; unchecked: none), beside one dense
            // decode step over the layer's n rows (B = 1, the same K / V, checks off).
            AvlParams P;
            P.refresh_every = 3;
            cuda::AvlDecodeSchedule sch;
            sch.reset(avl.select(qv, kv, layout, P), P);
            sch.begin_step(0);
            const std::int64_t full = sch.positions(0, n + 1).indptr.back();
            std::vector<float> probs(static_cast<std::size_t>(full));
            for (auto& x : probs) x = static_cast<float>(rng.uniform());
            cuda::DeviceArray<float> pd(probs);
            std::int64_t t = 0;
            auto next_step = [&](bool refresh) {
                do ++t;
                while (sch.is_refresh(t) != refresh);
                sch.begin_step(t);
            };
            bench::EventTimer rt(true);  // read flush: calls of tens of microseconds (see cuda_bench_util.cuh)
            const double ref = rt.median_us([&] {
                next_step(true);
                sch.positions(t, n + 1);
                sch.refresh(t, pd.data());
            }, warmup, reps);
            row("avl_decode_refresh", ref, static_cast<double>(full) / static_cast<double>(n), "rows of a refresh step + core re-rank, checked (one sync)");
            const double ref_ns = rt.median_us([&] {
                next_step(true);
                sch.positions(t, n + 1);
                sch.refresh(t, pd.data(), nullptr, false);
            }, warmup, reps);
            row("avl_decode_refresh_nosync", ref_ns, static_cast<double>(full) / static_cast<double>(n), "rows of a refresh step + core re-rank, unchecked (no sync)");
            const double pos = rt.median_us([&] {
                next_step(false);
                sch.positions(t, n + 1);
            }, warmup, reps);
            row("avl_decode_rows", pos, static_cast<double>(sch.base_rows() + 1) / static_cast<double>(n), "rows of a non-refresh step (core + text + decode tokens)");
            // One dense decode step of the layer: K / V token-major [n, H_kv, d] as a batch of one.
            std::vector<std::int32_t> lens{static_cast<std::int32_t>(n)};
            cuda::DeviceArray<std::int32_t> lens_d(lens);
            const KvBatchView<const bfloat16> cv = contiguous_kv_batch<const bfloat16>(kd.data(), vd.data(), 1, n, Hkv, d, lens_d.data());
            cuda::DecodePlan plan;
            plan.plan({lens, {}, {}, 1}, H, Hkv, d, false, nullptr, DType::bf16);
            cuda::DeviceArray<bfloat16> q1(static_cast<std::size_t>(H * d)), o1(static_cast<std::size_t>(H * d));
            VLSPARSE_BENCH_CK(cudaMemcpy(q1.data(), qd.data(), static_cast<std::size_t>(H * d) * sizeof(bfloat16), cudaMemcpyDeviceToDevice));
            cuda::DecodeOptions dop;
            dop.check_inputs = false;
            dop.check_finite = false;
            const View3<const bfloat16> q1v(q1.data(), {1, H, d});
            const View3<bfloat16> o1v(o1.data(), {1, H, d});
            const double dec = rt.median_us([&] { cuda::batched_decode_attention(plan, q1v, cv, BatchRowLists{}, o1v, dop); }, warmup, reps);
            row("dense_decode_step", dec, 1.0, "one dense decode step of the layer, B = 1 (batched_decode_attention)");
            // The steps as an engine runs them: the step's plan and decode (over the policy's list, writing the
            // probabilities its update reads), alone and followed by the update; the difference is what the
            // policy adds to a decode step. K / V of n + S rows: the prompt's, then the decode tokens'.
            const std::int64_t S = 8 * (warmup + reps) + 16;  // H2O's six timed loops of steps, and A-VL's
            const std::size_t prompt_elems = static_cast<std::size_t>(n * Hkv * d), all_elems = static_cast<std::size_t>((n + S) * Hkv * d);
            cuda::DeviceArray<bfloat16> kx(all_elems), vx(all_elems);
            VLSPARSE_BENCH_CK(cudaMemset(kx.data(), 0, all_elems * sizeof(bfloat16)));
            VLSPARSE_BENCH_CK(cudaMemset(vx.data(), 0, all_elems * sizeof(bfloat16)));
            VLSPARSE_BENCH_CK(cudaMemcpy(kx.data(), kd.data(), prompt_elems * sizeof(bfloat16), cudaMemcpyDeviceToDevice));
            VLSPARSE_BENCH_CK(cudaMemcpy(vx.data(), vd.data(), prompt_elems * sizeof(bfloat16), cudaMemcpyDeviceToDevice));
            std::vector<std::int32_t> lens_x{static_cast<std::int32_t>(n + S)};
            cuda::DeviceArray<std::int32_t> lens_xd(lens_x);
            const KvBatchView<const bfloat16> cx = contiguous_kv_batch<const bfloat16>(kx.data(), vx.data(), 1, n + S, Hkv, d, lens_xd.data());
            cuda::DecodePlan step_plan;
            cuda::DeviceArray<float> step_probs(static_cast<std::size_t>(Hkv * (n + S)));
            auto step_decode = [&](const cuda::DeviceSelection& r, bool probs) {
                step_plan.plan({lens_x, {}, r.indptr, static_cast<std::int32_t>(r.lists())}, H, Hkv, d, probs, nullptr, DType::bf16);
                cuda::batched_decode_attention(step_plan, q1v, cx, r.rows(), o1v, dop, nullptr, probs ? step_probs.data() : nullptr);
            };
            {
                const double dec_p = rt.median_us([&] {
                    next_step(true);
                    step_decode(sch.positions(t, n + 1), true);
                }, warmup, reps);
                const double dec_r = rt.median_us([&] {
                    next_step(true);
                    step_decode(sch.positions(t, n + 1), true);
                    sch.refresh(t, step_probs.data(), nullptr, false);
                }, warmup, reps);
                const double kept = static_cast<double>(full) / static_cast<double>(n);
                row("avl_step_decode", dec_p, kept, "a refresh step as run: rows, plan, decode over every kept row with probabilities");
                row("avl_step_decode_rerank", dec_r, kept, "the same step followed by the core re-rank (unchecked)");
                std::fprintf(stderr, "n %lld A-VL re-rank in the loop: +%.1f us = %.1f%% of a dense decode step\n",
                             static_cast<long long>(n), dec_r - dec_p, 100.0 * (dec_r - dec_p) / dec);
                // With async_refresh the re-rank's set is read from step t + 2, so an engine can run it on a
                // second stream beside step t + 1's decode: a refresh step and the step after it, with the
                // re-rank on a non-blocking stream joined at the end, against the same two steps without it.
                AvlParams PA = P;
                PA.async_refresh = true;
                cuda::AvlDecodeSchedule sa;
                sa.reset(avl.select(qv, kv, layout, PA), PA);
                cudaStream_t side = nullptr;
                cudaEvent_t probs_ready = nullptr, ranked = nullptr;
                VLSPARSE_BENCH_CK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
                VLSPARSE_BENCH_CK(cudaEventCreateWithFlags(&probs_ready, cudaEventDisableTiming));
                VLSPARSE_BENCH_CK(cudaEventCreateWithFlags(&ranked, cudaEventDisableTiming));
                std::int64_t ta = -1;
                auto two_steps = [&](bool rerank) {
                    do ++ta;
                    while (!sa.is_refresh(ta));
                    sa.begin_step(ta);
                    step_decode(sa.positions(ta, n + 1), true);
                    if (rerank) {
                        VLSPARSE_BENCH_CK(cudaEventRecord(probs_ready, nullptr));
                        VLSPARSE_BENCH_CK(cudaStreamWaitEvent(side, probs_ready, 0));
                        sa.refresh(ta, step_probs.data(), side, false);
                        VLSPARSE_BENCH_CK(cudaEventRecord(ranked, side));
                    }
                    sa.begin_step(++ta);
                    step_decode(sa.positions(ta, n + 1), false);
                    if (rerank) VLSPARSE_BENCH_CK(cudaStreamWaitEvent(nullptr, ranked, 0));
                };
                const double two = rt.median_us([&] { two_steps(false); }, warmup, reps);
                const double two_r = rt.median_us([&] { two_steps(true); }, warmup, reps);
                row("avl_two_steps", two, kept, "a refresh step and the next step (plan, rows, decode; async_refresh)");
                row("avl_two_steps_rerank_side", two_r, kept, "the same with the re-rank on a second stream beside the next step");
                std::fprintf(stderr, "n %lld A-VL re-rank on a second stream: +%.1f us = %.1f%% of a dense decode step\n",
                             static_cast<long long>(n), two_r - two, 100.0 * (two_r - two) / dec);
                VLSPARSE_BENCH_CK(cudaEventDestroy(probs_ready));
                VLSPARSE_BENCH_CK(cudaEventDestroy(ranked));
                VLSPARSE_BENCH_CK(cudaStreamDestroy(side));
            }
            // H2O's decode-time update (cuda::H2ODecode::observe: a_j += the step's attention, one eviction
            // per KV head, the next token appended; no synchronization) on heavy 10% + recent 10% lists.
            {
                H2OParams HP;
                HP.heavy = TokenBudget::ratio(0.1);
                HP.recent = TokenBudget::ratio(0.1);
                cuda::H2ODecode h2o;
                h2o.reset(scorer.h2o_device_select(qv, kv, HP), HP, H, S - 2);
                std::vector<float> hp(static_cast<std::size_t>(h2o.rows().indptr.back()));
                for (auto& x : hp) x = static_cast<float>(rng.uniform() / static_cast<double>(hp.size()));
                cuda::DeviceArray<float> hpd(hp);
                // Both step paths in the same run: the two kernels split at the group barrier first, then the
                // default (one kernel where its grid fits the resident blocks).
                h2o.set_step_path(cuda::H2OStepPath::two_kernels);
                const double upd2 = rt.median_us([&] { h2o.observe(hpd.data()); }, warmup, reps);
                h2o.set_step_path(cuda::H2OStepPath::automatic);
                const double upd = rt.median_us([&] { h2o.observe(hpd.data()); }, warmup, reps);
                const bool one = h2o.last_step_path() == cuda::H2OStepPath::one_kernel;
                const double kept = static_cast<double>(h2o.rows().indptr.back()) / static_cast<double>(Hkv * n);
                row("h2o_decode_update_two_kernels", upd2, kept,
                    "H2O's update as two kernels (scores + eviction candidate, then the next lists), heavy 10% recent 10% per KV head");
                row("h2o_decode_update", upd, kept,
                    one ? "H2O's update after a decode step (scores + eviction + append in one kernel, no sync), heavy 10% recent 10% per KV head"
                        : "H2O's update after a decode step (two kernels: the lists do not fit one), heavy 10% recent 10% per KV head");
                const double dec_np = rt.median_us([&] { step_decode(h2o.rows(), false); }, warmup, reps);
                const double dec_p = rt.median_us([&] { step_decode(h2o.rows(), true); }, warmup, reps);
                const double dec_u = rt.median_us([&] {
                    step_decode(h2o.rows(), true);
                    h2o.observe(step_probs.data());
                }, warmup, reps);
                h2o.set_step_path(cuda::H2OStepPath::two_kernels);
                const double dec_u2 = rt.median_us([&] {
                    step_decode(h2o.rows(), true);
                    h2o.observe(step_probs.data());
                }, warmup, reps);
                h2o.set_step_path(cuda::H2OStepPath::automatic);
                row("h2o_step_decode_noprobs", dec_np, kept, "an H2O step's plan and decode over its lists, no probabilities");
                row("h2o_step_decode", dec_p, kept, "the same with the probabilities the update reads");
                row("h2o_step_decode_update", dec_u, kept, "the same followed by the update (observe)");
                row("h2o_step_decode_update_two_kernels", dec_u2, kept, "the same, the update as two kernels");
                // The same step with the probabilities computed inside the update from the scores the decode
                // leaves in its plan (defer_probs, observe(plan)): no probability kernel.
                cuda::DecodeOptions dfr = dop;
                dfr.defer_probs = true;
                const double dec_f = rt.median_us([&] {
                    const cuda::DeviceSelection& r = h2o.rows();
                    step_plan.plan({lens_x, {}, r.indptr, static_cast<std::int32_t>(r.lists())}, H, Hkv, d, true, nullptr, DType::bf16);
                    cuda::batched_decode_attention(step_plan, q1v, cx, r.rows(), o1v, dfr);
                    h2o.observe(step_plan);
                }, warmup, reps);
                const double dec_d = rt.median_us([&] {
                    const cuda::DeviceSelection& r = h2o.rows();
                    step_plan.plan({lens_x, {}, r.indptr, static_cast<std::int32_t>(r.lists())}, H, Hkv, d, true, nullptr, DType::bf16);
                    cuda::batched_decode_attention(step_plan, q1v, cx, r.rows(), o1v, dfr);
                }, warmup, reps);
                h2o.set_step_path(cuda::H2OStepPath::two_kernels);
                const double dec_f2 = rt.median_us([&] {
                    const cuda::DeviceSelection& r = h2o.rows();
                    step_plan.plan({lens_x, {}, r.indptr, static_cast<std::int32_t>(r.lists())}, H, Hkv, d, true, nullptr, DType::bf16);
                    cuda::batched_decode_attention(step_plan, q1v, cx, r.rows(), o1v, dfr);
                    h2o.observe(step_plan);
                }, warmup, reps);
                h2o.set_step_path(cuda::H2OStepPath::automatic);
                row("h2o_step_decode_update_fused", dec_f, kept,
                    "the same with the probabilities computed inside the update (defer_probs, observe(plan))");
                row("h2o_step_decode_update_fused_two_kernels", dec_f2, kept, "the same, the update as two kernels");
                row("h2o_step_decode_deferred", dec_d, kept, "the step's plan and decode keeping the scores for the update (defer_probs), no update");
                // The floor of any separate kernel in this harness: an empty kernel timed the same way.
                const double empty = rt.median_us([&] { bench::bench_empty_kernel<><<<1, 32>>>(); }, warmup, reps);
                row("empty_kernel", empty, 0.0, "an empty kernel timed as the calls above (the floor of a separate launch)");
                std::fprintf(stderr, "n %lld H2O update alone: %.1f us = %.1f%% of a dense decode step (two kernels: %.1f us = %.1f%%)\n",
                             static_cast<long long>(n), upd, 100.0 * upd / dec, upd2, 100.0 * upd2 / dec);
                std::fprintf(stderr, "n %lld H2O update in the loop: +%.1f us = %.1f%% of a dense decode step (probabilities +%.1f us; "
                             "two kernels +%.1f us = %.1f%%)\n",
                             static_cast<long long>(n), dec_u - dec_p, 100.0 * (dec_u - dec_p) / dec, dec_p - dec_np, dec_u2 - dec_p,
                             100.0 * (dec_u2 - dec_p) / dec);
                std::fprintf(stderr, "n %lld H2O probabilities + update inside the update: +%.1f us over the decode without "
                             "probabilities = %.1f%% of a dense decode step (with the probability kernel: +%.1f us; two kernels: "
                             "+%.1f us)\n",
                             static_cast<long long>(n), dec_f - dec_np, 100.0 * (dec_f - dec_np) / dec, dec_u - dec_np, dec_f2 - dec_np);
                std::fprintf(stderr, "n %lld H2O deferred scores in the decode: +%.1f us; the update after them: +%.1f us = %.1f%% "
                             "(two kernels +%.1f us); an empty kernel %.1f us\n",
                             static_cast<long long>(n), dec_d - dec_np, dec_f - dec_d, 100.0 * (dec_f - dec_d) / dec, dec_f2 - dec_d, empty);
            }
        }
        if (want("lists")) {
            StreamingLLMParams P;
            P.sinks = 4;
            P.recent = TokenBudget::ratio(0.2);
            const double med = timer.median_us([&] { scorer.streamingllm_device_select(n, P); }, warmup, reps);
            row("streamingllm_select", med, scorer.streamingllm_device_select(n, P).kept_ratio(), "4 sinks + 20% recent (host list uploaded)");
            RandomParams R;
            R.keep = TokenBudget::ratio(0.2);
            const double medr = timer.median_us([&] { scorer.random_device_select(layout, 1, R); }, warmup, reps);
            row("random_select", medr, scorer.random_device_select(layout, 1, R).kept_ratio(), "20% (host list uploaded)");
            FixedRatioParams F;
            F.keep = TokenBudget::ratio(0.2);
            const double medf = timer.median_us([&] { scorer.fixed_ratio_device_select(layout, F); }, warmup, reps);
            row("fixed_ratio_select", medf, scorer.fixed_ratio_device_select(layout, F).kept_ratio(), "20% uniform stride (host list uploaded)");
        }
    }
    if (out != stdout) std::fclose(out);
    return 0;
}
