"""`walj dump` and `walj tail [-f]`: records in order, and following a live log across rotation."""

from __future__ import annotations

import argparse
import collections
import os
import signal
import sys
import time
from collections.abc import Iterable
from typing import Any

from .. import _codec
from .. import _format as fmt
from .._scan import LogScan
from ._common import (
    EXIT_OK,
    EXIT_PROBLEMS,
    CliError,
    clock,
    plural,
    scan,
    segment_names,
    short,
)

KIND_WIDTH = 31
_KIND_PREFIX = b'{"k":"'
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
FOLLOW_CHUNK = 4 << 20


def kind_of(raw: bytes) -> str:
    """The journal kind (`k`) of a record's JSON bytes; '-' for a record without one."""
    if raw.startswith(_KIND_PREFIX):
        end = raw.find(b'"', len(_KIND_PREFIX))
        if end > 0:
            return raw[len(_KIND_PREFIX):end].decode("utf-8", "replace")
    try:
        data = _codec.decode(raw)
    except ValueError:
        return "-"
    kind = data.get("k") if isinstance(data, dict) else None
    return kind if isinstance(kind, str) else "-"


def _turn(data: dict[str, Any]) -> str:
    turn = data.get("turn")
    return "" if turn is None else f" turn {turn}"


def summary(data: Any) -> str:
    """A one-line description of a record, for the table view."""
    if not isinstance(data, dict):
        return short(data, 100)
    kind = data.get("k")
    if kind in ("turn_started", "turn_completed"):
        return _turn(data).strip()
    if kind == "tool_execution_started":
        return f"{data.get('tool')} {data.get('call')}{_turn(data)} args {data.get('ap')}"
    if kind == "tool_execution_finished":
        if data.get("err"):
            return f"{data.get('o')}: {data.get('err')}"
        return f"{data.get('o')}: {data.get('op')}"
    if kind == "tool_execution_ambiguous":
        return f"interrupted by {data.get('et')}"
    if kind == "tool_execution_blocked":
        by = data.get("by") or []
        turns = data.get("bt") or []
        return (f"{data.get('tool')} {data.get('call')}{_turn(data)} refused: blocked by "
                f"{len(by) + len(turns)} blocker(s)")
    if kind in ("tool_execution_resolved", "llm_call_resolved"):
        return f"{data.get('o')} by {data.get('actor')}: {data.get('note')}"
    if kind == "turn_resolved":
        return f"turn {data.get('turn')} by {data.get('actor')}: {data.get('note')}"
    if kind == "tool_execution_reconcile_failed":
        return f"{data.get('tool')} reconcile failed: {data.get('err')}"
    if kind == "llm_call_started":
        return f"model {data.get('model')}{_turn(data)} request {data.get('rp')}"
    if kind == "llm_call_finished":
        return f"{data.get('o')}: {data.get('err') or data.get('op')}"
    return _codec.encode(data).decode("utf-8", "replace")


def _id(data: Any) -> str:
    if isinstance(data, dict) and isinstance(data.get("id"), str):
        return str(data["id"])[:12]
    return "-"


class Printer:
    """Writes records as table rows or JSON Lines, flushing after each batch."""

    def __init__(self, as_json: bool, kinds: list[str] | None) -> None:
        self.as_json = as_json
        self.kinds = set(kinds) if kinds else None
        self.header_done = False
        self.count = 0

    def wanted(self, raw: bytes) -> bool:
        return self.kinds is None or kind_of(raw) in self.kinds

    def write(self, records: Iterable[tuple[int, bytes]]) -> None:
        out = sys.stdout
        for seq, raw in records:
            if self.kinds is not None and kind_of(raw) not in self.kinds:
                continue
            self.count += 1
            if self.as_json:
                out.write(f'{{"seq":{seq},"data":{raw.decode("utf-8", "replace")}}}\n')
                continue
            if not self.header_done:
                out.write(f"{'SEQ':>8}  {'TIME (UTC)':<19}  {'KIND':<{KIND_WIDTH}}  "
                          f"{'ID':<12}  SUMMARY\n")
                self.header_done = True
            try:
                data = _codec.decode(raw)
            except ValueError:
                data = raw.decode("utf-8", "replace")
            t = data.get("t") if isinstance(data, dict) else None
            when = clock(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else "-"
            kind = data.get("k", "-") if isinstance(data, dict) else "-"
            out.write(f"{seq:>8}  {when:<19}  {short(kind, KIND_WIDTH):<{KIND_WIDTH}}  "
                      f"{_id(data):<12}  {short(summary(data), 120)}\n")
        out.flush()


def _report_problems(log_scan: LogScan) -> int:
    if not log_scan.problems:
        return EXIT_OK
    sys.stderr.write(f"walj: {plural(len(log_scan.problems), 'problem')} in the log; records "
                     "that verify were shown, the rest skipped:\n")
    for problem in log_scan.problems[:20]:
        sys.stderr.write(f"  {problem.describe()}\n")
    if len(log_scan.problems) > 20:
        sys.stderr.write(f"  ... and {len(log_scan.problems) - 20} more (`walj verify`)\n")
    return EXIT_PROBLEMS


def cmd_dump(args: argparse.Namespace) -> int:
    path: str = args.path
    if args.from_seq < 0 or (args.to_seq is not None and args.to_seq < args.from_seq):
        raise CliError("--from-seq must be >= 0 and --to-seq >= --from-seq")
    names = segment_names(path)
    log_scan, records = scan(path, names, start_seq=args.from_seq, desc="dumping")
    printer = Printer(args.json, args.kind)
    batch: list[tuple[int, bytes]] = []
    for seq, raw in records:
        if args.to_seq is not None and seq > args.to_seq:
            break
        batch.append((seq, raw))
        if len(batch) >= 512:
            printer.write(batch)
            batch.clear()
    printer.write(batch)
    return _report_problems(log_scan)


# --- tail -----------------------------------------------------------------------------------


class Follower:
    """Reads records appended after a position, segment by segment: a seal line sends it on to
    the next segment once that exists. Lines are checked with the log's own framing code; an
    incomplete or unverified line is waited on, never shown."""

    def __init__(self, path: str, index: int, offset: int, next_seq: int) -> None:
        self.path = path
        self.index = index
        self.offset = offset
        self.next_seq = next_seq
        self.warned_at: tuple[int, int] | None = None

    def poll(self) -> list[tuple[int, bytes]]:
        out: list[tuple[int, bytes]] = []
        while True:
            name = fmt.segment_name(self.index)
            try:
                fd = os.open(os.path.join(self.path, name), os.O_RDONLY | _O_NOFOLLOW)
            except FileNotFoundError:
                return out  # the next segment is not there yet
            try:
                size = os.fstat(fd).st_size
                if size < self.offset:
                    self._shrunk(fd, name, size)
                data = os.pread(fd, min(FOLLOW_CHUNK, size - self.offset), self.offset)
                while b"\n" not in data and len(data) < size - self.offset:  # a long line
                    more = min(len(data), size - self.offset - len(data))
                    data += os.pread(fd, more, self.offset + len(data))
            finally:
                os.close(fd)
            sealed = self._lines(name, data, out)
            if not sealed:
                return out
            self.index += 1
            self.offset = 0

    def _lines(self, name: str, data: bytes, out: list[tuple[int, bytes]]) -> bool:
        pos = 0
        while True:
            nl = data.find(b"\n", pos)
            if nl < 0:
                break
            line = data[pos:nl]
            if not fmt.checksum_ok(line):
                self._warn(name, self.offset + pos)
                break
            pos = nl + 1
            record = fmt.parse_data(line)
            if record is not None:
                if record[0] >= self.next_seq:
                    out.append(record)
                    self.next_seq = record[0] + 1
            elif fmt.parse_seal(line) is not None:
                self.offset += pos
                return True
        self.offset += pos
        return False

    def _warn(self, name: str, offset: int) -> None:
        if self.warned_at != (self.index, offset):
            self.warned_at = (self.index, offset)
            sys.stderr.write(f"walj: {name} at byte {offset}: a line does not verify; waiting "
                             "there (a writer that reopens cuts a torn tail)\n")
            sys.stderr.flush()

    def _shrunk(self, fd: int, name: str, size: int) -> None:
        """The segment was cut below what was read: a writer reopened after a crash and moved a
        torn tail aside. Resume after the last line that is still there."""
        data = os.pread(fd, size, 0)
        self.offset, last = 0, None
        for line in data.split(b"\n")[:-1]:
            if not fmt.checksum_ok(line):
                break
            self.offset += len(line) + 1
            record = fmt.parse_data(line)
            if record is not None:
                last = record[0]
        if last is not None and last + 1 < self.next_seq:
            sys.stderr.write(f"walj: {name} was cut back to seq {last} after a crash; records "
                             f"from seq {last + 1} on are shown again as rewritten\n")
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
    code = _report_problems(log_scan)
    if not args.follow:
        return code
    seg = log_scan.last
    if seg is None or seg.header is None:
        follower = Follower(path, 1 if seg is None else _index(seg.name), 0, 1)
    elif seg.seal is not None:
        follower = Follower(path, seg.header.index + 1, 0, seg.seal.last_seq + 1)
    else:
        follower = Follower(path, seg.header.index, seg.valid_end, (seg.last_seq or 0) + 1)
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
