"""``strata.sglang.StrataStorage``: an SGLang HiCache storage backend (L3).

Enable it with SGLang's own flags, no patch::

    --enable-hierarchical-cache --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "strata",
        "module_path": "strata.sglang", "class_name": "StrataStorage",
        "interface_v1": 1, "master": "127.0.0.1:7400",
        "token_file": "/etc/strata/client.token"}'

SGLang builds it as ``StrataStorage(storage_config, kwargs)`` and then calls
``register_mem_pool_host`` with its host KV pool. What it stores: one Strata
object per page of the host pool, holding the page's K and V of every layer,
read and written straight from and into the pool (the ``(address, size)``
runs SGLang's ``get_page_buffer_meta`` gives for the page, whatever the
layout: no staging copy). Keys are SGLang's page hashes (a prefix chain) under
a namespace of everything that makes the bytes of a page differ: the model
(with SGLang's page-format tag), the dtype, the pool's layout, page size and
shape, and the rank — tensor-parallel rank for MHA models; for MLA models,
whose KV every TP rank holds whole, the ranks share one object and only
SGLang's storage writer saves it. Two models, dtypes, layouts or ranks never
read each other's pages.

Failure behaviour: Strata being down or slow never fails a request. Lookups
then find nothing, reads fail (SGLang keeps the pages it got and computes the
rest), writes are dropped; the backend logs once and stops asking for
``retry_after`` seconds. A page whose read is short, corrupt or missing is
reported as not read, never handed over.

Extra config (``--hicache-storage-backend-extra-config``, beside SGLang's
``backend_name`` / ``module_path`` / ``class_name`` / ``interface_v1``):
``master`` (default ``$STRATA_MASTER``), ``token_file`` (default
``$STRATA_TOKEN_FILE``), ``timeout`` seconds per call (default 2),
``retry_after`` seconds (default 10), ``namespace`` (a tenant or deployment
name mixed into every key; ``clear`` removes only this namespace's pages of
this model and rank), ``replicas`` (default 1).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
)

from strata._engine import STAT_NAMES, EngineStore
from strata.errors import AlreadyExists, StrataError

# Under SGLang's logger tree, so the backend's lines join the server's log.
logger = logging.getLogger("sglang.srt.mem_cache.storage.strata")


# Keys of SGLang's own extra config, not ours.
_SGLANG_KEYS = ("backend_name", "module_path", "class_name", "interface_v1")
_OUR_KEYS = ("master", "token_file", "timeout", "retry_after", "namespace", "replicas")

Part = Tuple[int, int]


class StrataStorage(HiCacheStorage):
    """SGLang's ``HiCacheStorage`` over Strata (see the module doc)."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[Dict[str, Any]] = None):
        extra = dict(storage_config.extra_config or {})
        if not _truthy(extra.get("interface_v1")):
            # Without it SGLang moves pages through the deprecated copying
            # interface (flat page tensors), which this backend does not serve.
            raise ValueError('StrataStorage needs "interface_v1": 1 in --hicache-storage-backend-extra-config')
        if storage_config.dcp_size > 1:
            raise ValueError("StrataStorage does not support decode context parallelism (dcp_size > 1)")
        if storage_config.should_split_heads:
            raise ValueError("StrataStorage does not share pages across TP sizes (tp_lcm_size); remove it")
        unknown = sorted(set(extra) - set(_SGLANG_KEYS) - set(_OUR_KEYS))
        if unknown:
            logger.warning("StrataStorage ignores unknown extra config keys %s", unknown)
        replicas = extra.get("replicas", 1)
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
            raise ValueError(f"replicas must be an integer >= 1, not {replicas!r}")
        self._config = storage_config
        self._extra = extra
        self._replicas = replicas
        self._strata = EngineStore.shared(extra, logger, "HiCache storage reads miss and writes are dropped")
        self._closed = False
        self._prefix: Optional[str] = None  # "sglang/<digest>/", set with the host pool
        self._ranges: List[Tuple[int, int]] = []  # the pool's memory, [start, end)
        self._stats_lock = threading.Lock()
        self._totals = {k: 0 for k in STAT_NAMES}
        # SGLang's StorageMetrics lists, kept only when it asks for them.
        self._metrics = storage_config.enable_storage_metrics
        self._prefetch_pgs: List[int] = []
        self._backup_pgs: List[int] = []
        self._prefetch_bw: List[float] = []
        self._backup_bw: List[float] = []
        # Connect now, so a wrong address shows at start-up; a Strata that
        # is down only logs: the server starts and computes without it.
        self._strata.get()

    # ---------------------------------------------------------------- set-up

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        if getattr(mem_pool_host, "kv_buffer", None) is None:
            raise ValueError(
                f"StrataStorage stores the KV pool of MHA and MLA models; {type(mem_pool_host).__name__} "
                "keeps its data in side pools (hybrid models), which it does not support yet"
            )
        super().register_mem_pool_host(mem_pool_host)
        self._prefix = f"sglang/{_namespace(self._config, self._extra, mem_pool_host)}/"
        self._ranges = _pool_ranges(mem_pool_host)
        logger.info(
            "StrataStorage: %s pool, layout %s, %d tokens per page, keys under %s",
            type(mem_pool_host).__name__, mem_pool_host.layout, mem_pool_host.page_size, self._prefix,
        )

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        raise NotImplementedError(
            f"StrataStorage does not store side pools ({host_pool_name}) of hybrid models yet"
        )

    @property
    def key_prefix(self) -> Optional[str]:
        """Where this backend's pages live in Strata (``None`` before the
        host pool is registered)."""
        return self._prefix

    def _store(self) -> Any:
        """The Strata store, or None while it is down or after ``close``."""
        return None if self._closed else self._strata.get()

    def _keys(self, keys: Sequence[str]) -> List[str]:
        if self._prefix is None:
            raise RuntimeError("StrataStorage: register_mem_pool_host was not called")
        return [self._prefix + k for k in keys]

    def _page_parts(self, n: int, host_indices: torch.Tensor) -> List[List[Part]]:
        """Where each of ``n`` pages lives in the host pool, as SGLang's own
        ``get_page_buffer_meta`` lays it out, adjacent runs merged; every run
        checked to lie inside the pool, so a bad index can never make Strata
        write outside it."""
        pool = self.mem_pool_host
        if len(host_indices) != n * pool.page_size:
            raise ValueError(f"{len(host_indices)} host indices for {n} pages of {pool.page_size} tokens")
        ptrs, sizes = pool.get_page_buffer_meta(host_indices)
        ptrs, sizes = _flatten(ptrs), _flatten(sizes)
        if len(ptrs) != len(sizes) or len(ptrs) % n:
            raise ValueError(f"{len(ptrs)} buffers for {n} pages")
        per = len(ptrs) // n
        out: List[List[Part]] = []
        for i in range(n):
            runs: List[Part] = []
            for addr, size in zip(ptrs[i * per : (i + 1) * per], sizes[i * per : (i + 1) * per]):
                addr, size = int(addr), int(size)
                if size <= 0 or not any(lo <= addr and addr + size <= hi for lo, hi in self._ranges):
                    raise ValueError(f"page run ({addr:#x}, {size}) lies outside the host pool")
                if runs and runs[-1][0] + runs[-1][1] == addr:
                    runs[-1] = (runs[-1][0], runs[-1][1] + size)
                else:
                    runs.append((addr, size))
            out.append(runs)
        return out

    # --------------------------------------------------------- zero-copy I/O

    def batch_get_v1(
        self,
        keys: List[str],
        host_indices: torch.Tensor,
        extra_info: Optional[HiCacheStorageExtraInfo] = None,
    ) -> List[bool]:
        """Read pages into the host pool at ``host_indices``; one bool per
        key, True only when the page's full size arrived intact."""
        return self._move(keys, host_indices, read=True)

    def batch_set_v1(
        self,
        keys: List[str],
        host_indices: torch.Tensor,
        extra_info: Optional[HiCacheStorageExtraInfo] = None,
    ) -> List[bool]:
        """Write pages from the host pool at ``host_indices``; a page that is
        already stored counts as written (equal keys mean equal prefixes)."""
        return self._move(keys, host_indices, read=False)

    def _move(self, keys: List[str], host_indices: torch.Tensor, read: bool) -> List[bool]:
        n = len(keys)
        done, failed = ("loaded", "load_failures") if read else ("saved", "save_failures")
        if not n:
            return []
        try:
            parts = self._page_parts(n, host_indices)
        except Exception as e:  # noqa: BLE001 - the pool's own errors too (a layout it cannot describe)
            logger.error("StrataStorage: refusing a %s of %d pages: %s", "read" if read else "write", n, e)
            self._count(**{failed: n})
            return [False] * n
        store = self._store()
        if store is None:
            self._count(unavailable=1, **{failed: n})
            return [False] * n
        want = [sum(size for _, size in p) for p in parts]
        start = time.perf_counter()
        try:
            if read:
                res = store.batch_get_into_parts(self._keys(keys), parts)
            else:
                res = store.batch_put_from_parts(self._keys(keys), parts, replicas=self._replicas)
        except StrataError as e:
            self._strata.failed(e)
            self._count(**{failed: n})
            return [False] * n
        elapsed = time.perf_counter() - start
        if len(res) != n:
            ok = [False] * n
        elif read:
            ok = [isinstance(r, int) and not isinstance(r, bool) and r == w for r, w in zip(res, want)]
        else:
            ok = [r is None or isinstance(r, AlreadyExists) for r in res]
        good = sum(ok)
        self._count(**{done: good, failed: n - good})
        if self._metrics and good:
            pgs, bw = (self._prefetch_pgs, self._prefetch_bw) if read else (self._backup_pgs, self._backup_bw)
            self._record(pgs, bw, good, sum(w for w, o in zip(want, ok) if o), elapsed)
        return ok

    def batch_exists(self, keys: List[str], extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        """How many of ``keys``, from the first, are stored (one call)."""
        if not keys:
            return 0
        store = self._store()
        if store is None:
            self._count(unavailable=1, lookups=len(keys))
            return 0
        try:
            found = store.batch_exists(self._keys(keys))
        except StrataError as e:
            self._strata.failed(e)
            self._count(lookups=len(keys))
            return 0
        hit = 0
        if len(found) == len(keys):
            while hit < len(found) and found[hit]:
                hit += 1
        self._count(lookups=len(keys), hits=hit)
        return hit

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def clear(self) -> None:
        """Remove this backend's pages: its namespace, model, dtype, layout
        and rank only — never another model's, tenant's or rank's."""
        if self._prefix is None:
            return
        store = self._store()
        if store is None:
            logger.warning("StrataStorage: Strata unavailable, pages under %s not cleared", self._prefix)
            return
        try:
            removed = store.remove_prefix(self._prefix)
        except StrataError as e:
            self._strata.failed(e)
            logger.warning("StrataStorage: clearing %s failed: %s", self._prefix, e)
            return
        logger.info("StrataStorage: cleared %d pages under %s", removed, self._prefix)

    def close(self) -> None:
        """Called by SGLang when it detaches the backend."""
        if not self._closed:
            self._closed = True
            self._strata.release()

    # ----------------------------------------------------------------- stats

    def _count(self, **counts: int) -> None:
        with self._stats_lock:
            for k, v in counts.items():
                self._totals[k] += v

    def _record(self, pgs: List[int], bw: List[float], pages: int, nbytes: int, elapsed: float) -> None:
        with self._stats_lock:
            pgs.append(pages)
            bw.append(nbytes / max(elapsed, 1e-9) / 1e9)

    def totals(self) -> Dict[str, int]:
        """Page counts since start (``STAT_NAMES``): looked up, hit, loaded,
        saved, failed loads and saves, calls skipped while Strata was down."""
        with self._stats_lock:
            return dict(self._totals)

    def get_stats(self) -> Any:
        """SGLang's ``StorageMetrics`` since the last call (pages per
        prefetch and backup, GB/s), when its storage metrics are enabled."""
        if not self._metrics:
            return None
        from sglang.srt.observability.metrics_collector import StorageMetrics

        m = StorageMetrics()
        with self._stats_lock:
            m.prefetch_pgs.extend(self._prefetch_pgs)
            m.backup_pgs.extend(self._backup_pgs)
            m.prefetch_bandwidth.extend(self._prefetch_bw)
            m.backup_bandwidth.extend(self._backup_bw)
            for xs in (self._prefetch_pgs, self._backup_pgs, self._prefetch_bw, self._backup_bw):
                xs.clear()
        return m

    # ------------------------------------- the deprecated copying interface

    def _copying(self) -> NotImplementedError:
        return NotImplementedError('StrataStorage moves pages zero-copy only ("interface_v1": 1)')

    def get(self, key: str, target_location: Optional[Any] = None, target_sizes: Optional[Any] = None) -> Any:
        raise self._copying()

    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None, target_sizes: Optional[Any] = None) -> Any:
        raise self._copying()

    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None, target_sizes: Optional[Any] = None) -> bool:
        raise self._copying()

    def batch_set(self, keys: List[str], values: Optional[Any] = None, target_locations: Optional[Any] = None, target_sizes: Optional[Any] = None) -> bool:
        raise self._copying()


def _truthy(v: Any) -> bool:
    return v not in (None, False, 0, "0", "", "false", "False")


def _flatten(xs: Sequence[Any]) -> List[Any]:
    """SGLang returns flat lists, or one list per page for multi-buffer pools."""
    out: List[Any] = []
    for x in xs:
        if isinstance(x, (list, tuple)):
            out.extend(x)
        else:
            out.append(x)
    return out


def _pool_ranges(pool: Any) -> List[Tuple[int, int]]:
    """The host memory the pool owns: its KV buffer and the split buffers
    some MLA layouts keep beside it."""
    out = []
    for name in ("kv_buffer", "k_buffer", "v_buffer", "index_k_buffer", "index_k_scale_buffer"):
        t = getattr(pool, name, None)
        if isinstance(t, torch.Tensor) and t.numel():
            start = t.data_ptr()
            out.append((start, start + t.numel() * t.element_size()))
    return out


def _server_args() -> str:
    """What of SGLang's server arguments changes the KV of one model path
    beyond the pool's dtype and shape: the revision, weight quantization,
    model config overrides (rope scaling...), model and KV dtypes. Read from
    the scheduler process's arguments; empty where none are set (SGLang's
    classes used outside a server)."""
    try:
        from sglang.srt.runtime_context import get_server_args

        a = get_server_args()
    except Exception:  # noqa: BLE001 - no server in this process
        return ""
    names = ("model_path", "revision", "quantization", "json_model_override_args", "dtype", "kv_cache_dtype")
    return "|".join(f"{n}={getattr(a, n, None)}" for n in names)


def _namespace(config: HiCacheStorageConfig, extra: Dict[str, Any], pool: Any) -> str:
    """Everything that makes the bytes of one page differ, hashed: the
    tenant namespace, the model (SGLang tags it with the pool's page format)
    and the server arguments that change its KV, the dtype, the pool's
    class, layout, page size, shape, and the rank.
    MLA models' KV is the same on every TP rank, so their ranks share it."""
    rank = f"pp{config.pp_size}.{config.pp_rank}.cp{config.attn_cp_size}.{config.attn_cp_rank}"
    if not config.is_mla_model:
        rank = f"tp{config.tp_size}.{config.tp_rank}." + rank
    parts = [
        "strata-sglang-v1",
        str(extra.get("namespace", "")),
        str(config.model_name),
        _server_args(),
        str(pool.dtype),
        type(pool).__name__,
        str(pool.layout),
        str(pool.page_size),
        str(getattr(pool, "layer_num", None)),
        str(getattr(pool, "head_num", None)),
        str(getattr(pool, "head_dim", None)),
        str(pool.get_size_per_token()),
        "mla" if config.is_mla_model else "mha",
        rank,
    ]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]
