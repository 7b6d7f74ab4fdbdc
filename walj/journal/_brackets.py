"""Entering and leaving a bracket (a turn, an LLM call): one step, sync or in a worker thread,
that leaves the bracket when it fails or is interrupted, so that this process never holds a
turn or an LLM call live that a replay of the log would not."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from ._aio import in_worker, run_through

T = TypeVar("T")


def step(function: Callable[..., T], leave: Callable[[], None], *args: Any) -> T:
    """`function(*args)`; on any exception or interrupt, `leave()` first."""
    try:
        return function(*args)
    except BaseException:
        leave()
        raise


async def step_in_worker(function: Callable[..., T], leave: Callable[[], None], *args: Any,
                         then: Callable[[], None] | None = None) -> T:
    """`function(*args)` in a worker; on any exception or cancellation, `leave()` at once,
    then (with `then`) wait for `then` in a worker: the step may be writing at this moment,
    and what this process holds when the interrupt reaches the caller must be what a replay
    of the log rebuilds, whichever side of the write the interrupt fell on."""
    try:
        result: T = await in_worker(function, *args)
        return result
    except BaseException:
        leave()
        if then is not None:
            await run_through(asyncio.get_running_loop(), then)
        raise
