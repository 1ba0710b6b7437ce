// vlsparse/attention/probe.hpp -- attention probabilities of probe rows, CPU fast path (namespace vlsparse::simd).
//
//   probs[h,p,j] = softmax_{j <= pos(p)}(scale * q_{rows[p],h} . k_{j,g}),  0 for j > pos(p),  pos(r) = n_k - n_q + r
//
// ZipVL's probe attention (supplementary Eq. A; feeds Eqs. 6-8): the rows whose scores drive the adaptive
// ratio and the importance of every key. Same signature and semantics as
// vlsparse::reference::probe_attention; fp32 accumulation, scores of a block of probe rows by one
// Eigen GEMM, row softmax with the xsimd kernels. Include: <vlsparse/vlsparse.hpp> (or this header alone).
#pragma once

#include "vlsparse/attention/dense.hpp"

namespace vlsparse::simd {

namespace detail {

template <class Arch, class TQ, class TK, class TO>
void run_probe(const View3<const TQ>& q, const View3<const TK>& k, std::span<const std::int64_t> rows,
               const View3<TO>& probs, float scale, Blocking blocking = {}) {
    using Kn = Kernels<Arch>;
    const std::int64_t nq = q.shape[0], H = q.shape[1], d = q.shape[2], nk = k.shape[0], Hkv = k.shape[1];
    const std::int64_t group = H / Hkv, offset = nk - nq, P = static_cast<std::int64_t>(rows.size());
    const bool in_place = usable_in_place(k);
    std::vector<float> kp;
    if (!in_place) kp.resize(static_cast<std::size_t>(nk * d));
    const int nthreads = max_threads();
    std::vector<Scratch> scratch(static_cast<std::size_t>(nthreads));
    // The scores of a block of probe rows against every visible key at once (the probabilities need
    // the full row): scratch [block, n_k].
    const std::int64_t block = std::min(rows_per_block(blocking.q_block, P, group, nthreads), P);
    for (auto& s : scratch) s.reserve(block, d, nk);
    constexpr std::int64_t kPackRows = 256;
    ErrorSlot err;

    VLSPARSE_OMP(omp parallel num_threads(nthreads))
    {
        Scratch& sc = scratch[static_cast<std::size_t>(thread_id())];
        for (std::int64_t g = 0; g < Hkv; ++g) {
            const float* kbase = in_place ? in_place_rows(k, g) : kp.data();
            const std::int64_t ldk = in_place && nk > 1 ? k.stride[0] : d;
            if (!in_place) {
                const std::int64_t nchunks = (nk + kPackRows - 1) / kPackRows;
                VLSPARSE_OMP(omp for schedule(static))
                for (std::int64_t c = 0; c < nchunks; ++c)
                    err.run([&] { pack_rows(k, g, nullptr, c * kPackRows, std::min(nk, (c + 1) * kPackRows), kp.data()); });
            }
            const std::int64_t nblocks = (P + block - 1) / block;
            const std::int64_t items = nblocks * group;
            VLSPARSE_OMP(omp for schedule(dynamic, 1))
            for (std::int64_t w = 0; w < items; ++w) {
                err.run([&] {
                    const std::int64_t h = g * group + w % group;
                    const std::int64_t p0 = (nblocks - 1 - w / group) * block;
                    const std::int64_t nr = std::min(block, P - p0);
                    std::int64_t kmax = 0;
                    for (std::int64_t r = 0; r < nr; ++r) {
                        const std::int64_t i = rows[static_cast<std::size_t>(p0 + r)];
                        sc.vis[static_cast<std::size_t>(r)] = offset + i + 1;
                        kmax = std::max(kmax, offset + i + 1);
                        widen_row(q.row(i, h), q.stride[2], sc.q.data() + r * d, d);
                    }
                    const CMapR Qm(sc.q.data(), nr, d, Eigen::OuterStride<>(d));
                    const CMapR Km(kbase, kmax, d, Eigen::OuterStride<>(ldk));
                    MapR Sm(sc.s.data(), nr, kmax, Eigen::OuterStride<>(kmax));
                    Sm.noalias() = scale * (Qm * Km.transpose());
                    for (std::int64_t r = 0; r < nr; ++r) {
                        float* srow = sc.s.data() + r * kmax;
                        const std::int64_t cnt = sc.vis[static_cast<std::size_t>(r)];
                        TO* dst = probs.row(h, p0 + r);
                        const std::int64_t ds = probs.stride[2];
                        const float mx = Kn::max(srow, cnt);
                        const float sum = Kn::exp_sub_sum(srow, cnt, mx);
                        bool ok = std::isfinite(mx) && std::isfinite(sum) && sum > 0.0f;
                        if (ok) {
                            Kn::scale(srow, cnt, 1.0f / sum);
                            for (std::int64_t j = 0; j < cnt; ++j) ok &= std::isfinite(srow[j]);
                        }
                        if (ok) {
                            store_row(dst, ds, srow, cnt);
                        } else {  // fp32 overflow (or non-finite input with check_finite off): redo in double
                            const std::int64_t i = rows[static_cast<std::size_t>(p0 + r)];
                            attend_row_double(q.row(i, h), q.stride[2], k, k, g, nullptr, cnt,
                                              static_cast<double>(scale), sc.dp, nullptr);
                            for (std::int64_t j = 0; j < cnt; ++j)
                                store(dst[j * ds], sc.dp[static_cast<std::size_t>(j)]);
                        }
                        for (std::int64_t j = cnt; j < nk; ++j) store(dst[j * ds], 0.0f);
                    }
                });
            }
        }
    }
    err.rethrow();
}

}  // namespace detail

// Attention probabilities of selected query rows ("probes") against every earlier key.
// q [n_q, H, d], k [n_k, H_kv, d], probs [H, P, n_k] with P = rows.size(); rows sorted ascending
// without duplicates, each in [0, n_q).
template <ElementType TQ, ElementType TK, OutputElement TO, class Arch = native_arch>
void probe_attention(View3<const TQ> q, View3<const TK> k, std::span<const std::int64_t> rows, View3<TO> probs,
                     const AttentionOptions& opt = {}) {
    constexpr const char* fn = "simd::probe_attention";
    detail::check_qkv(q, k, k, fn);
    const std::int64_t nq = q.shape[0], H = q.shape[1], d = q.shape[2], nk = k.shape[0];
    detail::require(nq <= nk, fn, "q has ", nq, " tokens and k has ", nk, ", expected n_q <= n_k");
    detail::require(!rows.empty(), fn, "no probe rows given, expected at least one");
    detail::check_sorted_unique(rows, nq, fn, "rows");
    detail::check_out3(probs, {H, static_cast<std::int64_t>(rows.size()), nk}, q, k, k, fn, "probs");
    if (opt.check_finite) {
        detail::check_finite_vectorized(q, fn, "q");
        detail::check_finite_vectorized(k, fn, "k");
    }
    const float scale = detail::resolve_scale(opt, d, fn);
    detail::run_probe<Arch>(q, k, rows, probs, scale);
}

}  // namespace vlsparse::simd
