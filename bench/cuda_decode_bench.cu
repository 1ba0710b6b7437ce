// CUDA batched decode attention (vlsparse/cuda/decode.cuh): dense decode and decode over row lists,
// contiguous and paged caches, B sequences per launch -- the GPU counterpart of avl_bench, and the
// vlsparse half of the comparison with PyTorch (bench/torch_decode_bench.py runs the same grid;
// bench/cuda_decode_report.py joins the two CSV files; bench/run_cuda.sh runs all three).
//
// Per (dtype, B, n): a cache of B sequences of n rows, H = 32 query heads, H_kv = 8, d = 128 (GQA 4),
// filled with random values on the device; dense decode, decode over lists of 10 / 30 / 50% of the
// rows (one list per sequence shared by the KV heads, built as avl_bench builds it: the last 10%
// contiguous, the rest scattered), each in a contiguous cache [B, H_kv, n, d] (head-major, as
// PyTorch's SDPA holds K / V), and dense / 30% also paged (P = 16, NHD pages drawn from a shuffled
// pool) and token-major contiguous ([B, n, H_kv, d], "contiguous-nhd"). Then a sweep of GQA ratios and head dims at B = 1, and q_len 4.
// Timing: the plan is made once (it serves every layer of a step) and not timed; each timed call is
// one batched_decode_attention with the checks off, between CUDA events, after a 512 MiB read that
// evicts the 50 MiB L2 (--flush write: a memset instead); median of --reps calls after 3 warm-ups. The device-to-device copy
// bandwidth (bytes read + written) of a 1 GiB buffer is measured in the same run. Bytes counted:
// the K and V rows read, the list entries, q and the output.
// Build: meson -Dcuda=enabled (target cuda_decode_bench). Run: ./cuda_decode_bench [--out FILE.csv]
// [--reps R] [--quick].
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include <vlsparse/core/rng.hpp>
#include <vlsparse/cuda/decode.cuh>
#include <vlsparse/kv/kv_batch.hpp>

#include "bench_util.hpp"
#include "cuda_bench_util.cuh"

using namespace vlsparse;

namespace {

void ok(cudaError_t e, const char* what) {
    if (e != cudaSuccess) {
        std::fprintf(stderr, "cuda_decode_bench: %s: %s\n", what, cudaGetErrorString(e));
        std::exit(1);
    }
}

// How the L2 is emptied before each timed call: a 512 MiB read (the default since 2026-11-25: clean
// lines) or a 512 MiB memset (--flush write; the figures of docs/cuda.md before that date): a write
// leaves up to 50 MiB of dirty lines whose write-back the next kernel pays, 5-8 us of a B = 1 decode
// step's time, the same for every implementation measured after it.
bool g_flush_read = true;

struct Timer {
    void* flush = nullptr;
    std::size_t flush_bytes = 512ull << 20;
    cudaEvent_t a{}, b{};
    Timer() {
        ok(cudaMalloc(&flush, flush_bytes), "cudaMalloc flush");
        ok(cudaMemset(flush, 0, flush_bytes), "cudaMemset flush");
        ok(cudaEventCreate(&a), "event");
        ok(cudaEventCreate(&b), "event");
    }
    ~Timer() {
        cudaFree(flush);
        cudaEventDestroy(a);
        cudaEventDestroy(b);
    }
    template <class F>
    double median_ms(int reps, F&& f) {
        std::vector<float> t;
        for (int r = 0; r < reps + 3; ++r) {
            if (g_flush_read) {
                bench::bench_read_flush<><<<1056, 512>>>(static_cast<const uint4*>(flush), flush_bytes / 16,
                                          static_cast<unsigned*>(flush));
                ok(cudaGetLastError(), "read_flush");
            } else {
                ok(cudaMemsetAsync(flush, r & 0xff, flush_bytes), "flush");
            }
            ok(cudaEventRecord(a), "record");
            f();
            ok(cudaEventRecord(b), "record");
            ok(cudaEventSynchronize(b), "sync");
            float ms = 0.0f;
            ok(cudaEventElapsedTime(&ms, a, b), "elapsed");
            if (r >= 3) t.push_back(ms);
        }
        std::sort(t.begin(), t.end());
        return t[t.size() / 2];
    }
};

double copy_bandwidth(Timer& tm) {
    const std::size_t bytes = 1ull << 30;
    void *src = nullptr, *dst = nullptr;
    ok(cudaMalloc(&src, bytes), "cudaMalloc");
    ok(cudaMalloc(&dst, bytes), "cudaMalloc");
    ok(cudaMemset(src, 1, bytes), "memset");
    const double ms = tm.median_ms(9, [&] { ok(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice), "copy"); });
    cudaFree(src);
    cudaFree(dst);
    return 2.0 * static_cast<double>(bytes) / (ms * 1e-3);  // bytes read + written per second
}

// Random values in [-1, 1) from a hash of the index (no host round trip for gigabytes of cache).
template <class T>
__global__ void fill_random(T* p, std::size_t n, std::uint64_t seed) {
    for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
        std::uint64_t z = (i + seed) * 0x9e3779b97f4a7c15ull;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        const float x = static_cast<float>(z >> 40) * (2.0f / 16777216.0f) - 1.0f;
        p[i] = T(x);
    }
}
template <class T>
void fill(T* p, std::size_t n, std::uint64_t seed) {
    fill_random<<<1024, 256>>>(p, n, seed);
    ok(cudaGetLastError(), "fill_random");
}

const char* short_name(DType t) { return t == DType::f32 ? "fp32" : t == DType::f16 ? "fp16" : "bf16"; }

struct Csv {
    FILE* f = nullptr;
    explicit Csv(const std::string& path) {
        if (!path.empty()) {
            f = std::fopen(path.c_str(), "w");
            if (!f) {
                std::fprintf(stderr, "cuda_decode_bench: cannot write %s\n", path.c_str());
                std::exit(1);
            }
            std::fprintf(f, "impl,backend,dtype,B,H,H_kv,d,n,frac,P,time_us,bytes,GBps,note\n");
        }
    }
    ~Csv() {
        if (f) std::fclose(f);
    }
    void row(const char* backend, const char* dtype, int B, int H, int Hkv, int d, long long n, double frac, int P,
             double ms, double bytes, const std::string& note) {
        const double gbps = bytes / (ms * 1e-3) / 1e9;
        if (f)
            std::fprintf(f, "vlsparse,%s,%s,%d,%d,%d,%d,%lld,%g,%s,%.3f,%.0f,%.1f,%s\n", backend, dtype, B, H, Hkv, d, n,
                         frac, P > 0 ? std::to_string(P).c_str() : "", ms * 1e3, bytes, gbps, note.c_str());
    }
};

cuda::DecodeKernel g_kernel = cuda::DecodeKernel::automatic;

struct Shape {
    int B, H, Hkv, d, q_len;
    long long n;
};

// One cache (contiguous or paged) of B sequences x n rows; times dense decode and the listed fractions.
template <class T>
void run_case(const Shape& s, int P, const std::vector<double>& fracs, bool with_dense, int reps, double bw, Timer& tm,
              Csv& csv, SplitMix64& rng, const std::string& note = "") {
    const std::int64_t rows_per_seq = s.n;
    const std::int64_t row_elems = static_cast<std::int64_t>(s.Hkv) * s.d;
    std::vector<std::int32_t> lens(static_cast<std::size_t>(s.B), static_cast<std::int32_t>(s.n));
    std::vector<std::int32_t> table;
    std::int64_t n_pages = 0, table_stride = 0;
    std::size_t elems = 0;
    if (P <= 0) {
        elems = static_cast<std::size_t>(s.B) * static_cast<std::size_t>(rows_per_seq * row_elems);
    } else {
        table_stride = (rows_per_seq + P - 1) / P;
        n_pages = table_stride * s.B;
        elems = static_cast<std::size_t>(n_pages * P * row_elems);
        std::vector<std::int32_t> pool(static_cast<std::size_t>(n_pages));
        std::iota(pool.begin(), pool.end(), 0);
        for (std::int64_t i = n_pages - 1; i > 0; --i)
            std::swap(pool[static_cast<std::size_t>(i)], pool[rng.below(static_cast<std::uint64_t>(i + 1))]);
        table = pool;
    }
    cuda::DeviceArray<T> k(elems), v(elems);
    fill(k.data(), elems, 1);
    fill(v.data(), elems, 2);
    cuda::DeviceArray<std::int32_t> lens_d(lens), table_d(table);
    const std::int64_t total_q = static_cast<std::int64_t>(s.B) * s.q_len;
    const std::int64_t H = s.H, d = s.d;
    cuda::DeviceArray<T> q(static_cast<std::size_t>(total_q * H * d)), out(q.size());
    fill(q.data(), q.size(), 3);
    std::vector<std::int32_t> q_indptr;
    if (s.q_len > 1)
        for (int b = 0; b <= s.B; ++b) q_indptr.push_back(b * s.q_len);
    KvBatchView<const T> cv;
    if (P > 0)
        cv = paged_kv_batch_nhd<T>(k.data(), v.data(), s.B, n_pages, P, s.Hkv, s.d, table_d.data(), table_stride,
                                   lens_d.data());
    else if (P == -1)  // token-major [B, n, H_kv, d]
        cv = contiguous_kv_batch<T>(k.data(), v.data(), s.B, rows_per_seq, s.Hkv, s.d, lens_d.data());
    else {  // head-major [B, H_kv, n, d]: one HND "page" per sequence
        cv = paged_kv_batch_hnd<T>(k.data(), v.data(), s.B, 0, rows_per_seq, s.Hkv, s.d, nullptr, 0, lens_d.data());
        cv.page_stride = static_cast<std::int64_t>(s.Hkv) * rows_per_seq * s.d;
    }
    const View3<const T> qv(q.data(), {total_q, H, d});
    const View3<T> ov(out.data(), {total_q, H, d});
    cuda::DecodeOptions opt;
    opt.check_inputs = false;
    opt.check_finite = false;
    opt.kernel = g_kernel;
    const char* dt = short_name(dtype_of<T>());
    const std::string backend = (P == 0 ? std::string("contiguous") : P == -1 ? std::string("contiguous-nhd")
                                                                              : "paged" + std::to_string(P)) +
                                (g_kernel == cuda::DecodeKernel::cuda_cores ? "-cudacores" : "");
    const double io_bytes = 2.0 * static_cast<double>(total_q * H * d) * sizeof(T);
    char label[160];
    std::snprintf(label, sizeof(label), "%-4s B=%-2d n=%-6lld G=%d d=%-3d q=%d %-10s", dt, s.B, s.n, s.H / s.Hkv, s.d,
                  s.q_len, backend.c_str());
    double t_dense = 0.0;
    if (with_dense) {
        cuda::DecodePlan plan;
        plan.plan({lens, q_indptr, {}, 1}, H, s.Hkv, d, false, nullptr, dtype_of<T>());
        // One checked call first: the timed configuration is a valid one.
        cuda::DecodeOptions chk;
        chk.kernel = g_kernel;
        cuda::batched_decode_attention(plan, qv, cv, BatchRowLists{}, ov, chk);
        t_dense = tm.median_ms(reps, [&] { cuda::batched_decode_attention(plan, qv, cv, BatchRowLists{}, ov, opt); });
        const double bytes = static_cast<double>(s.B) * static_cast<double>(rows_per_seq * row_elems) * 2.0 * sizeof(T) + io_bytes;
        csv.row(backend.c_str(), dt, s.B, s.H, s.Hkv, s.d, s.n, 1.0, P, t_dense, bytes, note);
        std::printf("%s dense     %9.1f us  %6.0f GB/s  %3.0f%% of copy bw  (items %lld, chunk %lld)\n", label,
                    t_dense * 1e3, bytes / (t_dense * 1e-3) / 1e9, 100.0 * bytes / (t_dense * 1e-3) / bw,
                    static_cast<long long>(plan.n_items()), static_cast<long long>(plan.chunk_rows()));
    }
    for (double frac : fracs) {
        std::vector<std::int32_t> indptr{0}, idx;
        for (int b = 0; b < s.B; ++b) {
            for (auto r : bench::avl_shaped_rows(s.n, frac, rng)) idx.push_back(static_cast<std::int32_t>(r));
            indptr.push_back(static_cast<std::int32_t>(idx.size()));
        }
        cuda::DeviceArray<std::int32_t> ind_d(indptr), idx_d(idx);
        const BatchRowLists lists{ind_d.data(), idx_d.data(), 1};
        cuda::DecodePlan plan;
        plan.plan({lens, q_indptr, indptr, 1}, H, s.Hkv, d, false, nullptr, dtype_of<T>());
        cuda::DecodeOptions chk;
        chk.kernel = g_kernel;
        cuda::batched_decode_attention(plan, qv, cv, lists, ov, chk);
        const double t = tm.median_ms(reps, [&] { cuda::batched_decode_attention(plan, qv, cv, lists, ov, opt); });
        const double listed = static_cast<double>(idx.size());
        const double bytes = listed * static_cast<double>(row_elems) * 2.0 * sizeof(T) + listed * 4.0 + io_bytes;
        csv.row(backend.c_str(), dt, s.B, s.H, s.Hkv, s.d, s.n, frac, P, t, bytes, note);
        std::printf("%s list %2.0f%%  %9.1f us  %6.0f GB/s  %3.0f%% of copy bw%s\n", label, frac * 100, t * 1e3,
                    bytes / (t * 1e-3) / 1e9, 100.0 * bytes / (t * 1e-3) / bw,
                    with_dense ? ("  = " + std::to_string(static_cast<int>(100.0 * t / t_dense + 0.5)) + "% of dense").c_str() : "");
    }
}

template <class T>
void run_dtype(const std::vector<int>& batches, const std::vector<long long>& ns, const std::vector<double>& fracs,
               int reps, double bw, Timer& tm, Csv& csv, SplitMix64& rng, bool paged) {
    for (int B : batches)
        for (long long n : ns) {
            const double bytes = static_cast<double>(B) * static_cast<double>(n) * 8 * 128 * 2 * sizeof(T);
            if (bytes > 36e9) continue;  // two such caches must fit beside the flush buffer
            const Shape s{B, 32, 8, 128, 1, n};
            run_case<T>(s, 0, fracs, true, reps, bw, tm, csv, rng);
            if (paged) {
                run_case<T>(s, 16, {0.3}, true, reps, bw, tm, csv, rng);
                run_case<T>(s, -1, {0.3}, true, reps, bw, tm, csv, rng);
            }
        }
}

std::vector<long long> parse_ll(const char* s) {
    std::vector<long long> r;
    for (std::string a = s; !a.empty();) {
        const auto c = a.find(',');
        r.push_back(std::atoll(a.substr(0, c).c_str()));
        a = c == std::string::npos ? "" : a.substr(c + 1);
    }
    return r;
}

}  // namespace

int main(int argc, char** argv) {
    std::string out;
    int reps = 31;
    bool quick = false, shapes = true;
    std::string dtypes = "bf16,fp16,fp32";
    std::vector<long long> ns{4096, 16384, 65536, 131072}, bs{1, 8, 32};
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--out" && i + 1 < argc) out = argv[++i];
        else if (a == "--reps" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
        else if (a == "--n" && i + 1 < argc) ns = parse_ll(argv[++i]);
        else if (a == "--batch" && i + 1 < argc) bs = parse_ll(argv[++i]);
        else if (a == "--quick") quick = true;
        else if (a == "--bf16-only") dtypes = "bf16";
        else if (a == "--dtypes" && i + 1 < argc) dtypes = argv[++i];
        else if (a == "--no-shapes") shapes = false;
        else if (a == "--flush" && i + 1 < argc) {
            const std::string f = argv[++i];
            if (f != "read" && f != "write") {
                std::fprintf(stderr, "cuda_decode_bench: --flush takes read or write, got '%s'\n", f.c_str());
                return 2;
            }
            g_flush_read = f == "read";
        }
        else if (a == "--kernel" && i + 1 < argc) {
            const std::string k = argv[++i];
            g_kernel = k == "cuda_cores" ? cuda::DecodeKernel::cuda_cores
                       : k == "tensor_cores" ? cuda::DecodeKernel::tensor_cores : cuda::DecodeKernel::automatic;
        }
        else {
            std::printf("usage: cuda_decode_bench [--out FILE.csv] [--reps 31] [--n 4096,16384,...] [--batch 1,8,32] "
                        "[--quick] [--kernel automatic|cuda_cores|tensor_cores] [--flush read|write] [--dtypes bf16,fp16,fp32] "
                        "[--bf16-only] [--no-shapes]\n");
            return a == "--help" ? 0 : 2;
        }
    }
    // The element types asked for, checked once; an unknown name is an error, not a silent skip.
    std::vector<std::string> wanted;
    for (std::string rest = dtypes; !rest.empty();) {
        const auto c = rest.find(',');
        wanted.push_back(rest.substr(0, c));
        rest = c == std::string::npos ? "" : rest.substr(c + 1);
        if (wanted.back() != "bf16" && wanted.back() != "fp16" && wanted.back() != "fp32") {
            std::fprintf(stderr, "cuda_decode_bench: --dtypes takes bf16, fp16 and fp32 separated by commas, got '%s'\n",
                         wanted.back().c_str());
            return 2;
        }
    }
    cudaDeviceProp prop{};
    ok(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    Timer tm;
    const double bw = copy_bandwidth(tm);
    std::printf("cuda_decode_bench: %s, %d SMs, L2 %d MiB; device copy bandwidth %.0f GB/s (read + write); L2 "
                "flushed by a 512 MiB %s\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20, bw / 1e9,
                g_flush_read ? "read" : "write");
    Csv csv(out);
    if (csv.f) std::fprintf(csv.f, "copy,device,,,,,,1073741824,,,%.3f,%.0f,%.1f,%s\n", 2.0 * (1ull << 30) / bw * 1e6,
                            2.0 * (1ull << 30), bw / 1e9, prop.name);
    SplitMix64 rng(42);
    std::vector<int> batches(bs.begin(), bs.end());
    if (quick) {
        ns = {16384, 65536};
        batches = {1, 32};
    }
    const auto wants = [&](const char* t) { return std::find(wanted.begin(), wanted.end(), t) != wanted.end(); };
    // bf16 on the whole grid with 10 / 30 / 50% lists and the paged layouts; fp16 (the same tensor-core
    // kernel) on the whole grid at 30%; fp32 (the CUDA-core kernel) on a smaller one.
    if (wants("bf16")) run_dtype<bfloat16>(batches, ns, {0.1, 0.3, 0.5}, reps, bw, tm, csv, rng, true);
    if (!quick && wants("fp16")) run_dtype<vlsparse::half>(batches, ns, {0.3}, reps, bw, tm, csv, rng, false);
    if (!quick && wants("fp32")) run_dtype<float>({1, 32}, {16384, 65536}, {0.3}, reps, bw, tm, csv, rng, false);
    // GQA ratios and head dims (bf16, B = 1, n = 32768, H_kv = 8), and q_len 4 (speculative decode).
    if (!shapes) return 0;
    for (int d : {64, 128, 256})
        for (int G : {1, 2, 4, 8}) {
            if (quick && d != 128) continue;
            run_case<bfloat16>({1, 8 * G, 8, d, 1, 32768}, 0, {0.3}, true, reps, bw, tm, csv, rng, "shape-sweep");
        }
    run_case<bfloat16>({8, 32, 8, 128, 4, 16384}, 16, {0.3}, true, reps, bw, tm, csv, rng, "q_len=4");
    return 0;
}
