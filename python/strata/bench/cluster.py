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
from dataclasses import dataclass
from typing import AbstractSet, Dict, FrozenSet, Iterator, List, Optional, Sequence


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


@dataclass(frozen=True)
class Placement:
    """Which CPUs a benchmark's clients and its servers run on.

    ``os`` leaves it to the scheduler. On a small virtual machine that is a
    coin toss between two steady states: a client and the master sharing a
    CPU hand each round trip over without waking anything (a 64 KiB get in
    about 25 us), or they sit on two CPUs and every message wakes a halted
    one (60 to 100 us). Which one a run lands in depends on the client's
    thread layout, not on its code, so ``split`` fixes it: servers (Strata's
    master and nodes, the raw sink, the seed system's processes) on the upper
    half of the CPUs this process may use, clients (this process and `strata
    bench`) on the lower half, as on separate hosts (on a machine with
    hyperthreads numbered half apart, the halves share cores)."""

    clients: Optional[FrozenSet[int]] = None
    servers: Optional[FrozenSet[int]] = None

    @staticmethod
    def of(kind: str, cpus: Optional[Sequence[int]] = None) -> "Placement":
        """``kind`` is ``os`` or ``split``; ``cpus`` defaults to those this
        process may use."""
        if kind == "os":
            return Placement()
        if kind != "split":
            raise ValueError(f"unknown placement {kind!r}: os or split")
        mine = sorted(os.sched_getaffinity(0) if cpus is None else cpus)
        if len(mine) < 2:
            raise ValueError(f"--placement split needs at least 2 CPUs; this process may use {len(mine)}")
        half = len(mine) // 2
        return Placement(frozenset(mine[:half]), frozenset(mine[half:]))

    def describe(self) -> str:
        if self.clients is None:
            return "the scheduler's (--placement os)"
        servers = "not placed" if self.servers is None else f"on CPUs {_cpu_list(self.servers)}"
        return f"clients on CPUs {_cpu_list(self.clients)}, servers {servers}"

    def to_json(self) -> Dict[str, List[int]]:
        return {"clients": sorted(self.clients or ()), "servers": sorted(self.servers or ())}

    def pin_this_process(self) -> None:
        """Puts every thread of this process on the clients' CPUs; threads
        made later inherit it from the thread that makes them."""
        if self.clients is None:
            return
        done: set = set()
        # Again until no thread is new: one not pinned yet may start another.
        for _ in range(100):
            tids = set(os.listdir("/proc/self/task")) - done
            if not tids:
                return
            for tid in tids:
                # A thread may end meanwhile.
                with contextlib.suppress(ProcessLookupError):
                    os.sched_setaffinity(int(tid), self.clients)
            done |= tids
        raise RuntimeError("threads kept starting while this process was being pinned")


def _cpu_list(cpus: AbstractSet[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


@contextlib.contextmanager
def calling_thread_on(cpus: Optional[AbstractSet[int]]) -> Iterator[None]:
    """The calling thread on ``cpus`` (none: unchanged) for the block, and
    back after: a process it spawns meanwhile inherits them (and its threads
    from it), with no code run in the child between fork and exec."""
    if cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


class Procs:
    def __init__(self, cpus: Optional[AbstractSet[int]] = None) -> None:
        """``cpus``: the CPUs the processes spawned run on (none: any)."""
        self.procs: List[subprocess.Popen] = []
        self.cpus = cpus
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
        with open(self.log_of(name), "wb") as log, calling_thread_on(self.cpus):
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
def strata_cluster(bin_dir: Path, node_capacity: str, transport: str = "tcp",
                   cpus: Optional[AbstractSet[int]] = None) -> Iterator[str]:
    """A master and two store nodes (on ``cpus``, if given); yields the
    master's address."""
    procs = Procs(cpus)
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
