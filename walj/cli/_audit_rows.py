"""`walj audit`'s rows: one per tool execution, resolution and approval request or decision of
a session, derived from its records in log order, and their two encodings (JSON Lines, CSV)."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from ._audit_args import iso_time
from ._common import json_text, printable
from ._model import decode_record, kind_of, subject_of, time_of, turn_number

SCHEMA = "walj.audit/1"

# The columns of schema version 1, in order: a JSON row's keys, a CSV file's header.
COLUMNS = ("row", "kind", "session", "log_id", "seq", "time", "at", "turn_sequence", "tool",
           "call_id", "execution_id", "idempotency_key", "arguments_sha256",
           "arguments_preview", "approval_id", "outcome", "error_type", "end_seq", "end_time",
           "end_at", "actor", "note", "request", "subject", "writer", "expires_time",
           "expires_at")

# A string from a log longer than this is cut (the journal bounds its own previews well below).
MAX_TEXT = 4096
CUT_MARK = "…[cut]"

STARTED = "tool_execution_started"
FINISHED = "tool_execution_finished"
AMBIGUOUS = "tool_execution_ambiguous"
EXECUTION_RESOLVED = "tool_execution_resolved"
RESOLUTIONS = (EXECUTION_RESOLVED, "turn_resolved", "llm_call_resolved", "log_cut_resolved")
APPROVAL_REQUESTED = "tool_approval_requested"
APPROVAL_DECIDED = "tool_approval_decided"
WANTED = frozenset((STARTED, FINISHED, AMBIGUOUS, *RESOLUTIONS, APPROVAL_REQUESTED,
                    APPROVAL_DECIDED))

# What a row about a call copies from the call's intent or approval request.
_CALL_FIELDS = ("turn_sequence", "tool", "call_id", "idempotency_key", "arguments_sha256",
                "arguments_preview")
# A cell a spreadsheet would take for a formula (or a DDE command) starts with one of these.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def text(value: Any) -> str | None:
    """A field that should be a string: itself (bounded), else None."""
    if not isinstance(value, str):
        return None
    return value if len(value) <= MAX_TEXT else value[:MAX_TEXT] + CUT_MARK


class SessionRows:
    """The rows of one session, built as its records are read: an execution's row is its
    intent's, completed by the record that settles it (the first one: a finish or a
    resolution). Records after `through` (a seq) are not taken."""

    def __init__(self, session: str, log_id: str | None, through: int | None = None) -> None:
        self.session = session
        self.log_id = log_id
        self.through = through
        self.rows: list[dict[str, Any]] = []
        self.undecodable = 0
        self._executions: dict[str, dict[str, Any]] = {}
        self._requests: dict[str, dict[str, Any]] = {}

    def add(self, seq: int, raw: bytes) -> None:
        if self.through is not None and seq > self.through:
            return
        kind = kind_of(raw)
        if kind not in WANTED:
            return
        try:
            data = decode_record(raw)
        except (ValueError, RecursionError):
            self.undecodable += 1
            return
        if not isinstance(data, dict):
            return
        if kind == STARTED:
            self._started(seq, data)
        elif kind in (FINISHED, AMBIGUOUS):
            self._ended(seq, kind, data)
        elif kind in RESOLUTIONS:
            self._resolved(seq, kind, data)
        elif kind == APPROVAL_REQUESTED:
            self._requested(seq, data)
        else:
            self._decided(seq, data)

    def _row(self, row: str, kind: str, seq: int, data: dict[str, Any]) -> dict[str, Any]:
        at = time_of(data.get("at"))
        cells: dict[str, Any] = dict.fromkeys(COLUMNS)
        cells.update(row=row, kind=kind, session=self.session, log_id=self.log_id, seq=seq,
                     time=iso_time(at), at=at)
        self.rows.append(cells)
        return cells

    def _started(self, seq: int, data: dict[str, Any]) -> None:
        row = self._row("execution", STARTED, seq, data)
        _call_fields(row, data)
        row.update(execution_id=text(data.get("execution_id")),
                   approval_id=text(data.get("approval_id")), outcome="started",
                   writer=text(data.get("writer")))
        execution_id = subject_of(data)
        if isinstance(execution_id, str) and execution_id not in self._executions:
            self._executions[execution_id] = row

    def _ended(self, seq: int, kind: str, data: dict[str, Any]) -> None:
        """A finish settles the execution's row; an ambiguous record marks it (not terminal)."""
        execution_id = subject_of(data)
        row = self._executions.get(execution_id) if isinstance(execution_id, str) else None
        if row is None or row["end_seq"] is not None:
            return
        row["error_type"] = text(data.get("error_type"))
        if kind == AMBIGUOUS:  # not terminal: a resolution settles it
            row["outcome"] = "ambiguous"
            return
        at = time_of(data.get("at"))
        row.update(outcome=text(data.get("outcome")), end_seq=seq, end_time=iso_time(at),
                   end_at=at)

    def _resolved(self, seq: int, kind: str, data: dict[str, Any]) -> None:
        row = self._row("resolution", kind, seq, data)
        row.update(outcome=text(data.get("outcome")), actor=text(data.get("actor")),
                   note=text(data.get("note")), request=text(data.get("request")))
        if kind == "turn_resolved":
            row["turn_sequence"] = turn_number(data.get("turn_sequence"))
        elif kind != EXECUTION_RESOLVED:
            row["subject"] = text(subject_of(data))  # an LLM call, a quarantine file
        else:
            self._settle(row, data)

    def _settle(self, row: dict[str, Any], data: dict[str, Any]) -> None:
        """An execution's resolution: its row names the call; the execution's row, while
        nothing settled it, takes the resolution as its end."""
        execution_id = subject_of(data)
        row["execution_id"] = text(execution_id)
        known = self._executions.get(execution_id) if isinstance(execution_id, str) else None
        if known is None:
            return
        row.update({name: known[name] for name in _CALL_FIELDS})
        if known["end_seq"] is None:
            outcome = row["outcome"]
            known.update(outcome=None if outcome is None else f"resolved {outcome}",
                         end_seq=row["seq"], end_time=row["time"], end_at=row["at"],
                         actor=row["actor"], note=row["note"], request=row["request"])

    def _requested(self, seq: int, data: dict[str, Any]) -> None:
        row = self._row("approval_request", APPROVAL_REQUESTED, seq, data)
        _call_fields(row, data)
        row.update(approval_id=text(data.get("approval_id")),
                   writer=text(data.get("requested_by")))
        if row["approval_id"] is not None:
            self._requests.setdefault(row["approval_id"], row)

    def _decided(self, seq: int, data: dict[str, Any]) -> None:
        row = self._row("approval_decision", APPROVAL_DECIDED, seq, data)
        expires = time_of(data.get("expires_at"))
        row.update(approval_id=text(data.get("approval_id")),
                   outcome=text(data.get("decision")), actor=text(data.get("actor")),
                   note=text(data.get("note")), request=text(data.get("request")),
                   expires_time=iso_time(expires), expires_at=expires)
        request = self._requests.get(row["approval_id"] or "")
        if request is not None:
            row.update({name: request[name] for name in _CALL_FIELDS})


def _call_fields(row: dict[str, Any], data: dict[str, Any]) -> None:
    row["turn_sequence"] = turn_number(data.get("turn_sequence"))
    for name in _CALL_FIELDS[1:]:
        row[name] = text(data.get(name))


def within(row: dict[str, Any], since: float | None, until: float | None) -> bool:
    """Whether a row is inside the time filters: since <= at < until. A row whose time is
    unknown is inside only when there is no filter."""
    at = row["at"]
    if since is None and until is None:
        return True
    if at is None:
        return False
    return (since is None or at >= since) and (until is None or at < until)


# --- encodings ------------------------------------------------------------------------------


def json_row(row: dict[str, Any]) -> bytes:
    """One JSON Lines row: an object of the columns in order, compact; every value exactly as
    derived (C0 controls as JSON escapes; DEL, C1, bidi controls and lone surrogates as \\u
    escapes, so the line is safe on a terminal and parses to the same value)."""
    encoded = json.dumps({c: row[c] for c in COLUMNS}, ensure_ascii=False,
                         separators=(",", ":"), allow_nan=False)
    return (json_text(encoded) + "\n").encode("utf-8")


def csv_cell(value: Any) -> str:
    """A CSV cell: empty for unknown, numbers as Python writes them, text with control
    characters escaped as the text views escape them, and a leading = + - @ (or tab, CR),
    which a spreadsheet would take for a formula, neutralised by a leading apostrophe."""
    if value is None:
        return ""
    if not isinstance(value, str):
        return repr(value) if isinstance(value, float) else str(value)
    shown = printable(value)
    return "'" + shown if shown.startswith(_FORMULA_START) else shown


def csv_line(cells: list[str]) -> bytes:
    out = io.StringIO()
    csv.writer(out, lineterminator="\r\n").writerow(cells)
    return out.getvalue().encode("utf-8")


CSV_BOM = "\ufeff".encode()  # so that a spreadsheet reads the file as UTF-8


def csv_header() -> bytes:
    return CSV_BOM + csv_line(list(COLUMNS))


def csv_row(row: dict[str, Any]) -> bytes:
    return csv_line([csv_cell(row[c]) for c in COLUMNS])
