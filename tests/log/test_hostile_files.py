"""Hostile entries in a log directory: a foreign segment behind a start_seq skip, FIFOs, sockets
and directories named like log files, forged header limits, symlinked quarantine folders and
hard-linked copies. Each test is named after its issue item and uses real files of that kind.

Whatever could hang if the fix regressed (a blocking open of a FIFO) runs in a child process
with a timeout, so that a regression fails the test instead of stalling the run."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tracemalloc
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import ENV, make_journal, walj_cli
from helpers import make_records, segments, write_log

import walj
from walj.log import format as fmt
from walj.log.fs import FileSystem
from walj.log.quarantine import cut_segment

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs and sockets")

CHILD_TIMEOUT = 60.0
MIB = 2**20

# Runs in the child: `outcome(call)` is what the call returned, or which typed error it raised.
_PRELUDE = """
import json, os, sys
import walj

def outcome(call):
    try:
        value = call()
    except walj.WaljError as exc:
        return {"error": type(exc).__name__, "kind": getattr(exc, "kind", None),
                "file": getattr(exc, "file", None)}
    except OSError as exc:
        return {"error": "OSError", "errno": exc.errno, "text": str(exc)}
    return {"value": value}

path = sys.argv[1]
"""


def in_child(code: str, path: Path) -> Any:
    """Run `code` (which sets `result`) in a fresh interpreter and return `result`."""
    script = _PRELUDE + code + "\nprint(json.dumps(result))\n"
    proc = subprocess.run([sys.executable, "-c", script, str(path)], env=ENV,
                          capture_output=True, text=True, timeout=CHILD_TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def refused(kind: str, name: str) -> dict[str, Any]:
    return {"error": "CorruptionError", "kind": kind, "file": name}


def make_special(path: Path, what: str) -> None:
    """A FIFO, a Unix socket (bound, so a real socket file) or a directory at `path`."""
    if what == "fifo":
        os.mkfifo(path)
    elif what == "socket":
        sock = socket.socket(socket.AF_UNIX)
        here = os.getcwd()
        os.chdir(path.parent)  # a relative name: socket paths are limited to about 100 bytes
        try:
            sock.bind(path.name)
        finally:
            os.chdir(here)
            sock.close()
    else:
        path.mkdir()


def torn_log(path: Path, count: int = 5) -> None:
    """A closed log whose last segment ends in half a line, as a crash mid-append leaves it."""
    write_log(path, make_records(count))
    with open(segments(path)[-1], "ab") as f:
        f.write(b'{"xxh64":"0123')


def file_bytes(path: Path) -> dict[str, bytes]:
    """The bytes of every regular file under `path` (no FIFO in it), to prove nothing changed."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file() and not p.is_symlink()}


# --- item 7: start_seq skips no check a full read makes -----------------------------------


def _chained_log(path: Path) -> None:
    write_log(path, make_records(60), segment_bytes=1024)
    assert len(segments(path)) >= 4


def _last_first_seq(path: Path) -> int:
    header = fmt.parse_header(segments(path)[-1].read_bytes().split(b"\n", 1)[0])
    assert header is not None
    return header.first_seq


def _kind_raised(call: Callable[[], object]) -> tuple[str | None, str | None]:
    with pytest.raises(walj.CorruptionError) as info:
        call()
    return info.value.kind, info.value.file


def test_item7_read_from_seq_refuses_a_foreign_segment(tmp_path: Path) -> None:
    mine, other = tmp_path / "mine", tmp_path / "other"
    _chained_log(mine)
    _chained_log(other)  # the same records, so the same seqs: only the log id tells them apart
    shutil.copyfile(segments(other)[1], segments(mine)[1])
    name = segments(mine)[1].name
    late = _last_first_seq(mine)
    assert _kind_raised(lambda: list(walj.read(mine))) == ("foreign_segment", name)
    assert _kind_raised(lambda: list(walj.read(mine, start_seq=late))) == (
        "foreign_segment", name)
    run = walj_cli("dump", "--from-seq", str(late), "--json", mine)
    assert run.code == 1, (run.out, run.err)
    assert f"{name} at byte 0" in run.err and "foreign_segment" in run.err


def test_item7_read_from_seq_refuses_a_broken_seal_chain(tmp_path: Path) -> None:
    log = tmp_path / "log"
    _chained_log(log)
    # Edit a record of the first segment and make that segment consistent again (line checksum,
    # seal digest, seal checksum): only the next header's `prev` can tell.
    first = segments(log)[0]
    lines = first.read_bytes().splitlines(keepends=True)
    seq, data = fmt.parse_data(lines[2][:-1]) or (0, b"")
    lines[2] = fmt.frame_record(seq, data.replace(b"record", b"RECORD"))
    seal = fmt.parse_seal(lines[-1][:-1])
    assert seal is not None
    body = b"".join(lines[:-1])
    lines[-1] = fmt.frame(fmt.Seal(seal.last_seq, seal.records,
                                   hashlib.sha256(body).hexdigest()).body())
    first.write_bytes(body + lines[-1])
    name = segments(log)[1].name
    late = _last_first_seq(log)
    assert _kind_raised(lambda: list(walj.read(log))) == ("seal_chain", name)
    assert _kind_raised(lambda: list(walj.read(log, start_seq=late))) == ("seal_chain", name)


class _CountingFS(FileSystem):
    """Counts sequential reads per file name: a skipped segment is never read that way."""

    def __init__(self) -> None:
        self.names: dict[int, str] = {}
        self.reads: Counter[str] = Counter()

    def open_read(self, path: str) -> int:
        fd = super().open_read(path)
        self.names[fd] = os.path.basename(path)
        return fd

    def read(self, fd: int, size: int) -> bytes:
        self.reads[self.names[fd]] += 1
        return super().read(fd, size)


def test_item7_skipped_segments_are_checked_from_their_ends_only(tmp_path: Path) -> None:
    log = tmp_path / "log"
    _chained_log(log)
    late = _last_first_seq(log)
    fs = _CountingFS()
    got = [r.seq for r in walj.read(log, start_seq=late, _fs=fs)]
    assert got == list(range(late, 61))
    assert set(fs.reads) == {segments(log)[-1].name}


# --- item 11: nothing but regular files is opened -----------------------------------------


@pytest.mark.parametrize("what", ["fifo", "socket", "directory"])
def test_item11_fifo_named_like_a_segment_is_refused(tmp_path: Path, what: str) -> None:
    log = tmp_path / "log"
    write_log(log, make_records(3))
    name = fmt.segment_name(2)
    make_special(log / name, what)
    result = in_child("""
def verify():
    report = walj.verify(path)
    return [report.ok, [[p.file, p.kind] for p in report.problems]]

result = [outcome(lambda: walj.Log.open(path).close()),
          outcome(lambda: walj.Log.open(path, recovery="strict").close()),
          outcome(lambda: len(list(walj.read(path)))),
          outcome(verify)]
""", log)
    assert result == [refused("not_a_regular_file", name)] * 3 + [
        {"value": [False, [[name, "not_a_regular_file"]]]}]
    run = walj_cli("sweep", "--jobs", "1", "--json", tmp_path, timeout=CHILD_TIMEOUT)
    assert run.code == 1, run.err
    (session,) = run.json()["sessions"]
    assert session["status"] == "corrupt"
    assert [p["kind"] for p in session["problems"]] == ["not_a_regular_file"]


@pytest.mark.parametrize("what", ["fifo", "socket", "directory"])
def test_item11_fifo_named_like_a_temp_segment_is_refused(tmp_path: Path, what: str) -> None:
    log = tmp_path / "log"
    write_log(log, make_records(3))
    name = fmt.segment_name(2) + ".tmp"
    make_special(log / name, what)
    result = in_child("result = outcome(lambda: walj.Log.open(path).close())", log)
    assert result == refused("not_a_regular_file", name)
    assert os.path.lexists(log / name)  # refused, not removed


@pytest.mark.parametrize("what", ["fifo", "socket", "directory"])
def test_item11_file_system_opens_only_regular_files(tmp_path: Path, what: str) -> None:
    make_special(tmp_path / "x", what)
    result = in_child("""
from walj.log.fs import FileSystem
fs = FileSystem()
result = [outcome(lambda: fs.open_read(path)), outcome(lambda: fs.open_append(path))]
""", tmp_path / "x")
    assert result == [refused("not_a_regular_file", "x")] * 2


def test_item11_fifo_named_lock_owner_does_not_hang_inspect(tmp_path: Path) -> None:
    log = tmp_path / "log"
    make_journal(log, turns=1)
    (log / "LOCK.owner").unlink(missing_ok=True)
    os.mkfifo(log / "LOCK.owner")
    result = in_child("""
from walj.log.lock import read_owner
result = outcome(lambda: read_owner(path))
""", log)
    assert result == {"value": None}
    run = walj_cli("inspect", "--json", log, timeout=CHILD_TIMEOUT)
    assert run.code == 0, run.err
    assert run.json()["writer"] is None


def test_item11_fifo_named_quarantine_manifest_does_not_hang_verify(tmp_path: Path) -> None:
    log = tmp_path / "log"
    write_log(log, make_records(3))
    (log / "quarantine").mkdir()
    os.mkfifo(log / "quarantine" / "MANIFEST.jsonl")
    run = walj_cli("verify", "--json", log, timeout=CHILD_TIMEOUT)
    assert run.code == 0, run.err
    assert run.json()["quarantine"] == []


# --- item 12: a forged max_record is not trusted; a long line is scanned in linear time -------


def _segment_with_header(path: Path, max_record: int, *lines: bytes) -> Path:
    path.mkdir()
    header = fmt.Header(fmt.FORMAT_VERSION, "ab" * 16, 1, 1, "", max_record, 1.0)
    seg = path / fmt.segment_name(1)
    seg.write_bytes(fmt.frame(header.body()) + b"".join(lines))
    return seg


def test_item12_forged_max_record_is_a_bad_header(tmp_path: Path) -> None:
    log = tmp_path / "log"
    seg = _segment_with_header(log, 2**40, fmt.frame_record(1, b'{"a":1}'))
    # The case: 384 MiB of non-newline bytes (a hole: zeros that take no disk space).
    os.truncate(seg, seg.stat().st_size + 384 * MIB)
    result = in_child("""
report = walj.verify(path)
result = [[p.offset, p.kind] for p in report.problems]
""", log)
    assert result[0] == [0, "bad_header"]
    for limit, ok in ((fmt.MAX_RECORD_BYTES_LIMIT, True), (fmt.MAX_RECORD_BYTES_LIMIT + 1, False),
                      (2**40, False)):
        header = fmt.Header(fmt.FORMAT_VERSION, "ab" * 16, 1, 1, "", limit, 1.0)
        assert (fmt.parse_header(fmt.frame(header.body())[:-1]) is not None) is ok, limit


@pytest.mark.parametrize("newline", [False, True], ids=["torn", "complete"])
def test_item12_a_64_mib_line_is_scanned_in_bounded_memory(tmp_path: Path,
                                                           newline: bool) -> None:
    log = tmp_path / "log"
    size = 64 * MIB
    seg = _segment_with_header(log, fmt.MAX_RECORD_BYTES_LIMIT)
    with open(seg, "ab") as f:
        for _ in range(size // MIB):
            f.write(b"x" * MIB)
        if newline:
            f.write(b"\n")
    tracemalloc.start()
    try:
        report = walj.verify(log)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert report.torn_tail is not None
    assert report.torn_tail.kind == ("bad_line" if newline else "incomplete_line")
    # Held once while torn; once more while joined when its newline comes. Copying the growing
    # buffer per chunk, as before, held it twice and three times.
    bound = (2.5 if newline else 1.5) * size
    assert peak < bound, f"peak {peak / MIB:.0f} MiB for a {size // MIB} MiB line"


# --- item 14: cuts stay inside the log and never reach another name of the same file ---------


@pytest.mark.parametrize("what", ["symlink", "file"])
def test_item14_symlinked_quarantine_is_refused(tmp_path: Path, what: str) -> None:
    log, outside = tmp_path / "log", tmp_path / "outside"
    torn_log(log)
    outside.mkdir()
    if what == "symlink":
        (log / "quarantine").symlink_to(outside)
    else:
        (log / "quarantine").write_bytes(b"")
    kind = "symlink" if what == "symlink" else "not_a_directory"
    before = {seg.name: seg.read_bytes() for seg in segments(log)}
    seg = segments(log)[-1]
    with pytest.raises(walj.CorruptionError) as info:
        walj.Log.open(log)
    assert (info.value.kind, info.value.file) == (kind, "quarantine")
    with pytest.raises(walj.CorruptionError) as info:
        cut_segment(FileSystem(), str(log), seg.name, seg.stat().st_size - 14, "incomplete_line")
    assert info.value.kind == kind
    run = walj_cli("repair", log)
    assert run.code == 1 and "quarantine" in run.err, run.err
    assert {seg.name: seg.read_bytes() for seg in segments(log)} == before
    assert list(outside.iterdir()) == []


def _link_copy(src: Path, dst: Path) -> None:
    """What `cp -al src dst` makes: the same tree, every file a hard link to the original."""
    for root, _, files in os.walk(src):
        target = dst / Path(root).relative_to(src)
        target.mkdir()
        for name in files:
            os.link(Path(root) / name, target / name)


def test_item14_hard_linked_segment_is_refused_for_writing(tmp_path: Path) -> None:
    original, copy = tmp_path / "original", tmp_path / "copy"
    torn_log(original)
    _link_copy(original, copy)
    before = file_bytes(original)
    seg = segments(copy)[-1]
    for recovery in ("tolerate_tail", "strict"):
        with pytest.raises(walj.CorruptionError) as info:
            walj.Log.open(copy, recovery=recovery)
        assert (info.value.kind, info.value.file) == ("hard_link", seg.name)
    with pytest.raises(walj.CorruptionError) as info:
        cut_segment(FileSystem(), str(copy), seg.name, seg.stat().st_size - 14,
                    "incomplete_line")
    assert info.value.kind == "hard_link"
    run = walj_cli("repair", copy)
    assert run.code == 1 and "hard link" in run.err, run.err
    assert file_bytes(original) == before
    assert not (copy / "quarantine").exists()
    # Readers may read it: nothing they do writes.
    assert [r.data for r in walj.read(copy)] == make_records(5)
    report = walj.verify(copy)
    assert report.ok and report.torn_tail is not None
    with walj.Log.open(copy, recovery="salvage") as log:
        assert log.last_seq == 5


def test_item14_hard_linked_quarantine_manifest_is_refused(tmp_path: Path) -> None:
    original, copy = tmp_path / "original", tmp_path / "copy"
    torn_log(original)
    walj.Log.open(original).close()  # cuts the torn tail: quarantine/MANIFEST.jsonl now exists
    with open(segments(original)[-1], "ab") as f:
        f.write(b'{"xxh64":"4567')
    copy.mkdir()
    for seg in segments(original):
        shutil.copy2(seg, copy / seg.name)
    _link_copy(original / "quarantine", copy / "quarantine")
    before = file_bytes(original)
    copied = file_bytes(copy)
    with pytest.raises(walj.CorruptionError) as info:
        walj.Log.open(copy)
    assert (info.value.kind, info.value.file) == ("hard_link", "MANIFEST.jsonl")
    assert file_bytes(original) == before
    assert {k: v for k, v in file_bytes(copy).items() if not k.startswith("LOCK")} == copied
