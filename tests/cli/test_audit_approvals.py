"""`walj audit` with real approval records: a request, its decision (approved or denied) and
the execution that consumed the approval, each a row naming the approval; an export made while
a request was pending still verifies once the decision and the run are appended."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import walj
from walj.cli import main


def run(capsys: pytest.CaptureFixture[str], *args: Any) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def rows_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()[:-1]]


def send(to: str) -> str:
    return f"sent to {to}"


def test_approval_requests_decisions_and_consumption_are_rows(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    session = tmp_path / "root" / "s"
    tools = {"send": walj.Tool(send, approval=True)}
    with walj.ToolJournal.open(session, tools=tools, sync="never") as journal:
        with journal.turn() as turn:
            asked = turn.dispatch("send", {"to": "ann@example.com"}, call_id="c1")
        assert asked.outcome == "awaiting_approval" and asked.approval_id is not None
        pending = tmp_path / "pending.jsonl"
        assert run(capsys, "audit", tmp_path / "root", "-o", pending)[0] == 0
        journal.approve(asked.approval_id, actor="ops-ann", note="checked the recipient")
        with journal.turn() as turn:
            done = turn.dispatch("send", {"to": "ann@example.com"}, call_id="c1")
            other = turn.dispatch("send", {"to": "bob@example.com"}, call_id="c2")
        assert done.outcome == "ok" and other.approval_id is not None
        journal.deny(other.approval_id, actor="ops-bob", note="not this one")
    assert [r["row"] for r in rows_of(pending)] == ["approval_request"]
    assert run(capsys, "audit", "--verify", pending, tmp_path / "root")[0] == 0

    export = tmp_path / "audit.jsonl"
    assert run(capsys, "audit", tmp_path / "root", "-o", export)[0] == 0
    rows = rows_of(export)
    assert [(r["row"], r["call_id"], r["approval_id"]) for r in rows] == [
        ("approval_request", "c1", asked.approval_id),
        ("approval_decision", "c1", asked.approval_id),
        ("execution", "c1", asked.approval_id),
        ("approval_request", "c2", other.approval_id),
        ("approval_decision", "c2", other.approval_id)]
    request, approved, execution, _, denied = rows
    assert approved["outcome"] == "approved" and approved["actor"] == "ops-ann"
    assert approved["note"] == "checked the recipient" and approved["tool"] == "send"
    assert approved["arguments_sha256"] == request["arguments_sha256"] == execution[
        "arguments_sha256"]
    assert request["idempotency_key"] == execution["idempotency_key"]
    assert request["writer"] == execution["writer"] is not None
    assert execution["outcome"] == "ok" and execution["seq"] > approved["seq"]
    assert denied["outcome"] == "denied" and denied["actor"] == "ops-bob"
    assert run(capsys, "audit", "--verify", export, tmp_path / "root")[0] == 0
