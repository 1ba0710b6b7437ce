// Tests of the core vocabulary: dtypes, tensor views, SplitMix64 and sampling, top-k, count_for_mass,
// and the argument checks of detail/check.hpp.
#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <set>
#include <span>
#include <type_traits>
#include <vector>

#ifdef __F16C__
#include <immintrin.h>
#endif

#include <vlsparse/core/dtype.hpp>
#include <vlsparse/core/error.hpp>
#include <vlsparse/core/rng.hpp>
#include <vlsparse/core/tensor.hpp>
#include <vlsparse/core/topk.hpp>
#include <vlsparse/detail/check.hpp>

using Catch::Matchers::Contains;
using vlsparse::bfloat16;
using vlsparse::half;

namespace {

float f_of(std::uint32_t u) { return vlsparse::detail::bits_float(u); }
std::uint32_t u_of(float f) { return vlsparse::detail::float_bits(f); }

bool half_is_nan(std::uint16_t h) { return (h & 0x7C00u) == 0x7C00u && (h & 0x3FFu) != 0; }
bool bf16_is_nan(std::uint16_t b) { return (b & 0x7F80u) == 0x7F80u && (b & 0x7Fu) != 0; }

// The value of a binary16 pattern, from the IEEE definition (independent of half::to_float).
double half_value(std::uint16_t h) {
    const int sign = (h >> 15) & 1, exp = (h >> 10) & 0x1F, man = h & 0x3FF;
    double v;
    if (exp == 0x1F) v = man ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
    else if (exp == 0) v = std::ldexp(static_cast<double>(man), -24);
    else v = std::ldexp(1.0 + man / 1024.0, exp - 15);
    return sign ? -v : v;
}

// Correctly rounded float -> binary16 value (round to nearest, ties to even), computed in double:
// the quantum (ulp) of the binade of |f|, the quotient rounded with nearbyint (ties to even).
double half_round_reference(float f) {
    if (std::isinf(f)) return f;
    const double a = std::fabs(static_cast<double>(f));
    double q;
    if (a < std::ldexp(1.0, -14)) q = std::ldexp(1.0, -24);
    else q = std::ldexp(1.0, std::ilogb(a) - 10);
    double r = std::nearbyint(a / q) * q;  // a / q is exact (a has 24 significant bits)
    if (r >= 65536.0) r = std::numeric_limits<double>::infinity();
    return std::signbit(f) ? -r : r;
}

// Correctly rounded float -> bfloat16 bits, by comparing the two neighbours in double.
std::uint16_t bf16_round_reference(float f) {
    const std::uint32_t u = u_of(f), sign = u & 0x80000000u, mag = u & 0x7FFFFFFFu;
    const std::uint32_t lo = mag & 0xFFFF0000u, hi = lo + 0x10000u;
    const double x = static_cast<double>(f_of(mag));
    const double dlo = x - static_cast<double>(f_of(lo));
    // hi may be the +inf pattern: as a "value" it is 2^128 for rounding purposes.
    const double vhi = hi == 0x7F800000u ? std::ldexp(1.0, 128) : static_cast<double>(f_of(hi));
    const double dhi = vhi - x;
    std::uint32_t pick;
    if (dlo < dhi) pick = lo;
    else if (dhi < dlo) pick = hi;
    else pick = ((lo >> 16) & 1u) ? hi : lo;
    return static_cast<std::uint16_t>((sign | pick) >> 16);
}

}  // namespace

// ---- half ---------------------------------------------------------------------------------------

TEST_CASE("half: every bit pattern converts to its IEEE value and back", "[dtype][half]") {
    int nans = 0;
    for (std::uint32_t b = 0; b < 65536; ++b) {
        const auto h = static_cast<std::uint16_t>(b);
        const float f = half::to_float(h);
        const double ref = half_value(h);
        if (half_is_nan(h)) {
            ++nans;
            REQUIRE(std::isnan(f));
            REQUIRE(std::signbit(f) == ((h & 0x8000u) != 0));
            const std::uint16_t back = half::from_float(f);
            REQUIRE(half_is_nan(back));  // payload may be canonicalized, NaN-ness and sign are kept
            REQUIRE((back & 0x8000u) == (h & 0x8000u));
            continue;
        }
        INFO("bits 0x" << std::hex << b);
        REQUIRE(static_cast<double>(f) == ref);
        REQUIRE(std::signbit(f) == ((h & 0x8000u) != 0));  // -0 stays -0
        REQUIRE(half::from_float(f) == h);
    }
    REQUIRE(nans == 2 * 1023);
}

TEST_CASE("half: float -> half rounding, hand-computed table", "[dtype][half]") {
    struct Case {
        std::uint32_t in;  // float bits
        std::uint16_t out;
        const char* what;
    };
    // 2^-24 = 0x33800000, 2^-25 = 0x33000000, 2^-14 = 0x38800000, 1 + 2^-11 = 0x3F801000.
    const Case cases[] = {
        {0x3F800000u, 0x3C00u, "1.0"},
        {0xC0000000u, 0xC000u, "-2.0"},
        {0x00000000u, 0x0000u, "+0"},
        {0x80000000u, 0x8000u, "-0"},
        {0x3DCCCCCDu, 0x2E66u, "0.1 -> 0.0999755859375"},
        {0x477FE000u, 0x7BFFu, "65504 (largest finite)"},
        {0x477FEFFFu, 0x7BFFu, "just below 65520 rounds down to 65504"},
        {0x477FF000u, 0x7C00u, "65520: tie between 65504 and 2^16, even side is inf"},
        {0x49742400u, 0x7C00u, "1e6 overflows to inf"},
        {0xC9742400u, 0xFC00u, "-1e6 overflows to -inf"},
        {0x7F800000u, 0x7C00u, "+inf"},
        {0xFF800000u, 0xFC00u, "-inf"},
        {0x33800000u, 0x0001u, "2^-24: smallest subnormal"},
        {0x33000000u, 0x0000u, "2^-25: tie between 0 and 2^-24, even is 0"},
        {0x33000001u, 0x0001u, "just above 2^-25 rounds up"},
        {0x32FFFFFFu, 0x0000u, "just below 2^-25 rounds to 0"},
        {0xB3000000u, 0x8000u, "-2^-25 -> -0"},
        {0x33C00000u, 0x0002u, "3 * 2^-25 = 1.5 * 2^-24: tie between 1 and 2 units, even is 2"},
        {0x34200000u, 0x0002u, "5 * 2^-25 = 2.5 * 2^-24: tie between 2 and 3 units, even is 2"},
        {0x387FC000u, 0x03FFu, "2^-14 - 2^-24: largest subnormal"},
        {0x387FE000u, 0x0400u, "2^-14 - 2^-25: tie between largest subnormal and 2^-14, even is 2^-14"},
        {0x38800000u, 0x0400u, "2^-14: smallest normal"},
        {0x3F801000u, 0x3C00u, "1 + 2^-11: tie, even is 1.0"},
        {0x3F803000u, 0x3C02u, "1 + 3*2^-11: tie, even is 1 + 2^-9"},
        {0x3F801001u, 0x3C01u, "just above 1 + 2^-11 rounds up"},
        {0x45001000u, 0x6800u, "2049: tie between 2048 and 2050, even is 2048"},
        {0x45003000u, 0x6802u, "2051: tie between 2050 and 2052, even is 2052"},
        {0x3FFFF000u, 0x4000u, "2 - 2^-12: tie, rounds up into the next binade"},
    };
    for (const auto& c : cases) {
        INFO(c.what);
        CHECK(half::from_float(f_of(c.in)) == c.out);
        CHECK(half(f_of(c.in)).bits == c.out);
        CHECK(half_round_reference(f_of(c.in)) == half_value(c.out));
    }
    CHECK(half_is_nan(half::from_float(std::numeric_limits<float>::quiet_NaN())));
    CHECK(half_is_nan(half::from_float(f_of(0x7F800001u))));  // signalling NaN with a low payload stays NaN
    CHECK(half_is_nan(half::from_float(f_of(0xFFC00000u))));
    CHECK((half::from_float(f_of(0xFFC00000u)) & 0x8000u) != 0);
}

TEST_CASE("half: float -> half matches the correctly rounded value", "[dtype][half]") {
    // Every tie between two adjacent halves, and its two float neighbours.
    for (std::uint32_t b = 0; b < 0x7C00u; ++b) {
        const double lo = half_value(static_cast<std::uint16_t>(b));
        const double hi = b + 1 < 0x7C00u ? half_value(static_cast<std::uint16_t>(b + 1)) : 65536.0;
        const float mid = static_cast<float>((lo + hi) / 2);  // exact: 12 significant bits
        REQUIRE(static_cast<double>(mid) == (lo + hi) / 2);
        const std::uint16_t even = (b & 1u) ? static_cast<std::uint16_t>(b + 1) : static_cast<std::uint16_t>(b);
        INFO("tie above half 0x" << std::hex << b);
        REQUIRE(half::from_float(mid) == (even == 0x7C00u ? 0x7C00u : even));
        REQUIRE(half::from_float(-mid) == (0x8000u | even));
        REQUIRE(half::from_float(std::nextafter(mid, 0.0f)) == b);
        REQUIRE(half::from_float(std::nextafter(mid, 1e30f)) == b + 1);
    }
    // A large random sample of float bit patterns against the double-arithmetic reference.
    // Mismatches are counted (one assertion per loop keeps the sanitizer build fast).
    vlsparse::SplitMix64 rng(0xF16C);
    int bad = 0;
    std::uint32_t first_bad = 0;
    for (int i = 0; i < 2000000; ++i) {
        // Bias half the draws towards the half range (exponents 100..145).
        std::uint32_t u = static_cast<std::uint32_t>(rng.next());
        if (i & 1) u = (u & 0x807FFFFFu) | (static_cast<std::uint32_t>(100 + rng.below(46)) << 23);
        const float f = f_of(u);
        const std::uint16_t h = half::from_float(f);
        const bool ok = std::isnan(f) ? half_is_nan(h)
                                      : half_value(h) == half_round_reference(f) &&
                                            std::signbit(half_value(h)) == std::signbit(f);
        if (!ok && bad++ == 0) first_bad = u;
    }
    INFO(bad << " mismatches; first at float bits 0x" << std::hex << first_bad);
    CHECK(bad == 0);
}

#ifdef __F16C__
TEST_CASE("half: float -> half matches the F16C instruction (vcvtps2ph)", "[dtype][half][f16c]") {
    vlsparse::SplitMix64 rng(1234);
    int bad = 0;
    std::uint32_t first_bad = 0;
    auto check = [&](std::uint32_t u) {
        const float f = f_of(u);
        const auto hw = static_cast<std::uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
        const std::uint16_t sw = half::from_float(f);
        // NaN payloads differ (the library canonicalizes them); NaN-ness must agree.
        const bool ok = std::isnan(f) ? half_is_nan(sw) && half_is_nan(hw) : sw == hw;
        if (!ok && bad++ == 0) first_bad = u;
    };
    for (int i = 0; i < 4000000; ++i) {
        std::uint32_t u = static_cast<std::uint32_t>(rng.next());
        if (i & 1) u = (u & 0x807FFFFFu) | (static_cast<std::uint32_t>(100 + rng.below(46)) << 23);
        check(u);
    }
    // Every 7th float across the subnormal-half range [2^-25 - eps, 2^-14].
    for (std::uint32_t u = 0x32FFFFF0u; u <= 0x38800000u; u += 7) check(u);
    INFO(bad << " mismatches; first at float bits 0x" << std::hex << first_bad);
    CHECK(bad == 0);
    // And half -> float for every pattern.
    for (std::uint32_t b = 0; b < 65536; ++b) {
        const float hw = _cvtsh_ss(static_cast<unsigned short>(b));
        const float sw = half::to_float(static_cast<std::uint16_t>(b));
        if (std::isnan(hw)) REQUIRE(std::isnan(sw));
        else REQUIRE(u_of(hw) == u_of(sw));
    }
}
#endif

// ---- bfloat16 -----------------------------------------------------------------------------------

TEST_CASE("bfloat16: conversions, ties to even, NaN", "[dtype][bf16]") {
    struct Case {
        std::uint32_t in;
        std::uint16_t out;
        const char* what;
    };
    const Case cases[] = {
        {0x3F800000u, 0x3F80u, "1.0"},
        {0x3F808000u, 0x3F80u, "1 + 2^-8: tie, even is 1.0"},
        {0x3F818000u, 0x3F82u, "1 + 3*2^-8: tie, even is 1 + 2^-6"},
        {0x3F808001u, 0x3F81u, "just above the tie rounds up"},
        {0x3F807FFFu, 0x3F80u, "just below the tie rounds down"},
        {0xBF808000u, 0xBF80u, "negative tie, even"},
        {0x7F7FFFFFu, 0x7F80u, "FLT_MAX rounds to inf"},
        {0x7F7F7FFFu, 0x7F7Fu, "below the last tie stays finite"},
        {0x7F800000u, 0x7F80u, "+inf"},
        {0xFF800000u, 0xFF80u, "-inf"},
        {0x80000000u, 0x8000u, "-0"},
        {0x00008000u, 0x0000u, "subnormal tie, even is 0"},
        {0x00018000u, 0x0002u, "subnormal tie, even is 2"},
        {0x3FFF8000u, 0x4000u, "tie rounds up into the next binade"},
    };
    for (const auto& c : cases) {
        INFO(c.what);
        CHECK(bfloat16::from_float(f_of(c.in)) == c.out);
        CHECK(bf16_round_reference(f_of(c.in)) == c.out);
    }
    // NaNs stay NaN even when the payload lies only in the low 16 bits (truncation would give inf).
    CHECK(bfloat16::from_float(f_of(0x7F800001u)) == 0x7FC0u);
    CHECK(bfloat16::from_float(f_of(0xFF800001u)) == 0xFFC0u);
    CHECK(bf16_is_nan(bfloat16::from_float(std::numeric_limits<float>::quiet_NaN())));
    CHECK(bf16_is_nan(bfloat16::from_float(f_of(0x7FFFFFFFu))));  // would carry into the sign without the NaN path

    // Round trip of every non-NaN pattern, and widening is exact.
    for (std::uint32_t b = 0; b < 65536; ++b) {
        const auto h = static_cast<std::uint16_t>(b);
        const float f = bfloat16::to_float(h);
        REQUIRE(u_of(f) == (b << 16));
        if (bf16_is_nan(h)) REQUIRE(bf16_is_nan(bfloat16::from_float(f)));
        else REQUIRE(bfloat16::from_float(f) == h);
    }
    vlsparse::SplitMix64 rng(99);
    int bad = 0, nans = 0;
    std::uint32_t first_bad = 0;
    for (int i = 0; i < 1000000; ++i) {
        const auto u = static_cast<std::uint32_t>(rng.next());
        const std::uint16_t b = bfloat16::from_float(f_of(u));
        const bool ok = std::isnan(f_of(u)) ? (++nans, bf16_is_nan(b)) : b == bf16_round_reference(f_of(u));
        if (!ok && bad++ == 0) first_bad = u;
    }
    INFO(bad << " mismatches; first at float bits 0x" << std::hex << first_bad);
    CHECK(bad == 0);
    CHECK(nans > 0);  // the sample did exercise NaN inputs (about 1 in 256)
}

TEST_CASE("dtype helpers", "[dtype]") {
    CHECK(vlsparse::dtype_of<float>() == vlsparse::DType::f32);
    CHECK(vlsparse::dtype_of<const half>() == vlsparse::DType::f16);
    CHECK(vlsparse::dtype_of<bfloat16>() == vlsparse::DType::bf16);
    CHECK(vlsparse::dtype_name(vlsparse::DType::bf16) == "bf16");
    CHECK(vlsparse::dtype_size(vlsparse::DType::f32) == 4);
    CHECK(vlsparse::dtype_size(vlsparse::DType::f16) == 2);
    CHECK(sizeof(half) == 2);
    CHECK(sizeof(bfloat16) == 2);
    CHECK(vlsparse::to_float(vlsparse::from_float<half>(0.333333f)) == half::to_float(0x3555u));
    CHECK(vlsparse::from_float<float>(0.1f) == 0.1f);
    STATIC_REQUIRE(!vlsparse::is_element_type_v<double>);
    STATIC_REQUIRE(vlsparse::is_element_type_v<const bfloat16>);
}

// ---- TensorView ---------------------------------------------------------------------------------

TEST_CASE("TensorView: contiguous strides and indexing", "[tensor]") {
    std::vector<float> buf(24);
    for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>(i);
    vlsparse::View3<float> v(buf.data(), {2, 3, 4});
    CHECK(v.stride == std::array<std::int64_t, 3>{12, 4, 1});
    CHECK(v.numel() == 24);
    CHECK(v.size(1) == 3);
    CHECK(v.is_contiguous());
    CHECK(!v.empty());
    CHECK(v(1, 2, 3) == 23.0f);
    CHECK(v(0, 1, 2) == 6.0f);
    CHECK(v.row(1, 1) == buf.data() + 16);
    v(1, 0, 0) = -1.0f;
    CHECK(buf[12] == -1.0f);

    const auto tm = vlsparse::token_major(buf.data(), 2, 3, 4);
    CHECK(tm.stride == v.stride);
    CHECK(tm.shape == v.shape);
}

TEST_CASE("TensorView: head_major view of an [H, n, d] buffer", "[tensor]") {
    const std::int64_t n = 5, H = 3, d = 4;
    std::vector<float> buf(static_cast<std::size_t>(n * H * d));
    for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>(i);
    const auto v = vlsparse::head_major(buf.data(), n, H, d);
    CHECK(v.shape == std::array<std::int64_t, 3>{n, H, d});
    CHECK(v.stride == std::array<std::int64_t, 3>{d, n * d, 1});
    CHECK_FALSE(v.is_contiguous());
    for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t h = 0; h < H; ++h) {
            CHECK(v.row(i, h) == buf.data() + (h * n + i) * d);
            for (std::int64_t c = 0; c < d; ++c)
                REQUIRE(v(i, h, c) == buf[static_cast<std::size_t>((h * n + i) * d + c)]);
        }
    // One head: [1, n, d] and [n, 1, d] are the same memory, so the view is contiguous.
    CHECK(vlsparse::head_major(buf.data(), n, 1, d).is_contiguous());
}

TEST_CASE("TensorView: const conversion, contiguity, empty views", "[tensor]") {
    std::vector<float> buf(12, 0.0f);
    vlsparse::View2<float> v(buf.data(), {3, 4});
    vlsparse::View2<const float> c = v;
    CHECK(c.data == v.data);
    CHECK(c.shape == v.shape);
    CHECK(c.stride == v.stride);
    STATIC_REQUIRE(std::is_convertible_v<vlsparse::View3<half>, vlsparse::View3<const half>>);
    STATIC_REQUIRE_FALSE(std::is_convertible_v<vlsparse::View3<const half>, vlsparse::View3<half>>);
    STATIC_REQUIRE_FALSE(std::is_convertible_v<vlsparse::View3<float>, vlsparse::View3<const half>>);

    // Every other column: not contiguous.
    CHECK_FALSE(vlsparse::View2<float>(buf.data(), {3, 2}, {4, 2}).is_contiguous());
    // Extent-1 dimensions may carry any stride.
    CHECK(vlsparse::View3<float>(buf.data(), {3, 1, 4}, {4, 999, 1}).is_contiguous());
    // Rows padded to 8 elements: not contiguous.
    CHECK_FALSE(vlsparse::View2<float>(buf.data(), {2, 4}, {8, 1}).is_contiguous());
    const vlsparse::View3<float> e(buf.data(), {0, 3, 4});
    CHECK(e.empty());
    CHECK(e.numel() == 0);
}

// ---- SplitMix64 and sampling --------------------------------------------------------------------

TEST_CASE("SplitMix64: first outputs for known seeds", "[rng]") {
    // Produced independently with Python integers (not with this header):
    //   M = 2**64 - 1; x = seed
    //   x = (x + 0x9E3779B97F4A7C15) & M; z = x
    //   z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M; z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
    //   out = z ^ (z >> 31)
    // Seed 0's first output 0xE220A8397B1DCDAF is also the value published with Vigna's reference C code.
    vlsparse::SplitMix64 r0(0);
    CHECK(r0.next() == 0xE220A8397B1DCDAFull);
    CHECK(r0.next() == 0x6E789E6AA1B965F4ull);
    CHECK(r0.next() == 0x06C45D188009454Full);
    CHECK(r0.next() == 0xF88BB8A8724C81ECull);
    CHECK(r0.next() == 0x1B39896A51A8749Bull);
    vlsparse::SplitMix64 r1(1234567);
    CHECK(r1.next() == 0x599ED017FB08FC85ull);
    CHECK(r1.next() == 0x2C73F08458540FA5ull);
    CHECK(r1.next() == 0x883EBCE5A3F27C77ull);
    CHECK(r1.next() == 0x3FBEF740E9177B3Full);
    CHECK(r1.next() == 0xE3B8346708CB5ECDull);
    CHECK(r1.state() == 1234567ull + 5 * 0x9E3779B97F4A7C15ull);
    // uniform(): (next() >> 11) * 2^-53; values from the same Python model for seed 7.
    vlsparse::SplitMix64 r7(7);
    CHECK(r7.uniform() == 3511274219185729.0 * 0x1.0p-53);
    CHECK(r7.uniform() == 151215513962380.0 * 0x1.0p-53);
}

TEST_CASE("SplitMix64::below: known values, range, uniformity", "[rng]") {
    // Python: (next() * m) >> 64 for seed 42 and m = 10, 1000, 2^63 | 5, 3, 7.
    vlsparse::SplitMix64 r(42);
    CHECK(r.below(10) == 7u);
    CHECK(r.below(1000) == 159u);
    CHECK(r.below((1ull << 63) | 5u) == 2569641874231381930ull);
    CHECK(r.below(3) == 1u);
    CHECK(r.below(7) == 0u);

    vlsparse::SplitMix64 g(2024);
    for (int i = 0; i < 1000; ++i) REQUIRE(g.below(1) == 0u);
    for (std::uint64_t m : {2ull, 3ull, 17ull, 1000003ull, ~0ull}) {
        for (int i = 0; i < 2000; ++i) REQUIRE(g.below(m) < m);
    }
    // Chi-square over 10 buckets, 100000 draws: 9 degrees of freedom, P(chi2 > 27.9) = 0.001.
    std::array<int, 10> hist{};
    const int draws = 100000;
    for (int i = 0; i < draws; ++i) ++hist[static_cast<std::size_t>(g.below(10))];
    double chi2 = 0;
    for (int c : hist) chi2 += (c - draws / 10.0) * (c - draws / 10.0) / (draws / 10.0);
    INFO("chi2 = " << chi2);
    CHECK(chi2 < 27.9);
    // uniform() in [0, 1) with mean near 1/2.
    double sum = 0;
    for (int i = 0; i < 100000; ++i) {
        const double u = g.uniform();
        REQUIRE(u >= 0.0);
        REQUIRE(u < 1.0);
        sum += u;
    }
    CHECK(std::fabs(sum / 100000 - 0.5) < 0.005);  // 5.5 standard deviations
    CHECK_THROWS_WITH(g.below(0), Contains("SplitMix64::below") && Contains("m = 0"));
}

TEST_CASE("sample_without_replacement", "[rng]") {
    using vlsparse::sample_without_replacement;
    // Python port of the documented partial Fisher-Yates (see rng.hpp), same seeds:
    //   r = SM(seed); a = list(range(n))
    //   for i in range(k): j = i + r.below(n - i); a[i], a[j] = a[j], a[i]
    //   sorted(a[:k])
    CHECK(sample_without_replacement(10, 4, 42) == std::vector<std::int64_t>{2, 4, 5, 7});
    CHECK(sample_without_replacement(100, 10, 2026) ==
          std::vector<std::int64_t>{29, 38, 40, 47, 67, 74, 79, 81, 85, 95});
    CHECK(sample_without_replacement(1000, 3, 0) == std::vector<std::int64_t>{28, 432, 883});
    CHECK(sample_without_replacement(5, 5, 7) == std::vector<std::int64_t>{0, 1, 2, 3, 4});
    CHECK(sample_without_replacement(5, 0, 7).empty());
    CHECK(sample_without_replacement(0, 0, 7).empty());

    // Deterministic, sorted, unique, in range; the generator advances by exactly k draws.
    for (std::int64_t k : {1, 7, 50, 99, 100}) {
        const auto a = sample_without_replacement(100, k, 5);
        REQUIRE(a == sample_without_replacement(100, k, 5));
        REQUIRE(static_cast<std::int64_t>(a.size()) == k);
        REQUIRE(std::set<std::int64_t>(a.begin(), a.end()).size() == a.size());
        REQUIRE(std::is_sorted(a.begin(), a.end()));
        REQUIRE(a.front() >= 0);
        REQUIRE(a.back() < 100);
        vlsparse::SplitMix64 r(5), ref(5);
        (void)sample_without_replacement(100, k, r);
        for (std::int64_t i = 0; i < k; ++i) (void)ref.next();
        REQUIRE(r.state() == ref.state());
    }
    CHECK(sample_without_replacement(100, 10, 1) != sample_without_replacement(100, 10, 2));
    // Each element is equally likely: 3 of 6, 6000 trials -> each appears ~3000 times.
    std::array<int, 6> cnt{};
    vlsparse::SplitMix64 r(77);
    for (int t = 0; t < 6000; ++t)
        for (auto x : sample_without_replacement(6, 3, r)) ++cnt[static_cast<std::size_t>(x)];
    for (int c : cnt) CHECK(std::abs(c - 3000) < 200);  // sd ~ 39

    CHECK_THROWS_WITH(sample_without_replacement(5, 6, 1), Contains("k = 6") && Contains("0 <= k <= n"));
    CHECK_THROWS_WITH(sample_without_replacement(5, -1, 1), Contains("k = -1"));
    CHECK_THROWS_AS(sample_without_replacement(-1, 0, 1), vlsparse::error);
}

// ---- top-k and count_for_mass -------------------------------------------------------------------

TEST_CASE("topk_indices: order, ties, edge cases", "[topk]") {
    using vlsparse::topk_indices;
    using V = std::vector<std::int64_t>;
    const std::vector<double> s{0.5, 2.0, 1.0, 2.0, -1.0, 1.0};
    CHECK(topk_indices(s, 1) == V{1});        // tie 2.0 at 1 and 3: the lower position wins
    CHECK(topk_indices(s, 2) == V{1, 3});
    CHECK(topk_indices(s, 3) == V{1, 2, 3});  // tie 1.0 at 2 and 5: 2 wins
    CHECK(topk_indices(s, 4) == V{1, 2, 3, 5});
    CHECK(topk_indices(s, 5) == V{0, 1, 2, 3, 5});
    CHECK(topk_indices(s, 6) == V{0, 1, 2, 3, 4, 5});
    CHECK(topk_indices(s, 0).empty());

    const std::vector<float> eq(9, 3.0f);
    CHECK(topk_indices(eq, 4) == V{0, 1, 2, 3});
    const std::vector<float> neg{-3.0f, -1.0f, -2.0f};
    CHECK(topk_indices(neg, 1) == V{1});
    CHECK(topk_indices(std::vector<float>{}, 0).empty());
    // -0.0 and +0.0 compare equal: a tie, so the lower position wins.
    CHECK(topk_indices(std::vector<float>{-0.0f, 0.0f}, 1) == V{0});

    // Against a brute-force reference on random data with many ties.
    vlsparse::SplitMix64 r(3);
    for (int trial = 0; trial < 200; ++trial) {
        const auto n = static_cast<std::int64_t>(1 + r.below(40));
        std::vector<int> v(static_cast<std::size_t>(n));
        for (auto& x : v) x = static_cast<int>(r.below(5));
        const auto k = static_cast<std::int64_t>(r.below(static_cast<std::uint64_t>(n + 1)));
        std::vector<std::int64_t> order(static_cast<std::size_t>(n));
        for (std::int64_t i = 0; i < n; ++i) order[static_cast<std::size_t>(i)] = i;
        std::sort(order.begin(), order.end(), [&](auto a, auto b) { return v[a] != v[b] ? v[a] > v[b] : a < b; });
        V expect(order.begin(), order.begin() + k);
        std::sort(expect.begin(), expect.end());
        REQUIRE(topk_indices(v, k) == expect);
    }

    const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
    CHECK_THROWS_WITH(topk_indices(std::vector<double>{1.0, nan, 2.0}, 1),
                      Contains("topk_indices") && Contains("score[1]") && Contains("finite"));
    CHECK_THROWS_WITH(topk_indices(std::vector<double>{inf, 1.0}, 1), Contains("score[0] = inf"));
    CHECK_THROWS_WITH(topk_indices(std::vector<double>{1.0, -inf}, 2), Contains("score[1]"));
    CHECK_THROWS_WITH(topk_indices(s, 7), Contains("k = 7") && Contains("0 <= k <= 6"));
    CHECK_THROWS_WITH(topk_indices(s, -1), Contains("k = -1"));
}

TEST_CASE("count_for_mass", "[topk]") {
    using vlsparse::count_for_mass;
    auto cfm = [](std::vector<double> s, double tau, double total) {
        return count_for_mass(std::span<const double>(s), tau, total);
    };
    // tau = 1 needs every nonzero score (zeros never help reach the mass).
    CHECK(cfm({0.5, 0.0, 0.25, 0.25, 0.0}, 1.0, 1.0) == 3);
    // One dominant score.
    CHECK(cfm({0.01, 10.0, 0.02}, 0.9, 10.03) == 1);
    // Ties: four equal scores, mass 4.
    CHECK(cfm({1, 1, 1, 1}, 0.5, 4.0) == 2);
    CHECK(cfm({1, 1, 1, 1}, 0.5000001, 4.0) == 3);
    CHECK(cfm({1, 1, 1, 1}, 0.25, 4.0) == 1);
    // Order of the input does not matter; the largest are taken first.
    CHECK(cfm({0.1, 0.2, 0.3, 0.4}, 0.7, 1.0) == 2);
    CHECK(cfm({0.4, 0.3, 0.2, 0.1}, 0.71, 1.0) == 3);
    // A total larger than the scores' sum: p saturates at the size, never more.
    CHECK(cfm({0.2, 0.2}, 1.0, 1.0) == 2);
    CHECK(cfm({}, 0.5, 1.0) == 0);
    // ZipVL-style: probe rows each sum to 1, total = H * |P|.
    CHECK(cfm({1.5, 0.25, 0.25, 2.0}, 0.875, 4.0) == 2);  // 2.0 + 1.5 = 3.5 = 0.875 * 4

    const std::vector<double> s{0.5, 0.5};
    const auto sp = std::span<const double>(s);
    CHECK_THROWS_WITH(count_for_mass(sp, 0.0, 1.0), Contains("tau = 0") && Contains("0 < tau <= 1"));
    CHECK_THROWS_WITH(count_for_mass(sp, 1.5, 1.0), Contains("tau = 1.5"));
    CHECK_THROWS_WITH(count_for_mass(sp, -0.1, 1.0), Contains("tau = -0.1"));
    CHECK_THROWS_AS(count_for_mass(sp, std::numeric_limits<double>::quiet_NaN(), 1.0), vlsparse::error);
    CHECK_THROWS_WITH(count_for_mass(sp, 0.5, 0.0), Contains("total = 0"));
    CHECK_THROWS_WITH(cfm({0.5, -0.1}, 0.5, 1.0), Contains("score[1] = -0.1") && Contains(">= 0"));
    CHECK_THROWS_WITH(cfm({0.5, std::numeric_limits<double>::quiet_NaN()}, 0.5, 1.0), Contains("score[1]"));
}

// ---- detail/check.hpp ---------------------------------------------------------------------------

TEST_CASE("detail::check_strides", "[check]") {
    using vlsparse::detail::check_strides;
    std::vector<float> buf(64);
    const vlsparse::View3<float> ok(buf.data(), {2, 4, 8});
    CHECK_NOTHROW(check_strides(ok, "f", "out", true));
    // Broadcast inputs (stride 0) are fine, but not as outputs.
    const vlsparse::View3<float> bcast(buf.data(), {4, 2, 8}, {0, 8, 1});
    CHECK_NOTHROW(check_strides(bcast, "f", "k", false));
    CHECK_THROWS_WITH(check_strides(bcast, "f", "out", true),
                      Contains("f: output out has overlapping strides") && Contains("dimension 0"));
    // Overlapping rows: row stride 4 < row length 8.
    const vlsparse::View2<float> overlap(buf.data(), {4, 8}, {4, 1});
    CHECK_THROWS_WITH(check_strides(overlap, "g", "o", true), Contains("overlapping strides"));
    CHECK_NOTHROW(check_strides(overlap, "g", "o", false));
    // A head_major output is fine.
    CHECK_NOTHROW(check_strides(vlsparse::head_major(buf.data(), 4, 2, 8), "f", "out", true));
    const vlsparse::View2<float> neg(buf.data() + 32, {2, 4}, {-4, 1});
    CHECK_THROWS_WITH(check_strides(neg, "f", "q", false), Contains("q has negative stride -4 in dimension 0"));
    const vlsparse::View2<float> null(nullptr, {2, 4});
    CHECK_THROWS_WITH(check_strides(null, "f", "q", false), Contains("q has a null data pointer"));
    CHECK_NOTHROW(check_strides(vlsparse::View2<float>(nullptr, {0, 4}), "f", "q", true));
}

TEST_CASE("detail::check_no_alias", "[check]") {
    using vlsparse::detail::check_no_alias;
    std::vector<float> buf(64);
    const vlsparse::View2<float> a(buf.data(), {4, 8});        // [0, 32)
    const vlsparse::View2<float> b(buf.data() + 32, {4, 8});   // [32, 64)
    const vlsparse::View2<float> c(buf.data() + 31, {1, 2});   // [31, 33)
    CHECK_NOTHROW(check_no_alias(a, b, "f", "out", "q"));
    CHECK_THROWS_WITH(check_no_alias(a, c, "f", "out", "q"),
                      Contains("f: output out aliases input q") && Contains("separate buffers"));
    CHECK_THROWS_WITH(check_no_alias(b, c, "f", "out", "k"), Contains("aliases input k"));
    CHECK_THROWS_AS(check_no_alias(a, a, "f", "out", "q"), vlsparse::error);
    // An empty view aliases nothing.
    CHECK_NOTHROW(check_no_alias(vlsparse::View2<float>(buf.data(), {0, 8}), a, "f", "out", "q"));
}

TEST_CASE("detail::check_finite and check_sorted_unique", "[check]") {
    std::vector<float> buf(2 * 3 * 4, 1.0f);
    const vlsparse::View3<const float> v(buf.data(), {2, 3, 4});
    CHECK_NOTHROW(vlsparse::detail::check_finite(v, "f", "k"));
    buf[1 * 12 + 0 * 4 + 2] = std::numeric_limits<float>::quiet_NaN();
    CHECK_THROWS_WITH(vlsparse::detail::check_finite(v, "f", "k"), Contains("f: k[1, 0, 2] = nan"));
    buf[1 * 12 + 0 * 4 + 2] = 1.0f;
    buf[5] = -std::numeric_limits<float>::infinity();
    CHECK_THROWS_WITH(vlsparse::detail::check_finite(v, "f", "k"), Contains("k[0, 1, 1] = -inf"));
    // Strided: the non-finite value outside the view is not seen.
    const vlsparse::View3<const float> every_other(buf.data(), {2, 3, 2}, {12, 4, 2});
    CHECK_NOTHROW(vlsparse::detail::check_finite(every_other, "f", "k"));
    std::vector<half> hb(4, half(1.0f));
    hb[3] = half::from_bits(0x7C00);  // +inf
    CHECK_THROWS_WITH(vlsparse::detail::check_finite(vlsparse::View3<const half>(hb.data(), {1, 1, 4}), "f", "q"),
                      Contains("q[0, 0, 3] = inf"));

    using vlsparse::detail::check_sorted_unique;
    const std::vector<std::int64_t> good{0, 3, 9};
    CHECK_NOTHROW(check_sorted_unique(good, 10, "f", "rows"));
    CHECK_THROWS_WITH(check_sorted_unique(good, 9, "f", "rows"), Contains("rows[2] = 9") && Contains("[0, 9)"));
    const std::vector<std::int64_t> dup{0, 3, 3};
    CHECK_THROWS_WITH(check_sorted_unique(dup, 10, "f", "rows"), Contains("not sorted ascending without duplicates"));
    const std::vector<std::int64_t> negative{-1};
    CHECK_THROWS_WITH(check_sorted_unique(negative, 10, "f", "rows"), Contains("rows[0] = -1"));
}

TEST_CASE("detail::check_sorted_unique reads no element before the first (issue 21)", "[check][issue21]") {
    // The order check's message used to index idx[i - 1] at i == 0 too (message arguments are
    // evaluated whether or not the check fails): a read before the buffer, on every zipvl_select, that
    // -D_GLIBCXX_ASSERTIONS (the sanitizer build) aborts on. Runs of length 1 and the first element of
    // a sub-span; the messages themselves are unchanged.
    using vlsparse::detail::check_sorted_unique;
    const std::vector<std::int64_t> one{5};
    CHECK_NOTHROW(check_sorted_unique(one, 10, "f", "rows"));
    const std::vector<std::int64_t> three{9, 1, 2};
    CHECK_NOTHROW(check_sorted_unique(std::span<const std::int64_t>(three).subspan(1), 10, "f", "rows"));
    CHECK_THROWS_WITH(check_sorted_unique(three, 10, "f", "rows"),
                      "f: rows is not sorted ascending without duplicates (rows[0] = 9, rows[1] = 1)");
    CHECK_THROWS_WITH(check_sorted_unique(three, 9, "f", "rows"), "f: rows[0] = 9, expected an index in [0, 9)");
}

TEST_CASE("vlsparse::error carries the function name", "[error]") {
    try {
        vlsparse::detail::require(false, "my_fn", "x = ", 3, ", expected x < 2");
        FAIL("require(false) did not throw");
    } catch (const vlsparse::error& e) {
        CHECK(std::string(e.what()) == "my_fn: x = 3, expected x < 2");
        CHECK(e.function() == "my_fn");
    }
    CHECK_NOTHROW(vlsparse::detail::require(true, "my_fn", "unused"));
}
