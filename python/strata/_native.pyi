"""Type stubs of the native extension (crates/python). ``strata.Store`` and
``strata.AsyncStore`` are ``Store`` in its blocking and asyncio modes."""

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from .errors import StrataError

__version__: str

# Anything with the buffer protocol (bytes, bytearray, memoryview, numpy
# arrays), a CPU torch tensor, or an (address, size) pair of host memory.
Buffer = Union[bytes, bytearray, memoryview, Any, Tuple[int, int]]
# Writable memory: bytearray, numpy arrays, writable memoryviews, CPU torch
# tensors, (address, size) pairs.
WritableBuffer = Union[bytearray, memoryview, Any, Tuple[int, int]]

class Connection:
    """An open connection (the client and, optionally, an embedded segment)."""

def connect(
    master: Optional[str] = None,
    *,
    token_file: Optional[str] = None,
    transport: str = "tcp",
    segment_bytes: int = 0,
    timeout: float = 20.0,
    node_id: Optional[str] = None,
    segment_token_file: Optional[str] = None,
    segment_listen: Optional[str] = None,
    end_leases: bool = True,
) -> Connection: ...
def connect_async(
    master: Optional[str] = None,
    *,
    token_file: Optional[str] = None,
    transport: str = "tcp",
    segment_bytes: int = 0,
    timeout: float = 20.0,
    node_id: Optional[str] = None,
    segment_token_file: Optional[str] = None,
    segment_listen: Optional[str] = None,
    end_leases: bool = True,
) -> Any: ...

class Store:
    def __new__(cls, connection: Connection, asynchronous: bool = False) -> "Store": ...
    @property
    def master(self) -> str: ...
    @property
    def node_id(self) -> Optional[str]: ...
    @property
    def closed(self) -> bool: ...
    def put(
        self,
        key: str,
        data: Buffer,
        *,
        replicas: int = 1,
        soft_pin: bool = False,
        hard_pin: bool = False,
        preferred: Optional[str] = None,
        overwrite: bool = False,
    ) -> None:
        """Stores ``data`` under ``key``. Raises ``AlreadyExists`` if the key
        is stored (with ``overwrite=True`` replaces it atomically instead: a
        reader gets the old bytes or the new, never a mix, and the old
        version's space is freed once its readers are done), ``NoSpace``
        when the cluster cannot make room."""
    def put_from(
        self,
        key: str,
        buffer: Buffer,
        *,
        replicas: int = 1,
        soft_pin: bool = False,
        hard_pin: bool = False,
        preferred: Optional[str] = None,
        overwrite: bool = False,
    ) -> None:
        """``put`` (every put reads the caller's memory in place)."""
    def put_parts(
        self,
        key: str,
        parts: Sequence[Buffer],
        *,
        replicas: int = 1,
        soft_pin: bool = False,
        hard_pin: bool = False,
        preferred: Optional[str] = None,
        overwrite: bool = False,
    ) -> None:
        """Stores the concatenation of ``parts`` as one object."""
    def batch_put(
        self,
        keys: Sequence[str],
        buffers: Sequence[Buffer],
        *,
        replicas: int = 1,
        soft_pin: bool = False,
        hard_pin: bool = False,
        preferred: Optional[str] = None,
        overwrite: bool = False,
    ) -> List[Optional[StrataError]]:
        """Puts many objects; per key ``None`` or the error it met."""
    def batch_put_from_parts(
        self,
        keys: Sequence[str],
        parts: Sequence[Sequence[Buffer]],
        *,
        replicas: int = 1,
        soft_pin: bool = False,
        hard_pin: bool = False,
        preferred: Optional[str] = None,
        overwrite: bool = False,
    ) -> List[Optional[StrataError]]:
        """Puts many objects, each the concatenation of its parts."""
    def get(self, key: str) -> bytes:
        """The object as new ``bytes``. Raises ``NotFound``."""
    def get_into(self, key: str, buffer: WritableBuffer) -> int:
        """Reads into ``buffer`` (at least the object's size); returns the size."""
    def get_into_parts(self, key: str, parts: Sequence[WritableBuffer]) -> int:
        """Reads the object scattered over ``parts`` (sizes must add up)."""
    def batch_get(self, keys: Sequence[str]) -> List[Optional[bytes]]:
        """Many objects; ``None`` for keys not found."""
    def batch_get_into(self, keys: Sequence[str], buffers: Sequence[WritableBuffer]) -> List[Union[int, StrataError]]:
        """Reads into one buffer per key; per key its size or the error it met."""
    def batch_get_into_parts(
        self, keys: Sequence[str], parts: Sequence[Sequence[WritableBuffer]]
    ) -> List[Union[int, StrataError]]:
        """Reads each object scattered over its parts."""
    def exists(self, key: str) -> bool: ...
    def batch_exists(self, keys: Sequence[str]) -> List[bool]:
        """Whether each key is stored, in one request."""
    def batch_size(self, keys: Sequence[str]) -> List[Optional[int]]:
        """Each key's size, ``None`` when absent, in one request."""
    def size(self, key: str) -> int:
        """The object's size without reading it. Raises ``NotFound``."""
    def remove(self, key: str, force: bool = False) -> None:
        """Removes ``key``. Raises ``Leased`` while read, unless ``force``."""
    def batch_remove(self, keys: Sequence[str], force: bool = False) -> List[Optional[StrataError]]: ...
    def remove_prefix(self, prefix: str, force: bool = False) -> int:
        """Removes every key starting with ``prefix``; returns how many."""
    def remove_all(self, force: bool = False) -> int:
        """Removes every object (admin token); returns how many."""
    def list(self, prefix: str = "", limit: int = 1000) -> List[Dict[str, Any]]:
        """Keys with ``prefix`` in key order: dicts of key, size, replicas."""
    def stat(self) -> Dict[str, Any]:
        """Cluster summary: keys, capacity_bytes, allocated_bytes, nodes,
        segments, evictions, segment_info."""
    def close(self) -> None:
        """Closes the connection and stops the embedded segment."""
    def _io_threads(self) -> int:
        """Threads that drive their own I/O for this connection (each
        thread's first blocking call makes its own; it ends with the
        thread; ``STRATA_THREAD_IO=0`` turns this off)."""
