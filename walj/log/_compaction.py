"""Compaction: dropping a log's oldest sealed segments, crash-safely, behind a base marker."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from ..errors import CorruptionError
from ._base import Base, find_start, write_base
from ._durability import WriterState
from .scan import corruption, list_segments
from .segment import Problem, read_ends, read_header


class Compaction:
    """Where a log begins (`first_seq`) and dropping what comes before. Order on disk, so that a
    crash anywhere leaves a log that opens with every record not meant to go: (1) BASE written
    to BASE.tmp, synced, renamed over BASE, directory synced; (2) the dropped segments
    unlinked, oldest first; (3) directory synced. Segments below the base are never read; the
    next drop removes what an interrupted one left (after syncing the directory once more, so
    the marker is durable before any unlink). `drop_lock` is held for a whole drop: closing
    waits for it, and it is reentrant, since a signal handler may close."""

    def __init__(self, state: WriterState, ready: Callable[[], None]) -> None:
        self._state = state
        self._fs, self._dir = state.fs, state.dir
        self._ready = ready  # with the lock held: raise unless the handle may write now
        self.first_seq = 1
        self.drop_lock = threading.RLock()

    def segments(self) -> list[tuple[str, int]]:
        """The segment files from the base on, oldest first, each with its first seq."""
        listed, _ = list_segments(self._fs, self._dir)
        begin = find_start(self._fs, self._dir, listed)
        lowest = begin.base.index if begin.base is not None else 0
        found: list[tuple[str, int]] = []
        for index, name in listed:
            if index < lowest:
                continue
            header = read_header(self._fs, self._dir, name)
            if header is None:
                break
            found.append((name, header.first_seq))
        return found

    def drop_before(self, seq: int) -> int:
        """Delete every sealed segment whose records all come before `seq` (see Log)."""
        if type(seq) is not int:
            raise TypeError(f"seq must be an int, not {type(seq).__name__}")
        if seq < 1:
            raise ValueError(f"seq must be >= 1, not {seq}")
        st = self._state
        with self.drop_lock:
            with st.lock:
                self._ready()
                st.check_lock()
                if seq > st.next_seq:
                    raise ValueError(f"seq {seq} is beyond the log's end (last seq "
                                     f"{st.next_seq - 1})")
                active = st.index
            try:
                return self._drop(seq, active)
            except OSError as exc:
                with st.lock:
                    raise st.poison(exc) from exc

    def _drop(self, seq: int, active: int) -> int:
        # Segments below `active` are sealed and their seals synced (rotation syncs the seal
        # before it creates the next segment), and only higher ones appear while this runs.
        listed, refused = list_segments(self._fs, self._dir)
        if refused:
            raise corruption(refused[0])
        begin = find_start(self._fs, self._dir, listed)
        if begin.problems:
            raise corruption(begin.problems[0])
        removed = self._remove(begin.leftovers, sync_first=True)
        first = begin.base.index if begin.base is not None else 1
        kept = [(index, name) for index, name in listed if first <= index <= active]
        target: tuple[int, str] | None = None
        for position, (index, name) in enumerate(kept):
            if index != first + position:
                raise corruption(Problem(name, 0, None, "missing_segment",
                                         f"segment {first + position} is missing"))
            header = read_header(self._fs, self._dir, name)
            if header is None:
                raise corruption(Problem(name, 0, None, "bad_header",
                                         "header does not verify; nothing dropped"))
            if header.first_seq > seq:
                break
            target = (index, name)
        if target is None or target[0] == first:
            return removed
        base = self._new_base(target[1], kept[target[0] - first - 1][1])
        write_base(self._fs, self._dir, base)
        self.first_seq = base.first_seq
        return removed + self._remove([name for _, name in kept[:target[0] - first]],
                                      sync_first=False)

    def _new_base(self, name: str, below: str) -> Base:
        """The marker for a log that begins at `name`, once the segment before it is proven to
        be the one whose seal `name`'s header carries: never drop what does not chain."""
        header = read_header(self._fs, self._dir, name)
        _, seal = read_ends(self._fs, self._dir, below)
        if header is None or header.log_id != self._state.log_id:
            raise corruption(Problem(name, 0, None, "foreign_segment",
                                     "the first kept segment is not this log's"))
        if seal is None or seal.sha256 != header.prev_seal or \
                seal.last_seq != header.first_seq - 1:
            raise corruption(Problem(below, 0, None, "seal_chain",
                                     f"its seal does not chain to {name}; nothing dropped"))
        return Base(header.log_id, header.index, header.first_seq, header.prev_seal)

    def _remove(self, names: list[str], *, sync_first: bool) -> int:
        """Unlink `names` (all below a durable base), oldest first, then sync the directory.
        `sync_first`: the marker was found on disk, perhaps renamed by a call an interrupt
        stopped before its directory sync; sync before the first unlink all the same."""
        if not names:
            return 0
        if sync_first:
            self._fs.sync_dir(self._dir)
        removed = 0
        for name in names:
            header = read_header(self._fs, self._dir, name)
            if header is not None and header.log_id != self._state.log_id:
                raise CorruptionError(f"{name}, below the base, belongs to log "
                                      f"{header.log_id}: not removed", file=name, offset=0,
                                      kind="foreign_segment")
            try:
                self._fs.unlink(os.path.join(self._dir, name))
                removed += 1
            except FileNotFoundError:
                pass
        self._fs.sync_dir(self._dir)
        return removed
