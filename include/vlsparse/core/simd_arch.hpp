// vlsparse/core/simd_arch.hpp -- the instruction sets of the CPU fast path (namespace vlsparse::simd).
//
//   simd::native_arch   the best instruction set the consumer's flags allow (xsimd::default_arch), or
//                       scalar_arch when the consumer defines VLSPARSE_FORCE_SCALAR (or xsimd knows no
//                       instruction set for the target)
//   simd::scalar_arch   the always-compiled scalar kernels
// Every SIMD attention function takes one as its trailing template argument (default native_arch):
//   simd::dense_attention<bfloat16, bfloat16, float, simd::scalar_arch>(q, k, v, out);
// runs the scalar kernels, e.g. to compare an instruction set against them. Arch::name() names it.
// Needs xsimd. Include: <vlsparse/core/simd_arch.hpp> (every SIMD header includes it).
#pragma once

#include <cstddef>
#include <type_traits>

#include <xsimd/xsimd.hpp>

namespace vlsparse {
namespace detail {

// The always-compiled scalar "instruction set".
struct scalar_arch {
    static constexpr const char* name() noexcept { return "scalar"; }
    static constexpr std::size_t width = 1;
};

#if defined(VLSPARSE_FORCE_SCALAR)
using native_arch = scalar_arch;
#else
using native_arch =
    std::conditional_t<std::is_same_v<xsimd::default_arch, xsimd::unavailable>, scalar_arch, xsimd::default_arch>;
#endif

}  // namespace detail

namespace simd {
using native_arch = ::vlsparse::detail::native_arch;
using scalar_arch = ::vlsparse::detail::scalar_arch;
}  // namespace simd
}  // namespace vlsparse
