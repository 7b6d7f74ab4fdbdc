"""The process-wide commit service: the syncs of every log in the process, handed to one place
that batches them ("files": a small pool of fdatasync threads; "syncfs": lockstep rounds, one
syncfs per file system), or made by each log in its caller ("inline", the default).

A log hands the service one request at a time (its group commit's leader, or its writer under
sync="always"): a descriptor and the file system seam it belongs to. The service makes the
sync and releases the request's lock; the log then settles which of its records the sync
covered and wakes only their waiters (walj/log/_durability.py). A failed sync is never retried:
the request carries the OSError, and the log is poisoned by it.

"syncfs" (Linux 5.8 or later): a round takes every request pending, and makes one syncfs(2)
per file system among them through a descriptor the service opened on that file system before
any write it certifies (see `enroll`). syncfs flushes the whole file system, every process's
dirty data on it, and reports a writeback error once per open file description: so the first
failure on a file system is remembered for the life of the process, and every later round on
that file system fails with it (a second syncfs through the same descriptor would report
success for pages the kernel has already dropped).

The service's threads are daemons and exist only in the process that started them; a child
starts its own. A waiter polls its request, so that it never waits forever on a thread that
died: it then gets a typed error and its log is poisoned.
"""

from __future__ import annotations

import os
import queue
import threading
from _thread import allocate_lock
from typing import Any

from ..errors import CommitModeError, PoisonedError
from .fs import FileSystem, syncfs_available

MODES = ("inline", "files", "syncfs")
DEFAULT_FILES_THREADS = 16  # measured: 4 threads left 64 logs at a third of the rate of 16
POLL_SECONDS = 0.5  # how often a waiter checks that the thread serving it is alive


Device = tuple[FileSystem, int]  # a file system, by the seam that reaches it and its st_dev


class Request:
    """One sync handed to the service: `done` is released when it is over; `failure` is the
    OSError it raised (or the reason it was never made)."""

    __slots__ = ("fs", "fd", "device", "done", "failure", "finished", "server", "service")

    def __init__(self, fs: FileSystem, fd: int, device: Device | None) -> None:
        self.fs, self.fd, self.device = fs, fd, device
        self.service: FilesService | SyncfsService | None = None
        self.done = allocate_lock()
        self.done.acquire()
        self.failure: BaseException | None = None
        self.finished = False
        self.server: threading.Thread | None = None

    def finish(self, failure: BaseException | None) -> None:
        self.failure = failure
        self.finished = True
        self.done.release()

    def wait(self) -> None:
        """Until the sync is over; raises its OSError, or PoisonedError when the thread that
        took it died without finishing it. One still queued when every thread died gets a new
        thread."""
        while not self.done.acquire(timeout=POLL_SECONDS):
            server, service = self.server, self.service
            if server is None and service is not None:
                service.ensure_running()
            elif server is not None and not server.is_alive() and not self.finished:
                self.failure = PoisonedError("the commit service's thread stopped before "
                                             "finishing a sync")
                self.finished = True
                break
        failure = self.failure
        if failure is not None:
            raise failure


class _Stats:
    """Counters since process start (a child keeps its parent's)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rounds = self.syncs = self.waiters = self.requests = 0


_stats = _Stats()


def _count(rounds: int, syncs: int, requests: int) -> None:
    with _stats.lock:
        _stats.rounds += rounds
        _stats.syncs += syncs
        _stats.requests += requests


def count_waiters(n: int) -> None:
    """A log's round woke `n` waiters (its leader included)."""
    with _stats.lock:
        _stats.waiters += n


class FilesService:
    """A pool of `threads` threads, each taking a pending request and fdatasyncing its file."""

    def __init__(self, threads: int) -> None:
        self.size = threads
        self._queue: queue.SimpleQueue[Request | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self.threads: list[threading.Thread] = []
        self._idle = 0

    def submit(self, request: Request) -> None:
        request.service = self
        with self._lock:
            self._start_if_needed(self._idle == 0)
            self._queue.put(request)

    def ensure_running(self) -> None:
        with self._lock:
            self._start_if_needed(self.running() == 0)

    def _start_if_needed(self, wanted: bool) -> None:
        if wanted and self.running() < self.size:
            worker = threading.Thread(target=self._serve, daemon=True,
                                      name=f"walj-commit-files-{len(self.threads)}")
            self.threads.append(worker)
            worker.start()

    def _serve(self) -> None:
        me = threading.current_thread()
        while True:
            with self._lock:
                self._idle += 1
            request = self._queue.get()
            with self._lock:
                self._idle -= 1
            if request is None:
                return
            request.server = me
            try:
                request.fs.sync(request.fd)
                failure: BaseException | None = None
            except OSError as exc:
                failure = exc
            _count(1, 1, 1)
            request.finish(failure)

    def stop(self) -> None:
        for _ in self.threads:
            self._queue.put(None)

    def running(self) -> int:
        return sum(t.is_alive() for t in self.threads)


class SyncfsService:
    """One thread making lockstep rounds: every request pending, one syncfs per file system."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Request | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self._devices: dict[Device, int] = {}  # (seam, st_dev) -> the service's descriptor

    def enroll(self, fs: FileSystem, directory: str) -> Device:
        """The key of the file system `directory` is on, opening the service's descriptor on
        it first if it has none: syncfs reports only errors after that open, so a log syncs
        what it wrote before enrolling itself, then hands later syncs to the rounds."""
        device = (fs, fs.stat(directory).st_dev)
        with self._lock:
            if device not in self._devices:
                self._devices[device] = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
        return device

    def submit(self, request: Request) -> None:
        request.service = self
        with self._lock:
            self._start_if_needed()
            self._queue.put(request)

    def ensure_running(self) -> None:
        with self._lock:
            self._start_if_needed()

    def _start_if_needed(self) -> None:
        if self.thread is None or not self.thread.is_alive():
            self.thread = threading.Thread(target=self._serve, daemon=True,
                                           name="walj-commit-syncfs")
            self.thread.start()

    def _serve(self) -> None:
        me = threading.current_thread()
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            while True:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._queue.put(None)
                    break
                batch.append(more)
            for request in batch:
                request.server = me
            self._round(batch)

    def _round(self, batch: list[Request]) -> None:
        groups: dict[Device, list[Request]] = {}
        for request in batch:
            assert request.device is not None
            groups.setdefault(request.device, []).append(request)
        for device, requests in groups.items():
            failure = _failed_devices.get(device)
            if failure is None:
                try:
                    requests[0].fs.syncfs(self._devices[device])
                except OSError as exc:
                    failure = _failed_devices[device] = exc
            for request in requests:
                request.finish(_copy(failure))
        _count(1, len(groups), len(batch))

    def stop(self) -> None:
        self._queue.put(None)

    def running(self) -> int:
        return int(self.thread is not None and self.thread.is_alive())


def _copy(failure: OSError | None) -> OSError | None:
    """Each waiter raises its own exception object (one shared by threads mixes tracebacks)."""
    if failure is None:
        return None
    return OSError(failure.errno, failure.strerror)


_failed_devices: dict[Device, OSError] = {}


def _kernel_reports_syncfs_errors() -> bool:
    """syncfs(2) reports writeback errors from Linux 5.8 on; before, it returned 0 anyway."""
    if not os.uname().sysname == "Linux":
        return False
    try:
        major, minor = (int(part) for part in os.uname().release.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (5, 8)


class _Config:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.mode = "inline"
        self.files: FilesService | None = None
        self.syncfs: SyncfsService | None = None
        self.retired: list[Any] = []  # services replaced: their Threads are never freed


_config = _Config()


def _check(mode: Any, threads: Any) -> None:
    if not isinstance(mode, str) or mode not in MODES:
        raise CommitModeError(f"commit mode must be one of {MODES}, not {mode!r}")
    if threads is not None and (type(threads) is not int or not 1 <= threads <= 1024):
        raise CommitModeError(f"threads must be an int from 1 to 1024, not {threads!r}")
    if threads is not None and mode != "files":
        raise CommitModeError("threads applies to the commit mode 'files' only")


def set_commit_mode(mode: str, *, threads: int | None = None) -> str:
    """Make `mode` the process's commit mode for every log opened without `commit=`, and
    return the previous one: "inline" (each log syncs in its caller), "files" (a pool of
    `threads` fdatasync threads, 16 by default), "syncfs" (one syncfs per file system per
    round; Linux 5.8 or later; for a volume dedicated to walj's state, see docs/FORMAT.md).
    Logs already open switch at their next sync."""
    _check(mode, threads)
    with _config.lock:
        if mode == "syncfs":
            _syncfs_service()
        elif mode == "files":
            _files_service(threads)
        previous, _config.mode = _config.mode, mode
    return previous


def service_for(mode: str | None) -> FilesService | SyncfsService | None:
    """The service a log with `commit=mode` (None: the process's mode) hands its syncs to,
    or None for inline."""
    chosen = _config.mode if mode is None else mode
    if chosen == "inline":
        return None
    with _config.lock:
        return _files_service(None) if chosen == "files" else _syncfs_service()


def check_commit(mode: Any) -> None:
    """Log.open's check of its `commit=` option (None: the process's mode)."""
    if mode is not None:
        _check(mode, None)
        if mode == "syncfs":
            with _config.lock:
                _syncfs_service()


def _files_service(threads: int | None) -> FilesService:
    service = _config.files
    if service is None or (threads is not None and threads != service.size):
        if service is not None:
            service.stop()
            _config.retired.append(service)
        service = _config.files = FilesService(threads or DEFAULT_FILES_THREADS)
    return service


def _syncfs_service() -> SyncfsService:
    service = _config.syncfs
    if service is None:
        if not (_kernel_reports_syncfs_errors() and syncfs_available()):
            raise CommitModeError("commit mode 'syncfs' needs Linux 5.8 or later and a C "
                                  "library with syncfs(2); use 'files' or 'inline'")
        service = _config.syncfs = SyncfsService()
    return service


def commit_stats() -> dict[str, int]:
    """The commit service's counters since the process started: "rounds" (files: one per
    sync; syncfs: one per lockstep round), "syncs" (fdatasync or syncfs calls it made),
    "requests" (syncs handed to it), "waiters" (appends and syncs its rounds made durable,
    counted by their logs), and "threads" (its threads running now)."""
    with _stats.lock:
        counts = {"rounds": _stats.rounds, "syncs": _stats.syncs, "requests": _stats.requests,
                  "waiters": _stats.waiters}
    files, syncfs = _config.files, _config.syncfs
    counts["threads"] = (files.running() if files else 0) + (syncfs.running() if syncfs else 0)
    return counts


def commit_mode() -> str:
    return _config.mode


def _after_fork_in_child() -> None:
    # The parent's threads do not exist here, and its locks may have been held at the fork.
    # Its failed file systems stay failed: an error syncfs reported is not reported again.
    old = _config.files, _config.syncfs
    _config.retired.append(old)
    _config.lock = threading.Lock()
    _config.files = None
    _config.syncfs = None
    _stats.lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

__all__ = ["MODES", "CommitModeError", "Request", "commit_mode", "commit_stats",
           "count_waiters", "service_for", "set_commit_mode"]
