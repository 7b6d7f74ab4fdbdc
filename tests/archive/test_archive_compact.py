"""`journal.compact(archive=URL)` over s3:// (moto's S3 server) and file:// alike: the dropped
segments are in the archive, verified, before they go; a blocker survives compaction, archival
and a restart; an archive that fails or holds a bad copy keeps the local segments."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from archive_helpers import Archive
from helpers import segments

import walj
from walj.journal import records as rc


def ok(**arguments: Any) -> dict[str, Any]:
    return {"echo": arguments}


def unknown(**arguments: Any) -> None:
    raise walj.ToolOutcomeUnknown("connection lost after the request went out")


OPTIONS: dict[str, Any] = {"tools": {"ok": ok, "send": unknown}, "store_outputs": True,
                           "sync": "never", "segment_bytes": 2048, "checkpoint_every": None}


def _session(path: Path) -> str:
    """A journal with 20 settled calls, then a blocker; returns the blocker's execution id."""
    with walj.ToolJournal.open(path, **OPTIONS) as journal:
        for t in range(20):
            with journal.turn() as turn:
                turn.dispatch("ok", {"t": t}, call_id=f"call-{t}")
        with pytest.raises(walj.ToolOutcomeUnknown), journal.turn() as turn:
            turn.dispatch("send", {"to": "ann"})
        (blocker,) = journal.recovery.blockers
        assert blocker.execution_id is not None
        return blocker.execution_id


def test_compact_to_an_archive_then_restart(archive: Archive, tmp_path: Path) -> None:
    path = tmp_path / "s"
    execution_id = _session(path)
    all_before = [(r.seq, r.data) for r in walj.read(path)]
    with walj.ToolJournal.open(path, **OPTIONS) as journal:
        log_id = journal.log_id
        report = journal.compact(archive=archive.url)
    assert report.archive_url == archive.url and report.dropped_segments > 0
    archived = archive.names(log_id)
    assert set(report.archived) == set(archived)
    # Nothing before the base is local any more; all of it is in the archive, whole.
    assert min(int(p.name[4:14]) for p in segments(path)) > 1
    assert walj.verify(path, archive=archive.url).ok
    joined = [(r.seq, r.data) for r in walj.read(path, archive=archive.url)]
    assert joined[:len(all_before)] == all_before
    # The blocker is carried by the checkpoint: it blocks after a restart, and resolves.
    with walj.ToolJournal.open(path, **OPTIONS) as journal:
        assert [b.execution_id for b in journal.recovery.blockers] == [execution_id]
        journal.resolve(execution_id, "not_performed", actor="ann")
        with journal.turn() as turn:
            replayed = turn.dispatch("ok", {"t": 5}, call_id="call-5")
        assert replayed.replayed and replayed.output == {"echo": {"t": 5}}
    assert next(iter(walj.read(path))).data["kind"] == rc.CHECKPOINT


def test_an_archive_that_fails_keeps_every_local_segment(tmp_path: Path) -> None:
    path = tmp_path / "s"
    _session(path)
    before = sorted(p.name for p in segments(path))
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the archive should be")
    with walj.ToolJournal.open(path, **OPTIONS) as journal:
        with pytest.raises(NotADirectoryError):  # the store's own error, naming the path
            journal.compact(archive=f"file://{blocker}")
        assert journal.is_blocked()
    # The checkpoint was written (it rotated), nothing was dropped.
    assert set(before) <= {p.name for p in segments(path)}
    assert not (path / "BASE").exists()
    with walj.ToolJournal.open(path, **OPTIONS) as journal:
        assert journal.is_blocked()


def test_a_damaged_archived_copy_is_repaired_before_anything_is_dropped(
        archive: Archive, tmp_path: Path) -> None:
    """An object already in the bucket with the right size and the segment's own seal line but
    other bytes (a byte flipped there) is not taken as the copy: compaction reads every copy
    back whole, and writes the damaged copy over with the segment it is a copy of."""
    path = tmp_path / "s"
    _session(path)
    with walj.ToolJournal.open(path, **OPTIONS) as journal:
        log_id = journal.log_id
    walj.archive.ship(path, archive.url)
    first = sorted(archive.names(log_id))[0]
    data = bytearray(archive.get(f"{log_id}/{first}"))
    at = data.index(b'"t":') + 4
    data[at:at + 1] = b"9" if data[at:at + 1] != b"9" else b"8"
    archive.put(f"{log_id}/{first}", bytes(data))
    with walj.ToolJournal.open(path, **OPTIONS) as journal:
        report = journal.compact(archive=archive.url)
    assert first in report.archived and report.dropped_segments > 0
    assert walj.verify(path, archive=archive.url).ok


def test_approvals_survive_compaction_into_an_archive(archive: Archive, tmp_path: Path) -> None:
    """A pending request, an unused approval and a denial whose records were shipped to the
    archive and dropped locally: the checkpoint carries all three, so after a restart the
    approved call runs once with its arguments, the denied one never, and the pending one
    waits for its decision."""
    path = tmp_path / "s"
    ran: list[int] = []

    def refund(amount: int) -> int:
        ran.append(amount)
        return amount

    options = {**OPTIONS, "tools": {"ok": ok, "refund": walj.Tool(refund, approval=True)}}
    with walj.ToolJournal.open(path, **options) as journal:
        with journal.turn() as turn:
            ids = {call: turn.dispatch("refund", {"amount": n}, call_id=call).approval_id
                   for n, call in enumerate(("pending", "approved", "denied"), 1)}
        journal.approve(ids["approved"], actor="ann", note="checked")
        journal.deny(ids["denied"], actor="ann", note="duplicate")
        for t in range(20):
            with journal.turn() as turn:
                turn.dispatch("ok", {"t": t}, call_id=f"call-{t}")
        assert journal.compact(archive=archive.url).dropped_segments > 0
    local_kinds = {r.data["kind"] for r in walj.read(path)}
    assert rc.APPROVAL_REQUESTED not in local_kinds and rc.APPROVAL_DECIDED not in local_kinds
    shipped = [r.data for r in walj.read(path, archive=archive.url)
               if r.data["kind"] == rc.APPROVAL_REQUESTED]
    assert sorted(r["approval_id"] for r in shipped) == sorted(ids.values())
    with walj.ToolJournal.open(path, **options) as journal:
        assert [a.approval_id for a in journal.recovery.approvals] == [ids["pending"]]
        assert [a.approval_id for a in journal.recovery.approved] == [ids["approved"]]
        with journal.turn() as turn:
            other = turn.dispatch("refund", {"amount": 99}, call_id="approved")
            first = turn.dispatch("refund", {"amount": 2}, call_id="approved")
            again = turn.dispatch("refund", {"amount": 2}, call_id="approved")
            denied = turn.dispatch("refund", {"amount": 3}, call_id="denied")
            waiting = turn.dispatch("refund", {"amount": 1}, call_id="pending")
        assert other.outcome == "refused" and first.outcome == "ok" and again.replayed
        assert first.approval_id == ids["approved"] and denied.outcome == "denied"
        assert waiting.outcome == "awaiting_approval" and waiting.approval_id == ids["pending"]
    assert ran == [2]
