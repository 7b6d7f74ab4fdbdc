"""Regression tests, one per bug the torture suite found, each named after its bug."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from faultfs import FaultyFS, abandon
from sigkill import ENV
from test_torture_sigkill_journal_compaction import Oracle

import walj


@pytest.mark.parametrize("op, err", [("rename", errno.EIO), ("write", errno.ENOSPC),
                                     ("create", errno.EIO)])
def test_regression_lock_kept_after_failed_open(tmp_path: Path, op: str, err: int) -> None:
    """Log.open writes LOCK.owner after taking the lock; when that write failed (EIO, a full
    disk) the exception left the lock held and the directory marked open in this process, so
    every later open in the process raised LockedError until it exited."""
    path = tmp_path / "log"
    with walj.Log.open(path) as log:
        log.append({"a": 1})
    fs = FaultyFS()
    fs.fail(op, 1, err)  # the first write-side call of an open is the owner file's
    # LOCK.owner is informational: its failure no longer fails the open at all.
    walj.Log.open(path, _fs=fs).close()
    assert fs.injected and fs.injected[0].startswith(f"fail {op}") and "LOCK.owner" in (
        fs.injected[0]), fs.injected
    with walj.Log.open(path, lock_timeout=1) as log:
        assert log.last_seq == 1


@pytest.mark.parametrize("damage", ["duplicated line", "swapped lines"])
def test_regression_read_yields_out_of_order_record(tmp_path: Path, damage: str) -> None:
    """walj.read handed the caller a record whose seq broke the order (a repeat, or one from
    further on) and raised CorruptionError only at the next record: a reader saw seq 13 twice."""
    path = tmp_path / "log"
    with walj.Log.open(path, segment_bytes=1024) as log:
        for i in range(40):
            log.append({"i": i, "text": "t" * (20 + i % 50)})
    segment = sorted(path.glob("seg-*.jsonl"))[1]
    lines = segment.read_bytes().splitlines(keepends=True)
    if damage == "duplicated line":
        lines.insert(4, lines[3])
    else:
        lines[2], lines[3] = lines[3], lines[2]
    segment.write_bytes(b"".join(lines))
    seqs: list[int] = []
    with pytest.raises(walj.CorruptionError):
        for record in walj.read(path):
            seqs.append(record.seq)
    assert seqs == list(range(1, len(seqs) + 1))


def _nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


def _read_from_a_deeper_stack(path: Path, frames: int) -> list[walj.Record]:
    if frames:
        return _read_from_a_deeper_stack(path, frames - 1)
    return list(walj.read(path))


def test_regression_deeply_nested_record(tmp_path: Path) -> None:
    """A record nested about 1,000 levels deep was appended, then could not be read back from
    a call stack a few dozen frames deeper (msgspec's RecursionError escaped walj.read and any
    journal replay); one nested deeper still made append raise RecursionError, not
    SerializationError, and so did one holding a null (the NaN search recursed), as
    journal.resolve(..., output=...) with a deep output did."""
    path = tmp_path / "log"
    with walj.Log.open(path) as log:
        with pytest.raises(walj.SerializationError):
            log.append({"deep": _nested(1200)})
        with pytest.raises(walj.SerializationError):
            log.append({"deep": _nested(1200), "none": None})  # the NaN search recursed too
        for record in ({"deep": _nested(980)}, {"deep": _nested(950), "none": None}):
            with pytest.raises(walj.SerializationError):
                log.append(record)  # deeper than the 256-level limit: refused up front
        legal = {"deep": _nested(255), "none": None}  # the record's own dict is level 1
        log.append(legal)
    for frames in (0, 50, 200, 850):
        try:
            back = _read_from_a_deeper_stack(path, frames)
        except RecursionError as exc:
            raise AssertionError(f"RecursionError {frames} frames down") from exc
        assert [r.data for r in back] == [legal], frames


def test_regression_verified_line_that_is_not_json(tmp_path: Path) -> None:
    """A line whose checksum verifies but whose data is not a JSON object: bad JSON made
    walj.read raise ValueError (since made a CorruptionError), and an array, a number or null
    is still handed out as a Record whose data is not a dict."""
    import xxhash

    path = tmp_path / "log"
    with walj.Log.open(path) as log:
        log.append({"a": 1})
    segment = sorted(path.glob("seg-*.jsonl"))[-1]
    for data in (b"", b"[1]", b'{"a":', b"1", b"null"):
        body = b'"seq":2,"data":' + data + b"}"
        line = b'{"xxh64":"%016x",%s\n' % (xxhash.xxh64_intdigest(body), body)
        original = segment.read_bytes()
        segment.write_bytes(original + line)
        for recovery in ("tolerate_tail", "salvage"):
            try:
                records = list(walj.read(path, recovery=recovery))
            except walj.WaljError:
                continue
            assert all(isinstance(r.data, dict) for r in records), (data, recovery)
        segment.write_bytes(original)


class _LosesTheMkdirRace(FaultyFS):
    """Another process creates the log directory between Log.open's check and its mkdir."""

    def mkdir(self, path: str) -> None:
        if not os.path.exists(path):
            os.mkdir(path, 0o700)
        super().mkdir(path)


def test_regression_open_race_on_a_new_directory(tmp_path: Path) -> None:
    """Two processes opening the same new log directory at once: the one whose mkdir came second
    got FileExistsError instead of the log (or LockedError)."""
    path = tmp_path / "log"
    with walj.Log.open(path, _fs=_LosesTheMkdirRace()) as log:
        log.append({"a": 1})
    assert [r.data for r in walj.read(path)] == [{"a": 1}]


class _InterruptedSync(FaultyFS):
    """The next sync is interrupted (Ctrl-C: KeyboardInterrupt) before its fdatasync runs."""

    interrupt = False

    def sync(self, fd: int) -> None:
        if self.interrupt:
            self.interrupt = False
            raise KeyboardInterrupt
        super().sync(fd)


@pytest.mark.parametrize("sync", ["batch", "never"])
def test_regression_interrupted_group_sync_counted_as_durable(tmp_path: Path, sync: str) -> None:
    """The group-commit leader marked its target durable in a `finally` whenever the sync did
    not raise OSError, so an interrupt (KeyboardInterrupt) before the fdatasync counted as a
    sync: later sync() calls, and appenders waiting on that round, returned without the bytes
    being on disk, and a power cut then lost acknowledged records."""
    path = tmp_path / "log"
    fs = _InterruptedSync()
    log = walj.Log.open(path, sync=sync, _fs=fs)
    fs.interrupt = True
    with pytest.raises(KeyboardInterrupt):
        log.append({"a": 1}, durable=True)
    log.sync()  # returns: record 1 is durable now
    fs.crash()
    abandon(log)
    assert [r.data for r in walj.read(path)] == [{"a": 1}]


@pytest.mark.parametrize("sync", ["never", "interval"])
def test_regression_reordered_unsynced_appends_refuse_reopen(tmp_path: Path, sync: str) -> None:
    """FORMAT.md allows a crash to persist unsynced appends out of order. When an earlier one
    was lost (a hole of zeros) and a later one reached the disk, the later line verified after a
    bad one, so recovery called it damage and refused to reopen (CorruptionError) after an
    ordinary power cut. Nothing from the hole on was ever acknowledged as durable."""
    path = tmp_path / "log"
    log = walj.Log.open(path, sync=sync, sync_interval_ms=60_000)
    log.append({"n": 0}, durable=True)
    for n in range(1, 4):
        log.append({"n": n, "pad": "x" * 40})
    abandon(log)
    # The power cut: the first unsynced append never reached the disk; the two after it did.
    segment = sorted(path.glob("seg-*.jsonl"))[-1]
    lines = segment.read_bytes().splitlines(keepends=True)
    lines[2] = b"\0" * len(lines[2])
    segment.write_bytes(b"".join(lines))
    with walj.Log.open(path) as reopened:
        assert reopened.last_seq == 1
        assert reopened.torn_tail is not None
        reopened.append({"n": "after"})
    assert [r.data["n"] for r in walj.read(path)] == [0, "after"]
    assert walj.verify(path).ok


def test_regression_enospc_on_the_final_sync_is_not_disk_full(tmp_path: Path) -> None:
    """close() syncs what sync="never" left unsynced; when that sync failed with ENOSPC it
    raised a plain PoisonedError, where every other ENOSPC gives DiskFullError."""
    fs = FaultyFS()
    log = walj.Log.open(tmp_path / "log", sync="never", _fs=fs)
    log.append({"a": 1})
    fs.fail("sync", 1, errno.ENOSPC)
    with pytest.raises(walj.DiskFullError):
        log.close()


def test_regression_hole_before_an_unsynced_seal(tmp_path: Path) -> None:
    """A power cut during a rotation, before the seal's sync: the seal line reached the disk,
    an earlier unsynced append did not (a hole of zeros), and the next segment was never made.
    The hole rule let only torn lines and a seq gap follow the hole, so the seal's
    seal_mismatch made recovery refuse to reopen; and once the tail is cut, the segment must be
    resumed as unsealed, not continued after the seal's last seq."""
    path = tmp_path / "log"
    log = walj.Log.open(path, sync="never", segment_bytes=1024)
    log.append({"n": 0}, durable=True)
    n = 1
    while len(list(path.glob("seg-*.jsonl"))) < 2:
        log.append({"n": n, "pad": "x" * 40})
        n += 1
    abandon(log)
    # The crash state: no second segment; in the first, the append after the durable one lost.
    sorted(path.glob("seg-*.jsonl"))[1].unlink()
    first = sorted(path.glob("seg-*.jsonl"))[0]
    lines = first.read_bytes().splitlines(keepends=True)
    assert b'"seal"' in lines[-1]
    lines[2] = b"\0" * len(lines[2])
    first.write_bytes(b"".join(lines))
    with walj.Log.open(path, segment_bytes=1024) as reopened:
        assert reopened.last_seq == 1
        reopened.append({"n": "after"})
    assert [r.data["n"] for r in walj.read(path)] == [0, "after"]
    with walj.Log.open(path, segment_bytes=1024) as reopened:
        assert reopened.last_seq == 2
    assert walj.verify(path).ok


def test_regression_verify_ends_a_log_dropped_whole_at_its_base(tmp_path: Path) -> None:
    """A drop up to last_seq + 1 leaves only the active segment's header, first seq N + 1:
    verify (and every reader built on its scan: sweep, the CLI) said the log ended at seq 0,
    where Log.open says N, and the SIGKILL compaction test took every record for lost."""
    path = tmp_path / "log"
    with walj.Log.open(path, segment_bytes=1024) as log:
        for i in range(30):
            log.append({"i": i, "pad": "x" * 40})
        log.rotate()
        assert log.drop_before(log.last_seq + 1) > 0
        assert walj.verify(path).last_seq == 30  # beside the writer
    report = walj.verify(path)
    assert report.ok and report.last_seq == 30 and list(walj.read(path)) == []
    with walj.Log.open(path) as log:
        assert log.last_seq == 30 and log.append({"i": 30}) == 31


# Resolves one execution, then dies by SIGKILL before it could say so: the kill that falls
# between a resolution's durable record and the workload child's "R" oracle line.
_RESOLVE_THEN_DIE = """
import os, signal, sys
import walj
journal = walj.ToolJournal.open(sys.argv[1], sync="batch", segment_bytes=1024)
journal.resolve(sys.argv[2], "not_performed", note="torture", actor="torture")
os.kill(os.getpid(), signal.SIGKILL)
"""


def _lost(x: int) -> None:
    raise walj.ToolOutcomeUnknown("the connection dropped after the request went out")


def _ok(x: int) -> dict[str, int]:
    return {"x": x, "double": 2 * x}


def _lose_a_call(journal: walj.ToolJournal, call_id: str) -> str:
    """Dispatch a call whose outcome is unknown; the id of the blocker it leaves."""
    with journal.turn() as turn, pytest.raises(walj.ToolOutcomeUnknown):
        turn.dispatch("lost", {"x": 0}, call_id=call_id)
    (blocker,) = journal.recovery.blockers
    assert blocker.execution_id is not None
    return blocker.execution_id


@pytest.mark.parametrize("archived", [True, False])
def test_regression_unsaid_resolution_compacted_away_counted_forgotten(
        tmp_path: Path, archived: bool) -> None:
    """The SIGKILL journal-compaction test failed under load with "acknowledged blockers
    forgotten": a kill fell after a resolution was durable and before the child said so, and a
    later round's compaction dropped the segment holding that resolution. The oracle took
    unsaid resolutions only from the local segments of the moment, so it still counted the
    execution as an acknowledged blocker, while the journal rightly no longer blocked on it.
    The oracle was wrong, not walj: it now remembers every resolution it has seen on disk."""
    path = tmp_path / "journal"
    url = f"file://{tmp_path / 'archive'}" if archived else None
    options = {"sync": "batch", "segment_bytes": 1024, "store_outputs": True}
    oracle = Oracle()
    with walj.ToolJournal.open(path, tools={"ok": _ok, "lost": _lost}, **options) as journal:
        resolved = _lose_a_call(journal, "lost-1")
    oracle.feed([f"U {resolved}"])
    oracle.check(path, url, "round 1")

    child = subprocess.run([sys.executable, "-c", _RESOLVE_THEN_DIE, str(path), resolved],
                           env=ENV, capture_output=True, text=True, timeout=60)
    assert child.returncode == -signal.SIGKILL, child.stderr
    oracle.check(path, url, "round 2")  # no "R" line: the resolution is found on disk

    with walj.ToolJournal.open(path, tools={"ok": _ok, "lost": _lost}, **options) as journal:
        for x in range(8):
            with journal.turn() as turn:
                turn.dispatch("ok", {"x": x}, call_id=f"ok-{x}")
        waiting = _lose_a_call(journal, "lost-2")  # a blocker whose intent is dropped too
        for x in range(8):
            with journal.turn() as turn:
                assert turn.dispatch("ok", {"x": x}, call_id=f"after-{x}").outcome == "blocked"
        lines = [f"U {waiting}", f"a {journal._log.last_seq + 1}"]
        report = journal.compact(keep_turns=0, archive=url)
        lines.append(f"A {report.first_seq}")
        assert {b.execution_id for b in journal.recovery.blockers} == {waiting}
    oracle.feed(lines)
    local = [r.data for r in walj.read(path)]
    assert report.dropped_segments and not any(
        d.get("kind") in ("tool_execution_started", "tool_execution_resolved") for d in local)
    oracle.check(path, url, "round 3")  # failed here: [resolved] forgotten

    # Only a resolution a check saw on disk excuses a blocker: an oracle that did not look
    # after the kill before "R" still counts that blocker forgotten.
    blind = Oracle()
    blind.feed([f"U {resolved}", *lines])
    with pytest.raises(AssertionError, match=rf"blockers forgotten: \['{resolved}'\]"):
        blind.check(path, url, "round 3, round 2 unchecked")


# Leaves a blocker (optionally across a compaction), then starts a checkpoint and dies by
# SIGKILL in the middle of writing its first part: the short write a kill during a large
# write() leaves, at a page boundary, so the next segment begins with a torn checkpoint.
_TEAR_A_CHECKPOINT = """
import os, signal, sys
import walj
from walj.log.fs import FileSystem

class TearsACheckpoint(FileSystem):
    armed = False

    def write(self, fd, data):
        if self.armed and b'"data":{"kind":"checkpoint"' in data[:100]:
            assert len(data) > 4096, len(data)
            os.write(fd, data[:4096 - os.fstat(fd).st_size % 4096])
            os.kill(os.getpid(), signal.SIGKILL)
        return super().write(fd, data)

    def pwrite(self, fd, data, offset):
        if self.armed and b'"data":{"kind":"checkpoint"' in data[:100]:
            assert len(data) > 4096, len(data)
            os.pwrite(fd, data[:4096 - offset % 4096], offset)
            os.kill(os.getpid(), signal.SIGKILL)
        return super().pwrite(fd, data, offset)

def lost(x):
    raise walj.ToolOutcomeUnknown("the connection dropped after the request went out")

fs = TearsACheckpoint()
def ok(x, pad):
    return {"x": x, "pad": pad}  # stored: the checkpoint carries it, a part spans pages
    # (random: a checkpoint packs its settling records, and "p" * 2000 packs to nothing)

journal = walj.ToolJournal.open(sys.argv[1], tools={"ok": ok, "lost": lost},
                                sync="batch", segment_bytes=1024, store_outputs=True, _fs=fs)
for x in range(8):
    with journal.turn() as turn:
        turn.dispatch("ok", {"x": x, "pad": os.urandom(1000).hex()}, call_id=f"ok-{x}")
with journal.turn() as turn:
    try:
        turn.dispatch("lost", {"x": 0}, call_id="lost")
    except walj.ToolOutcomeUnknown:
        pass
(blocker,) = journal.recovery.blockers
print(blocker.execution_id, flush=True)
if sys.argv[2] == "compacted":
    journal.compact(keep_turns=0)
fs.armed = True
journal.checkpoint()
"""


@pytest.mark.parametrize("recovery", ["tolerate_tail", "salvage"])
@pytest.mark.parametrize("history", ["compacted", "whole"])
def test_regression_checkpoint_torn_in_its_first_part_forgets_blockers(
        tmp_path: Path, history: str, recovery: str) -> None:
    """A SIGKILL in the middle of writing a checkpoint's first part left its opening bytes as
    a torn tail at the start of a segment. The open chose that segment to rebuild from (it
    looks at a segment's first bytes, unverified), the scan fed no record at all, and the
    empty state passed for a whole one: with recovery="salvage" the journal reported no
    blockers (the SIGKILL journal-compaction test's "acknowledged blockers forgotten"); with
    the default recovery it cut the tail, then refused to open, saying the log had no complete
    checkpoint. The open now passes over a checkpoint it began at and did not load."""
    path = tmp_path / "journal"
    child = subprocess.run([sys.executable, "-c", _TEAR_A_CHECKPOINT, str(path), history],
                           env=ENV, capture_output=True, text=True, timeout=60)
    assert child.returncode == -signal.SIGKILL, child.stderr
    blocker = child.stdout.split()[0]
    last = sorted(path.glob("seg-*.jsonl"))[-1].read_bytes()
    header, torn = last.split(b"\n", 1)
    assert b'"data":{"kind":"checkpoint"' in torn[:100] and not torn.endswith(b"\n")
    assert len(last) % 4096 == 0
    assert (next(iter(walj.read(path))).seq > 1) == (history == "compacted")
    ran: list[int] = []

    def spy(x: int) -> None:
        ran.append(x)

    with walj.ToolJournal.open(path, tools={"ok": spy}, recovery=recovery) as journal:
        assert [b.execution_id for b in journal.recovery.blockers] == [blocker]
        if recovery != "salvage":  # read-only
            with journal.turn() as turn:
                assert turn.dispatch("ok", {"x": 1}, call_id="after").outcome == "blocked"
    assert not ran
