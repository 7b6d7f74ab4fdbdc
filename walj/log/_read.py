"""Lock-free reading and verification of a log directory, safe beside a live writer."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import count, repeat
from typing import Any, NamedTuple, cast

from .. import _codec
from .._batch import block_parser
from ..errors import CorruptionError, DroppedWhileReadingError, WaljError
from ._base import Base, read_base
from .fs import DEFAULT_FS, FileSystem
from .scan import LogScan, TornTail, corruption
from .segment import Problem


class Record(NamedTuple):
    """One record as read back: its sequence number and its data."""

    seq: int
    data: dict[str, Any]


@dataclass
class VerifyReport:
    """What `verify` found. `ok` is False when any problem was found; a torn tail alone (a crash
    mid-append, or a writer still writing its last line) is reported but leaves `ok` True."""

    ok: bool
    records: int
    segments: list[str]
    torn_tail: TornTail | None
    problems: list[Problem] = field(default_factory=list)
    log_id: str | None = None
    last_seq: int = 0
    base: Base | None = None  # where a compacted log begins; None: at segment 1
    leftovers: list[str] = field(default_factory=list)  # below the base: an interrupted drop's


def _check_directory(path: str) -> None:
    if not os.path.exists(path):
        raise WaljError(f"{path} does not exist")
    if not os.path.isdir(path):
        raise WaljError(f"{path} is not a directory (a log is a directory of segments)")


def read(
    path: str | os.PathLike[str],
    start_seq: int = 0,
    *,
    recovery: str = "tolerate_tail",
    _fs: FileSystem = DEFAULT_FS,
) -> Iterator[Record]:
    """Yield the log's records in order from `start_seq`, taking no lock.

    Each record's checksum is verified before it is yielded. An incomplete last line is a write
    in progress (or a torn tail) and ends the iteration quietly; other damage raises
    CorruptionError when reached (recovery="salvage" skips it instead). So does a hole of
    zeros with verified records after it (kind "crash_hole"): a power cut leaves one among
    unsynced appends, which the writer's next open cuts, but damage to synced data looks the
    same, and the records behind it are never handed out as if the log ended there.
    """
    directory = os.fspath(path)
    _check_directory(directory)
    return read_view(directory, _fs, start_seq, recovery=recovery)


_DECODE = _codec.raw_decoder()[0]
_DECODE_ERROR = _codec.raw_decoder()[1]
_new_tuple = tuple.__new__  # a Record from (seq, data) without a Python-level call


def _one_by_one(directory: str, first: int, datas: list[bytes],
                salvage: bool) -> Iterator[Record]:
    """A block that did not parse at once: each record on its own, to say which one fails."""
    for seq, data in zip(count(first), datas):
        try:
            value = _DECODE(data)
        except (_DECODE_ERROR, RecursionError) as exc:  # checksummed, yet by no walj
            if salvage:
                continue
            raise CorruptionError(f"record {seq} of {directory} cannot be decoded: {exc}",
                                  seq=seq, kind="bad_line") from exc
        yield Record(seq, value)


def read_view(directory: str, fs: FileSystem, start_seq: int = 0, *,
              recovery: str = "tolerate_tail",
              end_problem: Callable[[LogScan], Problem | None] | None = None) -> Iterator[Record]:
    """`read` of the log that `fs` shows as `directory` (the local file system, or a view
    such as an archive's). `end_problem`, asked once every record is read, names what the
    view alone knows is wrong at the log's end; it raises unless recovery is "salvage"."""
    scan = LogScan(directory, mode=recovery, start_seq=start_seq, fs=fs, follow_rotation=True,
                   report_holes=True)
    parse = block_parser()
    salvage = recovery == "salvage"
    blocks = scan.blocks()
    try:
        for first, datas in blocks:
            try:
                values = list(map(parse, datas))  # a block in one C-level call
            except (_DECODE_ERROR, RecursionError):
                yield from _one_by_one(directory, first, datas, salvage)
                continue
            yield from cast("Iterator[Record]", map(_new_tuple, repeat(Record),
                                                    zip(count(first), values)))
    except FileNotFoundError as exc:
        base = read_base(fs, directory)
        if base is None or (scan.base is not None and base.index <= scan.base.index):
            raise  # not a drop: the file system changed under the reader some other way
        raise DroppedWhileReadingError(
            f"{directory}: segments were dropped (Log.drop_before) while this read went on; "
            f"the log now begins at seq {base.first_seq}: read again from there",
            first_seq=base.first_seq) from exc
    finally:
        # A reader that stops early closes this generator: the scan's files are closed here,
        # where an interrupt propagates, not when the garbage collector frees it, which
        # would swallow one.
        blocks.close()
    problem = end_problem(scan) if end_problem is not None else None
    if problem is not None and not salvage:
        raise corruption(problem)


def verify(path: str | os.PathLike[str], *, _fs: FileSystem = DEFAULT_FS) -> VerifyReport:
    """Check every checksum, seq, seal and header of the log without changing anything."""
    directory = os.fspath(path)
    _check_directory(directory)
    return verify_view(directory, _fs)


def verify_view(directory: str, fs: FileSystem, *,
                finish: Callable[[LogScan], None] | None = None) -> VerifyReport:
    """`verify` of the log that `fs` shows as `directory`; `finish` may add to the scan's
    problems what only the view knows, before the report is made."""
    scan = LogScan(directory, mode="salvage", fs=fs)
    for _ in scan:
        pass
    if finish is not None:
        finish(scan)
    return VerifyReport(
        ok=not scan.problems,
        records=scan.records,
        segments=scan.segments,
        torn_tail=scan.torn_tail,
        problems=scan.problems,
        log_id=scan.log_id,
        last_seq=scan.last_seq,
        base=scan.base,
        leftovers=scan.leftovers,
    )
