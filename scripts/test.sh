#!/usr/bin/env bash
# Runs Strata's whole test suite on a fresh Debian 12 machine: installs what the
# tests need, builds the binaries the process-level tests start, runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
# --all-targets (not --bins) so dependency features, and so the one RocksDB
# build, are the same as for clippy and the tests.
cargo build --workspace --all-targets
cargo nextest run --workspace --no-fail-fast "$@"
