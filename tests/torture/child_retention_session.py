"""Retention torture workload: make one tool journal with the real walj API, as an agent would.

Usage: child_retention_session.py PATH KIND TURNS SEGMENT_BYTES SEED QUARANTINE ORACLE_FD

KIND is `ended` (turns, then ToolJournal.end), `idle` (turns, closed, no end), `blocked` (turns,
then a tool that never returns: the parent SIGKILLs the child inside it, which leaves an
ambiguous call), or `hold` (open the journal and keep it open until killed: a live writer).
With QUARANTINE 1, a torn tail is left after the turns (a record cut short, as a crash leaves
it) and the journal reopened, which moves it to `quarantine/`.

Each oracle line is one os.write, made as soon as the fact is true:
  O             the journal is open
  T <call id>   inside the tool the parent kills us in (its intent is durable)
  D             done: the journal is closed (or ended)
"""

from __future__ import annotations

import os
import random
import sys
import time

import walj


def main() -> None:
    path, kind, turns, segment_bytes, seed, quarantine, fd = sys.argv[1:8]
    rng = random.Random(f"{seed}:{os.path.join(*path.split(os.sep)[-2:])}")  # not the temp dir
    out = int(fd)

    def say(line: str) -> None:
        os.write(out, (line + "\n").encode())

    def lookup(order: int) -> dict[str, object]:
        return {"order": order, "status": rng.choice(["shipped", "late", "lost"]),
                "note": "x" * rng.randint(0, 120)}

    def send(to: str) -> str:
        return f"sent to {to}"

    def hang(to: str) -> None:
        say(f"T {to}")
        time.sleep(600)  # the parent's SIGKILL lands here: the call's outcome is unknown

    # sync="never": a SIGKILL loses nothing the kernel accepted, and the tree is made faster.
    def open_journal() -> walj.ToolJournal:
        return walj.ToolJournal.open(path, tools={"lookup": lookup, "send": send, "hang": hang},
                                     segment_bytes=int(segment_bytes), sync="never",
                                     lock_timeout=10)

    # Call ids new to this session when it is made in several goes (a fork goes on after it).
    go = sum(name.startswith("seg-") for name in os.listdir(path)) if os.path.isdir(path) else 0
    journal = open_journal()
    say("O")
    if kind == "hold":
        time.sleep(600)  # a live writer: it holds the lock until the parent kills it
    for n in range(int(turns)):
        with journal.turn() as turn:
            turn.dispatch("lookup", {"order": rng.randrange(10**6)}, call_id=f"{seed}-{go}-{n}-a")
            if rng.random() < 0.5:
                turn.dispatch("send", {"to": f"user{n}@example.com"}, call_id=f"{seed}-{go}-{n}-b")
    if quarantine == "1":
        journal.close()
        last = max(name for name in os.listdir(path) if name.startswith("seg-"))
        with open(os.path.join(path, last), "ab") as segment:
            segment.write(b'{"xxh64":"0000000000000000","seq":' + str(rng.random()).encode())
        journal = open_journal()  # cuts the torn tail to quarantine/
    if kind == "blocked":
        with journal.turn() as turn:
            turn.dispatch("hang", {"to": "ada@example.com"}, call_id=f"{seed}-{go}-hang")
    if kind == "ended":
        journal.end()
    else:
        journal.close()
    say("D")


if __name__ == "__main__":
    main()
