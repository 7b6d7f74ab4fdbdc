"""The types of the recovery view: blockers, incomplete turns, pending LLM calls, cuts and
resolutions, as the rebuilt state reports them. Standard library only (the forensic tool).
The record schema is walj.journal.records."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


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

    def summary(self, *, full: bool = False) -> dict[str, Any]:
        """JSON-ready: what blocks (execution_id, tool, call_id, state, turn_sequence), as a
        blocked dispatch reports it; `full` adds every recorded field (the writer as
        `writer_id`), as `walj inspect --json` shows a blocker."""
        if not full:
            return {"execution_id": self.execution_id, "tool": self.tool,
                    "call_id": self.call_id, "state": self.state,
                    "turn_sequence": self.turn_sequence}
        fields = asdict(self)
        fields["writer_id"] = fields.pop("writer")
        return fields


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
    """A durable resolution by a person, a policy or a reconcile hook."""

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
class Approval:
    """A person's approval of one tool call, bound to its session, call id, tool and
    arguments' fingerprint (docs/RECOVERY.md, "Approvals"). `status`: "pending", "approved",
    "denied" or "consumed" (an intent named it). An approved one whose `expires_at` has passed
    is expired: it never lets the call run."""

    approval_id: str
    tool: str
    call_id: str
    arguments_sha256: str
    arguments_preview: str | None
    idempotency_key: str
    turn_sequence: int | None
    requested_by: str | None
    requested_at: float | None
    status: str
    actor: str | None = None
    note: str | None = None
    decided_at: float | None = None
    expires_at: float | None = None
    execution_id: str | None = None

    def expired(self, now: float) -> bool:
        """Approved, with an expiry that has passed by `now`."""
        return (self.status == "approved" and self.expires_at is not None
                and self.expires_at <= now)


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
    approvals: tuple[Approval, ...] = ()  # approval requests still pending, oldest first
    approved: tuple[Approval, ...] = ()  # approved and not yet consumed (may be expired)
