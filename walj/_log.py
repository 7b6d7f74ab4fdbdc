"""The writer: appends to one log directory with an fsync policy, group commit and rotation."""

from __future__ import annotations

import errno
import hashlib
import os
import threading
import time
import uuid
from _thread import LockType, allocate_lock
from collections import deque
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any

from . import _format as fmt
from ._format import encode_record, frame_record
from ._fs import DEFAULT_FS, FileSystem, write_all
from ._lock import WriterLock
from ._quarantine import Quarantined, cut_segment
from ._scan import MODES, LogScan
from ._segment import Problem, SegmentScan
from .errors import (
    ClosedError,
    DiskFullError,
    PoisonedError,
    RecordTooLargeError,
    WaljError,
)

SYNC_MODES = ("always", "batch", "interval", "never")
GATHER_SECONDS = 0.001
Replay = Callable[[int, bytes], None]


def _check_options(sync: str, segment_bytes: int, max_record_bytes: int, recovery: str,
                   lock_timeout: float, sync_interval_ms: float) -> None:
    if sync not in SYNC_MODES:
        raise ValueError(f"sync must be one of {', '.join(SYNC_MODES)}, not {sync!r}")
    if recovery not in MODES:
        raise ValueError(f"recovery must be one of {', '.join(MODES)}, not {recovery!r}")
    if not 1 <= max_record_bytes <= fmt.MAX_RECORD_BYTES_LIMIT:
        raise ValueError(f"max_record_bytes must be 1..{fmt.MAX_RECORD_BYTES_LIMIT}")
    if segment_bytes < 1024:
        raise ValueError("segment_bytes must be at least 1024")
    if lock_timeout < 0 and lock_timeout != -1:
        raise ValueError("lock_timeout must be >= 0 seconds, or -1 to wait forever")
    if sync_interval_ms <= 0:
        raise ValueError("sync_interval_ms must be > 0")


def _prepare_directory(fs: FileSystem, directory: str, create: bool) -> None:
    if os.path.lexists(directory):
        if not os.path.isdir(directory):
            raise WaljError(f"{directory} exists and is not a directory")
        return
    if not create:
        raise WaljError(f"{directory} does not exist")
    parent = os.path.dirname(os.path.abspath(directory))
    os.makedirs(parent, mode=0o700, exist_ok=True)
    fs.mkdir(directory)
    fs.sync_dir(parent)


class Log:
    """An open write-ahead log. Use `Log.open`; a `Log` is a context manager."""

    def __init__(self, directory: str, fs: FileSystem, sync: str, segment_bytes: int,
                 max_record_bytes: int, read_only: bool) -> None:
        self._dir = directory
        self._fs = fs
        self._os_write = fs.write
        self._mode = sync
        self._always = sync == "always"
        self._batch = sync == "batch"
        self._unusable = read_only  # closed, poisoned or read-only: the slow check says which
        self._segment_bytes = segment_bytes
        self._max_record = max_record_bytes
        self._read_only = read_only
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._gathered = threading.Condition(self._lock)
        self._active = 0  # batch mode: appenders inside append()
        self._pending: list[int] = []  # seqs that appenders wait on and no sync has covered yet
        self._latch = allocate_lock()  # released when the sync under way is over
        self._writer_lock: WriterLock | None = None
        self._fd = -1
        self._index = 0
        self._offset = 0
        self._hash = hashlib.sha256()
        self._hash_update = self._hash.update
        self._segment_records = 0
        self._next_seq = 1
        self._durable_seq = 0
        self._syncing = False
        self._poisoned: BaseException | None = None
        self._closed = False
        self._log_id = ""
        self._stop = threading.Event()
        self._syncer: threading.Thread | None = None
        self.problems: list[Problem] = []
        self.torn_tail: Quarantined | None = None

    # --- opening -------------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        sync: str = "always",
        segment_bytes: int = 64 * 2**20,
        max_record_bytes: int = 2**20,
        recovery: str = "tolerate_tail",
        lock_timeout: float = 0.0,
        sync_interval_ms: float = 100,
        _fs: FileSystem | None = None,
        _replay: Replay | None = None,
    ) -> Log:
        """Open (creating if needed) the log in directory `path`; see docs/FORMAT.md."""
        _check_options(sync, segment_bytes, max_record_bytes, recovery, lock_timeout,
                       sync_interval_ms)
        fs = _fs or DEFAULT_FS
        directory = os.fspath(path)
        read_only = recovery == "salvage"
        _prepare_directory(fs, directory, create=not read_only)
        log = cls(directory, fs, sync, segment_bytes, max_record_bytes, read_only)
        if not read_only:
            log._writer_lock = WriterLock(fs, directory, lock_timeout)
        try:
            log._recover(recovery, _replay)
        except BaseException:
            log._release()
            raise
        if sync == "interval" and not read_only:
            log._syncer = threading.Thread(
                target=log._interval_loop, args=(sync_interval_ms / 1000.0,),
                name=f"walj-sync {directory}", daemon=True)
            log._syncer.start()
        return log

    def _recover(self, recovery: str, replay: Replay | None) -> None:
        fs, directory = self._fs, self._dir
        if not self._read_only:
            for name in fs.listdir(directory):
                if name.endswith(".jsonl.tmp") and fmt.segment_index(name[:-4]) is not None:
                    # A rotation died before its rename: the file holds a header and nothing else.
                    fs.unlink(os.path.join(directory, name))
                    fs.sync_dir(directory)
        scan = LogScan(directory, mode=recovery, fs=fs)
        if replay is None:
            deque(scan, maxlen=0)
        else:
            for seq, data in scan:
                replay(seq, data)
        self.problems = scan.problems
        self._log_id = scan.log_id or uuid.uuid4().hex
        if self._read_only:
            self._next_seq = scan.last_seq + 1
            self._closed = self._unusable = True  # nothing to write; reads go through walj.read
            return
        last = scan.last
        if scan.torn_tail is not None:
            torn = scan.torn_tail
            self.torn_tail = cut_segment(fs, directory, torn.file, torn.offset, torn.kind)
            if torn.offset == 0:
                last = scan.before_last
        self._resume(last)

    def _resume(self, last: SegmentScan | None) -> None:
        if last is None or last.header is None:
            self._create_segment(1, 1, "")
        elif last.seal is not None:
            self._next_seq = last.seal.last_seq + 1
            self._create_segment(last.header.index + 1, self._next_seq, last.seal.sha256)
        else:
            self._index = last.header.index
            self._next_seq = (last.last_seq or last.header.first_seq - 1) + 1
            self._segment_records = last.records
            self._hash = last.digest
            self._hash_update = self._hash.update
            self._offset = last.valid_end
            self._fd = self._fs.open_append(last.path)
        self._durable_seq = self._next_seq - 1

    def _create_segment(self, index: int, first_seq: int, prev_seal: str) -> None:
        """Write the header under a temporary name, sync, rename, sync the directory."""
        name = fmt.segment_name(index)
        final = os.path.join(self._dir, name)
        tmp = final + ".tmp"
        header = fmt.Header(fmt.FORMAT_VERSION, self._log_id, index, first_seq, prev_seal,
                            self._max_record, time.time())
        line = fmt.frame(header.body())
        fd = self._fs.create(tmp)
        try:
            write_all(self._fs, fd, line)
            self._fs.sync(fd)
            self._fs.rename(tmp, final)
            self._fs.sync_dir(self._dir)
        except BaseException:
            self._fs.close(fd)
            raise
        self._fd = fd
        self._index = index
        self._offset = len(line)
        self._hash = hashlib.sha256(line)
        self._hash_update = self._hash.update
        self._segment_records = 0

    # --- writing -------------------------------------------------------------------------------

    def append(self, record: dict[str, Any], *, durable: bool = False) -> int:
        """Append one record and return its seq. Durable on return when sync is "always" or
        "batch", or when `durable=True` whatever the sync mode."""
        if not self._batch:
            return self._append_one(record, durable)
        # Counted in, so that a group sync can wait for the appenders still writing.
        with self._lock:
            self._active += 1
        try:
            return self._append_one(record, True)
        finally:
            with self._lock:
                self._active -= 1
                self._gathered.notify()

    def _append_one(self, record: dict[str, Any], durable: bool) -> int:
        data = encode_record(record)
        if len(data) > self._max_record:
            raise RecordTooLargeError(
                f"record is {len(data)} bytes; max_record_bytes is {self._max_record}")
        with self._lock:
            if self._unusable:
                self._check_usable()
            seq = self._next_seq
            line = frame_record(seq, data)
            try:
                written = self._os_write(self._fd, line)
                if written != len(line):
                    write_all(self._fs, self._fd, line[written:])
            except OSError as exc:
                raise self._poison(exc) from exc
            self._offset += len(line)
            self._hash_update(line)
            self._next_seq = seq + 1
            self._segment_records += 1
            if self._offset >= self._segment_bytes:
                self._rotate()
            elif self._always:
                self._sync_locked()
        if durable and seq > self._durable_seq:
            self._wait_durable(seq)
        return seq

    def append_many(self, records: Iterable[dict[str, Any]], *,
                    durable: bool = False) -> list[int]:
        """Append records with one write and at most one fsync (plus a rotation's own)."""
        datas = [encode_record(record) for record in records]
        for data in datas:
            if len(data) > self._max_record:
                raise RecordTooLargeError(
                    f"record is {len(data)} bytes; max_record_bytes is {self._max_record}")
        if not datas:
            return []
        with self._lock:
            self._check_usable()
            first = self._next_seq
            batch = b"".join(frame_record(first + i, d) for i, d in enumerate(datas))
            self._write(batch, len(datas))
            self._after_write()
        last = first + len(datas) - 1
        if last > self._durable_seq and (durable or self._batch):
            self._wait_durable(last)
        return list(range(first, last + 1))

    def _write(self, data: bytes, count: int) -> None:
        try:
            write_all(self._fs, self._fd, data)
        except OSError as exc:
            raise self._poison(exc) from exc
        self._offset += len(data)
        self._hash.update(data)
        self._next_seq += count
        self._segment_records += count

    def _after_write(self) -> None:
        if self._offset >= self._segment_bytes:
            self._rotate()
        elif self._always:
            self._sync_locked()

    def _sync_locked(self) -> None:
        try:
            self._fs.sync(self._fd)
        except OSError as exc:
            raise self._poison(exc) from exc
        self._durable_seq = self._next_seq - 1

    def _rotate(self) -> None:
        """Seal the active segment and start the next one. Called with the lock held."""
        while self._syncing:
            self._cond.wait()
        self._check_usable()
        last_seq = self._next_seq - 1
        seal = fmt.Seal(last_seq, self._segment_records, self._hash.hexdigest())
        line = fmt.frame(seal.body())
        try:
            write_all(self._fs, self._fd, line)
            self._fs.sync(self._fd)
            self._fs.close(self._fd)
            self._fd = -1
            self._durable_seq = last_seq
            self._create_segment(self._index + 1, last_seq + 1, seal.sha256)
        except OSError as exc:
            raise self._poison(exc) from exc
        self._cond.notify_all()

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
            self._gathered.notify()
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
        try:
            self._fs.sync(fd)
        except OSError as exc:
            failure = exc
        finally:
            self._lock.acquire()
            self._syncing = False
            if failure is None:
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

    # --- failure and closing -------------------------------------------------------------------

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

    def close(self) -> None:
        """Sync what was appended (in every sync mode), then release the directory."""
        self._stop.set()
        if self._syncer is not None and self._syncer is not threading.current_thread():
            self._syncer.join()
        failure: OSError | None = None
        with self._lock:
            while self._syncing:
                self._cond.wait()
            if self._closed and self._fd < 0:
                self._release()
                return
            if self._poisoned is None and self._fd >= 0 and self._durable_seq < self._next_seq - 1:
                try:
                    self._fs.sync(self._fd)
                    self._durable_seq = self._next_seq - 1
                except OSError as exc:
                    failure = exc
                    self._poison(exc)
            self._closed = True
            self._unusable = True
            self._cond.notify_all()
            if self._fd >= 0:
                fd, self._fd = self._fd, -1
                try:
                    self._fs.close(fd)
                except OSError:
                    pass  # the data question was settled by the sync above
        self._release()
        if failure is not None:
            raise PoisonedError(f"final sync of {self._dir} failed: {failure}") from failure

    def _release(self) -> None:
        if self._fd >= 0:
            try:
                self._fs.close(self._fd)
            except OSError:
                pass
            self._fd = -1
        if self._writer_lock is not None:
            lock, self._writer_lock = self._writer_lock, None
            lock.release()

    def __enter__(self) -> Log:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # --- what it is ----------------------------------------------------------------------------

    @property
    def path(self) -> str:
        return self._dir

    @property
    def log_id(self) -> str:
        return self._log_id

    @property
    def last_seq(self) -> int:
        """The seq of the last record appended (0 for an empty log)."""
        return self._next_seq - 1

    @property
    def durable_seq(self) -> int:
        return self._durable_seq

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("poisoned" if self._poisoned else "open")
        return f"<walj.Log {self._dir!r} {state} last_seq={self.last_seq} sync={self._mode!r}>"
