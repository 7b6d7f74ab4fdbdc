"""Turns and dispatch: the durable intent, the handler call, the terminal record, the blocked
path, interrupts (sync and async), and LLM-call brackets."""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import time
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, NamedTuple

from . import _records as rc
from ._fingerprint import (
    Digest,
    FastEncoder,
    describe_arguments,
    describe_error,
    describe_output,
    idempotency_key,
)
from ._tools import ERROR_CHARS, Tool, ToolContext, ToolResult, as_tool, invoke, outcome_of
from .errors import TurnError, UnknownToolError

if TYPE_CHECKING:
    from ._journal import ToolJournal

BLOCKED_STATUS = "blocked_interrupted_execution"

FAST_CANONICAL: FastEncoder | None
try:  # the journal runs with msgspec; its sorted encoder makes fingerprints ~10x cheaper
    import msgspec

    FAST_CANONICAL = msgspec.json.Encoder(order="sorted").encode
except (ImportError, TypeError):  # pragma: no cover - without msgspec, the reference encoder
    FAST_CANONICAL = None


def _now() -> float:
    return round(time.time(), 3)


def _consume(future: asyncio.Future[Any]) -> None:
    """Done callback for a shielded write whose awaiter was cancelled: retrieve its outcome so
    the loop does not report it as never retrieved (the journal state already reflects it)."""
    if not future.cancelled():
        future.exception()


class _Prepared(NamedTuple):
    name: str
    call_id: str
    arguments: dict[str, Any]
    tool: Tool
    digest: Digest
    context: ToolContext
    started: dict[str, Any]

    @property
    def execution_id(self) -> str:
        return self.context.execution_id


class Turn:
    """One agent turn: `with journal.turn() as turn:` or `async with`. Leaving the block
    normally writes turn_completed; leaving it by an exception leaves the turn incomplete."""

    def __init__(self, journal: ToolJournal) -> None:
        self._journal = journal
        self.sequence = 0
        self._live = False
        self._ended = False
        self._calls = 0

    @property
    def turn_id(self) -> str:
        """Globally unique: the log id and the turn sequence."""
        return f"{self._journal.log_id}:{self.sequence}"

    def __repr__(self) -> str:
        return f"<walj.Turn {self.sequence} {'live' if self._live else 'not live'}>"

    # --- bracketing -----------------------------------------------------------------------------

    def __enter__(self) -> Turn:
        if self._live or self._ended:
            raise TurnError("a Turn object is entered once")
        self.sequence = self._journal._start_turn(self)
        self._live = True
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._live = False
        self._ended = True
        self._journal._end_turn(self, completed=exc_type is None)

    async def __aenter__(self) -> Turn:
        if self._live or self._ended:
            raise TurnError("a Turn object is entered once")
        self.sequence = await asyncio.to_thread(self._journal._start_turn, self)
        self._live = True
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self._live = False
        self._ended = True
        await asyncio.to_thread(self._journal._end_turn, self, exc_type is None)

    def llm_call(self, *, model: str | None = None, request: Any = None) -> LLMCall:
        self._check_live()
        return LLMCall(self._journal, self.sequence, model, request)

    def _check_live(self) -> None:
        self._journal._check_open()
        if not self._live:
            raise TurnError("dispatch needs a live turn: use `with journal.turn() as turn:`")

    # --- preparing ------------------------------------------------------------------------------

    def _prepare(self, name: Any, arguments: Any, call_id: Any, handler: Any,
                 digest: Digest | None = None) -> _Prepared:
        """Everything that can refuse a call, with nothing written yet."""
        self._check_live()
        journal = self._journal
        if not isinstance(name, str) or not name:
            raise TypeError(f"tool name must be a non-empty string, not {name!r}")
        if handler is None:
            tool = journal._tools.get(name)
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
            digest = describe_arguments(arguments, journal.arguments_chars, journal.redactor,
                                        FAST_CANONICAL)
        assert digest.sha256 is not None
        self._calls += 1
        if call_id is None:
            call_id = f"call-{self._calls}"  # deterministic, so the idempotency key is too
        execution_id = os.urandom(16).hex()
        key = idempotency_key(journal.log_id, self.sequence, call_id, name, digest.sha256)
        context = ToolContext(execution_id, key, name, call_id, self.sequence, digest.sha256,
                              journal.log_id)
        started: dict[str, Any] = {
            "k": rc.STARTED, "v": rc.CONTRACT_VERSION, "id": execution_id, "t": _now(),
            "turn": self.sequence, "tool": name, "call": call_id, "sha": digest.sha256,
            "ik": key, "ap": digest.preview, "al": digest.length,
        }
        if journal.store_arguments:
            started["a"] = arguments
        return _Prepared(name, call_id, arguments, tool, digest, context, started)

    def _finish(self, prep: _Prepared, outcome: str, output: Any,
                exc: BaseException | None) -> tuple[dict[str, Any], ToolResult]:
        journal = self._journal
        record: dict[str, Any] = {"k": rc.FINISHED, "v": rc.CONTRACT_VERSION,
                                  "id": prep.execution_id, "t": _now(), "o": outcome}
        error: str | None = None
        if exc is None:
            digest = describe_output(output, journal.output_chars, journal.redactor,
                                     FAST_CANONICAL)
            record["os"] = digest.sha256
            record["op"] = digest.preview
            record["ol"] = digest.length
        else:
            error = describe_error(exc, ERROR_CHARS)
            record["err"] = error
            record["et"] = type(exc).__name__
        result = ToolResult(prep.name, prep.call_id, prep.arguments, output, error, outcome,
                            prep.execution_id)
        return record, result

    def _blocked(self, prep: _Prepared) -> ToolResult:
        """No handler runs: record the refusal and tell the caller what blocks."""
        journal = self._journal
        blockers = journal.recovery.blockers
        listed = [
            {"execution_id": b.execution_id, "tool": b.tool, "call_id": b.call_id,
             "state": b.state, "turn_sequence": b.turn_sequence}
            for b in blockers
        ]
        message = (
            f"walj blocked tool {prep.name!r}: {len(blockers)} earlier execution(s) or turn(s) "
            "were interrupted and may or may not have taken effect. Nothing was run. Resolve "
            "them (journal.resolve / journal.resolve_turn) or answer without tools."
        )
        record = dict(prep.started)
        record["k"] = rc.BLOCKED
        record.pop("ik", None)
        record.pop("a", None)
        record["by"] = [b.execution_id for b in blockers if b.execution_id is not None]
        record["bt"] = [b.turn_sequence for b in blockers if b.execution_id is None]
        journal._write(record, durable=False)
        output = {"status": BLOCKED_STATUS, "message": message, "ambiguous_executions": listed}
        return ToolResult(prep.name, prep.call_id, prep.arguments, output, message, "blocked",
                          prep.execution_id)

    # --- sync dispatch --------------------------------------------------------------------------

    def dispatch(self, name: str, arguments: Mapping[str, Any], *, call_id: str | None = None,
                 handler: Any = None) -> ToolResult:
        """Run one tool call durably: intent fsynced, handler, terminal record fsynced."""
        return self._dispatch(name, arguments, call_id, handler, None)

    def _dispatch(self, name: str, arguments: Mapping[str, Any], call_id: str | None,
                  handler: Any, digest: Digest | None) -> ToolResult:
        prep = self._prepare(name, arguments, call_id, handler, digest)
        journal = self._journal
        if inspect.iscoroutinefunction(prep.tool.handler):
            raise TypeError(f"tool {name!r} is async: use `await turn.adispatch(...)`")
        if journal.is_blocked():
            return self._blocked(prep)
        eid = prep.execution_id
        journal._write(prep.started, durable=True, live_add=eid)
        try:
            if prep.tool.guard is not None:
                prep.tool.guard(prep.context)
            output = invoke(prep.tool, prep.arguments, prep.context)
            if inspect.isawaitable(output):
                if inspect.iscoroutine(output):
                    output.close()  # never started, so nothing ran
                raise TypeError("the handler returned an awaitable: use turn.adispatch")
        except Exception as exc:
            record, result = self._finish(prep, outcome_of(exc), None, exc)
        except BaseException as exc:
            journal._mark_ambiguous(eid, exc)
            raise
        else:
            record, result = self._finish(prep, "ok", output, None)
        journal._write(record, durable=True, live_remove=eid)
        return result

    # --- async dispatch -------------------------------------------------------------------------

    async def adispatch(self, name: str, arguments: Mapping[str, Any], *,
                        call_id: str | None = None, handler: Any = None) -> ToolResult:
        """As dispatch, awaiting async handlers; every fsync runs in a worker thread. A
        cancellation while the handler runs writes tool_execution_ambiguous (best effort) and
        re-raises the original CancelledError."""
        prep = self._prepare(name, arguments, call_id, handler)
        journal = self._journal
        loop = asyncio.get_running_loop()
        if journal.is_blocked():
            return await asyncio.to_thread(self._blocked, prep)
        eid = prep.execution_id
        intent = loop.run_in_executor(
            None, functools.partial(journal._write, prep.started, durable=True, live_add=eid))
        try:
            await asyncio.shield(intent)
        except asyncio.CancelledError:
            # The intent may still land; then the handler was certainly never called.
            intent.add_done_callback(functools.partial(self._never_called, prep, loop))
            raise
        try:
            if prep.tool.guard is not None:
                checked = prep.tool.guard(prep.context)
                if inspect.isawaitable(checked):
                    await checked
            output = invoke(prep.tool, prep.arguments, prep.context)
            if inspect.isawaitable(output):
                output = await output
        except Exception as exc:
            record, result = self._finish(prep, outcome_of(exc), None, exc)
        except BaseException as exc:
            marking = loop.run_in_executor(None, journal._mark_ambiguous, eid, exc)
            try:
                await asyncio.shield(marking)
            except BaseException:  # noqa: B036 - cancelled again: the write finishes anyway
                marking.add_done_callback(_consume)
            raise
        else:
            record, result = self._finish(prep, "ok", output, None)
        finished = loop.run_in_executor(
            None, functools.partial(journal._write, record, durable=True, live_remove=eid))
        try:
            await asyncio.shield(finished)
        except asyncio.CancelledError:
            finished.add_done_callback(_consume)
            raise
        return result

    def _never_called(self, prep: _Prepared, loop: asyncio.AbstractEventLoop,
                      intent: asyncio.Future[Any]) -> None:
        if intent.cancelled() or intent.exception() is not None:
            return
        record, _ = self._finish(prep, "cancelled", None,
                                 asyncio.CancelledError("cancelled before the handler was called"))
        write = functools.partial(self._journal._write, record, durable=True,
                                  live_remove=prep.execution_id)
        try:
            loop.run_in_executor(None, write).add_done_callback(_consume)
        except RuntimeError:  # the loop is closing: the execution stays a blocker (fail closed)
            with self._journal._lock:
                self._journal._live.discard(prep.execution_id)


class LLMCall:
    """Brackets one LLM request: llm_call_started, then llm_call_finished on leaving the block.
    An interrupt (not an Exception) leaves it pending, and pending calls are reported on open."""

    def __init__(self, journal: ToolJournal, turn_sequence: int | None, model: str | None,
                 request: Any) -> None:
        if model is not None and not isinstance(model, str):
            raise TypeError("model must be a string or None")
        self._journal = journal
        self.turn_sequence = turn_sequence
        self.model = model
        self.request = request
        self.response: Any = None
        self.llm_call_id = os.urandom(16).hex()
        self._entered = False

    def finish(self, response: Any) -> None:
        """Keep the response: its fingerprint and preview go into llm_call_finished."""
        self.response = response

    def _started(self) -> None:
        if self._entered:
            raise TurnError("an LLMCall object is entered once")
        journal = self._journal
        journal._check_open()
        self._entered = True
        record: dict[str, Any] = {"k": rc.LLM_STARTED, "v": rc.CONTRACT_VERSION,
                                  "id": self.llm_call_id, "t": _now(),
                                  "turn": self.turn_sequence, "model": self.model}
        if self.request is not None:
            digest = describe_output(self.request, journal.arguments_chars, journal.redactor,
                                     FAST_CANONICAL)
            record.update(sha=digest.sha256, rp=digest.preview, rl=digest.length)
        journal._write(record, durable=False, llm_add=self.llm_call_id)

    def _finished(self, exc: BaseException | None) -> None:
        journal = self._journal
        if exc is not None and not isinstance(exc, Exception):
            with journal._lock:
                journal._live_llm.discard(self.llm_call_id)
            return
        record: dict[str, Any] = {"k": rc.LLM_FINISHED, "v": rc.CONTRACT_VERSION,
                                  "id": self.llm_call_id, "t": _now(),
                                  "o": "ok" if exc is None else "error"}
        if exc is not None:
            record["err"] = describe_error(exc, ERROR_CHARS)
        elif self.response is not None:
            digest = describe_output(self.response, journal.output_chars, journal.redactor,
                                     FAST_CANONICAL)
            record.update(os=digest.sha256, op=digest.preview, ol=digest.length)
        journal._write(record, durable=False, llm_remove=self.llm_call_id)

    def __enter__(self) -> LLMCall:
        self._started()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._finished(exc)

    async def __aenter__(self) -> LLMCall:
        await asyncio.to_thread(self._started)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await asyncio.to_thread(self._finished, exc)
