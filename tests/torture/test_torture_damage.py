"""Byte damage: every case is detected, with the problem kind FORMAT.md gives it, and a changed
record is never returned."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import xxhash
from budget import TALLY, rng_for
from damage import (
    PREFIX_LEN,
    Image,
    build,
    data_lines,
    expected_flip,
    flip_bit,
    lines_of,
    records_before,
)

import walj


def random_records(name: str, n: int, lo: int, hi: int) -> list[dict[str, Any]]:
    rng = rng_for(name)
    return [{"i": i, "text": "".join(rng.choice("abcxyz \u00e9\u4e2d") for _ in
                                     range(rng.randint(lo, hi)))} for i in range(n)]


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Image:
    """Segments of about 1 KiB: several sealed ones, and an active one with 5 records."""
    path = tmp_path_factory.mktemp("small") / "log"
    return build(path, random_records("damage-small", 40, 20, 80), 1024, active_records=5)


@pytest.fixture(scope="module")
def large(tmp_path_factory: pytest.TempPathFactory) -> Image:
    """Segments of 16 KiB, so that a 4 KiB block fits in the middle of one."""
    path = tmp_path_factory.mktemp("large") / "log"
    image = build(path, random_records("damage-large", 250, 60, 120), 16384, active_records=110)
    assert len(image.files[image.segments[-1]]) > 3 * 4096
    return image


def scan_all(path: Path) -> walj.VerifyReport:
    return walj.verify(path)


def assert_no_changed_record(path: Path, image: Image) -> None:
    for record in walj.read(path, recovery="salvage"):
        assert record.data == image.records[record.seq - 1], f"changed record {record.seq}"
    got: list[walj.Record] = []
    try:
        for record in walj.read(path):
            got.append(record)
    except walj.CorruptionError:
        pass
    assert [r.data for r in got] == image.records[: len(got)]


def assert_refused(path: Path, file: str, offset: int, kind: str) -> None:
    """verify names the damage first; open refuses it with the same file, offset and kind."""
    report = scan_all(path)
    assert not report.ok
    first = report.problems[0]
    assert (first.file, first.offset, first.kind) == (file, offset, kind), first.describe()
    with pytest.raises(walj.CorruptionError) as info:
        walj.Log.open(path).close()
    assert (info.value.file, info.value.offset, info.value.kind) == (file, offset, kind)
    TALLY.add(trials_damage=1, faults=1)


def test_truncation_of_the_active_segment_at_every_offset(small: Image, tmp_path: Path) -> None:
    name = small.segments[-1]
    data = small.files[name]
    header_end = lines_of(data)[0][1]
    for cut in range(len(data)):
        path = small.write(tmp_path / "log", **{name: data[:cut]})
        held = records_before(small, name, cut)
        line_start = max((s for s, _ in lines_of(data) if s <= cut), default=0)
        torn_at = 0 if cut < header_end else line_start
        report = scan_all(path)
        assert report.ok, (cut, report.problems)
        with walj.Log.open(path) as log:
            assert log.last_seq == held, cut
            if torn_at < cut or cut < header_end:
                assert log.torn_tail is not None and log.torn_tail.offset == torn_at, cut
                kept = (path / "quarantine" / log.torn_tail.file).read_bytes()
                assert kept == data[torn_at:cut], cut
            else:
                assert log.torn_tail is None, cut
            log.append({"after": cut})
        assert [r.data for r in walj.read(path)] == small.records[:held] + [{"after": cut}]
        TALLY.add(trials_damage=1, faults=1, checked=held)


def test_truncation_of_a_sealed_segment_at_every_offset(small: Image, tmp_path: Path) -> None:
    name = small.segments[1]
    data = small.files[name]
    starts = {s for s, _ in lines_of(data)}
    for cut in range(len(data)):
        path = small.write(tmp_path / "log", **{name: data[:cut]})
        if cut == 0:
            expected = (0, "bad_header")
        elif cut in starts:
            expected = (cut, "unsealed_segment")
        else:
            expected = (max(s for s in starts if s < cut), "incomplete_line")
        assert_refused(path, name, *expected)
        assert_no_changed_record(path, small)


@pytest.mark.parametrize("which", ["sealed", "active"])
def test_bit_flip_at_every_byte(small: Image, tmp_path: Path, which: str) -> None:
    rng = rng_for(f"damage-flip-{which}")
    name = small.segments[1] if which == "sealed" else small.segments[-1]
    data = small.files[name]
    for pos in range(len(data)):
        damaged = flip_bit(data, pos, rng.randrange(8))
        path = small.write(tmp_path / "log", **{name: damaged})
        offset, kind, at_end = expected_flip(data, pos)
        assert_no_changed_record(path, small)
        if which == "active" and at_end and offset > 0:
            # Indistinguishable from a write torn by a crash: cut, but kept in quarantine.
            report = scan_all(path)
            assert report.ok and report.torn_tail is not None
            assert (report.torn_tail.offset, report.torn_tail.kind) == (offset, kind), pos
            with walj.Log.open(path) as log:
                assert log.torn_tail is not None
                kept = (path / "quarantine" / log.torn_tail.file).read_bytes()
                assert kept == damaged[offset:]
                assert log.last_seq == records_before(small, name, offset)
            TALLY.add(trials_damage=1, faults=1)
        else:
            assert_refused(path, name, offset, kind)


def zero_block(data: bytes, start: int, size: int = 4096) -> bytes:
    return data[:start] + b"\0" * size + data[start + size :]


def zero_kind(damaged: bytes, start: int) -> tuple[int, str]:
    """A zeroed block is a zero fill, reported where the line it begins in starts."""
    return damaged.rfind(b"\n", 0, start) + 1, "zero_fill"


def test_zeroed_4k_block_in_a_sealed_segment(large: Image, tmp_path: Path) -> None:
    name = large.segments[0]
    for start in (4096, 8192, 4096 + 1000):
        damaged = zero_block(large.files[name], start)
        path = large.write(tmp_path / "log", **{name: damaged})
        assert_refused(path, name, *zero_kind(damaged, start))
        assert "seal_mismatch" in {p.kind for p in walj.verify(path).problems}
        assert_no_changed_record(path, large)


def test_zeroed_4k_block_in_the_active_segment(large: Image, tmp_path: Path) -> None:
    """Verified records follow the block, and the block covers a whole aligned sector: to the
    log this is exactly the hole a power cut leaves among unsynced appends, so open cuts it,
    keeping every byte from the block on in quarantine, and a reader is told (crash_hole)
    instead of being handed a prefix. (A journal, which knows what it synced, blocks on such a
    cut: tests/journal/test_journal_damage.py.)"""
    name = large.segments[-1]
    for start in (4096, 4096 + 1000):
        damaged = zero_block(large.files[name], start)
        path = large.write(tmp_path / "log", **{name: damaged})
        offset, kind = zero_kind(damaged, start)
        assert_no_changed_record(path, large)
        report = scan_all(path)
        found = [(p.file, p.offset, p.kind) for p in report.problems]
        assert report.torn_tail is not None
        tail = report.torn_tail
        found.append((tail.file, tail.offset, tail.kind))
        assert found and found[0] == (name, offset, kind), found
        with pytest.raises(walj.CorruptionError) as raised:
            for _ in walj.read(path):
                pass
        assert (raised.value.file, raised.value.offset, raised.value.kind) == (
            name, offset, "crash_hole")
        with walj.Log.open(path) as log:
            assert log.torn_tail is not None and log.torn_tail.offset == offset
            kept = (path / "quarantine" / log.torn_tail.file).read_bytes()
            assert kept == damaged[offset:]
        TALLY.add(trials_damage=1, faults=1)


def line_at(data: bytes, index: int) -> tuple[int, int]:
    return lines_of(data)[index]


@pytest.mark.parametrize("where", ["sealed", "active middle", "active last"])
def test_duplicated_line(small: Image, tmp_path: Path, where: str) -> None:
    name = small.segments[1] if where == "sealed" else small.segments[-1]
    data = small.files[name]
    count = len(lines_of(data))
    index = {"sealed": 3, "active middle": 2, "active last": count - 1}[where]
    start, end = line_at(data, index)
    damaged = data[:end] + data[start:end] + data[end:]
    assert_refused(small.write(tmp_path / "log", **{name: damaged}), name, end, "seq_repeat")
    assert_no_changed_record(tmp_path / "log", small)


@pytest.mark.parametrize("where", ["sealed", "active"])
def test_two_swapped_lines(small: Image, tmp_path: Path, where: str) -> None:
    name = small.segments[1] if where == "sealed" else small.segments[-1]
    data = small.files[name]
    (a, b), (_, c) = line_at(data, 2), line_at(data, 3)
    damaged = data[:a] + data[b:c] + data[a:b] + data[c:]
    assert_refused(small.write(tmp_path / "log", **{name: damaged}), name, a, "seq_gap")
    assert_no_changed_record(tmp_path / "log", small)


def test_missing_middle_segment(small: Image, tmp_path: Path) -> None:
    gone = small.segments[1]
    path = small.write(tmp_path / "log", **{gone: None})
    assert_refused(path, small.segments[2], 0, "missing_segment")
    assert_no_changed_record(path, small)


@pytest.mark.parametrize("which", [1, -1])
def test_segment_from_another_log(small: Image, tmp_path: Path, which: int) -> None:
    """The other log holds the same records, so its segment differs only in its log id."""
    other = build(tmp_path / "other", [dict(r) for r in small.records], 1024,
                  active_records=data_lines(small.files[small.segments[-1]]))
    assert other.segments == small.segments
    name = small.segments[which]
    assert other.files[name] != small.files[name]
    path = small.write(tmp_path / "log", **{name: other.files[name]})
    assert_refused(path, name, 0, "foreign_segment")
    assert_no_changed_record(path, small)


def reframe(body: bytes) -> bytes:
    return b'{"xxh64":"' + b"%016x" % xxhash.xxh64_intdigest(body) + b'",' + body + b"\n"


def edit_record(data: bytes, index: int) -> bytes:
    """Change the text of the record on line `index`, with a checksum that verifies."""
    start, end = line_at(data, index)
    line = data[start:end]
    body = line[PREFIX_LEN + 18 : -1]
    obj = json.loads(b"{" + body)
    obj["data"]["text"] = "edited by someone who knows the format"
    new_body = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()[1:]
    return data[:start] + reframe(new_body) + data[end:]


def reseal(data: bytes) -> bytes:
    """Recompute the seal line (digest and checksum) over the segment's bytes."""
    start, _ = lines_of(data)[-1]
    seal = json.loads(b"{" + data[start + PREFIX_LEN + 18 : -1])["seal"]
    seal["sha256"] = hashlib.sha256(data[:start]).hexdigest()
    body = b'"seal":' + json.dumps(seal, separators=(",", ":")).encode() + b"}"
    return data[:start] + reframe(body)


def test_sealed_segment_edited_with_checksums_recomputed(small: Image, tmp_path: Path) -> None:
    """The edited line verifies, so only the seal can tell, and only once the segment has been
    read to its end: walj.read streams the segment's records before it raises (a known limit),
    Log.open refuses before anything is used."""
    name = small.segments[1]
    data = small.files[name]
    edited = edit_record(data, 2)
    seal_offset = lines_of(edited)[-1][0]
    path = small.write(tmp_path / "log", **{name: edited})
    assert_refused(path, name, seal_offset, "seal_mismatch")
    with pytest.raises(walj.CorruptionError) as info:
        list(walj.read(path))
    assert info.value.kind == "seal_mismatch"
    # Recompute the seal too: only the chain, the next segment's header, can tell now.
    path = small.write(tmp_path / "log", **{name: reseal(edited)})
    assert_refused(path, small.segments[2], 0, "seal_chain")
    with pytest.raises(walj.CorruptionError) as info:
        list(walj.read(path))
    assert info.value.kind == "seal_chain"
