"""walj's side of the write figures: append per sync mode, group commit, durable tool dispatch."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from bench_baselines import run_threads
from bench_core import Measure, Sample, make_record, timed_loop


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


def append(walj: ModuleType | None, duration: float, sync: str) -> Measure | str:
    """One log.append of the ~200-byte record per op, on a fresh log, in one sync mode."""
    missing = log_missing(walj)
    if missing or walj is None:
        return missing or "walj not importable"
    wal = walj

    def measure(d: Path) -> Sample:
        log = wal.Log.open(d / "log", sync=sync)
        try:
            app = log.append
            return timed_loop(lambda i: app(make_record(i)), duration)
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
        log = wal.Log.open(d / "log", sync="batch")
        try:
            app = log.append

            def make_op(_k: int) -> tuple[Callable[[int], object], Callable[[], None]]:
                return (lambda i: app(make_record(i))), (lambda: None)

            return run_threads(n_threads, duration, make_op)
        finally:
            log.close()

    return measure


def _noop(**_kwargs: Any) -> None:
    return None


def dispatch(walj: ModuleType | None, duration: float) -> Measure | str:
    """Durable dispatch of a no-op tool inside one turn: intent fsync, handler, terminal fsync."""
    missing = journal_missing(walj)
    if missing or walj is None:
        return missing or "walj not importable"
    wal = walj

    def measure(d: Path) -> Sample:
        journal = wal.ToolJournal.open(d / "journal", tools={"noop": _noop}, sync="always")
        try:
            with journal.turn() as turn:

                def op(i: int) -> None:
                    result = turn.dispatch("noop", {"x": i})
                    if i == 0 and getattr(result, "outcome", "ok") != "ok":
                        raise RuntimeError(f"no-op dispatch did not succeed: {result!r}")

                return timed_loop(op, duration)
        finally:
            journal.close()

    return measure
