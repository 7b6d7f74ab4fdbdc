"""Compaction: Log.drop_before, the BASE marker, and every reader of a compacted log, through
refusals, concurrent appenders, crashes at every call of a drop, the syscall order and
hostile markers."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest
import spec_reader
from faultfs import CRASH_MODES, FaultyFS, SimulatedCrash, abandon
from helpers import make_records, segments, strace_calls

import walj
from walj.errors import (
    ClosedError,
    CorruptionError,
    DroppedWhileReadingError,
    PoisonedError,
    WaljError,
)

SEG = 1024


def _build(path: Path, n: int = 60) -> list[dict[str, Any]]:
    records = make_records(n)
    with walj.Log.open(path, segment_bytes=SEG) as log:
        for record in records:
            log.append(record)
    return records


def _firsts(path: Path) -> dict[int, int]:
    """Segment index -> its first seq, from the headers."""
    out = {}
    for seg in segments(path):
        header = spec_reader._lines(seg.read_bytes())[0].value
        assert header is not None
        out[int(seg.name[4:14])] = header["header"]["first"]
    return out


def _check(path: Path, records: list[dict[str, Any]], keep_from: int) -> int:
    """The log reads, by walj and by the spec reader, as a suffix of `records` that holds at
    least every record from seq `keep_from` on, and verifies. Returns its first seq."""
    got = [(r.seq, r.data) for r in walj.read(path)]
    spec = spec_reader.read_records(path)
    assert got == spec
    first = got[0][0] if got else len(records) + 1
    assert first <= keep_from
    assert got == list(enumerate(records, start=1))[first - 1:]
    report = walj.verify(path)
    assert report.ok, report.problems
    return first


def test_drop_before_drops_whole_sealed_segments_and_readers_start_at_the_base(
        logdir: Path) -> None:
    records = _build(logdir)
    firsts = _firsts(logdir)
    seq = 30
    keep = max(i for i, f in firsts.items() if f <= seq)  # the segment holding seq stays
    with walj.Log.open(logdir, segment_bytes=SEG) as log:
        assert log.first_seq == 1
        assert log.drop_before(seq) == keep - 1
        assert log.first_seq == firsts[keep]
        assert log.drop_before(seq) == 0  # nothing more to do
        log.append({"after": "drop"})
        records.append({"after": "drop"})
    assert [int(p.name[4:14]) for p in segments(logdir)][0] == keep
    assert _check(logdir, records, seq) == firsts[keep]
    report = walj.verify(logdir)
    assert report.base is not None and report.base.index == keep
    assert report.base.first_seq == firsts[keep] and report.leftovers == []
    # start_seq below the base starts at the base; above it, as before
    assert next(iter(walj.read(logdir, 1))).seq == firsts[keep]
    assert next(iter(walj.read(logdir, seq))).seq == seq
    # a second drop moves the base on; the marker is replaced, never appended to
    with walj.Log.open(logdir, segment_bytes=SEG) as log:
        assert log.first_seq == firsts[keep]
        assert log.drop_before(log.last_seq + 1) >= 1
        assert len(segments(logdir)) == 1  # only the active segment is left
    assert (logdir / "BASE").read_bytes().count(b"\n") == 1
    _check(logdir, records, len(records) + 1)


def test_drop_before_refusals(logdir: Path) -> None:
    _build(logdir)
    before = sorted(os.listdir(logdir))
    log = walj.Log.open(logdir, segment_bytes=SEG)
    for bad in ("3", 3.0, True, None):
        with pytest.raises(TypeError):
            log.drop_before(bad)  # type: ignore[arg-type]
    for bad_seq in (0, -1, log.last_seq + 2):
        with pytest.raises(ValueError):
            log.drop_before(bad_seq)
    log.close()
    with pytest.raises(ClosedError):
        log.drop_before(5)
    assert sorted(os.listdir(logdir)) == before
    with pytest.raises(WaljError):
        walj.Log.open(logdir, recovery="salvage").drop_before(5)


def test_seq_in_the_active_segment_keeps_the_active_segment(logdir: Path) -> None:
    with walj.Log.open(logdir, segment_bytes=SEG) as log:
        log.append({"one": 1})
        assert log.drop_before(2) == 0  # one segment, and it is active
        assert not (logdir / "BASE").exists()
        for record in make_records(40):
            log.append(record)
        last = log.last_seq
        log.drop_before(last)  # every segment before the one holding `last` goes
        firsts = _firsts(logdir)
        assert min(firsts.values()) <= last
        assert all(first > last for index, first in firsts.items() if index > min(firsts))
        assert [r.seq for r in walj.read(logdir)][-1] == last
    assert walj.verify(logdir).ok


def test_a_poisoned_log_refuses_to_drop_and_a_failed_sync_unlinks_nothing(logdir: Path) -> None:
    records = _build(logdir)
    names = sorted(os.listdir(logdir))
    fs = FaultyFS()
    log = walj.Log.open(logdir, segment_bytes=SEG, _fs=fs)
    fs.fail("sync")  # the marker's sync
    with pytest.raises(PoisonedError):
        log.drop_before(40)
    assert all(name in os.listdir(logdir) for name in names)  # nothing unlinked
    with pytest.raises(PoisonedError):
        log.drop_before(40)
    with pytest.raises(PoisonedError):
        log.close()
    with walj.Log.open(logdir, segment_bytes=SEG) as log:
        assert log.drop_before(40) > 0
    _check(logdir, records, 40)


def test_drop_while_another_thread_appends_and_rotates(logdir: Path) -> None:
    appended: list[int] = []
    errors: list[BaseException] = []
    with walj.Log.open(logdir, segment_bytes=SEG, sync="batch") as log:
        def appender() -> None:
            try:
                for n in range(400):
                    appended.append(log.append({"n": n, "pad": "x" * 40}))
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        thread = threading.Thread(target=appender)
        thread.start()
        dropped = 0
        while thread.is_alive():
            if log.last_seq > 1:
                dropped += log.drop_before(log.last_seq)
        thread.join()
        dropped += log.drop_before(log.last_seq)
    assert not errors
    assert appended == list(range(1, 401))
    assert dropped >= 1
    got = [r.seq for r in walj.read(logdir)]
    assert got == list(range(got[0], 401))
    assert [s for s, _ in spec_reader.read_records(logdir)] == got
    assert walj.verify(logdir).ok


def _drop_calls(template: Path, tmp: Path, seq: int) -> int:
    probe_dir = tmp / "probe"
    shutil.copytree(template, probe_dir)
    probe = FaultyFS()
    with walj.Log.open(probe_dir, segment_bytes=SEG, _fs=probe) as log:
        start = len(probe.calls)
        log.drop_before(seq)
        return len(probe.calls) - start


@pytest.mark.parametrize("mode", CRASH_MODES)
def test_a_crash_at_every_call_of_a_drop_loses_nothing_kept_and_rolls_forward(
        tmp_path: Path, mode: str) -> None:
    template = tmp_path / "template"
    records = _build(template, 40)
    seq = 30
    firsts = _firsts(template)
    base_first = firsts[max(i for i, f in firsts.items() if f <= seq)]
    calls = _drop_calls(template, tmp_path, seq)
    assert calls >= 8  # unlink BASE.tmp, create, write, sync, rename, sync_dir, unlinks, sync_dir
    for after in (False, True):
        # the stale BASE.tmp's unlink finds nothing and raises: it has no "after" point
        for k in range(calls - after):
            path = tmp_path / f"log-{k}-{after}"
            shutil.copytree(template, path)
            fs = FaultyFS(freeze_on_crash=True)
            log = walj.Log.open(path, segment_bytes=SEG, _fs=fs)
            fs.crash_at("any", k + 1, after=after)
            with pytest.raises(SimulatedCrash):
                log.drop_before(seq)
            fs.crash(mode, random.Random(k))
            abandon(log)
            where = (k, after, fs.injected)
            assert _check(path, records, seq) in (1, base_first), where
            with walj.Log.open(path, segment_bytes=SEG) as reopened:
                reopened.drop_before(seq)  # finishes what the crash stopped
            report = walj.verify(path)
            assert report.ok and report.leftovers == [], where
            assert report.base is not None, where
            _check(path, records, seq)
            shutil.rmtree(path)


def test_leftovers_of_an_interrupted_drop_are_skipped_then_removed(logdir: Path) -> None:
    records = _build(logdir)
    fs = FaultyFS(freeze_on_crash=True)
    log = walj.Log.open(logdir, segment_bytes=SEG, _fs=fs)
    fs.crash_at("unlink", 3)  # BASE.tmp's unlink, the first segment's, then this one
    with pytest.raises(SimulatedCrash):
        log.drop_before(50)
    fs.crash("keep")
    abandon(log)
    report = walj.verify(logdir)
    assert report.ok and report.base is not None and len(report.leftovers) >= 1
    first = _check(logdir, records, 50)
    with walj.Log.open(logdir, segment_bytes=SEG) as reopened:  # opening deletes nothing
        assert walj.verify(logdir).leftovers == report.leftovers
        assert reopened.drop_before(first) == len(report.leftovers)
    assert walj.verify(logdir).leftovers == []
    _check(logdir, records, 50)


# --- hostile markers ----------------------------------------------------------------------------


def _compacted(logdir: Path) -> list[dict[str, Any]]:
    records = _build(logdir)
    with walj.Log.open(logdir, segment_bytes=SEG) as log:
        log.drop_before(30)
    return records


def _refused_everywhere(logdir: Path, kind: str) -> None:
    names = sorted(os.listdir(logdir))
    with pytest.raises(CorruptionError) as opened:
        walj.Log.open(logdir, segment_bytes=SEG)
    assert opened.value.kind == kind
    with pytest.raises(CorruptionError) as read:
        list(walj.read(logdir))
    assert read.value.kind == kind
    report = walj.verify(logdir)
    assert not report.ok and kind in [p.kind for p in report.problems]
    with pytest.raises(spec_reader.SpecError):
        spec_reader.read_log(logdir)
    assert sorted(os.listdir(logdir)) == names  # nothing removed, nothing added


def _forge(logdir: Path, **fields: Any) -> None:
    from walj.log._base import Base, parse_base

    base = parse_base((logdir / "BASE").read_bytes())
    forged = Base(fields.get("log_id", base.log_id), fields.get("index", base.index),
                  fields.get("first_seq", base.first_seq), fields.get("prev_seal",
                                                                      base.prev_seal))
    (logdir / "BASE").write_bytes(forged.line())


@pytest.mark.parametrize("damage,kind", [
    ("flip", "bad_base"), ("truncate", "bad_base"), ("two_lines", "bad_base"),
    ("huge", "bad_base"), ("symlink", "symlink"), ("fifo", "not_a_regular_file"),
    ("directory", "not_a_regular_file"), ("first", "base_mismatch"),
    ("prev", "base_mismatch"), ("beyond", "missing_segment"),
])
def test_hostile_base_markers_are_refused_and_change_nothing(
        logdir: Path, tmp_path: Path, damage: str, kind: str) -> None:
    _compacted(logdir)
    marker = logdir / "BASE"
    data = marker.read_bytes()
    if damage == "flip":
        marker.write_bytes(data.replace(b'"first":', b'"first":1'))
    elif damage == "truncate":
        marker.write_bytes(data[:-5])
    elif damage == "two_lines":
        marker.write_bytes(data + data)
    elif damage == "huge":
        marker.write_bytes(data[:-1] + b" " * 2000 + b"\n")
    elif damage == "symlink":
        (tmp_path / "elsewhere").write_bytes(data)
        marker.unlink()
        marker.symlink_to(tmp_path / "elsewhere")
    elif damage == "fifo":
        marker.unlink()
        os.mkfifo(marker)
    elif damage == "directory":
        marker.unlink()
        marker.mkdir()
    elif damage == "first":
        _forge(logdir, first_seq=3)
    elif damage == "prev":
        _forge(logdir, prev_seal="0" * 64)
    elif damage == "beyond":
        _forge(logdir, index=99)
    _refused_everywhere(logdir, kind)


def test_a_marker_pointing_at_an_existing_later_segment_is_caught_by_the_one_below(
        logdir: Path) -> None:
    """A well-formed marker copied from a later segment's header hides the segments below it
    from readers; the leftover right below the base shows the lie when its seal differs."""
    _build(logdir)
    segs = segments(logdir)
    header = spec_reader._lines(segs[3].read_bytes())[0].value["header"]  # type: ignore[index]
    from walj.log._base import Base

    (logdir / "BASE").write_bytes(Base(header["log"], header["seg"], header["first"],
                                       "f" * 64).line())
    _refused_everywhere(logdir, "base_mismatch")


# --- the order of system calls ------------------------------------------------------------------

STRACE = shutil.which("strace")
CHILD = textwrap.dedent("""
    import sys, walj
    with walj.Log.open(sys.argv[1], segment_bytes=1024) as log:
        for i in range(40):
            log.append({"i": i, "pad": "x" * 40})
        print(log.drop_before(30))
""")


@pytest.mark.skipif(STRACE is None, reason="strace is not installed")
def test_syscall_order_of_a_drop(tmp_path: Path) -> None:
    """The marker is written, fdatasynced, renamed, and the directory fsynced before the first
    unlink; the directory is fsynced again after the last."""
    out = tmp_path / "trace"
    log = tmp_path / "log"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    result = subprocess.run(
        [str(STRACE), "-f", "-qq", "-o", str(out), "-e",
         "trace=openat,write,pwrite64,fdatasync,fsync,rename,unlink,unlinkat",
         sys.executable, "-c", CHILD, str(log)],
        check=True, env=env, capture_output=True, text=True)
    assert int(result.stdout) >= 2
    events = [(op, os.path.basename(target) if target != str(log) else "DIR")
              for op, target in strace_calls(out.read_text())
              if target.startswith(str(log)) and (op != "openat" or target == str(log)
                                                  or "BASE" in target)]
    start = events.index(("openat", "BASE.tmp"))
    drop = events[start:]
    assert drop[1:5] == [("write", "BASE.tmp"), ("fdatasync", "BASE.tmp"),
                         ("rename", "BASE"), ("openat", "DIR")], drop
    assert drop[5] == ("fsync", "DIR")
    unlinks = [i for i, (op, t) in enumerate(drop) if op == "unlink" and t.startswith("seg-")]
    assert unlinks and unlinks[0] > 5
    assert [t for op, t in drop if op == "unlink"] == sorted(
        t for op, t in drop if op == "unlink")  # oldest first
    assert ("fsync", "DIR") in drop[unlinks[-1]:]


# --- close(seal=True): a finished log whose every segment is sealed -----------------------------


def test_close_with_seal_seals_the_last_segment_and_a_reopen_starts_the_next(
        logdir: Path) -> None:
    records = make_records(30)
    with walj.Log.open(logdir, segment_bytes=SEG) as log:
        for record in records:
            log.append(record)
        log.close(seal=True)
        log.close(seal=True)  # closed: nothing more is written
    last = segments(logdir)[-1].read_bytes().splitlines()[-1]
    assert b'"seal":' in last and f'"last":{len(records)}'.encode() in last
    assert _check(logdir, records, 1) == 1
    with walj.Log.open(logdir, segment_bytes=SEG) as log:
        assert log.last_seq == len(records)
        sealed = len(segments(logdir)) - 1  # every segment but the one the reopen made
        assert log.drop_before(log.last_seq + 1) == sealed
        log.close(seal=True)  # an empty active segment seals too (0 records)
    _check(logdir, records, len(records) + 1)


@pytest.mark.parametrize("mode", CRASH_MODES)
def test_a_crash_at_every_call_of_a_sealing_close_keeps_every_record(
        tmp_path: Path, mode: str) -> None:
    records = make_records(12)
    for after in (False, True):
        for k in range(3):  # the seal's write, its sync, and nothing after
            path = tmp_path / f"log-{k}-{after}"
            fs = FaultyFS(freeze_on_crash=True)
            log = walj.Log.open(path, segment_bytes=SEG, _fs=fs)
            for record in records:
                log.append(record)
            fs.crash_at("any", k + 1, after=after)
            try:
                log.close(seal=True)
            except SimulatedCrash:
                pass
            fs.crash(mode, random.Random(k))
            abandon(log)
            assert _check(path, records, 1) == 1, (k, after)
            with walj.Log.open(path, segment_bytes=SEG) as reopened:
                assert reopened.last_seq == len(records)
            _check(path, records, 1)


def test_a_reader_overtaken_by_a_drop_gets_a_typed_error_naming_the_new_start(
        logdir: Path) -> None:
    records = _build(logdir, 80)
    reader = walj.read(logdir)
    assert next(reader).seq == 1  # the first segment is open; the next ones are not yet
    with walj.Log.open(logdir, segment_bytes=SEG) as log:
        assert log.drop_before(60) >= 2
        first = log.first_seq
    with pytest.raises(DroppedWhileReadingError) as info:
        list(reader)
    assert info.value.first_seq == first
    _check(logdir, records, 60)


SEAL_CHILD = textwrap.dedent("""
    import sys, walj
    log = walj.Log.open(sys.argv[1], segment_bytes=1024, sync="never")
    for i in range(5):
        log.append({"i": i})
    log.close(seal=True)
""")


@pytest.mark.skipif(STRACE is None, reason="strace is not installed")
def test_syscall_order_of_a_sealing_close(tmp_path: Path) -> None:
    """The seal is the last write to the segment and is fdatasynced; no next segment is made."""
    out = tmp_path / "trace"
    log = tmp_path / "log"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    subprocess.run([str(STRACE), "-f", "-qq", "-o", str(out), "-e",
                    "trace=openat,write,pwrite64,fdatasync,fsync", sys.executable, "-c",
                    SEAL_CHILD, str(log)], check=True, env=env)
    # A descriptor opened under the temporary name, before the rename, names its segment.
    events = [(op, os.path.basename(target).removesuffix(".tmp"))
              for op, target in strace_calls(out.read_text())
              if "seg-" in target and target.startswith(str(log))]
    segment_events = [e for e in events if e[1] == "seg-0000000001.jsonl"]
    assert segment_events[-2:] == [("write", "seg-0000000001.jsonl"),
                                   ("fdatasync", "seg-0000000001.jsonl")]
    assert not any("seg-0000000002" in t for _, t in events)
    assert b'"seal":' in (log / "seg-0000000001.jsonl").read_bytes().splitlines()[-1]


@pytest.mark.parametrize("kind", ["fifo", "directory", "symlink"])
def test_a_base_tmp_that_is_not_a_regular_file_is_refused_and_nothing_dropped(
        logdir: Path, tmp_path: Path, kind: str) -> None:
    records = _build(logdir)
    tmp = logdir / "BASE.tmp"
    if kind == "fifo":
        os.mkfifo(tmp)
    elif kind == "directory":
        tmp.mkdir()
    else:
        tmp.symlink_to(tmp_path / "elsewhere")
    with walj.Log.open(logdir, segment_bytes=SEG) as log:
        names = sorted(os.listdir(logdir))
        with pytest.raises(CorruptionError) as info:
            log.drop_before(40)
        assert info.value.kind in ("not_a_regular_file", "symlink")
        assert not log.poisoned
        assert sorted(os.listdir(logdir)) == names
        log.append({"still": "usable"})
    _check(logdir, [*records, {"still": "usable"}], 1)


class _PausingFS(FaultyFS):
    """Stops a drop just before its marker's rename until the test lets it go on."""

    def __init__(self) -> None:
        super().__init__()
        self.at_rename = threading.Event()
        self.go_on = threading.Event()

    def rename(self, src: str, dst: str) -> None:
        if dst.endswith("BASE"):
            self.at_rename.set()
            self.go_on.wait(timeout=60)
        super().rename(src, dst)


def test_close_waits_for_a_drop_under_way(logdir: Path) -> None:
    """Were the directory let go mid-drop, another writer could compact further and this drop's
    older marker would then land over the newer one, naming a segment that is gone."""
    records = _build(logdir)
    fs = _PausingFS()
    log = walj.Log.open(logdir, segment_bytes=SEG, _fs=fs)
    dropper = threading.Thread(target=log.drop_before, args=(40,))
    dropper.start()
    assert fs.at_rename.wait(timeout=60)
    closer = threading.Thread(target=log.close)
    closer.start()
    closer.join(timeout=0.3)
    still_waiting = closer.is_alive()  # slow scheduling can only make this pass, never fail
    fs.go_on.set()
    dropper.join()
    closer.join()
    assert still_waiting, "close() returned while a drop was under way"
    _check(logdir, records, 40)
    assert walj.verify(logdir).leftovers == []
