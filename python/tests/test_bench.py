"""``python -m strata.bench`` end to end, at a size that takes seconds: it
starts its own cluster from the test binaries, runs every driver, the
Rust client's rows and the raw TCP floor's (``strata bench sink``) through
the flags it passes them, and reports one row per operation. Its figures are not judged here (docs/benchmarks.md)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from conftest import bin_dir


def run_bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "strata.bench", "--bin-dir", str(bin_dir()), *args],
        capture_output=True, text=True, timeout=600,
    )


def test_the_benchmark_runs_every_driver_the_rust_client_and_raw_tcp() -> None:
    out = run_bench("--node-capacity", "64MiB", "--sizes", "4KiB", "--threads", "1", "--batch", "4",
                    "--bytes", "64KiB", "--parts", "2", "--transport", "tcp", "--json")
    assert out.returncode == 0, out.stderr[-3000:]
    rows = json.loads(out.stdout)["rows"]
    want = {"put", "get", "batch_put", "batch_get"}
    for system in ("python native", "python parts", "python mooncake", "rust client", "raw tcp"):
        mine = [r for r in rows if r["system"] == system]
        assert sorted(r["op"] for r in mine) == sorted(want), (system, mine)
        for r in mine:
            assert r["size"] == 4096 and r["threads"] == 1, r
            assert r["ops"] > 0 and r["ops_per_s"] > 0, r
    assert len(rows) == 20, rows


def test_an_unknown_transport_is_refused_before_anything_starts() -> None:
    out = run_bench("--transport", "carrier-pigeon", "--json")
    assert out.returncode == 2
    assert "invalid choice: 'carrier-pigeon'" in out.stderr
    assert out.stdout == ""


def test_a_node_that_cannot_start_fails_the_benchmark_at_once_with_its_log() -> None:
    t0 = time.monotonic()
    out = run_bench("--node-capacity", "lots", "--sizes", "4KiB", "--threads", "1", "--json")
    took = time.monotonic() - t0
    assert out.returncode != 0
    assert "strata-store-node exited with" in out.stderr, out.stderr[-3000:]
    assert "lots" in out.stderr, out.stderr[-3000:]
    # Not after the 60 s the wait for its /ready allows.
    assert took < 30, took
