"""Open/scan figures: log open and read, journal open, SQLite scans, peak RSS, the zipapp."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from bench_baselines import encode, sqlite_fixture
from bench_core import (
    BENCH_DIR,
    REPO_ROOT,
    Config,
    Measure,
    Sample,
    Series,
    child_env,
    make_record,
)
from bench_walj import journal_missing, log_missing

CHILD = BENCH_DIR / "bench_child.py"


def run_child(args: list[str], env: dict[str, str], timeout: float = 3600) -> dict[str, Any]:
    """Run bench_child.py in a fresh interpreter and return the JSON it prints."""
    proc = subprocess.run(
        [sys.executable, str(CHILD), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-3:]
        raise RuntimeError(f"child {args[0]} failed: {' | '.join(tail)}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


class Fixtures:
    """Logs, journals and SQLite databases of each size, built once per run and shared."""

    def __init__(self, cfg: Config, walj: ModuleType | None, say: Callable[[str], None]) -> None:
        self.root = cfg.workdir / "fixtures"
        self.root.mkdir(parents=True, exist_ok=True)
        self.walj = walj
        self.env = child_env(walj)
        self.say = say
        self._logs: dict[int, tuple[Path | None, Path]] = {}
        self._journals: dict[int, tuple[Path, Path, int]] = {}

    def log(self, n: int) -> tuple[Path | None, Path]:
        """(walj log dir or None when the log is not available, SQLite db of the same rows)."""
        if n not in self._logs:
            t0 = time.perf_counter()
            path, db = self.root / f"log-{n}", self.root / f"log-{n}.sqlite3"
            if log_missing(self.walj) is None:
                run_child(["build-log", str(path), str(db), str(n)], self.env)
                self._logs[n] = (path, db)
            else:
                sqlite_fixture(db, (encode(make_record(i)) for i in range(n)))
                self._logs[n] = (None, db)
            self.say(f"  built log fixture of {n:,} records in {time.perf_counter() - t0:.1f} s")
        return self._logs[n]

    def journal(self, n: int) -> tuple[Path, Path, int]:
        """(journal dir, SQLite db of the same rows, actual record count)."""
        if n not in self._journals:
            t0 = time.perf_counter()
            path, db = self.root / f"journal-{n}", self.root / f"journal-{n}.sqlite3"
            out = run_child(["build-journal", str(path), str(db), str(n)], self.env)
            self._journals[n] = (path, db, int(out["records"]))
            dt = time.perf_counter() - t0
            self.say(f"  built journal fixture of {out['records']:,} records in {dt:.1f} s")
        return self._journals[n]


# Child output keys timed after the first step, and the extra each one becomes (records/s).
SECOND_STEPS = {"read_s": "read_rate", "verify_s": "verify_rate"}


def _child_measure(args: list[str], env: dict[str, str], records: int) -> Measure:
    """The child's first timed step is the sample's value; later steps and RSS are extras."""

    def measure(_d: Path) -> Sample:
        out = run_child(args, env)
        n = int(out.get("records", records))
        sample = Sample(value=n / out["open_s"], ops=n, seconds=out["open_s"])
        sample.extra["rss_mb"] = out["rss_open"] / 1e6
        for key, extra in SECOND_STEPS.items():
            if key in out:
                sample.extra[extra] = n / out[key]
        return sample

    return measure


def open_measures(
    cfg: Config, fx: Fixtures, walj: ModuleType | None
) -> dict[str, tuple[str, Measure | str]]:
    """Series for every open size: walj log open, journal open, SQLite scans of the same rows."""
    measures: dict[str, tuple[str, Measure | str]] = {}
    env = fx.env
    no_log, no_journal = log_missing(walj), journal_missing(walj)
    for k, n in enumerate(cfg.open_sizes, 1):
        logdir, db = fx.log(n)
        measures[f"log-open-{k}"] = (
            "rec/s",
            no_log or _child_measure(["log-open", str(logdir)], env, n),
        )
        measures[f"sqlite-scan-{k}"] = ("rec/s", _child_measure(["sqlite-scan", str(db)], env, n))
        if no_journal:
            measures[f"journal-open-{k}"] = ("rec/s", no_journal)
            measures[f"sqlite-journal-{k}"] = ("rec/s", no_journal)
        else:
            jdir, jdb, jn = fx.journal(n)
            measures[f"journal-open-{k}"] = (
                "rec/s",
                _child_measure(["journal-open", str(jdir)], env, jn),
            )
            measures[f"sqlite-journal-{k}"] = (
                "rec/s",
                _child_measure(["sqlite-scan", str(jdb)], env, jn),
            )
    measures.update(checkpoint_measures(cfg, fx, walj))
    return measures


# The session an open with a checkpoint is compared with: this many records, no checkpoint;
# the checkpointed one has the largest open size before its checkpoint and this many after.
AFTER_CHECKPOINT = 1_000
# Caller-given call ids settled before the checkpoint: the default replay window (10,000) full.
# (One more settled call would add the filter of forgotten ids, 1 MiB inflated on open.)
SETTLED_CALLS = 10_000


def checkpoint_measures(
    cfg: Config, fx: Fixtures, walj: ModuleType | None
) -> dict[str, tuple[str, Measure | str]]:
    """Opens per second of a journal with the largest open size's records before its last
    checkpoint, whose replay window holds SETTLED_CALLS settled call ids, and AFTER_CHECKPOINT
    records after it; and of a journal of AFTER_CHECKPOINT records."""
    no_journal = journal_missing(walj)
    if no_journal or walj is None or not hasattr(walj.ToolJournal, "checkpoint"):
        why = no_journal or "this walj has no checkpoints"
        return {"journal-open-checkpointed": ("opens/s", why),
                "journal-open-small": ("opens/s", why)}
    n = cfg.open_sizes[-1]
    src, _, _ = fx.journal(n)
    dst = fx.root / f"journal-{n}-checkpointed"
    t0 = time.perf_counter()
    built = run_child(["checkpoint-journal", str(src), str(dst), str(AFTER_CHECKPOINT),
                       str(SETTLED_CALLS)], fx.env)
    fx.say(f"  checkpointed a copy of it ({SETTLED_CALLS:,} call ids settled before, "
           f"{built['records_after']:,} records after) in {time.perf_counter() - t0:.1f} s")
    small, _, _ = fx.journal(AFTER_CHECKPOINT)

    def opens(path: Path) -> Measure:
        def measure(_d: Path) -> Sample:
            out = run_child(["journal-open", str(path)], fx.env)
            sample = Sample(value=1.0 / out["open_s"], ops=1, seconds=out["open_s"])
            sample.extra["rss_mb"] = out["rss_open"] / 1e6
            return sample
        return measure

    return {"journal-open-checkpointed": ("opens/s", opens(dst)),
            "journal-open-small": ("opens/s", opens(small))}


def derived(series: Series, key: str, unit: str) -> Series:
    """A series made of one `extra` value of each sample of another (same rounds, same ops)."""
    out = Series(series.name + ":" + key, unit, skipped=series.skipped, error=series.error)
    out.samples = [Sample(value=s.extra[key], ops=s.ops) for s in series.samples if key in s.extra]
    return out


# --- HOOK: the stdlib-only forensic zipapp (tools/ builds walj-forensic.pyz) ------------------
# When the file exists, its `verify` is timed on the same logs as the library's scanner, run
# with `python -I -S` so that nothing outside the standard library (no msgspec, no xxhash) is
# importable. Until it is built, these figures are reported as skipped.

ZIPAPP_NAME = "walj-forensic.pyz"


def find_zipapp(explicit: Path | None) -> Path | None:
    if explicit is not None:
        return explicit if explicit.is_file() else None
    for where in (REPO_ROOT, REPO_ROOT / "dist", REPO_ROOT / "build", REPO_ROOT / "tools"):
        candidate = where / ZIPAPP_NAME
        if candidate.is_file():
            return candidate
    return None


def _wall(cmd: list[str], env: dict[str, str] | None, records: int) -> Sample:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    dt = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-2:]
        raise RuntimeError(f"exit {proc.returncode}: {' | '.join(tail)}")
    return Sample(value=records / dt, ops=records, seconds=dt)


def zipapp_measures(
    cfg: Config, fx: Fixtures, walj: ModuleType | None
) -> dict[str, tuple[str, Measure | str]]:
    """Zipapp verify against the library's verify, wall clock including interpreter start."""
    measures: dict[str, tuple[str, Measure | str]] = {}
    pyz = find_zipapp(cfg.zipapp)
    no_log = log_missing(walj)
    skip = no_log or (None if pyz else f"zipapp not built ({ZIPAPP_NAME}, see tools/)")
    for k, n in enumerate(cfg.open_sizes, 1):
        if skip or pyz is None:
            measures[f"zipapp-verify-{k}"] = ("rec/s", skip or "zipapp not built")
            measures[f"library-verify-{k}"] = ("rec/s", skip or "zipapp not built")
            continue
        logdir, _db = fx.log(n)
        zcmd = [sys.executable, "-I", "-S", str(pyz), "verify", str(logdir)]
        lcmd = [sys.executable, str(CHILD), "verify", str(logdir)]
        measures[f"zipapp-verify-{k}"] = ("rec/s", _bind(_wall, zcmd, None, n))
        measures[f"library-verify-{k}"] = ("rec/s", _bind(_wall, lcmd, fx.env, n))
    return measures


def _bind(
    fn: Callable[[list[str], dict[str, str] | None, int], Sample],
    cmd: list[str],
    env: dict[str, str] | None,
    n: int,
) -> Measure:
    return lambda _d: fn(cmd, env, n)
