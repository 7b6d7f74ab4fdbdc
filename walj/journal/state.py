"""The journal's state, rebuilt in one pass over its records: open executions, incomplete
turns, pending LLM calls, cuts, resolutions and the replay index. One entry point, `feed`,
takes each record as the log holds it; the live journal feeds the bytes it appends, and
`rebuild` feeds a log's records. Standard library only: the forensic tool runs this too."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..errors import CorruptionError, UnsupportedVersionError
from . import records as r
from ._applied import AppliedRequests
from ._approvalbook import ApprovalBook
from ._callindex import DEFAULT_REPLAY_WINDOW, CallIndex
from ._checkpoint import CheckpointLoad, decode_checkpoint, header
from ._damage import CutLedger, unrecorded
from ._openwork import OpenExecution, OpenTurn
from ._records import Resolution
from ._snapshot import StateView, _opt_str, _time
from .records import FINISHED_PREFIX, STARTED_PREFIX, peek_finished, peek_started

__all__ = ["MAX_KEEP_TURNS", "CutLedger", "JournalState", "rebuild", "unrecorded"]

# How many turn starts the state remembers, for compaction's keep_turns.
MAX_KEEP_TURNS = 1000
_BYTES = (bytes, bytearray, memoryview)


class JournalState(StateView):
    """Feed every record in log order, then take a `snapshot`.

    Memory is bounded by what is open: executions without a terminal record, turns without a
    completion, pending LLM calls, and resolutions. Finished work is forgotten as it closes,
    but for the replay index, itself bounded (CallIndex: the last `replay_window` settled
    caller-given call ids).
    """

    def __init__(self, replay_window: int = DEFAULT_REPLAY_WINDOW) -> None:
        self.executions: dict[str, OpenExecution] = {}
        self.calls = CallIndex(replay_window)  # settled caller-given call ids, for replay
        self.session_id: str | None = None
        self.turns: dict[int, OpenTurn] = {}
        self.turn_stack: list[int] = []  # unpaired turn starts, oldest first
        self.llm_calls: dict[str, tuple[Mapping[str, Any], int]] = {}
        # Pending LLM calls whose started record says `"blocks": true` (written by a journal
        # opened with block_on_pending_llm_calls=True): they block whatever the reader asks.
        self.blocking_llm_calls: set[str] = set()
        self.resolutions: list[Resolution] = []
        self.cuts = CutLedger(self.resolutions, self)  # what recovery cut, and what of it blocks
        self.requests = AppliedRequests()  # resolution requests answered (recent ones)
        self.approvals = ApprovalBook()
        self.max_turn = 0
        self.top: OpenTurn | None = None  # the latest unpaired turn start
        self.paired_turn: int | None = None  # the turn the last turn_completed completed
        self.records = 0
        self.last_seq = 0
        self.ended_seq: int | None = None  # the session_ended record's seq
        self.turn_starts: deque[int] = deque(maxlen=MAX_KEEP_TURNS)  # seqs, newest last
        # A rebuild that started at a checkpoint, while its parts are read.
        self.loading: CheckpointLoad | None = None
        # Records that begin after seq 1 (a compacted log) say nothing until a checkpoint.
        self.awaiting = False
        self._gate = True  # the first record, a load or a wait under way: see _gated
        self.from_checkpoint: int | None = None  # the checkpoint's first seq, once loaded
        self.checkpointed_records = 0  # `records` when the last checkpoint was fed
        self._handlers: dict[str, Callable[[int, Mapping[str, Any]], None]] = {
            r.TURN_STARTED: self._turn_started, r.TURN_COMPLETED: self._turn_completed,
            r.TURN_RESOLVED: self._turn_resolved, r.STARTED: self._started,
            r.FINISHED: self._finished, r.AMBIGUOUS: self._ambiguous, r.BLOCKED: self._ignore,
            r.RESOLVED: self._resolved, r.RECONCILE_FAILED: self._reconcile_failed,
            r.LLM_STARTED: self._llm_started, r.LLM_FINISHED: self._llm_finished,
            r.LLM_RESOLVED: self._llm_resolved, r.LOG_CUT: self.cuts.log_cut,
            r.LOG_CUT_RESOLVED: self._cut_resolved, r.REPLAYED: self._ignore,
            r.REFUSED: self._ignore, r.SESSION_NAMED: self._session_named,
            r.SESSION_ENDED: self._session_ended, r.CHECKPOINT: self._checkpoint,
            r.REQUEST_REFUSED: self._ignore, r.RELEASED: self._ignore,
            r.APPROVAL_REQUESTED: self.approvals.requested,
            r.APPROVAL_DECIDED: self.approvals.decided,
        }

    # --- feeding --------------------------------------------------------------------------------

    def feed(self, seq: int, data: Any) -> None:
        """Feed one record: its JSON bytes as the log holds them (what the live journal appends
        and a replay reads), or the record decoded (walj.read's form). Refuses an unknown
        contract version or kind (fail closed)."""
        if type(data) is not bytes:
            if not isinstance(data, _BYTES):
                self._feed_decoded(seq, data)
                return
            data = bytes(data)
        if self._gate and self._gated(seq, r.record_kind(data),
                                      r.first_part_id(data) is not None):
            return
        # The commonest records are read from their bytes without a decode (the rebuild's hot
        # path). Anything else, or bytes not in the written form, takes the general path, which
        # decodes the record and checks every field it uses.
        if data.startswith(FINISHED_PREFIX):
            finished = peek_finished(data)
            if finished is not None:
                self.records += 1
                self.last_seq = seq
                execution = self.executions.pop(finished[0], None)
                if execution is not None:
                    self._close(execution, seq, not finished[1])
                return
        elif data.startswith(STARTED_PREFIX):
            # The journal dispatches only in its one live turn, the latest started: look for
            # that turn's tag rather than parse the number. While an approval waits to be
            # consumed, intents are decoded: one may name it.
            top = self.top
            if (top is not None and not self.approvals.unconsumed
                    and (execution_id := peek_started(data, top.tag)) is not None):
                self.records += 1
                self.last_seq = seq
                self.executions[execution_id] = OpenExecution(data, seq, top.sequence, top)
                top.started += 1
                top.unfinished += 1
                return
        elif self._peeked_turn(seq, data):
            return
        self._feed(seq, decode_checkpoint(data) or r.decode_object(seq, data))

    def _feed_decoded(self, seq: int, record: Any) -> None:
        if self._gate and isinstance(record, dict):
            kind = record.get("kind")
            if self._gated(seq, kind if isinstance(kind, str) else None,
                           kind == r.CHECKPOINT and record.get("part") == 0):
                return
        self._feed(seq, record)

    def _peeked_turn(self, seq: int, data: bytes) -> bool:
        """turn_completed, or turn_started in its written form, taken from its bytes."""
        if data.startswith(r.TURN_COMPLETED_PREFIX):
            self.records += 1
            self.last_seq = seq
            self._pop_turn()
            return True
        started = r.peek_turn_started(data) if data.startswith(r.TURN_STARTED_PREFIX) else None
        if started is None:
            return False
        self.records += 1
        self.last_seq = seq
        self._open_turn(seq, started[0], r.time_of(started[1]))
        return True

    def _gated(self, seq: int, kind: str | None, starts_checkpoint: bool) -> bool:
        """Before the first record, and while a checkpoint loads or is awaited: True when the
        record is passed over. Records from seq 1 are the whole history: checkpoints among
        them add nothing. Records that begin later (a compacted log, or an open that starts at
        a checkpoint) take their state from the first complete checkpoint; one cut short
        (a crash while it was written) is dropped, and the wait goes on."""
        loading = self.loading
        if loading is not None:
            if kind == r.CHECKPOINT:
                return False
            if not loading.restartable:
                raise loading.incomplete(seq)
            window = self.calls.window
            self.__init__(window)  # type: ignore[misc] # what the cut-short one loaded goes
            self.awaiting = True
        elif not self.awaiting:  # the first record
            if starts_checkpoint:
                return False
            if seq <= 1:
                self._gate = False
                return False
            self.awaiting = True
        if starts_checkpoint:
            self.awaiting = False
            return False
        return True

    def _feed(self, seq: int, record: Any) -> None:
        if not isinstance(record, dict):
            raise CorruptionError(f"journal record {seq} is not a JSON object", seq=seq,
                                  kind="journal_record")
        version = record.get("version")
        if version is None and "v" in record:  # walj 0.1's short keys: contract version 1
            version = record["v"]
        kind = record.get("kind")
        if type(version) is not int or version not in r.SUPPORTED_VERSIONS:
            raise UnsupportedVersionError(
                f"journal record {seq} has contract version {r.show(version)}; this walj knows "
                f"{', '.join(str(v) for v in sorted(r.SUPPORTED_VERSIONS))} and refuses to guess",
                seq=seq, kind="unsupported_contract_version")
        handler = self._handlers.get(kind) if isinstance(kind, str) else None
        if handler is None:
            raise CorruptionError(f"journal record {seq} has unknown kind {r.show(kind)}",
                                  seq=seq, kind="journal_record")
        self.records += 1
        self.last_seq = seq
        handler(seq, record)
        if kind in r.REQUEST_ANSWERS:
            self.requests.note(record.get("request"))

    def _id(self, seq: int, record: Mapping[str, Any]) -> str:
        """The id the record is about (execution_id, llm_call_id), which it must have."""
        field = r.SUBJECT[record["kind"]]
        value = record.get(field)
        if not isinstance(value, str) or not value:
            raise CorruptionError(f"journal record {seq} ({record['kind']}) has no {field}",
                                  seq=seq, kind="journal_record")
        return value

    def _text(self, seq: int, record: Mapping[str, Any], key: str, default: Any = None) -> str:
        """A field a resolution needs (outcome, actor): a string, else the record is refused."""
        value = record.get(key, default)
        if not isinstance(value, str):
            raise CorruptionError(
                f"journal record {seq} ({record.get('kind')}) has {key} {r.show(value)}, not a "
                "string", seq=seq, kind="journal_record")
        return value

    def _ignore(self, seq: int, record: Mapping[str, Any]) -> None:
        pass

    def _session_ended(self, seq: int, record: Mapping[str, Any]) -> None:
        if self.ended_seq is None:
            self.ended_seq = seq

    def _checkpoint(self, seq: int, record: Mapping[str, Any]) -> None:
        """A rebuild that begins at a checkpoint takes its state from it; one that read the
        history before it already has that state, and only counts it."""
        checkpoint_id, part, parts, items = header(seq, record)
        loading = self.loading
        if loading is None:
            if part != 0 or self.records != 1:
                if part == parts - 1:
                    self.checkpointed_records = self.records
                return
            loading = self.loading = CheckpointLoad(checkpoint_id, parts, seq, seq > 1)
        elif checkpoint_id != loading.checkpoint_id or part != loading.next_part:
            raise loading.incomplete(seq)
        loading.apply(self, seq, part, items)
        if part == parts - 1:
            loading.finish(self, seq)
            self.loading = None
            self._gate = False
            self.from_checkpoint = loading.first_seq
            self.checkpointed_records = self.records

    def _turn_started(self, seq: int, record: Mapping[str, Any]) -> None:
        self._open_turn(seq, record.get("turn_sequence"), _time(record))

    def _open_turn(self, seq: int, sequence: Any, started_at: float | None) -> None:
        if r.turn_number(sequence) is None or sequence in self.turns:
            raise CorruptionError(f"journal record {seq} starts turn {r.show(sequence)}, which "
                                  "is not a new turn number", seq=seq, kind="journal_record")
        self.top = self.turns[sequence] = OpenTurn(sequence, seq, started_at)
        self.turn_stack.append(sequence)
        self.turn_starts.append(seq)
        self.max_turn = max(self.max_turn, sequence)

    def _turn_completed(self, seq: int, record: Mapping[str, Any]) -> None:
        self._pop_turn()

    def _pop_turn(self) -> None:
        # LIFO: a completion pairs with the latest unpaired start, whatever its timestamp, so a
        # later completed turn can never pair with (and hide) an older interrupted one.
        self.paired_turn = None
        if self.turn_stack:
            self.paired_turn = self.turn_stack.pop()
            del self.turns[self.paired_turn]
            self.top = self.turns[self.turn_stack[-1]] if self.turn_stack else None

    def _turn_resolved(self, seq: int, record: Mapping[str, Any]) -> None:
        sequence = record.get("turn_sequence")
        turn = self.turns.get(sequence) if type(sequence) is int else None
        if turn is None or turn.resolved:
            return
        outcome = self._text(seq, record, "outcome", "resolved")
        actor = self._text(seq, record, "actor")
        turn.resolved = True
        self.resolutions.append(Resolution("turn", None, turn.sequence, None, outcome, actor,
                                           _opt_str(record, "note"), _time(record), seq))

    def _started(self, seq: int, record: Mapping[str, Any]) -> None:
        execution_id = self._id(seq, record)
        self._open_execution(
            execution_id, OpenExecution(record, seq, r.turn_number(record.get("turn_sequence"))))
        if "approval_id" in record:
            self.approvals.consume(seq, record, execution_id)

    def _open_execution(self, execution_id: str, execution: OpenExecution) -> None:
        self.executions[execution_id] = execution
        turn = self.turns.get(execution.turn)  # type: ignore[arg-type]
        if turn is not None:
            turn.started += 1
            turn.unfinished += 1
            execution.open_turn = turn

    def _finished(self, seq: int, record: Mapping[str, Any]) -> None:
        execution = self.executions.pop(self._id(seq, record), None)
        if execution is not None:  # else a finish after a resolution: it changes nothing
            # A guard's ToolBlocked ends a call that never ran: not a settled call.
            self._close(execution, seq, record.get("outcome") != "blocked")

    def _close(self, execution: OpenExecution, seq: int, settled: bool,
               finished: bool = True) -> None:
        """A terminal record (`finished`) or a resolution closed `execution`, taken out of
        `executions`: its caller-given call id is indexed, or un-indexed when the call did not
        take effect. A resolution leaves its turn counting it unfinished: it settles the turn."""
        if finished and execution.open_turn is not None:
            execution.open_turn.unfinished -= 1
        raw = execution._raw
        key = r.raw_call_key(raw) if raw is not None else False
        if key is False:
            key = r.call_key(execution.record)
        if key and settled:
            self.calls.settle(key[0], key[1], seq)
        elif key:
            self.calls.unsettle(key[0])

    def _session_named(self, seq: int, record: Mapping[str, Any]) -> None:
        self.session_id = self._text(seq, record, "session_id")

    def _ambiguous(self, seq: int, record: Mapping[str, Any]) -> None:
        execution = self.executions.get(self._id(seq, record))
        if execution is not None:
            execution.state = r.STATE_AMBIGUOUS
            execution.error_type = _opt_str(record, "error_type")

    def _reconcile_failed(self, seq: int, record: Mapping[str, Any]) -> None:
        execution = self.executions.get(self._id(seq, record))
        if execution is not None:
            execution.reconcile_error = _opt_str(record, "error")

    def _resolved(self, seq: int, record: Mapping[str, Any]) -> None:
        execution_id = self._id(seq, record)
        execution = self.executions.get(execution_id)
        if execution is None:
            return
        # Checked before the execution is closed: a malformed resolution settles nothing.
        outcome, actor = self._text(seq, record, "outcome"), self._text(seq, record, "actor")
        del self.executions[execution_id]
        self._close(execution, seq, outcome in r.SETTLED_RESOLUTIONS, finished=False)
        self.resolutions.append(
            Resolution("execution", execution_id, execution.turn,
                       _opt_str(execution.record, "tool"), outcome, actor,
                       _opt_str(record, "note"), _time(record), seq, record.get("output"))
        )

    def _llm_started(self, seq: int, record: Mapping[str, Any]) -> None:
        blocks = record.get("blocks_dispatch")
        if blocks is not None and not isinstance(blocks, bool):
            # Fail closed: a blocking flag that cannot be read must not read as "does not block".
            raise CorruptionError(f"journal record {seq} has blocks_dispatch {r.show(blocks)}, "
                                  "not a boolean", seq=seq, kind="journal_record")
        call_id = self._id(seq, record)
        self.llm_calls[call_id] = (record, seq)
        if blocks:
            self.blocking_llm_calls.add(call_id)

    def _llm_finished(self, seq: int, record: Mapping[str, Any]) -> None:
        call_id = self._id(seq, record)
        self.llm_calls.pop(call_id, None)
        self.blocking_llm_calls.discard(call_id)

    def _llm_resolved(self, seq: int, record: Mapping[str, Any]) -> None:
        call_id = self._id(seq, record)
        entry = self.llm_calls.get(call_id)
        if entry is None:
            return
        outcome, actor = self._text(seq, record, "outcome"), self._text(seq, record, "actor")
        del self.llm_calls[call_id]
        self.blocking_llm_calls.discard(call_id)
        self.resolutions.append(Resolution(
            "llm_call", call_id, r.turn_number(entry[0].get("turn_sequence")), None, outcome,
            actor, _opt_str(record, "note"), _time(record), seq))

    def _cut_resolved(self, seq: int, record: Mapping[str, Any]) -> None:
        outcome, actor = self._text(seq, record, "outcome"), self._text(seq, record, "actor")
        self.cuts.resolved(seq, record, outcome, actor, _opt_str(record, "note"), _time(record))

def rebuild(records: Iterable[tuple[int, Any]], replay_window: int = DEFAULT_REPLAY_WINDOW, *,
            into: JournalState | None = None) -> JournalState:
    """The state of (seq, record) pairs in log order, each record as `JournalState.feed` takes
    it: what opening a journal, its resync after an interrupt, resolve_session and the CLI
    rebuild. The log's replay hook on open feeds the same `feed`, one record at a time. `into`:
    a state to go on feeding (the CLI keeps what it holds when a record is refused)."""
    state = JournalState(replay_window) if into is None else into
    feed = state.feed
    for seq, record in records:
        feed(seq, record)
    return state
