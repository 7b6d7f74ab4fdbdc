"""SIGKILL, black box: children append at random in every sync mode, with tiny segments, and are
killed at random moments; what they acknowledged on the oracle pipe must all be there."""

from __future__ import annotations

import zlib
from pathlib import Path

import pytest
from budget import SEED, TALLY, TRIALS, rng_for
from sigkill import run_and_kill, run_trials
from spec_reader import SpecError, read_records

import walj

MODES = ("always", "batch", "interval", "never")
ROUNDS = 3
APPEND_TRIALS = max(4, TRIALS // 2)  # the other half are tool turns


def check_log(path: Path, acked: dict[int, tuple[int, int]], context: str) -> int:
    """Check the log against the oracle; returns how many records it holds."""
    if not path.exists():  # killed before the directory was made
        assert not acked, f"{context}: records acknowledged, no log directory"
        return 0
    records = list(walj.read(path))
    try:  # the independent reader, from docs/FORMAT.md alone, must read the same
        spec = read_records(path)
    except SpecError as exc:
        raise AssertionError(f"{context}: the FORMAT.md reader refused the log: {exc}") from exc
    assert spec == [(r.seq, r.data) for r in records], \
        f"{context}: the FORMAT.md reader read {len(spec)} records, walj.read {len(records)}"
    seqs = [r.seq for r in records]
    assert seqs == list(range(1, len(seqs) + 1)), f"{context}: seqs not contiguous or repeated"
    lost = [seq for seq in acked if seq > len(records)
            or (records[seq - 1].data["r"], records[seq - 1].data["k"]) != acked[seq]]
    TALLY.add(checked=len(acked) - len(lost), lost=len(lost))
    assert not lost, f"{context}: acknowledged records lost or changed at seqs {lost[:10]}"
    next_k: dict[int, int] = {}
    last_round = 0
    for record in records:
        data = record.data
        r, k, pad = data["r"], data["k"], data["pad"]
        assert data["h"] == zlib.crc32(f"{r}:{k}:{pad}".encode()), f"{context}: seq {record.seq}"
        assert r >= last_round, f"{context}: seq {record.seq} of round {r} after round {last_round}"
        assert k == next_k.get(r, 0), f"{context}: seq {record.seq} is k={k} of round {r}, " \
            f"expected k={next_k.get(r, 0)} (a record was lost, repeated or invented)"
        next_k[r] = k + 1
        last_round = r
    report = walj.verify(path)
    assert report.ok, f"{context}: {[p.describe() for p in report.problems]}"
    if report.torn_tail is not None:
        TALLY.add(torn_tails_seen=1)
    return len(records)


def one_trial(tmp_path: Path, trial: int) -> None:
    rng = rng_for(f"sigkill-log-{trial}")
    mode = MODES[trial % len(MODES)]
    segment_bytes = rng.choice([1024, 1024, 1536, 4096, 65536])
    path = tmp_path / f"log{trial}"
    acked: dict[int, tuple[int, int]] = {}
    held = 0
    for rnd in range(1, ROUNDS + 1):
        context = f"trial {trial} ({mode}, segments of {segment_bytes}) round {rnd}"
        run = run_and_kill("child_append.py",
                           [str(path), mode, str(segment_bytes), str(SEED), str(rnd)], rng)
        if not run.killed:
            pytest.fail(f"{context}: the child died on its own ({run.returncode}):\n{run.stderr}")
        TALLY.add(faults=1, sigkill_kills=1)
        expect_open = held
        for line in run.lines:
            tag, *rest = line.split()
            if tag == "O":
                assert int(rest[0]) == expect_open, f"{context}: reopened at seq {rest[0]}, " \
                    f"expected {expect_open}"
            elif tag == "A":
                seq, k = int(rest[0]), int(rest[1])
                assert seq not in acked, f"{context}: seq {seq} acknowledged twice"
                acked[seq] = (rnd, k)
                expect_open = seq
        held = check_log(path, acked, context)
    with walj.Log.open(path) as log:
        assert log.last_seq == held
    report = walj.verify(path)
    assert report.ok and report.torn_tail is None and report.records == held
    TALLY.add(trials_sigkill=1)


def test_sigkill_appends_in_every_sync_mode(tmp_path: Path) -> None:
    run_trials(APPEND_TRIALS, lambda trial: one_trial(tmp_path, trial))
