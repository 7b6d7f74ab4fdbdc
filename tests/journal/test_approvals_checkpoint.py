"""Approvals across checkpoints and compaction: a checkpoint carries the pending requests, the
unconsumed approvals and the denied ones, so they survive a compaction and a reopen and an
approval is still consumed exactly once; a log of contract version 6 still opens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from journal_helpers import Recorder, interrupted, records

import walj
from walj.journal import records as rc
from walj.journal.state import rebuild


def _send(journal: walj.ToolJournal, call_id: str, to: str = "ann") -> walj.ToolResult:
    with journal.turn() as turn:
        return turn.dispatch("send", {"to": to}, call_id=call_id)


def _open(path: Path, send: Recorder) -> walj.ToolJournal:
    return walj.ToolJournal.open(path, tools={"send": walj.Tool(send, approval=True)},
                                 store_outputs=True)


def _replayed(path: Path) -> walj.Recovery:
    return rebuild((r.seq, r.data) for r in walj.read(path)).snapshot()


def test_approvals_survive_checkpoint_compaction_and_reopen_and_are_consumed_once(
        tmp_path: Path) -> None:
    path, send = tmp_path / "j", Recorder("sent")
    with _open(path, send) as journal:
        ids = {c: _send(journal, c).approval_id for c in ("c1", "c2", "c3", "c4")}
        journal.approve(ids["c1"], actor="ann@ops", note="fine")
        journal.deny(ids["c3"], actor="ann@ops", note="no")
        journal.approve(ids["c4"], actor="ann@ops")
        assert _send(journal, "c4").outcome == "ok"  # consumed before the checkpoint
        first = journal.checkpoint()
        whole = rebuild((r.seq, r.data) for r in walj.read(path)).approvals.entries
        carried = rebuild((r.seq, r.data) for r in walj.read(path, first)).approvals.entries
        assert carried == {k: v for k, v in whole.items() if v.status != "consumed"}
        assert len(carried) == 3 and len(whole) == 4
        report = journal.compact()
        assert report is not None
        assert next(iter(walj.read(path))).seq > 1  # the requests' records are gone
        live = journal.recovery
        assert (live.approvals, live.approved) == (_replayed(path).approvals,
                                                   _replayed(path).approved)
    with _open(path, send) as journal:
        approved = journal.approval(ids["c1"])
        assert (approved.status, approved.actor, approved.note) == ("approved", "ann@ops",
                                                                    "fine")
        assert [a.approval_id for a in journal.recovery.approvals] == [ids["c2"]]
        assert _send(journal, "c2").approval_id == ids["c2"]  # still pending, nothing new
        assert _send(journal, "c3").outcome == "denied"
        assert _send(journal, "c4").replayed  # settled: answered from the checkpoint
        assert _send(journal, "c1", "bob").outcome == "refused"
        ran = _send(journal, "c1")
        assert (ran.outcome, ran.approval_id) == ("ok", ids["c1"])
        journal.checkpoint()
    with _open(path, send) as journal:
        assert journal.recovery.approved == ()
        again = _send(journal, "c1")
        assert again.replayed and again.execution_id == ran.execution_id
    assert send.calls == [{"to": "ann"}, {"to": "ann"}]  # c4 once, c1 once
    assert [r["kind"] for r in records(path)].count(rc.APPROVAL_REQUESTED) == 0


def _checkpoint_item(path: Path) -> tuple[int, dict[str, Any]]:
    for record in walj.read(path):
        if record.data["kind"] == rc.CHECKPOINT:
            return record.seq, record.data
    raise AssertionError("no checkpoint")


@pytest.mark.parametrize("field, value", [
    ("status", "consumed"), ("approval_id", "apv-x"), ("call_id", None),
    ("expires_at", "never"), ("turn_sequence", -1)])
def test_a_checkpoint_approval_item_with_an_unreadable_field_is_refused(
        tmp_path: Path, field: str, value: Any) -> None:
    path = tmp_path / "j"
    with _open(path, Recorder()) as journal:
        approval_id = _send(journal, "c1").approval_id
        journal.approve(approval_id, actor="ann@ops", note="fine")
        journal.checkpoint()
    seq, part = _checkpoint_item(path)
    (item,) = [i for i in part["items"] if i["item"] == "approval"]
    assert item["approval_id"] == approval_id and item["status"] == "approved"
    state = rebuild([(seq, part)])  # a rebuild that starts at the checkpoint
    assert [a.approval_id for a in state.snapshot().approved] == [approval_id]
    item[field] = value
    with pytest.raises(walj.CorruptionError):
        rebuild([(seq, part)])


def test_a_version_6_log_and_checkpoint_still_open(tmp_path: Path) -> None:
    path = tmp_path / "j"
    with walj.ToolJournal.open(path, tools={"send": Recorder()}) as journal:
        with journal.turn() as turn:
            turn.dispatch("send", {"to": "ann"}, call_id="c1")
        with pytest.raises(KeyboardInterrupt), journal.turn() as turn:
            turn.dispatch("send", {"x": 1}, call_id="c2", handler=interrupted)
        journal.checkpoint()
    older = [{**r, "version": 6} for r in records(path)]
    seq, part = _checkpoint_item(path)
    state = rebuild([(seq, {**part, "version": 6})])
    assert [b.call_id for b in state.snapshot().blockers] == ["c2"]
    with walj.Log.open(tmp_path / "v6") as log:
        for record in older:
            log.append(record, durable=True)
    with walj.ToolJournal.open(tmp_path / "v6") as journal:
        assert [b.call_id for b in journal.recovery.blockers] == ["c2"]
        assert journal.recovery.approvals == ()
