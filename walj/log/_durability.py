"""Durability: the writer's shared state, what a failed write or sync or an interrupt does to
it (it poisons the handle, or leaves it usable), and the interval syncs' loop (a sync per write
and group commit are in _group.py)."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import threading
import weakref
from collections.abc import Callable
from typing import Any, Protocol

from ..errors import ClosedError, DiskFullError, PoisonedError, WaljError
from .fs import FileSystem, write_all


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

    def settle_interrupted_write(self, offset: int, records: int, first_seq: int, data: bytes,
                                 count: int, rehash: Callable[[int], Any]) -> None:
        """An interrupt inside a write of `count` records from `first_seq` at `offset`: the
        bytes there say whether it landed. All of them: count them (unacknowledged, like a
        crash's), rehashing the segment from the file with `rehash`, since the interrupt may
        have come before or after the running hash took them. Zeros: nothing changed. Part of
        them: poison, for a reopen to cut the torn line."""
        if not self.landed(offset, data, "a write"):
            return
        try:
            digest = rehash(offset + len(data))
        except OSError as exc:
            self.poison(exc)
            return
        self.digest, self.digest_update = digest, digest.update
        self.offset = offset + len(data)
        self.allocated = max(self.allocated, self.offset)
        self.records = records + count
        self.next_seq = first_seq + count

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
            if self.fs.link_count(self.fd) == 0:
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
