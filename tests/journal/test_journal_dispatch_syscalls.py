"""The system calls of a dispatch, traced with strace: a turn's turn_started rides in its first
intent's write and sync, the intent is synced before the handler runs and the terminal record
before the next step, and a session per request (open, one call, close) syncs three times."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import strace_calls
from journal_helpers import records

import walj

STRACE = shutil.which("strace")

# Each call's handler opens EFFECTS: the openat marks, in the trace, when the handler ran.
CHILD = textwrap.dedent("""
    import sys, walj
    path, effects, sync = sys.argv[1], sys.argv[2], sys.argv[3]

    def send(to):
        with open(effects, "a") as out:
            out.write(to + "\\n")
        return "sent"

    for request in range(2):
        journal = walj.ToolJournal.open(path, tools={"send": send}, sync=sync)
        with journal.turn() as turn:
            for call in range(3):
                turn.dispatch("send", {"to": f"{request}-{call}"})
        journal.close()
""")


def _trace(tmp_path: Path, sync: str) -> tuple[list[tuple[str, str]], list[str], Path]:
    """(call, file) of the calls on the journal's segments and on EFFECTS, in order; the
    bytes of each segment write; the journal's path."""
    out, path, effects = tmp_path / "trace", tmp_path / "j", tmp_path / "effects"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    subprocess.run([STRACE, "-f", "-qq", "-s", "65536", "-o", str(out), "-e",
                    "trace=openat,write,pwrite64,fdatasync,fsync", sys.executable, "-c", CHILD,
                    str(path), str(effects), sync], check=True, env=env)
    lines = [line for line in out.read_text().splitlines() if "resumed>" not in line]
    events, texts = [], []
    for (op, target), line in zip(strace_calls("\n".join(lines)), lines, strict=True):
        if "seg-" in target or target == str(effects):
            events.append((op, "effect" if target == str(effects) else "segment"))
            if op == "write" and "seg-" in target:
                texts.append(line)
    return events, texts, path


def _steps(events: list[tuple[str, str]]) -> list[str]:
    """The segment's writes and syncs and the handler's runs, in order (segment opens and the
    handler's own write left out)."""
    steps = []
    for op, target in events:
        if target == "effect":
            if op == "openat":
                steps.append("handler")
        elif op in ("write", "fdatasync", "fsync"):
            steps.append("sync" if op != "write" else "write")
    return steps


@pytest.mark.skipif(STRACE is None, reason="strace is not installed")
@pytest.mark.parametrize("sync", ["always", "never"])
def test_a_turns_first_intent_carries_its_turn_started_in_one_write_and_one_sync(
        tmp_path: Path, sync: str) -> None:
    events, texts, path = _trace(tmp_path, sync)
    steps = _steps(events)
    call = ["write", "sync", "handler", "write", "sync"]
    turn_completed = ["write", "sync"]  # "never": the sync is close's
    # The first segment of a new log starts with its header (one write and sync).
    header, rest = steps[:2], steps[2:]
    assert header == ["write", "sync"]
    one_request = call * 3 + turn_completed
    assert rest == one_request * 2, steps
    # The first write of each turn holds turn_started and the intent, in that order.
    firsts = [text for text in texts if "turn_started" in text]
    assert len(firsts) == 2
    for text in firsts:
        assert 0 < text.index("turn_started") < text.index("tool_execution_started")
        assert "tool_execution_finished" not in text
    kinds = [r["kind"] for r in records(path)]
    assert kinds == (["turn_started"] + ["tool_execution_started", "tool_execution_finished"] * 3
                     + ["turn_completed"]) * 2


def test_a_turn_left_before_its_first_record_still_reads_as_an_incomplete_turn(
        tmp_path: Path) -> None:
    """Its turn_started was pending: leaving by an exception writes it, as the turn always did."""
    path = tmp_path / "j"
    with walj.ToolJournal.open(path) as journal:
        with pytest.raises(LookupError), journal.turn():
            raise LookupError("left")
        with journal.turn() as turn:  # a turn of no call: its two records in one write
            assert turn.sequence == 2
        recovery = journal.recovery
        assert [t.turn_sequence for t in recovery.incomplete_turns] == [1]
        assert not recovery.blocked
    assert [r["kind"] for r in records(path)] == ["turn_started", "turn_started",
                                                  "turn_completed"]
    with walj.ToolJournal.open(path) as journal:
        assert journal.recovery.incomplete_turns == recovery.incomplete_turns


def test_a_turn_started_pending_is_written_once_whatever_its_turn_writes(tmp_path: Path) -> None:
    """A blocked answer, an LLM call and a completion each carry a pending turn_started, and
    only the first of them does."""
    path = tmp_path / "j"
    with walj.ToolJournal.open(path, tools={"t": lambda: "ok"}) as journal:
        with pytest.raises(KeyboardInterrupt), journal.turn() as turn:
            turn.dispatch("t", {}, handler=_interrupted)
        with journal.turn() as turn:
            assert turn.dispatch("t", {}).outcome == "blocked"
            with turn.llm_call(model="m") as call:
                call.finish("a")
        live = journal.recovery
    kinds = [r["kind"] for r in records(path)]
    assert kinds.count("turn_started") == 2
    assert kinds[3:] == ["turn_started", "tool_execution_blocked", "llm_call_started",
                         "llm_call_finished", "turn_completed"]
    with walj.ToolJournal.open(path) as journal:
        assert journal.recovery == live


def _interrupted() -> None:
    raise KeyboardInterrupt
