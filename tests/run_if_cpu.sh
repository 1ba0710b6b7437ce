#!/bin/sh
# run_if_cpu.sh FLAG EXE [ARGS...]: run EXE only when /proc/cpuinfo lists FLAG; otherwise exit 77,
# which Meson reports as SKIP (a visible skip, with the reason printed).
flag="$1"; shift
if grep -qw "$flag" /proc/cpuinfo 2>/dev/null; then
  exec "$@"
fi
echo "SKIP: this CPU lacks '$flag'; the $(basename "$1") variant cannot run here"
exit 77
