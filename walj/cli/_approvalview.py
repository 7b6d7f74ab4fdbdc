"""One approval as every view shows it: the documented JSON shape (`approval_json`), its status
at a moment (`expired` is never stored), and the table rows of the text views (`inspect`,
`approvals`), every string escaped."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ._common import clock, duration, short
from ._model import Approval, Recovery, age


def approval_status(a: Approval, now: float) -> str:
    """"pending", "approved", "expired" (approved, unused, past its expiry), "denied" or
    "consumed". Expired is not stored: it is the approval's expiry against `now`."""
    if a.status == "approved" and a.expires_at is not None and a.expires_at <= now:
        return "expired"
    return a.status


def approval_json(a: Approval, now: float) -> dict[str, Any]:
    """The documented JSON shape of one approval (docs/CLI.md, *approval*)."""
    return {"approval_id": a.approval_id, "status": approval_status(a, now), "tool": a.tool,
            "call_id": a.call_id, "arguments_sha256": a.arguments_sha256,
            "arguments_preview": a.arguments_preview, "idempotency_key": a.idempotency_key,
            "turn_sequence": a.turn_sequence, "requested_by": a.requested_by,
            "requested_at": a.requested_at, "age_seconds": age(a.requested_at, now),
            "actor": a.actor, "note": a.note, "decided_at": a.decided_at,
            "expires_at": a.expires_at, "execution_id": a.execution_id}


def open_approvals(rec: Recovery, now: float) -> list[dict[str, Any]]:
    """A session's pending requests, then its approved and unused ones (expired included)."""
    return [approval_json(a, now) for a in (*rec.approvals, *rec.approved)]


def expiry_text(entry: dict[str, Any], now: float) -> str:
    """When an approval expires: `-` for a pending request, `never`, or the time and how long
    from now (`EXPIRED` once past)."""
    if entry["status"] == "pending":
        return "-"
    at = entry["expires_at"]
    if at is None:
        return "never"
    if at <= now:
        return f"EXPIRED {clock(at)}"
    return f"{clock(at)} (in {duration(at - now)})"


def approval_rows(entries: Iterable[dict[str, Any]], now: float,
                  where: str | None = None) -> list[tuple[Any, ...]]:
    """Table rows (APPROVAL, STATUS, TOOL, CALL, REQUESTED (UTC), AGE, EXPIRES (UTC),
    ARGUMENTS); with `where`, each row starts with the session it is in. Every string is
    escaped by `table`: a tool name or preview is whatever a model chose."""
    rows = []
    for e in entries:
        status = "AWAITING" if e["status"] == "pending" else e["status"].upper()
        row = (e["approval_id"], status, short(e["tool"], 24), short(e["call_id"], 24),
               clock(e["requested_at"]), duration(e["age_seconds"]), expiry_text(e, now),
               short(e["arguments_preview"], 48))
        rows.append(row if where is None else (short(where, 48), *row))
    return rows


APPROVAL_HEADERS = ("APPROVAL", "STATUS", "TOOL", "CALL", "REQUESTED (UTC)", "AGE",
                    "EXPIRES (UTC)", "ARGUMENTS")
