"""SIGKILL, black box: children append and drop their oldest segments, and are killed at random
moments, mid-drop included; every acknowledged record not below a requested drop is still
there, read by walj.read and by the FORMAT.md reader alike, and the chain verifies."""

from __future__ import annotations

import zlib
from pathlib import Path

import pytest
from budget import SEED, TALLY, TRIALS, rng_for
from sigkill import run_and_kill, run_trials
from spec_reader import SpecError, read_records

import walj

MODES = ("always", "batch")
ROUNDS = 3
COMPACT_TRIALS = max(3, TRIALS // 20)  # 10 at the default budget


def check(path: Path, acked: dict[int, tuple[int, int]], dropped_below: int,
          context: str) -> int:
    """The log holds a contiguous run of seqs ending at its last; every acknowledged seq at or
    above the highest requested drop is there unchanged. Returns the last seq."""
    if not path.exists():
        assert not acked, f"{context}: records acknowledged, no log directory"
        return 0
    records = list(walj.read(path))
    try:
        spec = read_records(path)
    except SpecError as exc:
        raise AssertionError(f"{context}: the FORMAT.md reader refused the log: {exc}") from exc
    assert spec == [(r.seq, r.data) for r in records], f"{context}: the readers disagree"
    report = walj.verify(path)
    assert report.ok, f"{context}: {[p.describe() for p in report.problems]}"
    first = records[0].seq if records else report.last_seq + 1
    assert first <= max(dropped_below, 1), f"{context}: seq {first} first, only drops below " \
        f"{dropped_below} were asked for"
    seqs = [r.seq for r in records]
    assert seqs == list(range(first, first + len(seqs))), f"{context}: seqs not contiguous"
    by_seq = {r.seq: r.data for r in records}
    lost = [seq for seq, rk in acked.items() if seq >= first
            and (seq not in by_seq or (by_seq[seq]["r"], by_seq[seq]["k"]) != rk)]
    lost += [seq for seq in acked if seq < first and seq >= dropped_below]
    TALLY.add(checked=len(acked) - len(lost), lost=len(lost))
    assert not lost, f"{context}: acknowledged records lost at seqs {sorted(lost)[:10]}"
    for record in records:
        data = record.data
        assert data["h"] == zlib.crc32(f"{data['r']}:{data['k']}:{data['pad']}".encode())
    return report.last_seq


def one_trial(tmp_path: Path, trial: int) -> None:
    rng = rng_for(f"sigkill-compact-{trial}")
    mode = MODES[trial % len(MODES)]
    path = tmp_path / f"log{trial}"
    acked: dict[int, tuple[int, int]] = {}
    dropped_below = 0
    held = 0
    for rnd in range(1, ROUNDS + 1):
        context = f"trial {trial} ({mode}) round {rnd}"
        run = run_and_kill("child_compact.py", [str(path), mode, str(SEED), str(rnd)], rng,
                           max_wait=0.3)
        if not run.killed:
            pytest.fail(f"{context}: the child died on its own ({run.returncode}):\n{run.stderr}")
        TALLY.add(faults=1, sigkill_kills=1)
        expect_open = held
        for line in run.lines:
            tag, *rest = line.split()
            if tag == "O":
                assert int(rest[0]) == expect_open, f"{context}: reopened at seq {rest[0]}"
            elif tag == "A":
                seq = int(rest[0])
                assert seq not in acked, f"{context}: seq {seq} acknowledged twice"
                acked[seq] = (rnd, int(rest[1]))
                expect_open = seq
            elif tag == "d":  # announced before the call: a kill mid-drop may have dropped
                dropped_below = max(dropped_below, int(rest[0]))
        held = check(path, acked, dropped_below, context)
    with walj.Log.open(path) as log:
        assert log.last_seq == held
        log.drop_before(max(1, min(dropped_below, held + 1)))  # finishes a drop the kill stopped
    report = walj.verify(path)
    assert report.ok and report.leftovers == []
    TALLY.add(trials_sigkill=1)


def test_sigkill_appends_and_drops(tmp_path: Path) -> None:
    run_trials(COMPACT_TRIALS, lambda trial: one_trial(tmp_path, trial))
