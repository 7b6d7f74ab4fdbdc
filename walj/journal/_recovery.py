"""Read here by walj/cli until it uses walj.journal.state: the state under its old name."""

from __future__ import annotations

from typing import Any

from .state import MAX_KEEP_TURNS, JournalState

__all__ = ["MAX_KEEP_TURNS", "RecoveryState"]


class RecoveryState(JournalState):
    def feed_json(self, seq: int, data: Any) -> None:
        self.feed(seq, data)
