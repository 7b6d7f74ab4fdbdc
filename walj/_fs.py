"""The I/O seam: every file-system call the log makes, behind one class tests can replace."""

from __future__ import annotations

import errno
import os
import stat
import sys

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)

FILE_MODE = 0o600
DIR_MODE = 0o700


def _platform_sync(fd: int) -> None:
    if sys.platform == "darwin":
        import fcntl

        # os.fsync on macOS leaves data in the drive's cache; F_FULLFSYNC is the real barrier.
        fcntl.fcntl(fd, fcntl.F_FULLFSYNC)  # type: ignore[attr-defined,unused-ignore]
    elif hasattr(os, "fdatasync"):
        os.fdatasync(fd)
    else:  # pragma: no cover - platforms without fdatasync
        os.fsync(fd)


class FileSystem:
    """Real file-system calls. Fault-injecting test doubles subclass this and override methods.

    Paths are plain strings. Every method raises OSError as the system call does; the log decides
    what an error means (a failed write or sync poisons the handle).
    """

    def open_append(self, path: str) -> int:
        """Open an existing file for appending; refuses a symlink."""
        return os.open(path, os.O_WRONLY | os.O_APPEND | _NOFOLLOW | _CLOEXEC)

    def create(self, path: str) -> int:
        """Create a new file (0600) for appending; fails if it exists or is a symlink."""
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
        return os.open(path, flags, FILE_MODE)

    def open_read(self, path: str) -> int:
        return os.open(path, os.O_RDONLY | _NOFOLLOW | _CLOEXEC)

    def read(self, fd: int, size: int) -> bytes:
        return os.read(fd, size)

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        return os.pread(fd, size, offset)

    def write(self, fd: int, data: bytes) -> int:
        return os.write(fd, data)

    def sync(self, fd: int) -> None:
        """Make a file's data durable: fdatasync, or F_FULLFSYNC on macOS."""
        _platform_sync(fd)

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

    def rename(self, src: str, dst: str) -> None:
        os.rename(src, dst)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)

    def mkdir(self, path: str) -> None:
        os.mkdir(path, DIR_MODE)

    def is_symlink(self, path: str) -> bool:
        return stat.S_ISLNK(os.lstat(path).st_mode)


def write_all(fs: FileSystem, fd: int, data: bytes) -> None:
    """Write every byte; a short write goes on from where it stopped (one write when healthy)."""
    written = fs.write(fd, data)
    while written < len(data):
        if written <= 0:
            raise OSError(errno.EIO, "write made no progress")
        data = data[written:]
        written = fs.write(fd, data)


DEFAULT_FS = FileSystem()
