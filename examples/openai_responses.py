"""An OpenAI Responses agent loop on walj, killed inside a tool, then recovered; then a tool
call that waits for a person's approval. Offline.

    python examples/openai_responses.py

The real `openai` client talks to a scripted model through the HTTP library's MockTransport,
so nothing leaves the process and no API key is needed. The story:

1. A billing agent charges a card. Its charge_card tool makes the charge (a line in
   ledger.txt), and the agent process is killed with SIGKILL right then, before the outcome
   is recorded.
2. The agent restarts on the same journal. The model asks to charge the card again; walj does
   not run the tool, and the model gets a function_call_output saying it was not run.
3. An operator checks the ledger and resolves the interrupted call as succeeded, with the
   `walj resolve` command.
4. The loop goes on and finishes; the card was charged exactly once.
5. The customer disputes an old charge. refund_charge needs a person's approval
   (`walj.Tool(refund_charge, approval=True)`): walj writes a request, runs nothing, and the
   model gets the approval answer, naming the request's id, as the function_call_output.
6. An operator approves it (`journal.approve`, or `walj approve` from another process); the
   application answers the saved response again, and the refund is made once.

Needs `pip install 'walj[openai]'`. Linux or macOS (the agent's first life is a fork).
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import Any

import openai

import walj
from walj.integrations.openai import handle_response_calls

try:  # the HTTP library the SDK is built on: httpx2, or httpx for SDKs built on that
    import httpx2 as http
except ImportError:  # pragma: no cover - depends on the installed SDK
    import httpx as http  # type: ignore[no-redef]

MODEL = "scripted-model"


class ScriptedModel:
    """Stands in for the API: answers each request with the next canned response, keeps the
    requests it got."""

    def __init__(self, *replies: dict[str, Any]) -> None:
        self.replies = list(replies)
        self.requests: list[dict[str, Any]] = []

    def __call__(self, request: Any) -> Any:
        self.requests.append(json.loads(request.content))
        return http.Response(200, json=self.replies.pop(0))

    def client(self) -> openai.OpenAI:
        transport = http.MockTransport(self)
        return openai.OpenAI(api_key="offline", max_retries=0,
                             http_client=http.Client(transport=transport))

    def outputs_sent(self) -> list[dict[str, Any]]:
        """The function_call_output items of the last request."""
        return [item for item in self.requests[-1]["input"]
                if item.get("type") == "function_call_output"]


def reply(*items: dict[str, Any]) -> dict[str, Any]:
    return {"id": "resp_example", "object": "response", "created_at": 0, "model": MODEL,
            "status": "completed", "output": list(items), "parallel_tool_calls": True,
            "tool_choice": "auto", "tools": []}


def say(words: str) -> dict[str, Any]:
    return {"type": "message", "id": "msg_example", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": words, "annotations": []}]}


def function_call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function_call", "id": f"fc_{call_id}", "call_id": call_id, "name": name,
            "arguments": json.dumps(arguments), "status": "completed"}


CHARGE = {"customer": "cus_7", "cents": 4200}


def agent_loop(client: openai.OpenAI, prompt: str, tools: dict[str, Any],
               journal: walj.ToolJournal) -> str:
    """The usual loop: ask the model, answer its function calls, until it answers in text."""
    items: list[Any] = [{"role": "user", "content": prompt}]
    while True:
        response = client.responses.create(model=MODEL, input=items)
        items.extend(response.output)
        outputs = handle_response_calls(response.output, tools, journal)  # one walj turn
        if not outputs:
            return response.output_text
        items.extend(outputs)


def make_tools(directory: str, on_charged: Any = None) -> dict[str, Any]:
    ledger = os.path.join(directory, "ledger.txt")

    def get_invoice(customer: str) -> dict[str, Any]:
        return {"customer": customer, "due_cents": 4200}

    def charge_card(customer: str, cents: int, context: walj.ToolContext) -> dict[str, Any]:
        with open(ledger, "a", encoding="utf-8") as f:  # the side effect: money moves
            f.write(f"charge {customer} {cents} key={context.idempotency_key}\n")
            f.flush()
            os.fsync(f.fileno())
        if on_charged is not None:
            on_charged()
        return {"charged_cents": cents}

    def send_receipt(customer: str) -> str:
        return f"receipt sent to {customer}"

    return {"get_invoice": get_invoice, "charge_card": charge_card,
            "send_receipt": send_receipt}


DISPUTED = {"customer": "cus_7", "cents": 1500}


def refund_tool(directory: str) -> walj.Tool:
    """refund_charge, which never runs without a person's approval."""
    def refund_charge(customer: str, cents: int) -> dict[str, Any]:
        with open(os.path.join(directory, "refunds.txt"), "a", encoding="utf-8") as f:
            f.write(f"refund {customer} {cents}\n")
        return {"refunded_cents": cents}

    return walj.Tool(refund_charge, approval=True)


def charges(directory: str, name: str = "ledger.txt") -> int:
    """The lines of `name`: the charges in ledger.txt (the refunds in refunds.txt)."""
    path = os.path.join(directory, name)
    if not os.path.exists(path):
        return 0
    with open(path, encoding="utf-8") as f:
        return len(f.read().splitlines())


def first_life(directory: str, signal_fd: int) -> None:
    """The agent process that gets killed: it tells the parent once the card is charged, then
    waits for the SIGKILL."""

    def charged() -> None:
        os.write(signal_fd, b"charged\n")
        time.sleep(60)  # killed here, inside the tool, after its side effect

    model = ScriptedModel(
        reply(function_call("call_01", "get_invoice", {"customer": "cus_7"})),
        reply(function_call("call_02", "charge_card", CHARGE)),
        reply(say("Charged.")),
    )
    journal = walj.ToolJournal.open(os.path.join(directory, "journal"))
    agent_loop(model.client(), "Collect the invoice of cus_7.", make_tools(directory, charged),
               journal)


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
        if not selector.select(30) or said.readline().strip() != "charged":
            os.kill(pid, signal.SIGKILL)
            raise SystemExit("the agent never reached its tool")
    os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    print(f"   the agent (pid {pid}) called get_invoice, then charge_card, and was killed "
          "with SIGKILL inside charge_card")
    print(f"   charges in the ledger: {charges(directory)}, outcome recorded: none")


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="walj-openai-") as directory:
        path = os.path.join(directory, "journal")
        print("1. The agent runs and is killed in the middle of a tool call")
        crash_inside_the_tool(directory)

        print("2. The agent restarts on the same journal")
        with walj.ToolJournal.open(path) as journal:
            [blocker] = journal.recovery.blockers
            print(f"   blocked: {blocker.tool} (call {blocker.call_id}, state {blocker.state})")
            model = ScriptedModel(
                reply(function_call("call_03", "charge_card", CHARGE)),
                reply(say("I did not charge the card: an earlier attempt must be checked.")),
            )
            answer = agent_loop(model.client(), "Collect the invoice of cus_7.",
                                make_tools(directory), journal)
        [sent] = model.outputs_sent()
        print(f"   the model asked for charge_card again ({sent['call_id']}); its "
              "function_call_output:")
        print(textwrap.fill(sent["output"], 96, initial_indent=" " * 5,
                            subsequent_indent=" " * 5))
        print(f"   the model: {answer}")
        print(f"   charges in the ledger: {charges(directory)}")

        print("3. An operator finds the charge in ledger.txt and resolves the call")
        arguments = ["resolve", path, blocker.execution_id, "--outcome", "succeeded",
                     "--note", "the charge is in ledger.txt", "--actor", "operator"]
        print(f"   $ walj resolve JOURNAL {blocker.execution_id} --outcome succeeded "
              "--note 'the charge is in ledger.txt' --actor operator")
        done = subprocess.run([sys.executable, "-m", "walj", *arguments], capture_output=True,
                              text=True, check=False)
        for line in done.stdout.splitlines():
            print(f"     {line}")
        if done.returncode != 0:
            raise SystemExit(f"walj resolve failed: {done.stderr}")

        print("4. The agent goes on")
        with walj.ToolJournal.open(path) as journal:
            print(f"   blocked: {journal.is_blocked()}")
            model = ScriptedModel(
                reply(function_call("call_04", "send_receipt", {"customer": "cus_7"})),
                reply(say("The card was charged earlier; I sent the receipt.")),
            )
            answer = agent_loop(model.client(), "The charge went through. Send the receipt.",
                                make_tools(directory), journal)
        [sent] = model.outputs_sent()
        print(f"   send_receipt ran: {sent['output']!r}")
        print(f"   the model: {answer}")
        print(f"   charges in the ledger: {charges(directory)}")

        print("5. The customer disputes an old charge; refunding it needs a person's approval")
        tools = {**make_tools(directory), "refund_charge": refund_tool(directory)}
        with walj.ToolJournal.open(path) as journal:
            model = ScriptedModel(
                reply(function_call("call_05", "refund_charge", DISPUTED)),
                reply(say("An operator has to approve the refund first.")),
            )
            answer = agent_loop(model.client(), "Refund my disputed charge.", tools, journal)
        saved = [item for item in model.requests[1]["input"]
                 if item.get("type") == "function_call"]  # the response that asked for it
        [sent] = model.outputs_sent()
        said = json.loads(sent["output"])
        print(f"   the model got the approval answer: status {said['status']}, "
              f"approval {said['approval_id']}")
        print(f"   the model: {answer}")
        print(f"   refunds made: {charges(directory, 'refunds.txt')}")

        print("6. An operator approves it; the saved response is answered again")
        with walj.ToolJournal.open(path) as journal:
            journal.approve(said["approval_id"], actor="operator", note="duplicate charge")
            [sent] = handle_response_calls(saved, tools, journal)
            print(f"   refund_charge ran: {sent['output']!r}")
            print(f"   approval {journal.approval(said['approval_id']).status}; refunds made: "
                  f"{charges(directory, 'refunds.txt')}")
        print("the loop finished")


if __name__ == "__main__":
    main()
