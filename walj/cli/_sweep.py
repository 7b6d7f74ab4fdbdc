"""`walj sweep ROOT`: find every session log under a directory and sort them into active,
ended, blocked, corrupt, unsupported or unreadable, in parallel."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

from ..errors import UnsupportedVersionError, WaljError
from ..journal._decode import decode_record, time_of
from ..journal._recovery import RecoveryState
from ..log import format as fmt
from ..log.fs import DEFAULT_FS, FileSystem
from ..log.scan import LogScan, list_segments
from ._accounting import OWN_DIRS, TOMBSTONE_PREFIX
from ._common import (
    EXIT_OK,
    EXIT_PROBLEMS,
    CliError,
    duration,
    emit_json,
    note_unrecorded,
    plural,
    problem_json,
    short,
    table,
    write_lines,
)
from ._records import kind_of

STATUSES = ("active", "ended", "blocked", "corrupt", "unsupported", "unreadable")
_TIME_FIELD = b'"at":'

FINE = frozenset({"active", "ended"})  # every other status is a problem (exit 1)


def find_logs(root: str, tombstones: list[str] | None = None
              ) -> tuple[list[str], list[dict[str, Any]]]:
    """Directories under `root` (itself included) holding segments, at every depth: a session
    may hold other sessions in subdirectories; its own (quarantine/, requests/) are not
    searched. Also the directories that could not be listed, and every symbolic link to a
    directory: never followed (it may leave ROOT or loop), never skipped in silence (a session
    behind it would go unchecked); a directory met twice (a bind mount) is searched once. A
    session `walj prune` was removing when it stopped (a directory named TOMBSTONE_PREFIX...)
    is no session: it goes to `tombstones` if given, and is skipped."""
    if not os.path.lexists(root):
        raise CliError(f"{root}: no such file or directory")
    if not os.path.isdir(root):
        raise CliError(f"{root} is a file; sweep takes a directory holding session logs")
    logs: list[str] = []
    unreadable: list[dict[str, Any]] = []
    seen: set[tuple[int, int]] = set()

    def failed(exc: OSError) -> None:
        where = exc.filename or root
        if os.path.abspath(where) == os.path.abspath(root):
            reason = "permission denied" if isinstance(exc, PermissionError) else exc.strerror
            raise CliError(f"{root}: {reason}")
        unreadable.append(_entry(where, "unreadable", detail=f"cannot list: {exc.strerror}"))

    for dirpath, dirnames, filenames in os.walk(root, onerror=failed):
        if os.path.basename(dirpath).startswith(TOMBSTONE_PREFIX) and dirpath != root:
            if tombstones is not None:
                tombstones.append(dirpath)
            dirnames[:] = []
            continue
        if not _first_visit(dirpath, seen, unreadable):
            dirnames[:] = []
            continue
        session = any(fmt.segment_index(name) is not None for name in filenames)
        if session:
            logs.append(dirpath)
        links = {d for d in dirnames if os.path.islink(os.path.join(dirpath, d))}
        # A dangling link may be a session whose target is gone (an unmounted volume).
        dangling = [f for f in filenames if not os.path.exists(os.path.join(dirpath, f))
                    and os.path.islink(os.path.join(dirpath, f))]
        for name in sorted([*links, *dangling]):
            unreadable.append(_symlink_entry(os.path.join(dirpath, name), name in links))
        dirnames[:] = sorted(d for d in dirnames
                             if d not in links and not (session and d in OWN_DIRS))
    return sorted(logs), unreadable


def _first_visit(path: str, seen: set[tuple[int, int]],
                 unreadable: list[dict[str, Any]]) -> bool:
    """False, and the directory listed as unreadable, when it was searched already under
    another path (a bind mount of a directory above it would loop)."""
    try:
        st = os.stat(path)
    except OSError:
        return False  # gone since its parent was listed
    key = (st.st_dev, st.st_ino)
    if key in seen:
        unreadable.append(_entry(path, "unreadable", detail="refused: the same directory as "
                                 "one already searched (a bind mount), not searched again"))
        return False
    seen.add(key)
    return True


def _symlink_entry(path: str, to_directory: bool) -> dict[str, Any]:
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    if not to_directory:
        return _entry(path, "unreadable", detail=f"refused: symlink to {target}, which does "
                      "not exist")
    return _entry(path, "unreadable", detail=f"refused: symlink to {target}, not followed; "
                  "sweep or inspect its target itself")


def _entry(path: str, status: str, **fields: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"path": path, "status": status, "records": 0, "last_seq": 0,
                             "blocked": False, "ended": False, "blockers": [],
                             "problem_count": 0, "problems": [], "torn_tail": False,
                             "plain": False, "last_record_at": None, "detail": None}
    entry.update(fields)
    return entry


def check_log(path: str, fs: FileSystem = DEFAULT_FS) -> dict[str, Any]:
    """Verify one log and rebuild its recovery state with the journal's own code. Never raises:
    whatever goes wrong is the log's status. Runs in a worker process (or, for an archived
    session read through `fs`, a thread)."""
    log_scan = LogScan(path, mode="salvage", fs=fs)
    state = RecoveryState()
    feeding = True
    journal_error: tuple[str, str] | None = None  # (status, detail)
    plain = False
    timed: bytes | None = None  # the last record that carries a time
    try:
        for seq, raw in log_scan:
            if _TIME_FIELD in raw:
                timed = raw
            if not feeding:
                continue
            if state.records == 0 and kind_of(raw) == "-":
                feeding, plain = False, True
                continue
            try:
                state.feed_json(seq, raw)
            except UnsupportedVersionError as exc:
                feeding, journal_error = False, ("unsupported", short(exc, 200))
            except (WaljError, ValueError) as exc:
                feeding, journal_error = False, ("corrupt", short(f"journal: {exc}", 200))
    except OSError as exc:
        reason = "permission denied" if isinstance(exc, PermissionError) else exc.strerror
        return _entry(path, "unreadable", detail=f"{exc.filename or path}: {reason}")
    finish = getattr(fs, "finish", None)
    if finish is not None:
        finish(log_scan)
    problems = log_scan.problems
    try:
        if feeding and not plain and state.records:
            note_unrecorded(path, state.cuts)
        rec = state.snapshot()
    except (WaljError, OSError) as exc:  # a blocker's record is decoded only now; quarantine/
        journal_error = journal_error or ("corrupt", short(f"journal: {exc}", 200))
        rec = RecoveryState().snapshot()
    blockers = [{"execution_id": b.execution_id, "tool": b.tool, "call_id": b.call_id,
                 "state": b.state, "turn_sequence": b.turn_sequence} for b in rec.blockers]
    detail = short(problems[0].describe(), 200) if problems else None
    if any(p.kind == "unsupported_version" for p in problems):
        status = "unsupported"
    elif problems:
        status = "corrupt"
    elif journal_error is not None:
        status, detail = journal_error
    elif rec.blocked:
        status = "blocked"
        detail = "; ".join(f"{b['tool'] or 'turn ' + str(b['turn_sequence'])} {b['state']}"
                           for b in blockers[:3])
    else:
        # An ended session with blockers stays "blocked" above: its blockers stay visible.
        status = "ended" if rec.ended else "active"
        detail = "a plain walj log, not a tool journal" if plain else None
    return _entry(path, status, records=log_scan.records, last_seq=log_scan.last_seq,
                  blocked=rec.blocked, ended=rec.ended, blockers=blockers,
                  problem_count=len(problems),
                  problems=[problem_json(p) for p in problems[:5]],
                  torn_tail=log_scan.torn_tail is not None, plain=plain,
                  last_record_at=_record_time(timed), detail=detail)


def segment_count(path: str) -> tuple[int, float | None]:
    """How many segment files the session holds, and the newest one's modification time."""
    listed, _ = list_segments(DEFAULT_FS, path)
    newest = None
    for _, name in listed:
        try:
            mtime = os.stat(os.path.join(path, name)).st_mtime
        except OSError:
            continue
        newest = mtime if newest is None else max(newest, mtime)
    return len(listed), newest


def age_of(entry: dict[str, Any], now: float) -> float | None:
    """A session's age: the time since its last activity, the `at` of its last record (the
    records upkeep writes carry it forward); a plain log's, since its newest segment was
    modified. None when neither is known (an unreadable or archived plain log)."""
    at = entry.get("last_record_at")
    if at is None and "://" not in entry["path"] and entry["status"] != "unreadable":
        try:
            at = segment_count(entry["path"])[1]
        except OSError:
            at = None
    return None if at is None else max(0.0, now - at)


def _record_time(raw: bytes | None) -> float | None:
    """The `at` of a record, if it decodes to a plausible Unix time."""
    if raw is None:
        return None
    try:
        record = decode_record(raw)
    except (ValueError, RecursionError):
        return None
    return time_of(record.get("at")) if isinstance(record, dict) else None


def _executor(jobs: int) -> Executor | None:
    if jobs <= 1:
        return None
    try:
        return ProcessPoolExecutor(max_workers=jobs)
    except (OSError, NotImplementedError, ImportError):  # no working multiprocessing here
        return ThreadPoolExecutor(max_workers=jobs)


def run_checks(logs: list[str], jobs: int,
               progress: Callable[[Iterable[dict[str, Any]]], Iterator[dict[str, Any]]]
               ) -> list[dict[str, Any]]:
    executor = _executor(min(jobs, len(logs)))
    if executor is None:
        return list(progress(check_log(path) for path in logs))
    with executor:
        chunk = max(1, len(logs) // (jobs * 8))
        return list(progress(executor.map(check_log, logs, chunksize=chunk)))


def _progress(total: int, desc: str = "sweeping"
              ) -> Callable[[Iterable[dict[str, Any]]], Iterator[dict[str, Any]]]:
    def passthrough(items: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        yield from items

    try:
        if not sys.stderr.isatty() or os.environ.get("WALJ_NO_PROGRESS"):
            return passthrough
        from tqdm import tqdm  # type: ignore[import-untyped,unused-ignore]
    except (ImportError, AttributeError, ValueError):
        return passthrough

    def bar(items: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        yield from tqdm(items, total=total, desc=desc, unit="log", delay=0.5,
                        leave=False, file=sys.stderr)

    return bar


def check_archived(url: str) -> dict[str, Any]:
    """`check_log` of one archived session, read through an archive view. Never raises."""
    from ..archive._view import open_view

    try:
        view = open_view(url)
        entry = check_log(view.directory, view)
        cuts = view.quarantine().summary()  # checked by check_log: its problems are counted
    except (OSError, WaljError) as exc:
        return _entry(url, "unreadable", detail=f"{url}: {exc}")
    entry["path"] = url
    entry["quarantine"] = cuts
    if cuts["cuts"]:
        entry["detail"] = "; ".join(filter(None, [
            entry["detail"], f"{plural(cuts['cuts'], 'quarantined cut')} ({cuts['bytes']:,} "
            "bytes) archived"]))
    return entry


def archived_logs(root: str) -> list[str]:
    """The archived sessions under an archive root URL, for `walj sweep URL`."""
    from ..archive import ArchiveError, archived_sessions

    try:
        return archived_sessions(root)
    except (ArchiveError, ImportError) as exc:
        raise CliError(str(exc)) from None


def check_archived_logs(urls: list[str], jobs: int) -> list[dict[str, Any]]:
    # Threads, not processes: reading objects waits on the network, not on the CPU.
    if jobs <= 1 or len(urls) <= 1:
        return [check_archived(url) for url in urls]
    with ThreadPoolExecutor(max_workers=min(jobs, len(urls))) as pool:
        return list(pool.map(check_archived, urls))


def _relative(path: str, root: str) -> str:
    if "://" in root:
        return path[len(root.rstrip("/")) + 1:] if path.startswith(root.rstrip("/")) else path
    return os.path.relpath(path, root)


def cmd_sweep(args: argparse.Namespace) -> int:
    root: str = args.root
    jobs = args.jobs if args.jobs is not None else min(8, os.cpu_count() or 1)
    if jobs < 1:
        raise CliError("--jobs must be at least 1")
    if "://" in root:
        logs, unreadable = archived_logs(root), list[dict[str, Any]]()
    else:
        logs, unreadable = find_logs(root)
    if not logs and not unreadable:
        raise CliError(f"{root} holds no walj log (no directory with seg-*.jsonl segments)")
    if "://" in root:
        results = check_archived_logs(logs, jobs) + unreadable
    else:
        results = run_checks(logs, jobs, _progress(len(logs))) + unreadable
    results.sort(key=lambda e: e["path"])
    counts = {status: 0 for status in STATUSES}
    for entry in results:
        counts[entry["status"]] += 1
    code = EXIT_OK if all(e["status"] in FINE for e in results) else EXIT_PROBLEMS
    if args.json:
        emit_json({"schema": "walj.sweep/2", "root": root, "logs": len(results),
                   "counts": counts, "sessions": results})
        return code
    shown = results if args.all else [e for e in results if e["status"] not in FINE]
    summary = ", ".join(f"{counts[s]} {s}" for s in STATUSES if counts[s] or s in FINE)
    lines = [f"{root}: {plural(len(results), 'log')}: {summary}"]
    if shown:
        now = time.time()
        rows = [(_relative(e["path"], root), e["status"].upper()
                 if e["status"] not in FINE else e["status"], duration(age_of(e, now)),
                 e["records"], len(e["blockers"]), e["problem_count"],
                 short(e["detail"], 80)) for e in shown]
        lines += [""] + table(("LOG", "STATUS", "AGE", "RECORDS", "BLOCKERS", "PROBLEMS",
                               "DETAIL"), rows, right=(2, 3, 4, 5))
    if code != EXIT_OK:
        lines += ["", "Next: `walj inspect LOG` for a blocked log, `walj verify LOG` for a "
                  "corrupt one."]
    write_lines(lines)
    return code
