"""walj.integrations.mcp against real MCP servers through the real mcp client: in-process
(`mcp.Client(MCPServer)`, no network) and a server subprocess over stdio that dies mid-call."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio
import pytest

import walj

mcp = pytest.importorskip("mcp")

import mcp.types as mt  # noqa: E402
from mcp import Client, StdioServerParameters  # noqa: E402
from mcp.server.mcpserver import Context, MCPServer  # noqa: E402

from walj.integrations.mcp import (  # noqa: E402
    BLOCKED_META,
    EXECUTION_ID_META,
    IDEMPOTENCY_KEY_META,
    journaled,
    transport_lost,
)

HERE = Path(__file__).resolve().parent
CHILD = HERE / "mcp_server_child.py"
EXAMPLE = HERE.parent.parent / "examples" / "mcp_client.py"

T = TypeVar("T")


def run(make: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(asyncio.wait_for(make(), 20))


def records(path: Path) -> list[dict[str, Any]]:
    return [r.data for r in walj.read(path)]


def of_kind(path: Path, kind: str) -> list[dict[str, Any]]:
    return [r for r in records(path) if r["kind"] == kind]


def terminal(path: Path, execution_id: str) -> dict[str, Any]:
    found = [r for r in records(path) if r.get("execution_id") == execution_id
             and r["kind"] in ("tool_execution_finished", "tool_execution_ambiguous")]
    assert len(found) == 1, found
    return found[0]


def make_server() -> tuple[MCPServer, list[dict[str, Any]]]:
    """An in-process server whose tools record every call they get, `_meta` included."""
    server = MCPServer("walj-test")
    calls: list[dict[str, Any]] = []

    def note(tool: str, ctx: Context, **arguments: Any) -> None:
        calls.append({"tool": tool, "meta": dict(ctx.request_context.meta or {}), **arguments})

    @server.tool()
    def send(to: str, ctx: Context) -> str:
        note("send", ctx, to=to)
        return f"sent to {to}"

    @server.tool()
    def lookup(context: str, ctx: Context) -> str:  # an argument named like walj's context
        note("lookup", ctx, context=context)
        return f"found {context}"

    @server.tool()
    def charge(amount: int, ctx: Context) -> str:
        note("charge", ctx, amount=amount)
        raise ValueError("card declined")

    @server.tool()
    async def slow(ctx: Context) -> str:
        note("slow", ctx)
        await asyncio.sleep(30)
        return "too late"

    @server.tool()
    async def confirm(to: str, ctx: Context) -> str | mt.InputRequiredResult:
        note("confirm", ctx, to=to, round=2 if ctx.input_responses else 1)
        if not ctx.input_responses:
            question = mt.ElicitRequest(params=mt.ElicitRequestFormParams(
                message=f"send to {to}?",
                requested_schema={"type": "object", "properties": {"ok": {"type": "boolean"}}}))
            return mt.InputRequiredResult(input_requests={"ok": question}, request_state="r1")
        return f"{ctx.input_responses['ok'].action}: sent to {to}"

    return server, calls


# --- in process ---------------------------------------------------------------------------------


def test_the_call_is_one_execution_and_its_identity_reaches_the_server(logdir: Path) -> None:
    server, calls = make_server()
    caller_meta: dict[str, Any] = {"trace": "t-1"}

    async def main() -> tuple[mt.CallToolResult, mt.CallToolResult]:
        with walj.ToolJournal.open(logdir, store_outputs=True) as journal:
            async with Client(server) as client:
                mcp_client = journaled(client, journal)
                first = await mcp_client.call_tool("send", {"to": "ann"}, call_id="c1",
                                                   meta=caller_meta)  # type: ignore[arg-type]
                again = await mcp_client.call_tool("send", {"to": "ann"}, call_id="c2")
                replayed = await mcp_client.call_tool("send", {"to": "ann"}, call_id="c1")
                assert replayed.content == first.content and not replayed.is_error
                return first, again

    first, again = run(main)
    assert isinstance(first, mt.CallToolResult) and not first.is_error
    assert [c.text for c in first.content if isinstance(c, mt.TextContent)] == ["sent to ann"]
    assert caller_meta == {"trace": "t-1"}  # merged into a copy, not changed

    started = of_kind(logdir, "tool_execution_started")
    assert [(s["tool"], s["call_id"]) for s in started] == [("send", "c1"), ("send", "c2")]
    assert [c["to"] for c in calls] == ["ann", "ann"]
    for intent, seen in zip(started, calls, strict=True):
        assert seen["meta"][IDEMPOTENCY_KEY_META] == intent["idempotency_key"]
        assert seen["meta"][EXECUTION_ID_META] == intent["execution_id"]
        done = terminal(logdir, intent["execution_id"])
        assert done["kind"] == "tool_execution_finished" and done["outcome"] == "ok"
        assert "sent to ann" in done["output_preview"]
    assert calls[0]["meta"]["trace"] == "t-1"
    # Another call id: another idempotency key and execution. The settled c1 again was
    # answered from the journal (replayed): it never reached the server.
    assert started[0]["idempotency_key"] != started[1]["idempotency_key"]
    assert started[0]["execution_id"] != started[1]["execution_id"]
    assert [r["execution_id"] for r in of_kind(logdir, "tool_execution_replayed")] == [
        started[0]["execution_id"]]
    # Each call without turn= ran in a turn of its own, completed.
    assert len({s["turn_sequence"] for s in started}) == 2
    assert len(of_kind(logdir, "turn_completed")) == 3


def test_a_call_in_a_given_turn_and_an_argument_named_context(logdir: Path) -> None:
    server, calls = make_server()

    async def main() -> None:
        with walj.ToolJournal.open(logdir) as journal:
            async with Client(server) as client:
                mcp_client = journaled(client, journal)
                async with journal.turn() as turn:
                    await mcp_client.call_tool("send", {"to": "ann"}, call_id="a", turn=turn)
                    found = await mcp_client.call_tool("lookup", {"context": "x"}, turn=turn)
                    assert found.content[0].text == "found x"  # type: ignore[union-attr]
                    with pytest.raises(walj.TurnError):  # a turn is live: pass it
                        await mcp_client.call_tool("send", {"to": "bob"})

    run(main)
    assert [c["tool"] for c in calls] == ["send", "lookup"]  # bob's call never left
    started = of_kind(logdir, "tool_execution_started")
    assert [s["call_id"] for s in started] == ["a", "turn-1-call-2"]
    assert {s["turn_sequence"] for s in started} == {1}


def test_input_required_rounds_are_one_execution(logdir: Path) -> None:
    server, calls = make_server()
    asked: list[str] = []

    async def elicit(context: Any, params: Any) -> mt.ElicitResult:
        asked.append(params.message)
        return mt.ElicitResult(action="accept", content={"ok": True})

    async def main() -> mt.CallToolResult:
        with walj.ToolJournal.open(logdir) as journal:
            async with Client(server, elicitation_callback=elicit) as client:
                return await journaled(client, journal).call_tool("confirm", {"to": "ann"})

    result = run(main)
    assert result.content[0].text == "accept: sent to ann"  # type: ignore[union-attr]
    assert asked == ["send to ann?"]
    [intent] = of_kind(logdir, "tool_execution_started")
    assert [c["round"] for c in calls] == [1, 2]
    assert {c["meta"][IDEMPOTENCY_KEY_META] for c in calls} == {intent["idempotency_key"]}
    assert {c["meta"][EXECUTION_ID_META] for c in calls} == {intent["execution_id"]}
    assert terminal(logdir, intent["execution_id"])["outcome"] == "ok"


def test_an_error_result_is_outcome_error_and_returned_unchanged(logdir: Path) -> None:
    server, calls = make_server()

    async def main() -> tuple[mt.CallToolResult, mt.CallToolResult, bool]:
        with walj.ToolJournal.open(logdir) as journal:
            async with Client(server) as client:
                plain = await client.call_tool("charge", {"amount": 5})
                through = await journaled(client, journal).call_tool("charge", {"amount": 5})
                await journaled(client, journal).call_tool("send", {"to": "ann"})
                return plain, through, journal.is_blocked()

    plain, through, blocked = run(main)
    assert through.is_error
    assert through.model_dump() == plain.model_dump()  # what the plain client answers
    assert blocked is False  # a tool error is an answer, not an ambiguity
    assert [c["tool"] for c in calls] == ["charge", "charge", "send"]
    first = of_kind(logdir, "tool_execution_started")[0]
    done = terminal(logdir, first["execution_id"])
    assert done["outcome"] == "error" and done["error_type"] == "MCPToolError"
    assert plain.content[0].text in done["error"]  # type: ignore[union-attr]


def test_a_client_error_before_sending_is_an_ordinary_error(logdir: Path) -> None:
    server, calls = make_server()

    async def main() -> None:
        with walj.ToolJournal.open(logdir) as journal:
            never_entered = Client(server)
            with pytest.raises(RuntimeError, match="async context manager"):
                await journaled(never_entered, journal).call_tool("send", {"to": "ann"})
            assert not journal.is_blocked()

    run(main)
    assert calls == []
    [intent] = of_kind(logdir, "tool_execution_started")
    done = terminal(logdir, intent["execution_id"])
    assert done["outcome"] == "error" and done["error_type"] == "RuntimeError"


def test_a_timeout_is_ambiguous_and_blocks_until_resolved_across_a_reopen(logdir: Path) -> None:
    server, calls = make_server()

    async def main() -> None:
        with walj.ToolJournal.open(logdir) as journal:
            async with Client(server) as client:
                mcp_client = journaled(client, journal)
                with pytest.raises(walj.ToolOutcomeUnknown) as caught:
                    await mcp_client.call_tool("slow", read_timeout_seconds=0.2, call_id="s1")
                cause = caught.value.__cause__
                assert isinstance(cause, mcp.MCPError) and cause.code == mt.REQUEST_TIMEOUT
                assert journal.is_blocked()
                blocked = await mcp_client.call_tool("send", {"to": "ann"})
                assert blocked.is_error
                assert "The tool 'send' was not run" in blocked.content[0].text  # type: ignore
                assert blocked.meta is not None
                output = blocked.meta[BLOCKED_META]
                assert output["status"] == "blocked_interrupted_execution"
                assert [b["call_id"] for b in output["ambiguous_executions"]] == ["s1"]
                replaced = await journaled(client, journal, blocked_message=lambda done: (
                    f"{done.name} waits for a person")).call_tool("send", {"to": "bob"})
                assert replaced.is_error and replaced.meta is not None
                assert replaced.content[0].text == "send waits for a person"  # type: ignore
                assert replaced.meta[BLOCKED_META]["status"] == "blocked_interrupted_execution"
        with walj.ToolJournal.open(logdir) as journal:  # a restart: still blocked
            [blocker] = journal.recovery.blockers
            assert (blocker.tool, blocker.call_id, blocker.state) == ("slow", "s1", "ambiguous")
            async with Client(server) as client:
                mcp_client = journaled(client, journal)
                again = await mcp_client.call_tool("send", {"to": "ann"})
                assert again.is_error
                assert blocker.execution_id is not None
                journal.resolve(blocker.execution_id, "not_performed", actor="test",
                                note="the slow tool has no effect")
                done = await mcp_client.call_tool("send", {"to": "ann"})
                assert not done.is_error and done.content[0].text == "sent to ann"  # type: ignore

    run(main)
    assert [c["tool"] for c in calls] == ["slow", "send"]  # no blocked call reached it
    assert len(of_kind(logdir, "tool_execution_blocked")) == 3
    ambiguous = of_kind(logdir, "tool_execution_ambiguous")
    assert [a["error_type"] for a in ambiguous] == ["ToolOutcomeUnknown"]


def test_a_policy_registered_by_name_settles_an_mcp_call_on_open(logdir: Path) -> None:
    server, calls = make_server()
    registered: list[Any] = []

    def never(**arguments: Any) -> None:
        registered.append(arguments)

    async def main() -> None:
        with walj.ToolJournal.open(logdir) as journal:
            async with Client(server) as client:
                with pytest.raises(walj.ToolOutcomeUnknown):
                    await journaled(client, journal).call_tool("slow", read_timeout_seconds=0.1)
        tools = {"slow": walj.Tool(never, on_ambiguous="assume_done"), "send": walj.Tool(never)}
        with walj.ToolJournal.open(logdir, tools=tools) as journal:
            assert not journal.is_blocked()
            [settled] = journal.recovery.resolved
            assert (settled.tool, settled.outcome, settled.actor) == ("slow", "succeeded", "policy")
            async with Client(server) as client:
                done = await journaled(client, journal).call_tool("send", {"to": "ann"})
                assert done.content[0].text == "sent to ann"  # type: ignore[union-attr]

    run(main)
    assert registered == []  # the call ran the MCP handler, not the registered one
    assert [c["tool"] for c in calls] == ["slow", "send"]


def test_which_client_errors_leave_the_outcome_unknown() -> None:
    """A lost connection or a read timeout: unknown. An answer, or a refusal before sending: not."""
    assert transport_lost(mcp.MCPError(mt.CONNECTION_CLOSED, "Connection closed"))
    assert transport_lost(mcp.MCPError(mt.REQUEST_TIMEOUT, "timed out"))
    assert transport_lost(BrokenPipeError())
    assert transport_lost(anyio.BrokenResourceError())
    assert transport_lost(anyio.ClosedResourceError())
    assert not transport_lost(mcp.MCPError(mt.INVALID_PARAMS, "Unknown tool"))
    assert not transport_lost(mcp.MCPError(mt.INTERNAL_ERROR, "boom"))
    assert not transport_lost(RuntimeError("Client must be used within an async context manager"))
    assert not transport_lost(ValueError("bad"))
    if sys.version_info >= (3, 11):
        group = ExceptionGroup("tasks", [ValueError("bad"), BrokenPipeError()])  # noqa: F821
        assert transport_lost(group)
        assert not transport_lost(ExceptionGroup("tasks", [ValueError("bad")]))  # noqa: F821


# --- a server process that dies mid-call --------------------------------------------------------


def side_effects(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_a_server_killed_mid_call_blocks_until_resolved(tmp_path: Path, logdir: Path) -> None:
    effects = tmp_path / "effects.jsonl"
    params = StdioServerParameters(command=sys.executable, args=[str(CHILD), str(effects)])

    async def main() -> None:
        with walj.ToolJournal.open(logdir) as journal:
            async with Client(params) as client:
                mcp_client = journaled(client, journal)
                ok = await mcp_client.call_tool("send", {"to": "ann"}, call_id="c1")
                assert not ok.is_error
                with pytest.raises(walj.ToolOutcomeUnknown) as caught:
                    await mcp_client.call_tool("send", {"to": "bob", "crash": True},
                                               call_id="c2")
                cause = caught.value.__cause__
                assert isinstance(cause, mcp.MCPError) and cause.code == mt.CONNECTION_CLOSED
                blocked = await mcp_client.call_tool("send", {"to": "cat"}, call_id="c3")
                assert blocked.is_error and blocked.meta is not None
                assert blocked.meta[BLOCKED_META]["ambiguous_executions"][0]["call_id"] == "c2"
        assert [e["to"] for e in side_effects(effects)] == ["ann", "bob"]  # bob's happened

        with walj.ToolJournal.open(logdir) as journal:  # a restart, and a new server
            [blocker] = journal.recovery.blockers
            assert (blocker.tool, blocker.call_id, blocker.state) == ("send", "c2", "ambiguous")
            # What the server received carries the blocker's key: a person or a reconcile
            # hook can match the effect to the call.
            assert side_effects(effects)[1]["key"] == blocker.idempotency_key
            async with Client(params) as client:
                mcp_client = journaled(client, journal)
                still = await mcp_client.call_tool("send", {"to": "cat"}, call_id="c3")
                assert still.is_error
                assert len(side_effects(effects)) == 2
                assert blocker.execution_id is not None
                journal.resolve(blocker.execution_id, "succeeded", actor="test",
                                note="bob's line is in the side-effect file")
                assert not journal.is_blocked()
                done = await mcp_client.call_tool("send", {"to": "cat"}, call_id="c3")
                assert not done.is_error and done.content[0].text == "sent to cat"  # type: ignore

    run(main)
    lines = side_effects(effects)
    assert [e["to"] for e in lines] == ["ann", "bob", "cat"]
    assert lines[0]["pid"] == lines[1]["pid"] != lines[2]["pid"]
    # Each effect carries the id of the execution that sent it: c1, c2, and the c3 that ran.
    started = of_kind(logdir, "tool_execution_started")
    assert [s["call_id"] for s in started] == ["c1", "c2", "c3"]  # blocked ones: no intent
    assert [e["execution_id"] for e in lines] == [started[i]["execution_id"] for i in (0, 1, 2)]
    assert [b["call_id"] for b in of_kind(logdir, "tool_execution_blocked")] == ["c3", "c3"]


# --- packaging and the example ------------------------------------------------------------------


def test_import_walj_does_not_import_the_integration_and_a_missing_mcp_names_the_extra() -> None:
    script = (
        "import sys, walj\n"
        "assert 'walj.integrations.mcp' not in sys.modules and 'mcp' not in sys.modules\n"
        "sys.modules['mcp'] = None\n"  # as if mcp were not installed
        "try:\n"
        "    import walj.integrations.mcp\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    assert "pip install 'walj[mcp]'" in done.stdout


def test_the_example_runs_offline() -> None:
    done = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "blocked: The tool 'send_email' was not run" in done.stdout
    assert "after resolution: sent to carol@example.com" in done.stdout
