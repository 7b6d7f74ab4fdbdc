"""The I/O seam: every file-system call the log makes, behind one class tests can replace."""

from __future__ import annotations

import errno
import os
import stat
import sys
import threading
from collections.abc import Callable
from typing import Any

from ..errors import CorruptionError

__all__ = ["DEFAULT_FS", "DIR_MODE", "FILE_MODE", "FileSystem", "file_kind", "not_regular",
           "open_regular", "pwrite_all", "read_regular", "refuse_hard_link", "syncfs_available",
           "write_all"]

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
# Opening a FIFO without it waits for the other end: a FIFO named like a segment would hang.
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)

FILE_MODE = 0o600
DIR_MODE = 0o700


def file_kind(mode: int) -> tuple[str, str]:
    """The problem kind and the words for a directory entry of `mode` that is not a regular
    file."""
    if stat.S_ISLNK(mode):
        return "symlink", "a symbolic link"
    if stat.S_ISDIR(mode):
        return "not_a_regular_file", "a directory"
    if stat.S_ISFIFO(mode):
        return "not_a_regular_file", "a FIFO"
    if stat.S_ISSOCK(mode):
        return "not_a_regular_file", "a socket"
    return "not_a_regular_file", "a device or other special file"


def not_regular(path: str, st: os.stat_result) -> CorruptionError:
    """The typed refusal of a directory entry that is not a regular file."""
    kind, what = file_kind(st.st_mode)
    return CorruptionError(f"{path} is {what}, not a regular file: refused",
                           file=os.path.basename(path), offset=0, kind=kind)


def refuse_hard_link(path: str, st: os.stat_result) -> None:
    """Refuse to write to a file that has other names: `cp -al` copies a log as hard links, and
    truncating or appending to the copy would change the original too. Readers may read it."""
    if st.st_nlink > 1:
        raise CorruptionError(
            f"{path} has {st.st_nlink} hard links: writing to it would change every other name "
            "of the same file too (a `cp -al` copy?); refused. Copy the log with `cp -a`.",
            file=os.path.basename(path), offset=0, kind="hard_link")


def open_regular(path: str, flags: int) -> int:
    """Open `path` only if it is a regular file (never through a symlink), without blocking.

    Anything else raises CorruptionError (kind "symlink" or "not_a_regular_file"): a FIFO would
    block the open or the first read, a socket or a directory fails with a raw OSError.
    """
    try:
        fd = os.open(path, flags | _NOFOLLOW | _CLOEXEC | _NONBLOCK)
    except OSError as exc:
        # ELOOP (a symlink), ENXIO (a socket, or a FIFO opened to write with no reader), EISDIR:
        # say what stands there rather than passing on the errno.
        try:
            st = os.lstat(path)
        except OSError:
            raise exc from None
        if stat.S_ISREG(st.st_mode):
            raise
        raise not_regular(path, st) from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise not_regular(path, st)
        if _NONBLOCK:
            # No effect on a regular file, cleared so the descriptor is an ordinary one.
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: str, limit: int) -> bytes:
    """At most `limit` bytes from the start of a regular file (refused otherwise, as by
    open_regular): for the small files a reader opens beside the segments."""
    fd = open_regular(path, os.O_RDONLY)
    try:
        parts: list[bytes] = []
        left = limit
        while left > 0:
            part = os.read(fd, left)
            if not part:
                break
            parts.append(part)
            left -= len(part)
        return b"".join(parts)
    finally:
        os.close(fd)


def _platform_sync(fd: int) -> None:
    if sys.platform == "darwin":
        import fcntl

        # os.fsync on macOS leaves data in the drive's cache; F_FULLFSYNC is the real barrier.
        fcntl.fcntl(fd, fcntl.F_FULLFSYNC)  # type: ignore[attr-defined,unused-ignore]
    elif hasattr(os, "fdatasync"):
        os.fdatasync(fd)
    else:  # pragma: no cover - platforms without fdatasync
        os.fsync(fd)


_libc_functions: dict[str, Any] = {}  # loaded once each, on first use; None where missing


def _libc_function(name: str, *argtypes: str) -> Any:
    """A function of the C library through ctypes (Python has no os.syncfs, and os.fstat cannot
    ask for less than every field), or None where it is missing. `argtypes` name ctypes types;
    the function is looked up once, so a call on a hot path only finds it in a dict."""
    try:
        return _libc_functions[name]
    except KeyError:
        pass
    import ctypes
    import ctypes.util

    function: Any = None
    library = ctypes.util.find_library("c")
    if library is not None:
        try:
            function = getattr(ctypes.CDLL(library, use_errno=True), name)
            function.argtypes = [getattr(ctypes, kind) for kind in argtypes]
            function.restype = ctypes.c_int
        except (OSError, AttributeError):
            function = None
    _libc_functions[name] = function
    return function


def _libc_syncfs() -> Callable[[int], int] | None:
    function: Callable[[int], int] | None = _libc_function("syncfs", "c_int")
    return function


_AT_EMPTY_PATH = 0x1000
_STATX_NLINK = 0x4
_STATX_NLINK_OFFSET = 16  # struct statx: u32 mask, u32 blksize, u64 attributes, u32 nlink
_statx_buffers = threading.local()


def _statx_link_count(fd: int) -> int | None:
    """The link count of open file `fd` from statx(2), asking for nothing else; None where the
    C library has no statx."""
    function = _libc_function("statx", "c_int", "c_char_p", "c_int", "c_uint", "c_void_p")
    if function is None:
        return None
    import ctypes

    buffer = getattr(_statx_buffers, "buffer", None)
    if buffer is None:
        buffer = _statx_buffers.buffer = ctypes.create_string_buffer(256)
    if function(fd, b"", _AT_EMPTY_PATH, _STATX_NLINK, buffer) != 0:
        code = ctypes.get_errno()
        if code == errno.ENOSYS:
            return None
        raise OSError(code, os.strerror(code))
    count: int = int.from_bytes(buffer.raw[_STATX_NLINK_OFFSET:_STATX_NLINK_OFFSET + 4],
                                sys.byteorder)
    return count


def syncfs_available() -> bool:
    return _libc_syncfs() is not None


class FileSystem:
    """Real file-system calls. Fault-injecting test doubles subclass this and override methods.

    Paths are plain strings. Every method raises OSError as the system call does; the log decides
    what an error means (a failed write or sync poisons the handle).
    """

    def open_append(self, path: str) -> int:
        """Open an existing regular file for appending; refuses anything else (see
        open_regular)."""
        return open_regular(path, os.O_WRONLY | os.O_APPEND)

    def open_write(self, path: str) -> int:
        """Open an existing regular file to write at chosen offsets (`pwrite`) and read back
        what landed: without O_APPEND, under which Linux's pwrite ignores the offset. Refuses
        anything else (see open_regular)."""
        return open_regular(path, os.O_RDWR)

    def create(self, path: str) -> int:
        """Create a new file (0600) to write and read back: `write` goes on from where the last
        ended, `pwrite` writes where it is told; fails if the file exists or is a symlink."""
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
        return os.open(path, flags, FILE_MODE)

    def open_read(self, path: str) -> int:
        """Open an existing regular file for reading; refuses anything else (see
        open_regular)."""
        return open_regular(path, os.O_RDONLY)

    def read(self, fd: int, size: int) -> bytes:
        return os.read(fd, size)

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        return os.pread(fd, size, offset)

    def seek(self, fd: int, offset: int) -> None:
        """Where the next `read` of `fd` starts (a reader resuming at an offset)."""
        os.lseek(fd, offset, os.SEEK_SET)

    def write(self, fd: int, data: bytes) -> int:
        return os.write(fd, data)

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        """Write at `offset` (of a descriptor opened without O_APPEND), the position unmoved."""
        return os.pwrite(fd, data, offset)

    def sync(self, fd: int) -> None:
        """Make a file's data durable: fdatasync, or F_FULLFSYNC on macOS."""
        _platform_sync(fd)

    def syncfs(self, fd: int) -> None:
        """Flush the whole file system `fd` is on, every file's data and metadata, every
        process's (syncfs(2), Linux): the commit service's "syncfs" rounds."""
        import ctypes

        function = _libc_syncfs()
        if function is None:
            raise OSError(errno.ENOSYS, "syncfs(2) is not available")
        if function(fd) != 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))

    def sync_dir(self, path: str) -> None:
        """Make a directory's entries (creates, renames, deletes) durable."""
        fd = os.open(path, os.O_RDONLY | _DIRECTORY | _CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def truncate(self, fd: int, length: int) -> None:
        os.ftruncate(fd, length)

    def close(self, fd: int) -> None:
        os.close(fd)

    def fstat_size(self, fd: int) -> int:
        return os.fstat(fd).st_size

    def fstat(self, fd: int) -> os.stat_result:
        return os.fstat(fd)

    def link_count(self, fd: int) -> int:
        """How many names the open file `fd` has: 0 once it was deleted. On Linux it asks
        statx(2) for the link count alone. A stat that reads the file's times (os.fstat) makes
        Linux 6.13 and later (multigrain timestamps) give the file's next write a fine-grained
        mtime, and on ext4 the fdatasync after that write then commits the inode through the
        journal, which a sync after each append would pay every time (about 1.4x the sync's
        time, measured)."""
        if sys.platform.startswith("linux"):
            count = _statx_link_count(fd)
            if count is not None:
                return count
        return os.fstat(fd).st_nlink

    def stat(self, path: str) -> os.stat_result:
        """The status of `path` itself (a symlink is not followed)."""
        return os.lstat(path)

    def rename(self, src: str, dst: str) -> None:
        os.rename(src, dst)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)

    def mkdir(self, path: str) -> None:
        os.mkdir(path, DIR_MODE)


def write_all(fs: FileSystem, fd: int, data: bytes) -> None:
    """Write every byte; a short write goes on from where it stopped (one write when healthy)."""
    written = fs.write(fd, data)
    while written < len(data):
        if written <= 0:
            raise OSError(errno.EIO, "write made no progress")
        data = data[written:]
        written = fs.write(fd, data)


def pwrite_all(fs: FileSystem, fd: int, data: bytes, offset: int) -> None:
    """Write every byte at `offset`; a short write goes on from where it stopped."""
    written = fs.pwrite(fd, data, offset)
    while written < len(data):
        if written <= 0:
            raise OSError(errno.EIO, "write made no progress")
        data, offset = data[written:], offset + written
        written = fs.pwrite(fd, data, offset)


DEFAULT_FS = FileSystem()
