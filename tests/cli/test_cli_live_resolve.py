"""A blocked session settled with `walj resolve` while a real server process holds it: the
server's next dispatch runs, without a restart. Also the turn form, --no-wait and a writer that
does not answer in time (exit 3, queued, applied later)."""

from __future__ import annotations

import signal
import textwrap
import time
from pathlib import Path
from typing import Any

from cli_helpers import LineServer, assert_one_line_error, make_journal, walj_cli

SERVER = textwrap.dedent("""
    import json, sys, walj

    def send(to):
        return f"sent to {to}"

    journal = walj.ToolJournal.open(sys.argv[1], tools={"send": send})
    print(json.dumps({"ready": True}), flush=True)
    calls = 0
    for line in sys.stdin:
        calls += 1
        call = {"name": "send", "call_id": f"server-{calls}", "arguments": '{"to": "bob"}'}
        (result,) = journal.handle_function_calls([call])
        print(json.dumps(result), flush=True)
""")


def refused(result: dict[str, Any]) -> bool:
    """Whether a dispatch result is walj's refusal of a blocked call (its handler not run)."""
    output = result["output"]
    return isinstance(output, dict) and str(output.get("status")).startswith("blocked_")


class Server(LineServer):
    """A child process that holds the journal open and dispatches one call per line."""

    def __init__(self, path: Path) -> None:
        super().__init__(SERVER, path)

    def dispatch(self) -> dict[str, Any]:
        return self.ask("dispatch")


def test_a_live_server_is_settled_from_the_cli_and_dispatches_again(tmp_path: Path) -> None:
    log = tmp_path / "session"
    eid = make_journal(log, blocked=True)  # a prior run crashed mid-`send`
    assert eid is not None
    server = Server(log)
    try:
        assert refused(server.dispatch())
        run = walj_cli("resolve", log, eid[:10], "--outcome", "not_performed", "--note",
                       "no such mail in the outbox", "--actor", "ann")
        assert run.code == 0, run.err
        assert f"resolved execution {eid} (send): not_performed by ann" in run.out
        assert "applied by the live writer" in run.out and "dispatch resumes" in run.out
        ran = server.dispatch()  # the same process: no restart
        assert ran == {"name": "send", "call_id": "server-2", "arguments": {"to": "bob"},
                       "output": "sent to bob", "error": None}
        assert server.process.poll() is None
    finally:
        server.stop()
    state = walj_cli("inspect", log, "--json").json()
    assert state["blocked"] is False
    (resolution,) = state["resolutions"]
    assert resolution["execution_id"] == eid and resolution["actor"] == "ann"


def test_a_live_server_turn_is_settled_with_no_wait_and_picked_up_while_idle(
        tmp_path: Path) -> None:
    log = tmp_path / "session"
    make_journal(log, interrupted_turn=True, turns=1)
    (blocker,) = walj_cli("inspect", log, "--json").json()["blockers"]
    server = Server(log)
    try:
        assert refused(server.dispatch())
        run = walj_cli("resolve", log, "--turn", str(blocker["turn_sequence"]), "--note",
                       "the lookup was read-only", "--actor", "ann", "--no-wait", "--json")
        assert run.code == 3, run.err
        report = run.json()
        assert report["status"] == "queued" and report["resolution"] is None
        request = report["request_id"]
        deadline = time.monotonic() + 10  # the server is idle: its watcher takes it
        while time.monotonic() < deadline:
            answered = [r for r in walj_cli("dump", log, "--json").out.splitlines()
                        if request in r]
            if answered:
                break
            time.sleep(0.1)
        assert answered and "turn_resolved" in answered[0]
        assert server.dispatch()["output"] == "sent to bob"
    finally:
        server.stop()


def test_a_server_that_does_not_answer_leaves_the_request_queued(tmp_path: Path) -> None:
    log = tmp_path / "session"
    eid = make_journal(log, blocked=True)
    assert eid is not None
    server = Server(log)
    try:
        server.process.send_signal(signal.SIGSTOP)
        run = walj_cli("resolve", log, eid, "--outcome", "succeeded", "--note", "seen",
                       "--actor", "ann", "--wait", "0.3")
        assert run.code == 3, run.err
        assert run.out.startswith("queued: request ") and "did not answer" in run.out
        assert f"pid {server.process.pid}" in run.out
        server.process.send_signal(signal.SIGCONT)
        ran = server.dispatch()  # picked up before the dispatch answers
        assert ran["output"] == "sent to bob", ran
        again = walj_cli("resolve", log, eid, "--outcome", "succeeded", "--note", "seen",
                         "--actor", "ann", "--wait", "5")
        assert_one_line_error(again, 1, "refused by the live writer", "already resolved")
    finally:
        server.stop()


def test_bad_wait_values_are_usage_errors(tmp_path: Path) -> None:
    log = tmp_path / "session"
    eid = make_journal(log, blocked=True)
    assert eid is not None
    for wait in (["--wait", "-1"], ["--wait", "nan"], ["--wait", "soon"],
                 ["--wait", "1", "--no-wait"]):
        run = walj_cli("resolve", log, eid, "--outcome", "succeeded", "--note", "n",
                       "--actor", "ann", *wait)
        assert run.code == 2, (wait, run.out, run.err)
    assert not (log / "requests").exists()
