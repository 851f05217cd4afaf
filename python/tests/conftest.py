"""A real Strata cluster for the Python tests: the release-built or
test-built binaries (``STRATA_BIN_DIR``, else ``$CARGO_TARGET_DIR/debug``,
else ``target/debug``) started as processes: one master with credentials
for every role, two store nodes, one SSD agent."""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import signal
import socket
import subprocess
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, List, Optional

import pytest

import strata

REPO = Path(__file__).resolve().parents[2]


def bin_dir() -> Path:
    if os.environ.get("STRATA_BIN_DIR"):
        d = Path(os.environ["STRATA_BIN_DIR"])
    elif os.environ.get("CARGO_TARGET_DIR"):
        d = Path(os.environ["CARGO_TARGET_DIR"]) / "debug"
    else:
        d = REPO / "target" / "debug"
    if not (d / "strata-master").exists():
        raise RuntimeError(
            f"no strata-master in {d}: build the binaries first (scripts/test.sh does), "
            "or point STRATA_BIN_DIR at them"
        )
    return d


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    # PR_SET_PDEATHSIG: the cluster dies with the test run, even on SIGKILL.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)


def wait_until(cond: Callable[[], bool], timeout: float = 30.0, what: str = "condition") -> None:
    """Polls ``cond`` every 20 ms until it holds, failing after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    admin: str

    def ready(self) -> bool:
        return http_ok(f"http://{self.admin}/ready")

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(timeout=10)


@dataclass
class Cluster:
    dir: Path
    master: str
    master_admin: str
    member_token: Path
    client_token: Path
    admin_token: Path
    procs: List[Proc] = field(default_factory=list)

    def spawn(self, name: str, args: List[str], admin: str) -> Proc:
        log = open(self.dir / f"{name}-{len(self.procs)}.log", "wb")
        p = subprocess.Popen(
            [str(bin_dir() / name), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "RUST_LOG": os.environ.get("STRATA_TEST_LOG", "warn")},
            preexec_fn=_die_with_parent,
        )
        proc = Proc(name, p, admin)
        self.procs.append(proc)
        wait_until(lambda: proc.ready() or p.poll() is not None, what=f"{name} to be ready")
        if p.poll() is not None:
            raise RuntimeError(f"{name} exited with {p.returncode}; see {log.name}")
        return proc

    def store_node(self, node_id: str, capacity: str = "128MiB") -> Proc:
        admin = f"127.0.0.1:{free_port()}"
        return self.spawn(
            "strata-store-node",
            [
                "--master", self.master,
                "--listen", f"127.0.0.1:{free_port()}",
                "--admin-addr", admin,
                "--node-id", node_id,
                "--capacity", capacity,
                "--token-file", str(self.member_token),
            ],
            admin,
        )

    def stop(self) -> None:
        for p in reversed(self.procs):
            with contextlib.suppress(Exception):
                p.kill()


@pytest.fixture(scope="session", autouse=True)
def clean_environment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """No credential or master from the caller's environment: each test says
    what it connects with (and no `strata up` token is found by default)."""
    saved = {k: os.environ.pop(k, None) for k in
             ("STRATA_MASTER", "STRATA_TOKEN_FILE", "STRATA_SEGMENT_TOKEN_FILE", "XDG_CONFIG_HOME")}
    os.environ["XDG_CONFIG_HOME"] = str(tmp_path_factory.mktemp("config"))
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    d = tmp_path_factory.mktemp("cluster")
    tokens = {}
    for role in ("member", "client", "admin"):
        p = d / f"{role}.token"
        p.write_text(secrets.token_hex(32) + "\n")
        tokens[role] = p
    master_admin = f"127.0.0.1:{free_port()}"
    c = Cluster(
        dir=d,
        master=f"127.0.0.1:{free_port()}",
        master_admin=master_admin,
        member_token=tokens["member"],
        client_token=tokens["client"],
        admin_token=tokens["admin"],
    )
    try:
        c.spawn(
            "strata-master",
            [
                "--listen", c.master,
                "--admin-addr", master_admin,
                "--member-token-file", str(c.member_token),
                "--client-token-file", str(c.client_token),
                "--admin-token-file", str(c.admin_token),
                # Readers' leases end soon after the read (remove tests).
                "--lease-ttl", "2s",
            ],
            master_admin,
        )
        c.store_node("node-a")
        c.store_node("node-b")
        agent_admin = f"127.0.0.1:{free_port()}"
        (d / "ssd").mkdir()
        c.spawn(
            "strata-ssd-agent",
            [
                "--master", c.master,
                "--handle", "pytest/ssd-0",
                "--data-dir", str(d / "ssd"),
                "--capacity", "256MiB",
                "--listen", f"127.0.0.1:{free_port()}",
                "--admin-addr", agent_admin,
                "--token-file", str(c.member_token),
            ],
            agent_admin,
        )
        # Both nodes' segments are in the master's view before any test.
        with strata.Store.connect(c.master, token_file=c.admin_token) as s:
            wait_until(lambda: s.stat()["nodes"] >= 2, what="two store nodes registered")
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="session")
def store(cluster: Cluster) -> Iterator[strata.Store]:
    """An admin-token Store shared by the tests (keys are per test)."""
    s = strata.Store.connect(cluster.master, token_file=cluster.admin_token, timeout=10)
    yield s
    s.close()


@pytest.fixture
def prefix() -> str:
    """A key prefix of this test alone."""
    return f"t-{uuid.uuid4().hex[:12]}/"


def node_ids(store: strata.Store) -> List[str]:
    return sorted({s["node_id"] for s in store.stat()["segment_info"]})


def key_nodes(cluster: Cluster, key: str) -> Optional[List[str]]:
    """The nodes holding ``key``'s memory replicas (the master's admin API)."""
    import json
    import urllib.parse

    url = f"http://{cluster.master_admin}/api/v1/keys/{urllib.parse.quote(key, safe='')}"
    # Key views are the admin's (`Authorization: Bearer`).
    token = cluster.admin_token.read_text().strip()
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            info = json.load(r)
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        raise
    return sorted(r["node"] for r in info["replicas"] if r["kind"] == "memory")


def master_metric(cluster: Cluster, name: str) -> float:
    """One unlabelled sample of the master's Prometheus metrics."""
    with urllib.request.urlopen(f"http://{cluster.master_admin}/metrics", timeout=5) as r:
        text = r.read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} is not among the master's metrics")
