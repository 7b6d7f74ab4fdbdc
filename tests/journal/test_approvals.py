"""Approvals (docs/RECOVERY.md, "Approvals"): a call that needs one writes a durable request and
runs nothing; a person's decision is durable; an approval runs exactly the approved call, once,
and the live state always equals a replay of the log. Sync, async and handle_function_calls."""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path
from typing import Any

import pytest
from journal_helpers import Recorder, kinds, records, unknown

import walj
from walj.journal import records as rc
from walj.journal.state import rebuild


def _open(path: Path, tools: dict[str, Any], **options: Any) -> walj.ToolJournal:
    return walj.ToolJournal.open(path, tools=tools, store_outputs=True, **options)


def _dispatch(journal: walj.ToolJournal, name: str, arguments: dict[str, Any],
              call_id: str | None = "c1", **options: Any) -> walj.ToolResult:
    with journal.turn() as turn:
        return turn.dispatch(name, arguments, call_id=call_id, **options)


def _replayed(path: Path) -> walj.Recovery:
    return rebuild((r.seq, r.data) for r in walj.read(path)).snapshot()


def _same_as_replay(journal: walj.ToolJournal) -> None:
    """The live approvals are exactly what a replay of the log rebuilds."""
    live, replay = journal.recovery, _replayed(journal.path)
    assert (live.approvals, live.approved) == (replay.approvals, replay.approved)


def test_a_call_waits_for_approval_then_runs_once_with_exactly_the_approved_arguments(
        tmp_path: Path) -> None:
    send = Recorder({"sent": True})
    path = tmp_path / "j"
    with _open(path, {"send": walj.Tool(send, approval=True)}) as journal:
        first = _dispatch(journal, "send", {"to": "ann"})
        assert (first.outcome, first.output, first.execution_id) == ("awaiting_approval", None, "")
        assert first.approval_id is not None and first.approval_id in (first.error or "")
        assert not journal.is_blocked()  # rule 7
        (pending,) = journal.recovery.approvals
        assert (pending.approval_id, pending.tool, pending.call_id, pending.status) == (
            first.approval_id, "send", "c1", "pending")
        assert pending.arguments_preview == '{"to":"ann"}'
        _same_as_replay(journal)
        # Rule 3: still pending: the same id, nothing written.
        count = len(kinds(path))
        assert _dispatch(journal, "send", {"to": "ann"}).approval_id == first.approval_id
        assert kinds(path).count(rc.APPROVAL_REQUESTED) == 1
        assert len(kinds(path)) == count + 2  # that turn's start and completion only
        approved = journal.approve(first.approval_id, actor="ann@ops", note="looks right")
        assert (approved.status, approved.actor, approved.note) == ("approved", "ann@ops",
                                                                    "looks right")
        assert journal.recovery.approvals == () and journal.recovery.approved == (approved,)
        _same_as_replay(journal)
        # Rule 5: other arguments under the approved call id: refused, the approval stands.
        other = _dispatch(journal, "send", {"to": "bob"})
        assert (other.outcome, other.approval_id) == ("refused", first.approval_id)
        assert journal.approval(first.approval_id).status == "approved"
        # Rule 4: the approved arguments run, and the intent names the approval.
        ran = _dispatch(journal, "send", {"to": "ann"})
        assert (ran.outcome, ran.output, ran.approval_id) == ("ok", {"sent": True},
                                                              first.approval_id)
        consumed = journal.approval(first.approval_id)
        assert (consumed.status, consumed.execution_id) == ("consumed", ran.execution_id)
        assert journal.recovery.approved == ()
        _same_as_replay(journal)
        # Rule 1: settled: answered from its record, never run again on the same approval.
        again = _dispatch(journal, "send", {"to": "ann"})
        assert (again.outcome, again.replayed) == ("ok", True)
    assert send.calls == [{"to": "ann"}]
    data = records(path)
    (intent,) = [r for r in data if r["kind"] == rc.STARTED]
    assert intent["approval_id"] == first.approval_id
    (decided,) = [r for r in data if r["kind"] == rc.APPROVAL_DECIDED]
    assert decided["decision"] == "approved" and "request" not in decided
    with _open(path, {"send": walj.Tool(send, approval=True)}) as journal:
        assert journal.approval(first.approval_id) == consumed
        assert _dispatch(journal, "send", {"to": "ann"}).replayed
    assert len(send.calls) == 1


def test_a_denied_or_expired_approval_never_runs_and_answers_the_same_way_again(
        tmp_path: Path) -> None:
    send = Recorder()
    path = tmp_path / "j"
    with _open(path, {"send": walj.Tool(send, approval=True)}) as journal:
        denied_id = _dispatch(journal, "send", {"to": "ann"}, "c1").approval_id
        expiring_id = _dispatch(journal, "send", {"to": "bob"}, "c2").approval_id
        denied = journal.deny(denied_id, actor="ann@ops", note="not this one")
        assert denied.status == "denied"
        journal.approve(expiring_id, actor="ann@ops", expires_at=time.time() + 0.05)
        time.sleep(0.1)
        for _ in range(2):  # final: a later dispatch answers the same way, writes nothing
            no = _dispatch(journal, "send", {"to": "ann"}, "c1")
            assert (no.outcome, no.approval_id, no.execution_id) == ("denied", denied_id, "")
            assert "ann@ops" in (no.error or "") and "not this one" in (no.error or "")
            late = _dispatch(journal, "send", {"to": "bob"}, "c2")
            assert (late.outcome, late.approval_id) == ("approval_expired", expiring_id)
        assert journal.recovery.approved[0].expired(time.time())
        _same_as_replay(journal)
        with pytest.raises(walj.ApprovalError) as refused:
            journal.approve(denied_id, actor="bob@ops")
        assert refused.value.reason == "not_pending"
    assert send.calls == []
    assert kinds(path).count(rc.APPROVAL_REQUESTED) == 2
    assert rc.STARTED not in kinds(path)


def test_not_performed_after_a_consumed_approval_needs_a_new_approval(tmp_path: Path) -> None:
    path = tmp_path / "j"
    with _open(path, {"send": walj.Tool(unknown, approval=True)}) as journal:
        first = _dispatch(journal, "send", {"x": 1}).approval_id
        journal.approve(first, actor="ann@ops")
        with pytest.raises(walj.ToolOutcomeUnknown):
            _dispatch(journal, "send", {"x": 1})
        assert journal.approval(first).status == "consumed"
        # Rule 1: ambiguous: blocked as today, and no request is written for it.
        assert _dispatch(journal, "send", {"x": 1}).outcome == "blocked"
        (blocker,) = journal.recovery.blockers
        journal.resolve(blocker.execution_id, "not_performed", actor="ann@ops")
        # Rule 2: the latest request was consumed: a new one.
        second = _dispatch(journal, "send", {"x": 1})
        assert second.outcome == "awaiting_approval" and second.approval_id != first
        _same_as_replay(journal)
    assert kinds(path).count(rc.APPROVAL_REQUESTED) == 2


def test_a_policy_decides_per_call_fails_closed_and_a_caller_cannot_waive_it(
        tmp_path: Path) -> None:
    send = Recorder()

    def big(arguments: dict[str, Any]) -> Any:
        amount = arguments.pop("amount", 1000)  # a copy: what runs is what was fingerprinted
        return None if arguments.get("odd") else amount > 100

    def broken(arguments: dict[str, Any]) -> bool:
        raise RuntimeError("policy failed")

    tools = {"pay": walj.Tool(send, approval=big), "plain": send,
             "broken": walj.Tool(send, approval=broken)}
    with _open(tmp_path / "j", tools) as journal:
        assert _dispatch(journal, "pay", {"amount": 5}, "c1").outcome == "ok"
        assert _dispatch(journal, "pay", {"amount": 500}, "c2").outcome == "awaiting_approval"
        assert _dispatch(journal, "pay", {"odd": 1}, "c3").outcome == "awaiting_approval"
        assert _dispatch(journal, "broken", {}, "c4").outcome == "awaiting_approval"
        assert _dispatch(journal, "pay", {"amount": 500}, "c5",
                         approval=False).outcome == "awaiting_approval"
        assert _dispatch(journal, "plain", {}, "c6", approval=True).outcome == "awaiting_approval"
        assert _dispatch(journal, "plain", {}, "c7", approval=None).outcome == "ok"
        with pytest.raises(TypeError):
            _dispatch(journal, "plain", {}, "c8", approval="yes")
        with pytest.raises(TypeError):
            walj.Tool(send, approval="yes")  # type: ignore[arg-type]
    assert send.calls == [{"amount": 5}, {}]


def test_a_call_that_needs_approval_without_a_call_id_is_refused_before_anything_is_written(
        tmp_path: Path) -> None:
    send = Recorder()
    path = tmp_path / "j"
    with _open(path, {"send": walj.Tool(send, approval=True)}) as journal:
        with pytest.raises(walj.ApprovalError) as refused:
            _dispatch(journal, "send", {}, None)
        assert refused.value.reason == "call_id_required"
        results = journal.handle_function_calls([
            {"name": "send", "arguments": "{}"},
            {"name": "send", "arguments": '{"to": "ann"}', "call_id": "fc1"}])
    assert results[0]["error"] and "call_id" in results[0]["error"]
    assert results[1]["output"] is None and "awaits" in results[1]["error"]
    assert send.calls == []
    assert rc.STARTED not in kinds(path) and kinds(path).count(rc.APPROVAL_REQUESTED) == 1


def test_approve_and_deny_refuse_bad_input_and_write_nothing(tmp_path: Path) -> None:
    path = tmp_path / "j"
    with _open(path, {"send": walj.Tool(Recorder(), approval=True)}) as journal:
        approval_id = _dispatch(journal, "send", {}).approval_id
        before = len(kinds(path))
        cases: list[tuple[Any, dict[str, Any], str]] = [
            ("apv-" + "0" * 32, {}, "unknown"), (None, {}, "unknown"),
            (approval_id, {"actor": "policy"}, "bad_actor"),
            (approval_id, {"actor": "reconcile:send"}, "bad_actor"),
            (approval_id, {"actor": "ann\n[ok] bob"}, "bad_actor"),
            (approval_id, {"note": 3}, "note_required"),
            (approval_id, {"expires_at": time.time() - 1}, "bad_expiry"),
            (approval_id, {"expires_at": math.nan}, "bad_expiry"),
            (approval_id, {"expires_at": True}, "bad_expiry"),
            (approval_id, {"expires_at": "tomorrow"}, "bad_expiry"),
        ]
        for target, given, reason in cases:
            options = {"actor": "ann@ops", **given}
            with pytest.raises(walj.ApprovalError) as refused:
                journal.approve(target, **options)
            assert refused.value.reason == reason, (target, given)
            if "expires_at" not in given:
                with pytest.raises(walj.ApprovalError):
                    journal.deny(target, **options)
        assert len(kinds(path)) == before
        assert journal.approval(approval_id).status == "pending"
        with pytest.raises(walj.ApprovalError) as unknown_id:
            journal.approval("nope")
        assert unknown_id.value.reason == "unknown"
        assert isinstance(unknown_id.value, walj.WaljError)


class Ends(walj.ToolObserver):
    def __init__(self) -> None:
        self.ends: list[tuple[str, str | None]] = []

    def on_end(self, end: walj.ExecutionEnd) -> None:
        assert end.result is not None
        self.ends.append((end.outcome, end.result.approval_id))


def test_a_pending_request_blocks_no_other_call_and_observers_see_the_answer(
        tmp_path: Path) -> None:
    send, other, seen = Recorder(), Recorder("other"), Ends()
    tools = {"send": walj.Tool(send, approval=True), "other": other}
    with _open(tmp_path / "j", tools, observers=[seen]) as j:
        with j.turn() as turn:
            waiting = turn.dispatch("send", {}, call_id="c1")
            assert waiting.outcome == "awaiting_approval"
            assert turn.dispatch("other", {}, call_id="c2").outcome == "ok"
        assert not j.is_blocked() and not j.recovery.blocked
        assert _dispatch(j, "other", {}, "c3").outcome == "ok"
    assert len(other.calls) == 2 and send.calls == []
    assert seen.ends == [("awaiting_approval", waiting.approval_id), ("ok", None),
                         ("ok", None)]


def test_adispatch_applies_the_same_rules(tmp_path: Path) -> None:
    calls: list[dict[str, Any]] = []

    async def send(**arguments: Any) -> str:
        calls.append(arguments)
        return "sent"

    async def main(journal: walj.ToolJournal) -> list[walj.ToolResult]:
        results = []
        for arguments, decide in (({"to": "ann"}, True), ({"to": "bob"}, False),
                                  ({"to": "ann"}, False)):
            async with journal.turn() as turn:
                result = await turn.adispatch("send", arguments, call_id="c1")
            results.append(result)
            if decide:
                assert result.approval_id is not None
                journal.approve(result.approval_id, actor="ann@ops")
        return results

    with _open(tmp_path / "j", {"send": walj.Tool(send, approval=True)}) as journal:
        waiting, other, ran = asyncio.run(main(journal))
        _same_as_replay(journal)
    assert [r.outcome for r in (waiting, other, ran)] == ["awaiting_approval", "refused", "ok"]
    assert ran.approval_id == waiting.approval_id and calls == [{"to": "ann"}]


def _raw_log(path: Path, *data: dict[str, Any]) -> None:
    with walj.Log.open(path) as log:
        for record in data:
            log.append({"version": rc.CONTRACT_VERSION, **record}, durable=True)


_REQUEST = {"kind": rc.APPROVAL_REQUESTED, "at": 1.0, "approval_id": "apv-" + "a" * 32,
            "turn_sequence": 1, "tool": "send", "call_id": "c1", "arguments_sha256": "0" * 64,
            "arguments_preview": "{}", "idempotency_key": "k", "requested_by": None}


@pytest.mark.parametrize("field, value", [
    ("approval_id", "apv-\x1b[31m"), ("approval_id", 7), ("call_id", None), ("tool", ["x"]),
    ("arguments_sha256", 1)])
def test_a_request_record_with_an_unreadable_field_is_refused_on_open(
        tmp_path: Path, field: str, value: Any) -> None:
    _raw_log(tmp_path / "j", {**_REQUEST, field: value})
    with pytest.raises(walj.CorruptionError):
        walj.ToolJournal.open(tmp_path / "j")


@pytest.mark.parametrize("field, value", [
    ("decision", "maybe"), ("decision", None), ("actor", 3), ("expires_at", "soon"),
    ("expires_at", -1.0)])
def test_a_decision_record_with_an_unreadable_field_is_refused_on_open(
        tmp_path: Path, field: str, value: Any) -> None:
    decided = {"kind": rc.APPROVAL_DECIDED, "at": 2.0, "approval_id": _REQUEST["approval_id"],
               "decision": "approved", "actor": "ann", "note": None, "expires_at": None}
    _raw_log(tmp_path / "j", _REQUEST, {**decided, field: value})
    with pytest.raises(walj.CorruptionError):
        walj.ToolJournal.open(tmp_path / "j")


def test_a_decision_of_an_unknown_or_decided_request_and_a_mismatched_intent_change_nothing(
        tmp_path: Path) -> None:
    approval_id = _REQUEST["approval_id"]
    decided = {"kind": rc.APPROVAL_DECIDED, "at": 2.0, "approval_id": approval_id,
               "decision": "approved", "actor": "ann", "note": None, "expires_at": None}
    _raw_log(tmp_path / "j", {**decided, "approval_id": "apv-" + "b" * 32}, _REQUEST, decided,
             {**decided, "decision": "denied", "actor": "mallory"},
             {"kind": rc.STARTED, "execution_id": "e" * 32, "at": 3.0, "turn_sequence": 1,
              "tool": "send", "call_id": "c1", "arguments_sha256": "1" * 64,
              "idempotency_key": "k", "approval_id": approval_id},
             {"kind": rc.FINISHED, "execution_id": "e" * 32, "at": 3.0, "outcome": "ok"})
    with walj.ToolJournal.open(tmp_path / "j") as journal:
        found = journal.approval(approval_id)
        assert (found.status, found.actor) == ("approved", "ann")
        with pytest.raises(walj.ApprovalError):
            journal.approval("apv-" + "b" * 32)
