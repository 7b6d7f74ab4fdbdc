"""Running a blocking journal step (a write and its fsync) from asyncio, shielded from
cancellation, so the event loop never waits on the disk."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


def consume(future: asyncio.Future[Any]) -> None:
    """Done callback for a shielded write whose awaiter was cancelled: retrieve its outcome so
    the loop does not report it as never retrieved (the journal state already reflects it)."""
    if not future.cancelled():
        future.exception()


async def in_worker(function: Callable[..., Any], *args: Any) -> Any:
    """Run a blocking journal step in the default executor and await it, shielded: a
    cancellation does not stop the step, whose outcome is then consumed when it ends."""
    future = asyncio.get_running_loop().run_in_executor(None, function, *args)
    try:
        return await asyncio.shield(future)
    except BaseException:
        future.add_done_callback(consume)
        raise
