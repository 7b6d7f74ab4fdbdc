"""The README's benchmark figures are the ones benchmarks/results/latest.json holds, no others."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from helpers import load_script

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
LATEST = ROOT / "benchmarks" / "results" / "latest.json"
FIGURE = re.compile(r"\d[\d,.]*\s*(?:k|M)?\s*(?:rec/s|calls/s|/s|×|µs|ms|MB)")


@pytest.fixture(scope="module")
def renderer() -> ModuleType:
    module: ModuleType = load_script(ROOT / "benchmarks" / "readme_table.py")
    return module


@pytest.fixture(scope="module")
def latest() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(LATEST.read_text(encoding="utf-8"))
    return doc


def _section(text: str) -> str:
    start = text.index("## Benchmarks\n")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def test_readme_block_is_what_the_renderer_makes_of_latest_json(
    renderer: ModuleType, latest: dict[str, Any]
) -> None:
    readme = README.read_text(encoding="utf-8")
    expected = renderer.render(latest)
    assert renderer.current_block(readme) == expected, (
        "README.md's benchmark block differs from benchmarks/results/latest.json: "
        "run python benchmarks/readme_table.py"
    )


def test_the_block_is_inside_the_benchmarks_section(renderer: ModuleType) -> None:
    section = _section(README.read_text(encoding="utf-8"))
    assert section.count(renderer.BEGIN) == 1 and section.count(renderer.END) == 1


def test_no_figure_outside_the_generated_block(renderer: ModuleType) -> None:
    section = _section(README.read_text(encoding="utf-8"))
    outside = section[: section.index(renderer.BEGIN)] + section[section.index(renderer.END) :]
    assert FIGURE.findall(outside) == [], "a figure in README's Benchmarks section has no source"


def test_every_published_row_was_measured(renderer: ModuleType, latest: dict[str, Any]) -> None:
    rows = {r["id"]: r for r in latest["rows"]}
    n = len(latest["open_sizes"])
    for template in renderer.TABLE:
        row = rows.get(template.format(n=n))
        assert row is not None, f"{template} is not in latest.json"
        assert row["status"] is None and row["baseline_status"] is None, row["id"]
        assert row["ratio"] is not None, f"{row['id']} has no same-run baseline"
    for k in latest["threads"]:
        assert "records_per_fsync" in rows[f"group.{k}"]["extra"], k


def test_every_target_is_marked_met_or_missed(
    renderer: ModuleType, latest: dict[str, Any]
) -> None:
    block = renderer.render(latest)
    for row in latest["rows"]:
        for target in row["targets"]:
            mark = {True: "✓", False: "✗", None: "?"}[target["met"]]
            if row["id"] in {t.format(n=len(latest["open_sizes"])) for t in renderer.TABLE}:
                assert f"{target['label']} {mark}" in block, (row["id"], target)


def test_check_mode_catches_a_stale_readme(renderer: ModuleType, tmp_path: Path) -> None:
    readme = README.read_text(encoding="utf-8")
    stale = tmp_path / "README.md"
    stale.write_text(readme.replace("| ratio |", "| ratio (edited) |", 1), encoding="utf-8")
    assert renderer.main(["--check", "--readme", str(stale), "--json", str(LATEST)]) == 1
    assert renderer.main(["--readme", str(stale), "--json", str(LATEST)]) == 0
    assert stale.read_text(encoding="utf-8") == readme
    assert renderer.main(["--check", "--readme", str(stale), "--json", str(LATEST)]) == 0
