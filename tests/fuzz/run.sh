#!/usr/bin/env bash
# Runs the libFuzzer targets of tests/fuzz (docs/fuzzing.md). Builds them first, with clang, in
# $VLSPARSE_FUZZ_BUILD (default build-fuzz at the repository root), at -O$VLSPARSE_FUZZ_OPT (default 1;
# CI builds build-fuzz-ci at -O0: half the compile time, for its short runs).
#
#   tests/fuzz/run.sh TARGET [SECONDS] [libFuzzer flags...]   one target (default 600 s); the inputs it
#                                                              finds accumulate in BUILD/fuzz-corpus/TARGET
#   tests/fuzz/run.sh all [SECONDS]                            every target in turn
#   tests/fuzz/run.sh --smoke [SECONDS] [OUT]                  what CI runs: every target SECONDS (default
#                                                              20) with a fixed seed from the checked-in
#                                                              corpus, two at a time; one line per target,
#                                                              "fuzz-TARGET OK|FAIL" also written to OUT
#   tests/fuzz/run.sh --build                                  build the targets only
#   tests/fuzz/run.sh --merge TARGET                           keep in tests/fuzz/corpus/TARGET the inputs of
#                                                              BUILD/fuzz-corpus/TARGET that reach new edges
#   tests/fuzz/run.sh --list                                   the targets
#
# A finding (crash, sanitizer report, failed check, leak, timeout of 30 s, more than 2 GiB) stops the
# run: libFuzzer prints the report and the input is saved as BUILD/fuzz-artifacts/TARGET/crash-*;
# replay it with BUILD/tests/fuzz/fuzz_TARGET FILE. FUZZ_SEED sets the seed of a TARGET / all run
# (default: libFuzzer picks one). Long runs are best nice'd: nice tests/fuzz/run.sh kv_batch 3600.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
build="${VLSPARSE_FUZZ_BUILD:-build-fuzz}"
opt="${VLSPARSE_FUZZ_OPT:-1}"
targets=(layout npy safetensors params_json head_map golden_manifest scenario dump_manifest cache_rows kv_batch)

usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }

setup() {
  if [ ! -f "$build/build.ninja" ]; then
    command -v clang++ >/dev/null || { echo "run.sh: clang++ not found (bash .ci/install-deps installs it)" >&2; exit 1; }
    CXX=clang++ meson setup "$build" --buildtype=plain -Doptimization="$opt" -Dfuzz=true -Dbenchmarks=false \
      -Dexamples=false -Dheader_check=false -Dsimulator=false -Dgolden_generator=false -Dsimd_variants=avx2 >/dev/null
  fi
}
build_targets() {  # names without the fuzz_ prefix
  setup
  local t paths=()
  for t in "$@"; do paths+=("tests/fuzz/fuzz_$t"); done
  ninja -C "$build" -j "$(nproc)" "${paths[@]}" >/dev/null
}
known() { local t; for t in "${targets[@]}"; do [ "$t" = "$1" ] && return 0; done; return 1; }
dict() {  # the libFuzzer dictionary of a target, if it has one: tokens of its format
  case "$1" in
    layout) echo -dict=tests/fuzz/layout.dict ;;
    npy) echo -dict=tests/fuzz/npy.dict ;;
    cache_rows|kv_batch) ;;
    *) echo -dict=tests/fuzz/json.dict ;;
  esac
}
# Flags every run shares: a slow input or a large allocation is a finding too.
common=(-timeout=30 -rss_limit_mb=2048 -malloc_limit_mb=2048 -print_final_stats=1)
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

run_one() {  # TARGET SECONDS [flags...]: the work corpus first (new inputs go there), then the seeds
  local t="$1" secs="$2"
  shift 2
  local work="$build/fuzz-corpus/$t" art="$build/fuzz-artifacts/$t"
  mkdir -p "$work" "$art"
  local seed=()
  [ -n "${FUZZ_SEED:-}" ] && seed=(-seed="$FUZZ_SEED")
  "$build/tests/fuzz/fuzz_$t" "${common[@]}" "${seed[@]}" -max_total_time="$secs" -artifact_prefix="$art/" \
    $(dict "$t") "$@" "$work" "tests/fuzz/corpus/$t"
}

smoke_one() {  # TARGET SECONDS LOGDIR: fixed seed, a throw-away work corpus; one line of result
  local t="$1" secs="$2" logs="$3"
  local work="$logs/$t.corpus" art="$logs/$t.artifacts"
  mkdir -p "$work" "$art"
  local start=$SECONDS
  if "$build/tests/fuzz/fuzz_$t" "${common[@]}" -seed=1 -max_total_time="$secs" -artifact_prefix="$art/" \
       $(dict "$t") "$work" "tests/fuzz/corpus/$t" >"$logs/$t.log" 2>&1; then
    local runs
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$logs/$t.log" | tail -n 1)
    echo "fuzz-$t OK" >>"$logs/results"
    echo "fuzz-$t OK: ${runs:-?} inputs in $((SECONDS - start)) s, no finding"
  else
    local rc=$?
    echo "fuzz-$t FAIL" >>"$logs/results"
    echo "fuzz-$t FAIL (exit $rc), log: $logs/$t.log"
    tail -n 40 "$logs/$t.log" | sed "s/^/  [$t] /"
  fi
}

case "${1:-}" in
  ""|-h|--help) usage ;;
  --list) printf '%s\n' "${targets[@]}" ;;
  --build) build_targets "${targets[@]}" ;;
  --merge)
    t="${2:?--merge TARGET}"; known "$t" || { echo "unknown target '$t' (--list)" >&2; exit 2; }
    build_targets "$t"
    mkdir -p "$build/fuzz-corpus/$t"
    # Edges only (no hit counters): the fewest inputs that reach every edge the run reached.
    "$build/tests/fuzz/fuzz_$t" -merge=1 -use_counters=0 "${common[@]}" "tests/fuzz/corpus/$t" "$build/fuzz-corpus/$t"
    ;;
  --smoke)
    secs="${2:-20}"; out="${3:-}"
    build_targets "${targets[@]}"
    logs=$(mktemp -d)
    # Two queues, one core each: every other target in each.
    queue() { local i; for ((i = $1; i < ${#targets[@]}; i += 2)); do smoke_one "${targets[$i]}" "$secs" "$logs"; done; }
    queue 0 & queue 1 & wait
    [ -n "$out" ] && cp "$logs/results" "$out"
    failed=$(grep -c ' FAIL' "$logs/results" || true)
    if [ "$failed" -eq 0 ]; then rm -rf "$logs"; fi
    [ "$failed" -eq 0 ]
    ;;
  all)
    secs="${2:-600}"
    build_targets "${targets[@]}"
    for t in "${targets[@]}"; do echo "== $t ($secs s)"; run_one "$t" "$secs"; done
    ;;
  *)
    t="$1"; known "$t" || { echo "unknown target '$t' (--list)" >&2; exit 2; }
    secs="${2:-600}"
    shift $(( $# >= 2 ? 2 : 1 ))
    build_targets "$t"
    run_one "$t" "$secs" "$@"
    ;;
esac
