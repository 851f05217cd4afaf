"""Completes asyncio futures from Strata's I/O threads (through the loop's
``call_soon_threadsafe``)."""

from __future__ import annotations

import asyncio
from typing import Any


def resolve(fut: "asyncio.Future[Any]", ok: bool, value: Any) -> None:
    # Cancelled meanwhile: the operation was aborted; nothing to deliver.
    if fut.done():
        return
    if ok:
        fut.set_result(value)
    else:
        fut.set_exception(value)
