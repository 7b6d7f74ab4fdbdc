"""Threads, processes and SIGKILL: group commit, the single-writer lock, and acknowledged
records surviving a kill at a random moment."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from helpers import strace_calls

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


# --- LOCK deleted under a live writer -------------------------------------------------------

LOSES_LOCK = textwrap.dedent("""
    import sys, walj
    log = walj.Log.open(sys.argv[1], segment_bytes=1024)
    log.append({"by": "a", "n": 1})
    print("ready", flush=True)
    sys.stdin.readline()  # meanwhile LOCK is deleted and a second writer appends
    operation = sys.argv[2]
    try:
        if operation == "append":
            log.append({"by": "a", "n": 2})
        elif operation == "append_many":
            log.append_many([{"by": "a", "n": 2}, {"by": "a", "n": 3}])
        else:
            log.rotate()
        print("written", flush=True)
    except walj.PoisonedError as exc:
        print("refused:", exc, flush=True)
    try:
        log.append({"by": "a", "n": 4})
        print("written", flush=True)
    except walj.PoisonedError:
        print("refused", flush=True)
    try:
        log.close()
    except walj.PoisonedError:
        pass
""")


@pytest.mark.parametrize("operation", ["append", "append_many", "rotate"])
def test_a_writer_whose_lock_was_deleted_writes_nothing_more(logdir: Path,
                                                            operation: str) -> None:
    """Writer A holds the log; LOCK is deleted; writer B opens it (a new LOCK) and appends.
    A's next write is refused before any byte reaches the directory: the segment does not hold
    seq 2 twice (`seq_repeat`), and A's seal does not land in B's active segment."""
    first = subprocess.Popen([sys.executable, "-c", LOSES_LOCK, str(logdir), operation],
                             env=ENV, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert first.stdout is not None and first.stdin is not None
    try:
        assert first.stdout.readline().strip() == "ready"
        (logdir / "LOCK").unlink()
        with walj.Log.open(logdir, segment_bytes=1024) as second:
            assert second.append({"by": "b", "n": 2}) == 2
            first.stdin.write("go\n")
            first.stdin.flush()
            said = first.stdout.readline()
            assert said.startswith("refused:") and "LOCK" in said, said
            assert first.stdout.readline().strip() == "refused"  # poisoned: for good
            assert second.append({"by": "b", "n": 3}) == 3
        assert first.wait(timeout=30) == 0
    finally:
        first.kill()
        first.wait()
    report = walj.verify(logdir)
    assert report.ok, report.problems
    assert [(r.seq, r.data["by"]) for r in walj.read(logdir)] == [(1, "a"), (2, "b"), (3, "b")]
    with walj.Log.open(logdir) as log:  # and a third writer opens it as it is
        assert log.last_seq == 3 and log.problems == [] and log.torn_tail is None


def test_a_writer_whose_lock_was_replaced_drops_nothing(tmp_path: Path) -> None:
    """drop_before writes a base marker and unlinks segments: a writer whose LOCK was replaced
    does neither."""
    path = tmp_path / "log"
    log = walj.Log.open(path, segment_bytes=1024)
    for n in range(40):
        log.append({"n": n, "pad": "x" * 60})
    before = sorted(p.name for p in path.iterdir())
    (path / "LOCK").unlink()
    (path / "LOCK").touch()
    with pytest.raises(walj.PoisonedError, match="replaced"):
        log.drop_before(log.last_seq)
    with pytest.raises(walj.PoisonedError):
        log.close()
    assert sorted(p.name for p in path.iterdir()) == before
    assert walj.verify(path).ok


STRACE = shutil.which("strace")

APPENDS = textwrap.dedent("""
    import sys, walj
    with walj.Log.open(sys.argv[1], segment_bytes=1024, sync=sys.argv[2]) as log:
        for i in range(12):
            log.append({"i": i, "pad": "x" * 60})
        log.append_many([{"i": i} for i in range(5)])
        log.rotate()
""")


@pytest.mark.skipif(STRACE is None, reason="strace is not installed")
@pytest.mark.parametrize("sync", ["always", "never"])
def test_every_write_to_a_segment_follows_a_check_of_the_lock(tmp_path: Path,
                                                              sync: str) -> None:
    """The order of system calls: between one write to a segment (a record, a batch, a seal,
    a new segment's header) and the next, the writer looks at LOCK again, so the window a
    deleted LOCK leaves open is one check-to-write, never a whole sync."""
    assert STRACE is not None
    out, path = tmp_path / "trace", tmp_path / "log"
    subprocess.run([STRACE, "-f", "-qq", "-o", str(out), "-e",
                    "trace=openat,write,pwrite64,newfstatat,fstatat64,statx,lstat",
                    sys.executable, "-c", APPENDS, str(path), sync], check=True, env=ENV)
    trace = out.read_text()
    lock = str(path / "LOCK")
    events: list[str] = []
    for line, (op, target) in zip(trace.splitlines(), strace_calls(trace), strict=True):
        if op == "write" and os.path.basename(target).startswith("seg-"):
            events.append("write")
        elif op in ("newfstatat", "fstatat64", "statx", "lstat") and f'"{lock}"' in line:
            events.append("check")
    writes = [i for i, event in enumerate(events) if event == "write"]
    assert len(writes) >= 12 + 1 + 2  # records, the batch, and at least one rotation
    for i in writes:
        assert i > 0 and events[i - 1] == "check", events[max(0, i - 3): i + 1]
