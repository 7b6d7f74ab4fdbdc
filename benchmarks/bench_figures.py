"""Figure definitions: the series each figure runs (interleaved) and the table rows it reports."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import bench_baselines as base
import bench_open
import bench_sessions
import bench_sweep
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

GROUPS = ["append", "group", "dispatch", "open", "zipapp", "sessions", "sweep"]
ALIASES = {"durable": "append", "unsynced": "append", "latency": "append", "rss": "open"}
Measures = dict[str, tuple[str, Measure | str]]
Say = Callable[[str], None]

RAW_SYNC = "raw `os.write` of a pre-encoded line + `fdatasync`"
RAW_WRITE = "raw `os.write` of a pre-encoded line, no sync"
SQLITE_INSERT = "one INSERT + commit per record"
JSONL = "JSONL file: buffered write + flush per record"
DURABLE = "encode, write and `fdatasync` each record"
UNSYNCED = "encode and write each record (one `write` call), no sync"
OPEN_TARGETS = [Target("ratio", 3.0, "≥ 3×"), Target("min", 500_000, "≥ 500k rec/s")]


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
    m: Measures = {
        "walj-always": ("rec/s", bench_walj.append(walj, d, "always")),
        "walj-batch": ("rec/s", bench_walj.append(walj, d, "batch")),
        "walj-interval": ("rec/s", bench_walj.append(walj, d, "interval")),
        "walj-never": ("rec/s", bench_walj.append(walj, d, "never")),
        "raw-fsync": ("rec/s", base.raw_fsync(d)),
        "sqlite-full": ("rec/s", base.sqlite_append(d, "FULL")),
        "jsonl-fsync": ("rec/s", base.jsonl(d, fsync=True)),
        "raw-write": ("rec/s", base.raw_write(d)),
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
                targets=[Target("ratio", 0.9, "≥ 0.9×")],
            ),
            s["walj-always"],
            counted,
        ),
        speed_row(
            "durable.sqlite_full",
            durable,
            s["walj-always"],
            s["sqlite-full"],
            measures=DURABLE,
            baseline=f"SQLite WAL `synchronous=FULL`, {SQLITE_INSERT}",
            targets=[Target("ratio", 1.1, "≥ 1.1×")],
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
            targets=[Target("min", 250_000, "≥ 250k rec/s")],
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
        targets=[Target("ratio", 0.9, "≥ 0.9× (= 0.45× raw)")],
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
    return s, [noop, python]


def open_group(
    cfg: Config, walj: ModuleType | None, fx: bench_open.Fixtures, say: Say
) -> tuple[dict[str, Series], list[Row]]:
    s = interleave(bench_open.open_measures(cfg, fx, walj), cfg.proc_reps, cfg.workdir, say)
    rows: list[Row] = []
    last = len(cfg.open_sizes)
    derived = bench_open.derived
    raw_scan = "SQLite `SELECT` of every row in a fresh process, no decode"
    decode_scan = f"SQLite `SELECT` of every row + {base.CODEC} decode, fresh process"
    for k, n in enumerate(cfg.open_sizes, 1):
        big = k == last
        lo, sq = s[f"log-open-{k}"], s[f"sqlite-scan-{k}"]
        jo, sj = s[f"journal-open-{k}"], s[f"sqlite-journal-{k}"]
        jn = jo.samples[0].ops if jo.samples else n
        rows.append(
            speed_row(
                f"open.log.{k}",
                f"log open, {n:,} records",
                lo,
                sq,
                measures="`Log.open` + `close` in a fresh process: every checksum verified, "
                "no JSON decoded",
                baseline=raw_scan,
                targets=OPEN_TARGETS if big else [],
            )
        )
        rows.append(
            speed_row(
                f"scan.log.{k}",
                f"log read, {n:,} records",
                derived(lo, "read_rate", "rec/s"),
                derived(sq, "read_rate", "rec/s"),
                measures="`walj.read` of every record: checksums verified, JSON decoded",
                baseline=decode_scan,
                targets=OPEN_TARGETS if big else [],
            )
        )
        rows.append(
            speed_row(
                f"rss.log.{k}",
                f"peak RSS, log open, {n:,} records",
                derived(lo, "rss_mb", "MB"),
                derived(sq, "rss_mb", "MB"),
                measures="peak RSS (VmHWM, interpreter included) after `Log.open` + `close`",
                baseline="the same, after the SQLite scan with no decode",
                lower_is_better=True,
                targets=[Target("max", 100.0, "≤ 100 MB")],
            )
        )
        rows.append(
            speed_row(
                f"open.journal.{k}",
                f"journal open, {jn:,} records",
                jo,
                derived(sj, "read_rate", "rec/s"),
                measures="`ToolJournal.open` + `close`: checksums verified, every record "
                "decoded, recovery state rebuilt",
                baseline=decode_scan + ", of the journal's rows",
                targets=OPEN_TARGETS if big else [],
            )
        )
        rows.append(
            speed_row(
                f"logopen.journal.{k}",
                f"journal checksum scan, {jn:,} records",
                derived(jo, "verify_rate", "rec/s"),
                sj,
                measures="`Log.open` + `close` of the journal's directory: its checksum scan "
                "alone, no state",
                baseline=raw_scan + ", of the journal's rows",
            )
        )
        rows.append(
            speed_row(
                f"rss.journal.{k}",
                f"peak RSS, journal open, {jn:,} records",
                derived(jo, "rss_mb", "MB"),
                derived(sj, "rss_mb", "MB"),
                measures="peak RSS (VmHWM, interpreter included) after `ToolJournal.open` + "
                "`close`",
                baseline="the same, after the SQLite scan of the journal's rows, no decode",
                lower_is_better=True,
                targets=[Target("max", 100.0, "≤ 100 MB")],
            )
        )
    n = cfg.open_sizes[-1]
    after = bench_open.AFTER_CHECKPOINT
    rows.append(
        speed_row(
            "open.checkpoint",
            f"journal open, {n:,} records before its last checkpoint and {after:,} after",
            s["journal-open-checkpointed"],
            s["journal-open-small"],
            measures="`ToolJournal.open` + `close` in a fresh process (opens/s): the replay "
            "starts at the last checkpoint; the segments before it are checked by header and "
            "seal, their records not read",
            baseline=f"the same open of a journal of {after:,} records with no checkpoint",
            targets=[Target("ratio", 0.5, "≥ 0.5× (≤ 2× the time)")],
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
            f"zipapp verify, {n:,} records",
            s[f"zipapp-verify-{k}"],
            s[f"library-verify-{k}"],
            measures="`walj-forensic.pyz verify` under `python -I -S`, standard library "
            "only (pure-Python XXH64), wall clock with interpreter start",
            baseline="the library's `walj.verify`, with msgspec and xxhash, in a fresh "
            "interpreter, wall clock",
            targets=[Target("min", 50_000, "≥ 50k rec/s")] if k == len(cfg.open_sizes) else [],
        )
        for k, n in enumerate(cfg.open_sizes, 1)
    ]
    return s, rows


SESSION_MODES = {
    "async": "one asyncio loop, a task per session, `await turn.adispatch` of an async no-op",
    "threads": "a thread per session, `turn.dispatch` of a no-op",
}
RAW_THREADS = "raw `os.write` + `fdatasync`, a thread per file (the disk's limit), commits/s ÷ 2"
SQLITE_EACH = "SQLite WAL `synchronous=FULL`, a database per session, commits/s ÷ 2"
SQLITE_SHARED = "SQLite WAL `synchronous=FULL`, one database for every session, commits/s ÷ 2"
CPU_KEY = "user_cpu_us_per_call"


def sessions_group(
    cfg: Config, walj: ModuleType | None, say: Say
) -> tuple[dict[str, Series], list[Row]]:
    counts = bench_sessions.QUICK_SESSIONS if cfg.quick else bench_sessions.SESSIONS
    # CPU time is sampled at the kernel's tick (often 4-10 ms): a window must span many.
    d = max(cfg.duration, bench_sessions.MIN_WINDOW_SECONDS)
    m: Measures = {}
    for n in counts:
        m[f"sessions-async-{n}"] = ("calls/s", bench_sessions.walj_async(walj, d, n))
        m[f"sessions-threads-{n}"] = ("calls/s", bench_sessions.walj_threads(walj, d, n))
        m[f"sessions-raw-{n}"] = ("calls/s", bench_sessions.raw_threads(d, n))
        m[f"sessions-sqlite-each-{n}"] = ("calls/s", bench_sessions.sqlite_per_session(d, n))
        m[f"sessions-sqlite-shared-{n}"] = ("calls/s", bench_sessions.sqlite_shared(d, n))
    m["sessions-request-walj"] = ("requests/s", bench_sessions.walj_request(walj, d))
    m["sessions-request-sqlite"] = ("requests/s", bench_sessions.sqlite_request(d))
    s = interleave(m, cfg.reps, cfg.workdir, say)
    rows: list[Row] = [speed_row(
        "sessions.request", "a session per request",
        s["sessions-request-walj"], s["sessions-request-sqlite"],
        measures=f"`ToolJournal.open` of a {bench_sessions.REQUEST_RECORDS:,}-record session, a "
                 "turn with one durable no-op dispatch, `close`",
        baseline=f"SQLite WAL `synchronous=FULL`: connect to the session's database of "
                 f"{bench_sessions.REQUEST_RECORDS:,} rows, two INSERT + commit, close")]
    for n in counts:
        label = f"{n} session{'s' * (n > 1)}"
        for mode, how in SESSION_MODES.items():
            walj_s = s[f"sessions-{mode}-{n}"]
            for ref, ref_name in (("raw", RAW_THREADS), ("sqlite_each", SQLITE_EACH),
                                  ("sqlite_shared", SQLITE_SHARED)):
                targets = []
                if n == 64 and mode == "async" and ref == "raw":
                    targets = [Target("ratio", 0.5, "≥ 0.5×")]
                if n == 64 and ref == "sqlite_each":
                    targets = [Target("ratio", 2.0, "≥ 2× (best mode)")]
                rows.append(with_extra(
                    speed_row(f"sessions.{mode}.{ref}.{n}",
                              f"durable dispatch, {label}, {mode}", walj_s,
                              s[f"sessions-{ref.replace('_', '-')}-{n}"], measures=how,
                              baseline=ref_name,
                              targets=targets),
                    walj_s, {CPU_KEY: CPU_KEY}))
        raw = s[f"sessions-raw-{n}"]
        for mode in SESSION_MODES:
            rows.append(cpu_row(f"sessions.cpu.{mode}.{n}", f"user CPU per durable dispatch, "
                                f"{label}, {mode}", s[f"sessions-{mode}-{n}"], raw))
    return s, rows


def sweep_group(
    cfg: Config, walj: ModuleType | None, say: Say
) -> tuple[dict[str, Series], list[Row]]:
    root = bench_sweep.SweepRoot(cfg, child_env(walj))
    missing = bench_walj.journal_missing(walj)
    m: Measures = {
        "sweep-walj": ("sessions/s", missing or bench_sweep.walj_sweep(root)),
        "sweep-read": ("sessions/s", missing or bench_sweep.read_all(root)),
    }
    s = interleave(m, cfg.proc_reps, cfg.workdir, say)
    n = f"{root.sessions:,} local sessions"
    how = (f"`walj sweep ROOT --json` in a fresh process: every session's segments verified and "
           f"its recovery state rebuilt, one in {bench_sweep.BLOCKED_EVERY} blocked; wall clock")
    floor = "one process walking the same root and reading every byte of every file"
    rows = _sweep_rows("sweep.local", "sweep.rss", n, s["sweep-walj"], s["sweep-read"], how,
                       floor, "peak RSS of the largest process of the sweep (its workers "
                       "included), interpreter included")
    archived, rows_archived = _sweep_archived(cfg, walj, say, missing)
    s.update(archived)
    return s, rows + rows_archived


def _sweep_archived(cfg: Config, walj: ModuleType | None, say: Say, missing: str | None
                    ) -> tuple[dict[str, Series], list[Row]]:
    root = bench_sweep.ArchivedRoot(cfg, child_env(walj))
    missing = missing or bench_sweep.archive_missing()
    m: Measures = {
        "sweep-archived-walj": ("sessions/s", missing or bench_sweep.walj_sweep_archived(root)),
        "sweep-archived-read": ("sessions/s", missing or bench_sweep.read_archive(root)),
    }
    try:
        s = interleave(m, cfg.proc_reps, cfg.workdir, say)
    finally:
        root.close()
    n = f"{root.sessions:,} archived sessions"
    jobs = bench_sweep.sweep_jobs()
    how = (f"`walj sweep s3://… --json` in a fresh process against an S3 API (moto's server "
           f"on loopback): every ended session's objects read, verified and its recovery state "
           f"rebuilt, {jobs} threads; wall clock")
    floor = (f"one process listing the same prefix and reading every object through s3fs, "
             f"{jobs} threads")
    rows = _sweep_rows("sweep.archived", "sweep.archived_rss", n, s["sweep-archived-walj"],
                       s["sweep-archived-read"], how, floor, "peak RSS of the sweep process "
                       "(its threads included), interpreter and s3fs included")
    return s, rows


def _sweep_rows(rate_id: str, rss_id: str, n: str, walj_s: Series, floor_s: Series, how: str,
                floor: str, rss_how: str) -> list[Row]:
    """A sweep's rate against its floor's, and the peak RSS of both."""
    return [
        speed_row(rate_id, f"sweep, {n}", walj_s, floor_s, measures=how, baseline=floor),
        speed_row(rss_id, f"peak RSS, sweep, {n}", bench_open.derived(walj_s, "rss_mb", "MB"),
                  bench_open.derived(floor_s, "rss_mb", "MB"), measures=rss_how,
                  baseline="the same, of the reading process", lower_is_better=True),
    ]


def cpu_row(row_id: str, figure: str, walj_s: Series, raw: Series) -> Row:
    """User CPU µs per call (os.times over the window, all threads) against the raw loop's
    CPU per write+fdatasync; lower is better, so the ratio is raw / walj."""
    w, b = walj_s.extra_median(CPU_KEY), raw.extra_median("user_cpu_us_per_write")
    rounds = []
    if not (walj_s.status or raw.status) and len(walj_s.samples) == len(raw.samples):
        for ws, rs in zip(walj_s.samples, raw.samples, strict=True):
            wv, rv = ws.extra.get(CPU_KEY), rs.extra.get("user_cpu_us_per_write")
            if wv and rv:
                rounds.append(rv / wv)
    return Row(id=row_id, figure=figure, unit="µs", walj=w, base=b,
               ratio=(b / w) if w and b else None,
               targets=[Target("max", 40.0, "≤ 40 µs")],
               status=walj_s.status, base_status=raw.status,
               measures="user CPU time per durable dispatch (getrusage, every thread)",
               baseline="the raw loop's user CPU per write + fdatasync, same sessions",
               round_ratios=rounds)


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
