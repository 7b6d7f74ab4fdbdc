"""An Anthropic Messages agent loop on walj, killed inside a tool, then recovered; then a tool
call that waits for a person's approval. Offline.

    python examples/anthropic_loop.py

The real `anthropic` client talks to a scripted model through the HTTP library's
MockTransport, so nothing leaves the process and no API key is needed. The story:

1. A support agent refunds an order. Its send_refund_email tool sends the email (a line in
   outbox.txt), and the agent process is killed with SIGKILL right then, before the outcome
   is recorded.
2. The agent restarts on the same journal. The model asks for the refund email again; walj
   does not run the tool and the model gets a tool_result with is_error=True instead.
3. An operator checks the outbox and resolves the interrupted call as succeeded.
4. The loop goes on and finishes; the customer got exactly one email.
5. The model offers a goodwill credit. issue_credit needs a person's approval
   (`walj.Tool(issue_credit, approval=True)`): walj writes a request, runs nothing, and the
   model gets the approval answer, naming the request's id, as the tool_result.
6. A supervisor approves it (`journal.approve`, or `walj approve` from another process); the
   application answers the saved response again, and the credit is issued once.

Needs `pip install 'walj[anthropic]'`. Linux or macOS (the agent's first life is a fork).
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import sys
import tempfile
import textwrap
import time
from typing import Any

import anthropic

import walj
from walj.integrations.anthropic import handle_tool_uses

try:  # the HTTP library the SDK is built on: httpx2, or httpx for SDKs built on that
    import httpx2 as http
except ImportError:  # pragma: no cover - depends on the installed SDK
    import httpx as http  # type: ignore[no-redef]

MODEL = "scripted-model"


class ScriptedModel:
    """Stands in for the API: answers each request with the next canned message, keeps the
    requests it got."""

    def __init__(self, *replies: dict[str, Any]) -> None:
        self.replies = list(replies)
        self.requests: list[dict[str, Any]] = []

    def __call__(self, request: Any) -> Any:
        self.requests.append(json.loads(request.content))
        return http.Response(200, json=self.replies.pop(0))

    def client(self) -> anthropic.Anthropic:
        transport = http.MockTransport(self)
        return anthropic.Anthropic(api_key="offline", max_retries=0,
                                   http_client=http.Client(transport=transport))


def reply(*blocks: dict[str, Any]) -> dict[str, Any]:
    uses = any(block["type"] == "tool_use" for block in blocks)
    return {"id": "msg_example", "type": "message", "role": "assistant", "model": MODEL,
            "content": list(blocks), "stop_reason": "tool_use" if uses else "end_turn",
            "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1}}


def text(words: str) -> dict[str, Any]:
    return {"type": "text", "text": words}


def tool_use(block_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": block_id, "name": name, "input": arguments}


REFUND = {"order": 42, "to": "ann@example.com"}


def agent_loop(client: anthropic.Anthropic, prompt: str, tools: dict[str, Any],
               journal: walj.ToolJournal) -> str:
    """The usual loop: ask the model, answer its tool_use blocks, until it answers in text."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    while True:
        response = client.messages.create(model=MODEL, max_tokens=512, messages=messages)
        messages.append({"role": "assistant", "content": response.content})
        results = handle_tool_uses(response.content, tools, journal)  # one walj turn
        if not results:
            return "".join(getattr(block, "text", "") for block in response.content)
        messages.append({"role": "user", "content": results})


def make_tools(directory: str, on_sent: Any = None) -> dict[str, Any]:
    outbox = os.path.join(directory, "outbox.txt")

    def lookup_order(order: int) -> dict[str, Any]:
        return {"order": order, "status": "delivered", "amount": "30.00 EUR"}

    def send_refund_email(order: int, to: str, context: walj.ToolContext) -> str:
        with open(outbox, "a", encoding="utf-8") as f:  # the side effect: an email goes out
            f.write(f"refund for order {order} to {to} key={context.idempotency_key}\n")
            f.flush()
            os.fsync(f.fileno())
        if on_sent is not None:
            on_sent()
        return f"refund email sent to {to}"

    def close_ticket(order: int) -> str:
        return f"ticket for order {order} closed"

    return {"lookup_order": lookup_order, "send_refund_email": send_refund_email,
            "close_ticket": close_ticket}


CREDIT = {"customer": "ann@example.com", "cents": 500}


def credit_tool(directory: str) -> walj.Tool:
    """issue_credit, which never runs without a person's approval."""
    def issue_credit(customer: str, cents: int) -> str:
        with open(os.path.join(directory, "credits.txt"), "a", encoding="utf-8") as f:
            f.write(f"credit {cents} to {customer}\n")
        return f"credited {cents} cents to {customer}"

    return walj.Tool(issue_credit, approval=True)


def emails_sent(directory: str, name: str = "outbox.txt") -> int:
    """The lines of `name`: the emails in outbox.txt (the credits in credits.txt)."""
    path = os.path.join(directory, name)
    if not os.path.exists(path):
        return 0
    with open(path, encoding="utf-8") as f:
        return len(f.read().splitlines())


def first_life(directory: str, signal_fd: int) -> None:
    """The agent process that gets killed: it tells the parent once the email is out, then
    waits for the SIGKILL."""

    def sent() -> None:
        os.write(signal_fd, b"sent\n")
        time.sleep(60)  # killed here, inside the tool, after its side effect

    model = ScriptedModel(
        reply(text("Let me check the order."), tool_use("toolu_01", "lookup_order",
                                                        {"order": 42})),
        reply(tool_use("toolu_02", "send_refund_email", REFUND)),
        reply(text("Refund sent.")),
    )
    journal = walj.ToolJournal.open(os.path.join(directory, "journal"))
    agent_loop(model.client(), "Please refund order 42.", make_tools(directory, sent), journal)


def crash_inside_the_tool(directory: str) -> None:
    sys.stdout.flush()  # nothing buffered may be printed twice by the fork
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the agent's first life, a real child process
        os.close(read_end)
        try:
            first_life(directory, write_end)
        finally:
            os._exit(1)  # only reached if the kill never came
    os.close(write_end)
    with selectors.DefaultSelector() as selector, os.fdopen(read_end) as said:
        selector.register(said, selectors.EVENT_READ)
        if not selector.select(30) or said.readline().strip() != "sent":
            os.kill(pid, signal.SIGKILL)
            raise SystemExit("the agent never reached its tool")
    os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    print(f"   the agent (pid {pid}) called lookup_order, then send_refund_email, and was "
          "killed with SIGKILL inside send_refund_email")
    print(f"   refund emails sent: {emails_sent(directory)}, outcome recorded: none")


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="walj-anthropic-") as directory:
        print("1. The agent runs and is killed in the middle of a tool call")
        crash_inside_the_tool(directory)

        print("2. The agent restarts on the same journal")
        journal = walj.ToolJournal.open(os.path.join(directory, "journal"))
        [blocker] = journal.recovery.blockers
        print(f"   blocked: {blocker.tool} (call {blocker.call_id}, state {blocker.state})")
        model = ScriptedModel(
            reply(tool_use("toolu_03", "send_refund_email", REFUND)),
            reply(text("I could not send the refund: an earlier attempt must be checked.")),
        )
        answer = agent_loop(model.client(), "Please refund order 42.", make_tools(directory),
                            journal)
        [result] = model.requests[1]["messages"][-1]["content"]
        print(f"   the model asked for send_refund_email again; it got a tool_result with "
              f"is_error={result['is_error']}:")
        print(textwrap.fill(result["content"], 96, initial_indent=" " * 5,
                            subsequent_indent=" " * 5))
        print(f"   the model: {answer}")
        print(f"   refund emails sent: {emails_sent(directory)}")

        print("3. An operator finds the email in outbox.txt and resolves the call")
        journal.resolve(blocker.execution_id, "succeeded", actor="operator",
                        note="the refund email is in outbox.txt")
        print(f"   journal.resolve({blocker.execution_id[:8]}..., 'succeeded') -> blocked: "
              f"{journal.is_blocked()}")

        print("4. The agent goes on")
        model = ScriptedModel(
            reply(tool_use("toolu_04", "close_ticket", {"order": 42})),
            reply(text("The refund went out earlier; I closed the ticket.")),
        )
        answer = agent_loop(model.client(), "The refund email went out. Close the ticket.",
                            make_tools(directory), journal)
        [result] = model.requests[1]["messages"][-1]["content"]
        print(f"   close_ticket ran: is_error={result['is_error']}, {result['content']!r}")
        print(f"   the model: {answer}")
        print(f"   refund emails sent: {emails_sent(directory)}")

        print("5. The model offers a goodwill credit, which needs a person's approval")
        tools = {**make_tools(directory), "issue_credit": credit_tool(directory)}
        model = ScriptedModel(
            reply(tool_use("toolu_05", "issue_credit", CREDIT)),
            reply(text("A supervisor has to approve the credit; I will let you know.")),
        )
        answer = agent_loop(model.client(), "Sorry for the trouble: add a credit.", tools,
                            journal)
        saved = model.requests[1]["messages"][-2]["content"]  # the response that asked for it
        [result] = model.requests[1]["messages"][-1]["content"]
        said = json.loads(result["content"])
        print(f"   the model got the approval answer: status {said['status']}, "
              f"approval {said['approval_id']}")
        print(f"   the model: {answer}")
        print(f"   credits issued: {emails_sent(directory, 'credits.txt')}")

        print("6. A supervisor approves it; the saved response is answered again")
        journal.approve(said["approval_id"], actor="supervisor", note="goodwill")
        [result] = handle_tool_uses(saved, tools, journal)
        print(f"   issue_credit ran: {result['content']!r}")
        print(f"   approval {journal.approval(said['approval_id']).status}; credits issued: "
              f"{emails_sent(directory, 'credits.txt')}")
        journal.close()
        print("the loop finished")


if __name__ == "__main__":
    main()
