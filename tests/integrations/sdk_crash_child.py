"""Test helper run as a child process: an SDK agent loop with a journal, killed inside a tool.

Usage: python sdk_crash_child.py PROVIDER JOURNAL EFFECTS MODE

PROVIDER is "anthropic" or "openai". The scripted model asks for lookup_order, then for
send_refund, then stops. send_refund appends a line (with its idempotency key) to EFFECTS and
fsyncs it; in MODE "kill" it then prints "IN_HANDLER" and sleeps, so the parent's SIGKILL lands
inside the handler, after its side effect. In MODE "clean" the loop runs to the end and the
child prints "DONE".
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import sdk_fakes as fx

import walj

REFUND_ID = {"anthropic": "toolu_refund", "openai": "call_refund"}
LOOKUP_ID = {"anthropic": "toolu_lookup", "openai": "call_lookup"}


def tools(effects: str, park: bool) -> dict[str, Any]:
    def lookup_order(order: int) -> dict[str, Any]:
        return {"order": order, "amount": 30}

    def send_refund(order: int, amount: int, context: walj.ToolContext) -> str:
        with open(effects, "a", encoding="utf-8") as f:
            f.write(f"refund {order} {amount} {context.idempotency_key}\n")
            f.flush()
            os.fsync(f.fileno())
        if park:
            print("IN_HANDLER", flush=True)
            time.sleep(120)  # the parent kills this process here
            raise SystemExit("not killed")
        return "refunded"

    return {"lookup_order": lookup_order, "send_refund": send_refund}


def main() -> None:
    provider, path, effects, mode = sys.argv[1:5]
    journal = walj.ToolJournal.open(path)
    registry = tools(effects, park=mode == "kill")
    if provider == "anthropic":
        model = fx.ScriptedModel([
            fx.message(fx.tool_use(LOOKUP_ID[provider], "lookup_order", {"order": 42})),
            fx.message(fx.tool_use(REFUND_ID[provider], "send_refund",
                                   {"order": 42, "amount": 30})),
            fx.message(fx.text_block("Refunded.")),
        ])
        fx.anthropic_loop(fx.anthropic_client(model),
                          [{"role": "user", "content": "refund order 42"}], registry, journal)
    else:
        model = fx.ScriptedModel([
            fx.response(fx.function_call(LOOKUP_ID[provider], "lookup_order", {"order": 42})),
            fx.response(fx.function_call(REFUND_ID[provider], "send_refund",
                                         {"order": 42, "amount": 30})),
            fx.response(fx.output_message("Refunded.")),
        ])
        fx.openai_loop(fx.openai_client(model),
                       [{"role": "user", "content": "refund order 42"}], registry, journal)
    journal.close()
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
