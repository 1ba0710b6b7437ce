// vlsparse/cuda/host_ops.cuh -- each algorithm's operations over host tensors, computed on the GPU:
// the cuda:: twin of reference::ZipVLOps / simd::ZipVLOps and the others, the concept that the golden
// runners (golden::run_<algorithm>_case, reference/include/vlsparse/reference/*_golden.hpp) sequence a
// case over. Each call copies its inputs to the device, runs the CUDA front end, and copies the result
// back, so every number a golden case checks comes from a CUDA kernel:
//   ZipVLOps        select (cuda::ZipVLSelector: probes, scores, p, kept lists ranked on the device),
//                   prefill (token-sparse or dense), decode over the evicted cache (batched decode kernel)
//   AvlOps          the last row's head-mean scores and H2O's text scores (cuda::BaselineScorer), each
//                   decode step over the schedule's rows with the kernel's probabilities for the re-rank
//   BaselineOps     H2O / SnapKV / FastV scores, SnapKV's pooling kernel, H2O's decode steps
//   BlindSightOps   masked prefill per head template; Algorithm 1 by cuda::BlindSightCalibrator on the
//                   CUDA-core prefill kernel (fp32 arithmetic)
//   PureKVHostEstimator  the estimator interface of golden::run_purekv_case over cuda::PureKVEstimator
// For verification (`vlsparse-sim golden verify --backend cuda`, the CUDA golden tests), not for
// speed: an engine keeps its tensors on the device and calls the front ends directly.
// Include: <vlsparse/cuda/host_ops.cuh>
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "vlsparse/cuda/baselines.cuh"
#include "vlsparse/cuda/blindsight.cuh"
#include "vlsparse/cuda/decode.cuh"
#include "vlsparse/cuda/indexed_decode.cuh"
#include "vlsparse/cuda/prefill.cuh"
#include "vlsparse/cuda/purekv.cuh"
#include "vlsparse/cuda/zipvl.cuh"
#include "vlsparse/kv/kv_cache.hpp"
#include "vlsparse/policies/avl_schedule.hpp"
#include "vlsparse/policies/purekv_select.hpp"
#include "vlsparse/policies/zipvl_select.hpp"

namespace vlsparse::cuda {
namespace detail {

constexpr const char* kHostOpsFn = "cuda host ops";

template <class V>
std::int64_t host_numel(const V& v) {
    std::int64_t n = 1;
    for (auto s : v.shape) n *= s;
    return n;
}

// A contiguous host tensor of the golden runners, copied to the device.
template <class T, int R>
struct HostOnDevice {
    DeviceArray<std::remove_const_t<T>> a;
    TensorView<const std::remove_const_t<T>, R> v;
    explicit HostOnDevice(const TensorView<T, R>& h) : a(std::span<const std::remove_const_t<T>>(h.data, static_cast<std::size_t>(host_numel(h)))) {
        std::int64_t s = 1;
        for (int i = R; i-- > 0;) {
            ::vlsparse::require(h.stride[i] == s, kHostOpsFn, "a golden runner's tensor is not contiguous");
            s *= h.shape[i];
        }
        v = TensorView<const std::remove_const_t<T>, R>(a.data(), h.shape);
    }
};

template <class V>
void download_to_host(const DeviceArray<float>& d, const V& host) {
    check_cuda(cudaMemcpy(host.data, d.data(), static_cast<std::size_t>(host_numel(host)) * sizeof(float),
                                              cudaMemcpyDeviceToHost),
                                   kHostOpsFn, "cudaMemcpy");
}

PrefillOptions host_prefill_options(float scale, PrefillKernel kernel = PrefillKernel::automatic) {
    PrefillOptions o;
    o.scale = scale;
    o.kernel = kernel;
    return o;
}

// One decode step over `rows` of a host cache on the GPU (batched decode kernel, batch of one). With
// probs: [H][L] per query head, L = the longest list. The kernel writes each listed row's probability
// averaged over the query heads that read its list; every head's row here holds that mean, so sums over
// a list's heads -- what every policy reads (H2O per group, A-VL over all heads) -- are the kernel's.
template <class T>
std::vector<double> host_decode(View2<const T> q, const KvCache<T>& cache, const CacheRows& rows, View2<float> out,
                               const AttentionOptions& opt, std::int64_t L, bool want_probs) {
    const DeviceKvCache<T> dc(cache);
    const DeviceRowLists lists(rows, cache);
    const HostOnDevice<const T, 2> qd(q);
    const std::int64_t H = q.shape[0], d = q.shape[1];
    DeviceArray<float> od(static_cast<std::size_t>(H * d));
    od.fill_bytes(0xff);
    const std::vector<std::int32_t> lens{static_cast<std::int32_t>(dc.rows())};
    DecodePlan plan;
    plan.plan({lens, {}, lists.host_indptr(), lists.lists_per_seq()}, H, cache.n_kv_heads(), d, want_probs, nullptr,
              dtype_of<T>());
    DecodeOptions o;
    o.scale = opt.scale;
    o.check_finite = opt.check_finite;
    DeviceArray<float> pd(static_cast<std::size_t>(std::max<std::int64_t>(1, plan.n_entries())));
    const View3<const T> q3(qd.v.data, {1, H, d});
    const View3<float> o3(od.data(), {1, H, d});
    batched_decode_attention(plan, q3, dc.view(), lists.view(), o3, o, nullptr, want_probs ? pd.data() : nullptr);
    check_cuda(cudaDeviceSynchronize(), kHostOpsFn, "cudaDeviceSynchronize");
    download_to_host(od, out);
    std::vector<double> probs;
    if (!want_probs) return probs;
    std::vector<float> entries(static_cast<std::size_t>(plan.n_entries()));
    if (!entries.empty())
        check_cuda(cudaMemcpy(entries.data(), pd.data(), entries.size() * sizeof(float), cudaMemcpyDeviceToHost),
                                       kHostOpsFn, "cudaMemcpy");
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
CacheRows host_all_rows(const KvCache<T>& cache, std::int64_t& longest) {
    CacheRows rows;
    for (std::int64_t g = 0; g < cache.n_kv_heads(); ++g) rows.push_all(cache.rows(g));
    longest = rows.longest();
    return rows;
}

}  // namespace detail

// ---- ZipVL -----------------------------------------------------------------------------------------

struct ZipVLOps {
    template <class T>
    static ZipVLSelection select(View3<const T> q, View3<const T> k, const Layout& layout, std::int64_t layer,
                                 const ZipVLParams& P) {
        const detail::HostOnDevice<const T, 3> qd(q), kd(k);
        ZipVLSelector selector;
        return selector.select(qd.v, kd.v, layout, layer, P).to_host_selection();
    }
    template <class T>
    static void prefill(View3<const T> q, View3<const T> k, View3<const T> v, const ZipVLSelection& s, View3<float> out,
                        const ZipVLParams& P) {
        const detail::HostOnDevice<const T, 3> qd(q), kd(k), vd(v);
        DeviceArray<float> od(static_cast<std::size_t>(detail::host_numel(out)));
        od.fill_bytes(0xff);
        const View3<float> ov(od.data(), out.shape);
        const auto opt = detail::host_prefill_options(P.attention().scale);
        if (!zipvl_sparse_prefill(s, P)) {
            dense_prefill_attention(qd.v, kd.v, vd.v, ov, opt);
        } else {
            std::vector<std::int32_t> indptr{0}, idx;
            for (const auto& l : s.selection.indices) {
                for (auto j : l) idx.push_back(static_cast<std::int32_t>(j));
                indptr.push_back(static_cast<std::int32_t>(idx.size()));
            }
            DeviceArray<std::int32_t> ip(indptr), ix(std::max<std::size_t>(1, idx.size()));
            if (!idx.empty()) ix.upload(idx);
            sparse_prefill_attention(qd.v, kd.v, vd.v, DeviceTokenLists{s.n, indptr, ip.data(), ix.data()}, ov,
                                           P.unselected, opt);
        }
        detail::download_to_host(od, out);
    }
    template <class T>
    static void decode(View2<const T> q, const KvCache<T>& cache, View2<float> out, const AttentionOptions& opt) {
        std::int64_t L = 0;
        const CacheRows rows = detail::host_all_rows(cache, L);
        detail::host_decode(q, cache, rows, out, opt, L, false);
    }
};

// ---- A-VL and the baselines' scores ----------------------------------------------------------------

struct AvlOps {
    template <class T>
    static std::vector<double> scores(View3<const T> q, View3<const T> k) {
        const detail::HostOnDevice<const T, 3> qd(q), kd(k);
        BaselineScorer sc;
        return sc.fastv_scores(qd.v, kd.v);  // the last row's attention averaged over every query head
    }
    template <class T>
    static std::vector<std::vector<double>> h2o(View3<const T> q, View3<const T> k, AvlTextGroups g) {
        ::vlsparse::require(g == AvlTextGroups::per_kv_head, detail::kHostOpsFn,
                                    "A-VL's text budget with text_groups = per_query_head has no GPU path");
        const detail::HostOnDevice<const T, 3> qd(q), kd(k);
        BaselineScorer sc;
        return sc.h2o_scores(qd.v, kd.v, BaselineGroups::kv_head);
    }
    // avl_decode_step_over (the sequencing of every backend) with the step's attention and
    // probabilities from the GPU.
    template <class T>
    static AvlStep decode_step(View2<const T> q, const KvCache<T>& cache, DecodeSchedule& sched, std::int64_t t,
                               View2<float> out, const AttentionOptions& opt = {}) {
        return avl_decode_step_over<double>(cache, q.shape[0], sched, t, [&](const CacheRows& rows, double* probs, std::int64_t L) {
            const auto p = detail::host_decode(q, cache, rows, out, opt, L, probs != nullptr);
            if (probs) std::copy(p.begin(), p.end(), probs);
        });
    }
};

struct BaselineOps {
    template <class T>
    static std::vector<std::vector<double>> h2o_scores(View3<const T> q, View3<const T> k, BaselineGroups g) {
        const detail::HostOnDevice<const T, 3> qd(q), kd(k);
        BaselineScorer sc;
        return sc.h2o_scores(qd.v, kd.v, g);
    }
    template <class T>
    static std::vector<std::vector<double>> snapkv_window_scores(View3<const T> q, View3<const T> k, std::int64_t w,
                                                                 BaselineGroups g) {
        const detail::HostOnDevice<const T, 3> qd(q), kd(k);
        BaselineScorer sc;
        return sc.snapkv_window_scores(qd.v, kd.v, w, g);
    }
    // SnapKV's pooling kernel over one group's scores.
    static std::vector<double> snapkv_pool(const std::vector<double>& s, std::int64_t kernel, SnapKVPooling p) {
        const std::vector<float> f(s.begin(), s.end());
        const auto L = static_cast<std::int64_t>(f.size());
        if (L == 0) return {};
        DeviceArray<float> in(f), out(f.size());
        const int mode = p == SnapKVPooling::none ? 0 : (p == SnapKVPooling::avg ? 1 : 2);
        detail::pool1d_kernel<><<<static_cast<unsigned>((L + 255) / 256), 256>>>(in.data(), 1, static_cast<int>(L),
                                                                                     static_cast<int>(kernel), mode, out.data());
        detail::check_launch(detail::kHostOpsFn, "pool1d_kernel");
        const auto h = out.download();
        return {h.begin(), h.end()};
    }
    template <class T>
    static std::vector<double> fastv_scores(View3<const T> q, View3<const T> k) {
        const detail::HostOnDevice<const T, 3> qd(q), kd(k);
        BaselineScorer sc;
        return sc.fastv_scores(qd.v, kd.v);
    }
    template <class T>
    static std::vector<double> decode(View2<const T> q, const KvCache<T>& cache, const CacheRows& rows, View2<float> out,
                                      std::int64_t L) {
        return detail::host_decode(q, cache, rows, out, AttentionOptions{}, L, true);
    }
};

// ---- BlindSight --------------------------------------------------------------------------------------

struct BlindSightOps {
    template <class T>
    static void masked(View3<const T> q, View3<const T> k, View3<const T> v, const MaskContext& ctx,
                       std::span<const MaskTemplate> heads, View3<float> out) {
        run(q, k, v, ctx, heads, out, PrefillKernel::automatic, 0.0f);
    }
    // Algorithm 1 on the GPU (BlindSightCalibrator) with both outputs in fp32 arithmetic (the
    // CUDA-core prefill kernel): the golden NMSE bar is fp32's.
    template <class T>
    static std::vector<HeadCharacterization> characterize(View3<const T> q, View3<const T> k, View3<const T> v,
                                                          const Layout& layout, const BlindSightParams& P) {
        const detail::HostOnDevice<const T, 3> qd(q), kd(k), vd(v);
        BlindSightCalibrator cal(layout, P, q.shape[1], k.shape[1]);
        return cal.characterize(qd.v, kd.v, vd.v, detail::host_prefill_options(0.0f, PrefillKernel::simt));
    }

private:
    template <class T>
    static void run(View3<const T> q, View3<const T> k, View3<const T> v, const MaskContext& ctx,
                    std::span<const MaskTemplate> heads, View3<float> out, PrefillKernel kernel, float scale) {
        const detail::HostOnDevice<const T, 3> qd(q), kd(k), vd(v);
        DeviceArray<float> od(static_cast<std::size_t>(detail::host_numel(out)));
        od.fill_bytes(0xff);
        const MaskedPrefillPlan plan(ctx, heads, k.shape[1]);
        masked_prefill_attention(plan, qd.v, kd.v, vd.v, View3<float>(od.data(), out.shape), detail::host_prefill_options(scale, kernel));
        detail::download_to_host(od, out);
    }
};

// ---- PureKV --------------------------------------------------------------------------------------------

// The estimator interface of golden::run_purekv_case over PureKVEstimator.
class PureKVHostEstimator {
public:
    PureKVHostEstimator(const PureKVParams& P, const Layout& layout, const ModelShape& shape)
        : P_(P), layout_(layout), shape_(shape), est_(P, layout, shape) {}

    bool needs_scores(std::int64_t layer) const { return est_.needs_scores(layer); }
    template <class T>
    void observe(std::int64_t layer, View3<const T> q, View3<const T> k) {
        const detail::HostOnDevice<const T, 3> qd(q), kd(k);
        est_.observe(layer, qd.v, kd.v);
        detail::check_cuda(cudaDeviceSynchronize(), detail::kHostOpsFn, "cudaDeviceSynchronize");  // before qd, kd go
    }
    template <class T>
    void attention(std::int64_t layer, View3<const T> q, View3<const T> k, View3<const T> v, View3<float> out) const {
        const detail::HostOnDevice<const T, 3> qd(q), kd(k), vd(v);
        DeviceArray<float> od(static_cast<std::size_t>(detail::host_numel(out)));
        od.fill_bytes(0xff);
        est_.attention(layer, qd.v, kd.v, vd.v, View3<float>(od.data(), out.shape));
        detail::download_to_host(od, out);
    }
    template <class T>
    PureKVSelection select(std::int64_t layer, View3<const T> v) {
        const detail::HostOnDevice<const T, 3> vd(v);
        return est_.select(layer, vd.v).to_host();
    }
    // Eq. 5-7: l0's estimate against the layer's own scores, both selected on the GPU.
    template <class T>
    PureKVLayerValidation validate(std::int64_t layer, View3<const T> q, View3<const T> k, View3<const T> v) {
        const PureKVSelection estimated = select(layer, v);
        PureKVParams own_p = P_;
        own_p.l0 = layer;
        PureKVEstimator own(own_p, layout_, shape_);
        const detail::HostOnDevice<const T, 3> qd(q), kd(k), vd(v);
        own.observe(layer, qd.v, kd.v);
        return purekv_validation(estimated, own.select(layer, vd.v).to_host());
    }
    PureKVScores scores(std::int64_t layer) const { return est_.scores(layer).to_host(); }

private:
    PureKVParams P_;
    Layout layout_;
    ModelShape shape_;
    PureKVEstimator est_;
};

}  // namespace vlsparse::cuda
