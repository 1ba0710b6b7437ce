// python/src/kv.cpp -- a decode loop from Python: vlsparse.KvCache (one layer's cache kept across
// steps: assign, append, keep, positions, rows), decode attention over it on both backends
// (vlsparse.reference / vlsparse.simd: decode_attention(q, cache), indexed_decode_attention(q, cache,
// rows) with the attention probabilities), and the decode-time eviction of H2O and StreamingLLM: their
// policy adapters (<vlsparse/policies/policy.hpp>) as vlsparse.H2OPolicy / vlsparse.StreamingLLMPolicy,
// and their keep rules (h2o_keep, streamingllm_keep). docs/python.md, "A decode loop".
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "kv_cache.hpp"

#include "vlsparse/attention/cache_rows.hpp"
#include "vlsparse/attention/decode.hpp"
#include "vlsparse/attention/indexed_decode.hpp"
#include "vlsparse/io/baselines_json.hpp"
#include "vlsparse/policies/policy.hpp"
#include "vlsparse/reference/attention.hpp"
#include "vlsparse/reference/indexed_decode.hpp"

namespace vlsparse::python {

namespace {

using namespace pybind11::literals;

// ---- decode over a cache, on a backend's DecodeOps -------------------------------------------

// One indexed decode step on backend B; probs (float64 [H, L]) gets the probabilities when not null.
// B writes them in its own B::prob_type (simd: fp32, widened here; the reference: double, in place).
template <class B, class T>
void indexed_decode_on(View2<const T> q, const KvCache<T>& c, const CacheRows& rows, View2<float> o, double* probs,
                       std::int64_t L, const AttentionOptions& opt) {
    using P = typename B::prob_type;
    if (!probs) {
        B::indexed_decode(q, c, rows, o, opt);
    } else if constexpr (std::is_same_v<P, double>) {
        B::indexed_decode(q, c, rows, o, View2<double>(probs, {q.shape[0], L}), opt);
    } else {
        std::vector<P> p(static_cast<std::size_t>(q.shape[0] * L));
        B::indexed_decode(q, c, rows, o, View2<P>(p.data(), {q.shape[0], L}), opt);
        std::copy(p.begin(), p.end(), probs);
    }
}

// q [H, d] of the cache's element type, and a new float32 output of its shape.
py::array decode_query(const PyKvCache& cache, const py::array& q, const char* fn) {
    cache.require_dtype(q, fn, "q");
    ::vlsparse::require(q.ndim() == 2, fn, "q has ", q.ndim(), " dimensions, expected 2: [H, d]");
    return usable(q);
}

template <class B>
void bind_cache_decode(py::module_& m) {
    m.def("decode_attention", [](py::array q, const PyKvCache& cache, float scale, bool check_finite) {
        constexpr const char* fn = "decode_attention";
        const py::array qa = decode_query(cache, q, fn);
        py::array_t<float> out(std::vector<py::ssize_t>{qa.shape(0), qa.shape(1)});
        View2<float> o(out.mutable_data(), {qa.shape(0), qa.shape(1)});
        dispatch(cache.dtype(), [&](auto tag) {
            using T = typename decltype(tag)::type;
            const auto Q = view<T, 2>(qa, fn, "q");
            cache.read_nogil<T>([&](const KvCache<T>& c) { B::decode(Q, c, o, AttentionOptions{scale, check_finite}); });
        });
        return out;
    }, "q"_a, "cache"_a, py::kw_only(), "scale"_a = 0.0f, "check_finite"_a = true,
       "One decode step over a vlsparse.KvCache: q [H, d] (the cache's dtype; the new token, whose K/V "
       "cache.append has added) attends to every row the cache holds for its KV head -> out [H, d] float32.");

    m.def("indexed_decode_attention", [](py::array q, const PyKvCache& cache, const std::vector<std::vector<std::int64_t>>& lists,
                                         bool probs, float scale, bool check_finite) -> py::object {
        constexpr const char* fn = "indexed_decode_attention";
        const CacheRows rows(lists);
        const py::array qa = decode_query(cache, q, fn);
        const py::ssize_t H = qa.shape(0), d = qa.shape(1);
        py::array_t<float> out(std::vector<py::ssize_t>{H, d});
        const std::int64_t L = rows.longest();
        py::array_t<double> p(std::vector<py::ssize_t>{probs ? H : 0, static_cast<py::ssize_t>(L)});
        View2<float> o(out.mutable_data(), {H, d});
        double* pp = probs ? p.mutable_data() : nullptr;
        dispatch(cache.dtype(), [&](auto tag) {
            using T = typename decltype(tag)::type;
            const auto Q = view<T, 2>(qa, fn, "q");
            cache.read_nogil<T>([&](const KvCache<T>& c) {
                indexed_decode_on<B>(Q, c, rows, o, pp, L, AttentionOptions{scale, check_finite});
            });
        });
        if (probs) return py::make_tuple(out, p);
        return out;
    }, "q"_a, "cache"_a, "rows"_a, py::kw_only(), "probs"_a = false, "scale"_a = 0.0f, "check_finite"_a = true,
       "One decode step reading only the listed cache ROWS (not positions: cache.rows_for_positions converts): "
       "rows is 1 list (shared) or one per KV head, each sorted, unique, non-empty -> out [H, d] float32, or with "
       "probs=True (out, probs [H, L] float64): probs[h, t] is the probability of the t-th listed row of head h's "
       "KV group, 0 beyond its list (L: the longest list).");
}

// ---- the cache ----------------------------------------------------------------------------------

// CacheRows as Python sees row lists: one int64 array per list.
py::list rows_as_arrays(const CacheRows& rows) {
    py::list l;
    for (std::int64_t i = 0; i < rows.lists(); ++i) {
        const auto r = rows.list(i);
        l.append(to_array(std::vector<std::int64_t>(r.begin(), r.end())));
    }
    return l;
}

std::vector<std::int64_t> positions_arg(const py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>& a,
                                        const char* fn, const char* name) {
    ::vlsparse::require(a.ndim() == 1, fn, name, " has ", a.ndim(), " dimensions, expected a 1-D list of positions");
    return std::vector<std::int64_t>(a.data(), a.data() + a.size());
}

TokenSelection shared_selection(std::vector<std::int64_t> positions, std::int64_t n) {
    TokenSelection s;
    s.n = n;
    s.indices.push_back(std::move(positions));
    return s;
}

template <class T>
py::array rows_array(const View2<const T>& x) {
    py::array a(numpy_dtype(in_dtype_of<T>()), std::vector<py::ssize_t>{x.shape[0], x.shape[1]});
    std::copy_n(reinterpret_cast<const char*>(x.data), x.shape[0] * x.shape[1] * static_cast<std::int64_t>(sizeof(T)),
                static_cast<char*>(a.mutable_data()));
    return a;
}

void bind_cache_class(py::module_& m) {
    py::class_<PyKvCache>(m, "KvCache",
                          "One layer's KV cache kept across decode steps (vlsparse::KvCache): per KV head, rows "
                          "[rows, head_dim] in the element type given (float32, float16, or uint16 = bf16 bits) "
                          "and their token positions, ascending. Eviction (keep) never renumbers positions.")
        .def(py::init([](std::int64_t kv_heads, std::int64_t head_dim, const py::object& dtype) {
                 return std::make_unique<PyKvCache>(kv_heads, head_dim, dtype_arg(dtype, "KvCache"));
             }), "kv_heads"_a, "head_dim"_a, "dtype"_a = "float32")
        .def_property_readonly("kv_heads", [](const PyKvCache& c) {
            return dispatch(c.dtype(), [&](auto tag) {
                using T = typename decltype(tag)::type;
                return c.read<T>([](const KvCache<T>& k) { return k.n_kv_heads(); });
            });
        })
        .def_property_readonly("head_dim", [](const PyKvCache& c) {
            return dispatch(c.dtype(), [&](auto tag) {
                using T = typename decltype(tag)::type;
                return c.read<T>([](const KvCache<T>& k) { return k.head_dim(); });
            });
        })
        .def_property_readonly("dtype", [](const PyKvCache& c) { return numpy_dtype(c.dtype()); })
        .def_property_readonly("seq_len", [](const PyKvCache& c) {
            return dispatch(c.dtype(), [&](auto tag) {
                using T = typename decltype(tag)::type;
                return c.read<T>([](const KvCache<T>& k) { return k.seq_len(); });
            });
        }, "Tokens the sequence has seen (prefill + appended), evicted ones included: the next append's position.")
        .def_property_readonly("kv_bytes", [](const PyKvCache& c) {
            return dispatch(c.dtype(), [&](auto tag) {
                using T = typename decltype(tag)::type;
                return c.read<T>([](const KvCache<T>& k) { return k.kv_bytes(); });
            });
        }, "Bytes held by the K and V rows.")
        .def("assign", [](PyKvCache& c, py::array k, py::array v, py::object positions, py::object seq_len) {
            constexpr const char* fn = "KvCache.assign";
            c.require_dtype(k, fn, "k");
            c.require_dtype(v, fn, "v");
            ::vlsparse::require(positions.is_none() == seq_len.is_none(), fn,
                            "positions and seq_len go together (the rows' positions and the sequence length)");
            const py::array ka = usable(k), va = usable(v);
            std::vector<std::int64_t> pos;
            if (!positions.is_none())
                pos = positions_arg(py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>::ensure(positions),
                                    fn, "positions");
            const std::int64_t n = seq_len.is_none() ? 0 : seq_len.cast<std::int64_t>();
            dispatch(c.dtype(), [&](auto tag) {
                using T = typename decltype(tag)::type;
                const auto K = view<T, 3>(ka, fn, "k"), Vv = view<T, 3>(va, fn, "v");
                c.change<T>([&](KvCache<T>& cache) {
                    if (positions.is_none()) cache.assign(K, Vv);
                    else cache.assign(K, Vv, std::span<const std::int64_t>(pos), n);
                });
            });
        }, "k"_a, "v"_a, "positions"_a = py::none(), "seq_len"_a = py::none(),
           "Replaces the contents with a prefill's k, v [n, H_kv, d] (positions 0 .. n-1), or with the rows of "
           "the tokens at `positions` (ascending) of a sequence of seq_len tokens.")
        .def("append", [](PyKvCache& c, py::array k, py::array v) {
            constexpr const char* fn = "KvCache.append";
            c.require_dtype(k, fn, "k");
            c.require_dtype(v, fn, "v");
            const py::array ka = usable(k), va = usable(v);
            dispatch(c.dtype(), [&](auto tag) {
                using T = typename decltype(tag)::type;
                const auto K = view<T, 2>(ka, fn, "k"), Vv = view<T, 2>(va, fn, "v");
                c.change<T>([&](KvCache<T>& cache) { cache.append(K, Vv); });
            });
        }, "k"_a, "v"_a, "Appends one token's k, v [H_kv, d] to every KV head, at position seq_len.")
        .def("keep", [](PyKvCache& c, const TokenSelection& sel) {
            dispatch(c.dtype(), [&](auto tag) {
                using T = typename decltype(tag)::type;
                c.change<T>([&](KvCache<T>& cache) { cache.keep(sel); });
            });
        }, "selection"_a,
           "Evicts every position not listed (a TokenSelection: one shared list or one per KV head; every listed "
           "position must be in the cache); compacts in place. On error the cache is left unchanged.")
        .def("keep", [](PyKvCache& c, py::array_t<std::int64_t, py::array::c_style | py::array::forcecast> positions) {
            const TokenSelection sel = shared_selection(positions_arg(positions, "KvCache.keep", "positions"), 0);
            dispatch(c.dtype(), [&](auto tag) {
                using T = typename decltype(tag)::type;
                c.change<T>([&](KvCache<T>& cache) { cache.keep(sel); });
            });
        }, "positions"_a, "Same, one position list for every KV head.")
        .def("rows", [](const PyKvCache& c, std::int64_t g) {
            return dispatch(c.dtype(), [&](auto tag) {
                using T = typename decltype(tag)::type;
                return c.read<T>([&](const KvCache<T>& k) { return k.rows(g); });
            });
        }, "g"_a, "Rows KV head g holds.")
        .def("positions", [](const PyKvCache& c, std::int64_t g) {
            return dispatch(c.dtype(), [&](auto tag) {
                using T = typename decltype(tag)::type;
                return c.read<T>([&](const KvCache<T>& k) {
                    const auto p = k.positions(g);
                    return to_array(std::vector<std::int64_t>(p.begin(), p.end()));
                });
            });
        }, "g"_a, "The token positions of KV head g's rows, ascending -> int64 [rows].")
        .def("k", [](const PyKvCache& c, std::int64_t g) {
            return dispatch(c.dtype(), [&](auto tag) {
                using T = typename decltype(tag)::type;
                return c.read<T>([&](const KvCache<T>& k) { return rows_array(k.k(g)); });
            });
        }, "g"_a, "KV head g's K rows [rows, d] (a copy, in the cache's dtype).")
        .def("v", [](const PyKvCache& c, std::int64_t g) {
            return dispatch(c.dtype(), [&](auto tag) {
                using T = typename decltype(tag)::type;
                return c.read<T>([&](const KvCache<T>& k) { return rows_array(k.v(g)); });
            });
        }, "g"_a, "KV head g's V rows [rows, d] (a copy, in the cache's dtype).")
        .def("rows_for_positions", [](const PyKvCache& c, const TokenSelection& sel) {
            return rows_as_arrays(dispatch(c.dtype(), [&](auto tag) {
                using T = typename decltype(tag)::type;
                return c.read<T>([&](const KvCache<T>& k) { return rows_for_positions(k, sel); });
            }));
        }, "selection"_a,
           "The cache rows that hold the listed positions, one list per KV head (what indexed_decode_attention "
           "reads); a position the cache does not hold is an error.")
        .def("rows_for_positions", [](const PyKvCache& c, py::array_t<std::int64_t, py::array::c_style | py::array::forcecast> positions) {
            const std::vector<std::int64_t> pos = positions_arg(positions, "rows_for_positions", "positions");
            return rows_as_arrays(dispatch(c.dtype(), [&](auto tag) {
                using T = typename decltype(tag)::type;
                return c.read<T>([&](const KvCache<T>& k) { return rows_for_positions(k, std::span<const std::int64_t>(pos)); });
            }));
        }, "positions"_a, "Same, one position list for every KV head.")
        .def("__repr__", [](const PyKvCache& c) {
            return dispatch(c.dtype(), [&](auto tag) {
                using T = typename decltype(tag)::type;
                return c.read<T>([&](const KvCache<T>& k) {
                    std::string rows;
                    for (std::int64_t g = 0; g < k.n_kv_heads(); ++g) rows += (g ? ", " : "") + std::to_string(k.rows(g));
                    return "KvCache(kv_heads=" + std::to_string(k.n_kv_heads()) + ", head_dim=" + std::to_string(k.head_dim()) +
                           ", dtype=" + py::str(py::handle(numpy_dtype(c.dtype()))).cast<std::string>() +
                           ", seq_len=" + std::to_string(k.seq_len()) + ", rows=[" + rows + "])";
                });
            });
        });
}

// ---- the decode-time eviction of H2O and StreamingLLM ------------------------------------------

// fp32 views of q, k, v (PrefillLayer's type): in place for float32 inputs, widened (exactly) otherwise.
struct Fp32Inputs {
    std::vector<float> buf[3];
    View3<const float> q, k, v;
};

Fp32Inputs fp32_inputs(const Inputs& in, const char* fn) {
    Fp32Inputs r;
    View3<const float>* dst[3] = {&r.q, &r.k, &r.v};
    const char* names[3] = {"q", "k", "v"};
    dispatch(in.dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        for (int i = 0; i < 3; ++i) {
            const auto x = view<T, 3>(in.arrays[static_cast<std::size_t>(i)], fn, names[i]);
            if constexpr (std::is_same_v<T, float>) {
                *dst[i] = x;
            } else {
                auto& b = r.buf[i];
                b.resize(static_cast<std::size_t>(x.shape[0] * x.shape[1] * x.shape[2]));
                std::size_t o = 0;
                for (std::int64_t a = 0; a < x.shape[0]; ++a)
                    for (std::int64_t h = 0; h < x.shape[1]; ++h)
                        for (std::int64_t c = 0; c < x.shape[2]; ++c) b[o++] = to_float(x(a, h, c));
                *dst[i] = View3<const float>(b.data(), x.shape);
            }
        }
    });
    return r;
}

// A policy adapter with what begin() was given; its lock guards the policy's state (prefill releases
// the GIL and takes it; the short decode calls take it with the GIL held).
template <class P>
struct PolicyHolder {
    P policy;
    std::optional<Layout> layout;
    ModelShape shape;
    std::mutex m;

    void require_begun(const char* fn) const {
        ::vlsparse::require(layout.has_value(), fn, "no prompt: call begin(layout, shape) first");
    }
    void check_selection(const TokenSelection& s, const char* fn, const char* name) const {
        require_begun(fn);
        ::vlsparse::require(s.n > 0, fn, name, ".n = ", s.n, ", expected the sequence length so far (> 0)");
        s.validate(shape.kv_heads, (std::string(fn) + ": " + name).c_str());
    }
};

template <class P, class ParamsFromJson>
void bind_policy(py::module_& m, const char* name, ParamsFromJson params_from_json, const char* doc) {
    using Holder = PolicyHolder<P>;
    const std::string cls = name;
    py::class_<Holder> c(m, name, doc);
    c.def(py::init([params_from_json](py::object params) {
         auto h = std::make_unique<Holder>();
         h->policy = P(params_from_json(to_json(params), "params."));
         return h;
     }), "params"_a = py::none())
        .def_property_readonly("name", [](const Holder& h) { return std::string(h.policy.name()); })
        .def_property_readonly("params", [](const Holder& h) { return from_json(::vlsparse::to_json(h.policy.params)); })
        .def("begin", [cls](Holder& h, const std::string& layout, py::object shape) {
            const std::string fn = cls + ".begin";
            const Layout L = Layout::parse(layout);
            const ModelShape s = shape_arg(shape, fn.c_str());
            std::lock_guard lock(h.m);
            h.policy.begin(L, s);
            h.layout = L;
            h.shape = s;
        }, "layout"_a, "shape"_a,
           "A new prompt: its layout spec and the model shape {'layers', 'heads', 'kv_heads', 'head_dim'}; resets "
           "every layer's state.")
        .def("prefill", [cls](Holder& h, std::int64_t layer, py::array q, py::array k, py::array v,
                              std::optional<std::vector<std::int64_t>> positions) {
            const std::string fn = cls + ".prefill";
            const Inputs in = inputs(fn.c_str(), {{"q", q}, {"k", k}, {"v", v}});
            const Fp32Inputs x = fp32_inputs(in, fn.c_str());
            const std::vector<std::int64_t> pos = positions.value_or(std::vector<std::int64_t>{});
            py::gil_scoped_release nogil;
            std::lock_guard lock(h.m);
            h.require_begun(fn.c_str());
            PrefillLayer pl;
            pl.layout = &*h.layout;
            pl.shape = h.shape;
            pl.layer = layer;
            pl.q = x.q;
            pl.k = x.k;
            pl.v = x.v;
            pl.positions = std::span<const std::int64_t>(pos);
            return h.policy.prefill(pl).kv;
        }, "layer"_a, "q"_a, "k"_a, "v"_a, "positions"_a = py::none(),
           "The layer's prefill decision: q [n, H, d], k, v [n, H_kv, d] (float16 / bf16 widened to float32, as "
           "the policy interface takes them; `positions`: the rows' absolute positions when earlier layers dropped "
           "tokens) -> TokenSelection: the positions the layer's cache keeps.")
        .def("decode_read", [cls](Holder& h, std::int64_t layer, std::int64_t step, const TokenSelection& cached) {
            const std::string fn = cls + ".decode_read";
            std::lock_guard lock(h.m);
            h.check_selection(cached, fn.c_str(), "cached");
            return h.policy.decode_read(layer, step, cached);
        }, "layer"_a, "step"_a, "cached"_a,
           "The positions decode step `step` of `layer` reads, from the positions the cache holds now (`cached`: "
           "ascending, the new token's included, n = the sequence length so far) -> TokenSelection.")
        .def("decode_observe", [cls](Holder& h, std::int64_t layer, std::int64_t step, const TokenSelection& read,
                                     std::optional<std::vector<std::vector<double>>> attn) -> std::optional<TokenSelection> {
            const std::string fn = cls + ".decode_observe";
            const std::vector<std::vector<double>> a = attn.value_or(std::vector<std::vector<double>>{});
            for (std::size_t r = 0; r < a.size(); ++r)
                for (std::size_t i = 0; i < a[r].size(); ++i)
                    ::vlsparse::require(std::isfinite(a[r][i]), fn.c_str(), "attn[", r, "][", i, "] = ", a[r][i],
                                    ", expected finite probabilities");
            std::lock_guard lock(h.m);
            h.check_selection(read, fn.c_str(), "read");
            return h.policy.decode_observe(layer, step, read, std::span<const std::vector<double>>(a));
        }, "layer"_a, "step"_a, "read"_a, "attn"_a = py::none(),
           "Feedback after the step: `read` as decode_read returned it, `attn` the step's attention over it, one "
           "vector per read list (parallel to it), the mean over that list's query heads -> the positions to "
           "keep when the policy evicts now (cache.keep them), else None.");
    if constexpr (std::is_same_v<P, H2OPolicy>) {
        c.def("accumulated", [](Holder& h, std::int64_t layer) {
            constexpr const char* fn = "H2OPolicy.accumulated";
            std::lock_guard lock(h.m);
            h.require_begun(fn);
            ::vlsparse::require(layer >= 0 && layer < h.shape.layers, fn, "layer = ", layer, ", expected 0 <= layer < ",
                            h.shape.layers);
            const auto& acc = h.policy.accumulated(layer);
            ::vlsparse::require(!acc.empty(), fn, "layer ", layer, " has no prefill state; call prefill() for it first");
            return to_array(acc);
        }, "layer"_a,
           "The accumulated attention of `layer` by position: [G, length] float64 (G = H_kv or 1 by the "
           "params' groups; length: the longest sequence seen so far).");
    }
}

// positions ascending, unique and >= 0.
void check_cached(std::span<const std::int64_t> cached, const char* fn) {
    for (std::size_t i = 0; i < cached.size(); ++i)
        ::vlsparse::require(cached[i] >= 0 && (i == 0 || cached[i] > cached[i - 1]), fn, "cached[", i, "] = ", cached[i],
                        ", expected ascending unique positions >= 0");
}

}  // namespace

void bind_kv(py::module_& m, py::module_& ref, py::module_& simd_mod) {
    bind_cache_class(m);
    bind_cache_decode<reference::DecodeOps>(ref);
    bind_cache_decode<simd::DecodeOps>(simd_mod);

    bind_policy<H2OPolicy>(m, "H2OPolicy", [](const nlohmann::json& j, const char* p) { return ::vlsparse::h2o_params_from_json(j, p); },
        "H2O's policy adapter (<vlsparse/policies/policy.hpp>, SIMD path): prefill keeps heavy hitters + the recent "
        "window by accumulated attention; decode reads every cached position and decode_observe adds the step's "
        "attention to the accumulated scores and, with evict_during_decode, returns the keep set when a list "
        "holds more than heavy + recent positions.");
    bind_policy<StreamingLLMPolicy>(m, "StreamingLLMPolicy",
        [](const nlohmann::json& j, const char* p) { return ::vlsparse::streamingllm_params_from_json(j, p); },
        "StreamingLLM's policy adapter (<vlsparse/policies/policy.hpp>): the first `sinks` and the last `recent` "
        "positions after prefill and, with evict_during_decode, at every decode step (decode_read returns sinks + "
        "the last `recent` cached positions; decode_observe returns that set when it dropped one).");

    m.def("h2o_keep", [](std::vector<std::int64_t> cached, std::int64_t heavy, std::int64_t recent,
                         py::array_t<double, py::array::c_style | py::array::forcecast> scores) {
        constexpr const char* fn = "h2o_keep";
        ::vlsparse::require(heavy >= 0 && recent >= 0, fn, "heavy = ", heavy, ", recent = ", recent, ", expected >= 0");
        check_cached(cached, fn);
        ::vlsparse::require(scores.ndim() == 1, fn, "scores has ", scores.ndim(), " dimensions, expected 1: a score per position");
        ::vlsparse::require(cached.empty() || cached.back() < scores.size(), fn, "position ", cached.empty() ? 0 : cached.back(),
                        " has no score (scores has ", scores.size(), " entries)");
        const double* s = scores.data();
        for (auto p : cached)
            ::vlsparse::require(std::isfinite(s[p]), fn, "scores[", p, "] = ", s[p], ", expected finite scores");
        return to_array(h2o_keep(std::span<const std::int64_t>(cached), heavy, recent, [&](std::int64_t p) { return s[p]; }));
    }, "cached"_a, "heavy"_a, "recent"_a, "scores"_a,
       "H2O's keep rule among `cached` (ascending positions): the last `recent` plus the `heavy` others with the "
       "largest scores[position] (ties: lower position first); everything when there are at most heavy + recent "
       "-> int64 positions, ascending.");

    m.def("streamingllm_keep", [](std::vector<std::int64_t> cached, std::int64_t sinks, std::int64_t recent) {
        constexpr const char* fn = "streamingllm_keep";
        ::vlsparse::require(sinks >= 0 && recent >= 0, fn, "sinks = ", sinks, ", recent = ", recent, ", expected >= 0");
        check_cached(cached, fn);
        return to_array(streamingllm_keep(std::span<const std::int64_t>(cached), sinks, recent));
    }, "cached"_a, "sinks"_a, "recent"_a,
       "StreamingLLM's keep rule among `cached` (ascending positions): the first `sinks` and the last `recent` -> "
       "int64 positions, ascending.");
}

}  // namespace vlsparse::python
