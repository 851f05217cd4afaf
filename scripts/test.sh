#!/usr/bin/env bash
# Runs Strata's whole test suite on a fresh Debian 12 machine: installs what the
# tests need, builds the binaries the process-level tests start, runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
# The Python extension (crates/python) resolves Python's symbols when it is
# loaded, as every extension module does: link it without libpython.
export PYO3_BUILD_EXTENSION_MODULE=1
# A shared target dir only grows (one set of hashes per checkout path).
scripts/prune-target.sh
# --all-targets (not --bins) so dependency features, and so the one RocksDB
# build, are the same as for clippy and the tests.
cargo build --workspace --all-targets
rust=0
cargo nextest run --workspace --no-fail-fast "$@" || rust=$?
# The Python package's tests, the vLLM connector's in a real vLLM (its venv
# made once outside the clone) and the SGLang backend's with SGLang's classes
# run even when a Rust test failed (all reported).
py=0
scripts/python-tests.sh || py=$?
vllm=0
scripts/vllm-tests.sh || vllm=$?
sglang=0
scripts/sglang-tests.sh || sglang=$?
if [ "$rust" -ne 0 ] || [ "$py" -ne 0 ] || [ "$vllm" -ne 0 ] || [ "$sglang" -ne 0 ]; then
  echo "failed: rust tests exit $rust, python tests exit $py, vllm tests exit $vllm, sglang tests exit $sglang" >&2
  exit 1
fi
