#!/usr/bin/env bash
# The library's internals stay behind its public headers: the simulator, the Python module and the
# examples -- code written the way an engine uses vlsparse -- neither include a header under
# vlsparse/detail/ nor name vlsparse::detail, cuda::detail or simd::detail (nor, outside sim/,
# sim::detail). The library's own trees, its tests and its benchmarks may: they test and time the
# internals.
#   detail_fence.sh SOURCE_ROOT
set -euo pipefail
cd "$1"
exts=(--include='*.hpp' --include='*.cpp' --include='*.cu' --include='*.cuh')
hits=$(grep -rnE '#include[[:space:]]*[<"]vlsparse/detail/|vlsparse::detail::|cuda::detail::|simd::detail::' \
         sim python/src examples "${exts[@]}" || true)
# The simulator's own internals: the Python module and the examples use its public names too.
hits+=$(grep -rnE 'sim::detail::' python/src examples "${exts[@]}" || true)
if [[ -n $hits ]]; then
  printf 'the simulator, the Python module or the examples reach into vlsparse::detail (use or add a public name):\n%s\n' "$hits" >&2
  exit 1
fi
echo "detail fence: sim/, python/src/ and examples/ use public names only"
