"""`walj inspect` says that a `started` call may be in flight only when the process that wrote
its started record is the one that holds the log now: never for a restarted process that the
call blocks, never in `walj demo`, never from a forged or garbled LOCK.owner."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import ENV, Run, walj_cli

from walj.cli import main

NOTE = "may be in flight"

AGENT = textwrap.dedent("""
    import sys, time, walj
    def slow():
        print("inside", flush=True)
        time.sleep(120)
    with walj.ToolJournal.open(sys.argv[1], tools={"slow": slow}) as journal:
        with journal.turn() as turn:
            turn.dispatch("slow", {})
""")

RESTARTED = textwrap.dedent("""
    import sys, walj
    journal = walj.ToolJournal.open(sys.argv[1], tools={})
    print("blocked" if journal.recovery.blocked else "clear", flush=True)
    sys.stdin.readline()
    journal.close()
""")


@contextmanager
def child(script: str, log: Path, first_line: str) -> Iterator[subprocess.Popen[str]]:
    """A Python child running `script` on `log`, once it has printed `first_line`."""
    proc = subprocess.Popen([sys.executable, "-c", script, str(log)], env=ENV,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == first_line
        yield proc
    finally:
        proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()


def killed_mid_tool(log: Path) -> str:
    """A journal whose agent was SIGKILLed inside its tool: the started record's writer id."""
    with child(AGENT, log, "inside") as agent:
        agent.send_signal(signal.SIGKILL)
        agent.wait()
    (blocker,) = inspect_json(log)["blockers"]
    assert blocker["state"] == "started" and blocker["in_flight"] is False
    writer_id: str = blocker["writer_id"]
    assert isinstance(writer_id, str) and len(writer_id) == 16
    return writer_id


def inspect_json(log: Path) -> Any:
    run = walj_cli("inspect", log, "--json")
    assert run.code == 1, run.err  # blocked
    return run.json()


def assert_no_note(run: Run) -> None:
    assert run.code == 1 and "Traceback" not in run.err, run.err
    assert NOTE not in run.out and "still holds" not in run.out and "still runs" not in run.out


def test_inspect_notes_a_call_in_flight_while_its_writer_holds_the_log(tmp_path: Path) -> None:
    log = tmp_path / "log"
    with child(AGENT, log, "inside") as agent:
        report = inspect_json(log)
        writer = report["writer"]
        assert writer["pid"] == agent.pid and writer["running"] is True
        if os.path.exists("/proc/locks"):
            assert writer["holds_lock"] is True
        (blocker,) = report["blockers"]
        assert blocker["in_flight"] is True and blocker["writer_id"] == writer["writer_id"]
        text = walj_cli("inspect", log)
        (note,) = [line for line in text.out.splitlines() if NOTE in line]
        assert blocker["execution_id"] in note and f"pid {agent.pid}" in note
        one = walj_cli("inspect", log, blocker["execution_id"])
        assert NOTE in one.out and f"pid {agent.pid}" in one.out
        one_json = walj_cli("inspect", log, blocker["execution_id"], "--json").json()
        assert one_json["blocker"]["in_flight"] is True
    # Killed: the same record is now an interrupted call.
    report = inspect_json(log)
    assert report["writer"]["running"] is False
    assert [b["in_flight"] for b in report["blockers"]] == [False]
    assert_no_note(walj_cli("inspect", log))


def test_inspect_notes_nothing_for_a_restarted_process_blocked_by_the_call(
        tmp_path: Path) -> None:
    """The restarted agent holds the lock and runs, but it did not start the call: the note
    (which once named any live lock holder) must not appear."""
    log = tmp_path / "log"
    started_by = killed_mid_tool(log)
    with child(RESTARTED, log, "blocked") as restarted:
        report = inspect_json(log)
        writer = report["writer"]
        assert writer["pid"] == restarted.pid and writer["running"] is True
        assert writer["writer_id"] != started_by
        if os.path.exists("/proc/locks"):
            assert writer["holds_lock"] is True
        assert [b["in_flight"] for b in report["blockers"]] == [False]
        assert_no_note(walj_cli("inspect", log))
        assert NOTE not in walj_cli("inspect", log, report["blockers"][0]["execution_id"]).out


def test_demo_output_has_no_in_flight_note(tmp_path: Path) -> None:
    run = walj_cli("demo", tmp_path / "demo")
    assert run.code == 0, run.err
    assert "3. What an operator sees" in run.out and "BLOCKED by 1 blocker" in run.out
    assert NOTE not in run.out and "still runs" not in run.out


@pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="no kernel table of locks")
def test_a_live_process_that_does_not_hold_the_lock_is_not_taken_for_the_writer(
        tmp_path: Path) -> None:
    """LOCK.owner names the writer id of the started record and a live process of this host
    (this test's), but that process holds no lock on LOCK: no note."""
    log = tmp_path / "log"
    started_by = killed_mid_tool(log)
    (log / "LOCK.owner").write_text(json.dumps({
        "pid": os.getpid(), "host": socket.gethostname(), "since": "2026-01-01T00:00:00Z",
        "writer": started_by}))
    report = inspect_json(log)
    assert report["writer"]["running"] is True and report["writer"]["holds_lock"] is False
    assert [b["in_flight"] for b in report["blockers"]] == [False]
    assert_no_note(walj_cli("inspect", log))


def _owner(pid: Any, writer: Any) -> bytes:
    return json.dumps({"pid": pid, "host": socket.gethostname(), "since": "x",
                       "writer": writer}).encode()


GARBLED_OWNERS = {
    "empty": b"",
    "not_utf8": b"\xff\xfe{",
    "a_list": b"[1, 2, 3]",
    "nested_deep": b"[" * 60_000 + b"]" * 60_000,
    "pid_zero": _owner(0, "WRITER"),  # kill(0, 0) would answer for this process's group
    "pid_minus_one": _owner(-1, "WRITER"),  # kill(-1, 0): for every process
    "pid_text": _owner("1", "WRITER").replace(b'"1"', b'"one"'),
    "pid_infinite": _owner(1, "WRITER").replace(b'"pid": 1', b'"pid": 1e999'),
    "pid_huge": _owner(10**30, "WRITER"),
    "writer_a_number": _owner(1, 5),
    "writer_too_long": _owner(1, "a" * 100_000),
}


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    log = tmp_path_factory.mktemp("interrupted") / "log"
    return log, killed_mid_tool(log)


@pytest.mark.parametrize("name", sorted(GARBLED_OWNERS))
def test_a_garbled_lock_owner_neither_crashes_inspect_nor_makes_a_note(
        tmp_path: Path, interrupted: tuple[Path, str], name: str) -> None:
    original, started_by = interrupted
    log = tmp_path / "log"
    shutil.copytree(original, log)
    (log / "LOCK.owner").write_bytes(GARBLED_OWNERS[name].replace(b"WRITER",
                                                                  started_by.encode()))
    run = in_process("inspect", log, "--json")  # an exception escaping main fails the test
    assert run.code == 1, run.err
    report = run.json()
    assert [b["in_flight"] for b in report["blockers"]] == [False]
    writer = report["writer"]
    assert writer is None or writer["writer_id"] is None or writer["running"] is False
    assert_no_note(in_process("inspect", log))


def in_process(*args: str | Path) -> Run:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
    return Run(code, out.getvalue(), err.getvalue())
