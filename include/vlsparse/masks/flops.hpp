// vlsparse/masks/flops.hpp -- BlindSight FLOPs: the paper's Algorithm 3, exact pair counts, model totals.
//
//   flops_reduction_paper:  Algorithm 3 of BlindSight (Appendix A) exactly as printed, quirks included
//                           (see docs/blindsight.md): masked_area[mask] / (0.5 S^2)
//   flops_reduction_exact:  1 - pairs(template) / pairs(Dense), pairs counted exactly on the mask
//   model_flops_reduction:  sum over templates of share[template] * reduction[template] (Section 5.3)
// Attention FLOPs of a mask: 4 * head_dim * pairs per head (QK^T and PV, one multiply-add = 2 FLOPs).
// Include: <vlsparse/masks/flops.hpp>
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "vlsparse/core/error.hpp"
#include "vlsparse/core/layout.hpp"
#include "vlsparse/masks/templates.hpp"

namespace vlsparse {

// Per-template values indexed by MaskTemplate (dense, sink, document, document_sink).
struct TemplateValues {
    std::array<double, 4> v{};
    double& operator[](MaskTemplate t) { return v[static_cast<std::size_t>(t)]; }
    double operator[](MaskTemplate t) const { return v[static_cast<std::size_t>(t)]; }
};

// Algorithm 3 verbatim. img_start / img_end: start and end position of each image (the lengths are
// img_end - img_start, so pass one-past-the-end positions to get token counts); S: sequence length.
// The Dense entry is 0. Only what would make the printed algorithm fail is rejected (no images,
// different list lengths, S <= 0); everything else is computed as printed.
inline TemplateValues flops_reduction_paper(std::span<const std::int64_t> img_start, std::span<const std::int64_t> img_end,
                                            std::int64_t S) {
    constexpr const char* fn = "flops_reduction_paper";
    detail::require(!img_start.empty(), fn, "no images given, expected at least one (the algorithm reads img_end[-1])");
    detail::require(img_start.size() == img_end.size(), fn, img_start.size(), " image starts and ", img_end.size(),
                    " image ends, expected equal counts");
    detail::require(S > 0, fn, "S = ", S, ", expected S > 0");
    const auto len = [&](std::size_t i) { return static_cast<double>(img_end[i] - img_start[i]); };
    double sink = 0.0, document_sink = 0.0, document = 0.0;
    const double original_area = 0.5 * static_cast<double>(S) * static_cast<double>(S);
    const std::size_t n_img = img_start.size();
    for (std::size_t start = 0; start + 1 < n_img; ++start) {  // range(0, len(img_start) - 1)
        for (std::size_t end = start; end < img_end.size(); ++end) {  // range(start, len(img_end))
            if (end == start) {
                sink += 0.5 * 0.9 * len(start) * len(start);
            } else {
                document_sink += 0.9 * len(start) * len(end);
                sink += 0.9 * len(start) * len(end);
            }
        }
        for (std::size_t end = start + 1; end < n_img; ++end) document += len(start) * len(end);
    }
    sink += 0.5 * 0.9 * len(n_img - 1) * len(n_img - 1);
    TemplateValues r;
    r[MaskTemplate::sink] = sink / original_area;
    r[MaskTemplate::document] = document / original_area;
    r[MaskTemplate::document_sink] = document_sink / original_area;
    return r;
}

// Algorithm 3 on a layout: its image (and video) segments as [start, end) and S = n.
inline TemplateValues flops_reduction_paper(const Layout& layout) {
    std::vector<std::int64_t> s, e;
    for (const auto& seg : layout.segments())
        if (seg.is_visual()) {
            s.push_back(seg.start);
            e.push_back(seg.end());
        }
    return flops_reduction_paper(s, e, layout.n());
}

// Exact number of allowed (query, key) pairs of one template on a prompt.
inline std::int64_t count_allowed_pairs(const MaskContext& c, MaskTemplate t) {
    std::vector<KeyInterval> iv;
    std::int64_t total = 0;
    for (std::int64_t i = 0; i < c.n; ++i) total += c.row_count(t, i, iv);
    return total;
}

// Allowed pairs of every template.
inline TemplateValues allowed_pairs(const MaskContext& c) {
    TemplateValues r;
    for (MaskTemplate t : kAllTemplates) r[t] = static_cast<double>(count_allowed_pairs(c, t));
    return r;
}

// 1 - pairs(t) / pairs(Dense) for every template (Dense: 0). Dense is the causal mask, or causal
// with bidirectional images when the context has them.
inline TemplateValues flops_reduction_exact(const MaskContext& c) {
    const TemplateValues p = allowed_pairs(c);
    TemplateValues r;
    for (MaskTemplate t : kAllTemplates) r[t] = 1.0 - p[t] / p[MaskTemplate::dense];
    return r;
}

// Attention FLOPs of `pairs` allowed pairs of one head: QK^T and PV, 2 FLOPs per multiply-add.
inline double attention_flops(std::int64_t pairs, std::int64_t head_dim) {
    return 4.0 * static_cast<double>(head_dim) * static_cast<double>(pairs);
}

// Section 5.3: sum_mask share[mask] * reduction[mask]. Shares must be in [0, 1] and sum to 1.
inline double model_flops_reduction(const TemplateValues& share, const TemplateValues& reduction) {
    constexpr const char* fn = "model_flops_reduction";
    double sum = 0.0, total = 0.0;
    for (MaskTemplate t : kAllTemplates) {
        detail::require(std::isfinite(share[t]) && share[t] >= 0.0 && share[t] <= 1.0, fn, "share[", to_string(t),
                        "] = ", share[t], ", expected 0 <= share <= 1");
        sum += share[t];
        total += share[t] * reduction[t];
    }
    detail::require(std::abs(sum - 1.0) <= 1e-9, fn, "shares sum to ", sum, ", expected 1");
    return total;
}

// Shares of each template in a head map (layer-major list of per-head templates).
inline TemplateValues template_shares(std::span<const MaskTemplate> heads) {
    detail::require(!heads.empty(), "template_shares", "no heads given, expected at least one");
    TemplateValues r;
    for (MaskTemplate t : heads) r[t] += 1.0;
    for (auto& x : r.v) x /= static_cast<double>(heads.size());
    return r;
}

}  // namespace vlsparse
