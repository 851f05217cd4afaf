#!/usr/bin/env bash
# The SGLang HiCache backend's tests: SGLang's own classes (host KV pools,
# storage config, backend factory, cache controller) driving
# strata.sglang.StrataStorage against a cluster started from the binaries the
# Rust build made. Runs in the vLLM venv (for its torch) with SGLang from
# scripts/sglang-site.sh on PYTHONPATH. Called by scripts/test.sh; alone:
#   scripts/sglang-tests.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
venv="$(scripts/vllm-venv.sh)"
site="$(scripts/sglang-site.sh)"
(cd python && VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH" maturin develop -q)
export STRATA_BIN_DIR="${STRATA_BIN_DIR:-$CARGO_TARGET_DIR/debug}"
cd python
PATH="$site/bin:$PATH" PYTHONPATH="$site" exec "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/sglang "$@"
