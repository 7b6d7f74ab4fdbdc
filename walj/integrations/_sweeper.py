"""The one daemon thread of a process that closes the idle journals of every integration's
journal holder (walj/integrations/_journals.py), each on its own idle_timeout."""

from __future__ import annotations

import os
import threading
import weakref
from typing import Protocol


class Sweepable(Protocol):
    """A journal holder, as the sweeper sees it."""

    @property
    def idle_timeout(self) -> float | None: ...

    def sweep(self) -> None: ...


class Sweeper:
    """The one daemon thread of a process that closes idle journals of every registry."""

    _guard = threading.Lock()
    _registries: weakref.WeakSet[Sweepable] = weakref.WeakSet()
    _wake = threading.Event()  # a new registry: its timeout may be shorter than the wait
    _thread: threading.Thread | None = None
    _pid = 0

    @classmethod
    def watch(cls, registry: Sweepable) -> None:
        with cls._guard:
            cls._registries.add(registry)
            cls._wake.set()
            if cls._thread is None or cls._pid != os.getpid() or not cls._thread.is_alive():
                cls._pid = os.getpid()
                cls._thread = threading.Thread(target=cls._run, name="walj-idle-journals",
                                               daemon=True)
                cls._thread.start()

    @classmethod
    def _run(cls) -> None:
        while True:
            with cls._guard:
                registries = list(cls._registries)
                cls._wake.clear()
            timeouts = [r.idle_timeout for r in registries if r.idle_timeout is not None]
            # Often enough that a journal is closed within about a quarter of its timeout.
            cls._wake.wait(min([60.0, *(t / 4 for t in timeouts)]))
            for registry in registries:
                try:
                    registry.sweep()
                except Exception:  # noqa: S112 - a close that failed is retried by nobody;
                    continue  # the registry forgot it, and its next use opens it afresh
            del registries
