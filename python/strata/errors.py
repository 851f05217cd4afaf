"""Strata's errors as exceptions.

Every error the client raises is a :class:`StrataError` with ``.code`` (Strata's
stable code name, e.g. ``"not_found"``) and ``.retryable`` (whether the same
call may succeed after backing off: a failover, an overloaded master). The
classes below are what the codes map to (``strata_common::Code::python``).
"""

from __future__ import annotations

__all__ = [
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


class StrataError(Exception):
    """Base class of every Strata error."""

    code: str
    retryable: bool

    def __init__(self, message: str, code: str = "internal", retryable: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.retryable = retryable

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, code={self.code!r}, retryable={self.retryable})"


class InvalidArgument(StrataError, ValueError):
    """The request was malformed: a bad key, a buffer of the wrong size or a
    read-only one, an unknown option. Never retryable."""


class NotFound(StrataError, LookupError):
    """No object under that key."""


class AlreadyExists(StrataError):
    """A put of a key that is already stored (or being written)."""


class NoSpace(StrataError):
    """The cluster could not make room for the object."""


class Leased(StrataError):
    """A removal refused while readers hold the object (pass ``force=True``
    with an admin token to remove it anyway)."""


class Unavailable(StrataError):
    """The master or a node cannot serve now (restart, failover, overload).
    Retryable."""


class Timeout(Unavailable, TimeoutError):
    """The operation did not finish in time. Retryable."""


class PermissionDenied(StrataError, PermissionError):
    """No credential, a wrong one, or one whose role may not make this call
    (``token_file`` / ``STRATA_TOKEN_FILE``)."""


class Corrupted(StrataError):
    """Every replica returned bytes that failed their checksum."""


class Cancelled(StrataError):
    """The operation was cancelled, or the store is closed."""
