"""The recovery rebuild as a pure function over records: pairing, blockers, versions, and the
byte fast path agreeing with the decoded path."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from walj._codec import encode
from walj.errors import CorruptionError, UnsupportedVersionError
from walj.journal import records as rc
from walj.journal.state import JournalState, rebuild

ROOT = Path(__file__).resolve().parents[2]
T = 1700000000.0  # one timestamp for everything: pairing must not depend on time


def turn_started(n: int) -> dict[str, Any]:
    return {"kind": rc.TURN_STARTED, "version": 2, "turn_sequence": n, "at": T}


def turn_completed(n: int) -> dict[str, Any]:
    return {"kind": rc.TURN_COMPLETED, "version": 2, "turn_sequence": n, "at": T}


def started(eid: str, turn: int, tool: str = "send") -> dict[str, Any]:
    return {"kind": rc.STARTED, "version": 2, "execution_id": eid, "at": T,
            "turn_sequence": turn, "tool": tool, "call_id": "c-" + eid[:4],
            "arguments_sha256": "s" * 64, "idempotency_key": "i" * 32,
            "arguments_preview": "{}", "arguments_length": 2}


def finished(eid: str, outcome: str = "ok") -> dict[str, Any]:
    return {"kind": rc.FINISHED, "version": 2, "execution_id": eid, "at": T, "outcome": outcome}


def eid(n: int) -> str:
    return f"{n:032x}"


def build(records: list[dict[str, Any]], as_bytes: bool = False) -> JournalState:
    pairs = [(i, encode(r) if as_bytes else r) for i, r in enumerate(records, 1)]
    return rebuild(pairs)


@pytest.mark.parametrize("as_bytes", [False, True])
def test_later_completed_turn_does_not_hide_an_older_interrupted_turn(as_bytes: bool) -> None:
    records = [
        turn_started(1), started(eid(1), 1), finished(eid(1)),  # turn 1 never completes
        turn_started(2), turn_completed(2),  # identical timestamps throughout
    ]
    recovery = build(records, as_bytes).snapshot()
    assert recovery.blocked
    assert [(b.state, b.turn_sequence) for b in recovery.blockers] == [("interrupted_turn", 1)]
    assert [t.turn_sequence for t in recovery.incomplete_turns] == [1]


@pytest.mark.parametrize("as_bytes", [False, True])
def test_started_without_terminal_blocks_and_ambiguous_is_explicit(as_bytes: bool) -> None:
    records = [
        turn_started(1), started(eid(1), 1), finished(eid(1)), started(eid(2), 1),
        {"kind": rc.AMBIGUOUS, "version": 2, "execution_id": eid(2), "at": T,
         "error_type": "KeyboardInterrupt"},
        started(eid(3), 1),
    ]
    recovery = build(records, as_bytes).snapshot()
    states = [(b.execution_id, b.state) for b in recovery.blockers]
    assert states == [(eid(2), "ambiguous"), (eid(3), "started")]
    assert recovery.blockers[0].error_type == "KeyboardInterrupt"
    # The turn's interruption is carried by its execution blockers, not a second blocker.
    assert all(b.state != "interrupted_turn" for b in recovery.blockers)
    assert recovery.blockers[1].tool == "send" and recovery.blockers[1].turn_sequence == 1


def test_interrupted_turn_without_tools_is_reported_but_does_not_block() -> None:
    recovery = build([turn_started(1), turn_started(2), turn_completed(2)]).snapshot()
    assert not recovery.blocked
    assert [(t.turn_sequence, t.tool_bearing) for t in recovery.incomplete_turns] == [(1, False)]


def test_resolutions_settle_executions_and_turns() -> None:
    records = [
        turn_started(1), started(eid(1), 1),
        {"kind": rc.RESOLVED, "version": 2, "execution_id": eid(1), "at": T,
         "outcome": "succeeded", "actor": "ann", "note": "checked", "output": {"sent": True}},
        finished(eid(1)),  # a stray second terminal record changes nothing
        turn_started(2), started(eid(2), 2), finished(eid(2)),
        {"kind": rc.TURN_RESOLVED, "version": 2, "turn_sequence": 2, "at": T, "actor": "bob",
         "note": None},
    ]
    recovery = build(records).snapshot()
    assert not recovery.blocked
    assert [(r.kind, r.outcome, r.actor) for r in recovery.resolved] == [
        ("execution", "succeeded", "ann"), ("turn", "resolved", "bob")]
    assert recovery.resolved[0].output == {"sent": True}


def test_pending_llm_calls_are_reported_and_block_only_on_request() -> None:
    records = [
        turn_started(1),
        {"kind": rc.LLM_STARTED, "version": 2, "llm_call_id": eid(7), "at": T,
         "turn_sequence": 1, "model": "m"},
        {"kind": rc.LLM_STARTED, "version": 2, "llm_call_id": eid(8), "at": T,
         "turn_sequence": 1, "model": "m"},
        {"kind": rc.LLM_FINISHED, "version": 2, "llm_call_id": eid(8), "at": T, "outcome": "ok"},
    ]
    state = build(records)
    assert not state.snapshot().blocked
    assert [c.llm_call_id for c in state.snapshot().pending_llm_calls] == [eid(7)]
    strict = state.snapshot(block_on_pending_llm_calls=True)
    assert [(b.execution_id, b.state) for b in strict.blockers] == [(eid(7), "pending_llm_call")]
    assert state.is_blocked(block_on_pending_llm_calls=True)


def test_live_work_is_not_a_blocker() -> None:
    state = build([turn_started(1), started(eid(1), 1)])
    assert state.snapshot().blocked
    assert not state.snapshot(live_executions={eid(1)}, live_turn=1).blocked
    assert not state.is_blocked(live_executions={eid(1)}, live_turn=1)


@pytest.mark.parametrize("version", [0, 1, rc.CONTRACT_VERSION + 1, "1", "2", None, True, 1.0, 2.0])
@pytest.mark.parametrize("as_bytes", [False, True])
def test_unknown_contract_version_is_refused(version: object, as_bytes: bool) -> None:
    record = started(eid(1), 1)
    record["version"] = version
    with pytest.raises(UnsupportedVersionError) as info:
        build([turn_started(1), record], as_bytes)
    assert info.value.seq == 2


# Records exactly as walj 0.1 wrote them: contract version 1, short keys, no `version`.
V1_TURN_STARTED = {"k": rc.TURN_STARTED, "v": 1, "turn": 1, "t": T}
V1_STARTED = {"k": rc.STARTED, "v": 1, "id": eid(1), "t": T, "turn": 1, "tool": "send",
              "call": "c-0000", "sha": "s" * 64, "ik": "i" * 32, "ap": "{}", "al": 2}


@pytest.mark.parametrize("records", [[V1_TURN_STARTED], [turn_started(1), V1_STARTED]],
                         ids=["turn_started", "tool_execution_started"])
@pytest.mark.parametrize("as_bytes", [False, True])
def test_a_version_1_record_is_refused(records: list[dict[str, Any]], as_bytes: bool) -> None:
    assert "version" not in records[-1] and records[-1]["v"] == 1
    with pytest.raises(UnsupportedVersionError) as info:
        build(records, as_bytes)
    assert info.value.seq == len(records)
    assert "has contract version 1;" in str(info.value)


@pytest.mark.parametrize("record", [{"kind": "mystery", "version": 2}, {"version": 2}, [1, 2],
                                    "x"])
def test_unknown_kinds_and_non_objects_are_refused(record: Any) -> None:
    with pytest.raises(CorruptionError):
        rebuild([(1, record)])


def test_bad_json_bytes_are_corruption() -> None:
    with pytest.raises(CorruptionError):
        rebuild([(1, b"{not json")])


def test_memory_follows_open_work_not_the_log() -> None:
    state = JournalState()
    seq = 0
    for n in range(1, 2001):
        for record in (turn_started(n), started(eid(n), n), finished(eid(n)), turn_completed(n)):
            seq += 1
            state.feed(seq, encode(record))
    assert state.records == 8000 and state.max_turn == 2000
    assert not state.executions and not state.turns and not state.turn_stack


# One operation of a journal-shaped random history.
operations = st.lists(st.sampled_from(
    ["turn", "complete", "start", "finish", "ambiguous", "resolve", "llm", "llm_done", "blocked",
     "resolve_turn"]), max_size=60)


def history(ops: list[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    turns: list[int] = []
    open_ids: list[str] = []
    llm: list[str] = []
    n = 0
    for op in ops:
        n += 1
        if op == "turn":
            turns.append(n)
            out.append(turn_started(n))
        elif op == "complete" and turns:
            out.append(turn_completed(turns.pop()))
        elif op == "start" and turns:
            open_ids.append(eid(n))
            out.append(started(eid(n), turns[-1]))
        elif op == "finish" and open_ids:
            out.append(finished(open_ids.pop(0), "error"))
        elif op == "ambiguous" and open_ids:
            out.append({"kind": rc.AMBIGUOUS, "version": 2, "execution_id": open_ids[-1],
                        "at": T, "error_type": "X"})
        elif op == "resolve" and open_ids:
            out.append({"kind": rc.RESOLVED, "version": 2, "execution_id": open_ids.pop(),
                        "at": T, "outcome": "failed", "actor": "a", "note": "n"})
        elif op == "resolve_turn" and turns:
            out.append({"kind": rc.TURN_RESOLVED, "version": 2, "turn_sequence": turns[0],
                        "at": T, "actor": "a", "note": None})
        elif op == "llm":
            llm.append(eid(n))
            out.append({"kind": rc.LLM_STARTED, "version": 2, "llm_call_id": eid(n), "at": T,
                        "turn_sequence": None, "model": None})
        elif op == "llm_done" and llm:
            out.append({"kind": rc.LLM_FINISHED, "version": 2, "llm_call_id": llm.pop(),
                        "at": T, "outcome": "ok"})
        elif op == "blocked" and turns:
            out.append({"kind": rc.BLOCKED, "version": 2, "execution_id": eid(n), "at": T,
                        "turn_sequence": turns[-1], "tool": "x", "blocked_by": [],
                        "blocked_by_turns": []})
    return out


@given(operations)
@example(["turn", "start"])
@example(["turn", "start", "finish", "turn", "complete"])
@example(["turn", "start", "ambiguous", "resolve", "turn", "start", "complete", "llm"])
@settings(max_examples=200, deadline=None)
def test_byte_fast_path_agrees_with_decoded_records(ops: list[str]) -> None:
    records = history(ops)
    assert build(records, True).snapshot(block_on_pending_llm_calls=True) == build(
        records).snapshot(block_on_pending_llm_calls=True)


def test_recovery_and_fingerprint_need_only_the_standard_library(tmp_path: Path) -> None:
    """The forensic tool imports these two modules where nothing else is installed."""
    script = textwrap.dedent(f"""
        import sys, types
        for name in ("msgspec", "xxhash", "filelock"):
            sys.modules[name] = None  # makes `import name` fail as if it were not installed
        for name, folder in (("walj", "walj"), ("walj.journal", "walj/journal")):
            package = types.ModuleType(name)  # the folder alone, not its __init__'s imports
            package.__path__ = [str({str(ROOT)!r} + "/" + folder)]
            sys.modules[name] = package
        from walj.journal import state as journal_state, _fingerprint
        state = journal_state.rebuild([
            (1, b'{{"kind":"turn_started","version":2,"turn_sequence":1,"at":1.0}}'),
            (2, {{"kind": "tool_execution_started", "version": 2, "execution_id": "a" * 32,
                 "at": 1.0, "turn_sequence": 1, "tool": "t",
                 "arguments_sha256": _fingerprint.sha256_text(
                     _fingerprint.canonical_json({{"x": 1}}))}}),
        ])
        print(state.snapshot().blockers[0].state)
        print(sorted(m for m in sys.modules if m.startswith("walj")))
    """)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-I", "-c", script], capture_output=True, text=True,
                         env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "started"
    assert lines[1] == str(sorted([
        "walj", "walj.journal", "walj.journal._applied", "walj.journal._approvalbook",
        "walj.journal.state",
        "walj.journal._records", "walj.journal.records",
        "walj.journal._damage", "walj.journal._fingerprint",
        "walj.journal._callindex", "walj.journal._openwork", "walj.journal._checkpoint",
        "walj.journal._snapshot", "walj._codec", "walj.errors"]))
