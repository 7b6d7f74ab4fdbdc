"""The fault-injecting file layer, through the log's I/O seam: power cuts that drop, tear,
reorder or zero unsynced writes; EIO on write, fsync, rename and directory fsync; ENOSPC; short
writes. For each: acknowledged data survives, the handle is poisoned where the contract says so,
and a reopen recovers."""

from __future__ import annotations

import errno
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from budget import TALLY, rng_for, scaled
from faultfs import FaultyFS, abandon
from powercut import FAIL_OPS, POWER_CUTS, Oracle, Plan, make_record, random_plan, run_life

import walj

MODES = ("always", "batch", "interval", "never")
LIVES = 4
LIVENESS_SECONDS = 60.0  # a bound on a hang, not a speed: the syncer needs milliseconds

pytestmark = pytest.mark.usefixtures("thread_failures")


def test_random_faults_over_many_lives(tmp_path: Path) -> None:
    """Each trial: one log, several lives, each meeting a random fault (or none)."""
    for trial in range(scaled(120)):
        rng = rng_for(f"faults-random-{trial}")
        sync = MODES[trial % len(MODES)]
        path = tmp_path / f"log{trial}"
        oracle = Oracle()
        for life in range(1, LIVES + 1):
            plan = random_plan(rng)
            outcome = run_life(path, oracle, life, rng, sync, plan,
                               segment_bytes=rng.choice([1024, 2048, 8192]))
            oracle.check(path, f"trial {trial} life {life} ({sync}): {plan.describe()}, "
                               f"power cut {plan.power_cut} -> {outcome}")
        TALLY.add(trials_faults=1)


FAULTS = [f"power cut: {m}" for m in POWER_CUTS] + [
    f"{name} on {op}" for name in ("EIO", "ENOSPC") for op in FAIL_OPS] + [
    "short write", "short write, then ENOSPC"]


@pytest.mark.parametrize("sync", MODES)
@pytest.mark.parametrize("fault", FAULTS)
def test_each_fault(tmp_path: Path, fault: str, sync: str) -> None:
    fired = 0
    outcomes: list[str] = []
    for trial in range(scaled(6, minimum=2)):
        rng = rng_for(f"faults-{fault}-{sync}-{trial}")
        path = tmp_path / f"log{trial}"
        oracle = Oracle()
        for life in range(1, 3):
            if fault.startswith("power cut"):
                plan = Plan("crash", "any", rng.randint(1, 100), rng.random() < 0.5,
                            power_cut=fault.split(": ")[1])
            elif fault == "short write":
                plan = Plan("short", nth=rng.randint(0, 20))
            elif fault == "short write, then ENOSPC":
                plan = Plan("short then fail", nth=rng.randint(0, 20), err=errno.ENOSPC)
            else:
                name, op = fault.split(" on ")
                nth = rng.randint(1, 30) if op in ("write", "sync") else rng.randint(1, 2)
                plan = Plan("fail", op, nth, err=getattr(errno, name))
            outcome = run_life(path, oracle, life, rng, sync, plan)
            outcomes.append(outcome)
            # A short write is completed, so the life may end clean: proof is the injection.
            fired += outcome != "clean" or any(f.startswith("short write") for f in plan.injected)
            oracle.check(path, f"{fault}, {sync}, trial {trial} life {life}: "
                               f"{plan.describe()} -> {outcome}")
        TALLY.add(trials_faults=1)
    assert fired, f"the fault never fired: {outcomes}"


def wait_for(done: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + LIVENESS_SECONDS
    while not done():
        assert time.monotonic() < deadline, f"{what} after {LIVENESS_SECONDS:.0f} s"
        time.sleep(0.001)


def test_interval_mode_loses_at_most_what_came_after_the_last_sync(tmp_path: Path) -> None:
    """sync="interval" with its real background syncer, through the fault-injecting file
    system. The workload appends and calls nothing else: no sync(), no durable=True, no close.
    The syncer alone must make every record durable (polled on durable_seq). Then more appends,
    and the process dies at a random moment while the syncer runs; a power cut follows. Every
    record the log reported durable (durable_seq once no thread can move it) is there, and the
    only records lost are some of those appended after it."""
    for trial in range(scaled(12, minimum=4)):
        rng = rng_for(f"interval-window-{trial}")
        cut = POWER_CUTS[trial % len(POWER_CUTS)]
        path = tmp_path / f"log{trial}"
        fs = FaultyFS(freeze_on_crash=True)
        log = walj.Log.open(path, sync="interval", sync_interval_ms=rng.choice([1, 5, 20]),
                            segment_bytes=rng.choice([1024, 4096, 65536]), _fs=fs)
        oracle = Oracle()
        k = 0
        for _ in range(rng.randint(10, 60)):
            oracle.written[log.append(make_record(1, k, rng))] = (1, k)
            k += 1
        wait_for(lambda log=log, k=k: log.durable_seq == k,  # type: ignore[misc]
                 f"trial {trial}: the interval syncer never covered the {k} records appended")
        first = k
        for _ in range(rng.randint(0, 40)):  # appends racing the syncer
            oracle.written[log.append(make_record(1, k, rng))] = (1, k)
            k += 1
            if rng.random() < 0.3:
                time.sleep(rng.uniform(0, 0.004))  # varies where the syncer lands, no more
        fs.dead = True  # the process dies: from here every call of every thread fails
        syncer = log._syncer
        log._stop.set()
        assert syncer is not None
        syncer.join(LIVENESS_SECONDS)
        assert not syncer.is_alive(), "the syncer did not stop"
        reported = log.durable_seq
        assert first <= reported <= k
        oracle.durable.update(range(1, reported + 1))
        fs.crash(cut, rng)
        abandon(log)
        held = oracle.check(path, f"trial {trial}, power cut {cut}: durable_seq {reported} of "
                                  f"{k} appended")
        assert reported <= held <= k
        TALLY.add(trials_faults=1, faults=2)
