"""Approvals from the command line: `walj approvals ROOT` lists what waits for a person across
sessions, `walj approve` / `walj deny` decide it on the record (directly, or through a live
server that holds the session), and inspect, sweep, timeline and stats show it; a pending
request never makes a command exit 1."""

from __future__ import annotations

import contextlib
import io
import textwrap
import time
from pathlib import Path
from typing import Any

from cli_helpers import (
    LineServer,
    Run,
    assert_one_line_error,
    flip_byte,
    make_journal,
    record_offset,
    walj_cli,
)

import walj
from walj.cli import main

# A call id is whatever a model chose: OSC 52 (writes the clipboard), a bidi override.
HOSTILE = "c-\x1b]52;c;cm0gLXJmIH4=\x07\u202eevil"


def send(to: str) -> str:
    return f"sent to {to}"


def cli(*args: str | Path) -> Run:
    """`walj ARGS` in this process (faster than a child; an exception that escapes `main`
    fails the test)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
    return Run(code, out.getvalue(), err.getvalue())


def gated_journal(path: Path) -> tuple[str, str, str]:
    """A clean session in which call HOSTILE waits for approval, call "c-approved" was
    approved, to expire in an hour, and call "c-expired" was approved for 20 ms, now past.
    Returns their approval ids."""
    with walj.ToolJournal.open(path, tools={"send": walj.Tool(send, approval=True)},
                               sync="never") as journal:
        with journal.turn() as turn:
            pending = turn.dispatch("send", {"to": "eve"}, call_id=HOSTILE)
            approved = turn.dispatch("send", {"to": "bob"}, call_id="c-approved")
            lapsed = turn.dispatch("send", {"to": "bob"}, call_id="c-expired")
        assert pending.approval_id and approved.approval_id and lapsed.approval_id
        journal.approve(approved.approval_id, actor="ann", expires_at=time.time() + 3600)
        lapses = time.time() + 0.02
        journal.approve(lapsed.approval_id, actor="ann", expires_at=lapses)
    time.sleep(max(0.0, lapses - time.time()))  # expired, unused, from here on
    return pending.approval_id, approved.approval_id, lapsed.approval_id


def test_approvals_across_sessions_then_approve_runs_the_call_once(tmp_path: Path) -> None:
    root = tmp_path / "root"
    waiting = root / "user1"
    pending_id, approved_id, expired_id = gated_journal(waiting)
    make_journal(root / "user2", blocked=True)  # blocked, no approvals: listed by neither
    damaged = root / "user3"
    make_journal(damaged)
    segment = next(damaged.glob("seg-*.jsonl"))
    flip_byte(segment, record_offset(segment, b"user1@example.com"))

    listed = cli("approvals", root, "--json", "--jobs", "1")
    assert listed.code == 1, listed.err  # user3's approvals cannot all be read: not listed
    report = listed.json()
    assert report["schema"] == "walj.approvals/1" and report["logs"] == 3
    assert (report["pending"], report["approved"]) == (1, 1)
    by_id = {a["approval_id"]: a for a in report["approvals"]}
    assert by_id[pending_id]["status"] == "pending"
    assert by_id[pending_id]["path"] == str(waiting) and by_id[pending_id]["call_id"] == HOSTILE
    assert by_id[approved_id]["status"] == "approved" and by_id[approved_id]["actor"] == "ann"
    assert by_id[approved_id]["expires_at"] > time.time() + 3000
    assert [u["path"] for u in report["unlisted"]] == [str(damaged)]
    every = cli("approvals", root, "--json", "--jobs", "1", "--all").json()["approvals"]
    assert {a["approval_id"]: a["status"] for a in every} == {
        pending_id: "pending", approved_id: "approved", expired_id: "expired"}

    text = cli("approvals", root, "--jobs", "1")
    assert "\x1b" not in text.out and "\u202e" not in text.out and "\\x1b" in text.out
    assert "AWAITING" in text.out and "APPROVED" in text.out and "Not listed" in text.out

    # Each view shows them, escaped, and a pending request makes none of them exit 1.
    for command in ("inspect", "timeline", "stats"):
        shown = cli(command, waiting)
        assert shown.code == 0 and "\x1b" not in shown.out and "\u202e" not in shown.out, command
    assert "\\x1b]52" in cli("inspect", waiting).out and "AWAITING-APPROVAL" in cli(
        "timeline", waiting).out
    inspected = cli("inspect", waiting, "--json").json()
    assert not inspected["blocked"]
    assert {a["approval_id"]: a["status"] for a in inspected["approvals"]} == {
        pending_id: "pending", approved_id: "approved", expired_id: "expired"}
    swept = cli("sweep", waiting, "--json", "--jobs", "1").json()
    (session,) = swept["sessions"]
    assert session["status"] == "active" and len(session["approvals"]) == 3
    assert "1 approval request pending in 1 log" in cli("sweep", waiting, "--jobs", "1").out

    # Decide the pending one (a unique prefix of its id will do, without `apv-` too); deciding
    # it again, or an unknown id, is refused.
    approve = cli("approve", waiting, pending_id[4:14], "--actor", "bo", "--note", "checked",
                       "--expires-in", "1h", "--json")
    assert approve.code == 0, approve.err
    decided = approve.json()
    assert decided["status"] == "applied" and decided["request_id"] is None
    assert decided["approval"]["status"] == "approved" and decided["approval"]["actor"] == "bo"
    assert_one_line_error(cli("approve", waiting, pending_id, "--actor", "bo"), 1,
                          "refused")
    assert_one_line_error(cli("deny", waiting, "apv-" + "0" * 32, "--actor", "bo"), 2)
    assert_one_line_error(cli("approve", waiting, approved_id, "--actor", "bo",
                                   "--expires-at", "2001-01-01T00:00:00Z"), 2, "future")

    # The approved call runs exactly once, with exactly its arguments.
    ran: list[str] = []

    def spy(to: str) -> str:
        ran.append(to)
        return to

    with walj.ToolJournal.open(waiting, tools={"send": walj.Tool(spy, approval=True)},
                               store_outputs=True) as journal:
        with journal.turn() as turn:
            other = turn.dispatch("send", {"to": "mallory"}, call_id=HOSTILE)
            first = turn.dispatch("send", {"to": "eve"}, call_id=HOSTILE)
            again = turn.dispatch("send", {"to": "eve"}, call_id=HOSTILE)
    assert other.outcome == "refused" and first.outcome == "ok" and again.replayed
    assert ran == ["eve"] and first.approval_id == pending_id

    timeline = cli("timeline", waiting, "--json").json()
    statuses = {a["approval_id"]: a["status"] for t in timeline["turns"] for a in t["approvals"]}
    assert statuses == {pending_id: "consumed", approved_id: "approved", expired_id: "expired"}
    stats = cli("stats", waiting, "--json").json()["approvals"]
    assert stats == {"requested": 3, "approved": 3, "denied": 0, "consumed": 1, "pending": 0,
                     "approved_unused": 2}


SERVER = textwrap.dedent("""
    import json, sys, walj

    ran = []

    def send(to):
        ran.append(to)
        return f"sent to {to}"

    journal = walj.ToolJournal.open(sys.argv[1], tools={"send": walj.Tool(send, approval=True)},
                                    store_outputs=True)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        call_id = line.strip()
        with journal.turn() as turn:
            result = turn.dispatch("send", {"to": "bob"}, call_id=call_id)
        print(json.dumps({"outcome": result.outcome, "approval_id": result.approval_id,
                          "ran": len(ran)}), flush=True)
""")


class Server(LineServer):
    """A child process that holds the journal open and dispatches the call id of each line."""

    def __init__(self, path: Path) -> None:
        super().__init__(SERVER, path)

    def dispatch(self, call_id: str) -> dict[str, Any]:
        return self.ask(call_id)


def test_a_live_server_is_approved_and_denied_from_the_cli(tmp_path: Path) -> None:
    log = tmp_path / "session"
    make_journal(log, turns=1)
    server = Server(log)
    try:
        asked = server.dispatch("c1")
        refused = server.dispatch("c2")
        assert asked["outcome"] == refused["outcome"] == "awaiting_approval"
        listed = walj_cli("approvals", tmp_path, "--json").json()  # no lock, beside the writer
        assert {a["call_id"] for a in listed["approvals"]} == {"c1", "c2"}

        deny = walj_cli("deny", log, refused["approval_id"][:12], "--actor", "ann", "--note",
                        "no")
        assert deny.code == 0, deny.err
        assert "applied by the live writer" in deny.out and "nothing runs" in deny.out
        assert server.dispatch("c2") == {"outcome": "denied", "approval_id":
                                         refused["approval_id"], "ran": 0}

        queued = walj_cli("approve", log, asked["approval_id"], "--actor", "ann", "--no-wait",
                          "--json")
        assert queued.code == 3, queued.err
        assert queued.json()["status"] == "queued" and queued.json()["approval"] is None
        # The server's next dispatch applies the request first, then runs the call on it.
        ran = server.dispatch("c1")
        assert ran == {"outcome": "ok", "approval_id": asked["approval_id"], "ran": 1}
        assert server.dispatch("c1")["ran"] == 1  # answered by replay: never twice
    finally:
        server.stop()
