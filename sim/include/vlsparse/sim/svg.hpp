// vlsparse/sim/svg.hpp -- small self-contained SVG plots for the simulator's HTML report.
//
//   line_chart    series of (x, y) points with lines and markers; linear or log-10 y axis
//   bar_chart     grouped bars: categories (policies) x groups (e.g. prefill FLOPs, KV bytes)
//   heat_rows     rows of values in [0, 1] as grey levels (kept tokens: layers x position bins),
//                 with marks under the columns (image spans)
//   binned_mask   an n x n mask template reduced to bins x bins cells, shade = allowed share
// Plain text, no scripts, no external resources: the report opens offline in any browser.
// Include: <vlsparse/sim/svg.hpp>
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "vlsparse/masks/templates.hpp"

namespace vlsparse::sim::svg {

inline std::string esc(const std::string& s) {
    std::string r;
    for (char c : s) {
        switch (c) {
            case '&': r += "&amp;"; break;
            case '<': r += "&lt;"; break;
            case '>': r += "&gt;"; break;
            case '"': r += "&quot;"; break;
            default: r += c;
        }
    }
    return r;
}

inline std::string num(double x, int prec = 4) {
    char b[64];
    std::snprintf(b, sizeof b, "%.*g", prec, x);
    return b;
}

// Okabe-Ito's colour-blind-safe palette (Okabe & Ito 2008, "Color Universal Design"), its yellow
// darkened to stay visible on white; series also differ by marker shape (marker()), so that 8 colours
// x 7 shapes tell up to 56 series apart without relying on colour alone.
inline const char* color(std::size_t i) {
    static const char* pal[] = {"#000000", "#E69F00", "#56B4E9", "#009E73", "#B8A200", "#0072B2", "#D55E00", "#CC79A7"};
    return pal[i % (sizeof(pal) / sizeof(pal[0]))];
}

// Marker shapes, cycled with a period (7) prime to the palette's (8).
enum class Marker : std::uint8_t { circle, square, triangle, diamond, triangle_down, cross, plus };
inline Marker marker(std::size_t i) { return static_cast<Marker>(i % 7); }

// One marker at (x, y) of radius r; hollow: outline only (points drawn at a log plot's "0" row).
inline std::string marker_svg(Marker m, double x, double y, double r, const std::string& col, bool hollow,
                              const std::string& tip) {
    auto n6 = [](double v) {
        char b[32];
        std::snprintf(b, sizeof b, "%.6g", v);
        return std::string(b);
    };
    const std::string paint = hollow ? "fill=\"white\" stroke=\"" + col + "\" stroke-width=\"1.2\""
                                     : "fill=\"" + col + "\"";
    const std::string title = tip.empty() ? "" : "<title>" + esc(tip) + "</title>";
    const double q = r * 1.25;
    auto poly = [&](const std::vector<std::pair<double, double>>& pts) {
        std::string p;
        for (const auto& [dx, dy] : pts) p += n6(x + dx) + "," + n6(y + dy) + " ";
        return "<polygon points=\"" + p + "\" " + paint + ">" + title + "</polygon>\n";
    };
    switch (m) {
        case Marker::square:
            return "<rect x=\"" + n6(x - r) + "\" y=\"" + n6(y - r) + "\" width=\"" + n6(2 * r) + "\" height=\"" + n6(2 * r) +
                   "\" " + paint + ">" + title + "</rect>\n";
        case Marker::triangle: return poly({{0, -q}, {q, q * 0.8}, {-q, q * 0.8}});
        case Marker::triangle_down: return poly({{0, q}, {q, -q * 0.8}, {-q, -q * 0.8}});
        case Marker::diamond: return poly({{0, -q}, {q, 0}, {0, q}, {-q, 0}});
        case Marker::cross:
        case Marker::plus: {
            const double a = q;
            const std::string d = m == Marker::plus
                                      ? "M" + n6(x - a) + " " + n6(y) + "H" + n6(x + a) + "M" + n6(x) + " " + n6(y - a) + "V" + n6(y + a)
                                      : "M" + n6(x - a) + " " + n6(y - a) + "L" + n6(x + a) + " " + n6(y + a) + "M" + n6(x - a) + " " +
                                            n6(y + a) + "L" + n6(x + a) + " " + n6(y - a);
            return "<path d=\"" + d + "\" stroke=\"" + col + "\" stroke-width=\"2\" fill=\"none\">" + title + "</path>\n";
        }
        case Marker::circle:
        default:
            return "<circle cx=\"" + n6(x) + "\" cy=\"" + n6(y) + "\" r=\"" + n6(r) + "\" " + paint + ">" + title + "</circle>\n";
    }
}

struct Series {
    std::string name;
    std::vector<double> x, y;
    std::string colour;  // "" = palette by index
    std::vector<std::string> point_labels;  // optional, shown as tooltips
    bool in_legend = true;                  // false: drawn, but not listed (e.g. a sweep's other points)
    bool line = true;                       // false: markers only (with ChartOptions::lines)
    double radius = 2.6;                    // of the markers
    std::vector<double> y_lo, y_hi;         // optional, one per point: a vertical bar from y_lo to y_hi
    int marker = -1;                        // a Marker; -1: the series' index in the chart
    double stroke_width = 1.5;
    std::string dash;                       // stroke-dasharray of the line, "" = solid
};

struct ChartOptions {
    std::string title, xlabel, ylabel;
    bool log_y = false;
    bool percent_y = false;   // tick labels as percentages of 1
    bool percent_x = false;
    bool lines = true;
    bool integer_x = false;   // x ticks only at integers (layers)
    int width = 680, height = 300;
    bool legend = true;       // false: no legend column (small multiples)
    // log_y: values exactly 0 are drawn as hollow markers on a row labelled "0" under the plot (a log
    // axis cannot place them); false: they are left out.
    bool zero_row = true;
    double y_min = NAN, y_max = NAN, x_min = NAN, x_max = NAN;
};

namespace detail {

inline std::vector<double> nice_ticks(double lo, double hi, int target = 5) {
    std::vector<double> t;
    if (!(hi > lo)) {
        t.push_back(lo);
        return t;
    }
    const double raw = (hi - lo) / target;
    const double p = std::pow(10.0, std::floor(std::log10(raw)));
    double step = p;
    for (double m : {1.0, 2.0, 2.5, 5.0, 10.0})
        if (m * p >= raw) {
            step = m * p;
            break;
        }
    for (double v = std::ceil(lo / step) * step; v <= hi + 1e-9 * step; v += step) t.push_back(std::abs(v) < 1e-12 * step ? 0.0 : v);
    return t;
}

inline std::string tick_label(double v, bool percent, bool log) {
    if (log) {
        const int e = static_cast<int>(std::lround(std::log10(v)));
        return "1e" + std::to_string(e);
    }
    if (percent) return num(100.0 * v, 3) + "%";
    return num(v, 4);
}

}  // namespace detail

inline std::string line_chart(const std::vector<Series>& series, const ChartOptions& o) {
    const int W = o.width, left = 64, right = o.legend ? 190 : 12, top = 28, bottom = 42;
    bool zeros = false;  // a log plot with values of exactly 0: a "0" row under the plot area
    if (o.log_y && o.zero_row)
        for (const auto& s : series)
            for (double y : s.y) zeros |= y == 0.0;
    const int zrow = zeros ? 18 : 0;
    const int pw = W - left - right, ph = o.height - top - bottom - zrow;
    int legend_rows = 0;
    for (const auto& se : series) legend_rows += se.in_legend && o.legend;
    const int Hh = std::max(o.height, top + 16 + 15 * legend_rows);  // room for the legend
    double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;
    for (const auto& s : series)
        for (std::size_t i = 0; i < s.x.size(); ++i) {
            const double y = s.y[i];
            if (!std::isfinite(y)) continue;
            if (std::isfinite(s.x[i])) xmin = std::min(xmin, s.x[i]), xmax = std::max(xmax, s.x[i]);
            if (o.log_y && y <= 0) continue;
            ymin = std::min(ymin, y);
            ymax = std::max(ymax, y);
        }
    if (!std::isfinite(xmin)) xmin = 0, xmax = 1;
    if (!std::isfinite(ymin)) ymin = o.log_y ? 1e-6 : 0, ymax = 1;
    if (std::isfinite(o.x_min)) xmin = o.x_min;
    if (std::isfinite(o.x_max)) xmax = o.x_max;
    if (std::isfinite(o.y_min)) ymin = o.y_min;
    if (std::isfinite(o.y_max)) ymax = o.y_max;
    if (o.log_y) {
        ymin = std::pow(10.0, std::floor(std::log10(ymin)));
        ymax = std::pow(10.0, std::ceil(std::log10(ymax)));
        if (ymax <= ymin) ymax = ymin * 10;
    } else if (ymax <= ymin) {
        ymax = ymin + 1;
    }
    if (xmax <= xmin) xmax = xmin + 1;
    auto X = [&](double x) { return left + (x - xmin) / (xmax - xmin) * pw; };
    const double y_zero = top + ph + zrow - 6.0;  // the "0" row of a log plot
    auto Y = [&](double y) {
        if (o.log_y && y == 0.0 && zeros) return y_zero;
        const double f = o.log_y ? (std::log10(y) - std::log10(ymin)) / (std::log10(ymax) - std::log10(ymin))
                                 : (y - ymin) / (ymax - ymin);
        return top + (1.0 - f) * ph;
    };
    auto drawable = [&](double y) { return std::isfinite(y) && (!o.log_y || y > 0 || (y == 0.0 && zeros)); };
    std::string s = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(W) + "\" height=\"" +
                    std::to_string(Hh) + "\" viewBox=\"0 0 " + std::to_string(W) + " " + std::to_string(Hh) +
                    "\" font-family=\"sans-serif\" font-size=\"11\">\n";
    s += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
    s += "<text x=\"" + std::to_string(o.legend ? left : 8) + "\" y=\"16\" font-size=\"13\" font-weight=\"bold\">" + esc(o.title) + "</text>\n";
    // grid and ticks
    std::vector<double> yt;
    if (o.log_y) {
        for (double v = ymin; v <= ymax * 1.0001; v *= 10) yt.push_back(v);
        if (yt.size() > 8) {  // thin out
            std::vector<double> k;
            const std::size_t step = (yt.size() + 6) / 7;
            for (std::size_t i = 0; i < yt.size(); i += step) k.push_back(yt[i]);
            yt = k;
        }
    } else {
        yt = detail::nice_ticks(ymin, ymax);
    }
    for (double v : yt) {
        const double y = Y(v);
        s += "<line x1=\"" + num(left) + "\" x2=\"" + num(left + pw) + "\" y1=\"" + num(y) + "\" y2=\"" + num(y) +
             "\" stroke=\"#e4e4e4\"/>\n";
        s += "<text x=\"" + num(left - 4) + "\" y=\"" + num(y + 4) + "\" text-anchor=\"end\">" +
             detail::tick_label(v, o.percent_y, o.log_y) + "</text>\n";
    }
    if (zeros)
        s += "<rect x=\"" + num(left) + "\" y=\"" + num(top + ph + 2) + "\" width=\"" + num(pw) + "\" height=\"" + num(zrow - 4) +
             "\" fill=\"#f4f4f4\"/><text x=\"" + num(left - 4) + "\" y=\"" + num(y_zero + 4) +
             "\" text-anchor=\"end\">0</text>\n";
    const double xaxis = top + ph + zrow;
    for (double v : detail::nice_ticks(xmin, xmax, 8)) {
        if (o.integer_x && v != std::floor(v)) continue;
        const double x = X(v);
        s += "<line x1=\"" + num(x) + "\" x2=\"" + num(x) + "\" y1=\"" + num(xaxis) + "\" y2=\"" + num(xaxis + 4) +
             "\" stroke=\"#888\"/>\n";
        s += "<text x=\"" + num(x) + "\" y=\"" + num(xaxis + 16) + "\" text-anchor=\"middle\">" +
             detail::tick_label(v, o.percent_x, false) + "</text>\n";
    }
    s += "<rect x=\"" + num(left) + "\" y=\"" + num(top) + "\" width=\"" + num(pw) + "\" height=\"" + num(ph) +
         "\" fill=\"none\" stroke=\"#888\"/>\n";
    s += "<text x=\"" + num(left + pw / 2.0) + "\" y=\"" + num(xaxis + bottom - 6) + "\" text-anchor=\"middle\">" + esc(o.xlabel) + "</text>\n";
    s += "<text transform=\"translate(14 " + num(top + ph / 2.0) + ") rotate(-90)\" text-anchor=\"middle\">" + esc(o.ylabel) +
         "</text>\n";
    // series
    int legend_row = 0;
    for (std::size_t k = 0; k < series.size(); ++k) {
        const auto& se = series[k];
        const std::string col = se.colour.empty() ? color(k) : se.colour;
        const Marker mk = se.marker >= 0 ? static_cast<Marker>(se.marker % 7) : marker(k);
        const std::string stroke = "fill=\"none\" stroke=\"" + col + "\" stroke-width=\"" + num(se.stroke_width) + "\"" +
                                   (se.dash.empty() ? "" : " stroke-dasharray=\"" + se.dash + "\"");
        std::string pts;
        const bool lines = o.lines && se.line;
        if (se.y_lo.size() == se.x.size() && se.y_hi.size() == se.x.size())
            for (std::size_t i = 0; i < se.x.size(); ++i) {
                const double lo = se.y_lo[i], hi = se.y_hi[i];
                if (!std::isfinite(lo) || !std::isfinite(hi) || (o.log_y && (lo <= 0 || hi <= 0)) || hi <= lo) continue;
                s += "<line x1=\"" + num(X(se.x[i]), 6) + "\" x2=\"" + num(X(se.x[i]), 6) + "\" y1=\"" +
                     num(Y(std::clamp(lo, ymin, ymax)), 6) + "\" y2=\"" + num(Y(std::clamp(hi, ymin, ymax)), 6) +
                     "\" stroke=\"" + col + "\" stroke-width=\"1\"/>\n";
            }
        // lines join the points on the axis; a point on the "0" row (or not drawn) breaks them
        for (std::size_t i = 0; i < se.x.size(); ++i) {
            const double y = se.y[i];
            if (!std::isfinite(y) || (o.log_y && y <= 0)) {
                if (lines && !pts.empty()) {
                    s += "<polyline " + stroke + " points=\"" + pts + "\"/>\n";
                    pts.clear();
                }
                continue;
            }
            const double yc = std::clamp(y, ymin, ymax);
            pts += num(X(se.x[i]), 6) + "," + num(Y(yc), 6) + " ";
        }
        if (lines && !pts.empty()) s += "<polyline " + stroke + " points=\"" + pts + "\"/>\n";
        if (se.radius > 0)
            for (std::size_t i = 0; i < se.x.size(); ++i) {
                const double y = se.y[i];
                if (!drawable(y)) continue;
                const std::string tip = se.name + (i < se.point_labels.size() ? " " + se.point_labels[i] : "") + ": (" +
                                        num(se.x[i]) + ", " + num(y) + ")";
                const bool on_zero = o.log_y && y == 0.0;
                s += marker_svg(mk, X(se.x[i]), on_zero ? y_zero : Y(std::clamp(y, ymin, ymax)), se.radius, col, on_zero, tip);
            }
        if (!se.in_legend || !o.legend) continue;
        const double ly = top + 6 + 15.0 * static_cast<double>(legend_row++);
        s += "<line x1=\"" + num(left + pw + 8) + "\" x2=\"" + num(left + pw + 28) + "\" y1=\"" + num(ly + 1) + "\" y2=\"" +
             num(ly + 1) + "\" " + stroke + "/>";
        if (se.radius > 0) s += marker_svg(mk, left + pw + 18, ly + 1, 3.2, col, false, "");
        s += "<text x=\"" + num(left + pw + 33) + "\" y=\"" + num(ly + 5) + "\">" + esc(se.name) + "</text>\n";
    }
    s += "</svg>\n";
    return s;
}

// Grouped bars; values[g][c] for group g and category c, as fractions of 1 when percent.
inline std::string bar_chart(const std::vector<std::string>& categories, const std::vector<std::string>& groups,
                             const std::vector<std::vector<double>>& values, const ChartOptions& o) {
    std::size_t longest = 0;  // the category labels, rotated by 35 degrees, need room under the plot
    for (const auto& c : categories) longest = std::max(longest, c.size());
    const int left = 64, right = 150, top = 28, bottom = 16 + static_cast<int>(std::ceil(6.0 * 0.58 * static_cast<double>(longest)));
    const int W = std::max(o.width, left + right + static_cast<int>(categories.size()) * 22), Hh = o.height + std::max(0, bottom - 70);
    const int pw = W - left - right, ph = Hh - top - bottom;
    double ymax = 0.0;
    for (const auto& g : values)
        for (double v : g)
            if (std::isfinite(v)) ymax = std::max(ymax, v);
    if (std::isfinite(o.y_max)) ymax = o.y_max;
    if (ymax <= 0) ymax = 1;
    auto Y = [&](double v) { return top + (1.0 - std::clamp(v, 0.0, ymax) / ymax) * ph; };
    std::string s = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(W) + "\" height=\"" +
                    std::to_string(Hh) + "\" viewBox=\"0 0 " + std::to_string(W) + " " + std::to_string(Hh) +
                    "\" font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
    s += "<text x=\"" + std::to_string(left) + "\" y=\"16\" font-size=\"13\" font-weight=\"bold\">" + esc(o.title) + "</text>\n";
    for (double v : detail::nice_ticks(0, ymax)) {
        const double y = Y(v);
        s += "<line x1=\"" + num(left) + "\" x2=\"" + num(left + pw) + "\" y1=\"" + num(y) + "\" y2=\"" + num(y) +
             "\" stroke=\"#e4e4e4\"/><text x=\"" + num(left - 4) + "\" y=\"" + num(y + 4) + "\" text-anchor=\"end\">" +
             detail::tick_label(v, o.percent_y, false) + "</text>\n";
    }
    const double cw = static_cast<double>(pw) / std::max<std::size_t>(categories.size(), 1);
    const double bw = cw * 0.8 / std::max<std::size_t>(groups.size(), 1);
    for (std::size_t c = 0; c < categories.size(); ++c) {
        const double x0 = left + cw * static_cast<double>(c) + cw * 0.1;
        for (std::size_t g = 0; g < groups.size(); ++g) {
            const double v = values[g][c];
            if (!std::isfinite(v)) continue;
            const double y = Y(v);
            s += "<rect x=\"" + num(x0 + bw * static_cast<double>(g), 6) + "\" y=\"" + num(y, 6) + "\" width=\"" +
                 num(bw * 0.92, 6) + "\" height=\"" + num(top + ph - y, 6) + "\" fill=\"" + color(g + 1) + "\"><title>" +
                 esc(categories[c] + ", " + groups[g] + ": " + detail::tick_label(v, o.percent_y, false)) + "</title></rect>\n";
        }
        const double xc = x0 + cw * 0.4;
        s += "<text transform=\"translate(" + num(xc, 6) + " " + num(top + ph + 10) +
             ") rotate(35)\" text-anchor=\"start\">" + esc(categories[c]) + "</text>\n";
    }
    s += "<rect x=\"" + num(left) + "\" y=\"" + num(top) + "\" width=\"" + num(pw) + "\" height=\"" + num(ph) +
         "\" fill=\"none\" stroke=\"#888\"/>\n";
    s += "<text transform=\"translate(14 " + num(top + ph / 2.0) + ") rotate(-90)\" text-anchor=\"middle\">" + esc(o.ylabel) +
         "</text>\n";
    for (std::size_t g = 0; g < groups.size(); ++g) {
        const double ly = top + 6 + 15.0 * static_cast<double>(g);
        s += "<rect x=\"" + num(left + pw + 10) + "\" y=\"" + num(ly - 4) + "\" width=\"12\" height=\"10\" fill=\"" +
             color(g + 1) + "\"/><text x=\"" + num(left + pw + 26) + "\" y=\"" + num(ly + 5) + "\">" + esc(groups[g]) +
             "</text>\n";
    }
    s += "</svg>\n";
    return s;
}

// A span under the columns of heat_rows (e.g. an image), in column units [lo, hi).
struct ColumnMark {
    double lo = 0, hi = 0;
    std::string colour, label;
};

// rows[r][c] in [0, 1] as grey levels (1 = black); row labels on the left; runs of equal level merged.
inline std::string heat_rows(const std::vector<std::vector<float>>& rows, const std::vector<std::string>& row_labels,
                             const std::vector<ColumnMark>& marks, const std::string& title, int cell_w = 2, int cell_h = 10,
                             int gap = 1) {
    const std::size_t C = rows.empty() ? 0 : rows[0].size();
    const int left = 62, top = 22;
    const int W = left + static_cast<int>(C) * cell_w + 10, Hh = top + static_cast<int>(rows.size()) * cell_h + 24;
    std::string s = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(W) + "\" height=\"" +
                    std::to_string(Hh) + "\" viewBox=\"0 0 " + std::to_string(W) + " " + std::to_string(Hh) +
                    "\" font-family=\"sans-serif\" font-size=\"10\" shape-rendering=\"crispEdges\">\n"
                    "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
    s += "<text x=\"4\" y=\"14\" font-size=\"12\" font-weight=\"bold\">" + esc(title) + "</text>\n";
    for (std::size_t r = 0; r < rows.size(); ++r) {
        const int y = top + static_cast<int>(r) * cell_h;
        if (r < row_labels.size())
            s += "<text x=\"4\" y=\"" + std::to_string(y + cell_h - 2) + "\">" + esc(row_labels[r]) + "</text>\n";
        std::size_t c = 0;
        while (c < C) {
            const int level = static_cast<int>(std::lround(std::clamp(rows[r][c], 0.0f, 1.0f) * 15.0f));
            std::size_t e = c + 1;
            while (e < C && static_cast<int>(std::lround(std::clamp(rows[r][e], 0.0f, 1.0f) * 15.0f)) == level) ++e;
            if (level > 0) {
                const int g = 255 - level * 16;
                char col[16];
                std::snprintf(col, sizeof col, "#%02x%02x%02x", std::max(g, 0), std::max(g, 0), std::max(g, 0));
                s += "<rect x=\"" + std::to_string(left + static_cast<int>(c) * cell_w) + "\" y=\"" + std::to_string(y) +
                     "\" width=\"" + std::to_string(static_cast<int>(e - c) * cell_w) + "\" height=\"" +
                     std::to_string(std::max(cell_h - gap, 1)) + "\" fill=\"" + col + "\"/>\n";
            }
            c = e;
        }
    }
    const int ym = top + static_cast<int>(rows.size()) * cell_h + 2;
    for (const auto& m : marks)
        s += "<rect x=\"" + num(left + m.lo * cell_w, 6) + "\" y=\"" + std::to_string(ym) + "\" width=\"" +
             num((m.hi - m.lo) * cell_w, 6) + "\" height=\"5\" fill=\"" + (m.colour.empty() ? "#3a7dc9" : m.colour) +
             "\"><title>" + esc(m.label) + "</title></rect>\n";
    s += "<rect x=\"" + std::to_string(left) + "\" y=\"" + std::to_string(top) + "\" width=\"" +
         std::to_string(static_cast<int>(C) * cell_w) + "\" height=\"" + std::to_string(static_cast<int>(rows.size()) * cell_h) +
         "\" fill=\"none\" stroke=\"#aaa\"/>\n</svg>\n";
    return s;
}

// One template's mask on a prompt, reduced to B x B cells (B = min(bins, n)); shade = allowed share.
inline std::string binned_mask(const MaskContext& c, MaskTemplate t, std::int64_t bins = 160, int cell = 2) {
    const std::int64_t n = c.n, B = std::max<std::int64_t>(1, std::min(bins, n));
    std::vector<double> cnt(static_cast<std::size_t>(B * B), 0.0);
    std::vector<KeyInterval> iv;
    auto bin_lo = [&](std::int64_t b) { return (b * n + B - 1) / B; };
    for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t rb = i * B / n;
        c.row_intervals(t, i, iv);
        for (const auto& x : iv) {
            std::int64_t j = x.lo;
            while (j < x.hi) {
                const std::int64_t cb = j * B / n;
                const std::int64_t e = std::min(x.hi, bin_lo(cb + 1));
                cnt[static_cast<std::size_t>(rb * B + cb)] += static_cast<double>(e - j);
                j = e;
            }
        }
    }
    std::vector<std::vector<float>> rows(static_cast<std::size_t>(B), std::vector<float>(static_cast<std::size_t>(B)));
    for (std::int64_t r = 0; r < B; ++r)
        for (std::int64_t q = 0; q < B; ++q) {
            const double area = static_cast<double>(bin_lo(r + 1) - bin_lo(r)) * static_cast<double>(bin_lo(q + 1) - bin_lo(q));
            rows[static_cast<std::size_t>(r)][static_cast<std::size_t>(q)] =
                static_cast<float>(area > 0 ? cnt[static_cast<std::size_t>(r * B + q)] / area : 0.0);
        }
    std::vector<ColumnMark> marks;
    for (std::int64_t a = 0; a < c.images(); ++a)
        marks.push_back({static_cast<double>(c.image_start[static_cast<std::size_t>(a)]) * static_cast<double>(B) / static_cast<double>(n),
                         static_cast<double>(c.image_end[static_cast<std::size_t>(a)]) * static_cast<double>(B) / static_cast<double>(n),
                         "", "image " + std::to_string(a)});
    return heat_rows(rows, {}, marks, std::string(to_string(t)), cell, cell, 0);
}

}  // namespace vlsparse::sim::svg
