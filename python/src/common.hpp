// python/src/common.hpp -- what the two translation units of the Python module share: numpy arrays as
// vlsparse views (zero-copy where the strides allow), results as numpy arrays, Params as dicts
// (through the library's Params <-> JSON layer), and the module's error mapping.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "vlsparse/core/dtype.hpp"
#include "vlsparse/core/error.hpp"
#include "vlsparse/core/layout.hpp"
#include "vlsparse/core/selection.hpp"
#include "vlsparse/core/tensor.hpp"

namespace vlsparse::python {

namespace py = pybind11;

// The element type of an input array: float32 -> float, float16 -> half, uint16 -> bfloat16 (the
// bits, as the golden files store bf16).
enum class InDType { f32, f16, bf16 };

inline std::string dtype_name(const py::array& a) { return py::str(py::handle(a.dtype())).cast<std::string>(); }

inline InDType in_dtype(const py::array& a, const char* fn, const char* name) {
    const py::dtype dt = a.dtype();
    const char kind = dt.kind();
    const std::string order = py::str(dt.attr("byteorder")).cast<std::string>();
    ::vlsparse::require(order != ">", fn, name, ": big-endian array, expected native byte order");
    if (kind == 'f' && dt.itemsize() == 4) return InDType::f32;
    if (kind == 'f' && dt.itemsize() == 2) return InDType::f16;
    if (kind == 'u' && dt.itemsize() == 2) return InDType::bf16;
    throw error(fn, std::string(name) + ": dtype " + dtype_name(a) +
                        ", expected float32, float16 or uint16 (bfloat16 bits)");
}

// The array itself when its strides are usable in place (non-negative multiples of the element
// size), else a C-contiguous copy. The data pointer must be aligned for the element type as well.
inline py::array usable(py::array a) {
    const auto item = a.itemsize();
    bool ok = reinterpret_cast<std::uintptr_t>(a.data()) % static_cast<std::uintptr_t>(item) == 0;
    for (py::ssize_t i = 0; i < a.ndim(); ++i) ok = ok && a.strides(i) >= 0 && a.strides(i) % item == 0;
    return ok ? a : py::array::ensure(py::module_::import("numpy").attr("ascontiguousarray")(a));
}

template <class T, int Rank>
TensorView<const T, Rank> view(const py::array& a, const char* fn, const char* name) {
    ::vlsparse::require(a.ndim() == Rank, fn, name, " has ", a.ndim(), " dimensions, expected ", Rank);
    std::array<std::int64_t, Rank> shape{}, stride{};
    for (int i = 0; i < Rank; ++i) {
        shape[static_cast<std::size_t>(i)] = a.shape(i);
        stride[static_cast<std::size_t>(i)] = a.strides(i) / static_cast<py::ssize_t>(sizeof(T));
    }
    return TensorView<const T, Rank>(static_cast<const T*>(a.data()), shape, stride);
}

// Inputs of one call: every array of the same element type (one instantiation per type).
struct Inputs {
    InDType dtype = InDType::f32;
    std::vector<py::array> arrays;  // usable(), in the order given
};

inline Inputs inputs(const char* fn, std::initializer_list<std::pair<const char*, py::array>> list) {
    Inputs in;
    bool first = true;
    const char* first_name = "";
    for (const auto& [name, a] : list) {
        const InDType t = in_dtype(a, fn, name);
        if (first) {
            in.dtype = t;
            first_name = name;
            first = false;
        } else {
            ::vlsparse::require(t == in.dtype, fn, name, " has dtype ", dtype_name(a),
                            ", expected the dtype of ", first_name, " (all inputs of a call share one element type)");
        }
        in.arrays.push_back(usable(a));
    }
    return in;
}

template <class F>
decltype(auto) dispatch(InDType t, F&& f) {
    switch (t) {
        case InDType::f32: return f(std::type_identity<float>{});
        case InDType::f16: return f(std::type_identity<half>{});
        default: return f(std::type_identity<bfloat16>{});
    }
}

// ---- results ----------------------------------------------------------------------------------

template <class T>
py::array_t<T> to_array(const std::vector<T>& v) {
    py::array_t<T> a(static_cast<py::ssize_t>(v.size()));
    std::copy(v.begin(), v.end(), a.mutable_data());
    return a;
}

// Rows of equal length as a 2-D array ([0, 0] when empty).
template <class T>
py::array_t<T> to_array(const std::vector<std::vector<T>>& m) {
    const auto rows = static_cast<py::ssize_t>(m.size());
    const auto cols = rows ? static_cast<py::ssize_t>(m[0].size()) : 0;
    py::array_t<T> a({rows, cols});
    T* p = a.mutable_data();
    for (const auto& r : m) {
        ::vlsparse::require(static_cast<py::ssize_t>(r.size()) == cols, "vlsparse (python)", "ragged rows");
        p = std::copy(r.begin(), r.end(), p);
    }
    return a;
}

inline py::list to_list_of_arrays(const std::vector<std::vector<std::int64_t>>& m) {
    py::list l;
    for (const auto& r : m) l.append(to_array(r));
    return l;
}

// ---- Params as dicts --------------------------------------------------------------------------

// A dict (or any JSON-like value) as JSON: numpy scalars and arrays count as their Python values;
// anything else JSON cannot hold is a vlsparse::error naming it.
inline nlohmann::json to_json(const py::handle& o) {
    if (o.is_none()) return nlohmann::json::object();
    const py::cpp_function numpy_values([](py::object x) -> py::object {
        if (py::hasattr(x, "tolist")) return x.attr("tolist")();
        throw error("params", "a value of type " + py::str(py::type::handle_of(x).attr("__name__")).cast<std::string>() +
                                  " (" + py::repr(x).cast<std::string>() + "), expected JSON values (numbers, strings, "
                                  "booleans, lists, dicts)");
    });
    const std::string s = py::module_::import("json").attr("dumps")(o, py::arg("default") = numpy_values).cast<std::string>();
    return nlohmann::json::parse(s);
}

inline py::object from_json(const nlohmann::json& j) {
    return py::module_::import("json").attr("loads")(j.dump());
}

// A layout spec, or None: the whole input (its first axis) is text.
inline Layout layout_arg(const py::object& layout, const py::array& x) {
    if (layout.is_none()) return Layout::text_only(x.ndim() > 0 ? x.shape(0) : 0);
    return Layout::parse(layout.cast<std::string>());
}

void bind_sim(py::module_& m);  // sim.cpp: vlsparse.golden and vlsparse.sim
// kv.cpp: vlsparse.KvCache, decode over it in each backend, H2O's / StreamingLLM's decode-time eviction
void bind_kv(py::module_& m, py::module_& ref, py::module_& simd);
// purekv.cpp: each backend's PureKVEstimator, vlsparse.purekv_masks
void bind_purekv(py::module_& m, py::module_& ref, py::module_& simd);

}  // namespace vlsparse::python
