"""What a session directory may hold that is walj's own bookkeeping, named in one place, and the
survey retention makes of a session directory before it removes anything: every entry either
accounted for or the reason the directory is kept.

Retention removes only bytes it has accounted for. A session directory holds its segments
(accounted for once archived and verified, or when removal without an archive was asked for),
its writer lock and owner note, its BASE marker, the temporary files an interrupted rotation or
replace of these leaves, and `quarantine/` (accounted for like the segments). Anything else
keeps the directory: another session below it (`nested`, handled on its own merits), a prune
tombstone not yet finished (`nested` as well), a pending `requests/`, an unknown file or
directory, a symbolic link (`unaccounted`). A tree of empty directories holds no byte and goes.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field

from ..log import BASE_NAME
from ..log import format as fmt
from ..log.format import LOCK_NAME, OWNER_NAME, QUARANTINE_DIR

TOMBSTONE_PREFIX = ".walj-pruning-"  # a session renamed so, under its lock, is being deleted
REQUESTS_DIR = "requests"  # resolution requests from the CLI to a live writer, when pending
# The log's own files beside its segments.
LOG_FILES = frozenset({LOCK_NAME, OWNER_NAME, OWNER_NAME + ".tmp", BASE_NAME, BASE_NAME + ".tmp"})
# A session's own directories: the walk for sessions never searches them.
OWN_DIRS = frozenset({QUARANTINE_DIR, REQUESTS_DIR})


def is_segment(name: str) -> bool:
    return fmt.segment_index(name) is not None


def _is_rotation_leftover(name: str) -> bool:
    """A segment header written under a temporary name by a rotation that died."""
    return name.endswith(".jsonl.tmp") and is_segment(name[:-4])


@dataclass
class Survey:
    """One session directory, entry by entry. Paths are relative to the directory."""

    segments: list[str] = field(default_factory=list)  # segment files, regular
    quarantined: list[str] = field(default_factory=list)  # "quarantine/<file>", every file
    files: list[str] = field(default_factory=list)  # every file a removal deletes
    dirs: list[str] = field(default_factory=list)  # every directory it deletes, deepest first
    nested: list[str] = field(default_factory=list)  # why: another session, a tombstone
    unaccounted: list[str] = field(default_factory=list)  # why: anything else

    def reason_kept(self) -> str | None:
        """Why the directory cannot go whole, or None."""
        reasons = self.unaccounted or self.nested
        if not reasons:
            return None
        more = f" (and {len(reasons) - 3} more)" if len(reasons) > 3 else ""
        return "; ".join(reasons[:3]) + more


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a directory"
    return "a file" if stat.S_ISREG(mode) else "a special file"


def survey(path: str, gone: frozenset[str] = frozenset()) -> Survey:
    """Account for every entry of the session directory `path`. `gone`: directories to count
    as removed already (a dry run's removals). OSError if `path` cannot be listed."""
    found = Survey()
    with os.scandir(path) as listing:
        entries = sorted((entry.name, entry.stat(follow_symlinks=False).st_mode)
                         for entry in listing)
    for name, mode in entries:
        _account(path, name, mode, gone, found)
    return found


def _account(path: str, name: str, mode: int, gone: frozenset[str], found: Survey) -> None:
    """Account for one entry of the session directory in `found`."""
    regular = stat.S_ISREG(mode)
    if stat.S_ISDIR(mode):
        _account_directory(path, name, gone, found)
    elif regular and (name in LOG_FILES or _is_rotation_leftover(name)):
        found.files.append(name)
    elif regular and is_segment(name):
        found.segments.append(name)
        found.files.append(name)
    else:
        what = "walj did not write" if regular else "walj does not make"
        found.unaccounted.append(f"{name}: {_kind(mode)} {what}")


def _account_directory(path: str, name: str, gone: frozenset[str], found: Survey) -> None:
    if name == QUARANTINE_DIR:
        _survey_quarantine(path, found)
    elif name == REQUESTS_DIR and not os.listdir(os.path.join(path, name)):
        found.dirs.append(name)
    elif name == REQUESTS_DIR:
        found.unaccounted.append(f"{name}/: requests to the session's writer are pending")
    elif name.startswith(TOMBSTONE_PREFIX):
        found.nested.append(f"{name}: a removal not finished, handled on its own")
    else:
        _survey_subtree(path, name, gone, found)


def _survey_quarantine(path: str, found: Survey) -> None:
    qdir = os.path.join(path, QUARANTINE_DIR)
    with os.scandir(qdir) as listing:
        entries = sorted((e.name, e.stat(follow_symlinks=False).st_mode) for e in listing)
    for name, mode in entries:
        relative = f"{QUARANTINE_DIR}/{name}"
        if stat.S_ISREG(mode):
            found.quarantined.append(relative)
            found.files.append(relative)
        else:
            found.unaccounted.append(f"{relative}: {_kind(mode)} walj does not make")
    found.dirs.append(QUARANTINE_DIR)


def _ancestors(path: str) -> set[int]:
    """The inodes of `path` and of every directory above it on its file system."""
    found: set[int] = set()
    here = os.path.abspath(path)
    device = os.lstat(here).st_dev
    while True:
        st = os.lstat(here)
        if st.st_dev != device:
            return found
        found.add(st.st_ino)
        parent = os.path.dirname(here)
        if parent == here:
            return found
        here = parent


def _survey_subtree(path: str, name: str, gone: frozenset[str], found: Survey) -> None:
    """A directory walj did not make: another session (or a tombstone) somewhere below it
    keeps the parent as `nested`; any file or link as `unaccounted`; empty directories go."""
    empty_dirs, sessions, other = _walk_foreign(path, name, gone)
    if sessions == [name]:
        found.nested.append(f"{name}: another session, handled on its own")
    elif sessions:
        shown = ", ".join(sessions[:2]) + (" ..." if len(sessions) > 2 else "")
        found.nested.append(f"{name}: holds other sessions ({shown}), handled on their own")
    found.unaccounted += other
    if not sessions and not other:
        found.dirs += empty_dirs


def _walk_foreign(path: str, name: str,
                  gone: frozenset[str]) -> tuple[list[str], list[str], list[str]]:
    """The directory `name` of the session `path`, walked: its directories that hold nothing,
    the sessions and tombstones below it, and what else it holds (each relative to `path`)."""
    top = os.path.join(path, name)
    empty_dirs: list[str] = []
    sessions: list[str] = []
    other: list[str] = []

    def unlistable(exc: OSError) -> None:
        other.append(f"{os.path.relpath(exc.filename or top, path)}: cannot be listed")

    device = os.lstat(path).st_dev
    seen = _ancestors(path)  # a bind mount of one of them would loop
    for dirpath, dirnames, filenames in os.walk(top, onerror=unlistable):
        if os.path.normpath(dirpath) in gone:
            dirnames[:] = []
            continue
        relative = os.path.relpath(dirpath, path)
        here = os.lstat(dirpath)
        if here.st_dev != device or here.st_ino in seen:  # a mount: a loop, or not ours
            other.append(f"{relative}: a mount point (or a loop back up), not searched")
            dirnames[:] = []
            continue
        seen.add(here.st_ino)
        if any(is_segment(f) for f in filenames) or \
                os.path.basename(dirpath).startswith(TOMBSTONE_PREFIX):
            sessions.append(relative)
            dirnames[:] = []
            continue
        links = [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
        other += [f"{os.path.join(relative, f)}: not walj's" for f in [*filenames, *links]]
        dirnames[:] = [d for d in dirnames if d not in links]
        empty_dirs.append(relative)
    return empty_dirs, sessions, other
