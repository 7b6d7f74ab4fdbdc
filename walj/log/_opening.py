"""Opening a log directory: checking options, creating the directory, recovering its tail."""

from __future__ import annotations

import os
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from itertools import count

from ..errors import WaljError
from . import format as fmt
from ._base import find_start
from .fs import FileSystem
from .quarantine import Quarantined, cut_segment
from .scan import MODES, LogScan, check_for_writer, list_segments
from .segment import Problem, SegmentScan, first_record

SYNC_MODES = ("always", "batch", "interval", "never")
Replay = Callable[[int, bytes], None]
# Asked of the first record of each segment, newest first: may the replay start here?
ReplayStart = Callable[[bytes], bool]
# How much of a segment's first record a ReplayStart sees: enough for a layer above to tell
# what kind of record begins the segment, never a whole large record.
FIRST_RECORD_PEEK = 4096


def check_options(sync: str, segment_bytes: int, max_record_bytes: int, recovery: str,
                  lock_timeout: float, sync_interval_ms: float) -> None:
    if sync not in SYNC_MODES:
        raise ValueError(f"sync must be one of {', '.join(SYNC_MODES)}, not {sync!r}")
    if recovery not in MODES:
        raise ValueError(f"recovery must be one of {', '.join(MODES)}, not {recovery!r}")
    if not 1 <= max_record_bytes <= fmt.MAX_RECORD_BYTES_LIMIT:
        raise ValueError(f"max_record_bytes must be 1..{fmt.MAX_RECORD_BYTES_LIMIT}")
    if segment_bytes < 1024:
        raise ValueError("segment_bytes must be at least 1024")
    if lock_timeout < 0 and lock_timeout != -1:
        raise ValueError("lock_timeout must be >= 0 seconds, or -1 to wait forever")
    if sync_interval_ms <= 0:
        raise ValueError("sync_interval_ms must be > 0")


def prepare_directory(fs: FileSystem, directory: str, create: bool) -> None:
    """Refuse a path that is not a directory; create a missing one (0700), and each missing
    ancestor, syncing every new directory's parent: a power cut may otherwise drop the tree."""
    if os.path.lexists(directory):
        if not os.path.isdir(directory):
            raise WaljError(f"{directory} exists and is not a directory")
        return
    if not create:
        raise WaljError(f"{directory} does not exist")
    missing: list[str] = []
    path = os.path.abspath(directory)
    while not os.path.lexists(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for path in reversed(missing):  # top down: each parent exists before its child
        try:
            fs.mkdir(path)
        except FileExistsError:
            if not os.path.isdir(path):
                raise WaljError(f"{path} exists and is not a directory") from None
            continue  # another opener made it first; the lock decides which of us writes
        fs.sync_dir(os.path.dirname(path))


@dataclass
class Recovered:
    """What a writer needs from the log on disk to go on appending."""

    log_id: str
    last: SegmentScan | None  # the segment to append to, or to seal from; None: a new log
    last_seq: int
    problems: list[Problem]
    torn_tail: Quarantined | None
    first_seq: int = 1  # where a compacted log begins (its BASE); 1 otherwise


def replay_start(fs: FileSystem, directory: str, choose: ReplayStart) -> int:
    """The seq to replay from: the first record of the newest segment (from the base on)
    whose first record `choose` accepts, or 0 (from the beginning) when none does. Costs one
    read per segment looked at, newest first, however many records they hold."""
    listed, _ = list_segments(fs, directory)
    begin = find_start(fs, directory, listed)
    lowest = begin.base.index if begin.base is not None else 0
    for index, name in reversed(listed):
        if index < lowest:
            break
        first = first_record(fs, directory, name)
        if first is not None and choose(first[1][:FIRST_RECORD_PEEK]):
            return first[0]
    return 0


def recover(fs: FileSystem, directory: str, mode: str, replay: Replay | None, *,
            writable: bool, start: ReplayStart | None = None) -> Recovered:
    """Scan the log (feeding `replay`), then, if writable, cut a torn tail aside. With
    `start`, the scan begins at the segment `replay_start` picks: sealed segments before it
    are checked by their header and seal alone (the chain), their records not read."""
    if writable:
        for name in check_for_writer(fs, directory):
            # A rotation died before its rename: the file holds a header and nothing else.
            fs.unlink(os.path.join(directory, name))
            fs.sync_dir(directory)
    start_seq = replay_start(fs, directory, start) if start is not None else 0
    scan = LogScan(directory, mode=mode, fs=fs, start_seq=start_seq)
    # Consumed a block at a time at C speed: on open, this runs once per record of the log.
    for first, datas in scan.blocks():
        if replay is not None:
            deque(map(replay, count(first), datas), maxlen=0)
    last = scan.last
    quarantined = None
    # The torn tail lies in the last segment: one cut at most (the planner `walj repair` uses).
    plan = scan.cuts(scan.segments, lambda name: fs.stat(os.path.join(directory, name)).st_size,
                     through_damage=False) if writable else []
    for name, offset, kind in plan:
        quarantined = cut_segment(fs, directory, name, offset, kind)
        if offset == 0:
            last = scan.before_last
        elif last is not None and last.seal_offset is not None and last.seal_offset >= offset:
            last.seal = None  # the seal was cut with the tail: append to the segment again
    return Recovered(scan.log_id or uuid.uuid4().hex, last, scan.last_seq, scan.problems,
                     quarantined, scan.base.first_seq if scan.base is not None else 1)
