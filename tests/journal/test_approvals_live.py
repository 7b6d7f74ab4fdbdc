"""Approval decisions from outside the process that holds a session: approve_session and
deny_session decide directly when no one holds it, and otherwise leave a request that the live
writer answers exactly once, durably, with the request id in its record."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from journal_helpers import Recorder, records

import walj
from walj.journal import known_ids
from walj.journal import records as rc
from walj.journal._requests import request_fields
from walj.log import post_request

ROOT = str(Path(__file__).resolve().parents[2])
ENV = {**os.environ, "PYTHONPATH": ROOT}

# Another process decides three times while this one holds the journal: the approval, a
# denial of the now approved request, and an approval of an id the journal never made.
ASKER = textwrap.dedent("""
    import json, sys, walj
    path, approval_id = sys.argv[1], sys.argv[2]
    done = [walj.approve_session(path, approval_id, actor="ann@ops", note="ok", wait=20),
            walj.deny_session(path, approval_id, actor="bob@ops", wait=20),
            walj.approve_session(path, "apv-" + "0" * 32, actor="ann@ops", wait=20)]
    print(json.dumps([[d.status, d.reason, d.request_id,
                       d.approval.status if d.approval else None] for d in done]))
""")


def _send(journal: walj.ToolJournal, call_id: str = "c1") -> walj.ToolResult:
    with journal.turn() as turn:
        return turn.dispatch("send", {"to": "ann"}, call_id=call_id)


def test_a_decision_left_by_another_process_while_the_journal_is_open_is_applied_once(
        tmp_path: Path) -> None:
    path = tmp_path / "j"
    send = Recorder()
    with walj.ToolJournal.open(path, tools={"send": walj.Tool(send, approval=True)}) as journal:
        approval_id = _send(journal).approval_id
        assert approval_id is not None
        asker = subprocess.Popen([sys.executable, "-c", ASKER, str(path), approval_id],
                                 env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True)
        deadline = time.monotonic() + 120
        while asker.poll() is None and time.monotonic() < deadline:
            journal.is_blocked()  # this process's own answers pick requests up first
            time.sleep(0.02)
        out, err = asker.communicate(timeout=5)
        assert asker.returncode == 0, err
        (approved, denied, unknown) = json.loads(out)
        assert approved[:2] == ["applied", None] and approved[3] == "approved"
        assert denied[:2] == ["refused", "not_pending"]
        assert unknown[:2] == ["refused", "unknown"]
        assert journal.approval(approval_id).status == "approved"
        ran = _send(journal)
        assert (ran.outcome, ran.approval_id) == ("ok", approval_id)
    data = records(path)
    (decided,) = [r for r in data if r["kind"] == rc.APPROVAL_DECIDED]
    assert (decided["request"], decided["actor"], decided["note"]) == (approved[2], "ann@ops",
                                                                       "ok")
    refused = [r for r in data if r["kind"] == rc.REQUEST_REFUSED]
    assert [(r["request"], r["reason"]) for r in refused] == [
        (denied[2], "not_pending"), (unknown[2], "unknown")]
    assert send.calls == [{"to": "ann"}]
    assert list((path / "requests").iterdir()) == []


def test_a_dispatch_applies_a_decision_request_and_a_file_found_again_decides_nothing_twice(
        tmp_path: Path) -> None:
    path = tmp_path / "j"
    with walj.ToolJournal.open(path, tools={"send": walj.Tool(Recorder(), approval=True)}) as j:
        approval_id = _send(j).approval_id
        request_id = post_request(path, request_fields("approve", approval_id, None, None,
                                                       "ann@ops", time.time(),
                                                       expires_at=time.time() + 3600))
        (kept,) = (path / "requests").iterdir()
        content = kept.read_bytes()
        ran = _send(j)  # the dispatch picks the decision up before it decides
        assert (ran.outcome, ran.approval_id) == ("ok", approval_id)
        assert j.approval(approval_id).expires_at is not None
        kept.write_bytes(content)  # as if a crash came between the answer and the unlink
        os.utime(path / "requests", (time.time() + 5, time.time() + 5))
        assert j.approval(approval_id).status == "consumed"
    answers = [r for r in records(path) if r.get("request") == request_id]
    assert [r["kind"] for r in answers] == [rc.APPROVAL_DECIDED]
    assert not [p for p in (path / "requests").iterdir() if p.suffix == ".req"]


def test_approve_and_deny_session_decide_directly_when_no_one_holds_the_session(
        tmp_path: Path) -> None:
    path = tmp_path / "j"
    with walj.ToolJournal.open(path, tools={"send": walj.Tool(Recorder(), approval=True)}) as j:
        first, second = _send(j, "c1").approval_id, _send(j, "c2").approval_id
    assert first is not None and second is not None
    done = walj.approve_session(path, first, actor="ann@ops", expires_at=time.time() + 60)
    assert (done.status, done.request_id) == ("applied", None)
    assert done.approval is not None and done.approval.status == "approved"
    assert done.recovery is not None and [a.approval_id for a in done.recovery.approved] == [
        first]
    no = walj.deny_session(path, second, actor="bob@ops", note="too much")
    assert no.approval is not None and (no.approval.status, no.approval.note) == (
        "denied", "too much")
    again = walj.deny_session(path, first, actor="bob@ops")
    assert (again.status, again.reason) == ("refused", "not_pending")
    assert {first, second} <= known_ids(path)  # what an id prefix is expanded against
    assert not (path / "requests").exists()


@pytest.mark.parametrize("options, reason", [
    ({"actor": "policy"}, "bad_actor"), ({"actor": "a", "expires_at": 1.0}, "bad_expiry"),
    ({"actor": "a", "note": b"x"}, "note_required")])
def test_approve_session_checks_before_it_asks(tmp_path: Path, options: dict[str, Any],
                                               reason: str) -> None:
    path = tmp_path / "j"
    with walj.ToolJournal.open(path, tools={"send": walj.Tool(Recorder(), approval=True)}) as j:
        approval_id = _send(j).approval_id
    with pytest.raises(walj.ApprovalError) as refused:
        walj.approve_session(path, approval_id, **options)
    assert refused.value.reason == reason
    assert not (path / "requests").exists()
    assert rc.APPROVAL_DECIDED not in [r["kind"] for r in records(path)]
