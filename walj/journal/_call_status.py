"""What a journal knows about one caller-given call id (ToolJournal.call_status): not run,
settled with or without its stored output, in doubt, resolved, or not found, and the bounds of
that knowledge (docs/RECOVERY.md, "Replay"; docs/INTEGRATIONS.md, "Transcripts repaired from
the journal")."""

from __future__ import annotations

import time
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from ..errors import CorruptionError
from ..log import Record, read
from . import records as rc
from ._callindex import Forgotten
from ._compact import settling_records
from ._records import Approval, Resolution

if TYPE_CHECKING:
    from ._core import Core
    from .state import JournalState

NOT_RUN = "not_run"
SETTLED = "settled"
IN_DOUBT = "in_doubt"
RESOLVED = "resolved"
NOT_FOUND = "not_found"
AWAITING_APPROVAL = "awaiting_approval"
APPROVED = "approved"
DENIED = "denied"
APPROVAL_EXPIRED = "approval_expired"
CALL_STATUSES = (NOT_RUN, SETTLED, IN_DOUBT, RESOLVED, NOT_FOUND, AWAITING_APPROVAL, APPROVED,
                 DENIED, APPROVAL_EXPIRED)

# Why a call id is not found (CallStatus.reason).
OUTSIDE_WINDOW = rc.REFUSED_OUTSIDE_WINDOW
LOG_DAMAGE = rc.STATE_LOG_DAMAGE


@dataclass(frozen=True)
class CallStatus:
    """What the journal knows about one call id, as `status` says:

    - "not_run": no dispatch of it under this call id in this journal can have taken effect:
      it was never settled (not in the replay index, never evicted from it), none is in doubt,
      and the log has no unexplained damage. It may never have been dispatched here, or was
      refused before its handler ran (blocked, a guard's ToolBlocked);
    - "settled": it ran to an end, `outcome` "ok", "error" or "cancelled". An ok one's value is
      in `output` when `output_stored`, else `output_not_stored` says why (None: the journal
      did not store outputs) and `output_preview` shows it redacted;
    - "in_doubt": it started and did not finish (`state` "started" or "ambiguous"; `error` the
      type of what interrupted it, when recorded): its outcome is unknown and it blocks until
      resolved (a call running now in this process reads "started" too);
    - "resolved": it was in doubt and a person, policy or reconcile hook settled it:
      `outcome` ("succeeded", "failed", "not_performed", "rerun"), `actor`, `note`, and the
      resolution's `output` if it gave one. One closed by not_performed or rerun is found by
      reading the log's intents; once compaction dropped its intent, it reads "not_run";
    - "not_found": the journal cannot tell: `reason` "outside_replay_window" (it may have been
      settled before the replay window) or "log_damage" (records were lost to damage);
    - "awaiting_approval", "approved", "denied", "approval_expired": it needs a person's
      approval and has not run: its latest request (`approval_id`) is pending, approved and
      not used yet, denied (`actor`, `note`), or approved with an expiry that has passed.

    Every text field is what a record held: data, never instructions."""

    call_id: str
    status: str
    tool: str | None = None
    execution_id: str | None = None
    outcome: str | None = None
    state: str | None = None
    output: Any = None
    output_stored: bool = False
    output_preview: str | None = None
    output_not_stored: str | None = None
    error: str | None = None
    actor: str | None = None
    note: str | None = None
    reason: str | None = None
    approval_id: str | None = None
    seq: int | None = None  # the record that says so (the intent, for a call in doubt)


def _text(record: Mapping[str, Any], key: str) -> str | None:
    value = record.get(key)
    return value if isinstance(value, str) else None


def call_status(core: Core, call_id: str) -> CallStatus:
    """The status of `call_id` (docs in CallStatus), read under the write lock, so it is one
    state's answer and the records it reads back cannot be dropped meanwhile."""
    if not isinstance(call_id, str) or not call_id:
        raise TypeError(f"call_id must be a non-empty string, not {call_id!r}")
    with core.writing():
        core.check_open()
        core.write_queued()
        in_doubt = core.view(lambda state: _in_doubt(state, call_id))
        if in_doubt is not None:
            return in_doubt
        found = core.view(lambda state: state.calls.find(call_id))
        if isinstance(found, Forgotten):
            return CallStatus(call_id, NOT_FOUND, reason=OUTSIDE_WINDOW)
        if found is not None:
            settling, seq = settling_records(core, [(call_id, found.seq)])[call_id]
            return _settled(call_id, settling, seq)
        approval = core.view(lambda state: state.approvals.latest_for(call_id))
        if approval is not None and approval.status != "consumed":
            return _approval(call_id, approval)
        if core.view(_damaged):
            return CallStatus(call_id, NOT_FOUND, reason=LOG_DAMAGE)
        unsettled = core.view(_unsettling_resolutions)
        resolution = _latest_resolution(core, call_id, unsettled) if unsettled else None
        if resolution is not None:
            return _resolution(call_id, resolution)
        return CallStatus(call_id, NOT_RUN)


def _in_doubt(state: JournalState, call_id: str) -> CallStatus | None:
    """The newest open execution under `call_id`, as a status; None when there is none."""
    latest = None
    for execution_id, execution in state.executions.items():
        key = rc.call_key(execution.record)
        if key is not None and key[0] == call_id and (latest is None
                                                      or execution.seq > latest[1].seq):
            latest = (execution_id, execution)
    if latest is None:
        return None
    execution_id, execution = latest
    return CallStatus(call_id, IN_DOUBT, tool=_text(execution.record, "tool"),
                      execution_id=execution_id, state=execution.state,
                      error=execution.error_type, seq=execution.seq)


def _approval(call_id: str, approval: Approval) -> CallStatus:
    """A call that waits for, or was refused, a person's approval: it has not run."""
    status = {"pending": AWAITING_APPROVAL, "denied": DENIED}.get(approval.status, APPROVED)
    if approval.expired(time.time()):
        status = APPROVAL_EXPIRED
    return CallStatus(call_id, status, tool=approval.tool, actor=approval.actor,
                      note=approval.note, approval_id=approval.approval_id)


def _damaged(state: JournalState) -> bool:
    """Records were cut that no crash explains: what they held is not known."""
    return any(not cut.explained for cut in state.cuts.cuts.values())


def _unsettling_resolutions(state: JournalState) -> dict[str, Resolution]:
    """Execution id -> the resolutions the state holds that left a call unsettled."""
    return {res.execution_id: res for res in state.resolutions
            if res.kind == "execution" and res.execution_id is not None
            and res.outcome not in rc.SETTLED_RESOLUTIONS}


def _settled(call_id: str, settling: Mapping[str, Any], seq: int) -> CallStatus:
    """The status a settling record (a terminal record or a settling resolution) gives."""
    execution_id = _text(settling, "execution_id")
    if settling.get("kind") == rc.RESOLVED:
        return CallStatus(call_id, RESOLVED, execution_id=execution_id,
                          outcome=_text(settling, "outcome"), output=settling.get("output"),
                          actor=_text(settling, "actor"), note=_text(settling, "note"), seq=seq)
    outcome = _text(settling, "outcome")
    if settling.get("kind") != rc.FINISHED or outcome not in ("ok", "error", "cancelled"):
        raise CorruptionError(f"journal record {seq} does not settle call id {call_id!r}",
                              seq=seq, kind="journal_record")
    stored = outcome == "ok" and "output" in settling
    return CallStatus(call_id, SETTLED, execution_id=execution_id, outcome=outcome,
                      output=settling.get("output") if stored else None, output_stored=stored,
                      output_preview=_text(settling, "output_preview"),
                      output_not_stored=(None if stored or outcome != "ok"
                                         else _text(settling, "output_not_stored")),
                      error=_text(settling, "error"), seq=seq)


def _resolution(call_id: str, found: tuple[Resolution, str | None]) -> CallStatus:
    resolution, tool = found
    return CallStatus(call_id, RESOLVED, tool=tool or resolution.tool,
                      execution_id=resolution.execution_id, outcome=resolution.outcome,
                      output=resolution.output, actor=resolution.actor, note=resolution.note,
                      seq=resolution.seq)


def _latest_resolution(core: Core, call_id: str, unsettled: dict[str, Resolution]
                       ) -> tuple[Resolution, str | None] | None:
    """The resolution of the newest execution under `call_id` that a not_performed or rerun
    resolution closed, found by reading the log's intents (the state keeps the resolutions,
    not their call ids); None when none of those is `call_id`'s."""
    found: tuple[Resolution, str | None] | None = None
    records = cast("Generator[Record, None, None]",
                   read(core.log.path, core.log.first_seq, **core.options.read_options))
    try:
        for record in records:
            data = record.data
            if not (isinstance(data, dict) and data.get("kind") == rc.STARTED):
                continue
            execution_id = data.get("execution_id")
            resolution = unsettled.get(execution_id) if isinstance(execution_id, str) else None
            key = rc.call_key(data) if resolution is not None else None
            if resolution is not None and key is not None and key[0] == call_id:
                found = (resolution, _text(data, "tool"))
            if record.seq >= core.log.last_seq:
                break
    finally:
        records.close()  # here, not in the collector, where an interrupt would be swallowed
    return found
