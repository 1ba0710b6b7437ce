// vlsparse/sim/golden_verify.hpp -- `vlsparse-sim golden verify DIR`: a port's outputs against the
// golden files.
//
// `--golden` may name one golden case (a folder with manifest.json): DIR holds the port's outputs of
// that case as .npy files under the manifest's file names, whatever DIR is called. Or it names the
// folder of all golden files, and DIR is laid out like it: either one case folder (its outputs as
// .npy files, optionally with a copy of manifest.json), an algorithm folder of cases, or a whole tree
// <algorithm>/<case>/. A case is matched to golden/<algorithm>/<case>/ by its manifest.json
// (algorithm and case), else by its folder names, else by its .npy file names: the one golden case
// whose outputs are all there and whose outputs and inputs are all there is, else the one whose
// outputs are all there. Every output
// of the golden manifest is compared with vlsparse::compare (io/golden.hpp) under its metric and the
// tolerance for the port's arithmetic precision (`precision`, default fp32: the manifest's "tols"
// entry for it, else "tol"; as golden_check.py --precision): pass, or the first difference (flat and
// multi-index, expected, got, |difference|) and the metric's value against the tolerance. A missing
// output file fails.
// Include: <vlsparse/sim/golden_verify.hpp>
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "vlsparse/io/golden.hpp"
#include "vlsparse/io/npy.hpp"

namespace vlsparse::sim {

struct GoldenOutputCheck {
    std::string name, file, metric;
    double tol = 0.0;
    std::string precision;      // golden verify --backend: the precision whose tolerance applies (else empty)
    bool pass = false;
    bool missing = false;
    double value = 0.0;         // the metric's value (exact: the number of differing elements)
    std::int64_t first = -1;    // flat index of the first difference (-1: none / not comparable)
    double expected = NAN, got = NAN, diff = NAN;
    std::string detail;         // one line
};

struct GoldenCaseCheck {
    std::string algorithm, case_name;
    std::filesystem::path golden_dir, port_dir;
    std::vector<GoldenOutputCheck> outputs;
    std::string error;  // non-empty: the case could not be checked (counts as a failure)

    std::size_t passed() const {
        return static_cast<std::size_t>(std::count_if(outputs.begin(), outputs.end(), [](const auto& o) { return o.pass; }));
    }
    bool pass() const { return error.empty() && passed() == outputs.size(); }
};

struct GoldenVerifyResult {
    std::vector<GoldenCaseCheck> cases;
    bool pass() const {
        return !cases.empty() && std::all_of(cases.begin(), cases.end(), [](const auto& c) { return c.pass(); });
    }
};

namespace detail {

// The check of one manifest output before anything is compared: its name, file and metric.
inline GoldenOutputCheck output_check_of(const GoldenTensor& spec) {
    GoldenOutputCheck c;
    c.name = spec.name;
    c.file = spec.file;
    c.metric = spec.metric;
    return c;
}

// Compares `got` with the golden case's tensor `spec` under the tolerance c.tol: fills c's verdict, the
// metric's value, the report line and the first difference. Throws what reading the golden tensor or
// comparing throws.
inline void compare_output(const std::filesystem::path& golden_case, const GoldenTensor& spec, const NpyArray& got,
                           GoldenOutputCheck& c) {
    const NpyArray expected = read_tensor(golden_case, spec);
    GoldenTensor bar = spec;
    bar.tol = c.tol;
    const CompareResult r = compare(bar, expected, got);
    c.pass = r.pass;
    c.value = r.value;
    c.detail = r.detail;
    c.first = r.first;
    c.expected = r.expected;
    c.got = r.got;
    c.diff = r.diff;
}

inline GoldenCaseCheck verify_case(const std::filesystem::path& port, const std::filesystem::path& golden_case,
                                   const std::string& precision = "fp32") {
    GoldenCaseCheck cc;
    cc.golden_dir = golden_case;
    cc.port_dir = port;
    GoldenManifest m;
    try {
        m = read_manifest(golden_case);
    } catch (const std::exception& e) {
        cc.error = e.what();
        return cc;
    }
    cc.algorithm = m.algorithm;
    cc.case_name = m.case_name;
    for (const auto& spec : m.outputs) {
        GoldenOutputCheck c = output_check_of(spec);
        c.tol = spec.tol_for(precision);
        c.precision = precision == "fp32" ? "" : precision;
        const auto pf = port / spec.file;
        if (!std::filesystem::exists(pf)) {
            c.missing = true;
            c.detail = "missing: " + pf.string() + " does not exist";
            cc.outputs.push_back(c);
            continue;
        }
        try {
            compare_output(golden_case, spec, read_npy(pf), c);
        } catch (const std::exception& e) {
            c.pass = false;
            c.detail = e.what();
        }
        cc.outputs.push_back(c);
    }
    return cc;
}

inline bool has_npy(const std::filesystem::path& d) {
    for (const auto& e : std::filesystem::directory_iterator(d))
        if (e.is_regular_file() && e.path().extension() == ".npy") return true;
    return false;
}

// A golden case whose every output file is present in a port's folder; `exact` when, besides, every
// .npy file of the folder is one of the case's outputs or inputs.
struct CaseFit {
    std::filesystem::path dir;
    std::size_t outputs = 0;
    bool exact = false;
};

// The golden cases <root>/<algorithm>/<case>/ that fit the .npy files of d; most outputs first, then
// by path.
inline std::vector<CaseFit> cases_with_outputs_in(const std::filesystem::path& d, const std::filesystem::path& root) {
    namespace fs = std::filesystem;
    std::vector<std::string> npy;
    for (const auto& e : fs::directory_iterator(d))
        if (e.is_regular_file() && e.path().extension() == ".npy") npy.push_back(e.path().filename().string());
    std::vector<CaseFit> r;
    for (const auto& a : fs::directory_iterator(root)) {
        if (!a.is_directory()) continue;
        for (const auto& c : fs::directory_iterator(a.path())) {
            if (!c.is_directory() || !fs::exists(c.path() / "manifest.json")) continue;
            try {
                const GoldenManifest m = read_manifest(c.path());
                auto has = [&](const std::string& f) { return std::find(npy.begin(), npy.end(), f) != npy.end(); };
                const bool all = !m.outputs.empty() &&
                                 std::all_of(m.outputs.begin(), m.outputs.end(), [&](const auto& o) { return has(o.file); });
                if (!all) continue;
                auto in_case = [&](const std::string& f) {
                    auto named = [&](const auto& t) { return t.file == f; };
                    return std::any_of(m.outputs.begin(), m.outputs.end(), named) ||
                           std::any_of(m.inputs.begin(), m.inputs.end(), named);
                };
                r.push_back({c.path(), m.outputs.size(), std::all_of(npy.begin(), npy.end(), in_case)});
            } catch (const std::exception&) {
                // not a readable golden case: not a candidate
            }
        }
    }
    std::sort(r.begin(), r.end(), [](const CaseFit& x, const CaseFit& y) {
        return x.outputs != y.outputs ? x.outputs > y.outputs : x.dir < y.dir;
    });
    return r;
}

}  // namespace detail

// Verifies a port's output folder against `golden_root`: one golden case (a folder with manifest.json;
// the port folder is then that case's outputs, whatever its name), or the folder of all golden files
// (the port folder is a case, an algorithm folder or a tree). Throws vlsparse::error when DIR is not a
// folder or holds nothing that names a golden case.
inline GoldenVerifyResult golden_verify(const std::filesystem::path& port, const std::filesystem::path& golden_root,
                                        const std::string& precision = "fp32") {
    namespace fs = std::filesystem;
    constexpr const char* fn = "golden verify";
    ::vlsparse::require(is_golden_precision(precision), fn, "precision '", precision,
                                "', expected fp64, fp32, fp16 or bf16");
    ::vlsparse::require(fs::is_directory(port), fn, "'", port.string(), "' is not a folder");
    ::vlsparse::require(fs::is_directory(golden_root), fn, "the golden folder '", golden_root.string(),
                                "' does not exist (pass --golden DIR or set VLSPARSE_GOLDEN_DIR)");
    GoldenVerifyResult res;
    if (fs::exists(golden_root / "manifest.json")) {  // --golden golden/<algorithm>/<case>
        res.cases.push_back(detail::verify_case(port, golden_root, precision));
        return res;
    }
    // A case folder: manifest.json, or .npy files.
    auto as_case = [&](const fs::path& d) -> bool {
        if (fs::exists(d / "manifest.json")) {
            std::string algo, name;
            try {
                const GoldenManifest pm = read_manifest(d);
                algo = pm.algorithm;
                name = pm.case_name;
            } catch (const std::exception& e) {
                GoldenCaseCheck cc;
                cc.port_dir = d;
                cc.error = std::string("the port's manifest.json cannot be read: ") + e.what();
                res.cases.push_back(cc);
                return true;
            }
            const fs::path g = golden_root / algo / name;
            if (!fs::is_directory(g)) {
                GoldenCaseCheck cc;
                cc.port_dir = d;
                cc.algorithm = algo;
                cc.case_name = name;
                cc.error = "its manifest names " + algo + "/" + name + ", which is not in " + golden_root.string();
                res.cases.push_back(cc);
                return true;
            }
            res.cases.push_back(detail::verify_case(d, g, precision));
            return true;
        }
        if (detail::has_npy(d)) {
            const fs::path abs = fs::absolute(d).lexically_normal();
            fs::path p = abs;
            if (!p.has_filename()) p = p.parent_path();
            const std::string name = p.filename().string(), algo = p.parent_path().filename().string();
            const fs::path g = golden_root / algo / name;
            if (fs::is_directory(g)) {
                res.cases.push_back(detail::verify_case(d, g, precision));
                return true;
            }
            // Not named like a case: the one case whose outputs (and inputs) are exactly its .npy files,
            // else the one case whose outputs are all among them.
            std::vector<fs::path> exact, all;
            for (const auto& f : detail::cases_with_outputs_in(d, golden_root)) {
                all.push_back(f.dir);
                if (f.exact) exact.push_back(f.dir);
            }
            const std::vector<fs::path>& cands = exact.empty() ? all : exact;
            if (cands.size() == 1) {
                res.cases.push_back(detail::verify_case(d, cands[0], precision));
                return true;
            }
            GoldenCaseCheck cc;
            cc.port_dir = d;
            cc.error = "no manifest.json, its folder names " + algo + "/" + name + " are not a case of " +
                       golden_root.string() + ", and ";
            if (cands.empty()) {
                cc.error += "no golden case has all its outputs among its .npy files";
            } else {
                cc.error += "its .npy files hold the outputs of " + std::to_string(cands.size()) + " golden cases (";
                for (std::size_t i = 0; i < cands.size() && i < 4; ++i)
                    cc.error += (i ? ", " : "") + cands[i].parent_path().filename().string() + "/" + cands[i].filename().string();
                cc.error += cands.size() > 4 ? ", ...)" : ")";
            }
            cc.error += "; name the case: --golden " + (golden_root / "ALGORITHM" / "CASE").string();
            res.cases.push_back(cc);
            return true;
        }
        return false;
    };
    std::function<void(const fs::path&, int)> walk = [&](const fs::path& d, int depth) {
        if (as_case(d) || depth >= 2) return;
        std::vector<fs::path> subs;
        for (const auto& e : fs::directory_iterator(d))
            if (e.is_directory()) subs.push_back(e.path());
        std::sort(subs.begin(), subs.end());
        for (const auto& s : subs) walk(s, depth + 1);
    };
    walk(port, 0);
    ::vlsparse::require(!res.cases.empty(), fn, "'", port.string(),
                                "' holds no case: expected .npy outputs (and optionally manifest.json) in it, or "
                                "<case>/ or <algorithm>/<case>/ folders");
    return res;
}

inline void print_golden_verify(std::FILE* f, const GoldenVerifyResult& r) {
    std::size_t outs = 0, outs_ok = 0, cases_ok = 0;
    for (const auto& c : r.cases) {
        std::fprintf(f, "%s/%s  (port %s, golden %s)\n", c.algorithm.empty() ? "?" : c.algorithm.c_str(),
                     c.case_name.empty() ? "?" : c.case_name.c_str(), c.port_dir.empty() ? "-" : c.port_dir.string().c_str(),
                     c.golden_dir.empty() ? "-" : c.golden_dir.string().c_str());
        if (!c.error.empty()) {
            std::fprintf(f, "  ERROR %s\n", c.error.c_str());
            continue;
        }
        std::size_t w = 4;
        for (const auto& o : c.outputs) w = std::max(w, o.name.size());
        for (const auto& o : c.outputs)
            std::fprintf(f, "  %s  %-*s  %s%s\n", o.pass ? "PASS" : "FAIL", static_cast<int>(w), o.name.c_str(),
                         o.precision.empty() || o.metric == "exact" ? "" : ("[" + o.precision + " bar] ").c_str(), o.detail.c_str());
        std::fprintf(f, "  %zu of %zu outputs pass\n", c.passed(), c.outputs.size());
        outs += c.outputs.size();
        outs_ok += c.passed();
        cases_ok += c.pass();
    }
    std::fprintf(f, "\n%s: %zu of %zu cases pass (%zu of %zu outputs)\n", r.pass() ? "PASS" : "FAIL", cases_ok,
                 r.cases.size(), outs_ok, outs);
}

inline nlohmann::json to_json(const GoldenVerifyResult& r) {
    nlohmann::json cases = nlohmann::json::array();
    for (const auto& c : r.cases) {
        nlohmann::json outs = nlohmann::json::array();
        for (const auto& o : c.outputs) {
            nlohmann::json j{{"name", o.name},   {"file", o.file},       {"metric", o.metric}, {"tol", o.tol},
                             {"pass", o.pass},   {"missing", o.missing}, {"detail", o.detail}};
            if (std::isfinite(o.value)) j["value"] = o.value;
            if (!o.precision.empty()) j["precision"] = o.precision;
            if (o.first >= 0) {
                j["first_index"] = o.first;
                j["expected"] = std::isfinite(o.expected) ? nlohmann::json(o.expected) : nlohmann::json(nullptr);
                j["got"] = std::isfinite(o.got) ? nlohmann::json(o.got) : nlohmann::json(nullptr);
                j["diff"] = std::isfinite(o.diff) ? nlohmann::json(o.diff) : nlohmann::json(nullptr);
            }
            outs.push_back(j);
        }
        cases.push_back({{"algorithm", c.algorithm},
                         {"case", c.case_name},
                         {"port", c.port_dir.string()},
                         {"golden", c.golden_dir.string()},
                         {"pass", c.pass()},
                         {"error", c.error},
                         {"outputs", outs}});
    }
    return nlohmann::json{{"format", "vlsparse.sim.golden_verify"}, {"version", 1}, {"pass", r.pass()}, {"cases", cases}};
}

}  // namespace vlsparse::sim
