#!/usr/bin/env bash
# The vLLM connector's tests: builds the Python package into the vLLM venv
# (scripts/vllm-venv.sh makes it once, outside the clone) and runs
# python/tests/vllm there, against a cluster started from the binaries the
# Rust build made. Called by scripts/test.sh; runs alone too:
#   scripts/vllm-tests.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
venv="$(scripts/vllm-venv.sh)"
# The extension in the dev profile (the Rust tests' dependency builds).
(cd python && VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH" maturin develop -q)
export STRATA_BIN_DIR="${STRATA_BIN_DIR:-$CARGO_TARGET_DIR/debug}"
cd python
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/vllm "$@"
