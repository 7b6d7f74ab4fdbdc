"""Turns and dispatch: the durable intent, the handler call, the terminal record, the blocked
path, interrupts (sync and async), and LLM-call brackets."""

from __future__ import annotations

import asyncio
import inspect
import os
import time
from collections.abc import Callable, Mapping
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


async def in_worker(function: Callable[..., Any], *args: Any) -> Any:
    """Run a blocking journal step in the default executor and await it, shielded: a
    cancellation does not stop the step, whose outcome is then consumed when it ends."""
    future = asyncio.get_running_loop().run_in_executor(None, function, *args)
    try:
        return await asyncio.shield(future)
    except BaseException:
        future.add_done_callback(_consume)
        raise


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
    normally writes turn_completed; leaving it by an exception leaves the turn incomplete.

    A turn is live exactly while the journal names it as its live turn: there is no second
    flag for an interrupt to leave out of step. Each step that can be interrupted after it
    changed that is repeated, idempotently, in an `except` clause.
    """

    def __init__(self, journal: ToolJournal) -> None:
        self._journal = journal
        self.sequence = 0
        self._entered = False
        self._abandoned = False  # set under the journal's state lock: never (again) live
        self._calls = 0

    @property
    def _live(self) -> bool:
        return self._journal._live_turn is self

    @property
    def turn_id(self) -> str:
        """Globally unique: the log id and the turn sequence."""
        return f"{self._journal.log_id}:{self.sequence}"

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
            self._journal._start_turn(self)
            return self
        except BaseException:
            self._journal._release_turn(self)
            raise

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            self._journal._end_turn(self, exc_type is None)
        except BaseException:
            self._journal._release_turn(self)
            raise

    async def __aenter__(self) -> Turn:
        self._enter_once()
        try:
            await in_worker(self._journal._start_turn, self)
            return self
        except BaseException:
            # Cancelled (or failed) while turn_started was written: the turn is over now, in
            # this process; the writer thread sees _abandoned and leaves it so.
            self._journal._release_turn(self)
            raise

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        try:
            await in_worker(self._journal._end_turn, self, exc_type is None)
        except BaseException:
            # The turn ends here and now; turn_completed is written only while it is live.
            self._journal._release_turn(self)
            raise

    def llm_call(self, *, model: str | None = None, request: Any = None) -> LLMCall:
        self._check_live()
        return LLMCall(self._journal, self.sequence, model, request)

    def _check_live(self) -> None:
        self._journal._check_open()
        if self._journal._live_turn is not self:
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
            # Deterministic, so the idempotency key is too; the turn keeps two turns' n-th
            # calls apart, since the key itself does not depend on the turn.
            call_id = f"turn-{self.sequence}-call-{self._calls}"
        execution_id = os.urandom(16).hex()
        key = idempotency_key(journal.log_id, call_id, name, digest.sha256)
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

    def _blocked(self, prep: _Prepared, blockers: tuple[Any, ...]) -> ToolResult:
        """No handler ran: tell the caller what blocks (the blocked record is written)."""
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
        eid = prep.execution_id
        try:
            blockers = journal._begin(prep.started, eid)
            if blockers is not None:
                return self._blocked(prep, blockers)
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
            else:
                record, result = self._finish(prep, "ok", output, None)
            journal._end(eid, record)
            return result
        except BaseException as exc:
            # Anything between the intent and a durable terminal record (an interrupt, or an
            # error recording the outcome) leaves the execution ambiguous: it blocks from now
            # on, here exactly as after a restart.
            journal._interrupted(eid, exc)
            raise

    # --- async dispatch -------------------------------------------------------------------------

    async def adispatch(self, name: str, arguments: Mapping[str, Any], *,
                        call_id: str | None = None, handler: Any = None) -> ToolResult:
        """As dispatch, awaiting async handlers; every fsync runs in a worker thread. A
        cancellation while the handler runs makes the execution block at once and writes
        tool_execution_ambiguous (in a worker), then re-raises the original CancelledError."""
        prep = self._prepare(name, arguments, call_id, handler)
        journal = self._journal
        loop = asyncio.get_running_loop()
        eid = prep.execution_id
        # How far it got, for the one handler below: an interrupt may land on any line, and
        # every line from the intent's submission on is covered by it (no gap between blocks).
        stage, record = "intent", None
        try:
            blockers = await in_worker(journal._begin, prep.started, eid)
            if blockers is not None:
                return self._blocked(prep, blockers)
            stage = "handler"
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
            else:
                record, result = self._finish(prep, "ok", output, None)
            stage = "terminal"
            # The terminal record goes through the queue too when this task is cancelled
            # while it is written: the execution blocks at once, and the record lands first.
            await in_worker(journal._end, eid, record)
            return result
        except BaseException as exc:
            if stage == "intent":  # the handler was never called
                never_called = asyncio.CancelledError("cancelled before the handler was called")
                record = self._finish(prep, "cancelled", None, never_called)[0]
            elif stage == "handler" or record is None:
                record = journal_ambiguous(eid, exc)
            journal._settle_later(eid, record)
            if stage == "intent":  # no waiting for the fsync under way: the queue is enough
                self._write_settlements_soon(loop)
            else:
                await self._write_settlements_shielded(loop)
            raise

    def _write_settlements_soon(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
        try:
            future = loop.run_in_executor(None, self._journal.write_settlements)
        except RuntimeError:  # the loop is closing: the queue is written by the next call
            done: asyncio.Future[None] = loop.create_future()
            done.set_result(None)
            return done
        future.add_done_callback(_consume)
        return future

    async def _write_settlements_shielded(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            await asyncio.shield(self._write_settlements_soon(loop))
        except BaseException:  # noqa: B036 - cancelled again: the write goes on in its thread
            pass


def journal_ambiguous(execution_id: str, exc: BaseException) -> dict[str, Any]:
    """The tool_execution_ambiguous record of an interrupt."""
    return {"k": rc.AMBIGUOUS, "v": rc.CONTRACT_VERSION, "id": execution_id, "t": _now(),
            "et": type(exc).__name__, "err": describe_error(exc, ERROR_CHARS)}


def blocked_record(started: dict[str, Any], blockers: tuple[Any, ...]) -> dict[str, Any]:
    """The tool_execution_blocked record of a refused call: the intent's fields, no key."""
    record = dict(started)
    record["k"] = rc.BLOCKED
    record.pop("ik", None)
    record.pop("a", None)
    record["by"] = [b.execution_id for b in blockers if b.execution_id is not None]
    record["bt"] = [b.turn_sequence for b in blockers if b.execution_id is None]
    return record


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
        self._abandoned = False  # set under the journal's state lock: never (again) live

    def finish(self, response: Any) -> None:
        """Keep the response: its fingerprint and preview go into llm_call_finished."""
        self.response = response

    def _started(self) -> None:
        journal = self._journal
        record: dict[str, Any] = {"k": rc.LLM_STARTED, "v": rc.CONTRACT_VERSION,
                                  "id": self.llm_call_id, "t": _now(),
                                  "turn": self.turn_sequence, "model": self.model}
        if self.request is not None:
            digest = describe_output(self.request, journal.arguments_chars, journal.redactor,
                                     FAST_CANONICAL)
            record.update(sha=digest.sha256, rp=digest.preview, rl=digest.length)
        if journal.block_on_pending_llm_calls:
            record["blocks"] = True  # so a reader without the option knows it blocks

        def live(seq: int) -> None:
            if not self._abandoned:
                journal._live_llm.add(self.llm_call_id)

        journal._write(record, durable=False, on_fed=live)

    def _leave(self) -> None:
        """Not in flight any more, in this process; idempotent."""
        journal = self._journal
        with journal._lock:
            self._abandoned = True
            journal._live_llm.discard(self.llm_call_id)

    def _finished(self, exc: BaseException | None) -> None:
        journal = self._journal
        if exc is not None and not isinstance(exc, Exception):
            self._leave()  # an interrupt: left pending, as after a crash
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
        journal._write(record, durable=False)
        self._leave()

    def _enter_once(self) -> None:
        if self._entered:
            raise TurnError("an LLMCall object is entered once")
        self._journal._check_open()
        self._entered = True

    def __enter__(self) -> LLMCall:
        self._enter_once()
        try:
            self._started()
            return self
        except BaseException:
            self._leave()
            raise

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            self._finished(exc)
        except BaseException:
            self._leave()
            raise

    async def __aenter__(self) -> LLMCall:
        self._enter_once()
        try:
            await in_worker(self._started)
            return self
        except BaseException:
            self._leave()
            raise

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        try:
            await in_worker(self._finished, exc)
        except BaseException:
            self._leave()
            raise
