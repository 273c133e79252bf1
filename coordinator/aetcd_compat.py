"""Workarounds for aetcd 1.0.0, shared by the election and the etcd store.

aetcd waits for a watch's creation with ``asyncio.wait_for``, which in Python
3.11 drops a cancellation that arrives just as the creation completes; the
cancelled task would then wait on the new watch for good. ``open_watch``
re-raises such a cancellation, ``cancel_watch`` never raises, and ``stop_task``
cancels again until a task that swallowed a cancellation is really done.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aetcd

_log = logging.getLogger("lazarus.etcd")

CLEANUP_TIMEOUT_S = 2.0
"""Longest a clean-up step (cancelling a watch, waiting for a task) may take, seconds."""


async def open_watch(client: aetcd.Client, key: bytes, **kwargs: Any) -> Any:
    """Create an aetcd watch, honouring a cancellation that aetcd swallowed meanwhile.

    aetcd waits for the watch's creation with ``asyncio.wait_for``, which in
    Python 3.11 drops a cancellation that arrives as the creation completes;
    the caller would then wait on the new watch for good. A cancellation still
    pending on the current task is re-raised here.
    """
    watch = await client.watch(key, **kwargs)
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        await cancel_watch(watch)
        raise asyncio.CancelledError
    return watch


async def cancel_watch(watch: Any) -> None:
    """Cancel an aetcd watch, never raising (its stream may be gone already)."""
    try:
        async with asyncio.timeout(CLEANUP_TIMEOUT_S):
            await watch.cancel()
    except Exception as exc:
        _log.debug("cancelling watch %r failed: %r", watch, exc)


async def stop_task(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and wait for its end, cancelling again should it swallow one."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=CLEANUP_TIMEOUT_S)
    if not task.cancelled() and task.exception() is not None:
        _log.warning("task %s ended with %r", task.get_name(), task.exception())
