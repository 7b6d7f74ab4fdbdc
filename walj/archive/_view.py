"""A read-only view of one session for the log's scanner: archived objects, plus a local tail.

The log layer never imports fsspec. Its scanner reads a directory only through the FileSystem
seam (walj/log/fs.py), so the archive hands it a FileSystem whose one "directory" lists the
archived segments and, when a local session directory is given, that directory's segments:
the same LogScan then checks every line, seq, header, seal and the seal chain across the
boundary, and reads every object as the untrusted bytes it is (line limits, no whole-object
reads). A segment present in both places is read from the local directory, which is what
the writer recovers from; `walj verify URL` alone is the check of every archived copy.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import IO, Any, NoReturn

from ..log import format as fmt
from ..log.fs import DEFAULT_FS, FileSystem, open_regular
from ..log.scan import LogScan
from ..log.segment import Problem, read_header
from ._quarantine import ArchivedQuarantine, check_quarantine
from ._store import ArchiveError, Entry, Store, open_store

# Far above any descriptor a process holds: a view's handles are never real descriptors.
_FIRST_HANDLE = 1 << 24


class ArchiveView(FileSystem):
    """The FileSystem seam over one session. `directory` is the name the scanner is given (the
    local directory when there is one, else the session's URL); paths outside it do not
    exist. Writing raises EROFS: nothing that reads through a view can change the archive."""

    def __init__(self, store: Store, parts: tuple[str, ...], label: str,
                 local: str | None = None) -> None:
        self.store = store
        self.parts = parts  # the session's prefix, below the store's root
        self.prefix = store.key(*parts)
        self.directory = label
        self.local = local
        self._remote: dict[str, Entry] | None = None
        self._handles: dict[int, tuple[IO[bytes], int | None]] = {}
        self._next = _FIRST_HANDLE
        self._quarantine: ArchivedQuarantine | None = None

    # --- where each segment comes from ---

    def remote(self) -> dict[str, Entry]:
        """The archived segments, listed once: objects are added by ship, never changed."""
        if self._remote is None:
            self._remote = {name: entry for name, entry in self.store.list(self.prefix).items()
                            if fmt.segment_index(name) is not None}
        return self._remote

    def refresh(self) -> None:
        """List the archived objects again at the next read: a reader that follows an archive
        sees what ship added (or repaired) since."""
        self._remote = None

    def _local_names(self) -> list[str]:
        if self.local is None:
            return []
        return [n for n in DEFAULT_FS.listdir(self.local) if fmt.segment_index(n) is not None]

    def is_local(self, name: str) -> bool:
        if self.local is None:
            return False
        try:
            os.lstat(os.path.join(self.local, name))
        except FileNotFoundError:
            return False
        return True

    def _name(self, path: str) -> str:
        directory, name = os.path.split(path)
        if directory != self.directory or fmt.segment_index(name) is None:
            raise FileNotFoundError(errno.ENOENT, "not in this archive view", path)
        return name

    def source(self, name: str) -> str:
        """Where the scanner reads `name` from: a local path or the object's URL."""
        if self.is_local(name):
            return os.path.join(self.local or "", name)
        return "/".join([self.store.url.rstrip("/"), *self.parts, name])

    # --- the seam, read side ---

    def listdir(self, path: str) -> list[str]:
        if path != self.directory:
            raise FileNotFoundError(errno.ENOENT, "not in this archive view", path)
        return sorted(set(self.remote()) | set(self._local_names()))

    def stat(self, path: str) -> os.stat_result:
        name = self._name(path)
        if self.is_local(name):
            return os.lstat(os.path.join(self.local or "", name))
        entry = self.remote().get(name)
        if entry is None:
            raise FileNotFoundError(errno.ENOENT, "no such archived segment", path)
        mode = (stat.S_IFREG if entry.regular else stat.S_IFDIR) | 0o400
        return os.stat_result((mode, 0, 0, 1, 0, 0, entry.size, 0, 0, 0))

    def open_read(self, path: str) -> int:
        name = self._name(path)
        handle: IO[bytes]
        size: int | None = None
        if self.is_local(name):
            handle = os.fdopen(open_regular(os.path.join(self.local or "", name), os.O_RDONLY),
                               "rb", buffering=0)
        else:
            entry = self.remote().get(name)
            if entry is None:
                raise FileNotFoundError(errno.ENOENT, "no such archived segment", path)
            if not entry.regular:
                from ._store import refused

                raise refused(name, entry) or FileNotFoundError(path)
            handle = self.store.open_read(self.store.key(*self.parts, name), entry.size)
            size = entry.size
        fd = self._next
        self._next += 1
        self._handles[fd] = (handle, size)
        return fd

    def read(self, fd: int, size: int) -> bytes:
        return self._handles[fd][0].read(size) or b""

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        handle = self._handles[fd][0]
        handle.seek(offset)
        return handle.read(size) or b""

    def seek(self, fd: int, offset: int) -> None:
        self._handles[fd][0].seek(offset)

    def fstat_size(self, fd: int) -> int:
        handle, size = self._handles[fd]
        if size is not None:
            return size
        return os.fstat(handle.fileno()).st_size  # a local tail may still grow

    def fstat(self, fd: int) -> os.stat_result:
        size = self.fstat_size(fd)
        return os.stat_result((stat.S_IFREG | 0o400, 0, 0, 1, 0, 0, size, 0, 0, 0))

    def close(self, fd: int) -> None:
        handle, _ = self._handles.pop(fd)
        handle.close()

    def finish(self, scan: LogScan) -> None:
        """After a scan through this view: add the archive's own problems, if any: its end
        (archive_problem) and its quarantined cuts (check_quarantine)."""
        problem = archive_problem(self, scan)
        if problem is not None and problem not in scan.problems:
            scan.problems.append(problem)
        for problem in self.quarantine().problems:
            if problem not in scan.problems:
                scan.problems.append(problem)

    def quarantine(self) -> ArchivedQuarantine:
        """The archived session's quarantine/, checked once."""
        if self._quarantine is None:
            self._quarantine = check_quarantine(self.store, self.prefix)
        return self._quarantine

    def quarantine_entries(self) -> list[dict[str, Any]]:
        """The archived cuts as `walj verify --json` lists them (`verified`: the archived copy
        has the length and SHA-256 of its manifest line)."""
        return list(self.quarantine().cuts)

    # --- the seam, write side: refused ---

    def _refuse_write(self, *args: Any, **_: Any) -> NoReturn:
        path = args[0] if args and isinstance(args[0], str) else ""  # a path, not a descriptor
        raise OSError(errno.EROFS, "an archive view is read-only", path)

    open_append = open_write = create = write = pwrite = sync = sync_dir = _refuse_write
    truncate = rename = unlink = mkdir = _refuse_write


def archive_problem(view: ArchiveView, scan: LogScan) -> Problem | None:
    """What only an archive can get wrong at its end. Ship copies sealed segments alone, so an
    archived last segment without a seal is a partial or truncated object, never a write in
    progress: the scanner's "torn tail" there is a problem (kind unsealed_segment)."""
    last = scan.last
    if last is None or not scan.segments or view.is_local(scan.segments[-1]):
        return None
    if last.seal is not None and scan.torn_tail is None:
        return None
    offset = scan.torn_tail.offset if scan.torn_tail is not None else last.size
    return Problem(last.name, offset, last.last_seq, "unsealed_segment",
                   "the last archived segment has no seal: a partial or truncated object "
                   "(`walj archive` repairs it from the session directory when it is a prefix "
                   "of the session's segment)")


def local_log_id(local: str) -> str:
    """The log id in the first verified header of a local session directory."""
    if not os.path.isdir(local):
        raise ArchiveError(f"{local} is not a directory (a session is a directory of segments)")
    for name in sorted(n for n in os.listdir(local) if fmt.segment_index(n) is not None):
        header = read_header(DEFAULT_FS, local, name)
        if header is not None:
            return header.log_id
    raise ArchiveError(f"{local} holds no segment with a readable header, so its log id (the "
                       "archive prefix) is unknown: give the archived session's URL itself")


def open_view(url: str | os.PathLike[str], *, local: str | os.PathLike[str] | None = None,
              storage_options: dict[str, Any] | None = None) -> ArchiveView:
    """Without `local`: `url` is one archived session (ARCHIVE/<log_id>). With `local`: `url`
    is the archive root given to ship, and the session is ARCHIVE/<the local log's id>."""
    if local is None:
        store = open_store(url, storage_options)
        view = ArchiveView(store, (), store.url)
        if not view.remote():
            # walj.verify refuses a directory that is not there; an empty prefix is the same.
            raise ArchiveError(f"{url} holds no archived segment (an archived session is "
                               "ARCHIVE/<log id>/, which `walj sweep ARCHIVE` lists)")
        return view
    local_dir = os.fspath(local)
    log_id = local_log_id(local_dir)
    store = open_store(url, storage_options)
    view = ArchiveView(store, (log_id,), local_dir, local=local_dir)
    if not view.remote():
        # Not a silent check of the local segments alone: the archive was asked for.
        raise ArchiveError(f"{url} holds no archived segment of log {log_id} (the session in "
                           f"{local_dir}): nothing shipped there yet")
    return view


def archived_sessions(url: str | os.PathLike[str],
                      storage_options: dict[str, Any] | None = None) -> list[str]:
    """The session URLs under an archive root: each prefix that holds a segment object."""
    store = open_store(url, storage_options)
    found: list[str] = []
    for name, entry in sorted(store.list(store.key()).items()):
        if entry.regular:
            continue
        if any(fmt.segment_index(n) is not None for n in store.list(store.key(name))):
            found.append(f"{os.fspath(url).rstrip('/')}/{name}")
    return found
