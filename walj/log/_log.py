"""The writer: appends records to one log directory, rotating and sealing its segments."""

from __future__ import annotations

import os
import threading
import warnings
import weakref
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

from .._batch import encode_dicts
from .._codec import encode as _encode_value
from ..errors import PoisonedError, RecordTooLargeError
from ._commits import check_commit
from ._compaction import Compaction
from ._durability import WriterState, io_failure
from ._group import Commit
from ._opening import Replay, ReplayStart, check_options, prepare_directory, recover
from ._rotation import Rotation
from ._syncers import Syncer, start_syncer
from .format import check_encoded, encode_record, frame_record, frame_records
from .fs import DEFAULT_FS, FileSystem, pwrite_all
from .lock import WriterLock, forget_open_directories
from .quarantine import CutLine, Quarantined, cut_lines, read_manifest
from .segment import Problem

_open_logs: weakref.WeakSet[Log] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # The child shares the parent's file descriptors and lock: two writers would both
    # acknowledge the same seqs. Every log open in the parent refuses work in the child.
    for log in list(_open_logs):
        log._state.forked = True
        log._state.unusable = True
    forget_open_directories()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class Log:
    """An open write-ahead log. Use `Log.open`; a `Log` is a context manager.

    It writes records itself and composes its parts, each holding the WriterState they share
    and nothing of the Log: Commit (when a record is durable), Rotation (the active segment)
    and Compaction (where the log begins).

    Interrupt safety: an exception (KeyboardInterrupt, SystemExit) landing anywhere inside a
    call leaves the handle either usable, with exactly the records the file holds counted, or
    poisoned. A write it interrupted is settled from the bytes at its offset; a rotation it
    interrupted after the seal reached the file is finished by the next call.
    """

    def __init__(self, directory: str, fs: FileSystem, sync: str, segment_bytes: int,
                 max_record_bytes: int, read_only: bool) -> None:
        self._state = state = WriterState(directory, fs, read_only)
        self._commit = Commit(state)
        self._rotation = Rotation(state, max_record_bytes, segment_bytes)
        self._compaction = Compaction(state, self._rotation.ready)
        self._os_pwrite = fs.pwrite
        self._mode = sync
        self._always = sync == "always"
        self._batch = sync == "batch"
        self._segment_bytes = segment_bytes
        self._max_record = max_record_bytes
        self._writer_id: str | None = None
        self._stop = threading.Event()
        self._syncer: Syncer | None = None
        # Set while the log holds its descriptor and lock (see _close_abandoned).
        self._finalizer: weakref.finalize[[dict[str, Any], str], Log] | None = None
        self.problems: list[Problem] = []
        self.torn_tail: Quarantined | None = None

    # --- opening -------------------------------------------------------------------------------

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, sync: str = "always",
             segment_bytes: int = 64 * 2**20, max_record_bytes: int = 2**20,
             recovery: str = "tolerate_tail", lock_timeout: float = 0.0,
             sync_interval_ms: float = 100, commit: str | None = None,
             _fs: FileSystem | None = None,
             _replay: Replay | None = None, _replay_start: ReplayStart | None = None) -> Log:
        """Open (creating if needed) the log in directory `path`; see docs/FORMAT.md. `commit`
        overrides the process's commit mode (walj.set_commit_mode) for this log."""
        check_options(sync, segment_bytes, max_record_bytes, recovery, lock_timeout,
                      sync_interval_ms)
        check_commit(commit)
        fs = _fs or DEFAULT_FS
        directory = os.fspath(path)
        read_only = recovery == "salvage"
        log = cls(directory, fs, sync, segment_bytes, max_record_bytes, read_only)
        log._commit.mode = commit
        try:
            prepare_directory(fs, directory, create=not read_only)
            if not read_only:
                log._state.writer_lock = lock = WriterLock(fs, directory, lock_timeout)
                log._writer_id = lock.writer_id
            log._recover(recovery, _replay, _replay_start)
            if sync == "interval" and not read_only:
                # A pooled worker, not a Thread of its own: see walj/log/_syncers.py.
                log._syncer = start_syncer(weakref.ref(log), log._stop,
                                           sync_interval_ms / 1000.0)
            _open_logs.add(log)
            if not read_only:
                log._finalizer = weakref.finalize(log, _close_abandoned, log.__dict__,
                                                  f"<walj.Log {directory!r}>")
            return log
        except OSError as exc:
            log._abandon()
            raise io_failure(directory, exc, "opening") from exc
        except BaseException:
            log._abandon()
            raise

    def _abandon(self) -> None:
        """A failed open: release what was taken; there is nothing to sync."""
        self._state.closed = self._state.unusable = True
        self._stop.set()
        self._state.release()
        self._forget_finalizers()

    def _forget_finalizers(self) -> None:
        """Once released, collecting this log must run no Python code at all: CPython drops a
        KeyboardInterrupt that a real SIGINT raises in a finalizer or a weak reference's
        callback. So the finalizer is detached and the log leaves the fork table (a WeakSet,
        whose entry's callback would run when the log is freed). Idempotent."""
        finalizer = self._finalizer
        if finalizer is not None:
            finalizer.detach()
        _open_logs.discard(self)

    def _recover(self, recovery: str, replay: Replay | None,
                 start: ReplayStart | None) -> None:
        st = self._state
        found = recover(st.fs, st.dir, recovery, replay, writable=not st.read_only,
                        start=start)
        self.problems = found.problems
        self.torn_tail = found.torn_tail
        st.log_id = found.log_id
        self._compaction.first_seq = found.first_seq
        if st.read_only:
            st.next_seq = found.last_seq + 1
            st.closed = st.unusable = True  # nothing to write; reads go through walj.read
            return
        self._rotation.resume(found.last)

    # --- writing -------------------------------------------------------------------------------

    def append(self, record: dict[str, Any], *, durable: bool = False) -> int:
        """Append one record and return its seq. Durable on return when sync is "always" or
        "batch", or when `durable=True` whatever the sync mode."""
        return self._append_data(self._encode(record), durable)

    def append_encoded(self, *data: bytes, durable: bool = False) -> int:
        """As `append`, for records already encoded, and the seq of the last: each of `data` is
        exactly what `walj.log.format.encode_record` returned for one record (a caller that
        needs the bytes itself encodes once). Several go in one write, with at most one sync
        (plus a rotation's own). Only the framing's own needs are checked here: each one JSON
        object on one line, within max_record_bytes (SerializationError, RecordTooLargeError;
        nothing written)."""
        check_encoded(data, self._max_record)
        return self._append_data(data[0] if len(data) == 1 else data, durable)

    def _append_data(self, data: bytes | tuple[bytes, ...], durable: bool) -> int:
        if not self._batch:
            return self._append_one(data, durable)
        commit, counted = self._commit, False
        try:
            # Counted in, so that a group sync can wait for the appenders still writing.
            with self._state.lock:
                commit.appenders += 1; counted = True  # noqa: E702 - one line: no interrupt
            return self._append_one(data, True)
        finally:
            if counted:
                with self._state.lock:
                    commit.appenders -= 1
                    commit.wake_gatherer()

    def _append_one(self, data: bytes | tuple[bytes, ...], durable: bool) -> int:
        """One record's bytes, or a tuple of records' bytes written with one write."""
        st = self._state
        with st.lock:
            if st.unusable:
                self._rotation.ready()
            seq = st.next_seq
            if isinstance(data, bytes):
                self._write(frame_record(seq, data), seq, 1)
            else:
                self._write(frame_records(seq, data), seq, len(data))
                seq += len(data) - 1
        if durable and seq > st.durable_seq:
            self._commit.wait_durable(seq)
        return seq

    def append_many(self, records: Iterable[dict[str, Any]], *,
                    durable: bool = False) -> list[int]:
        """Append records with one write and at most one fsync (plus a rotation's own)."""
        batch = records if type(records) is list else list(records)
        # The whole batch checked and encoded at once; anything amiss, one by one, which
        # raises for the first record that is refused, as ever. Nothing is written then.
        datas = encode_dicts(batch)
        if datas is None or (datas and max(map(len, datas)) > self._max_record):
            datas = [self._encode(record) for record in batch]
        if not datas:
            return []
        last = self._append_data(datas[0] if len(datas) == 1 else tuple(datas), durable)
        return list(range(last - len(datas) + 1, last + 1))

    def sync(self) -> None:
        """Make every record appended so far durable, whatever the sync mode."""
        st = self._state
        with st.lock:
            self._rotation.ready()
            target = st.next_seq - 1
        if target > st.durable_seq:
            self._commit.wait_durable(target)

    def rotate(self) -> None:
        """Seal the active segment (the seal synced, which makes every record in it durable)
        and start the next, so the next record appended begins a segment. Does nothing when
        the active segment holds no record yet. Raises as an append would."""
        with self._state.lock:
            self._rotation.ready()
            if self._state.records:
                self._rotation.rotate(force=True)

    def _encode(self, record: dict[str, Any]) -> bytes:
        # An exact dict goes straight to the encoder: the commonest record, the hot path.
        data = _encode_value(record) if type(record) is dict else encode_record(record)
        if len(data) > self._max_record:
            raise self._too_large(data)
        return data

    def _too_large(self, data: bytes) -> RecordTooLargeError:
        return RecordTooLargeError(
            f"record is {len(data)} bytes; max_record_bytes is {self._max_record}")

    def _write(self, data: bytes, first_seq: int, count: int) -> None:
        """With the lock held: one write of `count` framed records from `first_seq` at the end
        of the data (into the zeros written ahead; with the next chunk of zeros after it when
        it would pass them), then rotate or sync. The counters are set from values taken
        before the write, so setting them twice is harmless, and an interrupt is settled from
        the bytes written."""
        st = self._state
        st.check_lock()
        offset, records = st.offset, st.records
        end = offset + len(data)
        try:
            if end > st.allocated:
                self._rotation.extend(data, offset)
            else:
                written = self._os_pwrite(st.fd, data, offset)
                if written != len(data):
                    pwrite_all(st.fs, st.fd, data[written:], offset + written)
            st.digest_update(data)
            st.offset = end
            st.records = records + count
            st.next_seq = first_seq + count
        except OSError as exc:
            raise st.poison(exc) from exc
        except BaseException:
            st.settle_interrupted_write(offset, records, first_seq, data, count,
                                        self._rotation.rehash)
            raise
        if end >= self._segment_bytes:
            self._rotation.rotate()
        elif self._always:
            self._commit.sync_locked()

    def segments(self) -> list[tuple[str, int]]:
        """The log's segment files from its base on, oldest first, each with its first seq
        (from its header; a segment whose header does not verify ends the list)."""
        return self._compaction.segments()

    def drop_before(self, seq: int) -> int:
        """Delete every sealed segment whose records all come before `seq`, and return how
        many segment files this call removed (leftovers of an interrupted drop included).

        The active segment is never dropped, so records from the active segment's first seq
        on always stay; `seq` inside a segment keeps that whole segment. `seq` may be at most
        `last_seq + 1`. Readers then start at the first kept segment (see docs/FORMAT.md,
        *Compaction*). Raises TypeError or ValueError for a bad `seq`, ClosedError or
        PoisonedError as an append would, CorruptionError (nothing deleted) when the segments
        to drop do not chain to the ones kept; an I/O failure poisons the handle.
        """
        return self._compaction.drop_before(seq)

    # --- failure and closing -------------------------------------------------------------------

    def close(self, *, seal: bool = False) -> None:
        """Sync what was appended (in every sync mode), then release the directory; with
        `seal`, seal the active segment first (and open no next one). Raises
        PoisonedError (once) if an earlier failure or interrupt poisoned the handle, since
        records it acknowledged as written may not be durable. If an interrupt stops it, the
        handle is still open (usable) or closed but not yet released: call close() again."""
        self._stop.set()
        syncer = self._syncer
        if syncer is not None:
            syncer.join()  # returns at once inside the syncer (a finalizer may close there)
        if not self._state.forked:  # a forked child only lets go of the parent's descriptors
            with self._compaction.drop_lock:  # a drop under way ends before the release
                # A closed log holds no preallocated space; a failed trim poisons.
                trim_failure = self._rotation.trim_for_close()
                self._commit.close(self._rotation.seal_for_close if seal else None)
                if trim_failure is not None:
                    self._commit.close_failure = trim_failure  # typed: DiskFullError too
                self._state.release()
        self._state.release()  # idempotent
        self._forget_finalizers()
        failure, self._commit.close_failure = self._commit.close_failure, None
        if failure is not None:
            raise failure

    def __enter__(self) -> Log:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            self.close()
        except PoisonedError:
            if exc is None:
                raise  # else the exception in flight (often the cause) goes on unmasked

    # --- what it is ----------------------------------------------------------------------------

    @property
    def path(self) -> Path:
        return Path(self._state.dir)

    @property
    def log_id(self) -> str:
        return self._state.log_id

    @property
    def first_seq(self) -> int:
        """The seq the log now begins at: 1, or, once `drop_before` dropped segments, the
        first seq of the first kept segment (its base)."""
        return self._compaction.first_seq

    @property
    def writer_id(self) -> str | None:
        """This open's identity as the log's writer: 16 random hex digits, made when it took
        the lock and written to LOCK.owner beside its pid (None for a read-only handle). A
        record that carries it says which open wrote it, so that a reader can tell whether
        that writer still holds the log (docs/FORMAT.md, *Files in a log directory*)."""
        return self._writer_id

    def quarantined(self) -> list[Quarantined]:
        """Every cut into quarantine/ its manifest records, oldest first (recovery's and
        `walj repair`'s alike)."""
        return read_manifest(self._state.dir)

    def cut_lines(self, entry: Quarantined) -> tuple[list[CutLine], bool]:
        """The records among a cut's bytes whose checksums still verify, and whether the
        quarantine file holds exactly the bytes its manifest line describes."""
        return cut_lines(self._state.dir, entry)

    @property
    def last_seq(self) -> int:
        """The seq of the last record appended (0 for an empty log)."""
        return self._state.next_seq - 1

    @property
    def durable_seq(self) -> int:
        return self._state.durable_seq

    @property
    def closed(self) -> bool:
        return self._state.closed

    @property
    def poisoned(self) -> bool:
        """True once a failure or interrupt made the handle refuse work; reopen to recover."""
        return self._state.poisoned is not None or self._state.forked

    def __repr__(self) -> str:
        state = "closed" if self.closed else ("poisoned" if self.poisoned else "open")
        return (f"<walj.Log {self._state.dir!r} {state} last_seq={self.last_seq} "
                f"sync={self._mode!r}>")


def _close_abandoned(state: dict[str, Any], name: str) -> None:
    """The finalizer of a log dropped without close(): it must not hold its directory's lock
    and a descriptor for the life of the process, so it is closed (and synced, as close() would
    have) through a stand-in that shares its state. A finalizer, not __del__: it exists only
    while the log holds its descriptor and lock, and close() detaches it, because any code
    that runs while the collector frees an object (a __del__ runs for every closed log too) is
    where CPython drops a KeyboardInterrupt a real SIGINT raises ("Exception ignored")."""
    warnings.warn(f"unclosed {name}", ResourceWarning, stacklevel=1)
    stand_in = Log.__new__(Log)
    stand_in.__dict__ = state
    try:
        stand_in.close()
    except Exception:  # noqa: S110 - a finalizer has nobody to report to
        pass
