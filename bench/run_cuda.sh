#!/usr/bin/env bash
# The GPU machine's one command: build the CUDA path, test it, benchmark it against PyTorch, and
# write every log and result to OUTDIR. Run from anywhere in the checkout:
#
#   bash bench/run_cuda.sh OUTDIR
#
# Steps (each one's exit status is recorded and the run goes on past a failure):
#   device   nvidia-smi's header, nvcc / meson / torch versions, a hash of the CUDA sources (the
#            copy's .git may be stale; compare with the same command in the checkout sent)
#                                                                       -> OUTDIR/device.txt
#   build    meson setup build-gpu -Dcuda=enabled -Dgpu_arch=sm_90 -Dbuildtype=release (kept when it
#            exists), then only the CUDA targets (alias cuda-all; ninja -k 0: what builds, runs)
#                                                                       -> OUTDIR/build.log
#   test     meson test --suite cuda                                    -> OUTDIR/cuda-tests.log
#   memcheck compute-sanitizer memcheck on the CUDA test executable, only when SANITIZER_FILTER is
#            set (a Catch2 test spec, e.g. '[decode]' or a test name)   -> OUTDIR/memcheck.log
#   bench    build-gpu/bench/cuda_decode_bench                          -> OUTDIR/vlsparse.csv
#   stream   build-gpu/bench/cuda_stream_bench: the memory ceilings of B = 1 decode (bare streaming
#            and list gathers with the decode kernel's grid), only when named in STEPS
#                                                                       -> OUTDIR/stream.log, stream.csv
#   torch    bench/torch_decode_bench.py (bf16 and fp16 on the full grid; fp32 on cuda_decode_bench's
#            smaller grid)                                              -> OUTDIR/torch.csv
#   report   bench/cuda_decode_report.py on the two CSV files           -> OUTDIR/report.md
#   selbench build-gpu/bench/cuda_select_bench (ZipVL selection)        -> OUTDIR/select.csv
#   seltorch bench/torch_select_bench.py (cuDNN / flash prefill, selection with PyTorch ops), appended
#                                                                       -> OUTDIR/select.csv
#   selreport bench/cuda_select_report.py                               -> OUTDIR/select_report.md
#   prefbench build-gpu/bench/cuda_prefill_bench (dense, block-sparse, token-sparse prefill; mask
#            descriptions into build-gpu/prefill-masks/)                -> OUTDIR/prefill.csv
#   preftorch bench/torch_prefill_bench.py (SDPA cuDNN / flash, FlexAttention with the same masks,
#            gather + SDPA), appended                                   -> OUTDIR/prefill.csv
#   prefreport bench/cuda_prefill_report.py                             -> OUTDIR/prefill_report.md
#   sim      the simulator's cuda backend: the default scenario on both backends (JSON reports), every
#            golden case through the CUDA path (golden verify --backend cuda), then
#            SIM_SCENARIO (default sim/scenarios/gpu_28x28_32k.json: 28 layers x 28 heads, 32K tokens,
#            every policy, 64 decode steps) on the GPU, timed           -> OUTDIR/sim.log, sim-*.json
# (the output of bench, torch and report -> OUTDIR/bench.log), then a short summary on stdout, also
# appended to OUTDIR/device.txt; the exit status is 1 when any step failed. At most 13 files.
#
# Environment: STEPS (default "device build test memcheck bench torch report selbench seltorch
# selreport": a subset runs only
# those, e.g. to split the work over several calls of a machine that keeps build-gpu), GPU_ARCH
# (sm_90), BUILD_DIR (build-gpu), CUDA_TEST_ARGS (passed to the test executable, e.g. a Catch2
# filter), SANITIZER_FILTER, SANITIZER_TOOL (memcheck), BENCH_ARGS (cuda_decode_bench, e.g.
# "--quick" or "--reps 51"), TORCH_BENCH_ARGS (one torch_decode_bench.py call with these arguments
# instead of the three default grids, e.g. "--batch 1 --n 16384"), STEP_TIMEOUT (seconds per step,
# default 1200), SELECT_BENCH_ARGS (cuda_select_bench, e.g. "--quick"), SELECT_TORCH_ARGS
# (torch_select_bench.py, e.g. "--n 8192,16384"), PREFILL_BENCH_ARGS (cuda_prefill_bench, e.g.
# "--quick"), PREFILL_TORCH_ARGS (torch_prefill_bench.py, e.g. "--n 8192,16384"), PYTHON (python3).
# The prefill steps, stream and sim run only when named in STEPS (bench/run_gpu.sh names every step).
set -uo pipefail
if [ $# -ne 1 ]; then
  echo "usage: bash bench/run_cuda.sh OUTDIR" >&2
  exit 2
fi
mkdir -p "$1" || exit 2
out=$(cd "$1" && pwd)
cd "$(dirname "$0")/.." || exit 2
[ -f .device-deps/env.sh ] && source .device-deps/env.sh
if ! command -v nvcc >/dev/null 2>&1; then
  for d in "${CUDA_PATH:-}" "${CUDA_HOME:-}" /usr/local/cuda; do
    if [ -n "$d" ] && [ -x "$d/bin/nvcc" ]; then export PATH="$d/bin:$PATH"; break; fi
  done
fi
steps=" ${STEPS:-device build test memcheck bench torch report selbench seltorch selreport} "
arch=${GPU_ARCH:-sm_90}
bdir=${BUILD_DIR:-build-gpu}
tmo=${STEP_TIMEOUT:-1200}
python=${PYTHON:-python3}
summary=()
failed=0
rm -f "$out"/{device.txt,build.log,cuda-tests.log,memcheck.log,bench.log,report.md,select.csv,select_report.md,prefill.csv,prefill_report.md,sim.log,sim-default-cpu.json,sim-default-cuda.json,sim-full.json}

export bdir arch out python
# step NAME LOG COMMAND...: runs COMMAND, a program or a function of this script (output to LOG,
# at most STEP_TIMEOUT seconds), records and prints one line.
step() {
  local name=$1 log=$2 rc t0 t1 first
  shift 2
  t0=$(date +%s)
  first=$(($(cat "$log" 2>/dev/null | wc -l) + 1))  # this step's first line in LOG
  echo "-- $name: $*" >>"$log"
  if declare -F "$1" >/dev/null; then
    timeout "$tmo" bash -o pipefail -c "$(declare -f "$1"); $*" >>"$log" 2>&1
  else
    timeout "$tmo" "$@" >>"$log" 2>&1
  fi
  rc=$?
  t1=$(date +%s)
  local line
  line=$(printf '%-9s %s  (%ds, %s)' "$name" "$([ $rc -eq 0 ] && echo ok || echo "FAILED rc=$rc")" \
         $((t1 - t0)) "${log#"$out"/}")
  [ $rc -eq 124 ] && line="$line timed out after ${tmo}s"
  summary+=("$line")
  echo "$line"
  if [ $rc -ne 0 ]; then
    failed=1
    tail -n +"$first" "$log" | tail -n 12 | sed 's/^/    | /'
  fi
  return $rc
}
skip() {
  summary+=("$(printf '%-9s skipped (%s)' "$1" "$2")")
  echo "${summary[-1]}"
}
want() { [[ "$steps" == *" $1 "* ]]; }

if want device; then
  {
    echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    # Which sources ran (a copy of a working tree may carry a stale .git): compare with the same
    # command run in the checkout that was sent.
    echo "cuda sources sha256: $(find cuda/include tests/cuda bench/cuda_decode_bench.cu bench/cuda_select_bench.cu sim/cuda_backend.cu sim/include -type f | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16)"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>&1
    nvidia-smi -q 2>&1 | sed -n '1,12p'
    echo "nvcc: $(nvcc --version 2>&1 | tail -n 2 | head -n 1)"
    echo "meson: $(meson --version 2>&1)"
    echo "torch: $("$python" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())' 2>&1 | tail -n 1)"
  } >"$out/device.txt" 2>&1
  echo "device    $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1) -> device.txt"
fi


if want build; then
  configure_and_build() {
    if [ ! -f "$bdir/build.ninja" ]; then
      rm -rf "$bdir"
      meson setup "$bdir" -Dcuda=enabled -Dgpu_arch="$arch" -Dbuildtype=release || return $?
    fi
    meson compile -C "$bdir" --ninja-args=-k0 cuda-all
  }
  step build "$out/build.log" configure_and_build
fi
# After a failed build, whatever did build still runs (a stale executable from an earlier build
# could too: the summary says the build failed).

test_exe="$bdir/tests/vlsparse_tests_cuda"
if want test; then
  if [ -x "$test_exe" ]; then
    # --no-rebuild: only the CUDA targets are built here (a rebuild would compile the whole CPU suite).
    targs=()
    [ -n "${CUDA_TEST_ARGS:-}" ] && targs=(--test-args "$CUDA_TEST_ARGS")
    step test "$out/cuda-tests.log" meson test -C "$bdir" --suite cuda --no-rebuild --print-errorlogs "${targs[@]}"
    counts=$(grep -E '^(Ok|Fail|Skipped|Timeout): ' "$out/cuda-tests.log" | paste -sd ' ' - | tr -s ' ')
    cases=$(grep -m 1 -E '^test cases:' "$out/cuda-tests.log" | tr -s ' ')
    [ -n "$counts" ] && summary[-1]="${summary[-1]}  [meson: $counts${cases:+; $cases}]"
  else
    skip test "no test executable"
  fi
fi

if want memcheck; then
  if [ -z "${SANITIZER_FILTER:-}" ]; then
    skip memcheck "set SANITIZER_FILTER to a Catch2 test spec"
  elif [ -x "$test_exe" ]; then
    step memcheck "$out/memcheck.log" compute-sanitizer --tool "${SANITIZER_TOOL:-memcheck}" --error-exitcode 99 \
      --print-limit 20 "$test_exe" "$SANITIZER_FILTER"
  else
    skip memcheck "no test executable"
  fi
fi

if want bench; then
  if [ -x "$bdir/bench/cuda_decode_bench" ]; then
    # shellcheck disable=SC2086  # BENCH_ARGS is a list of arguments
    step bench "$out/bench.log" "$bdir/bench/cuda_decode_bench" --out "$out/vlsparse.csv" ${BENCH_ARGS:-}
  else
    skip bench "no benchmark executable"
  fi
fi

if want stream; then
  if [ -x "$bdir/bench/cuda_stream_bench" ]; then
    step stream "$out/stream.log" "$bdir/bench/cuda_stream_bench" --out "$out/stream.csv"
  else
    skip stream "no benchmark executable"
  fi
fi

if want torch; then
  torch_grids() {
    local rc=0
    if [ -n "${TORCH_BENCH_ARGS:-}" ]; then
      # shellcheck disable=SC2086
      "$python" bench/torch_decode_bench.py --out "$out/torch.csv" $TORCH_BENCH_ARGS || rc=$?
    else
      # The grids of cuda_decode_bench: bf16 everywhere, fp16 at 30% everywhere, fp32 at 30% on fewer shapes.
      "$python" bench/torch_decode_bench.py --out "$out/torch.csv" --dtype bf16 || rc=$?
      "$python" bench/torch_decode_bench.py --out "$out/torch.csv" --append --dtype fp16 --frac 0.3 || rc=$?
      "$python" bench/torch_decode_bench.py --out "$out/torch.csv" --append --dtype fp32 --batch 1,32 \
        --n 16384,65536 --frac 0.3 || rc=$?
    fi
    return $rc
  }
  step torch "$out/bench.log" torch_grids
fi

if want report; then
  make_report() {
    "$python" bench/cuda_decode_report.py "$out/vlsparse.csv" "$out/torch.csv" --out "$out/report.md" >/dev/null
  }
  step report "$out/bench.log" make_report
fi

if want selbench; then
  if [ -x "$bdir/bench/cuda_select_bench" ]; then
    # shellcheck disable=SC2086
    step selbench "$out/bench.log" "$bdir/bench/cuda_select_bench" --out "$out/select.csv" ${SELECT_BENCH_ARGS:-}
  else
    skip selbench "no benchmark executable"
  fi
fi

if want seltorch; then
  # shellcheck disable=SC2086
  step seltorch "$out/bench.log" "$python" bench/torch_select_bench.py --out "$out/select.csv" --append ${SELECT_TORCH_ARGS:-}
fi

if want selreport; then
  step selreport "$out/bench.log" "$python" bench/cuda_select_report.py "$out/select.csv" --out "$out/select_report.md"
fi

if want prefbench; then
  if [ -x "$bdir/bench/cuda_prefill_bench" ]; then
    # shellcheck disable=SC2086
    step prefbench "$out/bench.log" "$bdir/bench/cuda_prefill_bench" --out "$out/prefill.csv" --masks "$bdir/prefill-masks" ${PREFILL_BENCH_ARGS:-}
  else
    skip prefbench "no benchmark executable"
  fi
fi

if want preftorch; then
  # shellcheck disable=SC2086
  step preftorch "$out/bench.log" "$python" bench/torch_prefill_bench.py --masks "$bdir/prefill-masks" --out "$out/prefill.csv" --append ${PREFILL_TORCH_ARGS:-}
fi

if want prefreport; then
  step prefreport "$out/bench.log" "$python" bench/cuda_prefill_report.py "$out/prefill.csv" --out "$out/prefill_report.md"
fi

if want sim; then
  if [ -x "$bdir/sim/vlsparse-sim" ]; then
    run_sim() {
      local sim="$bdir/sim/vlsparse-sim" rc=0
      "$sim" run --backend cpu --no-sweep --no-html --quiet --json "$out/sim-default-cpu.json" || rc=$?
      "$sim" run --backend cuda --no-sweep --no-html --quiet --json "$out/sim-default-cuda.json" || rc=$?
      # Every golden case through the CUDA path (its report in sim.log; exit 1 on any difference).
      "$sim" golden verify --backend cuda golden || rc=$?
      local t0 t1
      t0=$(date +%s%N)
      "$sim" run "${SIM_SCENARIO:-sim/scenarios/gpu_28x28_32k.json}" --no-sweep --no-html --quiet \
        --json "$out/sim-full.json" ${SIM_ARGS:-} || rc=$?
      t1=$(date +%s%N)
      echo "full-size scenario: $(( (t1 - t0) / 1000000 )) ms wall, process start to exit"
      return $rc
    }
    step sim "$out/sim.log" run_sim
  else
    skip sim "no vlsparse-sim in $bdir (built with the cuda targets)"
  fi
fi

{
  echo "== run_cuda.sh summary: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)"
  printf '%s\n' "${summary[@]}"
} | tee -a "$out/device.txt"
exit $failed
