"""Shared helpers for the journal tests: reading a journal's records, and a call recorder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import walj


def records(path: Path) -> list[dict[str, Any]]:
    return [r.data for r in walj.read(path)]


def kinds(path: Path) -> list[str]:
    return [r["kind"] for r in records(path)]


class Recorder:
    """A tool handler that remembers each call and returns a fixed value."""

    def __init__(self, result: Any = "done") -> None:
        self.calls: list[dict[str, Any]] = []
        self.result = result

    def __call__(self, **arguments: Any) -> Any:
        self.calls.append(arguments)
        return self.result
