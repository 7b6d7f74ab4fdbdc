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

from bench_baselines import (
    INSERT,
    RAW_LINE,
    _datasync,
    encode,
    run_threads,
    sqlite_connect,
    sqlite_create,
)
from bench_core import Measure, Sample, make_record, timed_loop
from bench_walj import _noop, journal_missing

SESSIONS = [1, 8, 64, 256]
QUICK_SESSIONS = [1, 8, 64]
WRITES_PER_CALL = 2  # an intent and a terminal record, each synced
MIN_WINDOW_SECONDS = 0.1  # CPU time is sampled per tick: a window spans many
CPU_WINDOWS = 5  # windows of the same load run at most, until one sees user CPU


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


def _threads_with_cpu(n: int, duration: float,
                      make_op: Callable[[int], tuple[Callable[[int], object],
                                                     Callable[[], None]]]) -> Sample:
    """run_threads, with the user CPU of its window. A window in which no user-mode tick
    landed (threads asleep in fdatasync on a busy machine) measured no CPU, so the same load
    runs again, up to CPU_WINDOWS windows in all, and the figures cover every window run."""
    ops, seconds, cpu_seconds = 0, 0.0, 0.0
    for _ in range(CPU_WINDOWS):
        cpu = _cpu_user()
        sample = run_threads(n, duration, make_op)
        cpu_seconds += _cpu_user() - cpu
        ops, seconds = ops + sample.ops, seconds + sample.seconds
        if cpu_seconds > 0:
            break
    if seconds > sample.seconds:  # more than one window: the rate over all of them
        sample = Sample(value=ops / seconds, ops=ops, seconds=seconds)
    return _with_cpu(sample, cpu_seconds, ops)


async def _anoop(**_kwargs: Any) -> None:
    return None


def walj_threads(walj: ModuleType | None, duration: float, n: int) -> Measure | str:
    """A thread per session, each its own journal and turn, `turn.dispatch` of a no-op."""
    missing = journal_missing(walj)
    if missing or walj is None:
        return missing or "walj not importable"
    wal = walj

    def measure(d: Path) -> Sample:
        def make_op(k: int) -> tuple[Callable[[int], object], Callable[[], None]]:
            journal = wal.ToolJournal.open(d / f"s{k}", tools={"noop": _noop}, sync="always")
            turn = journal.turn()
            turn.__enter__()

            def op(i: int) -> None:
                turn.dispatch("noop", {"x": i})

            def cleanup() -> None:
                turn.__exit__(None, None, None)
                journal.close()

            return op, cleanup

        return _threads_with_cpu(n, duration, make_op)

    return measure


def walj_async(walj: ModuleType | None, duration: float, n: int) -> Measure | str:
    """One asyncio loop, a task per session, each its own journal and turn, `adispatch` of an
    async no-op."""
    missing = journal_missing(walj)
    if missing or walj is None:
        return missing or "walj not importable"
    wal = walj

    def measure(d: Path) -> Sample:
        journals = [wal.ToolJournal.open(d / f"s{k}", tools={"noop": _anoop}, sync="always")
                    for k in range(n)]
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
            cpu, start = _cpu_user(), time.perf_counter()
            go.set()
            await asyncio.sleep(duration)
            stop.set()
            await asyncio.gather(*tasks)
            return time.perf_counter() - start, _cpu_user() - cpu

        try:
            elapsed, cpu = asyncio.run(main())
        finally:
            for journal in journals:
                journal.close()
        total = sum(counts)
        return _with_cpu(Sample(value=total / elapsed, ops=total, seconds=elapsed), cpu, total)

    return measure


def raw_threads(duration: float, n: int) -> Measure:
    """The limit: a thread per file, raw `os.write` of a pre-encoded line + `fdatasync`."""
    sync = _datasync()

    def measure(d: Path) -> Sample:
        def make_op(k: int) -> tuple[Callable[[int], object], Callable[[], None]]:
            fd = os.open(d / f"raw{k}.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

            def op(_i: int) -> None:
                os.write(fd, RAW_LINE)
                sync(fd)

            return op, lambda: os.close(fd)

        sample = _threads_with_cpu(n, duration, make_op)
        # CPU per write+fdatasync, before the rate is turned into calls of two.
        if "user_cpu_us_per_call" in sample.extra:
            sample.extra["user_cpu_us_per_write"] = sample.extra.pop("user_cpu_us_per_call")
        return _as_calls(sample)

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
