"""An MCP server dies in the middle of a tool call, and walj keeps the agent from guessing.

Run it: `python examples/mcp_client.py` (offline, a few seconds, in a temporary directory).

The script is both sides: run with `--server OUTBOX [--crash-on ADDRESS]` it is a small MCP
server over stdio whose `send_email` tool appends the email to OUTBOX, and, for ADDRESS, then
kills its own process, so the email is out but no answer ever comes back. Run without
arguments it is the agent: it calls that tool through `walj.integrations.mcp`, sees the call
end in an unknown outcome, restarts, is refused (blocked) instead of sending twice, resolves the
call after looking at the outbox, and goes on.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import tempfile
from pathlib import Path

from mcp import Client, StdioServerParameters
from mcp.server.mcpserver import Context, MCPServer

import walj
from walj.integrations.mcp import journaled

SESSION = "session-1"


def serve(outbox: str, crash_on: str | None) -> None:
    server = MCPServer("mailer")

    @server.tool()
    def send_email(to: str, body: str, ctx: Context) -> str:
        meta = ctx.request_context.meta or {}
        with open(outbox, "a", encoding="utf-8") as file:  # the effect, made durable
            file.write(json.dumps({"to": to, "body": body,
                                   "key": meta.get("io.walj/idempotency-key")}) + "\n")
            file.flush()
            os.fsync(file.fileno())
        if to == crash_on:
            os.kill(os.getpid(), signal.SIGKILL)  # sent, but the answer never leaves
        return f"sent to {to}"

    server.run("stdio")


def text(result: object) -> str:
    content = getattr(result, "content", [])
    return " ".join(getattr(block, "text", "") for block in content)


async def agent(root: Path) -> None:
    outbox = root / "outbox.jsonl"

    def server(*crash_on: str) -> StdioServerParameters:
        args = [os.path.abspath(__file__), "--server", str(outbox)]
        return StdioServerParameters(command=sys.executable,
                                     args=args + (["--crash-on", *crash_on] if crash_on else []))

    # 1. The first run: one email goes through, the server dies in the middle of the second.
    with walj.ToolJournal.open_session(root, SESSION) as journal:
        async with Client(server("bob@example.com")) as client:
            mail = journaled(client, journal)
            result = await mail.call_tool("send_email", {"to": "ann@example.com", "body": "hi"},
                                          call_id="call-1")
            print("first call:", text(result))
            try:
                await mail.call_tool("send_email", {"to": "bob@example.com", "body": "hi"},
                                     call_id="call-2")
            except walj.ToolOutcomeUnknown as exc:
                print("second call:", exc)

    # 2. The agent restarts (a new journal handle, a new server process).
    with walj.ToolJournal.open_session(root, SESSION) as journal:
        [blocker] = journal.recovery.blockers
        print(f"on restart: {blocker.state} call {blocker.call_id} of {blocker.tool}:",
              blocker.arguments_preview)
        async with Client(server()) as client:
            mail = journaled(client, journal)
            retry = await mail.call_tool("send_email", {"to": "bob@example.com", "body": "hi"},
                                         call_id="call-2")
            print("blocked:", text(retry))

            # 3. Someone looks at the outbox: the email with the call's idempotency key is there.
            sent = [json.loads(line) for line in outbox.read_text(encoding="utf-8").splitlines()]
            found = any(e["key"] == blocker.idempotency_key for e in sent)
            assert blocker.execution_id is not None
            journal.resolve(blocker.execution_id, "succeeded" if found else "not_performed",
                            actor="example", note="checked the outbox for its idempotency key")
            print("resolved as", "succeeded" if found else "not_performed")

            # 4. Dispatch goes on; bob's email is not sent twice.
            result = await mail.call_tool("send_email",
                                          {"to": "carol@example.com", "body": "hi"},
                                          call_id="call-3")
            print("after resolution:", text(result))
    print("outbox:", [e["to"] for e in (json.loads(line) for line in
                                         outbox.read_text(encoding="utf-8").splitlines())])


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--server":
        crash_on = sys.argv[4] if len(sys.argv) > 4 and sys.argv[3] == "--crash-on" else None
        serve(sys.argv[2], crash_on)
        return
    with tempfile.TemporaryDirectory() as root:
        asyncio.run(agent(Path(root)))


if __name__ == "__main__":
    main()
