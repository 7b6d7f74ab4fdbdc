"""One writer per log directory: an OS file lock, plus a refusal of a second open in-process."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import stat
import threading
import time
from typing import NamedTuple

from ..errors import CorruptionError, LockedError
from ._durability import io_failure, write_then_rename
from .format import LOCK_NAME, OWNER_NAME
from .fs import _CLOEXEC, _NOFOLLOW, FILE_MODE, FileSystem, read_regular

__all__ = ["Owner", "WriterLock", "holds_lock", "owner_info", "read_owner"]


_open_dirs: dict[tuple[int, int], tuple[str, object]] = {}
_open_dirs_guard = threading.Lock()


class Owner(NamedTuple):
    """The writer that holds or last held a directory's lock, as it wrote itself to LOCK.owner.
    `writer` is its writer id (`Log.writer_id`); None in a LOCK.owner written before walj
    recorded one, or when the field is not a short string."""

    pid: int
    host: str
    since: str
    writer: str | None


def owner_info(directory: str) -> Owner | None:
    """The writer that holds or last held the lock, from LOCK.owner; None if unknown (a
    LOCK.owner that is not a regular file included: a FIFO there would hang the read)."""
    try:
        # The holder writes under 150 bytes; the cap bounds a hostile file (cut, it won't parse).
        info = json.loads(read_regular(os.path.join(directory, OWNER_NAME), 64 * 1024))
        writer = info.get("writer")
        if not isinstance(writer, str) or not 0 < len(writer) <= 64:
            writer = None
        return Owner(int(info["pid"]), str(info["host"]), str(info["since"]), writer)
    except (OSError, CorruptionError, ValueError, KeyError, TypeError, AttributeError,
            OverflowError, RecursionError):  # RecursionError: JSON nested thousands deep
        return None


def read_owner(directory: str) -> str | None:
    """Who holds (or last held) the directory's lock, for LockedError; None if unknown."""
    info = owner_info(directory)
    return None if info is None else f"pid {info.pid} on {info.host} since {info.since}"


def holds_lock(directory: str, pid: int) -> bool | None:
    """Whether process `pid` (as this host's /proc names it) holds the flock on the
    directory's LOCK now, from the kernel's table of locks, /proc/locks; None where there is
    no such table. Read-only: a reader that tried the lock itself, even for a moment, could
    make a writer opening just then fail with LockedError. The entry is matched by inode
    (a btrfs subvolume reports another device number than the kernel's table)."""
    try:
        st = os.lstat(os.path.join(directory, LOCK_NAME))
    except OSError:
        return False  # no LOCK (or none this process may see): nobody holds it
    if not stat.S_ISREG(st.st_mode):
        return False
    try:
        with open("/proc/locks", "rb") as table:
            lines = table.read().splitlines()
    except OSError:
        return None
    for line in lines:
        # "1: FLOCK  ADVISORY  WRITE 4242 fe:00:2221512 0 EOF"; a waiter's line has "->"
        # after the number, so it is never taken for a holder.
        fields = line.split()
        if len(fields) < 6 or fields[1] != b"FLOCK" or fields[3] != b"WRITE":
            continue
        if fields[4] == str(pid).encode() and fields[5].rsplit(b":", 1)[-1] == \
                str(st.st_ino).encode():
            return True
    return False


class WriterLock:
    """Held for as long as a Log is open for writing: an flock on LOCK, plus this process's
    table of open directories (flock does not refuse a second lock from one process)."""

    def __init__(self, fs: FileSystem, directory: str, timeout: float) -> None:
        st = os.stat(directory)
        self._key = (st.st_dev, st.st_ino)
        self._path = os.path.join(directory, LOCK_NAME)
        self._fd = -1
        # Which open this is, for records to carry and LOCK.owner to name (see Log.writer_id).
        self.writer_id = os.urandom(8).hex()
        token = self._token = object()
        try:
            with _open_dirs_guard:
                if self._key in _open_dirs:
                    raise LockedError(
                        f"{directory} is already open for writing in this process "
                        f"(pid {os.getpid()})", owner=f"pid {os.getpid()} (this process)")
                _open_dirs[self._key] = (directory, token)
            self._fd = _acquire(self._path, directory, timeout)
            held = os.fstat(self._fd)
            self._held = (held.st_dev, held.st_ino)
        except BaseException:
            self.release()
            raise
        try:
            self._write_owner(fs, directory)
        except OSError:
            pass  # informational only: a full disk must not stop a writer that holds the lock
        except BaseException:
            self.release()
            raise

    def _write_owner(self, fs: FileSystem, directory: str) -> None:
        # Informational only (LockedError quotes it, `walj inspect` reads it), so it is not
        # fsynced: after a crash a stale or missing owner file costs a less helpful message,
        # never data.
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "writer": self.writer_id,
        }
        tmp = os.path.join(directory, OWNER_NAME + ".tmp")
        with contextlib.suppress(FileNotFoundError):
            fs.unlink(tmp)
        write_then_rename(fs, tmp, os.path.join(directory, OWNER_NAME), json.dumps(info).encode(),
                          sync=False)

    def still_held(self) -> str | None:
        """None while LOCK is the file this writer locked; else what happened to it. Deleting
        or replacing LOCK under a live writer would let a second writer in."""
        try:
            st = os.lstat(self._path)
        except FileNotFoundError:
            return "the LOCK file (or the whole log directory) was deleted under this writer"
        except OSError as exc:
            return f"the LOCK file cannot be checked: {exc}"
        if (st.st_dev, st.st_ino) != self._held:
            return "the LOCK file was replaced under this writer; a second writer may be in"
        return None

    def release(self, *, unlock: bool = True) -> None:
        """Give the lock up; idempotent. A forked child passes unlock=False: the lock is its
        parent's, and an explicit unlock of the shared file description would free it for
        everyone."""
        try:
            self._release_steps(unlock)
        except BaseException:
            self._release_steps(unlock)  # an interrupt stopped it: finish, then let it go on
            raise

    def _release_steps(self, unlock: bool) -> None:
        fd = self._fd
        if fd >= 0:
            if unlock:
                fcntl.flock(fd, fcntl.LOCK_UN)  # first: whatever follows, the lock is free
            self._fd = -1  # detached before closed: an interrupt between leaks one descriptor
            os.close(fd)
        with _open_dirs_guard:
            entry = _open_dirs.get(self._key)
            if entry is not None and entry[1] is self._token:
                del _open_dirs[self._key]


def forget_open_directories() -> None:
    """In a forked child: the parent's open directories are not this process's."""
    _open_dirs.clear()


def _acquire(path: str, directory: str, timeout: float) -> int:
    """Open LOCK (a regular file, never a symlink or FIFO) and flock it, waiting up to
    `timeout` seconds (-1: for ever)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | _NOFOLLOW | _CLOEXEC
    try:
        fd = os.open(path, flags, FILE_MODE)
    except OSError as exc:
        raise io_failure(directory, exc, "locking") from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise LockedError(f"{path} is not a regular file; refusing to use it as the lock")
        deadline = time.monotonic() + timeout
        pause = 0.001
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if timeout == -1 else fcntl.LOCK_NB))
                return fd
            except BlockingIOError:
                now = time.monotonic()
                if now >= deadline:
                    owner = read_owner(directory)
                    raise LockedError(
                        f"{directory} is locked by another writer ({owner or 'owner unknown'})",
                        owner=owner,
                    ) from None
                time.sleep(min(pause, deadline - now))
                pause = min(pause * 2, 0.05)
    except BaseException:
        os.close(fd)
        raise
