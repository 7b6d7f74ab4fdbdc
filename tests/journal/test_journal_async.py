"""Async dispatch: handlers awaited, fsync off the event loop, cancellation gives ambiguous."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from journal_helpers import records

import walj
from walj.journal import records as rc
from walj.journal._core import Core
from walj.journal._journal import ToolJournal
from walj.log import Log


def test_adispatch_awaits_async_handlers_and_writes_off_the_loop_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writers: list[tuple[str, bool]] = []
    original = Core.write

    def spy(self: Core, record: dict[str, Any], **options: Any) -> int:
        writers.append((record["kind"], threading.current_thread() is loop_thread))
        return original(self, record, **options)

    monkeypatch.setattr(Core, "write", spy)

    async def fetch(url: str, context: walj.ToolContext) -> str:
        await asyncio.sleep(0)
        return f"{url} {context.call_id}"

    def sync_tool(x: int) -> int:
        return x * 2

    loop_thread: threading.Thread | None = None

    async def main() -> list[walj.ToolResult]:
        nonlocal loop_thread
        loop_thread = threading.current_thread()
        with ToolJournal.open(tmp_path / "j", tools={"fetch": fetch, "double": sync_tool}) as j:
            async with j.turn() as turn:
                first = await turn.adispatch("fetch", {"url": "u"}, call_id="c1")
                second = await turn.adispatch("double", {"x": 4})
                async with turn.llm_call(model="m", request="q") as call:
                    call.finish("a")
            return [first, second]

    first, second = asyncio.run(main())
    assert (first.outcome, first.output) == ("ok", "u c1")
    assert (second.outcome, second.output) == ("ok", 8)
    # turn_started rides in the first intent's write, so it is no Core.write of its own.
    assert [kind for kind, _ in writers] == [
        rc.STARTED, rc.FINISHED, rc.STARTED, rc.FINISHED, rc.LLM_STARTED,
        rc.LLM_FINISHED, rc.TURN_COMPLETED]
    assert [r.data["kind"] for r in walj.read(tmp_path / "j")][:2] == [rc.TURN_STARTED,
                                                                        rc.STARTED]
    assert not any(on_loop for _, on_loop in writers)  # every fsync ran in a worker thread


def test_sync_dispatch_refuses_an_async_handler_before_writing(tmp_path: Path) -> None:
    async def handler() -> None:
        pass

    with ToolJournal.open(tmp_path / "j", tools={"a": handler}) as journal:
        with journal.turn() as turn:
            before = journal._log.last_seq
            with pytest.raises(TypeError):
                turn.dispatch("a", {})
            assert journal._log.last_seq == before


def test_cancellation_mid_handler_is_ambiguous_and_reraises_the_original(tmp_path: Path) -> None:
    path = tmp_path / "j"
    raised: list[BaseException] = []

    async def main() -> None:
        entered = asyncio.Event()

        async def slow(context: walj.ToolContext) -> None:
            entered.set()
            await asyncio.Event().wait()  # until cancelled

        with ToolJournal.open(path, tools={"slow": slow}) as journal:
            async with journal.turn() as turn:
                task = asyncio.ensure_future(turn.adispatch("slow", {}))
                await entered.wait()
                task.cancel("stop now")
                with pytest.raises(asyncio.CancelledError) as info:
                    await task
                raised.append(info.value)
                assert journal.recovery.blocked
                result = await turn.adispatch("slow", {})
                assert result.outcome == "blocked"

    asyncio.run(main())
    assert raised[0].args == ("stop now",)  # the original CancelledError, unchanged
    data = records(path)
    ambiguous = [r for r in data if r["kind"] == rc.AMBIGUOUS]
    assert len(ambiguous) == 1 and ambiguous[0]["error_type"] == "CancelledError"
    with ToolJournal.open(path) as journal:
        assert [b.state for b in journal.recovery.blockers] == ["ambiguous"]


def test_concurrent_async_dispatches_do_not_block_each_other(tmp_path: Path) -> None:
    async def tool(n: int) -> int:
        await asyncio.sleep(0)
        return n

    async def main() -> list[walj.ToolResult]:
        with ToolJournal.open(tmp_path / "j", tools={"t": tool}, sync="batch") as journal:
            async with journal.turn() as turn:
                return list(await asyncio.gather(
                    *(turn.adispatch("t", {"n": n}, call_id=f"c{n}") for n in range(8))))

    results = asyncio.run(main())
    assert [r.output for r in results] == list(range(8))
    assert all(r.outcome == "ok" for r in results)


def test_async_errors_are_terminal(tmp_path: Path) -> None:
    async def broken() -> None:
        raise ValueError("bad")

    async def main() -> walj.ToolResult:
        with ToolJournal.open(tmp_path / "j", tools={"b": broken}) as journal:
            async with journal.turn() as turn:
                result = await turn.adispatch("b", {})
            assert not journal.recovery.blocked
            return result

    result = asyncio.run(main())
    assert (result.outcome, result.error) == ("error", "ValueError: bad")


async def until(condition: Callable[[], bool]) -> None:
    """Wait for another thread; the bound only stops a broken run from hanging."""
    for _ in range(20_000):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("condition never became true")


def test_cancelled_while_the_intent_is_written_calls_nothing_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    in_write, release = threading.Event(), threading.Event()
    original = Core.write

    def slow_intent(self: Core, record: dict[str, Any], **options: Any) -> int:
        if record["kind"] == rc.STARTED:
            in_write.set()
            release.wait()
        return original(self, record, **options)

    monkeypatch.setattr(Core, "write", slow_intent)
    called: list[int] = []

    async def tool() -> None:
        called.append(1)

    path = tmp_path / "j"

    async def main() -> None:
        with ToolJournal.open(path, tools={"t": tool}) as journal:
            async with journal.turn() as turn:
                task = asyncio.ensure_future(turn.adispatch("t", {}))
                await until(in_write.is_set)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                release.set()
                # turn_started, then the intent, then the "cancelled" terminal record
                await until(lambda: journal._core.state.records == 3)
                assert not journal.recovery.blocked

    asyncio.run(main())
    assert called == []
    finished = [r for r in records(path) if r["kind"] == rc.FINISHED]
    assert len(finished) == 1 and finished[0]["outcome"] == "cancelled"


@pytest.mark.parametrize("block", ["turn", "llm_call"])
def test_an_exit_cancelled_mid_write_returns_only_once_the_write_is_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block: str
) -> None:
    """Cancelled while a worker writes turn_completed (or llm_call_finished): the cancellation
    reaches the caller only after that write, so what the process holds then is what a
    replay rebuilds."""
    last = rc.TURN_COMPLETED if block == "turn" else rc.LLM_FINISHED
    in_write, release = threading.Event(), threading.Event()
    original = Log.append_encoded

    def slow_last(self: Log, *data: bytes, **options: Any) -> int:
        if json.loads(data[-1])["kind"] == last:  # the journal's write lock is held here
            in_write.set()
            release.wait()
        return original(self, *data, **options)

    monkeypatch.setattr(Log, "append_encoded", slow_last)
    path = tmp_path / "j"

    async def main() -> None:
        with ToolJournal.open(path, tools={}) as journal:
            turn = journal.turn()
            await turn.__aenter__()
            bracket: Any = turn
            if block == "llm_call":
                bracket = turn.llm_call(model="m")
                await bracket.__aenter__()
            task = asyncio.ensure_future(bracket.__aexit__(None, None, None))
            await until(in_write.is_set)
            task.cancel()
            await asyncio.sleep(0.05)
            overtaken = task.done()
            release.set()  # before any assert: closing the journal waits for this write
            assert not overtaken, "the cancellation overtook the write under way"
            with pytest.raises(asyncio.CancelledError):
                await task
            journal._core.log.sync()
            assert journal._core.state.records == len(records(path))
            assert not journal._core.state.llm_calls
            if block == "llm_call":
                await turn.__aexit__(None, None, None)

    asyncio.run(main())
    assert records(path)[-1 if block == "turn" else 2]["kind"] == last


def test_cancelled_before_its_worker_starts_writes_no_intent_and_leaves_nothing_live(
    tmp_path: Path,
) -> None:
    """The intent's write is handed to a sync thread; a caller cancelled before that thread
    starts must win the race: the intent is never written, nothing stays live, the next
    dispatch runs. (Here the writer is held by another step, so the thread waits.)"""
    called: list[int] = []

    async def tool() -> None:
        called.append(1)

    path = tmp_path / "j"

    async def main() -> None:
        with ToolJournal.open(path, tools={"t": tool}) as journal:
            async with journal.turn() as turn:
                core = journal._core
                core.writing().acquire()  # the worker's begin waits for it
                try:
                    task = asyncio.ensure_future(turn.adispatch("t", {}))
                    await asyncio.sleep(0.05)  # submitted, and waiting for the writer
                    task.cancel()
                    with pytest.raises(asyncio.CancelledError):
                        await task
                finally:
                    core.writing().release()
                await asyncio.sleep(0.05)
                assert not core._live and not journal.recovery.blocked
                assert (await turn.adispatch("t", {})).outcome == "ok"

    asyncio.run(main())
    assert called == [1]
    kinds = [r["kind"] for r in records(path)]
    assert kinds.count(rc.STARTED) == 1 and kinds.count(rc.FINISHED) == 1, kinds
    reopened = walj.ToolJournal.open(path, tools={"t": tool})
    try:
        assert not reopened.recovery.blocked
    finally:
        reopened.close()


def test_many_async_sessions_sync_in_parallel_beyond_the_default_executor(
    tmp_path: Path,
) -> None:
    """Every journal's blocking steps run in one shared pool of sync threads, sized for many
    sessions, not in the loop's default executor (min(32, cores + 4) threads): 16 sessions
    must have 16 fsyncs in flight at once. Each sync waits at a barrier for all 16; with too
    few threads it would never fill, and the barrier times out."""
    from walj.journal import _aio
    from walj.log.fs import FileSystem

    sessions = 16
    assert _aio.DEFAULT_SYNC_THREADS >= sessions
    barrier = threading.Barrier(sessions, timeout=20)
    armed = threading.Event()
    names: set[str] = set()

    class Gathering(FileSystem):
        def sync(self, fd: int) -> None:
            if armed.is_set():
                names.add(threading.current_thread().name)
                barrier.wait()
            super().sync(fd)

    async def noop(k: int) -> int:
        return k

    journals = [ToolJournal.open(tmp_path / f"s{k}", tools={"noop": noop}, sync="never",
                                 _fs=Gathering()) for k in range(sessions)]

    async def session(k: int) -> str:
        async with journals[k].turn() as turn:
            result = await turn.adispatch("noop", {"k": k})  # the intent's sync gathers
        return result.outcome

    async def main() -> list[str]:
        armed.set()
        return await asyncio.gather(*(session(k) for k in range(sessions)))

    try:
        outcomes = asyncio.run(main())
    finally:
        armed.clear()
        barrier.abort()
        for journal in journals:
            journal.close()
    assert outcomes == ["ok"] * sessions
    assert len(names) >= sessions and all(n.startswith("walj-sync") for n in names), names
