"""The approval commands: `walj approvals ROOT`, the pending requests and unused approvals of every
session under ROOT, read as `sweep` reads them."""

from __future__ import annotations

import argparse
import re
import time
from typing import Any

from ._approvalview import APPROVAL_HEADERS, approval_rows
from ._common import (
    EXIT_OK,
    EXIT_PROBLEMS,
    emit_json,
    plural,
    short,
    table,
    write_lines,
)
from ._sweep import checked_sessions, job_count, relative

# The refusals that are the caller's mistake (exit 2, as an unknown execution id for `resolve`);
# every other one is a refused write (exit 1).
_USAGE_REASONS = ("unknown", "bad_expiry", "bad_actor", "note_required", "bad_note")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"(\d{1,9})([smhdw])")


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
        write_lines(_approvals_text(root, results, listed, problems, pending, now, relative))
    return EXIT_PROBLEMS if problems else EXIT_OK


def _approvals_text(root: str, results: list[dict[str, Any]], listed: list[dict[str, Any]],
                    problems: list[dict[str, Any]], pending: int, now: float,
                    relative: Any) -> list[str]:
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
                  "  walj deny    SESSION APPROVAL --actor NAME --note TEXT"]
    return lines
