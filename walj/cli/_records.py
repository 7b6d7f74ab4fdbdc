"""`walj dump` and `walj tail [-f]`: records in order, and following a live log across rotation."""

from __future__ import annotations

import argparse
import collections
import json
import re
import signal
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any

from ..log import format as fmt
from ..log.fs import DEFAULT_FS
from ..log.scan import LogScan
from ..log.segment import SegmentScan
from ._common import (
    EXIT_OK,
    EXIT_PROBLEMS,
    CliError,
    clock,
    int_list,
    json_text,
    open_log,
    plural,
    printable,
    scan,
    segment_names,
    short,
    str_list,
    warn,
)
from ._model import decode_record, kind_of, subject_of

KIND_WIDTH = 31
# Bytes of a record's JSON that must not reach a terminal as they are: C0 (JSON allows tab, CR
# and LF between tokens), DEL, and the UTF-8 of C1 and of the bidi controls (raw in strings).
_RAW_UNSAFE = re.compile(rb"[\x00-\x1f\x7f]|\xc2[\x80-\x9f]"
                         rb"|\xe2\x80[\xaa-\xae]|\xe2\x81[\xa6-\xa9]")


class _Fields(dict[str, Any]):
    """A record's fields for a summary template: a missing one shows as None."""

    def __missing__(self, key: str) -> None:
        return None


# A one-line description of each journal kind, for the table view: a template over the
# record's fields, and _turn (" turn N"), _blockers, _failure (its error, else its preview).
_SUMMARIES = {
    "turn_started": "{_turn}", "turn_completed": "{_turn}",
    "tool_execution_started": "{tool} {call_id}{_turn} args {arguments_preview}",
    "tool_execution_finished": "{outcome}: {_failure}",
    "tool_execution_ambiguous": "interrupted by {error_type}",
    "tool_execution_blocked": "{tool} {call_id}{_turn} blocked: the journal was blocked by "
                              "{_blockers} blocker(s)",
    "tool_execution_replayed": "{tool} {call_id}{_turn} replayed {outcome} from record "
                               "{answered_from_seq}",
    "tool_execution_refused": "{tool} {call_id}{_turn} refused: {refused_reason}",
    "session_named": "session {session_id}",
    "tool_execution_resolved": "{outcome} by {actor}: {note}",
    "llm_call_resolved": "{outcome} by {actor}: {note}",
    "turn_resolved": "turn {turn_sequence} by {actor}: {note}",
    "tool_execution_reconcile_failed": "{tool} reconcile failed: {error}",
    "llm_call_started": "model {model}{_turn} request {request_preview}",
    "llm_call_finished": "{outcome}: {_failure}",
}


def summary(data: Any) -> str:
    """A one-line description of a record, for the table view."""
    if not isinstance(data, dict):
        return short(data, 100)
    kind = data.get("kind")
    template = _SUMMARIES.get(kind) if isinstance(kind, str) else None
    if template is None:
        return json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    turn = data.get("turn_sequence")
    fields = _Fields(data, _turn="" if turn is None else f" turn {turn}",
                     _blockers=len(str_list(data.get("blocked_by")))
                     + len(int_list(data.get("blocked_by_turns"))),
                     _failure=data.get("error") or data.get(
                         "response_preview" if kind == "llm_call_finished" else "output_preview"))
    return template.format_map(fields).strip()


def _id(data: Any) -> str:
    subject = subject_of(data)
    return subject[:12] if isinstance(subject, str) else "-"


class Printer:
    """Writes records as table rows or JSON Lines, flushing after each batch. A record whose
    checksum verifies but whose data is not strict JSON is shown as undecodable and counted."""

    def __init__(self, as_json: bool, kinds: list[str] | None) -> None:
        self.as_json = as_json
        self.kinds = set(kinds) if kinds else None
        self.header_done = False
        self.count = 0
        self.undecodable: list[int] = []

    def wanted(self, raw: bytes) -> bool:
        return self.kinds is None or kind_of(raw) in self.kinds

    def write(self, records: Iterable[tuple[int, bytes]]) -> None:
        out = sys.stdout
        for seq, raw in records:
            if not self.wanted(raw):
                continue
            self.count += 1
            try:
                data, error = decode_record(raw), None
            except ValueError as exc:
                data, error = None, str(exc)
                self.undecodable.append(seq)
            if self.as_json:
                out.write(self._json_line(seq, raw, data, error))
                continue
            if not self.header_done:
                out.write(f"{'SEQ':>8}  {'TIME (UTC)':<19}  {'KIND':<{KIND_WIDTH}}  "
                          f"{'ID':<12}  SUMMARY\n")
                self.header_done = True
            record = data if isinstance(data, dict) else {}
            kind = record.get("kind", "-") if error is None else kind_of(raw)
            text = f"undecodable: {error}" if error is not None else summary(data)
            out.write(printable(f"{seq:>8}  {clock(record.get('at')):<19}  "
                                f"{short(kind, KIND_WIDTH):<{KIND_WIDTH}}  {_id(data):<12}  "
                                f"{short(text, 120)}") + "\n")
        out.flush()

    @staticmethod
    def _json_line(seq: int, raw: bytes, data: Any, error: str | None) -> str:
        if error is not None:
            return json.dumps({"seq": seq, "data": None, "undecodable": error}) + "\n"
        if _RAW_UNSAFE.search(raw):  # the same value, re-encoded with those escaped
            text = json_text(json.dumps(data, ensure_ascii=False, separators=(",", ":")))
        else:  # strict JSON already: shown exactly as stored
            text = raw.decode("utf-8")
        return f'{{"seq":{seq},"data":{text}}}\n'

    def report(self) -> int:
        """Say on stderr which records could not be decoded; EXIT_PROBLEMS if any."""
        if not self.undecodable:
            return EXIT_OK
        seqs = ", ".join(str(s) for s in self.undecodable[:10])
        more = "" if len(self.undecodable) <= 10 else ", ..."
        warn(f"walj: {plural(len(self.undecodable), 'record')} verified but could not be "
             f"decoded as JSON (seq {seqs}{more}): written by no walj")
        return EXIT_PROBLEMS


def _report_problems(log_scan: LogScan, printer: Printer | None = None) -> int:
    code = EXIT_OK if printer is None else printer.report()
    if not log_scan.problems:
        return code
    warn(f"walj: {plural(len(log_scan.problems), 'problem')} in the log; records that verify "
         "were shown, the rest skipped:")
    for problem in log_scan.problems[:20]:
        warn(f"  {problem.describe()}")
    if len(log_scan.problems) > 20:
        warn(f"  ... and {len(log_scan.problems) - 20} more (`walj verify`)")
    return EXIT_PROBLEMS


def cmd_dump(args: argparse.Namespace) -> int:
    path: str = args.path
    if args.from_seq < 0 or (args.to_seq is not None and args.to_seq < args.from_seq):
        raise CliError("--from-seq must be >= 0 and --to-seq >= --from-seq")
    directory, fs, names = open_log(path, args.archive)
    log_scan, records = scan(directory, names, start_seq=args.from_seq, desc="dumping", fs=fs)
    printer = Printer(args.json, args.kind)
    batch: list[tuple[int, bytes]] = []
    for seq, raw in _own_records(log_scan, records):
        if args.to_seq is not None and seq > args.to_seq:
            break
        batch.append((seq, raw))
        if len(batch) >= 512:
            printer.write(batch)
            batch.clear()
    printer.write(batch)
    return _report_problems(log_scan, printer)


def _own_records(log_scan: LogScan,
                 records: Iterable[tuple[int, bytes]]) -> Iterator[tuple[int, bytes]]:
    """The records of this log: a segment whose header names another log (`foreign_segment`,
    reported before its first record) is another log's, though its lines verify."""
    segment, foreign = None, False
    for record in records:
        reading = log_scan.reading
        if reading is not segment:
            segment = reading
            foreign = reading is not None and any(
                p.kind == "foreign_segment" for p in reading.problems)
        if not foreign:
            yield record


# --- tail -----------------------------------------------------------------------------------


class Follower:
    """Reads records appended after a position with the log's own segment reader, resumed
    where it stopped (`SegmentScan.read_more`): a seal sends it on to the next segment once
    that exists; an incomplete or unverified line is waited on, never shown."""

    def __init__(self, path: str, index: int, next_seq: int) -> None:
        self.path = path
        self.next_seq = next_seq
        self.seg = self._open(index)
        self.warned_at: tuple[str, int] | None = None

    def _open(self, index: int, name: str | None = None) -> SegmentScan:
        # Nothing past a line that does not verify is shown: it is waited on, as a torn tail.
        return SegmentScan(DEFAULT_FS, self.path, name or fmt.segment_name(index),
                           before_late_record=lambda seg: False)

    def poll(self) -> list[tuple[int, bytes]]:
        out: list[tuple[int, bytes]] = []
        while True:
            seg = self.seg
            try:
                if DEFAULT_FS.stat(seg.path).st_size < seg.valid_end:
                    self._cut_back()
                    continue
                out += [r for r in seg.read_more() if r[0] >= self.next_seq]
            except FileNotFoundError:
                return out  # the next segment is not there yet
            if out:
                self.next_seq = out[-1][0] + 1
            first = seg.problems[0] if seg.problems else None
            if first is not None and first.kind != "incomplete_line":  # a write in progress
                self._warn(first.file, first.offset)  # is no news; this is where it waits
            if seg.seal is None or seg.header is None:
                return out
            self.seg = self._open(seg.header.index + 1)

    def _warn(self, name: str, offset: int) -> None:
        if self.warned_at != (name, offset):
            self.warned_at = (name, offset)
            warn(f"walj: {name} at byte {offset}: a line does not verify; waiting there (a "
                 "writer that reopens cuts a torn tail)")

    def _cut_back(self) -> None:
        """The segment was cut below what was read: a writer reopened after a crash and moved a
        torn tail aside. Resume after the last line that is still there."""
        name = self.seg.name
        self.seg = self._open(0, name)
        for _ in self.seg.read_more():
            pass
        last = self.seg.last_seq
        if last is not None and last + 1 < self.next_seq:
            warn(f"walj: {name} was cut back to seq {last} after a crash; records from seq "
                 f"{last + 1} on are shown again as rewritten")
            self.next_seq = last + 1


def cmd_tail(args: argparse.Namespace) -> int:
    if args.lines < 0 or args.interval <= 0:
        raise CliError("-n must be >= 0 and --interval > 0")
    if not args.follow:
        return _tail(args)
    _stop_on_signals()
    try:
        return _tail(args)
    except KeyboardInterrupt:
        return EXIT_OK  # Ctrl-C (or SIGTERM) is how a follow ends: not an error


def _tail(args: argparse.Namespace) -> int:
    path: str = args.path
    names = segment_names(path)
    start = args.from_seq if args.from_seq is not None else 0
    log_scan, records = scan(path, names, start_seq=start, desc="reading")
    printer = Printer(args.json, args.kind)
    if args.from_seq is not None:
        printer.write(records)
    else:
        last: collections.deque[tuple[int, bytes]] = collections.deque(maxlen=args.lines or 1)
        for seq, raw in records:
            if printer.wanted(raw):
                last.append((seq, raw))
        if args.lines:
            printer.write(last)
    code = _report_problems(log_scan, printer)
    if not args.follow:
        return code
    seg = log_scan.last
    if seg is None or seg.header is None:
        follower = Follower(path, 1 if seg is None else _index(seg.name), 1)
    else:
        follower = Follower(path, seg.header.index, (seg.last_seq or 0) + 1)
    follower.next_seq = max(follower.next_seq, log_scan.last_seq + 1)
    while True:
        batch = follower.poll()
        if batch:
            printer.write(batch)
        else:
            time.sleep(args.interval)


def _stop_on_signals() -> None:
    """Ctrl-C and SIGTERM end a follow cleanly, even where the shell started this process with
    SIGINT ignored (a background job without job control)."""
    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    try:
        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main thread: leave the handlers alone
        pass


def _index(name: str) -> int:
    index = fmt.segment_index(name)
    return 1 if index is None else index
