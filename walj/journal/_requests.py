"""Applying resolution requests: a live journal answers each request another process left in
its log directory with one durable record (the resolution or approval decision, or
resolution_refused), and only then has the request file removed. docs/RECOVERY.md, "Live
resolution".

Exactly once: the answer carries the request id, the recovery state remembers answered ids (and
checkpoints carry them), so a request file found again after a crash between its answer and
its removal is only removed. A request is checked exactly as ToolJournal.resolve checks its
arguments; what fails is refused durably, and changes nothing else. No handler ever runs here.
"""

from __future__ import annotations

import functools
import math
import os
import threading
import weakref
from typing import Any

from ..errors import (
    ApprovalError,
    RecordTooLargeError,
    ResolutionError,
    SerializationError,
    WaljError,
)
from ..log import (
    PICK_UP_LIMIT,
    MalformedRequestError,
    RequestWatch,
    load_request,
    pending_requests,
    remove_request,
    remove_stale_requests,
)
from . import _approvals, _resolve, _writes
from ._core import Core

RESOLVE = "resolve"  # an execution, a pending LLM call, or a log cut (ToolJournal.resolve)
RESOLVE_TURN = "resolve_turn"  # an interrupted turn (ToolJournal.resolve_turn)
RELEASE = "release"  # close the journal when idle (ToolJournal.open(release_on_request=True))
APPROVE, DENY = "approve", "deny"  # decide an approval request (ToolJournal.approve, .deny)
REQUEST_KINDS = (RESOLVE, RESOLVE_TURN, RELEASE, APPROVE, DENY)
# When a pick-up runs: opening the journal, before an answer, or from the idle watcher.
ON_OPEN, BEFORE_ANSWER, WHILE_IDLE = "open", "answer", "idle"
# The longest text of a hostile field a refusal record repeats.
_SHOWN_CHARS = 200
# How often the process-wide watcher looks at each open journal, in seconds.
WATCH_INTERVAL = 1.0


def request_fields(kind: str, target: Any, outcome: str | None, note: str | None,
                   actor: str, at: float, **more: Any) -> dict[str, Any]:
    """What a request file holds besides its id (docs/FORMAT.md, "Request files"); `more`:
    what a kind adds (an approval's `expires_at`)."""
    return {"kind": kind, "target": target, "outcome": outcome, "note": note, "actor": actor,
            "at": at, **more}


class Picker:
    """One journal's request pick-up: the cheap test, and the apply under the journal's
    locks. A pick-up that finds the locks taken (from the watcher thread) tries again at the
    next check; one made before an answer (`blocking`) waits for them."""

    def __init__(self, core: Core) -> None:
        self.core = core
        self.path = os.fspath(core.log.path)
        self.watch = RequestWatch(self.path)
        self._busy = threading.local()

    def __call__(self) -> None:
        self.pick_up(blocking=True)

    def pick_up(self, *, blocking: bool, force: bool = False) -> int:
        """Apply what requests are pending; the number answered. Errors that stop an apply (a
        log that can no longer write, a `requests/` that cannot be listed) leave the request
        for a later pick-up, and are raised to no one: the journal's own answers (blocked,
        poisoned) say the rest. After an interrupt or an error the next check looks again."""
        core = self.core
        if getattr(self._busy, "on", False) or core.closed:
            return 0  # an observer of a resolution made here asked again: it is being made
        finished = False
        try:
            moment = ON_OPEN if force else BEFORE_ANSWER if blocking else WHILE_IDLE
            answered = self._take(blocking, moment) if force or self.watch.due() else 0
            finished = True
            return answered
        except (WaljError, OSError):
            return 0
        finally:
            if not finished:
                self.watch.retry()

    def _take(self, blocking: bool, moment: str) -> int:
        core = self.core
        ids = pending_requests(self.path)
        if not ids:
            return 0
        if len(ids) == PICK_UP_LIMIT:
            self.watch.retry()  # more may wait
        resolving, writing = core.resolving(), core.writing()
        if not resolving.acquire(blocking=blocking):
            self.watch.retry()
            return 0
        try:
            self._busy.on = True
            if not writing.acquire(blocking=blocking):
                self.watch.retry()
                return 0
            try:
                answered = 0
                for request_id in ids:
                    if core.closed or core.unknown_state is not None or core.log.poisoned:
                        break
                    answered += self._apply(request_id, moment)
                return answered
            finally:
                writing.release()
        finally:
            self._busy.on = False
            resolving.release()

    def _apply(self, request_id: str, moment: str) -> int:
        """With both locks held: answer one request durably, then remove its file."""
        core = self.core
        if request_id in core.state.requests:
            remove_request(self.path, request_id)  # answered before a crash; only its file stayed
            return 0
        try:
            fields = load_request(self.path, request_id)
        except MalformedRequestError as exc:
            self._refuse(request_id, {}, exc.reason, str(exc))
            remove_request(self.path, request_id)
            return 1
        if fields is None:
            return 0  # gone meanwhile
        try:
            if fields.get("kind") == RELEASE:
                return self._release(request_id, fields, moment)
            _answer(core, request_id, fields)
        except (ResolutionError, ApprovalError) as exc:
            self._refuse(request_id, fields, exc.reason or "refused", str(exc))
        except (SerializationError, RecordTooLargeError) as exc:  # refused before writing
            self._refuse(request_id, fields, "not_storable", str(exc))
        remove_request(self.path, request_id)
        return 1

    def _release(self, request_id: str, fields: dict[str, Any], moment: str) -> int:
        """A release: refused (ResolutionError) unless this journal takes releases and another
        process held it; applied only at an idle moment (else left for the watcher): the
        record, the file removed, then the journal closed."""
        core = self.core
        actor, note = fields.get("actor"), fields.get("note")
        _resolve.check_signature(actor, note)
        if moment == ON_OPEN:
            raise ResolutionError("no process held the journal: it was free when it was "
                                  "opened", reason="not_held")
        if not core.options.release_on_request:
            raise ResolutionError("the journal was not opened with release_on_request=True",
                                  reason="release_not_enabled")
        allowed = core.options.release_on_request
        if moment != WHILE_IDLE or not core.idle() or (callable(allowed) and not allowed()):
            self.watch.retry()  # the watcher looks again in a second
            return 0
        core.write(_writes.released(request_id, str(actor), note), durable=True)
        remove_request(self.path, request_id)
        core.close()
        return 1

    def _refuse(self, request_id: str, fields: dict[str, Any], reason: str, error: str) -> None:
        record = _writes.request_refused(
            request_id, _shown(fields.get("kind")), _shown(fields.get("target")),
            _shown(fields.get("actor")), reason, _shown(error) or "refused")
        self.core.write(record, durable=True)


def _answer(core: Core, request_id: str, fields: dict[str, Any]) -> None:
    """Make the resolution a request asks for, as ToolJournal.resolve would (same checks),
    its record carrying the request id and time. ResolutionError when it is refused."""
    kind, at = fields.get("kind"), fields.get("at")
    if not isinstance(at, (int, float)) or isinstance(at, bool) or not math.isfinite(at) or at < 0:
        raise ResolutionError(f"the request's time {_shown(at)!r} is not a time",
                              reason="malformed")
    request = (request_id, round(float(at), 3))
    note, actor, target = fields.get("note"), fields.get("actor"), fields.get("target")
    if kind == RESOLVE:
        _resolve.resolve(core, target, fields.get("outcome"), note=note, actor=actor,
                         output=None, request=request)
    elif kind == RESOLVE_TURN:
        _resolve.resolve_turn(core, target, note=note, actor=actor, request=request)
    elif kind in (APPROVE, DENY):
        _approvals.decide(core, target, "approved" if kind == APPROVE else "denied",
                          actor=actor, note=note, request=request,
                          expires_at=fields.get("expires_at") if kind == APPROVE else None)
    else:
        raise ResolutionError(f"request kind {_shown(kind)!r} is not one this walj applies "
                              f"({', '.join(REQUEST_KINDS)})", reason="unknown_kind")


def _shown(value: Any) -> Any:
    """A hostile field as a refusal record repeats it: a string (cut short, always valid
    UTF-8) or an int as given, anything else as None."""
    if type(value) is int:
        return value
    if not isinstance(value, str):
        return None
    text = value[:_SHOWN_CHARS]
    return text.encode("utf-8", "replace").decode("utf-8")


# --- the watcher --------------------------------------------------------------------------------


class _Watcher:
    """One daemon thread for the whole process (a server may hold thousands of journals): about
    once a second, each open journal's cheap test, and a pick-up that never waits for a busy
    journal's locks."""

    def __init__(self) -> None:
        self.pickers: weakref.WeakSet[Picker] = weakref.WeakSet()
        self.guard = threading.Lock()
        self.thread: threading.Thread | None = None
        self.wake = threading.Event()

    def add(self, picker: Picker) -> None:
        with self.guard:
            self.pickers.add(picker)
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, name="walj-requests",
                                               daemon=True)
                self.thread.start()

    def _run(self) -> None:
        while True:
            self.wake.wait(WATCH_INTERVAL)
            with self.guard:
                pickers = list(self.pickers)
            for picker in pickers:
                if picker.core.closed:
                    with self.guard:
                        self.pickers.discard(picker)
                    continue
                try:
                    picker.pick_up(blocking=False)
                except Exception:  # noqa: S112 - one journal's trouble must not stop the others
                    continue
            del pickers

    def discard(self, picker: Picker) -> None:
        """A closed journal's picker leaves the set now, not when it is collected."""
        with self.guard:
            self.pickers.discard(picker)

    def forget(self) -> None:
        """In a forked child: the parent's thread does not run here."""
        self.guard = threading.Lock()
        self.thread = None
        self.pickers = weakref.WeakSet()


_watcher = _Watcher()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_watcher.forget)


def watch(core: Core) -> None:
    """Make `core` take resolution requests: before each answer that depends on blockers, and
    from the process-wide watcher while idle. Applies what is pending now (an open)."""
    picker = Picker(core)
    core.pick_up = picker
    remove_stale_requests(picker.path)
    picker.pick_up(blocking=True, force=True)
    _watcher.add(picker)
    core.unwatch = functools.partial(_watcher.discard, picker)
