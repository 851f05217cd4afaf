#!/usr/bin/env bash
# Keeps a shared Cargo target dir from filling the disk, before a build.
#
# Every checkout path gets its own hashes for the workspace's crates, so a
# target dir shared by several clones (CI's, a developer's) only grows. When it
# filled the disk, the linker died with SIGBUS halfway through a CI run. Here:
#   - the dir over STRATA_MAX_TARGET_GB (default 30), or less than
#     STRATA_MIN_FREE_GB (default 15) free beside it: drop the incremental
#     caches, then, if that is not enough, the whole dir (a cold build);
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
# df and du in KiB, shown in GiB.
free_gib() { df -Pk "$1" | awk 'NR == 2 { print int($4 / 1048576) }'; }
size_gib() { du -sk "$dir" 2>/dev/null | awk '{ print int($1 / 1048576) }'; }
ok() { [ "$(free_gib "$dir")" -ge "$min_free" ] && [ "$(size_gib)" -le "$max_size" ]; }

mkdir -p "$dir"
echo "prune-target: $dir holds $(size_gib) GiB; $(free_gib "$dir") GiB free beside it"
if ! ok; then
  echo "prune-target: over ${max_size} GiB or under ${min_free} GiB free: dropping the incremental caches"
  rm -rf "$dir"/*/incremental
fi
if ! ok; then
  echo "prune-target: still over: removing $dir (the next build is cold)"
  # Cargo recreates it; CACHEDIR.TAG too.
  find "$dir" -mindepth 1 -maxdepth 1 -exec rm -rf {} +
fi
free="$(free_gib "$dir")"
if [ "$free" -lt "$min_free" ]; then
  echo "prune-target: only $free GiB free beside $dir; a full build and test run needs $min_free GiB. Free some space (or set STRATA_MIN_FREE_GB)." >&2
  exit 1
fi
