"""SIGKILL workload: agent turns dispatching random tools through a ToolJournal.

Usage: child_turns.py LOGDIR SYNC SEGMENT_BYTES SEED ROUND ORACLE_FD

Tools succeed, raise, refuse, cancel, or write a side-effect file (LOGDIR/../effects/<id>).
Each oracle line is one os.write, made as soon as the fact is true:
  O                       the journal is open
  B <id>                  a dispatch came back blocked (its handler must not have run)
  R <id> / RT <turn>      an execution / a turn was resolved (durable)
  T <turn>                a turn started
  H <id> <turn>           a handler started (so its intent is durable)
  F <id> <outcome>        dispatch returned (the terminal record is durable)
  P <id> <outcome>        a repeated call id was answered from the settled execution <id>
                          (its tool_execution_replayed record is durable; no handler ran)
  N <id>                  a repeated call id was refused (tool_execution_refused is durable)
  C <turn>                a turn completed
  X <turn>                a turn was left by an exception (not completed)
  Q <approval> <call>     a dispatch of tool "gated" (it needs approval) came back
                          awaiting_approval (its tool_approval_requested is durable)
  A <approval> / D <id>   an approval / a denial was given (tool_approval_decided is durable)
  U <approval> <id>       dispatch returned from execution <id>, which ran on that approval
  E <approval> <outcome>  a gated dispatch was answered denied or approval_expired: nothing ran
  W <call>                a gated dispatch was refused: its arguments differ from the approved
                          ones (nothing written, nothing ran)
"""

from __future__ import annotations

import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import walj


class Approvals:
    """The calls of tool "gated", which needs approval, and the approvals and denials given."""

    def __init__(self, journal: walj.ToolJournal, rng: random.Random,
                 say: Callable[[str], None], rnd: str) -> None:
        self.journal, self.rng, self.say, self.rnd = journal, rng, say, rnd
        self.calls = 0

    def decide(self) -> None:
        """Approve or deny some pending requests; an approval may lapse within milliseconds."""
        rng = self.rng
        for request in self.journal.recovery.approvals:
            if rng.random() < 0.3:
                continue
            if rng.random() < 0.25:
                self.journal.deny(request.approval_id, actor="torture", note="no")
                self.say(f"D {request.approval_id}")
                continue
            expires = rng.choice([None, None, None, time.time() + 0.005])
            self.journal.approve(request.approval_id, actor="torture", note="checked",
                                 expires_at=expires)
            self.say(f"A {request.approval_id}")

    def dispatch(self, turn: walj.Turn) -> None:
        """A call that needs approval: asked for, or run on the approval it got. A few call ids
        at a time, renewed as they go (settled or denied ones stay so)."""
        self.calls += 1
        call_id = f"g{self.rnd}-{self.calls // 8}-{self.rng.randrange(3)}"
        x = 1 if self.rng.random() < 0.15 else 0  # now and then not the arguments approved
        self.tell(call_id, turn.dispatch("gated", {"x": x}, call_id=call_id))

    def tell(self, call_id: str, result: walj.ToolResult) -> None:
        say = self.say
        if result.outcome == "awaiting_approval":
            say(f"Q {result.approval_id} {call_id}")
        elif result.outcome in ("denied", "approval_expired"):
            say(f"E {result.approval_id} {result.outcome}")
        elif result.outcome == "refused" and not result.execution_id:  # nothing written
            say(f"W {call_id}")
        elif result.replayed:
            say(f"P {result.execution_id} {result.outcome}")
        elif result.outcome == "refused":
            say(f"N {result.execution_id}")
        else:
            if result.approval_id is not None:
                say(f"U {result.approval_id} {result.execution_id}")
            say(f"F {result.execution_id} {result.outcome}")


def main() -> None:
    path, mode, segment_bytes, seed, rnd, fd = sys.argv[1:7]
    rng = random.Random(f"{seed}:{rnd}:turns")
    out = int(fd)
    effects = Path(path).parent / "effects"
    effects.mkdir(exist_ok=True)

    def say(line: str) -> None:
        os.write(out, (line + "\n").encode())

    def started(context: walj.ToolContext) -> None:
        say(f"H {context.execution_id} {context.turn_sequence}")

    def ok(x: int, context: walj.ToolContext) -> dict[str, Any]:
        started(context)
        return {"x": x, "pad": "p" * rng.choice([0, 50, 900])}

    def fail(x: int, context: walj.ToolContext) -> None:
        started(context)
        raise RuntimeError(f"tool failed on {x}")

    def refuse(x: int, context: walj.ToolContext) -> None:
        started(context)
        raise (walj.ToolBlocked if x % 2 else walj.ToolCancelled)("no")

    def effect(x: int, context: walj.ToolContext) -> str:
        started(context)
        target = effects / context.execution_id
        with open(target, "x") as f:  # the side effect: exactly once per execution
            f.write(context.idempotency_key)
        for _ in range(rng.choice([0, 0, 2000, 20000])):  # sometimes linger after the effect
            pass
        return target.name

    tools: dict[str, Any] = {"ok": ok, "fail": fail, "refuse": refuse, "effect": effect,
                             "effect2": effect}
    plain = list(tools)
    tools["gated"] = walj.Tool(effect, approval=True)  # dispatched by gated() only
    journal = walj.ToolJournal.open(path, tools=tools, sync=mode,
                                    segment_bytes=int(segment_bytes), lock_timeout=10)
    say("O")

    def settle() -> None:
        for blocker in journal.recovery.blockers:
            if blocker.execution_id is not None:
                outcome = rng.choice(["succeeded", "failed", "not_performed"])
                journal.resolve(blocker.execution_id, outcome, note="settled by the torture",
                                actor="torture")
                say(f"R {blocker.execution_id}")
            else:
                assert blocker.turn_sequence is not None
                journal.resolve_turn(blocker.turn_sequence, note="torture", actor="torture")
                say(f"RT {blocker.turn_sequence}")

    if journal.recovery.blocked and rng.random() < 0.5:
        with journal.turn() as turn:
            say(f"T {turn.sequence}")
            result = turn.dispatch("effect", {"x": -1})
            assert result.outcome == "blocked", result
            say(f"B {result.execution_id}")
        say(f"C {turn.sequence}")

    approvals = Approvals(journal, rng, say, rnd)
    settle()
    while True:
        turn = journal.turn()
        try:
            with turn:
                say(f"T {turn.sequence}")
                for i in range(rng.choice([0, 1, 2, 3, 5])):
                    if rng.random() < 0.1:
                        with journal.llm_call(model="m", request={"q": i}) as call:
                            call.finish({"a": i})
                    if rng.random() < 0.3:
                        approvals.dispatch(turn)
                        continue
                    name = rng.choice(plain)
                    # Call ids repeat across turns, so replay and its refusals run here too.
                    result = turn.dispatch(name, {"x": rng.randrange(3)},
                                           call_id=f"c{i}" if rng.random() < 0.5 else None)
                    if result.replayed:
                        say(f"P {result.execution_id} {result.outcome}")
                    elif result.outcome == "refused":
                        say(f"N {result.execution_id}")
                    else:
                        say(f"F {result.execution_id} {result.outcome}")
                if rng.random() < 0.1:
                    raise LookupError("the turn fails after its tools")
        except LookupError:
            say(f"X {turn.sequence}")
        else:
            say(f"C {turn.sequence}")
        if journal.recovery.blocked:
            settle()
        if rng.random() < 0.5:
            approvals.decide()


if __name__ == "__main__":
    main()
