"""The log's public API: append, read, verify, options, bad input and file permissions."""

from __future__ import annotations

import enum
import json
import math
import os
import stat
from pathlib import Path

import pytest
from helpers import all_data, make_records, segments, write_log

import walj


def test_append_returns_contiguous_seqs_and_read_returns_records(logdir: Path) -> None:
    records = make_records(20)
    with walj.Log.open(logdir) as log:
        seqs = [log.append(r) for r in records[:10]]
        seqs += log.append_many(records[10:])
        assert log.last_seq == 20
    assert seqs == list(range(1, 21))
    assert all_data(logdir) == records


def test_reopen_continues_the_sequence(logdir: Path) -> None:
    write_log(logdir, make_records(5))
    with walj.Log.open(logdir) as log:
        assert log.last_seq == 5
        assert log.append({"x": 1}) == 6
    assert len(all_data(logdir)) == 6


def test_read_from_start_seq(logdir: Path) -> None:
    write_log(logdir, make_records(50), segment_bytes=1024)
    assert len(segments(logdir)) > 3
    got = list(walj.read(logdir, start_seq=37))
    assert [r.seq for r in got] == list(range(37, 51))
    assert got[0].data == make_records(50)[36]


def test_every_line_is_plain_json(logdir: Path) -> None:
    write_log(logdir, make_records(30), segment_bytes=1024)
    kinds = set()
    for seg in segments(logdir):
        for line in seg.read_text().splitlines():
            obj = json.loads(line)
            kinds.update(k for k in obj if k != "xxh64")
    assert kinds == {"header", "seq", "data", "seal"}


def test_rotation_chains_seals(logdir: Path) -> None:
    write_log(logdir, make_records(40), segment_bytes=1024)
    segs = segments(logdir)
    prev = ""
    for seg in segs:
        lines = [json.loads(x) for x in seg.read_text().splitlines()]
        assert lines[0]["header"]["prev"] == prev
        if seg != segs[-1]:
            assert "seal" in lines[-1]
            prev = lines[-1]["seal"]["sha256"]
    report = walj.verify(logdir)
    assert report.ok and report.records == 40 and len(report.segments) == len(segs)


@pytest.mark.parametrize("sync", ["always", "batch", "interval", "never"])
def test_every_sync_mode_round_trips(logdir: Path, sync: str) -> None:
    records = make_records(25)
    with walj.Log.open(logdir, sync=sync, sync_interval_ms=5, segment_bytes=2048) as log:
        for r in records:
            log.append(r)
        log.sync()
        assert log.durable_seq == 25
    assert all_data(logdir) == records


def test_durable_flag_syncs_in_never_mode(logdir: Path) -> None:
    with walj.Log.open(logdir, sync="never") as log:
        log.append({"a": 1})
        assert log.durable_seq == 0
        seq = log.append({"a": 2}, durable=True)
        assert log.durable_seq == seq == 2


@pytest.mark.parametrize(
    "bad",
    [
        {"f": float("nan")},
        {"f": [1, float("inf")]},
        {"nested": {"deep": [{"x": float("-inf")}]}},
        {"o": object()},
        {"c": 1j},
        {(1, 2): "tuple key"},
        [1, 2],
        "text",
    ],
)
def test_unserializable_records_are_refused_before_any_byte(logdir: Path, bad: object) -> None:
    with walj.Log.open(logdir) as log:
        log.append({"ok": 1})
        size = segments(logdir)[0].stat().st_size
        with pytest.raises(walj.SerializationError):
            log.append(bad)  # type: ignore[arg-type]
        with pytest.raises(walj.SerializationError):
            log.append_many([{"ok": 2}, bad])  # type: ignore[list-item]
        assert segments(logdir)[0].stat().st_size == size
        assert log.append({"ok": 3}) == 2


def test_append_many_writes_the_lines_append_writes(tmp_path: Path) -> None:
    """A batch is framed at once: its lines are byte for byte the lines one append each
    writes, whatever the records hold (subclasses stored as the values they hold)."""
    class Kind(enum.IntEnum):
        A = 7

    records = [*make_records(30), {"kind": Kind.A, "t": ("x", 1.5)}, {}, {"s": "caf\u00e9"}]
    with walj.Log.open(tmp_path / "one", sync="never") as log:
        for record in records:
            log.append(record)
    with walj.Log.open(tmp_path / "many", sync="never") as log:
        assert log.append_many(r for r in records[:9]) == list(range(1, 10))  # any iterable
        assert log.append_many(records[9:]) == list(range(10, len(records) + 1))
    one, many = (segments(tmp_path / name)[0].read_bytes().split(b"\n", 1)[1]
                 for name in ("one", "many"))
    assert one == many
    assert [r.data for r in walj.read(tmp_path / "many")][30] == {"kind": 7, "t": ["x", 1.5]}


def test_append_many_with_one_record_too_large_writes_none_of_the_batch(logdir: Path) -> None:
    with walj.Log.open(logdir, max_record_bytes=1000) as log:
        log.append({"ok": 0})
        size = segments(logdir)[0].stat().st_size
        with pytest.raises(walj.RecordTooLargeError, match="record is 1008 bytes"):
            log.append_many([{"ok": 1}, {"x": "y" * 1000}, {"ok": 2}])
        assert segments(logdir)[0].stat().st_size == size
        assert log.append_many([{"ok": 3}]) == [2]
    assert all_data(logdir) == [{"ok": 0}, {"ok": 3}]


def test_record_too_large(logdir: Path) -> None:
    with walj.Log.open(logdir, max_record_bytes=1000) as log:
        with pytest.raises(walj.RecordTooLargeError):
            log.append({"x": "y" * 1000})
        assert log.append({"x": "y" * 900}) == 1


def test_json_like_values_are_stored_as_their_json_form(logdir: Path) -> None:
    write_log(logdir, [{"t": (1, 2)}])
    assert all_data(logdir) == [{"t": [1, 2]}]  # a tuple: the one documented conversion
    with walj.Log.open(logdir) as log, pytest.raises(walj.SerializationError):
        log.append({"b": b"hi"})  # would read back as base64 text: refused
    assert all_data(logdir) == [{"t": [1, 2]}]


def test_null_values_are_kept(logdir: Path) -> None:
    write_log(logdir, [{"n": None, "f": 1.5, "s": "é\u2603\n"}])
    assert all_data(logdir) == [{"n": None, "f": 1.5, "s": "é\u2603\n"}]
    assert not math.isnan(all_data(logdir)[0]["f"])


def test_files_are_private(logdir: Path) -> None:
    os.umask(0o022)
    write_log(logdir, make_records(3))
    assert stat.S_IMODE(logdir.stat().st_mode) == 0o700
    for seg in segments(logdir):
        assert stat.S_IMODE(seg.stat().st_mode) == 0o600


def test_symlinked_segment_is_refused(logdir: Path, tmp_path: Path) -> None:
    write_log(logdir, make_records(3))
    seg = segments(logdir)[0]
    real = tmp_path / "elsewhere.jsonl"
    seg.rename(real)
    seg.symlink_to(real)
    with pytest.raises(walj.CorruptionError) as info:
        walj.Log.open(logdir)
    assert info.value.kind == "symlink"
    assert not walj.verify(logdir).ok


def test_unknown_format_version_is_refused(logdir: Path) -> None:
    from walj.log import format as fmt

    write_log(logdir, make_records(2))
    seg = segments(logdir)[0]
    lines = seg.read_bytes().split(b"\n")
    header = json.loads(lines[0])["header"]
    header["v"] = 99
    body = b'"header":' + json.dumps(header, separators=(",", ":")).encode() + b"}"
    lines[0] = fmt.frame(body)[:-1]
    seg.write_bytes(b"\n".join(lines))
    with pytest.raises(walj.UnsupportedVersionError, match="version 99"):
        walj.Log.open(logdir)
    report = walj.verify(logdir)
    assert [p.kind for p in report.problems] == ["unsupported_version"]


def test_bad_options_are_refused(logdir: Path) -> None:
    for kwargs in ({"sync": "sometimes"}, {"recovery": "guess"}, {"segment_bytes": 10},
                   {"max_record_bytes": 0}, {"lock_timeout": -5}, {"sync_interval_ms": 0}):
        with pytest.raises(ValueError):
            walj.Log.open(logdir, **kwargs)  # type: ignore[arg-type]


def test_path_that_is_a_file_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(walj.WaljError, match="not a directory"):
        walj.Log.open(f)
    with pytest.raises(walj.WaljError, match="not a directory"):
        list(walj.read(f))
    with pytest.raises(walj.WaljError, match="does not exist"):
        walj.verify(tmp_path / "missing")


def test_closed_log_refuses_work(logdir: Path) -> None:
    log = walj.Log.open(logdir)
    log.close()
    log.close()
    with pytest.raises(walj.ClosedError):
        log.append({"a": 1})
    with pytest.raises(walj.ClosedError):
        log.sync()


def test_salvage_open_is_read_only(logdir: Path) -> None:
    write_log(logdir, make_records(3))
    seen: list[int] = []
    log = walj.Log.open(logdir, recovery="salvage", _replay=lambda seq, data: seen.append(seq))
    assert seen == [1, 2, 3]
    with pytest.raises(walj.WaljError):
        log.append({"a": 1})
    log.close()
    with walj.Log.open(logdir) as writer:  # and holds none
        assert writer.last_seq == 3


def test_checksummed_line_that_is_not_json_is_a_typed_error(logdir: Path) -> None:
    from walj.log import format as fmt

    write_log(logdir, make_records(2))
    seg = segments(logdir)[0]
    with open(seg, "ab") as f:
        f.write(fmt.frame(b'"seq":3,"data":{not json}'))
    with pytest.raises(walj.CorruptionError) as info:
        list(walj.read(logdir))
    assert info.value.seq == 3


def test_rotate_seals_the_active_segment_and_the_next_record_begins_a_segment(
        tmp_path: Path) -> None:
    path = tmp_path / "log"
    with walj.Log.open(path, sync="never") as log:
        log.rotate()  # nothing in the active segment: nothing to seal
        assert len(segments(path)) == 1
        for i in range(3):
            log.append({"i": i})
        log.rotate()
        seq = log.append({"i": 3})
        assert [first for _, first in log.segments()] == [1, seq]
        assert log.durable_seq >= seq - 1  # the seal's sync covered the sealed records
    first, second = segments(path)
    assert b'"seal":' in first.read_bytes().splitlines()[-1]
    assert json.loads(second.read_bytes().splitlines()[1])["seq"] == 4
    assert walj.verify(path).ok
    with walj.Log.open(path, recovery="salvage") as reader, pytest.raises(walj.WaljError):
        reader.rotate()
    log = walj.Log.open(path)
    log.close()
    with pytest.raises(walj.ClosedError):
        log.rotate()
