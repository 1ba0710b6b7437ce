// vlsparse/core/tensor.hpp -- non-owning strided views over caller memory.
//
// A TensorView<T, R> is a pointer, a shape and strides in elements (not bytes), passed by value.
// Attention inputs are rank-3 views [n_tokens, n_heads, head_dim] ("token-major", the layout most C++
// engines hold); any strides are accepted, so a [n_heads, n_tokens, head_dim] buffer is viewed with
// strides {d, n*d, 1}. T is float, vlsparse::half or vlsparse::bfloat16 (const for inputs).
// Include: <vlsparse/vlsparse.hpp>
#pragma once

#include <array>
#include <cstdint>
#include <type_traits>

#include "vlsparse/core/config.hpp"
#include "vlsparse/core/dtype.hpp"

namespace vlsparse {

template <class T, int Rank>
struct TensorView {
    static_assert(Rank >= 1 && Rank <= 4, "TensorView supports rank 1 to 4");
    using element_type = T;
    static constexpr int rank = Rank;

    T* data = nullptr;
    std::array<std::int64_t, Rank> shape{};
    std::array<std::int64_t, Rank> stride{};

    TensorView() = default;
    VLSPARSE_HD TensorView(T* p, std::array<std::int64_t, Rank> shp, std::array<std::int64_t, Rank> str)
        : data(p), shape(shp), stride(str) {}
    // Contiguous (row-major) view of `shp`.
    VLSPARSE_HD TensorView(T* p, std::array<std::int64_t, Rank> shp) : data(p), shape(shp) {
        std::int64_t s = 1;
        for (int i = Rank - 1; i >= 0; --i) {
            stride[i] = s;
            s *= shp[i];
        }
    }
    // A view of T converts to a view of const T.
    template <class U, class = std::enable_if_t<std::is_same_v<const U, T> && !std::is_same_v<U, T>>>
    VLSPARSE_HD TensorView(const TensorView<U, Rank>& o) : data(o.data), shape(o.shape), stride(o.stride) {}

    VLSPARSE_HD std::int64_t size(int dim) const { return shape[dim]; }
    VLSPARSE_HD std::int64_t numel() const {
        std::int64_t n = 1;
        for (int i = 0; i < Rank; ++i) n *= shape[i];
        return n;
    }
    VLSPARSE_HD bool empty() const { return numel() == 0; }
    // True when the innermost dimension has unit stride and the others are packed row-major.
    VLSPARSE_HD bool is_contiguous() const {
        std::int64_t s = 1;
        for (int i = Rank - 1; i >= 0; --i) {
            if (shape[i] != 1 && stride[i] != s) return false;
            s *= shape[i];
        }
        return true;
    }

    template <class... I>
    VLSPARSE_HD T& operator()(I... idx) const {
        static_assert(sizeof...(I) == Rank, "wrong number of indices");
        const std::int64_t ix[Rank] = {static_cast<std::int64_t>(idx)...};
        std::int64_t off = 0;
        for (int i = 0; i < Rank; ++i) off += ix[i] * stride[i];
        return data[off];
    }
    // Pointer to the start of the innermost row at the given leading indices.
    template <class... I>
    VLSPARSE_HD T* row(I... idx) const {
        static_assert(sizeof...(I) == Rank - 1, "row() takes rank-1 indices");
        const std::int64_t ix[Rank - 1] = {static_cast<std::int64_t>(idx)...};
        std::int64_t off = 0;
        for (int i = 0; i < Rank - 1; ++i) off += ix[i] * stride[i];
        return data + off;
    }
};

template <class T>
using View1 = TensorView<T, 1>;
template <class T>
using View2 = TensorView<T, 2>;
template <class T>
using View3 = TensorView<T, 3>;

// [n_tokens, n_heads, head_dim] contiguous view of an engine buffer.
template <class T>
VLSPARSE_HD TensorView<T, 3> token_major(T* p, std::int64_t n_tokens, std::int64_t n_heads, std::int64_t head_dim) {
    return TensorView<T, 3>(p, {n_tokens, n_heads, head_dim});
}

// View of a [n_heads, n_tokens, head_dim] buffer, presented as [n_tokens, n_heads, head_dim].
template <class T>
VLSPARSE_HD TensorView<T, 3> head_major(T* p, std::int64_t n_tokens, std::int64_t n_heads, std::int64_t head_dim) {
    return TensorView<T, 3>(p, {n_tokens, n_heads, head_dim}, {head_dim, n_tokens * head_dim, 1});
}

}  // namespace vlsparse
