"""The journals an integration holds: ended and released on request, closed once idle and
opened again on the next call, bounded in number, never closed under a running call, left
whole by a KeyboardInterrupt while opening or closing (reopening one released on request
too); and two worker processes that take turns on one thread, each asking the other to release
it, one SIGKILLed inside a tool."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import langchain_fakes as lf
import pytest
import sdk_fakes as fx
from helpers import wait_until
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from workers import Worker

import walj
from walj.integrations import _journals as _journals_module
from walj.integrations import _session_open as _session_open_module
from walj.integrations._journals import JournalOnly, SessionJournals
from walj.integrations._session_open import RELEASE_ACTOR
from walj.integrations.langchain import WaljMiddleware

THREAD = "user:42"
CONFIG: Any = {"configurable": {"thread_id": THREAD}}


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def graph_of(walj_mw: WaljMiddleware, *tools: Any) -> Any:
    node = ToolNode(list(tools), wrap_tool_call=walj_mw.wrap_tool_call,
                    awrap_tool_call=walj_mw.awrap_tool_call)
    builder = StateGraph(MessagesState)
    builder.add_node("tools", node)
    builder.add_edge(START, "tools")
    return builder.compile()


def asks(call_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    return {"messages": [AIMessage(content="", tool_calls=[lf.call(call_id, name, arguments)])]}


def answer_of(state: Any) -> ToolMessage:
    message = state["messages"][-1]
    assert isinstance(message, ToolMessage)
    return message


@tool
def lookup(order: int) -> str:
    """Look an order up."""
    return f"order {order}"


def sweep(root: Path) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "walj", "sweep", str(root), "--jobs", "1",
                           "--json"], capture_output=True, text=True, env=fx.child_env(),
                          check=False)
    assert done.returncode in (0, 1), done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


# --- ending and releasing -------------------------------------------------------------------------


def test_ending_a_thread_writes_session_ended_and_sweep_shows_it_ended(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    with WaljMiddleware(root) as walj_mw:
        graph = graph_of(walj_mw, lookup)
        assert answer_of(graph.invoke(asks("call_1", "lookup", order=1), CONFIG)).content == (
            "order 1")
        assert answer_of(graph.invoke(asks("call_1", "lookup", order=1),
                                      {"configurable": {"thread_id": "other"}})).content
        assert [s["status"] for s in sweep(root)["sessions"]] == ["active", "active"]
        walj_mw.end(THREAD)
        by_status = {os.path.basename(s["path"]): s["status"] for s in sweep(root)["sessions"]}
        assert by_status == {"%user%3A42": "ended", "other": "active"}
        # Ended for good: a later call of the thread is refused, nothing runs.
        with pytest.raises(walj.SessionEndedError):
            graph.invoke(asks("call_2", "lookup", order=2), CONFIG)
        walj_mw.end(THREAD)  # idempotent, even opened afresh
        walj_mw.end("never seen")  # no journal: none is made to be ended
        assert len(sweep(root)["sessions"]) == 2
    journal = walj.ToolJournal.open_session(root, THREAD)
    with journal:
        assert journal.ended and not journal.recovery.blocked


def test_release_closes_every_descriptor_and_the_next_call_opens_it_again(
    tmp_path: Path
) -> None:
    before = open_fds()
    with WaljMiddleware(tmp_path, idle_timeout=None) as walj_mw:
        graph = graph_of(walj_mw, lookup)
        graph.invoke(asks("call_1", "lookup", order=1), CONFIG)
        held = open_fds() - before
        assert held, "a journal in use holds descriptors"
        walj_mw.release(THREAD)
        assert open_fds() - before == set()
        walj_mw.release(THREAD)  # nothing open: nothing to do
        # The next call opens the journal again and replays the settled call id.
        assert answer_of(graph.invoke(asks("call_1", "lookup", order=1), CONFIG)).content == (
            "order 1")
        assert walj_mw.journal(THREAD).recovery.session_id == THREAD
    assert open_fds() - before == set()


def test_a_journal_idle_past_idle_timeout_is_closed_and_reopened_on_the_next_call(
    tmp_path: Path
) -> None:
    before = open_fds()
    with WaljMiddleware(tmp_path, idle_timeout=0.2) as walj_mw:
        graph = graph_of(walj_mw, lookup)
        graph.invoke(asks("call_1", "lookup", order=1), CONFIG)
        first = walj_mw.journal(THREAD)
        assert not first.closed
        # Nothing calls: the process's one sweeping thread closes it.
        assert wait_until(lambda: first.closed), "the idle journal was never closed"
        assert open_fds() - before == set()
        assert answer_of(graph.invoke(asks("call_2", "lookup", order=2), CONFIG)).content == (
            "order 2")
        second = walj_mw.journal(THREAD)
        assert second is not first and not second.closed
        assert [t.name for t in threading.enumerate()].count("walj-idle-journals") == 1


def test_at_most_max_open_journals_stay_open_least_recently_used_closed_first(
    tmp_path: Path
) -> None:
    with WaljMiddleware(tmp_path, max_open=2, idle_timeout=None) as walj_mw:
        graph = graph_of(walj_mw, lookup)
        journals = {}
        for thread in ("a", "b", "a", "c"):
            graph.invoke(asks(f"call_{thread}", "lookup", order=1),
                         {"configurable": {"thread_id": thread}})
            journals.setdefault(thread, walj_mw.journal(thread))
        assert walj_mw._journals.open_ids() == ["a", "c"]  # b was the least recently used
        assert journals["b"].closed and not journals["a"].closed


def test_a_journal_with_a_call_running_is_never_closed_released_or_ended(
    tmp_path: Path
) -> None:
    inside, go_on = threading.Event(), threading.Event()

    @tool
    def slow(order: int) -> str:
        """Take a while."""
        inside.set()
        assert go_on.wait(30)
        return "done"

    with WaljMiddleware(tmp_path, idle_timeout=0.05, max_open=1) as walj_mw:
        graph = graph_of(walj_mw, slow, lookup)
        results: list[Any] = []
        runner = threading.Thread(target=lambda: results.append(
            graph.invoke(asks("call_1", "slow", order=1), CONFIG)))
        runner.start()
        assert inside.wait(30)
        journal = walj_mw.journal(THREAD)
        # Another thread's call evicts nothing in use, though one over max_open.
        graph.invoke(asks("call_x", "lookup", order=1), {"configurable": {"thread_id": "x"}})
        time.sleep(0.3)  # several idle sweeps
        with pytest.raises(walj.TurnError):
            walj_mw.release(THREAD)
        with pytest.raises(walj.TurnError):
            walj_mw.end(THREAD)
        assert not journal.closed
        go_on.set()
        runner.join(30)
        assert answer_of(results[0]).content == "done"
        assert wait_until(lambda: journal.closed)  # idle now: swept
    with walj.ToolJournal.open_session(tmp_path, THREAD) as reopened:
        assert not reopened.recovery.blocked and not reopened.recovery.incomplete_turns


# --- interrupts while opening and closing -----------------------------------------------------


class _Interrupting:
    """A session value whose making or closing is interrupted once, where asked."""

    def __init__(self, journal: walj.ToolJournal, where: list[str]) -> None:
        if "make" in where:
            where.remove("make")
            raise KeyboardInterrupt
        self.journal = journal
        self.where = where

    def close(self) -> None:
        if "close" in self.where:
            self.where.remove("close")
            raise KeyboardInterrupt  # before anything is closed
        self.journal.close()


@pytest.mark.parametrize("where", ["open", "make", "close"])
def test_a_keyboard_interrupt_while_opening_or_closing_leaves_no_half_registered_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    before = open_fds()
    plan = [where]
    journals: SessionJournals[_Interrupting] = SessionJournals(
        tmp_path, lambda journal: _Interrupting(journal, plan), options={},
        idle_timeout=None)
    if where == "open":
        real = walj.ToolJournal.open_session

        def interrupted_open(*args: Any, **options: Any) -> walj.ToolJournal:
            if "open" in plan:
                plan.remove("open")
                raise KeyboardInterrupt  # while it waits for the lock, say
            return real(*args, **options)

        monkeypatch.setattr(walj.ToolJournal, "open_session", interrupted_open)
    if where == "close":
        journals.get(THREAD)
        with pytest.raises(KeyboardInterrupt):
            journals.release(THREAD)
    else:
        with pytest.raises(KeyboardInterrupt):
            journals.acquire(THREAD)
    assert journals.open_ids() == [] and open_fds() - before == set()
    # Nothing is left half done: the session opens and closes again, from any thread.
    got: list[Any] = []
    opener = threading.Thread(target=lambda: got.append(journals.acquire(THREAD)))
    opener.start()
    opener.join(30)
    assert journals.open_ids() == [THREAD] and not got[0].journal.closed
    journals.done(THREAD, got[0])
    journals.close()
    assert open_fds() - before == set()


def test_bad_limits_are_clear_errors(tmp_path: Path) -> None:
    for bad in ({"idle_timeout": 0}, {"idle_timeout": "10"}, {"max_open": 0},
                {"max_open": 1.5}, {"lock_timeout": -1}, {"lock_timeout": True}):
        with pytest.raises(ValueError):
            WaljMiddleware(tmp_path, **bad)
    with pytest.raises(ValueError):
        SessionJournals(tmp_path, JournalOnly, options={"lock_timeout": 5})
    with WaljMiddleware(tmp_path) as walj_mw:
        pass
    with pytest.raises(walj.ClosedError):
        walj_mw.journal(THREAD)


# --- two worker processes on one thread -----------------------------------------------------------


def test_two_workers_take_turns_on_a_thread_and_a_kill_mid_tool_blocks_the_other(
    tmp_path: Path
) -> None:
    root, effects = tmp_path / "sessions", tmp_path / "effects.txt"
    a, b = Worker(root, effects, "a"), Worker(root, effects, "b")
    try:
        assert a.line() == "READY" and b.line() == "READY"
        # The other worker holds the thread's idle journal for ten minutes (the default), far
        # past the 30 s lock wait: each run asks it to release the journal, then takes it.
        assert a.run("call_1", "one")["content"] == "sent one"
        assert b.run("call_2", "two")["content"] == "sent two"
        assert a.run("call_3", "three")["content"] == "sent three"
        # ... and the holder, asked again, gives it back while its process serves on.
        assert b.run("call_3b", "again")["content"] == "sent again"
        # Worker b is SIGKILLed inside the tool, after its effect.
        b.send("call_4", "park")
        assert b.line() == "PARKED"
        os.kill(b.process.pid, signal.SIGKILL)
        b.process.wait(fx.HANG_GUARD)
        # Worker a gets the thread (the kernel let go of the dead worker's lock) and finds
        # the execution in doubt: the call is blocked, nothing runs, the tool is not run again.
        blocked = a.run("call_4", "park")
        assert blocked["status"] == "error" and "was not run" in blocked["content"]
        later = a.run("call_5", "five")
        assert later["status"] == "error" and "was not run" in later["content"]
    finally:
        a.stop()
        b.stop()
    assert fx.effect_lines(effects) == ["a one", "b two", "a three", "b again", "b park"]
    path = walj.ToolJournal.session_path(root, THREAD)
    released = [r.data for r in walj.read(path) if r.data.get("kind") == "journal_released"]
    # a -> b, b -> a, a -> b by request; the dead worker's lock needed none.
    assert [r["actor"] for r in released] == [RELEASE_ACTOR] * 3
    assert not (path / "requests").exists() or not list((path / "requests").iterdir())
    with walj.ToolJournal.open_session(root, THREAD) as journal:
        [doubt] = journal.recovery.blockers
        assert (doubt.call_id, doubt.state) == ("call_4", "started")


def test_threads_asking_for_one_session_at_once_share_one_open_journal(tmp_path: Path) -> None:
    before = open_fds()
    journals = SessionJournals(tmp_path, JournalOnly, options={}, idle_timeout=None)
    start = threading.Barrier(8, timeout=30)
    got: list[JournalOnly] = []

    def use() -> None:
        start.wait()
        held = journals.acquire(THREAD)
        got.append(held)
        journals.done(THREAD, held)

    workers = [threading.Thread(target=use) for _ in range(8)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(30)
    assert len(got) == 8 and len({id(h) for h in got}) == 1
    assert journals.open_ids() == [THREAD]
    journals.release(THREAD)
    assert got[0].journal.closed and open_fds() - before == set()


def test_a_run_cancelled_while_its_journal_opens_leaves_it_idle_not_held(tmp_path: Path) -> None:
    journals = SessionJournals(tmp_path, JournalOnly, options={}, idle_timeout=None)
    opening, go_on = threading.Event(), threading.Event()
    real = walj.ToolJournal.open_session

    def slow_open(*args: Any, **options: Any) -> walj.ToolJournal:
        opening.set()
        assert go_on.wait(30)
        return real(*args, **options)

    async def cancelled() -> None:
        task = asyncio.ensure_future(journals.aacquire(THREAD))
        while not opening.is_set():
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        go_on.set()

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(walj.ToolJournal, "open_session", slow_open)
        asyncio.run(cancelled())
    assert wait_until(lambda: journals.open_ids() == [THREAD])
    journals.release(THREAD)  # idle: a TurnError here would mean the run was never counted out
    assert journals.open_ids() == []


def _interrupted_at(n: int, operation: Callable[[], Any]) -> tuple[str, int] | None:
    """Run `operation` in a thread traced on the lines of walj/integrations/_journals.py and
    walj/integrations/_session_open.py, and raise KeyboardInterrupt before its n-th line there;
    the line it landed on (file and number), or None when the operation has fewer lines. A
    `with` block's normal exit is reported as a line before its `__exit__` runs, where no real
    interrupt lands (CPython delivers one after the call returns): an interrupt due there goes
    to the next line."""
    sources = {path: Path(path).read_text(encoding="utf-8").splitlines()
               for path in TRACED_FILES}
    count: list[int] = [0]
    landed: list[tuple[str, int] | None] = [None]

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        source = sources.get(frame.f_code.co_filename)
        if source is None:
            return None
        seen: set[int] = set()

        def local(frame: Any, event: str, arg: Any) -> Any:
            if event == "line":
                count[0] += 1
                line = frame.f_lineno
                exiting = line in seen and source[line - 1].strip().startswith("with ")
                seen.add(line)
                if count[0] >= n and not exiting:
                    landed[0] = (Path(frame.f_code.co_filename).name, line)
                    sys.settrace(None)
                    raise KeyboardInterrupt
            return local
        return local

    def run() -> None:
        sys.settrace(tracer)
        try:
            operation()
        except KeyboardInterrupt:
            pass
        finally:
            sys.settrace(None)

    worker = threading.Thread(target=run)
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), f"deadlocked, interrupted at line {landed[0]}"
    return landed[0]


TRACED_FILES = (_journals_module.__file__, _session_open_module.__file__)


def _one_run(journals: SessionJournals[Any]) -> None:
    journals.done(THREAD, journals.acquire(THREAD))


@pytest.mark.parametrize("operation", ["acquire", "release", "end", "evict", "close",
                                       "reacquire_released"])
def test_an_interrupt_at_any_line_of_opening_or_closing_leaves_each_journal_whole(
    tmp_path: Path, operation: str
) -> None:
    landed: set[tuple[str, int]] = set()
    for n in range(1, 500):
        root = tmp_path / str(n)
        before = open_fds()
        journals = SessionJournals(root, JournalOnly, options={}, idle_timeout=None,
                                   max_open=1)
        if operation != "acquire":
            journals.get(THREAD)
        if operation == "reacquire_released":  # another process's release, as its journal
            assert journals._release_gate(THREAD)()  # makes it: the holder's yes, then
            journals._entries[THREAD].held.journal.close()  # the journal closes itself
        act = {"acquire": functools.partial(journals.acquire, THREAD),
               "reacquire_released": functools.partial(journals.acquire, THREAD),
               "release": functools.partial(journals.release, THREAD),
               "end": functools.partial(journals.end, THREAD),
               "evict": functools.partial(journals.get, "other"),
               "close": journals.close}[operation]
        line = _interrupted_at(n, act)
        if line is None:
            break
        landed.add(line)
        # Each session is open and registered, or closed and forgotten: closing the rest
        # leaves no descriptor, and the session opens again.
        for session in journals.open_ids():
            held = journals._entries[session].held
            assert held is not None and not held.journal.closed, line
        if operation == "reacquire_released":  # what was cut short is finished by a run
            run = threading.Thread(target=_one_run, args=(journals,), daemon=True)
            run.start()
            run.join(10)
            assert not run.is_alive(), f"a run spins on a release cut short at line {line}"
        journals.close()
        assert open_fds() - before == set(), f"a descriptor leaked at line {line}"
        again = SessionJournals(root, JournalOnly, options={}, idle_timeout=None)
        assert not again.get(THREAD).journal.closed
        again.close()
    assert len(landed) >= 5, landed
    if operation not in ("release", "close"):  # each of the others opens one: both files
        assert {file for file, _ in landed} == {"_journals.py", "_session_open.py"}, landed


def test_closing_the_holder_waits_for_a_journal_another_thread_is_closing(
        tmp_path: Path) -> None:
    """A holder's close() returns only once every journal is let go, even one that another
    call (the idle sweeper, a release) is closing at that moment: the session can be opened
    again at once, here or in another process."""
    from walj.integrations._journals import JournalOnly, SessionJournals
    from walj.log.fs import FileSystem

    class SlowClose(FileSystem):
        armed = False
        entered, go_on = threading.Event(), threading.Event()

        def close(self, fd: int) -> None:
            if self.armed:
                self.entered.set()
                assert self.go_on.wait(30)
            super().close(fd)

    fs = SlowClose()
    journals = SessionJournals(tmp_path, JournalOnly, options={"_fs": fs}, idle_timeout=None)
    held = journals.acquire("s")
    journals.done("s", held)
    fs.armed = True
    releaser = threading.Thread(target=journals.release, args=("s",))
    releaser.start()
    assert fs.entered.wait(30)
    closer = threading.Thread(target=journals.close)
    closer.start()
    closer.join(0.3)
    assert closer.is_alive(), "close() returned while a journal was still being closed"
    fs.armed = False
    fs.go_on.set()
    closer.join(30)
    releaser.join(30)
    assert not closer.is_alive() and not releaser.is_alive()
    walj.ToolJournal.open_session(tmp_path, "s").close()
