"""Child process for open/scan figures: a fresh interpreter per measurement, so peak RSS is its own.

Usage: bench_child.py COMMAND ARGS...; prints one JSON object on stdout.
  build-log DIR DB N       write N records to a walj log and the same rows to SQLite (unsynced)
  build-journal DIR DB N   write a journal of about N records (fsync disabled), same rows to SQLite
  log-open DIR             time Log.open + close (checksums, no JSON), then walj.read (decoded)
  checkpoint-journal SRC DST N [CALLS]   copy the journal SRC to DST, settle CALLS calls with
                           caller-given call ids (default 0), write a checkpoint, then about N
                           records after it (fsync disabled)
  journal-open DIR         time ToolJournal.open (state rebuilt) + close, then Log.open + close
                           of the same directory (its checksum scan alone)
  sqlite-scan DB           time SELECT of every row (no decode), then SELECT + decode, with the
                           decoder walj uses (msgspec)
  verify DIR               walj.verify (the library's scanner)

Peak RSS (VmHWM) is read right after the first timed step, and again at the end.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench_core import import_walj, make_record
from bench_machine import peak_rss_bytes


def _noop(**_kwargs: Any) -> None:
    return None


def build_log(path: Path, db: Path, n: int) -> dict[str, Any]:
    from bench_baselines import encode, sqlite_fixture

    walj = import_walj()
    assert walj is not None
    with walj.Log.open(path, sync="never") as log:
        for start in range(0, n, 10_000):
            log.append_many([make_record(i) for i in range(start, min(n, start + 10_000))])
        log.sync()
    sqlite_fixture(db, (encode(make_record(i)) for i in range(n)))
    return {"records": n}


def build_journal(path: Path, db: Path, n: int) -> dict[str, Any]:
    # Building a million-record journal at the disk's fsync rate would take an hour: fsync is
    # switched off in this process only, before walj is imported. Figures never run here.
    os.fsync = lambda fd: None
    if hasattr(os, "fdatasync"):
        os.fdatasync = lambda fd: None
    from bench_baselines import encode, sqlite_fixture

    walj = import_walj()
    assert walj is not None
    per_turn = 10

    def fill(target: Path, turns: int) -> None:
        # No automatic checkpoints: "journal open" times a rebuild from the first record.
        journal = walj.ToolJournal.open(target, tools={"noop": _noop}, sync="never",
                                        **_no_checkpoints(walj))
        try:
            for t in range(turns):
                with journal.turn() as turn:
                    for k in range(per_turn):
                        turn.dispatch("noop", {"turn": t, "k": k, "q": "x" * 64})
        finally:
            journal.close()

    probe = path.parent / (path.name + ".probe")
    fill(probe, 2)
    per = max(1, sum(1 for _ in walj.read(probe)) // 2)
    fill(path, max(1, -(-n // per)))

    def rows() -> Iterator[bytes]:
        for rec in walj.read(path):
            yield encode(rec.data)

    sqlite_fixture(db, rows())
    return {"records": sum(1 for _ in walj.read(path)), "records_per_turn": per}


def _no_checkpoints(walj: Any) -> dict[str, Any]:
    """The open option that turns automatic checkpoints off, where walj has them."""
    import inspect

    params = inspect.signature(walj.ToolJournal.open).parameters
    return {"checkpoint_every": None} if "checkpoint_every" in params else {}


def checkpoint_journal(src: Path, dst: Path, n: int, calls: int = 0) -> dict[str, Any]:
    """A copy of `src` with `calls` settled caller-given call ids (the replay window carries the
    newest of them), a checkpoint, then about `n` more records."""
    import shutil

    os.fsync = lambda fd: None  # building only, as in build_journal
    if hasattr(os, "fdatasync"):
        os.fdatasync = lambda fd: None
    walj = import_walj()
    assert walj is not None
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("LOCK*"))
    journal = walj.ToolJournal.open(dst, tools={"noop": _noop}, sync="never",
                                    **_no_checkpoints(walj))
    try:
        for start in range(0, calls, 10):
            with journal.turn() as turn:
                for k in range(start, min(calls, start + 10)):
                    turn.dispatch("noop", {"k": k, "q": "x" * 64}, call_id=f"call-{k:08d}")
        before = journal.recovery.records
        journal.checkpoint()
        t = 0
        while journal.recovery.records - before < n:
            with journal.turn() as turn:
                for k in range(10):
                    turn.dispatch("noop", {"turn": t, "k": k, "q": "x" * 64})
            t += 1
        after = journal.recovery.records - before
    finally:
        journal.close()
    return {"records_before": before, "records_after": after, "settled_calls": calls}


def log_open(path: Path) -> dict[str, Any]:
    walj = import_walj()
    assert walj is not None
    t0 = time.perf_counter()
    log = walj.Log.open(path)
    log.close()
    t1 = time.perf_counter()
    rss_open = peak_rss_bytes()
    n = 0
    for rec in walj.read(path):
        if rec.data is not None:
            n += 1
    t2 = time.perf_counter()
    return {
        "open_s": t1 - t0,
        "read_s": t2 - t1,
        "records": n,
        "rss_open": rss_open,
        "rss_end": peak_rss_bytes(),
    }


def journal_open(path: Path) -> dict[str, Any]:
    walj = import_walj()
    assert walj is not None
    t0 = time.perf_counter()
    journal = walj.ToolJournal.open(path, tools={"noop": _noop})
    blocked = bool(journal.recovery.blocked)
    journal.close()
    t1 = time.perf_counter()
    rss_open = peak_rss_bytes()
    log = walj.Log.open(path)
    log.close()
    t2 = time.perf_counter()
    return {"open_s": t1 - t0, "verify_s": t2 - t1, "rss_open": rss_open, "blocked": blocked}


def sqlite_scan(db: Path) -> dict[str, Any]:
    import sqlite3

    from bench_baselines import decode

    def count_rows(keep: Any) -> int:
        conn = sqlite3.connect(db)
        count = 0
        for (data,) in conn.execute("SELECT data FROM records ORDER BY seq"):
            if keep(data) is not None:
                count += 1
        conn.close()
        return count

    t0 = time.perf_counter()
    n = count_rows(lambda data: data)
    t1 = time.perf_counter()
    rss_open = peak_rss_bytes()
    m = count_rows(decode)
    t2 = time.perf_counter()
    if m != n:
        raise RuntimeError(f"decoded {m} of {n} rows")
    return {
        "open_s": t1 - t0,
        "read_s": t2 - t1,
        "records": n,
        "rss_open": rss_open,
        "rss_end": peak_rss_bytes(),
    }


def verify(path: Path) -> dict[str, Any]:
    walj = import_walj()
    assert walj is not None
    report = walj.verify(path)
    return {"ok": bool(report.ok), "records": int(report.records)}


def main(argv: list[str]) -> int:
    cmd, args = argv[0], argv[1:]
    if cmd == "build-log":
        out = build_log(Path(args[0]), Path(args[1]), int(args[2]))
    elif cmd == "build-journal":
        out = build_journal(Path(args[0]), Path(args[1]), int(args[2]))
    elif cmd == "checkpoint-journal":
        out = checkpoint_journal(Path(args[0]), Path(args[1]), int(args[2]),
                                 int(args[3]) if len(args) > 3 else 0)
    elif cmd == "log-open":
        out = log_open(Path(args[0]))
    elif cmd == "journal-open":
        out = journal_open(Path(args[0]))
    elif cmd == "sqlite-scan":
        out = sqlite_scan(Path(args[0]))
    elif cmd == "verify":
        out = verify(Path(args[0]))
    else:
        print(f"unknown command {cmd!r}", file=sys.stderr)
        return 2
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
