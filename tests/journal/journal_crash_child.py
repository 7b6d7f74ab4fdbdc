"""Test helper run as a child process: one real journal turn that parks at a named point.

Usage: python journal_crash_child.py JOURNAL EFFECTS POINT [store_outputs]

At POINT it prints "AT POINT" and sleeps, so the parent's SIGKILL lands exactly there. Points:
before_intent, after_intent, in_handler, after_finished, after_turn_completed. The handler's
side effect is a line (with the idempotency key) appended and fsynced to EFFECTS.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any


def park(point: str, here: str) -> None:
    if point == here:
        print(f"AT {here}", flush=True)
        time.sleep(120)  # the parent kills this process here
        raise SystemExit("not killed")


def main() -> None:
    path, effects, point = sys.argv[1:4]
    store_outputs = sys.argv[4:] == ["store_outputs"]
    import walj
    from walj.journal._core import Core

    original = Core.write

    def write(self: Core, record: dict[str, Any], **options: Any) -> int:
        started = record["kind"] == "tool_execution_started"
        if started:
            park(point, "before_intent")
        seq = original(self, record, **options)
        if started:
            park(point, "after_intent")
        return seq

    Core.write = write  # type: ignore[method-assign]

    def send(to: str, context: walj.ToolContext) -> str:
        with open(effects, "a", encoding="utf-8") as f:
            f.write(f"{to} {context.idempotency_key}\n")
            f.flush()
            os.fsync(f.fileno())
        park(point, "in_handler")
        return "sent"

    journal = walj.ToolJournal.open(path, tools={"send": send}, store_outputs=store_outputs)
    with journal.turn() as turn:
        turn.dispatch("send", {"to": "ann@example.com"}, call_id="c1")
        park(point, "after_finished")
    park(point, "after_turn_completed")
    journal.close()
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
