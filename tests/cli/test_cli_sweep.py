"""`walj sweep` over 200 session directories, a few ended, a few blocked (one of them ended)
and a few corrupt (each in its own way), finds exactly those, in a process pool and in one
process."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_helpers import ENV, REPO, flip_byte, make_journal, record_offset, walj_cli
from helpers import segments

import walj

BLOCKED = {"s-017", "s-058", "team/s-133", "s-190"}
CORRUPT = {"s-003", "s-077", "team/s-121", "s-160", "s-199"}
UNSUPPORTED = {"s-042"}
ENDED = {"s-005", "team/s-130", "s-150"}
ENDED_BLOCKED = {"s-190"}  # ended with a blocker unresolved: still blocked, and ended


def _name(i: int) -> str:
    return f"team/s-{i:03d}" if 120 <= i < 140 else f"s-{i:03d}"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """200 sessions, copied from three templates (copying is much cheaper than writing)."""
    base = tmp_path_factory.mktemp("sweep")
    clean, blocked = base / "t-clean", base / "t-blocked"
    ended, ended_blocked = base / "t-ended", base / "t-ended-blocked"
    make_journal(clean, turns=1, segment_bytes=1024)
    make_journal(blocked, turns=1, blocked=True, segment_bytes=1024)
    assert len(segments(clean)) >= 3
    for template, source in ((ended, clean), (ended_blocked, blocked)):
        shutil.copytree(source, template)
        with walj.ToolJournal.open(template, segment_bytes=1024) as journal:
            journal.end()
    sessions = base / "sessions"
    for i in range(200):
        name = _name(i)
        template = (ended_blocked if name in ENDED_BLOCKED else blocked if name in BLOCKED
                    else ended if name in ENDED else clean)
        shutil.copytree(template, sessions / name)
    damage = sorted(CORRUPT)
    # a flipped byte in a sealed segment, in the last one, a missing segment, a cut seal, and
    # an edited record whose line checksum still fails
    flip_byte(segments(sessions / damage[0])[0], record_offset(
        segments(sessions / damage[0])[0], b'"kind":"turn_started"'))
    last = segments(sessions / damage[1])[-1]
    flip_byte(last, last.stat().st_size - 30)
    with open(last, "ab") as f:  # a valid-looking line after the damage: not a torn tail
        f.write(segments(sessions / damage[1])[0].read_bytes().splitlines(keepends=True)[1])
    segments(sessions / damage[2])[1].unlink()
    seg = segments(sessions / damage[3])[0]
    seg.write_bytes(seg.read_bytes()[:-20] + b"\n")
    seg = segments(sessions / damage[4])[1]
    data = seg.read_bytes()
    seg.write_bytes(data.replace(b'"outcome":"ok"', b'"outcome":"OK"', 1)
                    if b'"outcome":"ok"' in data else data[:200] + b"X" + data[201:])
    # a journal record with a contract version this walj does not know
    newer = sessions / sorted(UNSUPPORTED)[0]
    shutil.rmtree(newer)
    with walj.Log.open(newer) as log:
        log.append({"kind": "turn_started", "version": 99, "turn_sequence": 1, "at": 1.0})
    # not sessions: a stray file, an empty folder, and a log's own quarantine folder
    (sessions / "README.txt").write_text("not a log")
    (sessions / "empty").mkdir()
    return sessions


def test_sweep_finds_exactly_the_blocked_and_corrupt_sessions(root: Path) -> None:
    run = walj_cli("sweep", root, "--jobs", "2", "--json")
    assert run.code == 1, run.err
    report = run.json()
    assert report["schema"] == "walj.sweep/2"
    assert report["logs"] == 200
    by_status: dict[str, set[str]] = {}
    for session in report["sessions"]:
        assert set(session) == {"path", "status", "records", "last_seq", "blocked", "ended",
                                "blockers", "problem_count", "problems", "torn_tail", "plain",
                                "last_record_at", "detail", "approvals"}
        assert session["approvals"] == []  # none of these sessions asked for one
        if session["status"] in ("active", "ended", "blocked"):  # journals: each record's time
            assert session["plain"] is False
            assert 0 <= time.time() - session["last_record_at"] < 3600
        assert session["ended"] == (str(Path(session["path"]).relative_to(root))
                                    in ENDED | ENDED_BLOCKED)
        rel = str(Path(session["path"]).relative_to(root))
        by_status.setdefault(session["status"], set()).add(rel)
    assert by_status.pop("blocked") == BLOCKED
    assert by_status.pop("corrupt") == CORRUPT
    assert by_status.pop("unsupported") == UNSUPPORTED
    assert by_status.pop("ended") == ENDED
    assert set(by_status) == {"active"} and len(by_status["active"]) == 187
    assert report["counts"] == {"active": 187, "ended": 3, "blocked": 4, "corrupt": 5,
                                "unsupported": 1, "unreadable": 0}
    for session in report["sessions"]:
        damaged = session["status"] == "corrupt"
        assert (session["problem_count"] > 0) == damaged
        assert bool(session["problems"]) == damaged
    blocked = next(s for s in report["sessions"] if s["path"].endswith("s-017"))
    assert blocked["blockers"][0]["tool"] == "send"
    assert blocked["blockers"][0]["state"] == "ambiguous"


def test_sweep_in_one_process_and_as_a_table(root: Path) -> None:
    run = walj_cli("sweep", root, "--jobs", "1")
    assert run.code == 1, run.err
    lines = run.out.splitlines()
    assert lines[0].endswith(
        "200 logs: 187 active, 3 ended, 4 blocked, 5 corrupt, 1 unsupported")
    listed = {line.split()[0] for line in lines[3:] if line.startswith("  ")}
    assert listed == BLOCKED | CORRUPT | UNSUPPORTED


def test_sweep_of_clean_sessions_exits_0(root: Path, tmp_path: Path) -> None:
    clean = tmp_path / "clean"
    for name in ("s-001", "s-002", "team/s-125", "s-005"):
        shutil.copytree(root / name, clean / name)
    run = walj_cli("sweep", clean, "--all")
    assert run.code == 0, run.err
    assert "4 logs: 3 active, 1 ended" in run.out and "team/s-125" in run.out
    assert [line.split()[:2] for line in run.out.splitlines() if "s-005" in line] == [
        ["s-005", "ended"]]


def test_sweep_lists_sessions_nested_in_a_session(tmp_path: Path) -> None:
    """Sessions at every depth, below a session too; a session's own quarantine/ and
    requests/ are not searched, a symbolic link back up is listed, never followed."""
    root = tmp_path / "root"
    make_journal(root / "user42", turns=1)
    make_journal(root / "user42" / "thread7", turns=1, blocked=True)
    make_journal(root / "user42" / "threads" / "t1", turns=1)
    make_journal(root / "user42" / "thread7" / "sub", turns=1)
    for own in ("quarantine", "requests"):  # a log there would be no session of ROOT's
        make_journal(root / "user42" / own / "x", turns=1)
    (root / "user42" / "loop").symlink_to(root)
    run = walj_cli("sweep", root, "--json")
    assert run.code == 1, run.err  # the blocked one, and the refused link
    found = {str(Path(s["path"]).relative_to(root)): s["status"]
             for s in run.json()["sessions"]}
    assert found == {"user42": "active", "user42/thread7": "blocked",
                     "user42/threads/t1": "active", "user42/thread7/sub": "active",
                     "user42/loop": "unreadable"}
    text = walj_cli("sweep", root)
    assert "user42/thread7 " in text.out and "refused: symlink" in text.out


def test_sweep_shows_the_age_of_a_blocked_session(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from walj.journal import _writes

    monkeypatch.setattr(_writes, "now", lambda: time.time() - 40 * 86400)
    make_journal(tmp_path / "root" / "b", turns=1, blocked=True)
    run = walj_cli("sweep", tmp_path / "root")
    assert run.code == 1
    lines = run.out.splitlines()
    assert lines[2].split()[:3] == ["LOG", "STATUS", "AGE"]
    (row,) = [line.split() for line in lines if line.startswith("  b ")]
    assert row[1] == "BLOCKED" and row[2].startswith(("39d", "40d"))


UNSHARE = shutil.which("unshare")


def _in_own_mount_namespace(script: str) -> subprocess.CompletedProcess[str]:
    """`sh -c script` in a user and mount namespace of its own: its mounts vanish with it."""
    assert UNSHARE is not None
    return subprocess.run([UNSHARE, "-rm", "sh", "-c", script], env=ENV, cwd=REPO,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(UNSHARE is None, reason="unshare is not installed")
def test_a_bind_mount_loop_is_searched_once_and_never_pruned_through(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ROOT bound again below a session inside ROOT: sweep lists the loop once as refused and
    ends; prune keeps the session around the mount point and deletes nothing through it."""
    if _in_own_mount_namespace("true").returncode != 0:
        pytest.skip("no user and mount namespaces here")
    from walj.journal import _writes

    root = tmp_path / "root"
    monkeypatch.setattr(_writes, "now", lambda: time.time() - 40 * 86400)
    make_journal(root / "user42", turns=1)
    with walj.ToolJournal.open(root / "user42") as journal:
        journal.end()
    (root / "user42" / "again").mkdir()
    mount = f"mount --bind {shlex.quote(str(root))} {shlex.quote(str(root / 'user42/again'))}"
    walj_cmd = f"{shlex.quote(sys.executable)} -m walj"
    run = _in_own_mount_namespace(f"{mount} && {walj_cmd} sweep {shlex.quote(str(root))} "
                                  "--json")
    assert run.returncode == 1, run.stderr
    found = {str(Path(s["path"]).relative_to(root)): (s["status"], s["detail"])
             for s in json.loads(run.stdout)["sessions"]}
    assert found["user42"][0] == "ended"
    assert found["user42/again"][0] == "unreadable"
    assert "a bind mount" in found["user42/again"][1]
    assert len(found) == 2
    run = _in_own_mount_namespace(f"{mount} && {walj_cmd} prune {shlex.quote(str(root))} "
                                  "--older-than 30d --delete-unarchived --json")
    actions = {str(Path(s["path"]).relative_to(root)): (s["action"], s["detail"])
               for s in json.loads(run.stdout)["sessions"]}
    assert actions["user42"][0] == "kept_unaccounted", actions
    assert "again: a mount point" in actions["user42"][1]
    assert actions["user42/again"][0] == "kept_problem"
    assert (root / "user42" / "seg-0000000001.jsonl").exists()
