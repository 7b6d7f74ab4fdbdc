"""The records the journal writes, each built in one place, in the field order that
walj.journal.records declares."""

from __future__ import annotations

import time
from typing import Any

from .. import _codec
from . import records as rc
from ._fingerprint import Digest, describe_error
from .records import new_record


def now() -> float:
    """A record's time: Unix seconds, to the millisecond."""
    return round(time.time(), 3)


def session_ended_record(at: float | None = None) -> dict[str, Any]:
    """session_ended; `at` given: an end written as upkeep, carrying the last activity's time."""
    return new_record(rc.SESSION_ENDED, at=now() if at is None else at)


def turn_record(kind: str, sequence: int) -> dict[str, Any]:
    """turn_started or turn_completed."""
    return new_record(kind, turn_sequence=sequence, at=now())


def turn_resolved(sequence: int, actor: str, note: str | None) -> dict[str, Any]:
    return new_record(rc.TURN_RESOLVED, turn_sequence=sequence, at=now(), actor=actor, note=note)


def intent(execution_id: str, turn_sequence: int, tool: str, call_id: str, digest: Digest,
           idempotency_key: str, arguments: Any = None, *,
           call_id_generated: bool = False, writer: str | None = None) -> dict[str, Any]:
    """tool_execution_started; `arguments` only when the journal stores them.
    `call_id_generated`: walj made up the call id (turn-N-call-M), so replay never keys on it.
    `writer`: the log's writer id (`Log.writer_id`), so a reader can tell whether the process
    that runs the call still holds the log."""
    # Built in the order FIELDS declares, without new_record's checks: this is every
    # dispatch's record (tests/journal/test_records.py holds it to FIELDS).
    record: dict[str, Any] = {"kind": rc.STARTED, "version": rc.CONTRACT_VERSION,
                              "execution_id": execution_id, "at": now(),
                              "turn_sequence": turn_sequence, "tool": tool, "call_id": call_id}
    if call_id_generated:
        record["call_id_generated"] = True
    record["arguments_sha256"] = digest.sha256
    record["idempotency_key"] = idempotency_key
    record["arguments_preview"] = digest.preview
    record["arguments_length"] = digest.length
    if writer is not None:
        record["writer"] = writer
    if arguments is not None:
        record["arguments"] = arguments
    return record


def finished(execution_id: str, outcome: str, output: Digest | None,
             exc: BaseException | None) -> dict[str, Any]:
    """tool_execution_finished: the output's digest, or the error that ended the call. The
    journal adds the output value itself (`output`, or `output_not_stored` and why) when it
    stores outputs."""
    if exc is not None:
        return new_record(rc.FINISHED, execution_id=execution_id, at=now(), outcome=outcome,
                          error=describe_error(exc), error_type=type(exc).__name__)
    if output is not None:  # every ok dispatch's record: in FIELDS order, built directly
        return {"kind": rc.FINISHED, "version": rc.CONTRACT_VERSION,
                "execution_id": execution_id, "at": now(), "outcome": outcome,
                "output_sha256": output.sha256, "output_preview": output.preview,
                "output_length": output.length}
    return new_record(rc.FINISHED, execution_id=execution_id, at=now(), outcome=outcome)


def replayed(answered: dict[str, Any], answered_from_seq: int, turn_sequence: int, tool: str,
             call_id: str, arguments_sha256: str, outcome: str) -> dict[str, Any]:
    """tool_execution_replayed: a dispatch answered from a settled call's record; no handler
    ran. `execution_id` is the execution it answered from; `answered_from_seq` the record."""
    return new_record(rc.REPLAYED, execution_id=answered["execution_id"], at=now(),
                      turn_sequence=turn_sequence, tool=tool, call_id=call_id,
                      arguments_sha256=arguments_sha256, outcome=outcome,
                      answered_from_seq=answered_from_seq)


def refused(execution_id: str, turn_sequence: int, tool: str, call_id: str,
            arguments_sha256: str, reason: str, error: str,
            settled_execution_id: str | None) -> dict[str, Any]:
    """tool_execution_refused: a dispatch of a settled call id that replay cannot answer;
    no handler ran. `execution_id` is the refused dispatch's own (never started) id."""
    return new_record(rc.REFUSED, execution_id=execution_id, at=now(),
                      turn_sequence=turn_sequence, tool=tool, call_id=call_id,
                      arguments_sha256=arguments_sha256, refused_reason=reason, error=error,
                      settled_execution_id=settled_execution_id)


def session_named(session_id: str) -> dict[str, Any]:
    """session_named: the session id a journal was opened under, as given."""
    return new_record(rc.SESSION_NAMED, at=now(), session_id=session_id)


def store_output(record: dict[str, Any], output: Any, limit: int) -> None:
    """Add an ok call's output value to its terminal record: `output` when it is JSON walj
    stores unchanged within `limit` bytes, else `output_not_stored` and why. Never raises:
    the handler already ran, and its outcome must be recorded whatever it returned."""
    try:
        # One level less than the log allows: the record holds it.
        plain = _codec.check(output, _codec.MAX_DEPTH - 1, "output")[0]
        size = len(_codec.encode(plain))
    except Exception:  # SerializationError, or a value too strange to even check
        record["output_not_stored"] = rc.OUTPUT_NOT_STORABLE
        return
    if size > limit:
        record["output_not_stored"] = rc.OUTPUT_TOO_LARGE
    else:
        record["output"] = plain


def without_output(record: dict[str, Any]) -> dict[str, Any]:
    """The terminal record without its output value, when the whole would not fit the log."""
    smaller = {key: value for key, value in record.items() if key != "output"}
    smaller["output_not_stored"] = rc.OUTPUT_TOO_LARGE
    return smaller


def ambiguous_record(execution_id: str, exc: BaseException) -> dict[str, Any]:
    """The tool_execution_ambiguous record of an interrupt."""
    return new_record(rc.AMBIGUOUS, execution_id=execution_id, at=now(),
                      error_type=type(exc).__name__, error=describe_error(exc))


def blocked_record(started: dict[str, Any], blockers: tuple[Any, ...]) -> dict[str, Any]:
    """The tool_execution_blocked record of a refused call: the intent's fields, no key."""
    fields = {k: v for k, v in started.items() if k in rc.FIELDS[rc.BLOCKED]}
    return new_record(rc.BLOCKED, **fields,
                      blocked_by=[b.execution_id for b in blockers if b.execution_id is not None],
                      blocked_by_turns=[b.turn_sequence for b in blockers
                                        if b.execution_id is None])


def reconcile_failed(execution_id: str, tool: str | None, exc: BaseException) -> dict[str, Any]:
    return new_record(rc.RECONCILE_FAILED, execution_id=execution_id, at=now(), tool=tool,
                      error=describe_error(exc))


def llm_started(llm_call_id: str, turn_sequence: int | None, model: str | None,
                request: Digest | None, blocks: bool) -> dict[str, Any]:
    optional: dict[str, Any] = {}
    if request is not None:
        optional.update(request_sha256=request.sha256, request_preview=request.preview,
                        request_length=request.length)
    if blocks:
        optional["blocks_dispatch"] = True  # so a reader without the option knows it blocks
    return new_record(rc.LLM_STARTED, llm_call_id=llm_call_id, at=now(),
                      turn_sequence=turn_sequence, model=model, **optional)


def llm_finished(llm_call_id: str, response: Digest | None,
                 exc: BaseException | None) -> dict[str, Any]:
    optional: dict[str, Any] = {}
    if exc is not None:
        optional["error"] = describe_error(exc)
    elif response is not None:
        optional.update(response_sha256=response.sha256, response_preview=response.preview,
                        response_length=response.length)
    return new_record(rc.LLM_FINISHED, llm_call_id=llm_call_id, at=now(),
                      outcome="ok" if exc is None else "error", **optional)


def resolved(kind: str, identifier: str, outcome: str, actor: str, note: str | None,
             output: Any = None) -> dict[str, Any]:
    """tool_execution_resolved, llm_call_resolved or log_cut_resolved (`identifier`: the
    execution id, the LLM call id, or the quarantine file)."""
    optional = {"output": output} if output is not None else {}
    return new_record(kind, **{rc.SUBJECT[kind]: identifier}, at=now(), outcome=outcome,
                      actor=actor, note=note, **optional)


def request_refused(request_id: str, request_kind: Any, target: Any, actor: Any, reason: str,
                    error: str) -> dict[str, Any]:
    """resolution_refused: a resolution request the writer refused; nothing else changed.
    `request_kind`, `target` and `actor` are what the request said, when it could be read."""
    return new_record(rc.REQUEST_REFUSED, request=request_id, at=now(),
                      request_kind=request_kind, target=target, actor=actor, reason=reason,
                      error=error)


def released(request_id: str, actor: str, note: str | None) -> dict[str, Any]:
    """journal_released: the writer closed the journal at another process's request."""
    return new_record(rc.RELEASED, request=request_id, at=now(), actor=actor, note=note)


def approval_requested(approval_id: str, turn_sequence: int, tool: str, call_id: str,
                       digest: Digest, idempotency_key: str,
                       requested_by: str | None) -> dict[str, Any]:
    """tool_approval_requested: a call that needs approval asks for one; nothing ran."""
    return new_record(rc.APPROVAL_REQUESTED, at=now(), approval_id=approval_id,
                      turn_sequence=turn_sequence, tool=tool, call_id=call_id,
                      arguments_sha256=digest.sha256, arguments_preview=digest.preview,
                      idempotency_key=idempotency_key, requested_by=requested_by)


def approval_decided(approval_id: str, decision: str, actor: str, note: str | None,
                     expires_at: float | None) -> dict[str, Any]:
    """tool_approval_decided: a person approved or denied a pending request."""
    return new_record(rc.APPROVAL_DECIDED, at=now(), approval_id=approval_id,
                      decision=decision, actor=actor, note=note, expires_at=expires_at)


def name_approval(started: dict[str, Any], approval_id: str) -> None:
    """The intent `started` consumes `approval_id`: the field goes where FIELDS puts it,
    before the stored arguments."""
    arguments = started.pop("arguments", None)
    started["approval_id"] = approval_id
    if arguments is not None:
        started["arguments"] = arguments
