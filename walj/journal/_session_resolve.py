"""Resolving a session from outside the process that holds it: `walj.resolve_session` (and
`resolve_session_turn`, and the approval decisions `approve_session` and `deny_session`), which
the CLI and any other process use. docs/RECOVERY.md, "Live resolution".

A session no process holds is opened and resolved directly. One a live writer holds gets a
resolution request (a durable file the writer applies as its own durable record); the asker
then reads the log, taking no lock, for the record that answers its request id.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from ..errors import (
    ApprovalError,
    DroppedWhileReadingError,
    LockedError,
    ResolutionError,
    WaljError,
)
from ..log import holds_log, post_request, read
from . import records as rc
from ._approvals import check_decision
from ._damage import REVIEWED
from ._records import Approval, Recovery, Resolution
from ._requests import APPROVE, DENY, RELEASE, RESOLVE, RESOLVE_TURN, request_fields
from ._resolve import RESOLVE_OUTCOMES, check_signature
from ._writes import now
from .state import rebuild

APPLIED, REFUSED, QUEUED = "applied", "refused", "queued"
DEFAULT_WAIT = 10.0
# Refusals that depend on the journal's state, returned as REFUSED; the rest (a bad actor,
# outcome or note) are the caller's mistake and raised before anything is asked.
STATE_REASONS = ("unknown", "already_resolved", "already_terminal", "in_flight",
                 "unknown_kind", "malformed", "not_storable", "not_pending")
_POLL = 0.05  # seconds between reads of the log while waiting
_PROBE = 0.5  # seconds between tries to take the lock (a holder that went away)
_RESOLUTION_KINDS = {rc.RESOLVED: "execution", rc.LLM_RESOLVED: "llm_call",
                     rc.TURN_RESOLVED: "turn", rc.LOG_CUT_RESOLVED: "log_cut"}


@dataclass(frozen=True)
class SessionResolution:
    """What came of a resolution asked of a session. `status`: "applied" (`resolution` is the
    durable record's), "refused" (`reason` and `error` say why; nothing changed) or "queued"
    (the live writer did not answer within the wait: the request stays durable and is applied
    or refused once, by that writer or the next to open the session). `request_id`: the
    request's id, None when the session was resolved directly. `recovery`: the session's
    recovery view after it (work in flight in a live writer not counted); None when queued.
    `approval`: an applied approval decision's approval, as it stands after it."""

    status: str
    resolution: Resolution | None = None
    reason: str | None = None
    error: str | None = None
    request_id: str | None = None
    recovery: Recovery | None = None
    approval: Approval | None = None


def resolve_session(path: str | os.PathLike[str], execution_id: str, outcome: str, *,
                    note: str | None = None, actor: str,
                    wait: float = DEFAULT_WAIT) -> SessionResolution:
    """Resolve an execution, a pending LLM call or a log cut of the session in directory
    `path`, as ToolJournal.resolve does, whether or not another process holds it open. Waits up
    to `wait` seconds (0: not at all) for a live writer to answer. A bad actor, outcome or note
    raises ResolutionError before anything is asked; FileNotFoundError if `path` holds no log."""
    if outcome not in (*RESOLVE_OUTCOMES, REVIEWED):
        raise ResolutionError(f"outcome must be one of {', '.join(RESOLVE_OUTCOMES)} (or "
                              f"{REVIEWED!r} for a log cut), not {outcome!r}",
                              reason="bad_outcome")
    check_signature(actor, note)
    if (outcome in ("failed", REVIEWED)) and not (note and note.strip()):
        raise ResolutionError(f"a {outcome!r} resolution needs a note saying what was found",
                              reason="note_required")
    if not isinstance(execution_id, str) or not execution_id:
        raise ResolutionError(f"unknown execution id {execution_id!r}", reason="unknown")
    return _ask(path, RESOLVE, execution_id, outcome, note, actor, wait,
                lambda journal: journal.resolve(execution_id, outcome, note=note, actor=actor))


def resolve_session_turn(path: str | os.PathLike[str], turn_sequence: int, *,
                         note: str | None = None, actor: str,
                         wait: float = DEFAULT_WAIT) -> SessionResolution:
    """Resolve interrupted turn `turn_sequence` of the session in `path`, as
    ToolJournal.resolve_turn does; otherwise as resolve_session."""
    check_signature(actor, note)
    if type(turn_sequence) is not int:
        raise ResolutionError(f"unknown turn {turn_sequence!r}", reason="unknown")
    return _ask(path, RESOLVE_TURN, turn_sequence, None, note, actor, wait,
                lambda journal: journal.resolve_turn(turn_sequence, note=note, actor=actor))


def approve_session(path: str | os.PathLike[str], approval_id: str, *, actor: str,
                    note: str | None = None, expires_at: float | None = None,
                    wait: float = DEFAULT_WAIT) -> SessionResolution:
    """Approve pending request `approval_id` of the session in `path`, as ToolJournal.approve
    does, whether or not another process holds it open; otherwise as resolve_session. A bad
    actor, note or expiry raises ApprovalError before anything is asked."""
    expiry = check_decision(actor, note, expires_at)
    _check_approval_id(approval_id)
    return _ask(path, APPROVE, approval_id, None, note, actor, wait,
                lambda journal: journal.approve(approval_id, actor=actor, note=note,
                                                expires_at=expiry),
                expires_at=expiry)


def deny_session(path: str | os.PathLike[str], approval_id: str, *, actor: str,
                 note: str | None = None, wait: float = DEFAULT_WAIT) -> SessionResolution:
    """Deny pending request `approval_id` of the session in `path`; as approve_session."""
    check_decision(actor, note, None)
    _check_approval_id(approval_id)
    return _ask(path, DENY, approval_id, None, note, actor, wait,
                lambda journal: journal.deny(approval_id, actor=actor, note=note))


def _check_approval_id(approval_id: Any) -> None:
    if not isinstance(approval_id, str) or not approval_id:
        raise ApprovalError(f"unknown approval id {rc.show(approval_id)}", reason="unknown")


def request_release(path: str | os.PathLike[str], *, actor: str, note: str | None = None,
                    wait: float = DEFAULT_WAIT) -> SessionResolution:
    """Ask the process that holds the session in `path` to close its journal at its next idle
    moment (it must have opened it with release_on_request=True), so that this process can
    open it. "applied" once the lock is free (released, or no process held it); "refused"
    (`reason` release_not_enabled, ...) or "queued" (still busy, or not answering) otherwise.
    The lock is not taken: open the journal next (another opener may still come first)."""
    check_signature(actor, note)
    seconds = _wait_seconds(wait)
    if not holds_log(path):
        raise FileNotFoundError(f"{os.fspath(path)!r} holds no walj log")
    if _free(path):
        return SessionResolution(APPLIED)
    next_seq = _end(path)
    request_id = post_request(path, request_fields(RELEASE, None, None, note, actor, now()))
    deadline = time.monotonic() + seconds

    def answered(found: tuple[int, dict[str, Any]]) -> SessionResolution:
        if found[1].get("kind") == rc.REQUEST_REFUSED:
            return _outcome_of(path, request_id, *found)
        # Released; the holder closes the log right after the record.
        while not _free(path) and time.monotonic() < deadline:
            time.sleep(_POLL)
        return SessionResolution(APPLIED, request_id=request_id)

    def gone() -> SessionResolution | None:  # its opener refused the request as not_held
        return SessionResolution(APPLIED, request_id=request_id) if _free(path) else None

    return _wait_for_answer(path, request_id, next_seq, deadline, answered, gone)


def _free(path: str | os.PathLike[str]) -> bool:
    """Whether no process holds the session: it was opened (answering what was pending), and
    closed again."""
    try:
        journal = _open(path)
    except WaljError:
        return False
    if journal is None:
        return False
    journal.close()
    return True


def _ask(path: str | os.PathLike[str], kind: str, target: Any, outcome: str | None,
         note: str | None, actor: str, wait: float,
         directly: Callable[[Any], Resolution | Approval], **more: Any) -> SessionResolution:
    seconds = _wait_seconds(wait)
    if not holds_log(path):
        raise FileNotFoundError(f"{os.fspath(path)!r} holds no walj log")
    done = _directly(path, directly)
    if done is not None:
        return done
    next_seq = _end(path)
    request_id = post_request(path, request_fields(kind, target, outcome, note, actor, now(),
                                                   **more))

    def gone() -> None:  # if the holder went away, opening applies pending requests
        _open_and_close(path)

    return _wait_for_answer(path, request_id, next_seq, time.monotonic() + seconds,
                            lambda found: _outcome_of(path, request_id, *found), gone)


def _wait_for_answer(path: str | os.PathLike[str], request_id: str, next_seq: int,
                     deadline: float,
                     answered: Callable[[tuple[int, dict[str, Any]]], SessionResolution],
                     gone: Callable[[], SessionResolution | None]) -> SessionResolution:
    """Follow the log for the record that answers `request_id` (then `answered`) until
    `deadline` (then queued), looking now and then whether the holder went away (`gone`,
    whose outcome, if any, ends the wait)."""
    probe_at = time.monotonic() + _PROBE
    while True:
        found, next_seq = _answer_of(path, request_id, next_seq)
        if found is not None:
            return answered(found)
        if time.monotonic() >= deadline:
            return SessionResolution(QUEUED, request_id=request_id)
        if time.monotonic() >= probe_at:
            probe_at = time.monotonic() + _PROBE
            done = gone()
            if done is not None:
                return done
            continue
        time.sleep(min(_POLL, max(0.0, deadline - time.monotonic())))


def _wait_seconds(wait: float) -> float:
    if type(wait) not in (int, float) or not math.isfinite(wait) or wait < 0:
        raise ValueError(f"wait must be a number of seconds, 0 or more, not {wait!r}")
    return float(wait)


def _open(path: str | os.PathLike[str]) -> Any:
    """The session's journal opened without waiting for its lock; None when a writer holds it."""
    from ._journal import ToolJournal  # _journal imports the pick-up this module shares

    try:
        return ToolJournal.open(path, lock_timeout=0)
    except LockedError:
        return None


def _directly(path: str | os.PathLike[str],
              resolve: Callable[[Any], Resolution | Approval]) -> SessionResolution | None:
    journal = _open(path)
    if journal is None:
        return None
    with journal:
        try:
            made = resolve(journal)
        except (ResolutionError, ApprovalError) as exc:
            if exc.reason not in STATE_REASONS:
                raise
            return SessionResolution(REFUSED, reason=exc.reason, error=str(exc),
                                     recovery=journal.recovery)
        if isinstance(made, Approval):
            return SessionResolution(APPLIED, recovery=journal.recovery, approval=made)
        return SessionResolution(APPLIED, made, recovery=journal.recovery)


def _open_and_close(path: str | os.PathLike[str]) -> None:
    try:
        journal = _open(path)
        if journal is not None:
            journal.close()
    except WaljError:
        pass  # the request stays; whoever opens the session next applies or refuses it


def _records(path: str | os.PathLike[str], start: int) -> Iterator[tuple[int, Any]]:
    for record in read(path, start):
        yield record.seq, record.data


def _end(path: str | os.PathLike[str]) -> int:
    """The seq after the log's last record, read without a lock."""
    last = 0
    for seq, _ in _records(path, 0):
        last = seq
    return last + 1


def _answer_of(path: str | os.PathLike[str], request_id: str,
               start: int) -> tuple[tuple[int, dict[str, Any]] | None, int]:
    """The record (seq, data) that answers `request_id` among those from `start`, and where the
    next look starts. A compaction under the read: the next look tries again."""
    try:
        for seq, data in _records(path, start):
            start = seq + 1
            if (isinstance(data, dict) and data.get("request") == request_id
                    and data.get("kind") in rc.REQUEST_ANSWERS):
                return (seq, data), start
    except (DroppedWhileReadingError, FileNotFoundError):
        pass
    return None, start


def _outcome_of(path: str | os.PathLike[str], request_id: str, seq: int,
                record: dict[str, Any]) -> SessionResolution:
    recovery, resolutions, approvals = _rebuilt(path)
    if record.get("kind") == rc.REQUEST_REFUSED:
        reason, error = record.get("reason"), record.get("error")
        return SessionResolution(REFUSED, reason=reason if isinstance(reason, str) else None,
                                 error=error if isinstance(error, str) else None,
                                 request_id=request_id, recovery=recovery)
    if record.get("kind") == rc.APPROVAL_DECIDED:
        return SessionResolution(APPLIED, request_id=request_id, recovery=recovery,
                                 approval=approvals.get(record.get("approval_id")))
    resolution = next((r for r in resolutions if r.seq == seq), None) or _from_record(seq, record)
    return SessionResolution(APPLIED, resolution, request_id=request_id, recovery=recovery)


def _rebuilt(path: str | os.PathLike[str]) -> tuple[Recovery | None, Iterable[Resolution],
                                                    dict[Any, Approval]]:
    """The session's recovery view, resolutions and approvals by id from a lock-free replay;
    (None, (), {}) when it cannot be rebuilt now (a compaction under the read)."""
    try:
        state = rebuild(_records(path, 0))
        return state.snapshot(), state.resolutions, state.approvals.entries
    except (WaljError, OSError):
        return None, (), {}


def _from_record(seq: int, record: dict[str, Any]) -> Resolution:
    """The resolution a record made, read from the record alone (its tool left out)."""
    subject = rc.subject_of(record)
    turn = record.get("turn_sequence")
    note, at = record.get("note"), record.get("at")
    return Resolution(_RESOLUTION_KINDS.get(str(record.get("kind")), "execution"),
                      subject if isinstance(subject, str) else None,
                      turn if type(turn) is int else None, None, str(record.get("outcome")),
                      str(record.get("actor")), note if isinstance(note, str) else None,
                      at if type(at) in (int, float) else None, seq)


def known_ids(path: str | os.PathLike[str]) -> set[str]:
    """Every execution, LLM call, cut and approval id the log names (open, finished or
    resolved, and those a checkpoint carries), read without a lock: what an id prefix is
    expanded against."""
    found: set[str] = set()
    for _, data in _records(path, 0):
        if not isinstance(data, dict):
            continue
        subject = rc.subject_of(data)
        if isinstance(subject, str):
            found.add(subject)
        if data.get("kind") == rc.APPROVAL_REQUESTED and isinstance(data.get("approval_id"),
                                                                    str):
            found.add(data["approval_id"])
        items = data.get("items") if data.get("kind") == rc.CHECKPOINT else None
        for item in items if isinstance(items, list) else ():
            if isinstance(item, dict):
                for key in ("execution_id", "llm_call_id", "quarantine_file", "approval_id"):
                    if isinstance(item.get(key), str):
                        found.add(item[key])
    return found
