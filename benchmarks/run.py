"""Benchmark harness entry point: walj against SQLite, JSONL and the fsync limit, in one run.

    python benchmarks/run.py            # everything (several minutes; 1M-record logs)
    python benchmarks/run.py --quick    # under a minute
    python benchmarks/run.py --only group --quick

Writes benchmarks/results/latest.md, latest.json and PNG plots (when matplotlib is installed);
`python benchmarks/readme_table.py` then rewrites the README's figures from latest.json.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_open  # noqa: E402
import bench_report  # noqa: E402
import bench_walj  # noqa: E402
from bench_baselines import CODEC  # noqa: E402
from bench_core import (  # noqa: E402
    BENCH_DIR,
    REPO_ROOT,
    Config,
    Row,
    Series,
    import_walj,
    mode_defaults,
)
from bench_figures import ALIASES, GROUPS, Say, run_group  # noqa: E402
from bench_machine import filesystem_of, machine_line, same_device  # noqa: E402


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="short run (under a minute)")
    p.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="multiply durations and open sizes (e.g. 0.05 for a smoke test)",
    )
    p.add_argument(
        "--reps",
        type=int,
        default=0,
        help="repetitions per series (quick: 5, or 3 for open/zipapp; full: 7 and 5)",
    )
    p.add_argument(
        "--only",
        action="append",
        default=[],
        help=f"run only these figures: {', '.join(GROUPS + list(ALIASES))}",
    )
    p.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="parent of the scratch directory (default: the system temp dir); "
        "put it on the disk you want measured",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=BENCH_DIR / "results",
        help="where latest.md, latest.json and the plots go",
    )
    p.add_argument(
        "--zipapp",
        type=Path,
        default=None,
        help="path of walj-forensic.pyz (default: look in the checkout)",
    )
    p.add_argument("--threads", default="1,2,4,8,16", help="thread counts for group commit")
    p.add_argument(
        "--sessions",
        default="",
        help="session counts for the sessions figure (quick: 1,8,64; full: 1,8,64,256,1024)",
    )
    p.add_argument("--sizes", default="", help="open sizes, comma separated (overrides the mode)")
    p.add_argument("--no-plots", action="store_true", help="write tables only")
    p.add_argument("--keep", action="store_true", help="keep the scratch directory")
    return p.parse_args(argv)


def shown_command(argv: list[str]) -> str:
    """The command line, with machine-specific paths replaced by placeholders."""
    out, hide = ["python", "benchmarks/run.py"], False
    for a in argv:
        if hide:
            out.append("PATH")
            hide = False
            continue
        if a in ("--dir", "--out", "--zipapp"):
            hide = True
        elif any(a.startswith(f"{o}=") for o in ("--dir", "--out", "--zipapp")):
            a = a.split("=", 1)[0] + "=PATH"
        out.append(a)
    return " ".join(out)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    groups = []
    for name in args.only or GROUPS:
        for part in name.split(","):
            g = ALIASES.get(part.strip(), part.strip())
            if g not in GROUPS:
                print(f"unknown figure {part!r}; choose from {', '.join(GROUPS)}", file=sys.stderr)
                return 2
            if g not in groups:
                groups.append(g)
    reps, proc_reps, duration, sizes = mode_defaults(args.quick, args.scale, args.reps)
    if args.sizes:
        sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="walj-bench-", dir=args.dir))
    cfg = Config(
        quick=args.quick,
        scale=args.scale,
        reps=reps,
        proc_reps=proc_reps,
        duration=duration,
        threads=[int(x) for x in args.threads.split(",")],
        open_sizes=sizes,
        workdir=workdir,
        out=args.out,
        plots=not args.no_plots,
        zipapp=args.zipapp,
        keep=args.keep,
        command=shown_command(argv),
        sessions=[int(x) for x in args.sessions.split(",") if x.strip()],
    )

    def say(msg: str) -> None:
        print(msg, flush=True)

    walj = import_walj()
    fs = filesystem_of(workdir)
    dev = same_device(workdir, REPO_ROOT)
    say(
        f"scratch dir: {workdir} ({fs}; same device as the checkout: "
        f"{'unknown' if dev is None else 'yes' if dev else 'NO'})"
    )
    if fs in ("tmpfs", "ramfs"):
        say(f"WARNING: the scratch dir is on {fs}, where fsync costs nothing; use --dir on a disk")
    say(
        f"walj: {getattr(walj, '__version__', 'not importable')}; "
        f"log: {bench_walj.log_missing(walj) or 'yes'}; "
        f"journal: {bench_walj.journal_missing(walj) or 'yes'}"
    )
    say(
        f"mode: {'quick' if cfg.quick else 'full'}, {cfg.reps} reps x {cfg.duration:.2f} s "
        f"({cfg.proc_reps} for process-per-run figures), "
        f"open sizes {cfg.open_sizes}"
    )

    t_start = time.perf_counter()
    series: dict[str, Series] = {}
    rows: list[Row] = []
    try:
        fx = bench_open.Fixtures(cfg, walj, say)
        for g in groups:
            say(f"[{g}]")
            t_group = time.perf_counter()
            s, r = run_group(g, cfg, walj, fx, say)
            say(f"[{g}] took {time.perf_counter() - t_group:.1f} s")
            series.update(s)
            rows.extend(r)
    finally:
        if not cfg.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    elapsed = time.perf_counter() - t_start
    return write_outputs(cfg, groups, series, rows, machine_line(cfg.workdir.parent), elapsed, say)


def write_outputs(
    cfg: Config,
    groups: list[str],
    series: dict[str, Series],
    rows: list[Row],
    machine: str,
    elapsed: float,
    say: Say,
) -> int:
    cfg.out.mkdir(parents=True, exist_ok=True)
    notes = [
        f"Every record is encoded with the encoder walj uses ({CODEC}), by walj and by every "
        "baseline; the raw loops write one line encoded before the loop.",
        "SQLite: WAL mode, one INSERT of the encoded record (a BLOB) + commit per record; "
        "multi-threaded runs use one connection per thread with busy_timeout.",
        "JSONL: open(..., 'ab'), one encoded line, write + flush per record (+ fdatasync, "
        "the data sync walj uses; F_FULLFSYNC on macOS).",
        "Counted figures (fsyncs per record, records per fsync, writes per call) count the "
        "sync, directory-sync and write calls walj makes, through its file-system seam "
        "(walj/log/fs.py, the `_fs` option of Log.open), while the timed loop runs; medians "
        "over the rounds.",
        "Ratio per round: the ratio of the walj and baseline repetitions that ran in the same "
        "interleaved round, lowest to highest; the ratio column is the ratio of the medians.",
        "Open figures: every repetition runs in a fresh interpreter (page cache warm) that "
        "times two steps: walj Log.open then walj.read (a journal: ToolJournal.open then "
        "Log.open of its directory); SQLite a scan with no decode then a scan with decode. "
        "Peak RSS is that process's VmHWM after its first step, interpreter included.",
        "Journal fixtures are written with fsync switched off in the building process only.",
        "dispatch.python: the dispatch and its two-append baseline run with their sync calls "
        "counted and not made (through the same seam), to time the Python around the fsyncs; "
        "nothing durable is claimed for them.",
        "Physical limits: `pwrite` of the pre-encoded line into a file zero-filled and synced "
        "before the series' first round (reused by its later rounds; a loop wraps to offset 0 "
        "at its end) + `fdatasync`, which has no file size to commit; and `syncfs` rounds: a "
        "thread per such file, one syncer making one `syncfs` per round for every write done "
        "before it began, releasing exactly those writers. `syncfs` flushes the whole file "
        "system, so on a shared volume it also pays for everyone else's dirty data.",
        "System calls per dispatch: `strace -f -c` of a child making N dispatches (every "
        "thread) less a child making none; the baseline is the same count for the raw loop's "
        "two write + fdatasync pairs.",
        "Sessions: commit modes are chosen with `walj.set_commit_mode` and the service's "
        "rounds, syncs and threads read from `walj.commit_stats()` over the timed window, when "
        "walj has them; a thread per session stops itself at the window's deadline; journals "
        "are kept from one round to the next and reopened. A full run's sessions windows are "
        "half the others' and take at most 5 rounds (their rates are stable at that length).",
    ]
    dev = same_device(cfg.workdir.parent, REPO_ROOT)
    notes.append(
        f"Scratch directory on {filesystem_of(cfg.workdir.parent)}; same device as the "
        f"checkout: {'unknown' if dev is None else 'yes' if dev else 'no'}."
    )
    if cfg.quick or cfg.scale != 1.0:
        notes.append(
            "Quick/scaled run: the open targets (set for 1M records) are checked at "
            "the largest size measured here."
        )
    written: list[str] = []
    stale = ["group_commit.png", "open_time.png", "latency.png"]
    if cfg.plots and bench_report.matplotlib_available():
        written = bench_report.plot(cfg.out, series, cfg.threads, cfg.open_sizes)
        notes.append("Plots: " + (", ".join(written) if written else "no data to plot") + ".")
    elif cfg.plots:
        notes.append("matplotlib is not installed: tables only (install the `bench` extra).")
    else:
        notes.append("Plots not requested (--no-plots): tables only.")
    for name in stale:
        if name not in written:
            (cfg.out / name).unlink(missing_ok=True)
    mode = "quick" if cfg.quick else "full"
    header = [
        f"Machine: {machine}",
        "",
        f"Mode: {mode} (scale {cfg.scale:g}; {cfg.reps} interleaved repetitions per series "
        f"({cfg.proc_reps} for open/zipapp), "
        f"{cfg.duration:.2f} s each for throughput; figures: {', '.join(groups)}; "
        f"run took {elapsed:.0f} s)",
        "",
        f"Command: `{cfg.command}`",
    ]
    (cfg.out / "latest.md").write_text(
        bench_report.markdown(header, rows, series, notes), encoding="utf-8"
    )
    meta = {
        "machine": machine,
        "mode": mode,
        "codec": CODEC,
        "threads": cfg.threads,
        "open_sizes": cfg.open_sizes,
        "scale": cfg.scale,
        "reps": cfg.reps,
        "proc_reps": cfg.proc_reps,
        "duration_s": cfg.duration,
        "groups": groups,
        "command": cfg.command,
        "plots": written,
        "elapsed_s": elapsed,
    }
    (cfg.out / "latest.json").write_text(bench_report.as_json(meta, rows, series), encoding="utf-8")
    width = max((len(r.id) for r in rows), default=10)
    for r in rows:
        walj = r.status or bench_report.fmt(r.walj, r.unit)
        ratio = f"{r.ratio:.2f}x" if r.ratio is not None and not r.status else "-"
        base_txt = r.base_status or bench_report.fmt(r.base, r.unit)
        say(f"{r.id:<{width}}  {walj:>24}  {base_txt:>24}  {ratio:>7}  {r.met}")
    say(f"wrote {cfg.out / 'latest.md'} in {elapsed:.0f} s")
    say("python benchmarks/readme_table.py rewrites the README's figures from latest.json")
    errors = [s for s in series.values() if s.error]
    for s in errors:
        say(f"ERROR in series {s.name}: {s.error}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
