"""Running a workload child, killing it with SIGKILL at a random moment, and reading its oracle.

Children are forked from a server that has imported walj already (tests/torture/zygote.py),
where the platform can signal a process it did not start without a pid race (pidfd, Linux);
elsewhere each child is a fresh interpreter."""

from __future__ import annotations

import atexit
import json
import os
import random
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

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


FORK_SERVER = hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal") \
    and hasattr(socket, "send_fds")
_server_lock = threading.Lock()
_server: list[str] = []  # the fork server's socket path, once started


def _fork_server() -> str:
    with _server_lock:
        if not _server:
            folder = tempfile.mkdtemp(prefix="walj-zygote-")
            path = os.path.join(folder, "socket")
            proc = subprocess.Popen([sys.executable, str(HERE / "zygote.py"), path],
                                    env=ENV, stdin=subprocess.PIPE)
            deadline = time.monotonic() + 30
            while not os.path.exists(path):
                assert proc.poll() is None, "the fork server died on start"
                assert time.monotonic() < deadline, "the fork server never listened"
                time.sleep(0.005)

            def stop() -> None:
                assert proc.stdin is not None
                proc.stdin.close()  # its end of file: the server returns
                proc.wait(timeout=30)
                shutil.rmtree(folder, ignore_errors=True)

            atexit.register(stop)
            _server.append(path)
        return _server[0]


class _Forked:
    """A child forked by the fork server, with the part of Popen's interface used here."""

    def __init__(self, script: Path, args: list[str], cwd: Path | None, oracle_fd: int,
                 stderr_fd: int) -> None:
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._conn.connect(_fork_server())
        request = {"script": str(script), "args": args, "cwd": None if cwd is None else str(cwd)}
        socket.send_fds(self._conn, [json.dumps(request).encode()], [oracle_fd, stderr_fd])
        self._replies = self._conn.makefile("rb")
        self.pid = int(self._replies.readline().split()[1])
        self._pidfd = os.pidfd_open(self.pid)  # before the "ok": the server reaps only after it
        self._conn.sendall(b"ok\n")
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._pidfd], [], [], 0)[0]:
            self.wait()  # exited: its status is on its way
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    def wait(self) -> int:
        if self.returncode is None:
            line = self._replies.readline().split()
            assert line and line[0] == b"exit", f"the fork server lost child {self.pid}"
            self.returncode = os.waitstatus_to_exitcode(int(line[1]))
            os.close(self._pidfd)
            self._replies.close()
            self._conn.close()
        return self.returncode


def _start(script: str, args: list[str], cwd: Path | None, oracle_fd: int) -> tuple[Any, int]:
    """The child, and the read end of its stderr."""
    if FORK_SERVER:
        err_read, err_write = os.pipe()
        try:
            return _Forked(HERE / script, args, cwd, oracle_fd, err_write), err_read
        except BaseException:
            os.close(err_read)
            raise
        finally:
            os.close(err_write)
    child = subprocess.Popen(
        [sys.executable, str(HERE / script), *args, str(oracle_fd)],
        env=ENV, pass_fds=(oracle_fd,), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        cwd=cwd,
    )
    assert child.stderr is not None
    return child, os.dup(child.stderr.fileno())


def run_and_kill(script: str, args: Iterable[str], rng: random.Random, *,
                 cwd: Path | None = None, max_wait: float = 0.12) -> Kill:
    """Start `script` with an oracle pipe as its last argument; SIGKILL it at a random moment,
    sometimes before it has opened anything, usually some time after its first oracle line."""
    read_fd, write_fd = os.pipe()
    try:
        child, err_fd = _start(script, list(args), cwd, write_fd)
    except BaseException:
        os.close(read_fd)
        raise
    finally:
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
            child.kill()  # SIGKILL
        child.wait()
        reader.join(timeout=30)
        with os.fdopen(err_fd, "rb", closefd=False) as err_file:
            err = err_file.read().decode(errors="replace")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if isinstance(child, subprocess.Popen) and child.stderr is not None:
            child.stderr.close()
        os.close(err_fd)
        os.close(read_fd)
    text = b"".join(chunks).decode()
    assert text == "" or text.endswith("\n"), "an oracle line is one write and cannot tear"
    return Kill(text.splitlines(), killed, child.returncode, err)


def run_trials(count: int, trial: Callable[[int], None]) -> None:
    """Run `trial(i)` for i in range(count), a few at a time (children use the other cores)."""
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        for future in [pool.submit(trial, i) for i in range(count)]:
            future.result()
