"""One walj turn for the Agents SDK's calls: `journaled_run` brackets a `Runner.run` as one
turn, unbracketed calls share a turn that the first opens and the last closes, and
`dispatch_call` runs one call in whichever of the two is live."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from contextvars import ContextVar
from types import TracebackType
from typing import Any, Protocol

import walj


class LiveTurn(Protocol):
    """What this module needs of a walj turn (`journal.turn()`), and what `journaled_run`
    gives: the turn to dispatch in, `turn_id` and `sequence` to name it."""

    sequence: int

    @property
    def turn_id(self) -> str: ...

    async def adispatch(self, name: str, arguments: Any, *, call_id: str | None = None,
                        handler: Any = None, approval: bool | None = None
                        ) -> walj.ToolResult: ...

    async def __aenter__(self) -> Any: ...

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None: ...


# The journals whose turn a `journaled_run` holds in this context: the SDK runs each tool call
# in a task created inside `Runner.run`, and a task starts with a copy of its creator's context.
_BRACKETS: ContextVar[tuple[tuple[walj.ToolJournal, LiveTurn], ...]] = ContextVar(
    "walj_openai_agents_brackets", default=())


@asynccontextmanager
async def journaled_run(journal: walj.ToolJournal) -> AsyncIterator[LiveTurn]:
    """`async with journaled_run(journal): await Runner.run(...)`: the run is one walj turn.

    Journaled calls of `journal` made inside join it, concurrent ones too. Leaving the block
    normally writes turn_completed; leaving it by an exception (or a crash) leaves the turn
    incomplete, which blocks every later call once it held a tool call, until
    `journal.resolve_turn` (or `walj resolve PATH --turn N`). Raises `LiveTurnError` while
    another turn of the journal is live."""
    if not isinstance(journal, walj.ToolJournal):
        raise TypeError(f"journal must be a walj.ToolJournal, not {type(journal).__name__}")
    async with journal.turn() as turn:
        token = _BRACKETS.set((*_BRACKETS.get(), (journal, turn)))
        try:
            yield turn
        finally:
            _BRACKETS.reset(token)


def _bracket(journal: walj.ToolJournal) -> LiveTurn | None:
    for bracketed, turn in reversed(_BRACKETS.get()):
        if bracketed is journal:
            return turn
    return None


class _SharedTurn:
    """The turn unbracketed calls of one journal share: opened by the first, closed by the
    last. Opening and closing hold `lock`, so a call never meets a turn half open or closing."""

    def __init__(self, journal: walj.ToolJournal, loop: asyncio.AbstractEventLoop) -> None:
        self.journal = journal
        self.loop = loop
        self.lock = asyncio.Lock()
        self.turn: LiveTurn | None = None
        self.users = 0
        self.failure: BaseException | None = None  # a dispatch that raised: left incomplete

    async def acquire(self) -> LiveTurn:
        async with self.lock:
            if self.turn is None:
                turn = self.journal.turn()
                await turn.__aenter__()  # a cancelled entry leaves no live turn behind
                self.turn, self.failure = turn, None
            self.users += 1
            return self.turn

    async def release(self, failure: BaseException | None) -> None:
        # Shielded: a caller cancelled here must still count itself out, or the turn would
        # stay live for good and every later call of this journal would fail.
        await asyncio.shield(self._release(failure))

    async def _release(self, failure: BaseException | None) -> None:
        async with self.lock:
            self.users -= 1
            if failure is not None and self.failure is None:
                self.failure = failure
            if self.users or self.turn is None:
                return
            turn, self.turn = self.turn, None
            gone = self.failure
            if gone is None:
                await turn.__aexit__(None, None, None)
            else:
                await turn.__aexit__(type(gone), gone, gone.__traceback__)


_SHARED: weakref.WeakKeyDictionary[walj.ToolJournal, _SharedTurn] = weakref.WeakKeyDictionary()


def _shared(journal: walj.ToolJournal) -> _SharedTurn:
    loop = asyncio.get_running_loop()
    shared = _SHARED.get(journal)
    # An idle one made on an event loop that is gone (an earlier asyncio.run) is replaced:
    # its lock belongs to that loop.
    if shared is None or (shared.loop is not loop and shared.users == 0):
        shared = _SHARED[journal] = _SharedTurn(journal, loop)
    return shared


async def dispatch_call(journal: walj.ToolJournal, name: str, arguments: dict[str, Any],
                        call_id: str | None, tool: walj.Tool,
                        approval: bool = False) -> walj.ToolResult:
    """One call in the journal's turn: the bracket's (`journaled_run`), else the shared one.
    `approval`: the call needs a walj approval (the tool's `needs_approval`)."""
    options: dict[str, Any] = {"approval": True} if approval else {}
    turn = _bracket(journal)
    if turn is not None:
        return await turn.adispatch(name, arguments, call_id=call_id, handler=tool, **options)
    shared = _shared(journal)
    own = await shared.acquire()
    try:
        done = await own.adispatch(name, arguments, call_id=call_id, handler=tool, **options)
    except BaseException as exc:
        await shared.release(exc)
        raise
    await shared.release(None)
    return done
