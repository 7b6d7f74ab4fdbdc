"""SIGKILL around an approved call: a real child process asks, is approved and runs one call
that needs approval, and is killed after the approval is durable, after the intent that
consumes it, or after the call finished. The call runs at most once, only with the approved
arguments, and a call resolved not_performed after the kill needs a new approval."""

from __future__ import annotations

from pathlib import Path

import pytest
from journal_helpers import Recorder
from test_journal_crash import effect_lines, run_and_kill

import walj

CHILD = Path(__file__).resolve().parent / "approvals_crash_child.py"


def _send(journal: walj.ToolJournal, to: str = "ann@example.com") -> walj.ToolResult:
    with journal.turn() as turn:
        return turn.dispatch("send", {"to": to}, call_id="c1")


@pytest.mark.parametrize("point", ["after_approval", "after_intent", "after_finished"])
def test_an_approved_call_runs_at_most_once_and_only_as_approved_after_a_sigkill(
        tmp_path: Path, point: str) -> None:
    path, effects = tmp_path / "journal", tmp_path / "effects.txt"
    run_and_kill(path, effects, point, script=CHILD)
    ran_before = effect_lines(effects)
    assert ran_before == ([] if point != "after_finished" else ["ann@example.com"])
    send = Recorder("sent")
    with walj.ToolJournal.open(path, tools={"send": walj.Tool(send, approval=True)},
                               store_outputs=True) as journal:
        (asked,) = [a.approval_id for a in journal.recovery.approved] or [None]
        if point == "after_approval":  # approved, not consumed: other arguments never run
            assert asked is not None
            assert _send(journal, "eve@example.com").outcome == "refused"
            ran = _send(journal)
            assert (ran.outcome, ran.approval_id) == ("ok", asked)
        elif point == "after_intent":  # consumed by an intent that never finished
            assert asked is None and journal.is_blocked()
            (blocker,) = journal.recovery.blockers
            assert blocker.call_id == "c1"
            assert _send(journal).outcome == "blocked"
            journal.resolve(blocker.execution_id, "not_performed", actor="ann@ops")
            again = _send(journal)
            assert again.outcome == "awaiting_approval"  # a new approval, not the used one
            journal.approve(again.approval_id, actor="ann@ops")
            assert _send(journal).outcome == "ok"
        else:  # settled: answered from its record
            assert asked is None
            assert _send(journal).replayed
        assert _send(journal).replayed
    assert len(ran_before) + len(send.calls) == 1
    assert all(call == {"to": "ann@example.com"} for call in send.calls)
