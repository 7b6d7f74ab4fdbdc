"""Interrupts in the approval paths: a KeyboardInterrupt at any line of asking for, deciding,
consuming or applying an approval request, and a cancellation of an async dispatch at any of
its awaits, leave the journal's approvals and blockers equal to a replay of its log; no
approval is consumed twice and no handler runs without one."""

from __future__ import annotations

import asyncio
import collections
import functools
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from journal_helpers import Recorder, records

# The torture suite's budget and injection, under the names its own modules import them by (so
# one seed and one budget serve the whole run, whichever folder is collected first).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "torture"))
from budget import rng_for, scaled  # noqa: E402
from interrupts import Injection  # noqa: E402

import walj
from walj.journal import records as rc
from walj.journal._aio import sync_pool
from walj.journal._requests import request_fields
from walj.journal.state import rebuild
from walj.log import post_request

# Every line of these is interrupted; the rest of a path's lines (the log's write, the core's
# locks, the request pick-up) are sampled, as the interrupt torture covers them for every
# dispatch and resolution.
OWN = ("_approvals.py", "_approvalbook.py")
SAMPLED = scaled(12)
# Cancellations: at each of the first loop steps of an async dispatch, then spread out.
STEP_SPREAD = scaled(4)


class Session:
    """One journal whose tool needs approval, checked against a replay after each step."""

    def __init__(self, path: Path) -> None:
        self.path, self.send = path, Recorder("sent")
        self.journal = self._open()
        self.n = 0

    def _open(self) -> walj.ToolJournal:
        return walj.ToolJournal.open(self.path, tools={"send": walj.Tool(self.send,
                                                                         approval=True)})

    def dispatch(self, call_id: str) -> walj.ToolResult:
        with self.journal.turn() as turn:
            return turn.dispatch("send", {"to": call_id}, call_id=call_id)

    def asked(self) -> str:
        """A new call id with a pending request; its approval id."""
        self.n += 1
        approval_id = self.dispatch(f"c{self.n}").approval_id
        assert approval_id is not None
        return approval_id

    def check(self) -> None:
        """The live state equals a replay; then every blocker is settled for the next step."""
        core = self.journal._core
        if core.unknown_state is not None or core.log.poisoned:
            self.journal.close()
            self.journal = self._open()
        live = self.journal.recovery  # also applies any request file left
        replayed = rebuild((r.seq, r.data) for r in walj.read(self.path))
        assert core.state.approvals.entries == replayed.approvals.entries
        assert live.blockers == replayed.snapshot().blockers
        named = [r["approval_id"] for r in records(self.path)
                 if r["kind"] == rc.STARTED and "approval_id" in r]
        assert max(collections.Counter(named).values(), default=0) <= 1
        assert len(self.send.calls) <= len(named)
        for blocker in live.blockers:
            if blocker.execution_id is not None:
                self.journal.resolve(blocker.execution_id, "not_performed", actor="ann@ops")
            else:
                self.journal.resolve_turn(blocker.turn_sequence, actor="ann@ops")


def _interrupt_every_line(session: Session, prepare: Callable[[], Any],
                          step: Callable[[Any], Any]) -> int:
    """`step(prepare())` interrupted once at each line of the approval modules on its path and
    at a sample of its other lines, each time in a fresh call; the number of trials."""
    counting = Injection("count")
    counting.call(functools.partial(step, prepare()))
    session.check()
    own = {point: None for point in counting.events if point[0].endswith(OWN)}
    rng = rng_for(f"approvals-{len(counting.events)}")
    others = rng.sample(range(1, counting.count + 1), min(SAMPLED, counting.count))
    trials = [Injection("raise", point=point, exc_type=KeyboardInterrupt) for point in own]
    trials += [Injection("raise", index=n, exc_type=KeyboardInterrupt) for n in others]
    for injection in trials:
        try:
            injection.call(functools.partial(step, prepare()))
        except KeyboardInterrupt as exc:
            assert injection.matches(exc)
        assert injection.fired, injection.describe()
        session.check()
    return len(own)


def _approved(session: Session) -> str:
    approval_id = session.asked()
    session.journal.approve(approval_id, actor="ann@ops")
    return f"c{session.n}"


def _requested(session: Session) -> str:
    approval_id = session.asked()
    post_request(session.path, request_fields("approve", approval_id, None, None, "ann@ops",
                                              time.time()))
    return approval_id


@pytest.mark.parametrize("path_name", ["ask", "approve", "deny", "consume", "live_request"])
def test_an_interrupt_at_any_line_of_an_approval_path_leaves_the_state_of_a_replay(
        tmp_path: Path, path_name: str) -> None:
    session = Session(tmp_path / "j")
    journal = session.journal
    counter = iter(range(1, 10**6))
    paths: dict[str, tuple[Callable[[], Any], Callable[[Any], Any]]] = {
        "ask": (lambda: f"new{next(counter)}", session.dispatch),
        "approve": (session.asked, lambda a: journal.approve(a, actor="ann@ops")),
        "deny": (session.asked, lambda a: journal.deny(a, actor="ann@ops", note="no")),
        "consume": (lambda: _approved(session), session.dispatch),
        "live_request": (lambda: _requested(session), lambda a: session.journal.approval(a)),
    }
    assert _interrupt_every_line(session, *paths[path_name]) >= 3  # its own lines were hit
    session.journal.close()


def test_a_cancellation_at_any_await_of_an_async_approved_dispatch_leaves_a_replay(
        tmp_path: Path) -> None:
    session = Session(tmp_path / "j")

    async def dispatch(call_id: str) -> walj.ToolResult:
        async with session.journal.turn() as turn:
            return await turn.adispatch("send", {"to": call_id}, call_id=call_id)

    async def cancelled_after(steps: int, call_id: str) -> bool:
        task = asyncio.ensure_future(dispatch(call_id))
        for _ in range(steps):
            await asyncio.sleep(0)
            if task.done():
                break
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return True
        return False

    steps = trials = 0
    while True:
        call_id = _approved(session)
        cancelled = asyncio.run(cancelled_after(steps, call_id))
        sync_pool().drain()  # the worker's step runs to its end
        session.check()
        if not cancelled:
            break
        trials += 1
        steps += 1 + steps // STEP_SPREAD  # every early await, then a spread of later ones
    assert trials >= 5
    session.journal.close()
