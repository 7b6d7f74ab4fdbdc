"""README.md's "What walj survives" figures are those of tests/torture/results/latest.json, a
record the torture suite wrote of a whole, passing run on committed code."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from helpers import load_script

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


@pytest.fixture(scope="module")
def results() -> ModuleType:
    module: ModuleType = load_script(ROOT / "tests" / "torture" / "results.py")
    return module


@pytest.fixture(scope="module")
def record(results: ModuleType) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(results.LATEST.read_text(encoding="utf-8"))
    return doc


def test_readme_block_is_what_the_record_renders_to(results: ModuleType,
                                                    record: dict[str, Any]) -> None:
    readme = README.read_text(encoding="utf-8")
    assert readme.count(results.BEGIN) == 1 and readme.count(results.END) == 1
    assert results.current_block(readme) == results.render(record), (
        "README.md's torture block differs from tests/torture/results/latest.json: "
        "run python tests/torture/results.py")


def test_the_record_is_of_a_long_clean_run_that_lost_nothing(record: dict[str, Any]) -> None:
    assert record["dirty"] is False
    assert len(record["commit"]) == 40
    assert record["knob"] > 200, "the README shows a long run, not the default bounded one"
    counts = record["counts"]
    assert counts["records_lost"] == 0
    assert counts["retention_bytes_lost"] == 0 and counts["trials_retention"] > 0
    assert counts["sigkill_kills"] > 0 and counts["records_checked"] > 0


def test_the_recorded_commit_is_an_ancestor_of_this_one(record: dict[str, Any]) -> None:
    """The run was made on code this history holds, not on a branch that never landed."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    done = subprocess.run(["git", "merge-base", "--is-ancestor", record["commit"], "HEAD"],
                          cwd=ROOT, capture_output=True, check=False)
    assert done.returncode == 0, f"{record['commit']} is not in this commit's history"


@pytest.mark.parametrize("damage", ["dirty", "missing count", "schema"])
def test_render_refuses_a_record_that_cannot_back_the_readme(
        results: ModuleType, record: dict[str, Any], damage: str) -> None:
    bad = copy.deepcopy(record)
    if damage == "dirty":
        bad["dirty"] = True
    elif damage == "missing count":
        del bad["counts"]["interrupt_operations"]
    else:
        bad["schema"] = "walj.torture/0"
    with pytest.raises(results.RecordError):
        results.render(bad)


def test_every_count_of_the_record_reaches_the_block(results: ModuleType,
                                                     record: dict[str, Any]) -> None:
    """A changed count changes the block (no figure in it is typed in by hand)."""
    block = results.render(record)
    for key in results.COUNTS:
        bumped = copy.deepcopy(record)
        bumped["counts"][key] = int(bumped["counts"][key]) + 7_777_777
        assert results.render(bumped) != block, key


def test_a_partial_run_writes_no_record(results: ModuleType) -> None:
    """With WALJ_TORTURE_RECORD=1, a run of one torture file passes but leaves the record as
    it was, and says why."""
    before = results.LATEST.read_bytes()
    env = dict(os.environ, WALJ_TORTURE_RECORD="1", WALJ_TORTURE="2")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0",
         "tests/torture/test_torture_regressions.py", "-k", "deeply_nested"],
        cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "record: not written" in done.stdout, done.stdout
    assert results.LATEST.read_bytes() == before


def test_a_record_is_refused_across_worker_processes(results: ModuleType) -> None:
    """Spread over pytest-xdist's workers the figures would be counted in processes the record
    never sees: asking for a record there is a usage error, and nothing is written."""
    before = results.LATEST.read_bytes()
    env = dict(os.environ, WALJ_TORTURE_RECORD="1", WALJ_TORTURE="2")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
         "tests/torture/test_torture_regressions.py", "-k", "deeply_nested"],
        cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    assert "run it with -n 0" in done.stderr, done.stderr
    assert results.LATEST.read_bytes() == before
