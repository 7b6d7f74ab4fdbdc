"""Report writing: the results table (Markdown and JSON) and the optional matplotlib plots."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from bench_core import Row, Series

RATIO_NOTE = (
    "ratio > 1 means walj is better: rates are walj / baseline; latency and memory are "
    "baseline / walj."
)


def fmt(value: float | None, unit: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if unit == "us":
        return f"{value:.1f} µs" if value < 1000 else f"{value / 1000:.2f} ms"
    if unit == "MB":
        return f"{value:.1f} MB"
    if unit == "s":
        return f"{value:.3f} s"
    if value >= 1e6:
        num = f"{value / 1e6:.2f}M"
    elif value >= 1e4:
        num = f"{value / 1e3:.0f}k"
    elif value >= 100:
        num = f"{value:,.0f}"
    else:
        num = f"{value:.3g}"
    return f"{num} {unit}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


MARK = {True: "✓", False: "✗", None: "?"}


def target_text(targets: list[dict[str, Any]]) -> str:
    """Each target with ✓ (met), ✗ (missed) or ? (not measured); "—" when there is none."""
    return ", ".join(f"{t['label']} {MARK[t['met']]}" for t in targets) or "—"


def ratio_text(ratio: float | None) -> str:
    return "—" if ratio is None else f"{ratio:.2f}×"


def rounds_text(rounds: list[float]) -> str:
    """The spread of the per-round ratios: "0.74–0.93× over 7"."""
    if not rounds:
        return "—"
    return f"{min(rounds):.2f}–{max(rounds):.2f}× over {len(rounds)}"


def row_doc(r: Row) -> dict[str, Any]:
    """One row as latest.json stores it."""
    return {
        "id": r.id,
        "figure": r.figure,
        "measures": r.measures,
        "baseline_is": r.baseline,
        "unit": r.unit,
        "walj": r.walj,
        "baseline": r.base,
        "ratio": None if r.status or r.base_status else r.ratio,
        "ratio_rounds": r.round_ratios,
        "targets": [
            {"label": t.label, "kind": t.kind, "threshold": t.threshold, "met": met}
            for t, met in zip(r.targets, r.target_results(), strict=True)
        ],
        "met": r.met,
        "status": r.status,
        "baseline_status": r.base_status,
        "extra": r.extra,
    }


def value_text(value: float | None, status: str | None, unit: str) -> str:
    return status or fmt(value, unit)


def markdown(
    header: list[str], rows: list[Row], series: dict[str, Series], notes: list[str]
) -> str:
    lines = ["# walj benchmark results", ""]
    lines += header
    lines += ["", RATIO_NOTE, ""]
    lines.append(
        "| id | figure: what walj does | walj | baseline (what it is) | ratio | "
        "ratio per round | counted | target |"
    )
    lines.append("|---|---|---|---|---|---|---|---|")
    for r in rows:
        d = row_doc(r)
        walj = value_text(r.walj, r.status, r.unit)
        base = value_text(r.base, r.base_status, r.unit)
        counted = ", ".join(f"{k.replace('_', ' ')} {v:.2f}" for k, v in r.extra.items())
        cells = [
            f"`{r.id}`",
            f"{r.figure}: {r.measures}" if r.measures else r.figure,
            walj,
            f"{base} ({r.baseline})" if r.baseline else base,
            ratio_text(d["ratio"]),
            rounds_text(r.round_ratios),
            counted or "—",
            target_text(d["targets"]),
        ]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    lines += ["", "## Series (every repetition, in order)", ""]
    lines.append("| series | median | p50 | p99 | repetitions |")
    lines.append("|---|---|---|---|---|")
    for s in series.values():
        if s.status:
            lines.append(f"| {s.name} | {_cell(s.status)} | | | |")
            continue
        reps = ", ".join(fmt(x.value, s.unit) for x in s.samples)
        p50 = fmt(s.median_of("p50_us"), "us") if s.median_of("p50_us") is not None else ""
        p99 = fmt(s.median_of("p99_us"), "us") if s.median_of("p99_us") is not None else ""
        lines.append(f"| {s.name} | {fmt(s.median(), s.unit)} | {p50} | {p99} | {reps} |")
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def _extras(s: Series) -> dict[str, float]:
    keys = sorted({k for x in s.samples for k in x.extra})
    out = {}
    for k in keys:
        v = s.extra_median(k)
        if v is not None:
            out[k] = v
    return out


def as_json(meta: dict[str, Any], rows: list[Row], series: dict[str, Series]) -> str:
    doc: dict[str, Any] = dict(meta)
    doc["rows"] = [row_doc(r) for r in rows]
    doc["series"] = {
        s.name: {
            "unit": s.unit,
            "median": s.median(),
            "values": [x.value for x in s.samples],
            "p50_us": s.median_of("p50_us"),
            "p99_us": s.median_of("p99_us"),
            "extra": _extras(s),
            "status": s.status,
        }
        for s in series.values()
    }
    return json.dumps(doc, indent=2, allow_nan=False, ensure_ascii=False, default=str) + "\n"


def matplotlib_available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _measured(series: dict[str, Series], name: str) -> Series | None:
    s = series.get(name)
    return s if s is not None and not s.status and s.samples else None


def plot(out: Path, series: dict[str, Series], threads: list[int], sizes: list[int]) -> list[str]:
    """Write the PNG plots that have data; return their file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    written: list[str] = []

    # Group-commit scaling: records/s against threads, walj batch and SQLite WAL FULL.
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    drew = False
    for prefix, label in (
        ("walj-batch-threads-", "walj sync=batch"),
        ("sqlite-full-threads-", "SQLite WAL FULL"),
    ):
        pts = [(n, s) for n in threads if (s := _measured(series, f"{prefix}{n}"))]
        if pts:
            xs = [n for n, _ in pts]
            med = [s.median() or 0.0 for _, s in pts]
            lo = [m - min(x.value for x in s.samples) for m, (_, s) in zip(med, pts, strict=True)]
            hi = [max(x.value for x in s.samples) - m for m, (_, s) in zip(med, pts, strict=True)]
            ax.errorbar(xs, med, yerr=[lo, hi], marker="o", capsize=3, label=label)
            drew = True
    raw = _measured(series, "raw-fsync")
    if raw is not None:
        ax.axhline(
            raw.median() or 0.0, linestyle=":", color="grey", label="raw fdatasync, 1 thread"
        )
    if drew:
        ax.set_xscale("log", base=2)
        ax.set_xticks(threads, [str(n) for n in threads])
        ax.set_xlabel("threads")
        ax.set_ylabel("durable records/s")
        ax.set_title("Group commit: durable appends across threads")
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "group_commit.png", dpi=120)
        written.append("group_commit.png")
    plt.close(fig)

    # Sessions: durable calls/s against the number of sessions in one process (log x axis).
    counts = sorted({int(k.rsplit("-", 1)[1]) for k in series
                     if k.startswith("sessions-raw-") and _measured(series, k)})
    if counts:
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for prefix, label, style in (
            ("sessions-async-", "walj, asyncio adispatch", "o-"),
            ("sessions-threads-", "walj, a thread per session", "s-"),
            ("sessions-raw-", "raw write+fdatasync per file (limit)", "k:"),
            ("sessions-raw-prealloc-", "raw pwrite into zero-filled files + fdatasync "
             "(physical limit)", "k--"),
            ("sessions-syncfs-", "raw syncfs rounds (dedicated volume)", "k-."),
            ("sessions-threads-files-", "walj threads, commit mode files", "s:"),
            ("sessions-threads-syncfs-", "walj threads, commit mode syncfs", "D:"),
            ("sessions-sqlite-each-", "SQLite FULL, a database per session", "^--"),
            ("sessions-sqlite-shared-", "SQLite FULL, one shared database", "v--"),
        ):
            pts = [(n, m) for n in counts if (x := _measured(series, f"{prefix}{n}"))
                   and (m := x.median()) is not None]
            if pts:
                ax.plot([n for n, _ in pts], [m for _, m in pts], style, label=label)
        ax.set_xscale("log", base=2)
        ax.set_xticks(counts, [str(n) for n in counts])
        ax.set_xlabel("sessions in one process")
        ax.set_ylabel("durable dispatches/s (2 fsyncs each)")
        ax.set_title("Many sessions: durable dispatch against the disk's limit")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
        fig.tight_layout()
        fig.savefig(out / "sessions.png", dpi=120)
        written.append("sessions.png")
        plt.close(fig)

    # Open time against log size.
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    drew = False
    for prefix, label in (
        ("log-open-", "walj Log.open (checksums, no decode)"),
        ("journal-open-", "walj ToolJournal.open (decoded, state rebuilt)"),
        ("sqlite-scan-", "SQLite scan, no decode (log rows)"),
        ("sqlite-journal-", "SQLite scan, no decode (journal rows)"),
    ):
        pts = [
            (s.samples[0].ops, s)
            for k in range(1, len(sizes) + 1)
            if (s := _measured(series, f"{prefix}{k}"))
        ]
        if pts:
            secs = [s.median_of("seconds") or 0.0 for _, s in pts]
            ax.plot([n for n, _ in pts], secs, marker="o", label=label)
            drew = True
    if drew:
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("records in the log")
        ax.set_ylabel("seconds (median)")
        ax.set_title("Open time against log size")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
        fig.tight_layout()
        fig.savefig(out / "open_time.png", dpi=120)
        written.append("open_time.png")
    plt.close(fig)

    # Latency distribution per sync mode, with the baselines dashed.
    fig, ax = plt.subplots(figsize=(7.2, 4.6))
    drew = False
    for name, label, style in (
        ("walj-always", "walj always", "-"),
        ("walj-batch", "walj batch", "-"),
        ("walj-interval", "walj interval", "-"),
        ("walj-never", "walj never", "-"),
        ("raw-fsync", "raw fdatasync", "--"),
        ("sqlite-full", "SQLite FULL", "--"),
        ("jsonl-fsync", "JSONL + fsync", "--"),
        ("sqlite-normal", "SQLite NORMAL", ":"),
        ("jsonl-plain", "JSONL, no fsync", ":"),
    ):
        s = _measured(series, name)
        if s is None:
            continue
        pooled = sorted(v for x in s.samples for v in x.sketch_us if v > 0)
        if len(pooled) < 3:
            continue
        # Plotting positions strictly inside (0, 1), for the logit axis that shows the tail.
        ys = [(i + 0.5) / len(pooled) for i in range(len(pooled))]
        ax.plot(pooled, ys, style, label=label)
        drew = True
    if drew:
        ax.set_xscale("log")
        ax.set_yscale("logit")
        ax.set_ylim(0.005, 0.999)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"p{100 * v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("append latency (µs)")
        ax.set_ylabel("percentile")
        ax.set_title("Append latency per sync mode (single thread)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small", ncol=2)
        fig.tight_layout()
        fig.savefig(out / "latency.png", dpi=120)
        written.append("latency.png")
    plt.close(fig)
    return written
