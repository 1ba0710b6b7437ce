#!/usr/bin/env bash
# Every file in the installed header trees is in meson.build's header lists (what the install step
# installs and the header check compiles), and every listed header exists: a header added to a tree but
# not to its list would be neither installed nor checked.
#   header_list.sh SOURCE_ROOT TREE=HEADER... (TREE: include, reference/include or cuda/include; HEADER:
#   the path below TREE/vlsparse/)
set -euo pipefail
root=$1
shift
listed=$(for a in "$@"; do echo "${a%%=*}/vlsparse/${a#*=}"; done | sort)
present=$(cd "$root" && { find include/vlsparse -type f -not -path 'include/vlsparse/reference/*'
                          find reference/include/vlsparse/reference cuda/include/vlsparse/cuda -type f; } | sort)
missing=$(comm -23 <(echo "$present") <(echo "$listed"))
stale=$(comm -13 <(echo "$present") <(echo "$listed"))
if [[ -n $missing || -n $stale ]]; then
  [[ -n $missing ]] && printf 'in the tree but not in the header lists of meson.build:\n%s\n' "$missing" >&2
  [[ -n $stale ]] && printf 'in the header lists of meson.build but not in the tree:\n%s\n' "$stale" >&2
  exit 1
fi
echo "header lists: $(echo "$listed" | wc -l) headers, the trees hold exactly these"
