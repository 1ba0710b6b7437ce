// A-VL in a decode loop: the DecodeSchedule says which cache rows each step reads.
//
// Prefill (dense, done by the engine) leaves one layer's K/V; A-VL scores every prompt token by the
// last token's head-mean attention, keeps 50% of each image's tokens in the cache (the rest are
// evicted) and computes with 30% of them ("core") on most steps. Every K = 3 steps the step reads
// every kept row and re-ranks the core set from its own attention. The other steps read the core
// image rows plus every text and decode row, by an index list of cache rows: the skipped rows are
// never touched. This program runs 9 decode steps on toy numbers and prints what each step read.
#include <cstdio>
#include <vector>

#include <vlsparse/vlsparse.hpp>

int main() {
    namespace vs = vlsparse;
    const std::int64_t H = 8, Hkv = 2, d = 64, steps = 9;
    const auto layout = vs::Layout::parse("text:12,image:144,text:8,image:100,text:16");
    const std::int64_t n = layout.n();

    // Toy prompt Q/K/V [n, heads, d] in fp32, as an engine would hold them after the prefill.
    vs::SplitMix64 rng(7);
    auto fill = [&](std::int64_t count) {
        std::vector<float> x(static_cast<std::size_t>(count));
        for (auto& e : x) e = static_cast<float>(rng.uniform() - 0.5);
        return x;
    };
    const auto q = fill(n * H * d), k = fill(n * Hkv * d), v = fill(n * Hkv * d);
    const vs::View3<const float> qv(q.data(), {n, H, d}), kv(k.data(), {n, Hkv, d}), vv(v.data(), {n, Hkv, d});

    // 1. Score, select, evict.
    vs::AvlParams params;  // rate 0.5, compute_rate 0.7, K = 3 (the released code's defaults)
    const std::vector<double> scores = vs::simd::avl_scores(qv, kv);
    const vs::AvlSelection sel = vs::avl_select(scores, layout, params);
    vs::KvCache<float> cache(Hkv, d);
    cache.assign(kv, vv);
    cache.keep(sel.kept);  // minor image tokens leave the cache; positions are kept
    std::printf("prompt %lld tokens, cache keeps %lld rows per KV head, core set %zu image tokens\n",
                static_cast<long long>(n), static_cast<long long>(cache.rows(0)), sel.core.size());

    // 2. Decode: append the new token's K/V, then let the schedule pick the rows of this step.
    vs::DecodeSchedule schedule(sel, params);
    std::vector<float> out(static_cast<std::size_t>(H * d));
    for (std::int64_t t = 0; t < steps; ++t) {
        const auto qn = fill(H * d), kn = fill(Hkv * d), vn = fill(Hkv * d);
        cache.append(vs::View2<const float>(kn.data(), {Hkv, d}), vs::View2<const float>(vn.data(), {Hkv, d}));
        const vs::AvlStep st = vs::simd::avl_decode_step(vs::View2<const float>(qn.data(), {H, d}), cache, schedule, t,
                                                         vs::View2<float>(out.data(), {H, d}));
        std::printf("step %lld: %-7s read %4zu of %4lld cached rows; core now %zu tokens, first %lld\n",
                    static_cast<long long>(t), st.refresh ? "refresh" : "core", st.read.indices[0].size(),
                    static_cast<long long>(cache.rows(0)), schedule.core().size(),
                    static_cast<long long>(schedule.core().front()));
    }
    // 3. An engine with its own attention kernel uses the schedule alone: positions -> cache rows.
    schedule.begin_step(steps);
    const vs::CacheRows rows = vs::rows_for_positions(cache, schedule.positions(steps, cache.seq_len()));
    std::printf("step %lld (%s) would read %zu rows (rows %lld, %lld, ...)\n", static_cast<long long>(steps),
                schedule.is_refresh(steps) ? "refresh" : "core", rows.list(0).size(), static_cast<long long>(rows.list(0)[0]),
                static_cast<long long>(rows.list(0)[1]));
    return 0;
}
