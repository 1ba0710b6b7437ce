// vlsparse/sim/cli.hpp -- command-line parsing for vlsparse-sim: options, usage texts, --set overrides.
// Include: <vlsparse/sim/cli.hpp>
#pragma once

#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "vlsparse/core/error.hpp"

namespace vlsparse::sim {

// The arguments after the subcommand, consumed option by option.
class Args {
public:
    Args(std::vector<std::string> a, std::string cmd) : a_(std::move(a)), cmd_(std::move(cmd)) {}

    bool empty() const { return i_ >= a_.size(); }
    const std::string& peek() const { return a_[i_]; }
    std::string next() { return a_[i_++]; }
    // True (and consumed) when the next argument is `name`.
    bool flag(std::string_view name) {
        if (!empty() && a_[i_] == name) {
            ++i_;
            return true;
        }
        return false;
    }
    // The value of `--name VALUE` or `--name=VALUE` when the next argument is that option.
    std::optional<std::string> value(std::string_view name) {
        if (empty()) return std::nullopt;
        const std::string& s = a_[i_];
        if (s == name) {
            if (i_ + 1 >= a_.size()) fail(std::string(name) + " needs a value");
            i_ += 2;
            return a_[i_ - 1];
        }
        if (s.size() > name.size() && s.compare(0, name.size(), name) == 0 && s[name.size()] == '=') {
            ++i_;
            return s.substr(name.size() + 1);
        }
        return std::nullopt;
    }
    [[noreturn]] void fail(const std::string& msg) const {
        throw ::vlsparse::error("vlsparse-sim " + cmd_, msg + " (see vlsparse-sim " + cmd_ + " --help)");
    }
    std::int64_t integer(const std::string& opt, const std::string& v, std::int64_t lo, std::int64_t hi) const {
        char* end = nullptr;
        const long long x = std::strtoll(v.c_str(), &end, 10);
        if (v.empty() || *end || x < lo || x > hi)
            fail(opt + ": '" + v + "' is not an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
        return x;
    }
    double number(const std::string& opt, const std::string& v) const {
        char* end = nullptr;
        const double x = std::strtod(v.c_str(), &end);
        if (v.empty() || *end) fail(opt + ": '" + v + "' is not a number");
        return x;
    }

private:
    std::vector<std::string> a_;
    std::string cmd_;
    std::size_t i_ = 0;
};

// Applies "path=value" to a scenario's JSON before it is checked: path is dotted keys with [i]
// indices ("model.layers", "policies[0].params.tau"); value is JSON when it parses as JSON, else a
// string ("layout=text:10,image:64").
inline void apply_set(nlohmann::json& j, const std::string& assignment) {
    const auto eq = assignment.find('=');
    if (eq == std::string::npos || eq == 0)
        throw ::vlsparse::error("--set", "'" + assignment + "': expected path=value, e.g. model.layers=4");
    const std::string path = assignment.substr(0, eq), text = assignment.substr(eq + 1);
    nlohmann::json value;
    try {
        value = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception&) {
        value = text;
    }
    nlohmann::json* cur = &j;
    std::size_t p = 0;
    while (p < path.size()) {
        if (path[p] == '[') {
            const auto close = path.find(']', p);
            if (close == std::string::npos) throw ::vlsparse::error("--set", "'" + path + "': unclosed [");
            const std::size_t idx = std::strtoul(path.substr(p + 1, close - p - 1).c_str(), nullptr, 10);
            if (!cur->is_array() || idx >= cur->size())
                throw ::vlsparse::error("--set", "'" + path + "': index " + std::to_string(idx) + " is not in the array");
            cur = &(*cur)[idx];
            p = close + 1;
            if (p < path.size() && path[p] == '.') ++p;
            continue;
        }
        std::size_t e = p;
        while (e < path.size() && path[e] != '.' && path[e] != '[') ++e;
        const std::string key = path.substr(p, e - p);
        if (!cur->is_object() && !cur->is_null())
            throw ::vlsparse::error("--set", "'" + path + "': '" + key + "' is not inside an object");
        cur = &(*cur)[key];
        p = e;
        if (p < path.size() && path[p] == '.') ++p;
    }
    *cur = value;
}

inline const char* kTopUsage =
    "usage: vlsparse-sim [COMMAND] [options]\n"
    "\n"
    "Runs visual-token sparsity policies (ZipVL, A-VL, BlindSight, PureKV, the baselines) over a whole\n"
    "model's attention on the CPU, layer by layer, prefill then decode, and reports what each keeps,\n"
    "what it costs and how far its outputs drift from dense attention.\n"
    "\n"
    "commands:\n"
    "  run [SCENARIO.json]        run a scenario (default: the built-in default) and write a report\n"
    "  compare [SCENARIO.json]    sweep each policy's budget or threshold: fidelity against cost\n"
    "  sweep [SCENARIO.json]      compare's sweeps over several seeds, fidelity at matched budgets\n"
    "  claims [SCENARIO.json]     the four papers' central claims measured at matched budgets, with verdicts\n"
    "  realism [SCENARIO.json]    attention statistics of the source (sinks, locality, entropy, cross-layer)\n"
    "  fit TARGET.json            synthetic generator parameters resembling the target's statistics\n"
    "  characterize [SCENARIO]    BlindSight calibration (Algorithms 1 + 2) over several prompts -> head map\n"
    "  masks [SCENARIO | --layout SPEC]   the mask templates of a prompt as SVG pictures\n"
    "  golden verify DIR --golden golden/ALGORITHM/CASE\n"
    "                             compare a port's outputs with a golden case\n"
    "  golden verify --backend cpu|cuda [CASES]\n"
    "                             run the golden cases through a backend and compare\n"
    "  policies                   list the policies and their parameters\n"
    "  export [SCENARIO] OUTDIR   write the scenario's Q/K/V as a dump (the format of dump_qkv.py)\n"
    "\n"
    "With no command, `run` on the built-in default scenario. `vlsparse-sim COMMAND --help` for the\n"
    "options of each. Scenario files: sim/scenarios/; format and metrics: docs/simulator.md.\n"
    "A scenario whose estimated memory exceeds 16 GiB is rejected before it runs;\n"
    "VLSPARSE_SIM_MAX_MEMORY_GIB=N sets another limit (N GiB).\n";

inline const char* kRunUsage =
    "usage: vlsparse-sim run [SCENARIO.json] [options]\n"
    "\n"
    "Runs the scenario (default: the built-in default, the same as sim/scenarios/default.json): the dense\n"
    "reference and every policy, prefill layer by layer then the decode steps. Prints a table and\n"
    "writes an HTML report (and optionally JSON). Then a budget sweep (every policy over its sweep, as\n"
    "compare, one seed) ranks the policies at 10, 20, 30 and 50% of the KV cache and of the FLOPs: the\n"
    "report's first section (curves, Pareto front, best policy at each budget).\n"
    "\n"
    "options:\n"
    "  --out DIR          folder of the reports (default: the current folder)\n"
    "  --html FILE        the HTML report's path (default: DIR/sim-report.html)\n"
    "  --no-html          no HTML report\n"
    "  --json FILE        also write the JSON report\n"
    "  --per-layer        print a table per policy, one row per layer\n"
    "  --no-sweep         no budget sweep (faster: one run per policy; the report keeps its other sections)\n"
    "  --set PATH=VALUE   override a scenario key before it is checked, e.g. --set model.layers=4,\n"
    "                     --set decode_steps=0, --set 'policies[0].params.tau=0.9' (repeatable)\n"
    "  --backend NAME     cpu (the SIMD path, fp32) or cuda (the CUDA kernels, bf16; a build with\n"
    "                     -Dcuda=enabled): the same as --set backend=NAME\n"
    "  --quiet            no progress bar\n"
    "  -h, --help         this text\n";

inline const char* kCompareUsage =
    "usage: vlsparse-sim compare [SCENARIO.json] [options]\n"
    "\n"
    "Runs every policy of the scenario once per value of its sweep (the policy entry's \"sweep\": {\"param\",\n"
    "\"values\"}, or the policy's default sweep: ZipVL tau, A-VL rates, BlindSight templates, PureKV and\n"
    "baseline budgets) against one dense reference, and reports fidelity (NMSE, attention mass, tokens)\n"
    "against cost (kept ratio, FLOPs, KV bytes).\n"
    "\n"
    "options:\n"
    "  --out DIR          folder of the reports (default: the current folder)\n"
    "  --html FILE        the HTML report's path (default: DIR/sim-compare.html)\n"
    "  --no-html          no HTML report\n"
    "  --json FILE        also write the JSON report\n"
    "  --set PATH=VALUE   override a scenario key (see run --help)\n"
    "  --backend NAME     cpu or cuda (see run --help)\n"
    "  --quiet            no progress bar\n"
    "  -h, --help         this text\n";

inline const char* kSweepUsage =
    "usage: vlsparse-sim sweep [SCENARIO.json] [options]\n"
    "\n"
    "Runs compare's sweeps (every policy over its budget sweep: the policy entry's \"sweep\", or its default\n"
    "sweep, `vlsparse-sim policies`) once per seed (the scenario's seed, seed + 1, ...), and reports each\n"
    "fidelity metric (NMSE decode and prefill, attention mass at decode; in residual mode tokens agree, KL\n"
    "to dense and hidden NMSE) at common budgets: each seed's points, sorted by the achieved kept ratio\n"
    "(or attention FLOPs), interpolated linearly at every budget (NMSE and KL on a log scale), never\n"
    "extrapolated; the mean over the seeds and half their range. Table on the terminal, HTML plot of\n"
    "fidelity against budget (one curve per policy), optionally JSON with every point.\n"
    "\n"
    "options:\n"
    "  --seeds N          seeds to run (default 3)\n"
    "  --budgets LIST     common budgets, increasing, fractions of dense or percentages\n"
    "                     (default 0.1,0.2,0.3,0.45,0.5)\n"
    "  --x kept|flops     the budget axis: kept ratio of the KV cache (default) or attention FLOPs\n"
    "  --out DIR          folder of the reports (default: the current folder)\n"
    "  --html FILE        the HTML report's path (default: DIR/sim-sweep.html)\n"
    "  --no-html          no HTML report\n"
    "  --json FILE        also write the JSON report\n"
    "  --set PATH=VALUE   override a scenario key (see run --help)\n"
    "  --backend NAME     cpu or cuda (see run --help)\n"
    "  --quiet            no progress bar\n"
    "  -h, --help         this text\n";

inline const char* kClaimsUsage =
    "usage: vlsparse-sim claims [SCENARIO.json] [options]\n"
    "\n"
    "One row per central claim of the four papers, measured on the scenario's model, prompt, decode steps\n"
    "and source, means over the seeds, with a verdict (decode NMSE against dense; lower is better). The\n"
    "scenario's policies are not run: each claim's policy starts from the params of the scenario's entry\n"
    "of that policy, if any (e.g. a SnapKV window for a short prompt), with the claim's budget on top:\n"
    "  ZipVL       adaptive ratio (tau 0.7, 0.8, 0.9) vs ratio=fixed at each run's achieved kept ratio:\n"
    "              reproduced when adaptive is lower at every tau\n"
    "  ZipVL       normalized vs accumulated ranking, ratio=fixed at 10, 20, 30%: normalized lower at every budget\n"
    "  PureKV      at 10% and 20% KV budget, PureKV (default params; grouping=layer shown beside) vs H2O\n"
    "              (heavy = recent = budget/2) and SnapKV (capacity): PureKV at most the better baseline at both\n"
    "  BlindSight  Algorithm 1 + 2 over --prompts prompts of one model (residual / dump: its one prompt): the\n"
    "              share of heads not Dense within 60% +- 10 points\n"
    "  A-VL        the 30% core (compute_rate 0.7, K = 3) vs the same kept set read in full every step\n"
    "              (refresh_every = 0): at most 1.5x its decode NMSE\n"
    "\"partly (k of n)\" when k of the n compared budgets agree with the claim. docs/simulator.md records the\n"
    "results and says which of them the synthetic generator plants.\n"
    "\n"
    "options:\n"
    "  --seeds N          seeds (the scenario's seed, seed + 1, ...; default 3; a dump source: 1)\n"
    "  --prompts N        BlindSight calibration prompts per seed, synthetic source (default 4)\n"
    "  --json FILE        also write the rows and their numbers as JSON\n"
    "  --set PATH=VALUE   override a scenario key (see run --help)\n"
    "  --quiet            no progress bar\n"
    "  -h, --help         this text\n";

inline const char* kRealismUsage =
    "usage: vlsparse-sim realism [SCENARIO.json] [options]\n"
    "\n"
    "Measures, per layer of the scenario's source (synthetic; residual: its dense run; dump: the recorded\n"
    "model), the attention statistics the papers' methods rely on, so that a synthetic scenario can be\n"
    "compared with a model's dump on the same numbers: mass on token 0 and on the first 10% of every image\n"
    "(sinks), mass on the last local-radius + 1 keys (locality), normalized entropy, its spread over heads\n"
    "and the share of diffuse heads (head diversity), the share of PureKV's window scores on the top 5% of\n"
    "keys (heavy hitters), and Spearman of those scores against the next layer's (cross-layer consistency).\n"
    "The query rows are spread evenly over [n/4, n), the last one included.\n"
    "\n"
    "options:\n"
    "  --rows N           query rows per layer (default 64)\n"
    "  --local-radius R   locality: keys i - R .. i (default 4)\n"
    "  --json FILE        also write the numbers as JSON\n"
    "  --set PATH=VALUE   override a scenario key (see run --help)\n"
    "  --quiet            no progress bar\n"
    "  -h, --help         this text\n";

inline const char* kFitUsage =
    "usage: vlsparse-sim fit TARGET.json [options]\n"
    "\n"
    "Fits the synthetic generator to a target scenario's source (typically a dump of a real model from\n"
    "sim/tools/dump_qkv.py): on the target's prompt layout and model shape, a coordinate search from the\n"
    "generator's defaults over sink, heavy, local, document, noise (x0.5, x0.75, x1.33, x2) and the diffuse\n"
    "head shares of layer 0, layer 1 and later layers (-0.2 .. +0.2) lowers the distance between the\n"
    "statistics of `vlsparse-sim realism` (mean over layers of their squared differences). Prints the\n"
    "target's, the defaults' and the fitted statistics and the distances, and writes the target scenario\n"
    "with the fitted synthetic source. A local search: it says how far it got, not that it is optimal.\n"
    "\n"
    "options:\n"
    "  --out FILE         the fitted scenario (default fitted-scenario.json)\n"
    "  --passes N         passes over the parameters (default 2)\n"
    "  --rows N           query rows per layer of the statistics (default 64)\n"
    "  --set PATH=VALUE   override a key of the target scenario (see run --help)\n"
    "  --quiet            no progress bar\n"
    "  -h, --help         this text\n";

inline const char* kCharacterizeUsage =
    "usage: vlsparse-sim characterize [SCENARIO.json] [options]\n"
    "\n"
    "BlindSight calibration: for each of N prompts (the scenario's source with seeds seed, seed+1, ...\n"
    "for the prompt content and one model: a synthetic source's head roles come from model_seed, default\n"
    "the scenario's seed; a dump or residual source is one prompt, a residual one through its dense run)\n"
    "and every layer, Algorithm 1 picks each head's template (the first of\n"
    "Sink, Document, Document-Sink whose output NMSE against dense is below alpha, else Dense);\n"
    "Algorithm 2 aggregates the choices into one template per (layer, head). Writes the head map as JSON\n"
    "(io/blindsight_json.hpp), which a scenario uses as {\"name\": \"blindsight\", \"params\": {\"head_map\": FILE}}.\n"
    "\n"
    "options:\n"
    "  --prompts N        prompts to calibrate on (default 4)\n"
    "  --out FILE         the head map (default: blindsight-head-map.json)\n"
    "  --svg FILE         also draw the head map as SVG\n"
    "  --alpha A          Algorithm 1's NMSE threshold (default 0.1)\n"
    "  --gamma-c G, --gamma-s G, --gamma-d G   Algorithm 2's thresholds (defaults 0.25, 0.6, 0.6)\n"
    "  --sink-fraction F  sinks: the first ceil(F * len) tokens of each image (default 0.1)\n"
    "  --set PATH=VALUE   override a scenario key (see run --help)\n"
    "  --quiet            no progress bar\n"
    "  -h, --help         this text\n";

inline const char* kMasksUsage =
    "usage: vlsparse-sim masks [SCENARIO.json | --layout SPEC] [options]\n"
    "\n"
    "Draws the BlindSight mask templates (Dense, Sink, Document, Document-Sink) of a prompt layout as SVG\n"
    "files (masks/render.hpp): query rows x key columns, allowed pairs dark, images marked on the axes.\n"
    "\n"
    "options:\n"
    "  --layout SPEC      the layout (Layout::parse syntax, e.g. text:20,image:64,text:4,image:64,text:8);\n"
    "                     default: the scenario's (or the built-in default's)\n"
    "  --template T       only this template (Dense, Sink, Document or Document-Sink)\n"
    "  --out DIR          folder of the pictures (default: masks)\n"
    "  --cell N           pixels per token (default: 2 up to 512 tokens, else 1)\n"
    "  --sink-fraction F  sinks: the first ceil(F * len) tokens of each image (default 0.1)\n"
    "  --head-map FILE    also draw this head map (from characterize)\n"
    "  -h, --help         this text\n";

inline const char* kGoldenUsage =
    "usage: vlsparse-sim golden verify DIR --golden golden/ALGORITHM/CASE [options]\n"
    "       vlsparse-sim golden verify DIR [--golden GOLDEN_ROOT] [options]\n"
    "       vlsparse-sim golden verify --backend cpu|cuda [CASES] [--out DIR] [options]\n"
    "\n"
    "Compares a port's outputs with the golden files. First form: DIR holds the port's outputs of one\n"
    "case as .npy files under the file names of that case's manifest (golden/ALGORITHM/CASE/manifest.json),\n"
    "whatever DIR is called. Second form: --golden names the folder of all golden files (default:\n"
    "$VLSPARSE_GOLDEN_DIR, ./golden, or the source tree's) and DIR is laid out like it: one case folder,\n"
    "an algorithm folder of cases, or a tree <algorithm>/<case>/; each case is found by its\n"
    "manifest.json (a copy of the golden one), else by its folder names, else by its .npy file names (the\n"
    "one case whose outputs are all there and whose outputs and inputs are all there is, else the one\n"
    "case whose outputs are all there). Each output is compared under the metric and tolerance of the\n"
    "golden manifest (exact / rel / abs / nmse) and the tolerance for the port's arithmetic (--precision,\n"
    "as reference/python/golden_check.py); the report says PASS, or the first difference (index,\n"
    "expected, got) and its size. Exit status 0 when everything passes, 1 otherwise.\n"
    "\n"
    "Third form: this library computes the outputs itself. Every golden case under CASES (one case, an\n"
    "algorithm folder or the folder of all golden files; default as for --golden) is fed through the\n"
    "backend -- cpu: the SIMD path; cuda: the CUDA path (a build with -Dcuda=enabled and a GPU) -- and\n"
    "its outputs are compared with the case's under the tolerance of the arithmetic that computed them\n"
    "(the manifest's tols: fp32, or bf16 / fp16 for attention on 16-bit tensor cores; the report names\n"
    "the bar). A case the backend cannot run fails with its error.\n"
    "\n"
    "options:\n"
    "  --golden DIR       one golden case (a folder with manifest.json) or the folder of all golden files\n"
    "  --precision P      the port's arithmetic: fp64, fp32 (default), fp16 or bf16 (attention with P and\n"
    "                     outputs rounded to 16 bits): picks each output's tolerance from the manifest's tols\n"
    "  --backend NAME     cpu or cuda: compute the outputs with this backend (third form)\n"
    "  --out DIR          (third form) also write the computed outputs as DIR/<algorithm>/<case>/*.npy\n"
    "  --json FILE        also write the result as JSON\n"
    "  -h, --help         this text\n";

}  // namespace vlsparse::sim
