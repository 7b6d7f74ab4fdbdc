"""The state rebuilt from a checkpoint equals the state rebuilt from the whole history: random
journal histories (turns, ok, failing and ambiguous calls, repeated call ids, interrupted turns,
LLM calls, resolutions, checkpoints), each rebuilt both ways and compared field by field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import walj
from walj.journal import records as rc
from walj.journal._checkpoint_parts import settling_record
from walj.journal.state import JournalState, rebuild


class Stop(Exception):
    """Leaves a turn without completing it: an interrupted turn."""


def ok(**arguments: Any) -> dict[str, Any]:
    return {"echo": arguments}


def fails(**arguments: Any) -> None:
    raise ValueError("refused by the far side")


def unknown(**arguments: Any) -> None:
    raise walj.ToolOutcomeUnknown("connection lost after the request went out")


TOOLS = {"ok": ok, "fails": fails, "unknown": unknown}

calls = st.lists(st.tuples(st.sampled_from(["ok", "ok", "fails", "unknown"]),
                           st.one_of(st.none(), st.sampled_from([f"c{i}" for i in range(6)])),
                           st.integers(0, 2)), min_size=1, max_size=3)
operations = st.lists(st.one_of(
    st.tuples(st.just("turn"), calls),
    st.tuples(st.just("interrupted_turn"), calls),
    st.tuples(st.just("llm"), st.booleans()),
    st.tuples(st.just("resolve"), st.sampled_from(["succeeded", "failed", "not_performed"])),
    st.tuples(st.just("resolve_turn"), st.none()),
    st.tuples(st.just("checkpoint"), st.none()),
), min_size=1, max_size=14)


def _run(journal: walj.ToolJournal, op: str, arg: Any) -> None:
    if op in ("turn", "interrupted_turn"):
        try:
            with journal.turn() as turn:
                for tool, call_id, value in arg:
                    try:
                        turn.dispatch(tool, {"v": value}, call_id=call_id)
                    except (walj.ToolOutcomeUnknown, walj.ToolBlocked, ValueError):
                        pass
                if op == "interrupted_turn":
                    raise Stop
        except Stop:
            pass
    elif op == "llm":
        call = journal.llm_call(model="m", request={"q": 1})
        call.__enter__()
        if arg:
            call.finish({"a": 1})
            call.__exit__(None, None, None)
    elif op == "resolve":
        blockers = [b for b in journal.recovery.blockers if b.execution_id and b.tool]
        if blockers:
            note = "checked by hand" if arg == "failed" else None
            journal.resolve(blockers[0].execution_id, arg, actor="ann", note=note)
    elif op == "resolve_turn":
        turns = [b.turn_sequence for b in journal.recovery.blockers
                 if b.state == rc.STATE_INTERRUPTED_TURN]
        if turns:
            journal.resolve_turn(turns[0], actor="ann", note="looked")
    elif op == "checkpoint":
        journal.checkpoint()


def _answer(records: dict[int, dict[str, Any]], call_id: str, seq: int) -> dict[str, Any]:
    """What replay would answer a call id from: the settling record, wherever it sits."""
    record = records[seq]
    if record.get("kind") == rc.CHECKPOINT:
        carried = settling_record(record, call_id)
        assert carried is not None
        return carried[0]
    return record


def view(state: JournalState, records: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Everything an open takes from a rebuild, with each settled call's answer resolved."""
    return {
        "recovery": state.snapshot(),
        "settled": [(call_id, sha, _answer(records, call_id, seq))
                    for call_id, (sha, seq) in state.calls.settled.items()],
        "filter": state.calls.filter_bytes(),
        # The open turn each execution counts in (a link to a turn already completed is never
        # read again, so a checkpoint does not carry it).
        "executions": {eid: (e.record, e.seq, e.turn, e.state, e.error_type,
                             e.reconcile_error, e.open_turn.seq if e.open_turn is not None
                             and state.turns.get(e.turn) is e.open_turn else None)
                       for eid, e in state.executions.items()},
        "turns": {n: (t.seq, t.started_at, t.started, t.unfinished, t.resolved)
                  for n, t in state.turns.items()},
        "turn_stack": state.turn_stack, "turn_starts": list(state.turn_starts),
        "top": state.top.sequence if state.top else None,
        "max_turn": state.max_turn, "paired_turn": state.paired_turn,
        "llm_calls": state.llm_calls, "blocking": state.blocking_llm_calls,
        "ended_seq": state.ended_seq, "session_id": state.session_id,
        "cuts": state.cuts.cuts, "damage": state.cuts.damage,
    }


def _both_ways(path: Path, replay_window: int) -> list[dict[str, Any]]:
    records = [(r.seq, r.data) for r in walj.read(path)]
    by_seq = dict(records)
    full = view(rebuild(records, replay_window), by_seq)
    starts = [seq for seq, data in records
              if data.get("kind") == rc.CHECKPOINT and data.get("part") == 0]
    assert starts, "every history ends with a checkpoint"
    for start in starts:
        from_checkpoint = rebuild([(s, d) for s, d in records if s >= start], replay_window)
        assert from_checkpoint.from_checkpoint == start
        assert view(from_checkpoint, by_seq) == full, f"from the checkpoint at {start}"
    return [full]


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(history=operations, window=st.sampled_from([2, 10_000]))
def test_a_checkpoint_rebuilds_what_the_whole_history_does(
        tmp_path_factory: Any, history: list[tuple[str, Any]], window: int) -> None:
    path = tmp_path_factory.mktemp("j") / "session"
    with walj.ToolJournal.open(path, tools=TOOLS, store_outputs=True, replay_window=window,
                               sync="never", checkpoint_every=None) as journal:
        for op, arg in history:
            _run(journal, op, arg)
        journal.checkpoint()
        live = journal._core.state
    full = _both_ways(path, window)[0]
    # The live state equals the replay, and a reopen (which starts at the last checkpoint)
    # rebuilds the same.
    assert view(live, {r.seq: r.data for r in walj.read(path)}) == full
    with walj.ToolJournal.open(path, tools=TOOLS, store_outputs=True, replay_window=window,
                               sync="never", checkpoint_every=None) as reopened:
        assert reopened._core.state.from_checkpoint is not None
        records = {r.seq: r.data for r in walj.read(path)}
        assert view(reopened._core.state, records) == full


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(history=operations, window=st.sampled_from([2, 10_000]), keep=st.sampled_from([0, 1, 3]),
       more=operations)
def test_after_compaction_the_live_state_equals_every_rebuild(
        tmp_path_factory: Any, history: list[tuple[str, Any]], window: int, keep: int,
        more: list[tuple[str, Any]]) -> None:
    """Compaction drops what the checkpoint covers: the live journal, a rebuild of what is
    left (from the base, as the CLI reads it) and a reopen agree, before and after more work."""
    path = tmp_path_factory.mktemp("j") / "session"
    options: dict[str, Any] = {"tools": TOOLS, "store_outputs": True, "replay_window": window,
                               "sync": "never", "checkpoint_every": None, "segment_bytes": 1024}
    with walj.ToolJournal.open(path, **options) as journal:
        for op, arg in history:
            _run(journal, op, arg)
        before = journal.recovery
        journal.compact(keep_turns=keep)
        assert journal.recovery.blockers == before.blockers
        for op, arg in more:
            _run(journal, op, arg)
        live = journal._core.state
    records = {r.seq: r.data for r in walj.read(path)}
    rebuilt = view(rebuild(list(records.items()), window), records)
    assert view(live, records) == rebuilt
    with walj.ToolJournal.open(path, **options) as reopened:
        assert view(reopened._core.state, records) == rebuilt
