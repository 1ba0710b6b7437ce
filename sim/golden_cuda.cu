// sim/golden_cuda.cu -- the cuda backend of `vlsparse-sim golden verify --backend`: every golden case
// through the CUDA path (vlsparse/sim/golden_run.hpp has the command's description).
//
// The golden runners of the library (golden::run_<algorithm>_case) sequence each case once for every
// backend: the reference, the SIMD path and this one. Here each algorithm's ops type runs the arithmetic
// on the GPU -- the inputs of a call copied to the device, the CUDA front end called, its result copied
// back -- so every number a case checks comes from a CUDA kernel:
//   - ZipVL: cuda::ZipVLSelector (probes, a_j, a~_j, p, the kept lists ranked on the device), the
//     token-sparse or dense prefill, decode over the evicted cache (batched decode kernel);
//   - A-VL: the last row's head-mean scores and H2O's text scores (cuda::BaselineScorer), each decode
//     step over the schedule's rows with the kernel's probabilities for the refresh re-rank;
//   - baselines: H2O / SnapKV / FastV scores (BaselineScorer, SnapKV's pooling kernel), H2O's decode steps
//     with the kernel's probabilities;
//   - BlindSight: masked_prefill_attention per head template; Algorithm 1 by cuda::BlindSightCalibrator on
//     the CUDA-core prefill kernel (fp32 arithmetic: the golden NMSE bar is fp32's);
//   - PureKV: cuda::PureKVEstimator (window scores, ||V||, importance, kept lists, the layer's ST or
//     dense prefill); the validation's own-layer selection from a second estimator on the GPU.
// The host code every backend shares does the rest: KvCache eviction and append (the cache rows a case
// checks are copies of its inputs), the ranking of host scores where the golden runner does it, masks,
// FLOPs, Spearman. Prefill outputs of 16-bit inputs that the tensor cores computed (head dims 64 / 128)
// are held to the manifest's bar for that type (P rounded to 16 bits); everything else, decode included,
// to the fp32 bar.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "vlsparse/cuda/baselines.cuh"
#include "vlsparse/cuda/blindsight.cuh"
#include "vlsparse/cuda/indexed_decode.cuh"
#include "vlsparse/cuda/prefill.cuh"
#include "vlsparse/cuda/purekv.cuh"
#include "vlsparse/cuda/zipvl.cuh"
#include "vlsparse/reference/avl_golden.hpp"
#include "vlsparse/reference/baselines_golden.hpp"
#include "vlsparse/reference/blindsight_golden.hpp"
#include "vlsparse/reference/purekv_golden.hpp"
#include "vlsparse/reference/zipvl_golden.hpp"
#include "vlsparse/sim/golden_run.hpp"

namespace vlsparse::sim {
namespace {

constexpr const char* kFn = "golden verify --backend cuda";

template <class V>
std::int64_t numel(const V& v) {
    std::int64_t n = 1;
    for (auto s : v.shape) n *= s;
    return n;
}

// A contiguous host tensor of the golden runners, copied to the device.
template <class T, int R>
struct Dev {
    cuda::DeviceArray<std::remove_const_t<T>> a;
    TensorView<const std::remove_const_t<T>, R> v;
    explicit Dev(const TensorView<T, R>& h) : a(std::span<const std::remove_const_t<T>>(h.data, static_cast<std::size_t>(numel(h)))) {
        std::int64_t s = 1;
        for (int i = R; i-- > 0;) {
            ::vlsparse::detail::require(h.stride[i] == s, kFn, "a golden runner's tensor is not contiguous");
            s *= h.shape[i];
        }
        v = TensorView<const std::remove_const_t<T>, R>(a.data(), h.shape);
    }
};

template <class V>
void download(const cuda::DeviceArray<float>& d, const V& host) {
    cuda::detail::check_cuda(cudaMemcpy(host.data, d.data(), static_cast<std::size_t>(numel(host)) * sizeof(float),
                                              cudaMemcpyDeviceToHost),
                                   kFn, "cudaMemcpy");
}

cuda::PrefillOptions prefill_options(float scale, cuda::PrefillKernel kernel = cuda::PrefillKernel::automatic) {
    cuda::PrefillOptions o;
    o.scale = scale;
    o.kernel = kernel;
    return o;
}

// One decode step over `rows` of a host cache on the GPU (batched decode kernel, batch of one). With
// probs: [H][L] per query head, L = the longest list. The kernel writes each listed row's probability
// averaged over the query heads that read its list; every head's row here holds that mean, so sums over
// a list's heads -- what every policy reads (H2O per group, A-VL over all heads) -- are the kernel's.
template <class T>
std::vector<double> gpu_decode(View2<const T> q, const KvCache<T>& cache, const CacheRows& rows, View2<float> out,
                               const AttentionOptions& opt, std::int64_t L, bool want_probs) {
    const cuda::DeviceKvCache<T> dc(cache);
    const cuda::DeviceRowLists lists(rows, cache);
    const Dev<const T, 2> qd(q);
    const std::int64_t H = q.shape[0], d = q.shape[1];
    cuda::DeviceArray<float> od(static_cast<std::size_t>(H * d));
    od.fill_bytes(0xff);
    const std::vector<std::int32_t> lens{static_cast<std::int32_t>(dc.rows())};
    cuda::DecodePlan plan;
    plan.plan({lens, {}, lists.host_indptr(), lists.lists_per_seq()}, H, cache.n_kv_heads(), d, want_probs, nullptr,
              dtype_of<T>());
    cuda::DecodeOptions o;
    o.scale = opt.scale;
    o.check_finite = opt.check_finite;
    cuda::DeviceArray<float> pd(static_cast<std::size_t>(std::max<std::int64_t>(1, plan.n_entries())));
    const View3<const T> q3(qd.v.data, {1, H, d});
    const View3<float> o3(od.data(), {1, H, d});
    cuda::batched_decode_attention(plan, q3, dc.view(), lists.view(), o3, o, nullptr, want_probs ? pd.data() : nullptr);
    cuda::detail::check_cuda(cudaDeviceSynchronize(), kFn, "cudaDeviceSynchronize");
    download(od, out);
    std::vector<double> probs;
    if (!want_probs) return probs;
    std::vector<float> entries(static_cast<std::size_t>(plan.n_entries()));
    if (!entries.empty())
        cuda::detail::check_cuda(cudaMemcpy(entries.data(), pd.data(), entries.size() * sizeof(float), cudaMemcpyDeviceToHost),
                                       kFn, "cudaMemcpy");
    probs.assign(static_cast<std::size_t>(H * L), 0.0);
    const auto indptr = lists.host_indptr();
    const std::int64_t per = lists.lists_per_seq(), group = H / cache.n_kv_heads();
    for (std::int64_t h = 0; h < H; ++h) {
        const std::int64_t l = per == 1 ? 0 : h / group;
        const std::int64_t b = indptr[static_cast<std::size_t>(l)], e = indptr[static_cast<std::size_t>(l) + 1];
        for (std::int64_t i = b; i < e; ++i) probs[static_cast<std::size_t>(h * L + (i - b))] = entries[static_cast<std::size_t>(i)];
    }
    return probs;
}

// Every cached row of each KV head.
template <class T>
CacheRows all_rows(const KvCache<T>& cache, std::int64_t& longest) {
    CacheRows rows;
    for (std::int64_t g = 0; g < cache.n_kv_heads(); ++g) rows.push_all(cache.rows(g));
    longest = rows.longest();
    return rows;
}

// ---- ZipVL -----------------------------------------------------------------------------------------

struct ZipVLOps {
    template <class T>
    static ZipVLSelection select(View3<const T> q, View3<const T> k, const Layout& layout, std::int64_t layer,
                                 const ZipVLParams& P) {
        const Dev<const T, 3> qd(q), kd(k);
        cuda::ZipVLSelector selector;
        return selector.select(qd.v, kd.v, layout, layer, P).to_host_selection();
    }
    template <class T>
    static void prefill(View3<const T> q, View3<const T> k, View3<const T> v, const ZipVLSelection& s, View3<float> out,
                        const ZipVLParams& P) {
        const Dev<const T, 3> qd(q), kd(k), vd(v);
        cuda::DeviceArray<float> od(static_cast<std::size_t>(numel(out)));
        od.fill_bytes(0xff);
        const View3<float> ov(od.data(), out.shape);
        const auto opt = prefill_options(P.attention().scale);
        if (!zipvl_sparse_prefill(s, P)) {
            cuda::dense_prefill_attention(qd.v, kd.v, vd.v, ov, opt);
        } else {
            std::vector<std::int32_t> indptr{0}, idx;
            for (const auto& l : s.selection.indices) {
                for (auto j : l) idx.push_back(static_cast<std::int32_t>(j));
                indptr.push_back(static_cast<std::int32_t>(idx.size()));
            }
            cuda::DeviceArray<std::int32_t> ip(indptr), ix(std::max<std::size_t>(1, idx.size()));
            if (!idx.empty()) ix.upload(idx);
            cuda::sparse_prefill_attention(qd.v, kd.v, vd.v, cuda::DeviceTokenLists{s.n, indptr, ip.data(), ix.data()}, ov,
                                           P.unselected, opt);
        }
        download(od, out);
    }
    template <class T>
    static void decode(View2<const T> q, const KvCache<T>& cache, View2<float> out, const AttentionOptions& opt) {
        std::int64_t L = 0;
        const CacheRows rows = all_rows(cache, L);
        gpu_decode(q, cache, rows, out, opt, L, false);
    }
};

// ---- A-VL and the baselines' scores ----------------------------------------------------------------

struct AvlOps {
    template <class T>
    static std::vector<double> scores(View3<const T> q, View3<const T> k) {
        const Dev<const T, 3> qd(q), kd(k);
        cuda::BaselineScorer sc;
        return sc.fastv_scores(qd.v, kd.v);  // the last row's attention averaged over every query head
    }
    template <class T>
    static std::vector<std::vector<double>> h2o(View3<const T> q, View3<const T> k, AvlTextGroups g) {
        ::vlsparse::detail::require(g == AvlTextGroups::per_kv_head, kFn,
                                    "A-VL's text budget with text_groups = per_query_head has no GPU path");
        const Dev<const T, 3> qd(q), kd(k);
        cuda::BaselineScorer sc;
        return sc.h2o_scores(qd.v, kd.v, BaselineGroups::kv_head);
    }
    // avl_decode_step_over (the sequencing of every backend) with the step's attention and
    // probabilities from the GPU.
    template <class T>
    static AvlStep decode_step(View2<const T> q, const KvCache<T>& cache, DecodeSchedule& sched, std::int64_t t,
                               View2<float> out, const AttentionOptions& opt = {}) {
        return avl_decode_step_over<double>(cache, q.shape[0], sched, t, [&](const CacheRows& rows, double* probs, std::int64_t L) {
            const auto p = gpu_decode(q, cache, rows, out, opt, L, probs != nullptr);
            if (probs) std::copy(p.begin(), p.end(), probs);
        });
    }
};

struct BaselineOps {
    template <class T>
    static std::vector<std::vector<double>> h2o_scores(View3<const T> q, View3<const T> k, BaselineGroups g) {
        const Dev<const T, 3> qd(q), kd(k);
        cuda::BaselineScorer sc;
        return sc.h2o_scores(qd.v, kd.v, g);
    }
    template <class T>
    static std::vector<std::vector<double>> snapkv_window_scores(View3<const T> q, View3<const T> k, std::int64_t w,
                                                                 BaselineGroups g) {
        const Dev<const T, 3> qd(q), kd(k);
        cuda::BaselineScorer sc;
        return sc.snapkv_window_scores(qd.v, kd.v, w, g);
    }
    // SnapKV's pooling kernel over one group's scores.
    static std::vector<double> snapkv_pool(const std::vector<double>& s, std::int64_t kernel, SnapKVPooling p) {
        const std::vector<float> f(s.begin(), s.end());
        const auto L = static_cast<std::int64_t>(f.size());
        if (L == 0) return {};
        cuda::DeviceArray<float> in(f), out(f.size());
        const int mode = p == SnapKVPooling::none ? 0 : (p == SnapKVPooling::avg ? 1 : 2);
        cuda::detail::pool1d_kernel<><<<static_cast<unsigned>((L + 255) / 256), 256>>>(in.data(), 1, static_cast<int>(L),
                                                                                     static_cast<int>(kernel), mode, out.data());
        cuda::detail::check_launch(kFn, "pool1d_kernel");
        const auto h = out.download();
        return {h.begin(), h.end()};
    }
    template <class T>
    static std::vector<double> fastv_scores(View3<const T> q, View3<const T> k) {
        const Dev<const T, 3> qd(q), kd(k);
        cuda::BaselineScorer sc;
        return sc.fastv_scores(qd.v, kd.v);
    }
    template <class T>
    static std::vector<double> decode(View2<const T> q, const KvCache<T>& cache, const CacheRows& rows, View2<float> out,
                                      std::int64_t L) {
        return gpu_decode(q, cache, rows, out, AttentionOptions{}, L, true);
    }
};

// ---- BlindSight --------------------------------------------------------------------------------------

struct BlindSightOps {
    template <class T>
    static void masked(View3<const T> q, View3<const T> k, View3<const T> v, const MaskContext& ctx,
                       std::span<const MaskTemplate> heads, View3<float> out) {
        run(q, k, v, ctx, heads, out, cuda::PrefillKernel::automatic, 0.0f);
    }
    // Algorithm 1 on the GPU (cuda::BlindSightCalibrator) with both outputs in fp32 arithmetic (the
    // CUDA-core prefill kernel): the golden NMSE bar is fp32's.
    template <class T>
    static std::vector<HeadCharacterization> characterize(View3<const T> q, View3<const T> k, View3<const T> v,
                                                          const Layout& layout, const BlindSightParams& P) {
        const Dev<const T, 3> qd(q), kd(k), vd(v);
        cuda::BlindSightCalibrator cal(layout, P, q.shape[1], k.shape[1]);
        return cal.characterize(qd.v, kd.v, vd.v, prefill_options(0.0f, cuda::PrefillKernel::simt));
    }

private:
    template <class T>
    static void run(View3<const T> q, View3<const T> k, View3<const T> v, const MaskContext& ctx,
                    std::span<const MaskTemplate> heads, View3<float> out, cuda::PrefillKernel kernel, float scale) {
        const Dev<const T, 3> qd(q), kd(k), vd(v);
        cuda::DeviceArray<float> od(static_cast<std::size_t>(numel(out)));
        od.fill_bytes(0xff);
        const cuda::MaskedPrefillPlan plan(ctx, heads, k.shape[1]);
        cuda::masked_prefill_attention(plan, qd.v, kd.v, vd.v, View3<float>(od.data(), out.shape), prefill_options(scale, kernel));
        download(od, out);
    }
};

// ---- PureKV --------------------------------------------------------------------------------------------

// The estimator interface of golden::run_purekv_case over cuda::PureKVEstimator.
class PureKVEstimatorOnGpu {
public:
    PureKVEstimatorOnGpu(const PureKVParams& P, const Layout& layout, const ModelShape& shape)
        : P_(P), layout_(layout), shape_(shape), est_(P, layout, shape) {}

    bool needs_scores(std::int64_t layer) const { return est_.needs_scores(layer); }
    template <class T>
    void observe(std::int64_t layer, View3<const T> q, View3<const T> k) {
        const Dev<const T, 3> qd(q), kd(k);
        est_.observe(layer, qd.v, kd.v);
        cuda::detail::check_cuda(cudaDeviceSynchronize(), kFn, "cudaDeviceSynchronize");  // before qd, kd go
    }
    template <class T>
    void attention(std::int64_t layer, View3<const T> q, View3<const T> k, View3<const T> v, View3<float> out) const {
        const Dev<const T, 3> qd(q), kd(k), vd(v);
        cuda::DeviceArray<float> od(static_cast<std::size_t>(numel(out)));
        od.fill_bytes(0xff);
        est_.attention(layer, qd.v, kd.v, vd.v, View3<float>(od.data(), out.shape));
        download(od, out);
    }
    template <class T>
    PureKVSelection select(std::int64_t layer, View3<const T> v) {
        const Dev<const T, 3> vd(v);
        return est_.select(layer, vd.v).to_host();
    }
    // Eq. 5-7: l0's estimate against the layer's own scores, both selected on the GPU.
    template <class T>
    PureKVLayerValidation validate(std::int64_t layer, View3<const T> q, View3<const T> k, View3<const T> v) {
        const PureKVSelection estimated = select(layer, v);
        PureKVParams own_p = P_;
        own_p.l0 = layer;
        cuda::PureKVEstimator own(own_p, layout_, shape_);
        const Dev<const T, 3> qd(q), kd(k), vd(v);
        own.observe(layer, qd.v, kd.v);
        return purekv_validation(estimated, own.select(layer, vd.v).to_host());
    }
    PureKVScores scores(std::int64_t layer) const { return est_.scores(layer).to_host(); }

private:
    PureKVParams P_;
    Layout layout_;
    ModelShape shape_;
    cuda::PureKVEstimator est_;
};

// ---- precisions -------------------------------------------------------------------------------------

// The bar of each output: a prefill output that the tensor cores computed (16-bit inputs, head dim 64
// or 128: P rounded to the input type) is held to its type's tolerance, everything else -- the
// CUDA-core prefill of other inputs, decode, scores -- to fp32's.
std::string prefill_precision(const std::string& dtype, std::int64_t d) {
    return (dtype == "bf16" || dtype == "fp16") && (d == 64 || d == 128) ? dtype : "fp32";
}

// The fp32 bar for every output but `prefill_output`, which gets `prefill_prec`.
template <class Named>
std::vector<GoldenRunOutput> with_prefill_precision(std::vector<Named> a, const char* prefill_output,
                                                    const std::string& prefill_prec) {
    auto r = detail::with_precision(std::move(a), "fp32");
    for (auto& o : r)
        if (o.name == prefill_output) o.precision = prefill_prec;
    return r;
}

}  // namespace

std::vector<GoldenRunOutput> cuda_golden_case(const std::filesystem::path& dir, const GoldenManifest& m) {
    int devices = 0;
    ::vlsparse::detail::require(cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0, kFn,
                                "no CUDA device is visible to this process");
    if (m.algorithm == "zipvl") {
        const auto c = golden::read_zipvl_inputs(dir);
        return with_prefill_precision(golden::run_zipvl_case<ZipVLOps>(c), "prefill_out", prefill_precision(c.dtype, c.d));
    }
    if (m.algorithm == "avl") {
        const auto c = golden::read_avl_inputs(dir);
        return detail::with_precision(golden::run_avl_case<AvlOps>(c), "fp32");
    }
    if (m.algorithm == "baselines") {
        const auto c = golden::read_baselines_inputs(dir);
        return detail::with_precision(golden::run_baselines_case<BaselineOps>(c), "fp32");
    }
    if (m.algorithm == "blindsight") {
        const auto c = golden::read_blindsight_inputs(dir);
        return with_prefill_precision(golden::run_blindsight_case<BlindSightOps>(c), "masked_out", prefill_precision(c.dtype, c.d));
    }
    if (m.algorithm == "purekv") {
        const auto c = golden::read_purekv_inputs(dir);
        return with_prefill_precision(golden::run_purekv_case<PureKVEstimatorOnGpu>(c), "prefill_out",
                                      prefill_precision(c.dtype, c.shape.head_dim));
    }
    throw error(kFn, "algorithm '" + m.algorithm + "', expected zipvl, avl, baselines, blindsight or purekv");
}

}  // namespace vlsparse::sim
