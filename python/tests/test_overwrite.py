"""``put(..., overwrite=True)`` against a real cluster: readers racing an
overwriter see one whole version or another, never a mix; the replaced
versions' space is freed once their readers' leases end."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import List, Set

import pytest

import strata
from conftest import Cluster, master_metric, wait_until


def size_of(v: int) -> int:
    # Sizes differ between versions, so a mix of one version's size with
    # another's bytes shows too.
    return 64 * 1024 + v * 512


def version(v: int) -> bytes:
    return bytes([v]) * size_of(v)


def test_readers_racing_an_overwriter_never_see_a_mix(cluster: Cluster, store: strata.Store, prefix: str) -> None:
    k = prefix + "hot"
    store.put(k, version(1))
    before = master_metric(cluster, "strata_master_overwrites_total")
    # Each reader its own client (its own location cache), and the writer's.
    own = [strata.Store.connect(cluster.master, token_file=cluster.client_token) for _ in range(2)]
    readers: List[strata.Store] = [*own, store]
    seen: List[Set[int]] = [set() for _ in readers]
    reads = [0] * len(readers)
    bad: List[str] = []
    stop = threading.Event()

    def read(i: int, s: strata.Store) -> None:
        while not stop.is_set() and not bad:
            d = s.get(k)
            v = d[0]
            if len(d) != size_of(v) or d.count(v) != len(d):
                bad.append(f"reader {i}: {len(d)} bytes starting with {v}, not one version")
                return
            seen[i].add(v)
            reads[i] += 1

    threads = [threading.Thread(target=read, args=(i, s)) for i, s in enumerate(readers)]
    for t in threads:
        t.start()
    last = 1
    deadline = time.monotonic() + 60
    try:
        # Until every reader has seen several versions (their caches expire
        # with the 2 s lease), bounded in time.
        while time.monotonic() < deadline and not bad and not all(len(x) >= 3 for x in seen):
            last = last % 250 + 1
            store.put(k, version(last), overwrite=True)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
        for s in own:
            s.close()
    assert not bad, bad
    assert all(not t.is_alive() for t in threads)
    assert all(len(x) >= 3 for x in seen), f"versions seen per reader: {seen}, reads {reads}"
    # The writer's own Store reads its last write at once; so does a new one.
    assert store.get(k) == version(last)
    with strata.Store.connect(cluster.master, token_file=cluster.client_token) as fresh:
        assert fresh.get(k) == version(last)
    assert master_metric(cluster, "strata_master_overwrites_total") > before
    # Replaced versions a reader was handed are freed once the leases end
    # (2 s here); one the SSD agent was copying, once its task's deadline
    # passed (--offload-task-ttl, 30 s by default).
    wait_until(lambda: master_metric(cluster, "strata_master_retired_bytes") == 0,
               timeout=60, what="replaced versions to be freed")


def test_plain_put_still_refuses_and_overwrite_of_absent_key_puts(store: strata.Store, prefix: str) -> None:
    k = prefix + "k"
    store.put(k, b"one")
    with pytest.raises(strata.AlreadyExists):
        store.put(k, b"two")
    assert store.get(k) == b"one"
    store.put(k, b"three!", overwrite=True)
    assert store.get(k) == b"three!"
    assert store.size(k) == 6
    fresh = prefix + "fresh"
    store.put(fresh, b"new", overwrite=True)
    assert store.get(fresh) == b"new"


def test_batch_and_parts_overwrite(store: strata.Store, prefix: str) -> None:
    keys = [prefix + f"b{i}" for i in range(4)]
    assert store.batch_put(keys[:2], [b"old0", b"old1"]) == [None, None]
    # Mixed: two present keys replaced, two absent ones put.
    assert store.batch_put(keys, [b"n0", b"n1", b"n2", b"n3"], overwrite=True) == [None] * 4
    assert store.batch_get(keys) == [b"n0", b"n1", b"n2", b"n3"]
    # Without overwrite, present keys are refused one by one.
    res = store.batch_put(keys[:2], [b"x", b"y"])
    assert len(res) == 2 and all(isinstance(r, strata.AlreadyExists) for r in res)
    store.put_parts(keys[0], [b"ab", bytearray(b"cd")], overwrite=True)
    assert store.get(keys[0]) == b"abcd"
    assert store.batch_put_from_parts(keys[:2], [[b"1", b"2"], [b"3"]], overwrite=True) == [None, None]
    assert store.batch_get(keys[:2]) == [b"12", b"3"]


def test_async_overwrite(cluster: Cluster, prefix: str) -> None:
    async def main() -> None:
        async with await strata.AsyncStore.connect(cluster.master, token_file=cluster.client_token) as s:
            k = prefix + "a"
            await s.put(k, b"before")
            with pytest.raises(strata.AlreadyExists):
                await s.put(k, b"again")
            await s.put(k, b"after", overwrite=True)
            assert await s.get(k) == b"after"

    asyncio.run(main())
