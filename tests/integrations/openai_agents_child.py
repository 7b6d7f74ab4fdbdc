"""A real Agents SDK agent on a walj journal, for tests/integrations/test_openai_agents.py.

    python openai_agents_child.py JOURNAL_DIR SESSION_DB LEDGER

Reads one JSON command a line from stdin: {"tool": "append_line" | "count_lines", "call_id",
"kill": null | "in_tool" | "after_tool", "repair": bool (optional: the Session is read through
`repaired_session`)}. Each command is one `Runner.run` on the same
file-backed SQLiteSession, bracketed by `journaled_run`, with the journal opened for the run
and closed after it (so the test can run `walj resolve` between two commands). Prints one JSON
line per finished run: {"final", "outputs", "model_inputs"}.

The scripted model asks for the command's tool with the command's call id, unless the input
already holds a tool output after the latest user message; then it answers with those outputs.

kill "in_tool": append_line appends its line, then the process SIGKILLs itself: the handler
never returns. kill "after_tool": a wrapper outside walj's SIGKILLs the process after the
journaled tool returned, before the SDK saves the step's result to the Session.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from agents import Agent, FunctionTool, Runner, SQLiteSession, function_tool
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call
from agents.tracing import set_tracing_disabled

import walj
from walj.integrations.openai_agents import journal_tools, journaled_run, repaired_session

set_tracing_disabled(True)


def outputs_since_user(items: Any) -> list[str]:
    if not isinstance(items, list):
        return []
    last_user = max((i for i, item in enumerate(items)
                     if isinstance(item, dict) and item.get("role") == "user"), default=-1)
    return [str(item.get("output")) for item in items[last_user + 1:]
            if isinstance(item, dict) and item.get("type") == "function_call_output"]


def make_model(tool: str, call_id: str, arguments: dict[str, Any]) -> ScriptedModel:
    def respond(call: ModelCall) -> Any:
        outputs = outputs_since_user(call.input)
        if outputs:
            return [assistant_message("tool said: " + " | ".join(outputs))]
        return [function_call(tool, arguments, call_id=call_id)]

    return ScriptedModel([ModelStep.respond(respond), ModelStep.respond(respond)])


def make_tools(ledger: Path, kill: str | None) -> list[Any]:
    @function_tool
    def append_line(text: str) -> str:
        """Append one line to the ledger."""
        with ledger.open("a") as file:
            file.write(text + "\n")
            file.flush()
            os.fsync(file.fileno())
        if kill == "in_tool":
            os.kill(os.getpid(), signal.SIGKILL)
        return f"appended {text!r}"

    @function_tool
    def count_lines() -> int:
        """How many lines the ledger has."""
        return len(ledger.read_text().splitlines()) if ledger.exists() else 0

    return [append_line, count_lines]


def killing_after(tool: FunctionTool) -> FunctionTool:
    """The journaled tool with a wrapper outside walj's that dies once walj's returned."""
    journaled = tool.on_invoke_tool

    async def invoke(ctx: Any, arguments: str) -> Any:
        await journaled(ctx, arguments)
        os.kill(os.getpid(), signal.SIGKILL)

    outer = copy.copy(tool)
    outer.on_invoke_tool = invoke
    return outer


async def run(journal_dir: str, session_db: str, ledger: Path, command: dict[str, Any]) -> None:
    tool, call_id, kill = command["tool"], command["call_id"], command.get("kill")
    arguments = {"text": "charge 42"} if tool == "append_line" else {}
    model = make_model(tool, call_id, arguments)
    session = SQLiteSession("conversation-1", session_db)
    with walj.ToolJournal.open(journal_dir, store_outputs=True) as journal:
        tools = journal_tools(make_tools(ledger, kill), journal)
        if kill == "after_tool":
            tools = [killing_after(t) for t in tools]
        agent = Agent(name="billing", instructions="Bill.", model=model, tools=tools)
        read = repaired_session(session, journal) if command.get("repair") else session
        async with journaled_run(journal):
            result = await Runner.run(agent, f"please {tool}", session=read)
    session.close()
    outputs = [str(item.output) for item in result.new_items
               if item.type == "tool_call_output_item"]
    print(json.dumps({"final": result.final_output, "outputs": outputs,
                      "model_inputs": [c.input for c in model.calls]}, default=str), flush=True)


def main() -> None:
    journal_dir, session_db, ledger = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    for line in sys.stdin:
        if line.strip():
            asyncio.run(run(journal_dir, session_db, ledger, json.loads(line)))


if __name__ == "__main__":
    main()
