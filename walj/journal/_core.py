"""The journal's core: the locked writer and the live-state table, behind a handful of
operations (begin, end, settle_later, snapshot, writing, resolving, ...). Turns, LLM calls,
replay, resolution, requests and compaction use only these; its locks and in-flight sets are
its own. ToolJournal is the public face that owns one."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from ..errors import (
    ClosedError,
    PoisonedError,
    RecordTooLargeError,
    SerializationError,
    SessionEndedError,
    TurnError,
)
from ..log import Log, read
from . import _writes
from . import records as rc
from ._observe import ToolObserver
from ._options import Options
from ._records import Recovery
from ._slots import LLMSlot, TurnSlot
from .state import JournalState, rebuild

T = TypeVar("T")


class Core:
    """One journal's writer and live state. Lock order: resolving(), writing(), then the
    state lock. The write lock is held across every append and the feed of its record, so the
    state takes records in seq order, and across a dispatch's blocked check and its intent, so
    no intent is written while blocked. The state lock guards the state and the live sets, for
    quick readers. `state` is for reading: only `write` changes it (`resync` replaces it).
    """

    def __init__(self, log: Log, state: JournalState, options: Options) -> None:
        self.log = log
        self.log_id = log.log_id
        # The log counts what it found on open as synced, though a writer killed before its
        # sync may have left it only in the page cache: a record vouches for synced records
        # (synced_through) only once this process has seen a sync.
        self.synced_floor = log.last_seq
        self.state = state
        self.options = options
        self.before_turn: Callable[[], None] | None = None
        self._write_lock = threading.RLock()
        self._lock = threading.Lock()
        # Reentrant: applying a resolution request holds it around the resolution it makes.
        self._resolve_lock = threading.RLock()
        # Applies pending resolution requests before every answer that depends on blockers.
        self.pick_up: Callable[[], None] | None = None
        # Leaves the process-wide watcher's weak set on close, so that collecting a closed
        # journal runs no weak-set callback (a Ctrl-C landing in one is dropped by CPython).
        self.unwatch: Callable[[], None] | None = None
        self._live: set[str] = set()  # executions whose handler may be running
        self._live_llm: set[str] = set()  # LLM calls in flight
        self._live_turn: TurnSlot | None = None
        # Terminal and ambiguous records whose execution already left the live set, written
        # before anything else under the write lock (a cancelled task cannot wait for its fsync).
        self._queued: list[tuple[str, dict[str, Any]]] = []
        # Executions whose caller gave up while the intent was still being written: the
        # record to write once the intent lands (the handler is never called).
        self._abandoned: dict[str, dict[str, Any]] = {}
        self._beginning: set[str] = set()  # executions whose intent is being written
        # Executions whose begin a worker has not started: a caller that gives up first takes
        # its reservation back, and the begin then writes nothing.
        self._reserved: set[str] = set()
        self.unknown_state: BaseException | None = None  # the state could not be rebuilt
        # Replaced whole, never changed in place, so a dispatch keeps the tuple it started with.
        self.observers: tuple[ToolObserver, ...] = ()
        self.closed = False

    # --- reading the state ----------------------------------------------------------------------

    def _live_view(self) -> dict[str, Any]:
        """With `_lock` held: what is in flight in this process, for the state's questions."""
        return {
            "live_executions": self._live,
            "live_turn": self._live_turn.sequence if self._live_turn is not None else None,
            "live_llm_calls": self._live_llm,
            "block_on_pending_llm_calls": self.options.block_on_pending_llm_calls,
        }

    def view(self, question: Callable[[JournalState], T]) -> T:
        """`question` answered from the state, which no write changes meanwhile (keep it short)."""
        with self._lock:
            return question(self.state)

    def take_requests(self) -> None:
        """Apply resolution requests other processes left, before answering from the state.
        Never with the write lock held by this thread (the lock order is resolving first)."""
        pick_up = self.pick_up
        if pick_up is not None and not self.closed:
            pick_up()

    def snapshot(self) -> Recovery:
        self.take_requests()
        with self._lock:
            return self.state.snapshot(**self._live_view())

    def is_blocked(self) -> bool:
        """True while dispatch would refuse: blockers, or a log that can no longer write."""
        self.take_requests()
        return self.log.poisoned or self.unknown_state is not None or (
            self._blocked_now() is not None)

    def _blocked_now(self) -> tuple[Any, ...] | None:
        """With the write lock held: the blockers if dispatch is blocked now, else None."""
        blockers = None
        with self._lock:
            if self.state.is_blocked(**self._live_view()):
                blockers = self.state.snapshot(**self._live_view()).blockers
        return blockers

    def _may_be_blocked(self) -> bool:
        """Whether dispatch would refuse now: only then can a request change its answer."""
        with self._lock:
            return self.state.is_blocked(**self._live_view())

    def idle(self) -> bool:
        """With the write lock held: no turn, execution or LLM call is live or beginning."""
        with self._lock:
            return not (self._live_turn is not None or self._live or self._live_llm
                        or self._beginning or self._reserved or self._queued)

    def in_flight(self, execution_id: str) -> bool:
        """An execution or LLM call running in this process now."""
        with self._lock:
            return execution_id in self._live or execution_id in self._live_llm

    def live_turn(self) -> TurnSlot | None:
        return self._live_turn  # read without the lock: replaced whole

    def check_open(self) -> None:
        if self.closed:
            raise ClosedError("journal is closed")
        if self.unknown_state is not None:
            raise PoisonedError(f"the journal's state could not be rebuilt after an interrupt "
                                f"({self.unknown_state!r}); reopen it")

    def check_not_ended(self) -> None:
        """New work (a turn, an LLM call) is refused once the session was ended."""
        self.check_open()
        if self.state.ended_seq is not None:
            raise SessionEndedError(
                f"the session in {self.log.path} was ended (record {self.state.ended_seq}); it "
                "takes no new turn or LLM call. Start a new session; blockers may still be "
                "resolved")

    def check_between_turns(self, what: str) -> None:
        """With the write lock held: open, and no turn live (TurnError naming `what` waits)."""
        self.check_open()
        with self._lock:
            if self._live_turn is not None:
                raise TurnError(f"turn {self._live_turn.sequence} is still live; end it before "
                                f"{what}")

    def replace_observers(self,
                          change: Callable[[tuple[ToolObserver, ...]], tuple[ToolObserver, ...]]
                          ) -> None:
        """A new tuple: a dispatch under way keeps the one it started with."""
        with self._lock:
            self.observers = change(self.observers)

    # --- writing --------------------------------------------------------------------------------

    # `with core.resolving(), core.writing():` in that order. Locks themselves, not Python
    # context managers, so that an interrupt cannot land between a block's end and the release.
    def writing(self) -> threading.RLock:
        """One writer: no other record is written while the block runs (reentrant)."""
        return self._write_lock

    def resolving(self) -> threading.RLock:
        """One resolution at a time (reentrant: a request's apply holds it around its own)."""
        return self._resolve_lock

    def write(self, record: dict[str, Any], *, durable: bool,
              on_fed: Callable[[int], None] | None = None) -> int:
        """Append one record and feed it to the recovery state, the same function a reopen uses,
        so the live view always equals what a replay would rebuild. Anything that stops the
        two from happening together (an interrupt, a failed write) rebuilds the state from the
        files. `on_fed(seq)` runs under the state lock once the record is in the state. A live
        turn's pending turn_started goes first, in the same write (pending: the state lacks it,
        so an interrupt can neither lose it nor write it twice)."""
        with self._write_lock:
            refused_unwritten = self.log.poisoned  # then append writes nothing
            synced = self.log.durable_seq
            if synced > self.synced_floor:
                record[rc.SYNCED_THROUGH] = synced
            turn = self._live_turn
            try:
                data = rc.encode_record(record)  # the bytes the log writes, and a replay reads
                if (turn is not None and turn.sequence > self.state.max_turn
                        and record is not turn.start_record):
                    seq = self._write_with_turn_start(turn, data, durable, synced)
                else:
                    seq = self.log.append_encoded(data, durable=durable)
                with self._lock:
                    self.state.feed(seq, data)
                    if on_fed is not None:
                        on_fed(seq)
            except (SerializationError, RecordTooLargeError, ClosedError):
                raise  # refused before anything was written
            except BaseException:
                if not refused_unwritten:
                    self.resync()
                raise
            return seq

    def _write_with_turn_start(self, turn: TurnSlot, data: bytes, durable: bool,
                               synced: int) -> int:
        """turn_started, then `data`, in one write; feeds the first, returns the second's seq."""
        start = turn.start_record
        assert start is not None  # set before the turn is made live
        if synced > self.synced_floor:
            start[rc.SYNCED_THROUGH] = synced
        head = rc.encode_record(start)
        seq = self.log.append_encoded(head, data, durable=durable)
        with self._lock:
            self.state.feed(seq - 1, head)
        return seq

    def resync(self) -> None:
        """With write_lock held: rebuild the state from the log's files. A record the log may
        or may not have written is then in the state exactly when it is in the file; after a
        compaction, the replay index points into the checkpoint, not at dropped records."""
        if self.unknown_state is not None:
            return
        try:
            state = rebuild(((record.seq, record.data)
                             for record in read(self.log.path, **self.options.read_options)),
                            self.state.calls.window)
        except Exception as exc:  # damaged meanwhile: fail closed, refuse work until reopened
            self.unknown_state = exc
            return
        except BaseException as exc:  # a second interrupt: fail closed, and let it go on
            self.unknown_state = exc
            raise
        with self._lock:
            self.state = state

    # --- executions -----------------------------------------------------------------------------

    def reserve(self, execution_id: str) -> None:
        """Before `begin(..., reserved=True)` is handed to another thread: until that begin
        starts, `settle_later` cancels it instead of finding nothing to settle (the intent
        would otherwise land after its caller gave up, live with nobody to settle it)."""
        with self._lock:
            self._reserved.add(execution_id)

    def begin(self, started: dict[str, Any], execution_id: str, *, reserved: bool = False,
              admit: Callable[[], Any] | None = None) -> Any:
        """Durably write the intent and make the execution live, unless dispatch is blocked
        (then write tool_execution_blocked and return the blockers) or `admit()` answers
        (an approval's answer, returned). One atomic step. With `reserved`, only while the
        reservation stands: a caller that gave up took it back."""

        def live(seq: int) -> None:
            abandoned = self._abandoned.pop(execution_id, None)
            if abandoned is None:
                self._live.add(execution_id)
            else:  # its caller gave up while the intent was written: settle it at once
                self._queued.append((execution_id, abandoned))

        if self._may_be_blocked():  # only then can a request change this answer
            self.take_requests()
        with self._write_lock:
            try:
                with self._lock:
                    if reserved:
                        if execution_id not in self._reserved:
                            raise TurnError("the dispatch was given up before its intent was "
                                            "written; nothing was written")
                        self._reserved.discard(execution_id)
                    self._beginning.add(execution_id)
                self.check_open()
                self.write_queued()
                blockers = self._blocked_now()
                if blockers is not None:
                    self.write(_writes.blocked_record(started, blockers), durable=False)
                    return blockers
                if admit is not None and (answer := admit()) is not None:
                    return answer
                self.write(started, durable=True, on_fed=live)
                self.write_queued()
                return None
            finally:
                with self._lock:
                    self._beginning.discard(execution_id)
                    self._abandoned.pop(execution_id, None)

    def end(self, execution_id: str, record: dict[str, Any]) -> None:
        """Durably write an execution's terminal record; it leaves the live set with it."""
        with self._write_lock:
            self.write_queued()
            if execution_id not in self.state.executions:
                return  # a queued copy (its caller was cancelled) landed first
            try:
                self.write(record, durable=True,
                           on_fed=lambda seq: self._live.discard(execution_id))
            except RecordTooLargeError:  # refused before anything was written
                if "output" not in record:
                    raise
                self.write(_writes.without_output(record), durable=True,
                           on_fed=lambda seq: self._live.discard(execution_id))

    def settle_later(self, execution_id: str, record: dict[str, Any]) -> None:
        """Without waiting for any lock but the state's: the execution leaves the live set now
        (so it blocks here, as after a restart) and `record` is written before anything else.
        For an execution whose intent is still being written, once it lands."""
        with self._lock:
            if execution_id in self._live:
                self._live.discard(execution_id)
                self._queued.append((execution_id, record))
            elif execution_id in self.state.executions:
                self._queued.append((execution_id, record))
            elif execution_id in self._beginning:
                self._abandoned[execution_id] = record
            elif execution_id in self._reserved:
                self._reserved.discard(execution_id)  # its begin, when it runs, writes nothing
            # else its intent was never written: there is nothing to settle

    def write_queued(self) -> None:
        """Write the queued records of executions still open, before anything else (from a
        worker thread too). Never a second terminal record: a resolution or terminal that
        came first wins. Errors leave the record queued, or poison."""
        with self._write_lock:
            while self._queued:
                with self._lock:
                    if not self._queued:
                        return
                    execution_id, record = self._queued[0]
                    still_open = execution_id in self.state.executions
                if still_open and self.unknown_state is None:
                    self.write(record, durable=True)
                with self._lock:
                    if self._queued and self._queued[0][0] == execution_id:
                        del self._queued[0]

    # --- LLM calls ------------------------------------------------------------------------------

    def start_llm(self, call: LLMSlot, record: dict[str, Any]) -> None:
        """Write llm_call_started; the call is in flight from then on, unless it left."""

        def live(seq: int) -> None:
            if not call.abandoned:
                self._live_llm.add(call.llm_call_id)

        self.write(record, durable=False, on_fed=live)

    def leave_llm(self, call: LLMSlot) -> None:
        """Not in flight any more, in this process; idempotent."""
        with self._lock:
            call.abandoned = True
            self._live_llm.discard(call.llm_call_id)

    # --- turns ----------------------------------------------------------------------------------

    def start_turn(self, turn: TurnSlot) -> int:
        """Make `turn` the live turn, its turn_started pending: Core.write writes it with the
        turn's first record, so a turn's first call costs one write and one sync. The number
        is taken under the write lock, from the state, which has every earlier turn."""
        self.take_requests()
        with self._write_lock:
            self.check_not_ended()
            if self._live_turn is None and self.before_turn is not None:
                self.before_turn()  # the automatic checkpoint, when one is due
            with self._lock:
                if self._live_turn is not None:
                    raise TurnError(f"turn {self._live_turn.sequence} is still live; turns do "
                                    "not nest")
                if turn.abandoned:
                    raise TurnError("the turn was abandoned before it started")
                sequence = self.state.max_turn + 1
                turn.sequence = sequence
                turn.start_record = _writes.turn_record(rc.TURN_STARTED, sequence)
                self._live_turn = turn
            return sequence

    def release_turn(self, turn: TurnSlot) -> None:
        with self._lock:
            turn.abandoned = True
            if self._live_turn is turn:
                self._live_turn = None

    def end_turn(self, turn: TurnSlot, completed: bool) -> None:
        """Write turn_completed (if completed) and end the turn; a turn left by an exception
        before its turn_started was written writes that alone (an incomplete turn, as it
        always was). Only while it is still the live turn: once a cancelled exit released it,
        a later turn may have started, which this completion would pair with instead."""
        try:
            with self._write_lock:
                if self._live_turn is turn:
                    if completed:
                        self.write(_writes.turn_record(rc.TURN_COMPLETED, turn.sequence),
                                   durable=False)
                    elif (turn.start_record is not None and not self.log.poisoned
                          and turn.sequence > self.state.max_turn):
                        # Left by an exception before its first record: it reads as an
                        # incomplete turn, as it always did. Never masks that exception.
                        with contextlib.suppress(Exception):
                            self.write(turn.start_record, durable=False)
                self.release_turn(turn)
        except BaseException:
            self.release_turn(turn)
            raise

    # --- closing --------------------------------------------------------------------------------

    def close(self) -> None:
        """Write what is queued, then close the log (syncing what was appended). Idempotent;
        raises PoisonedError (once) if the log was poisoned."""
        try:
            if not self.closed:
                with self._write_lock:
                    if self.unknown_state is None and not self.log.poisoned:
                        self.write_queued()
        finally:
            self.closed = True
            unwatch, self.unwatch = self.unwatch, None
            if unwatch is not None:
                unwatch()
            # An ended session's every segment stays sealed, even after a reopen to resolve.
            # Idempotent: a second call finishes one an interrupt stopped.
            self.log.close(seal=self.state.ended_seq is not None)
