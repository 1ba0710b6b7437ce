// H2O's decode-time work on the GPU (vlsparse/cuda/h2o_decode.cuh): a sequence's prefill selection on
// the device (BaselineScorer::h2o_device_select), then decode steps through batched_decode_attention
// over H2ODecode::rows() with the kernel's probabilities, each folded in by observe(). A host replica
// runs the CPU path's rule on the same numbers: the prefill's kept lists and fp32 scores, every step's
// probabilities as the kernel wrote them, a_j += p x (heads per list) as one fp32 fused multiply-add
// (the device's operation, so the replica's scores equal the device's bit for bit), and h2o_keep (the
// library's eviction: the last `recent` positions plus the `heavy` best older ones, equal scores broken
// by the lower position). Every step's device lists must equal the replica's exactly, and the scores at
// the end. Cases: grouping kv_head (H_kv lists) and layer (one list), with and without eviction, a
// prompt shorter than heavy + recent (no eviction until the cache fills), ties (q = 0: every key of a
// step equally likely), and every error.
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <tuple>
#include <vector>

#include <vlsparse/core/rng.hpp>
#include <vlsparse/cuda/baselines.cuh>
#include <vlsparse/cuda/decode.cuh>
#include <vlsparse/cuda/h2o_decode.cuh>

#include "../test_core.hpp"

using namespace vlsparse;
using Catch::Matchers::Contains;

namespace {

struct H2OCase {
    std::int64_t n = 300, H = 8, Hkv = 2, d = 64, steps = 12;
    double heavy = 0.1, recent = 0.1;
    BaselineGroups groups = BaselineGroups::kv_head;
    bool evict = true, zero_q = false;
    bool from_plan = false;  // observe(plan): the probabilities computed inside the update
    cuda::H2OStepPath path = cuda::H2OStepPath::automatic;
    std::uint64_t seed = 1;
};

template <class T>
std::vector<T> download(const T* p, std::size_t count) {
    std::vector<T> h(count);
    if (count) REQUIRE(cudaMemcpy(h.data(), p, count * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
    return h;
}

void run_case(const H2OCase& c) {
    const std::int64_t n = c.n, H = c.H, Hkv = c.Hkv, d = c.d, S = c.steps, cap = n + S;
    INFO("n " << n << ", H " << H << "/" << Hkv << ", " << (c.groups == BaselineGroups::kv_head ? "kv_head" : "layer")
              << ", heavy " << c.heavy << ", recent " << c.recent << (c.evict ? "" : ", no eviction")
              << (c.zero_q ? ", q = 0" : "") << (c.from_plan ? ", observe(plan)" : "")
              << (c.path == cuda::H2OStepPath::two_kernels ? ", two kernels a step" : ", one kernel a step"));
    SplitMix64 rng(vt::seed_or(20261126u) * 7919u + c.seed);
    auto values = [&](std::int64_t count, double spread, bool zero) {
        std::vector<bfloat16> x(static_cast<std::size_t>(count));
        for (auto& e : x) e = bfloat16(zero ? 0.0f : static_cast<float>(spread * (2.0 * rng.uniform() - 1.0)));
        return x;
    };
    // The prompt's q, the whole cache's K / V (the prompt's n rows, then one row per decode token), the
    // decode tokens' q.
    const auto q = values(n * H * d, 2.0, c.zero_q), k = values(cap * Hkv * d, 1.0, false), v = values(cap * Hkv * d, 1.0, false);
    const auto dq = values(S * H * d, 2.0, c.zero_q);
    cuda::DeviceArray<bfloat16> qd(q), kd(k), vd(v), dqd(dq), od(static_cast<std::size_t>(H * d));
    H2OParams P;
    P.heavy = TokenBudget::ratio(c.heavy);
    P.recent = TokenBudget::ratio(c.recent);
    P.groups = c.groups;
    P.evict_during_decode = c.evict;
    cuda::BaselineScorer scorer;
    const auto& kept = scorer.h2o_device_select(View3<const bfloat16>(qd.data(), {n, H, d}), View3<const bfloat16>(kd.data(), {n, Hkv, d}), P);
    const std::int64_t G = kept.lists();
    // The replica's start: the prefill's lists and fp32 scores.
    const TokenSelection sel = kept.to_host();
    std::vector<std::vector<float>> a(static_cast<std::size_t>(G), std::vector<float>(static_cast<std::size_t>(cap + 1), 0.0f));
    {
        const auto s = download(kept.scores, static_cast<std::size_t>(G * n));
        for (std::int64_t g = 0; g < G; ++g)
            std::copy_n(s.begin() + g * n, n, a[static_cast<std::size_t>(g)].begin());
    }
    std::vector<std::vector<std::int64_t>> lists = sel.indices;
    cuda::H2ODecode h2o;
    h2o.set_step_path(c.path);
    h2o.reset(kept, P, H, S);
    const std::int64_t heavy = P.heavy.resolve(n), recent = std::min(P.recent.resolve(n), n);
    const float heads = static_cast<float>(H / G);
    std::vector<std::int32_t> lens{0};
    cuda::DeviceArray<std::int32_t> lens_d(lens);
    int evictions = 0;
    for (std::int64_t t = 0; t < S; ++t) {
        INFO("step " << t);
        for (auto& l : lists) l.push_back(n + t);
        // The device's lists of this step equal the replica's.
        const cuda::DeviceSelection& rows = h2o.rows();
        REQUIRE(rows.lists() == G);
        REQUIRE(rows.n == n + t + 1);
        const TokenSelection got = rows.to_host();
        for (std::int64_t g = 0; g < G; ++g) REQUIRE(got.indices[static_cast<std::size_t>(g)] == lists[static_cast<std::size_t>(g)]);
        // Decode over them with probabilities.
        lens[0] = static_cast<std::int32_t>(n + t + 1);
        lens_d.upload(lens);
        const KvBatchView<const bfloat16> cache =
            contiguous_kv_batch<const bfloat16>(kd.data(), vd.data(), 1, cap, static_cast<std::int32_t>(Hkv), static_cast<std::int32_t>(d), lens_d.data());
        cuda::DecodePlan plan;
        plan.plan({lens, {}, rows.indptr, static_cast<std::int32_t>(G)}, H, Hkv, d, true, nullptr, DType::bf16);
        cuda::DeviceArray<float> probs(static_cast<std::size_t>(plan.n_entries()));
        cuda::batched_decode_attention(plan, View3<const bfloat16>(dqd.data() + t * H * d, {1, H, d}), cache, rows.rows(),
                                       View3<bfloat16>(od.data(), {1, H, d}), cuda::DecodeOptions{}, nullptr, probs.data());
        const auto p = probs.download();
        if (c.from_plan) {
            // The step again with its scores kept in the plan and no probability kernel (the decode kernel
            // is deterministic: it writes the same scores); the update computes the probabilities itself
            // and must add the very bits the replica adds.
            cuda::DecodeOptions deferred;
            deferred.defer_probs = true;
            cuda::batched_decode_attention(plan, View3<const bfloat16>(dqd.data() + t * H * d, {1, H, d}), cache, rows.rows(),
                                           View3<bfloat16>(od.data(), {1, H, d}), deferred);
            h2o.observe(plan, nullptr, t % 5 == 4);
        } else {
            h2o.observe(probs.data(), nullptr, t % 5 == 4);
        }
        // These lists fit the device's resident blocks: automatic takes the one-kernel step.
        REQUIRE(h2o.last_step_path() ==
                (c.path == cuda::H2OStepPath::two_kernels ? cuda::H2OStepPath::two_kernels : cuda::H2OStepPath::one_kernel));
        // The replica: a_j += p x heads, then h2o_keep.
        for (std::int64_t g = 0; g < G; ++g) {
            const auto& l = lists[static_cast<std::size_t>(g)];
            auto& ag = a[static_cast<std::size_t>(g)];
            const std::size_t off = static_cast<std::size_t>(g) * l.size();
            for (std::size_t i = 0; i < l.size(); ++i)
                ag[static_cast<std::size_t>(l[i])] = std::fma(p[off + i], heads, ag[static_cast<std::size_t>(l[i])]);
        }
        if (c.evict)
            for (std::int64_t g = 0; g < G; ++g) {
                auto& l = lists[static_cast<std::size_t>(g)];
                const auto& ag = a[static_cast<std::size_t>(g)];
                const auto before = l.size();
                l = h2o_keep(std::span<const std::int64_t>(l), heavy, recent, [&](std::int64_t pos) { return ag[static_cast<std::size_t>(pos)]; });
                evictions += static_cast<int>(before - l.size());
            }
    }
    // The lists after the last step (with the next token appended) and the scores.
    for (auto& l : lists) l.push_back(n + S);
    const TokenSelection last = h2o.rows().to_host();
    for (std::int64_t g = 0; g < G; ++g) CHECK(last.indices[static_cast<std::size_t>(g)] == lists[static_cast<std::size_t>(g)]);
    const auto s = download(h2o.scores(), static_cast<std::size_t>(G * h2o.score_stride()));
    for (std::int64_t g = 0; g < G; ++g)
        for (std::int64_t j = 0; j <= n + S - 1; ++j) {
            INFO("group " << g << " position " << j);
            REQUIRE(s[static_cast<std::size_t>(g * h2o.score_stride() + j)] == a[static_cast<std::size_t>(g)][static_cast<std::size_t>(j)]);
        }
    if (c.evict && n > heavy + recent) CHECK(evictions == static_cast<int>(G * S));
    if (!c.evict) CHECK(evictions == 0);
}

}  // namespace

TEST_CASE("cuda h2o decode: each step's lists and the scores equal the CPU rule on the kernel's probabilities", "[cuda][h2o]") {
    // Every case on both step paths: one kernel with a barrier among each group's blocks (automatic, for
    // lists that fit the device's resident blocks) and two kernels split at that barrier.
    for (cuda::H2OStepPath path : {cuda::H2OStepPath::automatic, cuda::H2OStepPath::two_kernels}) {
        std::uint64_t seed = path == cuda::H2OStepPath::automatic ? 0 : 100;
        auto run = [&](H2OCase c) {
            c.path = path;
            run_case(c);
        };
        for (BaselineGroups groups : {BaselineGroups::kv_head, BaselineGroups::layer})
            for (bool evict : {true, false})
                for (bool from_plan : {false, true}) {
                    H2OCase c;
                    c.groups = groups;
                    c.evict = evict;
                    c.from_plan = from_plan;
                    c.seed = ++seed;
                    run(c);
                }
        {
            H2OCase c;  // MQA, 28 heads, d 128, a longer cache; the probabilities from the plan
            c.from_plan = true;
            c.n = 1500;
            c.H = 28;
            c.Hkv = 4;
            c.d = 128;
            c.steps = 20;
            c.heavy = 0.05;
            c.recent = 0.02;
            c.seed = ++seed;
            run(c);
        }
        {
            H2OCase c;  // heavy + recent > n: the cache grows until it is over, then evicts
            c.n = 40;
            c.heavy = 0.5;
            c.recent = 0.6;
            c.steps = 16;
            c.seed = ++seed;
            run(c);
        }
        for (bool from_plan : {false, true}) {
            H2OCase c;  // q = 0: every step's probabilities equal, ties at every cut
            c.zero_q = true;
            c.n = 200;
            c.from_plan = from_plan;
            c.seed = ++seed;
            run(c);
        }
        // Lists of thousands of positions, each group's over tens of blocks: the dropped entry agreed among
        // them (the barrier of the one-kernel step), ties across blocks (q = 0).
        for (const auto& [n, heavy, recent, zero] : std::vector<std::tuple<std::int64_t, double, double, bool>>{
                 {12000, 0.3, 0.1, false}, {9000, 0.4, 0.05, true}, {45000, 0.3, 0.1, false}}) {
            H2OCase c;
            c.n = n;
            c.H = 8;
            c.Hkv = 2;
            c.heavy = heavy;
            c.recent = recent;
            c.zero_q = zero;
            c.steps = 6;
            c.seed = ++seed;
            run(c);
        }
    }
}

TEST_CASE("cuda h2o decode: errors", "[cuda][h2o]") {
    cuda::H2ODecode h2o;
    float* null = nullptr;
    REQUIRE_THROWS_WITH(h2o.observe(null), Contains("reset() was not called"));
    const std::int64_t n = 64, H = 4, Hkv = 2, d = 64;
    std::vector<bfloat16> x(static_cast<std::size_t>(n * H * d), bfloat16(0.25f));
    cuda::DeviceArray<bfloat16> qd(x), kd(x);
    const View3<const bfloat16> qv(qd.data(), {n, H, d}), kv(kd.data(), {n, Hkv, d});
    cuda::BaselineScorer scorer;
    H2OParams P;
    // A selection without scores (StreamingLLM's) is not H2O's.
    StreamingLLMParams S;
    REQUIRE_THROWS_WITH(h2o.reset(scorer.streamingllm_device_select(n, S), P, H, 4), Contains("carries no scores"));
    const auto& kept = scorer.h2o_device_select(qv, kv, P);
    REQUIRE_THROWS_WITH(h2o.reset(kept, P, 3, 4), Contains("expected a multiple"));
    REQUIRE_THROWS_WITH(h2o.reset(kept, P, H, -1), Contains("max_steps"));
    h2o.reset(kept, P, H, 1);
    REQUIRE_THROWS_WITH(h2o.observe(null), Contains("probs is null"));
    cuda::DeviceArray<float> probs(static_cast<std::size_t>(h2o.rows().indptr.back()));
    probs.fill_bytes(0);
    REQUIRE_NOTHROW(h2o.observe(probs.data(), nullptr, true));
    REQUIRE_THROWS_WITH(h2o.observe(probs.data()), Contains("past the max_steps"));
    // A non-finite probability is reported by a checked observe, on either step path.
    for (cuda::H2OStepPath path : {cuda::H2OStepPath::automatic, cuda::H2OStepPath::two_kernels}) {
        h2o.set_step_path(path);
        h2o.reset(kept, P, H, 2);
        probs.fill_bytes(0xff);  // NaN
        REQUIRE_THROWS_WITH(h2o.observe(probs.data(), nullptr, true), Contains("not finite"));
    }
    h2o.set_step_path(cuda::H2OStepPath::automatic);

    // observe(plan): a plan made with probabilities over this step's rows, and defer_probs's own checks.
    h2o.reset(kept, P, H, 2);
    const cuda::DeviceSelection& rows = h2o.rows();
    const std::int32_t len = static_cast<std::int32_t>(rows.n);
    const std::vector<std::int32_t> lens{len};
    cuda::DecodePlan no_probs, other, good;
    no_probs.plan({lens, {}, rows.indptr, static_cast<std::int32_t>(rows.lists())}, H, Hkv, d, false);
    REQUIRE_THROWS_WITH(h2o.observe(no_probs), Contains("with_probs"));
    const std::vector<std::int32_t> one_each{0, 1, 2};  // one entry per list
    other.plan({lens, {}, one_each, 2}, H, Hkv, d, true);
    REQUIRE_THROWS_WITH(h2o.observe(other), Contains("not this step's decode"));
    good.plan({lens, {}, rows.indptr, static_cast<std::int32_t>(rows.lists())}, H, Hkv, d, true);
    std::vector<bfloat16> kvx(static_cast<std::size_t>((len + 1) * Hkv * d), bfloat16(0.25f));
    cuda::DeviceArray<bfloat16> kc(kvx), vc(kvx), q1(std::vector<bfloat16>(static_cast<std::size_t>(H * d), bfloat16(0.5f))),
        o1(static_cast<std::size_t>(H * d));
    cuda::DeviceArray<std::int32_t> lens_d(lens);
    const KvBatchView<const bfloat16> cache = contiguous_kv_batch<const bfloat16>(kc.data(), vc.data(), 1, len + 1,
                                                                                  static_cast<std::int32_t>(Hkv),
                                                                                  static_cast<std::int32_t>(d), lens_d.data());
    const View3<const bfloat16> qv1(q1.data(), {1, H, d});
    const View3<bfloat16> ov1(o1.data(), {1, H, d});
    cuda::DecodeOptions deferred;
    deferred.defer_probs = true;
    cuda::DeviceArray<float> step_probs(static_cast<std::size_t>(good.n_entries()));
    REQUIRE_THROWS_WITH(cuda::batched_decode_attention(no_probs, qv1, cache, rows.rows(), ov1, deferred), Contains("defer_probs"));
    REQUIRE_THROWS_WITH(cuda::batched_decode_attention(good, qv1, cache, rows.rows(), ov1, deferred, nullptr, step_probs.data()),
                        Contains("defer_probs"));
    REQUIRE_NOTHROW(cuda::batched_decode_attention(good, qv1, cache, rows.rows(), ov1, deferred));
    REQUIRE_NOTHROW(h2o.observe(good, nullptr, true));
}

TEST_CASE("cuda h2o decode: a list too long for the one-kernel step takes two kernels", "[cuda][h2o]") {
    // One list of 600,000 positions (a hand-made selection with scores): 2344 blocks of 256 entries, more
    // than any current GPU holds resident at once, so the one-kernel step's barrier could not be met.
    // Forced, it is an error (no launch, no hang); automatic runs the two kernels, and their result is
    // checked against the rule on the host.
    const std::int64_t n = 600000, H = 4;
    std::vector<std::int32_t> all(static_cast<std::size_t>(n));
    std::vector<float> sc(static_cast<std::size_t>(n));
    for (std::int64_t j = 0; j < n; ++j) {
        all[static_cast<std::size_t>(j)] = static_cast<std::int32_t>(j);
        sc[static_cast<std::size_t>(j)] = static_cast<float>((j * 7919) % 1000) + 1.0f;
    }
    sc[123457] = 0.5f;  // the lowest older score: the entry the step drops
    cuda::DeviceArray<std::int32_t> idx(all), indptr(std::vector<std::int32_t>{0, static_cast<std::int32_t>(n)});
    cuda::DeviceArray<float> scores(sc);
    cuda::DeviceSelection kept;
    kept.n = n;
    kept.indptr = {0, static_cast<std::int32_t>(n)};
    kept.indices = idx.data();
    kept.indptr_dev = indptr.data();
    kept.scores = scores.data();
    kept.score_groups = 1;
    kept.score_len = n;
    H2OParams P;
    P.heavy = TokenBudget::ratio(0.5);
    P.recent = TokenBudget::ratio(0.5);
    P.groups = BaselineGroups::layer;
    cuda::H2ODecode h2o;
    h2o.set_step_path(cuda::H2OStepPath::one_kernel);
    h2o.reset(kept, P, H, 2);
    const std::int64_t c = h2o.rows().indptr.back();
    REQUIRE(c == n + 1);
    cuda::DeviceArray<float> probs(static_cast<std::size_t>(c));
    probs.fill_bytes(0);  // a step that adds nothing: the prefill's scores decide
    REQUIRE_THROWS_WITH(h2o.observe(probs.data()), Contains("resident at once"));
    h2o.set_step_path(cuda::H2OStepPath::automatic);
    REQUIRE_NOTHROW(h2o.observe(probs.data(), nullptr, true));
    REQUIRE(h2o.last_step_path() == cuda::H2OStepPath::two_kernels);
    // n + 1 positions over heavy + recent = n: the lowest older one dropped, n + 1 appended.
    std::vector<std::int64_t> want;
    want.reserve(static_cast<std::size_t>(n + 1));
    for (std::int64_t j = 0; j <= n + 1; ++j)
        if (j != 123457) want.push_back(j);
    const TokenSelection got = h2o.rows().to_host();
    REQUIRE(got.indices.size() == 1);
    CHECK(got.indices[0] == want);
}
