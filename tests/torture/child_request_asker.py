"""SIGKILL workload: `walj resolve` asking a live writer (or, once it is gone, applying its
request itself) to settle one blocker.

Usage: child_request_asker.py LOGDIR TARGET OUTCOME ACTOR WAIT ORACLE_FD

TARGET is an execution id, or `turn:N` for a turn. Runs the CLI's own code in this process.
Oracle lines:
  S                                          started (the kill lands in the command)
  A <exit code> <request id or -> <status or ->   the command returned (its report)
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys

from walj.cli import main as cli_main


def main() -> None:
    path, target, outcome, actor, wait, fd = sys.argv[1:7]
    os.write(int(fd), b"S\n")
    args = ["resolve", path]
    if target.startswith("turn:"):
        args += ["--turn", target[5:]]
    else:
        args += [target, "--outcome", outcome]
    args += ["--note", "settled by the SIGKILL torture", "--actor", actor, "--wait", wait,
             "--json"]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(io.StringIO()):
        code = cli_main(args)
    report = json.loads(printed.getvalue()) if printed.getvalue() else {}
    os.write(int(fd), (f"A {code} {report.get('request_id') or '-'} "
                       f"{report.get('status') or '-'}\n").encode())


if __name__ == "__main__":
    main()
