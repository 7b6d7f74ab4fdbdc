"""Smoke test of the benchmark harness: a tiny quick run must finish and write every table row."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import walj

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "benchmarks" / "run.py"

THREADS = [1, 2, 4, 8, 16]
SIZES = [1, 2, 3]

LOG_ROWS = (
    [
        "durable.raw",
        "durable.sqlite_full",
        "durable.jsonl_fsync",
        "unsynced.sqlite_normal",
        "unsynced.jsonl",
        "unsynced.rate",
    ]
    + [f"latency.{m}.{q}" for m in ("always", "batch", "interval", "never") for q in ("p50", "p99")]
    + [f"group.{n}" for n in THREADS]
    + ["group.scaling"]
    + [f"{fig}.log.{k}" for k in SIZES for fig in ("open", "scan", "rss")]
)
JOURNAL_ROWS = ["dispatch.noop"] + [f"{fig}.journal.{k}" for k in SIZES for fig in ("open", "rss")]
ZIPAPP_ROWS = [f"zipapp.{k}" for k in SIZES]
EXPECTED = LOG_ROWS + JOURNAL_ROWS + ZIPAPP_ROWS
PLOTS = ["group_commit.png", "open_time.png", "latency.png"]


def _run_quick(tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        str(RUN),
        "--quick",
        "--scale",
        "0.04",
        "--reps",
        "2",
        "--out",
        str(out),
        "--dir",
        str(tmp_path / "work"),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=False)
    return proc, out


def test_quick_run_writes_every_row(tmp_path: Path) -> None:
    proc, out = _run_quick(tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    md = (out / "latest.md").read_text(encoding="utf-8")
    assert md.startswith("# walj benchmark results")
    assert "Machine: " in md
    table_ids = re.findall(r"^\| `([a-z0-9_.]+)` \|", md, flags=re.MULTILINE)
    for row_id in EXPECTED:
        assert table_ids.count(row_id) == 1, f"row {row_id} missing from latest.md"

    doc = json.loads((out / "latest.json").read_text(encoding="utf-8"))
    rows = {r["id"]: r for r in doc["rows"]}
    assert set(EXPECTED) <= set(rows)

    # Baselines are measured whatever state walj is in.
    for row_id in ["durable.raw", "durable.sqlite_full", "unsynced.sqlite_normal", "group.8"]:
        assert rows[row_id]["baseline"] is not None and rows[row_id]["baseline_status"] is None
    assert rows["dispatch.noop"]["baseline"] is not None

    # The log figures run for real: measured, with a ratio, no skip and no error.
    for row_id in LOG_ROWS:
        row = rows[row_id]
        assert row["status"] is None, f"{row_id}: {row['status']}"
        assert row["walj"] is not None and row["walj"] > 0, row_id
        if row_id != "unsynced.rate":
            assert row["ratio"] is not None and row["ratio"] > 0, row_id

    # The journal figures run once the journal exists, and say why not until then.
    for row_id in JOURNAL_ROWS:
        row = rows[row_id]
        if hasattr(walj, "ToolJournal"):
            assert row["status"] is None, f"{row_id}: {row['status']}"
            assert row["walj"] is not None and row["walj"] > 0, row_id
        else:
            assert row["status"] == "skipped: journal not available", row_id

    # The zipapp hook measures it when built and skips it, saying so, otherwise.
    for row_id in ZIPAPP_ROWS:
        status = rows[row_id]["status"]
        assert status is None or status.startswith("skipped: zipapp not built"), status

    if importlib.util.find_spec("matplotlib") is not None:
        for name in PLOTS:
            assert (out / name).stat().st_size > 0, f"{name} not written"
    else:
        assert "tables only" in md
