// vlsparse/sim/purekv_validation.hpp -- PureKV's cross-layer validation (Eq. 5-7) as simulator output.
//
// When a scenario runs a `purekv` policy, the engine computes, on the DENSE run's Q/K/V of every
// layer l > l0 (plain sources: the source's rows; residual source: the dense run's projections), per
// group (KV head, or one for `grouping: layer`), over the non-window positions j < n - w:
//   rho, p         Spearman of s^{l0}_j ||V^l_j|| (Eq. 5, what PureKV ranks by) against
//                  s^l_j ||V^l_j|| (Eq. 6, the layer's own window scores): the paper's Eq. 7 check
//   rho_without_v  Spearman of s^{l0}_j against s^l_j (the same without the V weight: how much of rho
//                  comes from the shared ||V^l|| factor)
//   topk_overlap   |top-h by the estimate  AND  top-h by the layer's own importance| / h: the share of
//                  the tokens the layer's own scores would keep that the estimate keeps (what eviction
//                  needs, where Spearman over all positions is dominated by the low-score tail)
// with the first purekv policy's params (l0, window, budget, grouping). A sample that is constant
// (e.g. n - w < 3, or every score 0) has no rank order: its rho and p are NaN (null in JSON).
// Include: <vlsparse/sim/purekv_validation.hpp>
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "vlsparse/core/rank_correlation.hpp"
#include "vlsparse/policies/purekv.hpp"

namespace vlsparse::sim {

struct PureKVValidationLayer {
    std::int64_t layer = 0, source_layer = 0;
    std::vector<double> rho, p, rho_without_v, topk_overlap;  // [G]
};

struct PureKVValidation {
    bool enabled = false;
    std::string policy;  // the label of the purekv policy whose params are used
    PureKVParams params;
    std::vector<PureKVValidationLayer> layers;  // l0 + 1 .. L - 1
    std::optional<PureKVScores> l0_scores;      // working state

    static double mean(const std::vector<double>& v) {
        double s = 0.0;
        std::int64_t c = 0;
        for (double x : v)
            if (std::isfinite(x)) s += x, ++c;
        return c ? s / static_cast<double>(c) : std::numeric_limits<double>::quiet_NaN();
    }

    // One layer of the dense run: q [n, H, d], k, v [n, H_kv, d] (the prompt rows).
    void observe(std::int64_t l, View3<const float> q, View3<const float> k, View3<const float> v) {
        if (!enabled || l < params.l0) return;
        const std::int64_t n = q.shape[0], w = params.window;
        if (w > n) return;
        const PureKVScores own = simd::purekv_window_scores(q, k, l, params);
        if (l == params.l0) {
            l0_scores = own;
            return;
        }
        if (!l0_scores) return;
        const PureKVSelection est = simd::purekv_select(*l0_scores, v, l, params);
        const PureKVSelection mine = simd::purekv_select(own, v, l, params);
        PureKVValidationLayer r;
        r.layer = l;
        r.source_layer = params.l0;
        const std::int64_t m = n - w;
        const double nan = std::numeric_limits<double>::quiet_NaN();
        auto sp = [&](const std::vector<double>& a, const std::vector<double>& b) -> SpearmanResult {
            try {
                return spearman(std::span<const double>(a.data(), static_cast<std::size_t>(m)),
                                std::span<const double>(b.data(), static_cast<std::size_t>(m)));
            } catch (const ::vlsparse::error&) {
                return SpearmanResult{nan, nan, m};
            }
        };
        for (std::int64_t g = 0; g < est.groups(); ++g) {
            const auto gi = static_cast<std::size_t>(g);
            const SpearmanResult a = sp(est.importance[gi], mine.importance[gi]);
            r.rho.push_back(a.rho);
            r.p.push_back(a.p_value);
            r.rho_without_v.push_back(sp(l0_scores->s[gi], own.s[gi]).rho);
            // top-h overlap over the non-window positions (both lists hold the window too)
            const auto& A = est.selection.indices[gi];
            const auto& B = mine.selection.indices[gi];
            std::size_t i = 0, j = 0;
            std::int64_t both = 0;
            while (i < A.size() && j < B.size()) {
                if (A[i] == B[j]) {
                    both += A[i] < m;
                    ++i, ++j;
                } else if (A[i] < B[j]) {
                    ++i;
                } else {
                    ++j;
                }
            }
            r.topk_overlap.push_back(mine.top_h > 0 ? static_cast<double>(both) / static_cast<double>(mine.top_h) : nan);
        }
        layers.push_back(std::move(r));
    }

    nlohmann::json to_json() const {
        auto arr = [](const std::vector<double>& v) {
            nlohmann::json a = nlohmann::json::array();
            for (double x : v) a.push_back(std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr));
            return a;
        };
        auto num = [](double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr); };
        nlohmann::json L = nlohmann::json::array();
        std::vector<double> all_rho, all_rv, all_ov;
        for (const auto& x : layers) {
            L.push_back({{"layer", x.layer},
                         {"source_layer", x.source_layer},
                         {"rho", arr(x.rho)},
                         {"p", arr(x.p)},
                         {"rho_without_v", arr(x.rho_without_v)},
                         {"topk_overlap", arr(x.topk_overlap)},
                         {"mean_rho", num(mean(x.rho))}});
            all_rho.insert(all_rho.end(), x.rho.begin(), x.rho.end());
            all_rv.insert(all_rv.end(), x.rho_without_v.begin(), x.rho_without_v.end());
            all_ov.insert(all_ov.end(), x.topk_overlap.begin(), x.topk_overlap.end());
        }
        return {{"policy", policy},
                {"l0", params.l0},
                {"window", params.window},
                {"grouping", std::string(to_string(params.grouping))},
                {"mean_rho", num(mean(all_rho))},
                {"mean_rho_without_v", num(mean(all_rv))},
                {"mean_topk_overlap", num(mean(all_ov))},
                {"layers", L}};
    }

    // The terminal table: one row per layer, the per-group values and their means.
    void print(std::FILE* f) const {
        if (!enabled) return;
        std::fprintf(f,
                     "\nPureKV cross-layer validation (Eq. 5-7, dense run; policy '%s', l0 = %lld, w = %lld, %s groups):\n"
                     "Spearman of s^l0*||V^l|| vs s^l*||V^l|| per group; without ||V||; top-h overlap\n",
                     policy.c_str(), static_cast<long long>(params.l0), static_cast<long long>(params.window),
                     std::string(to_string(params.grouping)).c_str());
        if (layers.empty()) {
            std::fprintf(f, "  (no layer above l0 with n - w >= 3)\n");
            return;
        }
        std::fprintf(f, "  %-6s %-9s %-9s %-12s %-9s  %s\n", "layer", "mean rho", "max p", "rho w/o V", "overlap",
                     "rho per group");
        for (const auto& x : layers) {
            double pmax = 0.0;
            for (double p : x.p)
                if (std::isfinite(p)) pmax = std::max(pmax, p);
            std::string per;
            for (double r : x.rho) {
                char b[16];
                std::snprintf(b, sizeof b, "%s%.3f", per.empty() ? "" : " ", r);
                per += b;
            }
            std::fprintf(f, "  %-6lld %-9.3f %-9.2g %-12.3f %-9.3f  %s\n", static_cast<long long>(x.layer), mean(x.rho),
                         pmax, mean(x.rho_without_v), mean(x.topk_overlap), per.c_str());
        }
    }
};

}  // namespace vlsparse::sim
