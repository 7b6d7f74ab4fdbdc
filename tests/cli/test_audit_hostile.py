"""`walj audit` on hostile records: every field is untrusted. JSON Lines keeps each string as
data (control characters as escapes, never raw bytes), a field of the wrong type or an
implausible time is null, a huge string is cut; CSV neutralises every cell a spreadsheet would
take for a formula and escapes control characters; both verify; a session's name with an
escape sequence reaches the terminal escaped."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

import walj
from walj.cli import main

ESCAPES = "\x1b]52;c;ZXZpbA==\x07 \x1b[2J \x9b2J \x7f \u202eexe.txt \u2066x\u2069 \x00"
RAW_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
FORMULAS = ("=", "+", "-", "@", "\t", "\r")
HOSTILE_RECORDS: list[dict[str, Any]] = [
    {"kind": "turn_started", "version": 7, "turn_sequence": 1, "at": 1796193983.0},
    {"kind": "tool_execution_started", "version": 7, "execution_id": "e1", "at": 1796193983.5,
     "turn_sequence": 1, "tool": '=HYPERLINK("http://x.example","y")', "call_id": "@SUM(1+1)",
     "arguments_sha256": ["not", "a", "digest"], "idempotency_key": "+1-2",
     "arguments_preview": ESCAPES + "x" * 5000, "writer": 5, "approval_id": {"a": 1}},
    {"kind": "tool_execution_ambiguous", "version": 7, "execution_id": "e1", "at": 1e300,
     "error_type": "-cmd|' /C calc'!A0", "error": "boom"},
    {"kind": "tool_execution_resolved", "version": 7, "execution_id": "e1", "at": "yesterday",
     "outcome": "succeeded", "actor": "\x1b[2J=evil", "note": "line1\nline2\r\n=1+1"},
    {"kind": "turn_resolved", "version": 7, "turn_sequence": 2**64, "at": -5, "actor": None,
     "note": 12},
    {"kind": "tool_approval_requested", "version": 7, "at": 1796193984.0,
     "approval_id": "-apv", "turn_sequence": 1, "tool": "@tool", "call_id": "c1",
     "arguments_sha256": "ab", "arguments_preview": "\u202e", "idempotency_key": "k",
     "requested_by": "\u2066w"},
    {"kind": "tool_approval_decided", "version": 7, "at": 1796193985.0, "approval_id": "-apv",
     "decision": "approved", "actor": "@x", "note": "\t=1", "expires_at": 2**70},
]


def run(capsys: pytest.CaptureFixture[str], *args: Any) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def hostile_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hostile") / "root"
    with walj.Log.open(root / "=cmd", sync="never") as log:
        for record in HOSTILE_RECORDS:
            log.append(record)
    return root


def test_jsonl_keeps_hostile_values_as_data(hostile_root: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    export = tmp_path / "audit.jsonl"
    code, out, err = run(capsys, "audit", hostile_root, "-o", export)
    assert code == 0, err
    text = export.read_text(encoding="utf-8")
    assert RAW_UNSAFE.search(text) is None and RAW_UNSAFE.search(out) is None
    rows = [json.loads(line) for line in text.splitlines()[:-1]]
    assert [r["row"] for r in rows] == ["execution", "resolution", "resolution",
                                        "approval_request", "approval_decision"]
    execution, resolution, turn, request, decision = rows
    assert execution["tool"] == HOSTILE_RECORDS[1]["tool"] and execution["call_id"] == "@SUM(1+1)"
    assert execution["arguments_preview"] == (ESCAPES + "x" * 5000)[:4096] + "…[cut]"
    assert execution["arguments_sha256"] is None and execution["writer"] is None
    assert execution["approval_id"] is None and execution["error_type"] == "-cmd|' /C calc'!A0"
    assert execution["outcome"] == "resolved succeeded" and execution["end_seq"] == 4
    assert execution["end_at"] is None and execution["end_time"] is None  # "yesterday"
    assert execution["actor"] == resolution["actor"] == "\x1b[2J=evil"
    assert resolution["note"] == "line1\nline2\r\n=1+1" and resolution["at"] is None
    assert turn["turn_sequence"] is None and turn["at"] is None and turn["note"] is None
    assert request["arguments_preview"] == "\u202e" and request["writer"] == "\u2066w"
    assert decision["tool"] == "@tool" and decision["call_id"] == "c1"
    assert decision["expires_at"] is None and decision["note"] == "\t=1"
    assert {r["session"] for r in rows} == {"=cmd"}
    verify = run(capsys, "audit", "--verify", export, hostile_root)
    assert verify[0] == 0, verify


def test_csv_neutralises_formulas_and_escapes_controls(hostile_root: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    export = tmp_path / "audit.csv"
    code, _, err = run(capsys, "audit", hostile_root, "-o", export, "--format", "csv")
    assert code == 0, err
    data = export.read_bytes()
    text = data.decode("utf-8-sig")
    assert RAW_UNSAFE.search(text.replace("\r\n", "")) is None
    assert text.count("\r\n") == 6 and "\n" not in text.replace("\r\n", "")  # a line per row
    table = list(csv.reader(io.StringIO(text)))
    header, rows = table[0], table[1:]
    assert header[:3] == ["row", "kind", "session"] and len(rows) == 5
    cells = [cell for row in rows for cell in row]
    assert not [c for c in cells if c.startswith(FORMULAS)]
    execution = dict(zip(header, rows[0], strict=True))
    assert execution["tool"] == "'" + HOSTILE_RECORDS[1]["tool"]
    assert execution["session"] == "'=cmd" and execution["idempotency_key"] == "'+1-2"
    assert execution["actor"] == "\\x1b[2J=evil"
    assert dict(zip(header, rows[1], strict=True))["note"] == "line1\\x0aline2\\x0d\\x0a=1+1"
    assert dict(zip(header, rows[4], strict=True))["note"] == "\\x09=1"  # escaped first
    verify = run(capsys, "audit", "--verify", export, hostile_root)
    assert verify[0] == 0, verify
    # A session that appears since, named with escape sequences: shown escaped, one line.
    with walj.Log.open(hostile_root / "\x1b]0;owned\x07", sync="never") as log:
        log.append(HOSTILE_RECORDS[0])
    code, out, _ = run(capsys, "audit", "--verify", export, hostile_root)
    assert code == 1 and RAW_UNSAFE.search(out) is None
    assert "session_added: session \\x1b]0;owned\\x07: among the logs given" in out
