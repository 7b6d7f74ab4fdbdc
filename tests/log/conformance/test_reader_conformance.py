"""The log's reader behaves alike whatever FileSystem it reads through: the local one, the
fault-injecting one and the archive's view (backends.py). Each test builds a log on disk,
changes its bytes as a crash or damage would, and reads it through every backend."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from backends import Backend
from helpers import make_records, segments, write_log

from walj import _codec
from walj.errors import CorruptionError
from walj.log import format as fmt
from walj.log import read_view, verify_view
from walj.log.segment import SegmentScan

RECORDS = 40


def _log(path: Path) -> list[dict[str, object]]:
    records = make_records(RECORDS)
    write_log(path, records, segment_bytes=1024)
    assert len(segments(path)) >= 3
    return records


def _lines(seg: Path) -> list[bytes]:
    return seg.read_bytes().split(b"\n")[:-1]


def _flip(seg: Path, offset: int) -> None:
    """Flip a bit of the byte at `offset`: damage that no crash makes."""
    data = bytearray(seg.read_bytes())
    data[offset] ^= 0x01
    seg.write_bytes(bytes(data))


def _refused(directory: str, backend_fs: object) -> CorruptionError:
    with pytest.raises(CorruptionError) as raised:
        list(read_view(directory, backend_fs))  # type: ignore[arg-type]
    return raised.value


def test_clean_log_reads_every_record_and_verifies(backend: Backend, tmp_path: Path) -> None:
    path = tmp_path / "log"
    records = _log(path)
    directory, fs = backend.open(path)
    assert [(r.seq, r.data) for r in read_view(directory, fs)] == list(enumerate(records, 1))
    assert [r.seq for r in read_view(directory, fs, 25)] == list(range(25, RECORDS + 1))
    report = verify_view(directory, fs)
    assert report.ok and report.problems == [] and report.torn_tail is None
    assert (report.records, report.last_seq) == (RECORDS, RECORDS)
    assert report.segments == [p.name for p in segments(path)]


def test_torn_tail_ends_the_read_quietly_and_is_no_damage(backend: Backend,
                                                          tmp_path: Path) -> None:
    path = tmp_path / "log"
    _log(path)
    last = segments(path)[-1]
    size = last.stat().st_size
    with last.open("ab") as f:
        f.write(fmt.frame_record(RECORDS + 1, b'{"i":41}')[:30])  # a write a crash cut short
    directory, fs = backend.open(path)
    assert [r.seq for r in read_view(directory, fs)] == list(range(1, RECORDS + 1))
    report = verify_view(directory, fs)
    assert report.ok and report.torn_tail is not None
    assert (report.torn_tail.file, report.torn_tail.offset, report.torn_tail.length,
            report.torn_tail.kind) == (last.name, size, 30, "incomplete_line")


def test_damage_in_the_middle_refuses_and_salvage_reads_around_it(backend: Backend,
                                                                  tmp_path: Path) -> None:
    path = tmp_path / "log"
    _log(path)
    first = segments(path)[0]
    at = first.read_bytes().index(b"\n") + 1  # the first record's line
    _flip(first, at + 40)  # inside its data
    directory, fs = backend.open(path)
    error = _refused(directory, fs)
    assert (error.kind, error.file, error.offset) == ("bad_checksum", first.name, at)
    salvaged = [r.seq for r in read_view(directory, fs, recovery="salvage")]
    assert salvaged == list(range(2, RECORDS + 1))
    report = verify_view(directory, fs)
    assert not report.ok
    assert (report.problems[0].kind, report.problems[0].offset) == ("bad_checksum", at)


def test_bad_header_of_a_middle_segment_is_damage_at_offset_zero(backend: Backend,
                                                                 tmp_path: Path) -> None:
    path = tmp_path / "log"
    _log(path)
    middle = segments(path)[1]
    _flip(middle, 30)  # inside the header line
    directory, fs = backend.open(path)
    error = _refused(directory, fs)
    assert (error.kind, error.file, error.offset) == ("bad_header", middle.name, 0)
    report = verify_view(directory, fs)
    assert ("bad_header", middle.name, 0) in [(p.kind, p.file, p.offset) for p in report.problems]


def test_seal_chain_break_is_refused(backend: Backend, tmp_path: Path) -> None:
    path = tmp_path / "log"
    _log(path)
    middle = segments(path)[1]
    lines = _lines(middle)
    header = fmt.parse_header(lines[0])
    assert header is not None
    forged = fmt.Header(header.version, header.log_id, header.index, header.first_seq,
                        "0" * 64, header.max_record_bytes, header.created)
    # A header that verifies but names another seal than its predecessor's, and a seal that
    # matches the bytes so changed: only the chain shows it.
    body = fmt.frame(forged.body()) + b"".join(line + b"\n" for line in lines[1:-1])
    seal = fmt.parse_seal(lines[-1])
    assert seal is not None
    resealed = fmt.Seal(seal.last_seq, seal.records, hashlib.sha256(body).hexdigest())
    middle.write_bytes(body + fmt.frame(resealed.body()))
    directory, fs = backend.open(path)
    error = _refused(directory, fs)
    assert (error.kind, error.file) == ("seal_chain", middle.name)
    report = verify_view(directory, fs)
    assert "seal_chain" in [p.kind for p in report.problems]


def test_resumed_read_yields_only_the_complete_verified_lines_appended_since(
        backend: Backend, tmp_path: Path) -> None:
    path = tmp_path / "log"
    _log(path)
    last = segments(path)[-1]
    new = [fmt.frame_record(seq, _codec.encode({"i": seq})) for seq in range(41, 45)]
    with last.open("ab") as f:
        f.write(new[0][:25])  # a write still in progress
    directory, fs = backend.open(path)
    seg = SegmentScan(fs, directory, last.name)
    before = list(seg)
    assert before and before[-1][0] == RECORDS
    assert [p.kind for p in seg.problems] == ["incomplete_line"] and not seg.stopped
    with last.open("ab") as f:
        f.write(new[0][25:] + new[1] + new[2] + new[3][:10])
    backend.sync(path)
    assert [(s, _codec.decode(d)) for s, d in seg.read_more()] == [
        (seq, {"i": seq}) for seq in (41, 42, 43)]
    assert [p.kind for p in seg.problems] == ["incomplete_line"]
    # The rest of the last line, and the seal over every byte before it: the digest the scan
    # carried across its reads must match it.
    with last.open("ab") as f:
        f.write(new[3][10:])
    body = last.read_bytes()
    seal = fmt.Seal(44, seg.records + 1, hashlib.sha256(body).hexdigest())
    with last.open("ab") as f:
        f.write(fmt.frame(seal.body()))
    backend.sync(path)
    assert [s for s, _ in seg.read_more()] == [44]
    assert seg.problems == [] and seg.seal == seal
    assert seg.valid_end == seg.size == last.stat().st_size
    assert list(seg.read_more()) == []  # nothing new: nothing again


def test_resumed_read_stops_at_damage_a_write_cannot_mend(backend: Backend,
                                                          tmp_path: Path) -> None:
    path = tmp_path / "log"
    _log(path)
    last = segments(path)[-1]
    bad = bytearray(fmt.frame_record(RECORDS + 1, b'{"i":41}'))
    bad[-4] ^= 0x01  # inside the data: the checksum no longer matches
    with last.open("ab") as f:
        f.write(bytes(bad) + fmt.frame_record(RECORDS + 2, b'{"i":42}'))
    directory, fs = backend.open(path)
    seg = SegmentScan(fs, directory, last.name)
    list(seg)
    assert seg.stopped and seg.problems[0].kind == "bad_checksum"
    with last.open("ab") as f:
        f.write(fmt.frame_record(RECORDS + 3, b'{"i":43}'))
    backend.sync(path)
    assert list(seg.read_more()) == []
