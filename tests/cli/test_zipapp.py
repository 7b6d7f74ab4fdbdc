"""walj-forensic.pyz: built from the repository's own walj sources, run in a venv with nothing
installed (no msgspec, xxhash or filelock), it verifies logs the library wrote, really checking
checksums, and does the read commands only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import (
    REPO,
    flip_byte,
    forensic,
    interrupted,
    lookup,
    make_journal,
    make_plain_log,
    send,
    snapshot,
    walj_cli,
)
from helpers import segments
from report_helpers import read_page

import walj


@pytest.fixture(scope="module")
def zipapp(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("zipapp")
    pyz = base / "out" / "walj-forensic.pyz"
    build = subprocess.run([sys.executable, "tools/build_zipapp.py", "--output", str(pyz)],
                           cwd=REPO, capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stderr
    assert pyz.is_file() and "built" in build.stdout
    venv = base / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python = venv / "bin" / "python"
    return {"pyz": pyz, "python": python, "base": base}


def test_the_venv_has_nothing_installed(zipapp: dict[str, Path]) -> None:
    for module in ("msgspec", "xxhash", "filelock", "walj"):
        probe = subprocess.run([str(zipapp["python"]), "-c", f"import {module}"],
                               capture_output=True, cwd=str(zipapp["base"]),
                               env={"PATH": os.environ.get("PATH", "")})
        assert probe.returncode != 0, f"{module} is importable in the bare venv"
    version = forensic(zipapp, "--version")
    assert version.code == 0
    assert "pure-Python XXH64" in version.out and "json (stdlib)" in version.out


def test_it_zips_the_repository_sources_unchanged(zipapp: dict[str, Path]) -> None:
    package = Path(REPO) / "walj"
    sources = {str(p.relative_to(REPO)): p.read_bytes() for p in package.rglob("*.py")
               if "__pycache__" not in p.parts}
    with zipfile.ZipFile(zipapp["pyz"]) as archive:
        names = {n for n in archive.namelist() if not n.endswith("/")} - {"__main__.py"}
        assert names == set(sources)
        for name, data in sources.items():
            assert archive.read(name) == data, name


def test_verify_a_library_log_and_catch_a_flipped_byte(zipapp: dict[str, Path],
                                                       tmp_path: Path) -> None:
    log = tmp_path / "log"
    make_plain_log(log, 400, segment_bytes=8192)
    assert len(segments(log)) > 2
    run = forensic(zipapp, "verify", log, "--json")
    assert run.code == 0, run.err
    report = run.json()
    assert report["ok"] is True and report["records"] == 400
    assert report == walj_cli("verify", log, "--json").json()
    # An edit that leaves valid JSON ("record 57" -> "record 56"): only the checksum sees it.
    seg = segments(log)[1]
    data = seg.read_bytes()
    at = data.index(b'"text":"record ') + len(b'"text":"record ')
    flip_byte(seg, at)
    assert seg.read_bytes().splitlines()[1:2]  # still lines
    json.loads(seg.read_bytes().split(b"\n")[1])  # and still JSON
    bad = forensic(zipapp, "verify", log, "--json")
    assert bad.code == 1
    kinds = {p["kind"] for p in bad.json()["problems"]}
    assert "bad_checksum" in kinds
    assert forensic(zipapp, "verify", log).code == 1


def _stable(report: dict[str, Any]) -> dict[str, Any]:
    """An inspect report without what depends on when it ran."""
    out = {k: v for k, v in report.items() if k != "now"}
    for key in ("blockers", "incomplete_turns", "pending_llm_calls"):
        out[key] = [{k: v for k, v in item.items() if k != "age_seconds"} for item in out[key]]
    return out


def test_read_commands_match_the_library_and_write_nothing(zipapp: dict[str, Path],
                                                            tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    eid = make_journal(root / "blocked", blocked=True)
    make_journal(root / "clean")
    before = snapshot(root)
    blocked = root / "blocked"
    inspect = forensic(zipapp, "inspect", blocked, "--json")
    assert inspect.code == 1, inspect.err
    assert inspect.json()["blockers"][0]["execution_id"] == eid
    assert _stable(inspect.json()) == _stable(walj_cli("inspect", blocked, "--json").json())
    dump = forensic(zipapp, "dump", blocked, "--json")
    assert dump.code == 0
    assert dump.lines() == walj_cli("dump", blocked, "--json").lines()
    timeline = forensic(zipapp, "timeline", blocked, "--json")
    assert timeline.code == 1
    assert timeline.json() == walj_cli("timeline", blocked, "--json").json()
    sweep = forensic(zipapp, "sweep", root, "--json")
    assert sweep.code == 1, sweep.err
    assert {Path(s["path"]).name: s["status"] for s in sweep.json()["sessions"]} == {
        "blocked": "blocked", "clean": "active"}
    for command in ("stats", "tail"):
        assert forensic(zipapp, command, blocked).code == 0
    text = forensic(zipapp, "inspect", blocked)
    assert "BLOCKED by 1 blocker" in text.out
    for argv in (["resolve", blocked, eid, "--outcome", "succeeded", "--note", "n",
                  "--actor", "a"], ["repair", blocked], ["demo", tmp_path / "demo"]):
        refused = forensic(zipapp, *argv)
        assert refused.code == 2 and "read-only" in refused.err
        assert "Traceback" not in refused.err
    assert snapshot(root) == before
    assert not (tmp_path / "demo").exists()


def test_report_with_the_standard_library_matches_the_library(zipapp: dict[str, Path],
                                                              tmp_path: Path) -> None:
    """`report` writes only its page: the zipapp makes it, from the same rows, sections and
    resolve commands as the library's (times aside), and the sessions stay as they were."""
    root = tmp_path / "sessions"
    eid = make_journal(root / "blocked", blocked=True)
    make_journal(root / "clean")
    before = snapshot(root)
    made = forensic(zipapp, "report", root, "-o", tmp_path / "forensic.html")
    assert made.code == 1 and "2 sessions (1 active, 1 blocked)" in made.out, made.err
    assert walj_cli("report", root, "-o", tmp_path / "library.html").code == 1
    _, forensic_page = read_page(tmp_path / "forensic.html")
    _, library_page = read_page(tmp_path / "library.html")
    assert [row[:2] + row[3:] for row in forensic_page.rows] == [
        row[:2] + row[3:] for row in library_page.rows]  # the age column is a clock's
    assert forensic_page.sections == library_page.sections == [("s1", "blocked"),
                                                               ("s2", "active")]
    assert forensic_page.commands == library_page.commands
    assert eid is not None and eid in forensic_page.commands["s1"][0]
    assert snapshot(root) == before


def test_audit_with_the_standard_library_writes_the_librarys_rows(zipapp: dict[str, Path],
                                                                  tmp_path: Path) -> None:
    """`audit` writes only its export: the zipapp's rows are the library's, byte for byte, and
    each verifies the other's export against the sessions."""
    root = tmp_path / "sessions"
    make_journal(root / "blocked", blocked=True)
    make_journal(root / "clean")
    before = snapshot(root)
    made = forensic(zipapp, "audit", root, "-o", tmp_path / "forensic.jsonl")
    assert made.code == 0, made.err
    assert walj_cli("audit", root, "-o", tmp_path / "library.jsonl").code == 0
    forensic_lines = (tmp_path / "forensic.jsonl").read_bytes().splitlines()
    library_lines = (tmp_path / "library.jsonl").read_bytes().splitlines()
    assert len(forensic_lines) > 2 and forensic_lines[:-1] == library_lines[:-1]
    manifests = [json.loads(lines[-1])["manifest"] for lines in (forensic_lines, library_lines)]
    assert manifests[0]["rows_sha256"] == manifests[1]["rows_sha256"]
    assert forensic(zipapp, "audit", "--verify", tmp_path / "library.jsonl", root).code == 0
    assert walj_cli("audit", "--verify", tmp_path / "forensic.jsonl", root).code == 0
    assert snapshot(root) == before


def test_it_reads_a_local_archive_with_the_standard_library(zipapp: dict[str, Path],
                                                            tmp_path: Path) -> None:
    """A local archive (a downloaded prefix, a mounted volume) with nothing installed: the
    archived session alone, the archive plus the local tail, and a sweep of the archive root.
    Shipping writes, so the zipapp refuses it."""
    import walj.archive

    session = tmp_path / "s"
    make_plain_log(session, 80, segment_bytes=1024)
    report = walj.archive.ship(session, tmp_path / "archive")
    for seg in segments(session)[:-1]:
        seg.unlink()
    alone = forensic(zipapp, "verify", report.url, "--json")
    assert alone.code == 0 and alone.json()["ok"] and alone.json()["records"] < 80
    both = forensic(zipapp, "verify", session, "--archive", tmp_path / "archive", "--json")
    assert both.code == 0 and both.json()["ok"] and both.json()["records"] == 80, both.err
    swept = forensic(zipapp, "sweep", f"file://{tmp_path / 'archive'}", "--json")
    assert swept.code == 0 and swept.json()["counts"]["active"] == 1, swept.err
    refused = forensic(zipapp, "archive", session, "--to", tmp_path / "other")
    assert refused.code == 2 and "read-only" in refused.err
    assert not (tmp_path / "other").exists()


def test_a_compacted_log_verifies_and_dumps_from_its_base(zipapp: dict[str, Path],
                                                          tmp_path: Path) -> None:
    """The stdlib-only reader follows BASE as the library does, and a forged marker is damage
    there too."""
    path = tmp_path / "compacted"
    make_plain_log(path, 80, segment_bytes=1024)
    with walj.Log.open(path, segment_bytes=1024) as log:
        assert log.drop_before(40) > 0
    first = walj.verify(path).base.first_seq  # type: ignore[union-attr]
    run = forensic(zipapp, "verify", "--json", path)
    assert run.code == 0, run.err
    report = json.loads(run.out)
    assert report["ok"] and report["base"]["first_seq"] == first and report["last_seq"] == 80
    dump = forensic(zipapp, "dump", "--json", path)
    assert dump.code == 0, dump.err
    assert [line["seq"] for line in dump.lines()] == list(range(first, 81))
    marker = path / "BASE"
    marker.write_bytes(marker.read_bytes().replace(b'"first":', b'"first":9'))
    bad = forensic(zipapp, "verify", "--json", path)
    assert bad.code != 0 and "bad_base" in [p["kind"] for p in json.loads(bad.out)["problems"]]


def test_a_compacted_journal_reads_the_same_in_the_library_and_the_zipapp(
        zipapp: dict[str, Path], tmp_path: Path) -> None:
    """keep_turns leaves records before the checkpoint: every reader passes over them to the
    checkpoint, so the blocker it carries is reported by inspect and sweep alike, and the
    timeline still shows the kept turns completed."""
    path = tmp_path / "root" / "s"
    tools = {"lookup": lookup, "send": send, "stop": interrupted}
    with walj.ToolJournal.open(path, tools=tools, segment_bytes=2048, sync="never",
                               checkpoint_every=None) as journal:
        for t in range(20):
            with journal.turn() as turn:
                turn.dispatch("lookup", {"order_id": f"o{t}"})
        with pytest.raises(KeyboardInterrupt), journal.turn() as turn:
            turn.dispatch("stop", {})
        report = journal.compact(keep_turns=2)
        (blocker,) = journal.recovery.blockers
    assert report.first_seq < report.checkpoint_seq and report.dropped_segments > 0
    for run in (walj_cli("inspect", "--json", path), forensic(zipapp, "inspect", "--json", path)):
        assert run.code == 1, run.err
        assert [b["execution_id"] for b in json.loads(run.out)["blockers"]] == \
            [blocker.execution_id]
    for run in (walj_cli("sweep", "--json", path.parent),
                forensic(zipapp, "sweep", "--json", path.parent)):
        (session,) = json.loads(run.out)["sessions"]
        assert session["status"] == "blocked" and len(session["blockers"]) == 1
    timeline = walj_cli("timeline", "--json", path)
    turns = {t["turn_sequence"]: t for t in json.loads(timeline.out)["turns"]}
    assert max(turns) == 21 and turns[21]["state"] != "completed"
    assert all(turns[n]["state"] == "completed" for n in turns if n != 21)
