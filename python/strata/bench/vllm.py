"""``python -m strata.bench.vllm``: time to first token in a real vLLM with
and without Strata, in one run.

On a random Llama large enough that prefill costs real time on a CPU
(~0.3 B parameters, made once and kept in ``--model``), one prompt of
``--prompt-tokens`` tokens, each row a fresh engine (its own process):

- ``recompute``: no connector, the whole prompt prefilled;
- ``strata miss``: the connector on an empty cluster (its lookup and saves
  are the overhead a miss costs);
- ``strata hit``: a fresh engine loading the blocks the miss stored;
- ``vllm prefix cache``: vLLM's own cache in one engine (the prompt run
  once, then timed): the floor a hit can approach.

vLLM's CPU offloading is no baseline on this platform: its KV cache already
lives in host memory. TTFT is the time of a one-token generate after a
warm-up request.

Without ``--master`` it starts a cluster from ``--bin-dir`` (default
``$STRATA_BIN_DIR`` or ``target/release``): a master and two store nodes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from .cluster import strata_cluster
from .models import PREFILL, make_llama
from .vllm_engine import OFFLINE_ENV

ENGINE_ENV = {**OFFLINE_ENV, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def engine(model: Path, prompt: List[int], **args: Any) -> Dict[str, Any]:
    req = json.dumps({"model": str(model), "prompt": prompt, "max_tokens": 1, "warmup": True,
                      "max_model_len": len(prompt) + 64, "kv_cache_bytes": 512 << 20, **args})
    p = subprocess.run([sys.executable, "-m", "strata.bench.vllm_engine", req],
                       env={**os.environ, **ENGINE_ENV}, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"engine failed ({p.returncode}):\n{p.stderr[-4000:]}")
    return json.loads([line for line in p.stdout.splitlines() if line.startswith("{")][-1])


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m strata.bench.vllm", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=Path.home() / ".cache" / "strata-bench" / "llama-0.3b",
                    help="model directory (made on first use)")
    ap.add_argument("--prompt-tokens", type=int, default=2048)
    ap.add_argument("--master", help="an existing cluster (else one is started from --bin-dir)")
    ap.add_argument("--token-file")
    ap.add_argument("--bin-dir", type=Path, default=Path(os.environ.get("STRATA_BIN_DIR", "target/release")))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if not (a.model / "config.json").exists():
        print(f"making the model in {a.model} (once)", file=sys.stderr)
        make_llama(a.model, seed=0, **PREFILL)
    rng = random.Random(11)
    prompt = [rng.randrange(2, 1024) for _ in range(a.prompt_tokens)]
    rows: List[Dict[str, Any]] = []

    def run(master: str) -> None:
        # A run of its own in a shared cluster: a fresh key namespace, so
        # the miss is a miss and nobody else's blocks are touched.
        config = {"master": master, "timeout": 30, "namespace": f"bench-{uuid.uuid4().hex[:12]}"}
        if a.token_file:
            config["token_file"] = a.token_file
        for name, kw in (
            ("recompute", {}),
            ("strata miss", {"strata": config}),
            ("strata hit", {"strata": config}),
            ("vllm prefix cache", {"repeat": True}),
        ):
            print(f"{name} ...", file=sys.stderr, flush=True)
            r = engine(a.model, prompt, **kw)
            rows.append({"mode": name, "ttft_s": r["seconds"], "cached": r["num_cached_tokens"],
                         "computed": len(prompt) - r["num_cached_tokens"], "totals": r["totals"]})

    if a.master:
        run(a.master)
    else:
        with strata_cluster(a.bin_dir, "1GiB") as master:
            run(master)
    base = rows[0]["ttft_s"]
    if a.json:
        print(json.dumps({"prompt_tokens": len(prompt), "rows": rows}))
        return 0
    print(f"{'MODE':<20}{'TTFT ms':>10}{'PREFILLED':>11}{'CACHED':>8}{'VS RECOMPUTE':>14}")
    for r in rows:
        print(f"{r['mode']:<20}{r['ttft_s'] * 1000:>10.0f}{r['computed']:>11}{r['cached']:>8}"
              f"{r['ttft_s'] / base:>13.2f}x")
    miss, hit = rows[1], rows[2]
    print(f"\nhit: {hit['totals']['loaded']} blocks loaded; miss: {miss['totals']['saved']} blocks saved, "
          f"overhead {100 * (miss['ttft_s'] / base - 1):+.1f}% of TTFT")
    return 0


if __name__ == "__main__":
    sys.exit(main())
