"""A real Agents SDK agent whose `charge` tool needs approval, on a walj journal, for
tests/integrations/test_openai_agents_approvals.py: one life of the application per process.

    python openai_agents_approval_child.py JOURNAL_DIR STATE LEDGER MODE

MODE "ask": the run pauses on the approval; its RunState is saved to STATE, and the life gives
the walj approval id. MODE "approve_kill": the interruption is approved (`approve_interruption`:
the journal first, then the state) and the process SIGKILLs itself before the state is saved or
anything runs. MODE "approve_run_kill": STATE is approved again and run; a wrapper outside
walj's SIGKILLs the process once the journaled tool returned. MODE "resume": an application
starting again: the journal's decisions are carried into STATE (`apply_journal_decisions`) and
the run finishes, giving its final output. A life that ends prints what it gives, as JSON; the
test runs "ask" and "resume" in its own process.

charge appends "charge <amount>" to LEDGER (fsynced) each time it runs.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from agents import Agent, FunctionTool, Runner, RunState, function_tool
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call
from agents.tracing import set_tracing_disabled

import walj
from walj.integrations.openai_agents import (
    apply_journal_decisions,
    approve_interruption,
    interruption_approval,
    journal_tools,
    journaled_run,
)

set_tracing_disabled(True)
CALL_ID = "call_charge_1"
ARGUMENTS = {"amount": 30}


def tool_outputs(items: Any) -> list[str]:
    return [str(i.get("output")) for i in items
            if isinstance(i, dict) and i.get("type") == "function_call_output"] \
        if isinstance(items, list) else []


def scripted() -> ScriptedModel:
    """Asks for charge(30) under CALL_ID, then answers with the tool's output."""

    def respond(call: ModelCall) -> Any:
        outputs = tool_outputs(call.input)
        if outputs:
            return [assistant_message("tool said: " + " | ".join(outputs))]
        return [function_call("charge", ARGUMENTS, call_id=CALL_ID)]

    return ScriptedModel([ModelStep.respond(respond)] * 3)


def make_agent(journal: walj.ToolJournal, ledger: Path, kill_after: bool) -> Agent[Any]:
    @function_tool(needs_approval=True)
    def charge(amount: int) -> str:
        """Charge the customer's card."""
        with ledger.open("a") as file:
            file.write(f"charge {amount}\n")
            file.flush()
            os.fsync(file.fileno())
        return f"charged {amount}"

    tools = journal_tools([charge], journal)
    if kill_after:
        tools = [killing_after(tool) for tool in tools]
    return Agent(name="billing", instructions="Bill.", model=scripted(), tools=tools)


def killing_after(tool: FunctionTool) -> FunctionTool:
    """The journaled tool with a wrapper outside walj's that dies once walj's returned."""
    journaled = tool.on_invoke_tool

    async def invoke(ctx: Any, arguments: str) -> Any:
        await journaled(ctx, arguments)
        os.kill(os.getpid(), signal.SIGKILL)

    outer = copy.copy(tool)
    outer.on_invoke_tool = invoke
    return outer


def save(path: Path, state: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(state.to_string(), encoding="utf-8")
    os.replace(tmp, path)


async def life(journal_dir: str, state_path: Path, ledger: Path, mode: str) -> dict[str, Any]:
    """One life of the application (the test runs "ask" and "resume" in its own process)."""
    with walj.ToolJournal.open(journal_dir, store_outputs=True) as journal:
        agent = make_agent(journal, ledger, kill_after=mode == "approve_run_kill")
        if mode == "ask":
            async with journaled_run(journal):
                result = await Runner.run(agent, "charge 30")
            [item] = result.interruptions
            save(state_path, result.to_state())
            return {"approval_id": interruption_approval(item, journal).approval_id}
        state = await RunState.from_string(agent, state_path.read_text(encoding="utf-8"))
        if mode == "resume":
            apply_journal_decisions(state, journal)
        else:
            [item] = state.get_interruptions()
            approve_interruption(state, item, journal, actor="ann", note="customer confirmed")
            if mode == "approve_kill":
                os.kill(os.getpid(), signal.SIGKILL)
        async with journaled_run(journal):
            result = await Runner.run(agent, state)
        return {"final": result.final_output}


def main() -> None:
    journal_dir, state_path, ledger, mode = sys.argv[1:5]
    print(json.dumps(asyncio.run(life(journal_dir, Path(state_path), Path(ledger), mode))),
          flush=True)


if __name__ == "__main__":
    main()
