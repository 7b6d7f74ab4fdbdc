"""Preallocated active segments (docs/FORMAT.md, *The end of a segment's data*): the writer
grows the active segment in chunks of zeros ahead of its data, writes records into them, trims
them off before a seal and on close, and settles an interrupted write from its bytes."""

from __future__ import annotations

import errno
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from faultfs import FaultyFS, abandon
from helpers import all_data, data_size, make_records, segments, strace_calls

import walj
from walj.log._rotation import FIRST_CHUNK, MAX_CHUNK
from walj.log.fs import FileSystem

STRACE = shutil.which("strace")
ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}


def zeros_ahead(segment: Path) -> int:
    return segment.stat().st_size - data_size(segment)


def test_an_open_segment_holds_zeros_ahead_of_its_data_and_close_trims_them(
        tmp_path: Path) -> None:
    path = tmp_path / "log"
    log = walj.Log.open(path)
    log.append({"n": 1})
    last = segments(path)[-1]
    assert last.stat().st_size == FIRST_CHUNK
    body = last.read_bytes()
    assert body[data_size(last):].count(0) == FIRST_CHUNK - data_size(last)
    log.close()
    assert zeros_ahead(last) == 0 and last.read_bytes().endswith(b"\n")
    assert all_data(path) == [{"n": 1}]


def test_the_zeros_ahead_stay_within_the_bound_as_the_segment_grows(tmp_path: Path) -> None:
    """An open log holds at most MAX_CHUNK of zeros, and while its segment is smaller than
    FIRST_CHUNK at most FIRST_CHUNK; a write that passes the zeros extends them, never
    more than the segment's size."""
    path = tmp_path / "log"
    with walj.Log.open(path, sync="never", segment_bytes=8 << 20) as log:
        last = segments(path)[-1]
        sizes = set()
        while last.stat().st_size < 6 << 20:
            log.append_many([{"pad": "p" * 4000}] * 16)
            data = data_size(last)
            ahead = last.stat().st_size - data
            assert 0 <= ahead <= min(MAX_CHUNK, max(FIRST_CHUNK, data)), (data, ahead)
            sizes.add(last.stat().st_size)
        assert len(sizes) < 30, "extended far more often than in growing chunks"
    assert zeros_ahead(last) == 0


def test_a_thousand_idle_open_logs_hold_at_most_a_first_chunk_each(tmp_path: Path) -> None:
    logs = [walj.Log.open(tmp_path / f"s{i}") for i in range(1000)]
    try:
        for log in logs:
            log.append({"turn": 1})
        held = sum(zeros_ahead(segments(log.path)[-1]) for log in logs)
        assert held <= 1000 * FIRST_CHUNK
    finally:
        for log in logs:
            log.close()
    assert sum(zeros_ahead(segments(tmp_path / f"s{i}")[-1]) for i in range(1000)) == 0


def test_a_sealed_segment_is_trimmed_to_its_data_before_its_seal(tmp_path: Path) -> None:
    path = tmp_path / "log"
    with walj.Log.open(path, segment_bytes=4096) as log:
        for i in range(60):
            log.append({"i": i, "pad": "x" * 100})
    with walj.Log.open(path) as log:
        log.append({"last": 1})
        log.close(seal=True)
    for segment in segments(path):
        lines = segment.read_bytes().split(b"\n")
        assert lines[-1] == b"" and b'"seal":' in lines[-2], segment.name
        assert zeros_ahead(segment) == 0
    report = walj.verify(path)
    assert report.ok and report.problems == []
    assert len(all_data(path)) == 61


def test_a_preallocated_segment_left_by_a_dead_writer_reopens_and_appends(
        tmp_path: Path) -> None:
    path = tmp_path / "log"
    child = textwrap.dedent("""
        import os, signal, sys, walj
        log = walj.Log.open(sys.argv[1])
        for i in range(20):
            log.append({"i": i})
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    run = subprocess.run([sys.executable, "-c", child, str(path)], env=ENV)
    assert run.returncode == -signal.SIGKILL
    last = segments(path)[-1]
    assert zeros_ahead(last) > 0, "the dead writer left no zeros ahead"
    with walj.Log.open(path, recovery="strict") as log:
        assert log.problems == [] and log.torn_tail is None and log.last_seq == 20
        assert log.append({"i": 20}) == 21
    assert not (path / "quarantine").exists()
    assert all_data(path) == [{"i": i} for i in range(21)] and zeros_ahead(last) == 0


@pytest.mark.parametrize("mode", ["drop", "tear", "reorder", "zero"])
def test_a_power_cut_keeps_every_durable_record_of_a_preallocated_segment(
        tmp_path: Path, mode: str) -> None:
    """Synced records stay; the unsynced ones after them, written into zeros the last sync made
    durable, may be lost (drop loses exactly those), and what is lost reads back as zeros."""
    import random

    path = tmp_path / "log"
    fs = FaultyFS()
    log = walj.Log.open(path, sync="never", _fs=fs)
    records = make_records(40)
    for record in records[:30]:
        log.append(record)
    log.sync()
    for record in records[30:]:
        log.append(record)
    assert fs.unsynced_bytes() > 0
    fs.crash(mode, random.Random(mode))
    abandon(log)
    with walj.Log.open(path) as reopened:
        held = reopened.last_seq
    assert 30 <= held <= 40
    assert all_data(path) == records[:held]
    if mode == "drop":
        assert held == 30


class InterruptsAt(FileSystem):
    """Raises KeyboardInterrupt before or after the n-th call of one method."""

    def __init__(self) -> None:
        self.armed: tuple[str, int, bool] | None = None
        self.seen = 0

    def arm(self, op: str, nth: int = 1, *, after: bool) -> None:
        self.armed, self.seen = (op, nth, after), 0

    def _call(self, op: str, real: Callable[[], Any]) -> Any:
        armed = self.armed
        hit = armed is not None and armed[0] == op and (self.seen + 1) == armed[1]
        if armed is not None and armed[0] == op:
            self.seen += 1
        if hit and armed is not None and not armed[2]:
            self.armed = None
            raise KeyboardInterrupt(f"before {op}")
        result = real()
        if hit:
            self.armed = None
            raise KeyboardInterrupt(f"after {op}")
        return result

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        return int(self._call("pwrite", lambda: super(InterruptsAt, self).pwrite(fd, data,
                                                                                  offset)))

    def truncate(self, fd: int, length: int) -> None:
        self._call("truncate", lambda: super(InterruptsAt, self).truncate(fd, length))


def _fill_first_chunk(log: walj.Log) -> int:
    """Append until the next record passes the first chunk of zeros; the records appended."""
    n = 0
    while data_size(segments(log.path)[-1]) + 400 < FIRST_CHUNK:
        log.append({"n": n, "pad": "p" * 300})
        n += 1
    return n


@pytest.mark.parametrize("after", [False, True])
@pytest.mark.parametrize("extends", [False, True])
def test_an_interrupted_write_is_settled_from_its_bytes(tmp_path: Path, after: bool,
                                                        extends: bool) -> None:
    """Interrupted before the write, nothing landed: the next append takes the same seq.
    After it, the record landed: it is counted, and the next append takes the next seq. A write
    that extends the segment (record and the next chunk of zeros at once) settles the same."""
    path = tmp_path / "log"
    fs = InterruptsAt()
    with walj.Log.open(path, _fs=fs) as log:
        n = _fill_first_chunk(log) if extends else 1
        if not extends:
            log.append({"n": 0})
        size = segments(path)[-1].stat().st_size
        fs.arm("pwrite", after=after)
        with pytest.raises(KeyboardInterrupt):
            log.append({"interrupted": 1, "pad": "p" * 300})
        grew = segments(path)[-1].stat().st_size > size
        assert grew == (extends and after)
        seq = log.append({"next": 1})
        assert seq == n + 1 + after
    data = all_data(path)
    assert ({"interrupted": 1, "pad": "p" * 300} in data) == after
    assert data[-1] == {"next": 1} and len(data) == n + 1 + after
    assert walj.verify(path).ok


def test_a_write_that_landed_in_part_poisons_and_the_reopen_cuts_only_the_torn_bytes(
        tmp_path: Path) -> None:
    path = tmp_path / "log"

    class HalfWrite(FileSystem):
        armed = False

        def pwrite(self, fd: int, data: bytes, offset: int) -> int:
            if self.armed:
                self.armed = False
                os.pwrite(fd, data[:20], offset)
                raise KeyboardInterrupt("after part of a write")
            return super().pwrite(fd, data, offset)

    fs = HalfWrite()
    log = walj.Log.open(path, _fs=fs)
    log.append({"n": 0})
    fs.armed = True
    with pytest.raises(KeyboardInterrupt):
        log.append({"n": 1})
    with pytest.raises(walj.PoisonedError):
        log.append({"n": 2})
    with pytest.raises(walj.PoisonedError):
        log.close()
    assert zeros_ahead(segments(path)[-1]) > 0  # a poisoned handle leaves the file alone
    with walj.Log.open(path) as reopened:
        assert reopened.last_seq == 1
        assert reopened.torn_tail is not None and reopened.torn_tail.length == 20
    assert all_data(path) == [{"n": 0}]


@pytest.mark.parametrize("op, after", [("truncate", False), ("truncate", True),
                                       ("pwrite", False), ("pwrite", True)])
def test_an_interrupted_seal_is_settled_from_its_bytes(tmp_path: Path, op: str,
                                                       after: bool) -> None:
    """A rotation stopped at the trim or at the seal's write: before the seal landed a rotate
    seals again, after it the next call finishes the rotation. Either way the sealed segment
    ends with its seal and holds no zeros."""
    path = tmp_path / "log"
    fs = InterruptsAt()
    with walj.Log.open(path, _fs=fs) as log:
        for i in range(3):
            log.append({"i": i})
        fs.arm(op, after=after)
        with pytest.raises(KeyboardInterrupt):
            log.rotate()
        log.rotate()
        assert log.append({"i": 3}) == 4
    first, second = segments(path)
    assert b'"seal":' in first.read_bytes().split(b"\n")[-2] and zeros_ahead(first) == 0
    assert all_data(path) == [{"i": i} for i in range(4)]
    assert walj.verify(path).ok and second.exists()


def test_an_interrupted_close_trim_leaves_a_log_that_reopens_clean(tmp_path: Path) -> None:
    path = tmp_path / "log"
    fs = InterruptsAt()
    log = walj.Log.open(path, _fs=fs)
    log.append({"i": 0})
    fs.arm("truncate", after=False)
    with pytest.raises(KeyboardInterrupt):
        log.close()
    log.close()  # called again, as close() asks after an interrupt
    with walj.Log.open(path, recovery="strict") as reopened:
        assert reopened.problems == [] and reopened.last_seq == 1


def _pwrite_args(line: str) -> tuple[int, int] | None:
    """(length, offset) of a traced pwrite64."""
    match = re.search(r", (\d+), (\d+)\) = \d+$", line)
    return (int(match.group(1)), int(match.group(2))) if match else None


CHILD = textwrap.dedent("""
    import sys, walj
    log = walj.Log.open(sys.argv[1])
    for i in range(200):
        log.append({"i": i, "pad": "p" * 200})
    log.close(seal=True)
""")


@pytest.mark.skipif(STRACE is None, reason="strace is not installed")
def test_syscall_order_of_preallocated_appends(tmp_path: Path) -> None:
    """A new segment's header and first chunk of zeros are one write before its fdatasync;
    each record is one pwrite at the end of the data followed by its fdatasync (not fsync)
    before the next write; a write past the zeros writes the next chunk with the record, and
    its one fdatasync covers both; the segment is truncated to its data before the seal's
    write, which is then synced."""
    assert STRACE is not None
    out, path = tmp_path / "trace", tmp_path / "log"
    subprocess.run([STRACE, "-f", "-qq", "-s", "64", "-o", str(out), "-e",
                    "trace=openat,write,pwrite64,fdatasync,fsync,ftruncate",
                    sys.executable, "-c", CHILD, str(path)], check=True, env=ENV)
    lines = out.read_text().splitlines()
    calls = strace_calls("\n".join(lines))
    first = str(path / "seg-0000000001.jsonl")
    on_first = [(op, line) for line, (op, target) in zip(lines, calls, strict=True)
                if target in (first, first + ".tmp")]
    ops = [op for op, _ in on_first]
    assert ops[:3] == ["openat", "write", "fdatasync"]
    assert on_first[1][1].endswith(f"= {FIRST_CHUNK}")  # the header and the first chunk
    assert "fsync" not in ops
    writes = [i for i, (op, line) in enumerate(on_first) if "pwrite64(" in line]
    *records, seal = writes
    assert len(records) == 200 and '\\"seal\\":' in on_first[seal][1]
    allocated, end, extensions = FIRST_CHUNK, None, 0
    previous = (0, 0)
    for i in records:
        length, offset = _pwrite_args(on_first[i][1]) or (0, 0)
        if end is not None:
            assert offset == end  # at the end of the data
        else:  # after an extension: inside what it wrote
            assert previous[0] < offset < sum(previous) or previous == (0, 0)
        if offset + length > allocated:
            extensions += 1
            allocated, end = offset + length, None
            assert length > 2 * 1024  # the record with the next chunk of zeros after it
        else:
            end = offset + length
        previous = (offset, length)
        assert ops[i + 1] == "fdatasync", on_first[i: i + 2]
    assert extensions >= 1, "no write passed the first chunk of zeros"
    assert ops[seal - 1] == "ftruncate" and ops[seal + 1] == "fdatasync"


def test_a_failed_trim_on_close_poisons_and_loses_no_durable_record(tmp_path: Path) -> None:
    path = tmp_path / "log"
    fs = FaultyFS()
    log = walj.Log.open(path, _fs=fs)
    log.append({"i": 0})
    fs.fail("truncate", err=errno.ENOSPC)
    with pytest.raises(walj.DiskFullError):
        log.close()
    with walj.Log.open(path, recovery="strict") as reopened:
        assert reopened.problems == [] and reopened.last_seq == 1
