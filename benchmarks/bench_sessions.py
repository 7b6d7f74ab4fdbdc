"""The "sessions" family: N sessions in one process, each with its own journal, dispatching a
durable no-op tool (two fsyncs a call), against the disk's parallel fsync limit and SQLite.

Modes: one asyncio loop with a task per session (`adispatch`, async no-op tool), and a thread
per session (`dispatch`). Baselines, all in the same run and interleaved: raw write+fdatasync
with a thread per file, SQLite WAL synchronous=FULL with a database per session, and SQLite
with one database shared by every session (a checkpointer-style store). A baseline's rate is
its commits/s divided by two, so every column is in calls of two durable writes.

Each sample also carries user CPU per call (getrusage over the timed window, all threads).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import bench_limits as limits
from bench_baselines import (
    INSERT,
    RAW_LINE,
    _datasync,
    encode,
    run_threads,
    sqlite_connect,
    sqlite_create,
)
from bench_commit import ServiceWindow, commit_mode, raise_open_files
from bench_core import Measure, Sample, Skip, make_record, timed_loop
from bench_walj import _noop, journal_missing

SESSIONS = [1, 8, 64, 256, 1024]
QUICK_SESSIONS = [1, 8, 64]  # a thousand fresh journals take seconds to create: full runs
WRITES_PER_CALL = 2  # an intent and a terminal record, each synced
MIN_WINDOW_SECONDS = 0.1  # CPU time is sampled per tick: a window spans many
# Linux's user time (getrusage) is the thread group's precise run time split by the ratio of
# user to system ticks since the process began, and never allowed to go back: after a past
# heavy in user time, a loop that sleeps in fdatasync sees its user time stay flat for many
# windows (0.4 s seen). So the same load runs again until user time moves, for up to
# CPU_MAX_SECONDS of windows, and the figures cover every window run.
CPU_MAX_SECONDS = 3.0
FILES_PER_SESSION = 4  # a journal's two descriptors, or a SQLite database's three, and spare


def _cpu_user() -> float:
    """The process's user CPU seconds, every thread: getrusage, which counts in microseconds
    where os.times() counts in clock ticks (10 ms), too coarse for a short window."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not Unix
        return os.times().user
    return resource.getrusage(resource.RUSAGE_SELF).ru_utime


def _with_cpu(sample: Sample, cpu_seconds: float, ops: int) -> Sample:
    # No tick landed in user mode (a short window of threads asleep in fdatasync): the
    # round measured nothing, not zero, so it carries no figure and the median skips it.
    if ops and cpu_seconds > 0:
        sample.extra["user_cpu_us_per_call"] = cpu_seconds * 1e6 / ops
    return sample


def _as_calls(sample: Sample) -> Sample:
    """A baseline of single commits, in calls of WRITES_PER_CALL commits."""
    sample.value /= WRITES_PER_CALL
    sample.ops //= WRITES_PER_CALL
    return sample


def _windows_with_cpu(window: Callable[[], Sample],
                      service: ServiceWindow | None = None) -> Sample:
    """Run `window` until the process's user time moves (see CPU_MAX_SECONDS); the rate,
    user CPU per op and the commit service's counters over every window run. A window reads
    the user time at its start and end lines itself ("window_cpu_s"): the setup around it (a
    thousand journals opened, turns entered) is not the calls' CPU."""
    ops, seconds, cpu_seconds = 0, 0.0, 0.0
    extra: dict[str, float] = {}
    while True:
        sample = window()
        cpu_seconds += sample.extra.pop("window_cpu_s")
        ops, seconds = ops + sample.ops, seconds + sample.seconds
        extra.update(sample.extra)
        if cpu_seconds > 0 or seconds >= CPU_MAX_SECONDS:
            break
    if service is not None:
        extra.update(service.extras(ops, seconds))
    sample = Sample(value=ops / seconds if seconds else 0.0, ops=ops, seconds=seconds,
                    extra=extra)
    return _with_cpu(sample, cpu_seconds, ops)


MakeOp = Callable[[int], tuple[Callable[[int], object], Callable[[], None]]]


def _threads_with_cpu(n: int, duration: float, make_op: MakeOp,
                      service: ServiceWindow | None = None) -> Sample:
    """run_threads, with the user CPU of its windows (see _windows_with_cpu)."""
    def lines() -> float:  # read at the window's start and end lines
        if service is not None:
            service.mark()
        return _cpu_user()

    return _windows_with_cpu(lambda: run_threads(n, duration, make_op, lines), service)


def threads_cpu_per_write(n: int, duration: float, make_op: MakeOp) -> Sample:
    """A raw baseline's threads: its user CPU per durable write, its rate in calls of two."""
    sample = _threads_with_cpu(n, duration, make_op)
    if "user_cpu_us_per_call" in sample.extra:
        sample.extra["user_cpu_us_per_write"] = sample.extra.pop("user_cpu_us_per_call")
    return _as_calls(sample)


def enough_files(n: int) -> None:
    """Raise the open-files limit for n sessions, or skip the figure saying why it cannot."""
    reason = raise_open_files(FILES_PER_SESSION * n + 256)
    if reason:
        raise Skip(reason)


async def _anoop(**_kwargs: Any) -> None:
    return None


def walj_threads(walj: ModuleType | None, duration: float, n: int, home: Path,
                 mode: str | None = None, restore: str | None = None) -> Measure | str:
    """A thread per session, each its own journal and turn, `turn.dispatch` of a no-op; in
    commit mode `mode` (None: the one walj is in), putting back `restore` after. The journals
    live in `home`, kept from one round to the next: a round reopens them, as a server does,
    instead of creating a thousand (each creation syncs its files and directories)."""
    missing = journal_missing(walj)
    if missing or walj is None:
        return missing or "walj not importable"
    wal = walj

    def measure(_d: Path) -> Sample:
        enough_files(n)

        def make_op(k: int) -> tuple[Callable[[int], object], Callable[[], None]]:
            journal = wal.ToolJournal.open(home / f"s{k}", tools={"noop": _noop}, sync="always")
            turn = journal.turn()
            turn.__enter__()

            def op(i: int) -> None:
                turn.dispatch("noop", {"x": i})

            def cleanup() -> None:
                turn.__exit__(None, None, None)
                journal.close()

            return op, cleanup

        with commit_mode(wal, mode, restore):
            return _threads_with_cpu(n, duration, make_op, ServiceWindow(wal))

    return measure


def walj_async(walj: ModuleType | None, duration: float, n: int, home: Path,
               mode: str | None = None, restore: str | None = None) -> Measure | str:
    """One asyncio loop, a task per session, each its own journal and turn, `adispatch` of an
    async no-op; its journals in `home` and its commit mode as walj_threads'."""
    missing = journal_missing(walj)
    if missing or walj is None:
        return missing or "walj not importable"
    wal = walj

    def measure(_d: Path) -> Sample:
        enough_files(n)
        with commit_mode(wal, mode, restore):
            journals = [wal.ToolJournal.open(home / f"s{k}", tools={"noop": _anoop},
                                             sync="always") for k in range(n)]
            try:
                service = ServiceWindow(wal)
                return _windows_with_cpu(lambda: _async_window(journals, duration, service),
                                         service)
            finally:
                for journal in journals:
                    journal.close()

    return measure


def _async_window(journals: list[Any], duration: float, service: ServiceWindow) -> Sample:
    """One timed window of every journal's task dispatching in its own turn."""
    n = len(journals)
    counts = [0] * n

    async def session(k: int, stop: asyncio.Event, go: asyncio.Event) -> None:
        async with journals[k].turn() as turn:
            await go.wait()
            i = 0
            while not stop.is_set():
                await turn.adispatch("noop", {"x": i})
                i += 1
            counts[k] = i

    async def main() -> tuple[float, float]:
        stop, go = asyncio.Event(), asyncio.Event()
        tasks = [asyncio.ensure_future(session(k, stop, go)) for k in range(n)]
        await asyncio.sleep(0.05)  # every turn entered
        service.mark()
        cpu, start = _cpu_user(), time.perf_counter()
        go.set()
        await asyncio.sleep(duration)
        stop.set()
        await asyncio.gather(*tasks)
        elapsed, cpu = time.perf_counter() - start, _cpu_user() - cpu
        service.mark()
        return elapsed, cpu

    elapsed, cpu = asyncio.run(main())
    total = sum(counts)
    return Sample(value=total / elapsed, ops=total, seconds=elapsed,
                  extra={"window_cpu_s": cpu})


def raw_threads(duration: float, n: int) -> Measure:
    """The naive limit: a thread per file, raw `os.write` of a pre-encoded line, O_APPEND, +
    `fdatasync`."""
    sync = _datasync()

    def measure(d: Path) -> Sample:
        enough_files(n)

        def make_op(k: int) -> tuple[Callable[[int], object], Callable[[], None]]:
            fd = os.open(d / f"raw{k}.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

            def op(_i: int) -> None:
                os.write(fd, RAW_LINE)
                sync(fd)

            return op, lambda: os.close(fd)

        return threads_cpu_per_write(n, duration, make_op)

    return measure


def raw_prealloc_threads(duration: float, n: int, scale: float, home: Path) -> Measure:
    """The physical limit of a file each: a thread per zero-filled file, pwrite + fdatasync."""
    inner = limits.raw_prealloc_threads(duration, n, home, limits.prealloc_size(scale, n),
                                        threads_cpu_per_write)

    def measure(d: Path) -> Sample:
        enough_files(n)
        return inner(d)

    return measure


def syncfs_rounds(duration: float, n: int, scale: float, home: Path) -> Measure:
    """The physical limit of a dedicated volume: a thread per zero-filled file, pwrite, then
    the next round's single `syncfs`."""
    inner = limits.syncfs_rounds(duration, n, home, limits.prealloc_size(scale, n),
                                 threads_cpu_per_write)

    def measure(d: Path) -> Sample:
        enough_files(n)
        return inner(d)

    return measure


def sqlite_per_session(duration: float, n: int) -> Measure:
    """SQLite WAL synchronous=FULL, a database per session, one INSERT + commit per write."""

    def measure(d: Path) -> Sample:
        def make_op(k: int) -> tuple[Callable[[int], object], Callable[[], None]]:
            db = d / f"s{k}.sqlite3"
            sqlite_create(db)
            conn = sqlite_connect(db, "FULL")

            def op(i: int) -> None:
                conn.execute(INSERT, (encode(make_record(i)),))
                conn.commit()

            return op, conn.close

        enough_files(n)
        return _as_calls(_threads_with_cpu(n, duration, make_op))

    return measure


def sqlite_shared(duration: float, n: int) -> Measure:
    """SQLite WAL synchronous=FULL, one database for every session, as a checkpointer-style
    store keeps it: one connection, its commits serialised by a lock (so no thread spins in
    SQLite's busy handler, which would handicap the baseline)."""

    def measure(d: Path) -> Sample:
        db = d / "shared.sqlite3"
        sqlite_create(db)
        conn = sqlite_connect(db, "FULL", shared=True)
        lock = threading.Lock()

        def make_op(_k: int) -> tuple[Callable[[int], object], Callable[[], None]]:
            def op(i: int) -> None:
                row = (encode(make_record(i)),)
                with lock:
                    conn.execute(INSERT, row)
                    conn.commit()

            return op, lambda: None

        try:
            return _as_calls(_threads_with_cpu(n, duration, make_op))
        finally:
            conn.close()

    return measure


# --- a session per request: open, one call, close ----------------------------------------------
# A stateless server opens the session's journal for each request and closes it after. Its cost
# is the open's scan of the session's history plus the call's syncs, so each series keeps
# REQUEST_COPIES sessions of REQUEST_RECORDS records and serves them in turn: each grows by a
# few records a request, and stays near its size through the timed window.

REQUEST_RECORDS = 1_000
REQUEST_COPIES = 16
CALLS_PER_TURN = 10
RECORDS_PER_TURN = 2 + 2 * CALLS_PER_TURN  # turn_started, an intent and an outcome a call, ...


def walj_request(walj: ModuleType | None, duration: float) -> Measure | str:
    """`ToolJournal.open` of a 1,000-record session, a turn with one durable no-op dispatch,
    `close`: what one request costs a server that keeps no journal open."""
    missing = journal_missing(walj)
    if missing or walj is None:
        return missing or "walj not importable"
    wal = walj

    def measure(d: Path) -> Sample:
        template = d / "template"
        with wal.ToolJournal.open(template, tools={"noop": _noop}, sync="never") as journal:
            for _ in range(-(-REQUEST_RECORDS // RECORDS_PER_TURN)):
                with journal.turn() as turn:
                    for k in range(CALLS_PER_TURN):
                        turn.dispatch("noop", {"k": k})
        paths = [d / f"s{k}" for k in range(REQUEST_COPIES)]
        for path in paths:
            shutil.copytree(template, path)

        def op(i: int) -> None:
            with wal.ToolJournal.open(paths[i % REQUEST_COPIES], tools={"noop": _noop},
                                      sync="always") as journal, journal.turn() as turn:
                turn.dispatch("noop", {"x": i})

        return timed_loop(op, duration)

    return measure


def sqlite_request(duration: float) -> Measure:
    """The same request on SQLite: connect to the session's database (WAL, FULL) holding
    1,000 rows, two INSERT + commit (the intent and the outcome), close."""

    def measure(d: Path) -> Sample:
        dbs = [d / f"s{k}.sqlite3" for k in range(REQUEST_COPIES)]
        for db in dbs:
            sqlite_create(db)
            conn = sqlite_connect(db, "NORMAL")
            conn.executemany(INSERT, ((encode(make_record(i)),) for i in range(REQUEST_RECORDS)))
            conn.commit()
            conn.close()

        def op(i: int) -> None:
            conn = sqlite_connect(dbs[i % REQUEST_COPIES], "FULL")
            try:
                for _ in range(WRITES_PER_CALL):
                    conn.execute(INSERT, (encode(make_record(i)),))
                    conn.commit()
            finally:
                conn.close()

        return timed_loop(op, duration)

    return measure
