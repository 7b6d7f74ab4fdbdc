"""Test helper run as a child process: an SDK agent loop whose send_refund needs a person's
approval (walj.Tool(..., approval=True)), on a journal, killed where the parent asks.

Usage: python loop_approval_child.py PROVIDER JOURNAL EFFECTS MODE

PROVIDER is "anthropic" or "openai". The scripted model asks for send_refund (always the same
call id and arguments, as an application answering a saved response again does), then stops.
MODE "run": the loop runs to its end and prints the tool result the model got, as JSON.
MODE "kill_before_run": an observer of the journal prints "PARKED" and sleeps when
send_refund's dispatch starts, before its intent, so the parent's SIGKILL lands after the
approval and before the call runs. MODE "kill_after_run": the observer parks once
send_refund's terminal record is durable, after the call ran.
"""

from __future__ import annotations

import json
import os
import sys
import time

import sdk_fakes as fx

import walj

REFUND_ID = {"anthropic": "toolu_refund", "openai": "call_refund"}
REFUND = {"order": 42, "amount": 30}


def park() -> None:
    print("PARKED", flush=True)
    time.sleep(120)  # the parent kills this process here
    raise SystemExit("not killed")


class Park(walj.ToolObserver):
    """Parks at send_refund's start (before its intent) or end (its outcome durable)."""

    def __init__(self, at: str) -> None:
        self.at = at

    def on_start(self, context: walj.ToolContext) -> None:
        if self.at == "start" and context.tool == "send_refund":
            park()

    def on_end(self, end: walj.ExecutionEnd) -> None:
        if self.at == "end" and end.context.tool == "send_refund":
            park()


def send_refund(effects: str) -> walj.Tool:
    def refund(order: int, amount: int, context: walj.ToolContext) -> str:
        with open(effects, "a", encoding="utf-8") as f:
            f.write(f"refund {order} {amount} {context.idempotency_key}\n")
            f.flush()
            os.fsync(f.fileno())
        return "refunded"

    return walj.Tool(refund, approval=True)


def main() -> None:
    provider, path, effects, mode = sys.argv[1:5]
    journal = walj.ToolJournal.open(path, store_outputs=True)
    if mode != "run":
        journal.add_observer(Park("start" if mode == "kill_before_run" else "end"))
    registry = {"send_refund": send_refund(effects)}
    prompt = [{"role": "user", "content": "refund order 42"}]
    if provider == "anthropic":
        model = fx.ScriptedModel([
            fx.message(fx.tool_use(REFUND_ID[provider], "send_refund", REFUND)),
            fx.message(fx.text_block("Done."))])
        fx.anthropic_loop(fx.anthropic_client(model), prompt, registry, journal)
        [sent] = fx.sent_tool_results(model, 1)
    else:
        model = fx.ScriptedModel([
            fx.response(fx.function_call(REFUND_ID[provider], "send_refund", REFUND)),
            fx.response(fx.output_message("Done."))])
        fx.openai_loop(fx.openai_client(model), prompt, registry, journal)
        [sent] = fx.sent_call_outputs(model, 1)
    journal.close()
    print(json.dumps(sent), flush=True)


if __name__ == "__main__":
    main()
