"""SIGKILL workload: a live writer that holds a journal open and takes resolution requests.

Usage: child_request_writer.py LOGDIR SYNC SEED ROUND ORACLE_FD

It answers is_blocked() and runs a turn now and then (a dispatch while unblocked), so requests
are applied by the pick-up before an answer and by the idle watcher. Oracle lines:
  O             the journal is open (requests left before it are answered); also the file
                `open-ROUND` beside LOGDIR, for the askers to start once it is
  T <turn>      a turn started
"""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path

import walj


def main() -> None:
    path, mode, seed, rnd, fd = sys.argv[1:6]
    rng = random.Random(f"{seed}:{rnd}:request-writer")
    out = int(fd)

    def say(line: str) -> None:
        os.write(out, (line + "\n").encode())

    # An asker of the round before may still be applying its own request: wait for the lock.
    journal = walj.ToolJournal.open(path, sync=mode, segment_bytes=2048, lock_timeout=10)
    say("O")
    (Path(path).parent / f"open-{rnd}").touch()
    while True:
        time.sleep(rng.uniform(0.0, 0.02))
        if rng.random() < 0.3 or journal.is_blocked():
            continue  # an idle writer: its watcher thread takes requests
        with journal.turn() as turn:
            say(f"T {turn.sequence}")
            turn.dispatch("ok", {"pad": "p" * rng.choice([0, 300])}, handler=lambda pad: pad)


if __name__ == "__main__":
    main()
