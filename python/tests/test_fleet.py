"""The fleet harness from Python (issue #33): ``strata bench chaos`` gives
every service a host of its own (network namespaces: root is needed, as CI
runs) and attacks it while checking every answer; here pytest drives a short
run and checks its JSON report and its history file."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from conftest import bin_dir


def test_a_short_nemesis_driven_from_python_finds_no_anomaly(tmp_path: Path) -> None:
    assert os.geteuid() == 0, "network namespaces need root (CI runs the suite as root)"
    history = tmp_path / "history.jsonl"
    run = subprocess.run(
        [
            str(bin_dir() / "strata"),
            "bench",
            "chaos",
            "--minutes",
            "0.25",
            "--single-master",
            "--seed",
            "7",
            "--json",
            "--history",
            str(history),
            "--logs",
            str(tmp_path / "logs"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    report = json.loads(run.stdout)
    assert report["seed"] == 7 and report["seconds"] == 15
    assert report["anomalies"] == []
    assert sum(report["ops"].values()) > 100, report["ops"]
    assert sum(f["injected"] for f in report["faults"].values()) >= 1, report["faults"]
    assert report["final_check"]["checked"] > 0
    lines = history.read_text().splitlines()
    assert json.loads(lines[0])["started_unix_ms"] > 0
    calls = [json.loads(line) for line in lines[1:] if '"op"' in line]
    assert len(calls) == sum(report["ops"].values())
    assert {c["op"] for c in calls} <= {"put", "overwrite", "get", "remove"}
