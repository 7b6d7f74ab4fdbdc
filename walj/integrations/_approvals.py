"""Approvals for the integrations, free of any framework: which results of a batch of calls an
approval rule answered, the request a person reads, and their answer turned into the journal's
durable decision (docs/INTEGRATIONS.md, "Approvals")."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import walj
from walj.journal import ExecutionEnd, ToolObserver

from ._shared import APPROVAL_OUTCOMES

APPROVAL_KIND = "walj_approval"
"""`payload["kind"]` of a request for a person's approval (a LangGraph interrupt's value)."""

DECISIONS = ("approve", "deny")  # an answer's "decision": journal.approve or journal.deny
_ANSWER_FIELDS = frozenset({"approval_id", "decision", "actor", "note", "expires_at"})


class _ApprovalAnswers(ToolObserver):
    """Collects, from the thread that created it only, the results an approval rule answered
    (a journal's observers hear every thread's dispatches)."""

    def __init__(self) -> None:
        self.thread = threading.get_ident()
        self.found: dict[str, walj.ToolResult] = {}

    def on_end(self, end: ExecutionEnd) -> None:
        result = end.result
        if (threading.get_ident() == self.thread and result is not None
                and result.outcome in APPROVAL_OUTCOMES):
            self.found[result.call_id] = result


def handle_calls(calls: Sequence[Any], registry: Any, journal: walj.ToolJournal | None
                 ) -> list[tuple[dict[str, Any], walj.ToolResult | None]]:
    """`walj.handle_function_calls`, each result paired with the `ToolResult` of its call when
    an approval rule answered it ("awaiting_approval", "denied", "approval_expired"), else
    None. Its five-key result dicts cannot tell such an answer from an error, the result can."""
    if journal is None:
        _check_no_approval(calls, registry)
        return [(result, None) for result in walj.handle_function_calls(calls, registry)]
    seen = _ApprovalAnswers()
    journal.add_observer(seen)
    try:
        results = walj.handle_function_calls(calls, registry, journal)
    finally:
        journal.remove_observer(seen)
    paired: list[tuple[dict[str, Any], walj.ToolResult | None]] = []
    for result in results:
        found = seen.found.get(result["call_id"])
        same = (found is not None and result["output"] is None
                and result["error"] == found.error)
        paired.append((result, found if same else None))
    return paired


def _check_no_approval(calls: Sequence[Any], registry: Any) -> None:
    """Without a journal nothing can wait for a person: a call of a tool with an approval rule
    is refused, ValueError before anything runs, rather than run unapproved."""
    if not isinstance(registry, Mapping):
        return
    for call in calls:
        tool = registry.get(call.get("name")) if isinstance(call, Mapping) else None
        if isinstance(tool, walj.Tool) and tool.approval is not False:
            raise ValueError(f"tool {call['name']!r} needs approval, which needs a journal: "
                             "pass one")


def pending_request(journal: walj.ToolJournal, call_id: str) -> walj.Approval | None:
    """The request of `call_id` still waiting for a person, if any."""
    return next((a for a in journal.recovery.approvals if a.call_id == call_id), None)


def awaits_run(journal: walj.ToolJournal) -> set[str]:
    """The call ids whose latest request is pending, or approved and not yet consumed: a
    dispatch of each is still to come."""
    recovery = journal.recovery
    return {a.call_id for a in (*recovery.approvals, *recovery.approved)}


def request_payload(approval: walj.Approval, journal: walj.ToolJournal,
                    problem: str | None = None) -> dict[str, Any]:
    """What a person reads to decide a request, and the answer it takes."""
    message = (f"walj paused tool {approval.tool!r} (call {approval.call_id!r}) without running "
               f"it: it needs a person's approval ({approval.approval_id}). Its arguments are "
               "in 'arguments_preview'. Answer with 'answer' filled in: an approval lets this "
               "call run once, with exactly these arguments.")
    payload: dict[str, Any] = {
        "kind": APPROVAL_KIND, "approval_id": approval.approval_id, "tool": approval.tool,
        "call_id": approval.call_id, "arguments_preview": approval.arguments_preview,
        "arguments_sha256": approval.arguments_sha256, "requested_at": approval.requested_at,
        "journal": str(journal.path), "message": message,
        "answer": {"approval_id": approval.approval_id, "decision": "approve|deny",
                   "actor": "...", "note": "optional", "expires_at": "optional unix time"}}
    if problem is not None:
        payload["problem"] = problem
    return payload


def decide(journal: walj.ToolJournal, approval: walj.Approval, answer: Any) -> None:
    """Write a person's `answer` to the pending request `approval` as the journal's durable
    decision (journal.approve / journal.deny). The answer must name this request's id, so that
    it decides nothing else: not another call's request, nor a later request of the same call.
    A request another path decided meanwhile is left as that decision made it. Raises
    ApprovalError, TypeError or ValueError, writing nothing, for an answer it refuses."""
    if not isinstance(answer, Mapping):
        raise TypeError(f"an approval answer is a dict with approval_id, decision and actor, "
                        f"not {type(answer).__name__}")
    unknown = sorted(str(key) for key in answer if key not in _ANSWER_FIELDS)
    if unknown:
        raise ValueError(f"an approval answer has no field {', '.join(unknown)}")
    if answer.get("approval_id") != approval.approval_id:
        raise ValueError(f"this request is {approval.approval_id}; the answer names "
                         f"{str(answer.get('approval_id'))[:80]!r}")
    decision = answer.get("decision")
    actor: Any = answer.get("actor")  # checked by the journal, as a resolution's actor is
    note: Any = answer.get("note")
    if decision not in DECISIONS:
        raise ValueError(f"decision must be 'approve' or 'deny', not {str(decision)[:80]!r}")
    try:
        if decision == "approve":
            journal.approve(approval.approval_id, actor=actor, note=note,
                            expires_at=answer.get("expires_at"))
        else:
            if answer.get("expires_at") is not None:
                raise ValueError("a denial has no expires_at")
            journal.deny(approval.approval_id, actor=actor, note=note)
    except walj.ApprovalError as exc:
        if exc.reason != "not_pending":
            raise


def open_approval(journal: walj.ToolJournal, call_id: str | None,
                  tool: str | None = None) -> walj.Approval | None:
    """The request of `call_id` (of `tool`, when given) that is pending, or approved and not
    yet consumed, if any: the latest, which decides the call's next dispatch."""
    found = [a for a in (*journal.recovery.approvals, *journal.recovery.approved)
             if a.call_id == call_id and (tool is None or a.tool == tool)]
    return max(found, key=lambda a: a.requested_at or 0.0) if found else None
