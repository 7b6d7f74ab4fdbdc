"""ToolJournal: opening a journal (one-pass rebuild, then automatic settlement), its recovery
view, turns and function calls, and the locked write path that keeps the live state equal to
what a replay would rebuild."""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import Any

from . import _damage, _resolve
from . import _records as rc
from ._fingerprint import (
    ARGUMENTS_PREVIEW_CHARS,
    DEFAULT_REDACT_KEYS,
    OUTPUT_PREVIEW_CHARS,
    Redactor,
    describe_arguments,
)
from ._log import Log
from ._read import read
from ._recovery import Recovery, RecoveryState, Resolution
from ._tools import Tool, error_result, lookup, normalise_calls, tools_from
from ._turn import FAST_CANONICAL, LLMCall, Turn, blocked_record, journal_ambiguous
from .errors import (
    ClosedError,
    PoisonedError,
    RecordTooLargeError,
    SerializationError,
    TurnError,
    WaljError,
)

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
        # Lock order: _write_lock, then _lock. _write_lock is held across every append and
        # the feed of its record, so the state takes records in seq order, and across a
        # dispatch's blocked check and its intent, so no intent is written while blocked.
        self._write_lock = threading.RLock()
        self._lock = threading.Lock()  # the state and the live sets, for quick readers
        self._resolve_lock = threading.Lock()
        self._live: set[str] = set()
        self._live_llm: set[str] = set()
        self._live_turn: Turn | None = None
        # Terminal and ambiguous records whose execution already left the live set, written
        # before anything else under _write_lock (a cancelled task cannot wait for its fsync).
        self._settlements: list[tuple[str, dict[str, Any]]] = []
        # Executions whose caller gave up while the intent was still being written: the
        # record to write once the intent lands (the handler is never called).
        self._abandoned: dict[str, dict[str, Any]] = {}
        self._beginning: set[str] = set()  # executions whose intent is being written
        self._unknown_state: BaseException | None = None  # the state could not be rebuilt
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
        try:
            journal = cls(
                log, state, registry,
                arguments_chars=preview_chars,
                output_chars=output_preview_chars,
                redactor=redactor,
                store_arguments=bool(store_arguments),
                block_on_pending_llm_calls=bool(block_on_pending_llm_calls),
            )
            if log_options.get("recovery") != "salvage":
                journal._record_cuts()
                _resolve.settle_automatically(journal)
            return journal
        except BaseException:
            try:
                log.close()
            except WaljError:
                pass  # the exception in flight says more
            raise

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
        """True while dispatch would refuse: blockers, or a log that can no longer write."""
        if self._log.poisoned or self._unknown_state is not None:
            return True
        with self._lock:
            return self._state.is_blocked(**self._live_view())

    def _blocked_now(self) -> tuple[Any, ...] | None:
        """With _write_lock held: the blockers if dispatch is blocked now, else None."""
        blockers = None
        with self._lock:
            if self._state.is_blocked(**self._live_view()):
                blockers = self._state.snapshot(**self._live_view()).blockers
        return blockers

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<walj.ToolJournal {self._log.path!r} {state}>"

    # --- writing --------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("journal is closed")
        if self._unknown_state is not None:
            raise PoisonedError(f"the journal's state could not be rebuilt after an interrupt "
                                f"({self._unknown_state!r}); reopen it")

    def _write(self, record: dict[str, Any], *, durable: bool,
               on_fed: Callable[[int], None] | None = None) -> int:
        """Append one record and feed it to the recovery state, the same function a reopen uses,
        so the live view always equals what a replay would rebuild. Anything that stops the
        two from happening together (an interrupt, a failed write) rebuilds the state from the
        files. `on_fed(seq)` runs under the state lock once the record is in the state."""
        with self._write_lock:
            refused_unwritten = self._log.poisoned  # then append writes nothing
            try:
                seq = self._log.append(record, durable=durable)
                with self._lock:
                    self._state.feed(seq, record)
                    if on_fed is not None:
                        on_fed(seq)
            except (SerializationError, RecordTooLargeError, ClosedError):
                raise  # refused before anything was written
            except BaseException:
                if not refused_unwritten:
                    self._resync()
                raise
            return seq

    def _resync(self) -> None:
        """With _write_lock held: rebuild the state from the log's files. A record the log may
        or may not have written is then in the state exactly when it is in the file."""
        if self._unknown_state is not None:
            return
        state = RecoveryState()
        try:
            for record in read(self._log.path):
                state.feed(record.seq, record.data)
        except Exception as exc:  # damaged meanwhile: fail closed, refuse work until reopened
            self._unknown_state = exc
            return
        except BaseException as exc:  # a second interrupt: fail closed, and let it go on
            self._unknown_state = exc
            raise
        with self._lock:
            self._state = state

    def _begin(self, started: dict[str, Any], execution_id: str) -> tuple[Any, ...] | None:
        """Durably write the intent and make the execution live, unless dispatch is blocked:
        then write tool_execution_blocked and return the blockers. One atomic step."""

        def live(seq: int) -> None:
            abandoned = self._abandoned.pop(execution_id, None)
            if abandoned is None:
                self._live.add(execution_id)
            else:  # its caller gave up while the intent was written: settle it at once
                self._settlements.append((execution_id, abandoned))

        with self._write_lock:
            try:
                with self._lock:
                    self._beginning.add(execution_id)
                self._check_open()
                self._write_settlements()
                blockers = self._blocked_now()
                if blockers is not None:
                    self._write(blocked_record(started, blockers), durable=False)
                    return blockers
                self._write(started, durable=True, on_fed=live)
                self._write_settlements()
                return None
            finally:
                with self._lock:
                    self._beginning.discard(execution_id)
                    self._abandoned.pop(execution_id, None)

    def _record_cuts(self) -> None:
        """On open: a durable log_cut record for each cut in quarantine/ not yet recorded, so a
        cut that no crash explains blocks from now on, here and after every reopen. A crash
        between a cut and its record leaves the manifest line, and the next open records it."""
        with self._write_lock:
            for record in _damage.unrecorded(self._log.quarantined(), self._state.cuts,
                                             self._log.cut_lines, _now()):
                self._write(record, durable=True)

    def _end(self, execution_id: str, record: dict[str, Any]) -> None:
        """Durably write an execution's terminal record; it leaves the live set with it."""
        with self._write_lock:
            self._write_settlements()
            if execution_id not in self._state.executions:
                return  # a queued copy (its caller was cancelled) landed first
            self._write(record, durable=True,
                        on_fed=lambda seq: self._live.discard(execution_id))

    def _settle_later(self, execution_id: str, record: dict[str, Any]) -> None:
        """Without waiting for any lock but the state's: the execution leaves the live set now
        (so it blocks here, as after a restart) and `record` is written before anything else.
        For an execution whose intent is still being written, once it lands."""
        with self._lock:
            if execution_id in self._live:
                self._live.discard(execution_id)
                self._settlements.append((execution_id, record))
            elif execution_id in self._state.executions:
                self._settlements.append((execution_id, record))
            elif execution_id in self._beginning:
                self._abandoned[execution_id] = record
            # else its intent was never written: there is nothing to settle

    def _write_settlements(self) -> None:
        """With _write_lock held: write the queued records of executions still open. Never a
        second terminal record: a resolution or terminal that came first wins."""
        while self._settlements:
            with self._lock:
                if not self._settlements:
                    return
                execution_id, record = self._settlements[0]
                still_open = execution_id in self._state.executions
            if still_open and self._unknown_state is None:
                self._write(record, durable=True)
            with self._lock:
                if self._settlements and self._settlements[0][0] == execution_id:
                    del self._settlements[0]

    def write_settlements(self) -> None:
        """Write queued settlements now (from a worker thread); errors stay queued or poison."""
        with self._write_lock:
            self._write_settlements()

    def _interrupted(self, execution_id: str, exc: BaseException) -> None:
        """An interrupt or failure between an intent and its terminal record: the execution
        blocks from now on, and tool_execution_ambiguous is written (best effort, never
        raises: the interrupt in flight matters more than this record)."""
        self._settle_later(execution_id, journal_ambiguous(execution_id, exc))
        try:
            self.write_settlements()
        except BaseException:  # noqa: B036 - a second interrupt or a dead log: the blocker stays
            pass

    # --- turns and LLM calls --------------------------------------------------------------------

    def turn(self) -> Turn:
        """`with journal.turn() as turn:` (or `async with`). One live turn at a time."""
        self._check_open()
        return Turn(self)

    def _start_turn(self, turn: Turn) -> int:
        """Make `turn` the live turn and write turn_started. The number and the record are
        taken under _write_lock, so a turn abandoned mid-write can never share its number."""
        with self._write_lock:
            self._check_open()
            with self._lock:
                if self._live_turn is not None:
                    raise TurnError(f"turn {self._live_turn.sequence} is still live; turns do "
                                    "not nest")
                if turn._abandoned:
                    raise TurnError("the turn was abandoned before it started")
                sequence = self._state.max_turn + 1
                turn.sequence = sequence
                self._live_turn = turn
            try:
                self._write({"k": rc.TURN_STARTED, "v": rc.CONTRACT_VERSION, "turn": sequence,
                             "t": _now()}, durable=False)
            except BaseException:
                self._release_turn(turn)
                raise
            with self._lock:
                if turn._abandoned and self._live_turn is turn:
                    self._live_turn = None  # its caller was cancelled while we wrote
            return sequence

    def _release_turn(self, turn: Turn) -> None:
        with self._lock:
            turn._abandoned = True
            if self._live_turn is turn:
                self._live_turn = None

    def _end_turn(self, turn: Turn, completed: bool) -> None:
        """Write turn_completed (if completed) and end the turn. Only while it is still the
        live turn: once a cancelled exit released it, a later turn may have started, which
        this completion would pair with instead."""
        try:
            with self._write_lock:
                if completed and self._live_turn is turn:
                    self._write({"k": rc.TURN_COMPLETED, "v": rc.CONTRACT_VERSION,
                                 "turn": turn.sequence, "t": _now()}, durable=False)
                self._release_turn(turn)
        except BaseException:
            self._release_turn(turn)
            raise

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
        dicts with exactly the keys name, call_id, arguments, output and error. A call whose
        arguments are invalid JSON, nested too deeply, or JSON text that cannot be stored gets
        an error result; other arguments that cannot be stored raise SerializationError
        before any call is dispatched."""
        self._check_open()
        normalised = normalise_calls(calls, lambda arguments: describe_arguments(
            arguments, self.arguments_chars, self.redactor, FAST_CANONICAL))
        live = self._live_turn
        if live is not None:
            return self._run_calls(live, normalised, registry)
        with self.turn() as turn:
            return self._run_calls(turn, normalised, registry)

    def _run_calls(self, turn: Turn, calls: list[Any], registry: Any) -> list[dict[str, Any]]:
        results: list[dict[str, Any]] = []
        for index, call in enumerate(calls):
            if call.problem is not None:
                results.append(error_result(call, index, call.problem))
                continue
            tool = lookup(registry, call.name) if registry is not None else (
                self._tools.get(call.name))
            if tool is None:
                results.append(error_result(call, index, f"unknown tool {call.name!r}"))
                continue
            result = turn._dispatch(call.name, call.arguments, call.call_id, tool, call.digest)
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
        A log_damage blocker (its id is the quarantine file's name) takes "reviewed" and a note.
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
        """Write what is queued, then close the log (syncing what was appended). Idempotent;
        raises PoisonedError (once) if the log was poisoned."""
        try:
            if not self._closed:
                with self._write_lock:
                    if self._unknown_state is None and not self._log.poisoned:
                        self._write_settlements()
        finally:
            self._closed = True
            self._log.close()  # idempotent: a second call finishes one an interrupt stopped

    def __enter__(self) -> ToolJournal:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            self.close()
        except WaljError:
            if exc is None:
                raise  # else the exception in flight (often the cause) goes on unmasked
