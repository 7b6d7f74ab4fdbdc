"""ToolJournal.end(): a durable session_ended record, every segment sealed, an ended session
refusing new work on reopen while its blockers stay visible and resolvable."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import spec_reader
from cli_helpers import TOOLS, make_journal, walj_cli
from helpers import segments

import walj
from walj.errors import SessionEndedError, TurnError
from walj.journal import records as rc


def _last_line(path: Path) -> dict[str, object]:
    value: dict[str, object] = json.loads(segments(path)[-1].read_bytes().splitlines()[-1])
    return value


def test_end_records_session_ended_and_seals_every_segment(tmp_path: Path) -> None:
    path = tmp_path / "s"
    make_journal(path, turns=1, segment_bytes=1024)
    journal = walj.ToolJournal.open(path, tools=TOOLS, segment_bytes=1024)
    assert not journal.ended
    journal.end()
    journal.end()  # idempotent
    assert journal.closed and journal.ended
    assert "seal" in _last_line(path)
    records = [r.data for r in walj.read(path)]
    assert records[-1]["kind"] == "session_ended" and records[-1]["version"] == rc.CONTRACT_VERSION
    assert spec_reader.read_records(path)[-1][1] == records[-1]
    # every segment is sealed: a drop keeps only the active one a reopen makes
    with walj.Log.open(path, segment_bytes=1024) as log:
        sealed = len(segments(path)) - 1
        assert log.drop_before(log.last_seq + 1) == sealed


def test_a_reopened_ended_session_refuses_new_work_and_stays_sealed(tmp_path: Path) -> None:
    path = tmp_path / "s"
    make_journal(path, turns=1)
    with walj.ToolJournal.open(path, tools=TOOLS) as journal:
        journal.end()
    with walj.ToolJournal.open(path, tools=TOOLS) as journal:
        assert journal.ended and journal.recovery.ended and not journal.is_blocked()
        with pytest.raises(SessionEndedError), journal.turn():
            pass
        with pytest.raises(SessionEndedError):
            journal.llm_call(model="m")
    assert "seal" in _last_line(path)  # closing an ended session seals what the reopen began
    assert walj.verify(path).ok
    run = walj_cli("sweep", tmp_path, "--json")
    assert run.code == 0 and run.json()["sessions"][0]["status"] == "ended"


def test_a_blocked_session_may_end_and_its_blockers_stay_visible(tmp_path: Path) -> None:
    path = tmp_path / "s"
    eid = make_journal(path, turns=1, blocked=True)
    with walj.ToolJournal.open(path, tools=TOOLS) as journal:
        assert journal.is_blocked()
        journal.end()
    sweep = walj_cli("sweep", tmp_path, "--json").json()["sessions"][0]
    assert sweep["status"] == "blocked" and sweep["ended"] is True
    with walj.ToolJournal.open(path, tools=TOOLS) as journal:
        assert journal.ended and [b.execution_id for b in journal.recovery.blockers] == [eid]
        journal.resolve(eid, "not_performed", note="checked by hand", actor="tester")
        assert not journal.is_blocked()
    assert "seal" in _last_line(path)
    sweep = walj_cli("sweep", tmp_path, "--json").json()["sessions"][0]
    assert sweep["status"] == "ended"


def test_end_refuses_while_a_turn_is_live(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with walj.ToolJournal.open(path, tools=TOOLS) as journal, journal.turn() as turn:
        turn.dispatch("lookup", {"order_id": "A-1"})
        with pytest.raises(TurnError):
            journal.end()
    with walj.ToolJournal.open(path, tools=TOOLS) as journal:
        assert not journal.ended


def test_a_compacted_journal_is_refused_not_rebuilt_from_its_base(tmp_path: Path) -> None:
    """Records before the base are gone; an execution started there would be missed."""
    path = tmp_path / "s"
    make_journal(path, turns=2, segment_bytes=1024)
    with walj.ToolJournal.open(path, tools=TOOLS, segment_bytes=1024) as journal:
        journal.end()
    with walj.Log.open(path, segment_bytes=1024) as log:
        assert log.drop_before(log.last_seq) > 0
        first = log.first_seq
    before = sorted(p.name for p in path.iterdir())
    with pytest.raises(walj.WaljError, match="compacted"):
        walj.ToolJournal.open(path, tools=TOOLS, segment_bytes=1024)
    assert sorted(p.name for p in path.iterdir()) == before
    assert next(iter(walj.read(path))).seq == first
