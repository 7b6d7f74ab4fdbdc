"""Figure definitions: the series each figure runs (interleaved) and the table rows it reports."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import bench_baselines as base
import bench_limits
import bench_open
import bench_syscalls
import bench_walj
from bench_core import (
    Config,
    Measure,
    Row,
    Series,
    Target,
    child_env,
    interleave,
    speed_row,
)
from bench_figures_read import open_group, sweep_group, zipapp_group
from bench_figures_sessions import sessions_group

GROUPS = ["append", "group", "dispatch", "open", "zipapp", "sessions", "sweep"]
ALIASES = {"durable": "append", "unsynced": "append", "latency": "append", "rss": "open"}
Measures = dict[str, tuple[str, Measure | str]]
Say = Callable[[str], None]

RAW_SYNC = "raw `os.write` of a pre-encoded line + `fdatasync`"
RAW_WRITE = "raw `os.write` of a pre-encoded line, no sync"
SQLITE_INSERT = "one INSERT + commit per record"
RAW_PREALLOC = ("raw `pwrite` of a pre-encoded line into a zero-filled file + `fdatasync` (the "
                "physical limit: no file size to commit)")
MANY = 100
JSONL = "JSONL file: buffered write + flush per record"
DURABLE = "encode, write and `fdatasync` each record"
UNSYNCED = "encode and write each record (one `write` call), no sync"


def with_extra(row: Row, series: Series, keys: dict[str, str]) -> Row:
    """Copy the medians of counted extras of walj's series into the row, renamed."""
    for key, name in keys.items():
        value = series.extra_median(key)
        if value is not None:
            row.extra[name] = value
    return row


def append_group(
    cfg: Config, walj: ModuleType | None, say: Say
) -> tuple[dict[str, Series], list[Row]]:
    d = cfg.duration
    prealloc = bench_limits.prealloc_size(cfg.scale)
    m: Measures = {
        "walj-always": ("rec/s", bench_walj.append(walj, d, "always")),
        "walj-batch": ("rec/s", bench_walj.append(walj, d, "batch")),
        "walj-interval": ("rec/s", bench_walj.append(walj, d, "interval")),
        "walj-never": ("rec/s", bench_walj.append(walj, d, "never")),
        "raw-fsync": ("rec/s", base.raw_fsync(d)),
        "raw-prealloc": ("rec/s", bench_limits.raw_prealloc(d, cfg.workdir / "homes" /
                                                            "append-prealloc", prealloc)),
        "sqlite-full": ("rec/s", base.sqlite_append(d, "FULL")),
        "jsonl-fsync": ("rec/s", base.jsonl(d, fsync=True)),
        "raw-write": ("rec/s", base.raw_write(d)),
        "walj-many": ("rec/s", bench_walj.append_many(walj, d, MANY)),
        "sqlite-normal": ("rec/s", base.sqlite_append(d, "NORMAL")),
        "jsonl-plain": ("rec/s", base.jsonl(d, fsync=False)),
    }
    s = interleave(m, cfg.reps, cfg.workdir, say)
    counted = {"fsyncs_per_op": "fsyncs_per_record"}
    durable = "durable append, `sync=\"always\"`"
    unsynced = "unsynced append, `sync=\"never\"`"
    rows = [
        with_extra(
            speed_row(
                "durable.raw",
                durable,
                s["walj-always"],
                s["raw-fsync"],
                measures=DURABLE,
                baseline=RAW_SYNC,
                targets=[Target("ratio", 1.2, "≥ 1.2×")],
            ),
            s["walj-always"],
            counted,
        ),
        speed_row(
            "durable.prealloc",
            durable,
            s["walj-always"],
            s["raw-prealloc"],
            measures=DURABLE,
            baseline=RAW_PREALLOC,
        ),
        speed_row(
            "limit.prealloc",
            "the physical limit of a durable append",
            s["raw-prealloc"],
            s["raw-fsync"],
            measures=RAW_PREALLOC,
            baseline=RAW_SYNC,
        ),
        speed_row(
            "durable.sqlite_full",
            durable,
            s["walj-always"],
            s["sqlite-full"],
            measures=DURABLE,
            baseline=f"SQLite WAL `synchronous=FULL`, {SQLITE_INSERT}",
            targets=[Target("ratio", 1.5, "≥ 1.5×")],
        ),
        speed_row(
            "durable.jsonl_fsync",
            durable,
            s["walj-always"],
            s["jsonl-fsync"],
            measures=DURABLE,
            baseline=f"{JSONL} + `fdatasync`",
        ),
        speed_row(
            "unsynced.rate",
            unsynced,
            s["walj-never"],
            s["raw-write"],
            measures=UNSYNCED,
            baseline=RAW_WRITE,
            targets=[Target("ratio", 0.35, "≥ 0.35×"), Target("min", 250_000, "≥ 250k rec/s")],
        ),
        speed_row(
            "unsynced.many",
            f"unsynced `append_many` of {MANY} records",
            s["walj-many"],
            s["raw-write"],
            measures=f"encode, frame and write {MANY} records in one `append_many` call, no sync",
            baseline=f"{RAW_WRITE}: the same lines, one `write` call each",
            targets=[Target("ratio", 0.8, "≥ 0.8×")],
        ),
        speed_row(
            "unsynced.sqlite_normal",
            unsynced,
            s["walj-never"],
            s["sqlite-normal"],
            measures=UNSYNCED,
            baseline=f"SQLite WAL `synchronous=NORMAL`, {SQLITE_INSERT}",
            targets=[Target("ratio", 7.0, "≥ 7×")],
        ),
        speed_row(
            "unsynced.jsonl",
            unsynced,
            s["walj-never"],
            s["jsonl-plain"],
            measures=UNSYNCED,
            baseline=JSONL,
        ),
    ]
    for mode, ref, ref_name in (
        ("always", "raw-fsync", RAW_SYNC),
        ("batch", "raw-fsync", RAW_SYNC),
        ("interval", "jsonl-plain", JSONL),
        ("never", "jsonl-plain", JSONL),
    ):
        for q in ("p50", "p99"):
            rows.append(
                speed_row(
                    f"latency.{mode}.{q}",
                    f"append latency {q}, `sync=\"{mode}\"`",
                    s[f"walj-{mode}"],
                    s[ref],
                    measures="time of one append call, single thread",
                    baseline=ref_name,
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
    counted = {"records_per_fsync": "records_per_fsync", "fsyncs_per_s": "fsyncs_per_s"}
    rows = [
        with_extra(
            speed_row(
                f"group.{n}",
                f"group commit, {n} thread{'s' * (n > 1)}",
                s[f"walj-batch-threads-{n}"],
                s[f"sqlite-full-threads-{n}"],
                measures=f"`sync=\"batch\"` appends from {n} thread{'s' * (n > 1)} to one log, "
                "each returning once durable",
                baseline=f"SQLite WAL `synchronous=FULL`, {n} thread{'s' * (n > 1)}, one "
                f"connection each, {SQLITE_INSERT}",
            ),
            s[f"walj-batch-threads-{n}"],
            counted,
        )
        for n in cfg.threads
    ]
    top, one = (8 if 8 in cfg.threads else max(cfg.threads)), min(cfg.threads)
    rows.append(
        with_extra(
            speed_row(
                "group.scaling",
                f"group commit, {top} threads against {one}",
                s[f"walj-batch-threads-{top}"],
                s[f"walj-batch-threads-{one}"],
                measures=f"`sync=\"batch\"` appends from {top} threads",
                baseline=f"walj itself, {one} thread{'s' * (one > 1)}",
                targets=[Target("ratio", 6.0, "≥ 6×")] if (top, one) == (8, 1) else [],
            ),
            s[f"walj-batch-threads-{top}"],
            counted,
        )
    )
    return s, rows


def dispatch_group(
    cfg: Config, walj: ModuleType | None, say: Say
) -> tuple[dict[str, Series], list[Row]]:
    d = cfg.duration
    m: Measures = {
        "walj-dispatch": ("calls/s", bench_walj.dispatch(walj, d)),
        "dispatch-raw-fsync": ("calls/s", base.raw_fsync(d)),
        "dispatch-raw-prealloc": ("calls/s", bench_limits.raw_prealloc(
            d, cfg.workdir / "homes" / "dispatch-prealloc", bench_limits.prealloc_size(cfg.scale))),
        "walj-dispatch-nosync": ("calls/s", bench_walj.dispatch(walj, d, null_sync=True)),
        "walj-two-appends": ("calls/s", bench_walj.pair_append(walj, d)),
    }
    s = interleave(m, cfg.reps, cfg.workdir, say)
    noop = speed_row(
        "dispatch.noop",
        "durable no-op tool dispatch",
        s["walj-dispatch"],
        s["dispatch-raw-fsync"],
        measures="intent record, handler, outcome record, each written and fsynced "
        "(`sync=\"always\"`)",
        baseline="½ the rate of the raw `os.write` + `fdatasync` loop: the ceiling for two "
        "fsyncs a call",
        base_scale=0.5,
        targets=[Target("ratio", 1.1, "≥ 1.1× (= 0.55× raw)")],
    )
    physical = speed_row(
        "dispatch.prealloc",
        "durable no-op tool dispatch",
        s["walj-dispatch"],
        s["dispatch-raw-prealloc"],
        measures="intent record, handler, outcome record, each written and fsynced "
        "(`sync=\"always\"`)",
        baseline="½ the rate of the raw `pwrite` into a zero-filled file + `fdatasync` loop: "
        "the physical ceiling for two durable records a call",
        base_scale=0.5,
    )
    with_extra(
        noop,
        s["walj-dispatch"],
        {"fsyncs_per_op": "fsyncs_per_call", "writes_per_op": "writes_per_call"},
    )
    python = speed_row(
        "dispatch.python",
        "no-op tool dispatch, fsyncs left out",
        s["walj-dispatch-nosync"],
        s["walj-two-appends"],
        measures="the same dispatch, its sync calls counted but not made through walj's "
        "file-system seam, timing the journal's Python and writes",
        baseline="two walj `Log.append` calls, syncs left out the same way: the log's part",
    )
    with_extra(
        python,
        s["walj-dispatch-nosync"],
        {"fsyncs_per_op": "fsyncs_left_out_per_call", "writes_per_op": "writes_per_call"},
    )
    sc, syscalls = syscalls_figure(cfg, walj, say)
    s.update(sc)
    return s, [noop, physical, python, syscalls]


SYSCALL_KEYS = tuple(f"{k}_per_call" for k in bench_syscalls.GROUPS)


def syscalls_figure(
    cfg: Config, walj: ModuleType | None, say: Say
) -> tuple[dict[str, Series], Row]:
    """System calls per durable dispatch under `strace -f -c`; the counts are exact, so two
    rounds are enough."""
    n = max(50, int((200 if cfg.quick else 1000) * cfg.scale))
    env = child_env(walj)
    missing = bench_syscalls.strace_missing() or bench_walj.journal_missing(walj)
    m: Measures = {
        "syscalls-dispatch": ("syscalls", missing or bench_syscalls.measure_per_call(
            "walj", n, env)),
        "syscalls-raw": ("syscalls", bench_syscalls.strace_missing() or
                         bench_syscalls.measure_per_call("raw", n, env)),
    }
    s = interleave(m, min(cfg.reps, 2), cfg.workdir, say)
    row = speed_row(
        "dispatch.syscalls",
        "system calls per durable no-op dispatch",
        s["syscalls-dispatch"],
        s["syscalls-raw"],
        measures=f"`strace -f -c` of a child making {n:,} dispatches less one making none, "
        "every thread counted",
        baseline="the same count for two raw `os.write` + `fdatasync` (a call's two records)",
        lower_is_better=True,
    )
    return s, with_extra(row, s["syscalls-dispatch"], {k: k for k in SYSCALL_KEYS})


def run_group(
    name: str, cfg: Config, walj: ModuleType | None, fx: bench_open.Fixtures, say: Say
) -> tuple[dict[str, Series], list[Row]]:
    """Run one figure group by name."""
    if name == "open":
        return open_group(cfg, walj, fx, say)
    if name == "zipapp":
        return zipapp_group(cfg, walj, fx, say)
    simple = {"append": append_group, "group": group_group, "dispatch": dispatch_group,
              "sessions": sessions_group, "sweep": sweep_group}
    return simple[name](cfg, walj, say)
