"""Settling interrupted work durably: resolutions by people, and on open by reconcile hooks and
per-tool on_ambiguous policies. Never a second terminal record."""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any

from . import _records as rc
from ._fingerprint import describe_error
from ._read import read
from ._records import Resolution
from ._tools import ERROR_CHARS
from .errors import ResolutionError

if TYPE_CHECKING:
    from ._journal import ToolJournal

RESOLVE_OUTCOMES = ("succeeded", "failed", "not_performed")
RECONCILE_ANSWERS = ("succeeded", "not_performed", None)
_RESERVED_ACTORS = re.compile(r"policy$|reconcile:")


def _now() -> float:
    return round(time.time(), 3)


def check_actor(actor: Any) -> None:
    if not isinstance(actor, str) or not actor.strip():
        raise ResolutionError("actor must be a non-empty string naming who resolves",
                              reason="bad_actor")
    if _RESERVED_ACTORS.match(actor):
        raise ResolutionError(f"actor {actor!r} is reserved for automatic settlements",
                              reason="bad_actor")


def _check_note(note: Any) -> None:
    if note is not None and not isinstance(note, str):
        raise ResolutionError("note must be a string or None", reason="note_required")


def resolve(journal: ToolJournal, execution_id: Any, outcome: Any, *, note: Any, actor: Any,
            output: Any) -> Resolution:
    """A person's resolution of an execution or pending LLM call; see ToolJournal.resolve."""
    if outcome not in RESOLVE_OUTCOMES:
        raise ResolutionError(
            f"outcome must be one of {', '.join(RESOLVE_OUTCOMES)}, not {outcome!r}",
            reason="bad_outcome")
    check_actor(actor)
    _check_note(note)
    if outcome == "failed" and not (note and note.strip()):
        raise ResolutionError("a 'failed' resolution needs a note saying what failed",
                              reason="note_required")
    return settle(journal, execution_id, outcome, note=note, actor=actor, output=output)


def settle(journal: ToolJournal, execution_id: Any, outcome: str, *, note: str | None,
           actor: str, output: Any = None) -> Resolution:
    """Write the durable resolution of an open execution or LLM call, or refuse."""
    if not isinstance(execution_id, str) or not execution_id:
        raise ResolutionError(f"unknown execution id {execution_id!r}", reason="unknown")
    state = journal._state
    # One resolution at a time, so two racing resolvers cannot both pass the check.
    with journal._resolve_lock:
        with journal._lock:
            if execution_id in journal._live or execution_id in journal._live_llm:
                raise ResolutionError(f"execution {execution_id} is running in this process",
                                      reason="in_flight")
            is_tool = execution_id in state.executions
            is_llm = execution_id in state.llm_calls
        if not (is_tool or is_llm):
            raise _not_open(journal, execution_id)
        record: dict[str, Any] = {
            "k": rc.RESOLVED if is_tool else rc.LLM_RESOLVED, "v": rc.CONTRACT_VERSION,
            "id": execution_id, "t": _now(), "o": outcome, "actor": actor, "note": note,
        }
        if output is not None:
            record["out"] = output
        journal._write(record, durable=True)
        return state.resolutions[-1]


def _not_open(journal: ToolJournal, execution_id: str) -> ResolutionError:
    """Why an id is not open: resolved, terminal, or unknown. Only this error path reads the
    log again, so the state need not remember every finished execution."""
    for resolution in journal._state.resolutions:
        if resolution.execution_id == execution_id:
            return ResolutionError(
                f"execution {execution_id} was already resolved ({resolution.outcome} by "
                f"{resolution.actor})", reason="already_resolved")
    terminal = (rc.FINISHED, rc.BLOCKED, rc.LLM_FINISHED)
    for record in read(journal.path):
        data = record.data
        if data.get("id") == execution_id and data.get("k") in terminal:
            return ResolutionError(
                f"execution {execution_id} already has a terminal record ({data.get('k')}, "
                f"outcome {data.get('o', 'blocked')!r}, seq {record.seq}); there is never a "
                "second one", reason="already_terminal")
    return ResolutionError(f"unknown execution id {execution_id!r}", reason="unknown")


def resolve_turn(journal: ToolJournal, turn_sequence: Any, *, note: Any,
                 actor: Any) -> Resolution:
    """A person's resolution of an interrupted turn; see ToolJournal.resolve_turn."""
    check_actor(actor)
    _check_note(note)
    if type(turn_sequence) is not int:
        raise ResolutionError(f"unknown turn {turn_sequence!r}", reason="unknown")
    state = journal._state
    with journal._resolve_lock:
        with journal._lock:
            live = journal._live_turn
            if live is not None and live.sequence == turn_sequence:
                raise ResolutionError(f"turn {turn_sequence} is live", reason="in_flight")
            turn = state.turns.get(turn_sequence)
        if turn is None:
            if 1 <= turn_sequence <= state.max_turn:
                raise ResolutionError(f"turn {turn_sequence} completed",
                                      reason="already_terminal")
            raise ResolutionError(f"unknown turn {turn_sequence}", reason="unknown")
        if turn.resolved:
            raise ResolutionError(f"turn {turn_sequence} was already resolved",
                                  reason="already_resolved")
        journal._write({"k": rc.TURN_RESOLVED, "v": rc.CONTRACT_VERSION,
                        "turn": turn_sequence, "t": _now(), "actor": actor, "note": note},
                       durable=True)
        return state.resolutions[-1]


def settle_automatically(journal: ToolJournal) -> None:
    """On open: each interrupted execution of a registered tool asks the tool's reconcile hook,
    then its on_ambiguous policy. Every settlement is a durable resolution with its actor."""
    for blocker in journal._state.snapshot().blockers:
        tool = journal._tools.get(blocker.tool or "")
        if tool is None or blocker.execution_id is None or blocker.state not in (
                rc.STATE_STARTED, rc.STATE_AMBIGUOUS):
            continue
        eid, name = blocker.execution_id, blocker.tool
        if tool.reconcile is not None:
            try:
                verdict = tool.reconcile(blocker)
                if verdict not in RECONCILE_ANSWERS:
                    raise ValueError(f"reconcile returned {verdict!r}; expected 'succeeded', "
                                     "'not_performed' or None")
            except Exception as exc:  # the execution stays ambiguous; the failure is kept
                journal._write({"k": rc.RECONCILE_FAILED, "v": rc.CONTRACT_VERSION, "id": eid,
                                "t": _now(), "tool": name,
                                "err": describe_error(exc, ERROR_CHARS)}, durable=False)
                continue
            if verdict is not None:
                settle(journal, eid, verdict, actor=f"reconcile:{name}",
                       note=f"the reconcile hook of {name!r} answered {verdict!r}")
                continue
        if tool.on_ambiguous == "assume_done":
            settle(journal, eid, "succeeded", actor="policy",
                   note=f"on_ambiguous='assume_done' for tool {name!r}")
        elif tool.on_ambiguous == "rerun":
            settle(journal, eid, "rerun", actor="policy",
                   note=f"on_ambiguous='rerun' for tool {name!r}: safe to dispatch again")
