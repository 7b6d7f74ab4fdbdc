"""The sessions figure: N sessions in one process per commit mode, against the naive and the
physical limits of the disk and against SQLite, with user CPU and the commit service's rounds."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import bench_commit
import bench_sessions
from bench_core import Config, Measure, Row, Series, Target, interleave, speed_row

Measures = dict[str, tuple[str, Measure | str]]
Say = Callable[[str], None]

SESSION_MODES = {
    "async": "one asyncio loop, a task per session, `await turn.adispatch` of an async no-op",
    "threads": "a thread per session, `turn.dispatch` of a no-op",
}
RAW_THREADS = "raw `os.write` + `fdatasync`, a thread per file (the disk's limit), commits/s ÷ 2"
RAW_PREALLOC = ("raw `pwrite` into a zero-filled file + `fdatasync`, a thread per file (the "
                "physical limit: no metadata to commit), commits/s ÷ 2")
RAW_SYNCFS = ("raw `pwrite` into a zero-filled file a thread, one `syncfs` per round for every "
              "file with a pending write (the limit of a dedicated volume), commits/s ÷ 2")
SQLITE_EACH = "SQLite WAL `synchronous=FULL`, a database per session, commits/s ÷ 2"
SQLITE_SHARED = "SQLite WAL `synchronous=FULL`, one database for every session, commits/s ÷ 2"
BASELINES = {  # row ref: (series prefix, what it is, the largest session count it runs at)
    "raw": ("sessions-raw-", RAW_THREADS, None),
    "raw_prealloc": ("sessions-raw-prealloc-", RAW_PREALLOC, None),
    "raw_syncfs": ("sessions-syncfs-", RAW_SYNCFS, None),
    "sqlite_each": ("sessions-sqlite-each-", SQLITE_EACH, 256),
    "sqlite_shared": ("sessions-sqlite-shared-", SQLITE_SHARED, 64),
}
CPU_KEY = "user_cpu_us_per_call"
SERVICE_KEYS = ("commit_rounds_per_s", "commit_syncs_per_s", "calls_per_round",
                "commit_threads", "commit_waiters")
CPU_TARGET = Target("max", 60.0, "≤ 60 µs")  # issue 25's, at 1 and 64 sessions
CPU_TARGET_EVERYWHERE = Target("max", 40.0, "≤ 40 µs")  # the earlier target, on every row


def _runs_at(ref: str, n: int) -> bool:
    top = BASELINES[ref][2]
    return top is None or n <= top


def _modes(walj: ModuleType | None) -> tuple[list[str], str | None, str | None]:
    """(the commit modes to measure beside the default, the default's name (None without a
    commit service), why the modes cannot be measured or None)."""
    missing = bench_commit.service_missing(walj)
    if missing:
        return list(bench_commit.COMMIT_MODES), None, missing
    default = bench_commit.default_mode(walj)
    return [m for m in bench_commit.COMMIT_MODES if m != default], default, None


def session_measures(cfg: Config, walj: ModuleType | None, counts: list[int], d: float,
                     ) -> Measures:
    modes, default, missing = _modes(walj)
    walj_measures = {"async": bench_sessions.walj_async, "threads": bench_sessions.walj_threads}
    m: Measures = {}
    for n in counts:
        for api, fn in walj_measures.items():  # the default mode, set by name when there is one
            name = f"sessions-{api}-{n}"
            m[name] = ("calls/s", fn(walj, d, n, cfg.workdir / "homes" / name, default, default))
        for mode in modes:
            for api, fn in walj_measures.items():
                name = f"sessions-{api}-{mode}-{n}"
                m[name] = ("calls/s", missing or fn(walj, d, n, cfg.workdir / "homes" / name,
                                                    mode, default))
        m[f"sessions-raw-{n}"] = ("calls/s", bench_sessions.raw_threads(d, n))
        homes = cfg.workdir / "homes"
        m[f"sessions-raw-prealloc-{n}"] = ("calls/s", bench_sessions.raw_prealloc_threads(
            d, n, cfg.scale, homes / f"raw-prealloc-{n}"))
        m[f"sessions-syncfs-{n}"] = ("calls/s", bench_sessions.syncfs_rounds(
            d, n, cfg.scale, homes / f"syncfs-{n}"))
        if _runs_at("sqlite_each", n):
            m[f"sessions-sqlite-each-{n}"] = ("calls/s", bench_sessions.sqlite_per_session(d, n))
        if _runs_at("sqlite_shared", n):
            m[f"sessions-sqlite-shared-{n}"] = ("calls/s", bench_sessions.sqlite_shared(d, n))
    m["sessions-request-walj"] = ("requests/s", bench_sessions.walj_request(walj, d))
    m["sessions-request-sqlite"] = ("requests/s", bench_sessions.sqlite_request(d))
    return m


def with_extra(row: Row, series: Series, keys: tuple[str, ...]) -> Row:
    for key in keys:
        value = series.extra_median(key)
        if value is not None:
            row.extra[key] = value
    return row


def _default_rows(s: dict[str, Series], n: int, label: str) -> list[Row]:
    rows: list[Row] = []
    for api, how in SESSION_MODES.items():
        walj_s = s[f"sessions-{api}-{n}"]
        for ref, (prefix, ref_name, _top) in BASELINES.items():
            if not _runs_at(ref, n):
                continue
            targets = []
            if n == 64 and ref == "raw":
                targets = [Target("ratio", 1.5, "≥ 1.5×")]
            if n == 64 and ref == "sqlite_each":
                targets = [Target("ratio", 3.0, "≥ 3×")]
            rows.append(with_extra(
                speed_row(f"sessions.{api}.{ref}.{n}", f"durable dispatch, {label}, {api}",
                          walj_s, s[f"{prefix}{n}"], measures=how, baseline=ref_name,
                          targets=targets),
                walj_s, (CPU_KEY, *SERVICE_KEYS)))
    return rows


def _mode_rows(s: dict[str, Series], n: int, label: str, modes: list[str]) -> list[Row]:
    """A row per API and commit mode against the naive limit; its user CPU, the commit
    service's counters and its ratio to the mode's physical limit in the counted column."""
    rows: list[Row] = []
    for api, how in SESSION_MODES.items():
        for mode in modes:
            walj_s = s[f"sessions-{api}-{mode}-{n}"]
            targets = []
            if n == 64 and mode == "syncfs":
                targets = [Target("ratio", 4.0, "≥ 4×")]
            row = with_extra(
                speed_row(f"sessions.{api}.{mode}_mode.{n}",
                          f"durable dispatch, {label}, {api}, commit mode \"{mode}\"",
                          walj_s, s[f"sessions-raw-{n}"],
                          measures=f"{how}; {bench_commit.MODE_HOW[mode]}",
                          baseline=RAW_THREADS, targets=targets),
                walj_s, (CPU_KEY, *SERVICE_KEYS))
            limit = s[f"sessions-syncfs-{n}" if mode == "syncfs" else f"sessions-raw-prealloc-{n}"]
            w, b = walj_s.median(), limit.median()
            if w and b:
                row.extra["ratio_to_physical_limit"] = w / b
            rows.append(row)
    return rows


def _limit_rows(s: dict[str, Series], n: int, label: str) -> list[Row]:
    """How far the physical limits stand above the naive one, on this disk."""
    raw = s[f"sessions-raw-{n}"]
    return [
        speed_row(f"sessions.limit.prealloc.{n}", f"physical limit, {label}: file per session",
                  s[f"sessions-raw-prealloc-{n}"], raw, measures=RAW_PREALLOC,
                  baseline=RAW_THREADS),
        speed_row(f"sessions.limit.syncfs.{n}", f"physical limit, {label}: syncfs rounds",
                  s[f"sessions-syncfs-{n}"], raw, measures=RAW_SYNCFS, baseline=RAW_THREADS),
    ]


def sessions_group(
    cfg: Config, walj: ModuleType | None, say: Say
) -> tuple[dict[str, Series], list[Row]]:
    counts = cfg.sessions or (bench_sessions.QUICK_SESSIONS if cfg.quick
                              else bench_sessions.SESSIONS)
    # CPU time is sampled at the kernel's tick (often 4-10 ms): a window must span many. A
    # full run's windows are half the other figures': the rates are stable at that length.
    d = max(cfg.duration / (1 if cfg.quick else 2), bench_sessions.MIN_WINDOW_SECONDS)
    modes, _default, _missing = _modes(walj)
    reps = cfg.reps if cfg.quick else min(cfg.reps, 5)
    s = interleave(session_measures(cfg, walj, counts, d), reps, cfg.workdir, say)
    rows: list[Row] = [speed_row(
        "sessions.request", "a session per request",
        s["sessions-request-walj"], s["sessions-request-sqlite"],
        measures=f"`ToolJournal.open` of a {bench_sessions.REQUEST_RECORDS:,}-record session, a "
                 "turn with one durable no-op dispatch, `close`",
        baseline=f"SQLite WAL `synchronous=FULL`: connect to the session's database of "
                 f"{bench_sessions.REQUEST_RECORDS:,} rows, two INSERT + commit, close",
        targets=[Target("ratio", 1.0, "≥ 1.0×")])]
    for n in counts:
        label = f"{n:,} session{'s' * (n > 1)}"
        rows += _default_rows(s, n, label)
        for api in SESSION_MODES:
            targets = [CPU_TARGET_EVERYWHERE] + ([CPU_TARGET] if n in (1, 64) else [])
            rows.append(cpu_row(f"sessions.cpu.{api}.{n}", f"user CPU per durable dispatch, "
                                f"{label}, {api}", s[f"sessions-{api}-{n}"],
                                s[f"sessions-raw-{n}"], targets))
        rows += _mode_rows(s, n, label, modes)
        rows += _limit_rows(s, n, label)
    return s, rows


def cpu_row(row_id: str, figure: str, walj_s: Series, raw: Series,
            targets: list[Target]) -> Row:
    """User CPU µs per call (getrusage over the window, all threads) against the raw loop's
    CPU per write+fdatasync; lower is better, so the ratio is raw / walj."""
    w, b = walj_s.extra_median(CPU_KEY), raw.extra_median("user_cpu_us_per_write")
    rounds = []
    if not (walj_s.status or raw.status) and len(walj_s.samples) == len(raw.samples):
        for ws, rs in zip(walj_s.samples, raw.samples, strict=True):
            wv, rv = ws.extra.get(CPU_KEY), rs.extra.get("user_cpu_us_per_write")
            if wv and rv:
                rounds.append(rv / wv)
    return Row(id=row_id, figure=figure, unit="µs", walj=w, base=b,
               ratio=(b / w) if w and b else None, targets=targets,
               status=walj_s.status, base_status=raw.status,
               measures="user CPU time per durable dispatch (getrusage, every thread)",
               baseline="the raw loop's user CPU per write + fdatasync, same sessions",
               round_ratios=rounds)
