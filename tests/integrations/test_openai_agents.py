"""walj.integrations.openai_agents against the real Agents SDK (`Agent`, `Runner`, SQLiteSession),
driven by the SDK's own offline `ScriptedModel`; crashes are real SIGKILLs of a child process."""

from __future__ import annotations

import asyncio
import json
import os
import selectors
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sdk_fakes import check_import_isolation

import walj

pytest.importorskip("agents")

from agents import Agent, Runner, UserError, WebSearchTool, function_tool  # noqa: E402
from agents.testing import (  # noqa: E402
    ModelCall,
    ModelStep,
    ScriptedModel,
    assistant_message,
    function_call,
)
from agents.tracing import set_tracing_disabled  # noqa: E402

from walj.integrations.openai_agents import (  # noqa: E402
    BLOCKED_PREFIX,
    ERROR_PREFIX,
    WaljSessions,
    journal_tools,
    journaled_run,
)

set_tracing_disabled(True)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CHILD = HERE / "openai_agents_child.py"
EXAMPLE = ROOT / "examples" / "openai_agents_agent.py"
HANG = 120  # seconds: only a guard against a hung child, never what a test checks


def records(path: Path) -> list[dict[str, Any]]:
    return [r.data for r in walj.read(path)]


def kinds(path: Path) -> list[str]:
    return [r["kind"] for r in records(path)]


def of_kind(path: Path, kind: str) -> list[dict[str, Any]]:
    return [r for r in records(path) if r["kind"] == kind]


def tool_outputs(items: Any) -> list[str]:
    return [str(i.get("output")) for i in items
            if isinstance(i, dict) and i.get("type") == "function_call_output"]


def scripted(*calls: Any) -> ScriptedModel:
    """Asks for `calls` (function_call items) once, then answers with the tool outputs."""

    def respond(call: ModelCall) -> Any:
        outputs = tool_outputs(call.input)
        if outputs:
            return [assistant_message(" | ".join(outputs))]
        return list(calls)

    return ScriptedModel([ModelStep.respond(respond), ModelStep.respond(respond)])


def run_agent(tools: list[Any], *calls: Any, journal: walj.ToolJournal | None = None) -> Any:
    agent = Agent(name="a", model=scripted(*calls), tools=tools)

    async def go() -> Any:
        if journal is None:
            return await Runner.run(agent, "go")
        async with journaled_run(journal):
            return await Runner.run(agent, "go")

    return asyncio.run(go())


@pytest.fixture
def journal(tmp_path: Path) -> Any:
    with walj.ToolJournal.open(tmp_path / "j", store_outputs=True) as opened:
        yield opened


# --- the crash cases: real child processes, real SIGKILL ----------------------------------------


class Child:
    """One life of the agent process: runs the commands it is sent, one Runner.run each."""

    def __init__(self, tmp: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), str(tmp / "journal"), str(tmp / "session.db"),
             str(tmp / "ledger.txt")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)

    def send(self, tool: str, call_id: str, kill: str | None = None) -> dict[str, Any] | None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"tool": tool, "call_id": call_id, "kill": kill}) + "\n")
        self.proc.stdin.flush()
        with selectors.DefaultSelector() as selector:
            selector.register(self.proc.stdout, selectors.EVENT_READ)
            assert selector.select(HANG), "the child hung"
        line = self.proc.stdout.readline()
        return json.loads(line) if line else None

    def end(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return self.proc.wait(HANG)


def resolve_cli(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "walj", "resolve", *args, "--actor", "ops-ann",
                    "--note", "checked the ledger"], check=True, cwd=ROOT, timeout=HANG,
                   capture_output=True)


def blockers(path: Path) -> tuple[walj.Blocker, ...]:
    with walj.ToolJournal.open(path) as opened:
        return opened.recovery.blockers


def ledger(tmp: Path) -> list[str]:
    return (tmp / "ledger.txt").read_text().splitlines()


def test_killed_inside_the_tool_blocks_the_replanned_call_until_resolved(tmp_path: Path) -> None:
    first = Child(tmp_path)
    assert first.send("append_line", "call-1", kill="in_tool") is None
    assert first.end() == -9
    assert ledger(tmp_path) == ["charge 42"]  # the side effect happened, then the crash

    second = Child(tmp_path)  # the same journal and Session file
    blocked = second.send("append_line", "call-2")  # the model re-plans with a new id
    assert blocked is not None
    assert blocked["outputs"][0].startswith(BLOCKED_PREFIX + "The tool 'append_line' was not run")
    assert "was not run" in blocked["final"]  # the model saw it, and the run went on
    assert ledger(tmp_path) == ["charge 42"]
    # The Session dropped the interrupted call, which had no output: the model never saw call-1.
    assert "call-1" not in json.dumps(blocked["model_inputs"])
    assert len(of_kind(tmp_path / "journal", "tool_execution_blocked")) == 1

    (blocker,) = blockers(tmp_path / "journal")
    assert (blocker.call_id, blocker.state) == ("call-1", "started")
    resolve_cli(str(tmp_path / "journal"), blocker.execution_id, "--outcome", "succeeded")
    done = second.send("count_lines", "call-3")
    assert done is not None and done["final"] == "tool said: 1"
    assert second.end() == 0
    assert ledger(tmp_path) == ["charge 42"]
    assert blockers(tmp_path / "journal") == ()


def test_killed_after_the_tool_returned_never_runs_it_again(tmp_path: Path) -> None:
    first = Child(tmp_path)
    assert first.send("append_line", "call-1", kill="after_tool") is None
    assert first.end() == -9
    assert ledger(tmp_path) == ["charge 42"]
    finished = of_kind(tmp_path / "journal", "tool_execution_finished")
    assert [r["outcome"] for r in finished] == ["ok"]  # walj recorded it; the SDK saved nothing
    (blocker,) = blockers(tmp_path / "journal")
    assert blocker.state == "interrupted_turn"  # only the unfinished run knows

    second = Child(tmp_path)
    # The same call id again: answered from the record, the handler is not called.
    replayed = second.send("append_line", "call-1")
    assert replayed is not None and replayed["final"] == "tool said: appended 'charge 42'"
    # A re-planned call with a new id: the interrupted run blocks it.
    blocked = second.send("append_line", "call-2")
    assert blocked is not None and blocked["outputs"][0].startswith(BLOCKED_PREFIX)
    assert ledger(tmp_path) == ["charge 42"]
    assert [r["call_id"] for r in of_kind(tmp_path / "journal", "tool_execution_replayed")] == [
        "call-1"]

    resolve_cli(str(tmp_path / "journal"), "--turn", str(blocker.turn_sequence))
    done = second.send("count_lines", "call-3")
    assert done is not None and done["final"] == "tool said: 1"
    assert second.end() == 0
    assert ledger(tmp_path) == ["charge 42"]


def test_a_clean_run_leaves_no_blocker(tmp_path: Path) -> None:
    child = Child(tmp_path)
    done = child.send("append_line", "call-1")
    assert done is not None and done["final"] == "tool said: appended 'charge 42'"
    assert child.end() == 0
    path = tmp_path / "journal"
    assert kinds(path) == ["turn_started", "tool_execution_started", "tool_execution_finished",
                           "turn_completed"]
    with walj.ToolJournal.open(path) as reopened:
        recovery = reopened.recovery
        assert not recovery.blockers and not recovery.incomplete_turns
        assert not reopened.is_blocked()


# --- in process ---------------------------------------------------------------------------------


def test_concurrent_calls_share_one_bracketed_turn(journal: walj.ToolJournal) -> None:
    arrived: list[str] = []
    all_in = asyncio.Event()

    @function_tool
    async def wait_for_all(name: str) -> str:
        """Returns only once all three calls are running at the same time."""
        arrived.append(name)
        if len(arrived) == 3:
            all_in.set()
        await all_in.wait()
        return f"hi {name}"

    calls = [function_call("wait_for_all", {"name": n}, call_id=f"c-{n}") for n in "xyz"]
    result = run_agent(journal_tools([wait_for_all], journal), *calls, journal=journal)
    assert result.final_output == "hi x | hi y | hi z"
    started = of_kind(journal.path, "tool_execution_started")
    assert sorted(r["call_id"] for r in started) == ["c-x", "c-y", "c-z"]
    assert {r["turn_sequence"] for r in started} == {1}
    assert kinds(journal.path).count("turn_started") == 1
    assert kinds(journal.path)[-1] == "turn_completed"


def test_unbracketed_concurrent_calls_open_one_shared_turn(journal: walj.ToolJournal) -> None:
    arrived: list[str] = []
    all_in = asyncio.Event()

    @function_tool
    async def wait_for_both(name: str) -> str:
        """Returns only once both calls are running at the same time."""
        arrived.append(name)
        if len(arrived) == 2:
            all_in.set()
        await all_in.wait()
        return name

    tools = journal_tools([wait_for_both], journal)
    calls = [function_call("wait_for_both", {"name": n}, call_id=f"c-{n}") for n in "ab"]
    assert run_agent(tools, *calls).final_output == "a | b"
    assert kinds(journal.path) == ["turn_started", "tool_execution_started",
                                   "tool_execution_started", "tool_execution_finished",
                                   "tool_execution_finished", "turn_completed"]
    # A later run (a new event loop) opens a turn of its own.
    arrived.clear()
    all_in = asyncio.Event()
    calls = [function_call("wait_for_both", {"name": n}, call_id=f"d-{n}") for n in "ab"]
    assert run_agent(tools, *calls).final_output == "a | b"
    assert kinds(journal.path).count("turn_completed") == 2
    assert not journal.is_blocked()


def test_a_tool_error_reaches_walj_and_the_model_sees_the_sdk_message(
        journal: walj.ToolJournal) -> None:
    @function_tool
    def charge(amount: int) -> str:
        """Charge."""
        raise ValueError("card declined")

    result = run_agent(journal_tools([charge], journal),
                       function_call("charge", {"amount": 1}, call_id="c1"), journal=journal)
    assert result.final_output == "An error occurred while running the tool. Please try again."
    (finished,) = of_kind(journal.path, "tool_execution_finished")
    assert finished["outcome"] == "error"
    assert finished["error"] == "ValueError: card declined"
    assert not journal.is_blocked()  # an error is an outcome: nothing is ambiguous

    @function_tool(failure_error_function=None)
    def strict_charge(amount: int) -> str:
        """Charge, raising out of the run on failure."""
        raise ValueError("card declined")

    with pytest.raises(UserError, match="card declined") as raised:  # as without walj
        run_agent(journal_tools([strict_charge], journal),
                  function_call("strict_charge", {"amount": 1}, call_id="c2"))
    assert isinstance(raised.value.__cause__, ValueError)
    assert of_kind(journal.path, "tool_execution_finished")[-1]["outcome"] == "error"


def test_bad_arguments_are_answered_and_nothing_runs(journal: walj.ToolJournal) -> None:
    ran: list[int] = []

    @function_tool
    def charge(amount: int) -> str:
        """Charge."""
        ran.append(amount)
        return "ok"

    tools = journal_tools([charge], journal)
    result = run_agent(tools, function_call("charge", "{not json", call_id="c1"),
                       function_call("charge", "[1]", call_id="c2"), journal=journal)
    first, second = result.final_output.split(" | ")
    assert first.startswith(ERROR_PREFIX + "arguments are not valid JSON")
    assert second == ERROR_PREFIX + "arguments must be a JSON object, not list"
    assert ran == []
    assert "tool_execution_started" not in kinds(journal.path)


def test_a_run_that_raised_blocks_the_next_runs_calls(journal: walj.ToolJournal) -> None:
    ran: list[str] = []

    @function_tool
    def send(to: str) -> str:
        """Send."""
        ran.append(to)
        return "sent"

    tools = journal_tools([send], journal)
    broken = ScriptedModel([[function_call("send", {"to": "ann"}, call_id="c1")],
                            RuntimeError("the model API went away")])

    async def first() -> None:
        async with journaled_run(journal):
            await Runner.run(Agent(name="a", model=broken, tools=tools), "go")

    with pytest.raises(RuntimeError, match="went away"):
        asyncio.run(first())
    assert ran == ["ann"]
    # The same call id is answered from its record; a new one is blocked by the unfinished run.
    again = run_agent(tools, function_call("send", {"to": "ann"}, call_id="c1"), journal=journal)
    assert again.final_output == "sent"
    replanned = run_agent(tools, function_call("send", {"to": "ann"}, call_id="c9"),
                          journal=journal)
    assert replanned.final_output.startswith(BLOCKED_PREFIX)
    assert ran == ["ann"]
    # Other arguments under a settled call id are refused, not run.
    refused = run_agent(tools, function_call("send", {"to": "bob"}, call_id="c1"),
                        journal=journal)
    assert refused.final_output.startswith(BLOCKED_PREFIX) and ran == ["ann"]


def test_what_cannot_be_journaled_is_refused(journal: walj.ToolJournal) -> None:
    @function_tool
    def ping() -> str:
        """Ping."""
        return "pong"

    with pytest.raises(TypeError, match="WebSearchTool.*cannot be journaled"):
        journal_tools([ping, WebSearchTool()], journal)
    with pytest.raises(TypeError, match="list of FunctionTools"):
        journal_tools(ping, journal)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="journaled already"):
        journal_tools(journal_tools([ping], journal), journal)
    with pytest.raises(TypeError, match="walj.ToolJournal"):
        journal_tools([ping], "not a journal")  # type: ignore[arg-type]
    assert ping.on_invoke_tool is not journal_tools([ping], journal)[0].on_invoke_tool


def test_import_isolation_and_the_missing_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    check_import_isolation(monkeypatch, "agents", "openai_agents", "openai-agents")


def test_the_example_runs(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=HANG)
    assert done.returncode == 0, done.stderr
    assert "charged exactly once" in done.stdout


def test_the_sdk_timeout_leaves_the_call_ambiguous(journal: walj.ToolJournal) -> None:
    @function_tool(timeout=0.05)
    async def hang() -> str:
        """Never answers."""
        await asyncio.Event().wait()
        return "unreachable"

    result = run_agent(journal_tools([hang], journal), function_call("hang", {}, call_id="c1"),
                       journal=journal)
    assert "timed out" in result.final_output  # the SDK's own timeout answer
    (ambiguous,) = of_kind(journal.path, "tool_execution_ambiguous")
    assert ambiguous["error_type"] == "CancelledError"
    assert [b.call_id for b in journal.recovery.blockers] == ["c1"]


# --- sessions: one journal per session id, held only while a run is under way -----------------


def test_walj_sessions_hold_a_journal_per_run_and_end_and_release_it(tmp_path: Path) -> None:
    ran: list[str] = []

    @function_tool
    def send(to: str) -> str:
        """Send."""
        ran.append(to)
        if to == "lost":
            raise walj.ToolOutcomeUnknown("the connection dropped")
        return f"sent to {to}"

    before = set(os.listdir("/proc/self/fd"))
    root = tmp_path / "journals"

    async def run(sessions: WaljSessions, session_id: str, call: Any) -> Any:
        async with sessions.run(session_id) as journal:
            tools = journal_tools([send], journal, blocked_message="On hold for a person.")
            return await Runner.run(Agent(name="a", model=scripted(call), tools=tools), "go")

    with WaljSessions(root, idle_timeout=None) as sessions:
        done = asyncio.run(run(sessions, "s1", function_call("send", {"to": "ann"},
                                                              call_id="c1")))
        assert done.final_output == "sent to ann"
        journal = sessions.journal("s1")
        assert not journal.closed and journal.session_id == "s1"
        sessions.release("s1")
        assert journal.closed and set(os.listdir("/proc/self/fd")) - before == set()
        with pytest.raises(UserError):  # the SDK wraps what went out of on_invoke_tool
            asyncio.run(run(sessions, "s2", function_call("send", {"to": "lost"},
                                                          call_id="c2")))
        blocked = asyncio.run(run(sessions, "s2", function_call("send", {"to": "bob"},
                                                                call_id="c3")))
        assert blocked.final_output == BLOCKED_PREFIX + "On hold for a person."
        sessions.end("s1")
    assert ran == ["ann", "lost"]
    assert set(os.listdir("/proc/self/fd")) - before == set()
    assert kinds(walj.ToolJournal.session_path(root, "s1"))[-1] == "session_ended"
    with walj.ToolJournal.open_session(root, "s1") as ended:
        assert ended.ended
