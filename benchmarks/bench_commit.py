"""The process-wide commit service as the sessions figures drive it: its modes, its counters
over a timed window, and the open-files limit a thousand sessions need.

walj's commit service (when present) is `walj.set_commit_mode(mode, *, threads=None)` with the
modes in COMMIT_MODES, and `walj.commit_stats()`, a dict with at least "rounds", "syncs",
"threads" and "waiters". A walj without them runs every journal's syncs inline, as it always
did, and the mode figures say they could not be measured.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import ModuleType
from typing import Any

COMMIT_MODES = ("inline", "files", "syncfs")
MODE_HOW = {
    "inline": "each journal syncs its own file in the caller's thread",
    "files": "the commit service syncs each file with a pending write, from its pool",
    "syncfs": "the commit service makes one `syncfs` per round for every file with a pending "
    "write (a volume dedicated to walj)",
}
COUNTERS = ("rounds", "syncs")


def service_missing(walj: ModuleType | None) -> str | None:
    """Why the commit modes cannot be chosen, or None when they can."""
    if walj is None:
        return "walj not importable"
    if getattr(walj, "set_commit_mode", None) is None or getattr(
        walj, "commit_stats", None
    ) is None:
        return "walj has no process-wide commit service (walj.set_commit_mode) yet"
    return None


DEFAULT_MODE = "inline"  # walj's default (docs/FORMAT.md, *Commits*)


def default_mode(walj: ModuleType | None) -> str | None:
    """The mode walj runs in when nobody chose one: set_commit_mode returns the mode it
    replaces, so setting one and putting that back names it (DEFAULT_MODE when it names none
    of COMMIT_MODES); None without a commit service."""
    if service_missing(walj) or walj is None:
        return None
    current = walj.set_commit_mode("inline")
    walj.set_commit_mode(current)
    return current if isinstance(current, str) and current in COMMIT_MODES else DEFAULT_MODE


def stats(walj: ModuleType | None) -> dict[str, Any]:
    """walj.commit_stats(), or {} where there is no commit service."""
    fn = getattr(walj, "commit_stats", None)
    if fn is None:
        return {}
    got = fn()
    return dict(got) if isinstance(got, dict) else {}


@contextlib.contextmanager
def commit_mode(walj: ModuleType | None, mode: str | None, restore: str | None) -> Iterator[None]:
    """Run the body in `mode` (None: leave the mode alone), then put back `restore`, or else
    the mode set_commit_mode reported as the previous one."""
    if mode is None or walj is None:
        yield
        return
    previous = walj.set_commit_mode(mode)
    try:
        yield
    finally:
        back = restore or (previous if isinstance(previous, str) else None)
        if back is not None and back != mode:
            walj.set_commit_mode(back)


class ServiceWindow:
    """The commit service's counters over timed windows: `mark()` at each window's start and
    end line (setup around a window, a thousand journals opened, is left out); rounds and
    syncs per second, calls per round over every window, and the service's threads and
    waiters at the last end line."""

    def __init__(self, walj: ModuleType | None) -> None:
        self._walj = walj if service_missing(walj) is None else None
        self._marks: list[dict[str, Any]] = []

    def mark(self) -> None:
        if self._walj is not None:
            self._marks.append(stats(self._walj))

    def _counted(self, key: str) -> float | None:
        total = 0.0
        for start, end in zip(self._marks[::2], self._marks[1::2], strict=False):
            a, b = start.get(key), end.get(key)
            if not (isinstance(a, int | float) and isinstance(b, int | float)):
                return None
            total += b - a
        return total

    def extras(self, ops: int, seconds: float) -> dict[str, float]:
        if self._walj is None or seconds <= 0 or len(self._marks) < 2:
            return {}
        out: dict[str, float] = {}
        for key in COUNTERS:
            done = self._counted(key)
            if done is not None:
                out[f"commit_{key}_per_s"] = done / seconds
                if key == "rounds" and done > 0:
                    out["calls_per_round"] = ops / done
        for key in ("threads", "waiters"):
            value = self._marks[-1].get(key)
            if isinstance(value, int | float):
                out[f"commit_{key}"] = float(value)
        return out


def raise_open_files(need: int) -> str | None:
    """Raise the soft open-files limit to `need` if it is lower; the reason it cannot, or
    None. A journal holds two descriptors, a SQLite database in WAL mode three."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not Unix
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return None
    if hard != resource.RLIM_INFINITY and hard < need:
        return f"needs {need:,} open files; the hard limit is {hard:,}"
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    return None
