// vlsparse/sim/golden_run.hpp -- `vlsparse-sim golden verify --backend cpu|cuda CASES`: feeds every
// golden case's inputs through one of the library's backends and compares what it computes with the
// case's outputs, under the golden tolerances (the same compare() and report as a port's check).
//
// CASES is one golden case (a folder with manifest.json), an algorithm folder of cases, or the folder
// of all golden files. A backend is a GoldenCaseRunner: given a case folder and its manifest, every
// output it computes, each with the arithmetic precision whose tolerance applies to it (the manifest's
// "tols" key: fp32 for fp32 arithmetic, bf16 / fp16 for attention kernels that round P and their
// outputs to 16 bits; exact outputs have one bar for all):
//   - cpu: the SIMD path (simd:: ops types of each algorithm, golden::run_<algorithm>_case), fp32
//     (vlsparse/sim/golden_cpu.hpp);
//   - cuda: the CUDA path (sim/golden_cuda.cu; built with -Dcuda=enabled): selections, scores,
//     prefill and decode attention computed on the GPU, the host code every backend shares for the rest
//     (mask pictures, FLOPs, Spearman, the ranking of host scores); its outputs name their precision.
// An output the manifest lists and the backend does not compute fails as missing; a case the backend
// cannot run (an option it does not support) fails with the backend's error message. With an output
// folder, the computed outputs are also written there as <algorithm>/<case>/<file>.npy with a copy of
// the manifest, the layout `golden verify DIR` (and reference/python/golden_check.py) reads.
// Include: <vlsparse/sim/golden_run.hpp> (no SIMD headers: the CUDA translation unit includes it)
#pragma once

#include <algorithm>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "vlsparse/io/golden.hpp"
#include "vlsparse/io/npy.hpp"
#include "vlsparse/sim/golden_verify.hpp"

namespace vlsparse::sim {

// One output a backend computed, and the precision whose tolerance it is held to.
struct GoldenRunOutput {
    std::string name;
    NpyArray array;
    std::string precision = "fp32";
};

using GoldenCaseRunner =
    std::function<std::vector<GoldenRunOutput>(const std::filesystem::path& case_dir, const GoldenManifest& manifest)>;

// The golden cases under `root`: root itself when it holds manifest.json, else its subfolders (an
// algorithm folder) or their subfolders (the folder of all golden files) that do; sorted.
inline std::vector<std::filesystem::path> golden_case_dirs(const std::filesystem::path& root) {
    namespace fs = std::filesystem;
    constexpr const char* fn = "golden verify --backend";
    ::vlsparse::require(fs::is_directory(root), fn, "'", root.string(),
                                "' is not a folder (expected a golden case, an algorithm folder or the golden folder)");
    if (fs::exists(root / "manifest.json")) return {root};
    std::vector<fs::path> r;
    auto subdirs = [](const fs::path& d) {
        std::vector<fs::path> s;
        for (const auto& e : fs::directory_iterator(d))
            if (e.is_directory()) s.push_back(e.path());
        std::sort(s.begin(), s.end());
        return s;
    };
    for (const auto& a : subdirs(root)) {
        if (fs::exists(a / "manifest.json")) {
            r.push_back(a);
            continue;
        }
        for (const auto& c : subdirs(a))
            if (fs::exists(c / "manifest.json")) r.push_back(c);
    }
    ::vlsparse::require(!r.empty(), fn, "'", root.string(),
                                "' holds no golden case (no manifest.json in it, in its subfolders or theirs)");
    return r;
}

namespace detail {

// Compares computed outputs with the case's: each manifest output under the tolerance of the precision
// the backend names (a missing one fails).
inline GoldenCaseCheck check_computed(const std::filesystem::path& case_dir, const GoldenManifest& m,
                                      const std::vector<GoldenRunOutput>& outs) {
    GoldenCaseCheck cc;
    cc.golden_dir = case_dir;
    cc.algorithm = m.algorithm;
    cc.case_name = m.case_name;
    for (const auto& spec0 : m.outputs) {
        GoldenOutputCheck c = output_check_of(spec0);
        const auto it = std::find_if(outs.begin(), outs.end(), [&](const auto& o) { return o.name == spec0.name; });
        if (it == outs.end()) {
            c.missing = true;
            c.detail = "missing: the backend does not compute it";
            cc.outputs.push_back(c);
            continue;
        }
        c.tol = spec0.tol_for(it->precision);
        c.precision = it->precision;
        try {
            compare_output(case_dir, spec0, it->array, c);
        } catch (const std::exception& e) {
            c.pass = false;
            c.detail = e.what();
        }
        cc.outputs.push_back(c);
    }
    return cc;
}

}  // namespace detail

namespace detail {

// A golden runner's named outputs ({name, array}: golden::NamedArray, BlindSightOutput) held to one
// precision's bar.
template <class Named>
std::vector<GoldenRunOutput> with_precision(std::vector<Named> a, const std::string& precision) {
    std::vector<GoldenRunOutput> r;
    for (auto& x : a) r.push_back({std::move(x.name), std::move(x.array), precision});
    return r;
}

}  // namespace detail

// Runs every case under `cases` through `run` and checks its outputs; with `out_dir`, writes them there.
inline GoldenVerifyResult golden_run(const std::filesystem::path& cases, const GoldenCaseRunner& run,
                                     const std::optional<std::filesystem::path>& out_dir = std::nullopt) {
    namespace fs = std::filesystem;
    GoldenVerifyResult res;
    for (const auto& dir : golden_case_dirs(cases)) {
        GoldenManifest m;
        try {
            m = read_manifest(dir);
        } catch (const std::exception& e) {
            GoldenCaseCheck cc;
            cc.golden_dir = dir;
            cc.error = e.what();
            res.cases.push_back(cc);
            continue;
        }
        std::vector<GoldenRunOutput> outs;
        try {
            outs = run(dir, m);
        } catch (const std::exception& e) {
            GoldenCaseCheck cc;
            cc.golden_dir = dir;
            cc.algorithm = m.algorithm;
            cc.case_name = m.case_name;
            cc.error = std::string("the backend could not run it: ") + e.what();
            res.cases.push_back(cc);
            continue;
        }
        GoldenCaseCheck cc = detail::check_computed(dir, m, outs);
        if (out_dir) {
            const fs::path d = *out_dir / m.algorithm / m.case_name;
            fs::create_directories(d);
            fs::copy_file(dir / "manifest.json", d / "manifest.json", fs::copy_options::overwrite_existing);
            for (const auto& o : outs) {
                const auto spec = std::find_if(m.outputs.begin(), m.outputs.end(), [&](const auto& t) { return t.name == o.name; });
                write_npy(d / (spec != m.outputs.end() ? spec->file : o.name + ".npy"), o.array);
            }
            cc.port_dir = d;
        }
        res.cases.push_back(std::move(cc));
    }
    return res;
}

#ifdef VLSPARSE_SIM_CUDA
// The CUDA path (sim/golden_cuda.cu).
std::vector<GoldenRunOutput> cuda_golden_case(const std::filesystem::path& dir, const GoldenManifest& m);
#endif

}  // namespace vlsparse::sim
