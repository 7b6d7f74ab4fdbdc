"""Bytes that recovery cuts on open never silently unblock a journal: a cut that no crash
explains blocks (state log_damage) until a person resolves it; one a crash explains is recorded
and does not block."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import walj_cli
from helpers import segments
from journal_helpers import Recorder, kinds, records

import walj
from walj.journal import records as rc


def _ambiguous_then_turns(path: Path, sent: Recorder, turns: int = 8) -> str:
    """The issue's journal: an ambiguous send_email, settled by nothing, then later turns of
    other calls, all with sync="always"."""
    with walj.ToolJournal.open(path, tools={"send_email": sent}, sync="always") as journal:
        try:
            with journal.turn() as turn:
                turn.dispatch("send_email", {"to": "ann@example.com"}, call_id="mail-1",
                              handler=_sent_then_interrupted(sent))
        except KeyboardInterrupt:
            pass
        (blocker,) = journal.recovery.blockers
        # A person resolves it, so the later turns dispatch; the resolution is durable.
        journal.resolve(blocker.execution_id or "", "not_performed", actor="ann",
                        note=None)
        for i in range(turns):
            with journal.turn() as turn:
                turn.dispatch("send_email", {"to": f"user{i}@example.com"}, call_id=f"c{i}")
    return blocker.execution_id or ""


def _sent_then_interrupted(sent: Recorder) -> Any:
    def handler(**arguments: Any) -> None:
        sent(**arguments)
        raise KeyboardInterrupt  # after the side effect: the execution is ambiguous

    return handler


def _turn_offset(path: Path, turn: int) -> int:
    """The file offset of turn `turn`'s turn_started line in the last segment."""
    seg = segments(path)[-1]
    data = seg.read_bytes()
    needle = b'"kind":"turn_started","version":%d,"turn_sequence":%d,' % (rc.CONTRACT_VERSION,
                                                                          turn)
    return data.rindex(b"\n", 0, data.index(needle)) + 1


def _zero_sector_at(path: Path, offset: int) -> None:
    seg = segments(path)[-1]
    data = bytearray(seg.read_bytes())
    start = (offset + 511) // 512 * 512
    data[start : start + 512] = bytes(512)
    seg.write_bytes(bytes(data))


def test_zeroed_sector_of_synced_turns_blocks_and_the_call_does_not_run(tmp_path: Path) -> None:
    """The issue's reproduction: one zeroed sector at the start of a later turn of a journal
    written with sync="always". Before: open cut 1,219 bytes silently, reported blocked=False,
    and the same call dispatched again ran its handler."""
    path = tmp_path / "j"
    sent = Recorder()
    _ambiguous_then_turns(path, sent)
    assert len(sent.calls) == 9
    _zero_sector_at(path, _turn_offset(path, 4))
    with pytest.raises(walj.CorruptionError) as raised:
        list(walj.read(path))  # a reader is told, not handed a prefix
    assert raised.value.kind == "crash_hole"

    again = Recorder()
    with walj.ToolJournal.open(path, tools={"send_email": again}, sync="always") as journal:
        rec = journal.recovery
        assert rec.blocked
        damage = [b for b in rec.blockers if b.state == "log_damage"]
        assert len(damage) == 1
        (cut,) = rec.cuts
        assert not cut.explained and cut.records > 0 and "damage" in (cut.reason or "")
        assert damage[0].quarantine_file == cut.quarantine_file == damage[0].execution_id
        assert (path / "quarantine" / cut.quarantine_file).stat().st_size == cut.length
        with journal.turn() as turn:
            result = turn.dispatch("send_email", {"to": "user5@example.com"}, call_id="c5")
        assert result.outcome == "blocked"
    assert again.calls == []
    # Durable: every later open blocks too, though the log itself now verifies clean.
    assert walj.verify(path).ok
    with walj.ToolJournal.open(path, tools={"send_email": again}) as journal:
        assert [b.state for b in journal.recovery.blockers if b.state == "log_damage"]
        assert kinds(path).count("log_cut") == 1  # recorded once, not on every open
        resolution = journal.resolve(cut.quarantine_file, "reviewed", actor="ann",
                                     note="turns 4-8 re-checked by hand in the outbox")
        assert resolution.kind == "log_cut" and resolution.outcome == "reviewed"
        for b in journal.recovery.blockers:  # what the cut hid is settled by a person too
            journal.resolve(b.execution_id or "", "succeeded", actor="ann", note="seen")
        assert not journal.recovery.blocked
        with journal.turn() as turn:
            turn.dispatch("send_email", {"to": "new@example.com"}, call_id="c-new")
    assert again.calls == [{"to": "new@example.com"}]


def test_torn_last_line_is_explained_and_does_not_block(tmp_path: Path) -> None:
    path = tmp_path / "j"
    sent = Recorder()
    _ambiguous_then_turns(path, sent, turns=2)
    seg = segments(path)[-1]
    seg.write_bytes(seg.read_bytes()[:-7])  # the last line torn mid-write
    with walj.ToolJournal.open(path, tools={"send_email": sent}) as journal:
        (cut,) = journal.recovery.cuts
        assert cut.explained and cut.reason is None and cut.kind == "incomplete_line"
        assert not any(b.state == "log_damage" for b in journal.recovery.blockers)


def test_hole_before_a_last_unsynced_durable_record_is_explained(tmp_path: Path) -> None:
    """Zeros where an unsynced record was, then a durable record with nothing after it: that
    record may have died in its own sync, so a crash explains the cut."""
    path = tmp_path / "j"
    sent = Recorder()
    with walj.ToolJournal.open(path, tools={"send_email": sent}, sync="never") as journal:
        with journal.turn() as turn:
            turn.dispatch("send_email", {"to": "a@example.com"}, call_id="c1")
        llm = journal.llm_call(model="m", request={"q": "x"})  # written without a sync
        llm.__enter__()
        turn = journal.turn()
        turn.__enter__()
        turn.dispatch("send_email", {"to": "b@example.com"}, call_id="c2")
        # the process dies here: no terminal for c2's neighbours, no close
        journal._log.close()
    seg = segments(path)[-1]
    data = seg.read_bytes()
    llm_line = data.index(b'"kind":"llm_call_started"')
    start = data.rindex(b"\n", 0, llm_line) + 1
    end = data.index(b"\n", llm_line) + 1
    intent = data.rindex(b'"kind":"tool_execution_started"')
    seg.write_bytes(data[:start] + bytes(end - start) + data[end:data.index(b"\n", intent) + 1])
    # what is left after the hole: turn_started (unsynced), then c2's intent (durable, last).
    # Nothing followed the intent, so its sync may never have returned.
    with walj.ToolJournal.open(path, tools={"send_email": sent}) as journal:
        (cut,) = journal.recovery.cuts
        assert cut.explained, cut.reason
        assert cut.records >= 1
        assert not any(b.state == "log_damage" for b in journal.recovery.blockers)


def test_a_cut_recorded_by_no_journal_still_blocks(tmp_path: Path) -> None:
    """A crash between the cut and its log_cut record: the manifest line is durable before the
    cut, so the next open records it. Here a plain Log.open makes the cut."""
    path = tmp_path / "j"
    _ambiguous_then_turns(path, Recorder())
    _zero_sector_at(path, _turn_offset(path, 3))
    with walj.Log.open(path) as log:
        assert log.torn_tail is not None
    inspect = walj_cli("inspect", path, "--json")
    assert inspect.code == 1
    states = [b["state"] for b in inspect.json()["blockers"]]
    assert "log_damage" in states  # offline, before any journal recorded it
    sweep = walj_cli("sweep", tmp_path, "--json")
    assert any(s["status"] == "blocked" for s in sweep.json()["sessions"]), sweep.out
    with walj.ToolJournal.open(path) as journal:
        assert any(b.state == "log_damage" for b in journal.recovery.blockers)


def test_repair_of_damage_blocks_the_journal(tmp_path: Path) -> None:
    """`walj repair` cuts damage that no crash leaves (a bad line with records after it in a
    sealed segment): the journal blocks on every such cut."""
    path = tmp_path / "j"
    with walj.ToolJournal.open(path, tools={"send_email": Recorder()}, sync="never",
                               segment_bytes=4096) as journal:
        for i in range(30):
            with journal.turn() as turn:
                turn.dispatch("send_email", {"to": f"u{i}@example.com"}, call_id=f"c{i}")
    first = segments(path)[0]
    data = bytearray(first.read_bytes())
    data[data.index(b"u3@example.com")] ^= 0x01
    first.write_bytes(bytes(data))
    assert walj_cli("repair", path).code == 0
    with walj.ToolJournal.open(path) as journal:
        damage = [c for c in journal.recovery.cuts if not c.explained]
        assert damage and journal.recovery.blocked


def test_edited_quarantine_file_is_unexplained(tmp_path: Path) -> None:
    path = tmp_path / "j"
    _ambiguous_then_turns(path, Recorder(), turns=2)
    seg = segments(path)[-1]
    seg.write_bytes(seg.read_bytes()[:-7])
    with walj.Log.open(path) as log:
        assert log.torn_tail is not None
        name = log.torn_tail.file
    (path / "quarantine" / name).write_bytes(b"x")
    with walj.ToolJournal.open(path) as journal:
        (cut,) = journal.recovery.cuts
        assert not cut.explained and "manifest" in (cut.reason or "")


def test_a_torn_manifest_line_does_not_hide_the_next_cut(tmp_path: Path) -> None:
    path = tmp_path / "j"
    _ambiguous_then_turns(path, Recorder(), turns=2)
    (path / "quarantine").mkdir()
    (path / "quarantine" / "MANIFEST.jsonl").write_bytes(b'{"file":"torn')  # a crash mid-write
    seg = segments(path)[-1]
    seg.write_bytes(seg.read_bytes()[:-7])
    with walj.ToolJournal.open(path) as journal:
        (cut,) = journal.recovery.cuts
        assert cut.explained
    lines = (path / "quarantine" / "MANIFEST.jsonl").read_bytes().split(b"\n")
    assert lines[0] == b'{"file":"torn' and json.loads(lines[1])["file"] == cut.quarantine_file


def test_resolving_damage_refuses_what_it_must(tmp_path: Path) -> None:
    path = tmp_path / "j"
    eid = _ambiguous_then_turns(path, Recorder())
    _zero_sector_at(path, _turn_offset(path, 4))
    with walj.ToolJournal.open(path) as journal:
        (cut,) = journal.recovery.cuts
        name = cut.quarantine_file
        for outcome, note, reason in [("succeeded", "x", "bad_outcome"),
                                      ("reviewed", None, "note_required"),
                                      ("reviewed", "  ", "note_required")]:
            with pytest.raises(walj.ResolutionError) as raised:
                journal.resolve(name, outcome, actor="ann", note=note)
            assert raised.value.reason == reason
        with pytest.raises(walj.ResolutionError) as raised:
            journal.resolve(eid, "reviewed", actor="ann", note="x")  # not a cut
        assert raised.value.reason == "unknown"
        with pytest.raises(walj.ResolutionError) as raised:
            journal.resolve(name, "reviewed", actor="policy", note="x")
        assert raised.value.reason == "bad_actor"
        journal.resolve(name, "reviewed", actor="ann", note="checked")
        with pytest.raises(walj.ResolutionError) as raised:
            journal.resolve(name, "reviewed", actor="ann", note="again")
        assert raised.value.reason == "already_resolved"


@pytest.mark.parametrize("field,value", [("explained", "no"), ("explained", None),
                                         ("quarantine_file", 7), ("length", "9"),
                                         ("reason", 3)])
def test_an_unreadable_log_cut_record_fails_closed(tmp_path: Path, field: str,
                                                   value: Any) -> None:
    path = tmp_path / "j"
    _ambiguous_then_turns(path, Recorder(), turns=1)
    record = {"kind": "log_cut", "version": 2, "quarantine_file": "seg.bin", "at": 1.0,
              "segment": "s", "offset": 0, "length": 9, "cut_kind": "zero_fill", "records": 0,
              "seqs": None, "explained": False, "reason": "x"}
    record[field] = value
    with walj.Log.open(path) as log:
        log.append(record)
    with pytest.raises(walj.CorruptionError):
        walj.ToolJournal.open(path)


class _LeftTurn(Exception):
    """The caller's code raised after its tool call returned: the turn is left uncompleted."""


def _turn_at_a_sector(path: Path, monkeypatch: pytest.MonkeyPatch, sent: Recorder) -> int:
    """A journal (sync="always") with a completed turn, then a later turn whose call c2 was
    acknowledged (durable intent, durable terminal) and which was left by an exception, so the
    terminal is the last record. The first turn's arguments are padded until the later turn's
    turn_started line begins a 512-byte sector; its offset is returned."""
    monkeypatch.setattr("walj.journal._writes.now", lambda: 1796193983.5)  # fixed line lengths
    pad = target = 0
    for _ in range(8):
        with walj.ToolJournal.open(path, tools={"send_email": sent}, sync="always") as journal:
            with journal.turn() as turn:
                turn.dispatch("send_email", {"to": "ann@example.com", "pad": "p" * pad},
                              call_id="c1")
            try:
                with journal.turn() as turn:
                    turn.dispatch("send_email", {"to": "bob@example.com", "body": "b" * 80},
                                  call_id="c2")
                    raise _LeftTurn
            except _LeftTurn:
                pass
        offset = _turn_offset(path, 2)
        if offset % 512 == 0:
            return offset
        target = target or -(-offset // 512) * 512
        pad += target - offset
        shutil.rmtree(path)
        sent.calls.clear()
    raise AssertionError("the later turn never began a sector")


def test_a_zeroed_sector_that_destroys_an_intent_blocks(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The sector where the later turn begins is zeroed: turn_started and most of c2's intent.
    The only line that survives in the cut is c2's terminal record, the last thing written.
    Before: it passed as a record that may have died in its own sync, the cut was explained,
    the journal reopened unblocked and c2 ran again. The terminal proves its intent was
    durable, and that intent is gone: damage."""
    path = tmp_path / "j"
    sent = Recorder()
    offset = _turn_at_a_sector(path, monkeypatch, sent)
    assert [c["to"] for c in sent.calls] == ["ann@example.com", "bob@example.com"]
    seg = segments(path)[-1]
    data = bytearray(seg.read_bytes())
    intent = data.index(b'"call_id":"c2"')
    intent_end = data.index(b"\n", intent) + 1
    assert offset + 512 < intent_end < len(data)  # most of the intent, not its terminal
    data[offset : offset + 512] = bytes(512)
    seg.write_bytes(bytes(data))

    again = Recorder()
    with walj.ToolJournal.open(path, tools={"send_email": again}, sync="always") as journal:
        rec = journal.recovery
        (cut,) = rec.cuts
        assert cut.records == 1 and cut.offset == offset
        assert not cut.explained and "intent" in (cut.reason or "")
        assert [b.state for b in rec.blockers] == ["log_damage"]
        with journal.turn() as turn:
            result = turn.dispatch("send_email", {"to": "bob@example.com", "body": "b" * 80},
                                   call_id="c2")
        assert result.outcome == "blocked"
    assert again.calls == []


def _llm_calls_after_a_turn(path: Path, sync: str) -> int:
    """A completed turn with one call, then eight LLM calls (records the journal writes in the
    log's sync mode), then close. Returns an aligned sector lying among the LLM records, with
    LLM records whole on both sides of it."""
    with walj.ToolJournal.open(path, tools={"send_email": Recorder()}, sync=sync) as journal:
        with journal.turn() as turn:
            turn.dispatch("send_email", {"to": "ann@example.com"}, call_id="c1")
        for i in range(8):
            with journal.llm_call(model="m", request={"q": i}) as call:
                call.finish({"a": i})
    data = segments(path)[-1].read_bytes()
    starts = [m.start() for m in re.finditer(rb"\{[^\n]*\"kind\":\"llm_call_started\"", data)]
    sector = -(-starts[1] // 512) * 512
    assert sector + 512 <= starts[-1]
    return sector


def test_a_zeroed_sector_among_synced_llm_records_blocks(tmp_path: Path) -> None:
    """With sync="always" every record is synced before the next is written, LLM records too.
    The journal cannot tell that from the records' kinds (it writes them in the log's mode),
    but the records after the hole say through which seq the log was synced when they were
    written, and that covers the records the hole destroyed."""
    path = tmp_path / "j"
    sector = _llm_calls_after_a_turn(path, "always")
    _zero_range(path, sector)
    with walj.ToolJournal.open(path, sync="always") as journal:
        (cut,) = journal.recovery.cuts
        assert cut.records > 0 and not cut.explained
        assert "synced" in (cut.reason or "")
        assert [b.state for b in journal.recovery.blockers] == ["log_damage"]


def test_a_hole_among_unsynced_llm_records_is_explained(tmp_path: Path) -> None:
    """The same hole with sync="never": the LLM records after the last durable record were never
    synced before a later record was written, so a power cut among them explains the hole (the
    close synced them, but nothing written after it says so)."""
    path = tmp_path / "j"
    sector = _llm_calls_after_a_turn(path, "never")
    _zero_range(path, sector)
    with walj.ToolJournal.open(path, sync="never") as journal:
        (cut,) = journal.recovery.cuts
        assert cut.records > 0 and cut.explained, cut.reason
        assert not journal.recovery.blocked


def _zero_range(path: Path, start: int, length: int = 512) -> None:
    seg = segments(path)[-1]
    data = bytearray(seg.read_bytes())
    data[start : start + length] = bytes(length)
    seg.write_bytes(bytes(data))


@pytest.mark.parametrize("synced,explained", [(1, True), (2, False), (3, False), (-1, False),
                                               ("2", False), (1.5, False), (True, False),
                                               (None, False), (10**30, False)])
def test_a_cut_record_whose_synced_through_is_not_a_seq_before_the_cut_blocks(
        tmp_path: Path, synced: Any, explained: bool) -> None:
    """Hostile input: a record after a hole explains the hole only when its synced_through is a
    seq that lies before the cut (here 1, the record left in the log). One that names the
    destroyed record or its own, or is not a seq at all, is no proof that a crash did it."""
    path = tmp_path / "j"
    at = {"version": rc.CONTRACT_VERSION, "at": 1.0}
    with walj.Log.open(path, sync="never") as log:
        log.append({"kind": "turn_started", **at, "turn_sequence": 1})
        log.append({"kind": "llm_call_started", **at, "llm_call_id": "a" * 32,
                    "turn_sequence": 1, "model": "m"})
        log.append({"kind": "llm_call_finished", **at, "llm_call_id": "a" * 32,
                    "outcome": "ok", "synced_through": synced})
    seg = segments(path)[-1]
    data = seg.read_bytes()
    hole = data.index(b'"kind":"llm_call_started"')
    start = data.rindex(b"\n", 0, hole) + 1
    end = data.index(b"\n", hole)
    seg.write_bytes(data[:start] + bytes(end - start) + data[end:])  # all but its newline
    with walj.ToolJournal.open(path) as journal:
        (cut,) = journal.recovery.cuts
        assert cut.records == 1
        assert cut.explained is explained, cut.reason
        assert journal.recovery.blocked is not explained
        if not explained:
            assert "synced_through" in (cut.reason or "") or "synced every record" in (
                cut.reason or "")


def test_a_destroyed_intent_is_damage_to_inspect_before_any_journal_records_the_cut(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same sector, cut by a plain Log.open: `walj inspect` classifies the cut no journal
    has recorded yet by the same rule, and a journal opened later records it as damage."""
    path = tmp_path / "j"
    offset = _turn_at_a_sector(path, monkeypatch, Recorder())
    _zero_range(path, offset)
    with walj.Log.open(path) as log:
        assert log.torn_tail is not None and log.torn_tail.offset == offset
    inspect = walj_cli("inspect", path, "--json")
    assert inspect.code == 1
    assert [b["state"] for b in inspect.json()["blockers"]] == ["log_damage"]
    with walj.ToolJournal.open(path) as journal:
        (cut,) = journal.recovery.cuts
        assert not cut.explained and "intent" in (cut.reason or "")


def test_synced_through_counts_only_the_writing_process_s_own_syncs(tmp_path: Path) -> None:
    """A reopened journal does not vouch for what it found on open (a writer killed before its
    sync may have left that only in the page cache): its records say synced_through only once
    its own log has synced, and then name the last seq that sync covered."""
    path = tmp_path / "j"
    with walj.ToolJournal.open(path, tools={"t": Recorder()}, sync="never") as journal:
        with journal.turn() as turn:
            turn.dispatch("t", {})
    found = len(records(path))
    with walj.ToolJournal.open(path, tools={"t": Recorder()}, sync="never") as journal:
        with journal.llm_call(model="m", request={}) as call:  # written in the log's mode
            call.finish({})
        with journal.turn() as turn:
            turn.dispatch("t", {})  # the intent is synced before the handler runs
    later = records(path)[found:]
    assert [r["kind"] for r in later] == [
        "llm_call_started", "llm_call_finished", "turn_started", "tool_execution_started",
        "tool_execution_finished", "turn_completed"]
    assert [r.get(rc.SYNCED_THROUGH) for r in later] == [None, None, None, None,
                                                        found + 4, found + 5]
