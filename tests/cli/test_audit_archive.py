"""`walj audit` over archives (file:// and moto's S3 server): an archive root alone, and local
sessions compacted since, their early segments only in the archive (`--archive`), which export
exactly the rows the whole local sessions did; verification reads the archive the same way."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from archive_helpers import Archive
from cli_helpers import make_journal

import walj
import walj.archive as archive_mod
from walj.cli import main


def run(capsys: pytest.CaptureFixture[str], *args: Any) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def export_of(path: Path) -> tuple[bytes, dict[str, Any]]:
    lines = path.read_bytes().splitlines(keepends=True)
    return b"".join(lines[:-1]), json.loads(lines[-1])["manifest"]


def test_archive_root_and_archive_plus_local_tail(archive: Archive, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "root"
    eid = make_journal(root / "a", blocked=True, segment_bytes=1024)
    assert eid is not None
    walj.resolve_session(root / "a", eid, "failed", actor="ops", note="bounced")
    make_journal(root / "b", turns=1, segment_bytes=1024)
    whole = tmp_path / "whole.jsonl"
    assert run(capsys, "audit", root, "-o", whole)[0] == 0
    for name in ("a", "b"):
        assert archive_mod.ship(root / name, archive.url).shipped
    log_ids = {name: walj.verify(root / name).log_id for name in ("a", "b")}

    # The archive root alone: every archived session, named by its log id.
    archived = tmp_path / "archived.jsonl"
    code, _, err = run(capsys, "audit", archive.url, "-o", archived)
    assert code == 0, err
    rows, manifest = export_of(archived)
    assert sorted(e["session"] for e in manifest["sessions"]) == sorted(log_ids.values())
    assert {e["origin"] for e in manifest["sessions"]} == {"archive"}
    assert all(s["state"] == "sealed" for e in manifest["sessions"] for s in e["segments"])
    assert rows and run(capsys, "audit", "--verify", archived, archive.url)[0] == 0

    # Local sessions compacted since, their dropped segments only in the archive: the same rows
    # (a checkpoint is no row).
    for name in ("a", "b"):
        with walj.ToolJournal.open(root / name) as journal:
            assert journal.compact(keep_turns=0, archive=archive.url).dropped_segments
        assert (root / name / "BASE").exists()
    both = tmp_path / "both.jsonl"
    code, _, err = run(capsys, "audit", root, "--archive", archive.url, "-o", both)
    assert code == 0, err
    rows, manifest = export_of(both)
    assert rows == export_of(whole)[0]
    assert {e["origin"] for e in manifest["sessions"]} == {"archive+local"}
    code, out, _ = run(capsys, "audit", "--verify", both, root, "--archive", archive.url)
    assert code == 0, out
    # Without the archive the logs given are other than the exported ones.
    code, out, _ = run(capsys, "audit", "--verify", both, root, "--json")
    report = json.loads(out)
    assert code == 1 and "segment_missing" in report["counts"], report
