"""Writer for a following reader: appends COUNT records to a log with tiny segments.

Usage: child_writer.py LOGDIR SYNC COUNT ORACLE_FD   (oracle: "done <last seq>")
"""

from __future__ import annotations

import os
import sys

import walj


def main() -> None:
    path, sync, count, oracle = sys.argv[1:5]
    with walj.Log.open(path, sync=sync, segment_bytes=1024) as log:
        n = 0
        while n < int(count):
            if n % 7 == 3:
                batch = [{"n": n + i, "pad": "y" * ((n + i) % 90)} for i in range(5)]
                log.append_many(batch)
                n += len(batch)
            else:
                log.append({"n": n, "pad": "y" * (n % 90)})
                n += 1
        os.write(int(oracle), f"done {log.last_seq}\n".encode())


if __name__ == "__main__":
    main()
