"""Durability: when appended bytes are durable (group commit, interval syncs), and what a
failed write or sync does to the handle (it poisons it)."""

from __future__ import annotations

import errno
import threading
import time
from _thread import LockType, allocate_lock

from ._fs import FileSystem
from .errors import ClosedError, DiskFullError, PoisonedError, WaljError

GATHER_SECONDS = 0.001


class Durability:
    """The sync half of a Log. The Log writes under `_lock` and advances `_next_seq`; this
    class decides who syncs `_fd`, when, and what a failure means."""

    _fs: FileSystem
    _fd: int
    _dir: str
    _next_seq: int
    _closed: bool
    _read_only: bool
    _stop: threading.Event

    def _init_durability(self) -> None:
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)  # rotation and close wait out a sync
        self._gathered = threading.Condition(self._lock)
        self._active = 0  # batch mode: appenders inside append()
        self._pending: list[int] = []  # seqs that appenders wait on and no sync has covered yet
        self._latch = allocate_lock()  # released when the sync under way is over
        self._durable_seq = 0
        self._syncing = False
        self._poisoned: BaseException | None = None
        self._unusable = False  # closed, poisoned or read-only: _check_usable says which

    def _sync_locked(self) -> None:
        try:
            self._fs.sync(self._fd)
        except OSError as exc:
            raise self._poison(exc) from exc
        self._durable_seq = self._next_seq - 1

    def _wake_gatherer(self) -> None:
        """With the lock held: wake a gathering leader only once it has nothing left to wait
        for, since every needless wake-up is a thread switch on the hot path."""
        if self._syncing and self._active <= len(self._pending):
            self._gathered.notify()

    def _gather(self) -> None:
        """Before a group sync, wait (briefly) until every appender inside `append` is waiting on
        a record no sync has covered: those still writing, and those a sync just released that
        loop straight back, then share this sync instead of alternating batches of one and many.
        """
        deadline = 0.0
        while self._active > len(self._pending):
            now = time.monotonic()
            if not deadline:
                deadline = now + GATHER_SECONDS
            elif now >= deadline:
                return
            self._gathered.wait(deadline - now)

    def _wait_durable(self, seq: int) -> None:
        """Group commit: the first waiter syncs for everyone written so far; the others wait
        on that round's latch, a plain lock the leader releases when its sync is over, so
        waking them costs no trip through the log's lock."""
        with self._lock:
            self._pending.append(seq)
            self._wake_gatherer()
        try:
            while self._durable_seq < seq:
                with self._lock:
                    latch = self._sync_round(seq)
                if latch is not None:
                    latch.acquire()
                    latch.release()
        finally:
            if self._durable_seq < seq:  # failed: the leader's pruning did not reach it
                with self._lock:
                    if seq in self._pending:
                        self._pending.remove(seq)

    def _sync_round(self, seq: int) -> LockType | None:
        """With the lock held: lead a sync, or return the latch of the sync under way."""
        if self._durable_seq >= seq:
            return None
        if self._poisoned is not None:
            raise PoisonedError(f"log is poisoned: {self._poisoned}")
        if self._syncing:
            return self._latch
        if self._closed:
            raise ClosedError("log is closed")
        self._syncing = True
        latch = self._latch = allocate_lock()
        latch.acquire()
        self._gather()
        target, fd = self._next_seq - 1, self._fd
        self._lock.release()
        failure: OSError | None = None
        synced = False
        try:
            self._fs.sync(fd)
            synced = True
        except OSError as exc:
            failure = exc
        finally:
            # Only a sync that returned makes anything durable: an interrupt (KeyboardInterrupt)
            # before or around it leaves the round unsynced, for a later sync to cover.
            self._lock.acquire()
            self._syncing = False
            if synced:
                self._durable_seq = max(self._durable_seq, target)
                self._pending = [s for s in self._pending if s > target]
            latch.release()
            self._cond.notify_all()
        if failure is not None:
            raise self._poison(failure) from failure
        return None

    def sync(self) -> None:
        """Make every record appended so far durable, whatever the sync mode."""
        with self._lock:
            self._check_usable()
            target = self._next_seq - 1
        if target > self._durable_seq:
            self._wait_durable(target)

    def _interval_loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                if not self._closed and self._next_seq - 1 > self._durable_seq:
                    self._wait_durable(self._next_seq - 1)
            except WaljError:
                return  # poisoned or closed: appenders see the error themselves

    def _poison(self, exc: OSError) -> PoisonedError:
        """Refuse all further work: after a failed write or fsync the file's state is unknown,
        and a retried fsync may report success for pages the kernel already dropped."""
        if self._poisoned is None:
            self._poisoned = exc
        self._unusable = True
        self._cond.notify_all()
        if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
            return DiskFullError(f"disk full while writing {self._dir}: {exc}; reopen to recover")
        return PoisonedError(f"I/O failure on {self._dir}: {exc}; reopen to recover")

    def _check_usable(self) -> None:
        if self._read_only:
            raise WaljError("log was opened with recovery='salvage', which is read-only")
        if self._closed:
            raise ClosedError("log is closed")
        if self._poisoned is not None:
            raise PoisonedError(
                f"log is poisoned by an earlier failure ({self._poisoned}); reopen to recover")
