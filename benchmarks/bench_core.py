"""Shared benchmark plumbing: configuration, samples, interleaved repetitions, rows, machine."""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import sys
import time
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent


def import_walj() -> ModuleType | None:
    """Import walj: the installed package, else the checkout this harness lives in."""
    try:
        import walj
    except ImportError:
        if not (REPO_ROOT / "walj" / "__init__.py").exists():
            return None
        sys.path.insert(0, str(REPO_ROOT))
        try:
            import walj
        except ImportError:
            return None
    return walj


def child_env(walj_mod: ModuleType | None) -> dict[str, str]:
    """Environment for child processes, so they import the same walj as this process."""
    env = dict(os.environ)
    if walj_mod is not None and getattr(walj_mod, "__file__", None):
        root = str(Path(str(walj_mod.__file__)).resolve().parent.parent)
        old = env.get("PYTHONPATH")
        env["PYTHONPATH"] = root if not old else root + os.pathsep + old
    return env


# --- the ~200-byte record every system stores -------------------------------------------------

_ARGS = {"query": "release notes for the walj write-ahead log, version 0.1", "limit": 10}


def make_record(i: int) -> dict[str, Any]:
    """The payload: a small tool-call record whose JSON is about 200 bytes."""
    return {
        "kind": "tool_execution_started",
        "tool": "web_search",
        "call_id": f"call_{i:010d}",
        "turn": i // 8,
        "arguments": _ARGS,
        "ts": 1700000000.0 + i / 1000.0,
    }


# --- configuration ------------------------------------------------------------------------------


@dataclass
class Config:
    quick: bool
    scale: float
    reps: int
    proc_reps: int  # repetitions of the figures that start a process each time
    duration: float  # seconds per repetition of a throughput series
    threads: list[int]
    open_sizes: list[int]
    workdir: Path
    out: Path
    plots: bool
    zipapp: Path | None
    keep: bool = False
    command: str = ""
    sessions: list[int] = field(default_factory=list)  # session counts; empty: the mode's


def mode_defaults(quick: bool, scale: float, reps: int | None) -> tuple[int, int, float, list[int]]:
    """Repetitions (in-process, child-process), seconds per repetition, open sizes."""
    base_sizes = [2_000, 10_000, 50_000] if quick else [10_000, 100_000, 1_000_000]
    sizes = [max(100, int(n * scale)) for n in base_sizes]
    duration = max(0.02, (0.15 if quick else 1.0) * scale)
    if reps:
        return reps, reps, duration, sizes
    return (5, 3, duration, sizes) if quick else (7, 5, duration, sizes)


# --- samples and series -------------------------------------------------------------------------


@dataclass
class Sample:
    """One repetition of one series."""

    value: float  # ops/s for rates, seconds for times, bytes for memory
    ops: int = 0
    seconds: float = 0.0
    p50_us: float | None = None
    p99_us: float | None = None
    sketch_us: list[float] = field(default_factory=list)  # latency quantiles, for plots
    extra: dict[str, float] = field(default_factory=dict)


class Skip(Exception):
    """A series cannot run here (walj part not written yet, zipapp not built, ...)."""


@dataclass
class Series:
    name: str
    unit: str
    samples: list[Sample] = field(default_factory=list)
    skipped: str | None = None
    error: str | None = None

    def median(self) -> float | None:
        if self.skipped or self.error or not self.samples:
            return None
        return statistics.median(s.value for s in self.samples)

    def median_of(self, attr: str) -> float | None:
        vals = [getattr(s, attr) for s in self.samples if getattr(s, attr) is not None]
        if self.skipped or self.error or not vals:
            return None
        return float(statistics.median(vals))

    def extra_median(self, key: str) -> float | None:
        vals = [s.extra[key] for s in self.samples if key in s.extra]
        if self.skipped or self.error or not vals:
            return None
        return float(statistics.median(vals))

    @property
    def status(self) -> str | None:
        """None when measured, else 'skipped: ...' or 'error: ...'."""
        if self.skipped:
            return f"skipped: {self.skipped}"
        if self.error:
            return f"error: {self.error}"
        return None


Measure = Callable[[Path], Sample]


@contextlib.contextmanager
def scratch(parent: Path, name: str) -> Iterator[Path]:
    """A fresh directory for one repetition, removed afterwards."""
    path = parent / name
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def interleave(
    measures: dict[str, tuple[str, Measure | str]],
    reps: int,
    workdir: Path,
    log: Callable[[str], None],
) -> dict[str, Series]:
    """Run every series `reps` times, rotating the order each round so drift hits all of them.

    `measures` maps a series name to (unit, measure); a str in place of the measure is a skip
    reason. A series that raises is recorded as an error and not run again.
    """
    out: dict[str, Series] = {}
    live: list[str] = []
    for name, (unit, fn) in measures.items():
        out[name] = Series(name, unit)
        if isinstance(fn, str):
            out[name].skipped = fn
        else:
            live.append(name)
    for rep in range(reps):
        k = rep % len(live) if live else 0
        for name in live[k:] + live[:k]:
            series = out[name]
            if series.error or series.skipped:
                continue
            fn = measures[name][1]
            assert not isinstance(fn, str)
            try:
                with scratch(workdir, f"rep-{name}") as d:
                    series.samples.append(fn(d))
            except Skip as exc:
                series.skipped = str(exc)
            except Exception as exc:  # noqa: BLE001 - one broken series must not stop the run
                series.error = f"{type(exc).__name__}: {exc}"
                log(f"  {name}: {series.error}")
        log(f"  round {rep + 1}/{reps} done")
    return out


def timed_loop(op: Callable[[int], object], duration: float, latencies: bool = True) -> Sample:
    """Call op(0), op(1), ... until `duration` seconds pass; rate and per-op latency."""
    pc = time.perf_counter_ns
    lat = array("q")
    push = lat.append
    start = t = pc()
    deadline = start + int(duration * 1e9)
    n = 0
    while t < deadline:
        op(n)
        t2 = pc()
        push(t2 - t)
        t = t2
        n += 1
    elapsed = (t - start) / 1e9
    sample = Sample(value=n / elapsed, ops=n, seconds=elapsed)
    if latencies and n:
        srt = sorted(lat)
        sample.p50_us = quantile(srt, 0.50) / 1e3
        sample.p99_us = quantile(srt, 0.99) / 1e3
        sample.sketch_us = [quantile(srt, q / 400) / 1e3 for q in range(401)]
    return sample


def quantile(sorted_vals: Any, q: float) -> float:
    """Nearest-rank quantile of an already sorted sequence."""
    if not len(sorted_vals):
        return float("nan")
    idx = min(len(sorted_vals) - 1, max(0, round(q * (len(sorted_vals) - 1))))
    return float(sorted_vals[idx])


# --- report rows -------------------------------------------------------------------------------


@dataclass
class Target:
    kind: str  # "ratio" (ratio >= x), "min" (walj value >= x), "max" (walj value <= x)
    threshold: float
    label: str

    def met(self, walj_value: float | None, ratio: float | None) -> bool | None:
        value = ratio if self.kind == "ratio" else walj_value
        if value is None:
            return None
        return value <= self.threshold if self.kind == "max" else value >= self.threshold


@dataclass
class Row:
    """One published figure: walj's median, its same-run baseline's median, and their ratio."""

    id: str
    figure: str  # what is measured, shortly: "durable append, sync=always"
    unit: str  # "rec/s", "calls/s", "us", "s", "MB"
    walj: float | None
    base: float | None
    ratio: float | None
    targets: list[Target] = field(default_factory=list)
    status: str | None = None  # "skipped: ..." or "error: ..."
    base_status: str | None = None
    measures: str = ""  # one clause: the work walj's side does per operation
    baseline: str = ""  # one clause: what the baseline is, or why there is none
    round_ratios: list[float] = field(default_factory=list)  # the ratio in each round
    extra: dict[str, float] = field(default_factory=dict)  # counted figures (records per fsync)

    def target_results(self) -> list[bool | None]:
        if self.status:
            return [None for _ in self.targets]
        return [t.met(self.walj, self.ratio) for t in self.targets]

    @property
    def met(self) -> str:
        results = self.target_results()
        if not results or any(r is None for r in results):
            return "—"
        return "yes" if all(results) else "no"


def _value(sample: Sample, attr: str) -> float | None:
    v = sample.value if attr == "value" else getattr(sample, attr)
    return None if v is None else float(v)


def round_ratios(
    walj: Series, base: Series, attr: str, base_scale: float, lower_is_better: bool
) -> list[float]:
    """The ratio in each interleaved round (the i-th sample of each series ran in round i)."""
    if walj.status or base.status or len(walj.samples) != len(base.samples):
        return []
    out = []
    for ws, bs in zip(walj.samples, base.samples, strict=True):
        w, b = _value(ws, attr), _value(bs, attr)
        if w is None or b is None or w <= 0 or b <= 0:
            return []
        b *= base_scale
        out.append(b / w if lower_is_better else w / b)
    return out


def speed_row(
    row_id: str,
    figure: str,
    walj: Series,
    base: Series | None,
    *,
    measures: str = "",
    baseline: str = "",
    attr: str = "value",
    base_scale: float = 1.0,
    targets: list[Target] | None = None,
    lower_is_better: bool = False,
    unit: str | None = None,
    convert: float = 1.0,
) -> Row:
    """A row comparing two series; ratio > 1 always means walj is better."""
    w = walj.median() if attr == "value" else walj.median_of(attr)
    b = None
    if base is not None:
        b = base.median() if attr == "value" else base.median_of(attr)
    if b is not None:
        b *= base_scale
    if w is not None:
        w *= convert
    if b is not None:
        b *= convert
    ratio = None
    if w is not None and b is not None and w > 0 and b > 0:
        ratio = b / w if lower_is_better else w / b
    return Row(
        id=row_id,
        figure=figure,
        unit=unit or walj.unit,
        walj=w,
        base=b,
        ratio=ratio,
        targets=targets or [],
        status=walj.status,
        base_status=base.status if base is not None else None,
        measures=measures,
        baseline=baseline,
        round_ratios=(
            round_ratios(walj, base, attr, base_scale, lower_is_better) if base else []
        ),
    )
