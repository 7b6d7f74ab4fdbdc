"""The fault-injecting file layer, through the log's I/O seam: power cuts that drop, tear,
reorder or zero unsynced writes; EIO on write, fsync, rename and directory fsync; ENOSPC; short
writes. For each: acknowledged data survives, the handle is poisoned where the contract says so,
and a reopen recovers."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from budget import TALLY, rng_for, scaled
from powercut import FAIL_OPS, POWER_CUTS, Oracle, Plan, random_plan, run_life

MODES = ("always", "batch", "interval", "never")
LIVES = 4

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
