"""Durability: the writer's shared state, what a failed write or sync or an interrupt does to
it (it poisons the handle, or leaves it usable), and when appended bytes become durable (a
sync per write, group commit, interval syncs)."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import threading
import time
import weakref
from _thread import LockType, allocate_lock
from collections.abc import Callable
from typing import Any, Protocol

from ..errors import ClosedError, DiskFullError, PoisonedError, WaljError
from .fs import FileSystem, write_all

GATHER_SECONDS = 0.001


def io_failure(directory: str, exc: OSError, doing: str) -> PoisonedError:
    """The typed error for an OSError: DiskFullError for ENOSPC and EDQUOT."""
    if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return DiskFullError(f"disk full while {doing} {directory}: {exc}; reopen to recover")
    return PoisonedError(f"I/O failure while {doing} {directory}: {exc}; reopen to recover")


def write_then_rename(fs: FileSystem, tmp: str, final: str, data: bytes, *,
                      sync: bool) -> None:
    """`data` written whole to `tmp` (synced with `sync`), then renamed over `final`, so a
    reader finds the old file or the new one, never part of it; `tmp` is removed on failure."""
    try:
        fd = fs.create(tmp)
        try:
            write_all(fs, fd, data)
            if sync:
                fs.sync(fd)
        finally:
            fs.close(fd)
        fs.rename(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            fs.unlink(tmp)
        raise


class WriterLock(Protocol):
    """What the state asks of the writer's lock (lock.WriterLock, which imports this module)."""
    def still_held(self) -> str | None: ...
    def release(self, *, unlock: bool = True) -> None: ...


class WriterState:
    """What the Log, its Commit, Rotation and Compaction share, guarded by `lock`: the active
    segment (`fd`, `index`, `offset`, `records`, the running SHA-256 `digest`, and
    `allocated`, where the zeros written ahead of its data end), the seq
    counters, and the flags that make the handle refuse work (`unusable` is set whenever one
    of closed, poisoned, forked, read-only or mid-rotation is, so the hot path tests one)."""

    __slots__ = ("dir", "fs", "read_only", "lock", "cond", "syncing", "writer_lock", "log_id",
                 "fd", "index", "offset", "allocated", "records", "digest", "digest_update",
                 "sealed",
                 "next_seq", "durable_seq", "poisoned", "forked", "closed", "unusable")

    def __init__(self, directory: str, fs: FileSystem, read_only: bool) -> None:
        self.dir, self.fs, self.read_only = directory, fs, read_only
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)  # rotation and close wait out a sync
        self.syncing = False  # a group sync is under way
        self.writer_lock: WriterLock | None = None
        self.log_id = ""
        self.fd, self.index, self.offset, self.records = -1, 0, 0, 0  # the active segment's
        self.allocated = 0  # the active segment's bytes up to here exist: data, then zeros
        self.digest: Any = hashlib.sha256()
        self.digest_update: Any = self.digest.update
        self.sealed: tuple[int, int, str] | None = None  # (index, last seq, sha256) mid-rotation
        self.next_seq, self.durable_seq = 1, 0
        self.poisoned: BaseException | None = None
        self.forked = self.closed = False
        self.unusable = read_only

    def landed(self, offset: int, data: bytes, what: str) -> bool:
        """After an interrupt in `what`, a write of `data` at `offset` into the active segment:
        its bytes say whether it landed (its size does not, as the segment is preallocated).
        True when they read back whole; False when the range holds only zeros (or lies past
        the end): nothing landed. Anything else, or a read that fails, poisons: part of it
        landed, for a reopen to cut the torn line."""
        try:
            found = self.fs.pread(self.fd, len(data), offset)
        except OSError as exc:
            self.poison(exc)
            return False
        if found == data:
            return True
        if found.count(0) != len(found):
            self.poison_interrupted(f"{what} was interrupted after part of its {len(data)} "
                                    f"bytes at offset {offset} landed")
        return False

    def check_lock(self) -> None:
        """With the lock held, before anything is written to the directory (a record, a seal,
        a segment, a base marker): poison, having written nothing, when LOCK is no longer the
        file this writer locked. Deleted or replaced, it may have let a second writer in, and a
        record written now could repeat that writer's seqs. One lstat per write call."""
        self._poison_for(self._lock_lost(), "nothing more was written, and ")

    def check_still_there(self) -> None:
        """After a sync: poison when the segment file was deleted (its directory removed under a
        live writer) or the LOCK file was deleted or replaced (a second writer may be admitted):
        records synced to a file nobody can reopen are not durable."""
        self._poison_for(self._gone(), "")

    def _gone(self) -> str | None:
        try:
            if self.fs.fstat(self.fd).st_nlink == 0:
                return "the active segment was deleted under this writer"
        except OSError as exc:
            return f"the active segment cannot be checked: {exc}"
        return self._lock_lost()

    def _lock_lost(self) -> str | None:
        lock = self.writer_lock
        return lock.still_held() if lock is not None else None

    def _poison_for(self, problem: str | None, written: str) -> None:
        """Poison and raise when a check found `problem`; `written` says what was not."""
        if problem is not None:
            failure = PoisonedError(f"{self.dir}: {problem}; {written}records after seq "
                                    f"{self.durable_seq} may be lost")
            self.set_poison(failure)
            raise failure

    def poison(self, exc: OSError) -> PoisonedError:
        """Refuse all further work: after a failed write or fsync the file's state is unknown,
        and a retried fsync may report success for pages the kernel already dropped."""
        failure = io_failure(self.dir, exc, "writing")
        self.set_poison(exc)
        return failure

    def poison_interrupted(self, why: str) -> None:
        self.set_poison(PoisonedError(f"{self.dir}: {why}; reopen to recover"))

    def set_poison(self, cause: BaseException) -> None:
        if self.poisoned is None:
            self.poisoned = cause
        self.unusable = True
        self.cond.notify_all()

    def check_usable(self) -> None:
        """Raise the reason the handle may not write, if it is closed, forked or poisoned."""
        if self.read_only:
            raise WaljError("log was opened with recovery='salvage', which is read-only")
        if self.closed:
            raise ClosedError("log is closed")
        if self.forked:
            raise PoisonedError(f"{self.dir} was opened for writing by the parent of this "
                                "forked process; a child cannot write to it")
        if self.poisoned is not None:
            raise PoisonedError(
                f"log is poisoned by an earlier failure ({self.poisoned}); reopen to recover")

    def release(self) -> None:
        """Let go of the active segment's descriptor and the writer's lock. Idempotent, and
        finished even when an interrupt stops it."""
        try:
            self._release_steps()
        except BaseException:
            self._release_steps()  # an interrupt stopped it: finish, then let it go on
            raise

    def _release_steps(self) -> None:
        """The descriptor is detached before it is closed: an interrupt between the two leaks
        it, and never makes a later step close another file's."""
        fd = self.fd
        if fd >= 0:
            self.fd = -1
            try:
                self.fs.close(fd)
            except OSError:
                pass  # the data question was settled by the sync in close()
        lock = self.writer_lock
        if lock is not None:
            lock.release(unlock=not self.forked)
            self.writer_lock = None


class Commit:
    """Syncs the active segment of a WriterState: with the lock held after each write
    (sync="always"), or as a group commit, where the first waiter syncs for every record
    written so far and the others wait on that round's latch. The writer counts its batch
    appenders in `appenders`, so that a round can gather them first.

    Interrupts (KeyboardInterrupt, SystemExit) may land between any two lines. Every shared
    field a sync round sets is reset by the code that set it, in a `finally` that checks the
    fields themselves rather than a local flag an interrupt could leave unset.
    """

    __slots__ = ("_state", "_gathered", "appenders", "_pending", "_latch", "close_failure")

    def __init__(self, state: WriterState) -> None:
        self._state = state
        self._gathered = threading.Condition(state.lock)
        self.appenders = 0  # batch mode: appenders inside append()
        self._pending: list[int] = []  # seqs that appenders wait on and no sync has covered yet
        self._latch = allocate_lock()  # released when the sync under way is over
        self.close_failure: PoisonedError | None = None  # for Log.close() to raise, once

    def sync_locked(self) -> None:
        """With the lock held: sync the active segment (sync="always")."""
        st = self._state
        target = st.next_seq - 1
        try:
            st.fs.sync(st.fd)
        except OSError as exc:
            raise st.poison(exc) from exc
        st.check_still_there()
        st.durable_seq = target

    def close(self, seal: Callable[[], None] | None) -> None:
        """Make what was appended durable (through `seal`, when given) and mark the state
        closed. A failure, or an earlier poisoning, is left in `close_failure`."""
        st = self._state
        with st.lock:
            while st.syncing:
                st.cond.wait()
            if st.closed:
                return
            if st.poisoned is not None:
                self.close_failure = PoisonedError(
                    f"{st.dir} was poisoned ({st.poisoned}); records after seq "
                    f"{st.durable_seq} may not be durable")
            elif seal is not None and st.fd >= 0:
                try:
                    seal()
                except PoisonedError as exc:
                    self.close_failure = exc
            elif st.fd >= 0 and st.durable_seq < st.next_seq - 1:
                try:
                    st.fs.sync(st.fd)
                    st.durable_seq = st.next_seq - 1
                except OSError as exc:
                    self.close_failure = st.poison(exc)
                    self.close_failure.__cause__ = exc
            st.closed = st.unusable = True
            st.cond.notify_all()

    def catch_up(self) -> None:
        """Make every record written so far durable, unless the log is closed (an interval)."""
        st = self._state
        if not st.closed and st.next_seq - 1 > st.durable_seq:
            self.wait_durable(st.next_seq - 1)

    def wake_gatherer(self) -> None:
        """With the lock held: wake a gathering leader only once it has nothing left to wait
        for, since every needless wake-up is a thread switch on the hot path."""
        if self._state.syncing and self.appenders <= len(self._pending):
            self._gathered.notify()

    def _gather(self) -> None:
        """Before a group sync, wait (briefly) until every appender inside `append` is waiting on
        a record no sync has covered: those still writing, and those a sync just released that
        loop straight back, then share this sync instead of alternating batches of one and many.
        """
        deadline = 0.0
        while self.appenders > len(self._pending):
            now = time.monotonic()
            if not deadline:
                deadline = now + GATHER_SECONDS
            elif now >= deadline:
                return
            self._gathered.wait(deadline - now)

    def wait_durable(self, seq: int) -> None:
        """Group commit: the first waiter syncs for everyone written so far; the others wait
        on that round's latch, a plain lock the leader releases when its sync is over, so
        waking them costs no trip through the log's lock."""
        st = self._state
        try:
            with st.lock:
                self._pending.append(seq)
                self.wake_gatherer()
            while st.durable_seq < seq:
                self._sync_round(seq)
        finally:
            if st.durable_seq < seq:  # failed or interrupted: no leader will prune it
                with st.lock:
                    if seq in self._pending:
                        self._pending.remove(seq)

    def _sync_round(self, seq: int) -> None:
        """Lead one sync, or wait for the one under way."""
        st = self._state
        latch = allocate_lock()  # ours if we lead: `_latch is latch` says so, whatever happens
        follow: LockType | None = None
        target, fd, synced = 0, -1, False
        failure: OSError | None = None
        try:
            with st.lock:
                if st.durable_seq >= seq:
                    return
                if st.poisoned is not None:
                    raise PoisonedError(f"log is poisoned: {st.poisoned}")
                if st.syncing:
                    follow = self._latch
                else:
                    if st.closed:
                        raise ClosedError("log is closed")
                    latch.acquire()
                    self._latch = latch
                    st.syncing = True
                    self._gather()
                    target, fd = st.next_seq - 1, st.fd
            if follow is not None:
                self._follow(follow)
                return
            try:
                st.fs.sync(fd)
                synced = True
            except OSError as exc:
                failure = exc
            self._end_round(latch, synced and failure is None, target)
        except BaseException:
            # Here too when the first _end_round was interrupted half way: it is idempotent.
            self._end_round(latch, synced and failure is None, target)
            raise
        if failure is not None:
            with st.lock:
                raise st.poison(failure) from failure
        if synced:
            with st.lock:
                st.check_still_there()

    def _end_round(self, latch: LockType, synced: bool, target: int) -> None:
        """The leader's end of a round, safe to repeat: only a sync that returned makes
        anything durable; an interrupted one leaves it for a later sync to cover."""
        st = self._state
        with st.lock:
            if self._latch is not latch:
                return  # not ours, or a later round already began
            if synced:
                st.durable_seq = max(st.durable_seq, target)
                self._pending = [s for s in self._pending if s > target]
            st.syncing = False
            if latch.locked():
                latch.release()
            st.cond.notify_all()

    def _follow(self, latch: LockType) -> None:
        """Wait for the round of `latch` to end. An interrupt right after a follower took the
        latch leaves it taken; the others then see the round is over by polling."""
        while not latch.acquire(timeout=0.05):
            if not (self._state.syncing and self._latch is latch):
                return
        latch.release()


def interval_loop(ref: weakref.ReferenceType[Any], stop: threading.Event,
                  interval: float) -> None:
    """The background syncer of sync="interval". It holds the log weakly, so a log dropped
    without close() is still collected (and closed by its finalizer)."""
    while not stop.wait(interval):
        log = ref()
        if log is None:
            return
        try:
            log._commit.catch_up()
        except WaljError:
            return  # poisoned or closed: close() and appenders report it
        finally:
            del log
