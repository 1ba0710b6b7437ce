// vlsparse/sim/progress.hpp -- a progress bar on stderr for runs longer than a second.
//
// Drawn only when stderr is a terminal (quiet when redirected or piped) and only once a second has
// passed, redrawn at most ten times a second, erased when the run ends. Work is counted in arbitrary
// units (the engine uses dense-equivalent (query, key) pairs).
// Include: <vlsparse/sim/progress.hpp>
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include <unistd.h>

namespace vlsparse::sim {

class Progress {
public:
    // enabled = false: never draws (e.g. --quiet).
    explicit Progress(bool enabled = true) : enabled_(enabled && isatty(STDERR_FILENO) == 1) {}
    ~Progress() { finish(); }
    Progress(const Progress&) = delete;
    Progress& operator=(const Progress&) = delete;

    void start(double total_units) {
        total_ = std::max(total_units, 1e-30);
        done_ = 0.0;
        t0_ = clock::now();
        last_draw_ = t0_;
        drawn_ = false;
    }
    void advance(double units, const std::string& what) {
        done_ += units;
        what_ = what;
        draw(false);
    }
    void note(const std::string& what) {
        what_ = what;
        draw(false);
    }
    // Erases the bar (if one was drawn).
    void finish() {
        if (drawn_) {
            std::fprintf(stderr, "\r%*s\r", 100, "");
            std::fflush(stderr);
        }
        drawn_ = false;
    }
    double elapsed() const { return std::chrono::duration<double>(clock::now() - t0_).count(); }

private:
    using clock = std::chrono::steady_clock;
    void draw(bool force) {
        if (!enabled_) return;
        const auto now = clock::now();
        const double el = std::chrono::duration<double>(now - t0_).count();
        if (!force && (el < 1.0 || std::chrono::duration<double>(now - last_draw_).count() < 0.1)) return;
        last_draw_ = now;
        const double f = std::clamp(done_ / total_, 0.0, 1.0);
        constexpr int W = 30;
        const int fill = static_cast<int>(f * W + 0.5);
        std::string bar(static_cast<std::size_t>(fill), '#');
        bar.append(static_cast<std::size_t>(W - fill), '.');
        std::string w = what_;
        if (w.size() > 40) w.resize(40);
        std::fprintf(stderr, "\r[%s] %3.0f%%  %6.1f s  %-40s", bar.c_str(), 100.0 * f, el, w.c_str());
        std::fflush(stderr);
        drawn_ = true;
    }
    bool enabled_ = false, drawn_ = false;
    double total_ = 1.0, done_ = 0.0;
    std::string what_;
    clock::time_point t0_ = clock::now(), last_draw_ = t0_;
};

}  // namespace vlsparse::sim
