"""``python -m strata.bench`` end to end, at a size that takes seconds: it
starts its own cluster from the test binaries, runs every driver, the
Rust client's rows and the raw TCP floor's (``strata bench sink``) through
the flags it passes them, and reports one row per operation. Its figures are not judged here (docs/benchmarks.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import bin_dir


def run_bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "strata.bench", "--bin-dir", str(bin_dir()), *args],
        capture_output=True, text=True, timeout=600,
    )


def test_the_benchmark_runs_every_driver_the_rust_client_and_raw_tcp() -> None:
    out = run_bench("--node-capacity", "64MiB", "--sizes", "4KiB", "--threads", "1", "--batch", "4",
                    "--bytes", "64KiB", "--parts", "2", "--transport", "tcp", "--rounds", "2",
                    "--placement", "split", "--json")
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    cpus = sorted(os.sched_getaffinity(0))
    half = len(cpus) // 2
    placed = report["placement"]
    assert (placed["clients"], placed["servers"], placed["cluster_placed"]) == (cpus[:half], cpus[half:], True), placed
    rows = report["rows"]
    want = {"put", "get", "batch_put", "batch_get"}
    for system in ("python native", "python parts", "python mooncake", "rust client", "raw tcp"):
        mine = [r for r in rows if r["system"] == system]
        assert sorted(r["op"] for r in mine) == sorted(want), (system, mine)
        for r in mine:
            assert r["size"] == 4096 and r["threads"] == 1, r
            assert r["ops"] > 0 and r["ops_per_s"] > 0, r
            # Two rounds, the row being the slower (the lower median).
            assert len(r["rounds_ops_per_s"]) == 2, r
            assert r["ops_per_s"] == min(r["rounds_ops_per_s"]), r
            # What the calls cost their process, per object.
            assert r["cpu_us_per_op"] is not None and r["cpu_us_per_op"] > 0, r
    assert len(rows) == 20, rows


def test_rounds_are_merged_into_the_median_round_of_each_row() -> None:
    from strata.bench.__main__ import Row, median_rows

    def row(system: str, ops: int) -> Row:
        return Row(system, "get", 4096, 1, 1, ops, 1.0, lat=[ops / 1e6])

    rounds = [[row("a", 30), row("b", 5)], [row("a", 10), row("b", 7)], [row("a", 20), row("b", 6)]]
    merged = {r.system: r for r in median_rows(rounds)}
    assert sorted(merged) == ["a", "b"]
    assert merged["a"].ops_per_s == 20 and merged["a"].rounds == [30, 10, 20]
    assert merged["a"].lat == [20 / 1e6]  # the median round's own latencies
    assert merged["b"].ops_per_s == 6 and merged["b"].rounds == [5, 7, 6]


def test_zero_rounds_are_refused() -> None:
    out = run_bench("--rounds", "0", "--json")
    assert out.returncode == 2
    assert "--rounds must be at least 1, not 0" in out.stderr
    assert out.stdout == ""


def test_seed_without_its_wheel_fails_before_any_row(monkeypatch, capsys) -> None:
    import sys

    import pytest
    from strata.bench.__main__ import main

    # As if the wheel were not installed (None in sys.modules: ImportError).
    monkeypatch.setitem(sys.modules, "mooncake", None)
    monkeypatch.setitem(sys.modules, "mooncake.store", None)
    with pytest.raises(SystemExit) as e:
        main(["--seed", "--bin-dir", "/nonexistent", "--json"])
    assert "--seed needs the seed system's wheel" in str(e.value)
    assert capsys.readouterr().out == ""


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


def test_placements_split_the_cpus_in_halves_and_refuse_what_cannot_be_split() -> None:
    from strata.bench.cluster import Placement

    assert Placement.of("os") == Placement(None, None)
    split = Placement.of("split", [3, 0, 2, 1, 4])
    assert split.clients == {0, 1} and split.servers == {2, 3, 4}
    assert split.describe() == "clients on CPUs 0,1, servers on CPUs 2,3,4"
    with pytest.raises(ValueError, match="needs at least 2 CPUs; this process may use 1"):
        Placement.of("split", [7])
    with pytest.raises(ValueError, match="unknown placement 'diagonal'"):
        Placement.of("diagonal")


def test_split_on_one_cpu_is_refused_before_anything_starts() -> None:
    cpu = min(os.sched_getaffinity(0))
    out = subprocess.run(
        [sys.executable, "-m", "strata.bench", "--bin-dir", "/nonexistent", "--placement", "split", "--json"],
        capture_output=True, text=True, timeout=60, preexec_fn=lambda: os.sched_setaffinity(0, {cpu}),
    )
    assert out.returncode == 2, out.stderr
    assert "--placement split needs at least 2 CPUs; this process may use 1" in out.stderr
    assert out.stdout == ""


def _two_cpus() -> tuple:
    cpus = sorted(os.sched_getaffinity(0))
    assert len(cpus) >= 2, f"these tests need 2 CPUs; this process may use {cpus}"
    return cpus[0], cpus[-1]


def test_servers_are_spawned_on_their_cpus_and_the_caller_keeps_its_own() -> None:
    from strata.bench.cluster import Procs

    client, server = _two_cpus()
    mine = os.sched_getaffinity(0)
    placed, free = Procs({server}), Procs()
    try:
        p = placed.spawn(["sleep", "60"], "placed")
        q = free.spawn(["sleep", "60"], "free")
        assert os.sched_getaffinity(p.pid) == {server}
        # Without CPUs a process runs where its parent may.
        assert os.sched_getaffinity(q.pid) == mine
        assert os.sched_getaffinity(0) == mine
    finally:
        placed.stop()
        free.stop()


def test_pinning_this_process_moves_every_thread_and_the_threads_made_later() -> None:
    client, server = _two_cpus()
    code = textwrap.dedent(f"""
        import json, os, threading
        from strata.bench.cluster import Placement
        stop = threading.Event()
        early = threading.Thread(target=stop.wait)
        early.start()
        Placement(frozenset({{{client}}}), frozenset({{{server}}})).pin_this_process()
        late = []
        t = threading.Thread(target=lambda: late.append(os.sched_getaffinity(0)))
        t.start(); t.join()
        tids = os.listdir("/proc/self/task")
        per_thread = [sorted(os.sched_getaffinity(int(tid))) for tid in tids]
        print(json.dumps({{"threads": per_thread, "late": sorted(late[0])}}))
        stop.set(); early.join()
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    # The main thread and the one started before, at least.
    assert len(got["threads"]) >= 2, got
    assert all(t == [client] for t in got["threads"]), got
    assert got["late"] == [client], got


class _Fake:
    """A store whose calls answer what the test sets, for the drivers'
    prepared calls (no cluster)."""

    def __init__(self, answer) -> None:
        self.answer = answer
        self.calls = []

    def __getattr__(self, name):
        def call(*args):
            self.calls.append((name, args))
            if isinstance(self.answer, BaseException):
                raise self.answer
            return self.answer
        return call


def test_prepared_calls_pass_on_success_and_raise_on_any_failure() -> None:
    import numpy as np
    import pytest
    from strata.bench.__main__ import Mooncake, Native, Parts

    bufs = [np.zeros(8, dtype=np.uint8), np.ones(8, dtype=np.uint8)]
    keys = ["a", "b"]
    # The Mooncake API's codes: 0 / bytes read pass, a negative code raises.
    for op, good, bad in (("put", [0, 0], [0, -704]), ("get", [8, 8], [8, -704])):
        s = _Fake(good)
        Mooncake("m", s).prepare(op, keys, bufs)()
        name, args = s.calls[0]
        assert name == ("batch_put_from" if op == "put" else "batch_get_into")
        assert args == (keys, [b.ctypes.data for b in bufs], [8, 8])
        with pytest.raises(RuntimeError, match="-704"):
            Mooncake("m", _Fake(bad)).prepare(op, keys, bufs)()
        single = _Fake(good[0])
        Mooncake("m", single).prepare(op, keys[:1], bufs[:1])()
        assert single.calls == [("put_from" if op == "put" else "get_into", ("a", bufs[0].ctypes.data, 8))]
        with pytest.raises(RuntimeError, match="-704"):
            Mooncake("m", _Fake(bad[1])).prepare(op, keys[:1], bufs[:1])()
    # The native API's batches: None / an int per object pass; an
    # exception in the list is raised.
    err = KeyError("b")
    for op, good in (("put", [None, None]), ("get", [8, 8])):
        for driver in (Native(_Fake(good)), Parts(_Fake(good), 2)):
            driver.prepare(op, keys, bufs)()
        for driver in (Native(_Fake([good[0], err])), Parts(_Fake([good[0], err]), 2)):
            with pytest.raises(KeyError):
                driver.prepare(op, keys, bufs)()
    # Single native calls raise what the store raises.
    with pytest.raises(KeyError):
        Native(_Fake(err)).prepare("get", keys[:1], bufs[:1])()
    parts = _Fake(None)
    Parts(parts, 2).prepare("put", keys[:1], bufs[:1])()
    name, (key, views) = parts.calls[0]
    assert (name, key, [v.nbytes for v in views]) == ("put_parts", "a", [4, 4])
