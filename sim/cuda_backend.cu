// sim/cuda_backend.cu -- the simulator's CUDA backend (sim/backend.hpp), built into vlsparse-sim with
// -Dcuda=enabled: every run's prefill and decode attention, the policies' scoring and the KV caches on
// the GPU, through the library's CUDA kernels (vlsparse/cuda/*.cuh), in bf16 with fp32 accumulation.
//
// What lives where:
// - The layer's rows: the engine hands host fp32 rows (SimRows); they are uploaded once per distinct
//   set of rows (the dense run and every run that kept the whole sequence share one upload) and
//   rounded to bf16 on the device: q, k, v [m, H(_kv), d].
// - Prefill attention: cuda::dense_prefill_attention / sparse_prefill_attention (the run's token lists,
//   uploaded) / masked_prefill_attention (a MaskedPrefillPlan from the policy's BlockMask), output fp32
//   on the device. The dense run's output stays on the device as the layer's reference; every other
//   run's error against it is reduced on the device (per row partial sums, added on the host in row
//   order), so no output crosses to the host except in residual mode (prefill_output).
// - Scoring: PrefillScoring on the device rows -- ZipVL (cuda::ZipVLSelector), H2O / SnapKV / FastV /
//   A-VL's last-row scores (cuda::BaselineScorer), PureKV's window scores (cuda::PureKVEstimator's
//   kernels); the policies rank them with their CPU code. H2O's scores, A-VL's text scores, the last
//   row's scores (FastV, A-VL) and SnapKV's and PureKV's window scores take the rows' log-sum-exp from
//   the dense prefill of the same rows where it ran (it writes them) at the same scale.
//   BlindSight's masks and the list-only baselines need no q / k arithmetic; PureKV's V norms (O(n d))
//   are read from the host views.
// - KV cache: one bf16 buffer [n + decode_steps, H_kv, d] per run and layer indexed by position, and
//   the positions each KV head holds, on the host (KvCache::keep's contract). Eviction only changes
//   the position lists: decode reads the kept positions through row lists, so the bytes it reads are
//   those of the kept rows (what a compacted cache would read).
// - Decode: cuda::batched_decode_attention over the step's positions (row lists; per KV head when the
//   caller wants per-group mass), with probabilities; q rounded to bf16; output and probabilities
//   come back to the host (small: H d and the listed rows).
// Times: CUDA events around the attention kernels only.
// Include nothing of this file: make_cuda_backend() is declared in sim/backend.hpp.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "vlsparse/cuda/baselines.cuh"
#include "vlsparse/cuda/common.cuh"
#include "vlsparse/cuda/decode.cuh"
#include "vlsparse/cuda/prefill.cuh"
#include "vlsparse/cuda/purekv.cuh"
#include "vlsparse/cuda/zipvl.cuh"
#include "vlsparse/sim/backend.hpp"

namespace vlsparse::sim {

namespace {

using ::vlsparse::cuda::DeviceArray;
using ::vlsparse::cuda::check_cuda;
using ::vlsparse::require;

constexpr const char* kFn = "vlsparse-sim (cuda)";

void check(cudaError_t e, const char* what) { check_cuda(e, kFn, what); }
void check_launch(const char* kernel) { ::vlsparse::cuda::check_launch(kFn, kernel); }

// A device array that grows to the largest request and is kept.
template <class T>
struct Buf {
    DeviceArray<T> a;
    T* get(std::size_t n) {
        if (a.size() < n) a = DeviceArray<T>(std::max<std::size_t>(n, 1));
        return a.data();
    }
};

__global__ void to_bf16_kernel(const float* __restrict__ in, bfloat16* __restrict__ out, long long n) {
    for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<long long>(gridDim.x) * blockDim.x)
        out[i] = ::vlsparse::from_float<bfloat16>(in[i]);
}

// dst[pos[i]] = src[i], rows of `row` elements.
__global__ void scatter_rows_kernel(const bfloat16* __restrict__ src, bfloat16* __restrict__ dst,
                                    const std::int32_t* __restrict__ pos, long long m, long long row) {
    const long long total = m * row;
    for (long long x = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; x < total;
         x += static_cast<long long>(gridDim.x) * blockDim.x) {
        const long long i = x / row, c = x % row;
        dst[static_cast<long long>(pos[i]) * row + c] = src[x];
    }
}

// One block per row i: sum over the heads the run computed of (out - ref)^2 and ref^2, ref row pos[i].
// computed: [H_kv][m] bytes or null (every row). partial[2 i], partial[2 i + 1].
__global__ void nmse_rows_kernel(const float* __restrict__ out, const float* __restrict__ ref,
                                 const std::int32_t* __restrict__ pos, const std::uint8_t* __restrict__ computed,
                                 int m, int H, int d, int grp, double* __restrict__ partial) {
    const int i = blockIdx.x;
    if (i >= m) return;
    const long long row = static_cast<long long>(H) * d;
    const float* a = out + i * row;
    const float* b = ref + static_cast<long long>(pos[i]) * row;
    double num = 0.0, den = 0.0;
    for (int x = threadIdx.x; x < H * d; x += blockDim.x) {
        const int h = x / d;
        if (computed && !computed[static_cast<long long>(h / grp) * m + i]) continue;
        const double e = static_cast<double>(a[x]) - static_cast<double>(b[x]);
        num += e * e;
        den += static_cast<double>(b[x]) * static_cast<double>(b[x]);
    }
    __shared__ double sn[256], sd[256];
    sn[threadIdx.x] = num;
    sd[threadIdx.x] = den;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            sn[threadIdx.x] += sn[threadIdx.x + s];
            sd[threadIdx.x] += sd[threadIdx.x + s];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        partial[2 * i] = sn[0];
        partial[2 * i + 1] = sd[0];
    }
}

int grid_for(long long n) { return static_cast<int>(std::min<long long>((n + 255) / 256, 65536)); }

// Host fp32 -> device bf16 through a staging buffer.
void upload_bf16(const float* host, long long n, Buf<float>& staging, bfloat16* dst) {
    if (n == 0) return;
    float* s = staging.get(static_cast<std::size_t>(n));
    check(cudaMemcpy(s, host, static_cast<std::size_t>(n) * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
    to_bf16_kernel<<<grid_for(n), 256>>>(s, dst, n);
    check_launch("to_bf16_kernel");
}

// CSR of position (or row) lists as int32 on the device.
struct DeviceLists {
    std::vector<std::int32_t> indptr;
    Buf<std::int32_t> indptr_dev, indices_dev;
    std::vector<std::int32_t> all;
    void upload(const std::vector<std::vector<std::int64_t>>& lists) {
        indptr.assign(1, 0);
        std::size_t total = 0;
        for (const auto& l : lists) total += l.size();
        all.resize(total);
        std::size_t o = 0;
        for (const auto& l : lists) {
            for (std::size_t i = 0; i < l.size(); ++i) all[o + i] = static_cast<std::int32_t>(l[i]);
            o += l.size();
            indptr.push_back(static_cast<std::int32_t>(o));
        }
        check(cudaMemcpy(indptr_dev.get(indptr.size()), indptr.data(), indptr.size() * sizeof(std::int32_t),
                         cudaMemcpyHostToDevice),
              "cudaMemcpy");
        std::int32_t* dst = indices_dev.get(all.size());
        if (!all.empty())
            check(cudaMemcpy(dst, all.data(), all.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice), "cudaMemcpy");
    }
};

class Timer {
public:
    Timer() {
        check(cudaEventCreate(&a_), "cudaEventCreate");
        check(cudaEventCreate(&b_), "cudaEventCreate");
    }
    ~Timer() {
        cudaEventDestroy(a_);
        cudaEventDestroy(b_);
    }
    void start() { check(cudaEventRecord(a_), "cudaEventRecord"); }
    double stop() {
        check(cudaEventRecord(b_), "cudaEventRecord");
        check(cudaEventSynchronize(b_), "cudaEventSynchronize");
        float ms = 0.0f;
        check(cudaEventElapsedTime(&ms, a_, b_), "cudaEventElapsedTime");
        return static_cast<double>(ms) * 1e-3;
    }

private:
    cudaEvent_t a_{}, b_{};
};

class CudaBackend;

class CudaCache final : public SimCache {
public:
    CudaCache(CudaBackend& b, std::int64_t Hkv, std::int64_t d, std::int64_t capacity)
        : b_(&b), Hkv_(Hkv), d_(d), cap_(capacity), k_(static_cast<std::size_t>(capacity * Hkv * d)),
          v_(static_cast<std::size_t>(capacity * Hkv * d)), pos_(static_cast<std::size_t>(Hkv)) {}
    std::int64_t n_kv_heads() const override { return Hkv_; }
    std::int64_t seq_len() const override { return seq_len_; }
    std::span<const std::int64_t> positions(std::int64_t g) const override {
        require(g >= 0 && g < Hkv_, kFn, "KV head ", g, ", expected 0 <= g < ", Hkv_);
        return pos_[static_cast<std::size_t>(g)];
    }
    std::int64_t element_bytes() const override { return 2; }
    void fill(std::span<const std::int64_t> seq, std::int64_t n) override;
    void keep(const TokenSelection& sel) override {
        constexpr const char* fn = "KvCache::keep";
        require(sel.shared() || static_cast<std::int64_t>(sel.groups()) == Hkv_, fn, "selection has ", sel.groups(),
                " lists, expected 1 or ", Hkv_);
        for (std::int64_t g = 0; g < Hkv_; ++g) {  // every head first: on error nothing changes
            const auto& have = pos_[static_cast<std::size_t>(g)];
            const auto want = sel.for_kv_head(g);
            std::size_t src = 0;
            for (std::size_t i = 0; i < want.size(); ++i) {
                require(i == 0 || want[i] > want[i - 1], fn, "position list for KV head ", g,
                        " is not sorted ascending without duplicates at entry ", i);
                while (src < have.size() && have[src] < want[i]) ++src;
                require(src < have.size() && have[src] == want[i], fn, "position ", want[i], " is not in KV head ", g,
                        " of the cache (evicted earlier, or beyond seq_len ", seq_len_, ")");
                ++src;
            }
        }
        for (std::int64_t g = 0; g < Hkv_; ++g) {
            const auto want = sel.for_kv_head(g);
            pos_[static_cast<std::size_t>(g)].assign(want.begin(), want.end());
        }
    }
    void append(const float* k, const float* v) override;

    bfloat16* k() const { return k_.data(); }
    bfloat16* v() const { return v_.data(); }
    std::int64_t capacity() const { return cap_; }

private:
    CudaBackend* b_;
    std::int64_t Hkv_, d_, cap_, seq_len_ = 0;
    DeviceArray<bfloat16> k_, v_;
    std::vector<std::vector<std::int64_t>> pos_;
};

class CudaScoring final : public PrefillScoring {
public:
    explicit CudaScoring(CudaBackend& b) : b_(&b) {}
    std::string backend_name() const override { return "cuda"; }
    ZipVLSelection zipvl_select(const PrefillLayer& in, const Layout& layout, const ZipVLParams& P) override;
    std::vector<double> last_row_scores(const PrefillLayer& in, const AttentionOptions& opt) override;
    std::vector<std::vector<double>> h2o_scores(const PrefillLayer& in, BaselineGroups groups,
                                                const AttentionOptions& opt) override;
    std::vector<std::vector<double>> avl_h2o_scores(const PrefillLayer& in, AvlTextGroups groups,
                                                    const AttentionOptions& opt) override;
    TokenSelection snapkv_select(const PrefillLayer& in, const SnapKVParams& P) override;
    PureKVScores purekv_window_scores(const PrefillLayer& in, const PureKVParams& P) override;

private:
    CudaBackend* b_;
};

class CudaBackend final : public SimBackend {
public:
    CudaBackend() : scoring_(*this) {
        int dev = 0;
        check(cudaGetDevice(&dev), "cudaGetDevice");
        cudaDeviceProp p{};
        check(cudaGetDeviceProperties(&p, dev), "cudaGetDeviceProperties");
        device_ = std::string(p.name) + " (CUDA, bf16 attention with fp32 accumulation, " +
                  (::vlsparse::cuda::prefill_uses_wgmma() ? "wgmma" : "mma.sync") + " prefill)";
    }
    std::string name() const override { return "cuda"; }
    std::string describe() const override { return device_; }
    void begin(const ModelShape& shape, std::int64_t n, std::int64_t decode_steps) override {
        shape_ = shape;
        cap_ = n + decode_steps;
        uploaded_id_ = -1;
    }
    std::unique_ptr<SimCache> make_cache() override {
        return std::make_unique<CudaCache>(*this, shape_.kv_heads, shape_.head_dim, cap_);
    }

    SimRows set_rows(const SimRows& rows) override {
        require(rows.m >= 1, kFn, "a layer with no rows");
        const std::int64_t H = shape_.heads, Hkv = shape_.kv_heads, d = shape_.head_dim;
        if (rows.shared_id < 0 || rows.shared_id != uploaded_id_ || rows.m != m_) {
            // New rows (the source's next layer, or a run's own rows): upload and round.
            upload_bf16(rows.q, rows.m * H * d, staging_, q_.get(static_cast<std::size_t>(rows.m * H * d)));
            upload_bf16(rows.k, rows.m * Hkv * d, staging_, k_.get(static_cast<std::size_t>(rows.m * Hkv * d)));
            upload_bf16(rows.v, rows.m * Hkv * d, staging_, v_.get(static_cast<std::size_t>(rows.m * Hkv * d)));
            ++upload_gen_;
        }
        rows_ = rows;
        m_ = rows.m;
        uploaded_id_ = rows.shared_id;
        return rows_;
    }
    PrefillScoring* scoring() override { return &scoring_; }

    double dense_prefill() override {
        Timer& t = timer_;
        t.start();
        // (with each row's log-sum-exp, which H2O's and A-VL's text scores of these rows then take instead
        // of a pass over every key of their own)
        ::vlsparse::cuda::dense_prefill_attention(qv(), kv(), vv(), ov(),
                                                  View2<float>(lse_.get(static_cast<std::size_t>(m_ * shape_.heads)), {m_, shape_.heads}),
                                                  prefill_opt());
        const double s = t.stop();
        lse_gen_ = upload_gen_;
        return s;
    }
    double sparse_prefill(const TokenSelection& rows, UnselectedRows unselected) override {
        lists_.upload(rows.indices);
        const ::vlsparse::cuda::DeviceTokenLists dl{m_, std::span<const std::int32_t>(lists_.indptr),
                                                    lists_.indptr_dev.a.data(), lists_.indices_dev.a.data()};
        ::vlsparse::cuda::PrefillOptions opt = prefill_opt();
        opt.check_inputs = true;
        Timer& t = timer_;
        t.start();
        ::vlsparse::cuda::sparse_prefill_attention(qv(), kv(), vv(), dl, ov(), unselected, opt);
        return t.stop();
    }
    double masked_prefill(const BlockMask& mask) override {
        require(mask.n == m_, kFn, "the policy's mask covers ", mask.n, " rows, the layer has ", m_);
        const ::vlsparse::cuda::MaskedPrefillPlan plan(mask.context, std::span<const MaskTemplate>(mask.head_template),
                                                       shape_.kv_heads);
        Timer& t = timer_;
        t.start();
        ::vlsparse::cuda::masked_prefill_attention(plan, qv(), kv(), vv(), ov(), prefill_opt());
        return t.stop();
    }
    void keep_as_reference() override {
        const std::size_t n = static_cast<std::size_t>(m_ * shape_.heads * shape_.head_dim);
        check(cudaMemcpy(ref_.get(n), out_.a.data(), n * sizeof(float), cudaMemcpyDeviceToDevice), "cudaMemcpy");
    }
    NmseAcc prefill_error(std::span<const std::int64_t> seq, const std::vector<std::vector<std::uint8_t>>& computed) override {
        const std::int64_t H = shape_.heads, Hkv = shape_.kv_heads, d = shape_.head_dim;
        std::vector<std::int32_t> pos(seq.begin(), seq.end());
        std::int32_t* pos_dev = pos_.get(pos.size());
        check(cudaMemcpy(pos_dev, pos.data(), pos.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice), "cudaMemcpy");
        const std::uint8_t* comp_dev = nullptr;
        if (!computed.empty()) {
            std::vector<std::uint8_t> flat;
            for (const auto& c : computed) flat.insert(flat.end(), c.begin(), c.end());
            std::uint8_t* p = computed_.get(flat.size());
            check(cudaMemcpy(p, flat.data(), flat.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
            comp_dev = p;
        }
        double* part = partial_.get(static_cast<std::size_t>(2 * m_));
        nmse_rows_kernel<<<static_cast<unsigned>(m_), 256>>>(out_.a.data(), ref_.a.data(), pos_dev, comp_dev,
                                                             static_cast<int>(m_), static_cast<int>(H),
                                                             static_cast<int>(d), static_cast<int>(H / Hkv), part);
        check_launch("nmse_rows_kernel");
        std::vector<double> host(static_cast<std::size_t>(2 * m_));
        check(cudaMemcpy(host.data(), part, host.size() * sizeof(double), cudaMemcpyDeviceToHost), "cudaMemcpy");
        NmseAcc e;
        for (std::int64_t i = 0; i < m_; ++i) {
            e.num += host[static_cast<std::size_t>(2 * i)];
            e.den += host[static_cast<std::size_t>(2 * i + 1)];
        }
        return e;
    }
    std::span<const float> prefill_output() override {
        out_host_.resize(static_cast<std::size_t>(m_ * shape_.heads * shape_.head_dim));
        check(cudaMemcpy(out_host_.data(), out_.a.data(), out_host_.size() * sizeof(float), cudaMemcpyDeviceToHost),
              "cudaMemcpy");
        return out_host_;
    }
    std::vector<std::vector<double>> last_row_mass() override {
        // The last row as one decode token over the rows themselves, one list per KV head (all rows):
        // the probabilities come back averaged over each group's heads; times the group size = the sum.
        const std::int64_t H = shape_.heads, Hkv = shape_.kv_heads, d = shape_.head_dim, grp = H / Hkv;
        std::vector<std::int64_t> all(static_cast<std::size_t>(m_));
        std::iota(all.begin(), all.end(), std::int64_t{0});
        const std::vector<std::vector<std::int64_t>> lists(static_cast<std::size_t>(Hkv), all);
        std::vector<float> probs;
        run_decode(q_.a.data() + (m_ - 1) * H * d, k_.a.data(), v_.a.data(), m_, m_, lists, true, nullptr, &probs);
        std::vector<std::vector<double>> mass(static_cast<std::size_t>(Hkv), std::vector<double>(static_cast<std::size_t>(m_)));
        for (std::int64_t g = 0; g < Hkv; ++g)
            for (std::int64_t j = 0; j < m_; ++j)
                mass[static_cast<std::size_t>(g)][static_cast<std::size_t>(j)] =
                    static_cast<double>(probs[static_cast<std::size_t>(g * m_ + j)]) * static_cast<double>(grp);
        return mass;
    }

    SimDecode decode(SimCache& c, const float* q, const TokenSelection& read, bool want_attention,
                     bool want_group_mass) override {
        auto& cache = static_cast<CudaCache&>(c);
        const std::int64_t H = shape_.heads, Hkv = shape_.kv_heads, d = shape_.head_dim, grp = H / Hkv;
        for (std::size_t g = 0; g < read.groups(); ++g)
            require(!read.indices[g].empty(), kFn, "decode: row list ", g,
                    " is empty; expected at least one row (the new token's)");
        upload_bf16(q, H * d, staging_, q1_.get(static_cast<std::size_t>(H * d)));
        // Per KV head lists when the caller wants per-group mass of a shared list.
        const bool expand = want_group_mass && read.shared() && Hkv > 1;
        std::vector<std::vector<std::int64_t>> expanded;
        if (expand) expanded.assign(static_cast<std::size_t>(Hkv), read.indices[0]);
        const auto& lists = expand ? expanded : read.indices;
        SimDecode r;
        r.out.resize(static_cast<std::size_t>(H * d));
        std::vector<float> probs;
        r.seconds = run_decode(q1_.a.data(), cache.k(), cache.v(), cache.seq_len(), cache.capacity(), lists,
                               want_attention || want_group_mass, &r.out, &probs);
        // attn: per read list, the mean over the heads that read it.
        if (!want_attention) {
        } else if (expand) {
            r.attn.resize(1);
            const std::size_t L = read.indices[0].size();
            r.attn[0].assign(L, 0.0);
            for (std::int64_t g = 0; g < Hkv; ++g)
                for (std::size_t i = 0; i < L; ++i) r.attn[0][i] += probs[static_cast<std::size_t>(g) * L + i];
            for (auto& a : r.attn[0]) a /= static_cast<double>(Hkv);
        } else {
            r.attn.resize(read.groups());
            std::size_t off = 0;
            for (std::size_t g = 0; g < read.groups(); ++g) {
                const std::size_t L = read.indices[g].size();
                r.attn[g].assign(probs.begin() + static_cast<std::ptrdiff_t>(off),
                                 probs.begin() + static_cast<std::ptrdiff_t>(off + L));
                off += L;
            }
        }
        if (want_group_mass) {
            r.group_mass.assign(static_cast<std::size_t>(Hkv), std::vector<double>(static_cast<std::size_t>(cache.seq_len()), 0.0));
            std::size_t off = 0;
            for (std::int64_t g = 0; g < Hkv; ++g) {
                const auto& l = lists[lists.size() == 1 ? 0 : static_cast<std::size_t>(g)];
                for (std::size_t i = 0; i < l.size(); ++i)
                    r.group_mass[static_cast<std::size_t>(g)][static_cast<std::size_t>(l[i])] =
                        static_cast<double>(probs[off + i]) * static_cast<double>(lists.size() == 1 ? H : grp);
                if (lists.size() != 1) off += l.size();
            }
        }
        return r;
    }

    // Device views of the current rows (scoring).
    View3<const bfloat16> qv() const { return {q_.a.data(), {m_, shape_.heads, shape_.head_dim}}; }
    View3<const bfloat16> kv() const { return {k_.a.data(), {m_, shape_.kv_heads, shape_.head_dim}}; }
    View3<const bfloat16> vv() const { return {v_.a.data(), {m_, shape_.kv_heads, shape_.head_dim}}; }
    void check_rows(const PrefillLayer& in, const char* fn) const {
        require(in.q.data == rows_.q && in.k.data == rows_.k && in.q.shape[0] == m_, fn,
                "the layer's q / k are not the rows the CUDA backend holds (set_rows first)");
    }
    Buf<float>& staging() { return staging_; }
    // The current rows' log-sum-exp [m, H] from their dense prefill, for scores at the prefill's scale; a
    // null view where there is none (the rows changed since, or another scale).
    View2<const float> row_lse(const AttentionOptions& opt) const {
        // (the dense prefill's scale: 1 / sqrt(d), rounded to fp32, what scale 0 means everywhere)
        const float prefill_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(shape_.head_dim)));
        const bool same_scale = opt.scale == 0.0f || opt.scale == prefill_scale;
        if (lse_gen_ != upload_gen_ || !same_scale) return {};
        return {lse_.a.data(), {m_, shape_.heads}};
    }
    // H2O's scores of device rows, with their row statistics where lse is not null.
    std::vector<std::vector<double>> h2o_scores(View3<const bfloat16> q, View3<const bfloat16> k, View2<const float> lse,
                                                BaselineGroups groups, const AttentionOptions& opt) {
        return lse.data ? scorer.h2o_scores(q, k, lse, groups, opt) : scorer.h2o_scores(q, k, groups, opt);
    }
    ::vlsparse::cuda::ZipVLSelector zipvl;
    ::vlsparse::cuda::BaselineScorer scorer;

private:
    static ::vlsparse::cuda::PrefillOptions prefill_opt() {
        ::vlsparse::cuda::PrefillOptions o;
        o.check_inputs = false;
        o.check_finite = true;
        return o;
    }
    View3<float> ov() {
        return {out_.get(static_cast<std::size_t>(m_ * shape_.heads * shape_.head_dim)), {m_, shape_.heads, shape_.head_dim}};
    }
    // One decode token q (device bf16 [H, d]) over rows `lists` (1 or H_kv lists of rows < seq_len) of a
    // contiguous cache (k, v [capacity, H_kv, d]); out (host [H, d]) and probs (host, per listed row).
    double run_decode(const bfloat16* q, const bfloat16* k, const bfloat16* v, std::int64_t seq_len,
                      std::int64_t capacity, const std::vector<std::vector<std::int64_t>>& lists, bool with_probs,
                      std::vector<float>* out, std::vector<float>* probs) {
        const std::int64_t H = shape_.heads, Hkv = shape_.kv_heads, d = shape_.head_dim;
        dlists_.upload(lists);
        const std::int32_t sl = static_cast<std::int32_t>(seq_len);
        std::int32_t* sl_dev = seq_len_dev_.get(1);
        check(cudaMemcpy(sl_dev, &sl, sizeof(sl), cudaMemcpyHostToDevice), "cudaMemcpy");
        ::vlsparse::DecodeBatchHost meta;
        meta.seq_lens = std::span<const std::int32_t>(&sl, 1);
        meta.list_indptr = std::span<const std::int32_t>(dlists_.indptr);
        meta.lists_per_seq = static_cast<std::int32_t>(lists.size());
        plan_.plan(meta, H, Hkv, d, with_probs, nullptr, DType::bf16);
        const auto cache = ::vlsparse::contiguous_kv_batch<const bfloat16>(k, v, 1, capacity, static_cast<std::int32_t>(Hkv),
                                                                           static_cast<std::int32_t>(d), sl_dev);
        const ::vlsparse::BatchRowLists rl{dlists_.indptr_dev.a.data(), dlists_.indices_dev.a.data(),
                                           static_cast<std::int32_t>(lists.size())};
        float* o = out1_.get(static_cast<std::size_t>(H * d));
        float* p = with_probs ? probs_.get(static_cast<std::size_t>(std::max<std::int32_t>(dlists_.indptr.back(), 1))) : nullptr;
        ::vlsparse::cuda::DecodeOptions opt;
        opt.check_inputs = false;
        opt.check_finite = true;
        Timer& t = timer_;
        t.start();
        ::vlsparse::cuda::batched_decode_attention(plan_, View3<const bfloat16>(q, {1, H, d}), cache, rl,
                                                   View3<float>(o, {1, H, d}), opt, nullptr, p);
        const double s = t.stop();
        if (out) {
            out->resize(static_cast<std::size_t>(H * d));
            check(cudaMemcpy(out->data(), o, out->size() * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
        }
        if (probs && p) {
            probs->resize(static_cast<std::size_t>(dlists_.indptr.back()));
            if (!probs->empty())
                check(cudaMemcpy(probs->data(), p, probs->size() * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
        }
        return s;
    }

    ModelShape shape_;
    std::int64_t cap_ = 0, m_ = 0;
    std::string device_;
    SimRows rows_;
    std::int64_t uploaded_id_ = -1;
    std::int64_t upload_gen_ = 0, lse_gen_ = -1;  // uploads of rows so far; the one whose dense prefill wrote lse_
    Buf<float> staging_, out_, ref_, out1_, probs_, lse_;
    Buf<bfloat16> q_, k_, v_, q1_;
    Buf<std::int32_t> pos_, seq_len_dev_;
    Buf<std::uint8_t> computed_;
    Buf<double> partial_;
    std::vector<float> out_host_;
    DeviceLists lists_, dlists_;
    ::vlsparse::cuda::DecodePlan plan_;
    Timer timer_;
    CudaScoring scoring_;
};

void CudaCache::fill(std::span<const std::int64_t> seq, std::int64_t n) {
    const std::int64_t m = static_cast<std::int64_t>(seq.size()), row = Hkv_ * d_;
    require(n <= cap_ && m <= n, kFn, "a prefill of ", n, " tokens in a cache of ", cap_, " rows");
    const auto kv = b_->kv(), vv = b_->vv();
    require(kv.shape[0] == m, kFn, "fill: ", m, " positions for ", kv.shape[0], " rows");
    if (m == n) {  // positions 0..n-1
        check(cudaMemcpy(k_.data(), kv.data, static_cast<std::size_t>(m * row) * sizeof(bfloat16), cudaMemcpyDeviceToDevice),
              "cudaMemcpy");
        check(cudaMemcpy(v_.data(), vv.data, static_cast<std::size_t>(m * row) * sizeof(bfloat16), cudaMemcpyDeviceToDevice),
              "cudaMemcpy");
    } else if (m > 0) {
        std::vector<std::int32_t> p(seq.begin(), seq.end());
        DeviceArray<std::int32_t> pd{std::span<const std::int32_t>(p)};
        scatter_rows_kernel<<<grid_for(m * row), 256>>>(kv.data, k_.data(), pd.data(), m, row);
        check_launch("scatter_rows_kernel");
        scatter_rows_kernel<<<grid_for(m * row), 256>>>(vv.data, v_.data(), pd.data(), m, row);
        check_launch("scatter_rows_kernel");
        check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    }
    for (auto& p : pos_) p.assign(seq.begin(), seq.end());
    seq_len_ = n;
}

void CudaCache::append(const float* k, const float* v) {
    require(seq_len_ < cap_, kFn, "append beyond the cache's ", cap_, " rows");
    const std::int64_t row = Hkv_ * d_;
    upload_bf16(k, row, b_->staging(), k_.data() + seq_len_ * row);
    upload_bf16(v, row, b_->staging(), v_.data() + seq_len_ * row);
    for (auto& p : pos_) p.push_back(seq_len_);
    ++seq_len_;
}

ZipVLSelection CudaScoring::zipvl_select(const PrefillLayer& in, const Layout& layout, const ZipVLParams& P) {
    b_->check_rows(in, "cuda scoring: zipvl_select");
    return b_->zipvl.select(b_->qv(), b_->kv(), layout, in.layer, P).to_host_selection();
}

std::vector<double> CudaScoring::last_row_scores(const PrefillLayer& in, const AttentionOptions& opt) {
    b_->check_rows(in, "cuda scoring: last_row_scores");
    const View2<const float> lse = b_->row_lse(opt);  // (null: none for these rows)
    return lse.data ? b_->scorer.fastv_scores(b_->qv(), b_->kv(), lse, opt) : b_->scorer.fastv_scores(b_->qv(), b_->kv(), opt);
}

std::vector<std::vector<double>> CudaScoring::h2o_scores(const PrefillLayer& in, BaselineGroups groups,
                                                         const AttentionOptions& opt) {
    b_->check_rows(in, "cuda scoring: h2o_scores");
    return b_->h2o_scores(b_->qv(), b_->kv(), b_->row_lse(opt), groups, opt);
}

std::vector<std::vector<double>> CudaScoring::avl_h2o_scores(const PrefillLayer& in, AvlTextGroups groups,
                                                             const AttentionOptions& opt) {
    b_->check_rows(in, "cuda scoring: avl_h2o_scores");
    const View2<const float> lse = b_->row_lse(opt);  // (null: none for these rows)
    if (groups == AvlTextGroups::per_kv_head) return b_->h2o_scores(b_->qv(), b_->kv(), lse, BaselineGroups::kv_head, opt);
    // Per query head: H2O's sums of one head at a time (its q rows, its KV head's k rows), one group each.
    const View3<const bfloat16> q = b_->qv(), k = b_->kv();
    const std::int64_t m = q.shape[0], H = q.shape[1], d = q.shape[2], qpk = H / k.shape[1];
    std::vector<std::vector<double>> out;
    out.reserve(static_cast<std::size_t>(H));
    for (std::int64_t h = 0; h < H; ++h) {
        const View3<const bfloat16> qh(q.row(0, h), {m, 1, d}, q.stride), kh(k.row(0, h / qpk), {m, 1, d}, k.stride);
        const View2<const float> lse_h = lse.data ? View2<const float>(lse.data + h, {m, 1}, {lse.stride[0], 1}) : View2<const float>{};
        auto s = b_->h2o_scores(qh, kh, lse_h, BaselineGroups::kv_head, opt);
        out.push_back(std::move(s.at(0)));
    }
    return out;
}

TokenSelection CudaScoring::snapkv_select(const PrefillLayer& in, const SnapKVParams& P) {
    b_->check_rows(in, "cuda scoring: snapkv_select");
    const View2<const float> lse = b_->row_lse(P.attention());
    return lse.data ? b_->scorer.snapkv_select(b_->qv(), b_->kv(), lse, P) : b_->scorer.snapkv_select(b_->qv(), b_->kv(), P);
}

// Eq. 2 by cuda::PureKVEstimator's window-score kernels: an estimator for this one layer (l0 = the
// layer, no ST mask: only observe() runs), its scores copied back for the policy to rank.
PureKVScores CudaScoring::purekv_window_scores(const PrefillLayer& in, const PureKVParams& P) {
    b_->check_rows(in, "cuda scoring: purekv_window_scores");
    PureKVParams one = P;
    one.l0 = in.layer;
    one.st.kind = VideoMask::none;
    ::vlsparse::cuda::PureKVEstimator est(one, *in.layout, in.shape);
    const View2<const float> lse = b_->row_lse(P.attention());  // (null: none for these rows)
    if (lse.data) est.observe(in.layer, b_->qv(), b_->kv(), lse);
    else est.observe(in.layer, b_->qv(), b_->kv());
    return est.scores(in.layer).to_host();
}

}  // namespace

std::unique_ptr<SimBackend> make_cuda_backend() {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    require(e == cudaSuccess && count > 0, "vlsparse-sim", "backend \"cuda\": no CUDA device (",
            e == cudaSuccess ? std::string("none found") : std::string(cudaGetErrorString(e)), ")");
    return std::make_unique<CudaBackend>();
}

}  // namespace vlsparse::sim
