// The single-sequence CUDA front end (vlsparse/cuda/indexed_decode.cuh) against
// reference::indexed_decode_attention on host KvCaches: fresh seeded caches of fp32 / fp16 / bf16,
// GQA ratios 1, 2, 3, 4, 8 (3: a padded query block), head dims 40 / 64 / 128 / 256 (40: padded
// tiles), shared and per-KV-head lists of 1 entry up to every row (lengths not multiples of the
// tile), strided q, fp32 / bf16 outputs, repeat calls bit-identical; dense decode as the all-rows
// list, also after per-head eviction; the lists given as host CacheRows (over the device copy and over
// a cache view, on a non-blocking stream too) bit-identical to a DeviceRowLists; an engine's own cache
// view off 16-byte alignment; bad input is a vlsparse::error. Built with -Dcuda=enabled; runs on a GPU
// (suite cuda); the explicit instantiations below compile every overload's host code without one.
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include <vlsparse/attention/cache_rows.hpp>
#include <vlsparse/core/rng.hpp>

#include "../test_core.hpp"
#include <vlsparse/cuda/indexed_decode.cuh>
#include <vlsparse/kv/kv_cache.hpp>
#include <vlsparse/reference/attention.hpp>
#include <vlsparse/reference/indexed_decode.hpp>

using namespace vlsparse;
using Catch::Matchers::Contains;

// Compile-only: the CacheRows overloads for each cache type, with fp32 and 16-bit outputs (instantiated
// here, so a build without a GPU compiles their host code; run by the tests below).
template void cuda::indexed_decode_attention(View2<const float>, const KvBatchView<const float>&, const CacheRows&,
                                             View2<float>, const AttentionOptions&, cudaStream_t);
template void cuda::indexed_decode_attention(View2<const float>, const KvBatchView<const bfloat16>&, const CacheRows&,
                                             View2<bfloat16>, const AttentionOptions&, cudaStream_t);
template void cuda::indexed_decode_attention(View2<const vlsparse::half>, const cuda::DeviceKvCache<vlsparse::half>&,
                                             const CacheRows&, View2<vlsparse::half>, const AttentionOptions&,
                                             cudaStream_t);
template void cuda::indexed_decode_attention(View2<const float>, const cuda::DeviceKvCache<bfloat16>&, const CacheRows&,
                                             View2<float>, const AttentionOptions&, cudaStream_t);

namespace {

std::uint64_t base_seed() { return vt::seed_or(20261122u); }

std::vector<float> uniform(std::size_t n, std::uint64_t seed) {
    SplitMix64 rng(seed);
    std::vector<float> v(n);
    for (auto& x : v) x = static_cast<float>(rng.uniform()) * 2.0f - 1.0f;
    return v;
}

template <class T>
KvCache<T> random_cache(std::int64_t n, std::int64_t Hkv, std::int64_t d, std::uint64_t seed) {
    const auto k = uniform(static_cast<std::size_t>(n * Hkv * d), seed), v = uniform(k.size(), seed + 1);
    KvCache<T> c(Hkv, d);
    c.assign(View3<const float>(k.data(), {n, Hkv, d}), View3<const float>(v.data(), {n, Hkv, d}));
    return c;
}

std::vector<std::int64_t> random_subset(std::int64_t n, std::int64_t m, std::uint64_t seed) {
    std::vector<std::int64_t> all(static_cast<std::size_t>(n));
    std::iota(all.begin(), all.end(), std::int64_t{0});
    SplitMix64 rng(seed);
    for (std::int64_t i = n - 1; i > 0; --i) std::swap(all[static_cast<std::size_t>(i)], all[rng.below(static_cast<std::uint64_t>(i + 1))]);
    all.resize(static_cast<std::size_t>(m));
    std::sort(all.begin(), all.end());
    return all;
}

template <class T>
struct DeviceBuffer {
    T* p = nullptr;
    std::size_t n = 0;
    explicit DeviceBuffer(std::size_t count) : n(count) { REQUIRE(cudaMalloc(&p, count * sizeof(T)) == cudaSuccess); }
    DeviceBuffer(const std::vector<T>& h) : DeviceBuffer(h.size()) {
        REQUIRE(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
    }
    ~DeviceBuffer() { cudaFree(p); }
    std::vector<T> get() const {
        std::vector<T> h(n);
        REQUIRE(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
        return h;
    }
};

double nmse(const std::vector<float>& a, const std::vector<double>& ref) {
    double num = 0.0, den = 0.0;
    for (std::size_t i = 0; i < ref.size(); ++i) {
        num += (a[i] - ref[i]) * (a[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return num / std::max(den, 1e-300);
}

// Its own NMSE: the denominator floored at 1e-300 (vt::nmse is infinite when the reference is all zeros).
// The bound is test_core.hpp's: fp32 accumulation against the double reference.
constexpr double kOutputNmse = vt::tolerance(vt::TestBackend::cuda, vt::Metric::attention_nmse);

// Runs the CUDA path on (cache, rows) for H query heads and checks it against the reference.
template <class T>
void compare(const KvCache<T>& cache, const CacheRows& rows, std::int64_t H, std::uint64_t seed, bool strided_q = false) {
    const std::int64_t d = cache.head_dim();
    INFO("dtype bytes " << sizeof(T) << ", H " << H << ", H_kv " << cache.n_kv_heads() << ", d " << d << ", lists "
                        << rows.lists() << ", first list " << rows.list(0).size() << ", seed " << seed);
    const auto q = uniform(static_cast<std::size_t>(H * d), seed);
    std::vector<double> ref(static_cast<std::size_t>(H * d));
    reference::indexed_decode_attention(View2<const float>(q.data(), {H, d}), cache, rows, View2<double>(ref.data(), {H, d}));

    cuda::DeviceKvCache<T> dc(cache);
    cuda::DeviceRowLists dl(rows, cache);
    // q on the device either [H, d] or transposed [d, H] (strides {1, H}).
    std::vector<float> qh = q;
    View2<const float> qv;
    if (strided_q)
        for (std::int64_t h = 0; h < H; ++h)
            for (std::int64_t c = 0; c < d; ++c) qh[static_cast<std::size_t>(c * H + h)] = q[static_cast<std::size_t>(h * d + c)];
    DeviceBuffer<float> qd(qh), od(static_cast<std::size_t>(H * d));
    qv = strided_q ? View2<const float>(qd.p, {H, d}, {1, H}) : View2<const float>(qd.p, {H, d});
    cudaMemset(od.p, 0xff, H * d * sizeof(float));  // poisoned: an unwritten element is NaN
    cuda::indexed_decode_attention(qv, dc.view(), dl, View2<float>(od.p, {H, d}));
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    const auto out = od.get();
    CHECK(nmse(out, ref) <= kOutputNmse);

    // bf16 output: each element the reference rounded to bf16, within one bf16 step.
    DeviceBuffer<bfloat16> ob(static_cast<std::size_t>(H * d));
    cuda::indexed_decode_attention(qv, dc.view(), dl, View2<bfloat16>(ob.p, {H, d}));
    const auto outb = ob.get();
    for (std::size_t i = 0; i < ref.size(); ++i) {
        INFO("bf16 output element " << i);
        CHECK(std::abs(to_float(outb[i]) - ref[i]) <= std::abs(ref[i]) * (1.0 / 128.0) + 1e-6);
    }

    // A second call gives the same bits (no atomics in the arithmetic: the merge order is fixed).
    DeviceBuffer<float> ow(static_cast<std::size_t>(H * d));
    cuda::indexed_decode_attention(qv, dc.view(), dl, View2<float>(ow.p, {H, d}));
    CHECK(ow.get() == out);

    // The lists as host CacheRows, as the reference takes them: over the device copy (checked per KV
    // head) and over its view (every head holding the copy's rows). The same lists on the device, the
    // same kernel: the same bits.
    REQUIRE(cudaMemset(ow.p, 0xff, H * d * sizeof(float)) == cudaSuccess);
    cuda::indexed_decode_attention(qv, dc, rows, View2<float>(ow.p, {H, d}));
    CHECK(ow.get() == out);
    REQUIRE(cudaMemset(ow.p, 0xff, H * d * sizeof(float)) == cudaSuccess);
    cuda::indexed_decode_attention(qv, dc.view(), rows, View2<float>(ow.p, {H, d}));
    CHECK(ow.get() == out);
}

}  // namespace

TEST_CASE("cuda indexed decode: matches the reference over dtypes, GQA ratios, head dims and list lengths",
          "[cuda][indexed]") {
    const std::uint64_t seed = base_seed() + 1000;
    const std::int64_t n = 300;
    for (std::int64_t d : {40, 64, 128, 256}) {
        for (std::int64_t Hkv : {1, 2}) {
            for (std::int64_t ratio : {1, 2, 3, 4, 8}) {
                if (d == 256 && ratio == 3) continue;
                const std::int64_t H = Hkv * ratio;
                const auto s0 = seed + static_cast<std::uint64_t>(d * 100 + H * 10 + Hkv);
                const auto cf = random_cache<float>(n, Hkv, d, s0);
                const auto cb = random_cache<bfloat16>(n, Hkv, d, s0 + 3);
                const auto ch = random_cache<vlsparse::half>(n, Hkv, d, s0 + 5);
                for (std::int64_t len : {std::int64_t{1}, std::int64_t{7}, std::int64_t{65}, n * 3 / 10, n}) {
                    const auto s = s0 + static_cast<std::uint64_t>(len * 7);
                    const CacheRows shared{random_subset(n, len, s)};
                    compare(cf, shared, H, s + 1);
                    compare(cb, shared, H, s + 2);
                    compare(ch, shared, H, s + 3, /*strided_q=*/true);
                    CacheRows per;
                    for (std::int64_t g = 0; g < Hkv; ++g)
                        per.push(random_subset(n, std::max<std::int64_t>(1, len - g * 5), s + 4 + static_cast<std::uint64_t>(g)));
                    compare(cb, per, H, s + 6);
                }
            }
        }
    }
}

TEST_CASE("cuda indexed decode: every row listed is dense decode, also after per-head eviction", "[cuda][indexed]") {
    const std::int64_t n = 1000, H = 16, Hkv = 4, d = 128;
    auto cache = random_cache<bfloat16>(n, Hkv, d, base_seed() + 2000);
    CacheRows all;
    all.push_all(n);
    compare(cache, all, H, base_seed() + 2001);
    TokenSelection keep;
    keep.n = n;
    for (std::int64_t g = 0; g < Hkv; ++g) keep.indices.push_back(random_subset(n, 200 + 50 * g, base_seed() + 2002 + static_cast<std::uint64_t>(g)));
    cache.keep(keep);
    CacheRows per;
    for (std::int64_t g = 0; g < Hkv; ++g) per.push_all(cache.rows(g));
    compare(cache, per, H, base_seed() + 2010);
}

TEST_CASE("cuda indexed decode: host CacheRows on a non-blocking stream match the reference", "[cuda][indexed]") {
    // A non-blocking stream does not wait for the legacy default stream: the lists must be copied on
    // the call's own stream to be complete when the kernel reads them.
    cudaStream_t stream = nullptr;
    REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
    const std::uint64_t seed = base_seed() + 2200;
    for (std::int64_t d : {64, 128}) {
        const std::int64_t n = 700, Hkv = 4, H = 16;
        const auto s0 = seed + static_cast<std::uint64_t>(d);
        auto cache = random_cache<bfloat16>(n, Hkv, d, s0);
        TokenSelection keep;  // per-head eviction: KV heads of 300 .. 600 rows
        keep.n = n;
        for (std::int64_t g = 0; g < Hkv; ++g)
            keep.indices.push_back(random_subset(n, 300 + 100 * g, s0 + 1 + static_cast<std::uint64_t>(g)));
        cache.keep(keep);
        CacheRows per;
        for (std::int64_t g = 0; g < Hkv; ++g)
            per.push(random_subset(cache.rows(g), 1 + 37 * g, s0 + 10 + static_cast<std::uint64_t>(g)));
        const auto q = uniform(static_cast<std::size_t>(H * d), s0 + 20);
        std::vector<double> ref(static_cast<std::size_t>(H * d));
        reference::indexed_decode_attention(View2<const float>(q.data(), {H, d}), cache, per,
                                            View2<double>(ref.data(), {H, d}));
        cuda::DeviceKvCache<bfloat16> dc(cache);
        DeviceBuffer<float> qd(q), od(static_cast<std::size_t>(H * d));
        REQUIRE(cudaMemset(od.p, 0xff, H * d * sizeof(float)) == cudaSuccess);
        REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
        cuda::indexed_decode_attention(View2<const float>(qd.p, {H, d}), dc, per, View2<float>(od.p, {H, d}), {}, stream);
        INFO("d " << d << ", seed " << s0);
        CHECK(nmse(od.get(), ref) <= kOutputNmse);
    }
    REQUIRE(cudaStreamDestroy(stream) == cudaSuccess);
}

TEST_CASE("cuda indexed decode: a cache view off 16-byte alignment takes the element-by-element copy path, same result",
          "[cuda][indexed]") {
    const std::int64_t n = 200, H = 8, Hkv = 2, d = 128;
    const auto cache = random_cache<bfloat16>(n, Hkv, d, base_seed() + 2500);
    const CacheRows rows{random_subset(n, 77, base_seed() + 2501)};
    const auto q = uniform(static_cast<std::size_t>(H * d), base_seed() + 2502);
    std::vector<double> ref(static_cast<std::size_t>(H * d));
    reference::indexed_decode_attention(View2<const float>(q.data(), {H, d}), cache, rows, View2<double>(ref.data(), {H, d}));
    // K and V one element past a 16-byte boundary.
    std::vector<bfloat16> kh(static_cast<std::size_t>(Hkv * n * d + 1)), vh(kh.size());
    for (std::int64_t g = 0; g < Hkv; ++g)
        for (std::int64_t i = 0; i < n * d; ++i) {
            kh[static_cast<std::size_t>(1 + g * n * d + i)] = cache.k(g).data[i];
            vh[static_cast<std::size_t>(1 + g * n * d + i)] = cache.v(g).data[i];
        }
    DeviceBuffer<bfloat16> kd(kh), vd(vh);
    DeviceBuffer<std::int32_t> len(std::vector<std::int32_t>{static_cast<std::int32_t>(n)});
    // A batch of one over the engine's own buffers (HND: head g's rows at g * n * d).
    const KvBatchView<const bfloat16> view{kd.p + 1, vd.p + 1, 1, Hkv, d, n, 0, d, n * d, 0, nullptr, 0, len.p};
    cuda::DeviceRowLists dl(rows, Hkv, n);
    DeviceBuffer<float> qd(q), od(static_cast<std::size_t>(H * d));
    cuda::indexed_decode_attention(View2<const float>(qd.p, {H, d}), view, dl, View2<float>(od.p, {H, d}));
    const auto out = od.get();
    CHECK(nmse(out, ref) <= kOutputNmse);
    // The same view with the host CacheRows: the length read from the view's device seq_lens.
    DeviceBuffer<float> o2(static_cast<std::size_t>(H * d));
    cuda::indexed_decode_attention(View2<const float>(qd.p, {H, d}), view, rows, View2<float>(o2.p, {H, d}));
    CHECK(o2.get() == out);
}

TEST_CASE("cuda indexed decode: bad input is a clear error", "[cuda][indexed][errors]") {
    const std::int64_t n = 20, H = 4, Hkv = 2, d = 8;
    auto cache = random_cache<float>(n, Hkv, d, base_seed() + 3000);
    cuda::DeviceKvCache<float> dc(cache);
    REQUIRE_THROWS_WITH(cuda::DeviceRowLists(CacheRows{{}}, cache), Contains("empty"));
    REQUIRE_THROWS_WITH(cuda::DeviceRowLists(CacheRows{{3, 1}}, cache), Contains("not sorted"));
    REQUIRE_THROWS_WITH(cuda::DeviceRowLists(CacheRows{{1, 20}}, cache), Contains("20"));
    REQUIRE_THROWS_WITH(cuda::DeviceRowLists(CacheRows{{1}, {2}, {3}}, cache), Contains("3 lists"));
    REQUIRE_THROWS_WITH(cuda::DeviceRowLists(CacheRows{{1, 20}}, Hkv, dc.rows()), Contains("expected a row in [0, 20)"));
    cuda::DeviceRowLists dl(CacheRows{{0, 5, 19}}, cache);
    DeviceBuffer<float> q(static_cast<std::size_t>(H * d)), out(static_cast<std::size_t>(H * d));
    const auto run = [&](std::int64_t h, std::int64_t dd, const std::string& msg) {
        INFO(msg);
        REQUIRE_THROWS_WITH(cuda::indexed_decode_attention(View2<const float>(q.p, {h, dd}), dc.view(), dl,
                                                           View2<float>(out.p, {h, dd})),
                            Contains(msg));
    };
    run(3, d, "not a positive multiple");
    run(H, 7, "expected [H, 8]");  // q's head dim against the cache's
    REQUIRE_THROWS_WITH(cuda::indexed_decode_attention(View2<const float>(q.p, {H, d}), dc.view(), dl,
                                                       View2<float>(out.p, {H, d - 1})),
                        Contains("out has shape"));
    // Host CacheRows: the same check and messages as the CPU path, naming the decode call.
    const View2<const float> qv(q.p, {H, d});
    const View2<float> ov(out.p, {H, d});
    REQUIRE_THROWS_WITH(cuda::indexed_decode_attention(qv, dc, CacheRows{{}}, ov),
                        Contains("cuda::indexed_decode_attention") && Contains("empty"));
    REQUIRE_THROWS_WITH(cuda::indexed_decode_attention(qv, dc.view(), CacheRows{{3, 1}}, ov), Contains("not sorted"));
    REQUIRE_THROWS_WITH(cuda::indexed_decode_attention(qv, dc.view(), CacheRows{{1, 20}}, ov),
                        Contains("expected a row in [0, 20)"));
    REQUIRE_THROWS_WITH(cuda::indexed_decode_attention(qv, dc, CacheRows{{1}, {2}, {3}}, ov), Contains("3 lists"));
    REQUIRE_THROWS_WITH(cuda::indexed_decode_attention(qv, dc, CacheRows{}, ov), Contains("0 lists"));
    REQUIRE_THROWS_WITH(cuda::indexed_decode_attention(qv, dc, CacheRows{{0, 5}}, View2<float>(out.p, {H, d - 1})),
                        Contains("out has shape"));
    {
        // After per-head eviction the device copy pads the shorter head: a list naming a padding row is
        // rejected against the rows that head holds, as the reference rejects it against the KvCache.
        auto ev = random_cache<float>(n, Hkv, d, base_seed() + 3002);
        TokenSelection keep;
        keep.n = n;
        keep.indices = {random_subset(n, 20, base_seed() + 3003), random_subset(n, 12, base_seed() + 3004)};
        ev.keep(keep);
        cuda::DeviceKvCache<float> dev(ev);
        REQUIRE(dev.rows() == 20);
        REQUIRE(dev.rows(1) == 12);
        REQUIRE_THROWS_WITH(cuda::indexed_decode_attention(qv, dev, CacheRows{{0, 5}, {0, 15}}, ov),
                            Contains("expected a row in [0, 12) of KV head 1"));
        const std::vector<float> qh(static_cast<std::size_t>(H * d), 0.25f);
        std::vector<double> ref(qh.size());
        REQUIRE_THROWS_WITH(reference::indexed_decode_attention(View2<const float>(qh.data(), {H, d}), ev,
                                                                CacheRows{{0, 5}, {0, 15}},
                                                                View2<double>(ref.data(), {H, d})),
                            Contains("expected a row in [0, 12) of KV head 1"));
        // The last row of each head is accepted, and the result is the reference's.
        const CacheRows last{{0, 19}, {0, 11}};
        reference::indexed_decode_attention(View2<const float>(qh.data(), {H, d}), ev, last, View2<double>(ref.data(), {H, d}));
        DeviceBuffer<float> qe(qh), oe(qh.size());
        cuda::indexed_decode_attention(View2<const float>(qe.p, {H, d}), dev, last, View2<float>(oe.p, {H, d}));
        CHECK(nmse(oe.get(), ref) <= kOutputNmse);
    }
    // A head dim beyond the CUDA path's limit.
    auto big = random_cache<float>(4, 1, 300, base_seed() + 3001);
    cuda::DeviceKvCache<float> db(big);
    cuda::DeviceRowLists lb(CacheRows{{0, 1}}, big);
    DeviceBuffer<float> qb(300), ob(300);
    REQUIRE_THROWS_WITH(cuda::indexed_decode_attention(View2<const float>(qb.p, {1, 300}), db.view(), lb,
                                                       View2<float>(ob.p, {1, 300})),
                        Contains("supports 1..256"));
    // NaN in a listed row: a clear error with check_finite; in an unlisted row: never read.
    std::vector<float> kk(static_cast<std::size_t>(n * Hkv * d), 0.5f), vv = kk;
    kk[static_cast<std::size_t>((5 * Hkv + 1) * d + 3)] = std::nanf("");
    KvCache<float> bad(Hkv, d);
    bad.assign(View3<const float>(kk.data(), {n, Hkv, d}), View3<const float>(vv.data(), {n, Hkv, d}));
    cuda::DeviceKvCache<float> dbad(bad);
    DeviceBuffer<float> q1(std::vector<float>(static_cast<std::size_t>(H * d), 0.25f));
    REQUIRE_THROWS_WITH(cuda::indexed_decode_attention(View2<const float>(q1.p, {H, d}), dbad.view(), dl,
                                                       View2<float>(out.p, {H, d})),
                        Contains("non-finite"));
    cuda::DeviceRowLists skip(CacheRows{{0, 4, 6, 19}}, bad);
    cuda::indexed_decode_attention(View2<const float>(q1.p, {H, d}), dbad.view(), skip, View2<float>(out.p, {H, d}));
    for (float x : out.get()) CHECK(x == 0.5f);  // uniform over equal rows of 0.5
}
