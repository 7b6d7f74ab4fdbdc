"""Approvals from the command line: `walj approvals ROOT` lists what waits for a person across
sessions, and inspect, sweep, timeline and stats show it; a pending request never makes a
command exit 1."""

from __future__ import annotations

import time
from pathlib import Path

from cli_helpers import (
    flip_byte,
    make_journal,
    record_offset,
    walj_cli,
)

import walj

# A call id is whatever a model chose: OSC 52 (writes the clipboard), a bidi override.
HOSTILE = "c-\x1b]52;c;cm0gLXJmIH4=\x07\u202eevil"


def send(to: str) -> str:
    return f"sent to {to}"


def gated_journal(path: Path) -> tuple[str, str]:
    """A clean session in which call HOSTILE waits for approval and call "c-approved" was
    approved, to expire in an hour. Returns their approval ids."""
    with walj.ToolJournal.open(path, tools={"send": walj.Tool(send, approval=True)},
                               sync="never") as journal:
        with journal.turn() as turn:
            pending = turn.dispatch("send", {"to": "eve"}, call_id=HOSTILE)
            approved = turn.dispatch("send", {"to": "bob"}, call_id="c-approved")
        assert pending.outcome == approved.outcome == "awaiting_approval"
        assert pending.approval_id and approved.approval_id
        journal.approve(approved.approval_id, actor="ann", expires_at=time.time() + 3600)
    return pending.approval_id, approved.approval_id


def test_approvals_across_sessions_then_approve_runs_the_call_once(tmp_path: Path) -> None:
    root = tmp_path / "root"
    waiting = root / "user1"
    pending_id, approved_id = gated_journal(waiting)
    make_journal(root / "user2", blocked=True)  # blocked, no approvals: listed by neither
    damaged = root / "user3"
    make_journal(damaged)
    segment = next(damaged.glob("seg-*.jsonl"))
    flip_byte(segment, record_offset(segment, b"user1@example.com"))

    listed = walj_cli("approvals", root, "--json", "--jobs", "1")
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

    text = walj_cli("approvals", root, "--jobs", "1")
    assert "\x1b" not in text.out and "\u202e" not in text.out and "\\x1b" in text.out
    assert "AWAITING" in text.out and "APPROVED" in text.out and "Not listed" in text.out

    # Each view shows them, and a pending request makes none of them exit 1.
    for command in ("inspect", "timeline", "stats"):
        assert walj_cli(command, waiting).code == 0, command
    inspected = walj_cli("inspect", waiting, "--json").json()
    assert not inspected["blocked"]
    assert {a["approval_id"]: a["status"] for a in inspected["approvals"]} == {
        pending_id: "pending", approved_id: "approved"}
    swept = walj_cli("sweep", waiting, "--json").json()
    (session,) = swept["sessions"]
    assert session["status"] == "active" and len(session["approvals"]) == 2
    assert "1 approval request pending in 1 log" in walj_cli("sweep", waiting).out

    with walj.ToolJournal.open(waiting) as journal:
        journal.approve(pending_id, actor="bo", note="checked")

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

    timeline = walj_cli("timeline", waiting, "--json").json()
    statuses = {a["approval_id"]: a["status"] for t in timeline["turns"] for a in t["approvals"]}
    assert statuses == {pending_id: "consumed", approved_id: "approved"}
    stats = walj_cli("stats", waiting, "--json").json()["approvals"]
    assert stats == {"requested": 2, "approved": 2, "denied": 0, "consumed": 1, "pending": 0,
                     "approved_unused": 1}
