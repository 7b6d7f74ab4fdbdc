"""Writing checkpoints, and compaction: a checkpoint, then the sealed segments before it
dropped (shipped to an archive first when asked). The journal side of docs/RECOVERY.md,
"Checkpoints" and "Compaction". Upkeep is not activity: a checkpoint, and an end written as
upkeep, carry the time of the session's last record forward (docs/CLI.md, prune's age)."""

from __future__ import annotations

import os
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from ..errors import CorruptionError, RecordTooLargeError, WaljError
from ..log import Record, read
from . import _writes
from . import records as rc
from ._checkpoint_parts import build_parts, carried_settlings
from .records import time_of
from .state import MAX_KEEP_TURNS

if TYPE_CHECKING:
    from ._core import Core

# Ships a session's sealed segments to an archive URL and returns the names of those whose
# archived copy was read back whole and matched (walj.archive's, which lies above the journal:
# the journal never imports it, the caller passes it).
Archiver = Callable[[str, str, "dict[str, Any] | None"], "set[str]"]


@dataclass(frozen=True)
class CompactReport:
    """What `ToolJournal.compact` did."""

    checkpoint_seq: int  # the first record of the checkpoint written
    first_seq: int  # the log's first record now
    dropped_segments: int  # segment files deleted
    archived: tuple[str, ...] = ()  # segments whose archived copy was verified (archive=)
    archive_url: str | None = None


def settling_records(core: Core, settled: list[tuple[str, int]]
                     ) -> dict[str, tuple[dict[str, Any], int]]:
    """For each (call id, seq) of the replay index, the record that settled the call and its
    own seq (a checkpoint part at seq carries those a checkpoint kept), read back from the
    log in one pass from the oldest. CorruptionError when one cannot be read back."""
    wanted: dict[int, list[str]] = {}
    for call_id, seq in settled:
        wanted.setdefault(seq, []).append(call_id)
    found: dict[str, tuple[dict[str, Any], int]] = {}
    if not wanted:
        return found
    last = max(wanted)
    records = cast("Generator[Record, None, None]",
                   read(core.log.path, min(wanted), **core.options.read_options))
    try:
        for record in records:
            call_ids = wanted.pop(record.seq, None)
            if call_ids is not None and isinstance(record.data, dict):
                if record.data.get("kind") == rc.CHECKPOINT:
                    found.update(carried_settlings(record.data, call_ids))
                else:
                    found.update(dict.fromkeys(call_ids, (record.data, record.seq)))
            if not wanted or record.seq >= last:
                break
    finally:
        records.close()  # here, not in the collector, where an interrupt would be swallowed
    for call_id, seq in settled:
        if call_id not in found:
            raise CorruptionError(f"the record that settled call id {call_id!r} (record {seq}) "
                                  "could not be read back", seq=seq, kind="journal_record")
    return found


def _settling(core: Core) -> dict[str, tuple[dict[str, Any], int]]:
    """Every settled call's settling record, for a checkpoint."""
    return settling_records(core, core.view(
        lambda state: [(call_id, seq) for call_id, (_, seq) in state.calls.settled.items()]))


def checkpoint(core: Core) -> int:
    """Write a checkpoint of the journal's state at the start of a new segment, each part
    durable, and return the seq of its first record. RecordTooLargeError, nothing written,
    when an item (an open execution with large stored arguments) cannot fit a record."""
    with core.writing():
        core.check_open()
        core.write_queued()
        parts = build_parts(core.state, _settling(core), core.options.record_limit,
                            last_activity(core))
        core.log.rotate()  # so the checkpoint begins a segment, where an open looks for it
        first = 0
        for part in parts:
            seq = core.write(part, durable=True)
            first = first or seq
        return first


def last_activity(core: Core) -> float:
    """With write_lock held: the time of the session's last activity, the `at` of its last
    record. Upkeep records carry it forward, so it is theirs too. Never later than now; now
    when the log is empty or its last record has no plausible time (younger is the safe side:
    retention keeps a young session)."""
    now = _writes.now()
    if core.log.last_seq < 1:
        return now
    records = cast("Generator[Record, None, None]",
                   read(core.log.path, core.log.last_seq, **core.options.read_options))
    try:
        last = next(records, None)
    finally:
        records.close()
    data = last.data if last is not None else None
    at = time_of(data.get("at")) if isinstance(data, dict) else None
    return now if at is None else min(at, now)


def end_idle(core: Core, idle_since: float) -> int | None:
    """End the session as `ToolJournal.end` does if its last activity is no later than
    `idle_since`, its `session_ended` carrying that time instead of now (retention ending an
    idle session must not make it look younger). Returns the log's last seq once ended; None,
    nothing written, when the session is not idle. `core`: an open ToolJournal's."""
    with core.writing():
        at = last_activity(core)
        if at > idle_since:
            return None
        end_session(core, at)
        return core.log.last_seq


def end_session(core: Core, at: float | None = None) -> None:
    """Write session_ended (durable) unless it is there, then close sealing the log. `at`:
    the record's time when it is not now (an end written as upkeep)."""
    with core.writing():
        core.check_between_turns("the session")
        if core.state.ended_seq is None:
            core.write_queued()
            core.write(_writes.session_ended_record(at), durable=True)
    core.close()


class AutoCheckpoint:
    """Before a turn starts: a checkpoint once `checkpoint_every` records were written since
    the last one. One whose item cannot fit a record is skipped, and tried again once as many
    more were written; the skip is this object's, not the journal's state (which only its
    records change)."""

    def __init__(self, core: Core) -> None:
        self.core = core
        self.skipped_at = 0  # the state's record count when a checkpoint was last skipped

    def __call__(self) -> None:
        core = self.core
        every, state = core.options.checkpoint_every, core.state
        if every is None or state.records - max(state.checkpointed_records,
                                                self.skipped_at) < every:
            return
        try:
            checkpoint(core)
        except RecordTooLargeError:
            self.skipped_at = state.records


def compact(core: Core, keep_turns: int, archive: str | os.PathLike[str] | None,
            storage_options: dict[str, Any] | None, archiver: Archiver | None) -> CompactReport:
    """Checkpoint, then drop every sealed segment before the checkpoint that holds none of
    the last `keep_turns` turns' records. With `archive`, every segment to drop is first
    shipped by `archiver` and its copy verified; one that was not is kept, with the ones
    after it."""
    if type(keep_turns) is not int or not 0 <= keep_turns <= MAX_KEEP_TURNS:
        raise ValueError(f"keep_turns must be an int from 0 to {MAX_KEEP_TURNS}, not "
                         f"{keep_turns!r}")
    if archive is not None and archiver is None:
        raise WaljError("compact(archive=...) needs walj.archive, which `import walj` loads")
    with core.writing():
        core.check_between_turns("compacting")
        first = checkpoint(core)
        keep_from = first
        starts = core.state.turn_starts
        if keep_turns:
            # Fewer turns remembered than asked for: every turn is remembered, keep them all.
            keep_from = (min(first, starts[-keep_turns]) if len(starts) >= keep_turns
                         else core.log.first_seq)
        verified: set[str] = set()
        url = None
        if archive is not None and archiver is not None:  # one without the other was refused
            url = os.fspath(archive)
            verified = archiver(os.fspath(core.log.path), url, storage_options)
            keep_from = min(keep_from, _first_unarchived(core, verified))
        dropped = 0
        try:
            if keep_from > core.log.first_seq:
                dropped = core.log.drop_before(keep_from)
        finally:
            # The live replay index named the records just dropped; rebuilt from the files, it
            # names the checkpoint that carries them (and an interrupt changes nothing).
            core.resync()
        return CompactReport(first, core.log.first_seq, dropped, tuple(sorted(verified)), url)


def _first_unarchived(core: Core, verified: set[str]) -> int:
    """The first seq of the oldest local segment whose archived copy was not verified."""
    for name, first_seq in core.log.segments():
        if name not in verified:
            return first_seq
    return core.log.last_seq + 1
