// python/src/kv_cache.hpp -- vlsparse.KvCache: one layer's KV cache (vlsparse::KvCache<T>) that Python
// holds across decode steps, in the element type chosen when it is made (float32, float16, or bf16 as
// uint16 bits); and the model shape as a dict. Shared by the translation units of the stateful objects
// (kv.cpp: the cache, decode over it, H2O's / StreamingLLM's policies; purekv.cpp: the estimator).
//
// Threads: a method that computes with the GIL released (decode, assign, append, keep) holds the
// cache's lock meanwhile (shared to read, exclusive to change it), so that another Python thread
// cannot change the rows under it. The lock is taken after the GIL is released and never held while
// the GIL is acquired: no deadlock.
#pragma once

#include <cstdint>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <variant>

#include "common.hpp"

#include "vlsparse/core/model_shape.hpp"
#include "vlsparse/kv/kv_cache.hpp"

namespace vlsparse::python {

// The element type a dtype-like object names: float32, float16, or uint16 (bf16 bits).
inline InDType dtype_arg(const py::object& dt, const char* fn) {
    py::dtype d;
    try {
        d = py::dtype::from_args(dt);
    } catch (const py::error_already_set&) {
        throw error(fn, "dtype " + py::repr(dt).cast<std::string>() +
                            " is not a numpy dtype; expected float32, float16 or uint16 (bfloat16 bits)");
    }
    return in_dtype(py::array(d, std::vector<py::ssize_t>{0}), fn, "dtype");
}

inline py::dtype numpy_dtype(InDType t) {
    switch (t) {
        case InDType::f32: return py::dtype("float32");
        case InDType::f16: return py::dtype("float16");
        default: return py::dtype("uint16");
    }
}

// A model shape from a dict {"layers", "heads", "kv_heads", "head_dim"} (each an integer).
inline ModelShape shape_arg(const py::object& o, const char* fn) {
    const nlohmann::json j = to_json(o);
    ::vlsparse::require(j.is_object(), fn, "shape: expected a dict {'layers', 'heads', 'kv_heads', 'head_dim'}");
    ModelShape s;
    const std::pair<const char*, std::int64_t*> keys[] = {
        {"layers", &s.layers}, {"heads", &s.heads}, {"kv_heads", &s.kv_heads}, {"head_dim", &s.head_dim}};
    for (auto it = j.begin(); it != j.end(); ++it) {
        bool known = false;
        for (const auto& k : keys) known = known || it.key() == k.first;
        ::vlsparse::require(known, fn, "shape: unknown key '", it.key(), "', expected layers, heads, kv_heads, head_dim");
    }
    for (const auto& [key, dst] : keys) {
        ::vlsparse::require(j.contains(key) && j[key].is_number_integer(), fn, "shape.", key,
                        j.contains(key) ? ": expected an integer" : ": missing");
        *dst = j[key].get<std::int64_t>();
    }
    s.validate(fn);
    return s;
}

inline py::dict shape_dict(const ModelShape& s) {
    return py::dict(py::arg("layers") = s.layers, py::arg("heads") = s.heads, py::arg("kv_heads") = s.kv_heads,
                    py::arg("head_dim") = s.head_dim);
}

template <class T>
InDType in_dtype_of() {
    if constexpr (std::is_same_v<T, float>) return InDType::f32;
    else if constexpr (std::is_same_v<T, half>) return InDType::f16;
    else return InDType::bf16;
}

class PyKvCache {
public:
    using Variant = std::variant<KvCache<float>, KvCache<half>, KvCache<bfloat16>>;

    PyKvCache(std::int64_t kv_heads, std::int64_t head_dim, InDType t)
        : c_(make(kv_heads, head_dim, t)), dtype_(t) {}

    InDType dtype() const { return dtype_; }

    // f(KvCache<T>&) with the GIL released and the exclusive lock held (T: the cache's element type,
    // from dispatch(dtype(), ...); f must not touch Python objects).
    template <class T, class F>
    decltype(auto) change(F&& f) {
        py::gil_scoped_release nogil;
        std::unique_lock lock(m_);
        return f(std::get<KvCache<T>>(c_));
    }
    // The same for a caller that has released the GIL itself (and holds no lock a GIL holder waits on).
    template <class T, class F>
    decltype(auto) change_released(F&& f) {
        std::unique_lock lock(m_);
        return f(std::get<KvCache<T>>(c_));
    }
    // f(const KvCache<T>&) with the GIL released and a shared lock held.
    template <class T, class F>
    decltype(auto) read_nogil(F&& f) const {
        py::gil_scoped_release nogil;
        std::shared_lock lock(m_);
        return f(std::get<KvCache<T>>(c_));
    }
    // f(const KvCache<T>&) with the GIL held (short reads that build Python objects) and a shared lock.
    template <class T, class F>
    decltype(auto) read(F&& f) const {
        std::shared_lock lock(m_);
        return f(std::get<KvCache<T>>(c_));
    }

    // A "does the array have the cache's element type" check, for the arrays a call gives.
    void require_dtype(const py::array& a, const char* fn, const char* name) const {
        const InDType t = in_dtype(a, fn, name);
        ::vlsparse::require(t == dtype_, fn, name, " has dtype ", dtype_name(a), ", expected the cache's dtype ",
                        py::str(py::handle(numpy_dtype(dtype_))).cast<std::string>(),
                        " (all inputs of a call share one element type)");
    }

private:
    static Variant make(std::int64_t kv_heads, std::int64_t head_dim, InDType t) {
        switch (t) {
            case InDType::f32: return KvCache<float>(kv_heads, head_dim);
            case InDType::f16: return KvCache<half>(kv_heads, head_dim);
            default: return KvCache<bfloat16>(kv_heads, head_dim);
        }
    }
    Variant c_;
    InDType dtype_;
    mutable std::shared_mutex m_;
};

}  // namespace vlsparse::python
