"""Baselines walj is compared with: raw fdatasync loop, SQLite WAL, and JSONL append files."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from bench_core import Sample, make_record, timed_loop

# The baselines encode and decode with the codec walj itself uses: msgspec when installed (walj
# depends on it), compact stdlib json otherwise, so that no baseline pays for a slower encoder.
try:
    import msgspec

    encode: Callable[[Any], bytes] = msgspec.json.Encoder().encode
    decode: Callable[[bytes], Any] = msgspec.json.Decoder().decode
    CODEC = f"msgspec {msgspec.__version__}"
except ImportError:  # pragma: no cover - walj requires msgspec
    _enc = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)

    def _json_encode(value: Any) -> bytes:
        return _enc.encode(value).encode()

    encode = _json_encode
    decode = json.loads
    CODEC = "json (stdlib)"

RAW_LINE = encode(make_record(0)) + b"\n"


def _datasync() -> Callable[[int], None]:
    """The strongest data sync the platform has: F_FULLFSYNC on macOS, else fdatasync."""
    if sys.platform == "darwin":
        import fcntl

        def full(fd: int) -> None:
            fcntl.fcntl(fd, fcntl.F_FULLFSYNC)

        return full
    return getattr(os, "fdatasync", os.fsync)


def raw_fsync(duration: float) -> Callable[[Path], Sample]:
    """os.write of a pre-encoded ~200-byte line + fdatasync, O_APPEND: the disk's limit."""

    def measure(d: Path) -> Sample:
        sync = _datasync()
        fd = os.open(d / "raw.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:

            def op(_i: int) -> None:
                os.write(fd, RAW_LINE)
                sync(fd)

            return timed_loop(op, duration)
        finally:
            os.close(fd)

    return measure


def raw_write(duration: float) -> Callable[[Path], Sample]:
    """os.write of a pre-encoded ~200-byte line, O_APPEND, no sync: the write system call alone."""

    def measure(d: Path) -> Sample:
        fd = os.open(d / "raw.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            write = os.write
            return timed_loop(lambda _i: write(fd, RAW_LINE), duration)
        finally:
            os.close(fd)

    return measure


def jsonl(duration: float, fsync: bool) -> Callable[[Path], Sample]:
    """What most agent runtimes do: open(..., "ab"), write an encoded line, flush (+ the same
    data sync walj uses: fdatasync, F_FULLFSYNC on macOS)."""

    def measure(d: Path) -> Sample:
        sync = _datasync()
        with open(d / "log.jsonl", "ab") as f:
            fileno = f.fileno()

            def op(i: int) -> None:
                f.write(encode(make_record(i)) + b"\n")
                f.flush()
                if fsync:
                    sync(fileno)

            return timed_loop(op, duration)

    return measure


def sqlite_connect(path: Path, synchronous: str, shared: bool = False) -> sqlite3.Connection:
    """`shared`: one connection used by several threads (the caller serialises its use)."""
    conn = sqlite3.connect(path, timeout=30.0, check_same_thread=not shared)
    conn.execute("PRAGMA busy_timeout=30000")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    if sys.platform == "darwin":
        conn.execute("PRAGMA fullfsync=ON")
    return conn


def sqlite_create(path: Path) -> None:
    conn = sqlite_connect(path, "FULL")
    conn.execute("CREATE TABLE IF NOT EXISTS records (seq INTEGER PRIMARY KEY, data BLOB NOT NULL)")
    conn.commit()
    conn.close()


INSERT = "INSERT INTO records (data) VALUES (?)"


def sqlite_append(duration: float, synchronous: str) -> Callable[[Path], Sample]:
    """SQLite in WAL mode: one INSERT of the encoded record and one commit per record."""

    def measure(d: Path) -> Sample:
        db = d / "bench.sqlite3"
        sqlite_create(db)
        conn = sqlite_connect(db, synchronous)
        try:

            def op(i: int) -> None:
                conn.execute(INSERT, (encode(make_record(i)),))
                conn.commit()

            return timed_loop(op, duration)
        finally:
            conn.close()

    return measure


def run_threads(
    n_threads: int,
    duration: float,
    make_op: Callable[[int], tuple[Callable[[int], object], Callable[[], None]]],
    cpu_clock: Callable[[], float] | None = None,
) -> Sample:
    """Throughput of n threads calling their op until the window closes.

    `make_op(k)` runs inside thread k before the start line and returns (op, cleanup).
    The rate is all completed ops over the time from the start line to the end of the last
    op to complete; cleanup runs after every thread has finished, outside the window. With a
    `cpu_clock`, the CPU it reads across the window (setup and cleanup left out) is put in
    the sample's extras as "window_cpu_s".

    The start line's time is read by the barrier's action, as the last thread arrives and
    before any is released, and each thread stops itself at the deadline: with a thousand
    threads the main thread may not run for seconds, so it neither reads the start (it came
    late, and the ops of that time counted in a window that left it out) nor says stop (the
    window ran on for a minute).
    """
    clock = time.perf_counter
    read_cpu = cpu_clock or (lambda: 0.0)
    window: list[float] = []
    cpu: list[float] = []

    def start_line() -> None:
        cpu.append(read_cpu())
        now = clock()
        window.extend((now, now + duration))

    start_bar = threading.Barrier(n_threads + 1, action=start_line)
    end_bar = threading.Barrier(n_threads, action=lambda: cpu.append(read_cpu()))
    stop = threading.Event()
    counts = [0] * n_threads
    ends = [0.0] * n_threads
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            op, cleanup = make_op(k)
        except BaseException as exc:  # noqa: BLE001 - reported to the caller below
            errors.append(exc)
            start_bar.abort()
            end_bar.abort()
            return
        try:
            start_bar.wait()
            deadline = window[1]
            n = 0
            base = k << 40
            while clock() < deadline and not stop.is_set():
                op(base + n)
                n += 1
            ends[k] = clock()
            counts[k] = n
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
            stop.set()
        finally:
            with contextlib.suppress(threading.BrokenBarrierError):
                end_bar.wait()
            cleanup()

    threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(n_threads)]
    for t in threads:
        t.start()
    with contextlib.suppress(threading.BrokenBarrierError):
        start_bar.wait()
    for t in threads:
        t.join()
    if errors:
        raise errors[0] if isinstance(errors[0], Exception) else RuntimeError(repr(errors[0]))
    elapsed = max(ends) - window[0]
    total = sum(counts)
    sample = Sample(value=total / elapsed, ops=total, seconds=elapsed)
    if cpu_clock is not None and len(cpu) == 2:
        sample.extra["window_cpu_s"] = cpu[1] - cpu[0]
    return sample


def sqlite_threads(duration: float, n_threads: int) -> Callable[[Path], Sample]:
    """SQLite WAL synchronous=FULL, one connection per thread, one INSERT + commit per record."""

    def measure(d: Path) -> Sample:
        db = d / "bench.sqlite3"
        sqlite_create(db)

        def make_op(_k: int) -> tuple[Callable[[int], object], Callable[[], None]]:
            conn = sqlite_connect(db, "FULL")

            def op(i: int) -> None:
                conn.execute(INSERT, (encode(make_record(i)),))
                conn.commit()

            return op, conn.close

        return run_threads(n_threads, duration, make_op)

    return measure


def sqlite_fixture(db: Path, rows: Iterable[bytes]) -> None:
    """Create `db` holding the given encoded JSON values, in one transaction."""
    sqlite_create(db)
    conn = sqlite_connect(db, "NORMAL")
    conn.executemany(INSERT, ((s,) for s in rows))
    conn.commit()
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
