// For tests/cuda/main_cuda.cpp: whether a CUDA device can be used, asked of the runtime (a small
// translation unit of its own, so that Catch2's main stays with g++).
#include <cuda_runtime.h>

#include <string>

std::string vlsparse_cuda_device_unavailable() {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess)
        return std::string("cudaGetDeviceCount: ") + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
    if (n == 0) return "cudaGetDeviceCount reports no device";
    return {};
}
