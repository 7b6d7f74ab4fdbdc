"""The demo's agent session, run as a child process: its tools, and two turns, the second of
which the parent kills inside a tool that has already had its side effect."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

MARKER = "walj-demo: inside send_refund_email"
LOG_NAME = "session"
OUTBOX_NAME = "outbox.jsonl"


def make_tools(directory: str, *, hang: bool) -> dict[str, Callable[..., Any]]:
    """The demo's two tools. With `hang`, the email tool announces that its side effect is done
    and then waits to be killed."""
    outbox = os.path.join(directory, OUTBOX_NAME)

    def lookup_order(order_id: str) -> dict[str, Any]:
        return {"order_id": order_id, "status": "delivered", "total": "42.00 EUR"}

    def send_refund_email(to: str, subject: str, body: str) -> dict[str, Any]:
        with open(outbox, "a", encoding="utf-8") as f:
            f.write(json.dumps({"to": to, "subject": subject, "body": body}) + "\n")
            f.flush()
            os.fsync(f.fileno())
        if hang:
            print(MARKER, flush=True)
            time.sleep(60)  # the parent sends SIGKILL before this returns
        return {"sent": True, "to": to}

    return {"lookup_order": lookup_order, "send_refund_email": send_refund_email}


def emails(directory: str) -> int:
    try:
        with open(os.path.join(directory, OUTBOX_NAME), encoding="utf-8") as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


REFUND = {"to": "ada@example.com", "subject": "Your refund for order A-1042",
          "body": "Hello Ada, we have refunded 42.00 EUR to your card."}


def run(directory: str) -> None:
    from walj import ToolJournal

    tools = make_tools(directory, hang=True)
    with ToolJournal.open(os.path.join(directory, LOG_NAME), tools=tools) as journal:
        with journal.turn() as turn:
            result = turn.dispatch("lookup_order", {"order_id": "A-1042"})
            print(f"turn {turn.sequence}  lookup_order {{'order_id': 'A-1042'}}  -> "
                  f"{result.outcome}: {result.output['status']}", flush=True)
        with journal.turn() as turn:
            print(f"turn {turn.sequence}  send_refund_email {{'to': '{REFUND['to']}', ...}}  "
                  "-> the handler sends the email...", flush=True)
            turn.dispatch("send_refund_email", REFUND)


if __name__ == "__main__":
    run(sys.argv[1])
