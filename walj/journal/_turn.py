"""Turns and dispatch: the durable intent, the handler call, the terminal record, the blocked
path and interrupts, sync and async."""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
from collections.abc import Mapping
from types import TracebackType
from typing import Any, NamedTuple

from ..errors import ToolOutcomeUnknown, TurnError, UnknownToolError
from . import _replay, _writes
from ._aio import in_worker, run_soon, run_through
from ._core import Core, TurnSlot
from ._fingerprint import (
    FAST_CANONICAL,
    Digest,
    describe_arguments,
    describe_output,
    idempotency_key,
)
from ._llm import LLMCall
from ._observe import Observation
from ._tools import Tool, ToolContext, ToolResult, as_tool, invoke, outcome_of

BLOCKED_STATUS = "blocked_interrupted_execution"


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


class _Prepared(NamedTuple):
    name: str
    call_id: str
    arguments: dict[str, Any]
    tool: Tool
    digest: Digest
    context: ToolContext
    started: dict[str, Any]
    call_id_generated: bool  # walj made up the call id: never replayed

    @property
    def execution_id(self) -> str:
        return self.context.execution_id


class Turn(TurnSlot):
    """One agent turn: `with journal.turn() as turn:` or `async with`. Leaving the block
    normally writes turn_completed; leaving it by an exception leaves the turn incomplete.

    A turn is live exactly while the journal's core names it as its live turn (TurnSlot).
    Each step that can be interrupted after it changed that is repeated, idempotently, in an
    `except` clause.
    """

    def __init__(self, core: Core) -> None:
        super().__init__()
        self._core = core
        self._entered = False
        self._calls = 0

    @property
    def _live(self) -> bool:
        return self._core.live_turn is self

    @property
    def turn_id(self) -> str:
        """Globally unique: the log id and the turn sequence."""
        return f"{self._core.log_id}:{self.sequence}"

    def __repr__(self) -> str:
        return f"<walj.Turn {self.sequence} {'live' if self._live else 'not live'}>"

    # --- bracketing -----------------------------------------------------------------------------

    def _enter_once(self) -> None:
        if self._entered:
            raise TurnError("a Turn object is entered once")
        self._entered = True

    def __enter__(self) -> Turn:
        self._enter_once()
        try:
            self._core.start_turn(self)
            return self
        except BaseException:
            self._core.release_turn(self)
            raise

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            self._core.end_turn(self, exc_type is None)
        except BaseException:
            self._core.release_turn(self)
            raise

    async def __aenter__(self) -> Turn:
        self._enter_once()
        try:
            await in_worker(self._core.start_turn, self)
            return self
        except BaseException:
            # Cancelled (or failed) while turn_started was written: the turn is over now, in
            # this process; the writer thread sees _abandoned and leaves it so.
            self._core.release_turn(self)
            raise

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        try:
            await in_worker(self._core.end_turn, self, exc_type is None)
        except BaseException:
            # The turn ends here and now; turn_completed is written only while it is live.
            self._core.release_turn(self)
            # A worker may be writing turn_completed at this moment: wait for the write lock,
            # so that what this process holds when the interrupt reaches the caller is what a
            # replay of the log rebuilds, whichever side of the write the interrupt fell on.
            await run_through(asyncio.get_running_loop(), self._core.write_settlements)
            raise

    def llm_call(self, *, model: str | None = None, request: Any = None) -> LLMCall:
        self._check_live()
        return LLMCall(self._core, self.sequence, model, request)

    def _check_live(self) -> None:
        self._core.check_open()
        if self._core.live_turn is not self:
            raise TurnError("dispatch needs a live turn: use `with journal.turn() as turn:`")

    # --- preparing ------------------------------------------------------------------------------

    def _prepare(self, name: Any, arguments: Any, call_id: Any, handler: Any,
                 digest: Digest | None = None) -> _Prepared:
        """Everything that can refuse a call, with nothing written yet."""
        self._check_live()
        core = self._core
        if not isinstance(name, str) or not name:
            raise TypeError(f"tool name must be a non-empty string, not {name!r}")
        if handler is None:
            tool = core.tools.get(name)
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
        if digest is None:
            digest = describe_arguments(arguments, core.arguments_chars, core.redactor,
                                        FAST_CANONICAL)
        assert digest.sha256 is not None
        self._calls += 1
        generated = call_id is None
        if call_id is None:
            # Deterministic, so the idempotency key is too; the turn keeps two turns' n-th
            # calls apart, since the key itself does not depend on the turn.
            call_id = f"turn-{self.sequence}-call-{self._calls}"
        execution_id = os.urandom(16).hex()
        key = idempotency_key(core.log_id, call_id, name, digest.sha256)
        context = ToolContext(execution_id, key, name, call_id, self.sequence, digest.sha256,
                              core.log_id)
        started = _writes.intent(execution_id, self.sequence, name, call_id, digest, key,
                                 arguments if core.store_arguments else None,
                                 call_id_generated=generated, writer=core.log.writer_id)
        return _Prepared(name, call_id, arguments, tool, digest, context, started, generated)

    def _finish(self, prep: _Prepared, outcome: str, output: Any,
                exc: BaseException | None) -> tuple[dict[str, Any], ToolResult]:
        core = self._core
        digest = None if exc is not None else describe_output(
            output, core.output_chars, core.redactor, FAST_CANONICAL)
        record = _writes.finished(prep.execution_id, outcome, digest, exc)
        if exc is None and core.stored_output_limit is not None:
            _writes.store_output(record, output, core.stored_output_limit)
        error = record["error"] if exc is not None else None
        result = ToolResult(prep.name, prep.call_id, prep.arguments, output, error, outcome,
                            prep.execution_id)
        return record, result

    def _blocked(self, prep: _Prepared, blockers: tuple[Any, ...],
                 seen: Observation | None) -> ToolResult:
        """No handler ran: tell the caller (and the observers) what blocks (the blocked record
        is written)."""
        listed = [
            {"execution_id": b.execution_id, "tool": b.tool, "call_id": b.call_id,
             "state": b.state, "turn_sequence": b.turn_sequence}
            for b in blockers
        ]
        message = blocked_text(prep.name)
        output = {"status": BLOCKED_STATUS, "message": message, "ambiguous_executions": listed}
        result = ToolResult(prep.name, prep.call_id, prep.arguments, output, message, "blocked",
                            prep.execution_id)
        if seen is not None:
            seen.end(result, None)
        return result

    @staticmethod
    def _answered(replayed: ToolResult, seen: Observation | None) -> ToolResult:
        """A replayed or refused result (its record is durable), told to the observers."""
        if seen is not None:
            seen.end(replayed, None)
        return replayed

    # --- sync dispatch --------------------------------------------------------------------------

    def dispatch(self, name: str, arguments: Mapping[str, Any], *, call_id: str | None = None,
                 handler: Any = None) -> ToolResult:
        """Run one tool call durably: intent fsynced, handler, terminal record fsynced."""
        return self._dispatch(name, arguments, call_id, handler, None)

    def _dispatch(self, name: str, arguments: Mapping[str, Any], call_id: str | None,
                  handler: Any, digest: Digest | None) -> ToolResult:
        prep = self._prepare(name, arguments, call_id, handler, digest)
        core = self._core
        if inspect.iscoroutinefunction(prep.tool.handler):
            raise TypeError(f"tool {name!r} is async: use `await turn.adispatch(...)`")
        eid = prep.execution_id
        # Observers are told inside the try below, so an interrupt in one is handled as one at
        # that point without it would be: on_start before the replay check and the intent,
        # on_end after the record. (Until the intent lands, that handling finds nothing open.)
        seen = Observation(core.observers, prep.context) if core.observers else None
        record: dict[str, Any] | None = None
        failure: Exception | None = None
        try:
            if seen is not None:
                seen.start()
            # Before the blocked check: answering from the record runs nothing.
            if not prep.call_id_generated and _replay.may_answer(core, prep.call_id):
                replayed = _replay.answer(core, prep.context, prep.arguments)
                if replayed is not None:
                    return self._answered(replayed, seen)
            blockers = core.begin(prep.started, eid)
            if blockers is not None:
                return self._blocked(prep, blockers, seen)
            try:
                if prep.tool.guard is not None:
                    prep.tool.guard(prep.context)
                output = invoke(prep.tool, prep.arguments, prep.context)
                if inspect.isawaitable(output):
                    if inspect.iscoroutine(output):
                        output.close()  # never started, so nothing ran
                    raise TypeError("the handler returned an awaitable: use turn.adispatch")
            except ToolOutcomeUnknown:
                raise  # ambiguous, as an interrupt is: recorded and blocking below
            except Exception as exc:
                failure = exc
                record, result = self._finish(prep, outcome_of(exc), None, exc)
            else:
                record, result = self._finish(prep, "ok", output, None)
            core.end(eid, record)
            if seen is not None:
                seen.end(result, failure)
            return result
        except BaseException as exc:
            # Anything between the intent and a durable terminal record (an interrupt, or an
            # error recording the outcome) leaves the execution ambiguous: it blocks from now
            # on, here exactly as after a restart.
            core.interrupted(eid, exc)
            if seen is not None:
                seen.abort(record, eid in core.state.executions, exc)
            raise

    # --- async dispatch -------------------------------------------------------------------------

    async def adispatch(self, name: str, arguments: Mapping[str, Any], *,
                        call_id: str | None = None, handler: Any = None) -> ToolResult:
        """As dispatch, awaiting async handlers; every fsync runs in a worker thread. A
        cancellation while the handler runs makes the execution block at once and writes
        tool_execution_ambiguous (in a worker), then re-raises the original CancelledError."""
        prep = self._prepare(name, arguments, call_id, handler)
        core = self._core
        loop = asyncio.get_running_loop()
        eid = prep.execution_id
        # How far it got, for the one handler below: an interrupt may land on any line, and
        # every line from the intent's submission on is covered by it (no gap between blocks).
        stage, record = "intent", None
        failure: Exception | None = None
        seen = Observation(core.observers, prep.context) if core.observers else None
        try:
            if seen is not None:
                seen.start()
            # Before the blocked check: answering from the record runs nothing. A call id
            # never settled (the common case) costs no trip to a worker thread.
            if not prep.call_id_generated and _replay.may_answer(core, prep.call_id):
                replayed: ToolResult | None = await in_worker(_replay.answer, core,
                                                              prep.context, prep.arguments)
                if replayed is not None:
                    return self._answered(replayed, seen)
            core.reserve(eid)
            blockers = await in_worker(functools.partial(core.begin, reserved=True),
                                       prep.started, eid)
            if blockers is not None:
                return self._blocked(prep, blockers, seen)
            stage = "handler"
            try:
                if prep.tool.guard is not None:
                    checked = prep.tool.guard(prep.context)
                    if inspect.isawaitable(checked):
                        await checked
                output = invoke(prep.tool, prep.arguments, prep.context)
                if inspect.isawaitable(output):
                    output = await output
            except ToolOutcomeUnknown:
                raise  # ambiguous, as an interrupt is: recorded and blocking below
            except Exception as exc:
                failure = exc
                record, result = self._finish(prep, outcome_of(exc), None, exc)
            else:
                record, result = self._finish(prep, "ok", output, None)
            stage = "terminal"
            # The terminal record goes through the queue too when this task is cancelled
            # while it is written: the execution blocks at once, and the record lands first.
            await in_worker(core.end, eid, record)
            if seen is not None:
                seen.end(result, failure)
            return result
        except BaseException as exc:
            if stage == "intent":  # the handler was never called
                never_called = asyncio.CancelledError("cancelled before the handler was called")
                record = self._finish(prep, "cancelled", None, never_called)[0]
            elif stage == "handler" or record is None:
                record = _writes.ambiguous_record(eid, exc)
            core.settle_later(eid, record)
            if stage == "intent":  # no waiting for the fsync under way: the queue is enough
                run_soon(loop, core.write_settlements)
            else:
                await run_through(loop, core.write_settlements)
            if seen is not None:  # the handler never ran at the intent stage, whatever lands
                seen.abort(record, stage != "intent" and eid in core.state.executions, exc)
            raise
