"""The journal's record schema: each record kind, its fields in the order they are written,
how a record is encoded and decoded, and the byte-level peeks the rebuild reads without
decoding. Standard library only (the forensic tool).

Every record is one JSON object whose first two fields are `kind` and `version`; `FIELDS`
names the rest, in order. Readers treat every field as untrusted: a checksum proves who framed
a line, not what is in it."""

from __future__ import annotations

import json
import math
import re
from typing import Any, Literal

from .. import _codec
from ..errors import CorruptionError

__all__ = [
    "AMBIGUOUS", "APPROVAL_DECIDED", "APPROVAL_REQUESTED", "BLOCKED", "CHECKPOINT",
    "CONTRACT_VERSION", "FIELDS", "FINISHED",
    "FINISHED_PREFIX", "LLM_FINISHED", "LLM_RESOLVED", "LLM_STARTED", "LOG_CUT", "LOG_CUT_RESOLVED",
    "MAX_TIME", "MAX_TURN", "OUTPUT_DROPPED", "OUTPUT_NOT_STORABLE", "OUTPUT_TOO_LARGE",
    "RECONCILE_FAILED", "REFUSED", "REFUSED_ARGUMENTS_DIFFER", "REFUSED_OUTPUT_NOT_STORED",
    "REFUSED_OUTSIDE_WINDOW", "RELEASED", "REPLAYED", "REQUEST_ANSWERS", "REQUEST_REFUSED",
    "RESOLVED", "SESSION_ENDED", "SESSION_NAMED", "SETTLED_RESOLUTIONS", "STARTED",
    "STARTED_PREFIX", "STATE_AMBIGUOUS", "STATE_INTERRUPTED_TURN", "STATE_LOG_DAMAGE",
    "STATE_PENDING_LLM_CALL", "STATE_STARTED", "SUBJECT", "SUPPORTED_VERSIONS", "SYNCED_THROUGH",
    "TURN_COMPLETED", "TURN_COMPLETED_PREFIX", "TURN_RESOLVED", "TURN_STARTED",
    "TURN_STARTED_PREFIX", "call_key", "decode_object", "decode_record", "encode_record",
    "first_part_id", "new_record", "peek_finished", "peek_started", "peek_turn_started",
    "raw_call_key", "record_kind", "show", "subject_of", "time_of", "turn_number", "turn_tag",
]

# Bump when a record kind is added or a field changes meaning: an older walj must refuse a log
# it cannot fully understand rather than miss a blocker. Version 2 named every field in full
# (docs/RECOVERY.md, "Records"); version 1's short keys (`k`, `v`, `o`, ...) are refused.
# Version 3 added replay (tool_execution_replayed, tool_execution_refused, stored outputs,
# call_id_generated), session_named and session_ended; a version-2 log reads as before.
# Version 4 added checkpoint; a version-2 or -3 log reads as before.
# Version 5 added requests from other processes: the `request` field of a resolution record,
# resolution_refused, journal_released, and a checkpoint's applied_requests item; older logs
# read as before.
# Version 6 packs a checkpoint's settling records (settlings_zlib); older checkpoints read as
# before.
# Version 7 added approvals: tool_approval_requested, tool_approval_decided, the intent's
# `approval_id` and a checkpoint's `approval` item; older logs read as before.
CONTRACT_VERSION = 7
SUPPORTED_VERSIONS = frozenset({2, 3, 4, 5, 6, CONTRACT_VERSION})

TURN_STARTED = "turn_started"
TURN_COMPLETED = "turn_completed"
TURN_RESOLVED = "turn_resolved"
STARTED = "tool_execution_started"
FINISHED = "tool_execution_finished"
AMBIGUOUS = "tool_execution_ambiguous"
BLOCKED = "tool_execution_blocked"
RESOLVED = "tool_execution_resolved"
RECONCILE_FAILED = "tool_execution_reconcile_failed"
LLM_STARTED = "llm_call_started"
LLM_FINISHED = "llm_call_finished"
LLM_RESOLVED = "llm_call_resolved"
LOG_CUT = "log_cut"
LOG_CUT_RESOLVED = "log_cut_resolved"
REPLAYED = "tool_execution_replayed"
REFUSED = "tool_execution_refused"
SESSION_NAMED = "session_named"
SESSION_ENDED = "session_ended"
CHECKPOINT = "checkpoint"
REQUEST_REFUSED = "resolution_refused"
RELEASED = "journal_released"
APPROVAL_REQUESTED = "tool_approval_requested"
APPROVAL_DECIDED = "tool_approval_decided"

# Every record the journal writes once the log has synced something since it was opened: the
# seq through which the log's records were synced when this record was written (added last).
# Readers that predate it ignore it; the rebuild uses it to tell damage to synced records from
# a crash.
SYNCED_THROUGH = "synced_through"
_RESOLUTION = ("at", "outcome", "actor", "note", "output", "request")
_INTENT = ("turn_sequence", "tool", "call_id", "call_id_generated", "arguments_sha256")
# Each kind's fields after `kind` and `version`, in the order they are written (optional ones
# are left out when absent). The peeks below read the leading ones at fixed places, so the
# order is part of the format: docs/RECOVERY.md, "Records".
FIELDS: dict[str, tuple[str, ...]] = {
    TURN_STARTED: ("turn_sequence", "at"),
    TURN_COMPLETED: ("turn_sequence", "at"),
    TURN_RESOLVED: ("turn_sequence", "at", "actor", "note", "request"),
    STARTED: ("execution_id", "at", *_INTENT, "idempotency_key", "arguments_preview",
              "arguments_length", "writer", "approval_id", "arguments"),
    FINISHED: ("execution_id", "at", "outcome", "error", "error_type", "output_sha256",
               "output_preview", "output_length", "output", "output_not_stored"),
    AMBIGUOUS: ("execution_id", "at", "error_type", "error"),
    BLOCKED: ("execution_id", "at", *_INTENT, "arguments_preview", "arguments_length",
              "blocked_by", "blocked_by_turns"),
    RESOLVED: ("execution_id", *_RESOLUTION),
    RECONCILE_FAILED: ("execution_id", "at", "tool", "error"),
    LLM_STARTED: ("llm_call_id", "at", "turn_sequence", "model", "request_sha256",
                  "request_preview", "request_length", "blocks_dispatch"),
    LLM_FINISHED: ("llm_call_id", "at", "outcome", "error", "response_sha256",
                   "response_preview", "response_length"),
    LLM_RESOLVED: ("llm_call_id", *_RESOLUTION),
    LOG_CUT: ("quarantine_file", "at", "segment", "offset", "length", "cut_kind", "records",
              "seqs", "explained", "reason"),
    LOG_CUT_RESOLVED: ("quarantine_file", *_RESOLUTION),
    REPLAYED: ("execution_id", "at", "turn_sequence", "tool", "call_id", "arguments_sha256",
               "outcome", "answered_from_seq"),
    REFUSED: ("execution_id", "at", "turn_sequence", "tool", "call_id", "arguments_sha256",
              "refused_reason", "error", "settled_execution_id"),
    SESSION_NAMED: ("at", "session_id"),
    SESSION_ENDED: ("at",),
    CHECKPOINT: ("checkpoint_id", "part", "parts", "at", "items"),
    REQUEST_REFUSED: ("request", "at", "request_kind", "target", "actor", "reason", "error"),
    RELEASED: ("request", "at", "actor", "note"),
    APPROVAL_REQUESTED: ("at", "approval_id", "turn_sequence", "tool", "call_id",
                         "arguments_sha256", "arguments_preview", "idempotency_key",
                         "requested_by"),
    APPROVAL_DECIDED: ("at", "approval_id", "decision", "actor", "note", "expires_at",
                       "request"),
}

# Records that carry the id of the request they answer (field `request`).
REQUEST_ANSWERS = frozenset({RESOLVED, LLM_RESOLVED, TURN_RESOLVED, LOG_CUT_RESOLVED,
                             REQUEST_REFUSED, RELEASED, APPROVAL_DECIDED})
# The field that names what a record is about, by kind (turn records name a turn_sequence).
SUBJECT = {kind: fields[0] for kind, fields in FIELDS.items()
           if fields[0] in ("execution_id", "llm_call_id", "quarantine_file")}

# Resolutions that settle a call (replay answers from them); the others (not_performed,
# rerun) say it did not take effect, so it may run afresh.
SETTLED_RESOLUTIONS = frozenset({"succeeded", "failed"})
# Why a terminal record holds no `output` value (field `output_not_stored`).
OUTPUT_TOO_LARGE = "too_large"
OUTPUT_NOT_STORABLE = "not_storable"
OUTPUT_DROPPED = "dropped_at_checkpoint"  # beyond what a checkpoint carries
# Why a dispatch was refused (field `refused_reason` of tool_execution_refused).
REFUSED_ARGUMENTS_DIFFER = "arguments_differ"
REFUSED_OUTPUT_NOT_STORED = "output_not_stored"
REFUSED_OUTSIDE_WINDOW = "outside_replay_window"

# Blocker states.
STATE_STARTED = "started"
STATE_AMBIGUOUS = "ambiguous"
STATE_INTERRUPTED_TURN = "interrupted_turn"
STATE_PENDING_LLM_CALL = "pending_llm_call"
STATE_LOG_DAMAGE = "log_damage"


# --- writing -------------------------------------------------------------------------------------

def new_record(kind: str, **fields: Any) -> dict[str, Any]:
    """A record of `kind` holding `fields` in the order FIELDS declares (ValueError for a field
    it does not declare)."""
    record: dict[str, Any] = {"kind": kind, "version": CONTRACT_VERSION}
    for name in FIELDS[kind]:
        if name in fields:
            record[name] = fields[name]
    if len(record) != len(fields) + 2:
        raise ValueError(f"{kind} has no field {sorted(set(fields) - set(record))}")
    return record


def encode_record(record: dict[str, Any]) -> bytes:
    """A record's JSON bytes: exactly what the log writes for it (the same encoder), so the
    live journal feeds its state the bytes a replay reads."""
    return _codec.encode(record)


# --- reading -------------------------------------------------------------------------------------

# Times before 1970 or after the year 9999 and turn numbers beyond 63 bits are not facts: no
# walj writes them, and showing them would overflow. They read as unknown (None).
MAX_TIME = 253402300799.0  # 9999-12-31 23:59:59 UTC
MAX_TURN = 2**63 - 1


def _no_constant(name: str) -> Any:
    raise ValueError("a non-finite number is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"number {text[:24]} is out of range")
    return value


def decode_record(data: bytes) -> Any:
    """Parse a record's JSON bytes strictly, the same way with msgspec or the standard library:
    ValueError for anything that is not one JSON value, including NaN, Infinity, a number out of
    range and nesting deeper than the format allows (which would need that much stack)."""
    if _codec.HAVE_MSGSPEC:
        value = _codec.decode(data)
    else:
        try:  # strict UTF-8 first: given bytes, json.loads would also take UTF-16 and surrogates
            value = json.loads(data.decode("utf-8"), parse_constant=_no_constant,
                               parse_float=_finite_float)
        except RecursionError:  # the codec's own-stack parser, as strict
            value = _codec.decode(data)
    if (data.count(b"[") + data.count(b"{") > _codec.MAX_DEPTH
            and _codec._depth(value) > _codec.MAX_DEPTH):
        raise ValueError(f"nested more than {_codec.MAX_DEPTH} levels deep")
    return value


def decode_object(seq: int, data: bytes) -> dict[str, Any]:
    """Journal record `seq` decoded: CorruptionError when it is not one JSON object."""
    try:
        record = decode_record(data)
    except ValueError as exc:
        raise CorruptionError(f"journal record {seq} is not JSON: {exc}", seq=seq,
                              kind="journal_record") from None
    if not isinstance(record, dict):
        raise CorruptionError(f"journal record {seq} is not a JSON object", seq=seq,
                              kind="journal_record")
    return record


def time_of(value: Any) -> float | None:
    """A record's time, or None when it is not a plausible Unix time."""
    if type(value) is float:
        return value if 0.0 <= value <= MAX_TIME else None
    if type(value) is int and 0 <= value <= MAX_TIME:
        return float(value)
    return None


def turn_number(value: Any) -> int | None:
    return value if type(value) is int and 0 < value <= MAX_TURN else None


def show(value: Any) -> str:
    """A short, safe description of an untrusted value for an error message."""
    if isinstance(value, str):
        return repr(value[:40] + ("..." if len(value) > 40 else ""))
    if type(value) is int and abs(value) < 10**20 or value is None or isinstance(value, bool):
        return repr(value)
    return f"a {type(value).__name__}"


def subject_of(record: Any) -> Any:
    """The id a decoded record is about (an execution, an LLM call, a quarantine file), or None.
    Untrusted: whatever the record holds there, not checked."""
    if not isinstance(record, dict):
        return None
    kind = record.get("kind")
    field = SUBJECT.get(kind) if isinstance(kind, str) else None  # a list or dict is unhashable
    return record.get(field) if field is not None else None


def call_key(record: Any) -> tuple[str, str] | None:
    """(call id, arguments_sha256) of a decoded intent with a caller-given call id, else None."""
    call_id, sha = record.get("call_id"), record.get("arguments_sha256")
    if record.get("call_id_generated") is True or not isinstance(call_id, str) or not call_id:
        return None
    return (call_id, sha) if isinstance(sha, str) else None


# --- peeks: fields read from a record's bytes, without decoding ----------------------------------
# The rebuild reads the commonest records at fixed places, where FIELDS puts them. Bytes not in
# that form (another order, an escape in an id) take the general path, which decodes them.

def _leading(kind: str, *names: str) -> tuple[bytes, ...]:
    """The JSON keys of `names`, which FIELDS must declare as `kind`'s first fields."""
    if FIELDS[kind][:len(names)] != names:
        raise AssertionError(f"the peeks read {names} first in {kind}")
    return tuple(b'"%s":' % name.encode() for name in names)


def _prefixes(kind: str, then: bytes) -> tuple[bytes, ...]:
    """A kind's byte prefix in every supported version (one digit each: the same length)."""
    return tuple(b'{"kind":"%s","version":%d,%s' % (kind.encode(), version, then)
                 for version in sorted(SUPPORTED_VERSIONS))


_KIND_PREFIX = b'{"kind":"'
_FIN_ID_KEY, _FIN_AT_KEY, _FIN_OUTCOME_KEY = _leading(FINISHED, "execution_id", "at", "outcome")
_START_ID_KEY, _START_AT_KEY, _START_TURN_KEY = _leading(STARTED, "execution_id", "at",
                                                         "turn_sequence")
_TURN_KEY, _TURN_AT_KEY = _leading(TURN_STARTED, "turn_sequence", "at")
FINISHED_PREFIX = _prefixes(FINISHED, _FIN_ID_KEY + b'"')
STARTED_PREFIX = _prefixes(STARTED, _START_ID_KEY + b'"')
TURN_COMPLETED_PREFIX = _prefixes(TURN_COMPLETED, b"")
TURN_STARTED_PREFIX = _prefixes(TURN_STARTED, _TURN_KEY)
_ID_LEN = 32  # execution ids are 32 hex digits
_FIN_ID = len(FINISHED_PREFIX[0])
_FIN_ID_END = _FIN_ID + _ID_LEN
_FIN_BLOCKED = b',%s"blocked"' % _FIN_OUTCOME_KEY
_FIN_OUTCOME_WINDOW = 64  # the id's closing quote, its time, then the outcome
_START_ID = len(STARTED_PREFIX[0])
_START_ID_END = _START_ID + _ID_LEN
# Where an intent names its turn: after its id, its time (at most 30 bytes of a JSON number
# walj writes) and the field name, so well inside this window.
_START_TURN_WINDOW = 96
_TURN_NO = len(TURN_STARTED_PREFIX[0])
_TIME_FIELD = b"," + _TURN_AT_KEY
_SYNCED_FIELD = b',"%s":' % SYNCED_THROUGH.encode()  # added last: see Core.write
_QUOTE = ord('"')
_JSON_INT = re.compile(rb"0|[1-9][0-9]*")
_JSON_NUMBER = re.compile(rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_CHECKPOINT_ID, _PART = _leading(CHECKPOINT, "checkpoint_id", "part")
_PART0 = re.compile(rb'\{"kind":"%s","version":[0-9]+,%s"([0-9a-f]{32})",%s0,'
                    % (CHECKPOINT.encode(), _CHECKPOINT_ID, _PART))
# How an intent's bytes name its call: these fields follow each other (FIELDS), and a JSON
# string cannot hold `,"` unescaped, so the first match is the fields themselves. A call id
# with an escape in it (a quote, a backslash, a control character) does not match; the intent
# is then decoded.
_AFTER_ID = 60  # the kind, the version and the execution id come first
_CALL_ID, _GENERATED, _SHA = (
    b'"%s":' % name.encode() for name in FIELDS[STARTED][4:7])
if FIELDS[STARTED][3:7] != _INTENT[1:]:
    raise AssertionError("the call peek reads tool, call_id, call_id_generated, "
                         "arguments_sha256 in a row")
_CALL_FIELDS = re.compile(rb',%s"([^"\\]*)"(,%strue)?,%s"([0-9a-f]{64})"'
                          % (_CALL_ID, _GENERATED, _SHA))


def turn_tag(sequence: int) -> bytes:
    """How the intents of turn `sequence` name it in their bytes (between two fields)."""
    return b",%s%d," % (_START_TURN_KEY, sequence)


def record_kind(data: bytes) -> str | None:
    """The kind a journal record's JSON bytes start with (`kind` is written first), read
    without decoding; None when the bytes do not start that way."""
    if not data.startswith(_KIND_PREFIX):
        return None
    end = data.find(b'"', len(_KIND_PREFIX))
    return data[len(_KIND_PREFIX):end].decode("utf-8", "replace") if end > 0 else None


def first_part_id(data: bytes) -> str | None:
    """The checkpoint id when `data` (a record's first bytes) begins a checkpoint."""
    found = _PART0.match(data)
    return found.group(1).decode() if found else None


def raw_call_key(data: bytes) -> tuple[str, str] | None | Literal[False]:
    """As call_key, from an intent's JSON bytes as the journal writes them; False when they
    are not in that form (the caller then decodes them)."""
    found = _CALL_FIELDS.search(data, _AFTER_ID)
    if found is None:
        return False
    call_id, generated, sha = found.groups()
    if generated is not None or not call_id:
        return None
    try:
        return call_id.decode("utf-8"), sha.decode("latin-1")
    except UnicodeDecodeError:
        return False


def peek_finished(data: bytes) -> tuple[str, bool] | None:
    """(execution id, whether its outcome is `blocked`) of tool_execution_finished bytes that
    start with FINISHED_PREFIX; None when they are not in the written form."""
    if len(data) <= _FIN_ID_END or data[_FIN_ID_END] != _QUOTE:
        return None
    blocked = data.find(_FIN_BLOCKED, _FIN_ID_END, _FIN_ID_END + _FIN_OUTCOME_WINDOW) >= 0
    return data[_FIN_ID:_FIN_ID_END].decode("latin-1"), blocked


def peek_started(data: bytes, tag: bytes) -> str | None:
    """The execution id of intent bytes (starting with STARTED_PREFIX) that name the turn
    whose turn_tag is `tag`; None otherwise."""
    if (len(data) > _START_ID_END and data[_START_ID_END] == _QUOTE
            and data.find(tag, _START_ID_END, _START_ID_END + _START_TURN_WINDOW) > 0):
        return data[_START_ID:_START_ID_END].decode("latin-1")
    return None


def peek_turn_started(data: bytes) -> tuple[int, float] | None:
    """(turn number, time) of turn_started bytes (starting with TURN_STARTED_PREFIX) holding
    just those fields (and synced_through), with a plain finite JSON time; None otherwise."""
    if not data.endswith(b"}"):
        return None
    comma = data.find(_TIME_FIELD, _TURN_NO, _TURN_NO + 24)
    digits = data[_TURN_NO:comma]
    if comma <= _TURN_NO or not digits.isdigit():
        return None
    number, marked, synced = data[comma + len(_TIME_FIELD):-1].partition(_SYNCED_FIELD)
    # Only a plain finite JSON number: float() also takes NaN, inf and 1_0, which the general
    # path refuses.
    if (_JSON_NUMBER.fullmatch(number) and (not marked or _JSON_INT.fullmatch(synced))
            and math.isfinite(started_at := float(number))):
        return int(digits), started_at
    return None
