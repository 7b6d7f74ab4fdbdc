"""Group commit: when appended records become durable. The Commit of a log syncs its active
segment after each write (sync="always") or for a group of waiters, in the caller or through the
process's commit service (walj/log/_commits.py), and wakes exactly the waiters a sync covered."""

from __future__ import annotations

import threading
import time
from _thread import allocate_lock
from collections import deque
from collections.abc import Callable
from typing import Any

from ..errors import ClosedError, PoisonedError, WaljError
from ._commits import Request, SyncfsService, count_waiters, service_for
from ._durability import WriterState, io_failure

GATHER_SECONDS = 0.001

_COVERED, _LEAD = "covered", "lead"


class _Waiter:
    """A thread waiting for its record's sync. Its `gate` is taken until a leader releases it,
    having set `outcome`: _COVERED (durable), _LEAD (sync for the others), or the failure that
    poisoned the log."""

    __slots__ = ("seq", "gate", "outcome")

    def __init__(self, seq: int) -> None:
        self.seq = seq
        self.gate = allocate_lock()
        self.gate.acquire()
        self.outcome: object = None  # None while queued


class Commit:
    """Syncs the active segment of a WriterState: with the lock held after each write
    (sync="always"), or as a group commit. In a group commit one thread at a time leads: it
    syncs for every record written so far, wakes only the waiters its sync covered (each on a
    lock of its own, released by the leader), and hands the lead to the first waiter whose
    record came too late for it; no thread is woken to find that it must wait again. The writer
    counts its batch appenders in `appenders`, so that a round can gather them first. The sync
    itself is made in the caller, or handed to the process's commit service
    (walj/log/_commits.py) when a commit mode other than "inline" applies.

    Interrupts (KeyboardInterrupt, SystemExit) may land between any two lines. The lead is held
    by one _Waiter (`_leader`), and every step that ends a round or leaves a queue checks the
    shared fields themselves under the lock, so that repeating it (the interrupted path calls it
    again) is harmless: an interrupted leader passes the lead on, an interrupted waiter leaves
    the queue. A sync the commit service was making when an interrupt stopped its wait poisons
    the log, since its outcome is unknown and a second sync must not stand in for it.
    """

    __slots__ = ("_state", "_gathered", "_gathering", "appenders", "_waiting", "_leader",
                 "close_failure", "mode", "_device")

    def __init__(self, state: WriterState) -> None:
        self._state = state
        self._gathered = threading.Condition(state.lock)
        self._gathering = False
        self.appenders = 0  # batch mode: appenders inside append()
        self._waiting: deque[_Waiter] = deque()  # queued for a sync, in the order they came
        self._leader: _Waiter | None = None  # the lead of the sync under way (st.syncing)
        self.close_failure: PoisonedError | None = None  # for Log.close() to raise, once
        self.mode: str | None = None  # Log.open's commit=: None is the process's mode
        self._device: Any = None  # the file system's key, once enrolled in "syncfs" rounds

    def sync_locked(self) -> None:
        """With the lock held: sync the active segment (sync="always")."""
        st = self._state
        target = st.next_seq - 1
        try:
            served = self._sync_file(st.fd)
        except OSError as exc:
            raise st.poison(exc) from exc
        except WaljError as exc:
            st.set_poison(exc)
            raise
        st.check_still_there()
        st.durable_seq = target
        if served:
            count_waiters(1)

    def _sync_file(self, fd: int) -> bool:
        """Sync `fd`: in the caller, or through the commit service (then True). An interrupt
        that stops the wait for an unfinished service sync poisons the log."""
        st = self._state
        service = service_for(self.mode)
        if service is None:
            st.fs.sync(fd)
            return False
        device = None
        if isinstance(service, SyncfsService):
            if self._device is None:  # see SyncfsService.enroll
                device = service.enroll(st.fs, st.dir)
                st.fs.sync(fd)
                self._device = device
                return False
            device = self._device
        request = Request(st.fs, fd, device)
        try:
            service.submit(request)
            request.wait()
        except BaseException:
            if not request.finished:
                abandoned = PoisonedError(
                    f"{st.dir}: a sync the commit service was making was abandoned by an "
                    f"interrupt; records after seq {st.durable_seq} may not be durable")
                st.poisoned, st.unusable = st.poisoned or abandoned, True
            raise
        return True

    def close(self, seal: Callable[[], None] | None) -> None:
        """Make what was appended durable (through `seal`, when given) and mark the state
        closed. A failure, or an earlier poisoning, is left in `close_failure`."""
        st = self._state
        with st.lock:
            while st.syncing:
                st.cond.wait()
            if st.closed:
                return
            if st.poisoned is not None:
                self.close_failure = PoisonedError(
                    f"{st.dir} was poisoned ({st.poisoned}); records after seq "
                    f"{st.durable_seq} may not be durable")
            elif seal is not None and st.fd >= 0:
                try:
                    seal()
                except PoisonedError as exc:
                    self.close_failure = exc
            elif st.fd >= 0 and st.durable_seq < st.next_seq - 1:
                try:
                    st.fs.sync(st.fd)
                    st.durable_seq = st.next_seq - 1
                except OSError as exc:
                    self.close_failure = st.poison(exc)
                    self.close_failure.__cause__ = exc
            st.closed = st.unusable = True
            st.cond.notify_all()

    def catch_up(self) -> None:
        """Make every record written so far durable, unless the log is closed (an interval)."""
        st = self._state
        if not st.closed and st.next_seq - 1 > st.durable_seq:
            self.wait_durable(st.next_seq - 1)

    def wake_gatherer(self) -> None:
        """With the lock held: wake a gathering leader only once it has nothing left to wait
        for, since every needless wake-up is a thread switch on the hot path."""
        if self._gathering and self.appenders <= len(self._waiting) + 1:
            self._gathered.notify()

    def _gather(self) -> None:
        """Before a group sync, wait (briefly) until every appender inside `append` is waiting on
        a record no sync has covered: those still writing, and those a sync just released that
        loop straight back, then share this sync instead of alternating batches of one and many.
        """
        deadline = 0.0
        self._gathering = True
        try:
            while self.appenders > len(self._waiting) + 1:
                now = time.monotonic()
                if not deadline:
                    deadline = now + GATHER_SECONDS
                elif now >= deadline:
                    return
                self._gathered.wait(deadline - now)
        finally:
            self._gathering = False

    def wait_durable(self, seq: int) -> None:
        """Group commit: lead a sync when none is under way, else queue and wait to be woken
        by the leader whose sync covered `seq`, or handed the lead."""
        st = self._state
        me = _Waiter(seq)
        try:
            with st.lock:
                if st.durable_seq >= seq:
                    return
                self._refuse()
                if st.syncing:
                    self._waiting.append(me)
                    self.wake_gatherer()
                else:  # one line: no interrupt between the three
                    st.syncing, self._leader, me.outcome = True, me, _LEAD
            if me.outcome is not _LEAD:
                me.gate.acquire()
                if me.outcome is _COVERED:
                    return
                if me.outcome is not _LEAD:
                    raise self._failure(me.outcome)
            self._lead(me)
        except BaseException:
            self._leave(me)
            raise

    def _refuse(self) -> None:
        st = self._state
        if st.poisoned is not None:
            raise PoisonedError(f"log is poisoned: {st.poisoned}")
        if st.closed:
            raise ClosedError("log is closed")

    def _lead(self, me: _Waiter) -> None:
        """One round: gather, sync everything written so far, then wake and hand on."""
        st = self._state
        with st.lock:
            self._refuse()
            self._gather()
            target, fd = st.next_seq - 1, st.fd
        failure: BaseException | None = None
        served = False
        try:
            served = self._sync_file(fd)
        except Exception as exc:  # noqa: BLE001 - an OSError, or the service's PoisonedError
            failure = exc
        with st.lock:
            if failure is None and self._leader is me:
                try:
                    st.check_still_there()
                except PoisonedError as exc:
                    failure = exc
                else:
                    st.durable_seq = max(st.durable_seq, target)
            elif failure is not None:
                self._poison_for(failure)
            woken = self._release_round(me)
        if served:
            count_waiters(woken)
        if failure is not None:
            raise self._failure(failure) from failure

    def _poison_for(self, failure: BaseException) -> None:
        st = self._state
        if isinstance(failure, OSError):
            st.poison(failure)
        else:
            st.set_poison(failure)

    def _failure(self, cause: object) -> WaljError:
        """The typed error a waiter of a failed round raises (an object of its own)."""
        st = self._state
        if isinstance(cause, OSError):
            return io_failure(st.dir, cause, "syncing")
        return PoisonedError(f"{st.dir}: log is poisoned ({cause}); records after seq "
                             f"{st.durable_seq} may not be durable")

    def _release_round(self, me: _Waiter) -> int:
        """With the lock held: end `me`'s lead. Wake every waiter the durable seq covers (all
        of them, with the cause, when the log is poisoned), then hand the lead to the first one
        left, or end the sync. Returns how many threads the round settled. Each step that
        changes shared state is one line and checks first whether it already ran, so an
        interrupt anywhere leaves it for the caller's interrupted path to repeat."""
        st = self._state
        if self._leader is not me:
            return 0
        durable, poisoned = st.durable_seq, st.poisoned
        woken = 1
        for waiter in list(self._waiting):
            if waiter.outcome is None and (waiter.seq <= durable or poisoned is not None):
                outcome, gate = _COVERED if waiter.seq <= durable else poisoned, waiter.gate
                waiter.outcome = outcome; gate.release()  # noqa: E702 - one line: no interrupt
                woken += 1
        self._waiting = deque(w for w in self._waiting if w.outcome is None)
        heir = self._waiting[0] if self._waiting and poisoned is None else None
        if heir is not None:
            gate, waiting = heir.gate, self._waiting
            waiting.popleft(); self._leader = heir; heir.outcome = _LEAD; gate.release()  # noqa: E702
        else:
            self._leader = None; st.syncing = False; st.cond.notify_all()  # noqa: E702
        return woken

    def _leave(self, me: _Waiter) -> None:
        """An interrupt or failure stopped `me`: leave the queue, or pass its lead on."""
        st = self._state
        with st.lock:
            if me.outcome is None and me in self._waiting:
                self._waiting.remove(me)
            elif self._leader is me:
                self._release_round(me)
