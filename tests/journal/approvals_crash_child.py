"""Test helper run as a child process: a call that needs approval asks, is approved and runs,
parking at a named point so that the parent's SIGKILL lands exactly there.

Usage: python approvals_crash_child.py JOURNAL EFFECTS POINT

Points: after_approval (the decision is durable, the call has not run), after_intent (the
intent that consumes the approval is durable, the handler has not run), after_finished. The
handler's side effect is a line (the address it was given) appended and fsynced to EFFECTS.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

PARK_AFTER = {"after_approval": "tool_approval_decided",
              "after_intent": "tool_execution_started",
              "after_finished": "tool_execution_finished"}


def main() -> None:
    path, effects, point = sys.argv[1:4]
    import walj
    from walj.journal._core import Core

    original = Core.write

    def write(self: Core, record: dict[str, Any], **options: Any) -> int:
        seq = original(self, record, **options)
        if record["kind"] == PARK_AFTER[point]:
            print(f"AT {point}", flush=True)
            time.sleep(120)  # the parent kills this process here
            raise SystemExit("not killed")
        return seq

    Core.write = write  # type: ignore[method-assign]

    def send(to: str) -> str:
        with open(effects, "a", encoding="utf-8") as f:
            f.write(f"{to}\n")
            f.flush()
            os.fsync(f.fileno())
        return "sent"

    journal = walj.ToolJournal.open(path, tools={"send": walj.Tool(send, approval=True)},
                                    store_outputs=True)
    with journal.turn() as turn:
        asked = turn.dispatch("send", {"to": "ann@example.com"}, call_id="c1")
    assert asked.approval_id is not None
    journal.approve(asked.approval_id, actor="ann@ops")
    with journal.turn() as turn:
        turn.dispatch("send", {"to": "ann@example.com"}, call_id="c1")
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
