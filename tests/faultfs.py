"""A fault-injecting FileSystem for tests: failed calls, short writes, and crashes that drop
every byte and directory entry that was not synced (the LevelDB fault_injection_test model).

What is durable, as docs/FORMAT.md assumes: a file's bytes once a sync of that file returned
(covering what the file held when the sync began); a create, rename or mkdir once its parent
directory was synced. A directory made by `mkdir` and never covered by a sync of its parent is
undone by a power cut, with everything inside it, however well its own contents were synced.

`crash()` by default drops everything unsynced. The torture suite also asks for the other things
a power cut may leave (`crash(mode=..., rng=...)`):
  "tear"    any one unsynced write torn at a random byte: either the file ends there (everything
            written after it lost), or the writes after it reached the disk too and the torn
            write's lost part reads back as whole 512-byte sectors of zeros (a sector is the
            unit a disk writes; writes after a sync point are unordered until the next sync);
  "reorder" unsynced appends that reached the disk out of order, with holes of zeros where the
            earlier ones were lost (each unsynced directory entry is kept or lost at random);
  "zero"    the unsynced writes read back as zeros from a random byte on;
  "keep"    nothing lost, as when only the process dies. The bookkeeping stays: what was not
            synced before is still not durable, so a later power cut through the same FaultyFS
            can still lose it (a process that dies between a mkdir and its parent's sync
            leaves a directory the next process must not take for durable).
An unsynced truncation is undone by every mode but "keep".

A write may land anywhere in a file (`pwrite` into space preallocated with zeros, whose size a
sync already made durable): what a crash loses is each unsynced write's bytes, which read back
as what the file held there before (zeros, or nothing past the durable end), not only the
bytes past the synced size.
"""

from __future__ import annotations

import errno
import os
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from powercut_bytes import DirState, FileState, Write, lose_entries, lose_file_bytes

from walj.log.fs import FileSystem

CRASH_MODES = ("drop", "tear", "reorder", "zero", "keep")


class SimulatedCrash(BaseException):
    """Raised at the chosen call: the process 'dies' here. Then call FaultyFS.crash()."""


@dataclass
class _Rule:
    op: str
    nth: int
    action: Callable[[], None]
    after: bool = False
    seen: int = 0
    sticky: bool = False
    crash: bool = False


class FaultyFS(FileSystem):
    """Wraps the real file system; remembers what is durable so `crash()` can drop the rest.

    With `freeze_on_crash=True`, once a crash point fires every later call raises
    SimulatedCrash too, as nothing runs in a dead process (threads included).
    """

    def __init__(self, *, freeze_on_crash: bool = False) -> None:
        self.rules: list[_Rule] = []
        self.calls: list[tuple[str, str]] = []
        self._fd_path: dict[int, str] = {}
        self._files: dict[str, FileState] = {}
        self._dirs: dict[str, DirState] = {}
        self._made_dirs: set[str] = set()  # directories this file system's mkdir made
        self.short_write_bytes: int | None = None
        # Called once, by the next sync, after it took the size it is sure to cover and before
        # the data is synced: a write it makes races that sync, deterministically.
        self.during_sync: Callable[[], None] | None = None
        self.freeze_on_crash = freeze_on_crash
        self.dead = False
        self.injected: list[str] = []  # every fault that fired, in order
        self._guard = threading.RLock()
        self._serial = 0  # counts writes, so a sync knows which ones began before it

    # --- configuring faults --------------------------------------------------------------------

    def fail(self, op: str, nth: int = 1, err: int = errno.EIO, *, sticky: bool = False) -> None:
        """The nth call of `op` (write, sync, sync_dir, rename, create, ...) raises OSError;
        with `sticky`, so does every later call of `op` (a disk that stays full)."""
        def action() -> None:
            raise OSError(err, os.strerror(err))
        self.rules.append(_Rule(op, nth, action, sticky=sticky))

    def crash_at(self, op: str, nth: int = 1, *, after: bool = False) -> None:
        """The nth call of `op` ("any" counts every call) raises SimulatedCrash, before (or
        after) doing its work."""
        def action() -> None:
            raise SimulatedCrash(f"{op} #{nth}")
        self.rules.append(_Rule(op, nth, action, after, crash=True))

    def _hook(self, op: str, path: str, after: bool) -> None:
        fire: _Rule | None = None
        with self._guard:
            if self.dead:
                raise SimulatedCrash(f"{op} after the crash")
            if not after:
                self.calls.append((op, path))
            for rule in self.rules:
                if rule.op in (op, "any") and rule.after == after:
                    rule.seen += 1
                    if fire is None and (rule.seen == rule.nth or
                                         (rule.sticky and rule.seen > rule.nth)):
                        fire = rule
            if fire is not None:
                self.injected.append(f"{'crash' if fire.crash else 'fail'} {op} {path}")
                if fire.crash and self.freeze_on_crash:
                    self.dead = True
        if fire is not None:
            fire.action()

    # --- bookkeeping ---------------------------------------------------------------------------

    def _dir(self, path: str) -> DirState:
        d = os.path.dirname(path)
        with self._guard:
            if d not in self._dirs:
                names = set(os.listdir(d)) if os.path.isdir(d) else set()
                self._dirs[d] = DirState(names)
            return self._dirs[d]

    def _track_file(self, path: str, fresh: bool) -> None:
        with self._guard:
            if path not in self._files:
                size = 0 if fresh else os.path.getsize(path)
                self._files[path] = FileState(size)

    def unsynced_bytes(self) -> int:
        """How many written bytes a crash now could lose (for tests that want a non-empty one)."""
        total = 0
        with self._guard:
            for path, state in self._files.items():
                if os.path.exists(path):
                    total += max(0, os.path.getsize(path) - state.synced_size)
                    total += sum(w.end - w.start for w in state.writes
                                 if w.start < state.synced_size)
        return total

    # --- the FileSystem interface --------------------------------------------------------------

    def create(self, path: str) -> int:
        self._hook("create", path, False)
        self._dir(path)
        fd = super().create(path)
        with self._guard:
            self._fd_path[fd] = path
            self._files[path] = FileState(0)
        self._hook("create", path, True)
        return fd

    def open_append(self, path: str) -> int:
        self._hook("open_append", path, False)
        self._dir(path)
        fd = super().open_append(path)
        with self._guard:
            self._fd_path[fd] = path
        self._track_file(path, fresh=False)
        return fd

    def open_write(self, path: str) -> int:
        self._hook("open_write", path, False)
        self._dir(path)
        fd = super().open_write(path)
        with self._guard:
            self._fd_path[fd] = path
        self._track_file(path, fresh=False)
        return fd

    def write(self, fd: int, data: bytes) -> int:
        return self._write(fd, data, None)

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        """Hooked and counted as a "write", like a write at the end."""
        return self._write(fd, data, offset)

    def _write(self, fd: int, data: bytes, offset: int | None) -> int:
        path = self._fd_path.get(fd, "?")
        self._hook("write", path, False)
        if self.short_write_bytes is not None:
            data, self.short_write_bytes = data[: self.short_write_bytes], None
            self.injected.append(f"short write {path}")
        prior = b""
        if offset is not None and path in self._files:
            with open(path, "rb") as f:
                f.seek(offset)
                prior = f.read(len(data))
        if offset is None:
            n = super().write(fd, data)
            end = os.lseek(fd, 0, os.SEEK_CUR)  # past the bytes just written (O_APPEND too)
        else:
            n = super().pwrite(fd, data, offset)
            end = offset + n
        with self._guard:
            state = self._files.get(path)
            if state is not None and n > 0:
                self._serial += 1
                state.writes.append(Write(end - n, end, data[:n], prior[:n], self._serial))
        self._hook("write", path, True)
        return n

    def sync(self, fd: int) -> None:
        path = self._fd_path.get(fd, "?")
        self._hook("sync", path, False)
        # Only what was written before the sync began is sure to be covered by it.
        size = os.fstat(fd).st_size
        with self._guard:
            covered = self._serial
        during, self.during_sync = self.during_sync, None
        if during is not None:
            during()
        super().sync(fd)
        with self._guard:
            state = self._files.get(path)
            if state is not None:
                state.synced_size = size
                state.writes = [w for w in state.writes if w.serial > covered]
                if state.cut is not None and state.cut[0] <= size:
                    state.cut = None
        self._hook("sync", path, True)

    def syncfs(self, fd: int) -> None:
        """Every file this FaultyFS knows is synced, as far as it was written when the call
        began (a syncfs(2) of the file system; directory entries are left to sync_dir)."""
        self._hook("syncfs", "?", False)
        with self._guard:
            covered = self._serial  # only what was written before the call began
            sizes = {}
            for path in self._files:
                try:
                    sizes[path] = os.stat(path).st_size
                except OSError:
                    pass
        super().syncfs(fd)
        with self._guard:
            for path, size in sizes.items():
                state = self._files.get(path)
                if state is not None:
                    state.synced_size = size
                    state.writes = [w for w in state.writes if w.serial > covered]
                    if state.cut is not None and state.cut[0] <= size:
                        state.cut = None
        self._hook("syncfs", "?", True)

    def sync_dir(self, path: str) -> None:
        self._hook("sync_dir", path, False)
        super().sync_dir(path)
        with self._guard:
            state = self._dirs.setdefault(path, DirState())
            state.synced_names = set(os.listdir(path))
            state.renames.clear()
        self._hook("sync_dir", path, True)

    def rename(self, src: str, dst: str) -> None:
        self._hook("rename", dst, False)
        self._dir(dst)
        super().rename(src, dst)
        with self._guard:
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
        with self._guard:
            self._files.pop(path, None)
        self._hook("unlink", path, True)

    def truncate(self, fd: int, length: int) -> None:
        path = self._fd_path.get(fd, "?")
        self._hook("truncate", path, False)
        with self._guard:
            state = self._files.get(path)
            if state is not None and state.cut is None and os.path.exists(path):
                with open(path, "rb") as f:
                    f.seek(length)
                    state.cut = (length, f.read())
        super().truncate(fd, length)
        with self._guard:
            if state is not None:
                state.writes = [Write(w.start, min(w.end, length), w.data[:length - w.start],
                                       w.prior[:length - w.start], w.serial)
                                for w in state.writes if w.start < length]
        self._hook("truncate", path, True)

    def mkdir(self, path: str) -> None:
        self._hook("mkdir", path, False)
        self._dir(path)
        super().mkdir(path)
        with self._guard:
            self._dirs[path] = DirState(set())
            self._made_dirs.add(path)
        self._hook("mkdir", path, True)

    def close(self, fd: int) -> None:
        with self._guard:
            self._fd_path.pop(fd, None)
        super().close(fd)

    # --- the crash -----------------------------------------------------------------------------

    def crash(self, mode: str = "drop", rng: random.Random | None = None) -> None:
        """Lose what a power cut would: unsynced bytes, and entries no directory sync covered.

        `mode` picks what happens to unsynced bytes (see the module docstring); "tear",
        "reorder" and "zero" draw from `rng`.
        """
        if mode not in CRASH_MODES:
            raise ValueError(f"crash mode must be one of {CRASH_MODES}, not {mode!r}")
        rng = rng or random.Random(0)
        with self._guard:
            for fd in list(self._fd_path):
                try:
                    os.close(fd)
                except OSError:
                    pass
            self._fd_path.clear()
            self.dead = False
            if mode == "keep":
                return  # the process died, the disk did not: nothing unsynced became durable
            self.injected.append(f"crash {mode}")
            for path, state in self._files.items():
                if os.path.exists(path):
                    lose_file_bytes(path, state, mode, rng)
            # Deepest first, so a directory's own entries are settled before it may be undone.
            for directory in sorted(self._dirs, key=lambda d: d.count(os.sep), reverse=True):
                lose_entries(directory, self._dirs[directory], mode, rng,
                                   self._made_dirs)
            self._files.clear()
            self._dirs.clear()
            self._made_dirs.clear()

class _Ticks:
    """The interval syncer's clock, stepped by a test: `wait` reports "not stopped yet" `n`
    times (one interval each), then "stopped"."""

    def __init__(self, n: int) -> None:
        self.left = n

    def wait(self, timeout: float | None = None) -> bool:
        if self.left == 0:
            return True
        self.left -= 1
        return False


def tick(log: object, intervals: int = 1) -> None:
    """Run the loop the background thread of sync="interval" runs (walj's interval_loop), for
    `intervals` intervals, here and now: a test that opens the log with a long
    sync_interval_ms decides when an interval ends, with no timing."""
    import weakref

    from walj.log._durability import interval_loop

    interval_loop(weakref.ref(log), cast(threading.Event, _Ticks(intervals)), 0.0)


def abandon(log: object) -> None:
    """Drop a Log as a dead process would: no sync, no close, only its lock let go."""
    stop = getattr(log, "_stop", None)
    if stop is not None:
        stop.set()  # a dead process has no interval-sync thread either
    state = log._state  # type: ignore[attr-defined]
    state.fd = -1
    state.closed = True
    state.release()
