"""Blocking calls drive their own I/O on the calling thread (a
single-threaded runtime and a sibling client per thread, see
crates/python/src/thread_io.rs): what it holds ends with the thread or the
store, and the threads of one store still see each other's writes."""

from __future__ import annotations

import os
import threading
from typing import Any, List

import pytest
from conftest import wait_until

import strata


def sockets() -> int:
    """Sockets this process holds."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                n += 1
        except OSError:
            pass  # closed meanwhile
    return n


def test_each_thread_drives_its_own_io_and_releases_it_when_it_exits(cluster: Any, prefix: str) -> None:
    s = strata.Store.connect(cluster.master, token_file=cluster.client_token)
    key, data = prefix + "k", os.urandom(4096)
    s.put(key, data)
    assert s._io_threads() == 1  # this thread's
    baseline = sockets()
    seen: List[int] = []
    errors: List[BaseException] = []
    start = threading.Barrier(8)

    def work() -> None:
        try:
            start.wait(timeout=30)
            for _ in range(3):
                assert s.get(key) == data
            seen.append(s._io_threads())
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert len(seen) == 8
    assert max(seen) >= 2
    # Each exited thread's runtime, client and sockets are gone.
    wait_until(lambda: s._io_threads() == 1, what="the exited threads' I/O to be released")
    wait_until(lambda: sockets() <= baseline, what=f"sockets back to {baseline} (now {sockets()})")
    s.close()
    assert s._io_threads() == 0


def test_the_shared_runtime_serves_blocking_calls_when_thread_io_is_off(
    cluster: Any, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STRATA_THREAD_IO", "0")
    with strata.Store.connect(cluster.master, token_file=cluster.client_token) as s:
        s.put(prefix + "k", b"v")
        assert s.get(prefix + "k") == b"v"
        assert s._io_threads() == 0


def test_an_overwrite_on_one_thread_is_read_by_another(cluster: Any, prefix: str) -> None:
    """The threads' clients share one location cache: an overwrite forgets
    the old version's location for every thread of the store."""
    s = strata.Store.connect(cluster.master, token_file=cluster.client_token)
    key = prefix + "k"
    s.put(key, b"old" * 1000)
    read_old = threading.Event()
    overwritten = threading.Event()
    got: List[bytes] = []
    errors: List[BaseException] = []

    def reader() -> None:
        try:
            got.append(s.get(key))  # its location is now cached
            read_old.set()
            assert overwritten.wait(timeout=30)
            got.append(s.get(key))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
            read_old.set()

    t = threading.Thread(target=reader)
    t.start()
    assert read_old.wait(timeout=30)
    s.put(key, b"new" * 1000, overwrite=True)
    overwritten.set()
    t.join(timeout=60)
    assert not errors, errors
    assert got == [b"old" * 1000, b"new" * 1000]
    s.close()
