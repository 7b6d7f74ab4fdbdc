"""Faults through the I/O seam: failed and short writes, failed syncs, full disks, and crashes
at each step of a rotation with every unsynced byte and directory entry dropped."""

from __future__ import annotations

import errno
import os
import random
import shutil
import subprocess
import sys
import textwrap
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from faultfs import FaultyFS, SimulatedCrash, abandon, tick
from helpers import all_data, data_size, make_records, segments, strace_calls

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
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    subprocess.run(
        [STRACE, "-f", "-qq", "-o", str(out), "-e",
         "trace=openat,write,pwrite64,fdatasync,fsync,rename",
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
    return [(op, target) for op, target in strace_calls(trace)
            if target.startswith(logdir) and ("seg-" in target or target == logdir)]


# --- the fault model itself: directories, and tears of any unsynced write ----------------------


def test_a_mkdir_is_durable_only_once_its_parent_is_synced(tmp_path: Path) -> None:
    fs = FaultyFS()
    kept, lost = str(tmp_path / "kept"), str(tmp_path / "lost")
    fs.mkdir(kept)
    fs.sync_dir(str(tmp_path))
    fs.mkdir(lost)
    for directory in (kept, lost):  # the contents synced as well as they can be
        fd = fs.create(os.path.join(directory, "f"))
        fs.write(fd, b"data")
        fs.sync(fd)
        fs.close(fd)
        fs.sync_dir(directory)
    fs.crash()
    assert (tmp_path / "kept" / "f").read_bytes() == b"data"
    assert not (tmp_path / "lost").exists(), "an unsynced mkdir survived the power cut"


def test_a_process_death_leaves_an_unsynced_mkdir_unsynced(tmp_path: Path) -> None:
    """crash("keep") loses nothing, but makes nothing durable: a later power cut through the
    same file system still undoes the mkdir no sync of its parent covered."""
    fs = FaultyFS()
    fs.mkdir(str(tmp_path / "d"))
    fs.crash("keep")
    assert (tmp_path / "d").is_dir()
    fs.crash("drop")
    assert not (tmp_path / "d").exists()


class _SkipsSyncOf(FaultyFS):
    """A writer's file system that leaves out the sync of one directory: the double the model
    must catch."""

    def __init__(self, skipped: str) -> None:
        super().__init__()
        self.skipped = skipped
        self.skips = 0

    def sync_dir(self, path: str) -> None:
        if path == self.skipped:
            self.skips += 1
            return
        super().sync_dir(path)


@pytest.mark.parametrize("depth", [0, 2])
def test_a_new_log_survives_a_power_cut_and_the_model_catches_a_missing_parent_sync(
        tmp_path: Path, depth: int) -> None:
    """Log.open makes the log directory and its missing ancestors, syncing each one's parent.
    Through the honest model the durable record survives a power cut; with the sync of any one
    of those parents left out, the model undoes that directory, and the record with it."""
    rel = Path(*[f"d{i}" for i in range(depth)], "log")
    honest = FaultyFS()
    with walj.Log.open(tmp_path / "honest" / rel, sync="never", _fs=honest) as log:
        log.append({"a": 1}, durable=True)
        honest.crash()
        abandon(log)
    assert all_data(tmp_path / "honest" / rel) == [{"a": 1}]
    for level in range(depth + 1):  # the parent of the level-th directory made
        root = tmp_path / f"skip{level}"
        root.mkdir()
        path = root / rel
        fs = _SkipsSyncOf(str(root.joinpath(*rel.parts[:level])))
        log = walj.Log.open(path, sync="never", _fs=fs)
        log.append({"a": 1}, durable=True)
        assert fs.skips >= 1
        fs.crash()
        abandon(log)
        made = root.joinpath(*rel.parts[: level + 1])
        assert made.parent.is_dir() and not made.exists(), \
            f"the model missed the skipped sync of {fs.skipped}"


def test_quarantine_survives_a_power_cut_and_the_model_catches_a_missing_log_dir_sync(
        tmp_path: Path) -> None:
    """The first cut makes quarantine/ and syncs the log directory before it truncates the
    segment: a power cut right after the open keeps the torn bytes in one place. Leaving that
    sync out, the model undoes quarantine/ while the truncation stands: the bytes are gone."""
    for honest in (True, False):
        path = tmp_path / f"log-{honest}"
        with walj.Log.open(path) as log:
            log.append({"a": 1})
        with open(segments(path)[-1], "ab") as f:
            f.write(b'{"xxh64":"torn')
        fs = FaultyFS() if honest else _SkipsSyncOf(str(path))
        log = walj.Log.open(path, _fs=fs)
        fs.crash()
        abandon(log)
        kept = list((path / "quarantine").glob("*.bin")) if (path / "quarantine").exists() else []
        on_disk = b"".join(p.read_bytes() for p in kept) + segments(path)[-1].read_bytes()
        if honest:
            assert b'{"xxh64":"torn' in on_disk, "the cut bytes were lost"
        else:
            assert b'{"xxh64":"torn' not in on_disk, "the model missed the skipped sync"


def test_a_new_log_in_a_directory_a_dead_process_made_survives_a_power_cut(
        tmp_path: Path) -> None:
    """A process dies between mkdir and the sync of its parent: the directory is there, not
    durable. The next process finds it and must not take it for durable: its acknowledged
    records must survive a power cut."""
    path = tmp_path / "log"
    fs = FaultyFS(freeze_on_crash=True)
    fs.crash_at("sync_dir", 1)  # the sync of tmp_path after the mkdir of the log directory
    with pytest.raises(SimulatedCrash):
        walj.Log.open(path, _fs=fs)
    fs.crash("keep")
    assert path.is_dir()
    log = walj.Log.open(path, _fs=fs)
    log.append({"a": 1})
    log.close()
    fs.crash("drop")
    assert path.is_dir() and all_data(path) == [{"a": 1}], "an acknowledged record was lost"


def test_a_cut_into_a_quarantine_a_dead_process_made_survives_a_power_cut(
        tmp_path: Path) -> None:
    """A process dies between mkdir(quarantine) and the sync of the log directory. The next
    open cuts the torn tail into that quarantine/: it must sync the log directory before the
    truncation, or a power cut loses the cut bytes from both places."""
    path = tmp_path / "log"
    with walj.Log.open(path) as log:
        log.append({"a": 1})
    with open(segments(path)[-1], "ab") as f:
        f.write(b'{"xxh64":"torn')
    fs = FaultyFS(freeze_on_crash=True)
    fs.crash_at("mkdir", 1, after=True)
    with pytest.raises(SimulatedCrash):
        walj.Log.open(path, _fs=fs)
    fs.crash("keep")
    assert (path / "quarantine").is_dir()
    log = walj.Log.open(path, _fs=fs)
    assert log.torn_tail is not None
    fs.crash("drop")
    abandon(log)
    kept = list((path / "quarantine").glob("*.bin")) if (path / "quarantine").exists() else []
    on_disk = b"".join(p.read_bytes() for p in kept) + segments(path)[-1].read_bytes()
    assert b'{"xxh64":"torn' in on_disk, "the torn tail's bytes were lost from both places"


# --- sync="interval": what one interval of the background syncer makes durable -----------------


@pytest.mark.parametrize("cut", ["drop", "tear", "reorder", "zero"])
def test_an_interval_sync_covers_exactly_what_was_written_before_it_began(
        tmp_path: Path, cut: str) -> None:
    """sync="interval" with time taken out: the loop of the background syncer is stepped by the
    test, one interval at a time, while the real thread sleeps for an hour. During the tick's
    sync, after it took what it covers, another append lands. After the tick every record
    appended before it is durable and the racing one is not claimed; a power cut then keeps
    every record the log reported durable, and may lose only the racing record and those
    appended after the tick (and in "drop" mode loses exactly those)."""
    rng = random.Random(f"interval-tick-{cut}")
    fs = FaultyFS()
    path = tmp_path / "log"
    log = walj.Log.open(path, sync="interval", sync_interval_ms=3_600_000, segment_bytes=1024,
                        _fs=fs)
    records: list[dict[str, Any]] = []

    def append(pad: int = 200) -> int:
        records.append({"n": len(records), "pad": "x" * rng.randint(0, pad)})
        return log.append(records[-1])

    while (len(records) < 30 or data_size(segments(path)[-1]) > 700
           or log.durable_seq == len(records)):
        append()  # rotations on the way; unsynced records, and room for the racing one
    assert len(segments(path)) > 2
    covered = len(records)
    assert log.durable_seq < covered, "nothing left for the tick to sync"
    racing: list[int] = []
    fs.during_sync = lambda: racing.append(append(pad=0))
    tick(log)
    fs.during_sync = None  # disarmed even when no sync ran (a later one would deadlock)
    assert racing == [covered + 1], "the racing append did not land during the tick's sync"
    assert log.durable_seq == covered, (
        f"after one interval durable_seq is {log.durable_seq}: records 1..{covered} were "
        f"written before the sync began, record {covered + 1} during it")
    for _ in range(4):
        append(pad=0)  # after the last tick: unsynced (and too small to rotate)
    assert log.durable_seq == covered
    fs.crash(cut, rng)
    abandon(log)
    with walj.Log.open(path) as reopened:
        held = reopened.last_seq
    assert covered <= held <= len(records), (covered, held)
    assert all_data(path) == records[:held]
    if cut == "drop":
        assert held == covered, "drop lost less than every unsynced record: the model is off"
    assert walj.verify(path).ok


def test_each_interval_syncs_what_came_since_the_last(tmp_path: Path) -> None:
    """Two intervals with appends between: the second covers what the first could not, in the
    segment the log has moved on to."""
    fs = FaultyFS()
    path = tmp_path / "log"
    log = walj.Log.open(path, sync="interval", sync_interval_ms=3_600_000, segment_bytes=1024,
                        _fs=fs)
    first = [log.append({"a": n, "pad": "y" * 100}) for n in range(5)]
    tick(log)
    assert log.durable_seq == first[-1]
    tick(log)  # nothing new: nothing claimed
    assert log.durable_seq == first[-1]
    second = [log.append({"b": n, "pad": "z" * 100}) for n in range(12)]  # rotates
    assert log.durable_seq < second[-1]
    tick(log, 2)
    assert log.durable_seq == second[-1]
    fs.crash()
    abandon(log)
    assert [r.seq for r in walj.read(path)] == first + second
