"""Reading a whole log directory: segment order, seal chain, seq continuity, torn tail vs damage."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Generator
from dataclasses import dataclass
from functools import partial

from ..errors import CorruptionError, UnsupportedVersionError
from . import format as fmt
from ._base import Base, base_mismatch, find_start
from .fs import DEFAULT_FS, FileSystem, file_kind, not_regular, refuse_hard_link
from .segment import TAIL_KINDS, Problem, SegmentScan, bad_line_kind, one_by_one, read_ends

__all__ = ["MODES", "LogScan", "TornTail", "check_for_writer", "corruption", "list_segments"]

MODES = ("tolerate_tail", "strict", "salvage")


@dataclass(frozen=True)
class TornTail:
    """Bytes at the end of the last segment that a crash left half-written."""

    file: str
    offset: int
    length: int
    kind: str


def _crash_hole(seg: SegmentScan, final: bool) -> bool:
    """A power cut can persist later unsynced appends and lose an earlier one, leaving zeroed
    sectors and then verified lines. In the last segment, damage that starts with zeroed
    sectors and is followed only by torn lines and the seq gap it causes is such a hole: its
    records were never acknowledged as durable (a sync that covered them would have covered the
    hole too), so recovery cuts from the hole on. Non-zero damage followed by records is never
    a crash: it refuses."""
    problems = seg.problems
    return (final and bool(problems) and problems[0].kind == "zero_fill"
            and all(p.kind in TAIL_KINDS or p.kind in AFTER_HOLE for p in problems[1:]))


# What a hole leaves after it: the gap of the lost records, and, when the crash came during a
# rotation before the seal was synced, a seal that no longer matches what stands before it.
AFTER_HOLE = frozenset({"seq_gap", "seal_mismatch"})


def list_segments(fs: FileSystem, directory: str) -> tuple[list[tuple[int, str]], list[Problem]]:
    """Segment files in log order, and a problem for each entry named like a segment that is
    refused: a symlink, or anything but a regular file (a FIFO would hang the reader)."""
    found: list[tuple[int, str]] = []
    refused: list[Problem] = []
    for name in fs.listdir(directory):
        index = fmt.segment_index(name)
        if index is None:
            continue
        try:
            mode = fs.stat(os.path.join(directory, name)).st_mode
        except FileNotFoundError:
            continue  # removed since the listing (a writer cut a torn header): not there
        if stat.S_ISLNK(mode):
            refused.append(Problem(name, 0, None, "symlink", "segment is a symbolic link"))
        elif not stat.S_ISREG(mode):
            refused.append(Problem(name, 0, None, "not_a_regular_file",
                                   f"segment is {file_kind(mode)[1]}, not a regular file"))
        else:
            found.append((index, name))
    found.sort()
    return found, refused


def check_for_writer(fs: FileSystem, directory: str) -> list[str]:
    """Before a writer changes anything: refuse a segment with other hard links (appending to
    it, or cutting its tail, would reach every other name) and a rotation temp file that is not
    a regular file. Returns the temp files a dead rotation left, which the writer removes."""
    stale: list[str] = []
    for name in sorted(fs.listdir(directory)):
        path = os.path.join(directory, name)
        if fmt.segment_index(name) is not None:
            st = fs.stat(path)
            if stat.S_ISREG(st.st_mode):
                refuse_hard_link(path, st)  # other kinds: list_segments refuses them
        elif (name.endswith(fmt.SEGMENT_TMP_SUFFIX)
              and fmt.segment_index(name[:-len(fmt.SEGMENT_TMP_SUFFIX)]) is not None):
            st = fs.stat(path)
            if not stat.S_ISREG(st.st_mode):
                raise not_regular(path, st)
            stale.append(name)
    return stale


def corruption(problem: Problem) -> CorruptionError:
    return CorruptionError(
        problem.describe(),
        file=problem.file,
        offset=problem.offset,
        seq=problem.seq,
        kind=problem.kind,
    )


class LogScan:
    """Iterate to read a log: yields (seq, data JSON bytes) of every record that verifies.

    `mode` decides what a problem does: "tolerate_tail" raises CorruptionError at the first
    problem that is not a torn tail, "strict" at any problem, "salvage" never raises and goes on.
    Afterwards `problems`, `torn_tail`, `segments` and `last` describe the log.
    """

    def __init__(
        self,
        directory: str,
        *,
        mode: str = "tolerate_tail",
        start_seq: int = 0,
        fs: FileSystem = DEFAULT_FS,
        follow_rotation: bool = False,
        report_holes: bool = False,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"recovery must be one of {', '.join(MODES)}, not {mode!r}")
        self.directory = directory
        self.mode = mode
        self.start_seq = start_seq
        self.fs = fs
        self.follow_rotation = follow_rotation
        self.report_holes = report_holes
        self.problems: list[Problem] = []
        self.torn_tail: TornTail | None = None
        self.segments: list[str] = []
        self.last: SegmentScan | None = None
        self.before_last: SegmentScan | None = None
        self.reading: SegmentScan | None = None  # while iterating: the last record's segment
        self.log_id: str | None = None
        self.base: Base | None = None  # where a compacted log begins (BASE)
        self.leftovers: list[str] = []  # segments below the base, never read
        self.records = 0
        self.last_seq = 0

    def _report(self, problem: Problem) -> None:
        self.problems.append(problem)
        if self.mode == "salvage":
            return
        if problem.kind == "unsupported_version":
            raise UnsupportedVersionError(
                problem.describe(), file=problem.file, offset=0, kind=problem.kind
            )
        raise corruption(problem)

    def __iter__(self) -> Generator[tuple[int, bytes], None, None]:
        return one_by_one(self.blocks())

    def blocks(self) -> Generator[tuple[int, list[bytes]], None, None]:
        """The records a run at a time: (the first one's seq, the data of each)."""
        listed, refused = list_segments(self.fs, self.directory)
        for problem in refused:
            self._report(problem)
        listed, prev_index, prev_seal, expected_seq = self._begin(listed)
        i = 0
        while i < len(listed):
            index, name = listed[i]
            final = i == len(listed) - 1
            if index != prev_index + 1:
                self._report(Problem(name, 0, expected_seq, "missing_segment",
                                     f"segment {prev_index + 1} is missing before {name}"))
            skipped = None if final else self._skip(index, name, prev_seal, expected_seq)
            if skipped is not None:
                prev_seal, expected_seq = skipped
                self.last_seq = expected_seq - 1
                self.segments.append(name)
            else:
                at_base = self.base is not None and index == self.base.index
                seg = SegmentScan(self.fs, self.directory, name,
                                  expected_first_seq=None if at_base else expected_seq,
                                  expected_log_id=self.log_id, start_seq=self.start_seq,
                                  before_late_record=partial(self._late_record, final=final))
                self.reading = seg
                yield from seg.read_blocks()
                self._finish(seg, listed, i, prev_seal)
                prev_seal = seg.seal.sha256 if seg.seal else ""
                if seg.last_seq is not None:
                    expected_seq = seg.last_seq + 1
                elif seg.header is not None:
                    expected_seq = seg.header.first_seq
            prev_index = index
            i += 1

    def _begin(self, listed: list[tuple[int, str]]) -> tuple[list[tuple[int, str]], int, str,
                                                              int | None]:
        """Where the chain starts: (the segments to read, the index, seal digest and seq that
        come before the first of them, None when unknown): at segment 1, or at BASE."""
        begin = find_start(self.fs, self.directory, listed)
        for problem in begin.problems:
            self._report(problem)
        if begin.base is None:
            return listed, 0, "", None
        base = self.base = begin.base  # a compacted log: the chain goes on from the marker
        self.leftovers = begin.leftovers
        self.log_id = base.log_id
        # Every record below the base was dropped, none lost: the log ends at least there,
        # even when no record follows the base yet.
        self.last_seq = base.first_seq - 1
        kept = [entry for entry in listed if entry[0] >= base.index]
        return kept, base.index - 1, base.prev_seal, base.first_seq

    def _finish(self, seg: SegmentScan, listed: list[tuple[int, str]], i: int,
                prev_seal: str) -> None:
        """After a segment's records: its header against the chain, its problems decided."""
        index = listed[i][0]
        start = seg.reported
        self.records += seg.records
        if seg.last_seq is not None:
            self.last_seq = seg.last_seq
        self._check_header(seg, index, prev_seal)
        final = i == len(listed) - 1
        if final and seg.seal is not None and self.follow_rotation:
            more, _ = list_segments(self.fs, self.directory)
            listed.extend(entry for entry in more if entry[0] > index)
            final = i == len(listed) - 1
        if not final and seg.seal is None:
            seg.problems.append(Problem(seg.name, seg.size, seg.last_seq, "unsealed_segment",
                                        "a segment before the last has no seal"))
        self._segment_problems(seg, start, final, before_record=False)
        self.segments.append(seg.name)
        self.before_last, self.last = self.last, seg

    def _late_record(self, seg: SegmentScan, *, final: bool) -> bool:
        """Before a record that follows a problem: raise, drop it (False) or yield it (True)."""
        if self.mode != "salvage" and _crash_hole(seg, final):
            if self.report_holes and self._hole_stays(seg):
                first = seg.problems[0]
                raise CorruptionError(
                    f"{seg.name} has zeroed bytes at offset {first.offset} with verified "
                    "records after them: a power cut's hole (the writer's next open cuts it "
                    "into quarantine/) or damage to synced data; the records from there on are "
                    "not read", file=seg.name, offset=first.offset, seq=first.seq,
                    kind="crash_hole")
            return False  # behind a crash hole: recovery cuts it, a reader never sees it
        self._segment_problems(seg, seg.reported, final, before_record=True)
        seg.reported = len(seg.problems)
        return True

    def cuts(self, names: list[str], size_of: Callable[[str], int], *,
             through_damage: bool) -> list[tuple[str, int, str]]:
        """Where to cut (segment, offset, kind), last segment first, so that what stays
        verifies: at the torn tail (recovery on open), or, `through_damage`, at the first
        problem or the torn tail with every later segment of `names` whole (`walj repair`)."""
        points = [(fmt.segment_index(p.file) or 0, p.offset, p.kind)
                  for p in (self.problems if through_damage else [])]
        torn = self.torn_tail
        if torn is not None:
            points.append((fmt.segment_index(torn.file) or 0, torn.offset, torn.kind))
        if not points:
            return []
        index, offset, kind = min(points)
        cuts: list[tuple[str, int, str]] = []
        for name in sorted(names, key=lambda n: fmt.segment_index(n) or 0, reverse=True):
            seg_index = fmt.segment_index(name) or 0
            if seg_index > index:
                cuts.append((name, 0, f"after_{kind}"))
            elif seg_index == index and (offset == 0 or offset < size_of(name)):
                cuts.append((name, offset, kind))
        return cuts

    def _hole_stays(self, seg: SegmentScan) -> bool:
        """Read the hole's first line again: beside a live writer a reader may have seen a
        write's bytes before the kernel copied them in (zeros), then a later write whole. Once
        the bytes are there, it was not a hole."""
        first = seg.problems[0]
        fd = self.fs.open_read(os.path.join(self.directory, seg.name))
        try:
            again = self.fs.pread(fd, fmt.HEADER_LINE_LIMIT, first.offset)
        finally:
            self.fs.close(fd)
        end = again.find(b"\n")
        return bad_line_kind(again[:end] if end >= 0 else again, first.offset) == "zero_fill"

    def _skip(self, index: int, name: str, prev_seal: str,
              expected_seq: int | None) -> tuple[str, int] | None:
        """When reading from start_seq, a sealed segment holding only earlier records is not
        read: (its seal digest, the next seq), once its header and its seal line pass what a
        full read checks of them (log id, index, seq continuity, the seal chain; the next
        segment's header is checked against this seal in turn). None: read it whole, because
        its records are wanted or because something is amiss, which the full read then reports
        as it would without start_seq. What only its records show (a digest or a count that
        does not match them) is left unread."""
        if not self.start_seq:
            return None
        header, seal = read_ends(self.fs, self.directory, name)
        if header is None or seal is None or not self._continues(header, index, prev_seal,
                                                                  expected_seq):
            return None
        next_seq = header.first_seq + seal.records
        if seal.records < 0 or (seal.records and seal.last_seq != next_seq - 1):
            return None
        if next_seq > self.start_seq:
            return None  # it holds a wanted record
        self.log_id = header.log_id
        return seal.sha256, next_seq

    def _continues(self, header: fmt.Header, index: int, prev_seal: str,
                   expected_seq: int | None) -> bool:
        """A segment's header goes on from the one before, as a full read checks it: index,
        seal chain, first seq, log id."""
        if header.index != index or header.prev_seal != prev_seal:
            return False
        if expected_seq is not None and header.first_seq != expected_seq:
            return False
        if self.log_id is None:
            return index != 1 or header.first_seq == 1
        return header.log_id == self.log_id

    def _check_header(self, seg: SegmentScan, index: int, prev_seal: str) -> None:
        header = seg.header
        if header is None:
            return
        if self.log_id is None:
            self.log_id = header.log_id
            if index == 1 and header.first_seq != 1:
                seg.problems.append(Problem(seg.name, 0, header.first_seq, "missing_segment",
                                            "the first segment does not start at seq 1"))
        elif self.base is not None and index == self.base.index:
            mismatch = base_mismatch(self.base, header, seg.name)
            if mismatch is not None:
                seg.problems.append(mismatch)
            prev_seal = header.prev_seal  # checked against the marker, not a seal
        elif header.log_id != self.log_id:
            return  # the segment scan reported it as foreign_segment
        if header.index != index:
            seg.problems.append(Problem(seg.name, 0, header.first_seq, "bad_header",
                                        f"header says segment {header.index}"))
        if header.prev_seal != prev_seal:
            seg.problems.append(Problem(seg.name, 0, header.first_seq, "seal_chain",
                                        "header does not carry the previous segment's seal"))

    def _segment_problems(
        self, seg: SegmentScan, start: int, final: bool, *, before_record: bool
    ) -> None:
        """Decide, for the problems seg found since `start`, whether they are a torn tail."""
        if not seg.problems:
            return
        new = seg.problems[start:]
        first = seg.problems[0]
        torn = not before_record and final and first.kind in TAIL_KINDS and (
            not seg.valid_after_problem or _crash_hole(seg, final))
        if not torn:
            # A verified record after a problem, or a problem anywhere but the log's end.
            for problem in new:
                self._report(problem)
            return
        hole = _crash_hole(seg, final)
        for problem in new:
            if problem.kind not in TAIL_KINDS and not (hole and problem.kind in AFTER_HOLE):
                self._report(problem)
        self.torn_tail = TornTail(seg.name, first.offset, seg.size - first.offset, first.kind)
        if self.mode == "strict":
            self._report(first)
