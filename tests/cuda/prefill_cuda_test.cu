// CUDA prefill attention (vlsparse/cuda/prefill.cuh) against the reference (reference::dense_attention,
// sparse_attention, masked_attention) and the golden files: bf16 and fp16 inputs, head dims 64 / 128,
// GQA 1 / 2 / 3 / 4 / 6 / 7, lengths from 1 to 1500 (never only multiples of the 128 x 64 tiles), n_q
// < n_k, token lists shared or per KV head (empty, one entry, 30%, all) with both UnselectedRows, every
// template alone and mixed per head, bidirectional images, custom sinks, every video mask. Outputs are
// poisoned (0xff bytes: NaN) before each call, so an element the kernel does not write fails.
//
// Every case runs on the three paths: PrefillKernel::automatic (wgmma on a Hopper GPU with sm_90a code;
// VLSPARSE_EXPECT_WGMMA=1 makes that an assertion), PrefillKernel::mma_sync and PrefillKernel::simt (the
// CUDA-core kernel, P not rounded: within the same bounds). The CUDA-core kernel's own inputs -- fp32
// and head dims other than 64 / 128 (1 .. 256) -- have a test case of their own, with fp32 bounds.
//
// Two checks per case:
//   - exact structure: q = 0 makes every allowed key's probability exactly 1 / count, and small integer
//     values in V make the kernel's sum exact in fp32; the output must equal the reference's mean of
//     the allowed V rows to 1e-5 (relative). One key too many or too few moves some column by at least
//     1 / count, far above that: this checks the mask, the lists and the causal cut key by key.
//   - arithmetic: random q, k, v; every element within the bound of P's rounding to the input type
//     (unit roundoff u = 2^-8 bf16, 2^-11 fp16): |out - ref| <= 2.2 u max|v| (P rounded, and the sum of
//     the unrounded P it is divided by), and the NMSE of each head within the manifest tolerance of
//     the type (bf16 1e-4, fp16 1e-6).
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <vlsparse/cuda/prefill.cuh>
#include <vlsparse/masks/flops.hpp>
#include <vlsparse/reference/attention.hpp>
#include <vlsparse/reference/blindsight.hpp>
#include <vlsparse/reference/blindsight_golden.hpp>
#include <vlsparse/reference/purekv_golden.hpp>
#include <vlsparse/reference/zipvl_golden.hpp>

#include "../test_core.hpp"

using namespace vlsparse;
using Catch::Matchers::Contains;

namespace {

std::uint64_t base_seed() { return vt::seed_or(20261123u); }

// fp32: the CUDA-core kernel sums in fp32 what the reference sums in double (no rounding of P); the
// bound 2.2 u max|v| with u = 2^-20 leaves room for the error of a 1500-term sum of fp32 products.
template <class T>
constexpr double unit_roundoff() {
    return std::is_same_v<T, float> ? 1.0 / 1048576.0 : std::is_same_v<T, bfloat16> ? 1.0 / 256.0 : 1.0 / 2048.0;
}
template <class T>
constexpr double nmse_tol() {
    return vt::tolerance<T>(vt::TestBackend::cuda, vt::Metric::prefill_nmse);
}
template <class T>
const char* type_name() {
    return std::is_same_v<T, float> ? "fp32" : std::is_same_v<T, bfloat16> ? "bf16" : "fp16";
}

// The instruction path the cases below run on (each TEST_CASE loops over kernel_paths()).
cuda::PrefillKernel g_kernel = cuda::PrefillKernel::automatic;
cuda::PrefillOptions opts() {
    cuda::PrefillOptions o;
    o.kernel = g_kernel;
    return o;
}
const char* kernel_name() {
    return g_kernel == cuda::PrefillKernel::mma_sync ? "mma.sync" : g_kernel == cuda::PrefillKernel::simt ? "simt" : "automatic";
}
// VLSPARSE_TEST_PREFILL_PATH=automatic, =mma_sync or =simt runs one path only (to split a slow run, e.g.
// under compute-sanitizer's racecheck, over several processes); unset or anything else runs all three.
std::vector<cuda::PrefillKernel> kernel_paths() {
    const char* only = std::getenv("VLSPARSE_TEST_PREFILL_PATH");
    if (only != nullptr && std::string_view(only) == "automatic") return {cuda::PrefillKernel::automatic};
    if (only != nullptr && std::string_view(only) == "mma_sync") return {cuda::PrefillKernel::mma_sync};
    if (only != nullptr && std::string_view(only) == "simt") return {cuda::PrefillKernel::simt};
    return {cuda::PrefillKernel::automatic, cuda::PrefillKernel::mma_sync, cuda::PrefillKernel::simt};
}

enum class Fill { random, uniform };  // uniform: q = 0, V small integers (the exact-structure check)

template <class T>
struct Qkv {
    std::int64_t nq = 0, nk = 0, H = 0, Hkv = 0, d = 0;
    std::vector<T> q, k, v;
    double vmax = 0.0;
};

template <class T>
Qkv<T> make_qkv(std::int64_t nq, std::int64_t nk, std::int64_t H, std::int64_t Hkv, std::int64_t d, Fill fill,
                std::uint64_t seed) {
    Qkv<T> x;
    x.nq = nq;
    x.nk = nk;
    x.H = H;
    x.Hkv = Hkv;
    x.d = d;
    std::mt19937_64 rng(base_seed() * 1000003u + seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::uniform_int_distribution<int> ints(-4, 4);
    x.q.resize(static_cast<std::size_t>(nq * H * d));
    x.k.resize(static_cast<std::size_t>(nk * Hkv * d));
    x.v.resize(x.k.size());
    for (auto& e : x.q) e = T(fill == Fill::uniform ? 0.0f : 2.0f * u(rng));
    for (auto& e : x.k) e = T(2.0f * u(rng));
    for (auto& e : x.v) e = T(fill == Fill::uniform ? static_cast<float>(ints(rng)) : u(rng));
    for (const auto& e : x.v) x.vmax = std::max(x.vmax, static_cast<double>(std::abs(to_float(e))));
    return x;
}

// The device copies and views of a Qkv, and a poisoned fp32 output.
template <class T>
struct DeviceQkv {
    cuda::DeviceArray<T> q, k, v;
    cuda::DeviceArray<float> out;
    View3<const T> qv, kv, vv;
    View3<float> ov;
    explicit DeviceQkv(const Qkv<T>& x)
        : q(x.q), k(x.k), v(x.v), out(static_cast<std::size_t>(x.nq * x.H * x.d)),
          qv(q.data(), {x.nq, x.H, x.d}), kv(k.data(), {x.nk, x.Hkv, x.d}), vv(v.data(), {x.nk, x.Hkv, x.d}),
          ov(out.data(), {x.nq, x.H, x.d}) {
        out.fill_bytes(0xff);
    }
};

// How many elements of two outputs differ in their bits.
std::size_t bits_differ(const std::vector<float>& a, const std::vector<float>& b) {
    REQUIRE(a.size() == b.size());
    std::size_t differ = 0;
    for (std::size_t i = 0; i < a.size(); ++i) differ += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
    return differ;
}

// On the wgmma path (automatic), whole key tiles of the dense, block-sparse and kept-keys front ends come
// by the bulk tensor copy; `launch` run again with the cp.async copies (bulk_copy = false) into a freshly
// poisoned output must give the same bits: the two ways only move the same bytes. (That the bulk copies
// run at all where wgmma does is checked by "the instruction path": the driver must provide the
// tensor-map encoder.)
template <class T, class Launch>
void check_bulk_copy_bits(DeviceQkv<T>& dv, const Launch& launch, const std::string& what) {
    if (g_kernel != cuda::PrefillKernel::automatic) return;
    const std::vector<float> bulk = dv.out.download();
    dv.out.fill_bytes(0xff);
    cuda::PrefillOptions o = opts();
    o.bulk_copy = false;
    launch(o);
    const std::vector<float> plain = dv.out.download();
    INFO(what << " (" << type_name<T>() << "): bulk tensor copies against cp.async");
    CHECK(bits_differ(bulk, plain) == 0);
}

// Compares the GPU output with the reference's (double) for the fill's check.
template <class T>
void check_output(const std::vector<float>& got, const std::vector<double>& ref, const Qkv<T>& x, Fill fill,
                  const std::string& what) {
    INFO(what << " (" << type_name<T>() << ", " << kernel_name() << ", n_q " << x.nq << ", n_k " << x.nk << ", H " << x.H << "/" << x.Hkv
              << ", d " << x.d << (fill == Fill::uniform ? ", exact-structure fill" : ", random fill") << ")");
    REQUIRE(got.size() == ref.size());
    const double bound = fill == Fill::uniform ? 0.0 : 2.2 * unit_roundoff<T>() * x.vmax + 1e-6;
    std::int64_t bad = 0, first = -1;
    for (std::size_t i = 0; i < got.size(); ++i) {
        const double e = std::abs(static_cast<double>(got[i]) - ref[i]);
        const double lim = fill == Fill::uniform ? 1e-5 * (1.0 + std::abs(ref[i])) : bound;
        if (!(e <= lim)) {
            if (first < 0) first = static_cast<std::int64_t>(i);
            ++bad;
        }
    }
    if (bad > 0) {
        const auto i = static_cast<std::size_t>(first);
        const std::int64_t c = static_cast<std::int64_t>(i) % x.d, h = static_cast<std::int64_t>(i) / x.d % x.H,
                           r = static_cast<std::int64_t>(i) / (x.d * x.H);
        INFO(bad << " elements out of bound; first: row " << r << " head " << h << " column " << c << ": " << got[i]
                 << ", reference " << ref[i]);
        CHECK(bad == 0);
        return;
    }
    CHECK(bad == 0);
    if (fill == Fill::random)
        for (std::int64_t h = 0; h < x.H; ++h) {
            double num = 0.0, den = 0.0;
            for (std::int64_t r = 0; r < x.nq; ++r)
                for (std::int64_t c = 0; c < x.d; ++c) {
                    const auto i = static_cast<std::size_t>((r * x.H + h) * x.d + c);
                    num += (got[i] - ref[i]) * (got[i] - ref[i]);
                    den += ref[i] * ref[i];
                }
            INFO("head " << h << " NMSE " << (den > 0 ? num / den : num));
            CHECK((den > 0 ? num / den : num) <= nmse_tol<T>());
        }
}

template <class T>
View3<const T> host_view(const std::vector<T>& a, std::int64_t n, std::int64_t h, std::int64_t d) {
    return View3<const T>(a.data(), {n, h, d});
}

// ---- dense -------------------------------------------------------------------------------------------

template <class T>
void run_dense(std::int64_t nq, std::int64_t nk, std::int64_t H, std::int64_t Hkv, std::int64_t d, Fill fill,
               std::uint64_t seed) {
    const auto x = make_qkv<T>(nq, nk, H, Hkv, d, fill, seed);
    DeviceQkv<T> dv(x);
    cuda::dense_prefill_attention(dv.qv, dv.kv, dv.vv, dv.ov, opts());
    std::vector<double> ref(static_cast<std::size_t>(nq * H * d));
    reference::dense_attention(host_view(x.q, nq, H, d), host_view(x.k, nk, Hkv, d), host_view(x.v, nk, Hkv, d),
                               View3<double>(ref.data(), {nq, H, d}));
    const std::vector<float> got = dv.out.download();
    check_output(got, ref, x, fill, "dense causal");
    check_bulk_copy_bits(dv, [&](const cuda::PrefillOptions& o) { cuda::dense_prefill_attention(dv.qv, dv.kv, dv.vv, dv.ov, o); },
                         "dense causal");
    // With the rows' log-sum-exp: the same output bits, and lse against the double one of the same scores
    // (inputs exact, fp32 accumulation: within 2e-4 + 1e-5 |lse|). lse poisoned (NaN) first, strided (a
    // head stride of 2) so that a write at the wrong place shows.
    cuda::DeviceArray<float> lse_d(static_cast<std::size_t>(nq * H * 2));
    lse_d.fill_bytes(0xff);
    dv.out.fill_bytes(0xff);
    cuda::dense_prefill_attention(dv.qv, dv.kv, dv.vv, dv.ov, View2<float>(lse_d.data(), {nq, H}, {2 * H, 2}), opts());
    REQUIRE(bits_differ(dv.out.download(), got) == 0);
    const std::vector<float> lse = lse_d.download();
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    std::vector<double> sc(static_cast<std::size_t>(nk));
    for (std::int64_t i = 0; i < nq; ++i)
        for (std::int64_t h = 0; h < H; ++h) {
            const std::int64_t pos = nk - nq + i;
            double mx = -INFINITY;
            for (std::int64_t j = 0; j <= pos; ++j) {
                double dot = 0.0;
                for (std::int64_t c = 0; c < d; ++c)
                    dot += static_cast<double>(to_float(x.q[static_cast<std::size_t>((i * H + h) * d + c)])) *
                           static_cast<double>(to_float(x.k[static_cast<std::size_t>((j * Hkv + h / (H / Hkv)) * d + c)]));
                sc[static_cast<std::size_t>(j)] = scale * dot;
                mx = std::max(mx, sc[static_cast<std::size_t>(j)]);
            }
            double l = 0.0;
            for (std::int64_t j = 0; j <= pos; ++j) l += std::exp(sc[static_cast<std::size_t>(j)] - mx);
            const double want = mx + std::log(l);
            const double g = lse[static_cast<std::size_t>(i * 2 * H + 2 * h)];
            INFO("lse of row " << i << " head " << h << ": " << g << ", want " << want << " (" << kernel_name() << ", "
                               << type_name<T>() << ", d " << d << ")");
            REQUIRE(std::abs(g - want) <= 2e-4 + 1e-5 * std::abs(want));
            if (h == 0 && i < 4) REQUIRE(std::isnan(lse[static_cast<std::size_t>(i * 2 * H + 1)]));  // the gaps unwritten
        }
}

// ---- token-sparse ------------------------------------------------------------------------------------

struct HostLists {
    std::vector<std::int32_t> indptr{0}, indices;
    TokenSelection sel;
};

// Lists of about `ratio` of n (ratio 0: empty; negative: exactly one entry), shared or per KV head.
HostLists make_lists(std::int64_t n, std::int64_t groups, double ratio, std::uint64_t seed) {
    HostLists L;
    L.sel.n = n;
    std::mt19937_64 rng(base_seed() * 7919u + seed);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    for (std::int64_t g = 0; g < groups; ++g) {
        std::vector<std::int64_t> l;
        if (ratio < 0) l.push_back(static_cast<std::int64_t>(u(rng) * static_cast<double>(n)));
        else
            for (std::int64_t j = 0; j < n; ++j)
                if (ratio >= 1.0 || u(rng) < ratio) l.push_back(j);
        for (auto j : l) L.indices.push_back(static_cast<std::int32_t>(j));
        L.indptr.push_back(static_cast<std::int32_t>(L.indices.size()));
        L.sel.indices.push_back(std::move(l));
    }
    return L;
}

template <class T>
void run_sparse(std::int64_t n, std::int64_t H, std::int64_t Hkv, std::int64_t d, std::int64_t groups, double ratio,
                UnselectedRows un, Fill fill, std::uint64_t seed) {
    const auto x = make_qkv<T>(n, n, H, Hkv, d, fill, seed);
    DeviceQkv<T> dv(x);
    const HostLists L = make_lists(n, groups, ratio, seed);
    cuda::DeviceArray<std::int32_t> ip(L.indptr), ix(std::max<std::size_t>(1, L.indices.size()));
    if (!L.indices.empty()) ix.upload(L.indices);
    const cuda::DeviceTokenLists lists{n, L.indptr, ip.data(), ix.data()};
    cuda::sparse_prefill_attention(dv.qv, dv.kv, dv.vv, lists, dv.ov, un, opts());
    std::vector<double> ref(static_cast<std::size_t>(n * H * d));
    reference::sparse_attention(host_view(x.q, n, H, d), host_view(x.k, n, Hkv, d), host_view(x.v, n, Hkv, d), L.sel,
                                View3<double>(ref.data(), {n, H, d}), un);
    const std::string what = std::string("token-sparse, ") + (groups == 1 ? "shared list" : "per-KV-head lists") +
                             ", ratio " + std::to_string(ratio) +
                             (un == UnselectedRows::zero ? ", unselected zero" : ", attend_selected");
    const std::vector<float> got = dv.out.download();
    check_output(got, ref, x, fill, what);

    // Kept keys: k and v compacted to the lists (head g's rows 0 .. |T_g| - 1; the rows past a shorter
    // list poisoned with 0xff bytes, NaN, which no key tile may read) give the same output bit for bit.
    std::int64_t longest = 1;
    for (std::int64_t g = 0; g < groups; ++g) longest = std::max<std::int64_t>(longest, L.indptr[g + 1] - L.indptr[g]);
    std::vector<T> kk(static_cast<std::size_t>(longest * Hkv * d)), vk(kk.size());
    std::memset(static_cast<void*>(kk.data()), 0xff, kk.size() * sizeof(T));
    std::memset(static_cast<void*>(vk.data()), 0xff, vk.size() * sizeof(T));
    for (std::int64_t h = 0; h < Hkv; ++h) {
        const std::int64_t g = groups == 1 ? 0 : h;
        for (std::int64_t e = 0; e < L.indptr[g + 1] - L.indptr[g]; ++e) {
            const std::int64_t pos = L.indices[static_cast<std::size_t>(L.indptr[g] + e)];
            for (std::int64_t c = 0; c < d; ++c) {
                kk[static_cast<std::size_t>((e * Hkv + h) * d + c)] = x.k[static_cast<std::size_t>((pos * Hkv + h) * d + c)];
                vk[static_cast<std::size_t>((e * Hkv + h) * d + c)] = x.v[static_cast<std::size_t>((pos * Hkv + h) * d + c)];
            }
        }
    }
    cuda::DeviceArray<T> kkd(kk), vkd(vk);
    const View3<const T> kkv(kkd.data(), {longest, Hkv, d}), vkv(vkd.data(), {longest, Hkv, d});
    auto kept = [&](const cuda::PrefillOptions& o) {
        dv.out.fill_bytes(0xff);
        cuda::sparse_prefill_attention_kept(dv.qv, kkv, vkv, lists, dv.ov, un, o);
        const std::vector<float> k2 = dv.out.download();
        INFO(what << " (" << type_name<T>() << ", " << kernel_name() << (o.bulk_copy ? "" : ", cp.async")
                  << "): kept keys against keys read through the lists");
        CHECK(bits_differ(got, k2) == 0);
    };
    kept(opts());
    if (g_kernel == cuda::PrefillKernel::automatic && !std::is_same_v<T, float>) {
        cuda::PrefillOptions o = opts();
        o.bulk_copy = false;
        kept(o);
    }
}

// ---- block-sparse ------------------------------------------------------------------------------------

template <class T>
void run_masked(const MaskContext& ctx, const std::vector<MaskTemplate>& heads, std::int64_t Hkv, std::int64_t d,
                Fill fill, std::uint64_t seed, const std::string& what) {
    const std::int64_t n = ctx.n, H = static_cast<std::int64_t>(heads.size());
    const auto x = make_qkv<T>(n, n, H, Hkv, d, fill, seed);
    DeviceQkv<T> dv(x);
    const cuda::MaskedPrefillPlan plan(ctx, heads, Hkv);
    cuda::masked_prefill_attention(plan, dv.qv, dv.kv, dv.vv, dv.ov, opts());
    std::vector<double> ref(static_cast<std::size_t>(n * H * d));
    reference::masked_attention(host_view(x.q, n, H, d), host_view(x.k, n, Hkv, d), host_view(x.v, n, Hkv, d), ctx,
                                std::span<const MaskTemplate>(heads), View3<double>(ref.data(), {n, H, d}));
    // The plan's pair counts: allowed = the mask's exact count; computed within [allowed, blocks].
    std::int64_t allowed = 0;
    for (auto t : heads) allowed += count_allowed_pairs(ctx, t);
    CHECK(plan.allowed_pairs() == allowed);
    CHECK(plan.computed_pairs() >= allowed);
    check_output(dv.out.download(), ref, x, fill, "block-sparse, " + what);
    check_bulk_copy_bits(dv, [&](const cuda::PrefillOptions& o) { cuda::masked_prefill_attention(plan, dv.qv, dv.kv, dv.vv, dv.ov, o); },
                         "block-sparse, " + what);
}

std::vector<MaskTemplate> mixed_heads(std::int64_t H, std::uint64_t seed) {
    std::mt19937_64 rng(base_seed() + seed);
    std::vector<MaskTemplate> h(static_cast<std::size_t>(H));
    for (auto& t : h) t = static_cast<MaskTemplate>(rng() % 4);
    return h;
}

// Zero-pads the last dimension of [rows, d] to D (the kernel takes head dims 64 and 128; zero columns
// change no dot product, and the padded output columns are dropped).
std::vector<float> pad_cols(const std::vector<float>& x, std::int64_t d, std::int64_t D) {
    const std::int64_t rows = static_cast<std::int64_t>(x.size()) / d;
    std::vector<float> y(static_cast<std::size_t>(rows * D), 0.0f);
    for (std::int64_t r = 0; r < rows; ++r)
        std::copy_n(x.begin() + r * d, d, y.begin() + r * D);
    return y;
}
std::vector<float> unpad_cols(const std::vector<float>& y, std::int64_t d, std::int64_t D) {
    const std::int64_t rows = static_cast<std::int64_t>(y.size()) / D;
    std::vector<float> x(static_cast<std::size_t>(rows * d));
    for (std::int64_t r = 0; r < rows; ++r)
        std::copy_n(y.begin() + r * D, d, x.begin() + r * d);
    return x;
}
template <class T>
std::vector<T> narrow16(const std::vector<float>& x) {
    std::vector<T> y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = T(x[i]);
    return y;
}

double nmse_of(const std::vector<float>& got, const std::vector<float>& want) {
    double num = 0.0, den = 0.0;
    for (std::size_t i = 0; i < got.size(); ++i) {
        num += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
        den += static_cast<double>(want[i]) * want[i];
    }
    return den > 0 ? num / den : num;
}

}  // namespace

TEST_CASE("cuda prefill: dense causal against the reference", "[cuda][prefill]") {
    for (const cuda::PrefillKernel path : kernel_paths()) {
        g_kernel = path;
        struct S {
            std::int64_t nq, nk, H, Hkv, d;
        };
        const S shapes[] = {{1, 1, 4, 4, 64},     {5, 5, 8, 2, 128},    {64, 64, 4, 1, 64},  {130, 130, 28, 4, 128},
                            {300, 300, 6, 3, 64}, {77, 500, 8, 2, 128}, {1, 200, 7, 1, 128}, {257, 257, 12, 2, 64},
                            {1500, 1500, 2, 1, 128}};
        std::uint64_t seed = 0;
        for (const auto& s : shapes)
            for (Fill f : {Fill::uniform, Fill::random}) {
                run_dense<bfloat16>(s.nq, s.nk, s.H, s.Hkv, s.d, f, ++seed);
                run_dense<vlsparse::half>(s.nq, s.nk, s.H, s.Hkv, s.d, f, ++seed);
            }
    }
    g_kernel = cuda::PrefillKernel::automatic;
}

TEST_CASE("cuda prefill: token-sparse against the reference", "[cuda][prefill][zipvl]") {
    for (const cuda::PrefillKernel path : kernel_paths()) {
        g_kernel = path;
        std::uint64_t seed = 100;
        struct S {
            std::int64_t n, H, Hkv, d;
        };
        const S shapes[] = {{1, 4, 2, 64}, {70, 8, 2, 128}, {333, 28, 4, 128}, {600, 6, 3, 64}, {1000, 4, 1, 128}};
        for (const auto& s : shapes)
            for (std::int64_t groups : {std::int64_t{1}, s.Hkv})
                for (double ratio : {0.3, 1.0, 0.0, -1.0})
                    for (UnselectedRows un : {UnselectedRows::zero, UnselectedRows::attend_selected})
                        for (Fill f : {Fill::uniform, Fill::random}) {
                            if (s.n > 600 && f == Fill::uniform && ratio != 0.3) continue;
                            run_sparse<bfloat16>(s.n, s.H, s.Hkv, s.d, groups, ratio, un, f, ++seed);
                            if (ratio == 0.3) run_sparse<vlsparse::half>(s.n, s.H, s.Hkv, s.d, groups, ratio, un, f, ++seed);
                        }
    }
    g_kernel = cuda::PrefillKernel::automatic;
}

TEST_CASE("cuda prefill: block-sparse masks against the reference", "[cuda][prefill][blindsight][purekv]") {
    for (const cuda::PrefillKernel path : kernel_paths()) {
        g_kernel = path;
        std::uint64_t seed = 500;
        struct L {
            const char* layout;
            std::int64_t H, Hkv, d;
        };
        const L layouts[] = {{"text:37,image:200,text:20,image:150,text:9", 8, 2, 128},
                             {"image:64,text:3,image:130,text:64,image:77", 6, 3, 64},
                             {"text:5,image:300,text:130", 4, 4, 128},
                             {"text:64,image:96,text:64,image:96,text:64,image:96,text:64,image:96,text:64", 7, 1, 128}};
        for (const auto& l : layouts) {
            const Layout layout = Layout::parse(l.layout);
            for (bool bidir : {false, true})
                for (int variant = 0; variant < 6; ++variant) {
                    MaskOptions mo;
                    mo.bidirectional_images = bidir;
                    if (variant == 5) mo.sink_offsets = {1, 6, 40};
                    const MaskContext ctx = make_mask_context(layout, mo);
                    const auto heads = variant < 4 ? std::vector<MaskTemplate>(static_cast<std::size_t>(l.H), static_cast<MaskTemplate>(variant))
                                                   : mixed_heads(l.H, ++seed);
                    const std::string what = std::string(l.layout) + (bidir ? ", bidirectional" : "") +
                                             (variant < 4 ? std::string(", ") + std::string(to_string(heads[0])) : ", mixed templates") +
                                             (variant == 5 ? ", sink offsets" : "");
                    for (Fill f : {Fill::uniform, Fill::random}) {
                        run_masked<bfloat16>(ctx, heads, l.Hkv, l.d, f, ++seed, what);
                        if (variant == 4) run_masked<vlsparse::half>(ctx, heads, l.Hkv, l.d, f, ++seed, what);
                    }
                }
        }
        // PureKV's video masks (with the Dense template, and under a mix of templates). Under the temporal
        // and spatial-temporal masks the key one frame back is a diagonal segment (one score per row):
        // frames of one block (40, 33 tokens) and of two blocks whose keys one frame back start and end
        // inside 64-key columns (150 tokens from position 37).
        const char* const video_specs[] = {"text:5,video:6x40,text:7,image:50,text:3,video:4x33,text:2",
                                           "text:37,video:4x150,text:11"};
        for (int li = 0; li < 2; ++li) {
            const char* spec = video_specs[li];
            const Layout video = Layout::parse(spec);
            const bool first = li == 0;  // the second layout only under the masks with a diagonal
            for (VideoMask kind : kVideoMasks)
                for (std::int64_t window : {std::int64_t{0}, std::int64_t{7}}) {
                    if (!first && ((kind != VideoMask::temporal && kind != VideoMask::spatial_temporal) || window != 0)) continue;
                    const MaskContext ctx = make_video_mask_context(video, {kind, window, 3});
                    const std::string what = std::string(spec) + ", video " + std::string(to_string(kind)) + ", window " +
                                             std::to_string(window);
                    const bool temporal = kind == VideoMask::temporal || kind == VideoMask::spatial_temporal;
                    CHECK((cuda::MaskedPrefillPlan(ctx, std::vector<MaskTemplate>(2, MaskTemplate::dense), 1).diagonal_rows() > 0) ==
                          temporal);
                    for (Fill f : {Fill::uniform, Fill::random}) {
                        run_masked<bfloat16>(ctx, std::vector<MaskTemplate>(8, MaskTemplate::dense), 2, 128, f, ++seed, what);
                        const auto mixed = mixed_heads(4, ++seed);
                        run_masked<vlsparse::half>(ctx, mixed, 4, 64, f, ++seed, what + ", mixed templates");
                    }
                }
        }
    }
    g_kernel = cuda::PrefillKernel::automatic;
}

// Each row's key intervals walked on the device through the plan's uploaded (int32) mask, digested
// per (template, row): interval count, key count and a hash of the bounds in order.
__global__ void row_interval_digest_kernel(cuda::detail::DeviceMask m, int tmpl, long long* out) {
    const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
    if (i >= m.context.n) return;
    long long count = 0, keys = 0, hash = 0;
    m.context.row_intervals(tmpl, i, [&](int lo, int hi) {
        ++count;
        keys += hi - lo;
        hash = hash * 1000003 + static_cast<long long>(lo) * 7919 + hi;
    });
    out[3 * i] = count;
    out[3 * i + 1] = keys;
    out[3 * i + 2] = hash;
}

TEST_CASE("cuda prefill: the mask's row intervals on the device equal the host's", "[cuda][prefill][masks]") {
    std::vector<MaskContext> contexts;
    for (const char* spec : {"text:37,image:200,text:20,image:150,text:9", "image:64,text:3,image:130,text:64,image:77"})
        for (bool bidir : {false, true})
            for (bool offsets : {false, true}) {
                MaskOptions mo;
                mo.bidirectional_images = bidir;
                if (offsets) mo.sink_offsets = {1, 6, 40, 500};  // 500: past every image (no sink there)
                contexts.push_back(make_mask_context(Layout::parse(spec), mo));
            }
    const Layout video = Layout::parse("text:5,video:6x40,text:7,image:50,text:3,video:4x33,text:2");
    MaskOptions sinks;
    sinks.sink_fraction = 0.3;
    for (VideoMask kind : kVideoMasks)
        for (std::int64_t window : {std::int64_t{0}, std::int64_t{7}})
            contexts.push_back(make_video_mask_context(video, {kind, window, 3}, sinks));
    std::vector<KeyInterval> iv;
    for (const MaskContext& ctx : contexts) {
        const cuda::MaskedPrefillPlan plan(ctx, std::vector<MaskTemplate>(1, MaskTemplate::dense), 1);
        const auto n = static_cast<std::size_t>(ctx.n);
        for (MaskTemplate t : kAllTemplates) {
            INFO("video mask " << to_string(ctx.video) << " window " << ctx.video_window << ", bidirectional "
                               << ctx.bidirectional_images << ", n " << ctx.n << ", template " << to_string(t));
            cuda::DeviceArray<long long> out(3 * n);
            const std::vector<long long> poison(3 * n, -7);
            out.upload(poison);
            row_interval_digest_kernel<<<static_cast<unsigned>((n + 127) / 128), 128>>>(plan.device_mask(), static_cast<int>(t),
                                                                                      out.data());
            REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
            const auto got = out.download();
            std::int64_t rows_with_several = 0;
            for (std::size_t i = 0; i < n; ++i) {
                ctx.row_intervals(t, static_cast<std::int64_t>(i), iv);
                long long keys = 0, hash = 0;
                for (const auto& x : iv) {
                    keys += x.hi - x.lo;
                    hash = hash * 1000003 + x.lo * 7919 + x.hi;
                }
                rows_with_several += iv.size() > 1;
                INFO("row " << i);
                REQUIRE(got[3 * i] == static_cast<long long>(iv.size()));
                REQUIRE(got[3 * i + 1] == keys);
                REQUIRE(got[3 * i + 2] == hash);
            }
            if (t != MaskTemplate::dense || ctx.video != VideoMask::none) CHECK(rows_with_several > 0);  // not a trivial mask
        }
    }
}

TEST_CASE("cuda prefill: fp32 inputs and head dims other than 64 / 128 (the CUDA-core kernel)", "[cuda][prefill]") {
    // automatic routes these to the CUDA-core kernel; the 16-bit cases with d = 96 / 40 / 256 too.
    g_kernel = cuda::PrefillKernel::automatic;
    std::uint64_t seed = 900;
    struct S {
        std::int64_t nq, nk, H, Hkv, d;
    };
    const S dense_shapes[] = {{1, 1, 2, 2, 64},   {70, 70, 8, 2, 128}, {150, 150, 6, 3, 40},
                              {33, 300, 4, 1, 96}, {200, 200, 4, 4, 256}, {129, 129, 7, 7, 1}};
    for (const auto& s : dense_shapes)
        for (Fill f : {Fill::uniform, Fill::random}) {
            run_dense<float>(s.nq, s.nk, s.H, s.Hkv, s.d, f, ++seed);
            if (s.d != 64 && s.d != 128) run_dense<bfloat16>(s.nq, s.nk, s.H, s.Hkv, s.d, f, ++seed);
        }
    for (std::int64_t d : {std::int64_t{64}, std::int64_t{96}})
        for (double ratio : {0.3, 0.0, -1.0})
            for (UnselectedRows un : {UnselectedRows::zero, UnselectedRows::attend_selected})
                for (Fill f : {Fill::uniform, Fill::random}) {
                    run_sparse<float>(300, 8, 2, d, 2, ratio, un, f, ++seed);
                    run_sparse<float>(200, 4, 4, d, 1, ratio, un, f, ++seed);
                    if (d == 96 && ratio == 0.3) run_sparse<vlsparse::half>(300, 8, 2, d, 2, ratio, un, f, ++seed);
                }
    const Layout layout = Layout::parse("text:37,image:200,text:20,image:150,text:9");
    for (bool bidir : {false, true}) {
        MaskOptions mo;
        mo.bidirectional_images = bidir;
        const MaskContext ctx = make_mask_context(layout, mo);
        const std::string what = bidir ? "mixed, bidirectional" : "mixed";
        for (Fill f : {Fill::uniform, Fill::random}) {
            seed += 2;
            run_masked<float>(ctx, mixed_heads(8, seed), 2, 64, f, seed + 1, what);
            seed += 2;
            run_masked<float>(ctx, mixed_heads(6, seed), 3, 72, f, seed + 1, what);
            seed += 2;
            run_masked<bfloat16>(ctx, mixed_heads(4, seed), 4, 48, f, seed + 1, what);
        }
    }
    const Layout video = Layout::parse("text:5,video:6x40,text:7,image:50,text:3,video:4x33,text:2");
    for (VideoMask kind : kVideoMasks) {
        seed += 2;
        run_masked<float>(make_video_mask_context(video, {kind, 7, 3}), mixed_heads(4, seed), 2, 32, Fill::random, seed + 1,
                          "video " + std::string(to_string(kind)));
    }
    // Diagonal segments on the CUDA-core kernel (evaluated through the mask there), fp32 and d = 128.
    seed += 2;
    run_masked<float>(make_video_mask_context(Layout::parse("text:37,video:4x150,text:11"), {VideoMask::spatial_temporal, 0, 2}),
                      std::vector<MaskTemplate>(4, MaskTemplate::dense), 2, 128, Fill::random, seed + 1, "video 4x150, ST");
}

TEST_CASE("cuda prefill: output types and strided views", "[cuda][prefill]") {
    const std::int64_t n = 200, H = 8, Hkv = 2, d = 128;
    const auto x = make_qkv<bfloat16>(n, n, H, Hkv, d, Fill::random, 900);
    std::vector<double> ref(static_cast<std::size_t>(n * H * d));
    reference::dense_attention(host_view(x.q, n, H, d), host_view(x.k, n, Hkv, d), host_view(x.v, n, Hkv, d),
                               View3<double>(ref.data(), {n, H, d}));
    // q head-major [H, n, d] (strides {d, n d, 1}); out head-major with padded rows, bf16.
    std::vector<bfloat16> qh(x.q.size());
    for (std::int64_t r = 0; r < n; ++r)
        for (std::int64_t h = 0; h < H; ++h)
            for (std::int64_t c = 0; c < d; ++c)
                qh[static_cast<std::size_t>((h * n + r) * d + c)] = x.q[static_cast<std::size_t>((r * H + h) * d + c)];
    cuda::DeviceArray<bfloat16> q(qh), k(x.k), v(x.v), o(static_cast<std::size_t>(H * n * (d + 3)));
    o.fill_bytes(0xff);
    const View3<const bfloat16> qv(q.data(), {n, H, d}, {d, n * d, 1});
    const View3<bfloat16> ov(o.data(), {n, H, d}, {d + 3, n * (d + 3), 1});
    cuda::dense_prefill_attention(qv, View3<const bfloat16>(k.data(), {n, Hkv, d}), View3<const bfloat16>(v.data(), {n, Hkv, d}), ov);
    const auto oh = o.download();
    double worst = 0.0;
    for (std::int64_t r = 0; r < n; ++r)
        for (std::int64_t h = 0; h < H; ++h)
            for (std::int64_t c = 0; c < d; ++c) {
                const double g = to_float(oh[static_cast<std::size_t>(h * n * (d + 3) + r * (d + 3) + c)]);
                const double w = ref[static_cast<std::size_t>((r * H + h) * d + c)];
                worst = std::max(worst, std::abs(g - w) / (2.2 * unit_roundoff<bfloat16>() * x.vmax + std::abs(w) / 256.0));
            }
    INFO("worst error / bound: " << worst);
    CHECK(worst <= 1.0);
    // The padding between rows is left alone (still the poison).
    for (std::int64_t r = 0; r < n; ++r)
        CHECK(std::isnan(to_float(oh[static_cast<std::size_t>(r * (d + 3) + d)])));
    // fp16 output.
    cuda::DeviceArray<vlsparse::half> o16(static_cast<std::size_t>(n * H * d));
    o16.fill_bytes(0xff);
    cuda::dense_prefill_attention(qv, View3<const bfloat16>(k.data(), {n, Hkv, d}), View3<const bfloat16>(v.data(), {n, Hkv, d}),
                                  View3<vlsparse::half>(o16.data(), {n, H, d}));
    const auto h16 = o16.download();
    worst = 0.0;
    for (std::size_t i = 0; i < h16.size(); ++i)
        worst = std::max(worst, std::abs(to_float(h16[i]) - ref[i]) / (2.2 * unit_roundoff<bfloat16>() * x.vmax + std::abs(ref[i]) / 2048.0));
    INFO("fp16 output, worst error / bound: " << worst);
    CHECK(worst <= 1.0);
}

TEST_CASE("cuda prefill: the golden files (16-bit inputs on every path, fp32 on the CUDA-core kernel)", "[cuda][prefill][golden]") {
    for (const cuda::PrefillKernel path : kernel_paths()) {
        g_kernel = path;
        namespace fs = std::filesystem;
        const char* env = std::getenv("VLSPARSE_GOLDEN_DIR");
        const fs::path root = fs::path(env ? env : "golden");
        REQUIRE(fs::is_directory(root));
        int ran = 0;
        // Runs q, k, v (fp32 values exact in T) padded to head dim D; returns out unpadded.
        auto padded = [](std::int64_t d) { return d <= 64 ? std::int64_t{64} : std::int64_t{128}; };
    
        // ZipVL: the token-sparse prefill over the kept lists of kept_mask.
        for (const auto& e : fs::directory_iterator(root / "zipvl")) {
            GoldenManifest m;
            const auto c = golden::read_zipvl_inputs(e.path(), &m);
            if (c.params.prefill != ZipVLPrefill::sparse) continue;
            INFO("golden/zipvl/" << e.path().filename().string() << " (" << c.dtype << ")");
            const std::int64_t D = padded(c.d);
            const auto mask = read_tensor(e.path(), m.output("kept_mask")).to_vector<std::uint8_t>();
            const auto want = read_tensor(e.path(), m.output("prefill_out")).to_vector<float>();
            const std::int64_t G = static_cast<std::int64_t>(mask.size()) / c.n;
            std::vector<std::int32_t> indptr{0}, indices;
            for (std::int64_t g = 0; g < G; ++g) {
                for (std::int64_t j = 0; j < c.n; ++j)
                    if (mask[static_cast<std::size_t>(g * c.n + j)]) indices.push_back(static_cast<std::int32_t>(j));
                indptr.push_back(static_cast<std::int32_t>(indices.size()));
            }
            auto run = [&](auto tag) {
                using T = decltype(tag);
                cuda::DeviceArray<T> q(narrow16<T>(pad_cols(c.q, c.d, D))), k(narrow16<T>(pad_cols(c.k, c.d, D))),
                    v(narrow16<T>(pad_cols(c.v, c.d, D)));
                cuda::DeviceArray<float> o(static_cast<std::size_t>(c.n * c.H * D));
                o.fill_bytes(0xff);
                cuda::DeviceArray<std::int32_t> ip(indptr), ix(indices);
                cuda::PrefillOptions opt = opts();
                opt.scale = ::vlsparse::detail::resolve_scale(AttentionOptions{static_cast<float>(c.params.scale), false}, c.d, "test");
                cuda::sparse_prefill_attention(View3<const T>(q.data(), {c.n, c.H, D}), View3<const T>(k.data(), {c.n, c.Hkv, D}),
                                               View3<const T>(v.data(), {c.n, c.Hkv, D}),
                                               cuda::DeviceTokenLists{c.n, indptr, ip.data(), ix.data()},
                                               View3<float>(o.data(), {c.n, c.H, D}), c.params.unselected, opt);
                const auto got = unpad_cols(o.download(), c.d, D);
                const double e2 = nmse_of(got, want);
                INFO("NMSE " << e2);
                CHECK(e2 <= nmse_tol<T>());
                for (float g : got) REQUIRE(std::isfinite(g));
            };
            if (c.dtype == "fp16") run(vlsparse::half{});
            else if (c.dtype == "fp32") run(float{});
            else run(bfloat16{});
            ++ran;
        }
        // BlindSight: masked_out with the per-head templates of input heads.
        for (const auto& e : fs::directory_iterator(root / "blindsight")) {
            GoldenManifest m;
            const auto c = golden::read_blindsight_inputs(e.path(), &m);
            if (c.H == 0 || c.heads.empty()) continue;
            INFO("golden/blindsight/" << e.path().filename().string() << " (" << c.dtype << ")");
            const std::int64_t n = c.layout.n(), D = padded(c.d);
            const MaskContext ctx = make_mask_context(c.layout, c.params.mask);
            std::vector<MaskTemplate> heads;
            for (auto h : c.heads) heads.push_back(static_cast<MaskTemplate>(h));
            const auto want = read_tensor(e.path(), m.output("masked_out")).to_vector<float>();
            auto run = [&](auto tag) {
                using T = decltype(tag);
                cuda::DeviceArray<T> q(narrow16<T>(pad_cols(c.q, c.d, D))), k(narrow16<T>(pad_cols(c.k, c.d, D))),
                    v(narrow16<T>(pad_cols(c.v, c.d, D)));
                cuda::DeviceArray<float> o(static_cast<std::size_t>(n * c.H * D));
                o.fill_bytes(0xff);
                cuda::PrefillOptions opt = opts();
                opt.scale = ::vlsparse::detail::resolve_scale(AttentionOptions{static_cast<float>(c.params.scale), false}, c.d, "test");
                const cuda::MaskedPrefillPlan plan(ctx, heads, c.Hkv);
                cuda::masked_prefill_attention(plan, View3<const T>(q.data(), {n, c.H, D}), View3<const T>(k.data(), {n, c.Hkv, D}),
                                               View3<const T>(v.data(), {n, c.Hkv, D}), View3<float>(o.data(), {n, c.H, D}), opt);
                const double e2 = nmse_of(unpad_cols(o.download(), c.d, D), want);
                INFO("NMSE " << e2);
                CHECK(e2 <= nmse_tol<T>());
            };
            if (c.dtype == "fp16") run(vlsparse::half{});
            else if (c.dtype == "fp32") run(float{});
            else run(bfloat16{});
            ++ran;
        }
        // PureKV: each layer's prefill (ST-masked where purekv_masked_layer, dense causal before).
        for (const auto& e : fs::directory_iterator(root / "purekv")) {
            GoldenManifest m;
            const auto c = golden::read_purekv_inputs(e.path(), &m);
            if (c.shape.layers == 0) continue;
            INFO("golden/purekv/" << e.path().filename().string() << " (" << c.dtype << ")");
            const std::int64_t n = c.layout.n(), H = c.shape.heads, Hkv = c.shape.kv_heads, d = c.shape.head_dim, D = padded(d);
            const auto want = read_tensor(e.path(), m.output("prefill_out")).to_vector<float>();
            const MaskContext ctx = purekv_mask_context(c.layout, c.params);
            const cuda::MaskedPrefillPlan plan(ctx, std::vector<MaskTemplate>(static_cast<std::size_t>(H), MaskTemplate::dense), Hkv);
            auto run = [&](auto tag) {
                using T = decltype(tag);
                for (std::int64_t l = 0; l < c.shape.layers; ++l) {
                    INFO("layer " << l);
                    auto slice = [&](const std::vector<float>& x, std::int64_t heads) {
                        return std::vector<float>(x.begin() + l * n * heads * d, x.begin() + (l + 1) * n * heads * d);
                    };
                    cuda::DeviceArray<T> q(narrow16<T>(pad_cols(slice(c.q, H), d, D))),
                        k(narrow16<T>(pad_cols(slice(c.k, Hkv), d, D))), v(narrow16<T>(pad_cols(slice(c.v, Hkv), d, D)));
                    cuda::DeviceArray<float> o(static_cast<std::size_t>(n * H * D));
                    o.fill_bytes(0xff);
                    cuda::PrefillOptions opt = opts();
                    opt.scale = ::vlsparse::detail::resolve_scale(AttentionOptions{static_cast<float>(c.params.scale), false}, d, "test");
                    const View3<const T> qv(q.data(), {n, H, D}), kv(k.data(), {n, Hkv, D}), vv(v.data(), {n, Hkv, D});
                    const View3<float> ov(o.data(), {n, H, D});
                    if (purekv_masked_layer(c.layout, l, c.params)) cuda::masked_prefill_attention(plan, qv, kv, vv, ov, opt);
                    else cuda::dense_prefill_attention(qv, kv, vv, ov, opt);
                    const auto w = std::vector<float>(want.begin() + l * n * H * d, want.begin() + (l + 1) * n * H * d);
                    const double e2 = nmse_of(unpad_cols(o.download(), d, D), w);
                    INFO("NMSE " << e2);
                    CHECK(e2 <= nmse_tol<T>());
                }
            };
            if (c.dtype == "fp16") run(vlsparse::half{});
            else if (c.dtype == "fp32") run(float{});
            else run(bfloat16{});
            ++ran;
        }
        std::printf("cuda prefill: %d golden cases checked (%s)\n", ran, kernel_name());
        CHECK(ran >= 12);
    }
    g_kernel = cuda::PrefillKernel::automatic;
}

TEST_CASE("cuda prefill: the instruction path", "[cuda][prefill]") {
    const bool wg = cuda::prefill_uses_wgmma();
    std::printf("cuda prefill: PrefillKernel::automatic runs on %s\n", wg ? "wgmma (sm_90a)" : "mma.sync");
    const char* expect = std::getenv("VLSPARSE_EXPECT_WGMMA");
    if (expect && std::string(expect) == "1") CHECK(wg);
    int dev = 0, major = 0;
    REQUIRE(cudaGetDevice(&dev) == cudaSuccess);
    REQUIRE(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess);
    if (major != 9) CHECK_FALSE(wg);
    // Where wgmma runs, the bulk tensor copies must too (else check_bulk_copy_bits compares cp.async with
    // itself): the driver gives the tensor-map encoder.
    if (wg) CHECK(cuda::detail::tensor_map_encoder() != nullptr);
}

TEST_CASE("cuda prefill: errors", "[cuda][prefill]") {
    const std::int64_t n = 64, H = 4, Hkv = 2, d = 64;
    const auto x = make_qkv<bfloat16>(n, n, H, Hkv, d, Fill::random, 77);
    DeviceQkv<bfloat16> dv(x);
    REQUIRE_NOTHROW(cuda::dense_prefill_attention(dv.qv, dv.kv, dv.vv, dv.ov));
    REQUIRE_THROWS_WITH(cuda::dense_prefill_attention(dv.qv, View3<const bfloat16>(dv.k.data(), {n, 3, d}),
                                                      View3<const bfloat16>(dv.v.data(), {n, 3, d}), dv.ov),
                        Contains("not a multiple of H_kv"));
    REQUIRE_THROWS_WITH(cuda::dense_prefill_attention(dv.qv, View3<const bfloat16>(dv.k.data(), {n - 1, Hkv, d}),
                                                      View3<const bfloat16>(dv.v.data(), {n - 1, Hkv, d}), dv.ov),
                        Contains("expected n_q <= n_k"));
    {  // lse: its shape, and no aliasing of out
        cuda::DeviceArray<float> l(static_cast<std::size_t>(n * H));
        REQUIRE_THROWS_WITH(cuda::dense_prefill_attention(dv.qv, dv.kv, dv.vv, dv.ov, View2<float>(l.data(), {n, H - 1})),
                            Contains("lse has shape [") && Contains("expected [" + std::to_string(n) + ", " + std::to_string(H) + "]"));
        REQUIRE_THROWS_WITH(cuda::dense_prefill_attention(dv.qv, dv.kv, dv.vv, dv.ov, View2<float>(dv.out.data(), {n, H})),
                            Contains("output lse aliases input out"));
        REQUIRE_NOTHROW(cuda::dense_prefill_attention(dv.qv, dv.kv, dv.vv, dv.ov, View2<float>(l.data(), {n, H})));
    }
    REQUIRE_THROWS_WITH(cuda::dense_prefill_attention(dv.qv, dv.kv, View3<const bfloat16>(dv.v.data(), {n - 1, Hkv, d}), dv.ov),
                        Contains("expected the shape of k"));
    {
        cuda::DeviceArray<bfloat16> big(static_cast<std::size_t>(n * H * 320));
        cuda::DeviceArray<float> ob(static_cast<std::size_t>(n * H * 320));
        const View3<const bfloat16> b(big.data(), {n, H, 320}), bk(big.data(), {n, Hkv, 320});
        REQUIRE_THROWS_WITH(cuda::dense_prefill_attention(b, bk, bk, View3<float>(ob.data(), {n, H, 320})),
                            Contains("head_dim = 320; the GPU prefill takes head dims up to 256"));
        // Not unit inner stride.
        const View3<const bfloat16> strided(big.data(), {n, H, d}, {H * 2 * d, 2 * d, 2});
        REQUIRE_THROWS_WITH(cuda::dense_prefill_attention(strided, dv.kv, dv.vv, dv.ov), Contains("unit inner stride"));
        cuda::PrefillOptions bad_kernel;
        bad_kernel.kernel = static_cast<cuda::PrefillKernel>(7);
        REQUIRE_THROWS_WITH(cuda::dense_prefill_attention(dv.qv, dv.kv, dv.vv, dv.ov, bad_kernel), Contains("opt.kernel has value 7"));
    }
    REQUIRE_THROWS_WITH(cuda::dense_prefill_attention(View3<const bfloat16>(dv.q.data() + 1, {n - 1, H, d}), dv.kv, dv.vv,
                                                      View3<float>(dv.out.data(), {n - 1, H, d})),
                        Contains("16-byte aligned"));
    {
        // K / V rows 4 GiB or more apart: the tensor-core kernel gathers rows with 32-bit byte pitches. (One
        // token, so no row past the first is ever addressed.)
        const std::int64_t far = std::int64_t{1} << 31;  // elements: 4 GiB of bf16
        const View3<const bfloat16> kfar(dv.k.data(), {1, Hkv, d}, {far, d, 1});
        REQUIRE_THROWS_WITH(cuda::dense_prefill_attention(View3<const bfloat16>(dv.q.data(), {1, H, d}), kfar, kfar,
                                                          View3<float>(dv.out.data(), {1, H, d})),
                            Contains("row strides below 4 GiB"));
    }
    {
        // The CUDA-core kernel takes an unaligned base (checked against the aligned run).
        cuda::PrefillOptions simt;
        simt.kernel = cuda::PrefillKernel::simt;
        cuda::DeviceArray<bfloat16> q1(x.q.size() + 1);
        REQUIRE(cudaMemcpy(q1.data() + 1, dv.q.data(), x.q.size() * sizeof(bfloat16), cudaMemcpyDeviceToDevice) == cudaSuccess);
        cuda::DeviceArray<float> o1(x.q.size()), o2(x.q.size());
        o1.fill_bytes(0xff);
        o2.fill_bytes(0xff);
        cuda::dense_prefill_attention(View3<const bfloat16>(q1.data() + 1, {n, H, d}), dv.kv, dv.vv, View3<float>(o1.data(), {n, H, d}), simt);
        cuda::dense_prefill_attention(dv.qv, dv.kv, dv.vv, View3<float>(o2.data(), {n, H, d}), simt);
        REQUIRE(o1.download() == o2.download());
    }
    REQUIRE_THROWS_WITH(cuda::dense_prefill_attention(dv.qv, dv.kv, dv.vv, View3<float>(dv.out.data(), {n, H, d - 1})),
                        Contains("out has shape"));
    REQUIRE_THROWS_WITH(cuda::dense_prefill_attention(View3<const bfloat16>(nullptr, {n, H, d}), dv.kv, dv.vv, dv.ov),
                        Contains("null"));
    {
        // out over q: aliasing.
        cuda::DeviceArray<bfloat16> qo(x.q);
        REQUIRE_THROWS_WITH(cuda::dense_prefill_attention(View3<const bfloat16>(qo.data(), {n, H, d}), dv.kv, dv.vv,
                                                          View3<bfloat16>(qo.data(), {n, H, d})),
                            Contains("aliases"));
    }
    {
        // NaN in v: a non-finite output is an error with check_finite, not without.
        auto bad = x.v;
        bad[static_cast<std::size_t>(5 * Hkv * d + 3)] = bfloat16(std::nanf(""));
        cuda::DeviceArray<bfloat16> vb(bad);
        const View3<const bfloat16> vv(vb.data(), {n, Hkv, d});
        REQUIRE_THROWS_WITH(cuda::dense_prefill_attention(dv.qv, dv.kv, vv, dv.ov), Contains("non-finite attention output"));
        cuda::PrefillOptions off;
        off.check_finite = false;
        REQUIRE_NOTHROW(cuda::dense_prefill_attention(dv.qv, dv.kv, vv, dv.ov, off));
        REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    }
    // Token lists.
    {
        std::vector<std::int32_t> indptr{0, 3}, idx{1, 5, 5};
        cuda::DeviceArray<std::int32_t> ip(indptr), ix(idx);
        REQUIRE_THROWS_WITH(cuda::sparse_prefill_attention(dv.qv, dv.kv, dv.vv, cuda::DeviceTokenLists{n, indptr, ip.data(), ix.data()}, dv.ov),
                            Contains("list 0 entry 2: expected ascending unique positions in [0, 64)"));
        idx = {1, 5, 64};
        ix.upload(idx);
        REQUIRE_THROWS_WITH(cuda::sparse_prefill_attention(dv.qv, dv.kv, dv.vv, cuda::DeviceTokenLists{n, indptr, ip.data(), ix.data()}, dv.ov),
                            Contains("list 0 entry 2"));
        std::vector<std::int32_t> three{0, 1, 2, 3};
        cuda::DeviceArray<std::int32_t> ip3(three);
        REQUIRE_THROWS_WITH(cuda::sparse_prefill_attention(dv.qv, dv.kv, dv.vv, cuda::DeviceTokenLists{n, three, ip3.data(), ix.data()}, dv.ov),
                            Contains("got 3 lists, expected 1 (shared) or H_kv = 2"));
        REQUIRE_THROWS_WITH(cuda::sparse_prefill_attention(dv.qv, dv.kv, dv.vv, cuda::DeviceTokenLists{n + 1, indptr, ip.data(), ix.data()}, dv.ov),
                            Contains("the lists refer to 65 tokens"));
        std::vector<std::int32_t> wrong{0, 2};
        idx = {1, 5, 9};
        ix.upload(idx);
        REQUIRE_THROWS_WITH(cuda::sparse_prefill_attention(dv.qv, dv.kv, dv.vv, cuda::DeviceTokenLists{n, wrong, ip.data(), ix.data()}, dv.ov),
                            Contains("differs from the host indptr"));
        REQUIRE_NOTHROW(cuda::sparse_prefill_attention(dv.qv, dv.kv, dv.vv, cuda::DeviceTokenLists{n, indptr, ip.data(), ix.data()}, dv.ov));
        // Kept keys: as many rows as the longest list at least; the lists are checked as above.
        const View3<const bfloat16> k2(dv.k.data(), {2, Hkv, d}), v2(dv.v.data(), {2, Hkv, d});
        REQUIRE_THROWS_WITH(cuda::sparse_prefill_attention_kept(dv.qv, k2, v2, cuda::DeviceTokenLists{n, indptr, ip.data(), ix.data()}, dv.ov),
                            Contains("k_kept has 2 rows and the longest list 3 entries"));
        const View3<const bfloat16> k3(dv.k.data(), {3, Hkv, d}), v3(dv.v.data(), {3, Hkv, d});
        REQUIRE_NOTHROW(cuda::sparse_prefill_attention_kept(dv.qv, k3, v3, cuda::DeviceTokenLists{n, indptr, ip.data(), ix.data()}, dv.ov));
        idx = {1, 5, 5};
        ix.upload(idx);
        REQUIRE_THROWS_WITH(cuda::sparse_prefill_attention_kept(dv.qv, k3, v3, cuda::DeviceTokenLists{n, indptr, ip.data(), ix.data()}, dv.ov),
                            Contains("list 0 entry 2: expected ascending unique positions in [0, 64)"));
    }
    // Masked plans.
    {
        const MaskContext ctx = make_mask_context(Layout::parse("text:10,image:54"));
        REQUIRE_THROWS_WITH(cuda::MaskedPrefillPlan(ctx, std::vector<MaskTemplate>(3, MaskTemplate::document), 2),
                            Contains("not a multiple of H_kv"));
        cuda::MaskedPrefillPlan empty;
        REQUIRE_THROWS_WITH(cuda::masked_prefill_attention(empty, dv.qv, dv.kv, dv.vv, dv.ov), Contains("the plan is empty"));
        const cuda::MaskedPrefillPlan p8(ctx, std::vector<MaskTemplate>(8, MaskTemplate::document), 2);
        REQUIRE_THROWS_WITH(cuda::masked_prefill_attention(p8, dv.qv, dv.kv, dv.vv, dv.ov), Contains("the plan was made for H = 8"));
        const MaskContext c63 = make_mask_context(Layout::parse("text:9,image:54"));
        const cuda::MaskedPrefillPlan p63(c63, std::vector<MaskTemplate>(4, MaskTemplate::document), 2);
        REQUIRE_THROWS_WITH(cuda::masked_prefill_attention(p63, dv.qv, dv.kv, dv.vv, dv.ov), Contains("the plan covers 63"));
    }
}
