"""Reading one segment, resumably: every line checked, records yielded as verified, faults kept."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from itertools import count

from ..errors import UnsupportedVersionError, WaljError
from . import format as fmt
from .blocks import check_block, data_of
from .ends import read_ends, read_header  # re-exported: where readers have found them
from .format import SEAL_LINE_LIMIT
from .fs import FileSystem
from .lines import BLOCK_BYTES, LineReader, bad_line_kind, zero_filled

__all__ = ["SEAL_LINE_LIMIT", "TAIL_KINDS", "Problem", "SegmentScan", "bad_line_kind",
           "first_record", "read_ends", "read_header"]

@dataclass(frozen=True)
class Problem:
    """One thing wrong in a log: which file, where, which seq (if known), what kind."""

    file: str
    offset: int
    seq: int | None
    kind: str
    detail: str

    def describe(self) -> str:
        seq = "" if self.seq is None else f" seq {self.seq}"
        return f"{self.file} at byte {self.offset}{seq}: {self.kind}: {self.detail}"


# Problems that a crash mid-append leaves at the end of the last segment. Anything else, or any
# of these with a verified line after it, is damage.
TAIL_KINDS = frozenset(
    {"incomplete_line", "bad_checksum", "bad_line", "zero_fill", "oversize_line", "bad_header"}
)

def one_by_one(blocks: Generator[tuple[int, list[bytes]], None, None]
               ) -> Generator[tuple[int, bytes], None, None]:
    """The records of runs of records (the first one's seq, the data of each), one at a time."""
    try:
        for first, datas in blocks:
            yield from zip(count(first), datas)
    finally:
        blocks.close()  # here, where an interrupt propagates: it closes the file


class SegmentScan:
    """Iterate to read the segment; afterwards the attributes describe what was found.

    Iteration yields (seq, data JSON bytes) for every line whose checksum verifies, in file order,
    from `start_seq` on. Before it yields a record that follows a problem it calls
    `before_late_record`, which raises if such records must not be used, and returns False to
    drop the record (it lies in a crash hole's tail, which recovery cuts).

    The read is incremental: `read_more()` (and iterating again) goes on from where the last
    read stopped, yielding only the complete, verified records appended since (a `tail -f`).
    A last read that ended at what a write in progress leaves (an incomplete line, a line that
    does not verify yet) is forgotten and read again; once damage stands that no later write
    mends (`stopped`), nothing more is read.
    """

    def __init__(
        self,
        fs: FileSystem,
        directory: str,
        name: str,
        *,
        expected_first_seq: int | None = None,
        expected_log_id: str | None = None,
        start_seq: int = 0,
        before_late_record: Callable[[SegmentScan], bool] | None = None,
        chunk_bytes: int = BLOCK_BYTES,
    ) -> None:
        self.fs = fs
        self.start_seq = start_seq
        self.before_late_record = before_late_record
        self.chunk_bytes = chunk_bytes
        self.reported = 0  # how many of `problems` the caller has dealt with
        self.name = name
        self.path = os.path.join(directory, name)
        self.header: fmt.Header | None = None
        self.seal: fmt.Seal | None = None
        self.seal_offset: int | None = None
        self.problems: list[Problem] = []
        self.records = 0
        self.last_seq: int | None = None
        self.expected_seq = expected_first_seq
        self.expected_log_id = expected_log_id
        self.valid_end = 0  # just past the last verified line before the first problem
        self.size = 0
        self.digest = hashlib.sha256()  # bytes [0, seal or first problem)
        self.valid_after_problem = False
        self._hashing = True
        self._buf = b""  # the buffer being split, and the file offset of its first byte
        self._pos = 0

    def _problem(self, offset: int, kind: str, detail: str, seq: int | None = None) -> None:
        self.problems.append(Problem(self.name, offset, seq, kind, detail))

    def _line_limit(self) -> int:
        if self.header is None:
            return fmt.HEADER_LINE_LIMIT
        return self.header.max_record_bytes + fmt.LINE_OVERHEAD

    @property
    def stopped(self) -> bool:
        """True when the segment shows damage no later write can mend (anything but a torn
        tail, or a verified line after one): `read_more` reads nothing more."""
        return self.valid_after_problem or any(p.kind not in TAIL_KINDS for p in self.problems)

    def read_more(self) -> Generator[tuple[int, bytes], None, None]:
        """Yield the records from where the last read stopped to the end of the file as it is
        now: the whole segment at first, then what was appended since (see the class)."""
        return one_by_one(self.read_blocks())

    __iter__ = read_more

    def read_blocks(self) -> Generator[tuple[int, list[bytes]], None, None]:
        """`read_more` a run of records at a time: (the first one's seq, the data of each)."""
        if self.stopped:
            return
        self._forget_tail()  # nothing to forget at first
        fd = self.fs.open_read(self.path)
        try:
            yield from self._scan(fd, self.valid_end)
        finally:
            self.fs.close(fd)
        self._check_seal_digest()

    def _forget_tail(self) -> None:
        """Drop a torn tail's problems, to read again from the end of the last verified line
        (the digest holds exactly the bytes before it)."""
        self.problems.clear()
        self.reported = 0
        self._hashing = self.seal is None
        if self.valid_end == 0:  # no verified header yet
            self.digest = hashlib.sha256()

    def _expecting(self) -> tuple[bool, int, bytes, int]:
        """The fast path's state: whether it may run, the seq it expects next, that seq's tag,
        and where a record's data starts after it."""
        fast = self.header is not None and self.seal is None and not self.problems
        expected = self.expected_seq or 0
        tag = fmt.RECORD_TAG % expected
        return fast, expected, tag, fmt.BODY_START + len(tag)

    def _scan(self, fd: int, start: int) -> Iterator[tuple[int, list[bytes]]]:
        """Every line of the segment passes here, a block (what one read brought) at a time."""
        lines_of = LineReader(self.fs, fd, start, self._line_limit, self._oversize,
                              chunk_bytes=self.chunk_bytes)
        for pos, buf, lines in lines_of:
            self._buf, self._pos = buf, pos
            off = pos
            if pos == 0 and self.header is None:  # the header first, then the rest as a block
                off = yield from self._lines(lines[:1], off)
                lines = lines[1:]
            if lines:
                off = yield from self._block(lines, off)
            if self._hashing:
                self._hash_to(off)
            # Let go of this turn's buffer before the next read, so a long line is held once.
            self._buf = b""
            del buf, lines
        self._end(lines_of)

    def _block(self, lines: list[bytes], off: int) -> Generator[tuple[int, list[bytes]], None,
                                                                int]:
        """The common case, checked a block at a time (walj/log/blocks.py): the lines at file
        offset `off` are all good records, numbered on. Anything else goes line by line, which
        says exactly what is wrong and where. Returns where the lines end."""
        fast, expected, _, _ = self._expecting()
        data_at = check_block(lines, expected) if fast else 0
        if not data_at:
            return (yield from self._lines(lines, off))
        records = len(lines)
        wanted = lines[self.start_seq - expected:] if self.start_seq > expected else lines
        if wanted:
            yield expected + records - len(wanted), data_of(wanted, data_at)
        # Counted once handed on, as line by line: a reader closed at the yield reads them
        # again when it resumes, rather than never.
        end = off + sum(map(len, lines)) + records
        self._settle(records, expected + records, end)
        return end

    def _lines(self, lines: list[bytes], off: int) -> Generator[tuple[int, list[bytes]], None,
                                                                int]:
        """The lines at file offset `off` one by one: a run of verified records with the next
        seq is checked inline, without a call, and handed on as one block; anything else
        (headers, seals, seq anomalies, bad lines) goes to `_line`. Returns where they end."""
        xxh = fmt.xxh64_intdigest
        frame_head = fmt.FRAME_HEAD
        body_start = fmt.BODY_START
        record_tag = fmt.RECORD_TAG
        start_seq = self.start_seq
        fast, expected, tag, data_at = self._expecting()
        counted = 0
        run: list[bytes] = []
        for line in lines:
            verified = line[:body_start] == frame_head % xxh(line[body_start:])
            if (fast and verified and line.startswith(tag, body_start) and line[-1] == 125
                    and line[data_at] == 123):  # a JSON object: "{" ... "}"
                off += len(line) + 1
                counted += 1
                if expected >= start_seq:
                    run.append(line[data_at:-1])
                expected += 1
                tag = record_tag % expected
                data_at = body_start + len(tag)
                continue
            if run:
                yield expected - len(run), run
                run = []
            self._settle(counted, expected, off)
            counted = 0
            end = off + len(line) + 1
            record = self._line(line, off, end, verified)
            fast, expected, tag, data_at = self._expecting()
            off = end
            if record is not None and record[0] >= start_seq:
                yield record[0], [record[1]]
        if run:
            yield expected - len(run), run
        self._settle(counted, expected, off)
        return off

    def _end(self, lines_of: LineReader) -> None:
        """Where the read ended: an incomplete last line, a segment without a header."""
        if lines_of.held:
            kind = "zero_fill" if zero_filled(lines_of.held, lines_of.pos) else "incomplete_line"
            self._problem(lines_of.pos, kind,
                          "last line has no newline (torn or still being written)")
        self.size = lines_of.pos + lines_of.held_bytes
        header_kinds = ("bad_header", "unsupported_version")
        if self.header is None and not any(p.kind in header_kinds for p in self.problems):
            self._problem(0, "bad_header", "segment has no header")

    def _oversize(self, offset: int) -> None:
        self._problem(offset, "oversize_line", f"no newline within {self._line_limit()} bytes")
        self._hashing = False

    def _hash_to(self, upto: int) -> None:
        """Add the bytes of the current buffer up to file offset `upto` to the seal digest."""
        length = upto - self._pos
        self.digest.update(memoryview(self._buf)[:length])
        if length > len(self._buf):  # a long line is held without its newline
            self.digest.update(b"\n")

    def _settle(self, count: int, expected: int | None, off: int) -> None:
        """Carry the fast path's running figures into the attributes."""
        if count:
            self.records += count
            self.expected_seq = expected
            self.last_seq = expected - 1  # type: ignore[operator]
            if not self.problems:
                self.valid_end = off

    def _stop_hashing(self, upto: int) -> None:
        if self._hashing:
            self._hash_to(upto)
            self._hashing = False

    def _line(self, line: bytes, off: int, end: int, verified: bool) -> tuple[int, bytes] | None:
        """Everything but the common case: headers, seals, seq anomalies and bad lines."""
        if not verified:
            if off == 0:
                self._problem(0, "bad_header", "first line is not a valid header")
            else:
                self._problem(off, bad_line_kind(line, off), "checksum does not verify")
            self._stop_hashing(self.valid_end)
            return None
        if self.problems:
            self.valid_after_problem = True
        record = fmt.parse_data(line)
        if record is not None and self.seal is None and (self.header or off):
            return self._record(record, off, end)
        if off == 0 and self.header is None:
            self._read_header(line)
            if self.header is not None:
                self.valid_end = end
            else:
                self._stop_hashing(0)
        else:
            self._after_header(line, off, end)
        return None

    def _record(self, record: tuple[int, bytes], off: int, end: int) -> tuple[int, bytes] | None:
        """A verified record off the fast path: out of order, or after a problem."""
        seq = record[0]
        if seq != self.expected_seq and self.expected_seq is not None:
            kind = "seq_gap" if seq > self.expected_seq else "seq_repeat"
            self._problem(off, kind, f"expected seq {self.expected_seq}", seq)
        self.expected_seq = seq + 1
        # A record out of order or after damage: the caller may raise, or drop it.
        if (self.problems and self.before_late_record is not None
                and not self.before_late_record(self)):
            return None
        self.last_seq = seq
        self.records += 1
        if not self.problems:
            self.valid_end = end
        else:
            self._stop_hashing(self.valid_end)
        return record

    def _after_header(self, line: bytes, off: int, end: int) -> None:
        """A verified line that is not a record, past the header: the seal, or misplaced."""
        if self.seal is None and self.header is not None:
            if not self._read_seal(off, line):
                self._problem(off, "bad_line", "unexpected line kind", None)
                self._stop_hashing(self.valid_end)
            else:
                self._stop_hashing(off)
                if not self.problems:
                    self.valid_end = end
        else:
            kind = "data_after_seal" if self.seal is not None else "bad_line"
            self._problem(off, kind, "line where none may stand", None)
            self._stop_hashing(self.valid_end)

    def _read_header(self, line: bytes) -> None:
        try:
            header = fmt.parse_header(line)
        except UnsupportedVersionError as exc:
            self._problem(0, "unsupported_version", str(exc))
            return
        if header is None:
            self._problem(0, "bad_header", "header line is malformed")
            return
        self.header = header
        if self.expected_log_id is not None and header.log_id != self.expected_log_id:
            # Checked before continuity: a foreign segment's seqs say nothing about this log.
            self._problem(0, "foreign_segment", f"segment belongs to log {header.log_id}, "
                          f"not {self.expected_log_id}", header.first_seq)
            self.expected_seq = header.first_seq
        elif self.expected_seq is None:
            self.expected_seq = header.first_seq
        elif header.first_seq != self.expected_seq:
            kind = "seq_gap" if header.first_seq > self.expected_seq else "seq_repeat"
            self._problem(0, kind, f"segment starts at seq {header.first_seq}, expected "
                          f"{self.expected_seq}", header.first_seq)
            self.expected_seq = header.first_seq

    def _read_seal(self, offset: int, line: bytes) -> bool:
        seal = fmt.parse_seal(line)
        if seal is None:
            return False
        self.seal = seal
        self.seal_offset = offset
        if seal.records != self.records or (self.records and seal.last_seq != self.last_seq):
            self._problem(offset, "seal_mismatch", f"seal counts {seal.records} records to seq "
                          f"{seal.last_seq}; segment has {self.records} to {self.last_seq}")
        return True

    def _check_seal_digest(self) -> None:
        if self.seal is None or self.seal_offset is None:
            return
        if self.digest.hexdigest() != self.seal.sha256:
            self._problem(self.seal_offset, "seal_mismatch",
                          "segment bytes do not match the SHA-256 in its seal", self.seal.last_seq)


# A peek at a segment's first record reads its header and the start of the record at once.
PEEK_BYTES = fmt.HEADER_LINE_LIMIT + 4096


def first_record(fs: FileSystem, directory: str, name: str) -> tuple[int, bytes] | None:
    """(seq, data) of a segment's first verified record, read no further than its end; None
    when the segment holds none or cannot be read."""
    records = SegmentScan(fs, directory, name, chunk_bytes=PEEK_BYTES).read_more()
    try:
        return next(records, None)
    except (OSError, WaljError):
        return None
    finally:
        records.close()
