"""The open journals of one integration, one per session: opened on demand, held while a run
of the session is active, closed once idle too long or to keep the number open bounded, and
released or ended on request.

`SessionJournals(root, make, ...)` keeps, per session id, the value `make(journal)` builds on
the journal `ToolJournal.open_session(root, session_id, **options)` opens (an integration's
own per-session state, which closes the journal when it closes). Rules:

- A session with an active run (`acquire` without its `done`) is never closed by idleness,
  eviction or `release`; `end` and `release` refuse it (`walj.TurnError`).
- An idle session is closed once unused for `idle_timeout` seconds: checked on every access
  (oldest first, stopping at the first that is not due) and by one daemon thread per process
  that serves every `SessionJournals`. The next use opens it again.
- At most `max_open` are open: opening one more closes the least recently used idle ones.
  Active ones are never evicted, so a burst of concurrent runs may exceed it for a while.
- A journal that another process holds (its lock is taken: another worker of a pool serving
  the same thread) is asked to release it (`walj.request_release`), then waited for, up to
  `lock_timeout` seconds in all, then `walj.LockedError`.
- Every journal is opened with `release_on_request`: such an ask from another process closes
  it at its next idle moment, never while a run of its session is active here (the registry's
  answer, atomic with handing it out). A journal so released is forgotten (closed, its entry
  dropped) at the next use or sweep, and opened again on its next use.

Opening and closing run outside the registry's lock, so one session that waits for its lock
holds up no other. A KeyboardInterrupt anywhere leaves each session either registered and
open or neither: an open interrupted before it registers closes what it opened, and a
journal being closed stays registered (marked) until it is closed, so an interrupted close is
finished before the interrupt goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Generic, Protocol, TypeVar

import walj

from ._session_open import check_settings, open_session
from ._sweeper import Sweeper

DEFAULT_IDLE_TIMEOUT = 600.0
DEFAULT_MAX_OPEN = 1024
DEFAULT_LOCK_TIMEOUT = 30.0
# The mark of an entry whose journal agreed to close itself at another process's request.
_RELEASED = object()


class _Closing:
    """The token of one call's close: which thread makes it, so a holder's own close can
    wait for it, or finish it when that thread is gone."""

    __slots__ = ("thread",)

    def __init__(self) -> None:
        self.thread = threading.current_thread()


class Held(Protocol):
    """What an integration keeps per session: the journal, and how to close it (a live turn
    first, left incomplete, as after a crash)."""

    @property
    def journal(self) -> walj.ToolJournal: ...

    def close(self) -> None: ...


H = TypeVar("H", bound=Held)


class JournalOnly:
    """What an integration with no per-session state of its own keeps: the journal."""

    __slots__ = ("journal",)

    def __init__(self, journal: walj.ToolJournal) -> None:
        self.journal = journal

    def close(self) -> None:
        self.journal.close()


class _Entry(Generic[H]):
    __slots__ = ("active", "closing", "gone", "held", "ready", "used")

    def __init__(self) -> None:
        self.held: H | None = None  # None while it is being opened
        self.ready = threading.Event()  # set once opened, or once the open failed
        self.active = 0  # runs of this session under way
        self.used = time.monotonic()
        # The token of the close under way: the entry stays registered until its journal is
        # closed, so a close cut short by an interrupt is finished by whoever holds the token.
        self.closing: object | None = None
        self.gone = threading.Event()  # set once closed and forgotten


class SessionJournals(Generic[H]):
    """The journals an integration holds, keyed by session id. Thread-safe."""

    def __init__(self, root: str | os.PathLike[str], make: Callable[[walj.ToolJournal], H], *,
                 options: Mapping[str, Any], idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT,
                 max_open: int = DEFAULT_MAX_OPEN,
                 lock_timeout: float = DEFAULT_LOCK_TIMEOUT) -> None:
        check_settings(options, idle_timeout, max_open, lock_timeout)
        self._root = os.fspath(root)
        self._make = make
        self._options = dict(options)
        self.idle_timeout = None if idle_timeout is None else float(idle_timeout)
        self.max_open = max_open
        self.lock_timeout = float(lock_timeout)
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, _Entry[H]] = OrderedDict()  # least recently used first
        self._closed = False
        self._released = 0  # entries marked _RELEASED: most accesses have none to forget
        if self.idle_timeout is not None:
            Sweeper.watch(self)

    @property
    def root(self) -> str:
        return self._root

    def open_ids(self) -> list[str]:
        """The sessions open now, least recently used first (not one released on request)."""
        with self._lock:
            return [key for key, entry in self._entries.items()
                    if entry.held is not None and entry.closing is not _RELEASED]

    # --- using ----------------------------------------------------------------------------------

    def get(self, session_id: str) -> H:
        """The session's value, opened if needed; no run is counted."""
        return self._use(session_id, 0)

    def acquire(self, session_id: str) -> H:
        """The session's value, opened if needed, with one more active run: it stays open until
        the matching `done`."""
        return self._use(session_id, 1)

    async def aacquire(self, session_id: str) -> H:
        """As `acquire`, in a worker thread (an open may wait for a lock). Cancelled, it still
        counts the run out once the worker's open finished, so nothing stays active for good."""
        future = asyncio.get_running_loop().run_in_executor(None, self.acquire, session_id)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            def count_out(done: asyncio.Future[H]) -> None:
                if not done.cancelled() and done.exception() is None:
                    self.done(session_id, done.result())
            future.add_done_callback(count_out)
            raise

    def done(self, session_id: str, held: H) -> None:
        """A run of the session ended; idle from now on once no other is active."""
        with self._lock:
            entry = self._entries.get(session_id)
            if entry is not None and entry.held is held and entry.active > 0:
                self._count(session_id, entry, -1)

    def _use(self, session_id: str, runs: int) -> H:
        self.sweep()
        mine: _Entry[H] | None = None
        try:
            while True:
                with self._lock:
                    entry = self._registered(session_id)
                    if entry is None:
                        mine = self._entries[session_id] = _Entry()
                        break
                    if entry.held is not None and entry.closing is None:
                        self._count(session_id, entry, runs)
                        return entry.held
                    waiting = (None if entry.closing is _RELEASED  # forgotten below
                               else entry.gone if entry.closing is not None  # being closed
                               else entry.ready)  # another thread opens it
                if waiting is None:
                    self._forget_released(found=True)
                else:
                    waiting.wait()  # then use what was opened, or open it again
            held = self._open(session_id, mine, runs)
        except BaseException:
            if mine is not None:
                self._abandon(session_id, mine)
            raise
        self._evict()
        return held

    def _registered(self, session_id: str) -> _Entry[H] | None:
        """Under the lock: the session's entry, None when it has none (one whose journal closed
        itself is dropped here, to be opened again); ClosedError once this holder closed."""
        self._refuse_closed()
        entry = self._entries.get(session_id)
        if (entry is not None and entry.held is not None and entry.closing is None
                and entry.held.journal.closed):
            del self._entries[session_id]
            return None
        return entry

    def _refuse_closed(self) -> None:
        if self._closed:
            raise walj.ClosedError("this integration was closed")

    def _count(self, session_id: str, entry: _Entry[H], runs: int) -> None:
        """Under the lock: `runs` more runs of the session active (fewer when negative), and
        it was used now."""
        entry.active += runs
        entry.used = time.monotonic()
        self._entries.move_to_end(session_id)

    def _open(self, session_id: str, entry: _Entry[H], runs: int) -> H:
        """Open the session registered (unopened) as `entry`, and make it usable. Whatever
        interrupts this, the entry ends either ready and open or unregistered and closed."""
        journal: walj.ToolJournal | None = None
        try:
            journal = self._open_journal(session_id)
            held = self._make(journal)
            with self._lock:
                self._refuse_closed()
                entry.held = held
                self._count(session_id, entry, runs)
            entry.ready.set()
            return held
        except BaseException:
            with self._lock:
                registered = entry.held is not None
            if not registered and journal is not None:
                _close_quietly(journal)
            raise

    def _abandon(self, session_id: str, entry: _Entry[H]) -> None:
        """An open that did not finish: forget its entry (unless it got registered), and wake
        whoever waits for it. Idempotent."""
        with self._lock:
            if entry.held is None and self._entries.get(session_id) is entry:
                del self._entries[session_id]
        entry.ready.set()

    def _open_journal(self, session_id: str) -> walj.ToolJournal:
        """The session's journal, opened to answer release requests through this holder."""
        options = {**self._options, "release_on_request": self._release_gate(session_id)}
        return open_session(self._root, session_id, options, self.lock_timeout)

    def _release_gate(self, session_id: str) -> Callable[[], bool]:
        """The journal's answer to a release request (asked under its locks when it is idle):
        yes only when it is registered and no run of the session is active or starting here
        (one being opened, or opened by `end`, is not registered: no). The yes marks the
        entry, so from then on no one is handed it. (This process holds one journal of a
        session at a time: the lock.)"""
        def may_release() -> bool:
            with self._lock:
                entry = self._entries.get(session_id)
                if entry is None or not _idle(entry):
                    return False
                entry.closing = _RELEASED
                self._released += 1
                return True
        return may_release

    def _forget_released(self, *, found: bool = False) -> None:
        """Close (finishing what the journal began) and forget the entries whose journal
        agreed to be released; `found`: one was seen, whatever the count says (an interrupt
        may have cut a pass short after it reset the count)."""
        def pick(entries: list[tuple[str, _Entry[H]]]) -> list[_Entry[H]]:
            self._released = 0  # under the lock: each one picked is closed and forgotten here
            return [e for _, e in entries if e.closing is _RELEASED]
        if not self._released and not found:
            return  # none (read without the lock: one marked meanwhile is found next time)
        try:
            self._close_picked(pick)
        except walj.WaljError:
            pass  # the journal closed itself; what its close reports again changes nothing

    def _evict(self) -> None:
        """Close idle sessions, least recently used first, until at most `max_open` are open."""
        def pick(entries: list[tuple[str, _Entry[H]]]) -> list[_Entry[H]]:
            extra = sum(1 for _, e in entries if e.held is not None and e.closing is None)
            idle = [e for _, e in entries if _idle(e)]
            return idle[:max(0, extra - self.max_open)]
        self._close_picked(pick)

    # --- closing --------------------------------------------------------------------------------

    def sweep(self) -> None:
        """Forget the sessions released on request; close those idle for `idle_timeout`
        seconds or more."""
        self._forget_released()
        if self.idle_timeout is None:
            return
        timeout = self.idle_timeout

        def pick(entries: list[tuple[str, _Entry[H]]]) -> list[_Entry[H]]:
            deadline = time.monotonic() - timeout
            due = []
            for _key, entry in entries:
                if entry.used > deadline:
                    break  # least recently used first: the rest were used later
                if _idle(entry):
                    due.append(entry)
            return due
        self._close_picked(pick)

    def _close_picked(self, pick: Callable[[list[tuple[str, _Entry[H]]]], list[_Entry[H]]],
                      ) -> None:
        """Mark the entries `pick` chooses (under the lock) as closing, close them, then forget
        them. Interrupted anywhere, what this call marked is closed and forgotten before the
        interrupt goes on."""
        token = _Closing()
        try:
            with self._lock:
                for entry in pick(list(self._entries.items())):
                    entry.closing = token
            self._finish(token)
        except BaseException:
            self._finish(token, quiet=True)
            raise

    def _finish(self, token: object, quiet: bool = False) -> None:
        """Close each entry marked with `token` (closing twice is harmless), then forget it;
        the first error is raised once all were tried."""
        with self._lock:
            marked = [(k, e) for k, e in self._entries.items() if e.closing is token]
        first: BaseException | None = None
        for key, entry in marked:
            assert entry.held is not None
            try:
                entry.held.close()
            except walj.WaljError as exc:
                first = first or exc
                _close_quietly(entry.held.journal)
            except BaseException:
                if quiet:
                    _close_quietly(entry.held.journal)
                else:
                    raise
            with self._lock:
                if self._entries.get(key) is entry:
                    del self._entries[key]
            entry.gone.set()
        if first is not None and not quiet:
            raise first

    def _refuse_active(self, session_id: str, what: str) -> Callable[
            [list[tuple[str, _Entry[H]]]], list[_Entry[H]]]:
        """A pick of the session's entry to close, refusing while a run of it is active or it
        is being opened."""
        def pick(entries: list[tuple[str, _Entry[H]]]) -> list[_Entry[H]]:
            entry = dict(entries).get(session_id)
            if entry is not None and entry.closing is _RELEASED:
                return [entry]  # released on request: finish its close here
            if entry is None or entry.closing is not None:
                return []
            if entry.held is None or entry.active:
                raise walj.TurnError(f"cannot {what} session {session_id!r}: a run of it is "
                                     "active; wait for it to end")
            return [entry]
        return pick

    def release(self, session_id: str) -> None:
        """Close the session's journal, holding nothing of it open; its next use opens it
        again. Nothing to do when it is not open."""
        self._close_picked(self._refuse_active(session_id, "release"))

    def end(self, session_id: str) -> None:
        """End the session: `session_ended` durably written (`ToolJournal.end`), then closed
        and forgotten. Its journal is opened afresh for it (waiting for its lock as a run
        does); a session that has no journal yet is left as it is. Blockers stay; its journal
        refuses new turns from now on."""
        self._close_picked(self._refuse_active(session_id, "end"))
        with self._lock:
            self._refuse_closed()
        if not walj.ToolJournal.session_path(self._root, session_id).exists():
            return  # nothing was ever journaled: nothing to end
        journal: walj.ToolJournal | None = None
        try:
            journal = self._open_journal(session_id)
            journal.end()
        except BaseException:
            if journal is not None:
                _close_quietly(journal)
            raise

    def close(self) -> None:
        """Close every journal held (a live turn is left incomplete, as after a crash), and
        wait for one another call is closing, so that every directory is let go on return.
        Idempotent; the first error is raised once all were tried."""
        with self._lock:
            self._closed = True

        def pick(entries: list[tuple[str, _Entry[H]]]) -> list[_Entry[H]]:
            return [e for _, e in entries
                    if e.held is not None and (e.closing is None or e.closing is _RELEASED)]
        self._close_picked(pick)
        self._wait_for_closes()

    def _wait_for_closes(self) -> None:
        """Return once no journal is being closed by another call (the idle sweeper's, say):
        a holder that says it is closed has let go of every directory, so it can be opened
        again at once. A close whose thread is gone, or is this one (cut short by an
        interrupt), is finished here."""
        while True:
            with self._lock:
                busy = [e for e in self._entries.values() if isinstance(e.closing, _Closing)]
            if not busy:
                return
            entry = busy[0]
            token = entry.closing
            if entry.gone.wait(0.05) or not isinstance(token, _Closing):
                continue
            if token.thread is threading.current_thread() or not token.thread.is_alive():
                self._finish(token, quiet=True)


def _idle(entry: _Entry[Any]) -> bool:
    return entry.held is not None and entry.active == 0 and entry.closing is None


def _close_quietly(journal: walj.ToolJournal) -> None:
    with contextlib.suppress(walj.WaljError):  # the exception in flight says more
        journal.close()
