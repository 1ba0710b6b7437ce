#!/bin/sh
# golden_numpy_port.sh PYTHON GOLDEN_DIR: the independent numpy ports of ZipVL
# (reference/python/zipvl_numpy.py) and PureKV (reference/python/purekv_numpy.py) recompute every
# golden/zipvl and golden/purekv case from its inputs in double precision, and golden_check.py judges
# each by its outputs' metrics at the fp64 tolerances: the docs, the golden files and the C++
# reference must all agree. Skips (77) when the interpreter has no numpy.
set -eu
py="$1"; golden="$2"; here="$(dirname "$0")/../reference/python"
if ! "$py" -c "import numpy" 2>/dev/null; then
  echo "SKIP: $py has no numpy (Debian: apt install python3-numpy)"; exit 77
fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
status=0
for algo in zipvl purekv; do
  for case in "$golden/$algo"/*/; do
    name=$(basename "$case")
    "$py" "$here/${algo}_numpy.py" "$case" "$tmp/$algo/$name"
    "$py" "$here/golden_check.py" --precision fp64 "$case" "$tmp/$algo/$name" || status=1
  done
done
exit $status
