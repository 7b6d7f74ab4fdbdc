"""The recovery view of a rebuilt state: is dispatch blocked, and the Recovery snapshot with
its blockers, incomplete turns and pending LLM calls. Standard library only (the forensic
tool)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from ..errors import CorruptionError
from . import records as r
from ._approvalbook import APPROVED, PENDING, ApprovalBook
from ._checkpoint import CheckpointLoad
from ._damage import CutLedger
from ._openwork import OpenExecution, OpenTurn
from ._records import Blocker, IncompleteTurn, PendingLLMCall, Recovery, Resolution
from .records import time_of, turn_number


def _time(record: Mapping[str, Any]) -> float | None:
    return time_of(record.get("at"))


def _opt_str(record: Mapping[str, Any], key: str) -> str | None:
    value = record.get(key)
    return value if isinstance(value, str) else None


class StateView:
    """The reading half of JournalState (which sets every attribute named here)."""

    executions: dict[str, OpenExecution]
    turns: dict[int, OpenTurn]
    turn_stack: list[int]
    llm_calls: dict[str, tuple[Mapping[str, Any], int]]
    blocking_llm_calls: set[str]
    resolutions: list[Resolution]
    cuts: CutLedger
    records: int
    last_seq: int
    session_id: str | None
    ended_seq: int | None
    loading: CheckpointLoad | None
    awaiting: bool
    approvals: ApprovalBook

    def is_blocked(self, *, live_executions: Collection[str] = (), live_turn: int | None = None,
                   live_llm_calls: Collection[str] = (),
                   block_on_pending_llm_calls: bool = False) -> bool:
        """The cheap form of `snapshot(...).blocked`, for every dispatch."""
        if self.cuts.damage or len(self.executions) > len(live_executions):
            return True
        if any(eid not in live_executions for eid in self.executions):
            return True
        blocking = self.llm_calls if block_on_pending_llm_calls else self.blocking_llm_calls
        if any(c not in live_llm_calls for c in blocking):
            return True
        return any(s != live_turn and self.turns[s].interrupted for s in self.turn_stack)

    def snapshot(self, *, live_executions: Collection[str] = (), live_turn: int | None = None,
                 live_llm_calls: Collection[str] = (),
                 block_on_pending_llm_calls: bool = False) -> Recovery:
        """The recovery view. Work in flight in this process (`live_*`) is not a blocker.
        IncompleteCheckpointError when the records began at a checkpoint and ended inside it."""
        if self.loading is not None:
            raise self.loading.incomplete(None)
        if self.awaiting:
            raise CorruptionError("the journal's records begin after seq 1 (a compacted log) "
                                  "with no complete checkpoint to rebuild its state from",
                                  kind="journal_record")
        blockers = [self.blocker(eid) for eid in self.executions if eid not in live_executions]
        incomplete: list[IncompleteTurn] = []
        for sequence in self.turn_stack:
            turn = self.turns[sequence]
            if sequence == live_turn or turn.resolved:
                continue
            incomplete.append(IncompleteTurn(sequence, turn.started_at, turn.seq, turn.started > 0))
            if turn.interrupted:
                blockers.append(Blocker(None, None, None, r.STATE_INTERRUPTED_TURN, sequence,
                                        None, None, started_at=turn.started_at, seq=turn.seq))
        pending: list[PendingLLMCall] = []
        for call_id, (record, seq) in self.llm_calls.items():
            if call_id in live_llm_calls:
                continue
            call = PendingLLMCall(call_id, _opt_str(record, "model"),
                                  turn_number(record.get("turn_sequence")), _time(record), seq,
                                  _opt_str(record, "request_sha256"),
                                  _opt_str(record, "request_preview"))
            pending.append(call)
            if block_on_pending_llm_calls or call_id in self.blocking_llm_calls:
                blockers.append(Blocker(call_id, None, None, r.STATE_PENDING_LLM_CALL,
                                        call.turn_sequence, call.request_sha256,
                                        call.request_preview, started_at=call.started_at,
                                        seq=seq))
        blockers += self.cuts.blockers()
        blockers.sort(key=lambda b: b.seq)
        return Recovery(blocked=bool(blockers), blockers=tuple(blockers),
                        incomplete_turns=tuple(incomplete), pending_llm_calls=tuple(pending),
                        resolved=tuple(self.resolutions), records=self.records,
                        last_seq=self.last_seq, cuts=tuple(self.cuts.cuts.values()),
                        session_id=self.session_id, ended=self.ended_seq is not None,
                        approvals=self.approvals.with_status(PENDING),
                        approved=self.approvals.with_status(APPROVED))

    def blocker(self, execution_id: str) -> Blocker:
        """The blocker view of an open execution (KeyError if it is not open)."""
        execution = self.executions[execution_id]
        record = execution.record
        return Blocker(
            execution_id=execution_id, tool=_opt_str(record, "tool"),
            call_id=_opt_str(record, "call_id"), state=execution.state,
            turn_sequence=execution.turn, arguments_sha256=_opt_str(record, "arguments_sha256"),
            arguments_preview=_opt_str(record, "arguments_preview"),
            idempotency_key=_opt_str(record, "idempotency_key"), started_at=_time(record),
            seq=execution.seq, error_type=execution.error_type,
            reconcile_error=execution.reconcile_error, arguments=record.get("arguments"),
            writer=_opt_str(record, "writer"))
