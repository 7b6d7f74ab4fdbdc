"""`walj prune ROOT --older-than AGE`: retention over a root of sessions. Ended sessions are
archived, then removed; long active ones compacted; a blocked one is never touched."""

from __future__ import annotations

import argparse
import os
import re
import time
from collections.abc import Callable
from typing import Any

from ..errors import WaljError
from ..journal._recovery import MAX_KEEP_TURNS
from ._common import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PROBLEMS,
    CliError,
    duration,
    emit_json,
    plural,
    short,
    table,
    write_lines,
)
from ._retire import Busy, Kept, compact, finish_tombstone, remove, segment_count
from ._sweep import _progress, _relative, find_logs, run_checks

ACTIONS = ("removed", "compacted", "finished_removal", "would_remove", "would_compact",
           "would_finish_removal", "kept_young", "kept_active", "kept_unarchived",
           "kept_changed", "busy", "kept_blocked", "kept_problem", "failed")
PROBLEMS = frozenset({"kept_blocked", "kept_problem", "failed"})  # exit 1
QUIET = frozenset({"kept_young", "kept_active"})  # listed with --all only
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_AGE = re.compile(r"(\d{1,9})([smhdw])")


def parse_age(text: str) -> float:
    """`30d`, `12h`, `90m`, `45s` or `2w`, in seconds."""
    match = _AGE.fullmatch(text.strip())
    if match is None:
        raise CliError(f"--older-than takes a whole number and a unit, s, m, h, d or w (such as "
                       f"30d), not {short(text, 40)!r}")
    return float(int(match.group(1)) * _UNITS[match.group(2)])


def _result(entry: dict[str, Any], action: str, detail: str | None = None,
            age: float | None = None, **fields: Any) -> dict[str, Any]:
    result = {"path": entry["path"], "action": action, "status": entry.get("status"),
              "last_record_at": entry.get("last_record_at"), "age_seconds": age,
              "archived": [], "dropped_segments": 0, "detail": detail}
    result.update(fields)
    return result


def _age(entry: dict[str, Any], now: float) -> float | None:
    at = entry.get("last_record_at")
    if at is None:  # a plain log, or records with no time: the newest segment's mtime
        at = segment_count(entry["path"])[1]
    return None if at is None else max(0.0, now - at)


def decide(entry: dict[str, Any], args: argparse.Namespace, older_than: float,
           now: float) -> dict[str, Any]:
    """What to do with one checked session, done (or, with --dry-run, only said)."""
    status = entry["status"]
    if status == "blocked":
        return _result(entry, "kept_blocked", f"never removed while blocked: {entry['detail']}")
    if status not in ("active", "ended"):
        return _result(entry, "kept_problem", f"{status}: {entry['detail']}")
    age = _age(entry, now)
    if age is None or age < older_than:
        return _result(entry, "kept_young", age=age)
    if status == "ended":
        if args.archive is None and not args.delete_unarchived:
            return _result(entry, "kept_unarchived", "ended: give --archive URL to archive "
                           "then remove it, or --delete-unarchived", age)
        if args.dry_run:
            return _result(entry, "would_remove", None, age)

        def removed() -> dict[str, Any]:
            archived = remove(entry["path"], args.archive, entry["last_seq"])
            return _result(entry, "removed", "archived and verified first" if archived else
                           "not archived (--delete-unarchived)", age, archived=archived)

        return _attempt(entry, age, removed)
    if entry["plain"]:
        return _result(entry, "kept_active", "a plain walj log: prune compacts tool journals "
                       "only (Log.drop_before is the plain log's call)", age)
    if segment_count(entry["path"])[0] < 2:
        return _result(entry, "kept_active", "nothing sealed to compact", age)
    if args.dry_run:
        return _result(entry, "would_compact", None, age)

    def compacted() -> dict[str, Any]:
        done = compact(entry["path"], args.keep_turns, args.archive)
        if not done["dropped_segments"]:
            return _result(entry, "kept_active", "compacted: nothing to drop before the kept "
                           "turns", age, archived=done["archived"])
        return _result(entry, "compacted", f"from seq {done['first_seq']}", age,
                       archived=done["archived"], dropped_segments=done["dropped_segments"])

    return _attempt(entry, age, compacted)


def _attempt(entry: dict[str, Any], age: float, step: Callable[[], dict[str, Any]]
             ) -> dict[str, Any]:
    """Run one session's step; what stopped it is that session's action, never the run's."""
    try:
        return step()
    except Busy as exc:
        return _result(entry, "busy", str(exc), age)
    except Kept as exc:
        return _result(entry, "kept_changed", str(exc), age)
    except (WaljError, OSError) as exc:
        return _result(entry, "failed", str(exc), age)


def _finish(tombstone: str, dry_run: bool) -> dict[str, Any]:
    entry = {"path": tombstone, "status": None}
    detail = "what an interrupted prune left (sessions it had verified and renamed)"
    if dry_run:
        return _result(entry, "would_finish_removal", detail)
    try:
        finish_tombstone(tombstone)
    except Busy as exc:
        return _result(entry, "busy", str(exc))
    except OSError as exc:
        return _result(entry, "failed", str(exc))
    return _result(entry, "finished_removal", detail)


def cmd_prune(args: argparse.Namespace) -> int:
    root: str = args.root
    older_than = parse_age(args.older_than)
    if not 0 <= args.keep_turns <= MAX_KEEP_TURNS:
        raise CliError(f"--keep-turns must be from 0 to {MAX_KEEP_TURNS}")
    jobs = args.jobs if args.jobs is not None else min(8, os.cpu_count() or 1)
    if jobs < 1:
        raise CliError("--jobs must be at least 1")
    if "://" in root:
        raise CliError("prune works on local sessions; an archive is only ever added to")
    if args.archive is not None and args.delete_unarchived:
        raise CliError("--archive and --delete-unarchived exclude each other")
    tombstones: list[str] = []
    logs, unreadable = find_logs(root, tombstones)
    entries = run_checks(logs, jobs, _progress(len(logs), "checking")) + unreadable
    entries.sort(key=lambda e: e["path"])
    now = time.time()
    results: list[dict[str, Any]] = []
    interrupted = False
    try:
        for tombstone in sorted(tombstones):
            results.append(_finish(tombstone, args.dry_run))
        for entry in _progress(len(entries), "pruning")(iter(entries)):
            results.append(decide(entry, args, older_than, now))
    except KeyboardInterrupt:
        # Every step is safe to stop anywhere; the session under way is whole or a tombstone.
        interrupted = True
    counts = {action: 0 for action in ACTIONS}
    for result in results:
        counts[result["action"]] += 1
    code = (EXIT_INTERRUPTED if interrupted else
            EXIT_PROBLEMS if any(r["action"] in PROBLEMS for r in results) else EXIT_OK)
    if args.json:
        emit_json({"schema": "walj.prune/1", "root": root, "older_than_seconds": older_than,
                   "dry_run": args.dry_run, "archive": args.archive,
                   "keep_turns": args.keep_turns, "interrupted": interrupted,
                   "sessions_found": len(entries) + len(tombstones), "counts": counts,
                   "sessions": results})
        return code
    write_lines(_text(root, args, results, counts, len(entries) + len(tombstones), interrupted))
    return code


def _text(root: str, args: argparse.Namespace, results: list[dict[str, Any]],
          counts: dict[str, int], found: int, interrupted: bool) -> list[str]:
    summary = ", ".join(f"{n} {action}" for action, n in counts.items() if n)
    head = f"{root}: {plural(found, 'session')}: {summary or 'nothing done'}"
    lines = [("dry run, nothing changed: " if args.dry_run else "") + head]
    if interrupted:
        lines.append(f"interrupted after {len(results)} of {found}: the rest were not looked "
                     "at; run prune again to go on")
    shown = results if args.all else [r for r in results if r["action"] not in QUIET]
    if shown:
        rows = [(_relative(r["path"], root), r["action"],
                 "-" if r["age_seconds"] is None else duration(r["age_seconds"]),
                 short(r["detail"], 90) if r["detail"] else "") for r in shown]
        lines += [""] + table(("SESSION", "ACTION", "AGE", "DETAIL"), rows)
    if any(r["action"] == "kept_blocked" for r in results):
        lines += ["", "Next: `walj inspect SESSION` for a blocked session; it is kept until its "
                  "blockers are resolved."]
    return lines
