"""``strata.sglang.StrataStorage`` driven by SGLang 0.5.23's own classes: its
backend factory (``--hicache-storage-backend dynamic``), its host KV pools
in every layout it offers for MHA and MLA models, its page hashes, and its
``HiCacheController`` running its own backup and prefetch threads."""

from __future__ import annotations

import random
import socket
import time
from typing import Any, Callable, List

import pytest
import torch
from pools import PAGE, backend_extra, fill_random, hashes, host_pool, page_bytes

import strata
from strata.sglang import StrataStorage

LAYOUTS = [
    ("layer_first", False),
    ("page_first", False),
    ("page_first_direct", False),
    ("page_head", False),
    ("layer_first", True),
    ("page_first", True),
    ("page_first_direct", True),
]


def tokens(pages: int, seed: int) -> List[int]:
    rng = random.Random(seed)
    return [rng.randrange(2, 32000) for _ in range(pages * PAGE)]


def unique_seed() -> int:
    return random.SystemRandom().randrange(1 << 30)


@pytest.mark.parametrize("layout,mla", LAYOUTS)
def test_pages_round_trip_between_two_servers_in_every_layout(
    make_backend: Callable[..., Any], store: strata.Store, layout: str, mla: bool
) -> None:
    src = host_pool(layout, mla)
    writer = make_backend(src)
    assert isinstance(writer, StrataStorage)
    keys = hashes(tokens(5, unique_seed()))
    assert len(keys) == 5
    idx = src.alloc(5 * PAGE)
    assert writer.batch_exists(keys) == 0
    assert writer.batch_set_v1(keys, idx) == [True] * 5
    assert writer.batch_exists(keys) == 5
    # One object per page, holding the page's K and V of every layer.
    objs = [o for o in store.list(writer.key_prefix, 1000) if o["key"][len(writer.key_prefix):] in keys]
    assert len(objs) == 5
    assert {o["size"] for o in objs} == {src.get_size_per_token() * PAGE}
    # Another server: its own pool, other bytes, other slots.
    dst = host_pool(layout, mla)
    fill_random(dst, seed=99)
    dst.alloc(3 * PAGE)
    didx = dst.alloc(5 * PAGE)
    assert not torch.equal(page_bytes(dst, didx, 0), page_bytes(src, idx, 0))
    reader = make_backend(dst)
    assert reader.key_prefix == writer.key_prefix
    assert reader.batch_get_v1(keys, didx) == [True] * 5
    for p in range(5):
        assert torch.equal(page_bytes(dst, didx, p), page_bytes(src, idx, p)), f"page {p}"
    assert writer.totals()["saved"] == 5
    assert reader.totals()["loaded"] == 5
    # Writing a stored page again is a success (equal keys, equal bytes).
    assert writer.batch_set_v1(keys[:2], idx[: 2 * PAGE]) == [True, True]


def test_prefix_length_stops_at_the_first_missing_page(make_backend: Callable[..., Any]) -> None:
    pool = host_pool()
    b = make_backend(pool)
    keys = hashes(tokens(6, unique_seed()))
    idx = pool.alloc(6 * PAGE)
    assert b.batch_set_v1(keys[:3], idx[: 3 * PAGE]) == [True] * 3
    assert b.batch_set_v1(keys[4:5], idx[4 * PAGE : 5 * PAGE]) == [True]
    assert b.batch_exists(keys) == 3
    assert b.batch_exists(keys[4:]) == 1
    assert b.batch_exists(keys[3:]) == 0
    assert b.batch_exists([]) == 0
    assert b.exists(keys[0]) and b.exists(keys[4])
    assert not b.exists(keys[3])
    t = b.totals()
    assert t["lookups"] == 6 + 2 + 3 + 0 + 1 + 1 + 1
    assert t["hits"] == 3 + 1 + 0 + 1 + 1 + 0


def test_a_missing_or_wrong_size_page_is_never_handed_over(
    make_backend: Callable[..., Any], store: strata.Store
) -> None:
    src = host_pool()
    b = make_backend(src)
    keys = hashes(tokens(4, unique_seed()))
    idx = src.alloc(4 * PAGE)
    assert b.batch_set_v1(keys, idx) == [True] * 4
    store.remove(b.key_prefix + keys[2], force=True)
    store.put(b.key_prefix + keys[1], b"short", overwrite=True)
    dst = host_pool()
    fill_random(dst, seed=7)
    reader = make_backend(dst)
    didx = dst.alloc(4 * PAGE)
    before = [page_bytes(dst, didx, p) for p in range(4)]
    assert reader.batch_get_v1(keys, didx) == [True, False, False, True]
    assert torch.equal(page_bytes(dst, didx, 0), page_bytes(src, idx, 0))
    assert torch.equal(page_bytes(dst, didx, 3), page_bytes(src, idx, 3))
    # The pages that failed hold what they held: no partial write.
    assert torch.equal(page_bytes(dst, didx, 1), before[1])
    assert torch.equal(page_bytes(dst, didx, 2), before[2])
    t = reader.totals()
    assert (t["loaded"], t["load_failures"]) == (2, 2)


def test_keys_never_cross_models_dtypes_layouts_or_ranks(
    make_backend: Callable[..., Any], cluster: Any
) -> None:
    pool = host_pool("page_first")
    writer = make_backend(pool, tp_rank=0, tp_size=2)
    keys = hashes(tokens(3, unique_seed()))
    assert writer.batch_set_v1(keys, pool.alloc(3 * PAGE)) == [True] * 3
    assert writer.batch_exists(keys) == 3
    others = {
        "model": make_backend(host_pool("page_first"), tp_rank=0, tp_size=2, model_name="other-llama"),
        "dtype": make_backend(host_pool("page_first", dtype=torch.bfloat16), tp_rank=0, tp_size=2),
        "layout": make_backend(host_pool("page_first_direct"), tp_rank=0, tp_size=2),
        "heads": make_backend(host_pool("page_first", heads=4), tp_rank=0, tp_size=2),
        "tp rank": make_backend(host_pool("page_first"), tp_rank=1, tp_size=2),
        "tp size": make_backend(host_pool("page_first"), tp_rank=0, tp_size=1),
        "pp rank": make_backend(host_pool("page_first"), tp_rank=0, tp_size=2, pp_rank=1, pp_size=2),
        "tenant": make_backend(host_pool("page_first"), backend_extra(cluster, namespace="tenant-b"), tp_rank=0, tp_size=2),
    }
    assert len({b.key_prefix for b in others.values()} | {writer.key_prefix}) == len(others) + 1
    for what, b in others.items():
        assert b.batch_exists(keys) == 0, what
    # MLA: every TP rank holds the whole KV, so the ranks share the pages.
    mla = host_pool("page_first", mla=True)
    rank0 = make_backend(mla, tp_rank=0, tp_size=2)
    rank1 = make_backend(host_pool("page_first", mla=True), tp_rank=1, tp_size=2)
    assert rank0.batch_set_v1(keys, mla.alloc(3 * PAGE)) == [True] * 3
    assert rank1.key_prefix == rank0.key_prefix != writer.key_prefix
    assert rank1.batch_exists(keys) == 3


def test_clear_removes_only_this_deployments_pages(
    make_backend: Callable[..., Any], cluster: Any, store: strata.Store
) -> None:
    keys = hashes(tokens(2, unique_seed()))
    mine = make_backend(host_pool(), model_name="model-a")
    kept = [
        make_backend(host_pool(), model_name="model-b"),
        make_backend(host_pool(), backend_extra(cluster, namespace="tenant-b"), model_name="model-a"),
        make_backend(host_pool(), model_name="model-a", tp_rank=1, tp_size=2),
    ]
    for b in [mine, *kept]:
        assert b.batch_set_v1(keys, b.mem_pool_host.alloc(2 * PAGE)) == [True, True]
    mine.clear()
    assert mine.batch_exists(keys) == 0
    assert store.list(mine.key_prefix, 10) == []
    for b in kept:
        assert b.batch_exists(keys) == 2
        assert len(store.list(b.key_prefix, 10)) == 2


def test_strata_down_degrades_to_misses_without_failing(make_backend: Callable[..., Any], cluster: Any) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"  # nothing listens once closed
    pool = host_pool()
    t0 = time.monotonic()
    b = make_backend(pool, backend_extra(cluster, master=dead, timeout=1, retry_after=60))
    keys = hashes(tokens(3, unique_seed()))
    idx = pool.alloc(3 * PAGE)
    before = [page_bytes(pool, idx, p) for p in range(3)]
    for _ in range(5):
        assert b.batch_exists(keys) == 0
        assert b.batch_set_v1(keys, idx) == [False] * 3
        assert b.batch_get_v1(keys, idx) == [False] * 3
    b.clear()  # logs, never raises
    # One failed connect, then skipped for retry_after: no call waits.
    assert time.monotonic() - t0 < 10
    for p in range(3):
        assert torch.equal(page_bytes(pool, idx, p), before[p])
    t = b.totals()
    assert t["unavailable"] == 15
    assert (t["loaded"], t["saved"], t["hits"]) == (0, 0, 0)


def test_host_indices_outside_the_pool_are_refused(make_backend: Callable[..., Any]) -> None:
    pool = host_pool("page_first")
    b = make_backend(pool)
    keys = hashes(tokens(2, unique_seed()))
    inside = pool.alloc(2 * PAGE)
    # The last page runs past the end of the pool's buffer.
    beyond = torch.arange(pool.size - PAGE, pool.size + PAGE, dtype=torch.int64)
    assert b.batch_set_v1(keys, beyond) == [False, False]
    assert b.batch_exists(keys) == 0
    assert b.batch_get_v1(keys, beyond) == [False, False]
    # Indices that do not cover the pages: refused too.
    assert b.batch_set_v1(keys, inside[:PAGE]) == [False, False]
    assert b.batch_set_v1(keys, inside) == [True, True]
    assert b.totals()["save_failures"] == 4


def test_configuration_is_checked_at_start(make_backend: Callable[..., Any], cluster: Any) -> None:
    extra = backend_extra(cluster)
    del extra["interface_v1"]
    with pytest.raises(ValueError, match="interface_v1"):
        make_backend(host_pool(), extra)
    with pytest.raises(ValueError, match="replicas"):
        make_backend(host_pool(), backend_extra(cluster, replicas=0))
    with pytest.raises(ValueError, match="timeout"):
        make_backend(host_pool(), backend_extra(cluster, timeout="soon"))
    b = make_backend(host_pool())
    with pytest.raises(NotImplementedError, match="side pools"):
        b.register_mem_host_pool_v2(host_pool(), "mamba")


def test_storage_metrics_are_reported_when_sglang_asks(make_backend: Callable[..., Any]) -> None:
    pool = host_pool()
    quiet = make_backend(pool)
    assert quiet.get_stats() is None
    b = make_backend(pool, enable_storage_metrics=True)
    keys = hashes(tokens(3, unique_seed()))
    idx = pool.alloc(3 * PAGE)
    assert b.batch_set_v1(keys, idx) == [True] * 3
    assert b.batch_get_v1(keys, idx) == [True] * 3
    m = b.get_stats()
    assert m.backup_pgs == [3] and m.prefetch_pgs == [3]
    assert len(m.backup_bandwidth) == 1 and m.backup_bandwidth[0] > 0
    assert len(m.prefetch_bandwidth) == 1 and m.prefetch_bandwidth[0] > 0
    again = b.get_stats()
    assert again.backup_pgs == [] and again.prefetch_pgs == []


def test_sglang_cache_controller_backs_up_and_prefetches_through_strata(
    make_controller: Callable[..., Any],
) -> None:
    """SGLang's HiCacheController with its own storage threads: a backup on
    one server, then a prefetch on a fresh one (the scheduler's part of the
    hand-off played as SGLang's radix cache plays it)."""
    stored = tokens(6, unique_seed())
    w = make_controller("page_first")
    assert isinstance(w.storage_backend, StrataStorage)
    src_idx = w.mem_pool_host.alloc(len(stored))
    w.write_storage(src_idx, stored, hash_value=hashes(stored))
    op = w.ack_backup_queue.get(timeout=60)
    assert op.completed_tokens == len(stored)

    r = make_controller("page_first")
    asked = stored + tokens(2, unique_seed())  # two more pages nobody stored
    r.prefetch("req-1", asked)
    hit = r.prefetch_hit_queue.get(timeout=60)
    assert hit.storage_hit_count == len(stored)
    assert len(hit.hash_value) == 6
    hit.host_indices = r.alloc_prefetch_host_buffers(hit, hit.storage_hit_count)
    r.prefetch_buffer.put(hit)
    done = 0
    for _ in range(16):
        ack = r.ack_prefetch_queue.get(timeout=60)
        done += ack.completed_tokens or 0
        if ack.completed_req:
            break
    else:
        raise AssertionError("no completing PrefetchAck")
    assert done == len(stored)
    for p in range(6):
        assert torch.equal(page_bytes(r.mem_pool_host, hit.host_indices, p), page_bytes(w.mem_pool_host, src_idx, p))
    t = r.storage_backend.totals()
    assert (t["hits"], t["loaded"], t["load_failures"]) == (6, 6, 0)


def test_a_refused_call_fails_alone_and_does_not_switch_strata_off(make_backend: Callable[..., Any]) -> None:
    """A call Strata refuses (not retryable: here two pages read into one
    slot, overlapping buffers) fails by itself; only an outage makes the
    backend stop asking."""
    pool = host_pool()
    b = make_backend(pool)
    keys = hashes(tokens(2, unique_seed()))
    idx = pool.alloc(2 * PAGE)
    assert b.batch_set_v1(keys, idx) == [True, True]
    same_slot = torch.cat([idx[:PAGE], idx[:PAGE]])
    assert b.batch_get_v1(keys, same_slot) == [False, False]
    assert b.batch_get_v1(keys, idx) == [True, True]
    t = b.totals()
    assert (t["unavailable"], t["load_failures"], t["loaded"]) == (0, 2, 2)
