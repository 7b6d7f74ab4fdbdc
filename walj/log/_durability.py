"""Durability: when appended bytes are durable (group commit, interval syncs), and what a
failed write or sync, or an interrupt, does to the handle (it poisons it, or leaves it usable)."""

from __future__ import annotations

import errno
import threading
import time
import weakref
from _thread import LockType, allocate_lock
from typing import Any

from ..errors import ClosedError, DiskFullError, PoisonedError, WaljError
from .fs import FileSystem

GATHER_SECONDS = 0.001


def io_failure(directory: str, exc: OSError, doing: str) -> PoisonedError:
    """The typed error for an OSError: DiskFullError for ENOSPC and EDQUOT."""
    if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return DiskFullError(f"disk full while {doing} {directory}: {exc}; reopen to recover")
    return PoisonedError(f"I/O failure while {doing} {directory}: {exc}; reopen to recover")


class Durability:
    """The sync half of a Log. The Log writes under `_lock` and advances `_next_seq`; this
    class decides who syncs `_fd`, when, and what a failure means.

    Interrupts (KeyboardInterrupt, SystemExit) may land between any two lines. Every shared
    field a sync round sets is reset by the code that set it, in a `finally` that checks the
    fields themselves rather than a local flag an interrupt could leave unset.
    """

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
        self._forked = False
        self._unusable = False  # closed, poisoned, forked, read-only or mid-rotation

    def _sync_locked(self) -> None:
        """With the lock held: sync the active segment (sync="always")."""
        target = self._next_seq - 1
        try:
            self._fs.sync(self._fd)
        except OSError as exc:
            raise self._poison(exc) from exc
        self._check_still_there()
        self._durable_seq = target

    def _check_still_there(self) -> None:
        """After a sync: poison when the segment file was deleted (its directory removed under a
        live writer) or the LOCK file was deleted or replaced (a second writer may be admitted):
        records synced to a file nobody can reopen are not durable."""
        self._poison_for(self._gone(), "")

    def _gone(self) -> str | None:
        raise NotImplementedError

    def _check_lock(self) -> None:
        """With the lock held, before anything is written to the directory (a record, a seal,
        a segment, a base marker): poison, having written nothing, when LOCK is no longer the
        file this writer locked. Deleted or replaced, it may have let a second writer in, and a
        record written now could repeat that writer's seqs. One lstat per write call."""
        self._poison_for(self._lock_lost(), "nothing more was written, and ")

    def _poison_for(self, problem: str | None, written: str) -> None:
        """Poison and raise when a check found `problem`; `written` says what was not."""
        if problem is not None:
            failure = PoisonedError(f"{self._dir}: {problem}; {written}records after seq "
                                    f"{self._durable_seq} may be lost")
            self._set_poison(failure)
            raise failure

    def _lock_lost(self) -> str | None:
        raise NotImplementedError

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
        try:
            with self._lock:
                self._pending.append(seq)
                self._wake_gatherer()
            while self._durable_seq < seq:
                self._sync_round(seq)
        finally:
            if self._durable_seq < seq:  # failed or interrupted: no leader will prune it
                with self._lock:
                    if seq in self._pending:
                        self._pending.remove(seq)

    def _sync_round(self, seq: int) -> None:
        """Lead one sync, or wait for the one under way."""
        latch = allocate_lock()  # ours if we lead: `_latch is latch` says so, whatever happens
        follow: LockType | None = None
        target, fd, synced = 0, -1, False
        failure: OSError | None = None
        try:
            with self._lock:
                if self._durable_seq >= seq:
                    return
                if self._poisoned is not None:
                    raise PoisonedError(f"log is poisoned: {self._poisoned}")
                if self._syncing:
                    follow = self._latch
                else:
                    if self._closed:
                        raise ClosedError("log is closed")
                    latch.acquire()
                    self._latch = latch
                    self._syncing = True
                    self._gather()
                    target, fd = self._next_seq - 1, self._fd
            if follow is not None:
                self._follow(follow)
                return
            try:
                self._fs.sync(fd)
                synced = True
            except OSError as exc:
                failure = exc
            self._end_round(latch, synced and failure is None, target)
        except BaseException:
            # Here too when the first _end_round was interrupted half way: it is idempotent.
            self._end_round(latch, synced and failure is None, target)
            raise
        if failure is not None:
            with self._lock:
                raise self._poison(failure) from failure
        if synced:
            with self._lock:
                self._check_still_there()

    def _end_round(self, latch: LockType, synced: bool, target: int) -> None:
        """The leader's end of a round, safe to repeat: only a sync that returned makes
        anything durable; an interrupted one leaves it for a later sync to cover."""
        with self._lock:
            if self._latch is not latch:
                return  # not ours, or a later round already began
            if synced:
                self._durable_seq = max(self._durable_seq, target)
                self._pending = [s for s in self._pending if s > target]
            self._syncing = False
            if latch.locked():
                latch.release()
            self._cond.notify_all()

    def _follow(self, latch: LockType) -> None:
        """Wait for the round of `latch` to end. An interrupt right after a follower took the
        latch leaves it taken; the others then see the round is over by polling."""
        while not latch.acquire(timeout=0.05):
            if not (self._syncing and self._latch is latch):
                return
        latch.release()

    def sync(self) -> None:
        """Make every record appended so far durable, whatever the sync mode."""
        with self._lock:
            self._ready()
            target = self._next_seq - 1
        if target > self._durable_seq:
            self._wait_durable(target)

    def _poison(self, exc: OSError) -> PoisonedError:
        """Refuse all further work: after a failed write or fsync the file's state is unknown,
        and a retried fsync may report success for pages the kernel already dropped."""
        failure = io_failure(self._dir, exc, "writing")
        self._set_poison(exc)
        return failure

    def _poison_interrupted(self, why: str) -> None:
        self._set_poison(PoisonedError(f"{self._dir}: {why}; reopen to recover"))

    def _set_poison(self, cause: BaseException) -> None:
        if self._poisoned is None:
            self._poisoned = cause
        self._unusable = True
        self._cond.notify_all()

    def _ready(self) -> None:
        """With the lock held, before a write: raise unless the handle may write now."""
        if self._unusable:
            self._check_usable()

    def _check_usable(self) -> None:
        if self._read_only:
            raise WaljError("log was opened with recovery='salvage', which is read-only")
        if self._closed:
            raise ClosedError("log is closed")
        if self._forked:
            raise PoisonedError(f"{self._dir} was opened for writing by the parent of this "
                                "forked process; a child cannot write to it")
        if self._poisoned is not None:
            raise PoisonedError(
                f"log is poisoned by an earlier failure ({self._poisoned}); reopen to recover")
        self._finish_rotation()

    def _finish_rotation(self) -> None:
        raise NotImplementedError


def interval_loop(ref: weakref.ReferenceType[Any], stop: threading.Event,
                  interval: float) -> None:
    """The background syncer of sync="interval". It holds the log weakly, so a log dropped
    without close() is still collected (and closed by its finalizer)."""
    while not stop.wait(interval):
        log = ref()
        if log is None:
            return
        try:
            if not log._closed and log._next_seq - 1 > log._durable_seq:
                log._wait_durable(log._next_seq - 1)
        except WaljError:
            return  # poisoned or closed: close() and appenders report it
        finally:
            del log
