"""Running a blocking journal step (a write and its fsync) from asyncio, so the event loop never
waits on the disk: one pool of sync threads shared by every journal in the process.

Not the loop's default executor: that one has min(32, cores + 4) threads, so with many sessions
on a small machine it caps how many fsyncs are in flight far below what the disk takes (the file
system folds fsyncs of different files into shared journal commits). WALJ_SYNC_THREADS sizes the
pool (64 by default). And not a ThreadPoolExecutor either: each of its steps costs a
concurrent.futures.Future chained to an asyncio one and a wake-up of the loop per step. Here a
step completes a plain loop future, and a worker that finishes while the loop has not yet taken
the last completion adds to that batch instead of waking the loop again, so with many sessions
in flight one wake-up completes many steps.

A step, once submitted, always runs to its end: cancelling the awaiting task cancels only the
wait (the journal's state reflects the step whatever it did).
"""

from __future__ import annotations

import asyncio
import atexit
import os
import queue
import threading
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

DEFAULT_SYNC_THREADS = 64


def _threads_from_environment() -> int:
    text = os.environ.get("WALJ_SYNC_THREADS") or ""
    if not text:
        return DEFAULT_SYNC_THREADS
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"WALJ_SYNC_THREADS must be a positive integer, not {text!r}")
    return value


class _Completions:
    """One loop's finished steps not yet handed over, and whether a hand-over is scheduled."""

    __slots__ = ("items", "scheduled")

    def __init__(self) -> None:
        self.items: deque[tuple[asyncio.Future[Any], Any, BaseException | None]] = deque()
        self.scheduled = False


class SyncPool:
    """Bounded threads that run journal steps for any number of event loops.

    On a loop's thread an interrupt may land between any two bytecodes, so what runs there
    never leaves a step unrun or a future incomplete: a request is one SimpleQueue.put (a
    thread is started before it, never after), and a hand-over completes a future before it
    drops it, rescheduling itself if it is stopped."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._requests: queue.SimpleQueue[tuple[asyncio.AbstractEventLoop, asyncio.Future[Any],
                                                Callable[..., Any], tuple[Any, ...]]] = (
            queue.SimpleQueue())
        self._start_lock = threading.Lock()
        self._threads = 0
        self._counts = threading.Condition(threading.Lock())  # idle and busy, for the workers
        self._idle = 0  # workers waiting for a request
        self._busy = 0  # workers running one
        self._done_lock = threading.Lock()
        self._done: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Completions] = (
            weakref.WeakKeyDictionary())

    def submit(self, loop: asyncio.AbstractEventLoop, function: Callable[..., Any],
               *args: Any) -> asyncio.Future[Any]:
        """`function(*args)` in a sync thread, as a future of `loop`."""
        future: asyncio.Future[Any] = loop.create_future()
        if self._threads < self._size and self._idle <= self._requests.qsize():
            with self._start_lock:
                if self._threads < self._size:
                    threading.Thread(target=self._work, name=f"walj-sync-{self._threads}",
                                     daemon=True).start()
                    self._threads += 1
        self._requests.put((loop, future, function, args))
        return future

    def _work(self) -> None:
        counts, requests = self._counts, self._requests
        while True:
            with counts:
                self._idle += 1
            loop, future, function, args = requests.get()
            with counts:
                self._idle -= 1
                self._busy += 1
            try:
                try:
                    result, failure = function(*args), None
                except BaseException as exc:  # noqa: B036 - handed to the awaiter
                    result, failure = None, exc
                self._complete(loop, future, result, failure)
            finally:
                with counts:
                    self._busy -= 1
                    counts.notify_all()  # drain() waits on it; no worker does

    def _complete(self, loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any],
                  result: Any, failure: BaseException | None) -> None:
        with self._done_lock:
            box = self._done.get(loop)
            if box is None:
                box = self._done[loop] = _Completions()
            box.items.append((future, result, failure))
            if box.scheduled:
                return  # the loop has not taken the last batch yet: this joins it
            box.scheduled = True
        try:
            loop.call_soon_threadsafe(self._hand_over, loop, box)
        except RuntimeError:  # the loop is closed: nobody awaits these any more
            with self._done_lock:
                box.items.clear()
                box.scheduled = False

    def _hand_over(self, loop: asyncio.AbstractEventLoop, box: _Completions) -> None:
        """On the loop: complete every future finished since the last hand-over."""
        try:
            while True:
                with self._done_lock:
                    item = box.items[0] if box.items else None
                    box.scheduled = item is not None
                if item is None:
                    return
                future, result, failure = item
                if not future.done():  # cancelled (its awaiter gave up), or completed before
                    if failure is None:  # an interrupt stopped the hand-over last time
                        future.set_result(result)
                    else:
                        future.set_exception(failure)
                with self._done_lock:
                    box.items.popleft()  # only this loop pops, and it completed this one
        except BaseException:
            loop.call_soon(self._hand_over, loop, box)  # the rest, in the loop's next round
            raise

    def drain(self) -> None:
        """Wait until every submitted step has run (at interpreter exit, so that a write handed
        over just before the loop stopped still lands)."""
        with self._counts:
            while self._busy or not self._requests.empty():
                self._counts.wait(0.1)


_pool: SyncPool | None = None
_pool_size = _threads_from_environment()
_pool_lock = threading.Lock()


def sync_pool() -> SyncPool:
    global _pool
    pool = _pool
    if pool is None:
        with _pool_lock:
            if _pool is None:
                _pool = SyncPool(_pool_size)
            pool = _pool
    return pool


def _drain_at_exit() -> None:
    pool = _pool
    if pool is not None:
        pool.drain()


atexit.register(_drain_at_exit)


def _forget_pool_in_child() -> None:
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()  # its threads and locks did not survive the fork


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool_in_child)


def consume(future: asyncio.Future[Any]) -> None:
    """Done callback for a step whose awaiter may be gone: retrieve its outcome so the loop
    does not report it as never retrieved (the journal state already reflects it)."""
    if not future.cancelled():
        future.exception()


def run_soon(loop: asyncio.AbstractEventLoop, function: Callable[..., Any],
             *args: Any) -> asyncio.Future[Any]:
    """`function(*args)` in the shared sync pool, run to its end whether awaited or not."""
    future = sync_pool().submit(loop, function, *args)
    future.add_done_callback(consume)
    return future


async def run_through(loop: asyncio.AbstractEventLoop, function: Callable[..., Any],
                      *args: Any) -> None:
    """Run `function(*args)` in the pool and wait for it, on a path already unwinding: a
    second cancellation stops only the wait (the step goes on in its thread), and a failure
    is left to the step's own bookkeeping; the exception in flight is what the caller sees."""
    try:
        await run_soon(loop, function, *args)
    except BaseException:  # noqa: B036 - see the docstring
        pass


async def in_worker(function: Callable[..., Any], *args: Any) -> Any:
    """Run a blocking journal step in the shared sync pool and await it. A cancellation stops
    only the wait: the step runs to its end."""
    future = sync_pool().submit(asyncio.get_running_loop(), function, *args)
    try:
        return await future
    except BaseException:
        future.add_done_callback(consume)  # cancelled while its outcome was on its way
        raise
