// vlsparse/core/config.hpp -- version and portability macros shared by every header.
// Include: <vlsparse/vlsparse.hpp> (or this header alone; it has no dependencies).
#pragma once

#define VLSPARSE_VERSION_MAJOR 0
#define VLSPARSE_VERSION_MINOR 1
#define VLSPARSE_VERSION_PATCH 0
#define VLSPARSE_VERSION_STRING "0.1.0"

// Functions usable from host and device code (the vocabulary headers also compile under nvcc).
#if defined(__CUDACC__) || defined(__HIPCC__)
#define VLSPARSE_HD __host__ __device__
#else
#define VLSPARSE_HD
#endif

// GCC 12's AVX-512 intrinsics (avx512fintrin.h: _mm512_undefined_ps() and friends initialise a
// variable from itself) are reported as "may be used uninitialized" / "is used uninitialized" once
// inlined into optimised code (GCC bug 105593, fixed in GCC 13): hundreds of warnings in a consumer's
// -O2 -Wall build, from xsimd's, Eigen's and our own AVX-512 code alike. The headers that hold SIMD
// code (and include xsimd and Eigen) put themselves between these two macros, which silence exactly
// these two warnings for GCC < 13 compiling for AVX-512, and nothing anywhere else; the consumer's own
// code keeps its diagnostics. (Eigen and xsimd included by the consumer before any vlsparse header lie
// outside the region; GCC 12 then reports their AVX-512 code however it is reached.)
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__) && __GNUC__ < 13 && defined(__AVX512F__)
#define VLSPARSE_GCC12_AVX512_DIAGNOSTICS_BEGIN                                              \
    _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"") \
        _Pragma("GCC diagnostic ignored \"-Wuninitialized\"")
#define VLSPARSE_GCC12_AVX512_DIAGNOSTICS_END _Pragma("GCC diagnostic pop")
#else
#define VLSPARSE_GCC12_AVX512_DIAGNOSTICS_BEGIN
#define VLSPARSE_GCC12_AVX512_DIAGNOSTICS_END
#endif
