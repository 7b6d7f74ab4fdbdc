"""The archive is append-only, over s3:// (moto's S3 server) and file:// alike: a session that
was copied and went on in both copies (a restore, a VM snapshot, `cp -r`) is a fork, refused
by ship, compaction and prune with a ForkError naming both, with every archived object left as
it was and nothing dropped locally."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from archive_helpers import Archive
from cli_helpers import ENV, REPO, snapshot
from helpers import segments

import walj
import walj.archive as archive_mod
from walj.cli import main
from walj.journal import _writes


def ok(**arguments: Any) -> dict[str, Any]:
    return {"echo": arguments}


OPTIONS: dict[str, Any] = {"tools": {"ok": ok}, "store_outputs": True, "sync": "never",
                           "segment_bytes": 2048, "checkpoint_every": None}


def _calls(path: Path, tag: str, count: int, *, end: bool = False) -> None:
    with walj.ToolJournal.open(path, **OPTIONS) as journal:
        for t in range(count):
            with journal.turn() as turn:
                turn.dispatch("ok", {tag: t, "pad": "p" * 40}, call_id=f"{tag}-{t}")
        if end:
            journal.end()


def _objects(archive: Archive, log_id: str) -> dict[str, bytes]:
    return {name: archive.get(f"{log_id}/{name}") for name in archive.names(log_id)
            if name.startswith("seg-")}


def _forked(tmp_path: Path, archive: Archive) -> tuple[Path, Path, str]:
    """A session copied (cp -r) mid-segment; the original goes on and is compacted to the
    archive, so the archive holds the only copy of its older records; the copy goes on with
    other records, enough to seal the segment both were writing when it was made."""
    original, copy = tmp_path / "original", tmp_path / "copy"
    _calls(original, "first", 12)
    shutil.copytree(original, copy)
    _calls(original, "original", 12)
    with walj.ToolJournal.open(original, **OPTIONS) as journal:
        log_id = journal.log_id
        report = journal.compact(archive=archive.url)
    assert report.dropped_segments > 0
    _calls(copy, "copy", 12)
    return original, copy, log_id


def test_ship_never_replaces_a_verified_archived_segment(archive: Archive, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    original, copy, log_id = _forked(tmp_path, archive)
    before = _objects(archive, log_id)
    local = snapshot(copy)
    url = f"{archive.url}/{log_id}"
    with pytest.raises(archive_mod.ForkError) as caught:
        archive_mod.ship(copy, archive.url)
    fork = caught.value
    name = os.path.basename(fork.local)
    assert fork.local == str(copy / name) and fork.archived == f"{url}/{name}"
    assert str(copy / name) in str(fork) and f"{url}/{name}" in str(fork)
    assert "fork" in str(fork) and name in before
    # Byte for byte what compaction left; the archive alone still verifies; the copy keeps
    # every file it had.
    assert _objects(archive, log_id) == before
    assert archive_mod.verify(url).ok
    capsys.readouterr()
    assert main(["verify", url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"]
    assert snapshot(copy) == local
    # The original's full history: the archive, then its local tail, one verified chain.
    assert walj.verify(original, archive=archive.url).ok
    # recheck reads every object whole: the same refusal, nothing written.
    with pytest.raises(archive_mod.ForkError):
        archive_mod.ship(copy, archive.url, recheck=True)
    assert _objects(archive, log_id) == before
    # The CLI refuses it as a write it will not do: exit 1, one line naming both.
    capsys.readouterr()
    assert main(["archive", str(copy), "--to", archive.url]) == 1
    err = capsys.readouterr().err
    assert str(copy / name) in err and f"{url}/{name}" in err


def test_compact_to_an_archive_refuses_a_fork_and_drops_nothing(archive: Archive,
                                                                 tmp_path: Path) -> None:
    original, copy, log_id = _forked(tmp_path, archive)
    before = _objects(archive, log_id)
    local_segments = {p.name for p in segments(copy)}
    with walj.ToolJournal.open(copy, **OPTIONS) as journal:
        with pytest.raises(archive_mod.ForkError) as caught:
            journal.compact(archive=archive.url)
        assert caught.value.archived.startswith(f"{archive.url}/{log_id}/seg-")
    assert local_segments <= {p.name for p in segments(copy)}
    assert not (copy / "BASE").exists()
    assert walj.verify(copy).ok
    assert _objects(archive, log_id) == before
    assert archive_mod.verify(f"{archive.url}/{log_id}").ok
    # The copy still opens, and reads its whole history from its own files.
    with walj.ToolJournal.open(copy, **OPTIONS) as journal:
        assert not journal.is_blocked()
    assert next(iter(walj.read(copy))).seq == 1


def test_a_fork_after_compaction_is_refused_at_its_first_segment(archive: Archive,
                                                                 tmp_path: Path) -> None:
    """The copy was compacted too (to another archive), so its first local segment continues
    a segment it no longer holds: that segment's archived seal is another history's."""
    original, copy, log_id = _forked(tmp_path, archive)
    other = Archive(f"{archive.url}-other", archive.kind, archive.endpoint,
                    archive.local_root.with_name("other") if archive.local_root else None)
    with walj.ToolJournal.open(copy, **OPTIONS) as journal:
        journal.compact(archive=other.url)
    _calls(copy, "later", 12)
    before = _objects(archive, log_id)
    first = segments(copy)[0].name
    with pytest.raises(archive_mod.ForkError) as caught:
        archive_mod.ship(copy, archive.url)
    assert caught.value.local == str(copy / first)
    assert caught.value.archived.startswith(f"{archive.url}/{log_id}/seg-")
    assert _objects(archive, log_id) == before


def _without_lock(tree: dict[str, Any]) -> dict[str, Any]:
    """A snapshot minus the lock file, which taking the writer lock rewrites."""
    return {k: v for k, v in tree.items() if not Path(k).name.startswith("LOCK")}


def test_prune_archive_keeps_a_fork(archive: Archive, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Two ended copies of one session: the first pruned to the archive is removed; the
    other is a fork, which prune reports as failed and leaves whole."""
    monkeypatch.setattr(_writes, "now", lambda: time.time() - 40 * 86400.0)
    first, second = tmp_path / "first" / "s", tmp_path / "second" / "s"
    _calls(first, "common", 12)
    shutil.copytree(first, second)
    _calls(first, "one", 12, end=True)
    _calls(second, "two", 12, end=True)
    log_id = walj.verify(first).log_id or ""

    def prune(root: Path) -> dict[str, Any]:
        env = {**os.environ, **ENV}
        done = subprocess.run([sys.executable, "-m", "walj", "prune", str(root), "--older-than",
                               "30d", "--archive", archive.url, "--json"], env=env, cwd=REPO,
                              capture_output=True, text=True, timeout=120, check=False)
        (entry,) = json.loads(done.stdout)["sessions"]
        return {"code": done.returncode, **entry}

    assert prune(first.parent)["action"] == "removed"
    before = _objects(archive, log_id)
    tree = snapshot(second.parent)
    kept = prune(second.parent)
    assert kept["code"] == 1 and kept["action"] == "failed" and "fork" in kept["detail"]
    assert _without_lock(snapshot(second.parent)) == _without_lock(tree)
    assert _objects(archive, log_id) == before
    assert archive_mod.verify(f"{archive.url}/{log_id}").ok


def test_a_verified_segment_that_begins_the_local_one_is_never_written_over(
        archive: Archive, tmp_path: Path) -> None:
    """A local segment forged to begin with the archived one's bytes (its seal line in the
    middle) and sealed again at its end: the archived object is no partial copy, it verifies
    on its own, so it stays, and ship refuses."""
    import hashlib

    from archive_helpers import make_session

    from walj.log import format as fmt

    session = tmp_path / "s"
    make_session(session)
    report = archive_mod.ship(session, archive.url)
    name = report.shipped[-1]
    archived = archive.get(f"{report.log_id}/{name}")
    seal = fmt.parse_seal(archived.rstrip(b"\n").rsplit(b"\n", 1)[1])
    assert seal is not None
    body = archived + fmt.frame_record(seal.last_seq + 1, b'{"forged":true}')
    resealed = fmt.Seal(seal.last_seq + 1, seal.records + 1,
                        hashlib.sha256(body).hexdigest())
    (session / name).write_bytes(body + fmt.frame(resealed.body()))
    with pytest.raises(archive_mod.ForkError) as caught:
        archive_mod.ship(session, archive.url, recheck=True)
    assert caught.value.local == str(session / name)
    assert archive.get(f"{report.log_id}/{name}") == archived
