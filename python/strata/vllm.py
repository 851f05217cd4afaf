"""``strata.vllm.StrataConnector``: a vLLM v1 KV connector backed by Strata.

Enable it with vLLM's own configuration, no patch::

    --kv-transfer-config '{"kv_connector": "StrataConnector",
        "kv_connector_module_path": "strata.vllm", "kv_role": "kv_both",
        "kv_connector_extra_config": {"master": "127.0.0.1:7400",
                                      "token_file": "/etc/strata/client.token"}}'

What it stores: one Strata object per full block of a prompt, holding every
layer's slice of that block, read and written straight from and into vLLM's
paged KV cache (``(address, size)`` parts, no staging copy). Keys are the
block's position in a prefix chain — vLLM's own block hashes when prefix
caching computes them, else the connector's chain over the token ids — under a
namespace of everything that makes KV bytes differ: the model, its dtype and
the cache dtype, the block size and layout, the layer shapes, and the
worker's tensor- and pipeline-parallel rank. Two models, dtypes or ranks can
never read each other's blocks.

Scheduler side: ``get_num_new_matched_tokens`` asks Strata once per request
(one batch existence call) for the longest stored prefix; the workers load
those blocks before the forward pass and save newly computed full blocks of
the prompt after it. A failed or short load is reported through
``get_block_ids_with_load_errors``, so vLLM recomputes those blocks: the engine
never attends over KV it did not get. Strata being down or slow never fails a
request: lookups then answer "no match", saves are dropped, the connector logs
once and stops asking for ``retry_after`` seconds (default 10).

Extra config (``kv_connector_extra_config``): ``master`` (default
``$STRATA_MASTER``), ``token_file`` (default ``$STRATA_TOKEN_FILE``),
``timeout`` seconds per Strata call (default 2), ``retry_after`` seconds
(default 10), ``namespace`` (an extra string mixed into every key: a tenant
or deployment name), ``replicas`` (default 1), ``on_load_failure``
(``recompute``, the default, sets vLLM's ``kv_load_failure_policy`` so a
failed load is recomputed; ``fail`` fails the request as vLLM does by
default).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Set, Tuple

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats
from vllm.logger import init_logger

from strata._engine import STAT_NAMES, EngineStore
from strata.errors import AlreadyExists, StrataError

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

# Under vLLM's logger, so the connector's lines join the engine's log.
logger = init_logger("vllm.connector.strata")


Part = Tuple[int, int]


@dataclass
class Transfer:
    """Blocks one worker moves: keys (without the rank's namespace) and the
    vLLM block ids they go to or come from, in the same order."""

    hashes: List[str] = field(default_factory=list)
    block_ids: List[int] = field(default_factory=list)


@dataclass
class StrataConnectorMetadata(KVConnectorMetadata):
    loads: List[Transfer] = field(default_factory=list)
    saves: List[Transfer] = field(default_factory=list)
    # Scheduler-side counts of this step, reported by the workers' stats.
    lookups: int = 0
    hits: int = 0
    unavailable: int = 0
    # Key prefix per rank ("tp.pp"), worked out by the scheduler.
    namespaces: Dict[str, str] = field(default_factory=dict)
    # Blocks promised to vLLM that cannot be loaded: reported as load errors.
    failed: List[int] = field(default_factory=list)


@dataclass
class StrataConnectorStats(KVConnectorStats):
    """Block counts since the last report: looked up and hit (scheduler),
    loaded, saved, failed loads and saves, calls skipped while Strata was
    unavailable."""

    def __post_init__(self) -> None:
        for k in STAT_NAMES:
            self.data.setdefault(k, 0)

    def reset(self) -> None:
        self.data = {k: 0 for k in STAT_NAMES}

    def aggregate(self, other: KVConnectorStats) -> "StrataConnectorStats":
        for k in STAT_NAMES:
            self.data[k] = self.data.get(k, 0) + int(other.data.get(k, 0))
        return self

    def reduce(self) -> Dict[str, int | float]:
        return {k: self.data.get(k, 0) for k in STAT_NAMES}

    def is_empty(self) -> bool:
        return not any(self.data.get(k, 0) for k in STAT_NAMES)


def _namespace(vllm_config: "VllmConfig", extra: Dict[str, Any], tp_rank: int, pp_rank: int) -> str:
    """Everything that makes two engines' KV bytes for the same tokens
    differ, hashed into a key prefix. Worked out by the scheduler only (for
    every rank) and handed to the workers in the metadata: a worker process
    does not see the same hash seed or prefix-caching decision."""
    mc = vllm_config.model_config
    cc = vllm_config.cache_config
    pc = vllm_config.parallel_config
    layout = getattr(cc, "kv_cache_layout", None)
    parts = [
        "strata-vllm-v1",
        str(extra.get("namespace", "")),
        str(mc.model),
        str(getattr(mc, "revision", None)),
        str(mc.dtype),
        str(mc.quantization),
        str(sorted(mc.hf_overrides.items()) if isinstance(mc.hf_overrides, dict) else mc.hf_overrides),
        str(cc.cache_dtype),
        str(cc.block_size),
        str(getattr(layout, "name", layout)),
        str(mc.get_total_num_hidden_layers()),
        str(mc.get_total_num_kv_heads()),
        str(mc.get_head_size()),
        f"tp{pc.tensor_parallel_size}.{tp_rank}",
        f"pp{pc.pipeline_parallel_size}.{pp_rank}",
        str(cc.prefix_caching_hash_algo if cc.enable_prefix_caching else "strata-blake2b"),
        _hash_seed(),
    ]
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]
    return f"vllm/{digest}/"


def _hash_seed() -> str:
    """vLLM's prefix-hash seed (random per process for non-cryptographic
    hashes: such engines never share blocks, and keys say so)."""
    try:
        from vllm.v1.core.kv_cache_utils import get_none_hash_seed

        return hashlib.sha256(get_none_hash_seed().encode()).hexdigest()[:16]
    except ImportError:
        return "unknown"


def _block_hashes(request: "Request", block_size: int, n: int) -> List[str]:
    """Hex keys of the first ``n`` full blocks: vLLM's block hashes when it
    computed them (they cover LoRA, multimodal inputs and cache salts), else
    a chain over the token ids."""
    hashes = getattr(request, "block_hashes", None) or []
    if len(hashes) >= n:
        return [bytes(h).hex() for h in hashes[:n]]
    if getattr(request, "mm_features", None):
        return []  # without vLLM's hashes, images could alias: no keys
    seed = "|".join(
        str(x)
        for x in (getattr(request, "lora_request", None) and request.lora_request.lora_name, request.cache_salt)
    )
    h = hashlib.blake2b(seed.encode(), digest_size=16).digest()
    tokens = request.all_token_ids
    out = []
    for i in range(n):
        block = tokens[i * block_size : (i + 1) * block_size]
        h = hashlib.blake2b(h + b"".join(int(t).to_bytes(4, "little", signed=True) for t in block), digest_size=16).digest()
        out.append(h.hex())
    return out


@dataclass
class _Tracked:
    """What the scheduler side keeps per running request."""

    prompt_len: int
    block_ids: List[int]
    saved: int  # blocks [0, saved) need no save


class StrataConnector(KVConnectorBase_V1):
    """vLLM's KV connector interface over Strata (see the module doc)."""

    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole, kv_cache_config: "KVCacheConfig" = None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self._extra: Dict[str, Any] = dict(self._kv_transfer_config.kv_connector_extra_config or {})
        self._block_size = vllm_config.cache_config.block_size
        self._replicas = int(self._extra.get("replicas", 1))
        if role == KVConnectorRole.SCHEDULER:
            # A block that fails to load is a cache miss, not an error: vLLM
            # recomputes it (its default is to fail the request), unless the
            # operator asks otherwise. Read by the scheduler right after it
            # makes this connector.
            policy = str(self._extra.get("on_load_failure", "recompute"))
            if policy not in ("recompute", "fail"):
                raise ValueError(f"on_load_failure must be 'recompute' or 'fail', not {policy!r}")
            self._kv_transfer_config.kv_load_failure_policy = policy
        pc = vllm_config.parallel_config
        if getattr(pc, "decode_context_parallel_size", 1) > 1 or getattr(pc, "prefill_context_parallel_size", 1) > 1:
            # Context parallelism interleaves a block's tokens across ranks
            # and hashes blocks of block_size x ranks tokens.
            raise ValueError("StrataConnector does not support context parallelism (DCP/PCP > 1)")
        self._ranks = [(tp, pp) for pp in range(pc.pipeline_parallel_size) for tp in range(pc.tensor_parallel_size)]
        # Last, after every check that may refuse the configuration: a
        # connector that fails to construct is never shut down.
        self._strata = EngineStore.shared(self._extra, logger, "the connector recomputes instead")
        self._shut_down = False
        # Scheduler side.
        self._tracked: Dict[str, _Tracked] = {}
        self._planned: Dict[str, Tuple[int, int]] = {}  # req -> (first, end) block to load
        self._hashes: Dict[str, List[str]] = {}
        self._lookups = 0
        self._hits = 0
        self._unavailable = 0
        self._namespaces: Optional[Dict[str, str]] = None
        # Worker side.
        self._reports_scheduler = False
        self._rank = ""  # "tp.pp", set with the KV caches
        self._block_runs: List[Part] = []  # per layer: (address of block 0, bytes)
        self._block_strides: List[int] = []
        self._load_errors: Set[int] = set()
        self._stats = StrataConnectorStats()
        # Since start, never reset (``totals()``).
        self._totals = StrataConnectorStats()

    @property
    def requires_kv_delivery(self) -> bool:
        # A cache: a dropped save is a later miss, never lost work.
        return False

    # ---------------------------------------------------------- scheduler side

    def _rank_namespaces(self) -> Dict[str, str]:
        if self._namespaces is None:
            self._namespaces = {f"{tp}.{pp}": _namespace(self._vllm_config, self._extra, tp, pp) for tp, pp in self._ranks}
        return self._namespaces

    def _scheduler_keys(self, hashes: Sequence[str]) -> List[str]:
        ns = self._rank_namespaces()
        return [ns[f"{tp}.{pp}"] + h for tp, pp in self._ranks for h in hashes]

    def get_num_new_matched_tokens(self, request: "Request", num_computed_tokens: int) -> Tuple[Optional[int], bool]:
        bs = self._block_size
        prompt_len = len(request.prompt_token_ids or [])
        # Every full block of the prompt may be saved later; all but the
        # one holding the last token may be loaded (vLLM computes that
        # token itself).
        hashes = self._hashes.get(request.request_id)
        if hashes is None:
            hashes = _block_hashes(request, bs, prompt_len // bs)
            self._hashes[request.request_id] = hashes
        matchable = min((prompt_len - 1) // bs, len(hashes))
        first = num_computed_tokens // bs
        if matchable <= first:
            return 0, False
        store = self._strata.get()
        if store is None:
            self._unavailable += 1
            return 0, False
        wanted = hashes[first:matchable]
        keys = self._scheduler_keys(wanted)
        try:
            found = store.batch_exists(keys)
        except StrataError as e:
            self._strata.failed(e)
            return 0, False
        if len(found) != len(keys):
            return 0, False
        # A block is there when every rank's share of it is.
        per_rank = len(wanted)
        hit = 0
        while hit < per_rank and all(found[r * per_rank + hit] for r in range(len(self._ranks))):
            hit += 1
        self._lookups += per_rank
        self._hits += hit
        if hit == 0:
            self._planned.pop(request.request_id, None)
            return 0, False
        self._planned[request.request_id] = (first, first + hit)
        return (first + hit) * bs - num_computed_tokens, False

    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int) -> None:
        if num_external_tokens == 0:
            self._planned.pop(request.request_id, None)

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        meta = StrataConnectorMetadata(lookups=self._lookups, hits=self._hits, unavailable=self._unavailable,
                                       namespaces=self._rank_namespaces())
        self._lookups = self._hits = self._unavailable = 0
        bs = self._block_size
        for new in scheduler_output.scheduled_new_reqs:
            block_ids = list(new.block_ids[0])
            prompt_len = len(new.prompt_token_ids or [])
            saved = new.num_computed_tokens // bs  # loaded or in vLLM's own cache
            t = _Tracked(prompt_len=prompt_len, block_ids=block_ids, saved=saved)
            self._tracked[new.req_id] = t
            self._plan_load(meta, new.req_id, t)
            self._plan_save(meta, new.req_id, t, new.num_computed_tokens + scheduler_output.num_scheduled_tokens[new.req_id])
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            t = self._tracked.get(req_id)
            if t is None:
                continue
            new_ids = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids:
                # Preempted and back: its blocks are new, its KV recomputed
                # or loaded again.
                t.block_ids = list(new_ids[0]) if new_ids else []
                t.saved = min(t.saved, cached.num_computed_tokens[i] // bs)
                self._plan_load(meta, req_id, t)
            elif new_ids:
                t.block_ids.extend(new_ids[0])
            self._plan_save(meta, req_id, t, cached.num_computed_tokens[i] + scheduler_output.num_scheduled_tokens[req_id])
        return meta

    def _plan_load(self, meta: StrataConnectorMetadata, req_id: str, t: _Tracked) -> None:
        plan = self._planned.pop(req_id, None)
        if plan is None:
            return
        first, end = plan
        hashes = self._hashes.get(req_id)
        if hashes is None or end > len(hashes) or end > len(t.block_ids):
            # vLLM counts these tokens as loaded: have it recompute them.
            meta.failed.extend(t.block_ids[first:end])
            return
        meta.loads.append(Transfer(hashes=hashes[first:end], block_ids=t.block_ids[first:end]))
        t.saved = max(t.saved, end)

    def _plan_save(self, meta: StrataConnectorMetadata, req_id: str, t: _Tracked, computed: int) -> None:
        full = min(computed, t.prompt_len) // self._block_size
        full = min(full, len(t.block_ids))
        if full <= t.saved:
            return
        hashes = self._hashes.get(req_id)
        if hashes is None or len(hashes) < full:
            return
        meta.saves.append(Transfer(hashes=hashes[t.saved : full], block_ids=t.block_ids[t.saved : full]))
        t.saved = full

    def request_finished(self, request: "Request", block_ids: List[int]) -> Tuple[bool, Optional[Dict[str, Any]]]:
        self._tracked.pop(request.request_id, None)
        self._planned.pop(request.request_id, None)
        self._hashes.pop(request.request_id, None)
        # Saves are done by the end of each step: nothing to wait for.
        return False, None

    # ------------------------------------------------------------- worker side

    def register_kv_caches(self, kv_caches: Dict[str, torch.Tensor]) -> None:
        from vllm.distributed.parallel_state import get_pp_group, get_tp_group

        tp = get_tp_group().rank_in_group
        pp = get_pp_group().rank_in_group
        self._rank = f"{tp}.{pp}"
        # The scheduler's counts travel in the metadata to every worker;
        # one of them reports them.
        self._reports_scheduler = tp == 0 and pp == 0
        seen: Set[int] = set()
        runs: List[Part] = []
        strides: List[int] = []
        for name in sorted(kv_caches):
            t = kv_caches[name]
            if t.dim() < 2 or t.data_ptr() in seen:
                continue  # shared or not a per-block view
            seen.add(t.data_ptr())
            block = t[0]
            if not block.is_contiguous():
                raise ValueError(
                    f"StrataConnector needs each layer's block to be one contiguous run; {name} is "
                    f"{tuple(t.shape)} with strides {t.stride()} (layout {getattr(self._vllm_config.cache_config, 'kv_cache_layout', None)})"
                )
            runs.append((block.data_ptr(), block.numel() * block.element_size()))
            strides.append(t.stride(0) * t.element_size())
        self._block_runs = runs
        self._block_strides = strides
        logger.info(
            "Strata connector: rank %s, %d layers, %d bytes per block",
            self._rank, len(runs), sum(n for _, n in runs),
        )

    def _parts(self, block_id: int) -> List[Part]:
        """Where block ``block_id`` lives in each layer, adjacent runs merged."""
        out: List[Part] = []
        for (base, n), stride in zip(self._block_runs, self._block_strides):
            addr = base + block_id * stride
            if out and out[-1][0] + out[-1][1] == addr:
                out[-1] = (out[-1][0], out[-1][1] + n)
            else:
                out.append((addr, n))
        return out

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        meta = self._connector_metadata
        if not isinstance(meta, StrataConnectorMetadata):
            return
        if self._reports_scheduler:
            self._stats.data["lookups"] += meta.lookups
            self._stats.data["hits"] += meta.hits
            self._stats.data["unavailable"] += meta.unavailable
        if meta.failed:
            self._fail_loads(meta.failed)
        ns = meta.namespaces.get(self._rank)
        for load in meta.loads:
            self._load(load, ns)

    def _load(self, load: Transfer, ns: Optional[str]) -> None:
        store = self._strata.get()
        if store is None or ns is None:
            self._stats.data["unavailable"] += 1
            self._fail_loads(load.block_ids)
            return
        keys = [ns + h for h in load.hashes]
        parts = [self._parts(b) for b in load.block_ids]
        try:
            res = store.batch_get_into_parts(keys, parts)
        except StrataError as e:
            self._strata.failed(e)
            self._fail_loads(load.block_ids)
            return
        if len(res) != len(keys):
            self._fail_loads(load.block_ids)
            return
        want = [sum(n for _, n in p) for p in parts]
        failed = [b for b, r, w in zip(load.block_ids, res, want) if not (isinstance(r, int) and r == w)]
        self._stats.data["loaded"] += len(keys) - len(failed)
        if failed:
            logger.warning("Strata connector: %d of %d blocks failed to load; vLLM recomputes them", len(failed), len(keys))
            self._fail_loads(failed)

    def _fail_loads(self, block_ids: Sequence[int]) -> None:
        self._stats.data["load_failures"] += len(block_ids)
        self._load_errors.update(block_ids)

    def wait_for_layer_load(self, layer_name: str) -> None:
        # Every layer is loaded by start_load_kv, before the forward pass.
        return

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: "AttentionMetadata", **kwargs: Any) -> None:
        # A block is saved once, all layers at once, in wait_for_save.
        return

    def wait_for_save(self) -> None:
        meta = self._connector_metadata
        if not isinstance(meta, StrataConnectorMetadata) or not meta.saves:
            return
        store = self._strata.get()
        ns = meta.namespaces.get(self._rank)
        if store is None or ns is None:
            self._stats.data["unavailable"] += 1
            return
        keys: List[str] = []
        parts: List[List[Part]] = []
        for s in meta.saves:
            keys.extend(ns + h for h in s.hashes)
            parts.extend(self._parts(b) for b in s.block_ids)
        try:
            res = store.batch_put_from_parts(keys, parts, replicas=self._replicas)
        except StrataError as e:
            self._strata.failed(e)
            self._stats.data["save_failures"] += len(keys)
            return
        saved = sum(1 for r in res if r is None or isinstance(r, AlreadyExists))
        self._stats.data["saved"] += saved
        self._stats.data["save_failures"] += len(keys) - saved

    def get_block_ids_with_load_errors(self) -> Set[int]:
        out, self._load_errors = self._load_errors, set()
        return out

    def get_kv_connector_stats(self) -> Optional[KVConnectorStats]:
        if self._stats.is_empty():
            return None
        out, self._stats = self._stats, StrataConnectorStats()
        self._totals.aggregate(out)
        return out

    def totals(self) -> Dict[str, int]:
        """This worker's counts since it started (``STAT_NAMES``)."""
        now = StrataConnectorStats(data=dict(self._totals.data))
        return {k: int(v) for k, v in now.aggregate(self._stats).data.items()}

    @classmethod
    def build_kv_connector_stats(cls, data: Optional[Dict[str, Any]] = None) -> Optional[KVConnectorStats]:
        return StrataConnectorStats(data=dict(data or {}))

    def shutdown(self) -> None:
        if not self._shut_down:
            self._shut_down = True
            self._strata.release()
