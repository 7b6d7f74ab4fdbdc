"""Shipping to an archive and reading it back, over s3:// (moto's S3 server, through s3fs) and
file:// alike: records come back equal, damage in the bucket is reported with walj's own
problem kinds, and ship is idempotent and safe beside a live writer."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from archive_helpers import Archive, datas, make_session
from helpers import segments

import walj
import walj.archive as archive_mod
from walj.errors import CorruptionError
from walj.log import format as fmt


def kinds(report: walj.VerifyReport) -> set[str]:
    return {p.kind for p in report.problems}


def test_ship_verify_delete_locally_read_back(archive: Archive, tmp_path: Path) -> None:
    session = tmp_path / "s"
    records = make_session(session)
    names = [p.name for p in segments(session)]
    report = archive_mod.ship(session, archive.url)
    # Every segment but the active one, each read back before it was counted.
    assert report.shipped == names[:-1] and report.skipped == [] and report.repaired == []
    assert report.bytes == sum(p.stat().st_size for p in segments(session)[:-1])
    log_id = report.log_id
    assert log_id is not None and report.url == f"{archive.url}/{log_id}"
    assert archive.names(log_id) == names[:-1]

    alone = archive_mod.verify(report.url)
    assert alone.ok and alone.log_id == log_id and alone.segments == names[:-1]
    archived = datas(archive_mod.read(report.url))
    assert archived == records[: len(archived)] and 0 < len(archived) < len(records)

    # What compaction will do: drop the local copies of what is archived.
    for seg in segments(session)[:-1]:
        seg.unlink()
    both = archive_mod.verify(archive.url, local=session)
    assert both.ok and both.records == len(records) and both.segments == names
    assert datas(archive_mod.read(archive.url, local=session)) == records
    tail = list(archive_mod.read(archive.url, len(records) - 3, local=session))
    assert [r.data for r in tail] == records[-4:]
    # Without its archive the local tail does not verify: the chain starts mid-air.
    assert not walj.verify(session).ok


def test_walj_read_and_verify_take_an_archive_url(archive: Archive, tmp_path: Path) -> None:
    """The top-level names route a URL, and `archive=`, to walj.archive: the same records and
    the same report as walj.archive's own calls; a plain directory still reads locally."""
    session = tmp_path / "s"
    records = make_session(session)
    url = archive_mod.ship(session, archive.url).url
    assert datas(walj.read(url)) == datas(archive_mod.read(url))
    assert walj.verify(url).segments == archive_mod.verify(url).segments
    for seg in segments(session)[:-1]:
        seg.unlink()
    assert datas(walj.read(session, archive=archive.url)) == records
    assert [r.seq for r in walj.read(session, 5, archive=archive.url)][0] == 5
    both = walj.verify(session, archive=archive.url)
    assert both.ok and both.records == len(records)
    # Without the archive, the local tail alone starts mid-chain: the plain path is local.
    assert not walj.verify(session).ok


def test_ship_is_idempotent_and_resumes(archive: Archive, tmp_path: Path) -> None:
    session = tmp_path / "s"
    records = make_session(session, 30)
    first = archive_mod.ship(session, archive.url)
    assert first.shipped
    again = archive_mod.ship(session, archive.url)
    assert again.shipped == [] and again.skipped == first.shipped and again.bytes == 0
    # More records rotate more segments: only the new sealed ones go.
    more = make_session(session, 30, start=30)
    third = archive_mod.ship(session, archive.url)
    assert third.skipped == first.shipped and third.shipped
    assert set(third.shipped).isdisjoint(first.shipped)
    assert datas(archive_mod.read(archive.url, local=session)) == records + more


def test_partial_objects_are_reported_then_repaired(archive: Archive, tmp_path: Path) -> None:
    session = tmp_path / "s"
    make_session(session)
    report = archive_mod.ship(session, archive.url)
    log_id = report.log_id
    assert log_id is not None
    middle, last = report.shipped[1], report.shipped[-1]
    for name in (middle, last):  # what an upload cut short leaves on a store without atomic PUT
        data = archive.get(f"{log_id}/{name}")
        archive.put(f"{log_id}/{name}", data[: len(data) // 2])
    seen = archive_mod.verify(report.url)
    assert not seen.ok
    assert {(p.file, p.kind) for p in seen.problems} >= {(middle, "unsealed_segment"),
                                                          (last, "unsealed_segment")}
    with pytest.raises(CorruptionError) as caught:
        list(archive_mod.read(report.url))
    assert (caught.value.kind, caught.value.file) == ("incomplete_line", middle)
    # The reader never takes a truncated last object for the end of the log, as it would a
    # local torn tail.
    archive.put(f"{log_id}/{middle}", (session / middle).read_bytes())
    with pytest.raises(CorruptionError) as caught:
        list(archive_mod.read(report.url))
    assert (caught.value.kind, caught.value.file) == ("unsealed_segment", last)
    fixed = archive_mod.ship(session, archive.url)
    # Each was a partial copy of the same segment: written over, nothing it held is lost.
    assert fixed.repaired == [last] and fixed.shipped == []
    assert archive_mod.verify(report.url).ok


def _edit_record(data: bytes) -> bytes:
    """Change one record's data and re-checksum its line, as someone editing the object with
    knowledge of the format would: every line verifies, only the seal can tell."""
    lines = data.split(b"\n")
    seq, payload = fmt.parse_data(lines[1]) or (0, b"")
    assert seq and b'"text":"record ' in payload
    edited = payload.replace(b'"text":"record ', b'"text":"RECORD ', 1)
    lines[1] = fmt.frame_record(seq, edited)[:-1]
    return b"\n".join(lines)


def test_an_object_edited_in_the_bucket_is_a_seal_mismatch(archive: Archive,
                                                           tmp_path: Path) -> None:
    session = tmp_path / "s"
    make_session(session)
    report = archive_mod.ship(session, archive.url)
    log_id = report.log_id
    name = report.shipped[1]
    archive.put(f"{log_id}/{name}", _edit_record(archive.get(f"{log_id}/{name}")))
    seen = archive_mod.verify(report.url)
    assert not seen.ok
    assert [(p.file, p.kind) for p in seen.problems] == [(name, "seal_mismatch")]
    # Same size, same header and seal lines: the cheap check of ship cannot tell; recheck can.
    assert name in archive_mod.ship(session, archive.url).skipped
    rechecked = archive_mod.ship(session, archive.url, recheck=True)
    # Its seal line is the segment's own, whose SHA-256 names the bytes: a damaged copy.
    assert rechecked.repaired == [name] and rechecked.shipped == []
    assert archive_mod.verify(report.url).ok


def test_a_missing_object_in_the_middle_breaks_the_chain(archive: Archive,
                                                         tmp_path: Path) -> None:
    session = tmp_path / "s"
    make_session(session)
    report = archive_mod.ship(session, archive.url)
    gone = report.shipped[2]
    archive.delete(f"{report.log_id}/{gone}")
    seen = archive_mod.verify(report.url)
    assert not seen.ok and gone not in seen.segments
    assert {"missing_segment", "seal_chain"} <= kinds(seen)
    after = report.shipped[3]
    assert any(p.file == after and p.kind == "seal_chain" for p in seen.problems)
    with pytest.raises(CorruptionError) as caught:
        list(archive_mod.read(report.url))
    assert caught.value.kind == "missing_segment"
    assert archive_mod.ship(session, archive.url).shipped == [gone]
    assert archive_mod.verify(report.url).ok


def test_a_foreign_object_is_refused_not_replaced(archive: Archive, tmp_path: Path) -> None:
    """An object of another log under this log's prefix (a forged or misfiled copy) verifies
    as a sealed segment: the archive is append-only, so ship refuses it, naming both, and
    leaves it as it is."""
    one, other = tmp_path / "one", tmp_path / "other"
    make_session(one)
    make_session(other)
    report = archive_mod.ship(one, archive.url)
    name = report.shipped[1]
    foreign = (other / name).read_bytes()
    archive.put(f"{report.log_id}/{name}", foreign)
    assert "foreign_segment" in kinds(archive_mod.verify(report.url))
    for recheck in (False, True):
        with pytest.raises(archive_mod.ForkError, match="another log") as caught:
            archive_mod.ship(one, archive.url, recheck=recheck)
        assert caught.value.local == str(one / name)
        assert caught.value.archived == f"{report.url}/{name}"
        assert archive.get(f"{report.log_id}/{name}") == foreign
    assert "foreign_segment" in kinds(archive_mod.verify(report.url))


def test_ship_beside_a_live_writer_that_rotates(archive: Archive, tmp_path: Path) -> None:
    session = tmp_path / "s"
    written: list[dict[str, Any]] = []
    # The writer holds the lock throughout; ship takes none and never reads the active segment.
    with walj.Log.open(session, segment_bytes=1024, sync="never") as log:
        for round_ in range(4):
            for i in range(25):
                record = {"round": round_, "i": i, "pad": "y" * 20}
                log.append(record)
                written.append(record)
            report = archive_mod.ship(session, archive.url)
            active = segments(session)[-1].name
            assert active not in report.shipped
            assert archive_mod.verify(report.url).ok
            assert datas(archive_mod.read(archive.url, local=session)) == written
    final = archive_mod.ship(session, archive.url)
    assert archive_mod.verify(final.url).ok
    assert datas(archive_mod.read(archive.url, local=session)) == written


def test_reading_an_archive_writes_nothing(archive: Archive, tmp_path: Path) -> None:
    session = tmp_path / "s"
    make_session(session)
    report = archive_mod.ship(session, archive.url)
    before = {name: archive.get(f"{report.log_id}/{name}") for name in report.shipped}
    archive_mod.verify(report.url)
    list(archive_mod.read(report.url, 5))
    after = {name: archive.get(f"{report.log_id}/{name}") for name in archive.names(
        report.log_id or "")}
    assert after == before


def test_bad_input_gets_a_typed_error(archive: Archive, tmp_path: Path) -> None:
    with pytest.raises(walj.WaljError):
        archive_mod.ship(tmp_path / "nothing-here", archive.url)
    with pytest.raises(archive_mod.ArchiveError, match="no archived segment"):
        archive_mod.verify(f"{archive.url}/0123456789abcdef0123456789abcdef")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(archive_mod.ArchiveError, match="log id"):
        archive_mod.verify(archive.url, local=empty)
    # A session whose sealed segment was damaged locally: not shipped, the ones before are.
    session = tmp_path / "s"
    make_session(session)
    # Asked to read the archive too, not the local segments alone in silence.
    with pytest.raises(archive_mod.ArchiveError, match="nothing shipped"):
        archive_mod.verify(archive.url, local=session)
    third = segments(session)[2]
    data = bytearray(third.read_bytes())
    data[len(data) // 2] ^= 1
    third.write_bytes(bytes(data))
    with pytest.raises(CorruptionError, match=third.name) as caught:
        archive_mod.ship(session, archive.url)
    assert caught.value.kind == "seal_mismatch"
    log_id = walj.verify(session).log_id
    assert archive.names(log_id or "") == [p.name for p in segments(session)[:2]]


def test_a_local_copy_of_an_archive_reads_as_plain_logs(archive: Archive,
                                                         tmp_path: Path) -> None:
    """What the stdlib-only forensic tool reads: a downloaded prefix is a log directory."""
    session = tmp_path / "s"
    make_session(session)
    report = archive_mod.ship(session, archive.url)
    copy = tmp_path / "downloaded"
    copy.mkdir()
    for name in archive.names(report.log_id or ""):
        (copy / name).write_bytes(archive.get(f"{report.log_id}/{name}"))
    assert walj.verify(copy).ok
    assert datas(walj.read(copy)) == datas(archive_mod.read(report.url))
    shutil.rmtree(copy)


def test_hostile_objects_are_refused_not_trusted(archive: Archive, tmp_path: Path) -> None:
    """Objects nobody shipped, named like segments: a prefix (a "directory"), and a huge one
    with no newline, read in chunks and cut at the header's line limit, never held whole."""
    session = tmp_path / "s"
    make_session(session)
    report = archive_mod.ship(session, archive.url)
    log_id = report.log_id or ""
    after = len(report.shipped)
    huge = fmt.segment_name(after + 1)
    if archive.local_root is not None:
        (archive.local_root / log_id / fmt.segment_name(after + 2)).mkdir()
        (archive.local_root / log_id / fmt.segment_name(after + 2) / "x").write_bytes(b"{}")
    else:
        archive.put(f"{log_id}/{fmt.segment_name(after + 2)}/x", b"{}")
    archive.put(f"{log_id}/{huge}", b"a" * (3 << 20))
    seen = archive_mod.verify(report.url)
    found = {(p.file, p.kind) for p in seen.problems}
    assert (fmt.segment_name(after + 2), "not_a_regular_file") in found
    # The last archived object: not a torn tail, as it would be locally, but a problem.
    assert (huge, "unsealed_segment") in found and seen.torn_tail is not None
    assert seen.torn_tail.kind == "oversize_line"
    assert seen.records == len(datas(archive_mod.read(report.url, recovery="salvage")))
    with pytest.raises(CorruptionError):
        list(archive_mod.read(report.url))


def test_ship_never_writes_over_a_prefix_named_like_a_segment(archive: Archive,
                                                              tmp_path: Path) -> None:
    session = tmp_path / "s"
    make_session(session)
    report = archive_mod.ship(session, archive.url)
    name = report.shipped[1]
    archive.delete(f"{report.log_id}/{name}")
    if archive.local_root is not None:
        (archive.local_root / str(report.log_id) / name).mkdir()
        (archive.local_root / str(report.log_id) / name / "x").write_bytes(b"{}")
    else:
        archive.put(f"{report.log_id}/{name}/x", b"{}")
    with pytest.raises(archive_mod.ArchiveError, match="not an object"):
        archive_mod.ship(session, archive.url)
    assert archive.get(f"{report.log_id}/{name}/x") == b"{}"


def test_a_file_system_without_hard_links_still_ships_new_objects_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A local archive on a file system that refuses hard links (EPERM, as FAT or some network
    mounts do): new objects are put in place by a rename after a check, and an object that
    is there is still never written over."""
    import errno

    from walj.archive import _store

    def no_links(src: str, dst: str, **kwargs: Any) -> None:
        raise OSError(errno.EPERM, "hard links not supported", dst)

    monkeypatch.setattr(_store.os, "link", no_links)
    session, root = tmp_path / "s", tmp_path / "archive"
    make_session(session)
    report = archive_mod.ship(session, str(root))
    assert report.shipped and archive_mod.verify(report.url).ok
    assert not [p for p in (root / str(report.log_id)).iterdir() if ".part-" in p.name]
    other = tmp_path / "other"
    make_session(other)
    name = report.shipped[0]
    store = _store.open_store(str(root))
    key = store.key(str(report.log_id), name)
    before = (root / str(report.log_id) / name).read_bytes()
    assert not store.put_new(key, (other / name).read_bytes())
    assert (root / str(report.log_id) / name).read_bytes() == before
