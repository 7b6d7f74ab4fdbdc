"""`walj prune`'s check that a session's last, unshipped segment holds no record (an ended
session reopened), made by the log's own segment reader."""

from __future__ import annotations

from pathlib import Path

from helpers import segments

import walj
from walj.cli._retire import _holds_no_record


def _ended_and_reopened(path: Path) -> Path:
    with walj.Log.open(path) as log:
        log.append({"a": 1})
        log.close(seal=True)
    walj.Log.open(path).close()  # a reopen starts a segment of its own: a header, no record
    return segments(path)[-1]


def test_a_reopened_ended_session_s_last_segment_holds_no_record(tmp_path: Path) -> None:
    last = _ended_and_reopened(tmp_path / "s")
    assert len(segments(tmp_path / "s")) == 2
    assert _holds_no_record(str(tmp_path / "s"), last.name)


def test_a_segment_with_a_record_or_a_seal_holds_one_or_is_not_the_reopened_kind(
        tmp_path: Path) -> None:
    path = tmp_path / "s"
    last = _ended_and_reopened(path)
    first = segments(path)[0]
    assert not _holds_no_record(str(path), first.name)  # a record, and sealed
    with walj.Log.open(path) as log:
        log.append({"b": 2})
    assert not _holds_no_record(str(path), last.name)


def test_an_empty_segment_file_holds_no_record(tmp_path: Path) -> None:
    (tmp_path / "seg-0000000001.jsonl").write_bytes(b"")
    assert _holds_no_record(str(tmp_path), "seg-0000000001.jsonl")


def test_a_header_that_does_not_verify_is_not_taken_for_an_empty_segment(
        tmp_path: Path) -> None:
    last = _ended_and_reopened(tmp_path / "s")
    data = bytearray(last.read_bytes())
    data[12] ^= 0x01  # inside the header's checksum digits: the line no longer verifies
    last.write_bytes(bytes(data))
    assert not _holds_no_record(str(tmp_path / "s"), last.name)
