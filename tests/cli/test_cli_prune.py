"""`walj prune`: retention over a root of sessions. Ended sessions are archived, read back and
removed; long active ones compacted; blocked, corrupt and young ones kept, each said so; a
SIGKILL or Ctrl-C at any moment leaves every session whole or a tombstone the next run
finishes; and the rename to a tombstone is durable before the first unlink (strace)."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from archive_helpers import Archive
from cli_helpers import (
    ENV,
    REPO,
    Run,
    assert_one_line_error,
    make_journal,
    snapshot,
    walj_cli,
)
from helpers import strace_calls

import walj
from walj.cli import _retire
from walj.journal import _writes

DAY = 86400.0
STRACE = shutil.which("strace")


def prune(*args: Any, env: dict[str, str] | None = None, timeout: float = 120) -> Run:
    """`python -m walj prune ARGS`, in this test's environment (the archive fixture's too)."""
    full = {**os.environ, **ENV, **(env or {})}
    full["PYTHONPATH"] = ENV["PYTHONPATH"]
    proc = subprocess.run([sys.executable, "-m", "walj", "prune", *map(str, args)], env=full,
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)
    return Run(proc.returncode, proc.stdout, proc.stderr)


def start_prune(*args: Any) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "walj", "prune", *map(str, args)],
                            env={**os.environ, **ENV}, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def aged(monkeypatch: pytest.MonkeyPatch, days: float) -> None:
    """Records written from now on carry a time `days` ago (the journal's one clock)."""
    monkeypatch.setattr(_writes, "now", lambda: time.time() - days * DAY)


def ended(path: Path, turns: int = 3, **options: Any) -> None:
    make_journal(path, turns=turns, **options)
    with walj.ToolJournal.open(path) as journal:
        journal.end()


def records(path: Path | str, **options: Any) -> list[tuple[int, Any]]:
    return [(r.seq, r.data) for r in walj.read(path, **options)]


def log_id(path: Path) -> str:
    return json.loads((path / "seg-0000000001.jsonl").read_bytes().split(b"\n")[0])["header"][
        "log"]


def by_name(run: Run) -> dict[str, dict[str, Any]]:
    return {Path(s["path"]).name: s for s in run.json()["sessions"]}


def without_lock(tree: dict[str, Any]) -> dict[str, Any]:
    """A snapshot minus the lock files, which taking the writer lock rewrites."""
    return {k: v for k, v in tree.items() if not Path(k).name.startswith("LOCK")}


def test_each_kind_of_session_gets_its_action(tmp_path: Path, archive: Archive,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "root"
    aged(monkeypatch, 40)
    ended(root / "old-ended", segment_bytes=1024)
    make_journal(root / "old-active", turns=6, segment_bytes=1024)
    make_journal(root / "old-blocked", blocked=True, segment_bytes=1024)
    ended(root / "corrupt")
    segment = root / "corrupt" / "seg-0000000001.jsonl"
    segment.write_bytes(segment.read_bytes().replace(b"lookup", b"lookuq", 1))
    aged(monkeypatch, 2)
    ended(root / "young-ended")
    before = {name: records(root / name) for name in ("old-ended", "old-active")}
    kept = {name: snapshot(root / name) for name in ("old-blocked", "corrupt", "young-ended")}
    ended_id = log_id(root / "old-ended")

    run = prune(root, "--older-than", "30d", "--archive", archive.url, "--json")
    assert run.code == 1, run.err  # a blocked and a corrupt session need a person
    out = run.json()
    assert out["schema"] == "walj.prune/1" and not out["interrupted"]
    actions = {name: s["action"] for name, s in by_name(run).items()}
    assert actions == {"old-ended": "removed", "old-active": "compacted",
                       "old-blocked": "kept_blocked", "corrupt": "kept_problem",
                       "young-ended": "kept_young"}
    assert by_name(run)["old-ended"]["archived"]
    assert 35 * DAY < by_name(run)["old-ended"]["age_seconds"] < 45 * DAY
    # Removed: gone, no tombstone left, every record in the archive, which verifies.
    assert sorted(p.name for p in root.iterdir()) == ["corrupt", "old-active", "old-blocked",
                                                      "young-ended"]
    copy = f"{archive.url}/{ended_id}"
    assert walj.verify(copy).ok and records(copy) == before["old-ended"]
    # Compacted: segments dropped locally, the archive plus the tail is the whole history.
    assert by_name(run)["old-active"]["dropped_segments"] > 0
    assert records(root / "old-active")[0][0] > 1
    assert walj.verify(root / "old-active", archive=archive.url).ok
    assert records(root / "old-active", archive=archive.url)[:len(before["old-active"])] == \
        before["old-active"]
    # Kept: not a byte changed (the blocked one is never even opened).
    for name, tree in kept.items():
        assert snapshot(root / name) == tree, name
    assert "never removed while blocked" in by_name(run)["old-blocked"]["detail"]
    with walj.ToolJournal.open(root / "old-blocked") as journal:
        assert journal.recovery.blocked


def test_dry_run_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "root"
    aged(monkeypatch, 40)
    ended(root / "a")
    make_journal(root / "b", turns=6, segment_bytes=1024)
    (root / ".walj-pruning-c-0001").mkdir()
    (root / ".walj-pruning-c-0001" / "seg-0000000001.jsonl").write_bytes(b"left over\n")
    tree = snapshot(root)
    run = prune(root, "--older-than", "30d", "--delete-unarchived", "--dry-run", "--json")
    assert run.code == 0, run.err
    assert {n: s["action"] for n, s in by_name(run).items()} == {
        "a": "would_remove", "b": "would_compact", ".walj-pruning-c-0001": "would_finish_removal"}
    text = prune(root, "--older-than", "30d", "--delete-unarchived", "--dry-run")
    assert text.out.startswith("dry run, nothing changed: ")
    assert snapshot(root) == tree


def test_an_ended_session_is_removed_only_if_archived_or_deletion_is_asked_for(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "root"
    aged(monkeypatch, 40)
    ended(root / "a")
    tree = snapshot(root)
    run = prune(root, "--older-than", "30d")
    assert run.code == 0 and "kept_unarchived" in run.out and "--delete-unarchived" in run.out
    assert snapshot(root) == tree
    run = prune(root, "--older-than", "30d", "--delete-unarchived", "--json")
    assert run.code == 0 and by_name(run)["a"]["action"] == "removed"
    assert list(root.iterdir()) == []


@pytest.mark.parametrize("args, fragment", [
    (["--older-than", "30"], "--older-than takes"),
    (["--older-than", "1.5d"], "--older-than takes"),
    (["--older-than=-1d"], "--older-than takes"),
    (["--older-than", "3y"], "--older-than takes"),
    (["--older-than", "1d", "--keep-turns", "1001"], "--keep-turns"),
    (["--older-than", "1d", "--archive", "file:///x", "--delete-unarchived"], "exclude"),
    (["--older-than", "1d", "--jobs", "0"], "--jobs"),
])
def test_bad_arguments_are_one_line_errors(tmp_path: Path, args: list[str],
                                           fragment: str) -> None:
    ended(tmp_path / "root" / "a")
    tree = snapshot(tmp_path / "root")
    assert_one_line_error(prune(tmp_path / "root", *args), 2, fragment)
    assert snapshot(tmp_path / "root") == tree


def test_roots_that_are_no_local_root_are_refused(tmp_path: Path) -> None:
    assert_one_line_error(prune("s3://bucket/x", "--older-than", "1d"), 2, "local sessions")
    assert_one_line_error(prune(tmp_path / "nothing", "--older-than", "1d"), 2,
                          "no such file")
    (tmp_path / "file").write_text("")
    assert_one_line_error(prune(tmp_path / "file", "--older-than", "1d"), 2, "is a file")


def test_a_root_with_nothing_left_is_fine(tmp_path: Path) -> None:
    """After a prune removed everything, the next one (from cron) has nothing to do."""
    (tmp_path / "empty").mkdir()
    run = prune(tmp_path / "empty", "--older-than", "1d")
    assert run.code == 0 and "0 sessions: nothing done" in run.out, run


HOLDER = """
import sys, time, walj
journal = walj.ToolJournal.open(sys.argv[1])
print("ready", flush=True)
time.sleep(60)
"""


def test_a_session_open_in_another_process_is_busy_and_untouched(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "root"
    aged(monkeypatch, 40)
    ended(root / "ended")
    make_journal(root / "active", turns=6, segment_bytes=1024)
    holders = [subprocess.Popen([sys.executable, "-c", HOLDER, str(root / name)], env=ENV,
                                stdout=subprocess.PIPE, text=True) for name in ("ended", "active")]
    try:
        for holder in holders:
            assert holder.stdout is not None and holder.stdout.readline() == "ready\n"
        tree = without_lock(snapshot(root))
        run = prune(root, "--older-than", "30d", "--delete-unarchived", "--json")
        assert run.code == 0, run.err  # busy is not a problem: the session is in use
        assert {n: s["action"] for n, s in by_name(run).items()} == {"ended": "busy",
                                                                      "active": "busy"}
        assert "locked by another writer" in by_name(run)["ended"]["detail"]
        assert without_lock(snapshot(root)) == tree
    finally:
        for holder in holders:
            holder.kill()
            holder.wait()


def test_a_failing_archive_deletes_nothing(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "root"
    aged(monkeypatch, 40)
    ended(root / "ended", segment_bytes=1024)
    make_journal(root / "active", turns=6, segment_bytes=1024)
    (tmp_path / "a-file").write_text("not a directory")
    tree = without_lock(snapshot(root))
    active_count = len(records(root / "active"))
    run = prune(root, "--older-than", "30d", "--archive", f"file://{tmp_path}/a-file/x",
                "--json")
    assert run.code == 1, run.err
    assert {n: s["action"] for n, s in by_name(run).items()} == {"ended": "failed",
                                                                  "active": "failed"}
    after = without_lock(snapshot(root))
    # The active session's compaction wrote its checkpoint (sealing the segment it was in)
    # before the archive refused: every record is still there, every sealed segment unchanged.
    assert {k: v for k, v in after.items() if k.startswith("ended")} == \
        {k: v for k, v in tree.items() if k.startswith("ended")}
    last = max(k for k in tree if k.startswith("active/seg-"))
    assert {k: v for k, v in after.items() if k in tree and k != last} == \
        {k: v for k, v in tree.items() if k != last}
    assert [seq for seq, _ in records(root / "active")][:active_count] == \
        list(range(1, active_count + 1))


def test_a_session_that_changed_since_its_check_is_kept(tmp_path: Path) -> None:
    ended(tmp_path / "a")
    tree = snapshot(tmp_path / "a")
    last = walj.verify(tmp_path / "a").last_seq
    with pytest.raises(_retire.Kept, match="changed since it was checked"):
        _retire.remove(str(tmp_path / "a"), None, last - 1)
    assert without_lock(snapshot(tmp_path / "a")) == without_lock(tree)


def test_a_plain_log_is_never_compacted(tmp_path: Path) -> None:
    with walj.Log.open(tmp_path / "root" / "plain", segment_bytes=1024) as log:
        for i in range(60):
            log.append({"i": i, "pad": "x" * 40})
    run = prune(tmp_path / "root", "--older-than", "0s", "--json")
    assert run.code == 0 and by_name(run)["plain"]["action"] == "kept_active"
    assert records(tmp_path / "root" / "plain")[0][0] == 1


def test_keep_turns_keeps_the_last_turns_local(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "root"
    aged(monkeypatch, 40)
    make_journal(root / "s", turns=12, segment_bytes=1024)
    run = prune(root, "--older-than", "30d", "--keep-turns", "3", "--delete-unarchived",
                "--json")
    assert run.code == 0 and by_name(run)["s"]["action"] == "compacted"
    turns = {data["turn_sequence"] for _, data in records(root / "s")
             if data.get("kind") == "turn_started"}
    assert {10, 11, 12} <= turns and 1 not in turns


def test_hostile_names_are_printed_escaped(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    aged(monkeypatch, 40)
    ended(tmp_path / "root" / "evil\x1b[2J\x07")
    run = prune(tmp_path / "root", "--older-than", "30d")
    assert run.code == 0 and "kept_unarchived" in run.out
    assert "\x1b" not in run.out and "\x07" not in run.out


# --- crashes and interrupts ---------------------------------------------------------------------


def _many_ended(root: Path, count: int, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    aged(monkeypatch, 40)
    for k in range(count):
        ended(root / f"s{k:03d}", turns=1)
    return {p.name: without_lock(snapshot(p)) for p in root.iterdir()}


def _whole_or_gone(root: Path, trees: dict[str, Any]) -> tuple[int, int]:
    """Every session is whole (byte for byte) or gone; the rest are tombstones. Sweep, which
    skips tombstones, finds no damage. Returns (whole, tombstones)."""
    names = {p.name for p in root.iterdir()}
    tombstones = {n for n in names if n.startswith(".walj-pruning-")}
    assert names - tombstones <= set(trees)
    for name in names - tombstones:
        assert without_lock(snapshot(root / name)) == trees[name], name
    if names - tombstones:
        sweep = subprocess.run([sys.executable, "-m", "walj", "sweep", str(root), "--json"],
                               env=ENV, capture_output=True, text=True, cwd=REPO, timeout=60)
        assert sweep.returncode == 0, sweep.stdout + sweep.stderr
        assert json.loads(sweep.stdout)["logs"] == len(names - tombstones)
    return len(names - tombstones), len(tombstones)


@pytest.mark.parametrize("how", ["sigkill", "sigint"])
def test_killed_or_interrupted_mid_prune_every_session_is_whole_or_a_tombstone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    template = tmp_path / "template"
    trees = _many_ended(template, 120, monkeypatch)
    rng = random.Random(int(os.environ.get("WALJ_SEED", "20261203")))
    # How long a whole run takes here: the signal lands anywhere in it.
    shutil.copytree(template, tmp_path / "timing", symlinks=True)
    started = time.monotonic()
    assert prune(tmp_path / "timing", "--older-than", "30d", "--delete-unarchived", "--jobs",
                 "1").code == 0
    whole_run = time.monotonic() - started
    partial = 0
    for trial in range(12):
        root = tmp_path / f"root{trial}"
        shutil.copytree(template, root, symlinks=True)
        proc = start_prune(root, "--older-than", "30d", "--delete-unarchived", "--jobs", "1")
        if trial % 2:
            # Aimed: the moment the first removal shows, so that a machine slower now than
            # during the timing run cannot push every signal before the removals begin.
            deadline = time.monotonic() + 60
            while (set(trees) <= {p.name for p in root.iterdir()} and proc.poll() is None
                   and time.monotonic() < deadline):
                time.sleep(0.002)
        else:
            time.sleep(rng.uniform(0.2, 1.0) * whole_run)  # anywhere in the run
        proc.send_signal(signal.SIGKILL if how == "sigkill" else signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        whole, tombstones = _whole_or_gone(root, trees)
        if how == "sigint" and proc.returncode != 0 and (tombstones or 0 < whole < len(trees)):
            # Stopped mid-way (not while the interpreter was still importing walj, nor after
            # prune returned): 130 and a partial report, no traceback.
            assert proc.returncode == 130, (proc.returncode, out, err)
            assert "Traceback" not in err, err
            assert "interrupted after" in out or "interrupted" in err, (out, err)
        partial += 0 < whole < len(trees)
        # The next run finishes the job: nothing whole is left, and no tombstone either.
        run = prune(root, "--older-than", "30d", "--delete-unarchived", "--json")
        assert run.code == 0, run.err
        assert list(root.iterdir()) == [], run.out
        assert sum(s["action"] == "finished_removal" for s in run.json()["sessions"]) == \
            tombstones
        if partial >= 2:
            break
    assert partial, "no signal landed while sessions were being removed"


@pytest.mark.skipif(STRACE is None, reason="strace is not installed")
def test_syscall_order_of_a_removal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lock is taken before anything changes; the rename to a tombstone is made durable
    (parent fsync) before the first unlink; the parent is synced again after the rmdir."""
    root = tmp_path / "root"
    aged(monkeypatch, 40)
    ended(root / "s", segment_bytes=1024)
    trace = tmp_path / "trace"
    proc = subprocess.run(
        [str(STRACE), "-f", "-qq", "-o", str(trace), "-e",
         "trace=openat,flock,fsync,fdatasync,rename,renameat,renameat2,unlink,unlinkat,rmdir",
         sys.executable, "-m", "walj", "prune", str(root), "--older-than", "30d",
         "--delete-unarchived", "--jobs", "1"],
        env=ENV, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert not (root / "s").exists()
    calls = [(op, target) for op, target in strace_calls(trace.read_text())
             if target.startswith(str(root))]
    renames = [i for i, (op, target) in enumerate(calls)
               if op.startswith("rename") and ".walj-pruning-" in target]
    assert len(renames) == 1
    tombstone = calls[renames[0]][1]
    assert os.path.basename(tombstone).startswith(".walj-pruning-s-")
    lock = calls.index(("flock", str(root / "s" / "LOCK")))
    assert lock < renames[0]
    after = calls[renames[0] + 1:]
    first_unlink = next(i for i, (op, _) in enumerate(after) if op == "unlink")
    assert ("fsync", str(root)) in after[:first_unlink], after
    unlinked = {os.path.basename(t) for op, t in after if op == "unlink"}
    assert {"seg-0000000001.jsonl", "LOCK"} <= unlinked
    rmdir = after.index(("rmdir", tombstone))
    assert ("fsync", str(root)) in after[rmdir + 1:], after


# --- accounting for every byte: nested sessions, unknown files, quarantine ---------------------


def hold(path: Path) -> subprocess.Popen[str]:
    """A live writer: a child process holding the journal at `path` open until killed."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], env=ENV,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline() == "ready\n"
    return holder


def stop(holder: subprocess.Popen[str]) -> None:
    holder.kill()
    holder.wait()


def archived_sessions(archive: Path) -> set[str]:
    return {p.name for p in archive.iterdir()} if archive.exists() else set()


def test_prune_keeps_a_session_nested_in_an_old_session(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An ended per-user journal holding a blocked per-thread journal that a live writer has
    open: the thread is checked and kept, the user's directory is kept around it, nothing is
    shipped or deleted, and both are reported."""
    root = tmp_path / "root"
    aged(monkeypatch, 40)
    ended(root / "user42")
    make_journal(root / "user42" / "thread7", blocked=True)
    holder = hold(root / "user42" / "thread7")
    try:
        tree = snapshot(root)
        run = prune(root, "--older-than", "0s", "--archive", f"file://{tmp_path}/archive",
                    "--json")
        assert run.code == 1, run.err  # blocked
        sessions = {_relpath(s["path"], root): s for s in run.json()["sessions"]}
        assert {k: s["action"] for k, s in sessions.items()} == {
            "user42": "kept_nested", "user42/thread7": "kept_blocked"}
        assert "thread7: another session" in sessions["user42"]["detail"]
        assert snapshot(root) == tree  # not a byte, not a lock file
        assert archived_sessions(tmp_path / "archive") == set()  # kept before any upload
        assert holder.poll() is None
        text = prune(root, "--older-than", "0s", "--archive", f"file://{tmp_path}/archive")
        assert text.code == 1
        rows = {line.split()[0]: line.split()[1] for line in text.out.splitlines()[2:]
                if line.startswith("  ") and not line.startswith("  SESSION")}
        assert rows == {"user42": "kept_nested", "user42/thread7": "kept_blocked"}
    finally:
        stop(holder)


def _relpath(path: str, root: Path) -> str:
    return os.path.relpath(path, root)


def test_prune_removes_a_nested_session_before_the_one_around_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Children first: an ended thread below an ended user goes, then the user, in one run;
    a dry run says both would go and changes nothing."""
    root = tmp_path / "root"
    aged(monkeypatch, 40)
    ended(root / "user42")
    ended(root / "user42" / "threads" / "t1")
    ended(root / "user42" / "threads" / "t2")
    tree = snapshot(root)
    dry = prune(root, "--older-than", "30d", "--delete-unarchived", "--dry-run", "--json")
    assert {_relpath(s["path"], root): s["action"] for s in dry.json()["sessions"]} == {
        "user42": "would_remove", "user42/threads/t1": "would_remove",
        "user42/threads/t2": "would_remove"}
    assert snapshot(root) == tree
    run = prune(root, "--older-than", "30d", "--delete-unarchived", "--json")
    assert run.code == 0, run.err
    assert [(_relpath(s["path"], root), s["action"]) for s in run.json()["sessions"]] == [
        ("user42", "removed"), ("user42/threads/t1", "removed"),
        ("user42/threads/t2", "removed")]
    assert list(root.iterdir()) == []


def test_prune_keeps_a_session_whose_nested_session_stays(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A young thread keeps the old user around it; once the thread is gone, so is the user."""
    root = tmp_path / "root"
    aged(monkeypatch, 40)
    ended(root / "user42")
    aged(monkeypatch, 2)
    ended(root / "user42" / "thread7")
    run = prune(root, "--older-than", "30d", "--delete-unarchived", "--json")
    assert run.code == 0, run.err  # kept_nested is no problem: the thread is fine
    assert {_relpath(s["path"], root): s["action"] for s in run.json()["sessions"]} == {
        "user42": "kept_nested", "user42/thread7": "kept_young"}
    assert (root / "user42" / "seg-0000000001.jsonl").exists()
    run = prune(root, "--older-than", "1d", "--delete-unarchived", "--json")
    assert run.code == 0 and list(root.iterdir()) == [], run.out


@pytest.mark.parametrize("stray, reason", [
    ("notes.txt", "notes.txt: a file walj did not write"),
    ("requests/r1.json", "requests/: requests to the session's writer are pending"),
    ("scratch/deep/x.bin", "scratch/deep/x.bin: not walj's"),
    ("quarantine/sub/x.bin", "quarantine/sub: a directory walj does not make"),
])
def test_an_unknown_file_keeps_a_session(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         stray: str, reason: str) -> None:
    root = tmp_path / "root"
    aged(monkeypatch, 40)
    ended(root / "s")
    (root / "s" / stray).parent.mkdir(parents=True, exist_ok=True)
    (root / "s" / stray).write_text("not walj's")
    tree = snapshot(root)
    run = prune(root, "--older-than", "30d", "--delete-unarchived", "--json")
    assert run.code == 1, run.err  # a person must decide about it
    assert by_name(run)["s"]["action"] == "kept_unaccounted"
    assert reason in by_name(run)["s"]["detail"]
    assert snapshot(root) == tree
    text = prune(root, "--older-than", "30d", "--delete-unarchived")
    assert "kept_unaccounted" in text.out and "cannot account for" in text.out


def test_a_symlink_in_a_session_keeps_it_and_its_target_is_untouched(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "root"
    aged(monkeypatch, 40)
    ended(root / "s")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep me")
    (root / "s" / "link").symlink_to(outside)
    run = prune(root, "--older-than", "30d", "--delete-unarchived", "--json")
    assert run.code == 1
    assert by_name(run)["s"]["action"] == "kept_unaccounted"
    assert (outside / "precious").read_text() == "keep me"
    assert (root / "s" / "seg-0000000001.jsonl").exists()


def test_empty_directories_in_a_session_hold_no_byte_and_go(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "root"
    aged(monkeypatch, 40)
    ended(root / "s")
    (root / "s" / "requests").mkdir()
    (root / "s" / "threads" / "old").mkdir(parents=True)
    run = prune(root, "--older-than", "30d", "--delete-unarchived", "--json")
    assert run.code == 0 and by_name(run)["s"]["action"] == "removed", run.out
    assert list(root.iterdir()) == []


def quarantined(path: Path) -> list[str]:
    """A session whose writer found a torn tail on open, moved it to quarantine/ and recorded
    the cut (explained by a crash: it does not block), then ended."""
    make_journal(path, turns=2)
    last = sorted(path.glob("seg-*.jsonl"))[-1]
    with open(last, "ab") as f:
        f.write(b'{"xxh64":"0123456789abcdef","seq":99,"da')
    with walj.ToolJournal.open(path) as journal:
        assert not journal.recovery.blocked
        journal.end()
    return sorted(p.name for p in (path / "quarantine").iterdir())


def test_prune_archive_removes_a_quarantine_only_once_its_bytes_are_archived(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cut bytes in quarantine/ and their manifest are shipped and read back with the
    segments; only then does the directory go, and the archive holds the same bytes."""
    root = tmp_path / "root"
    aged(monkeypatch, 40)
    files = quarantined(root / "s")
    assert "MANIFEST.jsonl" in files and len(files) == 2
    cut = next(name for name in files if name != "MANIFEST.jsonl")
    cut_bytes = (root / "s" / "quarantine" / cut).read_bytes()
    manifest = (root / "s" / "quarantine" / "MANIFEST.jsonl").read_bytes()
    run = prune(root, "--older-than", "30d", "--archive", f"file://{tmp_path}/archive",
                "--json")
    assert run.code == 0, run.err
    assert by_name(run)["s"]["action"] == "removed"
    assert not (root / "s").exists()
    archived = {p.name: p.read_bytes() for p in (tmp_path / "archive").glob("*/quarantine/*")}
    assert archived[cut] == cut_bytes
    assert manifest in archived.values()


def test_prune_archive_keeps_a_session_whose_quarantine_is_not_archived(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cut file that no longer matches its manifest line is shipped but never counted as
    verified: the cut bytes are in no verified copy, so the directory stays, and the report
    says why."""
    root = tmp_path / "root"
    aged(monkeypatch, 40)
    files = quarantined(root / "s")
    cut = root / "s" / "quarantine" / next(name for name in files if name != "MANIFEST.jsonl")
    cut.write_bytes(cut.read_bytes()[:-1] + b"#")
    tree = without_lock(snapshot(root))
    run = prune(root, "--older-than", "30d", "--archive", f"file://{tmp_path}/archive",
                "--json")
    assert run.code == 1, run.err
    result = by_name(run)["s"]
    assert result["action"] == "kept_unaccounted"
    assert "quarantine/" in result["detail"] and "not verified in the archive" in \
        result["detail"]
    assert without_lock(snapshot(root)) == tree
    assert not list(root.glob(".walj-pruning-*"))


def test_prune_deleting_unarchived_says_it_deleted_quarantined_bytes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "root"
    aged(monkeypatch, 40)
    quarantined(root / "s")
    ended(root / "clean")
    run = prune(root, "--older-than", "30d", "--delete-unarchived", "--json")
    assert run.code == 0, run.err
    assert by_name(run)["s"]["action"] == "removed"
    assert by_name(run)["s"]["quarantine_unarchived"] == 2
    assert "2 quarantined file(s) deleted unarchived" in by_name(run)["s"]["detail"]
    assert by_name(run)["clean"]["quarantine_unarchived"] == 0
    assert list(root.iterdir()) == []


def test_a_tombstone_holding_another_session_is_kept(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """What an older prune left (it renamed a user's directory with a thread inside): the
    tombstone's own files go only if everything in it is bookkeeping; here it is kept."""
    root = tmp_path / "root"
    aged(monkeypatch, 40)
    ended(root / ".walj-pruning-user42-0001")
    ended(root / ".walj-pruning-user42-0001" / "thread7")
    tree = snapshot(root)
    dry = prune(root, "--older-than", "30d", "--delete-unarchived", "--dry-run", "--json")
    assert by_name(dry)[".walj-pruning-user42-0001"]["action"] == "kept_nested"
    run = prune(root, "--older-than", "30d", "--delete-unarchived", "--json")
    assert by_name(run)[".walj-pruning-user42-0001"]["action"] == "kept_nested"
    assert "thread7" in by_name(run)[".walj-pruning-user42-0001"]["detail"]
    assert without_lock(snapshot(root)) == without_lock(tree)


# --- idle sessions, and the age upkeep carries forward -----------------------------------------


def last_at(path: Path | str) -> float:
    return [data["at"] for _, data in records(path)][-1]


def test_include_idle_removes_an_idle_session_and_leaves_blocked_live_and_young(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "root"
    archive = tmp_path / "archive"
    aged(monkeypatch, 40)
    make_journal(root / "idle", turns=2)  # a framework session: never ended
    make_journal(root / "blocked", blocked=True)
    make_journal(root / "live", turns=2)
    aged(monkeypatch, 2)
    make_journal(root / "young", turns=2)
    idle_records, idle_at = records(root / "idle"), last_at(root / "idle")
    holder = hold(root / "live")
    try:
        kept = {name: without_lock(snapshot(root / name)) for name in ("blocked", "live",
                                                                        "young")}
        # Without the flag, nothing changes for it: it is compacted (nothing to drop here).
        plain = prune(root, "--older-than", "30d", "--archive", f"file://{archive}", "--json")
        assert by_name(plain)["idle"]["action"] == "kept_active"
        tree = snapshot(root)
        dry = prune(root, "--older-than", "30d", "--archive", f"file://{archive}",
                    "--include-idle", "--dry-run", "--json")
        assert by_name(dry)["idle"]["action"] == "would_remove_idle"
        assert snapshot(root) == tree
        run = prune(root, "--older-than", "30d", "--archive", f"file://{archive}",
                    "--include-idle", "--json")
        assert run.code == 1, run.err  # the blocked one
        assert run.json()["include_idle"] is True
        assert {n: s["action"] for n, s in by_name(run).items()} == {
            "idle": "removed_idle", "blocked": "kept_blocked", "live": "busy",
            "young": "kept_young"}
        assert "ended by prune" in by_name(run)["idle"]["detail"]
        for name, before in kept.items():
            assert without_lock(snapshot(root / name)) == before, name
        assert not (root / "idle").exists()
        # The archive holds every record, then the end prune wrote, dated at the last activity.
        (copy,) = [p for p in archive.iterdir()]
        history = records(f"file://{copy}")
        assert history[:len(idle_records)] == idle_records
        assert history[-1][1]["kind"] == "session_ended"
        assert history[-1][1]["at"] == idle_at
    finally:
        stop(holder)


def test_a_prune_that_compacts_an_idle_session_does_not_make_it_younger(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compacted at a 30-day cutoff, the session (40 days idle) is still 40 days old to the
    next prune at a 35-day cutoff: the checkpoint carried its last activity's time."""
    root = tmp_path / "root"
    aged(monkeypatch, 40)
    make_journal(root / "s", turns=6, segment_bytes=1024)
    activity = last_at(root / "s")
    first = prune(root, "--older-than", "30d", "--delete-unarchived", "--json")
    assert by_name(first)["s"]["action"] == "compacted", first.out
    assert records(root / "s")[0][1]["kind"] == "checkpoint"
    assert last_at(root / "s") == activity
    sweep = walj_cli("sweep", root, "--json").json()["sessions"][0]
    assert sweep["last_record_at"] == activity
    second = prune(root, "--older-than", "35d", "--delete-unarchived", "--include-idle",
                   "--json")
    assert by_name(second)["s"]["action"] == "removed_idle", second.out
    assert 39 * DAY < by_name(second)["s"]["age_seconds"] < 41 * DAY
    assert list(root.iterdir()) == []


def test_prune_shows_the_age_of_a_blocked_session(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    aged(monkeypatch, 40)
    make_journal(tmp_path / "root" / "b", blocked=True)
    run = prune(tmp_path / "root", "--older-than", "30d", "--json")
    assert 39 * DAY < by_name(run)["b"]["age_seconds"] < 41 * DAY
    text = prune(tmp_path / "root", "--older-than", "30d")
    (row,) = [line.split() for line in text.out.splitlines() if line.startswith("  b ")]
    assert row[1] == "kept_blocked" and row[2].startswith(("39d", "40d"))


@pytest.mark.skipif(STRACE is None, reason="strace is not installed")
def test_syscall_order_of_an_idle_removal(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """--include-idle: the end is written under the session's lock and synced before the
    session is renamed to a tombstone (which is synced before the first unlink)."""
    root = tmp_path / "root"
    aged(monkeypatch, 40)
    make_journal(root / "s", turns=1)
    trace = tmp_path / "trace"
    proc = subprocess.run(
        [str(STRACE), "-f", "-qq", "-s", "256", "-o", str(trace), "-e",
         "trace=openat,flock,write,pwrite64,fsync,fdatasync,rename,renameat,renameat2,unlink,"
         "unlinkat,rmdir", sys.executable, "-m", "walj", "prune", str(root), "--older-than",
         "30d", "--delete-unarchived", "--include-idle", "--jobs", "1"],
        env=ENV, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert not (root / "s").exists()
    lines = trace.read_text().splitlines()
    calls = strace_calls("\n".join(lines))
    assert len(calls) == len(lines)
    (end,) = [i for i, line in enumerate(lines) if "session_ended" in line]
    segment = calls[end][1]
    assert calls[end][0] in ("write", "pwrite64") and segment.startswith(str(root / "s"))
    locks = [i for i, call in enumerate(calls) if call == ("flock", str(root / "s" / "LOCK"))]
    rename = next(i for i, (op, target) in enumerate(calls)
                  if op.startswith("rename") and ".walj-pruning-s-" in target)
    assert locks and locks[0] < end  # the end was written by the lock's holder
    assert any(call in (("fsync", segment), ("fdatasync", segment))
               for call in calls[end + 1:rename]), calls[end:rename]
    first_unlink = next(i for i in range(rename, len(calls)) if calls[i][0] == "unlink")
    assert ("fsync", str(root)) in calls[rename + 1:first_unlink]


def test_an_idle_session_with_a_newer_record_under_its_lock_is_not_ended(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The re-check under the lock: a record newer than the cutoff (written since the check)
    or a blocker keeps the session as it is, with no end written."""
    aged(monkeypatch, 40)
    make_journal(tmp_path / "a", turns=1)
    make_journal(tmp_path / "b", turns=1, blocked=True)
    monkeypatch.undo()
    activity = last_at(tmp_path / "a")
    before = {name: records(tmp_path / name) for name in ("a", "b")}
    with pytest.raises(_retire.Kept, match="a record newer than"):
        _retire.end_idle(str(tmp_path / "a"), activity - 1.0)
    with pytest.raises(_retire.Kept, match="blocked"):
        _retire.end_idle(str(tmp_path / "b"), time.time())
    assert {name: records(tmp_path / name) for name in ("a", "b")} == before
    assert _retire.end_idle(str(tmp_path / "a"), activity) == len(before["a"]) + 1
    assert records(tmp_path / "a")[-1][1]["at"] == activity
