"""The end of a segment's data (docs/FORMAT.md): zeros that run from a line start to the end of
the file are preallocated space, not a problem; zeros followed by anything else stay damage or
a torn tail; a torn line followed by zeros is a torn tail whose cut holds only its bytes.

These build the files by hand, so they hold for any reader of the format."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from helpers import make_records, segments, write_log
from spec_reader import SpecError, read_log

import walj
from walj.log import format as fmt
from walj.log.fs import DEFAULT_FS, FileSystem
from walj.log.segment import SegmentScan

ZEROS = 20_000  # more than a sector, a small chunk and the line limit below


def _closed_log(path: Path, n: int = 5, **options: object) -> bytes:
    write_log(path, make_records(n), **options)
    return segments(path)[-1].read_bytes()


def _record_line(seq: int, data: bytes = b'{"late":1}') -> bytes:
    return fmt.frame_record(seq, data)


@pytest.mark.parametrize("chunk_bytes", [64, 4096, 1 << 20])
def test_zeros_to_the_end_of_the_last_segment_are_the_end_of_its_data(
        tmp_path: Path, chunk_bytes: int) -> None:
    path = tmp_path / "log"
    data = _closed_log(path)
    last = segments(path)[-1]
    last.write_bytes(data + bytes(ZEROS))
    seg = SegmentScan(DEFAULT_FS, str(path), last.name, chunk_bytes=chunk_bytes)
    assert [seq for seq, _ in seg] == [1, 2, 3, 4, 5]
    assert seg.problems == [] and seg.valid_end == len(data)
    report = walj.verify(path)
    assert report.ok and report.problems == [] and report.torn_tail is None
    assert [r.data for r in walj.read(path)] == make_records(5)
    assert read_log(path).torn_tail is None
    with walj.Log.open(path, recovery="strict") as log:  # strict: not even a torn tail
        assert log.problems == [] and log.torn_tail is None and log.last_seq == 5
        log.append({"after": 1})
    assert not (path / "quarantine").exists()
    assert last.read_bytes() == data + _record_line(6, b'{"after":1}')  # trimmed by close


def test_zeros_then_a_verified_record_in_the_last_segment_are_a_crash_hole(
        tmp_path: Path) -> None:
    path = tmp_path / "log"
    data = _closed_log(path)
    last = segments(path)[-1]
    last.write_bytes(data + bytes(ZEROS) + _record_line(7))
    report = walj.verify(path)
    assert report.torn_tail is not None and report.torn_tail.kind == "zero_fill"
    assert report.torn_tail.offset == len(data)
    assert [r.seq for r in walj.read(path)] == [1, 2, 3, 4, 5]
    with walj.Log.open(path) as log:  # cut from the zeros on, as before preallocation
        assert log.last_seq == 5 and log.torn_tail is not None
        assert log.torn_tail.offset == len(data) and log.torn_tail.kind == "zero_fill"
        assert log.torn_tail.length == ZEROS + len(_record_line(7))


def test_zeros_before_a_durable_record_in_an_earlier_segment_are_damage(
        tmp_path: Path) -> None:
    path = tmp_path / "log"
    write_log(path, make_records(40), segment_bytes=1024)
    first = segments(path)[0]
    body = first.read_bytes()
    second_line = body.index(b"\n") + 1
    first.write_bytes(body[:second_line] + bytes(len(body[second_line:].split(b"\n")[0]) + 1)
                      + body[second_line + len(body[second_line:].split(b"\n")[0]) + 1:])
    assert "zero_fill" in [p.kind for p in walj.verify(path).problems]
    with pytest.raises(walj.CorruptionError):
        walj.Log.open(path)
    with pytest.raises(SpecError):
        read_log(path)


@pytest.mark.parametrize("after", [b"x", b"\n", b"\0\n\0"])
def test_zeros_followed_by_any_non_zero_byte_are_zero_fill(tmp_path: Path,
                                                           after: bytes) -> None:
    path = tmp_path / "log"
    data = _closed_log(path)
    last = segments(path)[-1]
    last.write_bytes(data + bytes(ZEROS) + after + bytes(100))
    report = walj.verify(path)
    assert report.torn_tail is not None and report.torn_tail.offset == len(data)
    assert report.torn_tail.kind == "zero_fill"


def test_a_torn_line_followed_by_zeros_is_a_torn_tail_and_only_its_bytes_are_cut(
        tmp_path: Path) -> None:
    path = tmp_path / "log"
    data = _closed_log(path)
    torn = _record_line(6)[:25]
    last = segments(path)[-1]
    last.write_bytes(data + torn + bytes(ZEROS))
    report = walj.verify(path)
    assert report.torn_tail is not None and report.torn_tail.offset == len(data)
    assert read_log(path).torn_tail == (last.name, len(data))
    with walj.Log.open(path) as log:
        cut = log.torn_tail
        assert cut is not None and cut.offset == len(data) and cut.length == len(torn)
        assert cut.sha256 == hashlib.sha256(torn).hexdigest()
        assert log.last_seq == 5
    assert (path / "quarantine" / cut.file).read_bytes() == torn
    assert last.read_bytes() == data


def test_a_torn_header_followed_by_zeros_is_cut_with_its_segment(tmp_path: Path) -> None:
    path = tmp_path / "log"
    with walj.Log.open(path) as log:
        log.append_many(make_records(5))
        log.rotate()  # segment 2 holds its header alone
    second = segments(path)[-1]
    torn_header = second.read_bytes()[:30]
    second.write_bytes(torn_header + bytes(ZEROS))
    with walj.Log.open(path) as log:
        assert log.last_seq == 5 and log.torn_tail is not None
        assert log.torn_tail.offset == 0 and log.torn_tail.length == len(torn_header)
    assert [r.data for r in walj.read(path)] == make_records(5)


def test_a_reader_beside_a_live_writer_sees_its_zeros_as_the_end_of_the_data(
        tmp_path: Path) -> None:
    path = tmp_path / "log"
    with walj.Log.open(path, sync="never") as log:
        log.append_many(make_records(3))
        last = segments(path)[-1]
        assert last.read_bytes().endswith(bytes(1000)), "the segment is not preallocated"
        seg = SegmentScan(DEFAULT_FS, str(path), last.name)
        assert [seq for seq, _ in seg] == [1, 2, 3] and seg.problems == []
        log.append({"more": 1})
        assert [seq for seq, _ in seg.read_more()] == [4] and seg.problems == []
        report = walj.verify(path)
        assert report.ok and report.problems == [] and report.torn_tail is None
        assert [r.seq for r in walj.read(path)] == [1, 2, 3, 4]
        salvage = walj.Log.open(path, recovery="salvage")
        assert salvage.problems == [] and salvage.last_seq == 4
        salvage.close()


def test_repair_of_a_torn_line_followed_by_zeros_plans_and_cuts_only_the_torn_bytes(
        tmp_path: Path) -> None:
    from cli_helpers import walj_cli

    path = tmp_path / "log"
    data = _closed_log(path)
    torn = _record_line(6)[:25]
    last = segments(path)[-1]
    last.write_bytes(data + torn + bytes(ZEROS))
    dry = walj_cli("repair", path, "--dry-run", "--json")
    assert dry.code == 0, dry.err
    (planned,) = dry.json()["cuts"]
    assert planned["offset"] == len(data) and planned["length"] == len(torn)
    run = walj_cli("repair", path, "--json")
    assert run.code == 0, run.err
    (cut,) = run.json()["cuts"]
    assert cut["length"] == len(torn) and (path / cut["quarantine_file"]).read_bytes() == torn
    assert last.read_bytes() == data


class _StaleFirstRead(FileSystem):
    """Its first sequential read of a segment sees part of the last record as zeros, as a
    reader beside a live writer may while the writer's bytes are being copied in; every later
    read sees the file as it is."""

    def __init__(self, zero_from: int, zero_to: int) -> None:
        self.zero_from, self.zero_to, self.done = zero_from, zero_to, False
        self.offsets: dict[int, int] = {}

    def read(self, fd: int, size: int) -> bytes:
        at = self.offsets.get(fd, 0)
        chunk = super().read(fd, size)
        self.offsets[fd] = at + len(chunk)
        if not self.done and at <= self.zero_from and at + len(chunk) >= self.zero_to:
            self.done = True
            lo, hi = self.zero_from - at, self.zero_to - at
            chunk = chunk[:lo] + b"\0" * (hi - lo) + chunk[hi:]
        return chunk

    def seek(self, fd: int, offset: int) -> None:
        super().seek(fd, offset)
        self.offsets[fd] = offset


def test_a_record_read_while_its_bytes_were_still_zeros_is_read_again_not_damage(
        tmp_path: Path) -> None:
    """Regression: beside a live writer, the zeros ahead of the data can be read just before a
    record is copied over them, in part; a second read of a chunk with zeros settles it."""
    path = tmp_path / "log"
    with walj.Log.open(path) as log:
        for n in range(5):
            log.append({"n": n, "pad": "x" * 40})
        log.sync()
        segment = segments(path)[-1]
        data = segment.read_bytes()
        last = data.rstrip(b"\0").rstrip(b"\n").rfind(b"\n") + 1  # the last record's line
        fs = _StaleFirstRead(last + 20, last + 40)
        scan = SegmentScan(fs, str(path), segment.name)
        seqs = [seq for seq, _ in scan.read_more()]
        assert fs.done
        assert seqs == [1, 2, 3, 4, 5] and scan.problems == []
