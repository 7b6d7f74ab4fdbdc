"""What the rebuild holds open: started executions without a terminal record, and turns
without a completion. Standard library only (the forensic tool)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import records as r


class OpenExecution:
    """A started execution with no terminal record and no resolution. The started record may be
    kept as its JSON bytes and decoded only when someone looks: most executions finish first."""

    __slots__ = ("_raw", "_record", "seq", "turn", "open_turn", "state", "error_type",
                 "reconcile_error")

    def __init__(self, record: Mapping[str, Any] | bytes, seq: int, turn: int | None,
                 open_turn: OpenTurn | None = None) -> None:
        self._raw: bytes | None = record if isinstance(record, bytes) else None
        self._record: Mapping[str, Any] | None = None if isinstance(record, bytes) else record
        self.seq = seq
        self.turn = turn
        self.open_turn = open_turn  # its turn while that is open, to count it there
        self.state = r.STATE_STARTED
        self.error_type: str | None = None
        self.reconcile_error: str | None = None

    @property
    def record(self) -> Mapping[str, Any]:
        if self._record is None:
            assert self._raw is not None
            self._record, self._raw = r.decode_object(self.seq, self._raw), None
        return self._record


class OpenTurn:
    __slots__ = ("sequence", "seq", "started_at", "started", "unfinished", "resolved", "tag")

    def __init__(self, sequence: int, seq: int, started_at: float | None) -> None:
        self.sequence = sequence
        self.tag = r.turn_tag(sequence)  # how its executions' started records name it
        self.seq = seq
        self.started_at = started_at
        self.started = 0  # executions started in it
        self.unfinished = 0  # of those, how many never got tool_execution_finished
        self.resolved = False

    @property
    def interrupted(self) -> bool:
        """Tool-bearing, every execution finished, yet no turn_completed. A turn with an
        unfinished execution is settled through that execution's blocker instead."""
        return self.started > 0 and self.unfinished == 0 and not self.resolved
