"""``python -m strata.bench``: the Python client against the Rust client and
the seed system, in one run.

For each object size (64 KiB and 1 MiB by default) and each thread count (1
and 4), it times puts and gets into registered buffers, one object per call
and batches of 16, through the native API (``strata.Store``) and the drop-in
(``strata.mooncake``); then, against the same cluster and in the same run,
the Rust client (``strata bench`` with the same sizes, clients and batch),
and, when the seed system's wheel is installed (``--seed``), the seed system
itself: its ``mooncake_master`` and two store processes contributing the same
DRAM, driven by this script through its own ``MooncakeDistributedStore``.
Beside them, the floor: the same threads and buffers moving the same bytes
over raw loopback TCP to ``strata bench sink`` (``raw tcp`` rows, the ``VS
RAW`` column; ``--no-raw`` skips them).

Rates on a small machine swing from run to run; ``--rounds N`` times every
system N times in turn and reports each row's median round (and the range).
``CPU us`` is the CPU time of the process making the calls, per object,
over the phase: this script's for the Python clients, the raw floor and the
seed system's client, ``strata bench``'s for the Rust client (the servers are
other processes).

Without ``--master`` it starts a cluster from the built binaries
(``--bin-dir``, default ``$STRATA_BIN_DIR`` or ``target/release``): one master
and two store nodes of ``--node-capacity``, on loopback, no credentials.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import os
import resource
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import AbstractSet, Any, Callable, Dict, Iterator, List, Optional, Sequence

import numpy as np

from .cluster import Placement, Procs, free_port, strata_cluster

UNITS = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "b": 1}


def parse_size(s: str) -> int:
    t = s.strip().lower()
    for u, m in UNITS.items():
        if t.endswith(u):
            return int(float(t[: -len(u)]) * m)
    return int(t)


def fmt_size(n: int) -> str:
    for u, m in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= m and n % m == 0:
            return f"{n // m} {u}"
    return f"{n} B"


def wait_port(port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port} after {timeout}s")


@dataclass
class Row:
    system: str
    op: str
    size: int
    threads: int
    batch: int
    ops: int
    seconds: float
    lat: List[float] = field(default_factory=list)
    note: str = ""
    # Percentiles measured elsewhere (the Rust client's own report).
    given_p50: Optional[float] = None
    given_p99: Optional[float] = None
    # With --rounds: every round's ops/s (this row is the median round's).
    rounds: List[float] = field(default_factory=list)
    # CPU time (user + system) of the process that made the calls, per
    # object, over the phase: this script's for the Python clients and the
    # seed system's (whose client is a library in it too), `strata
    # bench`'s for the Rust client. Servers are other processes.
    cpu_us: Optional[float] = None

    @property
    def ops_per_s(self) -> float:
        return self.ops / self.seconds if self.seconds else 0.0

    @property
    def gbps(self) -> float:
        return self.ops * self.size / self.seconds / 1e9 if self.seconds else 0.0

    def pct(self, q: float) -> float:
        if q == 0.5 and self.given_p50 is not None:
            return self.given_p50
        if q == 0.99 and self.given_p99 is not None:
            return self.given_p99
        if not self.lat:
            return float("nan")
        s = sorted(self.lat)
        return s[min(len(s) - 1, int(q * len(s)))] * 1e3

    def to_json(self) -> Dict[str, Any]:
        return {
            "system": self.system, "op": self.op, "size": self.size, "threads": self.threads,
            "batch": self.batch, "ops": self.ops, "ops_per_s": self.ops_per_s, "gb_per_s": self.gbps,
            "p50_ms": self.pct(0.5), "p99_ms": self.pct(0.99), "note": self.note,
            "rounds_ops_per_s": self.rounds or [self.ops_per_s],
            "cpu_us_per_op": self.cpu_us,
        }


def median_rows(rounds: List[List[Row]]) -> List[Row]:
    """One row per system, op, size and threads: the round of median ops/s
    (the lower of the middle two for an even count), its latencies too,
    with every round's rate kept."""
    keyed: Dict[Any, List[Row]] = {}
    for rows in rounds:
        for r in rows:
            keyed.setdefault((r.system, r.op, r.size, r.threads), []).append(r)
    out = []
    for same in keyed.values():
        ranked = sorted(same, key=lambda r: r.ops_per_s)
        mid = ranked[(len(ranked) - 1) // 2]
        mid.rounds = [r.ops_per_s for r in same]
        out.append(mid)
    return out


class Progress:
    """One line on stderr per phase (a bar where the terminal allows)."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet

    def phase(self, text: str) -> None:
        if not self.quiet:
            sys.stderr.write(f"\r\033[K{text}" if sys.stderr.isatty() else f"{text}\n")
            sys.stderr.flush()

    def done(self) -> None:
        if not self.quiet and sys.stderr.isatty():
            sys.stderr.write("\r\033[K")


# ---- drivers: one object per call or one batch per call, per API ------------


class Driver:
    """put/get of one object or a batch, from and into registered memory."""

    name = ""

    def prepare(self, op: str, keys: List[str], bufs: List[np.ndarray]) -> Callable[[], Any]:
        """One call (``op`` is put or get), with everything an engine holds
        beforehand (keys, buffer addresses, part views) made before the clock
        starts: the rows time the client, not the script building its
        arguments. The call raises on any failure."""
        raise NotImplementedError

    def clear(self, prefix: str) -> None: ...


def _all_none(f: Callable[..., List[Any]], *args: Any) -> None:
    """A batch put's results: None per object, else its exception."""
    bad = [r for r in f(*args) if r is not None]
    if bad:
        raise bad[0]


def _all_ints(f: Callable[..., List[Any]], *args: Any) -> None:
    """A batch get's results: bytes read per object, else its exception."""
    bad = [r for r in f(*args) if not isinstance(r, int)]
    if bad:
        raise bad[0]


def _rc(ok: Callable[[int], bool], f: Callable[..., Any], *args: Any) -> None:
    """A Mooncake call's code (one, or one per key), each judged by ``ok``:
    puts must answer 0, reads the bytes read (a negative code fails)."""
    rc = f(*args)
    if not all(ok(r) for r in (rc if isinstance(rc, list) else [rc])):
        raise RuntimeError(f"{getattr(f, '__name__', 'call')}: {rc}")


def _is_zero(rc: int) -> bool:
    return rc == 0


def _is_size(rc: int) -> bool:
    return rc >= 0


class Native(Driver):
    name = "python native"

    def __init__(self, store: Any) -> None:
        self.s = store

    def prepare(self, op, keys, bufs):
        if len(keys) == 1:
            return functools.partial(self.s.put if op == "put" else self.s.get_into, keys[0], bufs[0])
        if op == "put":
            return functools.partial(_all_none, self.s.batch_put, keys, bufs)
        return functools.partial(_all_ints, self.s.batch_get_into, keys, bufs)

    def clear(self, prefix):
        self.s.remove_prefix(prefix, force=True)


class Parts(Driver):
    """The native API with each object made of ``n`` parts (views of one
    registered buffer): the way the vLLM connector moves a block, one slice
    per layer."""

    name = "python parts"

    def __init__(self, store: Any, n: int) -> None:
        self.s = store
        self.n = n

    def views(self, b: np.ndarray) -> List[np.ndarray]:
        step = max(1, b.nbytes // self.n)
        cuts = list(range(0, b.nbytes, step))[: self.n] + [b.nbytes]
        return [b[lo:hi] for lo, hi in zip(cuts, cuts[1:])]

    def clear(self, prefix):
        self.s.remove_prefix(prefix, force=True)

    def prepare(self, op, keys, bufs):
        views = [self.views(b) for b in bufs]
        if len(keys) == 1:
            f = self.s.put_parts if op == "put" else self.s.get_into_parts
            return functools.partial(f, keys[0], views[0])
        if op == "put":
            return functools.partial(_all_none, self.s.batch_put_from_parts, keys, views)
        return functools.partial(_all_ints, self.s.batch_get_into_parts, keys, views)


class Mooncake(Driver):
    """The ``MooncakeDistributedStore`` API (the drop-in or the seed system)."""

    def __init__(self, name: str, store: Any) -> None:
        self.name = name
        self.s = store

    def clear(self, prefix):
        self.s.remove_by_regex("^" + prefix.replace(".", r"\."), True)

    def prepare(self, op, keys, bufs):
        # Engines hand over addresses of memory they registered once.
        ptrs, sizes = [b.ctypes.data for b in bufs], [b.nbytes for b in bufs]
        if len(keys) == 1:
            if op == "put":
                return functools.partial(_rc, _is_zero, self.s.put_from, keys[0], ptrs[0], sizes[0])
            return functools.partial(_rc, _is_size, self.s.get_into, keys[0], ptrs[0], sizes[0])
        if op == "put":
            return functools.partial(_rc, _is_zero, self.s.batch_put_from, keys, ptrs, sizes)
        return functools.partial(_rc, _is_size, self.s.batch_get_into, keys, ptrs, sizes)


class RawTcp(Driver):
    """Raw loopback TCP to ``strata bench sink``, from the same threads and
    buffers: a put sends the bytes and waits for an 8-byte answer, a get asks
    and reads them; a batch sends its requests back to back on one
    connection, then reads the answers. No metadata, no placement, no
    checksum: the floor any store has on this machine's loopback."""

    name = "raw tcp"

    def __init__(self, addr: str) -> None:
        host, port = addr.rsplit(":", 1)
        self.addr = (host, int(port))
        # Connections not in use: as many as threads at once, reused by the
        # next phase's threads (each costs the sink an arena).
        self.idle: List[socket.socket] = []
        self.lock = threading.Lock()

    @contextlib.contextmanager
    def conn(self) -> Iterator[socket.socket]:
        with self.lock:
            c = self.idle.pop() if self.idle else None
        if c is None:
            c = socket.create_connection(self.addr)
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            yield c
        except BaseException:
            c.close()  # out of step with the sink
            raise
        with self.lock:
            self.idle.append(c)

    @staticmethod
    def head(op: int, n: int) -> bytes:
        return struct.pack("<IIQ", op, 0, n)

    @staticmethod
    def recv_into(c: socket.socket, mv: memoryview) -> None:
        while mv.nbytes:
            n = c.recv_into(mv, mv.nbytes, socket.MSG_WAITALL)
            if n == 0:
                raise ConnectionError("the sink hung up")
            mv = mv[n:]

    def put(self, keys, bufs):
        with self.conn() as c:
            for b in bufs:
                parts = [memoryview(self.head(1, b.nbytes)), memoryview(b).cast("B")]
                sent = c.sendmsg(parts)
                # What one sendmsg did not take goes after it.
                for p in parts:
                    if sent >= p.nbytes:
                        sent -= p.nbytes
                        continue
                    c.sendall(p[sent:])
                    sent = 0
            acks = memoryview(bytearray(8 * len(bufs)))
            self.recv_into(c, acks)

    def get(self, keys, bufs):
        with self.conn() as c:
            c.sendall(b"".join(self.head(2, b.nbytes) for b in bufs))
            for b in bufs:
                self.recv_into(c, memoryview(b).cast("B"))

    def prepare(self, op, keys, bufs):
        return functools.partial(self.put if op == "put" else self.get, keys, bufs)

    def clear(self, prefix):
        pass

    def close(self) -> None:
        with self.lock:
            for c in self.idle:
                c.close()
            self.idle.clear()


@contextlib.contextmanager
def raw_sink(strata_bin: Path, arena: int, arenas: int, cpus: Optional[AbstractSet[int]] = None) -> Iterator[str]:
    """``strata bench sink`` in a process of its own (on ``cpus``, if
    given), with ``arenas`` arenas of ``arena`` bytes made before it listens;
    yields its address."""
    procs = Procs(cpus)
    try:
        p = procs.spawn([str(strata_bin), "bench", "sink", "--arena", str(arena), "--arenas", str(arenas)],
                        "sink")
        text = procs.wait_for("sink", p, "listening ", 30)
        yield text.split("listening ", 1)[1].split()[0]
    finally:
        procs.stop()


def run_phase(
    driver: Driver,
    op: str,
    size: int,
    threads: int,
    batch: int,
    calls: int,
    prefix: str,
    bufs: List[List[np.ndarray]],
) -> Row:
    """``calls`` calls per thread; each thread its own keys and buffers."""
    lat: List[List[float]] = [[] for _ in range(threads)]
    errors: List[BaseException] = []
    barrier = threading.Barrier(threads + 1)

    def plan(t: int) -> List[Callable[[], Any]]:
        mine = bufs[t]
        out = []
        for c in range(calls):
            keys = [f"{prefix}{t}-{c}-{j}" for j in range(batch)]
            chunk = mine[(c * batch) % len(mine):][:batch]
            if len(chunk) < batch:
                chunk = mine[:batch]
            out.append(driver.prepare(op, keys, chunk))
        return out

    plans = [plan(t) for t in range(threads)]

    def work(t: int) -> None:
        try:
            mine, took = plans[t], lat[t]
            clock = time.perf_counter
            barrier.wait()
            for call in mine:
                t0 = clock()
                call()
                took.append(clock() - t0)
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            errors.append(e)
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.abort()

    ts = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    # The plans are many tracked objects that never die during the phase:
    # out of the collector's way, so a full collection does not walk them
    # inside the clock.
    gc.collect()
    gc.freeze()
    try:
        cpu0 = process_cpu()
        barrier.wait()
        t0 = time.perf_counter()
        for t in ts:
            t.join()
        took = time.perf_counter() - t0
        cpu = process_cpu() - cpu0
    finally:
        gc.unfreeze()
    if errors:
        raise errors[0]
    objects = calls * threads * batch
    return Row(driver.name, "batch_" + op if batch > 1 else op, size, threads, batch,
               objects, took, [x for l in lat for x in l], cpu_us=cpu * 1e6 / objects)


def process_cpu() -> float:
    """User + system CPU seconds of this process so far (all its threads)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def bench_driver(driver: Driver, sizes: Sequence[int], threads_list: Sequence[int], batch: int,
                 bytes_per_phase: int, progress: Progress) -> List[Row]:
    rows: List[Row] = []
    for size in sizes:
        for threads in threads_list:
            for b in (1, batch):
                objects = max(b * threads * 4, min(20_000, bytes_per_phase // size))
                calls = max(4, objects // (b * threads))
                # Registered memory: a pool of buffers per thread, reused.
                pool = [[np.full(size, t + 1, dtype=np.uint8) for _ in range(max(b, 4))] for t in range(threads)]
                prefix = f"pybench-{uuid.uuid4().hex[:8]}/"
                progress.phase(f"{driver.name}: {fmt_size(size)} x{b} {threads} thread(s) ...")
                # An untimed round first (connections, the master's tables).
                run_phase(driver, "put", size, threads, b, 2, prefix + "warm-", pool)
                rows.append(run_phase(driver, "put", size, threads, b, calls, prefix, pool))
                rows.append(run_phase(driver, "get", size, threads, b, calls, prefix, pool))
                driver.clear(prefix)
    progress.done()
    return rows


# ---- the Rust client: `strata bench` against the same cluster ----------------


def rust_rows(strata_bin: Path, master: str, sizes: Sequence[int], threads_list: Sequence[int], batch: int,
              bytes_per_phase: int, progress: Progress, transport: str = "tcp") -> List[Row]:
    rows: List[Row] = []
    names = {"strata put": "put", "strata get": "get", "strata batch_put": "batch_put",
             "strata batch_get": "batch_get"}
    for threads in threads_list:
        progress.phase(f"rust client ({strata_bin.name} bench): {threads} client(s) ...")
        cmd = [str(strata_bin), "--master", master, "--transport", transport, "bench", "--json",
               "--sizes", ",".join(str(s) for s in sizes), "--clients", str(threads),
               "--batch", str(batch), "--bytes", str(bytes_per_phase), "--meta-keys", "0",
               # The client as the library makes it, as the Python clients
               # here are (a location cache that every lookup fills).
               "--client-defaults"]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {out.stderr.strip()[-2000:]}")
        for r in json.loads(out.stdout)["rows"]:
            op = names.get(r.get("scenario", ""))
            if op is None:
                continue
            size = int(r["size"])
            ops = int(r["ops"])
            ops_s = float(r["ops_per_sec"])
            cpu = r.get("cpu_us_per_op")
            rows.append(Row("rust client", op, size, threads, batch if op.startswith("batch") else 1, ops,
                            ops / ops_s if ops_s else 0.0, given_p50=float(r["p50_ms"]),
                            given_p99=float(r["p99_ms"]), cpu_us=None if cpu is None else float(cpu)))
    progress.done()
    return rows


# ---- clusters ---------------------------------------------------------------


SEED_STORE = """
import sys, time
from mooncake.store import MooncakeDistributedStore
s = MooncakeDistributedStore()
rc = s.setup("127.0.0.1", sys.argv[1], int(sys.argv[2]), 16 << 20, "tcp", "", sys.argv[3])
print("ready" if rc == 0 else f"setup failed: {rc}", flush=True)
while rc == 0:
    time.sleep(3600)
"""


@contextlib.contextmanager
def seed_cluster(capacity: int, cpus: Optional[AbstractSet[int]] = None) -> Iterator[Any]:
    """The seed system: its master and two store processes of ``capacity``
    bytes each (on ``cpus``, if given); yields a connected
    ``MooncakeDistributedStore`` (no segment of its own, like the Strata
    client here)."""
    from mooncake.store import MooncakeDistributedStore  # noqa: F401 - fails early when missing

    master_bin = shutil.which("mooncake_master") or str(Path(sys.executable).parent / "mooncake_master")
    procs = Procs(cpus)
    try:
        rpc, http, metrics = free_port(), free_port(), free_port()
        procs.spawn([master_bin, "--port", str(rpc), "--rpc_address", "127.0.0.1",
                     "--enable_http_metadata_server=true", "--http_metadata_server_host", "127.0.0.1",
                     "--http_metadata_server_port", str(http), "--metrics_host", "127.0.0.1",
                     "--metrics_port", str(metrics)], "mooncake-master")
        wait_port(rpc)
        wait_port(http)
        meta = f"http://127.0.0.1:{http}/metadata"
        for i in range(2):
            p = procs.spawn([sys.executable, "-c", SEED_STORE, meta, str(capacity), f"127.0.0.1:{rpc}"],
                            f"mooncake-store-{i}")
            procs.wait_for(f"mooncake-store-{i}", p, "ready", 60, fail="failed")
        from mooncake.store import MooncakeDistributedStore as Seed

        s = Seed()
        rc = s.setup("127.0.0.1", meta, 0, 16 << 20, "tcp", "", f"127.0.0.1:{rpc}")
        if rc != 0:
            raise RuntimeError(f"seed client setup failed: {rc}")
        try:
            yield s
        finally:
            s.close()
    finally:
        procs.stop()


# ---- report -------------------------------------------------------------------


def report(rows: List[Row], out: Any) -> None:
    by = {(r.system, r.op, r.size, r.threads): r for r in rows}
    spread = any(len(r.rounds) > 1 for r in rows)
    out.write(f"{'SYSTEM':<16} {'OP':<10} {'SIZE':>8} {'THR':>3} {'OPS/S':>10} {'GB/S':>7} "
              f"{'P50 ms':>8} {'P99 ms':>8} {'CPU us':>7}  VS RUST  VS SEED   VS RAW"
              f"{'   ROUNDS (min-max)' if spread else ''}\n")

    def vs(r: Row, system: str) -> str:
        other = by.get((system, r.op, r.size, r.threads))
        if other is None or r.system == system or not other.ops_per_s:
            return ""
        return f"{r.ops_per_s / other.ops_per_s:6.2f}x"

    def cpu(r: Row) -> str:
        return "" if r.cpu_us is None else f"{r.cpu_us:.1f}"

    for r in rows:
        p99 = r.pct(0.99)
        out.write(f"{r.system:<16} {r.op:<10} {fmt_size(r.size):>8} {r.threads:>3} {r.ops_per_s:>10.0f} "
                  f"{r.gbps:>7.3f} {r.pct(0.5):>8.3f} {p99:>8.3f} {cpu(r):>7}  {vs(r, 'rust client'):>7}  "
                  f"{vs(r, 'seed system'):>7}  {vs(r, 'raw tcp'):>7}"
                  f"{f'   {min(r.rounds):.0f}-{max(r.rounds):.0f}' if spread else ''}\n")
    parts = [r for r in rows if r.system == "python parts"]
    if parts:
        out.write("objects of parts against the same objects in one buffer (python parts / python native):\n")
    for r in parts:
        one = by.get(("python native", r.op, r.size, r.threads))
        if one and one.ops_per_s:
            out.write(f"  {r.op:<10} {fmt_size(r.size):>8} {r.threads:>3} thr  {r.ops_per_s / one.ops_per_s:5.2f}x\n")


@contextlib.contextmanager
def drop_in(master: str, transport: str) -> Iterator[Any]:
    """Strata's ``MooncakeDistributedStore``, set up as an engine does (no
    segment of its own), closed after."""
    from strata.mooncake import MooncakeDistributedStore

    mc = MooncakeDistributedStore()
    rc = mc.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, transport, "", master)
    if rc != 0:
        raise SystemExit(f"drop-in setup failed: {rc}")
    try:
        yield mc
    finally:
        mc.close()


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m strata.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--master", help="an existing cluster (default: start one from --bin-dir)")
    ap.add_argument("--token-file", help="its client (or admin) token")
    ap.add_argument("--bin-dir", default=os.environ.get("STRATA_BIN_DIR", "target/release"),
                    help="where strata-master, strata-store-node and strata are")
    ap.add_argument("--node-capacity", default="2GiB", help="DRAM of each of the two store nodes")
    ap.add_argument("--sizes", default="64KiB,1MiB")
    ap.add_argument("--threads", default="1,4")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--bytes", default="512MiB", help="bytes moved per phase (at most 20000 objects)")
    ap.add_argument("--parts", type=int, default=32,
                    help="also move each object as this many parts (vLLM's one slice per layer); 0: skip")
    ap.add_argument("--transport", choices=["tcp", "ucx"], default="tcp",
                    help="the data plane of the started nodes and of every Strata client (ucx: the same-host "
                         "path; needs binaries and a wheel built with the `ucx` feature)")
    ap.add_argument("--no-rust", action="store_true", help="skip the Rust client's rows")
    ap.add_argument("--no-raw", action="store_true",
                    help="skip the raw loopback TCP rows (`strata bench sink` from --bin-dir)")
    ap.add_argument("--seed", action="store_true", help="also run the seed system (its wheel must be installed)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="time every system this many times in turn and report each row's median round "
                         "(the lower middle one for an even count)")
    ap.add_argument("--placement", choices=["os", "split"], default="os",
                    help="os: the scheduler places every process; split: the servers (the cluster, the raw "
                         "sink, the seed system's processes) on the upper half of this process's CPUs, the "
                         "clients (this process, `strata bench`) on the lower half, as on separate hosts")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    a = ap.parse_args(argv)
    if a.rounds < 1:
        ap.error(f"--rounds must be at least 1, not {a.rounds}")
    try:
        placement = Placement.of(a.placement)
    except ValueError as e:
        ap.error(str(e))
    # Before the first client makes its threads: they inherit it.
    placement.pin_this_process()

    import strata

    sizes = [parse_size(s) for s in a.sizes.split(",") if s]
    threads = [int(t) for t in a.threads.split(",") if t]
    per_phase = parse_size(a.bytes)
    progress = Progress(a.json)
    bin_dir = Path(a.bin_dir)
    if a.seed:
        # Missing, it fails now rather than after the other systems' rows.
        try:
            import mooncake.store  # noqa: F401
        except ImportError as e:
            raise SystemExit(f"--seed needs the seed system's wheel (pip install "
                             f"mooncake-transfer-engine-non-cuda==0.3.13.post1): {e}") from None

    rounds: List[List[Row]] = []
    if a.token_file:
        os.environ["STRATA_TOKEN_FILE"] = a.token_file
    with contextlib.ExitStack() as stack:
        master = a.master or stack.enter_context(
            strata_cluster(bin_dir, a.node_capacity, a.transport, placement.servers))
        for n in range(a.rounds):
            if a.rounds > 1:
                progress.phase(f"round {n + 1} of {a.rounds}")
            # Each system's clients (and the sink's and the seed system's
            # processes) live only for that system's rows: the CPU column
            # counts this process, and idle clients' threads would count
            # in others' rows and take their CPU.
            rows: List[Row] = []
            with strata.Store.connect(master, token_file=a.token_file, transport=a.transport) as store:
                rows += bench_driver(Native(store), sizes, threads, a.batch, per_phase, progress)
                if a.parts > 0:
                    rows += bench_driver(Parts(store, a.parts), sizes, threads, a.batch, per_phase, progress)
            with drop_in(master, a.transport) as mc:
                rows += bench_driver(Mooncake("python mooncake", mc), sizes, threads, a.batch, per_phase,
                                     progress)
            if not a.no_rust:
                rows += rust_rows(bin_dir / "strata", master, sizes, threads, a.batch, per_phase, progress,
                                  a.transport)
            if not a.no_raw:
                # An arena per thread, larger than the caches and than 16
                # of the largest batches.
                arena = max(64 << 20, 16 * max(sizes) * a.batch)
                with raw_sink(bin_dir / "strata", arena, max(threads), placement.servers) as addr:
                    raw = RawTcp(addr)
                    try:
                        rows += bench_driver(raw, sizes, threads, a.batch, per_phase, progress)
                    finally:
                        raw.close()
            if a.seed:
                with seed_cluster(parse_size(a.node_capacity), placement.servers) as seed:
                    rows += bench_driver(Mooncake("seed system", seed), sizes, threads, a.batch, per_phase,
                                         progress)
            rounds.append(rows)
    rows = median_rows(rounds)
    # A cluster at --master runs where it runs; the sink and the seed
    # system, started here, are still placed.
    where = placement.describe() + ("; the cluster at --master where it runs" if a.master and placement.clients else "")
    if a.json:
        json.dump({"placement": {**placement.to_json(), "cluster_placed": not a.master, "describe": where},
                   "rows": [r.to_json() for r in rows]}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(f"placement: {where}\n")
        report(rows, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
