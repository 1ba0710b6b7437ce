// CUDA batched decode attention (vlsparse/cuda/decode.cuh) against reference::batched_decode_attention
// on identical inputs: fresh seeded caches of fp32 / fp16 / bf16, contiguous and paged (P = 1, 16, 64;
// NHD and HND pages from a shuffled pool), dense and listed (shared and per KV head; lists of one row,
// of every row, and of random subsets whose lengths are not multiples of the tile), ragged batches,
// q_len 1..8 (causal among the new tokens), both kernels for bf16 and fp16 (tensor cores and CUDA
// cores; q of the cache's type and of fp32; fp16 also with q far beyond its range and near zero), GQA ratios 1..8 (3, 5, 6: padded query blocks), head dims
// 40 / 64 / 96 / 128 / 256 (40, 96: padded tiles; 40 with fp16 also the element-by-element copy
// path), strided q, fp32 / bf16 outputs, the probabilities output, and every error. Outputs are
// poisoned (0xff bytes: NaN) before each launch, so an element the kernel does not write fails.
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include <vlsparse/core/rng.hpp>

#include "../test_core.hpp"
#include <vlsparse/cuda/decode.cuh>
#include <vlsparse/kv/kv_batch.hpp>
#include <vlsparse/reference/batched_decode.hpp>

using namespace vlsparse;
using Catch::Matchers::Contains;

namespace {

std::uint64_t base_seed() { return vt::seed_or(20261123u); }

// One decode step's inputs on the host, and the same on the device.
struct Case {
    std::int32_t B = 1, Hkv = 1, G = 1, d = 64;
    std::vector<std::int32_t> lens, qlens;
    std::int64_t P = 0;       // page size; 0: contiguous
    bool hnd = false;         // HND pages
    int lists = 0;            // 0: dense, 1: shared, 2: per KV head
    double frac = 0.3;        // listed fraction (random subsets; the new tokens always listed)
    bool one_row = false;     // lists of a single row (the newest)
    bool strided_q = false;   // q stored [H, total_q, d]
    double q_scale = 1.0;     // q drawn from [-2, 2) times this
    std::uint64_t seed = 1;
};

template <class TC>
struct HostBatch {
    std::vector<TC> k, v;
    std::vector<std::int32_t> table, seq_lens, q_indptr, list_indptr, indices;
    std::vector<float> q;  // [total_q, H, d] logical
    KvBatchView<TC> view;  // over the host vectors
    std::int64_t total_q = 0, cap = 0, n_pages = 0, table_stride = 0;
};

template <class TC>
HostBatch<TC> make_batch(const Case& c) {
    HostBatch<TC> h;
    SplitMix64 rng(c.seed);
    const std::int64_t d = c.d, Hkv = c.Hkv, H = Hkv * c.G;
    h.seq_lens = c.lens;
    h.cap = *std::max_element(c.lens.begin(), c.lens.end()) + 3;
    if (c.P == 0) {
        h.k.resize(static_cast<std::size_t>(c.B * h.cap * Hkv * d));
        h.v.resize(h.k.size());
        h.view = contiguous_kv_batch<TC>(h.k.data(), h.v.data(), c.B, h.cap, c.Hkv, c.d, h.seq_lens.data());
    } else {
        h.table_stride = (h.cap + c.P - 1) / c.P;
        h.n_pages = h.table_stride * c.B + 5;  // spare pages, never used
        h.k.resize(static_cast<std::size_t>(h.n_pages * c.P * Hkv * d));
        h.v.resize(h.k.size());
        std::vector<std::int32_t> pool(static_cast<std::size_t>(h.n_pages));
        std::iota(pool.begin(), pool.end(), 0);
        for (std::int64_t i = h.n_pages - 1; i > 0; --i)
            std::swap(pool[static_cast<std::size_t>(i)], pool[rng.below(static_cast<std::uint64_t>(i + 1))]);
        h.table.assign(static_cast<std::size_t>(c.B * h.table_stride), -1);
        std::size_t next = 0;
        for (std::int64_t b = 0; b < c.B; ++b)
            for (std::int64_t p = 0; p < (c.lens[static_cast<std::size_t>(b)] + c.P - 1) / c.P; ++p)
                h.table[static_cast<std::size_t>(b * h.table_stride + p)] = pool[next++];
        h.view = c.hnd ? paged_kv_batch_hnd<TC>(h.k.data(), h.v.data(), c.B, h.n_pages, c.P, c.Hkv, c.d, h.table.data(),
                                                h.table_stride, h.seq_lens.data())
                       : paged_kv_batch_nhd<TC>(h.k.data(), h.v.data(), c.B, h.n_pages, c.P, c.Hkv, c.d, h.table.data(),
                                                h.table_stride, h.seq_lens.data());
    }
    // Everything NaN first: a row outside the sequences would poison the output if it were read.
    for (auto& x : h.k) x = from_float<TC>(NAN);
    for (auto& x : h.v) x = from_float<TC>(NAN);
    for (std::int64_t b = 0; b < c.B; ++b)
        for (std::int64_t r = 0; r < c.lens[static_cast<std::size_t>(b)]; ++r)
            for (std::int64_t g = 0; g < Hkv; ++g)
                for (std::int64_t e = 0; e < d; ++e) {
                    h.k[static_cast<std::size_t>(h.view.offset(b, r, g) + e)] = from_float<TC>(static_cast<float>(rng.uniform() * 2 - 1));
                    h.v[static_cast<std::size_t>(h.view.offset(b, r, g) + e)] = from_float<TC>(static_cast<float>(rng.uniform() * 2 - 1));
                }
    h.q_indptr.push_back(0);
    for (std::int64_t b = 0; b < c.B; ++b) h.q_indptr.push_back(h.q_indptr.back() + c.qlens[static_cast<std::size_t>(b)]);
    h.total_q = h.q_indptr.back();
    h.q.resize(static_cast<std::size_t>(h.total_q * H * d));
    for (auto& x : h.q) x = static_cast<float>((rng.uniform() * 4 - 2) * c.q_scale);  // q_scale 1: scores of a few units
    if (c.lists != 0) {
        const std::int64_t per = c.lists == 1 ? 1 : Hkv;
        h.list_indptr.push_back(0);
        for (std::int64_t b = 0; b < c.B; ++b) {
            const std::int64_t n = c.lens[static_cast<std::size_t>(b)], ql = c.qlens[static_cast<std::size_t>(b)];
            for (std::int64_t l = 0; l < per; ++l) {
                for (std::int64_t r = 0; r < n; ++r) {
                    const bool newest = r >= n - ql;
                    const bool take = c.one_row ? r == n - 1 : (newest || rng.uniform() < c.frac);
                    if (take) h.indices.push_back(static_cast<std::int32_t>(r));
                }
                h.list_indptr.push_back(static_cast<std::int32_t>(h.indices.size()));
            }
        }
    }
    return h;
}

template <class T>
std::vector<T> to_type(const std::vector<float>& x) {
    std::vector<T> r(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) r[i] = from_float<T>(x[i]);
    return r;
}

double nmse(const std::vector<float>& a, const std::vector<double>& ref) {
    double num = 0.0, den = 0.0;
    for (std::size_t i = 0; i < ref.size(); ++i) {
        const double e = static_cast<double>(a[i]) - ref[i];
        num += e * e;
        den += ref[i] * ref[i];
    }
    return num / std::max(den, 1e-300);
}

// Its own NMSE: the denominator floored at 1e-300 (vt::nmse is infinite when the reference is all zeros).
// The bound is test_core.hpp's: fp32 accumulation against the double reference.
constexpr double kOutputNmse = vt::tolerance(vt::TestBackend::cuda, vt::Metric::attention_nmse);

std::string describe(const Case& c) {
    std::ostringstream s;
    s << "B " << c.B << ", H_kv " << c.Hkv << ", G " << c.G << ", d " << c.d << ", P " << c.P << (c.hnd ? " HND" : "")
      << ", lists " << c.lists << (c.one_row ? " (one row)" : "") << ", seed " << c.seed << ", lens";
    for (auto l : c.lens) s << ' ' << l;
    s << ", q_lens";
    for (auto l : c.qlens) s << ' ' << l;
    return s.str();
}

// Runs the case on the GPU with q of type TQ and output of type TO and checks it against the reference.
template <class TC, class TQ = float, class TO = float>
void check_case(const Case& c, bool with_probs = false, cuda::DecodeKernel kernel = cuda::DecodeKernel::automatic) {
    INFO(describe(c) << ", cache bytes " << sizeof(TC) << ", q bytes " << sizeof(TQ) << ", out bytes " << sizeof(TO)
                     << ", kernel " << static_cast<int>(kernel));
    auto h = make_batch<TC>(c);
    const std::int64_t H = static_cast<std::int64_t>(c.Hkv) * c.G, d = c.d, tq = h.total_q;
    const DecodeBatchHost meta{h.seq_lens, h.q_indptr, h.list_indptr, c.lists == 2 ? c.Hkv : 1};
    const BatchRowLists lists_h{c.lists ? h.list_indptr.data() : nullptr, c.lists ? h.indices.data() : nullptr,
                                c.lists == 2 ? c.Hkv : 1};
    // q as stored: [total_q, H, d], or [H, total_q, d] with strides {d, total_q * d, 1}.
    const auto qt = to_type<TQ>(h.q);
    std::vector<TQ> qs(qt.size());
    for (std::int64_t i = 0; i < tq; ++i)
        for (std::int64_t hh = 0; hh < H; ++hh)
            for (std::int64_t e = 0; e < d; ++e) {
                const std::size_t src = static_cast<std::size_t>((i * H + hh) * d + e);
                const std::size_t dst = c.strided_q ? static_cast<std::size_t>((hh * tq + i) * d + e) : src;
                qs[dst] = qt[src];
            }
    const std::array<std::int64_t, 3> shape{tq, H, d};
    const std::array<std::int64_t, 3> qstr = c.strided_q ? std::array<std::int64_t, 3>{d, tq * d, 1}
                                                         : std::array<std::int64_t, 3>{H * d, d, 1};
    std::vector<double> ref(static_cast<std::size_t>(tq * H * d));
    std::vector<double> ref_p(h.indices.size());
    const View3<const TQ> qv_h(qs.data(), shape, qstr);
    if (with_probs)
        reference::batched_decode_attention(qv_h, KvBatchView<const TC>(h.view), lists_h, meta, View3<double>(ref.data(), shape),
                                            std::span<double>(ref_p));
    else
        reference::batched_decode_attention(qv_h, KvBatchView<const TC>(h.view), lists_h, meta, View3<double>(ref.data(), shape));

    // The same bytes on the device.
    cuda::DeviceArray<TC> kd(h.k), vd(h.v);
    cuda::DeviceArray<std::int32_t> td(h.table), sd(h.seq_lens), ld(h.list_indptr), id(h.indices);
    cuda::DeviceArray<TQ> qd(qs);
    cuda::DeviceArray<TO> od(static_cast<std::size_t>(tq * H * d));
    cuda::DeviceArray<float> pd(h.indices.size());
    KvBatchView<const TC> cv = KvBatchView<const TC>(h.view);
    cv.k = kd.data();
    cv.v = vd.data();
    cv.block_table = c.P ? td.data() : nullptr;
    cv.seq_lens = sd.data();
    const BatchRowLists lists_d{c.lists ? ld.data() : nullptr, c.lists ? id.data() : nullptr, lists_h.lists_per_seq};

    // Plans sized for the cache's element type (bf16, 64 < d <= 128: the tensor-core kernel's 3-stage
    // ring) on odd seeds, for an unknown type (3 blocks per multiprocessor, 2 stages) on even ones.
    cuda::DecodePlan plan;
    if (c.seed % 2) plan.plan(meta, H, c.Hkv, d, with_probs, nullptr, dtype_of<TC>());
    else plan.plan(meta, H, c.Hkv, d, with_probs);
    INFO("plan for " << (c.seed % 2 ? "the cache's type" : "an unknown type") << ": " << plan.blocks_per_sm()
                     << " blocks per multiprocessor");
    od.fill_bytes(0xff);
    pd.fill_bytes(0xff);
    cuda::DecodeOptions opt;
    opt.check_finite = false;  // a NaN (unwritten) output must reach the comparison, not an exception
    opt.kernel = kernel;
    cuda::batched_decode_attention(plan, View3<const TQ>(qd.data(), shape, qstr), cv, lists_d, View3<TO>(od.data(), shape),
                                   opt, nullptr, with_probs ? pd.data() : nullptr);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    const auto o = od.download();
    std::vector<float> of(o.size());
    for (std::size_t i = 0; i < o.size(); ++i) of[i] = to_float(o[i]);
    INFO("items " << plan.n_items() << ", chunk " << plan.chunk_rows() << ", query block " << plan.query_block());
    if constexpr (std::is_same_v<TO, float>) {
        CHECK(nmse(of, ref) <= kOutputNmse);
    } else {
        // 16-bit outputs: every element the reference rounded, within one step of the format.
        const double step = std::is_same_v<TO, bfloat16> ? 1.0 / 128.0 : 1.0 / 1024.0;
        std::size_t bad = 0;
        for (std::size_t i = 0; i < of.size(); ++i)
            if (!(std::abs(of[i] - ref[i]) <= std::abs(ref[i]) * step + 1e-6)) ++bad;
        CHECK(bad == 0);
    }
    if (with_probs) {
        const auto p = pd.download();
        CHECK(nmse(p, ref_p) <= kOutputNmse);
    }
}

template <class TC>
void sweep_small(std::uint64_t seed) {
    // Dense and listed, contiguous and paged, several GQA ratios and head dims.
    for (std::int32_t d : {40, 64, 96, 128, 256})
        for (std::int32_t G : {1, 3, 4, 8})
            for (std::int64_t P : {std::int64_t{0}, std::int64_t{1}, std::int64_t{16}, std::int64_t{64}})
                for (int lists : {0, 1, 2}) {
                    Case c;
                    c.B = 3;
                    c.Hkv = 2;
                    c.G = G;
                    c.d = d;
                    c.lens = {1, 77, 300};
                    c.qlens = {1, 1, 1};
                    c.P = P;
                    c.hnd = P == 16;
                    c.lists = lists;
                    c.seed = seed++ * 7919;
                    check_case<TC>(c);
                    // bf16 / fp16: the automatic choice is the tensor-core kernel where it applies; the
                    // CUDA-core kernel is checked on the same case too.
                    if constexpr (!std::is_same_v<TC, float>) {
                        check_case<TC>(c, false, cuda::DecodeKernel::cuda_cores);
                        // q of the cache's type: the tensor-core kernel's exact-q path (no split).
                        check_case<TC, TC, float>(c);
                    }
                }
}

}  // namespace

TEST_CASE("cuda decode: fp32 cache, dense and listed, contiguous and paged, against the reference", "[cuda][decode]") {
    sweep_small<float>(base_seed());
}
TEST_CASE("cuda decode: bf16 cache, dense and listed, contiguous and paged, against the reference", "[cuda][decode]") {
    sweep_small<bfloat16>(base_seed() + 100000);
}
TEST_CASE("cuda decode: fp16 cache, dense and listed, contiguous and paged, against the reference", "[cuda][decode]") {
    sweep_small<vlsparse::half>(base_seed() + 200000);
}

TEST_CASE("cuda decode: long caches split into chunks merged exactly; ragged batches", "[cuda][decode]") {
    std::uint64_t seed = base_seed() + 300000;
    for (std::int64_t P : {std::int64_t{0}, std::int64_t{16}})
        for (int lists : {0, 1, 2}) {
            Case c;
            c.B = 4;
            c.Hkv = 4;
            c.G = 4;
            c.d = 128;
            c.lens = {5000, 131, 20011, 1};
            c.qlens = {1, 1, 1, 1};
            c.P = P;
            c.lists = lists;
            c.frac = 0.3;
            c.seed = seed++;
            check_case<bfloat16>(c);
            check_case<bfloat16>(c, false, cuda::DecodeKernel::cuda_cores);
            check_case<bfloat16, bfloat16, float>(c);
            check_case<vlsparse::half>(c);
            check_case<vlsparse::half, vlsparse::half, float>(c);
            check_case<float>(c);
        }
    // One long list of one KV head: a single unit cut into a couple of hundred chunks (more than the
    // merge's threads and its load batches), 8 query vectors per unit (two new tokens x G = 4).
    for (int lists : {0, 1}) {
        Case c;
        c.B = 1;
        c.Hkv = 1;
        c.G = 4;
        c.d = 128;
        c.lens = {60013};
        c.qlens = {2};
        c.lists = lists;
        c.frac = 0.5;
        c.seed = seed++;
        check_case<bfloat16>(c);
        check_case<bfloat16>(c, false, cuda::DecodeKernel::cuda_cores);
        check_case<vlsparse::half>(c);
    }
}

TEST_CASE("cuda decode: q_len up to 8, causal among the new tokens", "[cuda][decode]") {
    std::uint64_t seed = base_seed() + 400000;
    for (std::int32_t G : {1, 2, 4, 8})
        for (int lists : {0, 1, 2})
            for (std::int64_t P : {std::int64_t{0}, std::int64_t{16}}) {
                Case c;
                c.B = 3;
                c.Hkv = 2;
                c.G = G;
                c.d = 64;
                c.lens = {8, 300, 2100};
                c.qlens = {8, 3, 5};
                c.P = P;
                c.lists = lists;
                c.seed = seed++;
                check_case<bfloat16>(c);
                check_case<bfloat16>(c, false, cuda::DecodeKernel::cuda_cores);
                check_case<bfloat16, bfloat16, float>(c);
                check_case<vlsparse::half>(c);
            }
}

TEST_CASE("cuda decode: single-row lists, every GQA ratio 1..8, strided q, 16-bit q and outputs", "[cuda][decode]") {
    std::uint64_t seed = base_seed() + 500000;
    for (std::int32_t G = 1; G <= 8; ++G) {
        Case c;
        c.B = 2;
        c.Hkv = 2;
        c.G = G;
        c.d = 128;
        c.lens = {70, 900};
        c.qlens = {1, 1};
        c.lists = 2;
        c.one_row = G % 2 == 1;
        c.strided_q = true;
        c.seed = seed++;
        check_case<bfloat16, bfloat16, bfloat16>(c);
        check_case<vlsparse::half, float, vlsparse::half>(c);
        check_case<float, bfloat16, float>(c);
    }
}

TEST_CASE("cuda decode: fp16 caches on the tensor cores with q beyond fp16's range and q near zero", "[cuda][decode]") {
    // The tensor-core kernel feeds q * scale to fp16 mma operands: without its power-of-two shift per
    // query vector, q of 1e6 (fp32 q, times 1/sqrt(d) * log2(e)) would overflow to inf and q of 1e-6
    // would lose its low half to fp16 subnormals. Both kernels, against the double reference.
    std::uint64_t seed = base_seed() + 550000;
    for (double qs : {1e6, 3e4, 1e-6})
        for (std::int32_t d : {64, 128})
            for (int lists : {0, 2}) {
                Case c;
                c.B = 2;
                c.Hkv = 2;
                c.G = 4;
                c.d = d;
                c.lens = {333, 2500};
                c.qlens = {1, 1};
                c.lists = lists;
                c.q_scale = qs;
                c.seed = seed++;
                check_case<vlsparse::half>(c, false, cuda::DecodeKernel::tensor_cores);
                check_case<vlsparse::half>(c, false, cuda::DecodeKernel::cuda_cores);
                if (qs < 6e4)  // (fp16 q holds it)
                    check_case<vlsparse::half, vlsparse::half, float>(c, false, cuda::DecodeKernel::tensor_cores);
            }
}

TEST_CASE("cuda decode: the probabilities of the listed rows", "[cuda][decode]") {
    std::uint64_t seed = base_seed() + 600000;
    for (int lists : {1, 2})
        for (std::int32_t ql : {1, 4}) {
            Case c;
            c.B = 3;
            c.Hkv = 2;
            c.G = 4;
            c.d = 128;
            c.lens = {9, 3000, 700};
            c.qlens = {ql, ql, 1};
            c.P = lists == 1 ? 16 : 0;
            c.lists = lists;
            c.seed = seed++;
            check_case<bfloat16>(c, true);
            check_case<bfloat16>(c, true, cuda::DecodeKernel::cuda_cores);
            check_case<vlsparse::half>(c, true);
            check_case<bfloat16, bfloat16, float>(c, true);
            check_case<float>(c, true);
        }
}

TEST_CASE("cuda decode: bad input is a vlsparse::error before or instead of a wrong answer", "[cuda][decode][errors]") {
    Case c;
    c.B = 2;
    c.Hkv = 2;
    c.G = 2;
    c.d = 64;
    c.lens = {50, 80};
    c.qlens = {1, 2};
    c.P = 16;
    c.lists = 2;
    c.seed = base_seed() + 700000;
    auto h = make_batch<bfloat16>(c);
    const std::int64_t H = 4, d = 64, tq = h.total_q;
    cuda::DeviceArray<bfloat16> kd(h.k), vd(h.v);
    cuda::DeviceArray<std::int32_t> td(h.table), sd(h.seq_lens), ld(h.list_indptr), id(h.indices);
    cuda::DeviceArray<float> qd(h.q), od(static_cast<std::size_t>(tq * H * d));
    KvBatchView<const bfloat16> cv = KvBatchView<const bfloat16>(h.view);
    cv.k = kd.data();
    cv.v = vd.data();
    cv.block_table = td.data();
    cv.seq_lens = sd.data();
    const DecodeBatchHost meta{h.seq_lens, h.q_indptr, h.list_indptr, 2};
    const BatchRowLists lists{ld.data(), id.data(), 2};
    const View3<const float> q(qd.data(), {tq, H, d});
    const View3<float> out(od.data(), {tq, H, d});
    cuda::DecodePlan plan;
    plan.plan(meta, H, 2, d);
    REQUIRE_NOTHROW(cuda::batched_decode_attention(plan, q, cv, lists, out));

    SECTION("plan: metadata") {
        cuda::DecodePlan p;
        CHECK_THROWS_WITH(p.plan(meta, 3, 2, d), Contains("not a positive multiple"));
        CHECK_THROWS_WITH(p.plan(meta, H, 2, 300), Contains("supports 1..256"));
        auto bad_q = h.q_indptr;
        bad_q[2] = bad_q[1] + 9;
        CHECK_THROWS_WITH(p.plan({h.seq_lens, bad_q, h.list_indptr, 2}, H, 2, d), Contains("q_len = 9"));
        auto bad_l = h.list_indptr;
        bad_l[0] = 1;
        CHECK_THROWS_WITH(p.plan({h.seq_lens, h.q_indptr, bad_l, 2}, H, 2, d), Contains("indptr[0]"));
        CHECK_THROWS_WITH(p.plan({h.seq_lens, h.q_indptr, h.list_indptr, 3}, H, 2, d), Contains("lists_per_seq"));
        CHECK_THROWS_WITH(p.plan({h.seq_lens, h.q_indptr, {}, 1}, H, 2, d, true), Contains("need row lists"));
    }
    SECTION("run: shapes, plan mismatch, aliasing") {
        cuda::DecodePlan empty;
        CHECK_THROWS_WITH(cuda::batched_decode_attention(empty, q, cv, lists, out), Contains("plan is empty"));
        CHECK_THROWS_WITH(cuda::batched_decode_attention(plan, View3<const float>(qd.data(), {tq, H, 32}), cv, lists, out),
                          Contains("q has shape"));
        CHECK_THROWS_WITH(cuda::batched_decode_attention(plan, q, cv, BatchRowLists{}, out), Contains("dense lists"));
        CHECK_THROWS_WITH(cuda::batched_decode_attention(plan, q, cv, lists, View3<float>(const_cast<float*>(qd.data()), {tq, H, d})),
                          Contains("aliases"));
        auto cv2 = cv;
        cv2.n_pages = 0;
        CHECK_THROWS_WITH(cuda::batched_decode_attention(plan, q, cv2, lists, out), Contains("n_pages"));
        float p = 0;
        CHECK_THROWS_WITH(cuda::batched_decode_attention(plan, q, cv, lists, out, {}, nullptr, &p), Contains("with_probs"));
        cuda::DecodeOptions o;
        o.scale = -1.0f;
        CHECK_THROWS_WITH(cuda::batched_decode_attention(plan, q, cv, lists, out, o), Contains("scale"));
        // The tensor-core kernel on a case it cannot take: rows off 16-byte alignment.
        cuda::DecodeOptions t;
        t.kernel = cuda::DecodeKernel::tensor_cores;
        auto cv3 = cv;
        cv3.k = cv.k + 1;
        cv3.v = cv.v + 1;  // (nothing is read: the call is refused before any launch that reads K / V)
        CHECK_THROWS_WITH(cuda::batched_decode_attention(plan, q, cv3, lists, out, t), Contains("tensor-core kernel"));
    }
    SECTION("run: device lists and tables checked on the device") {
        auto idx = h.indices;
        std::swap(idx[3], idx[4]);
        id.upload(idx);
        CHECK_THROWS_WITH(cuda::batched_decode_attention(plan, q, cv, lists, out), Contains("not sorted"));
        idx = h.indices;
        idx[h.list_indptr[2] - 1] = 80;  // last entry of sequence 0's second list: beyond its 50 rows
        id.upload(idx);
        CHECK_THROWS_WITH(cuda::batched_decode_attention(plan, q, cv, lists, out), Contains("outside the sequence"));
        id.upload(h.indices);
        auto tab = h.table;
        tab[0] = static_cast<std::int32_t>(h.n_pages);
        td.upload(tab);
        CHECK_THROWS_WITH(cuda::batched_decode_attention(plan, q, cv, lists, out), Contains("outside the page pool"));
        td.upload(h.table);
        auto lens = h.seq_lens;
        lens[1] = 79;
        sd.upload(lens);
        CHECK_THROWS_WITH(cuda::batched_decode_attention(plan, q, cv, lists, out), Contains("re-plan"));
        sd.upload(h.seq_lens);
        REQUIRE_NOTHROW(cuda::batched_decode_attention(plan, q, cv, lists, out));
    }
    SECTION("run: a new token that sees no listed row") {
        // Sequence 1 has q_len 2: a list whose first row is its last row hides everything from token 0.
        auto idx = h.indices;
        auto ind = h.list_indptr;
        std::vector<std::int32_t> idx2, ind2{0};
        for (int l = 0; l < 4; ++l) {
            if (l >= 2) idx2.push_back(79);
            else idx2.insert(idx2.end(), idx.begin() + ind[l], idx.begin() + ind[l + 1]);
            ind2.push_back(static_cast<std::int32_t>(idx2.size()));
        }
        cuda::DeviceArray<std::int32_t> l2(ind2), i2(idx2);
        cuda::DecodePlan p2;
        p2.plan({h.seq_lens, h.q_indptr, ind2, 2}, H, 2, d);
        CHECK_THROWS_WITH(cuda::batched_decode_attention(p2, q, cv, BatchRowLists{l2.data(), i2.data(), 2}, out),
                          Contains("sees no listed row"));
    }
    SECTION("run: non-finite output") {
        auto k = h.k;
        k[static_cast<std::size_t>(h.view.offset(0, h.indices[0], 0))] = from_float<bfloat16>(NAN);
        kd.upload(k);
        CHECK_THROWS_WITH(cuda::batched_decode_attention(plan, q, cv, lists, out), Contains("non-finite"));
    }
}
