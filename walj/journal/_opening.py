"""Opening a journal's log: the rebuild starts at the last complete checkpoint, passing over
one a crash cut short, and refuses a log compacted without one."""

from __future__ import annotations

import os
from typing import Any

from ..errors import WaljError
from ..log import Log
from ._checkpoint import IncompleteCheckpointError
from .records import first_part_id
from .state import JournalState


def open_log(path: str | os.PathLike[str], replay_window: int,
              log_options: dict[str, Any]) -> tuple[Log, JournalState]:
    """Open the log, rebuilding the state from its last complete checkpoint (or its first
    record). A checkpoint a crash cut short is passed over for the one before it."""
    passed_over: set[str] = set()
    chosen: list[str] = []

    def starts_here(data: bytes) -> bool:
        checkpoint_id = first_part_id(data)
        if checkpoint_id is None or checkpoint_id in passed_over:
            return False
        chosen.append(checkpoint_id)
        return True

    while True:
        state = JournalState(replay_window)
        chosen.clear()
        try:
            log = Log.open(path, _replay=state.feed, _replay_start=starts_here,
                           **log_options)
        except IncompleteCheckpointError as exc:
            if exc.checkpoint_id in passed_over:
                raise
            passed_over.add(exc.checkpoint_id)
            continue
        try:
            passed = _passed_over(log, state, chosen, passed_over)
            if passed is None:
                return log, state
        except BaseException:
            _close_quietly(log)
            raise
        try:  # no line between the two tries: an interrupt lands in one of them
            passed_over.add(passed)
        finally:
            _close_quietly(log)


def _passed_over(log: Log, state: JournalState, chosen: list[str],
                 passed_over: set[str]) -> str | None:
    """The checkpoint the open began at, when the state could not be taken from it (a crash
    cut it short): the next try passes it over. None when the state is whole."""
    began_at = chosen[-1] if chosen else None
    # The start is chosen from a segment's first bytes, unverified: a kill in the middle of
    # writing a checkpoint's first part (a short write) leaves its opening bytes as a torn
    # tail, and the scan from there feeds no record at all. The state is then empty, not
    # whole: without this, every blocker before it would be forgotten.
    loaded = began_at is None or state.from_checkpoint is not None
    if loaded and state.loading is None and not state.awaiting:
        return None
    if began_at is not None and began_at not in passed_over:
        return began_at
    if log.first_seq > 1:
        raise WaljError(f"{log.path} was compacted without a complete checkpoint after its "
                        "base: a tool journal cannot know what the dropped segments held open, "
                        "so it is not opened; read it with walj.read or `walj dump`")
    state.snapshot()  # raises: the records began at a checkpoint cut short
    return None


def _close_quietly(log: Log) -> None:
    try:
        log.close()
    except WaljError:
        pass  # the open's own state, or the exception in flight, says more
