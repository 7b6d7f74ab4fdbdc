"""A LangChain agent (create_agent on LangGraph) on walj, killed inside a tool, then resumed
from its checkpoint; then a tool call that waits for a person's approval. Offline.

    python examples/langchain_agent.py

A scripted chat model (LangChain's GenericFakeChatModel, taught bind_tools) stands in for the
API, so nothing leaves the process and no API key is needed. The story:

1. A support agent refunds an order. Its send_refund tool sends the refund (a line in
   refunds.txt), and the agent process is killed with SIGKILL right then, before LangGraph
   saved the tool's result and before walj recorded its outcome.
2. The agent restarts and resumes the thread from its checkpoint. LangGraph runs the refund
   task again, as it always does after a crash; walj does not run the tool. The graph pauses
   on an interrupt that tells a person what is in doubt.
3. The person checks refunds.txt and answers with Command(resume=...): the refund went out.
   walj records the resolution, answers the call from it, and the agent finishes. One refund.
4. The customer asks for a goodwill voucher. send_voucher needs a person's approval
   (`WaljMiddleware(approval={"send_voucher": True})`): walj writes the request and the graph
   pauses on an interrupt that shows it. A supervisor approves with Command(resume=...); the
   journal records the approval, and the resumed task sends the voucher, once.
5. The conversation is over: `walj_mw.end(thread_id)` ends its walj session, durably, and
   closes its journal.

Needs `pip install 'walj[langchain]'`. Linux or macOS (the agent's first life is a fork).
"""

from __future__ import annotations

import os
import pickle
import selectors
import signal
import sys
import tempfile
import textwrap
import threading
import time
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

import walj
from walj.integrations.langchain import WaljMiddleware

CONFIG: Any = {"configurable": {"thread_id": "customer:42"}}


class ScriptedModel(GenericFakeChatModel):
    """Answers the n-th model call of a conversation with SCRIPT[n], n counted from the
    conversation itself, so a resumed thread gets the answer the killed process would have."""

    messages: Any = iter(())

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedModel:
        return self

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:
        n = sum(1 for m in messages if isinstance(m, AIMessage))
        return ChatResult(generations=[ChatGeneration(message=SCRIPT[n].model_copy())])


SCRIPT = [
    AIMessage("", tool_calls=[{"id": "call_lookup", "name": "lookup_order",
                               "args": {"order": 42}}]),
    AIMessage("", tool_calls=[{"id": "call_refund", "name": "send_refund",
                               "args": {"order": 42, "amount": "30.00 EUR"}}]),
    AIMessage("Your refund of 30.00 EUR for order 42 is on its way."),
    AIMessage("", tool_calls=[{"id": "call_voucher", "name": "send_voucher",
                               "args": {"order": 42, "amount": "5.00 EUR"}}]),
    AIMessage("A 5.00 EUR voucher is on its way too."),
]
APPROVAL = {"send_voucher": True}  # the tools whose calls wait for a person's approval


class FileCheckpointer(InMemorySaver):
    """LangGraph's in-memory checkpointer, written to one file after every save, so the thread
    survives the kill. A real application uses a durable checkpointer (SQLite, Postgres)."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path
        self.file_lock = threading.Lock()  # LangGraph saves from several threads
        if os.path.exists(path):
            with open(path, "rb") as f:
                storage, writes, blobs = pickle.load(f)
            for thread, namespaces in storage.items():
                for ns, checkpoints in namespaces.items():
                    self.storage[thread][ns].update(checkpoints)
            for key, value in writes.items():
                self.writes[key].update(value)
            self.blobs.update(blobs)

    def _save(self) -> None:
        with self.file_lock:
            state = ({t: {ns: dict(c) for ns, c in n.items()} for t, n in self.storage.items()},
                     {k: dict(v) for k, v in self.writes.items()}, dict(self.blobs))
            with open(self.path + ".tmp", "wb") as f:
                pickle.dump(state, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(self.path + ".tmp", self.path)

    def put(self, *args: Any, **kwargs: Any) -> Any:
        done = super().put(*args, **kwargs)
        self._save()
        return done

    def put_writes(self, *args: Any, **kwargs: Any) -> None:
        super().put_writes(*args, **kwargs)
        self._save()


def make_agent(directory: str, walj_mw: WaljMiddleware, on_sent: Any = None) -> Any:
    ledger = os.path.join(directory, "refunds.txt")

    @tool
    def lookup_order(order: int) -> dict[str, Any]:
        """Look an order up."""
        return {"order": order, "status": "delivered", "amount": "30.00 EUR"}

    @tool
    def send_refund(order: int, amount: str) -> str:
        """Refund an order."""
        with open(ledger, "a", encoding="utf-8") as f:  # the side effect: money goes out
            f.write(f"refund {amount} for order {order}\n")
            f.flush()
            os.fsync(f.fileno())
        if on_sent is not None:
            on_sent()
        return f"refunded {amount} for order {order}"

    @tool
    def send_voucher(order: int, amount: str) -> str:
        """Send a goodwill voucher."""
        with open(os.path.join(directory, "vouchers.txt"), "a", encoding="utf-8") as f:
            f.write(f"voucher {amount} for order {order}\n")
        return f"voucher of {amount} sent for order {order}"

    checkpointer = FileCheckpointer(os.path.join(directory, "checkpoints.pickle"))
    return create_agent(ScriptedModel(), tools=[lookup_order, send_refund, send_voucher],
                        middleware=[walj_mw], checkpointer=checkpointer)


def refunds_sent(directory: str, name: str = "refunds.txt") -> int:
    """The lines of `name`: the refunds in refunds.txt (the vouchers in vouchers.txt)."""
    path = os.path.join(directory, name)
    if not os.path.exists(path):
        return 0
    with open(path, encoding="utf-8") as f:
        return len(f.read().splitlines())


def first_life(directory: str, signal_fd: int) -> None:
    def sent() -> None:
        os.write(signal_fd, b"sent\n")
        time.sleep(60)  # killed here, inside the tool, after its side effect

    walj_mw = WaljMiddleware(os.path.join(directory, "walj"), on_blocked="interrupt",
                             approval=APPROVAL)
    agent = make_agent(directory, walj_mw, sent)
    agent.invoke({"messages": [HumanMessage("Please refund order 42.")]}, CONFIG,
                 durability="sync")


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
        if not selector.select(60) or said.readline().strip() != "sent":
            os.kill(pid, signal.SIGKILL)
            raise SystemExit("the agent never reached its tool")
    os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    print(f"   the agent (pid {pid}) called lookup_order, then send_refund, and was killed "
          "with SIGKILL inside send_refund")
    print(f"   refunds sent: {refunds_sent(directory)}, result saved by LangGraph: none")


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="walj-langchain-") as directory:
        print("1. The agent runs and is killed in the middle of a tool call")
        crash_inside_the_tool(directory)

        print("2. The agent restarts and resumes the thread from its checkpoint")
        with WaljMiddleware(os.path.join(directory, "walj"), on_blocked="interrupt",
                            approval=APPROVAL) as walj_mw:
            agent = make_agent(directory, walj_mw)
            paused = agent.invoke(None, CONFIG, durability="sync")
            [asked] = paused["__interrupt__"]
            [doubt] = asked.value["ambiguous_executions"]
            print(f"   LangGraph ran the {asked.value['tool']} task again; walj ran nothing "
                  "and paused the graph:")
            print(textwrap.fill(asked.value["message"], 96, initial_indent=" " * 5,
                                subsequent_indent=" " * 5))
            print(f"   in doubt: {doubt['tool']} call {doubt['call_id']} "
                  f"(execution {doubt['execution_id'][:8]}..., state {doubt['state']})")
            print(f"   refunds sent: {refunds_sent(directory)}")

            print("3. A person checks refunds.txt and answers: the refund went out")
            answer = {"execution_id": doubt["execution_id"], "outcome": "succeeded",
                      "actor": "operator", "note": "the refund is in refunds.txt"}
            done = agent.invoke(Command(resume=answer), CONFIG, durability="sync")
            refund_message = done["messages"][-2]
            print(f"   the refund call was answered from the resolution: "
                  f"{refund_message.content!r}")
            print(f"   the agent: {done['messages'][-1].content}")
            print(f"   blocked: {walj_mw.journal('customer:42').is_blocked()}")

            print("4. A goodwill voucher needs a supervisor's approval")
            paused = agent.invoke({"messages": [HumanMessage("Can I get a voucher?")]}, CONFIG,
                                  durability="sync")
            [asked] = paused["__interrupt__"]
            request = asked.value
            print(f"   walj wrote request {request['approval_id']} for {request['tool']} "
                  f"{request['arguments_preview']} and paused the graph; nothing ran")
            print(f"   vouchers sent: {refunds_sent(directory, 'vouchers.txt')}")
            decision = {"approval_id": request["approval_id"], "decision": "approve",
                        "actor": "supervisor", "note": "goodwill for the late refund"}
            done = agent.invoke(Command(resume=decision), CONFIG, durability="sync")
            print(f"   the supervisor approved; the voucher call ran once: "
                  f"{done['messages'][-2].content!r}")
            print(f"   the agent: {done['messages'][-1].content}")
            approval = walj_mw.journal("customer:42").approval(request["approval_id"])
            print(f"   approval {approval.status} by {approval.actor}; vouchers sent: "
                  f"{refunds_sent(directory, 'vouchers.txt')}")

            print("5. The conversation is over: its walj session is ended and its journal closed")
            walj_mw.end("customer:42")
            ended = walj.ToolJournal.open_session(os.path.join(directory, "walj"), "customer:42")
            with ended:
                print(f"   session ended: {ended.ended} (walj sweep shows it 'ended', and "
                      "walj prune retires it once old enough)")
        print(f"   refunds sent: {refunds_sent(directory)}")
        print("the agent finished")


if __name__ == "__main__":
    main()
