"""The five scenarios of the journal's design, plus the lifecycle's durability points."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from journal_helpers import Recorder, kinds, records

import walj
from walj.journal import records as rc
from walj.log._log import Log


def test_intent_and_terminal_records_are_durable_whatever_the_sync_mode(tmp_path: Path) -> None:
    seen: list[tuple[int, int]] = []

    def tool(**_: Any) -> str:
        log = journal._log
        seen.append((log.durable_seq, log.last_seq))
        return "ok"

    journal = walj.ToolJournal.open(tmp_path / "j", tools={"tool": tool}, sync="never")
    with journal.turn() as turn:
        turn.dispatch("tool", {})
        after_first = (journal._log.durable_seq, journal._log.last_seq)
        turn.dispatch("tool", {})
    journal.close()
    assert seen[0][0] == seen[0][1]  # the intent was fsynced before the handler ran
    assert after_first[0] == after_first[1]  # the terminal record before the next dispatch


def test_scenario_1_finished_tool_stays_finished_and_interrupted_one_is_ambiguous(
    tmp_path: Path,
) -> None:
    def interrupted(**_: Any) -> None:
        raise KeyboardInterrupt

    path = tmp_path / "j"
    journal = walj.ToolJournal.open(path, tools={"ok": Recorder(), "slow": interrupted},
                                    sync="never")
    with pytest.raises(KeyboardInterrupt), journal.turn() as turn:
        first = turn.dispatch("ok", {"n": 1})
        durable_after_first = journal._log.durable_seq
        turn.dispatch("slow", {"n": 2})
    assert first.outcome == "ok"
    assert journal.recovery.blocked  # fail closed in this process too
    journal.close()

    data = records(path)
    assert [r["kind"] for r in data] == [
        rc.TURN_STARTED, rc.STARTED, rc.FINISHED, rc.STARTED, rc.AMBIGUOUS]
    assert data[2]["execution_id"] == first.execution_id and data[2]["outcome"] == "ok"
    assert durable_after_first >= 3  # the first terminal record was durable before the second
    assert data[4]["error_type"] == "KeyboardInterrupt"
    assert data[4]["execution_id"] == data[3]["execution_id"]

    with walj.ToolJournal.open(path) as reopened:
        blockers = reopened.recovery.blockers
        assert [(b.tool, b.state) for b in blockers] == [("slow", "ambiguous")]
        assert blockers[0].error_type == "KeyboardInterrupt"


def test_scenario_2_a_lone_started_record_blocks_dispatch(tmp_path: Path) -> None:
    path = tmp_path / "j"
    with Log.open(path) as log:  # what a hard crash right after the intent leaves
        log.append({"kind": rc.TURN_STARTED, "version": 2, "turn_sequence": 1, "at": 1.0})
        log.append({"kind": rc.STARTED, "version": 2, "execution_id": "e" * 32, "at": 1.0,
                    "turn_sequence": 1, "tool": "send", "call_id": "c1",
                    "arguments_sha256": "0" * 64, "idempotency_key": "1" * 32,
                    "arguments_preview": '{"to":"x"}', "arguments_length": 10})
    handler = Recorder()
    with walj.ToolJournal.open(path, tools={"send": handler}) as journal:
        assert journal.recovery.blocked
        [blocker] = journal.recovery.blockers
        assert (blocker.execution_id, blocker.state, blocker.call_id) == ("e" * 32, "started", "c1")
        with journal.turn() as turn:
            result = turn.dispatch("send", {"to": "x"})
    assert handler.calls == []
    assert result.outcome == "blocked"
    assert result.output["status"] == "blocked_interrupted_execution"
    assert [e["execution_id"] for e in result.output["ambiguous_executions"]] == ["e" * 32]
    assert result.error == result.output["message"]
    blocked = [r for r in records(path) if r["kind"] == rc.BLOCKED]
    assert len(blocked) == 1 and blocked[0]["blocked_by"] == ["e" * 32]
    assert blocked[0]["execution_id"] == result.execution_id


def test_scenario_3_later_completed_turn_does_not_hide_an_interrupted_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    import walj.journal._writes as writes_module

    monkeypatch.setattr(writes_module, "now", lambda: 1000.0)  # identical timestamps
    path = tmp_path / "j"
    with walj.ToolJournal.open(path, tools={"t": Recorder()}) as journal:
        with pytest.raises(ValueError), journal.turn() as turn:
            turn.dispatch("t", {})
            raise ValueError("the agent loop failed after the tool ran")
        assert [b.state for b in journal.recovery.blockers] == ["interrupted_turn"]
    with walj.ToolJournal.open(path, tools={"t": Recorder()}) as journal:
        with journal.turn():
            pass  # a later turn that completes, without tools
        with journal.turn():
            pass
    assert len({r["at"] for r in records(path)}) == 1
    with walj.ToolJournal.open(path) as journal:
        recovery = journal.recovery
    assert [(b.state, b.turn_sequence) for b in recovery.blockers] == [("interrupted_turn", 1)]


def test_scenario_4_an_ordinary_exception_is_terminal_and_does_not_block(tmp_path: Path) -> None:
    def broken(**_: Any) -> None:
        raise RuntimeError("boom")

    after = Recorder("after")
    path = tmp_path / "j"
    with walj.ToolJournal.open(path, tools={"broken": broken, "after": after}) as journal:
        with journal.turn() as turn:
            failed = turn.dispatch("broken", {})
            later = turn.dispatch("after", {})
        assert not journal.recovery.blocked
    assert (failed.outcome, failed.error, failed.output) == ("error", "RuntimeError: boom", None)
    assert later.outcome == "ok" and after.calls == [{}]
    finished = [r for r in records(path) if r["kind"] == rc.FINISHED]
    assert [(r["outcome"], r.get("error_type")) for r in finished] == [
        ("error", "RuntimeError"), ("ok", None)]
    with walj.ToolJournal.open(path) as journal:
        assert not journal.recovery.blocked


def _registry() -> dict[str, Any]:
    def add(a: int, b: int) -> int:
        return a + b

    def fails() -> None:
        raise RuntimeError("nope")

    return {"add": add, "fails": fails}


CALLS: list[Any] = [
    {"name": "add", "arguments": {"a": 1, "b": 2}, "call_id": "c1"},
    {"id": "c2", "type": "function", "function": {"name": "add", "arguments": '{"a":3,"b":4}'}},
    {"name": "fails", "arguments": {}, "call_id": "c3"},
    {"name": "missing", "arguments": {}, "call_id": "c4"},
    {"id": "c5", "type": "function", "function": {"name": "add", "arguments": "{oops"}},
]


def test_scenario_5_without_a_journal_the_shape_and_behaviour_are_plain(tmp_path: Path) -> None:
    plain = walj.handle_function_calls(CALLS, _registry())
    assert all(list(r) == ["name", "call_id", "arguments", "output", "error"] for r in plain)
    assert [(r["call_id"], r["output"]) for r in plain[:2]] == [("c1", 3), ("c2", 7)]
    assert plain[1]["arguments"] == {"a": 3, "b": 4}
    assert plain[2]["error"] == "RuntimeError: nope" and plain[2]["output"] is None
    assert "unknown tool" in plain[3]["error"]
    assert "not valid JSON" in plain[4]["error"] and plain[4]["arguments"] == "{oops"
    assert not (tmp_path / "j").exists()

    with walj.ToolJournal.open(tmp_path / "j") as journal:
        journaled = walj.handle_function_calls(CALLS, _registry(), journal=journal)
    assert journaled == plain
    started = [r for r in records(tmp_path / "j") if r["kind"] == rc.STARTED]
    assert [r["call_id"] for r in started] == ["c1", "c2", "c3"]  # bad calls ran nothing


def test_registry_with_a_dispatch_method(tmp_path: Path) -> None:
    class Registry:
        def dispatch(self, name: str, args: dict[str, Any]) -> str:
            return f"{name}:{args['x']}"

    calls = [{"name": "echo", "arguments": {"x": 1}}]
    assert walj.handle_function_calls(calls, Registry())[0]["output"] == "echo:1"
    with walj.ToolJournal.open(tmp_path / "j") as journal:
        assert journal.handle_function_calls(calls, Registry())[0]["output"] == "echo:1"
        assert journal.handle_function_calls(calls)[0]["error"] == "unknown tool 'echo'"


def test_cancelled_and_blocked_outcomes(tmp_path: Path) -> None:
    def cancels() -> None:
        raise walj.ToolCancelled("user said no")

    def refuses() -> None:
        raise walj.ToolBlocked("not allowed")

    def guard(context: walj.ToolContext) -> None:
        raise walj.ToolBlocked(f"policy refused {context.tool}")

    guarded = Recorder()
    tools = {"c": cancels, "b": refuses, "g": walj.Tool(guarded, guard=guard)}
    with walj.ToolJournal.open(tmp_path / "j", tools=tools) as journal:
        with journal.turn() as turn:
            outcomes = [turn.dispatch(name, {}).outcome for name in ("c", "b", "g")]
        assert not journal.recovery.blocked
    assert outcomes == ["cancelled", "blocked", "blocked"] and guarded.calls == []
    assert kinds(tmp_path / "j").count(rc.FINISHED) == 3


@pytest.mark.parametrize("mode", ["dispatch", "adispatch"])
def test_a_handler_that_cannot_tell_leaves_the_execution_ambiguous_and_blocking(
    tmp_path: Path, mode: str
) -> None:
    import asyncio

    def lost() -> None:
        raise walj.ToolOutcomeUnknown("connection lost after the request was sent")

    async def alost() -> None:
        lost()

    follow = Recorder()
    tools = {"lost": alost if mode == "adispatch" else lost, "next": follow}
    path = tmp_path / "j"
    with walj.ToolJournal.open(path, tools=tools) as journal:
        with pytest.raises(walj.ToolOutcomeUnknown):
            with journal.turn() as turn:
                if mode == "adispatch":
                    asyncio.run(turn.adispatch("lost", {}))
                else:
                    turn.dispatch("lost", {})
        [blocker] = journal.recovery.blockers
        assert (blocker.tool, blocker.state) == ("lost", "ambiguous")
        with journal.turn() as turn:
            assert turn.dispatch("next", {}).outcome == "blocked" and follow.calls == []
    assert rc.FINISHED not in kinds(path) and kinds(path).count(rc.AMBIGUOUS) == 1
    with walj.ToolJournal.open(path, tools=tools) as reopened:
        [blocker] = reopened.recovery.blockers
        assert blocker.state == "ambiguous"


def test_handler_receives_a_context_with_the_idempotency_key(tmp_path: Path) -> None:
    seen: list[walj.ToolContext] = []

    def tool(x: int, context: walj.ToolContext) -> int:
        seen.append(context)
        return x

    with walj.ToolJournal.open(tmp_path / "j", tools={"tool": tool}) as journal:
        with journal.turn() as turn:
            result = turn.dispatch("tool", {"x": 5}, call_id="abc")
            with pytest.raises(TypeError):
                turn.dispatch("tool", {"x": 5, "context": 1})
    [context] = seen
    assert result.output == 5
    assert (context.execution_id, context.call_id, context.tool) == (
        result.execution_id, "abc", "tool")
    started = [r for r in records(tmp_path / "j") if r["kind"] == rc.STARTED][0]
    assert started["idempotency_key"] == context.idempotency_key


def test_llm_calls_are_bracketed_and_a_blocked_turn_can_still_answer(tmp_path: Path) -> None:
    path = tmp_path / "j"
    with walj.ToolJournal.open(path) as journal:
        with pytest.raises(KeyboardInterrupt), journal.turn() as turn:
            with turn.llm_call(model="m", request=[{"role": "user", "content": "hi"}]) as call:
                call.finish({"content": "hello"})
            with turn.llm_call(model="m", request="second"):
                raise KeyboardInterrupt
    with walj.ToolJournal.open(path, block_on_pending_llm_calls=False) as journal:
        [pending] = journal.recovery.pending_llm_calls
        assert pending.model == "m" and pending.turn_sequence == 1
        assert not journal.recovery.blocked
        with journal.turn() as turn, turn.llm_call(model="m", request="answer without tools"):
            pass
    with walj.ToolJournal.open(path, block_on_pending_llm_calls=True) as journal:
        [blocker] = journal.recovery.blockers
        assert blocker.state == "pending_llm_call" and blocker.execution_id is not None
        journal.resolve(blocker.execution_id, "not_performed", actor="ann")
        assert not journal.recovery.blocked
    llm = [r for r in records(path) if r["kind"].startswith("llm_call")]
    assert [r["kind"] for r in llm] == [rc.LLM_STARTED, rc.LLM_FINISHED, rc.LLM_STARTED,
                                     rc.LLM_STARTED, rc.LLM_FINISHED, rc.LLM_RESOLVED]
    assert llm[1]["response_preview"] == '{"content":"hello"}'


def test_turns_do_not_nest_and_dispatch_needs_a_live_turn(tmp_path: Path) -> None:
    with walj.ToolJournal.open(tmp_path / "j", tools={"t": Recorder()}) as journal:
        with journal.turn() as turn:
            with pytest.raises(walj.TurnError), journal.turn():
                pass
        with pytest.raises(walj.TurnError):
            turn.dispatch("t", {})
        with journal.turn() as turn, pytest.raises(walj.UnknownToolError):
            turn.dispatch("nope", {})
    with pytest.raises(walj.ClosedError):
        journal.turn()


def test_state_survives_segment_rotation_and_salvage_mode_is_read_only(tmp_path: Path) -> None:
    path = tmp_path / "j"
    with walj.ToolJournal.open(path, tools={"t": Recorder()}, segment_bytes=1024,
                               sync="never") as journal:
        for _ in range(5):
            with journal.turn() as turn:
                for n in range(5):
                    turn.dispatch("t", {"n": n})
        with pytest.raises(KeyboardInterrupt), journal.turn() as turn:
            turn.dispatch("t", {}, handler=lambda: (_ for _ in ()).throw(KeyboardInterrupt()))
    assert len(list(path.glob("seg-*.jsonl"))) > 3
    with walj.ToolJournal.open(path) as journal:
        [blocker] = journal.recovery.blockers
        assert blocker.state == "ambiguous" and blocker.turn_sequence == 6
        assert journal.recovery.records == len(records(path))
    with walj.ToolJournal.open(path, recovery="salvage") as journal:
        assert [b.execution_id for b in journal.recovery.blockers] == [blocker.execution_id]
        with pytest.raises(walj.WaljError), journal.turn():
            pass
