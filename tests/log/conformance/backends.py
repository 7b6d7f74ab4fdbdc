"""The backends the reader's conformance suite runs against: the local file system, the
fault-injecting one, and the archive's view of a file:// archive of the session."""

from __future__ import annotations

import shutil
from pathlib import Path

from faultfs import FaultyFS

from walj.archive._view import ArchiveView, open_view
from walj.log.fs import DEFAULT_FS, FileSystem


class Backend:
    """One way of showing a log directory to a reader: `open` gives the (directory,
    FileSystem) a reader is handed; `sync` makes what the reader sees follow a change made to
    the log's files since (an archive's objects are copies)."""

    def __init__(self, kind: str, tmp: Path) -> None:
        self.kind = kind
        self.root = tmp / "archive"
        self.view: ArchiveView | None = None
        self.faulty = FaultyFS()

    def open(self, path: Path) -> tuple[str, FileSystem]:
        if self.kind == "local":
            return str(path), DEFAULT_FS
        if self.kind == "faulty":
            return str(path), self.faulty
        self._mirror(path)
        self.view = open_view(f"file://{self.root / 'session'}")
        return self.view.directory, self.view

    def sync(self, path: Path) -> None:
        if self.view is not None:
            self._mirror(path)
            self.view.refresh()

    def _mirror(self, path: Path) -> None:
        """Every segment of `path`, byte for byte, as an object of the archived session (the
        layout ship writes; damage made to the log first is damage to the archived copy)."""
        session = self.root / "session"
        session.mkdir(parents=True, exist_ok=True)
        for seg in sorted(path.glob("seg-*.jsonl")):
            shutil.copyfile(seg, session / seg.name)
