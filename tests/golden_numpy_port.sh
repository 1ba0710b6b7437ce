#!/bin/sh
# golden_numpy_port.sh PYTHON GOLDEN_DIR: the independent numpy port of ZipVL
# (reference/python/zipvl_numpy.py) recomputes every golden/zipvl case from its inputs, and
# golden_check.py judges it by each output's metric: the docs, the golden files and the C++
# reference must all agree. Skips (77) when the interpreter has no numpy.
set -eu
py="$1"; golden="$2"; here="$(dirname "$0")/../reference/python"
if ! "$py" -c "import numpy" 2>/dev/null; then
  echo "SKIP: $py has no numpy (Debian: apt install python3-numpy)"; exit 77
fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
status=0
for case in "$golden"/zipvl/*/; do
  name=$(basename "$case")
  "$py" "$here/zipvl_numpy.py" "$case" "$tmp/$name"
  "$py" "$here/golden_check.py" "$case" "$tmp/$name" || status=1
done
exit $status
