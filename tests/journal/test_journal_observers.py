"""The observer hook: where on_start, on_end and on_resolved are called relative to the durable
records, what they are told, and that an observer can never change an outcome or the state."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from journal_helpers import fails, gives_up, interrupted, kinds, records, refuses, unknown

import walj
from walj.journal import ExecutionEnd, ToolContext, ToolObserver
from walj.journal.state import rebuild


class Watcher(ToolObserver):
    """Remembers every hook call with the log's record kinds at that moment."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.events: list[tuple[str, Any, list[str]]] = []

    def on_start(self, context: ToolContext) -> None:
        self.events.append(("start", context, kinds(self.path)))

    def on_end(self, end: ExecutionEnd) -> None:
        self.events.append(("end", end, kinds(self.path)))

    def on_resolved(self, resolution: walj.Resolution) -> None:
        self.events.append(("resolved", resolution, kinds(self.path)))

    def ends(self) -> list[ExecutionEnd]:
        return [event for name, event, _ in self.events if name == "end"]


class Raising(ToolObserver):
    def __init__(self, exc: BaseException, hook: str) -> None:
        self.exc, self.hook, self.calls = exc, hook, 0

    def _maybe(self, hook: str) -> None:
        if hook == self.hook:
            self.calls += 1
            raise self.exc

    def on_start(self, context: ToolContext) -> None:
        self._maybe("on_start")

    def on_end(self, end: ExecutionEnd) -> None:
        self._maybe("on_end")

    def on_resolved(self, resolution: walj.Resolution) -> None:
        self._maybe("on_resolved")


def state_matches_replay(journal: walj.ToolJournal, path: Path) -> None:
    replayed = rebuild((r.seq, r.data) for r in walj.read(path)).snapshot()
    assert ({b.execution_id for b in journal.recovery.blockers}
            == {b.execution_id for b in replayed.blockers})
    assert journal.recovery.blocked == replayed.blocked


@pytest.mark.parametrize(("handler", "outcome", "error"), [
    (lambda x: x + 1, "ok", None), (fails, "error", ValueError),
    (refuses, "blocked", walj.ToolBlocked), (gives_up, "cancelled", walj.ToolCancelled)])
def test_start_comes_before_the_intent_and_end_after_the_durable_terminal_record(
        tmp_path: Path, handler: Any, outcome: str, error: type[BaseException] | None) -> None:
    path = tmp_path / "j"
    watcher = Watcher(path)
    with walj.ToolJournal.open(path, observers=[watcher]) as journal, journal.turn() as turn:
        result = turn.dispatch("t", {"x": 1}, call_id="c1", handler=handler)
    (_, context, before), (_, end, after) = watcher.events
    assert before == []  # the turn's turn_started rides in its first intent's write
    assert after == ["turn_started", "tool_execution_started", "tool_execution_finished"]
    assert context == ToolContext(result.execution_id, context.idempotency_key, "t", "c1", 1,
                                  context.arguments_sha256, journal.log_id)
    assert records(path)[1]["idempotency_key"] == context.idempotency_key
    assert end.context is context and end.outcome == outcome == result.outcome
    assert end.result == result
    assert type(end.error) is error if error else end.error is None


def test_a_blocked_dispatch_ends_blocked_after_its_record_and_runs_nothing(
        tmp_path: Path) -> None:
    path = tmp_path / "j"
    with walj.ToolJournal.open(path) as journal:
        with pytest.raises(KeyboardInterrupt), journal.turn() as turn:
            turn.dispatch("t", {"x": 1}, handler=interrupted)
    watcher = Watcher(path)
    with walj.ToolJournal.open(path, observers=[watcher]) as journal, journal.turn() as turn:
        result = turn.dispatch("t", {"x": 2}, handler=fails)
    end = watcher.ends()[0]
    assert result.outcome == end.outcome == "blocked" and end.result == result
    assert watcher.events[-1][2][-1] == "tool_execution_blocked"


@pytest.mark.parametrize("handler", [interrupted, unknown])
def test_an_interrupt_or_an_unknown_outcome_ends_ambiguous_and_the_journal_blocks(
        tmp_path: Path, handler: Any) -> None:
    path = tmp_path / "j"
    watcher = Watcher(path)
    journal = walj.ToolJournal.open(path, observers=[watcher])
    with pytest.raises((KeyboardInterrupt, walj.ToolOutcomeUnknown)), \
            journal.turn() as turn:
        turn.dispatch("t", {"x": 1}, handler=handler)
    (end,) = watcher.ends()
    assert end.outcome == "ambiguous" and end.result is None
    assert isinstance(end.error, (KeyboardInterrupt, walj.ToolOutcomeUnknown))
    assert watcher.events[-1][2][-1] == "tool_execution_ambiguous"  # durable before on_end
    assert journal.recovery.blocked
    state_matches_replay(journal, path)
    journal.close()


@pytest.mark.parametrize("hook", ["on_start", "on_end", "on_resolved"])
def test_an_observer_that_raises_changes_no_outcome_and_is_logged(
        tmp_path: Path, hook: str, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "j"
    broken, watcher = Raising(RuntimeError("observer bug"), hook), Watcher(path)
    with walj.ToolJournal.open(path, observers=[broken, watcher]) as journal:
        with caplog.at_level(logging.WARNING, logger="walj.journal"):
            with journal.turn() as turn:
                ok = turn.dispatch("t", {"x": 1}, handler=lambda x: x)
                with pytest.raises(KeyboardInterrupt):
                    turn.dispatch("t", {"x": 2}, handler=interrupted)
            blocker = journal.recovery.blockers[0].execution_id
            assert blocker is not None
            resolution = journal.resolve(blocker, "not_performed", actor="ann")
        assert ok.outcome == "ok" and ok.output == 1 and resolution.actor == "ann"
        assert not journal.recovery.blocked
        assert [e.outcome for e in watcher.ends()] == ["ok", "ambiguous"]
        assert [name for name, _, _ in watcher.events].count("resolved") == 1
    assert broken.calls == (1 if hook == "on_resolved" else 2)
    assert f"raised in {hook}" in caplog.text and "observer bug" in caplog.text
    assert kinds(path) == ["turn_started", "tool_execution_started", "tool_execution_finished",
                           "tool_execution_started", "tool_execution_ambiguous",
                           "turn_completed", "tool_execution_resolved"]


def test_an_interrupt_inside_on_start_writes_nothing_and_blocks_nothing(tmp_path: Path) -> None:
    path = tmp_path / "j"
    watcher = Watcher(path)
    journal = walj.ToolJournal.open(path, observers=[watcher, Raising(KeyboardInterrupt(),
                                                                        "on_start")])
    ran: list[int] = []
    with pytest.raises(KeyboardInterrupt), journal.turn() as turn:
        turn.dispatch("t", {"x": 1}, handler=ran.append)
    assert ran == [] and kinds(path) == ["turn_started"]
    (end,) = watcher.ends()  # told, so that it can close what on_start opened
    assert end.outcome == "cancelled" and isinstance(end.error, KeyboardInterrupt)
    assert not journal.recovery.blocked
    state_matches_replay(journal, path)
    journal.close()


def test_an_interrupt_inside_on_end_leaves_the_durable_outcome_and_ends_once(
        tmp_path: Path) -> None:
    path = tmp_path / "j"
    raising, watcher = Raising(KeyboardInterrupt(), "on_end"), Watcher(path)
    journal = walj.ToolJournal.open(path, observers=[watcher, raising])
    with pytest.raises(KeyboardInterrupt), journal.turn() as turn:
        turn.dispatch("t", {"x": 1}, handler=lambda x: x)
    assert raising.calls == 1 and watcher.ends() == []  # the interrupt stopped the round
    assert records(path)[-1]["outcome"] == "ok"
    # As an interrupt on dispatch's `return` would: the execution is settled, and only the
    # turn that the interrupt left (it used a tool) blocks.
    assert [b.state for b in journal.recovery.blockers] == ["interrupted_turn"]
    state_matches_replay(journal, path)
    journal.close()


def test_resolutions_are_told_after_they_are_durable_policies_on_open_included(
        tmp_path: Path) -> None:
    path = tmp_path / "j"
    with walj.ToolJournal.open(path) as journal:
        with pytest.raises(KeyboardInterrupt), journal.turn() as turn:
            turn.dispatch("assume", {"x": 1}, handler=interrupted)
    watcher = Watcher(path)
    tools = {"assume": walj.Tool(lambda x: x, on_ambiguous="assume_done")}
    with walj.ToolJournal.open(path, tools=tools, observers=[watcher]) as journal:
        with pytest.raises(KeyboardInterrupt), journal.turn() as turn:
            turn.dispatch("manual", {"x": 1}, handler=interrupted)
        (blocker,) = journal.recovery.blockers
        assert blocker.execution_id is not None
        journal.resolve(blocker.execution_id, "failed", actor="ann", note="bounced")
    told = [event for name, event, _ in watcher.events if name == "resolved"]
    assert [(r.tool, r.outcome, r.actor) for r in told] == [
        ("assume", "succeeded", "policy"), ("manual", "failed", "ann")]
    assert all(seen[-1] == "tool_execution_resolved"
               for name, _, seen in watcher.events if name == "resolved")


def test_a_turn_resolution_is_told(tmp_path: Path) -> None:
    path = tmp_path / "j"
    with walj.ToolJournal.open(path) as journal:
        with pytest.raises(RuntimeError), journal.turn() as turn:
            turn.dispatch("t", {"x": 1}, handler=lambda x: x)
            raise RuntimeError("the agent loop died after the tool")
    watcher = Watcher(path)
    with walj.ToolJournal.open(path) as journal:
        journal.add_observer(watcher)
        journal.resolve_turn(1, actor="ann", note="answered by hand")
    ((name, resolution, _),) = watcher.events
    assert name == "resolved" and resolution.kind == "turn" and resolution.turn_sequence == 1


def test_async_dispatch_is_observed_in_the_task_and_a_cancel_ends_ambiguous(
        tmp_path: Path) -> None:
    path = tmp_path / "j"
    watcher = Watcher(path)
    gate = asyncio.Event()

    async def hold(x: int) -> int:
        await gate.wait()
        return x

    async def main() -> None:
        journal = walj.ToolJournal.open(path, observers=[watcher])
        async with journal.turn() as turn:
            assert (await turn.adispatch("t", {"x": 1}, handler=hold_briefly)).outcome == "ok"
            task = asyncio.create_task(turn.adispatch("t", {"x": 2}, handler=hold))
            while len(watcher.events) < 3:
                await asyncio.sleep(0.001)
            await asyncio.sleep(0.01)  # the intent is durable and the handler waits
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        assert journal.recovery.blocked
        state_matches_replay(journal, path)
        journal.close()

    async def hold_briefly(x: int) -> int:
        await asyncio.sleep(0)
        return x

    asyncio.run(main())
    assert [(e.outcome, type(e.error).__name__) for e in watcher.ends()] == [
        ("ok", "NoneType"), ("ambiguous", "CancelledError")]


def test_observers_are_checked_added_once_and_removed(tmp_path: Path) -> None:
    path = tmp_path / "j"
    with pytest.raises(TypeError, match="has no on_start, on_end, on_resolved"):
        walj.ToolJournal.open(path, observers=[object()])
    with pytest.raises(TypeError, match="iterable"):
        walj.ToolJournal.open(path, observers=Watcher(path))  # type: ignore[arg-type]
    assert not path.exists()  # refused before anything was opened
    watcher = Watcher(path)
    with walj.ToolJournal.open(path) as journal:
        journal.add_observer(watcher)
        with pytest.raises(ValueError, match="already added"):
            journal.add_observer(watcher)
        assert journal.observers == (watcher,)
        journal.remove_observer(watcher)
        with pytest.raises(ValueError, match="not added"):
            journal.remove_observer(watcher)
        with journal.turn() as turn:
            turn.dispatch("t", {"x": 1}, handler=lambda x: x)
    assert watcher.events == []


def test_function_calls_are_observed_with_their_call_ids(tmp_path: Path) -> None:
    path = tmp_path / "j"
    watcher = Watcher(path)
    with walj.ToolJournal.open(path, observers=[watcher]) as journal:
        walj.handle_function_calls(
            [{"name": "add", "call_id": "a1", "arguments": '{"x": 1}'},
             {"name": "add", "call_id": "a2", "arguments": "not json"}],
            {"add": lambda x: x + 1}, journal)
    assert [(e.context.call_id, e.outcome) for e in watcher.ends()] == [("a1", "ok")]


def test_an_adispatch_cancelled_while_its_intent_is_written_ends_cancelled(
        tmp_path: Path) -> None:
    path = tmp_path / "j"
    watcher = Watcher(path)
    ran: list[int] = []

    async def never(x: int) -> None:
        ran.append(x)

    async def main() -> None:
        with walj.ToolJournal.open(path, observers=[watcher]) as journal:
            async with journal.turn() as turn:
                task = asyncio.create_task(turn.adispatch("t", {"x": 1}, handler=never))
                await asyncio.sleep(0)  # the task waits for its intent's worker
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task

    asyncio.run(main())
    (end,) = watcher.ends()
    assert ran == [] and end.outcome == "cancelled" and end.result is None
    assert isinstance(end.error, asyncio.CancelledError)
    assert "tool_execution_ambiguous" not in kinds(path)


def test_a_replayed_and_a_refused_call_are_observed_after_their_records(
        tmp_path: Path) -> None:
    path = tmp_path / "j"
    watcher = Watcher(path)
    ran: list[int] = []

    def send(x: int) -> int:
        ran.append(x)
        return x * 10

    with walj.ToolJournal.open(path, store_outputs=True, observers=[watcher]) as journal:
        with journal.turn() as turn:
            first = turn.dispatch("send", {"x": 1}, call_id="c1", handler=send)
            again = turn.dispatch("send", {"x": 1}, call_id="c1", handler=send)
            other = turn.dispatch("send", {"x": 2}, call_id="c1", handler=send)
    assert ran == [1] and again.replayed and again.output == 10
    ends = [(end, seen) for name, end, seen in watcher.events if name == "end"]
    assert [(e.outcome, e.result.replayed if e.result else None) for e, _ in ends] == [
        ("ok", False), ("ok", True), ("refused", False)]
    assert ends[1][0].result == again and again.execution_id == first.execution_id
    assert ends[2][0].result == other
    assert [seen[-1] for _, seen in ends] == ["tool_execution_finished",
                                              "tool_execution_replayed",
                                              "tool_execution_refused"]
