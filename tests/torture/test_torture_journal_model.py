"""A hypothesis state machine of the journal, checked after every step against a simple model:
turns, dispatch of tools that succeed, fail, cancel, refuse, are interrupted or crash the
process, crashes at any point followed by a power cut of every kind (drop the handle, lose
what the cut loses, reopen), per-tool policies and reconcile hooks on reopen, and resolutions
of executions and turns; in every sync mode.

The oracle of durability. The journal writes some records without waiting for a sync
(UNSYNCED below: turn brackets, LLM-call brackets, blocked dispatches, failed reconciles) and
every other one durably, whatever the log's sync mode; in "always" and "batch" every append is
durable when it returns. So after each step the machine knows the last record acknowledged as
durable (`promised`: everything up to it is). A power cut must keep all of that, may keep any
prefix of what followed, and nothing else: after the cut, the reader written from FORMAT.md
alone (tests/spec_reader.py) reads a prefix of what was written, at least `promised` long,
exactly `promised` long when the cut drops every unsynced byte, and all of it when only the
process died. The model keeps, for each record that is not yet durable, how to take back its
effect; the effects of the records the cut lost are taken back, and the journal's recovery
must then match the model. In "interval" mode the background syncer sleeps for an hour and its
loop is stepped as a rule (`interval_tick`), so where an interval ends is a drawn step.
"""

from __future__ import annotations

import math
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from budget import SEED, TALLY, scaled
from faultfs import CRASH_MODES, FaultyFS, SimulatedCrash, abandon, tick
from hypothesis import HealthCheck, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from spec_reader import read_records

import walj

BEHAVIOURS = ("ok", "error", "cancel", "refuse", "interrupt", "crash")
OUTCOMES = {"ok": "ok", "error": "error", "cancel": "cancelled", "refuse": "blocked"}
TOOLS = ("plain", "assume_done", "rerun", "reconcile")
# The journal's records it appends with durable=False (walj/journal/_core.py, _llm.py, _resolve.py).
UNSYNCED = frozenset({"turn_started", "turn_completed", "tool_execution_blocked",
                      "llm_call_started", "llm_call_finished",
                      "tool_execution_reconcile_failed"})
# A crash, then a power cut of this kind, its random choices drawn from this seed.
POWER = st.tuples(st.sampled_from(CRASH_MODES), st.integers(0, 2**32 - 1))
# Where a crash lands around one dispatch: its intent and its terminal record are durable in
# every sync mode, each a write and then a sync (of the main thread: the interval syncer
# sleeps), so the nth write or sync is the same call in every mode.
CRASH_POINTS = {
    "before the intent is written": ("write", 1, False),
    "before the intent is durable": ("sync", 1, False),
    "after the intent is durable": ("sync", 1, True),
    "before the finish is durable": ("sync", 2, False),
    "after the finish is durable": ("sync", 2, True),
}
# Where a crash lands around one record: before it is written, once written but before its
# append returned, and (for a record that is synced) once its sync returned.
NOT_WRITTEN, UNACKNOWLEDGED, SYNCED = "not written", "unacknowledged", "synced"
# The wall clock while the machine runs. Records hold times (and a segment header its creation
# time), so with the real clock their lengths, and so the bytes a tear or a hole at a drawn
# place falls on, would differ from one replay of an example to the next.
FROZEN_TIME = 1_800_000_000.125


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
    SYNC = "always"

    def __init__(self) -> None:
        super().__init__()
        self._real_time = time.time
        time.time = lambda: FROZEN_TIME
        self.dir = Path(tempfile.mkdtemp(prefix="walj-model-"))
        self.path = self.dir / "journal"
        self.model = Model()
        self.called: list[str] = []
        self.turn: Any = None  # the live walj Turn
        self.fs = FaultyFS(freeze_on_crash=True)
        self.promised = 0  # every record up to this seq was acknowledged as durable
        self.scanned = 0  # the records looked at for acknowledgements so far
        # For each record not yet durable that changed the model: its seq, and how to take
        # the change back if a power cut loses the record.
        # A turn's is keyed by its number instead (`("turn", n)`): its turn_started is written
        # with the turn's first record, whenever that comes.
        self.undo: list[tuple[int | tuple[str, int], Callable[[], None]]] = []
        self.journal = self._open()
        TALLY.add(trials_journal_model=1)

    # --- durability -----------------------------------------------------------------------------

    @property
    def each_append_synced(self) -> bool:
        return self.SYNC in ("always", "batch")

    def _written(self) -> list[tuple[int, dict[str, Any]]]:
        """Every record in the journal's files (what the process wrote, before a power cut),
        read by the reader written from FORMAT.md alone."""
        return read_records(self.path)

    def _acknowledged(self, *, last_unacknowledged: bool = False, together: int = 0) -> None:
        """Every write so far returned (but the last, when a crash stopped its append, which
        held `together` records before its own: a pending turn_started): a durable record, or
        any record when each append is synced, makes it and everything before it durable."""
        written = self._written()
        end = len(written) - (1 + together if last_unacknowledged else 0)
        for seq, data in written[self.scanned:end]:
            if self.each_append_synced or data.get("kind") not in UNSYNCED:
                self.promised = seq
        self.scanned = max(self.scanned, end)

    def _effect(self, undo: Callable[[], None]) -> None:
        """The model just took the effect of the last record written; `undo` takes it back."""
        self.undo.append((len(self._written()), undo))

    def _start_pending(self) -> int:
        """1 while the live turn's turn_started is not written yet (the next write carries it)."""
        live = self.model.live
        return int(live is not None and not any(
            data.get("kind") == "turn_started" and data.get("turn_sequence") == live
            for _, data in self._written()))

    def _undo_at(self, mark: int | tuple[str, int], written: list[tuple[int, Any]]) -> float:
        """The seq of the record whose loss an undo takes back (a turn's: its turn_started;
        infinite when that was never written)."""
        if isinstance(mark, int):
            return mark
        return next((seq for seq, data in written if data.get("kind") == "turn_started"
                     and data.get("turn_sequence") == mark[1]), math.inf)

    def _points(self, durable: bool) -> list[tuple[str, bool, str]]:
        """Where a crash can land around one append of the journal: (op, after, outcome)."""
        points = [("write", False, NOT_WRITTEN), ("write", True, UNACKNOWLEDGED)]
        if durable or self.each_append_synced:
            points += [("sync", False, UNACKNOWLEDGED), ("sync", True, SYNCED)]
        return points

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
        options: dict[str, Any] = {"sync_interval_ms": 3_600_000} if self.SYNC == "interval" \
            else {}
        journal = walj.ToolJournal.open(self.path, tools=tools, sync=self.SYNC, _fs=self.fs,
                                        **options)
        # The model's settlement on open: reconcile first, then the tool's policy.
        for eid in list(self.model.open):
            name, x = self.model.tool[eid]
            if name == "assume_done" or name == "rerun" or (name == "reconcile" and x % 3 == 0):
                del self.model.open[eid]
                self.model.resolved.add(eid)
        return journal

    def _crash(self, power: tuple[str, int]) -> None:
        """The process dies, then a power cut of the drawn kind: drop the handle, lose what the
        cut loses, take back the model's effects of the records lost, reopen."""
        cut, cut_seed = power
        written = self._written()
        assert self.promised <= len(written)
        self.fs.crash(cut, random.Random(cut_seed))
        abandon(self.journal._log)
        kept = self._written()  # before walj's recovery: where FORMAT.md says the log ends
        n = len(kept)
        assert kept == written[:n], f"{cut}: what survived is not a prefix of what was written"
        assert n >= self.promised, (
            f"power cut ({cut}): records {n + 1}..{self.promised} were acknowledged as durable "
            f"({self.SYNC}) and are lost: {written[n:self.promised]}")
        if cut == "drop":
            assert n == self.promised, f"drop kept unsynced records {written[self.promised:n]}"
        elif cut == "keep":
            assert n == len(written), "a process death lost records"
        for mark, undo in reversed(self.undo):
            if self._undo_at(mark, written) > n:
                undo()
        self.undo.clear()
        self.promised = self.scanned = n
        TALLY.add(checked=n, records_cut=len(written) - n)
        self.model.live = None
        self.turn = None
        self.fs = FaultyFS(freeze_on_crash=True)
        self.journal = self._open()
        assert [(r.seq, r.data) for r in walj.read(self.path)][:n] == kept
        TALLY.add(faults=1 if cut == "keep" else 2)

    def teardown(self) -> None:
        try:
            self.journal.close()
        finally:
            time.time = self._real_time
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
        self.undo.append((("turn", seq), lambda: self._forget_turn(seq)))

    def _forget_turn(self, seq: int) -> None:
        """turn_started was lost: the turn never was (its number will be used again)."""
        turn = self.model.turns.pop(seq)
        assert turn.started == 0, "an intent outlived its turn_started"

    def _complete(self, seq: int) -> None:
        self.model.turns[seq].completed = True
        self._effect(lambda: setattr(self.model.turns[seq], "completed", False))

    @precondition(lambda self: self.turn is None)
    @rule(power=POWER)
    def crash_after_starting_a_turn(self, power: tuple[str, int]) -> None:
        """Entering a turn writes nothing (its turn_started rides with its first record): a
        crash then leaves no trace of it, and its number is used again."""
        before = self._written()
        turn = self.journal.turn()
        turn.__enter__()
        assert self._written() == before, "entering a turn wrote a record"
        self.fs.dead = True
        self._crash(power)

    @precondition(lambda self: self.turn is not None)
    @rule(point=st.integers(0, 3), power=POWER)
    def crash_while_completing_a_turn(self, point: int, power: tuple[str, int]) -> None:
        assert self.turn is not None and self.model.live is not None
        points = self._points(durable=False)
        op, after, outcome = points[point % len(points)]
        together = self._start_pending()
        self.fs.crash_at(op, 1, after=after)
        try:
            self.turn.__exit__(None, None, None)
        except SimulatedCrash:
            pass
        else:
            raise AssertionError("the crash point was not reached")
        self._acknowledged(last_unacknowledged=outcome == UNACKNOWLEDGED, together=together)
        if outcome != NOT_WRITTEN:
            self._complete(self.model.live)
        self._crash(power)

    @precondition(lambda self: self.turn is not None)
    @rule(crash=st.booleans(), power=POWER)
    def llm_call(self, crash: bool, power: tuple[str, int]) -> None:
        assert self.turn is not None
        pending = self.model.pending_llm
        try:
            with self.turn.llm_call(model="m", request={"q": 1}) as call:
                call_id = call.llm_call_id
                self._effect(lambda: pending.discard(call_id))  # llm_call_started lost
                if crash:
                    self.fs.dead = True
                    raise SimulatedCrash("while the LLM answers")
                call.finish({"a": 2})
        except SimulatedCrash:
            pending.add(call_id)
            self._acknowledged()
            self._crash(power)
        else:
            self._effect(lambda: pending.add(call_id))  # llm_call_finished lost: pending

    @precondition(lambda self: self.turn is not None)
    @rule(completed=st.booleans())
    def end_turn(self, completed: bool) -> None:
        assert self.turn is not None and self.model.live is not None
        if completed:
            self.turn.__exit__(None, None, None)
            self._complete(self.model.live)
        else:  # left by an exception: not completed (turn_started written, if still pending)
            self.turn.__exit__(LookupError, LookupError("the turn failed"), None)
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
            eid = result.execution_id
            self.model.finished.add(eid)
            self.model.seen.append(eid)
            self._effect(lambda: self.model.finished.discard(eid))  # the blocked record lost
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

    def _unstart(self, eid: str) -> None:
        """The intent was lost: the execution never began (its id stays unknown)."""
        del self.model.open[eid]
        turn = self.model.turns[self.model.turn_of[eid]]
        turn.started -= 1
        turn.unfinished -= 1

    def _unfinish(self, eid: str) -> None:
        """The terminal record was lost, the intent kept: the execution blocks."""
        self.model.finished.discard(eid)
        self.model.open[eid] = "started"
        self.model.turns[self.model.turn_of[eid]].unfinished += 1

    @precondition(lambda self: self.turn is not None)
    @rule(tool=st.sampled_from(TOOLS), behaviour=st.sampled_from(BEHAVIOURS),
          x=st.integers(0, 99), power=POWER)
    def dispatch(self, tool: str, behaviour: str, x: int, power: tuple[str, int]) -> None:
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
            self._acknowledged()  # the intent was durable before the handler ran
            self._crash(power)
        else:
            self.model.turns[self.model.turn_of[eid]].unfinished -= 1
            self.model.finished.add(eid)

    @precondition(lambda self: self.turn is not None)
    @rule(point=st.sampled_from(sorted(CRASH_POINTS)), tool=st.sampled_from(TOOLS),
          x=st.integers(0, 99), power=POWER)
    def crash_around_a_dispatch(self, point: str, tool: str, x: int,
                                power: tuple[str, int]) -> None:
        """A crash at one of the writes or syncs of a dispatch, then a power cut."""
        if self.model.blocked:
            return
        op, nth, after = CRASH_POINTS[point]
        together = self._start_pending()  # the intent's write carries the turn's turn_started
        self.fs.crash_at(op, nth, after=after)
        eid, exc = self._dispatch(tool, "ok", x)
        assert isinstance(exc, SimulatedCrash), point
        if point in ("before the intent is written", "before the intent is durable",
                     "after the intent is durable"):
            assert eid is None, "the handler ran before its intent was durable"
        else:
            assert eid is not None
        if point == "before the intent is written":
            self._acknowledged()
            self._crash(power)
            return
        if eid is None:
            eid = self._intent_on_disk_after_crash()
        self._started(eid, tool, x)
        self.model.open[eid] = "started"
        if point == "before the intent is durable":
            self._acknowledged(last_unacknowledged=True, together=together)
            self._effect(lambda: self._unstart(eid))
        elif point == "before the finish is durable":
            self._acknowledged(last_unacknowledged=True)
            self._finished(eid)
            self._effect(lambda: self._unfinish(eid))
        elif point == "after the finish is durable":
            self._acknowledged()
            self._finished(eid)
        else:
            self._acknowledged()
        self._crash(power)

    def _finished(self, eid: str) -> None:
        del self.model.open[eid]
        self.model.turns[self.model.turn_of[eid]].unfinished -= 1
        self.model.finished.add(eid)

    def _intent_on_disk_after_crash(self) -> str:
        """The id of the last intent in the log (the handler never saw it)."""
        last = None
        for _, data in self._written():
            if data.get("kind") == "tool_execution_started":
                last = data["execution_id"]
        assert last is not None and last not in self.model.tool
        return str(last)

    @rule(power=POWER)
    def crash_between_steps(self, power: tuple[str, int]) -> None:
        self._crash(power)

    @precondition(lambda self: self.SYNC == "interval")
    @rule()
    def interval_tick(self) -> None:
        """One interval of the background syncer ends: what was appended is durable."""
        tick(self.journal._log)
        self._acknowledged()
        self.promised = self.scanned

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
    @rule(data=st.data(), point=st.integers(0, 3), power=POWER)
    def crash_while_resolving(self, data: st.DataObject, point: int,
                              power: tuple[str, int]) -> None:
        eid = data.draw(st.sampled_from([e for e in self.model.seen if e in self.model.open]))
        points = self._points(durable=True)
        op, after, outcome = points[point % len(points)]
        together = self._start_pending()
        self.fs.crash_at(op, 1, after=after)
        try:
            self.journal.resolve(eid, "not_performed", actor="tester")
        except SimulatedCrash:
            pass
        else:
            raise AssertionError("the crash point was not reached")
        self._acknowledged(last_unacknowledged=outcome == UNACKNOWLEDGED, together=together)
        if outcome != NOT_WRITTEN:
            state = self.model.open.pop(eid)
            self.model.resolved.add(eid)

            def unresolve() -> None:
                self.model.resolved.discard(eid)
                self.model.open[eid] = state

            self._effect(unresolve)
        self._crash(power)

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
        self._acknowledged()  # the step returned: every write it made was acknowledged
        recovery = self.journal.recovery
        assert all(cut.explained for cut in recovery.cuts), recovery.cuts
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


def machine_in(sync: str) -> type[JournalMachine]:
    machine = type(f"JournalMachine_{sync}", (JournalMachine,), {"SYNC": sync})
    machine.TestCase.settings = settings(
        # "always", as before; each other mode a little under half as many runs.
        max_examples=scaled(120 if sync == "always" else 50), stateful_step_count=40,
        deadline=None, database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    return machine


TestJournalModelAlways = seed(SEED)(machine_in("always")).TestCase
TestJournalModelBatch = seed(SEED)(machine_in("batch")).TestCase
TestJournalModelInterval = seed(SEED)(machine_in("interval")).TestCase
TestJournalModelNever = seed(SEED)(machine_in("never")).TestCase


def _drive(sync: str, steps: Callable[[JournalMachine], None]) -> JournalMachine:
    machine = machine_in(sync)()
    try:
        steps(machine)
        machine.recovery_matches_the_model()
    except BaseException:
        machine.teardown()
        raise
    return machine


@pytest.mark.parametrize("sync", ["interval", "never"])
def test_a_power_cut_that_loses_turn_completed_leaves_a_turn_with_tools_interrupted(
        sync: str) -> None:
    """turn_completed is written without a sync: a power cut right after it may lose it, and
    the turn, which dispatched a tool, then blocks as interrupted. The model takes the lost
    completion back, and agrees."""

    def steps(m: JournalMachine) -> None:
        m.start_turn()
        m.dispatch("plain", "ok", 5, ("keep", 0))
        m.recovery_matches_the_model()
        m.end_turn(True)
        m.recovery_matches_the_model()
        m.crash_between_steps(("drop", 0))

    machine = _drive(sync, steps)
    try:
        blockers = machine.journal.recovery.blockers
        assert [(b.state, b.turn_sequence) for b in blockers] == [("interrupted_turn", 1)]
    finally:
        machine.teardown()


@pytest.mark.parametrize("sync", ["always", "batch", "interval"])
def test_an_interval_tick_or_a_synced_append_keeps_turn_completed(sync: str) -> None:
    """The same, with the completion made durable first (by the append itself, or by an
    interval of the syncer): nothing blocks after the power cut."""

    def steps(m: JournalMachine) -> None:
        m.start_turn()
        m.dispatch("plain", "ok", 5, ("keep", 0))
        m.end_turn(True)
        m.recovery_matches_the_model()
        if sync == "interval":
            m.interval_tick()
        m.recovery_matches_the_model()
        m.crash_between_steps(("drop", 0))

    machine = _drive(sync, steps)
    try:
        assert machine.journal.recovery.blockers == ()
    finally:
        machine.teardown()
