"""Helpers for the command-line tests: running `python -m walj` in a subprocess, and building
small journals (clean, blocked, with an interrupted turn) with the library itself."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import walj

REPO = str(Path(__file__).resolve().parents[1])
ENV = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
       "WALJ_NO_PROGRESS": "1"}


@dataclass
class Run:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)

    def lines(self) -> list[Any]:
        return [json.loads(line) for line in self.out.splitlines()]


def forensic(app: dict[str, Path], *args: Any) -> Run:
    """Run the zipapp `app["pyz"]` with the bare interpreter `app["python"]`, nothing else on
    its path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    proc = subprocess.run([str(app["python"]), str(app["pyz"]), *map(str, args)],
                          capture_output=True, text=True, timeout=120, env=env,
                          cwd=str(app["base"]))
    return Run(proc.returncode, proc.stdout, proc.stderr)


def walj_cli(*args: str | os.PathLike[str], timeout: float = 60) -> Run:
    """Run `python -m walj ARGS` in a child process."""
    proc = subprocess.run([sys.executable, "-m", "walj", *map(str, args)], env=ENV,
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)
    return Run(proc.returncode, proc.stdout, proc.stderr)


def assert_one_line_error(run: Run, code: int, *fragments: str) -> None:
    assert run.code == code, (run.code, run.out, run.err)
    assert run.out == ""
    assert "Traceback" not in run.err
    lines = run.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("walj: error: "), run.err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def lookup(order_id: str) -> dict[str, str]:
    return {"order_id": order_id, "status": "delivered"}


def send(to: str) -> str:
    return f"sent to {to}"


def failing(reason: str) -> None:
    raise RuntimeError(reason)


def interrupted(**_: Any) -> None:
    raise KeyboardInterrupt


TOOLS = {"lookup": lookup, "send": send, "failing": failing}


def make_journal(path: Path, *, blocked: bool = False, interrupted_turn: bool = False,
                 turns: int = 2, **options: Any) -> str | None:
    """A journal with `turns` clean turns (lookup, send, and a failing call); with `blocked`, a
    last turn whose `send` was interrupted (ambiguous); with `interrupted_turn`, a tool-bearing
    turn left by an exception. Returns the ambiguous execution's id."""
    options.setdefault("sync", "never")
    eid = None
    with walj.ToolJournal.open(path, tools=TOOLS, **options) as journal:
        for i in range(turns):
            with journal.turn() as turn:
                turn.dispatch("lookup", {"order_id": f"A-{i}"})
                turn.dispatch("send", {"to": f"user{i}@example.com"})
                turn.dispatch("failing", {"reason": "quota exceeded"})
        if interrupted_turn:
            try:
                with journal.turn() as turn:
                    turn.dispatch("lookup", {"order_id": "B-1"})
                    raise RuntimeError("the agent loop crashed after the tool")
            except RuntimeError:
                pass
        if blocked:
            try:
                with journal.turn() as turn:
                    turn.dispatch("send", {"to": "ada@example.com", "token": "s3cret"},
                                  handler=interrupted)
            except KeyboardInterrupt:
                pass
            eid = [b.execution_id for b in journal.recovery.blockers if b.execution_id][-1]
    return eid


def make_plain_log(path: Path, count: int, **options: Any) -> None:
    with walj.Log.open(path, **options) as log:
        for i in range(count):
            log.append({"i": i, "text": f"record {i}", "pad": "x" * (i % 50)})


def snapshot(path: Path) -> dict[str, tuple[int, str]]:
    """Every file under `path` with its mode and content digest: to prove nothing changed."""
    out: dict[str, tuple[int, str]] = {}
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            full = Path(root) / name
            rel = str(full.relative_to(path))
            st = full.lstat()
            digest = hashlib.sha256(full.read_bytes()).hexdigest() if full.is_file() else "dir"
            out[rel] = (st.st_mode, digest)
    return out


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def record_offset(segment: Path, needle: bytes) -> int:
    """Offset of a byte inside the data part of the first line that contains `needle`."""
    data = segment.read_bytes()
    at = data.index(needle)
    return at + len(needle) // 2


class LineServer:
    """A child process that runs `script` on the session at `path` and holds it open, as a
    live server does: it prints {"ready": true}, then answers each line it reads with one line
    of JSON."""

    def __init__(self, script: str, path: Path) -> None:
        self.process = subprocess.Popen([sys.executable, "-c", script, str(path)], env=ENV,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert json.loads(self.readline()) == {"ready": True}

    def readline(self) -> str:
        assert self.process.stdout is not None
        return self.process.stdout.readline()

    def ask(self, line: str) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        result: dict[str, Any] = json.loads(self.readline())
        return result

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()
