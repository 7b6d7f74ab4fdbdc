"""What the journal's core knows of a turn or an LLM call in flight: enough to tell, under its
state lock, whether the caller gave it up, so a write that lands later never makes it live."""

from __future__ import annotations

from typing import Any


class TurnSlot:
    """What the core knows of a turn: its number and whether it was abandoned (never again
    live). A turn is live exactly while the core names it as `live_turn`: there is no second
    flag for an interrupt to leave out of step."""

    def __init__(self) -> None:
        self.sequence = 0
        self.abandoned = False  # set under the core's state lock
        # Its turn_started record, written with the turn's first record (see Core.write).
        self.start_record: dict[str, Any] | None = None


class LLMSlot:
    """What the core knows of an LLM call: its id and whether it left (never again live)."""

    def __init__(self, llm_call_id: str) -> None:
        self.llm_call_id = llm_call_id
        self.abandoned = False  # set under the core's state lock
