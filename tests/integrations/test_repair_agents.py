"""The Agents SDK Session read through `repaired_session`: after a real SIGKILL inside a tool,
a Session holding the interrupted function_call without its output (as one saved before its
output is: an application that stores each model response as it comes) shows the model that
call with the journal's truthful output, where the SDK alone drops it; first while it is in
doubt, then with its resolution. Nothing is run again."""

from __future__ import annotations

import asyncio
import json
import selectors
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import walj

pytest.importorskip("agents")

from agents import SQLiteSession  # noqa: E402

from walj.integrations.openai_agents import repaired_session  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CHILD = HERE / "openai_agents_child.py"
HANG = 120  # seconds: only a guard against a hung child, never what a test checks


def start(tmp: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(CHILD), str(tmp / "journal"), str(tmp / "session.db"),
         str(tmp / "ledger.txt")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        cwd=ROOT)


def send(child: subprocess.Popen[str], **command: Any) -> dict[str, Any] | None:
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write(json.dumps({"kill": None, **command}) + "\n")
    child.stdin.flush()
    with selectors.DefaultSelector() as selector:
        selector.register(child.stdout, selectors.EVENT_READ)
        assert selector.select(HANG), "the child hung"
    line = child.stdout.readline()
    return json.loads(line) if line else None


def answers_to(model_input: list[Any], call_id: str) -> list[str]:
    """The outputs the model was given for `call_id`, each after its function_call."""
    calls = [n for n, i in enumerate(model_input)
             if i.get("type") == "function_call" and i.get("call_id") == call_id]
    outputs = [(n, i["output"]) for n, i in enumerate(model_input)
               if i.get("type") == "function_call_output" and i.get("call_id") == call_id]
    assert len(calls) == 1 and all(n > calls[0] for n, _ in outputs)
    return [text for _, text in outputs]


def test_killed_inside_the_tool_the_session_shows_the_call_in_doubt_then_resolved(
        tmp_path: Path) -> None:
    first = start(tmp_path)
    assert send(first, tool="append_line", call_id="call-1", kill="in_tool") is None
    assert first.wait(HANG) == -9
    ledger = tmp_path / "ledger.txt"
    assert ledger.read_text() == "charge 42\n"

    session = SQLiteSession("conversation-1", str(tmp_path / "session.db"))
    asyncio.run(session.add_items([{"type": "function_call", "call_id": "call-1",
                                    "name": "append_line",
                                    "arguments": json.dumps({"text": "charge 42"})}]))
    session.close()

    second = start(tmp_path)
    dropped = send(second, tool="count_lines", call_id="call-2")
    assert dropped is not None and "call-1" not in json.dumps(dropped["model_inputs"])
    blocked = send(second, tool="count_lines", call_id="call-3", repair=True)
    assert blocked is not None and blocked["outputs"][0].startswith("not run: ")
    (seen,) = answers_to(blocked["model_inputs"][0], "call-1")
    assert seen.startswith("The outcome of this call is unknown: it was interrupted")

    with walj.ToolJournal.open(tmp_path / "journal") as journal:
        (blocker,) = journal.recovery.blockers
    subprocess.run([sys.executable, "-m", "walj", "resolve", str(tmp_path / "journal"),
                    str(blocker.execution_id), "--outcome", "not_performed", "--actor",
                    "ops-ann", "--note", "no charge in the ledger"],
                   check=True, cwd=ROOT, timeout=HANG, capture_output=True)
    done = send(second, tool="count_lines", call_id="call-4", repair=True)
    assert done is not None and done["final"] == "tool said: 1"
    assert answers_to(done["model_inputs"][0], "call-1") == [
        "This call was interrupted before its result was recorded, and walj did not run it "
        "again; ops-ann resolved it as not_performed: no charge in the ledger."]
    assert second.stdin is not None
    second.stdin.close()
    assert second.wait(HANG) == 0
    assert ledger.read_text() == "charge 42\n"  # never run again
    session = SQLiteSession("conversation-1", str(tmp_path / "session.db"))
    with walj.ToolJournal.open(tmp_path / "journal") as journal:
        read = repaired_session(session, journal)
        assert read.session_id == "conversation-1" and read.session is session
        with pytest.raises(TypeError, match="Agents SDK Session"):
            repaired_session(object(), journal)
    with pytest.raises(TypeError, match="walj.ToolJournal"):
        repaired_session(session, tmp_path)  # type: ignore[arg-type]
    session.close()
