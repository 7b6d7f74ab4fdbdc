"""An operator's commands over many sessions: `walj report` and `walj audit` (export, then
`--verify`) against `walj sweep` of the same root, their baseline, in interleaved rounds.

    python benchmarks/bench_operator.py                   # 1,000 sessions, 3 rounds
    python benchmarks/bench_operator.py --sessions 10000 --rounds 5

The root is built as the sweep family builds its own (benchmarks/bench_sweep.py: a few turns of
no-op calls per session, one session in a hundred left blocked), in a child with fsync off.
Every command runs as a fresh process (`python -m walj ...`, interpreter start included), the
rounds alternate the four commands so that a shared machine's drift hits them alike, and each
figure is the median wall time over the rounds with its ratio to the sweep's median; the sizes
are those of the report page and of the export.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_sweep import _BUILD as BUILD
from bench_sweep import BLOCKED_EVERY


def _wall(cmd: list[str], ok: tuple[int, ...]) -> float:
    started = time.perf_counter()
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    seconds = time.perf_counter() - started
    if done.returncode not in ok:
        raise SystemExit(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr[-500:]!r}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="walj-operator-") as tmp:
        root, out = Path(tmp) / "root", Path(tmp)
        subprocess.run([sys.executable, "-c", BUILD, str(root), str(args.sessions),
                        str(BLOCKED_EVERY)], check=True, capture_output=True)
        walj = [sys.executable, "-m", "walj"]
        page, export = out / "report.html", out / "audit.jsonl"
        commands = {  # the sweep and report exit 1: the root holds blocked sessions
            "sweep": (walj + ["sweep", str(root), "--all", "--json"], (1,)),
            "report": (walj + ["report", str(root), "-o", str(page)], (1,)),
            "audit": (walj + ["audit", str(root), "-o", str(export)], (0,)),
            "audit --verify": (walj + ["audit", "--verify", str(export), str(root)], (0,)),
        }
        times: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.rounds):
            for name, (cmd, ok) in commands.items():
                times[name].append(_wall(cmd, ok))
        base = statistics.median(times["sweep"])
        print(f"{args.sessions} sessions, {args.rounds} interleaved rounds, median wall time")
        for name, samples in times.items():
            median = statistics.median(samples)
            print(f"  walj {name:<15} {median:7.2f} s   {median / base:5.2f}x the sweep")
        print(f"  report page {page.stat().st_size / 1e6:.2f} MB, "
              f"audit export {export.stat().st_size / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
