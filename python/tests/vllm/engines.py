"""Running fresh vLLM engines for the connector tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Optional

from strata.bench.vllm_engine import OFFLINE_ENV



def run_engine(model: Path, prompt: List[int], strata: Optional[Dict[str, Any]], *,
               in_process: bool = True, timeout: float = 600) -> Dict[str, Any]:
    """Runs a fresh engine in its own process; returns what it printed."""
    env = {**os.environ, **OFFLINE_ENV, "VLLM_ENABLE_V1_MULTIPROCESSING": "0" if in_process else "1"}
    args = json.dumps({"model": str(model), "prompt": prompt, "strata": strata})
    p = subprocess.run([sys.executable, "-m", "strata.bench.vllm_engine", args], env=env, capture_output=True,
                       text=True, timeout=timeout)
    if p.returncode != 0:
        raise AssertionError(f"engine exited {p.returncode}:\n{p.stderr[-6000:]}")
    last = [line for line in p.stdout.splitlines() if line.startswith("{")]
    assert last, f"engine printed no result:\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}"
    out = json.loads(last[-1])
    out["log"] = p.stdout + p.stderr
    return out


def master_metric(admin_addr: str, name: str, labels: str = "") -> float:
    """One sample of the master's Prometheus metrics (``labels`` as in the
    exposition, e.g. ``tier="dram"``)."""
    with urllib.request.urlopen(f"http://{admin_addr}/metrics", timeout=5) as r:
        text = r.read().decode()
    want = f"{name}{{{labels}}} " if labels else f"{name} "
    for line in text.splitlines():
        if line.startswith(want):
            return float(line.split()[-1])
    raise AssertionError(f"{want.strip()} is not among the master's metrics")
