"""Torture suite plumbing: the seed on every failure, and the summary of what was survived."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from budget import SEED, TALLY, TRIALS, reproduce_hint  # noqa: E402

SUMMARY_NAME = "walj-torture-summary.json"
_summary_file: list[Path] = []


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


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not TALLY.counts:
        return
    figures = TALLY.summary()
    terminalreporter.section("walj torture summary")
    for key, value in figures.items():
        terminalreporter.write_line(f"{key:>22}: {value}")
    for path in _summary_file:
        terminalreporter.write_line(f"{'written to':>22}: {path}")
    terminalreporter.write_line(f"{'reproduce':>22}: {reproduce_hint()}")


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
