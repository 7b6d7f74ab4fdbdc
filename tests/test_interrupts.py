"""Regression tests for the interrupt, cancellation and configuration cases of the reliability
review: each test is named after its item. Interrupts are injected at the I/O seam (a file
system whose call raises KeyboardInterrupt right before or after the real system call, as a
signal landing there would), or are real (fork, SIGKILL, task.cancel)."""

from __future__ import annotations

import _weakrefset
import asyncio
import gc
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from journal_helpers import Recorder, kinds, records

import walj
from walj.journal import records as rc
from walj.journal.state import rebuild
from walj.log import _syncers
from walj.log.fs import FileSystem


class InterruptingFS(FileSystem):
    """Raises KeyboardInterrupt at the n-th call of `op`, before or after the real call."""

    def __init__(self) -> None:
        self.armed: tuple[str, int, bool] | None = None
        self.counts: dict[str, int] = {}
        self.fired = 0

    def arm(self, op: str, nth: int = 1, *, after: bool = True) -> None:
        self.armed, self.counts = (op, nth, after), {}

    def _maybe(self, op: str, after: bool) -> None:
        if self.armed is None or self.armed[0] != op or self.armed[2] != after:
            return
        if not after:
            self.counts[op] = self.counts.get(op, 0) + 1
        if self.counts.get(op, 0) == self.armed[1]:
            self.armed = None
            self.fired += 1
            raise KeyboardInterrupt(f"interrupt {'after' if after else 'before'} {op}")

    def _call(self, op: str, real: Callable[[], Any]) -> Any:
        self._maybe(op, False)
        if self.armed is not None and self.armed[2]:
            self.counts[op] = self.counts.get(op, 0) + 1
        result = real()
        self._maybe(op, True)
        return result

    def write(self, fd: int, data: bytes) -> int:
        return int(self._call("write", lambda: super(InterruptingFS, self).write(fd, data)))

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        """A write at an offset counts as a "write"."""
        return int(self._call("write",
                              lambda: super(InterruptingFS, self).pwrite(fd, data, offset)))

    def sync(self, fd: int) -> None:
        self._call("sync", lambda: super(InterruptingFS, self).sync(fd))


def replay_blockers(path: Path, live_turn: int | None = None) -> set[str | int | None]:
    """The blockers a reopen would find; a turn still live here is in flight, not one."""
    state = rebuild((r.seq, r.data) for r in walj.read(path))
    return {b.execution_id or b.turn_sequence
            for b in state.snapshot(live_turn=live_turn).blockers}


def live_blockers(journal: walj.ToolJournal) -> set[str | int | None]:
    return {b.execution_id or b.turn_sequence for b in journal.recovery.blockers}


def seqs(path: Path) -> list[int]:
    return [r.seq for r in walj.read(path)]


# --- data loss and double execution ---------------------------------------------------------


def test_item1_a_larger_max_record_bytes_on_reopen_keeps_acknowledged_records(
        logdir: Path) -> None:
    with walj.Log.open(logdir) as log:
        log.append({"small": 1})
    big = {"blob": "x" * (3 * 2**20)}
    with walj.Log.open(logdir, max_record_bytes=4 * 2**20) as log:
        seq = log.append(big)
        log.append({"after": 1})
    with walj.Log.open(logdir, max_record_bytes=4 * 2**20) as log:
        assert log.torn_tail is None and log.last_seq == 3
    assert [r.data for r in walj.read(logdir)] == [{"small": 1}, big, {"after": 1}]
    assert seq == 2 and seqs(logdir) == [1, 2, 3]
    assert walj.verify(logdir).ok and not (logdir / "quarantine").exists()


JOURNAL_CHILD = textwrap.dedent("""
    import sys, time, walj
    def send(blob):
        print("IN HANDLER", flush=True)
        time.sleep(120)
    journal = walj.ToolJournal.open(sys.argv[1], tools={"send": send},
                                    max_record_bytes=4 * 2**20, store_arguments=True)
    with journal.turn() as turn:
        turn.dispatch("send", {"blob": "y" * (3 * 2**20)}, call_id="c1")
""")


def test_item1_a_large_intent_written_under_a_larger_limit_blocks_after_sigkill(
        tmp_path: Path) -> None:
    path = tmp_path / "j"
    walj.ToolJournal.open(path).close()  # created with the default limit
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    child = subprocess.Popen([sys.executable, "-c", JOURNAL_CHILD, str(path)],
                             stdout=subprocess.PIPE, env=env)
    assert child.stdout is not None
    assert child.stdout.readline() == b"IN HANDLER\n"
    child.send_signal(signal.SIGKILL)
    child.wait()
    ran = Recorder()
    with walj.ToolJournal.open(path, tools={"send": ran}, max_record_bytes=4 * 2**20) as journal:
        assert journal.recovery.blocked
        [blocker] = journal.recovery.blockers
        assert (blocker.tool, blocker.call_id, blocker.state) == ("send", "c1", "started")
        with journal.turn() as turn:
            assert turn.dispatch("send", {"blob": "z"}, call_id="c2").outcome == "blocked"
    assert ran.calls == []


class Unfingerprintable:
    """No JSON form, so the journal previews its repr: where this Ctrl-C lands."""

    def __repr__(self) -> str:
        raise KeyboardInterrupt("Ctrl-C while the output is described")


def test_item2_an_interrupt_after_the_handler_returned_blocks_in_this_process(
        tmp_path: Path) -> None:
    path = tmp_path / "j"
    ran = Recorder()
    with walj.ToolJournal.open(path, tools={"send": Unfingerprintable,
                                            "other": ran}) as journal:
        with pytest.raises(KeyboardInterrupt), journal.turn() as turn:
            turn.dispatch("send", {}, call_id="c1")
        [blocker] = journal.recovery.blockers
        assert blocker.state == "ambiguous" and blocker.error_type == "KeyboardInterrupt"
        assert live_blockers(journal) == replay_blockers(path)
        with journal.turn() as turn:
            assert turn.dispatch("other", {}).outcome == "blocked"
        assert ran.calls == []
        journal.resolve(blocker.execution_id or "", "succeeded", actor="ann")
        with journal.turn() as turn:
            assert turn.dispatch("other", {}).outcome == "ok"
    assert ran.calls == [{}]


def test_item3_a_cancelled_adispatch_blocks_an_immediate_retry(tmp_path: Path) -> None:
    path = tmp_path / "j"
    ran: list[str] = []

    async def main() -> None:
        entered = asyncio.Event()

        async def slow(n: int) -> str:
            ran.append(f"slow {n}")
            entered.set()
            await asyncio.sleep(60)
            return "done"

        with walj.ToolJournal.open(path, tools={"slow": slow}) as journal:
            async with journal.turn() as turn:
                task = asyncio.ensure_future(turn.adispatch("slow", {"n": 1}, call_id="c1"))
                await entered.wait()
                task.cancel()
                await asyncio.sleep(0)  # the cancellation lands; its record is still written
                # At once, before the cancelled task is done: it blocks, here as in a replay.
                assert journal.is_blocked()
                retry = await turn.adispatch("slow", {"n": 2}, call_id="c2")
                assert retry.outcome == "blocked"
                with pytest.raises(asyncio.CancelledError):
                    await task
            assert live_blockers(journal) == replay_blockers(path) != set()

    asyncio.run(main())
    assert ran == ["slow 1"]
    kinds_written = kinds(path)
    assert kinds_written.count(rc.STARTED) == 1 and rc.AMBIGUOUS in kinds_written


def test_item4_an_interrupt_right_after_write_returns_never_repeats_a_seq(logdir: Path) -> None:
    fs = InterruptingFS()
    log = walj.Log.open(logdir, _fs=fs)
    log.append({"n": 1})
    fs.arm("write")
    with pytest.raises(KeyboardInterrupt):
        log.append({"n": 2})  # written, not acknowledged
    assert fs.fired == 1 and log.last_seq == 2
    assert log.append({"n": 3}) == 3
    log.close()
    assert [(r.seq, r.data) for r in walj.read(logdir)] == [
        (1, {"n": 1}), (2, {"n": 2}), (3, {"n": 3})]
    with walj.Log.open(logdir) as log:
        assert log.append({"n": 4}) == 4


def test_item4_an_interrupt_right_after_the_seal_is_written_leaves_no_data_after_it(
        logdir: Path) -> None:
    fs = InterruptingFS()
    log = walj.Log.open(logdir, segment_bytes=1024, _fs=fs)
    pad = "p" * 300
    log.append({"n": 1, "pad": pad})
    log.append({"n": 2, "pad": pad})
    fs.arm("write", 2)  # the record that fills the segment, then its seal
    with pytest.raises(KeyboardInterrupt):
        log.append({"n": 3, "pad": pad})
    acknowledged = [log.append({"n": n, "pad": pad}) for n in range(4, 12)]
    log.close()
    assert acknowledged == list(range(4, 12))
    report = walj.verify(logdir)
    assert report.ok and report.last_seq == 11, report.problems
    with walj.Log.open(logdir, segment_bytes=1024) as log:
        assert log.append({"n": 12}) == 12


def test_item5_an_interrupt_while_turn_started_is_synced_does_not_brick_the_journal(
        tmp_path: Path) -> None:
    path = tmp_path / "j"
    fs = InterruptingFS()
    journal = walj.ToolJournal.open(path, _fs=fs)
    fs.arm("sync")  # sync="always": turn_started is synced under the write
    with pytest.raises(KeyboardInterrupt):
        with journal.turn():
            pass
    assert fs.fired == 1
    with journal.turn() as turn:
        assert turn.sequence == 2
    journal.close()
    with walj.ToolJournal.open(path) as journal:
        assert not journal.recovery.blocked
        with journal.turn() as turn:
            assert turn.sequence == 3


def test_item5_an_interrupt_while_the_terminal_record_is_synced_leaves_one_terminal(
        tmp_path: Path) -> None:
    path = tmp_path / "j"
    fs = InterruptingFS()
    ran = Recorder()
    journal = walj.ToolJournal.open(path, tools={"send": ran}, _fs=fs)
    with journal.turn() as turn:
        fs.arm("sync", 2)  # the intent's sync, then the terminal record's
        with pytest.raises(KeyboardInterrupt):
            turn.dispatch("send", {}, call_id="c1")
        # The finished record is in the file: nothing blocks, here as in a replay.
        assert live_blockers(journal) == replay_blockers(path, turn.sequence) == set()
        assert turn.dispatch("send", {}, call_id="c2").outcome == "ok"
    [finished, _] = [r for r in records(path) if r["kind"] == rc.FINISHED]
    with pytest.raises(walj.ResolutionError) as refused:
        journal.resolve(finished["execution_id"], "succeeded", actor="ann")
    assert refused.value.reason == "already_terminal"
    journal.close()
    terminal = [r["kind"] for r in records(path)
                if r.get("execution_id") == finished["execution_id"]]
    assert terminal == [rc.STARTED, rc.FINISHED]


def test_item6_batch_mode_survives_an_interrupt_in_a_group_sync(logdir: Path) -> None:
    log = walj.Log.open(logdir, sync="batch")

    def interrupt_the_gathering(frame: Any, event: str, arg: Any) -> Any:
        # As a Ctrl-C landing while the group-sync leader gathers its followers.
        if event == "call" and frame.f_code.co_name == "_gather":
            sys.settrace(None)
            raise KeyboardInterrupt("Ctrl-C while a group sync gathers")
        return None

    sys.settrace(interrupt_the_gathering)
    try:
        with pytest.raises(KeyboardInterrupt):
            log.append({"n": 1})
    finally:
        sys.settrace(None)
    done: list[int] = []
    worker = threading.Thread(target=lambda: done.append(log.append({"n": 2})), daemon=True)
    worker.start()
    worker.join(10)
    assert done == [2], "an append after an interrupted group sync never returned"
    closer = threading.Thread(target=log.close, daemon=True)
    closer.start()
    closer.join(10)
    assert not closer.is_alive(), "close() never returned"
    assert seqs(logdir) == [1, 2]


# --- robustness -----------------------------------------------------------------------------


class BlockingFS(FileSystem):
    """write() of a line holding `marker` waits until `release` is set."""

    def __init__(self, marker: bytes) -> None:
        self.marker = marker
        self.entered = threading.Event()
        self.release = threading.Event()

    def write(self, fd: int, data: bytes) -> int:
        if self.marker in data:
            self.entered.set()
            self.release.wait(30)
        return super().write(fd, data)

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        if self.marker in data:
            self.entered.set()
            self.release.wait(30)
        return super().pwrite(fd, data, offset)


def test_item15_cancelling_an_async_turn_while_its_records_are_written_does_not_wedge_the_journal(
        tmp_path: Path) -> None:
    # Entering a turn writes nothing (turn_started rides in the turn's first write), so the
    # write a cancellation can land in is the one at its exit: here, a turn left by an exception
    # writes its turn_started alone. The cancelled exit waits for that write, which the file
    # system lets finish shortly after the cancellation, and the journal goes on.
    path = tmp_path / "j"
    fs = BlockingFS(b'"turn_started"')

    async def main() -> None:
        with walj.ToolJournal.open(path, _fs=fs) as journal:

            async def turn_left_by_an_exception() -> None:
                async with journal.turn():
                    raise ValueError("the turn's body failed")

            task = asyncio.ensure_future(turn_left_by_an_exception())
            while not fs.entered.is_set():
                await asyncio.sleep(0.001)
            fs.marker = b"never"
            task.cancel()
            asyncio.get_running_loop().call_later(0.05, fs.release.set)
            with pytest.raises(asyncio.CancelledError):
                await task
            async with journal.turn() as turn:
                assert turn.sequence == 2
            assert not journal.recovery.blocked

    asyncio.run(main())
    assert [r["turn_sequence"] for r in records(path) if r["kind"] == rc.TURN_STARTED] == [1, 2]


def test_item16_a_forked_child_cannot_write_to_its_parents_log(logdir: Path) -> None:
    log = walj.Log.open(logdir)
    log.append({"n": 1})
    pid = os.fork()
    if pid == 0:  # the child: every write refused, and closing must not unlock the parent
        code = 0
        try:
            log.append({"child": 1})
            code = 3
        except walj.PoisonedError:
            pass
        except BaseException:
            code = 4
        try:
            log.close()
        except BaseException:
            code = 5
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    other = subprocess.run(  # the parent still holds the lock
        [sys.executable, "-c", "import sys, walj; walj.Log.open(sys.argv[1])", str(logdir)],
        capture_output=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    assert other.returncode == 1 and b"LockedError" in other.stderr
    assert log.append({"n": 2}) == 2
    log.close()
    assert [r.data for r in walj.read(logdir)] == [{"n": 1}, {"n": 2}]


def test_item17_deleting_lock_under_a_live_writer_poisons_it(logdir: Path) -> None:
    log = walj.Log.open(logdir)
    log.append({"n": 1})
    (logdir / "LOCK").unlink()
    with pytest.raises(walj.PoisonedError, match="LOCK"):
        log.append({"n": 2})
    with pytest.raises(walj.PoisonedError):
        log.append({"n": 3})
    with pytest.raises(walj.PoisonedError):
        log.close()


def test_item17_a_deleted_log_directory_poisons_at_the_next_sync(tmp_path: Path) -> None:
    path = tmp_path / "log"
    log = walj.Log.open(path, sync="never")
    acknowledged = [log.append({"n": n}) for n in range(3)]
    shutil.rmtree(path)
    with pytest.raises(walj.PoisonedError, match="deleted"):
        log.sync()
    with pytest.raises(walj.PoisonedError):
        log.append({"n": 4})
    with pytest.raises(walj.PoisonedError):
        log.close()
    assert acknowledged == [1, 2, 3]


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_item18_a_journal_dropped_without_close_releases_its_directory(tmp_path: Path) -> None:
    path = tmp_path / "j"
    gc.collect()
    before = _open_fds()
    for sync in ("always", "interval"):
        journal = walj.ToolJournal.open(path, sync=sync)
        with journal.turn() as turn:
            turn.dispatch("t", {}, handler=lambda: 1)
        with pytest.warns(ResourceWarning):
            del journal, turn
            gc.collect()
    assert _open_fds() == before
    with walj.ToolJournal.open(path) as journal:  # not "already open in this process"
        assert journal.recovery.records == 8  # both lives: 4 records each


def test_a_closed_log_runs_no_code_when_it_is_collected(tmp_path: Path) -> None:
    """CPython drops a KeyboardInterrupt that a real SIGINT raises inside a finalizer or a weak
    reference's callback. A __del__ that ran for every log collected, and the fork table's
    WeakSet entry, made each collection of a closed log such a window; the torture's SIGINT
    children caught a Ctrl-C swallowed in each. A closed log leaves neither behind: collecting
    it runs no Python code."""
    ran: list[str] = []
    # By directory, not by a word in the path: a checkout in a folder named walj holds its
    # virtual environment, and a third-party module collected there is not walj's code.
    package = os.path.dirname(os.path.abspath(walj.__file__)) + os.sep
    weakref_modules = {os.path.abspath(m.__file__ or "") for m in (weakref, _weakrefset)}

    def watch(frame: Any, event: str, _arg: Any) -> None:
        # walj's own code, and the weakref module's callbacks (a WeakSet's, a finalizer's).
        source = os.path.abspath(frame.f_code.co_filename)
        if event == "call" and (source.startswith(package) or source in weakref_modules):
            ran.append(f"{frame.f_code.co_name} ({os.path.basename(source)})")

    # "interval" too: its syncer thread is a pooled worker that the log does not own, so no
    # Thread (which the threading module tracks in a WeakSet of its own) is freed with it.
    for sync in ("always", "batch", "interval", "never"):
        log = walj.Log.open(tmp_path / sync, sync=sync, sync_interval_ms=1)
        log.append({"n": 1})
        log.close()
        gc.collect()
        sys.setprofile(watch)
        try:
            del log
            gc.collect()
        finally:
            sys.setprofile(None)
        assert ran == [], f"collecting a closed {sync} log ran {ran}"


def test_a_ctrl_c_while_a_closed_interval_journal_is_collected_is_not_dropped(
        tmp_path: Path) -> None:
    """The interrupt torture's SIGINT child lost a Ctrl-C ("Exception ignored in: WeakSet
    _remove") inside a journal write. A closed journal is freed by the cyclic collector, at an
    allocation anywhere, and with it its log; an interval log's syncer was a Thread, whose entry
    in the threading module's WeakSet then ran a callback, where CPython drops the
    KeyboardInterrupt. Here the interrupt is raised where a pending SIGINT's handler raises it:
    at the first Python code that runs while the journal is dropped and collected. It must not
    be dropped, because none runs."""
    journal = walj.ToolJournal.open(tmp_path / "journal", tools={"echo": lambda x: x},
                                    sync="interval", sync_interval_ms=1)
    with journal.turn() as turn:
        assert turn.dispatch("echo", {"x": 1}).outcome == "ok"
    del turn
    journal.close()
    collected = weakref.ref(journal._core.log)
    gc.collect()
    gc.disable()  # no collection but the one under test
    dropped: list[str] = []
    raised: list[str] = []

    def ctrl_c(frame: Any, event: str, _arg: Any) -> None:
        if event == "call" and not raised:
            raised.append(f"{frame.f_code.co_name} ({os.path.basename(frame.f_code.co_filename)})")
            raise KeyboardInterrupt

    def unraisable(info: Any) -> None:
        dropped.append(f"{type(info.exc_value).__name__} in {info.object!r}")

    hook, sys.unraisablehook = sys.unraisablehook, unraisable
    # Another package imported in this process may hook every collection (gc.callbacks): its
    # code is not walj's, and would take the interrupt meant for walj's.
    callbacks, gc.callbacks[:] = gc.callbacks[:], []
    try:
        sys.setprofile(ctrl_c)
        try:
            del journal
            gc.collect()
        finally:
            sys.setprofile(None)
    finally:
        gc.callbacks[:] = callbacks
        sys.unraisablehook = hook
        gc.enable()
    assert collected() is None
    assert (raised, dropped) == ([], []), f"a Ctrl-C raised in {raised} was dropped: {dropped}"


def test_interval_logs_reuse_their_syncer_threads(tmp_path: Path) -> None:
    """A closed interval log's syncer thread serves the next interval log opened, so opening
    and closing them starts no thread per log; two open at once are synced by two threads."""
    def syncers() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name.startswith("walj-interval-sync")}

    walj.Log.open(tmp_path / "warm", sync="interval", sync_interval_ms=1).close()
    before = syncers()
    assert before
    for k in range(5):
        log = walj.Log.open(tmp_path / f"one{k}", sync="interval", sync_interval_ms=1)
        log.append({"k": k})
        wait_until(lambda log=log: log.durable_seq == 1)  # type: ignore[misc]
        log.close()
    assert syncers() == before
    logs = [walj.Log.open(tmp_path / f"two{k}", sync="interval", sync_interval_ms=1)
            for k in range(len(before) + 1)]
    for log in logs:
        log.append({"n": 1})
    for log in logs:  # each is synced, by a worker of its own
        wait_until(lambda log=log: log.durable_seq == 1)  # type: ignore[misc]
    assert len(syncers()) == len(before) + 1
    for log in logs:
        log.close()


def test_a_forked_child_closes_its_parents_interval_log_and_syncs_its_own(tmp_path: Path) -> None:
    """The parent's syncer threads do not exist in a forked child: closing the parent's
    interval log there must not wait for its (busy) one, and the child's own interval log is
    synced, not handed to the parked one the parent counts idle."""
    log = walj.Log.open(tmp_path / "parent", sync="interval", sync_interval_ms=1)
    log.append({"n": 1})
    walj.Log.open(tmp_path / "before", sync="interval", sync_interval_ms=1).close()
    wait_until(lambda: _syncers._pool._idle > 0)  # a worker parked, counted idle at the fork
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            log.close()
            own = walj.Log.open(tmp_path / "child", sync="interval", sync_interval_ms=1)
            own.append({"child": 1})
            wait_until(lambda: own.durable_seq == 1)
            own.close()
        except BaseException:
            code = 3
        os._exit(code)
    deadline = time.monotonic() + 60  # a liveness bound: a close waiting for a thread that
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:  # does not exist here never ends
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung")
        time.sleep(0.01)
    assert os.waitstatus_to_exitcode(done[1]) == 0
    assert log.append({"n": 2}) == 2
    log.close()
    assert [r.data for r in walj.read(tmp_path / "child")] == [{"child": 1}]


def wait_until(condition: Callable[[], bool], seconds: float = 30.0) -> None:
    """Poll `condition` until it holds; fail after `seconds` (a liveness bound, not a timing)."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"still false after {seconds} s"
        time.sleep(0.001)


STRACE = shutil.which("strace")


@pytest.mark.skipif(STRACE is None, reason="strace is not installed")
def test_item23_new_ancestor_directories_are_synced(tmp_path: Path) -> None:
    """Each directory open creates is followed by an fsync of its parent, top down, before
    the first segment is renamed into place."""
    out = tmp_path / "trace"
    root = tmp_path / "root"
    root.mkdir()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    subprocess.run(
        [STRACE, "-f", "-qq", "-o", str(out), "-e", "trace=mkdir,mkdirat,openat,fsync,rename",
         sys.executable, "-c", "import sys, walj; walj.Log.open(sys.argv[1]).close()",
         str(root / "state" / "agents" / "s1")],
        check=True, env=env, cwd=root,
    )
    events = []
    fds: dict[str, str] = {}
    for line in out.read_text().splitlines():
        call = line.split(None, 1)[1]
        op = call.split("(", 1)[0]
        quoted = call.split('"')[1] if '"' in call else ""
        result = call.rsplit("=", 1)[-1].strip().split()[0]
        if op == "openat" and result.isdigit():
            fds[result] = quoted
        elif op in ("mkdir", "mkdirat") and str(root) in quoted:
            events.append(("mkdir", quoted))
        elif op == "fsync":
            events.append(("fsync", fds.get(call[6:].split(")")[0], "?")))
        elif op == "rename" and "seg-0000000001" in call:
            events.append(("rename", quoted))
    created = [str(root / "state"), str(root / "state" / "agents"),
               str(root / "state" / "agents" / "s1")]
    mkdirs = [i for i, (op, _) in enumerate(events) if op == "mkdir"]
    assert [events[i][1] for i in mkdirs] == created
    rename = next(i for i, (op, _) in enumerate(events) if op == "rename")
    for i, path in zip(mkdirs, created, strict=True):
        assert ("fsync", os.path.dirname(path)) in events[i + 1 : rename], (path, events)


# --- also seen ------------------------------------------------------------------------------


class FullDiskFS(FileSystem):
    def create(self, path: str) -> int:
        raise OSError(28, os.strerror(28), path)

    def write(self, fd: int, data: bytes) -> int:
        raise OSError(28, os.strerror(28))

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        raise OSError(28, os.strerror(28))


def test_reopening_on_a_full_disk_is_typed_and_leaves_no_owner_tmp(logdir: Path) -> None:
    walj.Log.open(logdir).close()
    log = walj.Log.open(logdir, _fs=FullDiskFS())  # LOCK.owner cannot be written: no matter
    with pytest.raises(walj.DiskFullError):
        log.append({"n": 1})
    with pytest.raises(walj.PoisonedError):
        log.close()
    assert not (logdir / "LOCK.owner.tmp").exists()
    with pytest.raises(walj.DiskFullError):
        walj.Log.open(logdir / "new", _fs=FullDiskFS())


def test_a_pending_llm_call_that_blocks_is_recorded_as_blocking(tmp_path: Path) -> None:
    path = tmp_path / "j"
    with walj.ToolJournal.open(path, block_on_pending_llm_calls=True) as journal:
        with pytest.raises(KeyboardInterrupt), journal.turn() as turn:
            with turn.llm_call(model="m", request={"q": 1}):
                raise KeyboardInterrupt
        assert journal.recovery.blocked
    [started] = [r for r in records(path) if r["kind"] == rc.LLM_STARTED]
    assert started["blocks_dispatch"] is True
    with walj.ToolJournal.open(path) as journal:  # a reader without the option still blocks
        assert journal.recovery.blocked
    with walj.ToolJournal.open(tmp_path / "k") as journal:
        with pytest.raises(KeyboardInterrupt), journal.turn() as turn:
            with turn.llm_call(model="m"):
                raise KeyboardInterrupt
    [started] = [r for r in records(tmp_path / "k") if r["kind"] == rc.LLM_STARTED]
    assert "blocks_dispatch" not in started


def test_the_idempotency_key_is_the_same_when_a_call_is_dispatched_again_in_a_later_turn(
        tmp_path: Path) -> None:
    """A call that did not take effect (interrupted, then resolved not_performed) runs again
    under its call id with the same key, so a downstream API can deduplicate it."""
    path = tmp_path / "j"
    seen: list[str] = []

    def send(to: str, context: walj.ToolContext) -> None:
        seen.append(context.idempotency_key)
        if len(seen) == 1:
            raise KeyboardInterrupt

    with walj.ToolJournal.open(path, tools={"send": send}) as journal:
        with pytest.raises(KeyboardInterrupt), journal.turn() as turn:
            turn.dispatch("send", {"to": "ann"}, call_id="model-call-1")
        journal.resolve(journal.recovery.blockers[0].execution_id or "", "not_performed",
                        actor="ann")
    for _ in range(2):
        with walj.ToolJournal.open(path, tools={"send": send}) as journal:
            with journal.turn() as turn:
                turn.dispatch("send", {"to": "ann"}, call_id="model-call-1")  # once settled,
                turn.dispatch("send", {"to": "ann"})  # replayed; no call id: unique per turn
    assert seen[0] == seen[1] and seen[2] != seen[3] and len(seen) == 4 and len(set(seen)) == 3
    started = [r for r in records(path) if r["kind"] == rc.STARTED]
    assert [r["call_id"] for r in started] == ["model-call-1", "model-call-1", "turn-2-call-2",
                                            "turn-3-call-2"]


# --- shared with the review of published promises -------------------------------------------


def test_close_after_a_failed_background_sync_raises_the_poisoning(logdir: Path) -> None:
    from faultfs import FaultyFS

    fs = FaultyFS()
    fs.fail("sync", nth=2)  # the header's sync, then the first background sync
    log = walj.Log.open(logdir, sync="interval", sync_interval_ms=1, _fs=fs)
    for n in range(5):
        log.append({"n": n})
    deadline = threading.Event()
    while not log.poisoned and not deadline.wait(0.005):
        pass
    assert log.poisoned and log.durable_seq == 0 and log.last_seq == 5
    with pytest.raises(walj.PoisonedError, match="may not be durable"):
        log.close()
    log.close()  # reported once
    assert len([c for c in fs.calls if c[0] == "sync"]) == 2  # never retried


def test_rotation_under_concurrent_batch_appends_seals_no_empty_segment(logdir: Path) -> None:
    with walj.Log.open(logdir, sync="batch", segment_bytes=1024) as log:
        def work(t: int) -> None:
            for n in range(60):
                log.append({"t": t, "n": n, "pad": "x" * 40})

        threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    empty = []
    for segment in sorted(logdir.glob("seg-*.jsonl")):
        lines = segment.read_bytes().splitlines()
        if len(lines) == 2 and b'"seal"' in lines[1]:
            empty.append(segment.name)
    assert empty == [] and walj.verify(logdir).records == 480
