"""Read commands never write: on a copied directory, on a read-only file system, and beside a
live writer in another process that appends and rotates while they read."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import ENV, REPO, Run, make_journal, snapshot, walj_cli
from helpers import segments

# (command, extra arguments, exit code on the blocked session)
READ_COMMANDS = [
    ("verify", [], 0),
    ("inspect", [], 1),
    ("dump", [], 0),
    ("tail", ["-n", "5"], 0),
    ("timeline", [], 1),
    ("stats", [], 0),
]


@pytest.fixture(scope="module")
def sessions(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A root with a clean session, a blocked one, and one with a torn tail (which a writer
    would cut on open, and a reader must leave alone)."""
    root = tmp_path_factory.mktemp("ro") / "sessions"
    make_journal(root / "clean")
    make_journal(root / "blocked", blocked=True)
    make_journal(root / "torn")
    with open(segments(root / "torn")[-1], "ab") as f:
        f.write(b'{"xxh64":"00000000000000')
    return root


def _run_all(root: Path, runner: Any) -> None:
    for command, extra, code in READ_COMMANDS:
        for json_flag in ([], ["--json"]):
            run = runner(command, root / "blocked", *extra, *json_flag)
            assert run.code == code, (command, run.err)
            assert "Traceback" not in run.err and run.out
        run = runner(command, root / "torn", *extra)
        assert run.code in (0, 1) and "Traceback" not in run.err, (command, run.err)
    sweep = runner("sweep", root, "--json", "--jobs", "2")
    assert sweep.code == 1, sweep.err
    statuses = {Path(s["path"]).name: s["status"] for s in sweep.json()["sessions"]}
    assert statuses == {"clean": "active", "blocked": "blocked", "torn": "active"}
    approvals = runner("approvals", root, "--json", "--jobs", "2")
    assert approvals.code == 0 and approvals.json()["logs"] == 3, approvals.err


def test_copied_directory(sessions: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copied"
    shutil.copytree(sessions, copy)
    before_original, before_copy = snapshot(sessions), snapshot(copy)
    _run_all(copy, walj_cli)
    verify = walj_cli("verify", copy / "torn", "--json").json()
    assert verify["ok"] is True and verify["torn_tail"]["kind"] == "incomplete_line"
    assert snapshot(copy) == before_copy
    assert snapshot(sessions) == before_original


SHELL = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"'


def _read_only_mount_works(directory: Path) -> bool:
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c", SHELL, "sh", str(directory), "sh",
                            "-c", 'touch "$0/probe"', str(directory)],
                           capture_output=True, timeout=30)
    return probe.returncode != 0 and b"Read-only file system" in probe.stderr


def test_read_only_file_system(sessions: Path, tmp_path: Path) -> None:
    """A read-only bind mount in a private mount namespace stops root too; where that is not
    possible, a non-root user gets chmod -w."""
    root = tmp_path / "readonly"
    shutil.copytree(sessions, root)
    before = snapshot(root)
    if _read_only_mount_works(root):
        def runner(*args: Any) -> Run:
            proc = subprocess.run(
                ["unshare", "-m", "sh", "-c", SHELL, "sh", str(root), sys.executable, "-m",
                 "walj", *map(str, args)],
                env=ENV, capture_output=True, text=True, timeout=60, cwd=REPO)
            return Run(proc.returncode, proc.stdout, proc.stderr)

        assert runner("verify", root / "clean").code == 0
    elif os.geteuid() != 0:  # pragma: no cover - a user without mount rights
        for path in sorted(root.rglob("*"), reverse=True) + [root]:
            path.chmod(path.stat().st_mode & ~0o222)
        runner = walj_cli
    else:  # pragma: no cover - a root without mount namespaces
        pytest.skip("running as root, where chmod -w does not stop writes, and no read-only "
                    "bind mount can be made here (unshare -m / mount refused)")
    try:
        _run_all(root, runner)
    finally:
        for path in [root, *root.rglob("*")]:
            path.chmod(path.stat().st_mode | 0o200)
    assert snapshot(root) == before


WRITER = textwrap.dedent("""
    import sys, walj
    def lookup(order_id):
        return {"order_id": order_id, "status": "delivered", "note": "x" * 120}
    journal = walj.ToolJournal.open(sys.argv[1], tools={"lookup": lookup}, sync="never",
                                    segment_bytes=4096)
    n = 0
    while True:
        with journal.turn() as turn:
            for i in range(3):
                turn.dispatch("lookup", {"order_id": f"A-{n}-{i}"})
        n += 1
        if n == 40:
            print("ready", flush=True)
        if n > 40 and sys.stdin.readable() and n % 5 == 0:
            import select
            if select.select([sys.stdin], [], [], 0)[0]:
                break
    journal.close()
    print("closed", flush=True)
""")


def test_dump_and_inspect_beside_a_live_writer(tmp_path: Path) -> None:
    log = tmp_path / "live"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(log)], env=ENV,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert writer.stdout is not None and writer.stdin is not None
    try:
        assert writer.stdout.readline().strip() == "ready"
        counts = []
        for _ in range(3):
            dump = walj_cli("dump", log, "--json")
            assert dump.code == 0, dump.err
            seqs = [r["seq"] for r in dump.lines()]
            assert seqs == list(range(1, len(seqs) + 1))  # contiguous, none torn or doubled
            counts.append(len(seqs))
            inspect = walj_cli("inspect", log, "--json")
            assert inspect.code in (0, 1), inspect.err  # a call in flight looks like a blocker
            report = inspect.json()
            assert report["log_ok"] is True and report["problems"] == []
            assert report["records"] >= counts[-1]
            assert report["writer"]["running"] is True
            # At most the writer's current call or turn, seen half-way: never anything else.
            assert all(b["state"] in ("started", "interrupted_turn")
                       for b in report["blockers"])
            assert len(report["blockers"]) <= 1
        writer.stdin.write("stop\n")
        writer.stdin.flush()
        assert writer.stdout.readline().strip() == "closed"
    finally:
        writer.kill()
        writer.wait()
    final = walj_cli("dump", log, "--json").lines()
    assert len(final) >= max(counts) >= 40 * 8
    assert len(segments(log)) > 1  # the reads went on across rotations
    done = walj_cli("inspect", log, "--json")
    assert done.code == 0 and done.json()["blocked"] is False
