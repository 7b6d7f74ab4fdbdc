"""A hypothesis state machine of the journal, checked after every step against a simple model:
turns, dispatch of tools that succeed, fail, cancel, refuse, are interrupted or crash the
process, crashes at any point (drop the handle and reopen, losing whatever was not synced),
per-tool policies and reconcile hooks on reopen, and resolutions of executions and turns."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from budget import SEED, TALLY, scaled
from faultfs import FaultyFS, SimulatedCrash, abandon
from hypothesis import HealthCheck, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import walj

BEHAVIOURS = ("ok", "error", "cancel", "refuse", "interrupt", "crash")
OUTCOMES = {"ok": "ok", "error": "error", "cancel": "cancelled", "refuse": "blocked"}
TOOLS = ("plain", "assume_done", "rerun", "reconcile")
# Where a crash lands around one dispatch (sync="always": a write, then its sync):
CRASH_POINTS = {
    "before the intent is durable": ("sync", 1, False),
    "after the intent is durable": ("sync", 1, True),
    "before the finish is durable": ("sync", 2, False),
    "after the finish is durable": ("sync", 2, True),
}


@dataclass
class ModelTurn:
    started: int = 0  # executions whose intent is durable
    unfinished: int = 0  # of those, without a finished record
    completed: bool = False
    resolved: bool = False


@dataclass
class Model:
    open: dict[str, str] = field(default_factory=dict)  # execution id -> "started"/"ambiguous"
    tool: dict[str, tuple[str, int]] = field(default_factory=dict)  # execution id -> tool, x
    turn_of: dict[str, int] = field(default_factory=dict)
    key: dict[str, str] = field(default_factory=dict)  # idempotency key the handler saw
    finished: set[str] = field(default_factory=set)  # terminal record (or blocked dispatch)
    seen: list[str] = field(default_factory=list)  # every execution id, in order (not by value)
    resolved: set[str] = field(default_factory=set)
    turns: dict[int, ModelTurn] = field(default_factory=dict)
    live: int | None = None
    pending_llm: set[str] = field(default_factory=set)

    def interrupted_turns(self) -> set[int]:
        return {seq for seq, t in self.turns.items() if seq != self.live and not t.completed
                and not t.resolved and t.started > 0 and t.unfinished == 0}

    @property
    def blocked(self) -> bool:
        return bool(self.open) or bool(self.interrupted_turns())


def reconcile(blocker: walj.Blocker) -> str | None:
    x = int((blocker.arguments_preview or "").split(":")[-1].rstrip("}"))
    if x % 3 == 0:
        return "not_performed"
    if x % 3 == 1:
        return None
    raise RuntimeError("the outbox is unreachable")


class JournalMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="walj-model-"))
        self.path = self.dir / "journal"
        self.model = Model()
        self.called: list[str] = []
        self.turn: Any = None  # the live walj Turn
        self.fs = FaultyFS(freeze_on_crash=True)
        self.journal = self._open()
        TALLY.add(trials_journal_model=1)

    # --- plumbing -------------------------------------------------------------------------------

    def _handler(self, behaviour: str, x: int, context: walj.ToolContext) -> Any:
        self.called.append(context.execution_id)
        self.model.key[context.execution_id] = context.idempotency_key
        if behaviour == "error":
            raise RuntimeError("the tool failed")
        if behaviour == "cancel":
            raise walj.ToolCancelled("nothing done")
        if behaviour == "refuse":
            raise walj.ToolBlocked("refused")
        if behaviour == "interrupt":
            raise KeyboardInterrupt
        if behaviour == "crash":
            self.fs.dead = True  # the process dies here: nothing more reaches the disk
            raise SimulatedCrash("inside the handler")
        return {"x": x}

    def _open(self) -> walj.ToolJournal:
        tools = {
            "plain": walj.Tool(self._handler),
            "assume_done": walj.Tool(self._handler, on_ambiguous="assume_done"),
            "rerun": walj.Tool(self._handler, on_ambiguous="rerun"),
            "reconcile": walj.Tool(self._handler, reconcile=reconcile),
        }
        journal = walj.ToolJournal.open(self.path, tools=tools, sync="always", _fs=self.fs)
        # The model's settlement on open: reconcile first, then the tool's policy.
        for eid in list(self.model.open):
            name, x = self.model.tool[eid]
            if name == "assume_done" or name == "rerun" or (name == "reconcile" and x % 3 == 0):
                del self.model.open[eid]
                self.model.resolved.add(eid)
        return journal

    def _crash(self) -> None:
        """The process dies: drop the handle, lose what was not synced, reopen."""
        self.fs.crash("drop")
        abandon(self.journal._log)
        self.model.live = None
        self.turn = None
        self.fs = FaultyFS(freeze_on_crash=True)
        self.journal = self._open()
        TALLY.add(faults=1)

    def teardown(self) -> None:
        try:
            self.journal.close()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    # --- turns ----------------------------------------------------------------------------------

    @precondition(lambda self: self.turn is None)
    @rule()
    def start_turn(self) -> None:
        self.turn = self.journal.turn()
        self.turn.__enter__()
        seq = self.turn.sequence
        assert seq not in self.model.turns
        self.model.turns[seq] = ModelTurn()
        self.model.live = seq

    @precondition(lambda self: self.turn is None)
    @rule(after=st.booleans())
    def crash_while_starting_a_turn(self, after: bool) -> None:
        self.fs.crash_at("sync", 1, after=after)
        turn = self.journal.turn()
        try:
            turn.__enter__()
        except SimulatedCrash:
            pass
        else:
            raise AssertionError("the crash point was not reached")
        if after:  # turn_started is durable: an incomplete turn, with no tools, never blocks
            self.model.turns[max(self.model.turns, default=0) + 1] = ModelTurn()
        self._crash()

    @precondition(lambda self: self.turn is not None)
    @rule(after=st.booleans())
    def crash_while_completing_a_turn(self, after: bool) -> None:
        assert self.turn is not None and self.model.live is not None
        self.fs.crash_at("sync", 1, after=after)
        try:
            self.turn.__exit__(None, None, None)
        except SimulatedCrash:
            pass
        else:
            raise AssertionError("the crash point was not reached")
        self.model.turns[self.model.live].completed = after
        self._crash()

    @precondition(lambda self: self.turn is not None)
    @rule(crash=st.booleans())
    def llm_call(self, crash: bool) -> None:
        assert self.turn is not None
        try:
            with self.turn.llm_call(model="m", request={"q": 1}) as call:
                if crash:
                    self.fs.dead = True
                    raise SimulatedCrash("while the LLM answers")
                call.finish({"a": 2})
        except SimulatedCrash:
            self.model.pending_llm.add(call.llm_call_id)
            self._crash()

    @precondition(lambda self: self.turn is not None)
    @rule(completed=st.booleans())
    def end_turn(self, completed: bool) -> None:
        assert self.turn is not None and self.model.live is not None
        if completed:
            self.turn.__exit__(None, None, None)
        else:  # left by an exception: not completed
            self.turn.__exit__(LookupError, LookupError("the turn failed"), None)
        self.model.turns[self.model.live].completed = completed
        self.model.live = None
        self.turn = None

    # --- dispatch -------------------------------------------------------------------------------

    def _dispatch(self, tool: str, behaviour: str,
                  x: int) -> tuple[str | None, BaseException | None]:
        assert self.turn is not None
        before = len(self.called)
        try:
            result = self.turn.dispatch(tool, {"behaviour": behaviour, "x": x})
        except (KeyboardInterrupt, SimulatedCrash) as exc:
            return (self.called[-1] if len(self.called) > before else None), exc
        if self.model.blocked:
            assert result.outcome == "blocked" and len(self.called) == before, result
            assert result.output["status"] == "blocked_interrupted_execution"
            self.model.finished.add(result.execution_id)
            self.model.seen.append(result.execution_id)
            return None, None
        assert self.called[before:] == [result.execution_id], "the handler ran once"
        assert result.outcome == OUTCOMES[behaviour], (behaviour, result)
        return result.execution_id, None

    def _started(self, eid: str, tool: str, x: int) -> None:
        live = self.model.turns[self.model.live]  # type: ignore[index]
        live.started += 1
        live.unfinished += 1
        self.model.tool[eid] = (tool, x)
        self.model.turn_of[eid] = self.model.live  # type: ignore[assignment]
        self.model.seen.append(eid)

    @precondition(lambda self: self.turn is not None)
    @rule(tool=st.sampled_from(TOOLS), behaviour=st.sampled_from(BEHAVIOURS),
          x=st.integers(0, 99))
    def dispatch(self, tool: str, behaviour: str, x: int) -> None:
        blocked = self.model.blocked
        eid, exc = self._dispatch(tool, behaviour, x)
        if blocked:
            assert exc is None
            return
        assert eid is not None
        self._started(eid, tool, x)
        if behaviour == "interrupt":
            assert isinstance(exc, KeyboardInterrupt), "the interrupt is re-raised unchanged"
            self.model.open[eid] = "ambiguous"
            self.end_turn(False)  # the interrupt leaves the turn
        elif behaviour == "crash":
            assert isinstance(exc, SimulatedCrash)
            self.model.open[eid] = "started"
            self._crash()
        else:
            self.model.turns[self.model.turn_of[eid]].unfinished -= 1
            self.model.finished.add(eid)

    @precondition(lambda self: self.turn is not None)
    @rule(point=st.sampled_from(sorted(CRASH_POINTS)), tool=st.sampled_from(TOOLS),
          x=st.integers(0, 99))
    def crash_around_a_dispatch(self, point: str, tool: str, x: int) -> None:
        """A power cut at one of the four syncs of a dispatch."""
        if self.model.blocked:
            return
        op, nth, after = CRASH_POINTS[point]
        self.fs.crash_at(op, nth, after=after)
        eid, exc = self._dispatch(tool, "ok", x)
        assert isinstance(exc, SimulatedCrash), point
        if point == "before the intent is durable":
            assert eid is None, "the handler ran before its intent was durable"
            self._crash()
            return
        if point == "after the intent is durable":
            assert eid is None, "the handler ran although the process died first"
            eid = self._intent_on_disk_after_crash()
        else:
            assert eid is not None
        self._started(eid, tool, x)
        if point == "after the finish is durable":
            self.model.turns[self.model.turn_of[eid]].unfinished -= 1
            self.model.finished.add(eid)
        else:
            self.model.open[eid] = "started"
        self._crash()

    def _intent_on_disk_after_crash(self) -> str:
        """The id of the last intent in the log (the handler never saw it)."""
        last = None
        for record in walj.read(self.path):
            if record.data.get("k") == "tool_execution_started":
                last = record.data["id"]
        assert last is not None and last not in self.model.tool
        return str(last)

    @rule()
    def crash_between_steps(self) -> None:
        self._crash()

    # --- resolution -----------------------------------------------------------------------------

    @rule(data=st.data(), outcome=st.sampled_from(["succeeded", "failed", "not_performed"]),
          note=st.sampled_from([None, "checked by hand"]))
    def resolve(self, data: st.DataObject, outcome: str, note: str | None) -> None:
        eid = data.draw(st.sampled_from(self.model.seen + ["f" * 32]))
        if outcome == "failed" and note is None:
            expected: str | None = "note_required"
        elif eid in self.model.open:
            expected = None
        elif eid in self.model.resolved:
            expected = "already_resolved"
        elif eid in self.model.finished:
            expected = "already_terminal"
        else:
            expected = "unknown"
        try:
            self.journal.resolve(eid, outcome, note=note, actor="tester")
        except walj.ResolutionError as exc:
            assert exc.reason == expected, (eid, exc.reason, expected)
        else:
            assert expected is None, f"resolved {eid}, expected refusal {expected}"
            del self.model.open[eid]
            self.model.resolved.add(eid)

    @precondition(lambda self: bool(self.model.open))
    @rule(data=st.data(), after=st.booleans())
    def crash_while_resolving(self, data: st.DataObject, after: bool) -> None:
        eid = data.draw(st.sampled_from([e for e in self.model.seen if e in self.model.open]))
        self.fs.crash_at("sync", 1, after=after)
        try:
            self.journal.resolve(eid, "not_performed", actor="tester")
        except SimulatedCrash:
            pass
        else:
            raise AssertionError("the crash point was not reached")
        if after:
            del self.model.open[eid]
            self.model.resolved.add(eid)
        self._crash()

    @rule(data=st.data())
    def resolve_turn(self, data: st.DataObject) -> None:
        turn = data.draw(st.integers(0, max(self.model.turns, default=0) + 1))
        t = self.model.turns.get(turn)
        if turn == self.model.live:
            expected: str | None = "in_flight"
        elif t is None:
            expected = "unknown"
        elif t.completed:
            expected = "already_terminal"
        elif t.resolved:
            expected = "already_resolved"
        else:
            expected = None
        try:
            self.journal.resolve_turn(turn, note="checked", actor="tester")
        except walj.ResolutionError as exc:
            assert exc.reason == expected, (turn, exc.reason, expected)
        else:
            assert expected is None, f"resolved turn {turn}, expected refusal {expected}"
            t.resolved = True  # type: ignore[union-attr]

    # --- the check ------------------------------------------------------------------------------

    @invariant()
    def recovery_matches_the_model(self) -> None:
        recovery = self.journal.recovery
        executions = {b.execution_id: b for b in recovery.blockers if b.execution_id}
        turns = {b.turn_sequence for b in recovery.blockers if b.execution_id is None}
        assert {e: b.state for e, b in executions.items()} == self.model.open
        assert turns == self.model.interrupted_turns()
        assert recovery.blocked == self.model.blocked == self.journal.is_blocked()
        assert {c.llm_call_id for c in recovery.pending_llm_calls} == self.model.pending_llm
        for eid, blocker in executions.items():
            assert blocker.tool == self.model.tool[eid][0]
            assert blocker.turn_sequence == self.model.turn_of[eid]
            if eid in self.model.key:  # the idempotency key survives the restart
                assert blocker.idempotency_key == self.model.key[eid]
        TALLY.add(checked=1 + len(executions) + len(turns))


JournalMachine.TestCase.settings = settings(
    max_examples=scaled(150), stateful_step_count=40, deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestJournalModel = seed(SEED)(JournalMachine).TestCase
