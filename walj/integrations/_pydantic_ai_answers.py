"""A person's answer to the Pydantic AI tool calls walj deferred (`on_blocked="defer"`): the
approvals, carrying resolutions, that the next run's `deferred_tool_results` takes, and their
resolutions written when the approved call is executed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import walj

from ._require import require

require("pydantic_ai", "pydantic-ai")  # first: a missing extra is named, not a bare import

from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults  # noqa: E402

METADATA_KEY = "walj"
"""The key of walj's entry in a deferred call's metadata (`DeferredToolRequests.metadata[id]`),
and of the person's answer in `DeferredToolResults.metadata[id]`."""
ACTOR = "walj.integrations.pydantic_ai"
ANSWER_OUTCOMES = ("succeeded", "failed", "not_performed")


def answer_blocked(requests: DeferredToolRequests, *, outcome: str, actor: str,
                   note: str | None = None, output: Any = None,
                   call_ids: list[str] | None = None) -> DeferredToolResults:
    """A person's answer to the calls walj deferred (`on_blocked="defer"`): pass it as the
    next run's `deferred_tool_results`, with the same message history.

    Each walj-deferred call in `requests` (or those in `call_ids`) is approved, carrying a
    resolution of what blocked it: `outcome` "succeeded" (the interrupted call did take effect;
    `output` is what the model then gets for it), "failed" (a `note` is required) or
    "not_performed". When the run re-executes the call, the capability writes that resolution
    (`journal.resolve`, durable, with `actor` and `note`) and dispatches the call again: replay
    answers the interrupted call from the resolution, and a call that was only blocked by
    another runs once nothing blocks. A bad outcome, actor or note raises ValueError here,
    before anything is written."""
    if outcome not in ANSWER_OUTCOMES:
        raise ValueError(f"outcome must be one of {', '.join(ANSWER_OUTCOMES)}, not {outcome!r}")
    if not isinstance(actor, str) or not actor:
        raise ValueError("actor must be a non-empty string: who answers")
    if outcome == "failed" and not note:
        raise ValueError("a 'failed' answer needs a note: what failed")
    if note is not None and not isinstance(note, str):
        raise ValueError(f"note must be a string or None, not {type(note).__name__}")
    approvals: dict[str, Any] = {}
    metadata: dict[str, dict[str, Any]] = {}
    for part in requests.calls:
        deferred = (requests.metadata.get(part.tool_call_id) or {}).get(METADATA_KEY)
        if not isinstance(deferred, Mapping):
            continue  # deferred by something other than walj
        if call_ids is not None and part.tool_call_id not in call_ids:
            continue
        approvals[part.tool_call_id] = True
        metadata[part.tool_call_id] = {METADATA_KEY: {
            "outcome": outcome, "actor": actor, "note": note, "output": output,
            "blockers": list(deferred.get("blockers") or []),
        }}
    return DeferredToolResults(approvals=approvals, metadata=metadata)


def apply_answer(journal: walj.ToolJournal, metadata: Any) -> None:
    """Write the resolutions a person's answer to a deferred call carries (see
    `answer_blocked`), for each blocker that still blocks; the call is then dispatched,
    and replay answers it from the resolution."""
    answer = metadata.get(METADATA_KEY) if isinstance(metadata, Mapping) else None
    if not isinstance(answer, Mapping) or "outcome" not in answer:
        return  # a plain approval: dispatched as is (resolved beforehand, or blocked again)
    blocking = {b.execution_id for b in journal.recovery.blockers}
    turns = {b.turn_sequence for b in journal.recovery.blockers
             if b.state == "interrupted_turn"}
    actor, note = answer.get("actor") or ACTOR, answer.get("note")
    for blocker in answer.get("blockers") or []:
        if blocker.get("state") == "interrupted_turn":
            if blocker.get("turn_sequence") in turns:
                journal.resolve_turn(blocker["turn_sequence"], actor=actor,
                                     note=note or "answered through deferred_tool_results")
        elif blocker.get("execution_id") in blocking:
            journal.resolve(blocker["execution_id"], answer["outcome"], actor=actor,
                            note=note, output=answer.get("output"))
