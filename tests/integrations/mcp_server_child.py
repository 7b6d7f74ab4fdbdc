"""An MCP server over stdio for the crash tests: `python mcp_server_child.py SIDE_EFFECT_FILE`.

Its one tool, `send(to, crash=False)`, appends a JSON line (the recipient and the walj `_meta`
keys it received) to the side-effect file and syncs it; with `crash=True` the process then
SIGKILLs itself, so the effect has happened and no answer ever leaves.
"""

from __future__ import annotations

import json
import os
import signal
import sys

from mcp.server.mcpserver import Context, MCPServer

SIDE_EFFECTS = sys.argv[1]
server = MCPServer("mcp-server-child")


@server.tool()
def send(to: str, ctx: Context, crash: bool = False) -> str:
    meta = dict(ctx.request_context.meta or {})
    line = {"to": to, "key": meta.get("io.walj/idempotency-key"),
            "execution_id": meta.get("io.walj/execution-id"), "pid": os.getpid()}
    with open(SIDE_EFFECTS, "a", encoding="utf-8") as file:
        file.write(json.dumps(line) + "\n")
        file.flush()
        os.fsync(file.fileno())
    if crash:
        os.kill(os.getpid(), signal.SIGKILL)
    return f"sent to {to}"


if __name__ == "__main__":
    server.run("stdio")
