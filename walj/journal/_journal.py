"""ToolJournal, the public face of a journal: opening (one-pass rebuild, then automatic
resolution), its recovery view, turns, LLM calls, function calls, resolution and closing. Its
state and writes live in its Core."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import Any, ClassVar

from ..errors import WaljError
from . import _approvals, _compact, _requests, _resolve, _writes
from ._callindex import DEFAULT_REPLAY_WINDOW
from ._compact import Archiver, CompactReport
from ._core import Core
from ._fingerprint import (
    ARGUMENTS_PREVIEW_CHARS,
    DEFAULT_REDACT_KEYS,
    FAST_CANONICAL,
    OUTPUT_PREVIEW_CHARS,
    Redactor,
    describe_arguments,
)
from ._llm import LLMCall
from ._observe import ToolObserver, check_observers
from ._opening import open_log
from ._options import (
    DEFAULT_CHECKPOINT_EVERY,
    DEFAULT_MAX_RECORD_BYTES,
    DEFAULT_MAX_STORED_OUTPUT_BYTES,
    Options,
    output_limit,
)
from ._records import Approval, Recovery, Resolution
from ._sessions import check_session_id, directory_name
from ._tools import Tool, call_results, lookup, normalise_calls, tools_from
from ._turn import Turn


class ToolJournal:
    """Crash-safe tool execution over one walj log. Open with `ToolJournal.open`."""

    # How `compact(archive=...)` ships segments: walj.archive's, given by the package above
    # both layers (walj/__init__.py), since the journal never imports the archive.
    archiver: ClassVar[Archiver | None] = None

    def __init__(self, core: Core) -> None:
        self._core = core
        self._log = core.log

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
        store_outputs: bool = False,
        max_stored_output_bytes: int = DEFAULT_MAX_STORED_OUTPUT_BYTES,
        replay_window: int = DEFAULT_REPLAY_WINDOW,
        observers: Iterable[ToolObserver] = (),
        checkpoint_every: int | None = DEFAULT_CHECKPOINT_EVERY,
        release_on_request: bool | Callable[[], bool] = False,
        **log_options: Any,
    ) -> ToolJournal:
        """Open (creating if needed) the journal in directory `path` and rebuild its recovery
        state in one pass. Reconcile hooks and on_ambiguous policies of registered tools then
        settle what they can, durably. `log_options` go to walj.Log.open.

        `store_outputs`: an ok call's terminal record also stores its output value (JSON of at
        most `max_stored_output_bytes`, and always small enough for the log's record limit),
        so a re-dispatch of its call id can be answered from it (docs/RECOVERY.md, "Replay").
        `replay_window`: how many settled caller-given call ids the journal indexes.
        `observers` (walj.journal.ToolObserver) are told of every execution and resolution from
        then on, those automatic resolutions included (docs/RECOVERY.md, "Observers").
        `checkpoint_every`: before a turn starts, write a checkpoint once this many records
        were written since the last (None: only `checkpoint()` and `compact()` write them).
        The open replays from the last complete checkpoint (docs/RECOVERY.md, "Checkpoints").
        `release_on_request`: another process may ask this journal to close itself at its
        next idle moment (`walj.request_release`; docs/RECOVERY.md, "Live resolution"). A
        callable instead of True is asked at each idle moment, under the journal's locks, whether
        it may close now; False leaves the request for the next look."""
        registry = tools_from(tools)
        watching = check_observers(observers)
        for name, value in (("preview_chars", preview_chars),
                            ("output_preview_chars", output_preview_chars),
                            ("max_stored_output_bytes", max_stored_output_bytes),
                            ("replay_window", replay_window),
                            ("checkpoint_every", checkpoint_every or 1)):
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be a positive int, not {value!r}")
        stored_output_limit = None
        if store_outputs:
            stored_output_limit = output_limit(
                max_stored_output_bytes, output_preview_chars,
                log_options.get("max_record_bytes", DEFAULT_MAX_RECORD_BYTES))
        redactor = Redactor(redact_keys)
        log, state = open_log(path, replay_window, log_options)
        try:
            core = Core(log, state, Options(
                registry,
                arguments_chars=preview_chars,
                output_chars=output_preview_chars,
                redactor=redactor,
                store_arguments=bool(store_arguments),
                block_on_pending_llm_calls=bool(block_on_pending_llm_calls),
                stored_output_limit=stored_output_limit,
                read_options={"_fs": log_options["_fs"]} if log_options.get("_fs") else {},
                record_limit=log_options.get("max_record_bytes", DEFAULT_MAX_RECORD_BYTES),
                checkpoint_every=checkpoint_every,
                release_on_request=(release_on_request if callable(release_on_request)
                                    else bool(release_on_request)),
            ))
            core.observers = watching
            core.before_turn = _compact.AutoCheckpoint(core)
            if log_options.get("recovery") != "salvage":
                _resolve.record_cuts(core)
                _resolve.resolve_automatically(core)
                _requests.watch(core)  # what other processes asked while none held it
            return cls(core)
        except BaseException:
            with contextlib.suppress(WaljError):  # the exception in flight says more
                log.close()
            raise

    @classmethod
    def open_session(
        cls, root: str | os.PathLike[str], session_id: str, **options: Any
    ) -> ToolJournal:
        """Open the journal of one session (any non-empty text, such as a thread or
        conversation id) in its directory under `root` (`session_path`). The id is recorded
        in the journal (session_named) and shown as `recovery.session_id`. A journal there
        recorded under another id: ValueError, nothing written."""
        path = cls.session_path(root, session_id)
        journal = cls.open(path, **options)
        try:
            if options.get("recovery") != "salvage":
                journal._name_session(session_id)
            return journal
        except BaseException:
            with contextlib.suppress(WaljError):  # the exception in flight says more
                journal.close()
            raise

    def _name_session(self, session_id: str) -> None:
        """Record the session id once (session_named); a journal recorded under another id is
        refused with ValueError, so two ids can never share one journal unnoticed."""
        core = self._core
        with core.writing():
            core.check_open()
            recorded = core.state.session_id
            if recorded is None:
                core.write(_writes.session_named(session_id), durable=True)
            elif recorded != session_id:
                raise ValueError(f"the journal in {str(self._log.path)!r} belongs to session "
                                 f"{recorded!r}, not {session_id!r}")

    @staticmethod
    def session_path(root: str | os.PathLike[str], session_id: str) -> Path:
        """The directory of session `session_id` under `root`. An id of 1-128 characters of
        [A-Za-z0-9_.@+=-] not starting with '.' or '-' is its own name; any other is '%' and
        its percent-encoded UTF-8 (hash-suffixed when long), so distinct ids never share a
        directory and none escapes `root` (docs/RECOVERY.md, "Sessions"). Empty, non-str
        and lone-surrogate ids: ValueError."""
        return Path(root) / directory_name(check_session_id(session_id))

    # --- what it is -----------------------------------------------------------------------------

    @property
    def path(self) -> Path:
        return Path(self._log.path)

    @property
    def log_id(self) -> str:
        return self._core.log_id

    @property
    def closed(self) -> bool:
        return self._core.closed

    @property
    def tools(self) -> Mapping[str, Tool]:
        return MappingProxyType(dict(self._core.options.tools))

    @property
    def arguments_chars(self) -> int:
        return self._core.options.arguments_chars

    @property
    def output_chars(self) -> int:
        return self._core.options.output_chars

    @property
    def redactor(self) -> Redactor:
        return self._core.options.redactor

    @property
    def store_arguments(self) -> bool:
        return self._core.options.store_arguments

    @property
    def block_on_pending_llm_calls(self) -> bool:
        return self._core.options.block_on_pending_llm_calls

    @property
    def store_outputs(self) -> bool:
        return self._core.options.stored_output_limit is not None

    @property
    def max_stored_output_bytes(self) -> int | None:
        """The largest output (JSON bytes) a terminal record stores; None without store_outputs."""
        return self._core.options.stored_output_limit

    @property
    def replay_window(self) -> int:
        return self._core.state.calls.window

    @property
    def session_id(self) -> str | None:
        """The session id recorded in this journal (open_session), or None."""
        return self._core.state.session_id

    @property
    def recovery(self) -> Recovery:
        """The recovery view now: blockers from earlier runs (and from interrupts in this one);
        work in flight in this process is not counted."""
        return self._core.snapshot()

    def is_blocked(self) -> bool:
        """True while dispatch would refuse: blockers, or a log that can no longer write."""
        return self._core.is_blocked()

    def __repr__(self) -> str:
        state = "closed" if self._core.closed else "open"
        return f"<walj.ToolJournal {self._log.path!r} {state}>"

    # --- turns and LLM calls --------------------------------------------------------------------

    def turn(self) -> Turn:
        """`with journal.turn() as turn:` (or `async with`). One live turn at a time."""
        self._core.check_open()
        return Turn(self._core)

    # --- observers ------------------------------------------------------------------------------

    @property
    def observers(self) -> tuple[ToolObserver, ...]:
        return self._core.observers

    def add_observer(self, observer: ToolObserver) -> None:
        """Tell `observer` of every execution that starts and every resolution from now on.
        TypeError if it lacks a hook; ValueError if it was added already."""
        (checked,) = check_observers((observer,))

        def added(observers: tuple[ToolObserver, ...]) -> tuple[ToolObserver, ...]:
            if any(o is checked for o in observers):
                raise ValueError(f"observer {type(checked).__name__} was already added")
            return (*observers, checked)

        self._core.replace_observers(added)

    def remove_observer(self, observer: ToolObserver) -> None:
        """Stop telling `observer`; a dispatch under way still ends with it. ValueError if it
        was not added."""
        def removed(observers: tuple[ToolObserver, ...]) -> tuple[ToolObserver, ...]:
            if not any(o is observer for o in observers):
                raise ValueError(f"observer {type(observer).__name__} was not added")
            return tuple(o for o in observers if o is not observer)

        self._core.replace_observers(removed)

    def llm_call(self, *, model: str | None = None, request: Any = None) -> LLMCall:
        """`with journal.llm_call(model=..., request=...) as call:` then `call.finish(response)`.
        An interrupt leaves it pending; pending calls are reported on open."""
        self._core.check_not_ended()
        live = self._core.live_turn()
        return LLMCall(self._core, live.sequence if live is not None else None, model, request)

    def handle_function_calls(
        self, calls: Sequence[Any], registry: Any = None
    ) -> list[dict[str, Any]]:
        """Dispatch each call durably (in the live turn, or in a turn of its own) and return
        dicts with exactly the keys name, call_id, arguments, output and error. A call whose
        arguments are invalid JSON, nested too deeply, or JSON text that cannot be stored gets
        an error result; other arguments that cannot be stored raise SerializationError
        before any call is dispatched."""
        core = self._core
        core.check_open()
        normalised = normalise_calls(calls, lambda arguments: describe_arguments(
            arguments, core.options.arguments_chars, core.options.redactor, FAST_CANONICAL))
        def find(name: str) -> Tool | None:
            return lookup(registry, name) if registry is not None else core.options.tools.get(name)

        def run(turn: Turn) -> list[dict[str, Any]]:
            return call_results(normalised, find, lambda call, index, tool: turn._dispatch(
                call.name, call.arguments, call.call_id, tool, call.digest).as_dict())

        live = self._core.live_turn()
        if isinstance(live, Turn):
            return run(live)
        with self.turn() as turn:
            return run(turn)

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
        self._core.check_open()
        return _resolve.resolve(self._core, execution_id, outcome, note=note, actor=actor,
                                output=output)

    def resolve_turn(self, turn_sequence: int, *, note: str | None = None,
                     actor: str) -> Resolution:
        """Settle an interrupted turn durably, so it no longer blocks dispatch."""
        self._core.check_open()
        return _resolve.resolve_turn(self._core, turn_sequence, note=note, actor=actor)

    # --- approvals (docs/RECOVERY.md, "Approvals") ----------------------------------------------

    def approve(self, approval_id: str, *, actor: str, note: str | None = None,
                expires_at: float | None = None) -> Approval:
        """Approve a pending request durably: its call may run once, with exactly the requested
        tool and arguments, until `expires_at` (a unix time) if given. Refusals raise
        ApprovalError and write nothing."""
        self._core.check_open()
        return _approvals.decide(self._core, approval_id, "approved", actor=actor, note=note,
                                 expires_at=expires_at)

    def deny(self, approval_id: str, *, actor: str, note: str | None = None) -> Approval:
        """Deny a pending request durably: its call is never run."""
        self._core.check_open()
        return _approvals.decide(self._core, approval_id, "denied", actor=actor, note=note)

    def approval(self, approval_id: str) -> Approval:
        """The approval `approval_id` as it stands now; ApprovalError (unknown) if none."""
        self._core.take_requests()
        return _approvals.lookup(self._core, approval_id)

    # --- checkpoints and compaction -------------------------------------------------------------

    def checkpoint(self) -> int:
        """Write a checkpoint: every part of the recovery state an open needs from the past
        (open executions, incomplete turns, pending LLM calls, cuts, the resolutions that
        still matter, the turn counter and the replay index with its stored outputs), at the
        start of a new segment, durably. Returns its first record's seq. The next open
        replays from it; the segments before it need not be read again."""
        self._core.check_open()
        return _compact.checkpoint(self._core)

    def compact(self, *, keep_turns: int = 0, archive: str | os.PathLike[str] | None = None,
                storage_options: dict[str, Any] | None = None) -> CompactReport:
        """Write a checkpoint, then delete every sealed segment before it that holds none of
        the last `keep_turns` (at most 1,000) turns' records. With `archive` (an fsspec URL
        or a local path), each segment to delete is first shipped to `archive/<log_id>/` and
        its copy read back and verified; one that was not is kept. An unresolved blocker is
        never lost: the checkpoint carries it. Refused while a turn is live (TurnError)."""
        self._core.check_open()
        return _compact.compact(self._core, keep_turns, archive, storage_options,
                                type(self).archiver)

    # --- closing --------------------------------------------------------------------------------

    def close(self) -> None:
        """Write what is queued, then close the log (syncing what was appended). Idempotent;
        raises PoisonedError (once) if the log was poisoned."""
        self._core.close()

    def end(self) -> None:
        """End the session: durably record `session_ended`, then close the journal, sealing
        its last segment so that every segment is sealed (wholly archivable). Blockers stay:
        an ended session with unresolved blockers is still blocked, and may be reopened to
        resolve them. A reopened ended session refuses new turns and LLM calls
        (SessionEndedError). Refused while a turn is live (TurnError). Idempotent."""
        if self._core.closed and self._core.state.ended_seq is not None:
            self._core.close()  # finishes a close an interrupt stopped; else does nothing
            return
        _compact.end_session(self._core)

    @property
    def ended(self) -> bool:
        """True once the session was ended (now or by an earlier run)."""
        return self._core.state.ended_seq is not None

    def __enter__(self) -> ToolJournal:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            self.close()
        except WaljError:
            if exc is None:
                raise  # else the exception in flight (often the cause) goes on unmasked


def end_idle(journal: ToolJournal, idle_since: float) -> int | None:
    """Retention's end of an idle session, on a journal it opened as the writer: `session_ended`
    carrying the last activity's time, written only if nothing is newer than `idle_since`.
    Returns the log's last seq once ended; None, nothing written, when the session is not idle."""
    return _compact.end_idle(journal._core, idle_since)
