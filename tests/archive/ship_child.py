"""A child process that ships a session and kills itself with SIGKILL at the N-th line event of
walj/archive's own code (N = 0: never; it then prints how many line events the ship took)."""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import walj.archive

ARCHIVE_CODE = os.path.dirname(walj.archive.__file__)


def main() -> None:
    session, url, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
    count = 0

    def local(frame: Any, event: str, arg: Any) -> Any:
        nonlocal count
        if event == "line":
            count += 1
            if count == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
        return local

    def calls(frame: Any, event: str, arg: Any) -> Any:
        return local if frame.f_code.co_filename.startswith(ARCHIVE_CODE) else None

    sys.settrace(calls)
    try:
        walj.archive.ship(session, url)
    finally:
        sys.settrace(None)
    print(count)


if __name__ == "__main__":
    main()
