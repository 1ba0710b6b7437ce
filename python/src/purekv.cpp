// python/src/purekv.cpp -- PureKV's cross-layer estimator as a Python object on each backend
// (vlsparse.reference.PureKVEstimator, vlsparse.simd.PureKVEstimator: BasicPureKVEstimator of
// <vlsparse/policies/purekv_params.hpp>, which keeps l0's window scores for the layers above it), and
// the video masks of a layout (vlsparse.purekv_masks, one implementation). docs/python.md.
#include <cstdint>
#include <iterator>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "kv_cache.hpp"

#include "vlsparse/io/purekv_json.hpp"
#include "vlsparse/masks/flops.hpp"
#include "vlsparse/masks/templates.hpp"
#include "vlsparse/policies/purekv.hpp"
#include "vlsparse/reference/purekv.hpp"

namespace vlsparse::python {

namespace {

using namespace pybind11::literals;

// The estimator and a lock for its state: observe() changes it (exclusive), the other steps read it
// (shared). Steps that compute release the GIL first and then take the lock.
template <class E>
struct EstimatorHolder {
    E est;
    mutable std::shared_mutex m;
    EstimatorHolder(const PureKVParams& P, const Layout& L, const ModelShape& S) : est(P, L, S) {}
};

py::list validation_list(const PureKVLayerValidation& r) {
    py::list groups;
    for (const auto& g : r.groups) groups.append(py::dict("rho"_a = g.rho, "p_value"_a = g.p_value, "n"_a = g.n));
    return groups;
}

template <class E>
void bind_estimator(py::module_& m) {
    using Holder = EstimatorHolder<E>;
    py::class_<Holder>(m, "PureKVEstimator",
                       "PureKV's cross-layer estimator of one prompt (BasicPureKVEstimator on this backend): layers "
                       "up to l0 score themselves (observe), the higher ones reuse l0's scores weighted by their own "
                       "||V|| (select), the prefill attention is ST-masked from st_start_layer on (attention).")
        .def(py::init([](py::object params, const std::string& layout, py::object shape) {
                 const PureKVParams P = purekv_params_from_json(to_json(params), "params.");
                 const Layout L = Layout::parse(layout);
                 const ModelShape S = shape_arg(shape, "PureKVEstimator");
                 return std::make_unique<Holder>(P, L, S);
             }), "params"_a, "layout"_a, "shape"_a)
        .def_property_readonly("params", [](const Holder& h) { return from_json(::vlsparse::to_json(h.est.params())); })
        .def_property_readonly("layout", [](const Holder& h) { return h.est.layout().to_string(); })
        .def_property_readonly("shape", [](const Holder& h) { return shape_dict(h.est.shape()); })
        .def_property_readonly("n", [](const Holder& h) { return h.est.n(); })
        .def("needs_scores", [](const Holder& h, std::int64_t layer) {
            std::shared_lock lock(h.m);
            return h.est.needs_scores(layer);
        }, "layer"_a, "True when select(layer) needs observe(layer) first: l0, and the layers below it unless "
                      "lower_layers = 'dense'.")
        .def("observed", [](const Holder& h, std::int64_t layer) {
            std::shared_lock lock(h.m);
            return h.est.observed(layer);
        }, "layer"_a)
        .def("masked", [](const Holder& h, std::int64_t layer) {
            std::shared_lock lock(h.m);
            return h.est.masked(layer);
        }, "layer"_a, "True when the layer's prefill attention is ST-masked.")
        .def("observe", [](Holder& h, std::int64_t layer, py::array q, py::array k) {
            constexpr const char* fn = "PureKVEstimator.observe";
            const Inputs in = inputs(fn, {{"q", q}, {"k", k}});
            return dispatch(in.dtype, [&](auto tag) {
                using T = typename decltype(tag)::type;
                const auto Q = view<T, 3>(in.arrays[0], fn, "q"), K = view<T, 3>(in.arrays[1], fn, "k");
                py::gil_scoped_release nogil;
                std::unique_lock lock(h.m);
                return PureKVScores(h.est.observe(layer, Q, K));
            });
        }, "layer"_a, "q"_a, "k"_a, "Computes and keeps the layer's window scores (Eq. 2) -> PureKVScores.")
        .def("scores", [](const Holder& h, std::int64_t layer) {
            std::shared_lock lock(h.m);
            return PureKVScores(h.est.scores(layer));
        }, "layer"_a, "The scores select(layer) uses: the layer's own up to l0, l0's above -> PureKVScores.")
        .def("select", [](const Holder& h, std::int64_t layer, py::array v) {
            constexpr const char* fn = "PureKVEstimator.select";
            const Inputs in = inputs(fn, {{"v", v}});
            return dispatch(in.dtype, [&](auto tag) {
                using T = typename decltype(tag)::type;
                const auto Vv = view<T, 3>(in.arrays[0], fn, "v");
                py::gil_scoped_release nogil;
                std::shared_lock lock(h.m);
                return h.est.select(layer, Vv);
            });
        }, "layer"_a, "v"_a, "Eq. 3 (layers <= l0) or Eq. 4 (above) and the kept set -> PureKVSelection (dense: "
                             "everything kept, for a lower layer with lower_layers = 'dense').")
        .def("validate", [](const Holder& h, std::int64_t layer, py::array q, py::array k, py::array v) {
            constexpr const char* fn = "PureKVEstimator.validate";
            const Inputs in = inputs(fn, {{"q", q}, {"k", k}, {"v", v}});
            const PureKVLayerValidation r = dispatch(in.dtype, [&](auto tag) {
                using T = typename decltype(tag)::type;
                const auto Q = view<T, 3>(in.arrays[0], fn, "q"), K = view<T, 3>(in.arrays[1], fn, "k"),
                           Vv = view<T, 3>(in.arrays[2], fn, "v");
                py::gil_scoped_release nogil;
                std::shared_lock lock(h.m);
                return h.est.validate(layer, Q, K, Vv);
            });
            return validation_list(r);
        }, "layer"_a, "q"_a, "k"_a, "v"_a,
           "Eq. 5-7 for a layer above l0: Spearman between l0's scores and the layer's own, both weighted by its "
           "||V||, per group -> list of {'rho', 'p_value', 'n'}.")
        .def("attention", [](const Holder& h, std::int64_t layer, py::array q, py::array k, py::array v) {
            constexpr const char* fn = "PureKVEstimator.attention";
            const Inputs in = inputs(fn, {{"q", q}, {"k", k}, {"v", v}});
            ::vlsparse::require(q.ndim() == 3, fn, "q has ", q.ndim(), " dimensions, expected 3");
            py::array_t<float> out(std::vector<py::ssize_t>{q.shape(0), q.shape(1), q.shape(2)});
            View3<float> o(out.mutable_data(), {q.shape(0), q.shape(1), q.shape(2)});
            dispatch(in.dtype, [&](auto tag) {
                using T = typename decltype(tag)::type;
                const auto Q = view<T, 3>(in.arrays[0], fn, "q"), K = view<T, 3>(in.arrays[1], fn, "k"),
                           Vv = view<T, 3>(in.arrays[2], fn, "v");
                py::gil_scoped_release nogil;
                std::shared_lock lock(h.m);
                h.est.attention(layer, Q, K, Vv, o);
            });
            return out;
        }, "layer"_a, "q"_a, "k"_a, "v"_a,
           "The layer's prefill attention: ST-SpAttn from st_start_layer on (video layouts), dense causal otherwise "
           "-> out [n, H, d] float32.")
        .def("prefill_layer", [](Holder& h, std::int64_t layer, py::array q, py::array k, py::array v, PyKvCache& cache) {
            constexpr const char* fn = "PureKVEstimator.prefill_layer";
            const Inputs in = inputs(fn, {{"q", q}, {"k", k}, {"v", v}});
            cache.require_dtype(k, fn, "k");
            ::vlsparse::require(q.ndim() == 3, fn, "q has ", q.ndim(), " dimensions, expected 3");
            py::array_t<float> out(std::vector<py::ssize_t>{q.shape(0), q.shape(1), q.shape(2)});
            View3<float> o(out.mutable_data(), {q.shape(0), q.shape(1), q.shape(2)});
            PureKVSelection s = dispatch(in.dtype, [&](auto tag) {
                using T = typename decltype(tag)::type;
                const auto Q = view<T, 3>(in.arrays[0], fn, "q"), K = view<T, 3>(in.arrays[1], fn, "k"),
                           Vv = view<T, 3>(in.arrays[2], fn, "v");
                // The estimator's lock, then the cache's: no lock holder ever waits for the other order.
                py::gil_scoped_release nogil;
                std::unique_lock lock(h.m);
                return cache.change_released<T>([&](KvCache<T>& c) { return h.est.prefill_layer(layer, Q, K, Vv, o, c); });
            });
            return py::make_tuple(out, s);
        }, "layer"_a, "q"_a, "k"_a, "v"_a, "cache"_a,
           "One whole layer as an engine runs it: observe (when needed), the prefill attention, the cache "
           "(a vlsparse.KvCache of the inputs' dtype) filled with k, v and evicted to the kept set -> (out "
           "[n, H, d] float32, PureKVSelection).");
}

}  // namespace

void bind_purekv(py::module_& m, py::module_& ref, py::module_& simd_mod) {
    bind_estimator<reference::PureKVEstimator>(ref);
    bind_estimator<simd::PureKVEstimator>(simd_mod);

    m.def("purekv_masks", [](const std::string& layout, py::object params) {
        const PureKVParams P = purekv_params_from_json(to_json(params), "params.");
        const Layout L = Layout::parse(layout);
        const auto n = static_cast<py::ssize_t>(L.n());
        const auto K = static_cast<py::ssize_t>(std::size(kVideoMasks));
        py::array_t<std::uint8_t> masks({K, n, n});
        py::array_t<std::int64_t> pairs(K);
        py::list names;
        for (py::ssize_t i = 0; i < K; ++i) {
            const VideoMask kind = kVideoMasks[i];
            const MaskContext ctx = make_video_mask_context(L, {kind, P.st.window, P.st.dilation});
            const std::vector<std::uint8_t> mk = expand_mask(ctx, MaskTemplate::dense);
            std::copy(mk.begin(), mk.end(), masks.mutable_data() + i * n * n);
            pairs.mutable_data()[i] = count_allowed_pairs(ctx, MaskTemplate::dense);
            names.append(std::string(enum_name(kind)));
        }
        return py::dict("masks"_a = masks, "allowed_pairs"_a = pairs, "kinds"_a = names);
    }, "layout"_a, "params"_a = py::none(),
       "PureKV's five video masks on a layout with the params' st_window and st_dilation (index 0..4: spatial, "
       "temporal, spatial_temporal, local_window, atrous; causal, text and images dense): masks uint8 [5, n, n] "
       "(1 where query i may see key j), allowed_pairs int64 [5], kinds (their names).");
}

}  // namespace vlsparse::python
