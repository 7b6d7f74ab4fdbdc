"""Checkpoints and compaction of a journal: where an open starts, what it no longer reads, a
checkpoint a crash cut short, hostile checkpoint records, replay and blockers across a
compaction, keep_turns and automatic checkpoints."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import segments
from journal_helpers import records

import walj
from walj.journal import _checkpoint_parts, _compact
from walj.journal import records as rc
from walj.journal.state import rebuild


def ok(**arguments: Any) -> dict[str, Any]:
    return {"echo": arguments}


def unknown(**arguments: Any) -> None:
    raise walj.ToolOutcomeUnknown("connection lost after the request went out")


TOOLS = {"ok": ok, "send": unknown}
SMALL = {"sync": "never", "segment_bytes": 2048, "checkpoint_every": None}


def _journal(path: Path, **options: Any) -> walj.ToolJournal:
    return walj.ToolJournal.open(path, tools=TOOLS, store_outputs=True, **{**SMALL, **options})


def _turns(journal: walj.ToolJournal, count: int, first: int = 0) -> None:
    for t in range(first, first + count):
        with journal.turn() as turn:
            turn.dispatch("ok", {"t": t}, call_id=f"call-{t}")


def _blocked(journal: walj.ToolJournal) -> str:
    with pytest.raises(walj.ToolOutcomeUnknown), journal.turn() as turn:
        turn.dispatch("send", {"to": "ann"}, call_id="send-1")
    (blocker,) = journal.recovery.blockers
    assert blocker.execution_id is not None
    return blocker.execution_id


def _full_state(path: Path) -> Any:
    return rebuild([(r.seq, r.data) for r in walj.read(path)]).snapshot()


def test_a_checkpoint_begins_a_segment_and_the_open_starts_there(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with _journal(path) as journal:
        _turns(journal, 20)
        seq = journal.checkpoint()
        _turns(journal, 2, first=20)
    first_lines = {json.loads(p.read_text().splitlines()[1])["seq"] for p in segments(path)
                   if len(p.read_text().splitlines()) > 1}
    assert seq in first_lines
    with _journal(path) as journal:
        state = journal._core.state
        assert state.from_checkpoint == seq
        assert journal.recovery == _full_state(path)


def test_the_open_reads_no_record_before_the_checkpoint(tmp_path: Path) -> None:
    """Damage inside a sealed segment before the checkpoint is not seen by the open (only the
    headers and seals are checked); `walj.verify` still finds it."""
    path = tmp_path / "s"
    with _journal(path) as journal:
        _turns(journal, 30)
        journal.checkpoint()
    victim = segments(path)[1]
    data = bytearray(victim.read_bytes())
    at = data.index(b'"t":', data.index(b"\n") + 1)
    data[at + 4:at + 5] = b"7" if data[at + 4:at + 5] != b"7" else b"8"
    victim.write_bytes(bytes(data))
    assert not walj.verify(path).ok
    with _journal(path) as journal:
        assert journal._core.state.from_checkpoint is not None
        assert not journal.is_blocked()


@pytest.mark.parametrize("damage", ["missing_segment", "forged_seal"])
def test_a_broken_seal_chain_before_the_checkpoint_is_still_refused(
        tmp_path: Path, damage: str) -> None:
    path = tmp_path / "s"
    with _journal(path) as journal:
        _turns(journal, 30)
        journal.checkpoint()
    victim = segments(path)[2]
    if damage == "missing_segment":
        victim.unlink()
    else:  # a seal that verifies on its own line but is not the one the next header carries
        from walj.log import format as fmt

        lines = victim.read_bytes().rstrip(b"\n").split(b"\n")
        seal = json.loads(lines[-1])["seal"]
        seal["sha256"] = "0" * 64
        body = json.dumps({"seal": seal}, separators=(",", ":"))
        lines[-1] = fmt.frame(body[1:].encode()).rstrip(b"\n")
        victim.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(walj.CorruptionError) as info:
        _journal(path)
    assert info.value.kind in ("missing_segment", "seal_chain")


def test_a_checkpoint_cut_short_is_passed_over_for_the_one_before(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with _journal(path) as journal:
        _turns(journal, 10)
        execution_id = _blocked(journal)
        complete = journal.checkpoint()
        # A crash while the next checkpoint was written: its first part only, then more.
        parts = _checkpoint_parts.build_parts(journal._core.state,
                                              _compact._settling(journal._core), 1200, 1.0)
    assert len(parts) > 1
    with walj.Log.open(path, sync="never", segment_bytes=2048) as log:
        log.rotate()
        log.append(parts[0])
    with _journal(path) as journal:
        assert journal._core.state.from_checkpoint == complete
        assert [b.execution_id for b in journal.recovery.blockers] == [execution_id]
        journal.resolve(execution_id, "not_performed", actor="ann")
    with _journal(path) as journal:
        assert journal._core.state.from_checkpoint == complete
        assert not journal.is_blocked()
        assert journal.recovery == _full_state(path)


def _forge(path: Path, change: Any) -> None:
    """Rewrite the journal's last checkpoint part with `change` applied, checksum redone."""
    with _journal(path) as journal:
        journal.checkpoint()
    last = [p for p in segments(path) if p.read_bytes().count(b"\n") > 1][-1]
    lines = last.read_bytes().split(b"\n")
    line = json.loads(lines[1])
    change(line["data"])
    body = json.dumps({"seq": line["seq"], "data": line["data"]}, separators=(",", ":"))
    from walj.log import format as fmt

    lines[1] = fmt.frame(body[1:].encode())
    last.write_bytes(b"\n".join(lines))


def _item(kind: str) -> Any:
    def pick(data: dict[str, Any]) -> dict[str, Any]:
        return next(i for i in data["items"] if i["item"] == kind)
    return pick


HOSTILE = {
    "parts_zero": lambda d: d.update(parts=0),
    "part_beyond": lambda d: d.update(part=0, parts=1, items=[{"item": "nonsense"}]),
    "id_not_hex": lambda d: d.update(checkpoint_id="x" * 32),
    "items_not_list": lambda d: d.update(items={"item": "summary"}),
    "no_summary_first": lambda d: d["items"].reverse(),
    "records_negative": lambda d: _item("summary")(d).update(covers_records=-1),
    "turn_stack_strings": lambda d: _item("summary")(d).update(turn_stack=["1"]),
    "started_not_json": lambda d: _item("execution")(d).update(started="{nope"),
    "started_not_object": lambda d: _item("execution")(d).update(started="[1]"),
    "execution_seq_float": lambda d: _item("execution")(d).update(seq=1.5),
    "turn_not_carried": lambda d: _item("summary")(d).update(turn_stack=[99]),
    "filter_not_base64": lambda d: d["items"].append(
        {"item": "forgotten_calls", "offset": 0, "zlib_base64": "***"}),
    "settled_call_without_id": lambda d: d["items"].append(
        {"item": "settled_calls", "call_ids": [""], "arguments_sha256": ["a"],
         "settled_seqs": [1], "settlings": ["{}"]}),
    "settled_calls_uneven": lambda d: d["items"].append(
        {"item": "settled_calls", "call_ids": ["a", "b"], "arguments_sha256": ["a"],
         "settled_seqs": [1, 2], "settlings": ["{}", "{}"]}),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_checkpoint_is_refused_with_a_typed_error(tmp_path: Path, name: str) -> None:
    path = tmp_path / "s"
    with _journal(path) as journal:
        _turns(journal, 3)
        _blocked(journal)
        journal.checkpoint()
    _forge(path, HOSTILE[name])
    with pytest.raises(walj.CorruptionError) as info:
        _journal(path)
    assert "checkpoint" in str(info.value) or info.value.kind == "journal_record"


def test_compaction_to_an_archive_without_an_archiver_is_refused_and_writes_nothing(
        tmp_path: Path) -> None:
    """The archiver is the journal class's own (walj.ToolJournal's ships through walj.archive);
    a journal class without one refuses compact(archive=...) before its checkpoint."""

    class WithoutArchive(walj.ToolJournal):
        archiver = None

    path, archive = tmp_path / "s", tmp_path / "archive"
    with WithoutArchive.open(path, tools=TOOLS, **SMALL) as journal:
        _turns(journal, 20)
        before = [p.name for p in segments(path)], walj.ToolJournal.archiver
        last_seq = journal._log.last_seq
        with pytest.raises(walj.WaljError, match="needs walj.archive"):
            journal.compact(archive=f"file://{archive}")
        assert journal._log.last_seq == last_seq  # not even the checkpoint
        assert ([p.name for p in segments(path)], walj.ToolJournal.archiver) == before
        assert walj.ToolJournal.archiver is not None
    assert not archive.exists()


def test_compaction_keeps_a_blocker_through_archive_and_restart(tmp_path: Path) -> None:
    path, archive = tmp_path / "s", tmp_path / "archive"
    with _journal(path) as journal:
        _turns(journal, 20)
        execution_id = _blocked(journal)
        _turns_blocked = journal.recovery
        report = journal.compact(archive=f"file://{archive}")
        assert report.dropped_segments > 0 and report.first_seq == report.checkpoint_seq
        assert set(report.archived) >= {p.name for p in segments(archive / journal.log_id)}
        assert journal.is_blocked()
    assert next(iter(walj.read(path))).data["kind"] == rc.CHECKPOINT
    with _journal(path) as journal:
        after = journal.recovery
        assert [b.execution_id for b in after.blockers] == [execution_id]
        assert after.blockers == _turns_blocked.blockers
        with journal.turn() as turn:
            assert turn.dispatch("ok", {"t": 99}).outcome == "blocked"
    # The archive and the local tail verify as one chain, and read back every record.
    assert walj.verify(path, archive=f"file://{archive}").ok
    seqs = [r.seq for r in walj.read(path, archive=f"file://{archive}")]
    assert seqs == list(range(1, seqs[-1] + 1))
    with _journal(path) as journal:
        journal.resolve(execution_id, "succeeded", actor="ann")
        _turns(journal, 1, first=50)


def test_replay_after_compaction_answers_from_the_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with _journal(path) as journal:
        _turns(journal, 10)
        journal.compact()
    with _journal(path) as journal:
        with journal.turn() as turn:
            result = turn.dispatch("ok", {"t": 3}, call_id="call-3")
            refused = turn.dispatch("ok", {"t": 4000}, call_id="call-4")
        assert result.replayed and result.output == {"echo": {"t": 3}}
        assert refused.outcome == "refused"
    replayed = [r for r in records(path) if r["kind"] == rc.REPLAYED]
    original = [r for r in records(path, ) if r.get("call_id") == "call-3"]
    assert replayed and replayed[0]["answered_from_seq"] < journal._core.log.first_seq
    assert original


def test_outputs_beyond_the_carried_budget_are_refused_never_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_checkpoint_parts, "CARRIED_OUTPUT_BYTES", 60)
    path = tmp_path / "s"
    runs: list[int] = []

    def counted(**arguments: Any) -> dict[str, Any]:
        runs.append(arguments["t"])
        return {"echo": arguments}

    tools = {"ok": counted}
    with walj.ToolJournal.open(path, tools=tools, store_outputs=True, **SMALL) as journal:
        _turns(journal, 5)
        journal.compact()
    with walj.ToolJournal.open(path, tools=tools, store_outputs=True, **SMALL) as journal:
        with journal.turn() as turn:
            newest = turn.dispatch("ok", {"t": 4}, call_id="call-4")
            oldest = turn.dispatch("ok", {"t": 0}, call_id="call-0")
    assert newest.replayed and newest.output == {"echo": {"t": 4}}
    assert oldest.outcome == "refused" and "checkpoint" in str(oldest.error)
    assert runs == [0, 1, 2, 3, 4]


def test_forgotten_call_ids_stay_refused_after_compaction(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with _journal(path, replay_window=2) as journal:
        _turns(journal, 6)
        journal.compact()
    with _journal(path, replay_window=2) as journal:
        with journal.turn() as turn:
            old = turn.dispatch("ok", {"t": 0}, call_id="call-0")
            fresh = turn.dispatch("ok", {"t": 0}, call_id="never-seen")
    assert old.outcome == "refused" and rc.REFUSED_OUTSIDE_WINDOW in json.dumps(old.output)
    assert fresh.outcome == "ok" and not fresh.replayed


def test_keep_turns_keeps_the_last_turns_readable(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with _journal(path) as journal:
        _turns(journal, 40)
        report = journal.compact(keep_turns=5)
    kept = [r for r in records(path) if r["kind"] == rc.TURN_STARTED]
    assert [r["turn_sequence"] for r in kept][:1] <= [36]
    assert {36, 37, 38, 39, 40} <= {r["turn_sequence"] for r in kept}
    assert report.dropped_segments > 0 and report.first_seq < report.checkpoint_seq


@pytest.mark.parametrize("keep_turns", [-1, 1001, 2.0, "3", None])
def test_bad_keep_turns_is_refused_before_anything_is_written(
        tmp_path: Path, keep_turns: Any) -> None:
    path = tmp_path / "s"
    with _journal(path) as journal:
        _turns(journal, 2)
        before = journal._core.log.last_seq
        with pytest.raises(ValueError, match="keep_turns"):
            journal.compact(keep_turns=keep_turns)
        assert journal._core.log.last_seq == before


def test_compact_is_refused_inside_a_turn(tmp_path: Path) -> None:
    with _journal(tmp_path / "s") as journal, journal.turn():
        with pytest.raises(walj.TurnError):
            journal.compact()


def test_automatic_checkpoints_bound_what_an_open_replays(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with _journal(path, checkpoint_every=40) as journal:
        _turns(journal, 60)
        last = journal._core.log.last_seq
    starts = [r.seq for r in walj.read(path)
              if r.data["kind"] == rc.CHECKPOINT and r.data["part"] == 0]
    assert len(starts) >= 3
    with _journal(path, checkpoint_every=40) as journal:
        assert journal._core.state.from_checkpoint == starts[-1]
        assert last - starts[-1] < 40 + 8
        assert journal.recovery == _full_state(path)


def test_a_journal_without_checkpoints_opens_from_its_first_record(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with _journal(path) as journal:
        _turns(journal, 20)
    with _journal(path) as journal:
        assert journal._core.state.from_checkpoint is None
        assert journal.recovery == _full_state(path)


def test_a_rebuild_from_the_base_waits_for_a_complete_checkpoint(tmp_path: Path) -> None:
    """keep_turns leaves records before the checkpoint; walj.read starts at the base. Every
    rebuild from there (the CLI's, a resync's) passes over them, and over a checkpoint a crash
    cut short, to the first complete checkpoint."""
    path = tmp_path / "s"
    with _journal(path) as journal:
        _turns(journal, 20)
        execution_id = _blocked(journal)
        parts = _checkpoint_parts.build_parts(journal._core.state,
                                              _compact._settling(journal._core), 1200, 1.0)
        journal._core.log.rotate()
        journal._core.log.append(parts[0])  # cut short: a crash while it was written
        _turns(journal, 0)
    with _journal(path) as journal:
        with journal.turn():
            pass
        report = journal.compact(keep_turns=3)
        live = journal.recovery
    assert report.first_seq < report.checkpoint_seq
    kinds = [r.data["kind"] for r in walj.read(path)]
    assert kinds[0] != rc.CHECKPOINT and kinds.count(rc.CHECKPOINT) >= 2
    assert _full_state(path).blockers == live.blockers
    assert [b.execution_id for b in live.blockers] == [execution_id]
    with _journal(path) as journal:
        assert journal.recovery == _full_state(path)


def test_a_compacted_log_with_no_checkpoint_left_is_corrupt_for_every_rebuild(
        tmp_path: Path) -> None:
    path = tmp_path / "s"
    with _journal(path) as journal:
        _turns(journal, 20)
    with walj.Log.open(path, segment_bytes=2048) as log:
        log.drop_before(log.last_seq)
    with pytest.raises(walj.CorruptionError, match="no complete checkpoint"):
        _full_state(path)
    with pytest.raises(walj.WaljError, match="compacted"):
        _journal(path)
