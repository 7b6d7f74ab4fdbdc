"""Writing checkpoints: the journal's state as `checkpoint` records, each within the log's
record limit (read back by _checkpoint), and reading back the settling records they carry
(replay, compaction). The record's fields are in docs/RECOVERY.md, "Checkpoints"."""

from __future__ import annotations

import base64
import binascii
import secrets
import zlib
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import asdict
from typing import Any

from .. import _codec
from ..errors import RecordTooLargeError
from . import records as r
from ._approvalbook import as_item
from ._checkpoint import _bad, _decoded, _get, _str, _strs

# The state is a state.JournalState, typed `Any` here: that module imports this one.
JournalState = Any

# Resolutions carried beyond those of turns still open: the newest, for the recovery view.
CARRIED_RESOLUTIONS = 1000
# Stored outputs carried for replay, newest first; an older settled call is carried without
# its output, and a re-dispatch of it is refused (never run again).
CARRIED_OUTPUT_BYTES = 16 * 2**20
# What a part's own fields take beside its items.
_ENVELOPE = 512
_FILTER_CHUNK = 256 * 1024  # compressed filter bytes per item
_SETTLED_CHUNK = 128 * 1024  # bytes of settled calls per item (a part holds several)
_REQUEST_IDS_PER_ITEM = 32  # applied request ids per item (about 1 KB)


def _text(record: Mapping[str, Any] | bytes) -> str:
    """A record carried inside another as its JSON text: nesting stays what the log allows."""
    data = record if isinstance(record, bytes) else _codec.encode(dict(record))
    return data.decode("utf-8")


def _items(state: JournalState, settling: Mapping[str, tuple[dict[str, Any], int]],
           budget: int) -> Iterator[dict[str, Any]]:
    filter_bits = state.calls.filter_bytes()
    yield {"item": "summary", "covers_records": state.records, "covers_seq": state.last_seq,
           "session_id": state.session_id, "ended_seq": state.ended_seq,
           "max_turn": state.max_turn, "paired_turn": state.paired_turn,
           "turn_stack": list(state.turn_stack), "turn_starts": list(state.turn_starts),
           "blocking_llm_calls": sorted(state.blocking_llm_calls),
           "replay_window": state.calls.window, "forgotten_calls": filter_bits is not None}
    yield from _open_items(state)
    yield from _resolution_items(state)
    for approval in state.approvals.carried():
        yield as_item(approval)
    applied = list(state.requests.order)
    for start in range(0, len(applied), _REQUEST_IDS_PER_ITEM):
        yield {"item": "applied_requests", "ids": applied[start:start + _REQUEST_IDS_PER_ITEM]}
    yield from _settled_chunks(_settled(state, settling), budget)
    if filter_bits is not None:
        packed = zlib.compress(filter_bits, 6)
        for offset in range(0, len(packed), _FILTER_CHUNK):
            yield {"item": "forgotten_calls", "offset": offset,
                   "zlib_base64": base64.b64encode(packed[offset:offset + _FILTER_CHUNK]).decode()}


def _open_items(state: JournalState) -> Iterator[dict[str, Any]]:
    """What is open: turns, executions, LLM calls, and the cuts recorded."""
    for sequence in state.turn_stack:
        turn = state.turns[sequence]
        yield {"item": "turn", "turn_sequence": sequence, "seq": turn.seq,
               "started_at": turn.started_at, "started": turn.started,
               "unfinished": turn.unfinished, "resolved": turn.resolved}
    for execution_id, execution in state.executions.items():
        raw = execution._raw
        yield {"item": "execution", "execution_id": execution_id, "seq": execution.seq,
               "turn": execution.turn,
               "open_turn_seq": execution.open_turn.seq if execution.open_turn else None,
               "state": execution.state, "error_type": execution.error_type,
               "reconcile_error": execution.reconcile_error,
               "started": _text(raw if raw is not None else execution.record)}
    for call_id, (started, seq) in state.llm_calls.items():
        yield {"item": "llm_call", "llm_call_id": call_id, "seq": seq, "started": _text(started)}
    for cut in state.cuts.cuts.values():
        yield {"item": "cut", **asdict(cut)}


def _resolution_items(state: JournalState) -> Iterator[dict[str, Any]]:
    """The resolutions of turns still open, and the newest CARRIED_RESOLUTIONS."""
    open_turns = set(state.turn_stack)
    carried = {id(res) for res in state.resolutions[-CARRIED_RESOLUTIONS:]}
    for res in state.resolutions:
        if id(res) in carried or res.turn_sequence in open_turns:
            fields = asdict(res)
            fields["resolution_kind"] = fields.pop("kind")
            yield {"item": "resolution", **fields}


def _settled(state: JournalState, settling: Mapping[str, tuple[dict[str, Any], int]]
             ) -> list[tuple[str, str, int, str]]:
    """The replay window, oldest first, with each call's settling record; stored outputs are
    carried newest first, up to CARRIED_OUTPUT_BYTES."""
    outputs_left = CARRIED_OUTPUT_BYTES
    settled: list[tuple[str, str, int, str]] = []
    for call_id, (sha, _) in reversed(state.calls.settled.items()):
        record, seq = settling[call_id]
        if "output" in record and record.get("kind") == r.FINISHED:
            size = len(_codec.encode(record["output"]))
            if size > outputs_left:
                record = {k: v for k, v in record.items() if k != "output"}
                record["output_not_stored"] = r.OUTPUT_DROPPED
            else:
                outputs_left -= size
        settled.append((call_id, sha, seq, _text(record)))
    settled.reverse()
    return settled


def _settled_chunks(settled: Iterable[tuple[str, str, int, str]],
                    budget: int) -> Iterator[dict[str, Any]]:
    """The replay window, oldest first, as columns (few containers: quick to decode and check),
    in items of at most _SETTLED_CHUNK bytes, or of what a record has room for."""
    limit = min(_SETTLED_CHUNK, budget - 160)  # the item's own keys
    chunk: list[tuple[str, str, int, str]] = []
    size = 0
    for entry in settled:
        length = len(_codec.encode(list(entry)))
        if chunk and size + length > limit:
            yield _settled_item(chunk)
            chunk, size = [], 0
        chunk.append(entry)
        size += length
    if chunk:
        yield _settled_item(chunk)


def _settled_item(chunk: list[tuple[str, str, int, str]]) -> dict[str, Any]:
    # The settling records are read only when a call is replayed: packed, an open reads and
    # checks a third of the bytes (they are alike, and compress about tenfold).
    texts = _codec.encode([e[3] for e in chunk])
    return {"item": "settled_calls", "call_ids": [e[0] for e in chunk],
            "arguments_sha256": [e[1] for e in chunk], "settled_seqs": [e[2] for e in chunk],
            "settlings_zlib": base64.b64encode(zlib.compress(texts, 6)).decode()}


# --- reading back what a part carries for replay ---------------------------------------------

def settling_record(record: Mapping[str, Any], call_id: str) -> tuple[dict[str, Any], int] | None:
    """When `record` is a checkpoint part: the settling record it carries for `call_id`, and
    the seq that record had; None when it carries none."""
    return carried_settlings(record, (call_id,)).get(call_id)


def carried_settlings(record: Mapping[str, Any], call_ids: Collection[str]
                      ) -> dict[str, tuple[dict[str, Any], int]]:
    """When `record` is a checkpoint part: for each of `call_ids` it carries, the settling
    record and the seq that record had (each item's packed texts unpacked once).
    CorruptionError when a settling record it carries cannot be read."""
    wanted = set(call_ids)
    found: dict[str, tuple[dict[str, Any], int]] = {}
    items = record.get("items")
    for item in items if isinstance(items, list) else ():
        if not (isinstance(item, dict) and item.get("item") == "settled_calls"):
            continue
        ids: Any = item.get("call_ids")
        seqs: Any = item.get("settled_seqs")
        places = _places(ids, wanted, found) if isinstance(ids, list) else {}
        texts = _settlings(item, len(ids)) if places and isinstance(seqs, list) else None
        if not isinstance(texts, list):
            continue
        for carried, at in places.items():
            if at < len(seqs) and at < len(texts) and type(seqs[at]) is int:
                found[carried] = (_decoded({"settling": texts[at]}, "settling", 0), seqs[at])
    return found


def _places(ids: list[Any], wanted: set[str], found: Mapping[str, Any]) -> dict[str, int]:
    """Where each wanted call id not found yet first stands among `ids`."""
    places: dict[str, int] = {}
    for at, carried in enumerate(ids):
        if type(carried) is str and carried in wanted and carried not in found:
            places.setdefault(carried, at)  # the first place, as the open reads it
    return places


def _settlings(item: Mapping[str, Any], count: int) -> Any:
    """A settled_calls item's settling records' texts: its `settlings` as written before they
    were packed, or its `settlings_zlib` unpacked (CorruptionError when that cannot be read)."""
    if "settlings_zlib" not in item:
        return item.get("settlings")
    try:
        packed = _get(item, "settlings_zlib", 0, _str, "packed text")
        texts = r.decode_record(zlib.decompress(base64.b64decode(packed, validate=True)))
    except (binascii.Error, zlib.error, ValueError) as exc:
        raise _bad(0, f"carries settlings that cannot be read: {exc}") from None
    if not (_strs(texts) and len(texts) == count):
        raise _bad(0, f"carries settlings that are not {count} records' JSON text")
    return texts



def build_parts(state: JournalState, settling: Mapping[str, tuple[dict[str, Any], int]],
                record_limit: int, at: float) -> list[dict[str, Any]]:
    """The records of a checkpoint of `state`, each within `record_limit` bytes. `settling`:
    for each call id in the replay index, the record that settled it (a terminal record or a
    resolution) and its seq. RecordTooLargeError, nothing written, when one item alone would
    not fit a record."""
    budget = record_limit - _ENVELOPE
    groups: list[list[dict[str, Any]]] = [[]]
    size = 0
    for item in _items(state, settling, budget):
        length = len(_codec.encode(item)) + 1
        if length > budget:
            raise RecordTooLargeError(
                f"a checkpoint cannot carry {item['item']} "
                f"{item.get('execution_id') or item.get('call_id') or ''}: {length} bytes, "
                f"more than a record of max_record_bytes {record_limit} leaves room for")
        if size + length > budget and groups[-1]:
            groups.append([])
            size = 0
        groups[-1].append(item)
        size += length
    checkpoint_id = secrets.token_hex(16)
    return [r.new_record(r.CHECKPOINT, checkpoint_id=checkpoint_id, part=part,
                         parts=len(groups), at=at, items=items)
            for part, items in enumerate(groups)]


