// vlsparse/masks/render.hpp -- pictures of masks and head maps as self-contained SVG text.
//
//   mask_svg:      an n x n mask (row = query, column = key), allowed pairs dark, one rectangle per
//                  run of allowed keys in a row (so the file stays small), image spans shaded on the axes.
//   head_map_svg:  a layers x heads grid, one colour per template, with a legend.
// Write the returned string to a .svg file; any browser shows it. Include: <vlsparse/masks/render.hpp>
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "vlsparse/core/error.hpp"
#include "vlsparse/masks/templates.hpp"

namespace vlsparse {

namespace detail {
inline const char* template_colour(MaskTemplate t) {
    switch (t) {
        case MaskTemplate::dense: return "#444444";
        case MaskTemplate::sink: return "#e07b39";
        case MaskTemplate::document: return "#3a7dc9";
        case MaskTemplate::document_sink: return "#5aa55a";
    }
    return "#000000";
}
}  // namespace detail

// SVG of one template on a prompt; `cell` pixels per token (>= 1). A title line names the template.
inline std::string mask_svg(const MaskContext& c, MaskTemplate t, int cell = 2) {
    detail::require(cell >= 1, "mask_svg", "cell = ", cell, ", expected >= 1 pixel per token");
    detail::require(c.n > 0, "mask_svg", "empty mask context");
    const std::int64_t margin = 6, top = 22, side = c.n * cell;
    const std::int64_t w = side + 2 * margin + 6, h = side + top + margin + 6;
    std::string s = detail::concat("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"", w, "\" height=\"", h,
                                   "\" viewBox=\"0 0 ", w, " ", h, "\" shape-rendering=\"crispEdges\">\n",
                                   "<style>.on{fill:", detail::template_colour(t), "}</style>\n",
                                   "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
                                   "<text x=\"", margin, "\" y=\"15\" font-family=\"sans-serif\" font-size=\"12\">",
                                   to_string(t), " (n = ", c.n, ", ", c.images(), " images)</text>\n");
    const std::int64_t x0 = margin + 6, y0 = top + 6;
    // Image spans along both axes (grey bars).
    for (std::int64_t a = 0; a < c.images(); ++a) {
        const auto lo = c.image_start[static_cast<std::size_t>(a)] * cell, len = (c.image_end[static_cast<std::size_t>(a)] - c.image_start[static_cast<std::size_t>(a)]) * cell;
        s += detail::concat("<rect x=\"", x0 + lo, "\" y=\"", top, "\" width=\"", len, "\" height=\"4\" fill=\"#999\"/>\n");
        s += detail::concat("<rect x=\"", margin, "\" y=\"", y0 + lo, "\" width=\"4\" height=\"", len, "\" fill=\"#999\"/>\n");
    }
    s += detail::concat("<rect x=\"", x0, "\" y=\"", y0, "\" width=\"", side, "\" height=\"", side,
                        "\" fill=\"#f4f4f4\" stroke=\"#ccc\" stroke-width=\"0.5\"/>\n");
    std::vector<KeyInterval> iv;
    for (std::int64_t i = 0; i < c.n; ++i) {
        c.row_intervals(t, i, iv);
        for (const auto& x : iv)
            s += detail::concat("<rect class=\"on\" x=\"", x0 + x.lo * cell, "\" y=\"", y0 + i * cell, "\" width=\"",
                                (x.hi - x.lo) * cell, "\" height=\"", cell, "\"/>\n");
    }
    s += "</svg>\n";
    return s;
}

// SVG of a head map: rows = layers, columns = heads, `cell` pixels per head. Map: BlindSight's HeadMap
// (<vlsparse/policies/blindsight_params.hpp>) or any type with its `layers`, `heads` and layer-major
// `map` of MaskTemplate -- a template, so that this layer of masks needs nothing of the policies above it.
template <class Map>
std::string head_map_svg(const Map& m, int cell = 12) {
    detail::require(cell >= 1, "head_map_svg", "cell = ", cell, ", expected >= 1");
    detail::require(m.layers > 0 && m.heads > 0 && static_cast<std::int64_t>(m.map.size()) == m.layers * m.heads,
                    "head_map_svg", "map has ", m.map.size(), " entries for ", m.layers, " layers x ", m.heads,
                    " heads; expected layers * heads");
    const std::int64_t left = 60, top = 24, legend = 130;
    const std::int64_t w = left + m.heads * cell + legend, h = std::max<std::int64_t>(top + m.layers * cell + 10, top + 90);
    std::string s = detail::concat("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"", w, "\" height=\"", h,
                                   "\" shape-rendering=\"crispEdges\" font-family=\"sans-serif\" font-size=\"11\">\n",
                                   "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
                                   "<text x=\"4\" y=\"14\">layer (rows) x head (columns)</text>\n");
    for (std::int64_t l = 0; l < m.layers; ++l) {
        if (l % 4 == 0)
            s += detail::concat("<text x=\"4\" y=\"", top + l * cell + cell - 2, "\">", l, "</text>\n");
        for (std::int64_t hh = 0; hh < m.heads; ++hh)
            s += detail::concat("<rect x=\"", left + hh * cell, "\" y=\"", top + l * cell, "\" width=\"", cell,
                                "\" height=\"", cell, "\" fill=\"", detail::template_colour(m.map[static_cast<std::size_t>(l * m.heads + hh)]),
                                "\" stroke=\"white\" stroke-width=\"0.5\"/>\n");
    }
    const std::int64_t lx = left + m.heads * cell + 10;
    int row = 0;
    for (MaskTemplate t : kAllTemplates) {
        const std::int64_t y = top + 18 * row++;
        s += detail::concat("<rect x=\"", lx, "\" y=\"", y, "\" width=\"12\" height=\"12\" fill=\"",
                            detail::template_colour(t), "\"/><text x=\"", lx + 16, "\" y=\"", y + 10, "\">", to_string(t),
                            "</text>\n");
    }
    s += "</svg>\n";
    return s;
}

}  // namespace vlsparse
