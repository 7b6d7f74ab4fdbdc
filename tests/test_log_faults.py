"""Faults through the I/O seam: failed and short writes, failed syncs, full disks, and crashes
at each step of a rotation with every unsynced byte and directory entry dropped."""

from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
import sys
import textwrap
from itertools import pairwise
from pathlib import Path

import pytest
from faultfs import FaultyFS, SimulatedCrash, abandon
from helpers import all_data, make_records, segments

import walj


def _rotation_window(tmp_path: Path, records: list[dict[str, object]]) -> range:
    """Indexes of the calls, from the seal's write to the directory sync after the rename."""
    probe = FaultyFS()
    with walj.Log.open(tmp_path / "probe", segment_bytes=1024, _fs=probe) as log:
        for record in records:
            log.append(record)
    calls = probe.calls
    create = next(i for i, (op, p) in enumerate(calls) if op == "create" and "seg-0000000002" in p)
    seal_write = max(i for i in range(create) if calls[i][0] == "write")
    dir_sync = next(i for i in range(create, len(calls)) if calls[i][0] == "sync_dir")
    return range(seal_write, dir_sync + 1)


def test_crash_at_every_call_of_a_rotation_keeps_acknowledged_records(tmp_path: Path) -> None:
    records = make_records(40)
    window = _rotation_window(tmp_path, records)
    assert len(window) >= 6  # write, sync, create, write, sync, rename, sync_dir at least
    for k in window:
        for after in (False, True):
            fs = FaultyFS()
            fs.crash_at("any", k + 1, after=after)
            path = tmp_path / f"log-{k}-{after}"
            acknowledged: list[dict[str, object]] = []
            log = walj.Log.open(path, segment_bytes=1024, _fs=fs)
            with pytest.raises(SimulatedCrash):
                for record in records:
                    log.append(record)
                    acknowledged.append(record)
            fs.crash()
            abandon(log)
            with walj.Log.open(path, segment_bytes=1024) as reopened:
                assert reopened.last_seq >= len(acknowledged), (fs.calls[k], after)
                reopened.append({"after": "crash"})
            data = all_data(path)
            assert data[: len(acknowledged)] == acknowledged
            assert data[-1] == {"after": "crash"}
            assert walj.verify(path).ok


def test_eio_on_sync_poisons_and_loses_nothing_acknowledged(logdir: Path) -> None:
    fs = FaultyFS()
    fs.fail("sync", nth=6)  # header sync is #1, then one per append
    log = walj.Log.open(logdir, _fs=fs)
    acked = []
    with pytest.raises(walj.PoisonedError):
        for record in make_records(10):
            log.append(record)
            acked.append(record)
    assert len(acked) == 4
    for call in (lambda: log.append({"x": 1}), log.sync, lambda: log.append_many([{"x": 1}])):
        with pytest.raises(walj.PoisonedError):
            call()
    sync_calls = [c for c in fs.calls if c[0] == "sync"]
    assert len(sync_calls) == 6  # never retried
    with pytest.raises(walj.PoisonedError):  # close() reports the poisoning
        log.close()
    log.close()  # once: a second close() is quiet
    fs.crash()
    data = all_data(logdir)
    assert data[:4] == acked and len(data) <= 5


def test_eio_on_write_poisons(logdir: Path) -> None:
    fs = FaultyFS()
    fs.fail("write", nth=4)  # owner file, header, first record, then this
    log = walj.Log.open(logdir, _fs=fs)
    log.append({"a": 1})
    with pytest.raises(walj.PoisonedError):
        log.append({"a": 2})
    with pytest.raises(walj.PoisonedError):
        log.append({"a": 3})
    with pytest.raises(walj.PoisonedError):  # close() reports the poisoning
        log.close()
    log.close()  # once: a second close() is quiet
    assert all_data(logdir) == [{"a": 1}]


def test_enospc_is_typed_and_nothing_unsynced_is_acknowledged(logdir: Path) -> None:
    fs = FaultyFS()
    fs.fail("write", nth=5, err=errno.ENOSPC)
    log = walj.Log.open(logdir, _fs=fs)
    acked = [log.append({"a": i}) for i in range(2)]
    with pytest.raises(walj.DiskFullError):
        log.append({"a": 2})
    assert isinstance(walj.DiskFullError("x"), walj.PoisonedError)
    with pytest.raises(walj.PoisonedError):  # close() reports the poisoning
        log.close()
    log.close()  # once: a second close() is quiet
    fs.crash()
    assert [r.seq for r in walj.read(logdir)] == acked


def test_short_write_is_completed(logdir: Path) -> None:
    fs = FaultyFS()
    log = walj.Log.open(logdir, _fs=fs)
    fs.short_write_bytes = 7
    log.append({"long": "x" * 100})
    log.append({"b": 2})
    log.close()
    assert all_data(logdir) == [{"long": "x" * 100}, {"b": 2}]


def test_failed_sync_in_batch_mode_fails_every_waiter(logdir: Path) -> None:
    fs = FaultyFS()
    fs.fail("sync", nth=3)
    log = walj.Log.open(logdir, sync="batch", _fs=fs)
    log.append({"a": 1})
    with pytest.raises(walj.PoisonedError):
        log.append({"a": 2})
    with pytest.raises(walj.PoisonedError):
        log.append({"a": 3})
    with pytest.raises(walj.PoisonedError):  # close() reports the poisoning
        log.close()
    log.close()  # once: a second close() is quiet


def test_crash_drops_unsynced_appends_in_never_mode(logdir: Path) -> None:
    fs = FaultyFS()
    log = walj.Log.open(logdir, sync="never", _fs=fs)
    log.append({"a": 1}, durable=True)
    log.append({"a": 2})
    fs.crash()
    abandon(log)
    assert all_data(logdir) == [{"a": 1}]


def test_quarantine_is_durable_before_the_cut(logdir: Path) -> None:
    with walj.Log.open(logdir) as log:
        log.append({"a": 1})
    with open(segments(logdir)[-1], "ab") as f:
        f.write(b"torn")
    fs = FaultyFS()
    with walj.Log.open(logdir, _fs=fs):
        pass
    ops = [call for call, target in fs.calls if "quarantine" in target or call == "truncate"]
    cut = ops.index("truncate")
    assert ops[:cut].count("sync") == 2 and "sync_dir" in ops[:cut]


STRACE = shutil.which("strace")

CHILD = textwrap.dedent("""
    import sys, walj
    with walj.Log.open(sys.argv[1], segment_bytes=1024) as log:
        for i in range(30):
            log.append({"i": i, "pad": "x" * 40})
""")


@pytest.mark.skipif(STRACE is None, reason="strace is not installed")
def test_syscall_order_of_appends_and_rotation(tmp_path: Path) -> None:
    """Durability is the order of system calls: write then fdatasync before the next write;
    at rotation the seal is synced before the new segment exists, whose header is synced
    before its rename, which is followed by a sync of the directory."""
    out = tmp_path / "trace"
    log = tmp_path / "log"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    subprocess.run(
        [STRACE, "-f", "-qq", "-o", str(out), "-e", "trace=openat,write,fdatasync,fsync,rename",
         sys.executable, "-c", CHILD, str(log)],
        check=True, env=env,
    )
    events = _trace_events(out.read_text(), str(log))
    names = [op for op, _ in events]
    # Every record's write is synced before the next record's write; the one exception is the
    # record that fills a segment, which the seal's sync covers right after the seal's write.
    writes = [i for i, (op, target) in enumerate(events) if op == "write"]
    for a, b in pairwise(writes):
        synced = ("fdatasync", events[a][1]) in events[a + 1 : b]
        assert synced or events[b + 1] == ("fdatasync", events[a][1]), events[a : b + 2]
    rename = next(i for i, (op, t) in enumerate(events) if op == "rename" and "seg-0000000002" in t)
    create = next(i for i, (op, t) in enumerate(events) if op == "openat" and "seg-0000000002" in t)
    seal = create - 2
    assert events[seal][0] == "write" and events[seal + 1] == ("fdatasync", events[seal][1])
    assert "seg-0000000001" in events[seal][1]
    assert names[create:rename] == ["openat", "write", "fdatasync"]
    # the directory is synced right after the rename
    assert events[rename + 1 : rename + 3] == [("openat", str(log)), ("fsync", str(log))]


def _trace_events(trace: str, logdir: str) -> list[tuple[str, str]]:
    """(call, file) for calls on the log's segments and directory, in order."""
    fds: dict[str, str] = {}
    events: list[tuple[str, str]] = []
    for line in trace.splitlines():
        call = line.split(None, 1)[1] if line[:1].isdigit() else line
        op = call.split("(", 1)[0]
        result = call.rsplit("=", 1)[-1].strip().split()[0] if "=" in call else ""
        args = call[len(op) + 1 :]
        if op == "openat":
            path = args.split('"')[1]
            if result.isdigit():
                fds[result] = path
            target = path
        elif op == "rename":
            target = args.split('"')[3]
        else:
            fd = re.match(r"\d+", args)
            target = fds.get(fd.group(0), "?") if fd else "?"
        if target.startswith(logdir) and ("seg-" in target or target == logdir):
            events.append((op, target))
    return events
