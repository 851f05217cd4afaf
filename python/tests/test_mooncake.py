"""The MooncakeDistributedStore drop-in: the seed system's names, keyword
names and return codes against a real Strata cluster, and the call patterns
of SGLang's and LMCache's connectors."""

from __future__ import annotations

import ctypes
import inspect
import re
from typing import Iterator, List

import numpy as np
import pytest

import strata
from strata.mooncake import MooncakeDistributedStore, ReplicateConfig
from conftest import Cluster, key_nodes


@pytest.fixture
def mc(cluster: Cluster, monkeypatch: pytest.MonkeyPatch, prefix: str) -> Iterator[MooncakeDistributedStore]:
    monkeypatch.setenv("STRATA_TOKEN_FILE", str(cluster.admin_token))
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "http://127.0.0.1:8080/metadata", 0, 16 << 20, "tcp", "", cluster.master) == 0
    yield s
    assert s.remove_by_regex("^" + re.escape(prefix), force=True) >= 0
    assert s.close() == 0


def buf(n: int, fill: int = 0) -> np.ndarray:
    return np.full(n, fill, dtype=np.uint8)


def ptr(a: np.ndarray) -> int:
    return a.ctypes.data


def test_put_get_codes(mc: MooncakeDistributedStore, prefix: str, cluster: Cluster) -> None:
    k = prefix + "a"
    assert mc.put(k, b"hello") == 0
    assert mc.get(k) == b"hello"
    assert mc.is_exist(k) == 1
    assert mc.get_size(k) == 5
    # A put of an existing key: 0, and the old bytes stay.
    assert mc.put(k, b"other") == 0
    assert mc.get(k) == b"hello"
    # Missing keys.
    assert mc.get(prefix + "none") == b""
    assert mc.is_exist(prefix + "none") == 0
    assert mc.get_size(prefix + "none") == -704
    assert mc.remove(prefix + "none") == -704
    # A reader holding a lease (one whose leases run the master's TTL, as
    # the seed system's readers' do): remove is refused, forced it works.
    with strata.Store.connect(cluster.master, token_file=cluster.admin_token, end_leases=False) as r:
        assert r.get(k) == b"hello"
        assert mc.remove(k) == -706
    assert mc.remove(k, force=True) == 0
    assert mc.is_exist(k) == 0


def test_upsert_replaces_and_put_keeps(mc: MooncakeDistributedStore, prefix: str) -> None:
    k = prefix + "up"
    assert mc.put(k, b"old") == 0
    assert mc.put(k, b"other") == 0, "the seed system's put of a present key: 0"
    assert mc.get(k) == b"old", "and the stored bytes kept"
    assert mc.upsert(k, b"new!") == 0
    assert mc.get(k) == b"new!"
    a = buf(3, 7)
    assert mc.upsert_from(k, ptr(a), 3) == 0
    assert mc.get(k) == bytes(a)
    b = buf(5, 9)
    fresh = prefix + "up-fresh"
    assert mc.batch_upsert_from([k, fresh], [ptr(b), ptr(a)], [5, 3]) == [0, 0]
    assert mc.get(k) == bytes(b) and mc.get(fresh) == bytes(a)
    assert mc.upsert_parts(k, b"ab", b"cd") == 0
    assert mc.get(k) == b"abcd"
    assert mc.upsert_batch([k, fresh], [b"x", b"yz"]) == 0
    assert (mc.get(k), mc.get(fresh)) == (b"x", b"yz")
    assert mc.upsert_from(k, ptr(a), 0) < 0, "a bad size is an error, nothing stored"
    assert mc.get(k) == b"x"


def test_keyword_names(mc: MooncakeDistributedStore, prefix: str) -> None:
    cfg = ReplicateConfig()
    cfg.replica_num = 2
    assert mc.put(key=prefix + "kw", value=b"v", config=cfg) == 0
    a = buf(16, 3)
    assert mc.put_from(key=prefix + "pf", buffer_ptr=ptr(a), size=16, config=cfg) == 0
    out = buf(16)
    assert mc.get_into(key=prefix + "pf", buffer_ptr=ptr(out), size=16) == 16
    assert (out == 3).all()
    keys = [prefix + "k0", prefix + "k1"]
    srcs = [buf(8, 1), buf(8, 2)]
    assert mc.batch_put_from(keys=keys, buffer_ptrs=[ptr(x) for x in srcs], sizes=[8, 8], config=cfg) == [0, 0]
    outs = [buf(8), buf(8)]
    assert mc.batch_get_into(keys=keys, buffer_ptrs=[ptr(x) for x in outs], sizes=[8, 8]) == [8, 8]
    assert [o.tolist() for o in outs] == [[1] * 8, [2] * 8]
    assert mc.batch_is_exist(keys=keys + [prefix + "no"]) == [1, 1, 0]
    assert mc.put_batch(keys=[prefix + "b0"], values=[b"x"], config=cfg) == 0
    assert mc.get_batch([prefix + "b0", prefix + "no"]) == [b"x", b""]
    assert mc.batch_remove(keys=keys, force=True) == [0, 0]
    assert mc.remove(key=prefix + "kw", force=True) == 0
    assert mc.remove_by_regex(regex_pattern="^" + re.escape(prefix) + "b", force=True) == 1


def test_get_into_errors(mc: MooncakeDistributedStore, prefix: str) -> None:
    assert mc.put(prefix + "big", bytes(range(256)) * 4) == 0
    small = buf(100, 9)
    assert mc.get_into(prefix + "big", ptr(small), 100) == -600
    assert (small == 9).all()
    assert mc.get_into(prefix + "none", ptr(small), 100) == -704
    large = buf(2048)  # held: the store writes through its address
    res = mc.batch_get_into([prefix + "big", prefix + "none"], [ptr(large), ptr(small)], [2048, 100])
    assert res == [1024, -704]
    assert large[:1024].tobytes() == bytes(range(256)) * 4
    assert mc.batch_put_from([prefix + "x"], [], []) == [-600]


def test_multi_buffers(mc: MooncakeDistributedStore, prefix: str) -> None:
    keys = [f"{prefix}mb{i}" for i in range(4)]
    layers = [[buf(64 * (j + 1), 10 * i + j) for j in range(3)] for i in range(4)]
    res = mc.batch_put_from_multi_buffers(
        keys, [[ptr(x) for x in ls] for ls in layers], [[x.nbytes for x in ls] for ls in layers]
    )
    assert res == [0] * 4
    outs = [[buf(x.nbytes) for x in ls] for ls in layers]
    got = mc.batch_get_into_multi_buffers(
        keys, [[ptr(x) for x in os_] for os_ in outs], [[x.nbytes for x in os_] for os_ in outs]
    )
    assert got == [64 + 128 + 192] * 4
    for os_, ls in zip(outs, layers):
        assert all((o == x).all() for o, x in zip(os_, ls))


def test_put_parts_and_buffers(mc: MooncakeDistributedStore, prefix: str) -> None:
    assert mc.put_parts(prefix + "pp", b"ab", bytearray(b"cd"), memoryview(b"ef")) == 0
    assert mc.get(prefix + "pp") == b"abcdef"
    h = mc.get_buffer(prefix + "pp")
    assert h is not None and h.size() == 6 and bytes(memoryview(h)) == b"abcdef"
    assert ctypes.string_at(h.ptr(), h.size()) == b"abcdef"
    assert mc.get_buffer(prefix + "none") is None
    hs = mc.batch_get_buffer([prefix + "pp", prefix + "none"])
    assert len(hs) == 2 and bytes(hs[0]) == b"abcdef" and hs[1] is None


def test_register_buffer_and_health(mc: MooncakeDistributedStore) -> None:
    a = buf(4096)
    assert mc.register_buffer(ptr(a), a.nbytes) == 0
    assert mc.unregister_buffer(ptr(a)) == 0
    assert mc.unregister_buffer(ptr(a)) != 0
    assert mc.health_check() == 0
    assert isinstance(mc.get_hostname(), str) and mc.get_hostname()


def test_not_set_up_and_closed() -> None:
    s = MooncakeDistributedStore()
    assert s.put("k", b"v") < 0
    assert s.get("k") == b""
    assert s.health_check() == 1
    with pytest.raises(NotImplementedError):
        s.put_tensor("k", None)


def test_unreachable_master(monkeypatch: pytest.MonkeyPatch) -> None:
    from conftest import free_port

    s = MooncakeDistributedStore()
    # The seed system's default timeout is long; Strata's connect bounds it.
    monkeypatch.setattr("strata.mooncake._connect", lambda m, kw: strata._native.connect(m, timeout=1.0, **kw))
    rc = s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 0, "tcp", "", f"127.0.0.1:{free_port()}")
    assert rc == -900


def test_setup_dict_form(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRATA_TOKEN_FILE", str(cluster.admin_token))
    s = MooncakeDistributedStore()
    assert s.setup({"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
                    "global_segment_size": 0, "master_server_addr": cluster.master}) == 0
    assert s.health_check() == 0
    assert s.close() == 0
    assert s.health_check() == 1


def test_sglang_setup_pattern(cluster: Cluster, monkeypatch: pytest.MonkeyPatch, prefix: str) -> None:
    """SGLang's MooncakeStore: 8 positional arguments (the transfer engine
    None) plus keywords, retried without the keywords a TypeError names;
    then its warmup (put, is_exist == 1, get)."""
    monkeypatch.setenv("STRATA_TOKEN_FILE", str(cluster.admin_token))
    store = MooncakeDistributedStore()
    setup_kwargs = {"enable_ssd_offload": True, "ssd_offload_path": "/tmp/x"}
    while True:
        try:
            ret = store.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", cluster.master, None,
                              **setup_kwargs)
            break
        except TypeError as e:
            unsupported = [k for k in list(setup_kwargs) if k in str(e)]
            if not unsupported:
                raise
            for k in unsupported:
                setup_kwargs.pop(k)
    assert ret == 0
    key = prefix + "sglang_mooncake_store_warmup_key"
    assert store.put(key, bytes(4 * 1024)) == 0
    assert store.is_exist(key) == 1
    assert store.get(key) == bytes(4 * 1024)
    store.remove(key, force=True)
    store.close()


def test_sglang_page_pattern(mc: MooncakeDistributedStore, prefix: str) -> None:
    """batch_is_exist before batch_put_from of 128 pages (only the missing
    ones put), then batch_get_into; results as SGLang reads them."""
    page = 4096
    pool = np.random.default_rng(0).integers(0, 256, 128 * page, dtype=np.uint8)
    assert mc.register_buffer(ptr(pool), pool.nbytes) == 0
    keys = [f"{prefix}page-{i}_0_k" for i in range(128)]
    # Half of them stored earlier.
    pre = [mc.put_from(k, ptr(pool) + i * page, page) for i, k in enumerate(keys) if i % 2 == 0]
    assert pre == [0] * 64
    exist = mc.batch_is_exist(keys)
    assert len(exist) == 128
    assert exist == [1 if i % 2 == 0 else 0 for i in range(128)]
    missing = [i for i, e in enumerate(exist) if e != 1]
    res = mc.batch_put_from([keys[i] for i in missing], [ptr(pool) + i * page for i in missing], [page] * len(missing))
    assert res == [0] * 64
    assert all(r == 0 for r in res)
    out = np.zeros_like(pool)
    got = mc.batch_get_into(keys, [ptr(out) + i * page for i in range(128)], [page] * 128)
    assert len(got) == 128 and all(g > 0 for g in got)
    assert (out == pool).all()
    assert mc.unregister_buffer(ptr(pool)) == 0


def test_lmcache_pattern(mc: MooncakeDistributedStore, prefix: str) -> None:
    """LMCache's remote backend: is_exist's int used as a bool, put of
    bytes with a ReplicateConfig, get of bytes, contains after remove."""
    cfg = ReplicateConfig()
    cfg.replica_num = 1
    cfg.preferred_segment = ""
    k = prefix + "lmcache@chunk"
    if not mc.is_exist(k):
        assert mc.put(k, b"kv" * 1000, cfg) == 0
    assert mc.is_exist(k)
    assert bool(mc.is_exist(prefix + "missing")) is False
    assert mc.get(k) == b"kv" * 1000


def test_replicate_config_places_copies(cluster: Cluster, mc: MooncakeDistributedStore, prefix: str) -> None:
    cfg = ReplicateConfig()
    cfg.preferred_segment = "node-b"
    assert mc.put(prefix + "pref", b"x", cfg) == 0
    assert key_nodes(cluster, prefix + "pref") == ["node-b"]
    cfg2 = ReplicateConfig()
    cfg2.replica_num = 2
    assert mc.put(prefix + "two", b"y", cfg2) == 0
    assert key_nodes(cluster, prefix + "two") == ["node-a", "node-b"]


def test_signatures_match_the_seed_system() -> None:
    """Every method the drop-in implements has the seed system's parameter
    names, in its order (read from the seed wheel's docstrings)."""
    import mooncake.store as ms  # installed by scripts/python-tests.sh
    names = [
        "setup", "init_all", "close", "health_check", "get_hostname", "register_buffer",
        "unregister_buffer", "put", "get", "put_batch", "get_batch", "put_parts", "put_from",
        "get_into", "batch_put_from", "batch_get_into", "batch_put_from_multi_buffers",
        "batch_get_into_multi_buffers", "get_buffer", "batch_get_buffer", "is_exist",
        "batch_is_exist", "get_size", "remove", "batch_remove", "remove_by_regex", "remove_all",
        "upsert", "upsert_from", "batch_upsert_from", "upsert_parts", "upsert_batch",
    ]
    checked = 0
    for name in names:
        doc = getattr(ms.MooncakeDistributedStore, name).__doc__ or ""
        m = re.search(rf"{name}\(self: [^,)]+(?:, )?(.*?)\) ->", doc)
        assert m, f"no signature for {name} in the seed wheel"
        theirs = [p.split(":")[0].strip().lstrip("*") for p in _split(m.group(1)) if p]
        ours = [p for p in inspect.signature(getattr(MooncakeDistributedStore, name)).parameters if p != "self"]
        if all(re.fullmatch(r"arg\d+", t) for t in theirs):
            assert len(ours) >= len(theirs), name  # positional-only there
        else:
            assert ours[: len(theirs)] == theirs, (name, ours, theirs)
        checked += 1
    assert checked == len(names)


def _split(params: str) -> List[str]:
    out, depth, cur = [], 0, ""
    for ch in params:
        if ch in "[(<":
            depth += 1
        elif ch in "])>":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out
