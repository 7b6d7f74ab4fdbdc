"""Figure definitions: the series each figure runs (interleaved) and the table rows it reports."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import bench_baselines as base
import bench_open
import bench_walj
from bench_core import Config, Measure, Row, Series, Target, interleave, speed_row

GROUPS = ["append", "group", "dispatch", "open", "zipapp"]
ALIASES = {"durable": "append", "unsynced": "append", "latency": "append", "rss": "open"}
Measures = dict[str, tuple[str, Measure | str]]
Say = Callable[[str], None]


def append_group(
    cfg: Config, walj: ModuleType | None, say: Say
) -> tuple[dict[str, Series], list[Row]]:
    d = cfg.duration
    m: Measures = {
        "walj-always": ("rec/s", bench_walj.append(walj, d, "always")),
        "walj-batch": ("rec/s", bench_walj.append(walj, d, "batch")),
        "walj-interval": ("rec/s", bench_walj.append(walj, d, "interval")),
        "walj-never": ("rec/s", bench_walj.append(walj, d, "never")),
        "raw-fsync": ("rec/s", base.raw_fsync(d)),
        "sqlite-full": ("rec/s", base.sqlite_append(d, "FULL")),
        "jsonl-fsync": ("rec/s", base.jsonl(d, fsync=True)),
        "sqlite-normal": ("rec/s", base.sqlite_append(d, "NORMAL")),
        "jsonl-plain": ("rec/s", base.jsonl(d, fsync=False)),
    }
    s = interleave(m, cfg.reps, cfg.workdir, say)
    rows = [
        speed_row(
            "durable.raw",
            "durable append (sync=always) vs raw os.write + fdatasync",
            s["walj-always"],
            s["raw-fsync"],
            targets=[Target("ratio", 0.9, "≥ 0.9×")],
        ),
        speed_row(
            "durable.sqlite_full",
            "durable append (sync=always) vs SQLite WAL FULL",
            s["walj-always"],
            s["sqlite-full"],
            targets=[Target("ratio", 1.1, "≥ 1.1×")],
        ),
        speed_row(
            "durable.jsonl_fsync",
            "durable append (sync=always) vs JSONL flush + os.fsync",
            s["walj-always"],
            s["jsonl-fsync"],
        ),
        speed_row(
            "unsynced.sqlite_normal",
            "unsynced append (sync=never) vs SQLite WAL NORMAL",
            s["walj-never"],
            s["sqlite-normal"],
            targets=[Target("ratio", 7.0, "≥ 7×")],
        ),
        speed_row(
            "unsynced.jsonl",
            "unsynced append (sync=never) vs JSONL write + flush",
            s["walj-never"],
            s["jsonl-plain"],
        ),
        speed_row(
            "unsynced.rate",
            "unsynced append (sync=never), absolute rate",
            s["walj-never"],
            None,
            targets=[Target("min", 250_000, "≥ 250k rec/s")],
        ),
    ]
    for mode, ref, ref_name in (
        ("always", "raw-fsync", "raw fdatasync"),
        ("batch", "raw-fsync", "raw fdatasync"),
        ("interval", "jsonl-plain", "JSONL write + flush"),
        ("never", "jsonl-plain", "JSONL write + flush"),
    ):
        for q in ("p50", "p99"):
            rows.append(
                speed_row(
                    f"latency.{mode}.{q}",
                    f"append latency {q}, sync={mode} vs {ref_name}",
                    s[f"walj-{mode}"],
                    s[ref],
                    attr=f"{q}_us",
                    lower_is_better=True,
                    unit="us",
                )
            )
    return s, rows


def group_group(
    cfg: Config, walj: ModuleType | None, say: Say
) -> tuple[dict[str, Series], list[Row]]:
    m: Measures = {}
    for n in cfg.threads:
        m[f"walj-batch-threads-{n}"] = ("rec/s", bench_walj.group_commit(walj, cfg.duration, n))
        m[f"sqlite-full-threads-{n}"] = ("rec/s", base.sqlite_threads(cfg.duration, n))
    s = interleave(m, cfg.reps, cfg.workdir, say)
    rows = [
        speed_row(
            f"group.{n}",
            f"group commit (sync=batch), {n} thread{'s' * (n > 1)} vs SQLite WAL FULL",
            s[f"walj-batch-threads-{n}"],
            s[f"sqlite-full-threads-{n}"],
        )
        for n in cfg.threads
    ]
    top, one = (8 if 8 in cfg.threads else max(cfg.threads)), min(cfg.threads)
    rows.append(
        speed_row(
            "group.scaling",
            f"group commit, {top} threads vs walj's own {one} thread{'s' * (one > 1)}",
            s[f"walj-batch-threads-{top}"],
            s[f"walj-batch-threads-{one}"],
            targets=[Target("ratio", 6.0, "≥ 6×")] if (top, one) == (8, 1) else [],
        )
    )
    return s, rows


def dispatch_group(
    cfg: Config, walj: ModuleType | None, say: Say
) -> tuple[dict[str, Series], list[Row]]:
    m: Measures = {
        "walj-dispatch": ("calls/s", bench_walj.dispatch(walj, cfg.duration)),
        "dispatch-raw-fsync": ("calls/s", base.raw_fsync(cfg.duration)),
    }
    s = interleave(m, cfg.reps, cfg.workdir, say)
    row = speed_row(
        "dispatch.noop",
        "durable no-op tool dispatch vs ½ raw fdatasync rate",
        s["walj-dispatch"],
        s["dispatch-raw-fsync"],
        base_scale=0.5,
        targets=[Target("ratio", 0.9, "≥ 0.9× (= 0.45× raw)")],
    )
    return s, [row]


def open_group(
    cfg: Config, walj: ModuleType | None, fx: bench_open.Fixtures, say: Say
) -> tuple[dict[str, Series], list[Row]]:
    s = interleave(bench_open.open_measures(cfg, fx, walj), cfg.proc_reps, cfg.workdir, say)
    rows: list[Row] = []
    last = len(cfg.open_sizes)
    for k, n in enumerate(cfg.open_sizes, 1):
        big = k == last
        lo, sq = s[f"log-open-{k}"], s[f"sqlite-scan-{k}"]
        jo, sj = s[f"journal-open-{k}"], s[f"sqlite-journal-{k}"]
        jn = jo.samples[0].ops if jo.samples else n
        rows.append(
            speed_row(
                f"open.log.{k}",
                f"log open (recovery scan), {n:,} records vs SQLite scan + json.loads",
                lo,
                sq,
                targets=[Target("ratio", 3.0, "≥ 3×")] if big else [],
            )
        )
        rows.append(
            speed_row(
                f"scan.log.{k}",
                f"log read (walj.read), {n:,} records vs SQLite scan + json.loads",
                bench_open.derived(lo, "read_rate", "rec/s"),
                sq,
                targets=[Target("min", 500_000, "≥ 500k rec/s")] if big else [],
            )
        )
        rows.append(
            speed_row(
                f"rss.log.{k}",
                f"peak RSS, log open, {n:,} records vs SQLite scan",
                bench_open.derived(lo, "rss_mb", "MB"),
                bench_open.derived(sq, "rss_mb", "MB"),
                lower_is_better=True,
                targets=[Target("max", 100.0, "≤ 100 MB")],
            )
        )
        jt = [Target("ratio", 3.0, "≥ 3×"), Target("min", 500_000, "≥ 500k rec/s")] if big else []
        rows.append(
            speed_row(
                f"open.journal.{k}",
                f"journal open + rebuild, {jn:,} records "
                "vs SQLite scan + json.loads of the same rows",
                jo,
                sj,
                targets=jt,
            )
        )
        rows.append(
            speed_row(
                f"rss.journal.{k}",
                f"peak RSS, journal open, {jn:,} records vs SQLite scan",
                bench_open.derived(jo, "rss_mb", "MB"),
                bench_open.derived(sj, "rss_mb", "MB"),
                lower_is_better=True,
                targets=[Target("max", 100.0, "≤ 100 MB")],
            )
        )
    return s, rows


def zipapp_group(
    cfg: Config, walj: ModuleType | None, fx: bench_open.Fixtures, say: Say
) -> tuple[dict[str, Series], list[Row]]:
    s = interleave(bench_open.zipapp_measures(cfg, fx, walj), cfg.proc_reps, cfg.workdir, say)
    rows = [
        speed_row(
            f"zipapp.{k}",
            f"stdlib-only zipapp verify, {n:,} records vs library verify",
            s[f"zipapp-verify-{k}"],
            s[f"library-verify-{k}"],
            targets=[Target("min", 50_000, "≥ 50k rec/s")] if k == len(cfg.open_sizes) else [],
        )
        for k, n in enumerate(cfg.open_sizes, 1)
    ]
    return s, rows


def run_group(
    name: str, cfg: Config, walj: ModuleType | None, fx: bench_open.Fixtures, say: Say
) -> tuple[dict[str, Series], list[Row]]:
    """Run one figure group by name."""
    if name == "open":
        return open_group(cfg, walj, fx, say)
    if name == "zipapp":
        return zipapp_group(cfg, walj, fx, say)
    simple = {"append": append_group, "group": group_group, "dispatch": dispatch_group}
    return simple[name](cfg, walj, say)
