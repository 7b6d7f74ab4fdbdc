"""Journal-backed approvals for the OpenAI Agents SDK: a journaled tool's `needs_approval` asks
the walj journal whether the SDK pauses, and a person's decision on an interruption is written
to the journal before the RunState is approved or rejected.

The SDK's approval lives in the `RunState`, which an application may get back from a client and
which can be edited. walj's lives in the journal: an approval request is written when the SDK
pauses, a decision is durable before the state carries it, and the journal alone decides
whether the call runs (the approved call id, tool and arguments, once). An edited state can
approve nothing the journal did not approve.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import walj

from ._approvals import open_approval
from ._shared import approval_text, field

# How the integration dispatches a call in its journal's turn: name, arguments, call id, the
# walj tool that runs it, and whether the call needs an approval.
Dispatch = Callable[[str, dict[str, Any], str | None, walj.Tool, bool],
                    Awaitable[walj.ToolResult]]


async def tool_rule_says(rule: Any, ctx: Any, arguments: Mapping[str, Any],
                         call_id: str) -> bool:
    """The tool's own `needs_approval` for this call: a bool, or the SDK's policy
    `(run_context, arguments, call_id)`, awaited when it is async. A policy that raises or
    answers a non-bool needs approval (fail closed)."""
    if isinstance(rule, bool):
        return rule
    if not callable(rule):
        return True
    try:
        answer = rule(ctx, dict(arguments), call_id)
        if inspect.isawaitable(answer):
            answer = await answer
    except Exception:
        return True
    return answer if isinstance(answer, bool) else True


def _ask_only(**_arguments: Any) -> Any:
    # The probe below dispatches only when the call has no open approval, so the journal
    # cannot run it; were it ever reached, the call is not run (fail closed).
    raise walj.ToolBlocked("walj only asked for an approval here; the SDK runs the call later")


class JournaledApproval:
    """A journaled tool's `needs_approval`. The tool's own rule says whether a call needs an
    approval; if it does, the journal says whether the SDK pauses: it pauses while the call's
    request is pending (writing the request, `tool_approval_requested`, the first time), and
    goes on to `on_invoke_tool` once the journal has decided (approved, denied, expired) or
    answers the call otherwise (replay, blocked), where the journal's answer is given."""

    def __init__(self, name: str, rule: Any, journal: walj.ToolJournal,
                 dispatch: Dispatch) -> None:
        self.name = name
        self.rule = rule
        self.journal = journal
        self.dispatch = dispatch

    async def needed(self, ctx: Any, arguments: Mapping[str, Any], call_id: Any) -> bool:
        """Whether this call is dispatched with an approval: the tool's rule says so, or the
        journal already holds an open request or approval for the call id (a policy that
        changed its mind cannot skip it)."""
        if not isinstance(call_id, str) or not call_id:
            return self.rule is not False
        if await tool_rule_says(self.rule, ctx, arguments, call_id):
            return True
        return open_approval(self.journal, call_id) is not None

    async def __call__(self, ctx: Any, arguments: dict[str, Any], call_id: str) -> bool:
        if not await self.needed(ctx, arguments, call_id):
            return False
        current = open_approval(self.journal, call_id)
        if current is not None:
            return current.status == "pending"
        done = await self.dispatch(self.name, arguments, call_id, walj.Tool(_ask_only), True)
        return done.outcome == "awaiting_approval"


# --- a person's decision on an interruption -----------------------------------------------


def _identity(item: Any) -> tuple[str | None, str | None]:
    raw = getattr(item, "raw_item", None)
    tool = getattr(item, "tool_name", None) or field(raw, "name")
    call_id = field(raw, "call_id")
    return (tool if isinstance(tool, str) else None,
            call_id if isinstance(call_id, str) else None)


def interruption_approval(item: Any, journal: walj.ToolJournal) -> walj.Approval:
    """The walj approval behind an interruption (a `ToolApprovalItem` of
    `result.interruptions` or `state.get_interruptions()`): the pending request, or the
    unconsumed approval, of its tool and call id, with the approval id, the arguments'
    fingerprint and their redacted preview. `walj.ApprovalError` (reason "unknown") when the
    journal holds none: the call was not paused by a journaled tool of this journal, or it
    was decided otherwise (denied, expired, consumed)."""
    tool, call_id = _identity(item)
    found = open_approval(journal, call_id, tool) if call_id else None
    if found is None:
        raise walj.ApprovalError(
            f"the journal has no open approval for tool {tool!r}, call {call_id!r}",
            reason="unknown")
    return found


def approve_interruption(state: Any, item: Any, journal: walj.ToolJournal, *, actor: str,
                         note: str | None = None,
                         expires_at: float | None = None) -> walj.Approval:
    """Approve an interruption: `journal.approve` (durable, signed by `actor`) first, then
    `state.approve(item)`. The approval covers this call id, tool and the arguments the
    request was made for, once. Already approved in the journal (a second call, or `walj
    approve` from elsewhere): only the state is approved. Raises `walj.ApprovalError` when
    the journal has no open approval for it, or refuses the decision (a bad actor or expiry),
    before the state is touched."""
    found = interruption_approval(item, journal)
    if found.status == "pending":
        found = journal.approve(found.approval_id, actor=actor, note=note,
                                expires_at=expires_at)
    state.approve(item)
    return found


def deny_interruption(state: Any, item: Any, journal: walj.ToolJournal, *, actor: str,
                      note: str | None = None) -> walj.Approval:
    """Deny an interruption: `journal.deny` (durable) first, then `state.reject(item)` with
    the denied answer for the model (docs/INTEGRATIONS.md, "The approval answer"). The call never
    runs, whatever a later state says. Raises `walj.ApprovalError` when the request is not
    pending (it was decided already), before the state is touched."""
    found = interruption_approval(item, journal)
    denied = journal.deny(found.approval_id, actor=actor, note=note)
    tool, call_id = _identity(item)
    message = (f"denied by {denied.actor}" + (f": {denied.note}" if denied.note else "")
               + f" (approval {denied.approval_id}); the call was not run")
    state.reject(item, rejection_message=approval_text({
        "status": "denied", "approval_id": denied.approval_id, "tool": tool, "call_id": call_id,
        "message": message}))
    return denied


def apply_journal_decisions(state: Any, journal: walj.ToolJournal) -> list[Any]:
    """Carry decisions made outside the application (`walj approve` / `walj deny`, or
    another process) into a RunState: an interruption the journal approved is approved in the
    state; one the journal holds no open request for any more (denied, expired) is approved
    too, so that the journal answers it (with the denied or expired answer; it never runs);
    one still pending is left. Returns the interruptions still pending."""
    pending = []
    for item in state.get_interruptions():
        tool, call_id = _identity(item)
        found = open_approval(journal, call_id, tool) if call_id else None
        if found is not None and found.status == "pending":
            pending.append(item)
        else:
            state.approve(item)
    return pending
