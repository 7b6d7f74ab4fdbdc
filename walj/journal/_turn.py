"""Turns, and dispatch driven through the steps and interrupt rules of _dispatch: in this
thread (dispatch), or awaiting each blocking step in a worker thread (adispatch)."""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from ..errors import ToolOutcomeUnknown, TurnError
from . import _replay
from ._aio import in_worker, run_soon, run_through
from ._core import Core
from ._dispatch import HANDLER, INTENT, Dispatch
from ._fingerprint import Digest
from ._llm import LLMCall
from ._slots import TurnSlot
from ._tools import ToolResult, invoke, outcome_of


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
        return self._core.live_turn() is self

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
            # this process; the writer thread sees it abandoned and leaves it so.
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
            await run_through(asyncio.get_running_loop(), self._core.write_queued)
            raise

    def llm_call(self, *, model: str | None = None, request: Any = None) -> LLMCall:
        self._check_live()
        return LLMCall(self._core, self.sequence, model, request)

    def _check_live(self) -> None:
        self._core.check_open()
        if self._core.live_turn() is not self:
            raise TurnError("dispatch needs a live turn: use `with journal.turn() as turn:`")

    # --- dispatch -----------------------------------------------------------------------------

    def _prepare(self, name: Any, arguments: Any, call_id: Any, handler: Any,
                 digest: Digest | None, approval: Any, *, in_worker: bool) -> Dispatch:
        """Everything that can refuse a call, with nothing written yet."""
        self._check_live()
        self._calls += 1
        return Dispatch(self._core, self.sequence, self._calls, name, arguments, call_id,
                        handler, digest, in_worker=in_worker, approval=approval)

    def dispatch(self, name: str, arguments: Mapping[str, Any], *, call_id: str | None = None,
                 handler: Any = None, approval: bool | None = None) -> ToolResult:
        """Run one tool call durably: intent fsynced, handler, terminal record fsynced.
        `approval=True`: this call needs a person's approval even if its tool does not (None
        or False: the tool's rule); see docs/RECOVERY.md, "Approvals"."""
        return self._dispatch(name, arguments, call_id, handler, None, approval)

    def _dispatch(self, name: str, arguments: Mapping[str, Any], call_id: str | None,
                  handler: Any, digest: Digest | None, approval: Any = None) -> ToolResult:
        run = self._prepare(name, arguments, call_id, handler, digest, approval,
                            in_worker=False)
        if run.tool.is_async:
            raise TypeError(f"tool {name!r} is async: use `await turn.adispatch(...)`")
        try:
            if run.start():
                replayed = _replay.answer(self._core, run.context, run.arguments)
                if replayed is not None:
                    return run.answered(replayed)
            admit = None
            if run.needs_approval:
                self._core.take_requests()  # a decision left by another process counts
                admit = run.admit
            blockers = self._core.begin(run.started, run.execution_id, admit=admit)
            if blockers is not None:
                return run.not_begun(blockers)
            run.stage = HANDLER
            try:
                if run.tool.guard is not None:
                    run.tool.guard(run.context)
                output = invoke(run.tool, run.arguments, run.context)
                if inspect.isawaitable(output):
                    if inspect.iscoroutine(output):
                        output.close()  # never started, so nothing ran
                    raise TypeError("the handler returned an awaitable: use turn.adispatch")
            except ToolOutcomeUnknown:
                raise  # ambiguous, as an interrupt is: recorded and blocking below
            except Exception as exc:
                run.finish(outcome_of(exc), None, exc)
            else:
                run.finish("ok", output, None)
            run.end()
            return run.ended()
        except BaseException as exc:
            run.interrupted(exc)
            try:
                self._core.write_queued()
            except BaseException:  # noqa: B036 - a second interrupt or a dead log: it blocks
                pass
            run.aborted(exc)
            raise

    async def adispatch(self, name: str, arguments: Mapping[str, Any], *,
                        call_id: str | None = None, handler: Any = None,
                        approval: bool | None = None) -> ToolResult:
        """As dispatch, awaiting async handlers; every fsync runs in a worker thread. A
        cancellation while the handler runs makes the execution block at once and writes
        tool_execution_ambiguous (in a worker), then re-raises the original CancelledError."""
        run = self._prepare(name, arguments, call_id, handler, None, approval, in_worker=True)
        core = self._core
        loop = asyncio.get_running_loop()
        try:
            if run.start():
                replayed: ToolResult | None = await in_worker(_replay.answer, core, run.context,
                                                              run.arguments)
                if replayed is not None:
                    return run.answered(replayed)
            admit = None
            if run.needs_approval:
                await in_worker(core.take_requests)  # a decision left by another process
                admit = run.admit
            core.reserve(run.execution_id)
            blockers = await in_worker(functools.partial(core.begin, reserved=True,
                                                         admit=admit),
                                       run.started, run.execution_id)
            if blockers is not None:
                return run.not_begun(blockers)
            run.stage = HANDLER
            try:
                if run.tool.guard is not None:
                    checked = run.tool.guard(run.context)
                    if inspect.isawaitable(checked):
                        await checked
                output = invoke(run.tool, run.arguments, run.context)
                if inspect.isawaitable(output):
                    output = await output
            except ToolOutcomeUnknown:
                raise  # ambiguous, as an interrupt is: recorded and blocking below
            except Exception as exc:
                run.finish(outcome_of(exc), None, exc)
            else:
                run.finish("ok", output, None)
            # The terminal record goes through the queue too when this task is cancelled
            # while it is written: the execution blocks at once, and the record lands first.
            await in_worker(run.end)
            return run.ended()
        except BaseException as exc:
            run.interrupted(exc)
            if run.stage == INTENT:  # no waiting for the fsync under way: the queue is enough
                run_soon(loop, core.write_queued)
            else:
                await run_through(loop, core.write_queued)
            run.aborted(exc)
            raise
