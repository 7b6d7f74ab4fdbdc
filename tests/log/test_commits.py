"""Group commit with targeted wake-ups, and the process-wide commit service (walj.set_commit_mode:
"inline", "files", "syncfs"): every acknowledged record durable under contention and across a
SIGKILL, the order of system calls per round, faults on a shared round, a service thread that
dies, fork, and the configuration's typed errors."""

from __future__ import annotations

import errno
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from faultfs import FaultyFS, _Rule
from helpers import strace_calls, wait_until

import walj
from walj.log import _commits

REPO = str(Path(__file__).resolve().parents[2])
ENV = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
SERVICE_MODES = ("files", "syncfs")
STRACE = shutil.which("strace")


@pytest.fixture(autouse=True)
def _inline_after() -> Iterator[None]:
    previous = walj.set_commit_mode("inline")
    yield
    walj.set_commit_mode(previous)


def _hammer(logs: list[walj.Log], threads_per_log: int, per_thread: int
            ) -> dict[tuple[int, int], list[int]]:
    """Threads appending to every log at once; the seqs each one was acknowledged."""
    acked: dict[tuple[int, int], list[int]] = {}

    def worker(k: int, t: int) -> None:
        acked[k, t] = [logs[k].append({"k": k, "t": t, "n": n}) for n in range(per_thread)]

    threads = [threading.Thread(target=worker, args=(k, t))
               for k in range(len(logs)) for t in range(threads_per_log)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return acked


@pytest.mark.parametrize("mode", ("inline", *SERVICE_MODES))
def test_targeted_wakeups_many_threads_many_logs_every_acknowledged_record_durable(
        tmp_path: Path, mode: str) -> None:
    walj.set_commit_mode(mode)
    before = walj.commit_stats()
    logs = [walj.Log.open(tmp_path / f"log{k}", sync="batch", segment_bytes=8192)
            for k in range(4)]
    acked = _hammer(logs, threads_per_log=4, per_thread=150)
    for log in logs:
        assert log.durable_seq == log.last_seq == 4 * 150  # none left behind, none counted twice
        log.close()
    for (k, t), seqs in acked.items():
        assert seqs == sorted(seqs) and len(set(seqs)) == 150
        stored = {r.seq: r.data for r in walj.read(tmp_path / f"log{k}")}
        assert all(stored[s]["t"] == t for s in seqs)
    after = walj.commit_stats()
    if mode == "inline":
        assert after["syncs"] == before["syncs"]  # each log synced in its caller
    else:
        assert after["rounds"] > before["rounds"] and after["syncs"] > before["syncs"]
        # Group commit: the rounds settled far more appends than there were syncs.
        assert after["waiters"] - before["waiters"] > after["syncs"] - before["syncs"]


def test_group_commit_wakes_each_waiter_once_and_hands_the_lead_on(tmp_path: Path) -> None:
    """Waiters queued behind a sync: the covered ones return, the one written after the sync
    began leads the next round; no waiter is left queued and no sync runs without a leader."""
    fs = FaultyFS()
    log = walj.Log.open(tmp_path / "log", sync="batch", _fs=fs)
    commit = log._commit
    release = threading.Event()
    fs.during_sync = release.wait  # the first round's sync waits until the others queued
    results: list[int] = []
    first = threading.Thread(target=lambda: results.append(log.append({"n": 0})))
    first.start()
    assert wait_until(lambda: log._state.syncing)
    others = [threading.Thread(target=lambda n=n: results.append(log.append({"n": n})))
              for n in range(1, 6)]
    for thread in others:
        thread.start()
    assert wait_until(lambda: len(commit._waiting) == 5)
    syncs_before = sum(op == "sync" for op, _ in fs.calls)
    release.set()
    for thread in [first, *others]:
        thread.join(10)
    assert sorted(results) == [1, 2, 3, 4, 5, 6]
    assert log.durable_seq == 6 and not log._state.syncing and not commit._waiting
    # The five queued after the first sync began share one more sync: not one each.
    assert sum(op == "sync" for op, _ in fs.calls) == syncs_before + 1
    log.close()


SIGKILL_CHILD = textwrap.dedent("""
    import os, sys, threading, walj
    base, mode = sys.argv[1], sys.argv[2]
    walj.set_commit_mode(mode)
    logs = [walj.Log.open(os.path.join(base, f"log{k}"), sync="batch", segment_bytes=4096)
            for k in range(3)]
    lock = threading.Lock()
    def worker(k, t):
        n = 0
        while True:
            seq = logs[k].append({"t": t, "n": n}); n += 1
            with lock:
                os.write(1, f"{k} {seq} {t}\\n".encode())
    for k in range(3):
        for t in range(3):
            threading.Thread(target=worker, args=(k, t), daemon=True).start()
    threading.Event().wait()
""")


@pytest.mark.parametrize("mode", SERVICE_MODES)
def test_sigkill_mid_load_keeps_every_acknowledged_seq(tmp_path: Path, mode: str) -> None:
    child = subprocess.Popen([sys.executable, "-c", SIGKILL_CHILD, str(tmp_path), mode],
                             stdout=subprocess.PIPE, env=ENV)
    assert child.stdout is not None
    lines: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(lines) < 300 and time.monotonic() < deadline:
        lines.append(child.stdout.readline())
    os.kill(child.pid, signal.SIGKILL)
    rest = child.stdout.read()
    child.wait()
    whole = (b"".join(lines) + rest).split(b"\n")[:-1]  # the last line may be cut short
    acked = [tuple(map(int, line.split())) for line in whole]
    assert len(acked) >= 300
    for k in range(3):
        stored = {r.seq: r.data["t"] for r in walj.read(tmp_path / f"log{k}")}
        for log, seq, t in acked:
            if log == k:
                assert stored.get(seq) == t, (k, seq)


STRACE_CHILD = textwrap.dedent("""
    import os, sys, threading, walj
    base, mode = sys.argv[1], sys.argv[2]
    walj.set_commit_mode(mode)
    logs = [walj.Log.open(os.path.join(base, f"log{k}"), sync="batch") for k in range(2)]
    acks = [os.open(os.path.join(base, f"acks{k}"), os.O_WRONLY | os.O_CREAT, 0o600)
            for k in range(2)]
    def worker(k, t):
        for n in range(40):
            seq = logs[k].append({"t": t, "n": n})
            os.write(acks[k], b"ack %d;" % seq)
    threads = [threading.Thread(target=worker, args=(k, t)) for k in range(2) for t in range(3)]
    for th in threads: th.start()
    for th in threads: th.join()
    for log in logs: log.close()
""")


@pytest.mark.skipif(STRACE is None, reason="strace is not installed")
@pytest.mark.parametrize("mode", SERVICE_MODES)
def test_strace_each_round_syncs_after_its_writes_and_before_the_acknowledgement(
        tmp_path: Path, mode: str) -> None:
    """For every acknowledged seq: the write of its record comes first, then a sync that
    covers it (fdatasync of its segment, or a syncfs), then the acknowledgement."""
    out = tmp_path / "trace"
    subprocess.run([STRACE, "-f", "-qq", "-s", "120", "-o", str(out), "-e",
                    "trace=openat,write,pwrite64,fdatasync,syncfs", sys.executable, "-c",
                    STRACE_CHILD, str(tmp_path), mode], check=True, env=ENV)
    text = out.read_text()
    raw = [line.split(None, 1)[1] if line[:1].isdigit() else line for line in text.splitlines()]
    calls = strace_calls(text)
    checked = 0
    for k in range(2):
        segment_dir = str(tmp_path / f"log{k}")
        written: dict[int, int] = {}  # seq -> index of the write of its record
        synced_upto = -1  # index of the last write a sync of this log covered so far
        last_write = -1
        for i, ((op, target), line) in enumerate(zip(calls, raw, strict=True)):
            if op == "write" and target.startswith(segment_dir + "/seg-"):
                last_write = i
                for seq in re.findall(r'\\"seq\\":(\d+)', line):
                    written[int(seq)] = i
            elif (op == "fdatasync" and target.startswith(segment_dir + "/seg-")) or (
                    op == "syncfs" and mode == "syncfs"):
                synced_upto = last_write
            elif op == "write" and target == str(tmp_path / f"acks{k}"):
                seq = int(re.search(r"ack (\d+);", line).group(1))  # type: ignore[union-attr]
                assert seq in written and written[seq] <= synced_upto, (k, seq)
                checked += 1
    assert checked == 2 * 3 * 40
    if mode == "syncfs":
        assert any(op == "syncfs" for op, _ in calls)


def _block_first(fs: FaultyFS, op: str, until: Any) -> None:
    """The first call of `op` waits until `until()` holds (others queue behind it)."""
    def action() -> None:
        assert wait_until(until, 10)
    fs.rules.append(_Rule(op, 1, action))


@pytest.mark.parametrize("err", (errno.EIO, errno.ENOSPC))
def test_files_mode_failed_round_poisons_every_waiter_once_and_loses_nothing_acknowledged(
        tmp_path: Path, err: int) -> None:
    walj.set_commit_mode("files")
    fs = FaultyFS()
    log = walj.Log.open(tmp_path / "log", sync="batch", _fs=fs)
    opening = sum(op == "sync" for op, _ in fs.calls)  # the new segment's header
    _block_first(fs, "sync", lambda: len(log._commit._waiting) == 4)
    fs.fail("sync", 2, err)
    outcomes: dict[int, Any] = {}

    def append(n: int) -> None:
        try:
            outcomes[n] = log.append({"n": n})
        except walj.WaljError as exc:
            outcomes[n] = exc

    threads = [threading.Thread(target=append, args=(n,)) for n in range(5)]
    threads[0].start()
    assert wait_until(lambda: log._state.syncing)
    for thread in threads[1:]:
        thread.start()
    for thread in threads:
        thread.join(20)
    acked = {n: s for n, s in outcomes.items() if isinstance(s, int)}
    failed = [e for e in outcomes.values() if not isinstance(e, int)]
    assert len(acked) == 1 and len(failed) == 4  # the first round's one; the next round's four
    expected = walj.DiskFullError if err == errno.ENOSPC else walj.PoisonedError
    assert all(type(e) is expected for e in failed)
    assert len({id(e) for e in failed}) == 4  # each waiter raises an error of its own
    assert sum(op == "sync" for op, _ in fs.calls) == opening + 2  # the failed one not retried
    with pytest.raises(walj.PoisonedError):
        log.append({"n": 99})
    assert sum(op == "sync" for op, _ in fs.calls) == opening + 2
    with pytest.raises(walj.PoisonedError):
        log.close()
    fs.crash()
    stored = {r.seq: r.data["n"] for r in walj.read(tmp_path / "log")}
    assert all(stored.get(seq) == n for n, seq in acked.items())


@pytest.mark.parametrize("err", (errno.EIO, errno.ENOSPC))
def test_syncfs_failed_round_poisons_every_log_that_waited_on_it(tmp_path: Path,
                                                                  err: int) -> None:
    walj.set_commit_mode("syncfs")
    fs = FaultyFS()
    logs = [walj.Log.open(tmp_path / f"log{k}", sync="batch", _fs=fs) for k in range(4)]
    enrolled = [log.append({"n": -1}) for log in logs]  # each log's first sync is its own
    service = _commits._config.syncfs
    assert service is not None
    _block_first(fs, "syncfs", lambda: service._queue.qsize() == 3)
    fs.fail("syncfs", 2, err)
    outcomes: dict[int, Any] = {}

    def append(k: int) -> None:
        try:
            outcomes[k] = logs[k].append({"n": k})
        except walj.WaljError as exc:
            outcomes[k] = exc

    threads = [threading.Thread(target=append, args=(k,)) for k in range(4)]
    threads[0].start()
    assert wait_until(lambda: any(op == "syncfs" for op, _ in fs.calls))
    for thread in threads[1:]:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert outcomes[0] == 2
    expected = walj.DiskFullError if err == errno.ENOSPC else walj.PoisonedError
    assert all(type(outcomes[k]) is expected for k in (1, 2, 3)), outcomes
    assert [op for op, _ in fs.calls].count("syncfs") == 2  # one per round, none retried
    assert all(logs[k].poisoned for k in (1, 2, 3)) and not logs[0].poisoned
    # The error syncfs reported covers the file system: a later round there fails with it.
    with pytest.raises(expected):
        logs[0].append({"n": 10})
    assert [op for op, _ in fs.calls].count("syncfs") == 2
    for log in logs:
        with pytest.raises(walj.PoisonedError):
            log.close()
    fs.crash()
    for k in range(4):
        stored = {r.seq: r.data["n"] for r in walj.read(tmp_path / f"log{k}")}
        assert stored.get(enrolled[k]) == -1
    assert {r.seq: r.data["n"] for r in walj.read(tmp_path / "log0")}.get(2) == 0


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_service_thread_poisons_its_waiter_instead_of_hanging(tmp_path: Path) -> None:
    walj.set_commit_mode("files", threads=1)
    fs = FaultyFS()

    def die() -> None:
        raise SystemExit("the service thread stops")

    log = walj.Log.open(tmp_path / "log", sync="batch", _fs=fs)
    fs.rules.append(_Rule("sync", 1, die))  # the next sync, which the service's thread makes
    started = time.monotonic()
    with pytest.raises(walj.PoisonedError, match="commit service's thread stopped"):
        log.append({"n": 1})
    assert time.monotonic() - started < 10
    assert log.poisoned
    with pytest.raises(walj.PoisonedError):
        log.close()
    # A new thread serves the next log.
    with walj.Log.open(tmp_path / "next", sync="batch") as other:
        assert other.append({"n": 1}) == 1 and other.durable_seq == 1


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_sync_still_queued_when_the_service_thread_dies_gets_a_new_thread(
        tmp_path: Path) -> None:
    walj.set_commit_mode("files", threads=1)
    fs = FaultyFS()
    first = walj.Log.open(tmp_path / "first", sync="batch", _fs=fs)
    second = walj.Log.open(tmp_path / "second", sync="batch")
    service = _commits._config.files
    assert service is not None

    def die_once_the_other_is_queued() -> None:
        assert wait_until(lambda: service._queue.qsize() == 1, 10)
        raise SystemExit("the service thread stops")

    fs.rules.append(_Rule("sync", 1, die_once_the_other_is_queued))
    failures: list[BaseException] = []

    def doomed() -> None:
        try:
            first.append({"n": 1})
        except walj.WaljError as exc:
            failures.append(exc)

    thread = threading.Thread(target=doomed)
    thread.start()
    assert wait_until(lambda: any(op == "sync" for op, _ in fs.calls[-1:]))
    assert second.append({"n": 1}) == 1 and second.durable_seq == 1  # served by a new thread
    thread.join(10)
    assert len(failures) == 1 and isinstance(failures[0], walj.PoisonedError) and first.poisoned
    second.close()
    with pytest.raises(walj.PoisonedError):
        first.close()


def test_sync_always_through_the_service_is_durable_on_return(tmp_path: Path) -> None:
    for mode in SERVICE_MODES:
        with walj.Log.open(tmp_path / mode, sync="always", commit=mode) as log:
            for n in range(20):
                assert log.append({"n": n}) == n + 1 and log.durable_seq == n + 1
        assert len(list(walj.read(tmp_path / mode))) == 20


def test_forked_child_starts_its_own_service(tmp_path: Path) -> None:
    walj.set_commit_mode("files")
    with walj.Log.open(tmp_path / "parent", sync="batch") as log:
        log.append({"n": 1})  # the parent's service thread is running
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            with walj.Log.open(tmp_path / "child", sync="batch") as log:
                ok = log.append({"n": 1}) == 1 and log.durable_seq == 1
            code = 0 if ok and walj.commit_stats()["threads"] >= 1 else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_commit_modes_are_checked_with_typed_errors(tmp_path: Path) -> None:
    assert walj.set_commit_mode("files", threads=2) == "inline"
    assert walj.set_commit_mode("inline") == "files"
    for bad in ("fast", "", None, 3):
        with pytest.raises(walj.CommitModeError):
            walj.set_commit_mode(bad)  # type: ignore[arg-type]
    for threads in (0, -1, 2.0, True, 5000):
        with pytest.raises(walj.CommitModeError):
            walj.set_commit_mode("files", threads=threads)  # type: ignore[arg-type]
    with pytest.raises(walj.CommitModeError):
        walj.set_commit_mode("syncfs", threads=2)
    assert issubclass(walj.CommitModeError, ValueError)
    with pytest.raises(walj.CommitModeError):
        walj.Log.open(tmp_path / "log", commit="fast")
    assert not (tmp_path / "log").exists()
    stats = walj.commit_stats()
    assert {"rounds", "syncs", "threads", "waiters"} <= set(stats)
    assert all(type(v) is int and v >= 0 for v in stats.values())


@pytest.mark.parametrize("mode", SERVICE_MODES)
def test_async_sessions_through_the_service_complete_in_batches_not_a_hop_per_record(
        tmp_path: Path, mode: str) -> None:
    """Journal steps run in the shared sync pool; the service wakes those threads, never the
    loop, so the loop is still woken once per batch of finished steps."""
    import asyncio

    sessions, calls = 24, 3

    async def noop(k: int, n: int) -> int:
        return k

    journals = [walj.ToolJournal.open(tmp_path / f"s{k}", tools={"noop": noop}, sync="always",
                                      commit=mode) for k in range(sessions)]
    hops = [0]

    async def session(k: int) -> list[str]:
        async with journals[k].turn() as turn:
            return [(await turn.adispatch("noop", {"k": k, "n": n})).outcome
                    for n in range(calls)]

    async def main() -> list[list[str]]:
        loop = asyncio.get_running_loop()
        original = loop.call_soon_threadsafe

        def counted(*args: Any, **kwargs: Any) -> Any:
            hops[0] += 1
            return original(*args, **kwargs)

        loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
        return await asyncio.gather(*(session(k) for k in range(sessions)))

    before = walj.commit_stats()["requests"]
    try:
        outcomes = asyncio.run(main())
    finally:
        for journal in journals:
            journal.close()
    assert outcomes == [["ok"] * calls] * sessions
    requests = walj.commit_stats()["requests"] - before
    assert requests >= sessions * calls * 2  # an intent and a terminal record, each synced
    assert hops[0] < requests  # fewer wake-ups of the loop than syncs: batched
    for k in range(sessions):  # each call's intent and terminal record, durable on disk
        assert len(list(walj.read(tmp_path / f"s{k}"))) >= 2 * calls
