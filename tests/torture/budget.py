"""The torture suite's one knob, its one seed, and the figures it reports.

WALJ_TORTURE=N runs N SIGKILL trials (default DEFAULT_TRIALS: about two minutes for the whole
suite on two cores); every other randomised family scales with N / DEFAULT_TRIALS.
WALJ_SEED=S seeds every random choice; without it a fresh seed is drawn and printed.
"""

from __future__ import annotations

import os
import random
import threading
from collections import Counter

DEFAULT_TRIALS = 200

TRIALS = int(os.environ.get("WALJ_TORTURE") or DEFAULT_TRIALS)
if TRIALS < 1:
    raise ValueError("WALJ_TORTURE must be a positive number of trials")
SCALE = TRIALS / DEFAULT_TRIALS

_seed = os.environ.get("WALJ_SEED")
SEED = int(_seed) if _seed else random.SystemRandom().randrange(2**32)


def scaled(n: int, minimum: int = 1) -> int:
    """`n` at the default budget, scaled by WALJ_TORTURE."""
    return max(minimum, round(n * SCALE))


def rng_for(name: str) -> random.Random:
    """A generator for one test or trial, derived from the suite seed and a stable name."""
    return random.Random(f"{SEED}:{name}")


def reproduce_hint() -> str:
    return f"reproduce with WALJ_SEED={SEED} WALJ_TORTURE={TRIALS}"


class Tally:
    """Counters every torture test adds to; printed (and written) at the end of the run."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()

    def add(self, **counts: int) -> None:
        with self._lock:
            self.counts.update(counts)

    def __getitem__(self, key: str) -> int:
        return self.counts[key]

    def summary(self) -> dict[str, int]:
        c = self.counts
        trials = sum(v for k, v in c.items() if k.startswith("trials_"))
        headline = {"faults", "checked", "lost"}
        return {
            "seed": SEED,
            "knob": TRIALS,
            "trials": trials,
            **{k: v for k, v in sorted(c.items()) if k not in headline},
            "faults_injected": c["faults"],
            "records_checked": c["checked"],
            "records_lost": c["lost"],
        }


TALLY = Tally()
