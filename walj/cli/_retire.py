"""Retiring one session for `walj prune`: removal through a tombstone (archived and verified
first, when asked), and the compaction of a long active one; each step safe to kill.

A removal holds the session's writer lock from its last check to its last unlink, so no writer
starts in between. The directory is first renamed to a tombstone beside it and the parent
synced; only then is anything deleted. A crash leaves either the whole session or a tombstone,
which every reader skips and the next prune deletes. Nothing is deleted that was not first
archived and read back, unless the caller asked for a removal without an archive, and only
what the survey of walj/cli/_accounting.py accounted for: a directory holding anything else
is kept, and so is a tombstone something appeared in.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import LockedError, WaljError
from ..log.fs import DEFAULT_FS, FileSystem
from ..log.lock import WriterLock
from ..log.scan import list_segments
from ..log.segment import SegmentScan
from ._accounting import TOMBSTONE_PREFIX, Survey, survey
from ._model import end_idle_journal
from ._sweep import check_log

if TYPE_CHECKING:
    from ..journal import ToolJournal


class Busy(Exception):
    """Another process holds the session's writer lock."""


class Kept(Exception):
    """The session changed or cannot be retired safely; the message says why."""


class Nested(Kept):
    """The directory holds another session (or an unfinished removal), handled on its own."""


class Unaccounted(Kept):
    """The directory holds bytes retention cannot account for; the message names them."""


@dataclass(frozen=True)
class Removal:
    """What a removal deleted: the names verified in the archive, and the quarantined files
    deleted without an archive (--delete-unarchived)."""

    archived: list[str]
    quarantine_unarchived: int


def _lock(path: str) -> WriterLock:
    try:
        return WriterLock(DEFAULT_FS, path, timeout=0)
    except LockedError as exc:
        raise Busy(str(exc)) from None


def refuse_unaccounted(found: Survey) -> None:
    """Unaccounted or Nested unless every entry is walj's bookkeeping of this session."""
    reason = found.reason_kept()
    if reason is not None:
        raise (Unaccounted if found.unaccounted else Nested)(reason)


def _holds_no_record(path: str, name: str) -> bool:
    """An unsealed segment with nothing after its header (an ended session reopened)."""
    seg = SegmentScan(DEFAULT_FS, path, name)
    with contextlib.closing(seg.read_more()) as records:
        if next(records, None) is not None:
            return False
    return seg.size == 0 or (seg.header is not None and seg.seal is None and not seg.problems)


def _archived_whole(path: str, url: str, found: Survey) -> list[str]:
    """Ship the session and read each copy back; refuse (Unaccounted) unless every record of
    the session and every quarantined file is in a verified copy. Returns the names
    verified (a quarantined file as `quarantine/<file>`)."""
    from ..archive import ArchiveError, verified_copies

    try:
        verified = verified_copies(path, url)
    except (ArchiveError, ImportError) as exc:
        raise WaljError(f"archive: {exc}") from None
    listed, _ = list_segments(DEFAULT_FS, path)
    missing = [name for _, name in listed if name not in verified]
    if missing and not (missing == [listed[-1][1]] and _holds_no_record(path, missing[0])):
        raise Unaccounted(f"not every segment verified in the archive: "
                          f"{', '.join(missing[:3])}")
    unshipped = [name for name in found.quarantined if name not in verified]
    if unshipped:
        raise Unaccounted(f"quarantine/ holds {len(unshipped)} file(s) not verified in the "
                          f"archive ({', '.join(unshipped[:2])}): the cut bytes would be lost")
    return sorted(verified)


def remove(path: str, archive: str | None, expected_last_seq: int) -> Removal:
    """Remove an ended, unblocked session: under its lock, check it again, account for every
    entry, archive it (if `archive`), then delete what was accounted for through a tombstone."""
    lock = _lock(path)
    try:
        entry = check_log(path)
        if entry["status"] != "ended" or entry["last_seq"] != expected_last_seq:
            raise Kept(f"changed since it was checked: now {entry['status']}, last seq "
                       f"{entry['last_seq']}")
        found = survey(path)
        refuse_unaccounted(found)  # before shipping: it would be kept anyway
        archived = _archived_whole(path, archive, found) if archive is not None else []
        delete_through_tombstone(path, found)
        return Removal(archived, 0 if archive is not None else len(found.quarantined))
    finally:
        lock.release()


def delete_through_tombstone(path: str, found: Survey, fs: FileSystem = DEFAULT_FS) -> None:
    """Rename the session to a tombstone beside it and make that durable, then delete what
    `found` accounted for."""
    parent, name = os.path.split(os.path.abspath(path))
    tombstone = os.path.join(parent, f"{TOMBSTONE_PREFIX}{name}-{os.urandom(4).hex()}")
    fs.rename(path, tombstone)
    fs.sync_dir(parent)  # the rename first: from here a crash leaves a tombstone, not a half
    delete_tombstone(tombstone, found, fs)


def delete_tombstone(tombstone: str, found: Survey, fs: FileSystem = DEFAULT_FS) -> None:
    """Delete the files and directories `found` accounted for, then the tombstone itself, then
    sync its parent. Anything that appeared since the survey stays (Unaccounted), and so does
    the tombstone around it."""
    for relative in found.files:
        with contextlib.suppress(FileNotFoundError):
            fs.unlink(os.path.join(tombstone, relative))
    try:
        for relative in sorted(found.dirs, key=lambda d: -d.count(os.sep)):
            os.rmdir(os.path.join(tombstone, relative))
        os.rmdir(tombstone)
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        raise Unaccounted(f"something appeared in it while it was removed: left as "
                          f"{os.path.basename(tombstone)}") from None
    fs.sync_dir(os.path.dirname(tombstone))


def finish_tombstone(tombstone: str) -> None:
    """Delete what an interrupted prune left, under the tombstone's lock if it has one. A
    tombstone is made only after its session was accounted for; anything in it that is no
    bookkeeping (another session, an unknown file) keeps it (Nested, Unaccounted)."""
    lock = _lock(tombstone) if os.path.exists(os.path.join(tombstone, "LOCK")) else None
    try:
        found = survey(tombstone)
        refuse_unaccounted(found)
        delete_tombstone(tombstone, found)
    finally:
        if lock is not None:
            lock.release()


@contextlib.contextmanager
def _unblocked_writer(path: str, what: str) -> Iterator[ToolJournal]:
    """The session opened as its writer, for upkeep: Busy if another process holds it, Kept
    if it is blocked; closed afterwards."""
    from ..journal import ToolJournal

    try:
        journal = ToolJournal.open(path, lock_timeout=0)
    except LockedError as exc:
        raise Busy(str(exc)) from None
    try:
        if journal.recovery.blocked:
            raise Kept(f"blocked when opened {what}")
        yield journal
    finally:
        journal.close()


def end_idle(path: str, idle_since: float) -> int:
    """End an idle session as upkeep (its end carries its last activity's time): open it as
    its writer (Busy if it is open), refuse if it is blocked or has a record newer than
    `idle_since` (Kept). Returns its last seq once ended."""
    with _unblocked_writer(path, "to end it") as journal:
        last_seq = end_idle_journal(journal, idle_since)
    if last_seq is None:
        raise Kept("changed since it was checked: a record newer than --older-than")
    return last_seq


def compact(path: str, keep_turns: int, archive: str | None) -> dict[str, Any]:
    """Compact an active session as its writer (`ToolJournal.compact`). Busy if it is open."""
    with _unblocked_writer(path, "for compaction") as journal:
        report = journal.compact(keep_turns=keep_turns, archive=archive)
    return {"dropped_segments": report.dropped_segments, "first_seq": report.first_seq,
            "archived": list(report.archived)}
