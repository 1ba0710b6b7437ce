// Test helper: checks what a backend produced for a golden case against the stored outputs.
#pragma once

#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>
#include <string_view>

#include <vlsparse/io/golden.hpp>

namespace vt {

// The arithmetic precision whose tolerances a backend must meet: the reference accumulates in double
// ("fp64"), the SIMD path in fp32 ("fp32").
inline const char* precision_of(std::string_view backend) { return backend == "reference" ? "fp64" : "fp32"; }

// Each produced output (a range of {name, array}) is compared with the stored one by the metric and
// the tolerance for `precision` of its manifest entry; the entry's metric, tol and tols must be what
// `metric_of(name)` (the library's documented metric) says; the produced outputs and the manifest
// must name the same tensors, each once. With VLSPARSE_GOLDEN_REPORT set, every numeric comparison's
// value is printed (how far a backend is from its tolerance).
template <class Outputs, class MetricOf>
void check_golden_outputs(const std::filesystem::path& dir, const vlsparse::GoldenManifest& m, const Outputs& outputs,
                          MetricOf&& metric_of, std::string_view precision = "fp32") {
    const bool report = std::getenv("VLSPARSE_GOLDEN_REPORT") != nullptr;
    std::set<std::string> produced;
    for (const auto& o : outputs) {
        REQUIRE(produced.insert(o.name).second);
        const vlsparse::GoldenTensor& stored = m.output(o.name);
        const auto want = metric_of(o.name);
        REQUIRE(stored.metric == want.metric);
        REQUIRE(stored.tol == want.tol);
        REQUIRE(stored.tols == want.tols);
        vlsparse::GoldenTensor spec = stored;
        spec.tol = stored.tol_for(precision);
        const vlsparse::CompareResult r = vlsparse::compare(spec, vlsparse::read_tensor(dir, spec), o.array);
        if (report && spec.metric != "exact")
            std::printf("golden-report %s/%s %s %s %s %.3e tol %.1e\n", m.algorithm.c_str(), m.case_name.c_str(),
                        o.name.c_str(), std::string(precision).c_str(), spec.metric.c_str(), r.value, spec.tol);
        INFO("output " << o.name << " (" << precision << "): " << r.detail);
        REQUIRE(r.pass);
    }
    for (const auto& t : m.outputs) REQUIRE(produced.count(t.name) == 1);
    REQUIRE(produced.size() == m.outputs.size());
}

}  // namespace vt
