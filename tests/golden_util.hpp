// Test helper: checks what a backend produced for a golden case against the stored outputs.
#pragma once

#include <catch2/catch.hpp>

#include <filesystem>
#include <set>
#include <string>

#include <vlsparse/io/golden.hpp>

namespace vt {

// Each produced output (a range of {name, array}) is compared with the stored one by the metric and
// tolerance of its manifest entry, which must be what `metric_of(name)` (the library's documented
// metric) says; the produced outputs and the manifest must name the same tensors, each once.
template <class Outputs, class MetricOf>
void check_golden_outputs(const std::filesystem::path& dir, const vlsparse::GoldenManifest& m, const Outputs& outputs,
                          MetricOf&& metric_of) {
    std::set<std::string> produced;
    for (const auto& o : outputs) {
        REQUIRE(produced.insert(o.name).second);
        const vlsparse::GoldenTensor& spec = m.output(o.name);
        const auto [metric, tol] = metric_of(o.name);
        REQUIRE(spec.metric == metric);
        REQUIRE(spec.tol == tol);
        const vlsparse::CompareResult r = vlsparse::compare(spec, vlsparse::read_tensor(dir, spec), o.array);
        INFO("output " << o.name << ": " << r.detail);
        REQUIRE(r.pass);
    }
    for (const auto& t : m.outputs) REQUIRE(produced.count(t.name) == 1);
    REQUIRE(produced.size() == m.outputs.size());
}

}  // namespace vt
