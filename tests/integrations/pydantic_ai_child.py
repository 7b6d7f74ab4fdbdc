"""Test helper for the Pydantic AI integration: the agent (a real `Agent` on a `FunctionModel`
with explicit tool-call ids), a run that saves its message history after every step, and, run
as a child process, that run killed by a real SIGKILL.

Usage: python pydantic_ai_child.py ROOT EFFECTS HISTORY MODE

The model asks for `send_refund` (call id "call_refund"), then answers with text. send_refund
appends a line to EFFECTS and fsyncs it. MODE "in_tool": the child SIGKILLs itself inside
send_refund, after that line. MODE "after_tool": a capability outside walj's SIGKILLs it once
walj's wrapper returned, before Pydantic AI saved the step. MODE "clean": the run finishes, and
the child prints "DONE". HISTORY holds the run's messages as of its last finished step.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

from pydantic_ai import Agent, RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from walj.integrations.pydantic_ai import WaljCapability

CONVERSATION = "conv-refund-7"
CALL_ID = "call_refund"


def tool_returns(messages: list[ModelMessage]) -> list[ToolReturnPart]:
    return [part for m in messages if isinstance(m, ModelRequest) for part in m.parts
            if isinstance(part, ToolReturnPart)]


def refund_model() -> FunctionModel:
    """Asks for one refund under a fixed id; once it has an answer for it, says so in text."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        answers = [p for p in tool_returns(messages) if p.tool_call_id == CALL_ID]
        if not answers:
            return ModelResponse(parts=[ToolCallPart("send_refund", {"order": 7, "amount": 30},
                                                     tool_call_id=CALL_ID)])
        last = answers[-1]
        return ModelResponse(parts=[TextPart(f"{last.outcome}: {last.content}")])

    return FunctionModel(respond)


class KillAfterTool(AbstractCapability[Any]):
    """Outside walj's capability: SIGKILL once walj's wrapper returned the tool's result."""

    async def wrap_tool_execute(self, ctx: RunContext[Any], *, call: ToolCallPart,
                                tool_def: Any, args: dict[str, Any], handler: Any) -> Any:
        result = await handler(args)
        os.kill(os.getpid(), signal.SIGKILL)
        return result


def refund_agent(walj_capability: WaljCapability, effects: Path, *, kill: str = "",
                 model: FunctionModel | None = None, output_type: Any = str) -> Agent[None, Any]:
    capabilities: list[AbstractCapability[Any]] = [walj_capability]
    if kill == "after_tool":
        capabilities.insert(0, KillAfterTool())  # the first is the outermost
    agent: Agent[None, Any] = Agent(model or refund_model(), capabilities=capabilities,
                                    output_type=output_type)
    calls: list[int] = []

    @agent.tool_plain
    def send_refund(order: int, amount: int) -> str:
        calls.append(order)
        with open(effects, "a", encoding="utf-8") as f:
            f.write(f"refund {order} {amount}\n")
            f.flush()
            os.fsync(f.fileno())
        if kill == "in_tool":
            os.kill(os.getpid(), signal.SIGKILL)
        return f"refunded {amount} on order {order}"

    agent.refund_calls = calls  # type: ignore[attr-defined]
    return agent


def save_history(path: Path, messages: list[ModelMessage]) -> None:
    """Atomically: a crash leaves the previous step's history or this one, never half."""
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(ModelMessagesTypeAdapter.dump_json(messages))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_history(path: Path) -> list[ModelMessage]:
    return ModelMessagesTypeAdapter.validate_json(path.read_bytes())


async def run_saving(agent: Agent[None, Any], history: Path, prompt: str | None, *,
                     message_history: list[ModelMessage] | None = None,
                     **options: Any) -> Any:
    """Run the agent, saving its messages to `history` after every step (as an app that
    checkpoints its conversation does); returns the run's result."""
    async with agent.iter(prompt, message_history=message_history, **options) as run:
        async for _node in run:
            save_history(history, run.all_messages())
    assert run.result is not None
    save_history(history, run.result.all_messages())
    return run.result


def main() -> None:
    root, effects, history, mode = sys.argv[1:5]
    with WaljCapability(root) as capability:
        agent = refund_agent(capability, Path(effects),
                             kill=mode if mode in ("in_tool", "after_tool") else "")
        result = asyncio.run(run_saving(agent, Path(history), "refund order 7",
                                        conversation_id=CONVERSATION))
    print("DONE", result.output, flush=True)


if __name__ == "__main__":
    main()
