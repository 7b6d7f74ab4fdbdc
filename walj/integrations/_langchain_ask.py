"""LangGraph's interrupt mode for a blocked call: the interrupt's payload, which a person reads,
and the resolutions their `Command(resume=answer)` carries."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import walj

from ._shared import blockers_listed

if TYPE_CHECKING:
    from langgraph.prebuilt.tool_node import ToolCallRequest

BLOCKED_KIND = "walj_blocked"
"""`payload["kind"]` of the interrupt a blocked call raises with `on_blocked="interrupt"`."""

_ANSWER_SHAPE = {"execution_id": "...", "outcome": "succeeded|failed|not_performed",
                 "actor": "...", "note": "...", "output": "optional"}


def payload(done: walj.ToolResult, journal: walj.ToolJournal) -> dict[str, Any]:
    """The interrupt's payload for a call the journal blocked."""
    return _payload_of(journal, done.name, done.call_id, blockers_listed(done))


def payload_before(journal: walj.ToolJournal, name: str, call_id: str) -> dict[str, Any]:
    """The interrupt's payload for a call not dispatched yet, while the journal blocks."""
    return _payload_of(journal, name, call_id,
                       [b.summary() for b in journal.recovery.blockers])


def _payload_of(journal: walj.ToolJournal, name: str, call_id: str,
                listed: list[Any]) -> dict[str, Any]:
    # For the person who answers (the model never sees it): what to do.
    message = (f"walj paused tool {name!r} (call {call_id!r}) without running it: "
               f"{len(listed)} earlier execution(s) or turn(s) of this thread were interrupted "
               "and may or may not have taken effect. Resume with Command(resume=answer), one "
               "answer (or a list) resolving each; see 'answer'.")
    return {"kind": BLOCKED_KIND, "tool": name, "call_id": call_id, "message": message,
            "journal": str(journal.path), "ambiguous_executions": listed,
            "answer": dict(_ANSWER_SHAPE)}


def checkpointed(request: ToolCallRequest) -> bool:
    """Whether the graph runs with a checkpointer: LangGraph puts it in the run's configurable
    under this key. Without one an interrupt could never be resumed, so the blocked call is
    answered with the error ToolMessage instead (and if the key ever moves, that is what
    happens: nothing pauses a graph that cannot resume)."""
    config = getattr(getattr(request, "runtime", None), "config", None)
    configurable = config.get("configurable") if isinstance(config, Mapping) else None
    return isinstance(configurable, Mapping) and configurable.get(
        "__pregel_checkpointer") is not None


def resolve(journal: walj.ToolJournal, answer: Any) -> None:
    """Write the resolutions a person's `Command(resume=answer)` carries (see the module's
    documentation). A resolution already written (the task ran again) is skipped."""
    answers = answer if isinstance(answer, list) else [answer]
    if not answers or not all(isinstance(a, Mapping) for a in answers):
        raise TypeError("a walj answer is a dict (or a list of dicts) with execution_id, "
                        "outcome and actor, or turn_sequence and actor")
    for item in answers:
        actor, note = item.get("actor"), item.get("note")
        try:
            if "turn_sequence" in item:
                journal.resolve_turn(item["turn_sequence"], note=note, actor=actor)
            else:
                journal.resolve(item.get("execution_id"), item.get("outcome"), note=note,
                                actor=actor, output=item.get("output"))
        except walj.ResolutionError as exc:
            if exc.reason not in ("already_resolved", "already_terminal"):
                raise
