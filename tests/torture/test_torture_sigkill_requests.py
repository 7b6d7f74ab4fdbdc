"""SIGKILL, black box, for live resolution: a writer child holds a blocked journal and takes
resolution requests while `walj resolve` children ask it (and, once it is gone, apply their
own requests by opening the session); writers and askers are killed at random. After each
trial, and a last open that answers what was left: no request answered twice, none an asker
acknowledged lost, no execution resolved twice, no request file left, and the state a fresh
open rebuilds equals a replay of the log."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from pathlib import Path
from random import Random

import pytest
from budget import SEED, TALLY, rng_for, scaled
from sigkill import Kill, run_and_kill, run_trials

import walj
from walj.journal.state import rebuild

MODES = ("always", "batch", "interval", "never")
REQUEST_TRIALS = scaled(6, minimum=2)
ROUNDS = 2
ASKERS = 3  # per round
BLOCKERS = 4
RESOLUTIONS = ("tool_execution_resolved", "turn_resolved")


def blocked_journal(path: Path, mode: str) -> list[str]:
    """A journal left with BLOCKERS ambiguous executions (concurrent dispatches of one turn,
    cancelled while their handlers ran); their ids."""

    async def cancelled_together(journal: walj.ToolJournal) -> None:
        entered: list[int] = []

        async def hold(x: int) -> None:
            entered.append(x)
            await asyncio.Event().wait()

        async with journal.turn() as turn:
            tasks = [asyncio.create_task(turn.adispatch("send", {"x": i}, handler=hold))
                     for i in range(BLOCKERS)]
            while len(entered) < BLOCKERS:
                await asyncio.sleep(0.001)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    with walj.ToolJournal.open(path, sync=mode, segment_bytes=2048) as journal:
        asyncio.run(cancelled_together(journal))
        eids = [b.execution_id for b in journal.recovery.blockers if b.execution_id]
    assert len(eids) == BLOCKERS, eids
    return eids


def _run_writer(kills: list[Kill], path: Path, mode: str, rnd: int, rng: Random) -> None:
    kills.append(run_and_kill("child_request_writer.py", [str(path), mode, str(SEED), str(rnd)],
                              rng, max_wait=1.5))


def one_trial(tmp_path: Path, trial: int) -> None:
    mode = MODES[trial % len(MODES)]
    path = tmp_path / f"trial{trial}" / "journal"
    eids = blocked_journal(path, mode)
    acked: list[tuple[str, str, str]] = []  # (exit code, request id, status)
    for rnd in range(1, ROUNDS + 1):
        context = f"trial {trial} ({mode}) round {rnd}"
        writer_rng = rng_for(f"sigkill-requests-{trial}-{rnd}-writer")
        asker_rng = rng_for(f"sigkill-requests-{trial}-{rnd}-askers")
        kills: list[Kill] = []
        writer = threading.Thread(target=_run_writer, args=(kills, path, mode, rnd, writer_rng))
        writer.start()
        try:
            deadline = time.monotonic() + 30
            while not (path.parent / f"open-{rnd}").exists() and writer.is_alive():
                assert time.monotonic() < deadline, f"{context}: the writer never opened"
                time.sleep(0.005)
            for _ in range(ASKERS):
                target = asker_rng.choice([*eids, *eids, "0123456789abcdef" * 2, "turn:99"])
                outcome = asker_rng.choice(["succeeded", "not_performed", "failed"])
                actor = "policy" if asker_rng.random() < 0.1 else "torture"
                wait = asker_rng.choice(["0", "0.2", "2"])
                run = run_and_kill("child_request_asker.py",
                                   [str(path), target, outcome, actor, wait], asker_rng,
                                   max_wait=1.0)
                TALLY.add(faults=int(run.killed), sigkill_kills=int(run.killed))
                for line in run.lines[1:]:
                    _, code, request_id, status = line.split()
                    acked.append((code, request_id, status))
                if not run.killed and run.returncode != 0:
                    pytest.fail(f"{context}: an asker died on its own ({run.returncode}):\n"
                                f"{run.stderr}")
        finally:
            writer.join()
        (kill,) = kills
        if not kill.killed:
            pytest.fail(f"{context}: the writer died on its own ({kill.returncode}):\n"
                        f"{kill.stderr}")
        TALLY.add(faults=1, sigkill_kills=1)
        check(path, acked, context, final=False)
    with walj.ToolJournal.open(path):  # answers what is left
        pass
    check(path, acked, f"trial {trial} ({mode}) after a last open", final=True)
    TALLY.add(trials_sigkill_requests=1)


def check(path: Path, acked: list[tuple[str, str, str]], context: str, *, final: bool) -> None:
    report = walj.verify(path)
    assert report.ok, f"{context}: {[p.describe() for p in report.problems]}"
    records = list(walj.read(path))
    answers = Counter(r.data["request"] for r in records if "request" in r.data)
    twice = [request_id for request_id, count in answers.items() if count > 1]
    assert not twice, f"{context}: requests answered more than once: {twice}"
    settled = Counter(r.data.get("execution_id") or r.data.get("turn_sequence")
                      for r in records if r.data.get("kind") in RESOLUTIONS)
    assert all(count == 1 for count in settled.values()), f"{context}: resolved twice: {settled}"
    kinds = {r.data["request"]: r.data["kind"] for r in records if "request" in r.data}
    for code, request_id, status in acked:
        if request_id == "-":
            assert status in ("applied", "-"), (context, code, status)  # direct, or refused
            continue
        TALLY.add(checked=1)
        if status == "applied":
            assert code == "0" and kinds.get(request_id) in RESOLUTIONS, (context, request_id)
        elif final or status != "queued":
            assert request_id in answers, f"{context}: acknowledged request {request_id} lost"
    left = sorted(p.name for p in (path / "requests").glob("*.req")) if final else []
    assert not left, f"{context}: request files left after a last open: {left}"
    if final:
        with walj.ToolJournal.open(path) as journal:
            replay = rebuild((r.seq, r.data) for r in walj.read(path)).snapshot()
            assert journal.recovery == replay, context


def test_sigkill_live_resolution(tmp_path: Path) -> None:
    run_trials(REQUEST_TRIALS, lambda trial: one_trial(tmp_path, trial))
