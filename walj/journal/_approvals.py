"""Approvals: whether a call needs one, what a dispatch of such a call answers (the rules of
docs/RECOVERY.md, "Approvals"), and a person's durable decision. The state's side, the
approvals the records hold, is _approvalbook."""

from __future__ import annotations

import math
import secrets
import time
from typing import Any

from ..errors import ApprovalError, ResolutionError
from . import _writes
from . import records as rc
from ._approvalbook import APPROVED, CONSUMED, DENIED, PENDING
from ._core import Core
from ._fingerprint import Digest
from ._records import Approval
from ._resolve import Request, check_signature
from ._tools import ToolContext, ToolResult

AWAITING, DENIED_OUTCOME, EXPIRED = "awaiting_approval", "denied", "approval_expired"


def new_approval_id() -> str:
    """`apv-` and 32 random hex digits."""
    return f"apv-{secrets.token_hex(16)}"


def admit(core: Core, context: ToolContext, arguments: dict[str, Any],
          started: dict[str, Any]) -> ToolResult | None:
    """With the write lock held, after the blocked check and before the intent: None when the
    call may run (its intent `started` then names the approval it consumes), else what the
    dispatch answers. Only a missing or consumed request writes a record (a new request)."""
    latest = core.view(lambda state: state.approvals.latest_for(context.call_id))
    if latest is None or latest.status == CONSUMED:
        approval_id = new_approval_id()
        core.write(_writes.approval_requested(
            approval_id, context.turn_sequence, context.tool, context.call_id,
            Digest(context.arguments_sha256, started["arguments_preview"],
                           started["arguments_length"]),
            context.idempotency_key, core.log.writer_id), durable=True)
        return _awaiting(context, arguments, approval_id)
    if latest.status == PENDING:
        return _awaiting(context, arguments, latest.approval_id)
    if latest.status == DENIED:
        said = f": {latest.note}" if latest.note else ""
        return _answer(context, arguments, DENIED_OUTCOME, latest, (
            f"The tool {context.tool!r} was not run: approval {latest.approval_id} of call "
            f"{context.call_id!r} was denied by {latest.actor}{said}."))
    assert latest.status == APPROVED
    if latest.tool != context.tool or latest.arguments_sha256 != context.arguments_sha256:
        return _answer(context, arguments, "refused", latest, (
            f"The tool {context.tool!r} was not run: the tool or arguments of call "
            f"{context.call_id!r} differ from the ones approval {latest.approval_id} approved "
            f"({latest.tool!r}); that approval still stands for those only."))
    if latest.expired(time.time()):
        expired_at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(latest.expires_at))
        return _answer(context, arguments, EXPIRED, latest, (
            f"The tool {context.tool!r} was not run: approval {latest.approval_id} of call "
            f"{context.call_id!r} expired at {expired_at}."))
    _writes.name_approval(started, latest.approval_id)
    return None


def _awaiting(context: ToolContext, arguments: dict[str, Any], approval_id: str) -> ToolResult:
    return ToolResult(context.tool, context.call_id, arguments, None, (
        f"The tool {context.tool!r} was not run: call {context.call_id!r} awaits a person's "
        f"approval ({approval_id}). Tell the user it is waiting for approval; do not retry "
        "it another way."), AWAITING, "", False, approval_id)


def _answer(context: ToolContext, arguments: dict[str, Any], outcome: str, approval: Approval,
            message: str) -> ToolResult:
    return ToolResult(context.tool, context.call_id, arguments, None, message, outcome, "",
                      False, approval.approval_id)


# --- decisions ------------------------------------------------------------------------------

def check_decision(actor: Any, note: Any, expires_at: Any) -> float | None:
    """The checks of a decision's signature (a resolution's) and expiry, before any lock."""
    try:
        check_signature(actor, note)
    except ResolutionError as exc:
        raise ApprovalError(str(exc), reason=exc.reason) from None
    if expires_at is None:
        return None
    if (isinstance(expires_at, bool) or not isinstance(expires_at, (int, float))
            or not math.isfinite(expires_at) or not time.time() < expires_at <= rc.MAX_TIME):
        raise ApprovalError(f"expires_at must be None or a unix time in the future, not "
                            f"{rc.show(expires_at)}", reason="bad_expiry")
    return float(expires_at)


def decide(core: Core, approval_id: Any, decision: str, *, actor: Any, note: Any,
           expires_at: Any = None, request: Request | None = None) -> Approval:
    """Approve or deny a pending request durably; see ToolJournal.approve. `request`: the
    request file this answers, if any. Refusals raise ApprovalError and write nothing."""
    expiry = check_decision(actor, note, expires_at)
    with core.resolving(), core.writing():
        core.write_queued()
        found = lookup(core, approval_id)
        if found.status != PENDING:
            raise ApprovalError(f"approval {found.approval_id} is {found.status}, not pending",
                                reason="not_pending")
        record = _writes.approval_decided(found.approval_id, decision, actor, note, expiry)
        if request is not None:
            record["request"], record["at"] = request
        core.write(record, durable=True)
        return lookup(core, found.approval_id)


def lookup(core: Core, approval_id: Any) -> Approval:
    """The approval `approval_id` in any status; ApprovalError (unknown) if there is none."""
    found = core.view(lambda state: state.approvals.entries.get(approval_id)
                      if isinstance(approval_id, str) else None)
    if found is None:
        raise ApprovalError(f"unknown approval id {rc.show(approval_id)}", reason="unknown")
    return found
