"""A drop-in for the seed system's ``mooncake.store.MooncakeDistributedStore``.

A connector written for it runs on Strata after changing one import::

    from strata.mooncake import MooncakeDistributedStore, ReplicateConfig

Names, positional order, keyword names and return conventions are the seed
system's (``mooncake-transfer-engine`` 0.3.13): integer codes, 0 for success
and its negative ``ErrorCode`` numbers for failures (``-704`` not found,
``-706`` has lease, ``-200`` no space, ``-600`` invalid params, ``-900`` /
``-901`` RPC fail / timeout, ``-800`` transfer fail, ``-801`` checksum), one
code per key in batch calls, ``get`` of a missing key returns ``b""``, a put
of an existing key returns 0 and keeps the stored bytes (``upsert*``
replace them). What maps where, and what is not supported, is listed in
``docs/python.md``.

Credentials are Strata's: ``STRATA_TOKEN_FILE`` (the client token) and, when
``global_segment_size > 0`` makes this process contribute memory,
``STRATA_SEGMENT_TOKEN_FILE`` (the member token), unless the master runs
without credentials on loopback.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from . import _native
from .errors import StrataError

__all__ = ["MooncakeDistributedStore", "ReplicateConfig", "BufferHandle", "ErrorCode"]

log = logging.getLogger("strata.mooncake")


class ErrorCode:
    """The seed system's ``ErrorCode`` numbers that this drop-in returns."""

    OK = 0
    INTERNAL_ERROR = -1
    NO_AVAILABLE_HANDLE = -200
    INVALID_PARAMS = -600
    OBJECT_NOT_FOUND = -704
    OBJECT_ALREADY_EXISTS = -705
    OBJECT_HAS_LEASE = -706
    TRANSFER_FAIL = -800
    CHECKSUM_MISMATCH = -801
    RPC_FAIL = -900
    RPC_TIMEOUT = -901


# Strata's code names (StrataError.code) -> the seed system's numbers.
_CODES: Dict[str, int] = {
    "invalid_argument": ErrorCode.INVALID_PARAMS,
    "not_found": ErrorCode.OBJECT_NOT_FOUND,
    "already_exists": ErrorCode.OBJECT_ALREADY_EXISTS,
    "no_space": ErrorCode.NO_AVAILABLE_HANDLE,
    "leased": ErrorCode.OBJECT_HAS_LEASE,
    "not_ready": ErrorCode.RPC_FAIL,
    "unavailable": ErrorCode.RPC_FAIL,
    "not_leader": ErrorCode.RPC_FAIL,
    "resource_exhausted": ErrorCode.RPC_FAIL,
    "timeout": ErrorCode.RPC_TIMEOUT,
    "permission_denied": ErrorCode.RPC_FAIL,
    "unauthenticated": ErrorCode.RPC_FAIL,
    "corrupted": ErrorCode.CHECKSUM_MISMATCH,
    "internal": ErrorCode.INTERNAL_ERROR,
    "cancelled": ErrorCode.INTERNAL_ERROR,
}

# Codes worth a log line: the seed system's callers see only the number.
_QUIET = {"not_found", "already_exists", "leased"}


def _code(e: BaseException) -> int:
    if isinstance(e, StrataError):
        if e.code not in _QUIET:
            log.warning("strata: %s", e)
        return _CODES.get(e.code, ErrorCode.INTERNAL_ERROR)
    if isinstance(e, (TypeError, ValueError, OverflowError)):
        log.warning("strata: invalid parameters: %s", e)
        return ErrorCode.INVALID_PARAMS
    raise e


class ReplicateConfig:
    """Where and how a put places its copies (the seed system's fields).

    Strata uses ``replica_num``, ``with_soft_pin`` / ``soft_pin_action``,
    ``with_hard_pin`` and the first of ``preferred_segment`` /
    ``preferred_segments`` (a node id: ``get_hostname()`` of a store that
    contributes memory). The rest are accepted and have no effect.
    """

    def __init__(self) -> None:
        self.replica_num: int = 1
        self.with_soft_pin: bool = False
        self.soft_pin_action: int = 0
        self.soft_pin_ttl_ms: Optional[int] = None
        self.with_hard_pin: bool = False
        self.preferred_segment: str = ""
        self.preferred_segments: List[str] = []
        self.prefer_alloc_in_same_node: bool = False
        self.nof_replica_num: int = 0
        self.dfs_replica_num: int = 0
        self.preferred_nof_segments: List[str] = []
        self.data_type: int = 0

    def __repr__(self) -> str:
        return (
            f"ReplicateConfig: {{ replica_num: {self.replica_num}, with_soft_pin: "
            f"{int(self._soft_pin())}, with_hard_pin: {int(self.with_hard_pin)}, "
            f"preferred_segment: {self._preferred()!r} }}"
        )

    def _soft_pin(self) -> bool:
        # SoftPinAction: PRESERVE 0, ENABLE 1, DISABLE 2.
        return bool(self.with_soft_pin) or self.soft_pin_action == 1

    def _preferred(self) -> Optional[str]:
        if self.preferred_segment:
            return self.preferred_segment
        if self.preferred_segments:
            return self.preferred_segments[0]
        return None

    def _options(self) -> Dict[str, Any]:
        n = int(self.replica_num)
        return {
            "replicas": n if n > 0 else 1,
            "soft_pin": self._soft_pin(),
            "hard_pin": bool(self.with_hard_pin),
            "preferred": self._preferred(),
        }


# A put without a config (the common call) skips making its options anew.
_DEFAULT_OPTIONS: Dict[str, Any] = ReplicateConfig()._options()


def _options(config: Optional[ReplicateConfig]) -> Dict[str, Any]:
    return _DEFAULT_OPTIONS if config is None else config._options()


class BufferHandle(bytearray):
    """An object read by ``get_buffer``: its bytes with the buffer protocol
    (``memoryview(handle)``, ``numpy.frombuffer(handle, ...)``), and the seed
    system's ``ptr()`` and ``size()``."""

    def ptr(self) -> int:
        import ctypes

        if not len(self):
            return 0
        return ctypes.addressof((ctypes.c_char * len(self)).from_buffer(self))

    def size(self) -> int:
        return len(self)


def _pair(ptr: int, size: int) -> Tuple[int, int]:
    return (int(ptr), int(size))


class MooncakeDistributedStore:
    """The seed system's store client, on Strata (see the module's doc)."""

    def __init__(self) -> None:
        self._store: Optional[_native.Store] = None
        self._hostname = ""
        self._buffers: Dict[int, int] = {}
        self._lock = threading.Lock()

    # ---- setup ----------------------------------------------------------

    def setup(
        self,
        local_hostname: Union[str, Dict[str, Any]],
        metadata_server: Optional[str] = None,
        global_segment_size: int = 16 << 20,
        local_buffer_size: int = 16 << 20,
        protocol: str = "tcp",
        rdma_devices: str = "",
        master_server_addr: str = "127.0.0.1:50051",
        engine: Any = None,
        enable_ssd_offload: bool = False,
        ssd_offload_path: str = "",
        tenant_id: str = "default",
        enable_client_http_server: bool = False,
        client_http_port: int = 9300,
    ) -> int:
        """Connects to the Strata master ``master_server_addr`` (a Strata
        address: ``HOST:PORT``, a list, or ``etcd://.../CLUSTER``) and, with
        ``global_segment_size > 0``, contributes that much of this process's
        DRAM as an embedded segment named after ``local_hostname``.

        ``metadata_server``, ``local_buffer_size``, ``rdma_devices``,
        ``engine``, ``enable_ssd_offload``, ``ssd_offload_path`` (Strata's
        SSD tier is its SSD agents'), ``tenant_id`` (prefix keys to keep
        tenants apart), ``enable_client_http_server`` and
        ``client_http_port`` are accepted and unused. Also takes one dict of
        these names. Returns 0, or a negative code.
        """
        if isinstance(local_hostname, dict):
            cfg = dict(local_hostname)
            if "local_hostname" not in cfg:
                log.warning("strata: setup(config) needs local_hostname")
                return ErrorCode.INVALID_PARAMS
            known = {
                "local_hostname", "metadata_server", "global_segment_size", "local_buffer_size",
                "protocol", "rdma_devices", "master_server_addr", "ipc_socket_path",
                "enable_ssd_offload", "ssd_offload_path", "tenant_id",
                "enable_client_http_server", "client_http_port",
            }
            unknown = set(cfg) - known
            if unknown:
                log.warning("strata: setup(config) ignores unknown keys %s", sorted(unknown))
            return self._setup(
                str(cfg["local_hostname"]),
                int(cfg.get("global_segment_size", 16 << 20)),
                str(cfg.get("protocol", "tcp")),
                str(cfg.get("master_server_addr", "127.0.0.1:50051")),
            )
        if metadata_server is None:
            raise TypeError("setup() missing required argument: 'metadata_server'")
        return self._setup(str(local_hostname), int(global_segment_size), str(protocol), str(master_server_addr))

    def init_all(self, protocol: str, device_name: str, mount_segment_size: int = 16 << 20) -> int:
        """The seed system's shortcut: the master from ``STRATA_MASTER`` (or
        ``MOONCAKE_MASTER``), this host's name, ``mount_segment_size`` bytes
        contributed."""
        master = os.environ.get("STRATA_MASTER") or os.environ.get("MOONCAKE_MASTER") or "127.0.0.1:7400"
        return self._setup(socket.gethostname(), int(mount_segment_size), protocol, master)

    def _setup(self, hostname: str, segment: int, protocol: str, master: str) -> int:
        if self._store is not None:
            log.warning("strata: setup() called twice; keeping the first connection")
            return ErrorCode.OK
        if segment < 0:
            return ErrorCode.INVALID_PARAMS
        transport = {"tcp": "tcp", "rdma": "ucx", "ucx": "ucx"}.get(protocol.lower())
        if transport is None:
            log.warning("strata: protocol %r is not supported; using tcp", protocol)
            transport = "tcp"
        kwargs: Dict[str, Any] = {"transport": transport}
        if segment > 0:
            kwargs["segment_bytes"] = segment
            kwargs["node_id"] = f"{hostname}-{os.getpid()}-{id(self) & 0xFFFF:04x}"
            kwargs["segment_listen"] = f"{_address_of(hostname, master)}:0"
        try:
            conn = _connect(master, kwargs)
        except StrataError as e:
            if transport == "ucx" and e.code == "invalid_argument" and "ucx" in str(e).lower():
                log.warning("strata: %s; using tcp", e)
                kwargs["transport"] = "tcp"
                try:
                    conn = _connect(master, kwargs)
                except StrataError as e2:
                    return _code(e2)
            else:
                return _code(e)
        self._store = _native.Store(conn)
        self._hostname = self._store.node_id or hostname
        return ErrorCode.OK

    def close(self) -> int:
        """Disconnects; an embedded segment leaves the cluster (objects whose
        only copy it held are gone)."""
        s, self._store = self._store, None
        if s is not None:
            try:
                s.close()
            except StrataError as e:
                return _code(e)
        return ErrorCode.OK

    def health_check(self) -> int:
        """0 healthy, 1 not set up or closed, 2 the master is unreachable."""
        s = self._store
        if s is None or s.closed:
            return 1
        try:
            s.stat()
        except StrataError:
            return 2
        return 0

    def get_hostname(self) -> str:
        """This store's segment name: the node id of its embedded segment
        (what ``ReplicateConfig.preferred_segment`` names), else the
        ``local_hostname`` given to ``setup``."""
        return self._hostname

    # ---- registered memory ------------------------------------------------

    def register_buffer(self, buffer_ptr: int, size: int) -> int:
        """Strata reads and writes host memory directly: registration only
        records the range (for ``unregister_buffer``). Returns 0."""
        if int(buffer_ptr) == 0 or int(size) < 0:
            return ErrorCode.INVALID_PARAMS
        with self._lock:
            self._buffers[int(buffer_ptr)] = int(size)
        return ErrorCode.OK

    def unregister_buffer(self, buffer_ptr: int) -> int:
        with self._lock:
            found = self._buffers.pop(int(buffer_ptr), None)
        return ErrorCode.OK if found is not None else ErrorCode.INVALID_PARAMS

    # ---- helpers ------------------------------------------------------------

    def _s(self) -> _native.Store:
        s = self._store
        if s is None:
            raise StrataError("the store is not set up: call setup() first", "invalid_argument")
        return s

    def _put(self, key: str, value: Any, config: Optional[ReplicateConfig], overwrite: bool) -> int:
        try:
            self._s().put(key, value, **_options(config), overwrite=overwrite)
            return ErrorCode.OK
        except StrataError as e:
            if e.code == "already_exists" and not overwrite:
                return ErrorCode.OK  # the seed system keeps the stored bytes
            return _code(e)
        except (TypeError, ValueError, OverflowError) as e:
            return _code(e)

    @staticmethod
    def _put_codes(results: Sequence[Optional[BaseException]], overwrite: bool) -> List[int]:
        out = []
        for r in results:
            if r is None:
                out.append(ErrorCode.OK)
            elif isinstance(r, StrataError) and r.code == "already_exists" and not overwrite:
                out.append(ErrorCode.OK)
            else:
                out.append(_code(r))
        return out

    @staticmethod
    def _read_codes(results: Sequence[Union[int, BaseException]]) -> List[int]:
        return [r if isinstance(r, int) else _code(r) for r in results]

    # ---- put ----------------------------------------------------------------

    def put(self, key: str, value: Any, config: Optional[ReplicateConfig] = None) -> int:
        return self._put(key, value, config, False)

    def upsert(self, key: str, value: Any, config: Optional[ReplicateConfig] = None) -> int:
        return self._put(key, value, config, True)

    def put_from(self, key: str, buffer_ptr: int, size: int, config: Optional[ReplicateConfig] = None) -> int:
        return self._put(key, _pair(buffer_ptr, size), config, False)

    def upsert_from(self, key: str, buffer_ptr: int, size: int, config: Optional[ReplicateConfig] = None) -> int:
        return self._put(key, _pair(buffer_ptr, size), config, True)

    def put_parts(self, key: str, *args: Any, config: Optional[ReplicateConfig] = None) -> int:
        """Stores the concatenation of the buffers ``args`` as one object."""
        return self._put_parts(key, args, config, False)

    def upsert_parts(self, key: str, *args: Any, config: Optional[ReplicateConfig] = None) -> int:
        return self._put_parts(key, args, config, True)

    def _put_parts(self, key: str, parts: Sequence[Any], config: Optional[ReplicateConfig], overwrite: bool) -> int:
        try:
            self._s().put_parts(key, list(parts), **_options(config), overwrite=overwrite)
            return ErrorCode.OK
        except StrataError as e:
            if e.code == "already_exists" and not overwrite:
                return ErrorCode.OK
            return _code(e)
        except (TypeError, ValueError, OverflowError) as e:
            return _code(e)

    def put_batch(self, keys: List[str], values: List[Any], config: Optional[ReplicateConfig] = None) -> int:
        """One code for the batch: 0, or the first key's failure."""
        return self._batch_put(keys, values, config, False, single=True)

    def upsert_batch(self, keys: List[str], values: List[Any], config: Optional[ReplicateConfig] = None) -> int:
        return self._batch_put(keys, values, config, True, single=True)

    def batch_put_from(
        self, keys: List[str], buffer_ptrs: List[int], sizes: List[int], config: Optional[ReplicateConfig] = None
    ) -> List[int]:
        if len(buffer_ptrs) != len(keys) or len(sizes) != len(keys):
            return [ErrorCode.INVALID_PARAMS] * len(keys)
        return self._batch_put(keys, [_pair(p, n) for p, n in zip(buffer_ptrs, sizes)], config, False)

    def batch_upsert_from(
        self, keys: List[str], buffer_ptrs: List[int], sizes: List[int], config: Optional[ReplicateConfig] = None
    ) -> List[int]:
        if len(buffer_ptrs) != len(keys) or len(sizes) != len(keys):
            return [ErrorCode.INVALID_PARAMS] * len(keys)
        return self._batch_put(keys, [_pair(p, n) for p, n in zip(buffer_ptrs, sizes)], config, True)

    def _batch_put(self, keys, values, config, overwrite: bool, single: bool = False):
        try:
            res = self._s().batch_put(list(keys), list(values), **_options(config),
                                      overwrite=overwrite)
            codes = self._put_codes(res, overwrite)
        except (StrataError, TypeError, ValueError, OverflowError) as e:
            codes = [_code(e)] * len(keys)
        if single:
            return next((c for c in codes if c != 0), ErrorCode.OK)
        return codes

    def batch_put_from_multi_buffers(
        self,
        keys: List[str],
        all_buffer_ptrs: List[List[int]],
        all_sizes: List[List[int]],
        config: Optional[ReplicateConfig] = None,
    ) -> List[int]:
        """Each object is the concatenation of its buffers."""
        if len(all_buffer_ptrs) != len(keys) or len(all_sizes) != len(keys):
            return [ErrorCode.INVALID_PARAMS] * len(keys)
        try:
            parts = [[_pair(p, n) for p, n in _zip_exact(ps, ns)] for ps, ns in zip(all_buffer_ptrs, all_sizes)]
            res = self._s().batch_put_from_parts(list(keys), parts, **_options(config))
            return self._put_codes(res, False)
        except (StrataError, TypeError, ValueError, OverflowError) as e:
            return [_code(e)] * len(keys)

    # ---- get ------------------------------------------------------------------

    def get(self, key: str) -> bytes:
        """The object's bytes; ``b""`` when missing or on failure."""
        try:
            return self._s().get(key)
        except (StrataError, TypeError, ValueError) as e:
            _code(e)
            return b""

    def get_batch(self, keys: List[str]) -> List[bytes]:
        try:
            return [b if b is not None else b"" for b in self._s().batch_get(list(keys))]
        except (StrataError, TypeError, ValueError) as e:
            _code(e)
            return [b""] * len(keys)

    def get_buffer(self, key: str) -> Optional[BufferHandle]:
        """The object in a new :class:`BufferHandle`; ``None`` when missing."""
        try:
            s = self._s()
            size = s.size(key)
            h = BufferHandle(size)
            n = s.get_into(key, h)
            if n != size:
                del h[n:]
            return h
        except (StrataError, TypeError, ValueError) as e:
            _code(e)
            return None

    def batch_get_buffer(self, keys: List[str]) -> List[Optional[BufferHandle]]:
        try:
            s = self._s()
            sizes = s.batch_size(list(keys))
        except (StrataError, TypeError, ValueError) as e:
            _code(e)
            return [None] * len(keys)
        handles: List[Optional[BufferHandle]] = [BufferHandle(n) if n is not None else None for n in sizes]
        want = [(k, h) for k, h in zip(keys, handles) if h is not None]
        if want:
            try:
                got = s.batch_get_into([k for k, _ in want], [h for _, h in want])
            except (StrataError, TypeError, ValueError) as e:
                _code(e)
                return [None] * len(keys)
            failed = {id(h) for (_, h), r in zip(want, got) if not isinstance(r, int)}
            handles = [None if h is not None and id(h) in failed else h for h in handles]
        return handles

    def get_into(self, key: str, buffer_ptr: int, size: int) -> int:
        """Bytes read into ``[buffer_ptr, buffer_ptr + size)``, or a negative
        code (a buffer smaller than the object: -600, nothing written)."""
        try:
            return self._s().get_into(key, _pair(buffer_ptr, size))
        except (StrataError, TypeError, ValueError, OverflowError) as e:
            return _code(e)

    def batch_get_into(self, keys: List[str], buffer_ptrs: List[int], sizes: List[int]) -> List[int]:
        if len(buffer_ptrs) != len(keys) or len(sizes) != len(keys):
            return [ErrorCode.INVALID_PARAMS] * len(keys)
        try:
            res = self._s().batch_get_into(list(keys), [_pair(p, n) for p, n in zip(buffer_ptrs, sizes)])
            return self._read_codes(res)
        except (StrataError, TypeError, ValueError, OverflowError) as e:
            return [_code(e)] * len(keys)

    def batch_get_into_multi_buffers(
        self,
        keys: List[str],
        all_buffer_ptrs: List[List[int]],
        all_sizes: List[List[int]],
        prefer_alloc_in_same_node: bool = False,
    ) -> List[int]:
        """Each object scattered over its buffers (which must add up to its
        size); bytes read per key, or a negative code."""
        if len(all_buffer_ptrs) != len(keys) or len(all_sizes) != len(keys):
            return [ErrorCode.INVALID_PARAMS] * len(keys)
        try:
            parts = [[_pair(p, n) for p, n in _zip_exact(ps, ns)] for ps, ns in zip(all_buffer_ptrs, all_sizes)]
            return self._read_codes(self._s().batch_get_into_parts(list(keys), parts))
        except (StrataError, TypeError, ValueError, OverflowError) as e:
            return [_code(e)] * len(keys)

    # ---- existence, size, removal -------------------------------------------

    def is_exist(self, key: str) -> int:
        """1 if stored, 0 if not, negative on failure."""
        try:
            return 1 if self._s().exists(key) else 0
        except (StrataError, TypeError, ValueError) as e:
            return _code(e)

    def batch_is_exist(self, keys: List[str]) -> List[int]:
        try:
            return [1 if e else 0 for e in self._s().batch_exists(list(keys))]
        except (StrataError, TypeError, ValueError) as e:
            return [_code(e)] * len(keys)

    def get_size(self, key: str) -> int:
        """The object's size, or a negative code."""
        try:
            return self._s().size(key)
        except (StrataError, TypeError, ValueError) as e:
            return _code(e)

    def remove(self, key: str, force: bool = False) -> int:
        try:
            self._s().remove(key, force=force)
            return ErrorCode.OK
        except (StrataError, TypeError, ValueError) as e:
            return _code(e)

    def batch_remove(self, keys: List[str], force: bool = False) -> List[int]:
        try:
            return [ErrorCode.OK if r is None else _code(r) for r in self._s().batch_remove(list(keys), force=force)]
        except (StrataError, TypeError, ValueError) as e:
            return [_code(e)] * len(keys)

    def remove_by_regex(self, regex_pattern: str, force: bool = False) -> int:
        """Removes the keys that match (``re.search``); returns how many, or
        a negative code."""
        try:
            rx = re.compile(regex_pattern)
        except re.error as e:
            log.warning("strata: bad regex %r: %s", regex_pattern, e)
            return ErrorCode.INVALID_PARAMS
        try:
            s = self._s()
            keys = [o["key"] for o in s.list("", limit=1 << 62) if rx.search(o["key"])]
            res = s.batch_remove(keys, force=force) if keys else []
            errors = [r for r in res if r is not None and getattr(r, "code", "") != "not_found"]
            if errors:
                return _code(errors[0])
            return sum(1 for r in res if r is None)
        except (StrataError, TypeError, ValueError) as e:
            return _code(e)

    def remove_all(self, force: bool = False) -> int:
        """Removes every object (Strata's admin token); returns how many, or
        a negative code."""
        try:
            return self._s().remove_all(force=force)
        except (StrataError, TypeError, ValueError) as e:
            return _code(e)

    # ---- not supported ---------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        if name in _UNSUPPORTED:
            def unsupported(*args: Any, **kwargs: Any) -> Any:
                raise NotImplementedError(
                    f"MooncakeDistributedStore.{name} is not supported on Strata: {_UNSUPPORTED[name]}"
                )

            return unsupported
        raise AttributeError(name)


def _zip_exact(a: Sequence[int], b: Sequence[int]):
    if len(a) != len(b):
        raise ValueError(f"{len(a)} buffer pointers but {len(b)} sizes")
    return zip(a, b)


def _connect(master: str, kwargs: Dict[str, Any]) -> "_native.Connection":
    return _native.connect(master, **kwargs)


def _address_of(hostname: str, master: str) -> str:
    """The address an embedded segment listens on: ``local_hostname``'s,
    unless that is a loopback address (Debian maps the host name to
    127.0.1.1) and the master is on another host: then the address this
    host reaches the master from."""
    try:
        addr = socket.gethostbyname(hostname.split(":")[0])
    except OSError:
        addr = "127.0.0.1"
    master_host = master.removeprefix("etcd://").split("/")[0].split(",")[0].rsplit(":", 1)[0].strip("[]")
    if addr.startswith("127.") and master_host not in ("localhost", "::1") and not master_host.startswith("127."):
        with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((master_host, 9))  # no packet is sent: only routing
            addr = s.getsockname()[0]
    return addr


_TENSOR = "tensors are moved as bytes on Strata: use put_from/get_into with tensor.data_ptr() and nbytes"
_UNSUPPORTED: Dict[str, str] = {
    **{n: _TENSOR for n in (
        "put_tensor", "get_tensor", "batch_put_tensor", "batch_get_tensor", "pub_tensor",
        "batch_pub_tensor", "put_tensor_from", "get_tensor_into", "batch_put_tensor_from",
        "batch_get_tensor_into", "put_tensor_with_tp", "get_tensor_with_tp", "batch_put_tensor_with_tp",
        "batch_get_tensor_with_tp", "upsert_tensor", "batch_upsert_tensor", "upsert_pub_tensor",
        "batch_upsert_pub_tensor", "get_tensor_into_cuda", "batch_get_tensor_into_cuda",
        "put_tensor_with_parallelism", "get_tensor_with_parallelism", "load_tensor_from_safetensor",
        "save_tensor_to_safetensor",
    )},
    "create_copy_task": "replica copy/move tasks are the master's business on Strata (replicas=, eviction, offload)",
    "create_move_task": "replica copy/move tasks are the master's business on Strata (replicas=, eviction, offload)",
    "query_task": "replica copy/move tasks are the master's business on Strata",
    "setup_dummy": "dummy clients of a standalone store service: run a Strata store node instead",
    "mount_segment": "segments are contributed by store nodes or setup(global_segment_size=...)",
    "unmount_segment": "segments are contributed by store nodes or setup(global_segment_size=...)",
    "allocate_and_mount_segment": "segments are contributed by store nodes or setup(global_segment_size=...)",
    "unmount_and_free_segment": "segments are contributed by store nodes or setup(global_segment_size=...)",
    "alloc_from_mem_pool": "no transfer-engine memory pool: pass any host memory",
    "get_replica_desc": "replica placement is internal to Strata (see `strata stat KEY`)",
    "batch_get_replica_desc": "replica placement is internal to Strata (see `strata stat KEY`)",
    "put_from_with_metadata": "no separate metadata buffer: use put_parts",
    "batch_put_session_start": "puts are one call on Strata",
    "batch_put_session_end": "puts are one call on Strata",
    "batch_put_session_revoke": "puts are one call on Strata",
    "batch_get_session_start": "gets are one call on Strata",
    "batch_get_session_end": "gets are one call on Strata",
    "get_into_ranges": "ranged reads are not in Strata's API",
    "batch_get_into_multi_buffer_ranges": "ranged reads are not in Strata's API",
    "batch_put_from_multi_buffer_ranges": "ranged writes are not in Strata's API",
    "batch_replica_clear": "replica placement is internal to Strata",
}
