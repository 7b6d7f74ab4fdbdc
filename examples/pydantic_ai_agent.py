"""A Pydantic AI agent on walj, killed inside a tool, then resumed from its history. Offline.

    python examples/pydantic_ai_agent.py

The real `pydantic_ai.Agent` runs on a `FunctionModel` that scripts the model's answers, with
explicit tool-call ids, so nothing leaves the process and no API key is needed. The story:

1. A support agent refunds an order. The app saves the conversation's messages after every
   step. The send_refund_email tool sends the email (a line in outbox.txt), and the process is
   killed with SIGKILL right then: the saved history still ends with the model's tool call.
2. The app restarts and resumes the run from that history. Pydantic AI executes the
   unanswered call again, under the same id; walj does not run it (its outcome is unknown)
   and defers it to a person instead (`on_blocked="defer"`).
3. An operator checks the outbox and answers: the email did go out.
4. The run resumes with that answer; walj records the resolution and answers the call from
   it, so the tool is not run again. The customer got exactly one email.
5. The model asks to refund the order. refund_order needs approval (`requires_approval=True`):
   the run ends with the deferred call, which names its walj approval request.
6. An operator approves it. The approval is durable in the journal before anything runs; the
   process is killed right then, before the refund.
7. The app resumes with the same answer: the refund runs once, consuming the approval; run
   again with it, the call is answered from the journal, not run twice.

Needs `pip install 'walj[pydantic-ai]'`. Linux or macOS (the agent's first life is a fork).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import tempfile
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
from pydantic_ai.tools import DeferredToolRequests

from walj.integrations.pydantic_ai import WaljCapability, answer_blocked, approval_decisions

CONVERSATION = "ticket-4242"


def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """The scripted model: asks to send the refund email once, then reports what it got."""
    answers = [part for m in messages if isinstance(m, ModelRequest) for part in m.parts
               if isinstance(part, ToolReturnPart) and part.tool_call_id == "call_email_1"]
    if not answers:
        return ModelResponse(parts=[ToolCallPart(
            "send_refund_email", {"order": 42, "to": "ann@example.com"},
            tool_call_id="call_email_1")])
    return ModelResponse(parts=[TextPart(f"Done: {answers[-1].content}")])


def make_agent(capability: WaljCapability, outbox: Path, *, die: bool) -> Agent[None, Any]:
    agent: Agent[None, Any] = Agent(FunctionModel(model), capabilities=[capability],
                                    output_type=[str, DeferredToolRequests])

    @agent.tool_plain
    def send_refund_email(order: int, to: str) -> str:
        with open(outbox, "a", encoding="utf-8") as f:  # the side effect: an email goes out
            f.write(f"refund for order {order} to {to}\n")
            f.flush()
            os.fsync(f.fileno())
        if die:
            os.kill(os.getpid(), signal.SIGKILL)  # the crash, right after the effect
        return f"refund email sent to {to}"

    return agent


def save(history: Path, messages: list[ModelMessage]) -> None:
    tmp = history.with_suffix(".tmp")
    tmp.write_bytes(ModelMessagesTypeAdapter.dump_json(messages))
    os.replace(tmp, history)


async def first_life(agent: Agent[None, Any], history: Path) -> None:
    async with agent.iter("Refund order 42", conversation_id=CONVERSATION) as run:
        async for _node in run:  # the app checkpoints the conversation after every step
            save(history, run.all_messages())


def refund_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """The scripted model of the second conversation: asks for one refund, then reports."""
    answers = [part for m in messages if isinstance(m, ModelRequest) for part in m.parts
               if isinstance(part, ToolReturnPart) and part.tool_call_id == "call_refund_1"]
    if not answers:
        return ModelResponse(parts=[ToolCallPart("refund_order", {"order": 42, "cents": 1999},
                                                 tool_call_id="call_refund_1")])
    return ModelResponse(parts=[TextPart(f"{answers[-1].outcome}: {answers[-1].content}")])


class DieBeforeTheCall(AbstractCapability[Any]):
    """The crash of step 6: the process dies as the approved call is about to be executed."""

    async def wrap_tool_execute(self, ctx: RunContext[Any], *, call: ToolCallPart,
                                tool_def: Any, args: dict[str, Any], handler: Any) -> Any:
        os.kill(os.getpid(), signal.SIGKILL)


def refund_agent(capability: WaljCapability, refunds: Path, *, die: bool) -> Agent[None, Any]:
    capabilities: list[AbstractCapability[Any]] = [capability]
    if die:
        capabilities.insert(0, DieBeforeTheCall())  # the first is the outermost
    agent: Agent[None, Any] = Agent(FunctionModel(refund_model), capabilities=capabilities,
                                    output_type=[str, DeferredToolRequests])

    @agent.tool_plain(requires_approval=True)
    def refund_order(order: int, cents: int) -> str:
        with open(refunds, "a", encoding="utf-8") as f:
            f.write(f"refund {cents} cents on order {order}\n")
            f.flush()
            os.fsync(f.fileno())
        return f"refunded {cents} cents on order {order}"

    return agent


def approval_story(root: Path, refunds: Path) -> None:
    print("5. the model asks for a refund, which needs approval")
    with WaljCapability(root) as capability:
        paused = asyncio.run(refund_agent(capability, refunds, die=False).run(
            "Refund order 42", conversation_id="ticket-4243"))
    requests = paused.output
    assert isinstance(requests, DeferredToolRequests)
    [call] = requests.approvals
    request = requests.metadata[call.tool_call_id]["walj"]
    print(f"   deferred for approval {request['approval_id']}: {request['arguments_preview']}")

    print("6. an operator approves it; the process is killed before the refund runs")
    answer = approval_decisions(requests, actor="ops-bob", approve=[call.tool_call_id],
                                note="customer asked")
    pid = os.fork()
    if pid == 0:
        with WaljCapability(root) as capability:
            asyncio.run(refund_agent(capability, refunds, die=True).run(
                message_history=paused.all_messages(), deferred_tool_results=answer))
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    print(f"   killed by SIGKILL; refunds made: {emails(refunds)}")

    print("7. the app resumes with the same answer, twice")
    with WaljCapability(root) as capability:
        agent = refund_agent(capability, refunds, die=False)
        for _ in range(2):
            done = asyncio.run(agent.run(message_history=paused.all_messages(),
                                         deferred_tool_results=answer))
            print(f"   the model says: {done.output}")
        approval = capability.journal_for("ticket-4243").approval(request["approval_id"])
        print(f"   approval {approval.status}, approved by {approval.actor}")
    print(f"   refunds made: {emails(refunds)}")
    if emails(refunds) != 1:
        sys.exit("the refund was made more than once")


def emails(outbox: Path) -> int:
    return len(outbox.read_text(encoding="utf-8").splitlines()) if outbox.exists() else 0


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="walj-pydantic-ai-"))
    root, outbox, history = work / "sessions", work / "outbox.txt", work / "history.json"

    print("1. the agent runs; the process is killed inside send_refund_email")
    pid = os.fork()
    if pid == 0:  # the agent's first life
        with WaljCapability(root) as capability:
            asyncio.run(first_life(make_agent(capability, outbox, die=True), history))
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    print(f"   killed by SIGKILL; refund emails sent: {emails(outbox)}")

    saved = ModelMessagesTypeAdapter.validate_json(history.read_bytes())
    last = saved[-1]
    assert isinstance(last, ModelResponse)
    print(f"   the saved history ends with the model's call: {last.tool_calls[0].tool_name} "
          f"{last.tool_calls[0].tool_call_id}, unanswered")

    with WaljCapability(root, on_blocked="defer") as capability:
        agent = make_agent(capability, outbox, die=False)
        print("2. resumed from the history: Pydantic AI executes the call again")
        paused = asyncio.run(agent.run(message_history=saved))
        requests = paused.output
        assert isinstance(requests, DeferredToolRequests)
        [call] = requests.calls
        message = requests.metadata[call.tool_call_id]["walj"]["message"]
        print(f"   walj deferred {call.tool_call_id} to a person: {message[:72]}...")
        print(f"   refund emails sent: {emails(outbox)}")

        print("3. an operator finds the email in the outbox and answers")
        answer = answer_blocked(requests, outcome="succeeded", actor="operator",
                                note="found in outbox.txt",
                                output="refund email sent to ann@example.com")

        print("4. the run resumes with that answer")
        done = asyncio.run(agent.run(message_history=paused.all_messages(),
                                     deferred_tool_results=answer))
        print(f"   the model says: {done.output}")
        journal = capability.journal_for(CONVERSATION)
        [resolution] = journal.recovery.resolved
        print(f"   resolved by {resolution.actor} ({resolution.note}); "
              f"blocked: {journal.is_blocked()}")
    print(f"   refund emails sent: {emails(outbox)}")
    if emails(outbox) != 1:
        sys.exit("the email went out more than once")
    approval_story(root, work / "refunds.txt")
    print("the run finished")


if __name__ == "__main__":
    main()
