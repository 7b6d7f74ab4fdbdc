"""A fork server for SIGKILL children: walj imported once, each child forked from here.

Starting a fresh interpreter and importing walj costs more CPU than most children spend
before their kill; forking a process that has already done it gives every trial that time
back, and the child is still a real process, killed by a real SIGKILL.

Usage: zygote.py SOCKET_PATH   (runs until its stdin reaches end of file)

Protocol, one Unix stream connection per child:
  client -> server  one JSON line {"script": path, "args": [...], "cwd": path or null}, sent
                    with two descriptors (SCM_RIGHTS): the oracle pipe's write end (its number
                    in the child is appended to args) and the pipe for the child's stderr
  server -> client  "pid N"  once forked
  client -> server  "ok"     once the client holds a pidfd of the child, so that the server
                    never reaps (and frees the pid of) a child the client could still signal
  server -> client  "exit S" the child's wait status, as waitpid gave it
Single-threaded on purpose: a fork from a process with other threads can inherit held locks.
"""

from __future__ import annotations

import json
import os
import runpy
import select
import socket
import sys
import traceback

import walj  # noqa: F401 - the point of the server: every child starts with walj imported


def run_child(request: dict[str, object], oracle_fd: int, stderr_fd: int) -> None:
    """In the forked child: become the script's __main__, and never return."""
    code = 1
    try:
        os.dup2(stderr_fd, 2)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
        os.close(stderr_fd)
        cwd = request.get("cwd")
        if isinstance(cwd, str):
            os.chdir(cwd)
        script = str(request["script"])
        args = [str(a) for a in request["args"]]  # type: ignore[attr-defined]
        sys.argv = [script, *args, str(oracle_fd)]
        sys.path[0] = os.path.dirname(script)
        runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: B036 - reported as the interpreter would, then exit 1
        traceback.print_exc()
    finally:
        sys.stderr.flush()
        os._exit(code)


def serve(path: str) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # The client connects once the path exists: bound under another name and renamed once
    # listening, since a connect between bind and listen is refused (ECONNREFUSED).
    listener.bind(path + ".new")
    listener.listen(64)
    os.rename(path + ".new", path)
    waiting: dict[socket.socket, int] = {}  # connection -> child pid, until the client's ok
    acked: dict[int, socket.socket] = {}  # child pid -> connection, to report its exit
    stdin = sys.stdin.fileno()
    while True:
        readable, _, _ = select.select([listener, stdin, *waiting], [], [], 0.002)
        if stdin in readable and not os.read(stdin, 1):
            return  # the test process is gone: so is its server
        if listener in readable:
            conn, _ = listener.accept()
            message, fds, _, _ = socket.recv_fds(conn, 65536, 2)
            request = json.loads(message.decode())
            pid = os.fork()
            if pid == 0:
                listener.close()
                for other in [*waiting, *acked.values()]:
                    other.close()
                conn.close()
                run_child(request, fds[0], fds[1])
            for fd in fds:
                os.close(fd)
            conn.sendall(f"pid {pid}\n".encode())
            waiting[conn] = pid
        for conn in [c for c in waiting if c in readable]:
            pid = waiting.pop(conn)
            conn.recv(16)  # "ok" (or end of file: the client gave up, reap it all the same)
            acked[pid] = conn
        for pid in list(acked):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                conn = acked.pop(pid)
                try:
                    conn.sendall(f"exit {status}\n".encode())
                except OSError:
                    pass  # the client is gone; the child is reaped all the same
                conn.close()


if __name__ == "__main__":
    serve(sys.argv[1])
