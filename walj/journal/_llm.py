"""LLM-call brackets: llm_call_started before the request, llm_call_finished after it; an
interrupt leaves the call pending, and pending calls are reported on open."""

from __future__ import annotations

import asyncio
import os
from types import TracebackType
from typing import Any

from ..errors import TurnError
from . import _writes
from ._aio import in_worker, run_through
from ._core import Core
from ._fingerprint import FAST_CANONICAL, describe_output
from ._slots import LLMSlot


class LLMCall(LLMSlot):
    """Brackets one LLM request: llm_call_started, then llm_call_finished on leaving the block.
    An interrupt (not an Exception) leaves it pending, and pending calls are reported on open."""

    def __init__(self, core: Core, turn_sequence: int | None, model: str | None,
                 request: Any) -> None:
        if model is not None and not isinstance(model, str):
            raise TypeError("model must be a string or None")
        super().__init__(os.urandom(16).hex())
        self._core = core
        self.turn_sequence = turn_sequence
        self.model = model
        self.request = request
        self.response: Any = None
        self._entered = False

    def finish(self, response: Any) -> None:
        """Keep the response: its fingerprint and preview go into llm_call_finished."""
        self.response = response

    def _started(self) -> None:
        core = self._core
        digest = None if self.request is None else describe_output(
            self.request, core.options.arguments_chars, core.options.redactor, FAST_CANONICAL)
        record = _writes.llm_started(self.llm_call_id, self.turn_sequence, self.model, digest,
                                     core.options.block_on_pending_llm_calls)
        core.start_llm(self, record)

    def _leave(self) -> None:
        """Not in flight any more, in this process; idempotent."""
        self._core.leave_llm(self)

    def _finished(self, exc: BaseException | None) -> None:
        core = self._core
        if exc is not None and not isinstance(exc, Exception):
            self._leave()  # an interrupt: left pending, as after a crash
            return
        digest = None if exc is not None or self.response is None else describe_output(
            self.response, core.options.output_chars, core.options.redactor, FAST_CANONICAL)
        core.write(_writes.llm_finished(self.llm_call_id, digest, exc), durable=False)
        self._leave()

    def _enter_once(self) -> None:
        if self._entered:
            raise TurnError("an LLMCall object is entered once")
        self._core.check_open()
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
            # As a turn's exit: llm_call_finished may be in a worker's write right now.
            await run_through(asyncio.get_running_loop(), self._core.write_queued)
            raise
