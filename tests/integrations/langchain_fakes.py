"""Test helpers for the LangChain integration: a scripted chat model that supports bind_tools,
a checkpointer that keeps its state in a file (so a run survives a SIGKILL), and the agent the
tests and the crash child build."""

from __future__ import annotations

import os
import pickle
import threading
from collections.abc import Callable, Sequence
from typing import Any

from langchain.agents import create_agent
from langchain.agents.middleware.types import AgentMiddleware
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

LOOKUP_ID = "call_lookup"
REFUND_ID = "call_refund"


class ScriptedChatModel(GenericFakeChatModel):
    """GenericFakeChatModel whose n-th answer of a conversation is `script[n]`, n being how
    many AI messages the conversation already holds: a restarted process, resuming the
    thread from its checkpoint, gets the same answer as the process that died."""

    script: list[AIMessage]
    messages: Any = iter(())

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedChatModel:
        return self

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: Any = None, **kwargs: Any) -> ChatResult:
        turn = sum(1 for m in messages if isinstance(m, AIMessage))
        answer = self.script[min(turn, len(self.script) - 1)]
        return ChatResult(generations=[ChatGeneration(message=answer.model_copy())])


def call(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "name": name, "args": args, "type": "tool_call"}


def refund_script() -> list[AIMessage]:
    """Look the order up, refund it, then say so."""
    return [
        AIMessage(content="", id="ai-0", tool_calls=[call(LOOKUP_ID, "lookup_order",
                                                          {"order": 42})]),
        AIMessage(content="", id="ai-1", tool_calls=[call(REFUND_ID, "send_refund",
                                                          {"order": 42, "amount": 30})]),
        AIMessage(content="Refunded order 42.", id="ai-2"),
    ]


def refund_tools(effects: str, park: Callable[[], None] | None = None) -> list[Any]:
    """lookup_order, and send_refund, which appends a line to `effects` (fsynced), then calls
    `park` (a crash child parks there to be killed after the side effect)."""

    @tool
    def lookup_order(order: int) -> dict[str, int]:
        """Look an order up."""
        return {"order": order, "amount": 30}

    @tool
    def send_refund(order: int, amount: int) -> str:
        """Refund an order."""
        with open(effects, "a", encoding="utf-8") as f:
            f.write(f"refund {order} {amount}\n")
            f.flush()
            os.fsync(f.fileno())
        if park is not None:
            park()
        return f"refunded {amount} on order {order}"

    return [lookup_order, send_refund]


def refund_agent(tools: list[Any], middleware: Sequence[AgentMiddleware[Any, Any, Any]],
                 checkpointer: Any = None, script: list[AIMessage] | None = None) -> Any:
    model = ScriptedChatModel(script=script or refund_script())
    return create_agent(model, tools=tools, middleware=middleware, checkpointer=checkpointer)


class FileSaver(InMemorySaver):
    """InMemorySaver whose whole state is written to one file (then fsynced and renamed into
    place) after every put, and read back when it is created: a checkpointer that survives a
    SIGKILL, for tests only."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self._path = path
        self._file_lock = threading.Lock()
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
        with self._file_lock:
            state = ({t: {ns: dict(c) for ns, c in n.items()} for t, n in self.storage.items()},
                     {k: dict(v) for k, v in self.writes.items()}, dict(self.blobs))
            tmp = self._path + ".tmp"
            with open(tmp, "wb") as f:
                pickle.dump(state, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self._path)

    def put(self, *args: Any, **kwargs: Any) -> Any:
        done = super().put(*args, **kwargs)
        self._save()
        return done

    def put_writes(self, *args: Any, **kwargs: Any) -> None:
        super().put_writes(*args, **kwargs)
        self._save()
