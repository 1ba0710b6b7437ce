// python/src/sim.cpp -- vlsparse.golden (verify a port's outputs against the golden files) and
// vlsparse.sim (the simulator's run and compare, returning the JSON report as a dict). Both call the
// simulator's own code (sim/include/vlsparse/sim/): golden_verify() and to_json() of `vlsparse-sim
// golden verify`, scenario loading with --set overrides, run_scenario / run_engine and report_json()
// of `vlsparse-sim run` / `compare`. Its own translation unit: the simulator is the heaviest part to
// compile.
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "common.hpp"

#include "vlsparse/sim/commands.hpp"

namespace vlsparse::python {

namespace {

using namespace pybind11::literals;

// A scenario given as None (the built-in default), a dict (the scenario's JSON), or a path to a
// scenario file; --set style overrides ("key.sub=value") applied after.
sim::Scenario scenario_arg(const py::object& scenario, const std::vector<std::string>& sets) {
    if (scenario.is_none()) return sim::load_scenario_with_sets(std::nullopt, sets);
    if (py::isinstance<py::dict>(scenario)) {
        nlohmann::json j = to_json(scenario);
        for (const auto& s : sets) sim::apply_set(j, s);
        return sim::scenario_from_json(j, "(python dict)", std::filesystem::current_path());
    }
    const std::string path = py::str(py::module_::import("os").attr("fspath")(scenario)).cast<std::string>();
    return sim::load_scenario_with_sets(path, sets);
}

py::object run(const py::object& scenario, const std::vector<std::string>& sets, const std::string& command) {
    if (command != "run" && command != "compare")
        throw error("vlsparse.sim.run", "command = '" + command + "', expected 'run' or 'compare'");
    const sim::Scenario s = scenario_arg(scenario, sets);
    nlohmann::json report;
    {
        py::gil_scoped_release nogil;
        sim::EngineOptions eo;  // no progress output
        if (command == "run") {
            report = sim::report_json("run", s, sim::run_scenario(s, eo));
        } else {
            std::vector<sim::PolicyToRun> runs = sim::sweep_policies(s);
            sim::check_memory(s, runs.size() + 1);
            report = sim::report_json("compare", s, sim::run_engine(s, std::move(runs), eo));
        }
    }
    return from_json(report);
}

py::object verify(const py::object& dir, const py::object& golden) {
    auto path_of = [](const py::object& p) {
        return std::filesystem::path(py::str(py::module_::import("os").attr("fspath")(p)).cast<std::string>());
    };
    const std::filesystem::path port = path_of(dir);
    const std::filesystem::path root = golden.is_none() ? sim::default_golden_dir() : path_of(golden);
    nlohmann::json j;
    {
        py::gil_scoped_release nogil;
        j = sim::to_json(sim::golden_verify(port, root));
    }
    return from_json(j);
}

}  // namespace

void bind_sim(py::module_& m) {
    py::module_ g = m.def_submodule("golden", "The golden files: verify a port's outputs against them.");
    g.def("verify", &verify, "dir"_a, "golden"_a = py::none(),
          "Checks the .npy outputs in `dir` against the golden files, each output by its manifest's metric and "
          "tolerance (what `vlsparse-sim golden verify DIR [--golden G]` does). `golden`: one case folder "
          "(golden/<algorithm>/<case>; `dir` then holds that case's outputs, whatever it is called) or the folder "
          "of all golden files (default: $VLSPARSE_GOLDEN_DIR, ./golden, or the source tree's golden/). Returns "
          "the report as a dict: {'pass': bool, 'cases': [{'algorithm', 'case', 'pass', 'error', 'outputs': "
          "[{'name', 'metric', 'tol', 'pass', 'value', 'detail', ...}]}]}. Raises vlsparse.Error when `dir` holds "
          "no case.");
    g.def("default_dir", []() { return sim::default_golden_dir().string(); },
          "The golden folder verify() uses by default.");

    py::module_ s = m.def_submodule("sim", "The simulator: policies over a whole model's attention (docs/simulator.md).");
    s.def("run", &run, "scenario"_a = py::none(), py::kw_only(), "sets"_a = std::vector<std::string>{}, "command"_a = "run",
          "Runs a scenario (None: the built-in default; a dict: the scenario's JSON; or a path to a scenario file), "
          "with `sets` overrides as `vlsparse-sim --set` takes them ('decode_steps=4'), and returns the JSON report "
          "of `vlsparse-sim run --no-sweep --json` (command='compare': of `vlsparse-sim compare`, every policy's sweep) as a "
          "dict.");
    s.def("default_scenario", []() { return from_json(nlohmann::json::parse(sim::default_scenario_text())); },
          "The built-in default scenario as a dict.");
}

}  // namespace vlsparse::python
