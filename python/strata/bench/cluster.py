"""Processes of a benchmark: a Strata cluster started from built binaries,
and the helpers to wait for them."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Dict, Iterator, List, Optional


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 60.0, proc: Optional[subprocess.Popen] = None,
              log: Optional[Path] = None) -> None:
    """Waits for ``url`` to answer 200; fails at once if ``proc`` exits
    meanwhile (a bad flag, a taken port), with the end of its ``log``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:] if log is not None and log.exists() else ""
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode} before {url} answered:\n{tail}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{url} did not answer within {timeout}s")


class Procs:
    def __init__(self) -> None:
        self.procs: List[subprocess.Popen] = []
        self.dir = Path(tempfile.mkdtemp(prefix="strata-pybench-"))

    def log_of(self, name: str) -> Path:
        """Where the process spawned as ``name`` writes its output."""
        return self.dir / f"{name}.log"

    def wait_for(self, name: str, proc: subprocess.Popen, marker: str, timeout: float,
                 fail: Optional[str] = None) -> str:
        """Waits until the output of ``proc`` (spawned as ``name``) holds
        ``marker`` and returns it; fails at once if the process exits or
        writes ``fail``, or after ``timeout`` seconds, with the end of it."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.log_of(name).read_text(errors="replace")
            if marker in text:
                return text
            if proc.poll() is not None or (fail is not None and fail in text) or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start: {text[-2000:]}")
            time.sleep(0.05)

    def spawn(self, args: List[str], name: str, env: Optional[Dict[str, str]] = None) -> subprocess.Popen:
        log = open(self.log_of(name), "wb")
        p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        self.procs.append(p)
        return p

    def stop(self) -> None:
        for p in reversed(self.procs):
            with contextlib.suppress(Exception):
                p.send_signal(signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def strata_cluster(bin_dir: Path, node_capacity: str, transport: str = "tcp") -> Iterator[str]:
    procs = Procs()
    try:
        port, admin = free_port(), free_port()
        p = procs.spawn([str(bin_dir / "strata-master"), "--listen", f"127.0.0.1:{port}",
                         "--admin-addr", f"127.0.0.1:{admin}"], "master", {"RUST_LOG": "warn"})
        wait_http(f"http://127.0.0.1:{admin}/ready", proc=p, log=procs.log_of("master"))
        for i in range(2):
            a = free_port()
            p = procs.spawn([str(bin_dir / "strata-store-node"), "--master", f"127.0.0.1:{port}",
                             "--listen", f"127.0.0.1:{free_port()}", "--admin-addr", f"127.0.0.1:{a}",
                             "--capacity", node_capacity, "--node-id", f"bench-{i}", "--transport", transport],
                            f"node-{i}", {"RUST_LOG": "warn"})
            wait_http(f"http://127.0.0.1:{a}/ready", proc=p, log=procs.log_of(f"node-{i}"))
        yield f"127.0.0.1:{port}"
    finally:
        procs.stop()
