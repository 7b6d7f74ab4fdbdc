"""Ship stopped anywhere, by a real SIGKILL of a child process or a KeyboardInterrupt at a line
of walj/archive's code: whatever it leaves, a reader never misreads and the next ship finishes
the job (s3:// through moto and file:// alike)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from archive_helpers import Archive, datas, make_session

import walj.archive as archive_mod

ARCHIVE_CODE = os.path.dirname(archive_mod.__file__)
CHILD = Path(__file__).with_name("ship_child.py")


def _children_env() -> dict[str, str]:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    return env


def _run_child(session: Path, url: str, kill_at: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(CHILD), str(session), url, str(kill_at)],
                          capture_output=True, text=True, timeout=120, env=_children_env(),
                          check=False)


def _whole_or_absent(url: str, names: list[str]) -> None:
    """What a stopped ship leaves reads without a problem: each object is whole or absent."""
    try:
        report = archive_mod.verify(url)
    except archive_mod.ArchiveError:  # nothing shipped yet: no session there
        return
    assert report.ok, report.problems
    assert report.segments == names[: len(report.segments)]


def _finish(session: Path, archive: Archive, records: list[dict[str, Any]],
            names: list[str]) -> None:
    again = archive_mod.ship(session, archive.url)
    assert sorted(again.shipped + again.skipped) == names
    assert archive_mod.verify(again.url).ok
    assert datas(archive_mod.read(archive.url, local=session)) == records
    assert archive_mod.ship(session, archive.url).shipped == []


def _points(total: int, wanted: int) -> list[int]:
    step = max(1, total // wanted)
    return sorted({*range(1, total + 1, step), total})


def test_sigkill_mid_ship_then_reship(archive: Archive, tmp_path: Path) -> None:
    session = tmp_path / "s"
    records = make_session(session, 40)
    names = [p.name for p in sorted(session.glob("seg-*.jsonl"))][:-1]
    counted = _run_child(session, f"{archive.url}/count", 0)
    assert counted.returncode == 0, counted.stderr
    total = int(counted.stdout)
    log_id = _log_id(session)
    # Each child is a fresh interpreter that imports s3fs: a few points, spread over the ship.
    for kill_at in _points(total, 2 if archive.kind == "s3" else 6):
        url = f"{archive.url}/k{kill_at}"
        done = _run_child(session, url, kill_at)
        # A run to a new prefix may take a few lines fewer than the counting one did.
        assert done.returncode == -9 or (done.returncode == 0 and int(done.stdout) < kill_at), (
            kill_at, done.stderr)
        _whole_or_absent(f"{url}/{log_id}", names)
        _finish(session, Archive(url, archive.kind, archive.endpoint,
                                 archive.local_root / f"k{kill_at}" if archive.local_root
                                 else None), records, names)


def _log_id(session: Path) -> str:
    import walj

    log_id = walj.verify(session).log_id
    assert log_id is not None
    return log_id


def _interrupt_at(n: int, operation: Callable[[], object]) -> int:
    """Run `operation`, raising KeyboardInterrupt just before the n-th line event in walj/archive
    (never when n == 0); returns how many events there were."""
    count = 0
    fired = False

    def local(frame: Any, event: str, arg: Any) -> Any:
        nonlocal count, fired
        if fired:
            return None
        if event == "line":
            count += 1
            if count == n:
                fired = True
                raise KeyboardInterrupt
        return local

    def calls(frame: Any, event: str, arg: Any) -> Any:
        return local if frame.f_code.co_filename.startswith(ARCHIVE_CODE) else None

    sys.settrace(calls)
    try:
        operation()
    finally:
        sys.settrace(None)
    return count


def test_keyboard_interrupt_anywhere_in_ship(archive: Archive, tmp_path: Path) -> None:
    session = tmp_path / "s"
    records = make_session(session, 30)
    names = [p.name for p in sorted(session.glob("seg-*.jsonl"))][:-1]
    log_id = _log_id(session)
    archive_mod.ship(session, f"{archive.url}/first")  # makes the root: trials do not
    total = _interrupt_at(0, lambda: archive_mod.ship(session, f"{archive.url}/count"))
    points = _points(total, 8 if archive.kind == "s3" else 120)
    interrupted = 0
    for n in points:
        url = f"{archive.url}/i{n}"
        try:
            _interrupt_at(n, lambda url=url: archive_mod.ship(session, url))  # type: ignore[misc]
        except KeyboardInterrupt:
            interrupted += 1
        _whole_or_absent(f"{url}/{log_id}", names)
        sub = Archive(url, archive.kind, archive.endpoint,
                      archive.local_root / f"i{n}" if archive.local_root else None)
        _finish(session, sub, records, names)
        if sub.local_root is not None:
            # Only segments, and at most one temporary file of an interrupted cleanup, which no
            # reader lists: it is not named like a segment.
            left = [p.name for p in (sub.local_root / log_id).iterdir()]
            assert sorted(n for n in left if n.startswith("seg-")) == names
            assert len(left) - len(names) <= 1
    assert interrupted == len(points)
