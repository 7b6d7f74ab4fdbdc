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
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path
from typing import Any

import walj


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

    tools = {"ok": ok, "fail": fail, "refuse": refuse, "effect": effect, "effect2": effect}
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
                    name = rng.choice(list(tools))
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


if __name__ == "__main__":
    main()
