"""System calls per durable dispatch, counted by `strace -f -c` around a child process.

Each count is the difference of two children under strace, one making N calls and one making
none, so the interpreter's start, the imports and the journal's open and close cancel out.
Every thread is followed (-f): syncs a commit service makes on its own threads are counted.

    python benchmarks/bench_syscalls.py walj|raw DIR N    # the child: N calls, then exit
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench_core import Measure, Sample

BENCH = Path(__file__).resolve().parent
GROUPS = {  # extras published per call: the syscalls that make up each
    "fdatasync": ("fdatasync",),
    "fsync": ("fsync",),
    "syncfs": ("syncfs",),
    "write": ("write", "writev"),
    "pwrite": ("pwrite64", "pwritev", "pwritev2"),
    "futex": ("futex",),
}


def parse_summary(text: str) -> dict[str, int]:
    """Calls per system call from strace -c's table ("% time seconds usecs/call calls
    [errors] syscall"); the total line and the rules are left out."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 5 or parts[-1] == "total" or not parts[3].isdigit():
            continue
        try:
            float(parts[0])
        except ValueError:
            continue
        out[parts[-1]] = out.get(parts[-1], 0) + int(parts[3])
    return out


def strace_counts(kind: str, d: Path, n: int, env: dict[str, str]) -> dict[str, int]:
    """The syscalls of one child making n calls, every thread followed."""
    out = d / f"strace-{kind}-{n}.txt"
    cmd = ["strace", "-f", "-c", "-o", str(out), sys.executable, str(Path(__file__).resolve()),
           kind, str(d / f"{kind}-{n}"), str(n)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"strace child {kind} failed: {proc.stderr[-500:]}")
    return parse_summary(out.read_text(encoding="utf-8"))


def per_call(kind: str, d: Path, n: int, env: dict[str, str],
             without: dict[str, int] | None = None) -> dict[str, float]:
    """Syscalls per call of `kind`: (counts of n calls - counts of none) / n, in total and
    by GROUPS. `without`: the counts of none, when already taken."""
    with_calls = strace_counts(kind, d, n, env)
    if without is None:
        without = strace_counts(kind, d, 0, env)
    names = set(with_calls) | set(without)
    diff = {k: with_calls.get(k, 0) - without.get(k, 0) for k in names}
    out = {"syscalls": sum(diff.values()) / n}
    for group, members in GROUPS.items():
        out[group] = sum(diff.get(m, 0) for m in members) / n
    return out


def measure_per_call(kind: str, n: int, env: dict[str, str]) -> Measure:
    """A series of syscalls per call (lower is better), its groups in the sample's extras.
    The child making no calls runs in the first round only: its count barely varies."""
    without: list[dict[str, int]] = []

    def measure(d: Path) -> Sample:
        start = time.perf_counter()
        if not without:
            without.append(strace_counts(kind, d, 0, env))
        counts = per_call(kind, d, n, env, without[0])
        sample = Sample(value=counts.pop("syscalls"), ops=n,
                        seconds=time.perf_counter() - start)
        sample.extra.update({f"{k}_per_call": v for k, v in counts.items()})
        return sample

    return measure


def strace_missing() -> str | None:
    if shutil.which("strace") is None:
        return "strace is not installed"
    if not sys.platform.startswith("linux"):
        return "strace counts are taken on Linux only"
    return None


# --- the child -----------------------------------------------------------------------------


def _noop(**_kwargs: Any) -> None:
    return None


def child_walj(path: Path, n: int) -> None:
    import walj

    with walj.ToolJournal.open(path, tools={"noop": _noop}, sync="always") as journal:
        with journal.turn() as turn:
            for i in range(n):
                turn.dispatch("noop", {"x": i})


def child_raw(path: Path, n: int) -> None:
    from bench_baselines import RAW_LINE, _datasync

    path.mkdir(parents=True, exist_ok=True)
    sync = _datasync()
    fd = os.open(path / "raw.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for _ in range(2 * n):  # a dispatch's two durable records
            os.write(fd, RAW_LINE)
            sync(fd)
    finally:
        os.close(fd)


def main(argv: list[str]) -> int:
    kind, path, n = argv[0], Path(argv[1]), int(argv[2])
    sys.path.insert(0, str(BENCH))
    {"walj": child_walj, "raw": child_raw}[kind](path, n)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
