"""The approval rules checked from a journal's log alone, for the torture families: an intent
that names an approval (`approval_id`) names one that was requested for the same call id, tool
and arguments' fingerprint, approved before it, and not used by an earlier intent (never run
without a matching, unused approval; never twice on one); a denied request is never used; and
what a replay of the log must list as pending and as approved-unused."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

REQUESTED, DECIDED = "tool_approval_requested", "tool_approval_decided"
STARTED, CHECKPOINT = "tool_execution_started", "checkpoint"


@dataclass
class ApprovalLedger:
    """Every approval the log names, in log order."""

    requests: dict[str, Mapping[str, Any]] = field(default_factory=dict)  # id -> its record
    decisions: dict[str, str] = field(default_factory=dict)  # id -> "approved" | "denied"
    expiry: dict[str, float | None] = field(default_factory=dict)  # approved id -> expires_at
    used_by: dict[str, str] = field(default_factory=dict)  # id -> the execution that used it
    requested_seq: dict[str, int] = field(default_factory=dict)
    checkpointed: bool = False  # a checkpoint may carry requests whose records were dropped

    def feed(self, seq: int, data: Mapping[str, Any]) -> Iterator[str]:
        """Take one record; yield each rule it breaks."""
        kind = data.get("kind")
        if kind == CHECKPOINT:
            self.checkpointed = True
        elif kind == REQUESTED:
            aid = data["approval_id"]
            if aid in self.requests:
                yield f"approval {aid} requested twice (seqs {self.requested_seq[aid]}, {seq})"
            self.requests[aid] = data
            self.requested_seq[aid] = seq
        elif kind == DECIDED:
            aid = data["approval_id"]
            if aid in self.decisions:
                yield f"approval {aid} decided twice (second at seq {seq})"
            elif aid not in self.requests and not self.checkpointed:
                yield f"approval {aid} decided at seq {seq} but never requested"
            elif aid in self.used_by:
                yield f"approval {aid} decided at seq {seq} after an intent used it"
            else:
                self.decisions[aid] = data["decision"]
                self.expiry[aid] = data.get("expires_at")
        elif kind == STARTED and data.get("approval_id") is not None:
            yield from self._used(seq, data)

    def _used(self, seq: int, intent: Mapping[str, Any]) -> Iterator[str]:
        aid, eid = intent["approval_id"], intent["execution_id"]
        request = self.requests.get(aid)
        if aid in self.used_by:
            yield (f"intent {eid[:8]} (seq {seq}) ran on approval {aid}, already used by "
                   f"{self.used_by[aid][:8]}: twice on one approval")
        if request is None:  # before a checkpoint, its records compacted away: use is all
            if not self.checkpointed:
                yield f"intent {eid[:8]} (seq {seq}) names approval {aid}, never requested"
            self.used_by.setdefault(aid, eid)
            return
        if self.decisions.get(aid) != "approved":
            yield (f"intent {eid[:8]} (seq {seq}) ran on approval {aid}, which is "
                   f"{self.decisions.get(aid, 'pending')}")
        for key in ("call_id", "tool", "arguments_sha256"):
            if intent.get(key) != request.get(key):
                yield (f"intent {eid[:8]} (seq {seq}) ran on approval {aid} with another "
                       f"{key}: {intent.get(key)!r}, approved {request.get(key)!r}")
        self.used_by.setdefault(aid, eid)

    def pending(self) -> set[str]:
        return set(self.requests) - set(self.decisions)

    def approved_unused(self) -> set[str]:
        return {aid for aid, d in self.decisions.items()
                if d == "approved" and aid not in self.used_by}


def approval_problems(records: Iterable[tuple[int, Mapping[str, Any]]]
                      ) -> tuple[ApprovalLedger, list[str]]:
    """The ledger of a log's records, and every approval rule they break."""
    ledger = ApprovalLedger()
    problems = [problem for seq, data in records for problem in ledger.feed(seq, data)]
    return ledger, problems


def view_problems(ledger: ApprovalLedger, recovery: Any) -> list[str]:
    """Where a journal's recovery view disagrees with what the log says is pending and
    approved-unused (meaningful for a log never compacted)."""
    problems = []
    pending = {a.approval_id for a in recovery.approvals}
    approved = {a.approval_id for a in recovery.approved}
    if pending != ledger.pending():
        problems.append(f"pending approvals {sorted(pending)} != the log's "
                        f"{sorted(ledger.pending())}")
    if approved != ledger.approved_unused():
        problems.append(f"approved-unused approvals {sorted(approved)} != the log's "
                        f"{sorted(ledger.approved_unused())}")
    return problems
