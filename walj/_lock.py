"""One writer per log directory: an OS file lock, plus a refusal of a second open in-process."""

from __future__ import annotations

import json
import os
import socket
import threading
import time

from ._fs import FileSystem
from .errors import LockedError

LOCK_NAME = "LOCK"
OWNER_NAME = "LOCK.owner"

_open_dirs: dict[tuple[int, int], str] = {}
_open_dirs_guard = threading.Lock()


def read_owner(directory: str) -> str | None:
    """Who holds (or last held) the directory's lock, as the holder wrote it; None if unknown."""
    try:
        with open(os.path.join(directory, OWNER_NAME), encoding="utf-8") as f:
            info = json.load(f)
        return f"pid {info['pid']} on {info['host']} since {info['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return None


class WriterLock:
    """Held for as long as a Log is open for writing."""

    def __init__(self, fs: FileSystem, directory: str, timeout: float) -> None:
        from filelock import FileLock, Timeout  # the read-only tools run without filelock

        st = os.stat(directory)
        self._key = (st.st_dev, st.st_ino)
        with _open_dirs_guard:
            if self._key in _open_dirs:
                raise LockedError(
                    f"{directory} is already open for writing in this process (pid {os.getpid()})",
                    owner=f"pid {os.getpid()} (this process)",
                )
            _open_dirs[self._key] = directory
        try:
            self._lock = FileLock(
                os.path.join(directory, LOCK_NAME),
                timeout=timeout,
                mode=0o600,
                thread_local=False,
            )
            try:
                self._lock.acquire()
            except Timeout:
                owner = read_owner(directory)
                raise LockedError(
                    f"{directory} is locked by another writer ({owner or 'owner unknown'})",
                    owner=owner,
                ) from None
        except BaseException:
            with _open_dirs_guard:
                _open_dirs.pop(self._key, None)
            raise
        try:
            self._write_owner(fs, directory)
        except BaseException:
            self.release()
            raise

    @staticmethod
    def _write_owner(fs: FileSystem, directory: str) -> None:
        # Informational only (LockedError quotes it), so it is not fsynced: after a crash a stale
        # or missing owner file costs a less helpful message, never data.
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        tmp = os.path.join(directory, OWNER_NAME + ".tmp")
        try:
            fs.unlink(tmp)
        except FileNotFoundError:
            pass
        fd = fs.create(tmp)
        try:
            fs.write(fd, json.dumps(info).encode())
        finally:
            fs.close(fd)
        fs.rename(tmp, os.path.join(directory, OWNER_NAME))

    def release(self) -> None:
        try:
            self._lock.release()
        finally:
            with _open_dirs_guard:
                _open_dirs.pop(self._key, None)
