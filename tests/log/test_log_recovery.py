"""Recovery on open: torn tails are cut into quarantine, every other kind of damage refuses."""

from __future__ import annotations

import hashlib
import json
import shutil
import tracemalloc
from pathlib import Path

import pytest
from helpers import all_data, make_records, segments, write_log

import walj
from walj.log import format as fmt


def _line_ends(data: bytes) -> list[int]:
    return [i + 1 for i, b in enumerate(data) if b == 0x0A]


def test_truncate_last_segment_at_every_offset(tmp_path: Path) -> None:
    base = tmp_path / "base"
    records = make_records(14)
    write_log(base, records, segment_bytes=1024)
    segs = segments(base)
    assert len(segs) == 2
    in_first = json.loads(segs[0].read_bytes().splitlines()[-1])["seal"]["records"]
    last = segs[-1].read_bytes()
    ends = _line_ends(last)
    header_end = ends[0]
    for cut in range(len(last) + 1):
        work = tmp_path / f"cut{cut}"
        shutil.copytree(base, work)
        with open(segments(work)[-1], "r+b") as f:
            f.truncate(cut)
        complete = sum(1 for e in ends[1:] if e <= cut)
        expected = records[: in_first + complete]
        with walj.Log.open(work) as log:
            assert log.last_seq == len(expected)
            if cut not in ends and cut != len(last):
                assert log.torn_tail is not None
            log.append({"after": cut})
        with walj.Log.open(work) as log:
            assert log.torn_tail is None
        assert all_data(work) == [*expected, {"after": cut}]
        if cut < header_end and cut > 0:
            assert any((work / "quarantine").iterdir())
        shutil.rmtree(work)


def test_flip_every_byte_of_a_sealed_segment(tmp_path: Path) -> None:
    base = tmp_path / "base"
    records = make_records(14)
    write_log(base, records, segment_bytes=1024)
    sealed = segments(base)[0]
    original = sealed.read_bytes()
    assert b'"seal"' in original
    work = tmp_path / "work"
    for offset in range(len(original)):
        shutil.copytree(base, work)
        damaged = bytearray(original)
        damaged[offset] ^= 0xFF
        (work / sealed.name).write_bytes(bytes(damaged))
        with pytest.raises(walj.CorruptionError) as info:
            walj.Log.open(work)
        assert info.value.file == sealed.name
        report = walj.verify(work)
        assert not report.ok and report.problems
        returned = []
        with pytest.raises(walj.CorruptionError):
            for rec in walj.read(work):
                returned.append(rec)
        for rec in returned:
            assert rec.data == records[rec.seq - 1]
        salvaged = list(walj.read(work, recovery="salvage"))
        for rec in salvaged:
            assert rec.data == records[rec.seq - 1]
        shutil.rmtree(work)


def test_reopen_append_reopen_after_torn_write(logdir: Path) -> None:
    write_log(logdir, make_records(10))
    seg = segments(logdir)[-1]
    data = seg.read_bytes()
    seg.write_bytes(data[:-7])  # tear the last record
    with walj.Log.open(logdir) as log:
        assert log.last_seq == 9
        assert log.append({"new": 1}) == 10
    with walj.Log.open(logdir) as log:
        assert log.torn_tail is None and log.last_seq == 10
    assert walj.verify(logdir).ok


def test_torn_bytes_are_quarantined_not_lost(logdir: Path) -> None:
    write_log(logdir, make_records(5))
    seg = segments(logdir)[-1]
    junk = b'{"xxh64":"0000000000000000","seq":6,"da'
    with open(seg, "ab") as f:
        f.write(junk)
    original = seg.read_bytes()
    with walj.Log.open(logdir) as log:
        q = log.torn_tail
        assert q is not None and q.kind == "incomplete_line" and q.length == len(junk)
    qdir = logdir / "quarantine"
    saved = (qdir / q.file).read_bytes()
    assert seg.read_bytes() + saved == original
    manifest = [json.loads(x) for x in (qdir / "MANIFEST.jsonl").read_text().splitlines()]
    assert manifest[0]["segment"] == seg.name and manifest[0]["offset"] == len(original) - len(junk)
    assert manifest[0]["sha256"] == hashlib.sha256(junk).hexdigest()


@pytest.mark.parametrize("tail", [b"\x00" * 4096 + b"x", b"garbage line\n",
                                  b'{"xxh64":"1"}\n'])
def test_zero_fill_and_bad_last_line_are_torn_tails(logdir: Path, tail: bytes) -> None:
    write_log(logdir, make_records(5))
    with open(segments(logdir)[-1], "ab") as f:
        f.write(tail)
    assert walj.verify(logdir).ok and walj.verify(logdir).torn_tail is not None
    with walj.Log.open(logdir) as log:
        assert log.last_seq == 5 and log.torn_tail is not None


def test_strict_mode_refuses_a_torn_tail(logdir: Path) -> None:
    write_log(logdir, make_records(5))
    with open(segments(logdir)[-1], "ab") as f:
        f.write(b'{"xxh64":')
    with pytest.raises(walj.CorruptionError) as info:
        walj.Log.open(logdir, recovery="strict")
    assert info.value.kind == "incomplete_line"
    with walj.Log.open(logdir) as log:
        assert log.last_seq == 5


def test_bad_record_followed_by_good_ones_is_corruption(logdir: Path) -> None:
    write_log(logdir, make_records(6))
    seg = segments(logdir)[-1]
    lines = seg.read_bytes().split(b"\n")
    lines[3] = lines[3].replace(b"record", b"recorD")
    seg.write_bytes(b"\n".join(lines))
    with pytest.raises(walj.CorruptionError) as info:
        walj.Log.open(logdir)
    assert info.value.kind == "bad_checksum" and info.value.file == seg.name
    assert info.value.offset == sum(len(x) + 1 for x in lines[:3])
    salvaged = [r.seq for r in walj.read(logdir, recovery="salvage")]
    assert salvaged == [1, 2, 4, 5, 6]


def _problem_kinds(path: Path) -> list[str]:
    return [p.kind for p in walj.verify(path).problems]


def test_duplicated_and_swapped_lines_are_detected(tmp_path: Path) -> None:
    for case in ("dup", "swap"):
        path = tmp_path / case
        write_log(path, make_records(6))
        seg = segments(path)[-1]
        lines = seg.read_bytes().split(b"\n")
        if case == "dup":
            lines.insert(3, lines[3])
        else:
            lines[2], lines[3] = lines[3], lines[2]
        seg.write_bytes(b"\n".join(lines))
        with pytest.raises(walj.CorruptionError):
            walj.Log.open(path)
        assert {"seq_repeat", "seq_gap"} & set(_problem_kinds(path))


def test_missing_middle_segment_and_foreign_segment(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    write_log(a, make_records(40), segment_bytes=1024)
    write_log(b, make_records(40), segment_bytes=1024)
    assert len(segments(a)) >= 3
    missing = tmp_path / "missing"
    shutil.copytree(a, missing)
    segments(missing)[1].unlink()
    with pytest.raises(walj.CorruptionError):
        walj.Log.open(missing)
    assert "missing_segment" in _problem_kinds(missing)
    foreign = tmp_path / "foreign"
    shutil.copytree(a, foreign)
    shutil.copy(segments(b)[1], foreign / segments(b)[1].name)
    with pytest.raises(walj.CorruptionError) as info:
        walj.Log.open(foreign)
    assert info.value.kind == "foreign_segment"
    assert "foreign_segment" in _problem_kinds(foreign)


def _rewrite_with_checksums(seg: Path, edit: bytes, to: bytes) -> None:
    out = []
    for line in seg.read_bytes().split(b"\n")[:-1]:
        body = line[fmt.BODY_START:].replace(edit, to)
        out.append(fmt.frame(body))
    seg.write_bytes(b"".join(out))


def test_edited_sealed_segment_with_recomputed_checksums_breaks_the_seal(logdir: Path) -> None:
    write_log(logdir, make_records(40), segment_bytes=1024)
    sealed = segments(logdir)[0]
    _rewrite_with_checksums(sealed, b"record 3", b"record X")
    assert "seal_mismatch" in _problem_kinds(logdir)
    with pytest.raises(walj.CorruptionError) as info:
        walj.Log.open(logdir)
    assert info.value.kind == "seal_mismatch"


def test_resealed_segment_is_caught_by_the_chain(logdir: Path) -> None:
    write_log(logdir, make_records(40), segment_bytes=1024)
    sealed = segments(logdir)[0]
    _rewrite_with_checksums(sealed, b"record 3", b"record X")
    lines = sealed.read_bytes().split(b"\n")[:-1]
    content = b"".join(x + b"\n" for x in lines[:-1])
    seal = json.loads(lines[-1])["seal"]
    seal["sha256"] = hashlib.sha256(content).hexdigest()
    body = b'"seal":' + json.dumps(seal, separators=(",", ":")).encode() + b"}"
    sealed.write_bytes(content + fmt.frame(body))
    assert _problem_kinds(logdir) == ["seal_chain"]
    with pytest.raises(walj.CorruptionError) as info:
        walj.Log.open(logdir)
    assert info.value.kind == "seal_chain"


def test_zeroed_block_in_the_active_segment_is_cut_kept_and_reported(logdir: Path) -> None:
    """Zeroed sectors, then verified lines, in the last segment. Written with sync="always",
    every one of those lines was acknowledged: this is damage to synced data, though it looks
    exactly like the hole a power cut leaves among unsynced appends. The log cannot tell the two
    apart, so it cuts from the hole on (docs/FORMAT.md), keeping every byte in quarantine; but a
    reader is told (crash_hole) rather than handed a prefix as if the log ended there. (The
    journal, which knows what it synced, blocks on it: tests/journal/test_journal_damage.py.)"""
    records = make_records(200)
    write_log(logdir, records, segment_bytes=1 << 20, sync="always")
    seg = segments(logdir)[-1]
    original = seg.read_bytes()
    data = bytearray(original)
    data[4096:8192] = b"\x00" * 4096
    seg.write_bytes(bytes(data))
    report = walj.verify(logdir)
    assert not report.ok and report.problems[0].kind == "zero_fill"
    assert report.torn_tail is not None and report.torn_tail.kind == "zero_fill"
    with pytest.raises(walj.CorruptionError):
        walj.Log.open(logdir, recovery="strict")
    kept: list[dict[str, object]] = []
    with pytest.raises(walj.CorruptionError) as raised:
        for record in walj.read(logdir):
            kept.append(record.data)
    assert raised.value.kind == "crash_hole" and raised.value.offset == report.torn_tail.offset
    assert kept == records[: len(kept)] and 0 < len(kept) < 200
    with walj.Log.open(logdir) as log:
        assert log.last_seq == len(kept)
        q = log.torn_tail
        assert q is not None and q.offset == report.torn_tail.offset
    cut = (logdir / "quarantine" / q.file).read_bytes()
    assert seg.read_bytes() + cut == bytes(data)
    assert walj.verify(logdir).ok
    assert [r.data for r in walj.read(logdir)] == kept  # once cut, the log ends there


def test_zeroed_block_in_a_sealed_segment_refuses(logdir: Path) -> None:
    write_log(logdir, make_records(200), segment_bytes=8192)
    sealed = segments(logdir)[0]
    data = bytearray(sealed.read_bytes())
    data[4096:4608] = b"\x00" * 512
    sealed.write_bytes(bytes(data))
    with pytest.raises(walj.CorruptionError):
        walj.Log.open(logdir)
    assert "zero_fill" in [p.kind for p in walj.verify(logdir).problems]


def test_bit_flip_followed_by_records_is_never_a_hole(logdir: Path) -> None:
    write_log(logdir, make_records(50))
    seg = segments(logdir)[-1]
    data = bytearray(seg.read_bytes())
    data[600] ^= 0x01
    seg.write_bytes(bytes(data))
    with pytest.raises(walj.CorruptionError) as info:
        walj.Log.open(logdir)
    assert info.value.kind == "bad_checksum"


def test_read_treats_an_unfinished_line_as_in_progress(logdir: Path) -> None:
    write_log(logdir, make_records(3))
    with open(segments(logdir)[-1], "ab") as f:
        f.write(b'{"xxh64":"abc')
    assert [r.seq for r in walj.read(logdir)] == [1, 2, 3]
    report = walj.verify(logdir)
    assert report.ok and report.torn_tail is not None and report.records == 3


def test_giant_line_is_not_loaded_into_memory(logdir: Path) -> None:
    write_log(logdir, make_records(3), max_record_bytes=4096)
    with open(segments(logdir)[-1], "ab") as f:
        for _ in range(40):
            f.write(b"A" * (1 << 20))
    tracemalloc.start()
    report = walj.verify(logdir)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert report.torn_tail is not None and report.torn_tail.kind == "oversize_line"
    assert peak < 8 * 2**20
    with walj.Log.open(logdir) as log:
        assert log.last_seq == 3
