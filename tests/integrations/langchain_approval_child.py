"""Test helper run as a child process: a LangChain agent whose send_refund needs a person's
approval (WaljMiddleware(approval=...)), with a checkpointer kept in a file, killed where the
parent asks.

Usage: python langchain_approval_child.py ROOT CHECKPOINTS EFFECTS MODE [ANSWER]

MODE "kill_before_run": a fresh run, which pauses on the approval's interrupt; the interrupt's
value is written to EFFECTS + ".asked", then the thread is resumed with Command(resume=ANSWER
given the request's approval_id) and an observer of the thread's journal prints "PARKED" and
sleeps when send_refund's dispatch starts, before its intent: the parent's SIGKILL lands after
the approval and before the call runs. MODE "kill_after_run": resume; a middleware outside
WaljMiddleware parks once send_refund's call has returned through walj, before LangGraph saves
that task's result. MODE "resume": resume the thread from its checkpoint. Prints one JSON line:
the thread's messages and the pending interrupts.
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

import walj
from walj.integrations.langchain import WaljMiddleware

THREAD = "user:42"


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


class ParkBeforeRefund(walj.ToolObserver):
    """Parks when send_refund's dispatch starts: before its intent is written."""

    def on_start(self, context: walj.ToolContext) -> None:
        if context.tool == "send_refund":
            park()


def main() -> None:
    root, checkpoints, effects, mode = sys.argv[1:5]
    outer = [ParkAfterRefund()] if mode == "kill_after_run" else []
    config = {"configurable": {"thread_id": THREAD}}
    with WaljMiddleware(root, approval={"send_refund": True}) as walj_mw:
        agent = lf.refund_agent(lf.refund_tools(effects), [*outer, walj_mw],
                                lf.FileSaver(checkpoints))
        given: Any = None
        if mode == "kill_before_run":
            paused = agent.invoke({"messages": [HumanMessage("refund order 42")]}, config,
                                  durability="sync")
            [asked] = paused["__interrupt__"]
            with open(effects + ".asked", "w", encoding="utf-8") as f:
                json.dump(asked.value, f)
            given = Command(resume={**json.loads(sys.argv[5]),
                                    "approval_id": asked.value["approval_id"]})
            walj_mw.journal(THREAD).add_observer(ParkBeforeRefund())
        agent.invoke(given, config, durability="sync")
        state = agent.get_state(config)
    print(json.dumps({
        "messages": [[m.type, m.content, getattr(m, "status", None),
                      getattr(m, "tool_call_id", None)] for m in state.values["messages"]],
        "interrupts": [i.value for i in state.interrupts],
    }), flush=True)


if __name__ == "__main__":
    main()
