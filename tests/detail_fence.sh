#!/usr/bin/env bash
# The library's internals stay behind its public headers: the simulator and the examples -- code
# written the way an engine would use vlsparse -- neither include a header under vlsparse/detail/ nor
# name vlsparse::detail (or cuda::detail, simd::detail). (The library's own trees and the tests of its internals may; benchmarks that
# time an internal kernel directly say so where they do.)
#   detail_fence.sh SOURCE_ROOT
set -euo pipefail
cd "$1"
hits=$(grep -rnE '#include[[:space:]]*[<"]vlsparse/detail/|vlsparse::detail::|cuda::detail::|simd::detail::' sim examples \
         --include='*.hpp' --include='*.cpp' --include='*.cu' --include='*.cuh' || true)
if [[ -n $hits ]]; then
  printf 'the simulator and the examples reach into vlsparse::detail (use or add a public name):\n%s\n' "$hits" >&2
  exit 1
fi
echo "detail fence: sim/ and examples/ use public names only"
