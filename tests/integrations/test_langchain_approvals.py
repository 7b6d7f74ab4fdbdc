"""Approvals in walj.integrations.langchain: a tool that needs one pauses the graph on an
interrupt holding the request, and the journal alone decides whether the call runs; without a
checkpointer the call is answered with the approval answer. Real graphs on a scripted model,
offline, and an agent SIGKILLed after the approval and after the call ran."""

from __future__ import annotations

import asyncio
import json
import os
import selectors
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import langchain_fakes as lf
import pytest
import sdk_fakes as fx
from journal_helpers import records
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from langgraph.types import Command

import walj
from walj.integrations.langchain import APPROVAL_KIND, WaljMiddleware

CHILD = Path(__file__).with_name("langchain_approval_child.py")
THREAD = "user:42"
CONFIG: Any = {"configurable": {"thread_id": THREAD}}
STARTED = "tool_execution_started"


def tool_messages(state: Any) -> list[ToolMessage]:
    return [m for m in state["messages"] if isinstance(m, ToolMessage)]


def graph_of(tools: list[Any], walj_mw: WaljMiddleware, checkpointer: Any = None) -> Any:
    node = ToolNode(tools, wrap_tool_call=walj_mw.wrap_tool_call,
                    awrap_tool_call=walj_mw.awrap_tool_call)
    builder = StateGraph(MessagesState)
    builder.add_node("tools", node)
    builder.add_edge(START, "tools")
    return builder.compile(checkpointer=checkpointer)


def asks(*calls: dict[str, Any]) -> dict[str, Any]:
    return {"messages": [AIMessage(content="", tool_calls=list(calls))]}


def recording_tools(runs: list[Any]) -> list[Any]:
    @tool
    def lookup(order: int) -> str:
        """Look an order up."""
        runs.append(("lookup", order))
        return f"order {order}"

    @tool
    def send(to: str, cents: int) -> str:
        """Send money."""
        runs.append(("send", to, cents))
        return f"sent {cents} to {to}"

    return [lookup, send]


def test_a_paused_call_runs_once_on_command_resume_and_only_for_its_own_request(
    tmp_path: Path
) -> None:
    runs: list[Any] = []
    script = [AIMessage(content="", id="ai-0", tool_calls=[
                  lf.call("call_l", "lookup", {"order": 1}),
                  lf.call("call_s", "send", {"to": "ann", "cents": 700})]),
              AIMessage(content="", id="ai-1", tool_calls=[
                  lf.call("call_d", "send", {"to": "bob", "cents": 9})]),
              AIMessage(content="Done.", id="ai-2")]
    with WaljMiddleware(tmp_path, approval={"send": True}) as walj_mw:
        agent = lf.refund_agent(recording_tools(runs), [walj_mw], InMemorySaver(), script)
        # One step, two parallel tasks: lookup runs, send pauses the graph with its request.
        paused = agent.invoke({"messages": [HumanMessage("pay ann")]}, CONFIG)
        [asked] = paused["__interrupt__"]
        request = asked.value
        [pending] = walj_mw.journal(THREAD).recovery.approvals
        assert runs == [("lookup", 1)]
        assert (request["kind"], request["approval_id"], request["tool"], request["call_id"]) == (
            APPROVAL_KIND, pending.approval_id, "send", "call_s")
        assert request["arguments_sha256"] == pending.arguments_sha256
        assert "ann" in request["arguments_preview"]

        # An answer naming another request decides nothing: asked again, saying why.
        again = agent.invoke(Command(resume={"approval_id": "apv-" + "0" * 32,
                                             "decision": "approve", "actor": "ann"}), CONFIG)
        assert "apv-" + "0" * 32 in again["__interrupt__"][0].value["problem"]
        assert walj_mw.journal(THREAD).approval(pending.approval_id).status == "pending"
        assert runs == [("lookup", 1)]

        # The right answer: the journal approves, and the resumed task runs the call once;
        # the next step's call pauses in turn.
        paused = asyncio.run(agent.ainvoke(Command(resume={
            "approval_id": pending.approval_id, "decision": "approve", "actor": "ann",
            "note": "checked the invoice"}), CONFIG))
        assert runs == [("lookup", 1), ("send", "ann", 700)]
        approval = walj_mw.journal(THREAD).approval(pending.approval_id)
        assert (approval.status, approval.actor, approval.note) == (
            "consumed", "ann", "checked the invoice")
        # Decided outside the graph while the middleware holds the journal (as `walj deny`
        # does: a request the live journal applies), then resumed: never run.
        denied_id = paused["__interrupt__"][0].value["approval_id"]
        path = walj.ToolJournal.session_path(tmp_path, THREAD)
        asked_live = walj.deny_session(path, denied_id, actor="ann", note="not a customer",
                                       wait=0)
        assert asked_live.status == "queued"  # left for the live journal
        done = agent.invoke(None, CONFIG)
    assert done["messages"][-1].content == "Done."
    answer = tool_messages(done)[-1]
    assert answer.status == "error" and answer.artifact["status"] == "denied"
    assert json.loads(str(answer.content)) == answer.artifact
    assert (answer.artifact["approval_id"], answer.artifact["call_id"]) == (denied_id, "call_d")
    assert "not a customer" in answer.artifact["message"]
    assert [m.content for m in tool_messages(done)[:2]] == ["order 1", "sent 700 to ann"]
    assert runs == [("lookup", 1), ("send", "ann", 700)]
    intents = [r for r in records(path) if r["kind"] == STARTED and r["call_id"] == "call_s"]
    assert [r.get("approval_id") for r in intents] == [pending.approval_id]
    # Every turn completed (the paused step's, the resumed call's): nothing blocks.
    with walj.ToolJournal.open(path) as reopened:
        assert not reopened.recovery.blocked and not reopened.recovery.incomplete_turns


def test_without_a_checkpointer_the_call_is_answered_and_a_policy_decides_per_call(
    tmp_path: Path
) -> None:
    runs: list[Any] = []
    with pytest.raises(TypeError):
        WaljMiddleware(tmp_path, approval=["send"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="on_approval"):
        WaljMiddleware(tmp_path, on_approval="ask")  # type: ignore[arg-type]
    big = {"send": lambda arguments: arguments["cents"] > 100}
    with WaljMiddleware(tmp_path, approval=big) as walj_mw:
        graph = graph_of(recording_tools(runs), walj_mw)  # no checkpointer: it cannot pause
        state = graph.invoke(asks(lf.call("call_1", "send", {"to": "ann", "cents": 50}),
                                  lf.call("call_2", "send", {"to": "bob", "cents": 5000})),
                             CONFIG)
        [waiting] = walj_mw.journal(THREAD).recovery.approvals
    small, large = tool_messages(state)
    assert (small.content, small.status) == ("sent 50 to ann", "success")
    assert large.status == "error" and "__interrupt__" not in state
    assert json.loads(str(large.content)) == large.artifact == {
        "status": "awaiting_approval", "approval_id": waiting.approval_id, "tool": "send",
        "call_id": "call_2", "message": large.artifact["message"]}
    assert waiting.approval_id in large.artifact["message"]
    assert runs == [("send", "ann", 50)]


# --- a real crash ---------------------------------------------------------------------------------


def run_child(where: Path, mode: str, answer: Any = None) -> dict[str, Any]:
    """Run langchain_approval_child.py in `where`. A "kill_*" MODE is SIGKILLed once it says it
    parked; any other runs to its end and returns what it printed."""
    args = [sys.executable, str(CHILD), str(where / "sessions"), str(where / "checkpoints"),
            str(where / "effects.txt"), mode]
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
        assert mode.startswith("kill") or child.returncode == 0, child.stderr.read()
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


def test_sigkill_after_the_approval_and_after_the_run_runs_the_call_once_as_approved(
    tmp_path: Path
) -> None:
    effects = tmp_path / "effects.txt"
    path = walj.ToolJournal.session_path(tmp_path / "sessions", THREAD)
    # The agent pauses on the request; the person's Command(resume=...) approves it, and the
    # process is killed after the approval is durable and before the call's intent.
    run_child(tmp_path, "kill_before_run", {"decision": "approve", "actor": "ann"})
    asked = json.loads((tmp_path / "effects.txt.asked").read_text(encoding="utf-8"))
    assert (asked["kind"], asked["tool"], asked["call_id"]) == (
        APPROVAL_KIND, "send_refund", lf.REFUND_ID)
    with walj.ToolJournal.open_session(tmp_path / "sessions", THREAD) as journal:
        approval = journal.approval(asked["approval_id"])
        assert (approval.status, approval.actor) == ("approved", "ann")
        assert not journal.recovery.blockers
    assert fx.effect_lines(effects) == []

    # Resumed: the approval lets the call run; killed after it returned, before LangGraph saved.
    run_child(tmp_path, "kill_after_run")
    assert fx.effect_lines(effects) == ["refund 42 30"]

    # Resumed again: the call is answered from its record, not run a second time.
    done = run_child(tmp_path, "resume")
    assert done["interrupts"] == [] and done["messages"][-1][1] == "Refunded order 42."
    assert done["messages"][-2] == ["tool", "refunded 30 on order 42", "success", lf.REFUND_ID]
    assert fx.effect_lines(effects) == ["refund 42 30"]
    data = records(path)
    [intent] = [r for r in data if r["kind"] == STARTED and r["call_id"] == lf.REFUND_ID]
    [requested] = [r for r in data if r["kind"] == "tool_approval_requested"]
    assert intent["approval_id"] == asked["approval_id"]
    assert intent["arguments_sha256"] == requested["arguments_sha256"] == asked[
        "arguments_sha256"]
    assert [r["call_id"] for r in data if r["kind"] == "tool_execution_replayed"] == [
        lf.REFUND_ID]
    with walj.ToolJournal.open_session(tmp_path / "sessions", THREAD) as journal:
        assert not journal.recovery.blocked
        assert journal.approval(asked["approval_id"]).status == "consumed"
