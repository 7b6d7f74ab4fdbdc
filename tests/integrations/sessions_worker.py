"""Test helper run as a child process: one worker of a pool that serves LangGraph thread
"user:42", through a ToolNode with WaljMiddleware on its defaults: idle journals kept for ten
minutes, far longer than the 30 s a worker waits for a held lock, so only asking the holder to
release its idle journal hands the thread over in time.

Usage: python sessions_worker.py ROOT EFFECTS NAME

Prints "READY", then reads lines "CALL_ID WHAT" from stdin: each is one run of a `send` tool
call, which appends "NAME WHAT" to EFFECTS (fsynced) and answers "sent WHAT"; WHAT "park"
prints "PARKED" after its effect and sleeps (the parent kills the worker there). Prints one
JSON line per run: the ToolMessage's content and status.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import langchain_fakes as lf
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

from walj.integrations.langchain import WaljMiddleware

THREAD = "user:42"


def main() -> None:
    root, effects, name = sys.argv[1:4]

    @tool
    def send(what: str) -> str:
        """Send something."""
        with open(effects, "a", encoding="utf-8") as file:
            file.write(f"{name} {what}\n")
            file.flush()
            os.fsync(file.fileno())
        if what == "park":
            print("PARKED", flush=True)
            time.sleep(120)  # the parent kills this process here
            raise SystemExit("not killed")
        return f"sent {what}"

    with WaljMiddleware(root) as walj_mw:
        builder = StateGraph(MessagesState)
        builder.add_node("tools", ToolNode([send], wrap_tool_call=walj_mw.wrap_tool_call))
        builder.add_edge(START, "tools")
        graph = builder.compile()
        print("READY", flush=True)
        for line in sys.stdin:
            call_id, what = line.split()
            given: Any = {"messages": [AIMessage(content="", tool_calls=[
                lf.call(call_id, "send", {"what": what})])]}
            state = graph.invoke(given, {"configurable": {"thread_id": THREAD}})
            answer = state["messages"][-1]
            print(json.dumps({"content": answer.content, "status": answer.status}), flush=True)


if __name__ == "__main__":
    main()
