"""strata.Store against a real cluster: round trips of every buffer kind,
zero-copy reads, scatter-gather, batches, every exception, threads."""

from __future__ import annotations

import ctypes
import os
import select
import signal
import sys
import threading
import time
import tracemalloc
from typing import Iterator, List

import numpy as np
import pytest

import strata
from conftest import Cluster, free_port, key_nodes

SIZES = [1, 4096, 65536 + 3, 1 << 20, 16 << 20]


@pytest.fixture
def keys(store: strata.Store, prefix: str) -> Iterator[str]:
    """This test's key prefix; its keys are removed afterwards (the cluster
    is shared, and left-over objects would push others out)."""
    yield prefix
    store.remove_prefix(prefix, force=True)


def payload(n: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed + n).integers(0, 256, n, dtype=np.uint8).tobytes()


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("kind", ["bytes", "bytearray", "memoryview", "numpy"])
def test_round_trip(store: strata.Store, keys: str, size: int, kind: str) -> None:
    data = payload(size)
    src = {
        "bytes": lambda: data,
        "bytearray": lambda: bytearray(data),
        "memoryview": lambda: memoryview(bytearray(data)),
        "numpy": lambda: np.frombuffer(data, dtype=np.uint8).copy(),
    }[kind]()
    key = f"{keys}{kind}-{size}"
    assert store.put(key, src) is None
    got = store.get(key)
    assert type(got) is bytes
    assert len(got) == size
    assert got == data
    assert store.size(key) == size
    assert store.exists(key) is True


def test_numpy_of_other_dtypes_and_shapes(store: strata.Store, keys: str) -> None:
    a = np.arange(3 * 5 * 7, dtype=np.float32).reshape(3, 5, 7)
    store.put(keys + "f32", a)
    out = np.zeros_like(a)
    assert store.get_into(keys + "f32", out) == a.nbytes
    assert np.array_equal(out, a)


def test_get_into_fills_the_arrays_own_memory(store: strata.Store, keys: str) -> None:
    data = payload(16 << 20, seed=1)
    store.put(keys + "big", data)
    arr = np.zeros(len(data) + 100, dtype=np.uint8)
    before = arr.ctypes.data
    tracemalloc.start()
    try:
        n = store.get_into(keys + "big", arr)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert n == len(data)
    # The array itself was written, in place.
    assert arr.ctypes.data == before
    assert arr[:n].tobytes() == data
    assert not arr[n:].any()
    # No Python object of the object's size was made on the way.
    assert peak < 1 << 20, f"{peak} bytes of Python memory allocated during get_into"


def test_get_into_an_address_size_pair(store: strata.Store, keys: str) -> None:
    data = payload(1 << 20, seed=2)
    store.put(keys + "raw", data)
    region = (ctypes.c_ubyte * len(data))()
    addr = ctypes.addressof(region)
    assert store.get_into(keys + "raw", (addr, len(data))) == len(data)
    assert bytes(region) == data
    # And a put from registered memory.
    assert store.put(keys + "raw2", (addr, len(data))) is None
    assert store.get(keys + "raw2") == data


def test_get_allocates_the_result_once(store: strata.Store, keys: str) -> None:
    data = payload(8 << 20, seed=3)
    store.put(keys + "once", data)
    tracemalloc.start()
    try:
        got = store.get(keys + "once")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got == data
    # The returned bytes, and no second copy of it.
    assert peak < len(data) + (1 << 20), peak


def test_batch_get_allocates_each_result_once(store: strata.Store, keys: str) -> None:
    datas = [payload(2 << 20, seed=10 + i) for i in range(4)]
    ks = [f"{keys}bg{i}" for i in range(4)]
    assert store.batch_put(ks, datas) == [None] * 4
    tracemalloc.start()
    try:
        got = store.batch_get(ks + [keys + "none"])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got == datas + [None]
    # Python memory: the four returned bytes objects, no second bytes of any.
    assert peak < sum(map(len, datas)) + (1 << 20), peak


def test_scatter_gather_parts_of_different_sizes(store: strata.Store, keys: str) -> None:
    sizes = [1, 4096, 300, 65536, 7]
    parts = [payload(n, seed=i) for i, n in enumerate(sizes)]
    store.put_parts(keys + "sg", [bytearray(p) for p in parts])
    assert store.get(keys + "sg") == b"".join(parts)
    outs = [np.zeros(n, dtype=np.uint8) for n in sizes]
    assert store.get_into_parts(keys + "sg", outs) == sum(sizes)
    assert len(outs) == len(parts)
    for o, p in zip(outs, parts):
        assert o.tobytes() == p
    # Parts that do not add up to the object: an error, parts untouched.
    short = [np.full(n, 7, dtype=np.uint8) for n in sizes[:-1]]
    with pytest.raises(strata.InvalidArgument):
        store.get_into_parts(keys + "sg", short)
    assert all((s == 7).all() for s in short)


def test_batch_scatter_gather(store: strata.Store, keys: str) -> None:
    ks = [f"{keys}b{i}" for i in range(8)]
    parts = [[payload(100 * (i + 1), seed=j) for j in range(3)] for i in range(8)]
    res = store.batch_put_from_parts(ks, parts)
    assert res == [None] * 8
    outs = [[np.zeros(len(p), dtype=np.uint8) for p in ps] for ps in parts]
    sizes = store.batch_get_into_parts(ks + [keys + "missing"], outs + [[np.zeros(4, dtype=np.uint8)]])
    assert len(sizes) == 9
    assert sizes[:8] == [sum(len(p) for p in ps) for ps in parts]
    assert isinstance(sizes[8], strata.NotFound)
    for o, ps in zip(outs, parts):
        assert [x.tobytes() for x in o] == ps


def test_batches_with_hits_and_misses(store: strata.Store, keys: str) -> None:
    present = [f"{keys}p{i}" for i in range(5)]
    datas = [payload(1000 + i, seed=i) for i in range(5)]
    assert store.batch_put(present, datas) == [None] * 5
    mixed = [present[0], keys + "m0", present[1], keys + "m1", present[4]]
    assert store.batch_exists(mixed) == [True, False, True, False, True]
    assert store.batch_size(mixed) == [1000, None, 1001, None, 1004]
    got = store.batch_get(mixed)
    assert len(got) == 5
    assert got == [datas[0], None, datas[1], None, datas[4]]
    bufs = [bytearray(2000) for _ in mixed]
    sizes = store.batch_get_into(mixed, bufs)
    assert len(sizes) == 5
    assert sizes[0] == 1000 and sizes[2] == 1001 and sizes[4] == 1004
    assert isinstance(sizes[1], strata.NotFound) and isinstance(sizes[3], strata.NotFound)
    assert bytes(bufs[0][:1000]) == datas[0]
    # A second put of a present key fails for that key alone.
    res = store.batch_put([present[0], keys + "new"], [b"x", b"y"])
    assert isinstance(res[0], strata.AlreadyExists) and res[1] is None
    rm = store.batch_remove([present[2], keys + "m0"])
    assert rm[0] is None and isinstance(rm[1], strata.NotFound)
    assert store.exists(present[2]) is False


def test_list_and_remove_prefix(store: strata.Store, keys: str) -> None:
    for i in range(5):
        store.put(f"{keys}l/{i}", b"v" * (i + 1))
    store.put(f"{keys}other", b"o")
    listed = store.list(keys + "l/")
    assert [o["key"] for o in listed] == [f"{keys}l/{i}" for i in range(5)]
    assert [o["size"] for o in listed] == [1, 2, 3, 4, 5]
    assert len(store.list(keys + "l/", limit=2)) == 2
    assert store.remove_prefix(keys + "l/") == 5
    assert store.list(keys + "l/") == []
    assert store.exists(f"{keys}other")
    with pytest.raises(strata.InvalidArgument):
        store.remove_prefix("")


def test_missing_key(store: strata.Store, keys: str) -> None:
    k = keys + "absent"
    for call in (lambda: store.get(k), lambda: store.size(k), lambda: store.remove(k),
                 lambda: store.get_into(k, bytearray(10))):
        with pytest.raises(strata.NotFound) as e:
            call()
        assert e.value.code == "not_found"
        assert e.value.retryable is False
        assert isinstance(e.value, strata.StrataError)
    assert store.exists(k) is False


def test_put_of_an_existing_key(store: strata.Store, keys: str) -> None:
    store.put(keys + "dup", b"first")
    with pytest.raises(strata.AlreadyExists):
        store.put(keys + "dup", b"second")
    assert store.get(keys + "dup") == b"first"


def test_wrong_buffers(store: strata.Store, keys: str) -> None:
    store.put(keys + "x", payload(1000))
    short = bytearray(b"\x07" * 999)
    with pytest.raises(strata.InvalidArgument) as e:
        store.get_into(keys + "x", short)
    assert "smaller" in str(e.value)
    assert short == bytearray(b"\x07" * 999)
    with pytest.raises(strata.InvalidArgument) as e:
        store.get_into(keys + "x", b"\x00" * 2000)
    assert "read-only" in str(e.value)
    # The refused view was given back: nothing holds the memoryview's buffer.
    ro = memoryview(b"\x00" * 2000)
    with pytest.raises(strata.InvalidArgument):
        store.get_into(keys + "x", ro)
    ro.release()
    # One buffer for two keys, or overlapping parts: refused, none written.
    shared = bytearray(b"\x05" * 2000)
    with pytest.raises(strata.InvalidArgument) as e:
        store.batch_get_into([keys + "x", keys + "x"], [shared, memoryview(shared)[10:]])
    assert "overlap" in str(e.value)
    assert shared == bytearray(b"\x05" * 2000)
    # A single part larger than the object: refused before it is written.
    big = bytearray(b"\x06" * 1005)
    with pytest.raises(strata.InvalidArgument):
        store.get_into_parts(keys + "x", [big])
    assert big == bytearray(b"\x06" * 1005)
    with pytest.raises(strata.InvalidArgument):
        store.get_into(keys + "x", memoryview(bytearray(4000))[::2])
    with pytest.raises(TypeError):
        store.put(keys + "y", 12345)
    with pytest.raises(strata.InvalidArgument):
        store.put(keys + "y", (0, 10))
    with pytest.raises(strata.InvalidArgument):
        store.batch_put([keys + "a", keys + "b"], [b"1"])
    with pytest.raises(strata.InvalidArgument):
        store.put(keys + "y", b"1", replicas=0)
    # Nothing of the refused calls was stored.
    assert store.batch_exists([keys + "y", keys + "a"]) == [False, False]


def test_unreachable_master() -> None:
    t0 = time.monotonic()
    with pytest.raises(strata.Unavailable) as e:
        strata.Store.connect(f"127.0.0.1:{free_port()}", timeout=1.5)
    assert e.value.retryable
    assert time.monotonic() - t0 < 10


def test_wrong_token(cluster: Cluster, tmp_path) -> None:
    bad = tmp_path / "bad.token"
    bad.write_text("0" * 64)
    with pytest.raises(strata.PermissionDenied):
        strata.Store.connect(cluster.master, token_file=bad, timeout=5)
    with pytest.raises(strata.PermissionDenied):
        strata.Store.connect(cluster.master, timeout=5)
    missing = tmp_path / "nope.token"
    with pytest.raises(strata.InvalidArgument) as e:
        strata.Store.connect(cluster.master, token_file=missing, timeout=5)
    assert "nope.token" in str(e.value)


def test_client_token_may_not_force(cluster: Cluster, store: strata.Store, keys: str) -> None:
    store.put(keys + "f", b"1")
    with strata.Store.connect(cluster.master, token_file=cluster.client_token) as c:
        assert c.get(keys + "f") == b"1"
        with pytest.raises(strata.PermissionDenied):
            c.remove(keys + "f", force=True)
        with pytest.raises(strata.PermissionDenied):
            c.remove_all()
    assert store.exists(keys + "f")


def test_environment_names_master_and_token(cluster: Cluster, store: strata.Store, keys: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    store.put(keys + "env", b"e")
    monkeypatch.setenv("STRATA_MASTER", cluster.master)
    monkeypatch.setenv("STRATA_TOKEN_FILE", str(cluster.client_token))
    with strata.Store.connect() as c:
        assert c.master == cluster.master
        assert c.get(keys + "env") == b"e"


def test_leased_remove(cluster: Cluster, store: strata.Store, keys: str) -> None:
    store.put(keys + "l", b"leased")
    # A reader whose leases run the master's TTL (as one that died would).
    with strata.Store.connect(cluster.master, token_file=cluster.admin_token, end_leases=False) as r:
        assert r.get(keys + "l") == b"leased"
    with pytest.raises(strata.Leased) as e:
        store.remove(keys + "l")
    assert e.value.code == "leased"
    store.remove(keys + "l", force=True)
    assert not store.exists(keys + "l")


def test_a_read_ends_its_lease(cluster: Cluster, store: strata.Store, keys: str) -> None:
    """Leases end with the read: once the reader closed (which sends what
    it has not sent yet), an unforced remove goes through at once, though
    the master's lease TTL (2 s) is far from over."""
    ks = [keys + f"e{i}" for i in range(4)]
    for k in ks:
        store.put(k, b"read")
    with strata.Store.connect(cluster.master, token_file=cluster.admin_token) as r:
        assert r.get(ks[0]) == b"read"
        assert r.batch_get(ks[1:]) == [b"read"] * 3
    for k in ks:
        store.remove(k)
    assert not any(store.batch_exists(ks))


def test_closed_store(cluster: Cluster) -> None:
    s = strata.Store.connect(cluster.master, token_file=cluster.client_token)
    assert not s.closed
    with s:
        pass
    assert s.closed
    with pytest.raises(strata.Cancelled):
        s.get("k")
    s.close()  # idempotent


def test_many_threads_on_one_store(store: strata.Store, keys: str) -> None:
    errors: List[BaseException] = []
    done = []

    def worker(t: int) -> None:
        try:
            for i in range(20):
                k = f"{keys}t{t}-{i}"
                d = payload(10_000 + i, seed=t)
                store.put(k, d)
                assert store.get(k) == d
                out = bytearray(len(d))
                assert store.get_into(k, out) == len(d) and out == d
            done.append(t)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert sorted(done) == list(range(8))
    assert len(store.list(keys, limit=1000)) == 160


def test_other_threads_run_during_a_large_get(store: strata.Store, keys: str) -> None:
    n, size = 6, 16 << 20
    ks = [f"{keys}g{i}" for i in range(n)]
    assert store.batch_put(ks, [payload(size, seed=i) for i in range(n)]) == [None] * n
    bufs = [np.empty(size, dtype=np.uint8) for _ in ks]
    stamps: List[float] = []
    stop = threading.Event()

    def ticker() -> None:
        while not stop.is_set():
            stamps.append(time.perf_counter())

    old = sys.getswitchinterval()
    sys.setswitchinterval(0.001)
    t = threading.Thread(target=ticker)
    t.start()
    try:
        time.sleep(0.01)
        t0 = time.perf_counter()
        sizes = store.batch_get_into(ks, bufs)
        t1 = time.perf_counter()
    finally:
        stop.set()
        t.join()
        sys.setswitchinterval(old)
    assert sizes == [size] * n
    took = t1 - t0
    assert took > 0.02, f"the read took {took:.4f}s: too fast to tell"
    # Held GIL: the ticker could run at most a switch interval after t0 and
    # around t1. Released: it ticks all through the middle of the call.
    lo, hi = t0 + 0.3 * took, t0 + 0.7 * took
    inside = [s for s in stamps if lo < s < hi]
    assert len(inside) > 10, f"{len(inside)} ticks in the middle {hi - lo:.4f}s of the get"


def test_replicas_land_on_distinct_nodes(cluster: Cluster, store: strata.Store, keys: str) -> None:
    store.put(keys + "r2", b"two", replicas=2)
    assert key_nodes(cluster, keys + "r2") == ["node-a", "node-b"]
    store.put(keys + "pa", b"a", preferred="node-a")
    store.put(keys + "pb", b"b", preferred="node-b")
    assert key_nodes(cluster, keys + "pa") == ["node-a"]
    assert key_nodes(cluster, keys + "pb") == ["node-b"]


def test_forked_child(cluster: Cluster, store: strata.Store, keys: str) -> None:
    store.put(keys + "fork", b"parent")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report through the pipe, never return
        code = 1
        try:
            try:
                store.get(keys + "fork")
                msg = "no error"
            except strata.StrataError as e:
                msg = str(e)
            ok_fork = "fork" in msg
            try:
                store.close()
                ok_fork = False  # the parent's store must not be closed from here
            except strata.StrataError as e:
                ok_fork = ok_fork and "fork" in str(e)
            with strata.Store.connect(cluster.master, token_file=cluster.admin_token) as s:
                ok_new = s.get(keys + "fork") == b"parent"
            os.write(w, f"{ok_fork} {ok_new} {msg}".encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    out = b""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([r], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(r, 4096) if ready else b""
        if not chunk:
            break
        out += chunk
    os.close(r)
    if time.monotonic() >= deadline:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, out
    assert out.startswith(b"True True"), out
    # The parent's store still works.
    assert store.get(keys + "fork") == b"parent"
