"""Replay of a settled call: a re-dispatched caller-given call id is answered from its record
(or refused), durably, and its handler never runs again; sync, async and across a reopen."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from journal_helpers import Recorder, kinds, records

import walj
from walj.journal import records as rc
from walj.journal._callindex import CallIndex, Forgotten
from walj.journal.records import raw_call_key
from walj.journal.state import rebuild


def _open(path: Path, tools: dict[str, Any] | None = None, **options: Any) -> walj.ToolJournal:
    options.setdefault("store_outputs", True)
    return walj.ToolJournal.open(path, tools=tools, **options)


def _dispatch(journal: walj.ToolJournal, name: str, arguments: dict[str, Any],
              call_id: str | None) -> walj.ToolResult:
    with journal.turn() as turn:
        return turn.dispatch(name, arguments, call_id=call_id)


def test_an_ok_call_is_replayed_from_its_stored_output_without_running_again(
        tmp_path: Path) -> None:
    handler = Recorder({"sent": 1})
    with _open(tmp_path / "j", {"send": handler}) as journal:
        assert journal.store_outputs is True
        first = _dispatch(journal, "send", {"to": "ann"}, "c1")
        again = _dispatch(journal, "send", {"to": "ann"}, "c1")
    assert len(handler.calls) == 1
    assert (first.outcome, first.replayed) == ("ok", False)
    assert (again.outcome, again.output, again.error, again.replayed) == (
        "ok", {"sent": 1}, None, True)
    assert again.execution_id == first.execution_id
    data = records(tmp_path / "j")
    finished = next(r for r in data if r["kind"] == rc.FINISHED)
    assert finished["output"] == {"sent": 1}
    replayed = [r for r in data if r["kind"] == rc.REPLAYED]
    assert len(replayed) == 1
    assert replayed[0]["execution_id"] == first.execution_id
    assert replayed[0]["outcome"] == "ok" and replayed[0]["call_id"] == "c1"


def test_replay_survives_a_reopen_and_answers_before_the_blocked_check(tmp_path: Path) -> None:
    path = tmp_path / "j"
    handler = Recorder([1, "two"])
    with _open(path, {"send": handler}) as journal:
        _dispatch(journal, "send", {"to": "ann"}, "c1")
        with pytest.raises(KeyboardInterrupt), journal.turn() as turn:
            turn.dispatch("boom", {}, call_id="c2", handler=_interrupt)
    with _open(path, {"send": handler}) as journal:
        assert journal.is_blocked()
        again = _dispatch(journal, "send", {"to": "ann"}, "c1")
        fresh = _dispatch(journal, "send", {"to": "bob"}, "c3")
    assert (again.outcome, again.output, again.replayed) == ("ok", [1, "two"], True)
    assert fresh.outcome == "blocked"
    assert len(handler.calls) == 1


def _interrupt(**_: Any) -> None:
    raise KeyboardInterrupt


def _fail(**_: Any) -> None:
    raise RuntimeError("no route")


def test_error_and_cancelled_outcomes_are_replayed_with_their_error(tmp_path: Path) -> None:
    cancelled = Recorder()

    def cancel(**arguments: Any) -> None:
        cancelled(**arguments)
        raise walj.ToolCancelled("person said no")

    with _open(tmp_path / "j", {"fail": _fail, "cancel": cancel}) as journal:
        first = _dispatch(journal, "fail", {}, "e1")
        again = _dispatch(journal, "fail", {}, "e1")
        first_cancel = _dispatch(journal, "cancel", {}, "x1")
        again_cancel = _dispatch(journal, "cancel", {}, "x1")
    assert first.outcome == again.outcome == "error"
    assert again.error == first.error and "no route" in str(again.error) and again.replayed
    assert first_cancel.outcome == again_cancel.outcome == "cancelled"
    assert again_cancel.error == first_cancel.error and again_cancel.replayed
    assert len(cancelled.calls) == 1


def test_different_arguments_under_a_settled_call_id_are_refused(tmp_path: Path) -> None:
    handler = Recorder()
    with _open(tmp_path / "j", {"send": handler}) as journal:
        first = _dispatch(journal, "send", {"to": "ann"}, "c1")
        other = _dispatch(journal, "send", {"to": "bob"}, "c1")
    assert len(handler.calls) == 1
    assert (other.outcome, other.replayed) == ("refused", False)
    assert "different arguments" in str(other.error)
    assert other.output["reason"] == rc.REFUSED_ARGUMENTS_DIFFER
    refused = next(r for r in records(tmp_path / "j") if r["kind"] == rc.REFUSED)
    assert refused["refused_reason"] == rc.REFUSED_ARGUMENTS_DIFFER
    assert refused["settled_execution_id"] == first.execution_id
    assert refused["execution_id"] == other.execution_id != first.execution_id


@pytest.mark.parametrize(("options", "result", "why"), [
    ({"store_outputs": False}, "x", "did not store outputs"),
    ({"max_stored_output_bytes": 16}, "x" * 40, "larger than"),
    ({}, {1, 2}, "could not be stored as JSON"),
])
def test_an_ok_call_without_its_output_is_refused_not_run_again(
        tmp_path: Path, options: dict[str, Any], result: Any, why: str) -> None:
    handler = Recorder(result)
    with _open(tmp_path / "j", {"send": handler}, **options) as journal:
        first = _dispatch(journal, "send", {}, "c1")
    with _open(tmp_path / "j", {"send": handler}) as journal:
        again = _dispatch(journal, "send", {}, "c1")
    assert first.outcome == "ok" and first.output == result
    assert again.outcome == "refused" and why in str(again.error)
    assert again.output["reason"] == rc.REFUSED_OUTPUT_NOT_STORED
    assert len(handler.calls) == 1


def test_an_output_too_large_for_the_log_is_not_stored_and_the_call_succeeds(
        tmp_path: Path) -> None:
    with _open(tmp_path / "j", {"send": Recorder("y" * 20_000)}, max_record_bytes=16_000,
               output_preview_chars=100, max_stored_output_bytes=10**6) as journal:
        assert journal.max_stored_output_bytes is not None
        assert journal.max_stored_output_bytes < 16_000
        result = _dispatch(journal, "send", {}, "c1")
    assert result.outcome == "ok"
    finished = next(r for r in records(tmp_path / "j") if r["kind"] == rc.FINISHED)
    assert finished["output_not_stored"] == rc.OUTPUT_TOO_LARGE and "output" not in finished


def test_a_record_limit_that_leaves_no_room_for_outputs_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no room to store outputs"):
        _open(tmp_path / "j", max_record_bytes=4096)
    with pytest.raises(ValueError, match="replay_window"):
        _open(tmp_path / "j", replay_window=0)


def test_generated_call_ids_are_never_replayed(tmp_path: Path) -> None:
    handler = Recorder()
    with _open(tmp_path / "j", {"send": handler}) as journal:
        with journal.turn() as turn:
            turn.dispatch("send", {})
        with journal.turn() as turn:
            turn.dispatch("send", {})
            turn.dispatch("send", {}, call_id="turn-1-call-1")  # a caller's id: not replayed
    assert len(handler.calls) == 3
    started = [r for r in records(tmp_path / "j") if r["kind"] == rc.STARTED]
    assert [r.get("call_id_generated") for r in started] == [True, True, None]


def _interrupted(path: Path, arguments: dict[str, Any]) -> str:
    """A journal whose call c1 was interrupted; its execution id."""
    with _open(path) as journal:
        with pytest.raises(KeyboardInterrupt), journal.turn() as turn:
            turn.dispatch("send", arguments, call_id="c1", handler=_interrupt)
        return journal.recovery.blockers[0].execution_id or ""


@pytest.mark.parametrize(("outcome", "output", "expected", "expected_output"), [
    ("succeeded", {"id": 9}, "ok", {"id": 9}),
    ("succeeded", None, "ok", None),
    ("failed", None, "error", None),
])
def test_a_resolved_call_is_answered_from_its_resolution(
        tmp_path: Path, outcome: str, output: Any, expected: str, expected_output: Any) -> None:
    path = tmp_path / "j"
    execution_id = _interrupted(path, {"to": "ann"})
    handler = Recorder()
    with _open(path, {"send": handler}) as journal:
        journal.resolve(execution_id, outcome, actor="ann", note="checked the outbox",
                        output=output)
    with _open(path, {"send": handler}) as journal:
        again = _dispatch(journal, "send", {"to": "ann"}, "c1")
    assert handler.calls == []
    assert (again.outcome, again.replayed, again.execution_id) == (expected, True, execution_id)
    if expected_output is not None:
        assert again.output == expected_output
    elif expected == "ok":
        assert again.output["status"] == "already_done"
        assert "resolved by ann" in again.output["message"]
    else:
        assert again.error is not None and "resolved failed by ann" in again.error


def test_a_call_resolved_not_performed_runs_afresh(tmp_path: Path) -> None:
    path = tmp_path / "j"
    execution_id = _interrupted(path, {"to": "ann"})
    handler = Recorder()
    with _open(path, {"send": handler}) as journal:
        journal.resolve(execution_id, "not_performed", actor="ann")
        again = _dispatch(journal, "send", {"to": "ann"}, "c1")
        third = _dispatch(journal, "send", {"to": "ann"}, "c1")
    assert (again.outcome, again.replayed) == ("ok", False)
    assert third.replayed and third.execution_id == again.execution_id
    assert len(handler.calls) == 1


def test_an_unresolved_interrupted_call_is_its_own_blocker(tmp_path: Path) -> None:
    path = tmp_path / "j"
    execution_id = _interrupted(path, {"to": "ann"})
    handler = Recorder()
    with _open(path, {"send": handler}) as journal:
        again = _dispatch(journal, "send", {"to": "ann"}, "c1")
    assert again.outcome == "blocked" and not again.replayed
    assert again.output["ambiguous_executions"][0]["execution_id"] == execution_id
    assert handler.calls == []


def test_a_call_only_ever_blocked_runs_once_nothing_blocks(tmp_path: Path) -> None:
    path = tmp_path / "j"
    _interrupted(path, {"to": "ann"})
    handler = Recorder()
    with _open(path, {"send": handler}) as journal:
        blocked = _dispatch(journal, "send", {"to": "bob"}, "c2")
        again = _dispatch(journal, "send", {"to": "bob"}, "c2")
        journal.resolve(journal.recovery.blockers[0].execution_id or "", "failed",
                        actor="ann", note="bounced")
        ran = _dispatch(journal, "send", {"to": "bob"}, "c2")
    assert blocked.outcome == again.outcome == "blocked"
    assert (ran.outcome, ran.replayed) == ("ok", False)
    assert len(handler.calls) == 1


def test_a_guard_refusal_is_not_a_settled_call(tmp_path: Path) -> None:
    allow = [False]

    def guard(context: walj.ToolContext) -> None:
        if not allow[0]:
            raise walj.ToolBlocked("not yet")

    handler = Recorder()
    with _open(tmp_path / "j", {"send": walj.Tool(handler, guard=guard)}) as journal:
        assert _dispatch(journal, "send", {}, "c1").outcome == "blocked"
        allow[0] = True
        assert _dispatch(journal, "send", {}, "c1").outcome == "ok"
        assert _dispatch(journal, "send", {}, "c1").replayed
    assert len(handler.calls) == 1


def test_handle_function_calls_replays_by_call_id(tmp_path: Path) -> None:
    handler = Recorder("sent")
    calls = [{"name": "send", "arguments": '{"to": "ann"}', "call_id": "fc_1"},
             {"name": "send", "arguments": '{"to": "bob"}'}]
    with _open(tmp_path / "j", {"send": handler}) as journal:
        first = journal.handle_function_calls(calls)
        again = journal.handle_function_calls(calls)
    assert first[0]["output"] == again[0]["output"] == "sent"
    assert len(handler.calls) == 3  # the call without an id ran twice
    assert kinds(tmp_path / "j").count(rc.REPLAYED) == 1


def test_async_dispatch_replays_and_refuses(tmp_path: Path) -> None:
    handler_calls: list[dict[str, Any]] = []

    async def send(**arguments: Any) -> str:
        handler_calls.append(arguments)
        return "sent"

    async def run() -> tuple[walj.ToolResult, ...]:
        with _open(tmp_path / "j", {"send": send}) as journal:
            async with journal.turn() as turn:
                first = await turn.adispatch("send", {"to": "ann"}, call_id="c1")
                again = await turn.adispatch("send", {"to": "ann"}, call_id="c1")
                other = await turn.adispatch("send", {"to": "bob"}, call_id="c1")
            return first, again, other

    first, again, other = asyncio.run(run())
    assert (again.outcome, again.output, again.replayed) == ("ok", "sent", True)
    assert again.execution_id == first.execution_id
    assert other.outcome == "refused"
    assert len(handler_calls) == 1


def test_a_call_older_than_the_window_is_refused_not_run(tmp_path: Path) -> None:
    path = tmp_path / "j"
    handler = Recorder()
    with _open(path, {"send": handler}, replay_window=3) as journal:
        for number in range(5):
            _dispatch(journal, "send", {}, f"c{number}")
        assert journal.replay_window == 3
        old = _dispatch(journal, "send", {}, "c0")
        recent = _dispatch(journal, "send", {}, "c4")
        new = _dispatch(journal, "send", {}, "c9")
    with _open(path, {"send": handler}, replay_window=3) as journal:
        reopened = _dispatch(journal, "send", {}, "c1")
    assert old.outcome == reopened.outcome == "refused"
    assert old.output["reason"] == rc.REFUSED_OUTSIDE_WINDOW and "replay window" in old.error
    assert recent.replayed and new.outcome == "ok" and not new.replayed
    assert len(handler.calls) == 6


def test_the_index_holds_at_most_the_window() -> None:
    index = CallIndex(100)
    for number in range(1000):
        index.settle(f"call-{number}", "0" * 64, number)
    assert len(index.settled) == 100
    assert index.find("call-999") == (("0" * 64), 999)
    assert isinstance(index.find("call-0"), Forgotten)
    index.unsettle("call-999")
    assert index.find("call-999") is None


def test_the_rebuild_fast_path_and_the_decoded_path_index_the_same(tmp_path: Path) -> None:
    path = tmp_path / "j"
    with _open(path, {"send": Recorder()}) as journal:
        for call_id in ("plain", "ünïcode", 'quote"d', "back\\slash"):
            _dispatch(journal, "send", {"k": call_id}, call_id)
        _dispatch(journal, "send", {}, None)
    raw = [(r.seq, r.data) for r in walj.read(path)]
    from walj._codec import encode
    from_bytes = rebuild((seq, encode(data)) for seq, data in raw)
    from_dicts = rebuild(raw)
    assert list(from_bytes.calls.settled.items()) == list(from_dicts.calls.settled.items())
    assert sorted(from_dicts.calls.settled) == sorted(["plain", "ünïcode", 'quote"d',
                                                       "back\\slash"])
    started = next(encode(d) for _, d in raw if d["kind"] == rc.STARTED)
    assert raw_call_key(started) == ("plain", raw[1][1]["arguments_sha256"])


def test_the_cli_shows_replayed_and_refused_calls(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from walj.cli._main import main

    path = tmp_path / "j"
    with _open(path, {"send": Recorder()}) as journal:
        _dispatch(journal, "send", {"to": "ann"}, "c1")
        _dispatch(journal, "send", {"to": "ann"}, "c1")
        refused = _dispatch(journal, "send", {"to": "bob"}, "c1")
    assert main(["timeline", "--json", str(path)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["schema"] == "walj.timeline/3"
    (answered,) = [item for turn in report["turns"] for item in turn["replayed"]]
    (turned_away,) = [item for turn in report["turns"] for item in turn["refused"]]
    assert answered["outcome"] == "ok" and turned_away["outcome"] == "refused"
    assert turned_away["refused_reason"] == rc.REFUSED_ARGUMENTS_DIFFER
    assert main(["timeline", str(path)]) == 0
    text = capsys.readouterr().out
    rows = [" ".join(line.split()) for line in text.splitlines()]
    assert any("ok - REPLAYED" in row for row in rows)
    assert any("refused - REFUSED" in row for row in rows)
    assert main(["dump", str(path)]) == 0
    assert "replayed ok from record" in capsys.readouterr().out
    assert main(["inspect", str(path), refused.execution_id]) == 0
    assert "call id already settled: arguments_differ" in capsys.readouterr().out


def test_async_replay_after_a_reopen_answers_a_resolution_in_the_same_session(
        tmp_path: Path) -> None:
    path = tmp_path / "j"
    ran: list[dict[str, Any]] = []

    async def send(**arguments: Any) -> str:
        ran.append(arguments)
        if len(ran) == 1:
            raise walj.ToolOutcomeUnknown("connection lost after the request went out")
        return "sent"

    async def first() -> None:
        with _open(path, {"send": send}) as journal:
            async with journal.turn() as turn:
                with pytest.raises(walj.ToolOutcomeUnknown):
                    await turn.adispatch("send", {"to": "ann"}, call_id="c1")
            blocked = await _adispatch(journal, {"to": "ann"}, "c1")
            assert blocked.outcome == "blocked" and not blocked.replayed
            journal.resolve(journal.recovery.blockers[0].execution_id or "", "succeeded",
                            actor="ann", output={"id": 7})
            same_session = await _adispatch(journal, {"to": "ann"}, "c1")
            assert (same_session.outcome, same_session.output) == ("ok", {"id": 7})

    async def second() -> tuple[walj.ToolResult, walj.ToolResult]:
        with _open(path, {"send": send}) as journal:
            again = await _adispatch(journal, {"to": "ann"}, "c1")
            refused = await _adispatch(journal, {"to": "bob"}, "c1")
            return again, refused

    asyncio.run(first())
    again, refused = asyncio.run(second())
    assert (again.outcome, again.output, again.replayed) == ("ok", {"id": 7}, True)
    assert refused.outcome == "refused"
    assert len(ran) == 1


async def _adispatch(journal: walj.ToolJournal, arguments: dict[str, Any],
                     call_id: str) -> walj.ToolResult:
    async with journal.turn() as turn:
        return await turn.adispatch("send", arguments, call_id=call_id)


def test_handle_function_calls_returns_a_refusal_as_the_call_error(tmp_path: Path) -> None:
    handler = Recorder("sent")
    with _open(tmp_path / "j", {"send": handler}) as journal:
        journal.handle_function_calls([{"name": "send", "arguments": {"to": "ann"},
                                        "call_id": "fc_1"}])
        [refused] = journal.handle_function_calls([{"name": "send", "arguments": {"to": "bob"},
                                                    "call_id": "fc_1"}])
    assert refused["error"] is not None and "different arguments" in refused["error"]
    assert refused["output"]["status"] == "refused_settled_call"
    assert len(handler.calls) == 1
