"""Block reads (walj/log/blocks.py): the reader checks a block of lines at once and falls back
to the line-by-line path for a block that does not pass. What it reports must be exactly what
the line-by-line path reports: the same records, problems (kind, offset, seq), torn tail and
refusals, on any damage, wherever the block boundaries fall, through every backend."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from backends import Backend
from helpers import make_records, segments
from torture.budget import reproduce_hint, rng_for, scaled

import walj
from walj import _codec
from walj.errors import WaljError
from walj.log import blocks, read_view, segment, verify_view
from walj.log import format as fmt
from walj.log.fs import FileSystem
from walj.log.lines import BLOCK_BYTES, SECTOR
from walj.log.segment import SegmentScan


def _record(i: int, rng: random.Random) -> dict[str, Any]:
    return {"i": i, "text": "t" * rng.randint(0, 400), "n": [i, None, True, 1.5]}


def _build(path: Path, rng: random.Random, count: int) -> list[dict[str, Any]]:
    """A log of several segments, each of several blocks, some appended in batches."""
    records = [_record(i, rng) for i in range(count)]
    with walj.Log.open(path, sync="never", segment_bytes=3 * BLOCK_BYTES) as log:
        at = 0
        while at < count:
            size = rng.choice([1, 1, 7, 50])
            log.append_many(records[at : at + size])
            at += size
    return records


def _outcome(directory: str, fs: FileSystem) -> dict[str, Any]:
    """Everything a reader reports of a log: verify's report, salvage's records, and where
    the default read stops (the records it gave, then what it raised)."""
    report = verify_view(directory, fs)
    salvaged = [(r.seq, r.data) for r in read_view(directory, fs, recovery="salvage")]
    read: list[Any] = []
    try:
        read.extend((r.seq, r.data) for r in read_view(directory, fs))
    except WaljError as exc:
        read.append((type(exc).__name__, getattr(exc, "kind", None),
                     getattr(exc, "offset", None), getattr(exc, "seq", None)))
    return {"ok": report.ok, "records": report.records, "last_seq": report.last_seq,
            "problems": report.problems, "torn_tail": report.torn_tail,
            "segments": report.segments, "salvaged": salvaged, "read": read}


def _line_by_line(directory: str, fs: FileSystem,
                  monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The outcome with the block check turned down for every block: the line-by-line path
    alone, the reference the block path must match."""
    with monkeypatch.context() as patch:
        patch.setattr(segment, "check_block", lambda lines, first_seq: 0)
        return _outcome(directory, fs)


def _damage(seg: Path, rng: random.Random) -> str:
    """One kind of damage at a random place, most of them inside a block of good lines."""
    data = bytearray(seg.read_bytes())
    kind = rng.choice(["flip", "zeros", "cut", "newline", "upper", "drop", "repeat", "pad",
                       "garbage", "lead_zero", "reframed"])
    at = rng.randrange(len(data))
    starts = [0] + [i + 1 for i, b in enumerate(data) if b == 10][:-1]
    line = rng.randrange(1, len(starts)) if len(starts) > 1 else 0
    start = starts[line]
    end = data.index(b"\n", start) + 1
    if kind == "flip":
        data[at] ^= 1 << rng.randrange(8)
    elif kind == "zeros":  # a lost write: whole zeroed sectors
        first = at // SECTOR * SECTOR
        lost = len(data[first : first + SECTOR * rng.randint(1, 3)])
        data[first : first + lost] = bytes(lost)
    elif kind == "cut":
        del data[at:]
    elif kind == "newline":
        data[at:at] = b"\n"
    elif kind == "upper":  # the same checksum in capitals: not the written form
        digit = start + len(fmt.PREFIX) + rng.randrange(16)
        data[digit : digit + 1] = bytes(data[digit : digit + 1]).upper()
    elif kind == "drop":
        del data[start:end]
    elif kind == "repeat":
        data[end:end] = data[start:end]
    elif kind == "pad":
        data[at:at] = b" "
    elif kind == "garbage":
        data[start:start] = b'{"xxh64":"0000000000000000","seq":1}\n'
    elif kind == "reframed":  # a byte of a body changed, checksum made right: verified
        body = bytearray(data[start + fmt.BODY_START : end - 1])
        body[rng.choice([rng.randrange(len(body)), len(body) - 1, 8])] = rng.choice(b'}]{ 0"x')
        data[start:end] = fmt.frame(bytes(body))
    else:  # a seq with a leading zero, checksum made right: verified, yet not as written
        _relabel(data, start, end)
    seg.write_bytes(bytes(data))
    return kind


def _relabel(data: bytearray, start: int, end: int) -> None:
    line = bytes(data[start : end - 1])
    parsed = fmt.parse_data(line) if fmt.checksum_ok(line) else None
    if parsed is None:
        return
    body = fmt.SEQ_TAG + b"0%d" % parsed[0] + fmt.DATA_TAG + parsed[1] + b"}"
    data[start:end] = fmt.frame(body)


def test_block_check_agrees_with_the_line_check_on_mutated_lines() -> None:
    """check_block passes a block exactly when every line passes the line-by-line path's
    common-case test, whatever one byte of one line is changed to."""
    rng = rng_for("block-check")
    first = 1000
    lines = [fmt.frame_record(first + i, fmt.encode_record(_record(i, rng)))[:-1]
             for i in range(6)]
    assert blocks.check_block(lines, first) == fmt.BODY_START + len(fmt.RECORD_TAG % first)
    assert blocks.check_block(lines, first + 1) == 0
    assert blocks.check_block(lines[:3], first) and blocks.check_block(lines[3:], first + 3)
    for _ in range(scaled(400)):
        mutated = list(lines)
        k = rng.randrange(len(lines))
        line = bytearray(mutated[k])
        # Half the time where the frame is: the head, the seq, the data's braces.
        pos = rng.choice([rng.randrange(len(line)), rng.randrange(50), len(line) - 1])
        line[pos] = rng.choice([0, 10, 48, 65, 97, 123, 125, rng.randrange(256)])
        if rng.random() < 0.5 and fmt.checksum_ok(bytes(line)) is False:
            line = bytearray(fmt.frame(bytes(line[fmt.BODY_START:]))[:-1])  # checksum made good
        mutated[k] = bytes(line)
        each = all(_line_passes(m, first + i) for i, m in enumerate(mutated))
        assert bool(blocks.check_block(mutated, first)) == each, (k, pos, reproduce_hint())


def _line_passes(line: bytes, seq: int) -> bool:
    """The line-by-line path's common case, spelled from docs/FORMAT.md."""
    tag = fmt.RECORD_TAG % seq
    data_at = fmt.BODY_START + len(tag)
    return (line[: fmt.BODY_START] == fmt.FRAME_HEAD % fmt.xxh64_intdigest(
        line[fmt.BODY_START:]) and line.startswith(tag, fmt.BODY_START)
            and line.endswith(b"}") and line[data_at : data_at + 1] == b"{")


def test_seqs_that_change_their_digit_count_in_a_block_read_line_by_line() -> None:
    lines = [fmt.frame_record(seq, b"{}")[:-1] for seq in range(95, 105)]
    assert blocks.check_block(lines, 95) == 0
    assert blocks.check_block(lines[5:], 100) == fmt.BODY_START + len(fmt.RECORD_TAG % 100)


@pytest.mark.parametrize("chunk", [97, 4096, BLOCK_BYTES])
def test_lines_split_across_blocks_read_whole(backend: Backend, tmp_path: Path,
                                              chunk: int) -> None:
    """Reads of any size: a line that spans two reads (or many) is one record, and a segment
    read in small blocks gives what one read in the default blocks gives."""
    path = tmp_path / "log"
    rng = rng_for(f"split-{chunk}")
    records = _build(path, rng, 700)
    directory, fs = backend.open(path)
    expected = list(enumerate(records, 1))
    assert [(r.seq, r.data) for r in read_view(directory, fs)] == expected
    got: list[tuple[int, Any]] = []
    for seg in segments(path):
        scan = SegmentScan(fs, directory, seg.name, chunk_bytes=chunk)
        got += [(seq, _codec.decode(data)) for seq, data in scan]
        assert scan.problems == []
        assert scan.valid_end == seg.stat().st_size
        assert scan.seal is not None or seg == segments(path)[-1]
    assert got == expected


def test_random_damage_reads_as_the_line_by_line_path_reads_it(
        backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Damage anywhere, of any kind: the block path's records, problems (kind, offset, seq),
    torn tail and refusals equal the line-by-line path's."""
    clean = tmp_path / "clean"
    _build(clean, rng_for("damage-build"), 900)
    kinds: set[str] = set()
    for trial in range(scaled(12, minimum=4)):
        rng = rng_for(f"damage-{backend.kind}-{trial}")
        path = tmp_path / f"log{trial}"
        path.mkdir()
        for seg in segments(clean):
            (path / seg.name).write_bytes(seg.read_bytes())
        damaged = rng.choice(segments(path))
        kinds.add(_damage(damaged, rng))
        directory, fs = backend.open(path)
        by_block = _outcome(directory, fs)
        assert by_block == _line_by_line(directory, fs, monkeypatch), (
            trial, damaged.name, reproduce_hint())
    assert kinds


def test_a_read_closed_inside_a_block_resumes_without_skipping_a_record(
        backend: Backend, tmp_path: Path) -> None:
    """A reader that stops after part of a block (walj tail -f between reads) reads the
    rest of it when it resumes: a record handed on is counted only once the whole block was
    taken, so a resumed read may repeat some, never skip one."""
    path = tmp_path / "log"
    with walj.Log.open(path, sync="never") as log:
        log.append_many(make_records(200))
    directory, fs = backend.open(path)
    scan = SegmentScan(fs, directory, segments(path)[0].name)
    records = scan.read_more()
    assert [next(records)[0] for _ in range(3)] == [1, 2, 3]
    records.close()
    again = [seq for seq, _ in scan.read_more()]
    assert again[0] <= 4 and again[-1] == 200 and again == list(range(again[0], 201))
    assert scan.records == 200 and scan.problems == []
