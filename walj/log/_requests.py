"""Request files: durable, checksummed asks that another process leaves in a log directory's
`requests/` for the live writer to act on (docs/FORMAT.md, "Request files").

The log layer owns every path in a log directory, so it creates, lists, reads and removes these
files; what a request asks is the journal's business. Every file in `requests/` is hostile
input: a reader opens only names shaped like a request, only regular files (never through a
symlink, never blocking on a FIFO), and reads at most REQUEST_LIMIT bytes of one.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import stat
import time
from typing import Any

from .. import _codec
from ..errors import CorruptionError, RecordTooLargeError, WaljError
from ._durability import write_then_rename
from .format import BODY_START, checksum_ok, frame, segment_index
from .fs import DEFAULT_FS, FileSystem, read_regular

REQUESTS_DIR = "requests"
REQUEST_SUFFIX = ".req"
REQUEST_LIMIT = 64 * 1024  # bytes of one request file, its line and newline included
# How many request files one pick-up reads, so a flood cannot hold the writer for long.
PICK_UP_LIMIT = 16
_NAME = re.compile(r"^([0-9a-f]{32})\.req$")
_TEMP = re.compile(r"^\.[0-9a-f]{32}\.tmp$")
# A post's temp file this old belongs to an asker that was killed: no post takes so long.
STALE_SECONDS = 3600.0
_TAG = b'"request":'
# Directory timestamps may be this coarse (seconds, in ns): a listing taken this soon after
# the directory last changed may have missed a change that kept the same timestamp.
_COARSE_NS = 2_000_000_000
# However the timestamps look, list the directory at least this often.
_FALLBACK_NS = 10_000_000_000


class MalformedRequestError(WaljError):
    """A request file that cannot be read as a request: its id (from its name) is known, so
    the writer refuses it durably; `reason` is a short tag."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def requests_dir(path: str | os.PathLike[str]) -> str:
    return os.path.join(os.fspath(path), REQUESTS_DIR)


def _file(path: str | os.PathLike[str], request_id: str) -> str:
    return os.path.join(requests_dir(path), request_id + REQUEST_SUFFIX)


def request_line(request_id: str, fields: dict[str, Any]) -> bytes:
    """The one checksummed line of a request file: `fields` with the request's `id` first."""
    body = _TAG + _codec.encode({"id": request_id, **fields}) + b"}"
    return frame(body)


def post(path: str | os.PathLike[str], fields: dict[str, Any], *,
         fs: FileSystem = DEFAULT_FS) -> str:
    """Durably create a request in the log directory `path` and return its random id: a temp
    file (a dot name readers ignore) written and synced, renamed to its final name, then the
    directory synced. Once this returns, the request survives a crash. RecordTooLargeError
    (nothing written) when it exceeds REQUEST_LIMIT; CorruptionError when `requests/` is
    not a directory."""
    request_id = secrets.token_hex(16)
    line = request_line(request_id, fields)
    if len(line) > REQUEST_LIMIT:
        raise RecordTooLargeError(f"the request is {len(line)} bytes; a request file holds at "
                                  f"most {REQUEST_LIMIT} (a shorter note?)")
    directory = _ensure_dir(fs, os.fspath(path))
    tmp = os.path.join(directory, f".{request_id}.tmp")
    write_then_rename(fs, tmp, _file(path, request_id), line, sync=True)
    fs.sync_dir(directory)
    return request_id


def _ensure_dir(fs: FileSystem, path: str) -> str:
    """`requests/` in `path`, created (and `path` synced) if missing; refused if something
    else stands there (a symlink could point the files anywhere)."""
    directory = requests_dir(path)
    try:
        st = fs.stat(directory)
    except FileNotFoundError:
        if not os.path.isdir(path):
            raise FileNotFoundError(errno.ENOENT, "no log directory", path) from None
        with contextlib.suppress(FileExistsError):  # another poster made it meanwhile
            fs.mkdir(directory)
        fs.sync_dir(path)
        st = fs.stat(directory)
    if not stat.S_ISDIR(st.st_mode):
        raise CorruptionError(f"{directory} is not a directory (a symlink?): refused",
                              file=REQUESTS_DIR, offset=0, kind="not_a_directory")
    return directory


def pending(path: str | os.PathLike[str], limit: int = PICK_UP_LIMIT) -> list[str]:
    """Ids of at most `limit` request files in `path`'s `requests/`, in name order. Names of
    any other shape (temp files, stray files) are never opened. No `requests/`, or one that is
    not a real directory: none."""
    directory = requests_dir(path)
    try:
        if not stat.S_ISDIR(os.lstat(directory).st_mode):
            return []
        with os.scandir(directory) as entries:
            found = [m.group(1) for e in entries if (m := _NAME.match(e.name))]
    except (FileNotFoundError, NotADirectoryError):
        return []
    found.sort()
    return found[:limit]


def load(path: str | os.PathLike[str], request_id: str) -> dict[str, Any] | None:
    """The fields of request `request_id`, checked to be one framed, checksummed line naming
    that id; None when the file is gone. MalformedRequestError for anything else: too large,
    not a regular file, torn, bad checksum, not a JSON object, another id."""
    name = _file(path, request_id)
    try:
        data = read_regular(name, REQUEST_LIMIT + 1)
    except FileNotFoundError:
        return None
    except CorruptionError as exc:  # a symlink, FIFO, socket, directory
        raise MalformedRequestError(str(exc), exc.kind or "not_a_regular_file") from None
    except OSError as exc:
        raise MalformedRequestError(f"{name} cannot be read: {exc}", "unreadable") from None
    if len(data) > REQUEST_LIMIT:
        raise MalformedRequestError(f"{name} is larger than {REQUEST_LIMIT} bytes", "too_large")
    if not data.endswith(b"\n") or data.count(b"\n") != 1:
        raise MalformedRequestError(f"{name} is not one whole line (torn?)", "torn")
    line = data[:-1]
    if not checksum_ok(line) or not line[BODY_START:].startswith(_TAG):
        raise MalformedRequestError(f"{name} fails its checksum or is not a request",
                                    "bad_checksum")
    try:
        fields = _codec.decode(line[BODY_START + len(_TAG):-1])
    except ValueError as exc:
        raise MalformedRequestError(f"{name} holds no JSON request: {exc}", "not_json") from None
    if not isinstance(fields, dict) or fields.get("id") != request_id:
        raise MalformedRequestError(f"{name} does not hold request {request_id}", "wrong_id")
    return fields


def remove(path: str | os.PathLike[str], request_id: str, *,
           fs: FileSystem = DEFAULT_FS) -> None:
    """Remove a request file, then sync the directory. Something that cannot be unlinked (a
    directory named like a request) is renamed to a dot name no reader opens. Never raises
    OSError: a request left behind is found again and its id is known by then."""
    directory = requests_dir(path)
    name = _file(path, request_id)
    with contextlib.suppress(OSError):
        try:
            fs.unlink(name)
        except FileNotFoundError:
            return
        except (IsADirectoryError, PermissionError):
            fs.rename(name, os.path.join(directory, f".{request_id}.unremovable"))
        fs.sync_dir(directory)


def remove_stale(path: str | os.PathLike[str], older_than: float = STALE_SECONDS, *,
                 fs: FileSystem = DEFAULT_FS) -> int:
    """Remove the temp files of posts that never finished (an asker killed mid-post), once
    they are `older_than` seconds old; the number removed. Never raises OSError."""
    directory = requests_dir(path)
    removed = 0
    with contextlib.suppress(OSError):
        with os.scandir(directory) as entries:
            stale = [e.name for e in entries if _TEMP.match(e.name)
                     and e.stat(follow_symlinks=False).st_mtime < time.time() - older_than]
        for name in stale:
            fs.unlink(os.path.join(directory, name))
            removed += 1
        if removed:
            fs.sync_dir(directory)
    return removed


class RequestWatch:
    """The cheap test a live writer runs before it looks for requests: one lstat of
    `requests/`. It says look when the directory changed (inode, mtime, size), when the last
    listing was so soon after the last change that a coarse timestamp could hide a newer one,
    and at least every ten seconds whatever the timestamps say."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.directory = requests_dir(path)
        self._seen: tuple[int, int, int] | None = None
        self._listed_ns = 0

    def retry(self) -> None:
        """Look again at the next check: the last pick-up left requests behind."""
        self._seen = None

    def due(self) -> bool:
        try:
            st = os.lstat(self.directory)
        except OSError:
            return False  # no requests/ (the usual case): nothing to do
        if not stat.S_ISDIR(st.st_mode):
            return False
        now = time.time_ns()
        seen = (st.st_ino, st.st_mtime_ns, st.st_size)
        if (seen != self._seen or self._listed_ns < st.st_mtime_ns + _COARSE_NS
                or now - self._listed_ns > _FALLBACK_NS):
            self._seen = seen
            self._listed_ns = now
            return True
        return False


def holds_log(path: str | os.PathLike[str]) -> bool:
    """True when `path` is a directory holding at least one segment (a log to resolve in)."""
    try:
        with os.scandir(os.fspath(path)) as entries:
            return any(segment_index(e.name) is not None for e in entries)
    except OSError:
        return False
