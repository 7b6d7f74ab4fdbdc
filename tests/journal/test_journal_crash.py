"""The SIGKILL crash matrix: a child process runs a real turn and is killed at each point."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from journal_helpers import Recorder, records

import walj
from walj.journal import records as rc

ROOT = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).resolve().parent / "journal_crash_child.py"
HANG_GUARD = 60.0  # seconds; only stops a broken child from hanging the run


def run_and_kill(path: Path, effects: Path, point: str, *extra: str,
                 script: Path = CHILD) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    child = subprocess.Popen([sys.executable, str(script), str(path), str(effects), point,
                              *extra],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             cwd=ROOT, env=env)
    assert child.stdout is not None
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(child.stdout, selectors.EVENT_READ)
            assert selector.select(HANG_GUARD), "the child never reached its kill point"
            line = child.stdout.readline()
        assert line.strip() == f"AT {point}", (line, child.stderr.read() if child.stderr else "")
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
        if child.stderr is not None:
            child.stderr.close()
    assert child.returncode == -signal.SIGKILL


def effect_lines(effects: Path) -> list[str]:
    return effects.read_text().splitlines() if effects.exists() else []


@pytest.mark.parametrize("point,expected", [
    ("before_intent", []),
    ("after_intent", ["started"]),
    ("in_handler", ["started"]),
    ("after_finished", ["interrupted_turn"]),
    ("after_turn_completed", []),
])
def test_sigkill_matrix(tmp_path: Path, point: str, expected: list[str]) -> None:
    path, effects = tmp_path / "journal", tmp_path / "effects.txt"
    run_and_kill(path, effects, point)

    handler = Recorder()
    with walj.ToolJournal.open(path, tools={"send": handler}) as journal:
        recovery = journal.recovery
        assert [b.state for b in recovery.blockers] == expected
        assert recovery.blocked == bool(expected)
        ran = effect_lines(effects)
        if point in ("before_intent", "after_intent"):
            assert ran == []  # the handler never ran
        else:
            assert len(ran) == 1
        if expected == ["started"]:
            [blocker] = recovery.blockers
            assert (blocker.tool, blocker.call_id, blocker.turn_sequence) == ("send", "c1", 1)
            if ran:  # the key the handler saw is the key recovery reports after the restart
                assert ran[0].split()[1] == blocker.idempotency_key
        if point == "after_finished":
            assert recovery.blockers[0].turn_sequence == 1
        if point == "before_intent":
            # turn_started is written with the turn's first intent: killed before it, the
            # turn left no record at all.
            assert recovery.incomplete_turns == ()
            assert recovery.records == 0

        with journal.turn() as turn:
            result = turn.dispatch("send", {"to": "bob@example.com"})
        if expected:
            assert result.outcome == "blocked" and handler.calls == []
            ids = [e["execution_id"] for e in result.output["ambiguous_executions"]]
            assert ids == [b.execution_id for b in recovery.blockers]
        else:
            assert result.outcome == "ok" and handler.calls == [{"to": "bob@example.com"}]

    kinds = [r["kind"] for r in records(path)]
    if expected:
        assert kinds[-3:] == [rc.TURN_STARTED, rc.BLOCKED, rc.TURN_COMPLETED]


@pytest.mark.parametrize("point", ["after_turn_completed", "in_handler"])
def test_a_call_is_replayed_or_blocked_after_a_sigkill(tmp_path: Path, point: str) -> None:
    """Killed once its outcome was durable, the call is answered from its record; killed in
    its handler, it is its own blocker until resolved, and then answered from the resolution.
    Its handler never runs a second time."""
    path, effects = tmp_path / "journal", tmp_path / "effects.txt"
    run_and_kill(path, effects, point, "store_outputs")
    handler = Recorder()
    with walj.ToolJournal.open(path, tools={"send": handler}) as journal:
        with journal.turn() as turn:
            first = turn.dispatch("send", {"to": "ann@example.com"}, call_id="c1")
        if point == "in_handler":
            assert first.outcome == "blocked" and not first.replayed
            journal.resolve(journal.recovery.blockers[0].execution_id or "", "succeeded",
                            actor="ann", note="in the sent folder")
            with journal.turn() as turn:
                first = turn.dispatch("send", {"to": "ann@example.com"}, call_id="c1")
            assert first.output["status"] == "already_done"
        else:
            assert first.output == "sent"
    assert first.replayed and first.outcome == "ok"
    assert handler.calls == [] and len(effect_lines(effects)) == 1
