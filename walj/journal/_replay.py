"""Replay of a settled call: a re-dispatched caller-given call id is answered from the record
that settled it, or refused, durably, and its handler is never run again."""

from __future__ import annotations

from typing import Any

from ..errors import CorruptionError
from . import _writes
from . import records as rc
from ._callindex import Forgotten
from ._compact import settling_records
from ._core import Core
from ._tools import ToolContext, ToolResult

REFUSED_STATUS = "refused_settled_call"
ALREADY_DONE_STATUS = "already_done"

_NOT_STORED_WHY = {
    rc.OUTPUT_TOO_LARGE: "it was larger than the journal's max_stored_output_bytes",
    rc.OUTPUT_NOT_STORABLE: "it could not be stored as JSON",
    rc.OUTPUT_DROPPED: "a checkpoint carried only the newest stored outputs",
}


def may_answer(core: Core, call_id: str) -> bool:
    """Quick, without the write lock (an event loop may ask): whether `answer` may find the
    call id settled. False is final for this dispatch; `answer` decides the rest."""
    return core.view(lambda state: state.calls.find(call_id)) is not None


def answer(core: Core, context: ToolContext, arguments: dict[str, Any]) -> ToolResult | None:
    """The replayed or refused result of a dispatch whose caller-given call id this journal
    has settled, with its durable record written; None when the call id is not settled (the
    dispatch then goes on: the blocked check, the intent, the handler). One step under the
    write lock, so the state takes the record as a reopen would."""
    with core.writing():
        core.check_open()
        core.write_queued()
        found = core.view(lambda state: state.calls.find(context.call_id))
        if found is None:
            return None
        call = repr(context.call_id)
        if isinstance(found, Forgotten):
            return _refuse(core, context, arguments, rc.REFUSED_OUTSIDE_WINDOW, None, (
                f"call id {call} may have been settled before this journal's replay window "
                f"(its last {found.window} settled calls), so its outcome cannot be answered; "
                "walj does not run it again. Use a new call id for a new call."))
        settling, settled_seq = settling_records(core, [(context.call_id, found.seq)])[
            context.call_id]
        settled_id = settling.get("execution_id")
        if not isinstance(settled_id, str):
            raise CorruptionError(f"journal record {found.seq} names no execution", seq=found.seq,
                                  kind="journal_record")
        if found.arguments_sha256 != context.arguments_sha256:
            return _refuse(core, context, arguments, rc.REFUSED_ARGUMENTS_DIFFER, settled_id, (
                f"call id {call} was already settled (execution {settled_id}) with different "
                "arguments; walj does not run a call id twice. Use a new call id for a new "
                "call."))
        outcome, output, error = _outcome(settling)
        if outcome == "ok" and output is _NOT_STORED:
            why = _NOT_STORED_WHY.get(str(settling.get("output_not_stored")),
                                      "the journal did not store outputs when it ran")
            return _refuse(core, context, arguments, rc.REFUSED_OUTPUT_NOT_STORED, settled_id, (
                f"call id {call} already ran (execution {settled_id}, outcome ok) but its "
                f"output was not stored: {why}. walj does not run it again."))
        core.write(_writes.replayed(settling, settled_seq, context.turn_sequence, context.tool,
                                    context.call_id, context.arguments_sha256, outcome),
                   durable=True)
        return ToolResult(context.tool, context.call_id, arguments, output, error, outcome,
                          settled_id, True)


_NOT_STORED: Any = object()


def _outcome(settling: dict[str, Any]) -> tuple[str, Any, str | None]:
    """(outcome, output, error) as the settling record gives them."""
    if settling.get("kind") == rc.FINISHED:
        outcome = settling.get("outcome")
        if outcome == "ok":
            return "ok", settling.get("output") if "output" in settling else _NOT_STORED, None
        if outcome in ("error", "cancelled"):
            error = settling.get("error")
            return outcome, None, error if isinstance(error, str) else f"the call ended {outcome}"
        raise CorruptionError(f"a settled call's record has outcome {outcome!r}",
                              kind="journal_record")
    actor, note = settling.get("actor"), settling.get("note")
    said = f" ({note})" if isinstance(note, str) and note else ""
    if settling.get("outcome") == "failed":
        return "error", None, f"resolved failed by {actor}{said}"
    output = settling.get("output")
    if output is None:
        output = {"status": ALREADY_DONE_STATUS,
                  "message": f"already done, resolved by {actor}{said}", "resolved_by": actor}
    return "ok", output, None


def _refuse(core: Core, context: ToolContext, arguments: dict[str, Any], reason: str,
            settled_id: str | None, message: str) -> ToolResult:
    core.write(_writes.refused(context.execution_id, context.turn_sequence, context.tool,
                               context.call_id, context.arguments_sha256, reason, message,
                               settled_id), durable=True)
    output = {"status": REFUSED_STATUS, "reason": reason, "message": message,
              "settled_execution_id": settled_id}
    return ToolResult(context.tool, context.call_id, arguments, output, message, "refused",
                      context.execution_id)
