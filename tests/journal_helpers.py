"""Shared helpers for the journal tests: reading a journal's records, a call recorder, and a
handler for each way a tool call can end other than ok."""

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


# One handler per way a call can end without returning: error, blocked, cancelled,
# ambiguous (the tool cannot tell) and an interrupt.


def fails(x: int) -> None:
    raise ValueError(f"no {x}")


def refuses(x: int) -> None:
    raise walj.ToolBlocked("not today")


def gives_up(x: int) -> None:
    raise walj.ToolCancelled("did nothing")


def unknown(x: int) -> None:
    raise walj.ToolOutcomeUnknown("connection lost after sending")


def interrupted(x: int) -> None:
    raise KeyboardInterrupt
