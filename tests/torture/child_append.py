"""SIGKILL workload: random appends in one sync mode, each acknowledgement written to a pipe.

Usage: child_append.py LOGDIR SYNC SEGMENT_BYTES SEED ROUND ORACLE_FD

Oracle lines (each one os.write, so a kill never splits one):
  O <last_seq>        the log is open and holds last_seq records
  A <seq> <k>         append returned seq for this round's k-th record
  C                   the log was closed cleanly (it is then reopened)
Every record is {"r": ROUND, "k": k, "pad": ..., "h": crc32 of those}, so the parent can check
any record it finds without knowing which of them were acknowledged.
"""

from __future__ import annotations

import os
import random
import sys
import zlib

import walj


def make_record(rnd: int, k: int, rng: random.Random) -> dict[str, object]:
    size = rng.choice([0, 10, 40, 200, 900, 5000])
    pad = "".join(rng.choice("abcdefgh\u00e9\u4e2d") for _ in range(rng.randint(0, size)))
    return {"r": rnd, "k": k, "pad": pad, "h": zlib.crc32(f"{rnd}:{k}:{pad}".encode())}


def main() -> None:
    path, mode, segment_bytes, seed, rnd, fd = sys.argv[1:7]
    rng = random.Random(f"{seed}:{rnd}")
    out = int(fd)
    r = int(rnd)

    def say(line: str) -> None:
        os.write(out, line.encode())

    def open_log() -> walj.Log:
        log = walj.Log.open(path, sync=mode, segment_bytes=int(segment_bytes),
                            max_record_bytes=16384, sync_interval_ms=rng.choice([1, 5, 20]),
                            lock_timeout=10)
        say(f"O {log.last_seq}\n")
        return log

    log = open_log()
    k = 0
    while True:
        op = rng.random()
        if op < 0.70:
            seq = log.append(make_record(r, k, rng), durable=rng.random() < 0.05)
            say(f"A {seq} {k}\n")
            k += 1
        elif op < 0.88:
            batch = [make_record(r, k + i, rng) for i in range(rng.randint(1, 6))]
            seqs = log.append_many(batch, durable=rng.random() < 0.2)
            say("".join(f"A {seq} {k + i}\n" for i, seq in enumerate(seqs)))
            k += len(batch)
        elif op < 0.98:
            log.sync()
        else:
            log.close()
            say("C\n")
            log = open_log()


if __name__ == "__main__":
    main()
