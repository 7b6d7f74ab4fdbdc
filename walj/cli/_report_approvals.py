"""The approvals `walj report` shows of a session: each approval request, read from its
records (`tool_approval_requested`, `tool_approval_decided`, an intent's `approval_id`), and
what came of it (pending, approved, denied, expired, consumed), who decided it and why."""

from __future__ import annotations

from typing import Any

from ._common import opt_str
from ._model import subject_of, time_of, turn_number

APPROVALS = 20  # the pending ones first, then the latest others

REQUESTED = "tool_approval_requested"
DECIDED = "tool_approval_decided"
STARTED = "tool_execution_started"


class ApprovalRecords:
    """Fed every decoded record in log order (as the timeline's builder is): each request by
    its approval id, with its decision and the execution that consumed it."""

    def __init__(self) -> None:
        self.requests: dict[str, dict[str, Any]] = {}

    def __call__(self, seq: int, data: Any) -> None:
        if not isinstance(data, dict):
            return
        kind = data.get("kind")
        approval_id = opt_str(data.get("approval_id"))
        if approval_id is None or kind not in (REQUESTED, DECIDED, STARTED):
            return
        if kind == REQUESTED:
            self.requests[approval_id] = {
                "approval_id": approval_id, "seq": seq, "tool": opt_str(data.get("tool")),
                "call_id": opt_str(data.get("call_id")),
                "arguments_preview": opt_str(data.get("arguments_preview")),
                "turn_sequence": turn_number(data.get("turn_sequence")),
                "requested_at": time_of(data.get("at")), "status": "pending", "actor": None,
                "note": None, "decided_at": None, "expires_at": None, "execution_id": None}
            return
        request = self.requests.get(approval_id)
        if request is None:  # before the checkpoint a compacted log begins at
            return
        if kind == DECIDED:
            request.update(status=opt_str(data.get("decision")) or "?",
                           actor=opt_str(data.get("actor")), note=opt_str(data.get("note")),
                           decided_at=time_of(data.get("at")),
                           expires_at=time_of(data.get("expires_at")))
        else:
            request.update(status="consumed", execution_id=opt_str(subject_of(data)))

    def rows(self, recovery: Any, now: float) -> tuple[list[dict[str, Any]], int]:
        """The requests to show (pending first, then the latest), and how many there are. The
        journal's own state has the last word on what is pending or approved: a compacted
        log's older requests are known from its checkpoint alone."""
        known = dict(self.requests)
        for approval in (*getattr(recovery, "approvals", ()), *getattr(recovery, "approved", ())):
            known[approval.approval_id] = {
                **known.get(approval.approval_id, {"seq": 0}),
                "approval_id": approval.approval_id, "tool": approval.tool,
                "call_id": approval.call_id, "arguments_preview": approval.arguments_preview,
                "turn_sequence": approval.turn_sequence, "requested_at": approval.requested_at,
                "status": approval.status, "actor": approval.actor, "note": approval.note,
                "decided_at": approval.decided_at, "expires_at": approval.expires_at,
                "execution_id": approval.execution_id}
        for row in known.values():
            if row["status"] == "approved" and row["expires_at"] is not None \
                    and row["expires_at"] <= now:
                row["status"] = "expired"
        ordered = sorted(known.values(), key=lambda r: (r["status"] != "pending", -r["seq"]))
        return ordered[:APPROVALS], len(ordered)
