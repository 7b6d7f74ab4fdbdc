"""A session's quarantine/ in the archive, over s3:// (moto's S3 server) and file:// alike:
the cut bytes and their manifest are shipped, read back and verified with the segments; the
manifest grows as new versions, never written over; `walj verify URL` and `walj sweep URL`
show the cuts, and an archived copy that does not match its manifest line is a problem."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from archive_helpers import Archive, make_session
from cli_helpers import flip_byte, record_offset
from helpers import strace_calls

import walj
import walj.archive as archive_mod
from walj.cli import main

STRACE = shutil.which("strace")


def run(capsys: pytest.CaptureFixture[str], *args: str | os.PathLike[str]) -> tuple[int, str,
                                                                                  str]:
    capsys.readouterr()
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def _damage_and_repair(session: Path, capsys: pytest.CaptureFixture[str],
                       which: int = 3) -> None:
    """A record's checksum broken in a segment, then `walj repair`: the damaged suffix, and
    every segment after it, cut into quarantine/ with a manifest line each."""
    segment = sorted(session.glob("seg-*.jsonl"))[which]
    flip_byte(segment, record_offset(segment, b'"text":"record'))
    code, _, err = run(capsys, "repair", session)
    assert code == 0, err
    assert walj.verify(session).ok


def _local_cuts(session: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in (session / "quarantine").iterdir()}


def _cut_session(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Path, str]:
    session = tmp_path / "s"
    make_session(session)
    _damage_and_repair(session, capsys)
    log_id = walj.verify(session).log_id
    assert log_id is not None
    return session, log_id


def test_ship_archives_quarantined_bytes(archive: Archive, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    session, log_id = _cut_session(tmp_path, capsys)
    cuts = _local_cuts(session)
    manifest = cuts.pop("MANIFEST.jsonl")
    assert len(cuts) == 3
    wanted = {f"quarantine/{name}" for name in cuts} | {"quarantine/MANIFEST.jsonl"}
    report = archive_mod.ship(session, archive.url)
    assert wanted <= set(report.shipped) and not report.unverified
    assert report.bytes == sum(map(len, cuts.values())) + len(manifest) + sum(
        (session / n).stat().st_size for n in report.shipped if n.startswith("seg-"))
    # Byte for byte, and the manifest as the version named by its length.
    for name, data in cuts.items():
        assert archive.get(f"{log_id}/quarantine/{name}") == data
    assert archive.get(f"{log_id}/quarantine/MANIFEST.{len(manifest)}.jsonl") == manifest
    assert wanted <= archive_mod.verified_copies(session, archive.url)
    again = archive_mod.ship(session, archive.url)
    assert wanted <= set(again.skipped) and again.shipped == [] and again.bytes == 0

    code, out, err = run(capsys, "verify", report.url, "--json")
    verified = json.loads(out)
    assert code == 0 and verified["ok"], err
    listed = {c["file"]: c for c in verified["quarantine"]}
    assert set(listed) == set(cuts)
    assert all(c["verified"] and c["length"] == len(cuts[n]) for n, c in listed.items())
    code, out, _ = run(capsys, "verify", report.url)
    assert code == 0 and f"3 earlier cuts ({sum(map(len, cuts.values())):,} bytes)" in out
    code, out, err = run(capsys, "sweep", archive.url, "--json")
    (entry,) = json.loads(out)["sessions"]
    assert code == 0 and entry["status"] == "active", err
    assert entry["quarantine"] == {"cuts": 3, "bytes": sum(map(len, cuts.values())),
                                   "unverified": 0}


def test_a_grown_manifest_is_a_new_version_never_written_over(
        archive: Archive, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    session, log_id = _cut_session(tmp_path, capsys)
    first = archive_mod.ship(session, archive.url)
    old = (session / "quarantine" / "MANIFEST.jsonl").read_bytes()
    old_key = f"{log_id}/quarantine/MANIFEST.{len(old)}.jsonl"
    with walj.Log.open(session, segment_bytes=1024, sync="never") as log:
        for i in range(40):
            log.append({"i": 100 + i, "text": f"record {100 + i}", "pad": "y" * 20})
    _damage_and_repair(session, capsys, which=-3)
    grown = (session / "quarantine" / "MANIFEST.jsonl").read_bytes()
    assert grown.startswith(old) and len(grown) > len(old)
    second = archive_mod.ship(session, archive.url)
    assert "quarantine/MANIFEST.jsonl" in second.shipped
    assert archive.get(old_key) == old
    assert archive.get(f"{log_id}/quarantine/MANIFEST.{len(grown)}.jsonl") == grown
    seen = archive_mod.verify(first.url)
    assert seen.ok, seen.problems
    code, out, _ = run(capsys, "verify", first.url, "--json")
    assert code == 0 and len(json.loads(out)["quarantine"]) == len(grown.splitlines())


def test_an_edited_archived_quarantine_copy_is_a_problem_not_silently_replaced(
        archive: Archive, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    session, log_id = _cut_session(tmp_path, capsys)
    report = archive_mod.ship(session, archive.url)
    name = sorted(n for n in _local_cuts(session) if n.endswith(".bin"))[0]
    key = f"{log_id}/quarantine/{name}"
    data = bytearray(archive.get(key))
    data[len(data) // 2] ^= 0x01
    archive.put(key, bytes(data))

    seen = archive_mod.verify(report.url)
    assert not seen.ok
    assert [(p.file, p.kind) for p in seen.problems] == [(f"quarantine/{name}",
                                                         "quarantine_mismatch")]
    code, out, _ = run(capsys, "sweep", archive.url, "--json")
    (entry,) = json.loads(out)["sessions"]
    assert code == 1 and entry["status"] == "corrupt"
    assert entry["quarantine"]["unverified"] == 1
    code, out, _ = run(capsys, "verify", report.url)
    assert code == 1 and "quarantine_mismatch" in out and name in out
    # The local file is the one its manifest line names: ship writes the damaged copy over
    # with it and says so; it is never counted as a plain skip.
    code, out, err = run(capsys, "archive", session, "--to", archive.url)
    assert code == 0 and "repaired 1 object" in out and f"quarantine/{name}" in out, err
    assert archive.get(key) == (session / "quarantine" / name).read_bytes()
    assert archive_mod.verify(report.url).ok


def test_an_edited_archived_manifest_is_refused(archive: Archive, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """The archived manifest is no prefix of the local one any more: another history of
    the quarantine, refused with both named, the archived version left as it is."""
    session, log_id = _cut_session(tmp_path, capsys)
    archive_mod.ship(session, archive.url)
    manifest = (session / "quarantine" / "MANIFEST.jsonl").read_bytes()
    key = f"{log_id}/quarantine/MANIFEST.{len(manifest)}.jsonl"
    edited = manifest.replace(b'"kind":"', b'"kind":"X', 1)[:len(manifest)]
    archive.put(key, edited)
    with pytest.raises(archive_mod.ForkError) as caught:
        archive_mod.verified_copies(session, archive.url)
    assert caught.value.local == str(session / "quarantine" / "MANIFEST.jsonl")
    assert caught.value.archived.endswith(f"/{key}")
    assert archive.get(key) == edited


def test_a_damaged_local_quarantine_file_is_never_counted_verified(
        archive: Archive, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A local cut that no longer matches its manifest line is shipped as it is (the only
    copy of what it holds) but is no verified copy: prune keeps the session."""
    session, log_id = _cut_session(tmp_path, capsys)
    name = sorted(n for n in _local_cuts(session) if n.endswith(".bin"))[0]
    flip_byte(session / "quarantine" / name, 5)
    verified = archive_mod.verified_copies(session, archive.url)
    assert f"quarantine/{name}" not in verified and "quarantine/MANIFEST.jsonl" in verified
    assert archive.get(f"{log_id}/quarantine/{name}") == (
        session / "quarantine" / name).read_bytes()
    code, out, _ = run(capsys, "archive", session, "--to", archive.url, "--json")
    assert code == 1 and json.loads(out)["unverified"] == [f"quarantine/{name}"]
    assert "quarantine_mismatch" in {p.kind for p in archive_mod.verify(
        f"{archive.url}/{log_id}").problems}


CHILD = "import sys, walj.archive\nwalj.archive.ship(sys.argv[1], sys.argv[2])\n"


@pytest.mark.skipif(STRACE is None, reason="strace is not installed")
def test_syscall_order_of_a_new_archived_object(tmp_path: Path) -> None:
    """file://: each new object is written to a temporary file and synced, hard-linked to its
    name (which fails, and writes nothing, if an object of that name exists), the temporary
    file unlinked, and the directory synced."""
    session, root = tmp_path / "s", tmp_path / "archive"
    make_session(session, 20)
    out = tmp_path / "trace"
    env: dict[str, Any] = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    subprocess.run([str(STRACE), "-f", "-qq", "-o", str(out), "-e",
                    "trace=openat,write,fdatasync,fsync,rename,link,linkat,unlink,unlinkat",
                    sys.executable, "-c", CHILD, str(session), f"file://{root}"],
                   check=True, env=env, capture_output=True, text=True)
    log_id = walj.verify(session).log_id
    directory = str(root / str(log_id))
    events = [(op, target) for op, target in strace_calls(out.read_text())
              if op in ("linkat", "link") or target.startswith(directory)]
    name = "seg-0000000001.jsonl"
    tmp = next(t for op, t in events if op == "openat" and f".{name}.part-" in t)
    mine = events[events.index(("openat", tmp)):]
    synced = next(i for i, (op, t) in enumerate(mine) if op in ("fsync", "fdatasync")
                  and t == tmp)
    linked = next(i for i, (op, _) in enumerate(mine) if op in ("link", "linkat"))
    unlinked = mine.index(("unlink", tmp))
    dir_synced = next(i for i, (op, t) in enumerate(mine) if op in ("fsync", "fdatasync")
                      and t == directory)
    assert ("write", tmp) in mine[:synced]
    assert synced < linked < unlinked < dir_synced, mine[:dir_synced + 1]
    assert not any(op == "rename" for op, _ in mine[:dir_synced])
    assert (root / str(log_id) / name).read_bytes() == (session / name).read_bytes()


def test_keyboard_interrupt_anywhere_in_a_ship_with_quarantine(
        archive: Archive, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Stopped at a line of walj/archive anywhere in a ship that carries cuts: what is archived
    reads without a problem, and the next ship completes it, cuts and manifest verified."""
    from test_archive_crash import _interrupt_at, _points

    session, log_id = _cut_session(tmp_path, capsys)
    wanted = {f"quarantine/{n}" for n in _local_cuts(session)}
    archive_mod.ship(session, f"{archive.url}/first")  # makes the root: trials do not
    total = _interrupt_at(0, lambda: archive_mod.ship(session, f"{archive.url}/count"))
    points = _points(total, 6 if archive.kind == "s3" else 40)
    interrupted = 0
    for n in points:
        url = f"{archive.url}/i{n}"
        try:
            _interrupt_at(n, lambda url=url: archive_mod.ship(session, url))  # type: ignore[misc]
        except KeyboardInterrupt:
            interrupted += 1
        try:
            seen = archive_mod.verify(f"{url}/{log_id}")
        except archive_mod.ArchiveError:  # no segment archived yet
            pass
        else:
            assert seen.ok, (n, seen.problems)
        assert wanted <= archive_mod.verified_copies(session, url)
        finished = archive_mod.verify(f"{url}/{log_id}")
        assert finished.ok, finished.problems
    assert interrupted == len(points)
