"""The journal's side of what the commands show: the CLI's one door to the journal's record and
state modules (every import of a private journal module is here), and the one rebuild of a
journal's state from a log's records."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..errors import WaljError
from ..journal import (
    DEFAULT_WAIT,
    Approval,
    Blocker,
    Recovery,
    approve_session,
    deny_session,
    known_ids,
    resolve_session,
    resolve_session_turn,
)
from ..journal import end_idle as end_idle_journal
from ..journal.records import decode_record, record_kind, subject_of, time_of, turn_number
from ..journal.state import MAX_KEEP_TURNS, CutLedger, JournalState, unrecorded
from ..journal.state import rebuild as rebuild_state
from ..log import read
from ..log.quarantine import cut_lines, read_manifest

__all__ = ["DEFAULT_WAIT", "MAX_KEEP_TURNS", "Approval", "Blocker", "Rebuild", "JournalState",
           "Recovery", "age", "approve_session", "blocker_json", "decode_record", "deny_session",
           "end_idle_journal", "in_flight", "kind_of", "known_ids", "lookup_approval",
           "note_unrecorded", "rebuild", "resolve_session", "resolve_session_turn", "subject_of",
           "time_of", "turn_number"]

Records = Iterator[tuple[int, bytes]]


def kind_of(raw: bytes) -> str:
    """The journal kind (`kind`) of a record's JSON bytes; '-' for a record without one."""
    kind = record_kind(raw)
    if kind is not None:
        return kind
    try:
        data = decode_record(raw)
    except ValueError:
        return "-"
    value = data.get("kind") if isinstance(data, dict) else None
    return value if isinstance(value, str) else "-"


@dataclass
class Rebuild:
    """A journal's state rebuilt from a log's records, and where the rebuild stopped."""

    state: JournalState = field(default_factory=JournalState)
    plain: bool = False  # the first record has no journal kind: a plain log, nothing fed
    seq: int = 0  # the last record taken (the refused one, if any); 0: the log holds none
    refusal: Exception | None = None  # what the journal refused (WaljError or ValueError)


def rebuild(records: Records, also: Callable[[int, Any], None] | None = None,
            state: JournalState | None = None) -> Rebuild:
    """Feed records in log order to the journal's own state (and each decoded record to
    `also`, when given), up to the end or the first record the journal refuses. Stops after
    the first record of a plain log; the records after a stop are left in `records`."""
    done = Rebuild() if state is None else Rebuild(state)
    first = next(records, None)
    if first is None:
        return done
    done.seq = first[0]
    if kind_of(first[1]) == "-":
        done.plain = True
        return done
    try:
        rebuild_state(_taken(done, itertools.chain((first,), records), also), into=done.state)
    except (WaljError, ValueError) as exc:
        done.refusal = exc
    return done


def _taken(done: Rebuild, records: Records,
           also: Callable[[int, Any], None] | None) -> Iterator[tuple[int, Any]]:
    """The records for the journal's one rebuild, each seq noted as it is taken; with `also`,
    each record decoded, and handed to `also` once the state has taken it."""
    for seq, raw in records:
        done.seq = seq
        if also is None:
            yield seq, raw  # the hot path: the state reads the bytes
            continue
        data = decode_record(raw)
        yield seq, data
        also(seq, data)


def note_unrecorded(path: str, ledger: CutLedger) -> None:
    """Count the cuts in quarantine/ that no journal has recorded yet as the next open will
    record them (a writer died between a cut and its record, or `walj repair` ran)."""
    records = unrecorded(read_manifest(path), ledger, lambda entry: cut_lines(path, entry),
                         time.time())
    for record in records:
        ledger.log_cut(0, record)


def age(t: float | None, now: float) -> float | None:
    return None if t is None else round(max(0.0, now - t), 3)


def in_flight(blocker: Blocker, writer: dict[str, Any] | None) -> bool:
    """Whether a `started` blocker's call may still be running rather than interrupted: only
    when the open that wrote its started record is the one that holds the log now (its writer
    id is the one in LOCK.owner, that process runs on this host, and the kernel's table of
    locks, where there is one, shows it holding LOCK). Never for another writer's record (a
    restarted process blocked by it holds the lock), nor for one written before records
    carried a writer id."""
    return (blocker.state == "started" and blocker.writer is not None and writer is not None
            and writer.get("writer_id") == blocker.writer and writer.get("running") is True
            and writer.get("holds_lock") is not False)


def blocker_json(b: Blocker, now: float | None = None,
                 writer: dict[str, Any] | None = None) -> dict[str, Any]:
    """A blocker as JSON: without `now`, only what names it (sweep's view); with it, all."""
    if now is None:
        return b.summary()
    return {**b.summary(full=True), "age_seconds": age(b.started_at, now),
            "in_flight": in_flight(b, writer)}


def lookup_approval(path: str, approval_id: str) -> Approval | None:
    """One approval of the session in `path`, whatever its status, from a lock-free replay of
    its log (beside a live writer); None when the log does not name it or cannot be read now
    (a compaction under the read)."""
    try:
        state = rebuild_state((record.seq, record.data) for record in read(path, 0))
    except (WaljError, OSError):
        return None
    return state.approvals.entries.get(approval_id)
