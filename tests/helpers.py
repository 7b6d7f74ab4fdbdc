"""Small helpers shared by the log tests: listing segments and writing known logs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import walj


def segments(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.name.startswith("seg-") and p.suffix == ".jsonl")


def make_records(n: int, start: int = 0) -> list[dict[str, Any]]:
    return [{"i": i, "text": f"record {i}", "pad": "p" * (i % 7)} for i in range(start, start + n)]


def write_log(path: Path, records: list[dict[str, Any]], **options: Any) -> None:
    with walj.Log.open(path, **options) as log:
        for record in records:
            log.append(record)


def all_data(path: Path, **options: Any) -> list[dict[str, Any]]:
    out = []
    for expected_seq, record in enumerate(walj.read(path, **options), start=1):
        assert record.seq == expected_seq
        out.append(record.data)
    return out


def load_script(path: Path) -> Any:
    """Import a script that is not in a package (benchmarks/, tools/) as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
