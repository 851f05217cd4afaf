"""SGLang's own host KV pools, page hashes and storage config for the
backend's tests, built on this CPU from SGLang's device pools the way its
cache controller builds them."""

from __future__ import annotations

import zlib
from typing import Any, Dict, List

import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
from sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler import _mha_host_inputs
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
from sglang.srt.mem_cache.utils import get_storage_hash_str

PAGE = 16  # tokens per page
DEVICE_TOKENS = 512
LAYERS = 3


def device_pool(mla: bool = False, dtype: torch.dtype = torch.float16, heads: int = 2) -> Any:
    """SGLang's device KV pool of a small model, on the CPU."""
    if mla:
        return MLATokenToKVPool(DEVICE_TOKENS, PAGE, dtype, 32, 8, LAYERS, "cpu", False, start_layer=0, end_layer=LAYERS)
    return MHATokenToKVPool(DEVICE_TOKENS, PAGE, dtype, heads, 8, LAYERS, "cpu", False, start_layer=0, end_layer=LAYERS)


def host_pool(layout: str = "page_first", mla: bool = False, dtype: torch.dtype = torch.float16, heads: int = 2) -> Any:
    """SGLang's host KV pool (HiCache's L2) over a fresh device pool, laid out
    as ``--hicache-mem-layout`` would; filled with random bytes."""
    kv = device_pool(mla, dtype, heads)
    if mla:
        info = kv.get_device_pool_infos()[0].buffer_info
        pool = MLATokenToKVPoolHost(
            info, 2.0, 0, PAGE, layout, pin_memory=False,
            device_capacity_tokens=kv.size, start_layer=0, end_layer=LAYERS, target_layer_num=LAYERS,
        )
    else:
        cls, info, kw = _mha_host_inputs(kv)
        pool = cls(info, 2.0, 0, PAGE, layout, pin_memory=False, **kw)
    fill_random(pool, seed=zlib.crc32(f"{layout}/{mla}/{dtype}/{heads}".encode()))
    return pool


def fill_random(pool: Any, seed: int) -> None:
    raw = pool.kv_buffer.view(-1).view(torch.uint8)
    g = torch.Generator().manual_seed(seed)
    raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=g))


def page_bytes(pool: Any, host_indices: torch.Tensor, page: int) -> torch.Tensor:
    """Page ``page`` of ``host_indices`` as bytes, read with SGLang's own
    ``get_data_page`` (whatever the layout)."""
    return pool.get_data_page(int(host_indices[page * PAGE]), flat=True).view(torch.uint8).clone()


def hashes(tokens: List[int]) -> List[str]:
    """SGLang's storage keys of the full pages of ``tokens``."""
    return list(get_storage_hash_str(tokens, None, page_size=PAGE))


def storage_config(extra: Dict[str, Any], pool: Any, **over: Any) -> HiCacheStorageConfig:
    """What SGLang's cache controller hands a storage backend (single rank
    unless overridden)."""
    fields: Dict[str, Any] = dict(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=isinstance(pool, MLATokenToKVPoolHost), enable_storage_metrics=False,
        is_page_first_layout=pool.layout == "page_first", model_name="tiny-llama",
    )
    fields.update(over)
    return HiCacheStorageConfig(extra_config=dict(extra), **fields)


def backend_extra(cluster: Any, **over: Any) -> Dict[str, Any]:
    """``--hicache-storage-backend-extra-config`` as the docs give it."""
    extra = {
        "backend_name": "strata",
        "module_path": "strata.sglang",
        "class_name": "StrataStorage",
        "interface_v1": 1,
        "master": cluster.master,
        "token_file": str(cluster.client_token),
    }
    extra.update(over)
    return extra


