"""The approval commands: `walj approvals ROOT` (the pending requests and unused approvals of every
session under ROOT, read as `sweep` reads them), and `walj approve` and `walj deny` (decide one,
directly or through the live writer that holds the session)."""

from __future__ import annotations

import argparse
import datetime
import math
import re
import time
from typing import Any

from ._approvalview import APPROVAL_HEADERS, approval_json, approval_rows, expiry_text
from ._common import (
    EXIT_OK,
    EXIT_PROBLEMS,
    CliError,
    clock,
    emit_json,
    plural,
    scan,
    segment_names,
    short,
    table,
    write_lines,
)
from ._model import (
    DEFAULT_WAIT,
    approve_session,
    deny_session,
    kind_of,
    known_ids,
    lookup_approval,
)
from ._sweep import checked_sessions, job_count, relative
from ._write import ask_session, expand, queued

# The refusals that are the caller's mistake (exit 2, as an unknown execution id for `resolve`);
# every other one is a refused write (exit 1).
_USAGE_REASONS = ("unknown", "bad_expiry", "bad_actor", "note_required", "bad_note")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"(\d{1,9})([smhdw])")
_WHOLE_ID = re.compile(r"apv-[0-9a-f]{32}")


# --- walj approvals ROOT ----------------------------------------------------------------------

# Sessions whose approvals cannot all be listed: their state is not what a writer would see.
_UNLISTED = ("corrupt", "unsupported", "unreadable")


def cmd_approvals(args: argparse.Namespace) -> int:
    root: str = args.root
    results = checked_sessions(root, job_count(args))
    now = time.time()
    listed: list[dict[str, Any]] = []
    for entry in results:
        for approval in entry.get("approvals", ()):
            if args.all or approval["status"] != "expired":
                listed.append({"path": entry["path"], **approval})
    problems = [{"path": e["path"], "status": e["status"], "detail": e["detail"]}
                for e in results if e["status"] in _UNLISTED]
    pending = sum(1 for a in listed if a["status"] == "pending")
    if args.json:
        emit_json({"schema": "walj.approvals/1", "root": root, "now": round(now, 3),
                   "logs": len(results), "pending": pending, "approved": len(listed) - pending,
                   "approvals": listed, "unlisted": problems})
    else:
        write_lines(_approvals_text(root, results, listed, problems, pending, now))
    return EXIT_PROBLEMS if problems else EXIT_OK


def _approvals_text(root: str, results: list[dict[str, Any]], listed: list[dict[str, Any]],
                    problems: list[dict[str, Any]], pending: int, now: float) -> list[str]:
    lines = [f"{root}: {plural(len(results), 'log')}: {plural(pending, 'pending request')}, "
             f"{plural(len(listed) - pending, 'approval')} approved and not used yet"]
    if listed:
        rows = [row for a in listed for row in approval_rows([a], now, relative(a["path"], root))]
        lines += [""] + table(("SESSION", *APPROVAL_HEADERS), rows)
    if problems:
        lines += ["", f"Not listed: {plural(len(problems), 'log')} whose state cannot be "
                  "read whole (`walj verify LOG`):"]
        lines += table(("LOG", "STATUS", "DETAIL"),
                       [(relative(p["path"], root), p["status"].upper(), short(p["detail"], 80))
                        for p in problems])
    if pending:
        lines += ["", "Decide each on the record, once you have checked its arguments "
                  "(`walj inspect SESSION` shows them):",
                  "  walj approve SESSION APPROVAL --actor NAME [--note TEXT] [--expires-in 1h]",
                  "  walj deny    SESSION APPROVAL --actor NAME [--note TEXT]"]
    return lines


# --- walj approve / walj deny -----------------------------------------------------------------


def parse_duration(text: str) -> float:
    """`30s`, `15m`, `12h`, `7d` or `2w`, in seconds."""
    match = _DURATION.fullmatch(text.strip())
    if match is None or int(match.group(1)) == 0:
        raise CliError(f"--expires-in takes a whole number above 0 and a unit, s, m, h, d or w "
                       f"(such as 1h), not {short(text, 40)!r}")
    return float(int(match.group(1)) * _UNITS[match.group(2)])


def parse_instant(text: str) -> float:
    """An ISO 8601 time (`2026-12-05T18:00:00Z`, `...+01:00`; without an offset: UTC) as Unix
    seconds."""
    value = text.strip()
    try:
        when = datetime.datetime.fromisoformat(value[:-1] + "+00:00" if value[-1:] in "Zz"
                                               and value else value)
    except ValueError:
        raise CliError(f"--expires-at takes an ISO 8601 time such as 2026-12-05T18:00:00Z, "
                       f"not {short(text, 40)!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return when.timestamp()


def _expires_at(args: argparse.Namespace) -> float | None:
    if getattr(args, "expires_in", None) is not None:
        return time.time() + parse_duration(args.expires_in)
    if getattr(args, "expires_at", None) is not None:
        at = parse_instant(args.expires_at)
        if at <= time.time():
            raise CliError(f"--expires-at {short(args.expires_at, 40)} is not in the future")
        return at
    return None


def _wait(args: argparse.Namespace) -> float:
    if args.wait is not None and not (math.isfinite(args.wait) and args.wait >= 0):
        raise CliError(f"--wait takes a number of seconds, 0 or more, not {args.wait}")
    return 0.0 if args.no_wait else (DEFAULT_WAIT if args.wait is None else args.wait)


def _check_journal(path: str) -> None:
    names = segment_names(path)
    _, records = scan(path, names)
    first = next(records, None)
    if first is not None and kind_of(first[1]) == "-":
        raise CliError(f"{path} is a walj log but not a tool journal: nothing to approve")


def _approval_id(path: str, given: str) -> str:
    """The approval id in full: as given, or expanded from a unique prefix of 6 or more
    characters (with or without `apv-`) among the ids the log names, as `walj resolve`
    expands an execution id."""
    wanted = given if given.startswith("apv-") else f"apv-{given}"
    if _WHOLE_ID.fullmatch(wanted) or len(given) < 6:
        return given
    return expand(wanted, {i for i in known_ids(path) if i.startswith("apv-")})


def _decide(args: argparse.Namespace, decision: str) -> Any:
    """Approve or deny directly, or through a request to the live writer; refusals as
    CliError with the exit code `walj resolve` gives the same kind of refusal."""
    path: str = args.path
    wait = _wait(args)
    args.approval_id = _approval_id(path, args.approval_id)
    expires_at = _expires_at(args) if decision == "approved" else None

    def ask() -> Any:
        if decision == "approved":
            return approve_session(path, args.approval_id, actor=args.actor, note=args.note,
                                   expires_at=expires_at, wait=wait)
        return deny_session(path, args.approval_id, actor=args.actor, note=args.note,
                            wait=wait)

    return ask_session(path, ask, _USAGE_REASONS)


def cmd_approve(args: argparse.Namespace) -> int:
    return _cmd_decide(args, "approved")


def cmd_deny(args: argparse.Namespace) -> int:
    return _cmd_decide(args, "denied")


def _cmd_decide(args: argparse.Namespace, decision: str) -> int:
    path: str = args.path
    schema = "walj.approve/1" if decision == "approved" else "walj.deny/1"
    _check_journal(path)
    done = _decide(args, decision)
    if done.status == "queued":
        return queued(args, done.request_id, schema, {"approval": None})
    now = time.time()
    # As it stands after the decision: from the writer that applied it, else read back.
    approval = done.approval or lookup_approval(path, args.approval_id)
    entry = None if approval is None else approval_json(approval, now)
    if args.json:
        emit_json({"schema": schema, "path": path, "status": "applied",
                   "request_id": done.request_id, "approval": entry})
        return EXIT_OK
    how = "durable" if done.request_id is None else "durable, applied by the live writer"
    if entry is None:  # decided, but the log could not be read back just now (a compaction)
        write_lines([f"{decision} {args.approval_id} ({how})"])
        return EXIT_OK
    lines = [f"{decision} {entry['approval_id']} ({short(entry['tool'], 40)}, call "
             f"{short(entry['call_id'], 40)}) by {entry['actor']} at {clock(entry['decided_at'])} "
             f"UTC ({how})",
             f"  arguments  sha256:{entry['arguments_sha256']}  "
             f"{short(entry['arguments_preview'], 120)}"]
    if entry["note"] is not None:
        lines.append(f"  note: {short(entry['note'], 200)}")
    if decision == "approved":
        lines.append(f"  expires  {expiry_text(entry, now)}")
        lines.append("  the next dispatch of this call id with these arguments runs it, once")
    else:
        lines.append("  every dispatch of this call id is answered `denied`; nothing runs")
    write_lines(lines)
    return EXIT_OK
