// bench/cuda_bench_util.cuh -- what the CUDA benchmarks share: CUDA status checks that end the program
// (a benchmark has no caller to report to), the comma-separated size lists of their command lines,
// and the timing method of every GPU figure in docs/cuda.md: a write that evicts the L2 before each
// call, CUDA events around it, the median of `reps` calls after `warmup` calls.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace vlsparse::bench {

[[noreturn]] inline void cuda_die(const char* what, cudaError_t e) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
}
#define VLSPARSE_BENCH_CK(x)                                \
    do {                                                    \
        cudaError_t e_ = (x);                               \
        if (e_ != cudaSuccess) ::vlsparse::bench::cuda_die(#x, e_); \
    } while (0)

// "8192,16384" -> {8192, 16384}; anything else ends the program with a message (exit status 2).
inline std::vector<std::int64_t> parse_size_list(const char* s) {
    std::vector<std::int64_t> v;
    for (const char* p = s; *p;) {
        char* end = nullptr;
        const long long x = std::strtoll(p, &end, 10);
        if (end == p || x <= 0 || (*end != ',' && *end != '\0')) {
            std::fprintf(stderr, "expected a comma-separated list of positive integers, got '%s'\n", s);
            std::exit(2);
        }
        v.push_back(x);
        p = *end == ',' ? end + 1 : end;
    }
    return v;
}

// Does nothing: a benchmark's reference for the cost of a launch on its own.
template <int Unused = 0>
__global__ void bench_empty_kernel() {}

// Reads p[0, n) (a dependent xor the compiler cannot drop): empties the L2 of dirty lines.
template <int Unused = 0>
__global__ void bench_read_flush(const uint4* p, std::size_t n, unsigned* sink) {
    unsigned acc = 0;
    for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
        const uint4 x = __ldcs(p + i);
        acc ^= x.x ^ x.y ^ x.z ^ x.w;
    }
    if (acc == 0x9e3779b9u) *sink = acc;
}

// Median time in microseconds of call() (on the default stream), L2 evicted before each call: by a
// write of the flush buffer (default; the figures of the selection and prefill tables), or with
// read_flush by a read of it, which leaves clean lines (a write leaves up to 50 MiB of dirty lines
// whose write-back the timed call pays: 5-8 us, which matters for calls of tens of microseconds).
class EventTimer {
public:
    explicit EventTimer(bool read_flush = false) : read_(read_flush) {
        VLSPARSE_BENCH_CK(cudaMalloc(&flush_, kFlushBytes));
        VLSPARSE_BENCH_CK(cudaMemset(flush_, 0, kFlushBytes));
        VLSPARSE_BENCH_CK(cudaEventCreate(&e0_));
        VLSPARSE_BENCH_CK(cudaEventCreate(&e1_));
    }
    EventTimer(const EventTimer&) = delete;
    EventTimer& operator=(const EventTimer&) = delete;
    ~EventTimer() {
        cudaEventDestroy(e0_);
        cudaEventDestroy(e1_);
        cudaFree(flush_);
    }
    template <class F>
    double median_us(F&& call, int warmup, int reps) {
        return median_us(call, warmup, reps, [] {});
    }
    // The same with `setup` run before each flush, untimed (e.g. restoring what the call changes in place).
    template <class F, class Setup>
    double median_us(F&& call, int warmup, int reps, Setup&& setup) {
        std::vector<float> t;
        for (int r = 0; r < warmup + reps; ++r) {
            setup();
            if (read_) {
                bench_read_flush<><<<1056, 512>>>(static_cast<const uint4*>(flush_), kFlushBytes / 16, static_cast<unsigned*>(flush_));
                VLSPARSE_BENCH_CK(cudaGetLastError());
            } else {
                VLSPARSE_BENCH_CK(cudaMemsetAsync(flush_, r & 0xff, kFlushBytes));
            }
            VLSPARSE_BENCH_CK(cudaEventRecord(e0_));
            call();
            VLSPARSE_BENCH_CK(cudaEventRecord(e1_));
            VLSPARSE_BENCH_CK(cudaEventSynchronize(e1_));
            float ms = 0.0f;
            VLSPARSE_BENCH_CK(cudaEventElapsedTime(&ms, e0_, e1_));
            if (r >= warmup) t.push_back(ms * 1000.0f);
        }
        VLSPARSE_BENCH_CK(cudaGetLastError());
        std::sort(t.begin(), t.end());
        return static_cast<double>(t[t.size() / 2]);
    }

private:
    bool read_ = false;
    static constexpr std::size_t kFlushBytes = std::size_t{256} << 20;  // 256 MiB: well past the L2
    void* flush_ = nullptr;
    cudaEvent_t e0_{}, e1_{};
};

}  // namespace vlsparse::bench
