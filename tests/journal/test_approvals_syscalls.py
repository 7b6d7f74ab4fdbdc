"""The system calls of an approval, traced with strace: the request is synced before the
dispatch answers that it awaits approval, the decision before approve() returns, and the intent
naming the approval before the handler runs, even in a log that syncs nothing else."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import strace_calls

from walj.journal import records as rc

STRACE = shutil.which("strace")

# The child opens MARKS.<step> when a step has returned, and the handler opens MARKS.handler:
# each openat marks, in the trace, when that happened.
CHILD = textwrap.dedent("""
    import sys, walj
    path, marks = sys.argv[1], sys.argv[2]

    def mark(step):
        open(f"{marks}.{step}", "a").close()

    def send(to):
        mark("handler")
        return "sent"

    journal = walj.ToolJournal.open(path, tools={"send": walj.Tool(send, approval=True)},
                                    sync="never")  # only what must be durable is synced
    with journal.turn() as turn:
        asked = turn.dispatch("send", {"to": "ann"}, call_id="c1")
        mark("asked")
    journal.approve(asked.approval_id, actor="ann@ops")
    mark("approved")
    with journal.turn() as turn:
        turn.dispatch("send", {"to": "ann"}, call_id="c1")
    journal.close()
""")


@pytest.mark.skipif(STRACE is None, reason="strace is not installed")
def test_each_approval_record_is_synced_before_the_step_that_depends_on_it(
        tmp_path: Path) -> None:
    out, path, marks = tmp_path / "trace", tmp_path / "j", tmp_path / "mark"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    assert STRACE is not None
    subprocess.run([STRACE, "-f", "-qq", "-s", "65536", "-o", str(out), "-e",
                    "trace=openat,write,pwrite64,fdatasync,fsync", sys.executable, "-c", CHILD,
                    str(path), str(marks)], check=True, env=env)
    lines = [line for line in out.read_text().splitlines() if "resumed>" not in line]
    steps: list[str] = []
    for (op, target), line in zip(strace_calls("\n".join(lines)), lines, strict=True):
        if target.startswith(f"{marks}.") and op == "openat":
            steps.append(target.rsplit(".", 1)[1])
        elif "seg-" in target and op in ("fdatasync", "fsync"):
            steps.append("sync")
        elif "seg-" in target and op == "write":
            kinds = re.findall(r'\\"kind\\":\\"(\w+)\\"', line) or ["header"]
            last = kinds[-1]  # a turn's first record rides with its turn_started
            named = '\\"approval_id\\":\\"apv-' in line
            steps.append(f"{last} naming an approval" if last == rc.STARTED and named else last)
    # Each record, then its sync, then (and only then) the step that depends on it.
    requested = steps.index(rc.APPROVAL_REQUESTED)
    assert steps[requested + 1:steps.index("asked")] == ["sync"], steps
    decided = steps.index(rc.APPROVAL_DECIDED)
    assert steps[decided + 1:steps.index("approved")] == ["sync"], steps
    intent = steps.index(f"{rc.STARTED} naming an approval")
    assert steps[intent + 1:steps.index("handler")] == ["sync"], steps
    assert steps.count("handler") == 1 and rc.STARTED not in steps
