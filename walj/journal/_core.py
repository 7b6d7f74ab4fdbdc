"""The journal's core: the locked writer and the live-state table. Turn, LLMCall and the
resolution code talk to a journal through this one object, never through ToolJournal's
private attributes; ToolJournal is the public face that owns one."""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator, Mapping
from typing import Any, cast

from ..errors import (
    ClosedError,
    CorruptionError,
    PoisonedError,
    RecordTooLargeError,
    SerializationError,
    SessionEndedError,
    TurnError,
)
from ..log import Log, Record, read
from . import _damage, _writes
from . import records as rc
from ._checkpoint import settling_record
from ._fingerprint import Redactor
from ._observe import ToolObserver
from ._records import Recovery
from ._tools import Tool
from .state import JournalState, rebuild


class TurnSlot:
    """What the core knows of a turn: its number and whether it was abandoned (never again
    live). A turn is live exactly while the core names it as `live_turn`: there is no second
    flag for an interrupt to leave out of step."""

    def __init__(self) -> None:
        self.sequence = 0
        self.abandoned = False  # set under the core's state lock


class Core:
    """One journal's writer and live state.

    Lock order: `write_lock`, then `lock`. `write_lock` is held across every append and the
    feed of its record, so the state takes records in seq order, and across a dispatch's
    blocked check and its intent, so no intent is written while blocked. `lock` guards the
    state and the live sets, for quick readers. `resolve_lock` keeps resolutions one at a time.
    """

    def __init__(self, log: Log, state: JournalState, tools: dict[str, Tool], *,
                 arguments_chars: int, output_chars: int, redactor: Redactor,
                 store_arguments: bool, block_on_pending_llm_calls: bool,
                 stored_output_limit: int | None = None, read_options: Any = None,
                 record_limit: int = 2**20, checkpoint_every: int | None = None) -> None:
        self.log = log
        self.log_id = log.log_id
        # The log counts what it found on open as synced, though a writer killed before its
        # sync may have left it only in the page cache: a record vouches for synced records
        # (synced_through) only once this process has seen a sync.
        self.synced_floor = log.last_seq
        self.state = state
        self.tools: Mapping[str, Tool] = tools
        self.arguments_chars = arguments_chars
        self.output_chars = output_chars
        self.redactor = redactor
        self.store_arguments = store_arguments
        self.block_on_pending_llm_calls = block_on_pending_llm_calls
        # The largest output (in JSON bytes) an ok call's terminal record stores, or None when
        # outputs are not stored.
        self.stored_output_limit = stored_output_limit
        self.read_options: dict[str, Any] = dict(read_options or {})  # for walj.read
        self.record_limit = record_limit  # the log's max_record_bytes: a checkpoint part's
        self.checkpoint_every = checkpoint_every  # records between automatic checkpoints
        self.before_turn: Callable[[], None] | None = None
        self.write_lock = threading.RLock()
        self.lock = threading.Lock()
        # Reentrant: applying a resolution request holds it around the resolution it makes.
        self.resolve_lock = threading.RLock()
        # Applies pending resolution requests (set by ToolJournal.open); run before every
        # answer that depends on blockers. See _requests.pick_up.
        self.pick_up: Callable[[], None] | None = None
        # Leaves the process-wide watcher's weak set on close, so that collecting a closed
        # journal runs no weak-set callback (a Ctrl-C landing in one is dropped by CPython).
        self.unwatch: Callable[[], None] | None = None
        # Whether a `release` request from another process closes this journal when idle; a
        # callable is asked, at each idle moment, whether it may (its owner's runs, say).
        self.release_on_request: bool | Callable[[], bool] = False
        self.live: set[str] = set()  # executions whose handler may be running
        self.live_llm: set[str] = set()  # LLM calls in flight
        self.live_turn: TurnSlot | None = None
        # Terminal and ambiguous records whose execution already left the live set, written
        # before anything else under write_lock (a cancelled task cannot wait for its fsync).
        self._settlements: list[tuple[str, dict[str, Any]]] = []
        # Executions whose caller gave up while the intent was still being written: the
        # record to write once the intent lands (the handler is never called).
        self._abandoned: dict[str, dict[str, Any]] = {}
        self._beginning: set[str] = set()  # executions whose intent is being written
        # Executions whose begin was handed to a worker thread and has not started: a caller
        # that gives up first takes its reservation back, and the begin then writes nothing.
        self._reserved: set[str] = set()
        self.unknown_state: BaseException | None = None  # the state could not be rebuilt
        # Replaced whole, never changed in place, so a dispatch keeps the tuple it started with.
        self.observers: tuple[ToolObserver, ...] = ()
        self.closed = False

    # --- reading the state ----------------------------------------------------------------------

    def live_view(self) -> dict[str, Any]:
        """With `lock` held: what is in flight in this process, for the state's questions."""
        return {
            "live_executions": self.live,
            "live_turn": self.live_turn.sequence if self.live_turn is not None else None,
            "live_llm_calls": self.live_llm,
            "block_on_pending_llm_calls": self.block_on_pending_llm_calls,
        }

    def take_requests(self) -> None:
        """Apply resolution requests other processes left, before answering from the state.
        Never with write_lock held by this thread (the lock order is resolve_lock first)."""
        pick_up = self.pick_up
        if pick_up is not None and not self.closed:
            pick_up()

    def snapshot(self) -> Recovery:
        self.take_requests()
        with self.lock:
            return self.state.snapshot(**self.live_view())

    def is_blocked(self) -> bool:
        """True while dispatch would refuse: blockers, or a log that can no longer write."""
        self.take_requests()
        if self.log.poisoned or self.unknown_state is not None:
            return True
        with self.lock:
            return self.state.is_blocked(**self.live_view())

    def _blocked_now(self) -> tuple[Any, ...] | None:
        """With write_lock held: the blockers if dispatch is blocked now, else None."""
        blockers = None
        with self.lock:
            if self.state.is_blocked(**self.live_view()):
                blockers = self.state.snapshot(**self.live_view()).blockers
        return blockers

    def idle(self) -> bool:
        """With write_lock held: no turn, execution or LLM call is live or beginning."""
        with self.lock:
            return not (self.live_turn is not None or self.live or self.live_llm
                        or self._beginning or self._reserved or self._settlements)

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
        """With write_lock held: open, and no turn live (TurnError naming `what` waits)."""
        self.check_open()
        with self.lock:
            if self.live_turn is not None:
                raise TurnError(f"turn {self.live_turn.sequence} is still live; end it before "
                                f"{what}")

    def end_session(self, at: float | None = None) -> None:
        """Write session_ended (durable) unless it is there, then close sealing the log. `at`:
        the record's time when it is not now (an end written as upkeep)."""
        with self.write_lock:
            self.check_between_turns("the session")
            if self.state.ended_seq is None:
                self.write_settlements()
                self.write(_writes.session_ended_record(at), durable=True)
        self.close()

    # --- writing --------------------------------------------------------------------------------

    def write(self, record: dict[str, Any], *, durable: bool,
              on_fed: Callable[[int], None] | None = None) -> int:
        """Append one record and feed it to the recovery state, the same function a reopen uses,
        so the live view always equals what a replay would rebuild. Anything that stops the
        two from happening together (an interrupt, a failed write) rebuilds the state from the
        files. `on_fed(seq)` runs under the state lock once the record is in the state."""
        with self.write_lock:
            refused_unwritten = self.log.poisoned  # then append writes nothing
            synced = self.log.durable_seq
            if synced > self.synced_floor:
                record[rc.SYNCED_THROUGH] = synced
            try:
                data = rc.encode_record(record)  # the bytes the log writes, and a replay reads
                seq = self.log.append(record, durable=durable)
                with self.lock:
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

    def resync(self) -> None:
        """With write_lock held: rebuild the state from the log's files. A record the log may
        or may not have written is then in the state exactly when it is in the file; after a
        compaction, the replay index points into the checkpoint, not at dropped records."""
        if self.unknown_state is not None:
            return
        try:
            state = rebuild(((record.seq, record.data)
                             for record in read(self.log.path, **self.read_options)),
                            self.state.calls.window)
        except Exception as exc:  # damaged meanwhile: fail closed, refuse work until reopened
            self.unknown_state = exc
            return
        except BaseException as exc:  # a second interrupt: fail closed, and let it go on
            self.unknown_state = exc
            raise
        with self.lock:
            self.state = state

    def read_settling(self, seq: int, call_id: str) -> tuple[dict[str, Any], int]:
        """The record that settled `call_id`, which the replay index says is at `seq`, and its
        own seq: itself, or the copy a checkpoint part at `seq` carries."""
        record = self.read_record(seq)
        if record.get("kind") != rc.CHECKPOINT:
            return record, seq
        carried = settling_record(record, call_id)
        if carried is None:
            raise CorruptionError(f"checkpoint record {seq} does not carry call id "
                                  f"{call_id!r}", seq=seq, kind="journal_record")
        return carried

    def read_record(self, seq: int) -> dict[str, Any]:
        """The journal record at `seq`, read back from the log (a replay's settled call)."""
        # Closed here, not left to the garbage collector, where an interrupt in its cleanup
        # would be swallowed.
        records = cast("Generator[Record, None, None]", read(self.log.path, seq,
                                                             **self.read_options))
        try:
            record = next(records, None)
        finally:
            records.close()
        if record is not None and record.seq == seq and isinstance(record.data, dict):
            return record.data
        raise CorruptionError(f"journal record {seq} could not be read back", seq=seq,
                              kind="journal_record")

    def name_session(self, session_id: str) -> None:
        """Record the session id once (session_named); a journal recorded under another id is
        refused with ValueError, so two ids can never share one journal unnoticed."""
        with self.write_lock:
            self.check_open()
            recorded = self.state.session_id
            if recorded is None:
                self.write(_writes.session_named(session_id), durable=True)
            elif recorded != session_id:
                raise ValueError(f"the journal in {str(self.log.path)!r} belongs to session "
                                 f"{recorded!r}, not {session_id!r}")

    def record_cuts(self) -> None:
        """On open: a durable log_cut record for each cut in quarantine/ not yet recorded, so a
        cut that no crash explains blocks from now on, here and after every reopen. A crash
        between a cut and its record leaves the manifest line, and the next open records it."""
        with self.write_lock:
            for record in _damage.unrecorded(self.log.quarantined(), self.state.cuts,
                                             self.log.cut_lines, _writes.now()):
                self.write(record, durable=True)

    # --- executions -----------------------------------------------------------------------------

    def reserve(self, execution_id: str) -> None:
        """Before `begin(..., reserved=True)` is handed to another thread: until that begin
        starts, `settle_later` cancels it instead of finding nothing to settle (the intent
        would otherwise land after its caller gave up, live with nobody to settle it)."""
        with self.lock:
            self._reserved.add(execution_id)

    def begin(self, started: dict[str, Any], execution_id: str, *,
              reserved: bool = False) -> tuple[Any, ...] | None:
        """Durably write the intent and make the execution live, unless dispatch is blocked:
        then write tool_execution_blocked and return the blockers. One atomic step. With
        `reserved`, only while the reservation stands: a caller that gave up took it back."""

        def live(seq: int) -> None:
            abandoned = self._abandoned.pop(execution_id, None)
            if abandoned is None:
                self.live.add(execution_id)
            else:  # its caller gave up while the intent was written: settle it at once
                self._settlements.append((execution_id, abandoned))

        self.take_requests()
        with self.write_lock:
            try:
                with self.lock:
                    if reserved:
                        if execution_id not in self._reserved:
                            raise TurnError("the dispatch was given up before its intent was "
                                            "written; nothing was written")
                        self._reserved.discard(execution_id)
                    self._beginning.add(execution_id)
                self.check_open()
                self.write_settlements()
                blockers = self._blocked_now()
                if blockers is not None:
                    self.write(_writes.blocked_record(started, blockers), durable=False)
                    return blockers
                self.write(started, durable=True, on_fed=live)
                self.write_settlements()
                return None
            finally:
                with self.lock:
                    self._beginning.discard(execution_id)
                    self._abandoned.pop(execution_id, None)

    def end(self, execution_id: str, record: dict[str, Any]) -> None:
        """Durably write an execution's terminal record; it leaves the live set with it."""
        with self.write_lock:
            self.write_settlements()
            if execution_id not in self.state.executions:
                return  # a queued copy (its caller was cancelled) landed first
            try:
                self.write(record, durable=True,
                           on_fed=lambda seq: self.live.discard(execution_id))
            except RecordTooLargeError:  # refused before anything was written
                if "output" not in record:
                    raise
                self.write(_writes.without_output(record), durable=True,
                           on_fed=lambda seq: self.live.discard(execution_id))

    def settle_later(self, execution_id: str, record: dict[str, Any]) -> None:
        """Without waiting for any lock but the state's: the execution leaves the live set now
        (so it blocks here, as after a restart) and `record` is written before anything else.
        For an execution whose intent is still being written, once it lands."""
        with self.lock:
            if execution_id in self.live:
                self.live.discard(execution_id)
                self._settlements.append((execution_id, record))
            elif execution_id in self.state.executions:
                self._settlements.append((execution_id, record))
            elif execution_id in self._beginning:
                self._abandoned[execution_id] = record
            elif execution_id in self._reserved:
                self._reserved.discard(execution_id)  # its begin, when it runs, writes nothing
            # else its intent was never written: there is nothing to settle

    def write_settlements(self) -> None:
        """Write the queued records of executions still open, before anything else (from a
        worker thread too). Never a second terminal record: a resolution or terminal that
        came first wins. Errors leave the record queued, or poison."""
        with self.write_lock:
            while self._settlements:
                with self.lock:
                    if not self._settlements:
                        return
                    execution_id, record = self._settlements[0]
                    still_open = execution_id in self.state.executions
                if still_open and self.unknown_state is None:
                    self.write(record, durable=True)
                with self.lock:
                    if self._settlements and self._settlements[0][0] == execution_id:
                        del self._settlements[0]

    def interrupted(self, execution_id: str, exc: BaseException) -> None:
        """An interrupt or failure between an intent and its terminal record: the execution
        blocks from now on, and tool_execution_ambiguous is written (best effort, never
        raises: the interrupt in flight matters more than this record)."""
        self.settle_later(execution_id, _writes.ambiguous_record(execution_id, exc))
        try:
            self.write_settlements()
        except BaseException:  # noqa: B036 - a second interrupt or a dead log: the blocker stays
            pass

    # --- turns ----------------------------------------------------------------------------------

    def start_turn(self, turn: TurnSlot) -> int:
        """Make `turn` the live turn and write turn_started. The number and the record are
        taken under write_lock, so a turn abandoned mid-write can never share its number."""
        self.take_requests()
        with self.write_lock:
            self.check_not_ended()
            if self.live_turn is None and self.before_turn is not None:
                self.before_turn()  # the automatic checkpoint, when one is due
            with self.lock:
                if self.live_turn is not None:
                    raise TurnError(f"turn {self.live_turn.sequence} is still live; turns do "
                                    "not nest")
                if turn.abandoned:
                    raise TurnError("the turn was abandoned before it started")
                sequence = self.state.max_turn + 1
                turn.sequence = sequence
                self.live_turn = turn
            try:
                self.write(_writes.turn_record(rc.TURN_STARTED, sequence), durable=False)
            except BaseException:
                self.release_turn(turn)
                raise
            with self.lock:
                if turn.abandoned and self.live_turn is turn:
                    self.live_turn = None  # its caller was cancelled while we wrote
            return sequence

    def release_turn(self, turn: TurnSlot) -> None:
        with self.lock:
            turn.abandoned = True
            if self.live_turn is turn:
                self.live_turn = None

    def end_turn(self, turn: TurnSlot, completed: bool) -> None:
        """Write turn_completed (if completed) and end the turn. Only while it is still the
        live turn: once a cancelled exit released it, a later turn may have started, which
        this completion would pair with instead."""
        try:
            with self.write_lock:
                if completed and self.live_turn is turn:
                    self.write(_writes.turn_record(rc.TURN_COMPLETED, turn.sequence), durable=False)
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
                with self.write_lock:
                    if self.unknown_state is None and not self.log.poisoned:
                        self.write_settlements()
        finally:
            self.closed = True
            unwatch, self.unwatch = self.unwatch, None
            if unwatch is not None:
                unwatch()
            # An ended session's every segment stays sealed, even after a reopen to resolve.
            # Idempotent: a second call finishes one an interrupt stopped.
            self.log.close(seal=self.state.ended_seq is not None)
