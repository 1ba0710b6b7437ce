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
