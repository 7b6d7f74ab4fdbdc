"""Journal-backed approvals in the Agents SDK integration: `needs_approval` pauses the run on a
walj approval request, the journal alone decides what runs (an edited RunState approves
nothing), and a crash around an approval never runs a call twice or with other arguments."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sdk_fakes import child_env

import walj

pytest.importorskip("agents")

import openai_agents_approval_child as oc  # noqa: E402
from agents import Agent, Runner, RunState, ToolApprovalItem, function_tool  # noqa: E402
from agents._tool_invocation import tool_invocation_identity_and_scope  # noqa: E402
from agents.testing import (  # noqa: E402
    ModelCall,
    ModelStep,
    ScriptedModel,
    assistant_message,
    function_call,
)
from agents.tracing import set_tracing_disabled  # noqa: E402

from walj.integrations.openai_agents import (  # noqa: E402
    apply_journal_decisions,
    approve_interruption,
    deny_interruption,
    interruption_approval,
    journal_tools,
    journaled_run,
)

set_tracing_disabled(True)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CHILD = HERE / "openai_agents_approval_child.py"
HANG = 120  # seconds: only a guard against a hung child, never what a test checks


def tool_outputs(items: Any) -> list[str]:
    return [str(i.get("output")) for i in items
            if isinstance(i, dict) and i.get("type") == "function_call_output"] \
        if isinstance(items, list) else []


def billing_agent(journal: walj.ToolJournal, ran: list[int], *calls: Any) -> Agent[Any]:
    """An agent whose model asks for `calls` once, then answers with the tool outputs (as
    JSON text, one per line); `charge` needs approval and appends its amount to `ran`."""

    @function_tool(needs_approval=True)
    def charge(amount: int) -> str:
        """Charge the customer's card."""
        ran.append(amount)
        return f"charged {amount}"

    def respond(call: ModelCall) -> Any:
        outputs = tool_outputs(call.input)
        return [assistant_message("\n".join(outputs))] if outputs else list(calls)

    return Agent(name="billing", model=ScriptedModel([ModelStep.respond(respond)] * 16),
                 tools=journal_tools([charge], journal))


def run(journal: walj.ToolJournal, agent: Agent[Any], given: Any) -> Any:
    async def go() -> Any:
        async with journaled_run(journal):
            return await Runner.run(agent, given)

    return asyncio.run(go())


def restore(agent: Agent[Any], text: str) -> Any:
    return asyncio.run(RunState.from_string(agent, text))


def edited(state: str, old: str, new: str) -> str:
    """A RunState's text edited as a client could: `old` replaced by `new` everywhere, and the
    SDK's own fingerprint of each pending call recomputed (with the SDK's function), so that
    the SDK alone would run the edited call."""
    data = json.loads(state.replace(old, new))
    invocations = data["context"]["tool_invocations"]
    for item in data["current_step"]["data"]["interruptions"]:
        _, call_id, _, fingerprint = tool_invocation_identity_and_scope(
            item["raw_item"], tool_name=item["raw_item"]["name"])
        invocations[call_id]["fingerprint"] = fingerprint
    return json.dumps(data)


def answers(result: Any) -> list[dict[str, Any]]:
    return [json.loads(line) for line in str(result.final_output).splitlines()
            if line.startswith("{")]


def test_an_edited_run_state_runs_nothing_the_journal_did_not_approve(tmp_path: Path) -> None:
    ran: list[int] = []
    with walj.ToolJournal.open(tmp_path / "j", store_outputs=True) as journal:
        agent = billing_agent(journal, ran, function_call("charge", {"amount": 5},
                                                          call_id="call_1"))
        paused = run(journal, agent, "charge 5")
        [item] = paused.interruptions
        request = interruption_approval(item, journal)
        assert (request.status, request.tool, request.call_id) == ("pending", "charge", "call_1")
        assert [a.approval_id for a in journal.recovery.approvals] == [request.approval_id]
        asked = paused.to_state().to_string()
        for raw in ({"type": "function_call", "name": "charge", "arguments": "{}"},
                    {"type": "function_call", "name": "charge", "call_id": 7},
                    {"type": "function_call", "name": "other", "call_id": "call_1"}):
            with pytest.raises(walj.ApprovalError) as unknown:  # no such request: hostile items
                interruption_approval(ToolApprovalItem(agent=agent, raw_item=raw), journal)
            assert unknown.value.reason == "unknown"

        # Approved in the RunState only (what an edited state carries): the journal says no.
        state = restore(agent, asked)
        state.approve(state.get_interruptions()[0])
        [answer] = answers(run(journal, agent, state))
        assert answer["status"] == "awaiting_approval"
        assert answer["approval_id"] == request.approval_id and ran == []

        # Approved properly: the journal first, then the state, which the app hands out.
        state = restore(agent, asked)
        approve_interruption(state, state.get_interruptions()[0], journal, actor="ann")
        approved = state.to_string()
        assert journal.approval(request.approval_id).status == "approved"

        # The approved state edited: other arguments, then another call id. Neither runs, and
        # the approval stays unconsumed for the call it was given for.
        more = edited(approved, '{\\"amount\\":5}', '{\\"amount\\":500}')
        refused = run(journal, agent, restore(agent, more)).final_output
        assert refused.startswith("not run: "), refused
        assert ran == [] and journal.approval(request.approval_id).status == "approved"
        other = restore(agent, edited(approved, "call_1", "call_2"))
        [answer] = answers(run(journal, agent, other))
        assert (answer["status"], answer["call_id"]) == ("awaiting_approval", "call_2")
        assert ran == [] and journal.approval(request.approval_id).status == "approved"

        # The approved state as it was given: the call runs once, consuming the approval;
        # the same state run again is answered from the record.
        assert run(journal, agent, restore(agent, approved)).final_output == "charged 5"
        assert journal.approval(request.approval_id).status == "consumed"
        assert run(journal, agent, restore(agent, approved)).final_output == "charged 5"
        assert ran == [5]


def test_a_denial_and_a_decision_made_outside_the_app_reach_the_run(tmp_path: Path) -> None:
    ran: list[int] = []
    path = tmp_path / "j"
    with walj.ToolJournal.open(path, store_outputs=True) as journal:
        agent = billing_agent(journal, ran,
                              function_call("charge", {"amount": 1}, call_id="call_a"),
                              function_call("charge", {"amount": 2}, call_id="call_b"))
        paused = run(journal, agent, "charge twice")
        items = {i.raw_item.call_id: i for i in paused.interruptions}
        to_approve = interruption_approval(items["call_b"], journal).approval_id
        state = paused.to_state()
        with pytest.raises(walj.ApprovalError):  # an automatic actor's name: nothing written
            approve_interruption(state, items["call_b"], journal, actor="policy")
        assert interruption_approval(items["call_b"], journal).status == "pending"
        deny_interruption(state, items["call_a"], journal, actor="ann", note="too much")
        with pytest.raises(walj.ApprovalError):
            deny_interruption(state, items["call_a"], journal, actor="ann")
        saved = state.to_string()
    # Another process (`walj approve`, or this) decides the other call while the app is idle.
    walj.approve_session(path, to_approve, actor="bob", note="fine")
    with walj.ToolJournal.open(path, store_outputs=True) as journal:
        agent = billing_agent(journal, ran)
        state = restore(agent, saved)
        assert apply_journal_decisions(state, journal) == []
        result = run(journal, agent, state)
    assert ran == [2]
    outputs = str(result.final_output).splitlines()
    denied = json.loads(next(line for line in outputs if line.startswith("{")))
    assert (denied["status"], denied["call_id"]) == ("denied", "call_a")
    assert "ann" in denied["message"] and "too much" in denied["message"]
    assert "charged 2" in outputs


# --- the crash: real child processes, real SIGKILL --------------------------------------------


def life(tmp: Path, mode: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CHILD), str(tmp / "journal"), str(tmp / "state.json"),
         str(tmp / "ledger.txt"), mode],
        capture_output=True, text=True, cwd=ROOT, env=child_env(), timeout=HANG)


def in_process(tmp: Path, mode: str) -> dict[str, Any]:
    """A life that ends normally, run in this process."""
    return asyncio.run(oc.life(str(tmp / "journal"), tmp / "state.json", tmp / "ledger.txt",
                               mode))


def test_killed_after_the_approval_and_after_the_call_runs_it_once(tmp_path: Path) -> None:
    approval_id = in_process(tmp_path, "ask")["approval_id"]
    ledger = tmp_path / "ledger.txt"

    # Killed once the approval is durable, before the state was saved or anything ran.
    killed = life(tmp_path, "approve_kill")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not ledger.exists()
    with walj.ToolJournal.open(tmp_path / "journal") as journal:
        approval = journal.approval(approval_id)
        assert (approval.status, approval.actor) == ("approved", "ann")

    # Approved again from the saved state (the journal has it: nothing new is written), run,
    # and killed once the call returned, before the SDK finished the step.
    killed = life(tmp_path, "approve_run_kill")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert ledger.read_text().splitlines() == ["charge 30"]

    # The application starts again: the call is answered from the record, not run again.
    assert in_process(tmp_path, "resume")["final"] == "tool said: charged 30"
    assert ledger.read_text().splitlines() == ["charge 30"]
    with walj.ToolJournal.open(tmp_path / "journal") as journal:
        assert journal.approval(approval_id).status == "consumed"
