"""`walj prune ROOT --older-than AGE`: retention over a root of sessions. Ended sessions (and,
with --include-idle, idle ones) are archived, then removed; long active ones compacted; a
blocked one is never touched; a directory is removed only when every entry in it is accounted
for."""

from __future__ import annotations

import argparse
import os
import re
import time
from collections.abc import Callable
from typing import Any

from ..archive import is_url
from ..errors import WaljError
from ._accounting import survey
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
from ._model import MAX_KEEP_TURNS
from ._retire import (
    Busy,
    Kept,
    Nested,
    Removal,
    Unaccounted,
    compact,
    end_idle,
    finish_tombstone,
    remove,
)
from ._sweep import age_of, find_logs, job_count, progress_over, relative, run_checks, segment_count

ACTIONS = ("removed", "removed_idle", "compacted", "finished_removal", "would_remove",
           "would_remove_idle", "would_compact", "would_finish_removal", "kept_young",
           "kept_active", "kept_unarchived", "kept_nested", "kept_unaccounted", "kept_changed",
           "busy", "kept_blocked", "kept_problem", "failed")
PROBLEMS = frozenset({"kept_blocked", "kept_problem", "kept_unaccounted", "failed"})  # exit 1
QUIET = frozenset({"kept_young", "kept_active"})  # listed with --all only
GOING = frozenset({"removed", "removed_idle", "finished_removal", "would_remove",
                   "would_remove_idle", "would_finish_removal"})
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
              "archived": [], "dropped_segments": 0, "quarantine_unarchived": 0,
              "detail": detail}
    result.update(fields)
    return result


def decide(entry: dict[str, Any], args: argparse.Namespace, older_than: float,
           now: float, gone: frozenset[str] = frozenset()) -> dict[str, Any]:
    """What to do with one checked session, done (or, with --dry-run, only said). `gone`:
    the directories a dry run said it would remove."""
    status = entry["status"]
    age = age_of(entry, now)
    if status == "blocked":
        return _result(entry, "kept_blocked", f"never removed while blocked: {entry['detail']}",
                       age)
    if status not in ("active", "ended"):
        return _result(entry, "kept_problem", f"{status}: {entry['detail']}", age)
    if age is None or age < older_than:
        return _result(entry, "kept_young", age=age)
    if status == "ended":
        return _retire_whole(entry, args, age, None, gone)
    if entry["plain"]:
        return _result(entry, "kept_active", "a plain walj log: prune compacts tool journals "
                       "only (Log.drop_before is the plain log's call)", age)
    if args.include_idle:
        return _retire_whole(entry, args, age, now - older_than, gone)
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


def _retire_whole(entry: dict[str, Any], args: argparse.Namespace, age: float,
                  idle_since: float | None, gone: frozenset[str]) -> dict[str, Any]:
    """Remove an old ended session, or (`idle_since` given) end an idle one first, as upkeep
    that keeps its age, and remove it then."""
    idle = idle_since is not None
    what = "idle: never ended, no record for longer than --older-than" if idle else "ended"
    if args.archive is None and not args.delete_unarchived:
        return _result(entry, "kept_unarchived", f"{what}: give --archive URL to archive then "
                       "remove it, or --delete-unarchived", age)
    try:  # before any lock or upload: a directory that would be kept anyway is left alone
        found = survey(entry["path"], gone if args.dry_run else frozenset())
    except OSError as exc:
        return _result(entry, "failed", f"cannot list it: {exc.strerror}", age)
    if found.unaccounted:
        return _result(entry, "kept_unaccounted", found.reason_kept(), age)
    if found.nested:
        return _result(entry, "kept_nested", found.reason_kept(), age)
    if args.dry_run:
        said = ["would end it first"] if idle else []
        if found.quarantined and args.archive is not None:
            said.append(f"only if its {len(found.quarantined)} quarantined file(s) verify in "
                        "the archive")
        return _result(entry, "would_remove_idle" if idle else "would_remove",
                       "; ".join(said) or None, age)
    notes: list[str] = []

    def removed() -> dict[str, Any]:
        expected = entry["last_seq"]
        if idle_since is not None:
            expected = end_idle(entry["path"], idle_since)
            notes.append("ended by prune (idle)")
        done: Removal = remove(entry["path"], args.archive, expected)
        detail = "archived and verified first" if done.archived else \
            "not archived (--delete-unarchived)"
        if done.quarantine_unarchived:
            detail += f"; {done.quarantine_unarchived} quarantined file(s) deleted unarchived"
        return _result(entry, "removed_idle" if idle else "removed", "; ".join([*notes, detail]),
                       age, archived=done.archived,
                       quarantine_unarchived=done.quarantine_unarchived)

    return _attempt(entry, age, removed, notes)


def _attempt(entry: dict[str, Any], age: float, step: Callable[[], dict[str, Any]],
             notes: list[str] | None = None) -> dict[str, Any]:
    """Run one session's step; what stopped it is that session's action, never the run's.
    `notes`: what the step did before it stopped, put before the reason."""
    try:
        return step()
    except (Busy, Kept, WaljError, OSError) as exc:
        return _result(entry, _stopped(exc), "; ".join([*(notes or []), str(exc)]), age)


# What stopped a session's step, as its action: the first entry whose class it is.
_STOPPED: tuple[tuple[type[Exception] | tuple[type[Exception], ...], str], ...] = (
    (Busy, "busy"), (Nested, "kept_nested"), (Unaccounted, "kept_unaccounted"),
    (Kept, "kept_changed"), ((WaljError, OSError), "failed"))


def _stopped(exc: Exception) -> str:
    return next(action for kind, action in _STOPPED if isinstance(exc, kind))


def _finish(tombstone: str, dry_run: bool) -> dict[str, Any]:
    entry = {"path": tombstone, "status": None}
    detail = "what an interrupted prune left (sessions it had verified and renamed)"
    if dry_run:
        try:
            found = survey(tombstone)
        except OSError as exc:
            return _result(entry, "failed", f"cannot list it: {exc.strerror}")
        if found.reason_kept() is not None:
            return _result(entry, "kept_unaccounted" if found.unaccounted else "kept_nested",
                           found.reason_kept())
        return _result(entry, "would_finish_removal", detail)
    try:
        finish_tombstone(tombstone)
    except (Busy, Nested, Unaccounted, OSError) as exc:
        return _result(entry, _stopped(exc), str(exc))
    return _result(entry, "finished_removal", detail)


def _depth_first(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The deepest sessions first: a session below another is handled before the one above,
    whose removal then finds it gone or keeps the directory (kept_nested)."""
    return sorted(entries, key=lambda e: (-os.path.normpath(e["path"]).count(os.sep),
                                          e["path"]))


def cmd_prune(args: argparse.Namespace) -> int:
    root: str = args.root
    older_than = parse_age(args.older_than)
    if not 0 <= args.keep_turns <= MAX_KEEP_TURNS:
        raise CliError(f"--keep-turns must be from 0 to {MAX_KEEP_TURNS}")
    jobs = job_count(args)
    if is_url(root):
        raise CliError("prune works on local sessions; an archive is only ever added to")
    if args.archive is not None and args.delete_unarchived:
        raise CliError("--archive and --delete-unarchived exclude each other")
    tombstones: list[str] = []
    logs, unreadable = find_logs(root, tombstones)
    entries = run_checks(logs, jobs, progress_over(len(logs), "checking")) + unreadable
    entries.sort(key=lambda e: e["path"])
    results: list[dict[str, Any]] = []
    interrupted = _prune_all(tombstones, entries, args, older_than, results)
    # Tombstones first, then sessions, each in path order.
    results.sort(key=lambda r: (r["status"] is not None, r["path"]))
    counts = {action: 0 for action in ACTIONS}
    for result in results:
        counts[result["action"]] += 1
    code = (EXIT_INTERRUPTED if interrupted else
            EXIT_PROBLEMS if any(r["action"] in PROBLEMS for r in results) else EXIT_OK)
    found = len(entries) + len(tombstones)
    if args.json:
        emit_json({"schema": "walj.prune/1", "root": root, "older_than_seconds": older_than,
                   "dry_run": args.dry_run, "archive": args.archive,
                   "include_idle": args.include_idle,
                   "keep_turns": args.keep_turns, "interrupted": interrupted,
                   "sessions_found": found, "counts": counts, "sessions": results})
    else:
        write_lines(_text(root, args, results, counts, found, interrupted))
    return code


def _prune_all(tombstones: list[str], entries: list[dict[str, Any]], args: argparse.Namespace,
               older_than: float, results: list[dict[str, Any]]) -> bool:
    """Finish the tombstones, then decide every session, deepest first, into `results`.
    True if interrupted (Ctrl-C): every step is safe to stop anywhere, and the session under
    way is whole or a tombstone."""
    now = time.time()
    gone: set[str] = set()
    try:
        for tombstone in sorted(tombstones, key=lambda t: (-t.count(os.sep), t)):
            results.append(_finish(tombstone, args.dry_run))
            if results[-1]["action"] in GOING:
                gone.add(os.path.normpath(tombstone))
        for entry in progress_over(len(entries), "pruning")(iter(_depth_first(entries))):
            results.append(decide(entry, args, older_than, now, frozenset(gone)))
            if results[-1]["action"] in GOING:
                gone.add(os.path.normpath(entry["path"]))
    except KeyboardInterrupt:
        return True
    return False


def _text(root: str, args: argparse.Namespace, results: list[dict[str, Any]],
          counts: dict[str, int], found: int, interrupted: bool) -> list[str]:
    summary = ", ".join(f"{n} {action}" for action, n in counts.items() if n)
    head = f"{root}: {plural(found, 'session')}: {summary or 'nothing done'}"
    lines = [("dry run, nothing changed: " if args.dry_run else "") + head]
    if interrupted:
        lines.append(f"interrupted after {len(results)} of {found}: the rest were not looked "
                     "at; run prune again to go on")
    lines += _session_table(root, results if args.all else
                            [r for r in results if r["action"] not in QUIET])
    actions = {r["action"] for r in results}
    return lines + [line for action, text in _NEXT.items() if action in actions
                    for line in ("", text)]


def _session_table(root: str, shown: list[dict[str, Any]]) -> list[str]:
    if not shown:
        return []
    rows = [(relative(r["path"], root), r["action"], duration(r["age_seconds"]),
             short(r["detail"], 90) if r["detail"] else "") for r in shown]
    return [""] + table(("SESSION", "ACTION", "AGE", "DETAIL"), rows)


# What to do about a session kept for a reason the user can act on.
_NEXT = {
    "kept_unaccounted": "Next: a kept_unaccounted session holds what prune cannot account for "
                        "(its DETAIL says what); move that away or archive it, then prune again.",
    "kept_blocked": "Next: `walj inspect SESSION` for a blocked session; it is kept until its "
                    "blockers are resolved.",
}
