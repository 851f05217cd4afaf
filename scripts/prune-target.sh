#!/usr/bin/env bash
# Keeps a shared Cargo target dir from filling the disk, before a build.
#
# Every checkout path gets its own hashes for the workspace's crates, so a
# target dir shared by several clones (CI's, a developer's) only grows. When it
# filled the disk, the linker died with SIGBUS halfway through a CI run. Here:
#   - the dir over STRATA_MAX_TARGET_GB (GiB, default 30), or less than
#     STRATA_MIN_FREE_GB (GiB, default 15) free beside it: drop the incremental
#     caches, then, if that is not enough, everything in the dir (a cold
#     build) — only when emptying it would be enough, and only in a dir Cargo
#     made (its CACHEDIR.TAG), so a wrong path never loses anything else;
#   - still less than STRATA_MIN_FREE_GB free: stop with a clear error rather
#     than fail somewhere in the build.
# Usage: scripts/prune-target.sh [TARGET_DIR]
set -euo pipefail
dir="${1:-${CARGO_TARGET_DIR:-$PWD/target}}"
min_free="${STRATA_MIN_FREE_GB:-15}"
max_size="${STRATA_MAX_TARGET_GB:-30}"
case "$min_free$max_size" in
*[!0-9]*) echo "prune-target: STRATA_MIN_FREE_GB and STRATA_MAX_TARGET_GB take whole GiB" >&2; exit 2 ;;
esac
mkdir -p "$dir"
# The real path: a symlinked target dir is measured and trimmed through it.
dir="$(cd "$dir" && pwd -P)"
gib=1048576 # KiB
free_kib() {
  local k
  k="$(df -Pk "$dir" | awk 'NR == 2 { print $4 }')"
  [ -n "$k" ] || { echo "prune-target: df gave no free space for $dir" >&2; exit 1; }
  echo "$k"
}
size_kib() { du -sk "$dir" 2>/dev/null | awk '{ print $1 }'; }
over_size() { [ "$(size_kib)" -gt $((max_size * gib)) ]; }
low_free() { [ "$(free_kib)" -lt $((min_free * gib)) ]; }
show() { awk -v k="$1" 'BEGIN { printf "%.1f GiB", k / 1048576 }'; }

echo "prune-target: $dir holds $(show "$(size_kib)"); $(show "$(free_kib)") free beside it"
if over_size || low_free; then
  echo "prune-target: over ${max_size} GiB or under ${min_free} GiB free: dropping the incremental caches"
  rm -rf "$dir"/*/incremental
fi
if over_size || low_free; then
  if [ ! -e "$dir/CACHEDIR.TAG" ] && [ -n "$(ls -A "$dir")" ]; then
    echo "prune-target: $dir has no CACHEDIR.TAG, so it is not a Cargo target dir: left alone" >&2
  elif over_size || [ $(($(free_kib) + $(size_kib))) -ge $((min_free * gib)) ]; then
    echo "prune-target: still over: emptying $dir (the next build is cold)"
    # Cargo recreates what it needs, CACHEDIR.TAG too.
    find "$dir" -mindepth 1 -maxdepth 1 -exec rm -rf {} +
  fi
fi
if low_free; then
  echo "prune-target: only $(show "$(free_kib)") free beside $dir; a full build and test run needs $min_free GiB. Free some space (or set STRATA_MIN_FREE_GB)." >&2
  exit 1
fi
