"""ToolJournal: opening a journal (one-pass rebuild, then automatic settlement), its recovery
view, turns and function calls, and the locked write path that keeps the live state equal to
what a replay would rebuild."""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import Any

from . import _records as rc
from . import _resolve
from ._fingerprint import (
    ARGUMENTS_PREVIEW_CHARS,
    DEFAULT_REDACT_KEYS,
    OUTPUT_PREVIEW_CHARS,
    Redactor,
    describe_arguments,
    describe_error,
)
from ._log import Log
from ._recovery import Recovery, RecoveryState, Resolution
from ._tools import ERROR_CHARS, Tool, error_result, lookup, normalise_calls, tools_from
from ._turn import FAST_CANONICAL, LLMCall, Turn
from .errors import ClosedError, TurnError

_SESSION_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@+=-]{0,127}")


def check_session_id(session_id: Any) -> str:
    """Refuse, with ValueError, anything but 1-128 characters of [A-Za-z0-9_.@+=-] that does
    not start with '.' or '-': no separators, no traversal, no hidden or empty names."""
    if not isinstance(session_id, str):
        raise ValueError(f"session id must be a string, not {type(session_id).__name__}")
    if not session_id:
        raise ValueError("session id is empty")
    if len(session_id) > 128:
        raise ValueError(f"session id is {len(session_id)} characters; the limit is 128")
    if _SESSION_ID.fullmatch(session_id) is None:
        raise ValueError(
            f"unsafe session id {session_id!r}: use letters, digits and _.@+=- only, not "
            "starting with '.' or '-' (no path separators or traversal)"
        )
    return session_id


def _now() -> float:
    return round(time.time(), 3)


class ToolJournal:
    """Crash-safe tool execution over one walj log. Open with `ToolJournal.open`."""

    def __init__(
        self,
        log: Log,
        state: RecoveryState,
        tools: dict[str, Tool],
        *,
        arguments_chars: int,
        output_chars: int,
        redactor: Redactor,
        store_arguments: bool,
        block_on_pending_llm_calls: bool,
    ) -> None:
        self._log = log
        self._state = state
        self._tools = tools
        self.arguments_chars = arguments_chars
        self.output_chars = output_chars
        self.redactor = redactor
        self.store_arguments = store_arguments
        self.block_on_pending_llm_calls = block_on_pending_llm_calls
        self._lock = threading.Lock()
        self._resolve_lock = threading.Lock()
        self._live: set[str] = set()
        self._live_llm: set[str] = set()
        self._live_turn: Turn | None = None
        self._closed = False

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        tools: Mapping[str, Any] | None = None,
        preview_chars: int = ARGUMENTS_PREVIEW_CHARS,
        output_preview_chars: int = OUTPUT_PREVIEW_CHARS,
        redact_keys: Iterable[str] = DEFAULT_REDACT_KEYS,
        store_arguments: bool = False,
        block_on_pending_llm_calls: bool = False,
        **log_options: Any,
    ) -> ToolJournal:
        """Open (creating if needed) the journal in directory `path` and rebuild its recovery
        state in one pass. Reconcile hooks and on_ambiguous policies of registered tools then
        settle what they can, durably. `log_options` go to walj.Log.open."""
        registry = tools_from(tools)
        for name, value in (("preview_chars", preview_chars),
                            ("output_preview_chars", output_preview_chars)):
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be a positive int, not {value!r}")
        redactor = Redactor(redact_keys)
        state = RecoveryState()
        log = Log.open(path, _replay=state.feed_json, **log_options)
        journal = cls(
            log, state, registry,
            arguments_chars=preview_chars,
            output_chars=output_preview_chars,
            redactor=redactor,
            store_arguments=bool(store_arguments),
            block_on_pending_llm_calls=bool(block_on_pending_llm_calls),
        )
        if log_options.get("recovery") != "salvage":
            try:
                _resolve.settle_automatically(journal)
            except BaseException:
                log.close()
                raise
        return journal

    @classmethod
    def open_session(
        cls, root: str | os.PathLike[str], session_id: str, **options: Any
    ) -> ToolJournal:
        """Open the journal of one session in `root/<session_id>/`; unsafe ids: ValueError."""
        check_session_id(session_id)
        base = Path(root)
        path = base / session_id
        if path.parent != base:
            raise ValueError(f"unsafe session id {session_id!r}")
        return cls.open(path, **options)

    # --- what it is -----------------------------------------------------------------------------

    @property
    def path(self) -> Path:
        return Path(self._log.path)

    @property
    def log_id(self) -> str:
        return self._log.log_id

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def tools(self) -> Mapping[str, Tool]:
        return MappingProxyType(self._tools)

    @property
    def recovery(self) -> Recovery:
        """The recovery view now: blockers from earlier runs (and from interrupts in this one);
        work in flight in this process is not counted."""
        with self._lock:
            return self._state.snapshot(**self._live_view())

    def _live_view(self) -> dict[str, Any]:
        return {
            "live_executions": self._live,
            "live_turn": self._live_turn.sequence if self._live_turn is not None else None,
            "live_llm_calls": self._live_llm,
            "block_on_pending_llm_calls": self.block_on_pending_llm_calls,
        }

    def is_blocked(self) -> bool:
        with self._lock:
            return self._state.is_blocked(**self._live_view())

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<walj.ToolJournal {self._log.path!r} {state}>"

    # --- writing --------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("journal is closed")

    def _write(
        self,
        record: dict[str, Any],
        *,
        durable: bool,
        live_add: str | None = None,
        live_remove: str | None = None,
        llm_add: str | None = None,
        llm_remove: str | None = None,
    ) -> int:
        """Append one record and feed it to the recovery state, the same function a reopen uses,
        so the live view always equals what a replay would rebuild."""
        try:
            seq = self._log.append(record, durable=durable)
            with self._lock:
                self._state.feed(seq, record)
                if live_add is not None:
                    self._live.add(live_add)
                if llm_add is not None:
                    self._live_llm.add(llm_add)
        finally:
            # Leaving the live set even when the write failed: an execution whose terminal record
            # is not on disk must block, here as after a restart.
            if live_remove is not None or llm_remove is not None:
                with self._lock:
                    self._live.discard(live_remove or "")
                    self._live_llm.discard(llm_remove or "")
        return seq

    def _mark_ambiguous(self, execution_id: str, exc: BaseException) -> None:
        """Best effort, never raises: the interrupt in flight matters more than this record."""
        record = {"k": rc.AMBIGUOUS, "v": rc.CONTRACT_VERSION, "id": execution_id, "t": _now(),
                  "et": type(exc).__name__, "err": describe_error(exc, ERROR_CHARS)}
        try:
            self._write(record, durable=True, live_remove=execution_id)
        except BaseException:  # noqa: B036 - a second interrupt or a dead log: the blocker stays
            with self._lock:
                self._live.discard(execution_id)

    # --- turns and LLM calls --------------------------------------------------------------------

    def turn(self) -> Turn:
        """`with journal.turn() as turn:` (or `async with`). One live turn at a time."""
        self._check_open()
        return Turn(self)

    def _start_turn(self, turn: Turn) -> int:
        self._check_open()
        with self._lock:
            if self._live_turn is not None:
                raise TurnError(f"turn {self._live_turn.sequence} is still live; turns do not nest")
            sequence = self._state.max_turn + 1
            self._live_turn = turn
        try:
            self._write({"k": rc.TURN_STARTED, "v": rc.CONTRACT_VERSION, "turn": sequence,
                         "t": _now()}, durable=False)
        except BaseException:
            with self._lock:
                self._live_turn = None
            raise
        return sequence

    def _end_turn(self, turn: Turn, completed: bool) -> None:
        try:
            if completed:
                self._write({"k": rc.TURN_COMPLETED, "v": rc.CONTRACT_VERSION,
                             "turn": turn.sequence, "t": _now()}, durable=False)
        finally:
            with self._lock:
                if self._live_turn is turn:
                    self._live_turn = None

    def llm_call(self, *, model: str | None = None, request: Any = None) -> LLMCall:
        """`with journal.llm_call(model=..., request=...) as call:` then `call.finish(response)`.
        An interrupt leaves it pending; pending calls are reported on open."""
        self._check_open()
        live = self._live_turn
        return LLMCall(self, live.sequence if live is not None else None, model, request)

    def handle_function_calls(
        self, calls: Sequence[Any], registry: Any = None
    ) -> list[dict[str, Any]]:
        """Dispatch each call durably (in the live turn, or in a turn of its own) and return
        dicts with exactly the keys name, call_id, arguments, output and error. Arguments that
        cannot be stored raise SerializationError before any call is dispatched."""
        self._check_open()
        normalised = normalise_calls(calls)
        digests = [
            None if call.problem is not None
            else describe_arguments(call.arguments, self.arguments_chars, self.redactor,
                                    FAST_CANONICAL)
            for call in normalised
        ]
        live = self._live_turn
        if live is not None:
            return self._run_calls(live, normalised, digests, registry)
        with self.turn() as turn:
            return self._run_calls(turn, normalised, digests, registry)

    def _run_calls(self, turn: Turn, calls: list[Any], digests: list[Any],
                   registry: Any) -> list[dict[str, Any]]:
        results: list[dict[str, Any]] = []
        for index, (call, digest) in enumerate(zip(calls, digests, strict=True)):
            if call.problem is not None:
                results.append(error_result(call, index, call.problem))
                continue
            tool = lookup(registry, call.name) if registry is not None else (
                self._tools.get(call.name))
            if tool is None:
                results.append(error_result(call, index, f"unknown tool {call.name!r}"))
                continue
            result = turn._dispatch(call.name, call.arguments, call.call_id, tool, digest)
            results.append(result.as_dict())
        return results

    # --- resolution -----------------------------------------------------------------------------

    def resolve(
        self,
        execution_id: str,
        outcome: str,
        *,
        note: str | None = None,
        actor: str,
        output: Any = None,
    ) -> Resolution:
        """Settle an interrupted execution (or, with block_on_pending_llm_calls, a pending LLM
        call) durably. `outcome`: "succeeded", "failed" (needs a note) or "not_performed".
        Refusals raise ResolutionError and write nothing."""
        self._check_open()
        return _resolve.resolve(self, execution_id, outcome, note=note, actor=actor,
                                output=output)

    def resolve_turn(self, turn_sequence: int, *, note: str | None = None,
                     actor: str) -> Resolution:
        """Settle an interrupted turn durably, so it no longer blocks dispatch."""
        self._check_open()
        return _resolve.resolve_turn(self, turn_sequence, note=note, actor=actor)

    # --- closing --------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the log (syncing what was appended). Idempotent."""
        self._closed = True
        if not self._log.closed:
            self._log.close()

    def __enter__(self) -> ToolJournal:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
