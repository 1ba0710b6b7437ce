// Kernels of detail/simd_kernels.hpp, lane by lane against plain std:: scalar code (or double), for the native
// instruction set of this build AND for the always-compiled scalar_arch. Tolerances in units of
// float epsilon, scaled by the condition of each operation (sums of n terms carry ~n eps of rounding).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include <vlsparse/core/dtype.hpp>
#include <vlsparse/core/rng.hpp>
#include <vlsparse/detail/group_kernels.hpp>
#include <vlsparse/detail/simd_kernels.hpp>

#include "test_util.hpp"

namespace {

using vlsparse::detail::Kernels;
using vlsparse::detail::native_arch;
using vlsparse::detail::scalar_arch;

constexpr float kEps = std::numeric_limits<float>::epsilon();
const std::vector<std::int64_t> kSizes{0, 1, 3, 7, 8, 15, 16, 17, 33, 100, 1000};

// Uniform floats in [lo, hi), deterministic from seed.
std::vector<float> uniform(std::size_t n, std::uint64_t seed, float lo, float hi) {
    vlsparse::SplitMix64 rng(seed);
    std::vector<float> v(n);
    for (auto& x : v) x = lo + static_cast<float>(rng.uniform()) * (hi - lo);
    return v;
}

// Buffers with a guard zone after n elements: kernels must not write past n.
constexpr float kGuard = 12345.678f;
std::vector<float> with_guard(std::vector<float> v) {
    v.insert(v.end(), 64, kGuard);
    return v;
}
bool guard_intact(const std::vector<float>& v, std::size_t n) {
    for (std::size_t i = n; i < v.size(); ++i)
        if (v[i] != kGuard) return false;
    return true;
}

template <class Arch>
void run_kernel_tests() {
    using K = Kernels<Arch>;
    const std::string arch = Arch::name();
    const std::uint64_t seed = vt::base_seed();

    SECTION("dot") {
        for (const auto n : kSizes) {
            INFO("arch " << arch << ", n = " << n << ", seed = " << seed);
            const auto a = uniform(static_cast<std::size_t>(n), seed + 1, -1.0f, 1.0f);
            const auto b = uniform(static_cast<std::size_t>(n), seed + 2, -1.0f, 1.0f);
            double exact = 0.0, abs_sum = 0.0;
            for (std::int64_t i = 0; i < n; ++i) {
                exact += static_cast<double>(a[i]) * b[i];
                abs_sum += std::abs(static_cast<double>(a[i]) * b[i]);
            }
            const float got = K::dot(a.data(), b.data(), n);
            // Any summation order: |error| <= n eps sum |a_i b_i| (first order).
            CHECK(std::abs(got - exact) <= (n + 1) * kEps * abs_sum + 1e-30);
        }
    }
    SECTION("max") {
        for (const auto n : kSizes) {
            if (n == 0) continue;  // max needs n >= 1
            INFO("arch " << arch << ", n = " << n << ", seed = " << seed);
            auto x = uniform(static_cast<std::size_t>(n), seed + 3, -50.0f, 50.0f);
            float expect = -std::numeric_limits<float>::infinity();
            for (auto v : x) expect = std::max(expect, v);
            CHECK(K::max(x.data(), n) == expect);  // exact: max does no arithmetic
            // The maximum in the tail, then in the first lane.
            x[static_cast<std::size_t>(n - 1)] = 1000.0f;
            CHECK(K::max(x.data(), n) == 1000.0f);
            x[0] = 2000.0f;
            CHECK(K::max(x.data(), n) == 2000.0f);
            // All negative (max must not start from 0).
            std::vector<float> neg(static_cast<std::size_t>(n), -7.5f);
            neg[static_cast<std::size_t>(n / 2)] = -3.25f;
            CHECK(K::max(neg.data(), n) == -3.25f);
        }
    }
    SECTION("exp_sub_sum") {
        for (const auto n : kSizes) {
            INFO("arch " << arch << ", n = " << n << ", seed = " << seed);
            const auto x0 = uniform(static_cast<std::size_t>(n), seed + 4, -30.0f, 5.0f);
            const float m = 5.0f;
            auto x = with_guard(x0);
            const float sum = K::exp_sub_sum(x.data(), n, m);
            double expect_sum = 0.0;
            for (std::int64_t i = 0; i < n; ++i) {
                const float e = std::exp(x0[static_cast<std::size_t>(i)] - m);
                expect_sum += e;
                INFO("i = " << i << ", x = " << x0[static_cast<std::size_t>(i)]);
                // Lane by lane: within 4 eps relative (xsimd's exp is accurate to ~1-2 ulp), or an
                // absolute FLT_MIN for results in the subnormal range (flushed to 0 is acceptable).
                CHECK(std::abs(x[static_cast<std::size_t>(i)] - e) <=
                      4 * kEps * e + std::numeric_limits<float>::min());
            }
            CHECK(std::abs(sum - expect_sum) <= (n + 4) * kEps * expect_sum + 1e-30);
            CHECK(guard_intact(x, static_cast<std::size_t>(n)));
        }
    }
    SECTION("exp over a range including large negative arguments") {
        // x - m from -1e30 to +80: exp must be 0 (not NaN, not negative) far below the float range and
        // exact-ish where the result is normal.
        std::vector<float> args;
        for (float v : {-1e30f, -1e10f, -1000.0f, -200.0f, -104.0f, -103.9f, -90.0f, -88.7f, -88.3f, -87.0f, -50.0f,
                        -20.5f, -1.0f, -1e-3f, -1e-30f, 0.0f, 1e-30f, 1e-3f, 0.5f, 1.0f, 10.0f, 42.0f, 80.0f})
            args.push_back(v);
        args.push_back(-std::numeric_limits<float>::infinity());
        args.push_back(-std::numeric_limits<float>::max());
        const std::int64_t n = static_cast<std::int64_t>(args.size());
        for (const float m : {0.0f, 3.0f}) {
            std::vector<float> x(args.size());
            for (std::size_t i = 0; i < args.size(); ++i) x[i] = args[i] + m;
            const float sum = K::exp_sub_sum(x.data(), n, m);
            double expect_sum = 0.0;
            for (std::size_t i = 0; i < args.size(); ++i) {
                const float arg = (args[i] + m) - m;
                const float e = std::exp(arg);
                expect_sum += e;
                INFO("arch " << arch << ", m = " << m << ", x - m = " << arg);
                REQUIRE_FALSE(std::isnan(x[i]));
                CHECK(x[i] >= 0.0f);
                CHECK(std::abs(x[i] - e) <= 4 * kEps * e + std::numeric_limits<float>::min());
            }
            CHECK(std::abs(sum - expect_sum) <= (n + 4) * kEps * expect_sum);
        }
        // exp(0) is exactly 1: the row maximum contributes exactly 1 to the softmax sum.
        float one[1] = {2.5f};
        CHECK(K::exp_sub_sum(one, 1, 2.5f) == 1.0f);
        CHECK(one[0] == 1.0f);
    }
    SECTION("scale") {
        for (const auto n : kSizes) {
            INFO("arch " << arch << ", n = " << n << ", seed = " << seed);
            const auto x0 = uniform(static_cast<std::size_t>(n), seed + 5, -10.0f, 10.0f);
            auto x = with_guard(x0);
            K::scale(x.data(), n, 0.37f);
            for (std::int64_t i = 0; i < n; ++i) CHECK(x[static_cast<std::size_t>(i)] == x0[static_cast<std::size_t>(i)] * 0.37f);
            CHECK(guard_intact(x, static_cast<std::size_t>(n)));
        }
    }
    SECTION("axpy") {
        for (const auto n : kSizes) {
            INFO("arch " << arch << ", n = " << n << ", seed = " << seed);
            const auto xs = uniform(static_cast<std::size_t>(n), seed + 6, -10.0f, 10.0f);
            const auto y0 = uniform(static_cast<std::size_t>(n), seed + 7, -10.0f, 10.0f);
            auto y = with_guard(y0);
            const float a = -1.75f;
            K::axpy(y.data(), a, xs.data(), n);
            for (std::int64_t i = 0; i < n; ++i) {
                const auto u = static_cast<std::size_t>(i);
                const double exact = static_cast<double>(y0[u]) + static_cast<double>(a) * xs[u];
                // fused or not: at most 2 roundings of magnitude <= |y| + |a x|.
                CHECK(std::abs(y[u] - exact) <= 2 * kEps * (std::abs(y0[u]) + std::abs(a * xs[u])));
            }
            CHECK(guard_intact(y, static_cast<std::size_t>(n)));
        }
    }
    SECTION("dots: dot products of q with the rows of a strided matrix") {
        for (const auto m : kSizes) {
            for (const std::int64_t n : {1, 3, 16, 17, 128}) {
                INFO("arch " << arch << ", m = " << m << ", n = " << n << ", seed = " << seed);
                const std::int64_t ld = n + 3;
                const auto q = uniform(static_cast<std::size_t>(n), seed + 11, -1.0f, 1.0f);
                const auto k = uniform(static_cast<std::size_t>(std::max<std::int64_t>(m * ld, 1)), seed + 12, -1.0f, 1.0f);
                auto out = with_guard(std::vector<float>(static_cast<std::size_t>(m)));
                K::dots(q.data(), k.data(), ld, m, n, out.data());
                for (std::int64_t t = 0; t < m; ++t) {
                    double exact = 0.0, abs_sum = 0.0;
                    for (std::int64_t c = 0; c < n; ++c) {
                        const double p = static_cast<double>(q[static_cast<std::size_t>(c)]) * k[static_cast<std::size_t>(t * ld + c)];
                        exact += p;
                        abs_sum += std::abs(p);
                    }
                    INFO("row " << t);
                    CHECK(std::abs(out[static_cast<std::size_t>(t)] - exact) <= (n + 1) * kEps * abs_sum + 1e-30);
                }
                CHECK(guard_intact(out, static_cast<std::size_t>(m)));
            }
        }
    }
    SECTION("weighted_sum: o += sum_t p[t] * v[t, :]") {
        for (const auto m : kSizes) {
            for (const std::int64_t n : {1, 3, 16, 17, 33, 100, 128}) {
                INFO("arch " << arch << ", m = " << m << ", n = " << n << ", seed = " << seed);
                const std::int64_t ld = n + 5;
                const auto p = uniform(static_cast<std::size_t>(m), seed + 13, 0.0f, 1.0f);
                const auto v = uniform(static_cast<std::size_t>(std::max<std::int64_t>(m * ld, 1)), seed + 14, -3.0f, 3.0f);
                const auto o0 = uniform(static_cast<std::size_t>(n), seed + 15, -1.0f, 1.0f);
                auto o = with_guard(o0);
                K::weighted_sum(o.data(), p.data(), v.data(), ld, m, n);
                for (std::int64_t c = 0; c < n; ++c) {
                    double exact = o0[static_cast<std::size_t>(c)], mag = std::abs(exact);
                    for (std::int64_t t = 0; t < m; ++t) {
                        const double term = static_cast<double>(p[static_cast<std::size_t>(t)]) * v[static_cast<std::size_t>(t * ld + c)];
                        exact += term;
                        mag += std::abs(term);
                    }
                    INFO("column " << c);
                    CHECK(std::abs(o[static_cast<std::size_t>(c)] - exact) <= (m + 2) * kEps * mag);
                }
                CHECK(guard_intact(o, static_cast<std::size_t>(n)));
            }
        }
    }
    SECTION("all_finite") {
        const float bad_values[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                                    -std::numeric_limits<float>::infinity()};
        for (const auto n : kSizes) {
            INFO("arch " << arch << ", n = " << n);
            auto x = uniform(static_cast<std::size_t>(n), seed + 16, -1e30f, 1e30f);
            if (n > 0) x[0] = std::numeric_limits<float>::max();  // huge but finite
            CHECK(K::all_finite(x.data(), n));
            for (const std::int64_t pos : {std::int64_t{0}, n / 2, n - 1}) {
                if (pos < 0 || pos >= n) continue;
                for (const float b : bad_values) {
                    auto y = x;
                    y[static_cast<std::size_t>(pos)] = b;
                    INFO("bad value " << b << " at " << pos);
                    CHECK_FALSE(K::all_finite(y.data(), n));
                }
            }
        }
    }
    SECTION("sum_into") {
        for (const auto n : kSizes) {
            INFO("arch " << arch << ", n = " << n << ", seed = " << seed);
            const auto xs = uniform(static_cast<std::size_t>(n), seed + 8, -10.0f, 10.0f);
            const auto a0 = uniform(static_cast<std::size_t>(n), seed + 9, -10.0f, 10.0f);
            auto acc = with_guard(a0);
            K::sum_into(acc.data(), xs.data(), n);
            for (std::int64_t i = 0; i < n; ++i) {
                const auto u = static_cast<std::size_t>(i);
                CHECK(acc[u] == a0[u] + xs[u]);  // one IEEE addition: exact match
            }
            CHECK(guard_intact(acc, static_cast<std::size_t>(n)));
        }
    }
}

}  // namespace

TEST_CASE("simd kernels: native instruction set", "[simd][kernels]") {
    INFO("native_arch = " << native_arch::name());
    run_kernel_tests<native_arch>();
}

TEST_CASE("simd kernels: scalar_arch (always compiled)", "[simd][kernels]") { run_kernel_tests<scalar_arch>(); }

TEST_CASE("simd kernels: native_arch follows the build flags", "[simd][kernels]") {
    // xsimd::default_arch is the first supported entry of its x86 list (avx512bw, avx512dq, avx512cd,
    // avx512f, fma3<avx2>, avx2, ...); the usual flag sets are checked, others only reported.
    const std::string name = native_arch::name();
    INFO("native_arch = " << name);
#if defined(VLSPARSE_FORCE_SCALAR)
    CHECK(std::is_same_v<native_arch, scalar_arch>);
#elif defined(__AVX512BW__)
    CHECK(name == "avx512bw");
#elif defined(__AVX512F__)
    CHECK(name.rfind("avx512", 0) == 0);
#elif defined(__AVX2__) && defined(__FMA__)
    CHECK(name == "fma3+avx2");
#elif defined(__x86_64__) && !defined(__AVX__) && !defined(__SSE3__)
    CHECK(name == "sse2");
#else
    SUCCEED("flags not in the checked list; native_arch = " << name);
#endif
}

TEST_CASE("widen_row: float, half and bfloat16 rows, contiguous and strided", "[simd][kernels]") {
    const std::uint64_t seed = vt::base_seed();
    INFO("seed = " << seed);
    for (const std::int64_t n : kSizes) {
        for (const std::int64_t stride : {1, 3}) {
            INFO("n = " << n << ", stride = " << stride);
            const auto src = uniform(static_cast<std::size_t>(n * stride + 1), seed + 10, -100.0f, 100.0f);
            std::vector<vlsparse::half> h(src.size());
            std::vector<vlsparse::bfloat16> b(src.size());
            for (std::size_t i = 0; i < src.size(); ++i) {
                h[i] = vlsparse::half(src[i]);
                b[i] = vlsparse::bfloat16(src[i]);
            }
            auto df = with_guard(std::vector<float>(static_cast<std::size_t>(n)));
            auto dh = df, db = df;
            vlsparse::detail::widen_row(src.data(), stride, df.data(), n);
            vlsparse::detail::widen_row(h.data(), stride, dh.data(), n);
            vlsparse::detail::widen_row(b.data(), stride, db.data(), n);
            for (std::int64_t i = 0; i < n; ++i) {
                const auto u = static_cast<std::size_t>(i), s = static_cast<std::size_t>(i * stride);
                CHECK(df[u] == src[s]);
                CHECK(dh[u] == vlsparse::to_float(h[s]));  // exact conversions
                CHECK(db[u] == vlsparse::to_float(b[s]));
            }
            CHECK(guard_intact(df, static_cast<std::size_t>(n)));
            CHECK(guard_intact(dh, static_cast<std::size_t>(n)));
            CHECK(guard_intact(db, static_cast<std::size_t>(n)));
        }
    }
    // Special half values: subnormals, infinities, signed zero (F16C and the scalar path must agree).
    std::vector<vlsparse::half> special;
    for (std::uint16_t bits : {0x0000, 0x8000, 0x0001, 0x03FF, 0x0400, 0x7BFF, 0x7C00, 0xFC00, 0x3C00, 0xBC00, 0x3555,
                               0x8001, 0x0200, 0x4248, 0xC248, 0x1234})
        special.push_back(vlsparse::half::from_bits(bits));
    std::vector<float> out(special.size());
    vlsparse::detail::widen_row(special.data(), 1, out.data(), static_cast<std::int64_t>(special.size()));
    for (std::size_t i = 0; i < special.size(); ++i) {
        INFO("half bits 0x" << std::hex << special[i].bits);
        CHECK(vlsparse::detail::float_bits(out[i]) == vlsparse::detail::float_bits(vlsparse::to_float(special[i])));
    }
}

// ---------------------------------------------------------------------------------------------
// detail/group_kernels.hpp: G query heads against listed rows of float / half / bfloat16, against
// double sums of the exactly widened inputs. Group sizes that are not powers of two (3, 5, 6, 12)
// run as several head blocks; d not a multiple of the width exercises the column tails; list
// lengths below / above one tile, and rows listed out of order and twice, reach the row tails.
// ---------------------------------------------------------------------------------------------
namespace {

template <class Arch, class TC>
void check_group_kernels(std::uint64_t seed) {
    using G = vlsparse::detail::GroupKernels<Arch>;
    const std::string arch = Arch::name();
    const std::int64_t rows = 70;
    for (const std::int64_t d : {1, 3, 16, 40, 128}) {
        const auto src = uniform(static_cast<std::size_t>(rows * d), seed + static_cast<std::uint64_t>(d), -2.0f, 2.0f);
        std::vector<TC> cache(src.size());
        for (std::size_t i = 0; i < src.size(); ++i) cache[i] = vlsparse::from_float<TC>(src[i]);
        for (const std::int64_t group : {1, 2, 3, 4, 5, 6, 8, 12, 16, 32}) {
            for (const std::int64_t m : {1, 2, 5, 16, 17, 33}) {
                INFO("arch " << arch << ", element bytes " << sizeof(TC) << ", d = " << d << ", G = " << group
                             << ", m = " << m << ", seed = " << seed);
                std::vector<std::int64_t> idx(static_cast<std::size_t>(m));
                for (std::int64_t t = 0; t < m; ++t) idx[static_cast<std::size_t>(t)] = (t * 29 + 3) % rows;
                if (m > 2) idx[1] = idx[0];  // a row listed twice
                const auto q = uniform(static_cast<std::size_t>(group * d), seed + 100, -1.0f, 1.0f);
                const std::int64_t ss = m + 3, os = d + 2;
                auto s = with_guard(std::vector<float>(static_cast<std::size_t>(group * ss), -7.0f));
                G::dots(q.data(), group, cache.data(), idx.data(), m, d, s.data(), ss);
                const auto p = uniform(static_cast<std::size_t>(group * ss), seed + 101, 0.0f, 1.0f);
                const auto o0 = uniform(static_cast<std::size_t>(group * os), seed + 102, -1.0f, 1.0f);
                auto o = with_guard(o0);
                G::weighted_sum(o.data(), os, p.data(), ss, group, cache.data(), idx.data(), m, d);
                for (std::int64_t a = 0; a < group; ++a) {
                    for (std::int64_t t = 0; t < m; ++t) {
                        double exact = 0.0, mag = 0.0;
                        for (std::int64_t c = 0; c < d; ++c) {
                            const double x = static_cast<double>(q[static_cast<std::size_t>(a * d + c)]) *
                                             vlsparse::to_float(cache[static_cast<std::size_t>(idx[static_cast<std::size_t>(t)] * d + c)]);
                            exact += x;
                            mag += std::abs(x);
                        }
                        INFO("dots: head " << a << ", entry " << t);
                        CHECK(std::abs(s[static_cast<std::size_t>(a * ss + t)] - exact) <= (d + 1) * kEps * mag + 1e-30);
                    }
                    for (std::int64_t t = m; t < ss; ++t) CHECK(s[static_cast<std::size_t>(a * ss + t)] == -7.0f);  // gaps untouched
                    for (std::int64_t c = 0; c < os; ++c) {
                        const auto u = static_cast<std::size_t>(a * os + c);
                        if (c >= d) {
                            CHECK(o[u] == o0[u]);  // columns past d untouched
                            continue;
                        }
                        double exact = o0[u], mag = std::abs(exact);
                        for (std::int64_t t = 0; t < m; ++t) {
                            const double x = static_cast<double>(p[static_cast<std::size_t>(a * ss + t)]) *
                                             vlsparse::to_float(cache[static_cast<std::size_t>(idx[static_cast<std::size_t>(t)] * d + c)]);
                            exact += x;
                            mag += std::abs(x);
                        }
                        INFO("weighted_sum: head " << a << ", column " << c);
                        CHECK(std::abs(o[u] - exact) <= (m + 2) * kEps * mag);
                    }
                }
                CHECK(guard_intact(s, static_cast<std::size_t>(group * ss)));
                CHECK(guard_intact(o, static_cast<std::size_t>(group * os)));
            }
        }
    }
}

template <class Arch>
void run_group_kernel_tests() {
    const std::uint64_t seed = vt::base_seed() + 900;
    check_group_kernels<Arch, float>(seed);
    check_group_kernels<Arch, vlsparse::half>(seed + 1);
    check_group_kernels<Arch, vlsparse::bfloat16>(seed + 2);
}

}  // namespace

TEST_CASE("group kernels: native instruction set", "[simd][kernels]") {
    INFO("native_arch = " << native_arch::name());
    run_group_kernel_tests<native_arch>();
}

TEST_CASE("group kernels: scalar_arch (always compiled)", "[simd][kernels]") { run_group_kernel_tests<scalar_arch>(); }
