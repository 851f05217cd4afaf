#!/usr/bin/env bash
# Builds the Python package (crates/python + python/) into a virtual
# environment outside the clone and runs its tests against the binaries the
# Rust build made. Called by scripts/test.sh; runs alone too:
#   scripts/python-tests.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
venv="${STRATA_PY_VENV:-$HOME/.cache/strata-py/venv}"
# What the tests need, pinned (BUILD-NOTES: numpy 2.5 needs Python 3.12).
# The seed system's wheel is there for the drop-in's signature checks and
# `python -m strata.bench --seed`.
reqs=("maturin==1.16.0" "pytest==9.2.0" "pytest-asyncio==1.5.0" "pytest-timeout==2.4.0" "numpy==2.4.6"
  "mooncake-transfer-engine-non-cuda==0.3.13.post1")
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
if ! "$venv/bin/python" - "${reqs[@]}" <<'PY' 2>/dev/null; then
import sys
from importlib.metadata import version
for r in sys.argv[1:]:
    name, want = r.split("==")
    assert version(name) == want, r
PY
  echo "installing the Python test dependencies into $venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "${reqs[@]}"
fi
# The extension in the dev profile, sharing the Rust tests' dependency
# builds (same target dir); `pip install ./python` builds a release wheel.
(cd python && VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH" maturin develop -q)
export STRATA_BIN_DIR="${STRATA_BIN_DIR:-$CARGO_TARGET_DIR/debug}"
cd python
# The engine connectors' tests run in the engines' venvs (scripts/vllm-tests.sh).
# The slowest tests in every log: a stall shows up even when the test passes.
exec "$venv/bin/python" -m pytest -q --durations=5 --ignore=tests/vllm --ignore=tests/sglang "$@"
