"""Running a workload child, killing it with SIGKILL at a random moment, and reading its oracle."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = str(HERE.parents[1])
ENV = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
WORKERS = max(1, min(4, os.cpu_count() or 1))


class Kill:
    """One child run: its oracle lines, and whether it was killed or died on its own."""

    def __init__(self, lines: list[str], killed: bool, returncode: int, stderr: str) -> None:
        self.lines = lines
        self.killed = killed
        self.returncode = returncode
        self.stderr = stderr


def run_and_kill(script: str, args: Iterable[str], rng: random.Random, *,
                 cwd: Path | None = None, max_wait: float = 0.12) -> Kill:
    """Start `script` with an oracle pipe as its last argument; SIGKILL it at a random moment,
    sometimes before it has opened anything, usually some time after its first oracle line."""
    read_fd, write_fd = os.pipe()
    child = subprocess.Popen(
        [sys.executable, str(HERE / script), *args, str(write_fd)],
        env=ENV, pass_fds=(write_fd,), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        cwd=cwd,
    )
    os.close(write_fd)
    chunks: list[bytes] = []
    first = threading.Event()

    def drain() -> None:
        while True:
            data = os.read(read_fd, 65536)
            if not data:
                break
            chunks.append(data)
            first.set()
        first.set()

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        if rng.random() < 0.15:
            time.sleep(rng.uniform(0.0, 0.25))  # anywhere from start-up to open and recovery
        else:
            first.wait(timeout=30)
            time.sleep(rng.uniform(0.0, max_wait))
        killed = child.poll() is None
        if killed:
            os.kill(child.pid, signal.SIGKILL)
        child.wait()
        reader.join(timeout=30)
        assert child.stderr is not None
        err = child.stderr.read().decode(errors="replace")
        child.stderr.close()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        os.close(read_fd)
    text = b"".join(chunks).decode()
    assert text == "" or text.endswith("\n"), "an oracle line is one write and cannot tear"
    return Kill(text.splitlines(), killed, child.returncode, err)


def run_trials(count: int, trial: Callable[[int], None]) -> None:
    """Run `trial(i)` for i in range(count), a few at a time (children use the other cores)."""
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        for future in [pool.submit(trial, i) for i in range(count)]:
            future.result()
