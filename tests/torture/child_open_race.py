"""Open-race workload: wait for the starting gun, open the log, report, append, hold, close.

Usage: child_open_race.py LOGDIR NAME LOCK_TIMEOUT GO_FD HOLD_FD ORACLE_FD
Oracle lines, each prefixed with NAME: "ready", then "won", "appended <seq>" and "closed"; or
"lost <exception type> <message>".
With LOCK_TIMEOUT 0 a winner holds the log until HOLD_FD reaches end of file, so it is still
holding it when every other child tries.
"""

from __future__ import annotations

import os
import sys

import walj


def main() -> None:
    path, name, timeout, go, hold, oracle = sys.argv[1:7]
    out = int(oracle)

    def say(line: str) -> None:
        os.write(out, f"{name} {line}\n".encode())

    say("ready")
    os.read(int(go), 1)  # the starting gun: one byte for everyone
    try:
        log = walj.Log.open(path, lock_timeout=float(timeout), segment_bytes=1024)
    except Exception as exc:  # reported to the parent, which decides what is allowed
        say(f"lost {type(exc).__name__} {str(exc).replace(chr(10), ' ')}")
        return
    say("won")
    seq = log.append({"by": name, "pad": "x" * 300})
    say(f"appended {seq}")
    if float(timeout) == 0:
        os.read(int(hold), 1)  # hold the log until the parent closes the pipe
    log.close()
    say("closed")


if __name__ == "__main__":
    main()
