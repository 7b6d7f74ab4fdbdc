"""Test helper for the Pydantic AI integration's approvals: an agent whose `send_refund` is
registered with `requires_approval=True`, on a `FunctionModel` with a fixed tool-call id, and,
run as a child process, one life of the application, perhaps ended by a real SIGKILL.

Usage: python pydantic_ai_approval_child.py ROOT EFFECTS HISTORY MODE

MODE "ask": the run ends with the deferred call; HISTORY holds its messages, and the life gives
the walj approval id from the request's metadata. MODE "approve_kill_before": the run is
resumed from HISTORY with ann's approval (`approval_decisions`); a capability outside walj's
SIGKILLs the process as the call is about to be executed, after the approval was written.
MODE "approve_kill_after": the same, SIGKILLed once walj's wrapper returned the tool's result.
MODE "approve": the same, to the end, giving the output. A life that ends prints what it gives,
as JSON; the test runs "ask" and "approve" in its own process.

send_refund appends "refund <order> <amount>" to EFFECTS (fsynced) each time it runs.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pydantic_ai_child as pc
from pydantic_ai import Agent, RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart
from pydantic_ai.tools import DeferredToolRequests

from walj.integrations.pydantic_ai import METADATA_KEY, WaljCapability, approval_decisions


class KillBeforeTool(AbstractCapability[Any]):
    """Outside walj's capability: SIGKILL before walj's wrapper is given the call."""

    async def wrap_tool_execute(self, ctx: RunContext[Any], *, call: ToolCallPart,
                                tool_def: Any, args: dict[str, Any], handler: Any) -> Any:
        os.kill(os.getpid(), signal.SIGKILL)


def approval_agent(walj_capability: WaljCapability, effects: Path, *,
                   kill: str = "") -> Agent[None, Any]:
    """The refund agent of pydantic_ai_child.py, its tool needing approval; its output may be
    the deferred requests. `agent.refund_calls` lists the orders the tool ran for."""
    capabilities: list[AbstractCapability[Any]] = [walj_capability]
    if kill == "before":
        capabilities.insert(0, KillBeforeTool())  # the first is the outermost
    elif kill == "after":
        capabilities.insert(0, pc.KillAfterTool())
    agent: Agent[None, Any] = Agent(pc.refund_model(), capabilities=capabilities,
                                    output_type=[str, DeferredToolRequests])
    calls: list[int] = []

    @agent.tool_plain(requires_approval=True)
    def send_refund(order: int, amount: int) -> str:
        calls.append(order)
        with open(effects, "a", encoding="utf-8") as f:
            f.write(f"refund {order} {amount}\n")
            f.flush()
            os.fsync(f.fileno())
        return f"refunded {amount} on order {order}"

    agent.refund_calls = calls  # type: ignore[attr-defined]
    return agent


def requests_of(messages: list[ModelMessage]) -> DeferredToolRequests:
    """The approval requests of a history that ends with the deferred response."""
    last = messages[-1]
    assert isinstance(last, ModelResponse)
    return DeferredToolRequests(approvals=list(last.tool_calls))


def life(root: str, effects: Path, history: Path, mode: str) -> dict[str, Any]:
    """One life of the application (the test runs "ask" and "approve" in its own process)."""
    kill = {"approve_kill_before": "before", "approve_kill_after": "after"}.get(mode, "")
    with WaljCapability(root) as capability:
        agent = approval_agent(capability, effects, kill=kill)
        if mode == "ask":
            result = asyncio.run(agent.run("refund order 7", conversation_id=pc.CONVERSATION))
            pc.save_history(history, result.all_messages())
            entry = result.output.metadata[pc.CALL_ID][METADATA_KEY]
            return {"approval_id": entry["approval_id"]}
        messages = pc.load_history(history)
        answer = approval_decisions(requests_of(messages), actor="ann",
                                    approve=[pc.CALL_ID], note="order checked")
        result = asyncio.run(agent.run(message_history=messages, deferred_tool_results=answer))
    return {"output": result.output}


def main() -> None:
    root, effects, history, mode = sys.argv[1:5]
    print(json.dumps(life(root, Path(effects), Path(history), mode)), flush=True)


if __name__ == "__main__":
    main()
