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

from ..archive import is_url
from ..errors import UnsupportedVersionError, WaljError
from ..log import format as fmt
from ..log.fs import DEFAULT_FS, FileSystem
from ..log.scan import LogScan, list_segments
from ._accounting import OWN_DIRS, TOMBSTONE_PREFIX
from ._approvalview import open_approvals
from ._common import (
    EXIT_OK,
    EXIT_PROBLEMS,
    CliError,
    duration,
    emit_json,
    plural,
    problem_json,
    progress_bar,
    short,
    table,
    write_lines,
)
from ._model import (
    JournalState,
    Rebuild,
    Recovery,
    blocker_json,
    decode_record,
    note_unrecorded,
    rebuild,
    time_of,
)

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
        if dirpath != root and os.path.basename(dirpath).startswith(TOMBSTONE_PREFIX):
            if tombstones is not None:
                tombstones.append(dirpath)
            dirnames[:] = []
        elif not _first_visit(dirpath, seen, unreadable):
            dirnames[:] = []
        else:
            session = any(fmt.segment_index(name) is not None for name in filenames)
            if session:
                logs.append(dirpath)
            dirnames[:] = _subdirectories(dirpath, dirnames, filenames, session, unreadable)
    return sorted(logs), unreadable


def _subdirectories(dirpath: str, dirnames: list[str], filenames: list[str], session: bool,
                    unreadable: list[dict[str, Any]]) -> list[str]:
    """The directories to search below `dirpath`: never a symbolic link (listed as
    unreadable), nor a session's own directories."""
    links = {d for d in dirnames if os.path.islink(os.path.join(dirpath, d))}
    # A dangling link may be a session whose target is gone (an unmounted volume).
    dangling = [f for f in filenames if not os.path.exists(os.path.join(dirpath, f))
                and os.path.islink(os.path.join(dirpath, f))]
    for name in sorted([*links, *dangling]):
        unreadable.append(_symlink_entry(os.path.join(dirpath, name), name in links))
    return sorted(d for d in dirnames if d not in links and not (session and d in OWN_DIRS))


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
                             "plain": False, "last_record_at": None, "detail": None,
                             "approvals": []}
    entry.update(fields)
    return entry


def check_log(path: str, fs: FileSystem = DEFAULT_FS) -> dict[str, Any]:
    """Verify one log and rebuild its recovery state with the journal's own code. Never raises:
    whatever goes wrong is the log's status. Runs in a worker process (or, for an archived
    session read through `fs`, a thread)."""
    log_scan = LogScan(path, mode="salvage", fs=fs)
    timed: bytes | None = None  # the last record that carries a time

    def watch() -> Iterator[tuple[int, bytes]]:
        nonlocal timed
        for record in log_scan:
            if _TIME_FIELD in record[1]:
                timed = record[1]
            yield record

    records = watch()
    try:
        done = rebuild(records)
        for _ in records:  # after a refusal, or a plain log's first record: the scan goes on
            pass
    except OSError as exc:
        reason = "permission denied" if isinstance(exc, PermissionError) else exc.strerror
        return _entry(path, "unreadable", detail=f"{exc.filename or path}: {reason}")
    finish = getattr(fs, "finish", None)
    if finish is not None:
        finish(log_scan)
    rec, journal_error = _recovery(path, done)
    blockers = [blocker_json(b) for b in rec.blockers]
    problems = log_scan.problems
    status, detail = _status(problems, journal_error, rec, blockers, done.plain)
    return _entry(path, status, records=log_scan.records, last_seq=log_scan.last_seq,
                  blocked=rec.blocked, ended=rec.ended, blockers=blockers,
                  problem_count=len(problems),
                  problems=[problem_json(p) for p in problems[:5]],
                  torn_tail=log_scan.torn_tail is not None, plain=done.plain,
                  last_record_at=_record_time(timed), detail=detail,
                  approvals=open_approvals(rec, time.time()))


def _recovery(path: str, done: Rebuild) -> tuple[Recovery, tuple[str, str] | None]:
    """The recovery view of a rebuild, and what the journal refused as (status, detail)."""
    refusal = done.refusal
    journal_error = None
    if isinstance(refusal, UnsupportedVersionError):
        journal_error = ("unsupported", short(refusal, 200))
    elif refusal is not None:
        journal_error = ("corrupt", short(f"journal: {refusal}", 200))
    try:
        if refusal is None and not done.plain and done.state.records:
            note_unrecorded(path, done.state.cuts)
        return done.state.snapshot(), journal_error
    except (WaljError, OSError) as exc:  # a blocker's record is decoded only now; quarantine/
        return (JournalState().snapshot(),
                journal_error or ("corrupt", short(f"journal: {exc}", 200)))


def _status(problems: list[Any], journal_error: tuple[str, str] | None, rec: Recovery,
            blockers: list[dict[str, Any]], plain: bool) -> tuple[str, str | None]:
    """A checked log's status, and the detail that says why (a blocked log's: its blockers)."""
    detail = short(problems[0].describe(), 200) if problems else None
    if any(p.kind == "unsupported_version" for p in problems):
        return "unsupported", detail
    if problems:
        return "corrupt", detail
    if journal_error is not None:
        return journal_error
    if rec.blocked:
        return "blocked", "; ".join(f"{b['tool'] or 'turn ' + str(b['turn_sequence'])} "
                                    f"{b['state']}" for b in blockers[:3])
    # An ended session with blockers stays "blocked" above: its blockers stay visible.
    return ("ended" if rec.ended else "active",
            "a plain walj log, not a tool journal" if plain else None)


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
    if at is None and not is_url(entry["path"]) and entry["status"] != "unreadable":
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


def progress_over(total: int, desc: str = "sweeping"
              ) -> Callable[[Iterable[dict[str, Any]]], Iterator[dict[str, Any]]]:
    tqdm = progress_bar()

    def shown(items: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        if tqdm is None:
            yield from items
        else:
            yield from tqdm(items, total=total, desc=desc, unit="log", delay=0.5, leave=False,
                            file=sys.stderr)

    return shown


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


def relative(path: str, root: str) -> str:
    if is_url(root):
        return path[len(root.rstrip("/")) + 1:] if path.startswith(root.rstrip("/")) else path
    return os.path.relpath(path, root)


def cmd_sweep(args: argparse.Namespace) -> int:
    root: str = args.root
    results = checked_sessions(root, job_count(args))
    counts = {status: 0 for status in STATUSES}
    for entry in results:
        counts[entry["status"]] += 1
    code = EXIT_OK if all(e["status"] in FINE for e in results) else EXIT_PROBLEMS
    if args.json:
        emit_json({"schema": "walj.sweep/2", "root": root, "logs": len(results),
                   "counts": counts, "sessions": results})
    else:
        write_lines(_sweep_text(root, results, counts, args.all))
    return code


def job_count(args: argparse.Namespace) -> int:
    """--jobs, or the CPU count (at most 8)."""
    jobs: int = args.jobs if args.jobs is not None else min(8, os.cpu_count() or 1)
    if jobs < 1:
        raise CliError("--jobs must be at least 1")
    return jobs


def checked_sessions(root: str, jobs: int) -> list[dict[str, Any]]:
    """Every session under `root` (a directory, or an archive's URL) checked, in path order."""
    if is_url(root):
        logs, unreadable = archived_logs(root), list[dict[str, Any]]()
    else:
        logs, unreadable = find_logs(root)
    if not logs and not unreadable:
        raise CliError(f"{root} holds no walj log (no directory with seg-*.jsonl segments)")
    if is_url(root):
        results = check_archived_logs(logs, jobs) + unreadable
    else:
        results = run_checks(logs, jobs, progress_over(len(logs))) + unreadable
    results.sort(key=lambda e: e["path"])
    return results


def _sweep_text(root: str, results: list[dict[str, Any]], counts: dict[str, int],
                every: bool) -> list[str]:
    shown = results if every else [e for e in results if e["status"] not in FINE]
    summary = ", ".join(f"{counts[s]} {s}" for s in STATUSES if counts[s] or s in FINE)
    lines = [f"{root}: {plural(len(results), 'log')}: {summary}"]
    waiting = [e for e in results if any(a["status"] == "pending" for a in e["approvals"])]
    if waiting:  # not a problem: a pending request blocks nothing, but a person is awaited
        count = sum(a["status"] == "pending" for e in waiting for a in e["approvals"])
        lines.append(f"{plural(count, 'approval request')} pending in "
                     f"{plural(len(waiting), 'log')}: `walj approvals {root}`")
    if shown:
        now = time.time()
        rows = [(relative(e["path"], root), e["status"].upper()
                 if e["status"] not in FINE else e["status"], duration(age_of(e, now)),
                 e["records"], len(e["blockers"]), e["problem_count"],
                 short(e["detail"], 80)) for e in shown]
        lines += [""] + table(("LOG", "STATUS", "AGE", "RECORDS", "BLOCKERS", "PROBLEMS",
                               "DETAIL"), rows, right=(2, 3, 4, 5))
    if any(e["status"] not in FINE for e in results):
        lines += ["", "Next: `walj inspect LOG` for a blocked log, `walj verify LOG` for a "
                  "corrupt one."]
    return lines
