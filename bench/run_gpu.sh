#!/usr/bin/env bash
# Everything the GPU machine runs, in one call: build the CUDA path and the simulator's cuda backend,
# the whole CUDA suite (kernels and the cpu / cuda simulator agreement), every CUDA benchmark beside
# PyTorch (decode, selection, prefill), the memory ceilings of decode (cuda_stream_bench), and the
# full-size simulator scenario on the GPU; every log and result into OUTDIR (bench/run_cuda.sh
# documents each step and its files):
#
#   bash bench/run_gpu.sh OUTDIR
#
# The benchmarks with PyTorch take most of the time (about 15 minutes on an H100); STEPS narrows it,
# as for run_cuda.sh, e.g. STEPS="device build test sim" bash bench/run_gpu.sh OUTDIR.
set -uo pipefail
export STEPS="${STEPS:-device build test bench stream torch report selbench seltorch selreport prefbench preftorch prefreport sim}"
exec bash "$(dirname "$0")/run_cuda.sh" "$@"
