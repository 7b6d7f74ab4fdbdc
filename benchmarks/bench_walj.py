"""walj's side of the write figures: append per sync mode, group commit, durable tool dispatch."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from bench_baselines import run_threads
from bench_core import Measure, Sample, Skip, make_record, timed_loop


def log_missing(walj: ModuleType | None) -> str | None:
    """Why the walj log figures cannot run, or None when they can."""
    if walj is None:
        return "walj not importable"
    if not hasattr(walj, "Log"):
        return "walj.Log not available yet"
    return None


def journal_missing(walj: ModuleType | None) -> str | None:
    """Why the journal figures cannot run, or None when they can."""
    if walj is None:
        return "walj not importable"
    if not hasattr(walj, "ToolJournal"):
        return "journal not available"
    return None


# --- counting the syncs walj really makes ----------------------------------------------------
# walj makes every file-system call through one object (walj/log/fs.py), which Log.open takes as
# `_fs`. A subclass counts the calls and passes each on unchanged, so the counts are of the
# fdatasync (F_FULLFSYNC on macOS) and directory fsync calls walj makes, not an estimate.


class Counts:
    """Calls counted by a counting file system, safe to bump from many threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.syncs = 0  # data syncs of a segment: fdatasync / F_FULLFSYNC
        self.dir_syncs = 0  # fsyncs of the log directory
        self.writes = 0  # write calls (only when asked to count them)

    def bump(self, name: str) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + 1)

    def snapshot(self) -> tuple[int, int, int]:
        with self._lock:
            return self.syncs, self.dir_syncs, self.writes


def counting_fs(
    count_writes: bool = False, null_sync: bool = False
) -> tuple[Any, Counts] | None:
    """(a walj FileSystem that counts its sync calls, the counts), or None if walj has none.

    With `null_sync` the syncs are counted and not made: for the figures that measure the
    Python around the fsyncs (the durability of those runs is not the point, nor claimed).
    """
    try:
        from walj.log.fs import FileSystem
    except ImportError:
        return None
    counts = Counts()

    class CountingFS(FileSystem):
        def sync(self, fd: int) -> None:
            counts.bump("syncs")
            if not null_sync:
                super().sync(fd)

        def sync_dir(self, path: str) -> None:
            counts.bump("dir_syncs")
            if not null_sync:
                super().sync_dir(path)

    if count_writes:

        class CountingWritesFS(CountingFS):
            def write(self, fd: int, data: bytes) -> int:
                counts.bump("writes")
                return super().write(fd, data)

            def pwrite(self, fd: int, data: bytes, offset: int) -> int:
                counts.bump("writes")
                return super().pwrite(fd, data, offset)

        return CountingWritesFS(), counts
    return CountingFS(), counts


def fs_options(counted: tuple[Any, Counts] | None) -> dict[str, Any]:
    return {} if counted is None else {"_fs": counted[0]}


def record_counts(
    sample: Sample, counted: tuple[Any, Counts] | None, before: tuple[int, int, int]
) -> Sample:
    """Put the syncs (and writes) made while `sample` ran into its extras, per operation."""
    if counted is None or not sample.ops:
        return sample
    syncs, dir_syncs, writes = (a - b for a, b in zip(counted[1].snapshot(), before, strict=True))
    total = syncs + dir_syncs
    sample.extra["fsyncs_per_op"] = total / sample.ops
    sample.extra["fsyncs_per_s"] = total / sample.seconds if sample.seconds else 0.0
    if total:
        sample.extra["records_per_fsync"] = sample.ops / total
    if writes:
        sample.extra["writes_per_op"] = writes / sample.ops
    return sample


def _start(counted: tuple[Any, Counts] | None) -> tuple[int, int, int]:
    return counted[1].snapshot() if counted is not None else (0, 0, 0)


# --- the figures -----------------------------------------------------------------------------


def append(walj: ModuleType | None, duration: float, sync: str) -> Measure | str:
    """One log.append of the ~200-byte record per op, on a fresh log, in one sync mode."""
    missing = log_missing(walj)
    if missing or walj is None:
        return missing or "walj not importable"
    wal = walj

    def measure(d: Path) -> Sample:
        counted = counting_fs() if sync in ("always", "batch") else None
        log = wal.Log.open(d / "log", sync=sync, **fs_options(counted))
        try:
            app = log.append
            before = _start(counted)
            sample = timed_loop(lambda i: app(make_record(i)), duration)
            return record_counts(sample, counted, before)
        finally:
            log.close()

    return measure


def append_many(walj: ModuleType | None, duration: float, batch: int) -> Measure | str:
    """One log.append_many of `batch` records per op, sync="never"; the rate in records/s."""
    missing = log_missing(walj)
    if missing or walj is None:
        return missing or "walj not importable"
    wal = walj

    def measure(d: Path) -> Sample:
        log = wal.Log.open(d / "log", sync="never")
        try:
            many = log.append_many
            sample = timed_loop(
                lambda i: many([make_record(i * batch + k) for k in range(batch)]),
                duration, latencies=False)
        finally:
            log.close()
        sample.ops *= batch
        sample.value *= batch
        return sample

    return measure


def pair_append(walj: ModuleType | None, duration: float) -> Measure | str:
    """Two log.append calls per op, sync="always" with the syncs counted and not made: the
    log's part of a dispatch without its fsyncs."""
    missing = log_missing(walj)
    if missing or walj is None:
        return missing or "walj not importable"
    wal = walj

    def measure(d: Path) -> Sample:
        counted = counting_fs(count_writes=True, null_sync=True)
        if counted is None:
            raise Skip("walj has no file-system seam (walj.log.fs) to leave the syncs out")
        log = wal.Log.open(d / "log", sync="always", **fs_options(counted))
        try:
            app = log.append

            def op(i: int) -> None:
                app(make_record(2 * i))
                app(make_record(2 * i + 1))

            before = _start(counted)
            return record_counts(timed_loop(op, duration), counted, before)
        finally:
            log.close()

    return measure


def group_commit(walj: ModuleType | None, duration: float, n_threads: int) -> Measure | str:
    """n threads appending to one log with sync="batch": each append returns once durable."""
    missing = log_missing(walj)
    if missing or walj is None:
        return missing or "walj not importable"
    wal = walj

    def measure(d: Path) -> Sample:
        counted = counting_fs()
        log = wal.Log.open(d / "log", sync="batch", **fs_options(counted))
        try:
            app = log.append

            def make_op(_k: int) -> tuple[Callable[[int], object], Callable[[], None]]:
                return (lambda i: app(make_record(i))), (lambda: None)

            before = _start(counted)
            return record_counts(run_threads(n_threads, duration, make_op), counted, before)
        finally:
            log.close()

    return measure


def _noop(**_kwargs: Any) -> None:
    return None


def dispatch(walj: ModuleType | None, duration: float, null_sync: bool = False) -> Measure | str:
    """Durable dispatch (sync="always") of a no-op tool inside one turn: intent record, handler,
    terminal record, each fsynced; the syncs and writes are counted. With `null_sync` the syncs
    are counted and not made (the journal fsyncs an intent whatever the sync mode)."""
    missing = journal_missing(walj)
    if missing or walj is None:
        return missing or "walj not importable"
    wal = walj

    def measure(d: Path) -> Sample:
        counted = counting_fs(count_writes=True, null_sync=null_sync)
        if counted is None and null_sync:
            raise Skip("walj has no file-system seam (walj.log.fs) to leave the syncs out")
        journal = wal.ToolJournal.open(
            d / "journal", tools={"noop": _noop}, sync="always", **fs_options(counted)
        )
        try:
            with journal.turn() as turn:

                def op(i: int) -> None:
                    result = turn.dispatch("noop", {"x": i})
                    if i == 0 and getattr(result, "outcome", "ok") != "ok":
                        raise RuntimeError(f"no-op dispatch did not succeed: {result!r}")

                before = _start(counted)
                return record_counts(timed_loop(op, duration), counted, before)
        finally:
            journal.close()

    return measure
