// python/src/module.cpp -- the Python module `vlsparse` (pybind11): the algorithms of the library on
// numpy arrays, once per backend (vlsparse.reference: the exact scalar reference; vlsparse.simd: the
// SIMD path), with the same names and arguments. vlsparse.golden and vlsparse.sim are in sim.cpp; the
// stateful objects (vlsparse.KvCache and decode over it, H2O's / StreamingLLM's policies, PureKV's
// estimator) in kv.cpp and purekv.cpp.
//
// Arrays: float32, float16 or uint16 (bfloat16 bits, the golden files' convention); all inputs of one
// call share one element type; read in place through their strides (a copy only for negative strides
// or strides that are not a multiple of the element size). Outputs are new float32 (attention) or
// float64 (scores) arrays. Params: dicts with the keys of the C++ Params' JSON form (io/*_json.hpp);
// missing keys keep their defaults, unknown keys are an error. docs/python.md describes it all.
#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "common.hpp"

#include "vlsparse/attention/batched_decode.hpp"
#include "vlsparse/attention/decode.hpp"
#include "vlsparse/io/params_json.hpp"
#include "vlsparse/kv/kv_cache.hpp"
#include "vlsparse/masks/block_mask.hpp"
#include "vlsparse/masks/flops.hpp"
#include "vlsparse/masks/templates.hpp"
#include "vlsparse/policies/avl.hpp"
#include "vlsparse/policies/baselines.hpp"
#include "vlsparse/policies/blindsight.hpp"
#include "vlsparse/policies/purekv.hpp"
#include "vlsparse/policies/zipvl.hpp"
#include "vlsparse/reference/avl.hpp"
#include "vlsparse/reference/batched_decode.hpp"
#include "vlsparse/reference/baselines.hpp"
#include "vlsparse/reference/blindsight.hpp"
#include "vlsparse/reference/purekv.hpp"
#include "vlsparse/reference/zipvl.hpp"

namespace vlsparse::python {

namespace {

using namespace pybind11::literals;

// ---- the two backends -------------------------------------------------------------------------

// One backend: the library's ops type of each algorithm on that path (reference:: or simd::), and the
// functions no ops type carries (attention, the baselines' selections, PureKV's validation and ST
// prefill) from the same namespace.
template <bool kSimd>
struct Path {
    template <class R, class S> using Pick = std::conditional_t<kSimd, S, R>;
    using ZipVL = Pick<reference::ZipVLOps, simd::ZipVLOps>;
    using Avl = Pick<reference::AvlOps, simd::AvlOps>;
    using Baseline = Pick<reference::BaselineOps, simd::BaselineOps>;
    using BlindSight = Pick<reference::BlindSightOps, simd::BlindSightOps>;
    using PureKV = Pick<reference::PureKVOps, simd::PureKVOps>;

    template <class... A> static void dense(A&&... a) {
        if constexpr (kSimd) simd::dense_attention(std::forward<A>(a)...);
        else reference::dense_attention(std::forward<A>(a)...);
    }
    template <class... A> static void sparse(A&&... a) {
        if constexpr (kSimd) simd::sparse_attention(std::forward<A>(a)...);
        else reference::sparse_attention(std::forward<A>(a)...);
    }
    template <class... A> static void decode(A&&... a) {
        if constexpr (kSimd) simd::decode_attention(std::forward<A>(a)...);
        else reference::decode_attention(std::forward<A>(a)...);
    }
    template <class... A> static void batched_decode(A&&... a) {
        if constexpr (kSimd) simd::batched_decode_attention(std::forward<A>(a)...);
        else reference::batched_decode_attention(std::forward<A>(a)...);
    }
    template <class... A> static TokenSelection h2o_select(A&&... a) {
        if constexpr (kSimd) return simd::h2o_select(std::forward<A>(a)...);
        else return reference::h2o_select(std::forward<A>(a)...);
    }
    template <class... A> static TokenSelection snapkv_select(A&&... a) {
        if constexpr (kSimd) return simd::snapkv_select(std::forward<A>(a)...);
        else return reference::snapkv_select(std::forward<A>(a)...);
    }
    template <class... A> static TokenSelection fastv_select(A&&... a) {
        if constexpr (kSimd) return simd::fastv_select(std::forward<A>(a)...);
        else return reference::fastv_select(std::forward<A>(a)...);
    }
    template <class... A> static PureKVLayerValidation purekv_validate(A&&... a) {
        if constexpr (kSimd) return simd::purekv_validate(std::forward<A>(a)...);
        else return reference::purekv_validate(std::forward<A>(a)...);
    }
    template <class... A> static void purekv_st_attention(A&&... a) {
        if constexpr (kSimd) simd::purekv_st_attention(std::forward<A>(a)...);
        else reference::purekv_st_attention(std::forward<A>(a)...);
    }
};

// ---- helpers ----------------------------------------------------------------------------------

template <class T> using V3 = View3<const T>;
template <class T> using V2 = View2<const T>;

py::array_t<float> new_f32(std::initializer_list<py::ssize_t> shape) { return py::array_t<float>(std::vector<py::ssize_t>(shape)); }

// A new float32 array of q's shape (the output of an attention), after checking q's rank.
py::array_t<float> new_like(const py::array& q, int rank, const char* fn) {
    ::vlsparse::require(q.ndim() == rank, fn, "q has ", q.ndim(), " dimensions, expected ", rank);
    return py::array_t<float>(std::vector<py::ssize_t>(q.shape(), q.shape() + rank));
}

View3<float> out3(py::array_t<float>& a) { return View3<float>(a.mutable_data(), {a.shape(0), a.shape(1), a.shape(2)}); }
View2<float> out2(py::array_t<float>& a) { return View2<float>(a.mutable_data(), {a.shape(0), a.shape(1)}); }

AttentionOptions attention_options(float scale, bool check_finite) { return AttentionOptions{scale, check_finite}; }

// Enum values by their names (the tables next to the enums, as the Params' JSON spells them).
template <class E>
E enum_arg(const std::string& s, const char* fn, const char* arg) {
    if (const auto e = enum_from_name<E>(s)) return *e;
    throw error(fn, std::string(arg) + " = '" + s + "', expected one of " + enum_name_list<E>());
}
UnselectedRows unselected_arg(const std::string& s, const char* fn) { return enum_arg<UnselectedRows>(s, fn, "unselected"); }
BaselineGroups groups_arg(const std::string& s, const char* fn) { return enum_arg<BaselineGroups>(s, fn, "groups"); }
AvlTextGroups text_groups_arg(const std::string& s, const char* fn) { return enum_arg<AvlTextGroups>(s, fn, "groups"); }

ZipVLParams zipvl_params(const py::object& p) { return zipvl_params_from_json(to_json(p), "params."); }
PureKVParams purekv_params(const py::object& p) { return purekv_params_from_json(to_json(p), "params."); }
BlindSightParams blindsight_params(const py::object& p) { return blindsight_params_from_json(to_json(p), "params."); }
AvlParams avl_params(const py::object& p) { return ::vlsparse::avl_params_from_json(to_json(p), "params."); }

py::array_t<std::uint8_t> selection_mask(const TokenSelection& s) {
    const auto G = static_cast<py::ssize_t>(s.indices.size());
    py::array_t<std::uint8_t> m({G, static_cast<py::ssize_t>(s.n)});
    std::fill(m.mutable_data(), m.mutable_data() + m.size(), std::uint8_t{0});
    for (py::ssize_t g = 0; g < G; ++g)
        for (auto j : s.indices[static_cast<std::size_t>(g)]) m.mutable_data()[g * s.n + j] = 1;
    return m;
}

// The KV cache of one layer built from K/V [m, H_kv, d] (positions 0 .. m-1), as an engine holds it.
template <class T>
KvCache<T> cache_from(V3<T> k, V3<T> v) {
    KvCache<T> c(k.shape[1], k.shape[2]);
    c.assign(k, v);
    return c;
}

template <class T>
py::list cache_contents(const KvCache<T>& c) {
    py::list heads;
    for (std::int64_t g = 0; g < c.n_kv_heads(); ++g) {
        const auto pos = c.positions(g);
        const auto rows = static_cast<py::ssize_t>(pos.size()), d = static_cast<py::ssize_t>(c.head_dim());
        py::dtype dt = std::is_same_v<T, float> ? py::dtype("float32") : std::is_same_v<T, half> ? py::dtype("float16") : py::dtype("uint16");
        py::array kk(dt, {rows, d}), vv(dt, {rows, d});
        std::copy_n(reinterpret_cast<const char*>(c.k(g).data), rows * d * sizeof(T), static_cast<char*>(kk.mutable_data()));
        std::copy_n(reinterpret_cast<const char*>(c.v(g).data), rows * d * sizeof(T), static_cast<char*>(vv.mutable_data()));
        heads.append(py::dict("positions"_a = to_array(std::vector<std::int64_t>(pos.begin(), pos.end())), "k"_a = kk, "v"_a = vv));
    }
    return heads;
}

// ---- one backend's functions ------------------------------------------------------------------

template <class B>
void bind_backend(py::module_& m) {

    m.def("dense_attention", [](py::array q, py::array k, py::array v, float scale, bool check_finite) {
        const Inputs in = inputs("dense_attention", {{"q", q}, {"k", k}, {"v", v}});
        auto out = new_like(q, 3, "dense_attention");
        dispatch(in.dtype, [&](auto tag) {
            using T = typename decltype(tag)::type;
            const auto Q = view<T, 3>(in.arrays[0], "dense_attention", "q"), K = view<T, 3>(in.arrays[1], "dense_attention", "k"),
                       Vv = view<T, 3>(in.arrays[2], "dense_attention", "v");
            py::gil_scoped_release nogil;
            B::dense(Q, K, Vv, out3(out), attention_options(scale, check_finite));
        });
        return out;
    }, "q"_a, "k"_a, "v"_a, py::kw_only(), "scale"_a = 0.0f, "check_finite"_a = true,
       "Causal dense attention. q [n, H, d], k, v [n, H_kv, d] -> out [n, H, d] float32.");

    m.def("sparse_attention", [](py::array q, py::array k, py::array v, const TokenSelection& sel, const std::string& unselected,
                                 float scale, bool check_finite) {
        const Inputs in = inputs("sparse_attention", {{"q", q}, {"k", k}, {"v", v}});
        auto out = new_like(q, 3, "sparse_attention");
        const UnselectedRows u = unselected_arg(unselected, "sparse_attention");
        dispatch(in.dtype, [&](auto tag) {
            using T = typename decltype(tag)::type;
            const auto Q = view<T, 3>(in.arrays[0], "sparse_attention", "q"), K = view<T, 3>(in.arrays[1], "sparse_attention", "k"),
                       Vv = view<T, 3>(in.arrays[2], "sparse_attention", "v");
            py::gil_scoped_release nogil;
            B::sparse(Q, K, Vv, sel, out3(out), u, attention_options(scale, check_finite));
        });
        return out;
    }, "q"_a, "k"_a, "v"_a, "selection"_a, py::kw_only(), "unselected"_a = "zero", "scale"_a = 0.0f, "check_finite"_a = true,
       "Token-sparse causal attention over a TokenSelection -> out [n, H, d] float32.");

    m.def("decode_attention", [](py::array q, py::array k, py::array v, float scale, bool check_finite) {
        const Inputs in = inputs("decode_attention", {{"q", q}, {"k", k}, {"v", v}});
        auto out = new_like(q, 2, "decode_attention");
        dispatch(in.dtype, [&](auto tag) {
            using T = typename decltype(tag)::type;
            const auto Q = view<T, 2>(in.arrays[0], "decode_attention", "q");
            const auto K = view<T, 3>(in.arrays[1], "decode_attention", "k"), Vv = view<T, 3>(in.arrays[2], "decode_attention", "v");
            py::gil_scoped_release nogil;
            const KvCache<T> cache = cache_from(K, Vv);
            B::decode(Q, cache, out2(out), attention_options(scale, check_finite));
        });
        return out;
    }, "q"_a, "k"_a, "v"_a, py::kw_only(), "scale"_a = 0.0f, "check_finite"_a = true,
       "One decode step: q [H, d] (the newest token) attends to every cached row, k, v [m, H_kv, d] (its own "
       "K/V included, positions 0 .. m-1) -> out [H, d] float32.");

    m.def("batched_decode_attention", [](py::array q, py::array k, py::array v, py::object seq_lens, py::object q_indptr,
                                         py::object block_table, py::object list_indptr, py::object list_indices,
                                         std::int32_t lists_per_seq, float scale, bool check_finite) {
        constexpr const char* fn = "batched_decode_attention";
        Inputs in = inputs(fn, {{"q", q}, {"k", k}, {"v", v}});
        py::array& K = in.arrays[1];
        py::array& Vv = in.arrays[2];
        ::vlsparse::require(K.ndim() == 4 && Vv.ndim() == 4, fn, "k and v have ", K.ndim(), " and ", Vv.ndim(),
                        " dimensions, expected 4: [B, capacity, H_kv, d] (contiguous) or [n_pages, page_size, H_kv, d] "
                        "(paged; an HND pool as a transposed view)");
        // One set of strides describes both K and V, with head_dim contiguous: otherwise both are copied.
        const auto item = K.itemsize();
        bool same = K.strides(3) == item;
        for (int i = 0; i < 4; ++i) same = same && K.shape(i) == Vv.shape(i) && K.strides(i) == Vv.strides(i);
        if (!same) {
            auto np = py::module_::import("numpy");
            K = py::array::ensure(np.attr("ascontiguousarray")(K));
            Vv = py::array::ensure(np.attr("ascontiguousarray")(Vv));
        }
        using I32 = py::array_t<std::int32_t, py::array::c_style | py::array::forcecast>;
        auto i32 = [&](const py::object& o, const char* name) {
            I32 a = I32::ensure(o);
            ::vlsparse::require(a && a.ndim() <= 2, fn, name, ": expected an array of integers");
            return a;
        };
        const auto lens = i32(seq_lens, "seq_lens");
        const auto qptr = q_indptr.is_none() ? I32(0) : i32(q_indptr, "q_indptr");
        const auto table = block_table.is_none() ? I32(0) : i32(block_table, "block_table");
        const auto lptr = list_indptr.is_none() ? I32(0) : i32(list_indptr, "list_indptr");
        const auto lidx = list_indices.is_none() ? I32(0) : i32(list_indices, "list_indices");
        ::vlsparse::require(list_indptr.is_none() == list_indices.is_none(), fn, "list_indptr and list_indices go together");
        ::vlsparse::require(block_table.is_none() || table.ndim() == 2, fn, "block_table has ", table.ndim(),
                        " dimensions, expected 2: [batch, pages per sequence]");
        auto out = new_like(q, 3, fn);
        const auto batch = static_cast<std::int32_t>(lens.size());
        const std::int32_t paged = block_table.is_none() ? 0 : 1;
        dispatch(in.dtype, [&](auto tag) {
            using T = typename decltype(tag)::type;
            const auto Q = view<T, 3>(in.arrays[0], fn, "q");
            const auto e = static_cast<std::int64_t>(sizeof(T));
            KvBatchView<const T> cache{static_cast<const T*>(K.data()), static_cast<const T*>(Vv.data()),
                                       paged ? batch : static_cast<std::int32_t>(K.shape(0)), static_cast<std::int32_t>(K.shape(2)),
                                       static_cast<std::int32_t>(K.shape(3)), K.shape(1), K.strides(0) / e, K.strides(1) / e,
                                       K.strides(2) / e, paged ? K.shape(0) : 0, paged ? table.data() : nullptr,
                                       paged ? table.shape(1) : 0, lens.data()};
            ::vlsparse::require(paged || K.shape(0) == batch, fn, "k holds ", K.shape(0), " sequences, seq_lens ", batch, "; expected equal");
            const BatchRowLists lists{list_indptr.is_none() ? nullptr : lptr.data(), list_indptr.is_none() ? nullptr : lidx.data(),
                                      lists_per_seq};
            const DecodeBatchHost meta{std::span<const std::int32_t>(lens.data(), static_cast<std::size_t>(lens.size())),
                                       std::span<const std::int32_t>(qptr.data(), static_cast<std::size_t>(qptr.size())),
                                       std::span<const std::int32_t>(lptr.data(), static_cast<std::size_t>(lptr.size())),
                                       lists_per_seq};
            py::gil_scoped_release nogil;
            B::batched_decode(Q, cache, lists, meta, out3(out), attention_options(scale, check_finite));
        });
        return out;
    }, "q"_a, "k"_a, "v"_a, "seq_lens"_a, py::kw_only(), "q_indptr"_a = py::none(), "block_table"_a = py::none(),
       "list_indptr"_a = py::none(), "list_indices"_a = py::none(), "lists_per_seq"_a = 1, "scale"_a = 0.0f,
       "check_finite"_a = true,
       "A decode step of a batch, reading the caches in place (<vlsparse/kv/kv_batch.hpp>): q [total_q, H, d]; k, v "
       "[B, capacity, H_kv, d] (contiguous) or, with block_table [B, pages per sequence], a page pool [n_pages, "
       "page_size, H_kv, d] (NHD; an HND pool [n_pages, H_kv, page_size, d] passed as .transpose(0, 2, 1, 3)); "
       "seq_lens [B] rows each sequence holds (the new tokens included); q_indptr [B + 1] for several queries per "
       "sequence; list_indptr / list_indices: CSR row lists (lists_per_seq 1 or H_kv) -> out [total_q, H, d] float32.");

    // ---- ZipVL
    m.def("zipvl_select", [](py::array q, py::array k, py::object layout, std::int64_t layer, py::object params,
                             std::optional<std::vector<std::int64_t>> probes) {
        const Inputs in = inputs("zipvl_select", {{"q", q}, {"k", k}});
        const ZipVLParams P = zipvl_params(params);
        const Layout L = layout_arg(layout, q);
        const std::vector<std::int64_t> pr = probes.value_or(std::vector<std::int64_t>{});
        return dispatch(in.dtype, [&](auto tag) {
            using T = typename decltype(tag)::type;
            const auto Q = view<T, 3>(in.arrays[0], "zipvl_select", "q"), K = view<T, 3>(in.arrays[1], "zipvl_select", "k");
            py::gil_scoped_release nogil;
            return B::ZipVL::select(Q, K, L, layer, P, std::span<const std::int64_t>(pr));
        });
    }, "q"_a, "k"_a, "layout"_a = py::none(), "layer"_a = 0, "params"_a = py::none(), "probes"_a = py::none(),
       "ZipVL's selection of one layer (probes, scores, p, kept sets) -> ZipVLSelection.");

    m.def("zipvl_prefill", [](py::array q, py::array k, py::array v, const ZipVLSelection& s, py::object params) {
        const Inputs in = inputs("zipvl_prefill", {{"q", q}, {"k", k}, {"v", v}});
        const ZipVLParams P = zipvl_params(params);
        auto out = new_like(q, 3, "zipvl_prefill");
        dispatch(in.dtype, [&](auto tag) {
            using T = typename decltype(tag)::type;
            const auto Q = view<T, 3>(in.arrays[0], "zipvl_prefill", "q"), K = view<T, 3>(in.arrays[1], "zipvl_prefill", "k"),
                       Vv = view<T, 3>(in.arrays[2], "zipvl_prefill", "v");
            py::gil_scoped_release nogil;
            B::ZipVL::prefill(Q, K, Vv, s, out3(out), P);
        });
        return out;
    }, "q"_a, "k"_a, "v"_a, "selection"_a, "params"_a = py::none(),
       "ZipVL's token-sparse prefill (Algorithm 1) -> out [n, H, d] float32.");

    // KV eviction has one implementation (vlsparse::zipvl_evict); here for symmetry.
    m.def("zipvl_evict", [](py::array k, py::array v, const ZipVLSelection& s) {
        const Inputs in = inputs("zipvl_evict", {{"k", k}, {"v", v}});
        return dispatch(in.dtype, [&](auto tag) {
            using T = typename decltype(tag)::type;
            KvCache<T> cache = cache_from(view<T, 3>(in.arrays[0], "zipvl_evict", "k"), view<T, 3>(in.arrays[1], "zipvl_evict", "v"));
            zipvl_evict(cache, s);
            return cache_contents(cache);
        });
    }, "k"_a, "v"_a, "selection"_a,
       "The KV cache after ZipVL's eviction: per KV head a dict positions [rows] int64, k, v [rows, d] (input dtype).");

    // ---- A-VL
    m.def("avl_scores", [](py::array q, py::array k, float scale, bool check_finite) {
        const Inputs in = inputs("avl_scores", {{"q", q}, {"k", k}});
        return to_array(dispatch(in.dtype, [&](auto tag) {
            using T = typename decltype(tag)::type;
            const auto Q = view<T, 3>(in.arrays[0], "avl_scores", "q"), K = view<T, 3>(in.arrays[1], "avl_scores", "k");
            py::gil_scoped_release nogil;
            return B::Avl::scores(Q, K, attention_options(scale, check_finite));
        }));
    }, "q"_a, "k"_a, py::kw_only(), "scale"_a = 0.0f, "check_finite"_a = true,
       "A-VL's score of every key: the last query row's attention averaged over the query heads -> [n_k] float64.");

    m.def("avl_h2o_scores", [](py::array q, py::array k, const std::string& groups, float scale, bool check_finite) {
        const Inputs in = inputs("avl_h2o_scores", {{"q", q}, {"k", k}});
        const AvlTextGroups g = text_groups_arg(groups, "avl_h2o_scores");
        return to_array(dispatch(in.dtype, [&](auto tag) {
            using T = typename decltype(tag)::type;
            const auto Q = view<T, 3>(in.arrays[0], "avl_h2o_scores", "q"), K = view<T, 3>(in.arrays[1], "avl_h2o_scores", "k");
            py::gil_scoped_release nogil;
            return B::Avl::h2o(Q, K, g, attention_options(scale, check_finite));
        }));
    }, "q"_a, "k"_a, "groups"_a = "per_kv_head", py::kw_only(), "scale"_a = 0.0f, "check_finite"_a = true,
       "H2O's accumulated attention over the causal prefill -> [G, n_k] float64.");

    m.def("avl_prefill_select", [](py::array q, py::array k, py::object layout, py::object params) {
        const Inputs in = inputs("avl_prefill_select", {{"q", q}, {"k", k}});
        const AvlParams P = avl_params(params);
        const Layout L = layout_arg(layout, k);
        return dispatch(in.dtype, [&](auto tag) {
            using T = typename decltype(tag)::type;
            const auto Q = view<T, 3>(in.arrays[0], "avl_prefill_select", "q"), K = view<T, 3>(in.arrays[1], "avl_prefill_select", "k");
            py::gil_scoped_release nogil;
            const std::vector<double> scores = B::Avl::scores(Q, K, AttentionOptions{});
            std::vector<std::vector<std::int64_t>> text;
            if (P.text_rate > 0.0) {
                const std::int64_t group = P.text_groups == AvlTextGroups::per_kv_head ? 1 : Q.shape[1] / K.shape[1];
                text = avl_text_h2o(B::Avl::h2o(Q, K, P.text_groups, AttentionOptions{}), L, P, group);
            }
            return avl_select(scores, L, P, {}, text);
        });
    }, "q"_a, "k"_a, "layout"_a = py::none(), "params"_a = py::none(),
       "A-VL after prefill: scores, H2O's text choice when text_rate > 0, kept and core sets -> AvlSelection.");

    m.def("avl_decode", [](const AvlSelection& sel, py::array k, py::array v, py::array dq, py::array dk, py::array dv,
                           py::object params, float scale, bool check_finite) {
        const Inputs in = inputs("avl_decode", {{"k", k}, {"v", v}, {"decode_q", dq}, {"decode_k", dk}, {"decode_v", dv}});
        const AvlParams P = avl_params(params);
        const py::ssize_t S = dq.ndim() == 3 ? dq.shape(0) : 0, H = dq.ndim() == 3 ? dq.shape(1) : 0,
                          d = dq.ndim() == 3 ? dq.shape(2) : 0;
        auto out = new_f32({S, H, d});
        const std::int64_t n = sel.n;
        const auto G = static_cast<std::int64_t>(sel.kept.groups());
        py::array_t<std::uint8_t> core({S, static_cast<py::ssize_t>(n)}), read({S, static_cast<py::ssize_t>(G), static_cast<py::ssize_t>(n + S)}),
            refresh(S);
        py::array_t<double> refresh_scores({S, static_cast<py::ssize_t>(n)});
        std::fill_n(refresh_scores.mutable_data(), refresh_scores.size(), 0.0);
        std::fill_n(core.mutable_data(), core.size(), 0);
        std::fill_n(read.mutable_data(), read.size(), 0);
        std::fill_n(refresh.mutable_data(), refresh.size(), 0);
        dispatch(in.dtype, [&](auto tag) {
            using T = typename decltype(tag)::type;
            const char* fn = "avl_decode";
            const auto K = view<T, 3>(in.arrays[0], fn, "k"), Vv = view<T, 3>(in.arrays[1], fn, "v");
            const auto DQ = view<T, 3>(in.arrays[2], fn, "decode_q"), DK = view<T, 3>(in.arrays[3], fn, "decode_k"),
                       DV = view<T, 3>(in.arrays[4], fn, "decode_v");
            ::vlsparse::require(K.shape[0] == n, fn, "k has ", K.shape[0], " rows, the selection covers n = ", n, "; expected equal");
            ::vlsparse::require(DK.shape[0] == S && DV.shape[0] == S, fn, "decode_k and decode_v need ", S, " steps like decode_q");
            py::gil_scoped_release nogil;
            KvCache<T> cache = cache_from(K, Vv);
            cache.keep(sel.kept);
            DecodeSchedule sch(sel, P);
            auto* om = out.mutable_data();
            for (std::int64_t t = 0; t < S; ++t) {
                cache.append(View2<const T>(DK.row(t, 0), {DK.shape[1], DK.shape[2]}, {DK.stride[1], DK.stride[2]}),
                             View2<const T>(DV.row(t, 0), {DV.shape[1], DV.shape[2]}, {DV.stride[1], DV.stride[2]}));
                const AvlStep st = B::Avl::decode_step(View2<const T>(DQ.row(t, 0), {H, d}, {DQ.stride[1], DQ.stride[2]}), cache, sch, t,
                                                      View2<float>(om + t * H * d, {H, d}), attention_options(scale, check_finite));
                for (auto p : sch.core()) core.mutable_data()[t * n + p] = 1;
                for (std::int64_t g = 0; g < G; ++g)
                    for (auto p : st.read.indices[static_cast<std::size_t>(g)]) read.mutable_data()[(t * G + g) * (n + S) + p] = 1;
                refresh.mutable_data()[t] = st.refresh ? 1 : 0;
                if (st.refresh)
                    for (const auto& [p, score] : sch.last_refresh_scores()) refresh_scores.mutable_data()[t * n + p] = score;
            }
        });
        return py::dict("out"_a = out, "core_mask"_a = core, "read_mask"_a = read, "refresh"_a = refresh,
                        "refresh_scores"_a = refresh_scores);
    }, "selection"_a, "k"_a, "v"_a, "decode_q"_a, "decode_k"_a, "decode_v"_a, "params"_a = py::none(), py::kw_only(),
       "scale"_a = 0.0f, "check_finite"_a = true,
       "A-VL's decode: the prefill cache k, v [n, H_kv, d] keeps the selection, then S steps (decode_q [S, H, d], "
       "decode_k, decode_v [S, H_kv, d]) by the schedule -> dict out [S, H, d], core_mask [S, n], read_mask "
       "[S, G, n + S], refresh [S], refresh_scores [S, n] (a refresh step's head-mean attention of the kept image "
       "positions that re-ranked the core set; 0 elsewhere).");

    // ---- PureKV
    m.def("purekv_window_scores", [](py::array q, py::array k, std::int64_t layer, py::object params) {
        const Inputs in = inputs("purekv_window_scores", {{"q", q}, {"k", k}});
        const PureKVParams P = purekv_params(params);
        return dispatch(in.dtype, [&](auto tag) {
            using T = typename decltype(tag)::type;
            const auto Q = view<T, 3>(in.arrays[0], "purekv_window_scores", "q"), K = view<T, 3>(in.arrays[1], "purekv_window_scores", "k");
            py::gil_scoped_release nogil;
            return B::PureKV::window_scores(Q, K, layer, P);
        });
    }, "q"_a, "k"_a, "layer"_a, "params"_a = py::none(), "PureKV's Eq. 2 window scores of one layer -> PureKVScores.");

    m.def("purekv_select", [](const PureKVScores& s, py::array v, std::int64_t layer, py::object params) {
        const Inputs in = inputs("purekv_select", {{"v", v}});
        const PureKVParams P = purekv_params(params);
        return dispatch(in.dtype, [&](auto tag) {
            using T = typename decltype(tag)::type;
            const auto Vv = view<T, 3>(in.arrays[0], "purekv_select", "v");
            py::gil_scoped_release nogil;
            return B::PureKV::select(s, Vv, layer, P);
        });
    }, "scores"_a, "v"_a, "layer"_a, "params"_a = py::none(),
       "PureKV's importance (Eq. 3-4) and kept set of layer `layer` from `scores` (its own, or layer l0's) -> PureKVSelection.");

    m.def("purekv_validate", [](const PureKVScores& l0_scores, py::array q, py::array k, py::array v, std::int64_t layer,
                                py::object params) {
        const char* fn = "purekv_validate";
        const Inputs in = inputs(fn, {{"q", q}, {"k", k}, {"v", v}});
        const PureKVParams P = purekv_params(params);
        const PureKVLayerValidation r = dispatch(in.dtype, [&](auto tag) {
            using T = typename decltype(tag)::type;
            const auto Q = view<T, 3>(in.arrays[0], fn, "q"), K = view<T, 3>(in.arrays[1], fn, "k"), Vv = view<T, 3>(in.arrays[2], fn, "v");
            py::gil_scoped_release nogil;
            return B::purekv_validate(l0_scores, Q, K, Vv, layer, P);
        });
        py::list groups;
        for (const auto& g : r.groups) groups.append(py::dict("rho"_a = g.rho, "p_value"_a = g.p_value, "n"_a = g.n));
        return groups;
    }, "l0_scores"_a, "q"_a, "k"_a, "v"_a, "layer"_a, "params"_a = py::none(),
       "PureKV's validation (Eq. 5-7) of layer `layer`: Spearman between the cross-layer estimate (l0's scores times "
       "the layer's ||V||) and the layer's own, per group -> list of {'rho', 'p_value', 'n'}.");

    m.def("purekv_st_attention", [](py::array q, py::array k, py::array v, py::object layout, py::object params) {
        const Inputs in = inputs("purekv_st_attention", {{"q", q}, {"k", k}, {"v", v}});
        const PureKVParams P = purekv_params(params);
        const Layout L = layout_arg(layout, q);
        auto out = new_like(q, 3, "purekv_st_attention");
        dispatch(in.dtype, [&](auto tag) {
            using T = typename decltype(tag)::type;
            const char* fn = "purekv_st_attention";
            const auto Q = view<T, 3>(in.arrays[0], fn, "q"), K = view<T, 3>(in.arrays[1], fn, "k"), Vv = view<T, 3>(in.arrays[2], fn, "v");
            py::gil_scoped_release nogil;
            B::purekv_st_attention(Q, K, Vv, L, out3(out), P);
        });
        return out;
    }, "q"_a, "k"_a, "v"_a, "layout"_a, "params"_a = py::none(),
       "PureKV's ST-SpAttn prefill (the spatial-temporal video mask) -> out [n, H, d] float32.");

    // ---- BlindSight
    m.def("masked_attention", [](py::array q, py::array k, py::array v, py::object layout, std::vector<std::string> templates,
                                 py::object params) {
        const Inputs in = inputs("masked_attention", {{"q", q}, {"k", k}, {"v", v}});
        const BlindSightParams P = blindsight_params(params);
        const Layout L = layout_arg(layout, q);
        std::vector<MaskTemplate> heads;
        for (const auto& t : templates) heads.push_back(mask_template_from_string(t, "masked_attention"));
        if (heads.size() == 1 && q.ndim() == 3) heads.assign(static_cast<std::size_t>(q.shape(1)), heads[0]);
        auto out = new_like(q, 3, "masked_attention");
        dispatch(in.dtype, [&](auto tag) {
            using T = typename decltype(tag)::type;
            const char* fn = "masked_attention";
            const auto Q = view<T, 3>(in.arrays[0], fn, "q"), K = view<T, 3>(in.arrays[1], fn, "k"), Vv = view<T, 3>(in.arrays[2], fn, "v");
            L.require_tokens(Q.shape[0], fn);
            py::gil_scoped_release nogil;
            const MaskContext ctx = make_mask_context(L, P.mask);
            B::BlindSight::masked(Q, K, Vv, ctx, heads, out3(out), AttentionOptions{P.scale, P.check_finite});
        });
        return out;
    }, "q"_a, "k"_a, "v"_a, "layout"_a, "templates"_a, "params"_a = py::none(),
       "BlindSight's template-masked attention: one template per query head ('Dense', 'Sink', 'Document', "
       "'Document-Sink'; one name applies to every head) -> out [n, H, d] float32.");

    m.def("blindsight_characterize", [](py::array q, py::array k, py::array v, py::object layout, py::object params) {
        const Inputs in = inputs("blindsight_characterize", {{"q", q}, {"k", k}, {"v", v}});
        const BlindSightParams P = blindsight_params(params);
        const Layout L = layout_arg(layout, q);
        const auto r = dispatch(in.dtype, [&](auto tag) {
            using T = typename decltype(tag)::type;
            const char* fn = "blindsight_characterize";
            const auto Q = view<T, 3>(in.arrays[0], fn, "q"), K = view<T, 3>(in.arrays[1], fn, "k"), Vv = view<T, 3>(in.arrays[2], fn, "v");
            py::gil_scoped_release nogil;
            return B::BlindSight::characterize(Q, K, Vv, L, P);
        });
        py::list heads;
        for (const auto& h : r) {
            py::dict nmse;
            for (MaskTemplate t : kAllTemplates) nmse[py::str(std::string(to_string(t)))] = h.nmse[static_cast<std::size_t>(t)];
            heads.append(py::dict("chosen"_a = std::string(to_string(h.chosen)), "nmse"_a = nmse));
        }
        return heads;
    }, "q"_a, "k"_a, "v"_a, "layout"_a, "params"_a = py::none(),
       "BlindSight's Algorithm 1 for every head of one prompt -> list of {'chosen': template, 'nmse': {template: NMSE}} "
       "(the Dense entry is 0: it is the reference).");

    // ---- baselines
    m.def("h2o_scores", [](py::array q, py::array k, const std::string& groups, float scale, bool check_finite) {
        const Inputs in = inputs("h2o_scores", {{"q", q}, {"k", k}});
        const BaselineGroups g = groups_arg(groups, "h2o_scores");
        return to_array(dispatch(in.dtype, [&](auto tag) {
            using T = typename decltype(tag)::type;
            const auto Q = view<T, 3>(in.arrays[0], "h2o_scores", "q"), K = view<T, 3>(in.arrays[1], "h2o_scores", "k");
            py::gil_scoped_release nogil;
            return B::Baseline::h2o_scores(Q, K, g, attention_options(scale, check_finite));
        }));
    }, "q"_a, "k"_a, "groups"_a = "kv_head", py::kw_only(), "scale"_a = 0.0f, "check_finite"_a = true,
       "H2O's accumulated attention over the causal prefill -> [G, n] float64.");

    m.def("snapkv_window_scores", [](py::array q, py::array k, std::int64_t window, const std::string& groups, float scale,
                                     bool check_finite) {
        const Inputs in = inputs("snapkv_window_scores", {{"q", q}, {"k", k}});
        const BaselineGroups g = groups_arg(groups, "snapkv_window_scores");
        return to_array(dispatch(in.dtype, [&](auto tag) {
            using T = typename decltype(tag)::type;
            const auto Q = view<T, 3>(in.arrays[0], "snapkv_window_scores", "q"), K = view<T, 3>(in.arrays[1], "snapkv_window_scores", "k");
            py::gil_scoped_release nogil;
            return B::Baseline::snapkv_window_scores(Q, K, window, g, attention_options(scale, check_finite));
        }));
    }, "q"_a, "k"_a, "window"_a, "groups"_a = "kv_head", py::kw_only(), "scale"_a = 0.0f, "check_finite"_a = true,
       "SnapKV's raw window scores -> [G, n - window] float64.");

    m.def("snapkv_pool", [](py::array_t<double, py::array::c_style | py::array::forcecast> scores, std::int64_t kernel,
                            const std::string& pooling) {
        constexpr const char* fn = "snapkv_pool";
        const SnapKVPooling pl = enum_arg<SnapKVPooling>(pooling, fn, "pooling");
        ::vlsparse::require(scores.ndim() == 2, fn, "scores has ", scores.ndim(), " dimensions, expected 2: [G, n - window]");
        std::vector<std::vector<double>> r;
        for (py::ssize_t g = 0; g < scores.shape(0); ++g)
            r.push_back(B::Baseline::snapkv_pool(std::span<const double>(scores.data(g, 0), static_cast<std::size_t>(scores.shape(1))), kernel, pl));
        return scores.shape(0) ? to_array(r) : py::array_t<double>(std::vector<py::ssize_t>{0, scores.shape(1)});
    }, "scores"_a, "kernel"_a, "pooling"_a = "avg",
       "SnapKV's 1-D pooling of the window scores, per group -> [G, n - window] float64.");

    m.def("fastv_scores", [](py::array q, py::array k, float scale, bool check_finite) {
        const Inputs in = inputs("fastv_scores", {{"q", q}, {"k", k}});
        return to_array(dispatch(in.dtype, [&](auto tag) {
            using T = typename decltype(tag)::type;
            const auto Q = view<T, 3>(in.arrays[0], "fastv_scores", "q"), K = view<T, 3>(in.arrays[1], "fastv_scores", "k");
            py::gil_scoped_release nogil;
            return B::Baseline::fastv_scores(Q, K, attention_options(scale, check_finite));
        }));
    }, "q"_a, "k"_a, py::kw_only(), "scale"_a = 0.0f, "check_finite"_a = true,
       "FastV's score: the last row's attention averaged over the query heads -> [n] float64.");

    m.def("baseline_select", [](const std::string& policy, py::array q, py::array k, py::object layout, py::object params) {
        const Inputs in = inputs("baseline_select", {{"q", q}, {"k", k}});
        const nlohmann::json j = to_json(params);
        const Layout L = layout_arg(layout, q);
        return dispatch(in.dtype, [&](auto tag) -> TokenSelection {
            using T = typename decltype(tag)::type;
            const auto Q = view<T, 3>(in.arrays[0], "baseline_select", "q"), K = view<T, 3>(in.arrays[1], "baseline_select", "k");
            if (policy == "h2o") {
                const H2OParams P = ::vlsparse::h2o_params_from_json(j, "params.");
                py::gil_scoped_release nogil;
                return B::h2o_select(Q, K, P);
            }
            if (policy == "snapkv") {
                const SnapKVParams P = ::vlsparse::snapkv_params_from_json(j, "params.");
                py::gil_scoped_release nogil;
                return B::snapkv_select(Q, K, P);
            }
            if (policy == "fastv") {
                const FastVParams P = ::vlsparse::fastv_params_from_json(j, "params.");
                py::gil_scoped_release nogil;
                return B::fastv_select(Q, K, L, P);
            }
            throw error("baseline_select", "policy '" + policy + "', expected h2o, snapkv or fastv (streamingllm, random "
                                           "and fixed_ratio need no attention: vlsparse.baseline_select_static)");
        });
    }, "policy"_a, "q"_a, "k"_a, "layout"_a = py::none(), "params"_a = py::none(),
       "The prefill selection of H2O, SnapKV or FastV (params: the policy's Params as a dict) -> TokenSelection.");
}

}  // namespace

void init_module(py::module_& m) {
    m.doc() = "vlsparse: visual-token sparsity for VLM inference (ZipVL, A-VL, PureKV, BlindSight, baselines). "
              "vlsparse.reference: the exact scalar reference; vlsparse.simd: the SIMD path; vlsparse.golden; "
              "vlsparse.sim. docs/python.md.";
    m.attr("__version__") = VLSPARSE_VERSION_STRING;
    static py::exception<error> exc(m, "Error", PyExc_ValueError);
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const error& e) {
            exc(e.what());
        } catch (const nlohmann::json::exception& e) {
            exc((std::string("invalid params: ") + e.what()).c_str());
        }
    });

    // ---- result types
    py::class_<TokenSelection>(m, "TokenSelection", "The kept positions of one layer: one list shared by every KV head, or one per KV head.")
        .def(py::init([](std::int64_t n, const std::vector<std::vector<std::int64_t>>& indices) {
                 TokenSelection s;
                 s.n = n;
                 s.indices = indices;
                 return s;
             }), "n"_a, "indices"_a)
        .def_readonly("n", &TokenSelection::n)
        .def_property_readonly("indices", [](const TokenSelection& s) { return to_list_of_arrays(s.indices); })
        .def_property_readonly("scores", [](const TokenSelection& s) { return to_array(s.scores); })
        .def_property_readonly("shared", &TokenSelection::shared)
        .def_property_readonly("kept_ratio", &TokenSelection::kept_ratio)
        .def("mask", &selection_mask, "uint8 [G, n]: 1 where kept")
        .def("__repr__", [](const TokenSelection& s) {
            return "TokenSelection(n=" + std::to_string(s.n) + ", groups=" + std::to_string(s.indices.size()) +
                   ", kept_ratio=" + std::to_string(s.kept_ratio()) + ")";
        });

    py::class_<ZipVLSelection>(m, "ZipVLSelection", "ZipVL's selection of one layer (zipvl_select).")
        .def_readonly("n", &ZipVLSelection::n)
        .def_readonly("dense", &ZipVLSelection::dense)
        .def_readonly("heads_per_group", &ZipVLSelection::heads_per_group)
        .def_property_readonly("probes", [](const ZipVLSelection& s) { return to_array(s.probes); })
        .def_property_readonly("accumulated", [](const ZipVLSelection& s) {
            return s.accumulated.empty() ? py::array_t<double>(std::vector<py::ssize_t>{0, static_cast<py::ssize_t>(s.n)}) : to_array(s.accumulated);
        })
        .def_property_readonly("normalized", [](const ZipVLSelection& s) {
            return s.normalized.empty() ? py::array_t<double>(std::vector<py::ssize_t>{0, static_cast<py::ssize_t>(s.n)}) : to_array(s.normalized);
        })
        .def_property_readonly("p", [](const ZipVLSelection& s) { return to_array(s.p); })
        .def_readonly("selection", &ZipVLSelection::selection)
        .def("kept_mask", [](const ZipVLSelection& s) {
            // one row per group, also for a dense layer's shared list
            TokenSelection t = s.selection;
            if (t.indices.size() == 1 && s.p.size() > 1) t.indices.assign(s.p.size(), t.indices[0]);
            return selection_mask(t);
        }, "uint8 [G, n]: 1 where kept (as the golden files' kept_mask)")
        .def_property_readonly("kept_ratio", &ZipVLSelection::kept_ratio);

    py::class_<AvlSelection>(m, "AvlSelection", "What A-VL keeps of one layer after prefill (avl_prefill_select).")
        .def_readonly("n", &AvlSelection::n)
        .def_property_readonly("core", [](const AvlSelection& s) { return to_array(s.core); })
        .def_readonly("kept", &AvlSelection::kept)
        .def_property_readonly("scores", [](const AvlSelection& s) { return to_array(s.scores); })
        .def_property_readonly("kept_image", [](const AvlSelection& s) { return to_list_of_arrays(s.kept_image); })
        .def_property_readonly("core_budget", [](const AvlSelection& s) { return to_array(s.core_budget); });

    py::class_<PureKVScores>(m, "PureKVScores", "PureKV's window scores of one layer (Eq. 2).")
        .def_readonly("layer", &PureKVScores::layer)
        .def_readonly("n", &PureKVScores::n)
        .def_readonly("window", &PureKVScores::window)
        .def_readonly("heads_per_group", &PureKVScores::heads_per_group)
        .def_property_readonly("s", [](const PureKVScores& s) { return to_array(s.s); });

    py::class_<PureKVSelection>(m, "PureKVSelection", "What PureKV keeps in one layer (purekv_select).")
        .def_readonly("n", &PureKVSelection::n)
        .def_readonly("layer", &PureKVSelection::layer)
        .def_readonly("source_layer", &PureKVSelection::source_layer)
        .def_readonly("dense", &PureKVSelection::dense)
        .def_readonly("window", &PureKVSelection::window)
        .def_readonly("top_h", &PureKVSelection::top_h)
        .def_property_readonly("v_norm", [](const PureKVSelection& s) { return to_array(s.v_norm); })
        .def_property_readonly("importance", [](const PureKVSelection& s) { return to_array(s.importance); })
        .def_readonly("selection", &PureKVSelection::selection);

    // ---- Params: the defaults of every algorithm as dicts
    m.def("default_params", [](const std::string& algorithm) -> py::object {
        if (algorithm == "zipvl") return from_json(::vlsparse::to_json(ZipVLParams{}));
        if (algorithm == "avl") return from_json(::vlsparse::to_json(AvlParams{}));
        if (algorithm == "purekv") return from_json(::vlsparse::to_json(PureKVParams{}));
        if (algorithm == "blindsight") return from_json(::vlsparse::to_json(BlindSightParams{}));
        if (algorithm == "h2o") return from_json(::vlsparse::to_json(H2OParams{}));
        if (algorithm == "snapkv") return from_json(::vlsparse::to_json(SnapKVParams{}));
        if (algorithm == "fastv") return from_json(::vlsparse::to_json(FastVParams{}));
        if (algorithm == "streamingllm") return from_json(::vlsparse::to_json(StreamingLLMParams{}));
        if (algorithm == "random") return from_json(::vlsparse::to_json(RandomParams{}));
        if (algorithm == "fixed_ratio") return from_json(::vlsparse::to_json(FixedRatioParams{}));
        throw error("default_params", "algorithm '" + algorithm + "', expected zipvl, avl, purekv, blindsight, h2o, snapkv, "
                                      "fastv, streamingllm, random or fixed_ratio");
    }, "algorithm"_a, "The default Params of an algorithm as a dict (the keys the functions' params accept).");

    m.def("baseline_select_static", [](const std::string& policy, const std::string& layout, py::object params, std::int64_t layer) {
        const nlohmann::json j = to_json(params);
        const Layout L = Layout::parse(layout);
        if (policy == "streamingllm") return streamingllm_select(L.n(), ::vlsparse::streamingllm_params_from_json(j, "params."));
        if (policy == "random") return random_select(L, layer, ::vlsparse::random_params_from_json(j, "params."));
        if (policy == "fixed_ratio") return fixed_ratio_select(L, ::vlsparse::fixed_ratio_params_from_json(j, "params."));
        throw error("baseline_select_static", "policy '" + policy + "', expected streamingllm, random or fixed_ratio "
                                              "(h2o, snapkv and fastv read attention: reference / simd.baseline_select)");
    }, "policy"_a, "layout"_a, "params"_a = py::none(), "layer"_a = 0,
       "The prefill selection of the baselines that read no attention (StreamingLLM, random, fixed ratio; one "
       "implementation) -> TokenSelection.");

    m.def("blindsight_masks", [](const std::string& layout, py::object params) {
        const BlindSightParams P = blindsight_params(params);
        const Layout L = Layout::parse(layout);
        const MaskContext ctx = make_mask_context(L, P.mask);
        const auto n = static_cast<py::ssize_t>(ctx.n);
        py::array_t<std::uint8_t> masks({py::ssize_t{4}, n, n});
        py::array_t<std::int64_t> pairs(4);
        py::array_t<double> paper(4), exact(4);
        const TemplateValues fe = flops_reduction_exact(ctx), fp = flops_reduction_paper(L);
        for (MaskTemplate t : kAllTemplates) {
            const auto i = static_cast<py::ssize_t>(t);
            const std::vector<std::uint8_t> mk = expand_mask(ctx, t);
            std::copy(mk.begin(), mk.end(), masks.mutable_data() + i * n * n);
            pairs.mutable_data()[i] = count_allowed_pairs(ctx, t);
            paper.mutable_data()[i] = fp[t];
            exact.mutable_data()[i] = fe[t];
        }
        return py::dict("masks"_a = masks, "allowed_pairs"_a = pairs, "flops_paper"_a = paper, "flops_exact"_a = exact);
    }, "layout"_a, "params"_a = py::none(),
       "BlindSight's four templates on a layout (index 0..3: Dense, Sink, Document, Document-Sink): masks uint8 "
       "[4, n, n] (1 where query i may see key j), allowed_pairs [4], the FLOPs reductions against dense causal "
       "attention flops_paper [4] (the paper's formula) and flops_exact [4] (exact pair counts).");

    m.def("blindsight_aggregate", [](py::array_t<std::int64_t, py::array::c_style | py::array::forcecast> counts,
                                     py::object params) {
        const BlindSightParams P = blindsight_params(params);
        ::vlsparse::require(counts.ndim() == 2 && counts.shape(1) == 4, "blindsight_aggregate",
                        "counts: expected [heads, 4] (prompts per template: Dense, Sink, Document, Document-Sink)");
        std::vector<TemplateCounts> tc(static_cast<std::size_t>(counts.shape(0)));
        for (std::size_t i = 0; i < tc.size(); ++i)
            for (std::size_t t = 0; t < 4; ++t) tc[i].count[t] = counts.at(static_cast<py::ssize_t>(i), static_cast<py::ssize_t>(t));
        std::vector<std::string> r;
        for (MaskTemplate t : aggregate(tc, P)) r.emplace_back(to_string(t));
        return r;
    }, "counts"_a, "params"_a = py::none(),
       "BlindSight's Algorithm 2: each head's template from how many prompts chose each one -> list of template names.");

    m.def("spearman", [](const std::vector<double>& x, const std::vector<double>& y) {
        const SpearmanResult r = spearman(x, y);
        return py::dict("rho"_a = r.rho, "p_value"_a = r.p_value, "n"_a = r.n);
    }, "x"_a, "y"_a, "Spearman's rank correlation (average ranks for ties) and its two-sided p-value -> {'rho', 'p_value', 'n'}.");

    m.def("layout_n", [](const std::string& spec) { return Layout::parse(spec).n(); }, "spec"_a,
          "The number of tokens of a layout spec such as 'text:6,image:150[10x15],text:4' (validates it).");

    py::module_ ref = m.def_submodule("reference", "The exact scalar reference (double accumulation): the oracle.");
    bind_backend<Path<false>>(ref);
    py::module_ sim = m.def_submodule("simd", "The SIMD path (fp32 accumulation, the CPU's best instruction set).");
    bind_backend<Path<true>>(sim);
    bind_kv(m, ref, sim);
    bind_purekv(m, ref, sim);

    bind_sim(m);

    // `import vlsparse.reference` etc. work as for a package.
    py::dict modules = py::module_::import("sys").attr("modules");
    for (const char* sub : {"reference", "simd", "golden", "sim"})
        modules[py::str(std::string("vlsparse.") + sub)] = m.attr(sub);
}

}  // namespace vlsparse::python

PYBIND11_MODULE(vlsparse, m) { vlsparse::python::init_module(m); }
