"""walj.integrations.langchain: the real create_agent and ToolNode on a scripted chat model,
offline, and agents SIGKILLed inside a tool and after a tool returned, then resumed from their
checkpoint."""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Annotated, Any

import langchain_fakes as lf
import pytest
import sdk_fakes as fx
from journal_helpers import kinds, records
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import InjectedToolCallId, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from langgraph.types import Command

import walj
from walj.integrations.langchain import RESUMED_STEP_ACTOR, WaljMiddleware

CHILD = Path(__file__).with_name("langchain_child.py")
THREAD = "user:42"  # the child's thread: not a safe directory name
CONFIG: Any = {"configurable": {"thread_id": THREAD}}
BLOCKED = "tool_execution_blocked"


def tool_messages(state: Any) -> list[ToolMessage]:
    return [m for m in state["messages"] if isinstance(m, ToolMessage)]


# --- in process -----------------------------------------------------------------------------------


def test_a_clean_run_journals_each_call_and_leaves_nothing_blocked(tmp_path: Path) -> None:
    effects = tmp_path / "effects.txt"
    with WaljMiddleware(tmp_path / "sessions") as walj_mw:
        agent = lf.refund_agent(lf.refund_tools(str(effects)), [walj_mw], InMemorySaver())
        state = agent.invoke({"messages": [HumanMessage("refund order 42")]}, CONFIG)
        journal = walj_mw.journal(THREAD)
        assert journal.session_id == THREAD and journal.store_outputs
        assert not journal.recovery.blocked and not journal.recovery.incomplete_turns
    assert state["messages"][-1].content == "Refunded order 42."
    assert [(m.tool_call_id, m.content, m.status) for m in tool_messages(state)] == [
        (lf.LOOKUP_ID, '{"order": 42, "amount": 30}', "success"),
        (lf.REFUND_ID, "refunded 30 on order 42", "success")]
    path = walj.ToolJournal.session_path(tmp_path / "sessions", THREAD)
    assert path.name == "%user%3A42"
    assert BLOCKED not in kinds(path)
    assert kinds(path).count("turn_completed") == 2  # one turn per tool-calling AIMessage
    finished = [r for r in records(path) if r["kind"] == "tool_execution_finished"]
    assert finished[1]["output"] == {"kind": "tool_message", "content": "refunded 30 on order 42",
                                     "name": "send_refund", "status": "success"}
    assert fx.effect_lines(effects) == ["refund 42 30"]
    with walj.ToolJournal.open(path) as reopened:
        assert not reopened.recovery.blocked and not reopened.recovery.incomplete_turns


def two_lookups() -> list[AIMessage]:
    return [AIMessage(content="", id="ai-0", tool_calls=[
                lf.call("call_a", "lookup", {"order": 1}), lf.call("call_b", "lookup",
                                                                   {"order": 2})]),
            AIMessage(content="Looked both up.", id="ai-1")]


def test_parallel_calls_of_one_message_run_concurrently_in_one_turn(tmp_path: Path) -> None:
    both_running = threading.Barrier(2, timeout=60)  # only passes if the two run at once

    @tool
    def lookup(order: int) -> str:
        """Look an order up."""
        both_running.wait()
        return f"order {order}"

    with WaljMiddleware(tmp_path) as walj_mw:
        agent = lf.refund_agent([lookup], [walj_mw], script=two_lookups())
        state = agent.invoke({"messages": [HumanMessage("look")]}, CONFIG)
    assert sorted(m.content for m in tool_messages(state)) == ["order 1", "order 2"]
    data = records(walj.ToolJournal.session_path(tmp_path, THREAD))
    starts = [r for r in data if r["kind"] == "tool_execution_started"]
    assert sorted(r["call_id"] for r in starts) == ["call_a", "call_b"]
    assert {r["turn_sequence"] for r in starts} == {1}
    assert [r["kind"] for r in data if r["kind"].startswith("turn_")] == [
        "turn_started", "turn_completed"]


def test_the_async_hook_journals_parallel_calls_in_one_turn(tmp_path: Path) -> None:
    arrived: list[int] = []
    both_running = asyncio.Event()

    @tool
    async def lookup(order: int) -> str:
        """Look an order up."""
        arrived.append(order)
        if len(arrived) == 2:
            both_running.set()
        await asyncio.wait_for(both_running.wait(), 60)  # only passes if the two run at once
        return f"order {order}"

    async def run() -> Any:
        with WaljMiddleware(tmp_path) as walj_mw:
            agent = lf.refund_agent([lookup], [walj_mw], script=two_lookups())
            return await agent.ainvoke({"messages": [HumanMessage("look")]}, CONFIG)

    state = asyncio.run(run())
    assert sorted(m.content for m in tool_messages(state)) == ["order 1", "order 2"]
    data = records(walj.ToolJournal.session_path(tmp_path, THREAD))
    assert sorted((r["call_id"], r["turn_sequence"]) for r in data
                  if r["kind"] == "tool_execution_started") == [("call_a", 1), ("call_b", 1)]
    assert [r["outcome"] for r in data if r["kind"] == "tool_execution_finished"] == ["ok", "ok"]
    assert "turn_completed" in [r["kind"] for r in data]


def tool_node_graph(tools: list[Any], walj_mw: WaljMiddleware, **options: Any) -> Any:
    node = ToolNode(tools, wrap_tool_call=walj_mw.wrap_tool_call,
                    awrap_tool_call=walj_mw.awrap_tool_call, **options)
    graph = StateGraph(MessagesState)
    graph.add_node("tools", node)
    graph.add_edge(START, "tools")
    return graph.compile()


def asks(*calls: dict[str, Any]) -> dict[str, Any]:
    return {"messages": [AIMessage(content="", tool_calls=list(calls))]}


def test_tool_node_replays_a_settled_call_id_as_an_equal_tool_message(tmp_path: Path) -> None:
    runs: list[int] = []

    @tool(response_format="content_and_artifact")
    def charge(cents: int) -> tuple[str, dict[str, int]]:
        """Charge a card."""
        runs.append(cents)
        return f"charged {cents}", {"receipt": 7}

    with WaljMiddleware(tmp_path) as walj_mw:
        graph = tool_node_graph([charge], walj_mw)
        given = asks(lf.call("call_c", "charge", {"cents": 500}))
        [first] = tool_messages(graph.invoke(given, CONFIG))
        [again] = tool_messages(graph.invoke(given, CONFIG))
        other = asks(lf.call("call_c", "charge", {"cents": 900}))
        [refused] = tool_messages(graph.invoke(other, CONFIG))
    assert runs == [500]
    assert (again.content, again.name, again.tool_call_id, again.status, again.artifact) == (
        first.content, first.name, first.tool_call_id, first.status, first.artifact) == (
        "charged 500", "charge", "call_c", "success", {"receipt": 7})
    assert refused.status == "error" and "different arguments" in str(refused.content)
    assert "tool_execution_replayed" in kinds(walj.ToolJournal.session_path(tmp_path, THREAD))


class RefundState(MessagesState):
    refunds: int


def test_a_command_a_tool_returned_is_replayed_as_an_equal_command(tmp_path: Path) -> None:
    runs: list[int] = []

    @tool
    def refund(order: int, tool_call_id: Annotated[str, InjectedToolCallId]) -> Command[Any]:
        """Refund an order and count it in the state."""
        runs.append(order)
        return Command(update={"refunds": 1, "messages": [
            ToolMessage(f"refunded {order}", tool_call_id=tool_call_id, name="refund")]})

    with WaljMiddleware(tmp_path) as walj_mw:
        node = ToolNode([refund], wrap_tool_call=walj_mw.wrap_tool_call)
        builder = StateGraph(RefundState)
        builder.add_node("tools", node)
        builder.add_edge(START, "tools")
        graph = builder.compile()
        given = asks(lf.call("call_r", "refund", {"order": 42}))
        first = graph.invoke(given, CONFIG)
        again = graph.invoke(given, CONFIG)
    assert runs == [42]
    for state in (first, again):
        [message] = tool_messages(state)
        assert (state["refunds"], message.content, message.tool_call_id) == (
            1, "refunded 42", "call_r")


def test_tool_errors_are_recorded_and_answered_as_langchain_answers_them(
    tmp_path: Path
) -> None:
    @tool
    def charge(cents: int) -> str:
        """Charge a card."""
        raise ValueError("card declined")

    with WaljMiddleware(tmp_path) as walj_mw:
        # ToolNode turns the exception into an error ToolMessage; walj records outcome error.
        handled = tool_node_graph([charge], walj_mw, handle_tool_errors=True)
        given = asks(lf.call("call_e", "charge", {"cents": 5}))
        [error] = tool_messages(handled.invoke(given, CONFIG))
        [replayed] = tool_messages(handled.invoke(given, CONFIG))
        # Without handle_tool_errors the exception goes on, as without walj.
        raising = tool_node_graph([charge], walj_mw, handle_tool_errors=False)
        with pytest.raises(ValueError, match="card declined"):
            raising.invoke(asks(lf.call("call_f", "charge", {"cents": 5})), CONFIG)
        assert not walj_mw.journal(THREAD).recovery.blocked
    assert error.status == "error" and "card declined" in str(error.content)
    # Replayed from walj's error text, whose whitespace runs are collapsed (docs/RECOVERY.md).
    assert (replayed.status, replayed.content) == ("error", " ".join(str(error.content).split()))
    data = records(walj.ToolJournal.session_path(tmp_path, THREAD))
    assert [(r["outcome"], r["error_type"]) for r in data
            if r["kind"] == "tool_execution_finished"] == [("error", "ToolMessageError"),
                                                           ("error", "ValueError")]


def test_a_blocked_call_is_an_error_tool_message_and_runs_nothing(tmp_path: Path) -> None:
    runs: list[str] = []

    @tool
    def send(to: str) -> str:
        """Send an email."""
        runs.append(to)
        if to == "lost":
            raise walj.ToolOutcomeUnknown("the connection dropped after the request went out")
        return "sent"

    with WaljMiddleware(tmp_path) as walj_mw:
        graph = tool_node_graph([send], walj_mw)
        with pytest.raises(walj.ToolOutcomeUnknown):
            graph.invoke(asks(lf.call("call_1", "send", {"to": "lost"})), CONFIG)
        [blocked] = tool_messages(graph.invoke(asks(lf.call("call_2", "send", {"to": "ann"})),
                                               CONFIG))
    assert runs == ["lost"]
    assert blocked.status == "error" and "was not run" in str(blocked.content)
    assert blocked.tool_call_id == "call_2"


def test_the_blocked_answer_is_written_for_the_model_and_blocked_message_replaces_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    @tool
    def send(to: str) -> str:
        """Send an email."""
        raise walj.ToolOutcomeUnknown("the connection dropped after the request went out")

    seen: list[walj.ToolResult] = []

    def custom(done: walj.ToolResult) -> str:
        seen.append(done)
        return f"{done.name} is on hold"

    answers = []
    for option in (None, "Held for review.", custom):
        with WaljMiddleware(tmp_path / str(len(answers)), blocked_message=option) as walj_mw:
            graph = tool_node_graph([send], walj_mw)
            with pytest.raises(walj.ToolOutcomeUnknown):
                graph.invoke(asks(lf.call("call_1", "send", {"to": "lost"})), CONFIG)
            with caplog.at_level("WARNING", logger="walj.integrations"):
                [blocked] = tool_messages(graph.invoke(asks(lf.call("call_2", "send",
                                                                    {"to": "ann"})), CONFIG))
            answers.append(str(blocked.content))
            assert blocked.status == "error" and blocked.tool_call_id == "call_2"
    text = answers[0].lower()
    # What happened, that nothing ran again, who settles it, what the model should do.
    for said in ("'send' was not run", "interrupted", "not known whether it took effect",
                 "nothing is run again", "a person", "tell the user", "do not retry"):
        assert said in text, said
    for developer_words in ("journal.resolve", "walj resolve", "resolve_turn", "execution"):
        assert developer_words not in text
    assert answers[1:] == ["Held for review.", "send is on hold"]
    assert [(d.call_id, d.outcome) for d in seen] == [("call_2", "blocked")]
    # The developer's instructions are in the log, naming what is in doubt.
    logged = [r.getMessage() for r in caplog.records if r.name == "walj.integrations"]
    assert len(logged) == 3 and all("walj resolve" in m and "'call_1'" in m for m in logged)
    with pytest.raises(TypeError):
        WaljMiddleware(tmp_path, blocked_message=7)


def test_with_on_blocked_interrupt_a_person_answers_through_command_resume(
    tmp_path: Path
) -> None:
    runs: list[str] = []

    @tool
    def send(to: str) -> str:
        """Send an email."""
        runs.append(to)
        if to == "lost":
            raise walj.ToolOutcomeUnknown("the connection dropped after the request went out")
        return f"sent to {to}"

    async def run(graph: Any, given: Any) -> Any:
        return await graph.ainvoke(given, CONFIG)

    with WaljMiddleware(tmp_path, on_blocked="interrupt") as walj_mw:
        node = ToolNode([send], wrap_tool_call=walj_mw.wrap_tool_call,
                        awrap_tool_call=walj_mw.awrap_tool_call)
        builder = StateGraph(MessagesState)
        builder.add_node("tools", node)
        builder.add_edge(START, "tools")
        graph = builder.compile(checkpointer=InMemorySaver())
        with pytest.raises(walj.ToolOutcomeUnknown):
            graph.invoke(asks(lf.call("call_1", "send", {"to": "lost"})), CONFIG)
        paused = asyncio.run(run(graph, asks(lf.call("call_2", "send", {"to": "ann"}))))
        [asked] = paused["__interrupt__"]
        [doubt] = asked.value["ambiguous_executions"]
        assert (asked.value["call_id"], doubt["call_id"]) == ("call_2", "call_1")
        # A bad answer is asked again, saying what was wrong; nothing is written or run.
        again = graph.invoke(Command(resume={"execution_id": doubt["execution_id"],
                                             "outcome": "maybe", "actor": "ann"}), CONFIG)
        assert "ResolutionError" in again["__interrupt__"][0].value["problem"]
        done = asyncio.run(run(graph, Command(resume={
            "execution_id": doubt["execution_id"], "outcome": "not_performed", "actor": "ann",
            "note": "the provider has no such email"})))
        assert not walj_mw.journal(THREAD).recovery.blocked
    assert runs == ["lost", "ann"]  # call_1 is never run again: it was not dispatched again
    assert tool_messages(done)[-1].content == "sent to ann"

    # A graph without a checkpointer could never resume: the blocked call is an error message.
    with WaljMiddleware(tmp_path / "bare", on_blocked="interrupt") as walj_mw:
        graph = tool_node_graph([send], walj_mw)
        with pytest.raises(walj.ToolOutcomeUnknown):
            graph.invoke(asks(lf.call("call_1", "send", {"to": "lost"})), CONFIG)
        state = graph.invoke(asks(lf.call("call_2", "send", {"to": "bob"})), CONFIG)
    assert "__interrupt__" not in state and runs == ["lost", "ann", "lost"]
    assert "was not run" in str(tool_messages(state)[-1].content)


def timeline(path: Path) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "walj", "timeline", str(path), "--json"],
                          capture_output=True, text=True, env=fx.child_env(), check=False)
    assert done.returncode in (0, 1), done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_interrupt_mode_resume_reads_the_answer_before_dispatching_one_turn_one_row(
    tmp_path: Path
) -> None:
    runs: list[str] = []

    @tool
    def send(to: str) -> str:
        """Send an email."""
        runs.append(to)
        if to == "lost":
            raise walj.ToolOutcomeUnknown("the connection dropped after the request went out")
        return f"sent to {to}"

    with WaljMiddleware(tmp_path, on_blocked="interrupt") as walj_mw:
        node = ToolNode([send], wrap_tool_call=walj_mw.wrap_tool_call)
        builder = StateGraph(MessagesState)
        builder.add_node("tools", node)
        builder.add_edge(START, "tools")
        graph = builder.compile(checkpointer=InMemorySaver())
        with pytest.raises(walj.ToolOutcomeUnknown):
            graph.invoke(asks(lf.call("call_1", "send", {"to": "lost"})), CONFIG)
        path = walj_mw.journal(THREAD).path
        written = len(records(path))
        paused = graph.invoke(asks(lf.call("call_2", "send", {"to": "ann"})), CONFIG)
        [asked] = paused["__interrupt__"]
        assert len(records(path)) == written  # asking wrote nothing, dispatched nothing
        [doubt] = asked.value["ambiguous_executions"]
        assert "walj paused tool 'send'" in asked.value["message"]
        done = graph.invoke(Command(resume={
            "execution_id": doubt["execution_id"], "outcome": "not_performed", "actor": "ann",
            "note": "the provider has no such email"}), CONFIG)
    assert runs == ["lost", "ann"] and tool_messages(done)[-1].content == "sent to ann"
    drawn = timeline(path)
    assert not drawn["blocked"]
    holding = [t for t in drawn["turns"] if any(
        row["call_id"] == "call_2" for key in ("executions", "refused", "replayed")
        for row in t[key])]
    [turn] = holding  # one turn, completed, with one row for the call
    assert turn["state"] == "completed"
    assert [(e["call_id"], e["outcome"]) for e in turn["executions"]] == [("call_2", "ok")]
    assert turn["refused"] == [] and turn["replayed"] == []
    # The first turn is call_1's, never completed (settled by the resolution of its call).
    assert [t["state"] for t in drawn["turns"]] == ["incomplete", "completed"]


def test_a_resumed_step_resolves_its_interrupted_turn_and_runs_its_other_calls(
    tmp_path: Path
) -> None:
    # As a process killed between a step's two calls leaves it: call_a finished, the turn
    # never completed, call_b never started.
    with walj.ToolJournal.open_session(tmp_path, THREAD, store_outputs=True) as journal:
        with pytest.raises(RuntimeError), journal.turn() as turn:
            turn.dispatch("lookup", {"order": 1}, call_id="call_a", handler=lambda order: "old")
            raise RuntimeError("killed")
    runs: list[int] = []

    @tool
    def lookup(order: int) -> str:
        """Look an order up."""
        runs.append(order)
        return f"order {order}"

    with WaljMiddleware(tmp_path) as walj_mw:
        assert walj_mw.journal(THREAD).recovery.blockers[0].state == "interrupted_turn"
        graph = tool_node_graph([lookup], walj_mw)
        state = graph.invoke(asks(lf.call("call_a", "lookup", {"order": 1}),
                                  lf.call("call_b", "lookup", {"order": 2})), CONFIG)
        assert not walj_mw.journal(THREAD).recovery.blocked
        [resolution] = walj_mw.journal(THREAD).recovery.resolved
    assert runs == [2]
    assert sorted(m.content for m in tool_messages(state)) == ["old", "order 2"]
    assert (resolution.kind, resolution.actor) == ("turn", RESUMED_STEP_ACTOR)

    # A turn holding a call that is not the resumed step's is another story: it still blocks.
    other: Any = {"configurable": {"thread_id": "other"}}
    with walj.ToolJournal.open_session(tmp_path, "other", store_outputs=True) as journal:
        with pytest.raises(RuntimeError), journal.turn() as turn:
            turn.dispatch("lookup", {"order": 9}, call_id="call_z", handler=lambda order: "z")
            raise RuntimeError("killed")
    with WaljMiddleware(tmp_path) as walj_mw:
        graph = tool_node_graph([lookup], walj_mw)
        state = graph.invoke(asks(lf.call("call_a", "lookup", {"order": 1})), other)
        assert walj_mw.journal("other").recovery.blocked
    assert runs == [2] and "was not run" in str(tool_messages(state)[0].content)


def test_a_call_without_a_thread_or_with_bad_options_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="on_blocked"):
        WaljMiddleware(tmp_path, on_blocked="ask")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no tools="):
        WaljMiddleware(tmp_path, tools={})
    with WaljMiddleware(tmp_path) as walj_mw:
        graph = tool_node_graph(lf.refund_tools(str(tmp_path / "e")), walj_mw)
        with pytest.raises(ValueError, match="thread_id"):
            graph.invoke(asks(lf.call("c", "lookup_order", {"order": 1})))
    assert not any(tmp_path.iterdir())
    walj_mw.close()  # idempotent
    with pytest.raises(walj.ClosedError):
        walj_mw.journal(THREAD)


def test_importing_walj_does_not_import_the_integration_and_a_missing_extra_is_named(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    script = ("import sys, walj\nprint(sorted(m for m in sys.modules if m.split('.')[0] in "
              "('langchain', 'langchain_core', 'langgraph') or m.startswith('walj.integ')))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=fx.child_env(), check=True)
    assert done.stdout.strip() == "[]"
    # As if the extra were not installed (the framework's modules are already imported here).
    for name in ("langchain.agents.middleware.types", "langchain_core.messages",
                 "langgraph.types", "langgraph.errors"):
        monkeypatch.setitem(sys.modules, name, None)
    for name in ("walj.integrations.langchain", "walj.integrations._langchain_answers"):
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(ImportError, match=r"pip install 'walj\[langchain\]'"):
        importlib.import_module("walj.integrations.langchain")


# --- real crashes ---------------------------------------------------------------------------------


def run_child(where: Path, mode: str, on_blocked: str, answer: Any = None) -> dict[str, Any]:
    """Run langchain_child.py in `where` (sessions, checkpoints, effects). A "kill_*" MODE is
    SIGKILLed once it says it parked; any other runs to its end and returns what it printed."""
    args = [sys.executable, str(CHILD), str(where / "sessions"), str(where / "checkpoints"),
            str(where / "effects.txt"), mode, on_blocked]
    if answer is not None:
        args.append(json.dumps(answer))
    child = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             cwd=where, env=fx.child_env())
    assert child.stdout is not None and child.stderr is not None
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(child.stdout, selectors.EVENT_READ)
            assert selector.select(fx.HANG_GUARD), "the child said nothing"
            line = child.stdout.readline().strip()
        if mode.startswith("kill"):
            assert line == "PARKED", (line, child.stderr.read())
            os.kill(child.pid, signal.SIGKILL)
        child.wait(fx.HANG_GUARD)
        if not mode.startswith("kill"):
            assert child.returncode == 0, child.stderr.read()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
        child.stderr.close()
    if mode.startswith("kill"):
        assert child.returncode == -signal.SIGKILL
        return {}
    printed: dict[str, Any] = json.loads(line)
    return printed


def test_sigkill_inside_a_tool_asks_a_person_and_their_answer_finishes_the_run(
    tmp_path: Path
) -> None:
    first, second = tmp_path / "answer", tmp_path / "cli"
    first.mkdir()
    run_child(first, "kill_in_tool", "interrupt")
    assert fx.effect_lines(first / "effects.txt") == ["refund 42 30"]

    # Resumed from its checkpoint, the refund task runs again: walj blocks it, and the graph
    # pauses on an interrupt that tells a person what is in doubt.
    paused = run_child(first, "resume", "interrupt")
    [asked] = paused["interrupts"]
    [doubt] = asked["ambiguous_executions"]
    assert (asked["kind"], asked["call_id"], doubt["state"], doubt["call_id"]) == (
        "walj_blocked", lf.REFUND_ID, "started", lf.REFUND_ID)
    assert fx.effect_lines(first / "effects.txt") == ["refund 42 30"]
    shutil.copytree(first, second)  # the same crash, answered a second way below

    # The person answers through Command(resume=...): the run finishes, the tool not rerun.
    done = run_child(first, "answer", "interrupt", {
        "execution_id": doubt["execution_id"], "outcome": "succeeded", "actor": "ann",
        "note": "refund 42 is in the ledger", "output": "refunded 30 on order 42"})
    assert done["interrupts"] == [] and done["messages"][-1][1] == "Refunded order 42."
    assert done["messages"][-2] == ["tool", "refunded 30 on order 42", "success", lf.REFUND_ID]
    assert fx.effect_lines(first / "effects.txt") == ["refund 42 30"]
    # Asked before it was dispatched, and dispatched once, after the answer: replayed.
    data = records(walj.ToolJournal.session_path(first / "sessions", THREAD))
    assert BLOCKED not in [r["kind"] for r in data]
    assert [r["call_id"] for r in data if r["kind"] == "tool_execution_replayed"] == [
        lf.REFUND_ID]

    # Or with `walj resolve` (the CLI), then resuming the graph: replay answers the call.
    path = walj.ToolJournal.session_path(second / "sessions", THREAD)
    resolved = subprocess.run(
        [sys.executable, "-m", "walj", "resolve", str(path), doubt["execution_id"],
         "--outcome", "succeeded", "--actor", "ops", "--note", "seen in the ledger"],
        capture_output=True, text=True, env=fx.child_env(), check=False)
    assert resolved.returncode == 0, resolved.stderr
    done = run_child(second, "resume", "interrupt")
    assert done["interrupts"] == [] and done["messages"][-1][1] == "Refunded order 42."
    assert done["messages"][-2] == ["tool", "already done, resolved by ops (seen in the ledger)",
                                    "success", lf.REFUND_ID]
    assert fx.effect_lines(second / "effects.txt") == ["refund 42 30"]
    for where in (first, second):
        with walj.ToolJournal.open_session(where / "sessions", THREAD) as journal:
            assert not journal.recovery.blocked


def test_sigkill_after_a_tool_returned_but_before_langgraph_saved_it_replays_the_result(
    tmp_path: Path
) -> None:
    run_child(tmp_path, "kill_after", "message")
    assert fx.effect_lines(tmp_path / "effects.txt") == ["refund 42 30"]
    done = run_child(tmp_path, "resume", "message")
    # LangGraph ran the refund task again; walj answered it from its record.
    assert done["messages"][-2] == ["tool", "refunded 30 on order 42", "success", lf.REFUND_ID]
    assert done["messages"][-1][1] == "Refunded order 42."
    assert fx.effect_lines(tmp_path / "effects.txt") == ["refund 42 30"]
    data = records(walj.ToolJournal.session_path(tmp_path / "sessions", THREAD))
    [replayed] = [r for r in data if r["kind"] == "tool_execution_replayed"]
    assert (replayed["call_id"], replayed["outcome"]) == (lf.REFUND_ID, "ok")
    assert [r["call_id"] for r in data if r["kind"] == "tool_execution_started"] == [
        lf.LOOKUP_ID, lf.REFUND_ID]
    assert BLOCKED not in [r["kind"] for r in data]


# --- the example ----------------------------------------------------------------------------------


def test_the_example_runs_offline_and_recovers() -> None:
    done = subprocess.run([sys.executable, str(fx.ROOT / "examples" / "langchain_agent.py")],
                          capture_output=True, text=True, cwd=fx.ROOT, timeout=120,
                          env=fx.child_env(), check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("refunds sent: 1") >= 3
    assert done.stdout.rstrip().endswith("the agent finished")
