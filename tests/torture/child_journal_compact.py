"""SIGKILL workload: agent turns through a ToolJournal with checkpoints and compactions (to an
archive, or none), while blockers stay unresolved across them.

Usage: child_journal_compact.py LOGDIR ARCHIVE_URL|- SYNC SEED ROUND ORACLE_FD

Each oracle line is one os.write, made as soon as the fact is true:
  O                       the journal is open
  F <id> <call id> <x>    dispatch of `ok` returned ok (its terminal record is durable)
  U <id>                  a tool's outcome is unknown: the execution is a durable blocker
  R <id>                  an execution was resolved (durable)
  B                       a dispatch came back blocked (no handler ran)
  K <seq>                 checkpoint() returned: a checkpoint from seq <seq> is durable
  a <seq>                 compact() is about to run: no record from <seq> on may be dropped
  A <first seq>           compact() returned: the log now starts at <first seq>
"""

from __future__ import annotations

import os
import random
import sys

import walj


def blockers(journal: walj.ToolJournal) -> set[str]:
    return {b.execution_id for b in journal.recovery.blockers if b.execution_id}


def main() -> None:
    path, archive, mode, seed, rnd, fd = sys.argv[1:7]
    url = None if archive == "-" else archive
    rng = random.Random(f"{seed}:{rnd}:journal-compact")
    out = int(fd)

    def say(line: str) -> None:
        os.write(out, (line + "\n").encode())

    def ok(x: int) -> dict[str, int]:
        return {"x": x, "double": 2 * x}

    def lost(x: int) -> None:
        raise walj.ToolOutcomeUnknown("the connection dropped after the request went out")

    journal = walj.ToolJournal.open(path, tools={"ok": ok, "lost": lost}, sync=mode,
                                    segment_bytes=rng.choice([1024, 2048, 4096]),
                                    store_outputs=True, lock_timeout=10)
    say("O")
    call = 0
    while True:
        step = rng.random()
        if step < 0.08:
            say(f"K {journal.checkpoint()}")
        elif step < 0.14:
            # The checkpoint it writes starts after the last record: nothing from there drops.
            say(f"a {journal._log.last_seq + 1}")
            report = journal.compact(keep_turns=rng.randint(0, 3), archive=url)
            say(f"A {report.first_seq}")
        elif journal.recovery.blocked and step < 0.17:  # blockers outlive compactions
            blocker = rng.choice(journal.recovery.blockers)
            if blocker.execution_id is not None:
                journal.resolve(blocker.execution_id, "not_performed", note="torture",
                                actor="torture")
                say(f"R {blocker.execution_id}")
            else:  # a turn a kill interrupted
                assert blocker.turn_sequence is not None
                journal.resolve_turn(blocker.turn_sequence, note="torture", actor="torture")
        else:
            with journal.turn() as turn:
                for _ in range(rng.randint(1, 3)):
                    call += 1
                    call_id = f"r{rnd}-{call}"
                    if rng.random() < 0.06:
                        before = blockers(journal)
                        try:
                            turn.dispatch("lost", {"x": call}, call_id=call_id)
                        except walj.ToolOutcomeUnknown:
                            for execution_id in blockers(journal) - before:
                                say(f"U {execution_id}")
                        continue
                    result = turn.dispatch("ok", {"x": call}, call_id=call_id)
                    if result.outcome == "blocked":
                        say("B")
                    else:
                        assert result.outcome == "ok", result
                        say(f"F {result.execution_id} {call_id} {call}")


if __name__ == "__main__":
    main()
