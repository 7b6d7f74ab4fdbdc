"""The approvals the recovery state holds: every approval request, its decision and the intent
that consumed it, as the records say, and the latest request of each call id. Standard library
only (the forensic tool rebuilds the state too). The dispatch rules that read it are in
_approvals."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from ..errors import CorruptionError
from . import records as r
from ._records import Approval

PENDING, APPROVED, DENIED, CONSUMED = "pending", "approved", "denied", "consumed"
DECISIONS = (APPROVED, DENIED)
# `apv-` and 128 random bits: an id that is anything else was not written by walj, and is
# refused rather than shown (it may be printed to a terminal).
APPROVAL_ID = re.compile(r"apv-[0-9a-f]{32}")


def as_item(entry: Approval) -> dict[str, Any]:
    """An approval as a checkpoint carries it (item `approval`)."""
    return {"item": "approval", **dataclasses.asdict(entry)}


def _bad(seq: int, record: Mapping[str, Any], field: str, what: str) -> CorruptionError:
    what_record = record.get("kind") or f"checkpoint item {r.show(record.get('item'))}"
    return CorruptionError(f"journal record {seq} ({what_record}) has {field} "
                           f"{r.show(record.get(field))}, not {what}", seq=seq,
                           kind="journal_record")


def _text(seq: int, record: Mapping[str, Any], field: str) -> str:
    value = record.get(field)
    if not isinstance(value, str):
        raise _bad(seq, record, field, "a string")
    return value


def _opt_text(record: Mapping[str, Any], field: str) -> str | None:
    value = record.get(field)
    return value if isinstance(value, str) else None


def _opt_time(seq: int, record: Mapping[str, Any], field: str) -> float | None:
    """None, or a plausible time (anything else is refused: an expiry must be readable)."""
    value = record.get(field)
    if value is None:
        return None
    found = r.time_of(value)
    if found is None:
        raise _bad(seq, record, field, "a time")
    return found


def approval_id_of(seq: int, record: Mapping[str, Any]) -> str:
    """The approval id a record names, which must be one walj writes."""
    value = record.get("approval_id")
    if not isinstance(value, str) or not APPROVAL_ID.fullmatch(value):
        raise _bad(seq, record, "approval_id", "an approval id")
    return value


class ApprovalBook:
    """Approvals by id, in request order, and each call id's latest request. Memory grows with
    the approvals asked for (people's decisions, so few); a checkpoint carries only those that
    can still matter: pending, approved and not consumed, and denied."""

    def __init__(self) -> None:
        self.entries: dict[str, Approval] = {}
        self.latest: dict[str, str] = {}  # call id -> the approval id of its latest request
        # Approved and not consumed: while there are any, every intent is decoded (it may name
        # one), rather than read from its bytes.
        self.unconsumed = 0

    def requested(self, seq: int, record: Mapping[str, Any]) -> None:
        """tool_approval_requested: a new pending request. An id seen before is ignored (a
        decided or consumed approval never becomes pending again)."""
        approval_id = approval_id_of(seq, record)
        entry = Approval(
            approval_id=approval_id, tool=_text(seq, record, "tool"),
            call_id=_text(seq, record, "call_id"),
            arguments_sha256=_text(seq, record, "arguments_sha256"),
            arguments_preview=_opt_text(record, "arguments_preview"),
            idempotency_key=_text(seq, record, "idempotency_key"),
            turn_sequence=r.turn_number(record.get("turn_sequence")),
            requested_by=_opt_text(record, "requested_by"),
            requested_at=r.time_of(record.get("at")), status=PENDING)
        if approval_id in self.entries:
            return
        self.entries[approval_id] = entry
        self.latest[entry.call_id] = approval_id

    def decided(self, seq: int, record: Mapping[str, Any]) -> None:
        """tool_approval_decided: a pending request approved or denied. A decision of anything
        not pending changes nothing (the first decision wins)."""
        approval_id = approval_id_of(seq, record)
        decision = record.get("decision")
        if decision not in DECISIONS:
            raise _bad(seq, record, "decision", "'approved' or 'denied'")
        actor = _text(seq, record, "actor")
        expires_at = _opt_time(seq, record, "expires_at")  # fail closed: no unreadable expiry
        entry = self.entries.get(approval_id)
        if entry is None or entry.status != PENDING:
            return
        self.entries[approval_id] = dataclasses.replace(
            entry, status=decision, actor=actor, note=_opt_text(record, "note"),
            decided_at=r.time_of(record.get("at")),
            expires_at=expires_at if decision == APPROVED else None)
        if decision == APPROVED:
            self.unconsumed += 1

    def consume(self, seq: int, record: Mapping[str, Any], execution_id: str) -> None:
        """An intent that names an approval consumes it, when the approval is approved and
        was given for this call id, tool and arguments; otherwise it consumes nothing."""
        approval_id = record.get("approval_id")
        entry = self.entries.get(approval_id) if isinstance(approval_id, str) else None
        if (entry is None or entry.status != APPROVED or record.get("call_id") != entry.call_id
                or record.get("tool") != entry.tool
                or record.get("arguments_sha256") != entry.arguments_sha256):
            return
        self.entries[entry.approval_id] = dataclasses.replace(
            entry, status=CONSUMED, execution_id=execution_id)
        self.unconsumed -= 1

    def load_item(self, seq: int, item: Mapping[str, Any]) -> None:
        """A checkpoint's `approval` item (as `as_item` wrote it), each field checked."""
        status = item.get("status")
        if status not in (PENDING, APPROVED, DENIED):
            raise _bad(seq, item, "status", "'pending', 'approved' or 'denied'")
        turn = item.get("turn_sequence")
        if turn is not None and r.turn_number(turn) is None:
            raise _bad(seq, item, "turn_sequence", "a turn number")
        self.load(Approval(
            approval_id=approval_id_of(seq, item), tool=_text(seq, item, "tool"),
            call_id=_text(seq, item, "call_id"),
            arguments_sha256=_text(seq, item, "arguments_sha256"),
            arguments_preview=_opt_text(item, "arguments_preview"),
            idempotency_key=_text(seq, item, "idempotency_key"), turn_sequence=turn,
            requested_by=_opt_text(item, "requested_by"),
            requested_at=_opt_time(seq, item, "requested_at"), status=status,
            actor=_opt_text(item, "actor"), note=_opt_text(item, "note"),
            decided_at=_opt_time(seq, item, "decided_at"),
            expires_at=_opt_time(seq, item, "expires_at"),
            execution_id=_opt_text(item, "execution_id")))

    def load(self, entry: Approval) -> None:
        """An approval a checkpoint carried (pending, approved or denied)."""
        if entry.approval_id in self.entries:
            return
        self.entries[entry.approval_id] = entry
        self.latest[entry.call_id] = entry.approval_id
        if entry.status == APPROVED:
            self.unconsumed += 1

    def latest_for(self, call_id: str) -> Approval | None:
        """The latest request of `call_id`, in whatever status it is now."""
        approval_id = self.latest.get(call_id)
        return None if approval_id is None else self.entries[approval_id]

    def with_status(self, *statuses: str) -> tuple[Approval, ...]:
        return tuple(entry for entry in self.entries.values() if entry.status in statuses)

    def carried(self) -> tuple[Approval, ...]:
        """What a checkpoint carries, in request order: every approval not consumed (a
        consumed one's call is settled, open, or free to ask again, all without it)."""
        return self.with_status(PENDING, APPROVED, DENIED)
