"""`walj demo`: an agent killed mid-tool, the journal failing closed, inspect, resolve, resume."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable

from ._common import EXIT_OK, EXIT_PROBLEMS, CliError
from ._demo_child import LOG_NAME, MARKER, OUTBOX_NAME, REFUND, emails, make_tools

CHILD_TIMEOUT = 30.0


def _say(text: str = "") -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _indented(run: Callable[[list[str]], int], argv: list[str]) -> int:
    """Run a walj command in this process (`run`: the CLI's main, passed in so this module
    need not import the one that imports it) and print its output indented."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = run(argv)
    for line in buffer.getvalue().splitlines():
        _say(("     " + line).rstrip())
    return code


def _prepare(target: str | None) -> str:
    if target is None:
        return tempfile.mkdtemp(prefix="walj-demo-")
    if os.path.exists(target) and not os.path.isdir(target):
        raise CliError(f"{target} is a file; the demo needs a directory")
    if os.path.exists(os.path.join(target, LOG_NAME)):
        raise CliError(f"{target} already holds a demo session; give a new directory")
    os.makedirs(target, exist_ok=True)
    return target


def _run_child(directory: str) -> None:
    """Start the agent, echo what it says, SIGKILL it once it says it is inside the handler."""
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ)
    env["PYTHONPATH"] = package_root + (os.pathsep + env["PYTHONPATH"]
                                        if env.get("PYTHONPATH") else "")
    child = subprocess.Popen(
        [sys.executable, "-m", "walj.cli._demo_child", directory],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    assert child.stdout is not None and child.stderr is not None
    _say(f"   (agent process {child.pid})")
    watchdog = threading.Timer(CHILD_TIMEOUT, child.kill)  # a hung child must not hang us
    watchdog.start()
    try:
        for line in child.stdout:
            if line.strip() == MARKER:
                os.kill(child.pid, signal.SIGKILL)  # inside the handler, after its side effect
                child.wait()
                break
            _say("   " + line.rstrip())
        else:
            child.wait()
            detail = child.stderr.read().strip().splitlines()
            raise CliError("the demo agent stopped before reaching its tool: "
                           + (detail[-1] if detail else "no output"), EXIT_PROBLEMS)
    finally:
        watchdog.cancel()
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
        child.stderr.close()
    _say(f"   SIGKILL  the process dies inside send_refund_email: {OUTBOX_NAME} holds "
         f"{emails(directory)} email, but no outcome was recorded")


def cmd_demo(args: argparse.Namespace, *, run: Callable[[list[str]], int]) -> int:
    from .. import ToolJournal

    directory = _prepare(args.dir)
    log = os.path.join(directory, LOG_NAME)
    _say("walj demo: an agent is killed in the middle of a tool call that has a side effect.")
    _say(f"directory: {directory}")
    _say(f"   {LOG_NAME + '/':<14}the agent's tool journal (a walj log)")
    _say(f"   {OUTBOX_NAME:<14}the emails its send_refund_email tool really sent")
    _say()
    _say("1. The agent runs two turns")
    _run_child(directory)
    _say()
    _say("2. The agent restarts; the journal fails closed")
    tools = make_tools(directory, hang=False)
    with ToolJournal.open(log, tools=tools) as journal:
        blockers = journal.recovery.blockers
        _say(f"   on open: blocked={journal.recovery.blocked}, {len(blockers)} blocker: "
             + ", ".join(f"{b.tool} ({b.state})" for b in blockers))
        with journal.turn() as turn:
            result = turn.dispatch("send_refund_email", REFUND)
        _say(f"   the model asks for send_refund_email again -> outcome {result.outcome!r}; "
             "the handler was not called")
        _say(f"   {OUTBOX_NAME} still holds {emails(directory)} email: no duplicate refund mail")
    eid = blockers[0].execution_id if blockers else None
    _say()
    _say(f"3. What an operator sees: walj inspect {log}")
    _indented(run, ["inspect", log])
    _say()
    _say(f"4. The operator checks {OUTBOX_NAME}, sees the email went out, and resolves it:")
    note = f"{OUTBOX_NAME} shows the email was sent"
    _say(f"   $ walj resolve {log} {eid} --outcome succeeded --note '{note}' "
         "--actor demo-operator")
    code = _indented(run, ["resolve", log, str(eid), "--outcome", "succeeded", "--note", note,
                      "--actor", "demo-operator"])
    if code != EXIT_OK:
        return code
    _say()
    _say("5. Dispatch resumes")
    with ToolJournal.open(log, tools=tools) as journal:
        with journal.turn() as turn:
            refund = dict(REFUND, subject="Your refund for order A-1043")
            result = turn.dispatch("send_refund_email", refund)
        _say(f"   turn {turn.sequence}  send_refund_email (order A-1043) -> outcome "
             f"{result.outcome!r}; blocked={journal.recovery.blocked}")
    _say(f"   {OUTBOX_NAME} holds {emails(directory)} emails: none was sent twice")
    _say()
    _say(f"Explore what is left in {directory}:")
    for command in ("timeline", "dump", "stats", "verify"):
        _say(f"   walj {command} {log}")
    _say(f"   walj sweep {directory}")
    return EXIT_OK
