"""Reading checkpoints: a rebuild that starts at the last checkpoint instead of the first
record takes the state from its parts (written by _checkpoint_parts). Standard library only
(the forensic tool reads them too); with msgspec, a part in its written form is decoded by
typed decoders (decode_checkpoint). The record's fields are in docs/RECOVERY.md,
"Checkpoints"."""

from __future__ import annotations

import base64
import binascii
import re
import zlib
from collections.abc import Callable, Mapping
from typing import Any

from .. import _codec
from ..errors import CorruptionError
from ._callindex import FILTER_BYTES
from ._openwork import OpenExecution, OpenTurn
from ._records import Cut, Resolution
from .records import CHECKPOINT, decode_record, show, turn_number

# The state is a state.JournalState, typed `Any` here: that module imports this one.
JournalState = Any

_ID = re.compile(r"[0-9a-f]{32}")


class IncompleteCheckpointError(CorruptionError):
    """A rebuild that started at a checkpoint found it cut short (a crash while it was being
    written): the journal then starts from an earlier one."""

    def __init__(self, message: str, checkpoint_id: str, seq: int | None) -> None:
        super().__init__(message, seq=seq, kind="incomplete_checkpoint")
        self.checkpoint_id = checkpoint_id


# --- decoding a part in its written form ---------------------------------------------------------
#
# The result is the record the general decoder gives (records.decode_object), with each
# settled_calls item a SettledColumns. Anything else (no msgspec, another shape, bad JSON,
# nesting to be measured) gives None: the record takes the general path, which refuses it
# exactly.

try:  # the forensic zipapp runs without msgspec: every record then takes the general path
    import msgspec
except ImportError:  # pragma: no cover - exercised by the zipapp tests
    msgspec = None  # type: ignore[assignment]

# The item's key is written first (docs/RECOVERY.md, "Checkpoints").
_SETTLED_PREFIX = b'{"item":"settled_calls",'
_KIND_PREFIX = b'{"kind":"%s",' % CHECKPOINT.encode()
# A record nests the items list in itself and each item in that list.
_ITEM_DEPTH = _codec.MAX_DEPTH - 2


class SettledColumns(dict[str, Any]):
    """A settled_calls item as decoded here: call_ids, arguments_sha256 and settlings (when
    present) are lists of str, settlings_zlib (when present) a str, settled_seqs a list of
    int (their lengths and values still to be checked)."""

    __slots__ = ()


if msgspec is not None:

    class _Part(msgspec.Struct, forbid_unknown_fields=True):
        kind: str
        version: int
        checkpoint_id: str
        part: int
        parts: int
        at: int | float | None
        items: list[msgspec.Raw]
        synced_through: int | None | msgspec.UnsetType = msgspec.UNSET

    class _Columns(msgspec.Struct, forbid_unknown_fields=True):
        item: str
        call_ids: list[str]
        arguments_sha256: list[str]
        settled_seqs: list[int]
        settlings: list[str] | msgspec.UnsetType = msgspec.UNSET
        settlings_zlib: str | msgspec.UnsetType = msgspec.UNSET

    _part = msgspec.json.Decoder(_Part).decode
    _columns = msgspec.json.Decoder(_Columns).decode
    _ERRORS: tuple[type[Exception], ...] = (msgspec.DecodeError, RecursionError, ValueError)


def _general(data: bytes, depth: int) -> tuple[Any, bool]:
    """A value decoded as the general decoder does, and whether it nests at most `depth`."""
    value = _codec.decode(data)
    if data.count(b"[") + data.count(b"{") > depth and _codec._depth(value) > depth:
        return value, False
    return value, True


def _item(raw: msgspec.Raw) -> Any:
    """One item of the items list, or None when the general path must take the record."""
    if memoryview(raw)[:len(_SETTLED_PREFIX)] == _SETTLED_PREFIX:
        found = _columns(raw)
        columns = SettledColumns(item=found.item, call_ids=found.call_ids,
                                 arguments_sha256=found.arguments_sha256,
                                 settled_seqs=found.settled_seqs)
        if found.settlings is not msgspec.UNSET:
            columns["settlings"] = found.settlings
        if found.settlings_zlib is not msgspec.UNSET:
            columns["settlings_zlib"] = found.settlings_zlib
        return columns
    value, shallow = _general(bytes(raw), _ITEM_DEPTH)
    return value if shallow and isinstance(value, dict) else None


def decode_checkpoint(data: bytes) -> dict[str, Any] | None:
    """The checkpoint record `data` decoded, or None when it is not in its written form (or
    anything in it is not what a checkpoint writes): the general decoder then reads it."""
    if msgspec is None or not data.startswith(_KIND_PREFIX):
        return None
    try:
        part = _part(data)
        items = [_item(item) for item in part.items]
    except _ERRORS:
        return None
    if None in items:
        return None
    record = {"kind": part.kind, "version": part.version, "checkpoint_id": part.checkpoint_id,
              "part": part.part, "parts": part.parts, "at": part.at, "items": items}
    if part.synced_through is not msgspec.UNSET:
        record["synced_through"] = part.synced_through
    return record


# --- reading -------------------------------------------------------------------------------------

def _bad(seq: int, why: str) -> CorruptionError:
    return CorruptionError(f"journal record {seq} (checkpoint) {why}", seq=seq,
                           kind="journal_record")


def _get(item: Mapping[str, Any], key: str, seq: int, check: Callable[[Any], bool],
         what: str) -> Any:
    value = item.get(key)
    if not check(value):
        raise _bad(seq, f"has {item.get('item')} {key} {show(value)}, not {what}")
    return value


def _int(value: Any) -> bool:
    return type(value) is int and value >= 0


def _opt_int(value: Any) -> bool:
    return value is None or _int(value)


def _str(value: Any) -> bool:
    return isinstance(value, str) and bool(value)


def _opt_str(value: Any) -> bool:
    return value is None or isinstance(value, str)


def _opt_time(value: Any) -> bool:
    return value is None or type(value) in (int, float)


def _strs(value: Any) -> bool:
    return isinstance(value, list) and all(type(v) is str and v for v in value)


def _ints(value: Any) -> bool:
    return isinstance(value, list) and all(_int(v) for v in value)


def _decoded(item: Mapping[str, Any], key: str, seq: int) -> dict[str, Any]:
    text = _get(item, key, seq, _str, "a record's JSON text")
    try:
        record = decode_record(text.encode("utf-8", "surrogatepass"))
    except ValueError as exc:
        raise _bad(seq, f"carries a {key} record that is not JSON: {exc}") from None
    if not isinstance(record, dict):
        raise _bad(seq, f"carries a {key} record that is not a JSON object")
    return record


def header(seq: int, record: Mapping[str, Any]) -> tuple[str, int, int, list[Any]]:
    """(checkpoint id, part, parts, items) of a checkpoint record, checked."""
    checkpoint_id = _get(record, "checkpoint_id", seq, lambda v: isinstance(v, str)
                         and _ID.fullmatch(v) is not None, "32 hex digits")
    parts = _get(record, "parts", seq, lambda v: _int(v) and v >= 1, "a count")
    part = _get(record, "part", seq, lambda v: _int(v) and v < parts, f"a part below {parts}")
    items = _get(record, "items", seq, lambda v: isinstance(v, list)
                 and all(isinstance(i, dict) for i in v), "a list of objects")
    return checkpoint_id, part, parts, items


class CheckpointLoad:
    """A rebuild starting at a checkpoint: its parts, applied to a fresh state in order."""

    def __init__(self, checkpoint_id: str, parts: int, first_seq: int,
                 restartable: bool) -> None:
        self.checkpoint_id = checkpoint_id
        # Begun after seq 1: if it was cut short, the rebuild waits for a later one.
        self.restartable = restartable
        self.parts = parts
        self.next_part = 0
        self.first_seq = first_seq
        self.links: list[tuple[OpenExecution, int]] = []
        self.filter = bytearray()
        self.wants_filter = False

    def incomplete(self, seq: int | None) -> IncompleteCheckpointError:
        return IncompleteCheckpointError(
            f"checkpoint {self.checkpoint_id} (from record {self.first_seq}) ends after "
            f"{self.next_part} of its {self.parts} parts", self.checkpoint_id, seq)

    def apply(self, state: JournalState, seq: int, part: int, items: list[Any]) -> None:
        for item in items:
            kind = item.get("item")
            if part == 0 and item is items[0]:
                if kind != "summary":
                    raise _bad(seq, "does not begin with its summary")
                self._summary(state, seq, item)
                continue
            load = _LOADERS.get(kind) if isinstance(kind, str) else None
            if load is None:
                raise _bad(seq, f"has an item of unknown kind {show(kind)}")
            load(self, state, seq, item)
        self.next_part = part + 1

    def finish(self, state: JournalState, seq: int) -> None:
        if sorted(state.turns) != sorted(state.turn_stack):
            raise _bad(seq, "does not carry each of its open turns once")
        for execution, turn_seq in self.links:
            turn = state.turns.get(execution.turn) if execution.turn is not None else None
            if turn is not None and turn.seq == turn_seq:
                execution.open_turn = turn
        if self.wants_filter:
            try:
                state.calls.load_filter(zlib.decompress(self.filter, bufsize=FILTER_BYTES))
            except (zlib.error, ValueError) as exc:
                raise _bad(seq, f"carries a filter that cannot be read: {exc}") from None
        state.top = state.turns[state.turn_stack[-1]] if state.turn_stack else None

    def _summary(self, state: JournalState, seq: int, item: Mapping[str, Any]) -> None:
        state.records = _get(item, "covers_records", seq, _int, "a count") + 1
        state.session_id = _get(item, "session_id", seq, _opt_str, "a string")
        state.ended_seq = _get(item, "ended_seq", seq, _opt_int, "a seq")
        state.max_turn = _get(item, "max_turn", seq, _int, "a turn number")
        state.paired_turn = _get(item, "paired_turn", seq, _opt_int, "a turn number")
        stack = _get(item, "turn_stack", seq, _ints, "a list of turn numbers")
        state.turn_stack = list(stack)
        state.turn_starts.extend(_get(item, "turn_starts", seq, _ints, "a list of seqs"))
        blocking = _get(item, "blocking_llm_calls", seq, lambda v: isinstance(v, list)
                        and all(_str(c) for c in v), "a list of ids")
        state.blocking_llm_calls = set(blocking)
        self.wants_filter = _get(item, "forgotten_calls", seq, lambda v: type(v) is bool,
                                 "a boolean")

    def _turn(self, state: JournalState, seq: int, item: Mapping[str, Any]) -> None:
        sequence = _get(item, "turn_sequence", seq, lambda v: turn_number(v) is not None,
                        "a turn number")
        if sequence not in state.turn_stack or sequence in state.turns:
            raise _bad(seq, f"carries turn {sequence}, not one of its open turns once")
        turn = OpenTurn(sequence, _get(item, "seq", seq, _int, "a seq"),
                        _get(item, "started_at", seq, _opt_time, "a time"))
        turn.started = _get(item, "started", seq, _int, "a count")
        turn.unfinished = _get(item, "unfinished", seq, _int, "a count")
        turn.resolved = _get(item, "resolved", seq, lambda v: type(v) is bool, "a boolean")
        state.turns[sequence] = turn

    def _execution(self, state: JournalState, seq: int, item: Mapping[str, Any]) -> None:
        execution_id = _get(item, "execution_id", seq, _str, "an id")
        execution = OpenExecution(_decoded(item, "started", seq),
                                  _get(item, "seq", seq, _int, "a seq"),
                                  _get(item, "turn", seq, _opt_int, "a turn number"))
        execution.state = _get(item, "state", seq, _str, "a state")
        execution.error_type = _get(item, "error_type", seq, _opt_str, "a string")
        execution.reconcile_error = _get(item, "reconcile_error", seq, _opt_str, "a string")
        linked = _get(item, "open_turn_seq", seq, _opt_int, "a seq")
        if linked is not None:
            self.links.append((execution, linked))
        state.executions[execution_id] = execution

    def _llm_call(self, state: JournalState, seq: int, item: Mapping[str, Any]) -> None:
        call_id = _get(item, "llm_call_id", seq, _str, "an id")
        state.llm_calls[call_id] = (_decoded(item, "started", seq),
                                    _get(item, "seq", seq, _int, "a seq"))

    def _cut(self, state: JournalState, seq: int, item: Mapping[str, Any]) -> None:
        cut = Cut(_get(item, "quarantine_file", seq, _str, "a name"),
                  _get(item, "segment", seq, _str, "a name"),
                  _get(item, "offset", seq, _int, "an offset"),
                  _get(item, "length", seq, _int, "a length"),
                  _get(item, "kind", seq, _str, "a kind"),
                  _get(item, "records", seq, _int, "a count"),
                  _get(item, "explained", seq, lambda v: type(v) is bool, "a boolean"),
                  _get(item, "reason", seq, _opt_str, "a string"),
                  _get(item, "seq", seq, _int, "a seq"),
                  _get(item, "resolved", seq, lambda v: type(v) is bool, "a boolean"))
        state.cuts.cuts[cut.quarantine_file] = cut
        if not cut.explained and not cut.resolved:
            state.cuts.damage[cut.quarantine_file] = cut

    def _resolution(self, state: JournalState, seq: int, item: Mapping[str, Any]) -> None:
        state.resolutions.append(Resolution(
            _get(item, "resolution_kind", seq, _str, "a kind"),
            _get(item, "execution_id", seq, _opt_str, "an id"),
            _get(item, "turn_sequence", seq, _opt_int, "a turn number"),
            _get(item, "tool", seq, _opt_str, "a name"),
            _get(item, "outcome", seq, _str, "an outcome"),
            _get(item, "actor", seq, _str, "an actor"),
            _get(item, "note", seq, _opt_str, "a note"),
            _get(item, "at", seq, _opt_time, "a time"),
            _get(item, "seq", seq, _int, "a seq"), item.get("output")))

    def _settled_calls(self, state: JournalState, seq: int, item: Mapping[str, Any]) -> None:
        # The settling records' text is decoded only when a call is replayed.
        if not _well_formed(item):
            _check_settled(item, seq)  # raises, naming the first column that is not
        state.calls.settle_many(item["call_ids"], item["arguments_sha256"], seq)

    def _applied_requests(self, state: JournalState, seq: int,
                          item: Mapping[str, Any]) -> None:
        for request_id in _get(item, "ids", seq, _strs, "a list of request ids"):
            state.requests.note(request_id)

    def _forgotten(self, state: JournalState, seq: int, item: Mapping[str, Any]) -> None:
        _get(item, "offset", seq, lambda v: v == len(self.filter), "the next offset")
        try:
            self.filter += base64.b64decode(_get(item, "zlib_base64", seq, _opt_str, "text"),
                                            validate=True)
        except (binascii.Error, ValueError) as exc:
            raise _bad(seq, f"carries filter bytes that are not base64: {exc}") from None


def _well_formed(item: Mapping[str, Any]) -> bool:
    """A settled_calls item whose columns the typed decoder read (each of its type) is checked
    in a few C-level calls: ids and texts not empty, seqs positive, the lengths equal."""
    if type(item) is not SettledColumns:
        return False
    call_ids, seqs = item["call_ids"], item["settled_seqs"]
    count = len(call_ids)
    if "settlings_zlib" in item:
        texts = item["settlings_zlib"] != ""
    else:
        settlings = item.get("settlings")
        texts = settlings is not None and len(settlings) == count and all(settlings)
    return (all(call_ids) and len(item["arguments_sha256"]) == count
            and all(item["arguments_sha256"]) and len(seqs) == count
            and (not seqs or min(seqs) > 0) and texts)


def _check_settled(item: Mapping[str, Any], seq: int) -> None:
    """A settled_calls item checked column by column: CorruptionError for the first bad one.
    Packed settling records are unpacked and checked when a call is replayed."""
    call_ids = _get(item, "call_ids", seq, _strs, "a list of call ids")
    count = len(call_ids)
    _get(item, "arguments_sha256", seq, lambda v: _strs(v) and len(v) == count,
         f"{count} digests")
    _get(item, "settled_seqs", seq, lambda v: isinstance(v, list) and len(v) == count
         and all(type(x) is int and x > 0 for x in v), f"{count} seqs")
    if "settlings_zlib" in item:
        _get(item, "settlings_zlib", seq, _str, f"{count} records' JSON text, packed")
    else:
        _get(item, "settlings", seq, lambda v: _strs(v) and len(v) == count,
             f"{count} records' JSON text")


_LOADERS: dict[str, Callable[[CheckpointLoad, JournalState, int, Mapping[str, Any]], None]] = {
    "turn": CheckpointLoad._turn, "execution": CheckpointLoad._execution,
    "llm_call": CheckpointLoad._llm_call, "cut": CheckpointLoad._cut,
    "resolution": CheckpointLoad._resolution, "settled_calls": CheckpointLoad._settled_calls,
    "forgotten_calls": CheckpointLoad._forgotten,
    "applied_requests": CheckpointLoad._applied_requests,
    "approval": lambda load, state, seq, item: state.approvals.load_item(seq, item),
}
