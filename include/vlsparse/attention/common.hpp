// vlsparse/attention/common.hpp -- options and argument checks shared by every attention backend.
//
// Conventions (docs/api.md): Q [n_q, H, d], K and V [n_k, H_kv, d], any strides;
// H % H_kv == 0 and query head h reads KV head h / (H / H_kv). Causality compares positions:
// key j (position j) is visible to query i (position n_k - n_q + i) when j <= n_k - n_q + i, so
// n_q == n_k is a prefill and n_q == 1 a decode step. scale defaults to 1 / sqrt(d).
// Include: <vlsparse/vlsparse.hpp>
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <string_view>
#include <type_traits>

#include "vlsparse/core/dtype.hpp"
#include "vlsparse/core/enum_names.hpp"
#include "vlsparse/core/error.hpp"
#include "vlsparse/core/tensor.hpp"
#include "vlsparse/detail/check.hpp"

namespace vlsparse {

struct AttentionOptions {
    float scale = 0.0f;        // softmax scale; 0 means 1 / sqrt(head_dim)
    // Fast paths: scan inputs for NaN/Inf first, and fp16/bf16 outputs for values the narrowing
    // turned into inf (an output beyond 65504 in fp16) afterwards (the reference always does both).
    bool check_finite = true;
};

// What token-sparse attention writes for query rows that are not in the kept set.
enum class UnselectedRows : std::uint8_t {
    zero,             // zero rows (the paper's "padded" outputs; the residual stream carries the token)
    attend_selected,  // the row attends to the kept keys at or before its position
};
inline constexpr EnumName<UnselectedRows> kUnselectedRowsNames[] = {{UnselectedRows::zero, "zero"},
                                                                  {UnselectedRows::attend_selected, "attend_selected"}};
constexpr std::span<const EnumName<UnselectedRows>> enum_names(UnselectedRows) { return kUnselectedRowsNames; }
constexpr std::string_view to_string(UnselectedRows u) { return enum_name(u); }

// Output element types: the input types plus double (the reference's native precision).
template <class T>
concept OutputElement = ElementType<T> || std::is_same_v<T, double>;

namespace detail {

template <class TO>
inline void store(TO& dst, double x) {
    if constexpr (std::is_same_v<TO, double>) dst = x;
    else dst = from_float<TO>(static_cast<float>(x));
}
template <class TO>
inline void store(TO& dst, float x) {
    if constexpr (std::is_same_v<TO, double>) dst = x;
    else dst = from_float<TO>(x);
}
inline double load(double x) { return x; }
template <ElementType T>
inline float load(T x) { return to_float(x); }

inline float resolve_scale(const AttentionOptions& o, std::int64_t d, const char* fn) {
    require(std::isfinite(o.scale) && o.scale >= 0.0f, fn, "scale = ", o.scale, ", expected a finite scale >= 0 (0 = 1/sqrt(d))");
    return o.scale > 0.0f ? o.scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
}

// Q [n_q, H, d] against K, V [n_k, H_kv, d].
template <class TQ, class TK>
void check_qkv(const View3<const TQ>& q, const View3<const TK>& k, const View3<const TK>& v, const char* fn) {
    check_strides(q, fn, "q", false);
    check_strides(k, fn, "k", false);
    check_strides(v, fn, "v", false);
    require(q.shape[0] > 0, fn, "q has ", q.shape[0], " tokens, expected at least one (empty input)");
    require(k.shape[0] > 0, fn, "k has ", k.shape[0], " tokens, expected at least one (empty input)");
    require(q.shape[1] > 0 && q.shape[2] > 0, fn, "q has shape [", q.shape[0], ", ", q.shape[1], ", ", q.shape[2],
            "], expected H > 0 heads and d > 0");
    require(k.shape[1] > 0, fn, "k has ", k.shape[1], " KV heads, expected > 0");
    require(k.shape[2] == q.shape[2], fn, "k has head_dim ", k.shape[2], ", q has ", q.shape[2], "; expected equal");
    require(v.shape == k.shape, fn, "v has shape [", v.shape[0], ", ", v.shape[1], ", ", v.shape[2],
            "], expected the shape of k [", k.shape[0], ", ", k.shape[1], ", ", k.shape[2], "]");
    require(q.shape[1] % k.shape[1] == 0, fn, "H = ", q.shape[1], " query heads is not a multiple of H_kv = ", k.shape[1],
            " KV heads (GQA needs H % H_kv == 0)");
}

// Q [n, H, d] and K [n, H_kv, d] of one prefill (queries and keys of the same tokens).
template <class TQ, class TK>
void check_prefill_qk(const View3<const TQ>& q, const View3<const TK>& k, const char* fn) {
    check_qkv(q, k, k, fn);
    require(q.shape[0] == k.shape[0], fn, "q has ", q.shape[0], " tokens and k has ", k.shape[0],
            ", expected equal (prefill)");
}

template <class TO, class TQ, class TK>
void check_out3(const View3<TO>& out, std::array<std::int64_t, 3> expect, const View3<const TQ>& q,
                const View3<const TK>& k, const View3<const TK>& v, const char* fn, const char* name) {
    require(out.shape == expect, fn, name, " has shape [", out.shape[0], ", ", out.shape[1], ", ", out.shape[2],
            "], expected [", expect[0], ", ", expect[1], ", ", expect[2], "]");
    check_strides(out, fn, name, true);
    check_no_alias(out, q, fn, name, "q");
    check_no_alias(out, k, fn, name, "k");
    check_no_alias(out, v, fn, name, "v");
}

}  // namespace detail
}  // namespace vlsparse
