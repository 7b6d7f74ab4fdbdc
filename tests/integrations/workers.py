"""Test helper: drive tests/integrations/sessions_worker.py, one worker process of a pool that
serves LangGraph thread "user:42" through WaljMiddleware, one tool call per line."""

from __future__ import annotations

import json
import selectors
import subprocess
import sys
from pathlib import Path
from typing import Any

import sdk_fakes as fx

WORKER = Path(__file__).with_name("sessions_worker.py")


class Worker:
    """A running sessions_worker.py: one run of a `send` call per line it is sent."""

    def __init__(self, root: Path, effects: Path, name: str) -> None:
        self.name = name
        self.process = subprocess.Popen(
            [sys.executable, str(WORKER), str(root), str(effects), name],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=fx.child_env())

    def send(self, call_id: str, what: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(f"{call_id} {what}\n")
        self.process.stdin.flush()

    def line(self) -> str:
        assert self.process.stdout is not None and self.process.stderr is not None
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            if not selector.select(fx.HANG_GUARD):
                raise AssertionError(f"worker {self.name} said nothing")
        line = self.process.stdout.readline().strip()
        if not line:
            self.process.wait(fx.HANG_GUARD)
            raise AssertionError(self.process.stderr.read())
        return line

    def run(self, call_id: str, what: str) -> dict[str, Any]:
        self.send(call_id, what)
        answer: dict[str, Any] = json.loads(self.line())
        return answer

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()
