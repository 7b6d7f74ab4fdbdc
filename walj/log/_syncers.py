"""The threads behind sync="interval": long-lived workers that each serve one log at a time and
are reused, never freed.

Why not a thread per log: the threading module keeps every Thread it starts in a WeakSet, so
freeing a finished Thread object runs that set's callback. The last reference to a closed log's
syncer often goes in a reference cycle (a poisoned log keeps the exception that poisoned it, and
its traceback keeps the log), so the cyclic collector frees it at an allocation anywhere in the
main thread, walj's own code included, and CPython drops ("Exception ignored") a
KeyboardInterrupt that a real Ctrl-C raises inside such a callback. A worker here outlives every
log it serves and is referenced for the life of the process, so freeing a log frees no Thread.
A worker whose log is closed parks until the next interval log is opened; the number of workers
is the largest number of interval logs that were open at once.
"""

from __future__ import annotations

import os
import queue
import threading
import weakref
from typing import Any

from ._durability import interval_loop


class Syncer:
    """One log's interval syncing, run by a pooled worker: stop its `stop` event, then `join`."""

    __slots__ = ("_ref", "_stop", "_interval", "_done", "_thread", "_pid")

    def __init__(self, ref: weakref.ReferenceType[Any], stop: threading.Event,
                 interval: float) -> None:
        self._ref = ref
        self._stop = stop
        self._interval = interval
        self._done = threading.Event()
        self._thread: threading.Thread | None = None  # the worker, once one took it
        self._pid = os.getpid()

    def run(self) -> None:
        """In a worker: the loop, until the log is closed or collected."""
        self._thread = threading.current_thread()
        try:
            interval_loop(self._ref, self._stop, self._interval)
        finally:
            self._done.set()

    def join(self, timeout: float | None = None) -> None:
        """Wait until the loop has ended (its log's `stop` event must be set). Returns at once
        inside the loop itself (a log dropped without close() may be closed there, by its
        finalizer) and in a forked child, where no worker serves a parent's log."""
        if self._thread is threading.current_thread() or self._pid != os.getpid():
            return
        self._done.wait(timeout)

    def is_alive(self) -> bool:
        """True until the loop has ended."""
        return not self._done.is_set() and self._pid == os.getpid()


class _Pool:
    """Workers waiting on one queue. Every job put is matched, before it is put, by a worker that
    is counted idle and is then no longer counted, or by a new one; an interrupt between the two
    steps leaves a worker uncounted, never a job without a worker."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[Syncer] = queue.SimpleQueue()
        self._idle = 0
        self._threads: list[threading.Thread] = []  # referenced for good: never freed

    def start(self, syncer: Syncer) -> None:
        with self._lock:
            if self._idle == 0:
                worker = threading.Thread(target=self._serve, daemon=True,
                                          name=f"walj-interval-sync-{len(self._threads)}")
                self._threads.append(worker)
                worker.start()
            else:
                self._idle -= 1
            self._jobs.put(syncer)

    def _serve(self) -> None:
        jobs = self._jobs
        while True:
            job = jobs.get()
            job.run()
            del job  # holds no log: the loop holds its log weakly
            with self._lock:
                self._idle += 1


_pool = _Pool()
_forked_away: list[_Pool] = []  # a parent's pools, kept so that their Threads are never freed


def start_syncer(ref: weakref.ReferenceType[Any], stop: threading.Event,
                 interval: float) -> Syncer:
    """Sync the log `ref` holds every `interval` seconds until `stop` is set or the log is
    collected, in a pooled worker thread."""
    syncer = Syncer(ref, stop, interval)
    _pool.start(syncer)
    return syncer


def _after_fork_in_child() -> None:
    # The parent's workers do not exist here, and its lock may have been held at the fork.
    global _pool
    _forked_away.append(_pool)
    _pool = _Pool()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
