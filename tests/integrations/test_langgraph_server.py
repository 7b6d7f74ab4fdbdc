"""A LangGraph server process, serving a thread through WaljMiddleware, whose thread a SIGKILL
mid-tool left blocked: `walj resolve` from another process settles it while the server holds
the journal, and the server's next run of that thread dispatches and runs its tool, without a
restart."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import sdk_fakes as fx
from workers import Worker

import walj

THREAD = "user:42"


def walj_cli(*args: str | os.PathLike[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "walj", *map(str, args)], capture_output=True,
                          text=True, env=fx.child_env(), timeout=fx.HANG_GUARD, check=False)


def started(path: Path, call_id: str) -> dict[str, Any]:
    """The intent record of `call_id`, read without a lock (the server holds the journal)."""
    [record] = [r.data for r in walj.read(path)
                if r.data.get("kind") == "tool_execution_started" and r.data["call_id"] == call_id]
    return record


def test_a_blocked_langgraph_server_is_settled_from_the_cli_and_runs_the_next_call(
    tmp_path: Path
) -> None:
    root, effects = tmp_path / "sessions", tmp_path / "effects.txt"
    path = walj.ToolJournal.session_path(root, THREAD)
    crashed, server = Worker(root, effects, "crashed"), Worker(root, effects, "server")
    try:
        assert crashed.line() == "READY" and server.line() == "READY"
        crashed.send("call_1", "park")  # SIGKILLed inside the tool, after its effect
        assert crashed.line() == "PARKED"
        os.kill(crashed.process.pid, signal.SIGKILL)
        crashed.process.wait(fx.HANG_GUARD)

        # The server takes the thread and finds the call in doubt: blocked, with a message.
        blocked = server.run("call_2", "two")
        assert blocked["status"] == "error" and "was not run" in blocked["content"]
        eid = started(path, "call_1")["execution_id"]

        # Settled from the CLI while the server holds the journal: its writer applies it.
        run = walj_cli("resolve", path, eid, "--outcome", "succeeded", "--note",
                       "the parcel left the warehouse", "--actor", "ann")
        assert run.returncode == 0, run.stderr
        assert "applied by the live writer" in run.stdout

        # The same server process runs the thread's next call: dispatched, its tool run.
        ran = server.run("call_3", "three")
        assert ran == {"content": "sent three", "status": "success"}
        assert server.process.poll() is None
    finally:
        crashed.stop()
        server.stop()
    assert fx.effect_lines(effects) == ["crashed park", "server three"]
    data = [r.data for r in walj.read(path)]
    [resolved] = [r for r in data if r.get("kind") == "tool_execution_resolved"]
    assert (resolved["execution_id"], resolved["actor"]) == (eid, "ann")
    assert resolved.get("request")  # answered a request: written by the live server
    with walj.ToolJournal.open_session(root, THREAD) as journal:
        assert not journal.recovery.blocked
