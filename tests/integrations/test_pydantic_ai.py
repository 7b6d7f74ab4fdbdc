"""walj.integrations.pydantic_ai against the real Pydantic AI `Agent`, driven by `FunctionModel`
with explicit tool-call ids, and a child process killed by a real SIGKILL."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from sdk_fakes import check_import_isolation

import walj

pytest.importorskip("pydantic_ai")

import pydantic_ai_child as pc  # noqa: E402
from pydantic_ai import Agent  # noqa: E402
from pydantic_ai.exceptions import ModelRetry  # noqa: E402
from pydantic_ai.messages import (  # noqa: E402
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel  # noqa: E402
from pydantic_ai.tools import DeferredToolRequests  # noqa: E402

from walj.integrations.pydantic_ai import (  # noqa: E402
    METADATA_KEY,
    WaljCapability,
    answer_blocked,
)

ROOT = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).resolve().parent / "pydantic_ai_child.py"
HANG_GUARD = 60.0  # seconds; only stops a broken child from hanging the run


def run_child(tmp_path: Path, mode: str) -> tuple[Path, Path, Path]:
    root, effects, history = tmp_path / "sessions", tmp_path / "effects", tmp_path / "history"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, str(CHILD), str(root), str(effects), str(history),
                           mode], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=HANG_GUARD)
    expected = 0 if mode == "clean" else -signal.SIGKILL
    assert done.returncode == expected, done.stderr
    return root, effects, history


def effect_lines(effects: Path) -> list[str]:
    return effects.read_text(encoding="utf-8").splitlines() if effects.exists() else []


def kinds(path: Path) -> list[str]:
    return [record.data["kind"] for record in walj.read(path)]


def session(root: Path) -> Path:
    return Path(walj.ToolJournal.session_path(root, pc.CONVERSATION))


def resume(root: Path, effects: Path, messages: list[ModelMessage]) -> tuple[Any, list[int]]:
    """A new run of the conversation from `messages`, with no new prompt: Pydantic AI
    re-executes the last response's unanswered calls under their ids. Returns the run's
    result and the orders send_refund ran for in it."""
    with WaljCapability(root) as capability:
        agent = pc.refund_agent(capability, effects)
        result = asyncio.run(agent.run(message_history=messages))
        calls = list(agent.refund_calls)  # type: ignore[attr-defined]
    return result, calls


# --- the three crash cases ------------------------------------------------------------------


def test_killed_inside_the_tool_blocks_then_resolve_and_replay_finish_the_run(
        tmp_path: Path) -> None:
    root, effects, history = run_child(tmp_path, "in_tool")
    assert effect_lines(effects) == ["refund 7 30"]
    checkpoint = pc.load_history(history)  # the app's history as of the crash
    last = checkpoint[-1]
    assert isinstance(last, ModelResponse) and last.tool_calls[0].tool_call_id == pc.CALL_ID

    # Resumed: Pydantic AI re-executes call_refund; walj blocks it, and the model is told.
    result, calls = resume(root, effects, checkpoint)
    assert calls == [] and effect_lines(effects) == ["refund 7 30"]
    assert result.output.startswith("failed: The tool 'send_refund' was not run")
    with walj.ToolJournal.open(session(root)) as journal:
        [blocker] = journal.recovery.blockers
    assert (blocker.state, blocker.call_id) == ("started", pc.CALL_ID)

    done = subprocess.run([sys.executable, "-m", "walj", "resolve", str(session(root)),
                           blocker.execution_id, "--outcome", "succeeded", "--actor", "ann",
                           "--note", "the refund is in the bank's ledger"],
                          capture_output=True, text=True, cwd=ROOT, timeout=HANG_GUARD)
    assert done.returncode == 0, done.stderr

    # The app kept its checkpoint while the conversation was blocked; resumed from it again,
    # Pydantic AI re-executes call_refund, and replay answers it from the resolution.
    result, calls = resume(root, effects, checkpoint)
    assert calls == [] and effect_lines(effects) == ["refund 7 30"]
    assert result.output.startswith("success: ")
    with walj.ToolJournal.open(session(root)) as journal:
        assert not journal.is_blocked()
    assert "tool_execution_replayed" in kinds(session(root))


def test_killed_after_the_handler_returned_is_answered_from_the_record(tmp_path: Path) -> None:
    root, effects, history = run_child(tmp_path, "after_tool")
    assert effect_lines(effects) == ["refund 7 30"]
    checkpoint = pc.load_history(history)
    assert isinstance(checkpoint[-1], ModelResponse)  # the step's result was never saved

    result, calls = resume(root, effects, checkpoint)
    assert calls == [], "the handler ran again"
    assert effect_lines(effects) == ["refund 7 30"]
    assert result.output == "success: refunded 30 on order 7"  # the recorded output
    assert "tool_execution_replayed" in kinds(session(root))
    # The step that died is still an interrupted tool-bearing turn: new calls block until a
    # person settles it (walj resolve PATH --turn N).
    with walj.ToolJournal.open(session(root)) as journal:
        assert [b.state for b in journal.recovery.blockers] == ["interrupted_turn"]


def test_a_clean_run_writes_no_blocker(tmp_path: Path) -> None:
    root, effects, history = run_child(tmp_path, "clean")
    assert effect_lines(effects) == ["refund 7 30"]
    written = kinds(session(root))
    assert "tool_execution_blocked" not in written
    assert written.count("turn_started") == written.count("turn_completed") == 1
    with walj.ToolJournal.open(session(root)) as journal:
        assert not journal.is_blocked() and journal.recovery.incomplete_turns == ()
    final = pc.load_history(history)[-1]
    assert isinstance(final, ModelResponse) and isinstance(final.parts[0], TextPart)


# --- in one process -------------------------------------------------------------------------


def scripted(*responses: list[Any]) -> FunctionModel:
    """A model that answers each request with the next list of parts."""
    queue = list(responses)

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=queue.pop(0) if queue else [TextPart("done")])

    return FunctionModel(respond)


def test_parallel_calls_run_concurrently_in_one_turn(tmp_path: Path) -> None:
    in_flight: set[str] = set()
    all_in = asyncio.Event()

    async def wait_for_all(name: str) -> str:
        in_flight.add(name)
        if len(in_flight) == 3:
            all_in.set()
        await asyncio.wait_for(all_in.wait(), HANG_GUARD)  # only sequential runs would wait
        return name

    model = scripted([ToolCallPart("probe", {"name": n}, tool_call_id=f"call_{n}")
                      for n in ("a", "b", "c")])
    with walj.ToolJournal.open(tmp_path / "j") as journal:
        agent = Agent(model, capabilities=[WaljCapability(journal)])
        agent.tool_plain(wait_for_all, name="probe")
        assert asyncio.run(agent.run("go")).output == "done"
        assert not journal.is_blocked()
    records = [r.data for r in walj.read(tmp_path / "j")]
    started = [r for r in records if r["kind"] == "tool_execution_started"]
    assert sorted(r["call_id"] for r in started) == ["call_a", "call_b", "call_c"]
    assert len({r["turn_sequence"] for r in started}) == 1
    assert [r["kind"] for r in records].count("turn_completed") == 1


def test_a_cancelled_run_leaves_what_a_reopen_rebuilds(tmp_path: Path) -> None:
    entered = asyncio.Event()
    inside: list[int] = []

    async def slow_refund(order: int) -> str:
        inside.append(order)
        if len(inside) == 2:  # both calls are in their tool: cancel now
            entered.set()
        await asyncio.Event().wait()  # never set: the run is cancelled here
        return "unreachable"

    async def cancel_inside_the_tool(agent: Agent[None, Any]) -> None:
        task = asyncio.ensure_future(agent.run("go"))
        await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    model = scripted([ToolCallPart("slow_refund", {"order": 7}, tool_call_id="call_slow"),
                      ToolCallPart("slow_refund", {"order": 8}, tool_call_id="call_other")])
    journal = walj.ToolJournal.open(tmp_path / "j")
    try:
        agent = Agent(model, capabilities=[WaljCapability(journal)])
        agent.tool_plain(slow_refund)
        asyncio.run(cancel_inside_the_tool(agent))
        live = journal.recovery
    finally:
        journal.close()
    with walj.ToolJournal.open(tmp_path / "j") as reopened:
        rebuilt = reopened.recovery
    assert live.blocked and sorted(b.call_id or "" for b in live.blockers) == [
        "call_other", "call_slow"]
    assert live.blockers == rebuilt.blockers
    assert live.incomplete_turns == rebuilt.incomplete_turns


def test_a_tool_exception_is_recorded_and_raised_as_without_walj(tmp_path: Path) -> None:
    def charge(amount: int) -> str:
        raise ValueError("card declined")

    model = scripted([ToolCallPart("charge", {"amount": 5}, tool_call_id="call_charge")])
    with walj.ToolJournal.open(tmp_path / "j") as journal:
        agent = Agent(model, capabilities=[WaljCapability(journal)])
        agent.tool_plain(charge)
        with pytest.raises(ValueError, match="card declined"):
            asyncio.run(agent.run("go"))
        assert not journal.is_blocked()  # the outcome is known: nothing blocks
    [finished] = [r.data for r in walj.read(tmp_path / "j")
                  if r.data["kind"] == "tool_execution_finished"]
    assert (finished["outcome"], finished["error"]) == ("error", "ValueError: card declined")


def test_a_retry_under_the_same_id_is_a_new_call_not_the_old_error(tmp_path: Path) -> None:
    # A model that repeats its tool-call id on a retry (as TestModel does): the first attempt's
    # ModelRetry is recorded as an error; the retry gets its own walj call id, so it runs.
    model = scripted([ToolCallPart("lookup", {"order": -1}, tool_call_id="call_same")],
                     [ToolCallPart("lookup", {"order": 7}, tool_call_id="call_same")])
    ran: list[int] = []

    def lookup(order: int) -> str:
        ran.append(order)
        if order < 0:
            raise ModelRetry("order must be positive")
        return f"order {order}"

    with walj.ToolJournal.open(tmp_path / "j") as journal:
        agent = Agent(model, capabilities=[WaljCapability(journal)])
        agent.tool_plain(lookup)
        assert asyncio.run(agent.run("go")).output == "done"
        assert not journal.is_blocked()
    assert ran == [-1, 7]
    records = [r.data for r in walj.read(tmp_path / "j")]
    ids = {r["execution_id"]: r["call_id"] for r in records
           if r["kind"] == "tool_execution_started"}
    finished = [(ids[r["execution_id"]], r["outcome"]) for r in records
                if r["kind"] == "tool_execution_finished"]
    assert finished == [("call_same", "error"), ("call_same#retry-1", "ok")]


def test_a_resumed_run_gets_a_recorded_retry_as_a_retry_and_a_recorded_error_as_a_failure(
        tmp_path: Path) -> None:
    # The whole conversation ran once: a retry, then the corrected call, then an error. Resumed
    # from the history saved after the first response (as after a crash before the retry was
    # saved), every call is answered from the journal; no tool runs again.
    ran: list[int] = []

    def lookup(order: int) -> str:
        ran.append(order)
        if order < 0:
            raise ModelRetry("order must be positive")
        if order == 13:
            raise ValueError("order 13 is archived")
        return f"order {order}"

    def conversation() -> FunctionModel:
        return scripted([ToolCallPart("lookup", {"order": -1}, tool_call_id="call_1")],
                        [ToolCallPart("lookup", {"order": 7}, tool_call_id="call_1")],
                        [ToolCallPart("lookup", {"order": 13}, tool_call_id="call_2")])

    root, history = tmp_path / "sessions", tmp_path / "history"
    with WaljCapability(root) as capability:
        agent = Agent(conversation(), capabilities=[capability])
        agent.tool_plain(lookup)
        with pytest.raises(ValueError, match="archived"):
            asyncio.run(pc.run_saving(agent, history, "go", conversation_id="c1"))
    assert ran == [-1, 7, 13]
    first_response = next(i for i, m in enumerate(pc.load_history(history))
                          if isinstance(m, ModelResponse))
    checkpoint = pc.load_history(history)[:first_response + 1]

    seen: list[list[ModelMessage]] = []
    replies = [[ToolCallPart("lookup", {"order": 7}, tool_call_id="call_1")],
               [ToolCallPart("lookup", {"order": 13}, tool_call_id="call_2")]]

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(list(messages))
        return ModelResponse(parts=replies.pop(0) if replies else [TextPart("done")])

    with WaljCapability(root) as capability:
        agent = Agent(FunctionModel(respond), capabilities=[capability])
        agent.tool_plain(lookup)
        assert asyncio.run(agent.run(message_history=checkpoint)).output == "done"
    assert ran == [-1, 7, 13], "a tool ran again"
    answers = [p for p in pc.tool_returns(seen[-1]) if p.tool_call_id in ("call_1", "call_2")]
    assert [(p.tool_call_id, p.outcome) for p in answers] == [
        ("call_1", "retried"), ("call_1", "success"), ("call_2", "failed")]
    assert "order must be positive" in str(answers[0].content)
    assert answers[1].content == "order 7"
    assert "ValueError: order 13 is archived" in str(answers[2].content)


def test_defer_lets_a_person_answer_and_replay_uses_the_answer(tmp_path: Path) -> None:
    root, history = tmp_path / "sessions", tmp_path / "history"
    ran: list[int] = []

    def send_refund(order: int, amount: int) -> str:
        ran.append(order)
        raise walj.ToolOutcomeUnknown("the bank timed out after the request was sent")

    def agent_with(capability: WaljCapability, output_type: Any = str) -> Agent[None, Any]:
        agent: Agent[None, Any] = Agent(pc.refund_model(), capabilities=[capability],
                                        output_type=output_type)
        agent.tool_plain(send_refund)
        return agent

    with WaljCapability(root) as capability, pytest.raises(walj.ToolOutcomeUnknown):
        asyncio.run(pc.run_saving(agent_with(capability), history, "refund order 7",
                                  conversation_id=pc.CONVERSATION))
    checkpoint = pc.load_history(history)

    with WaljCapability(root, on_blocked="defer") as capability:
        agent = agent_with(capability, [str, DeferredToolRequests])
        paused = asyncio.run(agent.run(message_history=checkpoint))
        requests = paused.output
        assert isinstance(requests, DeferredToolRequests)
        [deferred] = requests.calls
        assert deferred.tool_call_id == pc.CALL_ID
        message = requests.metadata[pc.CALL_ID][METADATA_KEY]["message"]
        assert message.startswith("The tool 'send_refund' was not run")

        answer = answer_blocked(requests, outcome="succeeded", actor="ann",
                                note="the bank shows the refund", output="refund 7 confirmed")
        done = asyncio.run(agent.run(message_history=paused.all_messages(),
                                     deferred_tool_results=answer))
        assert done.output == "success: refund 7 confirmed"
        journal = capability.journal_for(pc.CONVERSATION)
        assert not journal.is_blocked()
        [resolution] = journal.recovery.resolved
        assert (resolution.outcome, resolution.actor) == ("succeeded", "ann")
    assert ran == [7], "the tool ran again"


def test_a_repeated_call_id_with_other_arguments_is_refused(tmp_path: Path) -> None:
    # What a model that repeats its ids across runs (TestModel) meets: the second run's call
    # under the first run's id, with other arguments, is refused and runs nothing.
    ran: list[int] = []

    def lookup(order: int) -> str:
        ran.append(order)
        return f"order {order}"

    with WaljCapability(tmp_path / "sessions") as capability:
        for order in (1, 2):
            model = scripted([ToolCallPart("lookup", {"order": order}, tool_call_id="call_x")])
            agent = Agent(model, capabilities=[capability])
            agent.tool_plain(lookup)
            result = asyncio.run(agent.run("go", conversation_id="c1"))
            assert result.output == "done"
        journal = capability.journal_for("c1")
        assert not journal.is_blocked()
    assert ran == [1]
    answer = [p for p in pc.tool_returns(result.all_messages()) if p.tool_call_id == "call_x"]
    assert answer[-1].outcome == "failed"
    assert "different arguments" in str(answer[-1].content)


def test_defer_answers_an_interrupted_turn_and_the_new_call_runs(tmp_path: Path) -> None:
    root, effects, history = run_child(tmp_path, "after_tool")
    resume(root, effects, pc.load_history(history))  # replay answers the step that died
    model = scripted([ToolCallPart("send_refund", {"order": 8, "amount": 5},
                                   tool_call_id="call_second")])
    with WaljCapability(root, on_blocked="defer") as capability:
        agent = pc.refund_agent(capability, effects, model=model,
                                output_type=[str, DeferredToolRequests])
        paused = asyncio.run(agent.run("and refund order 8", conversation_id=pc.CONVERSATION))
        requests = paused.output
        assert isinstance(requests, DeferredToolRequests)
        [blocker] = requests.metadata["call_second"][METADATA_KEY]["blockers"]
        assert blocker["state"] == "interrupted_turn"
        answer = answer_blocked(requests, outcome="succeeded", actor="ann",
                                note="the first refund's step was answered from the record")
        done = asyncio.run(agent.run(message_history=paused.all_messages(),
                                     deferred_tool_results=answer))
        assert done.output == "done"
        journal = capability.journal_for(pc.CONVERSATION)
        assert not journal.is_blocked()
        assert [r.kind for r in journal.recovery.resolved] == ["turn"]
    assert effect_lines(effects) == ["refund 7 30", "refund 8 5"]


def test_a_conversation_id_that_is_not_a_safe_name(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    unsafe = "user:42/../../etc"
    with WaljCapability(root) as capability:
        agent = pc.refund_agent(capability, tmp_path / "effects")
        result = asyncio.run(agent.run("refund order 7", conversation_id=unsafe))
        assert result.output == "success: refunded 30 on order 7"
        path = capability.journal_for(unsafe).path
        assert capability.journal_for(unsafe).recovery.session_id == unsafe
    assert path == Path(walj.ToolJournal.session_path(root, unsafe))
    assert path.parent == root
    assert kinds(path).count("tool_execution_finished") == 1


def test_the_example_runs_offline_and_recovers() -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "pydantic_ai_agent.py")],
                          capture_output=True, text=True, cwd=ROOT, timeout=HANG_GUARD,
                          env=env, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("refund emails sent: 1") == 3
    assert "walj deferred call_email_1 to a person" in done.stdout
    assert done.stdout.rstrip().endswith("the run finished")


# --- wiring and errors ----------------------------------------------------------------------


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="ToolJournal or a directory"):
        WaljCapability(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="on_blocked"):
        WaljCapability(tmp_path, on_blocked="ask")  # type: ignore[arg-type]
    with walj.ToolJournal.open(tmp_path / "j") as journal, \
            pytest.raises(TypeError, match="already open"):
        WaljCapability(journal, sync="always")
    for bad, match in (({"outcome": "done", "actor": "ann"}, "outcome must be"),
                       ({"outcome": "succeeded", "actor": ""}, "actor"),
                       ({"outcome": "failed", "actor": "ann"}, "needs a note")):
        with pytest.raises(ValueError, match=match):
            answer_blocked(DeferredToolRequests(), **bad)
    capability = WaljCapability(tmp_path)
    capability.close()
    with pytest.raises(walj.ClosedError):
        capability.journal_for("c1")


def test_import_isolation_and_missing_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    check_import_isolation(monkeypatch, "pydantic_ai", extra="pydantic-ai")


# --- sessions: ending, releasing, idle journals, the blocked answer ------------------------------


def test_a_conversation_is_released_closed_when_idle_ended_and_its_blocked_answer_replaced(
        tmp_path: Path) -> None:
    root, effects = tmp_path / "sessions", tmp_path / "effects"
    before = set(os.listdir("/proc/self/fd"))
    with WaljCapability(root, idle_timeout=0.2,
                        blocked_message=lambda done: f"{done.name}: on hold") as capability:
        agent = pc.refund_agent(capability, effects)
        first = asyncio.run(agent.run("refund", conversation_id=pc.CONVERSATION))
        assert first.output == "success: refunded 30 on order 7"
        journal = capability.journal_for(pc.CONVERSATION)
        capability.release(pc.CONVERSATION)
        assert journal.closed and set(os.listdir("/proc/self/fd")) - before == set()
        # Opened again by the next run's call (replayed: the same call id), then closed idle.
        again = asyncio.run(agent.run("refund", conversation_id=pc.CONVERSATION))
        assert again.output == first.output and agent.refund_calls == [7]  # type: ignore
        reopened = capability.journal_for(pc.CONVERSATION)
        assert reopened is not journal
        deadline = time.monotonic() + 10
        while not reopened.closed and time.monotonic() < deadline:
            time.sleep(0.02)  # the sweeping thread closes it
        assert reopened.closed, "the idle journal was never closed"
        # A call left in doubt: the model gets the replacement text.
        with walj.ToolJournal.open_session(root, "doubt", store_outputs=True) as other:
            with pytest.raises(KeyboardInterrupt), other.turn() as turn:
                turn.dispatch("send_refund", {"order": 7, "amount": 30}, call_id="x",
                              handler=lambda **_: (_ for _ in ()).throw(KeyboardInterrupt))
        blocked = asyncio.run(agent.run("refund", conversation_id="doubt"))
        assert blocked.output == "failed: send_refund: on hold"
        capability.end(pc.CONVERSATION)
    done = subprocess.run([sys.executable, "-m", "walj", "sweep", str(root), "--jobs", "1",
                           "--json"], capture_output=True, text=True, check=False,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    statuses = {Path(s["path"]).name: s["status"] for s in json.loads(done.stdout)["sessions"]}
    assert statuses == {pc.CONVERSATION: "ended", "doubt": "blocked"}
