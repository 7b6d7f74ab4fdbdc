"""Concurrency: a reader following a writer that rotates, processes racing to open one
directory, and threads appending in batch mode while a crash is injected."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import zlib
from pathlib import Path

import pytest
from budget import TALLY, rng_for, scaled
from faultfs import FaultyFS, SimulatedCrash, abandon
from powercut import POWER_CUTS, forget_locks_of_dead_process
from sigkill import ENV, HERE

import walj


def test_reader_follows_while_the_writer_rotates(tmp_path: Path) -> None:
    """A reader calls walj.read from where it stopped, again and again, while another process
    appends with 1 KiB segments: it sees every record once, in order, and never damage."""
    for trial, sync in enumerate(["never", "batch", "always"] * scaled(1)):
        path = tmp_path / f"log{trial}"
        count = 1500 if sync == "always" else 4000
        read_fd, write_fd = os.pipe()
        writer = subprocess.Popen(
            [sys.executable, str(HERE / "child_writer.py"), str(path), sync, str(count),
             str(write_fd)], env=ENV, pass_fds=(write_fd,), stderr=subprocess.PIPE)
        os.close(write_fd)
        next_seq, reads, segments_seen = 1, 0, set()
        try:
            while True:
                finished = writer.poll() is not None
                if path.exists():
                    for record in walj.read(path, start_seq=next_seq):
                        assert record.seq == next_seq, f"{sync}: got {record.seq}, not {next_seq}"
                        assert record.data["n"] == next_seq - 1
                        assert record.data["pad"] == "y" * ((next_seq - 1) % 90)
                        next_seq += 1
                    reads += 1
                    segments_seen.add(len(list(path.glob("seg-*.jsonl"))))
                if finished:
                    break
        finally:
            if writer.poll() is None:
                writer.kill()
            writer.wait()
        done = os.read(read_fd, 100).decode()
        os.close(read_fd)
        assert writer.returncode == 0, writer.stderr.read() if writer.stderr else ""
        assert done == f"done {count}\n"
        assert next_seq == count + 1, f"{sync}: read {next_seq - 1} of {count}"
        assert len(segments_seen) > 2, "the reader never saw a rotation happen"
        TALLY.add(trials_concurrency=1, checked=count)
        print(f"follow {sync}: {reads} reads over {max(segments_seen)} segments")


def race(path: Path, k: int, timeout: float) -> dict[str, list[str]]:
    """Start k children together; return each one's oracle lines."""
    go_r, go_w = os.pipe()
    hold_r, hold_w = os.pipe()
    oracle_r, oracle_w = os.pipe()
    fds = (go_r, hold_r, oracle_w)
    children = [subprocess.Popen(
        [sys.executable, str(HERE / "child_open_race.py"), str(path), f"p{i}", str(timeout),
         *map(str, fds)], env=ENV, pass_fds=fds, stderr=subprocess.PIPE) for i in range(k)]
    for fd in fds:
        os.close(fd)
    lines: dict[str, list[str]] = {f"p{i}": [] for i in range(k)}
    with os.fdopen(oracle_r) as oracle:
        def take() -> None:
            name, _, rest = oracle.readline().rstrip("\n").partition(" ")
            assert name in lines, f"oracle ended early: {lines}"
            lines[name].append(rest)

        while sum(len(v) for v in lines.values()) < k:  # every child is ready
            take()
        os.write(go_w, b"g" * k)
        os.close(go_w)
        if timeout == 0:  # everyone has tried while the winner holds the log
            while sum(len(v) for v in lines.values()) < 2 * k + 1:
                take()
        os.close(hold_w)
        for line in oracle:
            name, _, rest = line.rstrip("\n").partition(" ")
            lines[name].append(rest)
    for child in children:
        child.wait(timeout=60)
        assert child.returncode == 0, child.stderr.read() if child.stderr else ""
        if child.stderr:
            child.stderr.close()
    return lines


@pytest.mark.parametrize("exists", [False, True], ids=["new directory", "existing log"])
def test_processes_racing_to_open(tmp_path: Path, exists: bool) -> None:
    """Four processes open at once without waiting: exactly one gets the log, the others get
    LockedError (nothing else), and the log holds the winner's record."""
    for trial in range(scaled(4)):
        path = tmp_path / f"log{trial}"
        if exists:
            walj.Log.open(path).close()
        lines = race(path, 4, 0)
        won = [name for name, said in lines.items() if "won" in said]
        lost = {name: said[1] for name, said in lines.items() if name not in won}
        assert len(won) == 1, lines
        assert all(said.startswith("lost LockedError") for said in lost.values()), lost
        assert [r.data["by"] for r in walj.read(path)] == won
        assert walj.verify(path).ok
        TALLY.add(trials_concurrency=1)


def test_processes_queueing_to_open(tmp_path: Path) -> None:
    """Four processes open at once and wait for the lock: each gets it in turn."""
    for trial in range(scaled(2)):
        path = tmp_path / f"log{trial}"
        lines = race(path, 4, 30)
        assert all(said[1] == "won" for said in lines.values()), lines
        records = list(walj.read(path))
        assert [r.seq for r in records] == [1, 2, 3, 4]
        assert sorted(r.data["by"] for r in records) == sorted(lines)
        assert walj.verify(path).ok
        TALLY.add(trials_concurrency=1)


def record(t: int, n: int) -> dict[str, object]:
    return {"t": t, "n": n, "h": zlib.crc32(f"{t}:{n}".encode())}


def threads_trial(tmp_path: Path, trial: int) -> None:
    rng = rng_for(f"threads-crash-{trial}")
    path = tmp_path / f"log{trial}"
    fs = FaultyFS(freeze_on_crash=True)
    op = rng.choice(["sync", "write", "any", "rename"])
    fs.crash_at(op, rng.randint(1, {"sync": 60, "write": 300, "any": 600, "rename": 3}[op]),
                after=rng.random() < 0.5)
    acked: dict[int, tuple[int, int]] = {}
    try:
        log = walj.Log.open(path, sync="batch", segment_bytes=rng.choice([1024, 4096, 65536]),
                            _fs=fs)
    except SimulatedCrash:  # the crash came while opening: nothing was acknowledged
        fs.crash(rng.choice(POWER_CUTS), rng)
        forget_locks_of_dead_process(path)
        walj.Log.open(path).close()
        TALLY.add(trials_concurrency=1, faults=2)
        return
    guard = threading.Lock()
    start = threading.Barrier(8)

    def worker(t: int) -> None:
        start.wait()
        for n in range(400):
            try:
                seq = log.append(record(t, n))
            except (SimulatedCrash, walj.PoisonedError):
                return
            with guard:
                acked[seq] = (t, n)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    crashed = fs.dead
    cut = rng.choice(POWER_CUTS)
    fs.crash(cut, rng)
    abandon(log)
    with walj.Log.open(path) as reopened:
        held = reopened.last_seq
    records = {r.seq: (r.data["t"], r.data["n"]) for r in walj.read(path)}
    assert sorted(records) == list(range(1, held + 1))
    lost = [seq for seq, value in acked.items() if records.get(seq) != value]
    TALLY.add(trials_concurrency=1, faults=2 if crashed else 1, checked=len(acked) - len(lost),
              lost=len(lost))
    assert not lost, f"trial {trial} ({op}, cut {cut}): acknowledged seqs lost: {lost[:10]}"
    per_thread: dict[int, list[int]] = {}
    for seq in sorted(records):
        t, n = records[seq]
        per_thread.setdefault(t, []).append(n)
    for t, ns in per_thread.items():
        assert ns == list(range(len(ns))), f"thread {t}'s records out of order or repeated"


@pytest.mark.usefixtures("thread_failures")
def test_threads_append_in_batch_mode_while_a_crash_is_injected(tmp_path: Path) -> None:
    """Eight threads append in batch mode; at a random call the process 'dies' (every later
    call of every thread fails), then a power cut drops, tears, zeroes or reorders what was
    unsynced. Every append that returned is on disk after the reopen."""
    for trial in range(scaled(25)):
        threads_trial(tmp_path, trial)
