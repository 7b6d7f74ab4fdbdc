"""Interrupts at every line of `Log.drop_before`: a KeyboardInterrupt or SystemExit landing on
any line event of walj's code on the drop path leaves a handle that is usable or poisoned, a log
that reopens with every record not meant to go, and a second drop that finishes the first."""

from __future__ import annotations

import shutil
from pathlib import Path

from budget import TALLY
from interrupts import Injection
from spec_reader import read_records

import walj

SEQ = 30


def _build(path: Path) -> list[tuple[int, dict[str, int]]]:
    with walj.Log.open(path, segment_bytes=1024) as log:
        for i in range(50):
            log.append({"i": i})
        log.drop_before(8)  # a log that already has a BASE, so the drop replaces it
    return [(r.seq, r.data) for r in walj.read(path)]


def test_interrupt_at_every_line_of_a_drop(tmp_path: Path) -> None:
    base = tmp_path / "base"
    before = _build(base)
    counting = Injection("count")
    probe = tmp_path / "probe"
    shutil.copytree(base, probe)
    with walj.Log.open(probe, segment_bytes=1024) as log:
        counting.call(lambda: log.drop_before(SEQ))
    assert counting.events, "the counting run reached no walj line"
    intended = [(r.seq, r.data) for r in walj.read(probe)]
    failures: list[str] = []
    for i in range(1, len(counting.events) + 1):
        exc_type = (KeyboardInterrupt, SystemExit)[i % 2]
        inj = Injection("raise", index=i, exc_type=exc_type)
        path = tmp_path / f"t{i}"
        shutil.copytree(base, path)
        log = walj.Log.open(path, segment_bytes=1024)
        try:
            inj.call(lambda log=log: log.drop_before(SEQ))  # type: ignore[misc]
        except (KeyboardInterrupt, SystemExit) as exc:
            if not inj.matches(exc):
                failures.append(f"event {i}: {exc!r} is not the injected interrupt")
        else:
            if inj.fired:
                failures.append(f"event {i}: the interrupt was swallowed")
        # The same handle: a second call finishes the drop, or the handle refuses as poisoned.
        try:
            log.drop_before(SEQ)
        except walj.PoisonedError:
            pass
        try:
            log.close()
        except walj.PoisonedError:
            pass
        with walj.Log.open(path, segment_bytes=1024) as reopened:
            reopened.drop_before(SEQ)  # rolls forward whatever is left
            reopened.append({"after": i})
        got = [(r.seq, r.data) for r in walj.read(path)]
        if got[:-1] != intended or got != read_records(path):
            failures.append(f"event {i} ({inj.describe()}): read {got[:2]}..., expected "
                            f"{intended[:2]}...")
        report = walj.verify(path)
        if not report.ok or report.leftovers:
            failures.append(f"event {i}: verify {report.problems} leftovers {report.leftovers}")
        shutil.rmtree(path)
    TALLY.add(checked=len(counting.events) * len(before))
    assert not failures, failures[:5]
    assert len(counting.events) > 50
