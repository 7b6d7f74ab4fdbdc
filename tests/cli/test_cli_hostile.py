"""Every byte of a log is hostile: control characters from tool outputs, tool names, ids, notes
and file names never reach the terminal raw; odd numbers, wrong types and deep nesting in
checksum-valid records give a verdict, never a traceback or non-JSON; sweep never skips a
symlinked session; `tail -f` never spins; a pending LLM call marked `"blocks_dispatch": true`
blocks."""

from __future__ import annotations

import contextlib
import io
import json
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from cli_helpers import ENV, REPO, Run, forensic, interrupted, make_journal, send, walj_cli
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import walj
from walj import _codec
from walj.cli import main
from walj.journal.state import rebuild
from walj.log import format as fmt

OSC52 = "\x1b]52;c;ZWNobyBvd25lZA==\x07"  # writes the clipboard
OSC0 = "\x1b]0;owned\x07"  # sets the window title
CSI2J = "\x1b[2J"  # clears the screen
C1 = "\x9b2J\x85"  # 8-bit CSI, and NEL
BIDI = "\u202eexe.txt\u202c\u2066x\u2069"  # right-to-left override, isolates
TOOL = "fetch" + OSC0  # a tool name a model chose
# What must never be written to a terminal: C0 but newline, DEL, C1, bidi overrides/isolates.
UNSAFE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def assert_printable(*texts: str) -> None:
    for text in texts:
        found = UNSAFE.search(text)
        assert found is None, (found and repr(text[max(0, found.start() - 60):found.end() + 20]))


def strings(value: Any) -> str:
    """Every string in a JSON value, joined: to look for a value whatever its place."""
    if isinstance(value, dict):
        return " ".join(strings(v) for v in value.values())
    if isinstance(value, list):
        return " ".join(strings(v) for v in value)
    return value if isinstance(value, str) else ""


def strict_json(text: str) -> Any:
    def refuse(name: str) -> Any:
        raise AssertionError(f"{name} in --json output")

    return json.loads(text, parse_constant=refuse)


# --- logs with hostile content --------------------------------------------------------------


def page(url: str) -> str:
    return f"<html><title>{OSC52}</title>{CSI2J}{C1}{BIDI}{url}</html>"


def boom(url: str) -> None:
    raise RuntimeError(f"bad page {OSC52}{C1}{BIDI}")


def make_hostile_journal(path: Path) -> dict[str, str]:
    """A journal written by the real library whose every string field carries escapes: a
    fetched page (OSC 52), a model's tool name (OSC 0), call ids (CSI 2J), an exception message
    (C1), a resolution's actor and note, a model name; one blocker left open, one refusal."""
    tools = {TOOL: page, "boom" + CSI2J: boom}
    with walj.ToolJournal.open(path, tools=tools, sync="never") as journal:
        with journal.turn() as turn:
            turn.dispatch(TOOL, {"url": "http://x/" + C1 + BIDI}, call_id="call" + CSI2J)
            turn.dispatch("boom" + CSI2J, {"url": "u"}, call_id="c2" + OSC0)
        ids = []
        for call in ("c3" + BIDI, "c4" + OSC0):
            try:
                with journal.turn() as turn:
                    turn.dispatch(TOOL, {"url": OSC52 + C1}, call_id=call, handler=interrupted)
            except KeyboardInterrupt:
                pass
            (open_one,) = journal.recovery.blockers
            assert open_one.execution_id is not None
            ids.append(open_one.execution_id)
            if len(ids) == 1:  # settled, so that the next call runs
                # the journal refuses control characters in an actor, not bidi controls
                journal.resolve(ids[0], "succeeded", actor="ann" + BIDI,
                                note="seen" + OSC52 + BIDI)
        first, blocker = ids
        try:
            with journal.turn():
                with journal.llm_call(model="gpt" + OSC0, request={"q": OSC52 + C1}):
                    raise KeyboardInterrupt
        except KeyboardInterrupt:
            pass
        with journal.turn() as turn:
            refused = turn.dispatch(TOOL, {"url": "z"}, call_id="c5" + CSI2J)
        assert refused.outcome == "blocked"
    return {"blocker": blocker, "resolved": first}


def frame_log(path: Path, records: list[Any]) -> Path:
    """A one-segment log framed by hand (docs/FORMAT.md): every line checksum-valid, whatever
    its data holds. A record is a dict (encoded by json, so NaN is allowed) or raw bytes."""
    path.mkdir(parents=True, exist_ok=True)
    header = fmt.Header(1, uuid.uuid4().hex, 1, 1, "", 1 << 20, 1700000000.0)
    lines = [fmt.frame(header.body())]
    for seq, record in enumerate(records, 1):
        data = record if isinstance(record, bytes) else json.dumps(
            record, ensure_ascii=False, separators=(",", ":"), allow_nan=True).encode()
        lines.append(fmt.frame_record(seq, data))
    (path / fmt.segment_name(1)).write_bytes(b"".join(lines))
    return path


def eid(n: int) -> str:
    return f"{n:032x}"


T = 1700000000.5


def turn_started(n: int, **extra: Any) -> dict[str, Any]:
    return {"kind": "turn_started", "version": 2, "turn_sequence": n, "at": T, **extra}


def started(n: int, turn: int = 1, **extra: Any) -> dict[str, Any]:
    return {"kind": "tool_execution_started", "version": 2, "execution_id": eid(n), "at": T,
            "turn_sequence": turn, "tool": "send", "call_id": f"c{n}",
            "arguments_sha256": "s" * 64, "idempotency_key": "i" * 32, "arguments_preview": "{}",
            "arguments_length": 2, **extra}


def in_process(*args: str | Path) -> Run:
    """`walj ARGS` in this process: an exception that escapes `main` fails the test."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
    return Run(code, out.getvalue(), err.getvalue())


# --- the zipapp -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pyz(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("hostile-zipapp")
    target = base / "walj-forensic.pyz"
    build = subprocess.run([sys.executable, "tools/build_zipapp.py", "--output", str(target)],
                           cwd=REPO, capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stderr
    venv = base / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    return {"pyz": target, "python": venv / "bin" / "python", "base": base}


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("hostile")
    sessions = root / "sessions"
    log = sessions / ("s-1" + OSC0)  # a file name from the directory
    ids = make_hostile_journal(log)
    return {"root": sessions, "log": log, **ids}


# --- item 10: terminal escapes ----------------------------------------------------------------


def test_item10_osc52_in_tool_output_is_escaped_in_dump(hostile: dict[str, Any]) -> None:
    run = walj_cli("dump", hostile["log"])
    assert run.code == 0, run.err
    assert_printable(run.out, run.err)
    assert "\\x1b]52;c;ZWNobyBvd25lZA==\\x07" in run.out  # shown, as an escape
    assert "\\x9b2J" in run.out and "\\u202e" in run.out
    lines = walj_cli("dump", hostile["log"], "--json")
    assert lines.code == 0
    assert_printable(lines.out)
    previews = [strict_json(line)["data"].get("output_preview") for line in lines.out.splitlines()]
    preview = " ".join(page("http://x/" + C1 + BIDI).split())  # previews collapse whitespace
    assert preview in previews  # the value itself, exactly


READ_VIEWS = {
    "dump": (["dump"], "\\x1b]52;c;"),
    "tail": (["tail", "-n", "50"], "\\x1b]52;c;"),
    "inspect": (["inspect"], "fetch\\x1b]0;owned\\x07"),
    "inspect ID": (["inspect", "{log}", "{blocker}"], "fetch\\x1b]0;owned\\x07"),
    "timeline": (["timeline"], "fetch\\x1b]0;owned\\x07"),
    "stats": (["stats"], "fetch\\x1b]0;owned\\x07"),
    "sweep": (["sweep", "{root}", "--all", "--jobs", "1"], "s-1\\x1b]0;owned\\x07"),
}


def _argv(view: list[str], hostile: dict[str, Any]) -> list[str]:
    if any("{" in a for a in view):
        return [a.format(log=hostile["log"], root=hostile["root"], blocker=hostile["blocker"])
                for a in view]
    return [*view, str(hostile["log"])]


@pytest.mark.parametrize("name", list(READ_VIEWS))
def test_item10_no_control_character_reaches_the_terminal(hostile: dict[str, Any],
                                                          name: str) -> None:
    view, shown = READ_VIEWS[name]
    run = walj_cli(*_argv(view, hostile))
    assert run.code in (0, 1), run.err
    assert "Traceback" not in run.err
    assert_printable(run.out, run.err)
    assert shown in run.out
    if name not in ("dump", "tail"):
        as_json = walj_cli(*_argv(view, hostile), "--json")
        assert_printable(as_json.out)  # C1 and bidi are \u escapes there; C0 always was
        assert TOOL in strings(strict_json(as_json.out))  # the value itself, exactly


def test_item10_inspect_shows_every_hostile_field_escaped(hostile: dict[str, Any]) -> None:
    run = walj_cli("inspect", hostile["log"])
    assert run.code == 1  # the open blocker
    assert_printable(run.out)
    for escaped in ("c4\\x1b]0;owned\\x07",  # call id
                    "ann\\u202eexe.txt\\u202c",  # actor
                    "gpt\\x1b]0;owned\\x07",  # model
                    "\\x9b2J"):  # arguments preview
        assert escaped in run.out, escaped
    report = walj_cli("inspect", hostile["log"], "--json").json()
    (blocker,) = report["blockers"]
    assert blocker["tool"] == TOOL and blocker["call_id"] == "c4" + OSC0
    assert report["resolutions"][0]["actor"] == "ann" + BIDI
    assert report["resolutions"][0]["note"] == "seen" + OSC52 + BIDI


def test_item10_verify_and_errors_escape_the_path(tmp_path: Path) -> None:
    log = tmp_path / ("log" + OSC52)
    frame_log(log, [{"i": 1}, {"i": 2}])
    seg = log / fmt.segment_name(1)
    data = bytearray(seg.read_bytes())
    data[data.index(b'"i":1') + 4] = ord("7")  # a bad checksum, then a verified line
    seg.write_bytes(bytes(data))
    run = walj_cli("verify", log)
    assert run.code == 1
    assert_printable(run.out, run.err)
    assert "log\\x1b]52;c;" in run.out and "bad_checksum" in run.out
    missing = walj_cli("inspect", tmp_path / ("nothing" + CSI2J))
    assert missing.code == 2
    assert_printable(missing.err)
    assert "nothing\\x1b[2J" in missing.err


@pytest.mark.parametrize("name", list(READ_VIEWS) + ["verify"])
def test_item10_zipapp_escapes_control_characters(pyz: dict[str, Path], hostile: dict[str, Any],
                                                  name: str) -> None:
    view, shown = READ_VIEWS.get(name, (["verify"], "s-1\\x1b]0;owned\\x07"))
    run = forensic(pyz, *_argv(view, hostile))
    assert run.code in (0, 1), run.err
    assert_printable(run.out, run.err)
    assert shown in run.out


# --- item 14: sweep and symlinks --------------------------------------------------------------


def test_item14_symlinked_blocked_session_is_reported_not_skipped(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "elsewhere"
    make_journal(root / "clean")
    make_journal(outside / "blocked", blocked=True)
    (root / "linked").symlink_to(outside / "blocked", target_is_directory=True)
    run = walj_cli("sweep", root, "--json")
    assert run.code == 1, run.out
    report = run.json()
    assert report["counts"] == {"active": 1, "ended": 0, "blocked": 0, "corrupt": 0,
                                "unsupported": 0, "unreadable": 1}
    linked = next(s for s in report["sessions"] if s["path"].endswith("linked"))
    assert linked["status"] == "unreadable"
    assert linked["detail"].startswith("refused: symlink to ")
    assert str(outside / "blocked") in linked["detail"]
    text = walj_cli("sweep", root)
    assert text.code == 1
    assert "1 active, 0 ended, 1 unreadable" in text.out.splitlines()[0]
    assert any(line.split()[:2] == ["linked", "UNREADABLE"] for line in text.out.splitlines())


def test_item14_a_symlink_loop_is_reported_and_the_sweep_ends(tmp_path: Path) -> None:
    root = tmp_path / "root"
    make_journal(root / "team" / "s-1")
    (root / "team" / "loop").symlink_to(root, target_is_directory=True)
    (root / "team" / "gone").symlink_to(tmp_path / "unmounted", target_is_directory=True)
    run = walj_cli("sweep", root, "--json", timeout=60)
    assert run.code == 1
    sessions = {Path(s["path"]).name: s for s in run.json()["sessions"]}
    assert {name: s["status"] for name, s in sessions.items()} == {
        "s-1": "active", "loop": "unreadable", "gone": "unreadable"}
    assert sessions["gone"]["detail"].startswith("refused: symlink to ")


def test_item14_zipapp_sweep_reports_the_symlink(pyz: dict[str, Path], tmp_path: Path) -> None:
    root = tmp_path / "root"
    make_journal(root / "clean")
    make_journal(tmp_path / "blocked", blocked=True)
    (root / "linked").symlink_to(tmp_path / "blocked", target_is_directory=True)
    run = forensic(pyz, "sweep", root, "--json")
    assert run.code == 1
    assert run.json()["counts"]["unreadable"] == 1


# --- item 19: numbers, types and depth --------------------------------------------------------


def test_item19_time_ns_in_a_plain_log_does_not_crash_dump_tail_stats(tmp_path: Path) -> None:
    log = tmp_path / "log"
    with walj.Log.open(log, sync="never") as writer:
        for i in range(3):
            writer.append({"t": time.time_ns(), "i": i})
    for args in (["dump"], ["tail"], ["stats"], ["dump", "--json"], ["stats", "--json"]):
        run = walj_cli(*args, log)
        assert run.code == 0, (args, run.err)
        assert run.err == ""
    dump = walj_cli("dump", log).out.splitlines()
    assert [line.split()[1] for line in dump[1:]] == ["-", "-", "-"]  # no plausible time
    span = walj_cli("stats", log, "--json").json()["time_span"]
    assert span["first"] == pytest.approx(time.time(), abs=600)  # the header's
    assert span["last"] is None and span["seconds"] is None


def absurd_journal(path: Path) -> Path:
    return frame_log(path, [
        turn_started(1, at=1e300),
        started(1, at=int("9" * 400)),
        {"kind": "tool_execution_blocked", "version": 2, "execution_id": eid(2), "at": -1.0,
         "turn_sequence": 1, "tool": "send", "call_id": "c2", "blocked_by": 5,
         "blocked_by_turns": "x"},
        {"kind": "llm_call_started", "version": 2, "llm_call_id": eid(3), "at": time.time_ns(),
         "turn_sequence": 10**30, "model": 5},
    ])


def test_item19_absurd_numbers_and_wrong_types_in_a_journal(tmp_path: Path) -> None:
    log = absurd_journal(tmp_path / "j")
    with walj.ToolJournal.open(log, recovery="salvage") as journal:
        (blocker,) = journal.recovery.blockers
        (pending,) = journal.recovery.pending_llm_calls
    assert blocker.started_at is None and blocker.execution_id == eid(1)
    assert pending.started_at is None and pending.turn_sequence is None and pending.model is None
    report = walj_cli("inspect", log, "--json")
    assert report.code == 1, report.err
    (shown,) = strict_json(report.out)["blockers"]
    assert shown["started_at"] is None and shown["age_seconds"] is None
    timeline = walj_cli("timeline", log, "--json")
    assert timeline.code == 1, timeline.err
    turn = strict_json(timeline.out)["turns"][0]
    assert turn["started_at"] is None
    assert turn["blocked"][0]["blocked_by"] == [] and turn["blocked"][0]["blocked_by_turns"] == []
    stats = walj_cli("stats", log, "--json")
    assert stats.code == 0, stats.err
    assert strict_json(stats.out)["time_span"]["first"] == 1700000000.0  # the header's
    for args in (["inspect"], ["timeline"], ["stats"], ["dump"], ["tail"],
                 ["inspect", log, eid(1)], ["inspect", log, eid(1), "--json"]):
        run = walj_cli(*args, *([] if len(args) > 1 else [log]))
        assert run.code in (0, 1) and "Traceback" not in run.err, (args, run.err)


HOSTILE_FIELDS = {
    # (records, None when the journal opens, else the CorruptionError's message fragment)
    "at: 400-digit integer": ([turn_started(1), started(1, at=int("9" * 400))], None),
    "at: 1e300": ([turn_started(1, at=1e300), started(1, at=-1e300)], None),
    "at: time_ns": ([turn_started(1, at=time.time_ns()), started(1, at=time.time_ns())], None),
    "blocked_by and blocked_by_turns of the wrong type": ([turn_started(1), {
        "kind": "tool_execution_blocked", "version": 2, "execution_id": eid(2), "blocked_by": 5,
        "blocked_by_turns": {"a": 1}}], None),
    "tool, call_id, arguments_sha256, arguments_preview of the wrong type": (
        [turn_started(1), started(1, tool=[1], call_id={"x": 2}, arguments_sha256=7,
                                  arguments_preview=None)], None),
    "kind: a list": ([turn_started(1), {"kind": ["turn_started"], "version": 2}], "unknown kind"),
    "outcome: a list": ([turn_started(1), started(1), {
        "kind": "tool_execution_resolved", "version": 2, "execution_id": eid(1),
        "outcome": ["x"], "actor": "a"}], "has outcome a list"),
    "actor: an object": ([turn_started(1), started(1), {
        "kind": "tool_execution_resolved", "version": 2, "execution_id": eid(1),
        "outcome": "succeeded", "actor": {"a": 1}}], "has actor a dict"),
    "turn_sequence: 10**30": ([turn_started(10**30)], "not a new turn number"),
    "turn_sequence: 0": ([turn_started(0)], "not a new turn number"),
    "blocks_dispatch: a string": ([{"kind": "llm_call_started", "version": 2,
                                    "llm_call_id": eid(5), "blocks_dispatch": "yes"}],
                                  "not a boolean"),
    "arguments: nested 5,000 deep": ([turn_started(1), b'{"kind":"tool_execution_started",'
                                      b'"version":2,"execution_id":"' + eid(1).encode()
                                      + b'","at":1.0,"turn_sequence":1,"arguments":'
                                      + b"[" * 5000 + b"]" * 5000 + b"}"], "nested"),
    "at: NaN": ([turn_started(1, at=float("nan"))], "is not JSON"),
}


@pytest.mark.parametrize("case", list(HOSTILE_FIELDS))
def test_item19_tool_journal_open_ignores_or_refuses_every_hostile_field(tmp_path: Path,
                                                                         case: str) -> None:
    records, refusal = HOSTILE_FIELDS[case]
    log = frame_log(tmp_path / "j", records)
    if refusal is None:
        with walj.ToolJournal.open(log, sync="never") as journal:
            recovery = journal.recovery
        for blocker in recovery.blockers:
            assert blocker.started_at is None or 0 <= blocker.started_at < 1e11
            assert blocker.tool is None or isinstance(blocker.tool, str)
        return
    with pytest.raises(walj.CorruptionError) as caught:
        walj.ToolJournal.open(log, sync="never")
    assert caught.value.kind == "journal_record"
    assert refusal in str(caught.value)


def test_item19_nan_is_never_emitted_and_the_record_is_refused(pyz: dict[str, Path],
                                                               tmp_path: Path) -> None:
    log = frame_log(tmp_path / "j",
                    [turn_started(1), started(1, at=float("nan"), arguments=[1e400])])
    for run in (walj_cli("inspect", log, "--json"), forensic(pyz, "inspect", log, "--json")):
        assert run.code == 1 and run.out == ""
        assert "journal record 2 cannot be read" in run.err and "Traceback" not in run.err
    for run in (walj_cli("dump", log, "--json"), forensic(pyz, "dump", log, "--json")):
        assert run.code == 1
        rows = [strict_json(line) for line in run.out.splitlines()]
        assert rows[1]["seq"] == 2 and rows[1]["data"] is None and rows[1]["undecodable"]
        assert "NaN" not in run.out and "Infinity" not in run.out
    stats = forensic(pyz, "stats", log, "--json")
    assert stats.code == 1 and strict_json(stats.out)["undecodable"] == 1


def deep_journal(path: Path) -> Path:
    deep = b"[" * 5000 + b"]" * 5000
    return frame_log(path, [
        turn_started(1),
        b'{"kind":"tool_execution_finished","version":2,"execution_id":"' + eid(9).encode()
        + b'","outcome":"ok","output_preview":' + deep + b"}",
        b'{"kind":"tool_execution_started","version":2,"execution_id":"' + eid(1).encode()
        + b'","turn_sequence":1,"tool":"send","arguments":' + deep + b"}",
    ])


@pytest.mark.parametrize("args", [["dump"], ["dump", "--json"], ["tail"], ["tail", "--json"],
                                  ["stats"], ["stats", "--json"], ["timeline"], ["inspect"],
                                  ["inspect", "--json"], ["inspect", "ID"]],
                         ids=" ".join)
def test_item19_deeply_nested_record_is_undecodable_not_a_traceback(tmp_path: Path,
                                                                    args: list[str]) -> None:
    log = deep_journal(tmp_path / "j")
    argv = [args[0], log, eid(1)] if args[-1] == "ID" else [*args, log]
    run = walj_cli(*argv)
    assert run.code == 1, (run.out, run.err)
    assert "Traceback" not in run.err and "RecursionError" not in run.err
    assert "nested" in run.err or "undecodable" in run.out
    if "--json" in args and run.out:
        for line in (run.out.splitlines() if args[0] in ("dump", "tail") else [run.out]):
            strict_json(line)


def test_item19_zipapp_deeply_nested_record(pyz: dict[str, Path], tmp_path: Path) -> None:
    log = deep_journal(tmp_path / "j")
    for args in (["dump"], ["stats"], ["timeline"], ["inspect"], ["sweep"]):
        run = forensic(pyz, *args, log)
        assert run.code == 1, (args, run.err)
        assert "Traceback" not in run.err and "RecursionError" not in run.err


# --- item 19: random values in every field of every record kind -------------------------------

L1, L2, L3 = eid(101), eid(102), eid(103)


def history() -> list[dict[str, Any]]:
    """A valid journal that uses every record kind, with one execution and one LLM call left
    open; hypothesis then replaces fields with random JSON values."""
    return [
        turn_started(1),
        started(1, arguments={"x": 1}),
        {"kind": "tool_execution_finished", "version": 2, "execution_id": eid(1), "at": T,
         "outcome": "ok", "output_sha256": "s" * 64, "output_preview": "page",
         "output_length": 4},
        started(2),
        {"kind": "tool_execution_ambiguous", "version": 2, "execution_id": eid(2), "at": T,
         "error_type": "KeyboardInterrupt", "error": "KeyboardInterrupt"},
        {"kind": "tool_execution_reconcile_failed", "version": 2, "execution_id": eid(2),
         "at": T, "tool": "send", "error": "ValueError: no"},
        {"kind": "tool_execution_resolved", "version": 2, "execution_id": eid(2), "at": T,
         "outcome": "succeeded", "actor": "ann", "note": "seen", "output": {"r": 1}},
        started(3),
        {"kind": "tool_execution_blocked", "version": 2, "execution_id": eid(4), "at": T,
         "turn_sequence": 1, "tool": "send", "call_id": "c4", "arguments_sha256": "s" * 64,
         "arguments_preview": "{}", "arguments_length": 2, "blocked_by": [eid(3)],
         "blocked_by_turns": [1]},
        {"kind": "llm_call_started", "version": 2, "llm_call_id": L1, "at": T,
         "turn_sequence": 1, "model": "m", "request_sha256": "s" * 64, "request_preview": "q",
         "request_length": 1},
        {"kind": "llm_call_finished", "version": 2, "llm_call_id": L1, "at": T, "outcome": "ok",
         "response_sha256": "s" * 64, "response_preview": "a", "response_length": 1},
        {"kind": "llm_call_started", "version": 2, "llm_call_id": L2, "at": T,
         "turn_sequence": 1, "model": "m", "blocks_dispatch": True},
        {"kind": "llm_call_resolved", "version": 2, "llm_call_id": L2, "at": T,
         "outcome": "not_performed", "actor": "ann", "note": "n"},
        {"kind": "llm_call_started", "version": 2, "llm_call_id": L3, "at": T,
         "turn_sequence": 1, "model": "m"},
        {"kind": "turn_completed", "version": 2, "turn_sequence": 1, "at": T},
        turn_started(2),
        started(5, turn=2),
        {"kind": "tool_execution_finished", "version": 2, "execution_id": eid(5), "at": T,
         "outcome": "error", "error": "E: x", "error_type": "E"},
        {"kind": "turn_resolved", "version": 2, "turn_sequence": 2, "at": T, "actor": "ann",
         "note": "n"},
    ]


DEEP = "\x00deep\x00"  # stands for 5,000 nested lists, spliced into the bytes
leaves = (st.none() | st.booleans() | st.integers()
          | st.integers(min_value=-10**400, max_value=10**400) | st.floats()
          | st.text(max_size=12)
          | st.sampled_from([OSC52, C1 + BIDI, time.time_ns(), 1e300, -1.0, 10**30, "", DEEP]))
json_values = st.recursive(
    leaves, lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=8)
FIELDS = ["kind", "version", "execution_id", "llm_call_id", "at", "turn_sequence", "tool",
          "call_id", "arguments_sha256", "idempotency_key", "arguments_preview",
          "arguments_length", "arguments", "outcome", "output_sha256", "output_preview",
          "output_length", "error", "error_type", "blocked_by", "blocked_by_turns", "actor",
          "note", "output", "model", "request_sha256", "request_preview", "request_length",
          "response_sha256", "response_preview", "response_length", "blocks_dispatch",
          "writer"]
mutations = st.lists(st.tuples(st.integers(0, len(history()) - 1), st.sampled_from(FIELDS),
                               json_values), min_size=1, max_size=3)


def encoded(record: dict[str, Any]) -> bytes:
    data = json.dumps(record, ensure_ascii=False, separators=(",", ":"), allow_nan=True)
    return data.replace(json.dumps(DEEP), "[" * 5000 + "]" * 5000).encode()


def as_objects(value: Any) -> Any:
    """DEEP as real nested lists, for the decoded-record path."""
    if value == DEEP:
        deep: list[Any] = []
        for _ in range(5000):
            deep = [deep]
        return deep
    if isinstance(value, dict):
        return {k: as_objects(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_objects(v) for v in value]
    return value


def check_rebuild(records: list[Any]) -> None:
    try:
        state = rebuild(enumerate(records, 1))
        for flag in (False, True):
            recovery = state.snapshot(block_on_pending_llm_calls=flag)
            assert state.is_blocked(block_on_pending_llm_calls=flag) == recovery.blocked
    except walj.WaljError:
        return
    for b in recovery.blockers:
        assert b.started_at is None or 0 <= b.started_at <= 253402300799
        for text in (b.tool, b.call_id, b.arguments_preview, b.error_type, b.reconcile_error,
                     b.writer):
            assert text is None or isinstance(text, str)
        assert b.turn_sequence is None or type(b.turn_sequence) is int
    for r in recovery.resolved:
        assert isinstance(r.outcome, str) and isinstance(r.actor, str)


CLI_RUNS = [["inspect", "--json"], ["inspect"], ["timeline", "--json"], ["timeline"],
            ["stats", "--json"], ["stats"], ["dump", "--json"], ["dump"], ["tail", "-n", "4"],
            ["sweep", "--jobs", "1", "--json"], ["inspect", "ID", "--json"], ["inspect", "ID"]]
USAGE_VERDICTS = ("not a tool journal", "unknown execution id")


@given(mutations, st.booleans())
@example([(0, "kind", [])], False)  # an unhashable kind: subject_of once raised TypeError
@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
def test_item19_random_values_in_every_field_of_every_record_kind(
        changes: list[tuple[int, str, Any]], stdlib_json: bool) -> None:
    records = history()
    for index, key, value in changes:
        records[index][key] = value
    check_rebuild([as_objects(r) for r in records])
    raw = [encoded(r) for r in records]
    with mock.patch.object(_codec, "HAVE_MSGSPEC", not stdlib_json):
        check_rebuild(raw)
        with tempfile.TemporaryDirectory() as tmp:
            log = frame_log(Path(tmp) / "j", raw)
            for args in CLI_RUNS:
                argv = ([args[0], log, eid(3), *args[2:]] if "ID" in args
                        else [*args[:1], log, *args[1:]])
                run = in_process(*argv)
                assert run.code in (0, 1) or (
                    run.code == 2 and any(v in run.err for v in USAGE_VERDICTS)), (argv, run)
                assert_printable(run.out, run.err)
                if "--json" in args and run.out:
                    lines = run.out.splitlines() if args[0] == "dump" else [run.out]
                    for line in lines:
                        strict_json(line)


# --- item 21: tail -f never spins -------------------------------------------------------------


class Lines:
    """The follower's stdout as JSON rows, read by a thread (select() cannot see a text
    buffer)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.rows: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, args=(proc,), daemon=True).start()

    def _pump(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.rows.put(line)
        self.rows.put("")

    def until(self, last_seq: int, timeout: float = 30) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        while not rows or rows[-1]["seq"] != last_seq:
            try:
                line = self.rows.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(f"tail -f did not show seq {last_seq}") from None
            assert line, "tail -f exited early"
            rows.append(json.loads(line))
        return rows


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


CHURN = """
import os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
base = os.fstat(fd).st_size
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:  # a torn tail appears, and a restarting writer cuts it
    os.pwrite(fd, b'{"xxh64":"00', base)
    os.ftruncate(fd, base)
os.pwrite(fd, b'{"xxh64":"0123', base)  # and a crash leaves one
"""


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_item21_tail_follow_does_not_spin_after_a_truncation(tmp_path: Path) -> None:
    log = tmp_path / "log"
    with walj.Log.open(log, sync="never") as writer:
        for i in range(3):
            writer.append({"i": i})
    proc = subprocess.Popen(
        [sys.executable, "-m", "walj", "tail", "-f", "--json", "--interval", "0.01", str(log)],
        env=ENV, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = Lines(proc)
        assert [r["seq"] for r in lines.until(3)] == [1, 2, 3]
        churn = subprocess.run([sys.executable, "-c", CHURN, str(log / fmt.segment_name(1)),
                                "2.0"], timeout=60)
        assert churn.returncode == 0
        before, start = cpu_seconds(proc.pid), time.monotonic()
        time.sleep(1.5)
        share = (cpu_seconds(proc.pid) - before) / (time.monotonic() - start)
        assert share < 0.25, f"tail -f used {share:.0%} of a CPU while idle: it spins"
        with walj.Log.open(log, sync="never") as writer:  # the restart cuts the torn tail
            assert writer.torn_tail is not None
            for i in range(3, 6):
                writer.append({"i": i})
        assert [r["data"]["i"] for r in lines.until(6)] == [3, 4, 5]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
        assert proc.stderr is not None and "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


SHORT_READ = """
import os, sys
from walj.cli._records import Follower
path, end = sys.argv[1], int(sys.argv[2])
real_fstat = os.fstat
class Stat:  # what fstat saw just before a writer cut the file back
    def __init__(self, fd):
        real = real_fstat(fd)
        self.st_mode, self.st_size = real.st_mode, real.st_size + 4096
os.fstat = Stat
print(len(Follower(path, 1, 4).poll()))  # seqs 1-3 were shown; `end` is where they end
"""


def test_item21_a_short_read_ends_the_poll(tmp_path: Path) -> None:
    log = tmp_path / "log"
    with walj.Log.open(log, sync="never") as writer:
        for i in range(3):
            writer.append({"i": i})
    end = (log / fmt.segment_name(1)).stat().st_size
    try:
        run = subprocess.run([sys.executable, "-c", SHORT_READ, str(log), str(end)], env=ENV,
                             cwd=REPO, capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        raise AssertionError("Follower.poll spun on a short read") from None
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["0"]


# --- small: a pending LLM call that says it blocks --------------------------------------------


def pending_llm_journal(path: Path, writer: str, blocking: bool) -> str:
    """A journal with one clean turn, then an LLM call that never finished, started by a
    journal opened with `block_on_pending_llm_calls=blocking` (writer "journal"), or appended
    in the journal's record format with walj.Log (writer "log")."""
    with walj.ToolJournal.open(path, tools={"send": send}, sync="never",
                               block_on_pending_llm_calls=blocking) as journal:
        with journal.turn() as turn:
            turn.dispatch("send", {"to": "a@example.com"})
        if writer == "journal":
            try:
                with journal.turn():
                    with journal.llm_call(model="model-a", request={"q": 1}) as call:
                        call_id = call.llm_call_id
                        raise KeyboardInterrupt
            except KeyboardInterrupt:
                pass
            return call_id
    call_id = eid(77)
    with walj.Log.open(path, sync="never") as log:
        log.append({"kind": "llm_call_started", "version": 2, "llm_call_id": call_id,
                    "at": round(time.time(), 3), "turn_sequence": None, "model": "model-a",
                    **({"blocks_dispatch": True} if blocking else {})})
    return call_id


@pytest.mark.parametrize("writer", ["journal", "log"])
def test_small_blocks_true_pending_llm_call_blocks_whatever_the_reader_asks(
        tmp_path: Path, writer: str) -> None:
    log = tmp_path / "j"
    call_id = pending_llm_journal(log, writer, blocking=True)
    (started_record,) = [r.data for r in walj.read(log) if r.data.get("kind") == "llm_call_started"]
    assert started_record["blocks_dispatch"] is True
    state = rebuild((r.seq, r.data) for r in walj.read(log))
    assert state.is_blocked(block_on_pending_llm_calls=False)
    (blocker,) = state.snapshot(block_on_pending_llm_calls=False).blockers
    assert (blocker.state, blocker.execution_id) == ("pending_llm_call", call_id)
    with walj.ToolJournal.open(log, tools={"send": send}, sync="never") as journal:
        assert journal.recovery.blocked
        with journal.turn() as turn:
            assert turn.dispatch("send", {"to": "b@example.com"}).outcome == "blocked"
    inspect = walj_cli("inspect", log, "--json")
    assert inspect.code == 1
    assert [b["state"] for b in inspect.json()["blockers"]] == ["pending_llm_call"]
    sweep = walj_cli("sweep", tmp_path, "--json")
    assert sweep.code == 1
    (session,) = sweep.json()["sessions"]
    assert session["status"] == "blocked"
    assert session["blockers"][0]["state"] == "pending_llm_call"
    with walj.ToolJournal.open(log, sync="never") as journal:
        journal.resolve(call_id, "not_performed", actor="ann", note="never sent")
    assert walj_cli("inspect", log).code == 0


@pytest.mark.parametrize("writer", ["journal", "log"])
def test_small_without_blocks_a_pending_llm_call_is_listed_not_blocking(tmp_path: Path,
                                                                        writer: str) -> None:
    log = tmp_path / "j"
    pending_llm_journal(log, writer, blocking=False)
    report = walj_cli("inspect", log, "--json")
    assert report.code == 0
    assert report.json()["blockers"] == [] and len(report.json()["pending_llm_calls"]) == 1
    assert walj_cli("sweep", tmp_path, "--json").json()["counts"]["active"] == 1
