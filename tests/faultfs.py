"""A fault-injecting FileSystem for tests: failed calls, short writes, and crashes that drop
every byte and directory entry that was not synced (the LevelDB fault_injection_test model)."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from walj._fs import FileSystem


class SimulatedCrash(BaseException):
    """Raised at the chosen call: the process 'dies' here. Then call FaultyFS.crash()."""


@dataclass
class _Rule:
    op: str
    nth: int
    action: Callable[[], None]
    after: bool = False
    seen: int = 0


@dataclass
class _FileState:
    synced_size: int


@dataclass
class _DirState:
    synced_names: set[str] = field(default_factory=set)
    renames: list[tuple[str, str]] = field(default_factory=list)  # unsynced (src, dst) in order


class FaultyFS(FileSystem):
    """Wraps the real file system; remembers what is durable so `crash()` can drop the rest."""

    def __init__(self) -> None:
        self.rules: list[_Rule] = []
        self.calls: list[tuple[str, str]] = []
        self._fd_path: dict[int, str] = {}
        self._files: dict[str, _FileState] = {}
        self._dirs: dict[str, _DirState] = {}
        self.short_write_bytes: int | None = None

    # --- configuring faults --------------------------------------------------------------------

    def fail(self, op: str, nth: int = 1, err: int = errno.EIO) -> None:
        """The nth call of `op` (write, sync, sync_dir, rename, create, ...) raises OSError."""
        def action() -> None:
            raise OSError(err, os.strerror(err))
        self.rules.append(_Rule(op, nth, action))

    def crash_at(self, op: str, nth: int = 1, *, after: bool = False) -> None:
        """The nth call of `op` ("any" counts every call) raises SimulatedCrash, before (or
        after) doing its work."""
        def action() -> None:
            raise SimulatedCrash(f"{op} #{nth}")
        self.rules.append(_Rule(op, nth, action, after))

    def _hook(self, op: str, path: str, after: bool) -> None:
        if not after:
            self.calls.append((op, path))
        for rule in self.rules:
            if rule.op in (op, "any") and rule.after == after:
                rule.seen += 1
                if rule.seen == rule.nth:
                    rule.action()

    # --- bookkeeping ---------------------------------------------------------------------------

    def _dir(self, path: str) -> _DirState:
        d = os.path.dirname(path)
        if d not in self._dirs:
            names = set(os.listdir(d)) if os.path.isdir(d) else set()
            self._dirs[d] = _DirState(names)
        return self._dirs[d]

    def _track_file(self, path: str, fresh: bool) -> None:
        if path not in self._files:
            size = 0 if fresh else os.path.getsize(path)
            self._files[path] = _FileState(size)

    # --- the FileSystem interface --------------------------------------------------------------

    def create(self, path: str) -> int:
        self._hook("create", path, False)
        self._dir(path)
        fd = super().create(path)
        self._fd_path[fd] = path
        self._files[path] = _FileState(0)
        self._hook("create", path, True)
        return fd

    def open_append(self, path: str) -> int:
        self._hook("open_append", path, False)
        self._dir(path)
        fd = super().open_append(path)
        self._fd_path[fd] = path
        self._track_file(path, fresh=False)
        return fd

    def write(self, fd: int, data: bytes) -> int:
        path = self._fd_path.get(fd, "?")
        self._hook("write", path, False)
        if self.short_write_bytes is not None:
            data, self.short_write_bytes = data[: self.short_write_bytes], None
        n = super().write(fd, data)
        self._hook("write", path, True)
        return n

    def sync(self, fd: int) -> None:
        path = self._fd_path.get(fd, "?")
        self._hook("sync", path, False)
        super().sync(fd)
        if path in self._files:
            self._files[path].synced_size = os.fstat(fd).st_size
        self._hook("sync", path, True)

    def sync_dir(self, path: str) -> None:
        self._hook("sync_dir", path, False)
        super().sync_dir(path)
        state = self._dirs.setdefault(path, _DirState())
        state.synced_names = set(os.listdir(path))
        state.renames.clear()
        self._hook("sync_dir", path, True)

    def rename(self, src: str, dst: str) -> None:
        self._hook("rename", dst, False)
        self._dir(dst)
        super().rename(src, dst)
        self._dirs[os.path.dirname(dst)].renames.append((src, dst))
        if src in self._files:
            self._files[dst] = self._files.pop(src)
        for fd, path in self._fd_path.items():
            if path == src:
                self._fd_path[fd] = dst
        self._hook("rename", dst, True)

    def unlink(self, path: str) -> None:
        self._hook("unlink", path, False)
        self._dir(path)
        super().unlink(path)
        self._files.pop(path, None)
        self._hook("unlink", path, True)

    def truncate(self, fd: int, length: int) -> None:
        path = self._fd_path.get(fd, "?")
        self._hook("truncate", path, False)
        super().truncate(fd, length)
        self._hook("truncate", path, True)

    def mkdir(self, path: str) -> None:
        self._hook("mkdir", path, False)
        self._dir(path)
        super().mkdir(path)
        self._dirs[path] = _DirState(set())
        self._hook("mkdir", path, True)

    def close(self, fd: int) -> None:
        self._fd_path.pop(fd, None)
        super().close(fd)

    # --- the crash -----------------------------------------------------------------------------

    def crash(self) -> None:
        """Lose what a power cut would: unsynced bytes, and entries no directory sync covered."""
        for fd in list(self._fd_path):
            try:
                os.close(fd)
            except OSError:
                pass
        self._fd_path.clear()
        for path, state in self._files.items():
            if os.path.exists(path) and os.path.getsize(path) > state.synced_size:
                os.truncate(path, state.synced_size)
        for directory, dstate in self._dirs.items():
            for src, dst in reversed(dstate.renames):
                if os.path.exists(dst):
                    os.rename(dst, src)
            dstate.renames.clear()
            if not os.path.isdir(directory):
                continue
            for name in set(os.listdir(directory)) - dstate.synced_names:
                full = os.path.join(directory, name)
                if os.path.isfile(full):
                    os.unlink(full)
        self._files.clear()
        self._dirs.clear()


def abandon(log: object) -> None:
    """Drop a Log as a dead process would: no sync, no close, only its lock let go."""
    log._fd = -1  # type: ignore[attr-defined]
    log._closed = True  # type: ignore[attr-defined]
    log._release()  # type: ignore[attr-defined]
