"""The read commands through a subprocess: exit codes, the --json schemas, the table views, and
one-line errors for bad input."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import (
    ENV,
    assert_one_line_error,
    flip_byte,
    make_journal,
    make_plain_log,
    record_offset,
    walj_cli,
)
from helpers import segments

import walj

PROBLEM_KEYS = {"file", "offset", "seq", "kind", "detail"}
BLOCKER_KEYS = {"execution_id", "tool", "call_id", "state", "turn_sequence", "arguments_sha256",
                "arguments_preview", "idempotency_key", "started_at", "age_seconds", "seq",
                "error_type", "reconcile_error", "arguments", "quarantine_file", "writer_id",
                "in_flight"}


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("cli")
    clean, blocked, turn = root / "clean", root / "blocked", root / "turn"
    make_journal(clean)
    eid = make_journal(blocked, blocked=True)
    make_journal(turn, interrupted_turn=True, turns=1)
    plain = root / "plain"
    make_plain_log(plain, 300, segment_bytes=4096)
    return {"root": root, "clean": clean, "blocked": blocked, "eid": eid, "turn": turn,
            "plain": plain}


# --- verify ---------------------------------------------------------------------------------


def test_verify_clean_log(logs: dict[str, Any]) -> None:
    run = walj_cli("verify", logs["plain"], "--json")
    assert run.code == 0, run.err
    report = run.json()
    assert set(report) == {"schema", "path", "ok", "log_id", "format_version", "records",
                           "last_seq", "segments", "bytes", "torn_tail", "problems",
                           "quarantine", "base", "leftovers"}
    assert report["schema"] == "walj.verify/2"
    assert report["base"] is None and report["leftovers"] == []
    assert report["ok"] is True and report["problems"] == []
    assert report["records"] == report["last_seq"] == 300
    assert len(report["segments"]) == len(segments(logs["plain"])) > 1
    assert report["torn_tail"] is None and report["format_version"] == 1
    text = walj_cli("verify", logs["plain"])
    assert text.code == 0 and ": ok" in text.out.splitlines()[0]


def test_verify_finds_a_flipped_byte_in_a_sealed_segment(tmp_path: Path) -> None:
    log = tmp_path / "log"
    make_plain_log(log, 300, segment_bytes=4096)
    first = segments(log)[0]
    flip_byte(first, record_offset(first, b'"text":"record 5"'))
    run = walj_cli("verify", log, "--json")
    assert run.code == 1
    report = run.json()
    assert report["ok"] is False
    assert report["problems"] and set(report["problems"][0]) == PROBLEM_KEYS
    assert report["problems"][0]["file"] == first.name
    assert "bad_checksum" in {p["kind"] for p in report["problems"]}
    text = walj_cli("verify", log)
    assert text.code == 1 and "PROBLEMS FOUND" in text.out and "bad_checksum" in text.out


def test_verify_torn_tail_is_reported_and_strict_counts_it(tmp_path: Path) -> None:
    log = tmp_path / "log"
    make_plain_log(log, 20)
    with open(segments(log)[-1], "ab") as f:
        f.write(b'{"xxh64":"0123456789abcdef","seq":21,"da')
    run = walj_cli("verify", log, "--json")
    assert run.code == 0
    torn = run.json()["torn_tail"]
    assert torn is not None and set(torn) == {"file", "offset", "length", "kind"}
    assert torn["kind"] == "incomplete_line"
    strict = walj_cli("verify", log, "--strict", "--json")
    assert strict.code == 1 and strict.json()["ok"] is False


# --- bad input ------------------------------------------------------------------------------


def test_missing_path_file_segment_and_not_a_log(tmp_path: Path, logs: dict[str, Any]) -> None:
    for command in ("verify", "inspect", "dump", "timeline", "stats", "tail"):
        assert_one_line_error(walj_cli(command, tmp_path / "nope"), 2, "no such file")
    a_file = tmp_path / "notes.txt"
    a_file.write_text("hello")
    assert_one_line_error(walj_cli("inspect", a_file), 2, "is a file")
    seg = segments(logs["clean"])[0]
    assert_one_line_error(walj_cli("verify", seg), 2, "segment file", str(seg.parent))
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_one_line_error(walj_cli("dump", empty), 2, "not a walj log")
    assert_one_line_error(walj_cli("verify", logs["root"]), 2, "not a walj log", "walj sweep")
    assert_one_line_error(walj_cli("sweep", a_file), 2, "is a file")
    assert_one_line_error(walj_cli("sweep", empty), 2, "holds no walj log")


def test_usage_errors_exit_2(logs: dict[str, Any]) -> None:
    assert_one_line_error(walj_cli("verify"), 2, "PATH")
    assert_one_line_error(walj_cli("frobnicate"), 2, "invalid choice")
    assert_one_line_error(walj_cli("dump", logs["clean"], "--from-seq", "x"), 2)
    assert_one_line_error(walj_cli("dump", logs["clean"], "--from-seq", "5", "--to-seq", "2"), 2)
    assert walj_cli().code == 2
    assert walj_cli("--help").code == 0
    version = walj_cli("--version")
    assert version.code == 0 and "checksums:" in version.out


PATCHED = """
import os, sys
real = os.{name}
def denied(path, *args, **kwargs):
    if str(path) == os.environ["DENIED"]:
        raise PermissionError(13, "Permission denied", str(path))
    return real(path, *args, **kwargs)
os.{name} = denied
from walj.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("call", ["listdir", "open"])
def test_permission_denied_is_one_line(logs: dict[str, Any], call: str) -> None:
    """As root, chmod cannot deny a read, so the child's os call fails as it would for a user:
    listing the log directory, or opening its segment."""
    log = logs["clean"]
    denied = log if call == "listdir" else segments(log)[0]
    for command in ("verify", "inspect", "dump", "stats", "timeline"):
        proc = subprocess.run([sys.executable, "-c", PATCHED.format(name=call), command,
                               str(log)], env={**ENV, "DENIED": str(denied)},
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, (proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr
        assert proc.stderr.count("\n") == 1, proc.stderr
        assert f"{denied}: permission denied" in proc.stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads through chmod 000; covered above")
def test_permission_denied_for_real(tmp_path: Path) -> None:  # pragma: no cover - non-root
    log = tmp_path / "log"
    make_plain_log(log, 3)
    log.chmod(0)
    try:
        assert_one_line_error(walj_cli("verify", log), 2, "permission denied")
    finally:
        log.chmod(0o700)


# --- inspect --------------------------------------------------------------------------------


def test_inspect_clean_journal(logs: dict[str, Any]) -> None:
    run = walj_cli("inspect", logs["clean"], "--json")
    assert run.code == 0, run.err
    report = run.json()
    assert report["schema"] == "walj.inspect/3"
    assert set(report) >= {"path", "log_id", "now", "log_started_at", "records", "last_seq",
                           "log_ok", "problems", "torn_tail", "writer", "blocked", "blockers",
                           "incomplete_turns", "pending_llm_calls", "resolutions"}
    assert report["blocked"] is False and report["blockers"] == []
    assert report["log_ok"] is True and report["records"] > 0
    assert report["log_started_at"] <= report["now"]
    text = walj_cli("inspect", logs["clean"])
    assert text.code == 0 and "not blocked" in text.out


def test_inspect_blocked_journal_shows_the_blocker(logs: dict[str, Any]) -> None:
    run = walj_cli("inspect", logs["blocked"], "--json")
    assert run.code == 1
    report = run.json()
    assert report["blocked"] is True
    (blocker,) = report["blockers"]
    assert set(blocker) == BLOCKER_KEYS
    assert blocker["execution_id"] == logs["eid"]
    assert blocker["tool"] == "send" and blocker["state"] == "ambiguous"
    assert blocker["error_type"] == "KeyboardInterrupt"
    assert len(blocker["arguments_sha256"]) == 64 and blocker["age_seconds"] >= 0
    assert "s3cret" not in blocker["arguments_preview"]  # redacted in the preview
    assert [t["turn_sequence"] for t in report["incomplete_turns"]] == [3]
    text = walj_cli("inspect", logs["blocked"])
    assert text.code == 1
    assert "BLOCKED by 1 blocker" in text.out and logs["eid"] in text.out
    assert "fingerprint  sha256:" in text.out and "walj resolve" in text.out


def test_inspect_interrupted_turn(logs: dict[str, Any]) -> None:
    report = walj_cli("inspect", logs["turn"], "--json").json()
    assert report["blocked"] is True
    (blocker,) = report["blockers"]
    assert blocker["state"] == "interrupted_turn" and blocker["execution_id"] is None
    assert blocker["turn_sequence"] == 2


def test_inspect_one_execution_and_unknown_ids(logs: dict[str, Any]) -> None:
    eid = logs["eid"]
    run = walj_cli("inspect", logs["blocked"], eid[:10], "--json")
    assert run.code == 1
    report = run.json()
    assert report["schema"] == "walj.execution/5" and report["execution_id"] == eid
    assert [r["data"]["kind"] for r in report["records"]] == [
        "tool_execution_started", "tool_execution_ambiguous"]
    assert report["blocker"]["state"] == "ambiguous"
    assert_one_line_error(walj_cli("inspect", logs["blocked"], "f" * 32), 2,
                          "unknown execution id")
    assert_one_line_error(walj_cli("inspect", logs["blocked"], "abc"), 2, "6 characters")


def test_inspect_refuses_a_plain_log(logs: dict[str, Any]) -> None:
    assert_one_line_error(walj_cli("inspect", logs["plain"]), 2, "not a tool journal")
    assert_one_line_error(walj_cli("timeline", logs["plain"]), 2, "not a tool journal")


# --- dump and tail --------------------------------------------------------------------------


def test_dump_json_lines_and_filters(logs: dict[str, Any]) -> None:
    run = walj_cli("dump", logs["plain"], "--json")
    assert run.code == 0, run.err
    rows = run.lines()
    assert [r["seq"] for r in rows] == list(range(1, 301))
    assert all(set(r) == {"seq", "data"} for r in rows)
    assert rows[41]["data"] == {"i": 41, "text": "record 41", "pad": "x" * 41}
    part = walj_cli("dump", logs["plain"], "--from-seq", "100", "--to-seq", "120", "--json")
    assert [r["seq"] for r in part.lines()] == list(range(100, 121))
    kinds = walj_cli("dump", logs["clean"], "--kind", "turn_started", "--kind",
                     "turn_completed", "--json").lines()
    assert [r["data"]["kind"] for r in kinds] == ["turn_started", "turn_completed"] * 2
    table = walj_cli("dump", logs["blocked"])
    assert table.code == 0
    header, *lines = table.out.splitlines()
    assert header.split()[:4] == ["SEQ", "TIME", "(UTC)", "KIND"]
    assert any("tool_execution_ambiguous" in line and "KeyboardInterrupt" in line
               for line in lines)


def test_dump_of_a_damaged_log_shows_what_verifies_and_exits_1(tmp_path: Path) -> None:
    log = tmp_path / "log"
    make_plain_log(log, 300, segment_bytes=4096)
    first = segments(log)[0]
    flip_byte(first, record_offset(first, b'"text":"record 5"'))
    run = walj_cli("dump", log, "--json")
    assert run.code == 1
    seqs = [r["seq"] for r in run.lines()]
    assert 6 not in seqs and seqs == [s for s in range(1, 301) if s != 6]
    assert "bad_checksum" in run.err and "Traceback" not in run.err


def test_dump_shows_no_record_of_a_foreign_segment(tmp_path: Path) -> None:
    """Another log's segment placed among this one's: its lines verify, but they are not this
    log's records, so dump shows none of them and names the segment on stderr."""
    mine, other = tmp_path / "mine", tmp_path / "other"
    for path, name in ((mine, "mine"), (other, "other")):
        with walj.Log.open(path, segment_bytes=1024) as log:
            for i in range(40):
                log.append({"log": name, "i": i, "pad": "x" * 60})
    foreign = segments(other)[1]
    assert len(segments(mine)) > 2 and foreign.name == segments(mine)[1].name
    shutil.copyfile(foreign, segments(mine)[1])
    own = [r.seq for r in walj.read(mine, recovery="salvage") if r.data["log"] == "mine"]
    for options in ([], ["--from-seq", "5"]):
        run = walj_cli("dump", mine, "--json", *options)
        assert run.code == 1
        rows = run.lines()
        assert rows and all(r["data"]["log"] == "mine" for r in rows)
        assert [r["seq"] for r in rows] == [s for s in own if s >= 5 or not options]
        assert f"{foreign.name} at byte 0" in run.err and "foreign_segment" in run.err
    table = walj_cli("dump", mine)
    assert table.code == 1 and '"other"' not in table.out and '"mine"' in table.out


def test_tail_last_records(logs: dict[str, Any]) -> None:
    run = walj_cli("tail", logs["plain"], "-n", "3", "--json")
    assert run.code == 0
    assert [r["seq"] for r in run.lines()] == [298, 299, 300]
    run = walj_cli("tail", logs["plain"], "--from-seq", "296", "--json")
    assert [r["seq"] for r in run.lines()] == [296, 297, 298, 299, 300]


# --- timeline and stats ---------------------------------------------------------------------


def test_timeline(logs: dict[str, Any]) -> None:
    run = walj_cli("timeline", logs["blocked"], "--json")
    assert run.code == 1
    report = run.json()
    assert report["schema"] == "walj.timeline/3" and report["blocked"] is True
    turns = report["turns"]
    assert [t["turn_sequence"] for t in turns] == [1, 2, 3]
    assert [t["state"] for t in turns] == ["completed", "completed", "incomplete"]
    first = turns[0]
    assert [e["tool"] for e in first["executions"]] == ["lookup", "send", "failing"]
    assert [e["outcome"] for e in first["executions"]] == ["ok", "ok", "error"]
    assert "quota exceeded" in first["executions"][2]["error"]
    assert all(e["duration_seconds"] is not None for e in first["executions"])
    (ambiguous,) = turns[2]["executions"]
    assert ambiguous["ambiguous"] is True and ambiguous["blocker"] is True
    assert ambiguous["outcome"] == "ambiguous" and ambiguous["execution_id"] == logs["eid"]
    text = walj_cli("timeline", logs["blocked"])
    assert "AMBIGUOUS BLOCKER" in text.out and "turn 3  INCOMPLETE" in text.out
    last = walj_cli("timeline", logs["clean"], "--last", "1", "--json")
    assert last.code == 0 and [t["turn_sequence"] for t in last.json()["turns"]] == [2]


def test_stats(logs: dict[str, Any]) -> None:
    run = walj_cli("stats", logs["clean"], "--json")
    assert run.code == 0, run.err
    report = run.json()
    assert report["schema"] == "walj.stats/2"
    assert report["segments"] == 1 and report["records"] == report["last_seq"]
    assert report["kinds"]["tool_execution_started"] == 6
    assert report["kinds"]["turn_started"] == 2
    tools = {t["tool"]: t for t in report["tools"]}
    assert set(tools) == {"lookup", "send", "failing"}
    assert tools["failing"]["calls"] == 2 and tools["failing"]["error_rate"] == 1.0
    assert tools["lookup"]["ok"] == 2 and tools["lookup"]["error_rate"] == 0.0
    assert tools["lookup"]["p50_seconds"] is not None
    span = report["time_span"]
    assert span["first"] <= span["last"] and span["seconds"] >= 0
    plain = walj_cli("stats", logs["plain"], "--json").json()
    assert plain["kinds"] == {"-": 300} and plain["tools"] == []
    text = walj_cli("stats", logs["blocked"])
    assert text.code == 0 and "ERROR RATE" in text.out and "AMBIGUOUS" in text.out


def test_pending_llm_call_in_inspect_and_timeline(tmp_path: Path) -> None:
    import walj

    log = tmp_path / "llm"
    with walj.ToolJournal.open(log, tools={"lookup": lambda order_id: order_id}) as journal:
        with journal.turn() as turn:
            with journal.llm_call(model="model-a", request={"q": "first"}) as call:
                call.finish({"a": "answer"})
            turn.dispatch("lookup", {"order_id": "A-1"})
        try:
            with journal.turn():
                with journal.llm_call(model="model-a", request={"q": "second"}):
                    raise KeyboardInterrupt
        except KeyboardInterrupt:
            pass
    report = walj_cli("inspect", log, "--json").json()
    assert report["blocked"] is False  # a pending LLM call is reported, not blocking
    (pending,) = report["pending_llm_calls"]
    assert pending["model"] == "model-a" and pending["turn_sequence"] == 2
    assert '"second"' in pending["request_preview"]
    turns = walj_cli("timeline", log, "--json").json()["turns"]
    assert [c["pending"] for t in turns for c in t["llm_calls"]] == [False, True]
    first = turns[0]
    assert first["llm_calls"][0]["seq"] < first["executions"][0]["seq"]


def test_timeline_pairs_turns_as_the_recovery_rebuild_does(tmp_path: Path) -> None:
    """One pairing rule, owned by the rebuild: a completion completes the latest unpaired start.
    Turn 2 completes, turn 1 (tool-bearing) stays interrupted: timeline and inspect agree."""
    path = tmp_path / "log"
    records = [
        {"kind": "turn_started", "version": 2, "turn_sequence": 1, "at": 1.0},
        {"kind": "tool_execution_started", "version": 2, "execution_id": "e" * 32, "at": 1.1,
         "turn_sequence": 1, "tool": "send", "call_id": "c1"},
        {"kind": "tool_execution_finished", "version": 2, "execution_id": "e" * 32, "at": 1.2,
         "outcome": "ok"},
        {"kind": "turn_started", "version": 2, "turn_sequence": 2, "at": 2.0},
        # pairs with turn 2 (LIFO)
        {"kind": "turn_completed", "version": 2, "turn_sequence": 1, "at": 3.0},
    ]
    import walj

    with walj.Log.open(path) as log:
        for record in records:
            log.append(record)
    timeline = walj_cli("timeline", path, "--json").json()
    completed = {t["turn_sequence"]: t["completed_at"] for t in timeline["turns"]}
    assert completed == {1: None, 2: 3.0}
    inspect = walj_cli("inspect", path, "--json").json()
    assert [(b["state"], b["turn_sequence"]) for b in inspect["blockers"]] == [
        ("interrupted_turn", 1)]
