"""The two commands that write: `walj resolve` (settle a blocker on the record, directly or
through a request the live writer applies) and `walj repair` (cut a torn tail or damaged
suffix into quarantine, under the writer lock)."""

from __future__ import annotations

import argparse
import math
import os
import re
from collections.abc import Callable, Container
from typing import Any

from ..errors import (
    ApprovalError,
    CorruptionError,
    LockedError,
    RecordTooLargeError,
    ResolutionError,
)
from ..log import REQUESTS_DIR
from ..log.format import QUARANTINE_DIR
from ..log.fs import DEFAULT_FS
from ..log.lock import read_owner
from ..log.quarantine import cut_length, cut_segment
from ..log.scan import LogScan
from ._common import (
    EXIT_OK,
    EXIT_PROBLEMS,
    EXIT_QUEUED,
    EXIT_USAGE,
    CliError,
    clock,
    emit_json,
    os_error,
    plural,
    scan,
    segment_names,
    short,
    write_lines,
)
from ._inspect import resolution_json
from ._model import DEFAULT_WAIT, kind_of, known_ids, resolve_session, resolve_session_turn

# --- resolve ---------------------------------------------------------------------------------

_USAGE_REASONS = ("unknown", "bad_outcome", "bad_actor", "note_required")
_WHOLE_ID = re.compile(r"[0-9a-f]{32}")  # an execution or LLM call id, given in full


def expand(prefix: str, candidates: set[str]) -> str:
    """A unique prefix (6+ characters) of an id the log names, expanded; else as given. Every
    id counts, resolved or not, so a prefix gets the same answer as the whole id."""
    if len(prefix) < 6 or prefix in candidates:
        return prefix
    matches = [c for c in candidates if c.startswith(prefix)]
    if len(matches) > 1:
        raise CliError(f"{prefix!r} is a prefix of {len(matches)} ids: give more of it")
    return matches[0] if matches else prefix


def _check_args(args: argparse.Namespace) -> None:
    if (args.execution_id is None) == (args.turn is None):
        raise CliError("give either an EXECUTION_ID or --turn N")
    if args.turn is not None and args.outcome is not None:
        raise CliError("--outcome is for an execution; a turn is resolved without one")
    if args.execution_id is not None and args.outcome is None:
        raise CliError("--outcome succeeded|failed|not_performed (reviewed for log damage) "
                       "is required")
    if args.wait is not None and not (math.isfinite(args.wait) and args.wait >= 0):
        raise CliError(f"--wait takes a number of seconds, 0 or more, not {args.wait}")


def _ask(args: argparse.Namespace) -> Any:
    """Resolve directly, or through a request to the live writer; refusals as CliError."""
    path: str = args.path
    wait = 0.0 if args.no_wait else (DEFAULT_WAIT if args.wait is None else args.wait)

    def ask() -> Any:
        if args.turn is not None:
            return resolve_session_turn(path, args.turn, note=args.note, actor=args.actor,
                                        wait=wait)
        eid = args.execution_id
        if len(eid) >= 6 and not _WHOLE_ID.fullmatch(eid):  # only a prefix reads the log
            eid = expand(eid, known_ids(path))
        return resolve_session(path, eid, args.outcome, note=args.note, actor=args.actor,
                               wait=wait)

    return ask_session(path, ask, _USAGE_REASONS)


def ask_session(path: str, ask: Callable[[], Any], usage_reasons: Container[str]) -> Any:
    """What `ask` (a resolve_session-like call) answered, each refusal as a CliError: exit 2
    for a refusal whose reason is in `usage_reasons` (bad input), else 1. `resolve`, `approve`
    and `deny` share it, so a refusal reads and exits alike whichever of them made it."""
    try:
        done = ask()
    except (ResolutionError, ApprovalError) as exc:
        code = EXIT_USAGE if exc.reason in usage_reasons else EXIT_PROBLEMS
        raise CliError(f"refused: {exc}", code) from None
    except RecordTooLargeError as exc:
        raise CliError(f"refused: {exc}") from None
    except CorruptionError as exc:
        raise CliError(f"{path}: {exc} (see `walj verify`, then `walj repair`)",
                       EXIT_PROBLEMS) from None
    if done.status == "refused":
        code = EXIT_USAGE if done.reason in usage_reasons else EXIT_PROBLEMS
        by = " by the live writer" if done.request_id else ""
        raise CliError(f"refused{by}: {done.error or done.reason}", code)
    return done


def cmd_resolve(args: argparse.Namespace) -> int:
    path: str = args.path
    _check_args(args)
    names = segment_names(path)
    _, records = scan(path, names)
    first = next(records, None)
    if first is not None and kind_of(first[1]) == "-":
        raise CliError(f"{path} is a walj log but not a tool journal: nothing to resolve")
    done = _ask(args)
    if done.status == "queued":
        return queued(args, done.request_id, "walj.resolve/1",
                      {"resolution": None, "blocked": None, "blockers_left": None})
    resolution, after = done.resolution, done.recovery
    if args.json:
        emit_json({"schema": "walj.resolve/1", "path": path, "status": "applied",
                   "request_id": done.request_id, "resolution": resolution_json(resolution),
                   "blocked": after.blocked if after else None,
                   "blockers_left": len(after.blockers) if after else None})
        return EXIT_OK
    if resolution.kind == "turn":
        what = f"turn {resolution.turn_sequence}"
    elif resolution.kind == "log_cut":
        what = f"cut bytes {resolution.execution_id} (quarantine/)"
    else:
        what = f"execution {resolution.execution_id} ({resolution.tool})"
    how = "durable" if done.request_id is None else "durable, applied by the live writer"
    lines = [f"resolved {what}: {resolution.outcome} by {resolution.actor} at "
             f"{clock(resolution.at)} UTC (seq {resolution.seq}, {how})",
             f"  note: {short(resolution.note, 200)}"]
    if after is not None and after.blocked:
        lines.append(f"  still blocked by {plural(len(after.blockers), 'blocker')}: "
                     f"`walj inspect {path}`")
    elif after is not None:
        lines.append("  no blocker left: dispatch resumes")
    write_lines(lines)
    return EXIT_OK


def queued(args: argparse.Namespace, request_id: str, schema: str,
           unanswered: dict[str, None]) -> int:
    """Report a request the live writer did not answer in time (exit 3): `resolve`, `approve`
    and `deny` alike. `unanswered`: the command's JSON fields that only an answer fills."""
    path: str = args.path
    owner = read_owner(path) or "owner unknown"
    if args.json:
        emit_json({"schema": schema, "path": path, "status": "queued", "request_id": request_id,
                   **unanswered})
    else:
        write_lines([f"queued: request {request_id} in {path}/{REQUESTS_DIR}/ (durable); the "
                     f"live writer ({owner}) did not answer in time",
                     "  it is applied or refused once, when that writer next looks or the "
                     "session is next opened: see `walj inspect` or `walj dump --kind "
                     "resolution_refused`"])
    return EXIT_QUEUED


# --- repair ---------------------------------------------------------------------------------


def plan_cuts(path: str) -> tuple[list[tuple[str, int, str]], LogScan]:
    """Where the log must be cut so that what stays verifies: at its first problem (or its torn
    tail), every later segment whole, last segment first. Refuses what a cut cannot fix."""
    log_scan = LogScan(path, mode="salvage")
    try:
        for _ in log_scan:
            pass
    except OSError as exc:
        raise os_error(exc) from None
    for problem in log_scan.problems:
        if problem.kind == "unsupported_version":
            raise CliError(f"refused: {problem.file} has a format version this walj does not "
                           "know; repair it with the walj that wrote it", EXIT_PROBLEMS)
        if problem.kind in ("symlink", "not_a_regular_file"):
            what = "a symbolic link" if problem.kind == "symlink" else "not a regular file"
            raise CliError(f"refused: {problem.file} is {what}; move it out of the log by "
                           "hand, then run repair again", EXIT_PROBLEMS)
    cuts = log_scan.cuts(segment_names(path),
                         lambda name: os.path.getsize(os.path.join(path, name)),
                         through_damage=True)
    return cuts, log_scan


def cmd_repair(args: argparse.Namespace) -> int:
    path: str = args.path
    segment_names(path)
    lock = None
    if not args.dry_run:
        from ..log.lock import WriterLock

        try:
            lock = WriterLock(DEFAULT_FS, path, 0)
        except LockedError as exc:
            owner = exc.owner or "owner unknown"
            raise CliError(f"refused: a live writer holds {path} ({owner}); repair only once "
                           "it has stopped", EXIT_PROBLEMS) from None
    try:
        cuts, _ = plan_cuts(path)
        done: list[dict[str, Any]] = []
        for name, offset, kind in cuts:
            length = cut_length(DEFAULT_FS, os.path.join(path, name), offset)
            entry: dict[str, Any] = {"segment": name, "offset": offset, "length": length,
                                     "kind": kind, "quarantine_file": None, "sha256": None}
            if not args.dry_run:
                try:
                    q = cut_segment(DEFAULT_FS, path, name, offset, kind)
                except OSError as exc:
                    raise os_error(exc) from None
                entry.update(length=q.length, quarantine_file=f"{QUARANTINE_DIR}/{q.file}",
                             sha256=q.sha256)
            done.append(entry)
        ok_after = None
        if not args.dry_run and cuts:
            after = LogScan(path, mode="salvage")
            for _ in after:
                pass
            ok_after = not after.problems and after.torn_tail is None
    finally:
        if lock is not None:
            lock.release()
    if args.json:
        emit_json({"schema": "walj.repair/1", "path": path, "dry_run": args.dry_run,
                   "clean_before": not cuts, "cuts": done, "ok_after": ok_after})
    else:
        write_lines(_repair_text(path, args.dry_run, done, ok_after))
    if ok_after is False:
        return EXIT_PROBLEMS
    return EXIT_OK


def _repair_text(path: str, dry_run: bool, done: list[dict[str, Any]],
                 ok_after: bool | None) -> list[str]:
    if not done:
        return [f"{path}: nothing to repair (no torn tail, no damage)"]
    total = sum(e["length"] for e in done)
    verb = "would move" if dry_run else "moved"
    lines = [f"{path}: {verb} {total:,} bytes from {plural(len(done), 'segment')} to "
             f"{QUARANTINE_DIR}/ (nothing is deleted):"]
    for e in done:
        where = f" -> {e['quarantine_file']}" if e["quarantine_file"] else ""
        whole = " (whole segment)" if e["offset"] == 0 else ""
        lines.append(f"  {e['segment']} from byte {e['offset']:,}: {e['length']:,} bytes, "
                     f"{e['kind']}{whole}{where}")
    if dry_run:
        lines.append("dry run: nothing was changed; run without --dry-run to cut")
    elif ok_after:
        lines.append(f"the log verifies now; each cut is listed in {QUARANTINE_DIR}/MANIFEST.jsonl")
    else:
        lines.append("the log still has problems after the cut: run `walj verify`")
    return lines
