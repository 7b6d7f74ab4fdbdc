"""`walj audit`: the export's rows and manifest, and `--verify`, which passes exactly when the
export matches the logs (whatever the sessions' state) and otherwise names each edited, missing,
added or moved row and each log that differs; time filters; usage errors; an interrupted export
leaves no file; the export is synced before its rename and the directory after (strace)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import ENV, REPO, Run, assert_one_line_error, flip_byte, make_journal
from helpers import segments, strace_calls

import walj
from walj.cli import _audit, main

STRACE = shutil.which("strace")


def run(capsys: pytest.CaptureFixture[str], *args: Any) -> tuple[int, str, str]:
    """The CLI's `main` in this process."""
    capsys.readouterr()
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def lines_of(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def rows_and_manifest(path: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    lines = [json.loads(line) for line in lines_of(path)]
    return lines[:-1], lines[-1]["manifest"]


def findings(capsys: pytest.CaptureFixture[str], export: Path, root: Path) -> dict[str, Any]:
    code, out, err = run(capsys, "audit", "--verify", export, root, "--json")
    report = json.loads(out)
    assert code == (0 if report["ok"] else 1), err
    assert report["schema"] == "walj.audit-verify/1"
    return report


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three sessions: `clean` in several sealed segments, `resolved` whose ambiguous call was
    resolved, and `blocked` (one nested in the directory of another: `clean/sub`)."""
    base = tmp_path_factory.mktemp("audit") / "root"
    make_journal(base / "clean", segment_bytes=1024)
    eid = make_journal(base / "resolved", turns=1, blocked=True, segment_bytes=1024)
    assert eid is not None
    walj.resolve_session(base / "resolved", eid, "not_performed", actor="ops-ann",
                         note="no mail left the server")
    make_journal(base / "clean" / "sub", turns=1, blocked=True)
    return base


def test_export_rows_and_manifest_match_the_logs(root: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    export = tmp_path / "audit.jsonl"
    code, out, err = run(capsys, "audit", root, "-o", export)
    assert code == 0, err
    assert str(export) in out
    rows, manifest = rows_and_manifest(export)
    assert [s["session"] for s in manifest["sessions"]] == ["clean", "clean/sub", "resolved"]
    assert manifest["rows"] == len(rows) and manifest["schema"] == "walj.audit/1"
    assert manifest["walj_version"] == walj.__version__
    assert manifest["rows_sha256"] == hashlib.sha256(b"".join(lines_of(export)[:-1])).hexdigest()
    # One row per execution (settled by its finish, or by a resolution) and per resolution.
    clean = [r for r in rows if r["session"] == "clean"]
    assert [(r["tool"], r["outcome"]) for r in clean] == [
        ("lookup", "ok"), ("send", "ok"), ("failing", "error")] * 2
    assert all(r["row"] == "execution" and r["end_seq"] > r["seq"] for r in clean)
    first = clean[0]
    assert first["time"].endswith("Z") and first["at"] == pytest.approx(
        list(walj.read(root / "clean"))[first["seq"] - 1].data["at"])
    resolved = [r for r in rows if r["session"] == "resolved"]
    execution, resolution = resolved[-2:]
    assert execution["outcome"] == "resolved not_performed"
    assert execution["actor"] == resolution["actor"] == "ops-ann"
    assert resolution["row"] == "resolution" and resolution["note"] == "no mail left the server"
    assert resolution["execution_id"] == execution["execution_id"]
    assert resolution["call_id"] == execution["call_id"] and "[redacted]" in str(
        resolution["arguments_preview"])
    blocked = [r for r in rows if r["session"] == "clean/sub"][-1]
    assert blocked["outcome"] == "ambiguous" and blocked["end_seq"] is None
    # Each segment's seal, as the segment's own last line says, and the chain's head.
    clean_entry = manifest["sessions"][0]
    files = segments(root / "clean")
    assert [s["segment"] for s in clean_entry["segments"]] == [f.name for f in files]
    for entry, file in zip(clean_entry["segments"][:-1], files[:-1], strict=True):
        seal = json.loads(file.read_bytes().splitlines()[-1])["seal"]
        assert entry["state"] == "sealed" and entry["sha256"] == seal["sha256"]
        assert entry["sha256"] == hashlib.sha256(
            file.read_bytes()[:file.read_bytes().rindex(b'{"xxh64"')]).hexdigest()
    assert clean_entry["chain_head"]["sha256"] == clean_entry["segments"][-2]["sha256"]
    active = clean_entry["segments"][-1]
    data = files[-1].read_bytes()[:active["bytes"]]
    assert active["state"] == "unsealed" and active["sha256"] == hashlib.sha256(data).hexdigest()
    assert active["bytes"] > 0 and active["records"] == 0  # its header alone, after a rotation
    assert clean_entry["last_seq"] == walj.verify(root / "clean").last_seq
    # It verifies, though a session is blocked; the text view says so in one line.
    assert findings(capsys, export, root)["findings"] == []
    code, out, _ = run(capsys, "audit", "--verify", export, root)
    assert code == 0 and out.splitlines() == [
        f"{export}: matches the logs: {len(rows)} rows from 3 sessions"]


def _tampered(export: Path, tmp_path: Path, name: str, edit: Any) -> Path:
    lines = lines_of(export)
    rows, manifest = lines[:-1], lines[-1]
    rows, manifest = edit(rows, manifest)
    out = tmp_path / name
    out.write_bytes(b"".join(rows) + manifest)
    return out


def test_verify_names_each_edited_missing_added_and_moved_row(
        root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    export = tmp_path / "audit.jsonl"
    assert run(capsys, "audit", root, "-o", export)[0] == 0

    def edit_outcome(rows: list[bytes], manifest: bytes) -> tuple[list[bytes], bytes]:
        rows[2] = rows[2].replace(b'"outcome":"error"', b'"outcome":"ok"')
        return rows, manifest

    def drop(rows: list[bytes], manifest: bytes) -> tuple[list[bytes], bytes]:
        # The digest fixed up too: only the derivation from the logs can tell.
        del rows[1]
        fixed = json.loads(manifest)
        fixed["manifest"]["rows_sha256"] = hashlib.sha256(b"".join(rows)).hexdigest()
        fixed["manifest"]["rows"] -= 1
        return rows, json.dumps(fixed).encode() + b"\n"

    def swap(rows: list[bytes], manifest: bytes) -> tuple[list[bytes], bytes]:
        rows[0], rows[1] = rows[1], rows[0]
        return rows, manifest

    def duplicate(rows: list[bytes], manifest: bytes) -> tuple[list[bytes], bytes]:
        return rows + [rows[0]], manifest

    def digest_only(rows: list[bytes], manifest: bytes) -> tuple[list[bytes], bytes]:
        return rows, manifest.replace(b'"rows_sha256":"', b'"rows_sha256":"0')

    def mangled_manifest(rows: list[bytes], manifest: bytes) -> tuple[list[bytes], bytes]:
        fixed = json.loads(manifest)
        fixed["manifest"]["sessions"][0].update(segments=5, last_seq="x", problems={"a": 1})
        return rows, json.dumps(fixed).encode() + b"\n"

    expected = {"edited": (edit_outcome, {"row_edited", "rows_digest"}, 3),
                "dropped": (drop, {"row_missing"}, None),
                "swapped": (swap, {"row_moved", "rows_digest"}, 1),
                "duplicated": (duplicate, {"row_added", "rows_digest", "rows_count"},
                               None),
                "digest": (digest_only, {"rows_digest"}, None),
                # Fields of the wrong type: the session is read through seq 0, so no row.
                "mangled": (mangled_manifest, {"row_added"}, None)}
    for name, (edit, kinds, line) in expected.items():
        report = findings(capsys, _tampered(export, tmp_path, name, edit), root)
        assert not report["ok"] and set(report["counts"]) == kinds, (name, report)
        if line is not None:
            row_findings = [f for f in report["findings"] if f["kind"].startswith("row_")]
            assert [f["line"] for f in row_findings] == [line], (name, report)
    code, out, _ = run(capsys, "audit", "--verify", tmp_path / "edited", root)
    assert code == 1
    assert "row_edited: line 3 session clean seq 6: differs from the row the logs give" in out


def test_verify_fails_on_logs_other_than_the_exported_ones(
        root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    copy = tmp_path / "root"
    shutil.copytree(root, copy)
    export = tmp_path / "audit.jsonl"
    assert run(capsys, "audit", copy, "-o", export)[0] == 0
    # Another session set: one more, and (against the original's parent) one fewer.
    make_journal(copy / "new", turns=1)
    assert findings(capsys, export, copy)["counts"] == {"session_added": 1}
    shutil.rmtree(copy / "new")
    # A session replaced by another log of the same name: another log id, other seals.
    shutil.move(copy / "resolved", tmp_path / "resolved-saved")
    make_journal(copy / "resolved", turns=1, blocked=True, segment_bytes=1024)
    counts = findings(capsys, export, copy)["counts"]
    assert {"log_id_differs", "chain_head_differs", "row_edited"} <= set(counts), counts
    shutil.rmtree(copy / "resolved")
    shutil.move(tmp_path / "resolved-saved", copy / "resolved")
    assert findings(capsys, export, copy)["ok"]
    # A byte of a sealed segment changed: its seal no longer matches, and the intent's line
    # no longer verifies, so the export holds a row the logs no longer give.
    first = segments(copy / "clean")[0]
    flip_byte(first, first.read_bytes().index(b'"tool":"lookup"') + 9)
    counts = findings(capsys, export, copy)["counts"]
    assert set(counts) == {"damage", "row_added"}, counts


def test_records_after_the_export_are_outside_it(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Beside a live writer: the export reads the active segment as far as it goes (in a child
    process, no lock taken); the writer then appends and rotates, sealing that segment, and
    the export still verifies. A rewrite of what it read of that segment does not."""
    session = tmp_path / "root" / "live"
    journal = walj.ToolJournal.open(session, tools={"send": lambda to: to}, sync="never",
                                    segment_bytes=4096)
    try:
        with journal.turn() as turn:
            turn.dispatch("send", {"to": "a@example.com"})
        export = tmp_path / "audit.csv"
        done = subprocess.run([sys.executable, "-m", "walj", "audit", tmp_path / "root", "-o",
                               export, "--format", "csv"], env=ENV, cwd=REPO,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        for i in range(40):
            with journal.turn() as turn:
                turn.dispatch("send", {"to": f"u{i}@example.com"})
        assert len(segments(session)) > 1
        report = findings(capsys, export, tmp_path / "root")
        assert report["ok"] and report["rows"] == 1, report
    finally:
        journal.close()
    manifest = json.loads((tmp_path / "audit.csv.manifest.json").read_text())["manifest"]
    [active] = manifest["sessions"][0]["segments"]
    assert active["state"] == "unsealed" and active["records"] == 4
    first = segments(session)[0]
    flip_byte(first, first.read_bytes().index(b'"tool":"send"') + 9)
    assert "unsealed_differs" in findings(capsys, export, tmp_path / "root")["counts"]


def test_time_filters(root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    everything = tmp_path / "all.jsonl"
    assert run(capsys, "audit", root, "-o", everything)[0] == 0
    rows, _ = rows_and_manifest(everything)
    times = sorted(r["at"] for r in rows)
    since, until = times[3], times[-2]
    export = tmp_path / "some.jsonl"
    code, _, err = run(capsys, "audit", root, "-o", export, "--since", str(since), "--until",
                       _iso(until))
    assert code == 0, err
    kept, manifest = rows_and_manifest(export)
    filters = manifest["filters"]
    assert filters["since"] == since and filters["until"] == pytest.approx(until, abs=1e-6)
    assert kept == [r for r in rows if since <= r["at"] < filters["until"]]
    assert 0 < len(kept) < len(rows) - 3
    assert findings(capsys, export, root)["ok"]


def _iso(t: float) -> str:
    from walj.cli._audit_args import iso_time

    text = iso_time(t)
    assert text is not None
    return text


def test_usage_errors_are_one_line(root: Path, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "x.jsonl"

    def audit(*args: Any) -> Run:
        return Run(*run(capsys, "audit", *args))

    assert_one_line_error(audit(root), 2, "-o FILE")
    assert_one_line_error(audit(root, "-o", out, "--since", "yesterday"), 2, "--since",
                          "ISO 8601")
    assert_one_line_error(audit(root, "-o", root / "clean" / "x.jsonl"), 2,
                          "inside the session directory")
    out.write_text('{"not": "an export"}\n')
    assert_one_line_error(audit(out, "-o", tmp_path / "y.jsonl"), 2, "is a file")
    assert_one_line_error(audit("--verify", out, root), 2, "no walj audit export")
    assert_one_line_error(audit("--verify", out, root, "-o", out), 2, "--verify")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.jsonl"]


def test_an_interrupted_export_leaves_the_old_file(root: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    export = tmp_path / "audit.jsonl"
    export.write_bytes(b"the previous export\n")
    reads = []
    real = _audit.read_session

    def interrupted_after_one(source: Any, through: int | None = None) -> Any:
        if reads:
            raise KeyboardInterrupt
        reads.append(source)
        return real(source, through)

    monkeypatch.setattr(_audit, "read_session", interrupted_after_one)
    code, out, err = run(capsys, "audit", root, "-o", export)
    assert code == 130 and out == "" and "interrupted" in err
    assert export.read_bytes() == b"the previous export\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["audit.jsonl"]


@pytest.mark.skipif(STRACE is None, reason="strace is not installed")
def test_syscall_order_of_an_export(root: Path, tmp_path: Path) -> None:
    """A CSV export and its manifest: each written and fsynced under a temporary name before
    its rename into place, the directory fsynced after both renames."""
    export = tmp_path / "out" / "audit.csv"
    export.parent.mkdir()
    trace = tmp_path / "trace"
    proc = subprocess.run(
        [str(STRACE), "-f", "-qq", "-o", str(trace), "-e",
         "trace=openat,write,fsync,fdatasync,rename,renameat,renameat2", sys.executable, "-m",
         "walj", "audit", str(root), "-o", str(export), "--format", "csv"],
        env=ENV, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    calls = [(op, target) for op, target in strace_calls(trace.read_text())
             if target.startswith(str(export.parent))]
    synced = {"fsync", "fdatasync"}
    renames = [i for i, (op, _) in enumerate(calls) if op.startswith("rename")]
    assert [calls[i][1] for i in renames] == [str(export), f"{export}.manifest.json"]
    before = calls[:renames[0]]
    temps = {target for op, target in before if op == "write"}
    assert len(temps) == 2 and all(".tmp-" in t for t in temps), before
    for temp in temps:
        last_write = max(i for i, c in enumerate(before) if c == ("write", temp))
        assert any(op in synced and t == temp for op, t in before[last_write:]), before
    assert any(op in synced and t == str(export.parent) for op, t in calls[renames[1]:]), calls
    assert not any(op == "write" for op, _ in calls[renames[0]:])
    assert os.path.exists(f"{export}.manifest.json")
