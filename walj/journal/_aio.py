"""Running a blocking journal step (a write and its fsync) from asyncio, shielded from
cancellation, so the event loop never waits on the disk.

Every journal in the process shares one bounded pool of sync threads, not the loop's default
executor: that one has min(32, cores + 4) threads, so with many sessions on a small machine it
caps how many fsyncs are in flight at once far below what the disk takes (the file system folds
fsyncs of different files into shared journal commits). WALJ_SYNC_THREADS sizes the pool.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

DEFAULT_SYNC_THREADS = 64

_pool: ThreadPoolExecutor | None = None
_pool_size = int(os.environ.get("WALJ_SYNC_THREADS") or DEFAULT_SYNC_THREADS)
_pool_lock = threading.Lock()


def sync_pool() -> ThreadPoolExecutor:
    global _pool
    pool = _pool
    if pool is None:
        with _pool_lock:
            if _pool is None:
                _pool = ThreadPoolExecutor(_pool_size, thread_name_prefix="walj-sync")
            pool = _pool
    return pool


def _forget_pool_in_child() -> None:
    global _pool
    _pool = None  # its threads did not survive the fork


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool_in_child)


def consume(future: asyncio.Future[Any]) -> None:
    """Done callback for a shielded write whose awaiter was cancelled: retrieve its outcome so
    the loop does not report it as never retrieved (the journal state already reflects it)."""
    if not future.cancelled():
        future.exception()


def submit(loop: asyncio.AbstractEventLoop, function: Callable[..., Any],
           *args: Any) -> asyncio.Future[Any]:
    """`function(*args)` in the shared sync pool, as a future of `loop`."""
    return loop.run_in_executor(sync_pool(), function, *args)


async def in_worker(function: Callable[..., Any], *args: Any) -> Any:
    """Run a blocking journal step in the shared sync pool and await it, shielded: a
    cancellation does not stop the step, whose outcome is then consumed when it ends."""
    future = submit(asyncio.get_running_loop(), function, *args)
    try:
        return await asyncio.shield(future)
    except BaseException:
        future.add_done_callback(consume)
        raise
