"""Strata: a distributed, tiered KV-cache store for LLM inference.

>>> import strata
>>> with strata.Store.connect("127.0.0.1:7400") as store:   # doctest: +SKIP
...     store.put("prefix/block-0", b"kv bytes")
...     store.get("prefix/block-0")
b'kv bytes'

``strata.Store`` blocks (with the GIL released, so other Python threads run);
``strata.AsyncStore`` has the same operations as awaitables for asyncio
engines. Buffers are anything with the buffer protocol (bytes, bytearray,
memoryview, numpy arrays), CPU torch tensors, or ``(address, size)`` pairs of
host memory; none is copied on the way in or out. ``strata.mooncake`` is a
drop-in for the seed system's ``MooncakeDistributedStore``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Union

from . import _native
from .errors import (
    AlreadyExists,
    Cancelled,
    Corrupted,
    InvalidArgument,
    Leased,
    NoSpace,
    NotFound,
    PermissionDenied,
    StrataError,
    Timeout,
    Unavailable,
)

__version__: str = _native.__version__

__all__ = [
    "Store",
    "AsyncStore",
    "StrataError",
    "InvalidArgument",
    "NotFound",
    "AlreadyExists",
    "NoSpace",
    "Leased",
    "Unavailable",
    "Timeout",
    "PermissionDenied",
    "Corrupted",
    "Cancelled",
]

PathLike = Union[str, "os.PathLike[str]"]


def _path(p: Optional[PathLike]) -> Optional[str]:
    return None if p is None else os.path.expanduser(os.fspath(p))


class Store(_native.Store):
    """A connection to a Strata cluster; safe to share between threads.

    Make one with :meth:`Store.connect` (or ``Store(master, ...)``, which
    takes the same arguments). Use it as a context manager, or call
    :meth:`close`: that also stops the embedded segment, if any.
    """

    def __new__(cls, master: Any = None, **kwargs: Any) -> "Store":
        conn = master if isinstance(master, _native.Connection) else _native.connect(master, **_connect_kwargs(kwargs))
        return super().__new__(cls, conn, False)

    @classmethod
    def connect(
        cls,
        master: Optional[str] = None,
        *,
        token_file: Optional[PathLike] = None,
        transport: str = "tcp",
        segment_bytes: int = 0,
        timeout: float = 20.0,
        node_id: Optional[str] = None,
        segment_token_file: Optional[PathLike] = None,
        segment_listen: Optional[str] = None,
        end_leases: bool = True,
    ) -> "Store":
        """Connects to the cluster whose master is ``master``.

        ``master`` takes what the ``strata`` CLI takes: ``HOST:PORT``, a
        comma-separated list of masters, or ``etcd://HOST:PORT[,...]/CLUSTER``
        (follows the leader); default ``$STRATA_MASTER``, else
        ``127.0.0.1:7400``. ``token_file`` holds the client (or admin) token;
        default ``$STRATA_TOKEN_FILE``, else the token a local ``strata up``
        left (``~/.config/strata/up.token``). ``timeout`` (seconds) bounds the
        connection check and every operation's retries.

        ``segment_bytes > 0`` runs a store node inside this process that
        contributes that much DRAM to the cluster (an *embedded segment*),
        named ``node_id`` (default ``HOST-py-PID-N``), registering with
        ``segment_token_file`` (the member token; default
        ``$STRATA_SEGMENT_TOKEN_FILE``, else ``token_file``) and serving on
        ``segment_listen`` (default ``127.0.0.1:0``). It leaves on
        :meth:`close`.

        Every read leases its object for the read (the master neither evicts
        it nor lets an unforced :meth:`remove` take it meanwhile); with
        ``end_leases`` (the default) the lease ends when the read is done, so
        objects just read stay evictable in LRU order. ``end_leases=False``
        keeps each lease for the master's ``--lease-ttl``.

        Raises :class:`Unavailable` when the master does not answer in time,
        :class:`PermissionDenied` when it refuses the token.
        """
        return cls(
            _native.connect(
                master,
                token_file=_path(token_file),
                transport=transport,
                segment_bytes=segment_bytes,
                timeout=timeout,
                node_id=node_id,
                segment_token_file=_path(segment_token_file),
                segment_listen=segment_listen,
                end_leases=end_leases,
            )
        )

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        seg = f", node_id={self.node_id!r}" if self.node_id else ""
        return f"<strata.Store master={self.master!r}{seg} {state}>"


class AsyncStore(_native.Store):
    """:class:`Store`'s operations as awaitables, for asyncio engines.

    The operations run on Strata's own I/O threads and complete the awaiting
    task through its event loop: no Python thread pool is involved.
    Cancelling an awaitable aborts its operation. Make one with
    ``await AsyncStore.connect(...)`` (same arguments as
    :meth:`Store.connect`); use ``async with``, or ``await store.close()``.
    """

    def __new__(cls, connection: Any) -> "AsyncStore":
        if not isinstance(connection, _native.Connection):
            raise TypeError("make an AsyncStore with: await AsyncStore.connect(master, ...)")
        return super().__new__(cls, connection, True)

    @classmethod
    async def connect(
        cls,
        master: Optional[str] = None,
        *,
        token_file: Optional[PathLike] = None,
        transport: str = "tcp",
        segment_bytes: int = 0,
        timeout: float = 20.0,
        node_id: Optional[str] = None,
        segment_token_file: Optional[PathLike] = None,
        segment_listen: Optional[str] = None,
        end_leases: bool = True,
    ) -> "AsyncStore":
        """Connects without blocking the event loop; see :meth:`Store.connect`."""
        conn = await _native.connect_async(
            master,
            token_file=_path(token_file),
            transport=transport,
            segment_bytes=segment_bytes,
            timeout=timeout,
            node_id=node_id,
            segment_token_file=_path(segment_token_file),
            segment_listen=segment_listen,
            end_leases=end_leases,
        )
        return cls(conn)

    if TYPE_CHECKING:  # the same operations as Store's, as awaitables
        from ._native import Buffer, WritableBuffer

        async def put(self, key: str, data: Buffer, *, replicas: int = 1, soft_pin: bool = False,
                      hard_pin: bool = False, preferred: Optional[str] = None,
                      overwrite: bool = False) -> None: ...
        async def put_from(self, key: str, buffer: Buffer, *, replicas: int = 1, soft_pin: bool = False,
                           hard_pin: bool = False, preferred: Optional[str] = None,
                      overwrite: bool = False) -> None: ...
        async def put_parts(self, key: str, parts: Sequence[Buffer], *, replicas: int = 1,
                            soft_pin: bool = False, hard_pin: bool = False,
                            preferred: Optional[str] = None,
                      overwrite: bool = False) -> None: ...
        async def batch_put(self, keys: Sequence[str], buffers: Sequence[Buffer], *, replicas: int = 1,
                            soft_pin: bool = False, hard_pin: bool = False,
                            preferred: Optional[str] = None,
                      overwrite: bool = False) -> List[Optional[StrataError]]: ...
        async def batch_put_from_parts(self, keys: Sequence[str], parts: Sequence[Sequence[Buffer]], *,
                                       replicas: int = 1, soft_pin: bool = False, hard_pin: bool = False,
                                       preferred: Optional[str] = None,
                      overwrite: bool = False) -> List[Optional[StrataError]]: ...
        async def get(self, key: str) -> bytes: ...
        async def get_into(self, key: str, buffer: WritableBuffer) -> int: ...
        async def get_into_parts(self, key: str, parts: Sequence[WritableBuffer]) -> int: ...
        async def batch_get(self, keys: Sequence[str]) -> List[Optional[bytes]]: ...
        async def batch_get_into(self, keys: Sequence[str],
                                 buffers: Sequence[WritableBuffer]) -> List[Union[int, StrataError]]: ...
        async def batch_get_into_parts(self, keys: Sequence[str], parts: Sequence[Sequence[WritableBuffer]]
                                       ) -> List[Union[int, StrataError]]: ...
        async def exists(self, key: str) -> bool: ...
        async def batch_exists(self, keys: Sequence[str]) -> List[bool]: ...
        async def batch_size(self, keys: Sequence[str]) -> List[Optional[int]]: ...
        async def size(self, key: str) -> int: ...
        async def remove(self, key: str, force: bool = False) -> None: ...
        async def batch_remove(self, keys: Sequence[str], force: bool = False) -> List[Optional[StrataError]]: ...
        async def remove_prefix(self, prefix: str, force: bool = False) -> int: ...
        async def remove_all(self, force: bool = False) -> int: ...
        async def list(self, prefix: str = "", limit: int = 1000) -> List[Dict[str, Any]]: ...
        async def stat(self) -> Dict[str, Any]: ...
        async def close(self) -> None: ...

    async def __aenter__(self) -> "AsyncStore":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<strata.AsyncStore master={self.master!r} {state}>"


def _connect_kwargs(kwargs: dict) -> dict:
    out = dict(kwargs)
    for k in ("token_file", "segment_token_file"):
        if k in out:
            out[k] = _path(out[k])
    return out
