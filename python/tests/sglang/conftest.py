"""Fixtures of the SGLang backend's tests (run by scripts/sglang-tests.sh with
SGLang 0.5.23's classes on PYTHONPATH; the cluster fixtures come from
../conftest.py)."""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, Iterator, List, Optional

import pytest
import torch
from pools import DEVICE_TOKENS, PAGE, backend_extra, device_pool, fill_random, storage_config
from sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler import _mha_host_inputs
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory


@pytest.fixture
def make_backend(cluster: Any) -> Iterator[Callable[..., Any]]:
    """Builds backends exactly as SGLang does (its factory, then
    ``register_mem_pool_host``) and closes them after the test."""
    made: List[Any] = []

    def make(pool: Any, extra: Optional[Dict[str, Any]] = None, **config: Any) -> Any:
        cfg = storage_config(extra if extra is not None else backend_extra(cluster), pool, **config)
        b = StorageBackendFactory.create_backend("dynamic", cfg, pool)
        b.register_mem_pool_host(pool)
        made.append(b)
        return b

    yield make
    for b in made:
        b.close()



@pytest.fixture
def make_controller(cluster: Any) -> Iterator[Callable[..., Any]]:
    """SGLang's own ``HiCacheController`` of one rank, over a fresh host
    pool, attaching the backend from its extra config (``--hicache-storage-
    backend dynamic``) and running its storage threads; detached after."""
    from sglang.srt.managers.cache_controller import HiCacheController
    from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator
    from sglang.srt.runtime_context import get_parallel

    # One process, one rank: what SGLang's launcher would publish.
    get_parallel().override_permanently(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        attn_dcp_rank=0, attn_dcp_size=1,
    )
    made: List[Any] = []

    def make(layout: str = "page_first", extra: Optional[Dict[str, Any]] = None) -> Any:
        kv = device_pool()
        cls, info, kw = _mha_host_inputs(kv)
        pool = cls(info, 2.0, 0, PAGE, layout, pin_memory=False, **kw)
        fill_random(pool, seed=len(made))
        allocator = PagedTokenToKVPoolAllocator(DEVICE_TOKENS, PAGE, torch.float16, "cpu", kv, False)
        c = HiCacheController(
            allocator, pool, PAGE, None, threading.Event(),
            storage_backend="dynamic", model_name="tiny-llama",
            storage_backend_extra_config=dict(extra if extra is not None else backend_extra(cluster)),
            prefetch_threshold=PAGE,
        )
        made.append(c)
        return c

    yield make
    for c in made:
        c.detach_storage_backend()
