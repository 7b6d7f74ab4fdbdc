"""Which resolution requests a journal has answered: the ids the recovery state remembers so
that a request file found again (a crash between its answer and its removal) is never applied
twice. Standard library only (the forensic tool rebuilds the state too)."""

from __future__ import annotations

from collections import deque
from typing import Any

# Request ids remembered, newest last; checkpoints carry them all. A request's file is removed
# as soon as its answer is durable, so only a crash or a file that cannot be removed leaves one
# behind, and its id is long remembered by the time it is found again.
APPLIED_REQUESTS = 1024


class AppliedRequests:
    """The ids of the last APPLIED_REQUESTS requests answered, in log order."""

    def __init__(self) -> None:
        self.order: deque[str] = deque()
        self.ids: set[str] = set()

    def note(self, request_id: Any) -> None:
        """Remember the `request` field of a record that answers a request; anything but a
        non-empty string (an older record, or a hostile one) answers none."""
        if not isinstance(request_id, str) or not request_id or request_id in self.ids:
            return
        self.order.append(request_id)
        self.ids.add(request_id)
        if len(self.order) > APPLIED_REQUESTS:
            self.ids.discard(self.order.popleft())

    def __contains__(self, request_id: object) -> bool:
        return request_id in self.ids

    def __len__(self) -> int:
        return len(self.order)
