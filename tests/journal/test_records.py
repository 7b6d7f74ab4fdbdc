"""The record schema (walj.journal.records): every writer emits the fields its kind declares,
in the declared order; the byte peeks read what the writers write; one feed path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import walj
from walj.journal import _writes
from walj.journal import records as rc
from walj.journal._checkpoint_parts import build_parts
from walj.journal._fingerprint import Digest
from walj.journal._records import Blocker
from walj.journal.state import JournalState, rebuild
from walj.log.scan import LogScan

DIGEST = Digest("f" * 64, '{"to":"ann"}', 12)
ID = "e" * 32


def _written() -> list[dict[str, Any]]:
    """One record of every kind a journal writer builds, optional fields included."""
    error = RuntimeError("lost")
    intent = _writes.intent(ID, 3, "send", "call-1", DIGEST, "k" * 32, {"to": "ann"},
                            call_id_generated=True, writer="w" * 16)
    finished = _writes.finished(ID, "ok", DIGEST, None)
    _writes.store_output(finished, {"sent": True}, 1000)
    blocker = Blocker(ID, "send", "call-1", rc.STATE_AMBIGUOUS, 3, None, None)
    approved_intent = _writes.intent(ID, 3, "send", "call-1", DIGEST, "k" * 32, {"to": "ann"})
    _writes.name_approval(approved_intent, "apv-" + "a" * 32)
    decided = _writes.approval_decided("apv-" + "a" * 32, "approved", "ann", None, 2e9)
    decided["request"], decided["at"] = "r-3", 1.0  # as a request's answer sets them
    return [
        approved_intent, decided,
        _writes.approval_requested("apv-" + "a" * 32, 3, "send", "call-1", DIGEST, "k" * 32,
                                   "w" * 16),
        _writes.session_ended_record(), _writes.turn_record(rc.TURN_STARTED, 3),
        _writes.turn_record(rc.TURN_COMPLETED, 3), _writes.turn_resolved(3, "ann", "done"),
        intent, finished, _writes.finished(ID, "error", None, error),
        _writes.replayed({"execution_id": ID}, 7, 3, "send", "call-1", "f" * 64, "ok"),
        _writes.refused(ID, 3, "send", "call-1", "f" * 64, "arguments_differ", "no", None),
        _writes.session_named("s-1"), _writes.ambiguous_record(ID, error),
        _writes.blocked_record(intent, (blocker,)), _writes.reconcile_failed(ID, "send", error),
        _writes.llm_started("l" * 32, 3, "model", DIGEST, True),
        _writes.llm_finished("l" * 32, DIGEST, None),
        _writes.llm_finished("l" * 32, None, error),
        _writes.resolved(rc.RESOLVED, ID, "succeeded", "ann", None, {"sent": True}),
        _writes.resolved(rc.LLM_RESOLVED, "l" * 32, "failed", "ann", None),
        _writes.resolved(rc.LOG_CUT_RESOLVED, "q.cut", "reviewed", "ann", "seen"),
        _writes.request_refused("r-1", "resolve", ID, "ann", "unknown", "no such execution"),
        _writes.released("r-2", "ann", None),
    ]


def test_every_writer_emits_its_kinds_declared_fields_in_the_declared_order() -> None:
    seen = set()
    for record in _written():
        keys = list(record)
        assert keys[:2] == ["kind", "version"], record
        declared = rc.FIELDS[record["kind"]]
        assert all(key in declared for key in keys[2:]), record
        assert keys[2:] == sorted(keys[2:], key=declared.index), record
        seen.add(record["kind"])
    assert seen | {rc.LOG_CUT, rc.CHECKPOINT, rc.BLOCKED} >= set(rc.FIELDS)


def test_a_field_no_kind_declares_is_refused() -> None:
    with pytest.raises(ValueError, match="outcome"):
        rc.new_record(rc.TURN_STARTED, turn_sequence=1, at=1.0, outcome="ok")


def test_the_peeks_read_what_the_writers_write() -> None:
    intent = _writes.intent(ID, 3, "send", "call-1", DIGEST, "k" * 32)
    data = rc.encode_record(intent)
    assert rc.record_kind(data) == rc.STARTED
    assert rc.raw_call_key(data) == rc.call_key(intent) == ("call-1", "f" * 64)
    assert rc.peek_started(data, rc.turn_tag(3)) == ID
    assert rc.peek_started(data, rc.turn_tag(4)) is None
    generated = _writes.intent(ID, 3, "send", "turn-3-call-1", DIGEST, "k" * 32,
                               call_id_generated=True)
    assert rc.raw_call_key(rc.encode_record(generated)) is None
    blocked = _writes.finished(ID, "blocked", None, walj.ToolBlocked("guard"))
    assert rc.peek_finished(rc.encode_record(blocked)) == (ID, True)
    assert rc.peek_finished(rc.encode_record(_writes.finished(ID, "ok", DIGEST, None))) == (
        ID, False)
    turn = _writes.turn_record(rc.TURN_STARTED, 12)
    turn[rc.SYNCED_THROUGH] = 40
    assert rc.peek_turn_started(rc.encode_record(turn)) == (12, turn["at"])
    parts = build_parts(JournalState(), {}, 2**20, 1.0)
    assert rc.first_part_id(rc.encode_record(parts[0])) == parts[0]["checkpoint_id"]


def test_blocker_summary_is_json_ready_and_full_adds_every_recorded_field() -> None:
    blocker = Blocker(ID, "send", "call-1", rc.STATE_AMBIGUOUS, 3, "f" * 64, "{}",
                      idempotency_key="k", started_at=1.5, seq=9, arguments={"to": "ann"},
                      writer="w-1")
    assert blocker.summary() == {"execution_id": ID, "tool": "send", "call_id": "call-1",
                                 "state": "ambiguous", "turn_sequence": 3}
    full = json.loads(json.dumps(blocker.summary(full=True)))
    assert full["writer_id"] == "w-1" and full["arguments"] == {"to": "ann"}
    assert full["seq"] == 9 and full["idempotency_key"] == "k" and "writer" not in full


def _log_bytes(path: Path) -> dict[int, bytes]:
    return dict(LogScan(str(path)))


def test_the_live_state_holds_the_bytes_the_log_holds(tmp_path: Path) -> None:
    """One feed path: the live journal feeds its state the bytes it appended, as a replay
    does, so an open execution keeps exactly the intent's bytes in the log."""
    path = tmp_path / "j"
    seen: dict[str, Any] = {}

    def probe(**arguments: Any) -> str:
        (execution_id, execution), = journal._core.state.executions.items()
        seen["raw"], seen["seq"] = execution._raw, execution.seq
        return "ok"

    with walj.ToolJournal.open(path, tools={"probe": probe}, sync="never") as journal:
        with journal.turn() as turn:
            turn.dispatch("probe", {"x": [1, 2]}, call_id="c-1")
    assert seen["raw"] == _log_bytes(path)[seen["seq"]]


def test_a_skipped_checkpoint_leaves_the_live_state_equal_to_a_replay(tmp_path: Path) -> None:
    """A checkpoint whose item cannot fit a record is skipped: the skip is the automatic
    checkpoint's own, so the live state's count of checkpointed records stays what a replay
    of the log rebuilds (it used to be set outside the feed)."""
    path = tmp_path / "j"

    def lost(**arguments: Any) -> None:
        raise walj.ToolOutcomeUnknown("connection lost")

    options: dict[str, Any] = {"tools": {"send": lost}, "sync": "never", "store_arguments": True,
                               "max_record_bytes": 4096, "checkpoint_every": 3}
    with walj.ToolJournal.open(path, **options) as journal:
        with pytest.raises(walj.ToolOutcomeUnknown), journal.turn() as turn:
            turn.dispatch("send", {"body": "x" * 2600}, call_id="c-1")
        for _ in range(4):
            with journal.turn():
                pass
        live = journal._core.state
        replayed = rebuild(_log_bytes(path).items())
        assert live.records == replayed.records > 3
        assert live.checkpointed_records == replayed.checkpointed_records == 0
    assert not any(rc.record_kind(data) == rc.CHECKPOINT for data in _log_bytes(path).values())
