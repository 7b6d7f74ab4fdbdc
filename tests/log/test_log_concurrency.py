"""Threads, processes and SIGKILL: group commit, the single-writer lock, and acknowledged
records surviving a kill at a random moment."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import walj

REPO = str(Path(__file__).resolve().parents[2])
ENV = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}


def test_eight_threads_batch_mode_all_records_contiguous(logdir: Path) -> None:
    per_thread = 5000
    results: dict[int, list[int]] = {}
    with walj.Log.open(logdir, sync="batch", segment_bytes=256 * 1024) as log:
        def worker(t: int) -> None:
            results[t] = [log.append({"t": t, "n": n}) for n in range(per_thread)]

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert log.durable_seq == 8 * per_thread
    seen = {}
    for record in walj.read(logdir):
        seen[record.seq] = (record.data["t"], record.data["n"])
    assert sorted(seen) == list(range(1, 8 * per_thread + 1))
    for t, seqs in results.items():
        assert [seen[s] for s in seqs] == [(t, n) for n in range(per_thread)]
    assert walj.verify(logdir).ok


def test_second_open_in_the_same_process_is_refused(logdir: Path) -> None:
    with walj.Log.open(logdir):
        with pytest.raises(walj.LockedError, match="this process"):
            walj.Log.open(logdir)
    with walj.Log.open(logdir) as log:  # released on close
        assert log.last_seq == 0


HOLDER = textwrap.dedent("""
    import sys, time, walj
    log = walj.Log.open(sys.argv[1])
    print("locked", flush=True)
    time.sleep(60)
""")


def test_second_process_gets_locked_error_naming_the_holder(logdir: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(logdir)], env=ENV,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with pytest.raises(walj.LockedError) as info:
            walj.Log.open(logdir, lock_timeout=0.2)
        assert f"pid {holder.pid}" in str(info.value)
        assert info.value.owner is not None
    finally:
        holder.kill()
        holder.wait()
    with walj.Log.open(logdir, lock_timeout=5) as log:  # a killed holder's lock is released
        assert log.last_seq == 0


APPENDER = textwrap.dedent("""
    import sys, walj
    log = walj.Log.open(sys.argv[1], sync=sys.argv[2], segment_bytes=int(sys.argv[3]))
    n = 0
    while True:
        n += 1
        seq = log.append({"n": n, "pad": "x" * (n % 50)})
        sys.stdout.write(f"{seq}\\n")
        sys.stdout.flush()
""")

KILL_TRIALS = int(os.environ.get("WALJ_KILL_TRIALS", "50"))


def test_sigkill_during_appends_loses_no_acknowledged_record(tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("WALJ_SEED", "20261129")))
    for trial in range(KILL_TRIALS):
        path = tmp_path / f"trial{trial}"
        mode = rng.choice(["always", "batch"])
        segment_bytes = rng.choice([1024, 4096, 1 << 20])
        acked: list[int] = []
        for _round in range(2):  # kill, reopen, append more, kill again
            child = subprocess.Popen(
                [sys.executable, "-c", APPENDER, str(path), mode, str(segment_bytes)],
                env=ENV, stdout=subprocess.PIPE,
            )
            assert child.stdout is not None
            first = child.stdout.readline()  # the child is appending
            time.sleep(rng.uniform(0.0, 0.05))
            os.kill(child.pid, signal.SIGKILL)
            rest = child.stdout.read()
            child.wait()
            acked += [int(x) for x in (first + rest).split()]
            records = list(walj.read(path))
            seqs = [r.seq for r in records]
            assert seqs == list(range(1, len(seqs) + 1))
            assert set(acked) <= set(seqs), f"trial {trial}: acknowledged seq lost"
            with walj.Log.open(path) as log:
                assert log.last_seq >= max(acked)
        assert walj.verify(path).ok
