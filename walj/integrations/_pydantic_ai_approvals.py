"""Journal-backed approvals for Pydantic AI: a call of a `requires_approval` tool is deferred
with its walj approval request, a person's `DeferredToolResults` answer becomes the journal's
decision, and the journal alone decides whether the approved call runs (its call id, tool and
arguments, once)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import walj

from ._require import require

require("pydantic_ai", "pydantic-ai")  # first: a missing extra is named, not a bare import

from pydantic_ai.exceptions import ApprovalRequired  # noqa: E402
from pydantic_ai.messages import ModelResponse, ToolCallPart  # noqa: E402
from pydantic_ai.tools import (  # noqa: E402
    DeferredToolRequests,
    DeferredToolResults,
    ToolApproved,
    ToolDefinition,
    ToolDenied,
)

from ._approvals import open_approval  # noqa: E402
from ._pydantic_ai_answers import ACTOR, METADATA_KEY  # noqa: E402

# In a DeferredToolResults entry's walj metadata: an approval that only lets the journal answer
# (journal_answers), not a person's decision to write.
FROM_JOURNAL = "from_journal"


def needs_approval(tool_def: ToolDefinition) -> bool:
    """A call of this tool needs a walj approval: the tool was registered with
    `requires_approval=True` (Pydantic AI's "unapproved" kind)."""
    return tool_def.kind == "unapproved"


def ask_only(**_arguments: Any) -> Any:
    # The capability dispatches this only for a call with no open approval, so the journal
    # cannot run it; were it ever reached, the call is not run (fail closed).
    raise walj.ToolBlocked("walj only asked for an approval here; the call runs once approved")


def deferral(approval: walj.Approval, message: str | None = None) -> ApprovalRequired:
    """The deferral of a call waiting for `approval`: its metadata (under "walj") names the
    approval and what it covers, for the person who decides."""
    return ApprovalRequired(metadata={METADATA_KEY: {
        "approval_id": approval.approval_id,
        "status": approval.status,
        "tool": approval.tool,
        "call_id": approval.call_id,
        "arguments_sha256": approval.arguments_sha256,
        "arguments_preview": approval.arguments_preview,
        "message": message or f"walj approval {approval.approval_id} awaits a decision",
    }})


def _original_call(messages: Iterable[Any], tool_call_id: str) -> ToolCallPart | None:
    for message in reversed(list(messages)):
        if isinstance(message, ModelResponse):
            for part in message.tool_calls:
                if part.tool_call_id == tool_call_id:
                    return part
    return None


def changed_arguments(messages: Iterable[Any], call: ToolCallPart) -> bool:
    """The approved call carries other arguments than the model's call of that id (an approval
    given with `ToolApproved(override_args=...)` that changes them)."""
    original = _original_call(messages, call.tool_call_id)
    return original is not None and original.args_as_dict() != call.args_as_dict()


def _signature(metadata: Any) -> Mapping[str, Any]:
    entry = metadata.get(METADATA_KEY) if isinstance(metadata, Mapping) else None
    return entry if isinstance(entry, Mapping) else {}


def record_decisions(journal: walj.ToolJournal, node: Any, call_ids: Mapping[str, str]) -> None:
    """Write, durably, the decisions a run's `deferred_tool_results` carries (as the resumed
    `CallToolsNode` holds them) for every call whose walj request is pending: `ToolDenied` is
    `journal.deny` (its message the note unless one is given); `ToolApproved` is
    `journal.approve`, unless it changes the arguments (nothing is written: the call is then
    refused). Signed with the entry's walj metadata `actor` (and `note`, `expires_at`), else
    `ACTOR`. `call_ids`: each tool call id's walj call id. A bad actor, note or expiry raises
    (`walj.WaljError`) before the run executes anything of the step."""
    results = getattr(node, "tool_call_results", None) or {}
    metadata = getattr(node, "tool_call_metadata", None) or {}
    for call in node.model_response.tool_calls:
        answer = results.get(call.tool_call_id)
        if not isinstance(answer, (ToolApproved, ToolDenied)):
            continue
        signed = _signature(metadata.get(call.tool_call_id))
        current = open_approval(journal, call_ids[call.tool_call_id], call.tool_name)
        if signed.get(FROM_JOURNAL) or current is None or current.status != "pending":
            continue
        actor, note = signed.get("actor") or ACTOR, signed.get("note")
        if isinstance(answer, ToolDenied):
            journal.deny(current.approval_id, actor=actor, note=note or answer.message)
        elif answer.override_args is None or answer.override_args == call.args_as_dict():
            journal.approve(current.approval_id, actor=actor, note=note,
                            expires_at=signed.get("expires_at"))


def approval_decisions(requests: DeferredToolRequests, *, actor: str,
                       approve: Iterable[str] = (), deny: Iterable[str] = (),
                       note: str | None = None,
                       expires_at: float | None = None) -> DeferredToolResults:
    """A person's decisions on deferred calls, for the next run's `deferred_tool_results`:
    the tool call ids in `approve` approved, those in `deny` denied, each signed with `actor`
    (and `note`, and for approvals `expires_at`) in its walj metadata. The capability writes
    them to the journal (`journal.approve` / `journal.deny`) before the calls are executed.
    ValueError for an id that is not an approval request of `requests`, or one in both."""
    approve, deny = list(approve), list(deny)
    asked = {part.tool_call_id for part in requests.approvals}
    unknown = sorted((set(approve) | set(deny)) - asked)
    if unknown:
        raise ValueError(f"not approval requests of these DeferredToolRequests: {unknown}")
    if set(approve) & set(deny):
        raise ValueError(f"both approved and denied: {sorted(set(approve) & set(deny))}")
    signed = {"actor": actor, "note": note}
    approvals: dict[str, bool | ToolApproved | ToolDenied] = {}
    metadata: dict[str, dict[str, Any]] = {}
    for call_id in approve:
        approvals[call_id] = True
        metadata[call_id] = {METADATA_KEY: {**signed, "expires_at": expires_at}}
    for call_id in deny:
        approvals[call_id] = ToolDenied(f"denied by {actor}" + (f": {note}" if note else ""))
        metadata[call_id] = {METADATA_KEY: dict(signed)}
    return DeferredToolResults(approvals=approvals, metadata=metadata)


def journal_answers(requests: DeferredToolRequests) -> DeferredToolResults:
    """The next run's `deferred_tool_results` when the decisions were made in the journal
    (`walj approve` / `walj deny`, or another process): every walj-deferred approval request
    is let through to the journal, which answers each one: an approved call runs once, a
    denied or expired one is answered so and never runs, and one still pending is deferred
    again (the run ends with it in its `DeferredToolRequests`). Nothing is written for them."""
    approvals: dict[str, bool | ToolApproved | ToolDenied] = {}
    metadata: dict[str, dict[str, Any]] = {}
    for part in requests.approvals:
        if _signature(requests.metadata.get(part.tool_call_id)).get("approval_id"):
            approvals[part.tool_call_id] = True
            metadata[part.tool_call_id] = {METADATA_KEY: {FROM_JOURNAL: True}}
    return DeferredToolResults(approvals=approvals, metadata=metadata)
