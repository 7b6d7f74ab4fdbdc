"""The records the journal writes, each built in one place: every field name a writer uses is
spelled here and in _records, and nowhere else."""

from __future__ import annotations

import time
from typing import Any

from . import _records as rc
from ._fingerprint import Digest, describe_error


def now() -> float:
    """A record's time: Unix seconds, to the millisecond."""
    return round(time.time(), 3)


def session_ended_record() -> dict[str, Any]:
    return {"kind": rc.SESSION_ENDED, "version": rc.ENDED_CONTRACT_VERSION, "at": now()}


def turn_record(kind: str, sequence: int) -> dict[str, Any]:
    """turn_started or turn_completed."""
    return {"kind": kind, "version": rc.CONTRACT_VERSION, "turn_sequence": sequence, "at": now()}


def turn_resolved(sequence: int, actor: str, note: str | None) -> dict[str, Any]:
    return {"kind": rc.TURN_RESOLVED, "version": rc.CONTRACT_VERSION, "turn_sequence": sequence,
            "at": now(), "actor": actor, "note": note}


def intent(execution_id: str, turn_sequence: int, tool: str, call_id: str, digest: Digest,
           idempotency_key: str, arguments: Any = None) -> dict[str, Any]:
    """tool_execution_started; `arguments` only when the journal stores them."""
    record: dict[str, Any] = {
        "kind": rc.STARTED, "version": rc.CONTRACT_VERSION, "execution_id": execution_id,
        "at": now(), "turn_sequence": turn_sequence, "tool": tool, "call_id": call_id,
        "arguments_sha256": digest.sha256, "idempotency_key": idempotency_key,
        "arguments_preview": digest.preview, "arguments_length": digest.length,
    }
    if arguments is not None:
        record["arguments"] = arguments
    return record


def finished(execution_id: str, outcome: str, output: Digest | None,
             exc: BaseException | None) -> dict[str, Any]:
    """tool_execution_finished: the output's digest, or the error that ended the call."""
    record: dict[str, Any] = {"kind": rc.FINISHED, "version": rc.CONTRACT_VERSION,
                              "execution_id": execution_id, "at": now(), "outcome": outcome}
    if exc is not None:
        record["error"] = describe_error(exc)
        record["error_type"] = type(exc).__name__
    elif output is not None:
        record["output_sha256"] = output.sha256
        record["output_preview"] = output.preview
        record["output_length"] = output.length
    return record


def ambiguous_record(execution_id: str, exc: BaseException) -> dict[str, Any]:
    """The tool_execution_ambiguous record of an interrupt."""
    return {"kind": rc.AMBIGUOUS, "version": rc.CONTRACT_VERSION, "execution_id": execution_id,
            "at": now(), "error_type": type(exc).__name__, "error": describe_error(exc)}


def blocked_record(started: dict[str, Any], blockers: tuple[Any, ...]) -> dict[str, Any]:
    """The tool_execution_blocked record of a refused call: the intent's fields, no key."""
    record = dict(started)
    record["kind"] = rc.BLOCKED
    record.pop("idempotency_key", None)
    record.pop("arguments", None)
    record["blocked_by"] = [b.execution_id for b in blockers if b.execution_id is not None]
    record["blocked_by_turns"] = [b.turn_sequence for b in blockers if b.execution_id is None]
    return record


def reconcile_failed(execution_id: str, tool: str | None, exc: BaseException) -> dict[str, Any]:
    return {"kind": rc.RECONCILE_FAILED, "version": rc.CONTRACT_VERSION,
            "execution_id": execution_id, "at": now(), "tool": tool, "error": describe_error(exc)}


def llm_started(llm_call_id: str, turn_sequence: int | None, model: str | None,
                request: Digest | None, blocks: bool) -> dict[str, Any]:
    record: dict[str, Any] = {"kind": rc.LLM_STARTED, "version": rc.CONTRACT_VERSION,
                              "llm_call_id": llm_call_id, "at": now(),
                              "turn_sequence": turn_sequence, "model": model}
    if request is not None:
        record.update(request_sha256=request.sha256, request_preview=request.preview,
                      request_length=request.length)
    if blocks:
        record["blocks_dispatch"] = True  # so a reader without the option knows it blocks
    return record


def llm_finished(llm_call_id: str, response: Digest | None,
                 exc: BaseException | None) -> dict[str, Any]:
    record: dict[str, Any] = {"kind": rc.LLM_FINISHED, "version": rc.CONTRACT_VERSION,
                              "llm_call_id": llm_call_id, "at": now(),
                              "outcome": "ok" if exc is None else "error"}
    if exc is not None:
        record["error"] = describe_error(exc)
    elif response is not None:
        record.update(response_sha256=response.sha256, response_preview=response.preview,
                      response_length=response.length)
    return record


def resolved(kind: str, identifier: str, outcome: str, actor: str, note: str | None,
             output: Any = None) -> dict[str, Any]:
    """tool_execution_resolved, llm_call_resolved or log_cut_resolved (`identifier`: the
    execution id, the LLM call id, or the quarantine file)."""
    record: dict[str, Any] = {"kind": kind, "version": rc.CONTRACT_VERSION,
                              rc.SUBJECT[kind]: identifier, "at": now(), "outcome": outcome,
                              "actor": actor, "note": note}
    if output is not None:
        record["output"] = output
    return record
