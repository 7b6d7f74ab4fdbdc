"""SIGKILL, black box, at the journal level: children run agent turns with random tools (that
succeed, raise, refuse, or write a side-effect file) over tiny segments, and are killed at
random. The journal's recovery state must be what the children's oracle predicts."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from approval_rules import approval_problems, view_problems
from budget import SEED, TALLY, TRIALS, rng_for
from sigkill import run_and_kill, run_trials

import walj

MODES = ("always", "batch", "interval", "never")
ROUNDS = 3
TURN_TRIALS = max(4, TRIALS - TRIALS // 2)  # the other half are plain appends

STARTED, FINISHED = "tool_execution_started", "tool_execution_finished"
REPLAYED, REFUSED = "tool_execution_replayed", "tool_execution_refused"
RESOLVED, BLOCKED = "tool_execution_resolved", "tool_execution_blocked"


@dataclass
class TurnOracle:
    """What the children said, over every round of one journal."""

    handler_started: dict[str, int] = field(default_factory=dict)  # execution id -> turn
    finished: dict[str, str] = field(default_factory=dict)  # execution id -> outcome
    resolved: set[str] = field(default_factory=set)
    blocked: set[str] = field(default_factory=set)
    replayed: set[str] = field(default_factory=set)  # settled executions that answered again
    refused: set[str] = field(default_factory=set)  # refused dispatches (never started)
    turns: set[int] = field(default_factory=set)
    completed: set[int] = field(default_factory=set)
    resolved_turns: set[int] = field(default_factory=set)
    requested: dict[str, str] = field(default_factory=dict)  # approval id -> call id
    decided: dict[str, str] = field(default_factory=dict)  # approval id -> decision
    used: dict[str, str] = field(default_factory=dict)  # approval id -> execution id
    unanswered: set[str] = field(default_factory=set)  # answered denied / approval_expired

    def feed(self, lines: list[str]) -> None:
        for line in lines:
            tag, *rest = line.split()
            if tag == "H":
                self.handler_started[rest[0]] = int(rest[1])
            elif tag == "F":
                self.finished[rest[0]] = rest[1]
            elif tag == "R":
                self.resolved.add(rest[0])
            elif tag == "RT":
                self.resolved_turns.add(int(rest[0]))
            elif tag == "B":
                self.blocked.add(rest[0])
            elif tag == "P":
                self.replayed.add(rest[0])
            elif tag == "N":
                self.refused.add(rest[0])
            elif tag == "T":
                self.turns.add(int(rest[0]))
            elif tag == "C":
                self.completed.add(int(rest[0]))
            else:
                self.feed_approval(tag, rest)

    def feed_approval(self, tag: str, rest: list[str]) -> None:
        if tag == "Q":
            self.requested[rest[0]] = rest[1]
        elif tag in ("A", "D"):
            self.decided[rest[0]] = "approved" if tag == "A" else "denied"
        elif tag == "U":
            self.used[rest[0]] = rest[1]
        elif tag == "E":
            self.unanswered.add(rest[0])

    def check(self, path: Path, effects: Path, context: str) -> dict[str, str]:
        """Check the journal on disk; returns its execution blockers (id -> state)."""
        if not path.exists():
            assert not self.handler_started, context
            return {}
        report = walj.verify(path)
        assert report.ok, f"{context}: {[p.describe() for p in report.problems]}"
        records = list(walj.read(path))
        assert [r.seq for r in records] == list(range(1, len(records) + 1)), context
        on_disk: dict[str, dict[str, str]] = defaultdict(dict)
        closed_turns: set[int] = set()  # completed or resolved, on disk
        turn_of: dict[str, int] = {}  # execution id -> turn, from the intents on disk
        for r in records:
            if r.data.get("kind") in (STARTED, FINISHED, RESOLVED, BLOCKED, REPLAYED, REFUSED):
                on_disk[r.data["kind"]][r.data["execution_id"]] = r.data.get("outcome", "")
                if r.data["kind"] == STARTED:
                    turn_of[r.data["execution_id"]] = r.data["turn_sequence"]
            elif r.data.get("kind") in ("turn_completed", "turn_resolved"):
                closed_turns.add(r.data["turn_sequence"])
        with walj.ToolJournal.open(path, recovery="salvage") as journal:
            recovery = journal.recovery
        self.check_approvals(records, recovery, context)
        executions = {b.execution_id: b for b in recovery.blockers if b.execution_id}
        turn_blockers = {b.turn_sequence for b in recovery.blockers if b.execution_id is None}
        facts = 0
        wrong: list[str] = []
        # Every intent acknowledged (its handler ran) without its terminal record is a blocker.
        for eid in set(self.handler_started) - set(self.finished) - self.resolved:
            facts += 1
            terminal = eid in on_disk[FINISHED] or eid in on_disk[RESOLVED]
            if not terminal and eid not in executions:
                wrong.append(f"{eid} started, has no terminal record, yet is no blocker")
            if terminal and eid in executions:
                wrong.append(f"{eid} has a terminal record, yet blocks")
        # Nothing that finished (or was resolved) is one, and its record is there.
        for eid, outcome in self.finished.items():
            facts += 1
            if eid in executions or on_disk[FINISHED].get(eid) != outcome:
                wrong.append(f"{eid} finished {outcome}: blocker {eid in executions}, on disk "
                             f"{on_disk[FINISHED].get(eid)}")
        for eid in self.resolved:
            facts += 1
            if eid in executions or eid not in on_disk[RESOLVED]:
                wrong.append(f"{eid} resolved: blocker {eid in executions}, on disk "
                             f"{eid in on_disk[RESOLVED]}")
        # A repeated call id answered from its settled execution: that execution is settled on
        # disk, blocks nothing, and the answer itself was made durable before it was given.
        for eid in self.replayed:
            facts += 1
            if (eid in executions or eid not in on_disk[REPLAYED]
                    or not (eid in on_disk[FINISHED] or eid in on_disk[RESOLVED])):
                wrong.append(f"{eid} answered a replay: blocker {eid in executions}, replayed "
                             f"on disk {eid in on_disk[REPLAYED]}")
        # A refused repeat ran nothing, and its refusal is on disk.
        for eid in self.refused:
            facts += 1
            if eid in self.handler_started or eid in on_disk[STARTED] or eid not in \
                    on_disk[REFUSED] or (effects / eid).exists():
                wrong.append(f"{eid} refused, yet it ran or its refusal is not on disk")
        TALLY.add(checked=facts - len(wrong), lost=len(wrong))
        assert not wrong, f"{context}: acknowledged facts the journal contradicts: {wrong}"
        for eid, blocker in executions.items():
            assert blocker.state == "started", f"{context}: a kill leaves 'started', not {blocker}"
            assert eid in on_disk[STARTED] and eid not in on_disk[FINISHED], context
        # A blocked dispatch ran no handler and made no effect.
        for eid in self.blocked:
            assert eid not in self.handler_started, f"{context}: blocked {eid} ran its handler"
            assert not (effects / eid).exists(), f"{context}: blocked {eid} had an effect"
            assert eid in on_disk[BLOCKED], context
        # A side effect exists only for an execution that is a blocker or that finished.
        for effect in effects.iterdir() if effects.exists() else ():
            eid = effect.name
            assert eid in on_disk[STARTED], f"{context}: effect {eid} without a durable intent"
            assert eid in executions or eid in on_disk[FINISHED] or eid in on_disk[RESOLVED], \
                f"{context}: effect {eid} of an execution that neither blocks nor finished"
        # Turns: a completed or resolved turn never blocks; a tool-bearing one left without
        # completion, whose executions all have a finished record, does (one with an execution
        # still open, or resolved, is settled through that execution instead).
        assert not turn_blockers & (self.completed | self.resolved_turns | closed_turns), context
        for turn in self.turns - self.completed - self.resolved_turns - closed_turns:
            TALLY.add(checked=1)
            mine = [e for e, t in turn_of.items() if t == turn]
            interrupted = bool(mine) and all(e in on_disk[FINISHED] for e in mine)
            assert (turn in turn_blockers) == interrupted, \
                f"{context}: turn {turn} (executions {mine}) interrupted {interrupted}, " \
                f"blocking {turn in turn_blockers}"
        return {eid: b.state for eid, b in executions.items()}


    def check_approvals(self, records: list[walj.Record], recovery: walj.Recovery,
                        context: str) -> None:
        """The approval rules from the log alone (approval_rules.py), every acknowledged
        request, decision and use on disk, and the recovery view listing what the log leaves
        pending and approved-unused: so requests and approvals survive the kills."""
        ledger, problems = approval_problems((r.seq, r.data) for r in records)
        facts = len(self.requested) + len(self.decided) + len(self.used)
        for aid in self.requested:
            if aid not in ledger.requests:
                problems.append(f"request {aid} was answered awaiting_approval, not on disk")
        for aid, decision in self.decided.items():
            if ledger.decisions.get(aid) != decision:
                problems.append(f"{decision} {aid} acknowledged; on disk "
                                f"{ledger.decisions.get(aid)}")
        for aid, eid in self.used.items():
            if ledger.used_by.get(aid) != eid:
                problems.append(f"{eid} ran on {aid}; on disk {ledger.used_by.get(aid)}")
        for aid in self.unanswered:  # denied or expired: final for its call, never used
            facts += 1
            if aid in ledger.used_by:
                problems.append(f"{aid} answered denied or expired, yet "
                                f"{ledger.used_by[aid]} ran on it")
        # A gated execution's intent always names its approval: never run without one.
        for r in records:
            if r.data.get("kind") == STARTED and r.data.get("tool") == "gated":
                facts += 1
                if not r.data.get("approval_id"):
                    problems.append(f"gated {r.data['execution_id']} ran with no approval")
        problems += view_problems(ledger, recovery)
        TALLY.add(checked=facts, approvals_checked=facts, lost=len(problems))
        assert not problems, f"{context}: approvals: {problems}"


def one_trial(tmp_path: Path, trial: int) -> None:
    rng = rng_for(f"sigkill-turns-{trial}")
    mode = MODES[trial % len(MODES)]
    segment_bytes = rng.choice([1024, 1024, 2048, 4096, 65536])
    base = tmp_path / f"trial{trial}"
    base.mkdir()
    path = base / "journal"
    oracle = TurnOracle()
    for rnd in range(1, ROUNDS + 1):
        context = f"trial {trial} ({mode}, segments of {segment_bytes}) round {rnd}"
        run = run_and_kill("child_turns.py",
                           [str(path), mode, str(segment_bytes), str(SEED), str(rnd)], rng,
                           max_wait=0.3)
        if not run.killed:
            pytest.fail(f"{context}: the child died on its own ({run.returncode}):\n{run.stderr}")
        TALLY.add(faults=1, sigkill_kills=1)
        oracle.feed(run.lines)
        oracle.check(path, base / "effects", context)
    TALLY.add(trials_sigkill_turns=1)
    if not path.exists():
        return
    # Reopen for real: it must block exactly when the oracle's check found blockers, and a
    # blocked dispatch must call no handler.
    called: list[int] = []
    with walj.ToolJournal.open(path) as journal:
        recovery = journal.recovery
        with journal.turn() as turn:
            result = turn.dispatch("spy", {}, handler=lambda: called.append(1))
        if recovery.blocked:
            assert result.outcome == "blocked" and not called
        else:
            assert result.outcome == "ok" and called == [1]


def test_sigkill_tool_turns(tmp_path: Path) -> None:
    run_trials(TURN_TRIALS, lambda trial: one_trial(tmp_path, trial))
