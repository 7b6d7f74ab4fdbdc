"""Physical-limit baselines: durable overwrites of preallocated space, and syncfs rounds.

An `fdatasync` after an append that grows the file also commits the inode's new size through
the file system's journal; an overwrite of space already allocated and written needs no
metadata, so `pwrite` + `fdatasync` into a zero-filled file is the fastest durable write of one
record a file system offers. `syncfs` flushes a whole file system in one call, so one call per
round can cover every file with a pending write: the limit of a process that owns its volume.

Every file here is zero-filled and synced before the first timed loop of its series and kept for
the later ones; a loop that reaches the end of its file wraps to offset 0 (still an overwrite
of allocated, written space), so the files stay small whatever the rate.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from bench_baselines import RAW_LINE, _datasync, run_threads
from bench_core import Measure, Sample, Skip, timed_loop

MiB = 1 << 20
PREALLOC_BYTES = 64 * MiB  # the single-file loop's file, written and synced once
PREALLOC_TOTAL = 16 * MiB  # shared by the files of a many-file loop
PREALLOC_MIN = 16 * 1024  # no file smaller: a wrap every ~80 records at most
ZEROS = bytes(MiB)


def zero_filled(path: Path, size: int) -> None:
    """Make `path` hold `size` zero bytes, fsynced (its directory is the caller's to sync)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        left = size
        while left > 0:
            left -= os.write(fd, ZEROS[: min(left, len(ZEROS))])
        os.fsync(fd)
    finally:
        os.close(fd)


def prepared_files(home: Path, stem: str, n: int, size: int) -> list[int]:
    """n files of `size` bytes in `home`, allocated and durable, open for writing (not
    O_APPEND: a loop writes at its own offsets). They are made once, zero-filled, and kept
    for the series' later rounds, which overwrite them again: space allocated and written
    either way, and no round pays for writing megabytes before it starts."""
    home.mkdir(parents=True, exist_ok=True)
    made = False
    fds: list[int] = []
    try:
        for k in range(n):
            path = home / f"{stem}{k}.jsonl"
            if not path.is_file() or path.stat().st_size != size:
                zero_filled(path, size)
                made = True
            fds.append(os.open(path, os.O_RDWR))
        if made:
            dfd = os.open(home, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return fds


def overwriter(fd: int, size: int) -> Callable[[], None]:
    """One durable record: pwrite of the pre-encoded line at the next offset, fdatasync."""
    sync = _datasync()
    pwrite = os.pwrite
    line = RAW_LINE
    step = len(line)
    end = size - step
    offset = [0]

    def write_one() -> None:
        at = offset[0]
        pwrite(fd, line, at)
        sync(fd)
        offset[0] = at + step if at + step <= end else 0

    return write_one


def prealloc_size(scale: float, files: int = 1) -> int:
    """Bytes per file: PREALLOC_BYTES for one file, PREALLOC_TOTAL shared among many; a
    scaled-down run preallocates in proportion (never below PREALLOC_MIN)."""
    total = PREALLOC_BYTES if files == 1 else PREALLOC_TOTAL
    return max(PREALLOC_MIN, int(total * min(1.0, scale)) // files)


def raw_prealloc(duration: float, home: Path, size: int = PREALLOC_BYTES) -> Measure:
    """pwrite of a pre-encoded line into a zero-filled file + fdatasync: one durable append
    with no metadata to commit, the file system's physical limit. The file lives in `home`."""

    def measure(_d: Path) -> Sample:
        (fd,) = prepared_files(home, "prealloc", 1, size)
        try:
            write_one = overwriter(fd, size)
            return timed_loop(lambda _i: write_one(), duration)
        finally:
            os.close(fd)

    return measure


def raw_prealloc_threads(
    duration: float,
    n: int,
    home: Path,
    size: int,
    timed: Callable[[int, float, Callable[..., tuple[Callable[[int], object],
                                                     Callable[[], None]]]], Sample] = run_threads,
) -> Measure:
    """A thread per zero-filled file, pwrite + fdatasync each: the parallel physical limit.
    `timed` runs the threads (run_threads, or a variant that also measures CPU)."""

    def measure(_d: Path) -> Sample:
        fds = prepared_files(home, "prealloc", n, size)
        try:

            def make_op(k: int) -> tuple[Callable[[int], object], Callable[[], None]]:
                write_one = overwriter(fds[k], size)
                return (lambda _i: write_one()), (lambda: None)

            return timed(n, duration, make_op)
        finally:
            for fd in fds:
                os.close(fd)

    return measure


def syncfs_call() -> Callable[[int], None] | None:
    """libc's syncfs(fd) raising OSError on failure, or None where there is none (not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    fn = getattr(libc, "syncfs", None)
    if fn is None:
        return None
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_int

    def syncfs(fd: int) -> None:
        if fn(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))

    return syncfs


class SyncfsRounds:
    """One syncer thread: each round takes every waiter whose write is done, makes one
    `syncfs`, and releases exactly those waiters (a lock each, held until released), so a
    write that lands during a round waits for the next one."""

    def __init__(self, syncfs: Callable[[int], None], fd: int) -> None:
        self._syncfs = syncfs
        self._fd = fd
        self._cond = threading.Condition(threading.Lock())
        self._pending: list[threading.Lock] = []
        self._stopped = False
        self._error: BaseException | None = None
        self.rounds = 0
        self._thread = threading.Thread(target=self._run, name="syncfs-rounds", daemon=True)
        self._thread.start()

    def wait_durable(self, gate: threading.Lock) -> None:
        """Called after a write: returns once a syncfs that began after it has returned."""
        with self._cond:
            if self._error is not None:
                raise OSError("an earlier syncfs round failed") from self._error
            self._pending.append(gate)
            self._cond.notify()
        gate.acquire()
        if self._error is not None:
            raise OSError("the syncfs round failed") from self._error

    def _run(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while not self._pending and not self._stopped:
                    cond.wait()
                if self._stopped and not self._pending:
                    return
                batch, self._pending = self._pending, []
            try:
                self._syncfs(self._fd)
            except BaseException as exc:  # noqa: BLE001 - poisons every waiter, never retried
                with cond:  # registered from now on: refused at once; already queued: failed
                    self._error = exc
                    batch += self._pending
                    self._pending = []
            self.rounds += 1
            for gate in batch:
                gate.release()
            if self._error is not None:
                return

    def close(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._thread.join()


def syncfs_rounds(
    duration: float,
    n: int,
    home: Path,
    size: int,
    timed: Callable[[int, float, Callable[..., tuple[Callable[[int], object],
                                                     Callable[[], None]]]], Sample] = run_threads,
) -> Measure:
    """n threads, a zero-filled file each: pwrite, then wait for the next syncfs round."""

    def measure(_d: Path) -> Sample:
        syncfs = syncfs_call()
        if syncfs is None:
            raise Skip("syncfs is Linux-only")
        fds = prepared_files(home, "round", n, size)
        rounds = SyncfsRounds(syncfs, fds[0])
        try:

            def make_op(k: int) -> tuple[Callable[[int], object], Callable[[], None]]:
                fd, pwrite, line, step = fds[k], os.pwrite, RAW_LINE, len(RAW_LINE)
                gate = threading.Lock()
                gate.acquire()
                wait = rounds.wait_durable
                offset = [0]

                def op(_i: int) -> None:
                    at = offset[0]
                    pwrite(fd, line, at)
                    wait(gate)
                    offset[0] = at + step if at + step <= size - step else 0

                return op, lambda: None

            before = rounds.rounds
            sample = timed(n, duration, make_op)
            done = rounds.rounds - before
            if done and sample.seconds:
                sample.extra["rounds_per_s"] = done / sample.seconds
                sample.extra["writes_per_round"] = sample.ops / done
            return sample
        finally:
            rounds.close()
            for fd in fds:
                os.close(fd)

    return measure
