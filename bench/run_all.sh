#!/usr/bin/env bash
# Builds every benchmark (release, -march=native, OpenMP) and runs each with its default sizes,
# writing one log per benchmark plus the machine's description to OUT_DIR:
#   bash bench/run_all.sh OUT_DIR [THREADS]
# THREADS (default 2, the CI machine's core count) sets OMP_NUM_THREADS; on a larger machine the
# runs are pinned to the first THREADS cores with taskset so that other load stays off them.
# The simulator's default scenario is timed too. Figures go into docs/performance.md with the
# command, the machine and the date.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bash bench/run_all.sh OUT_DIR [THREADS]}
threads=${2:-2}
mkdir -p "$out"
build=${VLSPARSE_BENCH_BUILD:-build-bench}
[ -d "$build" ] || meson setup "$build" --buildtype=release -Dtests=false -Dexamples=false >/dev/null
meson compile -C "$build" attention_bench zipvl_bench avl_bench blindsight_bench purekv_bench vlsparse-sim >/dev/null
cores=$(seq -s, 0 $((threads - 1)))
pin=()
if command -v taskset >/dev/null && [ "$(nproc)" -gt "$threads" ]; then pin=(taskset -c "$cores"); fi
{
  date -u +"date %Y-%m-%d %H:%M UTC"
  echo "threads $threads (pinned: ${pin[*]:-no})"
  lscpu | grep -E 'Model name|^CPU\(s\)|Thread|L2|L3' || true
  ${CXX:-c++} --version | head -n 1
} > "$out/machine.txt"
for b in attention_bench zipvl_bench avl_bench blindsight_bench purekv_bench; do
  echo "== $b" >&2
  OMP_NUM_THREADS=$threads "${pin[@]}" "$build/bench/$b" > "$out/$b.txt" 2>&1
done
echo "== vlsparse-sim (default scenario)" >&2
OMP_NUM_THREADS=$threads "${pin[@]}" "$build/sim/vlsparse-sim" run --out "$out/report" > "$out/sim.txt" 2>&1
