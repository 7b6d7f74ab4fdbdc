"""One dispatch's steps and interrupt rules, shared by sync and async dispatch: checking the
call, the replay check, the blocked answer, the terminal record, and what settles an execution
whose dispatch was interrupted. Turn drives them; only the waiting differs."""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Mapping
from typing import Any

from ..errors import ApprovalError, UnknownToolError
from . import _approvals, _replay, _writes
from ._core import Core
from ._fingerprint import (
    FAST_CANONICAL,
    Digest,
    describe_arguments,
    describe_output,
    idempotency_key,
)
from ._observe import Observation
from ._tools import Tool, ToolContext, ToolResult, as_tool

# Execution ids: 128 random bits each, drawn from a generator of this module's own, seeded
# from os.urandom (and again in a forked child, so parent and child never draw the same ids),
# which a program's random.seed() does not touch. A system call per dispatch saved.
_ids = random.Random(os.urandom(32))
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _ids.seed(os.urandom(32)))


def new_execution_id() -> str:
    """32 random hex digits."""
    return f"{_ids.getrandbits(128):032x}"


BLOCKED_STATUS = "blocked_interrupted_execution"
# How far a dispatch got, for its interrupt rules: an interrupt may land on any line.
INTENT, HANDLER, TERMINAL = "intent", "handler", "terminal"


def blocked_text(tool: str) -> str:
    """What a blocked call answers, written for the model and the person it talks to: what
    happened, that nothing was run again, who settles it, and what to do meanwhile. (What a
    developer does about it, resolving, is in `output["ambiguous_executions"]` and the docs.)"""
    return (
        f"The tool {tool!r} was not run. An earlier action in this conversation was "
        "interrupted before it finished, and it is not known whether it took effect, so "
        "nothing is run again until a person has checked what happened and settled it. Tell "
        "the user that this action is on hold until then; do not retry it, and do not try to "
        "reach the same result another way."
    )


def _checked_call(core: Core, name: Any, arguments: Any, call_id: Any,
                  handler: Any) -> tuple[Tool, dict[str, Any]]:
    """The tool and a copy of the arguments, or the error that refuses the call."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"tool name must be a non-empty string, not {name!r}")
    if handler is None:
        tool = core.options.tools.get(name)
        if tool is None:
            raise UnknownToolError(f"unknown tool {name!r}: register it in ToolJournal.open("
                                   "tools=...) or pass handler=")
    else:
        tool = as_tool(handler, name)
    if type(arguments) is not dict:  # the ABC check below is slow; dicts are the norm
        if not isinstance(arguments, Mapping):
            raise TypeError(f"arguments must be a dict of keyword arguments, not "
                            f"{type(arguments).__name__}")
    arguments = dict(arguments)
    if tool.wants_context and "context" in arguments:
        raise TypeError(f"tool {name!r} takes the walj context, so no argument may be "
                        "named 'context'")
    if call_id is not None and (not isinstance(call_id, str) or not call_id):
        raise TypeError(f"call_id must be a non-empty string or None, not {call_id!r}")
    return tool, arguments


class Dispatch:
    """One tool call on its way: everything that can refuse it is checked, nothing is written
    yet. `in_worker`: its blocking steps run in a worker thread (async dispatch), so a step an
    interrupt stopped the wait for still runs to its end."""

    __slots__ = ("arguments", "call_id", "call_id_generated", "context", "core", "failure",
                 "in_worker", "name", "needs_approval", "record", "result", "seen", "stage",
                 "started", "tool")

    def __init__(self, core: Core, turn_sequence: int, call_number: int, name: Any,
                 arguments: Any, call_id: Any, handler: Any, digest: Digest | None, *,
                 in_worker: bool, approval: Any = None) -> None:
        self.tool, self.arguments = _checked_call(core, name, arguments, call_id, handler)
        self.needs_approval = _approvals.needed(self.tool, approval, self.arguments)
        if self.needs_approval and call_id is None:
            raise ApprovalError(f"tool {name!r} needs approval, and an approval is bound to a "
                                "call id: pass call_id=", reason="call_id_required")
        if digest is None:
            digest = describe_arguments(self.arguments, core.options.arguments_chars,
                                        core.options.redactor, FAST_CANONICAL)
        assert digest.sha256 is not None
        self.core, self.name, self.in_worker = core, name, in_worker
        self.call_id_generated = call_id is None
        # Deterministic, so the idempotency key is too; the turn keeps two turns' n-th calls
        # apart, since the key itself does not depend on the turn.
        self.call_id: str = call_id or f"turn-{turn_sequence}-call-{call_number}"
        execution_id = new_execution_id()
        key = idempotency_key(core.log_id, self.call_id, name, digest.sha256)
        self.context = ToolContext(execution_id, key, name, self.call_id, turn_sequence,
                                   digest.sha256, core.log_id)
        self.started = _writes.intent(execution_id, turn_sequence, name, self.call_id, digest, key,
                                      self.arguments if core.options.store_arguments else None,
                                      call_id_generated=self.call_id_generated,
                                      writer=core.log.writer_id)
        # Observers are told inside the dispatch's handler of interrupts, so an interrupt in
        # one is handled as one at that point without it would be: on_start before the replay
        # check and the intent, on_end after the record.
        self.seen = Observation(core.observers, self.context) if core.observers else None
        self.stage = INTENT
        self.record: dict[str, Any] | None = None
        self.result: ToolResult | None = None
        self.failure: Exception | None = None

    @property
    def execution_id(self) -> str:
        return self.context.execution_id

    def start(self) -> bool:
        """Tell the observers; whether a replay may answer (before the blocked check: answering
        from the record runs nothing). A call id never settled costs no trip to a worker."""
        if self.seen is not None:
            self.seen.start()
        return not self.call_id_generated and _replay.may_answer(self.core, self.call_id)

    def answered(self, replayed: ToolResult) -> ToolResult:
        """A replayed or refused result (its record is durable), told to the observers."""
        if self.seen is not None:
            self.seen.end(replayed, None)
        return replayed

    def admit(self) -> ToolResult | None:
        """For a call that needs approval, with the write lock held, before the intent: None
        when it may run (its intent now names the approval it consumes), else the answer."""
        return _approvals.admit(self.core, self.context, self.arguments, self.started)

    def not_begun(self, answer: Any) -> ToolResult:
        """What a begin that wrote no intent answers: the blockers, or an approval's answer."""
        if isinstance(answer, ToolResult):
            return self.answered(answer)
        return self.blocked(answer)

    def blocked(self, blockers: tuple[Any, ...]) -> ToolResult:
        """No handler ran: tell the caller (and the observers) what blocks (the blocked record
        is written)."""
        listed = [b.summary() for b in blockers]
        message = blocked_text(self.name)
        output = {"status": BLOCKED_STATUS, "message": message, "ambiguous_executions": listed}
        return self.answered(ToolResult(self.name, self.call_id, self.arguments, output, message,
                                        "blocked", self.execution_id))

    def _terminal(self, outcome: str, output: Any,
                  exc: BaseException | None) -> tuple[dict[str, Any], ToolResult]:
        core = self.core
        digest = None if exc is not None else describe_output(
            output, core.options.output_chars, core.options.redactor, FAST_CANONICAL)
        record = _writes.finished(self.execution_id, outcome, digest, exc)
        if exc is None and core.options.stored_output_limit is not None:
            _writes.store_output(record, output, core.options.stored_output_limit)
        error = record["error"] if exc is not None else None
        return record, ToolResult(self.name, self.call_id, self.arguments, output, error,
                                  outcome, self.execution_id, False,
                                  self.started.get("approval_id"))

    def finish(self, outcome: str, output: Any, exc: Exception | None) -> None:
        """The terminal record and the result of a handler that returned or raised."""
        self.failure = exc
        self.record, self.result = self._terminal(outcome, output, exc)
        self.stage = TERMINAL

    def end(self) -> None:
        """The step: the terminal record, durably; the execution leaves the live set."""
        assert self.record is not None
        self.core.end(self.execution_id, self.record)

    def ended(self) -> ToolResult:
        assert self.result is not None
        if self.seen is not None:
            self.seen.end(self.result, self.failure)
        return self.result

    def interrupted(self, exc: BaseException) -> None:
        """The interrupt rules: anything between the intent and a durable terminal record (an
        interrupt, or an error recording the outcome) leaves the execution settled by a queued
        record, written before anything else; it blocks from now on, here exactly as after a
        restart, unless that record says what happened. In this thread, every step was cut
        where it stood: ambiguous. In a worker, a step runs to its end: an intent not yet
        handled is cancelled (the handler is never called), a terminal record lands."""
        eid = self.execution_id
        settling: dict[str, Any] | None = None
        if self.in_worker and self.stage == INTENT:
            never_called = asyncio.CancelledError("cancelled before the handler was called")
            settling = self._terminal("cancelled", None, never_called)[0]
        elif self.in_worker and self.stage == TERMINAL:
            settling = self.record
        if settling is None:
            settling = _writes.ambiguous_record(eid, exc)
        self.core.settle_later(eid, settling)
        if self.in_worker:  # what the observers are told: what lands
            self.record = settling

    def aborted(self, exc: BaseException) -> None:
        """Tell the observers how an interrupted dispatch left its execution (at the intent
        stage in a worker the handler never ran, whatever lands)."""
        if self.seen is not None:
            open_now = self.execution_id in self.core.state.executions
            self.seen.abort(self.record, open_now and not (self.in_worker and self.stage == INTENT),
                            exc)
