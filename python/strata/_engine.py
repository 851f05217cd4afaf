"""What the engine connectors share: a Strata connection that stays out of
the engine's way while Strata is down.

Both ``strata.vllm`` and ``strata.sglang`` run inside an engine that must
keep serving when the cache is gone: a failed call becomes a miss (recompute)
or a dropped save, the outage is logged once, and Strata is not asked again
for ``retry_after`` seconds, so a dead master costs one timeout per interval
instead of one per request.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Dict, Optional, Tuple

import strata
from strata.errors import StrataError

# What both connectors count, in blocks (vLLM) or pages (SGLang): looked up
# and hit, loaded and saved, failed loads and saves, calls skipped while
# Strata was down.
STAT_NAMES = ("lookups", "hits", "loaded", "saved", "load_failures", "save_failures", "unavailable")


class EngineStore:
    """A lazily connected :class:`strata.Store` with outage tracking.

    ``extra`` is the engine's connector configuration: ``master`` (default
    ``$STRATA_MASTER``), ``token_file`` (default ``$STRATA_TOKEN_FILE``),
    ``timeout`` seconds per call (default 2) and ``retry_after`` seconds
    (default 10).
    """

    def __init__(self, extra: Dict[str, Any], logger: logging.Logger, what: str):
        self._master = extra.get("master")
        self._token_file = extra.get("token_file")
        self._timeout = _positive(extra, "timeout", 2.0)
        self._retry_after = _positive(extra, "retry_after", 10.0)
        self._logger = logger
        self._what = what  # "the connector recomputes", for the outage line
        self._store: Optional[strata.Store] = None
        self._down_until = 0.0
        self._lock = threading.Lock()
        self._key: Tuple[str, ...] = ()
        self._users = 0  # guarded by _SHARED_LOCK
        self._released = False

    @classmethod
    def shared(cls, extra: Dict[str, Any], logger: logging.Logger, what: str) -> "EngineStore":
        """One per process and configuration: an engine's scheduler and
        worker sides share the connection and the outage state when they run
        in one process (and log an outage once). Each user calls
        :meth:`release` when done; the last one closes the connection."""
        key = (what,) + tuple(str(extra.get(k)) for k in ("master", "token_file", "timeout", "retry_after"))
        with _SHARED_LOCK:
            s = _SHARED.get(key)
            if s is None:
                s = _SHARED[key] = cls(extra, logger, what)
                s._key = key
            s._users += 1
            return s

    def release(self) -> None:
        """One user of :meth:`shared` is done; the last closes the store, so
        one engine component shutting down never closes it under another."""
        with _SHARED_LOCK:
            self._users -= 1
            if self._users > 0:
                return
            if _SHARED.get(self._key) is self:
                del _SHARED[self._key]
            self._released = True
        self.close()

    def get(self) -> Optional[strata.Store]:
        """The store, or None while Strata is considered down (or once its
        last user released it)."""
        if self._released or time.monotonic() < self._down_until:
            return None
        with self._lock:
            if self._store is None:
                try:
                    self._store = strata.Store.connect(self._master, token_file=self._token_file, timeout=self._timeout)
                    self._logger.info("Strata: connected to %s", self._store.master)
                except (StrataError, OSError, ValueError) as e:
                    self._down(e)
                    return None
            return self._store

    def failed(self, e: BaseException) -> None:
        """Record a failed call: Strata is skipped for ``retry_after`` s,
        unless the error says Strata is up and refused this call (not
        retryable: a bad argument, a permission): that call alone fails."""
        if isinstance(e, StrataError) and not e.retryable:
            self._logger.warning("Strata refused a call: %s", e)
            return
        self._down(e)

    def _down(self, e: BaseException) -> None:
        if time.monotonic() >= self._down_until:
            self._logger.warning("Strata unavailable (%s); %s for %.0f s", e, self._what, self._retry_after)
        self._down_until = time.monotonic() + self._retry_after

    def close(self) -> None:
        with self._lock:
            if self._store is not None:
                self._store.close()
                self._store = None


def _positive(extra: Dict[str, Any], name: str, default: float) -> float:
    try:
        v = float(extra.get(name, default))
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number of seconds, not {extra.get(name)!r}") from None
    if not v > 0:
        raise ValueError(f"{name} must be > 0 seconds, not {v}")
    return v


_SHARED: Dict[Tuple[str, ...], EngineStore] = {}
_SHARED_LOCK = threading.Lock()
