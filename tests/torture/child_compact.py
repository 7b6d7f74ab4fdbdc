"""SIGKILL workload: appends and drops of the oldest segments, each step written to a pipe.

Usage: child_compact.py LOGDIR SYNC SEED ROUND ORACLE_FD

Oracle lines (each one os.write, so a kill never splits one):
  O <last_seq>        the log is open and holds records up to last_seq
  A <seq> <k>         append returned seq for this round's k-th record
  d <seq>             drop_before(seq) is about to be called (records below seq may go)
  D <seq> <count>     drop_before(seq) returned, having removed count segment files
Every record is {"r": ROUND, "k": k, "pad": ..., "h": crc32 of those}.
"""

from __future__ import annotations

import os
import random
import sys
import zlib

import walj


def make_record(rnd: int, k: int, rng: random.Random) -> dict[str, object]:
    pad = "x" * rng.choice([0, 10, 40, 200, 700])
    return {"r": rnd, "k": k, "pad": pad, "h": zlib.crc32(f"{rnd}:{k}:{pad}".encode())}


def main() -> None:
    path, mode, seed, rnd, fd = sys.argv[1:6]
    rng = random.Random(f"{seed}:{rnd}")
    out = int(fd)
    r = int(rnd)

    def say(line: str) -> None:
        os.write(out, line.encode())

    log = walj.Log.open(path, sync=mode, segment_bytes=1024, lock_timeout=10)
    say(f"O {log.last_seq}\n")
    k = 0
    while True:
        if rng.random() < 0.85 or log.last_seq < 2:
            seq = log.append(make_record(r, k, rng))
            say(f"A {seq} {k}\n")
            k += 1
        else:
            target = rng.randint(1, log.last_seq + 1)
            say(f"d {target}\n")
            say(f"D {target} {log.drop_before(target)}\n")


if __name__ == "__main__":
    main()
