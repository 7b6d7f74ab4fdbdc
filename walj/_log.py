"""The writer: appends records to one log directory, rotating and sealing its segments."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

from . import _format as fmt
from ._durability import Durability
from ._format import encode_record, frame_record
from ._fs import DEFAULT_FS, FileSystem, write_all
from ._lock import WriterLock
from ._opening import Replay, check_options, prepare_directory, recover
from ._quarantine import Quarantined
from ._segment import Problem, SegmentScan
from .errors import PoisonedError, RecordTooLargeError


class Log(Durability):
    """An open write-ahead log. Use `Log.open`; a `Log` is a context manager."""

    def __init__(self, directory: str, fs: FileSystem, sync: str, segment_bytes: int,
                 max_record_bytes: int, read_only: bool) -> None:
        self._dir = directory
        self._fs = fs
        self._os_write = fs.write
        self._mode = sync
        self._always = sync == "always"
        self._batch = sync == "batch"
        self._segment_bytes = segment_bytes
        self._max_record = max_record_bytes
        self._read_only = read_only
        self._init_durability()
        self._unusable = read_only
        self._writer_lock: WriterLock | None = None
        self._fd = -1
        self._index = 0
        self._offset = 0
        self._hash = hashlib.sha256()
        self._hash_update = self._hash.update
        self._segment_records = 0
        self._next_seq = 1
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
        check_options(sync, segment_bytes, max_record_bytes, recovery, lock_timeout,
                       sync_interval_ms)
        fs = _fs or DEFAULT_FS
        directory = os.fspath(path)
        read_only = recovery == "salvage"
        prepare_directory(fs, directory, create=not read_only)
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
        found = recover(self._fs, self._dir, recovery, replay, writable=not self._read_only)
        self.problems = found.problems
        self.torn_tail = found.torn_tail
        self._log_id = found.log_id
        if self._read_only:
            self._next_seq = found.last_seq + 1
            self._closed = self._unusable = True  # nothing to write; reads go through walj.read
            return
        self._resume(found.last)

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
                self._wake_gatherer()

    def _append_one(self, record: dict[str, Any], durable: bool) -> int:
        data = encode_record(record)
        if len(data) > self._max_record:
            raise self._too_large(data)
        with self._lock:
            if self._unusable:
                self._check_usable()
            seq = self._next_seq
            self._write(frame_record(seq, data), 1)
        if durable and seq > self._durable_seq:
            self._wait_durable(seq)
        return seq

    def append_many(self, records: Iterable[dict[str, Any]], *,
                    durable: bool = False) -> list[int]:
        """Append records with one write and at most one fsync (plus a rotation's own)."""
        datas = [self._encode(record) for record in records]
        if not datas:
            return []
        with self._lock:
            self._check_usable()
            first = self._next_seq
            self._write(b"".join(frame_record(first + i, d) for i, d in enumerate(datas)),
                        len(datas))
        last = first + len(datas) - 1
        if last > self._durable_seq and (durable or self._batch):
            self._wait_durable(last)
        return list(range(first, last + 1))

    def _encode(self, record: dict[str, Any]) -> bytes:
        data = encode_record(record)
        if len(data) > self._max_record:
            raise self._too_large(data)
        return data

    def _too_large(self, data: bytes) -> RecordTooLargeError:
        return RecordTooLargeError(
            f"record is {len(data)} bytes; max_record_bytes is {self._max_record}")

    def _write(self, data: bytes, count: int) -> None:
        """With the lock held: one write of `count` framed records, then rotate or sync."""
        try:
            written = self._os_write(self._fd, data)
            if written != len(data):
                write_all(self._fs, self._fd, data[written:])
        except OSError as exc:
            raise self._poison(exc) from exc
        self._offset += len(data)
        self._hash_update(data)
        self._next_seq += count
        self._segment_records += count
        if self._offset >= self._segment_bytes:
            self._rotate()
        elif self._always:
            self._sync_locked()

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

    # --- failure and closing -------------------------------------------------------------------

    def close(self) -> None:
        """Sync what was appended (in every sync mode), then release the directory."""
        self._stop.set()
        if self._syncer is not None and self._syncer is not threading.current_thread():
            self._syncer.join()
        failure: PoisonedError | None = None
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
                    failure = self._poison(exc)
                    failure.__cause__ = exc
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
            raise failure

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
    def path(self) -> Path:
        return Path(self._dir)

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
