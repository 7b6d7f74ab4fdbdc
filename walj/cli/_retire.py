"""Retiring one session for `walj prune`: removal through a tombstone (archived and verified
first, when asked), and the compaction of a long active one; each step safe to kill.

A removal holds the session's writer lock from its last check to its last unlink, so no writer
starts in between. The directory is first renamed to a tombstone beside it and the parent
synced; only then is anything deleted. A crash leaves either the whole session or a tombstone,
which every reader skips and the next prune deletes. Nothing is deleted that was not first
archived and read back, unless the caller asked for a removal without an archive.
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import LockedError, WaljError
from ..log import _format as fmt
from ..log._fs import DEFAULT_FS, FileSystem
from ..log._lock import WriterLock
from ..log._scan import list_segments
from ._sweep import TOMBSTONE_PREFIX, check_log


class Busy(Exception):
    """Another process holds the session's writer lock."""


class Kept(Exception):
    """The session changed or cannot be retired safely; the message says why."""


def segment_count(path: str) -> tuple[int, float | None]:
    """How many segment files the session holds, and the newest one's modification time."""
    listed, _ = list_segments(DEFAULT_FS, path)
    newest = None
    for _, name in listed:
        try:
            mtime = os.stat(os.path.join(path, name)).st_mtime
        except OSError:
            continue
        newest = mtime if newest is None else max(newest, mtime)
    return len(listed), newest


def _lock(path: str) -> WriterLock:
    try:
        return WriterLock(DEFAULT_FS, path, timeout=0)
    except LockedError as exc:
        raise Busy(str(exc)) from None


def _holds_no_record(path: str, name: str) -> bool:
    """An unsealed segment with nothing after its header (an ended session reopened)."""
    with open(os.path.join(path, name), "rb") as f:
        data = f.read(fmt.HEADER_LINE_LIMIT + 2)
    lines = data.split(b"\n")
    return not data or (len(lines) == 2 and lines[1] == b"" and
                        fmt.parse_header(lines[0]) is not None)


def _archived_whole(path: str, url: str) -> list[str]:
    """Ship every sealed segment and read each copy back; refuse (Kept) unless every record of
    the session is in a verified copy. Returns the names verified."""
    from ..archive import ArchiveError, verified_copies

    try:
        verified = verified_copies(path, url)
    except (ArchiveError, ImportError) as exc:
        raise WaljError(f"archive: {exc}") from None
    listed, _ = list_segments(DEFAULT_FS, path)
    missing = [name for _, name in listed if name not in verified]
    if missing and not (missing == [listed[-1][1]] and _holds_no_record(path, missing[0])):
        raise Kept(f"not every segment verified in the archive: {', '.join(missing[:3])}")
    return sorted(verified)


def remove(path: str, archive: str | None, expected_last_seq: int) -> list[str]:
    """Remove an ended, unblocked session: under its lock, check it again, archive it (if
    `archive`), then delete it through a tombstone. Returns the segment names archived."""
    lock = _lock(path)
    try:
        entry = check_log(path)
        if entry["status"] != "ended" or entry["last_seq"] != expected_last_seq:
            raise Kept(f"changed since it was checked: now {entry['status']}, last seq "
                       f"{entry['last_seq']}")
        archived = _archived_whole(path, archive) if archive is not None else []
        delete_through_tombstone(path)
        return archived
    finally:
        lock.release()


def delete_through_tombstone(path: str, fs: FileSystem = DEFAULT_FS) -> None:
    """Rename the session to a tombstone beside it and make that durable, then delete it."""
    parent, name = os.path.split(os.path.abspath(path))
    tombstone = os.path.join(parent, f"{TOMBSTONE_PREFIX}{name}-{os.urandom(4).hex()}")
    fs.rename(path, tombstone)
    fs.sync_dir(parent)  # the rename first: from here a crash leaves a tombstone, not a half
    delete_tombstone(tombstone, fs)


def delete_tombstone(tombstone: str, fs: FileSystem = DEFAULT_FS) -> None:
    """Delete a tombstone and everything in it (links unfollowed), then sync its parent."""
    for dirpath, dirnames, filenames in os.walk(tombstone, topdown=False):
        for name in filenames:
            fs.unlink(os.path.join(dirpath, name))
        for name in dirnames:
            entry = os.path.join(dirpath, name)
            if os.path.islink(entry):
                fs.unlink(entry)
            else:
                os.rmdir(entry)
    os.rmdir(tombstone)
    fs.sync_dir(os.path.dirname(tombstone))


def finish_tombstone(tombstone: str) -> None:
    """Delete what an interrupted prune left, under the tombstone's lock if it has one."""
    lock = _lock(tombstone) if os.path.exists(os.path.join(tombstone, "LOCK")) else None
    try:
        delete_tombstone(tombstone)
    finally:
        if lock is not None:
            lock.release()


def compact(path: str, keep_turns: int, archive: str | None) -> dict[str, Any]:
    """Compact an active session as its writer (`ToolJournal.compact`). Busy if it is open."""
    from ..journal import ToolJournal

    try:
        journal = ToolJournal.open(path, lock_timeout=0)
    except LockedError as exc:
        raise Busy(str(exc)) from None
    try:
        if journal.recovery.blocked:
            raise Kept("blocked when opened for compaction")
        report = journal.compact(keep_turns=keep_turns, archive=archive)
    finally:
        journal.close()
    return {"dropped_segments": report.dropped_segments, "first_seq": report.first_seq,
            "archived": list(report.archived)}
