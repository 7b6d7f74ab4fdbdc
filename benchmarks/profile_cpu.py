"""Where the time goes: a sampling CPU profile of each workload behind a benchmark figure.

    python benchmarks/profile_cpu.py                       # every workload, 5 s each
    python benchmarks/profile_cpu.py --only dispatch,sessions-async-64 --seconds 10

Each workload runs in a child process of its own, for a fixed time, under py-spy (the `bench`
extra installs it). py-spy samples every thread of the child from outside, without pausing it,
so the asyncio loop, the sync pool's workers and group-commit followers are all seen, and the
child runs at full speed. Only samples of a thread that is on a CPU are counted: a thread
blocked in `fdatasync`, on a lock or on a queue is idle, so the profile is of CPU time, which is
what limits walj on two cores. Without py-spy, the child profiles itself with cProfile (its
main thread only), and the report says so.

Writes benchmarks/results/profile.md: per workload the ops/s reached while profiled, user+system
CPU per op (os.times() in the child), the CPU time by source file, and the hottest functions.
Figures here are for reading, not for the README's table: benchmarks/run.py measures those.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_core import import_walj, make_record  # noqa: E402

OPEN_RECORDS = 300_000  # the read and open workloads' log size; --records sets another


def _noop(**_kwargs: Any) -> None:
    return None


async def _anoop(**_kwargs: Any) -> None:
    return None


# --- workloads: each runs for `seconds` and returns how many operations it did ---------------


def _loop(seconds: float, op: Callable[[int], object]) -> int:
    deadline, i = time.perf_counter() + seconds, 0
    while True:
        for _ in range(64):
            op(i)
            i += 1
        if time.perf_counter() >= deadline:
            return i


def append(sync: str) -> Callable[[Path, float], int]:
    def run(d: Path, seconds: float) -> int:
        walj = import_walj()
        assert walj is not None
        with walj.Log.open(d / "log", sync=sync) as log:
            return _loop(seconds, lambda i: log.append(make_record(i)))
    return run


def _in_threads(n: int, work: Callable[[int], int]) -> int:
    """Run work(0) ... work(n - 1) in a thread each; the sum of what they return."""
    counts = [0] * n

    def worker(k: int) -> None:
        counts[k] = work(k)
    pool = [threading.Thread(target=worker, args=(k,)) for k in range(n)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return sum(counts)


def group(threads: int) -> Callable[[Path, float], int]:
    def run(d: Path, seconds: float) -> int:
        walj = import_walj()
        assert walj is not None
        with walj.Log.open(d / "log", sync="batch") as log:
            return _in_threads(threads, lambda _k: _loop(
                seconds, lambda i: log.append(make_record(i))))
    return run


def dispatch(d: Path, seconds: float) -> int:
    walj = import_walj()
    assert walj is not None
    with walj.ToolJournal.open(d / "j", tools={"noop": _noop}, sync="always") as journal:
        with journal.turn() as turn:
            return _loop(seconds, lambda i: turn.dispatch("noop", {"x": i}))


def sessions_threads(n: int) -> Callable[[Path, float], int]:
    def run(d: Path, seconds: float) -> int:
        walj = import_walj()
        assert walj is not None

        def session(k: int) -> int:
            with walj.ToolJournal.open(d / f"s{k}", tools={"noop": _noop},
                                       sync="always") as journal, journal.turn() as turn:
                return _loop(seconds, lambda i: turn.dispatch("noop", {"x": i}))
        return _in_threads(n, session)
    return run


def sessions_async(n: int) -> Callable[[Path, float], int]:
    def run(d: Path, seconds: float) -> int:
        walj = import_walj()
        assert walj is not None
        journals = [walj.ToolJournal.open(d / f"s{k}", tools={"noop": _anoop}, sync="always")
                    for k in range(n)]
        counts = [0] * n

        async def session(k: int, deadline: float) -> None:
            async with journals[k].turn() as turn:
                i = 0
                while time.perf_counter() < deadline:
                    await turn.adispatch("noop", {"x": i})
                    i += 1
                counts[k] = i

        async def main() -> None:
            deadline = time.perf_counter() + seconds
            await asyncio.gather(*(session(k, deadline) for k in range(n)))

        try:
            asyncio.run(main())
        finally:
            for journal in journals:
                journal.close()
        return sum(counts)
    return run


def _records() -> int:
    return int(os.environ.get("WALJ_PROFILE_RECORDS", OPEN_RECORDS))


def read(d: Path, seconds: float) -> int:
    walj = import_walj()
    assert walj is not None
    path, n = d / "fixture-log", 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        for _record in walj.read(path):
            n += 1
    return n


def journal_open(d: Path, seconds: float) -> int:
    walj = import_walj()
    assert walj is not None
    path, n = d / "fixture-journal", 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        walj.ToolJournal.open(path, tools={"noop": _noop}).close()
        n += int((path / "count").read_text())
    return n


WORKLOADS: dict[str, tuple[str, Callable[[Path, float], int]]] = {
    "append-never": ("unsynced append, sync='never' (records)", append("never")),
    "append-always": ("durable append, sync='always' (records)", append("always")),
    "group-8": ("group commit, 8 threads, sync='batch' (records)", group(8)),
    "dispatch": ("durable no-op dispatch, 1 session, sync (calls)", dispatch),
    "sessions-threads-64": ("64 sessions, a thread each, dispatch (calls)", sessions_threads(64)),
    "sessions-async-64": ("64 sessions, one asyncio loop, adispatch (calls)", sessions_async(64)),
    "read": ("walj.read of the whole fixture log (records)", read),
    "journal-open": ("ToolJournal.open of the fixture journal (records)", journal_open),
}


def build_fixtures(d: Path) -> None:
    """The read and open workloads' logs, built unprofiled, fsync off in this process only."""
    os.fsync = lambda fd: None
    if hasattr(os, "fdatasync"):
        os.fdatasync = lambda fd: None
    walj = import_walj()
    assert walj is not None
    records = _records()
    with walj.Log.open(d / "fixture-log", sync="never") as log:
        for start in range(0, records, 10_000):
            log.append_many([make_record(i) for i in range(start, min(records, start + 10_000))])
    path = d / "fixture-journal"
    with walj.ToolJournal.open(path, tools={"noop": _noop}, sync="never") as journal:
        for t in range(max(1, records // 22)):  # a turn of ten calls writes 22 records
            with journal.turn() as turn:
                for k in range(10):
                    turn.dispatch("noop", {"turn": t, "k": k, "q": "x" * 64})
    (path / "count").write_text(str(sum(1 for _ in walj.read(path))))


# --- the child: run one workload, report ops and CPU ------------------------------------------


def child(name: str, d: Path, seconds: float, cprofile_out: str | None) -> None:
    run = WORKLOADS[name][1]
    scratch = Path(tempfile.mkdtemp(dir=d))
    for fixture in ("fixture-log", "fixture-journal"):
        if (d / fixture).exists():
            (scratch / fixture).symlink_to(d / fixture)
    profiler = cProfile.Profile() if cprofile_out else None
    t0, c0 = time.perf_counter(), os.times()
    if profiler is not None:
        profiler.enable()
    ops = run(scratch, seconds)
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(cprofile_out)
    t1, c1 = time.perf_counter(), os.times()
    cpu = (c1.user - c0.user) + (c1.system - c0.system)
    print(json.dumps({"ops": ops, "seconds": t1 - t0, "cpu": cpu,
                      "user": c1.user - c0.user, "system": c1.system - c0.system}))


# --- the parent: run each child under py-spy, fold its samples --------------------------------


def _frame_parts(frame: str) -> tuple[str, str]:
    """(function, file) of one py-spy raw frame, `function (path:line)`."""
    name, _, rest = frame.partition(" (")
    path = rest.rsplit(":", 1)[0] if rest else "?"
    return name, path


def _short(path: str) -> str:
    if path.startswith(("walj/", "benchmarks/")):
        return path
    for marker in ("/walj/", "/benchmarks/"):
        if marker in path:
            return path[path.rindex(marker) + 1:]
    if "site-packages/" in path:
        return path.split("site-packages/", 1)[1]
    if "/lib/python" in path:
        return "stdlib/" + path.rsplit("/", 1)[-1]
    return path.rsplit("/", 1)[-1]


def fold(raw: Path) -> tuple[int, Counter[str], Counter[str]]:
    """Total samples, self samples by source file, self samples by function."""
    total, by_file, by_function = 0, Counter[str](), Counter[str]()
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [f for f in stack.split(";") if f and not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        name, path = _frame_parts(frames[-1])
        total += count
        by_file[_short(path)] += count
        by_function[f"{name} ({_short(path)})"] += count
    return total, by_file, by_function


def profile_one(name: str, d: Path, seconds: float, rate: int,
                spy: str | None) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", name, "--dir", str(d),
           "--seconds", str(seconds)]
    raw = d / f"{name}.raw"
    stats = d / f"{name}.pstats"
    if spy:
        # --nonblocking: pausing the child at each sample (py-spy's default) lands the samples
        # on system-call boundaries and credits `os.write` with most of the time.
        cmd = [spy, "record", "--nonblocking", "--format", "raw", "--rate", str(rate),
               "--output", str(raw), "--"] + cmd
    else:
        cmd += ["--cprofile", str(stats)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    result = json.loads([ln for ln in out.stdout.splitlines() if ln.startswith("{")][-1])
    if spy:
        total, by_file, by_function = fold(raw)
        result["tool"] = f"py-spy, {rate} samples/s of every thread on a CPU"
    else:
        st = pstats.Stats(str(stats))
        by_file, by_function = Counter[str](), Counter[str]()
        for (path, _line, func), row in st.stats.items():  # type: ignore[attr-defined]
            us = int(row[2] * 1e6)  # tottime
            source = "C built-ins" if path == "~" else _short(path)
            by_file[source] += us
            by_function[f"{func} ({source})"] += us
        total = sum(by_file.values())
        result["tool"] = "cProfile, main thread only (py-spy not installed)"
    result.update(total=total, by_file=by_file.most_common(12),
                  by_function=by_function.most_common(15))
    return result


def report(results: dict[str, dict[str, Any]], seconds: float) -> str:
    lines = ["# Where the time goes", "",
             "Generated by `python benchmarks/profile_cpu.py` "
             f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {seconds:g} s a workload, "
             f"CPython {sys.version.split()[0]}, {os.cpu_count()} cores, fixture logs of "
             f"{_records():,} records). Shares are of the CPU "
             "samples of the whole process (every thread on a CPU); a thread waiting in "
             "`fdatasync`, on a lock or a queue is not sampled. Read it beside the benchmark "
             "table: these runs are profiled, so their rates are not the published figures.", ""]
    for name, r in results.items():
        ops = max(1, r["ops"])
        lines += [f"## {name}: {WORKLOADS[name][0]}", "",
                  f"{r['ops'] / r['seconds']:,.0f} ops/s while profiled; "
                  f"{r['cpu'] / ops * 1e6:,.1f} µs of CPU per op "
                  f"({r['user'] / ops * 1e6:,.1f} user + {r['system'] / ops * 1e6:,.1f} system); "
                  f"{r['tool']}.", "", "| source file | share of CPU |", "|---|---|"]
        total = max(1, r["total"])
        lines += [f"| `{f}` | {c / total:.0%} |" for f, c in r["by_file"]]
        lines += ["", "| hottest functions (self) | share of CPU |", "|---|---|"]
        lines += [f"| `{f}` | {c / total:.1%} |" for f, c in r["by_function"]]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="comma-separated workloads: " + ", ".join(WORKLOADS))
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--records", type=int, default=OPEN_RECORDS,
                        help="size of the read and open workloads' logs")
    parser.add_argument("--dir", type=Path, help="where scratch logs go (default: temp dir)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "profile.md")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--cprofile", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.dir, args.seconds, args.cprofile)
        return 0
    names = args.only.split(",") if args.only else list(WORKLOADS)
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload(s): {', '.join(unknown)}")
    if args.records < 1:
        parser.error("--records must be at least 1")
    os.environ["WALJ_PROFILE_RECORDS"] = str(args.records)  # the children read it
    spy = shutil.which("py-spy")
    root = Path(tempfile.mkdtemp(prefix="walj-profile-", dir=args.dir))
    try:
        if {"read", "journal-open"} & set(names):
            print("building the read and open fixtures ...", flush=True)
            _build_in_child(root)
        results = {}
        for name in names:
            print(f"profiling {name} ...", flush=True)
            results[name] = profile_one(name, root, args.seconds, args.rate, spy)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report(results, args.seconds))
        print(f"wrote {args.out}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


def _build_in_child(root: Path) -> None:
    # Its own process, so that switching fsync off never reaches a profiled workload.
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from pathlib import Path; "
            "import profile_cpu as p; p.build_fixtures(Path(sys.argv[2]))")
    subprocess.run([sys.executable, "-c", code, str(HERE), str(root)], check=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
