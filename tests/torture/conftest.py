"""Torture suite plumbing: the seed on every failure, and the summary of what was survived."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from budget import SEED, TALLY, TRIALS, reproduce_hint  # noqa: E402

SUMMARY_NAME = "walj-torture-summary.json"
_summary_file: list[Path] = []
HERE = Path(__file__).resolve().parent
RECORD = os.environ.get("WALJ_TORTURE_RECORD") == "1"  # write tests/torture/results/latest.json
_started = time.monotonic()
_collected: set[str] = set()  # the torture files this session runs


# The commit, and whether the code differed from it, when this conftest is loaded (collection,
# before any test runs): the code the run tests, whatever is edited while it runs.
_source: list[tuple[str, bool]] = []
if RECORD:
    from results import source_state

    _source.append(source_state())


def pytest_configure(config: pytest.Config) -> None:
    # The figures are counted in the process that runs the tests: spread over pytest-xdist's
    # workers, the record would hold none of them. The default run uses workers; a record not.
    if RECORD and config.getoption("numprocesses", default=None):
        raise pytest.UsageError("WALJ_TORTURE_RECORD=1 counts every family in one process: "
                                "run it with -n 0")


def pytest_collection_finish(session: pytest.Session) -> None:
    _collected.update(Path(item.path).name for item in session.items
                      if Path(item.path).parent == HERE)


def pytest_report_header() -> str:
    return f"walj torture: WALJ_SEED={SEED} WALJ_TORTURE={TRIALS}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed and "torture" in str(item.path):
        report.sections.append(("walj torture", reproduce_hint()))


@pytest.fixture(scope="session", autouse=True)
def _torture_summary(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    yield
    if TALLY.counts:
        path = tmp_path_factory.getbasetemp() / SUMMARY_NAME
        path.write_text(json.dumps(TALLY.summary(), indent=2) + "\n")
        _summary_file.append(path)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int) -> None:
    if not TALLY.counts and not RECORD:
        return
    figures = TALLY.summary()
    terminalreporter.section("walj torture summary")
    for key, value in figures.items():
        terminalreporter.write_line(f"{key:>22}: {value}")
    for path in _summary_file:
        terminalreporter.write_line(f"{'written to':>22}: {path}")
    terminalreporter.write_line(f"{'reproduce':>22}: {reproduce_hint()}")
    if RECORD:
        terminalreporter.write_line(f"{'record':>22}: {_record(terminalreporter, exitstatus)}")


def _record(reporter: pytest.TerminalReporter, exitstatus: int) -> str:
    """Write the run's record for README.md, if the run can back it: it passed, and it ran
    every test of every torture family."""
    from results import LATEST, make_record, write_record

    families = {p.name for p in HERE.glob("test_torture_*.py")}
    def torture(key: str) -> list[Any]:
        return [r for r in reporter.stats.get(key, []) if "tests/torture/" in r.nodeid]

    mine = torture("passed")
    left_out = [key for key in ("failed", "error", "skipped", "deselected", "xfailed")
                if torture(key)]
    if exitstatus != 0 or left_out:
        return f"not written: the run {'failed' if exitstatus else 'had ' + ', '.join(left_out)}"
    if families - _collected:
        return f"not written: {', '.join(sorted(families - _collected))} did not run"
    record = make_record(TALLY.summary(), source=_source[0],
                         duration_s=time.monotonic() - _started, tests_passed=len(mine))
    write_record(record)
    dirty = " (on uncommitted code: README.md will refuse it)" if record["dirty"] else ""
    return f"written to {LATEST.relative_to(HERE.parent.parent)}{dirty}"


@pytest.fixture
def thread_failures(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[BaseException]]:
    """Fails the test on any exception that ends a background thread (the interval syncer,
    an appender), except the simulated process death, which ends every thread on purpose."""
    import threading

    from faultfs import SimulatedCrash

    failures: list[BaseException] = []

    def hook(args: threading.ExceptHookArgs) -> None:
        if args.exc_value is not None and not isinstance(args.exc_value, SimulatedCrash):
            failures.append(args.exc_value)

    monkeypatch.setattr(threading, "excepthook", hook)
    yield failures
    assert not failures, f"a background thread died: {failures[:3]!r}"
