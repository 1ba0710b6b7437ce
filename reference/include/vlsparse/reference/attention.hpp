// vlsparse/reference/attention.hpp -- the exact scalar reference of every attention primitive.
//
//   O[i,h,:] = sum_{j visible to i} softmax_j(scale * q_{i,h} . k_{j,g}) v_{j,g},   g = h / (H / H_kv)
//
// Plain loops, double accumulation, no SIMD, no threads, no early exits. It is the oracle the SIMD
// and CUDA paths are tested against and the generator of the golden files. NaN/Inf inputs are
// always an error here. Include: <vlsparse/reference/attention.hpp>
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "vlsparse/attention/common.hpp"
#include "vlsparse/core/selection.hpp"
#include "vlsparse/kv/kv_cache.hpp"

namespace vlsparse::reference {

namespace detail {

using namespace ::vlsparse::detail;

// softmax(scale * q . k_j) over the keys listed in `keys`, then the weighted sum of their values.
// Writes the probabilities to `probs` (same length as keys) and the output row to `o` (length d).
template <class TQ, class TK>
void attend_row(const TQ* q, std::int64_t q_stride, const View3<const TK>& k, const View3<const TK>& v,
                std::int64_t g, std::span<const std::int64_t> keys, double scale, std::vector<double>& probs,
                std::vector<double>& o) {
    const std::int64_t d = k.shape[2];
    probs.assign(keys.size(), 0.0);
    o.assign(static_cast<std::size_t>(d), 0.0);
    if (keys.empty()) return;
    double mx = -std::numeric_limits<double>::infinity();
    for (std::size_t t = 0; t < keys.size(); ++t) {
        const auto* kr = k.row(keys[t], g);
        double s = 0.0;
        for (std::int64_t c = 0; c < d; ++c)
            s += static_cast<double>(to_float(q[c * q_stride])) * static_cast<double>(to_float(kr[c * k.stride[2]]));
        probs[t] = s * scale;
        mx = std::max(mx, probs[t]);
    }
    double sum = 0.0;
    for (auto& p : probs) {
        p = std::exp(p - mx);
        sum += p;
    }
    for (auto& p : probs) p /= sum;
    for (std::size_t t = 0; t < keys.size(); ++t) {
        const auto* vr = v.row(keys[t], g);
        for (std::int64_t c = 0; c < d; ++c) o[c] += probs[t] * static_cast<double>(to_float(vr[c * v.stride[2]]));
    }
}

inline std::vector<std::int64_t> iota_n(std::int64_t n) {
    std::vector<std::int64_t> r(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) r[static_cast<std::size_t>(i)] = i;
    return r;
}

template <class TQ, class TK>
void check_all_finite(const View3<const TQ>& q, const View3<const TK>& k, const View3<const TK>& v, const char* fn) {
    check_finite(q, fn, "q");
    check_finite(k, fn, "k");
    check_finite(v, fn, "v");
}

}  // namespace detail

// Dense causal attention. q [n_q, H, d], k, v [n_k, H_kv, d], out [n_q, H, d]; n_q <= n_k.
template <ElementType TQ, ElementType TK, OutputElement TO>
void dense_attention(View3<const TQ> q, View3<const TK> k, View3<const TK> v, View3<TO> out,
                     const AttentionOptions& opt = {}) {
    constexpr const char* fn = "reference::dense_attention";
    detail::check_qkv(q, k, v, fn);
    const std::int64_t nq = q.shape[0], H = q.shape[1], d = q.shape[2], nk = k.shape[0], group = H / k.shape[1];
    detail::require(nq <= nk, fn, "q has ", nq, " tokens and k has ", nk, ", expected n_q <= n_k");
    detail::check_out3(out, {nq, H, d}, q, k, v, fn, "out");
    detail::check_all_finite(q, k, v, fn);
    const double scale = detail::resolve_scale(opt, d, fn);
    const auto all = detail::iota_n(nk);
    std::vector<double> probs, o;
    for (std::int64_t i = 0; i < nq; ++i) {
        const std::int64_t visible = nk - nq + i + 1;
        for (std::int64_t h = 0; h < H; ++h) {
            detail::attend_row(q.row(i, h), q.stride[2], k, v, h / group,
                               std::span<const std::int64_t>(all).first(static_cast<std::size_t>(visible)), scale,
                               probs, o);
            for (std::int64_t c = 0; c < d; ++c) detail::store(out(i, h, c), o[static_cast<std::size_t>(c)]);
        }
    }
    ::vlsparse::detail::check_narrowed_output(out, fn, "out");  // fp16 / bf16 outputs: nothing rounded to inf
}

// Attention probabilities of selected query rows ("probes") against every earlier key.
// probs [H, P, n_k]: probs[h, p, j] = softmax_{j <= pos(p)}(scale * q_{rows[p],h} . k_j), 0 for j > pos(p),
// where pos(r) = n_k - n_q + r. `rows` must be sorted ascending without duplicates.
template <ElementType TQ, ElementType TK, OutputElement TO>
void probe_attention(View3<const TQ> q, View3<const TK> k, std::span<const std::int64_t> rows, View3<TO> probs,
                     const AttentionOptions& opt = {}) {
    constexpr const char* fn = "reference::probe_attention";
    detail::check_qkv(q, k, k, fn);
    const std::int64_t nq = q.shape[0], H = q.shape[1], d = q.shape[2], nk = k.shape[0], group = H / k.shape[1];
    detail::require(nq <= nk, fn, "q has ", nq, " tokens and k has ", nk, ", expected n_q <= n_k");
    detail::require(!rows.empty(), fn, "no probe rows given, expected at least one");
    detail::check_sorted_unique(rows, nq, fn, "rows");
    detail::check_out3(probs, {H, static_cast<std::int64_t>(rows.size()), nk}, q, k, k, fn, "probs");
    detail::check_finite(q, fn, "q");
    detail::check_finite(k, fn, "k");
    const double scale = detail::resolve_scale(opt, d, fn);
    const auto all = detail::iota_n(nk);
    std::vector<double> p, o;
    for (std::size_t r = 0; r < rows.size(); ++r) {
        const std::int64_t visible = nk - nq + rows[r] + 1;
        for (std::int64_t h = 0; h < H; ++h) {
            detail::attend_row(q.row(rows[r], h), q.stride[2], k, k, h / group,
                               std::span<const std::int64_t>(all).first(static_cast<std::size_t>(visible)), scale, p,
                               o);
            for (std::int64_t j = 0; j < nk; ++j)
                detail::store(probs(h, static_cast<std::int64_t>(r), j), j < visible ? p[static_cast<std::size_t>(j)] : 0.0);
        }
    }
}

// Token-sparse attention over a TokenSelection (prefill, n_q == n_k == sel.n). For query head h of
// KV group g with kept list T_g: a query i in T_g attends to the keys j in T_g with j <= i. Queries not
// in T_g are written as zero (UnselectedRows::zero) or attend to the keys of T_g with j <= i
// (UnselectedRows::attend_selected; a row with no such key is zero).
template <ElementType TQ, ElementType TK, OutputElement TO>
void sparse_attention(View3<const TQ> q, View3<const TK> k, View3<const TK> v, const TokenSelection& sel,
                      View3<TO> out, UnselectedRows unselected = UnselectedRows::zero,
                      const AttentionOptions& opt = {}) {
    constexpr const char* fn = "reference::sparse_attention";
    detail::check_qkv(q, k, v, fn);
    const std::int64_t n = q.shape[0], H = q.shape[1], d = q.shape[2], Hkv = k.shape[1], group = H / Hkv;
    detail::require(k.shape[0] == n, fn, "q has ", n, " tokens and k has ", k.shape[0],
                    ", expected equal (token-sparse prefill)");
    detail::require(sel.n == n, fn, "selection refers to ", sel.n, " tokens, the input has ", n);
    sel.validate(Hkv, fn);
    detail::check_out3(out, {n, H, d}, q, k, v, fn, "out");
    detail::check_all_finite(q, k, v, fn);
    const double scale = detail::resolve_scale(opt, d, fn);
    std::vector<double> probs, o;
    for (std::int64_t h = 0; h < H; ++h) {
        const auto T = sel.for_kv_head(h / group);
        std::vector<std::uint8_t> in_t(static_cast<std::size_t>(n), 0);
        for (auto t : T) in_t[static_cast<std::size_t>(t)] = 1;
        for (std::int64_t i = 0; i < n; ++i) {
            const bool compute = in_t[static_cast<std::size_t>(i)] || unselected == UnselectedRows::attend_selected;
            const auto visible = static_cast<std::size_t>(std::upper_bound(T.begin(), T.end(), i) - T.begin());
            if (compute && visible > 0) {
                detail::attend_row(q.row(i, h), q.stride[2], k, v, h / group, T.first(visible), scale, probs, o);
            } else {
                o.assign(static_cast<std::size_t>(d), 0.0);
            }
            for (std::int64_t c = 0; c < d; ++c) detail::store(out(i, h, c), o[static_cast<std::size_t>(c)]);
        }
    }
    ::vlsparse::detail::check_narrowed_output(out, fn, "out");  // fp16 / bf16 outputs: nothing rounded to inf
}

// One decode step: q [H, d] (the newest token, whose K/V the caller has already appended) attends to
// every row the cache holds for its KV head. out [H, d].
template <ElementType TQ, ElementType TC, OutputElement TO>
void decode_attention(View2<const TQ> q, const KvCache<TC>& cache, View2<TO> out, const AttentionOptions& opt = {}) {
    constexpr const char* fn = "reference::decode_attention";
    detail::check_strides(q, fn, "q", false);
    detail::check_strides(out, fn, "out", true);
    const std::int64_t H = q.shape[0], d = q.shape[1], Hkv = cache.n_kv_heads();
    detail::require(H > 0 && d == cache.head_dim(), fn, "q has shape [", H, ", ", d, "], expected [H, ",
                    cache.head_dim(), "] with H > 0");
    detail::require(Hkv > 0 && H % Hkv == 0, fn, "H = ", H, " query heads is not a multiple of the cache's H_kv = ", Hkv,
                    " (a default-constructed cache has H_kv = 0)");
    detail::require(out.shape == q.shape, fn, "out has shape [", out.shape[0], ", ", out.shape[1], "], expected [", H,
                    ", ", d, "]");
    detail::require(!detail::overlaps(out, q), fn, "output out aliases input q; expected separate buffers");
    for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t c = 0; c < d; ++c)
            detail::require(std::isfinite(to_float(q(h, c))), fn, "q[", h, ", ", c, "] = ", to_float(q(h, c)),
                            "; expected finite values (no NaN or Inf)");
    const double scale = detail::resolve_scale(opt, d, fn);
    const std::int64_t group = H / Hkv;
    std::vector<double> probs, o;
    for (std::int64_t h = 0; h < H; ++h) {
        const std::int64_t g = h / group, m = cache.rows(g);
        detail::require(m > 0, fn, "KV head ", g, " of the cache is empty; append the new token's K/V first");
        // View the head's rows as [m, 1, d] so the shared row kernel applies.
        const View3<const TC> kk(cache.k(g).data, {m, 1, d}), vv(cache.v(g).data, {m, 1, d});
        detail::check_finite(kk, fn, "cache k");
        detail::check_finite(vv, fn, "cache v");
        const auto rows = detail::iota_n(m);
        detail::attend_row(q.row(h), q.stride[1], kk, vv, 0, rows, scale, probs, o);
        for (std::int64_t c = 0; c < d; ++c) detail::store(out(h, c), o[static_cast<std::size_t>(c)]);
    }
    ::vlsparse::detail::check_narrowed_output(out, fn, "out");  // fp16 / bf16 outputs: nothing rounded to inf
}

}  // namespace vlsparse::reference
