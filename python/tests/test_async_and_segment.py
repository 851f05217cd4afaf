"""strata.AsyncStore on asyncio, and the embedded segment (a store node in
the Python process)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time
from typing import Iterator

import numpy as np
import pytest

import strata
from conftest import Cluster, key_nodes, node_ids


@pytest.fixture
def keys(store: strata.Store, prefix: str) -> Iterator[str]:
    yield prefix
    store.remove_prefix(prefix, force=True)


async def test_async_round_trips(cluster: Cluster, keys: str) -> None:
    async with await strata.AsyncStore.connect(cluster.master, token_file=cluster.admin_token) as s:
        assert isinstance(s, strata.AsyncStore)
        data = bytes(range(256)) * 4096
        assert await s.put(keys + "a", data) is None
        assert await s.get(keys + "a") == data
        assert await s.exists(keys + "a") is True
        assert await s.size(keys + "a") == len(data)
        out = np.zeros(len(data), dtype=np.uint8)
        assert await s.get_into(keys + "a", out) == len(data)
        assert out.tobytes() == data
        res = await s.batch_put([keys + "b", keys + "c"], [b"b", b"c"])
        assert res == [None, None]
        assert await s.batch_get([keys + "b", keys + "x", keys + "c"]) == [b"b", None, b"c"]
        assert await s.batch_exists([keys + "b", keys + "x"]) == [True, False]
        with pytest.raises(strata.NotFound):
            await s.get(keys + "x")
        with pytest.raises(strata.AlreadyExists):
            await s.put(keys + "a", b"again")
        assert [o["key"] for o in await s.list(keys)] == [keys + "a", keys + "b", keys + "c"]
        assert await s.remove_prefix(keys, force=True) == 3
    assert s.closed


async def test_async_operations_run_concurrently_on_one_loop(cluster: Cluster, keys: str) -> None:
    s = await strata.AsyncStore.connect(cluster.master, token_file=cluster.admin_token)
    try:
        n = 64
        await asyncio.gather(*(s.put(f"{keys}{i}", f"v{i}".encode()) for i in range(n)))
        got = await asyncio.gather(*(s.get(f"{keys}{i}") for i in range(n)))
        assert len(got) == n
        assert got == [f"v{i}".encode() for i in range(n)]
        # The loop stays responsive while operations are in flight.
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        t = asyncio.ensure_future(tick())
        big = np.zeros(16 << 20, dtype=np.uint8)
        await s.put(keys + "big", big)
        assert await s.get_into(keys + "big", big) == big.nbytes
        t.cancel()
        assert ticks > 10
    finally:
        await s.close()


async def test_async_cancellation_leaves_the_store_usable(cluster: Cluster, keys: str) -> None:
    s = await strata.AsyncStore.connect(cluster.master, token_file=cluster.admin_token)
    try:
        data = np.ones(16 << 20, dtype=np.uint8)
        task = asyncio.ensure_future(s.put(keys + "c", data))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # Cancelled before or after it committed; either way the key is
        # whole or absent, and the store goes on.
        if await s.exists(keys + "c"):
            out = np.zeros_like(data)
            assert await s.get_into(keys + "c", out) == data.nbytes and (out == 1).all()
        await s.put(keys + "after", b"ok")
        assert await s.get(keys + "after") == b"ok"
    finally:
        await s.close()


async def test_async_connect_errors(cluster: Cluster, tmp_path) -> None:
    bad = tmp_path / "bad.token"
    bad.write_text("1" * 64)
    with pytest.raises(strata.PermissionDenied):
        await strata.AsyncStore.connect(cluster.master, token_file=bad, timeout=5)


def test_async_store_needs_a_running_loop(cluster: Cluster) -> None:
    conn = strata._native.connect(cluster.master, token_file=str(cluster.admin_token))
    s = strata.AsyncStore(conn)
    with pytest.raises(RuntimeError):
        s.get("k")


def test_embedded_segment(cluster: Cluster, store: strata.Store, keys: str) -> None:
    emb = strata.Store.connect(
        cluster.master,
        token_file=cluster.admin_token,
        segment_bytes=32 << 20,
        segment_token_file=cluster.member_token,
        node_id="py-embedded",
    )
    try:
        assert emb.node_id == "py-embedded"
        assert "py-embedded" in node_ids(store)
        data = bytes(range(256)) * 1024
        emb.put(keys + "local", data, preferred=emb.node_id)
        assert key_nodes(cluster, keys + "local") == ["py-embedded"]
        emb.put(keys + "elsewhere", data, preferred="node-a")
        assert key_nodes(cluster, keys + "elsewhere") == ["node-a"]
        # Another process reads the object from this process's memory.
        code = textwrap.dedent(
            f"""
            import strata, sys
            with strata.Store.connect({cluster.master!r}, token_file={str(cluster.client_token)!r}) as s:
                sys.stdout.write(s.get({keys + "local"!r}).hex())
            """
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert bytes.fromhex(out.stdout) == data
    finally:
        t0 = time.monotonic()
        emb.close()
        closed_in = time.monotonic() - t0
    # It left at once (not after the master's --node-ttl of 10 s).
    assert closed_in < 5
    assert "py-embedded" not in node_ids(store)
    # Its object is cleanly gone; the one placed elsewhere survives.
    assert store.exists(keys + "local") is False
    with pytest.raises(strata.NotFound):
        store.get(keys + "local")
    assert store.get(keys + "elsewhere") == data


def test_embedded_segment_needs_the_member_token(cluster: Cluster) -> None:
    t0 = time.monotonic()
    with pytest.raises(strata.StrataError) as e:
        strata.Store.connect(
            cluster.master,
            token_file=cluster.client_token,
            segment_bytes=8 << 20,
            node_id="py-no-member",
            timeout=3,
        )
    assert "member" in str(e.value)
    assert time.monotonic() - t0 < 15
    with strata.Store.connect(cluster.master, token_file=cluster.admin_token) as s:
        assert "py-no-member" not in node_ids(s)


@pytest.mark.parametrize("master", ["10.0.0.1:7400", "127.0.0.1:7400,master-2:7400", "etcd://etcd.svc:2379/prod"])
def test_embedded_segment_on_loopback_needs_a_loopback_master(master: str) -> None:
    """A segment listening on 127.0.0.1 (the default) would be unreachable
    from the other hosts of a remote master: refused before any call."""
    t0 = time.monotonic()
    with pytest.raises(strata.InvalidArgument) as e:
        strata.Store.connect(master, segment_bytes=1 << 20, timeout=30)
    assert "segment_listen" in str(e.value)
    assert time.monotonic() - t0 < 5

