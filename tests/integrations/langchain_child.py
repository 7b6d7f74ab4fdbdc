"""Test helper run as a child process: a LangChain agent with WaljMiddleware and a checkpointer
kept in a file, on one thread, killed where the parent asks.

Usage: python langchain_child.py ROOT CHECKPOINTS EFFECTS MODE ON_BLOCKED [ANSWER]

MODE "kill_in_tool": a fresh run; send_refund appends its line to EFFECTS, prints "PARKED" and
sleeps, so the parent's SIGKILL lands inside the tool, after its side effect.
MODE "kill_after": a fresh run; a middleware outside WaljMiddleware prints "PARKED" and sleeps
once send_refund's call has returned through walj, before LangGraph saves that task's result.
MODE "start": a fresh run to the end. MODE "resume": resume the thread from its checkpoint.
MODE "answer": resume with Command(resume=json.loads(ANSWER)).
Prints one JSON line: the thread's messages and the pending interrupts' values.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import langchain_fakes as lf
from langchain.agents.middleware.types import AgentMiddleware
from langchain_core.messages import HumanMessage
from langgraph.types import Command

from walj.integrations.langchain import WaljMiddleware

THREAD = "user:42"  # not a safe directory name: walj encodes it


def park() -> None:
    print("PARKED", flush=True)
    time.sleep(120)  # the parent kills this process here
    raise SystemExit("not killed")


class ParkAfterRefund(AgentMiddleware[Any, Any, Any]):
    """Outside WaljMiddleware: parks once send_refund's answer came back through walj."""

    def wrap_tool_call(self, request: Any, handler: Any) -> Any:
        result = handler(request)
        if request.tool_call["name"] == "send_refund":
            park()
        return result


def main() -> None:
    root, checkpoints, effects, mode, on_blocked = sys.argv[1:6]
    tools = lf.refund_tools(effects, park if mode == "kill_in_tool" else None)
    outer = [ParkAfterRefund()] if mode == "kill_after" else []
    config = {"configurable": {"thread_id": THREAD}}
    with WaljMiddleware(root, on_blocked=on_blocked) as walj_mw:
        agent = lf.refund_agent(tools, [*outer, walj_mw], lf.FileSaver(checkpoints))
        if mode in ("kill_in_tool", "kill_after", "start"):
            given: Any = {"messages": [HumanMessage("refund order 42")]}
        elif mode == "resume":
            given = None
        else:
            given = Command(resume=json.loads(sys.argv[6]))
        agent.invoke(given, config, durability="sync")
        state = agent.get_state(config)
    print(json.dumps({
        "messages": [[m.type, m.content, getattr(m, "status", None),
                      getattr(m, "tool_call_id", None)] for m in state.values["messages"]],
        "interrupts": [i.value for i in state.interrupts],
    }), flush=True)


if __name__ == "__main__":
    main()
