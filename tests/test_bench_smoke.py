"""Smoke test of the benchmark harness: a tiny quick run must finish and measure every table row."""

from __future__ import annotations

import errno
import fcntl
import importlib.util
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from helpers import load_script

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "benchmarks" / "run.py"
BUILD_ZIPAPP = ROOT / "tools" / "build_zipapp.py"
REPS = 2

THREADS = [1, 2, 4, 8, 16]
SIZES = [1, 2, 3]

LOG_ROWS = (
    [
        "durable.raw",
        "durable.prealloc",
        "limit.prealloc",
        "durable.sqlite_full",
        "durable.jsonl_fsync",
        "unsynced.rate",
        "unsynced.many",
        "unsynced.sqlite_normal",
        "unsynced.jsonl",
    ]
    + [f"latency.{m}.{q}" for m in ("always", "batch", "interval", "never") for q in ("p50", "p99")]
    + [f"group.{n}" for n in THREADS]
    + ["group.scaling"]
    + [f"{fig}.log.{k}" for k in SIZES for fig in ("open", "scan", "rss")]
)
JOURNAL_ROWS = ["dispatch.noop", "dispatch.prealloc", "dispatch.python", "dispatch.syscalls",
                "open.checkpoint"] + [
    f"{fig}.journal.{k}" for k in SIZES for fig in ("open", "logopen", "rss")
]
ZIPAPP_ROWS = [f"zipapp.{k}" for k in SIZES]
SESSION_COUNTS = [1, 8, 64]  # the quick run's
COMMIT_MODES = ("inline", "files", "syncfs")
MODE_ROWS = [f"sessions.{m}.{mode}_mode.{n}" for n in SESSION_COUNTS for m in ("async", "threads")
             for mode in COMMIT_MODES]
SESSION_ROWS = [
    row for n in SESSION_COUNTS for row in
    [f"sessions.{m}.{ref}.{n}" for m in ("async", "threads")
     for ref in ("raw", "raw_prealloc", "raw_syncfs", "sqlite_each", "sqlite_shared")]
    + [f"sessions.cpu.{m}.{n}" for m in ("async", "threads")]
    + [f"sessions.limit.{limit}.{n}" for limit in ("prealloc", "syncfs")]
] + ["sessions.request"]
SWEEP_ROWS = ["sweep.local", "sweep.rss", "sweep.archived", "sweep.archived_rss"]
EXPECTED = LOG_ROWS + JOURNAL_ROWS + ZIPAPP_ROWS + SESSION_ROWS + SWEEP_ROWS
PLOTS = ["group_commit.png", "sessions.png", "open_time.png", "latency.png"]


def _shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This test run's directory for the harness run: under pytest-xdist, one for every
    worker of the run (their base directories share a parent); else a fresh one."""
    uid = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if uid is None:
        return tmp_path_factory.mktemp("bench")
    path = tmp_path_factory.getbasetemp().parent / f"bench-smoke-{uid}"
    path.mkdir(exist_ok=True)
    return path


def _run_harness(tmp: Path) -> None:
    pyz = tmp / "walj-forensic.pyz"
    build = subprocess.run(
        [sys.executable, str(BUILD_ZIPAPP), "--output", str(pyz)],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert build.returncode == 0 and pyz.is_file(), build.stderr
    cmd = [
        sys.executable, str(RUN), "--quick", "--scale", "0.04", "--reps", str(REPS),
        "--out", str(tmp / "out"), "--dir", str(tmp / "work"), "--zipapp", str(pyz),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def _load_renderer() -> ModuleType:
    module: ModuleType = load_script(ROOT / "benchmarks" / "readme_table.py")
    return module


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A tiny quick run with a freshly built zipapp, so that every row must be measured.

    Parallel test workers share one run: each worker would otherwise start its own, and two
    harness runs on two busy cores each took the other's time (170-180 s, at the timeout,
    where one alone took under 100 s)."""
    tmp = _shared_dir(tmp_path_factory)
    with (tmp.parent / f"{tmp.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (tmp / "out" / "latest.json").is_file():
            _run_harness(tmp)
    out = tmp / "out"
    doc = json.loads((out / "latest.json").read_text(encoding="utf-8"))
    return out, doc


def test_every_row_is_written_once(quick_run: tuple[Path, dict[str, Any]]) -> None:
    out, doc = quick_run
    md = (out / "latest.md").read_text(encoding="utf-8")
    assert md.startswith("# walj benchmark results")
    assert "Machine: " in md
    table_ids = re.findall(r"^\| `([a-z0-9_.]+)` \|", md, flags=re.MULTILINE)
    for row_id in EXPECTED:
        assert table_ids.count(row_id) == 1, f"row {row_id} missing from latest.md"
    ids = [r["id"] for r in doc["rows"]]
    modes = [i for i in ids if i in MODE_ROWS]
    # Without a commit service every mode is a row that says so; with one, the default mode
    # is measured by the rows above and the other two get rows of their own.
    assert len(modes) in (len(MODE_ROWS), len(MODE_ROWS) * 2 // 3), modes
    assert sorted(ids) == sorted(EXPECTED + modes), "latest.json rows differ from the expected set"
    assert doc["threads"] == THREADS and len(doc["open_sizes"]) == len(SIZES)


def test_every_row_is_measured_against_its_baseline(
    quick_run: tuple[Path, dict[str, Any]],
) -> None:
    _out, doc = quick_run
    rows = {r["id"]: r for r in doc["rows"]}
    # No row may be skipped (the journal exists and the zipapp was built above) but for the
    # two whose tool may be absent here, which then must say why.
    measured = list(EXPECTED)
    if shutil.which("strace") is None:
        assert rows["dispatch.syscalls"]["status"] == "skipped: strace is not installed"
        measured.remove("dispatch.syscalls")
    mode_rows = [i for i in rows if i in MODE_ROWS]
    if not _has_commit_service():
        for row_id in mode_rows:
            assert rows[row_id]["status"] == (
                "skipped: walj has no process-wide commit service (walj.set_commit_mode) yet")
    else:
        measured += mode_rows
    for row_id in measured:
        row = rows[row_id]
        assert row["status"] is None and row["baseline_status"] is None, (row_id, row)
        assert row["walj"] is not None and row["walj"] > 0, row_id
        assert row["baseline"] is not None and row["baseline"] > 0, row_id
        assert row["ratio"] is not None and row["ratio"] > 0, row_id
        assert row["measures"] and row["baseline_is"], f"{row_id} does not say what it measured"
        if row_id.startswith("sessions.cpu."):
            # CPU time is sampled at the kernel's tick: in this tiny run's windows of a few
            # milliseconds the raw loop may show none in a round, which then has no ratio.
            assert 1 <= len(row["ratio_rounds"]) <= REPS, row_id
        else:
            assert len(row["ratio_rounds"]) == REPS, row_id
        for target in row["targets"]:
            assert target["met"] in (True, False), (row_id, target)
    # The baselines encode with walj's own encoder.
    assert doc["codec"].startswith("msgspec")


def test_fsyncs_are_counted(quick_run: tuple[Path, dict[str, Any]]) -> None:
    _out, doc = quick_run
    rows = {r["id"]: r for r in doc["rows"]}
    # sync="always": durable on return, so at least one fsync per record.
    assert rows["durable.raw"]["extra"]["fsyncs_per_record"] >= 1.0
    # One thread: every batch holds one record; more threads share fsyncs (or not), counted.
    assert rows["group.1"]["extra"]["records_per_fsync"] == pytest.approx(1.0, abs=0.01)
    for n in THREADS:
        extra = rows[f"group.{n}"]["extra"]
        assert 1.0 <= extra["records_per_fsync"] <= n + 0.01, (n, extra)
        assert extra["fsyncs_per_s"] > 0, n
    noop = rows["dispatch.noop"]["extra"]
    assert noop["fsyncs_per_call"] >= 1.0 and noop["writes_per_call"] >= 1.0, noop
    left_out = rows["dispatch.python"]["extra"]
    assert left_out["fsyncs_left_out_per_call"] == pytest.approx(noop["fsyncs_per_call"])


def test_system_calls_per_dispatch_are_counted_not_estimated(
    quick_run: tuple[Path, dict[str, Any]],
) -> None:
    """strace -f -c of N calls less none: the raw loop's two write + fdatasync pairs come out
    as exactly four calls, and a durable dispatch makes at least one durable sync a call."""
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed")
    _out, doc = quick_run
    row = {r["id"]: r for r in doc["rows"]}["dispatch.syscalls"]
    assert row["baseline"] == pytest.approx(4.0, abs=0.05), row
    extra = row["extra"]
    syncs = extra["fdatasync_per_call"] + extra["fsync_per_call"] + extra["syncfs_per_call"]
    assert syncs >= 1.0, extra
    assert row["walj"] >= syncs + extra["write_per_call"] + extra["pwrite_per_call"], row


def _has_commit_service() -> bool:
    import walj

    return getattr(walj, "set_commit_mode", None) is not None


def test_the_readme_block_renders_from_a_quick_run(
    quick_run: tuple[Path, dict[str, Any]],
) -> None:
    _out, doc = quick_run
    block = _load_renderer().render(doc)
    assert "not measured in this run" not in block
    assert "short, scaled-down run" in block  # a quick run says it is one
    assert doc["machine"] in block
    # The physical-limit rows the run measured are published beside the naive ones.
    rows = {r["id"]: r for r in doc["rows"]}
    physical = block[block.index("Against the physical limit"):]
    for row_id in ("limit.prealloc", "durable.prealloc", "dispatch.prealloc"):
        assert _load_renderer().what(rows[row_id]) in physical, row_id


def test_plots_or_a_note(quick_run: tuple[Path, dict[str, Any]]) -> None:
    out, doc = quick_run
    md = (out / "latest.md").read_text(encoding="utf-8")
    if importlib.util.find_spec("matplotlib") is not None:
        assert doc["plots"] == PLOTS
        for name in PLOTS:
            assert (out / name).stat().st_size > 0, f"{name} not written"
    else:
        assert doc["plots"] == [] and "tables only" in md


def test_the_profiler_reports_every_workload_it_ran(tmp_path: Path) -> None:
    """benchmarks/profile_cpu.py: each workload runs in its own child and is folded into the
    report, with its rate and CPU per op (py-spy when installed, else cProfile)."""
    out = tmp_path / "profile.md"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "profile_cpu.py"), "--only",
         "append-never,dispatch,read", "--seconds", "0.3", "--records", "2000",
         "--dir", str(tmp_path), "--out", str(out)],
        capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = out.read_text(encoding="utf-8")
    sections = re.findall(r"^## ([a-z-]+):", report, flags=re.MULTILINE)
    assert sections == ["append-never", "dispatch", "read"]
    rates = [float(r.replace(",", "")) for r in re.findall(r"^([\d,.]+) ops/s", report,
                                                             flags=re.MULTILINE)]
    assert len(rates) == 3 and all(rate > 0 for rate in rates), report
    # The append workload spends its time in walj's writer, and the report says so.
    append = report.split("## dispatch")[0]
    assert "walj/log/" in append, append
    bad = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "profile_cpu.py"),
                          "--only", "nonesuch"], capture_output=True, text=True, timeout=60,
                         check=False)
    assert bad.returncode == 2 and "unknown workload" in bad.stderr


def test_two_commits_compare_side_by_side(tmp_path: Path) -> None:
    """benchmarks/compare_commits.py on HEAD against itself: both sides build, open and
    dispatch; the same code writes the same bytes per record."""
    if subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                      check=False).returncode != 0:
        pytest.skip("not a git checkout")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "compare_commits.py"), "HEAD", "HEAD",
         "--records", "500", "--rounds", "1", "--seconds", "0.2"],
        capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    size = re.search(r"bytes per journal record on disk: old (\d+), new (\d+) \(1\.00x\)",
                     proc.stdout)
    assert size and size.group(1) == size.group(2), proc.stdout
    assert re.search(r"journal open: old [\d,]+ rec/s, new [\d,]+ rec/s", proc.stdout)
    assert re.search(r"durable dispatch: old [\d,]+ calls/s, new [\d,]+ calls/s", proc.stdout)
    listed = subprocess.run(["git", "-C", str(ROOT), "worktree", "list"], capture_output=True,
                            text=True, check=True).stdout
    assert "walj-compare-" not in listed, "a temporary worktree was left behind"


def _load_limits() -> ModuleType:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_limits
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return bench_limits


def test_a_syncfs_round_releases_only_the_writes_it_began_after(tmp_path: Path) -> None:
    """The syncfs-rounds baseline: every waiter returns only after a syncfs that began after
    its write was done and ended before it returned, so the baseline is a durable limit."""
    limits = _load_limits()
    syncfs = limits.syncfs_call()
    if syncfs is None:
        pytest.skip("syncfs is Linux-only")
    seq = itertools.count()
    syncs: list[tuple[int, int]] = []

    def recorded(fd: int) -> None:
        began = next(seq)
        syncfs(fd)
        syncs.append((began, next(seq)))

    fds = limits.prepared_files(tmp_path, "round", 4, limits.PREALLOC_MIN)
    rounds = limits.SyncfsRounds(recorded, fds[0])
    waits: list[tuple[int, int]] = []

    def writer(fd: int) -> None:
        gate = threading.Lock()
        gate.acquire()
        for k in range(5):
            os.pwrite(fd, b"x" * 200, 200 * k)
            written = next(seq)
            rounds.wait_durable(gate)
            waits.append((written, next(seq)))

    threads = [threading.Thread(target=writer, args=(fd,)) for fd in fds]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rounds.close()
    for fd in fds:
        os.close(fd)
    assert len(waits) == 4 * 5
    for written, returned in waits:
        assert any(written < began and ended < returned for began, ended in syncs), written
    assert len(syncs) <= len(waits)


def test_a_failed_syncfs_round_fails_every_waiter_and_is_not_retried(tmp_path: Path) -> None:
    limits = _load_limits()
    calls: list[int] = []

    def failing(fd: int) -> None:
        calls.append(fd)
        raise OSError(errno.EIO, "injected")

    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT, 0o600)
    rounds = limits.SyncfsRounds(failing, fd)
    failures: list[BaseException] = []

    def waiter() -> None:
        gate = threading.Lock()
        gate.acquire()
        try:
            rounds.wait_durable(gate)
        except OSError as exc:
            failures.append(exc)

    threads = [threading.Thread(target=waiter) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    waiter()  # after the failure: refused at once, no new round
    rounds.close()
    os.close(fd)
    assert len(failures) == 5 and calls == [fd]
