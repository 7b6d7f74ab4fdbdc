"""The journal's record schema: contract version, record kinds, blocker states, and the
types of the recovery view. Standard library only (the forensic tool)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Bump when a record kind is added or a field changes meaning: an older walj must refuse a log
# it cannot fully understand rather than miss a blocker. Version 2 named every field in full
# (docs/RECOVERY.md, "Records"); version 1's short keys (`k`, `v`, `o`, ...) are refused.
# Version 3 added replay (tool_execution_replayed, tool_execution_refused, stored outputs,
# call_id_generated), session_named and session_ended; a version-2 log reads as before.
# Version 4 added checkpoint; a version-2 or -3 log reads as before.
# Version 5 added requests from other processes: the `request` field of a resolution record,
# resolution_refused, journal_released, and a checkpoint's applied_requests item; older logs
# read as before.
CONTRACT_VERSION = 5
SUPPORTED_VERSIONS = frozenset({2, 3, 4, CONTRACT_VERSION})

TURN_STARTED = "turn_started"
TURN_COMPLETED = "turn_completed"
TURN_RESOLVED = "turn_resolved"
STARTED = "tool_execution_started"
FINISHED = "tool_execution_finished"
AMBIGUOUS = "tool_execution_ambiguous"
BLOCKED = "tool_execution_blocked"
RESOLVED = "tool_execution_resolved"
RECONCILE_FAILED = "tool_execution_reconcile_failed"
LLM_STARTED = "llm_call_started"
LLM_FINISHED = "llm_call_finished"
LLM_RESOLVED = "llm_call_resolved"
LOG_CUT = "log_cut"
LOG_CUT_RESOLVED = "log_cut_resolved"
REPLAYED = "tool_execution_replayed"
REFUSED = "tool_execution_refused"
SESSION_NAMED = "session_named"
CHECKPOINT = "checkpoint"
REQUEST_REFUSED = "resolution_refused"
RELEASED = "journal_released"
# Records that carry the id of the request they answer (field `request`).
REQUEST_ANSWERS = frozenset({RESOLVED, LLM_RESOLVED, TURN_RESOLVED, LOG_CUT_RESOLVED,
                             REQUEST_REFUSED, RELEASED})

# Resolutions that settle a call (replay answers from them); the others (not_performed,
# rerun) say it did not take effect, so it may run afresh.
SETTLED_RESOLUTIONS = frozenset({"succeeded", "failed"})

# Why a terminal record holds no `output` value (field `output_not_stored`).
OUTPUT_TOO_LARGE = "too_large"
OUTPUT_NOT_STORABLE = "not_storable"
OUTPUT_DROPPED = "dropped_at_checkpoint"  # beyond what a checkpoint carries

# Why a dispatch was refused (field `refused_reason` of tool_execution_refused).
REFUSED_ARGUMENTS_DIFFER = "arguments_differ"
REFUSED_OUTPUT_NOT_STORED = "output_not_stored"
REFUSED_OUTSIDE_WINDOW = "outside_replay_window"
SESSION_ENDED = "session_ended"
# Every record the journal writes once the log has synced something since it was opened: the
# seq through which the log's records were synced when this record was written. Readers that
# predate it ignore it; recovery uses it to tell damage to synced records from a crash.
SYNCED_THROUGH = "synced_through"

# The field that names what a record is about, by kind (turn records name a turn_sequence).
SUBJECT = {
    STARTED: "execution_id", FINISHED: "execution_id", AMBIGUOUS: "execution_id",
    BLOCKED: "execution_id", RESOLVED: "execution_id", RECONCILE_FAILED: "execution_id",
    LLM_STARTED: "llm_call_id", LLM_FINISHED: "llm_call_id", LLM_RESOLVED: "llm_call_id",
    LOG_CUT: "quarantine_file", LOG_CUT_RESOLVED: "quarantine_file",
    REPLAYED: "execution_id", REFUSED: "execution_id",
}


def subject_of(record: Any) -> Any:
    """The id a decoded record is about (an execution, an LLM call, a quarantine file), or None.
    Untrusted: whatever the record holds there, not checked."""
    if not isinstance(record, dict):
        return None
    kind = record.get("kind")
    field = SUBJECT.get(kind) if isinstance(kind, str) else None  # a list or dict is unhashable
    return record.get(field) if field is not None else None


_KIND_PREFIX = b'{"kind":"'


def record_kind(data: bytes) -> str | None:
    """The kind a journal record's JSON bytes start with (the journal writes `kind` first), read
    without decoding; None when the bytes do not start that way."""
    if not data.startswith(_KIND_PREFIX):
        return None
    end = data.find(b'"', len(_KIND_PREFIX))
    return data[len(_KIND_PREFIX):end].decode("utf-8", "replace") if end > 0 else None


# Blocker states.
STATE_STARTED = "started"
STATE_AMBIGUOUS = "ambiguous"
STATE_INTERRUPTED_TURN = "interrupted_turn"
STATE_PENDING_LLM_CALL = "pending_llm_call"
STATE_LOG_DAMAGE = "log_damage"


@dataclass(frozen=True)
class Blocker:
    """One reason dispatch is blocked. Turn and LLM-call blockers have no tool fields."""

    execution_id: str | None
    tool: str | None
    call_id: str | None
    state: str
    turn_sequence: int | None
    arguments_sha256: str | None
    arguments_preview: str | None
    idempotency_key: str | None = None
    started_at: float | None = None
    seq: int = 0
    error_type: str | None = None
    reconcile_error: str | None = None
    arguments: Any = None
    quarantine_file: str | None = None  # a log_damage blocker: the cut bytes, in quarantine/
    writer: str | None = None  # the writer id of the log handle that wrote the started record


@dataclass(frozen=True)
class IncompleteTurn:
    """A turn_started with no turn_completed paired to it, and no resolution."""

    turn_sequence: int
    started_at: float | None
    seq: int
    tool_bearing: bool


@dataclass(frozen=True)
class PendingLLMCall:
    llm_call_id: str
    model: str | None
    turn_sequence: int | None
    started_at: float | None
    seq: int
    request_sha256: str | None
    request_preview: str | None


@dataclass(frozen=True)
class Cut:
    """Bytes that recovery (or `walj repair`) cut from the log into quarantine/, as the journal
    recorded them. `explained`: a crash accounts for them, because none of the records among
    them can have been acknowledged; otherwise they block dispatch (state log_damage), for the
    reason given, until a person resolves them."""

    quarantine_file: str
    segment: str
    offset: int
    length: int
    kind: str
    records: int
    explained: bool
    reason: str | None
    seq: int
    resolved: bool = False


@dataclass(frozen=True)
class Resolution:
    """A durable settlement by a person, a policy or a reconcile hook."""

    kind: str  # "execution", "turn", "llm_call" or "log_cut"
    execution_id: str | None
    turn_sequence: int | None
    tool: str | None
    outcome: str
    actor: str
    note: str | None
    at: float | None
    seq: int
    output: Any = None


@dataclass(frozen=True)
class Recovery:
    """What an open journal found: dispatch is blocked while `blockers` is not empty."""

    blocked: bool
    blockers: tuple[Blocker, ...]
    incomplete_turns: tuple[IncompleteTurn, ...]
    pending_llm_calls: tuple[PendingLLMCall, ...]
    resolved: tuple[Resolution, ...]
    records: int
    last_seq: int
    cuts: tuple[Cut, ...] = ()
    session_id: str | None = None  # as given to open_session (from its session_named record)
    ended: bool = False  # a session_ended record was written (ToolJournal.end)
